"""The boolean skeleton of a filter: the expression base class, the constants and the
connectives ``And``, ``Or`` and ``Not``.

The connectives simplify as they are built (``And(x, AlwaysTrue())`` is ``x``, ``Not(Not(x))``
is ``x``): projections and residuals rebuild filters predicate by predicate, and simplifying
on construction keeps their results small without a separate pass. Predicates, the leaves,
live in :mod:`icefloe.expressions.predicates`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from icefloe.errors import ValidationError


class BooleanExpression(ABC):
    """A predicate tree. Immutable and hashable; ``~``, ``&`` and ``|`` build new trees."""

    __slots__ = ()

    @abstractmethod
    def negate(self) -> BooleanExpression:
        """The exact complement (see the module docstring for order comparisons)."""

    def __invert__(self) -> BooleanExpression:
        return self.negate()

    def __and__(self, other: BooleanExpression) -> BooleanExpression:
        return And(self, other)

    def __or__(self, other: BooleanExpression) -> BooleanExpression:
        return Or(self, other)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")


class AlwaysTrue(BooleanExpression):
    """The constant true (a singleton)."""

    __slots__ = ()
    _instance: ClassVar[AlwaysTrue | None] = None

    def __new__(cls) -> AlwaysTrue:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def negate(self) -> BooleanExpression:
        return AlwaysFalse()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AlwaysTrue)

    def __hash__(self) -> int:
        return hash(True)

    def __repr__(self) -> str:
        return "AlwaysTrue()"

    def __str__(self) -> str:
        return "true"


class AlwaysFalse(BooleanExpression):
    """The constant false (a singleton)."""

    __slots__ = ()
    _instance: ClassVar[AlwaysFalse | None] = None

    def __new__(cls) -> AlwaysFalse:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def negate(self) -> BooleanExpression:
        return AlwaysTrue()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AlwaysFalse)

    def __hash__(self) -> int:
        return hash(False)

    def __repr__(self) -> str:
        return "AlwaysFalse()"

    def __str__(self) -> str:
        return "false"


def _check_expr(value: Any, where: str) -> BooleanExpression:
    if not isinstance(value, BooleanExpression):
        raise ValidationError(f"{where} must be a boolean expression, got {value!r:.80}")
    return value


def _balanced(
    combine: Callable[[BooleanExpression, BooleanExpression], BooleanExpression],
    items: Sequence[BooleanExpression],
) -> BooleanExpression:
    """Combine many operands as a balanced tree: depth log(n), so recursion stays shallow."""
    if len(items) == 1:
        return items[0]
    mid = len(items) // 2
    return combine(_balanced(combine, items[:mid]), _balanced(combine, items[mid:]))


class And(BooleanExpression):
    """Conjunction. ``And(a, b, c, ...)`` accepts any number of operands (at least two)."""

    __slots__ = ("left", "right")
    left: BooleanExpression
    right: BooleanExpression

    def __new__(  # type: ignore[misc]
        cls, left: BooleanExpression, right: BooleanExpression, *rest: BooleanExpression
    ) -> BooleanExpression:
        if rest:
            return _balanced(And, (left, right, *rest))
        _check_expr(left, "the left operand of AND")
        _check_expr(right, "the right operand of AND")
        if isinstance(left, AlwaysFalse) or isinstance(right, AlwaysFalse):
            return AlwaysFalse()
        if isinstance(left, AlwaysTrue):
            return right
        if isinstance(right, AlwaysTrue) or left == right:
            return left
        self = super().__new__(cls)
        object.__setattr__(self, "left", left)
        object.__setattr__(self, "right", right)
        return self

    def negate(self) -> BooleanExpression:
        return Or(self.left.negate(), self.right.negate())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, And) and other.left == self.left and other.right == self.right

    def __hash__(self) -> int:
        return hash(("and", self.left, self.right))

    def __repr__(self) -> str:
        return f"And({self.left!r}, {self.right!r})"

    def __str__(self) -> str:
        return f"({self.left} and {self.right})"


class Or(BooleanExpression):
    """Disjunction. ``Or(a, b, c, ...)`` accepts any number of operands (at least two)."""

    __slots__ = ("left", "right")
    left: BooleanExpression
    right: BooleanExpression

    def __new__(  # type: ignore[misc]
        cls, left: BooleanExpression, right: BooleanExpression, *rest: BooleanExpression
    ) -> BooleanExpression:
        if rest:
            return _balanced(Or, (left, right, *rest))
        _check_expr(left, "the left operand of OR")
        _check_expr(right, "the right operand of OR")
        if isinstance(left, AlwaysTrue) or isinstance(right, AlwaysTrue):
            return AlwaysTrue()
        if isinstance(left, AlwaysFalse):
            return right
        if isinstance(right, AlwaysFalse) or left == right:
            return left
        self = super().__new__(cls)
        object.__setattr__(self, "left", left)
        object.__setattr__(self, "right", right)
        return self

    def negate(self) -> BooleanExpression:
        return And(self.left.negate(), self.right.negate())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Or) and other.left == self.left and other.right == self.right

    def __hash__(self) -> int:
        return hash(("or", self.left, self.right))

    def __repr__(self) -> str:
        return f"Or({self.left!r}, {self.right!r})"

    def __str__(self) -> str:
        return f"({self.left} or {self.right})"


class Not(BooleanExpression):
    """Negation. ``Not(AlwaysTrue())`` is ``AlwaysFalse()`` and ``Not(Not(x))`` is ``x``."""

    __slots__ = ("child",)
    child: BooleanExpression

    def __new__(cls, child: BooleanExpression) -> BooleanExpression:  # type: ignore[misc]
        _check_expr(child, "the operand of NOT")
        if isinstance(child, AlwaysTrue):
            return AlwaysFalse()
        if isinstance(child, AlwaysFalse):
            return AlwaysTrue()
        if isinstance(child, Not):
            return child.child
        self = super().__new__(cls)
        object.__setattr__(self, "child", child)
        return self

    def negate(self) -> BooleanExpression:
        return self.child

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Not) and other.child == self.child

    def __hash__(self) -> int:
        return hash(("not", self.child))

    def __repr__(self) -> str:
        return f"Not({self.child!r})"

    def __str__(self) -> str:
        return f"not {self.child}"


__all__ = ["AlwaysFalse", "AlwaysTrue", "And", "BooleanExpression", "Not", "Or"]
