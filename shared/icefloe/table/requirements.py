"""The REST catalog's ``TableRequirement`` checks: the optimistic-concurrency half of a commit.

A commit states what it assumed of the table (``assert-ref-snapshot-id``,
``assert-current-schema-id``, ...) and is refused with :class:`CommitFailedError` when the
current metadata says otherwise, before any update is applied. The checks read metadata and
build nothing, so they stand apart from the builder and the updates.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import (
    Field,
    StrictInt,
    StrictStr,
    TypeAdapter,
)

from icefloe.errors import CommitFailedError
from icefloe.spec.metadata import (
    TableMetadata,
)
from icefloe.spec.model import IcebergModel, union_from_json


class _Requirement(IcebergModel):
    def validate(self, base: TableMetadata | None) -> None:  # type: ignore[override]
        raise NotImplementedError  # pragma: no cover - every requirement overrides

    def _existing(self, base: TableMetadata | None) -> TableMetadata:
        if base is None:
            name = getattr(self, "type", "requirement")
            raise CommitFailedError(f"requirement {name} failed: the table does not exist")
        return base

    def to_json(self) -> dict[str, Any]:
        # exclude_none would drop assert-ref-snapshot-id's meaningful null
        return self.model_dump(by_alias=True, mode="json")


class AssertCreate(_Requirement):
    type: Literal["assert-create"] = "assert-create"

    def validate(self, base: TableMetadata | None) -> None:  # type: ignore[override]
        if base is not None:
            raise CommitFailedError(
                f"requirement assert-create failed: table {base.location} already exists"
            )


class AssertTableUUID(_Requirement):
    type: Literal["assert-table-uuid"] = "assert-table-uuid"
    uuid: UUID

    def validate(self, base: TableMetadata | None) -> None:  # type: ignore[override]
        current = self._existing(base).table_uuid
        if current != self.uuid:
            raise CommitFailedError(
                f"requirement assert-table-uuid failed: table uuid is {current}, expected {self.uuid}"
            )


class AssertRefSnapshotId(_Requirement):
    """The ref points at ``snapshot-id``; with ``null``, the ref must not exist yet."""

    type: Literal["assert-ref-snapshot-id"] = "assert-ref-snapshot-id"
    ref: StrictStr
    snapshot_id: StrictInt | None

    def validate(self, base: TableMetadata | None) -> None:  # type: ignore[override]
        existing = self._existing(base).refs.get(self.ref)
        if existing is None and self.snapshot_id is not None:
            raise CommitFailedError(
                f"requirement assert-ref-snapshot-id failed: ref {self.ref!r} is missing, "
                f"expected it at snapshot {self.snapshot_id}"
            )
        if existing is not None and self.snapshot_id is None:
            raise CommitFailedError(
                f"requirement assert-ref-snapshot-id failed: ref {self.ref!r} was created "
                f"concurrently (at snapshot {existing.snapshot_id})"
            )
        if existing is not None and existing.snapshot_id != self.snapshot_id:
            raise CommitFailedError(
                f"requirement assert-ref-snapshot-id failed: ref {self.ref!r} is at snapshot "
                f"{existing.snapshot_id}, expected {self.snapshot_id}"
            )


class AssertLastAssignedFieldId(_Requirement):
    type: Literal["assert-last-assigned-field-id"] = "assert-last-assigned-field-id"
    last_assigned_field_id: StrictInt

    def validate(self, base: TableMetadata | None) -> None:  # type: ignore[override]
        current = self._existing(base).last_column_id
        if current != self.last_assigned_field_id:
            raise CommitFailedError(
                f"requirement assert-last-assigned-field-id failed: last-column-id is {current}, "
                f"expected {self.last_assigned_field_id}"
            )


class AssertCurrentSchemaId(_Requirement):
    type: Literal["assert-current-schema-id"] = "assert-current-schema-id"
    current_schema_id: StrictInt

    def validate(self, base: TableMetadata | None) -> None:  # type: ignore[override]
        current = self._existing(base).current_schema_id
        if current != self.current_schema_id:
            raise CommitFailedError(
                f"requirement assert-current-schema-id failed: current schema is {current}, "
                f"expected {self.current_schema_id}"
            )


class AssertLastAssignedPartitionId(_Requirement):
    type: Literal["assert-last-assigned-partition-id"] = "assert-last-assigned-partition-id"
    last_assigned_partition_id: StrictInt

    def validate(self, base: TableMetadata | None) -> None:  # type: ignore[override]
        current = self._existing(base).last_partition_id
        if current != self.last_assigned_partition_id:
            raise CommitFailedError(
                f"requirement assert-last-assigned-partition-id failed: last-partition-id is "
                f"{current}, expected {self.last_assigned_partition_id}"
            )


class AssertDefaultSpecId(_Requirement):
    type: Literal["assert-default-spec-id"] = "assert-default-spec-id"
    default_spec_id: StrictInt

    def validate(self, base: TableMetadata | None) -> None:  # type: ignore[override]
        current = self._existing(base).default_spec_id
        if current != self.default_spec_id:
            raise CommitFailedError(
                f"requirement assert-default-spec-id failed: default spec is {current}, "
                f"expected {self.default_spec_id}"
            )


class AssertDefaultSortOrderId(_Requirement):
    type: Literal["assert-default-sort-order-id"] = "assert-default-sort-order-id"
    default_sort_order_id: StrictInt

    def validate(self, base: TableMetadata | None) -> None:  # type: ignore[override]
        current = self._existing(base).default_sort_order_id
        if current != self.default_sort_order_id:
            raise CommitFailedError(
                f"requirement assert-default-sort-order-id failed: default sort order is "
                f"{current}, expected {self.default_sort_order_id}"
            )


TableRequirement = Annotated[
    AssertCreate
    | AssertTableUUID
    | AssertRefSnapshotId
    | AssertLastAssignedFieldId
    | AssertCurrentSchemaId
    | AssertLastAssignedPartitionId
    | AssertDefaultSpecId
    | AssertDefaultSortOrderId,
    Field(discriminator="type"),
]
_REQUIREMENT_ADAPTER: TypeAdapter[TableRequirement] = TypeAdapter(TableRequirement)


def parse_table_requirement(obj: Any) -> TableRequirement:
    """One REST requirement (``{"type": "assert-ref-snapshot-id", ...}``) as a typed check."""
    if isinstance(obj, _Requirement):
        return obj  # type: ignore[return-value]
    what = f"table requirement {obj.get('type')!r}" if isinstance(obj, dict) else "requirement"
    return union_from_json(_REQUIREMENT_ADAPTER, obj, what)


def validate_requirements(
    base: TableMetadata | None, requirements: Iterable[TableRequirement | Mapping[str, Any]]
) -> None:
    """Raise CommitFailedError naming the first requirement the current metadata breaks."""
    for r in requirements:
        parse_table_requirement(r).validate(base)


__all__ = [
    "AssertCreate",
    "AssertCurrentSchemaId",
    "AssertDefaultSortOrderId",
    "AssertDefaultSpecId",
    "AssertLastAssignedFieldId",
    "AssertLastAssignedPartitionId",
    "AssertRefSnapshotId",
    "AssertTableUUID",
    "TableRequirement",
    "parse_table_requirement",
    "validate_requirements",
]
