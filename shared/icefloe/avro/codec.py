"""Iceberg ⇄ Avro: schema conversion with field ids, value encoding and container-file access.

Manifests and manifest lists are Avro files, and Iceberg resolves their columns by field id,
not by name (spec Appendix A). So converting an Iceberg type to Avro stores every id in the
Avro schema (``field-id`` on record fields, ``element-id`` on arrays, ``key-id``/``value-id``
on string-keyed maps, ``field-id`` on the key and value of the key/value records that other
maps become), and converting back reads them, which lets icefloe read files other writers
produced whatever they named their columns.

Record names follow the Java implementation, so files look the same whoever wrote them: a
struct field's record is ``r<field id>`` (``r102`` for a manifest's partition tuple), a map's
key/value record is ``k<key id>_v<value id>``, and named fixed types are ``fixed_<L>``,
``decimal_<P>_<S>`` and ``uuid_fixed``. Avro allows each name to be defined once per schema,
so later uses of an already defined name are emitted as a reference.

Reading goes through :func:`read_container`, which hands fastavro a copy of the header whose
schema has the date, time and timestamp logical types removed: fastavro would otherwise turn
those into :mod:`datetime` objects, which costs time, fails for Iceberg values outside Python's
years 1..9999, and is the opposite of the internal representation (plain ints) icefloe wants.
Measured on 20k day-partitioned manifest entries, rewriting the header costs the same as
converting the dates back afterwards, so the lossless way wins.

Why one module past 800 lines: schema conversion, value encoding and container access are one
round trip: the names and ids the converter writes are what the encoder and reader depend on.
"""

from __future__ import annotations

import io
import json
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from decimal import Context, Decimal
from functools import lru_cache
from types import TracebackType
from typing import Any, Self, cast

import fastavro

from icefloe.errors import InvalidFileError, ValidationError
from icefloe.spec.schema import Schema
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

AVRO_MAGIC = b"Obj\x01"
SYNC_SIZE = 16

# Property names Iceberg adds to Avro schemas (spec Appendix A).
FIELD_ID = "field-id"
ELEMENT_ID = "element-id"
KEY_ID = "key-id"
VALUE_ID = "value-id"
ADJUST_TO_UTC = "adjust-to-utc"
# Set by Java when a field name had to be changed to be a valid Avro name.
ICEBERG_FIELD_NAME = "iceberg-field-name"

# Codecs fastavro can write without extra packages; "deflate" is what Java writes by default.
DEFAULT_CODEC = "deflate"

_SIMPLE_TO_AVRO: dict[type, Any] = {
    BooleanType: "boolean",
    IntegerType: "int",
    LongType: "long",
    FloatType: "float",
    DoubleType: "double",
    StringType: "string",
    BinaryType: "bytes",
    GeometryType: "bytes",
    GeographyType: "bytes",
    UnknownType: "null",
    DateType: {"type": "int", "logicalType": "date"},
    TimeType: {"type": "long", "logicalType": "time-micros"},
    TimestampType: {"type": "long", "logicalType": "timestamp-micros", ADJUST_TO_UTC: False},
    TimestamptzType: {"type": "long", "logicalType": "timestamp-micros", ADJUST_TO_UTC: True},
    TimestampNanoType: {"type": "long", "logicalType": "timestamp-nanos", ADJUST_TO_UTC: False},
    TimestamptzNanoType: {"type": "long", "logicalType": "timestamp-nanos", ADJUST_TO_UTC: True},
}

_AVRO_PRIMITIVES: dict[str, PrimitiveType] = {
    "boolean": BooleanType(),
    "int": IntegerType(),
    "long": LongType(),
    "float": FloatType(),
    "double": DoubleType(),
    "bytes": BinaryType(),
    "string": StringType(),
    "null": UnknownType(),
}

# Logical types fastavro would decode into datetime objects; read as their underlying ints.
_LOSSY_LOGICAL_TYPES = frozenset(
    {
        "date",
        "time-micros",
        "time-millis",
        "timestamp-micros",
        "timestamp-millis",
        "local-timestamp-micros",
        "local-timestamp-millis",
    }
)


