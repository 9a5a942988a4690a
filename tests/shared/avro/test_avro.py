"""Iceberg ⇄ Avro schema conversion, value encoding and container access."""

from __future__ import annotations

import io
import json
import uuid
from decimal import Decimal
from typing import Any

import fastavro
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples
from icefloe.avro.codec import (
    avro_decoder,
    avro_encoder,
    avro_to_iceberg,
    avro_to_schema,
    decimal_required_bytes,
    read_container,
    read_header,
    sanitize_name,
    schema_to_avro,
    type_to_avro,
)
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

PRIMITIVES: list[PrimitiveType] = [
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
    FixedType(3),
    DecimalType(9, 2),
    DecimalType(38, 10),
]


def rich_schema() -> Schema:
    return Schema(
        *(NestedField(i + 1, f"p{i}", t, i % 2 == 0) for i, t in enumerate(PRIMITIVES)),
        NestedField(
            100,
            "location",
            StructType(
                NestedField(101, "lat", DoubleType(), True),
                NestedField(102, "lon", DoubleType(), False, doc="degrees east"),
            ),
            False,
        ),
        NestedField(110, "tags", ListType(111, StringType(), False), True),
        NestedField(120, "props", MapType(121, StringType(), 122, LongType(), True), False),
        NestedField(
            130,
            "by_id",
            MapType(
                131,
                IntegerType(),
                132,
                StructType(NestedField(133, "x", DecimalType(9, 2), False)),
                False,
            ),
            False,
        ),
        NestedField(140, "odd name-1", LongType(), False),
        NestedField(141, "1st", LongType(), False),
        NestedField(142, "nothing", UnknownType(), False),
        NestedField(143, "v", VariantType(), False),
    )


# -- Iceberg → Avro ------------------------------------------------------------------------


def test_schema_round_trips_through_avro() -> None:
    schema = rich_schema()
    avro = schema_to_avro(schema, "table")
    fastavro.parse_schema(avro)  # a valid Avro schema
    assert avro_to_schema(avro) == schema
    # ... also from the JSON text a file header carries
    assert avro_to_schema(json.dumps(avro)) == schema


def test_ids_and_java_record_names() -> None:
    avro = schema_to_avro(rich_schema(), "table")
    fields = {f["name"]: f for f in avro["fields"]}
    assert fields["location"]["type"][1]["name"] == "r100"
    assert fields["location"]["field-id"] == 100
    tags = fields["tags"]["type"]
    assert tags == {"type": "array", "items": ["null", "string"], "element-id": 111}
    props = fields["props"]["type"][1]
    assert props == {"type": "map", "values": "long", "key-id": 121, "value-id": 122}
    by_id = fields["by_id"]["type"][1]
    assert by_id["logicalType"] == "map"
    assert by_id["items"]["name"] == "k131_v132"
    assert [f["field-id"] for f in by_id["items"]["fields"]] == [131, 132]
    assert by_id["items"]["fields"][1]["type"][1]["name"] == "r132"


def test_optional_fields_are_null_first_unions_defaulting_to_null() -> None:
    avro = schema_to_avro(rich_schema(), "table")
    for f in avro["fields"]:
        if isinstance(f["type"], list):
            assert f["type"][0] == "null"
            assert f["default"] is None


def test_named_types_are_defined_once_and_then_referenced() -> None:
    struct = StructType(
        NestedField(1, "a", DecimalType(9, 2), True),
        NestedField(2, "b", DecimalType(9, 2), False),
        NestedField(3, "c", UUIDType(), True),
        NestedField(4, "d", UUIDType(), True),
    )
    avro = schema_to_avro(struct, "r")
    a, b, c, d = (f["type"] for f in avro["fields"])
    assert a == {
        "type": "fixed",
        "name": "decimal_9_2",
        "size": 4,
        "logicalType": "decimal",
        "precision": 9,
        "scale": 2,
    }
    assert b == ["null", "decimal_9_2"]
    assert c == {"type": "fixed", "name": "uuid_fixed", "size": 16, "logicalType": "uuid"}
    assert d == "uuid_fixed"
    fastavro.parse_schema(avro)
    assert avro_to_iceberg(avro).struct == struct


