"""Iceberg data types (spec: "Schemas and Data Types") and their JSON form (Appendix C).

Types are immutable value objects: two ``DecimalType(9, 2)`` compare and hash equal, so
they can key dictionaries and be shared freely between schemas, specs and caches.
Nested types carry their field ids, because Iceberg resolves columns by id, never by
name or position.

Single values use Iceberg's internal representation throughout icefloe:
boolean → bool; int, long → int; float, double → float; decimal → decimal.Decimal;
date → int days since epoch; time → int microseconds since midnight;
timestamp/timestamptz → int microseconds since epoch; timestamp_ns/timestamptz_ns →
int nanoseconds since epoch; string → str; uuid → uuid.UUID; fixed, binary → bytes.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from icefloe.errors import ValidationError

MAX_DECIMAL_PRECISION = 38


class IcebergType:
    """Base of every Iceberg type."""

    __slots__ = ()

    @property
    def is_primitive(self) -> bool:
        return isinstance(self, PrimitiveType)

    @property
    def is_nested(self) -> bool:
        return isinstance(self, NestedType)

    def to_json(self) -> Any:
        raise NotImplementedError  # pragma: no cover - every concrete type overrides

    @property
    def min_format_version(self) -> int:
        """First table format version in which this type may appear."""
        return 1


class PrimitiveType(IcebergType):
    """A type with no children. Subclasses set ``json_name``."""

    __slots__ = ()
    json_name: ClassVar[str] = ""

    def to_json(self) -> Any:
        return self.json_name

    def __str__(self) -> str:
        return str(self.to_json())

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other)

    def __hash__(self) -> int:
        return hash(type(self).__name__)


class BooleanType(PrimitiveType):
    __slots__ = ()
    json_name = "boolean"


class IntegerType(PrimitiveType):
    __slots__ = ()
    json_name = "int"


class LongType(PrimitiveType):
    __slots__ = ()
    json_name = "long"


class FloatType(PrimitiveType):
    __slots__ = ()
    json_name = "float"


class DoubleType(PrimitiveType):
    __slots__ = ()
    json_name = "double"


class DateType(PrimitiveType):
    __slots__ = ()
    json_name = "date"


class TimeType(PrimitiveType):
    __slots__ = ()
    json_name = "time"


class TimestampType(PrimitiveType):
    __slots__ = ()
    json_name = "timestamp"


class TimestamptzType(PrimitiveType):
    __slots__ = ()
    json_name = "timestamptz"


class TimestampNanoType(PrimitiveType):
    __slots__ = ()
    json_name = "timestamp_ns"

    @property
    def min_format_version(self) -> int:
        return 3


class TimestamptzNanoType(PrimitiveType):
    __slots__ = ()
    json_name = "timestamptz_ns"

    @property
    def min_format_version(self) -> int:
        return 3


class StringType(PrimitiveType):
    __slots__ = ()
    json_name = "string"


class UUIDType(PrimitiveType):
    __slots__ = ()
    json_name = "uuid"


class BinaryType(PrimitiveType):
    __slots__ = ()
    json_name = "binary"


class UnknownType(PrimitiveType):
    """v3's null-only type: must be optional, has no stored values and no bounds."""

    __slots__ = ()
    json_name = "unknown"

    @property
    def min_format_version(self) -> int:
        return 3


class VariantType(PrimitiveType):
    """v3 semi-structured type. Carried through metadata; icefloe does not encode values."""

    __slots__ = ()
    json_name = "variant"

    @property
    def min_format_version(self) -> int:
        return 3


class FixedType(PrimitiveType):
    __slots__ = ("length",)

    def __init__(self, length: int) -> None:
        if length <= 0:
            raise ValidationError(f"fixed length must be positive, got {length}")
        self.length = length

    def to_json(self) -> str:
        return f"fixed[{self.length}]"

    def __repr__(self) -> str:
        return f"FixedType({self.length})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FixedType) and other.length == self.length

    def __hash__(self) -> int:
        return hash(("fixed", self.length))


class DecimalType(PrimitiveType):
    __slots__ = ("precision", "scale")

    def __init__(self, precision: int, scale: int) -> None:
        if not 1 <= precision <= MAX_DECIMAL_PRECISION:
            raise ValidationError(
                f"decimal precision must be between 1 and {MAX_DECIMAL_PRECISION}, got {precision}"
            )
        self.precision = precision
        self.scale = scale

    def to_json(self) -> str:
        return f"decimal({self.precision},{self.scale})"

    def __repr__(self) -> str:
        return f"DecimalType({self.precision}, {self.scale})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, DecimalType)
            and other.precision == self.precision
            and other.scale == self.scale
        )

    def __hash__(self) -> int:
        return hash(("decimal", self.precision, self.scale))


