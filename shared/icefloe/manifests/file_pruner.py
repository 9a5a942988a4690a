"""Vectorized file pruning over cached manifests: partition values and column metrics.

A warm scan must not walk a hundred thousand Python objects to find the dozen files a filter
selects, so filters are evaluated over whole manifests' Arrow columns:

* partition predicates (the inclusive projection of the row filter onto the manifest's own
  partition spec) compare a partition column with a literal;
* metric predicates use per-column arrays of value, null and NaN counts and of decoded lower
  and upper bounds, cut out of the metric maps the first time a filter needs them.

Predicates the arrays cannot decide (transform terms, ``starts-with`` on metrics, very large
``IN`` lists, values Arrow cannot hold, signed zeros) fall back to the per-file evaluators of
:mod:`icefloe.expressions.evaluators`, run only on the rows still in question, so both paths agree
exactly: the vectorized code is an accelerator, never a second set of semantics.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from icefloe.arrow.values import (
    all_false,
    all_true,
    arrow_scalar,
    arrow_storage_type,
    filled,
    to_storage,
)
from icefloe.errors import ValidationError
from icefloe.expressions import (
    AlwaysFalse,
    AlwaysTrue,
    And,
    BooleanExpression,
    BoundLiteralPredicate,
    BoundPredicate,
    BoundReference,
    BoundSetPredicate,
    BoundTransform,
    Not,
    Operation,
    Or,
    flatten,
)
from icefloe.expressions.evaluators import MetricsEvaluator, compile_row_filter
from icefloe.manifests.cached import BOUND_COLUMNS, CachedManifest
from icefloe.spec.datafile import DataFile
from icefloe.spec.schema import Schema
from icefloe.spec.types import (
    DoubleType,
    FloatType,
    IcebergType,
    PrimitiveType,
)

# IN lists longer than this are decided per file (a bisect per file beats an OR of this many
# array comparisons).
_MAX_VECTOR_SET = 32
_BOOL = pa.bool_()


class _Unvectorizable(Exception):
    """This predicate must be decided per file."""


def _evaluate(
    expr: BooleanExpression,
    candidates: Any,
    leaf: Callable[[BoundPredicate, Any], Any],
) -> Any:
    """The rows among ``candidates`` for which ``expr`` holds (false outside them).

    AND narrows the candidates for its right side and OR only tries the rows its left side
    did not take, so a predicate that must run per file only runs on rows still in doubt.
    """
    if isinstance(expr, AlwaysTrue):
        return candidates
    if isinstance(expr, AlwaysFalse):
        return all_false(len(candidates))
    if isinstance(expr, And):
        mask = candidates
        for part in flatten(expr, And):
            mask = _evaluate(part, mask, leaf)
        return mask
    if isinstance(expr, Or):
        taken = all_false(len(candidates))
        remaining = candidates
        for part in flatten(expr, Or):
            hit = _evaluate(part, remaining, leaf)
            taken = pc.or_(taken, hit)
            remaining = pc.and_(remaining, pc.invert(hit))
        return taken
    if isinstance(expr, Not):
        raise ValidationError("pruning needs NOT rewritten away; call rewrite_not first")
    if isinstance(expr, BoundPredicate):
        return pc.and_(candidates, leaf(expr, candidates))
    raise ValidationError(f"cannot prune with {expr!r:.80}: bind the filter first")


def _per_row(candidates: Any, test: Callable[[int], bool]) -> Any:
    """Run ``test`` on the candidate rows only; false elsewhere."""
    chosen = set(pc.indices_nonzero(candidates).to_pylist())
    return pa.array([i in chosen and test(i) for i in range(len(candidates))], _BOOL)


def _is_floating(t: IcebergType) -> bool:
    return isinstance(t, FloatType | DoubleType)


def _set_mask(column: Any, t: IcebergType, values: frozenset[Any]) -> Any:
    """Whether each (non-null) value is in ``values``: null rows are false.

    Floats are compared with ``equal`` rather than a hash lookup, so that -0.0 matches 0.0 as
    it does in Python and in the per-file evaluators.
    """
    if _is_floating(t):
        if len(values) > _MAX_VECTOR_SET:
            raise _Unvectorizable
        mask = all_false(len(column))
        for v in values:
            mask = pc.or_(mask, filled(pc.equal(column, arrow_scalar(t, v)), False))
        return mask
    value_set = pa.array([to_storage(t, v) for v in values], column.type)
    return filled(pc.is_in(column, value_set=value_set), False)


def partition_leaf_mask(manifest: CachedManifest, pred: BoundPredicate) -> Any:
    """A partition predicate over a partition column, with the row evaluator's semantics."""
    term = pred.term
    if isinstance(term, BoundTransform) or term.ref.accessor is None:
        raise _Unvectorizable
    positions = term.ref.accessor.positions
    if len(positions) != 1:
        raise _Unvectorizable
    column = manifest.partition_column(positions[0])
    if column is None:
        raise _Unvectorizable
    t = term.ref.field_type
    op = pred.op
    try:
        if op is Operation.IS_NULL:
            return pc.is_null(column)
        if op is Operation.NOT_NULL:
            return pc.is_valid(column)
        if op is Operation.IS_NAN:
            return filled(pc.is_nan(column), False)
        if op is Operation.NOT_NAN:
            return filled(pc.invert(pc.is_nan(column)), True)
        if isinstance(pred, BoundSetPredicate):
            found = _set_mask(column, t, pred.literals)
            if op is Operation.IN:
                return filled(pc.and_(pc.is_valid(column), found), False)
            return pc.invert(filled(pc.and_(pc.is_valid(column), found), False))
        assert isinstance(pred, BoundLiteralPredicate)
        lit = pred.literal
        if op is Operation.STARTS_WITH or op is Operation.NOT_STARTS_WITH:
            if not isinstance(lit, str) or not pa.types.is_string(column.type):
                raise _Unvectorizable
            found = filled(pc.starts_with(column, pattern=lit), False)
            return found if op is Operation.STARTS_WITH else pc.invert(found)
        scalar = arrow_scalar(t, lit)
        compare = _COMPARE.get(op)
        if compare is None:
            raise _Unvectorizable
        return filled(compare(column, scalar), op is Operation.NOT_EQ)
    except (pa.ArrowException, TypeError, ValueError, OverflowError, ValidationError):
        raise _Unvectorizable from None


