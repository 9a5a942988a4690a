"""Predicates, the leaves of a filter: a term tested by an operation, unbound or bound.

*Unbound* predicates are what callers and the JSON form build: one class per operation
(``EqualTo``, ``In``, ...), holding :class:`~icefloe.expressions.literals.Literal` values as
written. *Bound* predicates are what binding produces and evaluators consume: one class per
arity (unary, one literal, a set), holding literals already in the column's internal
representation, so nothing is converted per row or per file.

Negation is exact under the spec's two-valued, null-safe logic. That is why a bound order
comparison negates to ``x >= v OR x IS NULL [OR x IS NaN]`` rather than to ``x >= v``, and
why an unbound one keeps its ``Not`` until binding tells whether the column is nullable or
floating point.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterable
from typing import Any, ClassVar

from icefloe.errors import ValidationError
from icefloe.expressions.boolean import BooleanExpression, Not, Or
from icefloe.expressions.literals import Literal, is_negative_zero
from icefloe.expressions.operations import Operation
from icefloe.expressions.terms import BoundReference, BoundTerm, Reference, Term, UnboundTerm


def _term(term: str | Term) -> UnboundTerm:
    if isinstance(term, str):
        return Reference(term)
    if isinstance(term, UnboundTerm):
        return term
    raise ValidationError(
        f"an unbound predicate needs a column name or unbound term, got {term!r:.80}"
    )


def _signed_key(lit: Literal) -> tuple[Literal, bool]:
    """A literal's identity in a set (:func:`is_negative_zero`)."""
    return lit, is_negative_zero(lit.value)


def _literal(value: Any) -> Literal:
    return value if isinstance(value, Literal) else Literal(value)


class UnboundPredicate(BooleanExpression):
    """A test of an unbound term. Subclasses fix the operation (``EqualTo`` is ``eq``)."""

    __slots__ = ("term",)
    op: ClassVar[Operation]
    term: UnboundTerm

    def negate(self) -> BooleanExpression:
        complement = self.op.complement
        if complement is None:
            return Not(self)
        return self._with_op(complement)

    @abstractmethod
    def _with_op(self, op: Operation) -> UnboundPredicate: ...


class UnaryPredicate(UnboundPredicate):
    """is-null, not-null, is-nan, not-nan."""

    __slots__ = ()

    def __init__(self, term: str | UnboundTerm) -> None:
        object.__setattr__(self, "term", _term(term))

    def _with_op(self, op: Operation) -> UnboundPredicate:
        cls = _UNARY_CLASSES[op]
        return cls(self.term)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.term == self.term

    def __hash__(self) -> int:
        return hash((self.op, self.term))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.term!r})"

    def __str__(self) -> str:
        return f"{self.term} {self.op}"


class LiteralPredicate(UnboundPredicate):
    """A comparison of a term with one literal (lt, eq, starts-with, ...)."""

    __slots__ = ("literal",)
    literal: Literal

    def __init__(self, term: str | UnboundTerm, value: Any) -> None:
        object.__setattr__(self, "term", _term(term))
        object.__setattr__(self, "literal", _literal(value))

    def _with_op(self, op: Operation) -> UnboundPredicate:
        return _LITERAL_CLASSES[op](self.term, self.literal)

    def __eq__(self, other: object) -> bool:
        return (
            type(other) is type(self) and other.term == self.term and other.literal == self.literal
        )

    def __hash__(self) -> int:
        return hash((self.op, self.term, self.literal))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.term!r}, {self.literal!r})"

    def __str__(self) -> str:
        return f"{self.term} {self.op} {self.literal}"


