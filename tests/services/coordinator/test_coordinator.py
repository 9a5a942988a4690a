"""Integration tests of the coordinator service against real servers: tansu (Kafka), redis
and dynalite (DynamoDB), with table metadata and small real data files in a local warehouse.

Every test uses its own topics, consumer groups and catalog prefix, so tests sharing the
session's servers never see each other's events or tables.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import crashing_coordinator
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from icefloe.catalog.uri import load_catalog
from icefloe.coordinator.committer import summary_commit_ids
from icefloe.coordinator.config import CoordinatorConfig
from icefloe.coordinator.history import SUMMARY_OFFSETS, SUMMARY_POSITIONS
from icefloe.coordinator.service import Coordinator
from icefloe.errors import ValidationError
from icefloe.events import (
    CommitOperation,
    CommitRequested,
    DeadLetter,
    FilesWritten,
    TableCommitted,
    encode_event,
    event_key,
    parse_event,
)
from icefloe.manifests.reader import ManifestReader
from icefloe.spec.datafile import DataFile
from icefloe.spec.partition import PartitionField, PartitionSpec
from icefloe.spec.schema import Schema
from icefloe.spec.transforms import IdentityTransform
from icefloe.spec.types import LongType, NestedField, StringType
from icefloe.table.catalog import Catalog, Table

REPO = Path(__file__).resolve().parents[3]
SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True), NestedField(2, "cat", StringType())
)
SPEC = PartitionSpec(0, (PartitionField(2, 1000, "cat", IdentityTransform()),))
PARTITIONS = 4
DEADLINE_S = 120.0


# -- set-up helpers -------------------------------------------------------------------------


@dataclass
class Stack:
    """One test's topics, group and catalog on the session's servers."""

    brokers: str
    catalog_uri: str
    warehouse: Path
    prefix: str = field(default_factory=lambda: f"t{uuid.uuid4().hex[:10]}")

    @property
    def events(self) -> str:
        return f"{self.prefix}.events"

    @property
    def results(self) -> str:
        return f"{self.prefix}.results"

    @property
    def dead_letters(self) -> str:
        return f"{self.prefix}.dead-letter"

    def config(self, group: str = "coordinator", **changes: Any) -> CoordinatorConfig:
        values: dict[str, Any] = {
            "brokers": self.brokers,
            "catalog": self.catalog_uri,
            "events_topic": self.events,
            "results_topic": self.results,
            "dead_letter_topic": self.dead_letters,
            "group_id": f"{self.prefix}-{group}",
            "topic_partitions": PARTITIONS,
            "session_timeout_ms": 2000,
            "http_port": 0,
            "http_host": "127.0.0.1",
            "batch_max_files": 50,
            "batch_max_wait_ms": 100,
            "offset_commit_interval_ms": 100,
            "log_format": "text",
        }
        values.update(changes)
        return CoordinatorConfig(**values)

    def flags(self, group: str = "coordinator", **changes: Any) -> list[str]:
        """The same settings as command-line flags, for a coordinator subprocess."""
        config = self.config(group, **changes)
        out = []
        for name in config.model_fields_set:
            out += ["--" + name.replace("_", "-"), str(getattr(config, name))]
        return out


def redis_uri(redis_server: str, warehouse: Path) -> str:
    return f"{redis_server}?warehouse=file://{warehouse}&prefix=p{uuid.uuid4().hex[:8]}"


def dynamodb_uri(endpoint: str, warehouse: Path) -> str:
    return (
        f"dynamodb://icefloe_{uuid.uuid4().hex[:8]}?endpoint={endpoint}&region=us-east-1"
        f"&warehouse=file://{warehouse}&dynamodb.access-key-id=test"
        "&dynamodb.secret-access-key=test"
    )


@pytest.fixture
def redis_stack(kafka_broker: str, redis_server: str, tmp_path: Path) -> Stack:
    warehouse = tmp_path / "warehouse"
    return Stack(kafka_broker, redis_uri(redis_server, warehouse), warehouse)


async def create_tables(
    uri: str,
    names: list[str],
    *,
    schema: Schema = SCHEMA,
    spec: PartitionSpec = SPEC,
    format_version: int = 2,
    **properties: str,
) -> dict[str, Table]:
    catalog = load_catalog(uri)
    try:
        if not await catalog.namespace_exists("db"):
            await catalog.create_namespace("db")
        return {
            name: await catalog.create_table(
                name, schema, spec, properties=properties, format_version=format_version
            )
            for name in names
        }
    finally:
        await catalog.close()


async def create_topics(stack: Stack) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=stack.brokers)
    await admin.start()
    try:
        await admin.create_topics(
            [NewTopic(t, PARTITIONS, 1) for t in (stack.events, stack.results, stack.dead_letters)]
        )
    finally:
        await admin.close()


async def wait_until(
    check: Callable[[], Awaitable[bool]],
    what: str,
    *,
    alive: Callable[[], None] | None = None,
    timeout_s: float = DEADLINE_S,
) -> None:
    """Poll ``check`` until it holds; fail with ``what`` after a generous deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        if alive is not None:
            alive()
        if await check():
            return
        if time.monotonic() > deadline:
            pytest.fail(f"gave up after {timeout_s:.0f}s waiting for {what}")
        await asyncio.sleep(0.2)


