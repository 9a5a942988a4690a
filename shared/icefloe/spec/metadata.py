"""Table metadata, format versions 1 to 3 (spec: "Table Metadata", Appendix C, Appendix E).

One model serves every format version. Reading normalizes the older forms the way Appendix
E says to (a v1 ``schema`` becomes ``schemas``, ``partition-spec`` becomes
``partition-specs``, missing sequence numbers become 0, ``current-snapshot-id: -1`` means
no snapshot), so code that uses the metadata never branches on the version. Writing goes the
other way and produces, per version, the JSON that Java and PyIceberg expect: v1 repeats
the current schema and spec in their deprecated singular fields, v1 and v2 write ``-1`` for
"no current snapshot", v3 writes ``null``.

The model is immutable and validated as a whole (ids exist, refs point at snapshots, ids
never go backwards) so a commit can only ever publish consistent metadata; new versions are
made with :class:`icefloe.spec.metadata_builder.MetadataBuilder`.
"""

from __future__ import annotations

import gzip
import json
import uuid
import zlib
from collections.abc import Iterator
from typing import Any

from pydantic import (
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    field_validator,
    model_serializer,
    model_validator,
)

from icefloe.errors import (
    InvalidFileError,
    NotFoundError,
    ValidationError,
)
from icefloe.spec.format_version import check_format_version, check_format_version_in
from icefloe.spec.model import IcebergModel, model_from_json
from icefloe.spec.partition import PARTITION_FIELD_ID_START, PartitionSpec
from icefloe.spec.schema import MAX_FIELD_ID, Schema
from icefloe.spec.snapshot import (
    INITIAL_SEQUENCE_NUMBER,
    MAIN_BRANCH,
    MetadataLogEntry,
    PartitionStatisticsFile,
    Snapshot,
    SnapshotLogEntry,
    SnapshotRef,
    SnapshotRefType,
    StatisticsFile,
    generate_snapshot_id,
)
from icefloe.spec.sort_order import SortOrder

DEFAULT_FORMAT_VERSION = 2
# First version that writes JSON null instead of -1 for "no current snapshot" (Appendix F).
MIN_NULL_CURRENT_SNAPSHOT_VERSION = 3
# First version with row lineage (``next-row-id``, snapshot ``first-row-id``).
MIN_ROW_LINEAGE_VERSION = 3
INITIAL_SPEC_ID = 0
INITIAL_SCHEMA_ID = 0
UNSORTED_ORDER_ID = 0
INITIAL_ROW_ID = 0
GZIP_MAGIC = b"\x1f\x8b"

# Required JSON fields beyond those every version requires (Appendix E, "Writing v2 metadata").
_REQUIRED_ALL = ("location", "last-updated-ms", "last-column-id")
_REQUIRED_V2 = (
    "table-uuid",
    "last-sequence-number",
    "schemas",
    "current-schema-id",
    "partition-specs",
    "default-spec-id",
    "last-partition-id",
    "sort-orders",
    "default-sort-order-id",
)
_REQUIRED_V3 = ("next-row-id",)


class EncryptedKey(IcebergModel):
    """A v3 table encryption key. icefloe does not encrypt; it carries keys through commits."""

    key_id: StrictStr
    encrypted_key_metadata: StrictStr
    encrypted_by_id: StrictStr | None = None
    properties: dict[StrictStr, StrictStr] | None = None


def _present(data: dict[str, Any], key: str) -> bool:
    return data.get(key) is not None


def _require(data: dict[str, Any], key: str, version: int) -> None:
    if not _present(data, key):
        raise ValidationError(f"format v{version} table metadata is missing required field {key!r}")


