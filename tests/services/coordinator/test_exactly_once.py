"""Exactly once through restarts, kills, replays and retries: one regression test per item
of issue #9, against real servers (tansu, redis-server with its append-only file, dynalite
on disk), with the coordinator as a real process that is stopped, killed and restarted.

A commit id is applied at most once whatever attempt ids, offsets or restarts say; every
snapshot is announced at least once, also after a crash between the catalog swap and the
announcement; replays are acknowledged again instead of dead-lettered; nothing is dropped
without a dead letter, and a dead letter carries its original byte for byte.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import crashing_coordinator
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from test_coordinator import (
    DEADLINE_S,
    REPO,
    Stack,
    Writers,
    create_tables,
    create_topics,
    dynamodb_uri,
    free_port,
    producer_for,
    redis_uri,
    table_state,
    wait_until,
)

from icefloe.catalog.uri import load_catalog
from icefloe.dev.local_stack import LocalStack
from icefloe.events import (
    CommitOperation,
    CommitRequested,
    DeadLetter,
    TableCommitted,
    encode_event,
    event_key,
    parse_event,
)
from icefloe.table.catalog import Catalog
from icefloe.table.commit_index import summary_commit_ids
from icefloe.table.snapshot_producer import delete_files

pytestmark = pytest.mark.integration


# -- harness ------------------------------------------------------------------------------


class Outputs:
    """Reads the results and dead-letter topics from the start, in the background."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.committed: list[TableCommitted] = []
        self.dead: list[DeadLetter] = []
        self._consumer: AIOKafkaConsumer | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._consumer = AIOKafkaConsumer(
            self.stack.results,
            self.stack.dead_letters,
            bootstrap_servers=self.stack.brokers,
            group_id=None,
            auto_offset_reset="earliest",
            fetch_max_bytes=64 << 20,
            max_partition_fetch_bytes=16 << 20,
        )
        await self._consumer.start()
        self._task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self._consumer is not None
        while True:
            batch = await self._consumer.getmany(timeout_ms=200)
            for records in batch.values():
                for record in records:
                    event = parse_event(record.value or b"")
                    if isinstance(event, TableCommitted):
                        self.committed.append(event)
                    elif isinstance(event, DeadLetter):
                        self.dead.append(event)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._consumer is not None:
            await self._consumer.stop()

    def acks(self, commit_id: str) -> list[TableCommitted]:
        return [e for e in self.committed if commit_id in e.commit_ids]

    def dead_kinds(self) -> list[str]:
        return [d.reason.split(":", 1)[0] for d in self.dead]

    async def wait_acks(self, commit_id: str, n: int, alive: Callable[[], None]) -> None:
        async def enough() -> bool:
            return len(self.acks(commit_id)) >= n

        await wait_until(enough, f"{n} table-committed for {commit_id}", alive=alive)


@dataclass(frozen=True)
class Crash:
    """Die at commit stage ``at`` after passing it ``after`` times (status 137)."""

    at: str
    after: int = 0


