"""Snapshot operations: turn a base table into a new snapshot, again on every retry.

One class does the work for every operation, because they differ only in what they add,
what they remove and what they must verify on the base they are applied to:

=================  ===========================================  =============================
operation          changes                                      validation on each base
=================  ===========================================  =============================
append             adds data files                              none: appends always apply
overwrite          adds data files, removes files by path or    removed paths still live
                   by a row filter
delete             removes files by path or by a row filter     removed paths still live
row delta          adds data and delete files (v2+); deleted      deleted rows' data files
                   positions as deletion vectors on v3 (merged      still live
                   with the DV or position deletes each data
                   file has), as position delete files on v2
rewrite            replaces files with files of the same rows   every replaced file still live;
                                                                no delete newer than the
                                                                starting snapshot applies to
                                                                a replaced data file
=================  ===========================================  =============================

A rewrite (compaction) is validated as Java's ``RewriteFiles`` is, by sequence number: the
new files hold the rows of the replaced ones as of the snapshot the rewrite was planned on
(:meth:`SnapshotProducer.validate_from_snapshot`), and commit with a newer sequence number
than any delete committed since, so such a delete would silently stop applying and deleted
rows would come back. Every live delete file whose data sequence number is above the
starting snapshot's is indexed (:class:`~icefloe.deletes.index.DeleteFileIndex`, the
spec's scope rules), and the rewrite fails with a ValidationConflictError when one applies
to a replaced data file. A concurrent overwrite or delete that removed a replaced file is
caught by the "still live" check.

Manifests of new files are written once and reused by every attempt: their entries leave
sequence numbers null, to be inherited from the manifest list of whichever attempt commits,
and the snapshot id is fixed for the operation's lifetime. Only the manifests that depend
on the base (rewritten or merged ones) and the manifest list are written per attempt. The
snapshot id doubles as the marker that resolves an unknown commit outcome.

Why one module past 800 lines: the operations share one producer (above), whose retry loop,
manifest reuse and validation are the point; split by operation, each would repeat them.
"""

from __future__ import annotations

import io as _io
import logging
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from collections.abc import Set as AbstractSet
from typing import Any

import numpy as np

from icefloe.deletes.deletion_vector import (
    DeletionVector,
    build_deletion_vector_file,
    positions_in_delete_file,
    read_deletion_vector,
)
from icefloe.deletes.deletion_vector_cache import DeletionVectorCache, cache_key
from icefloe.deletes.index import DeleteFileIndex, is_deletion_vector
from icefloe.deletes.position_delete_file import build_position_delete_file
from icefloe.errors import CommitFailedError, ValidationConflictError, ValidationError
from icefloe.manifests.entry_query import EntryQuery, summaries_may_contain
from icefloe.manifests.manifest import ManifestEntry, ManifestEntryStatus, ManifestWriter
from icefloe.manifests.manifest_list import (
    UNASSIGNED_SEQ,
    ManifestContent,
    ManifestFile,
    write_manifest_list,
)
from icefloe.manifests.reader import ManifestReader
from icefloe.spec.datafile import DataFile, DataFileContent
from icefloe.spec.metadata import TableMetadata
from icefloe.spec.metadata_builder import MetadataBuilder
from icefloe.spec.partition import PartitionSpec
from icefloe.spec.snapshot import (
    MAIN_BRANCH,
    Operation,
    Snapshot,
    SnapshotRef,
    Summary,
    update_totals,
)
from icefloe.table.catalog import Table, data_dir, metadata_dir
from icefloe.table.commit import CommitStats, RetryPolicy, commit_with_retry

log = logging.getLogger(__name__)

MERGE_ENABLED = "commit.manifest-merge.enabled"
MERGE_MIN_COUNT = "commit.manifest.min-count-to-merge"
MANIFEST_TARGET_SIZE = "commit.manifest.target-size-bytes"
MERGE_ENABLED_DEFAULT = True
MERGE_MIN_COUNT_DEFAULT = 100
MANIFEST_TARGET_SIZE_DEFAULT = 8 << 20

# One entry to write: its status, its file, and the entry it carries over (None: new).
_Row = tuple[ManifestEntryStatus, DataFile, ManifestEntry | None]

# A filter deciding, per live file, whether the operation removes it: True removes it, False
# keeps it, and a raised ValidationError refuses the whole operation (a file only partly
# matching a row filter cannot be removed without rewriting it).
FileFilter = Callable[[DataFile, TableMetadata], bool]