def _normalize_json(raw: dict[str, Any]) -> dict[str, Any]:
    """Turn any version's JSON into the one shape the model holds (Appendix E defaults)."""
    data = dict(raw)
    if "format-version" not in data:
        raise ValidationError("table metadata is missing required field 'format-version'")
    version = check_format_version(data["format-version"])
    for key in _REQUIRED_ALL:
        _require(data, key, version)
    if version >= 2:
        for key in _REQUIRED_V2:
            _require(data, key, version)
    if version >= 3:
        for key in _REQUIRED_V3:
            _require(data, key, version)

    _check_schema_objects(data, version)
    if not _present(data, "schemas"):
        _require(data, "schema", version)
        schema = data["schema"]
        data["schemas"] = [schema]
        if isinstance(schema, dict):
            data["current-schema-id"] = schema.get("schema-id", INITIAL_SCHEMA_ID)
    else:
        _require(data, "current-schema-id", version)

    if not _present(data, "partition-specs"):
        _require(data, "partition-spec", version)
        data["partition-specs"] = [{"spec-id": INITIAL_SPEC_ID, "fields": data["partition-spec"]}]
        data["default-spec-id"] = INITIAL_SPEC_ID
    else:
        _require(data, "default-spec-id", version)
    if not _present(data, "last-partition-id"):
        # v1 only (v2 requires it): the highest field id of any spec. Parsing the specs here
        # also gives v1 fields without ids the ids Java assigned (1000, 1001, ...).
        specs = _parse_items(
            data["partition-specs"], "partition-specs", PartitionSpec.from_json, PartitionSpec
        )
        data["partition-specs"] = specs
        data["last-partition-id"] = max(
            (s.last_assigned_field_id for s in specs), default=PARTITION_FIELD_ID_START - 1
        )

    if not _present(data, "sort-orders"):
        data["sort-orders"] = [SortOrder.unsorted()]
        data["default-sort-order-id"] = UNSORTED_ORDER_ID
    else:
        _require(data, "default-sort-order-id", version)

    if version == 1:
        # v1 has no sequence numbers; Java ignores any a non-conforming writer left behind.
        data["last-sequence-number"] = INITIAL_SEQUENCE_NUMBER
        if isinstance(data.get("snapshots"), list):
            data["snapshots"] = [
                {k: v for k, v in s.items() if k != "sequence-number"} if isinstance(s, dict) else s
                for s in data["snapshots"]
            ]
    if version < MIN_ROW_LINEAGE_VERSION:
        data.pop("next-row-id", None)

    if data.get("current-snapshot-id") == -1:
        data["current-snapshot-id"] = None
    for key in ("properties", "refs"):
        if data.get(key) is None:
            data[key] = {}
    for key in (
        "snapshots",
        "snapshot-log",
        "metadata-log",
        "statistics",
        "partition-statistics",
        "encryption-keys",
    ):
        if data.get(key) is None:
            data[key] = []
    current = data.get("current-snapshot-id")
    refs = data["refs"]
    if current is not None and isinstance(refs, dict) and MAIN_BRANCH not in refs:
        # "There is always a main branch reference pointing to the current-snapshot-id."
        data["refs"] = {**refs, MAIN_BRANCH: {"snapshot-id": current, "type": "branch"}}
    data.pop("schema", None)
    data.pop("partition-spec", None)
    return data


def _check_schema_objects(data: dict[str, Any], version: int) -> None:
    """Schemas must say ``"type": "struct"``: Java's SchemaParser refuses one that does not,
    so accepting it would let icefloe publish metadata the reference cannot load."""
    candidates: list[tuple[str, Any]] = []
    if isinstance(data.get("schema"), dict):
        candidates.append(("schema", data["schema"]))
    if isinstance(data.get("schemas"), list):
        candidates.extend((f"schemas[{i}]", s) for i, s in enumerate(data["schemas"]))
    for where, obj in candidates:
        if not isinstance(obj, dict):
            continue
        if "type" not in obj:
            raise ValidationError(
                f"format v{version} table metadata: {where} is missing required field 'type' "
                '(a schema must be {"type": "struct", "fields": [...]})'
            )
        if "fields" not in obj:
            raise ValidationError(
                f"format v{version} table metadata: {where} is missing required field 'fields'"
            )


