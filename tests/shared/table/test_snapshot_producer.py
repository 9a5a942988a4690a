"""Snapshot operations on real (local file-system) tables, and the retry loop under them.

Every operation is committed through a FileSystemCatalog and checked by reading back what
a reader would see: the live files of the snapshot, the manifest entries with their
statuses, snapshot ids and sequence numbers, and the summary. Conflicts are produced by
committing on a stale base, and unknown commit outcomes by catalogs and storage that fail
around the swap, applied or not.
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples
from icefloe.catalog.fs import FileSystemCatalog
from icefloe.errors import (
    CommitFailedError,
    CommitStateUnknownError,
    FileIOError,
    IcefloeError,
    ValidationConflictError,
    ValidationError,
)
from icefloe.io.fileio import LocalFileIO
from icefloe.manifests.manifest import ManifestEntry, ManifestEntryStatus
from icefloe.manifests.manifest_list import ManifestContent, read_manifest_list
from icefloe.manifests.reader import ManifestReader
from icefloe.spec.datafile import DataFile, DataFileContent
from icefloe.spec.metadata import TableMetadata
from icefloe.spec.metadata_builder import MetadataBuilder
from icefloe.spec.partition import PartitionField, PartitionSpec
from icefloe.spec.schema import Schema
from icefloe.spec.snapshot import MAIN_BRANCH, Operation, Snapshot, SnapshotRef, Summary
from icefloe.spec.transforms import IdentityTransform
from icefloe.spec.types import LongType, NestedField, StringType
from icefloe.table.catalog import Table, TableIdentifier, metadata_dir
from icefloe.table.commit import (
    MAX_WAIT_MS,
    MIN_WAIT_MS,
    NUM_RETRIES,
    TOTAL_TIMEOUT_MS,
    CommitStats,
    RetryPolicy,
    commit_with_retry,
)
from icefloe.table.snapshot_producer import (
    MERGE_ENABLED,
    MERGE_MIN_COUNT,
    SnapshotProducer,
    data_file_location,
    delete_files,
    fast_append,
    merge_append,
    overwrite_by_filter,
    overwrite_files,
    rewrite_files,
    row_delta,
)

QUICK = RetryPolicy(num_retries=3, min_wait_ms=1, max_wait_ms=5)

# --------------------------------------------------------------------------------------
# Tables and files
# --------------------------------------------------------------------------------------


def schema() -> Schema:
    return Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "category", StringType()),
    )


def spec() -> PartitionSpec:
    return PartitionSpec(0, (PartitionField(2, 1000, "category", IdentityTransform()),))


class FlakyMetadataIO(LocalFileIO):
    """Local storage whose next metadata-file creates fail like a dropped connection.

    ``applied``: the file was created, then the reply was lost. ``lost``: nothing was
    written. ``applied-unreadable``: created, reply lost, and the next read of it fails too.
    """

    def __init__(self) -> None:
        super().__init__()
        self.faults: list[str] = []
        self.unreadable: set[str] = set()

    async def write_once(self, path: str, data: bytes) -> None:
        if path.endswith(".metadata.json") and self.faults:
            fault = self.faults.pop(0)
            if fault != "lost":
                await super().write_once(path, data)
            if fault == "applied-unreadable":
                self.unreadable.add(path)
            raise FileIOError(f"{path}: connection reset by peer")
        await super().write_once(path, data)

    async def read(self, path: str) -> bytes:
        if path in self.unreadable:
            self.unreadable.discard(path)
            raise FileIOError(f"{path}: connection reset by peer")
        return await super().read(path)


class OutcomeCatalog(FileSystemCatalog):
    """A catalog whose next commits end as scripted in ``outcomes``.

    ``applied``: the swap happens, then the outcome is reported unknown. ``lost``: reported
    unknown without swapping. ``crash``: the swap happens, then an unexpected error escapes.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.outcomes: list[str] = []
        self.commits = 0

    async def commit(self, table: Table, new_metadata: TableMetadata) -> Table:
        self.commits += 1
        outcome = self.outcomes.pop(0) if self.outcomes else None
        if outcome == "lost":
            raise CommitStateUnknownError("timed out before the catalog answered")
        committed = await super().commit(table, new_metadata)
        if outcome == "applied":
            raise CommitStateUnknownError("timed out after the catalog applied the swap")
        if outcome == "crash":
            raise RuntimeError("connection pool torn down after the swap")
        return committed


@pytest.fixture
def io() -> FlakyMetadataIO:
    return FlakyMetadataIO()


@pytest.fixture
async def catalog(tmp_path: Path, io: FlakyMetadataIO) -> OutcomeCatalog:
    cat = OutcomeCatalog("test", str(tmp_path / "warehouse"), io)
    await cat.create_namespace("db")
    return cat


async def new_table(
    catalog: FileSystemCatalog,
    name: str = "t",
    *,
    format_version: int = 2,
    properties: dict[str, str] | None = None,
) -> Table:
    return await catalog.create_table(
        TableIdentifier(("db",), name),
        schema(),
        spec(),
        properties=properties,
        format_version=format_version,
    )


def df(
    table: Table,
    name: str,
    category: str = "a",
    *,
    records: int = 10,
    size: int = 100,
    content: DataFileContent = DataFileContent.DATA,
) -> DataFile:
    return DataFile(
        file_path=data_file_location(table, f"category={category}", f"{name}.parquet"),
        file_format="parquet",
        partition=(category,),
        record_count=records,
        file_size_in_bytes=size,
        content=content,
        equality_ids=[1] if content == DataFileContent.EQUALITY_DELETES else None,
    )


