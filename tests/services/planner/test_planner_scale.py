# ruff: noqa: F811  (pytest fixtures imported from test_planner are parameters here)
"""The planner as a scaled-out service: signed self-describing plan tokens any replica serves,
held plans within a memory budget, hostile tokens and names, request limits, the advertised
planning mode and endpoints, and JSON access logs.

Uses the ``world`` table and ``make_client`` fixture of ``test_planner`` (a real filesystem
catalog with two partition specs and a position delete).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from test_planner import BASE, World, all_tasks, error_of, make_client, plan, world  # noqa: F401

from icefloe.planner.tokens import PlanTokens, TokenError, parse_plan_task
from icefloe.runtime.logs import JsonLogFormatter
from icefloe.spec.metadata_builder import MetadataBuilder

SECRET = b"a shared secret for the replicas"


async def _pages(client: Any, tokens: list[str]) -> list[str]:
    paths = []
    for token in tokens:
        response = await client.post(BASE + "/tasks", json={"plan-task": token})
        assert response.status == 200, await response.text()
        paths += [t["data-file"]["file-path"] for t in (await response.json())["file-scan-tasks"]]
    return paths


async def test_any_replica_with_the_secret_serves_any_plan_task(
    make_client: Any, world: World
) -> None:
    a, _ = await make_client(tasks_per_page=4, plan_secret=SECRET)
    b, service_b = await make_client(tasks_per_page=4, plan_secret=SECRET)
    stranger, _ = await make_client(tasks_per_page=4, plan_secret=b"another secret entirely")
    first, tasks = await all_tasks(a, {"filter": {"type": "not-null", "term": "id"}})
    tokens = first["plan-tasks"]
    assert tokens
    expected = [t["data-file"]["file-path"] for t in tasks[4:]]
    assert await _pages(b, tokens) == expected  # planned again on b, same snapshot, same pages
    assert len(service_b.plans) == 1
    again = await (await b.get(f"{BASE}/plan/{first['plan-id']}")).json()
    assert again["file-scan-tasks"] == first["file-scan-tasks"]
    for client in (stranger,):
        await error_of(
            await client.post(BASE + "/tasks", json={"plan-task": tokens[0]}),
            404,
            "NoSuchPlanTaskException",
        )
    # Cancelling on a replica is honoured there.
    assert (await b.delete(f"{BASE}/plan/{first['plan-id']}")).status == 204
    await error_of(
        await b.post(BASE + "/tasks", json={"plan-task": tokens[0]}), 404, "NoSuchPlanTaskException"
    )


async def test_pages_come_from_the_planned_snapshot_after_a_commit(
    make_client: Any, world: World
) -> None:
    a, _ = await make_client(tasks_per_page=5, plan_secret=SECRET)
    first, tasks = await all_tasks(a, {"ref": "first"})
    b, _ = await make_client(tasks_per_page=5, plan_secret=SECRET)
    assert await _pages(b, first["plan-tasks"]) == [t["data-file"]["file-path"] for t in tasks[5:]]


async def test_forged_and_malformed_tokens_are_404_never_5xx(make_client: Any) -> None:
    client, _ = await make_client(tasks_per_page=2, plan_secret=SECRET)
    first = await (await plan(client, {})).json()
    plan_id = first["plan-id"]
    encoded, _, signature = plan_id.partition(".")
    flipped = ("A" if signature[0] != "A" else "B") + signature[1:]
    bad = [
        f"{plan_id}:²",
        f"{plan_id}:٣",
        f"{plan_id}:" + "9" * 5000,
        f"{plan_id}:0",
        f"{plan_id}:-1",
        f"{plan_id}:999",
        f"{plan_id}:",
        f"{encoded}.{flipped}:1",
        "x" * 20000 + ":1",
        "é.é:1",
        ":1",
        "nope",
    ]
    for token in bad:
        response = await client.post(BASE + "/tasks", json={"plan-task": token})
        message = await error_of(response, 404, "NoSuchPlanTaskException")
        assert len(message) < 500
    for plan_path in (f"{encoded}.{flipped}", "%C2%B2", "x" * 3000):
        await error_of(await client.get(f"{BASE}/plan/{plan_path}"), 404, "NoSuchPlanIdException")


def test_plan_task_parsing_takes_only_short_ascii_pages() -> None:
    assert parse_plan_task("abc.def:12") == ("abc.def", 12)
    for token in ("abc:²", "abc:٣", "abc:" + "1" * 10, "abc:1 ", "abc:+1", ":1", "abc"):
        with pytest.raises(TokenError):
            parse_plan_task(token)
    tokens = PlanTokens(SECRET)
    identity = tokens.issue(
        table="db\x1ft", request={"filter": None}, snapshot_id=5, page_size=7, expires_at=100.0
    )
    assert tokens.open(identity.plan_id, 99.0).snapshot_id == 5
    with pytest.raises(TokenError, match="expired"):
        tokens.open(identity.plan_id, 100.0)
    with pytest.raises(TokenError):
        PlanTokens(b"other secret").open(identity.plan_id, 0.0)
    huge = tokens.issue(
        table="db\x1ft",
        request={"filter": {"values": [str(i * 7919 % 10**9) for i in range(5000)]}},
        snapshot_id=None,
        page_size=7,
        expires_at=100.0,
    )
    assert huge.request is None and len(huge.plan_id) < 400  # too big to embed: local only


async def test_held_plans_stay_within_their_byte_budget_and_replan(
    make_client: Any, world: World
) -> None:
    # Full plans keep the cache's own manifests: held, however small the plans' share.
    client, service = await make_client(tasks_per_page=3, plan_secret=SECRET, plan_max_bytes=0)
    for _ in range(3):
        await (await plan(client, {})).json()
    assert len(service.plans) == 3 and service.plans.bytes == 0
    assert 0 < service.plans.pinned_bytes <= service.cache.stats().bytes  # lists too
    # A budget that holds no manifest holds no plan: each one serves its first page, and
    # its other pages are planned again from their tokens.
    client, service = await make_client(tasks_per_page=3, plan_secret=SECRET, cache_max_bytes=0)
    firsts = []
    for _ in range(3):
        first = await (await plan(client, {})).json()
        firsts.append(first)
    assert len(service.plans) == 0 and service.cache.stats().held_bytes == 0
    for first in firsts:  # yet every page of every plan is still served
        paths = await _pages(client, first["plan-tasks"])
        assert len(paths) == len(world.files) - 3


async def test_long_names_are_400_without_server_paths(make_client: Any, world: World) -> None:
    client, _ = await make_client()
    long = "n" * 256
    for path in (
        f"/v1/namespaces/{long}",
        f"/v1/namespaces/db/tables/{long}",
        f"/v1/namespaces/{long}/tables/t/plan",
        f"/v1/namespaces/{'é' * 128}",
    ):
        response = await (client.post(path, json={}) if path.endswith("plan") else client.get(path))
        message = await error_of(response, 400, "BadRequestException")
        assert "255 bytes" in message and str(world.warehouse) not in message


async def test_oversized_requests_are_413_with_the_limit_named(make_client: Any) -> None:
    client, _ = await make_client(max_request_bytes=4096)
    values = list(range(2000))
    body = {"filter": {"type": "in", "term": "id", "values": values}}
    message = await error_of(await plan(client, body), 413, "RequestEntityTooLargeException")
    assert "4096" in message and "MAX_REQUEST_BYTES" in message


async def test_planning_mode_per_planner_and_per_table(make_client: Any, world: World) -> None:
    client, _ = await make_client(scan_planning_mode="none")
    body = await (await client.get("/v1/config")).json()
    assert "scan-planning-mode" not in body["defaults"] and body["overrides"] == {}
    loaded = await (await client.get(BASE)).json()
    assert loaded["config"] == {}
    forced, _ = await make_client(scan_planning_mode="server", scan_planning_mode_forced=True)
    assert (await (await forced.get("/v1/config")).json())["overrides"] == {
        "scan-planning-mode": "server"
    }
    table = await world.catalog.load_table("db.events")
    updated = (
        MetadataBuilder(table.metadata)
        .set_properties({"scan-planning-mode": "client"})
        .build(table.metadata_location)
    )
    world.table = await world.catalog.commit(table, updated)
    try:
        fresh, _ = await make_client()
        assert (await (await fresh.get(BASE)).json())["config"] == {"scan-planning-mode": "client"}
    finally:
        table = await world.catalog.load_table("db.events")
        reverted = (
            MetadataBuilder(table.metadata)
            .remove_properties(["scan-planning-mode"])
            .build(table.metadata_location)
        )
        world.table = await world.catalog.commit(table, reverted)


async def test_endpoints_follow_the_registered_routes(make_client: Any) -> None:
    _, service = await make_client()
    app = service.app()

    async def create_namespace(request: web.Request) -> web.Response:
        return web.json_response({})

    app.router.add_post("/v1/namespaces", create_namespace)
    from aiohttp.test_utils import TestClient, TestServer

    async with TestClient(TestServer(app)) as client:
        body = await (await client.get("/v1/config")).json()
        assert "POST /v1/{prefix}/namespaces" in body["endpoints"]
        assert "GET /v1/{prefix}/namespaces" in body["endpoints"]
        await error_of(await client.delete("/v1/namespaces"), 406, "UnsupportedOperationException")


async def test_access_log_is_one_json_line_per_request(
    make_client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    client, _ = await make_client()
    with caplog.at_level(logging.INFO, logger="icefloe.access"):
        await client.get("/v1/namespaces")
        await client.get("/v1/namespaces/missing")
    records = [r for r in caplog.records if r.name == "icefloe.access"]
    lines = [json.loads(JsonLogFormatter().format(r)) for r in records]
    assert [(x["method"], x["status"]) for x in lines] == [("GET", 200), ("GET", 404)]
    assert lines[0]["route"] == "/v1/namespaces" and lines[0]["ms"] >= 0
    assert lines[0]["msg"].startswith("GET /v1/namespaces 200 ")


def test_the_service_benchmark_runs_every_client_level() -> None:
    from icefloe.dev.bench import BenchContext
    from icefloe.dev.bench_planner_service import (
        CLIENT_LEVELS,
        CONFIGURATIONS,
        planner_service_benchmark,
    )

    sizes = {"service-files": 60, "service-entries-per-manifest": 25, "service-level-ms": 1000}
    ctx = BenchContext(quick=True, repeat=1, sizes=sizes)
    import asyncio

    figures = asyncio.run(planner_service_benchmark(ctx))
    labels = [
        f"{w} process{'es' if w > 1 else ''} x {t} planning thread{'s' if t > 1 else ''}"
        for w, t in CONFIGURATIONS
    ]
    assert [f.name for f in figures] == [
        name
        for label in labels
        for name in [
            *(
                f"0k-file table, {label}, {n} clients, selective{per}"
                for n in CLIENT_LEVELS
                for per in ("", ", per planner CPU-second")
            ),
            f"0k-file table, {label}, full plan to the last page (REST, one page at a time)",
            f"0k-file table, {label}, full plan to the last page (REST, 4 fetchers)",
        ]
    ]
    assert all(f.icefloe.work >= 1 for f in figures if "selective" in f.name)
    levels = len(CONFIGURATIONS) * len(CLIENT_LEVELS)
    assert sum("/healthz p50" in note and " p99 " in note for note in ctx.notes) == levels
    assert sum("plans per planner CPU-second" in note for note in ctx.notes) == levels
    assert sum("serving event loops ran p50" in note for note in ctx.notes) == levels
    for how in ("one page at a time", "4 fetchers"):
        full = f"full plan over HTTP ({how}), 60 tasks"
        assert sum(full in note for note in ctx.notes) == len(labels)
    curves = [note for note in ctx.notes if "Held full plans" in note]
    assert len(curves) == len(labels)
    assert all(f"; {held}: " in note for note in curves for held in (10, 40, 100, 400))
    assert all("Overhead at most" in note for note in curves)


async def test_worker_processes_share_one_port_and_serve_each_others_tokens(
    world: World, tmp_path: Any
) -> None:
    """``--workers 2``: two processes behind one port (SO_REUSEPORT), sharing the disk cache
    and a plan secret, so every plan task is served whichever process gets the request."""

    import aiohttp
    from planner_process import planner_process

    async with (
        aiohttp.ClientSession() as session,
        planner_process(
            world.warehouse,
            session,
            attempts=300,
            workers="2",
            tasks_per_page="2",
            cache_dir=str(tmp_path / "cache"),
        ) as (url, process),
    ):
        listing = Path(f"/proc/{process.pid}/task/{process.pid}/children")
        if listing.exists():  # Linux: the supervisor's children are the workers
            assert len(listing.read_text().split()) >= 2
        for _ in range(4):  # new connections: the kernel spreads them over the workers
            async with session.post(url + BASE + "/plan", json={}) as r:
                first = await r.json()
            for token in first["plan-tasks"]:
                async with (
                    aiohttp.ClientSession() as fresh,
                    fresh.post(url + BASE + "/tasks", json={"plan-task": token}) as r,
                ):
                    assert r.status == 200, await r.text()
        assert any((tmp_path / "cache").glob("*.arrow"))
