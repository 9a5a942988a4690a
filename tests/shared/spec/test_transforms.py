"""Tests for icefloe.spec.transforms: Appendix B hashes, spec examples, scalar/vector agreement."""

from __future__ import annotations

import datetime as dt
import re
import uuid
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples
from icefloe.errors import ValidationError
from icefloe.spec.schema import Schema
from icefloe.spec.transforms import (
    INT32_MAX,
    BucketTransform,
    DayTransform,
    HourTransform,
    IdentityTransform,
    MonthTransform,
    Transform,
    TruncateTransform,
    UnknownTransform,
    VoidTransform,
    YearTransform,
    bind_source,
    civil_from_days,
    hash_value,
    parse_transform,
    source_ids_from_json,
)
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
    NestedField,
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

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
EPOCH_DATE = dt.date(1970, 1, 1)


def micros(value: dt.datetime) -> int:
    """Independent oracle: micros since the epoch via datetime arithmetic."""
    aware = value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)
    delta = aware - EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def days(value: dt.date) -> int:
    return (value - EPOCH_DATE).days


PST = dt.timezone(dt.timedelta(hours=-8))

# --------------------------------------------------------------------------------------
# Appendix B: every listed test value
# --------------------------------------------------------------------------------------

APPENDIX_B: list[tuple[IcebergType, Any, int]] = [
    (IntegerType(), 34, 2017239379),
    (LongType(), 34, 2017239379),
    (DecimalType(9, 2), Decimal("14.20"), -500754589),
    (DateType(), days(dt.date(2017, 11, 16)), -653330422),
    (TimeType(), (22 * 3600 + 31 * 60 + 8) * 1_000_000, -662762989),
    (TimestampType(), micros(dt.datetime(2017, 11, 16, 22, 31, 8)), -2047944441),
    (TimestampType(), micros(dt.datetime(2017, 11, 16, 22, 31, 8, 1)), -1207196810),
    (TimestamptzType(), micros(dt.datetime(2017, 11, 16, 14, 31, 8, tzinfo=PST)), -2047944441),
    (
        TimestamptzType(),
        micros(dt.datetime(2017, 11, 16, 14, 31, 8, 1, tzinfo=PST)),
        -1207196810,
    ),
    (TimestampNanoType(), micros(dt.datetime(2017, 11, 16, 22, 31, 8)) * 1000, -2047944441),
    (
        TimestampNanoType(),
        micros(dt.datetime(2017, 11, 16, 22, 31, 8, 1)) * 1000 + 1,
        -1207196810,
    ),
    (
        TimestamptzNanoType(),
        micros(dt.datetime(2017, 11, 16, 14, 31, 8, tzinfo=PST)) * 1000,
        -2047944441,
    ),
    (
        TimestamptzNanoType(),
        micros(dt.datetime(2017, 11, 16, 14, 31, 8, 1, tzinfo=PST)) * 1000 + 1,
        -1207196810,
    ),
    (StringType(), "iceberg", 1210000089),
    (UUIDType(), uuid.UUID("f79c3e09-677c-4bbd-a479-3f349cb785e7"), 1488055340),
    (FixedType(4), bytes([0, 1, 2, 3]), -188683207),
    (BinaryType(), bytes([0, 1, 2, 3]), -188683207),
]

# Appendix B's table of types that are hashed but not bucketed.
APPENDIX_B_NOT_BUCKETED: list[tuple[IcebergType, Any, int]] = [
    (BooleanType(), True, 1392991556),
    (FloatType(), 1.0, -142385009),
    (FloatType(), 0.0, 1669671676),
    (FloatType(), -0.0, 1669671676),
    (DoubleType(), 1.0, -142385009),
    (DoubleType(), 0.0, 1669671676),
    (DoubleType(), -0.0, 1669671676),
]


def arrow_type(t: IcebergType) -> pa.DataType:
    """The natural Arrow type of an Iceberg primitive, as writers hand them to transforms."""
    simple: dict[type, pa.DataType] = {
        BooleanType: pa.bool_(),
        IntegerType: pa.int32(),
        LongType: pa.int64(),
        FloatType: pa.float32(),
        DoubleType: pa.float64(),
        DateType: pa.date32(),
        TimeType: pa.time64("us"),
        TimestampType: pa.timestamp("us"),
        TimestamptzType: pa.timestamp("us", tz="UTC"),
        TimestampNanoType: pa.timestamp("ns"),
        TimestamptzNanoType: pa.timestamp("ns", tz="UTC"),
        StringType: pa.string(),
        BinaryType: pa.binary(),
        UUIDType: pa.binary(16),
    }
    if isinstance(t, DecimalType):
        return pa.decimal128(t.precision, t.scale)
    if isinstance(t, FixedType):
        return pa.binary(t.length)
    return simple[type(t)]


def to_arrow(t: IcebergType, values: list[Any]) -> pa.Array:
    if isinstance(t, UUIDType):
        values = [None if v is None else v.bytes for v in values]
    return pa.array(values, type=arrow_type(t))


