"""The JSON form of expressions: every shape of the expressions spec, both generations."""

from __future__ import annotations

import json
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
    StartsWith,
    TransformTerm,
    predicate,
)
from icefloe.expressions.binding import bind
from icefloe.expressions.json_form import (
    expression_to_json,
    expression_to_json_text,
    parse_expression,
)
from icefloe.spec.schema import Schema
from icefloe.spec.transforms import BucketTransform, DayTransform, TruncateTransform
from icefloe.spec.types import (
    BinaryType,
    DateType,
    DecimalType,
    DoubleType,
    LongType,
    NestedField,
    StringType,
    TimestampType,
    TimestamptzType,
    UUIDType,
)

REF = {"type": "reference", "name": "x"}


# -- the current form --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        (True, AlwaysTrue()),
        (False, AlwaysFalse()),
        ({"type": "true"}, AlwaysTrue()),
        ({"type": "false"}, AlwaysFalse()),
        ({"type": "is-null", "child": REF}, IsNull("x")),
        ({"type": "not-null", "child": REF}, NotNull("x")),
        ({"type": "is-nan", "child": REF}, IsNaN("x")),
        ({"type": "not-nan", "child": REF}, NotNaN("x")),
        ({"type": "lt", "left": REF, "right": 5}, LessThan("x", 5)),
        ({"type": "lt-eq", "left": REF, "right": 5}, LessThanOrEqual("x", 5)),
        ({"type": "gt", "left": REF, "right": 5}, GreaterThan("x", 5)),
        ({"type": "gt-eq", "left": REF, "right": 5}, GreaterThanOrEqual("x", 5)),
        ({"type": "eq", "left": REF, "right": "a"}, EqualTo("x", "a")),
        ({"type": "not-eq", "left": REF, "right": 1.5}, NotEqualTo("x", 1.5)),
        ({"type": "starts-with", "left": REF, "right": "ab"}, StartsWith("x", "ab")),
        ({"type": "not-starts-with", "left": REF, "right": "ab"}, NotStartsWith("x", "ab")),
        ({"type": "in", "child": REF, "values": [1, 2]}, In("x", [1, 2])),
        ({"type": "not-in", "child": REF, "values": ["a"]}, NotIn("x", ["a"])),
        # a literal on the left flips the comparison
        ({"type": "lt", "left": 5, "right": REF}, GreaterThan("x", 5)),
        ({"type": "gt-eq", "left": 5, "right": REF}, LessThanOrEqual("x", 5)),
        ({"type": "eq", "left": 5, "right": REF}, EqualTo("x", 5)),
        # literal objects, typed and untyped
        ({"type": "eq", "left": REF, "right": {"type": "literal", "value": 5}}, EqualTo("x", 5)),
        (
            {
                "type": "eq",
                "left": REF,
                "right": {"type": "literal", "value": "2017-11-16", "data-type": "date"},
            },
            EqualTo("x", Literal(17486, DateType())),
        ),
        (
            {
                "type": "in",
                "child": REF,
                "values": {
                    "type": "literals",
                    "values": ["1.50", "2.00"],
                    "data-type": "decimal(3,2)",
                },
            },
            In("x", [Decimal("1.50"), Decimal("2.00")]),
        ),
        (
            {"type": "in", "child": REF, "values": [{"type": "literal", "value": 3}, 4]},
            In("x", [3, 4]),
        ),
        # references by id, function applications
        ({"type": "is-null", "child": {"type": "reference", "id": 3}}, IsNull(IdReference(3))),
        (
            {
                "type": "eq",
                "left": {"type": "apply", "function": "bucket", "arguments": [16, REF]},
                "right": 3,
            },
            EqualTo(TransformTerm(BucketTransform(16), "x"), 3),
        ),
        (
            {
                "type": "eq",
                "left": {"type": "apply", "function": ["day"], "arguments": [REF]},
                "right": "2017-11-16",
            },
            EqualTo(TransformTerm(DayTransform(), "x"), "2017-11-16"),
        ),
        (
            {
                "type": "eq",
                "left": {
                    "type": "apply",
                    "function": {"identifier": ["truncate"]},
                    "arguments": [{"type": "literal", "value": 4}, REF],
                },
                "right": "abcd",
            },
            EqualTo(TransformTerm(TruncateTransform(4), "x"), "abcd"),
        ),
        (
            {
                "type": "gt",
                "left": {
                    "type": "apply",
                    "function": {"catalog": "iceberg_functions", "identifier": ["year"]},
                    "arguments": [REF],
                },
                "right": 48,
            },
            GreaterThan(TransformTerm("year", "x"), 48),
        ),
        # logic
        (
            {
                "type": "and",
                "left": {"type": "is-null", "child": REF},
                "right": {"type": "not", "child": {"type": "lt", "left": REF, "right": 1}},
            },
            And(IsNull("x"), Not(LessThan("x", 1))),
        ),
        (
            {"type": "or", "left": {"type": "is-nan", "child": REF}, "right": False},
            IsNaN("x"),  # constructors simplify
        ),
    ],
)
def test_parse_current_form(obj: Any, expected: BooleanExpression) -> None:
    assert parse_expression(obj) == expected
    assert parse_expression(json.dumps(obj)) == expected


