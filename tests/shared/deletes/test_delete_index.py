"""Attaching delete files to data files: the spec's scope rules, and never missing a delete.

Two laws, checked on random data and delete files:

* without metrics, :meth:`DeleteFileIndex.for_data_file` returns exactly the delete files the
  spec's "Scan Planning" rules select (sequence numbers, partition, global equality deletes,
  referenced data files, deletion vectors replacing position deletes);
* with metrics computed from real row values, every equality delete that holds a row equal
  to a row of the data file is still returned: metrics may only rule out deletes that
  cannot delete anything.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples
from icefloe.deletes.index import (
    DELETE_FILE_PATH_ID,
    DeleteFileIndex,
    is_deletion_vector,
    partition_key,
)
from icefloe.errors import ValidationError
from icefloe.spec.datafile import DataFile, DataFileContent
from icefloe.spec.partition import PartitionSpec, PartitionSpecBuilder
from icefloe.spec.schema import Schema
from icefloe.spec.types import DoubleType, IntegerType, NestedField, StringType
from icefloe.spec.values import to_bytes

SCHEMA = Schema(
    NestedField(1, "id", IntegerType()),
    NestedField(2, "name", StringType()),
    NestedField(3, "x", DoubleType()),
)
PARTITIONED = PartitionSpecBuilder(SCHEMA, spec_id=0).add_field("id", "bucket[2]").build()
UNPARTITIONED = PartitionSpec(1, ())
OTHER = PartitionSpecBuilder(SCHEMA, spec_id=2).add_field("name", "identity").build()
SPECS = {s.spec_id: s for s in (PARTITIONED, UNPARTITIONED, OTHER)}


def data(path: str, partition: tuple[Any, ...] = (0,), spec_id: int = 0, **kw: Any) -> DataFile:
    return DataFile(path, "parquet", partition, 10, 100, spec_id=spec_id, **kw)


def pos(path: str, partition: tuple[Any, ...] = (0,), spec_id: int = 0, **kw: Any) -> DataFile:
    return DataFile(
        path,
        "parquet",
        partition,
        1,
        10,
        content=DataFileContent.POSITION_DELETES,
        spec_id=spec_id,
        **kw,
    )


def eq(
    path: str,
    partition: tuple[Any, ...] = (0,),
    spec_id: int = 0,
    ids: tuple[int, ...] = (1,),
    **kw: Any,
) -> DataFile:
    return DataFile(
        path,
        "parquet",
        partition,
        1,
        10,
        content=DataFileContent.EQUALITY_DELETES,
        spec_id=spec_id,
        equality_ids=list(ids),
        **kw,
    )


def dv(path: str, target: str, partition: tuple[Any, ...] = (0,)) -> DataFile:
    return DataFile(
        path,
        "puffin",
        partition,
        1,
        50,
        content=DataFileContent.POSITION_DELETES,
        referenced_data_file=target,
        content_offset=4,
        content_size_in_bytes=40,
    )


def paths(files: list[DataFile]) -> set[str]:
    return {f.file_path for f in files}


def test_position_deletes_apply_to_older_and_same_commit_data_in_the_same_partition() -> None:
    index = DeleteFileIndex(SPECS, SCHEMA).add_all(
        [
            (pos("p-seq3"), 3),
            (pos("p-seq5"), 5),
            (pos("p-other-partition", (1,)), 9),
            (pos("p-other-spec", ("a",), spec_id=2), 9),
            (pos("p-unpartitioned", (), spec_id=1), 9),  # position deletes are never global
        ]
    )
    assert paths(index.for_data_file(data("d"), 3)) == {"p-seq3", "p-seq5"}
    assert paths(index.for_data_file(data("d"), 4)) == {"p-seq5"}
    assert paths(index.for_data_file(data("d"), 6)) == set()
    assert paths(index.for_data_file(data("d", (1,)), 1)) == {"p-other-partition"}
    assert paths(index.for_data_file(data("d", (), spec_id=1), 1)) == {"p-unpartitioned"}
    assert len(index) == 5


def test_equality_deletes_apply_to_strictly_older_data_and_globally_when_unpartitioned() -> None:
    index = DeleteFileIndex(SPECS, SCHEMA).add_all(
        [
            (eq("e-seq3"), 3),
            (eq("e-global", (), spec_id=1), 4),
            (eq("e-other", (1,)), 9),
        ]
    )
    assert paths(index.for_data_file(data("d"), 2)) == {"e-seq3", "e-global"}
    assert paths(index.for_data_file(data("d"), 3)) == {"e-global"}  # same commit: not applied
    assert paths(index.for_data_file(data("d"), 4)) == set()
    other_spec = data("d", ("a",), spec_id=2)
    assert paths(index.for_data_file(other_spec, 0)) == {"e-global"}


def test_referenced_data_file_and_file_path_bounds_narrow_position_deletes() -> None:
    bounds = {DELETE_FILE_PATH_ID: b"s3://b/d-2"}
    index = DeleteFileIndex(SPECS, SCHEMA).add_all(
        [
            (pos("for-d1", referenced_data_file="s3://b/d-1"), 5),
            (pos("for-d1-elsewhere", (1,), referenced_data_file="s3://b/d-1"), 5),
            (pos("range-d2", lower_bounds=bounds, upper_bounds=bounds), 5),
            (
                pos(
                    "range-d1-d3",
                    lower_bounds={DELETE_FILE_PATH_ID: b"s3://b/d-1"},
                    upper_bounds={DELETE_FILE_PATH_ID: b"s3://b/d-3"},
                ),
                5,
            ),
        ]
    )
    assert paths(index.for_data_file(data("s3://b/d-1"), 1)) == {"for-d1", "range-d1-d3"}
    assert paths(index.for_data_file(data("s3://b/d-2"), 1)) == {"range-d2", "range-d1-d3"}
    assert paths(index.for_data_file(data("s3://b/d-4"), 1)) == set()


def test_a_deletion_vector_replaces_position_delete_files() -> None:
    index = DeleteFileIndex(SPECS, SCHEMA).add_all(
        [
            (pos("p"), 5),
            (dv("dv-1", "s3://b/d-1"), 5),
            (dv("dv-old", "s3://b/d-2"), 2),
            (eq("e"), 6),
        ]
    )
    assert is_deletion_vector(dv("x", "y")) and not is_deletion_vector(pos("x"))
    assert paths(index.for_data_file(data("s3://b/d-1"), 3)) == {"dv-1", "e"}
    # The DV of d-2 is older than the data: it does not apply, so the position file does.
    assert paths(index.for_data_file(data("s3://b/d-2"), 3)) == {"p", "e"}
    assert paths(index.for_data_file(data("s3://b/d-1", (1,)), 3)) == set()


def test_float_partitions_compare_by_bits() -> None:
    assert partition_key((0.0,)) != partition_key((-0.0,))
    assert partition_key((math.nan,)) == partition_key((float("nan"),))
    assert partition_key((1, "a")) == (1, "a")
    spec = PartitionSpecBuilder(SCHEMA, spec_id=3).add_field("x", "identity").build()
    index = DeleteFileIndex({3: spec}, SCHEMA).add_all(
        [(pos("neg", (-0.0,), spec_id=3), 5), (pos("nan", (math.nan,), spec_id=3), 5)]
    )
    assert paths(index.for_data_file(data("d", (0.0,), spec_id=3), 1)) == set()
    assert paths(index.for_data_file(data("d", (-0.0,), spec_id=3), 1)) == {"neg"}
    assert paths(index.for_data_file(data("d", (float("nan"),), spec_id=3), 1)) == {"nan"}


def test_invalid_delete_files_are_refused() -> None:
    index = DeleteFileIndex(SPECS, SCHEMA)
    with pytest.raises(ValidationError, match="not a delete file"):
        index.add(data("d"), 1)
    with pytest.raises(ValidationError, match="partition spec 7"):
        index.add(pos("p", spec_id=7), 1)
    with pytest.raises(ValidationError, match="no equality_ids"):
        index.add(eq("e", ids=()), 1)
    bad_dv = dv("x", "y").copy(referenced_data_file=None)
    with pytest.raises(ValidationError, match="no referenced_data_file"):
        index.add(bad_dv, 1)
    assert index.for_data_file(data("d"), 0) == []


def _int_metrics(values: list[int | None]) -> dict[str, Any]:
    present = [v for v in values if v is not None]
    out: dict[str, Any] = {
        "value_counts": {1: len(values)},
        "null_value_counts": {1: len(values) - len(present)},
    }
    if present:
        out["lower_bounds"] = {1: to_bytes(IntegerType(), min(present))}
        out["upper_bounds"] = {1: to_bytes(IntegerType(), max(present))}
    return out


def test_equality_delete_metrics_rule_out_only_files_they_cannot_touch() -> None:
    index = DeleteFileIndex(SPECS, SCHEMA)
    index.add(eq("low", **_int_metrics([1, 2])), 9)
    index.add(eq("nulls", **_int_metrics([None])), 9)
    index.add(eq("mixed", **_int_metrics([None, 50])), 9)
    index.add(eq("unknown"), 9)
    found = paths(index.for_data_file(data("d", **_int_metrics([10, 20])), 1))
    assert found == {"unknown"}
    found = paths(index.for_data_file(data("d", **_int_metrics([None, 20])), 1))
    assert found == {"nulls", "mixed", "unknown"}
    found = paths(index.for_data_file(data("d", **_int_metrics([2, 5])), 1))
    assert found == {"low", "unknown"}
    found = paths(index.for_data_file(data("d", **_int_metrics([None])), 1))
    assert found == {"nulls", "mixed", "unknown"}


def test_nan_rows_may_meet_nan_deletes_whatever_the_bounds() -> None:
    def metrics(lo: float, hi: float, nans: int) -> dict[str, Any]:
        return {
            "value_counts": {3: 4},
            "null_value_counts": {3: 0},
            "nan_value_counts": {3: nans},
            "lower_bounds": {3: to_bytes(DoubleType(), lo)},
            "upper_bounds": {3: to_bytes(DoubleType(), hi)},
        }

    index = DeleteFileIndex(SPECS, SCHEMA)
    index.add(eq("nan", ids=(3,), **metrics(100.0, 200.0, 1)), 9)
    assert paths(index.for_data_file(data("d", **metrics(1.0, 2.0, 1)), 1)) == {"nan"}
    assert paths(index.for_data_file(data("d", **metrics(1.0, 2.0, 0)), 1)) == set()


# ---------------------------------------------------------------------------------------------
# Laws on random files
# ---------------------------------------------------------------------------------------------

PARTITIONS = st.sampled_from([(0,), (1,)])


@st.composite
def scoped_files(draw: st.DrawFn) -> tuple[list[tuple[DataFile, int]], list[tuple[DataFile, int]]]:
    data_files = []
    for i in range(draw(st.integers(1, 5))):
        spec_id = draw(st.sampled_from([0, 1]))
        partition = draw(PARTITIONS) if spec_id == 0 else ()
        data_files.append((data(f"s3://b/d-{i}", partition, spec_id), draw(st.integers(0, 5))))
    deletes = []
    with_dv: set[str] = set()  # the spec allows one DV per data file in a snapshot
    for i in range(draw(st.integers(0, 8))):
        kind = draw(st.sampled_from(["pos", "eq", "dv", "pos-ref"]))
        spec_id = draw(st.sampled_from([0, 1]))
        partition = draw(PARTITIONS) if spec_id == 0 else ()
        seq = draw(st.integers(0, 5))
        target = draw(st.sampled_from([d.file_path for d, _ in data_files]))
        if kind == "dv" and target in with_dv:
            kind = "pos-ref"
        if kind == "dv":
            with_dv.add(target)
        if kind == "pos":
            f = pos(f"pos-{i}", partition, spec_id)
        elif kind == "pos-ref":
            f = pos(f"ref-{i}", partition, spec_id, referenced_data_file=target)
        elif kind == "dv":
            f = dv(f"dv-{i}", target, partition).copy(spec_id=spec_id)
        else:
            f = eq(f"eq-{i}", partition, spec_id)
        deletes.append((f, seq))
    return data_files, deletes


def spec_rules(data_file: DataFile, seq: int, deletes: list[tuple[DataFile, int]]) -> set[str]:
    """The spec's scope rules, written out directly."""

    def same_partition(d: DataFile) -> bool:
        return d.spec_id == data_file.spec_id and d.partition == data_file.partition

    vectors = {
        d.file_path
        for d, s in deletes
        if is_deletion_vector(d)
        and d.referenced_data_file == data_file.file_path
        and seq <= s
        and same_partition(d)
    }
    out = set(vectors)
    for d, s in deletes:
        if d.content == DataFileContent.POSITION_DELETES and not is_deletion_vector(d):
            if vectors or seq > s or not same_partition(d):
                continue
            if d.referenced_data_file is not None and d.referenced_data_file != data_file.file_path:
                continue
            out.add(d.file_path)
        elif (
            d.content == DataFileContent.EQUALITY_DELETES
            and seq < s
            and (same_partition(d) or SPECS[d.spec_id].is_unpartitioned)
        ):
            out.add(d.file_path)
    return out


