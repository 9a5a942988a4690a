"""Scan planning: which files a scan must read, with their deletes and residual filters.

Spec section "Scan Planning". A plan is made in three steps, each cheaper than the next
would be without it:

1. the manifest list's partition summaries rule out whole manifests (the row filter's
   inclusive projection onto each manifest's own partition spec, so files written under
   an old spec are judged by that spec);
2. within the remaining manifests, partition values and column metrics rule out files, in
   bulk over the manifests' cached Arrow columns (:mod:`icefloe.manifests.cache`);
3. only the surviving files become :class:`FileScanTask` objects, each with the delete files
   that apply to it (:mod:`icefloe.deletes.index`) and its residual filter: what is left of
   the row filter once the file's partition is known (strict projection).

Step 3 is lazy: a :class:`~icefloe.scan.plan.ScanPlan` keeps the selected rows per manifest
and builds tasks for the range a caller asks for (or :mod:`icefloe.scan.tasks_json` writes their
REST JSON straight from the Arrow columns), so a server paging through a million-file scan
never holds a million task objects.

The request is a :class:`ScanRequest`; :func:`plan_scan` resolves it, prunes manifests by
their summaries, indexes the delete files and prunes the data files, one function a step.

Besides point-in-time scans (current snapshot, a snapshot id, a branch or tag, or the
snapshot current at a timestamp), incremental append scans return the data files added by
the ``append`` snapshots after ``start_snapshot_id`` (exclusive) up to ``end_snapshot_id``
(inclusive), as Java's ``IncrementalAppendScan`` does: without delete files, since an append
adds none.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypedDict, Unpack

from icefloe.deletes.index import DeleteFileIndex
from icefloe.errors import NotFoundError, ValidationError
from icefloe.expressions import AlwaysTrue, BooleanExpression, is_bound, rewrite_not
from icefloe.expressions.binding import bind
from icefloe.expressions.evaluators import ManifestEvaluator
from icefloe.expressions.json_form import expression_to_json_text
from icefloe.expressions.projection import ResidualEvaluator, inclusive_projection
from icefloe.manifests.cached import CachedManifest
from icefloe.manifests.file_pruner import FilePruner, PruneCounts
from icefloe.manifests.manifest_list import ManifestContent, ManifestFile
from icefloe.scan.plan import FileScanTask, ScanMetrics, ScanPlan, Segment
from icefloe.spec.metadata import TableMetadata
from icefloe.spec.partition import PartitionSpec
from icefloe.spec.schema import Schema
from icefloe.spec.snapshot import Operation, Snapshot
from icefloe.spec.types import NestedType, walk_fields


class ManifestSource(Protocol):
    """Where a plan gets manifest lists and decoded manifests (a :class:`ManifestCache`)."""

    async def manifest_list(self, snapshot: Snapshot) -> list[ManifestFile]: ...

    async def manifests(
        self,
        manifests: Sequence[ManifestFile],
        specs: Mapping[int, PartitionSpec],
        schema: Schema,
    ) -> list[CachedManifest]: ...


# ---------------------------------------------------------------------------------------------
# Resolving the request
# ---------------------------------------------------------------------------------------------


def resolve_snapshot(
    metadata: TableMetadata,
    *,
    snapshot_id: int | None = None,
    ref: str | None = None,
    as_of_ms: int | None = None,
) -> Snapshot | None:
    """The snapshot a point-in-time scan reads (see :meth:`TableMetadata.resolve_snapshot`)."""
    return metadata.resolve_snapshot(snapshot_id=snapshot_id, ref=ref, as_of_ms=as_of_ms)


def append_snapshots(
    metadata: TableMetadata, start_snapshot_id: int | None, end_snapshot_id: int
) -> list[Snapshot]:
    """The ``append`` snapshots after ``start`` (exclusive) up to ``end`` (inclusive).

    ``start`` must be an ancestor of ``end``; None starts at the oldest known ancestor.
    """
    if metadata.snapshot_by_id(end_snapshot_id) is None:
        raise NotFoundError(f"table {metadata.location} has no snapshot {end_snapshot_id}")
    if start_snapshot_id is not None and metadata.snapshot_by_id(start_snapshot_id) is None:
        raise NotFoundError(f"table {metadata.location} has no snapshot {start_snapshot_id}")
    chain: list[Snapshot] = []
    found_start = start_snapshot_id is None
    for s in metadata.ancestors_of(end_snapshot_id):
        if s.snapshot_id == start_snapshot_id:
            found_start = True
            break
        chain.append(s)
    if not found_start:
        raise ValidationError(
            f"start-snapshot-id {start_snapshot_id} is not an ancestor of end-snapshot-id "
            f"{end_snapshot_id}"
        )
    return [s for s in reversed(chain) if s.operation is None or s.operation == Operation.APPEND]


def scan_schema(
    metadata: TableMetadata, snapshot: Snapshot | None, use_snapshot_schema: bool
) -> Schema:
    """The schema a scan binds to: the snapshot's (time travel) or the table's current one."""
    if use_snapshot_schema and snapshot is not None and snapshot.schema_id is not None:
        schema = metadata.schema_by_id(snapshot.schema_id)
        if schema is not None:
            return schema
    return metadata.schema()


def field_ids_of(
    schema: Schema, names: Sequence[str], case_sensitive: bool, what: str
) -> frozenset[int]:
    """Field ids of named columns, and of every field nested under a named struct/list/map."""
    ids: set[int] = set()
    for name in names:
        f = schema.find_field(name, case_sensitive)
        if f is None:
            raise ValidationError(
                f"{what} names column {name!r}, which schema {schema.schema_id} does not have"
            )
        ids.add(f.field_id)
        if isinstance(f.field_type, NestedType):
            ids.update(child.field_id for child in walk_fields(f.field_type))
    return frozenset(ids)


# ---------------------------------------------------------------------------------------------
# The request
# ---------------------------------------------------------------------------------------------


class ScanOptions(TypedDict, total=False):
    """:class:`ScanRequest`'s fields as keyword arguments of :func:`plan_scan`."""

    snapshot_id: int | None
    ref: str | None
    as_of_ms: int | None
    start_snapshot_id: int | None
    end_snapshot_id: int | None
    row_filter: BooleanExpression | None
    case_sensitive: bool
    select: Sequence[str] | None
    use_snapshot_schema: bool
    stats_fields: Sequence[str] | None
    include_empty_files: bool


