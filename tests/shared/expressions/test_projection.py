"""Inclusive and strict projection through every transform, and residuals per partition."""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples
from icefloe.expressions import (
    AlwaysFalse,
    AlwaysTrue,
    And,
    BooleanExpression,
    BoundLiteralPredicate,
    BoundSetPredicate,
    BoundTransform,
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
    NotNull,
    NotStartsWith,
    Operation,
    Or,
    StartsWith,
    TransformTerm,
    predicate,
)
from icefloe.expressions.binding import bind
from icefloe.expressions.evaluators import Evaluator, compile_row_filter
from icefloe.expressions.projection import (
    inclusive_projection,
    partition_references,
    residual_evaluator,
    strict_projection,
)
from icefloe.spec.partition import PartitionField, PartitionSpec
from icefloe.spec.schema import Schema
from icefloe.spec.transforms import (
    BucketTransform,
    DayTransform,
    HourTransform,
    IdentityTransform,
    MonthTransform,
    Transform,
    TruncateTransform,
    UnknownTransform,
    VoidTransform,
    YearTransform,
)
from icefloe.spec.types import (
    BinaryType,
    DateType,
    DecimalType,
    DoubleType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
    TimestampType,
    TimestamptzNanoType,
)

DAY_US = 86_400_000_000
HOUR_US = 3_600_000_000

SCHEMA = Schema(
    NestedField(1, "i", IntegerType()),
    NestedField(2, "l", LongType()),
    NestedField(3, "d", DateType()),
    NestedField(4, "ts", TimestampType()),
    NestedField(5, "ns", TimestamptzNanoType()),
    NestedField(6, "s", StringType()),
    NestedField(7, "dec", DecimalType(6, 2)),
    NestedField(8, "b", BinaryType()),
    NestedField(9, "x", DoubleType()),
    NestedField(10, "r", LongType(), required=True),
)
COLUMNS = ["i", "l", "d", "ts", "ns", "s", "dec", "b", "x", "r"]
TYPES = {name: SCHEMA.find_type(name) for name in COLUMNS}


def spec_of(*fields: tuple[str, Transform]) -> PartitionSpec:
    return PartitionSpec(
        1,
        tuple(
            PartitionField(SCHEMA.field(col).field_id, 1000 + k, f"p{k}", t)
            for k, (col, t) in enumerate(fields)
        ),
    )


def inclusive(spec: PartitionSpec, expr: BooleanExpression) -> str:
    return str(inclusive_projection(SCHEMA, spec)(expr))


def strict(spec: PartitionSpec, expr: BooleanExpression) -> str:
    return str(strict_projection(SCHEMA, spec)(expr))


# -- examples per transform --------------------------------------------------------------------


def test_identity_is_exact() -> None:
    spec = spec_of(("x", IdentityTransform()), ("s", IdentityTransform()))
    for expr in [LessThan("x", 1.5), IsNaN("x"), NotStartsWith("s", "a"), In("s", ["a", "b"])]:
        projected = inclusive_projection(SCHEMA, spec)(expr)
        assert str(projected) == str(bind(SCHEMA, expr)).replace("x ", "p0 ").replace("s ", "p1 ")
        assert strict_projection(SCHEMA, spec)(expr) == projected


def test_the_spec_example_day_of_timestamp() -> None:
    spec = spec_of(("ts", DayTransform()))
    # ts > 2017-11-16T22:31:08 selects ts_day >= 2017-11-16 (day 17486)
    assert inclusive(spec, GreaterThan("ts", "2017-11-16T22:31:08")) == "p0 gt-eq 17486"
    assert strict(spec, GreaterThan("ts", "2017-11-16T22:31:08")) == "p0 gt 17486"
    assert inclusive(spec, LessThan("ts", "2017-11-16T00:00:00")) == "p0 lt-eq 17485"
    assert strict(spec, LessThanOrEqual("ts", "2017-11-16T23:59:59.999999")) == "p0 lt 17487"
    assert inclusive(spec, NotEqualTo("ts", "2017-11-16T00:00:00")) == "true"
    assert strict(spec, EqualTo("ts", "2017-11-16T00:00:00")) == "false"
    assert inclusive(spec, IsNull("ts")) == "p0 is-null"
    assert strict(spec, NotNull("ts")) == "p0 not-null"


