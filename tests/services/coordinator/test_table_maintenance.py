"""Maintenance the coordinator runs by itself, on real servers (tansu, redis).

A stream of small commits goes through a running coordinator whose maintenance visits the
table every few hundred milliseconds. Its policy (table properties) keeps few snapshots and
few manifests; an orphan left by a "failed attempt" long ago is removed, while the files of
commits still in flight are not. Throughout, every file the stream sent is live exactly once
and every file the metadata references exists.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from coordinating import coordinator_config, raise_if_stopped, running_coordinator

from icefloe.catalog.uri import load_catalog
from icefloe.coordinator.config import CoordinatorConfig
from icefloe.coordinator.maintenance import CANDIDATES_EVENT_TYPE
from icefloe.coordinator.service import Coordinator
from icefloe.events import FilesWritten, encode_event, event_key
from icefloe.manifests.reader import ManifestReader
from icefloe.spec.datafile import DataFile
from icefloe.spec.partition import PartitionSpecBuilder
from icefloe.spec.schema import Schema
from icefloe.spec.types import LongType, NestedField, StringType
from icefloe.table.catalog import Catalog, Table
from icefloe.table.commit_index import DEDUP_WINDOW_MS
from icefloe.table.health import table_health
from icefloe.table.maintenance import reachable_files

pytestmark = pytest.mark.integration

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "cat", StringType()),
)
COMMITS = 40
MAX_SNAPSHOTS = 5
POLL_S = 0.2
POLLS = 600  # two minutes at most, on a busy machine


async def _eventually(check: Any, what: str, coordinator_task: asyncio.Task[None]) -> None:
    for _ in range(POLLS):
        raise_if_stopped(coordinator_task)
        if await check():
            return
        await asyncio.sleep(POLL_S)
    pytest.fail(f"gave up waiting for {what}")


async def _live(table: Table) -> list[str]:
    snapshot = table.metadata.current_snapshot()
    if snapshot is None:
        return []
    reader = ManifestReader(table.io)
    out: list[str] = []
    for manifest in await reader.manifests(snapshot):
        for e in await reader.entries(manifest, table.metadata.specs(), live_only=True):
            out.append(e.data_file.file_path)
    return out


async def test_the_coordinator_keeps_a_streaming_table_healthy(
    kafka_broker: str, redis_server: str, tmp_path: Path
) -> None:
    prefix = f"m{uuid.uuid4().hex[:8]}"
    uri = f"{redis_server}?warehouse=file://{tmp_path}/wh&prefix={prefix}"
    catalog = load_catalog(uri)
    await catalog.create_namespace("db")
    table = await catalog.create_table(
        "db.t",
        SCHEMA,
        PartitionSpecBuilder(SCHEMA).add_field("cat", "identity").build(),
        properties={
            "icefloe.maintenance.max-snapshots": str(MAX_SNAPSHOTS),
            # Expiry keeps every snapshot with commit ids inside the exactly-once dedup
            # window (7 days by default); this table opts out so history can stay short.
            "icefloe.dedup.window-ms": "0",
            "icefloe.maintenance.rewrite-manifests.min-count": "4",
            "icefloe.maintenance.orphan-older-than-ms": "3600000",
            "icefloe.compaction.min-input-files": "2",
        },
    )
    location = table.metadata.location.removeprefix("file://")
    # left behind by a writer that died two hours ago
    orphan = Path(location) / "data" / "cat=a" / "failed-attempt.parquet"
    orphan.parent.mkdir(parents=True, exist_ok=True)
    orphan.write_bytes(b"x" * 40)
    two_hours_ago = time.time() - 7200
    os.utime(orphan, (two_hours_ago, two_hours_ago))

    config = coordinator_config(
        kafka_broker,
        uri,
        prefix,
        topic_partitions=2,
        batch_max_files=1,  # one snapshot per commit: the worst case for a table's history
        batch_max_wait_ms=0,
        maintenance_interval_ms=300,
        maintenance_min_retain_ms=0,
    )
    async with running_coordinator(config) as (coordinator, task):
        await _stream_and_check(config, coordinator, task, catalog, table, orphan)


async def _stream_and_check(
    config: CoordinatorConfig,
    coordinator: Coordinator,
    task: asyncio.Task[None],
    catalog: Catalog,
    table: Table,
    orphan: Path,
) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=config.brokers, acks="all", linger_ms=5)
    await producer.start()
    candidates = AIOKafkaConsumer(
        bootstrap_servers=config.brokers, group_id=None, auto_offset_reset="earliest"
    )
    await candidates.start()
    sent: Counter[str] = Counter()
    try:
        md = table.metadata
        for n in range(COMMITS):
            path = f"{table.metadata.location}/data/cat=a/stream-{n:04d}.parquet"
            Path(path.removeprefix("file://")).write_bytes(b"y" * (20 + n))
            data_file = DataFile(path, "parquet", ("a",), 3, 20 + n)
            event = FilesWritten.from_data_files(
                "db.t",
                f"stream:{n}",
                "test",
                f"stream:{n}/a",
                md.schema(),
                md.spec(),
                [data_file],
                complete=True,
            )
            await producer.send_and_wait(
                config.events_topic, encode_event(event), event_key("db.t")
            )
            sent[path] += 1
            await asyncio.sleep(0.05)  # a stream, not a burst: maintenance runs in between

        # Maintenance keeps committing (a manifest rewrite is a snapshot that the next pass
        # expires), so the bounds hold between passes, not at every instant: every check
        # below is made on one load of the table, the first that meets them all.
        checked: list[Table] = []

        async def settled() -> bool:
            current = await catalog.load_table("db.t")
            live = Counter(await _live(current))
            assert live - sent == Counter(), "a file is live that was never sent, or twice"
            reachable = [
                p for p in await reachable_files(current) if not p.endswith("version-hint.text")
            ]
            if not (
                live == sent
                and len(current.metadata.snapshots) <= MAX_SNAPSHOTS
                and not orphan.exists()
                # manifests are rewritten on maintenance's schedule, not at each commit
                and (await table_health(current)).manifests < 4 + MAX_SNAPSHOTS
                # nothing still referenced was deleted (expiry may delete what a newer
                # metadata no longer references between this load and the check)
                and all(Path(p.removeprefix("file://")).exists() for p in reachable)
            ):
                return False
            checked.append(current)
            return True

        await _eventually(
            settled, "every commit, bounded history and manifests, the orphan gone", task
        )

        current = checked[-1]
        assert Counter(await _live(current)) == sent  # nothing lost, nothing doubled
        health = await table_health(current)
        assert health.snapshots <= MAX_SNAPSHOTS
        assert health.manifests < 4 + MAX_SNAPSHOTS  # rewritten as they pile up

        # the health figures are on /metrics, and candidates were announced
        async def metrics_show_the_table() -> bool:
            async with (
                aiohttp.ClientSession() as session,
                session.get(coordinator.http.url + "/metrics") as response,
            ):
                text = await response.text()
            return f'icefloe_table_data_files{{table="db.t"}} {COMMITS}.0' in text

        await _eventually(metrics_show_the_table, "the table's gauges", task)
        async with (
            aiohttp.ClientSession() as session,
            session.get(coordinator.http.url + "/metrics") as response,
        ):
            text = await response.text()
        for series in (
            'icefloe_table_snapshots{table="db.t"}',
            'icefloe_table_small_file_ratio{table="db.t"} 1.0',
            'icefloe_table_metadata_file_bytes{table="db.t"}',
            'icefloe_table_deleted_rows{table="db.t"} 0.0',  # appends only: nothing deleted
            'icefloe_table_deleted_row_ratio{table="db.t"} 0.0',
            'icefloe_table_deletion_vector_bytes{table="db.t"} 0.0',
            'icefloe_table_compaction_candidate_files{table="db.t"}',
            'icefloe_maintenance_actions_total{action="expire-snapshots"}',
            "icefloe_maintenance_removed_orphans_total 1.0",
        ):
            assert series in text, series
        await candidates.topics()
        partitions = candidates.partitions_for_topic(config.maintenance_topic) or {0}
        candidates.assign([TopicPartition(config.maintenance_topic, p) for p in partitions])
        messages: list[dict[str, Any]] = []
        for _ in range(20):
            batch = await candidates.getmany(timeout_ms=500)
            messages.extend(json.loads(r.value) for rs in batch.values() for r in rs)
            if messages:
                break
        assert messages, f"no compaction candidates on {config.maintenance_topic}"
        assert messages[0]["type"] == CANDIDATES_EVENT_TYPE
        assert messages[0]["table"] == "db.t" and messages[0]["files"] >= 2
    finally:
        await candidates.stop()
        await producer.stop()
        await catalog.close()


def _assigned(coordinator: Coordinator) -> set[int]:
    """The events topic's partitions assigned to ``coordinator``, as its runner sees them."""
    assigned = coordinator.maintenance.assigned
    assert assigned is not None
    return set(assigned())


