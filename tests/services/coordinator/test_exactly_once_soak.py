"""A randomized soak of the exactly-once promise that stops by itself.

Several writer tasks publish jobs for several tables on a multi-partition topic: appends of
one or more tasks (some with a failed first attempt the commit leaves out), streaming
micro-batches, exact replays of whole jobs, and retries of finished jobs with a new attempt
id and new files. Meanwhile the coordinator process is killed with SIGKILL at random
moments and at the injected crash points (after the manifests, after the metadata file,
after the catalog swap), a bounded number of times, then left to finish; a second replica
in the same consumer group is frozen (SIGSTOP) beyond the session timeout and woken up
(SIGCONT) as a zombie. Mid-stream the Kafka broker itself (tansu keeping its log in S3,
on the SeaweedFS the tests start) is killed with SIGKILL and restarted on the same port:
writers, the coordinator and its zombie ride it out.

The accounting at the end is exact: every requested file is live exactly once and no other
file is; every commit id is in exactly one snapshot; every commit is announced by a
table-committed naming the snapshot that holds it (and no announcement names another);
nothing was dead-lettered but the retries' late files; the consumer group's offsets are at
the end of every partition.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from restartable_broker import RestartableBroker
from test_coordinator import Stack, Writers, redis_uri, table_state, wait_until
from test_exactly_once import (
    EXTRA_PROCESSES,
    CoordinatorProcess,
    Crash,
    end_offsets,
    group_offsets,
    harness,
    holders,
    originals,
)

from icefloe.coordinator.commit_hooks import COMMIT_STAGES
from icefloe.dev.local_stack import S3Endpoint
from icefloe.events import CommitOperation, CommitRequested, encode_event

pytestmark = pytest.mark.integration

TABLES = ["db.soak_0", "db.soak_1", "db.soak_2"]
WRITER_TASKS = 4
JOBS_PER_WRITER = 14
KILLS = 8


@dataclass
class Ledger:
    """What the writers asked for, to check the tables against."""

    expected: dict[str, set[str]] = field(default_factory=lambda: {t: set() for t in TABLES})
    not_expected: dict[str, set[str]] = field(default_factory=lambda: {t: set() for t in TABLES})
    commits: dict[str, list[str]] = field(default_factory=lambda: {t: [] for t in TABLES})
    retried: set[str] = field(default_factory=set)
    replayed: set[str] = field(default_factory=set)
    sent: dict[str, list[bytes]] = field(default_factory=dict)


async def writer_task(writers: Writers, ledger: Ledger, n: int, rng: random.Random) -> None:
    for j in range(JOBS_PER_WRITER):
        table = rng.choice(TABLES)
        commit_id = f"w{n}-j{j}"
        roll = rng.random()
        values: list[bytes] = []
        if roll < 0.2:  # a streaming micro-batch
            files = writers.files(table, rng.randint(1, 3))
            event = writers.files_written(table, commit_id, f"{commit_id}/s", files, True)
            values.append(encode_event(event))
            ledger.expected[table].update(f.file_path for f in files)
        else:
            failed_first = roll > 0.8
            chosen = "a1" if failed_first else "a0"
            attempts = ["a0", "a1"] if failed_first else ["a0"]
            for attempt in attempts:
                for _ in range(rng.randint(1, 2)):
                    files = writers.files(table, rng.randint(1, 2))
                    event = writers.files_written(table, commit_id, f"{commit_id}/{attempt}", files)
                    values.append(encode_event(event))
                    target = ledger.expected if attempt == chosen else ledger.not_expected
                    target[table].update(f.file_path for f in files)
            request = CommitRequested(
                table=table,
                commit_id=commit_id,
                operation=CommitOperation.APPEND,
                attempt_ids=(f"{commit_id}/{chosen}",),
            )
            values.append(encode_event(request))
        for value in values:
            await writers.send(table, value)
        ledger.commits[table].append(commit_id)
        ledger.sent[commit_id] = values
        # Later: an exact replay of an earlier job, or a retry with a new attempt id.
        if j > 2 and rng.random() < 0.3:
            old_id = f"w{n}-j{rng.randrange(j)}"
            old_table = next(t for t, cs in ledger.commits.items() if old_id in cs)
            if rng.random() < 0.5:
                ledger.replayed.add(old_id)
                for value in ledger.sent[old_id]:
                    await writers.send(old_table, value)
            else:
                files = writers.files(old_table, 1)
                attempt = f"{old_id}/retry-{j}"
                event = writers.files_written(old_table, old_id, attempt, files)
                retry = CommitRequested(
                    table=old_table,
                    commit_id=old_id,
                    operation=CommitOperation.APPEND,
                    attempt_ids=(attempt,),
                )
                ledger.not_expected[old_table].update(f.file_path for f in files)
                ledger.retried.add(old_id)
                for value in (encode_event(event), encode_event(retry)):
                    await writers.send(old_table, value)
        await writers.producer.flush()
        await asyncio.sleep(rng.uniform(0.3, 1.5))  # spread the stream over the kills


@pytest.fixture
def broker(s3_server: S3Endpoint, tmp_path: Path) -> Iterator[RestartableBroker]:
    restartable = RestartableBroker(s3_server, tmp_path)
    restartable.start()
    try:
        yield restartable
    finally:
        restartable.stop()


async def test_soak_kills_crash_points_replays_and_retries_end_exactly_once(
    broker: RestartableBroker, redis_server: str, tmp_path: Path
) -> None:
    warehouse = tmp_path / "warehouse"
    stack = Stack(broker.bootstrap, redis_uri(redis_server, warehouse), warehouse)
    rng = random.Random(9)
    ledger = Ledger()
    async with harness(
        stack, tmp_path, TABLES, batch_max_files=6, batch_max_wait_ms=30, session_timeout_ms=1500
    ) as (coordinator, outputs, writers, catalog):
        producing = asyncio.gather(
            *(
                writer_task(writers, ledger, n, random.Random(rng.random()))
                for n in range(WRITER_TASKS)
            )
        )
        # A second replica in the same group, frozen now and then for longer than the
        # session timeout: it wakes up as a zombie that still believes it owns partitions.
        zombie = CoordinatorProcess(
            stack,
            tmp_path,
            "zombie",
            batch_max_files=6,
            batch_max_wait_ms=30,
            session_timeout_ms=1500,
        )
        EXTRA_PROCESSES.append(zombie)

        def crash() -> Crash | None:
            if rng.random() < 0.4:
                return None
            return Crash(rng.choice(COMMIT_STAGES), rng.randint(0, 1))

        zombie.start(crash())
        kills = crashes = freezes = broker_restarts = 0
        while kills + crashes < KILLS:
            coordinator.start(crash())
            with contextlib.suppress(BaseException):
                # Joined (or already crashed at a crash point, which the check below sees).
                await coordinator.wait_ready()
            await asyncio.sleep(rng.uniform(0.5, 2.0))
            if kills + crashes in (2, 5):  # the broker dies mid-stream and comes back
                broker.kill()
                await asyncio.sleep(rng.uniform(0.5, 2.0))
                await asyncio.to_thread(broker.start)
                broker_restarts += 1
            assert zombie.process is not None
            if zombie.process.poll() is not None:  # the other replica reached a crash point
                assert await zombie.exited() == 137, zombie.log_path.read_text()[-2000:]
                crashes += 1
                zombie.start(crash())
            elif rng.random() < 0.5:
                assert zombie.process is not None
                zombie.process.send_signal(signal.SIGSTOP)
                await asyncio.sleep(rng.uniform(2.0, 3.5))  # > the 1.5 s session timeout
                zombie.process.send_signal(signal.SIGCONT)
                freezes += 1
            await asyncio.sleep(rng.uniform(0.2, 1.5))
            assert coordinator.process is not None
            if coordinator.process.poll() is None:
                await coordinator.stop("kill")
                kills += 1
            else:
                assert await coordinator.exited() == 137, coordinator.log_path.read_text()[-2000:]
                crashes += 1
        await producing
        assert zombie.process is not None
        if zombie.process.poll() is not None:
            assert await zombie.exited() == 137, zombie.log_path.read_text()[-2000:]
            crashes += 1
        else:
            await zombie.stop("kill")
            kills += 1
        coordinator.start()
        await coordinator.wait_ready()
        every = {c for cs in ledger.commits.values() for c in cs}

        async def all_announced() -> bool:
            return {c for e in outputs.committed for c in e.commit_ids} >= every

        await wait_until(all_announced, f"{len(every)} commits announced", alive=coordinator.alive)
        await writers.producer.flush()
        assert await coordinator.stop() == 0

        # -- exact accounting ---------------------------------------------------------------
        for table in TABLES:
            state = await table_state(catalog, table)
            twice = [p for p, n in state.live.items() if n > 1]
            assert not twice, f"{table}: files live twice: {twice[:5]}"
            assert set(state.live) == ledger.expected[table], (
                f"{table}: missing {sorted(ledger.expected[table] - set(state.live))[:5]}, "
                f"extra {sorted(set(state.live) - ledger.expected[table])[:5]}"
            )
            assert Counter(state.commit_ids) == Counter(set(ledger.commits[table]))
            for commit_id in ledger.commits[table]:
                held = await holders(catalog, table, commit_id)
                assert len(held) == 1, f"{commit_id} is in snapshots {held}"
                named = {e.snapshot_id for e in outputs.acks(commit_id)}
                assert named == set(held), f"{commit_id}: announced {named}, held by {held}"
        # Only late files were dead-lettered: a retry's new attempt, or a replayed attempt
        # the commit had left out; never a file that is live.
        assert not [d for d in outputs.dead if not d.reason.startswith("late-files")]
        orphaned = set().union(*ledger.not_expected.values())
        for commit_id in every:
            letters = originals(outputs, commit_id)
            if letters:
                assert commit_id in ledger.retried | ledger.replayed, commit_id
            for _, event in letters:
                assert set(event.file_paths) <= orphaned, commit_id
        committed, ends = await group_offsets(stack), await end_offsets(stack)
        assert {p: committed[p] or 0 for p in ends} == ends
        assert kills + crashes >= KILLS and freezes >= 1 and broker_restarts == 2
        assert crashes >= 1, "no injected crash point was reached"
