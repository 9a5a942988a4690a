"""Maintenance by policy: what a table needs next, decided from its health, and doing it.

The policy lives in table properties, so each table carries its own and every tool
(the coordinator's runner, ``icefloe table health``) reads the same one. Defaults:

=====================================================  ===========  ==============================
property                                               default      meaning
=====================================================  ===========  ==============================
``icefloe.maintenance.enabled``                        ``true``     run maintenance at all
``history.expire.max-snapshot-age-ms`` (Iceberg)       5 days       expire snapshots older than
``history.expire.min-snapshots-to-keep`` (Iceberg)     1            keep at least this many
``icefloe.maintenance.max-snapshots``                  500          above this many snapshots,
                                                                    expire down to it (never
                                                                    inside the retention window)
``icefloe.maintenance.remove-orphans.enabled``         ``true``     delete unreferenced files
``icefloe.maintenance.orphan-older-than-ms``           3 days       only files older than this
``icefloe.maintenance.remove-orphans.interval-ms``     1 day        at most this often (lists
                                                                    the whole table location)
``icefloe.maintenance.rewrite-manifests.max-count``    100          rewrite manifests above
                                                                    this many, or
``icefloe.maintenance.rewrite-manifests.small-ratio``  0.5          when this share of at least
``icefloe.maintenance.rewrite-manifests.min-count``    50           this many manifests is small
``icefloe.maintenance.compaction.min-candidates``      1            announce a compaction when
                                                                    it would rewrite this many
                                                                    groups of files or more
``icefloe.maintenance.compaction.deleted-row-ratio``   0.3          ... counting groups rewritten
                                                                    only to apply deletes once
                                                                    this share of stored rows
                                                                    is deleted (0..1)
=====================================================  ===========  ==============================

Deletes pile up on upsert tables: every upsert deletes the old row of each key it replaces
(a deletion vector on v3, a position delete on v2), and every reader reads those rows and
drops them. A compaction applies them. But compaction's own file policy
(:mod:`icefloe.compaction`) takes any file with a delete, so on an upsert table it would have
something to do after every commit; rewriting well-sized files to drop a few rows costs more
than it saves. So a group of files that the plan rewrites *only* to apply deletes (every file
in it is within the size bounds) counts toward ``min-candidates`` once the table's
``deleted_row_ratio`` (:class:`~icefloe.table_health.TableHealth`: rows deleted by position
per row stored) reaches ``deleted-row-ratio``; groups with small or oversized files always
count. The default, 0.3, is Java's ``RewriteDataFiles`` ``delete-ratio-threshold``; 0 announces
a compaction for any delete, 1 only when size asks for one.

Expiry never goes inside the *retention window*: ``min_retain_ms``, given by the caller
(the coordinator passes its exactly-once deduplication window, inside which it looks up
commit ids in the table's history), and the policy's own minimum count. Expiry itself is
:func:`icefloe.maintenance.expire_snapshots`; orphans and manifests likewise use the
library calls, so this module only decides and orders them.

Each action is its own commit through the catalog's conditional swap, with retries: it
never waits for, or holds up, another writer's commit; a writer that loses the swap to it
retries, as against any concurrent commit.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from icefloe.catalog import Table
from icefloe.commit_index import dedup_window_ms, snapshots_in_window
from icefloe.compaction import (
    CompactionPlan,
    CompactionPolicy,
    CompactionUnsupportedError,
    FileGroup,
    plan_compaction,
)
from icefloe.errors import ValidationError
from icefloe.maintenance import (
    MAX_SNAPSHOT_AGE_MS,
    MAX_SNAPSHOT_AGE_MS_DEFAULT,
    MIN_SNAPSHOTS_TO_KEEP,
    MIN_SNAPSHOTS_TO_KEEP_DEFAULT,
    expire_snapshots,
    remove_orphan_files,
    retained_snapshots,
    rewrite_manifests,
)
from icefloe.manifest_reader import ManifestReader
from icefloe.metadata import TableMetadata
from icefloe.table_health import TableHealth, table_health

PREFIX = "icefloe.maintenance."
ENABLED = PREFIX + "enabled"
MAX_SNAPSHOTS = PREFIX + "max-snapshots"
ORPHANS_ENABLED = PREFIX + "remove-orphans.enabled"
ORPHAN_OLDER_THAN_MS = PREFIX + "orphan-older-than-ms"
ORPHAN_INTERVAL_MS = PREFIX + "remove-orphans.interval-ms"
MANIFESTS_MAX_COUNT = PREFIX + "rewrite-manifests.max-count"
MANIFESTS_SMALL_RATIO = PREFIX + "rewrite-manifests.small-ratio"
MANIFESTS_MIN_COUNT = PREFIX + "rewrite-manifests.min-count"
COMPACTION_MIN_CANDIDATES = PREFIX + "compaction.min-candidates"
COMPACTION_DELETED_ROW_RATIO = PREFIX + "compaction.deleted-row-ratio"

DAY_MS = 24 * 3600 * 1000


class Action(StrEnum):
    EXPIRE_SNAPSHOTS = "expire-snapshots"
    REMOVE_ORPHANS = "remove-orphan-files"
    REWRITE_MANIFESTS = "rewrite-manifests"
    COMPACT = "compact"


@dataclass(frozen=True, slots=True)
class MaintenancePolicy:
    """A table's maintenance policy (see the module docs for properties and defaults)."""

    enabled: bool = True
    max_snapshot_age_ms: int = MAX_SNAPSHOT_AGE_MS_DEFAULT
    min_snapshots_to_keep: int = MIN_SNAPSHOTS_TO_KEEP_DEFAULT
    max_snapshots: int = 500
    remove_orphans: bool = True
    orphan_older_than_ms: int = 3 * DAY_MS
    orphan_interval_ms: int = DAY_MS
    manifests_max_count: int = 100
    manifests_small_ratio: float = 0.5
    manifests_min_count: int = 50
    compaction_min_candidates: int = 1
    compaction_deleted_row_ratio: float = 0.3

    @classmethod
    def for_table(cls, metadata: TableMetadata) -> MaintenancePolicy:
        def flag(key: str, default: bool) -> bool:
            raw = metadata.properties.get(key)
            if raw is None:
                return default
            value = raw.strip().lower()
            if value not in ("true", "false"):
                raise ValidationError(f"table property {key!r} must be true or false, got {raw!r}")
            return value == "true"

        def ratio(key: str, default: float) -> float:
            raw = metadata.properties.get(key)
            if raw is None:
                return default
            try:
                value = float(raw)
            except ValueError:
                raise ValidationError(
                    f"table property {key!r} must be a number, got {raw!r}"
                ) from None
            if not 0.0 <= value <= 1.0:
                raise ValidationError(f"table property {key!r} must be within 0..1, got {raw!r}")
            return value

        def positive(key: str, default: int) -> int:
            value = metadata.int_property(key, default)
            if value < 1:
                raise ValidationError(f"table property {key!r} must be at least 1, got {value}")
            return value

        d = cls()
        return cls(
            enabled=flag(ENABLED, True),
            max_snapshot_age_ms=metadata.int_property(
                MAX_SNAPSHOT_AGE_MS, MAX_SNAPSHOT_AGE_MS_DEFAULT
            ),
            min_snapshots_to_keep=positive(MIN_SNAPSHOTS_TO_KEEP, MIN_SNAPSHOTS_TO_KEEP_DEFAULT),
            max_snapshots=positive(MAX_SNAPSHOTS, d.max_snapshots),
            remove_orphans=flag(ORPHANS_ENABLED, True),
            orphan_older_than_ms=positive(ORPHAN_OLDER_THAN_MS, d.orphan_older_than_ms),
            orphan_interval_ms=positive(ORPHAN_INTERVAL_MS, d.orphan_interval_ms),
            manifests_max_count=positive(MANIFESTS_MAX_COUNT, d.manifests_max_count),
            manifests_small_ratio=ratio(MANIFESTS_SMALL_RATIO, d.manifests_small_ratio),
            manifests_min_count=positive(MANIFESTS_MIN_COUNT, d.manifests_min_count),
            compaction_min_candidates=positive(
                COMPACTION_MIN_CANDIDATES, d.compaction_min_candidates
            ),
            compaction_deleted_row_ratio=ratio(
                COMPACTION_DELETED_ROW_RATIO, d.compaction_deleted_row_ratio
            ),
        )


