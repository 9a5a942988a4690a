"""Scan planning: which files a scan must read, with their deletes and residual filters.

Spec section "Scan Planning". A plan is made in three steps, each cheaper than the next
would be without it:

1. the manifest list's partition summaries rule out whole manifests (the row filter's
   inclusive projection onto each manifest's own partition spec, so files written under
   an old spec are judged by that spec);
2. within the remaining manifests, partition values and column metrics rule out files, in
   bulk over the manifests' cached Arrow columns (:mod:`icefloe.manifest_cache`);
3. only the surviving files become :class:`FileScanTask` objects, each with the delete files
   that apply to it (:mod:`icefloe.delete_index`) and its residual filter: what is left of
   the row filter once the file's partition is known (strict projection).

Step 3 is lazy: a :class:`ScanPlan` keeps the selected rows per manifest and builds tasks
for the range a caller asks for, so a server paging through a million-file scan never holds
a million task objects.

Besides point-in-time scans (current snapshot, a snapshot id, a branch or tag, or the
snapshot current at a timestamp), incremental append scans return the data files added by
the ``append`` snapshots after ``start_snapshot_id`` (exclusive) up to ``end_snapshot_id``
(inclusive), as Java's ``IncrementalAppendScan`` does: without delete files, since an append
adds none.
"""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from icefloe.binding import bind
from icefloe.datafile import DataFile
from icefloe.delete_index import DeleteFileIndex
from icefloe.errors import NotFoundError, ValidationError
from icefloe.evaluators import ManifestEvaluator
from icefloe.expressions import AlwaysTrue, BooleanExpression, is_bound, rewrite_not
from icefloe.manifest_cache import CachedManifest, FilePruner, PruneCounts
from icefloe.manifest_list import ManifestContent, ManifestFile
from icefloe.metadata import TableMetadata
from icefloe.partition import PartitionSpec
from icefloe.projection import ResidualEvaluator, inclusive_projection
from icefloe.schema import Schema
from icefloe.snapshot import Operation, Snapshot
from icefloe.types import NestedType, walk_fields


class ManifestSource(Protocol):
    """Where a plan gets manifest lists and decoded manifests (a :class:`ManifestCache`)."""

    async def manifest_list(self, snapshot: Snapshot) -> list[ManifestFile]: ...

    async def manifests(
        self,
        manifests: Sequence[ManifestFile],
        specs: Mapping[int, PartitionSpec],
        schema: Schema,
    ) -> list[CachedManifest]: ...


@dataclass(frozen=True, slots=True)
class FileScanTask:
    """One data file to read, the delete files to apply to it, and the filter left to apply."""

    data_file: DataFile
    delete_files: tuple[DataFile, ...]
    residual: BooleanExpression
    data_sequence_number: int


@dataclass
class ScanMetrics:
    """What planning did, for logs, metrics and tests that metrics prune."""

    manifests: int = 0
    manifests_skipped: int = 0
    data_files: PruneCounts = field(default_factory=PruneCounts)
    delete_files: PruneCounts = field(default_factory=PruneCounts)

    @property
    def files_selected(self) -> int:
        return self.data_files.selected


@dataclass(frozen=True, slots=True)
class _Segment:
    manifest: CachedManifest
    rows: Any  # int64 Arrow array of row indices


