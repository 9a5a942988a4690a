"""Iceberg schemas as Arrow schemas, and Arrow data projected onto Iceberg schemas.

Iceberg resolves columns by field id, never by name or position, so every Arrow field this
module produces (struct fields, list elements, map keys and values) carries its id under
the ``PARQUET:field_id`` metadata key. pyarrow writes that key as the Parquet ``field_id``
and puts it back on every field when reading, which is how a data file remembers which
table column each of its columns is after renames and reorders.

Type mapping choices, fixed here so every writer and reader agrees:

* ``string`` is ``large_string`` and ``binary`` is ``large_binary``. 64-bit offsets cannot
  overflow when a reader concatenates many row groups of wide text; Parquet stores both
  widths identically, so the choice never shows in the files.
* ``list`` is ``list`` (32-bit offsets count elements, not bytes) and ``map`` is ``map``.
* ``uuid`` is pyarrow's ``arrow.uuid`` extension type: it writes Parquet's ``UUID`` logical
  type and PyIceberg 0.12 reads it back as ``uuid`` (a plain ``fixed_size_binary(16)``
  would read back as ``fixed[16]``). Files that lost the annotation still project onto a
  ``uuid`` column.
* ``timestamp``/``timestamptz`` are ``timestamp('us')`` without/with ``tz='UTC'``; the
  ``_ns`` variants use ``'ns'``. ``time`` is ``time64('us')``, ``date`` is ``date32``.
* ``unknown`` is Arrow ``null`` in memory, and is never stored in data files (spec,
  Appendix A); ``geometry``/``geography`` are WKB in ``large_binary``; ``variant`` is the
  spec's group of ``metadata`` and ``value`` binaries, which carry no field ids.

Two table-shaping functions sit on top of the mapping: :func:`conform_table` is the writer
side (match input columns by name, fill write-defaults, enforce ``required``, cast to the
file schema) and :func:`project_table` the reader side of schema evolution (match file
columns by id, rename, reorder, fill initial-defaults, promote types).

Why one module past 800 lines: :func:`conform_table` and :func:`project_table` are the type
mapping applied to data; kept with the mapping, every writer and reader agrees in one place.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from icefloe.errors import SchemaEvolutionError, ValidationError
from icefloe.spec.schema import Schema, SchemaVisitor, visit
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
)

FIELD_ID_KEY = b"PARQUET:field_id"
DOC_KEY = b"doc"
LIST_ELEMENT_NAME = "element"
MAP_KEY_NAME = "key"
MAP_VALUE_NAME = "value"
VARIANT_METADATA_NAME = "metadata"
VARIANT_VALUE_NAME = "value"

_MICROS_PER_DAY = 86_400_000_000
_NANOS_PER_DAY = 86_400_000_000_000


# ---------------------------------------------------------------------------------------
# Iceberg -> Arrow
# ---------------------------------------------------------------------------------------


def _field_metadata(f: NestedField) -> dict[bytes, bytes]:
    md = {FIELD_ID_KEY: str(f.field_id).encode()}
    if f.doc:
        md[DOC_KEY] = f.doc.encode()
    return md


def _variant_arrow_type() -> pa.DataType:
    # Spec: a group of `metadata` and `value`, accessed by name, with no field ids.
    return pa.struct(
        [
            pa.field(VARIANT_METADATA_NAME, pa.large_binary(), nullable=False),
            pa.field(VARIANT_VALUE_NAME, pa.large_binary(), nullable=False),
        ]
    )


_PRIMITIVE_TO_ARROW: dict[PrimitiveType, pa.DataType] = {
    BooleanType(): pa.bool_(),
    IntegerType(): pa.int32(),
    LongType(): pa.int64(),
    FloatType(): pa.float32(),
    DoubleType(): pa.float64(),
    DateType(): pa.date32(),
    TimeType(): pa.time64("us"),
    TimestampType(): pa.timestamp("us"),
    TimestamptzType(): pa.timestamp("us", tz="UTC"),
    TimestampNanoType(): pa.timestamp("ns"),
    TimestamptzNanoType(): pa.timestamp("ns", tz="UTC"),
    StringType(): pa.large_string(),
    UUIDType(): pa.uuid(),
    BinaryType(): pa.large_binary(),
    UnknownType(): pa.null(),
}


def primitive_to_arrow(t: PrimitiveType) -> pa.DataType:
    """The Arrow type that holds values of one Iceberg primitive type."""
    known = _PRIMITIVE_TO_ARROW.get(t)
    if known is not None:
        return known
    if isinstance(t, DecimalType):
        return pa.decimal128(t.precision, t.scale)
    if isinstance(t, FixedType):
        return pa.binary(t.length)
    if isinstance(t, (GeometryType, GeographyType)):
        return pa.large_binary()
    if isinstance(t, VariantType):
        return _variant_arrow_type()
    raise ValidationError(f"Iceberg type {t} has no Arrow representation")


class _ToArrow(SchemaVisitor[Any]):
    """Builds Arrow types bottom-up; ``field`` wraps a child type into a ``pa.Field``."""

    def __init__(self, drop_unknown: bool) -> None:
        self.drop_unknown = drop_unknown

    def struct(self, struct: StructType, field_results: list[Any]) -> Any:
        return pa.struct([f for f in field_results if f is not None])

    def field(self, field: NestedField, field_result: Any) -> Any:
        if self.drop_unknown and isinstance(field.field_type, UnknownType):
            return None
        return pa.field(
            field.name, field_result, nullable=field.optional, metadata=_field_metadata(field)
        )

    def list(self, list_type: ListType, element_result: Any) -> Any:
        if element_result is None:
            raise ValidationError(f"list element {list_type.element_id} cannot be unknown")
        return pa.list_(element_result)

    def map(self, map_type: MapType, key_result: Any, value_result: Any) -> Any:
        if key_result is None or value_result is None:
            raise ValidationError(f"map {map_type} cannot have unknown keys or values")
        return pa.map_(key_result, value_result)

    def primitive(self, primitive: PrimitiveType) -> Any:
        return primitive_to_arrow(primitive)


def type_to_arrow(t: IcebergType) -> pa.DataType:
    """The Arrow type of an Iceberg type, with field ids on every nested field."""
    return visit(t, _ToArrow(drop_unknown=False))


def field_to_arrow(f: NestedField) -> pa.Field:
    """One Iceberg field as an Arrow field carrying its id (and doc) in the metadata."""
    return pa.field(f.name, type_to_arrow(f.field_type), f.optional, _field_metadata(f))


def schema_to_arrow(
    schema: Schema | StructType, *, metadata: Mapping[bytes | str, bytes | str] | None = None
) -> pa.Schema:
    """The in-memory Arrow schema of a table schema (``unknown`` columns as Arrow ``null``)."""
    struct = schema.struct if isinstance(schema, Schema) else schema
    return pa.schema([field_to_arrow(f) for f in struct.fields], metadata=metadata)


def file_schema_to_arrow(
    schema: Schema | StructType, *, metadata: Mapping[bytes | str, bytes | str] | None = None
) -> pa.Schema:
    """The Arrow schema to write into a data file: like :func:`schema_to_arrow`, without
    ``unknown`` columns, which the spec says are never stored."""
    struct = schema.struct if isinstance(schema, Schema) else schema
    arrow_struct = visit(struct, _ToArrow(drop_unknown=True))
    return pa.schema(list(arrow_struct), metadata=metadata)


# ---------------------------------------------------------------------------------------
# Arrow -> Iceberg
# ---------------------------------------------------------------------------------------


def field_id_of(field: pa.Field) -> int | None:
    """The Iceberg field id stored in an Arrow field's metadata, or None."""
    md = field.metadata
    if not md or FIELD_ID_KEY not in md:
        return None
    raw = md[FIELD_ID_KEY]
    try:
        return int(raw)
    except ValueError:
        raise ValidationError(
            f"field {field.name!r} has a non-integer {FIELD_ID_KEY.decode()} {raw!r}"
        ) from None


