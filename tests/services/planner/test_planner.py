"""The planner service over HTTP: REST routes, errors, paging, auth, freshness and fuzzing.

Tables are real (Parquet files and commits through a file-system catalog); the service runs
in-process behind aiohttp's test server, or on a real port in a thread for schemathesis.
Time never enters an assertion: table freshness is driven by an injected clock.
"""

from __future__ import annotations

import asyncio
import io
import json
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples
from icefloe.catalog.fs import FileSystemCatalog
from icefloe.deletes.index import DELETE_FILE_PATH_ID
from icefloe.errors import NotFoundError
from icefloe.events import TableCommitted
from icefloe.io.fileio import LocalFileIO
from icefloe.parquet.files import write_files
from icefloe.planner.app import PlannerService
from icefloe.planner.catalog_routes import OPENAPI_FILE
from icefloe.planner.config import PlannerConfig, add_arguments, overrides_from_args
from icefloe.planner.openapi import ENDPOINTS, served_openapi, trim_openapi
from icefloe.planner.plans import PlanStore
from icefloe.planner.refresher import TableCommittedFeed, TableRefresher, TableState, is_newer
from icefloe.spec.datafile import DataFile, DataFileContent
from icefloe.spec.metadata_builder import LAST_ADDED, MetadataBuilder
from icefloe.spec.partition import PartitionSpecBuilder
from icefloe.spec.schema import Schema
from icefloe.spec.snapshot import SnapshotRef
from icefloe.spec.types import IntegerType, LongType, NestedField, StringType, TimestampType
from icefloe.table.catalog import Table, TableIdentifier
from icefloe.table.snapshot_producer import fast_append, row_delta

DAY_US = 86_400_000_000
FIRST_DAY = 19_723
SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "ts", TimestampType(), required=True),
    NestedField(3, "name", StringType()),
    NestedField(4, "category", IntegerType(), required=True),
)
ARROW = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("ts", pa.timestamp("us"), nullable=False),
        pa.field("name", pa.string()),
        pa.field("category", pa.int32(), nullable=False),
    ]
)


def batch(first: int, rows: int, first_day: int) -> pa.Table:
    ids = list(range(first, first + rows))
    return pa.table(
        {
            "id": ids,
            "ts": [(FIRST_DAY + first_day) * DAY_US + i * 3_600_000_000 for i in range(rows)],
            "name": [None if i % 9 == 0 else f"n-{i % 20:02d}" for i in ids],
            "category": [i % 3 for i in ids],
        },
        schema=ARROW,
    )


