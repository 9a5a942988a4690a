"""Manifests: the Avro files listing data or delete files with their partitions and metrics.

Spec sections: "Manifests", "Manifest Entry Fields", "Data File Fields", "Sequence Number
Inheritance", "First Row ID Inheritance" and Appendix A.

Writing leaves what only the commit knows (sequence numbers, the snapshot id in v2+, v3 first
row ids) null, so a manifest is written once and survives commit retries; reading fills those
nulls from the manifest's row in the manifest list. :class:`ManifestWriter` also computes the
manifest list row itself (counts, min sequence number, partition summaries) while entries go
by, so nobody has to read the manifest back.

Both directions are built for throughput, because the coordinator writes and the planner reads
manifests with many thousands of entries: the Avro schema is converted and parsed once per
(partition type, format version), each entry becomes a dict through a precomputed function
per format version, and reading resolves the file's column names by field id once per file
and then runs one closure per entry.

Why one module past 800 lines: reading and writing share the per-format-version Avro schemas
and entry converters, built once here; apart, each half would derive its own and could drift.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import IntEnum
from functools import lru_cache, partial
from typing import TYPE_CHECKING, Any, BinaryIO

from icefloe.avro.codec import (
    DEFAULT_CODEC,
    AvroContainer,
    AvroFileWriter,
    avro_decoder,
    avro_encoder,
    avro_to_iceberg,
    parsed_avro_schema,
    read_container,
    read_header,
    sanitize_name,
)
from icefloe.errors import IcefloeError, InvalidFileError, ValidationError
from icefloe.manifests.manifest_list import (
    UNASSIGNED_SEQ,
    ManifestContent,
    ManifestFile,
    PartitionFieldSummary,
    check_field_type,
)
from icefloe.spec.datafile import DataFile, DataFileContent, FileFormat
from icefloe.spec.format_version import check_write_version, format_version_of
from icefloe.spec.schema import Schema
from icefloe.spec.types import (
    BinaryType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    PrimitiveType,
    StringType,
    StructType,
)
from icefloe.spec.values import compare, to_bytes

if TYPE_CHECKING:
    from icefloe.spec.partition import PartitionSpec

# v1 requires block_size_in_bytes; it means nothing any more, so write Java's default.
DEFAULT_BLOCK_SIZE = 64 * 1024 * 1024


class ManifestEntryStatus(IntEnum):
    EXISTING = 0
    ADDED = 1
    DELETED = 2


@dataclass(slots=True)
class ManifestEntry:
    """A data or delete file with the snapshot and sequence numbers that track it.

    After :func:`read_manifest` with the manifest's :class:`ManifestFile`, inherited values
    are filled in; ``sequence_number`` is the data sequence number.
    """

    status: ManifestEntryStatus
    snapshot_id: int | None
    sequence_number: int | None
    file_sequence_number: int | None
    data_file: DataFile

    @property
    def is_live(self) -> bool:
        """Whether the file belongs to the snapshot (deleted entries are informational)."""
        return self.status != ManifestEntryStatus.DELETED


# ---------------------------------------------------------------------------------------------
# The manifest_entry struct per format version (spec: "Manifest Entry Fields")
# ---------------------------------------------------------------------------------------------


def _map(key_id: int, value_id: int, value: IcebergType) -> MapType:
    return MapType(key_id, IntegerType(), value_id, value, True)


def data_file_struct(partition_type: StructType, version: int) -> StructType:
    """The ``data_file`` struct of a format version, with the partition tuple's type."""
    v2, v3 = version >= 2, version >= 3
    fields: list[NestedField] = []
    if v2:
        fields.append(NestedField(134, "content", IntegerType(), True))
    fields += [
        NestedField(100, "file_path", StringType(), True),
        NestedField(101, "file_format", StringType(), True),
        NestedField(102, "partition", partition_type, True),
        NestedField(103, "record_count", LongType(), True),
        NestedField(104, "file_size_in_bytes", LongType(), True),
    ]
    if not v2:
        fields.append(NestedField(105, "block_size_in_bytes", LongType(), True))
    fields += [
        NestedField(108, "column_sizes", _map(117, 118, LongType()), False),
        NestedField(109, "value_counts", _map(119, 120, LongType()), False),
        NestedField(110, "null_value_counts", _map(121, 122, LongType()), False),
        NestedField(137, "nan_value_counts", _map(138, 139, LongType()), False),
        NestedField(125, "lower_bounds", _map(126, 127, BinaryType()), False),
        NestedField(128, "upper_bounds", _map(129, 130, BinaryType()), False),
        NestedField(131, "key_metadata", BinaryType(), False),
        NestedField(132, "split_offsets", ListType(133, LongType(), True), False),
    ]
    if v2:
        fields.append(NestedField(135, "equality_ids", ListType(136, IntegerType(), True), False))
    fields.append(NestedField(140, "sort_order_id", IntegerType(), False))
    if v3:
        fields.append(NestedField(142, "first_row_id", LongType(), False))
    if v2:
        # Optional from v2 on: a v2 position delete file may name the one file it applies to.
        fields.append(NestedField(143, "referenced_data_file", StringType(), False))
    if v3:
        fields += [
            NestedField(144, "content_offset", LongType(), False),
            NestedField(145, "content_size_in_bytes", LongType(), False),
        ]
    return StructType(*fields)


