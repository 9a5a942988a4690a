"""Which live manifest entries a commit needs, asked of Arrow columns or of entry objects.

A commit looks a few files up in a table of millions: the live entries of the data files a
row delta deletes rows from, the deletes those files already have, the deletes committed
since a rewrite was planned. Decoding every entry of every manifest into Python objects to
find them (what :meth:`~icefloe.manifests.reader.ManifestReader.entries` does) costs more
than everything else in the commit. An :class:`EntryQuery` states the selection once and
evaluates it two ways: :meth:`EntryQuery.mask` over the planner's decoded columns
(:class:`~icefloe.manifests.cached.CachedManifest`, with Arrow kernels), which is what the
commit path uses, and :meth:`EntryQuery.matches` per entry, the reference the tests compare
it with. Only the hits become objects.

:func:`summaries_may_contain` prunes whole manifests before any of that, by the manifest
list's partition summaries, when the partitions of the wanted files are known: deletes
apply only within their data file's partition (spec: "Scan Planning"), so the deletes of a
data file live in manifests whose summaries admit that file's partition.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from icefloe.deletes.index import is_deletion_vector
from icefloe.manifests.cached import CachedManifest
from icefloe.manifests.manifest import ManifestEntry, ManifestEntryStatus
from icefloe.manifests.manifest_list import ManifestFile, PartitionFieldSummary
from icefloe.spec.datafile import DataFileContent, FileFormat
from icefloe.spec.types import IcebergType, StructType
from icefloe.spec.values import from_bytes


@dataclass(frozen=True)
class EntryQuery:
    """Live entries matching any given selector (every live entry when none is given),
    and, when ``newer_than`` is set, whose data sequence number is above it.

    - ``paths``: entries whose ``file_path`` is one of these;
    - ``referenced``: position deletes (files or DVs) whose ``referenced_data_file`` is one
      of these;
    - ``unscoped_position_deletes``: position delete files that name no data file (they may
      hold positions of any file in their partition).
    """

    paths: frozenset[str] = frozenset()
    referenced: frozenset[str] = frozenset()
    unscoped_position_deletes: bool = False
    newer_than: int | None = None

    def _selects_all(self) -> bool:
        return not self.paths and not self.referenced and not self.unscoped_position_deletes

    def matches(self, entry: ManifestEntry) -> bool:
        """The reference: does this entry object match?"""
        if not entry.is_live:
            return False
        if self.newer_than is not None and (
            entry.sequence_number is None or entry.sequence_number <= self.newer_than
        ):
            return False
        if self._selects_all():
            return True
        f = entry.data_file
        if f.file_path in self.paths:
            return True
        if f.content != DataFileContent.POSITION_DELETES:
            return False
        if f.referenced_data_file is not None:
            return f.referenced_data_file in self.referenced
        return self.unscoped_position_deletes and not is_deletion_vector(f)

    def mask(self, m: CachedManifest) -> Any:
        """The same selection over a decoded manifest: a boolean array, one per row."""
        status = m.column("status")
        mask = pc.not_equal(status, pa.scalar(int(ManifestEntryStatus.DELETED), pa.int8()))
        if self.newer_than is not None:
            seq = m.column("data_sequence_number")
            mask = pc.and_(mask, pc.fill_null(pc.greater(seq, self.newer_than), False))
        if self._selects_all():
            return mask
        picked = pa.repeat(pa.scalar(False), m.num_rows)
        if self.paths:
            picked = pc.is_in(m.column("file_path"), value_set=_strings(self.paths))
        position = pc.equal(m.column("content"), int(DataFileContent.POSITION_DELETES))
        referenced = m.column("referenced_data_file")
        if self.referenced:
            named = pc.is_in(referenced, value_set=_strings(self.referenced))
            picked = pc.or_(picked, pc.and_(position, named))
        if self.unscoped_position_deletes:
            # is_deletion_vector: puffin format, or a content offset
            dv = pc.or_(
                pc.equal(m.column("file_format").cast(pa.string()), FileFormat.PUFFIN),
                pc.is_valid(m.column("content_offset")),
            )
            unscoped = pc.and_(pc.and_(position, pc.is_null(referenced)), pc.invert(dv))
            picked = pc.or_(picked, unscoped)
        return pc.and_(mask, pc.fill_null(picked, False))


def _strings(values: Iterable[str]) -> Any:
    return pa.array(sorted(values), pa.string())


def entries_at(
    m: CachedManifest, indices: Any, *, with_metrics: bool = True
) -> list[ManifestEntry]:
    """Entry objects of the given rows of a decoded manifest (inherited values filled in,
    as :func:`~icefloe.manifests.manifest.read_manifest` fills them); ``with_metrics=False`` leaves
    the column metric maps out (see :meth:`CachedManifest.rows`)."""
    take = indices if isinstance(indices, pa.Array) else pa.array(indices, pa.int64())
    if not len(take):
        return []
    files = m.rows(take, with_metrics=with_metrics).data_files
    status = pc.take(m.column("status"), take).to_pylist()
    snapshots = pc.take(m.column("snapshot_id"), take).to_pylist()
    data_seqs = pc.take(m.column("data_sequence_number"), take).to_pylist()
    file_seqs = pc.take(m.column("file_sequence_number"), take).to_pylist()
    return [
        ManifestEntry(ManifestEntryStatus(s), snap, dseq, fseq, f)
        for s, snap, dseq, fseq, f in zip(status, snapshots, data_seqs, file_seqs, files)
    ]


def selected_entries(
    m: CachedManifest, query: EntryQuery, *, with_metrics: bool = True
) -> list[ManifestEntry]:
    """The entries of ``m`` the query selects, in manifest order."""
    indices = pc.indices_nonzero(query.mask(m))
    return entries_at(m, indices, with_metrics=with_metrics)


def entry_paths(m: CachedManifest, *, live_only: bool = True) -> list[str]:
    """Paths of the entries (the live ones with ``live_only``) of a decoded manifest."""
    column = m.column("file_path")
    if live_only:
        column = column.filter(m.status_mask("live"))
    paths: list[str] = column.to_pylist()
    return paths


# ---------------------------------------------------------------------------------------------
# Manifest pruning by the manifest list's partition summaries
# ---------------------------------------------------------------------------------------------


def summaries_may_contain(
    manifest: ManifestFile,
    partition_type: StructType,
    partitions: Iterable[tuple[Any, ...]],
) -> bool:
    """May ``manifest`` hold an entry in one of ``partitions`` (tuples of internal values of
    the manifest's spec)? False only when its summaries rule every one of them out; a
    missing or unreadable summary rules nothing out."""
    summaries = manifest.partitions
    fields = partition_type.fields
    if summaries is None or len(summaries) != len(fields):
        return True
    for partition in partitions:
        if len(partition) != len(fields):
            return True
        if all(
            _field_may_contain(s, f.field_type, v) for s, f, v in zip(summaries, fields, partition)
        ):
            return True
    return False


def _field_may_contain(s: PartitionFieldSummary, t: IcebergType, value: Any) -> bool:
    if value is None:
        return bool(s.contains_null)
    if isinstance(value, float) and math.isnan(value):
        return s.contains_nan is not False
    if s.lower_bound is None or s.upper_bound is None:
        return True  # all null or NaN, or not recorded: nothing to compare with
    try:
        lower = from_bytes(t, s.lower_bound)  # type: ignore[arg-type]
        upper = from_bytes(t, s.upper_bound)  # type: ignore[arg-type]
        return bool(lower <= value <= upper)
    except Exception:  # an undecodable bound or incomparable values: cannot rule out
        return True


__all__ = [
    "EntryQuery",
    "entries_at",
    "entry_paths",
    "selected_entries",
    "summaries_may_contain",
]