def test_time_projections_widen_for_pre_epoch_values() -> None:
    spec = spec_of(("ts", DayTransform()))
    # A file written by an old writer may hold day 0 for ts = -1 (truncated, not floored).
    assert inclusive(spec, LessThan("ts", 0)) == "p0 lt-eq 0"
    assert inclusive(spec, EqualTo("ts", -1)) == "p0 in (-1, 0)"
    assert inclusive(spec, In("ts", [-1, DAY_US])) == "p0 in (-1, 0, 1)"
    assert strict(spec, GreaterThan("ts", -DAY_US - 1)) == "p0 gt -1"
    assert strict(spec, NotEqualTo("ts", -1)) == "p0 not-in (-1, 0)"
    assert strict(spec, NotEqualTo("ts", 1)) == "p0 not-eq 0"
    month = spec_of(("d", MonthTransform()))
    assert inclusive(month, EqualTo("d", "1969-12-31")) == "p0 in (-1, 0)"
    assert inclusive(month, EqualTo("d", "1970-02-01")) == "p0 eq 1"


def test_bucket_projects_equality_only() -> None:
    spec = spec_of(("l", BucketTransform(16)))
    b = BucketTransform(16).apply(LongType(), 5)
    assert inclusive(spec, EqualTo("l", 5)) == f"p0 eq {b}"
    assert inclusive(spec, In("l", [5, 5])) == f"p0 eq {b}"
    assert inclusive(spec, LessThan("l", 5)) == "true"
    assert inclusive(spec, NotEqualTo("l", 5)) == "true"
    assert strict(spec, NotEqualTo("l", 5)) == f"p0 not-eq {b}"
    assert strict(spec, EqualTo("l", 5)) == "false"
    values = [v for v in range(20) if BucketTransform(16).apply(LongType(), v) != b][:2]
    projected = strict_projection(SCHEMA, spec)(NotIn("l", values))
    assert isinstance(projected, BoundSetPredicate)
    assert projected.literals == {BucketTransform(16).apply(LongType(), v) for v in values}


def test_truncate_numbers() -> None:
    spec = spec_of(("i", TruncateTransform(10)), ("dec", TruncateTransform(50)))
    assert inclusive(spec, LessThan("i", 15)) == "p0 lt-eq 10"
    assert inclusive(spec, LessThan("i", 10)) == "p0 lt-eq 0"
    assert inclusive(spec, GreaterThan("i", 19)) == "p0 gt-eq 20"
    assert inclusive(spec, EqualTo("i", -1)) == "p0 eq -10"
    assert strict(spec, LessThan("i", 15)) == "p0 lt 10"
    assert strict(spec, LessThanOrEqual("i", 19)) == "p0 lt 20"
    assert strict(spec, GreaterThanOrEqual("i", 10)) == "p0 gt 0"
    assert strict(spec, NotEqualTo("i", 15)) == "p0 not-eq 10"
    assert inclusive(spec, LessThan("dec", Decimal("10.65"))) == "p1 lt-eq Decimal('10.50')"


def test_truncate_strings() -> None:
    spec = spec_of(("s", TruncateTransform(3)))
    assert inclusive(spec, StartsWith("s", "ab")) == "p0 starts-with 'ab'"
    assert inclusive(spec, StartsWith("s", "abcd")) == "p0 eq 'abc'"
    assert inclusive(spec, NotStartsWith("s", "abc")) == "p0 not-starts-with 'abc'"
    assert inclusive(spec, NotStartsWith("s", "abcd")) == "true"
    assert inclusive(spec, LessThan("s", "abcd")) == "p0 lt-eq 'abc'"
    assert strict(spec, EqualTo("s", "ab")) == "p0 eq 'ab'"
    assert strict(spec, EqualTo("s", "abc")) == "false"
    assert strict(spec, In("s", ["a", "abc", "abcd"])) == "p0 eq 'a'"
    assert strict(spec, NotStartsWith("s", "abcd")) == "p0 not-eq 'abc'"
    assert strict(spec, StartsWith("s", "abcd")) == "false"
    assert strict(spec, GreaterThan("s", "abcd")) == "p0 gt 'abc'"


