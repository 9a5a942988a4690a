"""Binding: resolve an unbound expression against a schema, once, before any evaluation.

Binding does all the work evaluators must not repeat per row or per file: names become
field ids, types and row accessors; literals become values of the column's type in the
internal representation; and predicates that the column type decides on its own collapse to
constants (``required_col IS NULL`` is false).

Literal conversion never inserts an unsafe cast (the expressions spec requires failing
instead). A literal of another type is aligned with the column by exact reasoning: for an
``int`` column, ``x < 5.5`` becomes ``x <= 5``, ``x = 5.5`` becomes false and
``x < 2**40`` becomes ``x IS NOT NULL`` (true for a required column; Java collapses it to
true even for nullable columns, which is wrong for null rows under the spec's two-valued
logic). The one rounding conversion is a number compared with a ``float`` column: it is
rounded to the nearest 32-bit float, as Java and SQL engines do, so ``f = 0.1`` finds the
rows written as ``0.1f``.
"""

from __future__ import annotations

import difflib
import math
import struct
from collections.abc import Callable
from dataclasses import dataclass
from decimal import ROUND_CEILING, ROUND_FLOOR, Context, Decimal, InvalidOperation
from typing import Any

from icefloe.errors import ValidationError
from icefloe.expressions import (
    Accessor,
    AlwaysFalse,
    AlwaysTrue,
    And,
    BooleanExpression,
    BoundLiteralPredicate,
    BoundPredicate,
    BoundReference,
    BoundSetPredicate,
    BoundTerm,
    BoundTransform,
    BoundUnaryPredicate,
    IdReference,
    Literal,
    LiteralPredicate,
    Operation,
    Or,
    RebuildingVisitor,
    Reference,
    SetPredicate,
    TransformTerm,
    UnboundPredicate,
    UnboundTerm,
    is_bound,
    rewrite_not,
    visit,
)
from icefloe.expressions.literals import is_negative_zero
from icefloe.spec.schema import Schema
from icefloe.spec.transforms import IdentityTransform
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
)
from icefloe.spec.values import from_json_value

_INT_MIN, _INT_MAX = -(2**31), 2**31 - 1
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1
_MICROS_PER_DAY = 86_400_000_000
_NANOS_PER_DAY = _MICROS_PER_DAY * 1000
_FLOAT_MAX = struct.unpack("<f", b"\xff\xff\x7f\x7f")[0]
_F32 = struct.Struct("<f")
_INF = math.inf
_DECIMAL_CONTEXT = Context(prec=120)


def bind(schema: Schema, expr: BooleanExpression, case_sensitive: bool = True) -> BooleanExpression:
    """Bind every predicate of ``expr`` to ``schema``; constants and structure are kept.

    Raises :class:`ValidationError` naming the predicate and column for unknown columns
    (with close matches), impossible literal conversions and operations the column type
    does not support (starts-with on a non-string, is-nan on a non-float).
    """
    return visit(expr, _Binder(schema, case_sensitive))


def prepare_filter(
    schema: Schema, expr: BooleanExpression, case_sensitive: bool = True
) -> BooleanExpression:
    """Bind (unless already bound) and push NOTs down: the form that projections, residuals
    and the metrics evaluators work on."""
    bound = expr if is_bound(expr) else bind(schema, expr, case_sensitive)
    return rewrite_not(bound)


def bind_reference(
    schema: Schema, term: Reference | IdReference, case_sensitive: bool = True
) -> BoundReference:
    """Resolve a column reference to its field, full dotted name, accessor and nullability."""
    if isinstance(term, IdReference):
        field = schema.find_field(term.field_id)
        if field is None:
            raise ValidationError(f"schema {schema.schema_id} has no field with id {term.field_id}")
    else:
        field = schema.find_field(term.name, case_sensitive)
        if field is None:
            raise ValidationError(
                f"schema {schema.schema_id} has no column {term.name!r}"
                + _suggestions(schema, term.name, case_sensitive)
            )
    name = schema.find_column_name(field.field_id) or field.name
    accessor, nullable = _locate(schema, field)
    return BoundReference(field, accessor, name, nullable)