@lru_cache(maxsize=256)
def manifest_entry_struct(partition_type: StructType, version: int) -> StructType:
    """The ``manifest_entry`` struct (the Avro file schema) of a format version."""
    v2 = version >= 2
    fields = [
        NestedField(0, "status", IntegerType(), True),
        NestedField(1, "snapshot_id", LongType(), not v2),
    ]
    if v2:
        fields += [
            NestedField(3, "sequence_number", LongType(), False),
            NestedField(4, "file_sequence_number", LongType(), False),
        ]
    fields.append(NestedField(2, "data_file", data_file_struct(partition_type, version), True))
    return StructType(*fields)


# ---------------------------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------------------------

Record = dict[str, Any]


# Optional arrays are handed to fastavro as ("array", items): fastavro's tuple notation for
# picking a union branch. Without it fastavro finds the branch by validating the whole array
# against each branch, which more than doubles the cost of writing an entry.


def _kv(m: Mapping[int, Any] | None) -> tuple[str, list[dict[str, Any]]] | None:
    if m is None:
        return None
    return ("array", [{"key": k, "value": v} for k, v in m.items()])


def _array(items: list[int] | None) -> tuple[str, list[int]] | None:
    return None if items is None else ("array", items)


def _partition_encoder(partition_type: StructType) -> Callable[[tuple[Any, ...]], Record]:
    names = tuple(sanitize_name(f.name) for f in partition_type.fields)
    encoders = tuple(avro_encoder(f.field_type) for f in partition_type.fields)
    if not any(encoders):
        return lambda values: dict(zip(names, values))
    identity: Callable[[Any], Any] = lambda v: v  # noqa: E731
    steps = tuple(zip(names, (e or identity for e in encoders)))
    return lambda values: {n: enc(v) for (n, enc), v in zip(steps, values)}


def _data_file_encoder(partition_type: StructType, version: int) -> Callable[[DataFile], Record]:
    """DataFile → the ``data_file`` record of one format version, with no per-field dispatch.

    Each version's record is the fields every version has plus that version's own; the
    later versions only add fields, so v3 extends the v2 record.
    """
    partition = _partition_encoder(partition_type)

    def common(f: DataFile) -> Record:
        return {
            "file_path": f.file_path,
            "file_format": f.file_format,
            "partition": partition(f.partition),
            "record_count": f.record_count,
            "file_size_in_bytes": f.file_size_in_bytes,
            "column_sizes": _kv(f.column_sizes),
            "value_counts": _kv(f.value_counts),
            "null_value_counts": _kv(f.null_value_counts),
            "nan_value_counts": _kv(f.nan_value_counts),
            "lower_bounds": _kv(f.lower_bounds),
            "upper_bounds": _kv(f.upper_bounds),
            "key_metadata": f.key_metadata,
            "split_offsets": _array(f.split_offsets),
            "sort_order_id": f.sort_order_id,
        }

    if version == 1:

        def encode_v1(f: DataFile) -> Record:
            record = common(f)
            record["block_size_in_bytes"] = DEFAULT_BLOCK_SIZE
            return record

        return encode_v1

    def encode_v2(f: DataFile) -> Record:
        record = common(f)
        record["content"] = f.content
        record["equality_ids"] = _array(f.equality_ids)
        record["referenced_data_file"] = f.referenced_data_file
        return record

    if version == 2:
        return encode_v2

    def encode_v3(f: DataFile) -> Record:
        record = encode_v2(f)
        record["first_row_id"] = f.first_row_id
        record["content_offset"] = f.content_offset
        record["content_size_in_bytes"] = f.content_size_in_bytes
        return record

    return encode_v3


