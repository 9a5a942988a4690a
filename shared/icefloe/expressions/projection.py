"""Projection of row filters onto partition values, and residual filters per partition.

An *inclusive* projection turns a row filter into a partition filter that holds for every
partition that may contain a matching row: the planner uses it to skip manifests and files,
so it must never reject a partition holding a match. A *strict* projection holds only for
partitions in which every row matches: where it holds, the row filter is redundant for the
partition's files, which is how residuals shrink. Both follow the reference (Java)
semantics per transform, derived here operator by operator:

* identity is exact; bucket only projects ``eq``/``in`` (inclusive) and ``not-eq``/``not-in``
  (strict); void and unknown transforms project to true (inclusive) and false (strict);
* truncate and the time transforms are monotonic, so order comparisons project onto the
  truncated literal, adjusted by one source unit where the operator is strict (``x < v``
  projects through ``v - 1``);
* truncate on strings also projects ``starts-with`` / ``not-starts-with``, depending on
  whether the prefix fits within the width;
* time transforms widen the projection for pre-1970 values, as Java does: old writers
  truncated those toward zero, so a file may carry the partition value one above the
  correct (floored) one.

Projections take bound expressions after :func:`~icefloe.expressions.rewrite_not`, so the
result never contains a ``Not``; unbound filters are bound on the way in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from decimal import Decimal
from typing import Any

from icefloe.errors import ValidationError
from icefloe.expressions import (
    Accessor,
    AlwaysFalse,
    AlwaysTrue,
    And,
    BooleanExpression,
    BoundLiteralPredicate,
    BoundPredicate,
    BoundReference,
    BoundSetPredicate,
    BoundTransform,
    BoundUnaryPredicate,
    Operation,
    Or,
    RebuildingVisitor,
    bound_predicates,
    visit,
)
from icefloe.expressions.binding import prepare_filter
from icefloe.expressions.row_filter import compile_row_filter
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
    YearTransform,
)
from icefloe.spec.types import DecimalType, IcebergType

_TIME_TRANSFORMS = (YearTransform, MonthTransform, DayTransform, HourTransform)

Projection = Callable[[BooleanExpression], BooleanExpression]


def partition_references(schema: Schema, spec: PartitionSpec) -> list[BoundReference]:
    """One bound reference per partition field, reading position ``i`` of a partition tuple."""
    struct = spec.partition_type(schema)
    return [
        BoundReference(f, Accessor((i,)), f.name, nullable=True)
        for i, f in enumerate(struct.fields)
    ]


def inclusive_projection(
    schema: Schema, spec: PartitionSpec, case_sensitive: bool = True
) -> Projection:
    """A function from row filters to partition filters true for every partition that may
    hold a matching row; results are bound to ``spec.partition_type(schema)``."""
    return _Projector(schema, spec, case_sensitive, strict=False)


def strict_projection(
    schema: Schema, spec: PartitionSpec, case_sensitive: bool = True
) -> Projection:
    """A function from row filters to partition filters true only for partitions in which
    every row matches; results are bound to ``spec.partition_type(schema)``."""
    return _Projector(schema, spec, case_sensitive, strict=True)


class _Projector(RebuildingVisitor):
    def __init__(
        self, schema: Schema, spec: PartitionSpec, case_sensitive: bool, strict: bool
    ) -> None:
        self.schema = schema
        self.case_sensitive = case_sensitive
        self.strict = strict
        self.by_source: dict[int, list[tuple[PartitionField, BoundReference]]] = {}
        for pf, ref in zip(spec.fields, partition_references(schema, spec)):
            if pf.transform.is_unknown or len(pf.all_source_ids) != 1:
                continue  # ignored for filtering, as the spec requires
            self.by_source.setdefault(pf.source_id, []).append((pf, ref))

    def __call__(self, expr: BooleanExpression) -> BooleanExpression:
        return visit(prepare_filter(self.schema, expr, self.case_sensitive), self)

    def visit_not(self, child_result: BooleanExpression) -> BooleanExpression:
        raise ValidationError("projection needs NOT rewritten away; call rewrite_not first")

    def visit_bound_predicate(self, predicate: BoundPredicate) -> BooleanExpression:
        fields = self.by_source.get(predicate.ref.field_id, ())
        # Each field's inclusive projection holds for every matching row's partition, so
        # all of them do; any one field's strict projection alone proves a match.
        result: BooleanExpression = AlwaysFalse() if self.strict else AlwaysTrue()
        for pf, ref in fields:
            projected = project_predicate(predicate, pf.transform, ref, strict=self.strict)
            result = Or(result, projected) if self.strict else And(result, projected)
        return result


# ---------------------------------------------------------------------------------------------
# One predicate through one transform
# ---------------------------------------------------------------------------------------------


def _unit(source: IcebergType) -> Any:
    """The smallest step between two values of an integer-like or decimal source."""
    if isinstance(source, DecimalType):
        return Decimal(1).scaleb(-source.scale)
    return 1


def _set_predicate(op: Operation, ref: BoundReference, values: Iterable[Any]) -> BooleanExpression:
    distinct = set(values)
    if not distinct:
        return AlwaysFalse() if op is Operation.IN else AlwaysTrue()
    if len(distinct) == 1:
        single = Operation.EQ if op is Operation.IN else Operation.NOT_EQ
        return BoundLiteralPredicate(single, ref, next(iter(distinct)))
    return BoundSetPredicate(op, ref, distinct)


def _same_on(predicate: BoundPredicate, term: Any) -> BooleanExpression:
    """``predicate`` with its term replaced (operation and literals unchanged)."""
    if isinstance(predicate, BoundLiteralPredicate):
        return BoundLiteralPredicate(predicate.op, term, predicate.literal)
    if isinstance(predicate, BoundSetPredicate):
        return BoundSetPredicate(predicate.op, term, predicate.literals)
    return BoundUnaryPredicate(predicate.op, term)


def project_predicate(
    predicate: BoundPredicate, transform: Transform, ref: BoundReference, *, strict: bool
) -> BooleanExpression:
    """Project one bound predicate through a partition field's ``transform``.

    ``ref`` reads the partition field; the predicate's own term must read the field's
    source column. Anything that cannot be projected yields the neutral answer: true for
    inclusive projections, false for strict ones.
    """
    neutral: BooleanExpression = AlwaysFalse() if strict else AlwaysTrue()
    if transform.is_void or transform.is_unknown:
        return neutral
    term = predicate.term
    if isinstance(term, BoundTransform):
        # A predicate on f(x) maps exactly onto a partition field holding f(x), or onto
        # f(partition value) when the field holds x itself.
        if term.transform == transform:
            if isinstance(transform, _TIME_TRANSFORMS):
                projected = _project_time_term(predicate, ref, strict)
                return neutral if projected is None else projected
            return _same_on(predicate, ref)
        if isinstance(transform, IdentityTransform):
            return _same_on(predicate, BoundTransform(term.transform, ref))
        return neutral
    if isinstance(transform, IdentityTransform):
        return _same_on(predicate, ref)
    op = predicate.op
    if op is Operation.IS_NULL or op is Operation.NOT_NULL:
        return BoundUnaryPredicate(op, ref)  # every transform maps exactly null to null
    if op.is_unary:
        return neutral  # NaN tests only survive identity (no other transform takes floats)
    source = term.result_type
    try:
        if isinstance(transform, BucketTransform):
            result = _project_bucket(predicate, transform, source, ref, strict)
        elif isinstance(transform, TruncateTransform):
            result = _project_truncate(predicate, transform, source, ref, strict)
        elif isinstance(transform, _TIME_TRANSFORMS):
            result = _project_time(predicate, transform, source, ref, strict)
        else:
            result = None
    except (ValidationError, OverflowError, ValueError, TypeError):
        # The literal (or its neighbour) has no transformed value, e.g. a year beyond the
        # int range: give up on this field rather than guess.
        result = None
    return neutral if result is None else result


def _project_bucket(
    predicate: BoundPredicate,
    transform: Transform,
    source: IcebergType,
    ref: BoundReference,
    strict: bool,
) -> BooleanExpression | None:
    op = predicate.op
    wanted = (Operation.NOT_EQ, Operation.NOT_IN) if strict else (Operation.EQ, Operation.IN)
    if op not in wanted:
        return None
    if isinstance(predicate, BoundLiteralPredicate):
        return BoundLiteralPredicate(op, ref, transform.apply(source, predicate.literal))
    assert isinstance(predicate, BoundSetPredicate)
    return _set_predicate(op, ref, (transform.apply(source, v) for v in predicate.literals))


def _project_truncate(
    predicate: BoundPredicate,
    transform: TruncateTransform,
    source: IcebergType,
    ref: BoundReference,
    strict: bool,
) -> BooleanExpression | None:
    op = predicate.op

    def t(v: Any) -> Any:
        return transform.apply(source, v)

    if isinstance(predicate, BoundSetPredicate):
        values = predicate.literals
        if op is Operation.IN and not strict:
            return _set_predicate(op, ref, (t(v) for v in values))
        if op is Operation.NOT_IN and strict:
            return _set_predicate(op, ref, (t(v) for v in values))
        if op is Operation.IN and strict and isinstance(next(iter(values)), str | bytes):
            # A value shorter than the width is its own partition, holding only itself.
            short = [v for v in values if len(v) < transform.width]
            return _set_predicate(op, ref, short)
        return None
    assert isinstance(predicate, BoundLiteralPredicate)
    v = predicate.literal
    if isinstance(v, str | bytes):
        return _project_truncate_prefix(op, v, transform, source, ref, strict)
    step = _unit(source)
    lit = BoundLiteralPredicate
    if not strict:
        if op is Operation.LT:
            return lit(Operation.LT_EQ, ref, t(v - step))
        if op is Operation.LT_EQ:
            return lit(Operation.LT_EQ, ref, t(v))
        if op is Operation.GT:
            return lit(Operation.GT_EQ, ref, t(v + step))
        if op is Operation.GT_EQ:
            return lit(Operation.GT_EQ, ref, t(v))
        if op is Operation.EQ:
            return lit(Operation.EQ, ref, t(v))
        return None
    # A partition p holds [p, p + W - 1] (in steps); compare that whole range.
    if op is Operation.LT:
        return lit(Operation.LT, ref, t(v))
    if op is Operation.LT_EQ:
        return lit(Operation.LT, ref, t(v + step))
    if op is Operation.GT:
        return lit(Operation.GT, ref, t(v))
    if op is Operation.GT_EQ:
        return lit(Operation.GT, ref, t(v - step))
    if op is Operation.NOT_EQ:
        return lit(Operation.NOT_EQ, ref, t(v))
    return None


def _project_truncate_prefix(
    op: Operation,
    v: str | bytes,
    transform: TruncateTransform,
    source: IcebergType,
    ref: BoundReference,
    strict: bool,
) -> BooleanExpression | None:
    """truncate[W] on strings (W code points) and binary (W bytes)."""
    width = transform.width
    tv = transform.apply(source, v)
    lit = BoundLiteralPredicate
    if not strict:
        if op is Operation.LT or op is Operation.LT_EQ:
            return lit(Operation.LT_EQ, ref, tv)
        if op is Operation.GT or op is Operation.GT_EQ:
            return lit(Operation.GT_EQ, ref, tv)
        if op is Operation.EQ:
            return lit(Operation.EQ, ref, tv)
        if op is Operation.STARTS_WITH:
            # Within the width the partition keeps the whole prefix; beyond it, the
            # partition is the prefix's own truncation.
            return lit(op, ref, v) if len(v) <= width else lit(Operation.EQ, ref, tv)
        if op is Operation.NOT_STARTS_WITH:
            return lit(op, ref, v) if len(v) <= width else None
        return None
    # A partition p shorter than W holds only p; one of length W holds every extension of p.
    if op is Operation.LT or op is Operation.LT_EQ:
        return lit(Operation.LT, ref, tv)
    if op is Operation.GT or op is Operation.GT_EQ:
        return lit(Operation.GT, ref, tv)
    if op is Operation.EQ:
        return lit(Operation.EQ, ref, v) if len(v) < width else None
    if op is Operation.NOT_EQ:
        return lit(Operation.NOT_EQ, ref, tv)
    if op is Operation.STARTS_WITH:
        return lit(op, ref, v) if len(v) <= width else None
    if op is Operation.NOT_STARTS_WITH:
        return lit(op, ref, v) if len(v) <= width else lit(Operation.NOT_EQ, ref, tv)
    return None


def _project_time(
    predicate: BoundPredicate,
    transform: Transform,
    source: IcebergType,
    ref: BoundReference,
    strict: bool,
) -> BooleanExpression | None:
    """A predicate on a date/timestamp column through year, month, day or hour."""
    op = predicate.op

    def t(v: Any) -> int:
        result: int = transform.apply(source, v)
        return result

    # First the projection for correctly (floor) transformed values ...
    projected: tuple[Operation, Any] | None = None
    if isinstance(predicate, BoundSetPredicate):
        if op is (Operation.NOT_IN if strict else Operation.IN):
            projected = op, {t(v) for v in predicate.literals}
    else:
        assert isinstance(predicate, BoundLiteralPredicate)
        v = predicate.literal
        if not strict:
            projected = {
                Operation.LT: lambda: (Operation.LT_EQ, t(v - 1)),
                Operation.LT_EQ: lambda: (Operation.LT_EQ, t(v)),
                Operation.GT: lambda: (Operation.GT_EQ, t(v + 1)),
                Operation.GT_EQ: lambda: (Operation.GT_EQ, t(v)),
                Operation.EQ: lambda: (Operation.EQ, t(v)),
            }.get(op, lambda: None)()
        else:
            # A partition p holds the source values of one whole unit.
            projected = {
                Operation.LT: lambda: (Operation.LT, t(v)),
                Operation.LT_EQ: lambda: (Operation.LT, t(v + 1)),
                Operation.GT: lambda: (Operation.GT, t(v)),
                Operation.GT_EQ: lambda: (Operation.GT, t(v - 1)),
                Operation.NOT_EQ: lambda: (Operation.NOT_EQ, t(v)),
            }.get(op, lambda: None)()
    if projected is None:
        return None
    # ... then widened (or narrowed) for files written with the pre-epoch bug.
    return _time_fix(projected[0], projected[1], ref, strict)


def _time_fix(op: Operation, value: Any, ref: BoundReference, strict: bool) -> BooleanExpression:
    """Adjust a correct projection onto a time partition for pre-epoch writer bugs.

    Old writers truncated pre-1970 values toward zero, so a row whose correct partition
    value is q < 0 may sit in partition q + 1; conversely a partition p <= 0 may hold rows
    whose correct value is p - 1. Values above 0 were always right.
    """
    lit = BoundLiteralPredicate
    if isinstance(value, set):
        bumped = value | {p + 1 for p in value if p < 0}
        positive = {p for p in value if p > 0}
        if op is Operation.IN:
            return _set_predicate(op, ref, positive if strict else bumped)
        return _set_predicate(op, ref, bumped if strict else positive)
    p = value
    if not strict:
        if op is Operation.LT:
            return lit(Operation.LT_EQ, ref, p) if p <= 0 else lit(op, ref, p)
        if op is Operation.LT_EQ:
            return lit(op, ref, p + 1 if p < 0 else p)
        if op is Operation.EQ:
            return _set_predicate(Operation.IN, ref, (p, p + 1) if p < 0 else (p,))
        if op is Operation.NOT_EQ:
            return AlwaysTrue() if p <= 0 else lit(op, ref, p)
        return lit(op, ref, p)  # GT, GT_EQ: bug-written values are only ever larger
    if op is Operation.GT:
        return lit(op, ref, p + 1 if p < 0 else p)
    if op is Operation.GT_EQ:
        return lit(op, ref, p + 1 if p <= 0 else p)
    if op is Operation.EQ:
        return lit(op, ref, p) if p > 0 else AlwaysFalse()
    if op is Operation.NOT_EQ:
        return _set_predicate(Operation.NOT_IN, ref, (p, p + 1) if p < 0 else (p,))
    return lit(op, ref, p)  # LT, LT_EQ: bug-written values are only ever larger


def _project_time_term(
    predicate: BoundPredicate, ref: BoundReference, strict: bool
) -> BooleanExpression | None:
    """A predicate on ``unit(x)`` onto a partition field holding ``unit(x)``: exact but for
    the pre-epoch bug."""
    op = predicate.op
    if op.is_unary:
        return BoundUnaryPredicate(op, ref)
    if isinstance(predicate, BoundSetPredicate):
        return _time_fix(op, set(predicate.literals), ref, strict)
    assert isinstance(predicate, BoundLiteralPredicate)
    return _time_fix(op, predicate.literal, ref, strict)


# ---------------------------------------------------------------------------------------------
# Residuals
# ---------------------------------------------------------------------------------------------


class ResidualEvaluator:
    """The part of a row filter still to check on the rows of a given partition.

    For each predicate: true where its strict projection holds on the partition, false
    where its inclusive projection fails, otherwise the predicate itself. Projections are
    compiled once; results are cached per partition tuple, since many files share one.

    A predicate no partition field can decide (its column is not a partition source) is
    left as it is without a test; where no predicate can be decided, the residual of every
    partition is the filter itself, the very object (:attr:`expr`), so a writer can tell it
    apart by identity and share one serialized form. Where some are decided, the parts left
    whole are shared with the filter too (see :func:`icefloe.expressions.visit`).
    """

    _CACHE_LIMIT = 4096

    def __init__(
        self,
        spec: PartitionSpec,
        expr: BooleanExpression,
        schema: Schema,
        case_sensitive: bool = True,
    ) -> None:
        self.spec = spec
        self.schema = schema
        self.expr = prepare_filter(schema, expr, case_sensitive)
        self._cache: dict[tuple[Any, ...], BooleanExpression] = {}
        self._tests: dict[
            BoundPredicate,
            tuple[Callable[[Sequence[Any]], bool], Callable[[Sequence[Any]], bool]],
        ] = {}
        if not spec.is_unpartitioned:
            inclusive = _Projector(schema, spec, case_sensitive, strict=False)
            strict = _Projector(schema, spec, case_sensitive, strict=True)
            for pred in bound_predicates(self.expr):
                if pred in self._tests or pred.ref.field_id not in strict.by_source:
                    continue
                self._tests[pred] = (
                    compile_row_filter(visit(pred, strict)),
                    compile_row_filter(visit(pred, inclusive)),
                )
        self._constant = not self._tests
        self._by_decisions: dict[tuple[bool | None, ...], BooleanExpression] = {}

    def residual_for(self, partition: Sequence[Any]) -> BooleanExpression:
        if self._constant:
            return self.expr
        key = tuple(partition)
        try:
            cached = self._cache.get(key)
        except TypeError:  # an unhashable value: compute without caching
            return self._residual(key)
        if cached is None:
            if len(self._cache) >= self._CACHE_LIMIT:
                self._cache.clear()
            cached = self._cache[key] = self._residual(key)
        return cached

    def _residual(self, partition: tuple[Any, ...]) -> BooleanExpression:
        """The residual for ``partition``: one object per distinct set of decisions, so the
        partitions where the same predicates are decided the same way share it (a decided
        predicate deep in a chain rebuilds the chain above it, a copy per partition)."""
        decisions = tuple(
            True if strict(partition) else False if not inclusive(partition) else None
            for strict, inclusive in self._tests.values()
        )
        found = self._by_decisions.get(decisions)
        if found is None:
            decided = {p: d for p, d in zip(self._tests, decisions, strict=True) if d is not None}
            found = visit(self.expr, _Residual(decided))
            if len(self._by_decisions) >= self._CACHE_LIMIT:
                self._by_decisions.clear()
            self._by_decisions[decisions] = found
        return found

    __call__ = residual_for


def residual_evaluator(
    spec: PartitionSpec, expr: BooleanExpression, schema: Schema, case_sensitive: bool = True
) -> ResidualEvaluator:
    return ResidualEvaluator(spec, expr, schema, case_sensitive)


class _Residual(RebuildingVisitor):
    """The filter with the decided predicates (true or false on the partition) replaced."""

    def __init__(self, decided: dict[BoundPredicate, bool]) -> None:
        self.decided = decided

    def visit_bound_predicate(self, predicate: BoundPredicate) -> BooleanExpression:
        decision = self.decided.get(predicate)
        if decision is None:
            return predicate  # undecided here, or no partition field can decide it
        return AlwaysTrue() if decision else AlwaysFalse()


__all__ = [
    "Projection",
    "ResidualEvaluator",
    "inclusive_projection",
    "partition_references",
    "project_predicate",
    "residual_evaluator",
    "strict_projection",
]
