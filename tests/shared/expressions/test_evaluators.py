"""Row, partition, manifest and metrics evaluators, and the never-miss-a-file laws."""

from __future__ import annotations

import math
import struct
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples
from icefloe.errors import InvalidFileError, ValidationError
from icefloe.expressions import (
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
    Operation,
    Or,
    StartsWith,
    TransformTerm,
    predicate,
)
from icefloe.expressions.evaluators import (
    Evaluator,
    ManifestEvaluator,
    MetricsEvaluator,
    PartitionEvaluator,
    StrictMetricsEvaluator,
)
from icefloe.manifests.manifest_list import ManifestFile, PartitionFieldSummary
from icefloe.spec.datafile import DataFile
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
    VoidTransform,
    YearTransform,
)
from icefloe.spec.types import (
    BinaryType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    ListType,
    LongType,
    NestedField,
    PrimitiveType,
    StringType,
    StructType,
    TimestampType,
)
from icefloe.spec.values import compare, to_bytes, truncate_lower_bound, truncate_upper_bound

DAY_US = 86_400_000_000

SCHEMA = Schema(
    NestedField(1, "i", IntegerType()),
    NestedField(2, "l", LongType(), required=True),
    NestedField(3, "d", DateType()),
    NestedField(4, "ts", TimestampType()),
    NestedField(5, "s", StringType()),
    NestedField(6, "dec", DecimalType(6, 2)),
    NestedField(7, "b", BinaryType()),
    NestedField(8, "x", DoubleType()),
    NestedField(9, "f", FloatType()),
    NestedField(10, "st", StructType(NestedField(11, "inner", LongType(), required=True))),
    NestedField(12, "tags", ListType(13, StringType())),
)
# Leaf columns with one value per row, in the order of their values in a flat test row.
LEAVES = ["i", "l", "d", "ts", "s", "dec", "b", "x", "f", "st.inner"]
TYPES: dict[str, PrimitiveType] = {}
for _name in LEAVES:
    _t = SCHEMA.find_type(_name)
    assert isinstance(_t, PrimitiveType)
    TYPES[_name] = _t


def nested_row(flat: tuple[Any, ...]) -> tuple[Any, ...]:
    """Test rows are flat; the schema nests st.inner in a struct that is null when it is."""
    *head, inner = flat
    return (*head, None if inner is None else (inner,), None)


def data_file(**kwargs: Any) -> DataFile:
    defaults: dict[str, Any] = {
        "file_path": "s3://b/t/data/f1.parquet",
        "file_format": "parquet",
        "partition": (),
        "record_count": 10,
        "file_size_in_bytes": 1000,
    }
    return DataFile(**{**defaults, **kwargs})


def summary(
    t: PrimitiveType, contains_null: bool, contains_nan: bool | None, lower: Any, upper: Any
) -> PartitionFieldSummary:
    return PartitionFieldSummary(
        contains_null,
        contains_nan,
        None if lower is None else to_bytes(t, lower),
        None if upper is None else to_bytes(t, upper),
    )


def manifest(*summaries: PartitionFieldSummary | None) -> ManifestFile:
    parts = None if summaries == (None,) else [s for s in summaries if s is not None]
    return ManifestFile("s3://b/t/metadata/m1.avro", 100, 1, partitions=parts)


# -- rows --------------------------------------------------------------------------------------


def row_of(**values: Any) -> tuple[Any, ...]:
    flat = tuple(values.get(name.replace(".", "_")) for name in LEAVES)
    if values.get("l") is None:
        flat = (flat[0], 0, *flat[2:])
    return nested_row(flat)


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        (EqualTo("i", 1), False),
        (NotEqualTo("i", 1), True),
        (LessThan("i", 1), False),
        (GreaterThanOrEqual("i", 1), False),
        (In("i", [1, 2]), False),
        (NotIn("i", [1, 2]), True),
        (StartsWith("s", "a"), False),
        (NotStartsWith("s", "a"), True),
        (IsNull("i"), True),
        (NotNaN("x"), True),
        (IsNull("st.inner"), True),
        (Not(LessThan("i", 1)), True),
    ],
    ids=str,
)
def test_null_safe_semantics(expr: BooleanExpression, expected: bool) -> None:
    assert Evaluator(SCHEMA, expr).eval(row_of()) is expected