@contextlib.asynccontextmanager
async def running(coordinator: Coordinator) -> AsyncIterator[asyncio.Task[None]]:
    """Run a coordinator in this loop; stop it cleanly (it must not have died)."""
    task = asyncio.create_task(coordinator.run())

    def alive() -> None:
        if task.done():
            task.result()  # raises what killed it
            pytest.fail("the coordinator stopped on its own")

    await wait_until(lambda: _true(coordinator.ready), "the consumer to join", alive=alive)
    try:
        yield task
    finally:
        coordinator.request_stop()
        await task


async def _true(value: bool) -> bool:
    return value


def task_alive(task: asyncio.Task[None]) -> Callable[[], None]:
    def check() -> None:
        if task.done():
            task.result()
            pytest.fail("the coordinator stopped on its own")

    return check


# -- writers ------------------------------------------------------------------------------


class Writers:
    """Plays writer jobs: writes real files, publishes files-written and commit-requested."""

    def __init__(self, producer: AIOKafkaProducer, topic: str, tables: dict[str, Table]) -> None:
        self.producer = producer
        self.topic = topic
        self.tables = tables
        self.expected: dict[str, Counter[str]] = {name: Counter() for name in tables}
        self.commits: dict[str, list[str]] = {name: [] for name in tables}
        self.orphans: dict[str, set[str]] = {name: set() for name in tables}
        self.counter = 0

    def files(self, table: str, n: int, cat: str = "a") -> list[DataFile]:
        location = self.tables[table].location
        out = []
        for _ in range(n):
            self.counter += 1
            path = f"{location}/data/cat={cat}/part-{self.counter:06d}.parquet"
            size = 16 + self.counter % 50
            local = Path(path.removeprefix("file://"))
            local.parent.mkdir(parents=True, exist_ok=True)
            local.write_bytes(b"x" * size)
            out.append(DataFile(path, "parquet", (cat,), 5, size))
        return out

    def files_written(
        self,
        table: str,
        commit_id: str,
        attempt: str,
        files: list[DataFile],
        complete: bool = False,
    ) -> FilesWritten:
        md = self.tables[table].metadata
        return FilesWritten.from_data_files(
            table, commit_id, "writer", attempt, md.schema(), md.spec(), files, complete=complete
        )

    async def send(self, table: str, value: bytes) -> None:
        await self.producer.send(self.topic, value, key=event_key(table))

    async def job(
        self,
        table: str,
        commit_id: str,
        files_per_task: int = 2,
        tasks: int = 2,
        retried: bool = False,
    ) -> None:
        """A job of ``tasks`` tasks; a retried job also has a failed first attempt whose
        files the commit must leave out."""
        attempts = ["attempt-1", "attempt-0"] if retried else ["attempt-0"]
        chosen = attempts[0]
        for attempt in reversed(attempts):
            for _ in range(tasks):
                files = self.files(table, files_per_task)
                event = self.files_written(table, commit_id, f"{commit_id}/{attempt}", files)
                await self.send(table, encode_event(event))
                if attempt == chosen:
                    self.expected[table].update(f.file_path for f in files)
                else:
                    self.orphans[table].update(f.file_path for f in files)
        request = CommitRequested(
            table=table,
            commit_id=commit_id,
            operation=CommitOperation.APPEND,
            attempt_ids=(f"{commit_id}/{chosen}",),
            # Equal properties let commits share a snapshot (differing values would not).
            snapshot_properties={"writer": "integration-test"},
        )
        await self.send(table, encode_event(request))
        self.commits[table].append(commit_id)

    async def stream(self, table: str, commit_id: str, n: int = 3) -> None:
        files = self.files(table, n)
        event = self.files_written(table, commit_id, f"{commit_id}/s", files, complete=True)
        await self.send(table, encode_event(event))
        self.expected[table].update(f.file_path for f in files)
        self.commits[table].append(commit_id)

    @property
    def total_commits(self) -> int:
        return sum(len(c) for c in self.commits.values())


