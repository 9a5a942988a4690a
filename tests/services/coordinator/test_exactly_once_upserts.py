"""Exactly once for upserts, through every crash point (after-manifests, after-metadata,
after-swap), SIGKILLs, restarts, exact replays and retries with new attempt ids, against
tansu and redis-server with the coordinator as a real process.

An upsert is resolved against the table on each attempt, so a crash must neither apply a
batch twice (its rows deleted and added again would still read the same, which is why the
accounting is by commit id and by rows) nor lose one; a replay of an upsert whose files are
in the table must be acknowledged, not dead-lettered, although its key files are in no
snapshot. At the end the table's rows are the last-write-wins fold of the batches in the
order they were requested, every commit id is in exactly one snapshot and every
announcement names it, and the consumer group's offsets are at the end of every partition.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import uuid
from collections import Counter
from pathlib import Path

import pytest
from test_coordinator import Stack, redis_uri
from test_exactly_once import (
    Crash,
    Outputs,
    end_offsets,
    group_offsets,
    harness,
    holders,
    originals,
)
from test_exactly_once_operations import CoordinatorAlive
from test_upsert_service import CdcWriter
from upsert_fixtures import KEYED_SCHEMA, Change, apply_fold, fold_batch, keyed_table, table_rows

from icefloe.catalog import Catalog
from icefloe.coordinator.commit_hooks import COMMIT_STAGES
from icefloe.events import CommitOperation, CommitRequested, FilesWritten, encode_event, event_key

pytestmark = pytest.mark.integration

TABLES = {"db.upsert_v2": 2, "db.upsert_v3": 3}
GROUPS_PER_TABLE = 8


def changes_for(rng: random.Random, order: list[int], label: str) -> list[Change]:
    out: list[Change] = []
    for _ in range(rng.randint(1, 6)):
        order[0] += 1
        out.append((rng.randrange(10), rng.choice("cudr"), order[0], f"{label}.{order[0]}"))
    out += rng.sample(out, k=min(len(out), rng.randint(0, 2)))
    rng.shuffle(out)
    return out


async def assert_exact(
    catalog: Catalog,
    outputs: Outputs,
    table: str,
    order: list[str],
    batches: dict[str, list[Change]],
) -> None:
    expected: dict[int, tuple[str, int]] = {}
    for commit_id in order:
        apply_fold(expected, fold_batch(batches[commit_id]))
    loaded = await catalog.load_table(table)
    assert await table_rows(loaded) == expected, table
    for commit_id in order:
        held = await holders(catalog, table, commit_id)
        assert len(held) == 1, f"{commit_id} is in snapshots {held}"
        assert {e.snapshot_id for e in outputs.acks(commit_id)} == set(held), commit_id


@pytest.mark.parametrize("stage", COMMIT_STAGES)
async def test_an_upsert_batch_crashed_at_each_stage_is_applied_once(
    stage: str, kafka_broker: str, redis_server: str, tmp_path: Path
) -> None:
    warehouse = tmp_path / "warehouse"
    stack = Stack(kafka_broker, redis_uri(redis_server, warehouse), warehouse)
    table = "db.crash"
    async with harness(
        stack, tmp_path, [table], table_options=keyed_table(3), batch_max_wait_ms=300
    ) as (
        coordinator,
        outputs,
        writers,
        catalog,
    ):
        cdc = CdcWriter(writers.producer, stack.events, writers.tables[table], "w")
        batches = {
            "b0": [(1, "c", 1, "a"), (2, "c", 2, "b"), (3, "c", 3, "c")],
            "b1": [(1, "u", 4, "A"), (2, "d", 5, ""), (1, "u", 4, "A")],
            "b2": [(2, "c", 6, "again"), (3, "d", 7, "")],
        }
        coordinator.start(Crash(stage))
        sent = {
            commit_id: await cdc.publish(commit_id, changes)
            for commit_id, changes in batches.items()
        }
        assert await coordinator.exited() == 137, coordinator.log_path.read_text()[-2000:]
        coordinator.start()
        for commit_id in batches:
            await outputs.wait_acks(commit_id, 1, coordinator.alive)
        # a retry of the last batch with a new attempt and new files: acknowledged only
        await cdc.publish("b2", batches["b2"], attempt="a1")
        await outputs.wait_acks("b2", 2, coordinator.alive)
        # an exact replay of the first batch: acknowledged, although its key file is in no
        # snapshot (and was deleted once committed)
        for value in sent["b0"]:
            await writers.send(table, value)
        await writers.producer.flush()
        await outputs.wait_acks("b0", 2, coordinator.alive)
        await assert_exact(catalog, outputs, table, list(batches), batches)
        assert await table_rows(await catalog.load_table(table)) == {1: ("A", 4), 2: ("again", 6)}
        # The first attempts' files-written events, re-read after the crash, are replays
        # (acknowledged); only the retry's files-written is dead-lettered, as for appends.
        kinds = Counter(d.reason.split(":", 1)[0] for d in outputs.dead)
        assert kinds == Counter({"late-files": 1}), [d.reason for d in outputs.dead]
        assert await coordinator.stop() == 0
        committed, ends = await group_offsets(stack), await end_offsets(stack)
        assert {p: committed[p] or 0 for p in ends} == ends


async def send_group(
    cdc: CdcWriter,
    outputs: Outputs,
    alive: CoordinatorAlive,
    group: dict[str, list[Change]],
    rng: random.Random,
) -> str | None:
    """Publish a few batches back to back (they may share a snapshot), wait for their
    announcements, then maybe replay one exactly or retry it with a new attempt (the commit
    id retried, whose new files-written is dead-lettered as late)."""
    values: dict[str, list[bytes]] = {}
    for commit_id, changes in group.items():
        data, keys = cdc.files(changes, rng.randint(1, 2))
        md = cdc.table.metadata
        name = str(cdc.table.identifier)
        event = FilesWritten.from_data_files(
            name, commit_id, cdc.name, f"{commit_id}/a0", md.schema(), md.spec(), data, [keys]
        )
        request = CommitRequested(
            table=name,
            commit_id=commit_id,
            operation=CommitOperation.UPSERT,
            attempt_ids=(f"{commit_id}/a0",),
        )
        values[commit_id] = [encode_event(event), encode_event(request)]
        for value in values[commit_id]:
            await cdc.producer.send(cdc.topic, value, key=event_key(name))
    await cdc.producer.flush()
    for commit_id in group:
        await outputs.wait_acks(commit_id, 1, alive)
    roll = rng.random()
    commit_id = rng.choice(sorted(group))
    if roll < 0.3:  # an exact replay
        for value in values[commit_id]:
            await cdc.producer.send(cdc.topic, value, key=event_key(str(cdc.table.identifier)))
        await cdc.producer.flush()
        await outputs.wait_acks(commit_id, 2, alive)
    elif roll < 0.55:  # a retry: new attempt id, new files, same changes
        await cdc.publish(commit_id, group[commit_id], attempt=f"a{uuid.uuid4().hex[:6]}")
        await outputs.wait_acks(commit_id, 2, alive)
        return commit_id
    return None


async def test_upserts_stay_exactly_once_through_random_kills_and_crash_points(
    kafka_broker: str, redis_server: str, tmp_path: Path
) -> None:
    warehouse = tmp_path / "warehouse"
    stack = Stack(kafka_broker, redis_uri(redis_server, warehouse), warehouse)
    rng = random.Random(19)
    created: dict[str, list[str]] = {t: [] for t in TABLES}
    batches: dict[str, list[Change]] = {}
    retried: set[str] = set()
    async with harness(
        stack,
        tmp_path,
        ["db.upsert_v2"],
        table_options=keyed_table(2),
        batch_max_wait_ms=60,
        session_timeout_ms=1500,
    ) as (coordinator, outputs, writers, catalog):
        v3 = await catalog.create_table("db.upsert_v3", KEYED_SCHEMA, format_version=3)
        writers.tables["db.upsert_v3"] = v3
        alive = CoordinatorAlive()

        async def write(table: str, seed: int) -> None:
            r = random.Random(seed)
            cdc = CdcWriter(writers.producer, stack.events, writers.tables[table], table)
            order = [0]
            for g in range(GROUPS_PER_TABLE):
                group = {}
                for b in range(r.randint(1, 3)):
                    commit_id = f"{table}-{g}-{b}"
                    group[commit_id] = batches[commit_id] = changes_for(r, order, commit_id)
                    created[table].append(commit_id)
                if (retry := await send_group(cdc, outputs, alive, group, r)) is not None:
                    retried.add(retry)

        writing = asyncio.gather(*(write(t, rng.randrange(1 << 30)) for t in TABLES))
        rounds = crashes = 0
        while not writing.done():
            crash = (
                Crash(rng.choice(COMMIT_STAGES), rng.randint(0, 2)) if rng.random() < 0.6 else None
            )
            if rounds == 0:  # at least one death between the swap and the announcement
                crash = Crash("after-swap")
            coordinator.start(crash)
            with contextlib.suppress(BaseException):  # it may reach its crash point first
                await coordinator.wait_ready()
            await asyncio.wait({writing}, timeout=rng.uniform(1.0, 3.0))
            assert coordinator.process is not None
            if coordinator.process.poll() is not None:
                assert await coordinator.exited() == 137, coordinator.log_path.read_text()[-2000:]
                crashes += 1
            elif not writing.done():
                await coordinator.stop("kill")
            rounds += 1
        await writing
        if coordinator.process is None:
            coordinator.start()
        await coordinator.wait_ready()
        assert await coordinator.stop() == 0

        for table, order in created.items():
            await assert_exact(catalog, outputs, table, order, batches)
        kinds = Counter(d.reason.split(":", 1)[0] for d in outputs.dead)
        assert set(kinds) <= {"late-files"}, [d.reason for d in outputs.dead][:5]
        # only retries' files-written are dead letters: exact replays are acknowledged
        for commit_id in batches:
            if commit_id not in retried:
                assert originals(outputs, commit_id) == [], commit_id
        committed, ends = await group_offsets(stack), await end_offsets(stack)
        assert {p: committed[p] or 0 for p in ends} == ends
        assert rounds >= 2 and crashes >= 1