@pytest.mark.parametrize(
    ("expr", "x", "expected"),
    [
        (IsNaN("x"), math.nan, True),
        (NotNaN("x"), math.nan, False),
        (LessThan("x", 1.0), math.nan, False),
        (GreaterThan("x", 1.0), math.nan, False),
        (EqualTo("x", 1.0), math.nan, False),
        (NotEqualTo("x", 1.0), math.nan, True),
        (LessThanOrEqual("x", math.inf), math.nan, False),
        (EqualTo("x", 0.0), -0.0, True),
        (LessThan("x", 0.0), -0.0, False),
        (In("x", [0.0, 2.0]), -0.0, True),
    ],
    ids=str,
)
def test_nan_and_signed_zero_semantics(expr: BooleanExpression, x: float, expected: bool) -> None:
    assert Evaluator(SCHEMA, expr).eval(row_of(x=x)) is expected


def test_rows_with_transforms_structs_and_lists() -> None:
    bucket = BucketTransform(4).apply(LongType(), 7)
    assert Evaluator(SCHEMA, EqualTo(TransformTerm("bucket[4]", "l"), bucket)).eval(row_of(l=7))
    assert Evaluator(SCHEMA, EqualTo("st.inner", 3)).eval(row_of(st_inner=3))
    assert Evaluator(SCHEMA, Not(EqualTo("st.inner", 3))).eval(row_of())
    with pytest.raises(ValidationError, match="inside a list or map"):
        Evaluator(SCHEMA, EqualTo("tags.element", "a"))
    struct = StructType(NestedField(1000, "p", IntegerType()))
    assert Evaluator(struct, GreaterThan("p", 3)).eval((4,))


def test_partition_evaluator() -> None:
    spec = PartitionSpec(1, (PartitionField(4, 1000, "ts_day", DayTransform()),))
    evaluator = PartitionEvaluator(SCHEMA, spec, GreaterThanOrEqual("ts", "2017-11-16T10:00:00"))
    assert evaluator.eval((17486,))
    assert not evaluator.eval((17485,))
    assert not evaluator.eval((None,))


# -- manifests ---------------------------------------------------------------------------------

SPEC = PartitionSpec(
    1,
    (
        PartitionField(1, 1000, "i", IdentityTransform()),
        PartitionField(8, 1001, "x", IdentityTransform()),
        PartitionField(5, 1002, "s", IdentityTransform()),
    ),
)


def manifest_eval(expr: BooleanExpression, *summaries: PartitionFieldSummary | None) -> bool:
    return ManifestEvaluator.for_row_filter(SCHEMA, SPEC, expr).eval(manifest(*summaries))


INTS = summary(IntegerType(), False, None, 10, 20)
FLOATS = summary(DoubleType(), False, False, -1.0, 1.0)
STRINGS = summary(StringType(), False, None, "abc", "abz")


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        (EqualTo("i", 15), True),
        (EqualTo("i", 9), False),
        (EqualTo("i", 21), False),
        (LessThan("i", 10), False),
        (LessThanOrEqual("i", 10), True),
        (GreaterThan("i", 20), False),
        (GreaterThanOrEqual("i", 20), True),
        (In("i", [1, 2, 30]), False),
        (In("i", [1, 12, 30]), True),
        (NotEqualTo("i", 15), True),
        (IsNull("i"), False),
        (NotNull("i"), True),
        (IsNaN("x"), False),
        (NotNaN("x"), True),
        (StartsWith("s", "ab"), True),
        (StartsWith("s", "abd"), True),
        (StartsWith("s", "ac"), False),
        (StartsWith("s", "aa"), False),
        (NotStartsWith("s", "ab"), False),
        (NotStartsWith("s", "abc"), True),
        (Or(EqualTo("i", 1), StartsWith("s", "ab")), True),
        (And(EqualTo("i", 15), EqualTo("x", 2.0)), False),
        (EqualTo("l", 5), True),  # not a partition column
    ],
    ids=str,
)
def test_manifest_bounds(expr: BooleanExpression, expected: bool) -> None:
    assert manifest_eval(expr, INTS, FLOATS, STRINGS) is expected


