"""Iceberg 1.11's REST protocol additions: Idempotency-Key, ETag / 304, scan-planning-mode.

Replicas are planner services over one shared catalog: two in this process over separate
catalog objects of the file system, Redis (real redis-server) and DynamoDB (dynalite), and
two planner *processes* over one Redis catalog, so that nothing a test sees can come from
one process's memory.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer
from planner_process import planner_process
from test_rest_catalog import open_catalog
from victim_files import append_victim_files, intact

from icefloe.catalog.fs import FileSystemCatalog
from icefloe.errors import ValidationError
from icefloe.planner import signed_tokens
from icefloe.planner.app import PlannerService
from icefloe.planner.config import PlannerConfig
from icefloe.planner.write_config import Principal, RestCatalogSettings
from icefloe.spec.datafile import DataFile
from icefloe.spec.schema import Schema
from icefloe.table.catalog import Catalog
from icefloe.table.snapshot_producer import fast_append

SCHEMA = {
    "type": "struct",
    "schema-id": 0,
    "fields": [{"id": 1, "name": "id", "type": "long", "required": True}],
}
Client = TestClient[Any, Any]
CATALOGS: dict[Client, Catalog] = {}  # each replica's own catalog object


@pytest.fixture(
    params=[
        "fs",
        pytest.param("redis", marks=pytest.mark.integration),
        pytest.param("dynamodb", marks=pytest.mark.integration),
    ]
)
async def replicas(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[Callable[[int], Any]]:
    """``await replicas(n)``: n planner services over one catalog (one catalog object each)."""
    kind = str(request.param)
    server = None
    if kind == "redis":
        server = str(request.getfixturevalue("redis_server"))
    elif kind == "dynamodb":
        server = str(request.getfixturevalue("dynalite"))
    tag = uuid.uuid4().hex[:10]
    warehouse = tmp_path / "wh"
    warehouse.mkdir()
    opened: list[tuple[Client, Catalog]] = []

    async def make(n: int, planner: dict[str, Any] | None = None, **rest: Any) -> list[Client]:
        """n replicas' clients; ``make.catalogs`` (via CATALOGS) has their catalogs."""
        for _ in range(n):
            catalog = open_catalog(kind, warehouse, server, tag)
            config = PlannerConfig(
                catalog=f"file://{warehouse}", host="127.0.0.1", port=0, **(planner or {})
            )
            service = PlannerService(config, catalog, rest=RestCatalogSettings(**rest))
            client: Client = TestClient(TestServer(service.app()))
            await client.start_server()
            opened.append((client, catalog))
            CATALOGS[client] = catalog
        return [c for c, _ in opened[-n:]]

    yield make
    for client, catalog in opened:
        CATALOGS.pop(client, None)
        await client.close()
        await catalog.close()


def key() -> dict[str, str]:
    return {"Idempotency-Key": str(uuid.uuid4())}


async def test_config_advertises_the_key_lifetime_at_the_top_level(replicas: Any) -> None:
    (a,) = await replicas(1)
    body = await (await a.get("/v1/config")).json()
    assert body["idempotency-key-lifetime"] == "PT30M"
    assert "idempotency-key-lifetime" not in body["defaults"]


