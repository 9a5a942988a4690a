"""The REST catalog's write routes over HTTP, on a file-system and a Redis catalog.

The planner runs behind aiohttp's test server (a real socket) over real catalogs: tables on
local disk, pointers in files or in the session's redis-server. Requests are the JSON the
REST spec defines, written out here, so each test shows the exact wire form it checks.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import logging
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples
from icefloe.catalog.fs import FileSystemCatalog
from icefloe.catalog.uri import load_catalog
from icefloe.errors import CommitStateUnknownError, FileIOError, ValidationError
from icefloe.io.fileio import LocalFileIO
from icefloe.planner.app import PlannerService
from icefloe.planner.config import PlannerConfig
from icefloe.planner.openapi import served_openapi
from icefloe.planner.write_config import RestCatalogSettings, parse_tokens
from icefloe.planner.write_routes import OPENAPI_FILE, WRITE_ENDPOINTS
from icefloe.spec.datafile import DataFile
from icefloe.spec.metadata import TableMetadata
from icefloe.spec.schema import Schema
from icefloe.table.catalog import Catalog, Table
from icefloe.table.snapshot_producer import fast_append

READ = "reader-token-0001"
WRITE = "writer-token-0001"
SCHEMA = {
    "type": "struct",
    "schema-id": 0,
    "fields": [
        {"id": 1, "name": "id", "type": "long", "required": True},
        {"id": 2, "name": "name", "type": "string", "required": False},
    ],
}

Client = TestClient[Any, Any]


def open_catalog(kind: str, warehouse: Path, server: str | None, tag: str | None = None) -> Catalog:
    """A catalog of ``kind``; catalogs opened with one ``tag`` share their store (replicas)."""
    tag = tag or uuid.uuid4().hex[:10]
    if kind == "fs":
        return FileSystemCatalog("rest", str(warehouse), LocalFileIO())
    assert server is not None
    if kind == "dynamodb":
        return load_catalog(
            f"dynamodb://icefloe_{tag}?endpoint={server}&region=us-east-1"
            f"&warehouse={warehouse}&dynamodb.access-key-id=test&dynamodb.secret-access-key=test"
        )
    return load_catalog(f"{server}?warehouse={warehouse}&prefix=t{tag}")


@pytest.fixture(
    params=[
        "fs",
        pytest.param("redis", marks=pytest.mark.integration),
        pytest.param("dynamodb", marks=pytest.mark.integration),
    ]
)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store_url(kind: str, request: pytest.FixtureRequest) -> str | None:
    """The redis URL or the DynamoDB endpoint the catalog's pointers live in: moto's, since
    rename and multi-table commits need TransactWriteItems, which dynalite lacks."""
    if kind == "redis":
        return str(request.getfixturevalue("redis_server"))
    if kind == "dynamodb":
        return str(request.getfixturevalue("moto_server"))
    return None


@pytest.fixture
async def make_client(
    kind: str, store_url: str | None, tmp_path: Path
) -> AsyncIterator[Callable[..., Any]]:
    clients: list[Client] = []
    catalogs: list[Catalog] = []

    async def make(**settings: Any) -> tuple[Client, PlannerService]:
        catalog = open_catalog(kind, tmp_path / "wh", store_url)
        catalogs.append(catalog)
        config = PlannerConfig(catalog=f"file://{tmp_path}", host="127.0.0.1", port=0)
        service = PlannerService(config, catalog, rest=RestCatalogSettings(**settings))
        client: Client = TestClient(TestServer(service.app()))
        await client.start_server()
        clients.append(client)
        return client, service

    yield make
    for client in clients:
        await client.close()
    for catalog in catalogs:
        await catalog.close()


async def error_of(response: Any, code: int, error_type: str) -> str:
    assert response.status == code, await response.text()
    body = await response.json()
    assert body["error"]["code"] == code
    assert body["error"]["type"] == error_type, body
    return str(body["error"]["message"])


async def create_table(client: Client, ns: str = "db", name: str = "t", **extra: Any) -> Any:
    response = await client.post(
        f"/v1/namespaces/{ns}/tables", json={"name": name, "schema": SCHEMA, **extra}
    )
    assert response.status == 200, await response.text()
    return await response.json()


def set_props(**props: str) -> dict[str, Any]:
    return {"action": "set-properties", "updates": props}


# ---------------------------------------------------------------------------------------------
# Namespaces
# ---------------------------------------------------------------------------------------------


async def test_namespaces_create_update_and_drop(make_client: Any) -> None:
    client, _ = await make_client()
    response = await client.post(
        "/v1/namespaces", json={"namespace": ["db"], "properties": {"owner": "ann", "tier": "1"}}
    )
    assert response.status == 200
    assert await response.json() == {
        "namespace": ["db"],
        "properties": {"owner": "ann", "tier": "1"},
    }
    response = await client.post("/v1/namespaces", json={"namespace": ["db"]})
    await error_of(response, 409, "AlreadyExistsException")

    response = await client.post(
        "/v1/namespaces/db/properties",
        json={"updates": {"owner": "bob", "new": "x"}, "removals": ["tier", "absent"]},
    )
    assert response.status == 200
    assert await response.json() == {
        "updated": ["new", "owner"],
        "removed": ["tier"],
        "missing": ["absent"],
    }
    loaded = await (await client.get("/v1/namespaces/db")).json()
    assert loaded["properties"] == {"owner": "bob", "new": "x"}
    response = await client.post(
        "/v1/namespaces/db/properties", json={"updates": {"k": "v"}, "removals": ["k"]}
    )
    await error_of(response, 422, "UnprocessableEntityException")
    response = await client.post("/v1/namespaces/nope/properties", json={"updates": {"k": "v"}})
    await error_of(response, 404, "NoSuchNamespaceException")

    await create_table(client)
    response = await client.delete("/v1/namespaces/db")
    await error_of(response, 409, "NamespaceNotEmptyException")
    assert (await client.delete("/v1/namespaces/db/tables/t")).status == 204
    assert (await client.delete("/v1/namespaces/db")).status == 204
    assert (await client.get("/v1/namespaces")).status == 200
    assert (await (await client.get("/v1/namespaces")).json())["namespaces"] == []
    await error_of(await client.delete("/v1/namespaces/db"), 404, "NoSuchNamespaceException")


async def test_nested_namespaces_and_bad_names(make_client: Any) -> None:
    client, _ = await make_client()
    assert (await client.post("/v1/namespaces", json={"namespace": ["a"]})).status == 200
    assert (await client.post("/v1/namespaces", json={"namespace": ["a", "b"]})).status == 200
    listed = await (await client.get("/v1/namespaces", params={"parent": "a"})).json()
    assert listed["namespaces"] == [["a", "b"]]
    await error_of(await client.delete("/v1/namespaces/a"), 409, "NamespaceNotEmptyException")
    for bad in ([], ["a.b"], ["../x"], [""], ["x\x00"], ["ok", "a/b"]):
        response = await client.post("/v1/namespaces", json={"namespace": bad})
        await error_of(response, 400, "BadRequestException")
    for body in (b"", b"[]", b"{", b'{"namespace": "a"}', b'{"namespace": ["z"], "properties": 1}'):
        response = await client.post("/v1/namespaces", data=body)
        await error_of(response, 400, "BadRequestException")


# ---------------------------------------------------------------------------------------------
# Tables
# ---------------------------------------------------------------------------------------------


async def test_create_load_drop_and_purge(make_client: Any) -> None:
    client, _ = await make_client()
    await client.post("/v1/namespaces", json={"namespace": ["db"]})
    created = await create_table(
        client,
        partition_spec=None,
        properties={"k": "v"},
        **{
            "partition-spec": {
                "fields": [{"source-id": 1, "transform": "bucket[4]", "name": "id_b"}]
            },
            "write-order": {
                "order-id": 1,
                "fields": [
                    {
                        "source-id": 2,
                        "transform": "identity",
                        "direction": "asc",
                        "null-order": "nulls-first",
                    }
                ],
            },
        },
    )
    location = created["metadata-location"]
    metadata = created["metadata"]
    assert metadata["properties"] == {"k": "v"}
    assert metadata["partition-specs"][0]["fields"][0]["field-id"] == 1000
    assert metadata["sort-orders"][-1]["fields"][0]["source-id"] == 2
    loaded = await (await client.get("/v1/namespaces/db/tables/t")).json()
    assert loaded["metadata-location"] == location
    response = await client.post("/v1/namespaces/db/tables", json={"name": "t", "schema": SCHEMA})
    await error_of(response, 409, "AlreadyExistsException")
    response = await client.post("/v1/namespaces/nope/tables", json={"name": "t", "schema": SCHEMA})
    await error_of(response, 404, "NoSuchNamespaceException")
    bad_schema = {"name": "u", "schema": {"type": "struct", "fields": [{"id": 1}]}}
    response = await client.post("/v1/namespaces/db/tables", json=bad_schema)
    await error_of(response, 400, "BadRequestException")

    table_dir = Path(metadata["location"])
    assert table_dir.exists()
    assert (await client.delete("/v1/namespaces/db/tables/t")).status == 204
    await error_of(await client.get("/v1/namespaces/db/tables/t"), 404, "NoSuchTableException")
    await error_of(await client.delete("/v1/namespaces/db/tables/t"), 404, "NoSuchTableException")
    await create_table(client, name="p")
    purged = Path(
        (await (await client.get("/v1/namespaces/db/tables/p")).json())["metadata"]["location"]
    )
    response = await client.delete("/v1/namespaces/db/tables/p", params={"purgeRequested": "true"})
    assert response.status == 204
    assert not any(purged.rglob("*.json"))
    response = await client.delete("/v1/namespaces/db/tables/p", params={"purgeRequested": "maybe"})
    await error_of(response, 400, "BadRequestException")


async def test_staged_create_commits_with_assert_create(make_client: Any) -> None:
    client, _ = await make_client()
    await client.post("/v1/namespaces", json={"namespace": ["db"]})
    staged = await create_table(client, name="s", **{"stage-create": True})
    assert "metadata-location" not in staged
    await error_of(await client.get("/v1/namespaces/db/tables/s"), 404, "NoSuchTableException")
    meta = staged["metadata"]
    schema = meta["schemas"][0]
    updates = [
        {"action": "assign-uuid", "uuid": meta["table-uuid"]},
        {"action": "upgrade-format-version", "format-version": 2},
        {"action": "add-schema", "schema": schema},
        {"action": "set-current-schema", "schema-id": -1},
        {"action": "add-spec", "spec": {"spec-id": 0, "fields": []}},
        {"action": "set-default-spec", "spec-id": -1},
        {"action": "add-sort-order", "sort-order": {"order-id": 0, "fields": []}},
        {"action": "set-default-sort-order", "sort-order-id": -1},
        {"action": "set-location", "location": meta["location"]},
        set_props(created="staged"),
    ]
    body = {"requirements": [{"type": "assert-create"}], "updates": updates}
    response = await client.post("/v1/namespaces/db/tables/s", json=body)
    assert response.status == 200, await response.text()
    committed = await response.json()
    assert committed["metadata"]["table-uuid"] == meta["table-uuid"]
    assert committed["metadata"]["properties"] == {"created": "staged"}
    loaded = await (await client.get("/v1/namespaces/db/tables/s")).json()
    assert loaded["metadata-location"] == committed["metadata-location"]
    # A second create transaction finds the table there: its assert-create fails, nothing changes.
    response = await client.post("/v1/namespaces/db/tables/s", json=body)
    await error_of(response, 409, "CommitFailedException")
    again = await (await client.get("/v1/namespaces/db/tables/s")).json()
    assert again["metadata-location"] == committed["metadata-location"]


async def test_register_and_rename(make_client: Any, kind: str) -> None:
    client, service = await make_client()
    await client.post("/v1/namespaces", json={"namespace": ["db"]})
    await client.post("/v1/namespaces", json={"namespace": ["other"]})
    created = await create_table(client)
    commit = {"requirements": [], "updates": [set_props(a="1")]}
    committed = await (await client.post("/v1/namespaces/db/tables/t", json=commit)).json()
    response = await client.post(
        "/v1/tables/rename",
        json={
            "source": {"namespace": ["db"], "name": "t"},
            "destination": {"namespace": ["other"], "name": "t2"},
        },
    )
    if not service.catalog.supports_rename:  # file-system tables are found by their path
        await error_of(response, 406, "UnsupportedOperationException")
        config = await (await client.get("/v1/config")).json()
        assert "POST /v1/{prefix}/tables/rename" not in config["endpoints"]
        if kind != "fs":
            return
        # Registering the same metadata elsewhere is refused: a file-system table lives at
        # its path, and that file's location is another table's.
        response = await client.post(
            "/v1/namespaces/other/register",
            json={"name": "t2", "metadata-location": committed["metadata-location"]},
        )
        await error_of(response, 400, "BadRequestException")
        return
    assert response.status == 204, await response.text()
    await error_of(await client.get("/v1/namespaces/db/tables/t"), 404, "NoSuchTableException")
    moved = await (await client.get("/v1/namespaces/other/tables/t2")).json()
    assert moved["metadata-location"] == committed["metadata-location"]
    for source, destination, code, kind_ in (
        (["db", "t"], ["other", "x"], 404, "NoSuchTableException"),
        (["other", "t2"], ["nope", "x"], 404, "NoSuchNamespaceException"),
        (["other", "t2"], ["other", "t2"], 409, "AlreadyExistsException"),
    ):
        response = await client.post(
            "/v1/tables/rename",
            json={
                "source": {"namespace": source[:1], "name": source[1]},
                "destination": {"namespace": destination[:1], "name": destination[1]},
            },
        )
        await error_of(response, code, kind_)
    # The first version's metadata file names the renamed table's location: registering it
    # beside that table would make an alias (a purge of one deletes the other's files).
    old = {"name": "old", "metadata-location": created["metadata-location"]}
    response = await client.post("/v1/namespaces/db/register", json=old)
    await error_of(response, 403, "ForbiddenException")
    # Once the renamed table is dropped (files kept), the file registers as a table again.
    assert (await client.delete("/v1/namespaces/other/tables/t2")).status == 204
    response = await client.post("/v1/namespaces/db/register", json=old)
    assert response.status == 200, await response.text()
    registered = await response.json()
    assert registered["metadata"]["properties"] == {}
    response = await client.post(
        "/v1/namespaces/db/register",
        json={"name": "old", "metadata-location": created["metadata-location"]},
    )
    await error_of(response, 409, "AlreadyExistsException")
    response = await client.post(
        "/v1/namespaces/db/register",
        json={"name": "x", "metadata-location": "/etc/passwd"},
    )
    await error_of(response, 403, "ForbiddenException")
    inside = created["metadata"]["location"] + "/metadata/missing.metadata.json"
    response = await client.post(
        "/v1/namespaces/db/register", json={"name": "x", "metadata-location": inside}
    )
    await error_of(response, 400, "BadRequestException")
    config = await (await client.get("/v1/config")).json()
    assert "POST /v1/{prefix}/tables/rename" in config["endpoints"]


# ---------------------------------------------------------------------------------------------
# Commits
# ---------------------------------------------------------------------------------------------


async def test_requirements_guard_commits_and_nothing_is_half_applied(make_client: Any) -> None:
    client, _ = await make_client()
    await client.post("/v1/namespaces", json={"namespace": ["db"]})
    created = await create_table(client)
    uuid_ = created["metadata"]["table-uuid"]
    good = {
        "requirements": [
            {"type": "assert-table-uuid", "uuid": uuid_},
            {"type": "assert-current-schema-id", "current-schema-id": 0},
            {"type": "assert-ref-snapshot-id", "ref": "main", "snapshot-id": None},
        ],
        "updates": [set_props(x="1")],
    }
    response = await client.post("/v1/namespaces/db/tables/t", json=good)
    assert response.status == 200
    first = await response.json()
    assert first["metadata"]["properties"] == {"x": "1"}
    # The planner serves the commit at once.
    loaded = await (await client.get("/v1/namespaces/db/tables/t")).json()
    assert loaded["metadata-location"] == first["metadata-location"]

    stale = {
        "requirements": [{"type": "assert-current-schema-id", "current-schema-id": 7}],
        "updates": [set_props(y="2")],
    }
    message = await error_of(
        await client.post("/v1/namespaces/db/tables/t", json=stale), 409, "CommitFailedException"
    )
    assert "assert-current-schema-id" in message
    # A valid first update and an invalid second one: refused whole, nothing applied.
    half = {
        "requirements": [],
        "updates": [set_props(z="3"), {"action": "set-current-schema", "schema-id": 42}],
    }
    await error_of(
        await client.post("/v1/namespaces/db/tables/t", json=half), 400, "BadRequestException"
    )
    unknown = {"requirements": [], "updates": [{"action": "make-it-fast"}]}
    await error_of(
        await client.post("/v1/namespaces/db/tables/t", json=unknown), 400, "BadRequestException"
    )
    # A maintenance property maintenance could not read is refused where it is set
    for key, value in (
        ("icefloe.maintenance.enabled", "maybe"),
        ("icefloe.maintenance.max-snapshots", "0"),
        ("icefloe.dedup.window-ms", "a week"),
        ("icefloe.compaction.min-input-files", "many"),
    ):
        bad_policy = {"requirements": [], "updates": [set_props(**{key: value})]}
        message = await error_of(
            await client.post("/v1/namespaces/db/tables/t", json=bad_policy),
            400,
            "BadRequestException",
        )
        assert key in message, message
    bad_req = {"requirements": [{"type": "assert-luck"}], "updates": []}
    await error_of(
        await client.post("/v1/namespaces/db/tables/t", json=bad_req), 400, "BadRequestException"
    )
    now = await (await client.get("/v1/namespaces/db/tables/t")).json()
    assert now["metadata-location"] == first["metadata-location"]
    assert now["metadata"]["properties"] == {"x": "1"}
    missing = {"requirements": [], "updates": [set_props(a="b")]}
    await error_of(
        await client.post("/v1/namespaces/db/tables/nope", json=missing),
        404,
        "NoSuchTableException",
    )
    other = {"identifier": {"namespace": ["db"], "name": "u"}, **missing}
    await error_of(
        await client.post("/v1/namespaces/db/tables/t", json=other), 400, "BadRequestException"
    )
    # An empty commit changes nothing and writes no metadata file.
    noop = await client.post("/v1/namespaces/db/tables/t", json={"requirements": [], "updates": []})
    assert (await noop.json())["metadata-location"] == first["metadata-location"]


async def test_concurrent_compare_and_set_commits_are_linear(make_client: Any) -> None:
    """Many clients add a schema each, asserting the current schema they read: every success
    is in the history exactly once, in a line, and every failure is a 409 that left nothing."""
    client, _ = await make_client()
    await client.post("/v1/namespaces", json={"namespace": ["db"]})
    await create_table(client)
    writers = 12
    outcomes: list[tuple[int, int, str]] = []

    async def writer(w: int) -> None:
        for attempt in range(3):
            table = await (await client.get("/v1/namespaces/db/tables/t")).json()
            current = table["metadata"]["current-schema-id"]
            last_column = table["metadata"]["last-column-id"]
            fields = [
                *next(s for s in table["metadata"]["schemas"] if s["schema-id"] == current)[
                    "fields"
                ],
                {
                    "id": last_column + 1,
                    "name": f"w{w}_{attempt}",
                    "type": "int",
                    "required": False,
                },
            ]
            body = {
                "requirements": [
                    {"type": "assert-current-schema-id", "current-schema-id": current},
                    {
                        "type": "assert-last-assigned-field-id",
                        "last-assigned-field-id": last_column,
                    },
                ],
                "updates": [
                    {"action": "add-schema", "schema": {"type": "struct", "fields": fields}},
                    {"action": "set-current-schema", "schema-id": -1},
                    set_props(**{f"w{w}_{attempt}": "done"}),
                ],
            }
            response = await client.post("/v1/namespaces/db/tables/t", json=body)
            text = await response.text()
            outcomes.append((w, response.status, text))
            assert response.status in (200, 409), text

    await asyncio.gather(*(writer(w) for w in range(writers)))
    final = (await (await client.get("/v1/namespaces/db/tables/t")).json())["metadata"]
    successes = [o for o in outcomes if o[1] == 200]
    failures = [o for o in outcomes if o[1] == 409]
    assert successes and len(successes) + len(failures) == 3 * writers
    assert all(json.loads(t)["error"]["type"] == "CommitFailedException" for _, _, t in failures)
    added = [k for k in final["properties"] if k.startswith("w")]
    assert len(added) == len(successes)
    schemas = final["schemas"]
    # One schema per success, each extending the one before by exactly one column.
    assert [s["schema-id"] for s in schemas] == list(range(len(successes) + 1))
    for before, after in itertools.pairwise(schemas):
        assert [f["name"] for f in after["fields"]][:-1] == [f["name"] for f in before["fields"]]
    assert {s["fields"][-1]["name"] for s in schemas[1:]} == set(added)
    assert final["current-schema-id"] == len(successes)
    assert len(final["metadata-log"]) == len(successes)


async def test_transactions(make_client: Any) -> None:
    client, service = await make_client()
    await client.post("/v1/namespaces", json={"namespace": ["db"]})
    a = await create_table(client, name="a")
    b = await create_table(client, name="b")

    def change(name: str, **props: str) -> dict[str, Any]:
        return {
            "identifier": {"namespace": ["db"], "name": name},
            "requirements": [],
            "updates": [set_props(**props)],
        }

    single = await client.post(
        "/v1/transactions/commit", json={"table-changes": [change("a", one="1")]}
    )
    assert single.status == 204, await single.text()
    both = {"table-changes": [change("a", two="2"), change("b", two="2")]}
    response = await client.post("/v1/transactions/commit", json=both)
    after_a = await (await client.get("/v1/namespaces/db/tables/a")).json()
    after_b = await (await client.get("/v1/namespaces/db/tables/b")).json()
    if not service.catalog.supports_multi_table_commits:
        await error_of(response, 406, "UnsupportedOperationException")
        assert after_a["metadata"]["properties"] == {"one": "1"}
        assert after_b["metadata-location"] == b["metadata-location"]
        return
    assert response.status == 204, await response.text()
    assert after_a["metadata"]["properties"] == {"one": "1", "two": "2"}
    assert after_b["metadata"]["properties"] == {"two": "2"}
    # One failing requirement fails the whole transaction: neither table moves.
    failing = {
        "table-changes": [
            change("a", three="3"),
            {
                **change("b", three="3"),
                "requirements": [{"type": "assert-table-uuid", "uuid": str(uuid.uuid4())}],
            },
        ]
    }
    response = await client.post("/v1/transactions/commit", json=failing)
    await error_of(response, 409, "CommitFailedException")
    again_a = await (await client.get("/v1/namespaces/db/tables/a")).json()
    assert again_a["metadata-location"] == after_a["metadata-location"]
    assert a["metadata-location"] != after_a["metadata-location"]
    duplicate = {"table-changes": [change("a", x="1"), change("a", y="1")]}
    await error_of(
        await client.post("/v1/transactions/commit", json=duplicate), 400, "BadRequestException"
    )
    no_ident = {"table-changes": [{"requirements": [], "updates": []}]}
    await error_of(
        await client.post("/v1/transactions/commit", json=no_ident), 400, "BadRequestException"
    )


# ---------------------------------------------------------------------------------------------
# Authorization and audit
# ---------------------------------------------------------------------------------------------


async def test_read_tokens_cannot_write_and_every_write_is_audited(
    make_client: Any, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    secrets_file = tmp_path / "writers"
    secrets_file.write_text(f"# writers\nann={WRITE}\n")
    client, _ = await make_client(read_tokens=f"rita={READ}", write_tokens_file=secrets_file)
    reader = {"Authorization": f"Bearer {READ}"}
    writer = {"Authorization": f"Bearer {WRITE}"}
    await error_of(await client.get("/v1/namespaces"), 401, "NotAuthorizedException")
    response = await client.get("/v1/namespaces", headers={"Authorization": "Bearer wrong-token"})
    await error_of(response, 401, "NotAuthorizedException")
    assert (await client.get("/v1/namespaces", headers=reader)).status == 200
    assert (await client.get("/v1/config", headers=reader)).status == 200
    response = await client.post("/v1/namespaces", json={"namespace": ["db"]}, headers=reader)
    await error_of(response, 403, "ForbiddenException")
    caplog.set_level(logging.INFO, logger="icefloe.audit")
    response = await client.post("/v1/namespaces", json={"namespace": ["db"]}, headers=writer)
    assert response.status == 200
    response = await client.post(
        "/v1/namespaces/db/tables", json={"name": "t", "schema": SCHEMA}, headers=writer
    )
    assert response.status == 200
    commit = {"requirements": [], "updates": [set_props(a="1")]}
    response = await client.post("/v1/namespaces/db/tables/t", json=commit, headers=reader)
    await error_of(response, 403, "ForbiddenException")
    response = await client.post("/v1/namespaces/db/tables/t", json=commit, headers=writer)
    committed = await response.json()
    stale = {
        "requirements": [{"type": "assert-current-schema-id", "current-schema-id": 9}],
        "updates": [],
    }
    response = await client.post("/v1/namespaces/db/tables/t", json=stale, headers=writer)
    assert response.status == 409
    # Scan planning is a read: a read token may plan.
    response = await client.post("/v1/namespaces/db/tables/t/plan", json={}, headers=reader)
    assert response.status == 200

    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "icefloe.audit"]
    assert [(x["principal"], x["operation"], x["status"]) for x in lines] == [
        ("ann", "createNamespace", 200),
        ("ann", "createTable", 200),
        ("rita", "updateTable", 403),
        ("ann", "updateTable", 200),
        ("ann", "updateTable", 409),
    ]
    assert lines[3]["table"] == "db.t"
    assert lines[3]["metadata-location"] == committed["metadata-location"]
    assert lines[3]["updates"] == ["set-properties"]
    assert "assert-current-schema-id" in lines[4]["error"]


async def test_oauth_client_credentials(make_client: Any) -> None:
    client, _ = await make_client(write_tokens=f"ann={WRITE}")
    form = {"grant_type": "client_credentials", "client_id": "ann", "client_secret": WRITE}
    response = await client.post("/v1/oauth/tokens", data=form)
    assert response.status == 200
    issued = await response.json()
    assert issued["token_type"] == "bearer" and issued["access_token"] != WRITE
    headers = {"Authorization": f"Bearer {issued['access_token']}"}
    response = await client.post("/v1/namespaces", json={"namespace": ["db"]}, headers=headers)
    assert response.status == 200
    for bad in (
        {**form, "client_secret": "nope-nope-nope"},
        {**form, "client_id": "bob"},
    ):
        response = await client.post("/v1/oauth/tokens", data=bad)
        assert response.status == 401
        assert (await response.json())["error"] == "invalid_client"
    # Credentials in a Basic header instead of the form (client_secret_basic), as DuckDB sends.
    basic = base64.b64encode(f"ann:{WRITE}".encode()).decode()
    response = await client.post(
        "/v1/oauth/tokens",
        data={"grant_type": "client_credentials"},
        headers={"Authorization": f"Basic {basic}"},
    )
    assert response.status == 200
    response = await client.post("/v1/oauth/tokens", data={**form, "grant_type": "password"})
    assert (await response.json())["error"] == "unsupported_grant_type"


def test_token_lists_and_settings_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_tokens("a=tok-aaaaaaa, b=tok-bbbbbbbb\n", "writer", "x") == {
        "tok-aaaaaaa": "a",
        "tok-bbbbbbbb": "b",
    }
    assert parse_tokens("just-a-token-1", "reader", "x") == {"just-a-token-1": "reader"}
    with pytest.raises(ValidationError, match="shorter than 8"):
        parse_tokens("a=short", "reader", "ICEFLOE_REST_READ_TOKENS")
    with pytest.raises(ValidationError, match="entry 1"):
        parse_tokens("=token-token", "reader", "x")
    monkeypatch.setenv("ICEFLOE_REST_WRITE_TOKENS", f"ann={WRITE}")
    monkeypatch.setenv("ICEFLOE_REST_READ_TOKENS_FILE", str(tmp_path / "missing"))
    settings = RestCatalogSettings.load()
    with pytest.raises(ValidationError, match="ICEFLOE_REST_READ_TOKENS_FILE"):
        settings.principals()
    monkeypatch.setenv("ICEFLOE_REST_COMMIT_RETRIES", "-1")
    with pytest.raises(ValidationError, match="ICEFLOE_REST_COMMIT_RETRIES"):
        RestCatalogSettings.load()


async def test_config_advertises_the_write_routes_and_they_can_be_disabled(
    make_client: Any,
) -> None:
    client, _ = await make_client()
    endpoints = (await (await client.get("/v1/config")).json())["endpoints"]
    for endpoint in (
        "POST /v1/{prefix}/namespaces",
        "DELETE /v1/{prefix}/namespaces/{namespace}",
        "POST /v1/{prefix}/namespaces/{namespace}/properties",
        "POST /v1/{prefix}/namespaces/{namespace}/tables",
        "POST /v1/{prefix}/namespaces/{namespace}/register",
        "POST /v1/{prefix}/namespaces/{namespace}/tables/{table}",
        "DELETE /v1/{prefix}/namespaces/{namespace}/tables/{table}",
        "POST /v1/{prefix}/transactions/commit",
    ):
        assert endpoint in endpoints
    metrics = await (await client.get("/metrics")).text()
    assert "icefloe_rest_lost_swaps_total 0.0" in metrics
    read_only, _ = await make_client(writes=False)
    endpoints = (await (await read_only.get("/v1/config")).json())["endpoints"]
    assert "POST /v1/{prefix}/namespaces" not in endpoints
    assert not any(
        "transactions" in e or (e.endswith("{table}") and "DELETE" in e) for e in endpoints
    )
    response = await read_only.post("/v1/namespaces", json={"namespace": ["db"]})
    assert response.status in (405, 406)


# ---------------------------------------------------------------------------------------------
# Fuzzing
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def threaded_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The planner on a real port in its own thread, over a file-system catalog holding a
    namespace ``db`` with a table ``t``, so fuzzed requests also reach existing objects."""
    warehouse = tmp_path_factory.mktemp("fuzz")
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    holder: dict[str, Any] = {}

    def run() -> None:
        asyncio.set_event_loop(loop)

        async def start() -> None:
            catalog = FileSystemCatalog("rest", str(warehouse), LocalFileIO())
            await catalog.create_namespace("db")
            await catalog.create_table("db.t", Schema.from_json(SCHEMA))
            config = PlannerConfig(catalog=f"file://{warehouse}", host="127.0.0.1", port=0)
            service = PlannerService(config, catalog, rest=RestCatalogSettings())
            await service.start()
            holder["service"] = service

        loop.run_until_complete(start())
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=run, name="rest-catalog-fuzz", daemon=True)
    thread.start()
    ready.wait()
    service: PlannerService = holder["service"]
    yield service.url
    asyncio.run_coroutine_threadsafe(service.stop(), loop).result()
    loop.call_soon_threadsafe(loop.stop)
    thread.join()
    loop.close()


