"""The coordinator under load: events/s, files/s and event-to-visible latency, beside 16
writers that each commit their own files with optimistic appends, measured in the same run.

The coordinator exists because writers that commit for themselves race for one table
pointer: every lost race is a reload and a rebuild, and the more writers, the more races.
So its throughput is also given beside that alternative, on the same file stream.

The stack (:class:`~icefloe.dev.local_stack.LocalStack`): a tansu broker (in memory) and a
redis-server on local ports; a Redis catalog whose metadata files and manifests go to a
local warehouse (fsynced). The coordinator is the real service
(:class:`~icefloe.coordinator.service.Coordinator`) with ``check_files=False``, so no data file has
to exist and the figures are the coordinator's own work (no Parquet is written or read
anywhere), and with a short batch wait (``batch_max_wait_ms``, 100 ms; the service default
of 10 s favours few snapshots over latency).

Where the coordinator runs: in a child process of its own (``python -m
icefloe.coordinator``), as it is deployed; ``--set in_process=1`` runs it as an asyncio task
in the benchmark's event loop instead. Measured both ways, back to back on a 2-core machine:
about the same events/s into one table, but 10-25% more events/s into 50 tables and half
the 50-table latency (p50 and p99) in a process of its own, where the coordinator does not
share an event loop and a core with the producer and the results consumer; under outside
load the in-process producer also fell behind a 500 events/s pace. The producer, the
results consumer and the 16 writers stay in the benchmark process.

The file stream: streaming micro-batches, each a ``files-written`` event with ``complete:
true`` and ``files_per_event`` data files (2) of 1,000 rows with full column metrics,
spread round-robin over the tables. Every run commits into fresh tables.

* **Sustained throughput** (1 table, then ``tables`` tables, ``events`` events): the events
  are encoded before the clock; the clock runs from the first send until ``table-committed``
  events on the results topic have announced every commit id. The producer is aiokafka
  (acks=all, no idempotence) sending as fast as the broker takes the events.
* **Latency** (1 table, then ``tables`` tables): ``rate`` events/s (500) for
  ``latency_seconds``. An event's latency runs from its ``produced-at-ms`` (stamped as it is
  sent) to the moment the snapshot containing it became visible in the catalog: the
  coordinator's ``table-committed`` carries ``latency-ms`` measured from the oldest event it
  includes, right after the commit, so the snapshot became visible at that event's
  produced-at plus ``latency-ms``. The figures are the p50 and p99 over every event of a run
  (best run shown, every run in ``--json``).
* **Coordinator vs 16 writers** (1 table, ``compare_events`` events): the same stream
  committed through the coordinator as above, or by ``writers`` asyncio tasks in the
  benchmark process, each taking the next event and committing its files itself with
  ``fast_append(...).commit(policy)`` against the same Redis catalog (a lost race reloads
  the table and retries after 2 to 100 ms, full jitter). The two are timed in interleaved
  rounds. The writers share one catalog client and one manifest-list cache, which favours
  them over writers in separate processes. This stream is shorter than the sustained one:
  racing writers make one snapshot per event and lose several races per commit, so a
  sustained-length stream would take them many minutes. On so short a stream the
  coordinator's time is mostly one batch wait and one or two commits, a fixed cost that a
  longer stream spreads over more events, while each racing append costs the writers at
  least as much as the one before: the ratio grows with the stream's length.

After every run, untimed, each table is loaded again: it must hold exactly the stream's
files, each once, and (coordinated) record every commit id exactly once in its history or
(uncoordinated) have one snapshot per event. A dead letter, a coordinator that dies, or a
stream that stops making progress fails the benchmark with the reason instead of a figure.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import http.client
import logging
import math
import sys
import tempfile
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypeVar
from urllib.parse import urlencode

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from icefloe.catalog.uri import load_catalog
from icefloe.coordinator.committer import summary_commit_ids
from icefloe.coordinator.config import CoordinatorConfig
from icefloe.coordinator.service import Coordinator
from icefloe.dev.bench import BenchContext, Figure, Kind, Timing, benchmark
from icefloe.dev.bench_commits import (
    CATEGORIES,
    POLICY,
    RECORDS_PER_FILE,
    RETRY_PROPERTIES,
    SCHEMA,
    SPEC,
    AppendedFile,
    icefloe_data_file,
)
from icefloe.dev.bench_manifest import BenchmarkCheckError
from icefloe.dev.local_stack import HOST, LocalStack, ServerProcess, start_server_async
from icefloe.errors import ValidationError
from icefloe.events import (
    DeadLetter,
    Event,
    FilesWritten,
    TableCommitted,
    event_key,
    now_ms,
    parse_event,
)
from icefloe.manifests.reader import ManifestReader
from icefloe.spec.datafile import DataFile
from icefloe.spec.partition import PartitionSpec
from icefloe.spec.schema import Schema
from icefloe.table.catalog import Catalog, Table, TableIdentifier, data_dir
from icefloe.table.snapshot_producer import fast_append

NAMESPACE: Final = "bench"
WRITER_ID: Final = "icefloe-bench"
TOPIC_PARTITIONS: Final = 16
COORDINATOR: Final = "coordinator"
# A coordinator in a process of its own is how it is deployed, and it keeps the load
# generator and the results consumer off the coordinator's event loop (module docstring).
IN_PROCESS_DEFAULT: Final = 0
# A run fails when no commit id was announced for this long while some are outstanding.
STALL_S: Final = 120.0
START_TIMEOUT_S: Final = 120.0
PROGRESS_POLL_S: Final = 0.25

T = TypeVar("T")


def writers_peer(writers: int) -> str:
    """The peer's name in the report: ``16 writers``."""
    return f"{writers} writers"


