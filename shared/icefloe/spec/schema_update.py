"""Schema evolution (spec: "Schema Evolution", "Default values") and fresh field ids.

Iceberg resolves columns by id, so evolving a schema is safe only when every change keeps
old data readable under the new schema: ids are never reused, types only widen along the
spec's promotion table, and a column that old files lack needs a default that explains
its value there. :class:`UpdateSchema` collects changes and checks each one when it is
requested, so the error points at the call that was wrong; :meth:`UpdateSchema.apply`
then builds the new schema in one pass.

Paths name columns as they are spelled in the *base* schema (``location.lat``,
``tags.element.x``, ``props.value.y``), or as added earlier in the same builder. A
rename does not change how later calls address the column, exactly as in the reference
implementations; a column added in this change shadows a deleted or renamed base column
with the same name. A dotted string is split on dots; pass a tuple of names to address a
column whose name itself contains a dot.

Why one module past 800 lines: one builder, :class:`UpdateSchema`, whose every check resolves
paths against the same base schema and pending changes; its parts are not usable apart.
"""

from __future__ import annotations

import copy
import itertools
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from enum import Enum
from typing import Any

from icefloe.errors import SchemaEvolutionError, ValidationError
from icefloe.spec.schema import MAX_FIELD_ID, Schema
from icefloe.spec.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    GeographyType,
    GeometryType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    NestedType,
    PrimitiveType,
    StringType,
    StructType,
    TimestampNanoType,
    TimestampType,
    TimestamptzNanoType,
    TimestamptzType,
    TimeType,
    UnknownType,
    UUIDType,
    VariantType,
    walk_fields,
)
from icefloe.spec.values import to_json_value

# Parent id used for the schema's own top-level struct.
TABLE_ROOT_ID = -1

Path = str | tuple[str, ...]

_MICROS_PER_DAY = 86_400 * 1_000_000
_NANOS_PER_DAY = 86_400 * 1_000_000_000
_INT_RANGE = (-(2**31), 2**31 - 1)
_LONG_RANGE = (-(2**63), 2**63 - 1)
# Types whose defaults must always be null (spec: "Default values").
_NULL_DEFAULT_TYPES = (UnknownType, VariantType, GeometryType, GeographyType)


# -- promotions -------------------------------------------------------------------------


def is_promotion_allowed(source: IcebergType, target: IcebergType, format_version: int) -> bool:
    """Whether a column of type ``source`` may evolve to ``target`` in a table of this version.

    Equal types are allowed (a no-op). Only the spec's promotion table widens a type;
    ``unknown`` (v3+) may become any type because it never holds a value. The target must
    itself exist in the format version.
    """
    if target.min_format_version > format_version:
        return False
    if source == target:
        return True
    if isinstance(source, UnknownType):
        return format_version >= 3
    if isinstance(source, IntegerType):
        return isinstance(target, LongType)
    if isinstance(source, FloatType):
        return isinstance(target, DoubleType)
    if isinstance(source, DecimalType):
        return (
            isinstance(target, DecimalType)
            and target.scale == source.scale
            and target.precision > source.precision
        )
    if isinstance(source, DateType):
        return format_version >= 3 and isinstance(target, (TimestampType, TimestampNanoType))
    return False


# -- fresh ids --------------------------------------------------------------------------


def _counter(start: int) -> Callable[[], int]:
    count = itertools.count(start)
    return lambda: next(count)


def _fresh_type(
    t: IcebergType, next_id: Callable[[], int], old_to_new: dict[int, int]
) -> IcebergType:
    """Copy ``t`` with new ids: a struct's own fields are numbered before their children.

    That is the order of the Java and PyIceberg implementations (top-level columns get
    1..n at table creation), so ids agree with tables those engines create.
    """
    if isinstance(t, StructType):
        new_ids = []
        for f in t.fields:
            new_ids.append(next_id())
            old_to_new[f.field_id] = new_ids[-1]
        return StructType(
            *(
                f.replace(
                    field_id=new_id, field_type=_fresh_type(f.field_type, next_id, old_to_new)
                )
                for new_id, f in zip(new_ids, t.fields)
            )
        )
    if isinstance(t, ListType):
        element_id = next_id()
        old_to_new[t.element_id] = element_id
        return ListType(
            element_id, _fresh_type(t.element_type, next_id, old_to_new), t.element_required
        )
    if isinstance(t, MapType):
        key_id = next_id()
        value_id = next_id()
        old_to_new[t.key_id] = key_id
        old_to_new[t.value_id] = value_id
        return MapType(
            key_id,
            _fresh_type(t.key_type, next_id, old_to_new),
            value_id,
            _fresh_type(t.value_type, next_id, old_to_new),
            t.value_required,
        )
    return t


