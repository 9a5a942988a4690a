"""Manifests in flight count against the manifest cache's budget (icefloe.manifests.cache).

A load reserves its file and decoded columns before it reads, waits in line while the budget
has no room, runs alone when nothing else is in flight, and releases however it ends. The
budget is instrumented, not timed: the file system the cache reads through checks, at every
read (a load holds its reservation from before its read to its insertion), that the bytes
reserved by loads in flight, with the entries and pinned manifests, are within the budget
unless that load runs alone.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples
from icefloe.dev.bench_planner import Generated, generate
from icefloe.errors import IcefloeError
from icefloe.io.fileio import LocalFileIO
from icefloe.manifests.cache import DEFAULT_DECODE_EXPANSION, ManifestCache
from icefloe.manifests.cached import CachedManifest
from icefloe.manifests.manifest_list import ManifestFile

FILES = 240
PER_MANIFEST = 10  # 24 manifests


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> Generated:
    return generate(Path(tmp_path_factory.mktemp("inflight")), FILES, PER_MANIFEST, "events")


async def _rows(table: Generated) -> list[ManifestFile]:
    snapshot = table.metadata.current_snapshot()
    assert snapshot is not None
    return await ManifestCache(LocalFileIO(), 0).manifest_list(snapshot)


class CheckingIO(LocalFileIO):
    """Reads through the local file system, checking the cache's budget at every read and
    counting reads per path and the most loads in flight at once. ``gates`` hold the reads
    of a path until set (a read in flight, for cancelling)."""

    def __init__(self) -> None:
        super().__init__()
        self.cache: ManifestCache | None = None
        self.reads: dict[str, int] = {}
        self.most_in_flight = 0
        self.alone = 0  # reads whose load ran alone past the budget
        self.gates: dict[str, asyncio.Event] = {}
        self.reading: set[str] = set()

    async def read(self, path: str) -> bytes:
        cache = self.cache
        assert cache is not None
        stats = cache.stats()
        self.most_in_flight = max(self.most_in_flight, stats.loads_in_flight)
        # Reservations past the budget only alone: one load in flight (the first, whose
        # reservation is a guess, one larger than the budget, or one admitted while pins
        # fill the budget).
        assert stats.inflight_bytes <= stats.max_bytes or stats.loads_in_flight == 1, stats
        # Entries nobody pins are not evicted for reservations: what no eviction frees
        # (pinned, outside) and the reservations are within the budget, but alone, or
        # but for manifests plans pinned after the loads in flight were admitted.
        unevictable = stats.outside_bytes + stats.inflight_bytes
        if unevictable > stats.max_bytes:
            assert stats.loads_in_flight == 1 or stats.pinned_bytes > 0, stats
            self.alone += 1
        assert stats.inflight_bytes >= stats.loads_in_flight  # every load reserved
        self.reads[path] = self.reads.get(path, 0) + 1
        gate = self.gates.get(path)
        self.reading.add(path)
        try:
            if gate is not None:
                await gate.wait()
            for _ in range(3):
                await asyncio.sleep(0)  # let other loads interleave
            return await super().read(path)
        finally:
            self.reading.discard(path)


async def _until(condition: Callable[[], bool]) -> None:
    """Let the other tasks run until ``condition`` holds (a bounded number of turns, not a
    time: a condition never met fails the test rather than hanging it)."""
    for _ in range(10_000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition was never met")


def _cache(io_: CheckingIO, max_bytes: int) -> ManifestCache:
    cache = ManifestCache(io_, max_bytes, decode_in_thread=False)
    io_.cache = cache
    return cache


def _idle(cache: ManifestCache) -> None:
    """Nothing reserved, nobody waiting, nothing pinned."""
    stats = cache.stats()
    assert stats.inflight_bytes == 0 and stats.loads_in_flight == 0, stats
    assert stats.loads_waiting == 0 and stats.pinned_bytes == 0, stats
    assert stats.held_bytes == stats.bytes <= stats.max_bytes, stats


async def _one_size(table: Generated) -> tuple[list[ManifestFile], int]:
    """The table's manifest rows and the bytes one decoded manifest takes."""
    rows = await _rows(table)
    probe = ManifestCache(LocalFileIO(), 64 << 20, decode_in_thread=False)
    one = max(
        m.nbytes
        for m in await probe.manifests(rows, table.metadata.specs(), table.metadata.schema())
    )
    return rows, one


async def test_many_concurrent_cold_plans_stay_within_a_tiny_budget(table: Generated) -> None:
    rows, one = await _one_size(table)
    io_ = CheckingIO()
    cache = _cache(io_, int(one * 3.5))  # room for about three manifests in flight
    specs, schema = table.metadata.specs(), table.metadata.schema()

    async def plan() -> list[CachedManifest]:
        return await cache.manifests(rows, specs, schema)

    plans = await asyncio.gather(*(plan() for _ in range(12)))
    assert all(len(p) == len(rows) for p in plans)
    # Loads ran side by side (the budget admits more than one), never past the budget.
    assert io_.most_in_flight >= 2
    assert io_.alone <= 1  # the first load, whose reservation is a guess, may be
    _idle(cache)