# ---------------------------------------------------------------------------------------
# The file stream
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StreamTable:
    """A table the stream writes into, as created (its schema and spec as the table has
    them, which is what events must name)."""

    identifier: str
    data_location: str
    schema: Schema
    spec: PartitionSpec


@dataclass(frozen=True, slots=True)
class StreamEvent:
    """One streaming micro-batch: its commit id and the data files it adds."""

    table: StreamTable
    commit_id: str
    files: tuple[DataFile, ...]

    def files_written(self, produced_at_ms: int | None = None) -> FilesWritten:
        """The ``files-written`` event (``complete: true``) a streaming writer publishes."""
        return FilesWritten.from_data_files(
            self.table.identifier,
            self.commit_id,
            WRITER_ID,
            f"{self.commit_id}/0",
            self.table.schema,
            self.table.spec,
            self.files,
            complete=True,
            produced_at_ms=produced_at_ms,
        )


def plan_stream(
    tables: Sequence[StreamTable], events: int, files_per_event: int, tag: str
) -> list[StreamEvent]:
    """``events`` micro-batches, round-robin over ``tables``, ``files_per_event`` each.

    The files depend only on the event's position and the table's data location, so two
    runs of the same size on different tables commit the same files (up to the location).
    ``tag`` makes the commit ids unique to the run.
    """
    if not tables:
        raise ValidationError("a file stream needs at least one table")
    if events < 1 or files_per_event < 1:
        raise ValidationError(
            f"a file stream needs at least one event and one file per event, got "
            f"events={events}, files_per_event={files_per_event}"
        )
    stream = []
    for i in range(events):
        table = tables[i % len(tables)]
        files = []
        for j in range(files_per_event):
            n = i * files_per_event + j
            category = f"c{n % CATEGORIES}"
            path = f"{table.data_location}/category={category}/e{i:07d}-{j}.parquet"
            files.append(icefloe_data_file(AppendedFile(path, category, n * RECORDS_PER_FILE)))
        stream.append(StreamEvent(table, f"{tag}-{i:07d}", tuple(files)))
    return stream


def encode_stream(stream: Sequence[StreamEvent]) -> list[tuple[bytes, bytes]]:
    """Each event's Kafka value and key, for sending at full speed."""
    return [(e.files_written().encode(), event_key(e.table.identifier)) for e in stream]


# ---------------------------------------------------------------------------------------
# Statistics and checks
# ---------------------------------------------------------------------------------------