def test_manifest_nulls_and_nans() -> None:
    all_null = summary(IntegerType(), True, None, None, None)
    assert not manifest_eval(NotNull("i"), all_null, FLOATS, STRINGS)
    assert not manifest_eval(EqualTo("i", 1), all_null, FLOATS, STRINGS)
    assert manifest_eval(IsNull("i"), all_null, FLOATS, STRINGS)
    assert manifest_eval(NotEqualTo("i", 1), all_null, FLOATS, STRINGS)
    # A float field without bounds may hold NaNs unless contains_nan says otherwise.
    maybe_nan = summary(DoubleType(), True, None, None, None)
    assert manifest_eval(NotNull("x"), INTS, maybe_nan, STRINGS)
    assert manifest_eval(IsNaN("x"), INTS, maybe_nan, STRINGS)
    only_nan = summary(DoubleType(), False, True, None, None)
    assert not manifest_eval(NotNaN("x"), INTS, only_nan, STRINGS)
    assert not manifest_eval(LessThan("x", 0.0), INTS, only_nan, STRINGS)
    assert manifest_eval(IsNaN("x"), INTS, only_nan, STRINGS)
    with_nulls = summary(StringType(), True, None, "abc", "abz")
    assert manifest_eval(NotStartsWith("s", "ab"), INTS, FLOATS, with_nulls)


def test_manifest_edge_cases() -> None:
    assert manifest_eval(EqualTo("i", 1), None)  # no summaries at all
    assert manifest_eval(EqualTo("i", 1), INTS)  # not one summary per field: unusable
    legacy_nan = PartitionFieldSummary(False, None, struct.pack("<d", math.nan), None)
    assert manifest_eval(LessThan("x", -5.0), INTS, legacy_nan, STRINGS)
    zeros = summary(DoubleType(), False, False, -0.0, -0.0)
    assert manifest_eval(EqualTo("x", 0.0), INTS, zeros, STRINGS)
    broken = PartitionFieldSummary(False, None, b"\x01", b"\x02")
    with pytest.raises(InvalidFileError, match=r"m1\.avro.*partition field 'i'"):
        manifest_eval(EqualTo("i", 1), broken, FLOATS, STRINGS)


def test_manifest_evaluator_on_partition_names() -> None:
    evaluator = ManifestEvaluator(SPEC.partition_type(SCHEMA), EqualTo("i", 15))
    assert evaluator.eval(manifest(INTS, FLOATS, STRINGS))
    assert not ManifestEvaluator(SPEC.partition_type(SCHEMA), EqualTo("i", 5))(
        manifest(INTS, FLOATS, STRINGS)
    )


# -- file metrics ------------------------------------------------------------------------------


def metrics(**columns: tuple[int | None, int | None, int | None, Any, Any]) -> dict[str, Any]:
    """DataFile metric maps from (values, nulls, nans, lower, upper) per column name."""
    out: dict[str, dict[int, Any]] = {
        "value_counts": {},
        "null_value_counts": {},
        "nan_value_counts": {},
        "lower_bounds": {},
        "upper_bounds": {},
    }
    for name, (values, nulls, nans, lower, upper) in columns.items():
        field = SCHEMA.field(name.replace("_", "."))
        fid, t = field.field_id, field.field_type
        assert isinstance(t, PrimitiveType)
        for key, value in (
            ("value_counts", values),
            ("null_value_counts", nulls),
            ("nan_value_counts", nans),
        ):
            if value is not None:
                out[key][fid] = value
        if lower is not None:
            out["lower_bounds"][fid] = to_bytes(t, lower)
        if upper is not None:
            out["upper_bounds"][fid] = to_bytes(t, upper)
    return out


def might(expr: BooleanExpression, file: DataFile) -> bool:
    return MetricsEvaluator(SCHEMA, expr).eval(file)


def must(expr: BooleanExpression, file: DataFile) -> bool:
    return StrictMetricsEvaluator(SCHEMA, expr).eval(file)


FILE = data_file(
    **metrics(
        i=(10, 2, None, 10, 20),
        l=(10, None, None, 5, 5),
        x=(10, 0, 3, -1.0, 1.0),
        s=(10, 0, None, "abc", "abd"),  # "abd" may be a truncated upper bound
        st_inner=(10, 10, None, None, None),
    )
)


