"""The REST catalog's ``TableUpdate`` actions: their JSON models and how each is applied.

A REST ``updateTable`` call, a ``table_changes`` commit and the coordinator's own commits all
speak these actions (``{"action": "add-snapshot", ...}``). Each is a pydantic model that
parses and writes the spec's JSON and applies itself as one call on
:class:`~icefloe.spec.metadata_builder.MetadataBuilder`, so the rules (ids never reused, ``-1``
for "the one added last", ...) live in the builder alone and the wire format lives here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import (
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    TypeAdapter,
    field_serializer,
    field_validator,
    model_validator,
)

from icefloe.errors import ValidationError
from icefloe.spec.metadata import (
    EncryptedKey,
    TableMetadata,
)
from icefloe.spec.metadata_builder import MetadataBuilder
from icefloe.spec.model import IcebergModel, model_from_json, union_from_json
from icefloe.spec.partition import PARTITION_FIELD_ID_START, PartitionSpec
from icefloe.spec.schema import Schema
from icefloe.spec.snapshot import (
    PartitionStatisticsFile,
    Snapshot,
    SnapshotRef,
    SnapshotRefType,
    StatisticsFile,
)
from icefloe.spec.sort_order import SortOrder


class _Update(IcebergModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)  # Schema, PartitionSpec, ...

    def apply(self, builder: MetadataBuilder) -> None:
        raise NotImplementedError  # pragma: no cover - every action overrides


class AssignUUIDUpdate(_Update):
    action: Literal["assign-uuid"] = "assign-uuid"
    uuid: UUID

    def apply(self, builder: MetadataBuilder) -> None:
        builder.assign_uuid(self.uuid)


class UpgradeFormatVersionUpdate(_Update):
    action: Literal["upgrade-format-version"] = "upgrade-format-version"
    format_version: StrictInt

    def apply(self, builder: MetadataBuilder) -> None:
        builder.upgrade_format_version(self.format_version)


class AddSchemaUpdate(_Update):
    action: Literal["add-schema"] = "add-schema"
    schema_: Schema = Field(validation_alias="schema", serialization_alias="schema")
    last_column_id: StrictInt | None = None

    @field_validator("schema_", mode="before")
    @classmethod
    def _parse(cls, value: Any) -> Any:
        return value if isinstance(value, Schema) else Schema.from_json(value)

    @field_serializer("schema_")
    def _dump(self, value: Schema) -> Any:
        return value.to_json()

    def apply(self, builder: MetadataBuilder) -> None:
        builder.add_schema(self.schema_, self.last_column_id)


class SetCurrentSchemaUpdate(_Update):
    action: Literal["set-current-schema"] = "set-current-schema"
    schema_id: StrictInt

    def apply(self, builder: MetadataBuilder) -> None:
        builder.set_current_schema(self.schema_id)


def _with_placeholder_ids(spec: dict[str, Any]) -> dict[str, Any]:
    fields = spec.get("fields")
    if not isinstance(fields, list):
        raise ValidationError(f"add-spec: spec needs a 'fields' list, got {spec!r:.200}")
    filled = [
        {**f, "field-id": PARTITION_FIELD_ID_START + i}
        if isinstance(f, dict) and f.get("field-id") is None
        else f
        for i, f in enumerate(fields)
    ]
    return {**spec, "spec-id": spec.get("spec-id", 0), "fields": filled}


class AddPartitionSpecUpdate(_Update):
    """``add-spec``. Clients may leave ``spec-id`` and field ids out: the table assigns them."""

    action: Literal["add-spec"] = "add-spec"
    spec: dict[str, Any]

    @field_validator("spec", mode="before")
    @classmethod
    def _parse(cls, value: Any) -> Any:
        if isinstance(value, PartitionSpec):
            return value.to_json()
        if not isinstance(value, dict):
            raise ValidationError(f"add-spec: spec must be a JSON object, got {value!r:.100}")
        PartitionSpec.from_json(_with_placeholder_ids(value))  # refuse bad specs at parse time
        return value

    def bind(self, builder: MetadataBuilder) -> PartitionSpec:
        """The spec with field ids: kept if given, else the id an earlier spec used for the
        same source and transform, else the next unused one (v1: 1000, 1001, ... in order)."""
        fields = self.spec["fields"]
        known = {
            (f.source_id, str(f.transform)): f.field_id
            for s in builder.partition_specs
            for f in s.fields
        }
        next_id = builder.last_partition_id
        filled = []
        for i, f in enumerate(fields):
            if f.get("field-id") is None:
                if builder.format_version == 1:
                    field_id = PARTITION_FIELD_ID_START + i
                else:
                    key = (f.get("source-id"), str(f.get("transform")))
                    reused = known.get(key)
                    if reused is None:
                        next_id += 1
                        field_id = next_id
                    else:
                        field_id = reused
                f = {**f, "field-id": field_id}
            filled.append(f)
        return PartitionSpec.from_json(
            {**self.spec, "spec-id": self.spec.get("spec-id", 0), "fields": filled}
        )

    def apply(self, builder: MetadataBuilder) -> None:
        builder.add_partition_spec(self.bind(builder))


class SetDefaultSpecUpdate(_Update):
    action: Literal["set-default-spec"] = "set-default-spec"
    spec_id: StrictInt

    def apply(self, builder: MetadataBuilder) -> None:
        builder.set_default_spec(self.spec_id)


class AddSortOrderUpdate(_Update):
    action: Literal["add-sort-order"] = "add-sort-order"
    sort_order: SortOrder

    @field_validator("sort_order", mode="before")
    @classmethod
    def _parse(cls, value: Any) -> Any:
        return value if isinstance(value, SortOrder) else SortOrder.from_json(value)

    @field_serializer("sort_order")
    def _dump(self, value: SortOrder) -> Any:
        return value.to_json()

    def apply(self, builder: MetadataBuilder) -> None:
        builder.add_sort_order(self.sort_order)


class SetDefaultSortOrderUpdate(_Update):
    action: Literal["set-default-sort-order"] = "set-default-sort-order"
    sort_order_id: StrictInt

    def apply(self, builder: MetadataBuilder) -> None:
        builder.set_default_sort_order(self.sort_order_id)


class AddSnapshotUpdate(_Update):
    action: Literal["add-snapshot"] = "add-snapshot"
    snapshot: Snapshot

    def apply(self, builder: MetadataBuilder) -> None:
        builder.add_snapshot(self.snapshot)


class SetSnapshotRefUpdate(_Update):
    action: Literal["set-snapshot-ref"] = "set-snapshot-ref"
    ref_name: StrictStr
    snapshot_id: StrictInt
    ref_type: SnapshotRefType = Field(validation_alias="type", serialization_alias="type")
    min_snapshots_to_keep: StrictInt | None = None
    max_snapshot_age_ms: StrictInt | None = None
    max_ref_age_ms: StrictInt | None = None

    @model_validator(mode="after")
    def _check(self) -> SetSnapshotRefUpdate:
        self.ref()
        return self

    def ref(self) -> SnapshotRef:
        return model_from_json(
            SnapshotRef,
            {
                "snapshot_id": self.snapshot_id,
                "ref_type": self.ref_type,
                "min_snapshots_to_keep": self.min_snapshots_to_keep,
                "max_snapshot_age_ms": self.max_snapshot_age_ms,
                "max_ref_age_ms": self.max_ref_age_ms,
            },
            f"set-snapshot-ref {self.ref_name!r}",
        )

    def apply(self, builder: MetadataBuilder) -> None:
        builder.set_ref(self.ref_name, self.ref())


class RemoveSnapshotsUpdate(_Update):
    action: Literal["remove-snapshots"] = "remove-snapshots"
    snapshot_ids: tuple[StrictInt, ...]

    def apply(self, builder: MetadataBuilder) -> None:
        builder.remove_snapshots(self.snapshot_ids)


class RemoveSnapshotRefUpdate(_Update):
    action: Literal["remove-snapshot-ref"] = "remove-snapshot-ref"
    ref_name: StrictStr

    def apply(self, builder: MetadataBuilder) -> None:
        builder.remove_ref(self.ref_name)


class SetLocationUpdate(_Update):
    action: Literal["set-location"] = "set-location"
    location: StrictStr

    def apply(self, builder: MetadataBuilder) -> None:
        builder.set_location(self.location)


class SetPropertiesUpdate(_Update):
    action: Literal["set-properties"] = "set-properties"
    updates: dict[StrictStr, StrictStr]

    def apply(self, builder: MetadataBuilder) -> None:
        builder.set_properties(self.updates)


class RemovePropertiesUpdate(_Update):
    action: Literal["remove-properties"] = "remove-properties"
    removals: tuple[StrictStr, ...]

    def apply(self, builder: MetadataBuilder) -> None:
        builder.remove_properties(self.removals)


class SetStatisticsUpdate(_Update):
    action: Literal["set-statistics"] = "set-statistics"
    # Deprecated in the REST API in favour of statistics.snapshot-id; checked when given.
    snapshot_id: StrictInt | None = None
    statistics: StatisticsFile

    @model_validator(mode="after")
    def _check(self) -> SetStatisticsUpdate:
        if self.snapshot_id is not None and self.snapshot_id != self.statistics.snapshot_id:
            raise ValidationError(
                f"set-statistics: snapshot-id {self.snapshot_id} differs from the statistics "
                f"file's snapshot-id {self.statistics.snapshot_id}"
            )
        return self

    def apply(self, builder: MetadataBuilder) -> None:
        builder.set_statistics(self.statistics)


class RemoveStatisticsUpdate(_Update):
    action: Literal["remove-statistics"] = "remove-statistics"
    snapshot_id: StrictInt

    def apply(self, builder: MetadataBuilder) -> None:
        builder.remove_statistics(self.snapshot_id)


class SetPartitionStatisticsUpdate(_Update):
    action: Literal["set-partition-statistics"] = "set-partition-statistics"
    partition_statistics: PartitionStatisticsFile

    def apply(self, builder: MetadataBuilder) -> None:
        builder.set_partition_statistics(self.partition_statistics)


class RemovePartitionStatisticsUpdate(_Update):
    action: Literal["remove-partition-statistics"] = "remove-partition-statistics"
    snapshot_id: StrictInt

    def apply(self, builder: MetadataBuilder) -> None:
        builder.remove_partition_statistics(self.snapshot_id)


class RemovePartitionSpecsUpdate(_Update):
    action: Literal["remove-partition-specs"] = "remove-partition-specs"
    spec_ids: tuple[StrictInt, ...]

    def apply(self, builder: MetadataBuilder) -> None:
        builder.remove_partition_specs(self.spec_ids)


class RemoveSchemasUpdate(_Update):
    action: Literal["remove-schemas"] = "remove-schemas"
    schema_ids: tuple[StrictInt, ...]

    def apply(self, builder: MetadataBuilder) -> None:
        builder.remove_schemas(self.schema_ids)


class AddEncryptionKeyUpdate(_Update):
    action: Literal["add-encryption-key"] = "add-encryption-key"
    encryption_key: EncryptedKey

    def apply(self, builder: MetadataBuilder) -> None:
        builder.add_encryption_key(self.encryption_key)


class RemoveEncryptionKeyUpdate(_Update):
    action: Literal["remove-encryption-key"] = "remove-encryption-key"
    key_id: StrictStr

    def apply(self, builder: MetadataBuilder) -> None:
        builder.remove_encryption_key(self.key_id)


TableUpdate = Annotated[
    AssignUUIDUpdate
    | UpgradeFormatVersionUpdate
    | AddSchemaUpdate
    | SetCurrentSchemaUpdate
    | AddPartitionSpecUpdate
    | SetDefaultSpecUpdate
    | AddSortOrderUpdate
    | SetDefaultSortOrderUpdate
    | AddSnapshotUpdate
    | SetSnapshotRefUpdate
    | RemoveSnapshotsUpdate
    | RemoveSnapshotRefUpdate
    | SetLocationUpdate
    | SetPropertiesUpdate
    | RemovePropertiesUpdate
    | SetStatisticsUpdate
    | RemoveStatisticsUpdate
    | SetPartitionStatisticsUpdate
    | RemovePartitionStatisticsUpdate
    | RemovePartitionSpecsUpdate
    | RemoveSchemasUpdate
    | AddEncryptionKeyUpdate
    | RemoveEncryptionKeyUpdate,
    Field(discriminator="action"),
]
_UPDATE_ADAPTER: TypeAdapter[TableUpdate] = TypeAdapter(TableUpdate)


def parse_table_update(obj: Any) -> TableUpdate:
    """One REST update action (``{"action": "add-snapshot", ...}``) as a typed update."""
    if isinstance(obj, _Update):
        return obj  # type: ignore[return-value]
    what = f"table update {obj.get('action')!r}" if isinstance(obj, dict) else "table update"
    return union_from_json(_UPDATE_ADAPTER, obj, what)


def apply_updates(
    base: TableMetadata | None,
    updates: Iterable[TableUpdate | Mapping[str, Any]],
    metadata_location: str | None = None,
) -> TableMetadata:
    """Apply REST update actions in order and build the new metadata.

    ``base`` None creates a table; its format version is the one an
    ``upgrade-format-version`` update asks for, else the default.
    """
    parsed = [parse_table_update(u) for u in updates]
    builder = MetadataBuilder(base)
    if base is None:
        for u in parsed:
            if isinstance(u, UpgradeFormatVersionUpdate):
                builder.upgrade_format_version(u.format_version)
                break
    for u in parsed:
        u.apply(builder)
    return builder.build(metadata_location)


__all__ = [
    "AddEncryptionKeyUpdate",
    "AddPartitionSpecUpdate",
    "AddSchemaUpdate",
    "AddSnapshotUpdate",
    "AddSortOrderUpdate",
    "AssignUUIDUpdate",
    "RemoveEncryptionKeyUpdate",
    "RemovePartitionSpecsUpdate",
    "RemovePartitionStatisticsUpdate",
    "RemovePropertiesUpdate",
    "RemoveSchemasUpdate",
    "RemoveSnapshotRefUpdate",
    "RemoveSnapshotsUpdate",
    "RemoveStatisticsUpdate",
    "SetCurrentSchemaUpdate",
    "SetDefaultSortOrderUpdate",
    "SetDefaultSpecUpdate",
    "SetLocationUpdate",
    "SetPartitionStatisticsUpdate",
    "SetPropertiesUpdate",
    "SetSnapshotRefUpdate",
    "SetStatisticsUpdate",
    "TableUpdate",
    "UpgradeFormatVersionUpdate",
    "apply_updates",
    "parse_table_update",
]
