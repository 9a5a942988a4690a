"""Filters as people write them: ``pickup_ts >= '2024-01-01' and vendor_id in (1, 2)``.

The syntax is PyIceberg's (``pyiceberg.expressions.parser``), so a filter copied from a
PyIceberg ``row_filter=`` string means the same here; :func:`parse_filter` turns it into
icefloe's unbound expressions and :func:`format_filter` writes one back (``parse_filter``
of it gives the same expression). The grammar, keywords in any case::

    filter     := or
    or         := and ("or" and)*
    and        := not ("and" not)*               # not binds tightest, then and, then or
    not        := "not" not | "(" filter ")" | "true" | "false" | predicate
    predicate  := column op literal | literal op column      # op: < <= > >= = == != <>
                | column "is" ["not"] ("null" | "nan")
                | column ["not"] "in" "(" literal ("," literal)* ")"
                | column ["not"] "like" 'string'            # 'abc%' is starts-with 'abc'
                | column "between" literal "and" literal    # >= low and <= high
    column     := name ("." name)*               # name: [A-Za-z_][A-Za-z0-9_$]* or "quoted"
    literal    := 'string' | integer | decimal | "true" | "false"

Strings are single-quoted, a quote inside doubled (``'it''s'``); they stay untyped, so
their meaning comes from the column they are compared with, as in the JSON form (``'2024-
01-01'`` is a date for a date column). Integers are untyped too; a number with a decimal
point is a ``Decimal`` (as PyIceberg's ``DecimalLiteral``; it binds to float, double and
decimal columns), one with an exponent (``1e-3``) a float. ``like`` takes a pattern whose
only wildcard is a trailing ``%`` (``\\%`` is a literal percent sign, ``\\\\`` a backslash);
without the wildcard it is an equality, as in PyIceberg. A quoted name is one column name,
dots included; PyIceberg refuses dots there, icefloe takes them, since a column may have one.

Where icefloe differs on purpose: ``not x < 5`` stays ``Not(x < 5)`` (it holds for a null
``x``; PyIceberg rewrites it to ``x >= 5``, which does not), the values of ``in`` may mix
kinds, and ``null`` as a value is refused with a pointer to ``is null``.

Errors are :class:`FilterSyntaxError`: the position (0-based character offset), what was
expected there and what was found, and the filter with ``<here>`` at the spot, all on one
line (the CLI prints errors a line each).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from icefloe.errors import ValidationError
from icefloe.expressions.boolean import AlwaysFalse, AlwaysTrue, And, BooleanExpression, Not, Or
from icefloe.expressions.literals import Literal
from icefloe.expressions.operations import Operation
from icefloe.expressions.predicates import (
    EqualTo,
    GreaterThanOrEqual,
    IsNaN,
    IsNull,
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
    predicate,
)
from icefloe.expressions.terms import Reference

KEYWORDS = frozenset(
    ("and", "or", "not", "is", "in", "null", "nan", "like", "between", "true", "false")
)

_COMPARISONS: dict[str, Operation] = {
    "<": Operation.LT,
    "<=": Operation.LT_EQ,
    ">": Operation.GT,
    ">=": Operation.GT_EQ,
    "=": Operation.EQ,
    "==": Operation.EQ,
    "!=": Operation.NOT_EQ,
    "<>": Operation.NOT_EQ,
}

_TOKEN = re.compile(
    r"""
    (?P<space>\s+)
    | (?P<number>[+-]?(?:[0-9]+\.[0-9]*|\.[0-9]+|[0-9]+)(?:[eE][+-]?[0-9]+)?)(?![A-Za-z0-9_$.])
    | (?P<string>'(?:[^']|'')*')
    | (?P<quoted>"(?:[^"]|"")*")
    | (?P<name>[A-Za-z_][A-Za-z0-9_$]*)
    | (?P<op><=|>=|<>|!=|==|=|<|>)
    | (?P<punct>[(),.])
    """,
    re.VERBOSE,
)


HERE = "<here>"
"""Where a :class:`FilterSyntaxError` marks the spot in the filter it quotes."""


class FilterSyntaxError(ValidationError):
    """A filter that does not parse: where, what was expected there and what was found."""

    def __init__(self, text: str, position: int, expected: str, found: str) -> None:
        self.text = text
        self.position = position
        self.expected = expected
        self.found = found
        # one line, as every CLI error is one; same length, so the position still holds
        line = re.sub(r"\s", " ", text)
        super().__init__(
            f"filter: expected {expected} at position {position}, found {found}: "
            f"{line[:position]}{HERE}{line[position:]}"
        )


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str  # number, string, quoted, name, op, punct, end
    text: str
    position: int

    def keyword(self, *words: str) -> bool:
        return self.kind == "name" and self.text.lower() in words

    def describe(self) -> str:
        return "the end of the filter" if self.kind == "end" else repr(self.text)


def _tokens(text: str) -> list[_Token]:
    out: list[_Token] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            if text[pos] in "'\"":
                raise FilterSyntaxError(
                    text, pos, f"a closing {text[pos]} for this quote", "the end of the filter"
                )
            raise FilterSyntaxError(
                text, pos, "a name, a value, an operator or a parenthesis", repr(text[pos])
            )
        kind = m.lastgroup
        assert kind is not None
        if kind != "space":
            out.append(_Token(kind, m.group(), pos))
        pos = m.end()
    out.append(_Token("end", "", len(text)))
    return out


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokens(text)
        self.i = 0

    # -- helpers ----------------------------------------------------------------------------

    @property
    def peek(self) -> _Token:
        return self.tokens[self.i]

    def take(self) -> _Token:
        token = self.tokens[self.i]
        if token.kind != "end":
            self.i += 1
        return token

    def fail(self, expected: str, token: _Token | None = None) -> FilterSyntaxError:
        token = token or self.peek
        return FilterSyntaxError(self.text, token.position, expected, token.describe())

    def expect_punct(self, char: str, expected: str) -> None:
        if self.peek.kind == "punct" and self.peek.text == char:
            self.take()
            return
        raise self.fail(expected)

    def expect_keyword(self, word: str, expected: str) -> None:
        if not self.peek.keyword(word):
            raise self.fail(expected)
        self.take()

    # -- grammar ----------------------------------------------------------------------------

    def parse(self) -> BooleanExpression:
        expr = self.or_()
        if self.peek.kind != "end":
            raise self.fail("'and', 'or' or the end of the filter")
        return expr

    def or_(self) -> BooleanExpression:
        parts = [self.and_()]
        while self.peek.keyword("or"):
            self.take()
            parts.append(self.and_())
        return parts[0] if len(parts) == 1 else Or(*parts)

    def and_(self) -> BooleanExpression:
        parts = [self.not_()]
        while self.peek.keyword("and"):
            self.take()
            parts.append(self.not_())
        return parts[0] if len(parts) == 1 else And(*parts)

    def not_(self) -> BooleanExpression:
        token = self.peek
        if token.keyword("not"):
            self.take()
            return Not(self.not_())
        if token.kind == "punct" and token.text == "(":
            self.take()
            inner = self.or_()
            self.expect_punct(")", "')' or a connective ('and', 'or')")
            return inner
        if token.keyword("true", "false") and not self._comparison_follows():
            self.take()
            return AlwaysTrue() if token.text.lower() == "true" else AlwaysFalse()
        return self.predicate()

    def _comparison_follows(self) -> bool:
        after = self.tokens[self.i + 1]
        return after.kind == "op"

    def predicate(self) -> BooleanExpression:
        token = self.peek
        if token.kind in ("number", "string") or token.keyword("true", "false"):
            value = self.literal()
            op_token = self.take()
            if op_token.kind != "op":
                raise self.fail("a comparison (<, <=, >, >=, =, !=) after a value", op_token)
            column = self.column()
            flipped = _COMPARISONS[op_token.text].flipped
            assert flipped is not None  # every comparison has its mirror image
            return predicate(flipped, column, [value])
        if token.kind not in ("name", "quoted") or token.keyword(*KEYWORDS):
            raise self.fail("a column name, a value, 'not', '(', 'true' or 'false'")
        column = self.column()
        return self.tail(column)

    def column(self) -> Reference:
        parts = [self.name()]
        while self.peek.kind == "punct" and self.peek.text == ".":
            self.take()
            parts.append(self.name())
        return Reference(".".join(parts))

    def name(self) -> str:
        token = self.peek
        if token.kind == "quoted":
            self.take()
            name = token.text[1:-1].replace('""', '"')
            if not name:
                raise self.fail("a column name (quoted names are not empty)", token)
            return name
        if token.kind != "name":
            raise self.fail("a column name")
        if token.keyword(*KEYWORDS):
            raise self.fail(f'a column name (quote a column named {token.text} as "{token.text}")')
        self.take()
        return token.text

    def tail(self, column: Reference) -> BooleanExpression:
        token = self.take()
        if token.kind == "op":
            return predicate(_COMPARISONS[token.text], column, [self.literal()])
        if token.keyword("is"):
            negated = self.peek.keyword("not")
            if negated:
                self.take()
            what = self.take()
            if what.keyword("null"):
                return NotNull(column) if negated else IsNull(column)
            if what.keyword("nan"):
                return NotNaN(column) if negated else IsNaN(column)
            raise self.fail("'null' or 'nan'" if negated else "'not', 'null' or 'nan'", what)
        negated = token.keyword("not")
        if negated:
            token = self.take()
        if token.keyword("in"):
            self.expect_punct("(", "'(' and the values of 'in'")
            values = [self.literal()]
            while self.peek.kind == "punct" and self.peek.text == ",":
                self.take()
                values.append(self.literal())
            self.expect_punct(")", "',' and another value, or ')' to close the list")
            return predicate(Operation.NOT_IN if negated else Operation.IN, column, values)
        if token.keyword("like"):
            pattern = self.take()
            if pattern.kind != "string":
                raise self.fail("a quoted pattern after 'like', such as 'abc%'", pattern)
            return self.like(column, pattern, negated)
        if token.keyword("between") and not negated:
            low = self.literal()
            self.expect_keyword("and", "'and' and the upper bound of 'between'")
            high = self.literal()
            return And(GreaterThanOrEqual(column, low), LessThanOrEqual(column, high))
        if negated:
            raise self.fail("'in' or 'like' after 'not'", token)
        raise self.fail(
            "a comparison (<, <=, >, >=, =, !=), 'is', 'in', 'not', 'like' or 'between' "
            f"after the column {column.name}",
            token,
        )

    def like(self, column: Reference, token: _Token, negated: bool) -> BooleanExpression:
        raw = _unquote(token.text)
        out: list[str] = []
        wildcard = False
        i = 0
        while i < len(raw):
            char = raw[i]
            if char == "\\" and i + 1 < len(raw) and raw[i + 1] in "%\\":
                out.append(raw[i + 1])
                i += 2
                continue
            if char == "%":
                if i != len(raw) - 1:
                    raise FilterSyntaxError(
                        self.text,
                        token.position + 1 + _quoted_offset(token.text, i),
                        "'%' only at the end of a like pattern (write \\% for a percent sign)",
                        "'%'",
                    )
                wildcard = True
            else:
                out.append(char)
            i += 1
        value = "".join(out)
        if wildcard:
            return NotStartsWith(column, value) if negated else StartsWith(column, value)
        return NotEqualTo(column, value) if negated else EqualTo(column, value)

    def literal(self) -> Any:
        token = self.take()
        if token.kind == "string":
            return _unquote(token.text)
        if token.kind == "number":
            value = _number(token.text)
            if isinstance(value, float) and not math.isfinite(value):
                raise self.fail("a number a double can hold", token)
            return value
        if token.keyword("true", "false"):
            return token.text.lower() == "true"
        if token.keyword("null"):
            raise self.fail("a value ('null' is not one: test with 'is null')", token)
        raise self.fail("a value: a 'quoted string', a number, true or false", token)


def _unquote(text: str) -> str:
    return text[1:-1].replace("''", "'")


def _quoted_offset(quoted: str, index: int) -> int:
    """Offset in the quoted token text (after the opening quote) of unquoted ``index``."""
    body = quoted[1:-1]
    seen = 0
    pos = 0
    while seen < index and pos < len(body):
        pos += 2 if body.startswith("''", pos) else 1
        seen += 1
    return pos


def _number(text: str) -> int | Decimal | float:
    if "e" in text.lower():
        return float(text)
    if "." in text:
        return Decimal(text)
    return int(text)


def parse_filter(text: str) -> BooleanExpression:
    """The unbound expression a filter string means; FilterSyntaxError when it has none."""
    if not isinstance(text, str):
        raise ValidationError(f"a filter must be a string, got {type(text).__name__}")
    try:
        return _Parser(text).parse()
    except RecursionError:
        raise ValidationError("filter: nested too deeply to parse") from None


# -- writing a filter back --------------------------------------------------------------------

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*")
_SYMBOLS: dict[Operation, str] = {
    Operation.LT: "<",
    Operation.LT_EQ: "<=",
    Operation.GT: ">",
    Operation.GT_EQ: ">=",
    Operation.EQ: "=",
    Operation.NOT_EQ: "!=",
}


def _column(name: str) -> str:
    parts = name.split(".")
    if all(_NAME.fullmatch(p) and p.lower() not in KEYWORDS for p in parts):
        return name
    return '"' + name.replace('"', '""') + '"'


def _value(literal: Literal) -> str:
    value = literal.value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str) and literal.type is None:
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, int) and literal.type is None:
        return str(value)
    if isinstance(value, Decimal):
        text = format(value, "f")  # a point marks a decimal: "5." is Decimal("5")
        return text if "." in text else text + "."
    if isinstance(value, float) and literal.type is None and math.isfinite(value):
        text = repr(value)  # an exponent marks a float: "1.5e0"
        return text if "e" in text else text + "e0"
    raise ValidationError(
        f"literal {literal} has no form in the filter syntax (only strings, integers, decimals, "
        "floats and booleans do); use the expression JSON form"
    )


def _pattern(prefix: str) -> str:
    escaped = prefix.replace("\\", "\\\\").replace("%", "\\%")
    return "'" + escaped.replace("'", "''") + "%'"


def _predicate_text(expr: BooleanExpression) -> str | None:
    if isinstance(expr, UnaryPredicate | LiteralPredicate | SetPredicate):
        term = expr.term
        if not isinstance(term, Reference):
            raise ValidationError(f"{expr}: only column references have a filter-syntax form")
        column = _column(term.name)
        op = expr.op
        if isinstance(expr, UnaryPredicate):
            words = {
                Operation.IS_NULL: "is null",
                Operation.NOT_NULL: "is not null",
                Operation.IS_NAN: "is nan",
                Operation.NOT_NAN: "is not nan",
            }
            return f"{column} {words[op]}"
        if isinstance(expr, SetPredicate):
            word = "not in" if isinstance(expr, NotIn) else "in"
            return f"{column} {word} ({', '.join(_value(v) for v in expr.literals)})"
        if op in (Operation.STARTS_WITH, Operation.NOT_STARTS_WITH):
            if not isinstance(expr.literal.value, str):
                raise ValidationError(f"{expr}: starts-with needs a string")
            word = "not like" if op == Operation.NOT_STARTS_WITH else "like"
            return f"{column} {word} {_pattern(expr.literal.value)}"
        return f"{column} {_SYMBOLS[op]} {_value(expr.literal)}"
    return None


def format_filter(expr: BooleanExpression) -> str:
    """``expr`` in the filter syntax (parenthesized fully), so ``parse_filter`` reads it back.

    ValidationError for what the syntax cannot say: bound expressions, transforms, typed
    literals other than booleans and decimals (dates, UUIDs, bytes; the JSON form can).
    """

    def text(e: BooleanExpression) -> str:
        if isinstance(e, AlwaysTrue):
            return "true"
        if isinstance(e, AlwaysFalse):
            return "false"
        if isinstance(e, And):
            return f"({text(e.left)} and {text(e.right)})"
        if isinstance(e, Or):
            return f"({text(e.left)} or {text(e.right)})"
        if isinstance(e, Not):
            return f"not ({text(e.child)})"
        out = _predicate_text(e)
        if out is None:
            raise ValidationError(f"{e!r:.100} has no form in the filter syntax")
        return out

    return text(expr)


__all__ = ["KEYWORDS", "FilterSyntaxError", "format_filter", "parse_filter"]
