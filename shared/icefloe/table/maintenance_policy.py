"""Maintenance by policy: what a table needs next, decided from its health, and doing it.

The policy lives in table properties, so each table carries its own and every tool
(the coordinator's runner, ``icefloe table health`` and ``maintain``) reads the same one.
:data:`PROPERTIES` lists every table property maintenance reads, with its default and
meaning; the documentation's table is generated from it (``docs/concepts/maintenance.md``)
and a test checks that maintenance reads no property it does not list.

Deletes pile up on upsert tables: every upsert deletes the old row of each key it replaces
(a deletion vector on v3, a position delete on v2), and every reader reads those rows and
drops them. A compaction applies them. But compaction's own file policy
(:mod:`icefloe.table.compaction`) takes any file with a delete, so on an upsert table it would have
something to do after every commit; rewriting well-sized files to drop a few rows costs more
than it saves. So a group of files that the plan rewrites *only* to apply deletes (every file
in it is within the size bounds) counts toward ``min-candidates`` once the table's
``deleted_row_ratio`` (:class:`~icefloe.table.health.TableHealth`: rows deleted by position
per row stored) reaches ``deleted-row-ratio``; groups with small or oversized files always
count. The default, 0.3, is Java's ``RewriteDataFiles`` ``delete-ratio-threshold``; 0 announces
a compaction for any delete, 1 only when size asks for one.

Three limits hold snapshot expiry back, and :func:`expiry_retention` says which one holds
each snapshot (``icefloe table health`` prints it): the table's age and count limits
(``history.expire.*``, ``icefloe.maintenance.max-snapshots``, and the refs); ``min_retain_ms``,
the caller's floor (the coordinator's ``ICEFLOE_MAINTENANCE_MIN_RETAIN_MS``, the CLI's
``--min-retain-ms``): nothing younger is expired; and the table's exactly-once dedup window
(``icefloe.dedup.window-ms``, :mod:`icefloe.table.commit_index`): a snapshot that records commit ids
is kept while younger than it. Expiry itself is :func:`icefloe.table.maintenance.expire_snapshots`;
orphans and manifests likewise use the library calls, so this module only decides and
orders them.

Orphan removal lists the table's whole location, so it runs at most every
``remove-orphans.interval-ms``. When it last ran is recorded in the table itself, in the
property ``icefloe.maintenance.remove-orphans.last-run-ms`` (committed after a successful
run): a property survives restarts and rebalances, every catalog stores it, and every
reader (the runner on any replica, ``icefloe table health``, the CLI's ``maintain``) sees
the same value, where a replica's memory was lost on restart and invisible to the CLI. It
costs one small metadata commit per run (daily by default); it is not a snapshot, so it
changes no data and no history.

Each action is its own commit through the catalog's conditional swap, with retries: it
never waits for, or holds up, another writer's commit; a writer that loses the swap to it
retries, as against any concurrent commit.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from icefloe.errors import ValidationError
from icefloe.manifests.reader import ManifestReader
from icefloe.parquet.options import DEFAULT_TARGET_FILE_SIZE_BYTES, TARGET_FILE_SIZE_BYTES
from icefloe.spec.metadata import TableMetadata
from icefloe.table.catalog import Table, TableChange
from icefloe.table.changes import TableCommit, commit_table_changes
from icefloe.table.commit_index import (
    DEDUP_WINDOW_MS,
    DEDUP_WINDOW_MS_DEFAULT,
    dedup_window_ms,
    snapshots_in_window,
)
from icefloe.table.compaction import (
    DELETE_FILE_THRESHOLD,
    DELETE_FILE_THRESHOLD_DEFAULT,
    MAX_FILE_RATIO,
    MAX_FILE_SIZE_BYTES,
    MIN_FILE_RATIO,
    MIN_FILE_SIZE_BYTES,
    MIN_INPUT_FILES,
    MIN_INPUT_FILES_DEFAULT,
    CompactionPlan,
    CompactionPolicy,
    CompactionUnsupportedError,
    FileGroup,
    plan_compaction,
)
from icefloe.table.health import SMALL_MANIFEST_FRACTION, TableHealth, table_health
from icefloe.table.maintenance import (
    GC_ENABLED,
    MAX_REF_AGE_MS,
    MAX_SNAPSHOT_AGE_MS,
    MAX_SNAPSHOT_AGE_MS_DEFAULT,
    MIN_SNAPSHOTS_TO_KEEP,
    MIN_SNAPSHOTS_TO_KEEP_DEFAULT,
    expire_snapshots,
    remove_orphan_files,
    retained_snapshots,
    rewrite_manifests,
)
from icefloe.table.snapshot_producer import MANIFEST_TARGET_SIZE, MANIFEST_TARGET_SIZE_DEFAULT
from icefloe.table.updates import SetPropertiesUpdate

PREFIX = "icefloe.maintenance."
ENABLED = PREFIX + "enabled"
MAX_SNAPSHOTS = PREFIX + "max-snapshots"
ORPHANS_ENABLED = PREFIX + "remove-orphans.enabled"
ORPHAN_OLDER_THAN_MS = PREFIX + "orphan-older-than-ms"
ORPHAN_INTERVAL_MS = PREFIX + "remove-orphans.interval-ms"
ORPHANS_LAST_RUN_MS = PREFIX + "remove-orphans.last-run-ms"
MANIFESTS_MAX_COUNT = PREFIX + "rewrite-manifests.max-count"
MANIFESTS_SMALL_RATIO = PREFIX + "rewrite-manifests.small-ratio"
MANIFESTS_MIN_COUNT = PREFIX + "rewrite-manifests.min-count"
COMPACTION_MIN_CANDIDATES = PREFIX + "compaction.min-candidates"
COMPACTION_DELETED_ROW_RATIO = PREFIX + "compaction.deleted-row-ratio"

DAY_MS = 24 * 3600 * 1000


def _duration(ms: int) -> str:
    for unit, size in (("day", DAY_MS), ("hour", 3_600_000), ("minute", 60_000)):
        if ms >= size and ms % size == 0:
            n = ms // size
            return f"{n} {unit}{'s' if n != 1 else ''} ({ms})"
    return str(ms)


def _mib(n: int) -> str:
    return f"{n >> 20} MiB ({n})" if n % (1 << 20) == 0 else str(n)


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
class PolicyProperty:
    """A table property maintenance reads: its key, its default as a person reads it, what
    it does, and the area of maintenance it belongs to."""

    key: str
    default: str
    meaning: str
    area: str


_D = MaintenancePolicy()

PROPERTIES: tuple[PolicyProperty, ...] = (
    PolicyProperty(ENABLED, "true", "maintain this table at all", "all"),
    PolicyProperty(
        MAX_SNAPSHOT_AGE_MS,
        _duration(MAX_SNAPSHOT_AGE_MS_DEFAULT),
        "expire snapshots older than this (Iceberg's property; a branch's own "
        "max-snapshot-age-ms wins on that branch)",
        "expiry",
    ),
    PolicyProperty(
        MIN_SNAPSHOTS_TO_KEEP,
        str(MIN_SNAPSHOTS_TO_KEEP_DEFAULT),
        "always keep at least this many snapshots of each branch (Iceberg's property)",
        "expiry",
    ),
    PolicyProperty(
        MAX_REF_AGE_MS,
        "none (refs never expire)",
        "remove tags and branches other than main whose snapshot is older than this "
        "(Iceberg's property)",
        "expiry",
    ),
    PolicyProperty(
        MAX_SNAPSHOTS,
        str(_D.max_snapshots),
        "above this many snapshots, expire down to it, whatever their age (never inside "
        "the min-retain floor or the dedup window)",
        "expiry",
    ),
    PolicyProperty(
        DEDUP_WINDOW_MS,
        _duration(DEDUP_WINDOW_MS_DEFAULT),
        "the exactly-once dedup window: a snapshot recording commit ids is kept while "
        "younger than this; the coordinator writes its ICEFLOE_DEDUP_WINDOW_MS here on its "
        "first commit to a table that has none",
        "expiry",
    ),
    PolicyProperty(
        GC_ENABLED,
        "true",
        "false: expire snapshots but delete no file (Iceberg's property)",
        "expiry",
    ),
    PolicyProperty(ORPHANS_ENABLED, "true", "delete files no metadata references", "orphans"),
    PolicyProperty(
        ORPHAN_OLDER_THAN_MS,
        _duration(_D.orphan_older_than_ms),
        "only files older than this (a write in flight is never an orphan)",
        "orphans",
    ),
    PolicyProperty(
        ORPHAN_INTERVAL_MS,
        _duration(_D.orphan_interval_ms),
        "run orphan removal at most this often (it lists the table's whole location)",
        "orphans",
    ),
    PolicyProperty(
        ORPHANS_LAST_RUN_MS,
        "none (never ran)",
        "when orphan removal last succeeded (epoch ms): written by maintenance after each "
        "run, read to keep the interval across restarts and replicas",
        "orphans",
    ),
    PolicyProperty(
        MANIFESTS_MAX_COUNT,
        str(_D.manifests_max_count),
        "rewrite manifests when there are more than this",
        "manifests",
    ),
    PolicyProperty(
        MANIFESTS_SMALL_RATIO,
        str(_D.manifests_small_ratio),
        "... or when more than this share of them is small",
        "manifests",
    ),
    PolicyProperty(
        MANIFESTS_MIN_COUNT,
        str(_D.manifests_min_count),
        "... counting small ones only from this many manifests",
        "manifests",
    ),
    PolicyProperty(
        MANIFEST_TARGET_SIZE,
        _mib(MANIFEST_TARGET_SIZE_DEFAULT),
        f"a manifest below 1/{SMALL_MANIFEST_FRACTION} of this counts as small "
        "(Iceberg's property)",
        "manifests",
    ),
    PolicyProperty(
        COMPACTION_MIN_CANDIDATES,
        str(_D.compaction_min_candidates),
        "announce a compaction when it would rewrite this many file groups or more",
        "compaction",
    ),
    PolicyProperty(
        COMPACTION_DELETED_ROW_RATIO,
        str(_D.compaction_deleted_row_ratio),
        "count groups rewritten only to apply deletes once this share of stored rows is "
        "deleted (0..1)",
        "compaction",
    ),
    PolicyProperty(
        TARGET_FILE_SIZE_BYTES,
        _mib(DEFAULT_TARGET_FILE_SIZE_BYTES),
        "the size compaction writes (Iceberg's property)",
        "compaction",
    ),
    PolicyProperty(
        MIN_FILE_SIZE_BYTES,
        f"{int(MIN_FILE_RATIO * 100)} % of the target",
        "a data file below this is small: a compaction candidate",
        "compaction",
    ),
    PolicyProperty(
        MAX_FILE_SIZE_BYTES,
        f"{int(MAX_FILE_RATIO * 100)} % of the target",
        "a data file above this is a compaction candidate too",
        "compaction",
    ),
    PolicyProperty(
        MIN_INPUT_FILES,
        str(MIN_INPUT_FILES_DEFAULT),
        "compact a partition once it has this many candidates (or enough bytes, or deletes)",
        "compaction",
    ),
    PolicyProperty(
        DELETE_FILE_THRESHOLD,
        str(DELETE_FILE_THRESHOLD_DEFAULT),
        "a data file with at least this many delete files applying is a candidate",
        "compaction",
    ),
)
"""Every table property maintenance reads, in the order the documentation lists them."""

_POLICY_KEYS = frozenset(p.key for p in PROPERTIES)


@dataclass(frozen=True, slots=True)
class PlannedAction:
    action: Action
    reason: str

    def to_json(self) -> dict[str, str]:
        return {"action": self.action.value, "reason": self.reason}


def expiry_bounds(
    metadata: TableMetadata, policy: MaintenancePolicy, *, now_ms: int, min_retain_ms: int
) -> tuple[int, int]:
    """(older_than_ms, retain_last) for :func:`~icefloe.table.maintenance.expire_snapshots`.

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


