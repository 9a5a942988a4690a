"""Apache Iceberg Java 1.10.2 (Spark 3.5) and icefloe read each other's tables, v2 and v3.

The Java side is the ``java_iceberg`` session fixture: one Spark 3.5 session with Iceberg's
runtime, in its own venv, addressed with SQL over a pipe. Tables live in a HadoopCatalog
warehouse, which is the layout of icefloe's file-system catalog, so both sides open the same
folders with no conversion. Every comparison is of rows as each side reads them.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from icefloe.catalog import Table
from icefloe.catalog_fs import FileSystemCatalog
from icefloe.delete_index import is_deletion_vector
from icefloe.fileio import LocalFileIO
from icefloe.manifest_cache import ManifestCache
from icefloe.scan import plan_scan
from java_iceberg import JavaIceberg

pytestmark = [pytest.mark.interop, pytest.mark.integration]

MOR = "'write.delete.mode'='merge-on-read','write.update.mode'='merge-on-read'"


def load(warehouse: Path, name: str) -> Table:
    catalog = FileSystemCatalog("java", str(warehouse), LocalFileIO())
    return asyncio.run(catalog.load_table(name))


def plan_tasks(table: Table) -> list[Any]:
    plan = asyncio.run(plan_scan(table.metadata, ManifestCache(table.io)))
    return list(plan.tasks())


def test_java_v3_merge_on_read_writes_one_deletion_vector_per_data_file(
    java_iceberg: JavaIceberg, tmp_path: Path
) -> None:
    wh = tmp_path
    java_iceberg.sql(
        wh,
        "CREATE TABLE {cat}.db.t (id bigint, s string) USING iceberg "
        f"TBLPROPERTIES ('format-version'='3',{MOR})",
    )
    java_iceberg.sql(wh, "INSERT INTO {cat}.db.t VALUES (1,'a'),(2,'b'),(3,'c'),(4,'d')")
    java_iceberg.sql(wh, "DELETE FROM {cat}.db.t WHERE id = 2")
    java_iceberg.sql(wh, "DELETE FROM {cat}.db.t WHERE id = 4")

    table = load(wh, "db.t")
    assert table.metadata.format_version == 3
    tasks = plan_tasks(table)
    assert len(tasks) == 1
    (dv,) = tasks[0].delete_files  # the second DELETE merged the first vector and replaced it
    assert is_deletion_vector(dv)
    assert dv.file_format == "puffin"
    assert dv.referenced_data_file == tasks[0].data_file.file_path
    assert dv.record_count == 2
    rows = java_iceberg.sql(wh, "SELECT id FROM {cat}.db.t ORDER BY id")
    assert rows == [{"id": 1}, {"id": 3}]