def decimal_required_bytes(precision: int) -> int:
    """Smallest fixed size holding every unscaled value of ``precision`` digits, signed."""
    size = 1
    while 2 ** (8 * size - 1) < 10**precision:
        size += 1
    return size


def _escape(c: str) -> str:
    return "_" + c if c.isdigit() else f"_x{ord(c):X}"


def sanitize_name(name: str) -> str:
    """A valid Avro name for ``name``, escaping characters as Java does (``a-b`` → ``a_x2Db``).

    Letters and digits are those of Unicode, as in Java (and PyIceberg), so that a column's
    Avro name is the same whichever engine wrote the file; the original name travels in the
    ``iceberg-field-name`` property.
    """
    if not name:
        return "_"
    first = name[0] if name[0].isalpha() or name[0] == "_" else _escape(name[0])
    return first + "".join(c if c.isalnum() or c == "_" else _escape(c) for c in name[1:])


# ---------------------------------------------------------------------------------------------
# Iceberg → Avro
# ---------------------------------------------------------------------------------------------


class _ToAvro:
    """One conversion: remembers which named Avro types are already defined in the document."""

    def __init__(self) -> None:
        self.defined: set[str] = set()

    def _named(self, name: str, build: Callable[[], dict[str, Any]]) -> Any:
        if name in self.defined:
            return name
        self.defined.add(name)
        return build()

    def convert(self, t: IcebergType, record_name: str) -> Any:
        simple = _SIMPLE_TO_AVRO.get(type(t))
        if simple is not None:
            return dict(simple) if isinstance(simple, dict) else simple
        if isinstance(t, StructType):
            return self.record(t, record_name)
        if isinstance(t, ListType):
            return {
                "type": "array",
                "items": self.optional(t.element_type, f"r{t.element_id}", t.element_required),
                ELEMENT_ID: t.element_id,
            }
        if isinstance(t, MapType):
            return self.map(t)
        if isinstance(t, DecimalType):
            p, s = t.precision, t.scale
            if s < 0:
                raise ValidationError(
                    f"{t} cannot be stored in Avro: Avro decimals need scale >= 0"
                )
            return self._named(
                f"decimal_{p}_{s}",
                lambda: {
                    "type": "fixed",
                    "name": f"decimal_{p}_{s}",
                    "size": decimal_required_bytes(p),
                    "logicalType": "decimal",
                    "precision": p,
                    "scale": s,
                },
            )
        if isinstance(t, UUIDType):
            return self._named(
                "uuid_fixed",
                lambda: {"type": "fixed", "name": "uuid_fixed", "size": 16, "logicalType": "uuid"},
            )
        if isinstance(t, FixedType):
            size = t.length
            return self._named(
                f"fixed_{size}", lambda: {"type": "fixed", "name": f"fixed_{size}", "size": size}
            )
        if isinstance(t, VariantType):
            return self._named(
                record_name,
                lambda: {
                    "type": "record",
                    "name": record_name,
                    "logicalType": "variant",
                    "fields": [
                        {"name": "metadata", "type": "bytes"},
                        {"name": "value", "type": "bytes"},
                    ],
                },
            )
        raise ValidationError(f"type {t} has no Avro representation")

    def record(self, t: StructType, record_name: str) -> Any:
        # Fields are converted in document order so that a named type is always defined
        # before any reference to it.
        fields = [self.field(f) for f in t.fields]
        if record_name in self.defined:
            raise ValidationError(f"Avro record name {record_name!r} would be defined twice")
        self.defined.add(record_name)
        return {"type": "record", "name": record_name, "fields": fields}

    def optional(self, t: IcebergType, record_name: str, required: bool) -> Any:
        avro = self.convert(t, record_name)
        if required or isinstance(t, UnknownType):
            return avro
        return ["null", avro]

    def field(self, f: NestedField) -> dict[str, Any]:
        name = sanitize_name(f.name)
        avro_type = self.convert(f.field_type, f"r{f.field_id}")
        out: dict[str, Any] = {"name": name}
        if f.doc:
            out["doc"] = f.doc
        default = _MISSING
        if f.initial_default is not None and isinstance(f.field_type, PrimitiveType):
            default = avro_default(f.field_type, f.initial_default)
        if isinstance(f.field_type, UnknownType):
            out["type"] = avro_type
            out["default"] = None
        elif f.required:
            out["type"] = avro_type
            if default is not _MISSING:
                out["default"] = default
        elif default is not _MISSING:
            # An Avro default must match the union's first branch.
            out["type"] = [avro_type, "null"]
            out["default"] = default
        else:
            out["type"] = ["null", avro_type]
            out["default"] = None
        out[FIELD_ID] = f.field_id
        if name != f.name:
            out[ICEBERG_FIELD_NAME] = f.name
        return out

    def map(self, t: MapType) -> dict[str, Any]:
        if isinstance(t.key_type, StringType):
            value = self.optional(t.value_type, f"r{t.value_id}", t.value_required)
            return {"type": "map", "values": value, KEY_ID: t.key_id, VALUE_ID: t.value_id}
        # The key comes first in the document, so it must define any named type first.
        key = self.convert(t.key_type, f"r{t.key_id}")
        value = self.optional(t.value_type, f"r{t.value_id}", t.value_required)
        kv_name = f"k{t.key_id}_v{t.value_id}"
        if kv_name in self.defined:
            raise ValidationError(f"Avro record name {kv_name!r} would be defined twice")
        self.defined.add(kv_name)
        return {
            "type": "array",
            "logicalType": "map",
            "items": {
                "type": "record",
                "name": kv_name,
                "fields": [
                    {"name": "key", "type": key, FIELD_ID: t.key_id},
                    {"name": "value", "type": value, FIELD_ID: t.value_id},
                ],
            },
        }