async def manifests_of(table: Table, ref: str = MAIN_BRANCH) -> list[Any]:
    snapshot = table.metadata.snapshot_by_ref(ref)
    assert snapshot is not None
    return await ManifestReader(table.io).manifests(snapshot)


async def entries_of(table: Table, ref: str = MAIN_BRANCH) -> list[ManifestEntry]:
    reader = ManifestReader(table.io)
    out: list[ManifestEntry] = []
    for manifest in await manifests_of(table, ref):
        out.extend(await reader.entries(manifest, table.metadata.specs()))
    return out


async def live(table: Table, ref: str = MAIN_BRANCH) -> list[str]:
    """Live file paths, sorted; a file listed twice would show up twice."""
    return sorted(e.data_file.file_path for e in await entries_of(table, ref) if e.is_live)


def summary(table: Table) -> Summary:
    snapshot = table.metadata.current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    return snapshot.summary


def current(table: Table) -> Snapshot:
    snapshot = table.metadata.current_snapshot()
    assert snapshot is not None
    return snapshot


async def unreferenced_avro_files(table: Table) -> list[str]:
    """Manifest lists and manifests in the metadata folder that no snapshot references."""
    reader = ManifestReader(table.io)
    referenced: set[str] = set()
    for s in table.metadata.snapshots:
        assert s.manifest_list is not None
        referenced.add(s.manifest_list)
        referenced.update(m.manifest_path for m in await reader.manifests(s))
    stored = [i.path async for i in table.io.list(metadata_dir(table.metadata))]
    return sorted(p for p in stored if p.endswith(".avro") and p not in referenced)


async def referenced_files_missing(table: Table) -> list[str]:
    reader = ManifestReader(table.io)
    missing = []
    for s in table.metadata.snapshots:
        assert s.manifest_list is not None
        if not await table.io.exists(s.manifest_list):
            missing.append(s.manifest_list)
            continue
        for m in await reader.manifests(s):
            if not await table.io.exists(m.manifest_path):
                missing.append(m.manifest_path)
    return missing


# --------------------------------------------------------------------------------------
# Appends
# --------------------------------------------------------------------------------------


async def test_fast_append_adds_one_manifest_per_commit(catalog: OutcomeCatalog) -> None:
    table = await new_table(catalog)
    files = [df(table, "a1"), df(table, "a2", "b", records=5, size=50), df(table, "a3", "c")]
    snapshot_ids = []
    for f in files:
        table = await fast_append(table, [f]).commit(QUICK)
        snapshot_ids.append(current(table).snapshot_id)

    assert await live(table) == sorted(f.file_path for f in files)
    manifests = await manifests_of(table)
    assert len(manifests) == 3
    assert [m.added_snapshot_id for m in manifests] == snapshot_ids[::-1]
    assert [m.sequence_number for m in manifests] == [3, 2, 1]
    entries = {e.data_file.file_path: e for e in await entries_of(table)}
    for seq, (f, sid) in enumerate(zip(files, snapshot_ids), start=1):
        entry = entries[f.file_path]
        assert entry.status == ManifestEntryStatus.ADDED
        assert (entry.snapshot_id, entry.sequence_number, entry.file_sequence_number) == (
            sid,
            seq,
            seq,
        )

    s = summary(table)
    assert s.operation == Operation.APPEND
    assert s[Summary.ADDED_DATA_FILES] == "1"
    assert s[Summary.ADDED_RECORDS] == "10"
    assert s[Summary.ADDED_FILES_SIZE] == "100"
    assert s[Summary.CHANGED_PARTITION_COUNT] == "1"
    assert s[Summary.TOTAL_DATA_FILES] == "3"
    assert s[Summary.TOTAL_RECORDS] == "25"
    assert s[Summary.TOTAL_FILES_SIZE] == "250"
    assert s[Summary.TOTAL_DELETE_FILES] == "0"
    chain = [x.snapshot_id for x in table.metadata.ancestors_of(current(table).snapshot_id)]
    assert chain == snapshot_ids[::-1]


async def test_merge_append_merges_manifests_at_min_count(catalog: OutcomeCatalog) -> None:
    table = await new_table(catalog, properties={MERGE_MIN_COUNT: "3"})
    files = [df(table, f"m{i}", "ab"[i % 2]) for i in range(4)]

    table = await merge_append(table, [files[0]]).commit(QUICK)
    table = await merge_append(table, [files[1]]).commit(QUICK)
    assert len(await manifests_of(table)) == 2
    first_two = {e.data_file.file_path: e for e in await entries_of(table)}

    table = await merge_append(table, [files[2]]).commit(QUICK)
    manifests = await manifests_of(table)
    assert len(manifests) == 1  # three manifests reached the minimum: merged into one
    merged = manifests[0]
    assert (merged.added_files_count, merged.existing_files_count) == (1, 2)
    assert (merged.added_rows_count, merged.existing_rows_count) == (10, 20)
    by_path = {e.data_file.file_path: e for e in await entries_of(table)}
    assert sorted(by_path) == sorted(f.file_path for f in files[:3])
    # carried-over files keep the snapshot and sequence numbers that added them
    for path, before in first_two.items():
        after = by_path[path]
        assert after.status == ManifestEntryStatus.EXISTING
        assert (after.snapshot_id, after.sequence_number, after.file_sequence_number) == (
            before.snapshot_id,
            before.sequence_number,
            before.file_sequence_number,
        )
    newest = by_path[files[2].file_path]
    assert newest.status == ManifestEntryStatus.ADDED
    assert (newest.snapshot_id, newest.sequence_number) == (current(table).snapshot_id, 3)
    s = summary(table)
    assert (s[Summary.ADDED_DATA_FILES], s[Summary.TOTAL_DATA_FILES]) == ("1", "3")
    assert s[Summary.TOTAL_RECORDS] == "30"

    table = await merge_append(table, [files[3]]).commit(QUICK)
    assert len(await manifests_of(table)) == 2  # below the minimum again
    assert await live(table) == sorted(f.file_path for f in files)


