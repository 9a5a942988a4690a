"""A committer with a manifest store persists the decoded manifests it commits (in the
background, once the commit returned), and a planner over the same directory plans from
them without reading or decoding a manifest.

Real file-system tables; the planner side is a fresh :class:`ManifestCache` over a fresh
:class:`ManifestStore` on the same directory (another process would see the same files),
and its plans must equal those of a planner without any store.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from manifest_fixtures import id_file

from icefloe.catalog.fs import FileSystemCatalog
from icefloe.expressions.json_form import parse_expression
from icefloe.io.fileio import LocalFileIO
from icefloe.manifests.cache import ManifestCache
from icefloe.manifests.reader import ManifestReader
from icefloe.manifests.store import ManifestStore
from icefloe.scan.planning import plan_scan
from icefloe.scan.tasks_json import scan_tasks_json
from icefloe.spec.datafile import DataFile, DataFileContent
from icefloe.spec.partition import PartitionSpecBuilder
from icefloe.spec.schema import Schema
from icefloe.spec.types import LongType, NestedField, StringType
from icefloe.table.catalog import Table
from icefloe.table.snapshot_producer import fast_append, overwrite_files, row_delta

SCHEMA = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "s", StringType()))


def _file(table: Table, i: int, s: str) -> DataFile:
    return id_file(table.location, i, s)


async def _plans(table: Table, cache: ManifestCache) -> list[object]:
    out: list[object] = []
    for expr in (
        None,
        {"type": "eq", "term": "s", "value": "b"},
        {"type": "lt", "term": "id", "value": 25},
    ):
        row_filter = None if expr is None else parse_expression(expr)
        p = await plan_scan(table.metadata, cache, row_filter=row_filter, offload=False)
        out.append(scan_tasks_json(p, 0, 1000))
    return out


@pytest.mark.parametrize("version", [2, 3])
async def test_a_planner_on_the_committers_store_decodes_nothing(
    tmp_path: Path, version: int
) -> None:
    io = LocalFileIO()
    store_dir = tmp_path / "decoded"
    reader = ManifestReader(io, store=ManifestStore(store_dir, 1 << 30))
    catalog = FileSystemCatalog("c", str(tmp_path / "wh"), io)
    await catalog.create_namespace("db")
    spec = PartitionSpecBuilder(SCHEMA).add_field("s", "identity").build()
    table = await catalog.create_table("db.t", SCHEMA, spec, format_version=version)
    first = [_file(table, i, "ab"[i % 2]) for i in range(6)]
    table = await fast_append(table, first, reader=reader).commit()
    table = await fast_append(table, [_file(table, 6, "b")], reader=reader).commit()
    if version == 2:
        eq = DataFile(
            f"{table.location}/data/eq.parquet",
            "parquet",
            ("a",),
            1,
            10,
            content=DataFileContent.EQUALITY_DELETES,
            equality_ids=[1],
        )
        table = await row_delta(table, [], [eq], reader=reader).commit()
    # A rewritten manifest: existing and deleted entries with their own sequence numbers.
    table = await overwrite_files(
        table, [first[0].file_path], [_file(table, 7, "a")], reader=reader
    ).commit()

    # The fills run in the background after each commit returned; wait for them.
    assert reader.decoded_writer is not None and reader.decoded_writer.flush(timeout=None)
    assert reader.decoded_writer.stats.failed == reader.decoded_writer.stats.dropped == 0
    planner_store = ManifestStore(store_dir, 1 << 30)
    warm = ManifestCache(io, store=planner_store)
    ours = await _plans(table, warm)
    snapshot = table.metadata.current_snapshot()
    assert snapshot is not None
    listed = await ManifestCache(io).manifest_list(snapshot)
    assert planner_store.misses == 0
    assert planner_store.hits == len(listed)  # every manifest of the snapshot was stored
    # Only manifest lists were read: no manifest was read or decoded.
    list_bytes = Path(snapshot.manifest_list or "").stat().st_size
    assert warm.stats().bytes_read == list_bytes
    assert ours == await _plans(table, ManifestCache(io))


async def test_without_a_store_nothing_is_kept(tmp_path: Path) -> None:
    io = LocalFileIO()
    catalog = FileSystemCatalog("c", str(tmp_path / "wh"), io)
    await catalog.create_namespace("db")
    spec = PartitionSpecBuilder(SCHEMA).add_field("s", "identity").build()
    table = await catalog.create_table("db.t", SCHEMA, spec)
    producer = fast_append(table, [_file(table, 1, "a")])
    await producer.commit()
    assert producer._manifest_bytes == {}
