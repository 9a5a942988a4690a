"""The upsert benchmark runs at tiny sizes, states each figure beside its peers, and refuses
to produce a read figure from a read that is not the fold of the batches."""

from __future__ import annotations

import math

import pyarrow as pa
import pytest

from icefloe.dev.bench import BenchContext, Kind
from icefloe.dev.bench_upsert import (
    APPEND_ONLY,
    EQUALITY,
    NO_COMPACTION,
    _checked,
    change_batches,
    fold,
    upsert_benchmark,
)


@pytest.mark.parametrize("version", [2, 3])
def test_upsert_benchmark_reports_commits_and_reads_beside_peers(version: int) -> None:
    ctx = BenchContext(
        repeat=1,
        sizes={
            "commits": 4,
            "batch": 50,
            "keys": 120,
            "format_version": version,
            "big_rows": 1_000,
            "big_files": 3,
            "million_files": 3_000,
            "million_files_per_manifest": 1_000,
        },
    )
    figures = upsert_benchmark(ctx)
    assert [(f.name, f.kind, list(f.peers)) for f in figures] == [
        ("upsert commits, 4 batches", Kind.RATE, [EQUALITY]),
        (
            "upsert commits with the coordinator's compaction, 4 batches",
            Kind.RATE,
            [NO_COMPACTION, EQUALITY],
        ),
        (
            "DuckDB read after 4 upsert commits",
            Kind.LATENCY,
            [APPEND_ONLY, NO_COMPACTION, EQUALITY],
        ),
        ("PyIceberg read after 4 upsert commits", Kind.LATENCY, [APPEND_ONLY, NO_COMPACTION]),
        ("commit one upsert batch, 0.001M-row table", Kind.LATENCY, [EQUALITY]),
        ("commit one upsert batch, 0.003M data files", Kind.LATENCY, [EQUALITY]),
    ]
    assert figures[0].icefloe.work == 4 * 50
    for figure in figures:
        for peer in figure.peers:
            assert math.isfinite(figure.speedup(peer)) and figure.speedup(peer) > 0
    assert sum("append-only time" in note for note in ctx.notes) == 2


def test_the_fold_is_last_write_wins_with_deletes() -> None:
    batches = change_batches(30, 20, 40)
    live: dict[int, tuple[str, int]] = {}
    for b in batches:
        written = dict(zip(b.rows["id"].to_pylist(), b.rows["ord"].to_pylist(), strict=True))
        for k in b.keys["id"].to_pylist():
            if k in written:
                live[k] = (f"v{k * 31 + written[k]}", written[k])
            else:
                live.pop(k, None)
    expected = fold(batches)
    assert expected["id"].to_pylist() == sorted(live)
    assert list(zip(expected["value"].to_pylist(), expected["ord"].to_pylist(), strict=True)) == [
        live[k] for k in sorted(live)
    ]
    assert 0 < expected.num_rows < 40  # some keys deleted at the end, some live


def test_a_read_that_is_not_the_fold_produces_no_figure() -> None:
    expected = fold(change_batches(3, 10, 20))
    with pytest.raises(AssertionError, match="rows"):
        _checked(lambda _: expected.slice(1), "t", expected, full=False)
    changed = expected.set_column(1, "value", pa.array(["x"] * expected.num_rows))
    _checked(lambda _: changed, "t", expected, full=False)  # the timed reads count rows only
    with pytest.raises(AssertionError, match="not the fold"):
        _checked(lambda _: changed, "t", expected, full=True)
    _checked(
        lambda _: expected.take([2, 0, 1, *range(3, expected.num_rows)]), "t", expected, full=True
    )


def test_duckdb_equality_delete_read_is_left_out_past_its_commit_limit_and_said_so() -> None:
    sizes = {"commits": 3, "batch": 20, "keys": 50, "big_rows": 200, "big_files": 2}
    sizes |= {"million_files": 2_000, "million_files_per_manifest": 1_000}
    ctx = BenchContext(repeat=1, sizes={**sizes, "equality_read_max_commits": 2})
    figures = upsert_benchmark(ctx)
    duckdb = next(f for f in figures if f.name.startswith("DuckDB"))
    assert list(duckdb.peers) == [APPEND_ONLY, NO_COMPACTION]
    assert any("left out past 2 commits" in note for note in ctx.notes)
