"""The filter syntax (:mod:`icefloe.expressions.parser`): what strings mean, where they fail,
that writing and reading a filter round-trips, and that PyIceberg's parser reads the same
strings into the same expressions."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyiceberg.expressions import parser as pyiceberg_parser
from tests.hypothesis_budget import examples

from icefloe.errors import ValidationError
from icefloe.expressions import (
    AlwaysFalse,
    AlwaysTrue,
    And,
    BooleanExpression,
    EqualTo,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNaN,
    IsNull,
    LessThan,
    LessThanOrEqual,
    Not,
    NotEqualTo,
    NotIn,
    NotNaN,
    NotNull,
    NotStartsWith,
    Or,
    StartsWith,
)
from icefloe.expressions.parser import HERE, FilterSyntaxError, format_filter, parse_filter


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "pickup_ts >= '2024-01-01' and vendor_id in (1, 2)",
            And(GreaterThanOrEqual("pickup_ts", "2024-01-01"), In("vendor_id", [1, 2])),
        ),
        ("a < 5 OR b <> 'x'", Or(LessThan("a", 5), NotEqualTo("b", "x"))),
        ("NOT a < 5", Not(LessThan("a", 5))),  # kept: it holds for a null a
        ("not a = 1 and b = 2", And(Not(EqualTo("a", 1)), EqualTo("b", 2))),
        ("a = 1 or b = 2 and c = 3", Or(EqualTo("a", 1), And(EqualTo("b", 2), EqualTo("c", 3)))),
        ("(a = 1 or b = 2) and c = 3", And(Or(EqualTo("a", 1), EqualTo("b", 2)), EqualTo("c", 3))),
        ("5 < x", GreaterThan("x", 5)),
        ("'a' >= name", LessThanOrEqual("name", "a")),
        ("x == -3", EqualTo("x", -3)),
        ("price > 1.50", GreaterThan("price", Decimal("1.50"))),
        ("ratio <= 1e-3", LessThanOrEqual("ratio", 0.001)),
        ("flag = TRUE", EqualTo("flag", True)),
        ("a is null and b IS NOT NULL", And(IsNull("a"), NotNull("b"))),
        ("d is nan or d is not nan", Or(IsNaN("d"), NotNaN("d"))),
        ("id not in (1, 2, 3)", NotIn("id", [1, 2, 3])),
        ("name like 'abc%'", StartsWith("name", "abc")),
        ("name not like 'abc%'", NotStartsWith("name", "abc")),
        ("name like 'abc'", EqualTo("name", "abc")),
        ("name like '50\\%%'", StartsWith("name", "50%")),
        ("x between 1 and 10", And(GreaterThanOrEqual("x", 1), LessThanOrEqual("x", 10))),
        ("location.lat > 40", GreaterThan("location.lat", 40)),
        ('"my col" = 1 and "and" = 2', And(EqualTo("my col", 1), EqualTo("and", 2))),
        ('"say ""hi""" = 1', EqualTo('say "hi"', 1)),
        ("s = 'it''s'", EqualTo("s", "it's")),
        ("true", AlwaysTrue()),
        ("false or a = 1", EqualTo("a", 1)),
        ("  a\t=\n1  ", EqualTo("a", 1)),
    ],
)
def test_filters_mean_what_they_say(text: str, expected: BooleanExpression) -> None:
    assert parse_filter(text) == expected


