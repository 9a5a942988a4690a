"""v3 row deltas write deletion vectors: one per data file, merged and replaced on each delete.

Tables are real local file-system tables with real Parquet data files, and every check reads
back what a reader sees: the live delete entries of the snapshot and the rows that survive
(through ``icefloe scan``'s row reader), so a DV that is written but not applied, or two DVs
for one file, cannot pass.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from icefloe.catalog.fs import FileSystemCatalog
from icefloe.cli.scan import task_rows
from icefloe.deletes.deletion_vector import (
    DeletionVector,
    read_deletion_vector,
    write_deletion_vectors,
)
from icefloe.deletes.index import is_deletion_vector
from icefloe.errors import ValidationConflictError, ValidationError
from icefloe.io.fileio import LocalFileIO
from icefloe.manifests.cache import ManifestCache
from icefloe.manifests.manifest_list import ManifestContent
from icefloe.manifests.reader import ManifestReader
from icefloe.parquet.files import write_data_file
from icefloe.scan.planning import plan_scan
from icefloe.spec.datafile import DataFile, DataFileContent
from icefloe.spec.partition import PartitionField, PartitionSpec
from icefloe.spec.schema import Schema
from icefloe.spec.snapshot import Summary
from icefloe.spec.transforms import IdentityTransform
from icefloe.spec.types import LongType, NestedField, StringType
from icefloe.table.catalog import Table, TableIdentifier
from icefloe.table.snapshot_producer import (
    SnapshotProducer,
    data_file_location,
    delete_files,
    fast_append,
    row_delta,
)

SCHEMA = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "s", StringType()))


@pytest.fixture
async def catalog(tmp_path: Path) -> FileSystemCatalog:
    cat = FileSystemCatalog("t", str(tmp_path / "wh"), LocalFileIO())
    await cat.create_namespace("db")
    return cat


async def new_table(catalog: FileSystemCatalog, version: int = 3) -> Table:
    return await catalog.create_table(
        TableIdentifier(("db",), f"t{version}"), SCHEMA, format_version=version
    )


def data_file(table: Table, name: str, ids: range) -> DataFile:
    path = data_file_location(table, "", f"{name}.parquet")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    rows = pa.table({"id": pa.array(list(ids), pa.int64()), "s": [f"s{i}" for i in ids]})
    return write_data_file(rows, path, schema=table.metadata.schema(), file_path=path)


async def live_deletes(table: Table) -> list[DataFile]:
    snapshot = table.metadata.current_snapshot()
    assert snapshot is not None
    reader = ManifestReader(table.io)
    out = []
    for m in await reader.manifests(snapshot):
        for e in await reader.entries(m, table.metadata.specs(), live_only=True):
            if e.data_file.content != DataFileContent.DATA:
                out.append(e.data_file)
    return out


async def ids(table: Table) -> list[int]:
    plan = await plan_scan(table.metadata, ManifestCache(table.io))
    rows: list[dict[str, Any]] = []
    for task in plan.tasks():
        rows.extend(await task_rows(table.io, plan, task))
    return sorted(r["id"] for r in rows)


async def test_v3_row_delta_writes_a_deletion_vector_readers_apply(
    catalog: FileSystemCatalog,
) -> None:
    table = await new_table(catalog)
    a, b = data_file(table, "a", range(0, 10)), data_file(table, "b", range(10, 20))
    table = await fast_append(table, [a, b]).commit()
    table = await row_delta(table, [], [], deleted_positions=[(a, [1, 3]), (b, [0])]).commit()
    (dv_a, dv_b) = sorted(await live_deletes(table), key=lambda d: d.referenced_data_file or "")
    assert all(is_deletion_vector(d) for d in (dv_a, dv_b))
    assert dv_a.file_path == dv_b.file_path  # one Puffin file per commit
    assert (dv_a.referenced_data_file, dv_a.record_count) == (a.file_path, 2)
    assert list(await read_deletion_vector(table.io, dv_a)) == [1, 3]
    assert await ids(table) == [0, 2, *range(4, 10), *range(11, 20)]
    snapshot = table.metadata.current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    assert snapshot.summary.properties[Summary.ADDED_DVS] == "2"
    assert Summary.ADDED_POSITION_DELETE_FILES not in snapshot.summary.properties
    assert snapshot.summary.properties[Summary.ADDED_POSITION_DELETES] == "3"


async def test_a_second_delete_merges_with_the_dv_and_replaces_it(
    catalog: FileSystemCatalog,
) -> None:
    table = await new_table(catalog)
    a = data_file(table, "a", range(10))
    table = await fast_append(table, [a]).commit()
    table = await row_delta(table, [], [], deleted_positions=[(a, [1, 3])]).commit()
    (first,) = await live_deletes(table)
    table = await row_delta(table, [], [], deleted_positions=[(a, [3, 7])]).commit()
    (merged,) = await live_deletes(table)
    assert merged.file_path != first.file_path
    assert list(await read_deletion_vector(table.io, merged)) == [1, 3, 7]
    assert await ids(table) == [0, 2, 4, 5, 6, 8, 9]
    snapshot = table.metadata.current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    props = snapshot.summary.properties
    assert (props[Summary.ADDED_DVS], props[Summary.REMOVED_DVS]) == ("1", "1")
    assert props[Summary.TOTAL_DELETE_FILES] == "1"
    assert props[Summary.TOTAL_POSITION_DELETES] == "3"


async def test_a_caller_written_dv_is_merged_with_the_existing_one(
    catalog: FileSystemCatalog,
) -> None:
    table = await new_table(catalog)
    a = data_file(table, "a", range(10))
    table = await fast_append(table, [a]).commit()
    table = await row_delta(table, [], [], deleted_positions=[(a, [0])]).commit()
    written = await write_deletion_vectors(
        table.io, f"{table.metadata.location}/data", [(a, DeletionVector.from_positions([9]))]
    )
    table = await row_delta(table, [], written).commit()
    (merged,) = await live_deletes(table)
    assert list(await read_deletion_vector(table.io, merged)) == [0, 9]


async def test_retry_on_a_base_with_a_concurrent_dv_merges_both(
    catalog: FileSystemCatalog,
) -> None:
    table = await new_table(catalog)
    a = data_file(table, "a", range(10))
    table = await fast_append(table, [a]).commit()
    mine = row_delta(table, [], [], deleted_positions=[(a, [2])])
    await row_delta(table, [], [], deleted_positions=[(a, [5])]).commit()  # lands first
    table = await mine.commit()
    (merged,) = await live_deletes(table)
    assert list(await read_deletion_vector(table.io, merged)) == [2, 5]
    assert await ids(table) == [0, 1, 3, 4, 6, 7, 8, 9]


async def test_deleting_rows_of_a_file_removed_concurrently_is_refused(
    catalog: FileSystemCatalog,
) -> None:
    table = await new_table(catalog)
    a = data_file(table, "a", range(10))
    table = await fast_append(table, [a]).commit()
    mine = row_delta(table, [], [], deleted_positions=[(a, [2])])
    await delete_files(table, [a.file_path]).commit()
    with pytest.raises(ValidationConflictError, match="no longer live"):
        await mine.commit()


async def test_removing_a_data_file_removes_its_dv(catalog: FileSystemCatalog) -> None:
    table = await new_table(catalog)
    a, b = data_file(table, "a", range(5)), data_file(table, "b", range(5, 9))
    table = await fast_append(table, [a, b]).commit()
    table = await row_delta(table, [], [], deleted_positions=[(a, [0]), (b, [1])]).commit()
    table = await delete_files(table, [a.file_path]).commit()
    (left,) = await live_deletes(table)
    assert left.referenced_data_file == b.file_path
    assert await ids(table) == [5, 7, 8]


async def test_parquet_position_deletes_are_refused_on_v3(catalog: FileSystemCatalog) -> None:
    table = await new_table(catalog)
    a = data_file(table, "a", range(3))
    table = await fast_append(table, [a]).commit()
    position_file = DataFile(
        file_path=f"{table.metadata.location}/data/pos.parquet",
        file_format="parquet",
        partition=(),
        record_count=1,
        file_size_in_bytes=10,
        content=DataFileContent.POSITION_DELETES,
    )
    with pytest.raises(ValidationError, match="must not be added to v3 tables"):
        row_delta(table, [], [position_file])


async def test_deleted_positions_are_position_delete_files_on_v2(
    catalog: FileSystemCatalog,
) -> None:
    """v2 has no DVs: positions become one sorted position delete file per partition, kept
    beside the deletes a file already has; v1 has no row-level deletes at all."""
    table = await new_table(catalog, version=2)
    a = data_file(table, "a", range(3))
    b = data_file(table, "b", range(10, 14))
    table = await fast_append(table, [a, b]).commit()
    table = await row_delta(table, [], [], deleted_positions=[(a, [2, 0]), (b, [1])]).commit()
    assert await ids(table) == [1, 10, 12, 13]
    (first,) = await live_deletes(table)
    assert first.content == DataFileContent.POSITION_DELETES and first.referenced_data_file is None
    assert first.record_count == 3 and first.file_path.endswith("-deletes.parquet")
    table = await row_delta(table, [], [], deleted_positions=[(b, [3, 1])]).commit()
    assert await ids(table) == [1, 10, 12]
    deletes = await live_deletes(table)
    assert len(deletes) == 2
    assert {d.referenced_data_file for d in deletes} == {None, b.file_path}
    summary = table.metadata.current_snapshot().summary  # type: ignore[union-attr]
    assert summary is not None and summary["added-position-delete-files"] == "1"
    v1 = await catalog.create_table(TableIdentifier(("db",), "t1"), SCHEMA, format_version=1)
    c = data_file(v1, "c", range(2))
    v1 = await fast_append(v1, [c]).commit()
    with pytest.raises(ValidationError, match="need format v2"):
        row_delta(v1, [], [], deleted_positions=[(c, [0])])


async def test_deletion_vector_files_are_refused_before_v3(catalog: FileSystemCatalog) -> None:
    table = await new_table(catalog, version=2)
    a = data_file(table, "a", range(3))
    table = await fast_append(table, [a]).commit()
    dv = DataFile(
        file_path="d.puffin",
        file_format="puffin",
        partition=(),
        record_count=1,
        file_size_in_bytes=10,
        content=DataFileContent.POSITION_DELETES,
        referenced_data_file=a.file_path,
        content_offset=4,
        content_size_in_bytes=10,
    )
    with pytest.raises(ValidationError, match="need format v3"):
        SnapshotProducer(table, row_delta(table, [a], []).operation).add_file(dv)


async def test_positions_past_the_file_are_refused(catalog: FileSystemCatalog) -> None:
    table = await new_table(catalog)
    a = data_file(table, "a", range(3))
    table = await fast_append(table, [a]).commit()
    with pytest.raises(ValidationError, match="past its 3 rows"):
        row_delta(table, [], [], deleted_positions=[(a, [3])])


@pytest.mark.parametrize("version", [2, 3])
async def test_committed_delete_manifests_are_remembered_as_a_read_returns_them(
    catalog: FileSystemCatalog, version: int
) -> None:
    """A producer hands the reader the entries of the delete manifests it committed, so
    the next row delta finds the deletes it replaces without reading back what was just
    written: those entries must be exactly what reading the manifest returns (statuses,
    inherited snapshot ids and sequence numbers, partitions in spec order), whatever the
    commit did (add, merge and replace DVs on v3; add position delete files on v2), and
    the table must read the same either way."""
    spec = PartitionSpec(0, (PartitionField(2, 1000, "s", IdentityTransform()),))
    table = await catalog.create_table(
        TableIdentifier(("db",), f"p{version}"), SCHEMA, spec, format_version=version
    )

    def part(name: str, ids: range, s: str) -> DataFile:
        path = data_file_location(table, f"s={s}", f"{name}.parquet")
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        rows = pa.table({"id": pa.array(list(ids), pa.int64()), "s": [s] * len(ids)})
        schema = table.metadata.schema()
        return write_data_file(rows, path, schema=schema, spec=spec, partition=(s,), file_path=path)

    a, b, c = (
        part("a", range(10), "x"),
        part("b", range(10, 20), "y"),
        part("c", range(20, 25), "x"),
    )
    first_id = {a.file_path: 0, b.file_path: 10, c.file_path: 20}
    table = await fast_append(table, [a, b, c]).commit()
    reads: list[str] = []

    class CountingIO(LocalFileIO):
        async def read(self, path: str) -> bytes:
            reads.append(path)
            return await super().read(path)

    reader = ManifestReader(CountingIO())  # shared by the commits, as the coordinator's is
    deletes = [[(a, [1]), (b, [0, 9])], [(a, [2]), (c, [4])], [(b, [5]), (a, [1, 7])]]
    expected = set(range(25))
    for batch in deletes:
        table = await row_delta(table, [], [], deleted_positions=batch, reader=reader).commit()
        for f, positions in batch:
            expected -= {first_id[f.file_path] + p for p in positions}
        snapshot = table.metadata.current_snapshot()
        assert snapshot is not None
        ours = [
            m
            for m in await reader.manifests(snapshot)
            if m.content == ManifestContent.DELETES and m.added_snapshot_id == snapshot.snapshot_id
        ]
        assert ours, "the row delta wrote no delete manifest"
        fresh = ManifestReader(table.io)
        for m in ours:
            remembered = await reader.entries(m, table.metadata.specs())
            assert m.manifest_path not in reads, "read back, not remembered"
            assert remembered == await fresh.entries(m, table.metadata.specs()), m.manifest_path
        assert await ids(table) == sorted(expected)
    live = await live_deletes(table)
    if version == 3:
        assert sorted(d.referenced_data_file or "" for d in live) == sorted(
            [a.file_path, b.file_path, c.file_path]
        )
