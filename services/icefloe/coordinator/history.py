"""What the coordinator's snapshots record about their sources, and walks over it.

Every snapshot the coordinator commits records, in its summary (keys under ``icefloe.``,
which events refuse in writers' snapshot properties):

``icefloe.commit-ids``
    JSON list of the commit ids the snapshot applied.
``icefloe.offsets``
    JSON object ``{"<topic>/<partition>": next}``: the source partition's *safe resume
    point* for this table at commit time (the smallest offset of any of the table's events
    not yet done, else the partition position). Every event of the table below it is done
    (committed in this snapshot's history, or dead-lettered), so a consumer that takes the
    partition over skips the table's events below it. Entries of other partitions are
    carried forward from the parent, so the newest snapshot knows every partition.
``icefloe.positions``
    JSON object ``{"<topic>/<partition>": position}``: the partition position the committer
    had read up to, carried forward as a running maximum along the branch. Any snapshot
    that contains a unit was committed after all of that unit's events were read, so its
    position is above the unit's offsets; the running maximum makes that true of every later
    snapshot too. Walking back from the branch head, the first snapshot whose position is at
    or below the smallest offset of a batch therefore ends the search: neither it nor its
    ancestors can contain the batch. (A resume point alone cannot bound the search: one
    event pending for long holds it down while later commits keep landing.)

``icefloe.topic-ids``
    JSON object ``{"<topic>/<partition>": "<topic id>"}``: the Kafka topic id (KIP-516) of
    the source partition whose resume point the snapshot records, carried forward with the
    offsets. A resume point is a statement about one incarnation of the topic.

Offsets only mean something within one incarnation of a topic: after deleting and
re-creating the events topic under the same name, its offsets restart at 0 and the recorded
resume points would skip new events. The coordinator therefore checks, when it loads a
table, that the topic id recorded beside the resume point is the topic's id now (whatever
the new topic's end offset), and that the recorded position is not beyond the partition's
end offset (brokers without topic ids, truncation); if either fails, the topic was
re-created (or truncated), the resume point is not trusted, nothing is skipped by offset,
and the dedup index (commit ids) alone keeps commits exactly once.

Why a module: these summary keys are step 2 of the exactly-once argument (the table records
what it holds), read by the committer when it commits and by the table worker when it loads a
table and decides what to skip (:mod:`icefloe.coordinator.table_worker`); the rules for
reading them (running maxima, incarnations, the bounded walk) live in one place.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping

from icefloe.spec.metadata import TableMetadata
from icefloe.spec.snapshot import Snapshot
from icefloe.table.commit_index import SUMMARY_COMMIT_IDS as SUMMARY_COMMIT_IDS
from icefloe.table.commit_index import summary_commit_ids as summary_commit_ids

SUMMARY_OFFSETS = "icefloe.offsets"
SUMMARY_POSITIONS = "icefloe.positions"
SUMMARY_TOPIC_IDS = "icefloe.topic-ids"

DEFAULT_HISTORY_LIMIT = 10_000
"""How many snapshots a history walk may visit before giving up on proving absence."""


def source_key(topic: str, partition: int) -> str:
    """How a source partition is named in the summary maps."""
    return f"{topic}/{partition}"


def _json_map(summary: Mapping[str, str] | None, key: str) -> dict[str, int] | None:
    """An ``icefloe.*`` offset map, or None when absent or not ours (junk is ignored)."""
    if summary is None or key not in summary:
        return None
    try:
        obj = json.loads(summary[key])
    except (TypeError, ValueError):
        return None
    if not isinstance(obj, dict):
        return None
    return {str(k): v for k, v in obj.items() if isinstance(v, int) and not isinstance(v, bool)}


def _json_strs(raw: str | None) -> dict[str, str]:
    """A JSON object of strings (junk and non-strings ignored)."""
    try:
        obj = json.loads(raw) if raw is not None else None
    except (TypeError, ValueError):
        return {}
    return (
        {str(k): v for k, v in obj.items() if isinstance(v, str)} if isinstance(obj, dict) else {}
    )


def summary_offsets(snapshot: Snapshot) -> dict[str, int] | None:
    return _json_map(snapshot.summary, SUMMARY_OFFSETS)


def summary_positions(snapshot: Snapshot) -> dict[str, int] | None:
    return _json_map(snapshot.summary, SUMMARY_POSITIONS)


class History:
    """Ancestry walks over one table metadata, with snapshots indexed by id once."""

    def __init__(self, metadata: TableMetadata, limit: int = DEFAULT_HISTORY_LIMIT) -> None:
        self.metadata = metadata
        self.limit = limit
        self._by_id = {s.snapshot_id: s for s in metadata.snapshots}

    def snapshot(self, snapshot_id: int) -> Snapshot | None:
        return self._by_id.get(snapshot_id)

    def branch_heads(self) -> dict[str, Snapshot]:
        out = {}
        for name, ref in self.metadata.refs.items():
            snapshot = self._by_id.get(ref.snapshot_id)
            if ref.is_branch and snapshot is not None:
                out[name] = snapshot
        return out

    def ancestry(self, branch: str) -> Iterator[Snapshot]:
        """The branch head and its parents, newest first, up to ``limit`` snapshots."""
        ref = self.metadata.refs.get(branch)
        yield from self.ancestry_of(None if ref is None else ref.snapshot_id)

    def ancestry_of(self, snapshot_id: int | None) -> Iterator[Snapshot]:
        seen: set[int] = set()
        current = None if snapshot_id is None else self._by_id.get(snapshot_id)
        while current is not None and current.snapshot_id not in seen:
            if len(seen) >= self.limit:
                return
            seen.add(current.snapshot_id)
            yield current
            parent = current.parent_snapshot_id
            current = None if parent is None else self._by_id.get(parent)

    def latest_maps(self, branch: str) -> tuple[dict[str, int], dict[str, int]]:
        """The offsets and positions maps a new snapshot on ``branch`` carries forward."""
        offsets: dict[str, int] | None = None
        positions: dict[str, int] | None = None
        for snapshot in self.ancestry(branch):
            if offsets is None:
                offsets = summary_offsets(snapshot)
            if positions is None:
                positions = summary_positions(snapshot)
            if offsets is not None and positions is not None:
                break
        return offsets or {}, positions or {}

    def latest_topic_ids(self, branch: str) -> dict[str, str]:
        """The topic ids map a new snapshot on ``branch`` carries forward."""
        for snapshot in self.ancestry(branch):
            raw = snapshot.summary.get(SUMMARY_TOPIC_IDS) if snapshot.summary else None
            if raw is not None:
                return _json_strs(raw)
        return {}

    def committed(self, branch: str, source: str, min_offset: int) -> dict[str, int]:
        """Commit ids (to their snapshot ids) that may concern events at or after
        ``min_offset`` of ``source``: the walk stops at the first snapshot whose recorded
        position for the source is at or below it (see the module docstring).

        This proves only that *those events* were not committed, not that a commit id was
        not (a retry's events sit above every recorded position), so it no longer decides
        anything: whether a commit id is applied is the dedup index's question
        (:class:`~icefloe.table.commit_index.CommitIndex`). It stays as the benchmark's peer."""
        found: dict[str, int] = {}
        for snapshot in self.ancestry(branch):
            positions = summary_positions(snapshot)
            if positions is not None and positions.get(source, min_offset + 1) <= min_offset:
                break
            for commit_id in summary_commit_ids(snapshot):
                found.setdefault(commit_id, snapshot.snapshot_id)
        return found

    def recorded_position(self, source: str) -> int | None:
        """The highest partition position any branch recorded for ``source``: for the same
        incarnation of the topic it can never be above the partition's end offset."""
        best: int | None = None
        for branch in self.branch_heads():
            for snapshot in self.ancestry(branch):
                positions = summary_positions(snapshot)
                if positions is not None and source in positions:
                    value = positions[source]
                    best = value if best is None else max(best, value)
                    break
        return best

    def resume_by_incarnation(self, source: str) -> dict[str | None, int]:
        """The highest resume point the branches recorded for ``source``, by the topic id
        recorded beside it (None: recorded before topic ids were)."""
        best: dict[str | None, int] = {}
        for branch in self.branch_heads():
            for snapshot in self.ancestry(branch):
                offsets = summary_offsets(snapshot)
                if offsets is not None and source in offsets:
                    ids = snapshot.summary.get(SUMMARY_TOPIC_IDS) if snapshot.summary else None
                    topic_id = _json_strs(ids).get(source)
                    best[topic_id] = max(best.get(topic_id, offsets[source]), offsets[source])
                    break
        return best

    def resume_point(self, source: str) -> int | None:
        """The highest resume point any branch recorded for ``source``; every one is a true
        statement (what was done stays done), so the highest is the most useful."""
        best: int | None = None
        for branch in self.branch_heads():
            for snapshot in self.ancestry(branch):
                offsets = summary_offsets(snapshot)
                if offsets is not None and source in offsets:
                    value = offsets[source]
                    best = value if best is None else max(best, value)
                    break
        return best
