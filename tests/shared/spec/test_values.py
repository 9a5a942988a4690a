"""Tests for icefloe.spec.values: Appendix D binary and JSON single values, ordering, truncation."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import math
import re
import struct
import uuid
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples
from icefloe.errors import ValidationError
from icefloe.spec.type_json import field_from_json, field_to_json
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
from icefloe.spec.values import (
    compare,
    date_to_days,
    datetime_to_micros,
    days_to_date,
    from_bytes,
    from_json_value,
    micros_to_datetime,
    micros_to_time,
    time_to_micros,
    to_bytes,
    to_human_string,
    to_json_value,
    truncate_lower_bound,
    truncate_upper_bound,
)

INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
MICROS_PER_DAY = 86_400_000_000
NANOS_PER_DAY = 86_400_000_000_000


def _scaled(unscaled: int, scale: int) -> Decimal:
    # The default context has 28 digits and would round 38-digit values.
    return Decimal(unscaled).scaleb(-scale, decimal.Context(prec=100))


def _decimal_values(t: DecimalType) -> st.SearchStrategy[Decimal]:
    bound = 10**t.precision - 1
    return st.integers(-bound, bound).map(lambda u: _scaled(u, t.scale))


def _decimal_types() -> st.SearchStrategy[DecimalType]:
    return st.builds(DecimalType, st.integers(1, 38), st.integers(-10, 40))


# Every primitive type that has a binary and JSON single-value form, with its value strategy.
PRIMITIVES: list[tuple[PrimitiveType, st.SearchStrategy[Any]]] = [
    (BooleanType(), st.booleans()),
    (IntegerType(), INT32),
    (LongType(), INT64),
    (FloatType(), st.floats(width=32, allow_nan=False)),
    (DoubleType(), st.floats(allow_nan=False)),
    (DateType(), INT32),
    (TimeType(), st.integers(0, MICROS_PER_DAY - 1)),
    (TimestampType(), INT64),
    (TimestamptzType(), INT64),
    (TimestampNanoType(), INT64),
    (TimestamptzNanoType(), INT64),
    (StringType(), st.text()),
    (UUIDType(), st.uuids()),
    (FixedType(1), st.binary(min_size=1, max_size=1)),
    (FixedType(16), st.binary(min_size=16, max_size=16)),
    (BinaryType(), st.binary()),
    (DecimalType(9, 2), _decimal_values(DecimalType(9, 2))),
    (DecimalType(38, 0), _decimal_values(DecimalType(38, 0))),
    (DecimalType(38, 38), _decimal_values(DecimalType(38, 38))),
    (DecimalType(5, -20), _decimal_values(DecimalType(5, -20))),
]
PRIMITIVE_IDS = [str(t) for t, _ in PRIMITIVES]


def _same(t: PrimitiveType, a: Any, b: Any) -> bool:
    """Equality that also tells -0.0 from +0.0 and a decimal's scale."""
    if isinstance(a, Decimal):
        return isinstance(b, Decimal) and a == b and a.as_tuple().exponent == -t.scale  # type: ignore[attr-defined]
    return type(a) is type(b) and compare(t, a, b) == 0


# -- binary form ------------------------------------------------------------------------------


@pytest.mark.parametrize(("t", "values"), PRIMITIVES, ids=PRIMITIVE_IDS)
@settings(max_examples=examples(60))
@given(data=st.data())
def test_binary_round_trip(t: PrimitiveType, values: st.SearchStrategy[Any], data: Any) -> None:
    value = data.draw(values)
    encoded = to_bytes(t, value)
    assert isinstance(encoded, bytes)
    assert _same(t, from_bytes(t, encoded), value)


@pytest.mark.parametrize(
    ("t", "value", "expected"),
    [
        (BooleanType(), True, "01"),
        (BooleanType(), False, "00"),
        (IntegerType(), 34, "22000000"),
        (IntegerType(), -1, "ffffffff"),
        (LongType(), 34, "2200000000000000"),
        (FloatType(), 1.0, "0000803f"),
        (DoubleType(), 1.0, "000000000000f03f"),
        (DateType(), 17486, "4e440000"),
        (TimeType(), 81068123456, "406509e012000000"),
        (TimestampType(), 1510871468123456, "40a5282d215e0500"),
        (StringType(), "iceberg", "69636562657267"),
        (
            UUIDType(),
            uuid.UUID("f79c3e09-677c-4bbd-a479-3f349cb785e7"),
            "f79c3e09677c4bbda4793f349cb785e7",
        ),
        (FixedType(4), b"\x00\x01\x02\xff", "000102ff"),
        (BinaryType(), b"\x00\x01\x02\xff", "000102ff"),
        (DecimalType(9, 2), Decimal("14.20"), "058c"),
        (DecimalType(9, 2), Decimal("-14.20"), "fa74"),
    ],
)
def test_binary_known_encodings(t: PrimitiveType, value: Any, expected: str) -> None:
    assert to_bytes(t, value).hex() == expected
    assert _same(t, from_bytes(t, bytes.fromhex(expected)), value)


