"""Every error icefloe answers is one the REST OpenAPI spec gives the operation.

The spec documents, per operation and status, the error types a client may meet (the
``examples`` of each response: loadTable's 404 is ``NoSuchTableException`` only, planTableScan's
is ``NoSuchTableException`` or ``NoSuchNamespaceException``, …). Clients act on them: Spark
reads ``SELECT * FROM rest.ns.t.files`` by loading table ``files`` in namespace ``ns.t`` and
falls back to the metadata table only on ``NoSuchTableException``. This test walks the
operations of the served documents (``openapi.json`` and ``write_openapi.json``, the spec
trimmed to what icefloe implements), provokes the documented errors of each, and checks the
status is documented for the operation and the type is one the spec names for that status.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from icefloe.catalog.fs import FileSystemCatalog
from icefloe.io.fileio import LocalFileIO
from icefloe.planner.app import PlannerService
from icefloe.planner.catalog_routes import OPENAPI_FILE
from icefloe.planner.config import PlannerConfig
from icefloe.planner.write_config import RestCatalogSettings
from icefloe.planner.write_routes import OPENAPI_FILE as WRITE_OPENAPI_FILE
from icefloe.spec.schema import Schema

SCHEMA = {
    "type": "struct",
    "schema-id": 0,
    "fields": [{"id": 1, "name": "id", "type": "long", "required": True}],
}
READ, WRITE = "reader-token-0001", "writer-token-0001"
NOPE = "/v1/namespaces/nope"
T = "/v1/namespaces/db/tables/t"
MISSING = "/v1/namespaces/db/tables/missing"

# operationId -> (method, path, body, expected status); bodies as sent, None for none.
Case = tuple[str, str, Any, int]
CASES: dict[str, list[Case]] = {
    "getConfig": [("GET", "/v1/config", None, 200)],
    "listNamespaces": [
        ("GET", "/v1/namespaces?parent=nope", None, 404),
        ("GET", "/v1/namespaces?parent=", None, 200),
    ],
    "loadNamespaceMetadata": [("GET", NOPE, None, 404), ("GET", "/v1/namespaces/a%2Fb", None, 400)],
    "namespaceExists": [("HEAD", NOPE, None, 404)],
    "listTables": [("GET", NOPE + "/tables", None, 404)],
    "loadTable": [
        ("GET", NOPE + "/tables/t", None, 404),
        ("GET", MISSING, None, 404),
        # Spark's metadata table db.t.files: table `files` in namespace `db.t`.
        ("GET", "/v1/namespaces/db%1Ft/tables/files", None, 404),
        ("GET", T + "?snapshots=some", None, 400),
    ],
    "tableExists": [("HEAD", NOPE + "/tables/t", None, 404), ("HEAD", MISSING, None, 404)],
    "planTableScan": [
        ("POST", NOPE + "/tables/t/plan", {}, 404),
        ("POST", MISSING + "/plan", {}, 404),
        ("POST", T + "/plan", {"filter": {"type": "eq", "term": "nope", "value": 1}}, 400),
        ("POST", T + "/plan", {"snapshot-id": "x"}, 400),
    ],
    "fetchPlanningResult": [
        ("GET", T + "/plan/bogus", None, 404),
        ("GET", NOPE + "/tables/t/plan/bogus", None, 404),
    ],
    "cancelPlanning": [("DELETE", T + "/plan/bogus", None, 404)],
    "fetchScanTasks": [
        ("POST", T + "/tasks", {"plan-task": "bogus"}, 404),
        ("POST", T + "/tasks", {}, 400),
    ],
    "createNamespace": [
        ("POST", "/v1/namespaces", {"namespace": ["db"]}, 409),
        ("POST", "/v1/namespaces", {"namespace": []}, 400),
    ],
    "dropNamespace": [("DELETE", NOPE, None, 404), ("DELETE", "/v1/namespaces/db", None, 409)],
    "updateProperties": [
        ("POST", NOPE + "/properties", {"updates": {"a": "1"}}, 404),
        ("POST", "/v1/namespaces/db/properties", {"removals": ["a"], "updates": {"a": "1"}}, 422),
    ],
    "createTable": [
        ("POST", NOPE + "/tables", {"name": "t", "schema": SCHEMA}, 404),
        ("POST", "/v1/namespaces/db/tables", {"name": "t", "schema": SCHEMA}, 409),
        ("POST", "/v1/namespaces/db/tables", {"name": "t"}, 400),
    ],
    "registerTable": [
        ("POST", NOPE + "/register", {"name": "t", "metadata-location": "{t}"}, 404),
        ("POST", "/v1/namespaces/db/register", {"name": "t", "metadata-location": "{t}"}, 409),
    ],
    "updateTable": [
        ("POST", NOPE + "/tables/t", {"requirements": [], "updates": []}, 404),
        ("POST", MISSING, {"requirements": [], "updates": []}, 404),
        (
            "POST",
            T,
            {
                "requirements": [{"type": "assert-current-schema-id", "current-schema-id": 5}],
                "updates": [],
            },
            409,
        ),
        ("POST", T, {"requirements": "x"}, 400),
    ],
    "dropTable": [("DELETE", NOPE + "/tables/t", None, 404), ("DELETE", MISSING, None, 404)],
    "renameTable": [
        (
            "POST",
            "/v1/tables/rename",
            {
                "source": {"namespace": ["db"], "name": "t"},
                "destination": {"namespace": ["db"], "name": "u"},
            },
            406,  # a file-system catalog finds tables by their path
        ),
    ],
    "commitTransaction": [
        (
            "POST",
            "/v1/transactions/commit",
            {
                "table-changes": [
                    {
                        "identifier": {"namespace": ["db"], "name": "missing"},
                        "requirements": [],
                        "updates": [],
                    }
                ]
            },
            404,
        ),
        ("POST", "/v1/transactions/commit", {"table-changes": []}, 400),
    ],
}


def _documents() -> list[dict[str, Any]]:
    return [
        json.loads(Path(f).read_text(encoding="utf-8")) for f in (OPENAPI_FILE, WRITE_OPENAPI_FILE)
    ]


def _error_types(document: dict[str, Any], response: dict[str, Any]) -> set[str]:
    """The error types a documented response names: in its examples, or in its description
    (``Conflict - CommitFailedException, one or more requirements failed``)."""
    components = document["components"]
    if "$ref" in response:
        response = components["responses"][response["$ref"].rsplit("/", 1)[-1]]
    types = set(re.findall(r"\b[A-Z][A-Za-z]*Exception\b", response.get("description", "")))
    for content in response.get("content", {}).values():
        examples = list(content.get("examples", {}).values())
        if "example" in content:
            example = content["example"]
            examples.append(example if "$ref" in example else {"value": example})
        for example in examples:
            if "$ref" in example:
                example = components["examples"][example["$ref"].rsplit("/", 1)[-1]]
            error = example.get("value", {}).get("error", {})
            if error.get("type"):
                types.add(error["type"])
    return types


def _operations() -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """operationId -> (its document, its responses)."""
    found: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    for document in _documents():
        for methods in document["paths"].values():
            for operation in methods.values():
                if isinstance(operation, dict) and "operationId" in operation:
                    found[operation["operationId"]] = (document, operation["responses"])
    return found


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[tuple[TestClient[Any, Any], str]]:
    catalog = FileSystemCatalog("rest", str(tmp_path), LocalFileIO())
    await catalog.create_namespace("db")
    table = await catalog.create_table("db.t", Schema.from_json(SCHEMA))
    config = PlannerConfig(catalog=f"file://{tmp_path}", host="127.0.0.1", port=0)
    service = PlannerService(config, catalog, rest=RestCatalogSettings())
    test_client: TestClient[Any, Any] = TestClient(TestServer(service.app()))
    await test_client.start_server()
    yield test_client, table.metadata_location
    await test_client.close()
    await catalog.close()


def test_every_implemented_operation_is_walked() -> None:
    assert set(CASES) == set(_operations())


async def test_every_error_is_documented_for_its_operation(
    client: tuple[TestClient[Any, Any], str],
) -> None:
    test_client, metadata_location = client
    operations = _operations()
    for operation_id, cases in CASES.items():
        document, responses = operations[operation_id]
        for method, path, body, status in cases:
            if isinstance(body, dict) and body.get("metadata-location") == "{t}":
                body = {**body, "metadata-location": metadata_location}
            response = await test_client.request(method, path, json=body)
            text = await response.text()
            where = f"{operation_id}: {method} {path} -> {response.status} {text[:300]}"
            assert response.status == status, where
            if status < 400:
                continue
            assert str(status) in responses, f"{where}: {status} is not documented"
            documented = _error_types(document, responses[str(status)])
            if method == "HEAD":
                assert not text, where  # HEAD answers carry no body
                continue
            error = json.loads(text)["error"]
            assert error["code"] == status, where
            assert error["type"] in documented, f"{where}: not one of {sorted(documented)}"


async def test_auth_errors_are_documented_for_every_operation(tmp_path: Path) -> None:
    """401 for a missing or unknown token on every operation; 403 for a read token on a write."""
    catalog = FileSystemCatalog("rest", str(tmp_path), LocalFileIO())
    config = PlannerConfig(catalog=f"file://{tmp_path}", host="127.0.0.1", port=0)
    rest = RestCatalogSettings(read_tokens=READ, write_tokens=WRITE)
    service = PlannerService(config, catalog, rest=rest)
    test_client: TestClient[Any, Any] = TestClient(TestServer(service.app()))
    await test_client.start_server()
    write_operations = {
        o
        for o, (document, _) in _operations().items()
        if document["info"]["title"].find("writes") >= 0
    }
    try:
        for operation_id, (document, responses) in _operations().items():
            method, path, body, _ = CASES[operation_id][0]
            if path == "/v1/config":
                continue  # served to anyone holding a token; checked with the others below
            response = await test_client.request(method, path, json=body)
            assert response.status == 401 and "401" in responses, operation_id
            if method != "HEAD":
                error = (await response.json())["error"]
                assert error["type"] in _error_types(document, responses["401"])
            if operation_id in write_operations:
                headers = {"Authorization": f"Bearer {READ}"}
                response = await test_client.request(method, path, json=body, headers=headers)
                assert response.status == 403 and "403" in responses, operation_id
                # The spec's example names NotAuthorizedException; clients map 403 by its code
                # (Java: ForbiddenException; PyIceberg: ForbiddenError), as the type says.
                assert (await response.json())["error"]["type"] == "ForbiddenException"
        assert write_operations >= {"createTable", "updateTable", "commitTransaction"}
    finally:
        await test_client.close()
        await catalog.close()
