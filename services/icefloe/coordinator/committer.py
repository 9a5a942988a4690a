"""One table's committer: checks events against the table and turns ready units into one
snapshot, exactly once.

Exactly once, from the table side
---------------------------------
What each snapshot records about its sources (``icefloe.commit-ids``, ``icefloe.offsets``,
``icefloe.positions``, ``icefloe.topic-ids``) and how it is read is
:mod:`icefloe.coordinator.history`.

Offsets decide only what is *skipped*; whether a commit id is applied is decided by the
dedup index (:mod:`icefloe.table.commit_index`) over every snapshot the table lists, which is
checked on every base an attempt builds on.

Before every attempt, and again on the reloaded table after every conflict, the committer
drops units whose commit ids the table already holds (the dedup index, kept incrementally:
O(new snapshots) per attempt), and refuses units whose files are already live in the
branch. The catalog's conditional swap serializes
committers (restarted, rebalanced or zombie), and the re-check on the base each attempt
builds on removes what another committer already did. An unknown swap outcome is resolved by
reloading and looking for this attempt's snapshot id and then for the commit ids, never by a
blind retry.

Commit stages (``after-manifests``, ``after-metadata``, ``after-swap``) are told to a
:class:`~icefloe.coordinator.commit_hooks.CommitHooks` observer
(:mod:`icefloe.coordinator.commit_hooks`). Events' files are checked by
:mod:`icefloe.coordinator.event_checks`; overwrite filters are
:mod:`icefloe.coordinator.overwrite_filters`.

Why a module, and why about 1,000 lines: :class:`TableCommitter` is the commit protocol of
one table (load, check every unit on every base, resolve upserts, commit with one
conditional swap, resolve unknown outcomes by reloading); its methods are the steps of that
one protocol and share its state (the live-file set, the dedup index, the key index), and
the snapshot producer that builds each attempt is its private helper.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from icefloe.coordinator.batcher import Unit
from icefloe.coordinator.commit_hooks import COMMITTING, CommitHooks
from icefloe.coordinator.event_checks import check_metrics, check_path
from icefloe.coordinator.history import (
    DEFAULT_HISTORY_LIMIT,
    SUMMARY_OFFSETS,
    SUMMARY_POSITIONS,
    SUMMARY_TOPIC_IDS,
    History,
)
from icefloe.coordinator.overwrite_filters import overwrite_filter, replace_partitions_filter
from icefloe.coordinator.upsert import (
    KeyIndexOpener,
    UnitRefused,
    UpsertResolution,
    check_key_files,
    is_upsert,
    key_ids_of,
)
from icefloe.deletes.deletion_vector_cache import DEFAULT_MAX_BYTES as DEFAULT_DV_CACHE_BYTES
from icefloe.deletes.deletion_vector_cache import DeletionVectorCache
from icefloe.errors import (
    CommitFailedError,
    CommitStateUnknownError,
    EventRejectedError,
    IcefloeError,
    NotFoundError,
    ValidationConflictError,
    ValidationError,
)
from icefloe.events import CommitOperation, CommitRequested, FilesWritten
from icefloe.expressions.binding import bind
from icefloe.expressions.evaluators import MetricsEvaluator, compile_row_filter
from icefloe.expressions.projection import inclusive_projection
from icefloe.key_index import KeyIndex, SyncChanges
from icefloe.manifests.entry_query import EntryQuery
from icefloe.manifests.manifest import ManifestEntryStatus
from icefloe.manifests.manifest_list import ManifestContent
from icefloe.manifests.reader import ManifestReader
from icefloe.retry import Backoff, Retry, RetryEvent, RetryState
from icefloe.spec.datafile import DataFile, DataFileContent
from icefloe.spec.metadata import TableMetadata
from icefloe.spec.snapshot import Operation, Snapshot
from icefloe.table.catalog import Catalog, Table, TableIdentifier
from icefloe.table.commit import CommitStats, RetryPolicy
from icefloe.table.commit_index import DEDUP_WINDOW_MS_DEFAULT, CommitIndex, ledger_properties
from icefloe.table.commit_index import SUMMARY_COMMIT_IDS as SUMMARY_COMMIT_IDS
from icefloe.table.commit_index import summary_commit_ids as summary_commit_ids
from icefloe.table.snapshot_producer import SnapshotProducer

log = logging.getLogger(__name__)

# How often at most the key index is checkpointed after upsert commits. A checkpoint only
# saves a new owner reading the files committed since the one before (never a missed row:
# icefloe.key_index), and writing one on every commit costs two more writes than the
# commit itself makes, so it is written on the first upsert commit and then this often.
DEFAULT_KEY_INDEX_CHECKPOINT_S = 10.0

_INCREMENTAL_LIMIT = 1000
"""Beyond this many new snapshots the live-file set is rebuilt rather than patched."""


# -- the committer -----------------------------------------------------------------------


@dataclass(slots=True)
class CommitOutcome:
    """What one :meth:`TableCommitter.commit` did with its units.

    ``snapshots`` are the snapshots this call committed, each with its units (one, unless
    a batch had to be split to find a unit that no longer applies); ``already_committed``
    maps commit ids found in the table's history to the snapshot that holds them.
    """

    table: Table | None = None
    snapshots: list[tuple[Snapshot, list[Unit]]] = field(default_factory=list)
    already_committed: dict[str, int] = field(default_factory=dict)
    rejected: list[tuple[Unit, EventRejectedError]] = field(default_factory=list)
    stats: CommitStats = field(default_factory=CommitStats)

    @property
    def snapshots_by_commit_id(self) -> dict[str, int]:
        out = dict(self.already_committed)
        for snapshot, units in self.snapshots:
            out.update({u.commit_id: snapshot.snapshot_id for u in units})
        return out

    @property
    def committed_units(self) -> list[Unit]:
        return [u for _, units in self.snapshots for u in units]


class _Reshape(IcefloeError):
    """The base shows that some units are already committed or can no longer be added."""

    def __init__(
        self, already: dict[str, int], rejected: list[tuple[Unit, EventRejectedError]]
    ) -> None:
        super().__init__(f"{len(already)} unit(s) already committed, {len(rejected)} refused")
        self.already = already
        self.rejected = rejected


@dataclass(slots=True)
class _LiveFiles:
    """The files live in a branch at ``snapshot_id``: every path, and for keyed tables the
    data files themselves (``data``, slimmed by :func:`_slim`), which upserts resolve to."""

    snapshot_id: int | None
    paths: set[str]
    data: dict[str, DataFile] | None = None


def _slim(f: DataFile) -> DataFile:
    """A live data file as upserts need it (path, size, counts, partition): no column
    metrics, which would be most of its memory on a table of millions of files."""
    if (
        f.column_sizes is None
        and f.value_counts is None
        and f.null_value_counts is None
        and f.nan_value_counts is None
        and f.lower_bounds is None
        and f.upper_bounds is None
    ):
        return f  # decoded without them already (split offsets are a few numbers)
    return f.copy(
        column_sizes=None,
        value_counts=None,
        null_value_counts=None,
        nan_value_counts=None,
        lower_bounds=None,
        upper_bounds=None,
    )


class TableCommitter:
    """Loads one table, checks its events, and commits batches of its units exactly once.

    ``source`` names the Kafka partition the units were read from (:func:`source_key`). One
    committer is used by one task at a time: at most one commit per table is in flight.
    """

    def __init__(
        self,
        catalog: Catalog,
        identifier: str | TableIdentifier,
        source: str,
        *,
        check_files: bool = True,
        file_check_concurrency: int = 32,
        hooks: CommitHooks | None = None,
        history_limit: int = DEFAULT_HISTORY_LIMIT,
        reader: ManifestReader | None = None,
        retry_policy: RetryPolicy | None = None,
        open_key_index: KeyIndexOpener | None = None,
        dedup_window_ms: int = DEDUP_WINDOW_MS_DEFAULT,
        deletion_vector_cache_bytes: int = DEFAULT_DV_CACHE_BYTES,
        key_index_checkpoint_s: float = DEFAULT_KEY_INDEX_CHECKPOINT_S,
    ) -> None:
        self.catalog = catalog
        self.dedup_window_ms = dedup_window_ms  # recorded on tables that set no window
        self.identifier = TableIdentifier.parse(identifier)
        self.source = source
        self.check_files = check_files
        self.file_check_concurrency = file_check_concurrency
        self.hooks = hooks or CommitHooks()
        self.history_limit = history_limit
        self.reader = reader or ManifestReader(catalog.io)
        self.retry_policy = retry_policy
        self.table: Table | None = None
        self._history: History | None = None
        self._live: dict[str, _LiveFiles] = {}
        self.index = CommitIndex()
        self.restart_positions = False  # set when the source topic was found re-created
        self.topic_id: str | None = None  # the source topic's Kafka id, when known
        self.open_key_index: KeyIndexOpener = open_key_index or KeyIndex.open
        self._key_index: KeyIndex | None = None
        self._key_index_for: tuple[str, tuple[int, ...]] | None = None
        # The DVs this committer wrote and read, kept between commits so that merging an
        # upsert's deletes into a file's DV does not read back the DV the last commit
        # wrote; keyed by the immutable blob, so a foreign change is a miss, never stale.
        self.deletion_vectors = DeletionVectorCache(deletion_vector_cache_bytes)
        self.key_index_checkpoint_s = key_index_checkpoint_s
        self._key_index_checkpointed: float | None = None  # time.monotonic() of the last
        self._key_index_dirty = False  # upsert commits since the last checkpoint

    @property
    def name(self) -> str:
        return str(self.identifier)

    # -- loading ---------------------------------------------------------------------------

    async def load(self) -> Table:
        """(Re)load the table; NotFoundError if it does not exist."""
        self.table = await self.catalog.load_table(self.identifier)
        return self.table

    async def current(self) -> Table:
        return self.table if self.table is not None else await self.load()

    def history(self, metadata: TableMetadata | None = None) -> History:
        if metadata is None:
            if self.table is None:
                raise ValidationError(f"table {self.name} is not loaded")
            metadata = self.table.metadata
        if self._history is None or self._history.metadata is not metadata:
            self._history = History(metadata, self.history_limit)
        return self._history

    def resume_point(self) -> int | None:
        """The recorded resume point of this committer's source partition, if any."""
        return self.history().resume_point(self.source)

    def recorded_position(self) -> int | None:
        """The highest position recorded for this committer's source partition, if any."""
        return self.history().recorded_position(self.source)

    def committed_snapshot(self, commit_id: str) -> int | None:
        """The snapshot of the loaded table (any branch, any writer) that applied
        ``commit_id``, or None: the dedup index (:mod:`icefloe.table.commit_index`)."""
        if self.table is not None:
            self.index.update(self.table.metadata)
        return self.index.get(commit_id)

    async def live_paths(self, metadata: TableMetadata, branch: str) -> set[str]:
        """Paths of the data and delete files live in ``branch`` (kept up to date by
        applying each new snapshot's own manifest entries to the last known set)."""
        return (await self._live_files(metadata, branch, with_data=False)).paths

    async def added_paths(self, metadata: TableMetadata, snapshot_id: int) -> set[str] | None:
        """Paths of the files snapshot ``snapshot_id`` itself added, or None when the table
        no longer has it (expired). Proves a replay whose files a later rewrite or delete
        has removed since: they were committed, only no longer live."""
        snapshot = metadata.snapshot_by_id(snapshot_id)
        if snapshot is None:
            return None
        specs = metadata.specs()
        paths: set[str] = set()
        for manifest in await self.reader.manifests(snapshot):
            if manifest.added_snapshot_id != snapshot_id:
                continue
            for entry in await self.reader.entries(manifest, specs):
                if entry.snapshot_id == snapshot_id and entry.status == ManifestEntryStatus.ADDED:
                    paths.add(entry.data_file.file_path)
        return paths

    async def live_data_files(self, metadata: TableMetadata, branch: str) -> dict[str, DataFile]:
        """The data files live in ``branch``, by path (kept up to date like
        :meth:`live_paths`; for keyed tables, whose upserts resolve keys to them)."""
        live = await self._live_files(metadata, branch, with_data=True)
        assert live.data is not None
        return live.data

    async def _live_files(
        self, metadata: TableMetadata, branch: str, *, with_data: bool
    ) -> _LiveFiles:
        head = metadata.snapshot_by_ref(branch)
        head_id = None if head is None else head.snapshot_id
        cached = self._live.get(branch)
        if cached is not None and with_data and cached.data is None:
            cached = None  # data files were not kept: read them once
        if cached is not None and cached.snapshot_id == head_id:
            return cached
        specs = metadata.specs()
        data: dict[str, DataFile] | None = (
            None if not with_data and (cached is None or cached.data is None) else {}
        )

        def add(f: DataFile) -> None:
            paths.add(f.file_path)
            if data is not None and f.content == DataFileContent.DATA:
                data[f.file_path] = _slim(f)

        def remove(path: str) -> None:
            paths.discard(path)
            if data is not None:
                data.pop(path, None)

        paths: set[str] = set()
        if head is not None:
            newer: list[Snapshot] = []
            found = False
            if cached is not None and cached.snapshot_id is not None:
                for snapshot in self.history(metadata).ancestry_of(head_id):
                    if snapshot.snapshot_id == cached.snapshot_id:
                        found = True
                        break
                    newer.append(snapshot)
                    if len(newer) > _INCREMENTAL_LIMIT:
                        break
            if found and cached is not None:
                paths = set(cached.paths)
                if data is not None and cached.data is not None:
                    data.update(cached.data)
                for snapshot in reversed(newer):
                    for manifest in await self.reader.manifests(snapshot):
                        if manifest.added_snapshot_id != snapshot.snapshot_id:
                            continue
                        for entry in await self.reader.entries(manifest, specs):
                            if entry.snapshot_id != snapshot.snapshot_id:
                                continue
                            if entry.status == ManifestEntryStatus.ADDED:
                                add(entry.data_file)
                            elif entry.status == ManifestEntryStatus.DELETED:
                                remove(entry.data_file.file_path)
            else:
                manifests = await self.reader.manifests(head)
                schema = metadata.schema()
                if data is None:
                    # Paths only: the Arrow path, no object per entry.
                    paths = await self.reader.file_paths(manifests, specs, schema)
                else:
                    # Delete files by path only; data files as objects without their column
                    # metrics (which _slim drops anyway), both on the Arrow path.
                    deletes = [m for m in manifests if m.content != ManifestContent.DATA]
                    paths = await self.reader.file_paths(deletes, specs, schema)
                    selected = await self.reader.select(
                        [m for m in manifests if m.content == ManifestContent.DATA],
                        specs,
                        schema,
                        EntryQuery(),
                        with_metrics=False,
                    )
                    for _, entries in selected:
                        for entry in entries:
                            add(entry.data_file)
        live = _LiveFiles(head_id, paths, data)
        self._live[branch] = live
        return live

    async def key_index(self, metadata: TableMetadata) -> KeyIndex:
        """The table's key index, opened (from its last checkpoint) on first use and again
        when the table's identifier fields or location change."""
        schema = metadata.schema()
        wanted = (metadata.location, tuple(schema.identifier_field_ids))
        if self._key_index is None or self._key_index_for != wanted:
            self._key_index = await self.open_key_index(
                self.catalog.io, metadata.location, schema, wanted[1]
            )
            self._key_index_for = wanted
        return self._key_index

    def has_key_index(self, metadata: TableMetadata) -> bool:
        """Whether the key index for ``metadata``'s location and identifier fields is open."""
        wanted = (metadata.location, tuple(metadata.schema().identifier_field_ids))
        return self._key_index is not None and self._key_index_for == wanted

    def discard_staged_keys(self) -> None:
        """An upsert attempt will not commit: the key index forgets the files it staged."""
        if self._key_index is not None:
            self._key_index.discard_staged()

    def drop_key_index(self) -> None:
        """Forget the key index (after a failure it may not be trusted): the next upsert
        opens it again from its last checkpoint and syncs it to the table."""
        self._key_index = None
        self._key_index_for = None
        self._key_index_checkpointed = None

    async def sync_key_index(
        self,
        metadata: TableMetadata,
        branch: str,
        *,
        checkpoint: bool = False,
        changed: SyncChanges | None = None,
    ) -> None:
        """After an upsert commit or a compaction: cover the committed snapshot (what the
        attempt staged is now live) and, when one is due (``key_index_checkpoint_s``) or
        ``checkpoint`` asks, let the index persist what a new owner needs
        (:meth:`checkpoint_key_index` writes what is left). Never fails the commit (it is
        done): an index in doubt is dropped and rebuilt from its checkpoint. ``changed``
        is what our own commit changed on its parent: the index then compares only those
        paths, not every live one (see :meth:`KeyIndex.sync`)."""
        index = self._key_index
        if index is None:
            return
        try:
            head = metadata.snapshot_by_ref(branch)
            version = (branch, head.snapshot_id if head is not None else None)
            live = await self.live_data_files(metadata, branch)
            await index.sync(live, version=version, changed=changed)
            now = time.monotonic()
            last = self._key_index_checkpointed
            self._key_index_dirty = True
            if checkpoint or last is None or now - last >= self.key_index_checkpoint_s:
                await index.checkpoint()
                self._key_index_checkpointed = now
                self._key_index_dirty = False
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.warning(
                "key index of %s could not be checkpointed (%s: %s); it will be reopened",
                self.name,
                type(e).__name__,
                e,
                extra={"table": self.name},
            )
            self.drop_key_index()

    async def checkpoint_key_index(self) -> None:
        """Checkpoint the key index now if upsert commits since the last checkpoint were
        not: for the coordinator when it gives the table up or goes idle, so the next owner
        resumes from the last commit. Never raises but on cancellation."""
        index = self._key_index
        if index is None or not self._key_index_dirty:
            return
        try:
            await index.checkpoint()
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.warning(
                "key index of %s could not be checkpointed (%s: %s)",
                self.name,
                type(e).__name__,
                e,
                extra={"table": self.name},
            )
            return
        self._key_index_checkpointed = time.monotonic()
        self._key_index_dirty = False

    async def delete_key_files(self, units: Sequence[Unit]) -> None:
        """Delete the key files of committed (or already applied) upsert units: they are in
        no snapshot and nothing reads them again. Best effort: one left behind is an
        orphan for the maintenance's orphan clean-up."""
        paths = [
            f.file_path
            for u in units
            if u.operation == CommitOperation.UPSERT
            for f in u.delete_files
        ]
        if not paths:
            return
        io = self.catalog.io
        limit = asyncio.Semaphore(self.file_check_concurrency)

        async def delete(path: str) -> None:
            async with limit:
                try:
                    await io.delete(path)
                except NotFoundError:
                    pass
                except Exception as e:
                    log.warning(
                        "could not delete key file %s of %s: %s",
                        path,
                        self.name,
                        e,
                        extra={"table": self.name},
                    )

        await asyncio.gather(*(delete(p) for p in paths))

    # -- checks on incoming events ---------------------------------------------------------

    async def validate_files_written(
        self, event: FilesWritten
    ) -> tuple[list[DataFile], list[DataFile]]:
        """The event's files, checked against the table; EventRejectedError says why not.

        Storage errors while checking files (other than a missing file) propagate: they say
        nothing about the event and the caller retries.
        """
        table = await self.current()
        metadata = table.metadata
        what = f"files-written event {event.event_id} for table {self.name}"
        if (
            metadata.schema_by_id(event.schema_id) is None
            or metadata.spec_by_id(event.spec_id) is None
        ):
            # A writer may have evolved the table since it was loaded: look once more.
            metadata = (await self.load()).metadata
        schema = metadata.schema_by_id(event.schema_id)
        if schema is None:
            known = sorted(s.schema_id for s in metadata.schemas)
            raise EventRejectedError(
                "unknown-schema",
                f"{what}: 'schema-id' {event.schema_id} is not a schema of the table "
                f"(known: {known})",
            )
        if metadata.spec_by_id(event.spec_id) is None:
            raise EventRejectedError(
                "unknown-spec",
                f"{what}: 'spec-id' {event.spec_id} is not a partition spec of the table "
                f"(known: {sorted(metadata.specs())})",
            )
        try:
            data_files, delete_files = event.decode_files(schema, metadata.specs())
        except ValidationError as e:
            raise EventRejectedError("invalid-file", str(e)) from None
        if delete_files and metadata.format_version < 2:
            raise EventRejectedError(
                "invalid-file",
                f"{what}: delete files need table format v2 or later; the table is "
                f"v{metadata.format_version}",
            )
        for f in (*data_files, *delete_files):
            check_path(metadata, f.file_path, self.name)
            check_metrics(f, schema, self.name)
        live = await self.live_paths(metadata, event.branch or "main")
        for f in (*data_files, *delete_files):
            if f.file_path in live:
                raise EventRejectedError(
                    "duplicate-file",
                    f"{what}: file {f.file_path!r} is already in the table",
                )
        if self.check_files:
            await self._check_storage([*data_files, *delete_files], what)
        return data_files, delete_files

    async def _check_storage(self, files: Sequence[DataFile], what: str) -> None:
        limit = asyncio.Semaphore(self.file_check_concurrency)
        io = self.catalog.io

        async def size_of(f: DataFile) -> int | None:
            async with limit:
                try:
                    return await io.size(f.file_path)
                except NotFoundError:
                    return None

        sizes = await asyncio.gather(*(size_of(f) for f in files))
        for f, size in zip(files, sizes):
            if size is None:
                raise EventRejectedError(
                    "missing-file", f"{what}: file {f.file_path!r} does not exist"
                )
            if size != f.file_size_in_bytes:
                raise EventRejectedError(
                    "size-mismatch",
                    f"{what}: file {f.file_path!r} has {size} byte(s) in storage but the event "
                    f"says 'file-size-in-bytes' is {f.file_size_in_bytes}",
                )

    async def validate_commit_requested(self, request: CommitRequested) -> None:
        """Refuse requests that can never apply to this table (EventRejectedError)."""
        table = await self.current()
        metadata = table.metadata
        what = f"commit-requested {request.event_id} (commit id {request.commit_id!r})"
        ref = metadata.refs.get(request.target_branch)
        if ref is not None and not ref.is_branch:
            raise EventRejectedError(
                "invalid-request", f"{what}: {request.target_branch!r} is a tag, not a branch"
            )
        if request.operation == CommitOperation.UPSERT:
            key_ids_of(metadata, f"{what} on table {self.name}")
        if request.operation == CommitOperation.ROW_DELTA and metadata.format_version < 2:
            raise EventRejectedError(
                "invalid-request",
                f"{what}: row deltas need table format v2 or later; table {self.name} is "
                f"v{metadata.format_version}",
            )
        expr = request.overwrite_expression()
        if expr is not None:
            try:
                bind(metadata.schema(), expr)
            except ValidationError as e:
                raise EventRejectedError(
                    "invalid-request", f"{what}: 'overwrite-filter' does not apply: {e}"
                ) from None
        if (
            request.base_snapshot_id is not None
            and metadata.snapshot_by_id(request.base_snapshot_id) is None
            # the cached table may predate a commit made outside the coordinator (a row
            # delta by another engine, say) that the requester planned on: look again
            and (await self.load()).metadata.snapshot_by_id(request.base_snapshot_id) is None
        ):
            raise EventRejectedError(
                "invalid-request",
                f"{what}: 'base-snapshot-id' {request.base_snapshot_id} is not a snapshot of "
                f"table {self.name}",
            )

    # -- committing ------------------------------------------------------------------------

    async def commit(
        self, units: Sequence[Unit], *, resume_offset: int, position: int
    ) -> CommitOutcome:
        """Commit ``units`` (consecutive appends, or one other operation) as one snapshot.

        Units already in the table are reported in ``already_committed``; units that can
        no longer apply (their files are already live, a rewritten file is gone, ...) in
        ``rejected``. Transient failures (storage, catalog) are retried with backoff until
        they pass: the caller cancels the task to give up.
        """
        outcome = CommitOutcome(self.table)
        remaining = list(units)
        # Two kinds of retry, one utility: lost swaps are retried inside producer.commit
        # under the table's commit.retry.* policy (icefloe.table.commit); what still fails here
        # (storage, catalog, a conflict storm) is retried below, forever, on a fresh base.
        transient = self._transient_retry().start()
        while remaining:
            token = COMMITTING.set(self.hooks)
            producer: _UnitsProducer | None = None
            committed_ok = False
            try:
                table = await self.current()
                producer = _UnitsProducer(self, table, remaining, resume_offset, position)
                committed = await producer.commit(self.retry_policy)
                committed_ok = True
            except _Reshape as r:
                outcome.already_committed.update(r.already)
                outcome.rejected.extend(r.rejected)
                dropped = set(r.already) | {u.commit_id for u, _ in r.rejected}
                remaining = [u for u in remaining if u.commit_id not in dropped]
                continue
            except (ValidationError, ValidationConflictError) as e:
                if len(remaining) > 1:
                    # Appends of validated files should never get here; find the culprit by
                    # committing the units one at a time.
                    for unit in remaining:
                        single = await self.commit(
                            [unit], resume_offset=resume_offset, position=position
                        )
                        _merge(outcome, single)
                    return outcome
                kind = e.kind if isinstance(e, EventRejectedError) else "conflict"
                outcome.rejected.append(
                    (remaining[0], EventRejectedError(kind, f"table {self.name}: {e}"))
                )
                remaining = []
                continue
            except NotFoundError as e:
                if await self._table_missing():
                    for unit in remaining:
                        outcome.rejected.append((unit, EventRejectedError("unknown-table", f"{e}")))
                    remaining = []
                    continue
                await self._backoff(e, transient)
                continue
            except (CommitFailedError, CommitStateUnknownError) as e:
                outcome.stats.conflicts += 1
                await self._backoff(e, transient)
                continue
            except asyncio.CancelledError:
                raise
            except Exception as e:  # storage or catalog trouble: never drop the units
                await self._backoff(e, transient)
                continue
            finally:
                COMMITTING.reset(token)
                if producer is not None:
                    _add_stats(outcome.stats, producer.stats)
                    if producer.upsert is not None and not committed_ok:
                        self.discard_staged_keys()
            self.hooks.on_stage("after-swap")
            self.table = committed
            outcome.table = committed
            snapshot = committed.metadata.snapshot_by_id(producer.snapshot_id)
            if snapshot is None:
                # Resolved as applied without our snapshot: the next round's check on the
                # base decides what is left to do.
                continue
            outcome.snapshots.append((snapshot, remaining))
            remaining = []
            await self._advance_live(committed.metadata, snapshot, producer)
            if producer.upsert is not None:
                changes = producer.changes_of(snapshot)
                changed = (
                    None
                    if changes is None
                    else SyncChanges(
                        (producer.branch, snapshot.parent_snapshot_id),
                        [f.file_path for f in changes[0]],
                        changes[1],
                    )
                )
                await self.sync_key_index(committed.metadata, producer.branch, changed=changed)
        outcome.table = self.table or outcome.table
        return outcome

    async def _advance_live(
        self, metadata: TableMetadata, snapshot: Snapshot, producer: _UnitsProducer
    ) -> None:
        """Bring the live-file set to our new snapshot: on top of the known head, apply what
        the producer added and removed (no need to read back what we just wrote)."""
        cached = self._live.get(producer.branch)
        changes = producer.changes_of(snapshot)
        if (
            changes is not None
            and cached is not None
            and cached.snapshot_id == snapshot.parent_snapshot_id
        ):
            added, removed = changes
            cached.paths.difference_update(removed)
            cached.paths.update(f.file_path for f in added)
            if cached.data is not None:
                for path in removed:
                    cached.data.pop(path, None)
                cached.data.update(
                    (f.file_path, _slim(f)) for f in added if f.content == DataFileContent.DATA
                )
            cached.snapshot_id = snapshot.snapshot_id
            return
        await self.live_paths(metadata, producer.branch)

    async def _table_missing(self) -> bool:
        try:
            await self.load()
        except NotFoundError:
            self.table = None
            return True
        except Exception:
            return False
        return False

    def _transient_retry(self) -> Retry:
        """The table's commit backoff, capped at 30s (and at 256 times its minimum)."""
        policy = self.retry_policy or RetryPolicy()
        base = policy.backoff.base_s
        cap_s = 30.0
        backoff = Backoff(min(base, cap_s), min(policy.backoff.max_s, base * 256, cap_s))

        def on_retry(event: RetryEvent) -> None:
            log.warning(
                "commit to %s failed (%s: %s); retrying in %.2fs",
                self.name,
                type(event.error).__name__,
                event.error,
                event.delay_s,
                extra={"table": self.name, "failures": event.failures},
            )

        return Retry(backoff, on_retry=on_retry)

    async def _backoff(self, error: Exception, transient: RetryState) -> None:
        """Wait before the next attempt (never gives up: the caller cancels), then reload."""
        await transient.backoff(error)
        self.table = None
        try:
            await self.load()
        except Exception as e:  # the next round reports it again
            log.warning("reloading %s failed: %s", self.name, e, extra={"table": self.name})

    async def check_units(self, table: Table, units: Sequence[Unit]) -> None:
        """The re-check before each attempt: raise _Reshape if the base already holds some
        units or holds files they add."""
        self.table = table
        branch = units[0].branch
        index = self.index
        index.update(table.metadata)
        already: dict[str, int] = {}
        for u in units:
            snapshot_id = index.get(u.commit_id)
            if snapshot_id is not None:
                already[u.commit_id] = snapshot_id
        live = await self.live_paths(table.metadata, branch)
        rejected: list[tuple[Unit, EventRejectedError]] = []
        adding: dict[str, str] = {}
        for unit in units:
            if unit.commit_id in already:
                continue
            problem: EventRejectedError | None = None
            if unit.operation == CommitOperation.UPSERT:
                try:
                    what = f"upsert commit id {unit.commit_id!r} on table {self.name}"
                    check_key_files(unit, key_ids_of(table.metadata, what), self.name)
                except EventRejectedError as e:
                    rejected.append((unit, e))
                    continue
            for f in (*unit.data_files, *unit.delete_files):
                if f.file_path in live:
                    problem = EventRejectedError(
                        "duplicate-file",
                        f"commit id {unit.commit_id!r}: file {f.file_path!r} is already in "
                        f"table {self.name}",
                    )
                    break
                other = adding.get(f.file_path)
                if other is not None:
                    problem = EventRejectedError(
                        "duplicate-file",
                        f"commit id {unit.commit_id!r}: file {f.file_path!r} is also added by "
                        f"commit id {other!r}",
                    )
                    break
            if problem is not None:
                rejected.append((unit, problem))
                continue
            for f in (*unit.data_files, *unit.delete_files):
                adding[f.file_path] = unit.commit_id
        if already or rejected:
            raise _Reshape(already, rejected)

    def summary_properties(
        self, metadata: TableMetadata, units: Sequence[Unit], resume_offset: int, position: int
    ) -> dict[str, str]:
        """The ``icefloe.*`` summary entries of a snapshot committing ``units``."""
        offsets, positions = self.history(metadata).latest_maps(units[0].branch)
        offsets = {**offsets, self.source: resume_offset}
        if self.restart_positions:
            # A new incarnation of the topic: the old running maximum means nothing now.
            positions = {**positions, self.source: position}
        else:
            positions = {**positions, self.source: max(positions.get(self.source, 0), position)}
        out = {
            SUMMARY_COMMIT_IDS: json.dumps([u.commit_id for u in units], separators=(",", ":")),
            SUMMARY_OFFSETS: json.dumps(offsets, separators=(",", ":"), sort_keys=True),
            SUMMARY_POSITIONS: json.dumps(positions, separators=(",", ":"), sort_keys=True),
        }
        topic_ids = self.history(metadata).latest_topic_ids(units[0].branch)
        if self.topic_id is not None:
            topic_ids[self.source] = self.topic_id
        else:
            topic_ids.pop(self.source, None)  # unknown now: claim no incarnation
        if topic_ids:
            out[SUMMARY_TOPIC_IDS] = json.dumps(topic_ids, separators=(",", ":"), sort_keys=True)
        return out

    async def resolve_upserts(
        self, producer: SnapshotProducer, resolution: UpsertResolution, table: Table
    ) -> None:
        """Resolve an upsert batch on ``table`` (this attempt's base) into ``producer``'s
        deletes (see :mod:`icefloe.coordinator.upsert`). A unit that cannot be resolved is
        refused through _Reshape; one whose file is gone is first looked for in the table
        (another committer may have applied it and deleted its key files)."""
        metadata = table.metadata
        index = await self.key_index(metadata)
        index.discard_staged()
        try:
            live = await self.live_data_files(metadata, producer.branch)
            head = metadata.snapshot_by_ref(producer.branch)
            head_id = head.snapshot_id if head is not None else None
            await index.sync(live, version=(producer.branch, head_id))
            await resolution.resolve(index, self.catalog.io, metadata.schema(), live, producer)
            # Our live set is of this very base: the producer need not find the targets'
            # entries in the manifests again.
            producer.known_live(head_id, live)
        except UnitRefused as r:
            index.discard_staged()
            if r.maybe_committed:
                fresh = await self.load()
                self.index.update(fresh.metadata)
                snapshot_id = self.index.get(r.unit.commit_id)
                if snapshot_id is not None:
                    raise _Reshape({r.unit.commit_id: snapshot_id}, []) from None
            raise _Reshape({}, [(r.unit, r.error)]) from None
        except BaseException:
            index.discard_staged()
            raise

    async def check_base(self, table: Table, unit: Unit) -> None:
        """For a request with ``base-snapshot-id``: the base must still be in the branch's
        history, and nothing committed since may conflict (ValidationConflictError)."""
        request = unit.request
        base_id = request.base_snapshot_id
        if base_id is None:
            return
        history = self.history(table.metadata)
        since: list[Snapshot] = []
        for snapshot in history.ancestry(unit.branch):
            if snapshot.snapshot_id == base_id:
                break
            since.append(snapshot)
        else:
            raise ValidationConflictError(
                f"commit id {unit.commit_id!r}: base snapshot {base_id} is no longer in the "
                f"history of branch {unit.branch!r} of table {self.name}"
            )
        if not since:
            return
        specs = table.metadata.specs()
        added: list[DataFile] = []
        for snapshot in since:
            for manifest in await self.reader.manifests(snapshot):
                if manifest.added_snapshot_id != snapshot.snapshot_id:
                    continue
                for entry in await self.reader.entries(manifest, specs):
                    if (
                        entry.status == ManifestEntryStatus.ADDED
                        and entry.snapshot_id == snapshot.snapshot_id
                    ):
                        added.append(entry.data_file)
        if request.operation == CommitOperation.OVERWRITE:
            expr = request.overwrite_expression()
            if expr is not None:
                schema = table.metadata.schema()
                may_rows = MetricsEvaluator(schema, expr, include_empty_files=True)
                tests: dict[int, Any] = {}
                for f in added:
                    if f.content != DataFileContent.DATA:
                        continue
                    spec = table.metadata.spec_by_id(f.spec_id)
                    if spec is None:
                        continue
                    test = tests.get(f.spec_id)
                    if test is None:
                        test = compile_row_filter(inclusive_projection(schema, spec)(expr))
                        tests[f.spec_id] = test
                    if test(f.partition) and may_rows.eval(f):
                        raise ValidationConflictError(
                            f"commit id {unit.commit_id!r}: file {f.file_path} was added after "
                            f"base snapshot {base_id} and may match the overwrite filter"
                        )
            else:
                written = {(f.spec_id, f.partition) for f in unit.data_files}
                for f in added:
                    if (f.spec_id, f.partition) in written:
                        raise ValidationConflictError(
                            f"commit id {unit.commit_id!r}: file {f.file_path} was added after "
                            f"base snapshot {base_id} to a partition this overwrite replaces"
                        )
        elif request.operation == CommitOperation.REWRITE:
            rewritten = set(request.rewritten_files)
            for f in added:
                if f.referenced_data_file is not None and f.referenced_data_file in rewritten:
                    raise ValidationConflictError(
                        f"commit id {unit.commit_id!r}: delete file {f.file_path} added after "
                        f"base snapshot {base_id} applies to rewritten file "
                        f"{f.referenced_data_file}"
                    )
        elif request.operation == CommitOperation.ROW_DELTA:
            live = await self.live_paths(table.metadata, unit.branch)
            for f in unit.delete_files:
                ref = f.referenced_data_file
                if ref is not None and ref not in live:
                    raise ValidationConflictError(
                        f"commit id {unit.commit_id!r}: delete file {f.file_path} applies to "
                        f"{ref}, which is no longer in the table"
                    )