_MISSING: Any = object()


def avro_default(t: PrimitiveType, value: Any) -> Any:
    """An Iceberg default (internal representation) as an Avro JSON default, or _MISSING.

    Avro spells bytes and fixed defaults as strings of code points 0-255.
    """
    if isinstance(t, BooleanType | IntegerType | LongType | StringType):
        return value
    if isinstance(t, FloatType | DoubleType):
        return value if value == value and abs(value) != float("inf") else _MISSING
    if isinstance(t, DateType | TimeType | TimestampType | TimestamptzType):
        return value
    if isinstance(t, TimestampNanoType | TimestamptzNanoType):
        return value
    if isinstance(t, UUIDType):
        return value.bytes.decode("latin-1")
    if isinstance(t, FixedType | BinaryType):
        return bytes(value).decode("latin-1")
    if isinstance(t, DecimalType):
        encode = avro_encoder(t)
        assert encode is not None
        return encode(value).decode("latin-1")
    return _MISSING


def schema_to_avro(schema: Schema | StructType, record_name: str = "table") -> dict[str, Any]:
    """The Avro record schema (a dict for fastavro) of an Iceberg schema or struct."""
    struct = schema.struct if isinstance(schema, Schema) else schema
    result = _ToAvro().record(struct, record_name)
    assert isinstance(result, dict)
    return result


def type_to_avro(t: IcebergType, record_name: str = "r0") -> Any:
    """The Avro schema of a single Iceberg type; ``record_name`` names it if it is a struct."""
    return _ToAvro().convert(t, record_name)


@lru_cache(maxsize=256)
def parsed_avro_schema(struct: StructType, record_name: str) -> dict[str, Any]:
    """fastavro's parsed form of a struct's Avro schema, built once per struct and name.

    Writers of the same table share the same few structs (one per spec and format version),
    and ``fastavro.parse_schema`` is the expensive part of opening a writer.
    """
    avro = schema_to_avro(struct, record_name)
    try:
        parsed = fastavro.parse_schema(avro)
    except Exception as e:  # fastavro raises several unrelated types for a bad schema
        raise ValidationError(f"cannot build the Avro schema {record_name!r}: {e}") from e
    return cast(dict[str, Any], parsed)


# ---------------------------------------------------------------------------------------------
# Avro → Iceberg
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AvroConversion:
    """An Avro record schema read as Iceberg.

    ``avro_names`` maps each record field's id to the name fastavro uses as its dict key,
    which can differ from the Iceberg name (sanitized names, foreign writers).
    """

    struct: StructType
    avro_names: Mapping[int, str]