class CoordinatorProcess:
    """``python -m icefloe.coordinator`` as a child process, started and stopped at will."""

    def __init__(self, stack: Stack, logs: Path, name: str = "coordinator", **changes: Any):
        self.stack = stack
        self.logs = logs
        self.name = name
        self.changes = changes
        self.process: subprocess.Popen[bytes] | None = None
        self.runs = 0
        self.log_path = logs / f"{name}-0.log"
        self.port = 0

    def start(self, crash: Crash | None = None) -> None:
        """Start it; with ``crash``, through the test entry point that dies at that stage."""
        self.runs += 1
        self.log_path = self.logs / f"{self.name}-{self.runs}.log"
        self.port = free_port()
        flags = self.stack.flags(http_port=self.port, **self.changes)
        if crash is None:
            argv = [sys.executable, "-m", "icefloe.coordinator", *flags]
        else:
            argv = crashing_coordinator.command(crash.at, crash.after, flags)
        with self.log_path.open("wb") as log_file:
            self.process = subprocess.Popen(
                argv, stdout=log_file, stderr=subprocess.STDOUT, cwd=REPO
            )

    def alive(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            pytest.fail(
                f"coordinator exited with {self.process.returncode}:\n"
                f"{self.log_path.read_text()[-3000:]}"
            )

    async def stop(self, how: str = "term") -> int:
        process = self.process
        assert process is not None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM if how == "term" else signal.SIGKILL)
        code = await asyncio.to_thread(process.wait, DEADLINE_S)
        self.process = None
        return code

    async def exited(self) -> int:
        assert self.process is not None
        code = await asyncio.to_thread(self.process.wait, DEADLINE_S)
        self.process = None
        return code

    async def get(self, path: str) -> str | None:
        try:
            async with (
                aiohttp.ClientSession() as session,
                session.get(f"http://127.0.0.1:{self.port}{path}") as response,
            ):
                return await response.text()
        except aiohttp.ClientError:
            return None

    async def wait_ready(self) -> None:
        """Until the process serves /readyz 200 (it has joined its group and handles
        SIGTERM): a stop before that would be an interpreter's default death."""

        async def ready() -> bool:
            return (await self.get("/readyz") or "").startswith("ready")

        await wait_until(ready, f"{self.name} to be ready", alive=self.alive)

    def kill_quietly(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


EXTRA_PROCESSES: list[CoordinatorProcess] = []  # more replicas a test started; killed at the end


@contextlib.asynccontextmanager
async def harness(
    stack: Stack,
    tmp_path: Path,
    tables: list[str],
    *,
    table_options: dict[str, Any] | None = None,
    **changes: Any,
) -> AsyncIterator[tuple[CoordinatorProcess, Outputs, Writers, Catalog]]:
    """``table_options`` go to :func:`create_tables` (schema, spec, format version), the
    rest to the coordinator process's settings."""
    created = await create_tables(stack.catalog_uri, tables, **(table_options or {}))
    await create_topics(stack)
    producer = await producer_for(stack)
    catalog = load_catalog(stack.catalog_uri)
    outputs = Outputs(stack)
    await outputs.start()
    coordinator = CoordinatorProcess(stack, tmp_path, **changes)
    try:
        yield coordinator, outputs, Writers(producer, stack.events, created), catalog
    finally:
        coordinator.kill_quietly()
        for extra in EXTRA_PROCESSES:
            extra.kill_quietly()
        EXTRA_PROCESSES.clear()
        await outputs.stop()
        await producer.stop()
        await catalog.close()


@pytest.fixture
def stack(kafka_broker: str, redis_server: str, tmp_path: Path) -> Stack:
    warehouse = tmp_path / "warehouse"
    return Stack(kafka_broker, redis_uri(redis_server, warehouse), warehouse)


async def holders(catalog: Catalog, table: str, commit_id: str) -> list[int]:
    """Every snapshot of the table (any branch) that records ``commit_id``."""
    loaded = await catalog.load_table(table)
    return [s.snapshot_id for s in loaded.metadata.snapshots if commit_id in summary_commit_ids(s)]


async def send_job(
    writers: Writers, table: str, commit_id: str, attempt: str, n_files: int = 1
) -> tuple[list[bytes], list[str]]:
    """Publish one attempt's files-written and its commit-requested; the values and paths."""
    files = writers.files(table, n_files)
    event = writers.files_written(table, commit_id, f"{commit_id}/{attempt}", files)
    request = CommitRequested(
        table=table,
        commit_id=commit_id,
        operation=CommitOperation.APPEND,
        attempt_ids=(f"{commit_id}/{attempt}",),
    )
    values = [encode_event(event), encode_event(request)]
    for value in values:
        await writers.send(table, value)
    await writers.producer.flush()
    return values, [f.file_path for f in files]


async def resend(writers: Writers, table: str, values: list[bytes]) -> None:
    for value in values:
        await writers.send(table, value)
    await writers.producer.flush()


def originals(outputs: Outputs, commit_id: str) -> list[tuple[str, Any]]:
    """(kind, parsed original) of dead letters whose original belongs to ``commit_id``."""
    out = []
    for letter in outputs.dead:
        try:
            event = parse_event(letter.original)
        except Exception:
            continue
        if getattr(event, "commit_id", None) == commit_id:
            out.append((letter.reason.split(":", 1)[0], event))
    return out


# -- 1. a retry with a new attempt id after a restart is acknowledged, not applied --------


@pytest.mark.parametrize("how", ["term", "kill"])
async def test_retried_commit_id_after_a_restart_is_acknowledged_not_applied_again(
    how: str, stack: Stack, tmp_path: Path
) -> None:
    async with harness(stack, tmp_path, ["db.retry"]) as (coordinator, outputs, writers, catalog):
        coordinator.start()
        _, first_files = await send_job(writers, "db.retry", "job-42", "attempt-1")
        await outputs.wait_acks("job-42", 1, coordinator.alive)
        first = outputs.acks("job-42")[0].snapshot_id
        await asyncio.sleep(0.3)  # let an offset commit happen or not: both must hold
        assert await coordinator.stop(how) in (0, -signal.SIGKILL)

        coordinator.start()
        _, retry_files = await send_job(writers, "db.retry", "job-42", "attempt-2")
        await outputs.wait_acks("job-42", 2, coordinator.alive)
        assert {e.snapshot_id for e in outputs.acks("job-42")} == {first}
        assert await holders(catalog, "db.retry", "job-42") == [first]
        state = await table_state(catalog, "db.retry")
        assert set(state.live) == set(first_files)
        assert not set(retry_files) & set(state.live)
        # The retry's files are reported as in no snapshot (late), never silently dropped.
        kinds = [kind for kind, _ in originals(outputs, "job-42")]
        assert kinds == ["late-files"]
        assert await coordinator.stop() == 0


async def test_retry_on_dynamodb_after_kill_is_acknowledged_not_applied_again(
    kafka_broker: str, dynalite: str, tmp_path: Path
) -> None:
    stack = Stack(kafka_broker, dynamodb_uri(dynalite, tmp_path / "wh"), tmp_path / "wh")
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "test")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "test")
    async with harness(stack, tmp_path, ["db.retry_ddb"]) as (coordinator, outputs, writers, cat):
        coordinator.start()
        await send_job(writers, "db.retry_ddb", "job-42", "attempt-1")
        await outputs.wait_acks("job-42", 1, coordinator.alive)
        first = outputs.acks("job-42")[0].snapshot_id
        await coordinator.stop("kill")
        coordinator.start()
        _, retry_files = await send_job(writers, "db.retry_ddb", "job-42", "attempt-2")
        await outputs.wait_acks("job-42", 2, coordinator.alive)
        assert {e.snapshot_id for e in outputs.acks("job-42")} == {first}
        assert await holders(cat, "db.retry_ddb", "job-42") == [first]
        assert not set(retry_files) & set((await table_state(cat, "db.retry_ddb")).live)


