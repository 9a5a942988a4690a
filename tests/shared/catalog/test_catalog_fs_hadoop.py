"""The file-system catalog reads Java HadoopCatalog layouts: namespaces are plain folders."""

from __future__ import annotations

from pathlib import Path

import pytest

from icefloe.catalog.fs import NAMESPACE_MARKER, FileSystemCatalog
from icefloe.errors import NotFoundError
from icefloe.io.fileio import LocalFileIO
from icefloe.spec.schema import Schema
from icefloe.spec.types import LongType, NestedField

SCHEMA = Schema(NestedField(1, "id", LongType(), required=True))


async def test_marker_less_folders_are_namespaces_and_tables_are_not(tmp_path: Path) -> None:
    catalog = FileSystemCatalog("t", str(tmp_path), LocalFileIO())
    await catalog.create_namespace("db")
    await catalog.create_table("db.t", SCHEMA)
    (tmp_path / "db" / NAMESPACE_MARKER).unlink()  # what Java's HadoopCatalog leaves
    (tmp_path / "db" / "sub").mkdir()  # an empty namespace made by Java
    assert await catalog.list_namespaces() == [("db",)]
    assert await catalog.list_namespaces("db") == [("db", "sub")]
    assert [str(t) for t in await catalog.list_tables("db")] == ["db.t"]
    assert await catalog.load_namespace_properties("db.sub") == {}
    assert await catalog.namespace_exists("db")
    assert not await catalog.namespace_exists("db.t")  # a table, not a namespace
    with pytest.raises(NotFoundError, match="nope"):
        await catalog.list_tables("nope")

    await catalog.drop_namespace("db.sub")
    assert not (tmp_path / "db" / "sub").exists()
    await catalog.drop_table("db.t")
    assert await catalog.list_namespaces("db") == []
    await catalog.drop_namespace("db")
    assert await catalog.list_namespaces() == []