def percentile(values: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile: the smallest value with at least ``fraction`` of the
    values at or below it (so p99 of 100 values is the 99th smallest, never interpolated
    between two events that happened)."""
    if not values:
        raise ValidationError("a percentile needs at least one value")
    if not 0.0 < fraction <= 1.0:
        raise ValidationError(f"a percentile's fraction must be in (0, 1], got {fraction}")
    ordered = sorted(values)
    rank = math.ceil(fraction * len(ordered))
    return ordered[max(rank, 1) - 1]


@dataclass(frozen=True, slots=True)
class TableState:
    """What a freshly loaded table holds."""

    live_paths: list[str]
    commit_ids: list[str]  # recorded along the main branch, with repetitions
    snapshots: int


def _problems(label: str, expected: Collection[str], found: Sequence[str]) -> list[str]:
    counts = collections.Counter(found)
    wanted = set(expected)
    out = []
    for kind, items in (
        ("missing", sorted(wanted - counts.keys())),
        ("doubled", sorted(k for k, n in counts.items() if n > 1)),
        ("unknown", sorted(counts.keys() - wanted)),
    ):
        if items:
            out.append(f"{len(items)} {kind} {label} (e.g. {items[0]})")
    return out


def check_coordinated(
    what: str, table: str, events: Sequence[StreamEvent], state: TableState
) -> None:
    """Every file of ``events`` live once, every commit id recorded once, nothing else."""
    paths = [f.file_path for e in events for f in e.files]
    problems = _problems("files", paths, state.live_paths)
    problems += _problems("commit ids", [e.commit_id for e in events], state.commit_ids)
    if not problems and state.snapshots > len(events):
        problems.append(f"{state.snapshots} snapshots for {len(events)} events")
    if problems:
        raise BenchmarkCheckError(
            f"{what}: table {table} after {len(events)} events of {len(paths)} files: "
            f"{'; '.join(problems)}; the figure is void"
        )


def check_uncoordinated(
    what: str, table: str, events: Sequence[StreamEvent], state: TableState
) -> None:
    """Every file of ``events`` live once, nothing else, in one snapshot per event."""
    paths = [f.file_path for e in events for f in e.files]
    problems = _problems("files", paths, state.live_paths)
    if not problems and state.snapshots != len(events):
        problems.append(f"{state.snapshots} snapshots for {len(events)} appends (one each)")
    if problems:
        raise BenchmarkCheckError(
            f"{what}: table {table} after {len(events)} appends of {len(paths)} files: "
            f"{'; '.join(problems)}; the figure is void"
        )


# ---------------------------------------------------------------------------------------
# The coordinator, in this process or in its own
# ---------------------------------------------------------------------------------------


class RunningCoordinator(ABC):
    """A coordinator serving the benchmark's topics until :meth:`stop`."""

    description: str

    @abstractmethod
    async def start(self) -> None:
        """Start it and wait until its consumer has joined the group."""

    @abstractmethod
    def check_alive(self) -> None:
        """Raise BenchmarkCheckError if it has stopped."""

    @abstractmethod
    async def stop(self) -> None:
        """Stop it cleanly (it commits what is ready first)."""


class InProcessCoordinator(RunningCoordinator):
    """The service as an asyncio task in the benchmark's own event loop."""

    description = "in the benchmark's process and event loop"

    def __init__(self, config: CoordinatorConfig) -> None:
        self.config = config
        self.coordinator: Coordinator | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.coordinator = coordinator = Coordinator(self.config)
        self._task = asyncio.create_task(coordinator.run(), name="icefloe-bench-coordinator")
        deadline = time.monotonic() + START_TIMEOUT_S
        while not coordinator.ready:
            self.check_alive()
            if time.monotonic() > deadline:
                raise BenchmarkCheckError(
                    f"the coordinator did not join its consumer group in {START_TIMEOUT_S:g}s"
                )
            await asyncio.sleep(0.05)

    def check_alive(self) -> None:
        task = self._task
        if task is None:
            raise BenchmarkCheckError("the coordinator was never started")
        if task.done():
            error = None if task.cancelled() else task.exception()
            raise BenchmarkCheckError(f"the coordinator stopped during the benchmark: {error!r}")

    async def stop(self) -> None:
        if self._task is None or self.coordinator is None:
            return
        self.coordinator.request_stop()
        task, self._task = self._task, None
        await task


def coordinator_flags(config: CoordinatorConfig, exclude: Collection[str] = ()) -> list[str]:
    """``icefloe coordinator`` flags for the settings ``config`` was given explicitly."""
    flags = []
    for name in sorted(config.model_fields_set - set(exclude)):
        value = getattr(config, name)
        flag = name.replace("_", "-")
        if isinstance(value, bool):
            flags.append(f"--{flag}" if value else f"--no-{flag}")
        else:
            flags += [f"--{flag}", str(value)]
    return flags


def probe_ready(port: int) -> bool:
    """Whether the service on ``port`` answers ``/readyz`` with 200 (joined its group)."""
    connection = http.client.HTTPConnection(HOST, port, timeout=2)
    try:
        connection.request("GET", "/readyz")
        return connection.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        connection.close()


class SubprocessCoordinator(RunningCoordinator):
    """``python -m icefloe.coordinator`` in a child process, stopped by SIGTERM."""

    description = "in a child process of its own (python -m icefloe.coordinator)"

    def __init__(self, config: CoordinatorConfig) -> None:
        self.config = config
        self.server: ServerProcess | None = None

    async def start(self) -> None:
        flags = coordinator_flags(self.config, exclude=("http_host", "http_port"))

        def command(port: int) -> list[str]:
            return [
                sys.executable,
                "-m",
                "icefloe.coordinator",
                *flags,
                "--http-host",
                HOST,
                "--http-port",
                str(port),
            ]

        self.server = await start_server_async(
            "coordinator", command, probe_ready, timeout_s=START_TIMEOUT_S
        )

    def check_alive(self) -> None:
        server = self.server
        if server is None:
            raise BenchmarkCheckError("the coordinator was never started")
        if not server.running:
            raise BenchmarkCheckError(
                f"the coordinator process exited with code {server.process.returncode}; "
                f"its log ends with:\n{server.log_tail()}"
            )

    async def stop(self) -> None:
        server, self.server = self.server, None
        if server is None:
            return
        await asyncio.to_thread(server.stop)
        code = server.process.returncode
        if code != 0:
            raise BenchmarkCheckError(f"the coordinator exited with code {code} on SIGTERM")


# ---------------------------------------------------------------------------------------
# The results topic
# ---------------------------------------------------------------------------------------


@dataclass(slots=True)
class Announcement:
    """The first ``table-committed`` naming a commit id."""

    received_ms: int
    snapshot_id: int
    latency_ms: int
    commit_ids: tuple[str, ...]


class ResultsTracker:
    """Reads the results and dead-letter topics from the start, in the background.

    Commit ids are unique to a run, so the whole history can be kept in one map and a run
    waits only for its own ids.
    """

    def __init__(self, brokers: str, results_topic: str, dead_letter_topic: str) -> None:
        self.brokers = brokers
        self.topics = (results_topic, dead_letter_topic)
        self.consumer: AIOKafkaConsumer | None = None
        self.announced: dict[str, Announcement] = {}
        self.dead_letters: list[DeadLetter] = []
        self._waiting: set[str] = set()
        self._progress = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.consumer = consumer = AIOKafkaConsumer(
            *self.topics,
            bootstrap_servers=self.brokers,
            group_id=None,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=50,
        )
        await consumer.start()
        self._task = asyncio.create_task(self._consume(consumer), name="icefloe-bench-results")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self.consumer is not None:
            await self.consumer.stop()
            self.consumer = None

    async def _consume(self, consumer: AIOKafkaConsumer) -> None:
        while True:
            batch = await consumer.getmany(timeout_ms=200)
            received = now_ms()
            for records in batch.values():
                for record in records:
                    self._record(parse_event(record.value or b""), received)
            if batch:
                self._progress.set()

    def _record(self, event: Event, received_ms: int) -> None:
        if isinstance(event, DeadLetter):
            self.dead_letters.append(event)
        elif isinstance(event, TableCommitted):
            note = Announcement(
                received_ms, event.snapshot_id, event.latency_ms, tuple(event.commit_ids)
            )
            for commit_id in event.commit_ids:
                if commit_id not in self.announced:
                    self.announced[commit_id] = note
                    self._waiting.discard(commit_id)

    async def wait_for(self, commit_ids: Collection[str], alive: Callable[[], None]) -> None:
        """Until every one of ``commit_ids`` was announced; fails on a dead letter, on a
        stopped coordinator or consumer, and after :data:`STALL_S` without progress.

        One run waits at a time (runs are sequential).
        """
        self._waiting = {c for c in commit_ids if c not in self.announced}
        last_progress = time.monotonic()
        left = len(self._waiting)
        while True:
            if self.dead_letters:
                letter = self.dead_letters[0]
                raise BenchmarkCheckError(
                    f"{len(self.dead_letters)} event(s) were dead-lettered, the first (table "
                    f"{letter.table}, offset {letter.source_offset}) because: {letter.reason}"
                )
            if not self._waiting:
                return
            if self._task is None or self._task.done():
                error = None
                if self._task is not None and not self._task.cancelled():
                    error = self._task.exception()
                raise BenchmarkCheckError(f"the results consumer stopped: {error!r}")
            alive()
            if len(self._waiting) < left:
                left, last_progress = len(self._waiting), time.monotonic()
            elif time.monotonic() - last_progress > STALL_S:
                raise BenchmarkCheckError(
                    f"no commit announced for {STALL_S:g}s: {left} of {len(commit_ids)} commit "
                    f"ids still outstanding (e.g. {min(self._waiting)})"
                )
            self._progress.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._progress.wait(), PROGRESS_POLL_S)

    def visible_at_ms(self, commit_id: str, produced_at_ms: Mapping[str, int]) -> int:
        """When the snapshot holding ``commit_id`` became visible: its oldest event's
        produced-at plus the latency the coordinator measured from it."""
        note = self.announced[commit_id]
        oldest = min(produced_at_ms.get(c, produced_at_ms[commit_id]) for c in note.commit_ids)
        return oldest + note.latency_ms


