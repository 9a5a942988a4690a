"""The dedup ledger: the window's commit ids carried forward in a table property, so that a
commit id stays recognised when any engine expires the snapshot that applied it.

The ledger is judged against a model (the commit ids of every commit inside the window), by
readers that take in some versions and skip others, and through the dedup index on
metadata whose snapshots were expired behind the coordinator's back.
"""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples
from icefloe.spec.metadata_builder import MetadataBuilder, new_table_metadata
from icefloe.spec.partition import PartitionSpec
from icefloe.spec.schema import Schema
from icefloe.spec.snapshot import MAIN_BRANCH, Operation, Snapshot, SnapshotRef, Summary
from icefloe.spec.sort_order import SortOrder
from icefloe.spec.types import LongType, NestedField
from icefloe.table.commit_index import (
    DEDUP_WINDOW_MS,
    SUMMARY_COMMIT_IDS,
    CommitIndex,
    ledger_properties,
)
from icefloe.table.dedup_ledger import (
    DIGEST_CHARS,
    LEDGER_PROPERTY,
    DedupLedger,
    commit_digest,
    extend_ledger,
    ledger_entry,
)

DAY = 86_400_000
NOW = 1_700_000_000_000


class Table:
    """Metadata committed as the coordinator does: commit ids in the summary, the ledger
    carried forward in the same commit (``ledger=False``: a writer from before the ledger)."""

    def __init__(self, window_ms: int = 7 * DAY) -> None:
        self.metadata = new_table_metadata(
            Schema(NestedField(1, "id", LongType(), required=True)),
            PartitionSpec(0, ()),
            SortOrder.unsorted(),
            "/warehouse/db/t",
            {DEDUP_WINDOW_MS: str(window_ms)},
        )
        self.next_id = 1
        self.index = CommitIndex()  # the committer's own index

    def commit(self, ids: list[str], ts: int, *, ledger: bool = True) -> int:
        parent = self.metadata.snapshot_by_ref(MAIN_BRANCH)
        sid = self.next_id
        self.next_id += 1
        snapshot = Snapshot(
            snapshot_id=sid,
            parent_snapshot_id=parent.snapshot_id if parent else None,
            sequence_number=self.metadata.last_sequence_number + 1,
            timestamp_ms=ts,
            manifest_list=f"/warehouse/db/t/metadata/snap-{sid}.avro",
            summary=Summary(Operation.APPEND, {SUMMARY_COMMIT_IDS: json.dumps(ids)} if ids else {}),
        )
        builder = MetadataBuilder(self.metadata).add_snapshot(snapshot)
        builder.set_ref(MAIN_BRANCH, SnapshotRef.branch(sid))
        if ledger:
            self.index.update(self.metadata)
            builder.set_properties(ledger_properties(self.metadata, self.index, snapshot, ids))
        self.metadata = builder.build()
        return sid

    def expire(self, snapshot_ids: list[int]) -> None:
        """What another engine's expire_snapshots does: drop them, properties untouched."""
        self.metadata = MetadataBuilder(self.metadata).remove_snapshots(snapshot_ids).build()


def test_digests_are_fixed_width_and_distinct() -> None:
    a, b = commit_digest("job-1"), commit_digest("job-2")
    assert len(a) == len(b) == DIGEST_CHARS and a != b
    assert commit_digest("ünïcode:id with spaces") != commit_digest("unicode:id with spaces")
    assert ":" not in a and " " not in a


def test_an_expired_snapshot_stays_recognised_through_the_ledger() -> None:
    table = Table()
    x = table.commit(["job-x", "job-x2"], NOW)
    table.commit(["job-y"], NOW + 1)
    table.expire([x])
    fresh = CommitIndex()  # a restarted coordinator, a writer looking after a timeout
    fresh.update(table.metadata)
    assert fresh.get("job-x") == x and fresh.get("job-x2") == x
    assert "job-x" in fresh and not fresh.is_listed(x)
    assert fresh.get("job-y") == 2 and fresh.is_listed(2)
    assert fresh.get("never") is None and "never" not in fresh


def test_a_foreign_commit_and_expiry_of_every_icefloe_snapshot_keep_the_ledger() -> None:
    table = Table()
    x = table.commit(["job-x"], NOW)
    y = table.commit([], NOW + 1, ledger=False)  # another engine's append
    table.expire([x])
    assert [s.snapshot_id for s in table.metadata.snapshots] == [y]
    fresh = CommitIndex()
    fresh.update(table.metadata)
    assert fresh.get("job-x") == x


def test_the_first_commit_seeds_the_ledger_of_a_table_from_before_it() -> None:
    table = Table(window_ms=DAY)
    old = table.commit(["old"], NOW - 2 * DAY, ledger=False)
    recent = table.commit(["recent-1", "recent-2"], NOW - 1000, ledger=False)
    table.commit(["new"], NOW)
    entries = table.metadata.properties[LEDGER_PROPERTY].split()[1:]
    assert [int(e.split(":")[0]) for e in entries] == [recent, 3]  # "old" is outside
    table.expire([old, recent])
    fresh = CommitIndex()
    fresh.update(table.metadata)
    assert fresh.get("recent-1") == recent and fresh.get("recent-2") == recent
    assert fresh.get("new") == 3
    assert fresh.get("old") is None


