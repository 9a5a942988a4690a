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
:mod:`icefloe.maintenance`). :meth:`CommitIndex.coverage_gap_ms` says when the table's
retained history is shorter than the window (history expired by another engine).

Rolled-back snapshots that are still listed count as applied: a commit id names one
attempt to change the table, and a rollback is a decision about the table, not a request
to apply the commit again.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

from icefloe.errors import ValidationError
from icefloe.metadata import TableMetadata
from icefloe.snapshot import Snapshot

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


class CommitIndex:
    """Commit id -> the snapshot that applied it, over every snapshot the table lists."""

    __slots__ = ("_by_commit", "_count", "_last_id", "_metadata", "indexed", "rebuilds")

    def __init__(self) -> None:
        self._by_commit: dict[str, int] = {}
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
        for snapshot in new:
            self.indexed += 1
            for commit_id in summary_commit_ids(snapshot):
                self._by_commit.setdefault(commit_id, snapshot.snapshot_id)
        self._metadata = metadata
        self._count = len(snapshots)
        self._last_id = snapshots[-1].snapshot_id if snapshots else None

    def add(self, commits: Mapping[str, int]) -> None:
        """Record commits known to be applied (a commit this process just made)."""
        for commit_id, snapshot_id in commits.items():
            self._by_commit.setdefault(commit_id, snapshot_id)

    def get(self, commit_id: str) -> int | None:
        """The snapshot that applied ``commit_id``, or None if the table does not hold it."""
        return self._by_commit.get(commit_id)

    def __contains__(self, commit_id: object) -> bool:
        return commit_id in self._by_commit

    def __len__(self) -> int:
        return len(self._by_commit)

    def coverage_gap_ms(self, metadata: TableMetadata, now_ms: int, window_ms: int) -> int:
        """How much of the dedup window the table's retained history may no longer cover
        (0 when it certainly covers it all).

        A listed snapshot whose parent is gone marks a cut in the history; when the newest
        cut is younger than the window, commits made before it inside the window may have
        been expired with their ids. (The expired parent's own time is not recorded, so a
        long quiet period just before a legitimate cut reports a gap too: this feeds a
        warning and a metric, never a decision.)"""
        if not metadata.snapshots:
            return 0
        listed = {s.snapshot_id for s in metadata.snapshots}
        newest_cut: int | None = None
        for s in metadata.snapshots:
            cut = s.parent_snapshot_id is not None and s.parent_snapshot_id not in listed
            if cut and (newest_cut is None or s.timestamp_ms > newest_cut):
                newest_cut = s.timestamp_ms
        if newest_cut is None:
            return 0
        return max(0, newest_cut - (now_ms - window_ms))