class Manual:
    """A clock tests move by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def append(table: Table, data: pa.Table) -> tuple[Table, list[DataFile]]:
    files = await write_files(
        table.io, data, table.location, schema=table.metadata.schema(), spec=table.metadata.spec()
    )
    return await fast_append(table, files).commit(), files


def position_delete(table: Table, target: DataFile, positions: list[int]) -> DataFile:
    path = Path(table.location) / "data" / f"del-{Path(target.file_path).stem}.parquet"
    data = pa.table(
        {"file_path": [target.file_path] * len(positions), "pos": positions},
        schema=pa.schema([pa.field("file_path", pa.string()), pa.field("pos", pa.int64())]),
    )
    buffer = io.BytesIO()
    pq.write_table(data, buffer)
    path.write_bytes(buffer.getvalue())
    encoded = target.file_path.encode()
    return DataFile(
        str(path),
        "parquet",
        target.partition,
        len(positions),
        len(buffer.getvalue()),
        content=DataFileContent.POSITION_DELETES,
        spec_id=target.spec_id,
        lower_bounds={DELETE_FILE_PATH_ID: encoded},
        upper_bounds={DELETE_FILE_PATH_ID: encoded},
    )


class World:
    def __init__(self, warehouse: Path, catalog: FileSystemCatalog, table: Table) -> None:
        self.warehouse = warehouse
        self.catalog = catalog
        self.table = table
        self.snapshots: list[int] = []
        self.files: list[DataFile] = []
        self.deletes: dict[str, str] = {}


async def build_world(warehouse: Path) -> World:
    catalog = FileSystemCatalog("planner", str(warehouse), LocalFileIO())
    await catalog.create_namespace("db", {"owner": "tests"})
    await catalog.create_namespace(("db", "nested"))
    spec = PartitionSpecBuilder(SCHEMA).add_field("ts", "day").add_field("id", "bucket[2]").build()
    table = await catalog.create_table("db.events", SCHEMA, spec)
    world = World(warehouse, catalog, table)
    table, files = await append(table, batch(0, 60, 0))
    world.files += files
    world.snapshots.append(table.metadata.current_snapshot().snapshot_id)  # type: ignore[union-attr]
    evolved = (
        PartitionSpecBuilder(
            SCHEMA,
            spec_id=1,
            last_partition_id=table.metadata.last_partition_id,
            previous_specs=table.metadata.partition_specs,
        )
        .add_field("category", "identity")
        .build()
    )
    metadata = (
        MetadataBuilder(table.metadata)
        .add_partition_spec(evolved)
        .set_default_spec(LAST_ADDED)
        .build(table.metadata_location)
    )
    table = await catalog.commit(table, metadata)
    table, files = await append(table, batch(60, 30, 2))
    world.files += files
    world.snapshots.append(table.metadata.current_snapshot().snapshot_id)  # type: ignore[union-attr]
    target = world.files[0]
    delete = position_delete(table, target, [0, 1])
    world.deletes[target.file_path] = delete.file_path
    table = await row_delta(table, [], [delete]).commit()
    world.snapshots.append(table.metadata.current_snapshot().snapshot_id)  # type: ignore[union-attr]
    metadata = (
        MetadataBuilder(table.metadata)
        .set_ref("first", SnapshotRef.tag(world.snapshots[0]))
        .build(table.metadata_location)
    )
    world.table = await catalog.commit(table, metadata)
    return world


@pytest.fixture(scope="module")
async def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    return await build_world(tmp_path_factory.mktemp("planner"))


def config(world: World, **overrides: Any) -> PlannerConfig:
    return PlannerConfig(catalog=f"file://{world.warehouse}", port=0, **overrides)


@pytest.fixture
async def make_client(world: World) -> AsyncIterator[Callable[..., Any]]:
    clients: list[TestClient[Any, Any]] = []
    services: list[PlannerService] = []

    async def make(**overrides: Any) -> tuple[TestClient[Any, Any], PlannerService]:
        clock = overrides.pop("clock", None)
        kwargs: dict[str, Any] = {} if clock is None else {"clock": clock}
        for extra in ("plan_secret", "wall_clock"):
            if extra in overrides:
                kwargs[extra] = overrides.pop(extra)
        catalog = FileSystemCatalog("planner", str(world.warehouse), LocalFileIO())
        service = PlannerService(config(world, **overrides), catalog, **kwargs)
        await service.start_background()
        client = TestClient(TestServer(service.app()))
        await client.start_server()
        clients.append(client)
        services.append(service)
        return client, service

    yield make
    for client in clients:
        await client.close()
    for service in services:
        await service.stop()


BASE = "/v1/namespaces/db/tables/events"


async def error_of(response: Any, code: int, error_type: str) -> str:
    assert response.status == code, await response.text()
    body = await response.json()
    assert set(body) == {"error"}
    assert body["error"]["code"] == code and body["error"]["type"] == error_type
    message: str = body["error"]["message"]
    assert message
    return message


# ---------------------------------------------------------------------------------------------
# Catalog routes
# ---------------------------------------------------------------------------------------------


async def test_config_advertises_exactly_the_implemented_endpoints(make_client: Any) -> None:
    client, service = await make_client(warehouse="s3://wh")
    body = await (await client.get("/v1/config")).json()
    assert body["overrides"] == {}
    assert body["defaults"] == {"warehouse": "s3://wh", "scan-planning-mode": "server"}
    # The write routes are icefloe.planner.write_routes's (tested in test_rest_catalog.py).
    advertised = (*ENDPOINTS, *service.write_endpoints)
    assert sorted(body["endpoints"]) == sorted(f"{m} {p}" for m, p in advertised)
    for method, path in ENDPOINTS:
        concrete = path.replace("/v1/{prefix}/", "/v1/").replace("{namespace}", "db")
        concrete = concrete.replace("{table}", "events").replace("{plan-id}", "nope")
        response = await client.request(method, concrete, json={"plan-task": "x:1"})
        assert response.status not in (405, 500), (method, concrete, response.status)


async def test_a_prefix_moves_every_route_and_is_advertised(make_client: Any) -> None:
    client, service = await make_client(prefix="wh1")
    body = await (await client.get("/v1/config")).json()
    assert body["overrides"] == {"prefix": "wh1"}
    advertised = (*ENDPOINTS, *service.write_endpoints)
    assert sorted(body["endpoints"]) == sorted(f"{m} {p}" for m, p in advertised)
    assert (await client.get("/v1/wh1/namespaces")).status == 200
    await error_of(await client.get("/v1/namespaces"), 404, "NotFoundException")


async def test_namespaces_list_load_and_exist(make_client: Any) -> None:
    client, _ = await make_client()
    assert await (await client.get("/v1/namespaces")).json() == {"namespaces": [["db"]]}
    nested = await (await client.get("/v1/namespaces", params={"parent": "db"})).json()
    assert nested == {"namespaces": [["db", "nested"]]}
    loaded = await (await client.get("/v1/namespaces/db")).json()
    assert loaded == {"namespace": ["db"], "properties": {"owner": "tests"}}
    assert (await client.get("/v1/namespaces/db%1Fnested")).status == 200
    assert (await client.head("/v1/namespaces/db")).status == 204
    missing = await client.head("/v1/namespaces/nope")
    assert missing.status == 404 and await missing.read() == b""
    await error_of(await client.get("/v1/namespaces/nope"), 404, "NoSuchNamespaceException")
    await error_of(
        await client.get("/v1/namespaces", params={"parent": "nope"}),
        404,
        "NoSuchNamespaceException",
    )
    await error_of(await client.get("/v1/namespaces/a%1F%1Fb"), 400, "BadRequestException")
    await error_of(await client.get("/v1/namespaces/..%1Fdb"), 400, "BadRequestException")


async def test_tables_list_load_and_exist(make_client: Any, world: World) -> None:
    client, _ = await make_client()
    listed = await (await client.get("/v1/namespaces/db/tables")).json()
    assert listed == {"identifiers": [{"namespace": ["db"], "name": "events"}]}
    response = await client.get(BASE)
    body = await response.json()
    assert body["metadata-location"] == world.table.metadata_location
    assert body["metadata"] == world.table.metadata.to_json()
    assert body["config"] == {"scan-planning-mode": "server"}
    etag = response.headers["ETag"]
    assert (await client.get(BASE, headers={"If-None-Match": etag})).status == 304
    refs_only = await (await client.get(BASE, params={"snapshots": "refs"})).json()
    referenced = {world.snapshots[0], world.snapshots[-1]}
    assert {s["snapshot-id"] for s in refs_only["metadata"]["snapshots"]} == referenced
    await error_of(await client.get(BASE, params={"snapshots": "x"}), 400, "BadRequestException")
    assert (await client.head(BASE)).status == 204
    assert (await client.head("/v1/namespaces/db/tables/nope")).status == 404
    await error_of(await client.get("/v1/namespaces/db/tables/nope"), 404, "NoSuchTableException")
    # loadTable's 404 is NoSuchTableException also when the namespace is unknown (the spec;
    # Spark's metadata tables: `db.events.files` is first loaded as table `files` in
    # namespace `db.events`, and Spark falls back only on NoSuchTableException).
    await error_of(
        await client.get("/v1/namespaces/nope/tables/events"), 404, "NoSuchTableException"
    )
    await error_of(
        await client.get("/v1/namespaces/db%1Fevents/tables/files"), 404, "NoSuchTableException"
    )
    await error_of(await client.get("/v1/namespaces/nope/tables"), 404, "NoSuchNamespaceException")


# ---------------------------------------------------------------------------------------------
# Planning
# ---------------------------------------------------------------------------------------------


async def plan(client: Any, body: Any = None, **kwargs: Any) -> Any:
    data = json.dumps(body).encode() if body is not None else b""
    return await client.post(BASE + "/plan", data=data, **kwargs)


async def all_tasks(client: Any, body: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Every file scan task of a plan (following plan-tasks), with delete files resolved."""
    response = await plan(client, body)
    assert response.status == 200, await response.text()
    first = await response.json()
    assert first["status"] == "completed" and first["plan-id"]
    out = []

    def collect(page: dict[str, Any]) -> None:
        deletes = page.get("delete-files", [])
        for task in page["file-scan-tasks"]:
            refs = task.get("delete-file-references", [])
            out.append({**task, "deletes": [deletes[i]["file-path"] for i in refs]})

    collect(first)
    for token in first.get("plan-tasks", []):
        page = await client.post(BASE + "/tasks", json={"plan-task": token})
        assert page.status == 200, await page.text()
        body_ = await page.json()
        assert "plan-tasks" not in body_
        collect(body_)
    return first, out