class SnapshotProducer:
    """Builds (and commits) one snapshot. Configure with the ``add_*``/``delete_*`` calls.

    ``snapshot_id`` may be given to make the snapshot recognisable across processes (the
    coordinator derives it from what it commits); otherwise a fresh one is drawn.
    """

    def __init__(
        self,
        table: Table,
        operation: Operation,
        *,
        branch: str = MAIN_BRANCH,
        snapshot_properties: Mapping[str, str] | None = None,
        snapshot_id: int | None = None,
        merge_manifests: bool | None = None,
        merge_min_count: int | None = None,
        validate_deleted_paths: bool = True,
        reader: ManifestReader | None = None,
        deletion_vectors: DeletionVectorCache | None = None,
    ) -> None:
        self.table = table
        self.operation = operation
        self.branch = branch
        self.snapshot_properties = dict(snapshot_properties or {})
        self.snapshot_id = snapshot_id or table.metadata.new_snapshot_id()
        self.merge_manifests = merge_manifests
        self.merge_min_count = merge_min_count
        self.validate_deleted_paths = validate_deleted_paths
        self.reader = reader or ManifestReader(table.io)
        self.stats = CommitStats()
        self._added: list[DataFile] = []
        # v3 deletes: new positions per data file path, and DVs written by the caller. Both
        # are merged at build time with whatever deletes the base holds for that file.
        self._dv_positions: dict[str, tuple[DataFile, DeletionVector]] = {}
        self._added_dvs: list[DataFile] = []
        # Positions of the base's deletes (and of the DVs attempts write), by the immutable
        # bytes holding them: a caller committing again and again (the coordinator) passes
        # one cache for all its commits (icefloe.deletes.deletion_vector_cache).
        self._old_deletes = (
            deletion_vectors if deletion_vectors is not None else (DeletionVectorCache())
        )
        self._doomed_keys: set[tuple[str, int | None]] = set()
        self._known_live: tuple[int | None, Mapping[str, DataFile]] | None = None
        self._parent_id: int | None = None  # the snapshot the current attempt builds on
        # Manifests holding the deletes in _doomed_keys (found with them, per attempt).
        self._doomed_manifests: set[str] = set()
        self._deleted_paths: set[str] = set()
        self._delete_filter: FileFilter | None = None
        self._new_manifests: list[ManifestFile] | None = None
        self._written: list[str] = []  # every file any attempt wrote, for clean-up
        # Delete files written per attempt (DV Puffin files, v2 position delete files): kept
        # after the commit only if the committed snapshot's own delete manifests name them.
        self._attempt_deletes: set[str] = set()
        # Per manifest list written: the delete files that attempt wrote (all of which its
        # delete manifests name), so the committed one is known without reading it back.
        self._deletes_of_list: dict[str, frozenset[str]] = {}
        self._this_attempt_deletes: set[str] = set()
        # The last attempt's manifest list, with the files it adds and the paths of the
        # entries it removes (see changes_of).
        self._changes_of_list: dict[str, tuple[list[DataFile], list[str]]] = {}
        # Manifest bytes by path, kept only when the reader has a writer to persist them with.
        self._manifest_bytes: dict[str, bytes] = {}
        # What each delete manifest any attempt wrote holds, by path: the committed ones'
        # entries go to the reader's cache (see _remember_deletes).
        self._delete_rows: dict[str, list[_Row]] = {}
        self._attempts = 0
        # The branch head the operation was planned on: a rewrite must see every delete
        # committed after it (see _check_no_new_deletes).
        start = (
            table.metadata.snapshot_by_ref(branch)
            if branch in table.metadata.refs
            else table.metadata.current_snapshot()  # where a new branch forks (see build)
        )
        self._start_snapshot_id = start.snapshot_id if start is not None else None

    # -- configuration -------------------------------------------------------------------

    def add_file(self, data_file: DataFile) -> SnapshotProducer:
        version = self.table.metadata.format_version
        if data_file.content != DataFileContent.DATA and version < 2:
            raise ValidationError(
                f"{data_file.file_path}: delete files need format v2 or later, "
                f"table {self.table.identifier} is v{version}"
            )
        data_file.validate()
        if data_file.content == DataFileContent.POSITION_DELETES:
            _check_position_delete_kind(data_file, version, str(self.table.identifier))
            if is_deletion_vector(data_file):
                self._added_dvs.append(data_file)
                return self
        self._added.append(data_file)
        self._new_manifests = None
        return self

    def delete_positions(
        self, data_file: DataFile, positions: Iterable[int] | DeletionVector
    ) -> SnapshotProducer:
        """Delete rows of ``data_file`` by position: a deletion vector on v3 tables, a
        position delete file on v2.

        v3: at commit the positions are merged with the DV (or file-scoped position delete
        files) the file already has, and the merged DV replaces them, so the snapshot holds
        at most one DV per data file (spec: "Deletion Vectors"). v2: each attempt writes one
        position delete file per partition (:mod:`icefloe.deletes.position_delete_file`) beside
        whatever deletes the file has. Either way the data file must still be live in the
        snapshot committed on (or be added by this snapshot), or the commit is refused.
        """
        version = self.table.metadata.format_version
        if version < 2:
            raise ValidationError(
                f"row-level deletes need format v2 or later; table {self.table.identifier} is "
                f"v{version}"
            )
        if data_file.content != DataFileContent.DATA:
            raise ValidationError(f"{data_file.file_path}: deleted positions need a data file")
        if isinstance(positions, DeletionVector):
            dv = positions
        elif isinstance(positions, np.ndarray):
            dv = DeletionVector.from_array(positions)  # vectorized: no int per position
        else:
            dv = DeletionVector.from_positions(positions)
        last = dv.last()
        if last is not None and last >= data_file.record_count:
            raise ValidationError(
                f"{data_file.file_path}: position {last} is past its {data_file.record_count} rows"
            )
        previous = self._dv_positions.get(data_file.file_path)
        self._dv_positions[data_file.file_path] = (
            data_file,
            dv if previous is None else previous[1].union(dv),
        )
        return self

    def known_live(
        self, snapshot_id: int | None, files: Mapping[str, DataFile]
    ) -> SnapshotProducer:
        """Data files (by path) the caller knows are live in snapshot ``snapshot_id``, such
        as the coordinator's own live-file set of the base it resolved upserts on. An
        attempt building on that very snapshot takes the targets of
        :meth:`delete_positions` from here instead of finding their entries in the
        manifests; on any other base it looks them up as usual."""
        self._known_live = (snapshot_id, files)
        return self

    def clear_deleted_positions(self) -> SnapshotProducer:
        """Forget every position given to :meth:`delete_positions`: for callers that decide
        what to delete again on each attempt's base (the coordinator's upserts)."""
        self._dv_positions.clear()
        return self

    @property
    def deletes_positions(self) -> bool:
        """Whether positions are to be deleted (given to :meth:`delete_positions`)."""
        return any(len(dv) for _, dv in self._dv_positions.values())

    def add_files(self, files: Iterable[DataFile]) -> SnapshotProducer:
        for f in files:
            self.add_file(f)
        return self

    def delete_file(self, path: str) -> SnapshotProducer:
        self._deleted_paths.add(path)
        return self

    def delete_files(self, paths: Iterable[str]) -> SnapshotProducer:
        self._deleted_paths.update(paths)
        return self

    def validate_from_snapshot(self, snapshot_id: int | None) -> SnapshotProducer:
        """The snapshot a rewrite read its files at (None: an empty table).

        Deletes committed after it that apply to a replaced file make the rewrite fail
        validation; by default it is the branch head when the producer was created, which
        suits a rewrite planned and committed in one go. A rewrite planned long before it
        is committed (a Spark compaction, through the coordinator) must name its snapshot.
        """
        self._start_snapshot_id = snapshot_id
        return self

    def delete_where(self, predicate: FileFilter) -> SnapshotProducer:
        """Remove every live file ``predicate`` selects (see :data:`FileFilter`)."""
        self._delete_filter = predicate
        return self

    # -- one attempt ---------------------------------------------------------------------

    def already_applied(self, table: Table) -> bool:
        return table.metadata.snapshot_by_id(self.snapshot_id) is not None

    async def build(self, table: Table) -> TableMetadata:
        """New metadata with this snapshot on ``self.branch``, built on ``table``'s metadata."""
        base = table.metadata
        existing_ref = base.refs.get(self.branch)
        if existing_ref is not None and not existing_ref.is_branch:
            raise ValidationError(
                f"cannot commit to {self.branch!r} of {table.identifier}: it is a tag, and "
                "tags never move; commit to a branch"
            )
        self._attempts += 1
        # A branch that does not exist yet forks from the current snapshot, as in Java.
        parent = (
            base.snapshot_by_ref(self.branch)
            if self.branch in base.refs
            else base.current_snapshot()
        )
        specs = base.specs()
        self._parent_id = parent.snapshot_id if parent is not None else None
        self._this_attempt_deletes = set()
        new_manifests = await self._write_new_manifests(base)
        parent_manifests = await self.reader.manifests(parent) if parent is not None else []
        dv_entries, self._doomed_keys = await self._deletion_vectors(base, parent_manifests)

        deltas: dict[str, int] = defaultdict(int)
        changed_partitions: set[tuple[int, tuple[Any, ...]]] = set()
        found_paths: set[str] = set()
        replaced: list[ManifestEntry] = []
        removing = (
            bool(self._deleted_paths) or self._delete_filter is not None or bool(self._doomed_keys)
        )
        # Data manifests first: on v3, a removed data file takes its DV with it (spec:
        # "Delete Formats"), which the delete manifests are then checked for.
        order = sorted(
            range(len(parent_manifests)),
            key=lambda i: parent_manifests[i].content != ManifestContent.DATA,
        )
        results: dict[int, ManifestFile] = {}
        # The new DVs by spec: written into a delete manifest this attempt rewrites anyway
        # (one manifest write fewer per commit, one manifest fewer for readers), else into
        # a manifest of their own (below).
        dvs_by_spec: dict[int, list[DataFile]] = defaultdict(list)
        for f in dv_entries:
            dvs_by_spec[f.spec_id].append(f)
        removed_data: set[str] = set()
        removed_paths: list[str] = []  # of every entry removed, for changes_of
        candidates = await self._may_remove_from(base, parent_manifests) if removing else set()
        for i in order:
            manifest = parent_manifests[i]
            if not _has_live(manifest):
                # Only deletions of an earlier snapshot are left in it: no reader needs those
                # entries, and carrying them forward would keep the deleted files reachable.
                continue
            if manifest.manifest_path not in candidates:
                results[i] = manifest
                continue
            # Live entries only: deletions of earlier snapshots are not carried forward.
            selected = await self.reader.select([manifest], specs, base.schema(), EntryQuery())
            entries = selected[0][1] if selected else []
            doomed = [
                e
                for e in entries
                if e.is_live
                and (
                    self._removes(e.data_file, base)
                    or (
                        is_deletion_vector(e.data_file)
                        and e.data_file.referenced_data_file in removed_data
                    )
                )
            ]
            if not doomed:
                results[i] = manifest
                continue
            doomed_keys = {_key(e.data_file) for e in doomed}
            removed_paths.extend(e.data_file.file_path for e in doomed)
            found_paths |= {e.data_file.file_path for e in doomed} & self._deleted_paths
            for e in doomed:
                _count_removed(deltas, e.data_file)
                changed_partitions.add((e.data_file.spec_id, e.data_file.partition))
                if e.data_file.content == DataFileContent.DATA:
                    replaced.append(e)
                    removed_data.add(e.data_file.file_path)
            joined: list[DataFile] = []
            if manifest.content == ManifestContent.DELETES:
                joined = dvs_by_spec.pop(manifest.partition_spec_id, [])
            results[i] = await self._rewrite_manifest(base, manifest, entries, doomed_keys, joined)
        kept = [results[i] for i in sorted(results)]
        missing = self._deleted_paths - found_paths
        if missing and self.validate_deleted_paths:
            sample = ", ".join(sorted(missing)[:5])
            raise ValidationConflictError(
                f"{self.operation} on {table.identifier} cannot remove {len(missing)} file(s) "
                f"that are no longer live in the table (removed concurrently?): {sample}"
            )
        if self.operation == Operation.REPLACE and replaced:
            await self._check_no_new_deletes(table, parent, replaced)
        for f in [*self._added, *dv_entries]:
            _count_added(deltas, f)
            changed_partitions.add((f.spec_id, f.partition))

        manifests = new_manifests + kept
        if self._merge_enabled(base):
            manifests = await self._merge(base, manifests)
        # DV manifests depend on the base (merged vectors), so are written per attempt.
        for spec_id, files in dvs_by_spec.items():
            spec = base.spec_by_id(spec_id)
            assert spec is not None
            manifests.insert(
                0,
                await self._write_manifest(
                    base,
                    spec,
                    ManifestContent.DELETES,
                    [(ManifestEntryStatus.ADDED, f, None) for f in files],
                ),
            )

        sequence_number = base.next_sequence_number()
        first_row_id = base.next_row_id if base.format_version >= 3 else None
        list_path = (
            f"{metadata_dir(base)}/snap-{self.snapshot_id}-{self._attempts}-{uuid.uuid4()}.avro"
        )
        buffer = _io.BytesIO()
        written, next_row_id = write_manifest_list(
            buffer,
            manifests,
            format_version=base.format_version,
            snapshot_id=self.snapshot_id,
            parent_snapshot_id=parent.snapshot_id if parent else None,
            sequence_number=sequence_number,
            first_row_id=first_row_id,
        )
        self._written.append(list_path)
        self._deletes_of_list[list_path] = frozenset(self._this_attempt_deletes)
        self._changes_of_list = {list_path: ([*self._added, *dv_entries], removed_paths)}
        await table.io.write_once(list_path, buffer.getvalue())
        if base.format_version == 1:
            # v1 lists store no sequence numbers; readers see 0 (spec), so must the cache
            written = [m.copy(sequence_number=0, min_sequence_number=0) for m in written]
        self.reader.remember_manifest_list(list_path, len(buffer.getvalue()), written)

        added: dict[str, str] = {k: str(v) for k, v in deltas.items() if v}
        added[Summary.CHANGED_PARTITION_COUNT] = str(len(changed_partitions))
        previous = parent.summary if parent is not None and parent.summary is not None else None
        totals = update_totals(previous.properties if previous is not None else None, added)
        totals.update(self.snapshot_properties)
        snapshot = Snapshot(
            snapshot_id=self.snapshot_id,
            parent_snapshot_id=parent.snapshot_id if parent else None,
            sequence_number=sequence_number,
            timestamp_ms=max(int(time.time() * 1000), base.last_updated_ms),
            manifest_list=list_path,
            summary=Summary(self.operation, totals),
            schema_id=base.current_schema_id,
            first_row_id=first_row_id,
            added_rows=(next_row_id - first_row_id)
            if first_row_id is not None and next_row_id is not None
            else None,
        )
        ref = (
            existing_ref.model_copy(update={"snapshot_id": self.snapshot_id})
            if existing_ref is not None
            else SnapshotRef.branch(self.snapshot_id)
        )
        builder = MetadataBuilder(base).add_snapshot(snapshot).set_ref(self.branch, ref)
        builder.set_properties(self.table_properties(base, snapshot))
        return builder.build(table.metadata_location)

    def changes_of(self, snapshot: Snapshot) -> tuple[list[DataFile], list[str]] | None:
        """What ``snapshot`` (this producer's, as committed) changed: the files it added
        (data and delete files) and the paths of the entries it removed; None unless it is
        the last attempt this producer built (then read its manifests instead)."""
        if snapshot.snapshot_id != self.snapshot_id or snapshot.manifest_list is None:
            return None
        return self._changes_of_list.get(snapshot.manifest_list)

    def table_properties(self, base: TableMetadata, snapshot: Snapshot) -> Mapping[str, str]:
        """Table properties to set in the same commit as ``snapshot`` (none by default;
        the coordinator carries its dedup ledger forward here)."""
        return {}

    async def _check_no_new_deletes(
        self, table: Table, parent: Snapshot | None, replaced: list[ManifestEntry]
    ) -> None:
        """Refuse a rewrite that would undo deletes committed since it was planned.

        Validation by sequence number, as Java's ``RewriteFiles``: every live delete file of
        ``parent`` whose data sequence number is above the starting snapshot's is indexed
        with the spec's scope rules, and none may apply to a replaced data file (at that
        file's own data sequence number).
        """
        if parent is None or parent.snapshot_id == self._start_snapshot_id:
            return
        base = table.metadata
        start: Snapshot | None = None
        if self._start_snapshot_id is not None:
            for snapshot in base.ancestors_of(parent.snapshot_id):
                if snapshot.snapshot_id == self._start_snapshot_id:
                    start = snapshot
                    break
            else:
                raise ValidationConflictError(
                    f"{self.operation} on {table.identifier}: snapshot "
                    f"{self._start_snapshot_id} it was planned on is no longer in the history "
                    f"of {self.branch!r}; plan it again"
                )
        start_seq = start.sequence_number if start is not None else -1
        specs = base.specs()
        index = DeleteFileIndex(specs, base.schema())
        manifests = [
            m
            for m in await self.reader.manifests(parent)
            if m.content == ManifestContent.DELETES
            # every entry of a manifest is at most as new as the manifest
            and not (m.sequence_number is not None and m.sequence_number <= start_seq)
        ]
        newer = EntryQuery(newer_than=start_seq)
        for _, newer_deletes in await self.reader.select(manifests, specs, base.schema(), newer):
            for e in newer_deletes:
                assert e.sequence_number is not None
                index.add(e.data_file, e.sequence_number)
        if not len(index):
            return
        for entry in replaced:
            seq = entry.sequence_number if entry.sequence_number is not None else 0
            hits = index.for_data_file(entry.data_file, seq)
            if hits:
                d = hits[0]
                raise ValidationConflictError(
                    f"{self.operation} on {table.identifier}: delete file {d.file_path} was "
                    f"committed after the rewrite was planned (on snapshot "
                    f"{self._start_snapshot_id}) and applies to "
                    f"{entry.data_file.file_path}, which the rewrite replaces; plan the "
                    "rewrite again"
                )

    async def _deletion_vectors(
        self, base: TableMetadata, parent_manifests: list[ManifestFile]
    ) -> tuple[list[DataFile], set[tuple[str, int | None]]]:
        """The DVs this attempt adds, merged with the base's deletes, and what they replace.

        For each data file with new deletes: the new positions (and caller-written DVs) are
        merged with the file's live DV, its file-scoped position delete files (both then
        removed) and the positions partition-scoped position delete files hold for it
        (those stay: they may delete rows of other files; readers ignore them for a file
        with a DV). One Puffin file per attempt holds the merged vectors.
        """
        self._doomed_manifests = set()
        if not self._dv_positions and not self._added_dvs:
            return [], set()
        if base.format_version < 3:
            if self._added_dvs:
                raise ValidationError(
                    f"deletion vectors need format v3; table {self.table.identifier} is "
                    f"v{base.format_version}"
                )
            return await self._position_delete_files(base, parent_manifests), set()
        specs = base.specs()
        sources: dict[str, list[DeletionVector | DataFile]] = defaultdict(list)
        for path, (_, dv) in self._dv_positions.items():
            sources[path].append(dv)
        for f in self._added_dvs:
            assert f.referenced_data_file is not None
            sources[f.referenced_data_file].append(f)
        targets = set(sources)
        live: dict[str, DataFile] = {
            f.file_path: f for f in self._added if f.content == DataFileContent.DATA
        }
        replaced: dict[str, list[DataFile]] = defaultdict(list)
        partition_scoped: list[DataFile] = []
        schema = base.schema()
        await self._find_live(base, parent_manifests, targets, live)
        # Their deletes: a delete applies only in its data file's partition (spec: "Scan
        # Planning"), so only delete manifests admitting the targets' partitions hold them.
        in_table = {(live[p].spec_id, live[p].partition) for p in targets if p in live}
        deletes = [
            m for m in parent_manifests if _has_live(m) and m.content == ManifestContent.DELETES
        ]
        near, _ = self._by_partition(base, deletes, in_table)
        query = EntryQuery(referenced=frozenset(targets), unscoped_position_deletes=True)
        for manifest, hits in await self.reader.select(near, specs, schema, query):
            for e in hits:
                f = e.data_file
                if f.referenced_data_file is not None:
                    replaced[f.referenced_data_file].append(f)
                    self._doomed_manifests.add(manifest.manifest_path)
                else:
                    partition_scoped.append(f)
        self._check_live(targets, live)
        vectors: list[tuple[DataFile, DeletionVector]] = []
        entries: list[DataFile] = []  # caller-written DVs that need no merging, as they are
        doomed: set[tuple[str, int | None]] = set()
        for path in sorted(targets):
            data_file = live[path]
            olds = replaced.get(path, [])
            scoped = [
                d
                for d in partition_scoped
                if (d.spec_id, d.partition) == (data_file.spec_id, data_file.partition)
            ]
            found = sources[path]
            if not olds and not scoped and len(found) == 1 and isinstance(found[0], DataFile):
                dv_file = found[0]
                if (dv_file.spec_id, dv_file.partition) != (data_file.spec_id, data_file.partition):
                    raise ValidationError(
                        f"deletion vector {dv_file.file_path}@{dv_file.content_offset} is not "
                        f"in the partition of {path}"
                    )
                entries.append(dv_file)
                continue
            merged = DeletionVector()
            for item in [*found, *olds, *scoped]:
                merged = merged.union(
                    item
                    if isinstance(item, DeletionVector)
                    else await self._positions_of(item, path)
                )
            last = merged.last()
            if last is not None and last >= data_file.record_count:
                raise ValidationError(
                    f"deletes for {path} name positions past its {data_file.record_count} rows"
                )
            vectors.append((data_file, merged))
            doomed |= {_key(d) for d in olds}
        if any(len(dv) for _, dv in vectors):
            location = f"{data_dir(base)}/{uuid.uuid4()}-deletes.puffin"
            built = build_deletion_vector_file(location, vectors)
            self._written.append(location)
            self._attempt_deletes.add(location)
            self._this_attempt_deletes.add(location)
            await self.table.io.write_once(location, built.data)
            entries.extend(built.entries)
            # The next merge into these files finds them here if this attempt commits (if
            # not, no snapshot names this Puffin file and nothing asks for it).
            merged_by_path = {df.file_path: dv for df, dv in vectors}
            for entry in built.entries:
                assert entry.referenced_data_file is not None
                path = entry.referenced_data_file
                self._old_deletes.put(
                    cache_key(entry, path), merged_by_path[path], entry.content_size_in_bytes
                )
        return entries, doomed

    async def _find_live(
        self,
        base: TableMetadata,
        parent_manifests: list[ManifestFile],
        targets: set[str],
        live: dict[str, DataFile],
    ) -> None:
        """Add to ``live`` the live data file entries of ``targets`` not in it yet: first in
        the data manifests whose partition summaries admit the partitions the caller gave,
        then (a caller's partition may be wrong) in the rest; on the Arrow path, where only
        the hits become objects."""
        known = self._known_live
        if known is not None and known[0] == self._parent_id and self._parent_id is not None:
            for path in targets - live.keys():
                found = known[1].get(path)
                if found is not None and found.content == DataFileContent.DATA:
                    live[path] = found
            if targets <= live.keys():
                return
        data = [m for m in parent_manifests if _has_live(m) and m.content == ManifestContent.DATA]
        near, far = self._by_partition(base, data, self._target_partitions())
        specs, schema = base.specs(), base.schema()
        for manifests in (near, far):
            wanted = frozenset(targets - set(live).intersection(targets))
            if not wanted or not manifests:
                continue
            query = EntryQuery(paths=wanted)
            for _, hits in await self.reader.select(manifests, specs, schema, query):
                for e in hits:
                    if e.data_file.content == DataFileContent.DATA:
                        live[e.data_file.file_path] = e.data_file

    def _check_live(self, targets: set[str], live: Mapping[str, DataFile]) -> None:
        missing = sorted(targets - set(live))
        if missing:
            raise ValidationConflictError(
                f"cannot delete rows of {len(missing)} data file(s) of {self.table.identifier} "
                f"that are no longer live (removed or rewritten concurrently?): "
                f"{', '.join(missing[:5])}; plan the delete again"
            )

    async def _position_delete_files(
        self, base: TableMetadata, parent_manifests: list[ManifestFile]
    ) -> list[DataFile]:
        """v2: the position delete files this attempt adds, one per partition, for the
        positions given to :meth:`delete_positions` (existing deletes stay as they are)."""
        targets = {path for path, (_, dv) in self._dv_positions.items() if len(dv)}
        if not targets:
            return []
        live: dict[str, DataFile] = {
            f.file_path: f
            for f in self._added
            if f.content == DataFileContent.DATA and f.file_path in targets
        }
        await self._find_live(base, parent_manifests, targets, live)
        self._check_live(targets, live)
        groups: dict[tuple[int, tuple[Any, ...]], dict[str, Any]] = defaultdict(dict)
        for path in sorted(targets):
            data_file = live[path]
            positions = self._dv_positions[path][1].to_numpy()
            if positions[-1] >= data_file.record_count:
                raise ValidationError(
                    f"deletes for {path} name positions past its {data_file.record_count} rows"
                )
            groups[(data_file.spec_id, data_file.partition)][path] = positions
        out = []
        for (spec_id, partition), positions_by_path in groups.items():
            location = f"{data_dir(base)}/{uuid.uuid4()}-deletes.parquet"
            data, delete_file = build_position_delete_file(
                location,
                positions_by_path,
                spec_id=spec_id,
                partition=partition,
                properties=base.properties,
            )
            self._written.append(location)
            self._attempt_deletes.add(location)
            self._this_attempt_deletes.add(location)
            await self.table.io.write_once(location, data)
            out.append(delete_file)
        return out

    async def _positions_of(self, delete_file: DataFile, data_path: str) -> DeletionVector:
        """Positions an existing DV or position delete file holds for ``data_path``."""
        key = cache_key(delete_file, data_path)
        cached = self._old_deletes.get(key)
        if cached is None:
            if is_deletion_vector(delete_file):
                cached = await read_deletion_vector(self.table.io, delete_file)
                size = delete_file.content_size_in_bytes
            else:
                raw = await self.table.io.read(delete_file.file_path)
                cached = positions_in_delete_file(raw, delete_file.file_path, data_path)
                size = None
            self._old_deletes.put(key, cached, size)
        return cached

    def _target_partitions(self) -> set[tuple[int, tuple[Any, ...]]]:
        """(spec id, partition) of the data files rows are deleted from, as given."""
        out = {(f.spec_id, f.partition) for f, _ in self._dv_positions.values()}
        out |= {(f.spec_id, f.partition) for f in self._added_dvs}
        return out

    def _by_partition(
        self,
        base: TableMetadata,
        manifests: list[ManifestFile],
        partitions: set[tuple[int, tuple[Any, ...]]],
    ) -> tuple[list[ManifestFile], list[ManifestFile]]:
        """``manifests`` split into those whose partition summaries admit one of
        ``partitions`` and the rest. A reader answering entry by entry (the reference) is
        given every manifest, as before pruning."""
        if not self.reader.columnar:
            return manifests, []
        by_spec: dict[int, list[tuple[Any, ...]]] = defaultdict(list)
        for spec_id, partition in partitions:
            by_spec[spec_id].append(partition)
        schema = base.schema()
        near: list[ManifestFile] = []
        far: list[ManifestFile] = []
        for m in manifests:
            spec = base.spec_by_id(m.partition_spec_id)
            wanted = by_spec.get(m.partition_spec_id)
            admits = (
                spec is None  # reading it names the problem
                or (
                    wanted is not None
                    and summaries_may_contain(m, spec.partition_type(schema), wanted)
                )
            )
            (near if admits else far).append(m)
        return near, far

    async def _may_remove_from(
        self, base: TableMetadata, manifests: list[ManifestFile]
    ) -> set[str]:
        """Paths of the manifests that may hold an entry this attempt removes: those holding
        the deletes the new DVs replace, those where a removed path is live (or a delete
        naming it, which goes with it), and, under a row filter, every live manifest (the
        filter needs each file)."""
        live = [m for m in manifests if _has_live(m)]
        if self._delete_filter is not None:
            return {m.manifest_path for m in live}
        out = set(self._doomed_manifests)
        if self._deleted_paths:
            paths = frozenset(self._deleted_paths)
            query = EntryQuery(paths=paths, referenced=paths)
            found = await self.reader.select(live, base.specs(), base.schema(), query)
            out.update(m.manifest_path for m, _ in found)
        return out

    def _removes(self, data_file: DataFile, base: TableMetadata) -> bool:
        if _key(data_file) in self._doomed_keys:
            return True
        if data_file.file_path in self._deleted_paths:
            return True
        return self._delete_filter is not None and self._delete_filter(data_file, base)

    def _merge_enabled(self, base: TableMetadata) -> bool:
        if self.merge_manifests is not None:
            return self.merge_manifests
        if self.operation != Operation.APPEND:
            return False
        raw = base.properties.get(MERGE_ENABLED)
        return MERGE_ENABLED_DEFAULT if raw is None else raw.strip().lower() == "true"

    async def _write_new_manifests(self, base: TableMetadata) -> list[ManifestFile]:
        """Manifests of the added files, one per (spec, content); written once per operation."""
        if self._new_manifests is not None:
            return self._new_manifests
        groups: dict[tuple[int, ManifestContent], list[DataFile]] = defaultdict(list)
        for f in self._added:
            if base.spec_by_id(f.spec_id) is None:
                raise ValidationError(
                    f"{f.file_path}: partition spec {f.spec_id} is not a spec of "
                    f"{self.table.identifier}"
                )
            content = (
                ManifestContent.DATA
                if f.content == DataFileContent.DATA
                else ManifestContent.DELETES
            )
            groups[(f.spec_id, content)].append(f)
        out = []
        for (spec_id, content), files in groups.items():
            spec = base.spec_by_id(spec_id)
            assert spec is not None
            out.append(
                await self._write_manifest(
                    base, spec, content, [(ManifestEntryStatus.ADDED, f, None) for f in files]
                )
            )
        self._new_manifests = out
        return out

    async def _write_manifest(
        self,
        base: TableMetadata,
        spec: PartitionSpec,
        content: ManifestContent,
        rows: list[_Row],
    ) -> ManifestFile:
        path = f"{metadata_dir(base)}/{uuid.uuid4()}-m{self._attempts}.avro"
        buffer = _io.BytesIO()
        writer = ManifestWriter(
            buffer,
            spec=spec,
            schema=base.schema(),
            format_version=base.format_version,
            snapshot_id=self.snapshot_id,
            content=content,
        )
        with writer:
            for status, data_file, entry in rows:
                if status == ManifestEntryStatus.ADDED and entry is None:
                    writer.add(data_file)
                elif status == ManifestEntryStatus.ADDED:
                    assert entry is not None
                    writer.add(data_file, entry.sequence_number)
                elif status == ManifestEntryStatus.EXISTING:
                    assert entry is not None
                    writer.existing(entry)
                else:
                    assert entry is not None
                    writer.delete(entry)
        manifest = writer.to_manifest_file(path, buffer.tell())
        self._written.append(path)
        await self.table.io.write_once(path, buffer.getvalue())
        if self.reader.decoded_writer is not None:
            self._manifest_bytes[path] = buffer.getvalue()
        if content == ManifestContent.DELETES and base.format_version >= 2:
            self._delete_rows[path] = rows
        return manifest

    async def _rewrite_manifest(
        self,
        base: TableMetadata,
        manifest: ManifestFile,
        entries: list[ManifestEntry],
        doomed: set[tuple[str, int | None]],
        added: list[DataFile] | None = None,
    ) -> ManifestFile:
        """A copy of ``manifest`` with ``doomed`` entries (see :func:`_key`) marked DELETED,
        and ``added`` files (of its spec and content) as this snapshot's ADDED entries."""
        spec = base.spec_by_id(manifest.partition_spec_id)
        assert spec is not None
        rows: list[_Row] = []
        for e in entries:
            if not e.is_live:
                continue  # deletions of earlier snapshots are not carried forward
            if _key(e.data_file) in doomed:
                rows.append((ManifestEntryStatus.DELETED, e.data_file, e))
            else:
                rows.append((ManifestEntryStatus.EXISTING, e.data_file, e))
        rows.extend((ManifestEntryStatus.ADDED, f, None) for f in added or ())
        return await self._write_manifest(base, spec, manifest.content, rows)

    async def _merge(
        self, base: TableMetadata, manifests: list[ManifestFile]
    ) -> list[ManifestFile]:
        """Bin-pack small manifests of one (spec, content) into target-size manifests.

        Groups with fewer than ``min-count-to-merge`` manifests are left alone, so a table
        accumulates a few manifests between merges instead of rewriting one on every commit.
        """
        min_count = self.merge_min_count or base.int_property(
            MERGE_MIN_COUNT, MERGE_MIN_COUNT_DEFAULT
        )
        target = base.int_property(MANIFEST_TARGET_SIZE, MANIFEST_TARGET_SIZE_DEFAULT)
        groups: dict[tuple[int, ManifestContent], list[ManifestFile]] = defaultdict(list)
        for m in manifests:
            groups[(m.partition_spec_id, m.content)].append(m)
        new_paths = {m.manifest_path for m in self._new_manifests or []}
        out: list[ManifestFile] = []
        for (spec_id, content), group in groups.items():
            if len(group) < max(min_count, 2):
                out.extend(group)
                continue
            bins: list[list[ManifestFile]] = []
            size = 0
            for m in group:
                if not bins or size + m.manifest_length > target:
                    bins.append([])
                    size = 0
                bins[-1].append(m)
                size += m.manifest_length
            spec = base.spec_by_id(spec_id)
            assert spec is not None
            for bin_ in bins:
                if len(bin_) == 1:
                    out.extend(bin_)
                    continue
                rows: list[_Row] = []
                for m in bin_:
                    if m.manifest_path in new_paths:
                        rows.extend(
                            (ManifestEntryStatus.ADDED, f, None)
                            for f in self._added_in(spec_id, content)
                        )
                        continue
                    for e in await self.reader.entries(m, base.specs()):
                        if e.is_live:
                            rows.append((ManifestEntryStatus.EXISTING, e.data_file, e))
                        elif e.snapshot_id == self.snapshot_id:
                            # this snapshot's own removals stay visible; older ones are dropped
                            rows.append((ManifestEntryStatus.DELETED, e.data_file, e))
                out.append(await self._write_manifest(base, spec, content, rows))
        return out

    def _added_in(self, spec_id: int, content: ManifestContent) -> list[DataFile]:
        want_data = content == ManifestContent.DATA
        return [
            f
            for f in self._added
            if f.spec_id == spec_id and (f.content == DataFileContent.DATA) == want_data
        ]

    # -- committing ----------------------------------------------------------------------

    async def commit(self, policy: RetryPolicy | None = None) -> Table:
        """Commit with retries; then remove what attempts wrote that nothing references."""
        try:
            committed = await commit_with_retry(
                self.table.catalog,
                self.table,
                self.build,
                self.already_applied,
                policy=policy,
                stats=self.stats,
            )
        except (CommitFailedError, ValidationError, ValidationConflictError):
            # Retries exhausted or the change no longer applies: no attempt was committed.
            await self._delete_unreferenced(set())
            raise
        # Anything else (CommitStateUnknownError, a storage or transport error, cancellation)
        # may have struck after a swap that did happen: our files could be referenced, so
        # they are all kept and left to orphan clean-up.
        snapshot = committed.metadata.snapshot_by_id(self.snapshot_id)
        if snapshot is not None and snapshot.manifest_list is not None:
            try:
                manifests = await self.reader.manifests(snapshot)
            except Exception:
                manifests = None  # cannot tell what is referenced: delete nothing
            if manifests is not None:
                keep: set[str] | None = {
                    snapshot.manifest_list,
                    *(m.manifest_path for m in manifests),
                }
                try:
                    dv_files: AbstractSet[str] | None = self._deletes_of_list.get(
                        snapshot.manifest_list
                    )
                    if dv_files is None:  # committed by an attempt of another producer
                        dv_files = await self._referenced_attempt_deletes(committed, manifests)
                except Exception:
                    keep = None  # cannot tell which DV files are referenced: delete nothing
                else:
                    assert keep is not None
                    keep |= dv_files
                if keep is not None:
                    await self._delete_unreferenced(keep)
                self._persist_decoded(committed, manifests)
                self._remember_deletes(manifests)
        self._manifest_bytes.clear()
        self._delete_rows.clear()
        self.table = committed
        return committed

    def _persist_decoded(self, committed: Table, manifests: list[ManifestFile]) -> None:
        """Hand the manifests this commit added to the reader's decoded-manifest writer,
        keyed by their committed list rows (inherited snapshot id, sequence number, first
        row id), to be decoded exactly as a planner decodes them and saved to its store: a
        planner sharing the store's directory then finds them there instead of reading and
        decoding them. Decoded from the bytes this producer wrote (nothing is read back),
        in the background (:mod:`icefloe.manifests.decoded_writer`): the commit returns without
        waiting for the fill, which is best effort (the planner decodes what is missing)."""
        writer = self.reader.decoded_writer
        if writer is None or not self._manifest_bytes:
            return
        ours = [
            (m, self._manifest_bytes[m.manifest_path])
            for m in manifests
            if m.manifest_path in self._manifest_bytes
        ]
        metadata = committed.metadata
        writer.submit(ours, metadata.specs(), metadata.schema())

    def _remember_deletes(self, manifests: list[ManifestFile]) -> None:
        """Give the reader the entries of the delete manifests this snapshot wrote, as
        reading them would return them (see :meth:`ManifestReader.remember_manifest`): the
        next upsert commit rewrites the manifest holding the DVs it replaces, and finds its
        entries without reading back and decoding what was just written.

        Built from the rows written, with what a read inherits from the committed list row
        filled in (spec: "Sequence Number Inheritance"): an ADDED entry written without
        sequence numbers takes the manifest's, and every entry this snapshot wrote as
        ADDED or DELETED carries its snapshot id. v2+ only (v1 reads sequence numbers as
        0), and delete manifests only (no first row ids to assign)."""
        for m in manifests:
            rows = self._delete_rows.get(m.manifest_path)
            seq = m.sequence_number
            if rows is None or m.added_snapshot_id != self.snapshot_id or seq == UNASSIGNED_SEQ:
                continue
            entries: list[ManifestEntry] = []
            for status, f, entry in rows:
                data_file = (
                    f if f.spec_id == m.partition_spec_id else f.copy(spec_id=m.partition_spec_id)
                )
                if status == ManifestEntryStatus.ADDED:
                    given = entry.sequence_number if entry is not None else None
                    entries.append(
                        ManifestEntry(
                            status,
                            self.snapshot_id,
                            seq if given is None else given,
                            seq,
                            data_file,
                        )
                    )
                    continue
                assert entry is not None
                snapshot_id = (
                    entry.snapshot_id
                    if status == ManifestEntryStatus.EXISTING
                    else self.snapshot_id
                )
                entries.append(
                    ManifestEntry(
                        status,
                        snapshot_id,
                        entry.sequence_number,
                        entry.file_sequence_number,
                        data_file,
                    )
                )
            self.reader.remember_manifest(m, entries)

    async def _referenced_attempt_deletes(
        self, committed: Table, manifests: list[ManifestFile]
    ) -> set[str]:
        """The delete files written per attempt (DV Puffin files, v2 position delete files)
        that this snapshot's own delete manifests reference."""
        written = self._attempt_deletes
        if not written:
            return set()
        out: set[str] = set()
        for m in manifests:
            if m.content != ManifestContent.DELETES or m.added_snapshot_id != self.snapshot_id:
                continue
            for e in await self.reader.entries(m, committed.metadata.specs()):
                if e.data_file.file_path in written:
                    out.add(e.data_file.file_path)
        return out

    async def _delete_unreferenced(self, keep: set[str]) -> None:
        """Best effort: a file left behind is an orphan for clean-up, never a correctness
        problem, so storage errors here are not raised."""
        for path in self._written:
            if path in keep:
                continue
            try:
                await self.table.io.delete(path)
            except Exception:
                pass


