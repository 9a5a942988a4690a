"""The coordinator takes the planner's disk cache setting (ICEFLOE_PLANNER_CACHE_DIR) and
persists the manifests it commits there, in the background after the commit, with the
fills' outcomes in its /metrics (the mechanism itself is tested in
tests/shared/manifests/test_commit_persists_decoded.py and tests/shared/manifests/test_decoded_writer.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import generate_latest

from icefloe.catalog.fs import FileSystemCatalog
from icefloe.coordinator.config import CoordinatorConfig
from icefloe.coordinator.service import Coordinator
from icefloe.io.fileio import LocalFileIO
from icefloe.spec.datafile import DataFile
from icefloe.spec.schema import Schema
from icefloe.spec.types import LongType, NestedField
from icefloe.table.snapshot_producer import fast_append


async def test_the_planner_cache_dir_setting_gives_the_committers_a_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ICEFLOE_PLANNER_CACHE_DIR", str(tmp_path / "decoded"))
    monkeypatch.setenv("ICEFLOE_PLANNER_CACHE_DISK_MAX_BYTES", "12345678")
    config = CoordinatorConfig(catalog=f"file://{tmp_path}/wh")
    catalog = FileSystemCatalog("c", str(tmp_path / "wh"), LocalFileIO())
    coordinator = Coordinator(config, catalog=catalog)
    store = coordinator.reader.store
    assert store is not None
    assert store.directory == tmp_path / "decoded" and store.max_bytes == 12345678


async def test_without_the_setting_nothing_is_persisted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ICEFLOE_PLANNER_CACHE_DIR", raising=False)
    catalog = FileSystemCatalog("c", str(tmp_path / "wh"), LocalFileIO())
    config = CoordinatorConfig(catalog=f"file://{tmp_path}/wh")
    assert Coordinator(config, catalog=catalog).reader.store is None


async def test_commits_fill_the_cache_in_the_background_and_count_it_in_metrics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ICEFLOE_PLANNER_CACHE_DIR", str(tmp_path / "decoded"))
    catalog = FileSystemCatalog("c", str(tmp_path / "wh"), LocalFileIO())
    coordinator = Coordinator(CoordinatorConfig(catalog=f"file://{tmp_path}/wh"), catalog=catalog)
    await catalog.create_namespace("db")
    schema = Schema(NestedField(1, "id", LongType(), required=True))
    table = await catalog.create_table("db.t", schema)
    data = DataFile(f"{table.location}/data/1.parquet", "parquet", (), 10, 100)
    await fast_append(table, [data], reader=coordinator.reader).commit()
    writer = coordinator.reader.decoded_writer
    assert writer is not None and writer.flush(timeout=None)
    text = generate_latest(coordinator.metrics.registry).decode()
    assert 'icefloe_coordinator_planner_cache_manifests_total{outcome="written"} 1.0' in text
    assert 'icefloe_coordinator_planner_cache_manifests_total{outcome="dropped"} 0.0' in text
    assert "icefloe_coordinator_planner_cache_pending_bytes 0.0" in text
    assert len(list((tmp_path / "decoded").glob("*.arrow"))) == 1
