"""The java-merge benchmark: its MERGE source is the batch (new rows, deleted keys marked),
and where Java is not installed it says so and gives no figure instead of failing. (The
figure itself needs Spark 3.5 and is run by ``make bench``.)"""

from __future__ import annotations

from typing import Any

import pytest

from icefloe.dev import bench_java_merge
from icefloe.dev.bench import BenchContext
from icefloe.dev.bench_java_merge import java_merge_benchmark, merge_source, merge_statement
from icefloe.dev.bench_upsert import change_batches


def test_the_merge_source_holds_each_touched_key_once_with_deletes_marked() -> None:
    for batch in change_batches(5, 40, 100):
        source = merge_source(batch)
        assert sorted(source["id"].to_pylist()) == sorted(batch.keys["id"].to_pylist())
        written = set(batch.rows["id"].to_pylist())
        for key, op, value in zip(
            source["id"].to_pylist(),
            source["op"].to_pylist(),
            source["value"].to_pylist(),
            strict=True,
        ):
            assert (op == "u") == (key in written)
            assert (value is None) == (op == "d")
    statement = merge_statement("{cat}.db.t", "/tmp/b.parquet")
    assert "parquet.`/tmp/b.parquet`" in statement and "THEN DELETE" in statement


def test_without_java_the_benchmark_says_so_and_gives_no_figure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def missing() -> Any:
        raise ImportError("no .venv-java here")

    monkeypatch.setattr(bench_java_merge, "_java_iceberg", missing)
    ctx = BenchContext(repeat=1, sizes={"java_commits": 1, "batch": 5, "keys": 10})
    assert java_merge_benchmark(ctx) == []
    assert any("Java Iceberg is not available here" in n for n in ctx.notes), ctx.notes