async def producer_for(stack: Stack) -> AIOKafkaProducer:
    producer = AIOKafkaProducer(
        bootstrap_servers=stack.brokers, acks="all", enable_idempotence=False, linger_ms=5
    )
    await producer.start()
    return producer


# -- reading the outcome ------------------------------------------------------------------


@dataclass
class TableState:
    live: Counter[str]
    commit_ids: list[str]  # every commit id recorded along main, with repetitions
    summaries: list[dict[str, str]]


async def table_state(catalog: Catalog, name: str) -> TableState:
    table = await catalog.load_table(name)
    md = table.metadata
    head = md.current_snapshot()
    live: Counter[str] = Counter()
    ids: list[str] = []
    summaries: list[dict[str, str]] = []
    if head is not None:
        reader = ManifestReader(table.io)
        for manifest in await reader.manifests(head):
            for entry in await reader.entries(manifest, md.specs(), live_only=True):
                live[entry.data_file.file_path] += 1
        for snapshot in md.ancestors_of(head.snapshot_id):
            ids.extend(summary_commit_ids(snapshot))
            summaries.append(dict(snapshot.summary or {}))
    return TableState(live, ids, summaries)


async def all_committed(catalog: Catalog, writers: Writers) -> bool:
    for name, commits in writers.commits.items():
        state = await table_state(catalog, name)
        if not set(commits) <= set(state.commit_ids):
            return False
    return True


async def assert_exactly_once(catalog: Catalog, writers: Writers) -> None:
    for name in writers.tables:
        state = await table_state(catalog, name)
        twice = [p for p, n in state.live.items() if n > 1]
        assert not twice, f"{name}: files committed more than once: {twice[:5]}"
        assert set(state.live) == set(writers.expected[name]), (
            f"{name}: missing {sorted(set(writers.expected[name]) - set(state.live))[:5]}, "
            f"unexpected {sorted(set(state.live) - set(writers.expected[name]))[:5]}"
        )
        assert not set(state.live) & writers.orphans[name], f"{name}: orphan files committed"
        counts = Counter(state.commit_ids)
        assert {c for c, n in counts.items() if n > 1} == set(), f"{name}: commit ids twice"
        assert set(counts) == set(writers.commits[name])
        for summary in state.summaries:
            assert summary.get("operation") == "append"
            assert json.loads(summary[SUMMARY_OFFSETS]), "snapshot without resume points"
            assert json.loads(summary[SUMMARY_POSITIONS])