class SetPredicate(UnboundPredicate):
    """in / not-in: membership in a set of literals (kept in first-seen order)."""

    __slots__ = ("literals",)
    literals: tuple[Literal, ...]

    def __init__(self, term: str | UnboundTerm, values: Iterable[Any]) -> None:
        if isinstance(values, str | bytes):
            raise ValidationError(
                f"{self.op} needs a collection of values, got the single value {values!r:.80}"
            )
        distinct: dict[tuple[Literal, bool], Literal] = {}
        for lit in map(_literal, values):
            distinct.setdefault(_signed_key(lit), lit)
        literals = tuple(distinct.values())
        object.__setattr__(self, "term", _term(term))
        object.__setattr__(self, "literals", literals)

    def _with_op(self, op: Operation) -> UnboundPredicate:
        return _SET_CLASSES[op](self.term, self.literals)

    def __eq__(self, other: object) -> bool:
        return (
            type(other) is type(self)
            and other.term == self.term
            and set(other.literals) == set(self.literals)
        )

    def __hash__(self) -> int:
        return hash((self.op, self.term, frozenset(self.literals)))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.term!r}, {list(self.literals)!r})"

    def __str__(self) -> str:
        return f"{self.term} {self.op} ({', '.join(str(lit) for lit in self.literals)})"


class IsNull(UnaryPredicate):
    __slots__ = ()
    op = Operation.IS_NULL


class NotNull(UnaryPredicate):
    __slots__ = ()
    op = Operation.NOT_NULL


class IsNaN(UnaryPredicate):
    __slots__ = ()
    op = Operation.IS_NAN


class NotNaN(UnaryPredicate):
    __slots__ = ()
    op = Operation.NOT_NAN


class LessThan(LiteralPredicate):
    __slots__ = ()
    op = Operation.LT


class LessThanOrEqual(LiteralPredicate):
    __slots__ = ()
    op = Operation.LT_EQ


class GreaterThan(LiteralPredicate):
    __slots__ = ()
    op = Operation.GT


class GreaterThanOrEqual(LiteralPredicate):
    __slots__ = ()
    op = Operation.GT_EQ


class EqualTo(LiteralPredicate):
    __slots__ = ()
    op = Operation.EQ


class NotEqualTo(LiteralPredicate):
    __slots__ = ()
    op = Operation.NOT_EQ


class StartsWith(LiteralPredicate):
    __slots__ = ()
    op = Operation.STARTS_WITH


class NotStartsWith(LiteralPredicate):
    __slots__ = ()
    op = Operation.NOT_STARTS_WITH


class In(SetPredicate):
    __slots__ = ()
    op = Operation.IN


class NotIn(SetPredicate):
    __slots__ = ()
    op = Operation.NOT_IN


_UNARY_CLASSES: dict[Operation, type[UnaryPredicate]] = {
    c.op: c for c in (IsNull, NotNull, IsNaN, NotNaN)
}
_LITERAL_CLASSES: dict[Operation, type[LiteralPredicate]] = {
    c.op: c
    for c in (
        LessThan,
        LessThanOrEqual,
        GreaterThan,
        GreaterThanOrEqual,
        EqualTo,
        NotEqualTo,
        StartsWith,
        NotStartsWith,
    )
}
_SET_CLASSES: dict[Operation, type[SetPredicate]] = {c.op: c for c in (In, NotIn)}


def predicate(
    op: Operation, term: str | UnboundTerm, values: Iterable[Any] = ()
) -> UnboundPredicate:
    """Build the unbound predicate for ``op``: no value for unary tests, one for
    comparisons, any number for in / not-in."""
    items = list(values)
    if op.is_unary:
        if items:
            raise ValidationError(f"{op} takes no value, got {items!r:.80}")
        return _UNARY_CLASSES[op](term)
    if op.is_set:
        return _SET_CLASSES[op](term, items)
    if len(items) != 1:
        raise ValidationError(f"{op} takes exactly one value, got {len(items)}")
    return _LITERAL_CLASSES[op](term, items[0])


# ---------------------------------------------------------------------------------------------
# Bound predicates
# ---------------------------------------------------------------------------------------------


class BoundPredicate(BooleanExpression):
    """A test of a bound term; literals are in the internal representation of its type."""

    __slots__ = ("op", "term")
    op: Operation
    term: BoundTerm

    @property
    def ref(self) -> BoundReference:
        return self.term.ref

    def negate(self) -> BooleanExpression:
        complement = self.op.complement
        if complement is not None:
            return self._with_op(complement)
        # NOT (x < v) holds for x >= v and also for null and NaN x, which x >= v rejects.
        result: BooleanExpression = self._with_op(self.op.order_negation)
        if self.term.nullable:
            result = Or(result, BoundUnaryPredicate(Operation.IS_NULL, self.term))
        if self.term.may_be_nan:
            result = Or(result, BoundUnaryPredicate(Operation.IS_NAN, self.term))
        return result

    @abstractmethod
    def _with_op(self, op: Operation) -> BoundPredicate: ...