async def test_plans_page_through_plan_tasks_and_carry_their_deletes(
    make_client: Any, world: World
) -> None:
    client, service = await make_client(tasks_per_page=3)
    first, tasks = await all_tasks(client, {})
    live = {f.file_path for f in world.files}
    assert {t["data-file"]["file-path"] for t in tasks} == live
    assert len(tasks) == len(live)
    assert len(first["file-scan-tasks"]) == 3
    assert len(first["plan-tasks"]) == -(-len(live) // 3) - 1
    for t in tasks:
        path = t["data-file"]["file-path"]
        assert t["deletes"] == ([world.deletes[path]] if path in world.deletes else [])
        assert "residual-filter" not in t  # the request's filter (none): omitted
        assert "lower-bounds" not in t["data-file"] and "value-counts" not in t["data-file"]
    # The plan can be fetched again and then released.
    plan_id = first["plan-id"]
    again = await (await client.get(f"{BASE}/plan/{plan_id}")).json()
    assert again["file-scan-tasks"] == first["file-scan-tasks"]
    assert again["plan-tasks"] == first["plan-tasks"]
    assert (await client.delete(f"{BASE}/plan/{plan_id}")).status == 204
    await error_of(await client.get(f"{BASE}/plan/{plan_id}"), 404, "NoSuchPlanIdException")
    await error_of(await client.delete(f"{BASE}/plan/{plan_id}"), 404, "NoSuchPlanIdException")
    token = first["plan-tasks"][0]
    await error_of(
        await client.post(BASE + "/tasks", json={"plan-task": token}),
        404,
        "NoSuchPlanTaskException",
    )
    metrics = await (await client.get("/metrics")).text()
    assert "icefloe_planner_cache_hits_total" in metrics
    assert 'icefloe_planner_planned_files_total{outcome="selected"}' in metrics
    assert "icefloe_planner_request_seconds_bucket" in metrics
    assert service.cache.stats().entries > 0


async def test_filters_prune_and_residuals_use_the_term_form(make_client: Any) -> None:
    client, _ = await make_client()
    current = {"type": "eq", "left": {"type": "reference", "name": "id"}, "right": 5}
    legacy = {"type": "eq", "term": "id", "value": 5}
    _, a = await all_tasks(client, {"filter": current})
    _, b = await all_tasks(client, {"filter": legacy})
    assert [t["data-file"]["file-path"] for t in a] == [t["data-file"]["file-path"] for t in b]
    assert len(a) == 1
    assert "residual-filter" not in a[0]  # equal to the request's filter: omitted
    # A residual that differs from the filter (the partition proved the day) is sent.
    both = {
        "type": "and",
        "left": {"type": "gt-eq", "term": "ts", "value": "1970-01-01T00:00:00"},
        "right": {"type": "eq", "term": "id", "value": 5},
    }
    _, c = await all_tasks(client, {"filter": both})
    assert [t["data-file"]["file-path"] for t in c] == [t["data-file"]["file-path"] for t in a]
    assert c[0]["residual-filter"] == {"type": "eq", "term": "id", "value": 5}
    _, stats = await all_tasks(client, {"filter": legacy, "stats-fields": ["id"]})
    data_file = stats[0]["data-file"]
    assert data_file["lower-bounds"]["keys"] == [1]
    assert data_file["value-counts"]["keys"] == [1]


async def test_time_travel_and_incremental_scans(make_client: Any, world: World) -> None:
    client, _ = await make_client()
    s = world.snapshots
    first_files = {f.file_path for f in world.files if f.spec_id == 0}
    for body in ({"snapshot-id": s[0]}, {"ref": "first"}):
        _, tasks = await all_tasks(client, body)
        assert {t["data-file"]["file-path"] for t in tasks} == first_files
    _, tasks = await all_tasks(client, {"start-snapshot-id": s[0], "end-snapshot-id": s[-1]})
    assert {t["data-file"]["file-path"] for t in tasks} == {
        f.file_path for f in world.files if f.spec_id == 1
    }
    log = world.table.metadata.snapshot_log
    _, tasks = await all_tasks(client, {"as-of-timestamp-ms": log[0].timestamp_ms})
    assert {t["data-file"]["file-path"] for t in tasks} == first_files


@pytest.mark.parametrize(
    ("body", "status", "error_type"),
    [
        ({"filter": {"type": "eq", "term": "nope", "value": 1}}, 400, "BadRequestException"),
        ({"filter": {"type": "frobnicate"}}, 400, "BadRequestException"),
        ({"filter": {"type": "lt", "term": "name", "value": 5}}, 400, "BadRequestException"),
        ({"select": ["nope"]}, 400, "BadRequestException"),
        ({"stats-fields": ["nope"]}, 400, "BadRequestException"),
        ({"snapshot-id": "1"}, 400, "BadRequestException"),
        ({"case-sensitive": "yes"}, 400, "BadRequestException"),
        ({"min-rows-requested": -1}, 400, "BadRequestException"),
        (
            {"snapshot-id": 1, "start-snapshot-id": 1, "end-snapshot-id": 2},
            400,
            "BadRequestException",
        ),
        ({"start-snapshot-id": 1}, 400, "BadRequestException"),
        ({"snapshot-id": 12345}, 404, "NoSuchSnapshotException"),
        ({"ref": "nope"}, 404, "NoSuchSnapshotException"),
        ({"as-of-timestamp-ms": 1}, 404, "NoSuchSnapshotException"),
        ({"ref": "first", "snapshot-id": 1}, 400, "BadRequestException"),
        ([1, 2], 400, "BadRequestException"),
    ],
)
async def test_bad_plan_requests_are_client_errors(
    make_client: Any, body: Any, status: int, error_type: str
) -> None:
    client, _ = await make_client()
    await error_of(await plan(client, body), status, error_type)


async def test_malformed_bodies_and_unknown_tables(make_client: Any) -> None:
    client, _ = await make_client()
    await error_of(await client.post(BASE + "/plan", data=b"{not json"), 400, "BadRequestException")
    await error_of(await client.post(BASE + "/plan", data=b"\xff\xfe"), 400, "BadRequestException")
    await error_of(
        await client.post("/v1/namespaces/db/tables/nope/plan", json={}),
        404,
        "NoSuchTableException",
    )
    await error_of(await client.post(BASE + "/tasks", data=b""), 400, "BadRequestException")
    await error_of(
        await client.post(BASE + "/tasks", json={"plan-task": 5}), 400, "BadRequestException"
    )
    await error_of(
        await client.post(BASE + "/tasks", json={"plan-task": "nope"}),
        404,
        "NoSuchPlanTaskException",
    )
    await error_of(await client.put(BASE + "/plan"), 406, "UnsupportedOperationException")
    # a method no route of the path implements
    await error_of(
        await client.put("/v1/namespaces", json={"namespace": ["x"]}),
        406,
        "UnsupportedOperationException",
    )


async def test_a_plan_belongs_to_its_table(make_client: Any, world: World) -> None:
    client, _ = await make_client(tasks_per_page=2)
    first = await (await plan(client, {})).json()
    other = "/v1/namespaces/db/tables/other"
    await error_of(
        await client.get(f"{other}/plan/{first['plan-id']}"), 404, "NoSuchPlanIdException"
    )
    await error_of(
        await client.post(other + "/tasks", json={"plan-task": first["plan-tasks"][0]}),
        404,
        "NoSuchPlanTaskException",
    )


async def test_bearer_token_authentication(make_client: Any) -> None:
    client, _ = await make_client(token="s3cret")
    await error_of(await client.get("/v1/config"), 401, "NotAuthorizedException")
    await error_of(
        await client.get("/v1/config", headers={"Authorization": "Basic abc"}),
        401,
        "NotAuthorizedException",
    )
    await error_of(
        await client.get("/v1/config", headers={"Authorization": "Bearer wrong"}),
        401,
        "NotAuthorizedException",
    )
    ok = await client.get("/v1/config", headers={"Authorization": "Bearer s3cret"})
    assert ok.status == 200
    assert (await client.get("/healthz")).status == 200
    assert (await client.get("/readyz")).status == 200
    assert (await client.get("/openapi.yaml")).status == 200


# ---------------------------------------------------------------------------------------------
# Freshness
# ---------------------------------------------------------------------------------------------


async def test_answers_are_never_older_than_the_refresh_interval(tmp_path: Path) -> None:
    fresh = await build_world(tmp_path)
    clock = Manual()
    planner_world = World(tmp_path, fresh.catalog, fresh.table)
    client, service = await make_client_for(planner_world, clock=clock, refresh_interval_ms=5000)
    try:
        _, before = await all_tasks(client, {})
        _, added = await append(await fresh.catalog.load_table("db.events"), batch(500, 5, 1))
        clock.now += 4.0  # within the interval: the held state is still acceptable
        _, same = await all_tasks(client, {})
        assert len(same) == len(before)
        clock.now += 2.0  # past it: the request reloads the table first
        _, after = await all_tasks(client, {})
        assert {t["data-file"]["file-path"] for t in after} == {
            t["data-file"]["file-path"] for t in before
        } | {f.file_path for f in added}
        assert service.refresher.reloads["request"] == 2
    finally:
        await client.close()
        await service.stop()


async def make_client_for(
    world: World, **overrides: Any
) -> tuple[TestClient[Any, Any], PlannerService]:
    clock = overrides.pop("clock", None)
    kwargs: dict[str, Any] = {} if clock is None else {"clock": clock}
    catalog = FileSystemCatalog("planner", str(world.warehouse), LocalFileIO())
    service = PlannerService(config(world, **overrides), catalog, **kwargs)
    await service.start_background()
    client = TestClient(TestServer(service.app()))
    await client.start_server()
    return client, service


async def test_refresher_events_polling_and_forgetting(tmp_path: Path) -> None:
    fresh = await build_world(tmp_path)
    catalog = FileSystemCatalog("planner", str(tmp_path), LocalFileIO())
    clock = Manual()
    refresher = TableRefresher(catalog, refresh_interval_s=10, idle_after_s=100, clock=clock)
    ident = TableIdentifier.parse("db.events")
    state = await refresher.get(ident)
    assert state.metadata_location == fresh.table.metadata_location
    assert await refresher.get("db.events") is state  # fresh: no reload
    table, _ = await append(fresh.table, batch(900, 3, 0))
    event = TableCommitted(
        table="db.events",
        snapshot_id=table.metadata.current_snapshot().snapshot_id,  # type: ignore[union-attr]
        sequence_number=table.metadata.last_sequence_number,
        metadata_location=table.metadata_location,
        commit_ids=["c1"],
        latency_ms=1,
    )
    assert await refresher.apply_event(event)
    assert (await refresher.get(ident)).metadata_location == table.metadata_location
    assert not await refresher.apply_event(event)  # already there
    stale = event.model_copy(update={"metadata_location": fresh.table.metadata_location})
    assert not await refresher.apply_event(stale)  # never moves backwards
    unknown = event.model_copy(update={"table": "db.other"})
    assert not await refresher.apply_event(unknown)
    # Polling reloads tables half-way to stale, and forgets idle ones.
    clock.now += 6
    assert await refresher.refresh_due() == 1
    assert refresher.reloads["poll"] == 1
    clock.now += 200
    await refresher.refresh_due()
    assert refresher.tables == []
    # A trusted, caught-up results topic vouches for a state read before it.
    trusting = TableRefresher(catalog, refresh_interval_s=10, clock=clock, trust_events=True)
    state = await trusting.get(ident)
    clock.now += 20
    assert not trusting.is_fresh(state)
    trusting.events_confirmed(clock.now - 1)
    assert trusting.is_fresh(state)
    distrusting = TableRefresher(catalog, refresh_interval_s=10, clock=clock, trust_events=False)
    state = await distrusting.get(ident)
    clock.now += 20
    distrusting.events_confirmed(clock.now)
    assert not distrusting.is_fresh(state)
    with pytest.raises(NotFoundError):
        await refresher.get("db.nope")
    assert is_newer(
        table.metadata,
        table.metadata_location,
        TableState(ident, fresh.table.metadata, fresh.table.metadata_location, 0),
    )


class FakeRecord:
    def __init__(self, value: bytes | None) -> None:
        self.value = value


class FakeConsumer:
    """What TableCommittedFeed uses of aiokafka's consumer, fed by the test."""

    def __init__(self, topic: str, **options: Any) -> None:
        self.topic = topic
        self.options = options
        self.batches: list[list[bytes | None]] = []
        self.high = 0
        self.pos = 0
        self.started = self.stopped = False

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.stopped = True

    async def getmany(self, timeout_ms: int) -> dict[str, list[FakeRecord]]:
        if not self.batches:
            return {}
        values = self.batches.pop(0)
        self.pos += len(values)
        return {"p0": [FakeRecord(v) for v in values]}

    def assignment(self) -> set[str]:
        return {"p0"}

    def highwater(self, tp: str) -> int:
        return self.high

    async def position(self, tp: str) -> int:
        return self.pos


async def test_results_consumer_applies_events_and_confirms_progress(tmp_path: Path) -> None:
    fresh = await build_world(tmp_path)
    catalog = FileSystemCatalog("planner", str(tmp_path), LocalFileIO())
    clock = Manual()
    refresher = TableRefresher(catalog, refresh_interval_s=10, clock=clock)
    await refresher.get("db.events")
    table, _ = await append(fresh.table, batch(700, 3, 0))
    event = TableCommitted(
        table="db.events",
        snapshot_id=table.metadata.current_snapshot().snapshot_id,  # type: ignore[union-attr]
        sequence_number=table.metadata.last_sequence_number,
        metadata_location=table.metadata_location,
        commit_ids=["c"],
        latency_ms=0,
    )
    fake: dict[str, FakeConsumer] = {}

    def factory(options: dict[str, Any], topic: str) -> FakeConsumer:
        fake["c"] = FakeConsumer(topic, **options)
        return fake["c"]

    consumer = TableCommittedFeed(
        refresher, "results", {"bootstrap_servers": ["x"]}, consumer_factory=factory
    )
    await consumer.start()
    assert fake["c"].options == {"bootstrap_servers": ["x"]} and fake["c"].topic == "results"
    fake["c"].batches = [[b"not json", None, event.encode()]]
    fake["c"].high = 3
    assert await consumer.poll_once() == 1
    assert consumer.rejected == 1 and consumer.events == 1
    assert consumer.last_confirmed == clock.now
    state = await refresher.get("db.events")
    assert state.metadata_location == table.metadata_location
    fake["c"].high = 10  # more on the topic than read: not caught up, nothing confirmed
    clock.now += 5
    await consumer.poll_once()
    assert consumer.last_confirmed == clock.now - 5
    await consumer.stop()
    assert fake["c"].stopped


@pytest.mark.integration
async def test_commit_events_from_kafka_refresh_tables(kafka_broker: str, tmp_path: Path) -> None:
    from aiokafka import AIOKafkaProducer
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    topic = "planner-results"
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_broker)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 2, 1)])
    finally:
        await admin.close()
    fresh = await build_world(tmp_path)
    catalog = FileSystemCatalog("planner", str(tmp_path), LocalFileIO())
    clock = Manual()
    refresher = TableRefresher(catalog, refresh_interval_s=3600, clock=clock)
    await refresher.get("db.events")
    consumer = TableCommittedFeed(refresher, topic, {"bootstrap_servers": kafka_broker})
    await consumer.start()
    producer = AIOKafkaProducer(bootstrap_servers=kafka_broker)
    await producer.start()
    try:
        for _ in range(50):  # until the consumer has its partitions and is caught up
            await consumer.poll_once()
            if consumer.last_confirmed is not None:
                break
        assert consumer.last_confirmed is not None
        table, _ = await append(fresh.table, batch(800, 3, 0))
        event = TableCommitted(
            table="db.events",
            snapshot_id=table.metadata.current_snapshot().snapshot_id,  # type: ignore[union-attr]
            sequence_number=table.metadata.last_sequence_number,
            metadata_location=table.metadata_location,
            commit_ids=["k"],
            latency_ms=0,
        )
        await producer.send_and_wait(topic, event.encode(), key=b"db.events")
        for _ in range(100):
            await consumer.poll_once()
            if refresher.reloads["event"]:
                break
        state = await refresher.get("db.events")
        assert state.metadata_location == table.metadata_location
        assert refresher.reloads["request"] == 1  # only the first load went to the catalog
    finally:
        await producer.stop()
        await consumer.stop()