async def test_merging_can_be_disabled_or_forced(catalog: OutcomeCatalog) -> None:
    table = await new_table(catalog, properties={MERGE_MIN_COUNT: "2", MERGE_ENABLED: "false"})
    for i in range(3):
        table = await merge_append(table, [df(table, f"x{i}")]).commit(QUICK)
    assert len(await manifests_of(table)) == 3
    table = await merge_append(table, [df(table, "x3")], merge_manifests=True).commit(QUICK)
    assert len(await manifests_of(table)) == 1
    assert len(await live(table)) == 4
    # fast appends never merge, whatever the table says
    table = await fast_append(table, [df(table, "x4")], merge_min_count=1).commit(QUICK)
    assert len(await manifests_of(table)) == 2


# --------------------------------------------------------------------------------------
# Overwrites, deletes, row deltas, rewrites
# --------------------------------------------------------------------------------------


async def test_overwrite_files_by_path(catalog: OutcomeCatalog) -> None:
    table = await new_table(catalog)
    a, b, c = df(table, "a"), df(table, "b", "b", records=7, size=70), df(table, "c", "c")
    table = await fast_append(table, [a, b]).commit(QUICK)
    table = await fast_append(table, [c]).commit(QUICK)
    d = df(table, "d", "b", records=3, size=30)

    table = await overwrite_files(table, [b.file_path], [d]).commit(QUICK)
    assert await live(table) == sorted([a.file_path, c.file_path, d.file_path])
    snapshot = current(table)
    entries = await entries_of(table)
    removed = [e for e in entries if e.data_file.file_path == b.file_path]
    assert [(e.status, e.snapshot_id) for e in removed] == [
        (ManifestEntryStatus.DELETED, snapshot.snapshot_id)
    ]
    kept = [e for e in entries if e.data_file.file_path == a.file_path]
    assert [e.status for e in kept] == [ManifestEntryStatus.EXISTING]
    s = summary(table)
    assert s.operation == Operation.OVERWRITE
    assert s[Summary.ADDED_DATA_FILES] == "1"
    assert s[Summary.DELETED_DATA_FILES] == "1"
    assert s[Summary.DELETED_RECORDS] == "7"
    assert s[Summary.REMOVED_FILES_SIZE] == "70"
    assert s[Summary.ADDED_RECORDS] == "3"
    assert s[Summary.TOTAL_DATA_FILES] == "3"
    assert s[Summary.TOTAL_RECORDS] == "23"
    assert s[Summary.TOTAL_FILES_SIZE] == "230"
    assert s[Summary.CHANGED_PARTITION_COUNT] == "1"


async def test_overwrite_and_delete_by_predicate(catalog: OutcomeCatalog) -> None:
    table = await new_table(catalog)
    files = [df(table, f"f{i}", cat) for i, cat in enumerate("aabbc")]
    table = await fast_append(table, files[:3]).commit(QUICK)
    table = await fast_append(table, files[3:]).commit(QUICK)

    def in_b(f: DataFile, _: TableMetadata) -> bool:
        return f.partition == ("b",)

    replacement = df(table, "b-new", "b", records=99)
    table = await overwrite_by_filter(table, in_b, [replacement]).commit(QUICK)
    assert await live(table) == sorted(
        [files[0].file_path, files[1].file_path, files[4].file_path, replacement.file_path]
    )
    s = summary(table)
    assert (s[Summary.DELETED_DATA_FILES], s[Summary.ADDED_DATA_FILES]) == ("2", "1")
    assert s[Summary.CHANGED_PARTITION_COUNT] == "1"
    assert s[Summary.TOTAL_RECORDS] == str(30 + 99)

    def in_a_or_c(f: DataFile, _: TableMetadata) -> bool:
        return f.partition in {("a",), ("c",)}

    table = await delete_files(table, predicate=in_a_or_c).commit(QUICK)
    assert await live(table) == [replacement.file_path]
    s = summary(table)
    assert s.operation == Operation.DELETE
    assert s[Summary.DELETED_DATA_FILES] == "3"
    assert s[Summary.CHANGED_PARTITION_COUNT] == "2"
    assert (s[Summary.TOTAL_DATA_FILES], s[Summary.TOTAL_RECORDS]) == ("1", "99")

    def refuses(f: DataFile, _: TableMetadata) -> bool:
        raise ValidationError(f"{f.file_path}: may hold rows both matching and not matching")

    before = table.metadata_location
    with pytest.raises(ValidationError, match="both matching"):
        await delete_files(table, predicate=refuses).commit(QUICK)
    assert (await catalog.load_table("db.t")).metadata_location == before


