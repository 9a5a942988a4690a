"""Iceberg values as Arrow arrays: the storage types the planner compares in bulk.

The manifest cache keeps partition values and decoded column bounds as Arrow arrays of these
types, so that filters run as ``pyarrow.compute`` kernels over whole manifests. Dates and
times stay integers, UUIDs their 16 big-endian bytes, exactly the internal representation,
so comparing with a bound literal needs no conversion.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from icefloe.errors import InvalidFileError, ValidationError
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
    LongType,
    PrimitiveType,
    StringType,
    TimestampNanoType,
    TimestampType,
    TimestamptzNanoType,
    TimestamptzType,
    TimeType,
    UnknownType,
    UUIDType,
)
from icefloe.spec.values import from_bytes

_LITTLE_ENDIAN = sys.byteorder == "little"


# ---------------------------------------------------------------------------------------------
# Iceberg values as Arrow arrays
# ---------------------------------------------------------------------------------------------

_TEMPORAL_64 = (
    LongType,
    TimeType,
    TimestampType,
    TimestamptzType,
    TimestampNanoType,
    TimestamptzNanoType,
)


def arrow_storage_type(t: IcebergType) -> Any:
    """The Arrow type that holds a column of ``t``'s internal values for comparison, or None.

    Dates and times stay plain integers (days, micros, nanos), exactly as the internal
    representation and the bound literals are, so comparisons need no conversion. UUIDs are
    their 16 big-endian bytes, whose unsigned byte order is the spec's UUID order.
    """
    if isinstance(t, BooleanType):
        return pa.bool_()
    if isinstance(t, IntegerType | DateType):
        return pa.int32()
    if isinstance(t, _TEMPORAL_64):
        return pa.int64()
    if isinstance(t, FloatType):
        return pa.float32()
    if isinstance(t, DoubleType):
        return pa.float64()
    if isinstance(t, StringType):
        return pa.string()
    if isinstance(t, BinaryType | FixedType):
        return pa.binary()
    if isinstance(t, UUIDType):
        return pa.binary(16)
    if isinstance(t, DecimalType):
        return pa.decimal128(t.precision, t.scale)
    if isinstance(t, UnknownType):
        return pa.null()
    return None


def to_storage(t: IcebergType, value: Any) -> Any:
    if value is not None and isinstance(t, UUIDType):
        return value.bytes if isinstance(value, uuid.UUID) else bytes(value)
    return value


def values_to_arrow(t: IcebergType, values: Sequence[Any]) -> Any:
    """Internal values as an Arrow array of :func:`arrow_storage_type`, or None if they do
    not fit (a type Arrow cannot compare, or a value outside the type)."""
    storage = arrow_storage_type(t)
    if storage is None:
        return None
    try:
        if isinstance(t, UUIDType):
            return pa.array([to_storage(t, v) for v in values], storage)
        return pa.array(values, storage)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        return None


def arrow_to_values(t: IcebergType, array: Any) -> list[Any]:
    """An array made by :func:`values_to_arrow` back in the internal representation."""
    values: list[Any] = array.to_pylist()
    if isinstance(t, UUIDType):
        return [None if b is None else uuid.UUID(bytes=b) for b in values]
    return values


def arrow_scalar(t: IcebergType, value: Any) -> Any:
    storage = arrow_storage_type(t)
    if storage is None:
        raise ValidationError(f"no Arrow form for {t}")
    return pa.scalar(to_storage(t, value), storage)


def row_numbers(n: int) -> Any:
    if n == 0:
        return pa.array([], pa.int64())
    return pc.subtract(pc.cumulative_sum(pa.repeat(pa.scalar(1, pa.int64()), n)), 1)


def all_true(n: int) -> Any:
    return pa.repeat(pa.scalar(True), n)


def all_false(n: int) -> Any:
    return pa.repeat(pa.scalar(False), n)


def filled(mask: Any, value: Any) -> Any:
    """An array with nulls replaced: Iceberg's predicates are two-valued."""
    return pc.fill_null(mask, value) if mask.null_count else mask


# ---------------------------------------------------------------------------------------------
# Bounds decoding
# ---------------------------------------------------------------------------------------------