def _parse_items(value: Any, name: str, parse: Any, kind: type) -> Any:
    if not isinstance(value, list | tuple):
        raise ValidationError(f"{name!r} must be a list, got {value!r:.100}")
    out = []
    for i, item in enumerate(value):
        if isinstance(item, kind):
            out.append(item)
            continue
        try:
            out.append(parse(item))
        except ValidationError as e:
            raise ValidationError(f"{name}[{i}]: {e}") from e
    return tuple(out)


class TableMetadata(IcebergModel):
    """The state of a table at one commit: schemas, specs, sort orders, snapshots and refs."""

    model_config = ConfigDict(arbitrary_types_allowed=True)  # merged with IcebergModel's

    format_version: StrictInt
    table_uuid: uuid.UUID | None = None
    location: StrictStr
    last_sequence_number: StrictInt = INITIAL_SEQUENCE_NUMBER
    last_updated_ms: StrictInt
    last_column_id: StrictInt
    schemas: tuple[Schema, ...]
    current_schema_id: StrictInt
    partition_specs: tuple[PartitionSpec, ...]
    default_spec_id: StrictInt
    last_partition_id: StrictInt
    sort_orders: tuple[SortOrder, ...]
    default_sort_order_id: StrictInt
    properties: dict[StrictStr, StrictStr] = Field(default_factory=dict)
    current_snapshot_id: StrictInt | None = None
    refs: dict[StrictStr, SnapshotRef] = Field(default_factory=dict)
    snapshots: tuple[Snapshot, ...] = ()
    snapshot_log: tuple[SnapshotLogEntry, ...] = ()
    metadata_log: tuple[MetadataLogEntry, ...] = ()
    statistics: tuple[StatisticsFile, ...] = ()
    partition_statistics: tuple[PartitionStatisticsFile, ...] = ()
    next_row_id: StrictInt | None = None
    encryption_keys: tuple[EncryptedKey, ...] = ()

    # -- reading ----------------------------------------------------------------------

    @model_validator(mode="before")
    @classmethod
    def _from_json_form(cls, data: Any) -> Any:
        # JSON (hyphenated keys) goes through the version rules; python-named construction
        # (the builder) is already normalized.
        if isinstance(data, dict) and "format-version" in data:
            return _normalize_json(data)
        return data

    @field_validator("schemas", mode="before")
    @classmethod
    def _parse_schemas(cls, value: Any) -> Any:
        return _parse_items(value, "schemas", Schema.from_json, Schema)

    @field_validator("partition_specs", mode="before")
    @classmethod
    def _parse_specs(cls, value: Any) -> Any:
        return _parse_items(value, "partition-specs", PartitionSpec.from_json, PartitionSpec)

    @field_validator("sort_orders", mode="before")
    @classmethod
    def _parse_sort_orders(cls, value: Any) -> Any:
        return _parse_items(value, "sort-orders", SortOrder.from_json, SortOrder)

    @model_validator(mode="after")
    def _validate(self) -> TableMetadata:
        check_format_version(self.format_version)
        if self.format_version >= 2 and self.table_uuid is None:
            raise ValidationError(
                f"format v{self.format_version} table metadata is missing required field "
                "'table-uuid'"
            )
        self._validate_ids()
        self._validate_schemas()
        self._validate_specs()
        self._validate_snapshots()
        self._validate_refs()
        return self

    def _validate_ids(self) -> None:
        for what, ids in (
            ("schema id", [s.schema_id for s in self.schemas]),
            ("partition spec id", [s.spec_id for s in self.partition_specs]),
            ("sort order id", [o.order_id for o in self.sort_orders]),
            ("snapshot id", [s.snapshot_id for s in self.snapshots]),
        ):
            seen: set[int] = set()
            for i in ids:
                if i in seen:
                    raise ValidationError(f"{what} {i} is used more than once")
                seen.add(i)
        if self.schema_by_id(self.current_schema_id) is None:
            raise ValidationError(
                f"current-schema-id {self.current_schema_id} is not in schemas "
                f"{[s.schema_id for s in self.schemas]}"
            )
        if self.spec_by_id(self.default_spec_id) is None:
            raise ValidationError(
                f"default-spec-id {self.default_spec_id} is not in partition-specs "
                f"{[s.spec_id for s in self.partition_specs]}"
            )
        if (
            self.default_sort_order_id != UNSORTED_ORDER_ID
            and self.sort_order_by_id(self.default_sort_order_id) is None
        ):
            raise ValidationError(
                f"default-sort-order-id {self.default_sort_order_id} is not in sort-orders "
                f"{[o.order_id for o in self.sort_orders]}"
            )

    def _validate_schemas(self) -> None:
        for schema in self.schemas:
            for f in schema.all_fields():
                if f.field_id > MAX_FIELD_ID:
                    raise ValidationError(
                        f"schema {schema.schema_id}: field "
                        f"{schema.find_column_name(f.field_id)!r} has id {f.field_id}, in the "
                        f"range reserved for metadata columns (above {MAX_FIELD_ID})"
                    )
        highest = max((s.highest_field_id for s in self.schemas), default=0)
        if self.last_column_id < highest:
            raise ValidationError(
                f"last-column-id {self.last_column_id} is below the highest field id {highest} "
                "used by the schemas"
            )
        if self.format_version >= 3:
            return
        for schema in self.schemas:
            for f in schema.all_fields():
                name = schema.find_column_name(f.field_id)
                if f.field_type.min_format_version > self.format_version:
                    raise ValidationError(
                        f"schema {schema.schema_id}: field {name!r} has type {f.field_type}, "
                        f"which needs format v{f.field_type.min_format_version}; this table "
                        f"is v{self.format_version}"
                    )
                if f.initial_default is not None or f.write_default is not None:
                    raise ValidationError(
                        f"schema {schema.schema_id}: field {name!r} has a default value, "
                        f"which needs format v3; this table is v{self.format_version}"
                    )

    def _validate_specs(self) -> None:
        highest = max(
            (s.last_assigned_field_id for s in self.partition_specs),
            default=PARTITION_FIELD_ID_START - 1,
        )
        if self.last_partition_id < highest:
            raise ValidationError(
                f"last-partition-id {self.last_partition_id} is below the highest partition "
                f"field id {highest} used by the partition specs"
            )

    def _validate_snapshots(self) -> None:
        if self.format_version >= 2:
            for s in self.snapshots:
                if s.sequence_number > self.last_sequence_number:
                    raise ValidationError(
                        f"snapshot {s.snapshot_id} has sequence-number {s.sequence_number}, "
                        f"above last-sequence-number {self.last_sequence_number}"
                    )
        if self.format_version >= MIN_ROW_LINEAGE_VERSION:
            if self.next_row_id is None or self.next_row_id < 0:
                raise ValidationError(
                    f"format v{self.format_version} table metadata needs a non-negative "
                    f"'next-row-id', got {self.next_row_id}"
                )
            for s in self.snapshots:
                if s.first_row_id is None:
                    continue  # written before the upgrade to v3: no row ids
                if s.added_rows is None:
                    raise ValidationError(
                        f"snapshot {s.snapshot_id} has 'first-row-id' but no 'added-rows'"
                    )
                if s.first_row_id + s.added_rows > self.next_row_id:
                    raise ValidationError(
                        f"snapshot {s.snapshot_id} assigns row ids up to "
                        f"{s.first_row_id + s.added_rows}, beyond next-row-id {self.next_row_id}"
                    )
        elif self.next_row_id is not None:
            raise ValidationError(
                f"'next-row-id' is a v3 field; this table is v{self.format_version}"
            )
        if (
            self.current_snapshot_id is not None
            and self.snapshot_by_id(self.current_snapshot_id) is None
        ):
            raise ValidationError(
                f"current-snapshot-id {self.current_snapshot_id} is not in snapshots"
            )

    def _validate_refs(self) -> None:
        for name, ref in self.refs.items():
            if self.snapshot_by_id(ref.snapshot_id) is None:
                raise ValidationError(
                    f"ref {name!r} points to snapshot {ref.snapshot_id}, which is not in snapshots"
                )
        main = self.refs.get(MAIN_BRANCH)
        if main is not None and main.ref_type != SnapshotRefType.BRANCH:
            raise ValidationError(f"ref {MAIN_BRANCH!r} must be a branch, got a {main.ref_type}")
        if self.current_snapshot_id is None and main is not None:
            raise ValidationError(
                f"branch {MAIN_BRANCH!r} points to snapshot {main.snapshot_id} but "
                "current-snapshot-id is not set"
            )
        if main is not None and main.snapshot_id != self.current_snapshot_id:
            raise ValidationError(
                f"current-snapshot-id {self.current_snapshot_id} differs from branch "
                f"{MAIN_BRANCH!r} ({main.snapshot_id})"
            )
        if self.current_snapshot_id is not None and main is None:
            raise ValidationError(
                f"current-snapshot-id {self.current_snapshot_id} is set but there is no "
                f"{MAIN_BRANCH!r} branch"
            )

    # -- writing ----------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """The metadata JSON for this table's format version, field order as Java writes it."""
        v = self.format_version
        out: dict[str, Any] = {"format-version": v}
        if self.table_uuid is not None:
            out["table-uuid"] = str(self.table_uuid)
        out["location"] = self.location
        if v >= 2:
            out["last-sequence-number"] = self.last_sequence_number
        out["last-updated-ms"] = self.last_updated_ms
        out["last-column-id"] = self.last_column_id
        if v == 1:
            out["schema"] = self.schema().to_json()
        out["current-schema-id"] = self.current_schema_id
        out["schemas"] = [s.to_json() for s in self.schemas]
        if v == 1:
            out["partition-spec"] = self.spec().fields_to_json()
        out["default-spec-id"] = self.default_spec_id
        out["partition-specs"] = [s.to_json() for s in self.partition_specs]
        out["last-partition-id"] = self.last_partition_id
        out["default-sort-order-id"] = self.default_sort_order_id
        out["sort-orders"] = [o.to_json() for o in self.sort_orders]
        out["properties"] = dict(self.properties)
        if self.current_snapshot_id is not None:
            out["current-snapshot-id"] = self.current_snapshot_id
        elif v >= MIN_NULL_CURRENT_SNAPSHOT_VERSION:
            out["current-snapshot-id"] = None
        else:
            out["current-snapshot-id"] = -1
        if v >= MIN_ROW_LINEAGE_VERSION:
            out["next-row-id"] = self.next_row_id
        if self.encryption_keys:
            out["encryption-keys"] = [k.to_json() for k in self.encryption_keys]
        out["refs"] = {name: ref.to_json() for name, ref in self.refs.items()}
        snapshots = [s.to_json() for s in self.snapshots]
        if v == 1:
            for s in snapshots:
                s.pop("sequence-number", None)
        out["snapshots"] = snapshots
        out["statistics"] = [s.to_json() for s in self.statistics]
        out["partition-statistics"] = [s.to_json() for s in self.partition_statistics]
        out["snapshot-log"] = [e.to_json() for e in self.snapshot_log]
        out["metadata-log"] = [e.to_json() for e in self.metadata_log]
        return out

    @model_serializer(mode="plain")
    def _serialize(self) -> dict[str, Any]:
        # model_dump / model_dump_json and models that nest metadata (REST responses) all
        # get the version-correct JSON.
        return self.to_json()

    def to_json_bytes(self, compress: bool = False) -> bytes:
        """UTF-8 JSON; gzip-compressed when ``compress`` (name such files ``*.gz.metadata.json``)."""
        data = json.dumps(self.to_json(), separators=(",", ":"), ensure_ascii=False).encode()
        return gzip.compress(data) if compress else data

    # -- lookups ----------------------------------------------------------------------

    def schema(self) -> Schema:  # type: ignore[override]  # BaseModel.schema is deprecated
        """The current schema."""
        schema = self.schema_by_id(self.current_schema_id)
        assert schema is not None  # guaranteed by validation
        return schema

    def schema_by_id(self, schema_id: int) -> Schema | None:
        return next((s for s in self.schemas if s.schema_id == schema_id), None)

    def spec(self) -> PartitionSpec:
        """The default partition spec, the one writers use."""
        spec = self.spec_by_id(self.default_spec_id)
        assert spec is not None  # guaranteed by validation
        return spec

    def spec_by_id(self, spec_id: int) -> PartitionSpec | None:
        return next((s for s in self.partition_specs if s.spec_id == spec_id), None)

    def specs(self) -> dict[int, PartitionSpec]:
        return {s.spec_id: s for s in self.partition_specs}

    def sort_order(self) -> SortOrder:
        """The default sort order (unsorted when the table never declared one)."""
        return self.sort_order_by_id(self.default_sort_order_id) or SortOrder.unsorted()

    def sort_order_by_id(self, order_id: int) -> SortOrder | None:
        return next((o for o in self.sort_orders if o.order_id == order_id), None)

    def current_snapshot(self) -> Snapshot | None:
        if self.current_snapshot_id is None:
            return None
        return self.snapshot_by_id(self.current_snapshot_id)

    def snapshot_by_id(self, snapshot_id: int) -> Snapshot | None:
        return next((s for s in self.snapshots if s.snapshot_id == snapshot_id), None)

    def snapshot_by_ref(self, name: str) -> Snapshot | None:
        """The snapshot a branch or tag points to, or None when there is no such ref."""
        ref = self.refs.get(name)
        return None if ref is None else self.snapshot_by_id(ref.snapshot_id)

    def ancestors_of(self, snapshot_id: int) -> Iterator[Snapshot]:
        """The snapshot and then its parents, newest first, until one has been expired."""
        snapshot = self.snapshot_by_id(snapshot_id)
        if snapshot is None:
            raise NotFoundError(f"table {self.location}: snapshot {snapshot_id} does not exist")
        seen: set[int] = set()
        while snapshot is not None and snapshot.snapshot_id not in seen:
            seen.add(snapshot.snapshot_id)
            yield snapshot
            parent = snapshot.parent_snapshot_id
            snapshot = None if parent is None else self.snapshot_by_id(parent)

    def snapshot_as_of(self, timestamp_ms: int) -> Snapshot:
        """The snapshot that was current at ``timestamp_ms``, found in the snapshot log.

        The log, not the parent chain, is the history of what readers saw (Appendix F,
        "Point in Time Reads"): a rollback makes the two differ.
        """
        found: SnapshotLogEntry | None = None
        for entry in self.snapshot_log:
            if entry.timestamp_ms <= timestamp_ms:
                found = entry
        if found is None:
            raise NotFoundError(
                f"table {self.location}: no snapshot was current at or before {timestamp_ms} ms "
                f"(the snapshot log has {len(self.snapshot_log)} entries"
                + (
                    f", the oldest at {self.snapshot_log[0].timestamp_ms})"
                    if self.snapshot_log
                    else ")"
                )
            )
        snapshot = self.snapshot_by_id(found.snapshot_id)
        if snapshot is None:
            raise NotFoundError(
                f"table {self.location}: snapshot {found.snapshot_id}, current at "
                f"{found.timestamp_ms} ms, has been expired"
            )
        return snapshot

    def resolve_snapshot(
        self,
        *,
        snapshot_id: int | None = None,
        ref: str | None = None,
        as_of_ms: int | None = None,
    ) -> Snapshot | None:
        """The snapshot a point-in-time read sees: by id, by branch or tag, by time, or the
        current one (None for a table without snapshots). At most one may be given."""
        given = [
            name
            for name, v in (
                ("snapshot-id", snapshot_id),
                ("ref", ref),
                ("as-of-timestamp-ms", as_of_ms),
            )
            if v is not None
        ]
        if len(given) > 1:
            raise ValidationError(f"a read takes at most one of {given}, got {len(given)}")
        if snapshot_id is not None:
            snapshot = self.snapshot_by_id(snapshot_id)
            if snapshot is None:
                raise NotFoundError(f"table {self.location} has no snapshot {snapshot_id}")
            return snapshot
        if ref is not None:
            if ref not in self.refs:
                raise NotFoundError(
                    f"table {self.location} has no branch or tag {ref!r} "
                    f"(refs: {sorted(self.refs)})"
                )
            return self.snapshot_by_ref(ref)
        if as_of_ms is not None:
            return self.snapshot_as_of(as_of_ms)
        return self.current_snapshot()

    def next_sequence_number(self) -> int:
        """The sequence number the next snapshot gets (always 0 in v1)."""
        return (
            self.last_sequence_number + 1 if self.format_version >= 2 else INITIAL_SEQUENCE_NUMBER
        )

    def new_snapshot_id(self) -> int:
        """A random snapshot id not used by any snapshot of this table."""
        while True:
            snapshot_id = generate_snapshot_id()
            if snapshot_id and self.snapshot_by_id(snapshot_id) is None:
                return snapshot_id

    def property(self, key: str, default: str | None = None) -> str | None:
        return self.properties.get(key, default)

    def int_property(self, key: str, default: int) -> int:
        """A numeric table property, naming the property when its value is not a number."""
        value = self.properties.get(key)
        if value is None:
            return default
        try:
            return int(value)
        except ValueError:
            raise ValidationError(
                f"table property {key!r} must be an integer, got {value!r}"
            ) from None

    @classmethod
    def from_json(cls, obj: Any, what: str | None = None) -> TableMetadata:
        return parse_table_metadata(obj, what)


