"""The compaction plan, table health and maintenance policy, on a local file-system catalog.

Files here are metadata only (no Parquet is read): planning, health and the decisions work
from manifests, so sizes and counts are set directly.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples
from icefloe.catalog.fs import FileSystemCatalog
from icefloe.errors import ValidationError
from icefloe.expressions import EqualTo
from icefloe.io.fileio import LocalFileIO
from icefloe.spec.datafile import DataFile, DataFileContent
from icefloe.spec.metadata import TableMetadata
from icefloe.spec.metadata_builder import MetadataBuilder
from icefloe.spec.partition import PartitionField, PartitionSpec
from icefloe.spec.schema import Schema
from icefloe.spec.transforms import IdentityTransform
from icefloe.spec.types import LongType, NestedField, StringType
from icefloe.table.catalog import Table, TableIdentifier
from icefloe.table.commit import RetryPolicy
from icefloe.table.compaction import (
    CompactionPolicy,
    CompactionUnsupportedError,
    RewriteTask,
    _bin_pack,
    plan_compaction,
)
from icefloe.table.health import table_health
from icefloe.table.maintenance_policy import (
    ORPHANS_LAST_RUN_MS,
    Action,
    MaintenancePolicy,
    decide,
    expiry_bounds,
    expiry_retention,
    run_maintenance,
)
from icefloe.table.snapshot_producer import (
    data_file_location,
    fast_append,
    rewrite_files,
    row_delta,
)

QUICK = RetryPolicy(num_retries=3, min_wait_ms=1, max_wait_ms=5)
MB = 1 << 20
SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "category", StringType()),
)
SPEC = PartitionSpec(0, (PartitionField(2, 1000, "category", IdentityTransform()),))


@pytest.fixture
async def catalog(tmp_path: Path) -> FileSystemCatalog:
    cat = FileSystemCatalog("test", str(tmp_path / "warehouse"), LocalFileIO())
    await cat.create_namespace("db")
    return cat


async def new_table(catalog: FileSystemCatalog, *, format_version: int = 2, **props: str) -> Table:
    properties = {"write.target-file-size-bytes": str(8 * MB), **props}
    return await catalog.create_table(
        TableIdentifier(("db",), "t"),
        SCHEMA,
        SPEC,
        properties=properties,
        format_version=format_version,
    )


def df(
    table: Table,
    name: str,
    category: str = "a",
    *,
    size: int = MB,
    records: int = 100,
    content: DataFileContent = DataFileContent.DATA,
    referenced: str | None = None,
) -> DataFile:
    return DataFile(
        file_path=data_file_location(table, f"category={category}", f"{name}.parquet"),
        file_format="parquet",
        partition=(category,),
        record_count=records,
        file_size_in_bytes=size,
        content=content,
        equality_ids=[1] if content == DataFileContent.EQUALITY_DELETES else None,
        referenced_data_file=referenced,
    )


async def test_small_files_are_grouped_per_partition_up_to_the_target(
    catalog: FileSystemCatalog,
) -> None:
    table = await new_table(catalog)
    small_a = [df(table, f"a{i}", size=MB) for i in range(12)]  # 12 MB of 1 MB files
    small_b = [df(table, f"b{i}", "b", size=MB) for i in range(3)]  # too few to bother
    big = df(table, "big", size=7 * MB)  # within the target's range: left alone
    table = await fast_append(table, [*small_a, *small_b, big]).commit(QUICK)

    plan = await plan_compaction(table)
    assert plan.snapshot_id == table.metadata.current_snapshot_id
    assert plan.data_files == 16 and plan.candidate_files == 15
    assert [len(g.tasks) for g in plan.groups] == [8, 4]
    assert {g.partition for g in plan.groups} == {("a",)}
    assert all(g.input_bytes <= 8 * MB for g in plan.groups)
    assert plan.expected_output_files() == 2

    # fewer inputs needed, a where filter to one partition
    plan = await plan_compaction(
        table, policy=CompactionPolicy.for_table(table.metadata, {"min_input_files": 2})
    )
    assert {g.partition for g in plan.groups} == {("a",), ("b",)}
    only_b = await plan_compaction(
        table,
        where=EqualTo("category", "b"),
        policy=CompactionPolicy.for_table(table.metadata, {"min_input_files": 2}),
    )
    assert {g.partition for g in only_b.groups} == {("b",)}
    with pytest.raises(ValidationError, match="nope"):
        await plan_compaction(table, where=EqualTo("nope", 1))


async def test_files_with_deletes_are_rewritten_and_their_deletes_dropped(
    catalog: FileSystemCatalog,
) -> None:
    table = await new_table(catalog)
    a, b = df(table, "a", size=7 * MB), df(table, "b", "b", size=7 * MB)
    c = df(table, "c", "c", size=7 * MB)
    table = await fast_append(table, [a, b, c]).commit(QUICK)
    pos_a = df(
        table, "pos-a", size=100, content=DataFileContent.POSITION_DELETES, referenced=a.file_path
    )
    eq_b = df(table, "eq-b", "b", size=100, content=DataFileContent.EQUALITY_DELETES)
    table = await row_delta(table, [], [pos_a, eq_b]).commit(QUICK)
    # a data file written after the equality delete is not in its scope
    table = await fast_append(table, [df(table, "b-later", "b", size=7 * MB)]).commit(QUICK)

    plan = await plan_compaction(table)
    planned = {t.data_file.file_path: t for g in plan.groups for t in g.tasks}
    assert set(planned) == {a.file_path, b.file_path}
    assert [d.file_path for d in planned[a.file_path].deletes] == [pos_a.file_path]
    assert [d.file_path for d in planned[b.file_path].deletes] == [eq_b.file_path]
    dropped = plan.droppable_deletes({a.file_path, b.file_path})
    assert sorted(d.file_path for d in dropped) == sorted([pos_a.file_path, eq_b.file_path])
    # a delete still needed by a file the rewrite leaves alone is kept
    assert [d.file_path for d in plan.droppable_deletes({b.file_path})] == [eq_b.file_path]


async def test_v3_files_with_dvs_are_rewritten_and_dvs_never_named_for_removal(
    catalog: FileSystemCatalog,
) -> None:
    table = await new_table(catalog, format_version=3)
    a, b = df(table, "a", records=10), df(table, "b", records=10)
    c = df(table, "c", size=8 * MB, records=10)  # at the target: rewritten only for deletes
    d = df(table, "d", size=8 * MB, records=10)
    table = await fast_append(table, [a, b, c, d]).commit()
    table = await row_delta(
        table, [], [], deleted_positions=[(a, [1]), (c, [2, 3]), (d, [0])]
    ).commit()
    plan = await plan_compaction(table)
    assert plan.row_lineage
    planned = {t.data_file.file_path: t for g in plan.groups for t in g.tasks}
    assert set(planned) == {a.file_path, b.file_path, c.file_path, d.file_path}
    dv_a = planned[a.file_path].deletes
    assert [x.referenced_data_file for x in dv_a] == [a.file_path]
    assert [x.referenced_data_file for x in planned[c.file_path].deletes] == [c.file_path]
    assert planned[b.file_path].deletes == []
    # the DVs share one Puffin file: naming it would remove d's DV too, so it never is
    assert plan.droppable_deletes({a.file_path, c.file_path}) == []
    assert plan.delete_scope == {}


async def test_a_v3_rewrite_drops_the_dvs_of_the_files_it_replaces(
    catalog: FileSystemCatalog,
) -> None:
    table = await new_table(catalog, format_version=3)
    a, b = df(table, "a", records=10), df(table, "b", records=10)
    table = await fast_append(table, [a, b]).commit()
    table = await row_delta(table, [], [], deleted_positions=[(a, [1, 2]), (b, [0])]).commit()
    merged = df(table, "a2", records=8)
    table = await rewrite_files(table, [a.file_path], [merged]).commit()
    snapshot = table.metadata.current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    props = snapshot.summary.properties
    assert props["removed-dvs"] == "1"
    assert props["total-position-deletes"] == "1"
    plan = await plan_compaction(table)
    live = {t.data_file.file_path: t.deletes for g in plan.groups for t in g.tasks}
    assert [x.referenced_data_file for x in live[b.file_path]] == [b.file_path]
    assert live[merged.file_path] == []
    assert a.file_path not in live


async def test_v3_columns_named_like_lineage_columns_are_refused(
    tmp_path: Path,
) -> None:
    cat = FileSystemCatalog("test", str(tmp_path / "warehouse"), LocalFileIO())
    await cat.create_namespace("db")
    schema = Schema(NestedField(1, "_row_id", LongType()))
    table = await cat.create_table(TableIdentifier(("db",), "t"), schema, format_version=3)
    with pytest.raises(CompactionUnsupportedError, match="row-lineage"):
        await plan_compaction(table)


def test_policy_is_checked() -> None:
    with pytest.raises(ValidationError, match="min input files"):
        CompactionPolicy(100, 10, 200, min_input_files=0)
    with pytest.raises(ValidationError, match="max file size"):
        CompactionPolicy(100, 10, 50)


@given(st.lists(st.integers(1, 3000), max_size=60), st.integers(100, 2000))
@settings(max_examples=examples(60), deadline=None)
def test_bin_packing_keeps_every_file_once_and_bins_within_target(
    sizes: list[int], target: int
) -> None:
    tasks = [
        RewriteTask(DataFile(f"file:///d/{i}.parquet", "parquet", (), 1, s), 1, [])
        for i, s in enumerate(sizes)
    ]
    bins = _bin_pack(tasks, target)
    paths = [t.data_file.file_path for b in bins for t in b]
    assert sorted(paths) == sorted(t.data_file.file_path for t in tasks)
    for b in bins:
        total = sum(t.data_file.file_size_in_bytes for t in b)
        assert len(b) == 1 or total <= target


async def test_health_counts_files_manifests_and_snapshots(catalog: FileSystemCatalog) -> None:
    table = await new_table(catalog)
    for i in range(4):
        table = await fast_append(table, [df(table, f"s{i}", size=MB)]).commit(QUICK)
    table = await fast_append(table, [df(table, "big", size=8 * MB)]).commit(QUICK)
    eq = df(table, "eq", size=10, content=DataFileContent.EQUALITY_DELETES)
    table = await row_delta(table, [], [eq]).commit(QUICK)

    health = await table_health(table)
    assert (health.data_files, health.small_files, health.delete_files) == (5, 4, 1)
    assert health.equality_delete_files == 1 and health.position_delete_files == 0
    assert health.data_bytes == 12 * MB and health.average_file_size_bytes == 12 * MB / 5
    assert health.small_file_ratio == pytest.approx(0.8)
    assert health.manifests == 6 and health.delete_manifests == 1
    assert health.small_manifests == 6  # a few hundred bytes each
    assert health.snapshots == 6
    assert health.metadata_file_bytes > 0
    assert health.to_json()["small_file_ratio"] == 0.8


async def test_the_policy_comes_from_table_properties(catalog: FileSystemCatalog) -> None:
    table = await new_table(
        catalog,
        **{
            "icefloe.maintenance.max-snapshots": "3",
            "icefloe.maintenance.rewrite-manifests.min-count": "2",
            "icefloe.maintenance.remove-orphans.enabled": "false",
        },
    )
    policy = MaintenancePolicy.for_table(table.metadata)
    assert (policy.max_snapshots, policy.manifests_min_count, policy.remove_orphans) == (
        3,
        2,
        False,
    )
    bad = table.metadata.model_copy(update={"properties": {"icefloe.maintenance.enabled": "maybe"}})
    with pytest.raises(ValidationError, match="true or false"):
        MaintenancePolicy.for_table(bad)


async def test_expiry_by_count_never_enters_the_retention_window(
    catalog: FileSystemCatalog,
) -> None:
    table = await new_table(catalog, **{"icefloe.maintenance.max-snapshots": "2"})
    for i in range(5):
        table = await fast_append(table, [df(table, f"s{i}")]).commit(QUICK)
    policy = MaintenancePolicy.for_table(table.metadata)
    now = int(time.time() * 1000)
    # all five are younger than the window: nothing may go
    cutoff, retain = expiry_bounds(table.metadata, policy, now_ms=now, min_retain_ms=3_600_000)
    assert cutoff == now - 3_600_000 and retain == 2
    health = await table_health(table)
    actions = decide(table.metadata, health, None, policy, now_ms=now, min_retain_ms=3_600_000)
    assert Action.EXPIRE_SNAPSHOTS not in {a.action for a in actions}
    # an hour later, with a window of a minute, expiry keeps the last two
    later = now + 3_600_000
    actions = decide(table.metadata, health, None, policy, now_ms=later, min_retain_ms=60_000)
    assert Action.EXPIRE_SNAPSHOTS in {a.action for a in actions}
    report = await run_maintenance(table, min_retain_ms=60_000, now_ms=later)
    assert report.errors == []
    assert report.expired_snapshots == 3
    reloaded = await catalog.load_table("db.t")
    assert len(reloaded.metadata.snapshots) == 2
    assert report.health is not None and report.health.snapshots == 2


async def test_health_says_which_of_the_three_limits_holds_each_snapshot_back(
    catalog: FileSystemCatalog,
) -> None:
    from icefloe.table.commit_index import DEDUP_WINDOW_MS, SUMMARY_COMMIT_IDS

    table = await new_table(catalog, **{"icefloe.maintenance.max-snapshots": "2"})
    for i in range(5):
        # the first three were committed by the coordinator: they record commit ids
        props = {SUMMARY_COMMIT_IDS: json.dumps([f"c{i}"])} if i < 3 else {}
        table = await fast_append(table, [df(table, f"s{i}")], snapshot_properties=props).commit(
            QUICK
        )
    policy = MaintenancePolicy.for_table(table.metadata)
    later = int(time.time() * 1000) + 2 * 3_600_000
    # the count limit keeps two; the 3-hour floor holds the other three
    held = expiry_retention(table.metadata, policy, now_ms=later, min_retain_ms=3 * 3_600_000)
    assert (held.kept_by_policy, held.held_by_min_retain, held.held_by_dedup_window) == (2, 3, 0)
    assert held.expirable == 0 and "ICEFLOE_MAINTENANCE_MIN_RETAIN_MS" in held.held()[0]
    # a one-minute floor: the three that record commit ids are held by the dedup window
    held = expiry_retention(table.metadata, policy, now_ms=later, min_retain_ms=60_000)
    assert (held.kept_by_policy, held.held_by_min_retain, held.held_by_dedup_window) == (2, 0, 3)
    assert held.expirable == 0 and DEDUP_WINDOW_MS in held.held()[0]
    health = await table_health(table)
    planned = decide(table.metadata, health, None, policy, now_ms=later, min_retain_ms=60_000)
    assert Action.EXPIRE_SNAPSHOTS not in {a.action for a in planned}
    # a table whose window is an hour: nothing holds them, expiry goes down to the count
    short = table.metadata.model_copy(
        update={"properties": {**table.metadata.properties, DEDUP_WINDOW_MS: "3600000"}}
    )
    held = expiry_retention(short, policy, now_ms=later, min_retain_ms=60_000)
    assert (held.expirable, held.held_by_dedup_window, held.dedup_window_ms) == (3, 0, 3_600_000)
    actions = decide(short, health, None, policy, now_ms=later, min_retain_ms=60_000)
    assert next(a.reason for a in actions if a.action == Action.EXPIRE_SNAPSHOTS).startswith(
        "3 of 5 snapshot(s) are past retention"
    )
    json_form = held.to_json()
    assert json_form["limits"][DEDUP_WINDOW_MS] == 3_600_000 and json_form["held"] == []


async def test_maintenance_rewrites_manifests_and_removes_only_old_orphans(
    catalog: FileSystemCatalog, tmp_path: Path
) -> None:
    table = await new_table(
        catalog,
        **{
            "icefloe.maintenance.rewrite-manifests.min-count": "3",
            "icefloe.maintenance.orphan-older-than-ms": "1000",
            "icefloe.maintenance.remove-orphans.interval-ms": "60000",
        },
    )
    for i in range(4):
        table = await fast_append(table, [df(table, f"s{i}")]).commit(QUICK)
    location = table.metadata.location.removeprefix("file://")
    orphan = Path(location) / "data" / "orphan.parquet"
    orphan.parent.mkdir(parents=True, exist_ok=True)
    orphan.write_bytes(b"left by a failed attempt")
    now = int(time.time() * 1000)
    young = await run_maintenance(table, min_retain_ms=0, now_ms=now)
    assert young.errors == []
    assert young.rewrote_manifests and young.removed_orphans == 0 and orphan.exists()
    assert young.health is not None and young.health.manifests == 1
    old = await run_maintenance(
        await catalog.load_table("db.t"), min_retain_ms=10**12, now_ms=now + 60_000
    )
    assert old.errors == [] and old.removed_orphans == 1 and not orphan.exists()
    assert old.expired_snapshots == 0  # inside the retention window
    # each run is recorded in the table, so the next one waits out the interval, whoever runs it
    final = await catalog.load_table("db.t")
    assert final.metadata.properties[ORPHANS_LAST_RUN_MS] == str(now + 60_000)
    soon = await run_maintenance(final, min_retain_ms=0, now_ms=now + 119_999)
    assert Action.REMOVE_ORPHANS not in {p.action for p in soon.planned}
    due = await run_maintenance(final, min_retain_ms=0, now_ms=now + 120_000)
    assert Action.REMOVE_ORPHANS in {p.action for p in due.planned} and due.errors == []
    # every file still referenced is still there
    final = await catalog.load_table("db.t")
    from icefloe.table.maintenance import reachable_files

    for path in await reachable_files(final):
        if path.endswith((".avro", ".json")):
            assert Path(path.removeprefix("file://")).exists(), path


# -- deletes piling up (upsert tables) ----------------------------------------------------


async def deleted_by_position(table: Table, deletes: list[tuple[DataFile, list[int]]]) -> Table:
    """Rows deleted as an upsert deletes them: a merged DV per file (v3), position delete
    files (v2); both through the snapshot producer's ``deleted_positions``."""
    return await row_delta(table, [], [], deleted_positions=deletes).commit(QUICK)