# -- the deprecated (term) form ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        ({"type": "is-null", "term": "x"}, IsNull("x")),
        ({"type": "not-nan", "term": {"type": "reference", "term": "x"}}, NotNaN("x")),
        ({"type": "eq", "term": "x", "value": 34}, EqualTo("x", 34)),
        ({"type": "lt", "term": "x", "value": {"type": "literal", "value": 34}}, LessThan("x", 34)),
        ({"type": "starts-with", "term": "x", "value": "ab"}, StartsWith("x", "ab")),
        ({"type": "in", "term": "x", "values": [1, 2, 3]}, In("x", [1, 2, 3])),
        ({"type": "not-in", "term": "x", "values": []}, NotIn("x", [])),
        (
            {
                "type": "eq",
                "term": {"type": "transform", "transform": "bucket[16]", "term": "x"},
                "value": 3,
            },
            EqualTo(TransformTerm(BucketTransform(16), "x"), 3),
        ),
        (
            {
                "type": "lt-eq",
                "term": {
                    "type": "transform",
                    "transform": "day",
                    "term": {"type": "reference", "term": "x"},
                },
                "value": "2017-11-16",
            },
            LessThanOrEqual(TransformTerm("day", "x"), "2017-11-16"),
        ),
    ],
)
def test_parse_deprecated_form(obj: Any, expected: BooleanExpression) -> None:
    assert parse_expression(obj) == expected


# -- writing and round trips -------------------------------------------------------------------


def test_write_current_and_legacy_forms() -> None:
    expr = And(EqualTo(TransformTerm("bucket[8]", "x"), 3), In("y", [1]))
    assert expression_to_json(expr) == {
        "type": "and",
        "left": {
            "type": "eq",
            "left": {
                "type": "apply",
                "function": {"catalog": "iceberg_functions", "identifier": ["bucket"]},
                "arguments": [8, REF],
            },
            "right": 3,
        },
        "right": {"type": "in", "child": {"type": "reference", "name": "y"}, "values": [1]},
    }
    assert expression_to_json(expr, legacy=True) == {
        "type": "and",
        "left": {
            "type": "eq",
            "term": {"type": "transform", "transform": "bucket[8]", "term": "x"},
            "value": 3,
        },
        "right": {"type": "in", "term": "y", "values": [1]},
    }
    assert expression_to_json(AlwaysTrue()) is True
    assert json.loads(expression_to_json_text(IsNull("x"))) == {"type": "is-null", "child": REF}


def test_typed_literals_are_written_with_their_type() -> None:
    expr = EqualTo("x", Decimal("14.20"))
    assert expression_to_json(expr)["right"] == {
        "type": "literal",
        "value": "14.20",
        "data-type": "decimal(4,2)",
    }
    assert expression_to_json(expr, legacy=True)["value"] == "14.20"
    assert expression_to_json(EqualTo("x", True))["right"] is True


_ALL_SHAPES: list[BooleanExpression] = [
    AlwaysTrue(),
    AlwaysFalse(),
    *(predicate(op, "x") for op in Operation if op.is_unary),
    *(predicate(op, "x", ["v"]) for op in Operation if op.is_literal),
    *(predicate(op, "x", [1, 2]) for op in Operation if op.is_set),
    And(IsNull("a"), Or(EqualTo("b", 1), Not(LessThan("c", 2.5)))),
    EqualTo("x", Literal(17486, DateType())),
    EqualTo("x", uuid.UUID("f79c3e09-677c-4bbd-a479-3f349cb785e7")),
    EqualTo("x", b"\x00\xff"),
    In("x", [Decimal("1.5"), Decimal("2.5")]),
    GreaterThan(TransformTerm("hour", "ts"), 5),
    EqualTo(TransformTerm("truncate[3]", "s"), "abc"),
    IsNull(IdReference(4)),
]


