"""A real planner process keeps answering ``/healthz`` while hostile plan requests run.

A plan request may carry a filter that costs seconds to parse, bind, project and test: an
``in`` list of 100,000 strings (most of the 1 MiB body limit), an AND chain or a NOT/OR nest
800 levels deep, string literals of 600 kB (:data:`icefloe.dev.bench_planner_hostile.HOSTILE`).
The planner must do that work off its event loop, so the probes of its orchestrator keep
being answered, and must still answer those requests correctly: the files it plans are
those icefloe plans locally for the same filter, and a residual that is the request's
filter is left out of every task rather than repeated (the AND chain's was 56 kB a task).
A filter nested past the limit is a 400 naming it. Timing is not asserted (a shared
machine); ``/healthz`` is polled from its own thread and connection while the hostile plans
are in flight, and every probe must be answered 200.
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import aiohttp
from planner_process import planner_process

from icefloe.catalog.fs import FileSystemCatalog
from icefloe.dev.bench_planner import generate
from icefloe.dev.bench_planner_hostile import HOSTILE
from icefloe.expressions.json_form import parse_expression
from icefloe.io.fileio import LocalFileIO
from icefloe.manifests.cache import ManifestCache
from icefloe.scan.planning import plan_scan

TABLE = "/v1/namespaces/db/tables/events"
FILES = 100


class HealthProbe(threading.Thread):
    """Polls ``/healthz`` on its own loop and connection until stopped."""

    def __init__(self, url: str) -> None:
        super().__init__(name="healthz-probe", daemon=True)
        self.url = url
        self.statuses: list[int] = []
        self.stop = threading.Event()
        self.in_flight = threading.Event()  # set while hostile plans are being answered
        self.during: list[int] = []

    def run(self) -> None:
        async def poll() -> None:
            async with aiohttp.ClientSession() as session:
                while not self.stop.is_set():
                    try:
                        async with session.get(self.url + "/healthz") as response:
                            await response.read()
                            status = response.status
                    except aiohttp.ClientError:
                        status = -1  # not answered: fails the test
                    self.statuses.append(status)
                    if self.in_flight.is_set():
                        self.during.append(status)
                    await asyncio.sleep(0.02)

        asyncio.run(poll())


def _compact(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode("utf-8")


async def _plan_tasks(session: Any, url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    headers = {"Content-Type": "application/json"}
    async with session.post(url + TABLE + "/plan", data=_compact(body), headers=headers) as r:
        assert r.status == 200, (await r.text())[:500]
        first = await r.json()
    tasks = list(first["file-scan-tasks"])
    for token in first.get("plan-tasks", []):
        async with session.post(url + TABLE + "/tasks", json={"plan-task": token}) as response:
            assert response.status == 200
            page = await response.json()
        tasks += page["file-scan-tasks"]
    return tasks


async def test_healthz_is_answered_while_hostile_plans_run_and_they_are_right(
    tmp_path: Path,
) -> None:
    warehouse = tmp_path / "warehouse"
    generate(warehouse / "db", FILES, 20, "events")
    catalog = FileSystemCatalog("t", str(warehouse), LocalFileIO())
    filters = {kind: make() for kind, make in HOSTILE.items()}
    expected: dict[str, set[str]] = {}
    try:
        await catalog.create_namespace("db")
        table = await catalog.load_table("db.events")
        for kind, expression in filters.items():
            local = await plan_scan(
                table.metadata, ManifestCache(table.io), row_filter=parse_expression(expression)
            )
            expected[kind] = {task.data_file.file_path for task in local.tasks()}
    finally:
        await catalog.close()
    # The chains select everything (no file's metrics rule a conjunct out), the others none
    # or some; every kind's body fits the 1 MiB limit.
    assert len(expected["and-chain-800"]) == FILES
    assert all(len(_compact({"filter": f})) < 1 << 20 for f in filters.values())
    settings = {
        "plan_secret": "hostile plans test secret, 16 bytes or more",
        "access_log": "false",
        "tasks_per_page": "50",
    }
    async with (
        aiohttp.ClientSession() as session,
        planner_process(warehouse, session, **settings) as (url, _),
    ):
        probe = HealthProbe(url)
        probe.start()
        kinds = [*filters, *filters]
        try:
            probe.in_flight.set()
            results = await asyncio.gather(
                *(_plan_tasks(session, url, {"filter": filters[k]}) for k in kinds)
            )
            probe.in_flight.clear()
            # Written as text: encoding it from objects would meet this process's own limit.
            nots = 950
            too_deep = (
                '{"filter":'
                + '{"type":"not","child":' * nots
                + '{"type":"lt","term":"id","value":0}'
                + "}" * nots
                + "}"
            )
            async with session.post(url + TABLE + "/plan", data=too_deep.encode()) as r:
                refused, message = r.status, (await r.json())["error"]["message"]
        finally:
            probe.stop.set()
            await asyncio.to_thread(probe.join)
        for kind, tasks in zip(kinds, results, strict=True):
            assert {t["data-file"]["file-path"] for t in tasks} == expected[kind], kind
            # No partition field decides any of these filters' predicates: every task's
            # residual is the request's filter, which the spec lets a task leave out.
            assert not any("residual-filter" in t for t in tasks), kind
    assert refused == 400
    assert "900" in message and "MAX_FILTER_DEPTH" in message
    assert probe.during, "no /healthz probe was answered while the hostile plans ran"
    assert set(probe.statuses) == {200}
