"""Tests for icefloe.coordinator.committer: event checks and exactly-once commits of units, on a
local file-system catalog with real (small) data files."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import crashing_coordinator
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples
from icefloe.catalog.uri import load_catalog
from icefloe.coordinator.batcher import PendingFiles, Unit
from icefloe.coordinator.commit_hooks import COMMIT_STAGES, CommitHooks, install_commit_hooks
from icefloe.coordinator.committer import SUMMARY_COMMIT_IDS, TableCommitter, summary_commit_ids
from icefloe.coordinator.history import SUMMARY_OFFSETS, SUMMARY_POSITIONS, History, source_key
from icefloe.errors import CommitStateUnknownError, EventRejectedError
from icefloe.events import CommitOperation, CommitRequested, FilesWritten
from icefloe.manifests.reader import ManifestReader
from icefloe.spec.datafile import DataFile, DataFileContent
from icefloe.spec.metadata_builder import MetadataBuilder
from icefloe.spec.partition import PartitionField, PartitionSpec
from icefloe.spec.schema import Schema
from icefloe.spec.schema_update import UpdateSchema
from icefloe.spec.snapshot import SnapshotRef
from icefloe.spec.transforms import IdentityTransform
from icefloe.spec.types import DoubleType, LongType, NestedField, StringType
from icefloe.spec.values import to_bytes
from icefloe.table.catalog import Catalog, Table

SOURCE = source_key("events", 3)
SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "cat", StringType()),
    NestedField(3, "score", DoubleType()),
)
SPEC = PartitionSpec(0, (PartitionField(2, 1000, "cat", IdentityTransform()),))
REPO = Path(__file__).resolve().parents[3]


class Env:
    """A file-system catalog with one table, and helpers that write real data files."""

    def __init__(self, catalog: Catalog, table: Table) -> None:
        self.catalog = catalog
        self.table = table
        self.name = str(table.identifier)
        self.offset = 0
        self.counter = 0

    def data_file(
        self, cat: str = "a", size: int = 64, write: bool = True, **changes: Any
    ) -> DataFile:
        self.counter += 1
        path = f"{self.table.location}/data/cat={cat}/f{self.counter:05d}.parquet"
        if write:
            local = Path(path.removeprefix("file://"))
            local.parent.mkdir(parents=True, exist_ok=True)
            local.write_bytes(b"x" * size)
        values: dict[str, Any] = {
            "file_path": path,
            "file_format": "parquet",
            "partition": (cat,),
            "record_count": 10,
            "file_size_in_bytes": size,
            "value_counts": {1: 10},
            "null_value_counts": {1: 0},
            "lower_bounds": {1: to_bytes(LongType(), 0)},
            "upper_bounds": {1: to_bytes(LongType(), 9)},
        }
        values.update(changes)
        return DataFile(**values)

    def event(
        self, commit_id: str, files: list[DataFile], deletes: list[DataFile] = (), **kw: Any
    ) -> FilesWritten:
        md = self.table.metadata
        return FilesWritten.from_data_files(
            self.name,
            commit_id,
            "w",
            f"{commit_id}-a0",
            md.schema(),
            md.spec(),
            files,
            deletes,
            **kw,
        )

    def unit(
        self,
        commit_id: str,
        files: list[DataFile] | None = None,
        operation: CommitOperation = CommitOperation.APPEND,
        deletes: list[DataFile] = (),
        **request: Any,
    ) -> Unit:
        files = [self.data_file()] if files is None else files
        event = self.event(commit_id, files, deletes)
        pending = PendingFiles(event, self.offset, tuple(files), tuple(deletes))
        self.offset += 1
        fields: dict[str, Any] = {"attempt_ids": (f"{commit_id}-a0",)} if files or deletes else {}
        fields.update(request)
        req = CommitRequested(table=self.name, commit_id=commit_id, operation=operation, **fields)
        unit = Unit(req, self.offset, (pending,) if files or deletes else ())
        self.offset += 1
        return unit

    def committer(self, **kwargs: Any) -> TableCommitter:
        return TableCommitter(self.catalog, self.name, SOURCE, **kwargs)

    async def reload(self) -> Table:
        self.table = await self.catalog.load_table(self.name)
        return self.table

    async def live_files(self, branch: str = "main") -> list[str]:
        table = await self.reload()
        head = table.metadata.snapshot_by_ref(branch)
        if head is None:
            return []
        reader = ManifestReader(table.io)
        out = []
        for manifest in await reader.manifests(head):
            for entry in await reader.entries(manifest, table.metadata.specs(), live_only=True):
                out.append(entry.data_file.file_path)
        return out


async def make_env(root: Path, format_version: int = 2, name: str = "db.t") -> Env:
    catalog = load_catalog(f"file://{root}/wh")
    if not await catalog.namespace_exists("db"):
        await catalog.create_namespace("db")
    table = await catalog.create_table(name, SCHEMA, SPEC, format_version=format_version)
    return Env(catalog, table)


@pytest.fixture
async def env(tmp_path: Path) -> Any:
    e = await make_env(tmp_path)
    yield e
    await e.catalog.close()


# -- commits ------------------------------------------------------------------------------


async def test_batch_becomes_one_snapshot_with_commit_ids_and_offsets(env: Env) -> None:
    units = [env.unit(f"c{i}", [env.data_file(), env.data_file()]) for i in range(3)]
    committer = env.committer()
    outcome = await committer.commit(units, resume_offset=2, position=40)
    assert len(outcome.snapshots) == 1 and not outcome.rejected and not outcome.already_committed
    snapshot, committed = outcome.snapshots[0]
    assert [u.commit_id for u in committed] == ["c0", "c1", "c2"]
    summary = snapshot.summary
    assert summary is not None
    assert json.loads(summary[SUMMARY_COMMIT_IDS]) == ["c0", "c1", "c2"]
    assert json.loads(summary[SUMMARY_OFFSETS]) == {SOURCE: 2}
    assert json.loads(summary[SUMMARY_POSITIONS]) == {SOURCE: 40}
    assert summary["added-data-files"] == "6"
    assert sorted(await env.live_files()) == sorted(
        f.file_path for u in units for f in u.data_files
    )
    assert committer.resume_point() == 2


async def test_replayed_units_are_acknowledged_not_committed_again(env: Env) -> None:
    first = [env.unit("c1"), env.unit("c2")]
    await env.committer().commit(first, resume_offset=4, position=4)
    # A restarted coordinator re-reads the same events (same offsets) and one new commit.
    again = [*first, env.unit("c3")]
    outcome = await env.committer().commit(again, resume_offset=6, position=6)
    snapshot_id = (await env.reload()).metadata.snapshots[0].snapshot_id
    assert outcome.already_committed == {"c1": snapshot_id, "c2": snapshot_id}
    assert [u.commit_id for u in outcome.committed_units] == ["c3"]
    live = await env.live_files()
    assert len(live) == len(set(live)) == 3
    # Everything already there: no new snapshot at all.
    outcome = await env.committer().commit(first, resume_offset=6, position=6)
    assert outcome.snapshots == [] and set(outcome.already_committed) == {"c1", "c2"}
    assert len((await env.reload()).metadata.snapshots) == 2


async def test_history_walk_is_bounded_by_positions_not_resume_points(env: Env) -> None:
    """A long-pending event keeps the resume point low while commits land; the walk must
    still find an old commit id (the position bound), and stop where positions end."""
    c1 = env.unit("c1")  # offsets 0, 1
    committer = env.committer()
    await committer.commit([c1], resume_offset=0, position=10)
    for i in range(5):
        unit = env.unit(f"later{i}")
        await committer.commit([unit], resume_offset=0, position=20 + i)
    outcome = await env.committer().commit([c1], resume_offset=0, position=30)
    assert set(outcome.already_committed) == {"c1"}
    history = History((await env.reload()).metadata)
    assert "c1" in history.committed("main", SOURCE, min_offset=0)
    # Snapshots whose position is at or below a batch's first offset cannot contain it.
    assert history.committed("main", SOURCE, min_offset=24) == {}
    assert set(history.committed("main", SOURCE, min_offset=23)) == {"later4"}
    assert history.resume_point(SOURCE) == 0
    assert history.resume_point("other/0") is None


async def test_zombie_committer_on_a_stale_base_never_adds_a_file_twice(env: Env) -> None:
    units = [env.unit(f"c{i}") for i in range(4)]
    zombie = env.committer()
    await zombie.load()  # holds the empty table as its base
    owner = env.committer()
    await owner.commit(units[:3], resume_offset=6, position=6)
    outcome = await zombie.commit(units, resume_offset=8, position=8)
    assert set(outcome.already_committed) == {"c0", "c1", "c2"}
    assert [u.commit_id for u in outcome.committed_units] == ["c3"]
    assert outcome.stats.conflicts >= 1
    live = await env.live_files()
    assert len(live) == len(set(live)) == 4


async def test_unknown_outcome_is_resolved_by_checking_not_retrying(env: Env) -> None:
    real_commit = env.catalog.commit
    calls = Counter[str]()

    async def lost_response(table: Table, metadata: Any) -> Table:
        calls["commit"] += 1
        committed = await real_commit(table, metadata)
        if calls["commit"] == 1:
            raise CommitStateUnknownError("the store timed out after applying the swap")
        return committed

    env.catalog.commit = lost_response  # type: ignore[method-assign]
    outcome = await env.committer().commit([env.unit("c1")], resume_offset=2, position=2)
    assert calls["commit"] == 1
    assert [u.commit_id for u in outcome.committed_units] == ["c1"]
    assert len((await env.reload()).metadata.snapshots) == 1


async def test_unknown_outcome_that_did_not_apply_is_committed_once(env: Env) -> None:
    real_commit = env.catalog.commit
    calls = Counter[str]()

    async def failed_request(table: Table, metadata: Any) -> Table:
        calls["commit"] += 1
        if calls["commit"] == 1:
            raise CommitStateUnknownError("connection reset before the store answered")
        return await real_commit(table, metadata)

    env.catalog.commit = failed_request  # type: ignore[method-assign]
    outcome = await env.committer().commit([env.unit("c1")], resume_offset=2, position=2)
    assert calls["commit"] == 2
    assert len(outcome.committed_units) == 1
    assert len(await env.live_files()) == 1


async def test_file_already_live_refuses_only_its_unit(env: Env) -> None:
    shared = env.data_file()
    await env.committer().commit([env.unit("first", [shared])], resume_offset=2, position=2)
    dup = env.unit("dup", [shared, env.data_file()])
    fine = env.unit("fine")
    twice = env.data_file()
    both = [env.unit("x", [twice]), env.unit("y", [twice])]
    outcome = await env.committer().commit([dup, fine, *both], resume_offset=9, position=9)
    rejected = {u.commit_id: e for u, e in outcome.rejected}
    assert set(rejected) == {"dup", "y"}
    assert all(e.kind == "duplicate-file" for e in rejected.values())
    assert "already in table" in str(rejected["dup"])
    assert "also added by commit id 'x'" in str(rejected["y"])
    assert [u.commit_id for u in outcome.committed_units] == ["fine", "x"]
    live = await env.live_files()
    assert len(live) == len(set(live)) == 3


async def test_branch_commits_record_and_resume_per_branch(env: Env) -> None:
    committer = env.committer()
    first = env.unit("m1")
    await committer.commit([first], resume_offset=2, position=2)
    audit = env.unit("b1", branch="audit")
    outcome = await committer.commit([audit], resume_offset=7, position=7)
    table = await env.reload()
    assert table.metadata.refs["audit"].snapshot_id == outcome.snapshots[0][0].snapshot_id
    assert audit.data_files[0].file_path in await env.live_files("audit")
    assert await env.live_files("main") == [f.file_path for f in first.data_files]
    assert History(table.metadata).resume_point(SOURCE) == 7


# -- operations ---------------------------------------------------------------------------


async def test_overwrite_by_filter_removes_matching_files_and_refuses_partial_ones(
    env: Env,
) -> None:
    a = env.data_file("a")
    b = env.data_file("b")
    await env.committer().commit([env.unit("base", [a, b])], resume_offset=2, position=2)
    replacement = env.data_file("a")
    overwrite = env.unit(
        "ow",
        [replacement],
        CommitOperation.OVERWRITE,
        overwrite_filter={"type": "eq", "term": "cat", "value": "a"},
    )
    outcome = await env.committer().commit([overwrite], resume_offset=4, position=4)
    assert not outcome.rejected
    assert sorted(await env.live_files()) == sorted([b.file_path, replacement.file_path])
    # id < 5 holds for only part of b's rows (ids 0..9): removing b would lose rows.
    partial = env.unit(
        "partial",
        [],
        CommitOperation.OVERWRITE,
        attempt_ids=(),
        overwrite_filter={"type": "lt", "term": "id", "value": 5},
    )
    outcome = await env.committer().commit([partial], resume_offset=6, position=6)
    assert [(u.commit_id, e.kind) for u, e in outcome.rejected] == [("partial", "conflict")]
    assert "may hold rows both matching and not matching" in str(outcome.rejected[0][1])


async def test_dynamic_overwrite_replaces_written_partitions(env: Env) -> None:
    old_a, old_b = env.data_file("a"), env.data_file("b")
    await env.committer().commit([env.unit("base", [old_a, old_b])], resume_offset=2, position=2)
    new_a = env.data_file("a")
    outcome = await env.committer().commit(
        [env.unit("dyn", [new_a], CommitOperation.OVERWRITE)], resume_offset=4, position=4
    )
    assert outcome.snapshots[0][0].summary["deleted-data-files"] == "1"
    assert sorted(await env.live_files()) == sorted([old_b.file_path, new_a.file_path])


async def test_rewrite_and_row_delta(env: Env) -> None:
    small = [env.data_file("a"), env.data_file("a")]
    await env.committer().commit([env.unit("base", small)], resume_offset=2, position=2)
    compacted = env.data_file("a", size=128, record_count=20, value_counts={1: 20})
    rewrite = env.unit(
        "compact",
        [compacted],
        CommitOperation.REWRITE,
        rewritten_files=tuple(f.file_path for f in small),
    )
    outcome = await env.committer().commit([rewrite], resume_offset=4, position=4)
    assert outcome.snapshots[0][0].summary.operation == "replace"
    assert await env.live_files() == [compacted.file_path]
    # Rewriting files that are gone is refused, not half-applied.
    stale = env.unit(
        "stale",
        [env.data_file("a")],
        CommitOperation.REWRITE,
        rewritten_files=(small[0].file_path,),
    )
    outcome = await env.committer().commit([stale], resume_offset=6, position=6)
    assert [(u.commit_id, e.kind) for u, e in outcome.rejected] == [("stale", "conflict")]
    deletes = env.data_file(
        "a",
        content=DataFileContent.POSITION_DELETES,
        referenced_data_file=compacted.file_path,
        value_counts=None,
        null_value_counts=None,
        lower_bounds=None,
        upper_bounds=None,
    )
    delta = env.unit("delta", [], CommitOperation.ROW_DELTA, deletes=[deletes])
    outcome = await env.committer().commit([delta], resume_offset=8, position=8)
    assert not outcome.rejected
    assert outcome.snapshots[0][0].summary["added-delete-files"] == "1"


async def test_base_snapshot_conflicts_are_detected(env: Env) -> None:
    committer = env.committer()
    await committer.commit([env.unit("base")], resume_offset=2, position=2)
    base_id = (await env.reload()).metadata.current_snapshot_id
    await committer.commit(
        [env.unit("concurrent", [env.data_file("a")])], resume_offset=4, position=4
    )
    overwrite = env.unit(
        "ow",
        [env.data_file("a")],
        CommitOperation.OVERWRITE,
        overwrite_filter={"type": "eq", "term": "cat", "value": "a"},
        base_snapshot_id=base_id,
    )
    outcome = await committer.commit([overwrite], resume_offset=6, position=6)
    assert [(u.commit_id, e.kind) for u, e in outcome.rejected] == [("ow", "conflict")]
    assert "was added after base snapshot" in str(outcome.rejected[0][1])
    other = env.unit(
        "ow-b",
        [env.data_file("b")],
        CommitOperation.OVERWRITE,
        overwrite_filter={"type": "eq", "term": "cat", "value": "b"},
        base_snapshot_id=base_id,
    )
    outcome = await committer.commit([other], resume_offset=8, position=8)
    assert not outcome.rejected and len(outcome.snapshots) == 1


# -- checks on events ---------------------------------------------------------------------


async def rejection(committer: TableCommitter, event: FilesWritten) -> EventRejectedError:
    with pytest.raises(EventRejectedError) as info:
        await committer.validate_files_written(event)
    return info.value


async def test_valid_event_decodes(env: Env) -> None:
    files = [env.data_file(), env.data_file("b")]
    data, deletes = await env.committer().validate_files_written(env.event("c", files))
    assert [f.file_path for f in data] == [f.file_path for f in files] and deletes == []


async def test_event_naming_a_schema_added_after_loading_is_accepted(env: Env) -> None:
    committer = env.committer()
    await committer.validate_files_written(env.event("c0", [env.data_file()]))  # loads the table
    table = await env.reload()
    evolved, last_id = (
        UpdateSchema(table.metadata.schema(), table.metadata.last_column_id, 2)
        .add_column("note", StringType())
        .apply()
    )
    builder = MetadataBuilder(table.metadata).add_schema(evolved, last_id).set_current_schema(-1)
    await env.catalog.commit(table, builder.build(table.metadata_location))
    event = env.event("c1", [env.data_file()]).model_copy(update={"schema_id": evolved.schema_id})
    data, _ = await committer.validate_files_written(event)
    assert len(data) == 1


async def test_events_that_do_not_fit_the_table_are_rejected_with_a_kind(env: Env) -> None:
    committer = env.committer()
    md = env.table.metadata
    good = env.data_file()
    wrong_schema = env.event("c", [good]).model_copy(update={"schema_id": 9})
    assert (await rejection(committer, wrong_schema)).kind == "unknown-schema"
    wrong_spec = env.event("c", [good]).model_copy(update={"spec_id": 4})
    assert (await rejection(committer, wrong_spec)).kind == "unknown-spec"
    raw = env.event("c", [good]).model_dump(by_alias=True)
    raw["data-files"][0]["partition"] = [17]  # an int for a string partition field
    bad_partition = FilesWritten(**raw)
    error = await rejection(committer, bad_partition)
    assert error.kind == "invalid-file" and "partition field 'cat'" in str(error)
    outside = env.data_file(file_path="file:///elsewhere/x.parquet", write=False)
    assert (await rejection(committer, env.event("c", [outside]))).kind == "bad-path"
    dotted = env.data_file(write=False, file_path=f"{md.location}/data/../../other/x.parquet")
    error = await rejection(committer, env.event("c", [dotted]))
    assert error.kind == "bad-path" and "'..'" in str(error)
    missing = env.data_file(write=False)
    error = await rejection(committer, env.event("c", [missing]))
    assert error.kind == "missing-file" and missing.file_path in str(error)
    wrong_size = env.data_file(size=10, file_size_in_bytes=11)
    error = await rejection(committer, env.event("c", [wrong_size]))
    assert error.kind == "size-mismatch" and "10 byte(s)" in str(error)
    assert await env.committer(check_files=False).validate_files_written(
        env.event("c", [wrong_size])
    )


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"value_counts": {1: 11}}, "counts 11 value(s) in a file of 10"),
        ({"null_value_counts": {1: 12}, "value_counts": None}, "counts 12 value(s)"),
        ({"value_counts": {3: 4}, "nan_value_counts": {3: 5}}, "exceed its 4 value(s)"),
        ({"value_counts": {99: 1}}, "column id 99, not in schema"),
        (
            {
                "lower_bounds": {1: to_bytes(LongType(), 9)},
                "upper_bounds": {1: to_bytes(LongType(), 1)},
            },
            "lower bound 9 is above upper bound 1",
        ),
        ({"file_size_in_bytes": 0}, "'file-size-in-bytes' is 0"),
        ({"split_offsets": [0, 900]}, "split offset 900 is outside"),
    ],
)
async def test_inconsistent_metrics_are_rejected(
    env: Env, changes: dict[str, Any], message: str
) -> None:
    size = changes.get("file_size_in_bytes", 64)
    f = env.data_file(size=size, **changes)
    error = await rejection(env.committer(), env.event("c", [f]))
    assert error.kind == "invalid-counts"
    assert message in str(error)


async def test_file_already_in_table_is_rejected(env: Env) -> None:
    f = env.data_file()
    committer = env.committer()
    await committer.commit([env.unit("c1", [f])], resume_offset=2, position=2)
    error = await rejection(committer, env.event("c2", [f]))
    assert error.kind == "duplicate-file"


async def test_delete_files_need_format_v2(tmp_path: Path) -> None:
    env = await make_env(tmp_path, format_version=1)
    deletes = env.data_file(
        content=DataFileContent.POSITION_DELETES,
        value_counts=None,
        null_value_counts=None,
        lower_bounds=None,
        upper_bounds=None,
    )
    error = await rejection(env.committer(), env.event("c", [], [deletes]))
    assert error.kind == "invalid-file" and "format v2" in str(error)
    await env.catalog.close()


async def test_commit_requests_that_cannot_apply_are_rejected(env: Env) -> None:
    committer = env.committer()
    await committer.commit([env.unit("c1")], resume_offset=2, position=2)
    table = await env.reload()
    head = table.metadata.current_snapshot_id
    assert head is not None
    tagged = MetadataBuilder(table.metadata).set_ref("v1", SnapshotRef.tag(head))
    await env.catalog.commit(table, tagged.build(table.metadata_location))
    await committer.load()

    def request(**fields: Any) -> CommitRequested:
        return CommitRequested(table=env.name, commit_id="r", **fields)

    cases = [
        (
            request(
                operation="overwrite", overwrite_filter={"type": "eq", "term": "nope", "value": 1}
            ),
            "'overwrite-filter' does not apply",
        ),
        (request(operation="append", attempt_ids=("a",), branch="v1"), "is a tag"),
        (request(operation="append", attempt_ids=("a",), base_snapshot_id=1234), "not a snapshot"),
    ]
    for req, message in cases:
        with pytest.raises(EventRejectedError, match=message) as info:
            await committer.validate_commit_requested(req)
        assert info.value.kind == "invalid-request"
    await committer.validate_commit_requested(request(operation="append", attempt_ids=("a",)))


async def test_a_base_snapshot_committed_outside_the_coordinator_is_accepted(env: Env) -> None:
    from icefloe.table.snapshot_producer import fast_append

    committer = env.committer()
    await committer.commit([env.unit("c1")], resume_offset=2, position=2)
    # another engine commits straight to the catalog; a compaction plans on its snapshot
    table = await fast_append(await env.reload(), [env.data_file()]).commit()
    head = table.metadata.current_snapshot_id
    assert head is not None and committer.table is not None
    assert committer.table.metadata.snapshot_by_id(head) is None  # the committer's view is old
    request = CommitRequested(
        table=env.name,
        commit_id="r",
        operation="rewrite",
        attempt_ids=("a",),
        base_snapshot_id=head,
        rewritten_files=("x",),
    )
    await committer.validate_commit_requested(request)  # looked again, found it
    assert committer.table.metadata.snapshot_by_id(head) is not None


# -- commit stages ------------------------------------------------------------------------


class _Recorder(CommitHooks):
    stages = frozenset(COMMIT_STAGES)

    def __init__(self) -> None:
        self.seen: list[str] = []

    def on_stage(self, stage: str) -> None:
        self.seen.append(stage)


async def test_commits_tell_their_hooks_each_stage_in_order(tmp_path: Path) -> None:
    env = await make_env(tmp_path)
    hooks = _Recorder()
    install_commit_hooks(env.catalog, hooks)
    committer = env.committer(hooks=hooks)
    await committer.commit([env.unit("c1")], resume_offset=2, position=2)
    assert hooks.seen == ["after-manifests", "after-metadata", "after-swap"]


def test_the_default_hooks_do_nothing_and_leave_the_file_io_alone() -> None:
    hooks = CommitHooks()
    assert hooks.stages == frozenset()
    hooks.on_stage("after-swap")
    with pytest.raises(ValueError, match="not a commit stage"):
        crashing_coordinator.ExitAt("somewhere")


_CRASH_SCRIPT = textwrap.dedent(
    """
    import asyncio, sys
    sys.path[:0] = [{tests!r}, {tests_root!r}]  # this folder's modules, tests/ (as conftest)
    from test_table_committer import make_env
    from crashing_coordinator import ExitAt
    from icefloe.coordinator.commit_hooks import install_commit_hooks
    from pathlib import Path

    async def main():
        env = await make_env(Path({root!r}))
        hooks = ExitAt({point!r})
        install_commit_hooks(env.catalog, hooks)
        committer = env.committer(hooks=hooks)
        await committer.commit([env.unit("c1")], resume_offset=2, position=2)
        print("survived")

    asyncio.run(main())
    """
)


@pytest.mark.parametrize(
    ("point", "snapshots"),
    [("after-manifests", 0), ("after-metadata", 1), ("after-swap", 1)],
)
async def test_crash_points_kill_the_process_at_the_named_step(
    tmp_path: Path, point: str, snapshots: int
) -> None:
    script = _CRASH_SCRIPT.format(
        tests=str(Path(__file__).parent),
        tests_root=str(Path(__file__).parents[2]),
        root=str(tmp_path),
        point=point,
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert result.returncode == 137, result.stderr
    assert "survived" not in result.stdout
    catalog = load_catalog(f"file://{tmp_path}/wh")
    table = await catalog.load_table("db.t")
    # On file-system tables writing the metadata file is the swap itself.
    assert len(table.metadata.snapshots) == snapshots
    if point == "after-manifests":
        manifests = list((tmp_path / "wh/db/t/metadata").glob("*.avro"))
        assert manifests, "the manifests were written before the crash"
    await catalog.close()


# -- the exactly-once law -----------------------------------------------------------------


@settings(
    max_examples=examples(12),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    st.lists(st.integers(0, 7), min_size=1, max_size=5).flatmap(
        lambda first: st.tuples(st.just(first), st.lists(st.integers(0, 7), min_size=1, max_size=8))
    ),
    st.booleans(),
)
async def test_any_mix_of_replays_and_stale_committers_adds_each_file_once(
    tmp_path_factory: pytest.TempPathFactory,
    plan: tuple[list[int], list[int]],
    zombie_is_stale: bool,
) -> None:
    """Law: committers replaying any overlapping selections of units, from any stale base,
    leave every unit's files in the table exactly once."""
    env = await make_env(tmp_path_factory.mktemp("law"))
    try:
        units = [env.unit(f"c{i}") for i in range(8)]
        first, second = plan
        owner, zombie = env.committer(), env.committer()
        if zombie_is_stale:
            await zombie.load()
        wanted_first = [units[i] for i in dict.fromkeys(first)]
        wanted_second = [units[i] for i in dict.fromkeys(second)]
        await owner.commit(wanted_first, resume_offset=0, position=16)
        await zombie.commit(wanted_second, resume_offset=0, position=16)
        await owner.commit(wanted_second, resume_offset=0, position=16)
        live = await env.live_files()
        expected = {f.file_path for u in wanted_first + wanted_second for f in u.data_files}
        assert Counter(live) == Counter(expected)
        table = await env.reload()
        ids = [c for s in table.metadata.snapshots for c in summary_commit_ids(s)]
        assert sorted(ids) == sorted({u.commit_id for u in wanted_first + wanted_second})
    finally:
        await env.catalog.close()