class _FromAvro:
    def __init__(self) -> None:
        self.named: dict[str, Any] = {}
        self.in_progress: set[str] = set()
        self.avro_names: dict[int, str] = {}

    def _fullname(self, name: str, namespace: str | None) -> str:
        if "." in name or not namespace:
            return name
        return f"{namespace}.{name}"

    def _register(self, obj: dict[str, Any], namespace: str | None) -> tuple[str, str | None]:
        name = obj.get("name")
        if not isinstance(name, str):
            raise ValidationError(f"Avro {obj.get('type')} schema has no name: {obj!r:.200}")
        ns = obj.get("namespace", namespace)
        full = self._fullname(name, ns if isinstance(ns, str) else None)
        self.named[full] = obj
        child_ns = full.rsplit(".", 1)[0] if "." in full else None
        return full, child_ns

    def convert(self, obj: Any, namespace: str | None, where: str) -> tuple[IcebergType, bool]:
        """(type, optional) of an Avro schema; unions with null mean optional."""
        if isinstance(obj, list):
            branches = [b for b in obj if b != "null"]
            if len(branches) != 1 or len(obj) > 2:
                raise ValidationError(
                    f"{where}: only unions of one type with null are allowed, got {obj!r:.200}"
                )
            t, _ = self.convert(branches[0], namespace, where)
            return t, len(obj) == 2
        if isinstance(obj, str):
            prim = _AVRO_PRIMITIVES.get(obj)
            if prim is not None:
                return prim, isinstance(prim, UnknownType)
            full = self._fullname(obj, namespace)
            ref = self.named.get(full)
            if ref is None:
                full, ref = obj, self.named.get(obj)
            if ref is None:
                raise ValidationError(f"{where}: unknown Avro type name {obj!r}")
            if full in self.in_progress:
                raise ValidationError(f"{where}: recursive Avro type {obj!r} is not allowed")
            return self._complex(ref, namespace, where, register=False), False
        if isinstance(obj, dict):
            return self._complex(obj, namespace, where, register=True), obj.get("type") == "null"
        raise ValidationError(f"{where}: not an Avro schema: {obj!r:.200}")

    def _complex(
        self, obj: dict[str, Any], namespace: str | None, where: str, *, register: bool
    ) -> IcebergType:
        kind = obj.get("type")
        logical = obj.get("logicalType")
        if isinstance(kind, dict | list):
            t, _ = self.convert(kind, namespace, where)
            return t
        if kind == "record":
            if register:
                full, child_ns = self._register(obj, namespace)
            else:
                full, child_ns = str(obj.get("name", "")), namespace
            if logical == "variant" or _looks_like_variant(obj):
                return VariantType()
            self.in_progress.add(full)
            try:
                return self.record(obj, child_ns, where)
            finally:
                self.in_progress.discard(full)
        if kind == "array":
            items = obj.get("items")
            if logical == "map":
                return self._kv_map(items, namespace, where)
            element_id = _id(obj, ELEMENT_ID, where)
            element, optional = self.convert(items, namespace, f"{where}.element")
            return ListType(element_id, element, not optional)
        if kind == "map":
            key_id = _id(obj, KEY_ID, where)
            value_id = _id(obj, VALUE_ID, where)
            value, optional = self.convert(obj.get("values"), namespace, f"{where}.value")
            return MapType(key_id, StringType(), value_id, value, not optional)
        if kind == "fixed":
            if register:
                self._register(obj, namespace)
            size = obj.get("size")
            if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
                raise ValidationError(f"{where}: Avro fixed has an invalid size {size!r}")
            if logical == "decimal":
                return _decimal(obj, where)
            if logical == "uuid":
                if size != 16:
                    raise ValidationError(f"{where}: uuid must be fixed[16], got fixed[{size}]")
                return UUIDType()
            return FixedType(size)
        if kind == "enum":
            if register:
                self._register(obj, namespace)
            return StringType()
        if isinstance(kind, str) and kind in _AVRO_PRIMITIVES:
            return _logical(kind, logical, obj, where)
        raise ValidationError(f"{where}: unsupported Avro type {kind!r}")

    def record(self, obj: dict[str, Any], namespace: str | None, where: str) -> StructType:
        fields = obj.get("fields")
        if not isinstance(fields, list):
            raise ValidationError(f"{where}: Avro record has no 'fields' list")
        out: list[NestedField] = []
        for f in fields:
            if not isinstance(f, dict) or not isinstance(f.get("name"), str):
                raise ValidationError(f"{where}: malformed Avro record field {f!r:.200}")
            avro_name = f["name"]
            path = f"{where}.{avro_name}" if where else avro_name
            field_id = _id(f, FIELD_ID, path)
            t, optional = self.convert(f.get("type"), namespace, path)
            name = f.get(ICEBERG_FIELD_NAME, avro_name)
            doc = f.get("doc") if isinstance(f.get("doc"), str) else None
            self.avro_names[field_id] = avro_name
            out.append(NestedField(field_id, str(name), t, not optional, doc))
        return StructType(*out)

    def _kv_map(self, items: Any, namespace: str | None, where: str) -> MapType:
        if isinstance(items, str):
            items = self.named.get(self._fullname(items, namespace)) or self.named.get(items)
        if not isinstance(items, dict) or items.get("type") != "record":
            raise ValidationError(f"{where}: an Avro array with logicalType map needs records")
        fields = items.get("fields")
        if not isinstance(fields, list) or len(fields) != 2:
            raise ValidationError(f"{where}: map key/value records must have exactly 2 fields")
        self._register(items, namespace)
        key_f, value_f = fields
        key_id = _id(key_f, FIELD_ID, f"{where}.key")
        value_id = _id(value_f, FIELD_ID, f"{where}.value")
        key, key_optional = self.convert(key_f.get("type"), namespace, f"{where}.key")
        if key_optional:
            raise ValidationError(f"{where}: map keys must not be optional")
        value, optional = self.convert(value_f.get("type"), namespace, f"{where}.value")
        self.avro_names[key_id] = key_f["name"]
        self.avro_names[value_id] = value_f["name"]
        return MapType(key_id, key, value_id, value, not optional)