def from_arrow(t: IcebergType, arr: pa.Array) -> list[Any]:
    """Arrow results back to the internal representation (dates/timestamps as ints)."""
    if pa.types.is_date32(arr.type):
        return arr.view(pa.int32()).to_pylist()
    if pa.types.is_timestamp(arr.type) or pa.types.is_time64(arr.type):
        return arr.view(pa.int64()).to_pylist()
    out = arr.to_pylist()
    if isinstance(t, UUIDType):
        return [None if v is None else uuid.UUID(bytes=v) for v in out]
    return out


@pytest.mark.parametrize(("source", "value", "expected"), APPENDIX_B + APPENDIX_B_NOT_BUCKETED)
def test_appendix_b_hash(source: IcebergType, value: Any, expected: int) -> None:
    assert hash_value(source, value) == expected


@pytest.mark.parametrize(("source", "value", "expected"), APPENDIX_B)
def test_appendix_b_bucket_scalar_and_vector(
    source: IcebergType, value: Any, expected: int
) -> None:
    # With N = Integer.MAX_VALUE the bucket exposes the hash with its sign bit cleared, so
    # the vectorized murmur3 is checked against the spec's numbers too.
    bucket = BucketTransform(INT32_MAX)
    want = (expected & INT32_MAX) % INT32_MAX
    assert bucket.apply(source, value) == want
    assert bucket.apply_array(source, to_arrow(source, [value, None])).to_pylist() == [want, None]


def test_float_nan_hashes_canonically() -> None:
    assert hash_value(DoubleType(), float("nan")) == hash_value(DoubleType(), -float("nan"))


def test_int_and_long_buckets_agree_for_promotion() -> None:
    b = BucketTransform(100)
    for v in (0, 1, -1, 34, 2**31 - 1, -(2**31)):
        assert b.apply(IntegerType(), v) == b.apply(LongType(), v)


def test_decimal_hash_ignores_storage_padding_and_scale_representation() -> None:
    # 14.2 given without its trailing zero is the same decimal(9,2) value as 14.20.
    assert hash_value(DecimalType(9, 2), Decimal("14.2")) == -500754589
    with pytest.raises(ValidationError, match="more fractional digits"):
        hash_value(DecimalType(9, 2), Decimal("14.205"))


def test_hash_rejects_wrong_python_type() -> None:
    with pytest.raises(ValidationError, match="must be an int"):
        hash_value(LongType(), "34")
    with pytest.raises(ValidationError, match="no 32-bit hash"):
        hash_value(VariantType(), b"x")


# --------------------------------------------------------------------------------------
# Which transforms apply to which types (spec: "Partition Transforms" table)
# --------------------------------------------------------------------------------------

ALL_PRIMITIVES: list[IcebergType] = [
    BooleanType(),
    IntegerType(),
    LongType(),
    FloatType(),
    DoubleType(),
    DecimalType(9, 2),
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
    UnknownType(),
    VariantType(),
    GeometryType(),
    GeographyType(),
]
TIMESTAMPS = {"timestamp", "timestamptz", "timestamp_ns", "timestamptz_ns"}
SPEC_SOURCES: dict[str, set[str]] = {
    "identity": {str(t) for t in ALL_PRIMITIVES} - {"geometry", "geography", "variant"},
    "bucket[16]": {"int", "long", "decimal(9,2)", "date", "time", "string", "uuid", "fixed[3]"}
    | {"binary"}
    | TIMESTAMPS,
    "truncate[4]": {"int", "long", "decimal(9,2)", "string", "binary"},
    "year": {"date"} | TIMESTAMPS,
    "month": {"date"} | TIMESTAMPS,
    "day": {"date"} | TIMESTAMPS,
    "hour": set(TIMESTAMPS),
    "void": {str(t) for t in ALL_PRIMITIVES},
}


@pytest.mark.parametrize("name", sorted(SPEC_SOURCES))
def test_can_transform_matches_spec_table(name: str) -> None:
    t = parse_transform(name)
    accepted = {str(s) for s in ALL_PRIMITIVES if t.can_transform(s)}
    assert accepted == SPEC_SOURCES[name]


@pytest.mark.parametrize("name", sorted(SPEC_SOURCES))
def test_wrong_source_type_is_a_clear_error(name: str) -> None:
    t = parse_transform(name)
    for source in ALL_PRIMITIVES:
        if t.can_transform(source):
            continue
        with pytest.raises(ValidationError, match=f"{re.escape(str(t))}.*{re.escape(str(source))}"):
            t.result_type(source)
        with pytest.raises(ValidationError, match=f"{re.escape(str(t))}.*{re.escape(str(source))}"):
            t.apply(source, 1)