def _add_stats(total: CommitStats, more: CommitStats) -> None:
    total.attempts += more.attempts
    total.conflicts += more.conflicts
    total.unknown_outcomes += more.unknown_outcomes


def _merge(total: CommitOutcome, part: CommitOutcome) -> None:
    total.table = part.table or total.table
    total.snapshots.extend(part.snapshots)
    total.already_committed.update(part.already_committed)
    total.rejected.extend(part.rejected)
    _add_stats(total.stats, part.stats)


def _operation_for(units: Sequence[Unit]) -> Operation:
    op = units[0].operation
    if op == CommitOperation.APPEND:
        return Operation.APPEND
    if op == CommitOperation.OVERWRITE:
        return Operation.OVERWRITE
    if op == CommitOperation.REWRITE:
        return Operation.REPLACE
    return Operation.OVERWRITE if units[0].delete_files else Operation.APPEND


class _UnitsProducer(SnapshotProducer):
    """A snapshot producer whose every attempt first re-checks its units on the base."""

    def __init__(
        self,
        committer: TableCommitter,
        table: Table,
        units: Sequence[Unit],
        resume_offset: int,
        position: int,
    ) -> None:
        properties: dict[str, str] = {}
        for unit in units:
            properties.update(unit.request.snapshot_properties)
        super().__init__(
            table,
            _operation_for(units),
            branch=units[0].branch,
            snapshot_properties=properties,
            reader=committer.reader,
            deletion_vectors=committer.deletion_vectors,
        )
        self.committer = committer
        self.units = list(units)
        self.user_properties = properties
        self.resume_offset = resume_offset
        self.position = position
        data_files = [f for u in units for f in u.data_files]
        self.add_files(data_files)
        # An upsert's delete files are key files: resolved on each base, never committed.
        self.upsert = UpsertResolution(units, committer.name) if is_upsert(units) else None
        if self.upsert is None:
            self.add_files([f for u in units for f in u.delete_files])
        if len(units) == 1:
            request = units[0].request
            if request.operation == CommitOperation.OVERWRITE:
                expr = request.overwrite_expression()
                if expr is not None:
                    self.delete_where(overwrite_filter(table.metadata, expr))
                else:
                    self.delete_where(replace_partitions_filter(data_files))
            elif request.operation == CommitOperation.REWRITE:
                self.delete_files(request.rewritten_files)
                # Validate by sequence number from the snapshot the rewrite read.
                self.validate_from_snapshot(request.base_snapshot_id)

    async def build(self, table: Table) -> TableMetadata:
        await self.committer.check_units(table, self.units)
        if self.upsert is None and len(self.units) == 1:
            await self.committer.check_base(table, self.units[0])
        self.snapshot_properties = {
            **self.user_properties,
            **self.committer.summary_properties(
                table.metadata, self.units, self.resume_offset, self.position
            ),
        }
        if self.upsert is None:
            metadata = await super().build(table)
        else:
            try:
                await self.committer.resolve_upserts(self, self.upsert, table)
                metadata = await super().build(table)
            except ValidationConflictError as e:
                # Resolved on this very base, so a row in a file that is not live means the
                # index is out of step: resolve again on a fresh base, never refuse.
                self.committer.drop_key_index()
                raise CommitFailedError(f"upsert to {self.committer.name}: {e}") from e
        self.committer.hooks.on_stage("after-manifests")
        return metadata

    def table_properties(self, base: TableMetadata, snapshot: Snapshot) -> Mapping[str, str]:
        # The dedup ledger: this snapshot's commit ids, carried forward with the table so
        # that they outlive the snapshot (icefloe.table.dedup_ledger).
        ids = [u.commit_id for u in self.units]
        return ledger_properties(
            base, self.committer.index, snapshot, ids, self.committer.dedup_window_ms
        )
