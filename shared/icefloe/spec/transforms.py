"""Partition and sort transforms (spec: "Partition Transforms", Appendix B).

A transform turns a source column value into a partition (or sort) value. Every transform
exists twice: ``apply`` works on one value in icefloe's internal representation (see
:mod:`icefloe.spec.types`) and serves metadata, filters and tests; ``apply_array`` works on a
whole pyarrow array and serves the write path, where millions of rows are partitioned.
The two must agree value for value, which the tests check with hypothesis.

Arrow's calendar kernels (``pc.year``, ``pc.month``) silently wrap outside years 1..9999,
while Iceberg values may span the whole int range. The vectorized year/month transforms use
them only when every value of a batch is in that range and otherwise fall back to the same
integer civil-calendar algorithm the scalar path uses, evaluated as Arrow kernels.

Bucketing of the integer-like types (int, long, date, time, timestamps) runs murmur3 as
Arrow kernels on uint32 arrays, because those are the common bucket columns; variable-length
values (strings, binary, decimals, uuids) are hashed per value with ``mmh3``.

Transforms are immutable value objects: equal when they are the same kind with the same
parameter, so they can key dictionaries and be compared across partition specs.

Why one module past 800 lines: every transform exists twice (scalar and Arrow) and the two
must agree value for value; each pair stays together, and the transforms share the calendar
and hash helpers.
"""

from __future__ import annotations

import math
import re
import struct
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, ClassVar

import mmh3
import pyarrow as pa
import pyarrow.compute as pc

from icefloe.errors import ValidationError
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
    LongType,
    PrimitiveType,
    StringType,
    TimestampNanoType,
    TimestampType,
    TimestamptzNanoType,
    TimestamptzType,
    TimeType,
    UUIDType,
    VariantType,
)
from icefloe.spec.values import to_human_string

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

MICROS_PER_HOUR = 3_600_000_000
MICROS_PER_DAY = 86_400_000_000
NANOS_PER_MICRO = 1_000
NANOS_PER_HOUR = MICROS_PER_HOUR * NANOS_PER_MICRO
NANOS_PER_DAY = MICROS_PER_DAY * NANOS_PER_MICRO

# Civil-calendar constants (days from 0000-03-01 to 1970-01-01; days per 400-year era).
_EPOCH_SHIFT = 719_468
_DAYS_PER_ERA = 146_097

_CANONICAL_NAN_BITS = 0x7FF8000000000000

_MICRO_TYPES = (TimestampType, TimestamptzType)
_NANO_TYPES = (TimestampNanoType, TimestamptzNanoType)
_TIMESTAMP_TYPES = _MICRO_TYPES + _NANO_TYPES
_INTEGER_TYPES = (IntegerType, LongType)

ArrayLike = Any  # pyarrow.Array or pyarrow.ChunkedArray (pyarrow ships no type stubs)


# --------------------------------------------------------------------------------------
# Scalar helpers
# --------------------------------------------------------------------------------------


def _require_int(value: Any, source: IcebergType, transform: Transform) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(
            f"{transform} on {source} expects an int (icefloe's internal representation), "
            f"got {type(value).__name__} {value!r:.60}"
        )
    return value


def _check_int32(result: int, transform: Transform, source: IcebergType, value: Any) -> int:
    if not INT32_MIN <= result <= INT32_MAX:
        raise ValidationError(
            f"{transform} of {source} value {value!r} is {result}, outside the int range "
            "of a partition value"
        )
    return result


def civil_from_days(days: int) -> tuple[int, int, int]:
    """(year, month, day) of the proleptic Gregorian date ``days`` after 1970-01-01.

    Unlike :mod:`datetime` this works for every int, so human strings of partition values
    never fail on far-away dates.
    """
    z = days + _EPOCH_SHIFT
    era = z // _DAYS_PER_ERA
    doe = z - era * _DAYS_PER_ERA
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = mp + 3 if mp < 10 else mp - 9
    year = yoe + era * 400 + (1 if month <= 2 else 0)
    return year, month, day


def _months_from_days(days: int) -> int:
    """Months since 1970-01 of the date ``days`` after 1970-01-01 (any int range)."""
    year, month, _ = civil_from_days(days)
    return (year - 1970) * 12 + month - 1


def _ordinal(value: Any, transform: Transform) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(
            f"a {transform} partition value is an int ordinal, got {type(value).__name__} "
            f"{value!r:.60}"
        )
    return value


def _human_date(days: int) -> str:
    y, m, d = civil_from_days(days)
    return f"{y:04d}-{m:02d}-{d:02d}"


