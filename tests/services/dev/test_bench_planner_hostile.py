"""The planner-hostile and planner-memory benchmarks run end to end at tiny sizes."""

from __future__ import annotations

import asyncio
import re

from icefloe.dev.bench import BenchContext
from icefloe.dev.bench_planner_hostile import HOSTILE, planner_hostile_benchmark
from icefloe.dev.bench_planner_memory import BUDGETS_MIB, planner_memory_benchmark


def test_the_hostile_benchmark_sets_healthz_under_hostile_plans_beside_idle() -> None:
    sizes = {"hostile-files": 40, "hostile-clients": 2, "hostile-level-ms": 1000}
    ctx = BenchContext(quick=True, repeat=1, sizes=sizes)
    figures = asyncio.run(planner_hostile_benchmark(ctx))
    assert [f.name for f in figures] == ["0k-file table, 2 hostile clients, /healthz p99"]
    assert list(figures[0].peers) == ["/healthz p99 idle"]
    assert any("/healthz p50" in n and "idle p50" in n for n in ctx.notes)
    answered = [n for n in ctx.notes if "answers {" in n]
    assert len(answered) == len(HOSTILE)
    # Every hostile kind is planned (200), none refused or failed; the AND chain's 40 tasks
    # do not repeat its residual (56 kB a task before): well under a megabyte in all.
    assert all(re.search(r"answers \{200: \d+\}", n) for n in answered if "{}" not in n)
    chain = next(n for n in answered if "and-chain-800" in n)
    assert "largest plan 0.0" in chain


def test_the_memory_benchmark_measures_peak_rss_per_budget() -> None:
    sizes = {"memory-files": 60, "memory-level-ms": 1000, "memory-max-budget-mib": 64}
    ctx = BenchContext(quick=True, repeat=1, sizes=sizes)
    assert asyncio.run(planner_memory_benchmark(ctx)) == []
    budgets = [b for b in BUDGETS_MIB if b <= 64]
    for mib in budgets:
        line = next(n for n in ctx.notes if f"budget {mib} MiB: cold peak RSS" in n)
        found = re.search(
            r"cold peak RSS \(8 full plans at once\) (\d+) MiB \(in [\d.]+ s, reading \d+ MiB of manifests\), peak RSS (\d+)",
            line,
        )
        assert found is not None, line
        cold, peak = int(found.group(1)), int(found.group(2))
        assert 0 < cold <= peak
    assert "largest overhead" in ctx.notes[-1]
