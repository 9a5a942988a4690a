"""Single values in the two serialized forms of the spec's Appendix D, plus their ordering.

The binary form is what column bounds in manifests hold; the JSON form is what field defaults,
expression literals and REST payloads hold. Both map to and from the internal value
representation described in :mod:`icefloe.spec.types` (dates as int days, timestamps as int micros
or nanos, decimals as :class:`decimal.Decimal`, ...), so everything above this module only ever
sees one representation.

Encoding runs once per column per data file when manifests are written, so dispatch is a dict
lookup on the type's class followed by a precompiled :class:`struct.Struct` call, with no chain
of ``isinstance`` tests. Dates and timestamps are formatted with integer calendar arithmetic
rather than :mod:`datetime`, because Iceberg's ranges (int32 days, int64 micros) reach far
beyond Python's years 1..9999 and a valid table must never fail to serialize.

Why one module past 800 lines: the binary form, the JSON form and the ordering are three
tables over the same types, dispatched the same way; one module keeps every type in all three.
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
import re
import struct
import uuid
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

from icefloe.errors import ValidationError
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

_I32 = struct.Struct("<i")
_I64 = struct.Struct("<q")
_F32 = struct.Struct("<f")
_F64 = struct.Struct("<d")

_INT_MIN, _INT_MAX = -(2**31), 2**31 - 1
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1
_MICROS_PER_SECOND = 1_000_000
_NANOS_PER_SECOND = 1_000_000_000
_MICROS_PER_DAY = 86_400 * _MICROS_PER_SECOND
_NANOS_PER_DAY = 86_400 * _NANOS_PER_SECOND
# 38 digits of precision need at most 16 bytes of two's complement.
_MAX_DECIMAL_BYTES = 16

# Exact arithmetic for rescaling decimals: wide enough for 38 digits plus headroom, and any
# rounding is an error rather than a silent change of a bound or a default.
_DECIMAL_CONTEXT = decimal.Context(
    prec=2 * 38,
    Emax=decimal.MAX_EMAX,
    Emin=decimal.MIN_EMIN,
    traps=[decimal.Inexact, decimal.InvalidOperation, decimal.Overflow],
)

_EPOCH_DATE = dt.date(1970, 1, 1)
_EPOCH_ORDINAL = _EPOCH_DATE.toordinal()
_EPOCH_NAIVE = dt.datetime(1970, 1, 1)
_EPOCH_UTC = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)

Encoder = Callable[[Any, Any], bytes]
Decoder = Callable[[Any, bytes], Any]


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def _invalid(t: IcebergType, value: Any, reason: str) -> ValidationError:
    return ValidationError(f"invalid {t} value {_show(value)}: {reason}")


def _bad_length(t: IcebergType, data: bytes, expected: str) -> ValidationError:
    return ValidationError(
        f"cannot decode a bound of type {t} from {len(data)} bytes ({bytes(data[:32]).hex()}): "
        f"expected {expected}"
    )


# ---------------------------------------------------------------------------------------------
# Calendar arithmetic (proleptic Gregorian, any year) and the conversions of the contract
# ---------------------------------------------------------------------------------------------


def _days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date, for any year (H. Hinnant)."""
    year -= month <= 2
    era = year // 400
    yoe = year - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146_097 + doe - 719_468