@pytest.mark.parametrize(
    ("t", "avro"),
    [
        (DateType(), {"type": "int", "logicalType": "date"}),
        (TimeType(), {"type": "long", "logicalType": "time-micros"}),
        (
            TimestampType(),
            {"type": "long", "logicalType": "timestamp-micros", "adjust-to-utc": False},
        ),
        (
            TimestamptzType(),
            {"type": "long", "logicalType": "timestamp-micros", "adjust-to-utc": True},
        ),
        (
            TimestampNanoType(),
            {"type": "long", "logicalType": "timestamp-nanos", "adjust-to-utc": False},
        ),
        (
            TimestamptzNanoType(),
            {"type": "long", "logicalType": "timestamp-nanos", "adjust-to-utc": True},
        ),
        (FixedType(7), {"type": "fixed", "name": "fixed_7", "size": 7}),
        (BinaryType(), "bytes"),
        (UnknownType(), "null"),
    ],
)
def test_logical_types(t: IcebergType, avro: Any) -> None:
    assert type_to_avro(t) == avro


@pytest.mark.parametrize(
    ("precision", "size"), [(1, 1), (2, 1), (3, 2), (9, 4), (10, 5), (18, 8), (19, 9), (38, 16)]
)
def test_decimal_uses_the_minimum_fixed_size(precision: int, size: int) -> None:
    assert decimal_required_bytes(precision) == size
    assert type_to_avro(DecimalType(precision, 0))["size"] == size


def test_names_are_sanitized_like_java_and_keep_the_original() -> None:
    assert sanitize_name("ok_name1") == "ok_name1"
    assert sanitize_name("odd name-1") == "odd_x20name_x2D1"
    assert sanitize_name("1st") == "_1st"
    assert sanitize_name("café") == "café"  # Unicode letters are letters, as in Java
    avro = schema_to_avro(rich_schema(), "table")
    odd = next(f for f in avro["fields"] if f["field-id"] == 140)
    assert odd["name"] == "odd_x20name_x2D1"
    assert odd["iceberg-field-name"] == "odd name-1"


@pytest.mark.interop
@settings(max_examples=examples(200), deadline=None)
@given(st.text(min_size=1, max_size=12))
def test_sanitized_names_match_pyiceberg(name: str) -> None:
    from pyiceberg.schema import make_compatible_name

    assert sanitize_name(name) == make_compatible_name(name)


def test_defaults_become_avro_defaults() -> None:
    struct = StructType(
        NestedField(1, "n", LongType(), True, initial_default=7),
        NestedField(2, "s", StringType(), False, initial_default="x"),
        NestedField(3, "b", BinaryType(), False, initial_default=b"\x00\xff"),
        NestedField(4, "d", DecimalType(9, 2), True, initial_default=Decimal("1.50")),
    )
    avro = schema_to_avro(struct, "r")
    n, s, b, d = avro["fields"]
    assert n["default"] == 7
    assert s["type"] == ["string", "null"] and s["default"] == "x"
    assert b["default"] == "\x00\xff"
    assert d["default"] == "\x00\x00\x00\x96"
    # a reader resolving an older file that lacks the fields fills the defaults in
    buf = io.BytesIO()
    fastavro.writer(buf, {"type": "record", "name": "r", "fields": []}, [{}])
    buf.seek(0)
    (rec,) = fastavro.reader(buf, reader_schema=avro)
    assert (rec["n"], rec["s"]) == (7, "x")


# -- Avro → Iceberg ------------------------------------------------------------------------


