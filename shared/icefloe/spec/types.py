"""Iceberg data types (spec: "Schemas and Data Types") and the names of primitive types.

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
    :mod:`icefloe.spec.type_json` converts them to and from the JSON single-value form.
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
    "primitive_from_string",
    "walk_fields",
]