def test_entries_leave_the_ledger_once_older_than_the_window() -> None:
    table = Table(window_ms=DAY)
    first = table.commit(["a"], NOW)
    table.commit(["b"], NOW + DAY // 2)
    table.commit(["c"], NOW + DAY + 1)
    entries = table.metadata.properties[LEDGER_PROPERTY].split()[1:]
    assert [int(e.split(":")[0]) for e in entries] == [2, 3]
    table.expire([first])
    fresh = CommitIndex()
    fresh.update(table.metadata)
    assert fresh.get("a") is None and fresh.get("b") == 2
    # A reader that saw "a" while it was carried keeps knowing it.
    assert table.index.get("a") == first


def test_expiry_covered_by_the_ledger_leaves_no_dedup_gap() -> None:
    table = Table(window_ms=DAY)
    table.commit(["x"], NOW)
    x2 = table.commit(["x2"], NOW + 10)
    table.commit(["y"], NOW + 20)
    table.expire([x2])  # the ledger carries the expired snapshot's ids: no gap
    assert CommitIndex().coverage_gap_ms(table.metadata, NOW + 30, DAY) == 0
    # Expired before any ledger: a gap up to the cut, until the window has passed.
    bare = Table(window_ms=DAY)
    gone = bare.commit(["a"], NOW, ledger=False)
    bare.commit(["b"], NOW + 10, ledger=False)
    bare.expire([gone])
    assert CommitIndex().coverage_gap_ms(bare.metadata, NOW + 30, DAY) == DAY - 20
    bare.commit(["c"], NOW + 20)  # the first ledger cannot bring "a" back
    assert CommitIndex().coverage_gap_ms(bare.metadata, NOW + 30, DAY) == DAY - 20
    assert CommitIndex().coverage_gap_ms(bare.metadata, NOW + 10 + DAY, DAY) == 0


def test_garbage_ledgers_are_ignored_by_readers_and_replaced_by_writers() -> None:
    ledger = DedupLedger()
    for junk in ("", "v9 1:2:abc", "v1 x:y:z", "v1 1:2:short", "v1 ::: 5"):
        ledger.take_in(junk)
        assert len(ledger) == 0
    replaced = extend_ledger("not a ledger", [ledger_entry(7, NOW, ["k"])], NOW - DAY)
    ledger.take_in(replaced)
    assert ledger.get("k") == 7


@st.composite
def histories(draw: st.DrawFn) -> tuple[list[tuple[list[str], int]], list[bool]]:
    n = draw(st.integers(1, 30))
    commits = []
    ts = NOW
    for i in range(n):
        ts += draw(st.integers(0, DAY // 2))
        k = draw(st.integers(0, 4))
        commits.append(([f"c{i}-{j}" for j in range(k)], ts))
    seen = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    return commits, seen


@settings(max_examples=examples(100))
@given(histories())
def test_a_reader_that_skips_versions_knows_every_commit_of_the_window(
    case: tuple[list[tuple[list[str], int]], list[bool]],
) -> None:
    commits, seen = case
    table = Table(window_ms=2 * DAY)
    reader = CommitIndex()
    applied: dict[str, tuple[int, int]] = {}
    for (ids, ts), look in zip(commits, seen, strict=True):
        sid = table.commit(ids, ts)
        applied.update({c: (sid, ts) for c in ids})
        # Another engine expires everything but the head, behind everyone's back.
        table.expire([s.snapshot_id for s in table.metadata.snapshots if s.snapshot_id != sid])
        if look:
            reader.update(table.metadata)
    reader.update(table.metadata)
    fresh = CommitIndex()
    fresh.update(table.metadata)
    last_ts = commits[-1][1]
    for commit_id, (sid, ts) in applied.items():
        if ts >= last_ts - 2 * DAY:
            assert fresh.get(commit_id) == sid and reader.get(commit_id) == sid
    assert fresh.get("never-applied") is None and reader.get("never-applied") is None


def test_a_table_without_a_window_gets_the_coordinators_written_into_it() -> None:
    """The window every party keeps is the table's: the first commit writes the coordinator's
    default there, and after that the table's value is the one used, whatever the default."""
    table = Table()
    table.metadata = MetadataBuilder(table.metadata).remove_properties([DEDUP_WINDOW_MS]).build()
    snapshot = Snapshot(
        snapshot_id=1,
        parent_snapshot_id=None,
        sequence_number=1,
        timestamp_ms=NOW,
        manifest_list="/warehouse/db/t/metadata/snap-1.avro",
        summary=Summary(Operation.APPEND, {SUMMARY_COMMIT_IDS: json.dumps(["a"])}),
    )
    table.index.update(table.metadata)
    written = ledger_properties(table.metadata, table.index, snapshot, ["a"], 30 * DAY)
    assert written[DEDUP_WINDOW_MS] == str(30 * DAY) and LEDGER_PROPERTY in written
    # a table that sets its own window keeps it: nothing but the ledger is written
    own = Table(window_ms=DAY)
    own.index.update(own.metadata)
    assert set(ledger_properties(own.metadata, own.index, snapshot, ["a"], 30 * DAY)) == {
        LEDGER_PROPERTY
    }