# -- 2. a crash between the swap and the announcement is announced after the restart ------


async def test_crash_after_the_swap_is_announced_after_the_restart(
    stack: Stack, tmp_path: Path
) -> None:
    async with harness(stack, tmp_path, ["db.swap"]) as (coordinator, outputs, writers, catalog):
        coordinator.start(Crash("after-swap"))
        _, files = await send_job(writers, "db.swap", "job-7", "attempt-1", n_files=2)
        assert await coordinator.exited() == 137
        held = await holders(catalog, "db.swap", "job-7")
        assert len(held) == 1, "the crash point is after the swap: the commit is in the table"
        assert outputs.acks("job-7") == []

        coordinator.start()
        await outputs.wait_acks("job-7", 1, coordinator.alive)
        assert {e.snapshot_id for e in outputs.acks("job-7")} == set(held)
        assert await holders(catalog, "db.swap", "job-7") == held
        assert set((await table_state(catalog, "db.swap")).live) == set(files)
        assert originals(outputs, "job-7") == []
        assert await coordinator.stop() == 0


# -- 3. replays are acknowledged again, exact or streaming --------------------------------


async def test_exact_replay_after_a_restart_is_acknowledged_not_dead_lettered(
    stack: Stack, tmp_path: Path
) -> None:
    async with harness(stack, tmp_path, ["db.replay"]) as (coordinator, outputs, writers, catalog):
        coordinator.start()
        values, files = await send_job(writers, "db.replay", "job-9", "attempt-1", n_files=3)
        await outputs.wait_acks("job-9", 1, coordinator.alive)
        first = outputs.acks("job-9")[0].snapshot_id
        assert await coordinator.stop() == 0

        coordinator.start()
        await resend(writers, "db.replay", values)
        await outputs.wait_acks("job-9", 2, coordinator.alive)
        assert {e.snapshot_id for e in outputs.acks("job-9")} == {first}
        # A dead letter for the replayed files-written would have been published before the
        # acknowledgement of the request behind it, in the same partition.
        assert originals(outputs, "job-9") == []
        assert set((await table_state(catalog, "db.replay")).live) == set(files)
        assert await coordinator.stop() == 0


