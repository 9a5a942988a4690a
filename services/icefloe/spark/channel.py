"""The Spark driver's background event loop and its commit channel.

Kafka clients and catalogs live on one background event loop per driver process, shared by
every job and thread (streaming queries run their batches on their own threads), so a job
does not pay for a new connection, and :func:`~icefloe.spark.write` works from code that
already runs an event loop. :func:`shutdown` closes them; it also runs at interpreter exit.
The :class:`CommitChannel` publishes a job's events and waits for the coordinator's answer.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import threading
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError
from pyspark.sql import SparkSession

from icefloe.catalog.uri import load_catalog
from icefloe.errors import (
    CommitStateUnknownError,
    EventRejectedError,
    ValidationError,
)
from icefloe.events import (
    CommitRequested,
    DeadLetter,
    Event,
    FilesWritten,
    TableCommitted,
    event_key,
    parse_event,
)
from icefloe.runtime import kafka
from icefloe.spark.config import SPARK_CONF_PREFIX, SparkConfig
from icefloe.table.catalog import Catalog

ConfigArg = SparkConfig | Mapping[str, Any] | None

T = TypeVar("T")


# ---------------------------------------------------------------------------------------
# The driver's background event loop and what lives on it
# ---------------------------------------------------------------------------------------


class _Background:
    """One event loop thread per process for Kafka clients, catalogs and HTTP sessions."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.catalogs: dict[str, Catalog] = {}
        self.channels: dict[tuple[Any, ...], CommitChannel] = {}
        self.channel_locks: dict[tuple[Any, ...], asyncio.Lock] = {}

    def _ensure(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._thread is None or not self._thread.is_alive():
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name="icefloe-spark-driver", daemon=True
                )
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the background loop and wait for it from this thread."""
        future = asyncio.run_coroutine_threadsafe(coro, self._ensure())
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    async def catalog(self, uri: str) -> Catalog:
        found = self.catalogs.get(uri)
        if found is None:
            found = self.catalogs[uri] = load_catalog(uri)
        return found

    async def channel(self, config: SparkConfig) -> CommitChannel:
        key = config.cache_key()
        lock = self.channel_locks.setdefault(key, asyncio.Lock())
        async with lock:
            found = self.channels.get(key)
            if found is None or found.broken:
                if found is not None:
                    await found.close()
                found = CommitChannel(config)
                await found.start()
                self.channels[key] = found
            return found

    async def _close_all(self) -> None:
        channels, self.channels = list(self.channels.values()), {}
        catalogs, self.catalogs = list(self.catalogs.values()), {}
        for channel in channels:
            with contextlib.suppress(Exception):
                await channel.close()
        for catalog in catalogs:
            with contextlib.suppress(Exception):
                await catalog.close()

    def shutdown(self, timeout_s: float = 30.0) -> None:
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None or not thread.is_alive():
            return
        future = asyncio.run_coroutine_threadsafe(self._close_all(), loop)
        with contextlib.suppress(Exception):
            future.result(timeout_s)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout_s)
        if not thread.is_alive():
            loop.close()
        self.channel_locks.clear()


# The one background event loop (and its catalogs and channels) of this driver process.
BACKGROUND = _Background()


def shutdown() -> None:
    """Close the Kafka clients and catalogs this process opened for Spark jobs."""
    BACKGROUND.shutdown()


atexit.register(shutdown)


def resolve_settings(spark: SparkSession, config: ConfigArg) -> SparkConfig:
    """The settings a job runs with: ``config`` as given, else ``spark.icefloe.*`` launch and
    session settings, then ``ICEFLOE_*`` environment variables."""
    if isinstance(config, SparkConfig):
        return config
    # Launch settings, then session settings (spark.conf.set) on top.
    conf = {
        key: value
        for key, value in spark.sparkContext.getConf().getAll()
        if key.startswith(SPARK_CONF_PREFIX)
    }
    conf.update({k: v for k, v in spark.conf.getAll.items() if k.startswith(SPARK_CONF_PREFIX)})
    return SparkConfig.load(conf, config)


# ---------------------------------------------------------------------------------------
# The commit channel: events out, results and rejections in
# ---------------------------------------------------------------------------------------


class CommitChannel:
    """A producer to the events topic and a consumer of the results and dead-letter topics.

    The consumer reads from the topics' ends as of :meth:`start`, so every result produced
    after a commit request is sent is seen; waiters are keyed by commit id.
    """

    def __init__(self, config: SparkConfig) -> None:
        self.config = config
        self.broken = False
        self._producer: AIOKafkaProducer | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._listener: asyncio.Task[None] | None = None
        self._waiters: dict[str, _Waiter] = {}

    async def start(self) -> None:
        options = self.config.kafka_options()
        self._consumer = kafka.tail_consumer(options)
        await self._consumer.start()
        try:
            available = await self._consumer.topics()
            partitions: list[TopicPartition] = []
            for topic in (self.config.results_topic, self.config.dead_letter_topic):
                ids = self._consumer.partitions_for_topic(topic) if topic in available else None
                if not ids:
                    raise ValidationError(
                        f"Kafka topic {topic!r} does not exist on {self.config.brokers}: start "
                        "the coordinator first (it creates its topics), or check "
                        "spark.icefloe.results-topic / dead-letter-topic"
                    )
                partitions.extend(TopicPartition(topic, p) for p in sorted(ids))
            self._consumer.assign(partitions)
            await self._consumer.seek_to_end(*partitions)
            for tp in partitions:
                await self._consumer.position(tp)
            self._producer = kafka.producer(
                options, max_request_size=max(1 << 20, 2 * self.config.event_max_bytes)
            )
            await self._producer.start()
        except BaseException:
            await self.close()
            raise
        self._listener = asyncio.create_task(self._listen(), name="icefloe-spark-results")

    async def close(self) -> None:
        self.broken = True
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._listener
        await kafka.stop_quietly(self._producer, self._consumer)
        self._producer = self._consumer = None

    async def _listen(self) -> None:
        assert self._consumer is not None
        try:
            while True:
                batches = await self._consumer.getmany(timeout_ms=500, max_records=1000)
                for event in kafka.decoded(batches):
                    if not isinstance(event, ValidationError):
                        self._dispatch(event)  # else: not ours to judge (other producers)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self.broken = True
            for waiter in self._waiters.values():
                waiter.fail(CommitStateUnknownError(f"lost the results topic while waiting: {e}"))
            raise

    def _dispatch(self, event: Event) -> None:
        if isinstance(event, TableCommitted):
            for commit_id in event.commit_ids:
                waiter = self._waiters.get(commit_id)
                if waiter is not None:
                    waiter.committed(event)
        elif isinstance(event, DeadLetter):
            try:
                original = parse_event(event.original)
            except ValidationError:
                return
            if isinstance(original, FilesWritten | CommitRequested):
                waiter = self._waiters.get(original.commit_id)
                if waiter is not None:
                    waiter.rejected(original, event.reason)

    async def commit(
        self, events: Sequence[FilesWritten], request: CommitRequested, timeout_s: float
    ) -> TableCommitted:
        """Publish ``events`` then ``request``; the ``table-committed`` of its commit id.

        Raises EventRejectedError when the coordinator dead-letters the request or one of
        its events (nothing was committed), CommitStateUnknownError when no answer came in
        time (the commit may still happen).
        """
        if self.broken or self._producer is None:
            raise CommitStateUnknownError("the commit channel is closed")
        if request.commit_id in self._waiters:
            raise ValidationError(
                f"commit id {request.commit_id!r} is already being committed by this process"
            )
        waiter = _Waiter(request, asyncio.get_running_loop().create_future())
        self._waiters[request.commit_id] = waiter
        key = event_key(request.table)
        topic = self.config.events_topic
        requested = False
        try:
            await asyncio.gather(*(kafka.send_event(self._producer, topic, e, key) for e in events))
            requested = True
            await kafka.send_event(self._producer, topic, request, key)
            return await asyncio.wait_for(asyncio.shield(waiter.future), timeout_s)
        except TimeoutError:
            raise CommitStateUnknownError(
                f"no table-committed for commit id {request.commit_id!r} of {request.table} "
                f"within {timeout_s:g}s; the coordinator may still commit it. Its files were "
                "kept; the table was checked for the commit id before this was raised, and "
                "retrying with the same commit id is safe (a commit id is applied at most once)"
            ) from None
        except KafkaError as e:
            if requested:
                raise CommitStateUnknownError(
                    f"sending the commit request for {request.commit_id!r} failed ({e}); it "
                    "may or may not have reached the coordinator"
                ) from e
            raise
        finally:
            self._waiters.pop(request.commit_id, None)


@dataclass
class _Waiter:
    request: CommitRequested
    future: asyncio.Future[TableCommitted]

    def committed(self, event: TableCommitted) -> None:
        if not self.future.done():
            self.future.set_result(event)

    def fail(self, error: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(error)

    def rejected(self, original: FilesWritten | CommitRequested, reason: str) -> None:
        kind, _, message = reason.partition(": ")
        if isinstance(original, FilesWritten):
            if original.event_id not in self.request.event_ids:
                return  # another run's events of this commit id
            if kind == "late-files":
                # The commit id is already queued or done: a replay. The acknowledgement
                # (table-committed) follows, and the replay's files are then cleaned up.
                return
            what = f"files-written event {original.event_id}"
        elif original.event_id == self.request.event_id:
            what = "the commit request"
        else:
            return
        self.fail(
            EventRejectedError(
                kind or "rejected",
                f"the coordinator rejected {what} of commit {self.request.commit_id!r} for "
                f"{self.request.table}: {message or reason}",
            )
        )