# ---------------------------------------------------------------------------------------
# The rig: servers' clients shared by every run
# ---------------------------------------------------------------------------------------


@dataclass
class RigSettings:
    brokers: str
    redis_url: str
    warehouse: Path
    in_process: bool
    batch_max_wait_ms: int
    prefix: str = field(default_factory=lambda: f"bench{uuid.uuid4().hex[:8]}")

    @property
    def catalog_uri(self) -> str:
        query = {"warehouse": self.warehouse.as_uri(), "prefix": self.prefix}
        return f"{self.redis_url}?{urlencode(query)}"

    def coordinator_config(self) -> CoordinatorConfig:
        values: dict[str, Any] = {
            "brokers": self.brokers,
            "catalog": self.catalog_uri,
            "events_topic": f"{self.prefix}.events",
            "results_topic": f"{self.prefix}.results",
            "dead_letter_topic": f"{self.prefix}.dead-letter",
            "group_id": f"{self.prefix}-coordinator",
            "topic_partitions": TOPIC_PARTITIONS,
            "batch_max_wait_ms": self.batch_max_wait_ms,
            "check_files": False,
            "http_host": HOST,
            "http_port": 0,
            "log_level": "WARNING",
            "log_format": "text",
        }
        return CoordinatorConfig(**values)


