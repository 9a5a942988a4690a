"""Exactly once for overwrites, row deltas and rewrites, on ``main`` and on a non-main branch,
with ``base-snapshot-id`` validation, while the coordinator is killed (SIGKILL and the
injected crash points) and restarted a bounded number of times, a second replica in the same
group is frozen (SIGSTOP) beyond the session timeout and woken up as a zombie, and the
catalog (its own redis-server) is frozen for seconds at a time.

One writer per table commits a random sequence of operations, each waiting for its
``table-committed`` (so the expected state can be computed alongside), and replays some
(exact) or retries them with a new attempt id and new files; an overwrite on a stale base
that a later append conflicts with must be dead-lettered as a conflict and change nothing.
The accounting at the end is exact: the live files of each branch are the simulated ones;
every accepted commit id is in exactly one snapshot and every announcement names it; the
refused ones are in none; the consumer group's offsets are at the end of every partition.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import subprocess
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from test_coordinator import Stack, Writers, redis_uri, wait_until
from test_exactly_once import (
    EXTRA_PROCESSES,
    CoordinatorProcess,
    Crash,
    Outputs,
    end_offsets,
    group_offsets,
    harness,
    holders,
    originals,
)

from icefloe.coordinator.commit_hooks import COMMIT_STAGES
from icefloe.dev.local_stack import LocalStack
from icefloe.events import CommitOperation, CommitRequested, FilesWritten, encode_event
from icefloe.manifests.reader import ManifestReader
from icefloe.spec.datafile import DataFile, DataFileContent
from icefloe.table.catalog import Catalog

pytestmark = pytest.mark.integration

TABLES = {"db.ops_main": "main", "db.ops_branch": "audit"}
OPERATIONS_PER_TABLE = 12


@dataclass
class TableModel:
    """What the table's branch must hold, as the writer computes it."""

    table: str
    branch: str
    live: set[str] = field(default_factory=set)
    data: dict[str, str] = field(default_factory=dict)  # live data file -> category
    deletes: dict[str, tuple[str, str]] = field(default_factory=dict)  # -> (category, target)
    kinds: Counter[str] = field(default_factory=Counter)
    head: int | None = None
    accepted: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)


async def live_on(catalog: Catalog, table: str, branch: str) -> Counter[str]:
    loaded = await catalog.load_table(table)
    md = loaded.metadata
    head = md.snapshot_by_ref(branch)
    out: Counter[str] = Counter()
    if head is None:
        return out
    reader = ManifestReader(loaded.io)
    for manifest in await reader.manifests(head):
        for entry in await reader.entries(manifest, md.specs(), live_only=True):
            out[entry.data_file.file_path] += 1
    return out


async def commit(
    writers: Writers,
    outputs: Outputs,
    alive: CoordinatorAlive,
    model: TableModel,
    commit_id: str,
    request: CommitRequested,
    data: list[DataFile],
    deletes: list[DataFile],
    rng: random.Random,
) -> int:
    """Publish one commit, wait for its announcement; maybe replay or retry it after."""
    md = writers.tables[model.table].metadata
    values = []
    if data or deletes:
        event = FilesWritten.from_data_files(
            model.table, commit_id, "ops", f"{commit_id}/a0", md.schema(), md.spec(), data, deletes
        )
        values.append(encode_event(event))
    values.append(encode_event(request))
    for value in values:
        await writers.send(model.table, value)
    await writers.producer.flush()
    await outputs.wait_acks(commit_id, 1, alive)
    snapshot_id = outputs.acks(commit_id)[0].snapshot_id
    roll = rng.random()
    if roll < 0.25:  # an exact replay
        for value in values:
            await writers.send(model.table, value)
        await writers.producer.flush()
        await outputs.wait_acks(commit_id, 2, alive)
    elif roll < 0.45 and (data or deletes):  # a retry with a new attempt and new files
        extra = writers.files(model.table, 1, cat="b")
        retry_event = FilesWritten.from_data_files(
            model.table, commit_id, "ops", f"{commit_id}/a1", md.schema(), md.spec(), extra
        )
        retry = request.model_copy(
            update={
                "attempt_ids": (f"{commit_id}/a1",),
                "event_ids": (),
                "event_id": str(uuid.uuid4()),
            }
        )
        for value in (encode_event(retry_event), encode_event(retry)):
            await writers.send(model.table, value)
        await writers.producer.flush()
        await outputs.wait_acks(commit_id, 2, alive)
    return snapshot_id


class CoordinatorAlive:
    """``alive`` for waits while the coordinator is being killed: never fails."""

    def __call__(self) -> None:
        return None