async def test_a_replay_of_files_removed_since_is_acknowledged_not_reported_deletable(
    stack: Stack, tmp_path: Path
) -> None:
    """A compaction (the coordinator's own, an engine's) or a delete may remove a commit's
    files after it: a replay of its files-written then finds them no longer live. They are
    still in the snapshot that committed them (and its history), so the replay is
    acknowledged, not dead-lettered as late files "that may be deleted"."""
    async with harness(stack, tmp_path, ["db.gone"]) as (coordinator, outputs, writers, catalog):
        coordinator.start()
        values, files = await send_job(writers, "db.gone", "job-11", "attempt-1", n_files=2)
        await outputs.wait_acks("job-11", 1, coordinator.alive)
        first = outputs.acks("job-11")[0].snapshot_id
        assert await coordinator.stop() == 0
        table = await catalog.load_table("db.gone")
        await delete_files(table, files).commit()  # as an engine's DELETE of whole files
        assert not (await table_state(catalog, "db.gone")).live

        coordinator.start()
        await resend(writers, "db.gone", values)
        await outputs.wait_acks("job-11", 2, coordinator.alive)
        assert {e.snapshot_id for e in outputs.acks("job-11")} == {first}
        assert originals(outputs, "job-11") == []
        assert await holders(catalog, "db.gone", "job-11") == [first]
        assert await coordinator.stop() == 0


async def test_streaming_replays_are_acknowledged_again_with_or_without_a_restart(
    stack: Stack, tmp_path: Path
) -> None:
    async with harness(stack, tmp_path, ["db.stream"]) as (coordinator, outputs, writers, catalog):
        coordinator.start()
        files = writers.files("db.stream", 2)
        event = writers.files_written("db.stream", "q:1", "q:1/a", files, complete=True)
        await resend(writers, "db.stream", [encode_event(event)])
        await outputs.wait_acks("q:1", 1, coordinator.alive)
        first = outputs.acks("q:1")[0].snapshot_id
        await resend(writers, "db.stream", [encode_event(event)])  # same process
        await outputs.wait_acks("q:1", 2, coordinator.alive)
        assert await coordinator.stop() == 0

        coordinator.start()
        await resend(writers, "db.stream", [encode_event(event)])  # after a restart
        await outputs.wait_acks("q:1", 3, coordinator.alive)
        # The batch re-run with new files (a new attempt): acknowledged, its files orphans.
        again = writers.files("db.stream", 1)
        rerun = writers.files_written("db.stream", "q:1", "q:1/b", again, complete=True)
        await resend(writers, "db.stream", [encode_event(rerun)])
        await outputs.wait_acks("q:1", 4, coordinator.alive)
        acks = outputs.acks("q:1")
        assert {e.snapshot_id for e in acks} == {first}
        assert list(acks[-1].orphan_files) == [again[0].file_path]
        assert originals(outputs, "q:1") == []
        assert await holders(catalog, "db.stream", "q:1") == [first]
        assert set((await table_state(catalog, "db.stream")).live) == {f.file_path for f in files}
        assert await coordinator.stop() == 0


