"""The key index benchmark runs at tiny sizes and states each figure beside its peers."""

from __future__ import annotations

import math

from icefloe.dev.bench import BenchContext, Kind
from icefloe.dev.bench_key_index import key_index_benchmark


def test_key_index_benchmark_reports_rebuild_resume_and_lookup_beside_peers() -> None:
    ctx = BenchContext(repeat=1, sizes={"keys": 2_000, "big_keys": 3_000, "files": 3, "batch": 100})
    figures = key_index_benchmark(ctx)
    names = [(f.name, f.kind) for f in figures]
    assert names == [
        (f"{what}, {size} {kind} keys", how)
        for kind in ("long", "string")
        for size in ("0.002M", "0.003M")
        for what, how in (
            ("rebuild", Kind.RATE),
            ("resume from checkpoint", Kind.LATENCY),
            ("lookup 100 keys", Kind.LATENCY),
        )
    ]
    assert "reference (dict per key)" in figures[0].peers  # the peer at the smaller size
    assert "reference (dict per key)" not in figures[3].peers
    for figure in figures:
        assert figure.peers
        for peer in figure.peers:
            assert math.isfinite(figure.speedup(peer)) and figure.speedup(peer) > 0
    assert sum("bytes/key in memory" in note for note in ctx.notes) == 6