def assign_fresh_ids(
    schema: Schema, next_id: Callable[[], int] | None = None
) -> tuple[Schema, int]:
    """Renumber every field of ``schema`` (from 1 unless ``next_id`` is given).

    Used at table creation, where the caller's ids mean nothing to the table. Identifier
    fields follow their columns; the schema id is kept. Returns the new schema and the
    highest id assigned (0 for a schema without fields), the table's ``last-column-id``.
    """
    source = next_id if next_id is not None else _counter(1)
    assigned: list[int] = []

    def tracked() -> int:
        new_id = source()
        if isinstance(new_id, bool) or not isinstance(new_id, int) or new_id < 0:
            raise ValidationError(f"next_id must return non-negative integer ids, got {new_id!r}")
        assigned.append(new_id)
        return new_id

    old_to_new: dict[int, int] = {}
    struct = _fresh_type(schema.struct, tracked, old_to_new)
    assert isinstance(struct, StructType)
    try:
        fresh = Schema(
            *struct.fields,
            schema_id=schema.schema_id,
            identifier_field_ids=[old_to_new[i] for i in schema.identifier_field_ids],
        )
    except ValidationError as e:
        raise SchemaEvolutionError(f"cannot assign fresh ids: {e}") from e
    return fresh, max(assigned, default=0)


# -- default values ---------------------------------------------------------------------


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_value(t: IcebergType, v: Any, where: str) -> Any:
    """Validate a non-null value against ``t`` (internal representation); return it normalized.

    Defaults are written into table metadata and applied by every reader, so a value of the
    wrong shape must be refused here rather than surface later as an encoding failure.
    """

    def bad(expected: str) -> SchemaEvolutionError:
        return SchemaEvolutionError(f"{where}: expected {expected} for type {t}, got {v!r:.100}")

    if isinstance(t, _NULL_DEFAULT_TYPES):
        raise SchemaEvolutionError(f"{where}: columns of type {t} must default to null")
    if isinstance(t, BooleanType):
        if not isinstance(v, bool):
            raise bad("a bool")
        return v
    if isinstance(t, (IntegerType, LongType)):
        low, high = _INT_RANGE if isinstance(t, IntegerType) else _LONG_RANGE
        if not _is_int(v) or not low <= v <= high:
            raise bad(f"an integer in [{low}, {high}]")
        return v
    if isinstance(t, (FloatType, DoubleType)):
        if not isinstance(v, (float, int)) or isinstance(v, bool):
            raise bad("a float")
        return float(v)
    if isinstance(t, DecimalType):
        if _is_int(v):
            v = Decimal(v)
        if not isinstance(v, Decimal) or not v.is_finite():
            raise bad("a finite decimal.Decimal")
        try:
            scaled = v.quantize(Decimal(1).scaleb(-t.scale))
        except InvalidOperation as e:
            raise bad(f"a decimal that fits precision {t.precision}") from e
        if scaled != v or len(scaled.as_tuple().digits) > t.precision:
            raise bad(f"a decimal with at most {t.scale} fraction digits and {t.precision} digits")
        return scaled
    if isinstance(t, DateType):
        if not _is_int(v):
            raise bad("an int (days since 1970-01-01)")
        return v
    if isinstance(t, TimeType):
        if not _is_int(v) or not 0 <= v < _MICROS_PER_DAY:
            raise bad("an int of microseconds since midnight")
        return v
    if isinstance(t, (TimestampType, TimestamptzType, TimestampNanoType, TimestamptzNanoType)):
        if not _is_int(v) or not _LONG_RANGE[0] <= v <= _LONG_RANGE[1]:
            raise bad("an int since the epoch (micros, or nanos for *_ns types)")
        return v
    if isinstance(t, StringType):
        if not isinstance(v, str):
            raise bad("a str")
        return v
    if isinstance(t, UUIDType):
        if not isinstance(v, uuid.UUID):
            raise bad("a uuid.UUID")
        return v
    if isinstance(t, FixedType):
        if not isinstance(v, (bytes, bytearray)) or len(v) != t.length:
            raise bad(f"{t.length} bytes")
        return bytes(v)
    if isinstance(t, BinaryType):
        if not isinstance(v, (bytes, bytearray)):
            raise bad("bytes")
        return bytes(v)
    if isinstance(t, StructType):
        # A struct value nested inside a list or map default: its shape is the value
        # module's business; only the container kind is checked here.
        if not isinstance(v, Mapping):
            raise bad("a mapping")
        return v
    if isinstance(t, ListType):
        if not isinstance(v, (list, tuple)):
            raise bad("a list")
        out: list[Any] = []
        for item in v:
            if item is None:
                if t.element_required:
                    raise bad("a list without nulls (elements are required)")
                out.append(None)
            else:
                out.append(_check_value(t.element_type, item, where))
        return out
    if isinstance(t, MapType):
        if not isinstance(v, Mapping):
            raise bad("a mapping")
        result: dict[Any, Any] = {}
        for key, value in v.items():
            if key is None:
                raise bad("a mapping without null keys")
            checked_key = _check_value(t.key_type, key, where)
            if value is None:
                if t.value_required:
                    raise bad("a mapping without null values (values are required)")
                result[checked_key] = None
            else:
                result[checked_key] = _check_value(t.value_type, value, where)
        return result
    raise bad("a value of a supported type")


def _check_default(t: IcebergType, v: Any, column: str, which: str) -> Any:
    """Validate one default of a struct field; the struct rule differs from nested values."""
    if v is None:
        return None
    where = f"{which} of column {column!r}"
    if isinstance(t, StructType):
        # Sub-field defaults live on the sub-fields, so a struct may only default to null
        # or to an empty struct that is filled from them.
        if not isinstance(v, Mapping) or len(v) != 0:
            raise SchemaEvolutionError(
                f"{where}: a struct default may only be null or an empty struct {{}} "
                f"(set defaults on the struct's fields instead), got {v!r:.100}"
            )
        return v
    value = _check_value(t, v, where)
    try:
        # Defaults are stored in the JSON single-value form: make sure this one has one.
        to_json_value(t, value)
    except ValidationError as e:
        raise SchemaEvolutionError(f"{where}: {e}") from e
    return value