async def test_delete_by_path_and_missing_paths(catalog: OutcomeCatalog) -> None:
    table = await new_table(catalog)
    a, b = df(table, "a"), df(table, "b")
    table = await fast_append(table, [a, b]).commit(QUICK)
    table = await delete_files(table, [a.file_path]).commit(QUICK)
    assert await live(table) == [b.file_path]
    assert summary(table)[Summary.DELETED_DATA_FILES] == "1"

    before = table.metadata_location
    with pytest.raises(ValidationConflictError, match=r"no longer live.*a\.parquet"):
        await delete_files(table, [a.file_path]).commit(QUICK)
    assert (await catalog.load_table("db.t")).metadata_location == before
    assert await unreferenced_avro_files(await catalog.load_table("db.t")) == []
    # unless told to tolerate them
    table = await delete_files(
        table, [a.file_path, b.file_path], validate_deleted_paths=False
    ).commit(QUICK)
    assert await live(table) == []


async def test_manifests_left_with_only_deletions_are_dropped(catalog: OutcomeCatalog) -> None:
    table = await new_table(catalog)
    a, b = df(table, "a"), df(table, "b")
    table = await fast_append(table, [a]).commit(QUICK)
    table = await delete_files(table, [a.file_path]).commit(QUICK)
    # the delete snapshot still records the deletion ...
    assert [(e.status, e.data_file.file_path) for e in await entries_of(table)] == [
        (ManifestEntryStatus.DELETED, a.file_path)
    ]
    # ... but the next snapshot has no use for a manifest with nothing live in it
    table = await fast_append(table, [b]).commit(QUICK)
    entries = await entries_of(table)
    assert [(e.status, e.data_file.file_path) for e in entries] == [
        (ManifestEntryStatus.ADDED, b.file_path)
    ]


async def test_row_delta_adds_data_and_delete_files(catalog: OutcomeCatalog) -> None:
    table = await new_table(catalog)
    base = df(table, "base", records=100, size=1000)
    table = await fast_append(table, [base]).commit(QUICK)

    pos = df(table, "pos", records=4, size=40, content=DataFileContent.POSITION_DELETES)
    eq = df(table, "eq", records=2, size=20, content=DataFileContent.EQUALITY_DELETES)
    extra = df(table, "extra", "b", records=6, size=60)
    table = await row_delta(table, [extra], [pos, eq]).commit(QUICK)

    manifests = await manifests_of(table)
    assert sorted(m.content for m in manifests) == [
        ManifestContent.DATA,
        ManifestContent.DATA,
        ManifestContent.DELETES,
    ]
    assert await live(table) == sorted(f.file_path for f in (base, extra, pos, eq))
    by_path = {e.data_file.file_path: e for e in await entries_of(table)}
    assert by_path[pos.file_path].sequence_number == 2
    assert by_path[eq.file_path].data_file.equality_ids == [1]
    s = summary(table)
    assert s.operation == Operation.OVERWRITE
    assert s[Summary.ADDED_DATA_FILES] == "1"
    assert s[Summary.ADDED_DELETE_FILES] == "2"
    assert s[Summary.ADDED_POSITION_DELETE_FILES] == "1"
    assert s[Summary.ADDED_EQUALITY_DELETE_FILES] == "1"
    assert s[Summary.ADDED_POSITION_DELETES] == "4"
    assert s[Summary.ADDED_EQUALITY_DELETES] == "2"
    assert s[Summary.ADDED_RECORDS] == "6"
    assert s[Summary.ADDED_FILES_SIZE] == "120"
    assert s[Summary.TOTAL_DATA_FILES] == "2"
    assert s[Summary.TOTAL_DELETE_FILES] == "2"
    assert s[Summary.TOTAL_RECORDS] == "106"
    assert s[Summary.TOTAL_POSITION_DELETES] == "4"
    assert s[Summary.TOTAL_EQUALITY_DELETES] == "2"
    assert s[Summary.TOTAL_FILES_SIZE] == "1120"
    assert s[Summary.CHANGED_PARTITION_COUNT] == "2"

    only_deletes = df(table, "pos2", records=1, size=10, content=DataFileContent.POSITION_DELETES)
    table = await row_delta(table, [], [only_deletes]).commit(QUICK)
    assert summary(table).operation == Operation.DELETE
    table = await row_delta(table, [df(table, "more")], []).commit(QUICK)
    assert summary(table).operation == Operation.APPEND

    # removing a delete file counts it as removed
    table = await delete_files(table, [pos.file_path]).commit(QUICK)
    s = summary(table)
    assert s[Summary.REMOVED_DELETE_FILES] == "1"
    assert s[Summary.REMOVED_POSITION_DELETE_FILES] == "1"
    assert s[Summary.REMOVED_POSITION_DELETES] == "4"
    assert s[Summary.TOTAL_DELETE_FILES] == "2"
    assert s[Summary.TOTAL_POSITION_DELETES] == "1"

    with pytest.raises(ValidationError, match="must be delete files"):
        row_delta(table, [], [df(table, "not-a-delete")])


async def test_v1_tables_take_data_files_only(catalog: OutcomeCatalog) -> None:
    table = await new_table(catalog, format_version=1)
    a, b = df(table, "a"), df(table, "b")
    table = await fast_append(table, [a]).commit(QUICK)
    table = await overwrite_files(table, [a.file_path], [b]).commit(QUICK)
    assert await live(table) == [b.file_path]
    assert all(s.sequence_number == 0 for s in table.metadata.snapshots)
    assert summary(table)[Summary.TOTAL_DATA_FILES] == "1"
    loaded = await catalog.load_table("db.t")
    assert loaded.metadata.format_version == 1
    with pytest.raises(ValidationError, match="need format v2"):
        fast_append(table, [df(table, "d", content=DataFileContent.POSITION_DELETES)])