def bind_term(schema: Schema, term: UnboundTerm, case_sensitive: bool = True) -> BoundTerm:
    if isinstance(term, Reference | IdReference):
        return bind_reference(schema, term, case_sensitive)
    if isinstance(term, TransformTerm):
        ref = bind_reference(schema, term.term, case_sensitive)
        if isinstance(term.transform, IdentityTransform):
            # identity(x) is x: binding it as the column keeps metrics and projections usable.
            if not term.transform.can_transform(ref.field_type):
                raise ValidationError(
                    f"transform identity cannot be applied to column {ref.name!r} "
                    f"of type {ref.field_type}"
                )
            return ref
        return BoundTransform(term.transform, ref)
    raise ValidationError(f"cannot bind term {term!r:.80}")


def _suggestions(schema: Schema, name: str, case_sensitive: bool) -> str:
    names = schema.column_names
    if case_sensitive:
        folded = [n for n in names if n.lower() == name.lower()]
        if folded:
            return f" (names are case sensitive: did you mean {folded[0]!r}?)"
    by_lower = {n.lower(): n for n in names}
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=3, cutoff=0.6)
    if close:
        return "; did you mean " + " or ".join(repr(by_lower[c]) for c in close) + "?"
    top = [f.name for f in schema.fields][:10]
    return f"; its top-level columns are {top}"


def _locate(schema: Schema, field: NestedField) -> tuple[Accessor | None, bool]:
    """The struct-position path to ``field`` (None inside a list or map) and whether any
    field on that path is optional (a null parent struct makes the field null too)."""
    chain = [field.field_id]
    parent = schema.parent_id(field.field_id)
    while parent is not None:
        chain.append(parent)
        parent = schema.parent_id(parent)
    chain.reverse()
    positions: list[int] = []
    nullable = False
    container: IcebergType = schema.struct
    in_repeated = False
    for fid in chain:
        if isinstance(container, ListType | MapType):
            in_repeated = True
        current = schema.find_field(fid)
        assert current is not None  # ids come from the schema's own parent index
        if isinstance(container, StructType):
            positions.append(next(i for i, f in enumerate(container.fields) if f.field_id == fid))
        nullable = nullable or current.optional
        container = current.field_type
    return (None if in_repeated else Accessor(positions)), nullable


# ---------------------------------------------------------------------------------------------
# Literal conversion
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Converted:
    """A literal placed in a column type's domain.

    ``floor`` is the greatest value of the type not above the literal (None when the literal
    is below the type's range) and ``ceil`` the least value not below it (None when above).
    ``exact`` when the literal is itself a value of the type (then floor is ceil).
    """

    floor: Any
    ceil: Any
    exact: bool


def _exact(value: Any) -> _Converted:
    return _Converted(value, value, True)


def _clamp(floor: Any, ceil: Any, low: Any, high: Any) -> _Converted:
    if floor > high:
        return _Converted(high, None, False)
    if ceil < low:
        return _Converted(None, low, False)
    if floor == ceil:
        return _exact(floor)
    return _Converted(floor if floor >= low else None, ceil if ceil <= high else None, False)


class _Unconvertible(Exception):
    """The literal cannot be compared with the column type; the message says why."""


# Literal "kinds": what a literal is, independent of the column it is compared with.
_KIND_BY_TYPE: dict[type, str] = {
    BooleanType: "bool",
    IntegerType: "int",
    LongType: "int",
    FloatType: "float",
    DoubleType: "float",
    DecimalType: "decimal",
    StringType: "str",
    DateType: "date",
    TimeType: "time",
    TimestampType: "micros",
    TimestamptzType: "micros",
    TimestampNanoType: "nanos",
    TimestamptzNanoType: "nanos",
    UUIDType: "uuid",
    BinaryType: "bytes",
    FixedType: "bytes",
}


