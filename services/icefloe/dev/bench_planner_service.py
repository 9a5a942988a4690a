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
``/metrics``) are printed as notes, with each level's plan p50/p99 and peak RSS, and the
overhead RSS - cache bytes - plan bytes at its highest. A full plan fetched to its last
page over HTTP (every ``tasks`` page) stands beside PyIceberg's full ``plan_files``.
``--set service-files=1000000`` serves a 1M-file table instead of 100k.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from icefloe.catalog_fs import FileSystemCatalog
from icefloe.dev.bench import BenchContext, Figure, Kind, Timing, benchmark
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


@dataclass
class Level:
    """One load level: wall time, each plan's latency, /healthz latencies, peak RSS."""

    elapsed: float
    latencies: list[float]
    health: list[float]
    rss_peak: int
    steady: list[float]  # /healthz probes sent once every client had its first answer


async def _run_level(
    session: Any, url: str, body: dict[str, Any], clients: int, requests: int, pid: int = 0
) -> Level:
    remaining = requests
    health: list[float] = []
    steady: list[float] = []
    latencies: list[float] = []
    answered = 0  # clients with a first answer (their connection is open from then on)
    peak = 0
    done = asyncio.Event()

    async def client() -> None:
        nonlocal remaining, answered
        first = True
        while remaining > 0:
            remaining -= 1
            started = time.perf_counter()
            async with session.post(url + TABLE + "/plan", json=body) as r:
                if r.status != 200:
                    raise RuntimeError(f"plan failed: {r.status} {await r.text()}")
                await r.read()
            latencies.append(time.perf_counter() - started)
            if first:
                answered += 1
                first = False

    async def sampler() -> None:
        nonlocal peak
        while not done.is_set() and pid:
            peak = max(peak, rss_bytes(pid))
            await asyncio.sleep(0.05)

    async def prober() -> None:
        while not done.is_set():
            connected = answered == clients
            started = time.perf_counter()
            async with session.get(url + "/healthz") as r:
                await r.read()
            health.append(time.perf_counter() - started)
            if connected:
                steady.append(health[-1])
            await asyncio.sleep(0.01)

    probe = asyncio.create_task(prober())
    sample = asyncio.create_task(sampler())
    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    elapsed = time.perf_counter() - started
    done.set()
    await probe
    await sample
    return Level(elapsed, latencies, health, peak, steady)


# Clients fetch a plan's pages one at a time (PyIceberg's REST scan walks plan-tasks in a
# loop) or several at once (Apache Iceberg Java's RESTTableScan hands them to a pool of
# worker threads, ScanTaskIterable: a few per core). Both are measured; 4 fetchers stand for
# a small pool.
FULL_PLAN_FETCHERS = (1, 4)


async def _full_plan(url: str, fetchers: int = 1) -> tuple[float, int, int]:
    """A full plan fetched to its last page by ``fetchers`` concurrent fetches: seconds,
    tasks and bytes received. The client has connections of its own (a reader's REST
    client, not the load generator's pool of 150: with several planner processes those
    would send each page to any of them)."""
    import aiohttp

    async with aiohttp.ClientSession() as session:
        return await _fetch_full_plan(session, url, fetchers)


async def _fetch_full_plan(session: Any, url: str, fetchers: int) -> tuple[float, int, int]:
    started = time.perf_counter()
    async with session.post(url + TABLE + "/plan", json={}) as r:
        if r.status != 200:
            raise RuntimeError(f"plan failed: {r.status} {await r.text()}")
        first = await r.json()
    tasks = len(first["file-scan-tasks"])
    size = 0
    pending = list(reversed(first.get("plan-tasks", [])))

    async def fetch() -> None:
        nonlocal tasks, size
        while pending:
            token = pending.pop()
            async with session.post(url + TABLE + "/tasks", json={"plan-task": token}) as r:
                if r.status != 200:
                    raise RuntimeError(f"page failed: {r.status} {await r.text()}")
                body = await r.read()
            size += len(body)
            tasks += body.count(b'"data-file":')

    await asyncio.gather(*(fetch() for _ in range(fetchers)))
    return time.perf_counter() - started, tasks, size


