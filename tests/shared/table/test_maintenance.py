"""Table maintenance: the spec's snapshot retention policy, expiry with file clean-up,
orphan removal, manifest rewrites and purging.

Retention is checked on metadata alone, with timestamps chosen by the test, including a
property test of the branch rule against the spec's wording. Everything that deletes files
runs on a local file-system table whose data files really exist, and is judged by which
files are still on disk afterwards.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples
from icefloe.catalog.fs import FileSystemCatalog
from icefloe.errors import NotFoundError, ValidationError
from icefloe.io.fileio import LocalFileIO
from icefloe.manifests.manifest import ManifestEntryStatus
from icefloe.manifests.reader import ManifestReader
from icefloe.spec.datafile import DataFile
from icefloe.spec.metadata_builder import MetadataBuilder, new_table_metadata
from icefloe.spec.partition import PartitionField, PartitionSpec
from icefloe.spec.schema import Schema
from icefloe.spec.snapshot import MAIN_BRANCH, Operation, Snapshot, SnapshotRef, Summary
from icefloe.spec.sort_order import SortOrder
from icefloe.spec.transforms import IdentityTransform
from icefloe.spec.types import LongType, NestedField, StringType
from icefloe.table.catalog import DATA_PATH, Table, TableIdentifier, metadata_dir
from icefloe.table.commit import RetryPolicy
from icefloe.table.maintenance import (
    GC_ENABLED,
    MAX_REF_AGE_MS,
    MAX_SNAPSHOT_AGE_MS,
    MIN_SNAPSHOTS_TO_KEEP,
    expire_snapshots,
    purge_table_files,
    reachable_files,
    remove_orphan_files,
    retained_snapshots,
    rewrite_manifests,
)
from icefloe.table.snapshot_producer import delete_files, fast_append, overwrite_files

DAY = 86_400_000
NOW = 1_700_000_000_000
QUICK = RetryPolicy(num_retries=3, min_wait_ms=1, max_wait_ms=5)


def schema() -> Schema:
    return Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "category", StringType()),
    )


def spec() -> PartitionSpec:
    return PartitionSpec(0, (PartitionField(2, 1000, "category", IdentityTransform()),))


# --------------------------------------------------------------------------------------
# Retention policy on metadata alone
# --------------------------------------------------------------------------------------


class History:
    """Builds table metadata with snapshots at chosen times on chosen branches."""

    def __init__(self, properties: dict[str, str] | None = None) -> None:
        self.metadata = new_table_metadata(
            schema(), spec(), SortOrder.unsorted(), "/warehouse/db/t", properties or {}
        )
        self.next_id = 1

    def commit(self, timestamp_ms: int, branch: str = MAIN_BRANCH) -> int:
        """A snapshot on top of ``branch`` (which it creates if needed); returns its id."""
        parent = self.metadata.snapshot_by_ref(branch)
        snapshot_id = self.next_id
        self.next_id += 1
        snapshot = Snapshot(
            snapshot_id=snapshot_id,
            parent_snapshot_id=parent.snapshot_id if parent else None,
            sequence_number=self.metadata.last_sequence_number + 1,
            timestamp_ms=timestamp_ms,
            manifest_list=f"/warehouse/db/t/metadata/snap-{snapshot_id}.avro",
            summary=Summary(Operation.APPEND, {}),
        )
        old = self.metadata.refs.get(branch)
        ref = (
            old.model_copy(update={"snapshot_id": snapshot_id})
            if old is not None
            else SnapshotRef.branch(snapshot_id)
        )
        self.metadata = (
            MetadataBuilder(self.metadata).add_snapshot(snapshot).set_ref(branch, ref).build()
        )
        return snapshot_id

    def chain(self, *timestamps: int, branch: str = MAIN_BRANCH) -> list[int]:
        return [self.commit(ts, branch) for ts in timestamps]

    def ref(self, name: str, ref: SnapshotRef) -> None:
        self.metadata = MetadataBuilder(self.metadata).set_ref(name, ref).build()

    def retained(self, **kwargs: int) -> tuple[set[int], list[str]]:
        return retained_snapshots(self.metadata, now_ms=NOW, **kwargs)


def test_min_snapshots_to_keep() -> None:
    history = History()
    ids = history.chain(*(NOW - (10 - i) * DAY for i in range(5)))  # all older than 5 days
    assert history.retained() == ({ids[-1]}, [])  # default: keep 1
    assert history.retained(retain_last=3)[0] == set(ids[-3:])

    history = History({MIN_SNAPSHOTS_TO_KEEP: "2"})
    ids = history.chain(*(NOW - (10 - i) * DAY for i in range(5)))
    assert history.retained()[0] == set(ids[-2:])
    with pytest.raises(ValidationError, match="at least 1"):
        history.retained(retain_last=0)


def test_max_snapshot_age() -> None:
    history = History()
    ids = history.chain(NOW - 10 * DAY, NOW - 6 * DAY, NOW - 4 * DAY, NOW - DAY, NOW)
    # default max age is 5 days
    assert history.retained()[0] == set(ids[2:])
    assert history.retained(older_than_ms=NOW - DAY // 2)[0] == {ids[-1]}
    assert history.retained(older_than_ms=NOW - 8 * DAY)[0] == set(ids[1:])

    history = History({MAX_SNAPSHOT_AGE_MS: str(2 * DAY)})
    ids = history.chain(NOW - 10 * DAY, NOW - 6 * DAY, NOW - 4 * DAY, NOW - DAY, NOW)
    assert history.retained()[0] == set(ids[3:])
    # both limits must be passed: the age limit does not cut below min-snapshots-to-keep
    assert history.retained(retain_last=4)[0] == set(ids[1:])


def test_branch_settings_override_the_table() -> None:
    history = History()
    main = history.chain(NOW - 9 * DAY, NOW - 8 * DAY, NOW - 7 * DAY)
    history.ref("audit", SnapshotRef.branch(main[0], min_snapshots_to_keep=3))
    audit = history.chain(NOW - 6 * DAY, NOW - 5 * DAY - 1, NOW - 4 * DAY, branch="audit")
    history.ref(
        "fresh", SnapshotRef.branch(main[0], max_snapshot_age_ms=DAY, min_snapshots_to_keep=1)
    )
    fresh = history.chain(NOW - 3 * DAY, NOW - DAY // 2, branch="fresh")

    retained, removed = history.retained()
    assert removed == []
    assert main[-1] in retained and main[1] not in retained
    assert set(audit) <= retained  # min 3 on audit keeps all three of its own
    assert main[0] not in retained  # the 4th ancestor of audit: old and past its minimum
    assert fresh[-1] in retained and fresh[0] not in retained  # 3 days is past its 1-day limit

    # explicit table-level overrides do not override the branch's own settings
    retained, _ = history.retained(retain_last=2)
    assert main[1] in retained
    assert set(audit) <= retained and main[0] not in retained


def test_max_ref_age_removes_refs_but_never_main() -> None:
    history = History({MAX_REF_AGE_MS: str(3 * DAY)})
    main = history.chain(NOW - 20 * DAY, NOW - 10 * DAY)
    history.ref("stale", SnapshotRef.branch(main[0]))  # table limit: 3 days
    history.ref("kept-tag", SnapshotRef.tag(main[0], max_ref_age_ms=30 * DAY))
    history.ref("stale-tag", SnapshotRef.tag(main[0], max_ref_age_ms=DAY))
    young = history.chain(NOW - DAY, branch="young")

    retained, removed = history.retained()
    assert sorted(removed) == ["stale", "stale-tag"]
    assert main[-1] in retained  # main never expires, however old
    assert main[0] in retained  # still tagged by kept-tag
    assert set(young) <= retained


def test_tags_keep_only_their_own_snapshot() -> None:
    history = History()
    ids = history.chain(*(NOW - (20 - i) * DAY for i in range(5)))
    history.ref("release", SnapshotRef.tag(ids[1]))
    retained, _ = history.retained()
    assert retained == {ids[1], ids[-1]}
    assert ids[0] not in retained  # a tag retains no ancestors


def test_snapshots_on_no_ref_expire_by_age_only() -> None:
    history = History()
    main = history.chain(NOW - 10 * DAY, NOW - 9 * DAY)
    history.ref("gone", SnapshotRef.branch(main[0]))
    dangling = history.chain(NOW - 8 * DAY, NOW - DAY, branch="gone")
    history.metadata = MetadataBuilder(history.metadata).remove_ref("gone").build()
    retained, _ = history.retained()
    assert dangling[1] in retained  # young enough
    assert dangling[0] not in retained
    assert main[-1] in retained and main[0] not in retained


def test_a_tag_does_not_hold_on_to_its_ancestors() -> None:
    """Unreferenced snapshots are those on no branch's history and not tagged themselves
    (as in Java): a tagged snapshot's young parent survives by age, an old one does not."""
    history = History()
    history.chain(NOW - DAY)
    old_parent, young_parent, tagged = history.chain(
        NOW - 9 * DAY, NOW - 2 * DAY, NOW - DAY, branch="b"
    )
    history.ref("t", SnapshotRef.tag(tagged))
    history.metadata = MetadataBuilder(history.metadata).remove_ref("b").build()
    retained, _ = history.retained()
    assert tagged in retained
    assert young_parent in retained
    assert old_parent not in retained


