"""A real planner process keeps answering ``/healthz`` while hostile plan requests run.

A plan request may carry a filter that costs seconds to parse, bind, project and test: an
``in`` list of tens of thousands of strings (most of the 1 MiB body limit), or an AND chain
800 levels deep. The planner must do that work off its event loop, so the probes of its
orchestrator keep being answered, and must still answer those requests correctly: the files
it plans are those icefloe plans locally for the same filter. Timing is not asserted (a
shared machine); ``/healthz`` is polled from its own thread and connection while the hostile
plans are in flight, and every probe must be answered 200.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import aiohttp
from planner_process import planner_process

from icefloe.catalog_fs import FileSystemCatalog
from icefloe.dev.bench_planner import generate
from icefloe.expression_json import parse_expression
from icefloe.fileio import LocalFileIO
from icefloe.manifest_cache import ManifestCache
from icefloe.scan import plan_scan

TABLE = "/v1/namespaces/db/tables/events"
FILES = 100


def huge_in_list(values: int) -> dict[str, Any]:
    names = [f"event-{i:07d}-with-some-padding" for i in range(values)]
    return {"type": "in", "term": "event", "values": names}


def deep_and_chain(depth: int) -> dict[str, Any]:
    expression: dict[str, Any] = {"type": "gt-eq", "term": "id", "value": 0}
    for i in range(depth):
        right = {"type": "not-eq", "term": "id", "value": -1 - i}
        expression = {"type": "and", "left": expression, "right": right}
    return expression


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


async def _plan_paths(session: Any, url: str, body: dict[str, Any]) -> set[str]:
    async with session.post(url + TABLE + "/plan", json=body) as response:
        assert response.status == 200, (await response.text())[:500]
        first = await response.json()
    paths = {t["data-file"]["file-path"] for t in first["file-scan-tasks"]}
    for token in first.get("plan-tasks", []):
        async with session.post(url + TABLE + "/tasks", json={"plan-task": token}) as response:
            assert response.status == 200
            page = await response.json()
        paths |= {t["data-file"]["file-path"] for t in page["file-scan-tasks"]}
    return paths


async def test_healthz_is_answered_while_hostile_plans_run_and_they_are_right(
    tmp_path: Path,
) -> None:
    warehouse = tmp_path / "warehouse"
    generate(warehouse / "db", FILES, 20, "events")
    catalog = FileSystemCatalog("t", str(warehouse), LocalFileIO())
    filters = [huge_in_list(20_000), deep_and_chain(800)]
    try:
        await catalog.create_namespace("db")
        table = await catalog.load_table("db.events")
        expected = []
        for expression in filters:
            local = await plan_scan(
                table.metadata, ManifestCache(table.io), row_filter=parse_expression(expression)
            )
            expected.append({task.data_file.file_path for task in local.tasks()})
    finally:
        await catalog.close()
    assert len(expected[1]) == FILES  # the chain selects everything; the list nothing or some
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
        try:
            probe.in_flight.set()
            bodies = [{"filter": filters[i % 2]} for i in range(4)]
            results = await asyncio.gather(*(_plan_paths(session, url, b) for b in bodies))
            probe.in_flight.clear()
        finally:
            probe.stop.set()
            await asyncio.to_thread(probe.join)
        for body, paths in zip(bodies, results, strict=True):
            assert paths == expected[filters.index(body["filter"])]
    assert probe.during, "no /healthz probe was answered while the hostile plans ran"
    assert set(probe.statuses) == {200}