def test_schemathesis_finds_no_server_errors_in_the_write_routes(threaded_server: str) -> None:
    import requests
    import schemathesis
    from hypothesis import HealthCheck

    document = served_openapi(json.loads(OPENAPI_FILE.read_text(encoding="utf-8")), "")
    schema = schemathesis.openapi.from_dict(document)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) == len(WRITE_ENDPOINTS) + 1
    session = requests.Session()
    failures: list[str] = []
    statuses: list[int] = []
    for operation in operations:

        @settings(
            max_examples=examples(30),
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
        )
        @given(case=operation.as_strategy())
        def exercise(case: Any) -> None:
            response = case.call(base_url=threaded_server, session=session, timeout=60)
            statuses.append(response.status_code)
            if response.status_code >= 500:
                failures.append(
                    f"{case.method} {case.formatted_path}: {response.status_code} "
                    f"{response.text[:300]}"
                )
            elif response.status_code >= 400:
                error = response.json()["error"]
                assert error["code"] == response.status_code and error["type"], error

        exercise()
    assert failures == []
    assert len(statuses) > 5 * len(operations)


@given(
    requirements=st.lists(
        st.fixed_dictionaries(
            {"type": st.sampled_from(["assert-create", "assert-current-schema-id", "x"])},
            optional={
                "current-schema-id": st.integers(-2, 3) | st.text(max_size=3),
                "ref": st.text(max_size=4),
                "snapshot-id": st.none() | st.integers(),
            },
        ),
        max_size=3,
    ),
    updates=st.lists(
        st.fixed_dictionaries(
            {
                "action": st.sampled_from(
                    [
                        "set-properties",
                        "remove-properties",
                        "set-current-schema",
                        "add-schema",
                        "set-location",
                        "remove-snapshots",
                        "set-snapshot-ref",
                        "upgrade-format-version",
                    ]
                )
            },
            optional={
                "updates": st.dictionaries(
                    st.text(max_size=5), st.text(max_size=5) | st.integers()
                ),
                "removals": st.lists(st.text(max_size=5)),
                "schema-id": st.integers(-2, 3),
                "schema": st.just(SCHEMA) | st.just({"type": "struct", "fields": [{"id": 1}]}),
                "location": st.text(max_size=10),
                "snapshot-ids": st.lists(st.integers()),
                "ref-name": st.text(max_size=4),
                "snapshot-id": st.integers(),
                "type": st.sampled_from(["branch", "tag", "x"]),
                "format-version": st.integers(0, 4),
            },
        ),
        max_size=4,
    ),
)
@settings(max_examples=examples(150), deadline=None, database=None)
def test_fuzzed_commits_never_answer_5xx_and_refusals_change_nothing(
    threaded_server: str, requirements: Any, updates: Any
) -> None:
    """Commits built from real action names with random fields: never a 5xx, and a refused
    commit leaves the table where it was."""
    import requests

    url = f"{threaded_server}/v1/namespaces/db/tables/t"
    before = requests.get(url, timeout=60).json()["metadata-location"]
    response = requests.post(
        url, json={"requirements": requirements, "updates": updates}, timeout=60
    )
    # 403: a set-location outside ICEFLOE_REST_ALLOWED_LOCATIONS is refused as forbidden
    assert response.status_code in (200, 400, 403, 404, 409), response.text
    after = requests.get(url, timeout=60).json()["metadata-location"]
    if response.status_code != 200:
        assert after == before
    else:
        assert after == response.json()["metadata-location"]