def test_result_types() -> None:
    assert IdentityTransform().result_type(StringType()) == StringType()
    assert BucketTransform(8).result_type(StringType()) == IntegerType()
    assert TruncateTransform(3).result_type(DecimalType(9, 2)) == DecimalType(9, 2)
    for t in (YearTransform(), MonthTransform(), HourTransform()):
        assert t.result_type(TimestampType()) == IntegerType()
    assert DayTransform().result_type(TimestamptzNanoType()) == DateType()
    assert VoidTransform().result_type(DoubleType()) == DoubleType()
    list_type = ListType(3, IntegerType())
    assert VoidTransform().can_transform(list_type)
    assert not IdentityTransform().can_transform(list_type)
    assert UnknownTransform("zorder").result_type(LongType()) == StringType()


# --------------------------------------------------------------------------------------
# Names, parsing, value semantics
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("identity", IdentityTransform()),
        ("void", VoidTransform()),
        ("year", YearTransform()),
        ("month", MonthTransform()),
        ("day", DayTransform()),
        ("hour", HourTransform()),
        ("bucket[16]", BucketTransform(16)),
        ("truncate[10]", TruncateTransform(10)),
        ("  bucket [ 16 ] ", BucketTransform(16)),
        ("Truncate[ 3]", TruncateTransform(3)),
        (" DAY ", DayTransform()),
    ],
)
def test_parse_transform(text: str, expected: Transform) -> None:
    parsed = parse_transform(text)
    assert parsed == expected
    assert parse_transform(str(parsed)) == parsed
    assert str(parsed) == text.strip().lower().replace(" ", "")


def test_unknown_transform_names_round_trip() -> None:
    for text in ("zorder", "bucket[x]", "geo_hash[5]", "truncate[]"):
        t = parse_transform(text)
        assert isinstance(t, UnknownTransform)
        assert t.is_unknown
        assert str(t) == text


@pytest.mark.parametrize("text", ["bucket[0]", "truncate[0]", "bucket[99999999999]"])
def test_invalid_parameters_are_errors_not_unknown(text: str) -> None:
    with pytest.raises(ValidationError):
        parse_transform(text)


def test_parse_transform_rejects_non_strings() -> None:
    with pytest.raises(ValidationError, match="JSON string"):
        parse_transform(16)  # type: ignore[arg-type]


def test_transforms_are_hashable_values() -> None:
    assert {BucketTransform(16), parse_transform("bucket[16]"), BucketTransform(8)} == {
        BucketTransform(16),
        BucketTransform(8),
    }
    assert IdentityTransform() != VoidTransform()
    assert YearTransform() != MonthTransform()
    assert BucketTransform(4) != TruncateTransform(4)
    assert UnknownTransform("a") == UnknownTransform("a") != UnknownTransform("b")
    assert repr(BucketTransform(4)) == "BucketTransform(num_buckets=4)"
    assert repr(DayTransform()) == "DayTransform()"


def test_order_properties() -> None:
    assert IdentityTransform().preserves_order
    assert TruncateTransform(3).preserves_order
    assert all(t.preserves_order for t in (YearTransform(), MonthTransform(), DayTransform()))
    assert HourTransform().preserves_order
    assert not BucketTransform(3).preserves_order
    assert not VoidTransform().preserves_order
    assert not UnknownTransform("z").preserves_order

    assert HourTransform().satisfies_order_of(DayTransform())
    assert HourTransform().satisfies_order_of(YearTransform())
    assert DayTransform().satisfies_order_of(MonthTransform())
    assert not DayTransform().satisfies_order_of(HourTransform())
    assert not YearTransform().satisfies_order_of(MonthTransform())
    assert IdentityTransform().satisfies_order_of(TruncateTransform(5))
    assert IdentityTransform().satisfies_order_of(DayTransform())
    assert not IdentityTransform().satisfies_order_of(BucketTransform(5))
    assert TruncateTransform(5).satisfies_order_of(TruncateTransform(5))
    assert not TruncateTransform(5).satisfies_order_of(IdentityTransform())
    assert not BucketTransform(5).satisfies_order_of(BucketTransform(5))
    assert DayTransform().dedup_name == HourTransform().dedup_name == "time"
    assert BucketTransform(5).dedup_name == "bucket[5]"


# --------------------------------------------------------------------------------------
# Spec examples for each transform
# --------------------------------------------------------------------------------------


def test_truncate_spec_examples() -> None:
    t10 = TruncateTransform(10)
    assert t10.apply(IntegerType(), 1) == 0
    assert t10.apply(IntegerType(), -1) == -10
    assert t10.apply(LongType(), 1) == 0
    assert t10.apply(LongType(), -1) == -10
    assert TruncateTransform(50).apply(DecimalType(9, 2), Decimal("10.65")) == Decimal("10.50")
    assert str(TruncateTransform(50).apply(DecimalType(9, 2), Decimal("10.65"))) == "10.50"
    assert TruncateTransform(3).apply(StringType(), "iceberg") == "ice"
    assert TruncateTransform(3).apply(BinaryType(), b"\x01\x02\x03\x04\x05") == b"\x01\x02\x03"


