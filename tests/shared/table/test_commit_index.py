"""The dedup index: every commit id a table lists, kept incrementally, and expiry that keeps
the dedup window.

Metadata is built by hand with chosen timestamps and commit ids; the index is judged by
what it finds and by how many snapshots it had to read (incremental: only new ones).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples
from icefloe.catalog.fs import FileSystemCatalog
from icefloe.errors import ValidationError
from icefloe.io.fileio import LocalFileIO
from icefloe.spec.datafile import DataFile
from icefloe.spec.metadata_builder import MetadataBuilder, new_table_metadata
from icefloe.spec.partition import PartitionSpec
from icefloe.spec.schema import Schema
from icefloe.spec.snapshot import MAIN_BRANCH, Operation, Snapshot, SnapshotRef, Summary
from icefloe.spec.sort_order import SortOrder
from icefloe.spec.types import LongType, NestedField
from icefloe.table.catalog import TableIdentifier
from icefloe.table.commit import RetryPolicy
from icefloe.table.commit_index import (
    DEDUP_WINDOW_MS,
    SUMMARY_COMMIT_IDS,
    CommitIndex,
    dedup_window_ms,
    snapshots_in_window,
)
from icefloe.table.maintenance import expire_snapshots, retained_snapshots
from icefloe.table.snapshot_producer import fast_append

DAY = 86_400_000
NOW = 1_700_000_000_000
QUICK = RetryPolicy(num_retries=3, min_wait_ms=1, max_wait_ms=5)


class Table:
    """Metadata with snapshots recording commit ids, at chosen times and branches."""

    def __init__(self, properties: dict[str, str] | None = None) -> None:
        self.metadata = new_table_metadata(
            Schema(NestedField(1, "id", LongType(), required=True)),
            PartitionSpec(0, ()),
            SortOrder.unsorted(),
            "/warehouse/db/t",
            properties or {},
        )
        self.next_id = 1

    def commit(self, ids: list[str], ts: int = NOW, branch: str = MAIN_BRANCH) -> int:
        parent = self.metadata.snapshot_by_ref(branch)
        sid = self.next_id
        self.next_id += 1
        extra = {SUMMARY_COMMIT_IDS: json.dumps(ids)} if ids else {}
        snapshot = Snapshot(
            snapshot_id=sid,
            parent_snapshot_id=parent.snapshot_id if parent else None,
            sequence_number=self.metadata.last_sequence_number + 1,
            timestamp_ms=ts,
            manifest_list=f"/warehouse/db/t/metadata/snap-{sid}.avro",
            summary=Summary(Operation.APPEND, extra),
        )
        old = self.metadata.refs.get(branch)
        ref = (
            old.model_copy(update={"snapshot_id": sid})
            if old is not None
            else SnapshotRef.branch(sid)
        )
        self.metadata = (
            MetadataBuilder(self.metadata).add_snapshot(snapshot).set_ref(branch, ref).build()
        )
        return sid

    def expire(self, *ids: int) -> None:
        self.metadata = MetadataBuilder(self.metadata).remove_snapshots(sorted(ids)).build()


def test_index_finds_commit_ids_on_every_branch_and_from_any_writer() -> None:
    t = Table()
    a = t.commit(["c1", "c2"])
    b = t.commit(["audit-1"], branch="audit")
    t.commit([])  # another engine's snapshot, without commit ids
    index = CommitIndex()
    index.update(t.metadata)
    assert (index.get("c1"), index.get("c2"), index.get("audit-1")) == (a, a, b)
    assert index.get("c3") is None and len(index) == 3


def test_index_reads_only_new_snapshots_per_commit() -> None:
    t = Table()
    for i in range(200):
        t.commit([f"c{i}"])
    index = CommitIndex()
    index.update(t.metadata)
    assert index.indexed == 200
    for i in range(200, 210):
        t.commit([f"c{i}"])
        index.update(t.metadata)
    assert index.indexed == 210 and index.rebuilds == 0
    assert index.get("c209") == 210


def test_index_keeps_ids_of_expired_snapshots_it_has_seen() -> None:
    t = Table()
    first = t.commit(["old"], ts=NOW - 30 * DAY)
    t.commit(["new"])
    index = CommitIndex()
    index.update(t.metadata)
    t.expire(first)
    index.update(t.metadata)
    assert index.rebuilds == 1
    assert index.get("old") == first and index.get("new") == 2


def test_coverage_gap_is_reported_when_history_inside_the_window_was_expired() -> None:
    t = Table()
    gone = t.commit(["a"], ts=NOW - 2 * DAY)
    t.commit(["b"], ts=NOW - DAY)
    index = CommitIndex()
    assert index.coverage_gap_ms(t.metadata, NOW, 7 * DAY) == 0
    t.expire(gone)  # as another engine would, inside the window
    assert index.coverage_gap_ms(t.metadata, NOW, 7 * DAY) == 6 * DAY
    assert index.coverage_gap_ms(t.metadata, NOW, DAY // 2) == 0


def test_expiry_keeps_snapshots_with_commit_ids_inside_the_window() -> None:
    t = Table({DEDUP_WINDOW_MS: str(3 * DAY)})
    old = t.commit(["old"], ts=NOW - 10 * DAY)
    inside = t.commit(["inside"], ts=NOW - 2 * DAY)
    foreign = t.commit([], ts=NOW - 2 * DAY + 1)
    t.commit(["head"], ts=NOW)
    retained, _ = retained_snapshots(t.metadata, now_ms=NOW, older_than_ms=NOW, retain_last=1)
    assert inside in retained and old not in retained and foreign not in retained
    assert snapshots_in_window(t.metadata, NOW, 3 * DAY) == {inside, 4}


def test_dedup_window_property_is_validated() -> None:
    assert dedup_window_ms({}) == 7 * DAY
    assert dedup_window_ms({DEDUP_WINDOW_MS: " 60000 "}) == 60_000
    for bad in ("soon", "-1"):
        with pytest.raises(ValidationError, match=DEDUP_WINDOW_MS):
            dedup_window_ms({DEDUP_WINDOW_MS: bad})


@settings(max_examples=examples(60), deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 3)), min_size=1, max_size=25))
def test_incremental_index_equals_a_fresh_build(steps: list[tuple[int, int]]) -> None:
    """Law: however commits and expiries interleave, the incrementally kept index knows at
    least every commit id a fresh build over the current metadata knows, with the same
    snapshot."""
    t = Table()
    index = CommitIndex()
    n = 0
    for action, branch in steps:
        if action < 2 or len(t.metadata.snapshots) < 2:
            n += 1
            t.commit([f"c{n}"], branch=f"b{branch}" if branch else MAIN_BRANCH)
        else:
            heads = {r.snapshot_id for r in t.metadata.refs.values()}
            victims = [s.snapshot_id for s in t.metadata.snapshots if s.snapshot_id not in heads]
            if victims:
                t.expire(victims[0])
        index.update(t.metadata)
        fresh = CommitIndex()
        fresh.update(t.metadata)
        for s in t.metadata.snapshots:
            for cid in json.loads((s.summary or {}).get(SUMMARY_COMMIT_IDS, "[]")):
                assert index.get(cid) == fresh.get(cid) == s.snapshot_id


async def test_expire_snapshots_keeps_the_window_and_refuses_expiring_inside_it(
    tmp_path: Path,
) -> None:
    """On a real table: expiry by age keeps icefloe's snapshots inside the window and
    removes them once the window is over; expiring one by id inside the window is refused."""
    catalog = FileSystemCatalog("dedup", str(tmp_path / "wh"), LocalFileIO())
    await catalog.create_namespace("db")
    table = await catalog.create_table(
        TableIdentifier(("db",), "t"),
        Schema(NestedField(1, "id", LongType(), required=True)),
        PartitionSpec(0, ()),
        properties={DEDUP_WINDOW_MS: str(DAY)},
    )
    for i in range(3):
        path = f"{table.location}/data/f{i}.parquet"
        await table.io.write(path, b"PAR1")
        table = await fast_append(
            table,
            [DataFile(path, "parquet", (), 1, 4)],
            snapshot_properties={SUMMARY_COMMIT_IDS: json.dumps([f"c{i}"])},
        ).commit(QUICK)
    ids = [s.snapshot_id for s in table.metadata.snapshots]
    now = max(s.timestamp_ms for s in table.metadata.snapshots) + 1
    with pytest.raises(ValidationError, match="dedup window"):
        await expire_snapshots(table, snapshot_ids=[ids[0]], now_ms=now, policy=QUICK)
    result = await expire_snapshots(table, older_than_ms=now, retain_last=1, now_ms=now)
    assert result.expired_snapshot_ids == []
    later = now + 2 * DAY
    result = await expire_snapshots(
        table, older_than_ms=later, retain_last=1, now_ms=later, policy=QUICK
    )
    assert sorted(result.expired_snapshot_ids) == sorted(ids[:2])