@dataclass(frozen=True, slots=True)
class ExpiryRetention:
    """What holds snapshot expiry back now: each snapshot expiry keeps, counted under the
    first limit that keeps it (see the module docs), and the limits themselves."""

    snapshots: int
    expirable: int
    kept_by_policy: int
    """kept by the table's age and count limits, its refs and min-snapshots-to-keep"""
    held_by_min_retain: int
    """past those limits, but younger than the caller's ``min_retain_ms`` floor"""
    held_by_dedup_window: int
    """past both, but recording commit ids younger than the table's dedup window"""
    max_snapshot_age_ms: int
    max_snapshots: int
    min_snapshots_to_keep: int
    min_retain_ms: int
    dedup_window_ms: int

    def held(self) -> list[str]:
        """One sentence per limit that holds snapshots back beyond the table's own policy."""
        out = []
        if self.held_by_min_retain:
            out.append(
                f"{self.held_by_min_retain} snapshot(s) past the table's age/count limits are "
                f"younger than the maintenance floor of {self.min_retain_ms} ms "
                "(ICEFLOE_MAINTENANCE_MIN_RETAIN_MS on the coordinator, --min-retain-ms here)"
            )
        if self.held_by_dedup_window:
            out.append(
                f"{self.held_by_dedup_window} snapshot(s) past the table's limits and the floor "
                f"record commit ids younger than the dedup window ({DEDUP_WINDOW_MS}="
                f"{self.dedup_window_ms} ms)"
            )
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "snapshots": self.snapshots,
            "expirable": self.expirable,
            "kept-by-policy": self.kept_by_policy,
            "held-by-min-retain": self.held_by_min_retain,
            "held-by-dedup-window": self.held_by_dedup_window,
            "held": self.held(),
            "limits": {
                MAX_SNAPSHOT_AGE_MS: self.max_snapshot_age_ms,
                MAX_SNAPSHOTS: self.max_snapshots,
                MIN_SNAPSHOTS_TO_KEEP: self.min_snapshots_to_keep,
                "min-retain-ms": self.min_retain_ms,
                DEDUP_WINDOW_MS: self.dedup_window_ms,
            },
        }


