"""REST ``updateTable`` and ``commitTransaction`` semantics over any catalog's conditional swap.

A REST commit is a list of requirements (assertions about the table the client read) and a
list of updates (changes to apply). The server checks the requirements against the table's
*current* metadata, applies the updates to it and swaps the pointer on condition that the
table did not move meanwhile. When the swap loses (the coordinator, or another client,
committed first), the commit is not lost and not blindly retried: the table is re-read, the
requirements are checked again against the winner's metadata, and only if they still hold
are the updates applied again and the swap retried. A requirement that no longer holds is a
:class:`CommitFailedError` the client sees (HTTP 409), with nothing applied. This is how
icefloe's REST writes and the coordinator's batches meet at one swap without either losing
the other's changes.

Creates through a commit (``assert-create``, the second half of a staged create) build the
first metadata from the updates alone and create the pointer if absent.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from icefloe.errors import (
    AlreadyExistsError,
    CommitFailedError,
    NotFoundError,
    UnsupportedOperationError,
    ValidationError,
)
from icefloe.retry import Retry, RetryEvent
from icefloe.spec.metadata import TableMetadata
from icefloe.table.catalog import Catalog, Table, TableChange, TableIdentifier
from icefloe.table.commit import CommitStats, RetryPolicy
from icefloe.table.commit_index import check_snapshot_removal
from icefloe.table.dedup_ledger import LEDGER_PROPERTY
from icefloe.table.requirements import (
    AssertCreate,
    TableRequirement,
    parse_table_requirement,
    validate_requirements,
)
from icefloe.table.updates import (
    RemovePropertiesUpdate,
    RemoveSnapshotsUpdate,
    SetPropertiesUpdate,
    TableUpdate,
    apply_updates,
    parse_table_update,
)

log = logging.getLogger(__name__)

# Server-side retries of a lost swap: short waits, since a client is waiting on the answer.
DEFAULT_POLICY = RetryPolicy(num_retries=8, min_wait_ms=5, max_wait_ms=500, total_timeout_ms=60_000)


@dataclass(frozen=True, slots=True)
class TableCommit:
    """One table's requirements and updates, parsed and validated."""

    identifier: TableIdentifier
    requirements: tuple[TableRequirement, ...]
    updates: tuple[TableUpdate, ...]

    @classmethod
    def parse(cls, identifier: TableIdentifier, requirements: Any, updates: Any) -> TableCommit:
        """ValidationError naming the first unknown or malformed requirement or update."""
        if not isinstance(requirements, list):
            raise ValidationError(f"'requirements' must be a list, got {requirements!r:.100}")
        if not isinstance(updates, list):
            raise ValidationError(f"'updates' must be a list, got {updates!r:.100}")
        return cls(
            identifier,
            tuple(parse_table_requirement(r) for r in requirements),
            tuple(parse_table_update(u) for u in updates),
        )

    @property
    def creates(self) -> bool:
        return any(isinstance(r, AssertCreate) for r in self.requirements)


@dataclass(frozen=True, slots=True)
class CommitOutcome:
    """What a commit did to one table: ``base_location`` None means it created the table."""

    table: Table
    base_location: str | None
    changed: bool


async def _base(catalog: Catalog, commit: TableCommit) -> Table | None:
    try:
        return await catalog.load_table(commit.identifier)
    except NotFoundError:
        if commit.creates:
            return None
        raise NotFoundError(f"table {commit.identifier} does not exist") from None