@settings(max_examples=examples(150))
@given(
    ages=st.lists(st.integers(0, 40), min_size=1, max_size=12),
    keep=st.integers(1, 6),
    max_age_days=st.integers(1, 30),
)
def test_branch_rule_matches_the_spec(ages: list[int], keep: int, max_age_days: int) -> None:
    """Step 4 of the policy: walk back from the head until a snapshot is both older than
    max-snapshot-age-ms and not among the first min-snapshots-to-keep."""
    history = History(
        {MIN_SNAPSHOTS_TO_KEEP: str(keep), MAX_SNAPSHOT_AGE_MS: str(max_age_days * DAY)}
    )
    ids = history.chain(*(NOW - age * DAY for age in sorted(ages, reverse=True)))
    retained, removed = history.retained()
    newest_first = list(reversed(ids))
    cutoff = NOW - max_age_days * DAY
    expected: set[int] = set()
    for i, sid in enumerate(newest_first):
        snapshot = history.metadata.snapshot_by_id(sid)
        assert snapshot is not None
        if snapshot.timestamp_ms < cutoff and i >= keep:
            break
        expected.add(sid)
    assert removed == []
    assert retained == expected
    assert newest_first[0] in retained


# --------------------------------------------------------------------------------------
# Expiry with files
# --------------------------------------------------------------------------------------