@pytest.mark.parametrize(
    ("expr", "might_match", "must_match"),
    [
        (EqualTo("i", 15), True, False),
        (EqualTo("i", 21), False, False),
        (LessThan("i", 10), False, False),
        (LessThan("i", 21), True, False),  # nulls do not match
        (NotEqualTo("i", 25), True, True),  # nulls match not-eq
        (NotIn("i", [1, 25]), True, True),
        (In("i", [1, 25]), False, False),
        (IsNull("i"), True, False),
        (NotNull("i"), True, False),
        (EqualTo("l", 5), True, True),  # required: no null counts needed
        (NotEqualTo("l", 5), False, False),
        (In("l", [5, 6]), True, True),
        (GreaterThanOrEqual("l", 5), True, True),
        (LessThan("x", 2.0), True, False),  # NaNs do not match
        (IsNaN("x"), True, False),
        (NotNaN("x"), True, False),
        (StartsWith("s", "ab"), True, True),
        (StartsWith("s", "abcdef"), True, False),
        (StartsWith("s", "abe"), False, False),
        (NotStartsWith("s", "ab"), False, False),
        (NotStartsWith("s", "b"), True, True),
        (EqualTo("st.inner", 1), False, False),
        (IsNull("st.inner"), True, True),
        (NotNull("st.inner"), False, False),
        (EqualTo("d", 1), True, False),  # no metrics at all
        (EqualTo("tags.element", "a"), True, False),  # element counts describe no row
        (EqualTo(TransformTerm("bucket[2]", "l"), 1), True, False),
        (Or(EqualTo("i", 21), EqualTo("l", 5)), True, True),
        (And(EqualTo("i", 15), EqualTo("l", 6)), False, False),
        (Not(LessThan("i", 10)), True, False),
    ],
    ids=str,
)
def test_metrics(expr: BooleanExpression, might_match: bool, must_match: bool) -> None:
    assert might(expr, FILE) is might_match
    assert must(expr, FILE) is must_match


def test_metrics_record_counts() -> None:
    empty = data_file(record_count=0)
    assert not might(IsNull("i"), empty)
    assert MetricsEvaluator(SCHEMA, IsNull("i"), include_empty_files=True).eval(empty)
    assert must(EqualTo("i", 1), empty)
    assert might(EqualTo("i", 100), data_file(record_count=-1, **metrics(i=(1, 0, None, 1, 1))))


def test_metrics_floats() -> None:
    no_nan_counts = data_file(**metrics(x=(10, 0, None, 1.0, 2.0)))
    assert not must(LessThan("x", 5.0), no_nan_counts)  # NaNs are not ruled out
    clean = data_file(**metrics(x=(10, 0, 0, 1.0, 2.0)))
    assert must(LessThan("x", 5.0), clean)
    assert must(NotNaN("x"), clean)
    only_nan = data_file(**metrics(x=(10, 0, 10, None, None)))
    assert not might(EqualTo("x", 1.0), only_nan)
    assert not might(NotNaN("x"), only_nan)
    assert must(IsNaN("x"), only_nan)
    legacy_nan = data_file(
        lower_bounds={8: struct.pack("<d", math.nan)}, upper_bounds={8: struct.pack("<d", 1.0)}
    )
    assert might(LessThan("x", -5.0), legacy_nan)
    zeros = data_file(**metrics(x=(10, 0, 0, -0.0, -0.0)))
    assert might(EqualTo("x", 0.0), zeros)
    # Strict: equal under IEEE, but not under Java's Double.compare (-0.0 != +0.0), so not
    # "every row matches" (see test_signed_zero); the same-sign literal still is.
    assert not must(EqualTo("x", 0.0), zeros)
    assert must(EqualTo("x", -0.0), zeros)
    single = data_file(**metrics(f=(10, 0, 0, 0.1, 0.1)))
    assert might(EqualTo("f", 0.1), single)  # literal rounded to the float32 the bound holds


def test_metrics_promoted_bounds() -> None:
    # A bound written while l was an int is 4 bytes; from_bytes widens it.
    file = data_file(lower_bounds={2: struct.pack("<i", 3)}, upper_bounds={2: struct.pack("<i", 4)})
    assert not might(EqualTo("l", 5), file)
    assert might(EqualTo("l", 4), file)


def test_metrics_bad_bounds_name_file_and_column() -> None:
    file = data_file(lower_bounds={6: b""}, upper_bounds={6: b""})
    with pytest.raises(InvalidFileError, match=r"f1\.parquet.*column 'dec' \(id 6\)"):
        might(EqualTo("dec", Decimal("1.00")), file)


# -- the laws: metrics and manifests never rule out a file holding a match ------------------------