def test_truncate_strings_by_code_point() -> None:
    value = "a😀é漢字"
    assert TruncateTransform(3).apply(StringType(), value) == "a😀é"
    arr = pa.array([value, None, "", "ab"])
    assert TruncateTransform(3).apply_array(StringType(), arr).to_pylist() == [
        "a😀é",
        None,
        "",
        "ab",
    ]


def test_truncate_overflow_is_an_error_both_ways() -> None:
    t = TruncateTransform(10)
    with pytest.raises(ValidationError, match="outside"):
        t.apply(IntegerType(), -(2**31))
    with pytest.raises(ValidationError, match="overflow"):
        t.apply_array(IntegerType(), pa.array([-(2**31)], pa.int32()))
    with pytest.raises(ValidationError, match="precision"):
        t.apply(DecimalType(3, 0), Decimal("-999"))


def test_time_transform_examples() -> None:
    may_13 = days(dt.date(2018, 5, 13))
    assert YearTransform().apply(DateType(), may_13) == 48  # expressions spec example
    ts = micros(dt.datetime(2017, 11, 16, 17, 10, 34))
    assert YearTransform().apply(TimestampType(), ts) == 47
    assert MonthTransform().apply(TimestampType(), ts) == 47 * 12 + 10
    assert DayTransform().apply(TimestampType(), ts) == days(dt.date(2017, 11, 16))
    assert HourTransform().apply(TimestampType(), ts) == days(dt.date(2017, 11, 16)) * 24 + 17
    assert HourTransform().apply(TimestampNanoType(), ts * 1000 + 999) == (
        days(dt.date(2017, 11, 16)) * 24 + 17
    )


def test_time_transforms_floor_before_1970() -> None:
    for source, one_unit in ((TimestampType(), 1), (TimestamptzNanoType(), 1)):
        assert YearTransform().apply(source, -one_unit) == -1
        assert MonthTransform().apply(source, -one_unit) == -1
        assert DayTransform().apply(source, -one_unit) == -1
        assert HourTransform().apply(source, -one_unit) == -1
        arr = pa.array([-1, 0, None], arrow_type(source))
        assert HourTransform().apply_array(source, arr).to_pylist() == [-1, 0, None]
        assert YearTransform().apply_array(source, arr).to_pylist() == [-1, 0, None]
    assert MonthTransform().apply(DateType(), -1) == -1
    assert YearTransform().apply(DateType(), -365) == -1
    assert YearTransform().apply(DateType(), -366) == -2  # 1968 was a leap year


def test_day_transform_arrays_are_dates() -> None:
    out = DayTransform().apply_array(TimestampType(), pa.array([0, -1], pa.timestamp("us")))
    assert out.type == pa.date32()
    assert out.to_pylist() == [dt.date(1970, 1, 1), dt.date(1969, 12, 31)]


def test_hour_overflow_is_an_error_both_ways() -> None:
    far = 2**63 - 1  # ~292,000 years of micros: more hours than an int holds
    with pytest.raises(ValidationError, match="int range"):
        HourTransform().apply(TimestampType(), far)
    with pytest.raises(ValidationError, match="int range"):
        HourTransform().apply_array(TimestampType(), pa.array([far], pa.timestamp("us")))


def test_human_strings() -> None:
    assert YearTransform().to_human_string(IntegerType(), 47) == "2017"
    assert MonthTransform().to_human_string(IntegerType(), 574) == "2017-11"
    d = days(dt.date(2017, 11, 16))
    assert DayTransform().to_human_string(DateType(), d) == "2017-11-16"
    assert HourTransform().to_human_string(IntegerType(), d * 24 + 17) == "2017-11-16-17"
    assert YearTransform().to_human_string(IntegerType(), -1) == "1969"
    assert MonthTransform().to_human_string(IntegerType(), -1) == "1969-12"
    assert DayTransform().to_human_string(DateType(), -1) == "1969-12-31"
    assert HourTransform().to_human_string(IntegerType(), -1) == "1969-12-31-23"
    assert BucketTransform(16).to_human_string(IntegerType(), 3) == "3"
    assert TruncateTransform(10).to_human_string(IntegerType(), -10) == "-10"
    assert TruncateTransform(3).to_human_string(StringType(), "ice") == "ice"
    assert IdentityTransform().to_human_string(DateType(), d) == "2017-11-16"
    assert IdentityTransform().to_human_string(BinaryType(), b"\x01\xff") == "01ff"
    assert VoidTransform().to_human_string(IntegerType(), None) == "null"
    for t in (IdentityTransform(), BucketTransform(2), YearTransform(), HourTransform()):
        assert t.to_human_string(IntegerType(), None) == "null"


@given(st.dates())
def test_civil_from_days_matches_datetime(value: dt.date) -> None:
    assert civil_from_days(days(value)) == (value.year, value.month, value.day)
    assert DayTransform().to_human_string(DateType(), days(value)) == value.isoformat()


