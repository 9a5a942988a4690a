"""Manifest lists: the per-snapshot Avro file listing manifests (spec: "Manifest Lists").

A manifest list is rewritten on every commit attempt, which is what makes commits cheap to
retry: manifests are written once with their sequence numbers (and, in v3, first row ids)
left unassigned, and only this file assigns them. :class:`ManifestListWriter` therefore does
the assignment for new manifests (spec: "Sequence Number Inheritance", "First Row ID
Assignment"), while manifests carried over from the parent snapshot keep theirs.

Reading resolves columns by field id, so lists written by Java (whose v1 column names differ
from the v2 ones) and by PyIceberg read the same way, and v1 lists get the spec's defaults
for the columns v1 does not have.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, BinaryIO

from icefloe.avro.codec import (
    DEFAULT_CODEC,
    AvroContainer,
    AvroFileWriter,
    avro_to_iceberg,
    parsed_avro_schema,
    read_container,
    read_header,
)
from icefloe.errors import (
    IcefloeError,
    InvalidFileError,
    ValidationError,
)
from icefloe.spec.format_version import (
    SUPPORTED_FORMAT_VERSIONS,
    check_write_version,
    format_version_of,
)
from icefloe.spec.types import (
    BinaryType,
    BooleanType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    NestedField,
    StringType,
    StructType,
)

# Sequence number of a manifest written before its commit's sequence number was known.
UNASSIGNED_SEQ = -1


class ManifestContent(IntEnum):
    """What a manifest tracks; a manifest never mixes data and delete files."""

    DATA = 0
    DELETES = 1


@dataclass(frozen=True, slots=True)
class PartitionFieldSummary:
    """Bounds of one partition field over a manifest, used to skip the whole manifest.

    Bounds are in the Appendix D binary form of the partition field's result type.
    """

    contains_null: bool
    contains_nan: bool | None = None
    lower_bound: bytes | None = None
    upper_bound: bytes | None = None


@dataclass(frozen=True, slots=True)
class ManifestFile:
    """One row of a manifest list (the spec's ``manifest_file`` struct).

    ``sequence_number`` and ``min_sequence_number`` are :data:`UNASSIGNED_SEQ` for a manifest
    that has not been committed yet; ``added_snapshot_id`` may be None for a manifest written
    before its snapshot id was chosen. Counts are None only when an old v1 writer omitted them
    (the spec then says "assume non-zero").
    """

    manifest_path: str
    manifest_length: int
    partition_spec_id: int
    content: ManifestContent = ManifestContent.DATA
    sequence_number: int = UNASSIGNED_SEQ
    min_sequence_number: int = UNASSIGNED_SEQ
    added_snapshot_id: int | None = None
    added_files_count: int | None = None
    existing_files_count: int | None = None
    deleted_files_count: int | None = None
    added_rows_count: int | None = None
    existing_rows_count: int | None = None
    deleted_rows_count: int | None = None
    partitions: list[PartitionFieldSummary] | None = None
    key_metadata: bytes | None = None
    first_row_id: int | None = None

    def copy(self, **changes: Any) -> ManifestFile:
        return dataclasses.replace(self, **changes)

    @property
    def has_added_files(self) -> bool:
        return self.added_files_count is None or self.added_files_count > 0

    @property
    def has_existing_files(self) -> bool:
        return self.existing_files_count is None or self.existing_files_count > 0

    @property
    def has_deleted_files(self) -> bool:
        return self.deleted_files_count is None or self.deleted_files_count > 0


# ---------------------------------------------------------------------------------------------
# The manifest_file struct per format version (spec: "Manifest Lists")
# ---------------------------------------------------------------------------------------------

FIELD_SUMMARY_TYPE = StructType(
    NestedField(509, "contains_null", BooleanType(), True),
    NestedField(518, "contains_nan", BooleanType(), False),
    NestedField(510, "lower_bound", BinaryType(), False),
    NestedField(511, "upper_bound", BinaryType(), False),
)


def _manifest_file_struct(version: int) -> StructType:
    v2 = version >= 2
    fields = [
        NestedField(500, "manifest_path", StringType(), True),
        NestedField(501, "manifest_length", LongType(), True),
        NestedField(502, "partition_spec_id", IntegerType(), True),
    ]
    if v2:
        fields += [
            NestedField(517, "content", IntegerType(), True),
            NestedField(515, "sequence_number", LongType(), True),
            NestedField(516, "min_sequence_number", LongType(), True),
        ]
    fields += [
        NestedField(503, "added_snapshot_id", LongType(), True),
        NestedField(504, "added_files_count", IntegerType(), v2),
        NestedField(505, "existing_files_count", IntegerType(), v2),
        NestedField(506, "deleted_files_count", IntegerType(), v2),
        NestedField(512, "added_rows_count", LongType(), v2),
        NestedField(513, "existing_rows_count", LongType(), v2),
        NestedField(514, "deleted_rows_count", LongType(), v2),
        NestedField(507, "partitions", ListType(508, FIELD_SUMMARY_TYPE, True), False),
        NestedField(519, "key_metadata", BinaryType(), False),
    ]
    if version >= 3:
        fields.append(NestedField(520, "first_row_id", LongType(), False))
    return StructType(*fields)


MANIFEST_FILE_STRUCTS: dict[int, StructType] = {
    v: _manifest_file_struct(v) for v in SUPPORTED_FORMAT_VERSIONS
}


# ---------------------------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------------------------


def _summary_record(s: PartitionFieldSummary) -> dict[str, Any]:
    return {
        "contains_null": s.contains_null,
        "contains_nan": s.contains_nan,
        "lower_bound": s.lower_bound,
        "upper_bound": s.upper_bound,
    }


class ManifestListWriter(AvroFileWriter):
    """Writes one snapshot's manifest list, assigning what new manifests leave open.

    ``first_row_id`` is the snapshot's ``first-row-id`` (v3, required there); after the
    manifests are added, :attr:`next_row_id` is the table's next row id, so the snapshot's
    ``added-rows`` is ``next_row_id - first_row_id``.
    """

    def __init__(
        self,
        output: BinaryIO,
        *,
        format_version: int,
        snapshot_id: int,
        parent_snapshot_id: int | None,
        sequence_number: int | None,
        first_row_id: int | None = None,
        codec: str = DEFAULT_CODEC,
    ) -> None:
        check_write_version(format_version, "manifest list")
        if format_version >= 2 and (sequence_number is None or sequence_number < 0):
            raise ValidationError(
                f"a v{format_version} manifest list needs the commit's sequence number, "
                f"got {sequence_number!r}"
            )
        if format_version >= 3 and (first_row_id is None or first_row_id < 0):
            raise ValidationError(
                f"a v3 manifest list needs the snapshot's first-row-id, got {first_row_id!r}"
            )
        self.format_version = format_version
        self.snapshot_id = snapshot_id
        self.sequence_number = sequence_number if format_version >= 2 else None
        self.first_row_id = first_row_id if format_version >= 3 else None
        self._next_row_id = self.first_row_id
        meta = {
            "snapshot-id": str(snapshot_id),
            "parent-snapshot-id": "null" if parent_snapshot_id is None else str(parent_snapshot_id),
            "format-version": str(format_version),
        }
        if self.sequence_number is not None:
            meta["sequence-number"] = str(self.sequence_number)
        if self.first_row_id is not None:
            meta["first-row-id"] = str(self.first_row_id)
        parsed = parsed_avro_schema(MANIFEST_FILE_STRUCTS[format_version], "manifest_file")
        super().__init__(output, parsed, meta, codec)

    @property
    def next_row_id(self) -> int | None:
        """v3: the first row id not yet assigned (the table's new ``next-row-id``)."""
        return self._next_row_id

    def add(self, manifest: ManifestFile) -> ManifestFile:
        """Add a manifest; returns it as written, with anything unassigned now assigned."""
        if self._closed:
            raise ValidationError(
                f"cannot add manifest {manifest.manifest_path!r}: the manifest list is closed"
            )
        manifest, row_ids = self._prepare(manifest)
        try:
            self._writer.write(self._record(manifest))
        except IcefloeError:
            raise
        except Exception as e:  # fastavro reports bad values with assorted exception types
            raise ValidationError(
                f"manifest {manifest.manifest_path!r} cannot be written to a "
                f"v{self.format_version} manifest list: {e}"
            ) from e
        if self._next_row_id is not None:
            self._next_row_id += row_ids
        return manifest

    def add_all(self, manifests: Iterable[ManifestFile]) -> list[ManifestFile]:
        return [self.add(m) for m in manifests]

    def _prepare(self, m: ManifestFile) -> tuple[ManifestFile, int]:
        """The manifest as readers of this list will see it, and the row ids it takes."""
        changes: dict[str, Any] = {}
        path = m.manifest_path
        if m.added_snapshot_id is None:
            # Written before the snapshot id was known: its entries inherit this commit's id.
            changes["added_snapshot_id"] = self.snapshot_id
        if self.format_version < 3 and m.first_row_id is not None:
            changes["first_row_id"] = None  # not stored before v3
        if self.format_version == 1:
            if m.content != ManifestContent.DATA:
                raise ValidationError(f"manifest {path!r}: v1 tables cannot have delete manifests")
            # v1 stores no sequence numbers; readers take them as 0.
            changes["sequence_number"] = changes["min_sequence_number"] = 0
            return m.copy(**changes), 0
        added_by = changes.get("added_snapshot_id", m.added_snapshot_id)
        seq = self.sequence_number
        for name in ("sequence_number", "min_sequence_number"):
            value = getattr(m, name)
            if value is None or value == UNASSIGNED_SEQ:
                if added_by != self.snapshot_id:
                    raise ValidationError(
                        f"manifest {path!r} has an unassigned {name} but was added by "
                        f"snapshot {added_by}, not by this commit's snapshot {self.snapshot_id}"
                    )
                changes[name] = seq
        for name in (
            "added_files_count",
            "existing_files_count",
            "deleted_files_count",
            "added_rows_count",
            "existing_rows_count",
            "deleted_rows_count",
        ):
            if getattr(m, name) is None:
                raise ValidationError(
                    f"manifest {path!r}: {name} is required in a v{self.format_version} "
                    "manifest list"
                )
        row_ids = 0
        if self.format_version >= 3:
            if m.content == ManifestContent.DELETES:
                if m.first_row_id is not None:
                    changes["first_row_id"] = None  # delete manifests never carry row ids
            elif m.first_row_id is None:
                changes["first_row_id"] = self._next_row_id
                # Existing files with no row id yet are assigned ids on read as well.
                row_ids = (m.added_rows_count or 0) + (m.existing_rows_count or 0)
        return (m.copy(**changes) if changes else m), row_ids

    def _record(self, m: ManifestFile) -> dict[str, Any]:
        record: dict[str, Any] = {
            "manifest_path": m.manifest_path,
            "manifest_length": m.manifest_length,
            "partition_spec_id": m.partition_spec_id,
            "added_snapshot_id": m.added_snapshot_id,
            "added_files_count": m.added_files_count,
            "existing_files_count": m.existing_files_count,
            "deleted_files_count": m.deleted_files_count,
            "added_rows_count": m.added_rows_count,
            "existing_rows_count": m.existing_rows_count,
            "deleted_rows_count": m.deleted_rows_count,
            # ("array", ...) names the union branch for fastavro (see manifest._kv).
            "partitions": None
            if m.partitions is None
            else ("array", [_summary_record(s) for s in m.partitions]),
            "key_metadata": m.key_metadata,
        }
        if self.format_version >= 2:
            record["content"] = int(m.content)
            record["sequence_number"] = m.sequence_number
            record["min_sequence_number"] = m.min_sequence_number
        if self.format_version >= 3:
            record["first_row_id"] = m.first_row_id
        return record


def write_manifest_list(
    output: BinaryIO,
    manifests: Iterable[ManifestFile],
    *,
    format_version: int,
    snapshot_id: int,
    parent_snapshot_id: int | None,
    sequence_number: int | None,
    first_row_id: int | None = None,
    codec: str = DEFAULT_CODEC,
) -> tuple[list[ManifestFile], int | None]:
    """Write a whole manifest list; returns the manifests as written and the next row id."""
    with ManifestListWriter(
        output,
        format_version=format_version,
        snapshot_id=snapshot_id,
        parent_snapshot_id=parent_snapshot_id,
        sequence_number=sequence_number,
        first_row_id=first_row_id,
        codec=codec,
    ) as writer:
        written = writer.add_all(manifests)
    return written, writer.next_row_id


# ---------------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------------

_REQUIRED_IDS = {
    500: "manifest_path",
    501: "manifest_length",
    502: "partition_spec_id",
    503: "added_snapshot_id",
}
_CONTENT_BY_VALUE = {c.value: c for c in ManifestContent}
_INT_TYPES = (IntegerType, LongType)


def check_field_type(
    location: str, field: NestedField, expected: tuple[type[IcebergType], ...], what: str
) -> None:
    if not isinstance(field.field_type, expected):
        raise InvalidFileError(
            location,
            f"field {field.field_id} {field.name!r} has type {field.field_type}, expected {what}",
        )


def read_manifest_list(data: bytes, *, location: str) -> list[ManifestFile]:
    """All manifests of a manifest list file, in file order.

    v1 lists get ``content`` DATA and sequence numbers 0, as the spec requires. Anything that
    is not an Iceberg manifest list raises :class:`InvalidFileError` naming the file and field.
    """
    container = read_container(data, location)
    format_version_of(container.metadata, location, default=1)
    try:
        conv = avro_to_iceberg(container.schema)
    except ValidationError as e:
        raise InvalidFileError(location, f"not an Iceberg manifest list: {e}") from e
    fields = {f.field_id: f for f in conv.struct.fields}
    for fid, name in _REQUIRED_IDS.items():
        if fid not in fields:
            raise InvalidFileError(
                location, f"not an Iceberg manifest list: required field {fid} {name!r} is missing"
            )
    check_field_type(location, fields[500], (StringType,), "string")
    for fid in (501, 502, 503, 504, 505, 506, 512, 513, 514, 515, 516, 517, 520):
        if fid in fields:
            check_field_type(location, fields[fid], _INT_TYPES, "int or long")
    names = conv.avro_names

    def avro_name(fid: int) -> str | None:
        return names[fid] if fid in fields else None

    summary_names: tuple[str | None, ...] | None = None
    if 507 in fields:
        plist = fields[507].field_type
        if not isinstance(plist, ListType) or not isinstance(plist.element_type, StructType):
            raise InvalidFileError(
                location, f"field 507 'partitions' has type {plist}, expected list<struct>"
            )
        summary_fields = {f.field_id for f in plist.element_type.fields}
        if 509 not in summary_fields:
            raise InvalidFileError(location, "partition summaries lack field 509 'contains_null'")
        summary_names = tuple(
            names[i] if i in summary_fields else None for i in (509, 518, 510, 511)
        )
    return _decode_manifest_files(container, avro_name, summary_names)


def _decode_manifest_files(
    container: AvroContainer,
    name: Callable[[int], str | None],
    summary_names: tuple[str | None, ...] | None,
) -> list[ManifestFile]:
    location = container.location
    n_path, n_len, n_spec = name(500), name(501), name(502)
    n_content, n_seq, n_min_seq = name(517), name(515), name(516)
    n_snap = name(503)
    n_counts = [name(i) for i in (504, 505, 506, 512, 513, 514)]
    n_parts, n_key, n_row = name(507), name(519), name(520)
    contents = _CONTENT_BY_VALUE
    out: list[ManifestFile] = []
    index = 0
    try:
        for rec in container.records():
            get = rec.get
            parts = get(n_parts)
            summaries = None
            if parts is not None and summary_names is not None:
                cn, nan, lo, hi = summary_names
                summaries = [
                    PartitionFieldSummary(p[cn], p.get(nan), p.get(lo), p.get(hi)) for p in parts
                ]
            added, existing, deleted, added_rows, existing_rows, deleted_rows = (
                get(n) for n in n_counts
            )
            content = get(n_content)
            seq = get(n_seq)
            min_seq = get(n_min_seq)
            out.append(
                ManifestFile(
                    manifest_path=rec[n_path],
                    manifest_length=rec[n_len],
                    partition_spec_id=rec[n_spec],
                    content=contents[0 if content is None else content],
                    sequence_number=0 if seq is None else seq,
                    min_sequence_number=0 if min_seq is None else min_seq,
                    added_snapshot_id=get(n_snap),
                    added_files_count=added,
                    existing_files_count=existing,
                    deleted_files_count=deleted,
                    added_rows_count=added_rows,
                    existing_rows_count=existing_rows,
                    deleted_rows_count=deleted_rows,
                    partitions=summaries,
                    key_metadata=get(n_key),
                    first_row_id=get(n_row),
                )
            )
            index += 1
    except IcefloeError:
        raise
    except (KeyError, IndexError, TypeError, ValueError) as e:
        raise InvalidFileError(
            location, f"manifest list entry {index} is malformed: {type(e).__name__}: {e}"
        ) from e
    return out


def read_manifest_list_metadata(data: bytes, *, location: str = "manifest list") -> dict[str, str]:
    """The Iceberg key-value metadata of a manifest list (``snapshot-id``, ...)."""
    meta, _ = read_header(data, location)
    return {k: v for k, v in meta.items() if not k.startswith("avro.")}


__all__ = [
    "FIELD_SUMMARY_TYPE",
    "MANIFEST_FILE_STRUCTS",
    "UNASSIGNED_SEQ",
    "ManifestContent",
    "ManifestFile",
    "ManifestListWriter",
    "PartitionFieldSummary",
    "read_manifest_list",
    "read_manifest_list_metadata",
    "write_manifest_list",
]
