"""Table schemas: a struct with a schema id, identifier fields and lookups by id and name.

Names of nested fields are dotted paths from the root (``location.lat``, ``tags.element``,
``props.key``), as Iceberg's engines spell them. Lookups are built once per schema because
schemas are immutable and the planner binds many filters to the same one.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import cached_property
from typing import Any, Generic, TypeVar

from icefloe.errors import ValidationError
from icefloe.spec.type_json import field_from_json, field_to_json
from icefloe.spec.types import (
    IcebergType,
    ListType,
    MapType,
    NestedField,
    NestedType,
    PrimitiveType,
    StructType,
    walk_fields,
)

# Field ids above this are reserved for metadata columns (spec: "Reserved Field IDs").
MAX_FIELD_ID = 2147483447
# The metadata columns of the spec's table: they may appear in data files (v3 writes the
# row-lineage columns ``_row_id`` and ``_last_updated_sequence_number`` into them), in
# position delete files and in read schemas, but never in a table's own schemas (the table
# metadata refuses them there).
METADATA_COLUMN_IDS = frozenset(
    {
        2147483646,  # _file
        2147483645,  # _pos
        2147483644,  # _deleted
        2147483643,  # _spec_id
        2147483642,  # _partition
        2147483546,  # file_path (position deletes)
        2147483545,  # pos (position deletes)
        2147483544,  # row (position deletes)
        2147483543,  # _change_type
        2147483542,  # _change_ordinal
        2147483541,  # _commit_snapshot_id
        2147483540,  # _row_id
        2147483539,  # _last_updated_sequence_number
    }
)
DEFAULT_SCHEMA_ID = 0

T = TypeVar("T")


class Schema:
    """An immutable table schema."""

    __slots__ = ("__dict__", "identifier_field_ids", "schema_id", "struct")

    def __init__(
        self,
        *fields: NestedField,
        schema_id: int = DEFAULT_SCHEMA_ID,
        identifier_field_ids: tuple[int, ...] | list[int] = (),
    ) -> None:
        self.struct = StructType(*fields)
        self.schema_id = schema_id
        self.identifier_field_ids = tuple(identifier_field_ids)
        self._validate()

    # -- construction -------------------------------------------------------------------

    @classmethod
    def from_struct(
        cls, struct: StructType, schema_id: int = DEFAULT_SCHEMA_ID, identifier_field_ids: Any = ()
    ) -> Schema:
        return cls(*struct.fields, schema_id=schema_id, identifier_field_ids=identifier_field_ids)

    @classmethod
    def from_json(cls, obj: Any) -> Schema:
        """Parse Appendix C schema JSON. ``schema-id`` defaults to 0 (optional in v1)."""
        if not isinstance(obj, dict):
            raise ValidationError(f"a schema must be a JSON object, got {obj!r:.200}")
        if obj.get("type", "struct") != "struct":
            raise ValidationError(f"a schema must have type 'struct', got {obj.get('type')!r}")
        fields = obj.get("fields")
        if not isinstance(fields, list):
            raise ValidationError(f"schema is missing its 'fields' list: {obj!r:.200}")
        schema_id = obj.get("schema-id", DEFAULT_SCHEMA_ID)
        if isinstance(schema_id, bool) or not isinstance(schema_id, int):
            raise ValidationError(f"'schema-id' must be an integer, got {schema_id!r}")
        ids = obj.get("identifier-field-ids") or []
        if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
            raise ValidationError(f"'identifier-field-ids' must be a list of ints, got {ids!r}")
        return cls(
            *(field_from_json(f) for f in fields), schema_id=schema_id, identifier_field_ids=ids
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "struct", "schema-id": self.schema_id}
        if self.identifier_field_ids:
            out["identifier-field-ids"] = list(self.identifier_field_ids)
        out["fields"] = [field_to_json(f) for f in self.struct.fields]
        return out

    def with_id(self, schema_id: int) -> Schema:
        return Schema(
            *self.fields, schema_id=schema_id, identifier_field_ids=self.identifier_field_ids
        )

    # -- validation ---------------------------------------------------------------------

    def _validate(self) -> None:
        seen: dict[int, str] = {}
        for path, f in self._paths():
            if f.field_id in seen:
                raise ValidationError(
                    f"field id {f.field_id} is used twice in schema {self.schema_id}: "
                    f"{seen[f.field_id]!r} and {path!r}"
                )
            if f.field_id > MAX_FIELD_ID and f.field_id not in METADATA_COLUMN_IDS:
                raise ValidationError(
                    f"field {path!r} has id {f.field_id}, above the reserved limit {MAX_FIELD_ID}"
                )
            seen[f.field_id] = path
        for fid in self.identifier_field_ids:
            ident = self.find_field(fid)
            if ident is None:
                raise ValidationError(
                    f"identifier field id {fid} is not a field of schema {self.schema_id}"
                )
            if not isinstance(ident.field_type, PrimitiveType) or not ident.required:
                kind = "required" if ident.required else "optional"
                raise ValidationError(
                    f"identifier field {self.find_column_name(fid)!r} must be a required "
                    f"primitive field, got {kind} {ident.field_type}"
                )

    # -- lookups ------------------------------------------------------------------------

    @property
    def fields(self) -> tuple[NestedField, ...]:
        return self.struct.fields

    def _paths(self) -> Iterator[tuple[str, NestedField]]:
        def walk(prefix: str, t: NestedType) -> Iterator[tuple[str, NestedField]]:
            for f in t.fields:
                path = f"{prefix}{f.name}"
                yield path, f
                if isinstance(f.field_type, NestedType):
                    yield from walk(path + ".", f.field_type)

        return walk("", self.struct)

    @cached_property
    def _by_id(self) -> dict[int, NestedField]:
        return {f.field_id: f for f in walk_fields(self.struct)}

    @cached_property
    def _name_by_id(self) -> dict[int, str]:
        return {f.field_id: path for path, f in self._paths()}

    @cached_property
    def _id_by_name(self) -> dict[str, int]:
        return {path: f.field_id for path, f in self._paths()}

    @cached_property
    def _id_by_lower_name(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for path, fid in self._id_by_name.items():
            out.setdefault(path.lower(), fid)
        return out

    @cached_property
    def _parent_by_id(self) -> dict[int, int]:
        parents: dict[int, int] = {}
        for f in walk_fields(self.struct):
            if isinstance(f.field_type, NestedType):
                for child in f.field_type.fields:
                    parents[child.field_id] = f.field_id
        return parents

    @property
    def highest_field_id(self) -> int:
        return max(self._by_id, default=0)

    def find_field(self, key: int | str, case_sensitive: bool = True) -> NestedField | None:
        """A field by id or by dotted name, or None."""
        if isinstance(key, int):
            return self._by_id.get(key)
        fid = self.find_field_id(key, case_sensitive)
        return None if fid is None else self._by_id[fid]

    def find_field_id(self, name: str, case_sensitive: bool = True) -> int | None:
        if case_sensitive:
            return self._id_by_name.get(name)
        return self._id_by_lower_name.get(name.lower())

    def field(self, key: int | str, case_sensitive: bool = True) -> NestedField:
        """Like :meth:`find_field` but raises a ValidationError naming the missing column."""
        f = self.find_field(key, case_sensitive)
        if f is None:
            what = f"id {key}" if isinstance(key, int) else repr(key)
            raise ValidationError(f"schema {self.schema_id} has no field {what}")
        return f

    def find_type(self, key: int | str, case_sensitive: bool = True) -> IcebergType:
        return self.field(key, case_sensitive).field_type

    def find_column_name(self, field_id: int) -> str | None:
        return self._name_by_id.get(field_id)

    def parent_id(self, field_id: int) -> int | None:
        return self._parent_by_id.get(field_id)

    def is_in_list_or_map(self, field_id: int) -> bool:
        """Whether a field sits (at any depth) inside a list or map: such columns have no bounds."""
        pid = self._parent_by_id.get(field_id)
        while pid is not None:
            if isinstance(self._by_id[pid].field_type, (ListType, MapType)):
                return True
            pid = self._parent_by_id.get(pid)
        return False

    @property
    def column_names(self) -> list[str]:
        return list(self._id_by_name)

    def all_fields(self) -> Iterator[NestedField]:
        return walk_fields(self.struct)

    def select(self, names: list[str], case_sensitive: bool = True) -> Schema:
        """A projection keeping the named columns (and the structs that contain them)."""
        wanted: set[int] = set()
        for n in names:
            fid = self.find_field_id(n, case_sensitive)
            if fid is None:
                raise ValidationError(
                    f"cannot select {n!r}: schema {self.schema_id} has no such column"
                )
            wanted.add(fid)
            # keep every child of a selected nested column
            f = self._by_id[fid]
            if isinstance(f.field_type, NestedType):
                wanted.update(c.field_id for c in walk_fields(f.field_type))
            pid = self._parent_by_id.get(fid)
            while pid is not None:
                wanted.add(pid)
                pid = self._parent_by_id.get(pid)
        return Schema(*_prune(self.struct, wanted).fields, schema_id=self.schema_id)

    # -- value semantics ------------------------------------------------------------------

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Schema)
            and other.struct == self.struct
            and other.identifier_field_ids == self.identifier_field_ids
        )

    def same_columns(self, other: Schema) -> bool:
        """Equal apart from schema id: used to reuse an existing schema instead of adding one."""
        return self.struct == other.struct and set(self.identifier_field_ids) == set(
            other.identifier_field_ids
        )

    def __hash__(self) -> int:
        return hash((self.struct, self.identifier_field_ids))

    def __repr__(self) -> str:
        return f"Schema(schema_id={self.schema_id}, fields={self.struct})"

    def __str__(self) -> str:
        lines = [f"table {{  # schema {self.schema_id}"]
        lines += [f"  {f}" for f in self.fields]
        lines.append("}")
        return "\n".join(lines)


def _prune(t: NestedType, wanted: set[int]) -> StructType:
    assert isinstance(t, StructType)
    kept: list[NestedField] = []
    for f in t.fields:
        if f.field_id not in wanted:
            continue
        if isinstance(f.field_type, StructType):
            kept.append(f.replace(field_type=_prune(f.field_type, wanted)))
        else:
            kept.append(f)
    return StructType(*kept)


class SchemaVisitor(Generic[T]):
    """Post-order visitor over a schema; override the hooks you need.

    ``field`` receives the already-visited result of the field's type. Visitors keep
    recursion out of every caller (Avro conversion, pyarrow conversion, pruning, ...).
    """

    def schema(self, schema: Schema, struct_result: T) -> T:
        return struct_result

    def struct(self, struct: StructType, field_results: list[T]) -> T:
        raise NotImplementedError(f"{type(self).__name__} does not handle structs")

    def field(self, field: NestedField, field_result: T) -> T:
        return field_result

    def list(self, list_type: ListType, element_result: T) -> T:
        raise NotImplementedError(f"{type(self).__name__} does not handle lists")

    def map(self, map_type: MapType, key_result: T, value_result: T) -> T:
        raise NotImplementedError(f"{type(self).__name__} does not handle maps")

    def primitive(self, primitive: PrimitiveType) -> T:
        raise NotImplementedError(f"{type(self).__name__} does not handle primitives")


def visit(obj: Schema | IcebergType, visitor: SchemaVisitor[T]) -> T:
    """Run ``visitor`` over a schema or a type."""
    if isinstance(obj, Schema):
        return visitor.schema(obj, visit(obj.struct, visitor))
    if isinstance(obj, StructType):
        return visitor.struct(
            obj, [visitor.field(f, visit(f.field_type, visitor)) for f in obj.fields]
        )
    if isinstance(obj, ListType):
        return visitor.list(obj, visitor.field(obj.element_field, visit(obj.element_type, visitor)))
    if isinstance(obj, MapType):
        return visitor.map(
            obj,
            visitor.field(obj.key_field, visit(obj.key_type, visitor)),
            visitor.field(obj.value_field, visit(obj.value_type, visitor)),
        )
    if isinstance(obj, PrimitiveType):
        return visitor.primitive(obj)
    raise ValidationError(f"cannot visit {obj!r}")
