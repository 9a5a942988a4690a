"""Binding: name resolution, literal conversion, collapsing and refusing predicates."""

from __future__ import annotations

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
    BoundLiteralPredicate,
    BoundReference,
    BoundSetPredicate,
    BoundTransform,
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
    Reference,
    StartsWith,
    TransformTerm,
    predicate,
)
from icefloe.expressions.binding import bind, bind_reference
from icefloe.expressions.evaluators import Evaluator
from icefloe.spec.schema import Schema
from icefloe.spec.transforms import BucketTransform, DayTransform
from icefloe.spec.types import (
    BinaryType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestampNanoType,
    TimestampType,
    TimestamptzType,
    TimeType,
    UnknownType,
    UUIDType,
)

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "i", IntegerType()),
    NestedField(3, "d", DateType()),
    NestedField(4, "ts", TimestampType()),
    NestedField(5, "tstz", TimestamptzType()),
    NestedField(6, "ns", TimestampNanoType()),
    NestedField(7, "s", StringType()),
    NestedField(8, "dec", DecimalType(5, 2)),
    NestedField(9, "f", FloatType()),
    NestedField(10, "x", DoubleType(), required=True),
    NestedField(11, "u", UUIDType()),
    NestedField(12, "b", BinaryType()),
    NestedField(13, "fx", FixedType(2)),
    NestedField(14, "t", TimeType()),
    NestedField(
        15,
        "loc",
        StructType(
            NestedField(16, "lat", DoubleType(), required=True),
            NestedField(17, "Name", StringType()),
        ),
    ),
    NestedField(18, "tags", ListType(19, StringType())),
    NestedField(20, "props", MapType(21, StringType(), 22, LongType())),
    NestedField(23, "nothing", UnknownType()),
)


def _lit(expr: Any) -> Any:
    assert isinstance(expr, BoundLiteralPredicate), expr
    return expr.op, expr.literal


# -- references --------------------------------------------------------------------------------


def test_binds_names_to_fields_accessors_and_nullability() -> None:
    expr = bind(SCHEMA, EqualTo("loc.lat", 1.5))
    assert isinstance(expr, BoundLiteralPredicate)
    ref = expr.term
    assert isinstance(ref, BoundReference)
    assert (ref.field_id, ref.name, ref.field_type) == (16, "loc.lat", DoubleType())
    assert ref.accessor is not None and ref.accessor.positions == (14, 0)
    assert ref.nullable  # required, but inside an optional struct
    assert not bind_reference(SCHEMA, Reference("id")).nullable


def test_columns_inside_lists_and_maps_bind_without_accessor() -> None:
    ref = bind_reference(SCHEMA, Reference("tags.element"))
    assert ref.accessor is None and ref.in_list_or_map
    assert bind_reference(SCHEMA, Reference("props.value")).accessor is None


def test_case_insensitive_binding() -> None:
    expr = bind(SCHEMA, EqualTo("LOC.name", "x"), case_sensitive=False)
    assert isinstance(expr, BoundLiteralPredicate) and expr.ref.field_id == 17
    with pytest.raises(ValidationError, match=r"case sensitive: did you mean 'loc\.Name'"):
        bind(SCHEMA, EqualTo("loc.name", "x"))


def test_unknown_column_names_close_matches() -> None:
    with pytest.raises(ValidationError) as info:
        bind(SCHEMA, EqualTo("tsz", 1))
    message = str(info.value)
    assert "no column 'tsz'" in message and "'ts'" in message and "cannot bind tsz eq 1" in message
    with pytest.raises(ValidationError, match="top-level columns"):
        bind(SCHEMA, IsNull("qqqqqqq"))


def test_id_references() -> None:
    expr = bind(SCHEMA, EqualTo(IdReference(7), "a"))
    assert isinstance(expr, BoundLiteralPredicate) and expr.ref.name == "s"
    with pytest.raises(ValidationError, match="no field with id 99"):
        bind(SCHEMA, IsNull(IdReference(99)))


def test_rebinding_a_bound_expression() -> None:
    bound = bind(SCHEMA, EqualTo("s", "a"))
    assert bind(SCHEMA, bound) == bound
    other = Schema(NestedField(7, "s", LongType()))
    with pytest.raises(ValidationError, match="already bound"):
        bind(other, bound)


# -- unary tests -------------------------------------------------------------------------------