def _is_variant_struct(dt: pa.DataType) -> bool:
    if not pa.types.is_struct(dt) or dt.num_fields != 2:
        return False
    names = {dt.field(i).name for i in range(2)}
    return names == {VARIANT_METADATA_NAME, VARIANT_VALUE_NAME} and all(
        field_id_of(dt.field(i)) is None for i in range(2)
    )


def arrow_primitive_to_iceberg(dt: pa.DataType, path: str = "<value>") -> PrimitiveType:
    """The Iceberg type of an Arrow leaf type, accepting every Arrow width Iceberg can hold.

    Files written by other engines come back from pyarrow as ``string`` or ``large_string``,
    millisecond timestamps, 8- or 16-bit ints and so on; all of these read as the Iceberg
    type that holds them losslessly. ``path`` only names the column in errors.
    """
    if pa.types.is_dictionary(dt):
        return arrow_primitive_to_iceberg(dt.value_type, path)
    if isinstance(dt, pa.UuidType):
        return UUIDType()
    if pa.types.is_null(dt):
        return UnknownType()
    if pa.types.is_boolean(dt):
        return BooleanType()
    if pa.types.is_integer(dt):
        if dt.bit_width < 32 or (dt.bit_width == 32 and pa.types.is_signed_integer(dt)):
            return IntegerType()
        if dt.bit_width == 32 or pa.types.is_signed_integer(dt):
            return LongType()
    elif pa.types.is_float16(dt) or pa.types.is_float32(dt):
        return FloatType()
    elif pa.types.is_float64(dt):
        return DoubleType()
    elif pa.types.is_decimal(dt):
        if dt.precision <= 38:
            return DecimalType(dt.precision, dt.scale)
    elif pa.types.is_date(dt):
        return DateType()
    elif pa.types.is_time(dt):
        return TimeType()
    elif pa.types.is_timestamp(dt):
        nanos = dt.unit == "ns"
        if dt.tz is None:
            return TimestampNanoType() if nanos else TimestampType()
        return TimestamptzNanoType() if nanos else TimestamptzType()
    elif pa.types.is_string(dt) or pa.types.is_large_string(dt) or pa.types.is_string_view(dt):
        return StringType()
    elif pa.types.is_binary(dt) or pa.types.is_large_binary(dt) or pa.types.is_binary_view(dt):
        return BinaryType()
    elif pa.types.is_fixed_size_binary(dt):
        return FixedType(dt.byte_width)
    raise ValidationError(f"column {path!r} has Arrow type {dt}, which Iceberg cannot store")


