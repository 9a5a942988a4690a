"""The expression model: constructors, literals, negation, NOT rewriting and visitors."""

from __future__ import annotations

import datetime as dt
import math
import uuid
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples
from icefloe.errors import ValidationError
from icefloe.expressions import (
    AlwaysFalse,
    AlwaysTrue,
    And,
    BooleanExpression,
    BooleanExpressionVisitor,
    BoundLiteralPredicate,
    BoundPredicate,
    BoundUnaryPredicate,
    EqualTo,
    GreaterThan,
    GreaterThanOrEqual,
    IdReference,
    In,
    IsNaN,
    IsNull,
    LessThan,
    LessThanOrEqual,
    Literal,
    Not,
    NotEqualTo,
    NotIn,
    NotNaN,
    NotNull,
    NotStartsWith,
    Operation,
    Or,
    Reference,
    StartsWith,
    TransformTerm,
    UnboundPredicate,
    is_bound,
    predicate,
    rewrite_not,
    visit,
)
from icefloe.expressions.binding import bind
from icefloe.expressions.evaluators import Evaluator
from icefloe.spec.schema import Schema
from icefloe.spec.transforms import BucketTransform
from icefloe.spec.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

A = EqualTo("a", 1)
B = LessThan("b", 2)
C = IsNull("c")


# -- constructors ------------------------------------------------------------------------------


def test_and_or_simplify_constants() -> None:
    assert And(A, AlwaysTrue()) == A
    assert And(AlwaysTrue(), A) == A
    assert And(A, AlwaysFalse()) == AlwaysFalse()
    assert Or(A, AlwaysFalse()) == A
    assert Or(AlwaysTrue(), A) == AlwaysTrue()
    assert And(A, A) == A
    assert Or(B, B) == B
    both = And(A, B)
    assert isinstance(both, And) and both.left == A and both.right == B


def test_not_simplifies() -> None:
    assert Not(AlwaysTrue()) == AlwaysFalse()
    assert Not(AlwaysFalse()) == AlwaysTrue()
    assert Not(Not(A)) == A
    assert isinstance(Not(A), Not)


def test_many_operands_build_a_balanced_tree() -> None:
    preds = [EqualTo("a", i) for i in range(8)]
    expr = Or(*preds)

    def depth(e: BooleanExpression) -> int:
        if isinstance(e, Or):
            return 1 + max(depth(e.left), depth(e.right))
        return 0

    assert depth(expr) == 3
    assert sorted(p.literal.value for p in _leaves(expr)) == list(range(8))


def test_operators() -> None:
    conj, disj, neg = A & B, A | B, ~A
    assert conj == And(A, B)
    assert disj == Or(A, B)
    assert neg == NotEqualTo("a", 1)


def test_expressions_are_immutable_and_hashable() -> None:
    with pytest.raises(AttributeError):
        A.term = Reference("z")  # type: ignore[misc]
    assert len({And(A, B), And(A, B), Or(A, B)}) == 2
    assert AlwaysTrue() is AlwaysTrue()


def test_constructors_reject_non_expressions() -> None:
    with pytest.raises(ValidationError, match="left operand of AND"):
        And("x", A)  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="column name or unbound term"):
        EqualTo(3, 1)  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="non-empty name"):
        Reference("")


def test_predicate_factory() -> None:
    assert predicate(Operation.IS_NULL, "c") == C
    assert predicate(Operation.LT, "b", [2]) == B
    assert predicate(Operation.IN, "a", [1, 2]) == In("a", [2, 1])
    with pytest.raises(ValidationError, match="takes no value"):
        predicate(Operation.IS_NULL, "c", [1])
    with pytest.raises(ValidationError, match="exactly one value"):
        predicate(Operation.EQ, "a", [1, 2])
    with pytest.raises(ValidationError, match="unknown predicate type"):
        Operation.from_json("equals")


