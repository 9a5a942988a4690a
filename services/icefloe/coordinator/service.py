"""The coordinator service: files-written events on Kafka become few, exactly-once snapshots.

Writers publish what they wrote (:mod:`icefloe.events`); this service, one consumer group
with any number of replicas, commits it. Kafka partition assignment decides which replica
owns which tables, because events are keyed by table: all of a table's events are in one
partition, in order.

Flow
----
The consume loop reads records and parses them. Anything that is not a valid event is
dead-lettered at once. Valid events go to their table's worker, an asyncio task that exists
only while its table has work, so an idle table costs nothing and never holds up another.
A worker loads its table lazily (on its first event), checks each event against the table
(:class:`~icefloe.coordinator.committer.TableCommitter`), feeds the per-table state machine
(:class:`~icefloe.coordinator.batcher.TableBatcher`) and commits the batches it releases, one at a
time; different tables commit in parallel.

Exactly once
------------
Correctness never depends on Kafka transactions or the idempotent producer; it rests on the
table itself:

1. *Units.* A commit id becomes ready with its commit-requested (taking the files-written
   events it names, leaving other attempts' files out and reporting them as orphans) or as a
   files-written event with ``complete: true``. Units commit in arrival order; runs of
   appends, and runs of upserts, are batched into one snapshot
   (:mod:`icefloe.coordinator.batcher`). Upserts are resolved in that order into row
   deletes (:mod:`icefloe.coordinator.upsert`); their key files are deleted once the
   commit holding them is announced.
2. *The table records what it holds.* Each snapshot's summary carries ``icefloe.commit-ids``,
   ``icefloe.offsets`` (the table's safe resume point per source partition: every one of its
   events below it is done) and ``icefloe.positions`` (how far the committer had read, as a
   running maximum). See :mod:`icefloe.coordinator.committer`.
3. *Check on every base, by commit id.* Before each attempt, and on the reloaded table
   after each conflict, the committer drops units whose commit ids the table already holds
   (the dedup index over every snapshot it lists, :mod:`icefloe.commit_index`, kept
   incrementally) and refuses files already live. The catalog's conditional swap
   serializes committers, so a restarted process, a new owner after a rebalance, or a
   zombie replica still consuming the same partition can never apply a commit id twice or
   add a file twice. An unknown swap outcome is resolved by reloading and checking, never
   by a blind retry. Events whose commit id the table holds are acknowledged again (a new
   ``table-committed`` naming the snapshot that holds it), not dead-lettered.
4. *Skip what is done, announce it again.* When a worker loads its table it reads the
   highest resume point recorded for its partition (unless it was recorded for another
   incarnation of the topic: another Kafka topic id, or a position beyond the partition's
   end; then nothing is skipped by offset) and skips the table's
   events below it, announcing again each commit among them the table holds: a crash
   between the catalog swap and the announcement leaves exactly those events to re-read.
5. *Kafka offsets last.* Offsets are committed (manually) only after the table commit and
   its announcement, as each partition's low watermark: the smallest offset any of its
   tables still tracks (received, pending, ready or being committed; a dead-lettered event
   counts as done once the dead-letter topic acknowledged it), else the position. A crash
   anywhere therefore only re-reads events, and steps 3 and 4 make re-reading harmless.

Validation never blocks a partition: an invalid event (malformed, unknown table, schema or
spec, partition values of the wrong type, inconsistent counts, a path outside the table or
with ``..``, a missing file or a wrong size, a file already in the table, a request naming
events that never arrived, files-written events abandoned without a request) is published
to the dead-letter topic with its original bytes and a reason ``<kind>: <message>``, and is
then done. Each snapshot is announced by a ``table-committed`` event on the results topic.

Operations: ``/healthz``, ``/readyz`` (ready once the consumer has joined its group) and
``/metrics`` (:mod:`icefloe.runtime.http`); structured JSON logs; on SIGTERM or SIGINT it
stops consuming, commits every ready unit, commits its Kafka offsets and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import logging
import signal
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.admin import NewTopic
from aiokafka.errors import KafkaError, MessageSizeTooLargeError
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from icefloe.catalog import Catalog, Table
from icefloe.catalog_uri import load_catalog
from icefloe.commit_index import dedup_window_ms
from icefloe.coordinator.batcher import (
    Admission,
    Batch,
    BatchLimits,
    CommitStatus,
    OffsetSet,
    PendingFiles,
    SourceEvent,
    TableBatcher,
    Unit,
)
from icefloe.coordinator.committer import (
    CommitHooks,
    CommitOutcome,
    TableCommitter,
    install_commit_hooks,
    source_key,
)
from icefloe.coordinator.config import CoordinatorConfig, add_arguments, overrides_from_args
from icefloe.coordinator.maintenance import MaintenanceRunner, producer_publish, settings_from
from icefloe.coordinator.upsert import KeyIndexOpener
from icefloe.datafile import DataFile
from icefloe.decoded_writer import DecodedManifestWriter
from icefloe.errors import (
    EventRejectedError,
    NotFoundError,
    UnsupportedFormatVersion,
    ValidationError,
)
from icefloe.events import (
    CommitRequested,
    DeadLetter,
    FilesWritten,
    TableCommitted,
    encode_event,
    event_key,
    now_ms,
    parse_event,
)
from icefloe.key_index import KeyIndex
from icefloe.manifest_reader import ManifestReader
from icefloe.manifest_store import ManifestStore
from icefloe.retry import Backoff, Retry, RetryEvent
from icefloe.runtime import kafka
from icefloe.runtime.command import ArgumentParser, run_command
from icefloe.runtime.http import ServiceHttp
from icefloe.runtime.logs import configure_logging
from icefloe.runtime.topic_ids import topic_ids
from icefloe.snapshot import Snapshot, Summary

log = logging.getLogger("icefloe.coordinator")

_BACKOFF_MIN_S = 0.1
_BACKOFF_MAX_S = 10.0
_MISSING_TABLE_RECHECK_S = 1.0
_WORKER_RESTART_S = 1.0
_INTAKE_SLICE_S = 0.05
_INTAKE_BATCH = 128
_CONCURRENT_CHECKS = 16
_MAX_REQUEST_BYTES = 64 << 20


# Retries of storage, catalog and Kafka calls: 0.2s, 0.4s, ... up to 10s, until they pass.
_BACKOFF = Backoff(_BACKOFF_MIN_S, _BACKOFF_MAX_S, jitter=False)


# -- metrics -----------------------------------------------------------------------------


class CoordinatorMetrics:
    """The service's Prometheus series, in a registry of its own."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        p = "icefloe_coordinator"
        self.consumed = Counter(f"{p}_events_consumed", "Records read", ["type"], registry=r)
        self.batched = Counter(
            f"{p}_events_batched", "Events taken into ready commit units", ["type"], registry=r
        )
        self.committed = Counter(
            f"{p}_events_committed", "Events whose commit reached the table", registry=r
        )
        self.dead_lettered = Counter(
            f"{p}_events_dead_lettered",
            "Events sent to the dead-letter topic",
            ["reason"],
            registry=r,
        )
        self.skipped = Counter(
            f"{p}_events_skipped", "Events found already done", ["why"], registry=r
        )
        self.snapshots = Counter(f"{p}_snapshots_committed", "Snapshots committed", registry=r)
        self.files = Counter(f"{p}_files_committed", "Files added by commits", registry=r)
        self.commit_latency = Histogram(
            f"{p}_commit_latency_seconds",
            "From the oldest included event's produced-at to the table commit",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900),
            registry=r,
        )
        self.commit_duration = Histogram(
            f"{p}_commit_duration_seconds", "Time spent committing one batch", registry=r
        )
        self.conflicts = Counter(
            f"{p}_commit_conflicts", "Commits that lost the catalog swap", registry=r
        )
        self.retries = Counter(f"{p}_commit_retries", "Commit attempts after the first", registry=r)
        self.lag = Gauge(
            f"{p}_consumer_lag", "High watermark minus position", ["partition"], registry=r
        )
        self.tables_active = Gauge(f"{p}_tables_active", "Tables with a running worker", registry=r)
        self.partitions = Gauge(f"{p}_partitions_assigned", "Assigned partitions", registry=r)
        self.dead_letters_too_large = Counter(
            f"{p}_dead_letters_too_large",
            "Dead letters the dead-letter topic refused as too large (retried, never cut)",
            registry=r,
        )
        self.topic_recreated = Counter(
            f"{p}_topic_recreated",
            "Tables whose recorded resume point belongs to another incarnation of the topic "
            "(re-created or truncated: another topic id, or offsets beyond its end)",
            ["partition"],
            registry=r,
        )
        self.acknowledged_expired = Counter(
            f"{p}_acknowledged_expired",
            "Commit ids acknowledged again whose snapshot was since expired (from the ledger)",
            registry=r,
        )
        self.pending = Gauge(
            f"{p}_pending_events",
            "files-written events waiting for their commit-requested",
            registry=r,
        )
        self.pending_oldest = Gauge(
            f"{p}_pending_oldest_seconds",
            "How long the oldest pending files-written event has waited",
            registry=r,
        )
        self.dedup_gap = Gauge(
            f"{p}_dedup_window_gap_seconds",
            "How much of the dedup window the table's retained history may not cover",
            ["table"],
            registry=r,
        )