@dataclass(frozen=True)
class ScanRequest:
    """What to plan: the snapshot (or the range of an incremental append scan), the row
    filter, the columns to read and the column stats to return.

    ``start_snapshot_id``/``end_snapshot_id`` make an incremental append scan and exclude
    the point-in-time selectors (``snapshot_id``, ``ref``, ``as_of_ms``).
    """

    snapshot_id: int | None = None
    ref: str | None = None
    as_of_ms: int | None = None
    start_snapshot_id: int | None = None
    end_snapshot_id: int | None = None
    row_filter: BooleanExpression | None = None
    case_sensitive: bool = True
    select: Sequence[str] | None = None
    use_snapshot_schema: bool = False
    stats_fields: Sequence[str] | None = None
    include_empty_files: bool = False

    @property
    def incremental(self) -> bool:
        return self.start_snapshot_id is not None or self.end_snapshot_id is not None

    def check(self) -> None:
        """Raise :class:`ValidationError` for selectors that exclude each other."""
        if not self.incremental:
            return
        point_in_time = [
            n
            for n, v in (
                ("snapshot-id", self.snapshot_id),
                ("ref", self.ref),
                ("as-of-timestamp-ms", self.as_of_ms),
            )
            if v is not None
        ]
        if point_in_time:
            raise ValidationError(
                f"an incremental scan (start/end-snapshot-id) cannot also use {point_in_time}"
            )
        if self.end_snapshot_id is None:
            raise ValidationError("end-snapshot-id is required with start-snapshot-id")


@dataclass(frozen=True)
class _Target:
    """The resolved request: the snapshot read, the append snapshots of an incremental
    scan, and the schema the filter binds to."""

    snapshot: Snapshot | None
    appends: list[Snapshot]
    schema: Schema


def _resolve(metadata: TableMetadata, request: ScanRequest) -> _Target:
    request.check()
    if request.incremental:
        assert request.end_snapshot_id is not None
        snapshot = metadata.snapshot_by_id(request.end_snapshot_id)
        appends = append_snapshots(metadata, request.start_snapshot_id, request.end_snapshot_id)
    else:
        snapshot = resolve_snapshot(
            metadata, snapshot_id=request.snapshot_id, ref=request.ref, as_of_ms=request.as_of_ms
        )
        appends = []
    return _Target(snapshot, appends, scan_schema(metadata, snapshot, request.use_snapshot_schema))


@dataclass(frozen=True)
class _Prepared:
    """The filter bound and NOT-free, the projected schema and the stats field ids."""

    row_filter: BooleanExpression
    projected: Schema
    stats_ids: frozenset[int]


