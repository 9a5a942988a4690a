"""Exactly once whatever happens to the table's history and the topic's: the regressions of
issue #20, against real servers (tansu, redis-server, Java Iceberg 1.10.2 on Spark 3.5), with
the coordinator as a real process.

1. Another engine expires a snapshot inside the dedup window, then the job is retried: the
   retry is acknowledged (naming the expired snapshot, from the dedup ledger the table
   carries), never applied again. Here the library removes the snapshot directly on the
   Redis catalog, and Java's ``expire_snapshots`` procedure removes it on a HadoopCatalog
   table; neither asks icefloe. (icefloe's REST catalog refuses: see
   ``tests/services/planner/test_rest_catalog_pyiceberg.py``.)
2. A re-created events topic that grows past the old recorded position on one partition
   and stays below it on another: every new commit is committed, with one error line per
   partition and the topic_recreated metric.
3. A writer waiting on a commit whose snapshot was since expired gets an answer:
   ``table-committed`` with ``snapshot-expired``, also after other commits.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest
from aiokafka.partitioner import DefaultPartitioner
from test_coordinator import PARTITIONS, Stack, redis_uri, table_state
from test_exactly_once import (
    Outputs,
    harness,
    holders,
    originals,
    recreate_events_topic,
    resend,
    send_job,
)

from icefloe.events import TableCommitted, event_key
from icefloe.spec.metadata_builder import MetadataBuilder
from icefloe.table.catalog import Catalog, TableChange, TableIdentifier
from icefloe.table.commit_index import CommitIndex

pytestmark = pytest.mark.integration


async def expire_behind_icefloes_back(catalog: Catalog, name: str, snapshot_id: int) -> None:
    """What an engine that never asks icefloe does: drop the snapshot from the metadata
    (table properties, the dedup ledger among them, carried as every engine carries them)."""
    table = await catalog.load_table(name)
    new = (
        MetadataBuilder(table.metadata)
        .remove_snapshots([snapshot_id])
        .build(table.metadata_location)
    )
    await catalog.commit_tables([TableChange(TableIdentifier.parse(name), table, new)])
    assert (await catalog.load_table(name)).metadata.snapshot_by_id(snapshot_id) is None


def expired_ack(outputs: Outputs, commit_id: str, snapshot_id: int) -> TableCommitted:
    ack = outputs.acks(commit_id)[-1]
    assert ack.snapshot_id == snapshot_id and ack.snapshot_expired is True
    return ack


async def writer_finds(catalog: Catalog, name: str, commit_id: str) -> int | None:
    """The Spark writer's look-up after a timeout (``writer._committed_in``)."""
    index = CommitIndex()
    index.update((await catalog.load_table(name)).metadata)
    return index.get(commit_id)


# -- 1 and 3: expired by the library on Redis, then retried and replayed --------------------


async def test_expired_by_another_engine_then_retried_and_replayed_never_applies_twice(
    stack: Stack, tmp_path: Path
) -> None:
    name = "db.expired"
    async with harness(stack, tmp_path, [name]) as (coordinator, outputs, writers, catalog):
        coordinator.start()
        x_values, x_files = await send_job(writers, name, "job-x", "attempt-1", n_files=2)
        await outputs.wait_acks("job-x", 1, coordinator.alive)
        _, y_files = await send_job(writers, name, "job-y", "attempt-1")
        await outputs.wait_acks("job-y", 1, coordinator.alive)
        x = outputs.acks("job-x")[0].snapshot_id
        assert await coordinator.stop() == 0

        await expire_behind_icefloes_back(catalog, name, x)
        assert await holders(catalog, name, "job-x") == []
        assert await writer_finds(catalog, name, "job-x") == x  # never retried by a writer

        coordinator.start()
        # The job retried with a new attempt id: acknowledged, its files in no snapshot.
        _, retry_files = await send_job(writers, name, "job-x", "attempt-2")
        await outputs.wait_acks("job-x", 2, coordinator.alive)
        ack = expired_ack(outputs, "job-x", x)
        assert ack.sequence_number == 0 and ack.metadata_location
        # Something else is committed, then the original request is replayed: answered.
        _, z_files = await send_job(writers, name, "job-z", "attempt-1")
        await outputs.wait_acks("job-z", 1, coordinator.alive)
        await resend(writers, name, x_values)
        await outputs.wait_acks("job-x", 3, coordinator.alive)
        expired_ack(outputs, "job-x", x)
        assert await coordinator.stop() == 0

        live = (await table_state(catalog, name)).live
        assert Counter(live) == Counter(x_files + y_files + z_files)
        assert not set(retry_files) & set(live)
        assert await holders(catalog, name, "job-x") == []
        # Only the retry's files-written is refused, as late (its files are in no snapshot).
        assert [kind for kind, _ in originals(outputs, "job-x")] == ["late-files"]


