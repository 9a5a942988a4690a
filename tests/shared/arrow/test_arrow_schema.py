"""Iceberg <-> Arrow schema mapping, conforming caller data, and id-based projection."""

from __future__ import annotations

import datetime as dt
import uuid
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples
from icefloe.arrow.schema import (
    FIELD_ID_KEY,
    arrow_primitive_to_iceberg,
    arrow_to_schema,
    conform_table,
    field_id_of,
    file_schema_to_arrow,
    from_arrow_array,
    project_table,
    schema_to_arrow,
    to_arrow_array,
    type_to_arrow,
)
from icefloe.errors import SchemaEvolutionError, ValidationError
from icefloe.spec.schema import Schema
from icefloe.spec.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
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

# ---------------------------------------------------------------------------------------
# Type mapping
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("iceberg", "arrow"),
    [
        (BooleanType(), pa.bool_()),
        (IntegerType(), pa.int32()),
        (LongType(), pa.int64()),
        (FloatType(), pa.float32()),
        (DoubleType(), pa.float64()),
        (DecimalType(9, 2), pa.decimal128(9, 2)),
        (DecimalType(38, 10), pa.decimal128(38, 10)),
        (DateType(), pa.date32()),
        (TimeType(), pa.time64("us")),
        (TimestampType(), pa.timestamp("us")),
        (TimestamptzType(), pa.timestamp("us", tz="UTC")),
        (TimestampNanoType(), pa.timestamp("ns")),
        (TimestamptzNanoType(), pa.timestamp("ns", tz="UTC")),
        (StringType(), pa.large_string()),
        (UUIDType(), pa.uuid()),
        (FixedType(7), pa.binary(7)),
        (BinaryType(), pa.large_binary()),
        (UnknownType(), pa.null()),
        (GeometryType(), pa.large_binary()),
    ],
)
def test_primitive_mapping(iceberg: PrimitiveType, arrow: pa.DataType) -> None:
    assert type_to_arrow(iceberg) == arrow
    if not isinstance(iceberg, GeometryType):
        assert arrow_primitive_to_iceberg(arrow) == iceberg


def _nested_schema() -> Schema:
    return Schema(
        NestedField(1, "id", LongType(), required=True, doc="row id"),
        NestedField(
            2,
            "point",
            StructType(
                NestedField(3, "x", DoubleType(), required=True),
                NestedField(4, "y", DoubleType()),
            ),
        ),
        NestedField(5, "tags", ListType(6, StringType(), element_required=False)),
        NestedField(
            7,
            "props",
            MapType(8, StringType(), 9, StructType(NestedField(10, "v", IntegerType())), False),
            required=True,
        ),
    )


def _all_arrow_fields(schema: pa.Schema) -> list[pa.Field]:
    out: list[pa.Field] = []

    def walk(f: pa.Field) -> None:
        out.append(f)
        t = f.type
        if pa.types.is_struct(t):
            for i in range(t.num_fields):
                walk(t.field(i))
        elif pa.types.is_map(t):
            walk(t.key_field)
            walk(t.item_field)
        elif pa.types.is_list(t):
            walk(t.value_field)

    for f in schema:
        walk(f)
    return out


def test_every_arrow_field_carries_its_id_and_nullability() -> None:
    schema = _nested_schema()
    arrow = schema_to_arrow(schema)
    fields = _all_arrow_fields(arrow)
    ids = [field_id_of(f) for f in fields]
    assert ids == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    by_id = {field_id_of(f): f for f in fields}
    for fid, f in by_id.items():
        assert fid is not None
        assert f.nullable == schema.field(fid).optional
        assert f.metadata[FIELD_ID_KEY] == str(fid).encode()
    assert by_id[1].metadata[b"doc"] == b"row id"
    assert arrow.field("tags").type.value_field.name == "element"
    assert arrow.field("props").type.key_field.name == "key"
    assert arrow.field("props").type.item_field.name == "value"


def test_arrow_round_trip_of_nested_schema() -> None:
    schema = _nested_schema()
    assert arrow_to_schema(schema_to_arrow(schema)) == schema
    back = arrow_to_schema(schema_to_arrow(schema))
    assert back.field(1).doc == "row id"