async def read_until(
    stack: Stack, topic: str, done: Callable[[list[Any]], bool], *, what: str
) -> list[Any]:
    """Read ``topic`` from the start until ``done(events)``, failing after the deadline."""
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=stack.brokers, group_id=None, auto_offset_reset="earliest"
    )
    await consumer.start()
    out: list[Any] = []
    try:

        async def more() -> bool:
            batch = await consumer.getmany(timeout_ms=200)
            for records in batch.values():
                out.extend(parse_event(r.value) for r in records)
            return done(out)

        await wait_until(more, what)
    finally:
        await consumer.stop()
    return out


# -- tests --------------------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize("store", ["redis", "dynamodb"])
async def test_end_to_end_every_commit_lands_exactly_once(
    store: str,
    kafka_broker: str,
    redis_server: str,
    dynalite: str,
    tmp_path: Path,
) -> None:
    warehouse = tmp_path / "warehouse"
    uri = (
        redis_uri(redis_server, warehouse)
        if store == "redis"
        else dynamodb_uri(dynalite, warehouse)
    )
    stack = Stack(kafka_broker, uri, warehouse)
    names = [f"db.events_{i}" for i in range(5)]
    tables = await create_tables(uri, names)
    coordinator = Coordinator(stack.config(batch_max_files=200))
    catalog = load_catalog(uri)
    producer = await producer_for(stack)
    try:
        async with running(coordinator) as task:
            writers = Writers(producer, stack.events, tables)
            rng = random.Random(7)
            for i in range(60):
                for name in names:
                    if rng.random() < 0.15:
                        await writers.stream(name, f"{name}-stream-{i}")
                    else:
                        await writers.job(
                            name, f"{name}-job-{i}", files_per_task=4, retried=rng.random() < 0.2
                        )
            await producer.flush()
            total_files = sum(sum(c.values()) for c in writers.expected.values())
            assert total_files >= 2000
            await wait_until(
                lambda: all_committed(catalog, writers),
                f"{writers.total_commits} commits",
                alive=task_alive(task),
            )
            await assert_exactly_once(catalog, writers)
            await _check_http(coordinator)
        every_commit = {c for cs in writers.commits.values() for c in cs}
        committed = await read_until(
            stack,
            stack.results,
            lambda events: {c for e in events for c in e.commit_ids} >= every_commit,
            what="table-committed events for every commit",
        )
        assert all(isinstance(e, TableCommitted) and e.latency_ms >= 0 for e in committed)
        announced = Counter(c for e in committed for c in e.commit_ids)
        assert set(announced) == every_commit
        orphans_reported = {f for e in committed for f in e.orphan_files}
        assert orphans_reported == set().union(*writers.orphans.values())
        for event in committed:
            assert event.table in tables and event.metadata_location.endswith(".metadata.json")
            assert event.added_data_files > 0 and event.sequence_number > 0
        # Batching worked: far fewer snapshots than commits.
        snapshots = [len((await table_state(catalog, n)).summaries) for n in names]
        assert sum(snapshots) < writers.total_commits
    finally:
        await producer.stop()
        await catalog.close()


async def _check_http(coordinator: Coordinator) -> None:
    async with aiohttp.ClientSession() as session:
        for path, status in (("/healthz", 200), ("/readyz", 200)):
            async with session.get(coordinator.http.url + path) as response:
                assert response.status == status
        async with session.get(coordinator.http.url + "/metrics") as response:
            text = await response.text()
    assert response.status == 200
    for series in (
        "icefloe_coordinator_events_consumed_total",
        "icefloe_coordinator_snapshots_committed_total",
        "icefloe_coordinator_commit_latency_seconds_bucket",
        "icefloe_coordinator_consumer_lag",
        "icefloe_coordinator_tables_active",
    ):
        assert series in text


