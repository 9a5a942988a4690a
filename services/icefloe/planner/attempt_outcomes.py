"""Answering for an earlier attempt of an ``Idempotency-Key`` request that stopped after it
committed (:mod:`icefloe.planner.idempotency`).

A replica can die between its pointer swap and storing the answer. The retry that takes the
key over must not run the operation again (a second commit, or a 409 for a commit that
happened), so before its swap an attempt notes each table's base metadata location and a
digest of the metadata it swaps in (a create: of the first metadata). The attempt that takes
over reads the note and looks at the metadata that followed the base in the table's log:
the noted digest means the earlier attempt committed, and it answers for it; another means
it did not; a base no longer in the log (or a transaction half visible) leaves the outcome
unknown, which is a 500 ``CommitStateUnknown`` that is not stored.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

from icefloe.errors import CommitStateUnknownError, NotFoundError
from icefloe.planner.idempotency import Attempt
from icefloe.spec.metadata import TableMetadata
from icefloe.table.catalog import Catalog, Table, TableIdentifier
from icefloe.table.changes import CommitOutcome, TableCommit

log = logging.getLogger(__name__)


def metadata_digest(metadata: TableMetadata) -> str:
    """What an attempt notes of the metadata it swaps in (see the module docstring)."""
    return hashlib.sha256(metadata.to_json_bytes()).hexdigest()


async def noted_outcomes(
    catalog: Catalog, commits: list[TableCommit], prior: dict[str, Any]
) -> list[CommitOutcome] | None:
    """What an earlier attempt of the same request did, from the note it left before its
    swap (each table's base metadata location and a digest of its new metadata): the
    outcomes, with the tables as they are now, if it committed; None if it did not (nothing
    noted, or the metadata after its base is another writer's, or there is none).

    Its swap moved every noted table or none (multi-table swaps are atomic), so a mix, or
    a base no longer in a table's metadata log, leaves the outcome unknown.
    """
    noted = prior.get("commits")
    if not isinstance(noted, dict) or not noted:
        return None
    outcomes: list[CommitOutcome] = []
    found: set[bool] = set()
    for commit in commits:
        try:
            table = await catalog.load_table(commit.identifier)
        except NotFoundError:
            if commit.creates:
                found.add(False)
                continue
            raise
        note = noted.get(str(commit.identifier))
        if not isinstance(note, dict):  # nothing to change in that table then
            outcomes.append(CommitOutcome(table, table.metadata_location, False))
            continue
        base = note.get("base")
        found.add(await noted_successor(catalog, table, base, note.get("digest")))
        outcomes.append(CommitOutcome(table, base, True))
    if found == {True}:
        log.info("an earlier attempt committed %s; answering for it", sorted(noted))
        return outcomes
    if found <= {False}:
        return None
    raise CommitStateUnknownError(
        "an earlier attempt of this request left its tables partly committed, which an "
        "atomic commit cannot; reload them before retrying with a new Idempotency-Key"
    )


async def noted_successor(catalog: Catalog, table: Table, base: str | None, digest: Any) -> bool:
    """Whether the metadata that followed ``base`` in ``table``'s history (its first, when
    ``base`` is None) has ``digest``: the noted commit (or create) is the one that happened."""
    chain = [e.metadata_file for e in table.metadata.metadata_log]
    chain.append(table.metadata_location)
    if base is not None and base not in chain:
        raise CommitStateUnknownError(
            f"an earlier attempt of this request may have committed {table.identifier}, and "
            "its metadata log no longer reaches back to tell; reload the table before "
            "retrying with a new Idempotency-Key"
        )
    after = chain.index(base) + 1 if base is not None else 0
    if after >= len(chain):
        return False
    successor = chain[after]
    metadata = (
        table.metadata
        if successor == table.metadata_location
        else await catalog.read_metadata(successor)
    )
    return metadata_digest(metadata) == digest


async def noted_create(
    catalog: Catalog, ident: TableIdentifier, attempt: Attempt | None
) -> Table | None:
    """The table an earlier attempt of this createTable made before it stopped, if it did
    (its first metadata is the one that attempt noted)."""
    prior = attempt.prior if attempt is not None else None
    if prior is None or prior.get("create") != str(ident):
        return None
    try:
        table = await catalog.load_table(ident)
    except NotFoundError:
        return None
    if not await noted_successor(catalog, table, None, prior.get("digest")):
        return None
    log.info("an earlier attempt created %s; answering for it", ident)
    return table