def test_variant_is_a_group_of_binaries_without_ids() -> None:
    schema = Schema(NestedField(1, "v", VariantType()))
    arrow = schema_to_arrow(schema)
    t = arrow.field("v").type
    assert [t.field(i).name for i in range(2)] == ["metadata", "value"]
    assert all(field_id_of(t.field(i)) is None for i in range(2))
    assert arrow_to_schema(arrow) == schema


def test_file_schema_omits_unknown_columns() -> None:
    schema = Schema(
        NestedField(1, "a", IntegerType()),
        NestedField(2, "u", UnknownType()),
        NestedField(3, "s", StructType(NestedField(4, "n", UnknownType()))),
    )
    assert schema_to_arrow(schema).names == ["a", "u", "s"]
    file_schema = file_schema_to_arrow(schema)
    assert file_schema.names == ["a", "s"]
    assert file_schema.field("s").type.num_fields == 0


def test_missing_field_id_names_the_nested_column() -> None:
    arrow = pa.schema(
        [
            pa.field("a", pa.int32(), metadata={FIELD_ID_KEY: b"1"}),
            pa.field(
                "s",
                pa.struct([pa.field("inner", pa.int64())]),
                metadata={FIELD_ID_KEY: b"2"},
            ),
        ]
    )
    with pytest.raises(ValidationError, match=r"'s\.inner'"):
        arrow_to_schema(arrow)


def test_unsupported_arrow_type_names_the_column() -> None:
    arrow = pa.schema([pa.field("big", pa.uint64(), metadata={FIELD_ID_KEY: b"1"})])
    with pytest.raises(ValidationError, match="'big'"):
        arrow_to_schema(arrow)


@pytest.mark.parametrize(
    ("arrow", "iceberg"),
    [
        (pa.int8(), IntegerType()),
        (pa.uint16(), IntegerType()),
        (pa.uint32(), LongType()),
        (pa.string(), StringType()),
        (pa.string_view(), StringType()),
        (pa.binary(), BinaryType()),
        (pa.timestamp("ms"), TimestampType()),
        (pa.timestamp("s", tz="+00:00"), TimestamptzType()),
        (pa.time32("ms"), TimeType()),
        (pa.dictionary(pa.int32(), pa.string()), StringType()),
        (pa.binary(16), FixedType(16)),
    ],
)
def test_foreign_arrow_widths_read_as_the_holding_iceberg_type(
    arrow: pa.DataType, iceberg: IcebergType
) -> None:
    assert arrow_primitive_to_iceberg(arrow) == iceberg


# -- hypothesis: random schemas survive Iceberg -> Arrow -> Iceberg ----------------------

_PRIMITIVES = st.sampled_from(
    [
        BooleanType(),
        IntegerType(),
        LongType(),
        FloatType(),
        DoubleType(),
        DecimalType(10, 3),
        DecimalType(38, 0),
        DateType(),
        TimeType(),
        TimestampType(),
        TimestamptzType(),
        TimestampNanoType(),
        TimestamptzNanoType(),
        StringType(),
        UUIDType(),
        FixedType(3),
        BinaryType(),
    ]
)


class _Ids:
    def __init__(self) -> None:
        self.next = 1

    def take(self) -> int:
        self.next += 1
        return self.next - 1


@st.composite
def _types(draw: st.DrawFn, ids: _Ids, depth: int) -> IcebergType:
    kind = draw(
        st.sampled_from(["p", "p", "p", "struct", "list", "map"]) if depth < 3 else st.just("p")
    )
    if kind == "p":
        return draw(_PRIMITIVES)
    if kind == "struct":
        n = draw(st.integers(0, 3))
        return StructType(*(draw(_fields(ids, depth + 1, f"f{i}")) for i in range(n)))
    if kind == "list":
        eid = ids.take()
        return ListType(eid, draw(_types(ids, depth + 1)), draw(st.booleans()))
    kid, vid = ids.take(), ids.take()
    return MapType(kid, draw(_PRIMITIVES), vid, draw(_types(ids, depth + 1)), draw(st.booleans()))


@st.composite
def _fields(draw: st.DrawFn, ids: _Ids, depth: int, name: str) -> NestedField:
    fid = ids.take()
    return NestedField(fid, name, draw(_types(ids, depth)), draw(st.booleans()))