# -- 4. an event id reused with different files is dead-lettered --------------------------


async def test_reused_event_id_with_other_files_is_dead_lettered(
    stack: Stack, tmp_path: Path
) -> None:
    async with harness(stack, tmp_path, ["db.reuse"]) as (coordinator, outputs, writers, catalog):
        coordinator.start()
        files = writers.files("db.reuse", 1)
        event = writers.files_written("db.reuse", "c4", "c4/a", files)
        other = writers.files("db.reuse", 1)
        impostor = writers.files_written("db.reuse", "c4", "c4/a", other).model_copy(
            update={"event_id": event.event_id}
        )
        request = CommitRequested(
            table="db.reuse",
            commit_id="c4",
            operation=CommitOperation.APPEND,
            event_ids=(event.event_id,),
        )
        impostor_bytes = encode_event(impostor)
        await resend(
            writers, "db.reuse", [encode_event(event), impostor_bytes, encode_event(request)]
        )
        await outputs.wait_acks("c4", 1, coordinator.alive)
        assert [(k, e.file_paths) for k, e in originals(outputs, "c4")] == [
            ("conflicting-event", [other[0].file_path])
        ]
        letter = next(d for d in outputs.dead if d.reason.startswith("conflicting-event"))
        assert letter.original == impostor_bytes
        assert set((await table_state(catalog, "db.reuse")).live) == {files[0].file_path}
        assert await coordinator.stop() == 0


# -- 5. dead letters carry their original byte for byte, however large --------------------


async def test_large_dead_letter_keeps_its_original_byte_for_byte(
    stack: Stack, tmp_path: Path
) -> None:
    async with harness(stack, tmp_path, ["db.big"]) as (coordinator, outputs, _w, _):
        coordinator.start()
        # 6 MiB: its dead letter (base64) is beyond the 8 MiB a producer used to allow,
        # where the original used to be cut to 64 KiB.
        garbage = b'{"version": 1, "type": "files-written", "junk": "' + b"x" * (6 << 20)
        big = AIOKafkaProducer(bootstrap_servers=stack.brokers, max_request_size=16 << 20)
        await big.start()
        try:
            await big.send_and_wait(stack.events, garbage, key=event_key("db.big"))
        finally:
            await big.stop()

        async def arrived() -> bool:
            return any(d.original == garbage for d in outputs.dead)

        await wait_until(arrived, "the large dead letter", alive=coordinator.alive)
        letter = next(d for d in outputs.dead if d.original == garbage)
        assert len(letter.original) > 64 << 10 and letter.reason.startswith("malformed")
        assert await coordinator.stop() == 0


# -- 6. a re-created events topic never makes the coordinator skip events -----------------