@pytest.mark.integration
async def test_batching_limits_come_from_table_properties(redis_stack: Stack) -> None:
    tables = await create_tables(
        redis_stack.catalog_uri, ["db.tiny"], **{"icefloe.batch.max-files": "2"}
    )
    coordinator = Coordinator(redis_stack.config(batch_max_files=1000, batch_max_wait_ms=60_000))
    catalog = load_catalog(redis_stack.catalog_uri)
    producer = await producer_for(redis_stack)
    try:
        async with running(coordinator) as task:
            writers = Writers(producer, redis_stack.events, tables)
            for i in range(4):
                await writers.job("db.tiny", f"c{i}", files_per_task=1, tasks=2)
            await producer.flush()
            # With the service default (1000 files, 60 s) nothing would be due yet.
            await wait_until(
                lambda: all_committed(catalog, writers), "4 commits", alive=task_alive(task)
            )
            state = await table_state(catalog, "db.tiny")
            assert len(state.summaries) == 4
    finally:
        await producer.stop()
        await catalog.close()


@pytest.mark.integration
async def test_two_coordinators_on_the_same_partitions_never_commit_a_file_twice(
    redis_stack: Stack,
) -> None:
    names = [f"db.shared_{i}" for i in range(3)]
    tables = await create_tables(redis_stack.catalog_uri, names)
    owner = Coordinator(redis_stack.config("owner", batch_max_files=7, batch_max_wait_ms=20))
    zombie = Coordinator(redis_stack.config("zombie", batch_max_files=5, batch_max_wait_ms=30))
    catalog = load_catalog(redis_stack.catalog_uri)
    producer = await producer_for(redis_stack)
    try:
        async with running(owner) as owner_task, running(zombie) as zombie_task:
            writers = Writers(producer, redis_stack.events, tables)
            rng = random.Random(11)
            for i in range(40):
                name = rng.choice(names)
                if rng.random() < 0.3:
                    await writers.stream(name, f"s{i}")
                else:
                    await writers.job(name, f"j{i}", retried=rng.random() < 0.3)
            await producer.flush()

            def both_alive() -> None:
                task_alive(owner_task)()
                task_alive(zombie_task)()

            await wait_until(
                lambda: all_committed(catalog, writers), "all commits", alive=both_alive
            )
            # Let both finish what they still had in flight before looking.
            await wait_until(
                lambda: _true(owner.active_tables == 0 and zombie.active_tables == 0),
                "both coordinators to go idle",
                alive=both_alive,
            )
        await assert_exactly_once(catalog, writers)
    finally:
        await producer.stop()
        await catalog.close()


@pytest.mark.integration
async def test_rebalances_between_replicas_hand_tables_over_exactly_once(
    redis_stack: Stack,
) -> None:
    names = [f"db.scaled_{i}" for i in range(6)]
    tables = await create_tables(redis_stack.catalog_uri, names)
    first = Coordinator(redis_stack.config("group", batch_max_files=6))
    second = Coordinator(redis_stack.config("group", batch_max_files=6))
    catalog = load_catalog(redis_stack.catalog_uri)
    producer = await producer_for(redis_stack)
    writers = Writers(producer, redis_stack.events, tables)
    rng = random.Random(3)

    async def publish(jobs: int, tag: str) -> None:
        for i in range(jobs):
            await writers.job(rng.choice(names), f"{tag}-{i}", retried=rng.random() < 0.2)
        await producer.flush()

    try:
        async with running(first) as first_task:
            await publish(20, "alone")
            async with running(second) as second_task:
                # The group now splits the partitions: both replicas own some tables.
                await wait_until(
                    lambda: _true(0 < len(first.group.partitions) < PARTITIONS),
                    "the partitions to be shared",
                    alive=task_alive(first_task),
                )
                await publish(20, "shared")
                await wait_until(
                    lambda: all_committed(catalog, writers),
                    "the commits published while shared",
                    alive=task_alive(second_task),
                )
            # The second replica left: its partitions come back to the first.
            await publish(20, "after")
            await wait_until(
                lambda: all_committed(catalog, writers),
                "the commits published after the hand-over",
                alive=task_alive(first_task),
            )
        await assert_exactly_once(catalog, writers)
    finally:
        await producer.stop()
        await catalog.close()


