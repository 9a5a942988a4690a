"""The REST catalog against hostile clients: locations, foreign files, bodies, names, tokens.

The planner runs behind aiohttp's test server (a real socket) over a file-system catalog;
requests are raw JSON, as an attacker would send them. Each test states the attack and what
must hold afterwards: the answer (never 2xx, never 5xx), and that nothing outside the table
was written, read as metadata or deleted.
"""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import shutil
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from victim_files import append_victim_files
from yarl import URL

from hypothesis_budget import examples
from icefloe.catalog.fs import FileSystemCatalog
from icefloe.catalog.uri import load_catalog
from icefloe.io.fileio import LocalFileIO
from icefloe.io.locations import LOCATION_PROPERTIES
from icefloe.manifests.manifest_list import write_manifest_list
from icefloe.manifests.reader import ManifestReader
from icefloe.planner.app import PlannerService
from icefloe.planner.config import PlannerConfig
from icefloe.planner.write_config import RestCatalogSettings
from icefloe.table.catalog import Catalog, TableIdentifier
from icefloe.table.changes import TableCommit, commit_table_changes

READ = "reader-token-0001"
WRITE = "writer-token-0001"
SCHEMA = {
    "type": "struct",
    "schema-id": 0,
    "fields": [{"id": 1, "name": "id", "type": "long", "required": True}],
}
MAX_BODY = 64 << 10

Client = TestClient[Any, Any]


class Served:
    def __init__(self, client: Client, service: PlannerService, warehouse: Path) -> None:
        self.client, self.service, self.warehouse = client, service, warehouse

    @property
    def catalog(self) -> Catalog:
        return self.service.catalog