def _field_from_arrow(f: pa.Field, path: str) -> NestedField:
    fid = field_id_of(f)
    if fid is None:
        raise ValidationError(
            f"column {path!r} has no Iceberg field id ({FIELD_ID_KEY.decode()} metadata / "
            "Parquet field_id); files without ids need a name mapping to be read"
        )
    doc = f.metadata.get(DOC_KEY).decode() if f.metadata and DOC_KEY in f.metadata else None
    return NestedField(fid, f.name, _type_from_arrow(f.type, path), not f.nullable, doc)


def _type_from_arrow(dt: pa.DataType, path: str) -> IcebergType:
    if pa.types.is_dictionary(dt):
        return _type_from_arrow(dt.value_type, path)
    if pa.types.is_struct(dt):
        if _is_variant_struct(dt):
            return VariantType()
        return StructType(
            *(
                _field_from_arrow(dt.field(i), f"{path}.{dt.field(i).name}")
                for i in range(dt.num_fields)
            )
        )
    if pa.types.is_map(dt):
        key = _field_from_arrow(dt.key_field, f"{path}.key")
        value = _field_from_arrow(dt.item_field, f"{path}.value")
        return MapType(
            key.field_id, key.field_type, value.field_id, value.field_type, value.required
        )
    if (
        pa.types.is_list(dt)
        or pa.types.is_large_list(dt)
        or pa.types.is_fixed_size_list(dt)
        or pa.types.is_list_view(dt)
        or pa.types.is_large_list_view(dt)
    ):
        element = _field_from_arrow(dt.value_field, f"{path}.element")
        return ListType(element.field_id, element.field_type, element.required)
    return arrow_primitive_to_iceberg(dt, path)


def arrow_to_schema(arrow_schema: pa.Schema, *, schema_id: int = 0) -> Schema:
    """The Iceberg schema described by an Arrow schema whose fields all carry field ids.

    Raises ValidationError naming the first column without an id or with a type Iceberg
    cannot hold.
    """
    return Schema(
        *(_field_from_arrow(f, f.name) for f in arrow_schema),
        schema_id=schema_id,
    )


# ---------------------------------------------------------------------------------------
# Single values: internal representation <-> Arrow arrays
# ---------------------------------------------------------------------------------------


_TEMPORAL = (
    DateType,
    TimeType,
    TimestampType,
    TimestamptzType,
    TimestampNanoType,
    TimestamptzNanoType,
)


def to_arrow_array(t: IcebergType, values: Sequence[Any]) -> pa.Array:
    """An Arrow array of ``type_to_arrow(t)`` from values in icefloe's internal form.

    Lists are Python sequences and maps are mappings (or sequences of key/value pairs);
    structs are mappings keyed by field id or name, or tuples in field order.
    """
    target = type_to_arrow(t)
    try:
        if isinstance(t, _TEMPORAL):
            storage = pa.int32() if isinstance(t, DateType) else pa.int64()
            return pa.array(values, storage).cast(target)
        if isinstance(t, UUIDType):
            raw = [None if v is None else _uuid_bytes(v) for v in values]
            return pa.ExtensionArray.from_storage(target, pa.array(raw, pa.binary(16)))
        if isinstance(t, ListType):
            return _list_to_arrow(t, values, target)
        if isinstance(t, MapType):
            return _map_to_arrow(t, values, target)
        if isinstance(t, StructType):
            return _struct_to_arrow(t, values, target)
        return pa.array(values, target)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as e:
        raise ValidationError(f"cannot convert values to Iceberg type {t}: {e}") from e


