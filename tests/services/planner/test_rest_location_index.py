"""The REST catalog's location index against tables changed behind its back.

Another engine on the same catalog (PyIceberg's DynamoDB catalog; icefloe's core library on
Redis, as the CLI uses it) drops, renames and creates tables without touching the index.
The index must neither refuse a location a dropped table left, nor leave a renamed or
outside-created table's location open to a second table (which would share its files, and
whose purge would delete them).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest
from aiohttp.test_utils import TestClient, TestServer
from test_rest_catalog import open_catalog

from icefloe.catalog import location_index
from icefloe.planner.app import PlannerService
from icefloe.planner.config import PlannerConfig
from icefloe.planner.write_config import RestCatalogSettings
from icefloe.spec.schema import Schema

pytestmark = pytest.mark.integration

SCHEMA = {
    "type": "struct",
    "schema-id": 0,
    "fields": [{"id": 1, "name": "id", "type": "long", "required": True}],
}


@dataclass
class Outside:
    """The other engine: drop, rename and create on the REST catalog's store."""

    kind: str
    handle: Any  # a PyIceberg catalog (dynamodb) or an icefloe catalog (redis)

    async def drop(self, name: str) -> None:
        if self.kind == "dynamodb":
            await asyncio.to_thread(self.handle.drop_table, ("db", name))
        else:
            await self.handle.drop_table(f"db.{name}")

    async def rename(self, source: str, destination: str) -> None:
        if self.kind == "dynamodb":
            await asyncio.to_thread(self.handle.rename_table, ("db", source), ("db", destination))
        else:
            await self.handle.rename_table(f"db.{source}", f"db.{destination}")

    async def create(self, name: str) -> str:
        """The new table's location."""
        if self.kind == "dynamodb":
            from pyiceberg.schema import Schema as PySchema
            from pyiceberg.types import LongType, NestedField

            schema = PySchema(NestedField(1, "id", LongType(), required=True))
            table = await asyncio.to_thread(self.handle.create_table, ("db", name), schema)
            return str(table.location())
        made = await self.handle.create_table(f"db.{name}", Schema.from_json(SCHEMA))
        return str(made.location)


@pytest.fixture(params=["dynamodb", "redis"])
async def rest_and_outside(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[TestClient[Any, Any], Outside]]:
    kind = str(request.param)
    server = str(request.getfixturevalue("dynalite" if kind == "dynamodb" else "redis_server"))
    tag = uuid.uuid4().hex[:10]
    warehouse = tmp_path / "wh"
    warehouse.mkdir()
    catalog = open_catalog(kind, warehouse, server, tag)
    await catalog.list_namespaces()  # the DynamoDB table exists before PyIceberg looks
    config = PlannerConfig(catalog=f"file://{warehouse}", host="127.0.0.1", port=0)
    service = PlannerService(config, catalog, rest=RestCatalogSettings())
    client: TestClient[Any, Any] = TestClient(TestServer(service.app()))
    await client.start_server()
    other = open_catalog(kind, warehouse, server, tag)
    if kind == "dynamodb":
        from pyiceberg.catalog.dynamodb import DynamoDbCatalog as PyIcebergDynamoDbCatalog

        dynamodb = boto3.client(
            "dynamodb",
            endpoint_url=server,
            region_name="us-east-1",
            aws_access_key_id="test",
            aws_secret_access_key="test",
        )
        handle: Any = PyIcebergDynamoDbCatalog(
            "pyiceberg",
            client=dynamodb,
            **{"table-name": f"icefloe_{tag}", "warehouse": f"file://{warehouse}"},
        )
    else:
        handle = other
    try:
        yield client, Outside(kind, handle)
    finally:
        await client.close()
        await other.close()
        await catalog.close()


async def _create(client: TestClient[Any, Any], name: str, **extra: Any) -> Any:
    return await client.post(
        "/v1/namespaces/db/tables", json={"name": name, "schema": SCHEMA, **extra}
    )


async def test_a_table_renamed_or_dropped_outside_is_neither_unprotected_nor_in_the_way(
    rest_and_outside: tuple[TestClient[Any, Any], Outside],
) -> None:
    client, outside = rest_and_outside
    assert (await client.post("/v1/namespaces", json={"namespace": ["db"]})).status == 200
    made = await _create(client, "victim")
    assert made.status == 200, await made.text()
    victim = await made.json()
    location, metadata = victim["metadata"]["location"], victim["metadata-location"]
    await outside.rename("victim", "moved")
    # The index's entry names db.victim, which is gone: the location is db.moved's now.
    alias = {"name": "alias", "metadata-location": metadata}
    refused = await client.post("/v1/namespaces/db/register", json=alias)
    assert refused.status == 403, await refused.text()
    assert "db.moved" in (await refused.json())["error"]["message"]
    inner = await _create(client, "inner", location=location + "/inner")
    assert inner.status == 403, await inner.text()
    await outside.drop("moved")
    # Gone for good: its old entry refuses nothing.
    registered = await client.post("/v1/namespaces/db/register", json=alias)
    assert registered.status == 200, await registered.text()
    listed = await (await client.get("/v1/namespaces/db/tables")).json()
    assert [t["name"] for t in listed["identifiers"]] == ["alias"]


async def test_a_table_created_outside_is_indexed_when_the_catalog_is_scanned(
    rest_and_outside: tuple[TestClient[Any, Any], Outside], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The catalog is scanned every RESCAN_S (shared by the replicas); here at every check.
    monkeypatch.setattr(location_index, "RESCAN_S", 0.0)
    client, outside = rest_and_outside
    assert (await client.post("/v1/namespaces", json={"namespace": ["db"]})).status == 200
    assert (await _create(client, "first")).status == 200  # the index is filled
    location = await outside.create("ext")  # (icefloe's core enters its own creates)
    inner = await _create(client, "inner", location=location + "/inner")
    assert inner.status == 403, await inner.text()
    assert "db.ext" in (await inner.json())["error"]["message"]
    around = await _create(client, "around", location=location.rsplit("/", 1)[0])
    assert around.status == 403, await around.text()
