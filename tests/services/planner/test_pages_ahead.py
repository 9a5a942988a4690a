# ruff: noqa: F811  (pytest fixtures imported from test_planner are parameters here)
"""Pages written ahead of their fetch: the same bytes as a page written when asked for, used
by a client that fetches one page after another, bounded, and dropped with their plan.

The service tests use the ``world`` table and ``make_client`` fixture of ``test_planner``;
its pages are a few tasks, so the threshold below which pages are written inline (and never
ahead) is lowered to zero for them.
"""

from __future__ import annotations

import asyncio
import gc
import json
from typing import Any

import pytest
from test_planner import BASE, World, make_client, plan, world  # noqa: F401

from icefloe.planner import plan_routes
from icefloe.planner.pages_ahead import PagesAhead


@pytest.fixture
def every_page_ahead(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plan_routes, "INLINE_PAGE_TASKS", 0)


async def _page(client: Any, token: str) -> bytes:
    response = await client.post(BASE + "/tasks", json={"plan-task": token})
    assert response.status == 200, await response.text()
    body: bytes = await response.read()
    return body


async def test_a_client_reading_pages_in_order_gets_them_written_ahead(
    make_client: Any, world: World, every_page_ahead: None
) -> None:
    client, service = await make_client(tasks_per_page=2)
    first = await (await plan(client, {})).json()
    tokens = first["plan-tasks"]
    assert len(tokens) >= 3
    ahead = [await _page(client, token) for token in tokens]
    assert service.ahead.used == len(tokens)  # every page after the first
    # Asked for again, each page is written when asked for (the page ahead is another one):
    # the same bytes.
    used = service.ahead.used
    for token, body in zip(tokens, ahead, strict=True):
        assert await _page(client, token) == body
    assert service.ahead.used == used
    paths = {t["data-file"]["file-path"] for t in first["file-scan-tasks"]}
    for body in ahead:
        paths |= {p.decode() for p in _paths(body)}
    assert paths == {f.file_path for f in world.files}


def _paths(body: bytes) -> list[bytes]:
    return [t["data-file"]["file-path"].encode() for t in json.loads(body)["file-scan-tasks"]]


async def test_cancelling_a_plan_drops_its_page_ahead(
    make_client: Any, every_page_ahead: None
) -> None:
    client, service = await make_client(tasks_per_page=2)
    first = await (await plan(client, {})).json()
    assert len(service.ahead) == 1  # page 1, started when the first page was served
    assert (await client.delete(f"{BASE}/plan/{first['plan-id']}")).status == 204
    assert len(service.ahead) == 0 and service.ahead.nbytes == 0


async def test_pages_are_not_written_ahead_when_cheap_to_write_when_asked_for(
    make_client: Any,
) -> None:
    client, service = await make_client(tasks_per_page=2)  # two-task pages: written inline
    first = await (await plan(client, {})).json()
    for token in first["plan-tasks"]:
        await _page(client, token)
    assert len(service.ahead) == 0 and service.ahead.used == 0


# ---------------------------------------------------------------------------------------------
# PagesAhead on its own
# ---------------------------------------------------------------------------------------------


class _Plan:
    """Stands for a held plan: pages ahead hold their plan weakly and match it by identity."""


def _writer(body: bytes, started: list[bytes] | None = None) -> Any:
    async def write() -> bytes:
        if started is not None:
            started.append(body)
        await asyncio.sleep(0)
        return body

    return write


async def test_a_page_ahead_is_given_only_for_its_own_plan_and_page() -> None:
    ahead = PagesAhead(max_pages=4, max_bytes=1 << 20)
    plan, other = _Plan(), _Plan()
    ahead.start("k", plan, 3, _writer(b"page three"))
    assert await ahead.take("k", plan, 4) is None  # another page: kept for its fetch
    assert len(ahead) == 1
    assert await ahead.take("k", plan, 3) == b"page three"
    assert len(ahead) == 0 and ahead.used == 1
    ahead.start("k", plan, 5, _writer(b"page five"))
    assert await ahead.take("k", other, 5) is None  # planned again: not this plan's page
    assert len(ahead) == 0


async def test_a_dropped_plan_is_not_kept_alive_by_its_page_ahead() -> None:
    ahead = PagesAhead(max_pages=4, max_bytes=1 << 20)
    plan = _Plan()
    ahead.start("k", plan, 1, _writer(b"body"))
    await asyncio.sleep(0.01)
    del plan
    gc.collect()
    assert await ahead.take("k", _Plan(), 1) is None
    assert len(ahead) == 0 and ahead.nbytes == 0


async def test_pages_ahead_are_bounded_in_count_and_bytes() -> None:
    ahead = PagesAhead(max_pages=2, max_bytes=15)
    plans = [_Plan() for _ in range(3)]
    for i, p in enumerate(plans):
        ahead.start(f"k{i}", p, 1, _writer(b"0123456789"))
    assert len(ahead) == 2  # the oldest was dropped
    for _ in range(3):
        await asyncio.sleep(0)
    await asyncio.sleep(0.01)
    assert len(ahead) == 1 and ahead.nbytes == 10  # two written bodies exceed 15 bytes
    assert await ahead.take("k2", plans[2], 1) == b"0123456789"
    assert ahead.nbytes == 0


async def test_a_failed_write_ahead_leaves_the_page_to_its_fetch() -> None:
    ahead = PagesAhead(max_pages=2, max_bytes=1 << 20)
    plan = _Plan()

    async def broken() -> bytes:
        raise ValueError("the plan's manifest is unreadable")

    ahead.start("k", plan, 1, broken)
    assert await ahead.take("k", plan, 1) is None
    assert len(ahead) == 0


async def test_a_newer_page_ahead_replaces_the_older_and_close_cancels_writes() -> None:
    ahead = PagesAhead(max_pages=2, max_bytes=1 << 20)
    plan = _Plan()
    gate = asyncio.Event()

    async def slow() -> bytes:
        await gate.wait()
        return b"never"

    ahead.start("k", plan, 1, slow)
    ahead.start("k", plan, 2, _writer(b"two"))
    assert len(ahead) == 1
    assert await ahead.take("k", plan, 1) is None
    assert await ahead.take("k", plan, 2) == b"two"
    ahead.start("k", plan, 3, slow)
    await ahead.close()
    assert len(ahead) == 0