# ---------------------------------------------------------------------------------------------
# Plans, config and the OpenAPI document
# ---------------------------------------------------------------------------------------------


def test_plan_store_expiry_capacity_and_fetch_grace() -> None:
    clock = Manual()
    store = PlanStore(ttl_s=60, max_plans=2, clock=clock)

    class FakePlan:
        def __init__(self, n: int) -> None:
            self.n = n

        def __len__(self) -> int:
            return self.n

    ident = TableIdentifier.parse("db.t")
    big = store.add(ident, FakePlan(10), 3)  # type: ignore[arg-type]
    assert big.pages == 4 and big.tokens() == [f"{big.plan_id}:{i}" for i in (1, 2, 3)]
    small = store.add(ident, FakePlan(2), 3)  # type: ignore[arg-type]
    assert small.pages == 1 and small.tokens() == []
    third = store.add(ident, FakePlan(0), 3)  # type: ignore[arg-type]
    assert store.get(big.plan_id, ident) is None  # evicted: the store holds two
    assert store.get(third.plan_id, TableIdentifier.parse("db.other")) is None
    clock.now += store.FETCHED_GRACE_S + 1
    assert store.get(small.plan_id, ident) is None  # one page, served: kept only briefly
    fourth = store.add(ident, FakePlan(7), 3)
    for page in (1, 2):
        store.page_fetched(fourth, page)
    clock.now += store.FETCHED_GRACE_S + 1
    assert store.get(fourth.plan_id, ident) is None
    fifth = store.add(ident, FakePlan(7), 3)
    clock.now += 61
    assert store.get(fifth.plan_id, ident) is None
    assert not store.remove(fifth.plan_id, ident)


