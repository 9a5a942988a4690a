"""Snapshots and what table metadata says about them (spec: "Snapshots", "Snapshot
References", "Table Statistics", "Partition Statistics", Appendix C and Appendix F).

These are pydantic models whose field aliases are the spec's hyphenated JSON names, so the
same classes read table metadata, REST ``add-snapshot`` updates and Kafka events. They are
immutable: a commit never edits a snapshot, it adds a new one.

Version rules that depend on the table (``sequence-number`` absent in v1, ``operation``
required from v2, row lineage in v3) are checked by :mod:`icefloe.spec.metadata`, which knows the
format version; the models here only check what holds in every version.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from enum import StrEnum
from typing import Any, ClassVar

from pydantic import Field, StrictInt, StrictStr, model_validator
from pydantic_core import core_schema

from icefloe.errors import ValidationError
from icefloe.spec.model import IcebergModel, hyphenate

MAIN_BRANCH = "main"
INITIAL_SEQUENCE_NUMBER = 0
_MAX_LONG = (1 << 63) - 1

# -- operation and summary ---------------------------------------------------------------


class Operation(StrEnum):
    """The snapshot summary's ``operation``: lets expiry and planning skip snapshots cheaply."""

    APPEND = "append"
    REPLACE = "replace"
    OVERWRITE = "overwrite"
    DELETE = "delete"

    def __str__(self) -> str:
        return self.value


class Summary(Mapping[str, str]):
    """A snapshot summary: ``operation`` plus string-valued metrics and engine fields.

    It reads like the JSON string map (``summary["total-records"]``), while ``operation``
    is typed. Values stay strings, as the spec stores them, so keys unknown to icefloe
    round-trip untouched.
    """

    __slots__ = ("_operation", "_properties")

    OPERATION: ClassVar[str] = "operation"
    ADDED_DATA_FILES: ClassVar[str] = "added-data-files"
    DELETED_DATA_FILES: ClassVar[str] = "deleted-data-files"
    TOTAL_DATA_FILES: ClassVar[str] = "total-data-files"
    ADDED_DELETE_FILES: ClassVar[str] = "added-delete-files"
    ADDED_EQUALITY_DELETE_FILES: ClassVar[str] = "added-equality-delete-files"
    REMOVED_EQUALITY_DELETE_FILES: ClassVar[str] = "removed-equality-delete-files"
    ADDED_POSITION_DELETE_FILES: ClassVar[str] = "added-position-delete-files"
    REMOVED_POSITION_DELETE_FILES: ClassVar[str] = "removed-position-delete-files"
    ADDED_DVS: ClassVar[str] = "added-dvs"
    REMOVED_DVS: ClassVar[str] = "removed-dvs"
    REMOVED_DELETE_FILES: ClassVar[str] = "removed-delete-files"
    TOTAL_DELETE_FILES: ClassVar[str] = "total-delete-files"
    ADDED_RECORDS: ClassVar[str] = "added-records"
    DELETED_RECORDS: ClassVar[str] = "deleted-records"
    TOTAL_RECORDS: ClassVar[str] = "total-records"
    ADDED_FILES_SIZE: ClassVar[str] = "added-files-size"
    REMOVED_FILES_SIZE: ClassVar[str] = "removed-files-size"
    TOTAL_FILES_SIZE: ClassVar[str] = "total-files-size"
    ADDED_POSITION_DELETES: ClassVar[str] = "added-position-deletes"
    REMOVED_POSITION_DELETES: ClassVar[str] = "removed-position-deletes"
    TOTAL_POSITION_DELETES: ClassVar[str] = "total-position-deletes"
    ADDED_EQUALITY_DELETES: ClassVar[str] = "added-equality-deletes"
    REMOVED_EQUALITY_DELETES: ClassVar[str] = "removed-equality-deletes"
    TOTAL_EQUALITY_DELETES: ClassVar[str] = "total-equality-deletes"
    DELETED_DUPLICATE_FILES: ClassVar[str] = "deleted-duplicate-files"
    CHANGED_PARTITION_COUNT: ClassVar[str] = "changed-partition-count"
    MANIFESTS_CREATED: ClassVar[str] = "manifests-created"
    MANIFESTS_KEPT: ClassVar[str] = "manifests-kept"
    MANIFESTS_REPLACED: ClassVar[str] = "manifests-replaced"
    ENTRIES_PROCESSED: ClassVar[str] = "entries-processed"
    WAP_ID: ClassVar[str] = "wap.id"
    PUBLISHED_WAP_ID: ClassVar[str] = "published-wap-id"
    SOURCE_SNAPSHOT_ID: ClassVar[str] = "source-snapshot-id"
    ENGINE_NAME: ClassVar[str] = "engine-name"
    ENGINE_VERSION: ClassVar[str] = "engine-version"

    def __init__(
        self,
        operation: Operation | str | None,
        properties: Mapping[str, str] | None = None,
    ) -> None:
        if operation is not None and not isinstance(operation, Operation):
            try:
                operation = Operation(operation)
            except ValueError:
                raise ValidationError(
                    f"snapshot summary has unknown operation {operation!r}; expected one of "
                    f"{[o.value for o in Operation]}"
                ) from None
        props: dict[str, str] = {}
        for key, value in (properties or {}).items():
            if key == self.OPERATION:
                continue
            if not isinstance(key, str) or not isinstance(value, str):
                raise ValidationError(
                    f"snapshot summary values must be strings: {key!r} is {value!r:.80}"
                )
            props[key] = value
        self._operation: Operation | None = operation
        self._properties = props

    @property
    def operation(self) -> Operation | None:
        return self._operation

    @property
    def properties(self) -> dict[str, str]:
        """Everything but ``operation`` (a copy)."""
        return dict(self._properties)

    def __getitem__(self, key: str) -> str:
        if key == self.OPERATION and self._operation is not None:
            return self._operation.value
        return self._properties[key]

    def __iter__(self) -> Iterator[str]:
        if self._operation is not None:
            yield self.OPERATION
        yield from self._properties

    def __len__(self) -> int:
        return len(self._properties) + (self._operation is not None)

    def get_int(self, key: str) -> int | None:
        """A numeric metric, or None when absent or not a number (engines write junk)."""
        value = self._properties.get(key)
        if value is None:
            return None
        try:
            return int(value)
        except ValueError:
            return None

    def to_json(self) -> dict[str, str]:
        return dict(self.items())

    @classmethod
    def from_json(cls, obj: Any) -> Summary:
        if isinstance(obj, Summary):
            return obj
        if not isinstance(obj, Mapping):
            raise ValidationError(f"snapshot summary must be a JSON object, got {obj!r:.100}")
        operation = obj.get(cls.OPERATION)
        if operation is not None and not isinstance(operation, str | Operation):
            raise ValidationError(f"snapshot summary 'operation' must be a string: {operation!r}")
        return cls(operation, {k: v for k, v in obj.items() if k != cls.OPERATION})

    def __repr__(self) -> str:
        return f"Summary({self.to_json()!r})"

    def __hash__(self) -> int:
        # Equal summaries hash alike, so frozen snapshots can key sets and dicts.
        return hash(tuple(sorted(self.items())))

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(
            cls.from_json,
            serialization=core_schema.plain_serializer_function_ser_schema(
                lambda s: s.to_json(), when_used="always"
            ),
        )