@pytest.mark.parametrize(
    ("unscaled", "length"),
    [
        (0, 1),
        (1, 1),
        (-1, 1),
        (127, 1),
        (128, 2),
        (-128, 1),
        (-129, 2),
        (32767, 2),
        (32768, 3),
        (-32768, 2),
        (10**38 - 1, 16),
        (-(10**38) + 1, 16),
    ],
)
def test_decimal_uses_minimum_bytes(unscaled: int, length: int) -> None:
    t = DecimalType(38, 0)
    encoded = to_bytes(t, Decimal(unscaled))
    assert len(encoded) == length
    assert int.from_bytes(encoded, "big", signed=True) == unscaled


@settings(max_examples=examples(200))
@given(t=_decimal_types(), data=st.data())
def test_decimal_length_is_minimal(t: DecimalType, data: Any) -> None:
    value = data.draw(_decimal_values(t))
    encoded = to_bytes(t, value)
    unscaled = int.from_bytes(encoded, "big", signed=True)
    assert _scaled(unscaled, t.scale) == value
    if len(encoded) > 1:  # one byte fewer cannot hold the value
        with pytest.raises(OverflowError):
            unscaled.to_bytes(len(encoded) - 1, "big", signed=True)


def test_decimal_is_rescaled_exactly_but_never_rounded() -> None:
    t = DecimalType(6, 2)
    assert to_bytes(t, Decimal("14.2")) == to_bytes(t, Decimal("14.20"))
    assert to_bytes(t, Decimal("1.42E+1")) == to_bytes(t, Decimal("14.20"))
    assert to_bytes(t, 14) == to_bytes(t, Decimal("14.00"))
    with pytest.raises(ValidationError, match=r"decimal\(6,2\).*14\.205.*after the decimal point"):
        to_bytes(t, Decimal("14.205"))
    with pytest.raises(ValidationError, match="precision"):
        to_bytes(t, Decimal("10000.00"))
    with pytest.raises(ValidationError, match="NaN"):
        to_bytes(t, Decimal("NaN"))
    with pytest.raises(ValidationError, match=r"decimal\.Decimal"):
        to_bytes(t, 14.2)


@pytest.mark.parametrize(
    ("current", "written", "value", "expected"),
    [
        (LongType(), IntegerType(), -5, -5),
        (LongType(), IntegerType(), 2**31 - 1, 2**31 - 1),
        (DoubleType(), FloatType(), 1.5, 1.5),
        (DoubleType(), FloatType(), -0.0, -0.0),
        (TimestampType(), DateType(), 17486, 17486 * MICROS_PER_DAY),
        (TimestampType(), DateType(), -1, -MICROS_PER_DAY),
        (TimestampNanoType(), DateType(), 17486, 17486 * NANOS_PER_DAY),
        (DecimalType(38, 2), DecimalType(4, 2), Decimal("-14.20"), Decimal("-14.20")),
    ],
)
def test_promoted_bounds_are_inferred_from_length(
    current: PrimitiveType, written: PrimitiveType, value: Any, expected: Any
) -> None:
    decoded = from_bytes(current, to_bytes(written, value))
    assert _same(current, decoded, expected)


@settings(max_examples=examples(100))
@given(days=st.integers(-106_751, 106_750))
def test_date_bound_read_as_timestamp_is_midnight(days: int) -> None:
    assert from_bytes(TimestampType(), to_bytes(DateType(), days)) == days * MICROS_PER_DAY
    assert from_bytes(TimestampNanoType(), to_bytes(DateType(), days)) == days * NANOS_PER_DAY


def test_promoted_bound_outside_new_range_fails() -> None:
    far = to_bytes(DateType(), 2**31 - 1)
    with pytest.raises(ValidationError, match=r"timestamp_ns.*outside the range"):
        from_bytes(TimestampNanoType(), far)
    with pytest.raises(ValidationError, match=r"timestamp.*outside the range"):
        from_bytes(TimestampType(), far)


@pytest.mark.parametrize(
    ("t", "length"),
    [
        (IntegerType(), 3),
        (IntegerType(), 8),
        (LongType(), 3),
        (FloatType(), 8),
        (DoubleType(), 2),
        (DateType(), 8),
        (TimeType(), 4),
        (TimestamptzType(), 4),  # date may not be promoted to timestamptz
        (TimestamptzNanoType(), 4),
        (TimestampType(), 5),
        (BooleanType(), 2),
        (BooleanType(), 0),
        (UUIDType(), 15),
        (FixedType(4), 5),
        (FixedType(4), 0),
        (DecimalType(38, 0), 0),
        (DecimalType(38, 0), 17),
    ],
)
def test_from_bytes_rejects_wrong_length(t: PrimitiveType, length: int) -> None:
    with pytest.raises(ValidationError, match=rf"type {re.escape(str(t))} from {length} bytes"):
        from_bytes(t, b"\x01" * length)


def test_from_bytes_names_type_and_length() -> None:
    with pytest.raises(ValidationError) as excinfo:
        from_bytes(IntegerType(), b"\x01\x02\x03")
    assert "int" in str(excinfo.value)
    assert "3 bytes" in str(excinfo.value)
    assert "expected 4" in str(excinfo.value)