_TS = st.one_of(
    st.integers(-3 * DAY_US, 3 * DAY_US),
    st.builds(lambda k, o: k * DAY_US + o, st.integers(-40, 40), st.sampled_from([-1, 0, 1])),
)
_F32 = st.floats(width=32, allow_nan=False, min_value=-4.0, max_value=4.0)
_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "i": st.integers(-20, 20),
    "l": st.integers(-20, 20),
    "d": st.integers(-400, 400),
    "ts": _TS,
    "s": st.text(alphabet="ab\U0010ffffé", max_size=5),
    "dec": st.decimals(
        allow_nan=False, allow_infinity=False, places=2, min_value=-10, max_value=10
    ),
    "b": st.binary(max_size=4),
    "x": st.one_of(
        st.sampled_from([math.nan, -0.0, 0.0, 1.5, -1.5, math.inf, -math.inf]),
        st.floats(allow_nan=False, min_value=-4, max_value=4),
    ),
    "f": st.one_of(st.sampled_from([math.nan, -0.0, 0.0, 0.1, math.inf]), _F32),
    "st.inner": st.integers(-5, 5),
}
_FLAT_ROWS = st.tuples(
    *(_VALUES[c] if c == "l" else st.one_of(st.none(), _VALUES[c]) for c in LEAVES)
)
_CMP = [
    Operation.LT,
    Operation.LT_EQ,
    Operation.GT,
    Operation.GT_EQ,
    Operation.EQ,
    Operation.NOT_EQ,
]


def _literal(column: str) -> st.SearchStrategy[Any]:
    return _VALUES[column].filter(lambda v: not (isinstance(v, float) and math.isnan(v)))


def _leaf(column: str) -> st.SearchStrategy[BooleanExpression]:
    options = [
        st.builds(
            lambda op: predicate(op, column),
            st.sampled_from([Operation.IS_NULL, Operation.NOT_NULL]),
        ),
        st.builds(
            lambda op, v: predicate(op, column, [v]), st.sampled_from(_CMP), _literal(column)
        ),
        st.builds(
            lambda op, vs: predicate(op, column, vs),
            st.sampled_from([Operation.IN, Operation.NOT_IN]),
            st.lists(_literal(column), max_size=3),
        ),
    ]
    if column == "s":
        options.append(
            st.builds(
                lambda op, v: predicate(op, column, [v]),
                st.sampled_from([Operation.STARTS_WITH, Operation.NOT_STARTS_WITH]),
                st.text(alphabet="ab\U0010ffff", max_size=4),
            )
        )
    if column in ("l", "ts"):
        transform: Transform = BucketTransform(3) if column == "l" else DayTransform()
        options.append(
            st.builds(
                lambda op, v: predicate(
                    op, TransformTerm(transform, column), [transform.apply(TYPES[column], v)]
                ),
                st.sampled_from(_CMP),
                _literal(column),
            )
        )
    if column in ("x", "f"):
        options.append(
            st.builds(
                lambda op: predicate(op, column),
                st.sampled_from([Operation.IS_NAN, Operation.NOT_NAN]),
            )
        )
    return st.one_of(*options)


_EXPRS = st.recursive(
    st.one_of(*(_leaf(c) for c in LEAVES)),
    lambda children: st.one_of(
        st.builds(And, children, children),
        st.builds(Or, children, children),
        st.builds(Not, children),
    ),
    max_leaves=4,
)


def _is_nan(v: Any) -> bool:
    return isinstance(v, float) and math.isnan(v)


def _bounds(t: PrimitiveType, values: list[Any]) -> tuple[Any, Any]:
    ordered = [v for v in values if v is not None and not _is_nan(v)]
    if not ordered:
        return None, None
    lower = upper = ordered[0]
    for v in ordered[1:]:
        if compare(t, v, lower) < 0:
            lower = v
        if compare(t, v, upper) > 0:
            upper = v
    return lower, upper


def file_of(flat_rows: list[tuple[Any, ...]], with_stats: list[bool], width: int) -> DataFile:
    """A data file holding ``flat_rows`` with metrics as a writer computes them."""
    stats: dict[str, dict[int, Any]] = {
        k: {}
        for k in (
            "value_counts",
            "null_value_counts",
            "nan_value_counts",
            "lower_bounds",
            "upper_bounds",
        )
    }
    for pos, name in enumerate(LEAVES):
        if not with_stats[pos]:
            continue
        fid, t = SCHEMA.field(name).field_id, TYPES[name]
        values = [row[pos] for row in flat_rows]
        stats["value_counts"][fid] = len(values)
        stats["null_value_counts"][fid] = sum(v is None for v in values)
        if isinstance(t, FloatType | DoubleType):
            stats["nan_value_counts"][fid] = sum(_is_nan(v) for v in values)
        lower, upper = _bounds(t, values)
        if lower is not None:
            stats["lower_bounds"][fid] = to_bytes(t, truncate_lower_bound(t, lower, width))
            truncated = truncate_upper_bound(t, upper, width)
            if truncated is not None:
                stats["upper_bounds"][fid] = to_bytes(t, truncated)
    return data_file(record_count=len(flat_rows), **stats)