class FlakyCatalog(FileSystemCatalog):
    """A catalog whose next commit fails the way a store can: unknown outcome or down."""

    failure: Exception | None = None

    async def commit(self, table: Table, new_metadata: TableMetadata) -> Table:
        if self.failure is not None:
            failure, self.failure = self.failure, None
            raise failure
        return await super().commit(table, new_metadata)


async def test_unknown_outcomes_and_storage_failures_get_the_spec_answers(tmp_path: Path) -> None:
    catalog = FlakyCatalog("flaky", str(tmp_path), LocalFileIO())
    config = PlannerConfig(catalog=f"file://{tmp_path}", host="127.0.0.1", port=0)
    service = PlannerService(config, catalog, rest=RestCatalogSettings())
    async with TestClient(TestServer(service.app())) as client:
        await client.post("/v1/namespaces", json={"namespace": ["db"]})
        await create_table(client)
        commit = {"requirements": [], "updates": [set_props(a="1")]}
        catalog.failure = CommitStateUnknownError("the store timed out after the request")
        response = await client.post("/v1/namespaces/db/tables/t", json=commit)
        message = await error_of(response, 500, "CommitStateUnknownException")
        assert "timed out" in message
        catalog.failure = FileIOError("disk unavailable")
        response = await client.post("/v1/namespaces/db/tables/t", json=commit)
        await error_of(response, 503, "ServiceUnavailableException")
        catalog.failure = RuntimeError("a bug")
        response = await client.post("/v1/namespaces/db/tables/t", json=commit)
        message = await error_of(response, 500, "InternalServerError")
        assert "a bug" not in message and "Traceback" not in await response.text()
        # The next attempt goes through, and only once.
        response = await client.post("/v1/namespaces/db/tables/t", json=commit)
        assert response.status == 200
        assert len((await response.json())["metadata"]["metadata-log"]) == 1


