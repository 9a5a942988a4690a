"""The coordinator's event contract: the versioned JSON values icefloe exchanges over Kafka.

Writers never touch table metadata. They write data files, describe them in events, and one
coordinator per table turns the events into snapshots. This module is the whole contract
between them, as pydantic models with no Kafka import, so writers, the coordinator and tests
share one definition and one set of checks.

Wire format
-----------
Every value is one UTF-8 JSON object (compact, hyphenated field names, absent optional
fields omitted) with:

* ``type``: ``files-written``, ``commit-requested``, ``table-committed`` or ``dead-letter``;
* ``version``: the contract's major version, currently ``1``. A consumer refuses any other
  version (:class:`~icefloe.errors.UnsupportedFormatVersion`, naming it) rather than guess
  at its meaning. Within a version, producers may only *add* optional fields, and consumers
  ignore fields they do not know, so newer writers keep working with older coordinators;
* ``event-id``: unique per event, the key consumers deduplicate redeliveries by;
* ``produced-at-ms``: wall-clock milliseconds since the epoch when the event was made.

The Kafka key of ``files-written``, ``commit-requested`` and ``table-committed`` is the
table identifier (:func:`event_key`, ``ns.table``), so all of a table's events land on one
partition and are read in the order they were produced.

``files-written`` (writers → coordinator)
    ``table``, ``commit-id``, ``writer-id``, ``attempt-id``, ``schema-id``, ``spec-id``,
    ``data-files`` and ``delete-files`` (lists of Iceberg REST ``ContentFile`` objects, see
    :mod:`icefloe.spec.content_file`), ``complete`` (default false). Data files must be written
    with the event's spec; delete files may use any of the table's specs (a delete applies
    to data files of its own spec). The files are kept as raw JSON here and only checked
    against the table's schema and specs by :meth:`FilesWritten.decode_files`, because only
    the coordinator has those. With ``complete: true`` the event is a commit by itself (a
    streaming micro-batch): an ``append``, or a ``row-delta`` if it carries delete files,
    optionally with ``snapshot-properties`` and ``branch``.

``commit-requested`` (writer driver → coordinator)
    ``table``, ``commit-id``, ``operation`` (:class:`CommitOperation`), the files that make
    up the commit as ``event-ids`` and/or ``attempt-ids`` (a files-written event of this
    commit id is included when its event id or its attempt id is listed),
    ``snapshot-properties`` (string map; keys ``operation`` and ``icefloe.*`` are reserved
    for the coordinator), optional ``branch`` (default ``main``) and optional
    ``base-snapshot-id``, the snapshot the writer read, against which the coordinator
    validates conflicting changes. Per operation:

    * ``append``: adds the data files; needs at least one event or attempt id;
    * ``overwrite``: optional ``overwrite-filter`` (an expression in the JSON form of the
      expressions spec, kept raw): rows matching it are deleted, then the files are added.
      Without a filter it replaces the partitions the new files write (dynamic overwrite).
      Needs a filter or some files;
    * ``row-delta``: adds data files and the delete files of the named events; needs files;
    * ``rewrite``: ``rewritten-files`` lists the paths of the data or delete files the new
      files replace (compaction); it must not be empty;
    * ``upsert``: a change batch on a keyed table (one with ``identifier-field-ids``). Its
      data files hold the new row of each key; its delete files are *key files*: Parquet
      files of content ``equality-deletes`` whose ``equality-ids`` are the table's
      identifier fields, naming the keys whose existing rows are removed (every key the
      batch upserts or deletes). Key files are never committed: at commit the coordinator
      resolves their keys against the rows live in the table (and those of upserts before
      it in the same snapshot) into deletion vectors (v3) or position deletes (v2), so no
      equality delete ever reaches the table. Within one commit id a key appears at most
      once in the data files; upserts commit in the order of their commit-requested events
      on the partition. Needs files.

``table-committed`` (coordinator → results topic)
    ``table``, ``branch``, ``snapshot-id``, ``sequence-number``, ``metadata-location``, the
    ``commit-ids`` the snapshot contains (several when the coordinator batched commits),
    counts (``added-data-files``, ``added-delete-files``, ``removed-data-files``,
    ``removed-delete-files``, ``added-records``, ``added-files-size``), ``latency-ms`` (from
    the oldest included event's ``produced-at-ms`` to the commit) and ``orphan-files``:
    files written under these commit ids by attempts the commit did not name. They are in
    no snapshot, so their writers may delete them. Optional ``snapshot-expired`` (present
    only when true, so older readers never see it): true on an acknowledgement of a commit
    id whose snapshot has since been expired (by any engine). The commit id is then recorded in the table's dedup ledger (table
    property ``icefloe.dedup.ledger`` of ``metadata-location``): ``snapshot-id`` names the
    snapshot that applied it, ``branch`` is ``main``, and ``sequence-number`` and the
    counts are 0 (no longer known). The commit happened; never apply it again.

``dead-letter`` (any consumer → dead-letter topic)
    ``original`` (base64 of the refused value, byte for byte), optional ``original-key``,
    ``reason`` (the error message, naming the field), ``source-topic``,
    ``source-partition``, ``source-offset`` and, when it could be read, ``table``. A
    commit-requested the coordinator cannot apply (say, a rewritten file is gone) is
    dead-lettered the same way, so nothing is dropped silently.

Exactly once, from the event side
---------------------------------
Kafka delivers at least once and Spark retries tasks and jobs, so each piece carries an
identity the coordinator can check:

* the ``commit-id`` names one writer job or micro-batch. The coordinator records the commit
  ids it applied in the summary of the snapshot that contains them; a commit id already
  present in the table's history is acknowledged again (a new ``table-committed`` pointing
  at the earlier snapshot) instead of committed twice, so replays after a crash, a
  redelivered commit-requested, or a retried driver are harmless;
* the ``attempt-id`` tells apart the task or job attempts of one commit id. Only the files
  of the events or attempts the commit-requested names are committed; those of other
  attempts (a speculative task, a failed job attempt) are left out and reported in
  ``orphan-files`` for clean-up (:meth:`CommitRequested.select`);
* the ``event-id`` makes redelivery of a files-written event idempotent, and lets the
  coordinator check that every event a commit-requested names has arrived. Since a driver
  sends its commit-requested only after its tasks' events were acknowledged, and all of a
  table's events share a partition, those events are always read first.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal, Self

import pydantic
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    SerializerFunctionWrapHandler,
    StrictBool,
    StrictInt,
    StrictStr,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticSerializationError

from icefloe.errors import UnsupportedFormatVersion, ValidationError
from icefloe.expressions import BooleanExpression
from icefloe.expressions.json_form import parse_expression
from icefloe.spec.content_file import content_file_from_json, content_file_to_json
from icefloe.spec.datafile import DataFile, DataFileContent
from icefloe.spec.model import describe_loc, describe_problems, hyphenate
from icefloe.spec.partition import PartitionSpec
from icefloe.spec.schema import Schema
from icefloe.table.catalog import TableIdentifier

EVENT_VERSION = 1
"""The contract's major version. Adding optional fields keeps it; anything else bumps it."""