def _uuid_bytes(v: Any) -> bytes:
    if isinstance(v, uuid.UUID):
        return v.bytes
    if isinstance(v, (bytes, bytearray)) and len(v) == 16:
        return bytes(v)
    raise TypeError(f"expected uuid.UUID, got {v!r}")


def _offsets_and_mask(sizes: Sequence[int | None]) -> tuple[pa.Array, pa.Array]:
    offsets = [0]
    for n in sizes:
        offsets.append(offsets[-1] + (n or 0))
    return pa.array(offsets, pa.int32()), pa.array([n is None for n in sizes], pa.bool_())


def _list_to_arrow(t: ListType, values: Sequence[Any], target: pa.DataType) -> pa.Array:
    flat: list[Any] = []
    sizes: list[int | None] = []
    for v in values:
        if v is None:
            sizes.append(None)
        else:
            items = list(v)
            flat.extend(items)
            sizes.append(len(items))
    offsets, mask = _offsets_and_mask(sizes)
    return pa.ListArray.from_arrays(
        offsets, to_arrow_array(t.element_type, flat), type=target, mask=mask
    )


def _map_to_arrow(t: MapType, values: Sequence[Any], target: pa.DataType) -> pa.Array:
    keys: list[Any] = []
    items: list[Any] = []
    sizes: list[int | None] = []
    for v in values:
        if v is None:
            sizes.append(None)
            continue
        pairs = list(v.items()) if isinstance(v, Mapping) else [tuple(p) for p in v]
        keys.extend(k for k, _ in pairs)
        items.extend(x for _, x in pairs)
        sizes.append(len(pairs))
    offsets, mask = _offsets_and_mask(sizes)
    return pa.MapArray.from_arrays(
        offsets,
        to_arrow_array(t.key_type, keys),
        to_arrow_array(t.value_type, items),
        type=target,
        mask=mask,
    )


def _struct_to_arrow(t: StructType, values: Sequence[Any], target: pa.DataType) -> pa.Array:
    columns: list[list[Any]] = [[] for _ in t.fields]
    for v in values:
        for i, f in enumerate(t.fields):
            if v is None:
                columns[i].append(None)
            elif isinstance(v, Mapping):
                columns[i].append(v.get(f.field_id, v.get(f.name)))
            else:
                columns[i].append(v[i])
    children = [to_arrow_array(f.field_type, col) for f, col in zip(t.fields, columns)]
    mask = pa.array([v is None for v in values], pa.bool_())
    return _make_struct(children, target, len(values), mask)


def from_arrow_array(t: PrimitiveType, array: pa.Array | pa.ChunkedArray) -> list[Any]:
    """Values of an Arrow array in icefloe's internal representation (primitives only)."""
    if isinstance(array, pa.ChunkedArray):
        return [v for chunk in array.chunks for v in from_arrow_array(t, chunk)]
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    if isinstance(t, UnknownType) or pa.types.is_null(array.type):
        return [None] * len(array)
    if isinstance(t, DateType):
        return _temporal_ints(array, pa.date32(), pa.int32())
    if isinstance(t, TimeType):
        return _temporal_ints(array, pa.time64("us"), pa.int64())
    if isinstance(t, (TimestampType, TimestamptzType, TimestampNanoType, TimestamptzNanoType)):
        unit = "ns" if isinstance(t, (TimestampNanoType, TimestamptzNanoType)) else "us"
        tz = getattr(array.type, "tz", None)
        return _temporal_ints(array, pa.timestamp(unit, tz=tz), pa.int64())
    if isinstance(t, UUIDType):
        if isinstance(array, pa.ExtensionArray):
            array = array.storage
        return [None if b is None else uuid.UUID(bytes=b) for b in array.to_pylist()]
    if isinstance(array, pa.ExtensionArray):
        array = array.storage
    return list(array.to_pylist())


def _temporal_ints(array: pa.Array, canonical: pa.DataType, storage: pa.DataType) -> list[Any]:
    if pa.types.is_integer(array.type):
        return list(array.to_pylist())
    if not array.type.equals(canonical):
        array = array.cast(canonical)
    return list(array.view(storage).to_pylist())


# ---------------------------------------------------------------------------------------
# Shared array plumbing
# ---------------------------------------------------------------------------------------


def _make_struct(
    children: list[pa.Array], target: pa.DataType, length: int, mask: pa.Array | None
) -> pa.Array:
    if target.num_fields == 0:
        # from_arrays cannot infer a length from zero children
        nulls = [False] * length if mask is None else mask.to_pylist()
        return pa.array([None if n else {} for n in nulls], target)
    fields = [target.field(i) for i in range(target.num_fields)]
    return pa.StructArray.from_arrays(children, fields=fields, mask=mask)


