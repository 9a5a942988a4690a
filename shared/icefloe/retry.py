"""One way to retry: exponential backoff with full jitter, bounded by attempts or a deadline.

Every retry loop of icefloe, the core's optimistic commits as much as the services'
consumer, producer and commit loops, is expressed with this module, so they share one
backoff law and one notion of giving up:

* :class:`Backoff` is the law. Before retry ``n`` (1 for the first) the wait is uniform in
  ``[base_s, ceiling(n)]`` with ``ceiling(n) = max(base_s, min(max_s, base_s * 2**n))``
  ("full jitter" above a floor, so many clients do not retry in lock step); without jitter
  it is ``ceiling(n)`` itself.
* :class:`Retry` is a policy: the backoff, which errors are transient, and when to give up
  (``max_attempts``, ``deadline_s``: a wait that would end past the deadline is not started).
  ``on_retry`` sees each failure before its wait, for logging and metrics; raising from it
  aborts the retries (a service does that when it loses the work, say on a rebalance).
* :meth:`Retry.call` runs an action until it succeeds. Loops that do more than call one
  action between attempts (a commit that reloads the table, tells conflicts from storage
  trouble) hold a :class:`RetryState` from :meth:`Retry.start` and ask it to
  :meth:`~RetryState.backoff` after each failure.

With neither ``max_attempts`` nor ``deadline_s`` a policy retries forever: a call that must
eventually pass, stopped by cancelling its task. :meth:`Retry.run_until` is the other
service loop: an action repeated until an event is set, failures backed off (the wait cut
short by the event), a success starting the backoff over.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")

_MAX_EXPONENT = 64  # 2**64 times any positive base is past every maximum in use


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with optional full jitter; see the module docstring for the law."""

    base_s: float
    max_s: float
    jitter: bool = True

    def __post_init__(self) -> None:
        if self.base_s < 0 or self.max_s < 0:
            raise ValueError(f"backoff delays must not be negative: {self}")

    def ceiling(self, retry: int) -> float:
        """The longest wait before retry number ``retry`` (1 for the first)."""
        exponent = min(max(retry, 0), _MAX_EXPONENT)
        return max(self.base_s, min(self.max_s, self.base_s * 2.0**exponent))

    def delay(self, retry: int) -> float:
        """The wait before retry number ``retry``: in ``[base_s, ceiling(retry)]``."""
        ceiling = self.ceiling(retry)
        return random.uniform(self.base_s, ceiling) if self.jitter else ceiling


@dataclass(frozen=True, slots=True)
class RetryEvent:
    """What ``on_retry`` is told: the failures so far, the last error and the coming wait."""

    failures: int
    error: BaseException
    delay_s: float


@dataclass(frozen=True, slots=True)
class Retry:
    """A retry policy; see the module docstring."""

    backoff: Backoff
    transient: tuple[type[BaseException], ...] = (Exception,)
    permanent: tuple[type[BaseException], ...] = ()
    max_attempts: int | None = None
    deadline_s: float | None = None
    on_retry: Callable[[RetryEvent], None] | None = None
    sleep: Callable[[float], Awaitable[None]] = field(default=asyncio.sleep, repr=False)

    def __post_init__(self) -> None:
        if self.max_attempts is not None and self.max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {self.max_attempts}")

    def is_transient(self, error: BaseException) -> bool:
        """Whether ``error`` is worth another attempt (cancellation never is)."""
        if isinstance(error, (asyncio.CancelledError, self.permanent)):
            return False
        return isinstance(error, self.transient)

    def start(self) -> RetryState:
        """The state of one operation under this policy; its deadline starts now."""
        return RetryState(self)

    async def call(self, action: Callable[[], Awaitable[T]]) -> T:
        """``await action()`` until it returns; the last error once it is not transient or
        the attempts or the deadline are used up."""
        state = self.start()
        while True:
            try:
                return await action()
            except BaseException as e:
                if not self.is_transient(e) or not await state.backoff(e):
                    raise

    async def run_until(self, stop: asyncio.Event, action: Callable[[], Awaitable[object]]) -> None:
        """``await action()`` again and again until ``stop`` is set; see the module docstring.

        Raises an error that is not transient, or the last one when the policy gives up.
        """
        state = self.start()
        while not stop.is_set():
            try:
                await action()
            except BaseException as e:
                if not self.is_transient(e) or not await state.backoff(e, stop):
                    raise
            else:
                state = self.start()


class RetryState:
    """The failures of one operation so far, and its deadline."""

    __slots__ = ("deadline", "failures", "policy")

    def __init__(self, policy: Retry) -> None:
        self.policy = policy
        self.failures = 0
        self.deadline = None if policy.deadline_s is None else time.monotonic() + policy.deadline_s

    async def backoff(self, error: BaseException, stop: asyncio.Event | None = None) -> bool:
        """Count a failure; False when the policy gives up, else wait and return True.

        The caller decides whether ``error`` is transient (``policy.is_transient``) and what
        to raise on False: normally ``error`` itself. Setting ``stop`` ends the wait early.
        """
        self.failures += 1
        policy = self.policy
        if policy.max_attempts is not None and self.failures >= policy.max_attempts:
            return False
        delay = policy.backoff.delay(self.failures)
        if self.deadline is not None and time.monotonic() + delay > self.deadline:
            return False
        if policy.on_retry is not None:
            policy.on_retry(RetryEvent(self.failures, error, delay))
        if stop is None:
            await policy.sleep(delay)
        else:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
        return True


__all__ = ["Backoff", "Retry", "RetryEvent", "RetryState"]