@dataclass(frozen=True, slots=True)
class PlannedAction:
    action: Action
    reason: str

    def to_json(self) -> dict[str, str]:
        return {"action": self.action.value, "reason": self.reason}


def expiry_bounds(
    metadata: TableMetadata, policy: MaintenancePolicy, *, now_ms: int, min_retain_ms: int
) -> tuple[int, int]:
    """(older_than_ms, retain_last) for :func:`~icefloe.maintenance.expire_snapshots`.

    By age: snapshots older than the policy's maximum age. By count: when there are more
    than ``max_snapshots``, down to that many, but never a snapshot younger than
    ``now - min_retain_ms`` (the retention window) and never fewer than the minimum kept.
    """
    window_cutoff = now_ms - max(0, min_retain_ms)
    cutoff = min(now_ms - policy.max_snapshot_age_ms, window_cutoff)
    retain = policy.min_snapshots_to_keep
    if len(metadata.snapshots) > policy.max_snapshots:
        cutoff = window_cutoff
        retain = max(retain, policy.max_snapshots)
    return cutoff, retain


def _expirable(metadata: TableMetadata, now_ms: int, older_than_ms: int, retain_last: int) -> int:
    """How many snapshots expiry would remove now (never those inside the table's
    exactly-once dedup window, which :func:`~icefloe.maintenance.expire_snapshots` keeps)."""
    retained, _ = retained_snapshots(
        metadata, now_ms=now_ms, older_than_ms=older_than_ms, retain_last=retain_last
    )
    retained |= snapshots_in_window(metadata, now_ms, dedup_window_ms(metadata.properties))
    return sum(1 for s in metadata.snapshots if s.snapshot_id not in retained)