# How long a topic id read from the broker is reused (tables load in bursts).
_TOPIC_ID_TTL_S = 1.0

# At a stop, how long the coordinator waits for queued planner-cache fills (commits are
# already acknowledged; a fill left behind only means the planner decodes those manifests).
_CACHE_FLUSH_S = 10.0


class _PlannerCacheCollector:
    """The decoded-manifest writer's counts (the planner-cache fills), read at scrape time."""

    def __init__(self, writer: DecodedManifestWriter) -> None:
        self.writer = writer

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        stats = self.writer.stats
        family = CounterMetricFamily(
            "icefloe_coordinator_planner_cache_manifests",
            "Committed manifests handed to the planner's disk cache, by outcome (written; "
            "skipped: partition values the cache cannot hold; failed; dropped: queue full)",
            labels=["outcome"],
        )
        for outcome, value in (
            ("written", stats.written),
            ("skipped", stats.skipped),
            ("failed", stats.failed),
            ("dropped", stats.dropped),
        ):
            family.add_metric([outcome], value)
        yield family
        pending = GaugeMetricFamily(
            "icefloe_coordinator_planner_cache_pending_bytes",
            "Bytes of committed manifests queued for the planner's disk cache",
        )
        pending.add_metric([], stats.pending_bytes)
        yield pending


