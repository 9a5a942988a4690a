"""The dedup benchmark runs at tiny sizes, states each figure beside its peers, and its
synthetic table is one the dedup index reads correctly."""

from __future__ import annotations

import json
import math

from icefloe.dev.bench import BenchContext, Kind
from icefloe.dev.bench_dedup import dedup_benchmark, metadata_json
from icefloe.spec.metadata import parse_table_metadata
from icefloe.table.commit_index import CommitIndex


def test_dedup_benchmark_reports_per_commit_and_load_figures_beside_peers() -> None:
    ctx = BenchContext(repeat=1, sizes={"snapshots": 40, "ids": 2})
    figures = dedup_benchmark(ctx)
    assert [(f.name, f.kind) for f in figures] == [
        ("dedup check per commit (40 snapshots)", Kind.LATENCY),
        ("dedup index build on load (40 snapshots)", Kind.LATENCY),
        ("dedup ledger carried forward per commit (40 snapshots)", Kind.LATENCY),
    ]
    assert list(figures[0].peers) == ["position walk (before #9)", "full walk, no index"]
    assert list(figures[1].peers) == ["metadata parse"]
    assert list(figures[2].peers) == [
        "metadata write, with the ledger",
        "metadata write, no ledger",
    ]
    for figure in figures:
        for peer in figure.peers:
            assert math.isfinite(figure.speedup(peer)) and figure.speedup(peer) > 0
    assert any("index memory" in note for note in ctx.notes)
    assert any("bytes per commit id" in note and "ledger" in note for note in ctx.notes)


def test_the_benchmark_table_holds_every_commit_id_once() -> None:
    metadata = parse_table_metadata(json.dumps(metadata_json(30, 3)))
    index = CommitIndex()
    index.update(metadata)
    assert len(index) == 90
    assert index.get("job-30-2") == 30 and index.get("job-1-0") == 1