def decide(
    metadata: TableMetadata,
    health: TableHealth,
    compaction: CompactionPlan | None,
    policy: MaintenancePolicy,
    *,
    now_ms: int,
    min_retain_ms: int,
    last_orphan_run_ms: int | None = None,
) -> list[PlannedAction]:
    """What maintenance would do next for this table, with the reason for each action."""
    if not policy.enabled:
        return []
    out: list[PlannedAction] = []
    older_than, retain = expiry_bounds(metadata, policy, now_ms=now_ms, min_retain_ms=min_retain_ms)
    expirable = _expirable(metadata, now_ms, older_than, retain)
    if expirable:
        out.append(
            PlannedAction(
                Action.EXPIRE_SNAPSHOTS,
                f"{expirable} of {len(metadata.snapshots)} snapshot(s) are past retention "
                f"(max age {policy.max_snapshot_age_ms} ms, max {policy.max_snapshots} "
                f"snapshots, never younger than {min_retain_ms} ms)",
            )
        )
    if health.manifests > policy.manifests_max_count:
        out.append(
            PlannedAction(
                Action.REWRITE_MANIFESTS,
                f"{health.manifests} manifests (more than {policy.manifests_max_count})",
            )
        )
    elif (
        health.manifests >= policy.manifests_min_count
        and health.small_manifest_ratio > policy.manifests_small_ratio
    ):
        out.append(
            PlannedAction(
                Action.REWRITE_MANIFESTS,
                f"{health.small_manifests} of {health.manifests} manifests are small "
                f"(ratio above {policy.manifests_small_ratio})",
            )
        )
    if policy.remove_orphans and (
        last_orphan_run_ms is None or now_ms - last_orphan_run_ms >= policy.orphan_interval_ms
    ):
        out.append(
            PlannedAction(
                Action.REMOVE_ORPHANS,
                f"unreferenced files older than {policy.orphan_older_than_ms} ms (runs at most "
                f"every {policy.orphan_interval_ms} ms)",
            )
        )
    if compaction is not None:
        planned = _compaction_action(compaction, health, policy)
        if planned is not None:
            out.append(planned)
    return out


def _for_size(group: FileGroup, policy: CompactionPolicy) -> bool:
    """Whether the plan rewrites ``group`` for its files' sizes, not only for their deletes."""
    return policy.rewrite_all or any(
        not policy.min_file_size_bytes
        <= t.data_file.file_size_in_bytes
        <= policy.max_file_size_bytes
        for t in group.tasks
    )


