"""Decoding a manifest's Avro straight into the planner's Arrow columns.

A cold scan plan is dominated by manifest decoding. fastavro builds a Python dict per entry
(and one per metric map entry); on a 50k-entry manifest that is seconds, slower than
PyIceberg's reader. :mod:`icefloe.avro.arrow` decodes the container file in native code
(DataFusion's Avro reader by default, DuckDB's as the alternative) into Arrow columns without
a Python object per value; this module turns that table into the columns
:class:`~icefloe.manifests.cache.CachedManifest` keeps, with Arrow kernels only (measured in
``make bench``: ``planner decode``).

It applies the same inheritance rules as :func:`icefloe.manifests.manifest.read_manifest` (snapshot
ids, sequence numbers, first row ids). Anything unexpected (a file a reader cannot read, a
column of another type, duplicate map keys) raises :class:`ArrowDecodeUnavailable` with the
reason, and the caller falls back to the fastavro path, which is the reference and names the
defect of a malformed file precisely. ``ICEFLOE_MANIFEST_DECODER`` selects ``datafusion``
(default), ``duckdb``, ``fastavro``, or ``verify`` (the default reader and fastavro,
compared: for tests).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import uuid
from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from icefloe.arrow.values import arrow_storage_type
from icefloe.avro.arrow import DEFAULT_READER, READERS, ArrowDecodeUnavailable, read_avro_table
from icefloe.avro.codec import AvroConversion, avro_to_iceberg, read_header
from icefloe.errors import InvalidFileError, ValidationError
from icefloe.manifests.manifest import ManifestEntryStatus
from icefloe.manifests.manifest_list import UNASSIGNED_SEQ, ManifestFile
from icefloe.spec.datafile import FileFormat
from icefloe.spec.partition import PartitionSpec
from icefloe.spec.types import MapType, StructType

log = logging.getLogger(__name__)

DECODER_ENV = "ICEFLOE_MANIFEST_DECODER"
DECODERS = (*READERS, "fastavro", "verify")

COUNT_MAP = pa.map_(pa.int32(), pa.int64())
BOUND_MAP = pa.map_(pa.int32(), pa.binary())

# field id → (column name in the cache, Arrow type when absent or to cast to)
_DATA_FILE_SCALARS: dict[int, tuple[str, Any]] = {
    103: ("record_count", pa.int64()),
    104: ("file_size_in_bytes", pa.int64()),
    131: ("key_metadata", pa.binary()),
    132: ("split_offsets", pa.list_(pa.int64())),
    135: ("equality_ids", pa.list_(pa.int32())),
    140: ("sort_order_id", pa.int32()),
    142: ("first_row_id", pa.int64()),
    143: ("referenced_data_file", pa.string()),
    144: ("content_offset", pa.int64()),
    145: ("content_size_in_bytes", pa.int64()),
}
_DATA_FILE_MAPS: dict[int, tuple[str, Any]] = {
    108: ("column_sizes", COUNT_MAP),
    109: ("value_counts", COUNT_MAP),
    110: ("null_value_counts", COUNT_MAP),
    137: ("nan_value_counts", COUNT_MAP),
    125: ("lower_bounds", BOUND_MAP),
    128: ("upper_bounds", BOUND_MAP),
}


def configured_decoder() -> str:
    """The decoder ``ICEFLOE_MANIFEST_DECODER`` names (``datafusion`` when unset)."""
    name = os.environ.get(DECODER_ENV, DEFAULT_READER).strip().lower() or DEFAULT_READER
    if name not in DECODERS:
        raise ValidationError(f"{DECODER_ENV} must be one of {list(DECODERS)}, got {name!r}")
    return name


# ---------------------------------------------------------------------------------------------
# Arrow table → cache columns
# ---------------------------------------------------------------------------------------------


def _child(struct: Any, name: str | None) -> Any | None:
    if name is None:
        return None
    try:
        return struct.field(name)
    except KeyError:
        return None


def _cast(array: Any, t: Any, what: str) -> Any:
    if array.type == t:
        return array
    try:
        return array.cast(t)
    except (pa.ArrowException, TypeError, ValueError) as e:
        raise ArrowDecodeUnavailable(f"{what} of type {array.type} does not fit {t}: {e}") from e


def _map(array: Any, t: Any, what: str) -> Any:
    """A ``map<int, V>`` column in the cache's exact map type (field names included).

    DuckDB reads Iceberg's int-keyed maps (Avro arrays of key-value records) as Arrow maps,
    DataFusion as lists of ``struct<key, value>``; both share the same offsets.
    """
    if array is None:
        return None
    at = array.type
    if pa.types.is_map(at):
        keys, items = array.keys, array.items
    elif (
        pa.types.is_list(at) and pa.types.is_struct(at.value_type) and at.value_type.num_fields == 2
    ):
        entries = array.values
        if entries.null_count:
            raise ArrowDecodeUnavailable(f"{what} has a null map entry")
        keys, items = entries.field(0), entries.field(1)
    else:
        raise ArrowDecodeUnavailable(f"{what} has type {at}, expected a map")
    if keys.null_count:
        raise ArrowDecodeUnavailable(f"{what} has a null map key")
    keys = _cast(keys, pa.int32(), what)
    items = _cast(items, t.item_type, what)
    offsets = array.offsets
    if array.offset:
        raise ArrowDecodeUnavailable(f"{what} is a sliced map array")
    mask = array.is_null() if array.null_count else None
    return pa.MapArray.from_arrays(offsets, keys, items, type=t, mask=mask)


def decode_columns(
    data: bytes,
    manifest: ManifestFile,
    spec: PartitionSpec,
    partition_type: StructType,
    *,
    reader: str = DEFAULT_READER,
) -> tuple[dict[str, Any], list[Any]]:
    """The manifest's entries as the cache's columns and partition columns (in the order of
    ``partition_type``, which follows the table's spec), with inherited values filled in,
    decoded by ``reader`` (one of :data:`~icefloe.avro.arrow.READERS`).

    Raises :class:`ArrowDecodeUnavailable` when the reader cannot produce exactly that.
    """
    location = manifest.manifest_path
    try:
        header = read_header(data, location)
        meta = header[0]
        conv = _conversion(meta["avro.schema"])
    except (InvalidFileError, KeyError, ValueError, ValidationError) as e:
        raise ArrowDecodeUnavailable(f"the Avro header of {location} is unusable: {e}") from e
    names: Mapping[int, str] = conv.avro_names
    entry_ids = {f.field_id for f in conv.struct.fields}
    if not {0, 2} <= entry_ids:
        raise ArrowDecodeUnavailable(f"{location} lacks manifest_entry status or data_file")
    df_field = next(f for f in conv.struct.fields if f.field_id == 2)
    df_type = df_field.field_type
    if not isinstance(df_type, StructType):
        raise ArrowDecodeUnavailable(f"{location}: data_file is not a record")
    df_ids = {f.field_id for f in df_type.fields}
    if not {100, 101, 102, 103, 104} <= df_ids:
        raise ArrowDecodeUnavailable(f"{location}: data_file lacks a required field")
    for f in df_type.fields:
        if f.field_id in _DATA_FILE_MAPS and not isinstance(f.field_type, MapType):
            raise ArrowDecodeUnavailable(f"{location}: data_file field {f.field_id} is no map")
    content_text = meta.get("content", "data")

    table = read_avro_table(data, location, reader, header=header)
    n = table.num_rows
    try:
        status = _cast(_whole(table.column(names[0])), pa.int8(), "status")
        df = _whole(table.column(names[2]))
    except (KeyError, pa.ArrowException) as e:
        raise ArrowDecodeUnavailable(f"{location}: unexpected columns from the reader: {e}") from e
    if df.null_count:
        raise ArrowDecodeUnavailable(f"{location}: a data_file record is null")
    if status.null_count or not _within(status, 0, 2):
        raise ArrowDecodeUnavailable(f"{location}: a status is not 0, 1 or 2")

    def df_col(fid: int) -> Any | None:
        return _child(df, names.get(fid)) if fid in df_ids else None

    columns: dict[str, Any] = {"status": status}
    path = df_col(100)
    fmt = df_col(101)
    if path is None or fmt is None or path.null_count or fmt.null_count:
        raise ArrowDecodeUnavailable(f"{location}: file_path or file_format is missing")
    columns["file_path"] = _cast(path, pa.string(), "file_path")
    columns["file_format"] = _file_formats(_cast(fmt, pa.string(), "file_format"))
    content = df_col(134)
    if content is None:
        content_arr = pa.repeat(pa.scalar(0, pa.int8()), n)
    else:
        if content.null_count:
            content = pc.fill_null(content, 0)
        content_arr = _cast(content, pa.int8(), "content")
        if not _within(content_arr, 0, 2):
            raise ArrowDecodeUnavailable(f"{location}: a data_file content is not 0, 1 or 2")
    columns["content"] = content_arr
    for fid, (name, t) in _DATA_FILE_SCALARS.items():
        array = df_col(fid)
        columns[name] = pa.nulls(n, t) if array is None else _cast(array, t, name)
    for fid, (name, t) in _DATA_FILE_MAPS.items():
        array = df_col(fid)
        columns[name] = pa.nulls(n, t) if array is None else _map(array, t, name)
    if columns["record_count"].null_count or columns["file_size_in_bytes"].null_count:
        raise ArrowDecodeUnavailable(f"{location}: record_count or file_size_in_bytes is null")

    # -- inheritance, as read_manifest does it ---------------------------------------------
    snap = _whole(table.column(names[1])) if 1 in entry_ids else pa.nulls(n, pa.int64())
    snap = _cast(snap, pa.int64(), "snapshot_id")
    if manifest.added_snapshot_id is not None and snap.null_count:
        snap = pc.fill_null(snap, manifest.added_snapshot_id)
    columns["snapshot_id"] = snap
    if 3 not in entry_ids and 4 not in entry_ids:
        zeros = pa.repeat(pa.scalar(0, pa.int64()), n)
        columns["data_sequence_number"] = zeros
        columns["file_sequence_number"] = zeros
    else:
        inherited = manifest.sequence_number
        added = None
        for fid, name in ((3, "data_sequence_number"), (4, "file_sequence_number")):
            seq = _whole(table.column(names[fid])) if fid in entry_ids else None
            seq = pa.nulls(n, pa.int64()) if seq is None else _cast(seq, pa.int64(), name)
            if inherited != UNASSIGNED_SEQ and seq.null_count:
                # ADDED entries inherit the manifest's sequence number where theirs is null.
                if added is None:
                    added = pc.equal(status, int(ManifestEntryStatus.ADDED))
                seq = pc.if_else(added, pc.fill_null(seq, inherited), seq)
            columns[name] = seq
    if content_text == "data" and manifest.first_row_id is not None and n:
        row_ids = columns["first_row_id"]
        gets = pc.and_(pc.equal(content_arr, 0), pc.is_null(row_ids))
        counts = pc.if_else(gets, columns["record_count"], pa.scalar(0, pa.int64()))
        ends = pc.cumulative_sum(counts)
        starts = pc.add(pc.subtract(ends, counts), manifest.first_row_id)
        columns["first_row_id"] = pc.if_else(gets, starts, row_ids)

    # -- partition values, in the table spec's field order ---------------------------------
    partition = df_col(102)
    part_field = next(f for f in df_type.fields if f.field_id == 102)
    file_fields = (
        list(part_field.field_type.fields) if isinstance(part_field.field_type, StructType) else []
    )
    by_id = {f.field_id: f for f in file_fields}
    wanted = [f.field_id for f in partition_type.fields]
    if not all(i in by_id for i in wanted):
        if len(wanted) != len(file_fields):
            raise ArrowDecodeUnavailable(f"{location}: partition fields differ from the spec")
        chosen = file_fields  # matched by position, as read_manifest does
    else:
        chosen = [by_id[i] for i in wanted]
    partitions: list[Any] = []
    for f, target in zip(chosen, partition_type.fields):
        storage = arrow_storage_type(target.field_type)
        if storage is None:
            raise ArrowDecodeUnavailable(f"{location}: no Arrow form for {target.field_type}")
        raw = _child(partition, names.get(f.field_id)) if partition is not None else None
        if raw is None:
            raise ArrowDecodeUnavailable(f"{location}: partition field {f.field_id} is missing")
        partitions.append(_partition_values(raw, storage, f"partition field {f.field_id}"))
    del spec  # the spec's order is partition_type's; kept in the signature for callers
    return columns, partitions


@functools.lru_cache(maxsize=64)
def _conversion(avro_schema: str) -> AvroConversion:
    """The Iceberg form of a manifest's Avro schema text, converted once per distinct text:
    every manifest a writer made for one table and spec has the same, and converting it
    (JSON, then a walk of a hundred-odd fields) was a tenth of a 5,000-entry decode. The
    conversion is immutable, so the manifests share it."""
    return avro_to_iceberg(json.loads(avro_schema))


def _whole(column: Any) -> Any:
    """A table column as one array: its only chunk as it is (``combine_chunks`` copies even
    a single chunk: a third of a millisecond for a 5,000-entry manifest's ``data_file``)."""
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def _within(array: Any, low: int, high: int) -> bool:
    """Whether every value of an integer array without nulls is in ``[low, high]`` (its
    minimum and maximum, read through a zero-copy numpy view)."""
    values = array.to_numpy()
    return len(values) == 0 or (int(values.min()) >= low and int(values.max()) <= high)


def _file_formats(array: Any) -> Any:
    encoded = array.dictionary_encode()
    try:
        normalized = [FileFormat.parse(v) for v in encoded.dictionary.to_pylist()]
    except ValidationError as e:
        raise ArrowDecodeUnavailable(f"data_file field 101 'file_format': {e}") from e
    if normalized == encoded.dictionary.to_pylist():
        return encoded
    return pa.DictionaryArray.from_arrays(encoded.indices, pa.array(normalized, pa.string()))


def _partition_values(raw: Any, storage: Any, what: str) -> Any:
    """A reader's Arrow form of a partition column as the cache's storage type."""
    t = raw.type
    if storage == pa.int32() and pa.types.is_date32(t):
        return raw.view(pa.int32()) if raw.offset == 0 else raw.cast(pa.int32())
    if storage == pa.int64() and (pa.types.is_timestamp(t) or pa.types.is_time64(t)):
        return raw.cast(pa.int64())
    if storage == pa.binary(16) and (pa.types.is_fixed_size_binary(t) or pa.types.is_binary(t)):
        return _cast(raw, storage, what)
    if storage == pa.binary(16) and pa.types.is_string(t):
        # DuckDB reads the uuid logical type as UUID and hands it to Arrow as its text form.
        try:
            values = [None if v is None else uuid.UUID(v).bytes for v in raw.to_pylist()]
        except ValueError as e:
            raise ArrowDecodeUnavailable(f"{what}: {e}") from e
        return pa.array(values, storage)
    if pa.types.is_decimal(storage):
        if not pa.types.is_decimal(t) or t.scale != storage.scale:
            raise ArrowDecodeUnavailable(f"{what} of type {t} is not {storage}")
        return _cast(raw, storage, what)
    if pa.types.is_timestamp(t) or pa.types.is_time64(t) or pa.types.is_date(t):
        raise ArrowDecodeUnavailable(f"{what} of type {t} does not fit {storage}")
    if pa.types.is_floating(storage) != pa.types.is_floating(t):
        raise ArrowDecodeUnavailable(f"{what} of type {t} does not fit {storage}")
    return _cast(raw, storage, what)


__all__ = [
    "DECODERS",
    "DECODER_ENV",
    "ArrowDecodeUnavailable",
    "configured_decoder",
    "decode_columns",
]