@st.composite
def _schemas(draw: st.DrawFn) -> Schema:
    ids = _Ids()
    n = draw(st.integers(1, 5))
    return Schema(*(draw(_fields(ids, 0, f"c{i}")) for i in range(n)))


@settings(max_examples=examples(60), deadline=None)
@given(_schemas())
def test_random_schemas_round_trip_through_arrow(schema: Schema) -> None:
    arrow = schema_to_arrow(schema)
    assert arrow_to_schema(arrow) == schema
    assert all(field_id_of(f) is not None for f in _all_arrow_fields(arrow))


# ---------------------------------------------------------------------------------------
# Internal values <-> Arrow arrays
# ---------------------------------------------------------------------------------------

_VALUE_CASES: list[tuple[PrimitiveType, st.SearchStrategy[Any]]] = [
    (BooleanType(), st.booleans()),
    (IntegerType(), st.integers(-(2**31), 2**31 - 1)),
    (LongType(), st.integers(-(2**63), 2**63 - 1)),
    (DoubleType(), st.floats(allow_nan=False)),
    (DecimalType(9, 2), st.decimals(Decimal("-9999999.99"), Decimal("9999999.99"), places=2)),
    (DateType(), st.integers(-(2**31), 2**31 - 1)),
    (TimeType(), st.integers(0, 86_400_000_000 - 1)),
    (TimestampType(), st.integers(-(2**63), 2**63 - 1)),
    (TimestamptzNanoType(), st.integers(-(2**63), 2**63 - 1)),
    (StringType(), st.text()),
    (UUIDType(), st.uuids()),
    (FixedType(4), st.binary(min_size=4, max_size=4)),
    (BinaryType(), st.binary()),
]


@pytest.mark.parametrize(("t", "values"), _VALUE_CASES, ids=lambda v: str(v))
@settings(max_examples=examples(25), deadline=None)
@given(data=st.data())
def test_internal_values_round_trip_through_arrow(
    t: PrimitiveType, values: st.SearchStrategy[Any], data: st.DataObject
) -> None:
    items = data.draw(st.lists(st.none() | values, max_size=8))
    arr = to_arrow_array(t, items)
    assert arr.type == type_to_arrow(t)
    assert from_arrow_array(t, arr) == items


def test_nested_values_to_arrow() -> None:
    t = MapType(1, StringType(), 2, ListType(3, IntegerType(), False), False)
    arr = to_arrow_array(t, [{"a": [1, None]}, None, {}])
    assert arr.to_pylist() == [[("a", [1, None])], None, []]
    s = StructType(NestedField(4, "x", IntegerType()), NestedField(5, "y", StringType()))
    assert to_arrow_array(s, [{4: 1, 5: "a"}, None]).to_pylist() == [{"x": 1, "y": "a"}, None]


# ---------------------------------------------------------------------------------------
# Reader side: projection by field id
# ---------------------------------------------------------------------------------------


def _file_table(schema: Schema, columns: dict[str, Any]) -> pa.Table:
    arrow = schema_to_arrow(schema)
    return pa.Table.from_arrays([pa.array(columns[f.name], f.type) for f in arrow], schema=arrow)


def test_spec_projection_example_rename_reorder_add() -> None:
    # Spec: file `1: a int, 2: b string, 3: c double` read as `3: measurement, 2: name, 4: a`.
    file_schema = Schema(
        NestedField(1, "a", IntegerType()),
        NestedField(2, "b", StringType()),
        NestedField(3, "c", DoubleType()),
    )
    data = _file_table(file_schema, {"a": [1, 2], "b": ["x", None], "c": [0.5, 1.5]})
    read = Schema(
        NestedField(3, "measurement", DoubleType()),
        NestedField(2, "name", StringType()),
        NestedField(4, "a", IntegerType()),
    )
    out = project_table(data, file_schema, read)
    assert out.column_names == ["measurement", "name", "a"]
    assert out.to_pylist() == [
        {"measurement": 0.5, "name": "x", "a": None},
        {"measurement": 1.5, "name": None, "a": None},
    ]
    assert [field_id_of(f) for f in out.schema] == [3, 2, 4]