def test_civil_from_days_far_away() -> None:
    assert civil_from_days(days(dt.date(1, 1, 1)) - 1) == (0, 12, 31)
    assert civil_from_days(days(dt.date(9999, 12, 31)) + 1) == (10000, 1, 1)


def test_void_and_unknown() -> None:
    assert VoidTransform().apply(LongType(), 5) is None
    out = VoidTransform().apply_array(LongType(), pa.array([1, None, 3], pa.int64()))
    assert out.type == pa.null()
    assert out.to_pylist() == [None, None, None]
    unknown = UnknownTransform("zorder")
    assert unknown.can_transform(LongType())
    with pytest.raises(ValidationError, match="unknown transform 'zorder'"):
        unknown.apply(LongType(), 1)
    with pytest.raises(ValidationError, match="unknown transform 'zorder'"):
        unknown.apply_array(LongType(), pa.array([1], pa.int64()))


def test_identity_is_unchanged() -> None:
    arr = pa.array([1.5, None], pa.float64())
    assert IdentityTransform().apply_array(DoubleType(), arr) is arr
    assert IdentityTransform().apply(DoubleType(), 1.5) == 1.5


# --------------------------------------------------------------------------------------
# Scalar and vectorized paths agree (hypothesis)
# --------------------------------------------------------------------------------------

INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
# Dates Arrow's calendar kernels can take (years 1..9999) and the full date range.
CALENDAR_DAYS = st.integers(days(dt.date(1, 1, 1)), days(dt.date(9999, 12, 31)))
CALENDAR_MICROS = st.integers(
    micros(dt.datetime(1, 1, 1)), micros(dt.datetime(9999, 12, 31, 23, 59, 59, 999999))
)
NANOS = INT64


def decimals(t: DecimalType) -> st.SearchStrategy[Decimal]:
    bound = 10**t.precision - 1
    return st.integers(-bound, bound).map(lambda u: Decimal(f"{u}E{-t.scale}"))


def value_strategy(t: IcebergType) -> st.SearchStrategy[Any]:
    if isinstance(t, IntegerType):
        return INT32
    if isinstance(t, DateType):
        return st.one_of(CALENDAR_DAYS, INT32)
    if isinstance(t, TimeType):
        return st.integers(0, 86_400 * 1_000_000 - 1)
    if isinstance(t, (TimestampType, TimestamptzType)):
        # Up to +-2**55 micros keeps every hour within an int.
        return st.one_of(CALENDAR_MICROS, st.integers(-(2**55), 2**55))
    if isinstance(t, (TimestampNanoType, TimestamptzNanoType, LongType)):
        return INT64
    if isinstance(t, DecimalType):
        return decimals(t)
    if isinstance(t, StringType):
        return st.text(max_size=12)
    if isinstance(t, BinaryType):
        return st.binary(max_size=12)
    if isinstance(t, FixedType):
        return st.binary(min_size=t.length, max_size=t.length)
    if isinstance(t, UUIDType):
        return st.uuids()
    raise AssertionError(f"no strategy for {t}")


def assert_agree(transform: Transform, source: IcebergType, values: list[Any]) -> None:
    arr = to_arrow(source, values)
    expected = [transform.apply(source, v) for v in values]
    result = transform.apply_array(source, arr)
    assert len(result) == len(values)
    assert from_arrow(transform.result_type(source), result) == expected
    chunked = transform.apply_array(source, pa.chunked_array([arr, arr], type=arr.type))
    assert isinstance(chunked, pa.ChunkedArray)
    assert from_arrow(transform.result_type(source), chunked.combine_chunks()) == expected * 2


BUCKET_SOURCES: list[IcebergType] = [
    IntegerType(),
    LongType(),
    DecimalType(9, 2),
    DecimalType(38, 10),
    DateType(),
    TimeType(),
    TimestampType(),
    TimestamptzType(),
    TimestampNanoType(),
    TimestamptzNanoType(),
    StringType(),
    UUIDType(),
    FixedType(5),
    BinaryType(),
]


@pytest.mark.parametrize("source", BUCKET_SOURCES, ids=str)
@settings(max_examples=examples(40), deadline=None)
@given(data=st.data(), n=st.sampled_from([1, 7, 16, 1000, INT32_MAX]))
def test_bucket_vector_matches_scalar(source: IcebergType, data: st.DataObject, n: int) -> None:
    values = data.draw(st.lists(st.one_of(st.none(), value_strategy(source)), max_size=20))
    transform = BucketTransform(n)
    assert_agree(transform, source, values)
    assert all(0 <= b < n for b in (transform.apply(source, v) for v in values) if b is not None)


TRUNCATE_SOURCES: list[IcebergType] = [
    IntegerType(),
    LongType(),
    DecimalType(9, 2),
    DecimalType(38, 0),
    StringType(),
    BinaryType(),
]