@pytest.mark.parametrize(
    ("text", "position", "expected"),
    [
        ("a >= ", 5, "a value"),
        ("a in (1, 2", 10, "')' to close the list"),
        ("a in 1", 5, "'('"),
        ("a = null", 4, "is null"),
        ("a like 'x%y'", 9, "'%' only at the end"),
        ("a like x", 7, "a quoted pattern"),
        ("and = 1", 0, "a column name"),
        ("a = 1 b = 2", 6, "'and', 'or' or the end"),
        ("a = 'x", 4, "a closing '"),
        ("a ~ 1", 2, "an operator"),
        ("a is 5", 5, "'null' or 'nan'"),
        ("a is not 5", 9, "'null' or 'nan'"),
        ("(a = 1", 6, "')'"),
        ("a not between 1 and 2", 6, "'in' or 'like' after 'not'"),
        ("a between 1 or 2", 12, "'and'"),
        ("a", 1, "a comparison"),
        ("", 0, "a column name"),
        ("a.in = 1", 2, 'quote a column named in as "in"'),
        ('"" = 1', 0, "quoted names are not empty"),
        ("1 = 2", 4, "a column name"),
    ],
)
def test_errors_name_the_position_and_what_was_expected(
    text: str, position: int, expected: str
) -> None:
    with pytest.raises(FilterSyntaxError) as raised:
        parse_filter(text)
    error = raised.value
    assert error.position == position and expected in error.expected, str(error)
    assert isinstance(error, ValidationError)
    message = str(error)
    assert f"at position {position}" in message and "\n" not in message
    assert message.endswith(": " + text[:position] + HERE + text[position:])


def test_deep_nesting_is_an_error_not_a_crash() -> None:
    with pytest.raises(ValidationError, match="nested too deeply"):
        parse_filter("(" * 5000 + "a = 1" + ")" * 5000)
    assert parse_filter(" and ".join(f"c{i} = {i}" for i in range(3000))) is not None


@settings(max_examples=examples(300))
@given(
    st.one_of(
        st.text(max_size=40),
        st.lists(
            st.sampled_from(
                [
                    "a",
                    "'x'",
                    "1",
                    "1.5",
                    "1e999",
                    "(",
                    ")",
                    ",",
                    ".",
                    "not",
                    "and",
                    "or",
                    "in",
                    "is",
                    "null",
                    "nan",
                    "like",
                    "between",
                    "=",
                    "<",
                    "!=",
                    '"q"',
                    "'%'",
                    "true",
                ]
            ),
            max_size=12,
        ).map(" ".join),
    )
)
def test_any_text_parses_or_fails_with_a_validation_error(text: str) -> None:
    """Garbage never crashes the parser: an expression, or an error naming the problem."""
    try:
        parsed = parse_filter(text)
    except FilterSyntaxError as e:
        assert 0 <= e.position <= len(text)
        return
    except ValidationError:
        return  # a value a literal cannot hold (a decimal of 39 digits), named as such
    assert isinstance(parsed, BooleanExpression)
    assert parse_filter(format_filter(parsed)) == parsed


def test_what_the_syntax_cannot_say_is_refused_when_written() -> None:
    import datetime as dt

    with pytest.raises(ValidationError, match="JSON form"):
        format_filter(EqualTo("d", dt.date(2024, 1, 1)))


# -- writing and reading back -----------------------------------------------------------------

_NAMES = st.sampled_from(["a", "b.c", "my col", "and", 'q"uote', "x$1", "Nan", "ünï"])
_VALUES = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.text(max_size=6),
    st.booleans(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.decimals(
        allow_nan=False, allow_infinity=False, places=3, min_value=-(10**9), max_value=10**9
    ),
)
_COMPARE = st.sampled_from(
    [LessThan, LessThanOrEqual, GreaterThan, GreaterThanOrEqual, EqualTo, NotEqualTo]
)
_PREDICATES = st.one_of(
    st.builds(lambda c, n, v: c(n, v), _COMPARE, _NAMES, _VALUES),
    st.builds(lambda c, n: c(n), st.sampled_from([IsNull, NotNull, IsNaN, NotNaN]), _NAMES),
    st.builds(
        lambda c, n, vs: c(n, vs),
        st.sampled_from([In, NotIn]),
        _NAMES,
        st.lists(_VALUES, min_size=1, max_size=4),
    ),
    st.builds(
        lambda c, n, v: c(n, v),
        st.sampled_from([StartsWith, NotStartsWith]),
        _NAMES,
        st.text(max_size=6),
    ),
    st.sampled_from([AlwaysTrue(), AlwaysFalse()]),
)
_EXPRESSIONS = st.recursive(
    _PREDICATES,
    lambda inner: st.one_of(
        st.builds(And, inner, inner), st.builds(Or, inner, inner), st.builds(Not, inner)
    ),
    max_leaves=12,
)


