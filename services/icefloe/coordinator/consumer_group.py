"""The consumer group: reading the events topic, handing each record to its table's worker,
following rebalances, and committing Kafka offsets last.

Why a module: this is the Kafka side of the service, and step 5 of the exactly-once argument
(:mod:`icefloe.coordinator.service`): records are dispatched in partition order (anything that
is not a valid event is dead-lettered at once), a revoked partition's workers stop before its
offsets are committed, and each partition's offset is committed only up to its low watermark
(:mod:`icefloe.coordinator.offsets`), after the table commit and its announcement. It is also
what a table worker runs under (:class:`~icefloe.coordinator.table_worker.TableHost`): the
wiring the service made, the events in flight, and the outbox it hands messages to.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Iterable, Mapping, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError

from icefloe.coordinator.batcher import BatchLimits, SourceEvent
from icefloe.coordinator.commit_hooks import CommitHooks
from icefloe.coordinator.config import CoordinatorConfig
from icefloe.coordinator.metrics import CoordinatorMetrics
from icefloe.coordinator.offsets import ConsumedRecord, PartitionState
from icefloe.coordinator.outbox import Outbox
from icefloe.coordinator.table_worker import TableWorker
from icefloe.coordinator.upsert import KeyIndexOpener
from icefloe.errors import EventRejectedError, UnsupportedFormatVersion, ValidationError
from icefloe.events import CommitRequested, FilesWritten, TableCommitted, parse_event
from icefloe.manifests.reader import ManifestReader
from icefloe.runtime import kafka
from icefloe.runtime.topic_ids import topic_ids
from icefloe.table.catalog import Catalog

log = logging.getLogger("icefloe.coordinator")

# How long a topic id read from the broker is reused (tables load in bursts).
_TOPIC_ID_TTL_S = 1.0


class _Listener(ConsumerRebalanceListener):
    def __init__(self, coordinator: ConsumerGroup) -> None:
        self.coordinator = coordinator

    async def on_partitions_revoked(self, revoked: Iterable[TopicPartition]) -> None:
        await self.coordinator._on_revoked(list(revoked))

    async def on_partitions_assigned(self, assigned: Iterable[TopicPartition]) -> None:
        await self.coordinator._on_assigned(list(assigned))


class ConsumerGroup:
    """The consume side of the service: partitions, their table workers and their offsets."""

    def __init__(
        self,
        config: CoordinatorConfig,
        metrics: CoordinatorMetrics,
        outbox: Outbox,
        *,
        catalog: Catalog,
        hooks: CommitHooks,
        reader: ManifestReader,
        default_limits: BatchLimits,
        open_key_index: KeyIndexOpener,
    ) -> None:
        self.config = config
        self.metrics = metrics
        self.outbox = outbox
        self.catalog = catalog
        self.hooks = hooks
        self.reader = reader
        self.default_limits = default_limits
        self.open_key_index = open_key_index
        self._topic_ids: dict[str, tuple[float, str | None]] = {}
        self.partitions: dict[TopicPartition, PartitionState[TableWorker]] = {}
        self.inflight = 0
        self.pending_count = 0
        self.pending_oldest_s = 0.0
        self.draining = False
        self.offsets_dirty = asyncio.Event()
        self._stop = asyncio.Event()
        self._joined = False
        self._commit_lock = asyncio.Lock()
        self._background: set[asyncio.Task[Any]] = set()
        self._lag_labels: set[str] = set()
        self.consumer: AIOKafkaConsumer | None = None

    @property
    def ready(self) -> bool:
        return self._joined and not self._stop.is_set()

    @property
    def active_tables(self) -> int:
        """Tables whose worker is running (has events to handle or units to commit)."""
        return sum(1 for w in self.workers() if w.running)

    def request_stop(self) -> None:
        if not self._stop.is_set():
            log.info("stop requested: finishing ready commits, then exiting")
        self._stop.set()

    async def start(self, options: Mapping[str, Any]) -> None:
        """Join the group: subscribe to the events topic and start consuming."""
        config = self.config
        self.consumer = kafka.group_consumer(
            options,
            config.group_id,
            session_timeout_ms=config.session_timeout_ms,
            heartbeat_interval_ms=config.effective_heartbeat_interval_ms,
            max_partition_fetch_bytes=4 << 20,
        )
        self.consumer.subscribe([config.events_topic], listener=_Listener(self))
        await self.consumer.start()

    def cancel_workers(self) -> None:
        """At close: stop every running table worker (a drain has finished what it could)."""
        for worker in self.workers():
            if worker.running and worker.task is not None:
                worker.task.cancel()

    def cancel_background(self) -> None:
        """At close: stop the dead letters of loose records still being sent."""
        for task in list(self._background):
            task.cancel()

    def workers(self) -> list[TableWorker]:
        return [w for ps in self.partitions.values() for w in ps.tables.values()]

    async def consume(self) -> None:
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
                    self._dispatch(ps, ConsumedRecord(rec.offset, rec.key, rec.value or b""))

    def _dispatch(self, ps: PartitionState, record: ConsumedRecord) -> None:
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

    async def drain(self) -> None:
        """Shutdown: commit everything ready, wait for it, and commit Kafka offsets."""
        self.draining = True
        workers = [w for w in self.workers() if w.batcher.has_work or w.running]
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

    async def housekeeping(self) -> None:
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
        for worker in self.workers():
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
                    extra={
                        "table": worker.table,
                        "partition": worker.partition.source,
                        "pending": len(pending),
                        "waiting_s": now - first,
                    },
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

    # -- handing messages to the outbox ----------------------------------------------------

    async def publish_results(self, messages: Sequence[TableCommitted]) -> None:
        """Announce commits on the results topic and wait for the acknowledgement."""
        await self.outbox.publish_results(messages)

    async def dead_letter(
        self,
        ps: PartitionState,
        events: Sequence[SourceEvent],
        error: EventRejectedError,
        *,
        table: str | None = None,
    ) -> None:
        """Publish dead letters and wait for the acknowledgement (then they are done)."""
        await self.outbox.dead_letter(ps, events, error, table=table)

    def _dead_letter_loose(
        self, ps: PartitionState, record: ConsumedRecord, error: EventRejectedError
    ) -> None:
        """Dead-letter a record no table owns, without holding up the consume loop."""
        ps.loose.add(record.offset)

        async def send() -> None:
            try:
                await self.outbox.send_dead_letter(ps, record.source, error, None)
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