async def test_rewrite_files_replaces_files(catalog: OutcomeCatalog) -> None:
    table = await new_table(catalog)
    small = [df(table, f"s{i}", records=5, size=50) for i in range(3)]
    other = df(table, "other", "b")
    for f in small:
        table = await fast_append(table, [f]).commit(QUICK)
    table = await fast_append(table, [other]).commit(QUICK)
    compacted = df(table, "compacted", records=15, size=120)

    table = await rewrite_files(table, [f.file_path for f in small], [compacted]).commit(QUICK)
    assert await live(table) == sorted([compacted.file_path, other.file_path])
    s = summary(table)
    assert s.operation == Operation.REPLACE
    assert (s[Summary.DELETED_DATA_FILES], s[Summary.ADDED_DATA_FILES]) == ("3", "1")
    assert (s[Summary.DELETED_RECORDS], s[Summary.ADDED_RECORDS]) == ("15", "15")
    assert s[Summary.TOTAL_RECORDS] == "25"
    assert s[Summary.TOTAL_FILES_SIZE] == str(120 + 100)


async def test_rewrite_of_a_concurrently_deleted_file_fails_after_reload(
    catalog: OutcomeCatalog,
) -> None:
    table = await new_table(catalog)
    a, b = df(table, "a"), df(table, "b")
    table = await fast_append(table, [a, b]).commit(QUICK)

    compaction = rewrite_files(table, [a.file_path, b.file_path], [df(table, "ab", records=20)])
    await delete_files(table, [b.file_path]).commit(QUICK)  # lands first
    with pytest.raises(ValidationConflictError, match=r"b\.parquet"):
        await compaction.commit(QUICK)
    assert (compaction.stats.attempts, compaction.stats.conflicts) == (2, 1)

    after = await catalog.load_table("db.t")
    assert await live(after) == [a.file_path]
    assert len(after.metadata.snapshots) == 2
    # everything the compaction wrote (its manifest and both manifest lists) is gone
    assert await unreferenced_avro_files(after) == []


async def test_overwrite_of_a_concurrently_deleted_file_fails(catalog: OutcomeCatalog) -> None:
    table = await new_table(catalog)
    a = df(table, "a")
    table = await fast_append(table, [a]).commit(QUICK)
    overwrite = overwrite_files(table, [a.file_path], [df(table, "a2")])
    await delete_files(table, [a.file_path]).commit(QUICK)
    with pytest.raises(ValidationConflictError, match=r"a\.parquet"):
        await overwrite.commit(QUICK)


# --------------------------------------------------------------------------------------
# Format versions, row lineage, branches
# --------------------------------------------------------------------------------------


async def test_v3_row_lineage_advances(catalog: OutcomeCatalog) -> None:
    table = await new_table(catalog, format_version=3)
    assert table.metadata.next_row_id == 0
    a, b, c = df(table, "a", records=10), df(table, "b", records=5), df(table, "c", records=7)

    table = await fast_append(table, [a, b]).commit(QUICK)
    first = current(table)
    assert (first.first_row_id, first.added_rows, table.metadata.next_row_id) == (0, 15, 15)

    table = await fast_append(table, [c]).commit(QUICK)
    second = current(table)
    assert (second.first_row_id, second.added_rows, table.metadata.next_row_id) == (15, 7, 22)
    row_ids = {e.data_file.file_path: e.data_file.first_row_id for e in await entries_of(table)}
    assert row_ids == {a.file_path: 0, b.file_path: 10, c.file_path: 15}

    # removing a file rewrites its manifest: the survivors keep their row ids, and the
    # rewritten manifest's rows are counted as the spec's manifest-list rule requires
    table = await delete_files(table, [a.file_path]).commit(QUICK)
    third = current(table)
    assert third.first_row_id == 22
    assert third.added_rows == 5  # b, carried as an existing entry of the rewritten manifest
    assert table.metadata.next_row_id == 27
    survivors = {
        e.data_file.file_path: e.data_file.first_row_id
        for e in await entries_of(table)
        if e.is_live
    }
    assert survivors == {b.file_path: 10, c.file_path: 15}

    loaded = await catalog.load_table("db.t")
    assert loaded.metadata.next_row_id == 27


@pytest.mark.parametrize("version", [1, 2, 3])
async def test_cached_manifest_list_matches_what_readers_decode(
    catalog: OutcomeCatalog, version: int
) -> None:
    table = await new_table(catalog, format_version=version)
    producer = fast_append(table, [df(table, "a")])
    table = await producer.commit(QUICK)
    producer = fast_append(table, [df(table, "b", "b")], reader=producer.reader)
    table = await producer.commit(QUICK)
    snapshot = current(table)
    assert snapshot.manifest_list is not None
    cached = await producer.reader.manifests(snapshot)
    decoded = read_manifest_list(
        await table.io.read(snapshot.manifest_list), location=snapshot.manifest_list
    )
    assert cached == decoded


