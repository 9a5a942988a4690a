"""Walking filters: the visitor base classes and the generic walks built on them.

Binding, projection, residuals, the JSON form and the evaluators are all post-order walks
over a filter. They share :func:`visit`, which is iterative rather than recursive, because
engines send filters with thousands of ``OR`` branches (a large ``IN`` list) that would
exhaust Python's recursion limit.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Generic, TypeVar

from icefloe.errors import ValidationError
from icefloe.expressions.boolean import AlwaysFalse, AlwaysTrue, And, BooleanExpression, Not, Or
from icefloe.expressions.predicates import BoundPredicate, UnboundPredicate

T = TypeVar("T")


class BooleanExpressionVisitor(Generic[T], ABC):
    """Post-order visitor: each hook receives its children's results."""

    @abstractmethod
    def visit_true(self) -> T: ...

    @abstractmethod
    def visit_false(self) -> T: ...

    @abstractmethod
    def visit_not(self, child_result: T) -> T: ...

    @abstractmethod
    def visit_and(self, left_result: T, right_result: T) -> T: ...

    @abstractmethod
    def visit_or(self, left_result: T, right_result: T) -> T: ...

    def visit_unbound_predicate(self, predicate: UnboundPredicate) -> T:
        raise ValidationError(
            f"{type(self).__name__} needs a bound expression; bind {predicate} to a schema first"
        )

    def visit_bound_predicate(self, predicate: BoundPredicate) -> T:
        raise ValidationError(
            f"{type(self).__name__} works on unbound expressions, got bound {predicate}"
        )


def visit(expr: BooleanExpression, visitor: BooleanExpressionVisitor[T]) -> T:
    """Run ``visitor`` over ``expr`` bottom-up.

    Iterative rather than recursive, so a filter with thousands of ``OR`` branches (as
    engines generate for large IN lists) cannot exhaust Python's recursion limit.

    A :class:`RebuildingVisitor` that keeps a connective's default rebuild gets the original
    node back wherever its children came back unchanged: a residual that decides nothing, or
    a NOT-free filter pushed through :func:`rewrite_not`, is the very object it was given,
    not a copy (an 800-deep AND chain rebuilt per partition was megabytes per plan).
    """
    share = _sharing(visitor)
    results: list[T] = []
    # Each stack entry is (node, children_done).
    stack: list[tuple[BooleanExpression, bool]] = [(expr, False)]
    while stack:
        node, done = stack.pop()
        if isinstance(node, And | Or):
            if not done:
                stack.append((node, True))
                stack.append((node.right, False))
                stack.append((node.left, False))
                continue
            right = results.pop()
            left = results.pop()
            if (
                share[0 if isinstance(node, And) else 1]
                and left is node.left
                and right is node.right
            ):
                results.append(node)  # type: ignore[arg-type]  # T is BooleanExpression
            elif isinstance(node, And):
                results.append(visitor.visit_and(left, right))
            else:
                results.append(visitor.visit_or(left, right))
        elif isinstance(node, Not):
            if not done:
                stack.append((node, True))
                stack.append((node.child, False))
                continue
            child = results.pop()
            if share[2] and child is node.child:
                results.append(node)  # type: ignore[arg-type]  # T is BooleanExpression
            else:
                results.append(visitor.visit_not(child))
        elif isinstance(node, AlwaysTrue):
            results.append(visitor.visit_true())
        elif isinstance(node, AlwaysFalse):
            results.append(visitor.visit_false())
        elif isinstance(node, BoundPredicate):
            results.append(visitor.visit_bound_predicate(node))
        elif isinstance(node, UnboundPredicate):
            results.append(visitor.visit_unbound_predicate(node))
        else:
            raise ValidationError(f"not a boolean expression: {node!r:.80}")
    return results.pop()


def _sharing(visitor: BooleanExpressionVisitor[Any]) -> tuple[bool, bool, bool]:
    """Whether ``visit`` may return an AND, OR and NOT node itself when its children come
    back unchanged: for a :class:`RebuildingVisitor` whose hook for it is the default."""
    if not isinstance(visitor, RebuildingVisitor):
        return (False, False, False)
    kind = type(visitor)
    return (
        kind.visit_and is RebuildingVisitor.visit_and,
        kind.visit_or is RebuildingVisitor.visit_or,
        kind.visit_not is RebuildingVisitor.visit_not,
    )