def _looks_like_variant(obj: dict[str, Any]) -> bool:
    fields = obj.get("fields")
    return (
        isinstance(fields, list)
        and len(fields) == 2
        and all(isinstance(f, dict) and FIELD_ID not in f for f in fields)
        and {f.get("name") for f in fields} == {"metadata", "value"}
    )


def _id(obj: Any, key: str, where: str) -> int:
    value = obj.get(key) if isinstance(obj, dict) else None
    if isinstance(value, str) and value.lstrip("-").isdigit():
        value = int(value)  # some writers store ids as strings
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValidationError(f"{where}: Avro schema is missing the Iceberg {key!r} property")
    return value


def _decimal(obj: dict[str, Any], where: str) -> DecimalType:
    precision = obj.get("precision")
    scale = obj.get("scale", 0)
    if not isinstance(precision, int) or not isinstance(scale, int):
        raise ValidationError(f"{where}: Avro decimal needs integer precision and scale")
    return DecimalType(precision, scale)


def _logical(kind: str, logical: Any, obj: dict[str, Any], where: str) -> IcebergType:
    if logical is None:
        return _AVRO_PRIMITIVES[kind]
    utc = obj.get(ADJUST_TO_UTC, False) in (True, "true")
    if kind == "int" and logical == "date":
        return DateType()
    if kind == "long" and logical == "time-micros":
        return TimeType()
    if kind == "long" and logical == "timestamp-micros":
        return TimestamptzType() if utc else TimestampType()
    if kind == "long" and logical == "local-timestamp-micros":
        return TimestampType()
    if kind == "long" and logical == "timestamp-nanos":
        return TimestamptzNanoType() if utc else TimestampNanoType()
    if kind == "long" and logical == "local-timestamp-nanos":
        return TimestampNanoType()
    if kind == "string" and logical == "uuid":
        return UUIDType()
    if kind == "bytes" and logical == "decimal":
        return _decimal(obj, where)
    if logical in _LOSSY_LOGICAL_TYPES:
        raise ValidationError(f"{where}: Avro logical type {logical!r} has no Iceberg equivalent")
    return _AVRO_PRIMITIVES[kind]  # unknown logical types are ignored, as Avro requires