@pytest.fixture
def stack(kafka_broker: str, redis_server: str, tmp_path: Path) -> Stack:
    warehouse = tmp_path / "warehouse"
    return Stack(kafka_broker, redis_uri(redis_server, warehouse), warehouse)


# -- 1: Java's expire_snapshots procedure, on a catalog icefloe never hears of ---------------


@pytest.mark.interop
async def test_java_expire_snapshots_then_a_retry_is_acknowledged_not_applied(
    kafka_broker: str, java_iceberg: object, tmp_path: Path
) -> None:
    from java_iceberg import JavaIceberg

    assert isinstance(java_iceberg, JavaIceberg)
    warehouse = tmp_path / "warehouse"
    warehouse.mkdir()
    fs_stack = Stack(kafka_broker, f"file://{warehouse}", warehouse)
    name = "db.java_expired"
    async with harness(fs_stack, tmp_path, [name]) as (coordinator, outputs, writers, catalog):
        coordinator.start()
        _, x_files = await send_job(writers, name, "job-x", "attempt-1")
        await outputs.wait_acks("job-x", 1, coordinator.alive)
        _, y_files = await send_job(writers, name, "job-y", "attempt-1")
        await outputs.wait_acks("job-y", 1, coordinator.alive)
        x = outputs.acks("job-x")[0].snapshot_id
        assert await coordinator.stop() == 0

        await asyncio.to_thread(
            java_iceberg.sql,
            warehouse,
            f"CALL {{cat}}.system.expire_snapshots(table => '{name}', snapshot_ids => array({x}))",
        )
        assert (await catalog.load_table(name)).metadata.snapshot_by_id(x) is None

        coordinator.start()
        _, retry_files = await send_job(writers, name, "job-x", "attempt-2")
        await outputs.wait_acks("job-x", 2, coordinator.alive)
        expired_ack(outputs, "job-x", x)
        assert await coordinator.stop() == 0
        live = (await table_state(catalog, name)).live
        assert Counter(live) == Counter(x_files + y_files)
        assert not set(retry_files) & set(live)


# -- 2: a re-created topic, growing past the old position on one partition ------------------


def tables_on_two_partitions() -> tuple[str, str]:
    partitioner = DefaultPartitioner()
    seen: dict[int, str] = {}
    for i in range(100):
        name = f"db.incarnation_{i}"
        p = partitioner(event_key(name), list(range(PARTITIONS)), list(range(PARTITIONS)))
        seen.setdefault(p, name)
        if len(seen) == 2:
            return tuple(seen.values())  # type: ignore[return-value]
    raise AssertionError("no two tables on different partitions")


async def test_recreated_topic_growing_past_the_old_position_loses_nothing(
    stack: Stack, tmp_path: Path
) -> None:
    grows, stays_below = tables_on_two_partitions()
    async with harness(stack, tmp_path, [grows, stays_below]) as (
        coordinator,
        outputs,
        writers,
        catalog,
    ):
        coordinator.start()
        await send_job(writers, grows, "old-g", "a")  # this partition's position: 2
        for i in range(4):  # this one's: 8
            await send_job(writers, stays_below, f"old-b{i}", "a")
        await outputs.wait_acks("old-g", 1, coordinator.alive)
        await outputs.wait_acks("old-b3", 1, coordinator.alive)
        assert await coordinator.stop() == 0

        await recreate_events_topic(stack, writers)
        new_files: list[str] = []
        for i in range(3):  # offsets 0-5, past the old position 2 before the coordinator looks
            new_files += (await send_job(writers, grows, f"new-g{i}", "a"))[1]
        new_files += (await send_job(writers, stays_below, "new-b0", "a"))[1]  # offsets 0-1 < 8

        coordinator.start()
        for commit_id in ("new-g0", "new-g1", "new-g2", "new-b0"):
            await outputs.wait_acks(commit_id, 1, coordinator.alive)
        live = set((await table_state(catalog, grows)).live)
        live |= set((await table_state(catalog, stays_below)).live)
        assert set(new_files) <= live
        log_text = coordinator.log_path.read_text()
        assert log_text.count("the events topic was re-created or truncated") == 2
        assert "recorded for topic id" in log_text
        metrics = await coordinator.get("/metrics") or ""
        recreated = [
            line
            for line in metrics.splitlines()
            if line.startswith("icefloe_coordinator_topic_recreated_total{")
        ]
        assert len(recreated) == 2 and all(line.endswith(" 1.0") for line in recreated)
        assert await coordinator.stop() == 0
