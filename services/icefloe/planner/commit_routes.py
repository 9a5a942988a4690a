"""Table commits through the REST catalog: ``updateTable`` and ``commitTransaction``.

Requirements are checked and updates applied by :mod:`icefloe.table.changes` through the
catalog's conditional swap, re-checked after every lost swap, so REST commits and
coordinator batches never lose each other's changes. A failed requirement is 409
``CommitFailedException`` with nothing applied; 500 ``CommitStateUnknownException`` only
when the store cannot say whether the swap happened. Transactions of several tables are
atomic on catalogs with multi-key writes (Redis, DynamoDB) and 406 elsewhere, before
anything is written. The new metadata of every commit obeys the location policy and holds
maintenance properties maintenance can read, checked before the swap.
"""

from __future__ import annotations

import weakref
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter

from icefloe.errors import NotFoundError, ValidationError
from icefloe.planner.attempt_outcomes import metadata_digest, noted_outcomes
from icefloe.planner.auth import audit, principal_of
from icefloe.planner.catalog_writes import CatalogWrites
from icefloe.planner.errors import ApiError, bad_request
from icefloe.planner.idempotency import Attempt, attempt_of
from icefloe.planner.load_result import table_etag
from icefloe.planner.write_config import RestCatalogSettings
from icefloe.planner.write_requests import (
    CommitTableRequest,
    CommitTransactionRequest,
    identifier_of,
    path_table,
    read_body,
    snapshot_id_of,
)
from icefloe.table.catalog import TableChange, TableIdentifier
from icefloe.table.changes import DEFAULT_POLICY, CommitOutcome, TableCommit, commit_table_changes
from icefloe.table.commit import CommitStats, RetryPolicy
from icefloe.table.maintenance_policy import check_policy_change

_LOST_SWAPS: weakref.WeakKeyDictionary[CollectorRegistry, Counter] = weakref.WeakKeyDictionary()


def _lost_swaps_counter(registry: CollectorRegistry) -> Counter:
    """One counter per registry, however often the service builds its app."""
    counter = _LOST_SWAPS.get(registry)
    if counter is None:
        counter = _LOST_SWAPS[registry] = Counter(
            "icefloe_rest_lost_swaps",
            "REST commits whose swap lost to another committer and were re-checked",
            registry=registry,
        )
    return counter