@pytest.fixture
async def catalog(tmp_path: Path) -> FileSystemCatalog:
    cat = FileSystemCatalog("maint", str(tmp_path / "warehouse"), LocalFileIO())
    await cat.create_namespace("db")
    return cat


async def new_table(catalog: FileSystemCatalog, **properties: str) -> Table:
    return await catalog.create_table(
        TableIdentifier(("db",), "t"), schema(), spec(), properties=properties
    )


async def data_file(table: Table, name: str, category: str = "a") -> DataFile:
    """A data file that exists on disk (expiry must be seen to delete it)."""
    path = f"{table.location}/data/category={category}/{name}.parquet"
    await table.io.write(path, b"PAR1")
    return DataFile(path, "parquet", (category,), 10, 4)


async def exists(table: Table, *paths: str) -> list[bool]:
    return [await table.io.exists(p) for p in paths]


async def manifest_paths(table: Table, snapshot: Snapshot) -> list[str]:
    return [m.manifest_path for m in await ManifestReader(table.io).manifests(snapshot)]


async def live_paths(table: Table) -> list[str]:
    snapshot = table.metadata.current_snapshot()
    if snapshot is None:
        return []
    reader = ManifestReader(table.io)
    out = []
    for m in await reader.manifests(snapshot):
        out += [
            e.data_file.file_path
            for e in await reader.entries(m, table.metadata.specs(), live_only=True)
        ]
    return sorted(out)


def after_everything() -> int:
    return int(time.time() * 1000) + 1