def truncatable(source: IcebergType, width: int) -> st.SearchStrategy[Any]:
    """Values whose truncation does not leave the type (overflow is tested separately)."""
    if isinstance(source, IntegerType):
        return st.integers(-(2**31) + width, 2**31 - 1)
    if isinstance(source, LongType):
        return st.integers(-(2**63) + width, 2**63 - 1)
    if isinstance(source, DecimalType):
        bound = 10**source.precision - 1 - width
        return st.integers(-bound, bound).map(lambda u: Decimal(f"{u}E{-source.scale}"))
    return value_strategy(source)


@pytest.mark.parametrize("source", TRUNCATE_SOURCES, ids=str)
@settings(max_examples=examples(40), deadline=None)
@given(data=st.data(), width=st.sampled_from([1, 3, 10, 1000]))
def test_truncate_vector_matches_scalar(
    source: IcebergType, data: st.DataObject, width: int
) -> None:
    values = data.draw(st.lists(st.one_of(st.none(), truncatable(source, width)), max_size=20))
    assert_agree(TruncateTransform(width), source, values)


@settings(max_examples=examples(100))
@given(v=INT64, width=st.integers(1, 2**31 - 1))
def test_truncate_int_laws(v: int, width: int) -> None:
    t = TruncateTransform(width)
    try:
        r = t.apply(LongType(), v)
    except ValidationError:
        assert v - v % width < -(2**63)  # only an overflow below the long range may fail
        return
    assert r <= v < r + width
    assert r % width == 0
    assert t.apply(LongType(), r) == r


@settings(max_examples=examples(100))
@given(v=st.text(), width=st.integers(1, 20))
def test_truncate_string_laws(v: str, width: int) -> None:
    r = TruncateTransform(width).apply(StringType(), v)
    assert v.startswith(r)
    assert len(r) == min(len(v), width)
    assert r <= v


TIME_SOURCES: list[IcebergType] = [
    DateType(),
    TimestampType(),
    TimestamptzType(),
    TimestampNanoType(),
    TimestamptzNanoType(),
]


@pytest.mark.parametrize("source", TIME_SOURCES, ids=str)
@pytest.mark.parametrize(
    "transform", [YearTransform(), MonthTransform(), DayTransform(), HourTransform()], ids=str
)
@settings(max_examples=examples(40), deadline=None)
@given(data=st.data())
def test_time_vector_matches_scalar(
    transform: Transform, source: IcebergType, data: st.DataObject
) -> None:
    if not transform.can_transform(source):
        return
    values = data.draw(st.lists(st.one_of(st.none(), value_strategy(source)), max_size=20))
    assert_agree(transform, source, values)
    # Batches entirely within years 1..9999 take Arrow's calendar kernels; check them too.
    if isinstance(source, DateType):
        in_range = data.draw(st.lists(CALENDAR_DAYS, max_size=20))
    elif isinstance(source, (TimestampType, TimestamptzType)):
        in_range = data.draw(st.lists(CALENDAR_MICROS, max_size=20))
    else:
        in_range = data.draw(st.lists(NANOS, max_size=20))
    assert_agree(transform, source, in_range)


@settings(max_examples=examples(200))
@given(value=st.datetimes(min_value=dt.datetime(1, 1, 1)))
def test_time_transforms_match_datetime(value: dt.datetime) -> None:
    us = micros(value)
    assert YearTransform().apply(TimestampType(), us) == value.year - 1970
    assert MonthTransform().apply(TimestampType(), us) == (value.year - 1970) * 12 + (
        value.month - 1
    )
    assert DayTransform().apply(TimestampType(), us) == days(value.date())
    assert HourTransform().apply(TimestampType(), us) == days(value.date()) * 24 + value.hour
    assert YearTransform().apply(DateType(), days(value.date())) == value.year - 1970
    assert (
        MonthTransform().to_human_string(IntegerType(), MonthTransform().apply(TimestampType(), us))
        == f"{value.year:04d}-{value.month:02d}"
    )


@settings(max_examples=examples(100))
@given(a=INT64, b=INT64)
def test_order_preserving_transforms_are_monotonic(a: int, b: int) -> None:
    lo, hi = min(a, b), max(a, b)
    for t in (YearTransform(), MonthTransform(), DayTransform(), HourTransform()):
        assert t.apply(TimestampNanoType(), lo) <= t.apply(TimestampNanoType(), hi)
    if lo >= -(2**63) + 7:
        truncate = TruncateTransform(7)
        assert truncate.apply(LongType(), lo) <= truncate.apply(LongType(), hi)


# --------------------------------------------------------------------------------------
# Arrow input variants
# --------------------------------------------------------------------------------------