class ScanPlan:
    """A planned scan. ``len(plan)`` is the number of data files; :meth:`tasks` builds the
    tasks of any range on demand (and is safe to call from worker threads)."""

    def __init__(
        self,
        *,
        metadata: TableMetadata,
        snapshot: Snapshot | None,
        schema: Schema,
        projected_schema: Schema,
        row_filter: BooleanExpression,
        case_sensitive: bool,
        stats_field_ids: frozenset[int],
        incremental: bool,
        segments: list[_Segment],
        deletes: DeleteFileIndex,
        metrics: ScanMetrics,
    ) -> None:
        self.metadata = metadata
        self.snapshot = snapshot
        self.schema = schema
        self.projected_schema = projected_schema
        self.row_filter = row_filter
        self.case_sensitive = case_sensitive
        self.stats_field_ids = stats_field_ids
        self.incremental = incremental
        self.metrics = metrics
        self.deletes = deletes
        self._segments = segments
        self._starts: list[int] = []
        total = 0
        for s in segments:
            self._starts.append(total)
            total += len(s.rows)
        self._count = total
        self._residuals: dict[int, ResidualEvaluator] = {}

    @property
    def nbytes(self) -> int:
        """Memory the plan holds: the selected rows' columns (see CachedManifest.compact)."""
        return sum(s.manifest.nbytes for s in self._segments) + 64 * len(self._segments)

    @property
    def specs(self) -> dict[int, PartitionSpec]:
        return self.metadata.specs()

    def __len__(self) -> int:
        return self._count

    def tasks(
        self, start: int = 0, stop: int | None = None, *, with_metrics: bool = True
    ) -> list[FileScanTask]:
        """Tasks ``start`` to ``stop`` (exclusive) in plan order (manifest order).

        ``with_metrics=False`` builds data files without their column metric maps (for a
        response that returns no column stats)."""
        stop = self._count if stop is None else min(stop, self._count)
        start = max(0, start)
        out: list[FileScanTask] = []
        if start >= stop:
            return out
        index = bisect.bisect_right(self._starts, start) - 1
        position = start
        while position < stop and index < len(self._segments):
            segment = self._segments[index]
            first = position - self._starts[index]
            last = min(len(segment.rows), stop - self._starts[index])
            rows = segment.manifest.rows(
                segment.rows.slice(first, last - first), with_metrics=with_metrics
            )
            residual = self._residual(segment.manifest.spec_id)
            for f, seq in zip(rows.data_files, rows.data_sequence_numbers):
                out.append(
                    FileScanTask(
                        data_file=f,
                        delete_files=tuple(self.deletes.for_data_file(f, seq)),
                        residual=residual.residual_for(f.partition),
                        data_sequence_number=seq,
                    )
                )
            position += last - first
            index += 1
        return out

    def _residual(self, spec_id: int) -> ResidualEvaluator:
        found = self._residuals.get(spec_id)
        if found is None:
            spec = self.specs[spec_id]
            found = ResidualEvaluator(spec, self.row_filter, self.schema, self.case_sensitive)
            self._residuals[spec_id] = found
        return found


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
# Planning
# ---------------------------------------------------------------------------------------------


