"""The coordinator compacts an upsert table between its commits while CDC writers keep
publishing (tansu Kafka, a Redis catalog): the table stays the fold of the batches in Kafka
order, every commit id is applied once, and PyIceberg reads the same rows.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest
from test_coordinator import Stack, create_tables, producer_for, read_until, redis_uri, running
from test_upsert_service import CdcWriter, pyiceberg_rows, requested_order
from upsert_fixtures import Change, apply_fold, fold_batch, keyed_table, table_rows

from icefloe.catalog.uri import load_catalog
from icefloe.coordinator.compactor import AUTO_MIN_NEW_FILES
from icefloe.coordinator.service import Coordinator
from icefloe.events import TableCommitted
from icefloe.table.commit_index import summary_commit_ids
from icefloe.table.rewrite import SUMMARY_REWRITE

pytestmark = pytest.mark.integration

WRITERS = 2
BATCHES_PER_WRITER = 8


@pytest.mark.parametrize("version", [2, 3])
async def test_upserts_continue_while_the_coordinator_compacts(
    version: int, kafka_broker: str, redis_server: str, tmp_path: Path
) -> None:
    warehouse = tmp_path / "warehouse"
    stack = Stack(kafka_broker, redis_uri(redis_server, warehouse), warehouse)
    name = "db.cdc_compacted"
    options: dict[str, Any] = keyed_table(version)
    tables = await create_tables(stack.catalog_uri, [name], **options, **{AUTO_MIN_NEW_FILES: "2"})
    catalog = load_catalog(stack.catalog_uri)
    producer = await producer_for(stack)
    coordinator = Coordinator(stack.config(batch_max_wait_ms=50))
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
                        (r.randrange(24), r.choice("cuud"), next(order_counter), f"{w.name}.{b}")
                        for _ in range(r.randint(2, 10))
                    ]
                    commit_id = f"{w.name}-{b}"
                    batches[commit_id] = changes
                    await w.publish(commit_id, changes)
                    await asyncio.sleep(r.uniform(0.05, 0.2))

            await asyncio.gather(*(write(w, 100 * version + i) for i, w in enumerate(writers)))

            def done(events: list[Any]) -> bool:
                acked = {c for e in events if isinstance(e, TableCommitted) for c in e.commit_ids}
                return set(batches) <= acked

            await read_until(stack, stack.results, done, what="every batch announced")
            order = await requested_order(stack, name)
            expected: dict[int, tuple[str, int]] = {}
            for commit_id in order:
                apply_fold(expected, fold_batch(batches[commit_id]))
            table = await catalog.load_table(name)
            assert await table_rows(table) == expected
            assert pyiceberg_rows(table.metadata_location) == expected
            holders = [c for s in table.metadata.snapshots for c in summary_commit_ids(s)]
            assert sorted(holders) == sorted(batches), "a commit id applied twice or never"
            rewrites = [
                s for s in table.metadata.snapshots if s.summary and SUMMARY_REWRITE in s.summary
            ]
            assert rewrites, "the coordinator never compacted"
            # Upserts were resolved on compacted files (the key index moved with the rows).
            first_rewrite = min(s.sequence_number for s in rewrites)
            assert any(
                summary_commit_ids(s) and s.sequence_number > first_rewrite
                for s in table.metadata.snapshots
            )
            assert not task.done()
    finally:
        await producer.stop()
        await catalog.close()
