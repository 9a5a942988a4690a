"""Request bodies reserve bytes from a budget before they are read (icefloe.runtime.byte_budget)."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples
from icefloe.errors import ValidationError
from icefloe.runtime.byte_budget import ByteBudget


async def test_reservations_past_the_budget_wait_in_arrival_order() -> None:
    budget = ByteBudget(100)
    order: list[str] = []
    gate = asyncio.Event()

    async def hold(name: str, n: int) -> None:
        async with budget.reserve(n):
            order.append(name)
            await gate.wait()

    first = asyncio.create_task(hold("a", 80))
    await asyncio.sleep(0)
    second = asyncio.create_task(hold("b", 50))  # does not fit beside a
    third = asyncio.create_task(hold("c", 10))  # would fit, but b came first
    for _ in range(5):
        await asyncio.sleep(0)
    assert order == ["a"] and budget.used == 80
    gate.set()
    await asyncio.gather(first, second, third)
    assert order == ["a", "b", "c"] and budget.used == 0


async def test_a_reservation_larger_than_the_budget_takes_all_of_it() -> None:
    budget = ByteBudget(10)
    async with budget.reserve(1000):
        assert budget.used == 10
    assert budget.used == 0
    with pytest.raises(ValidationError, match="at least 1 byte"):
        ByteBudget(0)


async def test_a_cancelled_waiter_gives_its_place_to_the_next() -> None:
    budget = ByteBudget(10)
    entered: list[int] = []
    release = asyncio.Event()

    async def hold(n: int) -> None:
        async with budget.reserve(n):
            entered.append(n)
            await release.wait()

    holder = asyncio.create_task(hold(10))
    await asyncio.sleep(0)
    waiting = asyncio.create_task(hold(9))
    behind = asyncio.create_task(hold(1))
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    release.set()
    await asyncio.gather(holder, behind)
    assert entered == [10, 1] and budget.used == 0


@settings(max_examples=examples(50), deadline=None)
@given(
    sizes=st.lists(st.integers(0, 120), min_size=1, max_size=30),
    budget_bytes=st.integers(1, 100),
)
def test_the_budget_is_never_exceeded_and_every_request_is_served(
    sizes: list[int], budget_bytes: int
) -> None:
    async def run() -> None:
        budget = ByteBudget(budget_bytes)
        served = 0

        async def one(n: int) -> None:
            nonlocal served
            async with budget.reserve(n):
                assert budget.used <= budget.max_bytes
                await asyncio.sleep(0)
                assert budget.used <= budget.max_bytes
                served += 1

        await asyncio.gather(*(one(n) for n in sizes))
        assert served == len(sizes) and budget.used == 0

    asyncio.run(run())
