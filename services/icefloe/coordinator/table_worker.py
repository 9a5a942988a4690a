"""The per-table worker: one asyncio task per table with work, feeding the table's batcher
and committing the batches it releases, exactly once.

Why a module: this is where steps 1 to 4 of the exactly-once argument
(:mod:`icefloe.coordinator.service`) happen for one table of one partition: intake in
partition order with file checks running ahead, the resume point read from the table (and
distrusted when the topic was re-created), commit ids checked against the table before every
attempt, and commits found done announced again. It needs the consume side only through
:class:`TableHost` (the consumer group, :mod:`icefloe.coordinator.consumer_group`, is one), so
the dependency points one way: the group creates workers, workers never import the group.

About 850 lines: one class (about 690) whose methods are the steps of one table's life, each
short, and the protocol that is its view of the service.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

from aiokafka import TopicPartition

from icefloe.coordinator.batcher import (
    Admission,
    Batch,
    BatchLimits,
    CommitStatus,
    PendingFiles,
    SourceEvent,
    TableBatcher,
    Unit,
)
from icefloe.coordinator.commit_hooks import CommitHooks
from icefloe.coordinator.committer import CommitOutcome, TableCommitter
from icefloe.coordinator.compactor import TableCompactor
from icefloe.coordinator.config import BACKOFF, CoordinatorConfig
from icefloe.coordinator.metrics import CoordinatorMetrics
from icefloe.coordinator.offsets import ConsumedRecord, PartitionState
from icefloe.coordinator.upsert import KeyIndexOpener
from icefloe.errors import EventRejectedError, NotFoundError, ValidationError
from icefloe.events import CommitRequested, FilesWritten, TableCommitted, now_ms
from icefloe.manifests.reader import ManifestReader
from icefloe.retry import Retry, RetryEvent
from icefloe.spec.datafile import DataFile
from icefloe.spec.snapshot import Snapshot, Summary
from icefloe.table.catalog import Catalog, Table
from icefloe.table.commit_index import dedup_window_ms

log = logging.getLogger("icefloe.coordinator")

_MISSING_TABLE_RECHECK_S = 1.0
_WORKER_RESTART_S = 1.0
_INTAKE_SLICE_S = 0.05
_INTAKE_BATCH = 128
_CONCURRENT_CHECKS = 16


class TableHost(Protocol):
    """What a table worker needs of the service that runs it: the wiring it commits with, the
    consume side's counters (events in flight, draining, offsets to commit), the partition's
    topic id and end offset, and the outbox."""

    config: CoordinatorConfig
    catalog: Catalog
    hooks: CommitHooks
    reader: ManifestReader
    default_limits: BatchLimits
    open_key_index: KeyIndexOpener
    metrics: CoordinatorMetrics
    inflight: int
    draining: bool
    offsets_dirty: asyncio.Event

    async def topic_id(self, topic: str) -> str | None: ...

    async def end_offset(self, tp: TopicPartition) -> int | None: ...

    async def publish_results(self, messages: Sequence[TableCommitted]) -> None: ...

    async def dead_letter(
        self,
        ps: PartitionState,
        events: Sequence[SourceEvent],
        error: EventRejectedError,
        *,
        table: str | None = None,
    ) -> None: ...


class _Revoked(Exception):
    """The partition went away while a worker was waiting: stop without finishing."""


def _settle(check: asyncio.Future[Any]) -> None:
    """Let go of a file check its event did not need (an exact replay of files already in the
    table is acknowledged without one): cancel it if it still runs, or take its outcome, so
    that asyncio never logs a finished check's rejection as "never retrieved"."""
    if not check.done():
        check.cancel()
    elif not check.cancelled():
        check.exception()