def test_from_bytes_rejects_bad_content() -> None:
    with pytest.raises(ValidationError, match="UTF-8"):
        from_bytes(StringType(), b"\xff\xfe")
    with pytest.raises(ValidationError, match="more than 2 digits"):
        from_bytes(DecimalType(2, 0), to_bytes(DecimalType(3, 0), Decimal(100)))
    with pytest.raises(ValidationError, match="time"):
        from_bytes(TimeType(), struct.pack("<q", MICROS_PER_DAY))


def test_truncated_fixed_bound_is_accepted() -> None:
    assert from_bytes(FixedType(8), b"\x01\x02") == b"\x01\x02"


def test_bool_decodes_any_nonzero_byte_as_true() -> None:
    assert from_bytes(BooleanType(), b"\x07") is True
    assert from_bytes(BooleanType(), b"\x00") is False


@pytest.mark.parametrize(
    ("t", "value", "message"),
    [
        (IntegerType(), 2**31, "32-bit"),
        (IntegerType(), -(2**31) - 1, "32-bit"),
        (IntegerType(), 1.5, "integer"),
        (LongType(), 2**63, "64-bit"),
        (DateType(), 2**31, "32-bit"),
        (TimeType(), -1, "since midnight"),
        (TimeType(), MICROS_PER_DAY, "since midnight"),
        (TimestampType(), 2**63, "64-bit"),
        (FloatType(), 1e300, "32-bit float"),
        (FloatType(), "1.0", "float"),
        (BooleanType(), 1, "bool"),
        (StringType(), b"abc", "str"),
        (StringType(), "\ud800", "UTF-8"),
        (UUIDType(), "f79c3e09-677c-4bbd-a479-3f349cb785e7", "uuid.UUID"),
        (FixedType(4), b"abc", "exactly 4"),
        (BinaryType(), "abc", "bytes"),
        (DecimalType(3, 0), Decimal(1000), "precision"),
    ],
)
def test_to_bytes_rejects_bad_values(t: PrimitiveType, value: Any, message: str) -> None:
    with pytest.raises(ValidationError, match=message) as excinfo:
        to_bytes(t, value)
    assert str(t) in str(excinfo.value)


@pytest.mark.parametrize(
    "t",
    [
        UnknownType(),
        VariantType(),
        StructType(NestedField(1, "a", IntegerType())),
        ListType(2, IntegerType()),
        MapType(3, StringType(), 4, IntegerType()),
    ],
    ids=str,
)
def test_types_without_binary_form_are_refused(t: Any) -> None:
    with pytest.raises(ValidationError, match="no binary single-value form"):
        to_bytes(t, 1)
    with pytest.raises(ValidationError, match="no binary single-value form"):
        from_bytes(t, b"\x01")


def test_geo_bounds_pass_through() -> None:
    point = struct.pack("<dd", 30.0, 10.0)
    for t in (GeometryType(), GeographyType()):
        assert to_bytes(t, point) == point
        assert from_bytes(t, point) == point


def test_null_has_no_binary_form() -> None:
    with pytest.raises(ValidationError, match="null"):
        to_bytes(IntegerType(), None)


# -- PyIceberg cross-check -------------------------------------------------------------------


def _pyiceberg_type(t: PrimitiveType) -> Any:
    from pyiceberg import types as pt

    if isinstance(t, DecimalType):
        return pt.DecimalType(t.precision, t.scale)
    if isinstance(t, FixedType):
        return pt.FixedType(t.length)
    return {
        BooleanType: pt.BooleanType,
        IntegerType: pt.IntegerType,
        LongType: pt.LongType,
        FloatType: pt.FloatType,
        DoubleType: pt.DoubleType,
        DateType: pt.DateType,
        TimeType: pt.TimeType,
        TimestampType: pt.TimestampType,
        TimestamptzType: pt.TimestamptzType,
        TimestampNanoType: pt.TimestampNanoType,
        TimestamptzNanoType: pt.TimestamptzNanoType,
        StringType: pt.StringType,
        UUIDType: pt.UUIDType,
        BinaryType: pt.BinaryType,
    }[type(t)]()


# PyIceberg checks a decimal's exponent against abs(scale), so only scales >= 0 are comparable.
CROSS_CHECKED = [(t, s) for t, s in PRIMITIVES if not (isinstance(t, DecimalType) and t.scale < 0)]


@pytest.mark.interop
@pytest.mark.parametrize(("t", "values"), CROSS_CHECKED, ids=[str(t) for t, _ in CROSS_CHECKED])
@settings(max_examples=examples(40))
@given(data=st.data())
def test_binary_form_matches_pyiceberg(
    t: PrimitiveType, values: st.SearchStrategy[Any], data: Any
) -> None:
    from pyiceberg import conversions

    value = data.draw(values)
    peer_type = _pyiceberg_type(t)
    ours = to_bytes(t, value)
    assert ours == conversions.to_bytes(peer_type, value)
    theirs = conversions.from_bytes(peer_type, ours)
    if isinstance(t, UUIDType):
        theirs = uuid.UUID(bytes=theirs) if isinstance(theirs, bytes) else theirs
    assert _same(t, from_bytes(t, ours), theirs)


# -- JSON form -------------------------------------------------------------------------------