def _compaction_action(
    compaction: CompactionPlan, health: TableHealth, policy: MaintenancePolicy
) -> PlannedAction | None:
    """COMPACT when enough groups count (see the module docs: groups rewritten only to
    apply deletes count once the deleted-row ratio reaches the policy's)."""
    deletes_due = health.deleted_row_ratio >= policy.compaction_deleted_row_ratio
    counted = [g for g in compaction.groups if deletes_due or _for_size(g, compaction.policy)]
    if not counted or len(counted) < policy.compaction_min_candidates:
        return None
    # what running the compaction does: the whole plan, delete-only groups included
    reason = (
        f"{compaction.input_files} data file(s), {compaction.input_bytes} byte(s) in "
        f"{len(compaction.groups)} group(s) would compact into about "
        f"{compaction.expected_output_files()} file(s)"
    )
    if health.deleted_rows:
        reason += (
            f"; {health.deleted_rows} of {health.records} stored row(s) are deleted "
            f"(ratio {health.deleted_row_ratio:.3f}, compacts for deletes from "
            f"{policy.compaction_deleted_row_ratio})"
        )
    return PlannedAction(Action.COMPACT, reason + "; run icefloe.spark.compact")


async def compaction_candidates(
    table: Table, reader: ManifestReader | None = None
) -> CompactionPlan | None:
    """The compaction plan by the table's policy; None when the table cannot be compacted."""
    try:
        return await plan_compaction(table, reader=reader)
    except CompactionUnsupportedError:
        return None


@dataclass(slots=True)
class MaintenanceReport:
    """What one maintenance run found and did."""

    table: str
    planned: list[PlannedAction] = field(default_factory=list)
    expired_snapshots: int = 0
    deleted_files: int = 0
    removed_orphans: int = 0
    rewrote_manifests: bool = False
    compaction: CompactionPlan | None = None
    health: TableHealth | None = None
    errors: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "planned": [p.to_json() for p in self.planned],
            "expired-snapshots": self.expired_snapshots,
            "deleted-files": self.deleted_files,
            "removed-orphans": self.removed_orphans,
            "rewrote-manifests": self.rewrote_manifests,
            "errors": list(self.errors),
        }


async def run_maintenance(
    table: Table,
    *,
    min_retain_ms: int,
    now_ms: int | None = None,
    last_orphan_run_ms: int | None = None,
    reader: ManifestReader | None = None,
) -> MaintenanceReport:
    """Decide and run what the table's policy asks for now; each action reloads the table
    and commits on its own. An action that fails is reported in ``errors`` and the others
    still run (a failed expiry must not stop orphan clean-up, say)."""
    now = now_ms if now_ms is not None else int(time.time() * 1000)
    catalog = table.catalog
    metadata = table.metadata
    policy = MaintenancePolicy.for_table(metadata)
    report = MaintenanceReport(str(table.identifier))
    health = await table_health(table, reader=reader, now_ms=now)
    plan = await compaction_candidates(table, reader)
    report.compaction = plan
    report.planned = decide(
        metadata,
        health,
        plan,
        policy,
        now_ms=now,
        min_retain_ms=min_retain_ms,
        last_orphan_run_ms=last_orphan_run_ms,
    )
    for planned in report.planned:
        try:
            current = await catalog.load_table(table.identifier)
            if planned.action == Action.EXPIRE_SNAPSHOTS:
                older_than, retain = expiry_bounds(
                    current.metadata, policy, now_ms=now, min_retain_ms=min_retain_ms
                )
                result = await expire_snapshots(
                    current, older_than_ms=older_than, retain_last=retain, now_ms=now
                )
                report.expired_snapshots = len(result.expired_snapshot_ids)
                report.deleted_files = (
                    result.deleted_data_files
                    + result.deleted_manifests
                    + result.deleted_manifest_lists
                    + result.deleted_statistics_files
                )
            elif planned.action == Action.REWRITE_MANIFESTS:
                await rewrite_manifests(current)
                report.rewrote_manifests = True
            elif planned.action == Action.REMOVE_ORPHANS:
                removed = await remove_orphan_files(
                    current, older_than_ms=now - policy.orphan_older_than_ms
                )
                report.removed_orphans = len(removed)
        except Exception as e:  # reported; the other actions still run
            report.errors.append(f"{planned.action.value}: {type(e).__name__}: {e}")
    final = await catalog.load_table(table.identifier)
    report.health = await table_health(final, reader=reader, now_ms=now)
    return report


__all__ = [
    "Action",
    "MaintenancePolicy",
    "MaintenanceReport",
    "PlannedAction",
    "compaction_candidates",
    "decide",
    "expiry_bounds",
    "run_maintenance",
]