async def test_a_retry_on_another_replica_gets_the_first_answer(replicas: Any) -> None:
    a, b = await replicas(2)
    headers = key()
    first = await a.post("/v1/namespaces", json={"namespace": ["db"]}, headers=headers)
    assert first.status == 200
    retry = await b.post("/v1/namespaces", json={"namespace": ["db"]}, headers=headers)
    assert retry.status == 200 and retry.headers["Idempotent-Replayed"] == "true"
    assert await retry.json() == await first.json()
    # Without the key the same request is a second operation, and answers as one.
    again = await b.post("/v1/namespaces", json={"namespace": ["db"]})
    assert again.status == 409

    create = {"name": "t", "schema": SCHEMA}
    headers = key()
    made = await a.post("/v1/namespaces/db/tables", json=create, headers=headers)
    assert made.status == 200
    replay = await b.post("/v1/namespaces/db/tables", json=create, headers=headers)
    assert replay.status == 200
    assert (await replay.json()) == (await made.json())
    assert replay.headers["ETag"] == made.headers["ETag"]

    # A commit retried through the other replica is applied once: one snapshot-less
    # property change, and the retry answers with the first commit's metadata location.
    commit = {"requirements": [], "updates": [{"action": "set-properties", "updates": {"k": "1"}}]}
    headers = key()
    done = await a.post("/v1/namespaces/db/tables/t", json=commit, headers=headers)
    assert done.status == 200
    again_commit = await b.post("/v1/namespaces/db/tables/t", json=commit, headers=headers)
    first_location = (await done.json())["metadata-location"]
    assert (await again_commit.json())["metadata-location"] == first_location
    loaded = await (await b.get("/v1/namespaces/db/tables/t")).json()
    assert loaded["metadata-location"] == first_location
    assert len(loaded["metadata"]["metadata-log"]) == 1  # created, then one commit


async def test_a_deterministic_4xx_is_replayed_and_a_different_request_is_refused(
    replicas: Any,
) -> None:
    a, b = await replicas(2)
    create = {"name": "t", "schema": SCHEMA}
    headers = key()
    missing = await a.post("/v1/namespaces/nope/tables", json=create, headers=headers)
    assert missing.status == 404
    await a.post("/v1/namespaces", json={"namespace": ["nope"]})
    replay = await b.post("/v1/namespaces/nope/tables", json=create, headers=headers)
    assert replay.status == 404
    assert (await replay.json())["error"]["type"] == (await missing.json())["error"]["type"]
    other = await b.post(
        "/v1/namespaces/nope/tables", json={**create, "name": "u"}, headers=headers
    )
    assert other.status == 422
    assert (await other.json())["error"]["type"] == "UnprocessableEntityException"
    bad = await a.post(
        "/v1/namespaces", json={"namespace": ["x"]}, headers={"Idempotency-Key": "1"}
    )
    assert bad.status == 400


async def test_concurrent_requests_with_one_key_execute_once(replicas: Any) -> None:
    a, b = await replicas(2)
    await a.post("/v1/namespaces", json={"namespace": ["db"]})
    headers = key()
    create = {"name": "t", "schema": SCHEMA}
    responses = await asyncio.gather(
        *(
            (a if i % 2 else b).post("/v1/namespaces/db/tables", json=create, headers=headers)
            for i in range(8)
        )
    )
    # Without the key seven of these would be 409 AlreadyExists.
    assert [r.status for r in responses] == [200] * 8
    bodies = [await r.json() for r in responses]
    assert all(body == bodies[0] for body in bodies)
    assert sum(r.headers.get("Idempotent-Replayed") != "true" for r in responses) == 1


async def test_etag_and_not_modified(replicas: Any) -> None:
    a, b = await replicas(2)
    await a.post("/v1/namespaces", json={"namespace": ["db"]})
    made = await a.post("/v1/namespaces/db/tables", json={"name": "t", "schema": SCHEMA})
    tag = made.headers["ETag"]
    path = "/v1/namespaces/db/tables/t"
    unchanged = await b.get(path, headers={"If-None-Match": tag})
    assert unchanged.status == 304 and unchanged.headers["ETag"] == tag
    assert (await b.get(path, headers={"If-None-Match": f'"x", W/{tag}'})).status == 304
    refs = await b.get(path, params={"snapshots": "refs"}, headers={"If-None-Match": tag})
    assert refs.status == 200 and refs.headers["ETag"] != tag
    commit = {"requirements": [], "updates": [{"action": "set-properties", "updates": {"k": "1"}}]}
    committed = await a.post(path, json=commit)
    new_tag = committed.headers["ETag"]
    assert new_tag != tag
    # (Replica b sees the commit at its next refresh; the committing replica at once.)
    changed = await a.get(path, headers={"If-None-Match": tag})
    assert changed.status == 200 and changed.headers["ETag"] == new_tag
    assert (await a.get(path, headers={"If-None-Match": new_tag})).status == 304