# (total, added, removed) triples, the totals a new snapshot carries forward.
_TOTALS: tuple[tuple[str, str, str], ...] = (
    (Summary.TOTAL_RECORDS, Summary.ADDED_RECORDS, Summary.DELETED_RECORDS),
    (Summary.TOTAL_FILES_SIZE, Summary.ADDED_FILES_SIZE, Summary.REMOVED_FILES_SIZE),
    (Summary.TOTAL_DATA_FILES, Summary.ADDED_DATA_FILES, Summary.DELETED_DATA_FILES),
    (Summary.TOTAL_DELETE_FILES, Summary.ADDED_DELETE_FILES, Summary.REMOVED_DELETE_FILES),
    (
        Summary.TOTAL_POSITION_DELETES,
        Summary.ADDED_POSITION_DELETES,
        Summary.REMOVED_POSITION_DELETES,
    ),
    (
        Summary.TOTAL_EQUALITY_DELETES,
        Summary.ADDED_EQUALITY_DELETES,
        Summary.REMOVED_EQUALITY_DELETES,
    ),
)


def update_totals(previous: Mapping[str, str] | None, added: Mapping[str, str]) -> dict[str, str]:
    """The new snapshot's summary: ``added`` (its deltas) plus the running ``total-*`` values.

    Each total is the previous snapshot's total plus the added minus the removed count. With
    no previous snapshot every total starts at 0. A total the previous summary lacks (or holds
    as junk) is left out rather than guessed, and a total that would go negative is dropped,
    since either means the history is not trustworthy enough to carry a count forward.
    """
    out = dict(added)
    base: Mapping[str, str] = (
        previous if previous is not None else dict.fromkeys((t for t, _, _ in _TOTALS), "0")
    )
    for total_key, added_key, removed_key in _TOTALS:
        out.pop(total_key, None)
        try:
            total = int(base[total_key])
            total += int(added.get(added_key, "0"))
            total -= int(added.get(removed_key, "0"))
        except (KeyError, ValueError):
            continue
        if total >= 0:
            out[total_key] = str(total)
    return out


# -- snapshots ----------------------------------------------------------------------------


def generate_snapshot_id() -> int:
    """A positive random snapshot id, made as Appendix F recommends (UUID halves XORed)."""
    bits = uuid.uuid4().int
    return ((bits >> 64) ^ (bits & ((1 << 64) - 1))) & _MAX_LONG