def _unscaled(value: Any, scale: int, source: IcebergType) -> int:
    """The unscaled integer of a decimal at the column's scale, refusing to drop digits."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = Decimal(value)
    if not isinstance(value, Decimal):
        raise ValidationError(
            f"a {source} value must be a decimal.Decimal, got {type(value).__name__} {value!r:.60}"
        )
    sign, digits, exponent = value.as_tuple()
    if not isinstance(exponent, int):
        raise ValidationError(f"a {source} value must be finite, got {value}")
    unscaled = int("".join(map(str, digits)) or "0")
    shift = exponent + scale
    if shift >= 0:
        unscaled *= 10**shift
    else:
        unscaled, rest = divmod(unscaled, 10**-shift)
        if rest:
            raise ValidationError(f"{value} has more fractional digits than {source} allows")
    return -unscaled if sign else unscaled


def _decimal_from_unscaled(unscaled: int, scale: int) -> Decimal:
    # Built from a string so no decimal context can round a 38-digit value.
    return Decimal(f"{unscaled}E{-scale}")


def _min_big_endian(n: int) -> bytes:
    """Two's-complement big-endian bytes of ``n`` with no redundant sign bytes (Appendix B)."""
    magnitude = n if n >= 0 else ~n
    return n.to_bytes(magnitude.bit_length() // 8 + 1, "big", signed=True)


def _hash_long(v: int) -> int:
    return int(mmh3.hash(struct.pack("<q", v), 0, True))


def _as_bytes(value: Any, source: IcebergType) -> bytes:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise ValidationError(
        f"a {source} value must be bytes, got {type(value).__name__} {value!r:.60}"
    )


def _uuid_bytes(value: Any) -> bytes:
    if isinstance(value, uuid.UUID):
        return value.bytes
    if isinstance(value, (bytes, bytearray, memoryview)) and len(value) == 16:
        return bytes(value)
    raise ValidationError(f"a uuid value must be a uuid.UUID, got {value!r:.60}")


def hash_value(source: IcebergType, value: Any) -> int:
    """The signed 32-bit murmur3 hash of one value, exactly as Appendix B specifies.

    Also covers the types Appendix B hashes but no transform buckets (boolean, float,
    double), so callers such as bloom-filter builders get one definition of the hash.
    """
    if value is None:
        raise ValidationError("null values have no hash; transforms map null to null")
    if isinstance(source, (IntegerType, LongType, DateType, TimeType, *_MICRO_TYPES)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValidationError(f"a {source} value must be an int, got {value!r:.60}")
        return _hash_long(value)
    if isinstance(source, _NANO_TYPES):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValidationError(f"a {source} value must be an int, got {value!r:.60}")
        # Nanoseconds hash as microseconds so that a column keeps its buckets across units.
        return _hash_long(value // NANOS_PER_MICRO)
    if isinstance(source, DecimalType):
        return int(mmh3.hash(_min_big_endian(_unscaled(value, source.scale, source)), 0, True))
    if isinstance(source, StringType):
        if not isinstance(value, str):
            raise ValidationError(f"a string value must be a str, got {value!r:.60}")
        try:
            data = value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValidationError(f"string value {value!r:.60} is not valid UTF-8: {e}") from e
        return int(mmh3.hash(data, 0, True))
    if isinstance(source, UUIDType):
        return int(mmh3.hash(_uuid_bytes(value), 0, True))
    if isinstance(source, (FixedType, BinaryType)):
        return int(mmh3.hash(_as_bytes(value, source), 0, True))
    if isinstance(source, BooleanType):
        return _hash_long(1 if value else 0)
    if isinstance(source, (FloatType, DoubleType)):
        f = float(value)
        if math.isnan(f):
            return _hash_long(_CANONICAL_NAN_BITS)
        # Adding +0.0 turns -0.0 into +0.0, which the spec requires to hash alike.
        return _hash_long(struct.unpack("<q", struct.pack("<d", f + 0.0))[0])
    raise ValidationError(f"Appendix B defines no 32-bit hash for {source} values")


# --------------------------------------------------------------------------------------
# Vectorized helpers (Arrow kernels only: no per-row Python on these paths)
# --------------------------------------------------------------------------------------

_I64 = pa.int64()
_U32 = pa.uint32()


def _i64(v: int) -> Any:
    return pa.scalar(v, _I64)


def _u32(v: int) -> Any:
    return pa.scalar(v, _U32)


def _floor_div(a: Any, d: int) -> Any:
    """Floor division of an int64 array by a positive int, exact over the whole int64 range."""
    q = pc.divide(a, _i64(d))  # truncates toward zero
    rem = pc.subtract(a, pc.multiply(q, _i64(d)))  # |q*d| <= |a|: cannot overflow
    return pc.if_else(pc.less(rem, _i64(0)), pc.subtract(q, _i64(1)), q)


# 0001-01-01 and 9999-12-31 as days from the epoch: the range Arrow's calendar kernels handle.
_ARROW_CALENDAR_MIN_DAYS = -719_162
_ARROW_CALENDAR_MAX_DAYS = 2_932_896


def _calendar_dates(days: Any) -> Any:
    """``days`` as a date32 array when Arrow's calendar kernels can handle every value, else None.

    Arrow's kernels are several times faster than the integer algorithm but wrap outside
    years 1..9999, where :func:`_months_from_days_wide` takes over.
    """
    bounds = pc.min_max(days)
    lo, hi = bounds["min"].as_py(), bounds["max"].as_py()
    if lo is None or (lo >= _ARROW_CALENDAR_MIN_DAYS and hi <= _ARROW_CALENDAR_MAX_DAYS):
        return days.cast(pa.int32()).view(pa.date32())
    return None


def _years_from_days_array(days: Any) -> Any:
    dates = _calendar_dates(days)
    if dates is None:
        return _floor_div(_months_from_days_wide(days), 12)
    return pc.subtract(pc.year(dates), _i64(1970))


def _months_from_days_array(days: Any) -> Any:
    """Vectorized :func:`_months_from_days` over an int64 array of days."""
    dates = _calendar_dates(days)
    if dates is None:
        return _months_from_days_wide(days)
    years = pc.subtract(pc.year(dates), _i64(1970))
    return pc.add(pc.multiply(years, _i64(12)), pc.subtract(pc.month(dates), _i64(1)))


def _months_from_days_wide(days: Any) -> Any:
    """:func:`civil_from_days` as Arrow kernels, reduced to months since 1970-01.

    Counting months from March (``mp``) makes the year carry implicit: March of year y is
    month index 2 of y, January of y+1 is index 12 of y.
    """
    z = pc.add(days, _i64(_EPOCH_SHIFT))
    era = _floor_div(z, _DAYS_PER_ERA)
    doe = pc.subtract(z, pc.multiply(era, _i64(_DAYS_PER_ERA)))  # 0 ..= 146096
    yoe = pc.divide(
        pc.subtract(
            pc.add(
                pc.subtract(doe, pc.divide(doe, _i64(1460))),
                pc.divide(doe, _i64(36524)),
            ),
            pc.divide(doe, _i64(146096)),
        ),
        _i64(365),
    )
    doy = pc.subtract(
        doe,
        pc.subtract(
            pc.add(pc.multiply(yoe, _i64(365)), pc.divide(yoe, _i64(4))),
            pc.divide(yoe, _i64(100)),
        ),
    )
    mp = pc.divide(pc.add(pc.multiply(doy, _i64(5)), _i64(2)), _i64(153))
    years = pc.add(yoe, pc.multiply(era, _i64(400)))
    return pc.add(
        pc.multiply(pc.subtract(years, _i64(1970)), _i64(12)),
        pc.add(mp, _i64(2)),
    )


def _to_int32(arr: Any, transform: Transform, source: IcebergType) -> Any:
    try:
        return arr.cast(pa.int32(), safe=True)
    except pa.ArrowInvalid as e:
        raise ValidationError(
            f"{transform} of a {source} column produced values outside the int range "
            f"of a partition value: {e}"
        ) from e


def _rotl32(x: Any, r: int) -> Any:
    return pc.bit_wise_or(pc.shift_left(x, _u32(r)), pc.shift_right(x, _u32(32 - r)))


_C1 = 0xCC9E2D51
_C2 = 0x1B873593


def _murmur3_longs(values: Any) -> Any:
    """murmur3_x86_32 (seed 0) of each int64 as 8 little-endian bytes, as uint32 hashes.

    Unchecked uint32 kernels wrap modulo 2**32, which is exactly the C arithmetic that
    murmur3 is defined with.
    """
    u = values.view(pa.uint64())
    blocks = (
        pc.bit_wise_and(u, pa.scalar(0xFFFFFFFF, pa.uint64())).cast(_U32),
        pc.shift_right(u, pa.scalar(32, pa.uint64())).cast(_U32),
    )
    h: Any = None
    for k in blocks:
        k = pc.multiply(_rotl32(pc.multiply(k, _u32(_C1)), 15), _u32(_C2))
        h = k if h is None else pc.bit_wise_xor(h, k)
        h = pc.add(pc.multiply(_rotl32(h, 13), _u32(5)), _u32(0xE6546B64))
    h = pc.bit_wise_xor(h, _u32(8))  # total length in bytes
    h = pc.bit_wise_xor(h, pc.shift_right(h, _u32(16)))
    h = pc.multiply(h, _u32(0x85EBCA6B))
    h = pc.bit_wise_xor(h, pc.shift_right(h, _u32(13)))
    h = pc.multiply(h, _u32(0xC2B2AE35))
    return pc.bit_wise_xor(h, pc.shift_right(h, _u32(16)))


def _plain(arr: Any) -> Any:
    """Strip the encodings that do not change values: extension types and dictionaries."""
    if isinstance(arr, pa.ExtensionArray):
        arr = arr.storage
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    return arr


def _wrong_array(transform: Transform, source: IcebergType, arr: Any) -> ValidationError:
    return ValidationError(
        f"{transform} on a {source} column cannot take an Arrow array of type {arr.type}"
    )


def _epoch_values(transform: Transform, source: IcebergType, arr: Any) -> Any:
    """The int64 internal representation of a date/time/timestamp Arrow array.

    Days for date, micros for time and timestamp(tz), nanos for the _ns types. Integer arrays
    are taken as already holding that representation.
    """
    t = arr.type
    try:
        if isinstance(source, DateType):
            if pa.types.is_date32(t):
                return arr.view(pa.int32()).cast(_I64)
            if pa.types.is_int32(t) or pa.types.is_int64(t):
                return arr.cast(_I64)
        elif isinstance(source, TimeType):
            if pa.types.is_time(t):
                return arr.cast(pa.time64("us")).view(_I64)
            if pa.types.is_int64(t):
                return arr
        elif isinstance(source, _TIMESTAMP_TYPES):
            unit = "ns" if isinstance(source, _NANO_TYPES) else "us"
            if pa.types.is_timestamp(t):
                # The stored value is UTC whatever the zone annotation, so drop the zone
                # before viewing the raw integers.
                return arr.cast(pa.timestamp(unit, tz=t.tz)).view(_I64)
            if pa.types.is_int64(t):
                return arr
    except pa.ArrowInvalid as e:
        raise ValidationError(
            f"{transform} on a {source} column cannot convert Arrow {t} values: {e}"
        ) from e
    raise _wrong_array(transform, source, arr)


def _binary_view(transform: Transform, source: IcebergType, arr: Any) -> Any:
    """A bytes-valued view of a string/binary/fixed Arrow array (zero copy for strings)."""
    t = arr.type
    if pa.types.is_string(t):
        return arr.view(pa.binary())
    if pa.types.is_large_string(t):
        return arr.view(pa.large_binary())
    if pa.types.is_string_view(t):
        return arr.view(pa.binary_view())
    if (
        pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_binary_view(t)
        or pa.types.is_fixed_size_binary(t)
    ):
        return arr
    raise _wrong_array(transform, source, arr)


# --------------------------------------------------------------------------------------
# Transforms
# --------------------------------------------------------------------------------------


class Transform(ABC):
    """A partition/sort transform. Subclasses are frozen dataclasses (hashable values)."""

    preserves_order: ClassVar[bool] = False

    @abstractmethod
    def can_transform(self, source: IcebergType) -> bool:
        """Whether the spec allows this transform on a column of type ``source``."""

    @abstractmethod
    def _result_type(self, source: IcebergType) -> IcebergType: ...

    @abstractmethod
    def _apply(self, source: IcebergType, value: Any) -> Any: ...

    @abstractmethod
    def _apply_array(self, source: IcebergType, arr: Any) -> Any: ...

    @abstractmethod
    def __str__(self) -> str: ...

    def check_source(self, source: IcebergType) -> None:
        """Raise a ValidationError naming the transform and the type if it cannot apply."""
        if not self.can_transform(source):
            raise ValidationError(f"transform {self} cannot be applied to a {source} column")

    def result_type(self, source: IcebergType) -> IcebergType:
        self.check_source(source)
        return self._result_type(source)

    def apply(self, source: IcebergType, value: Any) -> Any:
        """Transform one value (internal representation); null stays null."""
        self.check_source(source)
        if value is None:
            return None
        return self._apply(source, value)

    def apply_array(self, source: IcebergType, arr: ArrayLike) -> ArrayLike:
        """Transform a pyarrow Array (or ChunkedArray, chunk by chunk); nulls stay null."""
        self.check_source(source)
        if isinstance(arr, pa.ChunkedArray):
            if arr.num_chunks == 0:
                empty = self._apply_array(source, pa.array([], type=arr.type))
                return pa.chunked_array([], type=empty.type)
            return pa.chunked_array([self._apply_array(source, c) for c in arr.chunks])
        if not isinstance(arr, pa.Array):
            raise ValidationError(
                f"{self}.apply_array expects a pyarrow Array, got {type(arr).__name__}"
            )
        return self._apply_array(source, arr)

    def to_human_string(self, result: IcebergType, value: Any) -> str:
        """The partition-path form of a *transformed* value of type ``result``."""
        if value is None:
            return "null"
        if not isinstance(result, PrimitiveType):
            raise ValidationError(f"{self} has no human string for non-primitive {result}")
        return to_human_string(result, value)

    def satisfies_order_of(self, other: Transform) -> bool:
        """Whether data ordered by this transform is necessarily ordered by ``other`` too."""
        return self == other and self.preserves_order

    @property
    def is_void(self) -> bool:
        return False

    @property
    def is_unknown(self) -> bool:
        return False

    @property
    def dedup_name(self) -> str:
        """Key under which two fields on one column are redundant (all time units clash)."""
        return str(self)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


@dataclass(frozen=True, repr=False)
class IdentityTransform(Transform):
    preserves_order: ClassVar[bool] = True

    def can_transform(self, source: IcebergType) -> bool:
        return isinstance(source, PrimitiveType) and not isinstance(
            source, (GeometryType, GeographyType, VariantType)
        )

    def _result_type(self, source: IcebergType) -> IcebergType:
        return source

    def _apply(self, source: IcebergType, value: Any) -> Any:
        return value

    def _apply_array(self, source: IcebergType, arr: Any) -> Any:
        return arr

    def satisfies_order_of(self, other: Transform) -> bool:
        # Sorting by the value itself orders every monotonic function of it.
        return other.preserves_order

    def __str__(self) -> str:
        return "identity"


@dataclass(frozen=True, repr=False)
class VoidTransform(Transform):
    """Always null: how v1 tables drop a partition field without renumbering the rest."""

    def can_transform(self, source: IcebergType) -> bool:
        return True

    def _result_type(self, source: IcebergType) -> IcebergType:
        return source

    def _apply(self, source: IcebergType, value: Any) -> Any:
        return None

    def _apply_array(self, source: IcebergType, arr: Any) -> Any:
        return pa.nulls(len(arr), pa.null())

    def to_human_string(self, result: IcebergType, value: Any) -> str:
        return "null"

    @property
    def is_void(self) -> bool:
        return True

    def __str__(self) -> str:
        return "void"


@dataclass(frozen=True)
class UnknownTransform(Transform):
    """A transform this implementation does not know: carried through metadata, never applied.

    The spec requires readers to tolerate such fields (ignoring them when filtering) and
    forbids writing data with them, so every application raises.
    """

    text: str

    def can_transform(self, source: IcebergType) -> bool:
        # Unknowable; accepting keeps metadata that uses it readable.
        return True

    def _result_type(self, source: IcebergType) -> IcebergType:
        return StringType()

    def _refuse(self) -> ValidationError:
        return ValidationError(
            f"cannot apply unknown transform {self.text!r}: data cannot be written with a "
            "partition spec or sort order that uses it"
        )

    def _apply(self, source: IcebergType, value: Any) -> Any:
        raise self._refuse()

    def apply(self, source: IcebergType, value: Any) -> Any:
        raise self._refuse()

    def _apply_array(self, source: IcebergType, arr: Any) -> Any:
        raise self._refuse()

    def to_human_string(self, result: IcebergType, value: Any) -> str:
        return "null" if value is None else str(value)

    def satisfies_order_of(self, other: Transform) -> bool:
        return False

    @property
    def is_unknown(self) -> bool:
        return True

    def __str__(self) -> str:
        return self.text


_BUCKET_SOURCES = (
    IntegerType,
    LongType,
    DecimalType,
    DateType,
    TimeType,
    TimestampType,
    TimestamptzType,
    TimestampNanoType,
    TimestamptzNanoType,
    StringType,
    UUIDType,
    FixedType,
    BinaryType,
)


@dataclass(frozen=True)
class BucketTransform(Transform):
    """``bucket[N]``: murmur3 hash (Appendix B) with the sign bit dropped, mod N."""

    num_buckets: int

    def __post_init__(self) -> None:
        n = self.num_buckets
        if isinstance(n, bool) or not isinstance(n, int) or not 0 < n <= INT32_MAX:
            raise ValidationError(
                f"bucket count must be a positive int up to {INT32_MAX}, got {n!r}"
            )

    def can_transform(self, source: IcebergType) -> bool:
        return isinstance(source, _BUCKET_SOURCES)

    def _result_type(self, source: IcebergType) -> IcebergType:
        return IntegerType()

    def _apply(self, source: IcebergType, value: Any) -> Any:
        return (hash_value(source, value) & INT32_MAX) % self.num_buckets

    def _apply_array(self, source: IcebergType, arr: Any) -> Any:
        arr = _plain(arr)
        if isinstance(source, _INTEGER_TYPES):
            if not pa.types.is_signed_integer(arr.type):
                raise _wrong_array(self, source, arr)
            return self._bucket_longs(arr.cast(_I64))
        if isinstance(source, (DateType, TimeType, *_MICRO_TYPES)):
            return self._bucket_longs(_epoch_values(self, source, arr))
        if isinstance(source, _NANO_TYPES):
            micros = _floor_div(_epoch_values(self, source, arr), NANOS_PER_MICRO)
            return self._bucket_longs(micros)
        if isinstance(source, DecimalType):
            return self._bucket_decimals(source, arr)
        if isinstance(source, UUIDType) and (
            not pa.types.is_fixed_size_binary(arr.type) or arr.type.byte_width != 16
        ):
            raise _wrong_array(self, source, arr)
        return self._bucket_bytes(_binary_view(self, source, arr))

    def _bucket_longs(self, longs: Any) -> Any:
        hashes = _murmur3_longs(longs)
        positive = pc.bit_wise_and(hashes, _u32(INT32_MAX))
        return pc.modulo(positive, _u32(self.num_buckets)).cast(pa.int32())

    def _bucket_bytes(self, arr: Any) -> Any:
        n = self.num_buckets
        mask = INT32_MAX
        h = mmh3.hash
        out = [None if b is None else (h(b, 0, True) & mask) % n for b in arr.to_pylist()]
        return pa.array(out, type=pa.int32())

    def _bucket_decimals(self, source: DecimalType, arr: Any) -> Any:
        if not pa.types.is_decimal(arr.type):
            raise _wrong_array(self, source, arr)
        if arr.type.scale != source.scale:
            # The hash is of the unscaled value at the column's scale, so rescale first.
            try:
                arr = arr.cast(pa.decimal128(source.precision, source.scale), safe=True)
            except pa.ArrowInvalid as e:
                raise ValidationError(
                    f"{self} on a {source} column cannot rescale Arrow {arr.type} values: {e}"
                ) from e
        # The Arrow buffer already holds the unscaled two's-complement little-endian ints:
        # reading them avoids a Decimal round trip per row.
        raw = arr.view(pa.binary(arr.type.byte_width)).to_pylist()
        n = self.num_buckets
        mask = INT32_MAX
        h = mmh3.hash
        out = [
            None
            if b is None
            else (h(_min_big_endian(int.from_bytes(b, "little", signed=True)), 0, True) & mask) % n
            for b in raw
        ]
        return pa.array(out, type=pa.int32())

    def to_human_string(self, result: IcebergType, value: Any) -> str:
        return "null" if value is None else str(value)

    def __str__(self) -> str:
        return f"bucket[{self.num_buckets}]"


@dataclass(frozen=True)
class TruncateTransform(Transform):
    """``truncate[W]``: floor to a multiple of W for numbers, a W-long prefix for strings/bytes."""

    preserves_order: ClassVar[bool] = True
    width: int

    def __post_init__(self) -> None:
        w = self.width
        if isinstance(w, bool) or not isinstance(w, int) or not 0 < w <= INT32_MAX:
            raise ValidationError(
                f"truncate width must be a positive int up to {INT32_MAX}, got {w!r}"
            )

    def can_transform(self, source: IcebergType) -> bool:
        return isinstance(source, (IntegerType, LongType, DecimalType, StringType, BinaryType))

    def _result_type(self, source: IcebergType) -> IcebergType:
        return source

    def _apply(self, source: IcebergType, value: Any) -> Any:
        w = self.width
        if isinstance(source, _INTEGER_TYPES):
            v = _require_int(value, source, self)
            result = v - v % w  # Python's % already floors: the remainder is never negative
            lo, hi = (
                (INT32_MIN, INT32_MAX)
                if isinstance(source, IntegerType)
                else (INT64_MIN, INT64_MAX)
            )
            if not lo <= result <= hi:
                raise ValidationError(
                    f"{self} of {source} value {v} is {result}, outside the {source} range"
                )
            return result
        if isinstance(source, DecimalType):
            return self._truncate_decimal(source, value)
        if isinstance(source, StringType):
            if not isinstance(value, str):
                raise ValidationError(f"a string value must be a str, got {value!r:.60}")
            return value[:w]  # Python slices by code point, as the spec requires
        return _as_bytes(value, source)[:w]

    def _truncate_decimal(self, source: DecimalType, value: Any) -> Decimal:
        unscaled = _unscaled(value, source.scale, source)
        result = unscaled - unscaled % self.width
        if len(str(abs(result))) > source.precision:
            raise ValidationError(
                f"{self} of {source} value {value} does not fit the column's precision"
            )
        return _decimal_from_unscaled(result, source.scale)

    def _apply_array(self, source: IcebergType, arr: Any) -> Any:
        arr = _plain(arr)
        t = arr.type
        w = self.width
        if isinstance(source, _INTEGER_TYPES):
            if not pa.types.is_signed_integer(t):
                raise _wrong_array(self, source, arr)
            natural = pa.int32() if isinstance(source, IntegerType) else _I64
            try:
                arr = arr.cast(natural, safe=True)
                # Arrow's modulo floors like Python's, so the remainder is never negative.
                return pc.subtract_checked(arr, pc.modulo(arr, pa.scalar(w, natural)))
            except pa.ArrowInvalid as e:
                raise ValidationError(
                    f"{self} of a {source} column overflows the column type: {e}"
                ) from e
        if isinstance(source, StringType):
            if not (
                pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)
            ):
                raise _wrong_array(self, source, arr)
            return pc.utf8_slice_codeunits(arr, 0, w)  # slices by code point
        if isinstance(source, BinaryType):
            if not (
                pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t)
            ):
                raise _wrong_array(self, source, arr)
            return pc.binary_slice(arr, 0, w)
        assert isinstance(source, DecimalType)
        if not pa.types.is_decimal(t):
            raise _wrong_array(self, source, arr)
        values = [None if v is None else self._truncate_decimal(source, v) for v in arr.to_pylist()]
        return pa.array(values, type=t)

    def satisfies_order_of(self, other: Transform) -> bool:
        if isinstance(other, TruncateTransform):
            # Sorted by a W-prefix implies sorted by any shorter prefix; sorted by multiples of
            # W implies sorted by multiples of any W' that W divides. The source type is not
            # known here, so only the case valid for both readings is accepted.
            return other.width == self.width
        return False

    def __str__(self) -> str:
        return f"truncate[{self.width}]"


class _TimeTransform(Transform):
    """year, month, day and hour: ordinals since the epoch, floored for pre-1970 values."""

    preserves_order: ClassVar[bool] = True
    # Finer transforms have a larger granularity rank (hour 3 ... year 0).
    _rank: ClassVar[int]

    def can_transform(self, source: IcebergType) -> bool:
        return isinstance(source, (DateType, *_TIMESTAMP_TYPES))

    def _result_type(self, source: IcebergType) -> IcebergType:
        return IntegerType()

    @abstractmethod
    def _from_days(self, days: int) -> int: ...

    @abstractmethod
    def _from_days_array(self, days: Any) -> Any: ...

    def _apply(self, source: IcebergType, value: Any) -> Any:
        v = _require_int(value, source, self)
        if isinstance(source, DateType):
            days = v
        elif isinstance(source, _NANO_TYPES):
            days = v // NANOS_PER_DAY
        else:
            days = v // MICROS_PER_DAY
        return _check_int32(self._from_days(days), self, source, value)

    def _apply_array(self, source: IcebergType, arr: Any) -> Any:
        values = _epoch_values(self, source, _plain(arr))
        if isinstance(source, DateType):
            days = values
        else:
            per_day = NANOS_PER_DAY if isinstance(source, _NANO_TYPES) else MICROS_PER_DAY
            days = _floor_div(values, per_day)
        return _to_int32(self._from_days_array(days), self, source)

    def satisfies_order_of(self, other: Transform) -> bool:
        # Each coarser unit is a monotonic function of a finer one (a day lies in one month).
        return isinstance(other, _TimeTransform) and self._rank >= other._rank

    @property
    def dedup_name(self) -> str:
        return "time"

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


@dataclass(frozen=True, repr=False)
class YearTransform(_TimeTransform):
    _rank: ClassVar[int] = 0

    def _from_days(self, days: int) -> int:
        return _months_from_days(days) // 12

    def _from_days_array(self, days: Any) -> Any:
        return _years_from_days_array(days)

    def to_human_string(self, result: IcebergType, value: Any) -> str:
        if value is None:
            return "null"
        return f"{1970 + _ordinal(value, self):04d}"

    def __str__(self) -> str:
        return "year"


@dataclass(frozen=True, repr=False)
class MonthTransform(_TimeTransform):
    _rank: ClassVar[int] = 1

    def _from_days(self, days: int) -> int:
        return _months_from_days(days)

    def _from_days_array(self, days: Any) -> Any:
        return _months_from_days_array(days)

    def to_human_string(self, result: IcebergType, value: Any) -> str:
        if value is None:
            return "null"
        years, month = divmod(_ordinal(value, self), 12)
        return f"{1970 + years:04d}-{month + 1:02d}"

    def __str__(self) -> str:
        return "month"


@dataclass(frozen=True, repr=False)
class DayTransform(_TimeTransform):
    """Days since 1970-01-01, typed ``date`` (readers must also accept plain ints)."""

    _rank: ClassVar[int] = 2

    def _result_type(self, source: IcebergType) -> IcebergType:
        return DateType()

    def _from_days(self, days: int) -> int:
        return days

    def _from_days_array(self, days: Any) -> Any:
        return days

    def _apply_array(self, source: IcebergType, arr: Any) -> Any:
        return super()._apply_array(source, arr).view(pa.date32())

    def to_human_string(self, result: IcebergType, value: Any) -> str:
        return "null" if value is None else _human_date(_ordinal(value, self))

    def __str__(self) -> str:
        return "day"


@dataclass(frozen=True, repr=False)
class HourTransform(_TimeTransform):
    _rank: ClassVar[int] = 3

    def can_transform(self, source: IcebergType) -> bool:
        return isinstance(source, _TIMESTAMP_TYPES)

    def _from_days(self, days: int) -> int:  # pragma: no cover - hours never go via days
        raise AssertionError("hour is computed from the timestamp, not from days")

    def _from_days_array(self, days: Any) -> Any:  # pragma: no cover - see _from_days
        raise AssertionError("hour is computed from the timestamp, not from days")

    def _apply(self, source: IcebergType, value: Any) -> Any:
        v = _require_int(value, source, self)
        per_hour = NANOS_PER_HOUR if isinstance(source, _NANO_TYPES) else MICROS_PER_HOUR
        return _check_int32(v // per_hour, self, source, value)

    def _apply_array(self, source: IcebergType, arr: Any) -> Any:
        values = _epoch_values(self, source, _plain(arr))
        per_hour = NANOS_PER_HOUR if isinstance(source, _NANO_TYPES) else MICROS_PER_HOUR
        return _to_int32(_floor_div(values, per_hour), self, source)

    def to_human_string(self, result: IcebergType, value: Any) -> str:
        if value is None:
            return "null"
        days, hour = divmod(_ordinal(value, self), 24)
        return f"{_human_date(days)}-{hour:02d}"

    def __str__(self) -> str:
        return "hour"


def bind_source(schema: Schema, source_id: int, transform: Transform, what: str) -> IcebergType:
    """The type of the column a partition or sort field reads, checked against the spec.

    The column must exist, be primitive, sit outside lists and maps (it needs one value per
    row) and be a type the transform accepts. ``what`` names the field in messages.
    """
    source = schema.find_field(source_id)
    if source is None:
        raise ValidationError(
            f"{what}: source column id {source_id} is not in schema {schema.schema_id}"
        )
    name = schema.find_column_name(source_id)
    if not isinstance(source.field_type, PrimitiveType):
        raise ValidationError(
            f"{what}: source column {name!r} is a {source.field_type}; only primitive "
            "columns can be partitioned or sorted by"
        )
    if schema.is_in_list_or_map(source_id):
        raise ValidationError(
            f"{what}: source column {name!r} is inside a list or map and has no single "
            "value per row"
        )
    if not transform.can_transform(source.field_type):
        raise ValidationError(
            f"{what}: transform {transform} cannot be applied to column {name!r} of type "
            f"{source.field_type}"
        )
    return source.field_type


def source_ids_from_json(obj: dict[str, Any], transform: Transform, what: str) -> tuple[int, ...]:
    """Read ``source-id`` / ``source-ids`` of a partition or sort field (Appendix C).

    v1/v2 write ``source-id``; v3 may write ``source-ids``. More than one id is only
    meaningful for multi-argument transforms, which this implementation does not know,
    so it is accepted only with an unknown transform (carried through, never applied).
    """
    single = obj.get("source-id")
    many = obj.get("source-ids")
    if single is not None and (isinstance(single, bool) or not isinstance(single, int)):
        raise ValidationError(f"{what}: 'source-id' must be an integer, got {single!r:.100}")
    if many is not None:
        if (
            not isinstance(many, list)
            or not many
            or any(isinstance(i, bool) or not isinstance(i, int) for i in many)
        ):
            raise ValidationError(
                f"{what}: 'source-ids' must be a non-empty list of integers, got {many!r:.100}"
            )
        if single is not None and single != many[0]:
            raise ValidationError(
                f"{what}: 'source-id' {single} disagrees with 'source-ids' {many}"
            )
        if len(many) > 1 and not transform.is_unknown:
            raise ValidationError(
                f"{what}: transform {transform} takes one argument but 'source-ids' lists "
                f"{len(many)} columns"
            )
        return tuple(many)
    if single is None:
        raise ValidationError(f"{what} is missing 'source-id': {obj!r:.200}")
    return (single,)


_PARAMETERIZED = re.compile(r"^(bucket|truncate)\s*\[\s*(\d+)\s*\]$")
_SIMPLE: dict[str, Callable[[], Transform]] = {
    "identity": IdentityTransform,
    "void": VoidTransform,
    "year": YearTransform,
    "month": MonthTransform,
    "day": DayTransform,
    "hour": HourTransform,
}


def parse_transform(text: str) -> Transform:
    """Parse a transform name (Appendix C). Unknown names become :class:`UnknownTransform`.

    Whitespace and case are tolerated as the reference implementation does. A known name
    with an invalid parameter (``bucket[0]``) is an error rather than "unknown", since
    treating it as unknown would silently disable partition pruning for a typo.
    """
    if not isinstance(text, str):
        raise ValidationError(f"a transform must be a JSON string, got {text!r:.100}")
    normalized = text.strip().lower()
    simple = _SIMPLE.get(normalized)
    if simple is not None:
        return simple()
    m = _PARAMETERIZED.match(normalized)
    if m is not None:
        param = int(m.group(2))
        if m.group(1) == "bucket":
            return BucketTransform(param)
        return TruncateTransform(param)
    return UnknownTransform(text)


__all__ = [
    "BucketTransform",
    "DayTransform",
    "HourTransform",
    "IdentityTransform",
    "MonthTransform",
    "Transform",
    "TruncateTransform",
    "UnknownTransform",
    "VoidTransform",
    "YearTransform",
    "bind_source",
    "civil_from_days",
    "hash_value",
    "parse_transform",
    "source_ids_from_json",
]