class BenchRig:
    """Catalog, event producer, results tracker and coordinator, on ``runner``'s loop.

    Everything asynchronous runs through :meth:`call`, so the measurement helpers (which
    are synchronous) can time it; the coordinator and the results consumer keep running
    on the same loop between calls.
    """

    def __init__(self, runner: asyncio.Runner, settings: RigSettings) -> None:
        self.runner = runner
        self.settings = settings
        self.config = settings.coordinator_config()
        self.catalog: Catalog = load_catalog(settings.catalog_uri, "bench-coordinator")
        self.coordinator: RunningCoordinator = (
            InProcessCoordinator(self.config)
            if settings.in_process
            else SubprocessCoordinator(self.config)
        )
        self.producer: AIOKafkaProducer | None = None
        self.tracker = ResultsTracker(
            settings.brokers, self.config.results_topic, self.config.dead_letter_topic
        )
        self._started = False

    def call(self, coro: Awaitable[T]) -> T:
        return self.runner.run(_awaited(coro))

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        self.call(self._start())

    async def _start(self) -> None:
        self._started = True
        await self._create_topics()
        if not await self.catalog.namespace_exists(NAMESPACE):
            await self.catalog.create_namespace(NAMESPACE)
        await self.coordinator.start()
        await self.tracker.start()
        self.producer = AIOKafkaProducer(
            bootstrap_servers=self.settings.brokers,
            acks="all",
            enable_idempotence=False,
            linger_ms=5,
            max_batch_size=256 << 10,
        )
        await self.producer.start()

    async def _create_topics(self) -> None:
        # Created here rather than by the coordinator so that the results consumer, which
        # may start first, never sees them missing.
        admin = AIOKafkaAdminClient(bootstrap_servers=self.settings.brokers)
        await admin.start()
        try:
            config = self.config
            topics = (config.events_topic, config.results_topic, config.dead_letter_topic)
            await admin.create_topics([NewTopic(t, TOPIC_PARTITIONS, 1) for t in topics])
        finally:
            await admin.close()

    def close(self) -> None:
        if self._started:
            self.call(self._close())

    async def _close(self) -> None:
        self._started = False
        try:
            if self.producer is not None:
                await self.producer.stop()
            await self.tracker.stop()
            await self.coordinator.stop()
        finally:
            await self.catalog.close()

    # -- tables ----------------------------------------------------------------------------

    def create_tables(self, count: int) -> list[StreamTable]:
        return self.call(self._create_tables(count))

    async def _create_tables(self, count: int) -> list[StreamTable]:
        tag = uuid.uuid4().hex[:10]
        out = []
        for i in range(count):
            ident = TableIdentifier.parse(f"{NAMESPACE}.t{tag}_{i:03d}")
            table = await self.catalog.create_table(
                ident, SCHEMA, SPEC, properties=RETRY_PROPERTIES
            )
            md = table.metadata
            out.append(StreamTable(str(ident), data_dir(md), md.schema(), md.spec()))
        return out

    def table_state(self, identifier: str) -> TableState:
        return self.call(self._table_state(identifier))

    async def _table_state(self, identifier: str) -> TableState:
        table = await self.catalog.load_table(identifier)
        md = table.metadata
        head = md.current_snapshot()
        if head is None:
            return TableState([], [], len(md.snapshots))
        reader = ManifestReader(table.io)  # a fresh one: read what storage really holds
        paths = []
        for manifest in await reader.manifests(head):
            for entry in await reader.entries(manifest, md.specs(), live_only=True):
                paths.append(entry.data_file.file_path)
        commit_ids = [c for s in md.ancestors_of(head.snapshot_id) for c in summary_commit_ids(s)]
        return TableState(paths, commit_ids, len(md.snapshots))

    # -- committing through the coordinator ------------------------------------------------

    async def send_all(self, values: Sequence[tuple[bytes, bytes]]) -> None:
        """Send pre-encoded events as fast as the producer takes them."""
        assert self.producer is not None, "start() the rig first"
        topic = self.config.events_topic
        for value, key in values:
            await self.producer.send(topic, value, key=key)
        await self.producer.flush()

    async def send_paced(
        self, stream: Sequence[StreamEvent], rate: float
    ) -> tuple[dict[str, int], float]:
        """Send ``rate`` events per second, catching up after a slow send; each event is
        stamped with its send time. Returns each commit id's produced-at-ms and the rate
        actually achieved (events over the time from the first send to the last)."""
        assert self.producer is not None, "start() the rig first"
        topic = self.config.events_topic
        loop = asyncio.get_running_loop()
        produced: dict[str, int] = {}
        templates = [
            (e.commit_id, e.files_written(), event_key(e.table.identifier)) for e in stream
        ]
        start = loop.time()
        last = start
        for i, (commit_id, template, key) in enumerate(templates):
            delay = start + i / rate - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            at = now_ms()
            value = template.model_copy(update={"produced_at_ms": at}).encode()
            await self.producer.send(topic, value, key=key)
            produced[commit_id] = at
            last = loop.time()
        await self.producer.flush()
        achieved = (len(templates) - 1) / (last - start) if last > start else float(rate)
        return produced, achieved

    async def wait_committed(self, commit_ids: Collection[str]) -> None:
        await self.tracker.wait_for(commit_ids, self.coordinator.check_alive)

    # -- committing without it ---------------------------------------------------------------

    async def commit_uncoordinated(
        self, stream: Sequence[StreamEvent], writers: int
    ) -> tuple[int, int]:
        """``writers`` tasks, each taking the next event and appending its files itself.

        Returns (attempts, conflicts) over all commits.
        """
        pending = iter(stream)
        # One cache for all, as the coordinator has one: a writer rebuilding on a base
        # another writer made finds its manifest list already decoded.
        reader = ManifestReader(self.catalog.io)
        totals = collections.Counter[str]()

        async def writer() -> None:
            tables: dict[str, Table] = {}
            for event in pending:  # shared: each event is taken by exactly one writer
                name = event.table.identifier
                table = tables.get(name)
                if table is None:
                    table = await self.catalog.load_table(name)
                producer = fast_append(table, event.files, reader=reader)
                tables[name] = await producer.commit(POLICY)
                totals["attempts"] += producer.stats.attempts
                totals["conflicts"] += producer.stats.conflicts

        async with asyncio.TaskGroup() as group:
            for _ in range(writers):
                group.create_task(writer())
        return totals["attempts"], totals["conflicts"]