async def test_scan_planning_mode_follows_the_table_property(replicas: Any) -> None:
    (a,) = await replicas(1)
    await a.post("/v1/namespaces", json={"namespace": ["db"]})
    body = {"name": "c", "schema": SCHEMA, "properties": {"scan-planning-mode": "client"}}
    made = await a.post("/v1/namespaces/db/tables", json=body)
    assert (await made.json())["config"] == {"scan-planning-mode": "client"}
    loaded = await (await a.get("/v1/namespaces/db/tables/c")).json()
    assert loaded["config"] == {"scan-planning-mode": "client"}
    plain = await a.post("/v1/namespaces/db/tables", json={"name": "s", "schema": SCHEMA})
    assert (await plain.json())["config"] == {"scan-planning-mode": "server"}


WRITE = "writer-token-0001"
READ = "reader-token-0001"


async def oauth_token(client: Any, url: str, name: str, secret: str) -> str:
    form = {"grant_type": "client_credentials", "client_id": name, "client_secret": secret}
    response = await client.post(f"{url}/v1/oauth/tokens", data=form)
    assert response.status == 200, await response.text()
    return str((await response.json())["access_token"])


async def test_oauth_tokens_are_valid_on_every_replica_and_cannot_be_forged(
    replicas: Any,
) -> None:
    a, b = await replicas(2, write_tokens=f"ann={WRITE}", read_tokens=f"rita={READ}")
    token = await oauth_token(a, "", "ann", WRITE)
    headers = {"Authorization": f"Bearer {token}"}
    made = await b.post("/v1/namespaces", json={"namespace": ["db"]}, headers=headers)
    assert made.status == 200, await made.text()
    reader = await oauth_token(b, "", "rita", READ)
    assert (
        await a.get("/v1/namespaces", headers={"Authorization": f"Bearer {reader}"})
    ).status == 200
    # A reader's token rewritten to claim writes, or re-signed with a guessed key, is refused;
    # so is an expired one.
    signed, _, signature = reader.rpartition(".")
    claims = json.loads(base64.urlsafe_b64decode(signed[5:] + "=" * (-len(signed[5:]) % 4)))
    forged_payload = (
        base64.urlsafe_b64encode(json.dumps({**claims, "write": True}).encode())
        .rstrip(b"=")
        .decode()
    )
    reader_principal = Principal("rita", False)
    for forged in (
        f"ift1.{forged_payload}.{signature}",
        signed_tokens.issue("a-guessed-key", Principal("rita", True), time.time() + 600),
        signed_tokens.issue(READ, reader_principal, time.time() - 1),
        reader[:-2] + ("AA" if not reader.endswith("AA") else "BB"),
    ):
        response = await a.post(
            "/v1/namespaces",
            json={"namespace": ["x"]},
            headers={"Authorization": f"Bearer {forged}"},
        )
        assert response.status == 401, (forged, await response.text())
    # The reader's genuine token reads but does not write.
    response = await a.post(
        "/v1/namespaces", json={"namespace": ["x"]}, headers={"Authorization": f"Bearer {reader}"}
    )
    assert response.status == 403