class GeometryType(PrimitiveType):
    """v3 geometry(C). Carried through metadata; values are WKB and are not decoded."""

    __slots__ = ("crs",)
    DEFAULT_CRS: ClassVar[str] = "OGC:CRS84"

    def __init__(self, crs: str = "OGC:CRS84") -> None:
        self.crs = crs

    @property
    def min_format_version(self) -> int:
        return 3

    def to_json(self) -> str:
        return "geometry" if self.crs == self.DEFAULT_CRS else f"geometry({self.crs})"

    def __repr__(self) -> str:
        return f"GeometryType({self.crs!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, GeometryType) and other.crs == self.crs

    def __hash__(self) -> int:
        return hash(("geometry", self.crs))


class GeographyType(PrimitiveType):
    """v3 geography(C, A). Carried through metadata; values are WKB and are not decoded."""

    __slots__ = ("algorithm", "crs")
    DEFAULT_CRS: ClassVar[str] = "OGC:CRS84"
    DEFAULT_ALGORITHM: ClassVar[str] = "spherical"

    def __init__(self, crs: str = "OGC:CRS84", algorithm: str = "spherical") -> None:
        self.crs = crs
        self.algorithm = algorithm

    @property
    def min_format_version(self) -> int:
        return 3

    def to_json(self) -> str:
        if self.crs == self.DEFAULT_CRS and self.algorithm == self.DEFAULT_ALGORITHM:
            return "geography"
        return f"geography({self.crs}, {self.algorithm})"

    def __repr__(self) -> str:
        return f"GeographyType({self.crs!r}, {self.algorithm!r})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, GeographyType)
            and other.crs == self.crs
            and other.algorithm == self.algorithm
        )

    def __hash__(self) -> int:
        return hash(("geography", self.crs, self.algorithm))


@dataclass(frozen=True, slots=True)
class NestedField:
    """A named, id-carrying field of a struct (and so of a schema).

    Defaults are kept in the internal value representation (see module docstring);
    ``icefloe.values`` converts them to and from the JSON single-value form.
    """

    field_id: int
    name: str
    field_type: IcebergType
    required: bool = False
    doc: str | None = None
    initial_default: Any = None
    write_default: Any = None

    @property
    def optional(self) -> bool:
        return not self.required

    def replace(self, **changes: Any) -> NestedField:
        values = {
            "field_id": self.field_id,
            "name": self.name,
            "field_type": self.field_type,
            "required": self.required,
            "doc": self.doc,
            "initial_default": self.initial_default,
            "write_default": self.write_default,
        }
        values.update(changes)
        return NestedField(**values)

    def __str__(self) -> str:
        req = "required" if self.required else "optional"
        doc = f" ({self.doc})" if self.doc else ""
        return f"{self.field_id}: {self.name}: {req} {self.field_type}{doc}"


class NestedType(IcebergType):
    """struct, list or map: a type whose children are fields with ids."""

    __slots__ = ()

    @property
    def fields(self) -> tuple[NestedField, ...]:
        raise NotImplementedError  # pragma: no cover - every concrete type overrides


class StructType(NestedType):
    __slots__ = ("_by_id", "_fields")

    def __init__(self, *fields: NestedField) -> None:
        self._fields = tuple(fields)
        self._by_id = {f.field_id: f for f in self._fields}

    @property
    def fields(self) -> tuple[NestedField, ...]:
        return self._fields

    def field(self, field_id: int) -> NestedField | None:
        return self._by_id.get(field_id)

    def __iter__(self) -> Iterator[NestedField]:
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)

    def to_json(self) -> dict[str, Any]:
        return {"type": "struct", "fields": [field_to_json(f) for f in self._fields]}

    def __repr__(self) -> str:
        return f"StructType({', '.join(repr(f) for f in self._fields)})"

    def __str__(self) -> str:
        return "struct<" + ", ".join(str(f) for f in self._fields) + ">"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StructType) and other._fields == self._fields

    def __hash__(self) -> int:
        return hash(("struct", self._fields))