def expiry_retention(
    metadata: TableMetadata, policy: MaintenancePolicy, *, now_ms: int, min_retain_ms: int
) -> ExpiryRetention:
    """Which of the three limits keeps each snapshot that expiry would keep now.

    The sets nest: what the table's own limits keep (no floor, no window), what they keep
    with the ``min_retain_ms`` floor, and that plus the dedup window, which is what
    :func:`~icefloe.table.maintenance.expire_snapshots` keeps.
    """
    window = dedup_window_ms(metadata.properties)

    def kept(floor_ms: int) -> set[int]:
        older_than, retain = expiry_bounds(metadata, policy, now_ms=now_ms, min_retain_ms=floor_ms)
        ids, _ = retained_snapshots(
            metadata,
            now_ms=now_ms,
            older_than_ms=older_than,
            retain_last=retain,
            dedup_window=False,
        )
        return ids

    by_policy = kept(0)
    with_floor = kept(min_retain_ms) | by_policy
    with_window = with_floor | snapshots_in_window(metadata, now_ms, window)
    listed = {s.snapshot_id for s in metadata.snapshots}
    return ExpiryRetention(
        snapshots=len(listed),
        expirable=len(listed - with_window),
        kept_by_policy=len(by_policy & listed),
        held_by_min_retain=len((with_floor - by_policy) & listed),
        held_by_dedup_window=len((with_window - with_floor) & listed),
        max_snapshot_age_ms=policy.max_snapshot_age_ms,
        max_snapshots=policy.max_snapshots,
        min_snapshots_to_keep=policy.min_snapshots_to_keep,
        min_retain_ms=max(0, min_retain_ms),
        dedup_window_ms=window,
    )