def test_config_from_environment_and_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    monkeypatch.setenv("ICEFLOE_PLANNER_CATALOG", "file:///tmp/wh")
    monkeypatch.setenv("ICEFLOE_PLANNER_TASKS_PER_PAGE", "50")
    monkeypatch.setenv("ICEFLOE_PLANNER_TOKEN", "t")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--tasks-per-page", "7", "--no-trust-events"])
    loaded = PlannerConfig.load(overrides_from_args(args))
    assert loaded.catalog == "file:///tmp/wh"
    assert loaded.tasks_per_page == 7 and loaded.trust_events is False
    assert loaded.token is not None and loaded.token.get_secret_value() == "t"
    with pytest.raises(Exception, match="ICEFLOE_PLANNER_TASKS_PER_PAGE"):
        PlannerConfig.load({"tasks_per_page": 0})
    with pytest.raises(Exception, match="ICEFLOE_PLANNER_BROKERS is not set"):
        PlannerConfig.load().kafka_options()
    sasl = PlannerConfig.load(
        {
            "brokers": "a:1, b:2",
            "sasl_mechanism": "PLAIN",
            "sasl_username": "u",
            "sasl_password": "p",
        }
    )
    options = sasl.kafka_options()
    assert options["bootstrap_servers"] == ["a:1", "b:2"]
    assert options["security_protocol"] == "SASL_PLAINTEXT"
    with pytest.raises(Exception, match="needs sasl_username"):
        PlannerConfig.load({"sasl_mechanism": "PLAIN"})


