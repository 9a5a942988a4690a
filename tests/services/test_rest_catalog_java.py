"""Spark with Apache Iceberg's Java runtime (1.10.2, Spark 3.5) writing through icefloe.

Java's ``RESTCatalog`` is the reference REST client: here it is a Spark catalog of
``type=rest`` whose ``uri`` is the planner (real port, write routes on, a write token),
over a file-system and a Redis catalog. Spark creates a namespace and a v2 table, inserts,
deletes with merge-on-read (position delete files), compacts with
``system.rewrite_data_files`` and expires with ``system.expire_snapshots``, all through
icefloe; after each step icefloe's own reader and PyIceberg's ``RestCatalog`` read the same
rows Spark does. One JVM serves the whole session (the ``java_iceberg`` fixture); each
server gets its own Spark catalog name, since Spark keeps a catalog instance per name.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from rest_catalog_server import (
    WRITE,
    Server,
    icefloe_rows,
    rest_catalog,
    server_fixture,  # noqa: F401  (the planner: one per module, file-system and Redis catalogs)
)

from java_iceberg import JavaIceberg

pytestmark = pytest.mark.interop


def spark_catalog(java: JavaIceberg, server: Server) -> str:
    """A Spark catalog name for ``server``: Iceberg's REST client with the write token."""
    name = f"ice{uuid.uuid4().hex[:8]}"
    java.register_catalog(
        name,
        {
            "type": "rest",
            "uri": server.url,
            "token": WRITE,
            "cache-enabled": "false",
        },
    )
    return name


def java_rows(java: JavaIceberg, server: Server, statement: str) -> list[dict[str, Any]]:
    return sorted(java.sql(server.warehouse, statement), key=lambda r: r["id"])


def pyiceberg_rows(server: Server, name: str) -> list[dict[str, Any]]:
    table = rest_catalog(server).load_table(name)
    got = table.scan().to_arrow().select(["id", "cat"]).to_pylist()
    return sorted(got, key=lambda r: r["id"])


def assert_everyone_reads(
    java: JavaIceberg, server: Server, cat: str, name: str, expected: list[dict[str, Any]]
) -> None:
    """Spark (through icefloe), icefloe itself and PyIceberg read exactly ``expected``."""
    assert java_rows(java, server, f"SELECT id, cat FROM {cat}.{name}") == expected
    assert server.run(icefloe_rows(server.catalog, name)) == expected
    assert pyiceberg_rows(server, name) == expected


def test_java_spark_creates_inserts_deletes_compacts_and_expires(
    server: Server, java_iceberg: JavaIceberg
) -> None:
    java = java_iceberg
    cat = spark_catalog(java, server)
    name = "jv.t"
    java.sql(server.warehouse, f"CREATE NAMESPACE {cat}.jv")
    assert ("jv",) in rest_catalog(server).list_namespaces()
    java.sql(
        server.warehouse,
        f"CREATE TABLE {cat}.{name} (id BIGINT NOT NULL, cat STRING) USING iceberg "
        "PARTITIONED BY (cat) TBLPROPERTIES ('format-version'='2', "
        "'write.delete.mode'='merge-on-read', 'write.update.mode'='merge-on-read', "
        "'write.merge.mode'='merge-on-read')",
    )
    loaded = server.run(server.catalog.load_table(name))
    assert loaded.metadata.format_version == 2

    expected: list[dict[str, Any]] = []
    for start in (0, 40, 80):
        values = ", ".join(f"({i}, '{'abc'[i % 3]}')" for i in range(start, start + 40))
        java.sql(server.warehouse, f"INSERT INTO {cat}.{name} VALUES {values}")
        expected += [{"id": i, "cat": "abc"[i % 3]} for i in range(start, start + 40)]
    assert_everyone_reads(java, server, cat, name, expected)

    # Merge-on-read: Spark writes position delete files, no data file is rewritten.
    java.sql(server.warehouse, f"DELETE FROM {cat}.{name} WHERE id % 5 = 0")
    expected = [r for r in expected if r["id"] % 5 != 0]
    metadata = server.run(server.catalog.load_table(name)).metadata
    current = metadata.current_snapshot()
    assert current is not None and current.summary is not None
    assert current.summary["operation"] == "delete"
    assert int(current.summary["added-position-delete-files"]) > 0
    assert "deleted-data-files" not in current.summary
    assert_everyone_reads(java, server, cat, name, expected)

    # Compaction through icefloe: data and deletes rewritten into one file per partition.
    result = java.sql(
        server.warehouse,
        f"CALL {cat}.system.rewrite_data_files(table => '{name}', "
        "options => map('min-input-files', '1', 'delete-file-threshold', '1'))",
    )
    assert result[0]["rewritten_data_files_count"] > 0
    assert result[0]["added_data_files_count"] == 3
    metadata = server.run(server.catalog.load_table(name)).metadata
    current = metadata.current_snapshot()
    assert current is not None and current.summary is not None
    assert current.summary["operation"] == "replace"
    assert_everyone_reads(java, server, cat, name, expected)

    # Expiry through icefloe: everything but the current snapshot goes.
    snapshots_before = len(metadata.snapshots)
    assert snapshots_before > 1
    java.sql(
        server.warehouse,
        f"CALL {cat}.system.expire_snapshots(table => '{name}', "
        "older_than => TIMESTAMP '9999-12-31 00:00:00', retain_last => 1)",
    )
    metadata = server.run(server.catalog.load_table(name)).metadata
    assert [s.snapshot_id for s in metadata.snapshots] == [metadata.current_snapshot_id]
    assert_everyone_reads(java, server, cat, name, expected)