async def test_commit_to_a_branch_leaves_main_alone(catalog: OutcomeCatalog) -> None:
    table = await new_table(catalog)
    a = df(table, "a")
    table = await fast_append(table, [a]).commit(QUICK)
    main_id = current(table).snapshot_id
    builder = MetadataBuilder(table.metadata).set_ref("audit", SnapshotRef.branch(main_id))
    table = await catalog.commit(table, builder.build(table.metadata_location))

    b = df(table, "b")
    table = await fast_append(table, [b], branch="audit").commit(QUICK)
    audit = table.metadata.snapshot_by_ref("audit")
    assert audit is not None and audit.parent_snapshot_id == main_id
    assert table.metadata.current_snapshot_id == main_id
    assert await live(table) == [a.file_path]
    assert await live(table, "audit") == sorted([a.file_path, b.file_path])

    c = df(table, "c")
    table = await fast_append(table, [c]).commit(QUICK)
    assert await live(table) == sorted([a.file_path, c.file_path])
    assert await live(table, "audit") == sorted([a.file_path, b.file_path])
    assert table.metadata.refs["audit"].snapshot_id == audit.snapshot_id
    # each branch's totals follow its own history
    main_summary = summary(table)
    assert main_summary[Summary.TOTAL_DATA_FILES] == "2"

    # a branch that does not exist yet forks from main's head, as in Java
    head = current(table).snapshot_id
    e = df(table, "e")
    table = await fast_append(table, [e], branch="fresh").commit(QUICK)
    fresh = table.metadata.snapshot_by_ref("fresh")
    assert fresh is not None and fresh.parent_snapshot_id == head
    assert await live(table, "fresh") == sorted([a.file_path, c.file_path, e.file_path])
    assert current(table).snapshot_id == head

    tagged = MetadataBuilder(table.metadata).set_ref("v1", SnapshotRef.tag(main_id))
    table = await catalog.commit(table, tagged.build(table.metadata_location))
    with pytest.raises(ValidationError, match="tag"):
        await fast_append(table, [df(table, "d")], branch="v1").commit(QUICK)
    assert table.metadata.refs["v1"].snapshot_id == main_id


async def test_snapshot_properties_and_ids(catalog: OutcomeCatalog) -> None:
    table = await new_table(catalog)
    producer = fast_append(
        table, [df(table, "a")], snapshot_id=4242, snapshot_properties={"job": "nightly"}
    )
    table = await producer.commit(QUICK)
    snapshot = current(table)
    assert snapshot.snapshot_id == 4242
    assert snapshot.summary is not None and snapshot.summary["job"] == "nightly"
    assert snapshot.schema_id == table.metadata.current_schema_id
    assert snapshot.manifest_list is not None
    assert snapshot.manifest_list.startswith(metadata_dir(table.metadata) + "/snap-4242-")
    assert producer.already_applied(table)


# --------------------------------------------------------------------------------------
# Conflicts and clean-up
# --------------------------------------------------------------------------------------


async def test_conflicting_appends_both_land_and_losers_are_cleaned_up(
    catalog: OutcomeCatalog,
) -> None:
    table = await new_table(catalog, properties={MERGE_MIN_COUNT: "2"})
    table = await fast_append(table, [df(table, "seed")]).commit(QUICK)
    first = merge_append(table, [df(table, "x")])
    second = merge_append(table, [df(table, "y")])
    await first.commit(QUICK)
    table = await second.commit(QUICK)

    assert (second.stats.attempts, second.stats.conflicts) == (2, 1)
    assert await live(table) == sorted([df(table, n).file_path for n in ("seed", "x", "y")])
    history = list(table.metadata.ancestors_of(current(table).snapshot_id))
    assert [s.snapshot_id for s in history[:2]] == [second.snapshot_id, first.snapshot_id]
    # the losing attempt's manifest list and merged manifest are deleted; what the
    # committed snapshots reference is all there
    assert await unreferenced_avro_files(table) == []
    assert await referenced_files_missing(table) == []


async def test_retries_give_up_after_num_retries(catalog: OutcomeCatalog) -> None:
    table = await new_table(catalog)
    producer = fast_append(table, [df(table, "late")])

    async def always_moved(t: Table) -> TableMetadata:
        # Someone commits between every build and swap.
        await fast_append(
            await catalog.load_table("db.t"), [df(t, f"w{producer.stats.attempts}")]
        ).commit(QUICK)
        return await SnapshotProducer.build(producer, t)

    producer.build = always_moved  # type: ignore[method-assign]
    policy = RetryPolicy(num_retries=2, min_wait_ms=1, max_wait_ms=2)
    with pytest.raises(CommitFailedError):
        await producer.commit(policy)
    assert (producer.stats.attempts, producer.stats.conflicts) == (3, 3)
    after = await catalog.load_table("db.t")
    assert after.metadata.snapshot_by_id(producer.snapshot_id) is None
    assert await unreferenced_avro_files(after) == []


# --------------------------------------------------------------------------------------
# Unknown commit outcomes
# --------------------------------------------------------------------------------------


async def test_unknown_outcome_of_an_applied_commit_is_a_success(catalog: OutcomeCatalog) -> None:
    table = await new_table(catalog)
    table = await fast_append(table, [df(table, "a")]).commit(QUICK)
    catalog.outcomes.append("applied")
    producer = fast_append(table, [df(table, "b")])
    committed = await producer.commit(QUICK)

    assert (producer.stats.attempts, producer.stats.unknown_outcomes) == (1, 1)
    loaded = await catalog.load_table("db.t")
    assert loaded.metadata_location == committed.metadata_location
    ids = [s.snapshot_id for s in loaded.metadata.snapshots]
    assert ids.count(producer.snapshot_id) == 1
    assert len(ids) == 2
    assert await live(loaded) == sorted([df(table, "a").file_path, df(table, "b").file_path])
    assert await referenced_files_missing(loaded) == []


