"""The decoded-manifest writer fills a planner's disk cache after a commit, not before it.

A commit returns while the fill is still blocked; a fill that is dropped (queue full) or
fails (a store that raises, bytes that do not decode) is counted and logged, never raised,
and the planner then plans the same answer by decoding those manifests itself. Real
file-system tables, as in tests/shared/manifests/test_commit_persists_decoded.py.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from manifest_fixtures import id_file

from icefloe.catalog.fs import FileSystemCatalog
from icefloe.errors import ValidationError
from icefloe.expressions.json_form import parse_expression
from icefloe.io.fileio import LocalFileIO
from icefloe.manifests.cache import ManifestCache
from icefloe.manifests.decoded_writer import DecodedManifestWriter
from icefloe.manifests.manifest_list import ManifestFile
from icefloe.manifests.reader import ManifestReader
from icefloe.manifests.store import ManifestStore
from icefloe.scan.planning import plan_scan
from icefloe.scan.tasks_json import scan_tasks_json
from icefloe.spec.datafile import DataFile
from icefloe.spec.partition import PartitionSpecBuilder
from icefloe.spec.schema import Schema
from icefloe.spec.types import LongType, NestedField, StringType
from icefloe.table.catalog import Table
from icefloe.table.snapshot_producer import fast_append

SCHEMA = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "s", StringType()))


class GatedStore(ManifestStore):
    """A store whose saves wait for ``gate`` (a slow disk), and can be made to raise."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory, 1 << 30)
        self.gate = threading.Event()
        self.fail = False

    def save(self, *args: Any, **kwargs: Any) -> bool:
        self.gate.wait()
        if self.fail:
            raise OSError("disk full (test)")
        return super().save(*args, **kwargs)


def _file(table: Table, i: int) -> DataFile:
    return id_file(table.location, i, "ab"[i % 2])


async def _table(tmp_path: Path) -> Table:
    catalog = FileSystemCatalog("c", str(tmp_path / "wh"), LocalFileIO())
    await catalog.create_namespace("db")
    spec = PartitionSpecBuilder(SCHEMA).add_field("s", "identity").build()
    return await catalog.create_table("db.t", SCHEMA, spec, format_version=2)


async def _plans(table: Table, cache: ManifestCache) -> list[object]:
    out: list[object] = []
    for expr in (None, {"type": "eq", "term": "s", "value": "b"}):
        row_filter = None if expr is None else parse_expression(expr)
        p = await plan_scan(table.metadata, cache, row_filter=row_filter, offload=False)
        out.append(scan_tasks_json(p, 0, 1000))
    return out


async def _manifests(table: Table) -> list[ManifestFile]:
    snapshot = table.metadata.current_snapshot()
    assert snapshot is not None
    return await ManifestCache(LocalFileIO()).manifest_list(snapshot)


async def test_the_commit_returns_before_the_cache_is_filled(tmp_path: Path) -> None:
    store = GatedStore(tmp_path / "decoded")
    reader = ManifestReader(LocalFileIO(), store=store)
    writer = reader.decoded_writer
    assert writer is not None
    table = await _table(tmp_path)
    # The save is blocked: the commit must return anyway, the fill still queued.
    table = await fast_append(table, [_file(table, i) for i in range(4)], reader=reader).commit()
    assert writer.stats.pending == 1 and writer.stats.written == 0
    assert not writer.flush(timeout=0.01)  # still blocked
    store.gate.set()
    assert writer.flush(timeout=None)
    assert writer.stats == writer.stats.__class__(1, 0, 0, 0, 0, 0)
    # Filled: a planner on the same directory decodes nothing, and answers the same.
    planner_store = ManifestStore(tmp_path / "decoded", 1 << 30)
    warm = ManifestCache(LocalFileIO(), store=planner_store)
    assert await _plans(table, warm) == await _plans(table, ManifestCache(LocalFileIO()))
    assert planner_store.hits == len(await _manifests(table)) and planner_store.misses == 0


async def test_a_full_queue_drops_the_fill_and_the_planner_decodes_it(tmp_path: Path) -> None:
    store = ManifestStore(tmp_path / "decoded", 1 << 30)
    reader = ManifestReader(LocalFileIO(), store=store, max_pending_bytes=10)  # < a manifest
    writer = reader.decoded_writer
    assert writer is not None
    table = await _table(tmp_path)
    table = await fast_append(table, [_file(table, i) for i in range(4)], reader=reader).commit()
    assert writer.flush(timeout=None)
    stats = writer.stats
    assert (stats.dropped, stats.written, stats.pending, stats.pending_bytes) == (1, 0, 0, 0)
    planner_store = ManifestStore(tmp_path / "decoded", 1 << 30)
    cold = ManifestCache(LocalFileIO(), store=planner_store)
    assert await _plans(table, cold) == await _plans(table, ManifestCache(LocalFileIO()))
    assert planner_store.misses >= 1 and planner_store.hits == 0


async def test_a_failing_store_is_counted_and_later_fills_still_happen(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = GatedStore(tmp_path / "decoded")
    store.fail = True
    store.gate.set()
    reader = ManifestReader(LocalFileIO(), store=store)
    writer = reader.decoded_writer
    assert writer is not None
    table = await _table(tmp_path)
    table = await fast_append(table, [_file(table, 0)], reader=reader).commit()
    assert writer.flush(timeout=None)
    assert writer.stats.failed == 1 and writer.stats.written == 0
    assert "disk full (test)" in caplog.text and "will decode it itself" in caplog.text
    store.fail = False
    table = await fast_append(table, [_file(table, 1)], reader=reader).commit()
    assert writer.flush(timeout=None)
    assert writer.stats.failed == 1 and writer.stats.written == 1
    planner_store = ManifestStore(tmp_path / "decoded", 1 << 30)
    warm = ManifestCache(LocalFileIO(), store=planner_store)
    assert await _plans(table, warm) == await _plans(table, ManifestCache(LocalFileIO()))
    assert (planner_store.hits, planner_store.misses) == (1, 1)  # the failed one: decoded


async def test_bytes_that_do_not_decode_fail_alone(tmp_path: Path) -> None:
    table = await _table(tmp_path)
    table = await fast_append(table, [_file(table, 0)]).commit()
    (manifest,) = await _manifests(table)
    good = Path(manifest.manifest_path).read_bytes()
    writer = DecodedManifestWriter(ManifestStore(tmp_path / "decoded", 1 << 30))
    metadata = table.metadata
    assert writer.submit([(manifest, b"not avro")], metadata.specs(), metadata.schema())
    assert writer.submit([(manifest, good)], metadata.specs(), metadata.schema())
    assert writer.submit([], metadata.specs(), metadata.schema())  # nothing to queue
    assert writer.flush(timeout=None)
    assert (writer.stats.failed, writer.stats.written) == (1, 1)


def test_a_negative_queue_bound_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="max_pending_bytes"):
        DecodedManifestWriter(ManifestStore(tmp_path / "decoded", 1 << 30), -1)