async def recreate_events_topic(stack: Stack, writers: Writers) -> None:
    """Delete the events topic and create it again under the same name (offsets restart)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=stack.brokers)
    await admin.start()
    try:
        await admin.delete_topics([stack.events])
        await asyncio.sleep(0.5)
        await admin.create_topics([NewTopic(stack.events, 4, 1)])
    finally:
        await admin.close()
    await writers.producer.client.force_metadata_update()


async def test_recreated_topic_is_detected_and_nothing_is_skipped(
    stack: Stack, tmp_path: Path
) -> None:
    async with harness(stack, tmp_path, ["db.recreate"]) as (coordinator, outputs, writers, cat):
        coordinator.start()
        for i in range(4):
            await send_job(writers, "db.recreate", f"old-{i}", "a", n_files=2)
        await outputs.wait_acks("old-3", 1, coordinator.alive)
        assert await coordinator.stop() == 0

        await recreate_events_topic(stack, writers)
        # The new topic's offsets restart at 0, below the recorded resume point.
        _, files = await send_job(writers, "db.recreate", "new-0", "a")
        coordinator.start()
        await outputs.wait_acks("new-0", 1, coordinator.alive)
        assert set(files) <= set((await table_state(cat, "db.recreate")).live)
        log_text = coordinator.log_path.read_text()
        assert "re-created or truncated" in log_text
        metrics = await coordinator.get("/metrics") or ""
        assert "icefloe_coordinator_topic_recreated_total" in metrics
        assert await coordinator.stop() == 0


# -- 7. stuck files-written events are visible and bounded --------------------------------


async def test_stuck_files_written_is_visible_then_abandoned_and_offsets_move(
    stack: Stack, tmp_path: Path
) -> None:
    async with harness(stack, tmp_path, ["db.stuck"], abandon_after_ms=3000) as (
        coordinator,
        outputs,
        writers,
        catalog,
    ):
        coordinator.start()
        files = writers.files("db.stuck", 1)
        lonely = writers.files_written("db.stuck", "never", "never/a", files)
        await resend(writers, "db.stuck", [encode_event(lonely)])

        async def visible() -> bool:
            text = await coordinator.get("/metrics") or ""
            ready = await coordinator.get("/readyz") or ""
            return (
                "icefloe_coordinator_pending_events 1.0" in text
                and "pending files-written events: 1" in ready
            )

        await wait_until(
            visible, "the stuck event in /metrics and /readyz", alive=coordinator.alive
        )

        async def abandoned() -> bool:
            return [k for k, _ in originals(outputs, "never")] == ["abandoned"]

        await wait_until(abandoned, "the abandoned dead letter", alive=coordinator.alive)
        partition = next(
            d.source_partition for d in outputs.dead if d.reason.startswith("abandoned")
        )
        await send_job(writers, "db.stuck", "after", "a")
        await outputs.wait_acks("after", 1, coordinator.alive)
        assert await coordinator.stop() == 0
        committed = await group_offsets(stack)
        ends = await end_offsets(stack)
        assert committed[partition] == ends[partition], (committed, ends, partition)
        assert (await table_state(catalog, "db.stuck")).commit_ids == ["after"]


async def group_offsets(stack: Stack, group: str = "coordinator") -> dict[int, int | None]:
    consumer = AIOKafkaConsumer(bootstrap_servers=stack.brokers, group_id=f"{stack.prefix}-{group}")
    await consumer.start()
    try:
        out: dict[int, int | None] = {}
        for p in range(4):
            out[p] = await consumer.committed(TopicPartition(stack.events, p))
        return out
    finally:
        await consumer.stop()


async def end_offsets(stack: Stack) -> dict[int, int]:
    """Each events partition's end offset, as a fetch reports it (tansu's ListOffsets
    answers the last batch's base offset + 1, which is short when the batch held several)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=stack.brokers, group_id=None)
    await consumer.start()
    try:
        tps = [TopicPartition(stack.events, p) for p in range(4)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)

        async def known() -> bool:
            await consumer.getmany(timeout_ms=200)
            return all(consumer.highwater(tp) is not None for tp in tps)

        await wait_until(known, "the partitions' high watermarks")
        return {tp.partition: int(consumer.highwater(tp) or 0) for tp in tps}
    finally:
        await consumer.stop()


# -- the local stack persists what must survive a restart ---------------------------------


