"""Compiling a bound filter into one closure, and deciding it on rows.

Every evaluator (rows here; partitions, manifests and file metrics in
:mod:`icefloe.expressions.evaluators`; residuals in :mod:`icefloe.expressions.projection`) is the same walk over a
bound filter with a different test per predicate, so :func:`compile_filter` does the walk
once and takes the leaf compiler as an argument. The row leaf lives here too, because the
row test is the meaning of a filter that the others approximate: projections and residuals
decide their partition filters with it, and the metrics evaluators are checked against it.
This module sits below both :mod:`icefloe.expressions.projection` and :mod:`icefloe.expressions.evaluators`, which is
what lets the evaluators use projections without the projections reaching back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from icefloe.errors import ValidationError
from icefloe.expressions import (
    AlwaysFalse,
    AlwaysTrue,
    And,
    BooleanExpression,
    BoundLiteralPredicate,
    BoundPredicate,
    BoundSetPredicate,
    BoundTerm,
    BoundTransform,
    Not,
    Operation,
    Or,
    UnboundPredicate,
    flatten,
    is_bound,
)
from icefloe.expressions.binding import bind
from icefloe.spec.schema import Schema
from icefloe.spec.types import StructType

X = TypeVar("X")
Test = Callable[[X], bool]
RowFilter = Callable[[Sequence[Any]], bool]


def always_true(_: Any) -> bool:
    return True


def always_false(_: Any) -> bool:
    return False


def compile_filter(expr: BooleanExpression, leaf: Callable[[BoundPredicate], Test[X]]) -> Test[X]:
    """Compile a bound expression into one closure; ``leaf`` compiles each predicate."""
    if isinstance(expr, AlwaysTrue):
        return always_true
    if isinstance(expr, AlwaysFalse):
        return always_false
    if isinstance(expr, BoundPredicate):
        return leaf(expr)
    if isinstance(expr, Not):
        inner = compile_filter(expr.child, leaf)
        return lambda x: not inner(x)
    if isinstance(expr, And | Or):
        parts = [compile_filter(e, leaf) for e in flatten(expr, type(expr))]
        if isinstance(expr, And):
            if len(parts) == 2:
                a, b = parts
                return lambda x: a(x) and b(x)
            return lambda x: all(p(x) for p in parts)
        if len(parts) == 2:
            a, b = parts
            return lambda x: a(x) or b(x)
        return lambda x: any(p(x) for p in parts)
    if isinstance(expr, UnboundPredicate):
        raise ValidationError(f"cannot evaluate unbound predicate {expr}; bind it first")
    raise ValidationError(f"not a boolean expression: {expr!r:.80}")


def _row_getter(term: BoundTerm, pred: BoundPredicate) -> Callable[[Sequence[Any]], Any]:
    ref = term.ref
    if ref.accessor is None:
        raise ValidationError(
            f"cannot evaluate {pred} on rows: column {ref.name!r} is inside a list or map"
        )
    get = ref.accessor.get
    if isinstance(term, BoundTransform):
        transform, source = term.transform, ref.field_type
        return lambda row: transform.apply(source, get(row))
    return get


def _row_leaf(pred: BoundPredicate) -> RowFilter:
    get = _row_getter(pred.term, pred)
    op = pred.op
    if op is Operation.IS_NULL:
        return lambda r: get(r) is None
    if op is Operation.NOT_NULL:
        return lambda r: get(r) is not None
    if op is Operation.IS_NAN:
        return lambda r: (v := get(r)) is not None and v != v
    if op is Operation.NOT_NAN:
        return lambda r: (v := get(r)) is None or v == v
    if isinstance(pred, BoundSetPredicate):
        values = pred.literals
        if op is Operation.IN:
            return lambda r: (v := get(r)) is not None and v in values
        return lambda r: (v := get(r)) is None or v not in values
    assert isinstance(pred, BoundLiteralPredicate)
    lit = pred.literal
    if op is Operation.LT:
        return lambda r: (v := get(r)) is not None and v < lit
    if op is Operation.LT_EQ:
        return lambda r: (v := get(r)) is not None and v <= lit
    if op is Operation.GT:
        return lambda r: (v := get(r)) is not None and v > lit
    if op is Operation.GT_EQ:
        return lambda r: (v := get(r)) is not None and v >= lit
    if op is Operation.EQ:
        return lambda r: (v := get(r)) is not None and v == lit
    if op is Operation.NOT_EQ:
        return lambda r: (v := get(r)) is None or v != lit
    if op is Operation.STARTS_WITH:
        return lambda r: (v := get(r)) is not None and v.startswith(lit)
    if op is Operation.NOT_STARTS_WITH:
        return lambda r: (v := get(r)) is None or not v.startswith(lit)
    raise ValidationError(f"unsupported operation {op}")  # pragma: no cover


def compile_row_filter(expr: BooleanExpression) -> RowFilter:
    """A function deciding a *bound* expression on rows given as nested tuples."""
    return compile_filter(expr, _row_leaf)


class Evaluator:
    """Decides a filter on rows of ``struct`` (tuples in field order, nested structs as
    tuples), with the spec's two-valued, null-safe semantics."""

    def __init__(
        self,
        struct: StructType | Schema,
        expr: BooleanExpression,
        case_sensitive: bool = True,
    ) -> None:
        schema = struct if isinstance(struct, Schema) else Schema.from_struct(struct)
        self.expr = expr if is_bound(expr) else bind(schema, expr, case_sensitive)
        self._test = compile_row_filter(self.expr)

    def eval(self, row: Sequence[Any]) -> bool:
        return self._test(row)

    __call__ = eval


__all__ = [
    "Evaluator",
    "RowFilter",
    "Test",
    "always_false",
    "always_true",
    "compile_filter",
    "compile_row_filter",
]
