"""The planner as a service under load: plans/s by concurrent clients, /healthz latency, RSS.

A table of generated manifests (as in :mod:`icefloe.bench_planner`) is served by a real
:class:`~icefloe.planner.PlannerService` on a loopback port; aiohttp clients post selective
plan requests (one hour of one day and one user) while a prober calls ``/healthz`` every
10 ms. For 1, 10, 50 and 150 concurrent clients the figure is plans/s, beside PyIceberg's
``plan_files`` for the same scan run back to back on one thread (PyIceberg has no server;
its plans/s is what one reader process achieves). The /healthz p99 of each level and the
process RSS (after warming, after holding many full-scan plans, and the part not accounted
for by the cache and the held plans: the fixed overhead) are printed as notes.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from icefloe.bench import BenchContext, Figure, Timing, benchmark
from icefloe.bench_planner import PyIceberg, _pyiceberg_filter, generate, scans
from icefloe.catalog_fs import FileSystemCatalog
from icefloe.fileio import LocalFileIO
from icefloe.planner import PlannerService
from icefloe.planner_config import PlannerConfig

CLIENT_LEVELS = (1, 10, 50, 150)


def rss_bytes() -> int:
    """This process's resident set size (Linux /proc; 0 elsewhere)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


async def _register(directory: Path, metadata_location: str) -> FileSystemCatalog:
    """A filesystem catalog whose table ``db.events`` is the generated table (written where
    and as that catalog keeps its tables: ``db/events/metadata/v1.metadata.json``)."""
    warehouse = directory / "warehouse"
    catalog = FileSystemCatalog("bench", str(warehouse), LocalFileIO())
    if not await catalog.namespace_exists(("db",)):
        await catalog.create_namespace("db")
    await catalog.load_table("db.events")  # fails here, not under load, if it is not found
    return catalog


async def _run_level(
    session: Any, url: str, body: dict[str, Any], clients: int, requests: int
) -> tuple[float, list[float]]:
    """Seconds for ``requests`` plans by ``clients`` concurrent clients, and the /healthz
    latencies seen meanwhile."""
    remaining = requests
    health: list[float] = []
    done = asyncio.Event()

    async def client() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            async with session.post(url + "/v1/namespaces/db/tables/events/plan", json=body) as r:
                if r.status != 200:
                    raise RuntimeError(f"plan failed: {r.status} {await r.text()}")
                await r.read()

    async def prober() -> None:
        while not done.is_set():
            started = time.perf_counter()
            async with session.get(url + "/healthz") as r:
                await r.read()
            health.append(time.perf_counter() - started)
            await asyncio.sleep(0.01)

    probe = asyncio.create_task(prober())
    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    elapsed = time.perf_counter() - started
    done.set()
    await probe
    return elapsed, health


def _p99(values: list[float]) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


async def _service_figures(
    ctx: BenchContext, directory: Path, files: int, per_manifest: int
) -> list[Figure]:
    import aiohttp

    generated = generate(directory / "warehouse" / "db", files, per_manifest, "events")
    catalog = await _register(directory, generated.metadata_location)
    budget = 512 << 20
    config = PlannerConfig.load(
        {
            "catalog": f"file://{directory / 'warehouse'}",
            "host": "127.0.0.1",
            "port": 0,
            "cache_max_bytes": budget,
            "access_log": False,
            "tasks_per_page": 1000,
        }
    )
    service = PlannerService(config, catalog, plan_secret=b"bench secret, sixteen+ bytes")
    await service.start()
    figures: list[Figure] = []
    selective = scans(files)["selective"]
    assert selective is not None
    peer = PyIceberg(generated)
    py_filter = _pyiceberg_filter(selective)
    peer_runs = 3
    started = time.perf_counter()
    for _ in range(peer_runs):
        await asyncio.to_thread(peer.plan, py_filter)
    theirs = Timing(seconds=(time.perf_counter() - started,), work=peer_runs)
    rss_start = rss_bytes()
    try:
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as session:
            await _run_level(session, service.url, {"filter": selective}, 1, 2)  # warm
            rss_warm = rss_bytes()
            for clients in CLIENT_LEVELS:
                requests = max(20, clients * 2)
                elapsed, health = await _run_level(
                    session, service.url, {"filter": selective}, clients, requests
                )
                figures.append(
                    Figure(
                        f"{files // 1000}k-file table, {clients} clients, selective plans",
                        "plans/s",
                        Timing(seconds=(elapsed,), work=requests),
                        {"pyiceberg plan_files (one thread)": theirs},
                    )
                )
                ctx.note(
                    f"{clients} clients: /healthz p99 {_p99(health) * 1000:.1f} ms, "
                    f"max {max(health, default=0) * 1000:.1f} ms over {len(health)} probes"
                )
            # Many held multi-page full plans: memory stays within the plan budget.
            held = 40
            for _ in range(held):
                async with session.post(
                    service.url + "/v1/namespaces/db/tables/events/plan", json={}
                ) as r:
                    await r.read()
            rss_held = rss_bytes()
    finally:
        await service.stop()
        await catalog.close()
    stats = service.cache.stats()
    overhead = rss_held - stats.bytes - service.plans.bytes
    ctx.note(
        f"RSS: {rss_start / 2**20:.0f} MiB at start, {rss_warm / 2**20:.0f} MiB warm, "
        f"{rss_held / 2**20:.0f} MiB after {held} held full plans "
        f"(cache {stats.bytes / 2**20:.0f} MiB of a {budget / 2**20:.0f} MiB budget, held "
        f"plans {service.plans.bytes / 2**20:.0f} MiB of {config.plan_max_bytes / 2**20:.0f} "
        f"MiB; the rest, {overhead / 2**20:.0f} MiB, is the interpreter, libraries and "
        "PyIceberg's peer run in the same process)"
    )
    return figures


@benchmark("planner-service")
async def planner_service_benchmark(ctx: BenchContext) -> list[Figure]:
    """Selective plans/s at 1-150 concurrent clients, /healthz p99 and RSS of the service."""
    files = ctx.size("service-files", full=100_000, quick=10_000)
    per_manifest = ctx.size("service-entries-per-manifest", full=5_000, quick=2_000)
    root = Path(tempfile.mkdtemp(prefix="icefloe-bench-planner-service-"))
    try:
        return await _service_figures(ctx, root, files, per_manifest)
    finally:
        shutil.rmtree(root, ignore_errors=True)