@pytest.mark.parametrize("version", [2, 3])
async def test_health_counts_rows_deleted_by_position_and_dv_bytes(
    catalog: FileSystemCatalog, version: int
) -> None:
    table = await new_table(catalog, format_version=version)
    a, b = df(table, "a", size=7 * MB), df(table, "b", size=7 * MB)
    table = await fast_append(table, [a, b]).commit(QUICK)
    table = await deleted_by_position(table, [(a, [0, 1, 2]), (b, [5])])
    table = await deleted_by_position(table, [(a, [3])])

    health = await table_health(table)
    assert health.records == 200 and health.data_files == 2
    if version >= 3:  # the second delete merged into a's vector: exact counts
        assert health.deletion_vectors == 2 == health.delete_files
        assert health.deleted_rows == 5
        assert health.deletion_vector_bytes > 0
    else:  # one position delete file per commit, none of them a DV
        assert (health.deletion_vectors, health.deletion_vector_bytes) == (0, 0)
        assert health.deleted_rows == 5 and health.position_delete_files == 2
    assert health.deleted_row_ratio == pytest.approx(5 / 200)
    assert health.to_json()["deleted_row_ratio"] == 0.025

    # compaction applies them: the figures go back to zero
    plan = await plan_compaction(table)
    rewritten = {t.data_file.file_path for g in plan.groups for t in g.tasks}
    assert rewritten == {a.file_path, b.file_path}
    out = df(table, "compacted", size=7 * MB, records=195)
    dropped = [d.file_path for d in plan.droppable_deletes(rewritten)]
    table = await rewrite_files(table, [*rewritten, *dropped], [out]).commit(QUICK)
    after = await table_health(table)
    assert (after.deleted_rows, after.deletion_vectors, after.delete_files) == (0, 0, 0)
    assert after.deleted_row_ratio == 0.0


