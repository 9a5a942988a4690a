"""One run of a job per key at a time, its result shared by every caller asking meanwhile.

A plan a replica does not hold is planned again from its signed token when one of its pages
is asked for. A client fetching pages with a pool of connections (Apache Iceberg Java hands
``plan-tasks`` to a few worker threads) sends several at once, and with two planner
processes each gets some: every fetch that arrived before the plan was held planned the
whole scan again, one after another in the planning slots (four fetches of a million-file
plan: four re-plans of ~100 ms each, where one serves them all).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class SingleFlight(Generic[T]):
    """Jobs by key: :meth:`run` starts the job unless one of that key is running, and waits
    for it. A caller that goes away does not cancel the job the others wait for."""

    def __init__(self) -> None:
        self._running: dict[str, asyncio.Future[T]] = {}

    def __len__(self) -> int:
        return len(self._running)

    async def run(self, key: str, job: Callable[[], Awaitable[T]]) -> T:
        future = self._running.get(key)
        if future is None:
            future = asyncio.ensure_future(job())
            self._running[key] = future
            future.add_done_callback(lambda f: self._finished(key, f))
        return await asyncio.shield(future)

    def _finished(self, key: str, future: asyncio.Future[T]) -> None:
        if self._running.get(key) is future:
            del self._running[key]
        if not future.cancelled():
            future.exception()  # retrieved: the waiters (if any are left) raise it