# type → (byte width, Arrow type of that width); widened to the column type afterwards.
_FIXED_WIDTH: dict[type, tuple[tuple[int, Any], ...]] = {
    IntegerType: ((4, pa.int32()),),
    DateType: ((4, pa.int32()),),
    LongType: ((8, pa.int64()), (4, pa.int32())),  # a 4-byte long bound was written as int
    TimeType: ((8, pa.int64()),),
    TimestampType: ((8, pa.int64()),),
    TimestamptzType: ((8, pa.int64()),),
    TimestampNanoType: ((8, pa.int64()),),
    TimestamptzNanoType: ((8, pa.int64()),),
    FloatType: ((4, pa.float32()),),
    DoubleType: ((8, pa.float64()), (4, pa.float32())),  # a 4-byte double bound was a float
}


def _reinterpret(raw: Any, width: int, arrow_type: Any) -> Any | None:
    """Binary values of exactly ``width`` bytes reinterpreted as little-endian numbers.

    Iceberg's binary form of numbers is little-endian, as Arrow's buffers are on
    little-endian machines, so the value bytes of the binary array can be viewed as a
    numeric array directly. None when some value has another width.
    """
    if not _LITTLE_ENDIAN:
        return None
    n = len(raw)
    valid = pc.is_valid(raw)
    filled = pc.fill_null(raw, pa.scalar(b"\x00" * width, pa.binary())) if raw.null_count else raw
    lengths = pc.binary_length(filled)
    bounds = pc.min_max(lengths)
    if bounds["min"].as_py() != width or bounds["max"].as_py() != width:
        return None
    filled = pa.concat_arrays([filled])  # a fresh array: offset 0, offsets start at 0
    offsets = pa.Array.from_buffers(pa.int32(), 1, [None, filled.buffers()[1]])
    start = offsets[0].as_py()
    data = filled.buffers()[2].slice(start, n * width)
    numbers = pa.Array.from_buffers(arrow_type, n, [None, data])
    if raw.null_count:
        numbers = pc.if_else(valid, numbers, pa.scalar(None, arrow_type))
    return numbers


def decode_bounds(
    t: PrimitiveType, raw: Any, describe: Callable[[int], str], column: str, which: str
) -> Any:
    """Binary bounds (Appendix D, one per row, null where absent) as an array of ``t``.

    NaN bounds become null, as the per-file evaluator treats them as absent. A value that
    does not decode raises :class:`InvalidFileError` naming the file (``describe(row)``).
    """
    storage = arrow_storage_type(t)
    if storage is None:
        raise ValidationError(f"column {column!r} of type {t} has no comparable bounds")
    n = len(raw)
    if raw.null_count == n:
        return pa.nulls(n, storage)
    decoded = None
    for width, arrow_type in _FIXED_WIDTH.get(type(t), ()):
        numbers = _reinterpret(raw, width, arrow_type)
        if numbers is not None:
            decoded = numbers if numbers.type == storage else numbers.cast(storage)
            break
    if decoded is None and isinstance(t, StringType):
        try:
            decoded = raw.cast(pa.string())
        except pa.ArrowInvalid:
            decoded = None  # not UTF-8 somewhere: the slow path names the file
    if decoded is None and isinstance(t, BinaryType | FixedType):
        decoded = raw
    if decoded is None:
        values: list[Any] = []
        for row, data in enumerate(raw.to_pylist()):
            if data is None:
                values.append(None)
                continue
            try:
                values.append(to_storage(t, from_bytes(t, data)))
            except ValidationError as e:
                raise InvalidFileError(
                    describe(row), f"the {which} bound of column {column!r} is not a {t} value: {e}"
                ) from None
        decoded = pa.array(values, storage)
    if isinstance(t, FloatType | DoubleType) and decoded.null_count < n:
        decoded = pc.if_else(filled(pc.is_nan(decoded), False), pa.scalar(None, storage), decoded)
    return decoded


__all__ = [
    "all_false",
    "all_true",
    "arrow_scalar",
    "arrow_storage_type",
    "arrow_to_values",
    "decode_bounds",
    "filled",
    "row_numbers",
    "to_storage",
    "values_to_arrow",
]