class _FieldSummary:
    """Running bounds of one partition field, in the spec's total order (-0.0 < +0.0).

    Values are compared with :func:`icefloe.spec.values.compare` rather than collected in a set:
    a set would treat -0.0 and +0.0 as one value and lose the sign the spec asks bounds to keep.
    """

    __slots__ = ("compare", "contains_nan", "contains_null", "is_float", "lower", "type", "upper")

    def __init__(self, t: PrimitiveType) -> None:
        self.type = t
        self.is_float = isinstance(t, FloatType | DoubleType)
        self.compare = partial(compare, t)
        self.contains_null = False
        self.contains_nan = False
        self.lower: Any = None
        self.upper: Any = None

    def update(self, v: Any) -> None:
        if v is None:
            self.contains_null = True
        elif self.is_float and v != v:
            self.contains_nan = True
        elif self.lower is None:
            self.lower = self.upper = v
        else:
            if self.compare(v, self.lower) < 0:
                self.lower = v
            if self.compare(v, self.upper) > 0:
                self.upper = v

    def summary(self) -> PartitionFieldSummary:
        t = self.type
        if self.lower is None:
            return PartitionFieldSummary(self.contains_null, self.contains_nan)
        return PartitionFieldSummary(
            self.contains_null, self.contains_nan, to_bytes(t, self.lower), to_bytes(t, self.upper)
        )