def test_reads_foreign_avro_with_namespaces_references_and_string_ids() -> None:
    avro = {
        "type": "record",
        "name": "entry",
        "namespace": "org.example",
        "fields": [
            {"name": "a", "type": {"type": "fixed", "name": "f4", "size": 4}, "field-id": "1"},
            {"name": "b", "type": ["null", "org.example.f4"], "field-id": 2},
            {"name": "c", "type": "f4", "field-id": 3},
            {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["X"]}, "field-id": 4},
            {
                "name": "m",
                "type": {
                    "type": "array",
                    "logicalType": "map",
                    "items": {
                        "type": "record",
                        "name": "kv",
                        "fields": [
                            {"name": "k", "type": "int", "field-id": 6},
                            {"name": "v", "type": ["null", "bytes"], "field-id": 7},
                        ],
                    },
                },
                "field-id": 5,
            },
            {"name": "ts", "type": {"type": "long", "logicalType": "local-timestamp-micros"}},
        ],
    }
    with pytest.raises(ValidationError, match=r"ts.*field-id"):
        avro_to_iceberg(avro)
    avro["fields"][-1]["field-id"] = 8
    conv = avro_to_iceberg(avro)
    assert conv.struct == StructType(
        NestedField(1, "a", FixedType(4), True),
        NestedField(2, "b", FixedType(4), False),
        NestedField(3, "c", FixedType(4), True),
        NestedField(4, "e", StringType(), True),
        NestedField(5, "m", MapType(6, IntegerType(), 7, BinaryType(), False), True),
        NestedField(8, "ts", TimestampType(), True),
    )
    # the Avro names, which key fastavro's dicts, are kept per field id
    assert conv.avro_names[6] == "k" and conv.avro_names[7] == "v"


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"type": "record", "name": "r", "fields": [{"name": "a", "type": "int"}]}, "field-id"),
        (
            {
                "type": "record",
                "name": "r",
                "fields": [{"name": "a", "type": ["int", "string"], "field-id": 1}],
            },
            "unions",
        ),
        (
            {
                "type": "record",
                "name": "r",
                "fields": [{"name": "a", "type": ["null", "r"], "field-id": 1}],
            },
            "recursive",
        ),
        (
            {
                "type": "record",
                "name": "r",
                "fields": [{"name": "a", "type": {"type": "array", "items": "int"}, "field-id": 1}],
            },
            "element-id",
        ),
        (
            {
                "type": "record",
                "name": "r",
                "fields": [
                    {
                        "name": "a",
                        "type": {"type": "long", "logicalType": "timestamp-millis"},
                        "field-id": 1,
                    }
                ],
            },
            "timestamp-millis",
        ),
        (
            {"type": "record", "name": "r", "fields": [{"name": "a", "type": "x", "field-id": 1}]},
            "unknown Avro type name",
        ),
        ('"int"', "record"),
        ("{not json", "JSON"),
    ],
)
def test_bad_avro_schemas_are_rejected_naming_the_field(bad: Any, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        avro_to_iceberg(bad)


# -- hypothesis: any Iceberg type survives the trip ------------------------------------------


@st.composite
def iceberg_structs(draw: st.DrawFn) -> StructType:
    next_id = iter(range(1, 10_000))

    def build(depth: int) -> st.SearchStrategy[IcebergType]:
        prims = st.sampled_from([*PRIMITIVES, FixedType(16), DecimalType(1, 0)])
        if depth >= 3:
            return prims
        return st.one_of(
            prims,
            st.deferred(lambda: struct(depth + 1)),
            st.deferred(lambda: build(depth + 1)).map(
                lambda t: ListType(next(next_id), t, draw(st.booleans()))
            ),
            st.tuples(
                st.sampled_from([StringType(), IntegerType(), UUIDType(), DateType()]),
                st.deferred(lambda: build(depth + 1)),
            ).map(
                lambda kv: MapType(next(next_id), kv[0], next(next_id), kv[1], draw(st.booleans()))
            ),
        )

    def struct(depth: int) -> st.SearchStrategy[StructType]:
        def make(types: list[IcebergType]) -> StructType:
            return StructType(
                *(
                    NestedField(next(next_id), f"f{i}", t, draw(st.booleans()))
                    for i, t in enumerate(types)
                )
            )

        return st.lists(build(depth), max_size=4).map(make)

    return draw(struct(0))


@settings(max_examples=examples(60), deadline=None)
@given(iceberg_structs())
def test_any_struct_round_trips(struct: StructType) -> None:
    avro = schema_to_avro(struct, "table")
    fastavro.parse_schema(avro)
    assert avro_to_iceberg(json.dumps(avro)).struct == struct


# -- values --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("t", "value"),
    [
        (DecimalType(9, 2), Decimal("12.5")),
        (DecimalType(9, 2), Decimal("-0.01")),
        (DecimalType(38, 0), Decimal("9" * 38)),
        (DecimalType(38, 0), Decimal("-" + "9" * 38)),
        (UUIDType(), uuid.UUID("f79c3e09-677c-4bbd-a479-3f349cb785e7")),
        (DateType(), 10_000_000),  # year 29349: beyond datetime.date
        (TimestamptzType(), -(2**62)),
        (TimestamptzNanoType(), 2**62),
        (TimeType(), 86_399_999_999),
        (FixedType(3), b"abc"),
    ],
)
def test_values_round_trip_through_fastavro_and_read_container(
    t: PrimitiveType, value: Any
) -> None:
    struct = StructType(NestedField(1, "v", t, False))
    avro = schema_to_avro(struct, "r")
    encode = avro_encoder(t) or (lambda v: v)
    decode = avro_decoder(t) or (lambda v: v)
    buf = io.BytesIO()
    fastavro.writer(buf, fastavro.parse_schema(avro), [{"v": encode(value)}, {"v": None}])
    records = list(read_container(buf.getvalue(), "mem://v.avro").records())
    assert [decode(r["v"]) for r in records] == [value, None]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (Decimal("1.001"), "digits after the point"),
        (Decimal("12345678"), "more than 9 digits"),
        (Decimal("NaN"), "finite Decimal"),
        (1.5, "finite Decimal"),
    ],
)
def test_decimal_encoder_refuses_rounding(value: Any, message: str) -> None:
    encode = avro_encoder(DecimalType(9, 2))
    assert encode is not None
    with pytest.raises(ValidationError, match=message):
        encode(value)