@pytest.mark.parametrize(("t", "values"), PRIMITIVES, ids=PRIMITIVE_IDS)
@settings(max_examples=examples(60))
@given(data=st.data())
def test_json_round_trip(t: PrimitiveType, values: st.SearchStrategy[Any], data: Any) -> None:
    value = data.draw(values)
    text = json.dumps(to_json_value(t, value))
    assert _same(t, from_json_value(t, json.loads(text)), value)


# The examples of the spec's JSON single-value table, verbatim, with their internal values.
SPEC_EXAMPLES: list[tuple[IcebergType, Any, Any]] = [
    (BooleanType(), True, True),
    (IntegerType(), 34, 34),
    (LongType(), 34, 34),
    (FloatType(), 1.0, 1.0),
    (DoubleType(), 1.0, 1.0),
    (DecimalType(4, 2), "14.20", Decimal("14.20")),
    (DecimalType(1, -20), "2E+20", Decimal("2E+20")),
    (DateType(), "2017-11-16", 17486),
    (TimeType(), "22:31:08.123456", 81068123456),
    (TimestampType(), "2017-11-16T22:31:08.123456", 1510871468123456),
    (TimestamptzType(), "2017-11-16T22:31:08.123456+00:00", 1510871468123456),
    (TimestampNanoType(), "2017-11-16T22:31:08.123456789", 1510871468123456789),
    (TimestamptzNanoType(), "2017-11-16T22:31:08.123456789+00:00", 1510871468123456789),
    (StringType(), "iceberg", "iceberg"),
    (
        UUIDType(),
        "f79c3e09-677c-4bbd-a479-3f349cb785e7",
        uuid.UUID("f79c3e09-677c-4bbd-a479-3f349cb785e7"),
    ),
    (FixedType(4), "000102ff", b"\x00\x01\x02\xff"),
    (BinaryType(), "000102ff", b"\x00\x01\x02\xff"),
    (
        StructType(NestedField(1, "id", IntegerType(), True), NestedField(2, "data", StringType())),
        {"1": 1, "2": "bar"},
        {1: 1, 2: "bar"},
    ),
    (ListType(3, IntegerType()), [1, 2, 3], [1, 2, 3]),
    (
        MapType(4, StringType(), 5, IntegerType()),
        {"keys": ["a", "b"], "values": [1, 2]},
        {"a": 1, "b": 2},
    ),
]


@pytest.mark.parametrize(("t", "obj", "value"), SPEC_EXAMPLES, ids=lambda x: str(x)[:40])
def test_spec_json_examples(t: IcebergType, obj: Any, value: Any) -> None:
    parsed = from_json_value(t, obj)
    assert parsed == value
    assert type(parsed) is type(value)
    assert to_json_value(t, parsed) == obj


def test_spec_decimal_examples_keep_their_scale() -> None:
    assert from_json_value(DecimalType(4, 2), "14.20").as_tuple().exponent == -2
    assert from_json_value(DecimalType(1, -20), "2E+20").as_tuple().exponent == 20


@pytest.mark.parametrize(
    ("t", "value", "text"),
    [
        (DecimalType(9, 2), Decimal("-0.05"), "-0.05"),
        (DecimalType(9, 2), Decimal(0), "0.00"),
        (DecimalType(9, 0), Decimal(-7), "-7"),
        (DecimalType(9, 7), Decimal("1E-7"), "0.0000001"),
        (DecimalType(9, -3), Decimal("-1.23E+5"), "-1.23E+5"),
        (DecimalType(9, -3), Decimal(0), "0E+3"),
    ],
)
def test_decimal_json_text(t: DecimalType, value: Decimal, text: str) -> None:
    assert to_json_value(t, value) == text
    assert from_json_value(t, text) == value


@pytest.mark.parametrize(
    ("t", "value", "text"),
    [
        (DateType(), 0, "1970-01-01"),
        (DateType(), -1, "1969-12-31"),
        (DateType(), -719_162, "0001-01-01"),
        (DateType(), -719_163, "0000-12-31"),
        (DateType(), 2_932_897, "+10000-01-01"),
        (DateType(), -(2**31), "-5877641-06-23"),
        (TimeType(), 0, "00:00:00.000000"),
        (TimeType(), MICROS_PER_DAY - 1, "23:59:59.999999"),
        (TimestampType(), -1, "1969-12-31T23:59:59.999999"),
        (TimestamptzNanoType(), -1, "1969-12-31T23:59:59.999999999+00:00"),
        (TimestampNanoType(), 2**63 - 1, "2262-04-11T23:47:16.854775807"),
    ],
)
def test_date_and_time_json_text(t: PrimitiveType, value: int, text: str) -> None:
    assert to_json_value(t, value) == text
    assert from_json_value(t, text) == value


@settings(max_examples=examples(200))
@given(day=st.dates())
def test_calendar_matches_python_dates(day: dt.date) -> None:
    days = (day - dt.date(1970, 1, 1)).days
    assert to_json_value(DateType(), days) == day.isoformat()
    assert from_json_value(DateType(), day.isoformat()) == days


@settings(max_examples=examples(100))
@given(moment=st.datetimes())
def test_timestamps_match_python_datetimes(moment: dt.datetime) -> None:
    micros = datetime_to_micros(moment)
    assert to_json_value(TimestampType(), micros) == moment.isoformat(timespec="microseconds")
    aware = moment.replace(tzinfo=dt.UTC)
    assert to_json_value(TimestamptzType(), micros) == aware.isoformat(timespec="microseconds")