class ManifestWriter(AvroFileWriter):
    """Writes one manifest for one partition spec; entries are streamed to ``output``.

    ``output`` is any binary stream (a file, ``io.BytesIO``, an upload buffer); the caller owns
    it. After :meth:`close`, :meth:`to_manifest_file` gives the manifest list row, given the
    path the bytes were stored at and their length.
    """

    def __init__(
        self,
        output: BinaryIO,
        *,
        spec: PartitionSpec,
        schema: Schema,
        format_version: int,
        snapshot_id: int | None,
        content: ManifestContent = ManifestContent.DATA,
        codec: str = DEFAULT_CODEC,
    ) -> None:
        check_write_version(format_version, "manifest")
        content = ManifestContent(content)
        if format_version == 1:
            if content != ManifestContent.DATA:
                raise ValidationError("v1 manifests can only hold data files, not delete files")
            if snapshot_id is None:
                raise ValidationError("v1 manifests need the snapshot id: it cannot be inherited")
        self.format_version = format_version
        self.snapshot_id = snapshot_id
        self.content = content
        self.spec_id: int = spec.spec_id
        self.partition_type: StructType = spec.partition_type(schema)
        self._arity = len(self.partition_type.fields)
        self._encode = _data_file_encoder(self.partition_type, format_version)
        self._allowed_content = (
            frozenset({DataFileContent.DATA})
            if content == ManifestContent.DATA
            else frozenset({DataFileContent.POSITION_DELETES, DataFileContent.EQUALITY_DELETES})
        )
        self._v2 = format_version >= 2
        self._v3_data = format_version >= 3 and content == ManifestContent.DATA
        self._stats: list[_FieldSummary] = []
        for f in self.partition_type.fields:
            if not isinstance(f.field_type, PrimitiveType):
                raise ValidationError(
                    f"partition spec {spec.spec_id} field {f.name!r} has non-primitive type "
                    f"{f.field_type}"
                )
            self._stats.append(_FieldSummary(f.field_type))
        self._last_partition: tuple[Any, ...] | None = None
        self._counts = [0, 0, 0]  # files by status: existing, added, deleted
        self._rows = [0, 0, 0]
        self._min_seq: int | None = None

        entry_struct = manifest_entry_struct(self.partition_type, format_version)
        parsed = parsed_avro_schema(entry_struct, "manifest_entry")
        meta = {
            "schema": json.dumps(schema.to_json()),
            "schema-id": str(schema.schema_id),
            "partition-spec": json.dumps(spec.to_json()["fields"]),
            "partition-spec-id": str(spec.spec_id),
            "format-version": str(format_version),
        }
        if self._v2:
            meta["content"] = "data" if content == ManifestContent.DATA else "deletes"
        super().__init__(output, parsed, meta, codec)

    # -- adding entries ----------------------------------------------------------------------

    def add(self, data_file: DataFile, sequence_number: int | None = None) -> None:
        """Add a new file: status ADDED, tracked by this manifest's snapshot.

        Sequence numbers stay null so they are inherited at commit; pass ``sequence_number``
        only for data that logically belongs to an older sequence number (e.g. compaction).
        """
        if self._v3_data and data_file.first_row_id is not None:
            # New data files get their row ids from the manifest when it is committed.
            data_file = data_file.copy(first_row_id=None)
        self._write(ManifestEntryStatus.ADDED, self.snapshot_id, sequence_number, None, data_file)

    def existing(self, entry: ManifestEntry) -> None:
        """Carry over a live file from another manifest, keeping its snapshot and sequences."""
        if entry.snapshot_id is None:
            raise ValidationError(
                f"existing entry for {entry.data_file.file_path!r} has no snapshot id: read "
                "it with its ManifestFile so the inherited value is filled in"
            )
        self._require_sequence_numbers(entry, "an existing")
        self._write(
            ManifestEntryStatus.EXISTING,
            entry.snapshot_id,
            entry.sequence_number,
            entry.file_sequence_number,
            entry.data_file,
        )

    def delete(self, entry: ManifestEntry) -> None:
        """Record that this manifest's snapshot removes a file; its sequences are kept."""
        self._require_sequence_numbers(entry, "a deleted")
        self._write(
            ManifestEntryStatus.DELETED,
            self.snapshot_id,
            entry.sequence_number,
            entry.file_sequence_number,
            entry.data_file,
        )

    def _require_sequence_numbers(self, entry: ManifestEntry, what: str) -> None:
        if self._v2 and (entry.sequence_number is None or entry.file_sequence_number is None):
            raise ValidationError(
                f"{what} entry for {entry.data_file.file_path!r} must carry its data and file "
                "sequence numbers (read it with its ManifestFile to inherit them)"
            )

    def _write(
        self,
        status: ManifestEntryStatus,
        snapshot_id: int | None,
        sequence_number: int | None,
        file_sequence_number: int | None,
        data_file: DataFile,
    ) -> None:
        path = data_file.file_path
        if self._closed:
            raise ValidationError(f"cannot add {path!r}: the manifest writer is closed")
        if data_file.content not in self._allowed_content:
            raise ValidationError(
                f"data file {path!r}: content {DataFileContent(data_file.content).name} "
                f"does not belong in a {self.content.name.lower()} manifest"
            )
        partition = data_file.partition
        if len(partition) != self._arity:
            raise ValidationError(
                f"data file {path!r}: partition has {len(partition)} values but spec "
                f"{self.spec_id} has {self._arity} fields"
            )
        record: Record = {"status": status, "snapshot_id": snapshot_id}
        if self._v2:
            record["sequence_number"] = sequence_number
            record["file_sequence_number"] = file_sequence_number
        try:
            record["data_file"] = self._encode(data_file)
            self._writer.write(record)
        except IcefloeError as e:
            raise ValidationError(f"data file {path!r}: {e}") from e
        except Exception as e:  # fastavro signals bad values with assorted exception types
            raise ValidationError(f"data file {path!r} cannot be written to a manifest: {e}") from e
        self._counts[status] += 1
        self._rows[status] += data_file.record_count
        if (
            sequence_number is not None
            and status != ManifestEntryStatus.DELETED
            and (self._min_seq is None or sequence_number < self._min_seq)
        ):
            self._min_seq = sequence_number
        if partition is not self._last_partition:  # writers often share one tuple per partition
            for stats, value in zip(self._stats, partition):
                stats.update(value)
            self._last_partition = partition

    # -- finishing ---------------------------------------------------------------------------

    @property
    def entry_count(self) -> int:
        return sum(self._counts)

    def to_manifest_file(self, path: str, length: int) -> ManifestFile:
        """The manifest list row for this manifest, stored at ``path`` with ``length`` bytes.

        Sequence numbers are left unassigned (the manifest list writer assigns the commit's);
        partition summaries cover every entry, deleted ones included, as in Java and PyIceberg,
        so a summary never hides a file from a reader of deleted entries either.
        """
        self.close()
        existing, added, deleted = self._counts
        existing_rows, added_rows, deleted_rows = self._rows
        return ManifestFile(
            manifest_path=path,
            manifest_length=length,
            partition_spec_id=self.spec_id,
            content=self.content,
            sequence_number=UNASSIGNED_SEQ,
            min_sequence_number=UNASSIGNED_SEQ if self._min_seq is None else self._min_seq,
            added_snapshot_id=self.snapshot_id,
            added_files_count=added,
            existing_files_count=existing,
            deleted_files_count=deleted,
            added_rows_count=added_rows,
            existing_rows_count=existing_rows,
            deleted_rows_count=deleted_rows,
            partitions=[stats.summary() for stats in self._stats],
        )