def _prepare(schema: Schema, request: ScanRequest) -> _Prepared:
    expr = request.row_filter if request.row_filter is not None else AlwaysTrue()
    cs = request.case_sensitive
    bound = rewrite_not(expr if is_bound(expr) else bind(schema, expr, cs))
    projected = schema.select(list(request.select), cs) if request.select else schema
    stats_ids = (
        field_ids_of(schema, request.stats_fields, cs, "stats-fields")
        if request.stats_fields
        else frozenset()
    )
    return _Prepared(bound, projected, stats_ids)


# ---------------------------------------------------------------------------------------------
# Pruning manifests, then files; indexing deletes
# ---------------------------------------------------------------------------------------------


class _Projections:
    """What a plan derives from its filter once per partition spec: the inclusive
    projection, the manifest evaluator (with its verdict per manifest, which never changes:
    manifests are immutable) and the residual evaluator. Shared by the plans of one table
    with the same request filter (see :func:`_compiled`), so a dashboard's repeated query
    compiles nothing."""

    _MATCHES_LIMIT = 8192

    def __init__(
        self,
        location: str,
        specs: Mapping[int, PartitionSpec],
        schema: Schema,
        row_filter: BooleanExpression,
        cs: bool,
    ) -> None:
        self.location = location
        self.specs = dict(specs)
        self.schema = schema
        self.row_filter = row_filter
        self.case_sensitive = cs
        self.residuals: dict[int, ResidualEvaluator] = {}
        self._filters: dict[int, BooleanExpression] = {}
        self._evaluators: dict[int, ManifestEvaluator] = {}
        self._matches: dict[tuple[str, int], bool] = {}

    def partition_filter(self, spec_id: int) -> BooleanExpression:
        found = self._filters.get(spec_id)
        if found is None:
            spec = self.specs.get(spec_id)
            if spec is None:
                raise ValidationError(
                    f"table {self.location} has no partition spec {spec_id}, which a "
                    "manifest of the snapshot uses"
                )
            found = inclusive_projection(self.schema, spec, self.case_sensitive)(self.row_filter)
            self._filters[spec_id] = found
        return found

    def manifest_may_match(self, m: ManifestFile) -> bool:
        key = (m.manifest_path, m.partition_spec_id)
        found = self._matches.get(key)
        if found is not None:
            return found
        evaluator = self._evaluators.get(m.partition_spec_id)
        if evaluator is None:
            projected = self.partition_filter(m.partition_spec_id)  # checks the spec exists
            partition_type = self.specs[m.partition_spec_id].partition_type(self.schema)
            evaluator = ManifestEvaluator(partition_type, projected)
            self._evaluators[m.partition_spec_id] = evaluator
        found = evaluator.eval(m)
        if len(self._matches) >= self._MATCHES_LIMIT:
            self._matches.clear()
        self._matches[key] = found
        return found


@dataclass(frozen=True)
class _Compiled:
    prepared: _Prepared
    projections: _Projections