@pytest.mark.integration
async def test_idempotency_and_oauth_tokens_hold_across_two_planner_processes(
    redis_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two real planner processes over one Redis catalog: a retry through the other
    process, and concurrent requests split between them, execute once; an OAuth2 token
    issued by one is accepted by the other."""
    monkeypatch.setenv("ICEFLOE_REST_WRITE_TOKENS", f"ann={WRITE}")
    warehouse = tmp_path / "wh"
    catalog = f"{redis_server}?warehouse={warehouse}&prefix=p{uuid.uuid4().hex[:10]}"
    async with (
        aiohttp.ClientSession() as session,
        planner_process(warehouse, session, catalog=catalog) as (url_a, _),
        planner_process(warehouse, session, catalog=catalog) as (url_b, _),
    ):
        token = await oauth_token(session, url_a, "ann", WRITE)
        auth = {"Authorization": f"Bearer {token}"}
        headers = {**key(), **auth}
        first = await session.post(
            f"{url_a}/v1/namespaces", json={"namespace": ["db"]}, headers=headers
        )
        retry = await session.post(
            f"{url_b}/v1/namespaces", json={"namespace": ["db"]}, headers=headers
        )
        assert (first.status, retry.status) == (200, 200)
        assert retry.headers["Idempotent-Replayed"] == "true"
        headers = {**key(), **auth}
        create = {"name": "t", "schema": SCHEMA}
        responses = await asyncio.gather(
            *(
                session.post(f"{url}/v1/namespaces/db/tables", json=create, headers=headers)
                for url in [url_a, url_b] * 4
            )
        )
        assert [r.status for r in responses] == [200] * 8
        locations = {(await r.json())["metadata-location"] for r in responses}
        assert len(locations) == 1


# ---------------------------------------------------------------------------------------------
# register (overwrite) and tables whose locations overlap
# ---------------------------------------------------------------------------------------------


async def victim_with_files(client: Client, files: int = 7) -> tuple[Any, list[Path]]:
    """db.victim with ``files`` data files on disk, committed through the core."""
    await client.post("/v1/namespaces", json={"namespace": ["db"]})
    made = await client.post("/v1/namespaces/db/tables", json={"name": "victim", "schema": SCHEMA})
    assert made.status == 200, await made.text()
    catalog = CATALOGS[client]
    paths = await append_victim_files(await catalog.load_table("db.victim"), files)
    return await catalog.load_table("db.victim"), paths


async def test_no_table_is_registered_or_created_over_another_tables_location(
    replicas: Any, tmp_path: Path
) -> None:
    """The alias attack: register the victim's metadata file under a new name (its location
    is the victim's), or metadata naming a folder around or inside the victim, or create a
    table inside the victim's folder; each is 403 and nothing is registered."""
    (a,) = await replicas(1)
    victim, files = await victim_with_files(a)
    # The file-system catalog keeps a table at its path and refuses other locations (400).
    refusal = 400 if isinstance(CATALOGS[a], FileSystemCatalog) else 403
    register = "/v1/namespaces/db/register"
    alias = {"name": "alias", "metadata-location": victim.metadata_location}
    refused = await a.post(register, json=alias)
    assert refused.status == refusal, await refused.text()
    if refusal == 403:
        message = (await refused.json())["error"]["message"]
        assert "overlaps the location of table db.victim" in message
    document = json.loads(Path(victim.metadata_location.removeprefix("file://")).read_bytes())
    for n, location in enumerate(
        (str(Path(victim.location).parent), victim.location + "/data/inner")
    ):
        forged = tmp_path / "wh" / f"forged-{n}.metadata.json"
        forged.write_text(json.dumps({**document, "location": location}))
        body = {"name": f"alias{n}", "metadata-location": str(forged)}
        assert (await a.post(register, json=body)).status == refusal
    inside = {"name": "inner", "schema": SCHEMA, "location": victim.location + "/inner"}
    assert (await a.post("/v1/namespaces/db/tables", json=inside)).status == refusal
    listed = await (await a.get("/v1/namespaces/db/tables")).json()
    assert [t["name"] for t in listed["identifiers"]] == ["victim"]
    assert intact(files)


async def test_purge_is_refused_while_another_table_shares_the_location(replicas: Any) -> None:
    """An alias made around the REST catalog (before these checks, or by another tool):
    purging either table is refused and deletes nothing; dropping the alias without purge
    works, and then the victim may be purged."""
    (a,) = await replicas(1)
    victim, files = await victim_with_files(a)
    if isinstance(CATALOGS[a], FileSystemCatalog):
        # File-system tables live at their path: the catalog holds no alias at all.
        with pytest.raises(ValidationError, match="must live at"):
            await CATALOGS[a].register_table("db.alias", victim.metadata_location)
        return
    await CATALOGS[a].register_table("db.alias", victim.metadata_location)
    for name in ("alias", "victim"):
        response = await a.delete(f"/v1/namespaces/db/tables/{name}?purgeRequested=true")
        assert response.status == 403, await response.text()
        assert (await response.json())["error"]["type"] == "ForbiddenException"
    assert intact(files)
    assert (await a.delete("/v1/namespaces/db/tables/alias")).status == 204
    assert intact(files)
    assert (await a.delete("/v1/namespaces/db/tables/victim?purgeRequested=true")).status == 204
    assert not any(p.exists() for p in files)


async def test_register_with_overwrite_replaces_the_tables_metadata(replicas: Any) -> None:
    a, b = await replicas(2)
    await a.post("/v1/namespaces", json={"namespace": ["db"]})
    made = await (
        await a.post("/v1/namespaces/db/tables", json={"name": "t", "schema": SCHEMA})
    ).json()
    first = made["metadata-location"]
    commit = {"requirements": [], "updates": [{"action": "set-properties", "updates": {"k": "1"}}]}
    assert (await a.post("/v1/namespaces/db/tables/t", json=commit)).status == 200
    body = {"name": "t", "metadata-location": first}
    exists = await b.post("/v1/namespaces/db/register", json=body)
    assert exists.status == 409
    assert (await exists.json())["error"]["type"] == "AlreadyExistsException"
    over = await b.post("/v1/namespaces/db/register", json={**body, "overwrite": True})
    assert over.status == 200, await over.text()
    assert "k" not in (await over.json())["metadata"].get("properties", {})
    table = await CATALOGS[a].load_table("db.t")
    assert "k" not in table.metadata.properties
    # overwrite of a table that does not exist registers it
    fresh = await b.post(
        "/v1/namespaces/db/register",
        json={"name": "u", "metadata-location": first, "overwrite": True},
    )
    # ... unless its location is another table's (t's, here): 403, or on the file-system
    # catalog, which keeps a table at its own path, 400.
    fs = isinstance(CATALOGS[a], FileSystemCatalog)
    assert fresh.status == (400 if fs else 403)


async def test_a_plan_cancelled_on_one_replica_is_cancelled_on_all(replicas: Any) -> None:
    """Replicas sharing the plan secret serve each other's plan tasks; once one cancels the
    plan, no replica serves it (neither its tasks nor the plan)."""
    planner = {"plan_secret": "plan-secret-0123456789abcdef", "tasks_per_page": 5}
    a, b = await replicas(2, planner=planner)
    # Written through the core before either replica loads the table: both see its files.
    catalog = CATALOGS[a]
    await catalog.create_namespace("db")
    table = await catalog.create_table("db.p", Schema.from_json(SCHEMA))
    files = [
        DataFile(f"{table.location}/data/part-{i}.parquet", "parquet", (), 1, 100)
        for i in range(23)
    ]
    await fast_append(table, files).commit()
    path = "/v1/namespaces/db/tables/p"
    planned = await (await a.post(path + "/plan", json={})).json()
    assert planned["status"] == "completed" and planned["plan-tasks"]
    plan_id, task = planned["plan-id"], planned["plan-tasks"][0]
    served = await b.post(path + "/tasks", json={"plan-task": task})
    assert served.status == 200, await served.text()
    assert (await a.delete(f"{path}/plan/{plan_id}")).status == 204
    for client in (a, b):
        refused = await client.post(path + "/tasks", json={"plan-task": task})
        assert refused.status == 404
        assert (await refused.json())["error"]["type"] == "NoSuchPlanTaskException"
        fetched = await client.get(f"{path}/plan/{plan_id}")
        assert fetched.status == 404
    assert (await b.delete(f"{path}/plan/{plan_id}")).status == 404