def test_void_and_unknown_transforms_are_ignored() -> None:
    spec = PartitionSpec(
        1,
        (
            PartitionField(1, 1000, "v", VoidTransform()),
            PartitionField(1, 1001, "u", UnknownTransform("zorder")),
        ),
    )
    assert inclusive(spec, EqualTo("i", 1)) == "true"
    assert strict(spec, EqualTo("i", 1)) == "false"
    assert inclusive(PartitionSpec.unpartitioned(), EqualTo("i", 1)) == "true"
    assert strict(PartitionSpec.unpartitioned(), IsNull("i")) == "false"


def test_several_fields_on_one_column() -> None:
    spec = spec_of(("ts", DayTransform()), ("ts", HourTransform()))
    assert inclusive(spec, GreaterThanOrEqual("ts", 25 * HOUR_US)) == "(p0 gt-eq 1 and p1 gt-eq 25)"
    assert strict(spec, GreaterThanOrEqual("ts", 25 * HOUR_US)) == "(p0 gt 1 or p1 gt 24)"


def test_logic_and_not() -> None:
    spec = spec_of(("i", IdentityTransform()), ("l", BucketTransform(4)))
    expr = Not(Or(LessThan("i", 3), EqualTo("l", 7)))
    # NOT (i < 3) keeps null rows: i >= 3 or i is null
    projected = inclusive_projection(SCHEMA, spec)(expr)
    assert str(projected) == "(p0 gt-eq 3 or p0 is-null)"  # l != 7 projects to true
    assert inclusive(spec, And(EqualTo("i", 1), EqualTo("s", "x"))) == "p0 eq 1"


def test_transform_terms_project_onto_matching_fields() -> None:
    term = TransformTerm(BucketTransform(8), "l")
    same = spec_of(("l", BucketTransform(8)))
    assert inclusive(same, EqualTo(term, 3)) == "p0 eq 3"
    assert strict(same, GreaterThan(term, 3)) == "p0 gt 3"
    identity = inclusive_projection(SCHEMA, spec_of(("l", IdentityTransform())))(EqualTo(term, 3))
    assert isinstance(identity, BoundLiteralPredicate)
    assert isinstance(identity.term, BoundTransform)
    assert identity.term.ref.name == "p0"
    other = spec_of(("l", BucketTransform(16)))
    assert inclusive(other, EqualTo(term, 3)) == "true"


def test_time_transform_terms_allow_for_the_pre_epoch_bug() -> None:
    spec = spec_of(("ts", DayTransform()))
    day = TransformTerm(DayTransform(), "ts")
    assert inclusive(spec, LessThan(day, 0)) == "p0 lt-eq 0"
    assert inclusive(spec, EqualTo(day, -3)) == "p0 in (-3, -2)"
    assert inclusive(spec, NotEqualTo(day, -1)) == "true"
    assert inclusive(spec, NotEqualTo(day, 3)) == "p0 not-eq 3"
    assert inclusive(spec, NotIn(day, [-1, 3, 4])) == "p0 not-in (3, 4)"
    assert strict(spec, GreaterThanOrEqual(day, 0)) == "p0 gt-eq 1"
    assert strict(spec, EqualTo(day, 0)) == "false"
    assert strict(spec, EqualTo(day, 5)) == "p0 eq 5"
    assert strict(spec, In(day, [-2, 5, 6])) == "p0 in (5, 6)"
    assert strict(spec, NotEqualTo(day, -2)) == "p0 not-in (-2, -1)"
    assert strict(spec, LessThan(day, -2)) == "p0 lt -2"


def test_partition_references_read_tuple_positions() -> None:
    refs = partition_references(SCHEMA, spec_of(("i", IdentityTransform()), ("d", YearTransform())))
    assert [(r.name, r.field_id, r.accessor.positions if r.accessor else None) for r in refs] == [
        ("p0", 1000, (0,)),
        ("p1", 1001, (1,)),
    ]


def test_residuals() -> None:
    spec = spec_of(("i", TruncateTransform(10)), ("s", IdentityTransform()))
    expr = And(LessThan("i", 15), Or(EqualTo("s", "a"), IsNull("l")))
    residuals = residual_evaluator(spec, expr, SCHEMA)
    assert str(residuals.residual_for((0, "a"))) == "true"
    assert str(residuals.residual_for((10, "a"))) == "i lt 15"
    assert str(residuals.residual_for((20, "a"))) == "false"
    assert str(residuals.residual_for((0, "b"))) == "l is-null"
    assert residuals((0, "b")) is residuals.residual_for((0, "b"))  # cached
    whole = residual_evaluator(PartitionSpec.unpartitioned(), expr, SCHEMA)
    assert whole.residual_for(()) == bind(SCHEMA, expr)