@pytest.mark.parametrize("expr", _ALL_SHAPES, ids=str)
def test_round_trip(expr: BooleanExpression) -> None:
    assert parse_expression(expression_to_json(expr)) == expr
    assert parse_expression(expression_to_json_text(expr)) == expr
    if "#" not in str(expr):  # id references have no deprecated form
        legacy = parse_expression(expression_to_json(expr, legacy=True))
        if "::" not in str(expr):  # the deprecated form drops literal types
            assert legacy == expr


SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "d", DateType()),
    NestedField(3, "ts", TimestampType()),
    NestedField(4, "tz", TimestamptzType()),
    NestedField(5, "dec", DecimalType(9, 2)),
    NestedField(6, "u", UUIDType()),
    NestedField(7, "b", BinaryType()),
    NestedField(8, "x", DoubleType()),
    NestedField(9, "s", StringType()),
)


@pytest.mark.parametrize(
    "expr",
    [
        EqualTo("d", "2017-11-16"),
        In("ts", ["2017-11-16T22:31:08.123456", "1969-12-31T23:59:59.999999"]),
        LessThan("tz", "2017-11-16T22:31:08.123456+00:00"),
        NotEqualTo("dec", "14.20"),
        EqualTo("u", "f79c3e09-677c-4bbd-a479-3f349cb785e7"),
        EqualTo("b", "000102ff"),
        And(GreaterThan("x", -1.5), Not(StartsWith("s", "ab"))),
        EqualTo(TransformTerm("bucket[4]", "id"), 1),
        GreaterThan(TransformTerm("day", "ts"), "2017-11-16"),
    ],
    ids=str,
)
def test_bound_round_trip(expr: BooleanExpression) -> None:
    bound = bind(SCHEMA, expr)
    for legacy in (False, True):
        assert bind(SCHEMA, parse_expression(expression_to_json(bound, legacy=legacy))) == bound
    by_id = expression_to_json(bound, use_ids=True)
    assert "name" not in json.dumps(by_id)
    assert bind(SCHEMA, parse_expression(by_id)) == bound


