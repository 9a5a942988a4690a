"""What exactly-once by commit id costs: the dedup index on a table of 10,000 snapshots.

The coordinator decides whether a commit id is already applied from the dedup index
(:mod:`icefloe.table.commit_index`) over every snapshot the table lists. The index is built once
when a table is loaded and then kept incrementally, so each commit only reads the snapshots
that are new since the last look (one, when the coordinator is the only writer).

Figures, on metadata of ``snapshots`` snapshots (10,000) each recording ``ids`` commit ids
(4), all in memory (no storage: these are the coordinator's CPU costs):

* **check per commit**: take in one new metadata version (one more snapshot) and look up a
  batch's ``ids`` commit ids. Peers: the check before issue #9 (the branch history walked
  back to the first snapshot whose recorded Kafka position is at or below the batch's
  lowest offset: cheap, but it proved only that *those events* were not committed, not the
  commit id), and a correct check without an index (every listed snapshot's summary
  parsed on every commit).
* **index build on load**: building the index from scratch (the dedup ledger included),
  beside parsing the same metadata JSON, which every load of the table does anyway.
* **ledger carried forward per commit**: the new ``icefloe.dedup.ledger`` value a commit
  writes (:mod:`icefloe.table.dedup_ledger`: the window's commit ids, so that they outlive the
  expiry of their snapshots by any engine), beside writing the metadata JSON with and
  without the ledger, which every commit does anyway.

The metadata carries the ledger of all its snapshots (all inside the window), as a table
the coordinator commits to does. The index's memory (``tracemalloc``, retained after the
build), the ledger's bytes per commit id and the metadata's size with and without it are
printed as notes.
"""

from __future__ import annotations

import json
import tracemalloc
from typing import Any

from icefloe.coordinator.history import SUMMARY_OFFSETS, SUMMARY_POSITIONS, History
from icefloe.dev.bench import BenchContext, Figure, Kind, benchmark
from icefloe.spec.metadata import TableMetadata, parse_table_metadata
from icefloe.spec.snapshot import Operation, Snapshot, Summary
from icefloe.table.commit_index import (
    SUMMARY_COMMIT_IDS,
    CommitIndex,
    ledger_properties,
    summary_commit_ids,
)
from icefloe.table.dedup_ledger import LEDGER_PROPERTY, extend_ledger, ledger_entry

SOURCE = "icefloe.events/0"


BASE_TS = 1_700_000_000_000


def commit_ids(n: int, ids: int) -> list[str]:
    return [f"job-{n}-{i}" for i in range(ids)]


def metadata_json(snapshots: int, ids: int, *, ledger: bool = True) -> dict[str, Any]:
    """Format v2 metadata of one unpartitioned table with a chain of icefloe snapshots
    (and, unless ``ledger`` is false, the dedup ledger they wrote)."""
    base_ts = BASE_TS
    snaps = []
    entries = [ledger_entry(n, base_ts + n, commit_ids(n, ids)) for n in range(1, snapshots + 1)]
    properties = {LEDGER_PROPERTY: extend_ledger(None, entries, 0)} if ledger else {}
    for n in range(1, snapshots + 1):
        snaps.append(
            {
                "snapshot-id": n,
                **({"parent-snapshot-id": n - 1} if n > 1 else {}),
                "sequence-number": n,
                "timestamp-ms": base_ts + n,
                "manifest-list": f"/wh/db/t/metadata/snap-{n}.avro",
                "schema-id": 0,
                "summary": {
                    "operation": "append",
                    SUMMARY_COMMIT_IDS: json.dumps(commit_ids(n, ids)),
                    SUMMARY_OFFSETS: json.dumps({SOURCE: n * 10}),
                    SUMMARY_POSITIONS: json.dumps({SOURCE: n * 10 + 5}),
                },
            }
        )
    return {
        "format-version": 2,
        "table-uuid": "9f0e8c52-0d1c-4b53-9a59-2a1f2d8f6f00",
        "location": "/wh/db/t",
        "last-sequence-number": snapshots,
        "last-updated-ms": base_ts + snapshots,
        "last-column-id": 1,
        "current-schema-id": 0,
        "schemas": [
            {
                "type": "struct",
                "schema-id": 0,
                "fields": [{"id": 1, "name": "id", "required": True, "type": "long"}],
            }
        ],
        "default-spec-id": 0,
        "partition-specs": [{"spec-id": 0, "fields": []}],
        "last-partition-id": 999,
        "default-sort-order-id": 0,
        "sort-orders": [{"order-id": 0, "fields": []}],
        "properties": properties,
        "current-snapshot-id": snapshots,
        "refs": {"main": {"snapshot-id": snapshots, "type": "branch"}},
        "snapshots": snaps,
    }


