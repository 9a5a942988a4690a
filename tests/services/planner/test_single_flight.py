# ruff: noqa: F811  (pytest fixtures imported from test_planner are parameters here)
"""One run of a job per key at a time: callers asking meanwhile share its result or error, a
caller going away does not cancel it; and a replica asked for several pages at once of a
plan it does not hold plans it again once."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from test_planner import BASE, World, make_client, plan, world  # noqa: F401

from icefloe.planner.single_flight import SingleFlight

SECRET = b"a shared secret for the replicas"


async def test_callers_at_once_share_one_run_and_later_ones_start_another() -> None:
    flights: SingleFlight[int] = SingleFlight()
    runs = 0
    release = asyncio.Event()

    async def job() -> int:
        nonlocal runs
        runs += 1
        await release.wait()
        return runs

    waiting = [asyncio.ensure_future(flights.run("k", job)) for _ in range(5)]
    other = asyncio.ensure_future(flights.run("other", job))
    await asyncio.sleep(0)
    assert len(flights) == 2
    release.set()
    assert await asyncio.gather(*waiting, other) in ([1] * 5 + [2], [2] * 5 + [1])
    assert len(flights) == 0
    assert await flights.run("k", job) == 3  # finished: the next caller runs it again


async def test_an_error_reaches_every_caller_and_a_leaving_caller_cancels_nothing() -> None:
    flights: SingleFlight[int] = SingleFlight()
    release = asyncio.Event()

    async def failing() -> int:
        await release.wait()
        raise ValueError("no such plan")

    leaving = asyncio.ensure_future(flights.run("k", failing))
    staying = asyncio.ensure_future(flights.run("k", failing))
    await asyncio.sleep(0)
    leaving.cancel()
    await asyncio.sleep(0)
    release.set()
    with pytest.raises(ValueError, match="no such plan"):
        await staying
    assert leaving.cancelled()
    assert len(flights) == 0


async def test_pages_asked_at_once_on_a_replica_plan_the_scan_again_once(
    make_client: Any, world: World
) -> None:
    a, _ = await make_client(tasks_per_page=2, plan_secret=SECRET)
    b, service_b = await make_client(tasks_per_page=2, plan_secret=SECRET)
    first = await (await plan(a, {})).json()
    tokens = first["plan-tasks"]
    assert len(tokens) >= 3
    answers = await asyncio.gather(
        *(b.post(BASE + "/tasks", json={"plan-task": token}) for token in tokens)
    )
    assert all(r.status == 200 for r in answers)
    metrics = await (await b.get("/metrics")).text()
    selected = next(
        float(line.split()[1])
        for line in metrics.splitlines()
        if line.startswith('icefloe_planner_planned_files_total{outcome="selected"}')
    )
    assert selected == len(world.files)  # one plan of the table, not one per page
    assert len(service_b.plans) == 1
