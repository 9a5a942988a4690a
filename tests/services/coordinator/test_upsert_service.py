"""Upserts end to end: CDC writers publish change batches to Kafka (tansu), the coordinator
commits them on a Redis catalog, and the table equals the last-write-wins fold of the
batches in the order of their commit-requested events on the partition.

Several writers upsert into one table at once (no conflict failures, nothing refused), one
batch is retried with a new attempt id (acknowledged, applied once), key files are deleted
once committed and never referenced by the table, and PyIceberg reads the same rows as
icefloe from the v2 (position deletes) and the v3 (deletion vectors) table.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from test_coordinator import (
    Stack,
    create_tables,
    producer_for,
    read_until,
    redis_uri,
    running,
    wait_until,
)
from upsert_fixtures import (
    Change,
    apply_fold,
    data_files_for,
    fold_batch,
    key_file_for,
    keyed_table,
    live_delete_files,
    table_rows,
)

from icefloe.catalog.uri import load_catalog
from icefloe.coordinator.service import Coordinator
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
from icefloe.spec.datafile import DataFile, DataFileContent
from icefloe.table.catalog import Table
from icefloe.table.commit_index import summary_commit_ids

pytestmark = pytest.mark.integration

WRITERS = 3
BATCHES_PER_WRITER = 6


class CdcWriter:
    """Publishes each change batch as a files-written (data and key files) and an upsert
    commit-requested, as the Spark CDC writer does."""

    def __init__(self, producer: Any, topic: str, table: Table, name: str) -> None:
        self.producer = producer
        self.topic = topic
        self.table = table
        self.name = name
        self.key_files: dict[str, list[str]] = {}

    def files(self, changes: list[Change], pieces: int = 1) -> tuple[list[DataFile], DataFile]:
        folded = fold_batch(changes)
        return data_files_for(self.table, folded, pieces), key_file_for(self.table, sorted(folded))

    async def publish(
        self, commit_id: str, changes: list[Change], attempt: str = "a0", pieces: int = 1
    ) -> list[bytes]:
        """Publish one attempt of a batch; the values sent (to replay them exactly)."""
        data, keys = self.files(changes, pieces)
        md = self.table.metadata
        table = str(self.table.identifier)
        event = FilesWritten.from_data_files(
            table,
            commit_id,
            self.name,
            f"{commit_id}/{attempt}",
            md.schema(),
            md.spec(),
            data,
            [keys],
        )
        request = CommitRequested(
            table=table,
            commit_id=commit_id,
            operation=CommitOperation.UPSERT,
            attempt_ids=(f"{commit_id}/{attempt}",),
        )
        self.key_files.setdefault(commit_id, []).append(keys.file_path)
        values = [encode_event(event), encode_event(request)]
        for value in values:
            await self.producer.send(self.topic, value, key=event_key(table))
        await self.producer.flush()
        return values


async def requested_order(stack: Stack, table: str) -> list[str]:
    """Commit ids of the table's upsert commit-requested events, first occurrence, in the
    order the partition holds them."""
    consumer = AIOKafkaConsumer(
        stack.events, bootstrap_servers=stack.brokers, group_id=None, auto_offset_reset="earliest"
    )
    await consumer.start()
    order: list[str] = []
    try:
        idle = 0
        while idle < 5:
            batch = await consumer.getmany(timeout_ms=300)
            if not batch:
                idle += 1
                continue
            idle = 0
            for records in batch.values():
                for record in records:
                    event = parse_event(record.value or b"")
                    if (
                        isinstance(event, CommitRequested)
                        and event.table == table
                        and event.commit_id not in order
                    ):
                        order.append(event.commit_id)
    finally:
        await consumer.stop()
    return order


def pyiceberg_rows(metadata_location: str) -> dict[int, tuple[str, int]]:
    from pyiceberg.table import StaticTable

    arrow = StaticTable.from_metadata(metadata_location).scan().to_arrow()
    rows = arrow.to_pylist()
    out = {r["id"]: (r["value"], r["ord"]) for r in rows}
    assert len(out) == len(rows), "PyIceberg sees a key twice"
    return out


@pytest.mark.parametrize("version", [2, 3])
async def test_several_cdc_writers_upsert_one_table_in_kafka_order(
    version: int, kafka_broker: str, redis_server: str, tmp_path: Path
) -> None:
    warehouse = tmp_path / "warehouse"
    stack = Stack(kafka_broker, redis_uri(redis_server, warehouse), warehouse)
    name = "db.cdc"
    tables = await create_tables(stack.catalog_uri, [name], **keyed_table(version))
    catalog = load_catalog(stack.catalog_uri)
    producer = await producer_for(stack)
    coordinator = Coordinator(stack.config(batch_max_wait_ms=150))
    rng = random.Random(version)
    batches: dict[str, list[Change]] = {}
    order_counter = iter(range(1, 1_000_000))
    try:
        async with running(coordinator) as task:
            writers = [
                CdcWriter(producer, stack.events, tables[name], f"w{i}") for i in range(WRITERS)
            ]

            async def write(w: CdcWriter, seed: int) -> None:
                r = random.Random(seed)
                for b in range(BATCHES_PER_WRITER):
                    changes = [
                        (r.randrange(16), r.choice("cudr"), next(order_counter), f"{w.name}.{b}")
                        for _ in range(r.randint(1, 8))
                    ]
                    changes += r.sample(changes, k=min(len(changes), r.randint(0, 2)))
                    r.shuffle(changes)
                    commit_id = f"{w.name}-{b}"
                    batches[commit_id] = changes
                    await w.publish(commit_id, changes, pieces=r.randint(1, 2))
                    await asyncio.sleep(r.uniform(0, 0.1))

            await asyncio.gather(*(write(w, rng.randrange(1 << 30)) for w in writers))

            def done(events: list[Any]) -> bool:
                acked = {c for e in events if isinstance(e, TableCommitted) for c in e.commit_ids}
                return set(batches) <= acked

            results = await read_until(stack, stack.results, done, what="every batch announced")
            # A retry of one batch, with a new attempt id and new files: applied once.
            retried = "w0-2"
            await writers[0].publish(retried, batches[retried], attempt="a1")

            def acked_twice(events: list[Any]) -> bool:
                acks = [e for e in events if isinstance(e, TableCommitted)]
                return sum(retried in e.commit_ids for e in acks) >= 2

            results = await read_until(stack, stack.results, acked_twice, what="retry acked")
            acks = [e for e in results if isinstance(e, TableCommitted)]
            assert len({e.snapshot_id for e in acks if retried in e.commit_ids}) == 1

            order = await requested_order(stack, name)
            assert sorted(order) == sorted(batches)
            expected: dict[int, tuple[str, int]] = {}
            for commit_id in order:
                apply_fold(expected, fold_batch(batches[commit_id]))
            table = await catalog.load_table(name)
            assert await table_rows(table) == expected
            holders = [c for s in table.metadata.snapshots for c in summary_commit_ids(s)]
            assert sorted(holders) == sorted(batches), "a commit id applied twice or never"
            deletes = await live_delete_files(table)
            assert not [d for d in deletes if d.content == DataFileContent.EQUALITY_DELETES]
            assert pyiceberg_rows(table.metadata_location) == expected

            async def key_files_gone() -> bool:
                first = [paths[0] for w in writers for paths in w.key_files.values()]
                return not any(Path(p.removeprefix("file://")).exists() for p in first)

            await wait_until(key_files_gone, "committed key files deleted")
            dead = await read_until(
                stack, stack.dead_letters, lambda es: len(es) >= 1, what="the retry's dead letter"
            )
            kinds = {d.reason.split(":", 1)[0] for d in dead if isinstance(d, DeadLetter)}
            assert kinds == {
                "late-files"
            }  # the retry's files-written: its files are in no snapshot
            assert not task.done()
    finally:
        await producer.stop()
        await catalog.close()