async def writer(writers: Writers, outputs: Outputs, model: TableModel, rng: random.Random) -> None:
    alive = CoordinatorAlive()
    branch = None if model.branch == "main" else model.branch
    for n in range(OPERATIONS_PER_TABLE):
        commit_id = f"{model.table}-{n}"
        kinds = ["append"]
        if model.data:
            kinds += ["overwrite", "row-delta"]
        undeleted = sorted(set(model.data) - {t for _, t in model.deletes.values()})
        if len(undeleted) >= 2:
            kinds.append("rewrite")
        if model.head is not None and n > 2:
            kinds.append("stale-overwrite")
        kind = rng.choice(kinds)
        data: list[DataFile] = []
        deletes: list[DataFile] = []
        common = {"table": model.table, "commit_id": commit_id, "branch": branch}
        if kind == "append":
            cat = rng.choice("ab")
            data = writers.files(model.table, rng.randint(1, 2), cat=cat)
            request = CommitRequested(
                operation=CommitOperation.APPEND, attempt_ids=(f"{commit_id}/a0",), **common
            )
        elif kind == "overwrite":
            data = writers.files(model.table, 1, cat="a")
            request = CommitRequested(
                operation=CommitOperation.OVERWRITE,
                attempt_ids=(f"{commit_id}/a0",),
                overwrite_filter={"type": "eq", "term": "cat", "value": "a"},
                base_snapshot_id=model.head,
                **common,
            )
        elif kind == "rewrite":
            victims = rng.sample(undeleted, 2)
            cat = model.data[victims[0]]
            victims = [v for v in victims if model.data[v] == cat]
            data = writers.files(model.table, 1, cat=cat)
            request = CommitRequested(
                operation=CommitOperation.REWRITE,
                attempt_ids=(f"{commit_id}/a0",),
                rewritten_files=tuple(victims),
                base_snapshot_id=model.head,
                **common,
            )
        elif kind == "row-delta":
            target = rng.choice(sorted(model.data))
            path = writers.files(model.table, 1, cat=model.data[target])[0]
            deletes = [
                DataFile(
                    path.file_path,
                    "parquet",
                    (model.data[target],),
                    1,
                    path.file_size_in_bytes,
                    content=DataFileContent.POSITION_DELETES,
                    referenced_data_file=target,
                )
            ]
            request = CommitRequested(
                operation=CommitOperation.ROW_DELTA,
                attempt_ids=(f"{commit_id}/a0",),
                base_snapshot_id=model.head,
                **common,
            )
        else:  # an overwrite of cat=a on a base that an append to cat=a has moved past
            stale = model.head
            add = writers.files(model.table, 1, cat="a")
            appended = f"{commit_id}-before"
            await commit(
                writers,
                outputs,
                alive,
                model,
                appended,
                CommitRequested(
                    operation=CommitOperation.APPEND,
                    attempt_ids=(f"{appended}/a0",),
                    table=model.table,
                    commit_id=appended,
                    branch=branch,
                ),
                add,
                [],
                random.Random(0),  # no replay: keeps the ack count simple
            )
            model.accepted.append(appended)
            model.live.update(f.file_path for f in add)
            model.data.update({f.file_path: "a" for f in add})
            model.head = outputs.acks(appended)[0].snapshot_id
            request = CommitRequested(
                operation=CommitOperation.OVERWRITE,
                attempt_ids=(f"{commit_id}/a0",),
                overwrite_filter={"type": "eq", "term": "cat", "value": "a"},
                base_snapshot_id=stale,
                **common,
            )
            doomed = writers.files(model.table, 1, cat="a")
            md = writers.tables[model.table].metadata
            event = FilesWritten.from_data_files(
                model.table, commit_id, "ops", f"{commit_id}/a0", md.schema(), md.spec(), doomed
            )
            for value in (encode_event(event), encode_event(request)):
                await writers.send(model.table, value)
            await writers.producer.flush()

            async def refused(cid: str = commit_id) -> bool:
                return any(k == "conflict" for k, _ in originals(outputs, cid))

            await wait_until(refused, f"{commit_id} refused as a conflict")
            model.refused.append(commit_id)
            model.kinds[kind] += 1
            continue
        model.head = await commit(
            writers, outputs, alive, model, commit_id, request, data, deletes, rng
        )
        model.accepted.append(commit_id)
        model.kinds[kind] += 1
        if kind == "overwrite":  # every file of partition cat=a goes, delete files too
            for path in [p for p, c in model.data.items() if c == "a"]:
                model.live.discard(path)
                del model.data[path]
            for path in [p for p, (c, _) in model.deletes.items() if c == "a"]:
                model.live.discard(path)
                del model.deletes[path]
        elif kind == "rewrite":
            for path in request.rewritten_files:
                model.live.discard(path)
                del model.data[path]
        model.live.update(f.file_path for f in (*data, *deletes))
        model.data.update({f.file_path: f.partition[0] for f in data})
        model.deletes.update(
            {f.file_path: (f.partition[0], f.referenced_data_file or "") for f in deletes}
        )