class Snapshot(IcebergModel):
    """One table state: a manifest list (or, in v1, a list of manifests) and its summary."""

    snapshot_id: StrictInt
    parent_snapshot_id: StrictInt | None = None
    sequence_number: StrictInt = INITIAL_SEQUENCE_NUMBER
    timestamp_ms: StrictInt
    manifest_list: StrictStr | None = None
    manifests: tuple[StrictStr, ...] | None = None
    summary: Summary | None = None
    schema_id: StrictInt | None = None
    first_row_id: StrictInt | None = None
    added_rows: StrictInt | None = None
    key_id: StrictStr | None = None

    @model_validator(mode="after")
    def _check(self) -> Snapshot:
        where = f"snapshot {self.snapshot_id}"
        if self.manifest_list is not None and self.manifests is not None:
            raise ValidationError(
                f"{where}: 'manifests' must be omitted when 'manifest-list' is set"
            )
        if self.manifest_list is None and self.manifests is None:
            raise ValidationError(f"{where}: missing required field 'manifest-list'")
        if self.sequence_number < 0:
            raise ValidationError(f"{where}: 'sequence-number' is negative")
        if self.first_row_id is not None and self.first_row_id < 0:
            raise ValidationError(f"{where}: 'first-row-id' is negative ({self.first_row_id})")
        if self.added_rows is not None and self.added_rows < 0:
            raise ValidationError(f"{where}: 'added-rows' is negative ({self.added_rows})")
        return self

    @property
    def operation(self) -> Operation | None:
        return None if self.summary is None else self.summary.operation

    def __str__(self) -> str:
        op = f"{self.operation}: " if self.operation else ""
        return f"{op}id={self.snapshot_id}, parent_id={self.parent_snapshot_id}"


class SnapshotRefType(StrEnum):
    BRANCH = "branch"
    TAG = "tag"

    def __str__(self) -> str:
        return self.value


class SnapshotRef(IcebergModel):
    """A branch or tag. Retention fields left unset fall back to the table properties."""

    snapshot_id: StrictInt
    ref_type: SnapshotRefType = Field(validation_alias="type", serialization_alias="type")
    min_snapshots_to_keep: StrictInt | None = None
    max_snapshot_age_ms: StrictInt | None = None
    max_ref_age_ms: StrictInt | None = None

    @model_validator(mode="after")
    def _check(self) -> SnapshotRef:
        for name in ("min_snapshots_to_keep", "max_snapshot_age_ms", "max_ref_age_ms"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValidationError(
                    f"snapshot ref: {hyphenate(name)!r} must be positive, got {value}"
                )
        if self.ref_type == SnapshotRefType.TAG:
            if self.min_snapshots_to_keep is not None:
                raise ValidationError("a tag cannot set 'min-snapshots-to-keep' (branches only)")
            if self.max_snapshot_age_ms is not None:
                raise ValidationError("a tag cannot set 'max-snapshot-age-ms' (branches only)")
        return self

    @classmethod
    def branch(
        cls,
        snapshot_id: int,
        *,
        min_snapshots_to_keep: int | None = None,
        max_snapshot_age_ms: int | None = None,
        max_ref_age_ms: int | None = None,
    ) -> SnapshotRef:
        return cls(
            snapshot_id=snapshot_id,
            ref_type=SnapshotRefType.BRANCH,
            min_snapshots_to_keep=min_snapshots_to_keep,
            max_snapshot_age_ms=max_snapshot_age_ms,
            max_ref_age_ms=max_ref_age_ms,
        )

    @classmethod
    def tag(cls, snapshot_id: int, *, max_ref_age_ms: int | None = None) -> SnapshotRef:
        return cls(
            snapshot_id=snapshot_id, ref_type=SnapshotRefType.TAG, max_ref_age_ms=max_ref_age_ms
        )

    @property
    def is_branch(self) -> bool:
        return self.ref_type == SnapshotRefType.BRANCH


class SnapshotLogEntry(IcebergModel):
    """One change of the current snapshot; time travel reads these, not the parent chain."""

    snapshot_id: StrictInt
    timestamp_ms: StrictInt


class MetadataLogEntry(IcebergModel):
    """A previous metadata file, so old table versions can be found (and cleaned up)."""

    metadata_file: StrictStr
    timestamp_ms: StrictInt


class BlobMetadata(IcebergModel):
    """One statistic inside a Puffin statistics file."""

    type: StrictStr
    snapshot_id: StrictInt
    sequence_number: StrictInt
    fields: tuple[StrictInt, ...]
    properties: dict[StrictStr, StrictStr] | None = None


class StatisticsFile(IcebergModel):
    """A Puffin table-statistics file registered for one snapshot (informational only)."""

    snapshot_id: StrictInt
    statistics_path: StrictStr
    file_size_in_bytes: StrictInt
    file_footer_size_in_bytes: StrictInt
    key_metadata: StrictStr | None = None
    blob_metadata: tuple[BlobMetadata, ...]


class PartitionStatisticsFile(IcebergModel):
    """A partition-statistics file; at most one per snapshot."""

    snapshot_id: StrictInt
    statistics_path: StrictStr
    file_size_in_bytes: StrictInt


__all__ = [
    "INITIAL_SEQUENCE_NUMBER",
    "MAIN_BRANCH",
    "BlobMetadata",
    "MetadataLogEntry",
    "Operation",
    "PartitionStatisticsFile",
    "Snapshot",
    "SnapshotLogEntry",
    "SnapshotRef",
    "SnapshotRefType",
    "StatisticsFile",
    "Summary",
    "generate_snapshot_id",
    "update_totals",
]
