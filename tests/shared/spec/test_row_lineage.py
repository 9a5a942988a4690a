"""Row lineage inheritance: nulls take first_row_id + position and the file's sequence number."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples
from icefloe.deletes.deletion_vector import DeletionVector
from icefloe.errors import ValidationError
from icefloe.parquet.files import read_data_file, write_data_file
from icefloe.spec.datafile import DataFile
from icefloe.spec.row_lineage import (
    LAST_UPDATED_SEQUENCE_NUMBER,
    ROW_ID,
    lineage_arrow_fields,
    with_lineage_fields,
    with_row_lineage,
    without_lineage_metrics,
)
from icefloe.spec.schema import Schema
from icefloe.spec.types import LongType, NestedField

column = st.lists(st.none() | st.integers(0, 1 << 40), max_size=40)


@settings(max_examples=examples(100), deadline=None)
@given(column, st.none() | st.integers(0, 1 << 40), st.integers(1, 1000), st.booleans())
def test_nulls_inherit_and_values_are_kept(
    row_ids: list[int | None], first_row_id: int | None, seq: int, present: bool
) -> None:
    n = len(row_ids)
    seqs = [None if v is None else v % 7 for v in row_ids]
    data = pa.table({"x": list(range(n))})
    if present:
        data = data.append_column(ROW_ID, pa.array(row_ids, pa.int64()))
        data = data.append_column(LAST_UPDATED_SEQUENCE_NUMBER, pa.array(seqs, pa.int64()))
    out = with_row_lineage(data, first_row_id=first_row_id, data_sequence_number=seq)
    got_ids = out.column(ROW_ID).to_pylist()
    got_seqs = out.column(LAST_UPDATED_SEQUENCE_NUMBER).to_pylist()
    for pos in range(n):
        stored = row_ids[pos] if present else None
        inherited = None if first_row_id is None else first_row_id + pos
        assert got_ids[pos] == (stored if stored is not None else inherited)
        stored_seq = seqs[pos] if present else None
        assert got_seqs[pos] == (stored_seq if stored_seq is not None else seq)
    assert out.column_names.count(ROW_ID) == 1


def test_positions_of_filtered_rows_drive_row_ids() -> None:
    data = pa.table({"x": [10, 30]})
    out = with_row_lineage(
        data, first_row_id=100, data_sequence_number=4, positions=np.array([0, 2])
    )
    assert out.column(ROW_ID).to_pylist() == [100, 102]
    with pytest.raises(ValidationError, match="positions"):
        with_row_lineage(data, first_row_id=1, data_sequence_number=1, positions=np.array([0]))


def test_read_schema_gains_the_reserved_columns_and_refuses_name_clashes() -> None:
    schema = Schema(NestedField(1, "id", LongType(), required=True))
    read = with_lineage_fields(schema)
    assert [f.field_id for f in read.fields] == [1, 2147483540, 2147483539]
    assert [f.metadata[b"PARQUET:field_id"] for f in lineage_arrow_fields()] == [
        b"2147483540",
        b"2147483539",
    ]
    clash = Schema(NestedField(1, "_row_id", LongType()))
    with pytest.raises(ValidationError, match="row-lineage"):
        with_lineage_fields(clash)


def test_rows_moved_by_a_rewrite_keep_their_lineage(tmp_path: Path) -> None:
    """What compaction does: read with inheritance, drop deleted rows, write the columns."""
    schema = Schema(NestedField(1, "id", LongType(), required=True))
    lineage_schema = with_lineage_fields(schema)
    old = with_row_lineage(
        pa.table({"id": pa.array([5, 6, 7, 8], pa.int64())}),
        first_row_id=100,
        data_sequence_number=3,
    )
    deleted = DeletionVector.from_positions([1])
    survivors = old.filter(pa.array(~deleted.deleted_mask(old.num_rows)))
    path = str(tmp_path / "compacted.parquet")
    f = write_data_file(survivors, path, schema=lineage_schema, file_path=path)
    assert f.record_count == 3
    back = read_data_file(path, lineage_schema)
    # The new file gets its own first_row_id (and a later sequence number) on commit; the
    # values written in it win over inheritance.
    out = with_row_lineage(back, first_row_id=900, data_sequence_number=9)
    assert out.select(["id", ROW_ID, LAST_UPDATED_SEQUENCE_NUMBER]).to_pylist() == [
        {"id": 5, ROW_ID: 100, LAST_UPDATED_SEQUENCE_NUMBER: 3},
        {"id": 7, ROW_ID: 102, LAST_UPDATED_SEQUENCE_NUMBER: 3},
        {"id": 8, ROW_ID: 103, LAST_UPDATED_SEQUENCE_NUMBER: 3},
    ]


def test_lineage_metrics_are_dropped_and_the_others_kept() -> None:
    ids = (2147483540, 2147483539)
    f = DataFile(
        "file:///t/data/a.parquet",
        "parquet",
        (),
        3,
        100,
        column_sizes={1: 10, ids[0]: 20, ids[1]: 30},
        value_counts={1: 3, ids[0]: 3},
        null_value_counts={1: 0},
        lower_bounds={1: b"a", ids[1]: b"\x01" * 8},
        upper_bounds=None,
    )
    out = without_lineage_metrics(f)
    assert out.column_sizes == {1: 10} and out.value_counts == {1: 3}
    assert out.null_value_counts == {1: 0} and out.lower_bounds == {1: b"a"}
    assert out.upper_bounds is None
    assert f.column_sizes is not None and ids[0] in f.column_sizes  # the input is not changed
    plain = DataFile("file:///t/data/b.parquet", "parquet", (), 1, 10, column_sizes={1: 1})
    assert without_lineage_metrics(plain) is plain