class TableWorker:
    """Everything the coordinator does for one table of one partition."""

    def __init__(self, coordinator: TableHost, partition: PartitionState, table: str) -> None:
        self.coordinator = coordinator
        self.partition = partition
        self.table = table
        self.batcher = TableBatcher(table, coordinator.default_limits)
        self.committer = TableCommitter(
            coordinator.catalog,
            table,
            partition.source,
            check_files=coordinator.config.check_files,
            file_check_concurrency=coordinator.config.file_check_concurrency,
            hooks=coordinator.hooks,
            reader=coordinator.reader,
            open_key_index=coordinator.open_key_index,
            dedup_window_ms=coordinator.config.dedup_window_ms,
        )
        # Compaction between this table's commits (icefloe.coordinator.compactor).
        self.compactor = TableCompactor(self.committer)
        self.inbox: deque[tuple[ConsumedRecord, FilesWritten | CommitRequested]] = deque()
        self.task: asyncio.Task[None] | None = None
        self.wakeup = asyncio.Event()
        self.resume: int | None = None
        self.missing_checked_at: float | None = None
        self.stuck_warned_at = float("-inf")
        self.sweep_due = False
        self._checks = asyncio.Semaphore(_CONCURRENT_CHECKS)

    @property
    def running(self) -> bool:
        return self.task is not None and not self.task.done()

    def receive(self, record: ConsumedRecord, event: FilesWritten | CommitRequested) -> None:
        self.batcher.track(record.offset)
        self.inbox.append((record, event))
        self.coordinator.inflight += 1
        self.ensure_running()

    def ensure_running(self) -> None:
        if self.running:
            self.wakeup.set()
            return
        self.task = asyncio.create_task(self._run(), name=f"icefloe-table-{self.table}")
        self.coordinator.metrics.tables_active.inc()

    def _extra(self, **more: Any) -> dict[str, Any]:
        return {"table": self.table, "partition": self.partition.source, **more}

    # -- the loop --------------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            await self._loop()
            await self.committer.checkpoint_key_index()  # idle or revoked: persist the index
        except _Revoked:
            await self.committer.checkpoint_key_index()
        except asyncio.CancelledError:
            raise
        except Exception:
            # A bug: never leave the table's events stranded (they hold the partition's
            # offsets back); try again shortly.
            log.exception("worker for %s failed; restarting it", self.table, extra=self._extra())
            if not self.partition.revoked:
                asyncio.get_running_loop().call_later(_WORKER_RESTART_S, self._restart)
        finally:
            self.coordinator.metrics.tables_active.dec()
            if self.partition.revoked:
                self.coordinator.inflight -= len(self.inbox)
                self.inbox.clear()

    def _restart(self) -> None:
        if not self.partition.revoked and (self.inbox or self.batcher.has_work):
            self.ensure_running()

    async def _loop(self) -> None:
        coordinator = self.coordinator
        while not self.partition.revoked:
            # Take events in time slices: under a steady stream the inbox never empties,
            # and due batches must still be committed between slices.
            slice_end = time.monotonic() + _INTAKE_SLICE_S
            while self.inbox and not self.partition.revoked and time.monotonic() < slice_end:
                await self._intake()
            if self.sweep_due and not self.partition.revoked:
                self.sweep_due = False
                await self._sweep()
            if self.partition.revoked:
                return
            batch = self.batcher.take_batch(draining=coordinator.draining)
            if batch is not None:
                await self._commit(batch)
                if not self.partition.revoked and not coordinator.draining:
                    await self.compactor.maybe_compact()
                continue
            if self.inbox:
                continue
            deadline = self.batcher.next_deadline()
            if deadline is None:
                return
            self.wakeup.clear()
            timeout = max(0.0, deadline - time.monotonic())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wakeup.wait(), timeout)

    async def _intake(self) -> None:
        """Handle the next few events in order, checking their files concurrently first.

        Checking files waits on storage (one ``size`` per file), so one event at a time
        would cap a table at the storage round trip. The checks only read the table, never
        the batching state, so they can run ahead; admission stays in partition order.
        """
        items: list[tuple[ConsumedRecord, FilesWritten | CommitRequested]] = []
        while self.inbox and len(items) < _INTAKE_BATCH:
            items.append(self.inbox.popleft())
            self.coordinator.inflight -= 1
        checks: dict[int, asyncio.Future[tuple[list[DataFile], list[DataFile]]]] = {}
        if self.committer.table is not None and len(items) > 1:
            for record, event in items:
                if (
                    isinstance(event, FilesWritten)
                    and (self.resume is None or record.offset >= self.resume)
                    and not self.batcher.knows_event(event.event_id)
                ):
                    checks[record.offset] = asyncio.ensure_future(self._check_files(event))
        try:
            for record, event in items:
                if self.partition.revoked:
                    return
                check = checks.pop(record.offset, None)
                try:
                    await self._handle(record, event, check)
                except (_Revoked, asyncio.CancelledError):
                    raise
                except Exception as e:
                    # A bug, not the event's fault: dead-letter it rather than hold the
                    # partition back forever, and keep the details in the log.
                    log.exception("handling offset %d of %s failed", record.offset, self.table)
                    await self._dead_letter(
                        [record.source],
                        EventRejectedError(
                            "internal-error", f"{type(e).__name__}: {e} (see coordinator logs)"
                        ),
                    )
                finally:
                    if check is not None:
                        _settle(check)
        finally:
            for check in checks.values():
                check.cancel()
            if checks:
                await asyncio.gather(*checks.values(), return_exceptions=True)

    async def _check_files(self, event: FilesWritten) -> tuple[list[DataFile], list[DataFile]]:
        async with self._checks:
            return await self.committer.validate_files_written(event)

    async def _retrying(self, what: str, action: Callable[[], Awaitable[Any]]) -> Any:
        """Run ``action`` until it stops failing for reasons outside the event."""

        def on_retry(event: RetryEvent) -> None:
            if self.partition.revoked:
                raise _Revoked() from event.error
            log.warning(
                "%s for %s failed (%s: %s); retrying in %.1fs",
                what,
                self.table,
                type(event.error).__name__,
                event.error,
                event.delay_s,
                extra=self._extra(),
            )

        policy = Retry(BACKOFF, permanent=(EventRejectedError, NotFoundError), on_retry=on_retry)
        return await policy.call(action)

    # -- events ----------------------------------------------------------------------------

    async def _handle(
        self,
        record: ConsumedRecord,
        event: FilesWritten | CommitRequested,
        check: Awaitable[tuple[list[DataFile], list[DataFile]]] | None = None,
    ) -> None:
        if not await self._ensure_loaded(record):
            return
        if self.resume is not None and record.offset < self.resume:
            # Done before, but perhaps never announced: a crash between the catalog swap
            # and the table-committed leaves exactly these events to re-read (Kafka offsets
            # move only after the announcement). Announce what the table holds again.
            commit_id = _unit_commit_id(event)
            if commit_id is not None:
                snapshot_id = self._committed_snapshot(commit_id)
                if snapshot_id is not None:
                    await self._acknowledge_again({commit_id: snapshot_id}, event.produced_at_ms)
            self.coordinator.metrics.skipped.labels("below-resume-point").inc()
            self.batcher.release(record.offset)
            return
        if isinstance(event, FilesWritten):
            await self._on_files(record, event, check)
        else:
            await self._on_request(record, event)

    async def _ensure_loaded(self, record: ConsumedRecord) -> bool:
        if self.committer.table is not None:
            return True
        now = time.monotonic()
        if (
            self.missing_checked_at is None
            or now - self.missing_checked_at >= _MISSING_TABLE_RECHECK_S
        ):
            try:
                await self._retrying("loading the table", self.committer.load)
            except NotFoundError:
                self.missing_checked_at = now
            else:
                self.missing_checked_at = None
                await self._loaded()
                return True
        await self._dead_letter(
            [record.source],
            EventRejectedError(
                "unknown-table",
                f"table {self.table} does not exist in catalog {self.coordinator.catalog.name}",
            ),
        )
        return False

    async def _loaded(self) -> None:
        table = self.committer.table
        assert table is not None
        try:
            self.batcher.limits = self.coordinator.default_limits.with_table_properties(
                table.metadata.properties
            )
        except ValidationError as e:
            log.warning("table %s: %s; using the default batch limits", self.table, e)
        recorded = await self._trusted_resume_point()
        if recorded is not None:
            self.resume = recorded if self.resume is None else max(self.resume, recorded)
        self.committer.index.update(table.metadata)
        self._check_dedup_coverage(table)
        log.info(
            "loaded table %s (resume point %s)",
            self.table,
            self.resume,
            extra=self._extra(metadata_location=table.metadata_location),
        )

    async def _trusted_resume_point(self) -> int | None:
        """The recorded resume point of this partition, if it belongs to the partition as it
        is now. Offsets restart when a topic is deleted and re-created (or truncated), and
        skipping by an old resume point would skip new events silently. A resume point
        recorded beside another topic id (whatever the new topic's end offset), or a recorded
        position beyond the partition's end offset, is not trusted: nothing is skipped by
        offset, and the dedup index (commit ids) alone keeps commits exactly once."""
        source = self.partition.source
        topic_id = await self.coordinator.topic_id(self.partition.tp.topic)
        self.committer.topic_id = topic_id
        points = self.committer.history().resume_by_incarnation(source)
        if not points:
            return None
        stale = sorted(
            i for i in points if i is not None and topic_id is not None and i != topic_id
        )
        if stale:
            self._recreated(
                f"its resume point was recorded for topic id {stale[0]} and the "
                f"topic's id is now {topic_id}",
                recorded_topic_id=stale[0],
                topic_id=topic_id,
            )
            return None
        position = self.committer.recorded_position()
        end = await self.coordinator.end_offset(self.partition.tp) if position is not None else None
        if position is not None and end is not None and position > end:
            self._recreated(
                f"it recorded position {position} but the partition ends at offset {end}",
                recorded_position=position,
                end_offset=end,
            )
            return None
        return max(points.values())

    def _recreated(self, why: str, **facts: Any) -> None:
        """One clear error line and a metric: the topic was re-created or truncated."""
        self.coordinator.metrics.topic_recreated.labels(self.partition.source).inc()
        self.committer.restart_positions = True
        log.error(
            "table %s, partition %s: the events topic was re-created or truncated (%s). The "
            "recorded resume point is ignored: no event is skipped by offset, commit ids alone "
            "deduplicate",
            self.table,
            self.partition.source,
            why,
            extra=self._extra(**facts),
        )

    def _committed_snapshot(self, commit_id: str) -> int | None:
        """The snapshot holding ``commit_id``: known to this worker, else in the table."""
        snapshot_id = self.batcher.committed_snapshot(commit_id)
        if snapshot_id is None:
            snapshot_id = self.committer.committed_snapshot(commit_id)
            if snapshot_id is not None:
                self.batcher.mark_committed({commit_id: snapshot_id})
        return snapshot_id

    def _status(self, commit_id: str) -> CommitStatus:
        """The batcher's view of a commit id, with the table's dedup index behind it: a
        commit id the table holds is committed, whatever offsets or attempt ids say."""
        status = self.batcher.commit_status(commit_id)
        if status is CommitStatus.NEW and self._committed_snapshot(commit_id) is not None:
            return CommitStatus.COMMITTED
        return status

    def _check_dedup_coverage(self, table: Table) -> None:
        """Warn (log and metric) when the table's history is shorter than the dedup window."""
        try:
            window = dedup_window_ms(
                table.metadata.properties, self.coordinator.config.dedup_window_ms
            )
        except ValidationError as e:
            log.warning("table %s: %s; using the default dedup window", self.table, e)
            window = self.coordinator.config.dedup_window_ms
        gap = self.committer.index.coverage_gap_ms(table.metadata, now_ms(), window)
        self.coordinator.metrics.dedup_gap.labels(self.table).set(gap / 1000.0)
        if gap > 0:
            log.warning(
                "table %s: its retained snapshot history may not cover the dedup window of "
                "%d ms (up to %d ms missing): snapshots were expired inside the window, "
                "perhaps by another engine, that its dedup ledger (icefloe.dedup.ledger) does "
                "not list (expired before the table carried one, or the property was "
                "removed), and commit ids retried from before then may not be recognised; "
                "expire with icefloe's maintenance (it keeps the window)",
                self.table,
                window,
                gap,
                extra=self._extra(dedup_window_ms=window, dedup_gap_ms=gap),
            )

    async def _on_files(
        self,
        record: ConsumedRecord,
        event: FilesWritten,
        check: Awaitable[tuple[list[DataFile], list[DataFile]]] | None = None,
    ) -> None:
        metrics = self.coordinator.metrics
        if self.batcher.knows_event(event.event_id):
            if self.batcher.same_event(event):
                if event.complete:
                    # A streaming replay of a done micro-batch: acknowledge it again (one
                    # still queued is announced by its own commit).
                    snapshot_id = self.batcher.committed_snapshot(event.commit_id)
                    if snapshot_id is not None:
                        await self._acknowledge_again(
                            {event.commit_id: snapshot_id}, event.produced_at_ms
                        )
                metrics.skipped.labels("duplicate").inc()
                self.batcher.release(record.offset)
                return
            await self._dead_letter(
                [record.source],
                EventRejectedError(
                    "conflicting-event",
                    f"files-written {event.event_id} (commit id {event.commit_id!r}) reuses the "
                    "event id of an earlier event with different content (commit id, attempt "
                    f"or files); its {len(event.file_paths)} file(s) are in no snapshot",
                ),
            )
            return
        status = self._status(event.commit_id)
        if status is not CommitStatus.NEW:
            await self._late_files(record, event, status)
            return
        try:
            early = [check] if check is not None else []

            async def validate() -> tuple[list[DataFile], list[DataFile]]:
                if early:  # the check started ahead, then fresh ones on retries
                    return await early.pop()
                return await self.committer.validate_files_written(event)

            data, deletes = await self._retrying("checking files", validate)
        except EventRejectedError as e:
            if e.kind == "duplicate-file" and await self._committed_elsewhere(event, record):
                metrics.skipped.labels("replayed").inc()
                self.batcher.release(record.offset)
                return
            await self._dead_letter([record.source], e)
            return
        except NotFoundError as e:  # the table was dropped under us
            self.committer.table = None
            await self._dead_letter([record.source], EventRejectedError("unknown-table", str(e)))
            return
        pending = PendingFiles(
            event,
            record.offset,
            tuple(data),
            tuple(deletes),
            received_at=time.monotonic(),
            raw=record.value,
            key=record.key,
        )
        admitted = self.batcher.add_files(pending)
        if admitted.admission is Admission.READY and admitted.unit is not None:
            self._ready(admitted.unit)
        elif admitted.admission is Admission.DUPLICATE:
            metrics.skipped.labels("duplicate").inc()
            self.batcher.release(record.offset)
        elif admitted.admission is Admission.LATE:
            await self._dead_letter(
                [record.source],
                EventRejectedError(
                    "late-files", f"files-written {event.event_id}: {admitted.reason}"
                ),
            )

    async def _committed_elsewhere(self, event: FilesWritten, record: ConsumedRecord) -> bool:
        """Whether files found live belong to a commit another coordinator (or an earlier
        life of this one) already applied: then the event is a replay, not an error."""

        async def holder() -> int | None:
            await self.committer.load()
            return self.committer.committed_snapshot(event.commit_id)

        snapshot_id: int | None = await self._retrying("reading the table history", holder)
        if snapshot_id is None:
            return False
        self.batcher.mark_committed({event.commit_id: snapshot_id})
        if event.complete:
            await self._acknowledge_again({event.commit_id: snapshot_id}, event.produced_at_ms)
        return True

    async def _late_files(
        self, record: ConsumedRecord, event: FilesWritten, status: CommitStatus
    ) -> None:
        """Files for a commit id already queued or committed: a replay, or orphans."""
        if status is CommitStatus.COMMITTED:

            async def live() -> set[str]:
                table = await self.committer.current()
                return await self.committer.live_paths(table.metadata, event.branch or "main")

            paths = await self._retrying("reading live files", live)
            if event.complete:
                # A streaming replay (same micro-batch, same or new files): acknowledge it
                # again, naming the snapshot that holds the commit id; files this event
                # adds that the table does not hold are reported as orphans for clean-up.
                snapshot_id = self.batcher.committed_snapshot(event.commit_id)
                if snapshot_id is not None:
                    orphans = [p for p in event.file_paths if p not in paths]
                    await self._acknowledge_again(
                        {event.commit_id: snapshot_id}, event.produced_at_ms, orphans=orphans
                    )
                    self.coordinator.metrics.skipped.labels("replayed").inc()
                    self.batcher.release(record.offset)
                    return
            wanted = _committed_paths(event)
            if all(path in paths for path in wanted):
                self.coordinator.metrics.skipped.labels("replayed").inc()
                self.batcher.release(record.offset)
                return
            snapshot_id = self.batcher.committed_snapshot(event.commit_id)
            if snapshot_id is not None:
                # Not live any more, but perhaps committed: a rewrite (the coordinator's own
                # compaction, an engine's) or a delete removed them since. Such files are in
                # older snapshots, so they must not be reported as deletable.

                async def added() -> set[str] | None:
                    table = await self.committer.current()
                    return await self.committer.added_paths(table.metadata, snapshot_id)

                committed = await self._retrying("reading the committed snapshot", added)
                if committed is not None and all(path in committed for path in wanted):
                    self.coordinator.metrics.skipped.labels("replayed").inc()
                    self.batcher.release(record.offset)
                    return
        await self._dead_letter(
            [record.source],
            EventRejectedError(
                "late-files",
                f"files-written {event.event_id} arrived after commit id {event.commit_id!r} "
                f"was {status.value}; its {len(event.file_paths)} file(s) are in no snapshot "
                "and may be deleted",
            ),
        )

    async def _on_request(self, record: ConsumedRecord, request: CommitRequested) -> None:
        metrics = self.coordinator.metrics
        status = self._status(request.commit_id)
        if status is CommitStatus.COMMITTED:
            snapshot_id = self.batcher.committed_snapshot(request.commit_id)
            if snapshot_id is not None:
                await self._acknowledge_again(
                    {request.commit_id: snapshot_id}, request.produced_at_ms
                )
            for p in self.batcher.drop_commit(request.commit_id):
                self.batcher.release(p.offset)
            metrics.skipped.labels("already-committed").inc()
            self.batcher.release(record.offset)
            return
        if status is CommitStatus.QUEUED:
            metrics.skipped.labels("duplicate").inc()
            self.batcher.release(record.offset)
            return
        try:
            await self._retrying(
                "checking a commit request",
                lambda: self.committer.validate_commit_requested(request),
            )
        except EventRejectedError as e:
            await self._dead_letter([record.source], e)
            return
        except NotFoundError as e:
            self.committer.table = None
            await self._dead_letter([record.source], EventRejectedError("unknown-table", str(e)))
            return
        admitted = self.batcher.add_request(
            request, record.offset, raw=record.value, key=record.key
        )
        if admitted.admission is Admission.READY and admitted.unit is not None:
            self._ready(admitted.unit)
        elif admitted.admission is Admission.DUPLICATE:
            metrics.skipped.labels("duplicate").inc()
            self.batcher.release(record.offset)
        else:
            kind = (
                "missing-events" if admitted.admission is Admission.MISSING_EVENTS else "no-files"
            )
            await self._dead_letter(
                [record.source], EventRejectedError(kind, admitted.reason or kind)
            )

    def _ready(self, unit: Unit) -> None:
        metrics = self.coordinator.metrics
        metrics.batched.labels("commit-requested" if not unit.streaming else "files-written").inc()
        if not unit.streaming:
            metrics.batched.labels("files-written").inc(len(unit.selected) + len(unit.excluded))
        if unit.excluded:
            log.info(
                "commit id %s of %s leaves out %d files-written event(s) of other attempts; "
                "their %d file(s) are orphans for clean-up",
                unit.commit_id,
                self.table,
                len(unit.excluded),
                len(unit.orphan_files),
                extra=self._extra(commit_id=unit.commit_id, orphan_files=unit.orphan_files[:20]),
            )

    async def _sweep(self) -> None:
        """Dead-letter files-written events whose writers never asked for a commit."""
        max_age = self.coordinator.config.abandon_after_ms / 1000.0
        for p in self.batcher.expire(max_age):
            await self._dead_letter(
                [SourceEvent(p.raw, p.key, p.offset)],
                EventRejectedError(
                    "abandoned",
                    f"files-written {p.event.event_id} (commit id {p.event.commit_id!r}) got no "
                    f"commit-requested within {self.coordinator.config.abandon_after_ms} ms; "
                    f"its {p.file_count} file(s) are in no snapshot",
                ),
            )

    async def _dead_letter(self, events: Sequence[SourceEvent], error: EventRejectedError) -> None:
        await self.coordinator.dead_letter(self.partition, events, error, table=self.table)
        for e in events:
            self.batcher.release(e.offset)

    # -- commits ---------------------------------------------------------------------------

    async def _commit(self, batch: Batch) -> None:
        coordinator = self.coordinator
        metrics = coordinator.metrics
        position = self.partition.position
        assert position is not None  # a batch exists only after records were read
        resume = self.batcher.safe_resume_point(position, batch)
        started = time.monotonic()
        try:
            outcome = await self.committer.commit(
                batch.units, resume_offset=resume, position=position
            )
        except asyncio.CancelledError:
            self.batcher.abort(batch)
            raise
        except Exception:
            log.exception("commit of %s failed", self.table, extra=self._extra())
            self.batcher.abort(batch)
            await asyncio.sleep(1.0)
            return
        metrics.commit_duration.observe(time.monotonic() - started)
        metrics.conflicts.inc(outcome.stats.conflicts)
        metrics.retries.inc(max(0, outcome.stats.attempts - len(outcome.snapshots)))
        try:
            await self._publish_outcome(outcome, batch)
        except Exception:  # announcements are informational: never block the table on them
            log.exception("publishing the results of %s failed", self.table, extra=self._extra())
        # Key files of upserts now in the table are read by nothing again.
        await self.committer.delete_key_files(
            [u for u in batch.units if u.commit_id in outcome.snapshots_by_commit_id]
        )
        try:
            for unit, error in outcome.rejected:
                await coordinator.dead_letter(
                    self.partition, unit.source_events(), error, table=self.table
                )
        except BaseException:
            # Not done yet: the next attempt finds the committed units in the table and
            # dead-letters the refused ones again.
            self.batcher.abort(batch)
            raise
        self.batcher.complete(batch, outcome.snapshots_by_commit_id)
        coordinator.offsets_dirty.set()

    async def _publish_outcome(self, outcome: CommitOutcome, batch: Batch) -> None:
        metrics = self.coordinator.metrics
        table = outcome.table
        messages: list[TableCommitted] = []
        for snapshot, units in outcome.snapshots:
            latency_ms = max(0, now_ms() - min(u.produced_at_ms for u in units))
            metrics.snapshots.inc()
            metrics.files.inc(sum(u.file_count for u in units))
            metrics.committed.inc(sum(len(u.offsets) for u in units))
            metrics.commit_latency.observe(latency_ms / 1000.0)
            assert table is not None
            messages.append(
                _table_committed(
                    self.table,
                    snapshot,
                    units[0].branch,
                    table.metadata_location,
                    [u.commit_id for u in units],
                    latency_ms,
                    [f for u in units for f in u.orphan_files],
                )
            )
            log.info(
                "committed %d unit(s), %d file(s) to %s as snapshot %d",
                len(units),
                sum(u.file_count for u in units),
                self.table,
                snapshot.snapshot_id,
                extra=self._extra(
                    snapshot_id=snapshot.snapshot_id,
                    commit_ids=[u.commit_id for u in units],
                    latency_ms=latency_ms,
                ),
            )
        await self.coordinator.publish_results(messages)
        if outcome.already_committed and table is not None:
            oldest = min(
                (u.produced_at_ms for u in batch.units if u.commit_id in outcome.already_committed),
                default=now_ms(),
            )
            await self._acknowledge_again(outcome.already_committed, oldest, table)

    async def _acknowledge_again(
        self,
        commits: Mapping[str, int],
        produced_at_ms: int,
        table: Table | None = None,
        *,
        orphans: Sequence[str] = (),
    ) -> None:
        """A table-committed pointing at the earlier snapshot of commits found done; when
        that snapshot has been expired since (by any engine), one saying so, naming the
        metadata whose dedup ledger records the commit id. Every request gets an answer."""
        if table is None:
            # Fresh metadata, so that an answer never names a snapshot expired meanwhile
            # (replays are rare: a reload each is cheap).
            table = await self._retrying("loading the table", self.committer.load)
            assert table is not None
        by_snapshot: dict[int, list[str]] = {}
        for commit_id, snapshot_id in commits.items():
            by_snapshot.setdefault(snapshot_id, []).append(commit_id)
        messages = []
        for snapshot_id, commit_ids in by_snapshot.items():
            snapshot = table.metadata.snapshot_by_id(snapshot_id)
            log.info(
                "commit id(s) %s already in %s (snapshot %d): acknowledged again",
                commit_ids,
                self.table,
                snapshot_id,
                extra=self._extra(snapshot_id=snapshot_id, commit_ids=commit_ids),
            )
            latency_ms = max(0, now_ms() - produced_at_ms)
            if snapshot is None:
                # Expired since: the dedup ledger still records it, and the answer says so.
                self.coordinator.metrics.acknowledged_expired.inc()
                messages.append(
                    TableCommitted(
                        table=self.table,
                        snapshot_id=snapshot_id,
                        sequence_number=0,
                        metadata_location=table.metadata_location,
                        commit_ids=tuple(dict.fromkeys(commit_ids)),
                        latency_ms=latency_ms,
                        orphan_files=tuple(orphans),
                        snapshot_expired=True,
                    )
                )
                continue
            branch = next(
                (n for n, r in table.metadata.refs.items() if r.snapshot_id == snapshot_id),
                "main",
            )
            messages.append(
                _table_committed(
                    self.table,
                    snapshot,
                    branch,
                    table.metadata_location,
                    commit_ids,
                    latency_ms,
                    orphans,
                )
            )
        await self.coordinator.publish_results(messages)