def write_manifest(
    output: BinaryIO,
    entries: list[DataFile],
    *,
    spec: PartitionSpec,
    schema: Schema,
    format_version: int,
    snapshot_id: int | None,
    content: ManifestContent = ManifestContent.DATA,
    path: str,
    codec: str = DEFAULT_CODEC,
) -> ManifestFile:
    """Write new files as one manifest; returns its manifest list row (length from ``output``)."""
    start = output.tell()
    with ManifestWriter(
        output,
        spec=spec,
        schema=schema,
        format_version=format_version,
        snapshot_id=snapshot_id,
        content=content,
        codec=codec,
    ) as writer:
        for f in entries:
            writer.add(f)
    return writer.to_manifest_file(path, output.tell() - start)


# ---------------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------------

_STATUS_BY_VALUE = {s.value: s for s in ManifestEntryStatus}
_DATA_CONTENT_BY_VALUE = {c.value: c for c in DataFileContent}
_INTS = (IntegerType, LongType)
_REQUIRED_ENTRY = {0: "status", 2: "data_file"}
_REQUIRED_FILE = {
    100: "file_path",
    101: "file_format",
    102: "partition",
    103: "record_count",
    104: "file_size_in_bytes",
}
_LONG_MAPS = {
    108: "column_sizes",
    109: "value_counts",
    110: "null_value_counts",
    137: "nan_value_counts",
}
_BINARY_MAPS = {125: "lower_bounds", 128: "upper_bounds"}


@dataclass(frozen=True, slots=True)
class _Layout:
    """Where the fields of one manifest file are, by the Avro names its writer chose.

    Field ids are unique across the whole file schema, so one id → name map covers the entry,
    the data file, the partition tuple and the key/value records of the metric maps.
    """

    names: Mapping[int, str]
    entry_ids: frozenset[int]
    data_file_ids: frozenset[int]
    map_kv: Mapping[int, tuple[str, str]]
    partition: StructType