@pytest.mark.integration
async def test_malformed_events_are_dead_lettered_and_never_stop_the_service(
    redis_stack: Stack,
) -> None:
    tables = await create_tables(redis_stack.catalog_uri, ["db.good_0", "db.good_1"])
    coordinator = Coordinator(redis_stack.config())
    catalog = load_catalog(redis_stack.catalog_uri)
    producer = await producer_for(redis_stack)
    rng = random.Random(5)
    bad: Counter[str] = Counter()
    try:
        async with running(coordinator) as task:
            writers = Writers(producer, redis_stack.events, tables)
            good = tables["db.good_0"]
            for i in range(1500):
                kind = rng.choice(["bytes", "types", "missing", "path", "table", "version"])
                name = rng.choice(list(tables))
                value: bytes
                key = event_key(name)
                if kind == "bytes":
                    value = rng.randbytes(rng.randint(0, 64))
                    key = rng.randbytes(4)
                elif kind == "types":
                    obj = json.loads(encode_event(writers.files_written(name, f"x{i}", "a", [])))
                    obj[rng.choice(["schema-id", "spec-id", "commit-id", "data-files"])] = {"no": 1}
                    value = json.dumps(obj).encode()
                elif kind == "missing":
                    obj = json.loads(encode_event(writers.files_written(name, f"x{i}", "a", [])))
                    del obj[rng.choice(["table", "commit-id", "attempt-id", "event-id"])]
                    value = json.dumps(obj).encode()
                elif kind == "version":
                    obj = json.loads(encode_event(writers.files_written(name, f"x{i}", "a", [])))
                    obj["version"] = 2
                    value = json.dumps(obj).encode()
                elif kind == "path":
                    outside = DataFile(f"file:///elsewhere/{i}.parquet", "parquet", ("a",), 1, 1)
                    value = encode_event(
                        writers.files_written("db.good_0", f"x{i}", "a", [outside])
                    )
                    key = event_key("db.good_0")
                else:
                    ghost = FilesWritten.from_data_files(
                        "db.nowhere",
                        f"x{i}",
                        "w",
                        "a",
                        good.metadata.schema(),
                        good.metadata.spec(),
                        [],
                    )
                    value, key = encode_event(ghost), event_key("db.nowhere")
                await producer.send(redis_stack.events, value, key=key)
                bad[kind] += 1
                if i % 25 == 0:
                    await writers.job(name, f"valid-{i}", files_per_task=1, tasks=1)
            await producer.flush()
            await wait_until(
                lambda: all_committed(catalog, writers),
                f"{writers.total_commits} valid commits",
                alive=task_alive(task),
            )
            letters = await read_until(
                redis_stack,
                redis_stack.dead_letters,
                lambda events: len(events) >= sum(bad.values()),
                what=f"{sum(bad.values())} dead letters",
            )
            assert not task.done()
        await assert_exactly_once(catalog, writers)
        assert len(letters) == sum(bad.values())
        reasons = Counter(e.reason.split(":", 1)[0] for e in letters if isinstance(e, DeadLetter))
        assert reasons["bad-path"] == bad["path"]
        assert reasons["unknown-table"] == bad["table"]
        assert reasons["unsupported-version"] == bad["version"]
        assert reasons["malformed"] == bad["bytes"] + bad["types"] + bad["missing"]
        for letter in letters:
            assert letter.source_topic == redis_stack.events and letter.reason
            assert letter.original is not None
    finally:
        await producer.stop()
        await catalog.close()