# -- errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        (None, r"at \$: expected a predicate"),
        (3, r"at \$: expected a predicate"),
        ({"left": True}, "needs a string 'type'"),
        ({"type": "equals", "term": "x", "value": 1}, "unknown predicate type 'equals'"),
        ({"type": "and", "left": True}, "'and' needs a 'right' field"),
        (
            {"type": "not", "child": {"type": "eq", "left": REF}},
            r"at \$\.child: 'eq' needs a 'right'",
        ),
        ({"type": "is-null"}, "needs a 'child' field"),
        ({"type": "eq", "term": "x"}, "needs a 'value' field"),
        ({"type": "eq", "term": "x", "value": [1, 2]}, r"\$\.value: expected a single value"),
        ({"type": "eq", "term": "x", "value": None}, "cannot be null"),
        ({"type": "eq", "term": "x", "value": {"a": 1}}, "expected a literal value"),
        ({"type": "in", "term": "x", "values": 1}, "expected a list of literals"),
        ({"type": "in", "term": "x", "value": [1]}, "unexpected field"),
        ({"type": "is-null", "term": 5}, r"\$\.term: expected a column name"),
        ({"type": "is-null", "term": ""}, "must not be empty"),
        ({"type": "is-null", "child": "x"}, r"\$\.child: expected a reference"),
        ({"type": "eq", "left": REF, "right": REF}, "between two columns"),
        ({"type": "eq", "left": 1, "right": 2}, "between two literals"),
        ({"type": "starts-with", "left": "a", "right": REF}, "column on the left"),
        ({"type": "is-null", "child": {"type": "reference"}}, "exactly one of 'name' or 'id'"),
        ({"type": "is-null", "child": {"type": "reference", "id": "3"}}, "must be an integer"),
        (
            {"type": "is-null", "child": {"type": "apply", "function": "f", "arguments": [REF]}},
            "unknown function 'f'",
        ),
        (
            {
                "type": "is-null",
                "child": {
                    "type": "apply",
                    "function": {"catalog": "mine", "identifier": ["bucket"]},
                    "arguments": [4, REF],
                },
            },
            "function 'mine.bucket' is not supported",
        ),
        (
            {
                "type": "is-null",
                "child": {"type": "apply", "function": "bucket", "arguments": [REF]},
            },
            "two arguments",
        ),
        (
            {
                "type": "is-null",
                "child": {"type": "apply", "function": "bucket", "arguments": ["x", REF]},
            },
            "integer parameter",
        ),
        (
            {"type": "is-null", "child": {"type": "apply", "function": "day", "arguments": [3]}},
            "applied to a column reference",
        ),
        (
            {"type": "is-null", "term": {"type": "transform", "transform": "zorder", "term": "x"}},
            "unknown transform 'zorder'",
        ),
        (
            {
                "type": "eq",
                "term": "x",
                "value": {"type": "literal", "value": "x", "data-type": "date"},
            },
            r"\$\.value: invalid date value",
        ),
        (
            {
                "type": "eq",
                "term": "x",
                "value": {"type": "literal", "value": 1, "data-type": "pear"},
            },
            "unknown Iceberg type 'pear'",
        ),
        ("{not json", "not valid JSON"),
    ],
)
def test_parse_errors_name_the_bad_part(obj: Any, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        parse_expression(obj)


def test_write_errors() -> None:
    with pytest.raises(ValidationError, match="no field-id references"):
        expression_to_json(IsNull("x"), legacy=True, use_ids=True)
    with pytest.raises(ValidationError, match="no deprecated"):
        expression_to_json(IsNull(IdReference(1)), legacy=True)


def test_deep_nesting_is_an_error_not_a_crash() -> None:
    obj: Any = True
    for _ in range(100_000):
        obj = {"type": "not", "child": obj}
    with pytest.raises(ValidationError, match="nested too deeply"):
        parse_expression(obj)


# -- the law: writing then parsing gives the same expression -------------------------------------

_SCALARS = st.one_of(
    st.integers(-(2**63), 2**63),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=5),
    st.booleans(),
    st.decimals(
        allow_nan=False, allow_infinity=False, places=2, min_value=-(10**6), max_value=10**6
    ),
    st.binary(max_size=4),
    st.uuids(),
)
_NAMES = st.sampled_from(["a", "b.c", "weird name", "ünï"])
_TERMS = st.one_of(
    _NAMES,
    st.builds(IdReference, st.integers(1, 100)),
    st.builds(
        TransformTerm, st.sampled_from(["bucket[7]", "truncate[2]", "day", "identity"]), _NAMES
    ),
)


def _leaf(op: Operation, term: Any, values: list[Any]) -> BooleanExpression:
    if op.is_unary:
        return predicate(op, term)
    if op.is_set:
        return predicate(op, term, values)
    return predicate(op, term, values[:1])


_LEAVES = st.builds(
    _leaf, st.sampled_from(list(Operation)), _TERMS, st.lists(_SCALARS, min_size=1, max_size=3)
)
_EXPRS = st.recursive(
    st.one_of(_LEAVES, st.just(AlwaysTrue()), st.just(AlwaysFalse())),
    lambda children: st.one_of(
        st.builds(And, children, children),
        st.builds(Or, children, children),
        st.builds(Not, children),
    ),
    max_leaves=8,
)


@settings(max_examples=examples(200), deadline=None)
@given(_EXPRS)
def test_json_round_trip_law(expr: BooleanExpression) -> None:
    text = expression_to_json_text(expr)
    assert parse_expression(text) == expr


def test_filter_text_is_json_when_it_starts_with_a_brace_and_the_filter_syntax_otherwise() -> None:
    from icefloe.expressions import EqualTo
    from icefloe.expressions.json_form import parse_filter_text

    assert parse_filter_text('  {"type": "eq", "term": "a", "value": 1}') == EqualTo("a", 1)
    assert parse_filter_text("a = 1") == EqualTo("a", 1)
    with pytest.raises(ValidationError, match="not valid JSON"):
        parse_filter_text("{a = 1}")
    with pytest.raises(ValidationError, match="at position 4"):
        parse_filter_text("a = ")