def test_added_columns_take_initial_default_or_constant() -> None:
    file_schema = Schema(NestedField(1, "id", LongType(), required=True))
    data = _file_table(file_schema, {"id": [1, 2, 3]})
    read = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "level", IntegerType(), required=True, initial_default=7, write_default=7),
        NestedField(3, "day", DateType(), initial_default=19000),
        NestedField(4, "region", StringType()),
        NestedField(
            5,
            "point",
            StructType(
                NestedField(6, "x", DoubleType(), initial_default=0.0),
                NestedField(7, "y", DoubleType()),
            ),
            initial_default={},
        ),
        NestedField(8, "absent", StructType(NestedField(9, "z", IntegerType()))),
    )
    out = project_table(data, file_schema, read, constants={4: "eu"})
    row = out.to_pylist()[0]
    assert row == {
        "id": 1,
        "level": 7,
        "day": dt.date(2022, 1, 8),
        "region": "eu",
        "point": {"x": 0.0, "y": None},
        "absent": None,
    }
    assert out.num_rows == 3
    assert out.column("level").to_pylist() == [7, 7, 7]


def test_required_column_missing_without_default_is_an_error() -> None:
    file_schema = Schema(NestedField(1, "id", LongType(), required=True))
    data = _file_table(file_schema, {"id": [1]})
    read = Schema(NestedField(1, "id", LongType()), NestedField(2, "must", IntegerType(), True))
    with pytest.raises(SchemaEvolutionError, match="'must'"):
        project_table(data, file_schema, read)


def test_type_promotions() -> None:
    file_schema = Schema(
        NestedField(1, "i", IntegerType()),
        NestedField(2, "f", FloatType()),
        NestedField(3, "d", DecimalType(5, 2)),
        NestedField(4, "day", DateType()),
        NestedField(5, "day_ns", DateType()),
    )
    data = _file_table(
        file_schema,
        {
            "i": [1, None, -(2**31)],
            "f": [1.5, None, -0.0],
            "d": [Decimal("123.45"), None, Decimal("-0.01")],
            "day": [0, None, 19000],
            "day_ns": [1, None, -1],
        },
    )
    read = Schema(
        NestedField(1, "i", LongType()),
        NestedField(2, "f", DoubleType()),
        NestedField(3, "d", DecimalType(20, 2)),
        NestedField(4, "day", TimestampType()),
        NestedField(5, "day_ns", TimestampNanoType()),
    )
    out = project_table(data, file_schema, read)
    assert out.schema.field("i").type == pa.int64()
    assert out.column("i").to_pylist() == [1, None, -(2**31)]
    assert out.column("f").to_pylist() == [1.5, None, -0.0]
    assert out.column("d").type == pa.decimal128(20, 2)
    assert out.column("d").to_pylist() == [Decimal("123.45"), None, Decimal("-0.01")]
    assert from_arrow_array(TimestampType(), out.column("day")) == [
        0,
        None,
        19000 * 86_400_000_000,
    ]
    assert from_arrow_array(TimestampNanoType(), out.column("day_ns")) == [
        86_400_000_000_000,
        None,
        -86_400_000_000_000,
    ]


def test_date_to_timestamp_ns_overflow_fails_at_runtime() -> None:
    file_schema = Schema(NestedField(1, "d", DateType()))
    data = _file_table(file_schema, {"d": [200_000]})  # year ~2517: beyond int64 nanos
    read = Schema(NestedField(1, "d", TimestampNanoType()))
    with pytest.raises(ValidationError, match="'d'"):
        project_table(data, file_schema, read)


@pytest.mark.parametrize(
    ("file_type", "read_type"),
    [
        (LongType(), IntegerType()),
        (StringType(), LongType()),
        (DoubleType(), FloatType()),
        (DecimalType(10, 2), DecimalType(10, 3)),
        (DateType(), TimestamptzType()),
        (StructType(NestedField(9, "x", IntegerType())), ListType(9, IntegerType())),
        (IntegerType(), StructType(NestedField(9, "x", IntegerType()))),
    ],
)
def test_disallowed_promotions_name_the_column(
    file_type: IcebergType, read_type: IcebergType
) -> None:
    file_schema = Schema(NestedField(1, "col", file_type))
    data = pa.Table.from_arrays(
        [pa.nulls(2, type_to_arrow(file_type))], schema=schema_to_arrow(file_schema)
    )
    with pytest.raises(SchemaEvolutionError, match="'col'"):
        project_table(data, file_schema, Schema(NestedField(1, "col", read_type)))


