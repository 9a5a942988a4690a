"""The planner as a service under load: plans/s by concurrent clients, /healthz latency, RSS.

A table of generated manifests (as in :mod:`icefloe.dev.bench_planner`) is served by a real
planner (``icefloe planner``) in its own process on a loopback port, so the load generator
does not share its event loop; aiohttp clients post selective plan requests (one hour of one
day and one user) while a prober calls ``/healthz`` every 10 ms. For 1, 10, 50 and 150
concurrent clients the figure is plans/s, beside PyIceberg's ``plan_files`` for the same scan
run back to back on one thread (PyIceberg has no server; its plans/s is what one reader
process achieves). It is measured with one planner process and with ``--workers 2`` (sharing
the memory-mapped disk cache). The /healthz p99 of each level and the planner's RSS are
printed as notes, with each level's plan p50/p99 and peak RSS; then full plans are held in
steps of 0, 10, 40, 100 and 400 (asked over 150 pooled connections), and at each step the
RSS is printed beside what the planner's ``/metrics`` accounts for (cache entries, bytes
held plans keep outside the cache: one budget) and the overhead, RSS minus both. A full plan fetched to its last
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


async def _full_plan(session: Any, url: str) -> tuple[float, int, int]:
    """A full plan fetched to its last page: seconds, tasks and bytes received."""
    started = time.perf_counter()
    async with session.post(url + TABLE + "/plan", json={}) as r:
        if r.status != 200:
            raise RuntimeError(f"plan failed: {r.status} {await r.text()}")
        first = await r.json()
    tasks = len(first["file-scan-tasks"])
    size = 0
    for token in first.get("plan-tasks", []):
        async with session.post(url + TABLE + "/tasks", json={"plan-task": token}) as r:
            if r.status != 200:
                raise RuntimeError(f"page failed: {r.status} {await r.text()}")
            body = await r.read()
        size += len(body)
        tasks += body.count(b'"data-file":')
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
        # One budget for cached and held manifests: a full plan pins the whole table, so
        # the budget must hold it (about 570 bytes per entry) for the plan to be held.
        "ICEFLOE_PLANNER_CACHE_MAX_BYTES": str(cache_budget(files)),
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
                full = [await _full_plan(session, url) for _ in range(2)]
                seconds, tasks, size = min(full)
                figures.append(
                    Figure(
                        f"{label}, full plan to the last page (REST)",
                        "ms/plan",
                        Timing(seconds=(seconds,), work=1),
                        {"pyiceberg plan_files": full_peer},
                        kind=Kind.LATENCY,
                    )
                )
                ctx.note(
                    f"{label}: full plan over HTTP, {tasks:,} tasks in "
                    f"{size / 2**20:.0f} MiB of JSON pages, {seconds * 1000:.0f} ms warm"
                )
            curve = await _held_curve(session, url, process.pid, selective)
            overheads += [rss - used for _, rss, _, _, _, used in curve]
    finally:
        process.send_signal(signal.SIGTERM)
        await process.wait()
    ctx.note(
        f"{label}: RSS {rss_idle / 2**20:.0f} MiB idle, {rss_warm / 2**20:.0f} MiB warm. "
        "Held full plans (also asked over the 150 clients' pooled connections) -> RSS, "
        "cache bytes, bytes plans keep outside the cache, bytes they pin, overhead "
        "(RSS - cache - plans outside), MiB: "
        + "; ".join(
            f"{held}: {rss / 2**20:.0f}, {cache / 2**20:.0f}, {outside / 2**20:.0f}, "
            f"{pinned / 2**20:.0f}, {(rss - used) / 2**20:.0f}"
            for held, rss, cache, outside, pinned, used in curve
        )
        + f". Overhead at most {max(overheads) / workers / 2**20:.0f} MiB per process over "
        "the levels and the held plans (budget: cache + plans within cache_max_bytes, "
        f"{cache_budget(files) / 2**20:.0f} MiB)"
    )
    return figures


HELD_PLANS = (0, 10, 40, 100, 400)


def cache_budget(files: int) -> int:
    """The planner's default budget (512 MiB), or 1 KiB per file where that is more (a
    1M-file table's decoded manifests, about 570 MB, do not fit in 512 MiB)."""
    return max(512 << 20, files << 10)


async def _held_curve(
    session: Any, url: str, pid: int, selective: dict[str, Any]
) -> list[tuple[int, int, int, int, int, int]]:
    """Full plans asked (and held: their other pages are never fetched) in steps, each step
    spread over 150 pooled connections as 150 clients would; after each, RSS and what
    /metrics accounts for: (plans, RSS, cache, plans outside the cache, pinned, both)."""
    import aiohttp

    out = []
    held = 0
    connector = aiohttp.TCPConnector(limit=150)
    async with aiohttp.ClientSession(connector=connector) as clients:
        # Open the 150 connections first, as the load levels did.
        await _run_level(clients, url, {"filter": selective}, 150, 150)
        for target in HELD_PLANS:

            async def one() -> None:
                async with clients.post(url + TABLE + "/plan", json={}) as r:
                    if r.status != 200:
                        raise RuntimeError(f"plan failed: {r.status} {await r.text()}")
                    await r.read()

            while held < target:
                step = min(8, target - held)  # a few at a time, over the pooled connections
                await asyncio.gather(*(one() for _ in range(step)))
                held += step
            rss = rss_bytes(pid)
            async with session.get(url + "/metrics") as r:
                metrics = await r.text()
            cache = int(_metric(metrics, "icefloe_planner_cache_bytes"))
            outside = int(_metric(metrics, "icefloe_planner_plan_bytes"))
            pinned = int(_metric(metrics, "icefloe_planner_plan_pinned_bytes"))
            out.append((target, rss, cache, outside, pinned, _budgets_used(metrics)))
    return out


def _budgets_used(metrics: str) -> int:
    """Bytes of decoded manifests the planner accounts for (its cache's entries and what
    held plans keep outside it: one budget), from /metrics (with several processes, the
    one that answered)."""
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