def _keeps_dedup_evidence(commit: TableCommit, metadata: TableMetadata) -> None:
    """Refuse updates that would drop icefloe's dedup evidence (:mod:`icefloe.table.commit_index`):
    removing a snapshot that records commit ids inside the dedup window, or removing or
    replacing the dedup ledger that carries them forward. Other engines may still do so
    behind icefloe's back; icefloe's own catalog does not."""
    for update in commit.updates:
        if isinstance(update, RemoveSnapshotsUpdate):
            check_snapshot_removal(
                metadata, update.snapshot_ids, int(time.time() * 1000), commit.identifier
            )
        elif (
            isinstance(update, RemovePropertiesUpdate) and LEDGER_PROPERTY in update.removals
        ) or (isinstance(update, SetPropertiesUpdate) and LEDGER_PROPERTY in update.updates):
            raise ValidationError(
                f"table {commit.identifier}: {LEDGER_PROPERTY} is icefloe's dedup ledger (the "
                "commit ids of the dedup window, kept by the coordinator); it cannot be "
                "removed or set by a client"
            )


def _build(commit: TableCommit, base: Table | None, attempt: int) -> TableChange:
    metadata = base.metadata if base is not None else None
    validate_requirements(metadata, commit.requirements)
    if metadata is not None:
        _keeps_dedup_evidence(commit, metadata)
    try:
        new = apply_updates(
            metadata, commit.updates, base.metadata_location if base is not None else None
        )
    except ValidationError as e:
        if attempt == 0:
            raise
        # The updates applied to the metadata the client read (the first attempt would have
        # built it otherwise); they no longer apply to what was committed since.
        raise CommitFailedError(
            f"table {commit.identifier} changed concurrently and the updates no longer "
            f"apply to it: {e}"
        ) from e
    return TableChange(commit.identifier, base, new)


async def commit_table_changes(
    catalog: Catalog,
    commits: Sequence[TableCommit],
    policy: RetryPolicy = DEFAULT_POLICY,
    stats: CommitStats | None = None,
    check: Callable[[TableChange], Awaitable[None]] | None = None,
) -> list[CommitOutcome]:
    """Check, apply and swap every commit together (one table, or several atomically).

    ``check`` sees each table's change before the swap (a REST catalog refuses files and
    locations the table may not own there); whatever it raises is raised, nothing written.

    Raises NotFoundError for a missing table, ValidationError for updates that cannot apply,
    CommitFailedError when a requirement fails (now or after a lost swap, re-checked), and
    CommitStateUnknownError only when the store cannot tell whether the swap happened.
    """
    if len({c.identifier for c in commits}) != len(commits):
        raise ValidationError("a transaction names the same table more than once")
    if len(commits) > 1 and not catalog.supports_multi_table_commits:
        # Refuse before anything is written, not after the first table has been committed.
        raise UnsupportedOperationError(
            f"catalog {catalog.name!r} ({type(catalog).__name__}) cannot commit "
            f"{len(commits)} tables atomically; commit them one at a time"
        )
    stats = stats if stats is not None else CommitStats()

    def lost(event: RetryEvent) -> None:
        log.info("REST commit lost a swap (attempt %d): %s", event.failures, event.error)

    # Lost swaps only, and no deadline: the REST client waits for the answer.
    swaps = Retry(policy.backoff, max_attempts=policy.num_retries + 1, on_retry=lost).start()
    while True:
        stats.attempts += 1
        bases = [await _base(catalog, c) for c in commits]
        changes = [_build(c, b, swaps.failures) for c, b in zip(commits, bases, strict=True)]
        pending = [
            ch for ch in changes if ch.base is None or ch.new_metadata is not ch.base.metadata
        ]
        if check is not None:
            for change in pending:
                await check(change)
        try:
            committed = await catalog.commit_tables(pending) if pending else []
        except (CommitFailedError, AlreadyExistsError) as e:
            stats.conflicts += 1
            if not await swaps.backoff(e):
                raise CommitFailedError(
                    f"gave up after {swaps.failures} lost swaps (the tables are committed to "
                    f"concurrently): {e}"
                ) from e
            continue
        by_ident = {t.identifier: t for t in committed}
        return [
            CommitOutcome(
                by_ident.get(ch.identifier) or ch.base,  # type: ignore[arg-type]
                ch.base.metadata_location if ch.base is not None else None,
                ch.identifier in by_ident,
            )
            for ch in changes
        ]
