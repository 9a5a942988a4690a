"""A planned scan: the selected rows of cached manifests, their deletes, tasks on demand.

:func:`icefloe.scan.planning.plan_scan` leaves the files it selected where pruning found them, as
compact Arrow copies of their manifests' rows (:meth:`CachedManifest.compact`), beside the
snapshot's delete-file index. Nothing per file is built until a caller asks for a range:

* :meth:`ScanPlan.tasks` builds :class:`FileScanTask` objects (a ``DataFile`` each, its
  deletes and residual filter) for library callers such as the Spark reader;
* :meth:`ScanPlan.pieces` hands out the Arrow rows of a range, from which
  :mod:`icefloe.scan.tasks_json` writes the REST ``file-scan-tasks`` JSON column by column,
  without a Python object per file.

So a server paging through a million-file scan never holds a million task objects.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from icefloe.deletes.index import DeleteFileIndex
from icefloe.expressions import BooleanExpression
from icefloe.expressions.projection import ResidualEvaluator
from icefloe.manifests.cached import CachedManifest
from icefloe.manifests.file_pruner import PruneCounts
from icefloe.spec.datafile import DataFile
from icefloe.spec.metadata import TableMetadata
from icefloe.spec.partition import PartitionSpec
from icefloe.spec.schema import Schema
from icefloe.spec.snapshot import Snapshot


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
class Segment:
    """Selected rows of one manifest: a compact copy and the row indices within it."""

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
        segments: list[Segment],
        deletes: DeleteFileIndex,
        metrics: ScanMetrics,
        residuals: dict[int, ResidualEvaluator] | None = None,
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
        self.specs: dict[int, PartitionSpec] = metadata.specs()
        self._segments = segments
        self._starts: list[int] = []
        total = 0
        for s in segments:
            self._starts.append(total)
            total += len(s.rows)
        self._count = total
        # Residual evaluators per spec id; plans with the same filter may share them.
        self._residuals: dict[int, ResidualEvaluator] = {} if residuals is None else residuals
        # Serialized residuals by the identity of the residual object (kept alive here, so
        # an id is never reused while cached), for writers of the plan's pages: a residual
        # shared by every task of the plan is written once (icefloe.scan.tasks_json).
        self.residual_texts: dict[int, tuple[BooleanExpression, str | None]] = {}
        self.residual_text_bytes = 0  # their length, bounded by their writer

    @property
    def nbytes(self) -> int:
        """Bytes of the manifests the plan keeps alive (see :meth:`manifests`), each counted
        once. They may be shared: a full scan's are the cache's own entries, and two full
        plans of a table hold the same ones, so a holder of several plans counts their
        manifests together (``ManifestCache.pin``) rather than adding these figures up."""
        return sum(m.nbytes for m in self.manifests()) + 64 * len(self._segments)

    def manifests(self) -> list[CachedManifest]:
        """The distinct manifests the plan's rows are in: the cached manifest itself where
        every row of it was selected, a compact copy of the selected rows otherwise."""
        seen: dict[int, CachedManifest] = {}
        for s in self._segments:
            seen.setdefault(id(s.manifest), s.manifest)
        return list(seen.values())

    def __len__(self) -> int:
        return self._count

    def pieces(
        self, start: int = 0, stop: int | None = None
    ) -> Iterator[tuple[CachedManifest, Any]]:
        """The rows of tasks ``start`` to ``stop`` (exclusive), in plan order, as pairs of a
        manifest and an int64 array of its row indices (one pair per manifest touched)."""
        stop = self._count if stop is None else min(stop, self._count)
        start = max(0, start)
        if start >= stop:
            return
        index = bisect.bisect_right(self._starts, start) - 1
        position = start
        while position < stop and index < len(self._segments):
            segment = self._segments[index]
            first = position - self._starts[index]
            last = min(len(segment.rows), stop - self._starts[index])
            yield segment.manifest, segment.rows.slice(first, last - first)
            position += last - first
            index += 1

    def tasks(
        self, start: int = 0, stop: int | None = None, *, with_metrics: bool = True
    ) -> list[FileScanTask]:
        """Tasks ``start`` to ``stop`` (exclusive) in plan order (manifest order).

        ``with_metrics=False`` builds data files without their column metric maps (for a
        response that returns no column stats)."""
        out: list[FileScanTask] = []
        for manifest, rows in self.pieces(start, stop):
            decoded = manifest.rows(rows, with_metrics=with_metrics)
            residual = self.residual_evaluator(manifest.spec_id)
            for f, seq in zip(decoded.data_files, decoded.data_sequence_numbers):
                out.append(
                    FileScanTask(
                        data_file=f,
                        delete_files=tuple(self.deletes.for_data_file(f, seq)),
                        residual=residual.residual_for(f.partition),
                        data_sequence_number=seq,
                    )
                )
        return out

    def residual_evaluator(self, spec_id: int) -> ResidualEvaluator:
        """The residual evaluator of the plan's filter for partition spec ``spec_id``."""
        found = self._residuals.get(spec_id)
        if found is None:
            spec = self.specs[spec_id]
            found = ResidualEvaluator(spec, self.row_filter, self.schema, self.case_sensitive)
            self._residuals[spec_id] = found
        return found


__all__ = ["FileScanTask", "ScanMetrics", "ScanPlan", "Segment"]