MAIN_BRANCH = "main"
RESERVED_PROPERTY_PREFIX = "icefloe."
"""Snapshot summary keys under this prefix belong to the coordinator (commit ids etc.)."""

_MIN_LONG = -(1 << 63)
_MAX_LONG = (1 << 63) - 1
_MAX_PROBLEMS = 3


class EventType(StrEnum):
    FILES_WRITTEN = "files-written"
    COMMIT_REQUESTED = "commit-requested"
    TABLE_COMMITTED = "table-committed"
    DEAD_LETTER = "dead-letter"


_EVENT_TYPES = frozenset(t.value for t in EventType)


class CommitOperation(StrEnum):
    """What a commit-requested asks for; the coordinator maps it to Iceberg's operations."""

    APPEND = "append"
    OVERWRITE = "overwrite"
    ROW_DELTA = "row-delta"
    REWRITE = "rewrite"
    UPSERT = "upsert"


def new_event_id() -> str:
    return uuid.uuid4().hex


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def event_key(table: str | TableIdentifier) -> bytes:
    """The Kafka key of a table's events: its identifier, so they share one partition."""
    return str(TableIdentifier.parse(table)).encode()


# -- field types -------------------------------------------------------------------------


def _table_name(text: str) -> str:
    return str(TableIdentifier.parse(text))