@pytest.mark.integration
async def test_sigterm_commits_what_is_ready_and_exits_zero(
    redis_stack: Stack, tmp_path: Path
) -> None:
    tables = await create_tables(redis_stack.catalog_uri, ["db.drain"])
    await create_topics(redis_stack)
    catalog = load_catalog(redis_stack.catalog_uri)
    producer = await producer_for(redis_stack)
    log_path = tmp_path / "coordinator.log"
    port = free_port()
    # Units would wait ten minutes for more: only the shutdown commits them.
    flags = redis_stack.flags(batch_max_wait_ms=600_000, batch_max_files=10_000, http_port=port)
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "icefloe.coordinator", *flags],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
    try:
        writers = Writers(producer, redis_stack.events, tables)
        for i in range(3):
            await writers.job("db.drain", f"c{i}")
        await producer.flush()

        async def three_units_ready() -> bool:
            text = await _get(f"http://127.0.0.1:{port}/metrics")
            wanted = 'icefloe_coordinator_events_batched_total{type="commit-requested"} 3.0'
            return text is not None and wanted in text

        await wait_until(
            three_units_ready,
            "the coordinator to have three ready units",
            alive=lambda: _process_alive(process, log_path),
        )
        assert not await all_committed(catalog, writers)
        process.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(process.wait, DEADLINE_S) == 0, log_path.read_text()
        await assert_exactly_once(catalog, writers)
        assert len((await table_state(catalog, "db.drain")).summaries) == 1
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        await producer.stop()
        await catalog.close()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _get(url: str) -> str | None:
    try:
        async with aiohttp.ClientSession() as session, session.get(url) as response:
            return await response.text() if response.status == 200 else None
    except aiohttp.ClientError:
        return None


def _process_alive(process: subprocess.Popen[bytes], log_path: Path) -> None:
    if process.poll() is not None:
        pytest.fail(
            f"coordinator exited with {process.returncode}:\n{log_path.read_text()[-3000:]}"
        )


@pytest.mark.integration
@pytest.mark.parametrize("point", ["after-manifests", "after-metadata", "after-swap"])
async def test_crashes_at_each_commit_step_never_lose_or_double_a_file(
    point: str, redis_stack: Stack, tmp_path: Path
) -> None:
    names = ["db.crash_0", "db.crash_1"]
    tables = await create_tables(redis_stack.catalog_uri, names)
    await create_topics(redis_stack)
    catalog = load_catalog(redis_stack.catalog_uri)
    producer = await producer_for(redis_stack)
    writers = Writers(producer, redis_stack.events, tables)
    rng = random.Random(point)
    for i in range(10):
        for name in names:
            await writers.job(name, f"{name}-c{i}", files_per_task=1, tasks=2, retried=i % 4 == 0)
    await producer.flush()
    flags = redis_stack.flags(batch_max_files=4, batch_max_wait_ms=20, session_timeout_ms=1500)
    crashes = 0
    try:
        for cycle in range(30):
            log_path = tmp_path / f"cycle-{cycle}.log"
            argv = crashing_coordinator.command(point, rng.randint(1, 2), flags)
            with log_path.open("wb") as log_file:
                process = subprocess.Popen(
                    argv, stdout=log_file, stderr=subprocess.STDOUT, cwd=REPO
                )
            try:

                async def exited_or_done(p: subprocess.Popen[bytes] = process) -> bool:
                    return p.poll() is not None or await all_committed(catalog, writers)

                await wait_until(exited_or_done, f"cycle {cycle} to crash or finish")
                if process.poll() is not None:
                    assert process.returncode == 137, log_path.read_text()[-3000:]
                    crashes += 1
                if await all_committed(catalog, writers):
                    break
            finally:
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
                    code = await asyncio.to_thread(process.wait, DEADLINE_S)
                    assert code in (0, 137), log_path.read_text()[-3000:]
        else:
            pytest.fail(f"not all commits landed after 30 restarts ({crashes} crashes)")
        assert crashes >= 2, f"the {point} crash point was reached only {crashes} time(s)"
        await assert_exactly_once(catalog, writers)
    finally:
        await producer.stop()
        await catalog.close()