def test_set_predicates_compare_as_sets() -> None:
    assert In("a", [1, 2, 2]) == In("a", [2, 1])
    assert In("a", [1, 2, 2]).literals == (Literal(1), Literal(2))
    assert hash(In("a", [1, 2])) == hash(In("a", [2, 1]))
    assert In("a", [1]) != NotIn("a", [1])
    with pytest.raises(ValidationError, match="collection of values"):
        In("a", "abc")


# -- literals ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (True, (True, BooleanType())),
        (5, (5, None)),
        (1.5, (1.5, None)),
        ("x", ("x", None)),
        (Decimal("14.20"), (Decimal("14.20"), DecimalType(4, 2))),
        (Decimal("2E+20"), (Decimal("2E+20"), DecimalType(1, -20))),
        (dt.date(2017, 11, 16), (17486, DateType())),
        (dt.date(1969, 12, 31), (-1, DateType())),
        (dt.datetime(1970, 1, 1, 0, 0, 1), (1_000_000, TimestampType())),
        (
            dt.datetime(1970, 1, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=1))),
            (0, TimestamptzType()),
        ),
        (dt.time(0, 0, 1, 5), (1_000_005, TimeType())),
        (b"\x01\x02", (b"\x01\x02", BinaryType())),
        (
            uuid.UUID("f79c3e09-677c-4bbd-a479-3f349cb785e7"),
            (uuid.UUID("f79c3e09-677c-4bbd-a479-3f349cb785e7"), UUIDType()),
        ),
    ],
)
def test_literal_inference(value: Any, expected: tuple[Any, Any]) -> None:
    lit = Literal(value)
    assert (lit.value, lit.type) == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (None, "is-null"),
        (math.nan, "is-nan"),
        ([1], "unsupported literal"),
        (Decimal("NaN"), "finite"),
        (Decimal("1" * 39), "38"),
    ],
)
def test_literal_rejections(value: Any, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Literal(value)


def test_typed_literals_check_their_representation() -> None:
    assert Literal(3, DoubleType()).value == 3.0
    assert Literal(b"ab", FixedType(2)).value == b"ab"
    with pytest.raises(ValidationError, match="internal representation"):
        Literal("2017-11-16", DateType())
    with pytest.raises(ValidationError, match="exactly 3 bytes"):
        Literal(b"ab", FixedType(3))
    with pytest.raises(ValidationError, match="32-bit"):
        Literal(2**40, IntegerType())
    with pytest.raises(ValidationError, match="digits after the decimal point"):
        Literal(Decimal("1.234"), DecimalType(9, 2))
    with pytest.raises(ValidationError, match="is-nan"):
        Literal(math.nan, DoubleType())
    with pytest.raises(AttributeError):
        Literal(1).value = 2  # type: ignore[misc]


def test_literal_equality_is_type_aware() -> None:
    assert Literal(1) != Literal(True)
    assert Literal(1) != Literal(1.0)
    assert Literal(5, LongType()) != Literal(5)
    assert EqualTo("a", 1) != EqualTo("a", True)


# -- negation ----------------------------------------------------------------------------------


def test_negate_complementary_operations() -> None:
    pairs = [
        (IsNull("a"), NotNull("a")),
        (IsNaN("a"), NotNaN("a")),
        (EqualTo("a", 1), NotEqualTo("a", 1)),
        (StartsWith("a", "x"), NotStartsWith("a", "x")),
        (In("a", [1, 2]), NotIn("a", [1, 2])),
    ]
    for left, right in pairs:
        assert left.negate() == right
        assert right.negate() == left


def test_unbound_order_comparisons_keep_their_not() -> None:
    # Without a schema, NOT (b < 2) cannot become b >= 2: a null b matches only the former.
    assert LessThan("b", 2).negate() == Not(LessThan("b", 2))
    assert rewrite_not(Not(And(A, B))) == Or(NotEqualTo("a", 1), Not(B))
    assert rewrite_not(Not(Or(A, C))) == And(NotEqualTo("a", 1), NotNull("c"))


SCHEMA = Schema(
    NestedField(1, "req", LongType(), required=True),
    NestedField(2, "opt", IntegerType()),
    NestedField(3, "x", DoubleType()),
    NestedField(4, "s", StringType()),
    NestedField(5, "st", StructType(NestedField(6, "inner", LongType(), required=True))),
)


def test_bound_order_negation_admits_nulls_and_nans() -> None:
    req = bind(SCHEMA, LessThan("req", 5))
    assert isinstance(req, BoundLiteralPredicate)
    assert req.negate() == BoundLiteralPredicate(Operation.GT_EQ, req.term, 5)

    opt = bind(SCHEMA, GreaterThan("opt", 5))
    assert isinstance(opt, BoundPredicate)
    assert opt.negate() == Or(
        BoundLiteralPredicate(Operation.LT_EQ, opt.term, 5),
        BoundUnaryPredicate(Operation.IS_NULL, opt.term),
    )

    x = bind(SCHEMA, LessThanOrEqual("x", 1.5))
    assert isinstance(x, BoundPredicate)
    negated = x.negate()
    assert Evaluator(SCHEMA, negated).eval((1, None, math.nan, None, None))
    assert Evaluator(SCHEMA, negated).eval((1, None, None, None, None))
    assert not Evaluator(SCHEMA, negated).eval((1, None, 1.0, None, None))

    # A required field inside an optional struct is null when the struct is.
    inner = bind(SCHEMA, GreaterThanOrEqual("st.inner", 0))
    assert isinstance(inner, BoundPredicate) and inner.term.nullable


def test_rewrite_not_on_bound_expressions_removes_every_not() -> None:
    expr = bind(SCHEMA, Not(Or(Not(LessThan("opt", 3)), And(StartsWith("s", "a"), IsNaN("x")))))
    rewritten = rewrite_not(expr)
    assert "not " not in str(rewritten).replace("not-", "")
    assert not _contains_not(rewritten)


# -- visitors ----------------------------------------------------------------------------------


class _Count(BooleanExpressionVisitor[int]):
    def visit_true(self) -> int:
        return 0

    def visit_false(self) -> int:
        return 0

    def visit_not(self, child_result: int) -> int:
        return child_result

    def visit_and(self, left_result: int, right_result: int) -> int:
        return left_result + right_result

    def visit_or(self, left_result: int, right_result: int) -> int:
        return left_result + right_result

    def visit_unbound_predicate(self, predicate: UnboundPredicate) -> int:
        return 1


def test_visit_handles_very_deep_trees() -> None:
    expr: BooleanExpression = EqualTo("a", 0)
    for i in range(1, 5000):  # a left-deep chain, as naive builders produce
        expr = Or(expr, EqualTo("a", i))
    assert visit(expr, _Count()) == 5000
    assert not is_bound(expr)


def test_default_visitor_refuses_the_wrong_binding_state() -> None:
    with pytest.raises(ValidationError, match="works on unbound expressions"):
        visit(bind(SCHEMA, EqualTo("req", 1)), _Count())


def test_terms() -> None:
    term = TransformTerm("bucket[16]", "req")
    assert term.transform == BucketTransform(16)
    assert term.term == Reference("req")
    assert str(EqualTo(term, 3)) == "bucket[16](req) eq 3"
    assert str(EqualTo(IdReference(7), 1)) == "#7 eq 1"
    with pytest.raises(ValidationError):
        IdReference("7")  # type: ignore[arg-type]


# -- the law: rewrite_not and negate preserve meaning exactly ------------------------------------

_ROWS = st.tuples(
    st.integers(-5, 5),
    st.one_of(st.none(), st.integers(-5, 5)),
    st.one_of(st.none(), st.sampled_from([math.nan, -0.0, 0.0, 1.5, -2.0, math.inf])),
    st.one_of(st.none(), st.sampled_from(["", "a", "ab", "b", "ba"])),
    st.one_of(st.none(), st.tuples(st.integers(-2, 2))),
)


def _leaf_predicates() -> st.SearchStrategy[BooleanExpression]:
    ints = st.integers(-6, 6)
    return st.one_of(
        st.builds(lambda op, v: predicate(op, "opt", [v]), st.sampled_from(_CMP), ints),
        st.builds(lambda op, v: predicate(op, "req", [v]), st.sampled_from(_CMP), ints),
        st.builds(lambda op, v: predicate(op, "st.inner", [v]), st.sampled_from(_CMP), ints),
        st.builds(
            lambda op, v: predicate(op, "x", [v]),
            st.sampled_from(_CMP),
            st.sampled_from([0.0, -0.0, 1.5, -1.0]),
        ),
        st.builds(
            lambda op, v: predicate(op, "s", [v]),
            st.sampled_from([*_CMP, Operation.STARTS_WITH, Operation.NOT_STARTS_WITH]),
            st.sampled_from(["a", "b", "ab"]),
        ),
        st.builds(
            lambda op, vs: predicate(op, "opt", vs),
            st.sampled_from([Operation.IN, Operation.NOT_IN]),
            st.lists(ints, min_size=0, max_size=3),
        ),
        st.builds(
            lambda op, col: predicate(op, col),
            st.sampled_from([Operation.IS_NULL, Operation.NOT_NULL]),
            st.sampled_from(["opt", "req", "x", "s", "st", "st.inner"]),
        ),
        st.builds(
            lambda op: predicate(op, "x"), st.sampled_from([Operation.IS_NAN, Operation.NOT_NAN])
        ),
    )


_CMP = [
    Operation.LT,
    Operation.LT_EQ,
    Operation.GT,
    Operation.GT_EQ,
    Operation.EQ,
    Operation.NOT_EQ,
]

_EXPRS = st.recursive(
    _leaf_predicates(),
    lambda children: st.one_of(
        st.builds(And, children, children),
        st.builds(Or, children, children),
        st.builds(Not, children),
    ),
    max_leaves=6,
)


@settings(max_examples=examples(300), deadline=None)
@given(_EXPRS, st.lists(_ROWS, min_size=1, max_size=8))
def test_rewrite_not_and_negate_preserve_meaning(expr: BooleanExpression, rows: list[Any]) -> None:
    bound = bind(SCHEMA, expr)
    original = Evaluator(SCHEMA, bound)
    rewritten = rewrite_not(bound)
    assert not _contains_not(rewritten)
    unbound_rewritten = Evaluator(SCHEMA, rewrite_not(expr))
    negated = Evaluator(SCHEMA, bound.negate())
    for row in rows:
        expected = original.eval(row)
        assert Evaluator(SCHEMA, rewritten).eval(row) == expected
        assert unbound_rewritten.eval(row) == expected
        assert negated.eval(row) == (not expected)


def _contains_not(expr: BooleanExpression) -> bool:
    if isinstance(expr, Not):
        return True
    if isinstance(expr, And | Or):
        return _contains_not(expr.left) or _contains_not(expr.right)
    return False


def _leaves(expr: BooleanExpression) -> list[Any]:
    if isinstance(expr, And | Or):
        return _leaves(expr.left) + _leaves(expr.right)
    return [expr]


def test_rewrite_not_of_a_deep_not_or_nest_is_one_pass_and_keeps_not_free_parts() -> None:
    # Alternating NOT and OR: the old rewrite negated the rewritten subtree at every NOT,
    # recursively (quadratic, and past the recursion limit at 900 levels).
    def nest(depth: int) -> BooleanExpression:
        expr: BooleanExpression = LessThan("opt", 0)
        for i in range(depth):
            expr = Not(expr) if i % 2 else Or(expr, LessThan("opt", -1 - i))
        return bind(SCHEMA, expr)

    assert not _contains_not(rewrite_not(nest(900)))
    bound = nest(200)  # within the recursive reference evaluator's reach
    rewritten = rewrite_not(bound)
    assert not _contains_not(rewritten)
    for value in (None, -2000, -150, -5, 0, 5):
        row = (1, value, 0.0, "a", (1,))
        assert Evaluator(SCHEMA, rewritten).eval(row) == Evaluator(SCHEMA, bound).eval(row)
    free = bind(SCHEMA, And(LessThan("opt", 3), Or(IsNull("opt"), GreaterThan("opt", 7))))
    assert rewrite_not(free) is free