def test_null_tests_on_required_columns_collapse() -> None:
    assert bind(SCHEMA, IsNull("id")) == AlwaysFalse()
    assert bind(SCHEMA, NotNull("id")) == AlwaysTrue()
    assert isinstance(bind(SCHEMA, IsNull("i")), BoundUnaryPredicate)
    assert isinstance(bind(SCHEMA, IsNull("loc")), BoundUnaryPredicate)
    assert bind(SCHEMA, IsNull("nothing")) == AlwaysTrue()
    assert bind(SCHEMA, NotNull("nothing")) == AlwaysFalse()


def test_nan_tests_need_floating_point_columns() -> None:
    assert isinstance(bind(SCHEMA, IsNaN("f")), BoundUnaryPredicate)
    assert isinstance(bind(SCHEMA, NotNaN("x")), BoundUnaryPredicate)
    with pytest.raises(ValidationError, match="is-nan applies to float and double columns only"):
        bind(SCHEMA, IsNaN("i"))


# -- comparisons and conversions ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        (EqualTo("i", 5), (Operation.EQ, 5)),
        (LessThan("i", 5.5), (Operation.LT_EQ, 5)),
        (LessThanOrEqual("i", -5.5), (Operation.LT_EQ, -6)),
        (GreaterThan("i", 5.5), (Operation.GT_EQ, 6)),
        (GreaterThanOrEqual("i", 5.0), (Operation.GT_EQ, 5)),
        (GreaterThan("i", Decimal("2.01")), (Operation.GT_EQ, 3)),
        (EqualTo("d", "2017-11-16"), (Operation.EQ, 17486)),
        (EqualTo("d", 17486), (Operation.EQ, 17486)),
        (EqualTo("ts", "2017-11-16T22:31:08.123456"), (Operation.EQ, 1510871468123456)),
        (EqualTo("tstz", "2017-11-16T22:31:08.123456+00:00"), (Operation.EQ, 1510871468123456)),
        (EqualTo("ns", "1970-01-01T00:00:00.000000001"), (Operation.EQ, 1)),
        (EqualTo("ts", Literal(1, DateType())), (Operation.EQ, 86_400_000_000)),
        (EqualTo("ns", Literal(2, TimestampType())), (Operation.EQ, 2000)),
        (LessThan("d", Literal(86_400_000_001, TimestampType())), (Operation.LT_EQ, 1)),
        (GreaterThan("ts", Literal(1500, TimestampNanoType())), (Operation.GT_EQ, 2)),
        (EqualTo("t", "22:31:08.123456"), (Operation.EQ, 81068123456)),
        (EqualTo("dec", Decimal("1.5")), (Operation.EQ, Decimal("1.50"))),
        (EqualTo("dec", "1.5"), (Operation.EQ, Decimal("1.50"))),
        (LessThan("dec", 1.005), (Operation.LT_EQ, Decimal("1.00"))),
        (GreaterThan("dec", Decimal("-1.001")), (Operation.GT_EQ, Decimal("-1.00"))),
        (EqualTo("dec", 3), (Operation.EQ, Decimal("3.00"))),
        (EqualTo("f", 0.1), (Operation.EQ, 0.10000000149011612)),
        (EqualTo("x", 3), (Operation.EQ, 3.0)),
        (EqualTo("x", Decimal("0.5")), (Operation.EQ, 0.5)),
        (
            EqualTo("u", "f79c3e09-677c-4bbd-a479-3f349cb785e7"),
            (Operation.EQ, uuid.UUID("f79c3e09-677c-4bbd-a479-3f349cb785e7")),
        ),
        (EqualTo("b", "000102ff"), (Operation.EQ, b"\x00\x01\x02\xff")),
        (EqualTo("b", b"\x00"), (Operation.EQ, b"\x00")),
        (EqualTo("fx", "0102"), (Operation.EQ, b"\x01\x02")),
        (StartsWith("s", "ab"), (Operation.STARTS_WITH, "ab")),
    ],
)
def test_literal_conversion(expr: Any, expected: tuple[Operation, Any]) -> None:
    op, value = _lit(bind(SCHEMA, expr))
    assert op is expected[0]
    assert value == expected[1] and type(value) is type(expected[1])


def test_inexact_equality_collapses() -> None:
    assert bind(SCHEMA, EqualTo("i", 5.5)) == AlwaysFalse()
    assert bind(SCHEMA, NotEqualTo("i", 5.5)) == AlwaysTrue()
    assert bind(SCHEMA, EqualTo("dec", Decimal("1.001"))) == AlwaysFalse()
    assert bind(SCHEMA, EqualTo("d", Literal(5, TimestampType()))) == AlwaysFalse()