@settings(max_examples=examples(300), deadline=None)
@given(scoped_files())
def test_without_metrics_the_index_follows_the_spec_rules_exactly(
    files: tuple[list[tuple[DataFile, int]], list[tuple[DataFile, int]]],
) -> None:
    data_files, deletes = files
    index = DeleteFileIndex(SPECS, SCHEMA).add_all(deletes)
    for d, seq in data_files:
        got = index.for_data_file(d, seq)
        assert len(got) == len(paths(got))
        assert paths(got) == spec_rules(d, seq, deletes)


def test_two_deletion_vectors_for_one_data_file_are_refused() -> None:
    index = DeleteFileIndex(SPECS, SCHEMA)
    index.add(dv("dv-a", "s3://b/d", (0,)), 1)
    with pytest.raises(ValidationError, match="two deletion vectors for data file s3://b/d"):
        index.add(dv("dv-b", "s3://b/d", (0,)), 2)


values = st.none() | st.integers(-3, 3)


@settings(max_examples=examples(300), deadline=None)
@given(
    st.lists(values, min_size=1, max_size=5),
    st.lists(st.lists(values, min_size=1, max_size=4), min_size=1, max_size=4),
)
def test_metrics_never_rule_out_a_delete_that_matches_a_row(
    data_values: list[int | None], delete_values: list[list[int | None]]
) -> None:
    index = DeleteFileIndex(SPECS, SCHEMA)
    for i, deleted in enumerate(delete_values):
        index.add(eq(f"e-{i}", **_int_metrics(deleted)), 2)
    got = paths(index.for_data_file(data("d", **_int_metrics(data_values)), 1))
    for i, deleted in enumerate(delete_values):
        # Equality: a null delete value matches a null row value.
        if set(deleted) & set(data_values):
            assert f"e-{i}" in got