def _b64decode(value: Any) -> bytes:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)  # built in code: already the raw bytes
    if not isinstance(value, str):
        raise ValidationError(f"must be a base64 string, got {type(value).__name__}")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ValidationError(f"is not valid base64: {value!r:.60}") from None


def _b64encode(value: bytes) -> str:
    return base64.b64encode(value).decode("ascii")


def _unique(values: tuple[str, ...]) -> tuple[str, ...]:
    seen: set[str] = set()
    for v in values:
        if v in seen:
            raise ValidationError(f"{v!r} is listed twice")
        seen.add(v)
    return values


NonEmptyStr = Annotated[StrictStr, Field(min_length=1)]
NonNegativeInt = Annotated[StrictInt, Field(ge=0, le=_MAX_LONG)]
Long = Annotated[StrictInt, Field(ge=_MIN_LONG, le=_MAX_LONG)]
TableName = Annotated[StrictStr, AfterValidator(_table_name)]
Base64Bytes = Annotated[
    bytes, PlainValidator(_b64decode), PlainSerializer(_b64encode, when_used="json")
]
UniqueStrs = Annotated[tuple[NonEmptyStr, ...], AfterValidator(_unique)]
ContentFileJson = dict[StrictStr, Any]


# -- errors ------------------------------------------------------------------------------


def _field(loc: Sequence[int | str]) -> str:
    return f"field {describe_loc(loc)!r}"


def _what(event_type: Any, event_id: Any) -> str:
    """How messages name an event: by type and id when those are known and sane."""
    known = isinstance(event_type, str) and event_type in _EVENT_TYPES
    name = f"{event_type} event" if known else "event"
    return f"{name} {event_id!r:.80}" if isinstance(event_id, str) and event_id else name


def _translate(err: pydantic.ValidationError, what: str) -> ValidationError:
    """One icefloe error for pydantic's list: the first few problems, each naming its field.

    An unsupported version stays UnsupportedFormatVersion, so callers can tell "upgrade
    needed" from a malformed event.
    """
    message = f"invalid {what}: {describe_problems(err, _field, limit=_MAX_PROBLEMS)}"
    if any(
        isinstance((e.get("ctx") or {}).get("error"), UnsupportedFormatVersion)
        for e in err.errors()
    ):
        return UnsupportedFormatVersion(message)
    return ValidationError(message)


def _unsupported_version(version: int, what: str | None = None) -> UnsupportedFormatVersion:
    return UnsupportedFormatVersion(
        (f"{what}: " if what else "")
        + f"version {version} is not supported: this icefloe reads version "
        f"{EVENT_VERSION}; upgrade the consumer or have the producer write version "
        f"{EVENT_VERSION}"
    )


# -- models ------------------------------------------------------------------------------