@pytest.mark.parametrize(
    ("t", "text", "value"),
    [
        (TimeType(), "22:31", 81060000000),
        (TimeType(), "22:31:08", 81068000000),
        (TimeType(), "22:31:08.1", 81068100000),
        (TimestampType(), "2017-11-16T22:31:08.123", 1510871468123000),
        (TimestamptzNanoType(), "2017-11-16T22:31:08+00:00", 1510871468000000000),
    ],
)
def test_shorter_iso_times_are_accepted(t: PrimitiveType, text: str, value: int) -> None:
    # java.time prints only the fraction digits it needs; its output must read back.
    assert from_json_value(t, text) == value


@pytest.mark.parametrize(
    ("t", "obj", "message"),
    [
        (BooleanType(), "true", "JSON boolean"),
        (BooleanType(), 1, "JSON boolean"),
        (IntegerType(), 2**31, "32-bit"),
        (IntegerType(), -(2**31) - 1, "32-bit"),
        (IntegerType(), 1.0, "32-bit integer"),
        (IntegerType(), True, "32-bit integer"),
        (IntegerType(), "34", "32-bit integer"),
        (LongType(), 2**63, "64-bit"),
        (FloatType(), 1e300, "range"),
        (FloatType(), "1.0", "number"),
        (DoubleType(), False, "number"),
        (DecimalType(4, 2), 14.2, "JSON string"),
        (DecimalType(4, 2), "14.2", "scale 1, expected 2"),
        (DecimalType(4, 2), "14.200", "scale 3, expected 2"),
        (DecimalType(4, 2), "114.20", "5 digits, more than precision 4"),
        (DecimalType(1, -20), "200000000000000000000", "scale 0, expected -20"),
        (DecimalType(4, 2), "NaN", "not a decimal"),
        (DecimalType(4, 2), " 1.00", "not a decimal"),
        (DecimalType(4, 2), "1_0.00", "not a decimal"),
        (DateType(), 17486, "JSON string"),
        (DateType(), "2017-02-30", "no such calendar date"),
        (DateType(), "2017-13-01", "no such calendar date"),
        (DateType(), "20171116", "ISO-8601 date"),
        (DateType(), "+9999999-01-01", "32-bit"),
        (TimeType(), "24:00:00", "out of range"),
        (TimeType(), "22:31:08.1234567", "more than 6 fractional digits"),
        (TimeType(), "22:31:08Z", "ISO-8601 time"),
        (TimestampType(), "2017-11-16T22:31:08.123456+00:00", "must not carry a zone offset"),
        (TimestampType(), "2017-11-16 22:31:08.123456", "ISO-8601 timestamp"),
        (TimestampType(), "2017-11-16T22:31:08.123456789", "more than 6 fractional digits"),
        (TimestamptzType(), "2017-11-16T22:31:08.123456", "\\+00:00"),
        (TimestamptzType(), "2017-11-16T22:31:08.123456Z", "\\+00:00"),
        (TimestamptzType(), "2017-11-16T22:31:08.123456+01:00", "\\+00:00"),
        (TimestampNanoType(), "+3000-01-01T00:00:00", "outside the range"),
        (StringType(), 1, "JSON string"),
        (UUIDType(), "f79c3e09677c4bbda4793f349cb785e7", "hyphenated UUID"),
        (FixedType(4), "000102", "3 bytes, expected exactly 4"),
        (FixedType(4), "000102ff00", "5 bytes, expected exactly 4"),
        (BinaryType(), "0g", "hexadecimal"),
        (BinaryType(), "abc", "hexadecimal"),
        (BinaryType(), "00 01", "hexadecimal"),
        (UnknownType(), 1, "no JSON single-value form other than null"),
        (VariantType(), {}, "no JSON single-value form other than null"),
        (GeometryType(), "POINT (30 10)", "WKT"),
        (GeographyType(), "POINT (30 10)", "WKT"),
    ],
)
def test_from_json_is_strict(t: PrimitiveType, obj: Any, message: str) -> None:
    with pytest.raises(ValidationError, match=message) as excinfo:
        from_json_value(t, obj)
    # The message names the type and the offending value.
    assert str(t) in str(excinfo.value)
    assert repr(obj)[:40] in str(excinfo.value)