def test_string_array_variants_bucket_alike() -> None:
    values = ["iceberg", None, "a😀"]
    expected = [BucketTransform(16).apply(StringType(), v) for v in values]
    variants = [
        pa.array(values, pa.string()),
        pa.array(values, pa.large_string()),
        pa.array(values, pa.string_view()),
        pa.array(values, pa.string()).dictionary_encode(),
    ]
    for arr in variants:
        assert BucketTransform(16).apply_array(StringType(), arr).to_pylist() == expected


def test_uuid_extension_arrays() -> None:
    u = uuid.UUID("f79c3e09-677c-4bbd-a479-3f349cb785e7")
    storage = pa.array([u.bytes, None], pa.binary(16))
    arr = pa.ExtensionArray.from_storage(pa.uuid(), storage)
    assert BucketTransform(INT32_MAX).apply_array(UUIDType(), arr).to_pylist() == [1488055340, None]


def test_decimal256_arrays() -> None:
    source = DecimalType(38, 2)
    values = [Decimal("14.20"), Decimal("-99999999999999999999999999999999999.99"), None]
    arr = pa.array(values, pa.decimal256(38, 2))
    expected = [BucketTransform(7).apply(source, v) for v in values]
    assert BucketTransform(7).apply_array(source, arr).to_pylist() == expected


def test_decimal_arrays_at_another_scale_are_rescaled() -> None:
    source = DecimalType(9, 2)
    arr = pa.array([Decimal("14.200"), None], pa.decimal128(10, 3))
    assert BucketTransform(INT32_MAX).apply_array(source, arr).to_pylist() == [
        (-500754589 & INT32_MAX) % INT32_MAX,
        None,
    ]
    lossy = pa.array([Decimal("14.205")], pa.decimal128(10, 3))
    with pytest.raises(ValidationError, match="cannot rescale"):
        BucketTransform(4).apply_array(source, lossy)


def test_narrow_integer_arrays_truncate_to_the_column_type() -> None:
    out = TruncateTransform(1000).apply_array(IntegerType(), pa.array([5, -5, None], pa.int8()))
    assert out.type == pa.int32()
    assert out.to_pylist() == [0, -1000, None]


def test_human_string_of_a_non_ordinal_is_a_clear_error() -> None:
    with pytest.raises(ValidationError, match="int ordinal"):
        DayTransform().to_human_string(DateType(), dt.date(2017, 11, 16))


def test_zoned_timestamps_use_utc() -> None:
    # 2017-11-16T23:30Z is still the 16th in UTC although it is the 17th in Tokyo.
    value = micros(dt.datetime(2017, 11, 16, 23, 30, tzinfo=dt.UTC))
    arr = pa.array([value], pa.timestamp("us", tz="Asia/Tokyo"))
    assert DayTransform().apply_array(TimestamptzType(), arr).to_pylist() == [dt.date(2017, 11, 16)]
    assert HourTransform().apply_array(TimestamptzType(), arr).to_pylist() == [
        HourTransform().apply(TimestamptzType(), value)
    ]


def test_coarser_timestamp_units_are_converted() -> None:
    arr = pa.array([1_500, None], pa.timestamp("ms"))
    assert BucketTransform(10).apply_array(TimestampType(), arr).to_pylist() == [
        BucketTransform(10).apply(TimestampType(), 1_500_000),
        None,
    ]


def test_lossy_or_wrong_arrays_are_clear_errors() -> None:
    with pytest.raises(ValidationError, match="cannot convert"):
        DayTransform().apply_array(TimestampType(), pa.array([1], pa.timestamp("ns")))
    with pytest.raises(ValidationError, match="Arrow array of type double"):
        BucketTransform(4).apply_array(LongType(), pa.array([1.0], pa.float64()))
    with pytest.raises(ValidationError, match="Arrow array of type int64"):
        TruncateTransform(4).apply_array(StringType(), pa.array([1], pa.int64()))
    with pytest.raises(ValidationError, match="pyarrow Array"):
        BucketTransform(4).apply_array(LongType(), [1, 2])


def test_empty_inputs() -> None:
    empty = pa.chunked_array([], type=pa.timestamp("us"))
    out = DayTransform().apply_array(TimestampType(), empty)
    assert isinstance(out, pa.ChunkedArray)
    assert out.type == pa.date32()
    assert len(out) == 0
    assert BucketTransform(3).apply_array(StringType(), pa.array([], pa.string())).to_pylist() == []
    assert YearTransform().apply_array(DateType(), pa.array([None], pa.date32())).to_pylist() == [
        None
    ]


# --------------------------------------------------------------------------------------
# Binding a transform to its source column; source-id JSON
# --------------------------------------------------------------------------------------

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "tags", ListType(3, StringType())),
    NestedField(4, "point", StructType(NestedField(5, "x", DoubleType()))),
)


