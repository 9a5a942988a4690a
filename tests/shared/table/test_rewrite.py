"""The engine-free rewrite (icefloe.table.rewrite) on a local file-system catalog with real Parquet.

The law: whatever the files (partitions, several row groups each, columns added after they
were written) and deletes (v3 deletion vectors; v2 position delete files that each cover
several data files), the rows a reader sees after the rewrite are the rows it saw before;
no delete survives for a rewritten file, delete files that applied only to rewritten files
are removed, and on v3 every row keeps its ``_row_id`` and ``_last_updated_sequence_number``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples
from icefloe.catalog.fs import FileSystemCatalog
from icefloe.cli.scan import task_rows
from icefloe.io.fileio import LocalFileIO
from icefloe.manifests.cache import ManifestCache
from icefloe.manifests.reader import ManifestReader
from icefloe.parquet.files import write_data_file
from icefloe.scan.planning import plan_scan
from icefloe.spec.datafile import DataFile, DataFileContent
from icefloe.spec.metadata_builder import MetadataBuilder
from icefloe.spec.partition import PartitionField, PartitionSpec
from icefloe.spec.schema import Schema
from icefloe.spec.schema_update import UpdateSchema
from icefloe.spec.snapshot import Operation
from icefloe.spec.transforms import IdentityTransform
from icefloe.spec.types import LongType, NestedField, StringType
from icefloe.table.catalog import Table, TableIdentifier
from icefloe.table.compaction import CompactionPolicy, plan_compaction
from icefloe.table.rewrite import rewrite_and_commit, select_groups
from icefloe.table.snapshot_producer import SnapshotProducer, fast_append

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "category", StringType()),
)
SPEC = PartitionSpec(0, (PartitionField(2, 1000, "category", IdentityTransform()),))


async def rows(table: Table, lineage: bool = False) -> list[tuple[Any, ...]]:
    if table.metadata.current_snapshot() is None:
        return []
    plan = await plan_scan(table.metadata, ManifestCache(table.io))
    out = []
    for task in plan.tasks():
        for row in await task_rows(table.io, plan, task, row_lineage=lineage):
            out.append(tuple(sorted(row.items())))
    return sorted(out)


async def live(table: Table) -> list[DataFile]:
    head = table.metadata.current_snapshot()
    assert head is not None
    reader = ManifestReader(table.io)
    out = []
    for manifest in await reader.manifests(head):
        out.extend(
            e.data_file
            for e in await reader.entries(manifest, table.metadata.specs(), live_only=True)
        )
    return out


def write(table: Table, n: int, ids: list[int], category: str) -> DataFile:
    path = f"{table.location}/data/category={category}/f{n:04d}.parquet"
    local = Path(path.removeprefix("file://"))
    local.parent.mkdir(parents=True, exist_ok=True)
    arrow = pa.table({"id": pa.array(ids, pa.int64()), "category": pa.array([category] * len(ids))})
    # Row groups of 3 rows: the rewrite streams them and must keep positions straight.
    return write_data_file(
        arrow,
        str(local),
        schema=SCHEMA,
        spec=SPEC,
        partition=(category,),
        file_path=path,
        properties={"write.parquet.row-group-limit": "3"},
    )


files_and_deletes = st.lists(
    st.tuples(
        st.sampled_from("ab"),
        st.integers(1, 9),  # rows in the file
        st.sets(st.integers(0, 8), max_size=6),  # positions deleted, first round
        st.sets(st.integers(0, 8), max_size=3),  # positions deleted, second round
    ),
    min_size=1,
    max_size=6,
)


@pytest.mark.parametrize("version", [2, 3])
@settings(
    max_examples=examples(15),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(spec=files_and_deletes, evolve=st.booleans())
async def test_a_rewrite_keeps_exactly_the_rows_a_reader_saw(
    tmp_path_factory: pytest.TempPathFactory,
    version: int,
    spec: list[tuple[str, int, set[int], set[int]]],
    evolve: bool,
) -> None:
    root = tmp_path_factory.mktemp("rewrite")
    catalog = FileSystemCatalog("test", str(root / "wh"), LocalFileIO())
    await catalog.create_namespace("db")
    table = await catalog.create_table(
        TableIdentifier(("db",), "t"), SCHEMA, SPEC, format_version=version
    )
    written = []
    next_id = 0
    for n, (category, count, _, _) in enumerate(spec):
        written.append(write(table, n, list(range(next_id, next_id + count)), category))
        next_id += count
    table = await fast_append(table, written).commit()
    # Two rounds of deletes: v3 merges them into one DV per file, v2 leaves two position
    # delete files, each covering every file it deletes from.
    for round_ in (2, 3):
        producer = SnapshotProducer(table, Operation.DELETE)
        for f, entry in zip(written, spec, strict=True):
            positions = sorted(p for p in entry[round_] if p < f.record_count)
            if positions:
                producer.delete_positions(f, positions)
        if producer.deletes_positions:
            table = await producer.commit()
    if evolve:
        md = table.metadata
        schema, last = (
            UpdateSchema(md.schema(), md.last_column_id, md.format_version)
            .add_column("note", StringType())
            .apply()
        )
        builder = MetadataBuilder(md).add_schema(schema, last).set_current_schema(-1)
        table = await catalog.commit(table, builder.build(table.metadata_location))
    before = await rows(table, lineage=version >= 3)
    plan = await plan_compaction(
        table, policy=CompactionPolicy.for_table(table.metadata, {"rewrite_all": True})
    )
    groups = select_groups(plan, 1 << 40)
    result = await rewrite_and_commit(table, plan, groups)
    assert result is not None
    after_table = await catalog.load_table("db.t")
    assert await rows(after_table, lineage=version >= 3) == before
    files = await live(after_table)
    assert not [f for f in files if f.content != DataFileContent.DATA], "a delete survived"
    data = [f for f in files if f.content == DataFileContent.DATA]
    assert len(data) == len({f.partition for f in data}), "one file per partition"
    assert sum(f.record_count for f in data) == len(before)
    for f in data:  # gathered into full row groups, not one per input row group
        meta = pq.ParquetFile(f.file_path.removeprefix("file://")).metadata
        assert meta.num_row_groups == 1
    await catalog.close()