class _EventModel(BaseModel):
    """Common fields and wire rules of every event.

    ``__init__`` is wrapped so that code building an event from bad values gets the same
    typed, field-naming :class:`ValidationError` as a consumer parsing bad bytes.
    """

    model_config = ConfigDict(
        alias_generator=hyphenate,
        populate_by_name=True,
        frozen=True,
        extra="ignore",
        ser_json_inf_nan="constants",
    )

    event_type: ClassVar[EventType]

    version: StrictInt = EVENT_VERSION
    event_id: NonEmptyStr = Field(default_factory=new_event_id)
    produced_at_ms: NonNegativeInt = Field(default_factory=now_ms)

    def __init__(self, /, **data: Any) -> None:
        try:
            super().__init__(**data)
        except pydantic.ValidationError as e:
            event_id = data.get("event_id", data.get("event-id"))
            raise _translate(e, _what(self.event_type.value, event_id)) from None

    @field_validator("version")
    @classmethod
    def _known_version(cls, version: int) -> int:
        if version != EVENT_VERSION:
            raise _unsupported_version(version)
        return version

    @model_serializer(mode="wrap")
    def _type_first(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # Humans reading a topic look for the type first.
        out: dict[str, Any] = handler(self)
        return {"type": out.pop("type"), **out} if "type" in out else out

    def encode(self) -> bytes:
        """Compact UTF-8 JSON by the hyphenated names, absent optional fields left out."""
        try:
            return self.model_dump_json(by_alias=True, exclude_none=True).encode()
        except PydanticSerializationError as e:  # e.g. a lone surrogate in a raw file dict
            raise ValidationError(
                f"{_what(self.event_type.value, self.event_id)} cannot be encoded as JSON: {e}"
            ) from None


class FilesWritten(_EventModel):
    """Files one writer attempt produced for a commit (or, if ``complete``, a whole commit)."""

    event_type: ClassVar[EventType] = EventType.FILES_WRITTEN

    type: Literal["files-written"] = "files-written"
    table: TableName
    commit_id: NonEmptyStr
    writer_id: NonEmptyStr
    attempt_id: NonEmptyStr
    schema_id: NonNegativeInt
    spec_id: NonNegativeInt
    data_files: tuple[ContentFileJson, ...] = ()
    delete_files: tuple[ContentFileJson, ...] = ()
    complete: StrictBool = False
    snapshot_properties: dict[StrictStr, StrictStr] | None = None
    branch: NonEmptyStr | None = None

    @field_validator("data_files", "delete_files")
    @classmethod
    def _file_paths(cls, files: tuple[ContentFileJson, ...]) -> tuple[ContentFileJson, ...]:
        # Only the shape every content file has regardless of the table; the rest needs
        # the table's schema and specs (decode_files).
        for i, f in enumerate(files):
            path = f.get("file-path")
            if not isinstance(path, str) or not path:
                raise ValidationError(f"content file [{i}] has no 'file-path': {f!r:.100}")
        return files

    @field_validator("snapshot_properties")
    @classmethod
    def _properties(cls, props: dict[str, str] | None) -> dict[str, str] | None:
        return None if props is None else _check_properties(props)

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        seen: set[str] = set()
        for key, files in (("data-files", self.data_files), ("delete-files", self.delete_files)):
            for i, f in enumerate(files):
                path = f["file-path"]
                if path in seen:
                    raise ValidationError(f"{key}[{i}]: file {path!r} is listed twice")
                seen.add(path)
        if not self.complete:
            for key, value in (
                ("snapshot-properties", self.snapshot_properties),
                ("branch", self.branch),
            ):
                if value is not None:
                    raise ValidationError(
                        f"{key!r} is only allowed with 'complete': true; put it on the "
                        "commit-requested event instead"
                    )
        return self

    @property
    def identifier(self) -> TableIdentifier:
        return TableIdentifier.parse(self.table)

    @property
    def file_paths(self) -> list[str]:
        """Paths of all data and delete files, e.g. to report them for clean-up."""
        return [f["file-path"] for f in (*self.data_files, *self.delete_files)]

    @classmethod
    def from_data_files(
        cls,
        table: str | TableIdentifier,
        commit_id: str,
        writer_id: str,
        attempt_id: str,
        schema: Schema,
        spec: PartitionSpec,
        data_files: Iterable[DataFile],
        delete_files: Iterable[DataFile] = (),
        complete: bool = False,
        *,
        specs: Mapping[int, PartitionSpec] | None = None,
        stats_fields: set[int] | None = None,
        snapshot_properties: Mapping[str, str] | None = None,
        branch: str | None = None,
        event_id: str | None = None,
        produced_at_ms: int | None = None,
    ) -> FilesWritten:
        """Describe files a writer produced, checking them before anything is published.

        ``specs`` types the partitions of delete files written with another of the table's
        specs; ``stats_fields`` limits column metrics to those columns (None = all).
        """
        all_specs = {**(specs or {}), spec.spec_id: spec}
        encoded: dict[str, list[dict[str, Any]]] = {"data-files": [], "delete-files": []}
        for key, files, want_data in (
            ("data-files", data_files, True),
            ("delete-files", delete_files, False),
        ):
            for i, df in enumerate(files):
                where = f"{key}[{i}] {df.file_path!r}"
                if (df.content == DataFileContent.DATA) != want_data:
                    raise ValidationError(
                        f"{where}: a {df.content.name.lower()} file cannot be listed in {key}"
                    )
                file_spec = all_specs.get(df.spec_id)
                if file_spec is None:
                    raise ValidationError(
                        f"{where}: spec id {df.spec_id} is not among the given specs "
                        f"{sorted(all_specs)}"
                    )
                if want_data and df.spec_id != spec.spec_id:
                    raise ValidationError(
                        f"{where}: written with spec {df.spec_id}, but the event's spec is "
                        f"{spec.spec_id}"
                    )
                if len(df.partition) != len(file_spec.fields):
                    raise ValidationError(
                        f"{where}: partition has {len(df.partition)} value(s), spec "
                        f"{df.spec_id} has {len(file_spec.fields)} field(s)"
                    )
                df.validate()
                encoded[key].append(content_file_to_json(df, file_spec, schema, stats_fields))
        fields: dict[str, Any] = {
            "table": str(TableIdentifier.parse(table)),
            "commit_id": commit_id,
            "writer_id": writer_id,
            "attempt_id": attempt_id,
            "schema_id": schema.schema_id,
            "spec_id": spec.spec_id,
            "data_files": encoded["data-files"],
            "delete_files": encoded["delete-files"],
            "complete": complete,
            "snapshot_properties": None
            if snapshot_properties is None
            else dict(snapshot_properties),
            "branch": branch,
        }
        if event_id is not None:
            fields["event_id"] = event_id
        if produced_at_ms is not None:
            fields["produced_at_ms"] = produced_at_ms
        return cls(**fields)

    def decode_files(
        self, schema: Schema, specs: Mapping[int, PartitionSpec]
    ) -> tuple[list[DataFile], list[DataFile]]:
        """The event's (data files, delete files), validated against the table.

        ``schema`` must be the table's schema with the event's ``schema-id``: bounds are
        typed by it. Raises a ValidationError naming the event and the file.
        """
        what = _what(self.type, self.event_id)
        if schema.schema_id != self.schema_id:
            raise ValidationError(
                f"{what}: files were written with schema {self.schema_id}, but schema "
                f"{schema.schema_id} was given to decode them"
            )
        if self.spec_id not in specs:
            raise ValidationError(
                f"{what}: 'spec-id' {self.spec_id} is not a partition spec of table "
                f"{self.table} (known: {sorted(specs)})"
            )
        out: dict[str, list[DataFile]] = {"data-files": [], "delete-files": []}
        for key, files, want_data in (
            ("data-files", self.data_files, True),
            ("delete-files", self.delete_files, False),
        ):
            for i, raw in enumerate(files):
                try:
                    df = content_file_from_json(raw, specs=specs, schema=schema)
                except ValidationError as e:
                    raise ValidationError(f"{what}: {key}[{i}]: {e}") from None
                where = f"{what}: {key}[{i}]: {df.file_path}"
                if (df.content == DataFileContent.DATA) != want_data:
                    raise ValidationError(
                        f"{where}: content {df.content.name.lower()!r} does not belong in {key}"
                    )
                if want_data and df.spec_id != self.spec_id:
                    raise ValidationError(
                        f"{where}: 'spec-id' is {df.spec_id}, but the event's is {self.spec_id}"
                    )
                out[key].append(df)
        return out["data-files"], out["delete-files"]

    def as_commit_request(self) -> CommitRequested:
        """The commit a ``complete`` event stands for, so the coordinator has one path.

        It reuses this event's id and time: it is never published, only applied.
        """
        if not self.complete:
            raise ValidationError(
                f"{_what(self.type, self.event_id)} is not complete; its commit comes from "
                f"a commit-requested event for commit id {self.commit_id!r}"
            )
        return CommitRequested(
            event_id=self.event_id,
            produced_at_ms=self.produced_at_ms,
            table=self.table,
            commit_id=self.commit_id,
            operation=CommitOperation.ROW_DELTA if self.delete_files else CommitOperation.APPEND,
            event_ids=(self.event_id,),
            snapshot_properties=dict(self.snapshot_properties or {}),
            branch=self.branch,
        )


def _check_properties(props: dict[str, str]) -> dict[str, str]:
    for key in props:
        if key == "operation" or key.startswith(RESERVED_PROPERTY_PREFIX):
            raise ValidationError(
                f"key {key!r} is reserved for the coordinator (reserved: 'operation' and "
                f"'{RESERVED_PROPERTY_PREFIX}*')"
            )
    return props


@dataclass(frozen=True, slots=True)
class CommitSelection:
    """Which files-written events of one commit id a commit-requested takes.

    ``excluded`` are events of other attempts: their files are reported for clean-up.
    ``missing_event_ids`` are named events that were not among those offered.
    """

    selected: tuple[FilesWritten, ...]
    excluded: tuple[FilesWritten, ...]
    missing_event_ids: frozenset[str]

    @property
    def orphan_files(self) -> list[str]:
        return [path for event in self.excluded for path in event.file_paths]


class CommitRequested(_EventModel):
    """A writer driver's request to commit the files of some attempts of one commit id."""

    event_type: ClassVar[EventType] = EventType.COMMIT_REQUESTED

    type: Literal["commit-requested"] = "commit-requested"
    table: TableName
    commit_id: NonEmptyStr
    operation: CommitOperation
    event_ids: UniqueStrs = ()
    attempt_ids: UniqueStrs = ()
    overwrite_filter: dict[StrictStr, Any] | StrictBool | None = None
    rewritten_files: UniqueStrs = ()
    snapshot_properties: dict[StrictStr, StrictStr] = Field(default_factory=dict)
    branch: NonEmptyStr | None = None
    base_snapshot_id: Long | None = None

    @field_validator("overwrite_filter")
    @classmethod
    def _filter_parses(cls, value: dict[str, Any] | bool | None) -> dict[str, Any] | bool | None:
        if value is not None:
            parse_expression(value)  # refuse a malformed filter now, not at commit time
        return value

    @field_validator("snapshot_properties")
    @classmethod
    def _properties(cls, props: dict[str, str]) -> dict[str, str]:
        return _check_properties(props)

    @model_validator(mode="after")
    def _fits_operation(self) -> Self:
        op = self.operation
        has_files = bool(self.event_ids or self.attempt_ids)
        if self.overwrite_filter is not None and op != CommitOperation.OVERWRITE:
            raise ValidationError(f"'overwrite-filter' is only allowed for overwrite, not {op}")
        if self.rewritten_files and op != CommitOperation.REWRITE:
            raise ValidationError(f"'rewritten-files' is only allowed for rewrite, not {op}")
        if op == CommitOperation.REWRITE and not self.rewritten_files:
            raise ValidationError("a rewrite must list the files it replaces in 'rewritten-files'")
        if (
            op in (CommitOperation.APPEND, CommitOperation.ROW_DELTA, CommitOperation.UPSERT)
            and not has_files
        ):
            raise ValidationError(
                f"{op} names no files: list the writers' 'event-ids' or 'attempt-ids'"
            )
        if op == CommitOperation.OVERWRITE and not has_files and self.overwrite_filter is None:
            raise ValidationError(
                "an overwrite needs an 'overwrite-filter' or files ('event-ids'/'attempt-ids')"
            )
        return self

    @property
    def identifier(self) -> TableIdentifier:
        return TableIdentifier.parse(self.table)

    @property
    def target_branch(self) -> str:
        return self.branch or MAIN_BRANCH

    def overwrite_expression(self) -> BooleanExpression | None:
        """The parsed (unbound) overwrite filter, or None when there is none."""
        return None if self.overwrite_filter is None else parse_expression(self.overwrite_filter)

    def selects(self, event: FilesWritten) -> bool:
        """Whether ``event``'s files belong to this commit (same table and commit id, named)."""
        return (
            not event.complete
            and event.table == self.table
            and event.commit_id == self.commit_id
            and (event.event_id in self.event_ids or event.attempt_id in self.attempt_ids)
        )

    def select(self, events: Iterable[FilesWritten]) -> CommitSelection:
        """Split the files-written events of this commit id into taken and left out.

        Events of other tables or commit ids, and complete events (commits of their own),
        are in neither list. Redeliveries of one event id count once.
        """
        selected: dict[str, FilesWritten] = {}
        excluded: dict[str, FilesWritten] = {}
        for event in events:
            if event.complete or event.table != self.table or event.commit_id != self.commit_id:
                continue
            bucket = selected if self.selects(event) else excluded
            bucket.setdefault(event.event_id, event)
        return CommitSelection(
            selected=tuple(selected.values()),
            excluded=tuple(excluded.values()),
            missing_event_ids=frozenset(self.event_ids) - selected.keys(),
        )


class TableCommitted(_EventModel):
    """The coordinator's result: a new snapshot and the commits it applied."""

    event_type: ClassVar[EventType] = EventType.TABLE_COMMITTED

    type: Literal["table-committed"] = "table-committed"
    table: TableName
    branch: NonEmptyStr = MAIN_BRANCH
    snapshot_id: Long
    sequence_number: NonNegativeInt
    metadata_location: NonEmptyStr
    commit_ids: Annotated[UniqueStrs, Field(min_length=1)]
    added_data_files: NonNegativeInt = 0
    added_delete_files: NonNegativeInt = 0
    removed_data_files: NonNegativeInt = 0
    removed_delete_files: NonNegativeInt = 0
    added_records: NonNegativeInt = 0
    added_files_size: NonNegativeInt = 0
    latency_ms: NonNegativeInt
    orphan_files: tuple[NonEmptyStr, ...] = ()
    snapshot_expired: bool | None = None  # true only; left out otherwise (older readers)

    @property
    def identifier(self) -> TableIdentifier:
        return TableIdentifier.parse(self.table)


class DeadLetter(_EventModel):
    """A value a consumer refused, kept byte for byte with where it came from and why."""

    event_type: ClassVar[EventType] = EventType.DEAD_LETTER

    type: Literal["dead-letter"] = "dead-letter"
    original: Base64Bytes
    original_key: Base64Bytes | None = None
    reason: NonEmptyStr
    source_topic: NonEmptyStr
    source_partition: NonNegativeInt
    source_offset: NonNegativeInt
    table: TableName | None = None

    @classmethod
    def for_bytes(
        cls,
        original: bytes,
        reason: str,
        topic: str,
        partition: int,
        offset: int,
        *,
        key: bytes | None = None,
        table: str | TableIdentifier | None = None,
    ) -> DeadLetter:
        return cls(
            original=bytes(original),
            original_key=None if key is None else bytes(key),
            reason=reason,
            source_topic=topic,
            source_partition=partition,
            source_offset=offset,
            table=None if table is None else str(TableIdentifier.parse(table)),
        )


Event = Annotated[
    FilesWritten | CommitRequested | TableCommitted | DeadLetter, Field(discriminator="type")
]
_MODELS: dict[str, type[FilesWritten | CommitRequested | TableCommitted | DeadLetter]] = {
    m.event_type.value: m for m in (FilesWritten, CommitRequested, TableCommitted, DeadLetter)
}
_REQUIRED_ON_WIRE = ("event-id", "produced-at-ms")


def parse_event(data: bytes) -> Event:
    """Decode one Kafka value; every problem is a ValidationError naming the field.

    An event of another major version raises UnsupportedFormatVersion (a ValidationError)
    before anything else is read, since its fields may mean something else.
    """
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValidationError(f"event is not UTF-8 text: byte {e.start} is invalid") from None
    except TypeError:
        raise ValidationError(f"event must be bytes, got {type(data).__name__}") from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValidationError(
            f"event is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}"
        ) from None
    except RecursionError:
        raise ValidationError("event JSON is nested too deeply") from None
    if not isinstance(obj, dict):
        raise ValidationError(f"event must be a JSON object, got {type(obj).__name__}")
    what = _what(obj.get("type"), obj.get("event-id"))
    for key in ("type", "version", *_REQUIRED_ON_WIRE):
        if key not in obj:
            raise ValidationError(f"invalid {what}: missing required field {key!r}")
    version = obj["version"]
    if isinstance(version, bool) or not isinstance(version, int):
        raise ValidationError(
            f"invalid {what}: field 'version' must be an integer, got {version!r:.40}"
        )
    if version != EVENT_VERSION:
        raise _unsupported_version(version, what)
    model = _MODELS.get(obj["type"]) if isinstance(obj["type"], str) else None
    if model is None:
        raise ValidationError(
            f"invalid {what}: field 'type': unknown event type {obj['type']!r:.40}; expected "
            f"one of {list(_MODELS)}"
        )
    # The model's __init__ turns pydantic's errors into one naming the fields.
    return model(**obj)


def encode_event(event: Event) -> bytes:
    """The Kafka value of ``event``: what :func:`parse_event` reads back as an equal event."""
    return event.encode()
