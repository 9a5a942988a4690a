"""The coordinator takes the planner's disk cache setting (ICEFLOE_PLANNER_CACHE_DIR) and
persists the manifests it commits there (the mechanism itself is tested in
tests/shared/test_commit_persists_decoded.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from icefloe.catalog_fs import FileSystemCatalog
from icefloe.coordinator.config import CoordinatorConfig
from icefloe.coordinator.service import Coordinator
from icefloe.fileio import LocalFileIO


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
