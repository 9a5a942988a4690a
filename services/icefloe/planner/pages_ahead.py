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

With a :class:`~icefloe.planner.shared_pages.SharedPages` directory (the planner processes of
a host share one), a page written ahead is also put there once written, and a fetch this
process has no page ahead for looks there: a page one process wrote ahead is served by the
other when the client's next fetch lands on it, without that process planning the scan
again. A page taken from memory is deleted there (it was fetched), and a cancelled plan's
pages are deleted (:meth:`PagesAhead.forget`). The disk work runs in worker threads; a
miss costs one ``stat`` on the event loop.

Putting a page on disk that the same process then serves from memory is wasted work (a
client on one keep-alive connection sends every fetch to the process that planned), so
only page 1 (the fetch after the plan request, the first that may come on another
connection) and the pages of plans seen *spread* over processes are put there: a plan whose
page written ahead here was not fetched here (another process served it), or a page of
which this process took from the directory. Pages cheap enough to write when asked for
(slices of task texts already written, as a full plan's are) are not written ahead at all
(see :meth:`icefloe.planner.app.PlannerService._write_ahead`): copying one is cheaper than
putting it through the disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from icefloe.planner.shared_pages import SharedPages


@dataclass
class _Ahead:
    page: int
    plan: weakref.ref[Any]
    task: asyncio.Task[bytes]
    nbytes: int = 0


class PagesAhead:
    """Page bodies written ahead, by plan key."""

    def __init__(self, max_pages: int, max_bytes: int, shared: SharedPages | None = None) -> None:
        self.max_pages = max_pages
        self.max_bytes = max_bytes
        self.shared = shared
        self._entries: OrderedDict[str, _Ahead] = OrderedDict()
        self._bytes = 0
        self._disk: set[asyncio.Task[Any]] = set()  # puts and deletes in worker threads
        self.used = 0  # pages served from a body written ahead (for tests and metrics)
        self.shared_used = 0  # of which written ahead by another process (shared)
        self._spread: OrderedDict[str, None] = OrderedDict()  # plans served by several

    # Plans remembered as spread over processes, at most (the oldest forgotten first).
    MAX_SPREAD = 4096

    def _spreads(self, key: str) -> None:
        self._spread[key] = None
        self._spread.move_to_end(key)
        while len(self._spread) > self.MAX_SPREAD:
            self._spread.popitem(last=False)

    def shares(self, key: str, page: int, plan_id: str | None) -> bool:
        """Whether ``page`` of plan ``key`` written ahead goes to the shared directory too:
        page 1, and the pages of plans seen spread over processes."""
        return (
            self.shared is not None and plan_id is not None and (page == 1 or key in self._spread)
        )

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        """Bytes of the bodies written ahead and not yet taken."""
        return self._bytes

    def start(
        self,
        key: str,
        plan: Any,
        page: int,
        write: Callable[[], Awaitable[bytes]],
        plan_id: str | None = None,
    ) -> None:
        """Write ``page`` of ``plan`` in the background (replacing any page ahead of the plan);
        with ``plan_id``, also put it in the shared directory once written, unless another
        process already did."""
        self.drop(key)
        if not self.shares(key, page, plan_id):
            plan_id = None
        elif self.shared is not None and self.shared.has(key, page):
            return  # written ahead by another process: a fetch here takes it from there
        while len(self._entries) >= self.max_pages:
            self.drop(next(iter(self._entries)))
        task = asyncio.ensure_future(write())
        entry = _Ahead(page, weakref.ref(plan), task)
        self._entries[key] = entry
        task.add_done_callback(lambda t: self._written(key, entry, t, plan_id))

    def _written(
        self, key: str, entry: _Ahead, task: asyncio.Task[bytes], plan_id: str | None
    ) -> None:
        if self._entries.get(key) is not entry:
            return
        if task.cancelled() or task.exception() is not None:
            self.drop(key)  # the fetch writes the page itself (and reports its error)
            return
        if self.shared is not None and plan_id is not None:
            self._in_thread(self.shared.put, plan_id, key, entry.page, task.result())
        entry.nbytes = len(task.result())
        self._bytes += entry.nbytes
        while self._bytes > self.max_bytes and self._entries:
            self.drop(next(iter(self._entries)))

    def _in_thread(self, work: Callable[..., Any], *args: Any) -> None:
        task = asyncio.ensure_future(asyncio.to_thread(work, *args))
        self._disk.add(task)
        task.add_done_callback(self._disk.discard)

    async def take(
        self, key: str, plan: Any, page: int, plan_id: str | None = None
    ) -> bytes | None:
        """The body of ``page`` if it was started ahead from this very plan, else (with
        ``plan_id``) if another process put it in the shared directory, else None."""
        entry = self._entries.get(key)
        if entry is None or entry.page != page or entry.plan() is not plan:
            if entry is not None and entry.plan() is not plan:
                self.drop(key)
            if plan_id is None or self.shared is None:
                return None
            if entry is not None:
                self._spreads(key)  # the page written ahead here was not fetched from here
            return await self.take_shared(plan_id, key, page)
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
        if self.shared is not None and self.shares(key, page, plan_id):
            self._in_thread(self.shared.discard, key, page)  # fetched: no one else serves it
        return body

    async def take_shared(self, plan_id: str, key: str, page: int) -> bytes | None:
        """``page`` of plan ``plan_id`` as a process (maybe this one) put it in the shared
        directory, whole and written for this plan, else None. Callers check first that
        the plan id is valid and the plan not cancelled."""
        if self.shared is None or not self.shared.has(key, page):
            return None
        body = await asyncio.to_thread(self.shared.take, plan_id, key, page)
        if body is not None:
            self.used += 1
            self.shared_used += 1
            self._spreads(key)
        return body

    async def forget(self, key: str) -> None:
        """Drop the page ahead of a cancelled plan, here and in the shared directory."""
        self.drop(key)
        self._spread.pop(key, None)
        if self.shared is not None:
            await asyncio.to_thread(self.shared.forget, key)

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
        for task in [*tasks, *self._disk]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