async def _awaited(awaitable: Awaitable[T]) -> T:
    return await awaitable


# ---------------------------------------------------------------------------------------
# Ways of committing a stream: prepared untimed, run timed, checked untimed
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StreamRun:
    """One run's fresh tables and the stream to commit into them."""

    tables: list[StreamTable]
    stream: list[StreamEvent]
    encoded: list[tuple[bytes, bytes]]  # Kafka values and keys, when sent pre-encoded


class StreamCommitter(ABC):
    """Commits a file stream into fresh tables, one stream per timed run, and checks each
    run's tables afterwards.

    :meth:`setup` is the untimed setup of a measurement: it checks the previous run and
    prepares the next stream if none is waiting (so a warm-up with a stream of its own does
    not waste one). :meth:`settle` checks the last run once the timing is done.
    """

    name: str

    def __init__(self, rig: BenchRig, *, tables: int, events: int, files_per_event: int) -> None:
        if events < tables:
            raise ValidationError(
                f"{events} events cannot reach {tables} tables; set events to at least {tables}"
            )
        self.rig = rig
        self.table_count = tables
        self.events = events
        self.files_per_event = files_per_event
        self.runs = 0
        self.snapshots = 0
        self._next: StreamRun | None = None
        self._unchecked: StreamRun | None = None

    @property
    def files(self) -> int:
        return self.events * self.files_per_event

    def _new_run(self, events: int) -> StreamRun:
        tables = self.rig.create_tables(self.table_count)
        stream = plan_stream(tables, events, self.files_per_event, uuid.uuid4().hex)
        return StreamRun(tables, stream, self._encode(stream))

    def setup(self) -> None:
        self.settle()
        if self._next is None:
            self._next = self._new_run(self.events)

    def run(self) -> None:
        if self._next is None:
            raise ValidationError(f"{self.name}: run() needs setup() first (no stream)")
        current, self._next = self._next, None
        self._commit(current, timed=True)
        self._unchecked = current
        self.runs += 1

    def warm_up(self) -> None:
        """A small untimed run of its own: connections, caches, imports, table workers."""
        warm = self._new_run(self.table_count * 2)
        self._commit(warm, timed=False)
        self._check(warm, count=False)

    def settle(self) -> None:
        if self._unchecked is not None:
            unchecked, self._unchecked = self._unchecked, None
            self._check(unchecked, count=True)

    def _check(self, run: StreamRun, *, count: bool) -> None:
        by_table: dict[str, list[StreamEvent]] = {t.identifier: [] for t in run.tables}
        for event in run.stream:
            by_table[event.table.identifier].append(event)
        for identifier, events in by_table.items():
            state = self.rig.table_state(identifier)
            self._check_table(identifier, events, state)
            if count:
                self.snapshots += state.snapshots

    def _encode(self, stream: list[StreamEvent]) -> list[tuple[bytes, bytes]]:
        """Untimed work before a run: the events as sent, if they can be made in advance."""
        return []

    @abstractmethod
    def _commit(self, run: StreamRun, *, timed: bool) -> None:
        """Commit the run's stream (the timed part)."""

    @abstractmethod
    def _check_table(self, identifier: str, events: list[StreamEvent], state: TableState) -> None:
        """Raise BenchmarkCheckError unless the table holds exactly ``events``."""


class Coordinated(StreamCommitter):
    """The stream sent to Kafka at full speed; done when every commit id is announced."""

    name = COORDINATOR

    def _encode(self, stream: list[StreamEvent]) -> list[tuple[bytes, bytes]]:
        return encode_stream(stream)

    def _commit(self, run: StreamRun, *, timed: bool) -> None:
        self.rig.call(self._send_and_wait(run.encoded, [e.commit_id for e in run.stream]))

    async def _send_and_wait(self, values: list[tuple[bytes, bytes]], ids: list[str]) -> None:
        await self.rig.send_all(values)
        await self.rig.wait_committed(ids)

    def _check_table(self, identifier: str, events: list[StreamEvent], state: TableState) -> None:
        check_coordinated(self.name, identifier, events, state)