def test_out_of_range_comparisons_collapse() -> None:
    # Java turns these into true; for a nullable column only non-null rows can match.
    not_null_i = bind(SCHEMA, NotNull("i"))
    assert bind(SCHEMA, LessThan("i", 2**40)) == not_null_i
    assert bind(SCHEMA, LessThanOrEqual("i", 2**31 - 1)) == not_null_i
    assert bind(SCHEMA, GreaterThan("i", -(2**40))) == not_null_i
    assert bind(SCHEMA, GreaterThan("i", 2**40)) == AlwaysFalse()
    assert bind(SCHEMA, LessThan("i", -(2**31))) == AlwaysFalse()
    assert bind(SCHEMA, GreaterThan("i", 2**31 - 1)) == AlwaysFalse()
    assert bind(SCHEMA, EqualTo("i", 2**40)) == AlwaysFalse()
    assert bind(SCHEMA, NotEqualTo("i", 2**40)) == AlwaysTrue()
    assert bind(SCHEMA, LessThan("id", 2**70)) == AlwaysTrue()  # required
    assert bind(SCHEMA, LessThan("i", math.inf)) == not_null_i
    assert bind(SCHEMA, GreaterThan("dec", 1000)) == AlwaysFalse()
    assert bind(SCHEMA, LessThan("dec", 1000)) == bind(SCHEMA, NotNull("dec"))
    # Float columns also exclude NaN, which no order comparison matches.
    assert bind(SCHEMA, LessThanOrEqual("x", math.inf)) == bind(SCHEMA, NotNaN("x"))
    assert _lit(bind(SCHEMA, LessThan("f", 1e300))) == (Operation.LT_EQ, 3.4028234663852886e38)
    assert _lit(bind(SCHEMA, GreaterThan("f", 1e300))) == (Operation.GT_EQ, math.inf)
    assert bind(SCHEMA, EqualTo("f", 1e300)) == AlwaysFalse()
    assert bind(SCHEMA, LessThan("t", 0)) == AlwaysFalse()


def test_set_predicates() -> None:
    bound = bind(SCHEMA, In("i", [1, 2, 2.5, 2**40]))
    assert isinstance(bound, BoundSetPredicate) and bound.literals == {1, 2}
    assert _lit(bind(SCHEMA, In("i", [1, 2.5]))) == (Operation.EQ, 1)
    assert _lit(bind(SCHEMA, NotIn("i", [1, 2**40]))) == (Operation.NOT_EQ, 1)
    assert bind(SCHEMA, In("i", [])) == AlwaysFalse()
    assert bind(SCHEMA, In("i", [2**40])) == AlwaysFalse()
    assert bind(SCHEMA, NotIn("i", [])) == AlwaysTrue()
    assert bind(SCHEMA, NotIn("i", [0.5])) == AlwaysTrue()
    dates = bind(SCHEMA, In("d", ["2017-11-16", "1970-01-02"]))
    assert isinstance(dates, BoundSetPredicate) and dates.literals == {17486, 1}