def _layout(container: AvroContainer) -> _Layout:
    location = container.location
    try:
        conv = avro_to_iceberg(container.schema)
    except ValidationError as e:
        raise InvalidFileError(location, f"not an Iceberg manifest: {e}") from e
    names = conv.avro_names
    entry_fields = {f.field_id: f for f in conv.struct.fields}
    for fid, name in _REQUIRED_ENTRY.items():
        if fid not in entry_fields:
            raise InvalidFileError(
                location, f"not an Iceberg manifest: manifest_entry field {fid} {name!r} is missing"
            )
    check_field_type(location, entry_fields[0], _INTS, "int")
    for fid in (1, 3, 4):
        if fid in entry_fields:
            check_field_type(location, entry_fields[fid], _INTS, "long")
    check_field_type(location, entry_fields[2], (StructType,), "struct")
    df_type = entry_fields[2].field_type
    assert isinstance(df_type, StructType)
    df_fields = {f.field_id: f for f in df_type.fields}
    for fid, name in _REQUIRED_FILE.items():
        if fid not in df_fields:
            raise InvalidFileError(
                location, f"not an Iceberg manifest: data_file field {fid} {name!r} is missing"
            )
    check_field_type(location, df_fields[100], (StringType,), "string")
    check_field_type(location, df_fields[101], (StringType,), "string")
    check_field_type(location, df_fields[102], (StructType,), "struct")
    for fid in (103, 104, 134, 140, 142, 144, 145):
        if fid in df_fields:
            check_field_type(location, df_fields[fid], _INTS, "int or long")
    for fid in (131,):
        if fid in df_fields:
            check_field_type(location, df_fields[fid], (BinaryType,), "binary")
    if 143 in df_fields:
        check_field_type(location, df_fields[143], (StringType,), "string")
    map_kv: dict[int, tuple[str, str]] = {}
    expected_values: dict[int, tuple[type[IcebergType], ...]] = {
        **{fid: _INTS for fid in _LONG_MAPS},
        **{fid: (BinaryType,) for fid in _BINARY_MAPS},
    }
    for fid, expected in expected_values.items():
        f = df_fields.get(fid)
        if f is None:
            continue
        t = f.field_type
        if (
            not isinstance(t, MapType)
            or not isinstance(t.key_type, _INTS)
            or not isinstance(t.value_type, expected)
        ):
            raise InvalidFileError(
                location,
                f"data_file field {fid} {f.name!r} has type {t}, expected a map from field id",
            )
        map_kv[fid] = (names[t.key_id], names[t.value_id])
    for fid in (132, 135):
        f = df_fields.get(fid)
        if f is not None and (
            not isinstance(f.field_type, ListType)
            or not isinstance(f.field_type.element_type, _INTS)
        ):
            raise InvalidFileError(
                location,
                f"data_file field {fid} {f.name!r} has type {f.field_type}, expected a list of ints",
            )
    partition = df_fields[102].field_type
    assert isinstance(partition, StructType)
    for pf in partition.fields:
        if not isinstance(pf.field_type, PrimitiveType):
            raise InvalidFileError(
                location,
                f"partition field {pf.field_id} {pf.name!r} has type {pf.field_type}; "
                "partition values must be primitives",
            )
    return _Layout(
        names=names,
        entry_ids=frozenset(entry_fields),
        data_file_ids=frozenset(df_fields),
        map_kv=map_kv,
        partition=partition,
    )


def _partition_decoder(
    layout: _Layout, spec: PartitionSpec | None, location: str
) -> Callable[[dict[Any, Any]], tuple[Any, ...]]:
    """Partition record → tuple in spec order, in the internal representation."""
    names = layout.names
    file_fields = list(layout.partition.fields)
    in_file_order = True
    if spec is not None:
        by_id = {f.field_id: f for f in file_fields}
        spec_ids = [pf.field_id for pf in spec.fields]
        if all(i in by_id for i in spec_ids):
            in_file_order = spec_ids == [f.field_id for f in file_fields]
            file_fields = [by_id[i] for i in spec_ids]
        elif len(spec_ids) != len(file_fields):
            raise InvalidFileError(
                location,
                f"the partition struct has field ids {sorted(by_id)} but partition spec "
                f"{spec.spec_id} has {spec_ids}",
            )
    avro_names = tuple(names[f.field_id] for f in file_fields)
    decoders = tuple(avro_decoder(f.field_type) for f in file_fields)
    if not any(decoders):
        if in_file_order:
            # fastavro fills dicts in schema order: the values already are the tuple.
            return lambda rec: tuple(rec.values())
        return lambda rec: tuple([rec[n] for n in avro_names])
    identity: Callable[[Any], Any] = lambda v: v  # noqa: E731
    steps = tuple(zip(avro_names, (d or identity for d in decoders)))
    return lambda rec: tuple([dec(rec[n]) for n, dec in steps])