async def test_expiry_deletes_only_what_no_retained_snapshot_reaches(
    catalog: FileSystemCatalog,
) -> None:
    table = await new_table(catalog)
    a, b, c = await data_file(table, "a"), await data_file(table, "b"), await data_file(table, "c")
    table = await fast_append(table, [a, b]).commit(QUICK)
    s1 = table.metadata.current_snapshot()
    table = await fast_append(table, [c]).commit(QUICK)
    s2 = table.metadata.current_snapshot()
    d = await data_file(table, "d")
    table = await overwrite_files(table, [a.file_path], [d]).commit(QUICK)
    s3 = table.metadata.current_snapshot()
    assert s1 is not None and s2 is not None and s3 is not None
    (m1,) = await manifest_paths(table, s1)
    m2, _ = await manifest_paths(table, s2)
    s3_manifests = await manifest_paths(table, s3)
    assert m2 in s3_manifests and m1 not in s3_manifests  # a's manifest was rewritten

    result = await expire_snapshots(table, older_than_ms=after_everything(), policy=QUICK)
    assert sorted(result.expired_snapshot_ids) == sorted([s1.snapshot_id, s2.snapshot_id])
    assert (result.deleted_data_files, result.deleted_manifests) == (1, 1)
    assert result.deleted_manifest_lists == 2

    table = await catalog.load_table("db.t")
    assert [s.snapshot_id for s in table.metadata.snapshots] == [s3.snapshot_id]
    # the overwritten file went with the last snapshot that had it ...
    assert await exists(table, a.file_path) == [False]
    # ... everything the retained snapshot reads is still there, shared manifest included
    assert await exists(table, b.file_path, c.file_path, d.file_path) == [True] * 3
    assert await exists(table, m2, *s3_manifests) == [True] * (1 + len(s3_manifests))
    assert s3.manifest_list is not None and await exists(table, s3.manifest_list) == [True]
    assert s1.manifest_list is not None and s2.manifest_list is not None
    assert await exists(table, m1, s1.manifest_list, s2.manifest_list) == [False] * 3
    assert await live_paths(table) == sorted([b.file_path, c.file_path, d.file_path])


async def test_tagged_snapshots_keep_their_files(catalog: FileSystemCatalog) -> None:
    table = await new_table(catalog)
    a, b = await data_file(table, "a"), await data_file(table, "b")
    table = await fast_append(table, [a]).commit(QUICK)
    first = table.metadata.current_snapshot()
    assert first is not None
    tagged = MetadataBuilder(table.metadata).set_ref("v1", SnapshotRef.tag(first.snapshot_id))
    table = await catalog.commit(table, tagged.build(table.metadata_location))
    table = await overwrite_files(table, [a.file_path], [b]).commit(QUICK)

    result = await expire_snapshots(table, older_than_ms=after_everything(), policy=QUICK)
    assert result.expired_snapshot_ids == []
    assert result.deleted_data_files == 0
    assert await exists(table, a.file_path) == [True]

    # once the tag goes, so do the snapshot and the file only it reached
    table = await catalog.load_table("db.t")
    untagged = MetadataBuilder(table.metadata).remove_ref("v1")
    table = await catalog.commit(table, untagged.build(table.metadata_location))
    result = await expire_snapshots(table, older_than_ms=after_everything(), policy=QUICK)
    assert result.expired_snapshot_ids == [first.snapshot_id]
    assert await exists(table, a.file_path, b.file_path) == [False, True]


async def test_expiring_an_old_branch_deletes_its_files(catalog: FileSystemCatalog) -> None:
    table = await new_table(catalog)
    a = await data_file(table, "a")
    table = await fast_append(table, [a]).commit(QUICK)
    head = table.metadata.current_snapshot()
    assert head is not None
    branch = MetadataBuilder(table.metadata).set_ref(
        "experiment", SnapshotRef.branch(head.snapshot_id, max_ref_age_ms=1)
    )
    table = await catalog.commit(table, branch.build(table.metadata_location))
    x = await data_file(table, "x")
    table = await fast_append(table, [x], branch="experiment").commit(QUICK)

    later = after_everything() + 10
    # its head is young: kept as an unreferenced snapshot until it is older than the cutoff
    result = await expire_snapshots(table, now_ms=later, policy=QUICK)
    assert result.removed_refs == ["experiment"]
    assert result.expired_snapshot_ids == []
    table = await catalog.load_table("db.t")
    assert "experiment" not in table.metadata.refs
    assert await exists(table, x.file_path) == [True]

    result = await expire_snapshots(table, now_ms=later, older_than_ms=later, policy=QUICK)
    assert len(result.expired_snapshot_ids) == 1
    table = await catalog.load_table("db.t")
    assert await exists(table, x.file_path, a.file_path) == [False, True]
    assert await live_paths(table) == [a.file_path]