async def test_overwrites_row_deltas_and_rewrites_on_branches_stay_exactly_once(
    kafka_broker: str, tmp_path: Path
) -> None:
    warehouse = tmp_path / "warehouse"
    async with LocalStack(redis=True, workdir=tmp_path / "own") as own:
        redis = own.servers["redis"].process
        stack = Stack(kafka_broker, redis_uri(own.redis_url, warehouse), warehouse)
        await soak(stack, redis, tmp_path)


async def soak(stack: Stack, redis: subprocess.Popen[bytes], tmp_path: Path) -> None:
    rng = random.Random(11)
    models = [TableModel(t, b) for t, b in TABLES.items()]
    settings = {"batch_max_wait_ms": 30, "session_timeout_ms": 1500}
    async with harness(stack, tmp_path, list(TABLES), **settings) as (
        coordinator,
        outputs,
        writers,
        catalog,
    ):
        writing = asyncio.gather(
            *(writer(writers, outputs, m, random.Random(rng.random())) for m in models)
        )
        zombie = CoordinatorProcess(stack, tmp_path, "zombie", **settings)
        EXTRA_PROCESSES.append(zombie)
        zombie.start()
        rounds = crashes = freezes = outages = 0
        while not writing.done():
            crash = None
            if rng.random() < 0.5:
                crash = Crash(rng.choice(COMMIT_STAGES), rng.randint(0, 1))
            coordinator.start(crash)
            with contextlib.suppress(BaseException):  # it may reach its crash point first
                await coordinator.wait_ready()
            roll = rng.random()
            if roll < 0.35 or not freezes:
                # The other replica freezes beyond the session timeout and wakes up as a
                # zombie that still believes it owns its partitions.
                assert zombie.process is not None and zombie.process.poll() is None
                zombie.process.send_signal(signal.SIGSTOP)
                await asyncio.wait({writing}, timeout=rng.uniform(2.0, 3.5))
                zombie.process.send_signal(signal.SIGCONT)
                freezes += 1
            elif roll < 0.7 or not outages:  # the catalog freezes: commits wait, none is lost
                redis.send_signal(signal.SIGSTOP)
                try:
                    await asyncio.wait({writing}, timeout=rng.uniform(1.5, 3.0))
                finally:
                    redis.send_signal(signal.SIGCONT)
                outages += 1
            else:
                await asyncio.wait({writing}, timeout=rng.uniform(1.0, 3.0))
            assert coordinator.process is not None
            if coordinator.process.poll() is not None:
                assert await coordinator.exited() == 137, coordinator.log_path.read_text()[-2000:]
                crashes += 1
            elif not writing.done():
                await coordinator.stop("kill")
            rounds += 1
        await writing
        await zombie.stop("kill")
        if coordinator.process is None:
            coordinator.start()
        await coordinator.wait_ready()
        assert await coordinator.stop() == 0

        for model in models:
            live = await live_on(catalog, model.table, model.branch)
            assert not [p for p, n in live.items() if n > 1], model.table
            assert set(live) == model.live, (
                f"{model.table}: missing {sorted(model.live - set(live))[:4]}, "
                f"extra {sorted(set(live) - model.live)[:4]}"
            )
            for commit_id in model.accepted:
                held = await holders(catalog, model.table, commit_id)
                assert len(held) == 1, f"{commit_id} is in snapshots {held}"
                assert {e.snapshot_id for e in outputs.acks(commit_id)} == set(held)
            for commit_id in model.refused:
                assert await holders(catalog, model.table, commit_id) == []
                assert outputs.acks(commit_id) == []
        kinds = Counter(d.reason.split(":", 1)[0] for d in outputs.dead)
        assert set(kinds) <= {"late-files", "conflict"}, kinds
        refused = sum(len(m.refused) for m in models)
        assert kinds["conflict"] >= refused  # the request and its files-written event
        committed, ends = await group_offsets(stack), await end_offsets(stack)
        assert {p: committed[p] or 0 for p in ends} == ends
        assert rounds >= 2 and freezes >= 1 and outages >= 1
        done = sum((m.kinds for m in models), Counter())
        assert {"append", "overwrite", "rewrite", "row-delta", "stale-overwrite"} <= set(done), done
