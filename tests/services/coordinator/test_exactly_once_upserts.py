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

The soak runs two CDC writers per table on a v2 and a v3 table and a compactor beside them
(the core's compaction plan, rewrites requested through the same topic): a rewrite that
races an upsert deleting rows of its files is refused (``conflict``), one between the
writers' batches commits, and the key index must then find every key in the rewritten
files. PyIceberg and DuckDB read the final rows too.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import pyarrow as pa
import pytest
from test_coordinator import Stack, redis_uri, wait_until
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
from test_upsert_service import CdcWriter, requested_order
from upsert_fixtures import (
    KEYED_SCHEMA,
    Change,
    apply_fold,
    fold_batch,
    keyed_table,
    other_engines_rows,
    table_rows,
)

from icefloe.arrow.schema import schema_to_arrow
from icefloe.cli.scan import task_rows
from icefloe.coordinator.commit_hooks import COMMIT_STAGES
from icefloe.coordinator.compactor import AUTO_ENABLED
from icefloe.events import (
    CommitOperation,
    CommitRequested,
    FilesWritten,
    encode_event,
    event_key,
    parse_event,
)
from icefloe.manifests.cache import ManifestCache
from icefloe.parquet.files import write_data_file
from icefloe.scan.planning import plan_scan
from icefloe.spec.row_lineage import with_lineage_fields, without_lineage_metrics
from icefloe.spec.snapshot import Operation
from icefloe.table.catalog import Catalog
from icefloe.table.compaction import CompactionPolicy, plan_compaction

pytestmark = pytest.mark.integration

TABLES = {"db.upsert_v2": 2, "db.upsert_v3": 3}
# The table an engine compacts (the coordinator's own compaction turned off on it, as a user
# who compacts with Spark does); the other is compacted by the coordinator, as shipped.
ENGINE_COMPACTED = "db.upsert_v2"
WRITERS_PER_TABLE = 2
GROUPS_PER_WRITER = 4
KEYS = 10


def changes_for(rng: random.Random, order: list[int], label: str) -> list[Change]:
    out: list[Change] = []
    for _ in range(rng.randint(1, 6)):
        order[0] += 1
        out.append((rng.randrange(KEYS), rng.choice("cudr"), order[0], f"{label}.{order[0]}"))
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


class Compactor:
    """Compaction as an engine runs it beside the writers: plan on the table's head with the
    core's plan (:func:`~icefloe.table.compaction.plan_compaction`), read each planned file's live
    rows (deletes applied; v3 rows with their lineage, as the plan requires), write them as
    one file per group, and request a ``rewrite`` based on the planned snapshot through the
    same topic. An upsert that deletes rows of a planned file before the rewrite commits
    makes it fail validation (a ``conflict`` dead letter): nothing is lost, a user runs it
    again, as :func:`icefloe.spark.compact` says."""

    def __init__(self, cdc: CdcWriter, catalog: Catalog, outputs: Outputs) -> None:
        self.cdc = cdc
        self.catalog = catalog
        self.outputs = outputs
        self.committed: list[str] = []
        self.refused: list[str] = []

    async def run(
        self,
        commit_id: str,
        alive: Callable[[], None],
        race: Callable[[int | None], Awaitable[None]] | None = None,
    ) -> bool | None:
        """One compaction: True if committed, False if refused, None if nothing to do.
        ``race`` is awaited with the planned snapshot id before the rewrite is requested."""
        name = str(self.cdc.table.identifier)
        table = await self.catalog.load_table(name)
        md = table.metadata
        policy = CompactionPolicy.for_table(md, {"min_input_files": 2})
        plan = await plan_compaction(table, policy=policy)
        if not plan.groups:
            return None
        scan = await plan_scan(md, ManifestCache(table.io))
        tasks = {t.data_file.file_path: t for t in scan.tasks()}
        schema = with_lineage_fields(md.schema()) if plan.row_lineage else md.schema()
        files = []
        for group in plan.groups:
            rows = [
                row
                for path in sorted(group.paths)
                if path in tasks  # a file whose rows are all deleted is planned, not scanned
                for row in await task_rows(
                    table.io, scan, tasks[path], row_lineage=plan.row_lineage
                )
            ]
            if not rows:
                continue
            arrow = pa.Table.from_pylist(rows, schema=schema_to_arrow(schema))
            path = f"{md.location}/data/{commit_id}-{uuid.uuid4().hex[:8]}.parquet"
            local = Path(path.removeprefix("file://"))
            local.parent.mkdir(parents=True, exist_ok=True)
            written = write_data_file(arrow, str(local), schema=schema, file_path=path)
            files.append(without_lineage_metrics(written))
        rewritten = set().union(*(g.paths for g in plan.groups))
        dropped = {d.file_path for d in plan.droppable_deletes(rewritten)}
        attempt = f"{commit_id}/a0"
        event = FilesWritten.from_data_files(
            name, commit_id, "compactor", attempt, md.schema(), md.spec(), files
        )
        request = CommitRequested(
            table=name,
            commit_id=commit_id,
            operation=CommitOperation.REWRITE,
            attempt_ids=(attempt,),
            rewritten_files=tuple(sorted(rewritten | dropped)),
            base_snapshot_id=plan.snapshot_id,
        )
        if race is not None:
            await race(plan.snapshot_id)
        for value in (encode_event(event), encode_event(request)):
            await self.cdc.producer.send(self.cdc.topic, value, key=event_key(name))
        await self.cdc.producer.flush()

        async def decided() -> bool:
            return bool(self.outputs.acks(commit_id) or originals(self.outputs, commit_id))

        await wait_until(decided, f"the outcome of {commit_id}", alive=alive)
        if self.outputs.acks(commit_id):
            self.committed.append(commit_id)
            return True
        kinds = {kind for kind, _ in originals(self.outputs, commit_id)}
        assert kinds == {"conflict"}, (commit_id, kinds)
        self.refused.append(commit_id)
        return False


def decided(outputs: Outputs, table: str) -> int:
    """How many commit ids of ``table`` were announced, and offsets dead-lettered."""
    acked = {c for e in outputs.committed if e.table == table for c in e.commit_ids}
    refused = {d.source_offset for d in outputs.dead if d.table == table}
    return len(acked) + len(refused)


async def test_upserts_stay_exactly_once_through_random_kills_and_crash_points(
    kafka_broker: str, redis_server: str, tmp_path: Path
) -> None:
    """Two CDC writers per table on a v2 and a v3 table (their keys overlap, so Kafka order
    decides), coordinator SIGKILLs at random moments and at random commit stages, exact
    replays and retries with new attempt ids. The v2 table is compacted by an engine's
    rewrites sent while the writers go on (the coordinator's own compaction off); the v3 table
    by the coordinator itself between its commits, killed with it. After the writers stop, one
    more engine compaction of v2 must commit, and one more batch per table touches every key,
    so the index must find each key's row in the compacted files. The rows must then be the fold of every batch in Kafka order, for
    icefloe, PyIceberg and DuckDB."""
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
        table_options={**keyed_table(2), AUTO_ENABLED: "false"},
        batch_max_wait_ms=60,
        session_timeout_ms=1500,
    ) as (coordinator, outputs, writers, catalog):
        v3 = await catalog.create_table("db.upsert_v3", KEYED_SCHEMA, format_version=3)
        writers.tables["db.upsert_v3"] = v3
        alive = CoordinatorAlive()
        compactors = {
            t: Compactor(
                CdcWriter(writers.producer, stack.events, writers.tables[t], "compactor"),
                catalog,
                outputs,
            )
            for t in (ENGINE_COMPACTED,)
        }

        between_groups = {t: asyncio.Lock() for t in TABLES}
        quiet: dict[str, list[str]] = {t: [] for t in TABLES}
        raced = Counter[str]()

        async def write(table: str, writer: int, seed: int) -> None:
            r = random.Random(seed)
            name = f"{table}-w{writer}"
            cdc = CdcWriter(writers.producer, stack.events, writers.tables[table], name)
            order = [0]
            for g in range(GROUPS_PER_WRITER):
                group = {}
                for b in range(r.randint(1, 3)):
                    commit_id = f"{name}-{g}-{b}"
                    group[commit_id] = batches[commit_id] = changes_for(r, order, commit_id)
                    created[table].append(commit_id)
                async with between_groups[table]:
                    retry = await send_group(cdc, outputs, alive, group, r)
                if retry is not None:
                    retried.add(retry)

        async def compact(table: str, seed: int) -> None:
            """Every other compaction runs between the writers' groups, so it commits (the
            coordinator may still die under it); the others race the writers' upserts."""
            r = random.Random(seed)
            n = 0

            async def moved(planned: int | None) -> None:
                """Until the table moves past the planned snapshot (an upsert committed since,
                most likely deleting rows of the planned files), or the writers are done."""

                async def past() -> bool:
                    if writers_of[table].done() or writing.done():
                        return True
                    loaded = await catalog.load_table(table)
                    return loaded.metadata.current_snapshot_id != planned

                await wait_until(past, f"a commit to {table} after {planned}", alive=alive)

            while not writing.done():
                await asyncio.wait({writing}, timeout=r.uniform(0.5, 2.0))
                # wait for upserts since the last compaction: without them there is nothing
                # (or only the compacted file) to rewrite
                await moved((await catalog.load_table(table)).metadata.current_snapshot_id)
                if writing.done():
                    break
                n += 1
                commit_id = f"compact-{table}-{n}"
                if n % 2:
                    async with between_groups[table]:
                        if await compactors[table].run(commit_id, alive) is not None:
                            quiet[table].append(commit_id)
                elif await compactors[table].run(commit_id, alive, moved) is not None:
                    raced[table] += 1

        writers_of = {
            t: asyncio.gather(
                *(write(t, w, rng.randrange(1 << 30)) for w in range(WRITERS_PER_TABLE))
            )
            for t in TABLES
        }
        writing = asyncio.gather(*writers_of.values())
        compacting = asyncio.gather(*(compact(t, rng.randrange(1 << 30)) for t in compactors))
        rounds = crashes = 0
        while not writing.done():
            crash = (
                Crash(rng.choice(COMMIT_STAGES), rng.randint(0, 2)) if rng.random() < 0.6 else None
            )
            if rounds == 0:  # at least one death between the swap and the announcement
                crash = Crash("after-swap")
            # On a loaded machine a life may end before it decides anything, and the next
            # one repeats the same work: each life is killed only once it has decided a new
            # commit id of the table whose turn it is (or that table's writers are done).
            turn = list(TABLES)[rounds % len(TABLES)]
            before = decided(outputs, turn)
            coordinator.start(crash)
            with contextlib.suppress(BaseException):  # it may reach its crash point first
                await coordinator.wait_ready()
            await asyncio.wait({writing}, timeout=rng.uniform(1.0, 3.0))
            assert coordinator.process is not None
            while (
                not writers_of[turn].done()
                and coordinator.process.poll() is None
                and decided(outputs, turn) == before
            ):
                await asyncio.wait({writers_of[turn]}, timeout=0.2)
            if coordinator.process.poll() is not None:
                assert await coordinator.exited() == 137, coordinator.log_path.read_text()[-2000:]
                crashes += 1
            elif not writing.done():
                await coordinator.stop("kill")
            rounds += 1
        await writing
        # the last life may have a crash point still ahead: replace it by one without
        if coordinator.process is not None:
            if coordinator.process.poll() is None:
                await coordinator.stop("kill")
            else:
                assert await coordinator.exited() == 137, coordinator.log_path.read_text()[-2000:]
        coordinator.start()
        await coordinator.wait_ready()
        await compacting
        # Quiet now: a compaction must commit, and the batch after it finds every key's row
        # at its new position.
        for table in TABLES:
            cdc = CdcWriter(writers.producer, stack.events, writers.tables[table], "last")
            for last in ("before", "after"):
                if last == "after" and table in compactors:
                    assert await compactors[table].run(f"compact-{table}-last", alive), table
                commit_id = f"{table}-last-{last}"
                changes = [(k, rng.choice("uuud"), 10**6 + k, f"{last}.{k}") for k in range(KEYS)]
                batches[commit_id] = changes
                created[table].append(commit_id)
                await send_group(cdc, outputs, alive, {commit_id: changes}, random.Random(0))
        assert await coordinator.stop() == 0

        for table, ids in created.items():
            order = [c for c in await requested_order(stack, table) if c in batches]
            assert sorted(order) == sorted(ids), table
            await assert_exact(catalog, outputs, table, order, batches)
            expected = await table_rows(await catalog.load_table(table))
            location = (await catalog.load_table(table)).metadata_location
            for engine, rows in other_engines_rows(location).items():
                assert rows == expected, (table, engine)
            if table not in compactors:
                # compacted by the coordinator, through the kills
                head = (await catalog.load_table(table)).metadata
                assert any(
                    s.summary is not None and s.summary.operation == Operation.REPLACE
                    for s in head.ancestors_of(head.current_snapshot_id)
                ), f"{table}: the coordinator never compacted it"
                continue
            compactor = compactors[table]
            for commit_id in compactor.committed:
                assert len(await holders(catalog, table, commit_id)) == 1, commit_id
            for commit_id in compactor.refused:
                assert await holders(catalog, table, commit_id) == [], commit_id
            # a compaction between groups commits: nothing deleted rows of its files since
            assert quiet[table], f"{table}: no compaction ran while the writers wrote"
            assert raced[table], f"{table}: no compaction raced the writers"
            assert set(quiet[table]) <= set(compactor.committed), table
        kinds = Counter(d.reason.split(":", 1)[0] for d in outputs.dead)
        assert set(kinds) <= {"late-files", "conflict"}, [d.reason for d in outputs.dead][:5]
        # conflicts are the refused rewrites' events (files-written and commit-requested)
        refused = {c for compactor in compactors.values() for c in compactor.refused}
        conflicting = {
            getattr(parse_event(d.original), "commit_id", None)
            for d in outputs.dead
            if d.reason.startswith("conflict")
        }
        assert conflicting == refused
        # only retries' files-written are dead letters: exact replays are acknowledged
        for commit_id in batches:
            if commit_id not in retried:
                assert originals(outputs, commit_id) == [], commit_id
        committed, ends = await group_offsets(stack), await end_offsets(stack)
        assert {p: committed[p] or 0 for p in ends} == ends
        assert rounds >= 2 and crashes >= 1