class RebuildingVisitor(BooleanExpressionVisitor[BooleanExpression]):
    """Rebuilds constants and connectives as they were; subclasses say what becomes of each
    predicate (and of NOT, where it needs more than wrapping its rebuilt child)."""

    def visit_true(self) -> BooleanExpression:
        return AlwaysTrue()

    def visit_false(self) -> BooleanExpression:
        return AlwaysFalse()

    def visit_not(self, child_result: BooleanExpression) -> BooleanExpression:
        return Not(child_result)

    def visit_and(self, left: BooleanExpression, right: BooleanExpression) -> BooleanExpression:
        return And(left, right)

    def visit_or(self, left: BooleanExpression, right: BooleanExpression) -> BooleanExpression:
        return Or(left, right)


def rewrite_not(expr: BooleanExpression) -> BooleanExpression:
    """Push every NOT down into the predicates, preserving meaning exactly.

    A bound result contains no ``Not`` at all, which is what projections and metrics
    evaluators need. An unbound order comparison under NOT stays wrapped (its exact
    negation depends on the column; see the module docstring).

    One iterative pass carrying each node's polarity: negating a rewritten subtree at every
    NOT instead (``child.negate()``) walked a NOT/OR nest 800 deep once per NOT, recursively.
    A subtree without a NOT above or inside it is returned as the very object it was.
    """
    results: list[BooleanExpression] = []
    stack: list[tuple[BooleanExpression, bool, bool]] = [(expr, False, False)]  # negated, done
    while stack:
        node, negated, done = stack.pop()
        if isinstance(node, Not):
            stack.append((node.child, not negated, False))
        elif isinstance(node, And | Or):
            if not done:
                stack.append((node, negated, True))
                stack.append((node.right, negated, False))
                stack.append((node.left, negated, False))
                continue
            right = results.pop()
            left = results.pop()
            if not negated and left is node.left and right is node.right:
                results.append(node)
            elif isinstance(node, And) != negated:  # AND, or a negated OR
                results.append(And(left, right))
            else:
                results.append(Or(left, right))
        elif isinstance(node, AlwaysTrue | AlwaysFalse | BoundPredicate | UnboundPredicate):
            results.append(node.negate() if negated else node)
        else:
            raise ValidationError(f"not a boolean expression: {node!r:.80}")
    return results.pop()


def is_bound(expr: BooleanExpression) -> bool:
    """Whether every predicate in ``expr`` is bound (constants count as bound)."""
    return visit(expr, _IsBound())


def flatten(expr: BooleanExpression, kind: type[And] | type[Or]) -> list[BooleanExpression]:
    """The operands of a chain of ``kind`` nodes, left to right, without recursion.

    Evaluators treat such a chain as one n-ary node, so the thousands of ORs an engine sends
    for a large IN list cost neither recursion depth nor a call per level.
    """
    out: list[BooleanExpression] = []
    stack = [expr]
    while stack:
        node = stack.pop()
        if isinstance(node, kind):
            stack.append(node.right)
            stack.append(node.left)
        else:
            out.append(node)
    return out


def bound_predicates(expr: BooleanExpression) -> list[BoundPredicate]:
    """Every bound predicate in ``expr`` (repeats included), found without recursion."""
    found: list[BoundPredicate] = []
    stack = [expr]
    while stack:
        node = stack.pop()
        if isinstance(node, And | Or):
            stack.extend((node.left, node.right))
        elif isinstance(node, Not):
            stack.append(node.child)
        elif isinstance(node, BoundPredicate):
            found.append(node)
    return found


class _IsBound(BooleanExpressionVisitor[bool]):
    def visit_true(self) -> bool:
        return True

    def visit_false(self) -> bool:
        return True

    def visit_not(self, child_result: bool) -> bool:
        return child_result

    def visit_and(self, left_result: bool, right_result: bool) -> bool:
        return left_result and right_result

    def visit_or(self, left_result: bool, right_result: bool) -> bool:
        return left_result and right_result

    def visit_unbound_predicate(self, predicate: UnboundPredicate) -> bool:
        return False

    def visit_bound_predicate(self, predicate: BoundPredicate) -> bool:
        return True


__all__ = [
    "BooleanExpressionVisitor",
    "RebuildingVisitor",
    "bound_predicates",
    "flatten",
    "is_bound",
    "rewrite_not",
    "visit",
]