def _entry_decoder(
    layout: _Layout,
    partition: Callable[[dict[Any, Any]], tuple[Any, ...]],
    spec_id: int,
) -> Callable[[dict[Any, Any]], DataFile]:
    """manifest_entry record → DataFile, with every column name resolved in advance.

    Absent optional columns have the name None: ``record.get(None)`` is None, so the closure
    needs no branches per column.
    """
    names, ids = layout.names, layout.data_file_ids

    def name(fid: int) -> str | None:
        return names[fid] if fid in ids else None

    n_df = names[2]
    n_path, n_format, n_partition = names[100], names[101], names[102]
    n_count, n_size = names[103], names[104]
    n_content = name(134)
    n_key, n_splits, n_eq, n_sort = name(131), name(132), name(135), name(140)
    n_row, n_ref, n_offset, n_csize = name(142), name(143), name(144), name(145)
    kv = layout.map_kv

    def map_reader(fid: int) -> Callable[[dict[Any, Any]], dict[int, Any] | None]:
        n = name(fid)
        if n is None:
            return lambda df: None
        k, v = kv[fid]

        def read_map(df: dict[Any, Any]) -> dict[int, Any] | None:
            pairs = df[n]
            return None if pairs is None else {p[k]: p[v] for p in pairs}

        return read_map

    sizes, values, nulls, nans = (map_reader(i) for i in (108, 109, 110, 137))
    lowers, uppers = map_reader(125), map_reader(128)
    contents = _DATA_CONTENT_BY_VALUE
    data = DataFileContent.DATA
    formats: dict[str, str] = {}

    def file_format(raw: str) -> str:
        fmt = formats.get(raw)
        if fmt is None:
            try:
                fmt = formats[raw] = FileFormat.parse(raw)
            except ValidationError as e:
                raise ValidationError(f"data_file field 101 'file_format': {e}") from e
        return fmt

    def decode(rec: dict[Any, Any]) -> DataFile:
        df = rec[n_df]
        get = df.get
        content = get(n_content)
        return DataFile(
            file_path=df[n_path],
            file_format=formats.get(df[n_format]) or file_format(df[n_format]),
            partition=partition(df[n_partition]),
            record_count=df[n_count],
            file_size_in_bytes=df[n_size],
            content=data if content is None else contents[content],
            spec_id=spec_id,
            column_sizes=sizes(df),
            value_counts=values(df),
            null_value_counts=nulls(df),
            nan_value_counts=nans(df),
            lower_bounds=lowers(df),
            upper_bounds=uppers(df),
            key_metadata=get(n_key),
            split_offsets=get(n_splits),
            equality_ids=get(n_eq),
            sort_order_id=get(n_sort),
            first_row_id=get(n_row),
            referenced_data_file=get(n_ref),
            content_offset=get(n_offset),
            content_size_in_bytes=get(n_csize),
        )

    return decode


def _parse_int_meta(meta: Mapping[str, str], key: str, location: str) -> int | None:
    text = meta.get(key)
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        raise InvalidFileError(location, f"metadata {key!r} is not a number: {text!r}") from None


