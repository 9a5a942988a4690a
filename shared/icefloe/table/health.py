"""How healthy a table is: the figures that tell whether it needs maintenance.

Streaming ingestion degrades a table in a few measurable ways: many small data files (slow
scans, big manifests), delete files that every reader must apply, many manifests (slow
planning), many snapshots and a large metadata file (slow commits and loads). One pass over
the current snapshot's manifest list and manifests computes them all; the coordinator
publishes them as per-table metrics and ``icefloe table health`` prints them, beside what
maintenance would do next (:mod:`icefloe.table.maintenance_policy`).

A data file counts as *small* below the compaction policy's minimum size (75 % of
``write.target-file-size-bytes`` unless ``icefloe.compaction.min-file-size-bytes`` says
otherwise), so the figure means "files a compaction would pick for their size". A manifest
counts as small below a quarter of ``commit.manifest.target-size-bytes``.

Upserts leave rows deleted by position behind them (deletion vectors on v3, position delete
files on v2): ``deleted_rows`` counts them (the record counts of the live DVs and position
delete files), ``deleted_row_ratio`` is their share of the rows stored in live data files
(what every reader reads and then drops), and ``deletion_vectors`` / ``deletion_vector_bytes``
count the DV blobs and their bytes. A v3 DV is exact (one per data file, its cardinality);
on v2 two position delete files may name the same row, so the figure is an upper bound there.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

from icefloe.deletes.index import is_deletion_vector
from icefloe.errors import NotFoundError
from icefloe.manifests.manifest_list import ManifestContent
from icefloe.manifests.reader import ManifestReader
from icefloe.spec.datafile import DataFileContent
from icefloe.spec.snapshot import MAIN_BRANCH
from icefloe.table.catalog import Table
from icefloe.table.compaction import CompactionPolicy
from icefloe.table.snapshot_producer import MANIFEST_TARGET_SIZE, MANIFEST_TARGET_SIZE_DEFAULT

SMALL_MANIFEST_FRACTION = 4
"""A manifest below ``target-size / SMALL_MANIFEST_FRACTION`` counts as small."""


@dataclass(slots=True)
class TableHealth:
    """Health figures of one table's branch head (zeros for a table without snapshots)."""

    table: str
    snapshot_id: int | None
    format_version: int
    data_files: int = 0
    data_bytes: int = 0
    records: int = 0
    small_files: int = 0
    small_file_threshold_bytes: int = 0
    target_file_size_bytes: int = 0
    delete_files: int = 0
    position_delete_files: int = 0
    equality_delete_files: int = 0
    delete_records: int = 0
    deleted_rows: int = 0
    deletion_vectors: int = 0
    deletion_vector_bytes: int = 0
    manifests: int = 0
    data_manifests: int = 0
    delete_manifests: int = 0
    small_manifests: int = 0
    manifest_bytes: int = 0
    snapshots: int = 0
    oldest_snapshot_age_ms: int = 0
    metadata_file_bytes: int = 0
    metadata_log_entries: int = 0

    @property
    def average_file_size_bytes(self) -> float:
        return self.data_bytes / self.data_files if self.data_files else 0.0

    @property
    def small_file_ratio(self) -> float:
        return self.small_files / self.data_files if self.data_files else 0.0

    @property
    def deleted_row_ratio(self) -> float:
        """Rows deleted by position per row stored in live data files (0 to 1 on v3)."""
        return min(1.0, self.deleted_rows / self.records) if self.records else 0.0

    @property
    def small_manifest_ratio(self) -> float:
        return self.small_manifests / self.manifests if self.manifests else 0.0

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["average_file_size_bytes"] = round(self.average_file_size_bytes, 1)
        out["small_file_ratio"] = round(self.small_file_ratio, 4)
        out["small_manifest_ratio"] = round(self.small_manifest_ratio, 4)
        out["deleted_row_ratio"] = round(self.deleted_row_ratio, 4)
        return out


async def table_health(
    table: Table,
    *,
    branch: str = MAIN_BRANCH,
    reader: ManifestReader | None = None,
    now_ms: int | None = None,
) -> TableHealth:
    """The health figures of ``table`` (its ``branch`` head), from metadata and manifests."""
    metadata = table.metadata
    now = now_ms if now_ms is not None else int(time.time() * 1000)
    policy = CompactionPolicy.for_table(metadata)
    snapshot = metadata.snapshot_by_ref(branch)
    health = TableHealth(
        table=str(table.identifier),
        snapshot_id=None if snapshot is None else snapshot.snapshot_id,
        format_version=metadata.format_version,
        small_file_threshold_bytes=policy.min_file_size_bytes,
        target_file_size_bytes=policy.target_file_size_bytes,
        snapshots=len(metadata.snapshots),
        metadata_log_entries=len(metadata.metadata_log),
    )
    if metadata.snapshots:
        oldest = min(s.timestamp_ms for s in metadata.snapshots)
        health.oldest_snapshot_age_ms = max(0, now - oldest)
    if table.metadata_location:
        try:
            health.metadata_file_bytes = await table.io.size(table.metadata_location)
        except NotFoundError:
            health.metadata_file_bytes = 0
    if snapshot is None:
        return health
    reader = reader or ManifestReader(table.io)
    small_manifest = (
        metadata.int_property(MANIFEST_TARGET_SIZE, MANIFEST_TARGET_SIZE_DEFAULT)
        // SMALL_MANIFEST_FRACTION
    )
    specs = metadata.specs()
    for manifest in await reader.manifests(snapshot):
        health.manifests += 1
        health.manifest_bytes += manifest.manifest_length
        if manifest.content == ManifestContent.DATA:
            health.data_manifests += 1
        else:
            health.delete_manifests += 1
        if manifest.manifest_length < small_manifest:
            health.small_manifests += 1
        for e in await reader.entries(manifest, specs, live_only=True):
            f = e.data_file
            if f.content == DataFileContent.DATA:
                health.data_files += 1
                health.data_bytes += f.file_size_in_bytes
                health.records += f.record_count
                if f.file_size_in_bytes < policy.min_file_size_bytes:
                    health.small_files += 1
            else:
                health.delete_files += 1
                health.delete_records += f.record_count
                if f.content == DataFileContent.POSITION_DELETES:
                    health.position_delete_files += 1
                    health.deleted_rows += f.record_count
                    if is_deletion_vector(f):
                        health.deletion_vectors += 1
                        health.deletion_vector_bytes += f.content_size_in_bytes or 0
                else:
                    health.equality_delete_files += 1
    return health


__all__ = ["SMALL_MANIFEST_FRACTION", "TableHealth", "table_health"]
