"""Iceberg filter expressions: an immutable model of predicates over table columns.

Expressions start *unbound*: they name columns (``Reference("ts")``) and carry literals as the
caller wrote them. :mod:`icefloe.expressions.binding` resolves them against a schema into *bound*
expressions whose terms know the field id, type and row position and whose literals are
already converted to the column's internal representation (see :mod:`icefloe.spec.types`), so
evaluators never convert or look anything up per row or per file.

Semantics follow the expressions spec: two-valued, null-safe logic. ``x < 5`` is false for a
null or NaN ``x``, ``x != 5`` is true for a null ``x``, and ``NOT`` is an exact complement.
The last point matters for :func:`rewrite_not`: ``NOT (x < 5)`` is *not* ``x >= 5`` (a null
row matches the former only), so a bound order comparison negates to
``x >= 5 OR x IS NULL [OR x IS NaN]``. Unbound order comparisons cannot know whether their
column is nullable or floating point, so they keep their ``Not`` until they are bound.

The constructors of ``And``, ``Or`` and ``Not`` simplify on the spot (``And(x, AlwaysTrue())``
is ``x``), which keeps projected and residual filters small without a separate pass.

The package is laid out one concept per module, in dependency order:
:mod:`~icefloe.expressions.operations` (what a predicate can do),
:mod:`~icefloe.expressions.literals` (constants), :mod:`~icefloe.expressions.terms` (columns and
transforms of columns), :mod:`~icefloe.expressions.boolean` (the expression base class,
constants and connectives), :mod:`~icefloe.expressions.predicates` (the leaves) and
:mod:`~icefloe.expressions.visitors` (walks over a tree), and
:mod:`~icefloe.expressions.parser` (the filter syntax people write, PyIceberg's: ``a >= 1 and
b in ('x', 'y')``). Import from ``icefloe.expressions``:
it re-exports the public names of all of them.
"""

from __future__ import annotations

from icefloe.expressions.boolean import AlwaysFalse, AlwaysTrue, And, BooleanExpression, Not, Or
from icefloe.expressions.literals import Literal
from icefloe.expressions.operations import Operation
from icefloe.expressions.parser import FilterSyntaxError, format_filter, parse_filter
from icefloe.expressions.predicates import (
    BoundLiteralPredicate,
    BoundPredicate,
    BoundSetPredicate,
    BoundUnaryPredicate,
    EqualTo,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNaN,
    IsNull,
    LessThan,
    LessThanOrEqual,
    LiteralPredicate,
    NotEqualTo,
    NotIn,
    NotNaN,
    NotNull,
    NotStartsWith,
    SetPredicate,
    StartsWith,
    UnaryPredicate,
    UnboundPredicate,
    predicate,
)
from icefloe.expressions.terms import (
    Accessor,
    BoundReference,
    BoundTerm,
    BoundTransform,
    IdReference,
    Reference,
    Term,
    TransformTerm,
    UnboundTerm,
)
from icefloe.expressions.visitors import (
    BooleanExpressionVisitor,
    RebuildingVisitor,
    bound_predicates,
    flatten,
    is_bound,
    rewrite_not,
    visit,
)

__all__ = [
    "Accessor",
    "AlwaysFalse",
    "AlwaysTrue",
    "And",
    "BooleanExpression",
    "BooleanExpressionVisitor",
    "BoundLiteralPredicate",
    "BoundPredicate",
    "BoundReference",
    "BoundSetPredicate",
    "BoundTerm",
    "BoundTransform",
    "BoundUnaryPredicate",
    "EqualTo",
    "FilterSyntaxError",
    "GreaterThan",
    "GreaterThanOrEqual",
    "IdReference",
    "In",
    "IsNaN",
    "IsNull",
    "LessThan",
    "LessThanOrEqual",
    "Literal",
    "LiteralPredicate",
    "Not",
    "NotEqualTo",
    "NotIn",
    "NotNaN",
    "NotNull",
    "NotStartsWith",
    "Operation",
    "Or",
    "RebuildingVisitor",
    "Reference",
    "SetPredicate",
    "StartsWith",
    "Term",
    "TransformTerm",
    "UnaryPredicate",
    "UnboundPredicate",
    "UnboundTerm",
    "bound_predicates",
    "flatten",
    "format_filter",
    "is_bound",
    "parse_filter",
    "predicate",
    "rewrite_not",
    "visit",
]
