"""DuckDB's Iceberg extension writing through icefloe's REST catalog.

DuckDB 1.5.5 with its ``iceberg`` extension (and the ``avro`` and ``httpfs`` extensions it
needs) loaded from the PyPI wheels' files, autoinstall and autoload off, so nothing is
downloaded. DuckDB ``ATTACH``es to the planner (a bearer token in one test, OAuth2 client
credentials through ``/v1/oauth/tokens`` in the other), then ``CREATE SCHEMA`` (createNamespace),
``CREATE TABLE`` (a staged create committed with ``assert-create``), ``INSERT`` and ``DELETE``
(``transactions/commit``). icefloe and PyIceberg then read the rows DuckDB wrote.
"""

from __future__ import annotations

import glob
import os
import warnings
from typing import Any

import pytest
from rest_catalog_server import (
    READ,
    WRITE,
    Server,
    icefloe_rows,
    rest_catalog,
    server_fixture,  # noqa: F401  (the planner: one per module, file-system and Redis catalogs)
)

pytestmark = pytest.mark.interop

EXTENSIONS = ("httpfs", "avro", "iceberg")


def extension_file(name: str) -> str:
    """The extension binary inside its PyPI wheel (``duckdb-extension-<name>``)."""
    module = __import__(f"duckdb_extension_{name}")
    found = glob.glob(
        os.path.join(
            os.path.dirname(module.__file__), "extensions", "*", f"{name}.duckdb_extension"
        )
    )
    assert len(found) == 1, f"expected one {name} extension in its wheel, found {found}"
    return found[0]


def duckdb_connection() -> Any:
    import duckdb

    con = duckdb.connect(
        config={"autoinstall_known_extensions": "false", "autoload_known_extensions": "false"}
    )
    for name in EXTENSIONS:
        con.execute(f"LOAD '{extension_file(name)}'")
    return con


def attach(con: Any, server: Server, secret: str) -> None:
    con.execute(secret)
    con.execute(
        f"ATTACH 'warehouse' AS ice (TYPE iceberg, ENDPOINT '{server.url}', SECRET ice_secret, "
        "ACCESS_DELEGATION_MODE 'none')"
    )


def check_readers(server: Server, name: str, expected: list[tuple[int, str]]) -> None:
    """icefloe (from the catalog) and PyIceberg (through the planner) read DuckDB's rows."""
    rows = [
        (r["id"], r["name"]) for r in server.run(icefloe_rows(server.catalog, name, ("id", "name")))
    ]
    assert rows == expected
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        table = rest_catalog(server, token=READ).load_table(name)
    arrow = table.scan().to_arrow().sort_by("id")
    assert list(zip(arrow["id"].to_pylist(), arrow["name"].to_pylist(), strict=True)) == expected


def test_duckdb_creates_inserts_and_deletes_with_a_bearer_token(server: Server) -> None:
    con = duckdb_connection()
    attach(con, server, f"CREATE SECRET ice_secret (TYPE iceberg, TOKEN '{WRITE}')")
    con.execute("CREATE SCHEMA ice.duck")
    con.execute("CREATE TABLE ice.duck.t (id BIGINT, name VARCHAR)")
    con.execute("INSERT INTO ice.duck.t VALUES (1, 'a'), (2, 'b'), (3, 'c'), (4, 'd')")
    con.execute("INSERT INTO ice.duck.t SELECT i, 'n' || i FROM range(10, 20) t(i)")
    expected = [(1, "a"), (2, "b"), (3, "c"), (4, "d")] + [(i, f"n{i}") for i in range(10, 20)]
    assert con.execute("SELECT id, name FROM ice.duck.t ORDER BY id").fetchall() == expected
    check_readers(server, "duck.t", expected)

    con.execute("DELETE FROM ice.duck.t WHERE id = 2 OR id >= 15")
    expected = [r for r in expected if r[0] != 2 and r[0] < 15]
    assert con.execute("SELECT id, name FROM ice.duck.t ORDER BY id").fetchall() == expected
    check_readers(server, "duck.t", expected)
    history = server.run(server.catalog.load_table("duck.t")).metadata
    assert len(history.snapshots) == 3
    con.close()


def test_duckdb_authenticates_with_oauth2_client_credentials(server: Server) -> None:
    con = duckdb_connection()
    attach(
        con,
        server,
        "CREATE SECRET ice_secret (TYPE iceberg, CLIENT_ID 'pyiceberg', "
        f"CLIENT_SECRET '{WRITE}', OAUTH2_SERVER_URI '{server.url}/v1/oauth/tokens')",
    )
    con.execute("CREATE SCHEMA ice.oauth")
    con.execute("CREATE TABLE ice.oauth.t (id BIGINT, name VARCHAR)")
    con.execute("INSERT INTO ice.oauth.t VALUES (7, 'seven')")
    check_readers(server, "oauth.t", [(7, "seven")])
    con.close()


def test_a_duckdb_reader_cannot_write(server: Server) -> None:
    import duckdb

    con = duckdb_connection()
    attach(con, server, f"CREATE SECRET ice_secret (TYPE iceberg, TOKEN '{READ}')")
    with pytest.raises(duckdb.Error, match=r"403|Forbidden|read-only"):
        con.execute("CREATE SCHEMA ice.nope")
    con.close()


def test_duckdb_create_table_as_select(server: Server) -> None:
    """DuckDB's CTAS stage-creates the table and writes its first manifest into the table's
    ``metadata/`` folder before the create commit: the stage-create must leave that folder
    where the storage has folders (a ``file://`` warehouse)."""
    con = duckdb_connection()
    attach(con, server, f"CREATE SECRET ice_secret (TYPE iceberg, TOKEN '{WRITE}')")
    con.execute("CREATE SCHEMA ice.ctas")
    con.execute("CREATE TABLE ice.ctas.t AS SELECT i AS id, 'n' || i AS name FROM range(5) t(i)")
    expected = [(i, f"n{i}") for i in range(5)]
    assert con.execute("SELECT id, name FROM ice.ctas.t ORDER BY id").fetchall() == expected
    check_readers(server, "ctas.t", expected)
    con.close()