class BoundUnaryPredicate(BoundPredicate):
    __slots__ = ()

    def __init__(self, op: Operation, term: BoundTerm) -> None:
        if not op.is_unary:
            raise ValidationError(f"{op} is not a unary test")
        object.__setattr__(self, "op", op)
        object.__setattr__(self, "term", term)

    def _with_op(self, op: Operation) -> BoundPredicate:
        return BoundUnaryPredicate(op, self.term)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, BoundUnaryPredicate)
            and other.op is self.op
            and other.term == self.term
        )

    def __hash__(self) -> int:
        return hash((self.op, self.term))

    def __repr__(self) -> str:
        return f"BoundUnaryPredicate({self.op.name}, {self.term!r})"

    def __str__(self) -> str:
        return f"{self.term} {self.op}"


class BoundLiteralPredicate(BoundPredicate):
    __slots__ = ("literal",)
    literal: Any

    def __init__(self, op: Operation, term: BoundTerm, literal: Any) -> None:
        if not op.is_literal:
            raise ValidationError(f"{op} does not compare with a single literal")
        if literal is None:
            raise ValidationError(f"{op} on {term} needs a non-null literal")
        object.__setattr__(self, "op", op)
        object.__setattr__(self, "term", term)
        object.__setattr__(self, "literal", literal)

    def _with_op(self, op: Operation) -> BoundPredicate:
        return BoundLiteralPredicate(op, self.term, self.literal)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, BoundLiteralPredicate)
            and other.op is self.op
            and other.term == self.term
            and type(other.literal) is type(self.literal)
            and other.literal == self.literal
            and is_negative_zero(other.literal) == is_negative_zero(self.literal)
        )

    def __hash__(self) -> int:
        return hash((self.op, self.term, self.literal))

    def __repr__(self) -> str:
        return f"BoundLiteralPredicate({self.op.name}, {self.term!r}, {self.literal!r})"

    def __str__(self) -> str:
        return f"{self.term} {self.op} {self.literal!r}"


class BoundSetPredicate(BoundPredicate):
    __slots__ = ("literals",)
    literals: frozenset[Any]

    def __init__(self, op: Operation, term: BoundTerm, literals: Iterable[Any]) -> None:
        if not op.is_set:
            raise ValidationError(f"{op} is not a set test")
        values = frozenset(literals)
        if None in values:
            raise ValidationError(f"{op} on {term} cannot test for null: use is-null")
        object.__setattr__(self, "op", op)
        object.__setattr__(self, "term", term)
        object.__setattr__(self, "literals", values)

    def _with_op(self, op: Operation) -> BoundPredicate:
        return BoundSetPredicate(op, self.term, self.literals)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, BoundSetPredicate)
            and other.op is self.op
            and other.term == self.term
            and other.literals == self.literals
        )

    def __hash__(self) -> int:
        return hash((self.op, self.term, self.literals))

    def __repr__(self) -> str:
        return f"BoundSetPredicate({self.op.name}, {self.term!r}, {set(self.literals)!r})"

    def __str__(self) -> str:
        try:
            ordered = sorted(self.literals)
        except TypeError:  # pragma: no cover - literals of one bound type always compare
            ordered = sorted(self.literals, key=repr)
        shown = ", ".join(repr(v) for v in ordered)
        return f"{self.term} {self.op} ({shown})"


__all__ = [
    "BoundLiteralPredicate",
    "BoundPredicate",
    "BoundSetPredicate",
    "BoundUnaryPredicate",
    "EqualTo",
    "GreaterThan",
    "GreaterThanOrEqual",
    "In",
    "IsNaN",
    "IsNull",
    "LessThan",
    "LessThanOrEqual",
    "LiteralPredicate",
    "NotEqualTo",
    "NotIn",
    "NotNaN",
    "NotNull",
    "NotStartsWith",
    "SetPredicate",
    "StartsWith",
    "UnaryPredicate",
    "UnboundPredicate",
    "predicate",
]