@settings(max_examples=examples(300))
@given(_EXPRESSIONS)
def test_format_then_parse_round_trips(expr: BooleanExpression) -> None:
    assert parse_filter(format_filter(expr)) == expr


# -- parity with PyIceberg's parser -----------------------------------------------------------

PARITY_CORPUS = [
    "a = 1",
    "a == 'x'",
    "a != 1.5",
    "a <> -2",
    "a < 1 and b >= 2",
    "a <= 1 or b > 2",
    "1 < a",
    "'m' >= name",
    "a = 1 and b = 2 and c = 3",
    "a = 1 or b = 2 or c = 3",
    "a = 1 or b = 2 and c = 3",
    "(a = 1 or b = 2) and c = 3",
    "not a = 1",
    "not (a = 1 or b = 2)",
    "not a < 1 and b = 2",
    "a is null",
    "a is not null",
    "a IS NULL OR b IS NOT NULL",
    "f is nan",
    "f is not nan",
    "a in (1, 2, 3)",
    "a in ('x', 'y')",
    "a in (7)",
    "a not in (1, 2)",
    "s like 'abc%'",
    "s not like 'abc%'",
    "s like 'abc'",
    "s like 'a\\%b%'",
    "x between 1 and 5",
    "x between 'a' and 'm' and y = 1",
    "flag = true",
    "flag = FALSE",
    "nested.field.leaf > 0",
    '"quoted col" = 1',
    "price >= 10.25 and price < 99.99",
    "s = 'it''s'",
    "true",
    "false",
    "pickup_ts >= '2024-01-01' and vendor_id in (1, 2)",
]

_NEGATED = {
    "LessThan": "GreaterThanOrEqual",
    "GreaterThan": "LessThanOrEqual",
    "EqualTo": "NotEqualTo",
    "In": "NotIn",
    "IsNull": "NotNull",
    "IsNaN": "NotNaN",
    "StartsWith": "NotStartsWith",
}
_NEGATED |= {v: k for k, v in _NEGATED.items()}


def _canon(e: Any, negate: bool = False) -> Any:
    """One structure for an icefloe or a PyIceberg expression: NOT pushed into predicates
    the way PyIceberg does at once, AND/OR flattened, one-value sets as (in)equalities."""
    kind = type(e).__name__
    if kind in ("AlwaysTrue", "AlwaysFalse"):
        return (kind == "AlwaysTrue") != negate
    if kind == "Not":
        return _canon(e.child, not negate)
    if kind in ("And", "Or"):
        kind = {"And": "Or", "Or": "And"}[kind] if negate else kind
        parts: list[Any] = []
        for child in (e.left, e.right):
            c = _canon(child, negate)
            parts.extend(c[1] if isinstance(c, tuple) and c[0] == kind else [c])
        return (kind, parts)
    name = _NEGATED[kind] if negate else kind
    column = e.term.name
    if hasattr(e, "literals"):
        values = {(type(v.value).__name__, v.value) for v in e.literals}
        if len(values) == 1:
            return ("EqualTo" if name == "In" else "NotEqualTo", column, values.pop())
        return (name, column, frozenset(values))
    if hasattr(e, "literal"):
        return (name, column, (type(e.literal.value).__name__, e.literal.value))
    return (name, column)


@pytest.mark.parametrize("text", PARITY_CORPUS)
def test_pyiceberg_reads_the_same_strings_into_the_same_expressions(text: str) -> None:
    ours = parse_filter(text)
    theirs = pyiceberg_parser.parse(text)
    assert _canon(ours) == _canon(theirs)