class CommitRoutes:
    """The commit handlers, retrying lost swaps by the REST settings' policy."""

    def __init__(
        self, writes: CatalogWrites, settings: RestCatalogSettings, registry: CollectorRegistry
    ) -> None:
        self.writes = writes
        self.service = writes.service
        self.catalog = writes.catalog
        self.locations = writes.locations
        self.tables_by_location = writes.tables_by_location
        self.policy = RetryPolicy(
            num_retries=settings.commit_retries,
            min_wait_ms=DEFAULT_POLICY.min_wait_ms,
            max_wait_ms=DEFAULT_POLICY.max_wait_ms,
            total_timeout_ms=DEFAULT_POLICY.total_timeout_ms,
        )
        self.stats = CommitStats()
        self._lost_swaps = _lost_swaps_counter(registry)

    def _commit(self, ident: TableIdentifier, body: CommitTableRequest) -> TableCommit:
        try:
            return TableCommit.parse(ident, body.requirements, body.updates)
        except ValidationError as e:
            raise bad_request(f"commit to {ident}: {e}") from None

    async def _check_change(self, change: TableChange) -> None:
        """The new metadata of a commit obeys the location policy, and its maintenance
        properties hold values maintenance can read (before the swap)."""
        base = change.base.metadata if change.base is not None else None
        await self.locations.check_commit(
            self.catalog.io, self.service.cache, base, change.new_metadata, str(change.identifier)
        )
        if base is None or base.location != change.new_metadata.location:
            await self.writes.refuse_overlap(change.identifier, change.new_metadata.location)
        await check_policy_change(change)  # maintenance properties it can read

    async def _run(
        self, commits: list[TableCommit], attempt: Attempt | None
    ) -> list[CommitOutcome]:
        """The commits' outcomes: those of an earlier attempt with the request's
        Idempotency-Key when it committed before it stopped
        (:mod:`icefloe.planner.attempt_outcomes`), else of committing them now, noted for a
        later attempt before the swap."""
        for commit in commits:
            if not commit.creates:
                await self.writes.namespace_or_404(
                    commit.identifier.namespace, "NoSuchTableException"
                )
        if attempt is not None and attempt.prior is not None:
            earlier = await noted_outcomes(self.catalog, commits, attempt.prior)
            if earlier is not None:
                return earlier
        noted: dict[str, Any] = {}

        async def check(change: TableChange) -> None:
            await self._check_change(change)
            if attempt is None:
                return
            if str(change.identifier) in noted:  # checked again: a new swap after a lost one
                noted.clear()
            noted[str(change.identifier)] = {
                "base": change.base.metadata_location if change.base is not None else None,
                "digest": metadata_digest(change.new_metadata),
            }
            await attempt.note({"commits": noted})

        stats = CommitStats()
        try:
            return await commit_table_changes(
                self.catalog, commits, self.policy, stats, check=check
            )
        except NotFoundError as e:  # the spec's one 404 of updateTable and commitTransaction
            raise ApiError(404, "NoSuchTableException", str(e)) from None
        finally:
            self._lost_swaps.inc(stats.conflicts)
            self.stats.attempts += stats.attempts
            self.stats.conflicts += stats.conflicts

    async def _index_commit(self, commit: TableCommit, outcome: CommitOutcome) -> None:
        """A created or relocated table's entry in the location index."""
        table = outcome.table
        if outcome.base_location is None:
            await self.writes.claim_new(table)
        elif outcome.changed and any(u.action == "set-location" for u in commit.updates):
            base = await self.catalog.read_metadata(outcome.base_location)
            await self.tables_by_location.moved(
                (base.location, table.identifier), (table.location, table.identifier)
            )

    def _audit_commit(
        self, request: web.Request, operation: str, commit: TableCommit, outcome: CommitOutcome
    ) -> None:
        if outcome.changed:
            self.writes.seen(outcome.table)
        audit(
            principal_of(request),
            operation,
            status=200 if operation == "updateTable" else 204,
            table=str(commit.identifier),
            updates=[u.action for u in commit.updates],
            created=outcome.base_location is None or None,
            changed=outcome.changed,
            **{
                "snapshot-id": snapshot_id_of(outcome.table.metadata),
                "metadata-location": outcome.table.metadata_location,
                "previous-metadata-location": outcome.base_location,
            },
        )

    async def update_table(self, request: web.Request) -> web.StreamResponse:
        ident = path_table(request)
        body = await read_body(request, CommitTableRequest)
        if body.identifier is not None and identifier_of(body.identifier) != ident:
            raise bad_request(
                f"the body names table {identifier_of(body.identifier)}, the path {ident}"
            )
        commit = self._commit(ident, body)
        (outcome,) = await self._run([commit], attempt_of(request))
        await self._index_commit(commit, outcome)
        self._audit_commit(request, "updateTable", commit, outcome)
        return web.json_response(
            {
                "metadata-location": outcome.table.metadata_location,
                "metadata": outcome.table.metadata.to_json(),
            },
            headers={"ETag": table_etag(outcome.table.metadata_location)},
        )

    async def commit_transaction(self, request: web.Request) -> web.StreamResponse:
        body = await read_body(request, CommitTransactionRequest)
        commits = []
        for change in body.table_changes:
            if change.identifier is None:
                raise bad_request("every table change of a transaction needs its 'identifier'")
            commits.append(self._commit(identifier_of(change.identifier), change))
        outcomes = await self._run(commits, attempt_of(request))
        for commit, outcome in zip(commits, outcomes, strict=True):
            await self._index_commit(commit, outcome)
            self._audit_commit(request, "commitTransaction", commit, outcome)
        return web.Response(status=204)