@pytest.mark.parametrize(
    ("t", "value", "message"),
    [
        (IntegerType(), 2**31, "32-bit"),
        (LongType(), -(2**63) - 1, "64-bit"),
        (DecimalType(3, 1), Decimal("100.0"), "precision"),
        (FixedType(2), b"abc", "exactly 2"),
        (DateType(), 2**31, "32-bit"),
        (TimeType(), MICROS_PER_DAY, "since midnight"),
        (TimestampType(), 2**63, "64-bit"),
        (UUIDType(), "not-a-uuid", "uuid.UUID"),
        (BooleanType(), "yes", "bool"),
        (GeometryType(), b"\x01", "WKT"),
    ],
)
def test_to_json_rejects_bad_values(t: PrimitiveType, value: Any, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        to_json_value(t, value)


def test_null_is_null_for_every_type() -> None:
    for t in [t for t, _ in PRIMITIVES] + [UnknownType(), VariantType(), GeometryType()]:
        assert to_json_value(t, None) is None
        assert from_json_value(t, None) is None


def test_uuid_json_is_lowercase() -> None:
    value = from_json_value(UUIDType(), "F79C3E09-677C-4BBD-A479-3F349CB785E7")
    assert to_json_value(UUIDType(), value) == "f79c3e09-677c-4bbd-a479-3f349cb785e7"


def test_binary_json_is_lowercase_hex() -> None:
    assert to_json_value(BinaryType(), b"\xab\xcd") == "abcd"
    assert from_json_value(BinaryType(), "ABCD") == b"\xab\xcd"
    assert to_json_value(BinaryType(), b"") == ""


# -- nested JSON values ----------------------------------------------------------------------

POINT = StructType(
    NestedField(1, "x", DoubleType(), True),
    NestedField(2, "y", DoubleType(), False),
)
NESTED = StructType(
    NestedField(10, "id", LongType(), True),
    NestedField(11, "tags", ListType(12, StringType(), element_required=False)),
    NestedField(13, "props", MapType(14, StringType(), 15, DecimalType(9, 2))),
    NestedField(16, "where", POINT),
    NestedField(17, "seen", ListType(18, TimestamptzType())),
)


def test_nested_value_round_trip() -> None:
    value = {
        10: 7,
        11: ["a", None, "c"],
        13: {"k": Decimal("1.50")},
        16: {1: 1.5, 2: None},
        17: [1510871468123456],
    }
    obj = to_json_value(NESTED, value)
    assert obj == {
        "10": 7,
        "11": ["a", None, "c"],
        "13": {"keys": ["k"], "values": ["1.50"]},
        "16": {"1": 1.5, "2": None},
        "17": ["2017-11-16T22:31:08.123456+00:00"],
    }
    assert from_json_value(NESTED, json.loads(json.dumps(obj))) == value


@settings(max_examples=examples(50))
@given(
    value=st.dictionaries(
        st.text(max_size=5), st.lists(st.one_of(st.none(), INT32), max_size=4), max_size=4
    )
)
def test_map_of_lists_round_trip(value: dict[str, list[int | None]]) -> None:
    t = MapType(1, StringType(), 2, ListType(3, IntegerType(), element_required=False))
    assert from_json_value(t, json.loads(json.dumps(to_json_value(t, value)))) == value


def test_struct_default_may_be_empty() -> None:
    assert from_json_value(POINT, {}) == {}
    assert to_json_value(POINT, {}) == {}


@pytest.mark.parametrize(
    ("t", "obj", "message"),
    [
        (POINT, [1.0], "JSON object keyed by field id"),
        (POINT, {"3": 1.0}, "'3' is not the id"),
        (POINT, {"x": 1.0}, "'x' is not the id"),
        (POINT, {"1": None}, r"required field 1 \(x\) is null"),
        (POINT, {"1": "a"}, r"struct field 1 \(x\): invalid double"),
        (ListType(1, IntegerType()), {"0": 1}, "JSON array"),
        (ListType(1, IntegerType()), [1, None], "element 1 is null"),
        (ListType(1, IntegerType()), [1, 2**40], r"list element 1: invalid int"),
        (MapType(1, StringType(), 2, IntegerType()), {"keys": ["a"]}, "keys.*values"),
        (MapType(1, StringType(), 2, IntegerType()), {"keys": ["a"], "values": []}, "same length"),
        (MapType(1, StringType(), 2, IntegerType()), {"keys": [None], "values": [1]}, "null"),
        (MapType(1, StringType(), 2, IntegerType()), {"keys": ["a"], "values": [None]}, "null"),
        (
            MapType(1, StringType(), 2, IntegerType()),
            {"keys": ["a", "a"], "values": [1, 2]},
            "duplicate",
        ),
        (MapType(1, StringType(), 2, IntegerType()), {"keys": [1], "values": [1]}, "map entry 0"),
    ],
)
def test_nested_json_errors(t: IcebergType, obj: Any, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        from_json_value(t, obj)


def test_nested_to_json_errors() -> None:
    with pytest.raises(ValidationError, match="not field ids"):
        to_json_value(POINT, {1: 1.0, 9: 2.0})
    with pytest.raises(ValidationError, match="required field 1"):
        to_json_value(POINT, {1: None})
    with pytest.raises(ValidationError, match="element 0 is null"):
        to_json_value(ListType(1, IntegerType()), [None])
    with pytest.raises(ValidationError, match="must not be null"):
        to_json_value(MapType(1, StringType(), 2, IntegerType()), {None: 1})


# -- defaults in schema JSON -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("field_type", "initial", "write", "internal_initial"),
    [
        (
            "uuid",
            "0db3e2a8-9d1d-42b9-aa7b-74ebe558dceb",
            "ec5911be-b0a7-458c-8438-c9a3e53cffae",
            uuid.UUID("0db3e2a8-9d1d-42b9-aa7b-74ebe558dceb"),
        ),
        ("decimal(9,2)", "14.20", "-1.00", Decimal("14.20")),
        (
            "timestamptz",
            "2017-11-16T22:31:08.123456+00:00",
            "1970-01-01T00:00:00.000000+00:00",
            1510871468123456,
        ),
        ("date", "2017-11-16", "1970-01-01", 17486),
        ("fixed[4]", "000102ff", "ffffffff", b"\x00\x01\x02\xff"),
        ("long", 34, -1, 34),
        ("boolean", False, True, False),
        (
            {
                "type": "struct",
                "fields": [
                    {
                        "id": 3,
                        "name": "x",
                        "required": False,
                        "type": "int",
                        "initial-default": 0,
                        "write-default": 0,
                    }
                ],
            },
            {},
            {},
            {},
        ),
        (
            {"type": "list", "element-id": 3, "element": "string", "element-required": True},
            ["a"],
            [],
            ["a"],
        ),
        (
            {
                "type": "map",
                "key-id": 3,
                "key": "string",
                "value-id": 4,
                "value": "int",
                "value-required": True,
            },
            {"keys": ["a"], "values": [1]},
            {"keys": [], "values": []},
            {"a": 1},
        ),
    ],
)
def test_field_defaults_round_trip_through_schema_json(
    field_type: Any, initial: Any, write: Any, internal_initial: Any
) -> None:
    obj = {
        "id": 1,
        "name": "col",
        "required": True,
        "type": field_type,
        "initial-default": initial,
        "write-default": write,
    }
    field = field_from_json(obj)
    assert field.initial_default == internal_initial
    assert type(field.initial_default) is type(internal_initial)
    assert field_to_json(field) == obj


def test_bad_default_names_the_field() -> None:
    obj = {"id": 7, "name": "qty", "required": False, "type": "int", "initial-default": "3"}
    with pytest.raises(ValidationError, match=r"field 7 \(qty\).*int"):
        field_from_json(obj)


# -- human strings ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("t", "value", "text"),
    [
        (BooleanType(), True, "true"),
        (IntegerType(), -3, "-3"),
        (FloatType(), from_bytes(FloatType(), to_bytes(FloatType(), 0.1)), "0.1"),
        (DoubleType(), 0.1, "0.1"),
        (DoubleType(), -0.0, "-0.0"),
        (DecimalType(9, 2), Decimal("14.2"), "14.20"),
        (DateType(), 17486, "2017-11-16"),
        (TimeType(), 81068123456, "22:31:08.123456"),
        (TimestampType(), 1510871468123456, "2017-11-16T22:31:08.123456"),
        (TimestamptzType(), 1510871468123456, "2017-11-16T22:31:08.123456+00:00"),
        (TimestampNanoType(), 1510871468123456789, "2017-11-16T22:31:08.123456789"),
        (StringType(), "a/b", "a/b"),
        (UUIDType(), uuid.UUID(int=1), "00000000-0000-0000-0000-000000000001"),
        (BinaryType(), b"\x00\xff", "00ff"),
        (FixedType(2), b"\x00\xff", "00ff"),
        (IntegerType(), None, "null"),
        (UnknownType(), None, "null"),
    ],
)
def test_to_human_string(t: PrimitiveType, value: Any, text: str) -> None:
    assert to_human_string(t, value) == text


