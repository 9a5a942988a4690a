"""The next page of a plan, written while its client reads the current one.

A client that fetches a plan's ``plan-tasks`` one after another (PyIceberg's REST scan does)
leaves the server idle while it receives and parses a page, then waits while the server
writes the next: for a full plan of a million files, 200 pages of 5,000 tasks, the writing
(milliseconds per page) and the reading add up instead of overlapping. So when a page is
served, the page after it is started in the background, and the fetch that asks for it takes
the body made ahead (waiting for it if it is still being written).

Bounded: at most one page ahead per plan, at most ``max_pages`` pages ahead in all (each
written inside the caller's CPU slots, so building ahead never takes a slot a plan is
waiting for beyond the one page), and written bodies use at most ``max_bytes`` together
(oldest dropped first): a fixed part of the service's memory whatever the number of held
plans. An entry is dropped when its plan is cancelled, when its page is taken, when a newer
page of the plan is started, and when the plan it was written from is no longer the one held
(expired, dropped from the plan store, or planned again): plans are referenced weakly, so an
entry never keeps a dropped plan alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class _Ahead:
    page: int
    plan: weakref.ref[Any]
    task: asyncio.Task[bytes]
    nbytes: int = 0


class PagesAhead:
    """Page bodies written ahead, by plan key."""

    def __init__(self, max_pages: int, max_bytes: int) -> None:
        self.max_pages = max_pages
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, _Ahead] = OrderedDict()
        self._bytes = 0
        self.used = 0  # pages served from a body written ahead (for tests and metrics)

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        """Bytes of the bodies written ahead and not yet taken."""
        return self._bytes

    def start(self, key: str, plan: Any, page: int, write: Callable[[], Awaitable[bytes]]) -> None:
        """Write ``page`` of ``plan`` in the background (replacing any page ahead of the plan)."""
        self.drop(key)
        while len(self._entries) >= self.max_pages:
            self.drop(next(iter(self._entries)))
        task = asyncio.ensure_future(write())
        entry = _Ahead(page, weakref.ref(plan), task)
        self._entries[key] = entry
        task.add_done_callback(lambda t: self._written(key, entry, t))

    def _written(self, key: str, entry: _Ahead, task: asyncio.Task[bytes]) -> None:
        if self._entries.get(key) is not entry:
            return
        if task.cancelled() or task.exception() is not None:
            self.drop(key)  # the fetch writes the page itself (and reports its error)
            return
        entry.nbytes = len(task.result())
        self._bytes += entry.nbytes
        while self._bytes > self.max_bytes and self._entries:
            self.drop(next(iter(self._entries)))

    async def take(self, key: str, plan: Any, page: int) -> bytes | None:
        """The body of ``page`` if it was started ahead from this very plan, else None."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry.page != page or entry.plan() is not plan:
            if entry.plan() is not plan:
                self.drop(key)
            return None
        self._entries.pop(key)
        self._bytes -= entry.nbytes
        try:
            # Shielded: a client that goes away must not cancel the write for the next one.
            body = await asyncio.shield(entry.task)
        except asyncio.CancelledError:
            if entry.task.cancelled():
                return None
            raise
        except Exception:  # the caller writes the page again and reports the error
            return None
        self.used += 1
        return body

    def drop(self, key: str) -> None:
        """Forget the page ahead of plan ``key`` (cancelled if it is still being written)."""
        entry = self._entries.pop(key, None)
        if entry is None:
            return
        self._bytes -= entry.nbytes
        if not entry.task.done():
            entry.task.cancel()

    async def close(self) -> None:
        """Cancel every write in progress (the service is stopping)."""
        tasks = [e.task for e in self._entries.values()]
        for key in list(self._entries):
            self.drop(key)
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