def test_negative_scale_decimals_have_no_avro_form() -> None:
    with pytest.raises(ValidationError, match="scale"):
        type_to_avro(DecimalType(5, -2))


def test_nested_types_have_no_value_encoder() -> None:
    with pytest.raises(ValidationError, match="nested"):
        avro_encoder(StructType())
    with pytest.raises(ValidationError, match="nested"):
        avro_decoder(ListType(1, IntegerType()))


# -- container files -----------------------------------------------------------------------


def small_file(**meta: str) -> bytes:
    schema = {"type": "record", "name": "r", "fields": [{"name": "a", "type": "long"}]}
    buf = io.BytesIO()
    fastavro.writer(buf, schema, [{"a": i} for i in range(2000)], metadata=meta, codec="deflate")
    return buf.getvalue()


def test_header_metadata_is_read_without_decoding_records() -> None:
    data = small_file(**{"format-version": "2", "snapshot-id": "7"})
    meta, end = read_header(data, "mem://x")
    assert meta["format-version"] == "2" and meta["snapshot-id"] == "7"
    assert meta["avro.codec"] == "deflate"
    assert 0 < end < len(data)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: b"PAR1" + d[4:], "bad magic"),
        (lambda d: d[:10], "header"),
        (lambda d: d[: len(d) - 40], "record"),
        (lambda d: d[:-20] + bytes(20), "record"),
        (lambda d: b"", "bad magic"),
    ],
)
def test_broken_files_raise_invalid_file_error_naming_the_file(mutate: Any, message: str) -> None:
    data = mutate(small_file())
    with pytest.raises(InvalidFileError, match=message) as info:
        list(read_container(data, "s3://bucket/broken.avro").records())
    assert info.value.location == "s3://bucket/broken.avro"


def test_non_bytes_input_is_rejected() -> None:
    with pytest.raises(InvalidFileError, match="bytes"):
        read_header("Obj\x01", "mem://x")  # type: ignore[arg-type]