def test_the_served_openapi_document_describes_exactly_this_server() -> None:
    document = json.loads(OPENAPI_FILE.read_text())
    assert trim_openapi(document)["paths"] == document["paths"]  # trimming is idempotent
    for prefix, base in (("", "/v1/"), ("wh", "/v1/wh/")):
        served = served_openapi(document, prefix)
        expected = {(m.lower(), p.replace("/v1/{prefix}/", base)) for m, p in ENDPOINTS} | {
            ("get", "/v1/config")
        }
        got = {
            (method, path)
            for path, item in served["paths"].items()
            for method in item
            if method in ("get", "head", "post", "delete", "put")
        }
        assert got == expected
        assert not any("{prefix}" in path for path in served["paths"])
        assert "#/components/parameters/prefix" not in json.dumps(served["paths"])
        for ref in set(_all_refs(served)):
            section, name = ref.split("/")[2:4]
            assert name in served["components"][section], ref
    schema = document["components"]["schemas"]["PlanTableScanRequest"]["properties"]
    assert {"ref", "as-of-timestamp-ms", "snapshot-id", "stats-fields"} <= set(schema)


def _all_refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "$ref":
                yield v
            else:
                yield from _all_refs(v)
    elif isinstance(node, list):
        for v in node:
            yield from _all_refs(v)