async def test_unknown_outcome_of_a_lost_commit_is_retried_once(catalog: OutcomeCatalog) -> None:
    table = await new_table(catalog)
    catalog.outcomes.append("lost")
    producer = fast_append(table, [df(table, "a")])
    committed = await producer.commit(QUICK)

    assert (producer.stats.attempts, producer.stats.unknown_outcomes) == (2, 1)
    assert catalog.commits == 2
    loaded = await catalog.load_table("db.t")
    assert loaded.metadata_location == committed.metadata_location
    assert [s.snapshot_id for s in loaded.metadata.snapshots] == [producer.snapshot_id]
    # the first attempt's manifest list was never referenced: cleaned up
    assert await unreferenced_avro_files(loaded) == []


async def test_unexpected_error_after_the_swap_keeps_every_file(catalog: OutcomeCatalog) -> None:
    table = await new_table(catalog)
    catalog.outcomes.append("crash")
    producer = fast_append(table, [df(table, "a")])
    with pytest.raises(RuntimeError, match="torn down"):
        await producer.commit(QUICK)
    loaded = await catalog.load_table("db.t")
    assert loaded.metadata.snapshot_by_id(producer.snapshot_id) is not None
    assert await referenced_files_missing(loaded) == []
    assert await live(loaded) == [df(table, "a").file_path]


async def test_storage_error_after_the_metadata_file_landed(
    catalog: OutcomeCatalog, io: FlakyMetadataIO
) -> None:
    table = await new_table(catalog)
    io.faults.append("applied")
    producer = fast_append(table, [df(table, "a")])
    committed = await producer.commit(QUICK)
    assert (producer.stats.attempts, producer.stats.conflicts) == (1, 0)
    loaded = await catalog.load_table("db.t")
    assert loaded.metadata_location == committed.metadata_location
    assert [s.snapshot_id for s in loaded.metadata.snapshots] == [producer.snapshot_id]
    assert await referenced_files_missing(loaded) == []


async def test_storage_error_before_the_metadata_file_landed(
    catalog: OutcomeCatalog, io: FlakyMetadataIO
) -> None:
    table = await new_table(catalog)
    io.faults.append("lost")
    producer = fast_append(table, [df(table, "a")])
    committed = await producer.commit(QUICK)
    assert (producer.stats.attempts, producer.stats.conflicts) == (2, 1)
    loaded = await catalog.load_table("db.t")
    assert loaded.metadata_location == committed.metadata_location
    assert [s.snapshot_id for s in loaded.metadata.snapshots] == [producer.snapshot_id]
    assert await unreferenced_avro_files(loaded) == []


async def test_storage_error_and_unreadable_result_resolved_by_reload(
    catalog: OutcomeCatalog, io: FlakyMetadataIO
) -> None:
    table = await new_table(catalog)
    io.faults.append("applied-unreadable")
    producer = fast_append(table, [df(table, "a")])
    committed = await producer.commit(QUICK)
    assert (producer.stats.attempts, producer.stats.unknown_outcomes) == (1, 1)
    loaded = await catalog.load_table("db.t")
    assert loaded.metadata_location == committed.metadata_location
    assert [s.snapshot_id for s in loaded.metadata.snapshots] == [producer.snapshot_id]


# --------------------------------------------------------------------------------------
# The retry policy and loop
# --------------------------------------------------------------------------------------


def test_retry_policy_from_table_properties() -> None:
    assert RetryPolicy.from_properties({}) == RetryPolicy(4, 100, 60_000, 1_800_000)
    policy = RetryPolicy.from_properties(
        {NUM_RETRIES: "10", MIN_WAIT_MS: "5", MAX_WAIT_MS: "50", TOTAL_TIMEOUT_MS: "1000"}
    )
    assert policy == RetryPolicy(10, 5, 50, 1000)
    with pytest.raises(IcefloeError, match=r"commit\.retry\.num-retries='many'"):
        RetryPolicy.from_properties({NUM_RETRIES: "many"})
    with pytest.raises(IcefloeError, match="must not be negative"):
        RetryPolicy.from_properties({MIN_WAIT_MS: "-1"})


@settings(max_examples=examples(200))
@given(
    min_wait=st.integers(0, 10_000),
    max_wait=st.integers(0, 100_000),
    attempt=st.integers(0, 80),
)
def test_backoff_stays_within_its_bounds(min_wait: int, max_wait: int, attempt: int) -> None:
    policy = RetryPolicy(num_retries=1, min_wait_ms=min_wait, max_wait_ms=max_wait)
    wait_ms = policy.backoff.delay(attempt) * 1000
    ceiling = max(min_wait, min(max_wait, min_wait * 2**attempt))
    assert min_wait - 1e-6 <= wait_ms <= ceiling + 1e-6


async def test_commit_with_retry_uses_the_table_policy(catalog: OutcomeCatalog) -> None:
    table = await new_table(
        catalog, properties={NUM_RETRIES: "0", MIN_WAIT_MS: "1", MAX_WAIT_MS: "1"}
    )
    stale = table
    table = await fast_append(table, [df(table, "a")]).commit()
    stats = CommitStats()

    async def build(t: Table) -> TableMetadata:
        return MetadataBuilder(t.metadata).set_properties({"k": "v"}).build(t.metadata_location)

    with pytest.raises(CommitFailedError):  # no retries allowed by the table
        await commit_with_retry(catalog, stale, build, lambda t: False, stats=stats)
    assert (stats.attempts, stats.conflicts) == (1, 1)

    committed = await commit_with_retry(
        catalog,
        stale,
        build,
        lambda t: t.metadata.properties.get("k") == "v",
        policy=QUICK,
        stats=stats,
    )
    assert committed.metadata.properties["k"] == "v"
    assert committed.metadata.current_snapshot_id == table.metadata.current_snapshot_id


