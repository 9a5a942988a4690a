"""Row lineage (v3): ``_row_id`` and ``_last_updated_sequence_number`` (spec: "Row Lineage").

Both are metadata columns with reserved field ids. Writers leave them null (or omit them)
for new rows, and readers fill them by inheritance:

* a null ``_row_id`` is the data file's ``first_row_id`` plus the row's position in the
  file (``_pos``); when the file has no ``first_row_id`` (snapshots from before an upgrade
  to v3) it stays null;
* a null ``_last_updated_sequence_number`` is the data sequence number of the file's
  manifest entry.

A rewrite that moves rows (compaction) must copy both, as read with inheritance, into the
new files, so rows keep their ids; an update must copy ``_row_id`` and leave the sequence
number null. :func:`with_row_lineage` gives a writer those columns for rows it read, and
:func:`lineage_arrow_fields` the Parquet fields (with their field ids) to write them as.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from icefloe.errors import ValidationError
from icefloe.spec.datafile import DataFile
from icefloe.spec.schema import Schema
from icefloe.spec.types import LongType, NestedField

ROW_ID_FIELD_ID = 2147483540
LAST_UPDATED_SEQUENCE_NUMBER_FIELD_ID = 2147483539
ROW_ID = "_row_id"
LAST_UPDATED_SEQUENCE_NUMBER = "_last_updated_sequence_number"
ROW_ID_FIELD = NestedField(ROW_ID_FIELD_ID, ROW_ID, LongType(), required=False)
LAST_UPDATED_SEQUENCE_NUMBER_FIELD = NestedField(
    LAST_UPDATED_SEQUENCE_NUMBER_FIELD_ID, LAST_UPDATED_SEQUENCE_NUMBER, LongType(), required=False
)
LINEAGE_FIELDS = (ROW_ID_FIELD, LAST_UPDATED_SEQUENCE_NUMBER_FIELD)
LINEAGE_FIELD_IDS = frozenset(f.field_id for f in LINEAGE_FIELDS)
LINEAGE_NAMES = (ROW_ID, LAST_UPDATED_SEQUENCE_NUMBER)


def with_lineage_fields(schema: Schema) -> Schema:
    """``schema`` plus the two lineage columns (a read schema; tables never hold them)."""
    clash = [f.name for f in schema.fields if f.name in LINEAGE_NAMES]
    if clash:
        raise ValidationError(
            f"schema {schema.schema_id} has a column named {clash[0]!r}, the name of a "
            "row-lineage metadata column"
        )
    present = {f.field_id for f in schema.fields}
    extra = [f for f in LINEAGE_FIELDS if f.field_id not in present]
    return Schema(
        *schema.fields,
        *extra,
        schema_id=schema.schema_id,
        identifier_field_ids=schema.identifier_field_ids,
    )


def lineage_arrow_fields() -> list[pa.Field]:
    """Parquet/Arrow fields for the lineage columns, with their reserved field ids."""
    return [
        pa.field(f.name, pa.int64(), nullable=True, metadata={b"PARQUET:field_id": str(f.field_id)})
        for f in LINEAGE_FIELDS
    ]


def inherit_row_ids(
    row_ids: pa.Array | pa.ChunkedArray | None,
    positions: np.ndarray[Any, np.dtype[np.int64]],
    first_row_id: int | None,
) -> pa.Array:
    """``_row_id`` values: the file's value where non-null, else ``first_row_id + pos``."""
    n = len(positions)
    inherited = (
        pa.nulls(n, pa.int64())
        if first_row_id is None
        else pa.array(positions.astype(np.int64) + np.int64(first_row_id), pa.int64())
    )
    if row_ids is None:
        return inherited
    values = _combined(row_ids)
    if len(values) != n:
        raise ValidationError(f"{n} positions for {len(values)} row ids")
    return pc.coalesce(values, inherited)


def inherit_sequence_numbers(
    values: pa.Array | pa.ChunkedArray | None, n: int, data_sequence_number: int | None
) -> pa.Array:
    """``_last_updated_sequence_number``: non-null values kept, nulls the file's sequence."""
    fill = pa.scalar(data_sequence_number, pa.int64())
    if values is None:
        return (
            pa.array(np.full(n, data_sequence_number, dtype=np.int64), pa.int64())
            if (data_sequence_number is not None)
            else pa.nulls(n, pa.int64())
        )
    return pc.coalesce(_combined(values), fill)


def with_row_lineage(
    table: pa.Table,
    *,
    first_row_id: int | None,
    data_sequence_number: int | None,
    positions: np.ndarray[Any, np.dtype[np.int64]] | None = None,
) -> pa.Table:
    """``table`` (rows read from one data file) with both lineage columns inherited.

    ``positions`` are the rows' positions in the file (default ``0..n-1``: pass them when
    rows were filtered before this call, since ``_row_id`` derives from the position).
    Existing lineage columns are replaced by their inherited form; missing ones are added.
    """
    n = table.num_rows
    pos = np.arange(n, dtype=np.int64) if positions is None else np.asarray(positions, np.int64)
    if len(pos) != n:
        raise ValidationError(f"{len(pos)} positions for {n} rows")
    names = table.column_names
    row_ids = inherit_row_ids(table.column(ROW_ID) if ROW_ID in names else None, pos, first_row_id)
    seqs = inherit_sequence_numbers(
        table.column(LAST_UPDATED_SEQUENCE_NUMBER)
        if LAST_UPDATED_SEQUENCE_NUMBER in names
        else None,
        n,
        data_sequence_number,
    )
    for name, column in ((ROW_ID, row_ids), (LAST_UPDATED_SEQUENCE_NUMBER, seqs)):
        field = pa.field(name, pa.int64())
        if name in table.column_names:
            table = table.set_column(table.column_names.index(name), field, column)
        else:
            table = table.append_column(field, column)
    return table


def _combined(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    arr = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    return arr.cast(pa.int64())


def without_lineage_metrics(data_file: DataFile) -> DataFile:
    """``data_file`` without column metrics for the lineage columns.

    A rewrite writes the lineage columns into its files, so the writer measures them too;
    but content files are described against the table schema, which has no such columns
    (a bound must name a table column to be decoded), and metrics are optional: leaving
    them out only means a scan cannot prune by row id.
    """
    changes: dict[str, Any] = {}
    for name in (
        "column_sizes",
        "value_counts",
        "null_value_counts",
        "nan_value_counts",
        "lower_bounds",
        "upper_bounds",
    ):
        metrics = getattr(data_file, name)
        if metrics is not None and LINEAGE_FIELD_IDS & metrics.keys():
            changes[name] = {k: v for k, v in metrics.items() if k not in LINEAGE_FIELD_IDS}
    return data_file.copy(**changes) if changes else data_file


__all__ = [
    "LAST_UPDATED_SEQUENCE_NUMBER",
    "LAST_UPDATED_SEQUENCE_NUMBER_FIELD_ID",
    "LINEAGE_FIELDS",
    "LINEAGE_FIELD_IDS",
    "ROW_ID",
    "ROW_ID_FIELD_ID",
    "inherit_row_ids",
    "inherit_sequence_numbers",
    "lineage_arrow_fields",
    "with_lineage_fields",
    "with_row_lineage",
    "without_lineage_metrics",
]