# -- state per partition and per table --------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Record:
    """What the coordinator keeps of a consumer record."""

    offset: int
    key: bytes | None
    value: bytes

    @property
    def source(self) -> SourceEvent:
        return SourceEvent(self.value, self.key, self.offset)


class PartitionState:
    """One assigned source partition: its position, its tables and its loose offsets."""

    def __init__(self, tp: TopicPartition) -> None:
        self.tp = tp
        self.source = source_key(tp.topic, tp.partition)
        self.position: int | None = None
        self.committed: int | None = None
        self.tables: dict[str, TableWorker] = {}
        self.loose = OffsetSet()  # records no table owns (unparseable), until dead-lettered
        self.revoked = False

    def low_watermark(self) -> int | None:
        """The Kafka offset it is safe to commit: nothing below it is still to be done."""
        if self.position is None:
            return None
        candidates = [self.position]
        loose = self.loose.min()
        if loose is not None:
            candidates.append(loose)
        for worker in self.tables.values():
            smallest = worker.batcher.min_tracked
            if smallest is not None:
                candidates.append(smallest)
        return min(candidates)


class _Revoked(Exception):
    """The partition went away while a worker was waiting: stop without finishing."""


class TableWorker:
    """Everything the coordinator does for one table of one partition."""

    def __init__(self, coordinator: Coordinator, partition: PartitionState, table: str) -> None:
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
        )
        self.inbox: deque[tuple[_Record, FilesWritten | CommitRequested]] = deque()
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

    def receive(self, record: _Record, event: FilesWritten | CommitRequested) -> None:
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
        items: list[tuple[_Record, FilesWritten | CommitRequested]] = []
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
                try:
                    await self._handle(record, event, checks.pop(record.offset, None))
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

        policy = Retry(_BACKOFF, permanent=(EventRejectedError, NotFoundError), on_retry=on_retry)
        return await policy.call(action)

    # -- events ----------------------------------------------------------------------------

    async def _handle(
        self,
        record: _Record,
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

    async def _ensure_loaded(self, record: _Record) -> bool:
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
        record: _Record,
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

    async def _committed_elsewhere(self, event: FilesWritten, record: _Record) -> bool:
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

    async def _late_files(self, record: _Record, event: FilesWritten, status: CommitStatus) -> None:
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
            if all(path in paths for path in _committed_paths(event)):
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

    async def _on_request(self, record: _Record, request: CommitRequested) -> None:
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


# -- the service -------------------------------------------------------------------------


class _Listener(ConsumerRebalanceListener):
    def __init__(self, coordinator: Coordinator) -> None:
        self.coordinator = coordinator

    async def on_partitions_revoked(self, revoked: Iterable[TopicPartition]) -> None:
        await self.coordinator._on_revoked(list(revoked))

    async def on_partitions_assigned(self, assigned: Iterable[TopicPartition]) -> None:
        await self.coordinator._on_assigned(list(assigned))


class Coordinator:
    """The running service; :meth:`run` until :meth:`request_stop` (or a signal)."""

    def __init__(
        self,
        config: CoordinatorConfig,
        *,
        catalog: Catalog | None = None,
        hooks: CommitHooks | None = None,
    ) -> None:
        self.config = config
        self.hooks = hooks if hooks is not None else CommitHooks()
        self.catalog = catalog if catalog is not None else load_catalog(config.catalog)
        self._owns_catalog = catalog is None
        install_commit_hooks(self.catalog, self.hooks)
        store = (
            ManifestStore(config.planner_cache_dir, config.planner_cache_disk_max_bytes)
            if config.planner_cache_dir
            else None
        )
        self.reader = ManifestReader(self.catalog.io, store=store)
        self.default_limits = BatchLimits(
            config.batch_max_files, config.batch_max_bytes, config.batch_max_wait_ms
        )
        # Every table's key index opens here: the one place its settings are bound.
        self.open_key_index: KeyIndexOpener = functools.partial(
            KeyIndex.open,
            memory_budget_bytes=config.key_index_memory_bytes,
            spill_dir=config.key_index_spill_dir,
        )
        self.metrics = CoordinatorMetrics()
        self._topic_ids: dict[str, tuple[float, str | None]] = {}
        if self.reader.decoded_writer is not None:
            self.metrics.registry.register(_PlannerCacheCollector(self.reader.decoded_writer))
        self.http = ServiceHttp(
            self.metrics.registry,
            ready=lambda: self.ready,
            healthy=lambda: not self._failed,
            host=config.http_host,
            port=config.http_port,
            detail=self.readiness_detail,
            access_log=config.access_log,
        )
        self.partitions: dict[TopicPartition, PartitionState] = {}
        self.inflight = 0
        self.pending_count = 0
        self.pending_oldest_s = 0.0
        self.draining = False
        self.offsets_dirty = asyncio.Event()
        self._stop = asyncio.Event()
        self._joined = False
        self._failed = False
        self._commit_lock = asyncio.Lock()
        self._background: set[asyncio.Task[Any]] = set()
        self._lag_labels: set[str] = set()
        self.consumer: AIOKafkaConsumer | None = None
        self.producer: AIOKafkaProducer | None = None
        # Maintenance of the tables this replica owns (icefloe.coordinator.maintenance).
        self.maintenance = MaintenanceRunner(
            self.catalog,
            settings_from(config),
            self.metrics.registry,
            lambda: [t for ps in self.partitions.values() if not ps.revoked for t in ps.tables],
            publish=producer_publish(lambda: self.producer),
            reader=self.reader,
        )

    @property
    def ready(self) -> bool:
        return self._joined and not self._stop.is_set()

    @property
    def active_tables(self) -> int:
        """Tables whose worker is running (has events to handle or units to commit)."""
        return sum(1 for w in self._workers() if w.running)

    def request_stop(self) -> None:
        if not self._stop.is_set():
            log.info("stop requested: finishing ready commits, then exiting")
        self._stop.set()

    # -- lifecycle -------------------------------------------------------------------------

    async def run(self) -> None:
        """Serve until stopped; commits ready work and Kafka offsets before returning."""
        config = self.config
        options = config.kafka_options()
        await self.http.start()
        try:
            if config.create_topics:
                await self._create_topics(options)
            # Dead letters carry their original byte for byte (base64, so 4/3 of it): the
            # client must never be the limit; the broker's topic setting is.
            self.producer = kafka.producer(options, max_request_size=_MAX_REQUEST_BYTES)
            await self.producer.start()
            self.consumer = kafka.group_consumer(
                options,
                config.group_id,
                session_timeout_ms=config.session_timeout_ms,
                heartbeat_interval_ms=config.effective_heartbeat_interval_ms,
                max_partition_fetch_bytes=4 << 20,
            )
            self.consumer.subscribe([config.events_topic], listener=_Listener(self))
            await self.consumer.start()
            housekeeping = asyncio.create_task(self._housekeeping(), name="icefloe-offsets")
            self.maintenance.start()
            try:
                await self._consume()
                await self._drain()
            finally:
                housekeeping.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await housekeeping
        except BaseException:
            self._failed = True
            raise
        finally:
            await self._close()

    async def _close(self) -> None:
        await self.maintenance.stop()
        for worker in self._workers():
            if worker.running and worker.task is not None:
                worker.task.cancel()
        await kafka.stop_quietly(self.consumer, self.producer)
        writer = self.reader.decoded_writer
        if writer is not None and not await asyncio.to_thread(writer.flush, _CACHE_FLUSH_S):
            log.warning(
                "stopping with %d decoded manifest(s) not yet in the planner cache; the "
                "planner will decode them itself",
                writer.stats.pending,
            )
        for task in list(self._background):
            task.cancel()
        await self.http.stop()
        if self._owns_catalog:
            await self.catalog.close()

    async def _create_topics(self, options: Mapping[str, Any]) -> None:
        config = self.config
        admin = kafka.admin(options)
        await admin.start()
        try:
            existing = set(await admin.list_topics())
            wanted = [
                NewTopic(name, config.topic_partitions, config.topic_replication_factor)
                for name in (
                    config.events_topic,
                    config.results_topic,
                    config.dead_letter_topic,
                    config.maintenance_topic,
                )
                if name not in existing
            ]
            if wanted:
                response = await admin.create_topics(wanted)
                for topic, code, message in getattr(response, "topic_errors", ()):
                    if code not in (0, 36):  # 36: created meanwhile by someone else
                        raise KafkaError(f"cannot create topic {topic!r}: {message} ({code})")
                log.info("created topics %s", [t.name for t in wanted])
        finally:
            await admin.close()

    def _workers(self) -> list[TableWorker]:
        return [w for ps in self.partitions.values() for w in ps.tables.values()]

    async def _consume(self) -> None:
        assert self.consumer is not None
        while not self._stop.is_set():
            while self.inflight >= self.config.max_inflight_events and not self._stop.is_set():
                await asyncio.sleep(0.01)
            fetch = asyncio.ensure_future(self.consumer.getmany(timeout_ms=200, max_records=2000))
            stop = asyncio.ensure_future(self._stop.wait())
            done, _ = await asyncio.wait({fetch, stop}, return_when=asyncio.FIRST_COMPLETED)
            if fetch not in done:
                fetch.cancel()
                with contextlib.suppress(asyncio.CancelledError, KafkaError):
                    await fetch
                stop.cancel()
                return
            stop.cancel()
            for tp, records in fetch.result().items():
                ps = self.partitions.get(tp)
                if ps is None or ps.revoked:
                    continue
                for rec in records:
                    if ps.position is not None and rec.offset < ps.position:
                        continue
                    ps.position = rec.offset + 1
                    self._dispatch(ps, _Record(rec.offset, rec.key, rec.value or b""))

    def _dispatch(self, ps: PartitionState, record: _Record) -> None:
        metrics = self.metrics
        try:
            event = parse_event(record.value)
        except ValidationError as e:
            metrics.consumed.labels("invalid").inc()
            kind = "unsupported-version" if isinstance(e, UnsupportedFormatVersion) else "malformed"
            self._dead_letter_loose(ps, record, EventRejectedError(kind, str(e)))
            return
        metrics.consumed.labels(event.type).inc()
        if not isinstance(event, FilesWritten | CommitRequested):
            self._dead_letter_loose(
                ps,
                record,
                EventRejectedError(
                    "unexpected-type",
                    f"{event.type} event {event.event_id} does not belong on the events topic "
                    f"{self.config.events_topic!r}",
                ),
            )
            return
        worker = ps.tables.get(event.table)
        if worker is None:
            worker = ps.tables[event.table] = TableWorker(self, ps, event.table)
        worker.receive(record, event)

    async def _drain(self) -> None:
        """Shutdown: commit everything ready, wait for it, and commit Kafka offsets."""
        self.draining = True
        workers = [w for w in self._workers() if w.batcher.has_work or w.running]
        for worker in workers:
            worker.ensure_running()
        tasks = [w.task for w in workers if w.task is not None]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=self.config.shutdown_timeout_ms / 1000.0)
            for task in pending:
                task.cancel()
            if pending:
                log.warning(
                    "%d table(s) did not finish committing before the deadline", len(pending)
                )
                await asyncio.gather(*pending, return_exceptions=True)
        await self._wait_background()
        await self.commit_offsets()
        log.info("stopped cleanly")

    # -- rebalances ------------------------------------------------------------------------

    async def _on_assigned(self, assigned: list[TopicPartition]) -> None:
        for tp in assigned:
            if tp not in self.partitions:
                self.partitions[tp] = PartitionState(tp)
        self._joined = True
        self.metrics.partitions.set(len(self.partitions))
        log.info("assigned %s", sorted(f"{tp.topic}/{tp.partition}" for tp in assigned))

    async def _on_revoked(self, revoked: list[TopicPartition]) -> None:
        states = [self.partitions[tp] for tp in revoked if tp in self.partitions]
        tasks = []
        for ps in states:
            ps.revoked = True
            for worker in ps.tables.values():
                if worker.running and worker.task is not None:
                    worker.wakeup.set()
                    tasks.append(worker.task)
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=self.config.session_timeout_ms / 1000.0)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        await self.commit_offsets([ps.tp for ps in states])
        for ps in states:
            self.partitions.pop(ps.tp, None)
            if ps.source in self._lag_labels:
                self._lag_labels.discard(ps.source)
                self.metrics.lag.remove(ps.source)
        self.metrics.partitions.set(len(self.partitions))
        if states:
            log.info("revoked %s", sorted(ps.source for ps in states))

    # -- offsets and housekeeping ----------------------------------------------------------

    async def commit_offsets(self, only: Sequence[TopicPartition] | None = None) -> None:
        """Commit each partition's low watermark, if it moved."""
        if self.consumer is None:
            return
        async with self._commit_lock:
            offsets: dict[TopicPartition, int] = {}
            for tp, ps in self.partitions.items():
                if only is not None and tp not in only:
                    continue
                mark = ps.low_watermark()
                if mark is not None and (ps.committed is None or mark > ps.committed):
                    offsets[tp] = mark
            if not offsets:
                return
            try:
                await self.consumer.commit(offsets)
            except KafkaError as e:
                log.warning("committing Kafka offsets failed (%s); will retry", e)
                return
            for tp, mark in offsets.items():
                ps_ = self.partitions.get(tp)
                if ps_ is not None:
                    ps_.committed = mark

    async def _housekeeping(self) -> None:
        interval = self.config.offset_commit_interval_ms / 1000.0
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.offsets_dirty.wait(), interval)
            self.offsets_dirty.clear()
            try:
                await self.commit_offsets()
                self._update_lag()
                self._mark_abandoned()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("housekeeping failed")
            await asyncio.sleep(min(interval, 0.05))

    def _update_lag(self) -> None:
        if self.consumer is None:
            return
        for tp, ps in list(self.partitions.items()):
            if ps.position is None:
                continue
            try:
                highwater = self.consumer.highwater(tp)
            except Exception:
                continue
            if highwater is not None:
                self.metrics.lag.labels(ps.source).set(max(0, highwater - ps.position))
                self._lag_labels.add(ps.source)

    def _mark_abandoned(self) -> None:
        """Make stuck files-written events visible, and dead-letter them once they are
        older than ``abandon_after_ms`` (they hold the partition's offset back until then)."""
        now = time.monotonic()
        limit_s = self.config.abandon_after_ms / 1000.0
        cutoff = now - limit_s
        count = 0
        oldest: float | None = None
        for worker in self._workers():
            if not worker.batcher.pending_count:
                continue
            pending = worker.batcher.pending_events()
            count += len(pending)
            first = min(p.received_at for p in pending)
            oldest = first if oldest is None else min(oldest, first)
            if first <= cutoff:
                worker.sweep_due = True
                worker.ensure_running()
            elif now - first >= limit_s / 2 and now - worker.stuck_warned_at >= 60.0:
                worker.stuck_warned_at = now
                log.warning(
                    "table %s has %d files-written event(s) waiting %.0fs for their "
                    "commit-requested (commit ids %s); they hold partition %s's committed "
                    "offset back and are dead-lettered as abandoned after %.0fs",
                    worker.table,
                    len(pending),
                    now - first,
                    sorted({p.event.commit_id for p in pending})[:10],
                    worker.partition.source,
                    limit_s,
                    extra=worker._extra(pending=len(pending), waiting_s=now - first),
                )
        self.pending_count = count
        self.pending_oldest_s = 0.0 if oldest is None else now - oldest
        self.metrics.pending.set(count)
        self.metrics.pending_oldest.set(self.pending_oldest_s)

    def readiness_detail(self) -> str:
        """Lines /readyz adds: what holds offsets back."""
        return (
            f"pending files-written events: {self.pending_count} (oldest waiting "
            f"{self.pending_oldest_s:.0f}s; abandoned after "
            f"{self.config.abandon_after_ms / 1000.0:.0f}s)\n"
        )

    async def topic_id(self, topic: str) -> str | None:
        """The topic's Kafka id now (None when the broker cannot tell), asked at most once
        a second: tables load in bursts after an assignment."""
        cached = self._topic_ids.get(topic)
        now = time.monotonic()
        if cached is not None and now - cached[0] < _TOPIC_ID_TTL_S:
            return cached[1]
        if self.consumer is None:
            return None
        found = (await topic_ids(self.consumer, [topic])).get(topic)
        self._topic_ids[topic] = (now, found)
        return found

    async def end_offset(self, tp: TopicPartition) -> int | None:
        """The partition's end offset (high watermark), None when it cannot be known."""
        if self.consumer is None:
            return None
        with contextlib.suppress(Exception):
            highwater = self.consumer.highwater(tp)
            if highwater is not None:
                return int(highwater)
        try:
            ends = await self.consumer.end_offsets([tp])
        except Exception as e:  # not knowing only means not checking
            log.warning("reading the end offset of %s failed: %s", tp, e)
            return None
        value = ends.get(tp)
        return None if value is None else int(value)

    # -- producing -------------------------------------------------------------------------

    async def _send_until_acked(self, topic: str, value: bytes, key: bytes | None) -> None:
        assert self.producer is not None
        producer = self.producer

        def on_retry(event: RetryEvent) -> None:
            log.warning(
                "producing to %s failed (%s); retrying in %.1fs", topic, event.error, event.delay_s
            )

        policy = Retry(
            _BACKOFF,
            transient=(KafkaError,),
            permanent=(MessageSizeTooLargeError,),
            on_retry=on_retry,
        )
        await policy.call(lambda: producer.send_and_wait(topic, value=value, key=key))

    async def publish_results(self, messages: Sequence[TableCommitted]) -> None:
        await asyncio.gather(
            *(
                self._send_until_acked(
                    self.config.results_topic, encode_event(m), event_key(m.table)
                )
                for m in messages
            )
        )

    def _dead_letter_value(
        self, ps: PartitionState, event: SourceEvent, error: EventRejectedError, table: str | None
    ) -> DeadLetter:
        return DeadLetter.for_bytes(
            event.raw,
            f"{error.kind}: {error}",
            ps.tp.topic,
            ps.tp.partition,
            event.offset,
            key=event.key,
            table=table,
        )

    async def dead_letter(
        self,
        ps: PartitionState,
        events: Sequence[SourceEvent],
        error: EventRejectedError,
        *,
        table: str | None = None,
    ) -> None:
        """Publish dead letters and wait for the acknowledgement (then they are done)."""
        await asyncio.gather(*(self._send_dead_letter(ps, e, error, table) for e in events))

    async def _send_dead_letter(
        self, ps: PartitionState, event: SourceEvent, error: EventRejectedError, table: str | None
    ) -> None:
        self.metrics.dead_lettered.labels(error.kind).inc()
        log.info(
            "dead-lettered offset %d: %s: %s",
            event.offset,
            error.kind,
            error,
            extra={
                "partition": ps.source,
                "offset": event.offset,
                "kind": error.kind,
                "table": table,
            },
        )
        letter = self._dead_letter_value(ps, event, error, table)
        value = encode_event(letter)

        def on_too_large(retry: RetryEvent) -> None:
            # Never cut the original and never drop it: the event stays not done (its
            # offset is held) until the dead-letter topic accepts it, loudly.
            self.metrics.dead_letters_too_large.inc()
            log.error(
                "dead letter for offset %d of %s (%d bytes) is larger than the "
                "dead-letter topic %r accepts (%s): raise that topic's max.message.bytes "
                "(and the brokers' message.max.bytes); retrying in %.0fs, the partition's "
                "offset is held until then",
                event.offset,
                ps.source,
                len(value),
                self.config.dead_letter_topic,
                retry.error,
                retry.delay_s,
                extra={"partition": ps.source, "offset": event.offset, "bytes": len(value)},
            )

        policy = Retry(_BACKOFF, transient=(MessageSizeTooLargeError,), on_retry=on_too_large)
        await policy.call(
            lambda: self._send_until_acked(self.config.dead_letter_topic, value, event.key)
        )

    def _dead_letter_loose(
        self, ps: PartitionState, record: _Record, error: EventRejectedError
    ) -> None:
        """Dead-letter a record no table owns, without holding up the consume loop."""
        ps.loose.add(record.offset)

        async def send() -> None:
            try:
                await self._send_dead_letter(ps, record.source, error, None)
            finally:
                ps.loose.discard(record.offset)
                self.offsets_dirty.set()

        self._spawn(send())

    def _spawn(self, coro: Awaitable[None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _wait_background(self) -> None:
        if self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)


# -- entry points ------------------------------------------------------------------------


async def run_coordinator(
    config: CoordinatorConfig,
    *,
    install_signal_handlers: bool = True,
    hooks: CommitHooks | None = None,
) -> int:
    """Run the service until SIGTERM/SIGINT; 0 after a clean stop."""
    coordinator = Coordinator(config, hooks=hooks)
    loop = asyncio.get_running_loop()
    if install_signal_handlers:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, coordinator.request_stop)
    try:
        await coordinator.run()
    finally:
        if install_signal_handlers:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
    return 0


async def run_from_args(args: argparse.Namespace, hooks: CommitHooks | None = None) -> int:
    """The ``icefloe coordinator`` subcommand: environment settings, flags on top."""
    config = CoordinatorConfig.load(overrides_from_args(args))
    configure_logging(config.log_level, config.log_format)
    return await run_coordinator(config, hooks=hooks)


def main(argv: Sequence[str] | None = None, *, hooks: CommitHooks | None = None) -> int:
    """``python -m icefloe.coordinator [flags]``: the same as ``icefloe coordinator``.

    ``hooks`` observes every commit's stages (tests pass one that ends the process at a
    stage); by default nothing observes them.
    """
    parser = ArgumentParser(
        prog="icefloe coordinator",
        description="the commit coordinator service (flags override ICEFLOE_*)",
    )
    add_arguments(parser)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    return run_command(run_from_args(args, hooks))


if __name__ == "__main__":
    sys.exit(main())
