"""The planner as a service under load: plans/s by concurrent clients, /healthz latency, RSS.

A table of generated manifests (as in :mod:`icefloe.dev.bench_planner`) is served by a real
planner (``icefloe planner``) in its own process on a loopback port, so the load generator
does not share its event loop; aiohttp clients post selective plan requests (one hour of one
day and one user) while a prober calls ``/healthz`` every 10 ms. For 1, 10, 50 and 150
concurrent clients the figure is plans/s, beside PyIceberg's ``plan_files`` for the same scan
run back to back on one thread (PyIceberg has no server; its plans/s is what one reader
process achieves). It is measured with one planner process and with ``--workers 2`` (sharing
the memory-mapped disk cache). The /healthz p99 of each level and the planner's RSS (warm,
and after holding many full-scan plans, beside the cache and plan budgets' use, read from its
``/metrics``) are printed as notes.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from icefloe.catalog_fs import FileSystemCatalog
from icefloe.dev.bench import BenchContext, Figure, Timing, benchmark
from icefloe.dev.bench_planner import PyIceberg, _pyiceberg_filter, generate, scans
from icefloe.dev.local_stack import free_port
from icefloe.fileio import LocalFileIO

CLIENT_LEVELS = (1, 10, 50, 150)
TABLE = "/v1/namespaces/db/tables/events"


def rss_bytes(pid: int) -> int:
    """Resident set size of ``pid`` and its children (Linux /proc; 0 elsewhere)."""
    total = 0
    pids = [pid]
    children = Path(f"/proc/{pid}/task/{pid}/children")
    if children.exists():
        pids += [int(p) for p in children.read_text().split()]
    for one in pids:
        try:
            for line in Path(f"/proc/{one}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            continue
    return total


async def _register(warehouse: Path) -> None:
    """Check the generated table is where the filesystem catalog keeps ``db.events``."""
    catalog = FileSystemCatalog("bench", str(warehouse), LocalFileIO())
    try:
        if not await catalog.namespace_exists(("db",)):
            await catalog.create_namespace("db")
        await catalog.load_table("db.events")
    finally:
        await catalog.close()


async def _run_level(
    session: Any, url: str, body: dict[str, Any], clients: int, requests: int
) -> tuple[float, list[float]]:
    remaining = requests
    health: list[float] = []
    done = asyncio.Event()

    async def client() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            async with session.post(url + TABLE + "/plan", json=body) as r:
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


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


async def _serve(
    ctx: BenchContext,
    warehouse: Path,
    cache_dir: Path,
    workers: int,
    files: int,
    selective: dict[str, Any],
    theirs: Timing,
) -> list[Figure]:
    import aiohttp

    port = free_port()
    env = {
        **os.environ,
        "ICEFLOE_PLANNER_CATALOG": f"file://{warehouse}",
        "ICEFLOE_PLANNER_HOST": "127.0.0.1",
        "ICEFLOE_PLANNER_PORT": str(port),
        "ICEFLOE_PLANNER_WORKERS": str(workers),
        "ICEFLOE_PLANNER_CACHE_DIR": str(cache_dir),
        "ICEFLOE_PLANNER_ACCESS_LOG": "false",
        "ICEFLOE_PLANNER_PLAN_SECRET": "bench secret, sixteen bytes or more",
        "ICEFLOE_PLANNER_LOG_LEVEL": "WARNING",
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "icefloe.cli", "planner", env=env
    )
    url = f"http://127.0.0.1:{port}"
    figures: list[Figure] = []
    label = f"{files // 1000}k-file table, {workers} process{'es' if workers > 1 else ''}"
    try:
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as session:
            for _ in range(600):
                try:
                    async with session.get(url + "/healthz") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.1)
            await _run_level(session, url, {"filter": selective}, workers * 2, workers * 4)
            rss_warm = rss_bytes(process.pid)
            for clients in CLIENT_LEVELS:
                requests = max(20, clients * 2)
                elapsed, health = await _run_level(
                    session, url, {"filter": selective}, clients, requests
                )
                figures.append(
                    Figure(
                        f"{label}, {clients} clients, selective",
                        "plans/s",
                        Timing(seconds=(elapsed,), work=requests),
                        {"pyiceberg plan_files (one thread)": theirs},
                    )
                )
                ctx.note(
                    f"{label}, {clients} clients: /healthz p99 {_p99(health) * 1000:.1f} ms "
                    f"over {len(health)} probes"
                )
            held = 40
            for _ in range(held):
                async with session.post(url + TABLE + "/plan", json={}) as r:
                    await r.read()
            rss_held = rss_bytes(process.pid)
            async with session.get(url + "/metrics") as r:
                metrics = await r.text()
    finally:
        process.send_signal(signal.SIGTERM)
        await process.wait()
    cache = _metric(metrics, "icefloe_planner_cache_bytes")
    plans = _metric(metrics, "icefloe_planner_plan_bytes")
    ctx.note(
        f"{label}: RSS {rss_warm / 2**20:.0f} MiB warm, {rss_held / 2**20:.0f} MiB after "
        f"{held} held full plans; the answering process's cache held {cache / 2**20:.0f} MiB "
        f"(budget 512 MiB) and its plans {plans / 2**20:.0f} MiB (budget 256 MiB); the "
        "rest is the interpreter, pyarrow and DuckDB (and mapped cache pages)"
    )
    return figures


async def _service_figures(
    ctx: BenchContext, directory: Path, files: int, per_manifest: int
) -> list[Figure]:
    warehouse = directory / "warehouse"
    generated = generate(warehouse / "db", files, per_manifest, "events")
    await _register(warehouse)
    selective = scans(files)["selective"]
    assert selective is not None
    peer = PyIceberg(generated)
    py_filter = _pyiceberg_filter(selective)
    peer_runs = 3
    started = time.perf_counter()
    for _ in range(peer_runs):
        peer.plan(py_filter)
    theirs = Timing(seconds=(time.perf_counter() - started,), work=peer_runs)
    figures: list[Figure] = []
    for workers in (1, 2):
        figures += await _serve(
            ctx, warehouse, directory / "cache", workers, files, selective, theirs
        )
    return figures


@benchmark("planner-service")
async def planner_service_benchmark(ctx: BenchContext) -> list[Figure]:
    """Selective plans/s at 1-150 concurrent clients (1 and 2 processes), /healthz p99, RSS."""
    files = ctx.size("service-files", full=100_000, quick=10_000)
    per_manifest = ctx.size("service-entries-per-manifest", full=5_000, quick=2_000)
    root = Path(tempfile.mkdtemp(prefix="icefloe-bench-planner-service-"))
    try:
        return await _service_figures(ctx, root, files, per_manifest)
    finally:
        shutil.rmtree(root, ignore_errors=True)
