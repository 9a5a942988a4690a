"""Position delete files (v2): deleted rows named by data file path and row position.

Spec: "Position Delete Files". Each row is ``file_path`` (string, field id 2147483546) and
``pos`` (long, 2147483545); rows are sorted by ``file_path`` then ``pos`` so readers can
merge them with a data file's rows in one pass. A position delete file applies to data
files of its own partition whose data sequence number is at most its own; when it names a
single data file, ``referenced_data_file`` says so and readers skip it for every other file.

v3 tables take deletion vectors instead (:mod:`icefloe.deletes.deletion_vector`); this module is what
:class:`~icefloe.table.snapshot_producer.SnapshotProducer` writes for ``delete_positions`` on v2.
The metrics are full (not truncated) for both columns, as Java's ``MetricsConfig.
forPositionDelete``: a planner can then tell from the ``file_path`` bounds which data files a
file may name.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from icefloe.errors import ValidationError
from icefloe.parquet.files import write_data_file
from icefloe.parquet.options import METRICS_COLUMN_PREFIX, METRICS_DEFAULT
from icefloe.spec.datafile import DataFile, DataFileContent
from icefloe.spec.schema import Schema
from icefloe.spec.types import LongType, NestedField, StringType

FILE_PATH_ID = 2147483546
POS_ID = 2147483545

POSITION_DELETE_SCHEMA = Schema(
    NestedField(FILE_PATH_ID, "file_path", StringType(), required=True),
    NestedField(POS_ID, "pos", LongType(), required=True),
)


def position_delete_rows(positions: Mapping[str, Any]) -> pa.Table:
    """The rows of a position delete file for ``positions`` (data file path → positions),
    sorted by path then position, duplicates dropped."""
    paths: list[pa.Array] = []
    poss: list[np.ndarray[Any, np.dtype[np.int64]]] = []
    for path in sorted(positions):
        pos = np.unique(np.asarray(positions[path], dtype=np.int64))  # sorted, distinct
        if len(pos) == 0:
            continue
        if pos[0] < 0:
            raise ValidationError(f"position delete for {path}: negative position {pos[0]}")
        paths.append(pa.array(np.full(len(pos), path, dtype=object), pa.string()))
        poss.append(pos)
    if not paths:
        return pa.table({"file_path": pa.array([], pa.string()), "pos": pa.array([], pa.int64())})
    return pa.table(
        {
            "file_path": pa.concat_arrays(paths),
            "pos": pa.array(np.concatenate(poss), pa.int64()),
        }
    )


def build_position_delete_file(
    location: str,
    positions: Mapping[str, Any],
    *,
    spec_id: int,
    partition: tuple[Any, ...],
    properties: Mapping[str, str] | None = None,
) -> tuple[bytes, DataFile]:
    """The bytes and the DataFile of one position delete file at ``location``.

    ``positions`` maps each data file path (all of partition ``partition`` of spec
    ``spec_id``) to the row positions it deletes. ``properties`` are the table's, for the
    Parquet write options (codec, row groups); metrics are always full.
    """
    rows = position_delete_rows(positions)
    if rows.num_rows == 0:
        raise ValidationError(f"{location}: a position delete file needs at least one position")
    props = {
        k: v
        for k, v in (properties or {}).items()
        if not k.startswith(METRICS_COLUMN_PREFIX) and k != METRICS_DEFAULT
    }
    props[METRICS_DEFAULT] = "full"
    buffer = io.BytesIO()
    written = write_data_file(
        rows, buffer, schema=POSITION_DELETE_SCHEMA, properties=props, file_path=location
    )
    named = [p for p in positions if len(positions[p])]
    data_file = written.copy(
        content=DataFileContent.POSITION_DELETES,
        spec_id=spec_id,
        partition=partition,
        referenced_data_file=named[0] if len(named) == 1 else None,
        sort_order_id=None,
    )
    return buffer.getvalue(), data_file


__all__ = [
    "FILE_PATH_ID",
    "POSITION_DELETE_SCHEMA",
    "POS_ID",
    "build_position_delete_file",
    "position_delete_rows",
]
