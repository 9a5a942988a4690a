"""A real planner process holding many plans keeps cache and plans within one budget.

The planner runs as ``icefloe planner`` in its own process over a generated table; full and
selective plans are asked (and held: their other pages are not fetched) until the oldest
must be dropped, then its ``/metrics`` must account for cache and plans within the budget
and every page of a dropped plan is still served, planned again from its token. RSS is not
asserted: it is too noisy on a shared machine (``make bench`` measures it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
from planner_process import planner_process

from icefloe.catalog.fs import FileSystemCatalog
from icefloe.dev.bench_planner import IDS_PER_FILE, generate
from icefloe.io.fileio import LocalFileIO

TABLE = "/v1/namespaces/db/tables/events"
FILES = 2000
BUDGET = 4 << 20
PLAN_SHARE = 256 << 10


def _ids(first_file: int, files: int) -> dict[str, Any]:
    """A filter selecting the ids of ``files`` files from ``first_file`` on."""
    lo = first_file * IDS_PER_FILE
    return {
        "type": "and",
        "left": {"type": "gt-eq", "term": "id", "value": lo},
        "right": {"type": "lt", "term": "id", "value": lo + files * IDS_PER_FILE},
    }


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(f"icefloe_planner_{name} "):
            return float(line.split()[1])
    raise AssertionError(f"/metrics has no icefloe_planner_{name}")


async def _all_paths(session: Any, url: str, first: dict[str, Any]) -> set[str]:
    paths = {t["data-file"]["file-path"] for t in first["file-scan-tasks"]}
    for token in first.get("plan-tasks", []):
        async with session.post(url + TABLE + "/tasks", json={"plan-task": token}) as r:
            assert r.status == 200, await r.text()
            paths |= {t["data-file"]["file-path"] for t in (await r.json())["file-scan-tasks"]}
    return paths


async def test_a_planner_process_holds_plans_within_its_memory_budget(tmp_path: Path) -> None:
    warehouse = tmp_path / "warehouse"
    generate(warehouse / "db", FILES, 100, "events")
    catalog = FileSystemCatalog("t", str(warehouse), LocalFileIO())
    try:
        await catalog.create_namespace("db")
        await catalog.load_table("db.events")
    finally:
        await catalog.close()
    settings = {
        "cache_max_bytes": str(BUDGET),
        "plan_max_bytes": str(PLAN_SHARE),
        "tasks_per_page": "40",
        "plan_secret": "memory test secret, sixteen bytes or more",
        "access_log": "false",
    }
    async with (
        aiohttp.ClientSession() as session,
        planner_process(warehouse, session, **settings) as (url, _),
    ):
        firsts = []
        for k in range(60):  # selective plans of 150 files, a full plan every tenth
            body = {} if k % 10 == 0 else {"filter": _ids((k * 97) % (FILES - 150), 150)}
            async with session.post(url + TABLE + "/plan", json=body) as r:
                assert r.status == 200, await r.text()
                firsts.append((body, await r.json()))
        async with session.get(url + "/metrics") as r:
            metrics = await r.text()
        memory = _metric(metrics, "memory_bytes")
        cache, outside = _metric(metrics, "cache_bytes"), _metric(metrics, "plan_bytes")
        assert memory == cache + outside and 0 < memory <= BUDGET
        assert outside <= PLAN_SHARE
        assert _metric(metrics, "plans_dropped_for_memory_total") > 0
        assert 0 < _metric(metrics, "plans") < len(firsts)
        # The oldest selective plan was dropped; its pages are planned again from their
        # tokens, and hold the files a plan of the same request selects now.
        body, first = firsts[1]
        again = await _all_paths(session, url, first)
        async with session.post(url + TABLE + "/plan", json=body) as r:
            fresh = await _all_paths(session, url, await r.json())
        assert again == fresh and len(fresh) >= 150
        async with session.get(url + "/metrics") as r:
            after = await r.text()
        assert _metric(after, "memory_bytes") <= BUDGET
        assert _metric(after, "plan_bytes") <= PLAN_SHARE
