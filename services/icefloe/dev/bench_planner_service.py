"""The planner as a service under load: plans/s by concurrent clients, /healthz latency, RSS.

A table of generated manifests (as in :mod:`icefloe.dev.bench_planner`) is served by a real
planner (``icefloe planner``) in its own processes on a loopback port. The load generator is
wrk (C, one thread, a Lua script for the POST body; ``make setup`` installs it): the machine
has 2 cores and aiohttp clients in Python took most of one, so they decided how fast the
planner looked. wrk keeps 1, 10, 50 and 150 connections posting selective plan requests (one
hour of one day and one user) for ``service-level-ms`` each while this process probes
``/healthz`` every 10 ms, each probe on a new connection as a kubelet's. Each level reports
plans/s (wall) beside PyIceberg's ``plan_files`` for the same scan run back to back on one
thread (PyIceberg has no server; its plans/s is what one reader process achieves), and
plans per CPU-second of the planner's processes (utime + stime from /proc, summed over the
process tree) beside PyIceberg's plans per CPU-second: on a machine shared with other work
the wall figure measures the share of the cores the planner got, the CPU figure what a plan
costs, so 1 and 2 processes, or 1 and 2 planning threads, compare on the CPU figure.
Configurations: (processes, planning threads) in :data:`CONFIGURATIONS`, processes sharing
the memory-mapped disk cache. Notes give each level's plan p50/p99 (wrk), /healthz p50/p99,
the event-loop CPU the serving processes ran during each probe (schedstat: the work a probe
waited behind, whatever share of the cores the planner got; with several processes the sum
of theirs, an upper bound), the cores the planner and the load generator (wrk + prober)
used, peak RSS and the load average. Then full plans are held in steps of 0, 10, 40, 100
and 400 (asked over 150 pooled connections), and at each step the RSS is printed beside what
the planner's ``/metrics`` accounts for (cache entries, bytes held plans keep outside the
cache: one budget) and the overhead, RSS minus both. A full plan fetched to its last page over HTTP (every
``tasks`` page) stands beside PyIceberg's full ``plan_files``. ``--set
service-files=1000000`` serves a 1M-file table instead of 100k.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from icefloe.catalog.fs import FileSystemCatalog
from icefloe.dev.bench import BenchContext, Figure, Kind, Timing, benchmark
from icefloe.dev.bench_planner import PyIceberg, generate, pyiceberg_filter, scans
from icefloe.dev.local_stack import free_port
from icefloe.errors import IcefloeError
from icefloe.io.fileio import LocalFileIO

CLIENT_LEVELS = (1, 10, 50, 150)
TABLE = "/v1/namespaces/db/tables/events"


async def wait_healthy(session: Any, url: str, *, attempts: int = 600) -> None:
    """Wait until a planner just started at ``url`` answers ``/healthz`` (0.1 s apart);
    raise if it never does, rather than measure or test a planner that is not there."""
    import aiohttp

    for _ in range(attempts):
        try:
            async with session.get(url + "/healthz") as r:
                if r.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.1)
    raise RuntimeError(f"the planner at {url} did not answer /healthz after {attempts} tries")


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


async def register_table(warehouse: Path) -> None:
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
    """One load level: plans answered in ``elapsed`` seconds, their latency percentiles (from
    wrk), /healthz latencies, peak RSS, and the CPU seconds the planner's processes and the
    load generator (wrk and this process's prober) spent meanwhile."""

    elapsed: float
    requests: int
    p50: float
    p99: float
    health: list[float]
    rss_peak: int
    planner_cpu: float
    client_cpu: float
    connect: list[float]
    health_cpu: list[float]  # event-loop CPU seconds the serving processes spent per probe


def serving_threads(pid: int) -> list[Path]:
    """The schedstat files of the event-loop (main) threads that serve requests: ``pid``'s
    own, or its worker processes' with ``--workers`` (the supervisor serves nothing)."""
    children = Path(f"/proc/{pid}/task/{pid}/children")
    kids = [int(p) for p in children.read_text().split()] if children.exists() else []
    workers = [k for k in kids if "multiprocessing.spawn" in _cmdline(k)]
    return [Path(f"/proc/{p}/task/{p}/schedstat") for p in (workers or [pid])]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def _on_cpu(files: list[Path]) -> float:
    """Seconds these threads have run on a CPU (schedstat's first field, nanoseconds)."""
    total = 0
    for f in files:
        try:
            total += int(f.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return total / 1e9


class LoadGeneratorError(IcefloeError):
    """The load generator (wrk) is missing or reported failed requests."""


# wrk's Lua hooks: the POST body, and one line of results the bench parses.
_WRK_SCRIPT = """wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = [==[{body}]==]
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("ICEFLOE %d %d %d %d %d %d %d %d %d\\n", summary.requests,
    summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(99)))
end
"""


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its descendants (Linux /proc; 0 elsewhere).

    On a shared machine wall throughput depends on what else runs; the CPU the planner
    spent per plan does not (much), so it is what compares 1 and 2 processes, or threads."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    total = 0.0
    todo, seen = [pid], set()
    while todo:
        one = todo.pop()
        if one in seen:
            continue
        seen.add(one)
        try:
            stat = Path(f"/proc/{one}/stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
            for task in Path(f"/proc/{one}/task").iterdir():
                children = task / "children"
                if children.exists():
                    todo += [int(p) for p in children.read_text().split()]
        except (OSError, ValueError):
            continue
    return total


async def probe_healthz(
    url: str,
    done: asyncio.Event,
    health: list[float],
    connect: list[float],
    health_cpu: list[float],
    threads: list[Path],
) -> None:
    """Probe ``/healthz`` every 10 ms until ``done``, each probe on a new connection as a
    kubelet's: appends each probe's latency, its TCP connect (a full accept queue: > 1 s)
    and the CPU the serving event loops (``threads``' schedstat) ran meanwhile. Raises
    :class:`LoadGeneratorError` for any answer but 200."""
    host, _, port = url.removeprefix("http://").partition(":")
    request = f"GET /healthz HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    while not done.is_set():
        cpu = _on_cpu(threads)
        started = time.perf_counter()
        reader, writer = await asyncio.open_connection(host, int(port))
        connect.append(time.perf_counter() - started)
        writer.write(request.encode())
        answer = await reader.read()
        health.append(time.perf_counter() - started)
        health_cpu.append(_on_cpu(threads) - cpu)
        writer.close()
        if not answer.startswith(b"HTTP/1.1 200"):
            raise LoadGeneratorError(f"/healthz answered {answer[:100]!r}")
        await asyncio.sleep(0.01)


class _NoPlanFinished(LoadGeneratorError):
    """wrk finished no plan in its time, without any error: the time was too short for this
    machine's load (a plan slower than the whole run), not a failure."""


async def run_level(
    session: Any, url: str, body: dict[str, Any], clients: int, seconds: float, pid: int = 0
) -> Level:
    """One load level; a run that finished no plan (and met no error) is run again for twice
    as long, at most three more times, so a loaded machine yields a figure, not a failure."""
    for _ in range(3):
        try:
            return await _run_level_once(session, url, body, clients, seconds, pid)
        except _NoPlanFinished:
            seconds *= 2
    return await _run_level_once(session, url, body, clients, seconds, pid)


async def _run_level_once(
    session: Any, url: str, body: dict[str, Any], clients: int, seconds: float, pid: int = 0
) -> Level:
    """``clients`` connections posting ``body`` for ``seconds`` with wrk (one thread: C and
    epoll, a few percent of a core where aiohttp clients took most of one), while this
    process probes /healthz every 10 ms, each probe on a new connection as a kubelet's."""
    wrk = shutil.which("wrk")
    if wrk is None:
        raise LoadGeneratorError(
            "wrk is not installed: run `make setup` (deploy/setup.sh installs Debian's wrk)"
        )
    health: list[float] = []
    connect: list[float] = []  # of each probe, its TCP connect (a full accept queue: > 1 s)
    # Of each probe, the CPU the serving event loops ran meanwhile: the work the probe
    # waited behind, whatever share of the cores the planner got (with several processes,
    # all of theirs: an upper bound for the one that answered).
    health_cpu: list[float] = []
    threads = serving_threads(pid) if pid else []
    peak = 0
    done = asyncio.Event()

    async def sampler() -> None:
        nonlocal peak
        while not done.is_set() and pid:
            peak = max(peak, rss_bytes(pid))
            await asyncio.sleep(0.05)

    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(_WRK_SCRIPT.format(body=json.dumps(body)))
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    own_before = time.process_time()
    cpu_before = cpu_seconds(pid) if pid else 0.0
    probe = asyncio.create_task(probe_healthz(url, done, health, connect, health_cpu, threads))
    sample = asyncio.create_task(sampler())
    try:
        process = await asyncio.create_subprocess_exec(
            wrk,
            "-t1",
            f"-c{clients}",
            f"-d{max(1, round(seconds))}s",  # whole seconds: wrk takes no fraction
            "--timeout",
            "60s",
            "-s",
            script.name,
            url + TABLE + "/plan",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await process.communicate()
    finally:
        done.set()
        await probe
        await sample
        os.unlink(script.name)
    cpu_after = cpu_seconds(pid) if pid else 0.0
    children_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    client_cpu = (
        children_after.ru_utime
        + children_after.ru_stime
        - children_before.ru_utime
        - children_before.ru_stime
        + time.process_time()
        - own_before
    )
    line = next((x for x in out.decode().splitlines() if x.startswith("ICEFLOE ")), None)
    if process.returncode != 0 or line is None:
        raise LoadGeneratorError(
            f"wrk failed ({process.returncode}): {(err or out).decode()[-500:]}"
        )
    requests, micros, *errors, p50, p99 = (int(x) for x in line.split()[1:])
    if requests == 0 and not any(errors):
        raise _NoPlanFinished(f"wrk finished no plan in {seconds:g} s ({clients} clients)")
    if any(errors) or requests == 0:
        raise LoadGeneratorError(
            f"wrk: {requests} plans, errors (connect, read, write, status, timeout) {errors}"
        )
    return Level(
        micros / 1e6,
        requests,
        p50 / 1e6,
        p99 / 1e6,
        health,
        peak,
        cpu_after - cpu_before,
        client_cpu,
        connect,
        health_cpu,
    )


# Clients fetch a plan's pages one at a time (PyIceberg's REST scan walks plan-tasks in a
# loop) or several at once (Apache Iceberg Java's RESTTableScan hands them to a pool of
# worker threads, ScanTaskIterable: a few per core). Both are measured; 4 fetchers stand for
# a small pool.
FULL_PLAN_FETCHERS = (1, 4)


async def full_plan(url: str, fetchers: int = 1) -> tuple[float, int, int]:
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
    return quantile(values, 0.99)


def quantile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def metric_value(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


@dataclass(frozen=True)
class Peer:
    """PyIceberg's figures for the same scans: selective plans back to back on one thread
    (wall seconds and CPU seconds of ``runs`` plans), and one full plan."""

    selective: Timing
    selective_cpu: Timing
    full: Timing | None


def planner_env(warehouse: Path, port: int, **settings: str) -> dict[str, str]:
    """The environment of a bench's planner process: the file-system catalog at
    ``warehouse`` on a loopback ``port``, no access log, a fixed plan secret, warnings
    only, and ``settings`` as ``ICEFLOE_PLANNER_<NAME>`` variables."""
    return {
        **os.environ,
        "ICEFLOE_PLANNER_CATALOG": f"file://{warehouse}",
        "ICEFLOE_PLANNER_HOST": "127.0.0.1",
        "ICEFLOE_PLANNER_PORT": str(port),
        "ICEFLOE_PLANNER_ACCESS_LOG": "false",
        "ICEFLOE_PLANNER_PLAN_SECRET": "bench secret, sixteen bytes or more",
        "ICEFLOE_PLANNER_LOG_LEVEL": "WARNING",
        **{f"ICEFLOE_PLANNER_{name.upper()}": value for name, value in settings.items()},
    }


async def _serve(
    ctx: BenchContext,
    warehouse: Path,
    cache_dir: Path,
    workers: int,
    threads: int,
    files: int,
    selective: dict[str, Any],
    peer: Peer,
    seconds: float,
) -> list[Figure]:
    import aiohttp

    port = free_port()
    env = planner_env(
        warehouse,
        port,
        workers=str(workers),
        planning_concurrency=str(threads),
        cache_dir=str(cache_dir),
        # One budget for cached and held manifests: a full plan pins the whole table, so
        # the budget must hold it (about 570 bytes per entry) for the plan to be held.
        cache_max_bytes=str(cache_budget(files)),
    )
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "icefloe.cli", "planner", env=env
    )
    url = f"http://127.0.0.1:{port}"
    figures: list[Figure] = []
    label = (
        f"{files // 1000}k-file table, {workers} process{'es' if workers > 1 else ''} x "
        f"{threads} planning thread{'s' if threads > 1 else ''}"
    )
    full_peer = peer.full
    try:
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as session:
            await wait_healthy(session, url, attempts=600)
            rss_idle = rss_bytes(process.pid)
            # Warm every process (connections spread over them by the kernel): its cache,
            # compiled filters and connections.
            await run_level(session, url, {"filter": selective}, workers * 8, 3)
            rss_warm = rss_bytes(process.pid)
            overheads: list[float] = []
            for clients in CLIENT_LEVELS:
                level = await run_level(
                    session, url, {"filter": selective}, clients, seconds, process.pid
                )
                figures.append(
                    Figure(
                        f"{label}, {clients} clients, selective",
                        "plans/s",
                        Timing(seconds=(level.elapsed,), work=level.requests),
                        {"pyiceberg plan_files (one thread)": peer.selective},
                    )
                )
                figures.append(
                    Figure(
                        f"{label}, {clients} clients, selective, per planner CPU-second",
                        "plans/cpu-s",
                        Timing(seconds=(max(level.planner_cpu, 1e-3),), work=level.requests),
                        {"pyiceberg plan_files (CPU)": peer.selective_cpu},
                    )
                )
                async with session.get(url + "/metrics") as r:
                    during = await r.text()
                overheads.append(level.rss_peak - _budgets_used(during))
                ctx.note(
                    f"{label}, {clients} clients: {level.requests / level.elapsed:.0f} plans/s, "
                    f"{level.requests / max(level.planner_cpu, 1e-3):.0f} plans per planner "
                    f"CPU-second ({level.planner_cpu / level.elapsed:.2f} cores busy), plan "
                    f"p50 {level.p50 * 1000:.1f} ms, p99 {level.p99 * 1000:.1f} ms; /healthz "
                    f"p50 {quantile(level.health, 0.5) * 1000:.1f} ms, p99 "
                    f"{_p99(level.health) * 1000:.1f} ms over {len(level.health)} probes (the "
                    "serving event loops ran p50 "
                    f"{quantile(level.health_cpu, 0.5) * 1000:.1f} ms, p99 "
                    f"{_p99(level.health_cpu) * 1000:.1f} ms of CPU meanwhile); "
                    f"load generator {level.client_cpu / level.elapsed:.2f} cores; peak RSS "
                    f"{level.rss_peak / 2**20:.0f} MiB; load average {os.getloadavg()[0]:.1f}"
                )
            if full_peer is not None:
                for fetchers in FULL_PLAN_FETCHERS:
                    full = [await full_plan(url, fetchers) for _ in range(2)]
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
            curve = await held_curve(session, url, process.pid, selective)
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


async def held_curve(
    session: Any,
    url: str,
    pid: int,
    selective: dict[str, Any],
    steps: tuple[int, ...] = HELD_PLANS,
) -> list[tuple[int, int, int, int, int, int]]:
    """Full plans asked (and held: their other pages are never fetched) in steps, each step
    spread over 150 pooled connections as 150 clients would; after each, RSS and what
    /metrics accounts for: (plans, RSS, cache, plans outside the cache, pinned, both)."""
    import aiohttp

    out = []
    held = 0
    connector = aiohttp.TCPConnector(limit=150)
    async with aiohttp.ClientSession(connector=connector) as clients:

        async def ask(body: dict[str, Any]) -> None:
            async with clients.post(url + TABLE + "/plan", json=body) as r:
                if r.status != 200:
                    raise RuntimeError(f"plan failed: {r.status} {await r.text()}")
                await r.read()

        # Open the 150 pooled connections first: 150 selective plans at once.
        await asyncio.gather(*(ask({"filter": selective}) for _ in range(150)))
        for target in steps:
            while held < target:
                step = min(8, target - held)  # a few at a time, over the pooled connections
                await asyncio.gather(*(ask({}) for _ in range(step)))
                held += step
            rss = rss_bytes(pid)
            async with session.get(url + "/metrics") as r:
                metrics = await r.text()
            cache = int(metric_value(metrics, "icefloe_planner_cache_bytes"))
            outside = int(metric_value(metrics, "icefloe_planner_plan_bytes"))
            pinned = int(metric_value(metrics, "icefloe_planner_plan_pinned_bytes"))
            out.append((target, rss, cache, outside, pinned, _budgets_used(metrics)))
    return out


def _budgets_used(metrics: str) -> int:
    """Bytes of decoded manifests the planner accounts for (its cache's entries and what
    held plans keep outside it: one budget), from /metrics (with several processes, the
    one that answered)."""
    cache = metric_value(metrics, "icefloe_planner_cache_bytes")
    plans = metric_value(metrics, "icefloe_planner_plan_bytes")
    return int(cache + plans)


# (processes, planning threads per process) served in turn: threads against processes.
CONFIGURATIONS = ((1, 1), (1, 2), (2, 1), (2, 2))


async def _service_figures(
    ctx: BenchContext, directory: Path, files: int, per_manifest: int, seconds: float
) -> list[Figure]:
    warehouse = directory / "warehouse"
    generated = generate(warehouse / "db", files, per_manifest, "events")
    await register_table(warehouse)
    selective = scans(files)["selective"]
    assert selective is not None
    pyiceberg = PyIceberg(generated)
    py_filter = pyiceberg_filter(selective)
    peer_runs = 3
    started, cpu = time.perf_counter(), time.process_time()
    for _ in range(peer_runs):
        pyiceberg.plan(py_filter)
    theirs = Timing(seconds=(time.perf_counter() - started,), work=peer_runs)
    theirs_cpu = Timing(seconds=(time.process_time() - cpu,), work=peer_runs)
    started = time.perf_counter()
    pyiceberg.plan(None)
    full_peer = Timing(seconds=(time.perf_counter() - started,), work=1)
    peer = Peer(theirs, theirs_cpu, full_peer)
    figures: list[Figure] = []
    for workers, threads in CONFIGURATIONS:
        figures += await _serve(
            ctx, warehouse, directory / "cache", workers, threads, files, selective, peer, seconds
        )
    return figures


@benchmark("planner-service")
async def planner_service_benchmark(ctx: BenchContext) -> list[Figure]:
    """Selective plans/s and plans per CPU-second at 1-150 concurrent clients (1 and 2
    processes, 1 and 2 planning threads), /healthz p99, RSS."""
    files = ctx.size("service-files", full=100_000, quick=10_000)
    per_manifest = ctx.size("service-entries-per-manifest", full=5_000, quick=2_000)
    level_ms = ctx.size("service-level-ms", full=6_000, quick=2_000)
    root = Path(tempfile.mkdtemp(prefix="icefloe-bench-planner-service-"))
    try:
        return await _service_figures(ctx, root, files, per_manifest, level_ms / 1000)
    finally:
        shutil.rmtree(root, ignore_errors=True)