def _promote_default(source: IcebergType, target: IcebergType, v: Any) -> Any:
    """Re-express a default after promotion: dates count days, timestamps count micros/nanos."""
    if v is None or not isinstance(source, DateType):
        return v
    if isinstance(target, TimestampType):
        return v * _MICROS_PER_DAY
    if isinstance(target, TimestampNanoType):
        return v * _NANOS_PER_DAY
    return v


# -- the builder ------------------------------------------------------------------------


class _MoveKind(Enum):
    FIRST = "first"
    BEFORE = "before"
    AFTER = "after"


@dataclass(frozen=True, slots=True)
class _Move:
    field_id: int
    kind: _MoveKind
    other_id: int | None = None


class UpdateSchema:
    """Builder for one schema change; every method returns ``self`` so calls chain.

    Each call is validated against the base schema plus the calls before it, and leaves the
    builder unchanged when it raises, so a caller may catch the error and continue.
    :meth:`apply` does not mutate the builder and may be called repeatedly.
    """

    def __init__(
        self,
        schema: Schema,
        last_column_id: int,
        format_version: int,
        *,
        case_sensitive: bool = True,
        allow_incompatible_changes: bool = False,
        partition_source_ids: frozenset[int] = frozenset(),
    ) -> None:
        if isinstance(format_version, bool) or not isinstance(format_version, int):
            raise ValidationError(f"format_version must be an integer, got {format_version!r}")
        if format_version < 1:
            raise ValidationError(f"format_version must be 1 or above, got {format_version}")
        if last_column_id < schema.highest_field_id:
            raise SchemaEvolutionError(
                f"last_column_id {last_column_id} is below the highest field id "
                f"{schema.highest_field_id} of schema {schema.schema_id}: new columns would "
                "reuse ids; pass the table metadata's last-column-id"
            )
        self._schema = schema
        self._last_column_id = last_column_id
        self._format_version = format_version
        self._case_sensitive = case_sensitive
        self._allow_incompatible = allow_incompatible_changes
        self._partition_source_ids = frozenset(partition_source_ids)

        self._deletes: set[int] = set()
        self._updates: dict[int, NestedField] = {}
        self._adds: dict[int, list[int]] = {}
        self._moves: dict[int, list[_Move]] = {}
        self._identifier_ids: tuple[int, ...] = schema.identifier_field_ids

        # Indexes over the base schema and everything added; updated as columns are added.
        self._parent: dict[int, int] = {}
        self._path_by_id: dict[int, tuple[str, ...]] = {}
        self._base_index: dict[tuple[str, ...], int] = {}
        self._added_index: dict[tuple[str, ...], int] = {}
        self._added_by_id: dict[int, NestedField] = {}
        for f in schema.fields:
            self._register(f, TABLE_ROOT_ID, (), self._base_index)

    # -- public operations ----------------------------------------------------------------

    def add_column(
        self,
        path: Path,
        field_type: IcebergType,
        doc: str | None = None,
        required: bool = False,
        initial_default: Any = None,
        write_default: Any = None,
    ) -> UpdateSchema:
        """Add a column; a dotted path (or tuple) adds it inside an existing struct.

        Naming a list or map as the parent adds to its element or value struct. Nested
        types get fresh ids for all their fields. ``write_default`` starts out equal to
        ``initial_default`` when not given, as the spec requires.
        """
        segments = self._segments(path)
        shown = ".".join(segments)
        if segments[:-1]:
            parent_id = self._struct_parent_for_add(segments[:-1], shown)
        else:
            parent_id = TABLE_ROOT_ID
        self._add(
            parent_id, segments[-1], field_type, doc, required, initial_default, write_default
        )
        return self

    def delete_column(self, path: Path) -> UpdateSchema:
        """Drop a column of the base schema (its id is never reused)."""
        fid = self._resolve(path, "delete column")
        shown = self._shown(fid)
        if fid in self._added_by_id:
            raise SchemaEvolutionError(
                f"cannot delete column {shown!r}: it is added by this same change"
            )
        if not self._is_struct_member(fid):
            raise SchemaEvolutionError(
                f"cannot delete {shown!r}: list elements and map keys/values cannot be "
                "deleted on their own; delete the list or map column"
            )
        if any(self._is_within(added, fid) for ids in self._adds.values() for added in ids):
            raise SchemaEvolutionError(
                f"cannot delete column {shown!r}: columns are added inside it by this change"
            )
        if any(self._is_within(updated, fid) for updated in self._updates):
            raise SchemaEvolutionError(
                f"cannot delete column {shown!r}: it (or a field inside it) is updated by "
                "this change"
            )
        if self._move_refers_to(fid):
            raise SchemaEvolutionError(
                f"cannot delete column {shown!r}: a move in this change refers to it"
            )
        if fid in self._partition_source_ids:
            raise SchemaEvolutionError(
                f"cannot delete column {shown!r}: it is the source of a partition field; "
                "remove the partition field first"
            )
        self._deletes.add(fid)
        return self

    def rename_column(self, path: Path, new_name: str) -> UpdateSchema:
        """Give a column a new name; its id, and so its data, stay the same."""
        fid = self._resolve(path, "rename column")
        shown = self._shown(fid)
        if not isinstance(new_name, str) or not new_name:
            raise SchemaEvolutionError(
                f"cannot rename column {shown!r}: the new name must be a non-empty string"
            )
        if not self._is_struct_member(fid):
            raise SchemaEvolutionError(
                f"cannot rename {shown!r}: list elements and map keys/values have fixed names"
            )
        current = self._current(fid)
        if current.name == new_name:
            return self
        self._check_name_free(
            self._parent[fid], new_name, fid, f"cannot rename column {shown!r} to {new_name!r}"
        )
        self._updates[fid] = current.replace(name=new_name)
        return self

    def make_column_optional(self, path: Path) -> UpdateSchema:
        """Allow nulls in a column (always safe for readers)."""
        fid = self._resolve(path, "make column optional")
        self._set_optional(fid)
        return self

    def require_column(self, path: Path) -> UpdateSchema:
        """Forbid nulls in a column: incompatible, since existing rows may hold nulls.

        Allowed without ``allow_incompatible_changes`` only for a column added in this
        change with an initial-default, where no existing row can be null.
        """
        fid = self._resolve(path, "require column")
        shown = self._shown(fid)
        current = self._current(fid)
        if current.required:
            return self
        if isinstance(current.field_type, UnknownType):
            raise SchemaEvolutionError(
                f"cannot require column {shown!r}: unknown columns must be optional"
            )
        defaulted_add = fid in self._added_by_id and current.initial_default is not None
        if not (defaulted_add or self._allow_incompatible):
            raise SchemaEvolutionError(
                f"cannot make column {shown!r} required: existing rows may be null "
                "(needs allow_incompatible_changes)"
            )
        self._updates[fid] = current.replace(required=True)
        return self

    def update_column(
        self, path: Path, field_type: IcebergType | None = None, doc: str | None = None
    ) -> UpdateSchema:
        """Promote a column's type along the spec's promotion table and/or change its doc."""
        fid = self._resolve(path, "update column")
        saved = self._save()
        try:
            if field_type is not None:
                self._update_type(fid, field_type)
            if doc is not None:
                self._set_doc(fid, doc)
        except SchemaEvolutionError:
            self._restore(saved)
            raise
        return self

    def update_column_default(self, path: Path, write_default: Any) -> UpdateSchema:
        """Change the value writers use when they omit the column (v3+).

        The initial-default is fixed once the column exists, because it defines the value
        of rows written before the column was added.
        """
        fid = self._resolve(path, "update default of column")
        shown = self._shown(fid)
        if self._format_version < 3:
            raise SchemaEvolutionError(
                f"cannot set a default for column {shown!r}: default values need format "
                f"version 3, the table is version {self._format_version}"
            )
        if not self._is_struct_member(fid):
            raise SchemaEvolutionError(
                f"cannot set a default for {shown!r}: only struct fields have defaults"
            )
        current = self._current(fid)
        value = _check_default(current.field_type, write_default, shown, "write-default")
        self._updates[fid] = current.replace(write_default=value)
        return self

    def move_first(self, path: Path) -> UpdateSchema:
        fid = self._resolve(path, "move column")
        self._check_movable(fid)
        self._moves.setdefault(self._parent[fid], []).append(_Move(fid, _MoveKind.FIRST))
        return self

    def move_before(self, path: Path, other: Path) -> UpdateSchema:
        return self._move_relative(path, other, _MoveKind.BEFORE)

    def move_after(self, path: Path, other: Path) -> UpdateSchema:
        return self._move_relative(path, other, _MoveKind.AFTER)

    def set_identifier_fields(self, *paths: Path) -> UpdateSchema:
        """Replace the identifier fields; their rules are checked against the result in apply."""
        ids: list[int] = []
        for path in paths:
            fid = self._resolve(path, "use as identifier field")
            if fid not in ids:
                ids.append(fid)
        self._identifier_ids = tuple(ids)
        return self

    def union_by_name(self, new_schema: Schema) -> UpdateSchema:
        """Evolve towards ``new_schema`` matching columns by name, never losing a column.

        Missing columns are added (optional unless they carry an initial-default), types are
        promoted, and columns optional in ``new_schema`` become optional. A narrower type in
        ``new_schema`` (``int`` where the table has ``long``) keeps the table's type. Ids in
        ``new_schema`` are ignored. Like every other call, a refused union changes nothing.
        """
        saved = self._save()
        try:
            self._union_struct(TABLE_ROOT_ID, new_schema.struct)
        except SchemaEvolutionError:
            self._restore(saved)
            raise
        return self

    def apply(self, *, new_schema_id: int | None = None) -> tuple[Schema, int]:
        """Build the evolved schema and return it with the new last-column-id."""
        struct = self._apply_struct(TABLE_ROOT_ID, self._schema.struct)
        schema_id = self._schema.schema_id + 1 if new_schema_id is None else new_schema_id
        self._check_unique_names(struct, "")
        by_id = {f.field_id: f for f in walk_fields(struct)}
        parents: dict[int, int] = {}
        for f in walk_fields(struct):
            if isinstance(f.field_type, NestedType):
                for child in f.field_type.fields:
                    parents[child.field_id] = f.field_id
        for fid in self._identifier_ids:
            self._check_identifier(fid, by_id, parents)
        try:
            schema = Schema(
                *struct.fields, schema_id=schema_id, identifier_field_ids=self._identifier_ids
            )
        except ValidationError as e:
            raise SchemaEvolutionError(f"the evolved schema is invalid: {e}") from e
        return schema, self._last_column_id

    _STATE = (
        "_last_column_id",
        "_deletes",
        "_updates",
        "_adds",
        "_moves",
        "_identifier_ids",
        "_parent",
        "_path_by_id",
        "_added_index",
        "_added_by_id",
    )

    def _save(self) -> dict[str, Any]:
        """A copy of the mutable state, for calls made of several steps that may fail late."""
        saved = {name: copy.copy(getattr(self, name)) for name in self._STATE}
        saved["_adds"] = {k: list(v) for k, v in self._adds.items()}
        saved["_moves"] = {k: list(v) for k, v in self._moves.items()}
        return saved

    def _restore(self, saved: dict[str, Any]) -> None:
        for name, value in saved.items():
            setattr(self, name, value)

    # -- resolution and indexes -------------------------------------------------------------

    def _norm(self, name: str) -> str:
        return name if self._case_sensitive else name.lower()

    def _register(
        self,
        field: NestedField,
        parent_id: int,
        parent_path: tuple[str, ...],
        index: dict[tuple[str, ...], int],
    ) -> None:
        path = (*parent_path, field.name)
        fid = field.field_id
        self._parent[fid] = parent_id
        self._path_by_id[fid] = path
        index.setdefault(tuple(self._norm(s) for s in path), fid)
        if index is self._added_index:
            self._added_by_id[fid] = field
        if isinstance(field.field_type, NestedType):
            for child in field.field_type.fields:
                self._register(child, fid, path, index)

    @staticmethod
    def _segments(path: Path) -> tuple[str, ...]:
        segments = tuple(path.split(".")) if isinstance(path, str) else tuple(path)
        if not segments or not all(isinstance(s, str) and s for s in segments):
            raise SchemaEvolutionError(
                f"invalid column path {path!r}: expected a dotted name or a tuple of names"
            )
        return segments

    def _lookup(self, path: Path) -> int | None:
        key = tuple(self._norm(s) for s in self._segments(path))
        fid = self._added_index.get(key)
        if fid is None:
            fid = self._base_index.get(key)
        if fid is None and isinstance(path, str):
            # A column whose own name contains dots, spelled as one dotted string.
            wanted = self._norm(path)
            for index in (self._added_index, self._base_index):
                for k, candidate in index.items():
                    if ".".join(k) == wanted:
                        return candidate
        return fid

    def _resolve(self, path: Path, action: str) -> int:
        fid = self._lookup(path)
        shown = path if isinstance(path, str) else ".".join(path)
        if fid is None:
            raise SchemaEvolutionError(
                f"cannot {action} {shown!r}: schema {self._schema.schema_id} has no such "
                "column and none was added by this change"
            )
        self._check_not_deleted(fid, f"cannot {action} {shown!r}")
        return fid

    def _check_not_deleted(self, fid: int, prefix: str) -> None:
        node: int | None = fid
        while node is not None and node != TABLE_ROOT_ID:
            if node in self._deletes:
                what = "it is" if node == fid else f"its parent {self._shown(node)!r} is"
                raise SchemaEvolutionError(f"{prefix}: {what} deleted by this change")
            node = self._parent.get(node)

    def _shown(self, fid: int) -> str:
        return ".".join(self._path_by_id[fid])

    def _original(self, fid: int) -> NestedField:
        added = self._added_by_id.get(fid)
        return added if added is not None else self._schema.field(fid)

    def _current(self, fid: int) -> NestedField:
        updated = self._updates.get(fid)
        return updated if updated is not None else self._original(fid)

    def _is_struct_member(self, fid: int) -> bool:
        parent = self._parent[fid]
        return parent == TABLE_ROOT_ID or isinstance(self._current(parent).field_type, StructType)

    def _is_map_key(self, fid: int) -> bool:
        parent = self._parent[fid]
        if parent == TABLE_ROOT_ID:
            return False
        parent_type = self._current(parent).field_type
        return isinstance(parent_type, MapType) and parent_type.key_id == fid

    def _is_within(self, fid: int, ancestor: int) -> bool:
        node: int | None = fid
        while node is not None and node != TABLE_ROOT_ID:
            if node == ancestor:
                return True
            node = self._parent.get(node)
        return False

    def _inside_map_key(self, fid: int) -> bool:
        node: int | None = fid
        while node is not None and node != TABLE_ROOT_ID:
            if self._is_map_key(node):
                return True
            node = self._parent.get(node)
        return False

    def _struct_children(self, parent_id: int) -> list[int]:
        if parent_id == TABLE_ROOT_ID:
            base = [f.field_id for f in self._schema.fields]
        else:
            parent_type = self._current(parent_id).field_type
            assert isinstance(parent_type, StructType)
            base = [f.field_id for f in parent_type.fields]
        children = base + self._adds.get(parent_id, [])
        return [c for c in children if c not in self._deletes]

    def _check_name_free(self, parent_id: int, name: str, ignore: int | None, prefix: str) -> None:
        wanted = self._norm(name)
        for child in self._struct_children(parent_id):
            if child != ignore and self._norm(self._current(child).name) == wanted:
                where = "the table" if parent_id == TABLE_ROOT_ID else repr(self._shown(parent_id))
                raise SchemaEvolutionError(
                    f"{prefix}: {where} already has a column named {self._current(child).name!r}"
                )

    def _struct_parent_for_add(self, parent_segments: tuple[str, ...], shown: str) -> int:
        parent_id = self._resolve(parent_segments, f"add column {shown!r} to")
        parent_type = self._current(parent_id).field_type
        if isinstance(parent_type, ListType):
            parent_id = parent_type.element_id
        elif isinstance(parent_type, MapType):
            parent_id = parent_type.value_id
        parent_type = self._current(parent_id).field_type
        if not isinstance(parent_type, StructType):
            raise SchemaEvolutionError(
                f"cannot add column {shown!r}: its parent {'.'.join(parent_segments)!r} is "
                f"{parent_type}, not a struct"
            )
        if self._inside_map_key(parent_id):
            raise SchemaEvolutionError(
                f"cannot add column {shown!r}: map keys cannot change, they identify entries"
            )
        return parent_id

    # -- validation helpers -----------------------------------------------------------------

    def _check_new_type(self, t: IcebergType, column: str) -> None:
        """A type brought in by an add or a promotion from unknown must fit this table."""
        fields: list[tuple[str, IcebergType, NestedField | None]] = [(column, t, None)]
        fields += [(path, f.field_type, f) for path, f in _fields_with_paths(t, column)]
        for where, sub_type, sub_field in fields:
            if sub_type.min_format_version > self._format_version:
                raise SchemaEvolutionError(
                    f"cannot use type {sub_type} in column {where!r}: it needs format version "
                    f"{sub_type.min_format_version}, the table is version {self._format_version}"
                )
            if sub_field is None:
                continue
            if isinstance(sub_type, UnknownType) and sub_field.required:
                raise SchemaEvolutionError(f"column {where!r} of type unknown must be optional")
            self._checked_default(sub_type, sub_field.initial_default, where, "initial-default")
            self._checked_default(sub_type, sub_field.write_default, where, "write-default")

    def _checked_default(self, t: IcebergType, v: Any, column: str, which: str) -> Any:
        if v is not None and self._format_version < 3:
            raise SchemaEvolutionError(
                f"cannot set {which} of column {column!r}: default values need format "
                f"version 3, the table is version {self._format_version}"
            )
        return _check_default(t, v, column, which)

    def _check_required_subfields(self, t: IcebergType, has_default: bool, column: str) -> None:
        """A struct defaulting to ``{}`` takes its fields' defaults: required ones need one."""
        if not (has_default and isinstance(t, StructType)):
            return
        for f in t.fields:
            sub = f"{column}.{f.name}"
            if f.required and f.initial_default is None and not self._allow_incompatible:
                raise SchemaEvolutionError(
                    f"cannot add {column!r} with a struct default: its required field "
                    f"{sub!r} has no initial-default"
                )
            self._check_required_subfields(f.field_type, f.initial_default is not None, sub)

    def _check_movable(self, fid: int) -> None:
        if not self._is_struct_member(fid):
            raise SchemaEvolutionError(
                f"cannot move {self._shown(fid)!r}: only fields of a struct can be reordered"
            )

    def _move_refers_to(self, fid: int) -> bool:
        return any(
            self._is_within(m.field_id, fid) or (m.other_id is not None and m.other_id == fid)
            for moves in self._moves.values()
            for m in moves
        )

    def _check_identifier(
        self, fid: int, by_id: dict[int, NestedField], parents: dict[int, int]
    ) -> None:
        field = by_id.get(fid)
        if field is None:
            raise SchemaEvolutionError(
                f"cannot delete identifier field {self._shown(fid)!r}: call "
                "set_identifier_fields without it first"
            )
        shown = self._shown(fid)
        prefix = f"column {shown!r} cannot be an identifier field"
        t = field.field_type
        if not isinstance(t, PrimitiveType) or isinstance(t, VariantType):
            raise SchemaEvolutionError(f"{prefix}: it is {t}, not a primitive type")
        if isinstance(t, (FloatType, DoubleType)):
            raise SchemaEvolutionError(f"{prefix}: {t} values do not compare reliably")
        if not field.required:
            raise SchemaEvolutionError(f"{prefix}: it is optional")
        node = parents.get(fid)
        while node is not None:
            parent = by_id[node]
            if isinstance(parent.field_type, (ListType, MapType)):
                raise SchemaEvolutionError(
                    f"{prefix}: it is inside list or map {self._shown(node)!r}"
                )
            if not parent.required:
                raise SchemaEvolutionError(
                    f"{prefix}: its parent struct {self._shown(node)!r} is optional"
                )
            node = parents.get(node)

    def _check_unique_names(self, t: IcebergType, prefix: str) -> None:
        if not isinstance(t, NestedType):
            return
        seen: set[str] = set()
        for f in t.fields:
            name = self._norm(f.name)
            if isinstance(t, StructType):
                if name in seen:
                    raise SchemaEvolutionError(
                        f"the evolved schema has two columns named {prefix}{f.name!r}"
                    )
                seen.add(name)
            self._check_unique_names(f.field_type, f"{prefix}{f.name}.")

    # -- id-based operations (shared by the path API and union_by_name) ---------------------

    def _add(
        self,
        parent_id: int,
        name: str,
        field_type: IcebergType,
        doc: str | None,
        required: bool,
        initial_default: Any,
        write_default: Any,
    ) -> None:
        shown = ".".join((*self._path_by_id.get(parent_id, ()), name))
        if parent_id != TABLE_ROOT_ID and self._inside_map_key(parent_id):
            raise SchemaEvolutionError(
                f"cannot add column {shown!r}: map keys cannot change, they identify entries"
            )
        self._check_name_free(parent_id, name, None, f"cannot add column {shown!r}")
        if write_default is None:
            write_default = initial_default
        self._check_new_type(field_type, shown)
        initial_default = self._checked_default(
            field_type, initial_default, shown, "initial-default"
        )
        write_default = self._checked_default(field_type, write_default, shown, "write-default")
        if required:
            if isinstance(field_type, UnknownType):
                raise SchemaEvolutionError(
                    f"cannot add required column {shown!r}: unknown columns must be optional"
                )
            if not self._allow_incompatible:
                if self._format_version < 3:
                    raise SchemaEvolutionError(
                        f"cannot add required column {shown!r}: format version "
                        f"{self._format_version} has no default values, so existing rows "
                        "would have no value; add it as optional"
                    )
                if initial_default is None:
                    raise SchemaEvolutionError(
                        f"cannot add required column {shown!r} without an initial-default: "
                        "existing rows would have no value"
                    )
        self._check_required_subfields(field_type, initial_default is not None, shown)

        next_id = _counter(self._last_column_id + 1)
        new_id = next_id()
        new_type = _fresh_type(field_type, next_id, {})
        highest = max([new_id, *(f.field_id for f in _nested_fields(new_type))])
        if highest > MAX_FIELD_ID:
            raise SchemaEvolutionError(
                f"cannot add column {shown!r}: field ids would exceed {MAX_FIELD_ID}"
            )
        field = NestedField(new_id, name, new_type, required, doc, initial_default, write_default)
        self._last_column_id = highest
        self._adds.setdefault(parent_id, []).append(new_id)
        self._register(field, parent_id, self._path_by_id.get(parent_id, ()), self._added_index)

    def _set_optional(self, fid: int) -> None:
        current = self._current(fid)
        if current.optional:
            return
        if self._is_map_key(fid):
            raise SchemaEvolutionError(
                f"cannot make {self._shown(fid)!r} optional: map keys are always required"
            )
        self._updates[fid] = current.replace(required=False)

    def _set_doc(self, fid: int, doc: str) -> None:
        if not self._is_struct_member(fid):
            raise SchemaEvolutionError(
                f"cannot set a doc on {self._shown(fid)!r}: only struct fields carry docs"
            )
        current = self._current(fid)
        if current.doc != doc:
            self._updates[fid] = current.replace(doc=doc)

    def _update_type(self, fid: int, new_type: IcebergType) -> None:
        current = self._current(fid)
        old_type = current.field_type
        shown = self._shown(fid)
        if old_type == new_type:
            return
        if self._inside_map_key(fid):
            raise SchemaEvolutionError(
                f"cannot change the type of {shown!r}: map keys cannot change"
            )
        if isinstance(old_type, NestedType) or (
            isinstance(new_type, NestedType) and not isinstance(old_type, UnknownType)
        ):
            raise SchemaEvolutionError(
                f"cannot change column {shown!r} from {old_type} to {new_type}: only primitive "
                "types can be promoted (change nested columns field by field)"
            )
        if not is_promotion_allowed(old_type, new_type, self._format_version):
            raise SchemaEvolutionError(
                f"cannot change column {shown!r} from {old_type} to {new_type}: not a valid "
                f"type promotion in format version {self._format_version} (allowed: int to "
                "long, float to double, decimal(P,S) to decimal(P',S) with P' > P; v3 adds "
                "date to timestamp/timestamp_ns and unknown to any type)"
            )
        if isinstance(old_type, DateType) and fid in self._partition_source_ids:
            raise SchemaEvolutionError(
                f"cannot promote column {shown!r} from {old_type} to {new_type}: it is the "
                "source of a partition field, whose values would change"
            )
        if isinstance(new_type, NestedType):
            self._check_new_type(new_type, shown)
            next_id = _counter(self._last_column_id + 1)
            fresh = _fresh_type(new_type, next_id, {})
            highest = max((f.field_id for f in _nested_fields(fresh)), default=self._last_column_id)
            if highest > MAX_FIELD_ID:
                raise SchemaEvolutionError(
                    f"cannot change column {shown!r}: field ids would exceed {MAX_FIELD_ID}"
                )
            self._last_column_id = highest
            assert isinstance(fresh, NestedType)
            for child in fresh.fields:
                self._register(child, fid, self._path_by_id[fid], self._added_index)
            new_type = fresh
        self._updates[fid] = current.replace(
            field_type=new_type,
            initial_default=_promote_default(old_type, new_type, current.initial_default),
            write_default=_promote_default(old_type, new_type, current.write_default),
        )

    def _move_relative(self, path: Path, other: Path, kind: _MoveKind) -> UpdateSchema:
        fid = self._resolve(path, "move column")
        other_id = self._resolve(other, f"move column {self._shown(fid)!r} {kind.value}")
        self._check_movable(fid)
        if fid == other_id:
            raise SchemaEvolutionError(
                f"cannot move column {self._shown(fid)!r} {kind.value} itself"
            )
        if self._parent[fid] != self._parent[other_id]:
            raise SchemaEvolutionError(
                f"cannot move column {self._shown(fid)!r} {kind.value} "
                f"{self._shown(other_id)!r}: they are in different structs"
            )
        self._moves.setdefault(self._parent[fid], []).append(_Move(fid, kind, other_id))
        return self

    # -- union by name ------------------------------------------------------------------------

    def _union_struct(self, parent_id: int, new_struct: StructType) -> None:
        for new_field in new_struct.fields:
            existing = self._child_by_name(parent_id, new_field.name)
            if existing is None:
                self._union_add(parent_id, new_field)
            else:
                self._union_field(existing, new_field)

    def _child_by_name(self, parent_id: int, name: str) -> int | None:
        wanted = self._norm(name)
        for child in self._struct_children(parent_id):
            if self._norm(self._current(child).name) == wanted:
                return child
        return None

    def _union_add(self, parent_id: int, new_field: NestedField) -> None:
        v3 = self._format_version >= 3
        has_default = v3 and new_field.initial_default is not None
        self._add(
            parent_id,
            new_field.name,
            new_field.field_type,
            new_field.doc,
            new_field.required and has_default,
            new_field.initial_default if has_default else None,
            new_field.write_default if v3 else None,
        )

    def _union_field(self, fid: int, new_field: NestedField) -> None:
        current = self._current(fid)
        old_type = current.field_type
        new_type = new_field.field_type
        if new_field.optional and current.required:
            self._set_optional(fid)
        if new_field.doc is not None and new_field.doc != current.doc:
            self._set_doc(fid, new_field.doc)
        if isinstance(old_type, StructType) and isinstance(new_type, StructType):
            self._union_struct(fid, new_type)
        elif isinstance(old_type, ListType) and isinstance(new_type, ListType):
            self._union_field(old_type.element_id, new_type.element_field)
        elif isinstance(old_type, MapType) and isinstance(new_type, MapType):
            self._union_field(old_type.key_id, new_type.key_field)
            self._union_field(old_type.value_id, new_type.value_field)
        elif isinstance(new_type, PrimitiveType) and isinstance(old_type, PrimitiveType):
            # A narrower incoming type (int where the table has long) reads fine as is.
            if not is_promotion_allowed(new_type, old_type, self._format_version):
                self._update_type(fid, new_type)
        elif isinstance(old_type, UnknownType):
            self._update_type(fid, new_type)
        else:
            raise SchemaEvolutionError(
                f"cannot merge column {self._shown(fid)!r}: it is {old_type} in the table and "
                f"{new_type} in the new schema"
            )

    # -- apply ----------------------------------------------------------------------------

    def _apply_struct(self, parent_id: int, struct: StructType) -> StructType:
        fields = [self._apply_field(f) for f in struct.fields if f.field_id not in self._deletes]
        fields += [self._apply_field(self._added_by_id[a]) for a in self._adds.get(parent_id, [])]
        return StructType(*_reorder(fields, self._moves.get(parent_id, [])))

    def _apply_field(self, field: NestedField) -> NestedField:
        current = self._updates.get(field.field_id, field)
        t = current.field_type
        if isinstance(t, StructType):
            return current.replace(field_type=self._apply_struct(field.field_id, t))
        if isinstance(t, ListType):
            element = self._apply_field(t.element_field)
            return current.replace(
                field_type=ListType(element.field_id, element.field_type, element.required)
            )
        if isinstance(t, MapType):
            key = self._apply_field(t.key_field)
            value = self._apply_field(t.value_field)
            return current.replace(
                field_type=MapType(
                    key.field_id, key.field_type, value.field_id, value.field_type, value.required
                )
            )
        return current