@benchmark("dedup")
def dedup_benchmark(ctx: BenchContext) -> list[Figure]:
    """Dedup index: check per commit and build on load, on 10,000 snapshots."""
    n = ctx.size("snapshots", full=10_000, quick=2_000)
    ids = ctx.size("ids", full=4, quick=4)
    raw = json.dumps(metadata_json(n + 1, ids))
    full = parse_table_metadata(raw)
    before = parse_table_metadata(json.dumps(metadata_json(n, ids)))
    batch = [f"new-{i}" for i in range(ids)]  # not in the table: the common case
    state: dict[str, CommitIndex] = {}

    def fresh_index() -> None:  # untimed: the index as it was before this commit
        index = CommitIndex()
        index.update(before)
        state["index"] = index

    def incremental() -> None:
        index = state["index"]
        index.update(full)
        for commit_id in batch:
            index.get(commit_id)

    def position_walk() -> None:
        History(full).committed("main", SOURCE, min_offset=(n + 1) * 10)

    def full_walk() -> None:
        found = set()
        for snapshot in full.snapshots:
            found.update(summary_commit_ids(snapshot))
        for commit_id in batch:
            _ = commit_id in found

    per_commit = ctx.compare(
        {
            "icefloe": incremental,
            "position walk (before #9)": position_walk,
            "full walk, no index": full_walk,
        },
        work=1,
        setup={"icefloe": fresh_index},
    )

    def build() -> None:
        fresh = CommitIndex()
        fresh.update(full)

    def parse() -> TableMetadata:
        return parse_table_metadata(raw)

    on_load = ctx.compare({"icefloe": build, "metadata parse": parse}, work=1)

    # The ledger a commit writes on top of ``before`` (its index up to date, as in the
    # committer, which takes in the base before it builds).
    carried = CommitIndex()
    carried.update(before)
    new_snapshot = Snapshot(
        snapshot_id=n + 1,
        parent_snapshot_id=n,
        sequence_number=n + 1,
        timestamp_ms=BASE_TS + n + 1,
        manifest_list="/wh/db/t/metadata/snap-new.avro",
        summary=Summary(Operation.APPEND, {SUMMARY_COMMIT_IDS: json.dumps(batch)}),
    )
    without = parse_table_metadata(json.dumps(metadata_json(n + 1, ids, ledger=False)))

    def carry() -> None:
        ledger_properties(before, carried, new_snapshot, batch)

    carrying = ctx.compare(
        {
            "icefloe": carry,
            "metadata write, with the ledger": full.to_json_bytes,
            "metadata write, no ledger": without.to_json_bytes,
        },
        work=1,
    )
    ledger_bytes = len(full.properties[LEDGER_PROPERTY])
    with_size, without_size = len(full.to_json_bytes()), len(without.to_json_bytes())
    ctx.note(
        f"dedup ledger of {n + 1} snapshots x {ids} commit ids: {ledger_bytes / 1e6:.2f} MB, "
        f"{ledger_bytes / ((n + 1) * ids):.1f} bytes per commit id; the metadata JSON "
        f"{with_size / 1e6:.2f} MB with it, {without_size / 1e6:.2f} MB without "
        f"(+{100 * (with_size - without_size) / without_size:.0f}%)"
    )

    tracemalloc.start()
    start = tracemalloc.take_snapshot()
    kept = CommitIndex()
    kept.update(full)
    end = tracemalloc.take_snapshot()
    tracemalloc.stop()
    size = sum(s.size_diff for s in end.compare_to(start, "filename"))
    ctx.note(
        f"index memory for {n + 1} snapshots x {ids} commit ids: {size / 1e6:.2f} MB "
        f"({size / max(1, len(kept)):.0f} bytes per commit id, the ids' strings included)"
    )
    return [
        Figure(
            f"dedup check per commit ({n} snapshots)",
            "commits",
            per_commit.pop("icefloe"),
            per_commit,
            kind=Kind.LATENCY,
        ),
        Figure(
            f"dedup index build on load ({n} snapshots)",
            "loads",
            on_load.pop("icefloe"),
            on_load,
            kind=Kind.LATENCY,
        ),
        Figure(
            f"dedup ledger carried forward per commit ({n} snapshots)",
            "commits",
            carrying.pop("icefloe"),
            carrying,
            kind=Kind.LATENCY,
        ),
    ]