@pytest.fixture
async def serve(tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    """``await serve(token=..., **rest_settings)``: a planner over a fresh warehouse."""
    started: list[tuple[Client, Catalog]] = []

    async def make(*, token: str | None = None, scope: str | None = None, **rest: Any) -> Served:
        warehouse = tmp_path / f"wh{len(started)}"
        warehouse.mkdir()
        catalog = FileSystemCatalog("rest", str(warehouse), LocalFileIO())
        config = PlannerConfig(
            catalog=f"file://{warehouse}",
            host="127.0.0.1",
            port=0,
            token=token,
            token_scope=scope,
            max_request_bytes=MAX_BODY,
        )
        service = PlannerService(config, catalog, rest=RestCatalogSettings(**rest))
        client: Client = TestClient(TestServer(service.app()))
        await client.start_server()
        started.append((client, catalog))
        return Served(client, service, warehouse)

    yield make
    for client, catalog in started:
        await client.close()
        await catalog.close()


async def expect(response: Any, code: int, error_type: str | None = None) -> str:
    text = await response.text()
    assert response.status == code, text
    if error_type is None:
        return text
    body = json.loads(text)
    assert body["error"]["type"] == error_type, body
    return str(body["error"]["message"])


async def create_table(client: Client, name: str, ns: str = "db", **extra: Any) -> Any:
    response = await client.post(
        f"/v1/namespaces/{ns}/tables", json={"name": name, "schema": SCHEMA, **extra}
    )
    assert response.status == 200, await response.text()
    return await response.json()


def add_snapshot(snapshot_id: int, manifest_list: str) -> list[Any]:
    """The updates adding a snapshot (no branch moves to it) with ``manifest_list``."""
    snapshot = {
        "snapshot-id": snapshot_id,
        "sequence-number": 1,
        "timestamp-ms": 1_700_000_000_000,
        "manifest-list": manifest_list,
        "summary": {"operation": "append"},
        "schema-id": 0,
    }
    return [{"action": "add-snapshot", "snapshot": snapshot}]


async def victim_with_files(served: Served, name: str = "victim", files: int = 7) -> list[Path]:
    """A table with ``files`` data files (bytes on disk) committed through the core."""
    await create_table(served.client, name)
    table = await served.catalog.load_table(f"db.{name}")
    return await append_victim_files(table, files)


# ---------------------------------------------------------------------------------------------
# A table's files are its own
# ---------------------------------------------------------------------------------------------


async def test_a_commit_cannot_adopt_another_tables_files_and_purge_cannot_delete_them(
    serve: Any,
) -> None:
    """The attack: create t4, commit a snapshot whose manifest list is the victim's, purge t4.
    Every forged commit is refused; a table that already holds such a snapshot (committed
    around the REST catalog) is purged without touching the victim."""
    served = await serve()
    client = served.client
    await client.post("/v1/namespaces", json={"namespace": ["db"]})
    victim_files = await victim_with_files(served)
    victim = await served.catalog.load_table("db.victim")
    victim_list = victim.metadata.current_snapshot().manifest_list  # type: ignore[union-attr]
    assert victim_list is not None
    t4 = await create_table(client, "t4")
    t4_metadata = Path(t4["metadata-location"]).parent

    async def commit(updates: list[Any]) -> Any:
        body = {"requirements": [], "updates": updates}
        return await client.post("/v1/namespaces/db/tables/t4", json=body)

    def set_main(snapshot_id: int) -> dict[str, Any]:
        return {
            "action": "set-snapshot-ref",
            "ref-name": "main",
            "type": "branch",
            "snapshot-id": snapshot_id,
        }

    # 1. The victim's manifest list itself.
    response = await commit([*add_snapshot(1, victim_list), set_main(1)])
    assert "manifest list" in await expect(response, 403, "ForbiddenException")
    # 2. A copy of it under t4's own folder: it lists the victim's manifests.
    copied = t4_metadata / "snap-copied.avro"
    shutil.copyfile(victim_list.removeprefix("file://"), copied)
    response = await commit([*add_snapshot(2, str(copied)), set_main(2)])
    assert "manifest" in await expect(response, 403, "ForbiddenException")
    # 3. A manifest list and manifest of t4's own, whose new entries are the victim's files.
    (manifest,) = await ManifestReader(victim.io).manifests(victim.metadata.current_snapshot())  # type: ignore[arg-type]
    own_manifest = t4_metadata / "own-m0.avro"
    shutil.copyfile(manifest.manifest_path.removeprefix("file://"), own_manifest)
    own_list = t4_metadata / "snap-own.avro"
    buffer = io.BytesIO()
    write_manifest_list(
        buffer,
        [dataclasses.replace(manifest, manifest_path=str(own_manifest), added_snapshot_id=3)],
        format_version=2,
        snapshot_id=3,
        parent_snapshot_id=None,
        sequence_number=1,
    )
    own_list.write_bytes(buffer.getvalue())
    response = await commit([*add_snapshot(3, str(own_list)), set_main(3)])
    assert "file" in await expect(response, 403, "ForbiddenException")
    # 4. A manifest list that does not exist (the next plan would fail): 400, not 200.
    response = await commit([*add_snapshot(4, str(t4_metadata / "missing.avro")), set_main(4)])
    await expect(response, 400, "BadRequestException")
    # 5. Moving into the victim's location, or creating a table there, to purge it later.
    move = {"action": "set-location", "location": victim.location}
    response = await commit([move])
    assert "already holds files" in await expect(response, 403, "ForbiddenException")
    body = {"name": "t5", "schema": SCHEMA, "location": victim.location}
    response = await client.post("/v1/namespaces/db/tables", json=body)
    await expect(response, 403, "ForbiddenException")
    table = await served.catalog.load_table("db.t4")
    assert table.metadata.snapshots == ()

    # A snapshot naming the victim's manifest list committed around the REST catalog (as
    # before these checks): purging t4 deletes t4's files and nothing of the victim's.
    await commit_table_changes(
        served.catalog,
        [
            TableCommit.parse(
                TableIdentifier(("db",), "t4"), [], [*add_snapshot(5, victim_list), set_main(5)]
            )
        ],
    )
    t4_location = Path(table.location.removeprefix("file://"))
    response = await client.delete("/v1/namespaces/db/tables/t4", params={"purgeRequested": "true"})
    await expect(response, 204)
    assert all(p.read_bytes() == b"victim data %d" % i for i, p in enumerate(victim_files))
    assert Path(victim_list.removeprefix("file://")).exists()
    assert not any(p.is_file() for p in t4_location.rglob("*"))
    reloaded = await served.catalog.load_table("db.victim")
    assert reloaded.metadata_location == victim.metadata_location


@pytest.mark.integration
async def test_no_table_is_created_at_another_tables_location(
    redis_server: str, tmp_path: Path
) -> None:
    """On a metastore catalog (Redis) a table may live anywhere allowed, so a writer could
    create a table at another's location and purge it: a custom location must be unused."""
    warehouse = tmp_path / "wh"
    catalog = load_catalog(f"{redis_server}?warehouse={warehouse}&prefix=s{uuid.uuid4().hex[:8]}")
    config = PlannerConfig(catalog=f"file://{warehouse}", host="127.0.0.1", port=0)
    service = PlannerService(config, catalog, rest=RestCatalogSettings())
    client: Client = TestClient(TestServer(service.app()))
    await client.start_server()
    try:
        served = Served(client, service, warehouse)
        await client.post("/v1/namespaces", json={"namespace": ["db"]})
        victim_files = await victim_with_files(served)
        victim = await catalog.load_table("db.victim")
        for location in (victim.location, victim.location + "/data"):
            body = {"name": "t5", "schema": SCHEMA, "location": location}
            response = await client.post("/v1/namespaces/db/tables", json=body)
            assert "already holds files" in await expect(response, 403, "ForbiddenException")
        own = f"{warehouse}/custom/t6"
        await create_table(client, "t6", location=own)
        move = {"action": "set-location", "location": victim.location}
        response = await client.post(
            "/v1/namespaces/db/tables/t6", json={"requirements": [], "updates": [move]}
        )
        await expect(response, 403, "ForbiddenException")
        response = await client.delete(
            "/v1/namespaces/db/tables/t6", params={"purgeRequested": "true"}
        )
        await expect(response, 204)
        assert all(p.read_bytes() == b"victim data %d" % i for i, p in enumerate(victim_files))
    finally:
        await client.close()
        await catalog.close()


async def test_every_location_bearing_property_obeys_the_allowed_locations(
    serve: Any, tmp_path: Path
) -> None:
    served = await serve()
    client = served.client
    await client.post("/v1/namespaces", json={"namespace": ["db"]})
    outside = tmp_path / "outside"
    outside.mkdir()
    hostile = {
        "absolute outside": str(outside / "x"),
        "a URI outside": f"file://{outside}/x",
        "relative, climbing out": "../../../outside/m",
        "another scheme": "hdfs://namenode/x",
        "another bucket": "s3://other-bucket/x",
    }
    for key in LOCATION_PROPERTIES:
        for why, value in hostile.items():
            body = {"name": "p", "schema": SCHEMA, "properties": {key: value}}
            response = await client.post("/v1/namespaces/db/tables", json=body)
            await expect(response, 403, "ForbiddenException"), (key, why)
    await create_table(client, "p")
    for key in LOCATION_PROPERTIES:
        for value in hostile.values():
            update = {"action": "set-properties", "updates": {key: value}}
            body = {"requirements": [], "updates": [update]}
            response = await client.post("/v1/namespaces/db/tables/p", json=body)
            await expect(response, 403, "ForbiddenException")
    # Inside the table's location: allowed, and a data path the table may write to.
    inside = {"action": "set-properties", "updates": {"write.data.path": "custom-data"}}
    response = await client.post(
        "/v1/namespaces/db/tables/p", json={"requirements": [], "updates": [inside]}
    )
    await expect(response, 200)
    assert not any(outside.iterdir())


async def test_symbolic_links_out_of_the_warehouse_are_outside(serve: Any, tmp_path: Path) -> None:
    """On a file-system catalog, a folder planted under the warehouse that links elsewhere."""
    served = await serve()
    client = served.client
    await client.post("/v1/namespaces", json={"namespace": ["db"]})
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (served.warehouse / "db" / "evil").symlink_to(outside, target_is_directory=True)
    response = await client.post(
        "/v1/namespaces/db/tables", json={"name": "evil", "schema": SCHEMA}
    )
    await expect(response, 403, "ForbiddenException")
    link_data = str(served.warehouse / "db" / "evil" / "data")
    body = {"name": "t", "schema": SCHEMA, "properties": {"write.data.path": link_data}}
    response = await client.post("/v1/namespaces/db/tables", json=body)
    await expect(response, 403, "ForbiddenException")
    assert not any(outside.iterdir())


SEGMENT = st.sampled_from(["db", "t", "data", "x%41", "é"])
ESCAPE = st.sampled_from(["..", ".", "%2e%2e", "%2E%2E", "%252e%252e", "a%2f..%2fb"])


@st.composite
def hostile_locations(draw: st.DrawFn, warehouse: str) -> str:
    """A location that reaches outside the warehouse or hides a dot step."""
    kind = draw(st.sampled_from(["escape", "scheme", "sibling"]))
    before = draw(st.lists(SEGMENT, max_size=3))
    after = draw(st.lists(SEGMENT, max_size=3))
    if kind == "escape":
        escapes = draw(st.lists(ESCAPE, min_size=1, max_size=4))
        base = draw(st.sampled_from([warehouse, f"file://{warehouse}", f"file:{warehouse}"]))
        steps = [*before, *escapes, *after]
        return base + "/" + "/".join(steps)
    if kind == "scheme":
        base = draw(st.sampled_from(["s3://other", "hdfs://nn", "gs://b", "file://host"]))
        return base + warehouse + "/" + "/".join([*before, *after])
    return warehouse + "-sibling/" + "/".join([*before, *after])


@pytest.fixture
async def hostile_target(serve: Any) -> Served:
    served = await serve()
    await served.client.post("/v1/namespaces", json={"namespace": ["db"]})
    await create_table(served.client, "base")
    return served


@settings(
    max_examples=examples(60),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
async def test_hostile_locations_are_refused_on_every_write_route(
    hostile_target: Served, data: st.DataObject
) -> None:
    served = hostile_target
    client = served.client
    location = data.draw(hostile_locations(str(served.warehouse)))
    key = data.draw(st.sampled_from(LOCATION_PROPERTIES))
    table = f"h{uuid.uuid4().hex[:8]}"
    attempts = [
        client.post(
            "/v1/namespaces/db/tables", json={"name": table, "schema": SCHEMA, "location": location}
        ),
        client.post(
            "/v1/namespaces/db/tables",
            json={"name": table, "schema": SCHEMA, "stage-create": True, "location": location},
        ),
        client.post(
            "/v1/namespaces/db/tables",
            json={"name": table, "schema": SCHEMA, "properties": {key: location}},
        ),
        client.post(
            "/v1/namespaces/db/register", json={"name": table, "metadata-location": location}
        ),
        client.post(
            "/v1/namespaces/db/tables/base",
            json={
                "requirements": [],
                "updates": [{"action": "set-location", "location": location}],
            },
        ),
        client.post(
            "/v1/transactions/commit",
            json={
                "table-changes": [
                    {
                        "identifier": {"namespace": ["db"], "name": "base"},
                        "requirements": [],
                        "updates": [
                            {"action": "set-properties", "updates": {key: location}},
                        ],
                    }
                ]
            },
        ),
        client.post(
            "/v1/namespaces/db/tables/base",
            json={"requirements": [], "updates": add_snapshot(11, location)},
        ),
    ]
    for attempt in attempts:
        response = await attempt
        await expect(response, 403, "ForbiddenException")
    assert sorted(p.name for p in served.warehouse.parent.iterdir() if p.name != "wh0") == []
    assert not (await served.catalog.table_exists(f"db.{table}"))


# ---------------------------------------------------------------------------------------------
# Bodies, names, messages
# ---------------------------------------------------------------------------------------------

ROUTES = [
    ("POST", "/v1/namespaces"),
    ("POST", "/v1/namespaces/db/properties"),
    ("POST", "/v1/namespaces/db/tables"),
    ("POST", "/v1/namespaces/db/register"),
    ("POST", "/v1/namespaces/db/tables/t"),
    ("DELETE", "/v1/namespaces/db/tables/t"),
    ("POST", "/v1/tables/rename"),
    ("POST", "/v1/transactions/commit"),
    ("POST", "/v1/namespaces/db/tables/t/plan"),
    ("POST", "/v1/namespaces/db/tables/t/tasks"),
    ("GET", "/v1/namespaces/db/tables/t"),
    ("GET", "/v1/config"),
]


async def test_oversized_bodies_are_413_on_every_route_and_writes_audit_them(
    serve: Any, caplog: pytest.LogCaptureFixture
) -> None:
    served = await serve()
    client = served.client
    await client.post("/v1/namespaces", json={"namespace": ["db"]})
    await create_table(client, "t")
    caplog.set_level(logging.INFO, logger="icefloe.audit")
    big = b'{"namespace": ["' + b"a" * (2 * MAX_BODY) + b'"]}'

    async def chunked() -> AsyncIterator[bytes]:
        for _ in range(4):
            yield big[: MAX_BODY // 2 + 1]

    for method, path in ROUTES:
        response = await client.request(method, path, data=big)
        await expect(response, 413, "RequestEntityTooLargeException")
        if method == "POST":
            # No Content-Length: refused while reading, still 413 (routes without a body
            # never read one).
            response = await client.request(method, path, data=chunked())
            await expect(response, 413, "RequestEntityTooLargeException")
    audited = [json.loads(r.getMessage()) for r in caplog.records if r.name == "icefloe.audit"]
    assert {(a["operation"], a["status"]) for a in audited} >= {
        ("createNamespace", 413),
        ("createTable", 413),
        ("updateTable", 413),
        ("commitTransaction", 413),
    }
    assert (await served.catalog.load_table("db.t")).metadata.snapshots == ()


async def test_names_are_limited_in_bytes_and_no_byte_sequence_reaches_a_5xx(serve: Any) -> None:
    served = await serve()
    client = served.client
    await client.post("/v1/namespaces", json={"namespace": ["db"]})
    wide = "é" * 200  # 200 characters, 400 bytes of UTF-8
    await expect(
        await client.post("/v1/namespaces", json={"namespace": [wide]}), 400, "BadRequestException"
    )
    await expect(
        await client.post("/v1/namespaces/db/tables", json={"name": wide, "schema": SCHEMA}),
        400,
        "BadRequestException",
    )
    await expect(await client.get(f"/v1/namespaces/{wide}"), 400, "BadRequestException")
    await expect(await client.get(f"/v1/namespaces/db/tables/{wide}"), 400, "BadRequestException")
    lone = b'{"namespace": ["\\ud800"]}'
    response = await client.post(
        "/v1/namespaces", data=lone, headers={"Content-Type": "application/json"}
    )
    assert response.status == 400, await response.text()
    exact = "é" * 127 + "a"  # 255 bytes: the limit itself is fine
    await expect(await client.post("/v1/namespaces", json={"namespace": [exact]}), 200)


@settings(
    max_examples=examples(80),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(raw=st.binary(min_size=1, max_size=300), data=st.data())
async def test_arbitrary_bytes_in_names_never_answer_5xx(
    hostile_target: Served, raw: bytes, data: st.DataObject
) -> None:
    client = hostile_target.client
    escaped = "".join(f"%{b:02X}" for b in raw)
    method, template = data.draw(
        st.sampled_from(
            [
                ("GET", "/v1/namespaces/{}"),
                ("HEAD", "/v1/namespaces/{}"),
                ("GET", "/v1/namespaces/db/tables/{}"),
                ("DELETE", "/v1/namespaces/{}"),
                ("DELETE", "/v1/namespaces/db/tables/{}"),
                ("POST", "/v1/namespaces/db/tables/{}/plan"),
                ("POST", "/v1/namespaces/{}/tables"),
            ]
        )
    )
    url = URL(str(client.make_url("/")).rstrip("/") + template.format(escaped), encoded=True)
    body = {"name": raw.decode("utf-8", "replace"), "schema": SCHEMA}
    response = await client.session.request(method, url, json=body if method == "POST" else None)
    assert response.status < 500, await response.text()
    text = raw.decode("utf-8", "surrogateescape")
    response = await client.post(
        "/v1/namespaces",
        json={"namespace": [text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")]},
    )
    assert response.status < 500, await response.text()


async def test_messages_never_name_the_servers_warehouse(serve: Any) -> None:
    served = await serve()
    client = served.client
    await client.post("/v1/namespaces", json={"namespace": ["db"]})
    await create_table(client, "rich")
    private = str(served.warehouse)
    answers = [
        await client.post("/v1/namespaces/db/tables/rich/plan", json={"snapshot-id": -1}),
        await client.post(
            "/v1/namespaces/db/tables/rich/plan",
            json={"start-snapshot-id": 1, "end-snapshot-id": 2},
        ),
        await client.post(
            "/v1/namespaces/db/tables",
            json={"name": "x", "schema": SCHEMA, "location": f"{private}/db/elsewhere"},
        ),
        await client.post("/v1/namespaces/db/tables/rich/plan", json={"ref": "nope"}),
    ]
    for response in answers:
        text = await response.text()
        assert 400 <= response.status < 500, text
        assert private not in text and "/tmp" not in text, text


# ---------------------------------------------------------------------------------------------
# Tokens: scopes and traces
# ---------------------------------------------------------------------------------------------


async def test_the_planner_token_reads_but_writes_only_when_the_operator_says_so(
    serve: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    reader = {"Authorization": "Bearer planner-token-1"}
    served = await serve(token="planner-token-1")
    assert any("ICEFLOE_PLANNER_TOKEN_SCOPE=write" in r.getMessage() for r in caplog.records)
    client = served.client
    await expect(await client.get("/v1/namespaces", headers=reader), 200)
    response = await client.post("/v1/namespaces", json={"namespace": ["db"]}, headers=reader)
    await expect(response, 403, "ForbiddenException")
    await expect(await client.get("/v1/namespaces"), 401, "NotAuthorizedException")

    # With writers of their own, the planner token keeps reading beside them.
    served = await serve(token="planner-token-1", write_tokens=f"ann={WRITE}")
    writer = {"Authorization": f"Bearer {WRITE}"}
    client = served.client
    response = await client.post("/v1/namespaces", json={"namespace": ["db"]}, headers=writer)
    await expect(response, 200)
    await expect(await client.get("/v1/namespaces/db", headers=reader), 200)
    response = await client.delete("/v1/namespaces/db", headers=reader)
    await expect(response, 403, "ForbiddenException")

    # The old behaviour, asked for explicitly.
    caplog.clear()
    served = await serve(token="planner-token-1", scope="write")
    assert any("may write" in r.getMessage() for r in caplog.records)
    response = await served.client.post(
        "/v1/namespaces", json={"namespace": ["db"]}, headers=reader
    )
    await expect(response, 200)


async def test_refused_requests_are_access_logged_and_refused_writes_audited(
    serve: Any, caplog: pytest.LogCaptureFixture
) -> None:
    served = await serve(read_tokens=f"rita={READ}", write_tokens=f"ann={WRITE}")
    client = served.client
    caplog.set_level(logging.INFO, logger="icefloe.audit")
    caplog.set_level(logging.INFO, logger="icefloe.access")
    reader = {"Authorization": f"Bearer {READ}"}
    await expect(await client.post("/v1/namespaces", json={"namespace": ["a"]}), 401)
    await expect(
        await client.post(
            "/v1/namespaces",
            json={"namespace": ["b"]},
            headers={"Authorization": "Bearer nope-nope"},
        ),
        401,
    )
    await expect(
        await client.post("/v1/namespaces", json={"namespace": ["c"]}, headers=reader), 403
    )
    await expect(await client.get("/v1/namespaces"), 401)
    access = [r for r in caplog.records if r.name == "icefloe.access"]
    assert [(r.method, r.status) for r in access] == [  # type: ignore[attr-defined]
        ("POST", 401),
        ("POST", 401),
        ("POST", 403),
        ("GET", 401),
    ]
    audited = [json.loads(r.getMessage()) for r in caplog.records if r.name == "icefloe.audit"]
    assert [(a["principal"], a["operation"], a["status"]) for a in audited] == [
        ("unauthenticated", "createNamespace", 401),
        ("unauthenticated", "createNamespace", 401),
        ("rita", "createNamespace", 403),
    ]
    assert all("error" in a for a in audited)


async def test_stage_create_leaves_folders_engines_write_into(serve: Any) -> None:
    served = await serve()
    client = served.client
    await client.post("/v1/namespaces", json={"namespace": ["db"]})
    staged = await create_table(client, "s", **{"stage-create": True})
    location = Path(staged["metadata"]["location"].removeprefix("file://"))
    assert (location / "metadata").is_dir() and (location / "data").is_dir()
    assert not await served.catalog.table_exists("db.s")
    # The staged table is created by its first commit, folders and all.
    body = {
        "requirements": [{"type": "assert-create"}],
        "updates": [
            {"action": "assign-uuid", "uuid": staged["metadata"]["table-uuid"]},
            {"action": "upgrade-format-version", "format-version": 2},
            {"action": "add-schema", "schema": SCHEMA},
            {"action": "set-current-schema", "schema-id": -1},
            {"action": "add-spec", "spec": {"spec-id": 0, "fields": []}},
            {"action": "set-default-spec", "spec-id": -1},
            {"action": "add-sort-order", "sort-order": {"order-id": 0, "fields": []}},
            {"action": "set-default-sort-order", "sort-order-id": -1},
            {"action": "set-location", "location": staged["metadata"]["location"]},
        ],
    }
    await expect(await client.post("/v1/namespaces/db/tables/s", json=body), 200)
    assert await served.catalog.table_exists("db.s")