# ---------------------------------------------------------------------------------------------
# Fuzzing: no input produces a 5xx
# ---------------------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda kids: (
        st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=6), kids, max_size=3)
    ),
    max_leaves=8,
)
columns = st.sampled_from(["id", "ts", "name", "category", "ID", "nope", ""])
literals = st.one_of(
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False),
    st.text(max_size=12),
    st.sampled_from(["2024-01-02", "2024-01-02T03:04:05", "2024-01-02T03:04:05+00:00", "12:00"]),
    st.booleans(),
    st.none(),
)
ops = st.sampled_from(
    [
        "lt",
        "lt-eq",
        "gt",
        "gt-eq",
        "eq",
        "not-eq",
        "starts-with",
        "not-starts-with",
        "in",
        "not-in",
        "is-null",
        "not-null",
        "is-nan",
        "not-nan",
        "bogus",
    ]
)


SANE: dict[str, st.SearchStrategy[Any]] = {
    "id": st.integers(-10, 100),
    "ts": st.sampled_from(["2024-01-01T05:00:00", "2024-01-02T00:00:00", "2023-12-31T23:59:59"]),
    "name": st.sampled_from(["n-01", "n-1", "", "zz"]),
    "category": st.integers(-1, 3),
}


@st.composite
def fuzzy_filters(draw: st.DrawFn, depth: int = 2) -> Any:
    """Filters that are mostly well formed (so planning runs) and sometimes anything."""
    kind = draw(st.integers(0, 7))
    if depth > 0 and kind == 0:
        return {
            "type": draw(st.sampled_from(["and", "or"])),
            "left": draw(fuzzy_filters(depth - 1)),
            "right": draw(fuzzy_filters(depth - 1)),
        }
    if depth > 0 and kind == 1:
        return {"type": "not", "child": draw(fuzzy_filters(depth - 1))}
    if kind == 2:
        return draw(json_values)
    op = draw(ops)
    if kind >= 4:
        column = draw(st.sampled_from(sorted(SANE)))
        out: dict[str, Any] = {"type": op, "term": column}
        if op in ("in", "not-in"):
            out["values"] = draw(st.lists(SANE[column], min_size=1, max_size=3))
        elif op not in ("is-null", "not-null", "is-nan", "not-nan"):
            out["value"] = draw(SANE[column])
        return out
    term: Any = draw(columns)
    if draw(st.booleans()):
        transform = draw(st.sampled_from(["bucket[4]", "day", "truncate[2]", "x"]))
        term = {"type": "transform", "transform": transform, "term": term}
    out = {"type": op, "term": term}
    if draw(st.booleans()):
        key = "values" if op in ("in", "not-in") else "value"
        out[key] = draw(st.lists(literals, max_size=3)) if key == "values" else draw(literals)
    return out


SELECTORS = [
    "select",
    "snapshot-id",
    "ref",
    "as-of-timestamp-ms",
    "case-sensitive",
    "use-snapshot-schema",
    "start-snapshot-id",
    "end-snapshot-id",
    "stats-fields",
    "min-rows-requested",
]


@st.composite
def plan_bodies(draw: st.DrawFn) -> Any:
    """Mostly plausible requests (a filter, perhaps a selector or two), sometimes junk."""
    if draw(st.integers(0, 9)) == 0:
        return draw(json_values)
    body: dict[str, Any] = {}
    if draw(st.integers(0, 3)):
        body["filter"] = draw(fuzzy_filters())
    for key in draw(st.sets(st.sampled_from(SELECTORS), max_size=2)):
        if key in ("select", "stats-fields"):
            body[key] = draw(st.lists(columns, max_size=3) | json_values)
        elif key == "ref":
            body[key] = draw(st.sampled_from(["first", "main", "nope", ""]) | json_values)
        else:
            body[key] = draw(st.none() | st.booleans() | st.integers(-(2**64), 2**64) | json_values)
    return body