class _CompiledCache:
    """Compiled requests by table, schema, specs and request filter (LRU, thread-safe).

    The key holds the filter's JSON text, which tells apart what equality of expressions
    would not (-0.0 from 0.0); filters too large to judge cheaply are not cached."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._items: OrderedDict[tuple[Any, ...], _Compiled] = OrderedDict()

    @staticmethod
    def key(
        metadata: TableMetadata, schema: Schema, request: ScanRequest
    ) -> tuple[Any, ...] | None:
        expr = request.row_filter
        if expr is not None and not _small(expr):
            return None
        try:
            text = None if expr is None else expression_to_json_text(expr)
        except (ValidationError, TypeError, ValueError):
            return None
        return (
            metadata.table_uuid,
            metadata.location,
            schema.schema_id,
            tuple(sorted(metadata.specs())),
            text,
            request.case_sensitive,
            None if request.select is None else tuple(request.select),
            None if request.stats_fields is None else tuple(request.stats_fields),
        )

    def get(self, key: tuple[Any, ...]) -> _Compiled | None:
        with self._lock:
            found = self._items.get(key)
            if found is not None:
                self._items.move_to_end(key)
            return found

    def put(self, key: tuple[Any, ...], value: _Compiled) -> None:
        with self._lock:
            self._items[key] = value
            while len(self._items) > self.size:
                self._items.popitem(last=False)


_COMPILED = _CompiledCache(256)


async def _candidate_manifests(
    source: ManifestSource, target: _Target, range_ids: frozenset[int] | None
) -> list[ManifestFile]:
    """The manifests that may hold the scan's files: live ones, or for an incremental scan
    the data manifests that added files in the range."""
    if range_ids is None:
        assert target.snapshot is not None
        return [m for m in await source.manifest_list(target.snapshot) if _has_live_files(m)]
    listed: dict[str, ManifestFile] = {}
    for s in target.appends:
        for m in await source.manifest_list(s):
            if (
                m.content == ManifestContent.DATA
                and m.added_snapshot_id in range_ids
                and m.has_added_files
            ):
                listed.setdefault(m.manifest_path, m)
    return list(listed.values())


def _split_manifests(
    candidates: list[ManifestFile], projections: _Projections, metrics: ScanMetrics
) -> tuple[list[ManifestFile], list[ManifestFile]]:
    """Data and delete manifests whose partition summaries may match (CPU work)."""
    data: list[ManifestFile] = []
    deletes: list[ManifestFile] = []
    for m in candidates:
        if not projections.manifest_may_match(m):
            metrics.manifests_skipped += 1
        elif m.content == ManifestContent.DATA:
            data.append(m)
        else:
            deletes.append(m)
    return data, deletes


def _index_deletes(
    loaded: list[CachedManifest],
    projections: _Projections,
    deletes: DeleteFileIndex,
    counts: PruneCounts,
) -> None:
    """Index the live delete files whose partitions may match the filter."""
    pruners: dict[int, FilePruner] = {}
    for cached in loaded:
        pruner = pruners.get(cached.spec_id)
        if pruner is None:
            # Partition values only: a delete file's metrics describe deleted rows, and
            # ruling one out by the row filter would need the equality columns alone.
            pruner = FilePruner(
                projections.schema, projections.partition_filter(cached.spec_id), None
            )
            pruners[cached.spec_id] = pruner
        rows = cached.rows(pruner.select(cached))
        for f, seq in zip(rows.data_files, rows.data_sequence_numbers):
            deletes.add(f, seq)
    _sum_counts(counts, pruners.values())


def _prune_data(
    loaded: list[CachedManifest],
    projections: _Projections,
    request: ScanRequest,
    range_ids: frozenset[int] | None,
    counts: PruneCounts,
) -> list[Segment]:
    """The selected rows of each data manifest, as compact copies a plan may hold."""
    pruners: dict[int, FilePruner] = {}
    segments: list[Segment] = []
    for cached in loaded:
        pruner = pruners.get(cached.spec_id)
        if pruner is None:
            pruner = FilePruner(
                projections.schema,
                projections.partition_filter(cached.spec_id),
                projections.row_filter,
                include_empty_files=request.include_empty_files,
            )
            pruners[cached.spec_id] = pruner
        if range_ids is not None:
            selected = pruner.select(cached, which="added", snapshot_ids=range_ids)
        else:
            selected = pruner.select(cached)
        if len(selected):
            kept = cached.compact(selected)  # a held plan must not pin the manifest
            segments.append(Segment(kept, kept.row_numbers()))
    _sum_counts(counts, pruners.values())
    return segments


# ---------------------------------------------------------------------------------------------
# Planning
# ---------------------------------------------------------------------------------------------


async def plan_scan(
    metadata: TableMetadata,
    source: ManifestSource,
    request: ScanRequest | None = None,
    *,
    offload: bool = True,
    **options: Unpack[ScanOptions],
) -> ScanPlan:
    """Plan a scan of ``metadata``'s table (see the module docstring).

    The request is a :class:`ScanRequest` or its fields as keywords (not both). Raises
    :class:`ValidationError` for a malformed request (a filter, selection or stats field
    naming an unknown column, conflicting selectors) and :class:`NotFoundError` for an
    unknown snapshot, ref or time. With ``offload`` the CPU-bound work (binding big
    filters, testing summaries, pruning) runs in worker threads, so an event loop calling
    this stays free (small steps run inline, see :data:`OFFLOAD_ROWS`).
    """
    if request is None:
        request = ScanRequest(**options)
    elif options:
        raise ValidationError(f"plan_scan takes a request or keywords, not both: {sorted(options)}")
    target = _resolve(metadata, request)
    schema = target.schema
    # A big filter (a client's hundred-thousand-value IN list, an 800-deep AND chain) costs
    # seconds to bind, project and test: with it, every step runs off the event loop.
    heavy = offload and request.row_filter is not None and not _small(request.row_filter)
    key = _CompiledCache.key(metadata, schema, request)
    compiled = None if key is None else _COMPILED.get(key)
    if compiled is None:
        if heavy:
            # Binding a filter of a hundred thousand literals takes a while: off the loop.
            prepared = await asyncio.to_thread(_prepare, schema, request)
        else:
            prepared = _prepare(schema, request)
        projections = _Projections(
            metadata.location, metadata.specs(), schema, prepared.row_filter, request.case_sensitive
        )
        compiled = _Compiled(prepared, projections)
        if key is not None:
            _COMPILED.put(key, compiled)
    prepared, projections = compiled.prepared, compiled.projections
    metrics = ScanMetrics()
    deletes = DeleteFileIndex(metadata.specs(), schema)

    def plan(segments: list[Segment]) -> ScanPlan:
        return ScanPlan(
            metadata=metadata,
            snapshot=target.snapshot,
            schema=schema,
            projected_schema=prepared.projected,
            row_filter=prepared.row_filter,
            case_sensitive=request.case_sensitive,
            stats_field_ids=prepared.stats_ids,
            incremental=request.incremental,
            segments=segments,
            deletes=deletes,
            metrics=metrics,
            residuals=projections.residuals,
        )

    if target.snapshot is None:
        return plan([])
    range_ids = frozenset(s.snapshot_id for s in target.appends) if request.incremental else None
    candidates = await _candidate_manifests(source, target, range_ids)
    metrics.manifests = len(candidates)
    if heavy or (offload and len(candidates) > OFFLOAD_MANIFESTS):
        data, delete = await asyncio.to_thread(_split_manifests, candidates, projections, metrics)
    else:
        data, delete = _split_manifests(candidates, projections, metrics)
    loaded_data = await source.manifests(data, projections.specs, schema)
    loaded_deletes = await source.manifests(delete, projections.specs, schema)

    def prune() -> ScanPlan:
        _index_deletes(loaded_deletes, projections, deletes, metrics.delete_files)
        segments = _prune_data(loaded_data, projections, request, range_ids, metrics.data_files)
        return plan(segments)

    rows = sum(m.num_rows for m in loaded_data) + sum(m.num_rows for m in loaded_deletes)
    if heavy or (offload and rows > OFFLOAD_ROWS):
        return await asyncio.to_thread(prune)
    return prune()


# With ``offload``, work runs in a worker thread only when it is large enough to hold the
# event loop for more than a millisecond or two: below these sizes the thread hop (a context
# switch and a GIL hand-over each way, about a millisecond on a busy machine) would cost more
# than the work, and a selective plan's latency is mostly such hops.
OFFLOAD_MANIFESTS = 64  # manifest-list rows to test against partition summaries
OFFLOAD_ROWS = 20_000  # manifest entries to prune
OFFLOAD_FILTER_NODES = 64  # predicates and literals of a filter to bind
OFFLOAD_LITERAL_BYTES = 256  # of a string or binary literal, counted as one more literal


def _small(expr: BooleanExpression) -> bool:
    """Whether a filter has at most :data:`OFFLOAD_FILTER_NODES` predicates and literals, a
    string or binary literal counting one per :data:`OFFLOAD_LITERAL_BYTES` bytes begun (a
    600 kB ``starts-with`` literal costs as much to test against every file as a long IN
    list). Counting stops there, so a huge filter costs no more to judge than a small one."""
    budget = OFFLOAD_FILTER_NODES
    stack: list[Any] = [expr]
    while stack:
        node = stack.pop()
        budget -= 1
        literal = getattr(node, "literal", None)
        if literal is not None:
            budget -= _weight(literal)
        for one in getattr(node, "literals", ()):
            budget -= _weight(one)
            if budget < 0:
                return False
        if budget < 0:
            return False
        for child in ("left", "right", "child"):
            sub = getattr(node, child, None)
            if sub is not None:
                stack.append(sub)
    return True


def _weight(literal: Any) -> int:
    value = getattr(literal, "value", literal)  # a Literal, or a bound predicate's value
    if isinstance(value, str | bytes):
        return 1 + len(value) // OFFLOAD_LITERAL_BYTES
    return 1


def _has_live_files(m: ManifestFile) -> bool:
    if m.added_files_count is None or m.existing_files_count is None:
        return True  # an old writer omitted the counts: assume there are some
    return m.added_files_count + m.existing_files_count > 0


def _sum_counts(total: PruneCounts, pruners: Any) -> None:
    for p in pruners:
        total.considered += p.counts.considered
        total.by_partition += p.counts.by_partition
        total.by_metrics += p.counts.by_metrics
        total.selected += p.counts.selected


__all__ = [
    "FileScanTask",
    "ManifestSource",
    "ScanMetrics",
    "ScanOptions",
    "ScanPlan",
    "ScanRequest",
    "append_snapshots",
    "field_ids_of",
    "plan_scan",
    "resolve_snapshot",
    "scan_schema",
]