async def test_quiet_tables_are_maintained_by_the_owner_of_their_partition(
    kafka_broker: str, redis_server: str, tmp_path: Path
) -> None:
    """Tables created and written before the coordinators start, with no event since, are
    maintained all the same: each by the replica that owns the partition their events would
    go to (and only by it, once the group has split the partitions). The first commit the
    coordinator makes to a table writes its dedup window into it."""
    from icefloe.coordinator.maintenance import partition_of
    from icefloe.table.snapshot_producer import fast_append

    prefix = f"q{uuid.uuid4().hex[:8]}"
    uri = f"{redis_server}?warehouse=file://{tmp_path}/wh&prefix={prefix}"
    catalog = load_catalog(uri)
    await catalog.create_namespace("db")
    # two tables whose events would go to different partitions of a two-partition topic
    names: dict[int, str] = {}
    for i in range(100):
        names.setdefault(partition_of(f"db.quiet_{i}", 2), f"db.quiet_{i}")
        if len(names) == 2:
            break
    spec = PartitionSpecBuilder(SCHEMA).add_field("cat", "identity").build()
    for name in names.values():
        table = await catalog.create_table(
            name,
            SCHEMA,
            spec,
            properties={
                "icefloe.maintenance.max-snapshots": "2",
                "icefloe.maintenance.orphan-older-than-ms": "3600000",
            },
        )
        for n in range(5):
            path = f"{table.metadata.location}/data/cat=a/old-{n}.parquet"
            Path(path.removeprefix("file://")).parent.mkdir(parents=True, exist_ok=True)
            Path(path.removeprefix("file://")).write_bytes(b"z" * 30)
            table = await fast_append(table, [DataFile(path, "parquet", ("a",), 3, 30)]).commit()
    window_ms = 2 * 86_400_000
    config = coordinator_config(
        kafka_broker,
        uri,
        prefix,
        topic_partitions=2,
        batch_max_wait_ms=0,
        maintenance_interval_ms=300,
        maintenance_min_retain_ms=0,
        dedup_window_ms=window_ms,
    )

    async def maintained(name: str) -> bool:
        return len((await catalog.load_table(name)).metadata.snapshots) <= 2

    try:
        async with running_coordinator(config) as (first, first_task):
            # alone, the first replica owns both partitions, so both tables
            for name in names.values():
                await _eventually(lambda n=name: maintained(n), f"{name} maintained", first_task)
            async with running_coordinator(config) as (second, second_task):

                async def split() -> bool:
                    a, b = _assigned(first), _assigned(second)
                    return len(a) == 1 and len(b) == 1 and a != b

                await _eventually(split, "the two replicas to split the partitions", second_task)
                for replica in (first, second):
                    [mine] = _assigned(replica)
                    # exactly the quiet table of its partition, no event needed
                    assert await replica.maintenance.owned_tables() == {names[mine]}
                # more history on both: each is expired again, by its owner alone
                for name in names.values():
                    table = await catalog.load_table(name)
                    for n in range(3):
                        path = f"{table.metadata.location}/data/cat=a/late-{n}.parquet"
                        Path(path.removeprefix("file://")).write_bytes(b"w" * 30)
                        table = await fast_append(
                            table, [DataFile(path, "parquet", ("a",), 3, 30)]
                        ).commit()
                for name in names.values():
                    await _eventually(
                        lambda n=name: maintained(n), f"{name} maintained again", second_task
                    )
                for replica in (first, second):
                    [mine] = _assigned(replica)
                    assert names[1 - mine] not in replica.maintenance.next_due

            # one event: the coordinator's first commit to the table writes its window there
            name = names[0]
            table = await catalog.load_table(name)
            assert DEDUP_WINDOW_MS not in table.metadata.properties
            path = f"{table.metadata.location}/data/cat=a/event.parquet"
            Path(path.removeprefix("file://")).write_bytes(b"e" * 30)
            event = FilesWritten.from_data_files(
                name,
                "quiet:1",
                "test",
                "quiet:1/a",
                table.metadata.schema(),
                table.metadata.spec(),
                [DataFile(path, "parquet", ("a",), 3, 30)],
                complete=True,
            )
            producer = AIOKafkaProducer(bootstrap_servers=config.brokers, acks="all")
            await producer.start()
            try:
                await producer.send_and_wait(
                    config.events_topic, encode_event(event), event_key(name)
                )
            finally:
                await producer.stop()

            async def window_written() -> bool:
                current = await catalog.load_table(name)
                return current.metadata.properties.get(DEDUP_WINDOW_MS) == str(window_ms)

            await _eventually(window_written, "the window written by the first commit", first_task)
    finally:
        await catalog.close()