@pytest.fixture(scope="module")
def server(world: World) -> Iterator[str]:
    """The planner on a real port, in its own thread and event loop."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    holder: dict[str, Any] = {}

    def run() -> None:
        asyncio.set_event_loop(loop)

        async def start() -> None:
            catalog = FileSystemCatalog("planner", str(world.warehouse), LocalFileIO())
            service = PlannerService(config(world, host="127.0.0.1", tasks_per_page=4), catalog)
            await service.start()
            holder["service"] = service

        loop.run_until_complete(start())
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=run, name="planner-under-test", daemon=True)
    thread.start()
    ready.wait()
    service: PlannerService = holder["service"]
    yield service.url
    asyncio.run_coroutine_threadsafe(service.stop(), loop).result()
    loop.call_soon_threadsafe(loop.stop)
    thread.join()
    loop.close()


@settings(
    max_examples=examples(150),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(plan_bodies())
def test_fuzzed_plan_requests_never_fail_on_the_server(server: str, body: Any) -> None:
    import requests

    # json.dumps writes NaN and Infinity as bare tokens: the server must refuse or handle them.
    response = requests.post(
        f"{server}{BASE}/plan",
        data=json.dumps(body),
        headers={"Content-Type": "application/json"},
        timeout=60,
    )
    assert response.status_code < 500, response.text
    payload = response.json()
    event(f"status {response.status_code}")
    if response.status_code == 200:
        assert payload["status"] == "completed"
    else:
        assert payload["error"]["code"] == response.status_code


def test_schemathesis_finds_no_server_errors(server: str) -> None:
    import requests
    import schemathesis

    document = requests.get(f"{server}/openapi.json", timeout=30).json()
    schema = schemathesis.openapi.from_dict(document)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) == len(ENDPOINTS) + 1
    session = requests.Session()
    failures: list[str] = []
    statuses: list[int] = []
    for operation in operations:

        @settings(
            max_examples=examples(25),
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
        )
        @given(case=operation.as_strategy())
        def exercise(case: Any) -> None:
            response = case.call(base_url=server, session=session, timeout=60)
            statuses.append(response.status_code)
            if response.status_code >= 500:
                failures.append(
                    f"{case.method} {case.formatted_path}: {response.status_code} {response.text[:300]}"
                )

        exercise()
    assert failures == []
    assert len(statuses) > 5 * len(operations)


# ---------------------------------------------------------------------------------------------
# icefloe scan
# ---------------------------------------------------------------------------------------------


def test_scan_prints_tasks_and_rows_with_deletes_applied(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    from icefloe.cli.main import main

    uri = f"file://{world.warehouse}"
    live = {f.file_path for f in world.files}
    assert main(["scan", "db.events", "--catalog", uri]) == 0
    tasks = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {t["data-file"]["file-path"] for t in tasks} == live
    with_deletes = [t for t in tasks if t["delete-files"]]
    assert [t["data-file"]["file-path"] for t in with_deletes] == list(world.deletes)
    assert main(["scan", "db.events", "--catalog", uri, "--limit", "2"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2

    expr = json.dumps({"type": "lt", "term": "id", "value": 30})
    assert main(["scan", "db.events", "--catalog", uri, "--filter", expr, "--rows"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    deleted = set()
    target = world.files[0]
    for pos in (0, 1):
        deleted.add(pq.read_table(target.file_path).column("id")[pos].as_py())
    assert sorted(r["id"] for r in rows) == sorted(set(range(30)) - deleted)
    assert (
        main(["scan", "db.events", "--catalog", uri, "--filter", expr, "--rows", "--select", "id"])
        == 0
    )
    assert all(set(json.loads(line)) == {"id"} for line in capsys.readouterr().out.splitlines())
    # the filter as people write it selects the same rows as its JSON form
    for written in ("id < 30", "30 > id and not id is null", "id between 0 and 29"):
        assert main(["scan", "db.events", "--catalog", uri, "--where", written, "--rows"]) == 0
        again = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert sorted(r["id"] for r in again) == sorted(r["id"] for r in rows), written
    first = str(world.snapshots[0])
    assert main(["scan", "db.events", "--catalog", uri, "--snapshot", first, "--rows"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 60
    assert main(["scan", "db.events", "--catalog", uri, "--since", first]) == 0
    since = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {t["data-file"]["spec-id"] for t in since} == {1}


def test_scan_reports_bad_input_in_one_line(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    from icefloe.cli.main import main

    uri = f"file://{world.warehouse}"
    bad = json.dumps({"type": "eq", "term": "nope", "value": 1})
    assert main(["scan", "db.events", "--catalog", uri, "--filter", bad]) == 1
    assert "no column 'nope'" in capsys.readouterr().err
    assert main(["scan", "db.events", "--catalog", uri, "--where", "id < 30 and"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("icefloe: error: filter: expected") and "position 11" in err
    assert main(["scan", "db.missing", "--catalog", uri]) == 1
    assert "does not exist" in capsys.readouterr().err
    assert main(["scan", "db.events", "--catalog", uri, "--until", "5"]) == 1
    assert "--until needs --since" in capsys.readouterr().err


async def test_scan_rows_apply_equality_deletes(tmp_path: Path) -> None:
    import argparse

    from icefloe.cli.scan import add_arguments, scan
    from icefloe.spec.partition import PartitionSpec

    catalog = FileSystemCatalog("eq", str(tmp_path), LocalFileIO())
    await catalog.create_namespace("db")
    table = await catalog.create_table("db.eq", SCHEMA)
    table, _ = await append(table, batch(0, 20, 0))
    ids = pa.table({"id": pa.array([3, 4, 99], pa.int64())})
    id_schema = Schema(SCHEMA.fields[0])
    written = await write_files(
        table.io,
        ids,
        f"{table.location}/deletes",
        schema=id_schema,
        spec=PartitionSpec.unpartitioned(),
    )
    delete = written[0].copy(content=DataFileContent.EQUALITY_DELETES, equality_ids=[1])
    table = await row_delta(table, [], [delete]).commit()
    table, _ = await append(table, batch(3, 2, 0))  # ids 3 and 4 again, after the delete
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    out = io.StringIO()
    await scan(catalog, parser.parse_args(["db.eq", "--rows"]), out)
    got = sorted(json.loads(line)["id"] for line in out.getvalue().splitlines())
    assert got == sorted([*(i for i in range(20) if i not in (3, 4)), 3, 4])


def test_the_planner_benchmark_runs_and_checks_its_plans_against_pyiceberg() -> None:
    from icefloe.dev.bench import BenchContext
    from icefloe.dev.bench_planner import planner_benchmark

    sizes = {"files-small": 20, "files-medium": 40, "files-large": 60, "entries-per-manifest": 25}
    ctx = BenchContext(quick=True, repeat=1, sizes=sizes)
    figures = planner_benchmark(ctx)
    names = [f.name for f in figures]
    assert len(names) == 3 * 3 * 3 + 1
    assert "20 selective warm" in names and "60 metrics-only cold" in names
    assert "40 full restarted" in names and "manifest decode (25 entries)" in names
    plans = [f for f in figures if not f.name.startswith("manifest decode")]
    assert all("pyiceberg plan_files" in f.peers for f in plans)
    (decode,) = [f for f in figures if f.name.startswith("manifest decode")]
    assert "pyiceberg manifest reader" in decode.peers
    assert sum("bytes per cached entry" in note for note in ctx.notes) == 3