def _committed_paths(event: FilesWritten) -> list[str]:
    """The files of an event that a snapshot holding its commit id holds: all of them but
    equality-delete files, which are an upsert's key files (resolved, never committed)."""
    return [
        f["file-path"]
        for f in (*event.data_files, *event.delete_files)
        if f.get("content") != "equality-deletes"
    ]


def _unit_commit_id(event: FilesWritten | CommitRequested) -> str | None:
    """The commit id an event makes ready by itself (a request or a streaming event)."""
    if isinstance(event, CommitRequested):
        return event.commit_id
    return event.commit_id if event.complete else None


def _table_committed(
    table: str,
    snapshot: Snapshot,
    branch: str,
    metadata_location: str,
    commit_ids: Sequence[str],
    latency_ms: int,
    orphan_files: Sequence[str],
) -> TableCommitted:
    summary = snapshot.summary or Summary(None)

    def count(key: str) -> int:
        value = summary.get_int(key)
        return value if value is not None and value >= 0 else 0

    return TableCommitted(
        table=table,
        branch=branch,
        snapshot_id=snapshot.snapshot_id,
        sequence_number=max(0, snapshot.sequence_number),
        metadata_location=metadata_location,
        commit_ids=tuple(dict.fromkeys(commit_ids)),
        added_data_files=count(Summary.ADDED_DATA_FILES),
        added_delete_files=count(Summary.ADDED_DELETE_FILES),
        removed_data_files=count(Summary.DELETED_DATA_FILES),
        removed_delete_files=count(Summary.REMOVED_DELETE_FILES),
        added_records=count(Summary.ADDED_RECORDS),
        added_files_size=count(Summary.ADDED_FILES_SIZE),
        latency_ms=latency_ms,
        orphan_files=tuple(orphan_files),
    )