# -- settings and the HTTP endpoints (no servers) -----------------------------------------


def test_settings_come_from_the_environment_and_flags_override_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from icefloe.cli.main import build_parser
    from icefloe.coordinator.config import overrides_from_args

    monkeypatch.setenv("ICEFLOE_CATALOG", "file:///tmp/warehouse")
    monkeypatch.setenv("ICEFLOE_BATCH_MAX_FILES", "77")
    monkeypatch.setenv("ICEFLOE_CHECK_FILES", "false")
    args = build_parser().parse_args(
        ["coordinator", "--batch-max-files", "5", "--group-id", "g", "--check-files"]
    )
    config = CoordinatorConfig.load(overrides_from_args(args))
    assert (config.batch_max_files, config.group_id, config.check_files) == (5, "g", True)
    assert config.catalog == "file:///tmp/warehouse"
    assert CoordinatorConfig.load().batch_max_files == 77
    with pytest.raises(ValidationError, match="ICEFLOE_BATCH_MAX_WAIT_MS"):
        CoordinatorConfig.load({"batch_max_wait_ms": -1})
    with pytest.raises(ValidationError, match="must differ"):
        CoordinatorConfig.load({"results_topic": "icefloe.events"})


def test_kafka_options_carry_sasl_and_tls(tmp_path: Path) -> None:
    plain = CoordinatorConfig.load({"catalog": "file:///w", "brokers": "a:1, b:2"})
    assert plain.kafka_options() == {
        "bootstrap_servers": ["a:1", "b:2"],
        "client_id": "icefloe-coordinator",
        "security_protocol": "PLAINTEXT",
    }
    sasl = CoordinatorConfig.load(
        {
            "catalog": "file:///w",
            "sasl_mechanism": "SCRAM-SHA-512",
            "sasl_username": "svc",
            "sasl_password": "secret",
        }
    )
    options = sasl.kafka_options()
    assert options["security_protocol"] == "SASL_PLAINTEXT"
    assert (options["sasl_plain_username"], options["sasl_plain_password"]) == ("svc", "secret")
    assert "secret" not in repr(sasl)
    ca = tmp_path / "ca.pem"
    ca.write_bytes(_self_signed_certificate())
    tls = CoordinatorConfig.load({"catalog": "file:///w", "tls_cafile": str(ca)})
    assert tls.kafka_options()["security_protocol"] == "SSL"
    assert tls.kafka_options()["ssl_context"] is not None
    with pytest.raises(ValidationError, match="needs sasl_username"):
        CoordinatorConfig.load({"catalog": "file:///w", "sasl_mechanism": "PLAIN"})


async def test_http_endpoints_report_health_readiness_and_metrics() -> None:
    from prometheus_client import CollectorRegistry, Counter

    from icefloe.runtime.http import ServiceHttp

    registry = CollectorRegistry()
    Counter("icefloe_test_things", "things", registry=registry).inc(3)
    state = {"ready": False}
    http = ServiceHttp(registry, ready=lambda: state["ready"], host="127.0.0.1", port=0)
    await http.start()
    try:
        assert http.port > 0
        async with aiohttp.ClientSession() as session:
            async with session.get(http.url + "/healthz") as response:
                assert response.status == 200
            async with session.get(http.url + "/readyz") as response:
                assert response.status == 503
            state["ready"] = True
            async with session.get(http.url + "/readyz") as response:
                assert response.status == 200
            async with session.get(http.url + "/metrics") as response:
                assert response.status == 200
                assert response.headers["Content-Type"].startswith("text/plain")
                assert "icefloe_test_things_total 3.0" in await response.text()
    finally:
        await http.stop()


def _self_signed_certificate() -> bytes:
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "icefloe test CA")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return certificate.public_bytes(serialization.Encoding.PEM)