def test_nested_projection_with_nulls_slices_and_chunks() -> None:
    file_schema = Schema(
        NestedField(
            1,
            "s",
            StructType(
                NestedField(2, "a", IntegerType()),
                NestedField(3, "drop_me", StringType()),
            ),
        ),
        NestedField(4, "l", ListType(5, IntegerType(), element_required=False)),
        NestedField(6, "m", MapType(7, StringType(), 8, FloatType(), value_required=False)),
    )
    arrow = schema_to_arrow(file_schema)
    s_vals = [{"a": 1, "drop_me": "x"}, None, {"a": None, "drop_me": "y"}, {"a": 4, "drop_me": "z"}]
    l_vals = [[1, None], None, [], [3]]
    m_vals = [[("k", 1.5)], None, [], [("j", None), ("i", 2.0)]]
    full = pa.Table.from_arrays(
        [
            pa.array(s_vals, arrow.field("s").type),
            pa.array(l_vals, arrow.field("l").type),
            pa.array(m_vals, arrow.field("m").type),
        ],
        schema=arrow,
    )
    # Two chunks, the second one a slice with a non-zero offset.
    data = pa.concat_tables([full.slice(0, 1), full.slice(1)])
    read = Schema(
        NestedField(
            1,
            "renamed",
            StructType(
                NestedField(10, "new", StringType()),
                NestedField(2, "a_long", LongType()),
            ),
        ),
        NestedField(4, "l", ListType(5, LongType(), element_required=False)),
        NestedField(6, "m", MapType(7, StringType(), 8, DoubleType(), value_required=False)),
    )
    out = project_table(data, file_schema, read)
    assert out.column("renamed").to_pylist() == [
        {"new": None, "a_long": 1},
        None,
        {"new": None, "a_long": None},
        {"new": None, "a_long": 4},
    ]
    assert out.column("l").to_pylist() == l_vals
    assert out.column("l").type.value_type == pa.int64()
    assert out.column("m").to_pylist() == m_vals
    assert out.schema.field("m").type.item_field.type == pa.float64()
    assert field_id_of(out.schema.field("renamed").type.field(1)) == 2


def test_unknown_read_column_is_null_and_fixed16_reads_as_uuid() -> None:
    u = uuid.uuid4()
    file_schema = Schema(NestedField(1, "u", FixedType(16)), NestedField(2, "z", IntegerType()))
    data = _file_table(file_schema, {"u": [u.bytes, None], "z": [1, 2]})
    read = Schema(NestedField(1, "u", UUIDType()), NestedField(2, "z", UnknownType()))
    out = project_table(data, file_schema, read)
    assert out.column("u").to_pylist() == [u, None]
    assert out.column("z").type == pa.null()
    assert out.column("z").null_count == 2


def test_projection_by_name_when_arrow_data_has_no_ids() -> None:
    file_schema = Schema(NestedField(1, "a", IntegerType()), NestedField(2, "b", StringType()))
    data = pa.table({"b": ["x"], "a": pa.array([5], pa.int32())})
    read = Schema(NestedField(2, "bee", StringType()), NestedField(1, "a", LongType()))
    assert project_table(data, file_schema, read).to_pylist() == [{"bee": "x", "a": 5}]


def test_projection_derives_the_file_schema_from_field_ids() -> None:
    file_schema = Schema(NestedField(1, "a", IntegerType()))
    data = _file_table(file_schema, {"a": [1, 2]})
    out = project_table(data, None, Schema(NestedField(1, "alpha", LongType())))
    assert out.to_pylist() == [{"alpha": 1}, {"alpha": 2}]


def test_projection_of_empty_table_keeps_the_read_schema() -> None:
    file_schema = Schema(NestedField(1, "a", IntegerType()))
    data = schema_to_arrow(file_schema).empty_table()
    read = Schema(NestedField(1, "a", LongType()), NestedField(2, "b", StringType()))
    out = project_table(data, file_schema, read)
    assert out.num_rows == 0
    assert out.schema == schema_to_arrow(read)


