"""A budget of bytes that requests reserve before their body is read (first come, first served).

A server reads a request body before it can admit the request to its work, so bodies of
requests waiting for admission are all in memory at once: with hundreds of connections
each sending a body of up to the request limit (a filter of a hundred thousand values is a
megabyte), that is hundreds of megabytes nothing accounts for. Reserving the body's size
(its Content-Length, or the limit when it is not given) from a fixed budget before reading
it bounds that memory; requests past the budget wait unread, their bytes in the kernel's
socket buffers, and are served in arrival order.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator

from icefloe.errors import ValidationError


class ByteBudget:
    """At most ``max_bytes`` reserved at once; a reservation larger than the budget takes all
    of it (it is served alone rather than never)."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 1:
            raise ValidationError(f"a byte budget must be at least 1 byte, got {max_bytes}")
        self.max_bytes = max_bytes
        self.used = 0
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()

    @contextlib.asynccontextmanager
    async def reserve(self, nbytes: int) -> AsyncIterator[None]:
        """Hold ``nbytes`` of the budget for the ``async with`` block, waiting in line."""
        n = max(0, min(nbytes, self.max_bytes))
        if self._waiters or self.used + n > self.max_bytes:
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            entry = (n, waiter)
            self._waiters.append(entry)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._release(n)  # granted just as it was cancelled
                else:
                    self._waiters.remove(entry)
                    self._wake()
                raise
        else:
            self.used += n
        try:
            yield
        finally:
            self._release(n)

    def _release(self, n: int) -> None:
        self.used -= n
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self.used + self._waiters[0][0] <= self.max_bytes:
            n, waiter = self._waiters.popleft()
            self.used += n
            waiter.set_result(None)