def _null_mask(arr: pa.Array) -> pa.Array | None:
    return arr.is_null() if arr.null_count else None


def _repeat(array_of_one: pa.Array, n: int) -> pa.Array:
    """``n`` copies of the single value in ``array_of_one``."""
    return array_of_one.take(pa.repeat(pa.scalar(0, pa.int32()), n))


def _as_list(arr: pa.Array) -> pa.Array:
    """Large, fixed-size and view lists as plain lists, so offsets + values describe them."""
    if pa.types.is_list(arr.type):
        return arr
    return arr.cast(pa.list_(arr.type.value_field))


def list_layout(arr: pa.Array) -> tuple[pa.Array, int, int]:
    """Zero-based int32 offsets of a list or map array, and the (start, length) of its
    child values that those offsets index.

    Arrow refuses a validity mask together with offsets that do not start at zero (which
    any sliced array has), and projecting only the referenced child range is cheaper too.
    """
    offsets = arr.offsets
    start = offsets[0].as_py() if len(offsets) else 0
    end = offsets[-1].as_py() if len(offsets) else 0
    if start:
        offsets = pc.subtract(offsets, start)
    if offsets.type != pa.int32():
        offsets = offsets.cast(pa.int32())
    return offsets, start, end - start


# ---------------------------------------------------------------------------------------
# Reader side: project file data onto a read schema by field id
# ---------------------------------------------------------------------------------------


def _promotion_error(path: str, file_t: IcebergType, read_t: IcebergType) -> SchemaEvolutionError:
    return SchemaEvolutionError(
        f"cannot read column {path!r}: the data file stores it as {file_t}, which cannot be "
        f"read as {read_t}"
    )


def _is_allowed_read(file_t: PrimitiveType, read_t: PrimitiveType) -> bool:
    if file_t == read_t:
        return True
    if isinstance(file_t, IntegerType) and isinstance(read_t, LongType):
        return True
    if isinstance(file_t, FloatType) and isinstance(read_t, DoubleType):
        return True
    if isinstance(file_t, DecimalType) and isinstance(read_t, DecimalType):
        return file_t.scale == read_t.scale and file_t.precision <= read_t.precision
    if isinstance(file_t, DateType) and isinstance(read_t, (TimestampType, TimestampNanoType)):
        return True
    # A writer that lost Parquet's UUID annotation still wrote the same 16 bytes.
    return isinstance(file_t, FixedType) and file_t.length == 16 and isinstance(read_t, UUIDType)