class ListType(NestedType):
    __slots__ = ("element_field",)

    def __init__(self, element_id: int, element_type: IcebergType, element_required: bool = True):
        self.element_field = NestedField(element_id, "element", element_type, element_required)

    @property
    def element_id(self) -> int:
        return self.element_field.field_id

    @property
    def element_type(self) -> IcebergType:
        return self.element_field.field_type

    @property
    def element_required(self) -> bool:
        return self.element_field.required

    @property
    def fields(self) -> tuple[NestedField, ...]:
        return (self.element_field,)

    def to_json(self) -> dict[str, Any]:
        return {
            "type": "list",
            "element-id": self.element_id,
            "element": self.element_type.to_json(),
            "element-required": self.element_required,
        }

    def __repr__(self) -> str:
        return f"ListType({self.element_id}, {self.element_type!r}, {self.element_required})"

    def __str__(self) -> str:
        return f"list<{self.element_type}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ListType) and other.element_field == self.element_field

    def __hash__(self) -> int:
        return hash(("list", self.element_field))


class MapType(NestedType):
    __slots__ = ("key_field", "value_field")

    def __init__(
        self,
        key_id: int,
        key_type: IcebergType,
        value_id: int,
        value_type: IcebergType,
        value_required: bool = True,
    ) -> None:
        self.key_field = NestedField(key_id, "key", key_type, True)
        self.value_field = NestedField(value_id, "value", value_type, value_required)

    @property
    def key_id(self) -> int:
        return self.key_field.field_id

    @property
    def key_type(self) -> IcebergType:
        return self.key_field.field_type

    @property
    def value_id(self) -> int:
        return self.value_field.field_id

    @property
    def value_type(self) -> IcebergType:
        return self.value_field.field_type

    @property
    def value_required(self) -> bool:
        return self.value_field.required

    @property
    def fields(self) -> tuple[NestedField, ...]:
        return (self.key_field, self.value_field)

    def to_json(self) -> dict[str, Any]:
        return {
            "type": "map",
            "key-id": self.key_id,
            "key": self.key_type.to_json(),
            "value-id": self.value_id,
            "value": self.value_type.to_json(),
            "value-required": self.value_required,
        }

    def __repr__(self) -> str:
        return (
            f"MapType({self.key_id}, {self.key_type!r}, {self.value_id}, "
            f"{self.value_type!r}, {self.value_required})"
        )

    def __str__(self) -> str:
        return f"map<{self.key_type}, {self.value_type}>"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, MapType)
            and other.key_field == self.key_field
            and other.value_field == self.value_field
        )

    def __hash__(self) -> int:
        return hash(("map", self.key_field, self.value_field))


_SIMPLE: dict[str, PrimitiveType] = {
    t.json_name: t
    for t in (
        BooleanType(),
        IntegerType(),
        LongType(),
        FloatType(),
        DoubleType(),
        DateType(),
        TimeType(),
        TimestampType(),
        TimestamptzType(),
        TimestampNanoType(),
        TimestamptzNanoType(),
        StringType(),
        UUIDType(),
        BinaryType(),
        UnknownType(),
        VariantType(),
    )
}
_FIXED = re.compile(r"^fixed\s*\[\s*(\d+)\s*\]$")
_DECIMAL = re.compile(r"^decimal\s*\(\s*(\d+)\s*,\s*(-?\d+)\s*\)$")
_GEOMETRY = re.compile(r"^geometry\s*(?:\(\s*([^,()]+?)\s*\))?$")
_GEOGRAPHY = re.compile(r"^geography\s*(?:\(\s*([^,()]+?)\s*(?:,\s*([^,()]+?)\s*)?\))?$")


def primitive_from_string(text: str) -> PrimitiveType:
    """Parse a primitive type string (Appendix C), tolerating whitespace around parameters."""
    name = text.strip()
    simple = _SIMPLE.get(name)
    if simple is not None:
        return simple
    if m := _FIXED.match(name):
        return FixedType(int(m.group(1)))
    if m := _DECIMAL.match(name):
        return DecimalType(int(m.group(1)), int(m.group(2)))
    if m := _GEOMETRY.match(name):
        return GeometryType(m.group(1) or GeometryType.DEFAULT_CRS)
    if m := _GEOGRAPHY.match(name):
        return GeographyType(
            m.group(1) or GeographyType.DEFAULT_CRS, m.group(2) or GeographyType.DEFAULT_ALGORITHM
        )
    raise ValidationError(f"unknown Iceberg type {text!r}")