def test_to_human_string_refuses_variant() -> None:
    with pytest.raises(ValidationError, match="variant"):
        to_human_string(VariantType(), b"\x01")


# -- ordering --------------------------------------------------------------------------------


def test_float_order_is_total() -> None:
    for t in (FloatType(), DoubleType()):
        ordered = [-math.inf, -1.0, -0.0, 0.0, 1e-300, math.inf, math.nan]
        for i, a in enumerate(ordered):
            for j, b in enumerate(ordered):
                assert compare(t, a, b) == (i > j) - (i < j), (a, b)


@settings(max_examples=examples(200))
@given(a=st.text(), b=st.text())
def test_string_order_is_utf8_byte_order(a: str, b: str) -> None:
    ea, eb = a.encode(), b.encode()
    assert compare(StringType(), a, b) == (ea > eb) - (ea < eb)


@settings(max_examples=examples(100))
@given(a=st.uuids(), b=st.uuids())
def test_uuid_order_is_unsigned_byte_order(a: uuid.UUID, b: uuid.UUID) -> None:
    assert compare(UUIDType(), a, b) == (a.bytes > b.bytes) - (a.bytes < b.bytes)


def test_compare_other_types() -> None:
    assert compare(BinaryType(), b"\x7f", b"\x80") == -1
    assert compare(DecimalType(9, 2), Decimal("1.10"), Decimal("1.1")) == 0
    assert compare(BooleanType(), False, True) == -1
    assert compare(LongType(), 5, 5) == 0
    with pytest.raises(ValidationError, match="no order"):
        compare(VariantType(), 1, 2)
    with pytest.raises(ValidationError, match="null"):
        compare(IntegerType(), None, 1)
    with pytest.raises(ValidationError, match="cannot compare"):
        compare(IntegerType(), "a", 1)