# -- the laws: never miss a partition, never claim too much ----------------------------------------

_TS = st.one_of(
    st.integers(-3 * DAY_US, 3 * DAY_US),
    st.integers(-400 * DAY_US, 400 * DAY_US),
    st.builds(lambda k, o: k * HOUR_US + o, st.integers(-60, 60), st.sampled_from([-1, 0, 1])),
)
_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "i": st.integers(-1000, 1000),
    "l": st.one_of(st.integers(-1000, 1000), st.integers(-(2**40), 2**40)),
    "d": st.integers(-800, 800),
    "ts": _TS,
    "ns": st.builds(lambda v, o: v * 1000 + o, _TS, st.sampled_from([0, 1, -1, 999])),
    "s": st.text(alphabet="abé", max_size=4),
    "dec": st.decimals(
        allow_nan=False, allow_infinity=False, places=2, min_value=-100, max_value=100
    ),
    "b": st.binary(max_size=3),
    "x": st.sampled_from([math.nan, -0.0, 0.0, 1.5, -1.5, math.inf, -math.inf]),
    "r": st.integers(-50, 50),
}


def _row() -> st.SearchStrategy[tuple[Any, ...]]:
    return st.tuples(
        *(_VALUES[c] if c == "r" else st.one_of(st.none(), _VALUES[c], _VALUES[c]) for c in COLUMNS)
    )


_TIME = [YearTransform(), MonthTransform(), DayTransform()]
_TRANSFORMS: dict[str, list[Transform]] = {
    "i": [IdentityTransform(), BucketTransform(3), TruncateTransform(10), TruncateTransform(1)],
    "l": [BucketTransform(5), TruncateTransform(7)],
    "d": [IdentityTransform(), BucketTransform(4), *_TIME],
    "ts": [IdentityTransform(), BucketTransform(4), *_TIME, HourTransform()],
    "ns": [BucketTransform(4), *_TIME, HourTransform()],
    "s": [IdentityTransform(), BucketTransform(3), TruncateTransform(1), TruncateTransform(2)],
    "dec": [IdentityTransform(), BucketTransform(3), TruncateTransform(50)],
    "b": [IdentityTransform(), BucketTransform(2), TruncateTransform(2)],
    "x": [IdentityTransform(), VoidTransform()],
    "r": [IdentityTransform(), BucketTransform(2)],
}
_FIELDS = st.sampled_from([(c, t) for c in COLUMNS for t in _TRANSFORMS[c]])
_SPECS = st.lists(_FIELDS, min_size=1, max_size=4).map(lambda fs: spec_of(*fs))

_ORDER_OPS = [Operation.LT, Operation.LT_EQ, Operation.GT, Operation.GT_EQ]
_CMP_OPS = [*_ORDER_OPS, Operation.EQ, Operation.NOT_EQ]


def _literal_for(column: str) -> st.SearchStrategy[Any]:
    return _VALUES[column].filter(lambda v: not (isinstance(v, float) and math.isnan(v)))


def _leaf_for(column: str) -> st.SearchStrategy[BooleanExpression]:
    options = [
        st.builds(
            lambda op: predicate(op, column),
            st.sampled_from([Operation.IS_NULL, Operation.NOT_NULL]),
        ),
        st.builds(
            lambda op, v: predicate(op, column, [v]),
            st.sampled_from(_CMP_OPS),
            _literal_for(column),
        ),
        st.builds(
            lambda op, vs: predicate(op, column, vs),
            st.sampled_from([Operation.IN, Operation.NOT_IN]),
            st.lists(_literal_for(column), max_size=3),
        ),
    ]
    if column == "s":
        options.append(
            st.builds(
                lambda op, v: predicate(op, column, [v]),
                st.sampled_from([Operation.STARTS_WITH, Operation.NOT_STARTS_WITH]),
                st.text(alphabet="abé", max_size=3),
            )
        )
    if column == "x":
        options.append(
            st.builds(
                lambda op: predicate(op, column),
                st.sampled_from([Operation.IS_NAN, Operation.NOT_NAN]),
            )
        )
    if column in ("l", "ts", "s"):
        transform = {"l": BucketTransform(5), "ts": DayTransform(), "s": TruncateTransform(2)}[
            column
        ]
        source = TYPES[column]
        options.append(
            st.builds(
                lambda op, v: predicate(
                    op, TransformTerm(transform, column), [transform.apply(source, v)]
                ),
                st.sampled_from(_CMP_OPS),
                _literal_for(column),
            )
        )
    return st.one_of(*options)