def read_manifest(
    data: bytes,
    *,
    location: str,
    manifest_file: ManifestFile | None = None,
    spec_by_id: Mapping[int, PartitionSpec] | None = None,
    discard_deleted: bool = False,
) -> list[ManifestEntry]:
    """The entries of a manifest, with inherited values filled in from ``manifest_file``.

    Inheritance (spec): a null snapshot id takes the manifest's ``added_snapshot_id``; null
    sequence numbers of ADDED entries take the manifest's ``sequence_number``; manifests with
    no sequence number columns (v1) read as 0; in a data manifest whose row has a
    ``first_row_id``, data files without one get consecutive row id ranges in file order
    (deleted entries included, so ids never depend on the filter). Without ``manifest_file``
    nothing is inherited.

    Partition tuples follow the field order of ``spec_by_id[spec id]`` when given, else the
    file's own partition struct, which is the writing spec's order. ``DataFile.spec_id`` is the
    manifest's partition spec id.
    """
    container = read_container(data, location)
    meta = container.metadata
    for key in ("schema", "partition-spec"):
        if key not in meta:
            raise InvalidFileError(
                location, f"not an Iceberg manifest: key-value metadata {key!r} is missing"
            )
    layout = _layout(container)
    format_version_of(meta, location, default=2 if 3 in layout.entry_ids else 1)
    content_text = meta.get("content", "data")
    if content_text not in ("data", "deletes"):
        raise InvalidFileError(
            location, f"metadata 'content' must be 'data' or 'deletes', got {content_text!r}"
        )
    meta_spec_id = _parse_int_meta(meta, "partition-spec-id", location)
    if manifest_file is not None:
        spec_id = manifest_file.partition_spec_id
    else:
        spec_id = 0 if meta_spec_id is None else meta_spec_id
    spec = spec_by_id.get(spec_id) if spec_by_id is not None else None
    decode = _entry_decoder(layout, _partition_decoder(layout, spec, location), spec_id)

    inherited_snapshot = manifest_file.added_snapshot_id if manifest_file else None
    inherited_seq: int | None = None
    if manifest_file is not None and manifest_file.sequence_number != UNASSIGNED_SEQ:
        inherited_seq = manifest_file.sequence_number
    next_row_id: int | None = None
    if manifest_file is not None and content_text == "data":
        next_row_id = manifest_file.first_row_id
    names, entry_ids = layout.names, layout.entry_ids
    n_status = names[0]
    n_snap = names[1] if 1 in entry_ids else None
    n_seq = names[3] if 3 in entry_ids else None
    n_fseq = names[4] if 4 in entry_ids else None
    no_seq_columns = n_seq is None and n_fseq is None
    added, deleted = ManifestEntryStatus.ADDED, ManifestEntryStatus.DELETED
    statuses = _STATUS_BY_VALUE
    data_content = DataFileContent.DATA
    out: list[ManifestEntry] = []
    append = out.append
    index = 0
    try:
        for rec in container.records():
            status = statuses[rec[n_status]]
            f = decode(rec)
            if next_row_id is not None and f.first_row_id is None and f.content is data_content:
                f.first_row_id = next_row_id
                next_row_id += f.record_count
            if discard_deleted and status is deleted:
                index += 1
                continue
            snapshot_id = rec.get(n_snap)
            if snapshot_id is None:
                snapshot_id = inherited_snapshot
            if no_seq_columns:
                seq: int | None = 0
                fseq: int | None = 0
            else:
                seq = rec.get(n_seq)
                fseq = rec.get(n_fseq)
                if status is added and inherited_seq is not None:
                    if seq is None:
                        seq = inherited_seq
                    if fseq is None:
                        fseq = inherited_seq
            append(ManifestEntry(status, snapshot_id, seq, fseq, f))
            index += 1
    except InvalidFileError:
        raise
    except IcefloeError as err:
        raise InvalidFileError(location, f"manifest entry {index}: {err}") from err
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as err:
        raise InvalidFileError(
            location, f"manifest entry {index} is malformed: {type(err).__name__}: {err}"
        ) from err
    return out


def read_manifest_metadata(data: bytes, *, location: str = "manifest") -> dict[str, str]:
    """The Iceberg key-value metadata of a manifest (``schema``, ``partition-spec``, ...).

    Only the header is decoded, so this is cheap even for large manifests.
    """
    meta, _ = read_header(data, location)
    return {k: v for k, v in meta.items() if not k.startswith("avro.")}


__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "ManifestContent",
    "ManifestEntry",
    "ManifestEntryStatus",
    "ManifestFile",
    "ManifestWriter",
    "PartitionFieldSummary",
    "data_file_struct",
    "manifest_entry_struct",
    "read_manifest",
    "read_manifest_metadata",
    "write_manifest",
]