_COMPARE: dict[Operation, Callable[[Any, Any], Any]] = {
    Operation.LT: pc.less,
    Operation.LT_EQ: pc.less_equal,
    Operation.GT: pc.greater,
    Operation.GT_EQ: pc.greater_equal,
    Operation.EQ: pc.equal,
    Operation.NOT_EQ: pc.not_equal,
}


class _Stats:
    """The metric arrays of one column of one manifest, fetched as predicates need them."""

    def __init__(self, manifest: CachedManifest, ref: BoundReference) -> None:
        self.m = manifest
        self.ref = ref
        self.fid = ref.field_id
        self.n = manifest.num_rows

    def counts(self, name: str) -> Any:
        return self.m.counts(name, self.fid)

    def lower(self) -> Any:
        t = self.ref.field_type
        assert isinstance(t, PrimitiveType)
        return self.m.bounds("lower_bounds", self.fid, t, self.ref.name)

    def upper(self) -> Any:
        t = self.ref.field_type
        assert isinstance(t, PrimitiveType)
        return self.m.bounds("upper_bounds", self.fid, t, self.ref.name)

    def all_null(self) -> Any:
        return filled(
            pc.greater_equal(self.counts("null_value_counts"), self.counts("value_counts")), False
        )

    def all_nan(self) -> Any:
        return filled(
            pc.greater_equal(self.counts("nan_value_counts"), self.counts("value_counts")), False
        )

    def all_null_or_nan(self) -> Any:
        nans = filled(self.counts("nan_value_counts"), 0)
        nulls_and_nans = pc.add(self.counts("null_value_counts"), nans)
        return filled(pc.greater_equal(nulls_and_nans, self.counts("value_counts")), False)

    def no_nulls(self) -> Any:
        if not self.ref.nullable:
            return all_true(self.n)
        return filled(pc.equal(self.counts("null_value_counts"), 0), False)

    def no_nans(self) -> Any:
        if not _is_floating(self.ref.field_type):
            return all_true(self.n)
        return filled(pc.equal(self.counts("nan_value_counts"), 0), False)


_SIGNED_ZERO_OPS = frozenset({Operation.LT, Operation.GT, Operation.NOT_EQ, Operation.NOT_IN})


def _has_zero(pred: BoundPredicate) -> bool:
    if isinstance(pred, BoundSetPredicate):
        return any(v == 0.0 for v in pred.literals)
    return isinstance(pred, BoundLiteralPredicate) and pred.literal == 0.0


