"""Literals: the constants predicates compare columns with.

A literal is kept apart from its predicate because it is where Python values become
Iceberg's internal representation (dates as days, timestamps as micros, ...), and where the
spec's rules on constants are enforced once: no null and no NaN literal (``is-null`` and
``is-nan`` say that), and a typed literal must fit its type's range, precision and scale.
"""

from __future__ import annotations

import datetime as dt
import math
import uuid
from collections.abc import Callable
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
    PrimitiveType,
    StringType,
    TimestampType,
    TimestamptzType,
    TimeType,
    UUIDType,
)
from icefloe.spec.values import to_bytes

_EPOCH_ORDINAL = dt.date(1970, 1, 1).toordinal()
_EPOCH_NAIVE = dt.datetime(1970, 1, 1)
_EPOCH_UTC = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _micros(delta: dt.timedelta) -> int:
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _infer(value: Any) -> tuple[Any, PrimitiveType | None]:
    """(internal value, type) of a Python value; type None for JSON-native int/float/str."""
    if isinstance(value, bool):
        return value, BooleanType()
    if isinstance(value, int | str):
        return value, None
    if isinstance(value, float):
        if math.isnan(value):
            raise ValidationError("a literal cannot be NaN: use is-nan / not-nan instead")
        return value, None
    if isinstance(value, Decimal):
        _, digits, exponent = value.as_tuple()
        if not isinstance(exponent, int):
            raise ValidationError(f"a decimal literal must be finite, got {value}")
        scale = -exponent
        precision = max(len(digits), scale, 1)
        if precision > 38:
            raise ValidationError(
                f"decimal literal {value} needs {precision} digits; Iceberg decimals hold 38"
            )
        return value, DecimalType(precision, scale)
    if isinstance(value, uuid.UUID):
        return value, UUIDType()
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value), BinaryType()
    if isinstance(value, dt.datetime):
        if value.utcoffset() is None:
            return _micros(value - _EPOCH_NAIVE), TimestampType()
        return _micros(value - _EPOCH_UTC), TimestamptzType()
    if isinstance(value, dt.date):
        return value.toordinal() - _EPOCH_ORDINAL, DateType()
    if isinstance(value, dt.time):
        micros = ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000
        return micros + value.microsecond, TimeType()
    raise ValidationError(
        f"unsupported literal {value!r:.80} of Python type {type(value).__name__}; use bool, "
        "int, float, str, Decimal, UUID, bytes, date, time or datetime"
    )


_TYPED_CHECKS: dict[type, Callable[[Any], bool]] = {
    BooleanType: lambda v: isinstance(v, bool),
    FloatType: lambda v: isinstance(v, float | int) and not isinstance(v, bool),
    DoubleType: lambda v: isinstance(v, float | int) and not isinstance(v, bool),
    DecimalType: lambda v: isinstance(v, Decimal) and v.is_finite(),
    UUIDType: lambda v: isinstance(v, uuid.UUID),
}


def _check_typed(value: Any, type_: PrimitiveType) -> Any:
    if value is None:
        raise ValidationError("a literal cannot be null: use is-null / not-null instead")
    check = _TYPED_CHECKS.get(type(type_))
    if check is None:
        if isinstance(type_, StringType):
            ok = isinstance(value, str)
        elif isinstance(type_, BinaryType | FixedType):
            ok = isinstance(value, bytes | bytearray | memoryview)
            value = bytes(value) if ok else value
            if ok and isinstance(type_, FixedType) and len(value) != type_.length:
                raise ValidationError(
                    f"a {type_} literal needs exactly {type_.length} bytes, got {len(value)}"
                )
        else:  # int, long, date, time and the timestamps: ints in the internal representation
            ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = check(value)
    if not ok:
        raise ValidationError(
            f"a {type_} literal must hold its internal representation, got "
            f"{type(value).__name__} {value!r:.80}"
        )
    if isinstance(type_, FloatType | DoubleType):
        value = float(value)
        if math.isnan(value):
            raise ValidationError("a literal cannot be NaN: use is-nan / not-nan instead")
    to_bytes(type_, value)  # range, precision and scale checks of the type
    return value


def is_negative_zero(value: Any) -> bool:
    """Whether ``value`` is -0.0: equal to 0.0 in Python, but not to Java's ``Double.equals``
    nor in the metrics' ``Double.compare`` order, so literal sets and predicate equality
    tell the two apart (a set that lost -0.0 would change what a filter keeps)."""
    return isinstance(value, float) and value == 0.0 and math.copysign(1.0, value) < 0


class Literal:
    """A constant in a predicate, optionally typed.

    Untyped literals are the JSON-native values ``int``, ``float`` and ``str``: their meaning
    depends on the column they are compared with (``"2017-11-16"`` is a date for a date
    column, per the JSON single-value form). Every other Python value carries its type:
    ``bool`` is boolean, ``Decimal`` a decimal of its own precision and scale, ``date`` /
    ``time`` / ``datetime`` are converted to days / micros (``datetime`` with a zone is a
    ``timestamptz``), ``UUID`` is uuid and ``bytes`` binary. ``Literal(value, type)`` takes a
    value already in the internal representation of ``type``.

    Literals are never null or NaN: the spec requires ``is-null`` and ``is-nan`` instead.
    """

    __slots__ = ("type", "value")
    value: Any
    type: PrimitiveType | None

    def __init__(self, value: Any, type: PrimitiveType | None = None) -> None:
        if isinstance(value, Literal):
            if type is not None and value.type != type:
                raise ValidationError(f"literal {value} is not of type {type}")
            value, type = value.value, value.type
        elif type is None:
            if value is None:
                raise ValidationError("a literal cannot be null: use is-null / not-null instead")
            value, type = _infer(value)
        else:
            value = _check_typed(value, type)
        object.__setattr__(self, "value", value)
        object.__setattr__(self, "type", type)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("literals are immutable")

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Literal)
            and self.type == other.type
            and type(self.value) is type(other.value)
            and self.value == other.value
        )

    def __hash__(self) -> int:
        return hash((self.type, self.value))

    def __repr__(self) -> str:
        if self.type is None:
            return f"Literal({self.value!r})"
        return f"Literal({self.value!r}, {self.type!r})"

    def __str__(self) -> str:
        return repr(self.value) if self.type is None else f"{self.value!r}::{self.type}"


__all__ = ["Literal"]