def avro_to_iceberg(avro_schema: Any) -> AvroConversion:
    """Convert an Avro record schema (dict or JSON text) carrying Iceberg ids to Iceberg.

    Raises :class:`ValidationError` naming the offending field when an id is missing or a
    type has no Iceberg equivalent.
    """
    if isinstance(avro_schema, str | bytes):
        try:
            avro_schema = json.loads(avro_schema)
        except ValueError as e:
            raise ValidationError(f"Avro schema is not valid JSON: {e}") from e
    if not isinstance(avro_schema, dict) or avro_schema.get("type") != "record":
        raise ValidationError(f"expected an Avro record schema, got {avro_schema!r:.200}")
    conv = _FromAvro()
    t = conv._complex(avro_schema, None, "", register=True)
    if not isinstance(t, StructType):
        raise ValidationError("the Avro root record is not a struct")
    return AvroConversion(t, conv.avro_names)


def avro_to_schema(avro_schema: Any, schema_id: int = 0) -> Schema:
    """An Iceberg schema from an Avro record schema with field ids (e.g. a file's header)."""
    return Schema.from_struct(avro_to_iceberg(avro_schema).struct, schema_id=schema_id)


# ---------------------------------------------------------------------------------------------
# Values: internal representation ⇄ what fastavro reads and writes
# ---------------------------------------------------------------------------------------------

Converter = Callable[[Any], Any]
# Wide enough that scaling a 38-digit decimal never rounds.
_EXACT = Context(prec=200, Emin=-999_999, Emax=999_999)


def avro_encoder(t: IcebergType) -> Converter | None:
    """How to turn an internal value into a fastavro datum for the schema from ``type_to_avro``.

    ``None`` means the internal value is written as is (ints for dates and timestamps pass
    through fastavro's logical-type hooks untouched). Only primitives are supported: they are
    what partition tuples hold.
    """
    if isinstance(t, DecimalType):
        size = decimal_required_bytes(t.precision)
        scale = t.scale
        limit = 10**t.precision

        def encode_decimal(v: Any) -> bytes | None:
            if v is None:
                return None
            if not isinstance(v, Decimal) or not v.is_finite():
                raise ValidationError(f"{v!r} is not a {t} value: expected a finite Decimal")
            scaled = v.scaleb(scale, _EXACT)
            if scaled != scaled.to_integral_value(context=_EXACT):
                raise ValidationError(f"{v} has more than {scale} digits after the point for {t}")
            unscaled = int(scaled)
            if not -limit < unscaled < limit:
                raise ValidationError(f"{v} needs more than {t.precision} digits for {t}")
            return unscaled.to_bytes(size, "big", signed=True)

        return encode_decimal
    if isinstance(t, UUIDType):
        return lambda v: None if v is None else v.bytes
    if isinstance(t, PrimitiveType):
        return None
    raise ValidationError(f"no Avro value encoder for nested type {t}")


def avro_decoder(t: IcebergType) -> Converter | None:
    """The inverse of :func:`avro_encoder` for records read with :func:`read_container`."""
    if isinstance(t, UUIDType):
        return lambda v: None if v is None or isinstance(v, uuid.UUID) else uuid.UUID(bytes=v)
    if isinstance(t, DecimalType):
        # fastavro decodes the decimal logical type itself; bytes only appear if it was absent.
        scale = t.scale

        def decode_decimal(v: Any) -> Any:
            if isinstance(v, bytes):
                return Decimal(int.from_bytes(v, "big", signed=True)).scaleb(-scale)
            return v

        return decode_decimal
    if isinstance(t, PrimitiveType):
        return None
    raise ValidationError(f"no Avro value decoder for nested type {t}")


# ---------------------------------------------------------------------------------------------
# Container files
# ---------------------------------------------------------------------------------------------

_HEADER_META_SCHEMA = fastavro.parse_schema({"type": "map", "values": "bytes"})