async def test_local_stack_redis_and_dynalite_keep_tables_across_restarts(
    tmp_path: Path,
) -> None:
    from test_coordinator import SCHEMA, SPEC

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "test")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "test")
    prefix = f"p{uuid.uuid4().hex[:6]}"
    warehouse = f"file://{tmp_path / 'wh'}"

    def uris(s: LocalStack) -> list[str]:
        return [
            f"{s.redis_url}?warehouse={warehouse}&prefix={prefix}",
            f"dynamodb://persist?endpoint={s.dynamodb_endpoint}&region=us-east-1"
            f"&warehouse={warehouse}",
        ]

    async with LocalStack(redis=True, dynamodb=True, workdir=tmp_path / "stack") as first:
        assert (tmp_path / "stack" / "redis-data").is_dir()
        for i, uri in enumerate(uris(first)):
            catalog = load_catalog(uri)
            try:
                await catalog.create_namespace(f"ns{i}")
                await catalog.create_table(f"ns{i}.kept", SCHEMA, SPEC)
            finally:
                await catalog.close()
    async with LocalStack(redis=True, dynamodb=True, workdir=tmp_path / "stack") as second:
        for i, uri in enumerate(uris(second)):
            catalog = load_catalog(uri)
            try:
                table = await catalog.load_table(f"ns{i}.kept")
                assert table.metadata.schema().find_field(1) is not None
            finally:
                await catalog.close()


# -- catalog outages: a frozen Redis or DynamoDB only delays commits ----------------------


@pytest.mark.parametrize("store", ["redis", "dynamodb"])
async def test_catalog_outages_and_a_kill_during_one_never_lose_or_double_a_commit(
    store: str, kafka_broker: str, tmp_path: Path
) -> None:
    from test_coordinator import all_committed, assert_exactly_once

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "test")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "test")
    warehouse = tmp_path / "warehouse"
    async with LocalStack(
        redis=store == "redis", dynamodb=store == "dynamodb", workdir=tmp_path / "own"
    ) as own:
        uri = (
            redis_uri(own.redis_url, warehouse)
            if store == "redis"
            else dynamodb_uri(own.dynamodb_endpoint, warehouse)
        )
        server = own.servers["redis" if store == "redis" else "dynamodb"].process
        stack = Stack(kafka_broker, uri, warehouse)
        names = ["db.outage_0", "db.outage_1"]
        async with harness(stack, tmp_path, names, batch_max_wait_ms=50) as (
            coordinator,
            outputs,
            writers,
            catalog,
        ):
            coordinator.start()
            await coordinator.wait_ready()

            async def produce() -> None:
                for i in range(24):
                    name = names[i % 2]
                    if i % 5 == 4:
                        await writers.stream(name, f"{name}-s{i}")
                    else:
                        await writers.job(name, f"{name}-j{i}", 1, 2, retried=i % 3 == 0)
                    await writers.producer.flush()
                    await asyncio.sleep(0.25)

            producing = asyncio.create_task(produce())
            for outage, kill in ((4.0, False), (3.0, True)):
                await asyncio.sleep(1.0)
                server.send_signal(signal.SIGSTOP)
                try:
                    await asyncio.sleep(outage / 2)
                    if kill:  # the coordinator dies mid-outage and restarts into it
                        await coordinator.stop("kill")
                        coordinator.start()
                    await asyncio.sleep(outage / 2)
                finally:
                    server.send_signal(signal.SIGCONT)
            await producing

            async def done() -> bool:
                return await all_committed(catalog, writers)

            await wait_until(done, "every commit after the outages", alive=coordinator.alive)
            every = {c for cs in writers.commits.values() for c in cs}

            async def announced() -> bool:
                return {c for e in outputs.committed for c in e.commit_ids} >= every

            await wait_until(announced, "every commit announced", alive=coordinator.alive)
            assert await coordinator.stop() == 0
            await assert_exactly_once(catalog, writers)
            for name in names:
                for commit_id in writers.commits[name]:
                    held = await holders(catalog, name, commit_id)
                    assert {e.snapshot_id for e in outputs.acks(commit_id)} == set(held)
            assert not [d for d in outputs.dead if not d.reason.startswith("late-files")]
