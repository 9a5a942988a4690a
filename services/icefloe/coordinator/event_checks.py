"""Checks of a files-written event's files against the table: paths and column metrics.

Why a module: these are the rules an event's files must follow before they can be committed
(inside the table's location, no ``..``; metrics of the schema's columns, of the right
types, with consistent counts); a violation dead-letters the event with a reason a writer
can act on. The committer (:mod:`icefloe.coordinator.committer`) applies them; they read
only the table's metadata.
"""

from __future__ import annotations

from icefloe.errors import EventRejectedError, ValidationError
from icefloe.io.locations import within_any
from icefloe.spec.datafile import DataFile
from icefloe.spec.metadata import TableMetadata
from icefloe.spec.schema import Schema
from icefloe.spec.types import DoubleType, FloatType, PrimitiveType
from icefloe.spec.values import from_bytes
from icefloe.table.catalog import data_dir
from icefloe.table.commit_index import SUMMARY_COMMIT_IDS as SUMMARY_COMMIT_IDS
from icefloe.table.commit_index import summary_commit_ids as summary_commit_ids


def check_path(metadata: TableMetadata, path: str, table: str) -> None:
    """Refuse paths with ``..`` segments or outside the table's location (or data path)."""
    segments = path.split("/")
    if ".." in segments or "." in segments[3:]:
        raise EventRejectedError(
            "bad-path", f"file {path!r} of table {table} has a '.' or '..' path segment"
        )
    roots = {metadata.location, data_dir(metadata)}
    if not within_any(path, roots):
        raise EventRejectedError(
            "bad-path",
            f"file {path!r} is outside the location of table {table} "
            f"({metadata.location!r}); writers must write under it",
        )


def _comparable(t: PrimitiveType) -> bool:
    return not isinstance(t, FloatType | DoubleType)


def check_metrics(data_file: DataFile, schema: Schema, table: str) -> None:
    """Counts and bounds that contradict each other or the schema (beyond
    :meth:`DataFile.validate`, which the decoder already ran)."""
    where = f"table {table}: file {data_file.file_path!r}"

    def bad(what: str) -> EventRejectedError:
        return EventRejectedError("invalid-counts", f"{where}: {what}")

    if data_file.record_count > 0 and data_file.file_size_in_bytes == 0:
        raise bad(f"'record-count' is {data_file.record_count} but 'file-size-in-bytes' is 0")
    for name, counts in (
        ("column-sizes", data_file.column_sizes),
        ("value-counts", data_file.value_counts),
        ("null-value-counts", data_file.null_value_counts),
        ("nan-value-counts", data_file.nan_value_counts),
        ("lower-bounds", data_file.lower_bounds),
        ("upper-bounds", data_file.upper_bounds),
    ):
        for fid in counts or {}:
            if schema.find_field(fid) is None:
                raise bad(f"{name!r} names column id {fid}, not in schema {schema.schema_id}")
    values = data_file.value_counts or {}
    nulls = data_file.null_value_counts or {}
    nans = data_file.nan_value_counts or {}
    for fid, n in (*values.items(), *nulls.items()):
        if n > data_file.record_count and not schema.is_in_list_or_map(fid):
            raise bad(
                f"column {fid} counts {n} value(s) in a file of {data_file.record_count} record(s)"
            )
    for fid, n in nans.items():
        total = values.get(fid)
        if total is not None and n + nulls.get(fid, 0) > total:
            raise bad(
                f"column {fid}: {n} NaN and {nulls.get(fid, 0)} null value(s) exceed its "
                f"{total} value(s)"
            )
    lowers = data_file.lower_bounds or {}
    uppers = data_file.upper_bounds or {}
    for fid in lowers.keys() & uppers.keys():
        t = schema.find_type(fid)
        if not isinstance(t, PrimitiveType) or not _comparable(t):
            continue
        try:
            low, high = from_bytes(t, lowers[fid]), from_bytes(t, uppers[fid])
        except (ValidationError, ValueError):
            raise bad(f"bounds of column {fid} cannot be read as {t}") from None
        if low > high:
            raise bad(f"column {fid}: lower bound {low!r} is above upper bound {high!r}")
    for offset in data_file.split_offsets or ():
        if offset < 0 or offset >= max(data_file.file_size_in_bytes, 1):
            raise bad(
                f"split offset {offset} is outside the file of "
                f"{data_file.file_size_in_bytes} byte(s)"
            )
    if data_file.equality_ids:
        for fid in data_file.equality_ids:
            if schema.find_field(fid) is None:
                raise bad(f"equality id {fid} is not a column of schema {schema.schema_id}")