_LEAVES = st.one_of(*(_leaf_for(c) for c in COLUMNS))
_EXPRS = st.recursive(
    _LEAVES,
    lambda children: st.one_of(
        st.builds(And, children, children),
        st.builds(Or, children, children),
        st.builds(Not, children),
    ),
    max_leaves=5,
)


def partition_of(spec: PartitionSpec, row: tuple[Any, ...]) -> tuple[Any, ...]:
    out = []
    for f in spec.fields:
        name = SCHEMA.find_column_name(f.source_id)
        assert name is not None
        out.append(f.transform.apply(TYPES[name], row[COLUMNS.index(name)]))
    return tuple(out)


def buggy_partition_of(spec: PartitionSpec, row: tuple[Any, ...]) -> tuple[Any, ...]:
    """The partition an old writer produced: pre-epoch time values one unit too high."""
    return tuple(
        v + 1
        if isinstance(f.transform, (YearTransform, MonthTransform, DayTransform, HourTransform))
        and v is not None
        and v < 0
        else v
        for f, v in zip(spec.fields, partition_of(spec, row))
    )


@settings(max_examples=examples(400), deadline=None)
@given(_SPECS, _EXPRS, st.lists(_row(), min_size=1, max_size=6))
def test_projections_never_miss_and_never_overclaim(
    spec: PartitionSpec, expr: BooleanExpression, rows: list[tuple[Any, ...]]
) -> None:
    matches = Evaluator(SCHEMA, expr)
    may_match = compile_row_filter(inclusive_projection(SCHEMA, spec)(expr))
    must_match = compile_row_filter(strict_projection(SCHEMA, spec)(expr))
    residuals = residual_evaluator(spec, expr, SCHEMA)
    for row in rows:
        matched = matches.eval(row)
        for partition in (partition_of(spec, row), buggy_partition_of(spec, row)):
            if matched:
                assert may_match(partition), (row, partition)
            if must_match(partition):
                assert matched, (row, partition)
        residual = residuals.residual_for(partition_of(spec, row))
        assert Evaluator(SCHEMA, residual).eval(row) == matched, (row, residual)


@pytest.mark.parametrize("column", COLUMNS)
def test_every_column_has_a_projection_case(column: str) -> None:
    # The law above draws from these tables; keep them complete when columns are added.
    assert _TRANSFORMS[column]
    for transform in _TRANSFORMS[column]:
        assert transform.can_transform(TYPES[column])


def test_bound_filters_are_accepted_as_they_are() -> None:
    spec = spec_of(("i", IdentityTransform()))
    bound = bind(SCHEMA, EqualTo("i", 3))
    assert inclusive_projection(SCHEMA, spec)(bound) == inclusive_projection(SCHEMA, spec)(
        EqualTo("i", 3)
    )
    assert inclusive_projection(SCHEMA, spec)(AlwaysTrue()) == AlwaysTrue()
    assert strict_projection(SCHEMA, spec)(AlwaysFalse()) == AlwaysFalse()


def test_a_residual_that_decides_nothing_is_the_filter_itself() -> None:
    # i and s are partition sources, l is not: a filter on l alone is left whole for every
    # partition, as the very object (writers omit it by identity, and share its text).
    spec = spec_of(("i", TruncateTransform(10)), ("s", IdentityTransform()))
    chain: BooleanExpression = IsNull("l")
    for i in range(500):
        chain = And(chain, NotNull("l")) if i % 2 else And(NotNull("l"), chain)
    residuals = residual_evaluator(spec, chain, SCHEMA)
    assert residuals.residual_for((0, "a")) is residuals.expr
    assert residuals.residual_for((10, "b")) is residuals.expr
    # Deciding one conjunct keeps the undecided rest of the chain as it was.
    mixed = residual_evaluator(spec, And(chain, LessThan("i", 15)), SCHEMA)
    assert isinstance(mixed.expr, And)
    assert mixed.residual_for((0, "a")) is mixed.expr.left
    assert mixed.residual_for((20, "a")) == AlwaysFalse()
