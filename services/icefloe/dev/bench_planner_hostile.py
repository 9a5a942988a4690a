"""The planner's ``/healthz`` while hostile plan requests run, beside ``/healthz`` idle.

A plan request's filter is the client's: it may be an ``in`` list of 100,000 strings (most
of the 1 MiB body limit), an AND chain 800 levels deep, a NOT/OR nest as deep, or one string
literal of most of a megabyte. Parsing, binding, projecting and answering such a filter
costs a planner seconds of CPU; an orchestrator's probes must still be answered meanwhile,
or it restarts a healthy planner. A generated table (:mod:`icefloe.dev.bench_planner`) is
served by a real planner process (``icefloe planner``); this process probes ``/healthz``
every 10 ms on a new connection each time (as a kubelet) for ``hostile-level-ms`` idle,
then as long again while ``hostile-clients`` clients post the hostile plans in turn and
fetch each to its last page. The figure is ``/healthz`` p99 under that load beside idle p99
in the same run (the machine's load average is in the notes, with p50, the hostile
requests answered and their answer bytes per kind).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from icefloe.dev.bench import BenchContext, Figure, Kind, Timing, benchmark
from icefloe.dev.bench_planner import generate
from icefloe.dev.bench_planner_service import (
    TABLE,
    planner_env,
    probe_healthz,
    quantile,
    register_table,
    rss_bytes,
    serving_threads,
    wait_healthy,
)
from icefloe.dev.local_stack import free_port


def huge_in_list(values: int) -> dict[str, Any]:
    """``event in (...)`` with ``values`` distinct short strings (100,000 fit in 1 MiB)."""
    return {"type": "in", "term": "event", "values": [f"e{i:06d}" for i in range(values)]}


def deep_and_chain(depth: int) -> dict[str, Any]:
    """``id >= 0 and id != -1 and ... `` nested ``depth`` levels (true for every file)."""
    expression: dict[str, Any] = {"type": "gt-eq", "term": "id", "value": 0}
    for i in range(depth):
        right = {"type": "not-eq", "term": "id", "value": -1 - i}
        expression = {"type": "and", "left": expression, "right": right}
    return expression


def deep_or_not(depth: int) -> dict[str, Any]:
    """``not (not (... or id < -k) or id < -k')``, alternating NOT and OR ``depth`` levels."""
    expression: dict[str, Any] = {"type": "lt", "term": "id", "value": 0}
    for i in range(depth):
        if i % 2:
            expression = {"type": "not", "child": expression}
        else:
            expression = {
                "type": "or",
                "left": expression,
                "right": {"type": "lt", "term": "id", "value": -1 - i},
            }
    return expression


def huge_literal(size: int) -> dict[str, Any]:
    """``event = 'xxx...'`` or ``event starts with 'xxx...'`` with literals of ``size``."""
    text = "x" * size
    return {
        "type": "or",
        "left": {"type": "eq", "term": "event", "value": text},
        "right": {"type": "starts-with", "term": "event", "value": text[: size // 2]},
    }


HOSTILE: dict[str, Callable[[], dict[str, Any]]] = {
    "in-list-100k": lambda: huge_in_list(100_000),
    "and-chain-800": lambda: deep_and_chain(800),
    "or-not-800": lambda: deep_or_not(800),
    "literal-600k": lambda: huge_literal(600_000),
}


@dataclass
class Answers:
    """What the hostile clients got: per kind, statuses, answer bytes and latencies."""

    statuses: dict[str, dict[int, int]] = field(default_factory=dict)
    bytes: dict[str, int] = field(default_factory=dict)
    latency: dict[str, list[float]] = field(default_factory=dict)

    def add(self, kind: str, status: int, size: int, seconds: float) -> None:
        counts = self.statuses.setdefault(kind, {})
        counts[status] = counts.get(status, 0) + 1
        self.bytes[kind] = max(self.bytes.get(kind, 0), size)
        self.latency.setdefault(kind, []).append(seconds)


async def hostile_plan(session: Any, url: str, body: bytes) -> tuple[int, int]:
    """Post one plan and fetch it to its last page: (status, bytes of all answers)."""
    async with session.post(
        url + TABLE + "/plan", data=body, headers={"Content-Type": "application/json"}
    ) as r:
        first = await r.read()
        if r.status != 200:
            return r.status, len(first)
        tokens = (await r.json(content_type=None)).get("plan-tasks", [])
    size = len(first)
    for token in tokens:
        async with session.post(url + TABLE + "/tasks", json={"plan-task": token}) as r:
            size += len(await r.read())
            if r.status != 200:
                return r.status, size
    return 200, size


async def _hostile_clients(
    url: str, clients: int, bodies: dict[str, bytes], done: asyncio.Event, answers: Answers
) -> None:
    import aiohttp

    kinds = list(bodies)

    async def client(n: int) -> None:
        async with aiohttp.ClientSession() as session:
            i = n
            while not done.is_set():
                kind = kinds[i % len(kinds)]
                started = time.perf_counter()
                status, size = await hostile_plan(session, url, bodies[kind])
                answers.add(kind, status, size, time.perf_counter() - started)
                i += 1

    await asyncio.gather(*(client(n) for n in range(clients)))


@dataclass
class Probed:
    """``/healthz`` latencies and the serving loop's CPU per probe."""

    health: list[float] = field(default_factory=list)
    connect: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)


async def _probe_for(url: str, seconds: float, threads: list[Path]) -> Probed:
    probed = Probed()
    done = asyncio.Event()
    task = asyncio.create_task(
        probe_healthz(url, done, probed.health, probed.connect, probed.cpu, threads)
    )
    await asyncio.sleep(seconds)
    done.set()
    await task
    return probed


async def run_hostile(
    url: str, pid: int, clients: int, seconds: float
) -> tuple[Probed, Probed, Answers, int]:
    """``/healthz`` idle for ``seconds``, then under ``clients`` hostile clients for as
    long (they finish the plans in flight); also the peak RSS meanwhile."""
    import json

    threads = serving_threads(pid)
    idle = await _probe_for(url, seconds, threads)
    bodies = {
        k: json.dumps({"filter": make()}, separators=(",", ":")).encode()
        for k, make in HOSTILE.items()
    }
    answers = Answers()
    done = asyncio.Event()
    peak = 0

    async def sampler() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, rss_bytes(pid))
            await asyncio.sleep(0.05)

    load = asyncio.create_task(_hostile_clients(url, clients, bodies, done, answers))
    sample = asyncio.create_task(sampler())
    await asyncio.sleep(min(1.0, seconds / 4))  # the hostile requests are in flight
    busy = await _probe_for(url, seconds, threads)
    done.set()
    await load
    await sample
    return idle, busy, answers, peak


def _ms(values: list[float], q: float) -> float:
    return quantile(values, q) * 1000


@benchmark("planner-hostile")
async def planner_hostile_benchmark(ctx: BenchContext) -> list[Figure]:
    """/healthz p99 while hostile plan requests run (huge IN lists, deep AND/OR/NOT
    nests, huge literals), beside /healthz p99 idle."""
    files = ctx.size("hostile-files", full=10_000, quick=2_000)
    clients = ctx.size("hostile-clients", full=8, quick=4)
    level_ms = ctx.size("hostile-level-ms", full=20_000, quick=6_000)
    root = Path(tempfile.mkdtemp(prefix="icefloe-bench-planner-hostile-"))
    try:
        warehouse = root / "warehouse"
        generate(warehouse / "db", files, 500, "events")
        await register_table(warehouse)
        return await _serve_hostile(ctx, warehouse, files, clients, level_ms / 1000)
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def _serve_hostile(
    ctx: BenchContext, warehouse: Path, files: int, clients: int, seconds: float
) -> list[Figure]:
    import aiohttp

    port = free_port()
    env = planner_env(warehouse, port, tasks_per_page="1000")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "icefloe.cli", "planner", env=env
    )
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as session:
            await wait_healthy(session, url)
        idle, busy, answers, peak = await run_hostile(url, process.pid, clients, seconds)
    finally:
        process.send_signal(signal.SIGTERM)
        await process.wait()
    label = f"{files // 1000}k-file table, {clients} hostile clients"
    load = os.getloadavg()[0]
    ctx.note(
        f"{label}: /healthz p50 {_ms(busy.health, 0.5):.1f} ms, p99 "
        f"{_ms(busy.health, 0.99):.1f} ms, max {_ms(busy.health, 1.0):.0f} ms over "
        f"{len(busy.health)} probes (the event loop ran p99 {_ms(busy.cpu, 0.99):.1f} ms of "
        f"CPU per probe); idle p50 {_ms(idle.health, 0.5):.1f} ms, p99 "
        f"{_ms(idle.health, 0.99):.1f} ms over {len(idle.health)} probes; peak RSS "
        f"{peak / 2**20:.0f} MiB; load average {load:.1f}"
    )
    for kind in HOSTILE:
        latency = answers.latency.get(kind, [])
        ctx.note(
            f"{label}: {kind}: answers {answers.statuses.get(kind, {})}, largest plan "
            f"{answers.bytes.get(kind, 0) / 2**20:.2f} MiB (all pages), plan p50 "
            f"{_ms(latency, 0.5):.0f} ms"
        )
    return [
        Figure(
            f"{label}, /healthz p99",
            "ms",
            Timing(seconds=(quantile(busy.health, 0.99),), work=1),
            {"/healthz p99 idle": Timing(seconds=(quantile(idle.health, 0.99),), work=1)},
            kind=Kind.LATENCY,
        )
    ]