@pytest.mark.parametrize("version", [2, 3])
async def test_compaction_is_announced_for_deletes_once_they_pile_up(
    catalog: FileSystemCatalog, version: int
) -> None:
    """Well-sized files with a few deleted rows are not worth a rewrite; once the share of
    deleted rows reaches the table's deleted-row-ratio (0.3 by default, as Java's
    delete-ratio-threshold), the compaction that applies them is announced."""
    table = await new_table(catalog, format_version=version)
    files = [df(table, f"f{i}", size=7 * MB) for i in range(4)]
    table = await fast_append(table, files).commit(QUICK)
    now = int(time.time() * 1000)

    async def next_actions(t: Table) -> dict[Action, str]:
        health = await table_health(t, now_ms=now)
        plan = await plan_compaction(t)
        policy = MaintenancePolicy.for_table(t.metadata)
        planned = decide(t.metadata, health, plan, policy, now_ms=now, min_retain_ms=0)
        return {p.action: p.reason for p in planned}

    assert Action.COMPACT not in await next_actions(table)
    # an upsert replaced 40 of 400 rows: the files have deletes, the plan would rewrite them
    table = await deleted_by_position(table, [(f, list(range(10))) for f in files])
    assert (await plan_compaction(table)).groups
    assert Action.COMPACT not in await next_actions(table)
    # 120 of 400 (0.3): due
    table = await deleted_by_position(table, [(f, list(range(10, 30))) for f in files])
    reason = (await next_actions(table))[Action.COMPACT]
    assert "120 of 400 stored row(s) are deleted (ratio 0.300" in reason

    # the ratio is a table property
    key = "icefloe.maintenance.compaction.deleted-row-ratio"
    lower = MaintenancePolicy.for_table(with_property(table, key, "0.05"))
    assert lower.compaction_deleted_row_ratio == 0.05
    for bad in ("1.5", "-0.1", "lots"):
        with pytest.raises(ValidationError, match="deleted-row-ratio"):
            MaintenancePolicy.for_table(with_property(table, key, bad))


async def test_small_files_are_announced_whatever_the_deleted_ratio(
    catalog: FileSystemCatalog,
) -> None:
    table = await new_table(catalog, format_version=3)
    small = [df(table, f"s{i}", size=MB) for i in range(6)]
    table = await fast_append(table, small).commit(QUICK)
    table = await deleted_by_position(table, [(small[0], [0])])
    health = await table_health(table)
    assert 0 < health.deleted_row_ratio < 0.3
    plan = await plan_compaction(table)
    planned = decide(
        table.metadata,
        health,
        plan,
        MaintenancePolicy(),
        now_ms=int(time.time() * 1000),
        min_retain_ms=0,
    )
    assert Action.COMPACT in {p.action for p in planned}


def with_property(table: Table, key: str, value: str) -> TableMetadata:
    """``table``'s metadata with one property set (the policy reads nothing else)."""
    return MetadataBuilder(table.metadata).set_properties({key: value}).build()
