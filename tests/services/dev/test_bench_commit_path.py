"""The commit-path benchmark runs at tiny sizes, checks both paths agree, and states each
figure beside the entry-by-entry path and PyIceberg."""

from __future__ import annotations

import asyncio
import math

from icefloe.dev.bench import BenchContext, Kind
from icefloe.dev.bench_commit_path import commit_path_benchmark, targets


def test_commit_path_benchmark_reports_row_delta_and_live_paths_beside_peers() -> None:
    ctx = BenchContext(repeat=1, sizes={"files": 3_000, "entries-per-manifest": 500})
    figures = asyncio.run(commit_path_benchmark(ctx))
    assert [f.name for f in figures] == [
        "row delta, 10 files (3k files), cold",
        "row delta, 10 files (3k files), warm reader",
        "live paths rebuild (3k files)",
    ]
    for figure in figures:
        assert figure.kind is Kind.LATENCY
        assert "entry by entry (before)" in figure.peers
        for peer in figure.peers:
            assert math.isfinite(figure.speedup(peer)) and figure.speedup(peer) > 0
    assert any("Load average" in note for note in ctx.notes)


def test_targets_are_spread_and_half_have_a_dv() -> None:
    chosen = targets(1_000_000)
    assert len(chosen) == 10
    assert sum(i % 500 == 250 for i in chosen) == 5