def test_bind_source() -> None:
    assert bind_source(SCHEMA, 1, BucketTransform(4), "f") == LongType()
    assert bind_source(SCHEMA, 5, IdentityTransform(), "f") == DoubleType()
    with pytest.raises(ValidationError, match="f: source column id 9 is not in schema 0"):
        bind_source(SCHEMA, 9, IdentityTransform(), "f")
    with pytest.raises(ValidationError, match="'tags' is a list<string>"):
        bind_source(SCHEMA, 2, IdentityTransform(), "f")
    with pytest.raises(ValidationError, match=r"'tags\.element' is inside a list or map"):
        bind_source(SCHEMA, 3, IdentityTransform(), "f")
    with pytest.raises(ValidationError, match="day cannot be applied to column 'id' of type long"):
        bind_source(SCHEMA, 1, DayTransform(), "f")


def test_source_ids_from_json() -> None:
    ident = IdentityTransform()
    assert source_ids_from_json({"source-id": 3}, ident, "f") == (3,)
    assert source_ids_from_json({"source-ids": [3]}, ident, "f") == (3,)
    assert source_ids_from_json({"source-id": 3, "source-ids": [3]}, ident, "f") == (3,)
    assert source_ids_from_json({"source-ids": [3, 4]}, UnknownTransform("z"), "f") == (3, 4)
    with pytest.raises(ValidationError, match="takes one argument"):
        source_ids_from_json({"source-ids": [3, 4]}, ident, "f")
    with pytest.raises(ValidationError, match="disagrees"):
        source_ids_from_json({"source-id": 4, "source-ids": [3]}, ident, "f")
    with pytest.raises(ValidationError, match="missing 'source-id'"):
        source_ids_from_json({}, ident, "f")
    with pytest.raises(ValidationError, match="non-empty list"):
        source_ids_from_json({"source-ids": []}, ident, "f")
    with pytest.raises(ValidationError, match="must be an integer"):
        source_ids_from_json({"source-id": "3"}, ident, "f")


# --------------------------------------------------------------------------------------
# Interop: the same answers as PyIceberg
# --------------------------------------------------------------------------------------


def pyiceberg_type(t: IcebergType) -> Any:
    from pyiceberg import types as pt

    if isinstance(t, DecimalType):
        return pt.DecimalType(t.precision, t.scale)
    if isinstance(t, FixedType):
        return pt.FixedType(t.length)
    return {
        "int": pt.IntegerType(),
        "long": pt.LongType(),
        "date": pt.DateType(),
        "time": pt.TimeType(),
        "timestamp": pt.TimestampType(),
        "timestamptz": pt.TimestamptzType(),
        "timestamp_ns": pt.TimestampNanoType(),
        "timestamptz_ns": pt.TimestamptzNanoType(),
        "string": pt.StringType(),
        "uuid": pt.UUIDType(),
        "binary": pt.BinaryType(),
    }[str(t)]


@pytest.mark.interop
@pytest.mark.parametrize("source", BUCKET_SOURCES, ids=str)
@settings(max_examples=examples(25), deadline=None)
@given(data=st.data())
def test_bucket_matches_pyiceberg(source: IcebergType, data: st.DataObject) -> None:
    from pyiceberg import transforms as pyt

    value = data.draw(value_strategy(source))
    n = data.draw(st.sampled_from([3, 16, 1024]))
    theirs = pyt.BucketTransform(n).transform(pyiceberg_type(source))(value)
    assert BucketTransform(n).apply(source, value) == theirs


@pytest.mark.interop
@pytest.mark.parametrize("source", [DateType(), TimestampType(), TimestamptzType()], ids=str)
@settings(max_examples=examples(50), deadline=None)
@given(data=st.data())
def test_time_transforms_match_pyiceberg(source: IcebergType, data: st.DataObject) -> None:
    from pyiceberg import transforms as pyt

    strategy = CALENDAR_DAYS if isinstance(source, DateType) else CALENDAR_MICROS
    value = data.draw(strategy)
    pairs: list[tuple[Transform, Any]] = [
        (YearTransform(), pyt.YearTransform()),
        (MonthTransform(), pyt.MonthTransform()),
        (DayTransform(), pyt.DayTransform()),
    ]
    if not isinstance(source, DateType):
        pairs.append((HourTransform(), pyt.HourTransform()))
    for mine, theirs in pairs:
        result = mine.apply(source, value)
        assert result == theirs.transform(pyiceberg_type(source))(value)
        result_type = mine.result_type(source)
        assert mine.to_human_string(result_type, result) == theirs.to_human_string(
            pyiceberg_type(result_type), result
        )


@pytest.mark.interop
@settings(max_examples=examples(50), deadline=None)
@given(v=INT64, s=st.text(max_size=10), width=st.integers(1, 50))
def test_truncate_matches_pyiceberg(v: int, s: str, width: int) -> None:
    from pyiceberg import transforms as pyt
    from pyiceberg import types as pt

    theirs = pyt.TruncateTransform(width)
    if v - v % width >= -(2**63):
        assert TruncateTransform(width).apply(LongType(), v) == theirs.transform(pt.LongType())(v)
    assert TruncateTransform(width).apply(StringType(), s) == theirs.transform(pt.StringType())(s)