def _cast_primitive(
    arr: pa.Array, file_t: PrimitiveType, read_t: PrimitiveType, path: str
) -> pa.Array:
    if not _is_allowed_read(file_t, read_t):
        raise _promotion_error(path, file_t, read_t)
    target = primitive_to_arrow(read_t)
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    if arr.type.equals(target):
        return arr
    try:
        if isinstance(file_t, DateType) and not isinstance(read_t, DateType):
            per_day = _NANOS_PER_DAY if isinstance(read_t, TimestampNanoType) else _MICROS_PER_DAY
            days = arr.cast(pa.date32()).view(pa.int32()).cast(pa.int64())
            return pc.multiply_checked(days, per_day).cast(target)
        if isinstance(target, pa.UuidType):
            storage = arr.storage if isinstance(arr, pa.ExtensionArray) else arr
            return pa.ExtensionArray.from_storage(target, storage.cast(pa.binary(16)))
        return arr.cast(target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise ValidationError(
            f"cannot read column {path!r} ({file_t} in the file) as {read_t}: {e}"
        ) from e


@dataclass(frozen=True)
class _ReadContext:
    constants: Mapping[int, Any]


def _arrow_children(arr_type: pa.DataType, file_struct: StructType) -> dict[int, int]:
    """Map field id -> child index of an Arrow struct type, by id metadata or by name."""
    by_name = {f.name: f.field_id for f in file_struct.fields}
    out: dict[int, int] = {}
    for i in range(arr_type.num_fields):
        child = arr_type.field(i)
        fid = field_id_of(child)
        if fid is None:
            fid = by_name.get(child.name)
        if fid is not None:
            out[fid] = i
    return out


def _default_array(
    f: NestedField, length: int, path: str, ctx: _ReadContext, use_write_default: bool = False
) -> pa.Array:
    """The column for a field that the data does not have (spec: "Column Projection")."""
    target = type_to_arrow(f.field_type)
    default = f.write_default if use_write_default else f.initial_default
    if not use_write_default and f.field_id in ctx.constants:
        default = ctx.constants[f.field_id]
    if isinstance(f.field_type, StructType) and default is not None:
        # A non-null struct default is `{}`: each sub-field takes its own default.
        children = [
            _default_array(c, length, f"{path}.{c.name}", ctx, use_write_default)
            for c in f.field_type.fields
        ]
        return _make_struct(children, target, length, None)
    if default is None:
        if f.required:
            which = "write-default" if use_write_default else "initial-default"
            raise SchemaEvolutionError(
                f"required column {path!r} (id {f.field_id}) is missing and has no {which}"
            )
        return pa.nulls(length, target)
    return _repeat(to_arrow_array(f.field_type, [default]), length)


def _project_struct(
    arr: pa.Array, file_struct: StructType, read_struct: StructType, path: str, ctx: _ReadContext
) -> pa.Array:
    target = type_to_arrow(read_struct)
    index = _arrow_children(arr.type, file_struct)
    children = []
    for f in read_struct.fields:
        child_path = f"{path}.{f.name}" if path else f.name
        i = index.get(f.field_id)
        file_field = file_struct.field(f.field_id)
        if i is None or file_field is None or isinstance(f.field_type, UnknownType):
            children.append(_default_array(f, len(arr), child_path, ctx))
        else:
            children.append(_project_value(arr.field(i), file_field.field_type, f, child_path, ctx))
    return _make_struct(children, target, len(arr), _null_mask(arr))


def _project_value(
    arr: pa.Array, file_t: IcebergType, read_field: NestedField, path: str, ctx: _ReadContext
) -> pa.Array:
    read_t = read_field.field_type
    if isinstance(read_t, StructType):
        if not isinstance(file_t, StructType):
            raise _promotion_error(path, file_t, read_t)
        return _project_struct(arr, file_t, read_t, path, ctx)
    if isinstance(read_t, ListType):
        if not isinstance(file_t, ListType) or file_t.element_id != read_t.element_id:
            raise _promotion_error(path, file_t, read_t)
        arr = _as_list(arr)
        offsets, start, length = list_layout(arr)
        values = _project_value(
            arr.values.slice(start, length),
            file_t.element_type,
            read_t.element_field,
            f"{path}.element",
            ctx,
        )
        return pa.ListArray.from_arrays(
            offsets, values, type=type_to_arrow(read_t), mask=_null_mask(arr)
        )
    if isinstance(read_t, MapType):
        if (
            not isinstance(file_t, MapType)
            or file_t.key_id != read_t.key_id
            or file_t.value_id != read_t.value_id
        ):
            raise _promotion_error(path, file_t, read_t)
        offsets, start, length = list_layout(arr)
        keys = _project_value(
            arr.keys.slice(start, length), file_t.key_type, read_t.key_field, f"{path}.key", ctx
        )
        items = _project_value(
            arr.items.slice(start, length),
            file_t.value_type,
            read_t.value_field,
            f"{path}.value",
            ctx,
        )
        return pa.MapArray.from_arrays(
            offsets, keys, items, type=type_to_arrow(read_t), mask=_null_mask(arr)
        )
    if isinstance(read_t, VariantType):
        if not isinstance(file_t, VariantType):
            raise _promotion_error(path, file_t, read_t)
        return arr
    assert isinstance(read_t, PrimitiveType)
    if not isinstance(file_t, PrimitiveType):
        raise _promotion_error(path, file_t, read_t)
    return _cast_primitive(arr, file_t, read_t, path)


def _chunked(
    col: pa.ChunkedArray, target: pa.DataType, fn: Callable[[pa.Array], pa.Array]
) -> pa.ChunkedArray:
    return pa.chunked_array([fn(chunk) for chunk in col.chunks], type=target)


def project_table(
    table: pa.Table,
    file_schema: Schema | None,
    read_schema: Schema,
    *,
    constants: Mapping[int, Any] | None = None,
) -> pa.Table:
    """Reshape data read from a data file into ``read_schema``, resolving columns by id.

    Follows the spec's column projection: columns are found by field id (falling back to
    the name in ``file_schema`` when the Arrow data carries no ids), renamed and reordered
    to the read schema, promoted (int→long, float→double, decimal widening,
    date→timestamp/timestamp_ns), and columns absent from the file are filled from
    ``constants`` (field id → value, e.g. identity partition values from the manifest), then
    ``initial-default``, then null. ``unknown`` columns always read as null.

    ``file_schema`` defaults to the schema the Arrow field ids describe. Raises
    SchemaEvolutionError naming the column when a type cannot be promoted or a required
    column is missing without a default.
    """
    if file_schema is None:
        file_schema = arrow_to_schema(table.schema)
    ctx = _ReadContext(constants or {})
    target_schema = schema_to_arrow(read_schema)
    index = _arrow_children(pa.struct(list(table.schema)), file_schema.struct)
    columns: list[pa.ChunkedArray | pa.Array] = []
    for f, target_field in zip(read_schema.fields, target_schema):
        i = index.get(f.field_id)
        file_field = file_schema.find_field(f.field_id)
        if i is None or file_field is None or isinstance(f.field_type, UnknownType):
            columns.append(_default_array(f, table.num_rows, f.name, ctx))
            continue
        file_t = file_field.field_type

        def project(chunk: pa.Array, file_t: IcebergType = file_t, f: NestedField = f) -> pa.Array:
            return _project_value(chunk, file_t, f, f.name, ctx)

        columns.append(_chunked(table.column(i), target_field.type, project))
    return pa.Table.from_arrays(columns, schema=target_schema)


# ---------------------------------------------------------------------------------------
# Writer side: shape caller data into the table schema by name
# ---------------------------------------------------------------------------------------


def _write_type_error(path: str, dt: pa.DataType, t: IcebergType) -> ValidationError:
    return ValidationError(f"column {path!r} has Arrow type {dt}, but the table schema says {t}")


def _conform_primitive(arr: pa.Array, t: PrimitiveType, path: str) -> pa.Array:
    target = primitive_to_arrow(t)
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    if arr.type.equals(target):
        return arr
    if isinstance(t, VariantType):
        raise _write_type_error(path, arr.type, t)
    try:
        source_t = arrow_primitive_to_iceberg(arr.type, path)
    except ValidationError:
        raise _write_type_error(path, arr.type, t) from None
    if not _is_allowed_write(source_t, t):
        raise _write_type_error(path, arr.type, t)
    try:
        if isinstance(t, UUIDType):
            storage = arr.storage if isinstance(arr, pa.ExtensionArray) else arr
            return pa.ExtensionArray.from_storage(target, storage.cast(pa.binary(16)))
        # Safe casts refuse overflow (int64 -> int) and truncation (ns -> us timestamps).
        return arr.cast(target, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise ValidationError(f"column {path!r}: cannot store values as {t}: {e}") from e


def _is_allowed_write(source: PrimitiveType, target: PrimitiveType) -> bool:
    """Whether caller data of ``source`` may be stored as ``target`` by a checked cast."""
    if source == target:
        return True
    ints = (IntegerType, LongType)
    floats = (FloatType, DoubleType)
    if isinstance(source, ints) and isinstance(target, ints):
        return True
    if isinstance(source, floats) and isinstance(target, floats):
        return True
    if isinstance(source, DecimalType) and isinstance(target, DecimalType):
        return source.scale == target.scale and source.precision <= target.precision
    if isinstance(source, FixedType) and source.length == 16 and isinstance(target, UUIDType):
        return True
    naive = (TimestampType, TimestampNanoType)
    aware = (TimestamptzType, TimestamptzNanoType)
    if isinstance(source, naive) and isinstance(target, naive):
        return True
    if isinstance(source, aware) and isinstance(target, aware):
        return True
    return isinstance(source, BinaryType) and isinstance(target, (GeometryType, GeographyType))


def _count_required_violations(arr: pa.Array, parent_valid: pa.Array | None) -> int:
    if not arr.null_count:
        return 0
    if parent_valid is None:
        return int(arr.null_count)
    return int(pc.sum(pc.and_(arr.is_null(), parent_valid)).as_py() or 0)


def _conform_struct(
    arr: pa.Array, struct: StructType, path: str, parent_valid: pa.Array | None
) -> pa.Array:
    target = visit(struct, _ToArrow(drop_unknown=True))
    names = [arr.type.field(i).name for i in range(arr.type.num_fields)]
    by_name = {n: i for i, n in enumerate(names)}
    known = {f.name for f in struct.fields}
    extra = [n for n in names if n not in known]
    if extra:
        raise ValidationError(
            f"struct {path!r} has fields {extra} that are not in the table schema"
        )
    own_valid = arr.is_valid() if arr.null_count else None
    child_valid = (
        own_valid
        if parent_valid is None
        else (parent_valid if own_valid is None else pc.and_(parent_valid, own_valid))
    )
    children = []
    for f in struct.fields:
        child_path = f"{path}.{f.name}"
        i = by_name.get(f.name)
        if isinstance(f.field_type, UnknownType):
            if i is not None:
                _check_unknown_is_null(arr.field(i), child_path)
            continue
        if i is None:
            children.append(_missing_write_column(f, len(arr), child_path))
        else:
            children.append(_conform_value(arr.field(i), f, child_path, child_valid))
    return _make_struct(children, target, len(arr), _null_mask(arr))


def _check_unknown_is_null(arr: pa.Array | pa.ChunkedArray, path: str) -> None:
    if arr.null_count != len(arr):
        raise ValidationError(
            f"column {path!r} has type unknown, so it can only hold nulls, but has "
            f"{len(arr) - arr.null_count} values"
        )


def _missing_write_column(f: NestedField, length: int, path: str) -> pa.Array:
    try:
        return _default_array(f, length, path, _ReadContext({}), use_write_default=True)
    except SchemaEvolutionError as e:
        raise ValidationError(
            f"required column {path!r} (id {f.field_id}) is missing from the data and has no "
            "write-default"
        ) from e


def _conform_value(
    arr: pa.Array, f: NestedField, path: str, parent_valid: pa.Array | None
) -> pa.Array:
    if f.required:
        bad = _count_required_violations(arr, parent_valid)
        if bad:
            raise ValidationError(f"column {path!r} is required but has {bad} null values")
    t = f.field_type
    if pa.types.is_null(arr.type):
        # An all-null column of Arrow type null (e.g. built from [None, None]) fits any type.
        return pa.nulls(len(arr), visit(t, _ToArrow(drop_unknown=True)))
    if isinstance(t, StructType):
        if not pa.types.is_struct(arr.type):
            raise _write_type_error(path, arr.type, t)
        return _conform_struct(arr, t, path, parent_valid)
    if isinstance(t, ListType):
        if not (pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type)):
            raise _write_type_error(path, arr.type, t)
        # flatten() keeps only values under valid lists, so the element check is exact.
        lengths = pc.fill_null(pc.list_value_length(arr), 0).cast(pa.int32())
        offsets = pa.concat_arrays([pa.array([0], pa.int32()), pc.cumulative_sum_checked(lengths)])
        values = _conform_value(arr.flatten(), t.element_field, f"{path}.element", None)
        target = visit(t, _ToArrow(drop_unknown=True))
        return pa.ListArray.from_arrays(offsets, values, type=target, mask=_null_mask(arr))
    if isinstance(t, MapType):
        if not pa.types.is_map(arr.type):
            raise _write_type_error(path, arr.type, t)
        offsets, start, length = list_layout(arr)
        keys = _conform_value(arr.keys.slice(start, length), t.key_field, f"{path}.key", None)
        items = _conform_value(arr.items.slice(start, length), t.value_field, f"{path}.value", None)
        target = visit(t, _ToArrow(drop_unknown=True))
        return pa.MapArray.from_arrays(offsets, keys, items, type=target, mask=_null_mask(arr))
    assert isinstance(t, PrimitiveType)
    if isinstance(t, VariantType):
        if not _is_variant_struct(arr.type):
            raise _write_type_error(path, arr.type, t)
        return arr.cast(_variant_arrow_type())
    return _conform_primitive(arr, t, path)


def conform_table(table: pa.Table, schema: Schema) -> pa.Table:
    """Shape caller data for writing a data file of ``schema``.

    Columns (and struct fields) are matched by name, cast to the Arrow types of
    :func:`file_schema_to_arrow` with checked casts (no silent overflow or truncation),
    missing optional columns are filled from ``write-default`` or null, and required
    columns must be present (or have a write-default) and hold no nulls. Columns that
    are not in the schema are rejected rather than dropped, so no data is lost silently.
    ``unknown`` columns are omitted (the input may carry them only as all-null columns).
    """
    known = {f.name for f in schema.fields}
    extra = [n for n in table.column_names if n not in known]
    if extra:
        raise ValidationError(f"columns {extra} are not in the table schema {schema.schema_id}")
    if len(set(table.column_names)) != len(table.column_names):
        raise ValidationError(f"duplicate column names in the data: {table.column_names}")
    target_schema = file_schema_to_arrow(schema)
    targets = {f.name: f for f in target_schema}
    columns: list[pa.ChunkedArray | pa.Array] = []
    for f in schema.fields:
        present = f.name in table.column_names
        if isinstance(f.field_type, UnknownType):
            if present:
                _check_unknown_is_null(table.column(f.name), f.name)
            continue
        if not present:
            columns.append(_missing_write_column(f, table.num_rows, f.name))
            continue

        def conform(chunk: pa.Array, f: NestedField = f) -> pa.Array:
            return _conform_value(chunk, f, f.name, None)

        columns.append(_chunked(table.column(f.name), targets[f.name].type, conform))
    return pa.Table.from_arrays(columns, schema=target_schema)


__all__ = [
    "DOC_KEY",
    "FIELD_ID_KEY",
    "arrow_primitive_to_iceberg",
    "arrow_to_schema",
    "conform_table",
    "field_id_of",
    "field_to_arrow",
    "file_schema_to_arrow",
    "from_arrow_array",
    "list_layout",
    "primitive_to_arrow",
    "project_table",
    "schema_to_arrow",
    "to_arrow_array",
    "type_to_arrow",
]
