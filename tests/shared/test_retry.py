"""The one retry utility (icefloe.retry): its backoff law and its ways of giving up."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.hypothesis_budget import examples

from icefloe.retry import Backoff, Retry, RetryEvent

delays = st.floats(0, 3600, allow_nan=False, allow_infinity=False)


@settings(max_examples=examples(300))
@given(base=delays, maximum=delays, retry=st.integers(-3, 2000), jitter=st.booleans())
def test_delays_stay_within_floor_and_ceiling(
    base: float, maximum: float, retry: int, jitter: bool
) -> None:
    backoff = Backoff(base, maximum, jitter)
    ceiling = backoff.ceiling(retry)
    assert ceiling >= base
    assert ceiling <= max(base, maximum)
    delay = backoff.delay(retry)
    assert base <= delay <= ceiling
    if not jitter:
        assert delay == ceiling


@settings(max_examples=examples(200))
@given(base=delays, maximum=delays, retry=st.integers(0, 200))
def test_ceilings_never_decrease(base: float, maximum: float, retry: int) -> None:
    backoff = Backoff(base, maximum)
    assert backoff.ceiling(retry) <= backoff.ceiling(retry + 1)


def test_ceilings_double_up_to_the_maximum() -> None:
    backoff = Backoff(0.1, 1.0, jitter=False)
    assert [backoff.delay(n) for n in range(1, 6)] == pytest.approx([0.2, 0.4, 0.8, 1.0, 1.0])


def test_negative_delays_are_refused() -> None:
    with pytest.raises(ValueError, match="negative"):
        Backoff(-1.0, 1.0)
    with pytest.raises(ValueError, match="max_attempts"):
        Retry(Backoff(0, 0), max_attempts=0)


class Clock:
    """Sleeps that record their delay and take no time."""

    def __init__(self) -> None:
        self.slept: list[float] = []

    async def sleep(self, delay: float) -> None:
        self.slept.append(delay)


class Flaky:
    def __init__(self, failures: int, error: type[Exception] = ConnectionError) -> None:
        self.failures = failures
        self.error = error
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error(f"failure {self.calls}")
        return "done"


async def test_call_retries_transient_errors_until_success() -> None:
    clock = Clock()
    seen: list[RetryEvent] = []
    policy = Retry(
        Backoff(0.1, 10.0, jitter=False),
        transient=(ConnectionError,),
        on_retry=seen.append,
        sleep=clock.sleep,
    )
    action = Flaky(3)
    assert await policy.call(action) == "done"
    assert action.calls == 4
    assert clock.slept == pytest.approx([0.2, 0.4, 0.8])
    assert [e.failures for e in seen] == [1, 2, 3]
    assert [e.delay_s for e in seen] == clock.slept
    assert all(isinstance(e.error, ConnectionError) for e in seen)


async def test_other_errors_are_raised_at_once() -> None:
    clock = Clock()
    policy = Retry(Backoff(0.1, 1.0), transient=(ConnectionError,), sleep=clock.sleep)
    action = Flaky(1, KeyError)
    with pytest.raises(KeyError):
        await policy.call(action)
    assert action.calls == 1 and clock.slept == []


async def test_permanent_errors_win_over_transient_ones() -> None:
    class Refused(ConnectionError):
        pass

    policy = Retry(
        Backoff(0, 0), transient=(ConnectionError,), permanent=(Refused,), sleep=Clock().sleep
    )
    action = Flaky(1, Refused)
    with pytest.raises(Refused):
        await policy.call(action)
    assert action.calls == 1
    assert not policy.is_transient(asyncio.CancelledError())


async def test_max_attempts_counts_the_first_attempt() -> None:
    clock = Clock()
    policy = Retry(Backoff(0.01, 0.01), max_attempts=3, sleep=clock.sleep)
    action = Flaky(5)
    with pytest.raises(ConnectionError, match="failure 3"):
        await policy.call(action)
    assert action.calls == 3 and len(clock.slept) == 2


async def test_a_wait_past_the_deadline_is_not_started() -> None:
    clock = Clock()
    policy = Retry(Backoff(1.0, 1.0), deadline_s=2.5, sleep=clock.sleep)
    action = Flaky(10)
    # Sleeps take no time here, so the deadline only ever refuses a wait longer than it.
    assert await policy.call(action) == "done"
    policy = Retry(Backoff(3.0, 3.0), deadline_s=2.5, sleep=clock.sleep)
    action = Flaky(10)
    with pytest.raises(ConnectionError, match="failure 1"):
        await policy.call(action)


async def test_on_retry_aborts_by_raising() -> None:
    class Lost(Exception):
        pass

    def abort(event: RetryEvent) -> None:
        raise Lost() from event.error

    policy = Retry(Backoff(0, 0), on_retry=abort, sleep=Clock().sleep)
    with pytest.raises(Lost):
        await policy.call(Flaky(1))


async def test_state_backoff_serves_hand_written_loops() -> None:
    clock = Clock()
    state = Retry(Backoff(0.5, 0.5), max_attempts=2, sleep=clock.sleep).start()
    assert await state.backoff(ValueError("one"))
    assert state.failures == 1
    assert not await state.backoff(ValueError("two"))
    assert clock.slept == [0.5]


async def test_forever_until_cancelled() -> None:
    started = asyncio.Event()

    async def never() -> None:
        started.set()
        raise ConnectionError("down")

    task = asyncio.ensure_future(Retry(Backoff(0.001, 0.01)).call(never))
    await started.wait()
    await asyncio.sleep(0.05)
    assert not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_run_until_repeats_backs_off_and_stops() -> None:
    stop = asyncio.Event()
    seen: list[RetryEvent] = []
    calls = 0

    async def poll() -> None:
        nonlocal calls
        calls += 1
        if calls in (2, 3):
            raise ConnectionError(f"poll {calls}")
        if calls == 5:
            stop.set()

    policy = Retry(Backoff(0.001, 0.002, jitter=False), on_retry=seen.append)
    await policy.run_until(stop, poll)
    assert calls == 5
    assert [(e.failures, str(e.error)) for e in seen] == [(1, "poll 2"), (2, "poll 3")]


async def test_run_until_ends_a_wait_when_stopped() -> None:
    stop = asyncio.Event()

    async def down() -> None:
        asyncio.get_running_loop().call_later(0.01, stop.set)
        raise ConnectionError("down")

    policy = Retry(Backoff(3600.0, 3600.0))
    await policy.run_until(stop, down)
    assert stop.is_set()
