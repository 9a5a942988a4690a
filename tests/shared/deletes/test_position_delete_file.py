"""Position delete files (v2) as the core writes them: the spec's schema and order, full
metrics, a referenced data file when there is one, and readable by the core's reader."""

from __future__ import annotations

import io

import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples
from icefloe.arrow.schema import field_id_of
from icefloe.deletes.deletion_vector import positions_in_delete_file
from icefloe.deletes.position_delete_file import FILE_PATH_ID, POS_ID, build_position_delete_file
from icefloe.errors import ValidationError
from icefloe.spec.datafile import DataFileContent
from icefloe.spec.types import LongType, StringType
from icefloe.spec.values import from_bytes

PATHS = st.sampled_from(["s3://b/t/data/a.parquet", "s3://b/t/data/b.parquet", "file:///c.pq"])


@given(st.dictionaries(PATHS, st.lists(st.integers(0, 10_000), min_size=1), min_size=1))
@settings(max_examples=examples(60))
def test_rows_are_sorted_distinct_and_described_exactly(positions: dict[str, list[int]]) -> None:
    data, f = build_position_delete_file(
        "s3://b/t/data/x-deletes.parquet", positions, spec_id=3, partition=("p",)
    )
    table = pq.read_table(io.BytesIO(data))
    assert [field_id_of(c) for c in table.schema] == [FILE_PATH_ID, POS_ID]
    assert [c.name for c in table.schema] == ["file_path", "pos"]
    expected = sorted({(p, pos) for p, ps in positions.items() for pos in ps})
    assert list(zip(table.column(0).to_pylist(), table.column(1).to_pylist())) == expected
    assert f.content == DataFileContent.POSITION_DELETES
    assert (f.spec_id, f.partition, f.record_count) == (3, ("p",), len(expected))
    assert f.file_size_in_bytes == len(data)
    assert f.referenced_data_file == (next(iter(positions)) if len(positions) == 1 else None)
    assert f.lower_bounds is not None and f.upper_bounds is not None
    # full metrics: the exact first and last path, never truncated
    assert from_bytes(StringType(), f.lower_bounds[FILE_PATH_ID]) == expected[0][0]
    assert from_bytes(StringType(), f.upper_bounds[FILE_PATH_ID]) == expected[-1][0]
    assert from_bytes(LongType(), f.lower_bounds[POS_ID]) == min(p for _, p in expected)
    for path, ps in positions.items():
        read = positions_in_delete_file(data, "x", path).to_numpy().tolist()
        assert read == sorted(set(ps))


def test_an_empty_or_negative_delete_is_refused() -> None:
    with pytest.raises(ValidationError, match="at least one position"):
        build_position_delete_file("x.parquet", {"a": []}, spec_id=0, partition=())
    with pytest.raises(ValidationError, match="negative position"):
        build_position_delete_file("x.parquet", {"a": [-1]}, spec_id=0, partition=())