# -- metrics truncation ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "width", "lower", "upper"),
    [
        ("iceberg", 3, "ice", "icf"),
        ("ice", 3, "ice", "ice"),
        ("ic", 3, "ic", "ic"),
        ("ab\U0010ffff\U0010ffffz", 4, "ab\U0010ffff\U0010ffff", "ac"),
        ("a\ud7ffz", 2, "a\ud7ff", "a\ue000"),  # the surrogate block is skipped
        ("\U0010ffff\U0010ffffz", 2, "\U0010ffff\U0010ffff", None),
        ("\U0001f600\U0001f600\U0001f600", 2, "\U0001f600\U0001f600", "\U0001f600\U0001f601"),
    ],
)
def test_string_truncation(value: str, width: int, lower: str, upper: str | None) -> None:
    assert truncate_lower_bound(StringType(), value, width) == lower
    assert truncate_upper_bound(StringType(), value, width) == upper


@pytest.mark.parametrize(
    ("value", "width", "lower", "upper"),
    [
        (b"\x01\x02\x03", 2, b"\x01\x02", b"\x01\x03"),
        (b"\x01\xff\x03", 2, b"\x01\xff", b"\x02"),
        (b"\xff\xff\x03", 2, b"\xff\xff", None),
        (b"\x01", 2, b"\x01", b"\x01"),
    ],
)
def test_binary_truncation(value: bytes, width: int, lower: bytes, upper: bytes | None) -> None:
    for t in (BinaryType(), FixedType(len(value))):
        assert truncate_lower_bound(t, value, width) == lower
        assert truncate_upper_bound(t, value, width) == upper


@settings(max_examples=examples(200))
@given(values=st.lists(st.text(min_size=1), min_size=1, max_size=5), width=st.integers(1, 4))
def test_truncated_string_bounds_still_bound(values: list[str], width: int) -> None:
    t = StringType()
    lower = truncate_lower_bound(t, min(values), width)
    upper = truncate_upper_bound(t, max(values), width)
    assert len(lower) <= width
    assert all(compare(t, lower, v) <= 0 for v in values)
    if upper is not None:
        assert len(upper) <= width
        assert all(compare(t, upper, v) >= 0 for v in values)
        upper.encode("utf-8")  # never a lone surrogate
    else:
        assert all(ch == "\U0010ffff" for ch in max(values)[:width])


@settings(max_examples=examples(200))
@given(values=st.lists(st.binary(min_size=1), min_size=1, max_size=5), width=st.integers(1, 4))
def test_truncated_binary_bounds_still_bound(values: list[bytes], width: int) -> None:
    t = BinaryType()
    lower = truncate_lower_bound(t, min(values), width)
    upper = truncate_upper_bound(t, max(values), width)
    assert len(lower) <= width and all(lower <= v for v in values)
    if upper is None:
        assert max(values)[:width] == b"\xff" * len(max(values)[:width])
    else:
        assert len(upper) <= width and all(upper >= v for v in values)


def test_truncation_leaves_fixed_size_types_alone() -> None:
    assert truncate_lower_bound(LongType(), 12345, 2) == 12345
    assert truncate_upper_bound(DecimalType(9, 2), Decimal("1.00"), 1) == Decimal("1.00")
    with pytest.raises(ValidationError, match="width"):
        truncate_upper_bound(StringType(), "abc", 0)


# -- conversions -----------------------------------------------------------------------------


@settings(max_examples=examples(100))
@given(day=st.dates())
def test_date_conversions(day: dt.date) -> None:
    days = date_to_days(day)
    assert days_to_date(days) == day
    assert days == (day - dt.date(1970, 1, 1)).days


@settings(max_examples=examples(100))
@given(moment=st.datetimes(), aware=st.booleans())
def test_datetime_conversions(moment: dt.datetime, aware: bool) -> None:
    value = moment.replace(tzinfo=dt.UTC) if aware else moment
    micros = datetime_to_micros(value)
    assert micros_to_datetime(micros, tz=aware) == value
    assert micros_to_datetime(micros, tz=aware).tzinfo == (dt.UTC if aware else None)


def test_aware_datetimes_convert_to_utc() -> None:
    plus_two = dt.timezone(dt.timedelta(hours=2))
    assert datetime_to_micros(dt.datetime(1970, 1, 1, 2, tzinfo=plus_two)) == 0


@settings(max_examples=examples(100))
@given(moment=st.times())
def test_time_conversions(moment: dt.time) -> None:
    micros = time_to_micros(moment)
    assert 0 <= micros < MICROS_PER_DAY
    assert micros_to_time(micros) == moment


def test_conversion_errors() -> None:
    with pytest.raises(ValidationError, match=r"1\.\.9999"):
        days_to_date(2**31 - 1)
    with pytest.raises(ValidationError, match=r"1\.\.9999"):
        micros_to_datetime(2**63 - 1, tz=False)
    with pytest.raises(ValidationError, match="since midnight"):
        micros_to_time(MICROS_PER_DAY)
    with pytest.raises(ValidationError, match=r"datetime\.date"):
        date_to_days(dt.datetime(2020, 1, 1))  # a datetime would silently lose its time
    with pytest.raises(ValidationError, match=r"datetime\.datetime"):
        datetime_to_micros(dt.date(2020, 1, 1))  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match=r"datetime\.time"):
        time_to_micros(3)  # type: ignore[arg-type]
