"""Optimistic commits with retry: build on the latest base, swap, and on conflict do it again.

The policy follows the table properties Java and PyIceberg honour
(``commit.retry.num-retries``, ``commit.retry.min-wait-ms``, ``commit.retry.max-wait-ms``,
``commit.retry.total-timeout-ms``) with jittered exponential backoff, so many committers do
not retry in lock step.

An unknown outcome (the store may or may not have applied the swap) is never retried
blindly: the table is reloaded and asked whether the attempt's own marker (normally its
snapshot id) is already there. Only a definite "no" leads to another attempt.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace

from icefloe.errors import CommitFailedError, CommitStateUnknownError, IcefloeError
from icefloe.retry import Backoff, Retry, RetryEvent
from icefloe.spec.metadata import TableMetadata
from icefloe.table.catalog import Catalog, Table

log = logging.getLogger(__name__)

NUM_RETRIES = "commit.retry.num-retries"
MIN_WAIT_MS = "commit.retry.min-wait-ms"
MAX_WAIT_MS = "commit.retry.max-wait-ms"
TOTAL_TIMEOUT_MS = "commit.retry.total-timeout-ms"


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """A table's ``commit.retry.*`` properties; :meth:`retry` is the policy they make."""

    num_retries: int = 4
    min_wait_ms: int = 100
    max_wait_ms: int = 60_000
    total_timeout_ms: int = 1_800_000

    @classmethod
    def from_properties(cls, props: Mapping[str, str]) -> RetryPolicy:
        def get(key: str, default: int) -> int:
            raw = props.get(key)
            if raw is None:
                return default
            try:
                value = int(raw)
            except ValueError:
                raise IcefloeError(f"table property {key}={raw!r} is not an integer") from None
            if value < 0:
                raise IcefloeError(f"table property {key}={raw!r} must not be negative")
            return value

        d = cls()
        return cls(
            get(NUM_RETRIES, d.num_retries),
            get(MIN_WAIT_MS, d.min_wait_ms),
            get(MAX_WAIT_MS, d.max_wait_ms),
            get(TOTAL_TIMEOUT_MS, d.total_timeout_ms),
        )

    @property
    def backoff(self) -> Backoff:
        """Full jitter: uniform in [min, min(max, min * 2**attempt)] (icefloe.retry)."""
        return Backoff(self.min_wait_ms / 1000.0, self.max_wait_ms / 1000.0)

    def retry(self) -> Retry:
        """This policy as an :class:`icefloe.retry.Retry`: ``num_retries`` retries within
        ``total_timeout_ms``."""
        return Retry(
            self.backoff,
            max_attempts=self.num_retries + 1,
            deadline_s=self.total_timeout_ms / 1000.0,
        )


@dataclass(slots=True)
class CommitStats:
    attempts: int = 0
    conflicts: int = 0
    unknown_outcomes: int = 0


Builder = Callable[[Table], Awaitable[TableMetadata]]
AlreadyApplied = Callable[[Table], bool]


async def commit_with_retry(
    catalog: Catalog,
    table: Table,
    build: Builder,
    already_applied: AlreadyApplied,
    *,
    policy: RetryPolicy | None = None,
    stats: CommitStats | None = None,
) -> Table:
    """Commit ``build(base)`` through ``catalog``, rebuilding on a fresh base after conflicts.

    ``build`` must be safe to call again on a newer base (and raise ValidationConflictError
    when the change no longer applies); ``already_applied`` recognises the change in a
    reloaded table, which is how an unknown outcome is resolved.
    """
    policy = policy or RetryPolicy.from_properties(table.metadata.properties)
    stats = stats if stats is not None else CommitStats()
    ident = table.identifier

    def conflicted(event: RetryEvent) -> None:
        log.info("commit to %s conflicted (attempt %d): %s", ident, event.failures, event.error)

    conflicts = replace(policy.retry(), on_retry=conflicted).start()
    while True:
        stats.attempts += 1
        new_metadata = await build(table)
        try:
            return await catalog.commit(table, new_metadata)
        except CommitFailedError as e:
            stats.conflicts += 1
            failure: IcefloeError = e
        except CommitStateUnknownError as e:
            stats.unknown_outcomes += 1
            failure = e
            # Reload until the store answers: no attempt limit, the operation's deadline.
            assert conflicts.deadline is not None
            left_s = max(0.0, conflicts.deadline - time.monotonic())
            reloads = Retry(policy.backoff, deadline_s=left_s)
            resolved = await _resolve_unknown(catalog, table, already_applied, reloads)
            if resolved is not None:
                return resolved
        if not await conflicts.backoff(failure):
            raise failure
        table = await catalog.load_table(ident)
        if already_applied(table):
            return table


async def _resolve_unknown(
    catalog: Catalog, table: Table, already_applied: AlreadyApplied, reloads: Retry
) -> Table | None:
    """Reload until the store answers; the committed table if our change is in it, else None."""
    try:
        fresh = await reloads.call(lambda: catalog.load_table(table.identifier))
    except Exception as e:
        raise CommitStateUnknownError(
            f"cannot tell whether the commit to {table.identifier} happened: {e}"
        ) from e
    return fresh if already_applied(fresh) else None