async def test_explicit_snapshot_ids(catalog: FileSystemCatalog) -> None:
    table = await new_table(catalog)
    for name in "abc":
        table = await fast_append(table, [await data_file(table, name)]).commit(QUICK)
    ids = [s.snapshot_id for s in table.metadata.snapshots]

    with pytest.raises(NotFoundError, match="12345"):
        await expire_snapshots(table, snapshot_ids=[12345], policy=QUICK)
    with pytest.raises(ValidationError, match="referenced by a branch or tag"):
        await expire_snapshots(table, snapshot_ids=[ids[-1]], policy=QUICK)

    result = await expire_snapshots(table, snapshot_ids=[ids[1]], policy=QUICK)
    assert result.expired_snapshot_ids == [ids[1]]
    table = await catalog.load_table("db.t")
    assert [s.snapshot_id for s in table.metadata.snapshots] == [ids[0], ids[2]]
    # appends share manifests: every data file is still reachable from the head
    assert result.deleted_data_files == 0
    assert len(await live_paths(table)) == 3


async def test_nothing_to_expire_commits_nothing(catalog: FileSystemCatalog) -> None:
    table = await new_table(catalog)
    table = await fast_append(table, [await data_file(table, "a")]).commit(QUICK)
    result = await expire_snapshots(table, policy=QUICK)  # everything is younger than 5 days
    assert result.expired_snapshot_ids == [] and result.removed_refs == []
    assert (await catalog.load_table("db.t")).metadata_location == table.metadata_location


async def test_gc_disabled_or_delete_files_false_keep_files(catalog: FileSystemCatalog) -> None:
    table = await new_table(catalog, **{GC_ENABLED: "false"})
    a, b = await data_file(table, "a"), await data_file(table, "b")
    table = await fast_append(table, [a]).commit(QUICK)
    table = await overwrite_files(table, [a.file_path], [b]).commit(QUICK)
    result = await expire_snapshots(table, older_than_ms=after_everything(), policy=QUICK)
    assert len(result.expired_snapshot_ids) == 1
    assert await exists(table, a.file_path) == [True]

    table = await catalog.load_table("db.t")
    enable = MetadataBuilder(table.metadata).set_properties({GC_ENABLED: "true"})
    table = await catalog.commit(table, enable.build(table.metadata_location))
    c = await data_file(table, "c")
    table = await overwrite_files(table, [b.file_path], [c]).commit(QUICK)
    result = await expire_snapshots(
        table, older_than_ms=after_everything(), delete_files=False, policy=QUICK
    )
    assert len(result.expired_snapshot_ids) == 1
    assert result.deleted_data_files == 0
    assert await exists(table, b.file_path) == [True]


async def test_expiry_after_deletes_and_later_appends(catalog: FileSystemCatalog) -> None:
    """A deleted file must go even though later snapshots were built on the delete."""
    table = await new_table(catalog)
    a, b = await data_file(table, "a"), await data_file(table, "b")
    table = await fast_append(table, [a]).commit(QUICK)
    table = await delete_files(table, [a.file_path]).commit(QUICK)
    table = await fast_append(table, [b]).commit(QUICK)
    result = await expire_snapshots(table, older_than_ms=after_everything(), policy=QUICK)
    assert len(result.expired_snapshot_ids) == 2
    table = await catalog.load_table("db.t")
    assert await exists(table, a.file_path, b.file_path) == [False, True]
    assert await live_paths(table) == [b.file_path]


# --------------------------------------------------------------------------------------
# Orphans, manifest rewrites, purge
# --------------------------------------------------------------------------------------


async def test_remove_orphan_files(catalog: FileSystemCatalog) -> None:
    table = await new_table(catalog)
    a = await data_file(table, "a")
    table = await fast_append(table, [a]).commit(QUICK)
    orphans = sorted(
        [
            f"{table.location}/data/category=a/crashed-writer.parquet",
            f"{metadata_dir(table.metadata)}/snap-0-1-abandoned.avro",
            f"{table.location}/data/stray.tmp",
        ]
    )
    for path in orphans:
        await table.io.write(path, b"junk")
    reachable_before = await reachable_files(table)

    # default cutoff is days ago: freshly written files are never touched
    assert await remove_orphan_files(table) == []
    assert await remove_orphan_files(table, older_than_ms=int(time.time() * 1000) - 3_600_000) == []

    found = await remove_orphan_files(table, older_than_ms=after_everything() + 1000, dry_run=True)
    assert sorted(found) == orphans
    assert await exists(table, *orphans) == [True] * 3

    removed = await remove_orphan_files(table, older_than_ms=after_everything() + 1000)
    assert sorted(removed) == orphans
    assert await exists(table, *orphans) == [False] * 3
    assert all(await exists(table, *sorted(reachable_before)))
    hint = f"{metadata_dir(table.metadata)}/version-hint.text"
    assert await exists(table, hint) == [True]
    assert (await catalog.load_table("db.t")).metadata_location == table.metadata_location