def _key(f: DataFile) -> tuple[str, int | None]:
    """What identifies a manifest entry: the path, and for a DV its blob offset (one Puffin
    file may hold the vectors of many data files)."""
    return (f.file_path, f.content_offset if is_deletion_vector(f) else None)


def _check_position_delete_kind(f: DataFile, version: int, table: str) -> None:
    """DVs only from v3 on, and no new position delete files on v3 (spec: "Delete Formats")."""
    if is_deletion_vector(f):
        if version < 3:
            raise ValidationError(
                f"{f.file_path}: deletion vectors need format v3, table {table} is v{version}"
            )
        if not f.referenced_data_file:
            raise ValidationError(f"{f.file_path}: a deletion vector needs referenced_data_file")
    elif version >= 3:
        raise ValidationError(
            f"{f.file_path}: position delete files must not be added to v3 tables (spec: "
            f'"Delete Formats"); table {table} is v{version}: delete rows with a deletion '
            "vector instead (SnapshotProducer.delete_positions, or row_delta's "
            "deleted_positions)"
        )


def _has_live(m: ManifestFile) -> bool:
    return (m.added_files_count or 0) + (m.existing_files_count or 0) > 0 or (
        m.added_files_count is None or m.existing_files_count is None
    )


def _count_added(deltas: dict[str, int], f: DataFile) -> None:
    deltas[Summary.ADDED_FILES_SIZE] += f.file_size_in_bytes
    if f.content == DataFileContent.DATA:
        deltas[Summary.ADDED_DATA_FILES] += 1
        deltas[Summary.ADDED_RECORDS] += f.record_count
        return
    deltas[Summary.ADDED_DELETE_FILES] += 1
    if f.content == DataFileContent.POSITION_DELETES:
        if is_deletion_vector(f):
            deltas[Summary.ADDED_DVS] += 1
        else:
            deltas[Summary.ADDED_POSITION_DELETE_FILES] += 1
        deltas[Summary.ADDED_POSITION_DELETES] += f.record_count
    else:
        deltas[Summary.ADDED_EQUALITY_DELETE_FILES] += 1
        deltas[Summary.ADDED_EQUALITY_DELETES] += f.record_count