def _civil_from_days(days: int) -> tuple[int, int, int]:
    """Inverse of :func:`_days_from_civil`."""
    z = days + 719_468
    era = z // 146_097
    doe = z - era * 146_097
    yoe = (doe - doe // 1460 + doe // 36_524 - doe // 146_096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = mp + 3 if mp < 10 else mp - 9
    return yoe + era * 400 + (month <= 2), month, day


def _days_in_month(year: int, month: int) -> int:
    if month == 2:
        return 29 if year % 4 == 0 and (year % 100 != 0 or year % 400 == 0) else 28
    return 30 if month in (4, 6, 9, 11) else 31


def days_to_date(days: int) -> dt.date:
    """Days since epoch to a :class:`datetime.date` (years 1..9999 only, Python's range)."""
    try:
        return dt.date.fromordinal(days + _EPOCH_ORDINAL)
    except (OverflowError, ValueError, TypeError):
        raise ValidationError(
            f"date value {_show(days)} (days since 1970-01-01) cannot be represented as a "
            "Python date, which only covers years 1..9999"
        ) from None


def date_to_days(value: dt.date) -> int:
    """A :class:`datetime.date` to days since epoch."""
    if isinstance(value, dt.datetime) or not isinstance(value, dt.date):
        raise ValidationError(f"expected a datetime.date, got {_show(value)}")
    return value.toordinal() - _EPOCH_ORDINAL


def micros_to_datetime(micros: int, tz: bool) -> dt.datetime:
    """Micros since epoch to a datetime: UTC-aware when ``tz`` (timestamptz), else naive."""
    try:
        delta = dt.timedelta(microseconds=micros)
        return (_EPOCH_UTC if tz else _EPOCH_NAIVE) + delta
    except (OverflowError, TypeError):
        raise ValidationError(
            f"timestamp value {_show(micros)} (microseconds since epoch) cannot be represented "
            "as a Python datetime, which only covers years 1..9999"
        ) from None


def datetime_to_micros(value: dt.datetime) -> int:
    """A datetime to micros since epoch; aware values are converted to UTC, naive kept as is."""
    if not isinstance(value, dt.datetime):
        raise ValidationError(f"expected a datetime.datetime, got {_show(value)}")
    delta = value - (_EPOCH_NAIVE if value.utcoffset() is None else _EPOCH_UTC)
    return (delta.days * 86_400 + delta.seconds) * _MICROS_PER_SECOND + delta.microseconds


def micros_to_time(micros: int) -> dt.time:
    """Micros since midnight to a :class:`datetime.time`."""
    if not isinstance(micros, int) or not 0 <= micros < _MICROS_PER_DAY:
        raise ValidationError(
            f"time value {_show(micros)} must be microseconds since midnight "
            f"in [0, {_MICROS_PER_DAY})"
        )
    seconds, micro = divmod(micros, _MICROS_PER_SECOND)
    minutes, second = divmod(seconds, 60)
    hour, minute = divmod(minutes, 60)
    return dt.time(hour, minute, second, micro)


def time_to_micros(value: dt.time) -> int:
    """A :class:`datetime.time` to micros since midnight (any tzinfo is ignored)."""
    if not isinstance(value, dt.time):
        raise ValidationError(f"expected a datetime.time, got {_show(value)}")
    return (
        (value.hour * 60 + value.minute) * 60 + value.second
    ) * _MICROS_PER_SECOND + value.microsecond


# ---------------------------------------------------------------------------------------------
# Decimals
# ---------------------------------------------------------------------------------------------


def _unscaled(t: DecimalType, value: Any) -> int:
    """The unscaled integer of ``value`` at the type's scale; refuses rounding and overflow."""
    if not isinstance(value, Decimal):
        if not isinstance(value, int) or isinstance(value, bool):
            raise _invalid(t, value, "expected a decimal.Decimal")
        value = Decimal(value)
    if not value.is_finite():
        raise _invalid(t, value, "NaN and infinity are not decimal values")
    try:
        scaled = value.scaleb(t.scale, _DECIMAL_CONTEXT)
    except decimal.DecimalException:
        raise _invalid(t, value, f"needs more than {t.precision} digits of precision") from None
    # Checked before int() so that an absurd exponent cannot build a giant integer.
    if scaled and scaled.adjusted() >= t.precision:
        raise _invalid(t, value, f"needs more than {t.precision} digits of precision")
    unscaled = int(scaled)
    if scaled != unscaled:
        raise _invalid(t, value, f"has more than {t.scale} digits after the decimal point")
    return unscaled


def _decimal_from_unscaled(unscaled: int, scale: int) -> Decimal:
    return Decimal(unscaled).scaleb(-scale, _DECIMAL_CONTEXT)


def _format_decimal(t: DecimalType, unscaled: int) -> str:
    scale = t.scale
    if scale < 0:
        # Scientific notation whose exponent reflects the negative scale ("2E+20").
        return str(_decimal_from_unscaled(unscaled, scale))
    digits = str(abs(unscaled)).rjust(scale + 1, "0")
    sign = "-" if unscaled < 0 else ""
    if scale == 0:
        return sign + digits
    return f"{sign}{digits[:-scale]}.{digits[-scale:]}"


# ---------------------------------------------------------------------------------------------
# Binary single-value form
# ---------------------------------------------------------------------------------------------


def _bool_to_bytes(t: Any, v: Any) -> bytes:
    if v is True:
        return b"\x01"
    if v is False:
        return b"\x00"
    raise _invalid(t, v, "expected a bool")


def _packer(packer: struct.Struct, what: str) -> Encoder:
    pack = packer.pack

    def encode(t: Any, v: Any) -> bytes:
        try:
            return pack(v)
        except (struct.error, OverflowError, TypeError):
            raise _invalid(t, v, f"expected {what}") from None

    return encode


def _time_to_bytes(t: Any, v: Any) -> bytes:
    if isinstance(v, int) and 0 <= v < _MICROS_PER_DAY:
        return _I64.pack(v)
    raise _invalid(t, v, f"expected microseconds since midnight in [0, {_MICROS_PER_DAY})")


def _string_to_bytes(t: Any, v: Any) -> bytes:
    if not isinstance(v, str):
        raise _invalid(t, v, "expected a str")
    try:
        return v.encode("utf-8")
    except UnicodeEncodeError as e:
        raise _invalid(t, v, f"not encodable as UTF-8 ({e.reason})") from None


def _uuid_to_bytes(t: Any, v: Any) -> bytes:
    if not isinstance(v, uuid.UUID):
        raise _invalid(t, v, "expected a uuid.UUID")
    return v.bytes


def _fixed_to_bytes(t: FixedType, v: Any) -> bytes:
    if not isinstance(v, bytes | bytearray | memoryview):
        raise _invalid(t, v, "expected bytes")
    if len(v) != t.length:
        raise _invalid(t, v, f"has {len(v)} bytes, expected exactly {t.length}")
    return bytes(v)


def _binary_to_bytes(t: Any, v: Any) -> bytes:
    if not isinstance(v, bytes | bytearray | memoryview):
        raise _invalid(t, v, "expected bytes")
    return bytes(v)


def _decimal_to_bytes(t: DecimalType, v: Any) -> bytes:
    unscaled = _unscaled(t, v)
    # Minimum two's-complement length: magnitude bits (of ~x for negatives) plus a sign bit.
    size = (~unscaled if unscaled < 0 else unscaled).bit_length() // 8 + 1
    return unscaled.to_bytes(size, "big", signed=True)


_TO_BYTES: dict[type, Encoder] = {
    BooleanType: _bool_to_bytes,
    IntegerType: _packer(_I32, "an integer in the 32-bit range"),
    LongType: _packer(_I64, "an integer in the 64-bit range"),
    FloatType: _packer(_F32, "a number within the 32-bit float range"),
    DoubleType: _packer(_F64, "a float"),
    DateType: _packer(_I32, "days since 1970-01-01 as a 32-bit integer"),
    TimeType: _time_to_bytes,
    TimestampType: _packer(_I64, "microseconds since epoch as a 64-bit integer"),
    TimestamptzType: _packer(_I64, "microseconds since epoch as a 64-bit integer"),
    TimestampNanoType: _packer(_I64, "nanoseconds since epoch as a 64-bit integer"),
    TimestamptzNanoType: _packer(_I64, "nanoseconds since epoch as a 64-bit integer"),
    StringType: _string_to_bytes,
    UUIDType: _uuid_to_bytes,
    FixedType: _fixed_to_bytes,
    BinaryType: _binary_to_bytes,
    DecimalType: _decimal_to_bytes,
    # Bounds of geo types are packed points that the metrics writer builds; pass them through.
    GeometryType: _binary_to_bytes,
    GeographyType: _binary_to_bytes,
}


def _no_binary_form(t: IcebergType) -> ValidationError:
    return ValidationError(
        f"type {t} has no binary single-value form (spec Appendix D): "
        "it cannot be stored as a bound"
    )


def to_bytes(t: PrimitiveType, v: Any) -> bytes:
    """Serialize an internal value to its Appendix D binary form (as stored in bounds)."""
    encode = _TO_BYTES.get(type(t))
    if encode is None:
        raise _no_binary_form(t)
    if v is None:
        raise ValidationError(f"cannot serialize a null {t} value to bytes: bounds are never null")
    return encode(t, v)


def _bool_from_bytes(t: Any, data: bytes) -> bool:
    if len(data) != 1:
        raise _bad_length(t, data, "1")
    return data[0] != 0


def _unpacker(packer: struct.Struct) -> Decoder:
    unpack = packer.unpack
    size = packer.size

    def decode(t: Any, data: bytes) -> Any:
        if len(data) != size:
            raise _bad_length(t, data, str(size))
        return unpack(data)[0]

    return decode


def _promoted_unpacker(wide: struct.Struct, narrow: struct.Struct, narrow_name: str) -> Decoder:
    """A decoder for a type promoted from ``narrow_name`` (int → long, float → double).

    Bounds written while the column was still the narrow type keep their 4 bytes.
    """
    wide_unpack = wide.unpack
    narrow_unpack = narrow.unpack
    expected = f"8 (or 4 for a bound written as {narrow_name})"

    def decode(t: Any, data: bytes) -> Any:
        n = len(data)
        if n == 8:
            return wide_unpack(data)[0]
        if n == 4:
            return narrow_unpack(data)[0]
        raise _bad_length(t, data, expected)

    return decode


_long_from_bytes = _promoted_unpacker(_I64, _I32, "int")
_double_from_bytes = _promoted_unpacker(_F64, _F32, "float")


def _time_from_bytes(t: Any, data: bytes) -> int:
    if len(data) != 8:
        raise _bad_length(t, data, "8")
    value: int = _I64.unpack(data)[0]
    if not 0 <= value < _MICROS_PER_DAY:
        raise ValidationError(
            f"cannot decode a bound of type {t}, {bytes(data).hex()}: {value} is not in [0, {_MICROS_PER_DAY})"
        )
    return value


def _promoting_timestamp_decoder(per_day: int) -> Decoder:
    def decode(t: Any, data: bytes) -> int:
        n = len(data)
        if n == 8:
            return _I64.unpack(data)[0]
        if n == 4:  # written while the column was still a date
            value: int = _I32.unpack(data)[0] * per_day
            if not _LONG_MIN <= value <= _LONG_MAX:
                raise ValidationError(
                    f"cannot decode a bound of type {t}, {bytes(data).hex()}: the date bound "
                    f"{_I32.unpack(data)[0]} (days) is outside the range of {t}"
                )
            return value
        raise _bad_length(t, data, "8 (or 4 for a bound written as date)")

    return decode


def _string_from_bytes(t: Any, data: bytes) -> str:
    try:
        return str(data, "utf-8")
    except UnicodeDecodeError as e:
        raise ValidationError(
            f"cannot decode a bound of type {t}, {bytes(data[:32]).hex()}: invalid UTF-8 ({e.reason})"
        ) from None


def _uuid_from_bytes(t: Any, data: bytes) -> uuid.UUID:
    if len(data) != 16:
        raise _bad_length(t, data, "16")
    return uuid.UUID(bytes=bytes(data))


def _fixed_from_bytes(t: FixedType, data: bytes) -> bytes:
    # Writers may truncate fixed bounds like binary ones, so a shorter prefix is accepted.
    if not 0 < len(data) <= t.length:
        raise _bad_length(t, data, f"1 to {t.length}")
    return bytes(data)


def _binary_from_bytes(t: Any, data: bytes) -> bytes:
    return bytes(data)


def _decimal_from_bytes(t: DecimalType, data: bytes) -> Decimal:
    # Any length is legal: a bound written before precision was widened is shorter.
    if not 0 < len(data) <= _MAX_DECIMAL_BYTES:
        raise _bad_length(t, data, f"1 to {_MAX_DECIMAL_BYTES}")
    unscaled = int.from_bytes(data, "big", signed=True)
    if abs(unscaled) >= 10**t.precision:
        raise ValidationError(
            f"cannot decode a bound of type {t}, {bytes(data).hex()}: unscaled value {unscaled} has "
            f"more than {t.precision} digits"
        )
    return _decimal_from_unscaled(unscaled, t.scale)


_FROM_BYTES: dict[type, Decoder] = {
    BooleanType: _bool_from_bytes,
    IntegerType: _unpacker(_I32),
    LongType: _long_from_bytes,
    FloatType: _unpacker(_F32),
    DoubleType: _double_from_bytes,
    DateType: _unpacker(_I32),
    TimeType: _time_from_bytes,
    TimestampType: _promoting_timestamp_decoder(_MICROS_PER_DAY),
    TimestamptzType: _unpacker(_I64),
    TimestampNanoType: _promoting_timestamp_decoder(_NANOS_PER_DAY),
    TimestamptzNanoType: _unpacker(_I64),
    StringType: _string_from_bytes,
    UUIDType: _uuid_from_bytes,
    FixedType: _fixed_from_bytes,
    BinaryType: _binary_from_bytes,
    DecimalType: _decimal_from_bytes,
    GeometryType: _binary_from_bytes,
    GeographyType: _binary_from_bytes,
}


def from_bytes(t: PrimitiveType, data: bytes) -> Any:
    """Decode an Appendix D binary value (a bound) into the internal representation of ``t``.

    ``t`` is the column's current type. Bounds are never rewritten on type promotion, so the
    type at write time is inferred from the length as in the spec's "Schema Evolution"
    table (a 4-byte ``long`` bound was an ``int``, ...) and the value is widened to ``t``.
    """
    decode = _FROM_BYTES.get(type(t))
    if decode is None:
        raise _no_binary_form(t)
    return decode(t, data)


# ---------------------------------------------------------------------------------------------
# Text forms of dates and times (shared by JSON and human strings)
# ---------------------------------------------------------------------------------------------


def _format_year(year: int) -> str:
    # ISO 8601 expanded years, as java.time prints them: a sign outside 0000..9999.
    if 0 <= year <= 9999:
        return f"{year:04d}"
    return f"+{year}" if year > 0 else f"-{-year:04d}"


def _format_date(days: int) -> str:
    year, month, day = _civil_from_days(days)
    return f"{_format_year(year)}-{month:02d}-{day:02d}"


def _format_time_of_day(value: int, units_per_second: int, digits: int) -> str:
    seconds, fraction = divmod(value, units_per_second)
    minutes, second = divmod(seconds, 60)
    hour, minute = divmod(minutes, 60)
    return f"{hour:02d}:{minute:02d}:{second:02d}.{fraction:0{digits}d}"


def _format_timestamp(value: int, units_per_second: int, digits: int, suffix: str) -> str:
    days, rest = divmod(value, 86_400 * units_per_second)
    time_part = _format_time_of_day(rest, units_per_second, digits)
    return f"{_format_date(days)}T{time_part}{suffix}"


_DATE_PATTERN = r"([+-][0-9]{4,}|[0-9]{4})-([0-9]{2})-([0-9]{2})"
_TIME_PATTERN = r"([0-9]{2}):([0-9]{2})(?::([0-9]{2})(?:\.([0-9]{1,9}))?)?"
_DATE_RE = re.compile(_DATE_PATTERN)
_TIME_RE = re.compile(_TIME_PATTERN)
_TIMESTAMP_RE = re.compile(_DATE_PATTERN + "T" + _TIME_PATTERN + r"(Z|[+-][0-9]{2}:[0-9]{2})?")


def _parse_days(t: IcebergType, text: str, year: str, month: str, day: str) -> int:
    y, m, d = int(year), int(month), int(day)
    if not 1 <= m <= 12 or not 1 <= d <= _days_in_month(y, m):
        raise _invalid(t, text, "no such calendar date")
    return _days_from_civil(y, m, d)


def _parse_time_of_day(
    t: IcebergType,
    text: str,
    hour: str,
    minute: str,
    second: str | None,
    fraction: str | None,
    digits: int,
) -> int:
    h, m, s = int(hour), int(minute), int(second or 0)
    if h > 23 or m > 59 or s > 59:
        raise _invalid(t, text, "hour, minute or second out of range")
    units = 0
    if fraction:
        if len(fraction) > digits:
            raise _invalid(t, text, f"more than {digits} fractional digits of seconds")
        units = int(fraction.ljust(digits, "0"))
    return ((h * 60 + m) * 60 + s) * 10**digits + units


def _require_str(t: IcebergType, obj: Any, example: str) -> str:
    if not isinstance(obj, str):
        raise _invalid(t, obj, f"expected a JSON string like {example}")
    return obj


# ---------------------------------------------------------------------------------------------
# JSON single-value form
# ---------------------------------------------------------------------------------------------

JsonEncoder = Callable[[Any, Any], Any]
JsonDecoder = Callable[[Any, Any], Any]


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _bool_to_json(t: Any, v: Any) -> bool:
    if not isinstance(v, bool):
        raise _invalid(t, v, "expected a bool")
    return v


def _bool_from_json(t: Any, obj: Any) -> bool:
    if not isinstance(obj, bool):
        raise _invalid(t, obj, "expected a JSON boolean")
    return obj


def _ranged_int(low: int, high: int, what: str) -> JsonEncoder:
    def convert(t: Any, v: Any) -> int:
        if not _is_int(v):
            raise _invalid(t, v, f"expected {what}")
        if not low <= v <= high:
            raise _invalid(t, v, f"outside the {what} range [{low}, {high}]")
        return int(v)

    return convert


def _float_json(t: Any, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise _invalid(t, v, "expected a number")
    try:
        value = float(v)
        if isinstance(t, FloatType) and math.isfinite(value):
            _F32.pack(value)
    except OverflowError:
        raise _invalid(t, v, f"outside the range of {t}") from None
    return value


def _decimal_to_json(t: DecimalType, v: Any) -> str:
    return _format_decimal(t, _unscaled(t, v))


_DECIMAL_TEXT_RE = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def _decimal_from_json(t: DecimalType, obj: Any) -> Decimal:
    text = _require_str(t, obj, '"14.20"')
    if not _DECIMAL_TEXT_RE.fullmatch(text):
        raise _invalid(t, obj, "not a decimal number")
    value = Decimal(text)
    _, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)  # the pattern admits no NaN or infinity
    if exponent != -t.scale:
        raise _invalid(
            t,
            obj,
            f"has scale {-exponent}, expected {t.scale} (the scale is written out: "
            "digits after the point, or an exponent equal to the negated scale)",
        )
    if len(digits) > t.precision:
        raise _invalid(t, obj, f"has {len(digits)} digits, more than precision {t.precision}")
    return value


def _date_to_json(t: Any, v: Any) -> str:
    if not _is_int(v) or not _INT_MIN <= v <= _INT_MAX:
        raise _invalid(t, v, "expected days since 1970-01-01 as a 32-bit integer")
    return _format_date(v)


def _date_from_json(t: Any, obj: Any) -> int:
    text = _require_str(t, obj, '"2017-11-16"')
    match = _DATE_RE.fullmatch(text)
    if match is None:
        raise _invalid(t, obj, "expected an ISO-8601 date like 2017-11-16")
    days = _parse_days(t, text, *match.groups())
    if not _INT_MIN <= days <= _INT_MAX:
        raise _invalid(t, obj, "outside the date range (32-bit days since 1970-01-01)")
    return days


def _time_to_json(t: Any, v: Any) -> str:
    if not _is_int(v) or not 0 <= v < _MICROS_PER_DAY:
        raise _invalid(t, v, f"expected microseconds since midnight in [0, {_MICROS_PER_DAY})")
    return _format_time_of_day(v, _MICROS_PER_SECOND, 6)


def _time_from_json(t: Any, obj: Any) -> int:
    text = _require_str(t, obj, '"22:31:08.123456"')
    match = _TIME_RE.fullmatch(text)
    if match is None:
        raise _invalid(t, obj, "expected an ISO-8601 time like 22:31:08.123456")
    hour, minute, second, fraction = match.groups()
    return _parse_time_of_day(t, text, hour, minute, second, fraction, 6)


def _timestamp_codec(units_per_second: int, digits: int, zoned: bool) -> tuple[Any, Any]:
    suffix = "+00:00" if zoned else ""
    example = "2017-11-16T22:31:08." + "123456789"[:digits] + suffix
    unit = "microseconds" if digits == 6 else "nanoseconds"

    def to_json(t: Any, v: Any) -> str:
        if not _is_int(v) or not _LONG_MIN <= v <= _LONG_MAX:
            raise _invalid(t, v, f"expected {unit} since epoch as a 64-bit integer")
        return _format_timestamp(v, units_per_second, digits, suffix)

    def from_json(t: Any, obj: Any) -> int:
        text = _require_str(t, obj, f'"{example}"')
        match = _TIMESTAMP_RE.fullmatch(text)
        if match is None:
            raise _invalid(t, obj, f"expected an ISO-8601 timestamp like {example}")
        year, month, day, hour, minute, second, fraction, offset = match.groups()
        if zoned and offset != "+00:00":
            raise _invalid(t, obj, "must end with the UTC offset +00:00")
        if not zoned and offset is not None:
            raise _invalid(t, obj, f"{t} must not carry a zone offset")
        days = _parse_days(t, text, year, month, day)
        tod = _parse_time_of_day(t, text, hour, minute, second, fraction, digits)
        value = days * 86_400 * units_per_second + tod
        if not _LONG_MIN <= value <= _LONG_MAX:
            raise _invalid(t, obj, f"outside the range of {t} (64-bit {unit} since epoch)")
        return value

    return to_json, from_json


def _string_to_json(t: Any, v: Any) -> str:
    if not isinstance(v, str):
        raise _invalid(t, v, "expected a str")
    return v


def _string_from_json(t: Any, obj: Any) -> str:
    return _require_str(t, obj, '"iceberg"')


def _uuid_to_json(t: Any, v: Any) -> str:
    if not isinstance(v, uuid.UUID):
        raise _invalid(t, v, "expected a uuid.UUID")
    return str(v)


_UUID_RE = re.compile(
    r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
)


def _uuid_from_json(t: Any, obj: Any) -> uuid.UUID:
    text = _require_str(t, obj, '"f79c3e09-677c-4bbd-a479-3f349cb785e7"')
    if not _UUID_RE.fullmatch(text):
        raise _invalid(
            t, obj, "expected a hyphenated UUID like f79c3e09-677c-4bbd-a479-3f349cb785e7"
        )
    return uuid.UUID(text)


def _fixed_to_json(t: FixedType, v: Any) -> str:
    return _fixed_to_bytes(t, v).hex()


def _binary_to_json(t: Any, v: Any) -> str:
    return _binary_to_bytes(t, v).hex()


_HEX_RE = re.compile(r"(?:[0-9a-fA-F]{2})*")


def _hex_from_json(t: Any, obj: Any) -> bytes:
    text = _require_str(t, obj, '"000102ff"')
    if not _HEX_RE.fullmatch(text):
        raise _invalid(t, obj, "expected an even number of hexadecimal digits")
    return bytes.fromhex(text)


def _fixed_from_json(t: FixedType, obj: Any) -> bytes:
    data = _hex_from_json(t, obj)
    if len(data) != t.length:
        raise _invalid(t, obj, f"has {len(data)} bytes, expected exactly {t.length}")
    return data


def _null_only(t: Any, v: Any) -> Any:
    if isinstance(t, GeometryType | GeographyType):
        reason = "icefloe keeps geospatial values as WKB and does not convert them to WKT"
    else:
        reason = f"{t} values have no JSON single-value form other than null"
    raise _invalid(t, v, reason)


def _with_context(context: str, error: ValidationError) -> ValidationError:
    return ValidationError(f"{context}: {error}")


def _struct_to_json(t: StructType, v: Any) -> dict[str, Any]:
    if not isinstance(v, Mapping):
        raise _invalid(t, v, "expected a dict from field id to value")
    out: dict[str, Any] = {}
    for f in t.fields:
        if f.field_id in v:
            item = v[f.field_id]
            if item is None and f.required:
                raise _invalid(t, v, f"required field {f.field_id} ({f.name}) is null")
            try:
                out[str(f.field_id)] = to_json_value(f.field_type, item)
            except ValidationError as e:
                raise _with_context(f"struct field {f.field_id} ({f.name})", e) from None
    if len(out) != len(v):
        unknown = sorted((k for k in v if not (_is_int(k) and t.field(k))), key=repr)
        raise _invalid(t, v, f"keys {unknown!r} are not field ids of the struct")
    return out


def _struct_from_json(t: StructType, obj: Any) -> dict[int, Any]:
    if not isinstance(obj, dict):
        raise _invalid(t, obj, 'expected a JSON object keyed by field id, like {"1": 1}')
    out: dict[int, Any] = {}
    for key, item in obj.items():
        f = t.field(int(key)) if isinstance(key, str) and key.isascii() and key.isdigit() else None
        if f is None:
            raise _invalid(t, obj, f"key {key!r} is not the id of a field of the struct")
        if item is None and f.required:
            raise _invalid(t, obj, f"required field {f.field_id} ({f.name}) is null")
        try:
            out[f.field_id] = from_json_value(f.field_type, item)
        except ValidationError as e:
            raise _with_context(f"struct field {f.field_id} ({f.name})", e) from None
    return out


def _list_to_json(t: ListType, v: Any) -> list[Any]:
    if not isinstance(v, list | tuple):
        raise _invalid(t, v, "expected a list")
    return _elements(t, v, to_json_value)


def _list_from_json(t: ListType, obj: Any) -> list[Any]:
    if not isinstance(obj, list):
        raise _invalid(t, obj, "expected a JSON array")
    return _elements(t, obj, from_json_value)


def _elements(
    t: ListType, items: list[Any] | tuple[Any, ...], convert: Callable[[Any, Any], Any]
) -> list[Any]:
    element_type, required = t.element_type, t.element_required
    out = []
    for index, item in enumerate(items):
        if item is None and required:
            raise _invalid(t, items, f"element {index} is null but elements are required")
        try:
            out.append(convert(element_type, item))
        except ValidationError as e:
            raise _with_context(f"list element {index}", e) from None
    return out


def _map_to_json(t: MapType, v: Any) -> dict[str, list[Any]]:
    if not isinstance(v, Mapping):
        raise _invalid(t, v, "expected a dict")
    keys, values = [], []
    for key, item in v.items():
        if key is None:
            raise _invalid(t, v, "map keys must not be null")
        if item is None and t.value_required:
            raise _invalid(t, v, f"value for key {_show(key)} is null but values are required")
        try:
            keys.append(to_json_value(t.key_type, key))
            values.append(to_json_value(t.value_type, item))
        except ValidationError as e:
            raise _with_context(f"map entry {_show(key)}", e) from None
    return {"keys": keys, "values": values}


def _map_from_json(t: MapType, obj: Any) -> dict[Any, Any]:
    if not isinstance(obj, dict) or set(obj) != {"keys", "values"}:
        raise _invalid(t, obj, 'expected a JSON object {"keys": [...], "values": [...]}')
    keys, values = obj["keys"], obj["values"]
    if not isinstance(keys, list) or not isinstance(values, list) or len(keys) != len(values):
        raise _invalid(t, obj, '"keys" and "values" must be JSON arrays of the same length')
    out: dict[Any, Any] = {}
    for index, (key_obj, value_obj) in enumerate(zip(keys, values)):
        if key_obj is None:
            raise _invalid(t, obj, f"key {index} is null; map keys must not be null")
        if value_obj is None and t.value_required:
            raise _invalid(t, obj, f"value {index} is null but values are required")
        try:
            key = from_json_value(t.key_type, key_obj)
            value = from_json_value(t.value_type, value_obj)
        except ValidationError as e:
            raise _with_context(f"map entry {index}", e) from None
        try:
            duplicate = key in out
        except TypeError:
            raise _invalid(t, obj, f"keys of type {t.key_type} cannot be map keys here") from None
        if duplicate:
            raise _invalid(t, obj, f"duplicate key {_show(key_obj)}")
        out[key] = value
    return out


_ts_to_json, _ts_from_json = _timestamp_codec(_MICROS_PER_SECOND, 6, zoned=False)
_tstz_to_json, _tstz_from_json = _timestamp_codec(_MICROS_PER_SECOND, 6, zoned=True)
_tsns_to_json, _tsns_from_json = _timestamp_codec(_NANOS_PER_SECOND, 9, zoned=False)
_tstzns_to_json, _tstzns_from_json = _timestamp_codec(_NANOS_PER_SECOND, 9, zoned=True)

_TO_JSON: dict[type, JsonEncoder] = {
    BooleanType: _bool_to_json,
    IntegerType: _ranged_int(_INT_MIN, _INT_MAX, "32-bit integer"),
    LongType: _ranged_int(_LONG_MIN, _LONG_MAX, "64-bit integer"),
    FloatType: _float_json,
    DoubleType: _float_json,
    DecimalType: _decimal_to_json,
    DateType: _date_to_json,
    TimeType: _time_to_json,
    TimestampType: _ts_to_json,
    TimestamptzType: _tstz_to_json,
    TimestampNanoType: _tsns_to_json,
    TimestamptzNanoType: _tstzns_to_json,
    StringType: _string_to_json,
    UUIDType: _uuid_to_json,
    FixedType: _fixed_to_json,
    BinaryType: _binary_to_json,
    StructType: _struct_to_json,
    ListType: _list_to_json,
    MapType: _map_to_json,
    UnknownType: _null_only,
    VariantType: _null_only,
    GeometryType: _null_only,
    GeographyType: _null_only,
}

_FROM_JSON: dict[type, JsonDecoder] = {
    BooleanType: _bool_from_json,
    IntegerType: _TO_JSON[IntegerType],
    LongType: _TO_JSON[LongType],
    FloatType: _float_json,
    DoubleType: _float_json,
    DecimalType: _decimal_from_json,
    DateType: _date_from_json,
    TimeType: _time_from_json,
    TimestampType: _ts_from_json,
    TimestamptzType: _tstz_from_json,
    TimestampNanoType: _tsns_from_json,
    TimestamptzNanoType: _tstzns_from_json,
    StringType: _string_from_json,
    UUIDType: _uuid_from_json,
    FixedType: _fixed_from_json,
    BinaryType: _hex_from_json,
    StructType: _struct_from_json,
    ListType: _list_from_json,
    MapType: _map_from_json,
    UnknownType: _null_only,
    VariantType: _null_only,
    GeometryType: _null_only,
    GeographyType: _null_only,
}


def _unsupported(t: Any) -> ValidationError:
    return ValidationError(f"{t!r} is not an Iceberg type this module can serialize")


def to_json_value(t: IcebergType, v: Any) -> Any:
    """Serialize an internal value to the JSON single-value form (Appendix D); None → null.

    Structs are dicts from field id to value, lists are lists, maps are dicts.
    """
    if v is None:
        return None
    convert = _TO_JSON.get(type(t))
    if convert is None:
        raise _unsupported(t)
    return convert(t, v)


def from_json_value(t: IcebergType, obj: Any) -> Any:
    """Parse a JSON single value (as produced by ``json.loads``) strictly; null → None.

    Structs come back as dicts keyed by int field id holding only the fields present in the
    JSON (absent fields take their own defaults, per the spec); maps come back as dicts.
    """
    if obj is None:
        return None
    convert = _FROM_JSON.get(type(t))
    if convert is None:
        raise _unsupported(t)
    return convert(t, obj)


# ---------------------------------------------------------------------------------------------
# Human-readable strings (partition paths, logs, error messages)
# ---------------------------------------------------------------------------------------------


def _float_human(t: Any, v: Any) -> str:
    value = float(v)
    if isinstance(t, FloatType) and math.isfinite(value):
        # The shortest text that reads back as the same 32-bit float ("0.1", not the
        # double expansion "0.10000000149011612").
        for digits in range(6, 10):
            text = f"{value:.{digits}g}"
            if _F32.pack(float(text)) == _F32.pack(value):
                return repr(float(text))
    return repr(value)


def _bytes_human(t: Any, v: Any) -> str:
    return bytes(v).hex()


_TO_HUMAN: dict[type, Callable[[Any, Any], str]] = {
    BooleanType: lambda t, v: "true" if v else "false",
    IntegerType: lambda t, v: str(int(v)),
    LongType: lambda t, v: str(int(v)),
    FloatType: _float_human,
    DoubleType: _float_human,
    DecimalType: _decimal_to_json,
    DateType: _date_to_json,
    TimeType: _time_to_json,
    TimestampType: _ts_to_json,
    TimestamptzType: _tstz_to_json,
    TimestampNanoType: _tsns_to_json,
    TimestamptzNanoType: _tstzns_to_json,
    StringType: _string_to_json,
    UUIDType: _uuid_to_json,
    FixedType: _bytes_human,
    BinaryType: _bytes_human,
    GeometryType: _bytes_human,
    GeographyType: _bytes_human,
}


def to_human_string(t: PrimitiveType, v: Any) -> str:
    """A readable, unambiguous rendering of a value: ISO dates and times, hex bytes, "null"."""
    if v is None:
        return "null"
    render = _TO_HUMAN.get(type(t))
    if render is None:
        raise ValidationError(f"type {t} has no human-readable single-value form")
    return render(t, v)


# ---------------------------------------------------------------------------------------------
# Ordering and metrics truncation
# ---------------------------------------------------------------------------------------------


def _natural_compare(a: Any, b: Any) -> int:
    return (a > b) - (a < b)


def _float_compare(a: float, b: float) -> int:
    if a < b:
        return -1
    if a > b:
        return 1
    if a == b:
        if a == 0.0:  # -0.0 sorts before +0.0
            sign_a, sign_b = math.copysign(1.0, a), math.copysign(1.0, b)
            return (sign_a > sign_b) - (sign_a < sign_b)
        return 0
    # At least one NaN: NaN sorts after every number and equal to itself.
    return (a != a) - (b != b)


_COMPARATORS: dict[type, Callable[[Any, Any], int]] = {
    **{
        cls: _natural_compare
        for cls in (
            BooleanType,
            IntegerType,
            LongType,
            DecimalType,
            DateType,
            TimeType,
            TimestampType,
            TimestamptzType,
            TimestampNanoType,
            TimestamptzNanoType,
            StringType,  # str order is code point order, which is UTF-8 byte order
            UUIDType,  # uuid.UUID orders as an unsigned 128-bit big-endian integer
            FixedType,  # bytes order is unsigned lexicographic
            BinaryType,
        )
    },
    FloatType: _float_compare,
    DoubleType: _float_compare,
}


def compare(t: PrimitiveType, a: Any, b: Any) -> int:
    """-1, 0 or 1: the total order Iceberg uses for bounds (-0.0 < +0.0, NaN last)."""
    cmp = _COMPARATORS.get(type(t))
    if cmp is None:
        raise ValidationError(f"values of type {t} have no order usable for bounds")
    if a is None or b is None:
        raise ValidationError(f"cannot order a null {t} value ({a!r} vs {b!r})")
    try:
        return cmp(a, b)
    except TypeError:
        raise ValidationError(f"cannot compare {_show(a)} and {_show(b)} as {t}") from None


def _check_width(width: int) -> None:
    if not _is_int(width) or width <= 0:
        raise ValidationError(f"truncation width must be a positive integer, got {width!r}")


def _next_code_point(cp: int) -> int | None:
    cp += 1
    if 0xD800 <= cp <= 0xDFFF:  # surrogates are not characters and cannot be encoded
        cp = 0xE000
    return cp if cp <= 0x10FFFF else None


def truncate_lower_bound(t: PrimitiveType, v: Any, width: int) -> Any:
    """A lower bound of at most ``width`` code points (strings) or bytes (binary, fixed).

    A prefix never sorts after the value, so it is always a valid lower bound. Other types
    are returned unchanged: their bounds are fixed-size.
    """
    _check_width(width)
    if isinstance(t, StringType | BinaryType | FixedType):
        return v[:width]
    return v


def truncate_upper_bound(t: PrimitiveType, v: Any, width: int) -> Any | None:
    """An upper bound of at most ``width`` code points or bytes, or None if none exists.

    A prefix sorts before the value, so its last code point (byte) is incremented, carrying
    leftwards past U+10FFFF (0xFF); when every position is at its maximum no bound exists.
    """
    _check_width(width)
    if isinstance(t, StringType):
        if len(v) <= width:
            return v
        for end in range(width - 1, -1, -1):
            bumped = _next_code_point(ord(v[end]))
            if bumped is not None:
                return v[:end] + chr(bumped)
        return None
    if isinstance(t, BinaryType | FixedType):
        if len(v) <= width:
            return bytes(v)
        prefix = bytearray(v[:width])
        while prefix:
            last = prefix.pop()
            if last < 0xFF:
                prefix.append(last + 1)
                return bytes(prefix)
        return None
    return v


__all__ = [
    "compare",
    "date_to_days",
    "datetime_to_micros",
    "days_to_date",
    "from_bytes",
    "from_json_value",
    "micros_to_datetime",
    "micros_to_time",
    "time_to_micros",
    "to_bytes",
    "to_human_string",
    "to_json_value",
    "truncate_lower_bound",
    "truncate_upper_bound",
]