def _decode(data: bytes, where: str) -> Any:
    if data[:2] == GZIP_MAGIC:
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as e:
            raise InvalidFileError(where, f"corrupt gzip-compressed metadata: {e}") from e
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise InvalidFileError(where, f"metadata is not UTF-8 text: {e}") from e
    except json.JSONDecodeError as e:
        raise InvalidFileError(where, f"metadata is not valid JSON: {e}") from e


def parse_table_metadata(
    text: str | bytes | bytearray | dict[str, Any], location: str | None = None
) -> TableMetadata:
    """Read table metadata JSON of any supported format version.

    ``text`` may be a JSON string, (optionally gzip-compressed) bytes or an already decoded
    object. ``location`` is the metadata file's path, used to name it in errors.
    """
    where = location or "table metadata"
    if isinstance(text, bytes | bytearray):
        obj = _decode(bytes(text), where)
    elif isinstance(text, str):
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            raise InvalidFileError(where, f"metadata is not valid JSON: {e}") from e
    else:
        obj = text
    if not isinstance(obj, dict):
        raise ValidationError(
            f"{where}: table metadata must be a JSON object, got {type(obj).__name__}"
        )
    if "format-version" not in obj:
        raise ValidationError(f"{where}: table metadata is missing required field 'format-version'")
    check_format_version_in(obj["format-version"], where)
    return model_from_json(TableMetadata, obj, where)


__all__ = [
    "DEFAULT_FORMAT_VERSION",
    "EncryptedKey",
    "TableMetadata",
    "parse_table_metadata",
]