def _reorder(fields: Sequence[NestedField], moves: Sequence[_Move]) -> list[NestedField]:
    out = list(fields)
    for move in moves:
        position = _index(out, move.field_id)
        field = out.pop(position)
        if move.kind is _MoveKind.FIRST:
            out.insert(0, field)
            continue
        assert move.other_id is not None
        target = _index(out, move.other_id)
        out.insert(target if move.kind is _MoveKind.BEFORE else target + 1, field)
    return out


def _index(fields: Sequence[NestedField], field_id: int) -> int:
    for i, f in enumerate(fields):
        if f.field_id == field_id:
            return i
    raise SchemaEvolutionError(  # pragma: no cover - deletes of moved columns are refused
        f"field id {field_id} to move is not in its struct"
    )


def _fields_with_paths(t: IcebergType, prefix: str) -> Iterator[tuple[str, NestedField]]:
    if isinstance(t, NestedType):
        for f in t.fields:
            path = f"{prefix}.{f.name}"
            yield path, f
            yield from _fields_with_paths(f.field_type, path)


def _nested_fields(t: IcebergType) -> Iterator[NestedField]:
    if isinstance(t, NestedType):
        yield from walk_fields(t)


__all__ = [
    "TABLE_ROOT_ID",
    "UpdateSchema",
    "assign_fresh_ids",
    "is_promotion_allowed",
]