def metrics_leaf_mask(manifest: CachedManifest, pred: BoundPredicate) -> Any:
    """May each file hold rows matching ``pred``, by its metrics? Mirrors
    :class:`~icefloe.expressions.evaluators.MetricsEvaluator` predicate by predicate."""
    n = manifest.num_rows
    term = pred.term
    if isinstance(term, BoundTransform):
        return all_true(n)
    ref = term.ref
    if ref.accessor is None or not isinstance(ref.field_type, PrimitiveType):
        return all_true(n)
    t = ref.field_type
    if arrow_storage_type(t) is None:
        raise _Unvectorizable
    st = _Stats(manifest, ref)
    op = pred.op
    try:
        if op is Operation.IS_NULL:
            return filled(pc.not_equal(st.counts("null_value_counts"), 0), True)
        if op is Operation.NOT_NULL:
            return pc.invert(st.all_null())
        if op is Operation.IS_NAN:
            may = filled(pc.not_equal(st.counts("nan_value_counts"), 0), True)
            return pc.and_(may, pc.invert(st.all_null()))
        if op is Operation.NOT_NAN:
            return pc.invert(st.all_nan())
        if op is Operation.STARTS_WITH or op is Operation.NOT_STARTS_WITH:
            raise _Unvectorizable
        if _is_floating(t) and op in _SIGNED_ZERO_OPS and _has_zero(pred):
            raise _Unvectorizable  # -0.0 vs 0.0 as Double.compare: the per-file evaluator
        lower, upper = st.lower(), st.upper()
        if op is Operation.NOT_EQ or op is Operation.NOT_IN:
            if isinstance(pred, BoundSetPredicate):
                single = _set_mask(lower, t, pred.literals)
            else:
                assert isinstance(pred, BoundLiteralPredicate)
                single = filled(pc.equal(lower, arrow_scalar(t, pred.literal)), False)
            one_value = filled(pc.equal(lower, upper), False)
            clean = pc.and_(st.no_nulls(), st.no_nans())
            return pc.invert(pc.and_(pc.and_(clean, one_value), single))
        if isinstance(pred, BoundSetPredicate):
            if len(pred.literals) > _MAX_VECTOR_SET:
                raise _Unvectorizable
            within = all_false(n)
            for v in pred.literals:
                s = arrow_scalar(t, v)
                above = filled(pc.less_equal(lower, s), True)
                below = filled(pc.greater_equal(upper, s), True)
                within = pc.or_(within, pc.and_(above, below))
            return pc.and_(pc.invert(st.all_null_or_nan()), within)
        assert isinstance(pred, BoundLiteralPredicate)
        s = arrow_scalar(t, pred.literal)
        if op is Operation.LT:
            may = filled(pc.less(lower, s), True)
        elif op is Operation.LT_EQ:
            may = filled(pc.less_equal(lower, s), True)
        elif op is Operation.GT:
            may = filled(pc.greater(upper, s), True)
        elif op is Operation.GT_EQ:
            may = filled(pc.greater_equal(upper, s), True)
        elif op is Operation.EQ:
            may = pc.and_(
                filled(pc.less_equal(lower, s), True), filled(pc.greater_equal(upper, s), True)
            )
        else:
            raise _Unvectorizable
        return pc.and_(pc.invert(st.all_null_or_nan()), may)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        raise _Unvectorizable from None


@dataclass
class PruneCounts:
    """What pruning did, summed over the manifests a pruner saw."""

    considered: int = 0
    by_partition: int = 0
    by_metrics: int = 0
    selected: int = 0