async def test_many_producers_on_one_base_all_land(catalog: OutcomeCatalog) -> None:
    """Sequentially built, all on the same stale base: each must rebuild on the newest."""
    table = await new_table(catalog)
    producers = [fast_append(table, [df(table, f"p{i}", "abc"[i % 3])]) for i in range(6)]
    policy = RetryPolicy(num_retries=10, min_wait_ms=1, max_wait_ms=2)
    for p in producers:
        await p.commit(policy)
    final = await catalog.load_table("db.t")
    assert len(await live(final)) == 6
    counts = collections.Counter(await live(final))
    assert set(counts.values()) == {1}
    assert summary(final)[Summary.TOTAL_DATA_FILES] == "6"
    assert [p.stats.attempts for p in producers] == [1, 2, 2, 2, 2, 2]


async def test_rewrite_on_a_new_branch_checks_only_later_deletes(
    catalog: OutcomeCatalog,
) -> None:
    table = await new_table(catalog)
    a = df(table, "a")
    old_delete = df(table, "old-pos", content=DataFileContent.POSITION_DELETES).copy(
        referenced_data_file=a.file_path
    )
    table = await fast_append(table, [a]).commit(QUICK)
    table = await row_delta(table, [], [old_delete]).commit(QUICK)
    # planned on main's head, committed to a branch that does not exist yet; a commit on
    # main in between moves nothing the rewrite depends on
    compaction = rewrite_files(table, [a.file_path], [df(table, "a2")], branch="compacted")
    await fast_append(table, [df(table, "other", "b")]).commit(QUICK)
    table = await compaction.commit(QUICK)
    assert await live(table, "compacted") == sorted(
        [old_delete.file_path, df(table, "a2").file_path, df(table, "other", "b").file_path]
    )


async def test_rewrite_refuses_to_undo_deletes_committed_meanwhile(
    catalog: OutcomeCatalog,
) -> None:
    table = await new_table(catalog)
    a, b, c = df(table, "a"), df(table, "b", "b"), df(table, "c", "c")
    table = await fast_append(table, [a, b, c]).commit(QUICK)
    compact_a = rewrite_files(table, [a.file_path], [df(table, "a2")])
    compact_b = rewrite_files(table, [b.file_path], [df(table, "b2", "b")])
    compact_c = rewrite_files(table, [c.file_path], [df(table, "c2", "c")])

    # committed while the rewrites were being planned: a position delete naming a, and an
    # equality delete in c's partition
    pos_a = df(table, "pos-a", content=DataFileContent.POSITION_DELETES).copy(
        referenced_data_file=a.file_path
    )
    eq_c = df(table, "eq-c", "c", content=DataFileContent.EQUALITY_DELETES)
    table = await row_delta(table, [], [pos_a, eq_c]).commit(QUICK)

    with pytest.raises(ValidationConflictError, match=r"pos-a\.parquet"):
        await compact_a.commit(QUICK)
    with pytest.raises(ValidationConflictError, match=r"eq-c\.parquet"):
        await compact_c.commit(QUICK)
    # no delete can touch b's partition: its rewrite still applies on the newer base
    table = await compact_b.commit(QUICK)
    assert await live(table) == sorted(
        f.file_path for f in (a, c, pos_a, eq_c, df(table, "b2", "b"))
    )
    assert await unreferenced_avro_files(table) == []


async def test_rewrite_validates_from_the_snapshot_it_was_planned_on(
    catalog: OutcomeCatalog,
) -> None:
    """As the coordinator commits a Spark compaction: the producer is made after the
    concurrent row delta landed, and told which snapshot the rewrite read."""
    table = await new_table(catalog)
    a, b = df(table, "a"), df(table, "b", "b")
    table = await fast_append(table, [a, b]).commit(QUICK)
    planned_on = table.metadata.current_snapshot_id
    pos_a = df(table, "pos-a", content=DataFileContent.POSITION_DELETES).copy(
        referenced_data_file=a.file_path
    )
    table = await row_delta(table, [], [pos_a]).commit(QUICK)
    table = await fast_append(table, [df(table, "later")]).commit(QUICK)

    late = rewrite_files(table, [a.file_path], [df(table, "a2")])
    late.validate_from_snapshot(planned_on)
    with pytest.raises(ValidationConflictError, match=r"pos-a\.parquet.*applies to.*a\.parquet"):
        await late.commit(QUICK)
    # without a starting snapshot it would have undone the delete: the default is the head
    # the producer saw, which is right only for a rewrite planned on that head
    assert await unreferenced_avro_files(await catalog.load_table("db.t")) == []
    # a rewrite of b (another partition) planned on the same snapshot still applies
    ok = rewrite_files(table, [b.file_path], [df(table, "b2", "b")]).validate_from_snapshot(
        planned_on
    )
    table = await ok.commit(QUICK)
    assert df(table, "b2", "b").file_path in await live(table)
    # a starting snapshot that is not in the branch's history is refused
    lost = rewrite_files(table, [a.file_path], [df(table, "a3")]).validate_from_snapshot(12345)
    with pytest.raises(ValidationConflictError, match="no longer in the history"):
        await lost.commit(QUICK)