class Paced(Coordinated):
    """The stream sent at a fixed rate; every timed run's per-event latencies are kept."""

    def __init__(
        self, rig: BenchRig, *, tables: int, events: int, files_per_event: int, rate: float
    ) -> None:
        super().__init__(rig, tables=tables, events=events, files_per_event=files_per_event)
        if rate <= 0:
            raise ValidationError(f"the event rate must be positive, got {rate}")
        self.rate = rate
        self.latencies_ms: list[list[int]] = []  # per timed run, per event
        self.achieved_rates: list[float] = []  # per timed run, events/s actually sent

    def _encode(self, stream: list[StreamEvent]) -> list[tuple[bytes, bytes]]:
        return []  # each event is encoded as it is sent, stamped with its send time

    def _commit(self, run: StreamRun, *, timed: bool) -> None:
        self.rig.call(self._paced(run, timed))

    async def _paced(self, run: StreamRun, timed: bool) -> None:
        produced, achieved = await self.rig.send_paced(run.stream, self.rate)
        await self.rig.wait_committed(list(produced))
        if timed:
            tracker = self.rig.tracker
            self.latencies_ms.append(
                [max(0, tracker.visible_at_ms(c, produced) - at) for c, at in produced.items()]
            )
            self.achieved_rates.append(achieved)

    def percentile_timing(self, fraction: float) -> Timing:
        """One value per timed run, in seconds, as a LATENCY figure wants it."""
        if not self.latencies_ms:
            raise ValidationError(f"{self.name}: no timed run to take percentiles of")
        return Timing(tuple(percentile(run, fraction) / 1000.0 for run in self.latencies_ms))


class Uncoordinated(StreamCommitter):
    """The same stream, each event appended by one of ``writers`` racing writers."""

    def __init__(
        self, rig: BenchRig, *, tables: int, events: int, files_per_event: int, writers: int
    ) -> None:
        super().__init__(rig, tables=tables, events=events, files_per_event=files_per_event)
        if writers < 1:
            raise ValidationError(f"writers must be at least 1, got {writers}")
        self.writers = writers
        self.name = writers_peer(writers)
        self.attempts = 0
        self.conflicts = 0
        self.commits = 0

    def _commit(self, run: StreamRun, *, timed: bool) -> None:
        attempts, conflicts = self.rig.call(self.rig.commit_uncoordinated(run.stream, self.writers))
        if timed:
            self.attempts += attempts
            self.conflicts += conflicts
            self.commits += len(run.stream)

    def _check_table(self, identifier: str, events: list[StreamEvent], state: TableState) -> None:
        check_uncoordinated(self.name, identifier, events, state)


# ---------------------------------------------------------------------------------------
# The benchmark
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Sizes:
    """How much each part does; see the module docstring."""

    events: int
    tables: int
    files_per_event: int
    rate: int
    latency_seconds: int
    compare_events: int
    writers: int

    @classmethod
    def from_context(cls, ctx: BenchContext) -> Sizes:
        sizes = cls(
            events=ctx.size("events", full=6_000, quick=120),
            tables=ctx.size("tables", full=50, quick=4),
            files_per_event=ctx.size("files_per_event", full=2, quick=2),
            rate=ctx.size("rate", full=500, quick=200),
            latency_seconds=ctx.size("latency_seconds", full=5, quick=1),
            compare_events=ctx.size("compare_events", full=200, quick=32),
            writers=ctx.size("writers", full=16, quick=16),
        )
        sizes.validate()
        return sizes

    @property
    def latency_events(self) -> int:
        return self.rate * self.latency_seconds

    def validate(self) -> None:
        for what, events in (
            ("events", self.events),
            ("rate * latency_seconds", self.latency_events),
        ):
            if events < self.tables:
                raise ValidationError(
                    f"{what}={events} cannot reach tables={self.tables}; raise it to at least "
                    f"{self.tables}"
                )
        if self.compare_events < self.writers:
            raise ValidationError(
                f"compare_events={self.compare_events} cannot keep {self.writers} writers busy; "
                f"set it to at least {self.writers}"
            )


def _flag(ctx: BenchContext, name: str, default: int) -> bool:
    """A 0/1 switch given with ``--set NAME=0|1``."""
    value = ctx.sizes.get(name, default)
    if value not in (0, 1):
        raise ValidationError(f"--set {name}= takes 0 or 1, got {value}")
    ctx.params[name] = value
    return bool(value)


def _label(tables: int) -> str:
    return "1 table" if tables == 1 else f"{tables} tables"


def _sustained(ctx: BenchContext, rig: BenchRig, sizes: Sizes, tables: int) -> list[Figure]:
    committer = Coordinated(
        rig, tables=tables, events=sizes.events, files_per_event=sizes.files_per_event
    )
    timing = ctx.measure(
        committer.run, work=committer.events, setup=committer.setup, warmup=committer.warm_up
    )
    committer.settle()
    label = _label(tables)
    ctx.note(
        f"{label}, full speed: {committer.runs * committer.events / committer.snapshots:.0f} "
        f"events per snapshot ({committer.snapshots} snapshots over {committer.runs} runs)"
    )
    return [
        Figure(f"{label}", "events/s", timing),
        Figure(f"{label}", "files/s", Timing(timing.seconds, committer.files)),
    ]