def _count_removed(deltas: dict[str, int], f: DataFile) -> None:
    deltas[Summary.REMOVED_FILES_SIZE] += f.file_size_in_bytes
    if f.content == DataFileContent.DATA:
        deltas[Summary.DELETED_DATA_FILES] += 1
        deltas[Summary.DELETED_RECORDS] += f.record_count
        return
    deltas[Summary.REMOVED_DELETE_FILES] += 1
    if f.content == DataFileContent.POSITION_DELETES:
        if is_deletion_vector(f):
            deltas[Summary.REMOVED_DVS] += 1
        else:
            deltas[Summary.REMOVED_POSITION_DELETE_FILES] += 1
        deltas[Summary.REMOVED_POSITION_DELETES] += f.record_count
    else:
        deltas[Summary.REMOVED_EQUALITY_DELETE_FILES] += 1
        deltas[Summary.REMOVED_EQUALITY_DELETES] += f.record_count


# -- the operations, by name -----------------------------------------------------------------


def fast_append(table: Table, files: Iterable[DataFile], **kwargs: Any) -> SnapshotProducer:
    return SnapshotProducer(table, Operation.APPEND, merge_manifests=False, **kwargs).add_files(
        files
    )


def merge_append(table: Table, files: Iterable[DataFile], **kwargs: Any) -> SnapshotProducer:
    """Append, merging small manifests per the table's ``commit.manifest*`` properties."""
    return SnapshotProducer(table, Operation.APPEND, **kwargs).add_files(files)