async def test_writers_cannot_reach_outside_the_allowed_locations(
    make_client: Any, tmp_path: Path
) -> None:
    client, service = await make_client()
    await client.post("/v1/namespaces", json={"namespace": ["db"]})
    outside = tmp_path / "outside"
    outside.mkdir()
    for body in (
        {"name": "a", "schema": SCHEMA, "location": str(outside / "a")},
        {"name": "a", "schema": SCHEMA, "location": "/wh/../../etc"},
        {"name": "a", "schema": SCHEMA, "properties": {"write.metadata.path": str(outside)}},
    ):
        response = await client.post("/v1/namespaces/db/tables", json=body)
        await error_of(response, 403, "ForbiddenException")
    await create_table(client, name="f")
    for update in (
        {"action": "set-location", "location": str(outside)},
        set_props(**{"write.metadata.path": "file://" + str(outside)}),
    ):
        response = await client.post(
            "/v1/namespaces/db/tables/f", json={"requirements": [], "updates": [update]}
        )
        await error_of(response, 403, "ForbiddenException")
    assert not any(outside.iterdir())

    # A table whose snapshot names a file outside: purging it keeps that file.
    precious = outside / "precious.parquet"
    precious.write_bytes(b"not yours")
    table = await service.catalog.load_table("db.f")
    await fast_append(table, [DataFile(str(precious), "parquet", (), 1, 9)]).commit()
    location = Path(table.location.removeprefix("file://"))
    assert any(location.rglob("*.avro"))
    response = await client.delete("/v1/namespaces/db/tables/f", params={"purgeRequested": "true"})
    assert response.status == 204
    assert precious.read_bytes() == b"not yours"
    assert not any(p.is_file() for p in location.rglob("*"))


async def test_allowed_locations_can_be_widened(make_client: Any, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    client, _ = await make_client(allowed_locations=f"{tmp_path / 'wh'},file://{elsewhere}")
    await client.post("/v1/namespaces", json={"namespace": ["db"]})
    body = {"name": "a", "schema": SCHEMA, "location": str(elsewhere / "a")}
    response = await client.post("/v1/namespaces/db/tables", json=body)
    # Allowed by the policy; a file-system catalog still insists on its own path.
    assert response.status in (200, 400), await response.text()
    if response.status == 400:
        assert "must live at" in (await response.json())["error"]["message"]
