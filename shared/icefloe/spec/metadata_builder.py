"""New table metadata from old: the builder every change to a table goes through.

Every commit (the coordinator's appends, a REST ``updateTable`` call, a schema change) is a
base metadata plus a list of updates plus a list of requirements. The updates are the REST
``TableUpdate`` actions (:mod:`icefloe.table.updates`), each one call on this builder;
the requirements are checked apart (:mod:`icefloe.table.requirements`). Keeping the
update rules in one place means all of them agree on the invariants the spec asks writers to keep: ids
are never reused, sequence numbers only grow, ``main`` and ``current-snapshot-id`` move
together and each move is logged, v3 row ids are handed out without gaps or overlaps.

The builder follows the Java reference ``TableMetadata.Builder`` where the spec leaves room:
identical schemas, specs and sort orders are reused instead of added again, ``-1`` means
"the one added last", and removing snapshots also removes the refs, statistics and snapshot
log history that pointed at them.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Mapping
from uuid import UUID, uuid4

from icefloe.errors import ValidationError
from icefloe.spec.format_version import check_format_version
from icefloe.spec.metadata import (
    DEFAULT_FORMAT_VERSION,
    INITIAL_ROW_ID,
    MIN_ROW_LINEAGE_VERSION,
    UNSORTED_ORDER_ID,
    EncryptedKey,
    TableMetadata,
)
from icefloe.spec.model import model_from_json
from icefloe.spec.partition import INITIAL_SPEC_ID, PARTITION_FIELD_ID_START, PartitionSpec
from icefloe.spec.schema import Schema
from icefloe.spec.schema_update import assign_fresh_ids
from icefloe.spec.snapshot import (
    MAIN_BRANCH,
    MetadataLogEntry,
    PartitionStatisticsFile,
    Snapshot,
    SnapshotLogEntry,
    SnapshotRef,
    SnapshotRefType,
    StatisticsFile,
)
from icefloe.spec.sort_order import SortOrder

# Table properties the builder reads.
FORMAT_VERSION_PROPERTY = "format-version"
METADATA_PREVIOUS_VERSIONS_MAX = "write.metadata.previous-versions-max"
METADATA_PREVIOUS_VERSIONS_MAX_DEFAULT = 100
# ``set-current-schema`` / ``set-default-spec`` / ``set-default-sort-order``: the one added last.
LAST_ADDED = -1
INITIAL_SORT_ORDER_ID = 1


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _strip_location(location: str) -> str:
    if not isinstance(location, str) or not location:
        raise ValidationError(f"table location must be a non-empty string, got {location!r}")
    stripped = location.rstrip("/")
    return stripped if stripped and not stripped.endswith(":") else location


def _check_spec_binds(spec: PartitionSpec, schema: Schema, what: str) -> None:
    """A new spec must be computable from the schema, with transforms icefloe can apply.

    Unknown transforms are readable but "writers should not write using partition specs
    that use unknown transforms", and adding a spec is writing one.
    """
    unknown = [f.name for f in spec.fields if f.transform.is_unknown]
    if unknown:
        raise ValidationError(f"{what}: partition fields {unknown} use unknown transforms")
    try:
        spec.check_compatible(schema)
    except ValidationError as e:
        raise ValidationError(f"{what}: {e}") from e


def _check_order_binds(order: SortOrder, schema: Schema, what: str) -> None:
    if order.has_unknown_transform:
        raise ValidationError(f"{what}: sort order {order} uses an unknown transform")
    try:
        order.check_compatible(schema)
    except ValidationError as e:
        raise ValidationError(f"{what}: {e}") from e


# -- creating a table ---------------------------------------------------------------------


def new_table_metadata(
    schema: Schema,
    spec: PartitionSpec,
    sort_order: SortOrder,
    location: str,
    properties: Mapping[str, str] | None = None,
    format_version: int = DEFAULT_FORMAT_VERSION,
    table_uuid: UUID | None = None,
) -> TableMetadata:
    """Metadata for a new, empty table.

    The caller's field ids mean nothing to a table that does not exist yet, so columns get
    fresh ids from 1 and the spec and sort order are re-pointed at them by column name;
    partition fields are numbered from 1000. A ``format-version`` table property is the
    reserved way catalogs pass the version, so it wins over ``format_version`` and is not
    stored as a property.
    """
    props = dict(properties or {})
    requested = props.pop(FORMAT_VERSION_PROPERTY, None)
    if requested is not None:
        try:
            format_version = int(requested)
        except ValueError:
            raise ValidationError(
                f"table property {FORMAT_VERSION_PROPERTY!r} must be an integer, got {requested!r}"
            ) from None
    format_version = check_format_version(format_version)

    fresh, last_column_id = assign_fresh_ids(schema)
    fresh = fresh.with_id(0)

    def fresh_id(old_id: int, what: str) -> int:
        name = schema.find_column_name(old_id)
        new_id = None if name is None else fresh.find_field_id(name)
        if new_id is None:
            raise ValidationError(
                f"{what} uses source column id {old_id}, which is not in the schema"
            )
        return new_id

    def fresh_ids(old_ids: tuple[int, ...], what: str) -> tuple[int, ...]:
        return tuple(fresh_id(i, what) for i in old_ids)

    fresh_spec = PartitionSpec(
        spec_id=INITIAL_SPEC_ID,
        fields=tuple(
            dataclasses.replace(
                f,
                source_id=fresh_id(f.source_id, f"partition field {f.name!r}"),
                source_ids=fresh_ids(f.source_ids, f"partition field {f.name!r}"),
                field_id=PARTITION_FIELD_ID_START + i,
            )
            for i, f in enumerate(spec.fields)
        ),
    )
    fresh_order = SortOrder(
        order_id=INITIAL_SORT_ORDER_ID if sort_order.fields else UNSORTED_ORDER_ID,
        fields=tuple(
            dataclasses.replace(
                f,
                source_id=fresh_id(f.source_id, "sort field"),
                source_ids=fresh_ids(f.source_ids, "sort field"),
            )
            for f in sort_order.fields
        ),
    )
    _check_spec_binds(fresh_spec, fresh, "new table")
    _check_order_binds(fresh_order, fresh, "new table")
    return model_from_json(
        TableMetadata,
        {
            "format_version": format_version,
            "table_uuid": table_uuid or uuid4(),
            "location": _strip_location(location),
            "last_sequence_number": 0,
            "last_updated_ms": _now_ms(),
            "last_column_id": last_column_id,
            "schemas": (fresh,),
            "current_schema_id": fresh.schema_id,
            "partition_specs": (fresh_spec,),
            "default_spec_id": fresh_spec.spec_id,
            "last_partition_id": max(
                fresh_spec.last_assigned_field_id, PARTITION_FIELD_ID_START - 1
            ),
            "sort_orders": (fresh_order,),
            "default_sort_order_id": fresh_order.order_id,
            "properties": props,
            "next_row_id": INITIAL_ROW_ID if format_version >= MIN_ROW_LINEAGE_VERSION else None,
        },
        "new table metadata",
    )


# -- the builder ----------------------------------------------------------------------------


class MetadataBuilder:
    """Applies changes to a base metadata; :meth:`build` validates and returns the result.

    Methods return the builder so changes chain. Each raises ``ValidationError`` naming the
    rule it broke; nothing is half-applied to the base, which is never modified.
    """

    def __init__(self, base: TableMetadata | None) -> None:
        """``base`` is None only when creating a table from updates (REST create transactions)."""
        self._base = base
        self._changes: list[str] = []
        self._last_added_schema_id: int | None = None
        self._last_added_spec_id: int | None = None
        self._last_added_order_id: int | None = None
        self._added_snapshot_ids: set[int] = set()
        self._last_updated_ms: int | None = None
        # snapshot-log entries added here get their timestamp when the metadata is built
        self._new_log_entries: list[tuple[int, int | None]] = []
        if base is None:
            self._format_version = DEFAULT_FORMAT_VERSION
            self._uuid: UUID | None = None
            self._location = ""
            self._last_sequence_number = 0
            self._last_column_id = 0
            self._schemas: list[Schema] = []
            self._current_schema_id = -1
            self._specs: list[PartitionSpec] = []
            self._default_spec_id = -1
            self._last_partition_id = PARTITION_FIELD_ID_START - 1
            self._sort_orders: list[SortOrder] = []
            self._default_sort_order_id = -1
            self._properties: dict[str, str] = {}
            self._current_snapshot_id: int | None = None
            self._refs: dict[str, SnapshotRef] = {}
            self._snapshots: list[Snapshot] = []
            self._snapshot_log: list[SnapshotLogEntry] = []
            self._metadata_log: list[MetadataLogEntry] = []
            self._statistics: dict[int, StatisticsFile] = {}
            self._partition_statistics: dict[int, PartitionStatisticsFile] = {}
            self._next_row_id: int | None = None
            self._encryption_keys: dict[str, EncryptedKey] = {}
            return
        self._format_version = base.format_version
        self._uuid = base.table_uuid
        self._location = base.location
        self._last_sequence_number = base.last_sequence_number
        self._last_column_id = base.last_column_id
        self._schemas = list(base.schemas)
        self._current_schema_id = base.current_schema_id
        self._specs = list(base.partition_specs)
        self._default_spec_id = base.default_spec_id
        self._last_partition_id = base.last_partition_id
        self._sort_orders = list(base.sort_orders)
        self._default_sort_order_id = base.default_sort_order_id
        self._properties = dict(base.properties)
        self._current_snapshot_id = base.current_snapshot_id
        self._refs = dict(base.refs)
        self._snapshots = list(base.snapshots)
        self._snapshot_log = list(base.snapshot_log)
        self._metadata_log = list(base.metadata_log)
        self._statistics = {s.snapshot_id: s for s in base.statistics}
        self._partition_statistics = {s.snapshot_id: s for s in base.partition_statistics}
        self._next_row_id = base.next_row_id
        self._encryption_keys = {k.key_id: k for k in base.encryption_keys}

    # -- state others need while binding updates ---------------------------------------

    @property
    def format_version(self) -> int:
        return self._format_version

    @property
    def last_partition_id(self) -> int:
        return self._last_partition_id

    @property
    def partition_specs(self) -> tuple[PartitionSpec, ...]:
        return tuple(self._specs)

    @property
    def changes(self) -> tuple[str, ...]:
        """What changed, one line per applied update (for logs and commit events)."""
        return tuple(self._changes)

    def _current_schema(self, what: str) -> Schema:
        schema = next((s for s in self._schemas if s.schema_id == self._current_schema_id), None)
        if schema is None:
            raise ValidationError(f"{what}: the table has no current schema yet; add one first")
        return schema

    def _binding_schema(self, what: str) -> Schema:
        """The schema a new spec or sort order binds to: the current one, or while a table is
        being created from updates, the schema added last. Create transactions may add the
        spec before they set the current schema (DuckDB does; Java's builder accepts it)."""
        creating = self._base is None and self._last_added_schema_id is not None
        if creating and not any(s.schema_id == self._current_schema_id for s in self._schemas):
            return next(s for s in self._schemas if s.schema_id == self._last_added_schema_id)
        return self._current_schema(what)

    def _snapshot(self, snapshot_id: int) -> Snapshot | None:
        return next((s for s in self._snapshots if s.snapshot_id == snapshot_id), None)

    # -- identity, version, location, properties ---------------------------------------

    def assign_uuid(self, table_uuid: UUID | str) -> MetadataBuilder:
        try:
            value = table_uuid if isinstance(table_uuid, UUID) else UUID(table_uuid)
        except ValueError:
            raise ValidationError(f"assign-uuid: {table_uuid!r} is not a UUID") from None
        if value == self._uuid:
            return self
        if self._uuid is not None:
            raise ValidationError(
                f"assign-uuid: the table already has uuid {self._uuid}; a uuid is never reassigned"
            )
        self._uuid = value
        self._changes.append(f"assign-uuid {value}")
        return self

    def upgrade_format_version(self, format_version: int) -> MetadataBuilder:
        """Move to a newer format version (Appendix E); downgrades are refused."""
        version = check_format_version(format_version)
        if version == self._format_version:
            return self
        if self._base is None and not self._snapshots and not self._schemas:
            self._format_version = version  # a table being created picks its version freely
        elif version < self._format_version:
            raise ValidationError(
                f"cannot downgrade table format-version from {self._format_version} to {version}"
            )
        if version >= MIN_ROW_LINEAGE_VERSION and self._next_row_id is None:
            # "When a table is upgraded to v3, its next-row-id is initialized to 0."
            self._next_row_id = INITIAL_ROW_ID
        self._format_version = version
        self._changes.append(f"upgrade-format-version {version}")
        return self

    def set_location(self, location: str) -> MetadataBuilder:
        location = _strip_location(location)
        if location != self._location:
            self._location = location
            self._changes.append(f"set-location {location}")
        return self

    def set_properties(self, updates: Mapping[str, str]) -> MetadataBuilder:
        for key, value in updates.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise ValidationError(
                    f"set-properties: property values must be strings, {key!r} is {value!r:.80}"
                )
        if updates:
            self._properties.update(updates)
            self._changes.append(f"set-properties {sorted(updates)}")
        return self

    def remove_properties(self, removals: Iterable[str]) -> MetadataBuilder:
        removed = [key for key in removals if self._properties.pop(key, None) is not None]
        if removed:
            self._changes.append(f"remove-properties {removed}")
        return self

    # -- schemas --------------------------------------------------------------------------

    def add_schema(self, schema: Schema, last_column_id: int | None = None) -> MetadataBuilder:
        """Add a schema, or reuse the id of an identical one; ``-1`` then selects it.

        ``last_column_id`` (deprecated in the REST API) defaults to the highest id so far.
        """
        highest = max(self._last_column_id, schema.highest_field_id)
        new_last = highest if last_column_id is None else last_column_id
        if new_last < self._last_column_id:
            raise ValidationError(
                f"add-schema: last-column-id {new_last} is below the table's "
                f"{self._last_column_id}; column ids are never reused"
            )
        if new_last < schema.highest_field_id:
            raise ValidationError(
                f"add-schema: last-column-id {new_last} is below the schema's highest field id "
                f"{schema.highest_field_id}"
            )
        existing = next((s for s in self._schemas if s.same_columns(schema)), None)
        if existing is not None:
            schema_id = existing.schema_id
        else:
            schema_id = max((s.schema_id for s in self._schemas), default=-1) + 1
            self._schemas.append(schema.with_id(schema_id))
            self._changes.append(f"add-schema {schema_id}")
        if new_last != self._last_column_id:
            self._last_column_id = new_last
            self._changes.append(f"last-column-id {new_last}")
        self._last_added_schema_id = schema_id
        return self

    def set_current_schema(self, schema_id: int) -> MetadataBuilder:
        if schema_id == LAST_ADDED:
            if self._last_added_schema_id is None:
                raise ValidationError("set-current-schema -1: no schema was added in this commit")
            schema_id = self._last_added_schema_id
        if not any(s.schema_id == schema_id for s in self._schemas):
            raise ValidationError(f"set-current-schema: schema {schema_id} does not exist")
        if schema_id != self._current_schema_id:
            self._current_schema_id = schema_id
            self._changes.append(f"set-current-schema {schema_id}")
        return self

    def remove_schemas(self, schema_ids: Iterable[int]) -> MetadataBuilder:
        ids = set(schema_ids)
        if self._current_schema_id in ids:
            raise ValidationError(
                f"remove-schemas: cannot remove the current schema {self._current_schema_id}"
            )
        before = len(self._schemas)
        self._schemas = [s for s in self._schemas if s.schema_id not in ids]
        if len(self._schemas) != before:
            self._changes.append(f"remove-schemas {sorted(ids)}")
        return self

    # -- partition specs -----------------------------------------------------------------

    def add_partition_spec(self, spec: PartitionSpec) -> MetadataBuilder:
        """Add a spec bound to the current schema, or reuse an identical one."""
        _check_spec_binds(spec, self._binding_schema("add-spec"), "add-spec")
        if self._format_version == 1:
            expected = [PARTITION_FIELD_ID_START + i for i in range(len(spec.fields))]
            if [f.field_id for f in spec.fields] != expected:
                raise ValidationError(
                    f"add-spec: v1 tables need partition field ids numbered from "
                    f"{PARTITION_FIELD_ID_START} in order, got {[f.field_id for f in spec.fields]}"
                )
        existing = next((s for s in self._specs if s.compatible_with(spec)), None)
        if existing is not None:
            spec_id = existing.spec_id
        else:
            spec_id = max((s.spec_id for s in self._specs), default=-1) + 1
            self._specs.append(PartitionSpec(spec_id=spec_id, fields=tuple(spec.fields)))
            self._last_partition_id = max(self._last_partition_id, spec.last_assigned_field_id)
            self._changes.append(f"add-spec {spec_id}")
        self._last_added_spec_id = spec_id
        return self

    def set_default_spec(self, spec_id: int) -> MetadataBuilder:
        if spec_id == LAST_ADDED:
            if self._last_added_spec_id is None:
                raise ValidationError("set-default-spec -1: no spec was added in this commit")
            spec_id = self._last_added_spec_id
        if not any(s.spec_id == spec_id for s in self._specs):
            raise ValidationError(f"set-default-spec: partition spec {spec_id} does not exist")
        if spec_id != self._default_spec_id:
            self._default_spec_id = spec_id
            self._changes.append(f"set-default-spec {spec_id}")
        return self

    def remove_partition_specs(self, spec_ids: Iterable[int]) -> MetadataBuilder:
        ids = set(spec_ids)
        if self._default_spec_id in ids:
            raise ValidationError(
                f"remove-partition-specs: cannot remove the default spec {self._default_spec_id}"
            )
        before = len(self._specs)
        self._specs = [s for s in self._specs if s.spec_id not in ids]
        if len(self._specs) != before:
            self._changes.append(f"remove-partition-specs {sorted(ids)}")
        return self

    # -- sort orders ---------------------------------------------------------------------

    def add_sort_order(self, order: SortOrder) -> MetadataBuilder:
        """Add a sort order bound to the current schema, or reuse an identical one.

        The unsorted order always has id 0; sorted orders are numbered from 1.
        """
        _check_order_binds(order, self._binding_schema("add-sort-order"), "add-sort-order")
        existing = next((o for o in self._sort_orders if o.same_order(order)), None)
        if existing is not None:
            order_id = existing.order_id
        else:
            if not order.fields:
                order_id = UNSORTED_ORDER_ID
            else:
                order_id = (
                    max((o.order_id for o in self._sort_orders), default=UNSORTED_ORDER_ID) + 1
                )
            self._sort_orders.append(SortOrder(order_id=order_id, fields=tuple(order.fields)))
            self._changes.append(f"add-sort-order {order_id}")
        self._last_added_order_id = order_id
        return self

    def set_default_sort_order(self, order_id: int) -> MetadataBuilder:
        if order_id == LAST_ADDED:
            if self._last_added_order_id is None:
                raise ValidationError(
                    "set-default-sort-order -1: no sort order was added in this commit"
                )
            order_id = self._last_added_order_id
        if order_id == UNSORTED_ORDER_ID and not any(
            o.order_id == UNSORTED_ORDER_ID for o in self._sort_orders
        ):
            self._sort_orders.append(SortOrder.unsorted())
        if not any(o.order_id == order_id for o in self._sort_orders):
            raise ValidationError(f"set-default-sort-order: sort order {order_id} does not exist")
        if order_id != self._default_sort_order_id:
            self._default_sort_order_id = order_id
            self._changes.append(f"set-default-sort-order {order_id}")
        return self

    # -- snapshots and refs ----------------------------------------------------------------

    def add_snapshot(self, snapshot: Snapshot) -> MetadataBuilder:
        """Add a snapshot (not yet on any branch: follow with :meth:`set_ref`).

        Enforces what a v2 writer must write (sequence number above the table's, a manifest
        list, an operation) and v3 row lineage: the snapshot's ``first-row-id`` must be the
        table's ``next-row-id``, which then advances by ``added-rows``.
        """
        where = f"add-snapshot {snapshot.snapshot_id}"
        if self._snapshot(snapshot.snapshot_id) is not None:
            raise ValidationError(f"{where}: a snapshot with this id already exists")
        if self._format_version == 1:
            if snapshot.sequence_number != 0:
                raise ValidationError(
                    f"{where}: v1 tables have no sequence numbers, got {snapshot.sequence_number}"
                )
        else:
            if snapshot.sequence_number <= self._last_sequence_number:
                raise ValidationError(
                    f"{where}: sequence-number {snapshot.sequence_number} must be greater than "
                    f"the table's last-sequence-number {self._last_sequence_number}"
                )
            if snapshot.manifest_list is None:
                raise ValidationError(
                    f"{where}: format v{self._format_version} snapshots need a 'manifest-list'"
                )
            if snapshot.operation is None:
                raise ValidationError(
                    f"{where}: format v{self._format_version} snapshots need a summary with an "
                    "'operation'"
                )
        if self._format_version >= MIN_ROW_LINEAGE_VERSION:
            if snapshot.first_row_id is None or snapshot.added_rows is None:
                raise ValidationError(
                    f"{where}: format v{self._format_version} snapshots need 'first-row-id' "
                    "and 'added-rows' (row lineage)"
                )
            if snapshot.first_row_id != self._next_row_id:
                raise ValidationError(
                    f"{where}: first-row-id {snapshot.first_row_id} must equal the table's "
                    f"next-row-id {self._next_row_id}; reassign it from the refreshed table"
                )
            self._next_row_id = snapshot.first_row_id + snapshot.added_rows
        self._snapshots.append(snapshot)
        self._added_snapshot_ids.add(snapshot.snapshot_id)
        if self._format_version >= 2:
            self._last_sequence_number = snapshot.sequence_number
        self._changes.append(f"add-snapshot {snapshot.snapshot_id}")
        return self

    def set_ref(self, name: str, ref: SnapshotRef) -> MetadataBuilder:
        """Point a branch or tag at a snapshot; moving ``main`` changes the current snapshot."""
        snapshot = self._snapshot(ref.snapshot_id)
        if snapshot is None:
            raise ValidationError(
                f"set-snapshot-ref {name!r}: snapshot {ref.snapshot_id} does not exist"
            )
        if name == MAIN_BRANCH and ref.ref_type != SnapshotRefType.BRANCH:
            raise ValidationError(f"set-snapshot-ref: {MAIN_BRANCH!r} must be a branch, not a tag")
        if self._refs.get(name) == ref:
            return self
        self._refs[name] = ref
        self._changes.append(f"set-snapshot-ref {name} -> {ref.snapshot_id}")
        if name == MAIN_BRANCH and self._current_snapshot_id != ref.snapshot_id:
            self._current_snapshot_id = ref.snapshot_id
            stamp = None
            if ref.snapshot_id in self._added_snapshot_ids:
                # The table changed when the snapshot was made: keep time travel consistent.
                stamp = snapshot.timestamp_ms
                self._last_updated_ms = snapshot.timestamp_ms
            self._new_log_entries.append((ref.snapshot_id, stamp))
        return self

    def remove_ref(self, name: str) -> MetadataBuilder:
        if name not in self._refs:
            return self
        del self._refs[name]
        if name == MAIN_BRANCH:
            self._current_snapshot_id = None
        self._changes.append(f"remove-snapshot-ref {name}")
        return self

    def remove_snapshots(self, snapshot_ids: Iterable[int]) -> MetadataBuilder:
        """Expire snapshots, with the refs and statistics that point at them."""
        ids = {i for i in snapshot_ids if self._snapshot(i) is not None}
        if not ids:
            return self
        self._snapshots = [s for s in self._snapshots if s.snapshot_id not in ids]
        for name in [n for n, r in self._refs.items() if r.snapshot_id in ids]:
            self.remove_ref(name)
        for i in ids:
            self._statistics.pop(i, None)
            self._partition_statistics.pop(i, None)
        self._changes.append(f"remove-snapshots {sorted(ids)}")
        return self

    # -- statistics and keys -------------------------------------------------------------

    def set_statistics(self, statistics: StatisticsFile) -> MetadataBuilder:
        """Register (or replace) the statistics file of ``statistics.snapshot_id``."""
        if self._statistics.get(statistics.snapshot_id) != statistics:
            self._statistics[statistics.snapshot_id] = statistics
            self._changes.append(f"set-statistics {statistics.snapshot_id}")
        return self

    def remove_statistics(self, snapshot_id: int) -> MetadataBuilder:
        if self._statistics.pop(snapshot_id, None) is not None:
            self._changes.append(f"remove-statistics {snapshot_id}")
        return self

    def set_partition_statistics(self, statistics: PartitionStatisticsFile) -> MetadataBuilder:
        if self._partition_statistics.get(statistics.snapshot_id) != statistics:
            self._partition_statistics[statistics.snapshot_id] = statistics
            self._changes.append(f"set-partition-statistics {statistics.snapshot_id}")
        return self

    def remove_partition_statistics(self, snapshot_id: int) -> MetadataBuilder:
        if self._partition_statistics.pop(snapshot_id, None) is not None:
            self._changes.append(f"remove-partition-statistics {snapshot_id}")
        return self

    def add_encryption_key(self, key: EncryptedKey) -> MetadataBuilder:
        if self._encryption_keys.get(key.key_id) != key:
            self._encryption_keys[key.key_id] = key
            self._changes.append(f"add-encryption-key {key.key_id}")
        return self

    def remove_encryption_key(self, key_id: str) -> MetadataBuilder:
        if self._encryption_keys.pop(key_id, None) is not None:
            self._changes.append(f"remove-encryption-key {key_id}")
        return self

    # -- result ----------------------------------------------------------------------------

    def build(self, metadata_location: str | None = None) -> TableMetadata:
        """The new metadata, fully validated.

        ``metadata_location`` is the base's own metadata file: it goes into the
        ``metadata-log`` (trimmed to ``write.metadata.previous-versions-max`` entries). With
        no changes the base itself is returned, since no new metadata file is needed.
        """
        if self._base is not None and not self._changes:
            return self._base
        last_updated_ms = self._last_updated_ms if self._last_updated_ms is not None else _now_ms()

        snapshot_log = list(self._snapshot_log) + [
            SnapshotLogEntry(
                snapshot_id=sid, timestamp_ms=last_updated_ms if stamp is None else stamp
            )
            for sid, stamp in self._new_log_entries
        ]
        # "When snapshots are expired ..., all entries before a snapshot that has expired
        # should be removed": keep only the history after the last expired entry.
        live = {s.snapshot_id for s in self._snapshots}
        kept: list[SnapshotLogEntry] = []
        for entry in snapshot_log:
            if entry.snapshot_id in live:
                kept.append(entry)
            else:
                kept.clear()

        metadata_log = list(self._metadata_log)
        if metadata_location is not None and self._base is not None:
            metadata_log.append(
                MetadataLogEntry(
                    metadata_file=metadata_location, timestamp_ms=self._base.last_updated_ms
                )
            )
        raw_max = self._properties.get(METADATA_PREVIOUS_VERSIONS_MAX)
        try:
            keep = METADATA_PREVIOUS_VERSIONS_MAX_DEFAULT if raw_max is None else int(raw_max)
        except ValueError:
            raise ValidationError(
                f"table property {METADATA_PREVIOUS_VERSIONS_MAX!r} must be an integer, "
                f"got {raw_max!r}"
            ) from None
        keep = max(1, keep)
        metadata_log = metadata_log[-keep:]

        specs = self._specs
        default_spec_id = self._default_spec_id
        orders = self._sort_orders
        default_order_id = self._default_sort_order_id
        if self._base is None:
            if not self._schemas:
                raise ValidationError("a new table needs a schema: add an add-schema update")
            if not self._location:
                raise ValidationError("a new table needs a location: add a set-location update")
            # A table created from updates without a spec or order is unpartitioned, unsorted.
            if not specs:
                specs, default_spec_id = [PartitionSpec.unpartitioned()], INITIAL_SPEC_ID
            if not orders:
                orders, default_order_id = [SortOrder.unsorted()], UNSORTED_ORDER_ID
        return model_from_json(
            TableMetadata,
            {
                "format_version": self._format_version,
                "table_uuid": self._uuid if self._uuid is not None else uuid4(),
                "location": self._location,
                "last_sequence_number": self._last_sequence_number,
                "last_updated_ms": last_updated_ms,
                "last_column_id": self._last_column_id,
                "schemas": tuple(self._schemas),
                "current_schema_id": self._current_schema_id,
                "partition_specs": tuple(specs),
                "default_spec_id": default_spec_id,
                "last_partition_id": self._last_partition_id,
                "sort_orders": tuple(orders),
                "default_sort_order_id": default_order_id,
                "properties": dict(self._properties),
                "current_snapshot_id": self._current_snapshot_id,
                "refs": dict(self._refs),
                "snapshots": tuple(self._snapshots),
                "snapshot_log": tuple(kept),
                "metadata_log": tuple(metadata_log),
                "statistics": tuple(self._statistics.values()),
                "partition_statistics": tuple(self._partition_statistics.values()),
                "next_row_id": self._next_row_id,
                "encryption_keys": tuple(self._encryption_keys.values()),
            },
            "updated table metadata",
        )


__all__ = [
    "LAST_ADDED",
    "METADATA_PREVIOUS_VERSIONS_MAX",
    "MetadataBuilder",
    "new_table_metadata",
]