class FilePruner:
    """Selects the rows of cached manifests that may hold rows matching a row filter.

    Built once per plan and partition spec: ``partition_filter`` is the inclusive
    projection of the row filter onto that spec (bound to its partition struct) and
    ``row_filter`` the bound, NOT-free row filter for the metrics (None to skip metrics, as
    for delete files). Thread-safe apart from :attr:`counts`, which a plan owns.
    """

    def __init__(
        self,
        schema: Schema,
        partition_filter: BooleanExpression,
        row_filter: BooleanExpression | None,
        *,
        include_empty_files: bool = False,
    ) -> None:
        self.schema = schema
        self.partition_filter = partition_filter
        self.row_filter = row_filter
        self.include_empty_files = include_empty_files
        self.counts = PruneCounts()
        self._partition_tests: dict[BoundPredicate, Callable[[Sequence[Any]], bool]] = {}
        self._metrics_tests: dict[BoundPredicate, MetricsEvaluator] = {}

    def select(
        self,
        manifest: CachedManifest,
        *,
        which: str = "live",
        snapshot_ids: frozenset[int] | None = None,
    ) -> Any:
        """Row indices (int64 array) of the selected entries, in manifest order.

        ``which`` is ``live`` (ADDED and EXISTING entries) or ``added``; ``snapshot_ids``
        further keeps only entries added by those snapshots (incremental scans).
        """
        n = manifest.num_rows
        candidates = manifest.status_mask(which)
        if snapshot_ids is not None:
            ids = pa.array(sorted(snapshot_ids), pa.int64())
            added_by = filled(pc.is_in(manifest.column("snapshot_id"), value_set=ids), False)
            candidates = pc.and_(candidates, added_by)
        considered = _count(candidates)
        in_partition = _evaluate(self.partition_filter, candidates, self._partition_leaf(manifest))
        after_partition = _count(in_partition)
        keep = in_partition
        if self.row_filter is not None and after_partition:
            keep = self._metrics(manifest, in_partition)
        selected = pc.indices_nonzero(keep) if n else pa.array([], pa.int64())
        self.counts.considered += considered
        self.counts.by_partition += considered - after_partition
        self.counts.by_metrics += after_partition - len(selected)
        self.counts.selected += len(selected)
        return selected.cast(pa.int64())

    # -- partition ----------------------------------------------------------------------

    def _partition_leaf(self, manifest: CachedManifest) -> Callable[[BoundPredicate, Any], Any]:
        def leaf(pred: BoundPredicate, candidates: Any) -> Any:
            try:
                return partition_leaf_mask(manifest, pred)
            except _Unvectorizable:
                pass
            test = self._partition_tests.get(pred)
            if test is None:
                test = self._partition_tests[pred] = compile_row_filter(pred)
            tuples = manifest.partition_tuples()
            return _per_row(candidates, lambda i: test(tuples[i]))

        return leaf

    # -- metrics ------------------------------------------------------------------------

    def _metrics(self, manifest: CachedManifest, candidates: Any) -> Any:
        assert self.row_filter is not None
        records = manifest.column("record_count")
        unknown = pc.less(records, 0)  # old v1 writers: metrics are unreliable
        if self.include_empty_files:
            nonempty = all_true(manifest.num_rows)
        else:
            nonempty = pc.not_equal(records, 0)
        usable = pc.and_(candidates, pc.and_(nonempty, pc.invert(unknown)))
        matched = _evaluate(self.row_filter, usable, self._metrics_leaf(manifest))
        return pc.or_(matched, pc.and_(candidates, unknown))

    def _metrics_leaf(self, manifest: CachedManifest) -> Callable[[BoundPredicate, Any], Any]:
        def leaf(pred: BoundPredicate, candidates: Any) -> Any:
            try:
                return metrics_leaf_mask(manifest, pred)
            except _Unvectorizable:
                pass
            evaluator = self._metrics_tests.get(pred)
            if evaluator is None:
                evaluator = self._metrics_tests[pred] = MetricsEvaluator(
                    self.schema, pred, include_empty_files=True
                )
            return _per_file(manifest, candidates, pred, evaluator)

        return leaf


def _per_file(
    manifest: CachedManifest, candidates: Any, pred: BoundPredicate, evaluator: MetricsEvaluator
) -> Any:
    """The per-file evaluator on the candidate rows, given only the predicate's column."""
    fid = pred.term.ref.field_id
    columns = {
        name: manifest.counts(name, fid).to_pylist()
        for name in ("value_counts", "null_value_counts", "nan_value_counts")
    }
    raw = {name: manifest.raw_bounds(name, fid).to_pylist() for name in BOUND_COLUMNS}
    paths = manifest.column("file_path")
    records = manifest.column("record_count")

    def one(name: str, values: dict[str, list[Any]], i: int) -> dict[int, Any] | None:
        v = values[name][i]
        return None if v is None else {fid: v}

    def test(i: int) -> bool:
        probe = DataFile(
            file_path=paths[i].as_py(),
            file_format="parquet",
            partition=(),
            record_count=records[i].as_py(),
            file_size_in_bytes=0,
            value_counts=one("value_counts", columns, i),
            null_value_counts=one("null_value_counts", columns, i),
            nan_value_counts=one("nan_value_counts", columns, i),
            lower_bounds=one("lower_bounds", raw, i),
            upper_bounds=one("upper_bounds", raw, i),
        )
        return evaluator.eval(probe)

    return _per_row(candidates, test)


def _count(mask: Any) -> int:
    total = pc.sum(mask).as_py()
    return int(total or 0)


__all__ = [
    "FilePruner",
    "PruneCounts",
    "metrics_leaf_mask",
    "partition_leaf_mask",
]
