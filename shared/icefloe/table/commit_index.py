"""Which commit ids a table already holds: the dedup index behind exactly-once commits.

Writers name each commit (one job, one micro-batch) by a *commit id*; the coordinator
records the ids a snapshot applied in its summary under ``icefloe.commit-ids``. A commit id
found in the table is never applied again, whatever attempt id, Kafka offsets, restart,
rebalance or zombie replica brought it back.

The index covers every snapshot the table metadata still lists — on every branch, made by
any writer — and it is kept incrementally: snapshots are appended to the metadata's list in
commit order, so after the first build a new metadata version only costs its new snapshots
(O(batch) per commit). When the list no longer extends the indexed one (snapshots were
expired), the index is rebuilt and the ids of vanished snapshots stay known in memory (a
commit id, once applied, stays applied).

The *dedup window* is how far back the guarantee reaches after a restart, when only the
table remembers: snapshot expiry keeps every snapshot younger than the window
(:func:`dedup_window_ms`, table property ``icefloe.dedup.window-ms``, default 7 days; see
:mod:`icefloe.table.maintenance`). :meth:`CommitIndex.coverage_gap_ms` says when the table's
retained history is shorter than the window (history expired by another engine).

What outlives the snapshots: every snapshot the coordinator commits also rewrites the table
property ``icefloe.dedup.ledger`` (:mod:`icefloe.table.dedup_ledger`), which carries the window's
commit ids forward with the table. Any engine may expire snapshots without asking icefloe
(Java's ``expire_snapshots`` on a catalog icefloe never sees); the index reads the ledger
too, so a commit id stays recognised for the whole window whatever happened to the snapshot
that applied it. :meth:`CommitIndex.is_listed` tells an answer naming a snapshot still in
the table from one naming a snapshot since expired.

Rolled-back snapshots that are still listed count as applied: a commit id names one
attempt to change the table, and a rollback is a decision about the table, not a request
to apply the commit again.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence

from icefloe.errors import ValidationError
from icefloe.spec.metadata import TableMetadata
from icefloe.spec.snapshot import Snapshot
from icefloe.table.dedup_ledger import (
    LEDGER_PROPERTY,
    DedupLedger,
    extend_ledger,
    ledger_entry,
)

SUMMARY_COMMIT_IDS = "icefloe.commit-ids"
DEDUP_WINDOW_MS = "icefloe.dedup.window-ms"
DEDUP_WINDOW_MS_DEFAULT = 7 * 24 * 3600 * 1000


def summary_commit_ids(snapshot: Snapshot) -> list[str]:
    """The commit ids a snapshot recorded (empty for snapshots not made by icefloe)."""
    summary = snapshot.summary
    if summary is None:
        return []
    raw = summary.get(SUMMARY_COMMIT_IDS)
    if raw is None:
        return []
    try:
        obj = json.loads(raw)
    except (TypeError, ValueError):
        return []
    return [c for c in obj if isinstance(c, str)] if isinstance(obj, list) else []


def dedup_window_ms(properties: Mapping[str, str], default: int = DEDUP_WINDOW_MS_DEFAULT) -> int:
    """The table's dedup window: ``icefloe.dedup.window-ms`` if set, else ``default``.

    Raises ValidationError naming the property when its value is not a non-negative integer.
    """
    raw = properties.get(DEDUP_WINDOW_MS)
    if raw is None:
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise ValidationError(
            f"table property {DEDUP_WINDOW_MS}={raw!r} is not an integer"
        ) from None
    if value < 0:
        raise ValidationError(f"table property {DEDUP_WINDOW_MS}={raw!r} must be >= 0")
    return value


def snapshots_in_window(metadata: TableMetadata, now_ms: int, window_ms: int) -> set[int]:
    """Snapshots carrying commit ids that are younger than the window: expiry keeps these."""
    cutoff = now_ms - window_ms
    return {
        s.snapshot_id
        for s in metadata.snapshots
        if s.timestamp_ms >= cutoff and summary_commit_ids(s)
    }


def check_snapshot_removal(
    metadata: TableMetadata, snapshot_ids: Iterable[int], now_ms: int, table: object
) -> None:
    """Refuse to remove a snapshot that records commit ids and is younger than the dedup
    window: every icefloe path that removes snapshots (maintenance, the CLI, the REST
    ``remove-snapshots`` update) asks this first. ValidationError naming the setting."""
    window = dedup_window_ms(metadata.properties)
    protected = snapshots_in_window(metadata, now_ms, window)
    inside = sorted(set(snapshot_ids) & protected)
    if inside:
        raise ValidationError(
            f"snapshot(s) {', '.join(map(str, inside))} of table {table} record icefloe commit "
            f"ids and are younger than the dedup window ({DEDUP_WINDOW_MS}={window} ms): "
            "removing them would drop the evidence that keeps a retry of those commits from "
            f"being applied twice; wait, or lower {DEDUP_WINDOW_MS} on the table first"
        )


class CommitIndex:
    """Commit id -> the snapshot that applied it, over every snapshot the table lists."""

    __slots__ = (
        "_by_commit",
        "_count",
        "_last_id",
        "_listed",
        "_metadata",
        "indexed",
        "ledger",
        "rebuilds",
    )

    def __init__(self) -> None:
        self._by_commit: dict[str, int] = {}
        self._listed: set[int] = set()
        self.ledger = DedupLedger()
        self._metadata: TableMetadata | None = None
        self._count = 0
        self._last_id: int | None = None
        self.rebuilds = 0
        self.indexed = 0  # snapshots read so far (a measure of the work done)

    def update(self, metadata: TableMetadata) -> None:
        """Take in the snapshots ``metadata`` lists that are not indexed yet."""
        if metadata is self._metadata:
            return
        snapshots = metadata.snapshots
        n = self._count
        if n and len(snapshots) >= n and snapshots[n - 1].snapshot_id == self._last_id:
            new: Iterable[Snapshot] = snapshots[n:]
        else:
            if n:
                self.rebuilds += 1
            new = snapshots
            self._listed = set()
        for snapshot in new:
            self.indexed += 1
            self._listed.add(snapshot.snapshot_id)
            for commit_id in summary_commit_ids(snapshot):
                self._by_commit.setdefault(commit_id, snapshot.snapshot_id)
        # Snapshots listed now are indexed from their summaries (never forgotten): the
        # ledger's digests are kept only for those already gone.
        self.ledger.take_in(metadata.properties.get(LEDGER_PROPERTY), self._listed)
        self._metadata = metadata
        self._count = len(snapshots)
        self._last_id = snapshots[-1].snapshot_id if snapshots else None

    def add(self, commits: Mapping[str, int]) -> None:
        """Record commits known to be applied (a commit this process just made)."""
        for commit_id, snapshot_id in commits.items():
            self._by_commit.setdefault(commit_id, snapshot_id)

    def get(self, commit_id: str) -> int | None:
        """The snapshot that applied ``commit_id`` (perhaps expired since: see
        :meth:`is_listed`), or None if neither the table nor its ledger holds it."""
        found = self._by_commit.get(commit_id)
        return found if found is not None else self.ledger.get(commit_id)

    def is_listed(self, snapshot_id: int) -> bool:
        """Whether the last metadata taken in still lists ``snapshot_id``."""
        return snapshot_id in self._listed

    def __contains__(self, commit_id: object) -> bool:
        return isinstance(commit_id, str) and self.get(commit_id) is not None

    def __len__(self) -> int:
        return len(self._by_commit)

    def coverage_gap_ms(self, metadata: TableMetadata, now_ms: int, window_ms: int) -> int:
        """How much of the dedup window the table's retained history may no longer cover
        (0 when it certainly covers it all).

        A listed snapshot whose parent is gone marks a cut in the history; when the newest
        cut is younger than the window, commits made before it inside the window may have
        been expired with their ids. A cut whose missing parent the dedup ledger lists is
        no cut: the ledger carries its commit ids. (The
        expired parent's own time is not recorded, so a long quiet period just before a
        legitimate cut reports a gap too: this feeds a warning and a metric, never a
        decision.)"""
        if not metadata.snapshots:
            return 0
        self.update(metadata)
        listed = {s.snapshot_id for s in metadata.snapshots}
        carried = self.ledger.snapshots
        newest_cut: int | None = None
        for s in metadata.snapshots:
            parent = s.parent_snapshot_id
            cut = parent is not None and parent not in listed and parent not in carried
            if cut and (newest_cut is None or s.timestamp_ms > newest_cut):
                newest_cut = s.timestamp_ms
        if newest_cut is None:
            return 0
        return max(0, newest_cut - (now_ms - window_ms))


def ledger_after(
    metadata: TableMetadata,
    index: CommitIndex,
    snapshot: Snapshot,
    commit_ids: Sequence[str],
    window_ms: int,
) -> str:
    """The ``icefloe.dedup.ledger`` value of the metadata that adds ``snapshot`` (applying
    ``commit_ids``) on top of ``metadata``.

    ``index`` must have taken in ``metadata``. Entries older than the window are pruned;
    listed snapshots that record commit ids but are in no ledger yet (a table from before
    the ledger, or written by an older coordinator) are added first, newest back to the
    first one a ledger knows, so the ledger of a legacy table is seeded by its first commit.
    """
    cutoff = snapshot.timestamp_ms - window_ms
    known = index.ledger.snapshots
    missing: list[str] = []
    for s in reversed(metadata.snapshots):
        if s.snapshot_id in known or s.timestamp_ms < cutoff:
            break
        ids = summary_commit_ids(s)
        if ids:
            missing.append(ledger_entry(s.snapshot_id, s.timestamp_ms, ids))
    missing.reverse()
    missing.append(ledger_entry(snapshot.snapshot_id, snapshot.timestamp_ms, commit_ids))
    return extend_ledger(metadata.properties.get(LEDGER_PROPERTY), missing, cutoff)


def ledger_properties(
    metadata: TableMetadata,
    index: CommitIndex,
    snapshot: Snapshot,
    commit_ids: Sequence[str],
    default_window_ms: int = DEDUP_WINDOW_MS_DEFAULT,
) -> dict[str, str]:
    """The table properties the commit of ``snapshot`` writes to keep its commit ids: the
    ledger carried forward and, on a table that sets no ``icefloe.dedup.window-ms``, that
    property set to ``default_window_ms`` (the coordinator's ``ICEFLOE_DEDUP_WINDOW_MS``).

    Why the window is written into the table: every party that removes snapshots must agree
    on it (the coordinator's ledger, maintenance and the CLI's expiry, the REST catalog's
    ``remove-snapshots`` check), and the table is the one thing they all read; a default
    known to one process only would let another expire what the coordinator counts on. The
    first commit that records commit ids is the first that needs it. An unreadable value
    counts as ``default_window_ms`` here (and is refused where snapshots are removed).
    """
    out: dict[str, str] = {}
    if DEDUP_WINDOW_MS not in metadata.properties:
        window = default_window_ms
        out[DEDUP_WINDOW_MS] = str(window)
    else:
        try:
            window = dedup_window_ms(metadata.properties)
        except ValidationError:
            window = default_window_ms
    out[LEDGER_PROPERTY] = ledger_after(metadata, index, snapshot, commit_ids, window)
    return out
