"""Compaction the coordinator runs itself, between its own commits to a table.

Upserts leave a table of many small data files, each with a deletion vector (v3) or
position deletes (v2) that every reader applies: after 200 upsert commits DuckDB read such a
table 11x slower, PyIceberg 16x, than the same rows appended once. Compaction fixes that,
but an engine's compaction (Spark, Java) races the table's upserts: each upsert adds deletes
to the very files a compaction replaces, so one of the two must fail validation and retry,
forever under a steady change stream.

The coordinator is the one committer of the table's upserts, so it can compact without that
race: the table's worker runs :meth:`TableCompactor.maybe_compact` right after each of its
commits, in the same task, so no upsert of this coordinator is ever resolved or committed
while a rewrite is in flight (an upsert never loses to a compaction, and the compaction
never loses to an upsert). The rewrite itself is engine-free (:mod:`icefloe.table.rewrite`): the
plan of :mod:`icefloe.table.compaction`, a group at a time, CPU work in worker threads, committed
as one ``replace`` snapshot validated from the planned snapshot, so a delete another engine
(Java's MERGE or DELETE, PyIceberg) committed on a replaced file meanwhile aborts the
rewrite, never the other writer; the next visit plans again.

In the same step the key index learns where the moved rows are: the new files' keys (read
from the bytes just written) are staged and the index is synced to the new head, which
forgets the replaced files, then checkpointed. A crash anywhere leaves at most unreferenced
files: before the swap the table is unchanged; after it a checkpoint may still name the
replaced files, but an index only ever says which files' keys it holds and is synced to the
live files before any lookup, so it never resolves a key to a removed file.

When (table properties; every check but the last is read from the head snapshot's summary,
so the check after each commit costs no I/O):

================================================  ============  ============================
property                                          default       meaning
================================================  ============  ============================
``icefloe.compaction.auto.enabled``               ``true``      compact in the coordinator
``icefloe.maintenance.compaction.deleted-row-ratio``  0.3       when this share of stored
                                                                rows is deleted (any table)
``icefloe.compaction.auto.min-new-files``         10            or, on keyed tables, when
                                                                this many data files were
                                                                added since the last rewrite
``icefloe.compaction.auto.max-bytes-per-run``     256 MiB       input bytes one run rewrites
                                                                (at least one file group)
================================================  ============  ============================

On by default: without it the read cost of an upsert table grows with every commit, the
rewrite needs no engine, and it is the only compaction that cannot conflict with the
table's upserts. The new-files trigger is for keyed tables only, because every upsert adds
a small file there; append-only tables keep their small files for the scheduled Spark job
(``icefloe.spark.compact``) unless their deletes pile up. What is rewritten is the plan's
(:mod:`icefloe.table.compaction`: small files, files with deletes, oversized files, bin-packed to
``write.target-file-size-bytes``). A run is bounded by ``max-bytes-per-run`` so the table's
upserts wait at most that long; a backlog is worked off one run per commit. After a run that
finds nothing it can rewrite (say, only equality deletes, which need the Spark job) or fails,
the table is not planned again for a while (doubling from 30 s to 10 min; after a plan with
nothing to rewrite, for ``min-new-files`` commits), so a table compaction cannot help costs
one summary check per commit.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from icefloe.coordinator.committer import TableCommitter
from icefloe.errors import ValidationConflictError, ValidationError
from icefloe.key_index import key_schema
from icefloe.spec.metadata import TableMetadata
from icefloe.spec.snapshot import MAIN_BRANCH, Operation, Summary
from icefloe.table.compaction import plan_compaction
from icefloe.table.maintenance_policy import MaintenancePolicy
from icefloe.table.rewrite import SUMMARY_REWRITE, RewriteResult, rewrite_and_commit, select_groups

log = logging.getLogger(__name__)

AUTO_ENABLED = "icefloe.compaction.auto.enabled"
AUTO_MIN_NEW_FILES = "icefloe.compaction.auto.min-new-files"
AUTO_MAX_BYTES_PER_RUN = "icefloe.compaction.auto.max-bytes-per-run"
MIN_NEW_FILES_DEFAULT = 10
MAX_BYTES_PER_RUN_DEFAULT = 256 * 2**20
_QUIET_S = 30.0
_QUIET_MAX_S = 600.0
# How far back the new-files count looks (beyond it the table is due anyway).
_WALK_LIMIT = 1000


@dataclass(frozen=True, slots=True)
class AutoCompactionPolicy:
    """When the coordinator compacts a table (see the module docs for the properties)."""

    enabled: bool = True
    deleted_row_ratio: float = 0.3
    min_new_files: int = MIN_NEW_FILES_DEFAULT
    max_bytes_per_run: int = MAX_BYTES_PER_RUN_DEFAULT

    @classmethod
    def for_table(cls, metadata: TableMetadata) -> AutoCompactionPolicy:
        raw = metadata.properties.get(AUTO_ENABLED, "true").strip().lower()
        if raw not in ("true", "false"):
            raise ValidationError(
                f"table property {AUTO_ENABLED!r} must be true or false, got {raw!r}"
            )
        min_new = metadata.int_property(AUTO_MIN_NEW_FILES, MIN_NEW_FILES_DEFAULT)
        max_bytes = metadata.int_property(AUTO_MAX_BYTES_PER_RUN, MAX_BYTES_PER_RUN_DEFAULT)
        for key, value in ((AUTO_MIN_NEW_FILES, min_new), (AUTO_MAX_BYTES_PER_RUN, max_bytes)):
            if value < 1:
                raise ValidationError(f"table property {key!r} must be at least 1, got {value}")
        return cls(
            enabled=raw == "true",
            deleted_row_ratio=MaintenancePolicy.for_table(metadata).compaction_deleted_row_ratio,
            min_new_files=min_new,
            max_bytes_per_run=max_bytes,
        )


def compaction_due(metadata: TableMetadata, policy: AutoCompactionPolicy) -> str | None:
    """Why the table's main branch should be compacted now, or None; from snapshot
    summaries only (no manifest is read)."""
    if not policy.enabled:
        return None
    head = metadata.snapshot_by_ref(MAIN_BRANCH)
    if head is None or head.summary is None:
        return None
    records = _count(head.summary, Summary.TOTAL_RECORDS)
    deleted = _count(head.summary, Summary.TOTAL_POSITION_DELETES)
    if deleted and records and deleted / records >= policy.deleted_row_ratio:
        return (
            f"{deleted} of {records} stored rows are deleted (ratio {deleted / records:.3f}, "
            f"compacts from {policy.deleted_row_ratio})"
        )
    if not metadata.schema().identifier_field_ids:
        return None
    added = 0
    for walked, snapshot in enumerate(metadata.ancestors_of(head.snapshot_id)):
        summary = snapshot.summary
        if summary is None or walked >= _WALK_LIMIT:
            break
        if SUMMARY_REWRITE in summary or summary.operation == Operation.REPLACE:
            break
        added += _count(summary, Summary.ADDED_DATA_FILES)
        if added >= policy.min_new_files:
            return f"{added} data files added since the last rewrite (compacts from " + (
                f"{policy.min_new_files})"
            )
    return None


def compacts_itself(metadata: TableMetadata) -> bool:
    """Whether the coordinator compacts this table between its own commits, so that no engine
    should be asked to: a keyed table with auto compaction on. An engine's rewrite of such a
    table races its upserts (each upsert adds deletion vectors to the files being rewritten)
    and loses to them; the coordinator's never does. A table whose property is unreadable is
    left to the engines, as the compactor leaves it alone too."""
    if not metadata.schema().identifier_field_ids:
        return False
    try:
        return AutoCompactionPolicy.for_table(metadata).enabled
    except ValidationError:
        return False


def _count(summary: Summary, key: str) -> int:
    try:
        return int(summary.get(key) or 0)
    except ValueError:
        return 0


class TableCompactor:
    """Compacts the table of one committer, run by its worker between commits."""

    def __init__(self, committer: TableCommitter) -> None:
        self.committer = committer
        self.quiet_until = 0.0
        self.quiet_s = _QUIET_S
        self.skip_commits = 0
        self.runs = 0

    async def maybe_compact(self) -> RewriteResult | None:
        """One bounded compaction run if the table's policy asks for one now; never raises
        but for cancellation (a failure is logged, and the table rests a while)."""
        table = self.committer.table
        if table is None or time.monotonic() < self.quiet_until:
            return None
        if self.skip_commits > 0:
            self.skip_commits -= 1
            return None
        name = self.committer.name
        try:
            policy = AutoCompactionPolicy.for_table(table.metadata)
            reason = compaction_due(table.metadata, policy)
            if reason is None:
                return None
            result = await self._run(policy, reason)
        except asyncio.CancelledError:
            raise
        except ValidationConflictError as e:
            log.info("compaction of %s gave way to another writer: %s", name, e)
            self._rest()
            return None
        except Exception as e:
            log.warning(
                "compaction of %s failed (%s: %s); the table is left as it was",
                name,
                type(e).__name__,
                e,
                extra={"table": name},
            )
            self._rest()
            return None
        if result is None:
            # Nothing the plan would rewrite yet: look again once as many new files came.
            self.skip_commits = policy.min_new_files
        else:
            self.quiet_s = _QUIET_S
        return result

    def _rest(self) -> None:
        self.quiet_until = time.monotonic() + self.quiet_s
        self.quiet_s = min(_QUIET_MAX_S, self.quiet_s * 2)

    async def _run(self, policy: AutoCompactionPolicy, reason: str) -> RewriteResult | None:
        committer = self.committer
        table = await committer.load()  # plan on the newest base: less work lost to a conflict
        plan = await plan_compaction(table, reader=committer.reader)  # may refuse the table
        groups = select_groups(plan, policy.max_bytes_per_run)
        if not groups:
            return None
        metadata = table.metadata
        key_ids = tuple(metadata.schema().identifier_field_ids)
        started = time.monotonic()
        result = await rewrite_and_commit(
            table,
            plan,
            groups,
            key_schema=key_schema(metadata.schema(), key_ids) if key_ids else None,
            retry_policy=committer.retry_policy,
        )
        if result is None:
            return None
        committer.table = result.table
        self.runs += 1
        await self._update_key_index(result)
        log.info(
            "compacted %s: %d file(s), %d byte(s) into %d file(s) as snapshot %d in %.2fs (%s)",
            committer.name,
            len(result.removed),
            result.input_bytes,
            len(result.added),
            result.snapshot_id,
            time.monotonic() - started,
            reason,
            extra={"table": committer.name, "snapshot_id": result.snapshot_id},
        )
        return result

    async def _update_key_index(self, result: RewriteResult) -> None:
        """The key index covers the new head: moved rows in their new files (keys from the
        bytes just written, not read again), replaced files forgotten; then checkpointed
        (:meth:`~icefloe.coordinator.committer.TableCommitter.sync_key_index`, which
        drops an index in doubt, to be reopened and synced by the next upsert). Only an
        index already open is updated: one opened later syncs from its checkpoint."""
        committer = self.committer
        metadata = result.table.metadata
        if not committer.has_key_index(metadata):
            return
        index = await committer.key_index(metadata)
        index.discard_staged()
        try:
            for data_file in result.added:
                index.stage(data_file, result.keys[data_file.file_path])
        except Exception as e:  # the keys just written do not fit the index: read them again
            log.warning(
                "key index of %s: staging the rewritten files failed: %s", committer.name, e
            )
            index.discard_staged()
        await committer.sync_key_index(metadata, MAIN_BRANCH, checkpoint=True)


__all__ = [
    "AUTO_ENABLED",
    "AUTO_MAX_BYTES_PER_RUN",
    "AUTO_MIN_NEW_FILES",
    "AutoCompactionPolicy",
    "TableCompactor",
    "compaction_due",
    "compacts_itself",
]