async def test_rewrite_manifests_packs_them_and_keeps_the_files(catalog: FileSystemCatalog) -> None:
    table = await new_table(catalog)
    files = [await data_file(table, f"f{i}", "ab"[i % 2]) for i in range(6)]
    for f in files:
        table = await fast_append(table, [f]).commit(QUICK)
    table = await delete_files(table, [files[0].file_path]).commit(QUICK)
    before = table.metadata.current_snapshot()
    assert before is not None and before.summary is not None
    reader = ManifestReader(table.io)
    entries_before = {
        e.data_file.file_path: e
        for m in await reader.manifests(before)
        for e in await reader.entries(m, table.metadata.specs(), live_only=True)
    }
    assert len(await reader.manifests(before)) == 6

    table = await rewrite_manifests(table)
    after = table.metadata.current_snapshot()
    assert after is not None and after.summary is not None
    assert after.operation == Operation.REPLACE
    assert after.parent_snapshot_id == before.snapshot_id
    manifests = await reader.manifests(after)
    assert len(manifests) == 1
    entries = await reader.entries(manifests[0], table.metadata.specs())
    assert {e.data_file.file_path for e in entries} == set(entries_before)  # no deleted entry
    for e in entries:
        assert e.status == ManifestEntryStatus.EXISTING
        old = entries_before[e.data_file.file_path]
        assert (e.snapshot_id, e.sequence_number) == (old.snapshot_id, old.sequence_number)
    for key in (Summary.TOTAL_DATA_FILES, Summary.TOTAL_RECORDS, Summary.TOTAL_FILES_SIZE):
        assert after.summary[key] == before.summary[key]
    assert await live_paths(table) == sorted(entries_before)


async def test_rewrite_manifests_keeps_one_manifest_per_spec(catalog: FileSystemCatalog) -> None:
    table = await new_table(catalog)
    for name in ("p1", "p2"):
        table = await fast_append(table, [await data_file(table, name)]).commit(QUICK)
    evolve = (
        MetadataBuilder(table.metadata)
        .add_partition_spec(PartitionSpec(0, ()))
        .set_default_spec(-1)
    )
    table = await catalog.commit(table, evolve.build(table.metadata_location))
    unpartitioned = table.metadata.default_spec_id
    assert unpartitioned != 0
    for name in ("u1", "u2"):
        path = f"{table.location}/data/{name}.parquet"
        await table.io.write(path, b"PAR1")
        f = DataFile(path, "parquet", (), 10, 4, spec_id=unpartitioned)
        table = await fast_append(table, [f]).commit(QUICK)
    live_before = await live_paths(table)

    table = await rewrite_manifests(table)
    snapshot = table.metadata.current_snapshot()
    assert snapshot is not None
    manifests = await ManifestReader(table.io).manifests(snapshot)
    assert sorted(m.partition_spec_id for m in manifests) == sorted([0, unpartitioned])
    assert await live_paths(table) == live_before


async def test_purge_deletes_everything_the_table_reaches(
    catalog: FileSystemCatalog, tmp_path: Path
) -> None:
    outside = tmp_path / "elsewhere"
    table = await new_table(catalog, **{DATA_PATH: str(outside)})
    inside = await data_file(table, "in")
    far = DataFile(str(outside / "far.parquet"), "parquet", ("a",), 1, 4)
    await table.io.write(far.file_path, b"PAR1")
    table = await fast_append(table, [inside, far]).commit(QUICK)
    neighbour = await catalog.create_table("db.other", schema(), spec())

    await purge_table_files(table)
    assert [i.path async for i in table.io.list(table.location)] == []
    assert await exists(table, far.file_path) == [False]
    assert await exists(table, neighbour.metadata_location) == [True]


def test_retention_reads_table_properties_strictly() -> None:
    history = History({MAX_REF_AGE_MS: "soon"})
    history.chain(NOW)
    with pytest.raises(ValidationError, match=re.escape(MAX_REF_AGE_MS)):
        history.retained()