def overwrite_files(
    table: Table, removed: Iterable[str], added: Iterable[DataFile], **kwargs: Any
) -> SnapshotProducer:
    return (
        SnapshotProducer(table, Operation.OVERWRITE, **kwargs)
        .delete_files(removed)
        .add_files(added)
    )


def overwrite_by_filter(
    table: Table, predicate: FileFilter, added: Iterable[DataFile], **kwargs: Any
) -> SnapshotProducer:
    return (
        SnapshotProducer(table, Operation.OVERWRITE, **kwargs)
        .delete_where(predicate)
        .add_files(added)
    )


def delete_files(
    table: Table,
    paths: Iterable[str] = (),
    predicate: FileFilter | None = None,
    **kwargs: Any,
) -> SnapshotProducer:
    producer = SnapshotProducer(table, Operation.DELETE, **kwargs).delete_files(paths)
    if predicate is not None:
        producer.delete_where(predicate)
    return producer


def row_delta(
    table: Table,
    data_files: Iterable[DataFile],
    delete_files: Iterable[DataFile],
    *,
    deleted_positions: Iterable[tuple[DataFile, Iterable[int] | DeletionVector]] = (),
    **kwargs: Any,
) -> SnapshotProducer:
    """Add data and delete files; on v3, ``deleted_positions`` become deletion vectors.

    v3 tables take no new position delete files: pass ``(data_file, positions)`` pairs (or
    DVs already written) and each data file gets one DV merged with the one it has.
    """
    deletes = list(delete_files)
    for d in deletes:
        if d.content == DataFileContent.DATA:
            raise ValidationError(f"{d.file_path}: row delta delete files must be delete files")
    positions = list(deleted_positions)
    data = list(data_files)
    # Operation names as the spec defines them: only delete files added is a "delete".
    if not deletes and not positions:
        operation = Operation.APPEND
    elif not data:
        operation = Operation.DELETE
    else:
        operation = Operation.OVERWRITE
    producer = SnapshotProducer(table, operation, **kwargs)
    producer.add_files(data).add_files(deletes)
    for data_file, ps in positions:
        producer.delete_positions(data_file, ps)
    return producer


def rewrite_files(
    table: Table, removed: Iterable[str], added: Iterable[DataFile], **kwargs: Any
) -> SnapshotProducer:
    """Compaction: replace files with new ones holding the same rows (``replace``)."""
    return (
        SnapshotProducer(table, Operation.REPLACE, **kwargs).delete_files(removed).add_files(added)
    )


def data_file_location(table: Table, partition_path: str, name: str) -> str:
    base = data_dir(table.metadata)
    return f"{base}/{partition_path}/{name}" if partition_path else f"{base}/{name}"