@settings(max_examples=examples(300), deadline=None)
@given(
    _EXPRS,
    st.lists(_FLAT_ROWS, max_size=6),
    st.lists(st.booleans(), min_size=len(LEAVES), max_size=len(LEAVES)),
    st.sampled_from([1, 2, 3, 16]),
)
def test_metrics_never_miss_a_file_and_strict_never_overclaims(
    expr: BooleanExpression,
    flat_rows: list[tuple[Any, ...]],
    with_stats: list[bool],
    width: int,
) -> None:
    file = file_of(flat_rows, with_stats, width)
    matches = Evaluator(SCHEMA, expr)
    results = [matches.eval(nested_row(row)) for row in flat_rows]
    if any(results):
        assert might(expr, file)
    if must(expr, file):
        assert all(results)


_PARTITIONED = ["i", "l", "d", "ts", "s", "dec", "b", "x", "f"]
_TIME = [YearTransform(), MonthTransform(), DayTransform()]
_TRANSFORMS: dict[str, list[Transform]] = {
    "i": [IdentityTransform(), BucketTransform(3), TruncateTransform(4)],
    "l": [BucketTransform(2), TruncateTransform(3)],
    "d": [IdentityTransform(), *_TIME],
    "ts": [BucketTransform(4), *_TIME, HourTransform()],
    "s": [IdentityTransform(), TruncateTransform(1), TruncateTransform(2)],
    "dec": [IdentityTransform(), TruncateTransform(50)],
    "b": [IdentityTransform(), TruncateTransform(1)],
    "x": [IdentityTransform(), VoidTransform()],
    "f": [IdentityTransform()],
}
_SPECS = st.lists(
    st.sampled_from([(c, t) for c in _PARTITIONED for t in _TRANSFORMS[c]]),
    min_size=1,
    max_size=3,
).map(
    lambda fields: PartitionSpec(
        1,
        tuple(
            PartitionField(SCHEMA.field(c).field_id, 1000 + k, f"p{k}", t)
            for k, (c, t) in enumerate(fields)
        ),
    )
)


def partition_of(spec: PartitionSpec, flat: tuple[Any, ...]) -> tuple[Any, ...]:
    out = []
    for f in spec.fields:
        name = SCHEMA.find_column_name(f.source_id)
        assert name is not None
        out.append(f.transform.apply(TYPES[name], flat[LEAVES.index(name)]))
    return tuple(out)


def manifest_of(spec: PartitionSpec, partitions: list[tuple[Any, ...]]) -> ManifestFile:
    summaries = []
    for pos, field in enumerate(spec.partition_type(SCHEMA).fields):
        t = field.field_type
        assert isinstance(t, PrimitiveType)
        values = [p[pos] for p in partitions]
        lower, upper = _bounds(t, values)
        floating = isinstance(t, FloatType | DoubleType)
        summaries.append(
            summary(
                t,
                any(v is None for v in values),
                any(_is_nan(v) for v in values) if floating else None,
                lower,
                upper,
            )
        )
    return ManifestFile("s3://b/t/metadata/m.avro", 1, spec.spec_id, partitions=summaries)


@settings(max_examples=examples(300), deadline=None)
@given(_SPECS, _EXPRS, st.lists(_FLAT_ROWS, min_size=1, max_size=6))
def test_manifests_and_partitions_never_miss_a_match(
    spec: PartitionSpec, expr: BooleanExpression, flat_rows: list[tuple[Any, ...]]
) -> None:
    matches = Evaluator(SCHEMA, expr)
    partitions = [partition_of(spec, row) for row in flat_rows]
    partition_evaluator = PartitionEvaluator(SCHEMA, spec, expr)
    any_match = False
    for row, partition in zip(flat_rows, partitions):
        if matches.eval(nested_row(row)):
            any_match = True
            assert partition_evaluator.eval(partition)
    if any_match:
        evaluator = ManifestEvaluator.for_row_filter(SCHEMA, spec, expr)
        assert evaluator.eval(manifest_of(spec, partitions))