def _latency(ctx: BenchContext, rig: BenchRig, sizes: Sizes, tables: int) -> list[Figure]:
    committer = Paced(
        rig,
        tables=tables,
        events=sizes.latency_events,
        files_per_event=sizes.files_per_event,
        rate=sizes.rate,
    )
    ctx.measure(
        committer.run, work=committer.events, setup=committer.setup, warmup=committer.warm_up
    )
    committer.settle()
    label = _label(tables)
    achieved = min(committer.achieved_rates)
    ctx.note(
        f"{label} at {sizes.rate} events/s (slowest run sent {achieved:.0f}/s): "
        f"{committer.runs * committer.events / committer.snapshots:.0f} events per snapshot"
    )
    return [
        Figure(
            f"latency p{q} {label} @{sizes.rate}/s",
            "ms",
            committer.percentile_timing(q / 100),
            kind=Kind.LATENCY,
        )
        for q in (50, 99)
    ]


def _versus_writers(ctx: BenchContext, rig: BenchRig, sizes: Sizes, tables: int) -> Figure:
    ours = Coordinated(
        rig, tables=tables, events=sizes.compare_events, files_per_event=sizes.files_per_event
    )
    theirs = Uncoordinated(
        rig,
        tables=tables,
        events=sizes.compare_events,
        files_per_event=sizes.files_per_event,
        writers=sizes.writers,
    )
    timings = ctx.compare(
        {ours.name: ours.run, theirs.name: theirs.run},
        work=ours.files,
        setup={ours.name: ours.setup, theirs.name: theirs.setup},
        warmup={ours.name: ours.warm_up, theirs.name: theirs.warm_up},
    )
    ours.settle()
    theirs.settle()
    label = _label(tables)
    ctx.note(
        f"vs {theirs.name}, {label}: the coordinator made {ours.snapshots} snapshots for "
        f"{ours.runs * ours.events} events; the writers lost "
        f"{theirs.conflicts / theirs.commits:.2f} races per committed append "
        f"({theirs.attempts} attempts for {theirs.commits} appends)"
    )
    return Figure(
        f"vs writers, {label}",
        "files/s",
        timings[ours.name],
        peers={theirs.name: timings[theirs.name]},
    )


def run_coordinator_benchmark(ctx: BenchContext, rig: BenchRig, sizes: Sizes) -> list[Figure]:
    """Every figure of the module docstring, on a started ``rig``."""
    figures: list[Figure] = []
    counts = (1, sizes.tables) if sizes.tables > 1 else (1,)
    for tables in counts:
        figures += _sustained(ctx, rig, sizes, tables)
    for tables in counts:
        figures += _latency(ctx, rig, sizes, tables)
    figures.append(_versus_writers(ctx, rig, sizes, 1))
    ctx.note(
        f"coordinator {rig.coordinator.description}; check_files=False (no data file is "
        f"read or even exists), batch_max_wait_ms={rig.settings.batch_max_wait_ms}, "
        f"{TOPIC_PARTITIONS} partitions; tansu in memory, redis pointers, local fsynced "
        "metadata; latency = produced-at to the snapshot's commit, from table-committed"
    )
    ctx.note(
        f"{writers_peer(sizes.writers)}: asyncio tasks in the benchmark process, each "
        "fast_append + commit per event with retries (2-100 ms full jitter), one snapshot per "
        "event; timed in interleaved rounds with the coordinator on the same stream"
    )
    return figures


@benchmark("coordinator")
def coordinator_benchmark(ctx: BenchContext) -> list[Figure]:
    """Coordinator events/s, files/s, latency p50/p99; files/s vs 16 racing writers."""
    sizes = Sizes.from_context(ctx)
    in_process = _flag(ctx, "in_process", IN_PROCESS_DEFAULT)
    batch_wait = ctx.size("batch_max_wait_ms", full=100, quick=100)
    # Servers and the coordinator process are started from this thread, which outlives
    # them (their parent-death signal is tied to it); the event loop runs on it too.
    with (
        tempfile.TemporaryDirectory(prefix="icefloe-bench-coordinator-") as tmp,
        LocalStack(kafka=True, redis=True) as stack,
        asyncio.Runner() as runner,
        _quiet_kafka(),
    ):
        settings = RigSettings(
            brokers=stack.kafka_bootstrap,
            redis_url=stack.redis_url,
            warehouse=Path(tmp) / "warehouse",
            in_process=in_process,
            batch_max_wait_ms=batch_wait,
        )
        rig = BenchRig(runner, settings)
        try:
            rig.start()
            figures = run_coordinator_benchmark(ctx, rig, sizes)
        except BaseException:
            with contextlib.suppress(Exception):  # the first failure is the one to report
                rig.close()
            raise
        rig.close()
        return figures


@contextlib.contextmanager
def _quiet_kafka() -> Iterator[None]:
    """aiokafka warns about every metadata refresh while topics are being created."""
    logger = logging.getLogger("aiokafka")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)