def test_starts_with() -> None:
    assert bind(SCHEMA, StartsWith("s", "")) == bind(SCHEMA, NotNull("s"))
    assert bind(SCHEMA, NotStartsWith("s", "")) == bind(SCHEMA, IsNull("s"))
    with pytest.raises(ValidationError, match="string columns only"):
        bind(SCHEMA, StartsWith("b", "00"))
    with pytest.raises(ValidationError, match="prefix must be a string"):
        bind(SCHEMA, StartsWith("s", 5))


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        (EqualTo("i", "5"), "cannot be compared with column 'i' of type int"),
        (EqualTo("s", 5), "of type string"),
        (EqualTo("d", "2017-13-45"), "no such calendar date"),
        (EqualTo("tstz", "2017-11-16T22:31:08"), "tstz"),
        (EqualTo("fx", b"\x01"), "exactly 2"),
        (EqualTo("i", True), "of type int"),
        (EqualTo("dec", "abc"), "not a decimal number"),
        (LessThan("loc", 1), "cannot be compared with literals"),
        (EqualTo("tags", 1), "cannot be compared"),
        (EqualTo("nothing", 1), "cannot be compared"),
        (EqualTo("u", Literal(1, DateType())), "of type uuid"),
    ],
)
def test_refused_comparisons(expr: Any, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        bind(SCHEMA, expr)


def test_transform_terms() -> None:
    expr = bind(SCHEMA, EqualTo(TransformTerm("bucket[16]", "id"), 3))
    assert isinstance(expr, BoundLiteralPredicate)
    assert isinstance(expr.term, BoundTransform)
    assert expr.term.transform == BucketTransform(16)
    assert expr.term.result_type == IntegerType()
    day = bind(SCHEMA, GreaterThan(TransformTerm(DayTransform(), "ts"), "2017-11-16"))
    assert _lit(day) == (Operation.GT, 17486)
    assert bind(SCHEMA, EqualTo(TransformTerm("identity", "s"), "a")) == bind(
        SCHEMA, EqualTo("s", "a")
    )
    with pytest.raises(ValidationError, match="cannot be applied to column 's'"):
        bind(SCHEMA, EqualTo(TransformTerm("day", "s"), 1))
    with pytest.raises(ValidationError, match="cannot be applied"):
        bind(SCHEMA, EqualTo(TransformTerm("zorder", "s"), 1))


def test_structure_is_kept() -> None:
    expr = bind(SCHEMA, Not(And(EqualTo("i", 1), IsNull("s"))))
    assert isinstance(expr, Not)
    assert bind(SCHEMA, And(EqualTo("i", 1), EqualTo("i", 2**40))) == AlwaysFalse()


def test_binds_to_a_schema_over_a_struct() -> None:
    struct = StructType(NestedField(1000, "ts_day", DateType()))
    assert isinstance(bind(Schema.from_struct(struct), EqualTo("ts_day", 1)), BoundLiteralPredicate)


# -- the law: a bound comparison means exactly what the unbound one says -------------------------

_ORDERS = {
    Operation.LT: lambda x, v: x < v,
    Operation.LT_EQ: lambda x, v: x <= v,
    Operation.GT: lambda x, v: x > v,
    Operation.GT_EQ: lambda x, v: x >= v,
    Operation.EQ: lambda x, v: x == v,
}

_LAW_SCHEMA = Schema(
    NestedField(1, "i", IntegerType()),
    NestedField(2, "dec", DecimalType(3, 1)),
    NestedField(3, "r", IntegerType(), required=True),
)

_INT_EDGES = st.sampled_from([-(2**31), -(2**31) + 1, 2**31 - 2, 2**31 - 1, 0, -1, 1])
_NUMBERS = st.one_of(
    st.integers(-(2**33), 2**33),
    _INT_EDGES,
    st.floats(allow_nan=False, min_value=-(2.0**33), max_value=2.0**33),
    st.sampled_from([math.inf, -math.inf, 2.5, -2.5, 0.5]),
    st.decimals(allow_nan=False, allow_infinity=False, places=3, min_value=-200, max_value=200),
)


@settings(max_examples=examples(400), deadline=None)
@given(
    st.sampled_from([*_ORDERS, Operation.NOT_EQ]),
    st.sampled_from(["i", "r", "dec"]),
    _NUMBERS,
    st.lists(
        st.one_of(
            st.none(),
            st.integers(-(2**31), 2**31 - 1),
            _INT_EDGES,
            st.decimals(
                allow_nan=False, allow_infinity=False, places=1, min_value=-99, max_value=99
            ),
        ),
        min_size=1,
        max_size=6,
    ),
)
def test_bound_comparisons_are_exact(op: Operation, column: str, value: Any, xs: list[Any]) -> None:
    evaluator = Evaluator(_LAW_SCHEMA, bind(_LAW_SCHEMA, predicate(op, column, [value])))
    exact = Decimal(value) if not isinstance(value, float) or math.isfinite(value) else value
    for x in xs:
        if column == "dec":
            x = None if x is None else Decimal(x).quantize(Decimal("0.1"))
            if x is not None and abs(x) > Decimal("99.9"):
                continue  # not a value of decimal(3, 1)
        elif isinstance(x, Decimal):
            x = int(x)
        if x is None and column == "r":
            continue
        row = (x, x, x)
        if x is None:
            expected = op is Operation.NOT_EQ
        elif op is Operation.NOT_EQ:
            expected = Decimal(x) != exact
        else:
            expected = _ORDERS[op](Decimal(x), exact)
        assert evaluator.eval(row) == expected, (op, column, value, x)


@settings(max_examples=examples(200), deadline=None)
@given(
    st.sampled_from([Operation.IN, Operation.NOT_IN]),
    st.lists(_NUMBERS, max_size=4),
    st.lists(st.one_of(st.none(), st.integers(-3, 3), _INT_EDGES), min_size=1, max_size=5),
)
def test_bound_sets_are_exact(op: Operation, values: list[Any], xs: list[Any]) -> None:
    evaluator = Evaluator(_LAW_SCHEMA, bind(_LAW_SCHEMA, predicate(op, "i", values)))
    members = {Decimal(v) for v in values if not isinstance(v, float) or math.isfinite(v)}
    for x in xs:
        found = x is not None and Decimal(x) in members
        assert evaluator.eval((x, None, 0)) == (found if op is Operation.IN else not found)
