"""Held plans and the manifest cache share one memory budget (icefloe.planner.plans).

Plans here are real: a small generated table planned with :func:`icefloe.scan.planning.plan_scan`
through the cache, so a full plan pins the cache's own manifests and a selective plan
compact copies of its rows, as in the planner. The accounting is checked against a count
made from scratch: every distinct manifest the cache lists or a held plan keeps, once.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples
from icefloe.dev.bench_planner import Generated, generate
from icefloe.expressions import And, GreaterThanOrEqual, LessThan, Reference
from icefloe.io.fileio import LocalFileIO
from icefloe.manifests.cache import ManifestCache
from icefloe.planner.plans import PlanStore
from icefloe.scan.planning import ScanPlan, plan_scan
from icefloe.spec.types import LongType
from icefloe.table.catalog import TableIdentifier

TABLE = TableIdentifier.parse("db.events")
FILES = 600
PER_MANIFEST = 100  # six manifests


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> Generated:
    return generate(Path(tmp_path_factory.mktemp("memory")), FILES, PER_MANIFEST, "events")


async def _plan(cache: ManifestCache, table: Generated, first: int | None = None) -> ScanPlan:
    """A full plan, or one of the ids ``first`` to ``first + 30`` (a compact copy's rows)."""
    row_filter = None
    if first is not None:
        row_filter = And(
            GreaterThanOrEqual(Reference("id"), first), LessThan(Reference("id"), first + 30)
        )
    return await plan_scan(table.metadata, cache, row_filter=row_filter)


def _recount(cache: ManifestCache, store: PlanStore) -> int:
    """Bytes of every distinct manifest the cache lists or a held plan pins, plus plans' own
    bytes: what the cache's accounting must agree with."""
    held: dict[int, Any] = {id(v): v for v in cache._items.values()}
    own = 0
    for stored in store._plans.values():
        own += stored.own_bytes
        for m in stored.plan.manifests():
            held.setdefault(id(m), m)
    return sum(int(v.nbytes) for v in held.values()) + own


def _check(cache: ManifestCache, store: PlanStore) -> None:
    stats = cache.stats()
    assert stats.held_bytes == _recount(cache, store)
    assert stats.held_bytes <= stats.max_bytes
    assert store.max_bytes is not None and stats.outside_bytes <= store.max_bytes
    assert store.bytes == stats.outside_bytes


async def test_full_plans_of_one_table_are_counted_once(table: Generated) -> None:
    cache = ManifestCache(LocalFileIO(), 64 << 20, decode_in_thread=False)
    store = PlanStore(600, 1000, Clock(), 8 << 20, memory=cache)
    for _ in range(40):
        store.add(TABLE, await _plan(cache, table), 50)
    stats = cache.stats()
    # Forty full plans keep the cache's own manifests: nothing outside it, nothing dropped.
    assert len(store) == 40 and store.dropped_for_memory == 0
    assert stats.outside_bytes == 0 and stats.pinned_bytes > 0
    assert stats.held_bytes == stats.bytes == _recount(cache, store)
    _check(cache, store)


async def test_selective_plans_keep_copies_within_their_share(table: Generated) -> None:
    cache = ManifestCache(LocalFileIO(), 64 << 20, decode_in_thread=False)
    one = (await _plan(cache, table, 0)).nbytes
    share = int(one * 5.5)
    store = PlanStore(600, 1000, Clock(), share, memory=cache)
    stored = [store.add(TABLE, await _plan(cache, table, k * 40), 10) for k in range(12)]
    assert 1 <= len(store) <= 5 and store.dropped_for_memory == 12 - len(store)
    assert store.get(stored[-1].key, TABLE) is stored[-1]  # the newest are kept
    assert store.get(stored[0].key, TABLE) is None  # the oldest went first
    _check(cache, store)
    for s in stored[-len(store) :]:
        assert store.remove(s.key, TABLE)
    assert cache.stats().outside_bytes == 0 and cache.stats().pinned_bytes == 0


async def test_pinned_entries_are_not_evicted_and_make_way_by_dropping_plans(
    table: Generated,
) -> None:
    probe = ManifestCache(LocalFileIO(), 64 << 20, decode_in_thread=False)
    full = (await _plan(probe, table)).nbytes
    # Room for the table's manifests and a little more: a second table's worth of loads
    # must evict, and every entry is pinned by the full plan.
    cache = ManifestCache(LocalFileIO(), int(full * 1.2), decode_in_thread=False)
    store = PlanStore(600, 1000, Clock(), int(full * 0.5), memory=cache)
    held = store.add(TABLE, await _plan(cache, table), 50)
    assert len(store) == 1 and cache.stats().outside_bytes == 0
    # Everything cached is pinned: clearing the cache moves it outside (the plan keeps it),
    # past the plans' share, so the plan is dropped rather than the budget broken.
    cache.clear()
    assert store.get(held.key, TABLE) is None and len(store) == 0
    assert store.dropped_for_memory == 1
    _check(cache, store)
    assert cache.stats().held_bytes == 0


async def test_a_plan_larger_than_the_budget_is_not_held(
    table: Generated, caplog: pytest.LogCaptureFixture
) -> None:
    cache = ManifestCache(LocalFileIO(), 0, decode_in_thread=False)  # caches nothing
    store = PlanStore(600, 1000, Clock(), 0, memory=cache)
    with caplog.at_level(logging.WARNING, logger="icefloe.planner.plans"):
        stored = store.add(TABLE, await _plan(cache, table), 50)
        store.add(TABLE, await _plan(cache, table), 50)
    assert len(stored.plan) == FILES  # still served from the returned plan
    assert len(store) == 0 and cache.stats().held_bytes == 0
    # The operator is told once (not per page re-planned) what to raise.
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "ICEFLOE_PLANNER_CACHE_MAX_BYTES" in warnings[0] and f"{FILES} tasks" in warnings[0]


async def test_charged_bytes_count_and_are_released_with_the_plan(table: Generated) -> None:
    cache = ManifestCache(LocalFileIO(), 64 << 20, decode_in_thread=False)
    store = PlanStore(600, 1000, Clock(), 1 << 20, memory=cache)
    a = store.add(TABLE, await _plan(cache, table), 50)
    b = store.add(TABLE, await _plan(cache, table), 50)
    store.charge(a, 600 << 10)
    assert cache.stats().outside_bytes == 600 << 10
    _check(cache, store)
    store.charge(b, 600 << 10)  # past the share: the oldest (a) goes, with its bytes
    assert store.get(a.key, TABLE) is None and store.get(b.key, TABLE) is b
    assert cache.stats().outside_bytes == 600 << 10
    _check(cache, store)


# One step of the property test: a full plan, a selective plan (its first id), dropping
# the n-th held plan, a manifest deriving a column, charging a held plan, clearing the cache.
STEP = st.one_of(
    st.tuples(st.just("full"), st.just(0)),
    st.tuples(st.just("selective"), st.integers(0, FILES - 1)),
    st.tuples(st.just("drop"), st.integers(0, 50)),
    st.tuples(st.just("derive"), st.integers(0, 50)),
    st.tuples(st.just("charge"), st.integers(0, 64 << 10)),
    st.tuples(st.just("clear"), st.just(0)),
    st.tuples(st.just("expire"), st.just(0)),
)


@settings(
    max_examples=examples(60),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    steps=st.lists(STEP, min_size=1, max_size=25),
    budget=st.floats(0.3, 3.0),
    share=st.floats(0.0, 1.0),
)
def test_cache_and_held_plans_never_exceed_the_budget(
    table: Generated, steps: list[tuple[str, int]], budget: float, share: float
) -> None:
    asyncio.run(_run_steps(table, steps, budget, share))


async def _run_steps(
    table: Generated, steps: list[tuple[str, int]], budget: float, share: float
) -> None:
    probe = ManifestCache(LocalFileIO(), 64 << 20, decode_in_thread=False)
    full = (await _plan(probe, table)).nbytes
    cache = ManifestCache(LocalFileIO(), int(full * budget), decode_in_thread=False)
    clock = Clock()
    store = PlanStore(60, 20, clock, int(cache.max_bytes * share), memory=cache)
    for op, n in steps:
        held = list(store._plans.values())
        if op == "full":
            store.add(TABLE, await _plan(cache, table), 50)
        elif op == "selective":
            store.add(TABLE, await _plan(cache, table, n), 10)
        elif op == "drop" and held:
            store.remove(held[n % len(held)].key, TABLE)
        elif op == "derive" and held:
            manifests = held[n % len(held)].plan.manifests()
            m = manifests[n % len(manifests)]
            m.counts("value_counts", 1 + n % 5)
            m.bounds("lower_bounds", 1, LongType(), "id")
        elif op == "charge" and held:
            store.charge(held[-1], n)
        elif op == "clear":
            cache.clear()
        elif op == "expire":
            clock.now += 61
            store.sweep(force=True)
        _check(cache, store)
    for stored in list(store._plans.values()):
        store.remove(stored.key, TABLE)
    stats = cache.stats()
    assert stats.pinned_bytes == 0 and stats.outside_bytes == 0
    assert stats.held_bytes == stats.bytes == _recount(cache, store)
