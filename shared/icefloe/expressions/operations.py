"""The operations a predicate can apply, and the algebra between them.

One enum shared by unbound and bound predicates, the JSON form and the evaluators, valued by
the JSON ``type`` names so parsing is a lookup. The tables below (complement, negation of an
order comparison, operands swapped) are what let ``NOT`` be pushed into predicates exactly:
see :mod:`icefloe.expressions` for why order comparisons have no plain complement.
"""

from __future__ import annotations

from enum import Enum

from icefloe.errors import ValidationError


class Operation(Enum):
    """Predicate operations, valued by their JSON ``type`` names."""

    IS_NULL = "is-null"
    NOT_NULL = "not-null"
    IS_NAN = "is-nan"
    NOT_NAN = "not-nan"
    LT = "lt"
    LT_EQ = "lt-eq"
    GT = "gt"
    GT_EQ = "gt-eq"
    EQ = "eq"
    NOT_EQ = "not-eq"
    STARTS_WITH = "starts-with"
    NOT_STARTS_WITH = "not-starts-with"
    IN = "in"
    NOT_IN = "not-in"

    @property
    def is_unary(self) -> bool:
        return self in _UNARY_OPS

    @property
    def is_literal(self) -> bool:
        """Whether the operation compares its term with exactly one literal."""
        return self in _LITERAL_OPS

    @property
    def is_set(self) -> bool:
        return self is Operation.IN or self is Operation.NOT_IN

    @property
    def is_order(self) -> bool:
        """lt, lt-eq, gt, gt-eq: the operations whose negation must also admit nulls/NaNs."""
        return self in _ORDER_OPS

    @property
    def complement(self) -> Operation | None:
        """The exact two-valued complement, or None for order comparisons (see module doc)."""
        return _COMPLEMENT.get(self)

    @property
    def order_negation(self) -> Operation:
        """For order comparisons: the comparison that holds for exactly the other non-null,
        non-NaN values (``lt`` → ``gt-eq``)."""
        return _ORDER_NEGATION[self]

    @property
    def flipped(self) -> Operation | None:
        """The operation with its operands swapped (``5 < x`` is ``x > 5``), if there is one."""
        return _FLIPPED.get(self)

    @classmethod
    def from_json(cls, name: str) -> Operation:
        try:
            return cls(name)
        except ValueError:
            raise ValidationError(
                f"unknown predicate type {name!r}; expected one of {[op.value for op in cls]}"
            ) from None

    def __str__(self) -> str:
        return self.value


_UNARY_OPS = frozenset({Operation.IS_NULL, Operation.NOT_NULL, Operation.IS_NAN, Operation.NOT_NAN})
_ORDER_OPS = frozenset({Operation.LT, Operation.LT_EQ, Operation.GT, Operation.GT_EQ})
_LITERAL_OPS = _ORDER_OPS | {
    Operation.EQ,
    Operation.NOT_EQ,
    Operation.STARTS_WITH,
    Operation.NOT_STARTS_WITH,
}
_COMPLEMENT = {
    Operation.IS_NULL: Operation.NOT_NULL,
    Operation.NOT_NULL: Operation.IS_NULL,
    Operation.IS_NAN: Operation.NOT_NAN,
    Operation.NOT_NAN: Operation.IS_NAN,
    Operation.EQ: Operation.NOT_EQ,
    Operation.NOT_EQ: Operation.EQ,
    Operation.STARTS_WITH: Operation.NOT_STARTS_WITH,
    Operation.NOT_STARTS_WITH: Operation.STARTS_WITH,
    Operation.IN: Operation.NOT_IN,
    Operation.NOT_IN: Operation.IN,
}
_ORDER_NEGATION = {
    Operation.LT: Operation.GT_EQ,
    Operation.LT_EQ: Operation.GT,
    Operation.GT: Operation.LT_EQ,
    Operation.GT_EQ: Operation.LT,
}
_FLIPPED = {
    Operation.LT: Operation.GT,
    Operation.LT_EQ: Operation.GT_EQ,
    Operation.GT: Operation.LT,
    Operation.GT_EQ: Operation.LT_EQ,
    Operation.EQ: Operation.EQ,
    Operation.NOT_EQ: Operation.NOT_EQ,
}


__all__ = ["Operation"]
