"""Evaluators: decide a bound filter on rows, partitions, manifests and file metrics.

The planner runs these over millions of manifest entries, so every evaluator is built once
per filter and compiles it into nested closures, one per predicate, with the field id,
literal and operation baked in. Evaluating a file then costs a few dict lookups and
comparisons; bounds are decoded lazily, once per file and column, and only for the
columns the filter reads.

All comparisons use Python's native order on the internal representation, which is the
spec's order: ``str`` compares by code point (the same as UTF-8 bytes), ``bytes`` and
``uuid.UUID`` as unsigned big-endian, ``Decimal`` by value whatever the scale, and floats
per IEEE 754 (so ``-0.0 == 0.0`` and NaN compares false both ways, as the expressions
spec requires of predicates).

Metrics pruning keeps every file that may match under either IEEE 754 or Java's
``Double.compare`` (where -0.0 < +0.0), so it agrees with Java's and PyIceberg's client-side
planning: ``<`` and ``>`` against a zero, ``!=`` and ``NOT IN`` treat the zeros as distinct.
The strict evaluator, conversely, says "every row matches" only when that holds under both
orders, so dropping a residual or deleting a whole file is right for either kind of reader.

The metrics evaluators only rely on bounds being *valid* bounds (lower <= every non-null,
non-NaN value <= upper). Truncated string and binary bounds are valid bounds (a prefix for
the lower one, an incremented prefix for the upper one), so they need no special case: a
truncated lower bound shorter than a ``starts-with`` prefix simply cannot prove anything.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from icefloe.errors import InvalidFileError, ValidationError
from icefloe.expressions import (
    BooleanExpression,
    BoundLiteralPredicate,
    BoundPredicate,
    BoundReference,
    BoundSetPredicate,
    BoundTransform,
    Operation,
    bound_predicates,
    is_bound,
    rewrite_not,
)
from icefloe.expressions.binding import bind, prepare_filter
from icefloe.expressions.projection import inclusive_projection
from icefloe.expressions.row_filter import (
    Evaluator,
    RowFilter,
    Test,
    always_false,
    always_true,
    compile_filter,
    compile_row_filter,
)
from icefloe.spec.datafile import DataFile
from icefloe.spec.partition import PartitionSpec
from icefloe.spec.schema import Schema
from icefloe.spec.types import DoubleType, FloatType, IcebergType, PrimitiveType, StructType
from icefloe.spec.values import from_bytes


def _sorted_values(values: Iterable[Any]) -> list[Any]:
    return sorted(values)


def _any_within(sorted_values: list[Any], low: Any, high: Any) -> bool:
    """Whether some value lies in [low, high]; None leaves that side open."""
    i = 0 if low is None else bisect.bisect_left(sorted_values, low)
    return i < len(sorted_values) and (high is None or sorted_values[i] <= high)


class PartitionEvaluator:
    """Whether a partition (a tuple of the spec's partition values) may hold rows matching a
    row filter: the row filter's inclusive projection, decided on the tuple."""

    def __init__(
        self,
        schema: Schema,
        spec: PartitionSpec,
        row_filter: BooleanExpression,
        case_sensitive: bool = True,
    ) -> None:
        self.partition_filter = inclusive_projection(schema, spec, case_sensitive)(row_filter)
        self._test = compile_row_filter(self.partition_filter)

    def eval(self, partition: Sequence[Any]) -> bool:
        return self._test(partition)

    __call__ = eval


# ---------------------------------------------------------------------------------------------
# Manifests (partition field summaries)
# ---------------------------------------------------------------------------------------------


class FieldSummary(Protocol):
    """What the manifest evaluator reads of ``manifest_list.PartitionFieldSummary``."""

    @property
    def contains_null(self) -> bool: ...

    @property
    def contains_nan(self) -> bool | None: ...

    @property
    def lower_bound(self) -> bytes | None: ...

    @property
    def upper_bound(self) -> bytes | None: ...


class ManifestLike(Protocol):
    @property
    def manifest_path(self) -> str: ...

    @property
    def partitions(self) -> Sequence[FieldSummary] | None: ...


class _Unusable:
    """Marks a bound that cannot be used (a NaN bound from an old writer)."""

    def __repr__(self) -> str:
        return "<unusable bound>"


_UNUSABLE: Any = _Unusable()

# (summary, lower, upper) per partition position; lower/upper None when absent.
_Decoded = dict[int, tuple[Any, Any, Any]]


def _is_nan(v: Any) -> bool:
    return isinstance(v, float) and math.isnan(v)


def _manifest_leaf(pred: BoundPredicate) -> Test[_Decoded]:
    if isinstance(pred.term, BoundTransform) or pred.ref.accessor is None:
        return always_true
    pos = pred.ref.accessor.positions[0]
    floating = isinstance(pred.ref.field_type, FloatType | DoubleType)
    op = pred.op

    def all_null(s: Any, lower: Any) -> bool:
        # Bounds cover non-null, non-NaN values: no lower bound and a null means only nulls,
        # unless NaNs are possible and not ruled out.
        if not s.contains_null or lower is not None:
            return False
        return not floating or s.contains_nan is False

    if op is Operation.IS_NULL:
        return lambda d: bool(d[pos][0].contains_null)
    if op is Operation.NOT_NULL:
        return lambda d: not all_null(d[pos][0], d[pos][1])
    if op is Operation.IS_NAN:

        def is_nan(d: _Decoded) -> bool:
            s, lower, _ = d[pos]
            return s.contains_nan is not False and not all_null(s, lower)

        return is_nan
    if op is Operation.NOT_NAN:

        def not_nan(d: _Decoded) -> bool:
            s, lower, _ = d[pos]
            return not (s.contains_nan is True and not s.contains_null and lower is None)

        return not_nan
    if op is Operation.NOT_EQ or op is Operation.NOT_IN:
        return always_true
    if isinstance(pred, BoundSetPredicate):
        values = _sorted_values(pred.literals)

        def in_(d: _Decoded) -> bool:
            _, lower, upper = d[pos]
            if lower is None and upper is None:
                return False  # only nulls and NaNs, which are in no set
            if lower is _UNUSABLE:
                return True
            return _any_within(values, lower, upper)

        return in_
    assert isinstance(pred, BoundLiteralPredicate)
    test = _bounds_test(op, pred.literal, absent_means_empty=True)
    return lambda d: test(*d[pos])


BoundsTest = Callable[[Any, Any, Any], bool]


def _is_zero(v: Any) -> bool:
    return isinstance(v, float) and v == 0.0


def _total_less(a: Any, b: Any) -> bool:
    """``a < b`` in Java's ``Double.compare`` order where it differs from IEEE: -0.0 < +0.0."""
    return _is_zero(a) and _is_zero(b) and math.copysign(1.0, a) < 0.0 < math.copysign(1.0, b)


def _total_equal(a: Any, b: Any) -> bool:
    """Equality as Java's ``Double.compare`` == 0: -0.0 and +0.0 differ."""
    if _is_zero(a) and _is_zero(b):
        return math.copysign(1.0, a) == math.copysign(1.0, b)
    return bool(a == b)


def _bounds_test(op: Operation, lit: Any, absent_means_empty: bool) -> BoundsTest:
    """Might some value within the bounds satisfy ``op lit``? Shared by manifests and files.

    The test takes (summary, lower, upper); ``summary`` is the manifest's field summary or
    None for file metrics. For manifests an absent bound means the field holds only nulls
    and NaNs (so nothing can match); for file metrics it means no bound was recorded (so
    anything might).
    """
    absent = not absent_means_empty
    zero = _is_zero(lit)

    if op is Operation.LT:
        if zero:  # Double.compare: -0.0 < +0.0, so a -0.0 lower bound may match "< 0.0"
            return lambda s, lower, upper: (
                absent
                if lower is None
                else lower is _UNUSABLE or lower < lit or _total_less(lower, lit)
            )
        return lambda s, lower, upper: (
            absent if lower is None else lower is _UNUSABLE or lower < lit
        )
    if op is Operation.LT_EQ:
        return lambda s, lower, upper: (
            absent if lower is None else lower is _UNUSABLE or lower <= lit
        )
    if op is Operation.GT:
        if zero:
            return lambda s, lower, upper: (
                absent
                if upper is None
                else upper is _UNUSABLE or upper > lit or _total_less(lit, upper)
            )
        return lambda s, lower, upper: (
            absent if upper is None else upper is _UNUSABLE or upper > lit
        )
    if op is Operation.GT_EQ:
        return lambda s, lower, upper: (
            absent if upper is None else upper is _UNUSABLE or upper >= lit
        )
    if op is Operation.EQ:

        def eq(s: Any, lower: Any, upper: Any) -> bool:
            if lower is _UNUSABLE or upper is _UNUSABLE:
                return True
            if lower is None and upper is None:
                return absent
            return (lower is None or lower <= lit) and (upper is None or lit <= upper)

        return eq
    if op is Operation.STARTS_WITH:
        n = len(lit)

        def starts_with(s: Any, lower: Any, upper: Any) -> bool:
            if lower is None and upper is None:
                return absent
            return (lower is None or lower[:n] <= lit) and (upper is None or lit <= upper[:n])

        return starts_with
    if op is Operation.NOT_STARTS_WITH:

        def not_starts_with(s: Any, lower: Any, upper: Any) -> bool:
            if s is not None and s.contains_null:
                return True  # a null does not start with anything
            if lower is None or upper is None:
                return True
            # Values between two strings with the prefix all have it.
            return not (lower.startswith(lit) and upper.startswith(lit))

        return not_starts_with
    raise ValidationError(f"unsupported operation {op}")  # pragma: no cover


class ManifestEvaluator:
    """May a manifest hold files matching a partition filter? Decided on the manifest
    list's partition field summaries (contains_null, contains_nan, lower and upper bound).

    ``partition_filter`` is bound to (or given by partition field names of)
    ``partition_type``; use :meth:`for_row_filter` to start from a row filter.
    """

    def __init__(
        self,
        partition_type: StructType,
        partition_filter: BooleanExpression,
        case_sensitive: bool = True,
    ) -> None:
        if not is_bound(partition_filter):
            partition_filter = bind(
                Schema.from_struct(partition_type), partition_filter, case_sensitive
            )
        self.partition_type = partition_type
        self.partition_filter = rewrite_not(partition_filter)
        self._fields = partition_type.fields
        positions: dict[int, PrimitiveType] = {}
        for pred in bound_predicates(self.partition_filter):
            ref = pred.ref
            if ref.accessor is not None and isinstance(ref.field_type, PrimitiveType):
                positions[ref.accessor.positions[0]] = ref.field_type
        self._positions = sorted(positions.items())
        self._test = compile_filter(self.partition_filter, _manifest_leaf)

    @classmethod
    def for_row_filter(
        cls,
        schema: Schema,
        spec: PartitionSpec,
        row_filter: BooleanExpression,
        case_sensitive: bool = True,
    ) -> ManifestEvaluator:
        projected = inclusive_projection(schema, spec, case_sensitive)(row_filter)
        return cls(spec.partition_type(schema), projected)

    def eval(self, manifest: ManifestLike) -> bool:
        summaries = manifest.partitions
        if summaries is None or len(summaries) != len(self._fields):
            # No summaries, or not one per partition field (so positions cannot be trusted):
            # nothing can be ruled out.
            return True
        decoded: _Decoded = {}
        for pos, t in self._positions:
            s = summaries[pos]
            lower = self._decode(t, s.lower_bound, manifest, pos, "lower")
            upper = self._decode(t, s.upper_bound, manifest, pos, "upper")
            if _is_nan(lower) or _is_nan(upper):
                lower = upper = _UNUSABLE
            decoded[pos] = (s, lower, upper)
        return self._test(decoded)

    __call__ = eval

    def _decode(
        self, t: PrimitiveType, raw: bytes | None, manifest: ManifestLike, pos: int, which: str
    ) -> Any:
        if raw is None:
            return None
        try:
            return from_bytes(t, raw)
        except ValidationError as e:
            name = self._fields[pos].name if pos < len(self._fields) else f"#{pos}"
            raise InvalidFileError(
                manifest.manifest_path,
                f"the {which} bound of partition field {name!r} is not a {t} value: {e}",
            ) from None


# ---------------------------------------------------------------------------------------------
# Data and delete file metrics
# ---------------------------------------------------------------------------------------------

_NO_COUNTS: dict[int, int] = {}
_NO_BOUNDS: dict[int, bytes] = {}


class _FileStats:
    """One file's metrics, with bounds decoded on first use (once per column)."""

    __slots__ = (
        "_lower_cache",
        "_upper_cache",
        "file",
        "lowers",
        "nan_counts",
        "null_counts",
        "uppers",
        "value_counts",
    )

    def __init__(self, file: DataFile) -> None:
        self.file = file
        self.value_counts = file.value_counts or _NO_COUNTS
        self.null_counts = file.null_value_counts or _NO_COUNTS
        self.nan_counts = file.nan_value_counts or _NO_COUNTS
        self.lowers = file.lower_bounds or _NO_BOUNDS
        self.uppers = file.upper_bounds or _NO_BOUNDS
        self._lower_cache: dict[int, Any] = {}
        self._upper_cache: dict[int, Any] = {}

    def lower(self, ref: BoundReference) -> Any:
        """The decoded lower bound of a column; None when missing (or NaN)."""
        cache = self._lower_cache
        fid = ref.field_id
        if fid in cache:
            return cache[fid]
        value = cache[fid] = self._decode(ref, self.lowers, "lower")
        return value

    def upper(self, ref: BoundReference) -> Any:
        cache = self._upper_cache
        fid = ref.field_id
        if fid in cache:
            return cache[fid]
        value = cache[fid] = self._decode(ref, self.uppers, "upper")
        return value

    def bounds(self, ref: BoundReference) -> tuple[None, Any, Any]:
        """(None, lower, upper): the argument shape of a :data:`BoundsTest`."""
        return None, self.lower(ref), self.upper(ref)

    def _decode(self, ref: BoundReference, bounds: dict[int, bytes], which: str) -> Any:
        raw = bounds.get(ref.field_id)
        if raw is None:
            return None
        t = ref.field_type
        assert isinstance(t, PrimitiveType)
        try:
            value = from_bytes(t, raw)
        except ValidationError as e:
            raise InvalidFileError(
                self.file.file_path,
                f"the {which} bound of column {ref.name!r} (id {ref.field_id}) is not a "
                f"{t} value: {e}",
            ) from None
        return None if value != value else value  # a NaN bound (old writers) bounds nothing

    def all_null(self, fid: int) -> bool:
        values = self.value_counts.get(fid)
        nulls = self.null_counts.get(fid)
        return values is not None and nulls is not None and nulls >= values

    def all_nan(self, fid: int) -> bool:
        values = self.value_counts.get(fid)
        nans = self.nan_counts.get(fid)
        return values is not None and nans is not None and nans >= values

    def all_null_or_nan(self, fid: int) -> bool:
        values = self.value_counts.get(fid)
        nulls = self.null_counts.get(fid)
        if values is None or nulls is None:
            return False
        return nulls + self.nan_counts.get(fid, 0) >= values

    def no_nulls(self, ref: BoundReference) -> bool:
        return not ref.nullable or self.null_counts.get(ref.field_id) == 0

    def no_nans(self, ref: BoundReference) -> bool:
        return not _floating(ref.field_type) or self.nan_counts.get(ref.field_id) == 0


def _floating(t: IcebergType) -> bool:
    return isinstance(t, FloatType | DoubleType)


def _usable_ref(pred: BoundPredicate) -> BoundReference | None:
    """The column whose metrics decide ``pred``, or None when metrics cannot (a transform
    term, or a column inside a list or map whose counts describe elements, not rows)."""
    if isinstance(pred.term, BoundTransform):
        return None
    ref = pred.ref
    if ref.accessor is None or not isinstance(ref.field_type, PrimitiveType):
        return None
    return ref


def _metrics_leaf(pred: BoundPredicate) -> Test[_FileStats]:
    ref = _usable_ref(pred)
    if ref is None:
        return always_true
    fid = ref.field_id
    op = pred.op
    if op is Operation.IS_NULL:
        return lambda st: st.null_counts.get(fid) != 0
    if op is Operation.NOT_NULL:
        return lambda st: not st.all_null(fid)
    if op is Operation.IS_NAN:
        return lambda st: st.nan_counts.get(fid) != 0 and not st.all_null(fid)
    if op is Operation.NOT_NAN:
        return lambda st: not st.all_nan(fid)
    if op is Operation.NOT_EQ or op is Operation.NOT_IN:
        # Only a file holding nothing but the excluded value(s) cannot match. Equality here
        # is Java's Double.compare (-0.0 differs from 0.0), as in Java and PyIceberg: a file
        # of -0.0s is kept for "!= 0.0", so server- and client-side planning agree.
        if isinstance(pred, BoundSetPredicate):
            excluded = pred.literals
            zeros = {math.copysign(1.0, v) for v in excluded if _is_zero(v)}

            def single_value(lower: Any) -> bool:
                if _is_zero(lower):
                    return math.copysign(1.0, lower) in zeros
                return lower in excluded
        else:
            literal = pred.literal if isinstance(pred, BoundLiteralPredicate) else None

            def single_value(lower: Any) -> bool:
                return _total_equal(lower, literal)

        def not_eq(st: _FileStats) -> bool:
            if not (st.no_nulls(ref) and st.no_nans(ref)):
                return True
            _, lower, upper = st.bounds(ref)
            return lower is None or not _total_equal(lower, upper) or not single_value(lower)

        return not_eq
    if isinstance(pred, BoundSetPredicate):
        values = _sorted_values(pred.literals)

        def in_(st: _FileStats) -> bool:
            if st.all_null_or_nan(fid):
                return False
            _, lower, upper = st.bounds(ref)
            return _any_within(values, lower, upper)

        return in_
    assert isinstance(pred, BoundLiteralPredicate)
    check = _bounds_test(op, pred.literal, absent_means_empty=False)
    # Order comparisons read one bound only: decode just that one.
    if op is Operation.LT or op is Operation.LT_EQ:
        return lambda st: not st.all_null_or_nan(fid) and check(None, st.lower(ref), None)
    if op is Operation.GT or op is Operation.GT_EQ:
        return lambda st: not st.all_null_or_nan(fid) and check(None, None, st.upper(ref))
    if op is Operation.NOT_STARTS_WITH:
        return lambda st: not st.no_nulls(ref) or check(*st.bounds(ref))
    if op is Operation.STARTS_WITH:
        return lambda st: not st.all_null(fid) and check(*st.bounds(ref))
    return lambda st: not st.all_null_or_nan(fid) and check(*st.bounds(ref))


class MetricsEvaluator:
    """May a data or delete file hold rows matching a row filter? Decided on its column
    metrics (value, null and NaN counts, lower and upper bounds); missing metrics never
    rule a file out. ``include_empty_files`` keeps files that record zero rows."""

    def __init__(
        self,
        schema: Schema,
        row_filter: BooleanExpression,
        case_sensitive: bool = True,
        include_empty_files: bool = False,
    ) -> None:
        self.expr = prepare_filter(schema, row_filter, case_sensitive)
        self.include_empty_files = include_empty_files
        self._test = compile_filter(self.expr, _metrics_leaf)

    def eval(self, file: DataFile) -> bool:
        if file.record_count == 0 and not self.include_empty_files:
            return False
        if file.record_count < 0:
            return True  # an unknown row count (old v1 writers): metrics are unreliable
        return self._test(_FileStats(file))

    __call__ = eval


def _strict_leaf(pred: BoundPredicate) -> Test[_FileStats]:
    ref = _usable_ref(pred)
    if ref is None:
        return always_false
    fid = ref.field_id
    op = pred.op
    if op is Operation.IS_NULL:
        return lambda st: st.all_null(fid)
    if op is Operation.NOT_NULL:
        return lambda st: st.no_nulls(ref)
    if op is Operation.IS_NAN:
        return lambda st: st.all_nan(fid)
    if op is Operation.NOT_NAN:
        return lambda st: st.no_nans(ref) or st.all_null(fid)

    def clean(st: _FileStats) -> bool:
        return st.no_nulls(ref) and st.no_nans(ref)

    if isinstance(pred, BoundSetPredicate):
        values = _sorted_values(pred.literals)
        members = pred.literals
        zero_signs = {math.copysign(1.0, v) for v in members if _is_zero(v)}
        if op is Operation.IN:

            def in_(st: _FileStats) -> bool:
                if not clean(st):
                    return False
                _, lower, upper = st.bounds(ref)
                if lower is None or not _total_equal(lower, upper):
                    return False
                if _is_zero(lower):
                    return math.copysign(1.0, lower) in zero_signs
                return lower in members

            return in_

        def not_in(st: _FileStats) -> bool:
            if st.all_null_or_nan(fid):
                return True  # nulls and NaNs are in no set
            _, lower, upper = st.bounds(ref)
            if lower is None and upper is None:
                return False
            return not _any_within(values, lower, upper)

        return not_in
    assert isinstance(pred, BoundLiteralPredicate)
    lit = pred.literal

    def bounded(test: Callable[[Any, Any], bool], needs_clean: bool = True) -> Test[_FileStats]:
        def run(st: _FileStats) -> bool:
            if needs_clean and not clean(st):
                return False
            _, lower, upper = st.bounds(ref)
            return test(lower, upper)

        return run

    # "Every row matches" must hold under IEEE 754 and under Java's Double.compare alike
    # (the inclusive evaluator keeps what may match under either): where the two orders
    # differ (-0.0 against +0.0), IEEE's < and > are already the stricter, and <=, >=, ==
    # and IN also need Double.compare's answer.
    if op is Operation.LT:
        return bounded(lambda lo, hi: hi is not None and hi < lit)
    if op is Operation.LT_EQ:
        return bounded(lambda lo, hi: hi is not None and hi <= lit and not _total_less(lit, hi))
    if op is Operation.GT:
        return bounded(lambda lo, hi: lo is not None and lo > lit)
    if op is Operation.GT_EQ:
        return bounded(lambda lo, hi: lo is not None and lo >= lit and not _total_less(lo, lit))
    if op is Operation.EQ:
        return bounded(
            lambda lo, hi: (
                lo is not None
                and hi is not None
                and lo == lit == hi
                and _total_equal(lo, lit)
                and _total_equal(hi, lit)
            )
        )
    if op is Operation.STARTS_WITH:
        return bounded(
            lambda lo, hi: (
                lo is not None and hi is not None and lo.startswith(lit) and hi.startswith(lit)
            )
        )
    if op is Operation.NOT_EQ:
        outside = bounded(
            lambda lo, hi: (lo is not None and lit < lo) or (hi is not None and lit > hi),
            needs_clean=False,
        )
        return lambda st: st.all_null_or_nan(fid) or outside(st)
    if op is Operation.NOT_STARTS_WITH:
        n = len(lit)
        outside = bounded(
            lambda lo, hi: (lo is not None and lo[:n] > lit) or (hi is not None and hi[:n] < lit),
            needs_clean=False,
        )
        return lambda st: st.all_null(fid) or outside(st)
    raise ValidationError(f"unsupported operation {op}")  # pragma: no cover


class StrictMetricsEvaluator:
    """Must every row of a file match a row filter? Decided on its metrics; anything the
    metrics do not prove is "no". Used for delete-by-filter and for dropping residuals."""

    def __init__(
        self, schema: Schema, row_filter: BooleanExpression, case_sensitive: bool = True
    ) -> None:
        self.expr = prepare_filter(schema, row_filter, case_sensitive)
        self._test = compile_filter(self.expr, _strict_leaf)

    def eval(self, file: DataFile) -> bool:
        if file.record_count <= 0:
            return True  # no rows: all of them match
        return self._test(_FileStats(file))

    __call__ = eval


__all__ = [
    "Evaluator",
    "FieldSummary",
    "ManifestEvaluator",
    "MetricsEvaluator",
    "PartitionEvaluator",
    "RowFilter",
    "StrictMetricsEvaluator",
    "compile_row_filter",
]