def walk_fields(struct: NestedType) -> Iterator[NestedField]:
    """Every field below ``struct`` (struct fields, list elements, map keys and values), depth first."""
    for f in struct.fields:
        yield f
        if isinstance(f.field_type, NestedType):
            yield from walk_fields(f.field_type)


def _require(obj: dict[str, Any], key: str, what: str) -> Any:
    if key not in obj:
        raise ValidationError(f"{what} is missing required field {key!r}: {obj!r:.200}")
    return obj[key]


def type_from_json(obj: Any) -> IcebergType:
    """Parse a type from its Appendix C JSON form (a string or a struct/list/map object)."""
    if isinstance(obj, str):
        return primitive_from_string(obj)
    if not isinstance(obj, dict):
        raise ValidationError(f"a type must be a JSON string or object, got {obj!r:.200}")
    kind = obj.get("type")
    if kind == "struct":
        fields = _require(obj, "fields", "struct type")
        if not isinstance(fields, list):
            raise ValidationError(f"struct 'fields' must be a list, got {fields!r:.200}")
        return StructType(*(field_from_json(f) for f in fields))
    if kind == "list":
        return ListType(
            _int(_require(obj, "element-id", "list type"), "element-id"),
            type_from_json(_require(obj, "element", "list type")),
            _bool(_require(obj, "element-required", "list type"), "element-required"),
        )
    if kind == "map":
        return MapType(
            _int(_require(obj, "key-id", "map type"), "key-id"),
            type_from_json(_require(obj, "key", "map type")),
            _int(_require(obj, "value-id", "map type"), "value-id"),
            type_from_json(_require(obj, "value", "map type")),
            _bool(_require(obj, "value-required", "map type"), "value-required"),
        )
    raise ValidationError(f"unknown nested type {kind!r} in {obj!r:.200}")


def _int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(f"{name!r} must be an integer, got {value!r:.100}")
    return value


def _bool(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise ValidationError(f"{name!r} must be a boolean, got {value!r:.100}")
    return value


def field_from_json(obj: Any) -> NestedField:
    """Parse one struct field, converting defaults from the JSON single-value form."""
    if not isinstance(obj, dict):
        raise ValidationError(f"a struct field must be a JSON object, got {obj!r:.200}")
    field_id = _int(_require(obj, "id", "struct field"), "id")
    name = _require(obj, "name", f"field {field_id}")
    if not isinstance(name, str):
        raise ValidationError(f"field {field_id}: 'name' must be a string, got {name!r:.100}")
    field_type = type_from_json(_require(obj, "type", f"field {field_id} ({name})"))
    doc = obj.get("doc")
    try:
        initial = obj.get("initial-default")
        write = obj.get("write-default")
        if initial is not None or write is not None:
            from icefloe.values import from_json_value
        initial = None if initial is None else from_json_value(field_type, initial)
        write = None if write is None else from_json_value(field_type, write)
    except ValidationError as e:
        raise ValidationError(f"field {field_id} ({name}): bad default value: {e}") from e
    return NestedField(
        field_id,
        name,
        field_type,
        _bool(_require(obj, "required", f"field {field_id} ({name})"), "required"),
        doc,
        initial,
        write,
    )


def field_to_json(f: NestedField) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": f.field_id,
        "name": f.name,
        "required": f.required,
        "type": f.field_type.to_json(),
    }
    if f.doc is not None:
        out["doc"] = f.doc
    if f.initial_default is not None or f.write_default is not None:
        from icefloe.values import to_json_value
    if f.initial_default is not None:
        out["initial-default"] = to_json_value(f.field_type, f.initial_default)
    if f.write_default is not None:
        out["write-default"] = to_json_value(f.field_type, f.write_default)
    return out


__all__ = [
    "BinaryType",
    "BooleanType",
    "DateType",
    "DecimalType",
    "DoubleType",
    "FixedType",
    "FloatType",
    "GeographyType",
    "GeometryType",
    "IcebergType",
    "IntegerType",
    "ListType",
    "LongType",
    "MapType",
    "NestedField",
    "NestedType",
    "PrimitiveType",
    "StringType",
    "StructType",
    "TimeType",
    "TimestampNanoType",
    "TimestampType",
    "TimestamptzNanoType",
    "TimestamptzType",
    "UUIDType",
    "UnknownType",
    "VariantType",
    "field_from_json",
    "field_to_json",
    "primitive_from_string",
    "type_from_json",
    "walk_fields",
]
