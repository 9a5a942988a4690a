"""The planner's resident memory against its budget, at budgets from 32 MiB to 1 GiB.

The sizing rule (``docs/operations/sizing.md``) says a planner process needs its decoded
manifest budget (``ICEFLOE_PLANNER_CACHE_MAX_BYTES``) plus a fixed overhead. This serves
the generated 100k-file table (:mod:`icefloe.dev.bench_planner`) with one planner process
per budget in :data:`BUDGETS_MIB` and puts the same load on each. First, cold: while
nothing is decoded yet, :data:`COLD_CLIENTS` clients ask for a full plan at once, each read
to the end of its first page (at budgets below the table's decoded manifests every plan is
cold, and each plan being made or answered holds the manifests it read); the high-water mark
after that wave is the *cold peak*. Then selective plans from 1 and 150 clients (wrk), a
full plan fetched to its last page one page at a time and with 4 fetchers, then 0 to 40
full plans held (never fetched past their first page). The kernel's high-water mark of the
process's resident set (``VmHWM``: every peak, however short, not samples) is then set
beside the budget: the overhead is peak RSS minus the budget, and the rule holds at a budget
where the overhead is within the documented constant.
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

from icefloe.dev.bench import BenchContext, Figure, benchmark
from icefloe.dev.bench_planner import generate, scans
from icefloe.dev.bench_planner_service import (
    TABLE,
    full_plan,
    held_curve,
    metric_value,
    planner_env,
    register_table,
    run_level,
    wait_healthy,
)
from icefloe.dev.local_stack import free_port

BUDGETS_MIB = (32, 64, 128, 256, 512, 1024)
LOAD_CLIENTS = (1, 150)
HELD = (0, 10, 40)  # full plans held, in steps (the service bench goes on to 400)
COLD_CLIENTS = 32  # full plans asked at once of a planner that has decoded nothing


def peak_rss(pid: int) -> int:
    """The high-water mark of ``pid``'s resident set (``VmHWM``), bytes; 0 off Linux."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


async def cold_wave(url: str, clients: int) -> None:
    """``clients`` full plans asked at once, each on its own connection and read to the end
    of its first page."""
    import aiohttp

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def ask() -> None:
            async with session.post(url + TABLE + "/plan", json={}) as r:
                if r.status != 200:
                    raise RuntimeError(f"plan failed: {r.status} {await r.text()}")
                await r.read()

        await asyncio.gather(*(ask() for _ in range(clients)))


async def measure_budget(
    warehouse: Path,
    budget: int,
    selective: dict[str, Any],
    seconds: float,
    cache_dir: Path | None = None,
    cold_clients: int = COLD_CLIENTS,
) -> tuple[int, int, dict[str, float]]:
    """One planner at ``budget`` under the load: (cold peak RSS, peak RSS, its last
    /metrics figures and the cold wave's seconds and manifest bytes read)."""
    import aiohttp

    port = free_port()
    env = planner_env(warehouse, port, cache_max_bytes=str(budget))
    if cache_dir is not None:
        env["ICEFLOE_PLANNER_CACHE_DIR"] = str(cache_dir)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "icefloe.cli", "planner", env=env
    )
    url = f"http://127.0.0.1:{port}"
    try:
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as session:
            await wait_healthy(session, url)
            started = time.perf_counter()
            await cold_wave(url, cold_clients)
            cold_seconds = time.perf_counter() - started
            cold = peak_rss(process.pid)
            async with session.get(url + "/metrics") as r:
                cold_read = metric_value(await r.text(), "icefloe_planner_cache_read_bytes_total")
            for clients in LOAD_CLIENTS:
                await run_level(session, url, {"filter": selective}, clients, seconds)
            for fetchers in (1, 4):
                await full_plan(url, fetchers)
            await held_curve(session, url, process.pid, selective, HELD)
            peak = peak_rss(process.pid)
            async with session.get(url + "/metrics") as r:
                text = await r.text()
        figures = {
            name: metric_value(text, f"icefloe_planner_{name}")
            for name in ("memory_bytes", "cache_bytes", "plan_bytes", "pages_ahead_bytes")
        }
        figures["plans_dropped_for_memory_total"] = metric_value(
            text, "icefloe_planner_plans_dropped_for_memory_total"
        )
        figures["cold_seconds"] = cold_seconds
        figures["cold_read_bytes"] = cold_read
        return cold, peak, figures
    finally:
        process.send_signal(signal.SIGTERM)
        await process.wait()


@benchmark("planner-memory")
async def planner_memory_benchmark(ctx: BenchContext) -> list[Figure]:
    """Peak RSS of a planner process beside its budget, at budgets of 32 MiB to 1 GiB."""
    files = ctx.size("memory-files", full=100_000, quick=10_000)
    seconds = ctx.size("memory-level-ms", full=4_000, quick=2_000) / 1000
    root = Path(tempfile.mkdtemp(prefix="icefloe-bench-planner-memory-"))
    top = ctx.size("memory-max-budget-mib", full=1024, quick=64)
    bottom = ctx.size("memory-min-budget-mib", full=32, quick=32)
    budgets = [b for b in BUDGETS_MIB if bottom <= b <= top]
    # 1: decoded manifests also go to memory-mapped Arrow files (ICEFLOE_PLANNER_CACHE_DIR),
    # whose pages the kernel counts in the resident set while mapped.
    disk = ctx.size("memory-cache-dir", full=2, quick=2) == 1
    cold_clients = ctx.size("memory-cold-clients", full=COLD_CLIENTS, quick=8)
    try:
        warehouse = root / "warehouse"
        generate(warehouse / "db", files, 5_000 if files >= 50_000 else 1_000, "events")
        await register_table(warehouse)
        selective = scans(files)["selective"]
        assert selective is not None
        overheads = []
        for mib in budgets:
            cache_dir = root / f"cache-{mib}" if disk else None
            cold, peak, seen = await measure_budget(
                warehouse, mib << 20, selective, seconds, cache_dir, cold_clients
            )
            overhead = peak - (mib << 20)
            overheads.append(overhead)
            ctx.note(
                f"{files // 1000}k-file table{' (cache_dir)' if disk else ''}, budget {mib} "
                f"MiB: cold peak RSS ({cold_clients} full plans at once) {cold / 2**20:.0f} "
                f"MiB (in {seen['cold_seconds']:.1f} s, reading "
                f"{seen['cold_read_bytes'] / 2**20:.0f} MiB of manifests), peak RSS {peak / 2**20:.0f} MiB, overhead (peak - budget) {overhead / 2**20:.0f} MiB; at the end "
                f"decoded manifests {seen['memory_bytes'] / 2**20:.0f} MiB (cache "
                f"{seen['cache_bytes'] / 2**20:.0f}, plans outside "
                f"{seen['plan_bytes'] / 2**20:.0f}), pages ahead "
                f"{seen['pages_ahead_bytes'] / 2**20:.0f} MiB, plans dropped for memory "
                f"{seen['plans_dropped_for_memory_total']:.0f}; load average "
                f"{os.getloadavg()[0]:.1f}"
            )
        ctx.note(
            f"largest overhead {max(overheads) / 2**20:.0f} MiB over budgets "
            f"{', '.join(str(b) for b in budgets)} MiB"
        )
        return []
    finally:
        shutil.rmtree(root, ignore_errors=True)