async def test_concurrent_plans_holding_what_they_read_share_one_decoded_copy(
    table: Generated,
) -> None:
    rows, one = await _one_size(table)
    io_ = CheckingIO()
    cache = _cache(io_, int(one * 3.5))  # far less than the table's 24 manifests
    specs, schema = table.metadata.specs(), table.metadata.schema()
    seen: list[int] = []

    async def plan() -> list[CachedManifest]:
        with cache.holding():
            got = await cache.manifests(rows, specs, schema)
            seen.append(cache.stats().pinned_bytes)
            return got

    plans = await asyncio.gather(*(plan() for _ in range(12)))
    # Every plan got the same objects: each manifest was read and decoded once, although the
    # table is seven times the budget (pinned entries are not evicted while plans hold them).
    assert all(p[i] is plans[0][i] for p in plans for i in range(len(rows)))
    assert all(io_.reads[r.manifest_path] == 1 for r in rows)
    # Held manifests are counted: the first plan done still held all of them.
    assert seen[0] == sum(m.nbytes for m in plans[0])
    _idle(cache)  # the blocks ended: nothing pinned, entries back within the budget
    assert cache.stats().bytes <= int(one * 3.5)


async def test_a_manifest_larger_than_the_budget_is_decoded_alone(table: Generated) -> None:
    rows, one = await _one_size(table)
    io_ = CheckingIO()
    cache = _cache(io_, one // 2)  # smaller than any manifest
    specs, schema = table.metadata.specs(), table.metadata.schema()
    plans = await asyncio.gather(*(cache.manifests(rows[:6], specs, schema) for _ in range(4)))
    assert all(len(p) == 6 for p in plans)
    assert io_.most_in_flight == 1 and io_.alone >= 6
    _idle(cache)
    assert cache.stats().entries == 0  # none fits the budget: none is kept


async def test_the_first_load_runs_alone_then_loads_reserve_by_what_decoding_showed(
    table: Generated,
) -> None:
    rows, _ = await _one_size(table)
    io_ = CheckingIO()
    cache = _cache(io_, 64 << 20)
    assert cache.decode_expansion is None
    first = rows[0]
    gate = io_.gates[first.manifest_path] = asyncio.Event()
    specs, schema = table.metadata.specs(), table.metadata.schema()
    loading = asyncio.create_task(cache.manifest(first, specs, schema))
    others = asyncio.create_task(cache.manifests(rows[1:4], specs, schema))
    await _until(lambda: first.manifest_path in io_.reading and cache.stats().loads_waiting == 3)
    stats = cache.stats()
    # Nothing decoded yet: the first load reserved by the default and the others wait.
    expected = first.manifest_length + int(first.manifest_length * DEFAULT_DECODE_EXPANSION)
    assert stats.loads_in_flight == 1 and stats.inflight_bytes == expected
    assert stats.loads_waiting == 3
    gate.set()
    decoded = await loading
    await others
    assert cache.decode_expansion is not None
    assert cache.decode_expansion >= decoded.nbytes / first.manifest_length
    assert io_.most_in_flight >= 2  # the others went together once the ratio was known
    _idle(cache)


async def test_a_cancelled_plan_releases_its_reservations_and_its_pins(table: Generated) -> None:
    rows, one = await _one_size(table)
    io_ = CheckingIO()
    cache = _cache(io_, int(one * 2.5))
    specs, schema = table.metadata.specs(), table.metadata.schema()
    await cache.manifest(rows[-1], specs, schema)  # the decode expansion is known
    blocked = rows[0]
    gate = io_.gates[blocked.manifest_path] = asyncio.Event()

    async def plan() -> list[CachedManifest]:
        with cache.holding():
            return await cache.manifests(rows[:8], specs, schema)

    doomed = asyncio.create_task(plan())
    await _until(lambda: blocked.manifest_path in io_.reading and cache.stats().loads_waiting > 0)
    # One read held in flight, loads waiting in line behind the budget; another plan shares
    # the held load.
    sharing = asyncio.create_task(cache.manifest(blocked, specs, schema))
    await asyncio.sleep(0)
    doomed.cancel()
    with pytest.raises(asyncio.CancelledError):
        await doomed
    # The plan sharing the cancelled load loads it itself (its read waits on the gate too).
    gate.set()
    assert (await sharing).path == blocked.manifest_path
    assert io_.reads[blocked.manifest_path] == 2
    _idle(cache)
    # Nothing leaked: every manifest still loads within the budget.
    assert len(await cache.manifests(rows, specs, schema)) == len(rows)
    _idle(cache)


async def test_a_corrupt_manifest_releases_what_its_load_reserved(
    table: Generated, tmp_path: Path
) -> None:
    rows, one = await _one_size(table)
    io_ = CheckingIO()
    cache = _cache(io_, int(one * 2.5))
    specs, schema = table.metadata.specs(), table.metadata.schema()
    corrupt = tmp_path / "corrupt.avro"
    corrupt.write_bytes(b"Obj\x01" + b"\xff" * rows[0].manifest_length)
    bad = ManifestFile(
        manifest_path=str(corrupt),
        manifest_length=rows[0].manifest_length,
        partition_spec_id=rows[0].partition_spec_id,
        content=rows[0].content,
        sequence_number=rows[0].sequence_number,
        min_sequence_number=rows[0].min_sequence_number,
        added_snapshot_id=rows[0].added_snapshot_id,
    )
    for _ in range(2):  # a failed load is not cached: it fails again, and releases again
        results = await asyncio.gather(
            *(cache.manifest(m, specs, schema) for m in [bad, *rows[:6], bad]),
            return_exceptions=True,
        )
        assert isinstance(results[0], IcefloeError) and str(corrupt) in str(results[0])
        assert results[-1] is results[0]  # the second asker shared the failed load
        assert all(isinstance(r, CachedManifest) for r in results[1:-1])
        _idle(cache)


async def test_pins_released_from_another_thread_admit_a_waiting_load(table: Generated) -> None:
    rows, one = await _one_size(table)
    io_ = CheckingIO()
    cache = _cache(io_, int(one * 4))
    specs, schema = table.metadata.specs(), table.metadata.schema()
    held = await cache.manifests(rows[:2], specs, schema)
    cache.pin(held)  # a held plan pins half the budget: room for one load, not two
    blocked = rows[2]
    gate = io_.gates[blocked.manifest_path] = asyncio.Event()
    first = asyncio.create_task(cache.manifest(blocked, specs, schema))
    await _until(lambda: blocked.manifest_path in io_.reading)
    waiting = asyncio.create_task(cache.manifest(rows[3], specs, schema))
    await _until(lambda: cache.stats().loads_waiting > 0)
    # The plan store drops the plan from a worker thread (a derived column past the budget):
    # the waiting load is admitted while the first is still in flight.
    unpinning = threading.Thread(target=cache.unpin, args=(held,))
    unpinning.start()
    await asyncio.to_thread(unpinning.join)
    await _until(lambda: rows[3].manifest_path in io_.reads)
    assert blocked.manifest_path in io_.reading and not first.done()
    gate.set()
    await asyncio.gather(first, waiting)
    _idle(cache)


async def test_a_task_started_inside_holding_pins_nothing_after_the_block(
    table: Generated,
) -> None:
    rows, _ = await _one_size(table)
    io_ = CheckingIO()
    cache = _cache(io_, 64 << 20)
    specs, schema = table.metadata.specs(), table.metadata.schema()
    go = asyncio.Event()

    async def later() -> CachedManifest:
        await go.wait()
        return await cache.manifest(rows[1], specs, schema)

    with cache.holding():
        await cache.manifest(rows[0], specs, schema)
        assert cache.stats().pinned_bytes > 0
        task = asyncio.create_task(later())  # inherits the block's context
    go.set()
    await task
    _idle(cache)


@settings(
    max_examples=examples(25),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    budget_in_manifests=st.floats(0.3, 6.0),
    plans=st.lists(
        st.tuples(st.lists(st.integers(0, 23), min_size=1, max_size=10), st.booleans()),
        min_size=1,
        max_size=8,
    ),
    cancel=st.sets(st.integers(0, 7), max_size=3),
    steps_before_cancel=st.integers(0, 40),
)
def test_any_mix_of_plans_and_cancellations_keeps_the_budget_and_leaks_nothing(
    table: Generated,
    budget_in_manifests: float,
    plans: list[tuple[list[int], bool]],
    cancel: set[int],
    steps_before_cancel: int,
) -> None:
    async def run() -> None:
        rows, one = await _one_size(table)
        io_ = CheckingIO()
        cache = _cache(io_, int(one * budget_in_manifests))
        specs, schema = table.metadata.specs(), table.metadata.schema()

        async def plan(picks: list[int], hold: bool) -> list[CachedManifest]:
            wanted = [rows[i] for i in picks]
            if not hold:
                return await cache.manifests(wanted, specs, schema)
            with cache.holding():
                return await cache.manifests(wanted, specs, schema)

        tasks = [asyncio.create_task(plan(p, h)) for p, h in plans]
        for _ in range(steps_before_cancel):
            await asyncio.sleep(0)
        for k in cancel:
            if k < len(tasks):
                tasks[k].cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for k, (result, (picks, _)) in enumerate(zip(results, plans, strict=True)):
            if isinstance(result, BaseException):
                assert isinstance(result, asyncio.CancelledError) and k in cancel
            else:
                assert [m.path for m in result] == [rows[i].manifest_path for i in picks]
        _idle(cache)

    asyncio.run(run())