def _p99(values: list[float]) -> float:
    return _quantile(values, 0.99)


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


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
    full_peer: Timing | None,
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
            rss_idle = rss_bytes(process.pid)
            # Warm every process (connections spread over them by the kernel): its cache,
            # compiled filters and connections.
            await _run_level(session, url, {"filter": selective}, workers * 8, workers * 40)
            rss_warm = rss_bytes(process.pid)
            overheads: list[float] = []
            for clients in CLIENT_LEVELS:
                requests = max(200, clients * 4)  # long enough for a steady state
                level = await _run_level(
                    session, url, {"filter": selective}, clients, requests, process.pid
                )
                figures.append(
                    Figure(
                        f"{label}, {clients} clients, selective",
                        "plans/s",
                        Timing(seconds=(level.elapsed,), work=requests),
                        {"pyiceberg plan_files (one thread)": theirs},
                    )
                )
                async with session.get(url + "/metrics") as r:
                    during = await r.text()
                overheads.append(level.rss_peak - _budgets_used(during))
                ctx.note(
                    f"{label}, {clients} clients: plan p50 "
                    f"{_quantile(level.latencies, 0.5) * 1000:.1f} ms, p99 "
                    f"{_p99(level.latencies) * 1000:.1f} ms; /healthz p99 "
                    f"{_p99(level.health) * 1000:.1f} ms over {len(level.health)} probes "
                    f"({_p99(level.steady) * 1000:.1f} ms over the {len(level.steady)} sent "
                    "once every client was connected); peak "
                    f"RSS {level.rss_peak / 2**20:.0f} MiB"
                )
            if full_peer is not None:
                for fetchers in FULL_PLAN_FETCHERS:
                    full = [await _full_plan(url, fetchers) for _ in range(2)]
                    seconds, tasks, size = min(full)
                    how = "one page at a time" if fetchers == 1 else f"{fetchers} fetchers"
                    figures.append(
                        Figure(
                            f"{label}, full plan to the last page (REST, {how})",
                            "ms/plan",
                            Timing(seconds=(seconds,), work=1),
                            {"pyiceberg plan_files": full_peer},
                            kind=Kind.LATENCY,
                        )
                    )
                    ctx.note(
                        f"{label}: full plan over HTTP ({how}), {tasks:,} tasks in "
                        f"{size / 2**20:.0f} MiB of JSON pages, {seconds * 1000:.0f} ms warm"
                    )
            held = 40
            for _ in range(held):
                async with session.post(url + TABLE + "/plan", json={}) as r:
                    await r.read()
            rss_held = rss_bytes(process.pid)
            async with session.get(url + "/metrics") as r:
                metrics = await r.text()
            overheads.append(rss_held - _budgets_used(metrics))
    finally:
        process.send_signal(signal.SIGTERM)
        await process.wait()
    cache = _metric(metrics, "icefloe_planner_cache_bytes")
    plans = _metric(metrics, "icefloe_planner_plan_bytes")
    ctx.note(
        f"{label}: RSS {rss_idle / 2**20:.0f} MiB idle, {rss_warm / 2**20:.0f} MiB warm, "
        f"{rss_held / 2**20:.0f} MiB after {held} held full plans; the answering process's "
        f"cache held {cache / 2**20:.0f} MiB (budget 512 MiB) and its plans "
        f"{plans / 2**20:.0f} MiB (budget 256 MiB). Overhead (RSS - cache bytes - plan "
        f"bytes, per process): at most {max(overheads) / workers / 2**20:.0f} MiB over the "
        "levels and the held plans (the interpreter, pyarrow, DuckDB, aiohttp, the page "
        "writer's 32 MiB of manifest texts, requests in flight)"
    )
    return figures


def _budgets_used(metrics: str) -> int:
    """Bytes the cache and the held plans account for, from the planner's /metrics (with
    several processes, the one that answered)."""
    cache = _metric(metrics, "icefloe_planner_cache_bytes")
    plans = _metric(metrics, "icefloe_planner_plan_bytes")
    return int(cache + plans)


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
    started = time.perf_counter()
    peer.plan(None)
    full_peer = Timing(seconds=(time.perf_counter() - started,), work=1)
    figures: list[Figure] = []
    for workers in (1, 2):
        figures += await _serve(
            ctx, warehouse, directory / "cache", workers, files, selective, theirs, full_peer
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