# ---------------------------------------------------------------------------------------
# Writer side: conforming caller data
# ---------------------------------------------------------------------------------------


def test_conform_matches_by_name_casts_and_fills_write_defaults() -> None:
    schema = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "name", StringType()),
        NestedField(3, "score", IntegerType(), required=True, initial_default=0, write_default=5),
        NestedField(
            4, "pt", StructType(NestedField(5, "x", FloatType()), NestedField(6, "y", FloatType()))
        ),
        NestedField(7, "u", UUIDType()),
    )
    u = uuid.uuid4()
    data = pa.table(
        {
            "pt": pa.array([{"y": 2.0}, None]),
            "name": pa.array(["a", None], pa.string()),
            "id": pa.array([1, 2], pa.int32()),
            "u": pa.array([u.bytes, None], pa.binary(16)),
        }
    )
    out = conform_table(data, schema)
    assert out.schema == file_schema_to_arrow(schema)
    assert out.to_pylist() == [
        {"id": 1, "name": "a", "score": 5, "pt": {"x": None, "y": 2.0}, "u": u},
        {"id": 2, "name": None, "score": 5, "pt": None, "u": None},
    ]


def test_conform_rejects_nulls_in_required_columns_only_under_valid_parents() -> None:
    schema = Schema(
        NestedField(1, "s", StructType(NestedField(2, "req", IntegerType(), required=True))),
        NestedField(3, "l", ListType(4, IntegerType(), element_required=True)),
    )
    ok = pa.table({"s": pa.array([{"req": 1}, None]), "l": pa.array([[1], None])})
    assert conform_table(ok, schema).num_rows == 2
    bad_child = pa.table({"s": pa.array([{"req": None}]), "l": pa.array([[1]])})
    with pytest.raises(ValidationError, match=r"'s\.req' is required"):
        conform_table(bad_child, schema)
    bad_element = pa.table({"s": pa.array([{"req": 1}]), "l": pa.array([[1, None]])})
    with pytest.raises(ValidationError, match=r"'l\.element' is required"):
        conform_table(bad_element, schema)


def test_conform_errors_name_the_column() -> None:
    schema = Schema(
        NestedField(1, "i", IntegerType()),
        NestedField(2, "ts", TimestamptzType()),
        NestedField(3, "req", StringType(), required=True),
    )
    with pytest.raises(ValidationError, match=r"\['extra'\]"):
        conform_table(pa.table({"req": ["a"], "extra": [1]}), schema)
    with pytest.raises(ValidationError, match="'i'"):
        conform_table(pa.table({"req": ["a"], "i": pa.array([2**40])}), schema)
    with pytest.raises(ValidationError, match="'ts'"):
        conform_table(pa.table({"req": ["a"], "ts": pa.array([1], pa.timestamp("us"))}), schema)
    with pytest.raises(ValidationError, match="'i'"):
        conform_table(pa.table({"req": ["a"], "i": ["text"]}), schema)
    with pytest.raises(ValidationError, match="'req'"):
        conform_table(pa.table({"i": pa.array([1], pa.int32())}), schema)


def test_conform_rejects_sub_microsecond_precision_loss() -> None:
    schema = Schema(NestedField(1, "ts", TimestampType()))
    with pytest.raises(ValidationError, match="'ts'"):
        conform_table(pa.table({"ts": pa.array([1], pa.timestamp("ns"))}), schema)
    exact = conform_table(pa.table({"ts": pa.array([1000], pa.timestamp("ns"))}), schema)
    assert from_arrow_array(TimestampType(), exact.column("ts")) == [1]


def test_conform_drops_unknown_columns_and_accepts_null_typed_columns() -> None:
    schema = Schema(NestedField(1, "a", StringType()), NestedField(2, "u", UnknownType()))
    out = conform_table(pa.table({"a": [None, None], "u": [None, None]}), schema)
    assert out.column_names == ["a"]
    assert out.schema.field("a").type == pa.large_string()
    with pytest.raises(ValidationError, match="'u'"):
        conform_table(pa.table({"a": ["x"], "u": [1]}), schema)