def _strip_lossy_logical_types(obj: Any) -> tuple[Any, bool]:
    """A copy of an Avro schema without the logical types fastavro turns into datetimes."""
    if isinstance(obj, list):
        changed = False
        out_list = []
        for item in obj:
            new, c = _strip_lossy_logical_types(item)
            out_list.append(new)
            changed |= c
        return (out_list, True) if changed else (obj, False)
    if not isinstance(obj, dict):
        return obj, False
    changed = False
    out: dict[str, Any] = {}
    for key, value in obj.items():
        if key == "logicalType" and value in _LOSSY_LOGICAL_TYPES:
            changed = True
            continue
        if key in ("type", "items", "values", "fields"):
            value, c = _strip_lossy_logical_types(value)
            changed |= c
        out[key] = value
    return (out, True) if changed else (obj, False)


@dataclass(frozen=True, slots=True)
class AvroContainer:
    """A decoded Avro object-container header plus access to its records.

    ``metadata`` holds the user key-value metadata as text (the ``avro.*`` keys included);
    ``schema`` is the writer's schema as JSON, exactly as stored.
    """

    location: str
    metadata: Mapping[str, str]
    schema: Any
    _data: bytes

    def records(self) -> Iterator[dict[Any, Any]]:
        """The records, with date/time/timestamp values as plain ints.

        Records are typed ``dict[Any, Any]`` so callers may look up an absent optional
        column as ``record.get(None)``, which is None without a branch.

        Failures inside fastavro (truncated blocks, bad sync markers, unknown codecs) are
        reported as :class:`InvalidFileError` for this file.
        """
        try:
            reader = fastavro.reader(io.BytesIO(self._data))
        except Exception as e:  # fastavro raises many unrelated types on bad input
            raise InvalidFileError(self.location, f"cannot decode Avro data: {e}") from e
        index = 0
        it = iter(reader)
        while True:
            try:
                record = next(it)
            except StopIteration:
                return
            except Exception as e:
                raise InvalidFileError(
                    self.location, f"cannot decode Avro record {index}: {type(e).__name__}: {e}"
                ) from e
            yield cast(dict[Any, Any], record)
            index += 1