def _kind(lit: Literal) -> str:
    if lit.type is None:
        if isinstance(lit.value, int):
            return "int"
        if isinstance(lit.value, float):
            return "float"
        return "str"
    kind = _KIND_BY_TYPE.get(type(lit.type))
    if kind is None:
        raise _Unconvertible(f"literals of type {lit.type} cannot be compared")
    return kind


def _ranged(value: int, low: int, high: int) -> _Converted:
    return _clamp(value, value, low, high)


def _divided(value: int, unit: int, low: int, high: int) -> _Converted:
    """A finer time unit expressed in a coarser one (nanos in micros, micros in days)."""
    return _clamp(value // unit, -(-value // unit), low, high)


def _to_integer(kind: str, value: Any, low: int, high: int) -> _Converted:
    if kind == "int":
        return _ranged(value, low, high)
    if kind == "float":
        if math.isinf(value):
            return _Converted(high, None, False) if value > 0 else _Converted(None, low, False)
        return _clamp(math.floor(value), math.ceil(value), low, high)
    if kind == "decimal":
        floor = int(value.to_integral_value(rounding=ROUND_FLOOR, context=_DECIMAL_CONTEXT))
        ceil = int(value.to_integral_value(rounding=ROUND_CEILING, context=_DECIMAL_CONTEXT))
        return _clamp(floor, ceil, low, high)
    raise _Unconvertible("expected a number")


def _nearest_float(value: float, single: bool) -> _Converted:
    """Round to the nearest double (or 32-bit float); values beyond the finite range have the
    largest finite value as floor and infinity as ceil."""
    if single and math.isfinite(value):
        try:
            return _exact(_F32.unpack(_F32.pack(value))[0])
        except OverflowError:
            pass
        return (
            _Converted(_FLOAT_MAX, _INF, False)
            if value > 0
            else _Converted(-_INF, -_FLOAT_MAX, False)
        )
    return _exact(value)


def _to_float(kind: str, value: Any, single: bool) -> _Converted:
    if kind == "float":
        return _nearest_float(value, single)
    if kind in ("int", "decimal"):
        top = _FLOAT_MAX if single else 1.7976931348623157e308
        try:
            as_float = float(value)
        except OverflowError:
            as_float = _INF if value > 0 else -_INF
        if math.isinf(as_float):  # a finite number beyond every finite double
            return _Converted(top, _INF, False) if value > 0 else _Converted(-_INF, -top, False)
        return _nearest_float(as_float, single)
    raise _Unconvertible("expected a number")


def _parse_decimal_text(text: str) -> Decimal:
    try:
        value = Decimal(text.strip())
    except InvalidOperation:
        raise _Unconvertible(f"{text!r} is not a decimal number") from None
    if not value.is_finite():
        raise _Unconvertible(f"{text!r} is not a finite decimal number")
    return value


def _to_decimal(kind: str, value: Any, t: DecimalType) -> _Converted:
    if kind == "str":
        value = _parse_decimal_text(value)
    elif kind == "float":
        value = Decimal(value)  # exact: every double is a decimal fraction (or infinite)
    elif kind == "int":
        value = Decimal(value)
    elif kind != "decimal":
        raise _Unconvertible("expected a number or a decimal string")
    step = Decimal(1).scaleb(-t.scale)
    high = (Decimal(10**t.precision - 1) * step).quantize(step, context=_DECIMAL_CONTEXT)
    low = -high
    if value > high:
        return _Converted(high, None, False)
    if value < low:
        return _Converted(None, low, False)
    floor = value.quantize(step, rounding=ROUND_FLOOR, context=_DECIMAL_CONTEXT)
    ceil = value.quantize(step, rounding=ROUND_CEILING, context=_DECIMAL_CONTEXT)
    if floor == ceil:
        return _exact(floor)
    return _Converted(floor, ceil, False)


def _from_json_text(t: PrimitiveType, value: str) -> _Converted:
    try:
        return _exact(from_json_value(t, value))
    except ValidationError as e:
        raise _Unconvertible(str(e)) from None


def _convert(lit: Literal, t: PrimitiveType) -> _Converted:
    kind = _kind(lit)
    value = lit.value
    if isinstance(t, BooleanType):
        if kind == "bool":
            return _exact(value)
    elif isinstance(t, IntegerType):
        return _to_integer(kind, value, _INT_MIN, _INT_MAX)
    elif isinstance(t, LongType):
        return _to_integer(kind, value, _LONG_MIN, _LONG_MAX)
    elif isinstance(t, FloatType | DoubleType):
        return _to_float(kind, value, isinstance(t, FloatType))
    elif isinstance(t, DecimalType):
        return _to_decimal(kind, value, t)
    elif isinstance(t, StringType):
        if kind == "str":
            return _exact(value)
    elif isinstance(t, DateType):
        if kind in ("date", "int"):
            return _ranged(value, _INT_MIN, _INT_MAX)
        if kind == "micros":
            return _divided(value, _MICROS_PER_DAY, _INT_MIN, _INT_MAX)
        if kind == "nanos":
            return _divided(value, _NANOS_PER_DAY, _INT_MIN, _INT_MAX)
        if kind == "str":
            return _from_json_text(t, value)
    elif isinstance(t, TimeType):
        if kind in ("time", "int"):
            return _ranged(value, 0, _MICROS_PER_DAY - 1)
        if kind == "str":
            return _from_json_text(t, value)
    elif isinstance(t, TimestampType | TimestamptzType):
        if kind in ("micros", "int"):
            return _ranged(value, _LONG_MIN, _LONG_MAX)
        if kind == "date":
            return _ranged(value * _MICROS_PER_DAY, _LONG_MIN, _LONG_MAX)
        if kind == "nanos":
            return _divided(value, 1000, _LONG_MIN, _LONG_MAX)
        if kind == "str":
            return _from_json_text(t, value)
    elif isinstance(t, TimestampNanoType | TimestamptzNanoType):
        if kind in ("nanos", "int"):
            return _ranged(value, _LONG_MIN, _LONG_MAX)
        if kind == "micros":
            return _ranged(value * 1000, _LONG_MIN, _LONG_MAX)
        if kind == "date":
            return _ranged(value * _NANOS_PER_DAY, _LONG_MIN, _LONG_MAX)
        if kind == "str":
            return _from_json_text(t, value)
    elif isinstance(t, UUIDType):
        if kind == "uuid":
            return _exact(value)
        if kind == "str":
            return _from_json_text(t, value)
    elif isinstance(t, BinaryType):
        if kind == "bytes":
            return _exact(value)
        if kind == "str":
            return _from_json_text(t, value)
    elif isinstance(t, FixedType):
        if kind == "bytes":
            if len(value) != t.length:
                raise _Unconvertible(f"has {len(value)} bytes, the column holds exactly {t.length}")
            return _exact(value)
        if kind == "str":
            return _from_json_text(t, value)
    else:
        raise _Unconvertible(f"columns of type {t} cannot be compared with literals")
    raise _Unconvertible(f"{lit} is not a {t} value")


def _domain(t: IcebergType) -> tuple[Any, Any] | None:
    """The least and greatest values of an ordered type, when it has both."""
    if isinstance(t, IntegerType | DateType):
        return _INT_MIN, _INT_MAX
    if isinstance(t, LongType | TimestampType | TimestamptzType):
        return _LONG_MIN, _LONG_MAX
    if isinstance(t, TimestampNanoType | TimestamptzNanoType):
        return _LONG_MIN, _LONG_MAX
    if isinstance(t, TimeType):
        return 0, _MICROS_PER_DAY - 1
    if isinstance(t, FloatType | DoubleType):
        return -_INF, _INF
    if isinstance(t, DecimalType):
        step = Decimal(1).scaleb(-t.scale)
        high = (Decimal(10**t.precision - 1) * step).quantize(step, context=_DECIMAL_CONTEXT)
        return -high, high
    return None


# ---------------------------------------------------------------------------------------------
# Predicates
# ---------------------------------------------------------------------------------------------


def _non_null(term: BoundTerm) -> BooleanExpression:
    """Every value that an order comparison can match: not null and not NaN."""
    result: BooleanExpression = AlwaysTrue()
    if term.nullable:
        result = BoundUnaryPredicate(Operation.NOT_NULL, term)
    if term.may_be_nan:
        result = And(result, BoundUnaryPredicate(Operation.NOT_NAN, term))
    return result


def _is_null_only(t: IcebergType) -> bool:
    return isinstance(t, UnknownType)


def _bind_unary(op: Operation, term: BoundTerm, describe: Callable[[], str]) -> BooleanExpression:
    t = term.result_type
    if op is Operation.IS_NULL:
        if _is_null_only(t):
            return AlwaysTrue()
        return BoundUnaryPredicate(op, term) if term.nullable else AlwaysFalse()
    if op is Operation.NOT_NULL:
        if _is_null_only(t):
            return AlwaysFalse()
        return BoundUnaryPredicate(op, term) if term.nullable else AlwaysTrue()
    if not isinstance(t, FloatType | DoubleType):
        raise ValidationError(
            f"cannot bind {describe()}: {op} applies to float and double columns only, "
            f"{term} is {t}"
        )
    return BoundUnaryPredicate(op, term)


def _comparable(term: BoundTerm, describe: Callable[[], str]) -> PrimitiveType:
    t = term.result_type
    if not isinstance(t, PrimitiveType) or _KIND_BY_TYPE.get(type(t)) is None:
        raise ValidationError(
            f"cannot bind {describe()}: {term} has type {t}, which cannot be compared with "
            "literals (only is-null and not-null apply)"
        )
    return t


def _convert_for(
    lit: Literal, term: BoundTerm, t: PrimitiveType, describe: Callable[[], str]
) -> _Converted:
    try:
        return _convert(lit, t)
    except _Unconvertible as e:
        raise ValidationError(
            f"cannot bind {describe()}: literal {lit} cannot be compared with column "
            f"{term.ref.name!r} of type {t}: {e}"
        ) from None


def _bind_starts_with(
    op: Operation, term: BoundTerm, lit: Literal, describe: Callable[[], str]
) -> BooleanExpression:
    t = term.result_type
    if not isinstance(t, StringType):
        raise ValidationError(
            f"cannot bind {describe()}: {op} applies to string columns only, {term} is {t}"
        )
    if _kind(lit) != "str":
        raise ValidationError(f"cannot bind {describe()}: the prefix must be a string, got {lit}")
    prefix: str = lit.value
    if not prefix:  # every string starts with "", so only nulls fail (or pass) the test
        if op is Operation.STARTS_WITH:
            return _bind_unary(Operation.NOT_NULL, term, describe)
        return _bind_unary(Operation.IS_NULL, term, describe)
    return BoundLiteralPredicate(op, term, prefix)


def _bind_comparison(
    op: Operation, term: BoundTerm, lit: Literal, describe: Callable[[], str]
) -> BooleanExpression:
    t = _comparable(term, describe)
    conv = _convert_for(lit, term, t, describe)
    if op is Operation.EQ:
        return BoundLiteralPredicate(op, term, conv.floor) if conv.exact else AlwaysFalse()
    if op is Operation.NOT_EQ:
        return BoundLiteralPredicate(op, term, conv.floor) if conv.exact else AlwaysTrue()
    domain = _domain(t)
    low, high = domain if domain is not None else (None, None)
    if op is Operation.LT or op is Operation.LT_EQ:
        if conv.exact and op is Operation.LT:
            if domain is not None and conv.floor == low:
                return AlwaysFalse()
            return BoundLiteralPredicate(op, term, conv.floor)
        # x <= floor: also x < v for an inexact v, as no value of the type lies in between.
        if conv.floor is None:
            return AlwaysFalse()
        if domain is not None and conv.floor == high:
            return _non_null(term)
        return BoundLiteralPredicate(Operation.LT_EQ, term, conv.floor)
    # GT / GT_EQ mirror the above.
    if conv.exact and op is Operation.GT:
        if domain is not None and conv.ceil == high:
            return AlwaysFalse()
        return BoundLiteralPredicate(op, term, conv.ceil)
    if conv.ceil is None:
        return AlwaysFalse()
    if domain is not None and conv.ceil == low:
        return _non_null(term)
    return BoundLiteralPredicate(Operation.GT_EQ, term, conv.ceil)


def _bind_set(
    op: Operation, term: BoundTerm, literals: tuple[Literal, ...], describe: Callable[[], str]
) -> BooleanExpression:
    t = _comparable(term, describe)
    values: dict[Any, None] = {}
    negative_zero = False
    for lit in literals:
        conv = _convert_for(lit, term, t, describe)
        if not conv.exact:  # a value the column cannot hold never equals any row
            continue
        value = conv.floor
        if is_negative_zero(value):
            # A set would collapse -0.0 into 0.0: it stays a test of its own.
            negative_zero = True
            continue
        values[value] = None
    if negative_zero and values:
        single = Operation.EQ if op is Operation.IN else Operation.NOT_EQ
        rest = _set_or_single(op, term, values)
        zero = BoundLiteralPredicate(single, term, -0.0)
        return Or(rest, zero) if op is Operation.IN else And(rest, zero)
    if negative_zero:
        values[-0.0] = None
    if not values:
        return AlwaysFalse() if op is Operation.IN else AlwaysTrue()
    return _set_or_single(op, term, values)


def _set_or_single(op: Operation, term: BoundTerm, values: dict[Any, None]) -> BoundPredicate:
    """``op`` over the distinct ``values``: a set test, or (one value) ``=``/``!=``."""
    if len(values) == 1:
        (only,) = values
        single = Operation.EQ if op is Operation.IN else Operation.NOT_EQ
        return BoundLiteralPredicate(single, term, only)
    return BoundSetPredicate(op, term, values)


def bind_predicate(
    schema: Schema, pred: UnboundPredicate, case_sensitive: bool = True
) -> BooleanExpression:
    """Bind one predicate; the result may be a constant or a small expression."""

    def describe() -> str:
        return str(pred)

    try:
        term = bind_term(schema, pred.term, case_sensitive)
    except ValidationError as e:
        raise ValidationError(f"cannot bind {pred}: {e}") from None
    op = pred.op
    if op.is_unary:
        return _bind_unary(op, term, describe)
    if isinstance(pred, SetPredicate):
        return _bind_set(op, term, pred.literals, describe)
    assert isinstance(pred, LiteralPredicate)
    if op is Operation.STARTS_WITH or op is Operation.NOT_STARTS_WITH:
        return _bind_starts_with(op, term, pred.literal, describe)
    return _bind_comparison(op, term, pred.literal, describe)


class _Binder(RebuildingVisitor):
    def __init__(self, schema: Schema, case_sensitive: bool) -> None:
        self.schema = schema
        self.case_sensitive = case_sensitive

    def visit_unbound_predicate(self, predicate: UnboundPredicate) -> BooleanExpression:
        return bind_predicate(self.schema, predicate, self.case_sensitive)

    def visit_bound_predicate(self, predicate: BoundPredicate) -> BooleanExpression:
        # Re-binding is harmless when the predicate was bound to this schema's field.
        current = self.schema.find_field(predicate.ref.field_id)
        if current != predicate.ref.field:
            raise ValidationError(
                f"{predicate} is already bound to a field that is not in schema "
                f"{self.schema.schema_id}; bind the unbound expression instead"
            )
        return predicate


__all__ = [
    "bind",
    "bind_predicate",
    "bind_reference",
    "bind_term",
    "prepare_filter",
]