async def plan_scan(
    metadata: TableMetadata,
    source: ManifestSource,
    *,
    snapshot_id: int | None = None,
    ref: str | None = None,
    as_of_ms: int | None = None,
    start_snapshot_id: int | None = None,
    end_snapshot_id: int | None = None,
    row_filter: BooleanExpression | None = None,
    case_sensitive: bool = True,
    select: Sequence[str] | None = None,
    use_snapshot_schema: bool = False,
    stats_fields: Sequence[str] | None = None,
    include_empty_files: bool = False,
    offload: bool = True,
) -> ScanPlan:
    """Plan a scan of ``metadata``'s table (see the module docstring).

    ``start_snapshot_id``/``end_snapshot_id`` make an incremental append scan and exclude
    the point-in-time selectors. Raises :class:`ValidationError` for a malformed request
    (a filter, selection or stats field naming an unknown column, conflicting selectors) and
    :class:`NotFoundError` for an unknown snapshot, ref or time. With ``offload`` the
    CPU-bound pruning runs in a worker thread, so an event loop calling this stays free.
    """
    incremental = start_snapshot_id is not None or end_snapshot_id is not None
    if incremental:
        point_in_time = [
            n
            for n, v in (
                ("snapshot-id", snapshot_id),
                ("ref", ref),
                ("as-of-timestamp-ms", as_of_ms),
            )
            if v is not None
        ]
        if point_in_time:
            raise ValidationError(
                f"an incremental scan (start/end-snapshot-id) cannot also use {point_in_time}"
            )
        if end_snapshot_id is None:
            raise ValidationError("end-snapshot-id is required with start-snapshot-id")
        snapshot: Snapshot | None = metadata.snapshot_by_id(end_snapshot_id)
        appends = append_snapshots(metadata, start_snapshot_id, end_snapshot_id)
    else:
        snapshot = resolve_snapshot(metadata, snapshot_id=snapshot_id, ref=ref, as_of_ms=as_of_ms)
        appends = []
    schema = scan_schema(metadata, snapshot, use_snapshot_schema)
    expr = row_filter if row_filter is not None else AlwaysTrue()

    def prepare() -> tuple[BooleanExpression, Schema, frozenset[int]]:
        # Binding a filter of a hundred thousand literals takes a while: off the loop.
        bound = rewrite_not(expr if is_bound(expr) else bind(schema, expr, case_sensitive))
        projected = schema.select(list(select), case_sensitive) if select else schema
        stats_ids = (
            field_ids_of(schema, stats_fields, case_sensitive, "stats-fields")
            if stats_fields
            else frozenset()
        )
        return bound, projected, stats_ids

    if offload and row_filter is not None:
        bound, projected, stats_ids = await asyncio.to_thread(prepare)
    else:
        bound, projected, stats_ids = prepare()
    specs = metadata.specs()
    metrics = ScanMetrics()
    deletes = DeleteFileIndex(specs, schema)

    def plan(segments: list[_Segment]) -> ScanPlan:
        return ScanPlan(
            metadata=metadata,
            snapshot=snapshot,
            schema=schema,
            projected_schema=projected,
            row_filter=bound,
            case_sensitive=case_sensitive,
            stats_field_ids=stats_ids,
            incremental=incremental,
            segments=segments,
            deletes=deletes,
            metrics=metrics,
        )

    if snapshot is None:
        return plan([])

    partition_filters: dict[int, BooleanExpression] = {}
    evaluators: dict[int, ManifestEvaluator] = {}

    def partition_filter(spec_id: int) -> BooleanExpression:
        found = partition_filters.get(spec_id)
        if found is None:
            spec = specs.get(spec_id)
            if spec is None:
                raise ValidationError(
                    f"table {metadata.location} has no partition spec {spec_id}, which a "
                    "manifest of the snapshot uses"
                )
            found = inclusive_projection(schema, spec, case_sensitive)(bound)
            partition_filters[spec_id] = found
        return found

    def manifest_may_match(m: ManifestFile) -> bool:
        evaluator = evaluators.get(m.partition_spec_id)
        if evaluator is None:
            projected_filter = partition_filter(m.partition_spec_id)  # checks the spec exists
            partition_type = specs[m.partition_spec_id].partition_type(schema)
            evaluator = ManifestEvaluator(partition_type, projected_filter)
            evaluators[m.partition_spec_id] = evaluator
        return evaluator.eval(m)

    range_ids: frozenset[int] | None = None
    if incremental:
        range_ids = frozenset(s.snapshot_id for s in appends)
        listed: dict[str, ManifestFile] = {}
        for s in appends:
            for m in await source.manifest_list(s):
                if (
                    m.content == ManifestContent.DATA
                    and m.added_snapshot_id in range_ids
                    and m.has_added_files
                ):
                    listed.setdefault(m.manifest_path, m)
        candidates = list(listed.values())
    else:
        candidates = [m for m in await source.manifest_list(snapshot) if _has_live_files(m)]

    metrics.manifests = len(candidates)
    data_manifests: list[ManifestFile] = []
    delete_manifests: list[ManifestFile] = []

    def split() -> None:
        # Projecting the filter onto each spec and testing the summaries: CPU work.
        for m in candidates:
            if not manifest_may_match(m):
                metrics.manifests_skipped += 1
            elif m.content == ManifestContent.DATA:
                data_manifests.append(m)
            else:
                delete_manifests.append(m)

    if offload and (row_filter is not None or len(candidates) > 64):
        await asyncio.to_thread(split)
    else:
        split()

    loaded_data = await source.manifests(data_manifests, specs, schema)
    loaded_deletes = await source.manifests(delete_manifests, specs, schema)

    def prune() -> ScanPlan:
        data_pruners: dict[int, FilePruner] = {}
        delete_pruners: dict[int, FilePruner] = {}
        for cached in loaded_deletes:
            pruner = delete_pruners.get(cached.spec_id)
            if pruner is None:
                # Partition values only: a delete file's metrics describe deleted rows, and
                # ruling one out by the row filter would need the equality columns alone.
                pruner = FilePruner(schema, partition_filter(cached.spec_id), None)
                delete_pruners[cached.spec_id] = pruner
            rows = cached.rows(pruner.select(cached))
            for f, seq in zip(rows.data_files, rows.data_sequence_numbers):
                deletes.add(f, seq)
        segments: list[_Segment] = []
        for cached in loaded_data:
            pruner = data_pruners.get(cached.spec_id)
            if pruner is None:
                pruner = FilePruner(
                    schema,
                    partition_filter(cached.spec_id),
                    bound,
                    include_empty_files=include_empty_files,
                )
                data_pruners[cached.spec_id] = pruner
            if incremental:
                selected = pruner.select(cached, which="added", snapshot_ids=range_ids)
            else:
                selected = pruner.select(cached)
            if len(selected):
                kept = cached.compact(selected)  # a held plan must not pin the manifest
                segments.append(_Segment(kept, kept.row_numbers()))
        _sum_counts(metrics.data_files, data_pruners.values())
        _sum_counts(metrics.delete_files, delete_pruners.values())
        return plan(segments)

    if offload:
        return await asyncio.to_thread(prune)
    return prune()


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
    "ScanPlan",
    "append_snapshots",
    "field_ids_of",
    "plan_scan",
    "resolve_snapshot",
    "scan_schema",
]