def read_header(data: bytes, location: str) -> tuple[dict[str, str], int]:
    """The key-value metadata of an Avro container file and where its data blocks start."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise InvalidFileError(location, f"expected the file's bytes, got {type(data).__name__}")
    if bytes(data[:4]) != AVRO_MAGIC:
        raise InvalidFileError(location, "not an Avro object container file (bad magic bytes)")
    stream = io.BytesIO(data)
    stream.seek(4)
    try:
        raw = fastavro.schemaless_reader(stream, _HEADER_META_SCHEMA, None)
    except Exception as e:
        raise InvalidFileError(location, f"truncated or corrupt Avro header: {e}") from e
    end = stream.tell() + SYNC_SIZE
    if end > len(data) or not isinstance(raw, dict):
        raise InvalidFileError(location, "truncated Avro header: the sync marker is missing")
    meta: dict[str, str] = {}
    for key, value in raw.items():
        try:
            meta[key] = bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            if key.startswith("avro."):
                raise InvalidFileError(location, f"Avro metadata {key!r} is not UTF-8") from None
            continue  # binary user metadata is not ours; skip it
    return meta, end


def read_container(data: bytes, location: str) -> AvroContainer:
    """Open an Avro container file held in memory for reading."""
    meta, end = read_header(data, location)
    schema_text = meta.get("avro.schema")
    if schema_text is None:
        raise InvalidFileError(location, "Avro header has no 'avro.schema'")
    try:
        schema = json.loads(schema_text)
    except ValueError as e:
        raise InvalidFileError(location, f"Avro header schema is not valid JSON: {e}") from e
    stripped, changed = _strip_lossy_logical_types(schema)
    body = bytes(data)
    if changed:
        # Same file with a header whose schema reads dates and timestamps as ints.
        raw_meta = {k: v.encode("utf-8") for k, v in meta.items()}
        raw_meta["avro.schema"] = json.dumps(stripped).encode("utf-8")
        header = io.BytesIO()
        header.write(AVRO_MAGIC)
        fastavro.schemaless_writer(header, _HEADER_META_SCHEMA, raw_meta)
        header.write(body[end - SYNC_SIZE : end])
        body = header.getvalue() + body[end:]
    return AvroContainer(location, meta, schema, body)


class _WriteOnly:
    """Hides everything but ``write`` from fastavro.

    fastavro treats a seekable, readable stream that is not at position 0 as an existing Avro
    file to append to; a manifest written after other bytes must start a new file instead.
    """

    __slots__ = ("_output",)

    def __init__(self, output: Any) -> None:
        self._output = output

    def write(self, data: bytes) -> int:
        written: int = self._output.write(data)
        return written

    def flush(self) -> None:
        flush = getattr(self._output, "flush", None)
        if flush is not None:
            flush()

    def seekable(self) -> bool:
        return False


class AvroWriter:
    """A fastavro block writer that never leaves half a record in the file.

    fastavro encodes a record straight into the current block's buffer, so a record that fails
    halfway (a string where a long belongs) would leave its first fields behind and silently
    corrupt the file. This writer keeps the records of the unwritten block and, on failure,
    clears the block buffer and encodes them again, so a rejected record leaves no trace and
    the writer stays usable. Should the fastavro internals this relies on ever change, the
    writer refuses further records instead of risking a corrupt file.

    The file starts at the stream's current position, whatever is before it.
    """

    __slots__ = ("_broken", "_pending", "_writer")

    def __init__(
        self,
        output: Any,
        parsed_schema: dict[str, Any],
        metadata: Mapping[str, str],
        codec: str = DEFAULT_CODEC,
    ) -> None:
        try:
            self._writer = fastavro.write.Writer(
                cast(Any, _WriteOnly(output)), parsed_schema, codec=codec, metadata=dict(metadata)
            )
        except ValueError as e:
            raise ValidationError(f"cannot open an Avro writer (codec {codec!r}): {e}") from e
        self._pending: list[Any] = []
        self._broken = False

    def write(self, record: Any) -> None:
        """Append one record; on any failure nothing of it is kept and the error propagates."""
        if self._broken:
            raise ValidationError(
                "the Avro writer is unusable after an earlier failed record; start a new file"
            )
        writer = self._writer
        try:
            writer.write(record)
        except BaseException:
            self._roll_back()
            raise
        if writer.block_count == 0:
            self._pending.clear()  # the block, this record included, went to the output
        else:
            self._pending.append(record)

    def _roll_back(self) -> None:
        writer: Any = self._writer  # reaches into fastavro's block buffer (see the class doc)
        try:
            writer.io.clear()
            writer.block_count = 0
            for record in self._pending:
                writer.write(record)
        except Exception:
            self._broken = True

    def flush(self) -> None:
        """Write out the current block (if any) and flush the output stream."""
        if self._broken:
            raise ValidationError("the Avro writer failed earlier; the file is incomplete")
        self._writer.flush()
        self._pending.clear()


class AvroFileWriter:
    """Base of the writers that put one Avro file into a caller's stream (manifests, lists).

    Closing flushes the last block once. Leaving a ``with`` block on an exception only marks
    the writer closed: the output is incomplete, and flushing it would make half a manifest
    look like a whole one.
    """

    def __init__(
        self,
        output: Any,
        parsed_schema: dict[str, Any],
        metadata: Mapping[str, str],
        codec: str = DEFAULT_CODEC,
    ) -> None:
        self._closed = False
        self._writer = AvroWriter(output, parsed_schema, metadata, codec)

    def close(self) -> None:
        """Flush the last block; the caller owns (and closes) the output stream."""
        if not self._closed:
            self._closed = True
            self._writer.flush()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self._closed = True


__all__ = [
    "AvroContainer",
    "AvroConversion",
    "AvroFileWriter",
    "AvroWriter",
    "avro_decoder",
    "avro_default",
    "avro_encoder",
    "avro_to_iceberg",
    "avro_to_schema",
    "decimal_required_bytes",
    "parsed_avro_schema",
    "read_container",
    "read_header",
    "sanitize_name",
    "schema_to_avro",
    "type_to_avro",
]