def orphans_last_run_ms(metadata: TableMetadata) -> int | None:
    """When orphan removal last succeeded on this table, as recorded in the table."""
    if ORPHANS_LAST_RUN_MS not in metadata.properties:
        return None
    return metadata.int_property(ORPHANS_LAST_RUN_MS, 0)


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
    """What maintenance would do next for this table, with the reason for each action.

    ``last_orphan_run_ms`` (the caller's memory of an attempt) and the time recorded in the
    table (:func:`orphans_last_run_ms`) both count: the later one starts the interval.
    """
    if not policy.enabled:
        return []
    out: list[PlannedAction] = []
    retention = expiry_retention(metadata, policy, now_ms=now_ms, min_retain_ms=min_retain_ms)
    if retention.expirable:
        reason = (
            f"{retention.expirable} of {retention.snapshots} snapshot(s) are past retention "
            f"(max age {policy.max_snapshot_age_ms} ms, max {policy.max_snapshots} "
            f"snapshots, never younger than {retention.min_retain_ms} ms, nor inside the "
            f"dedup window of {retention.dedup_window_ms} ms)"
        )
        out.append(PlannedAction(Action.EXPIRE_SNAPSHOTS, "; ".join([reason, *retention.held()])))
    recorded = orphans_last_run_ms(metadata)
    runs = [t for t in (last_orphan_run_ms, recorded) if t is not None]
    last_orphan_run_ms = max(runs) if runs else None
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
        last = "never ran" if last_orphan_run_ms is None else f"last ran {last_orphan_run_ms}"
        out.append(
            PlannedAction(
                Action.REMOVE_ORPHANS,
                f"unreferenced files older than {policy.orphan_older_than_ms} ms (runs at most "
                f"every {policy.orphan_interval_ms} ms; {last})",
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
    retention: ExpiryRetention | None = None
    errors: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "planned": [p.to_json() for p in self.planned],
            "expiry": None if self.retention is None else self.retention.to_json(),
            "expired-snapshots": self.expired_snapshots,
            "deleted-files": self.deleted_files,
            "removed-orphans": self.removed_orphans,
            "rewrote-manifests": self.rewrote_manifests,
            "errors": list(self.errors),
        }


async def check_policy_change(change: TableChange) -> None:
    """Refuse a commit that sets a property maintenance reads (:data:`PROPERTIES`) to a
    value it cannot read: ValidationError naming the property, before anything is written.

    The REST catalog and ``icefloe table properties`` pass this as the ``check`` of
    :func:`~icefloe.table.changes.commit_table_changes`, so a typo is refused where it is
    made rather than failing every maintenance visit later. Only commits that change one of
    these properties are checked, so a table already holding a bad value still takes
    appends.
    """
    base = change.base.metadata.properties if change.base is not None else {}
    new = change.new_metadata
    changed = {k for k, v in new.properties.items() if base.get(k) != v}
    if not changed & _POLICY_KEYS:
        return
    MaintenancePolicy.for_table(new)
    dedup_window_ms(new.properties)
    orphans_last_run_ms(new)
    CompactionPolicy.for_table(new)


async def record_orphans_run(table: Table, run_ms: int) -> None:
    """Record in the table that orphan removal succeeded at ``run_ms``: one
    ``set-properties`` commit through the catalog's conditional swap (a concurrent commit is
    re-read and the property applied on top of it, :mod:`icefloe.table.changes`)."""
    update = SetPropertiesUpdate(updates={ORPHANS_LAST_RUN_MS: str(run_ms)})
    await commit_table_changes(table.catalog, [TableCommit(table.identifier, (), (update,))])


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
    report.retention = expiry_retention(metadata, policy, now_ms=now, min_retain_ms=min_retain_ms)
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
                await record_orphans_run(table, now)
        except Exception as e:  # reported; the other actions still run
            report.errors.append(f"{planned.action.value}: {type(e).__name__}: {e}")
    final = await catalog.load_table(table.identifier)
    report.health = await table_health(final, reader=reader, now_ms=now)
    return report


__all__ = [
    "ORPHANS_LAST_RUN_MS",
    "PROPERTIES",
    "Action",
    "ExpiryRetention",
    "MaintenancePolicy",
    "MaintenanceReport",
    "PlannedAction",
    "PolicyProperty",
    "check_policy_change",
    "compaction_candidates",
    "decide",
    "expiry_bounds",
    "expiry_retention",
    "orphans_last_run_ms",
    "record_orphans_run",
    "run_maintenance",
]
