"""Pages written ahead shared through a disk directory: served only whole and only for the
plan and page they were written for, deleted when taken or cancelled, within their budget,
and safe when two writers put the same page at once; and between two real planner processes
sharing a cache directory (a table of :mod:`icefloe.dev.bench_planner`'s generator)."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from test_planner import BASE

from hypothesis_budget import examples
from icefloe.dev.bench_planner import generate
from icefloe.dev.bench_planner_service import metric_value, register_table
from icefloe.planner.pages_ahead import PagesAhead
from icefloe.planner.shared_pages import DEFAULT_MAX_BYTES, SUFFIX, SharedPages

PLAN = "plan-id-one.signature"
OTHER = "plan-id-two.signature"
KEY = "0123456789abcdef"


def _files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*" + SUFFIX))


def test_a_page_put_is_taken_once_whole(tmp_path: Path) -> None:
    pages = SharedPages(tmp_path)
    body = b'{"file-scan-tasks":[]}' * 1000
    assert pages.put(PLAN, KEY, 3, body)
    assert pages.has(KEY, 3) and not pages.has(KEY, 4)
    assert pages.take(PLAN, KEY, 3) == body
    assert pages.take(PLAN, KEY, 3) is None  # taken: a retry writes it again
    assert _files(tmp_path) == []
    assert not list(tmp_path.glob("*.tmp"))


def test_a_page_is_never_served_for_another_plan_or_page(tmp_path: Path) -> None:
    pages = SharedPages(tmp_path)
    assert pages.put(PLAN, KEY, 1, b"{}")
    # Another plan id under the same key (the name's digest) is refused and the file dropped.
    assert pages.take(OTHER, KEY, 1) is None
    assert _files(tmp_path) == []
    # A file renamed to another page's name is refused too.
    assert pages.put(PLAN, KEY, 1, b"{}")
    (src,) = _files(tmp_path)
    src.rename(src.with_name(src.name.replace("-1" + SUFFIX, "-2" + SUFFIX)))
    assert pages.take(PLAN, KEY, 2) is None


@given(st.binary(min_size=1, max_size=400), st.data())
@settings(max_examples=examples(40), deadline=None)
def test_a_damaged_or_truncated_page_is_dropped_never_served(
    body: bytes, data: st.DataObject
) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        pages = SharedPages(d)
        assert pages.put(PLAN, KEY, 1, body)
        (path,) = _files(Path(d))
        raw = bytearray(path.read_bytes())
        if data.draw(st.booleans(), label="truncate"):
            cut = data.draw(st.integers(0, len(raw) - 1), label="cut")
            raw = raw[:cut]
        else:
            at = data.draw(st.integers(0, len(raw) - 1), label="at")
            raw[at] ^= data.draw(st.integers(1, 255), label="flip")
        path.write_bytes(bytes(raw))
        assert pages.take(PLAN, KEY, 1) is None
        assert _files(Path(d)) == []
        assert pages.damaged == 1


def test_temporary_files_of_a_writer_are_never_read(tmp_path: Path) -> None:
    pages = SharedPages(tmp_path)
    # What a writer killed before its rename leaves: not under a page's name.
    (tmp_path / "abc.tmp").write_bytes(b"partial")
    assert pages.take(PLAN, KEY, 1) is None
    assert not pages.has(KEY, 1)


def test_the_directory_stays_within_its_budget_counting_other_writers(tmp_path: Path) -> None:
    budget = 64 << 10
    mine, theirs = SharedPages(tmp_path, budget), SharedPages(tmp_path, budget)
    body = os.urandom(5000)
    for page in range(60):
        writer = mine if page % 2 else theirs
        assert writer.put(PLAN, KEY, page, body)
        assert sum(p.stat().st_size for p in _files(tmp_path)) <= budget + len(body) + 100
    # The newest pages are kept, whole.
    assert mine.take(PLAN, KEY, 59) == body
    assert not mine.put(PLAN, KEY, 99, b"x" * budget)  # larger than the budget alone


def test_two_writers_of_the_same_page_leave_one_whole_page(tmp_path: Path) -> None:
    pages = [SharedPages(tmp_path) for _ in range(4)]
    body = os.urandom(200_000)
    start = threading.Barrier(len(pages))

    def put(p: SharedPages) -> None:
        start.wait()
        for _ in range(10):
            assert p.put(PLAN, KEY, 7, body)

    threads = [threading.Thread(target=put, args=(p,)) for p in pages]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert pages[0].take(PLAN, KEY, 7) == body
    assert _files(tmp_path) == [] and not list(tmp_path.glob("*.tmp"))


def test_pages_are_shared_only_beside_a_disk_cache_with_room(tmp_path: Path) -> None:
    assert SharedPages.beside(None, 1 << 30) is None
    assert SharedPages.beside(str(tmp_path), 0) is None  # the disk cache is turned off
    small = SharedPages.beside(str(tmp_path), 1 << 20)
    assert small is not None and small.max_bytes == 1 << 20
    assert small.directory == tmp_path / "plan-pages"
    large = SharedPages.beside(str(tmp_path), 1 << 40)
    assert large is not None and large.max_bytes == DEFAULT_MAX_BYTES


def test_a_cancelled_plans_pages_are_deleted(tmp_path: Path) -> None:
    pages = SharedPages(tmp_path)
    for page in (1, 2):
        assert pages.put(PLAN, KEY, page, b"{}")
    assert pages.put(OTHER, "fedcba9876543210", 1, b"{}")
    pages.forget(KEY)
    assert not pages.has(KEY, 1) and not pages.has(KEY, 2)
    assert pages.take(OTHER, "fedcba9876543210", 1) == b"{}"


class _Plan:
    """Stands for a held plan (PagesAhead references plans weakly)."""


async def test_a_page_written_ahead_by_one_process_is_taken_by_another(tmp_path: Path) -> None:
    writer = PagesAhead(2, 1 << 20, SharedPages(tmp_path))
    reader = PagesAhead(2, 1 << 20, SharedPages(tmp_path))
    plan = _Plan()

    async def write() -> bytes:
        return b'{"file-scan-tasks":[1]}'

    writer.start(KEY, plan, 1, write, PLAN)
    while not writer.shared.has(KEY, 1):  # type: ignore[union-attr]
        await asyncio.sleep(0.01)
    # The other process does not hold the plan: it takes the page from the directory.
    assert await reader.take_shared(OTHER, KEY, 1) is None  # not for another plan id
    writer.start(KEY, plan, 1, write, PLAN)
    while not writer.shared.has(KEY, 1):  # type: ignore[union-attr]
        await asyncio.sleep(0.01)
    assert await reader.take(KEY, _Plan(), 1, PLAN) == b'{"file-scan-tasks":[1]}'
    assert reader.shared_used == 1
    # Already written ahead by another process: not written again here.
    assert writer.shared.put(PLAN, KEY, 1, b"{}")  # type: ignore[union-attr]
    writer.start(KEY, plan, 1, write, PLAN)
    assert len(writer) == 0
    await writer.forget(KEY)
    assert not writer.shared.has(KEY, 1)  # type: ignore[union-attr]
    await writer.close()
    await reader.close()


async def test_only_page_1_and_pages_of_plans_spread_over_processes_go_to_disk(
    tmp_path: Path,
) -> None:
    """A client on one connection takes every page from the memory of the process that
    planned: putting its pages on disk would be wasted work."""
    ahead = PagesAhead(2, 1 << 20, SharedPages(tmp_path))
    plan = _Plan()

    async def write() -> bytes:
        return b"{}"

    async def written(page: int) -> bool:
        ahead.start(KEY, plan, page, write, PLAN)
        entry = ahead._entries[KEY]
        await entry.task
        await asyncio.gather(*ahead._disk)
        return ahead.shared.has(KEY, page)  # type: ignore[union-attr]

    assert await written(1)  # the fetch after the plan request may land anywhere
    assert await ahead.take(KEY, plan, 1, PLAN) == b"{}"
    assert not await written(2)  # served here in order: memory only
    assert await ahead.take(KEY, plan, 2, PLAN) == b"{}"
    assert not await written(3)
    # Page 4 asked while page 3 waits ahead: another process served page 3.
    assert await ahead.take(KEY, plan, 4, PLAN) is None
    assert await written(5)
    await ahead.close()


async def test_a_page_taken_from_memory_is_deleted_from_the_directory(tmp_path: Path) -> None:
    ahead = PagesAhead(2, 1 << 20, SharedPages(tmp_path))
    plan = _Plan()

    async def write() -> bytes:
        return b"{}"

    ahead.start(KEY, plan, 1, write, PLAN)
    while not ahead.shared.has(KEY, 1):  # type: ignore[union-attr]
        await asyncio.sleep(0.01)
    assert await ahead.take(KEY, plan, 1, PLAN) == b"{}"
    await ahead.close()  # waits for the deletion in its worker thread
    assert _files(tmp_path) == []


# ---------------------------------------------------------------------------------------------
# Two planner processes sharing one cache directory
# ---------------------------------------------------------------------------------------------


async def _wait_for_pages(directory: Path, page: int = 1) -> list[Path]:
    for _ in range(1200):
        found = [p for p in _files(directory) if p.name.endswith(f"-{page}{SUFFIX}")]
        if found:
            return found
        await asyncio.sleep(0.05)
    raise AssertionError(f"no page was written ahead into {directory}")


async def _post(session: Any, url: str, body: dict[str, Any]) -> tuple[int, bytes]:
    async with session.post(url, json=body) as r:
        return r.status, await r.read()


async def _metric(session: Any, url: str, name: str) -> float:
    async with session.get(url + "/metrics") as r:
        return metric_value(await r.text(), name)


async def test_two_planner_processes_share_pages_written_ahead(tmp_path: Path) -> None:
    """Process A plans and writes page 1 ahead into the shared directory; process B, which
    never planned the scan, serves it from there (byte-identical to what B writes itself
    once it plans); a cancelled plan's pages are not served, even a file a racing writer
    left behind; a damaged page file is ignored and the page written again."""
    import aiohttp
    from planner_process import planner_process

    # Pages of a filtered plan of a generated table: written by the column writer, the pages
    # worth writing ahead (a few tasks, or slices of texts already written, are not).
    warehouse = tmp_path / "warehouse"
    generate(warehouse / "db", 240, 60, "events")
    await register_table(warehouse)
    request = {"filter": {"type": "not-null", "term": "user_id"}}
    cache = tmp_path / "cache"
    pages = cache / "plan-pages"
    settings = {
        "tasks_per_page": "40",
        "cache_dir": str(cache),
        "plan_secret": "a secret the two processes share",
        "access_log": "false",
    }
    async with (
        aiohttp.ClientSession() as session,
        planner_process(warehouse, session, **settings) as (a, _),
        planner_process(warehouse, session, **settings) as (b, _),
    ):

        async def plan_on_a() -> list[str]:
            status, raw = await _post(session, a + BASE + "/plan", request)
            assert status == 200, raw
            tokens: list[str] = json.loads(raw)["plan-tasks"]
            assert len(tokens) >= 2
            return tokens

        # 1. Written ahead by A, served by B without planning.
        tokens = await plan_on_a()
        await _wait_for_pages(pages)
        status, shared = await _post(session, b + BASE + "/tasks", {"plan-task": tokens[0]})
        assert status == 200, shared
        assert await _metric(session, b, "icefloe_planner_pages_shared_used_total") == 1
        assert await _metric(session, b, "icefloe_planner_plans") == 0  # B planned nothing
        assert _files(pages) == []  # taken
        status, written = await _post(session, b + BASE + "/tasks", {"plan-task": tokens[0]})
        assert status == 200 and written == shared  # B planned and wrote it: the same bytes
        assert await _metric(session, b, "icefloe_planner_plans") == 1
        for page_file in await _wait_for_pages(pages, 2):  # B holds the plan: page 2 ahead
            page_file.unlink()

        # 2. A cancelled plan's pages are not served, not even a file left behind.
        tokens = await plan_on_a()
        (page_file,) = await _wait_for_pages(pages)
        left_behind = page_file.read_bytes()
        async with session.delete(a + BASE + "/plan/" + tokens[0].rpartition(":")[0]) as r:
            assert r.status == 204
        assert _files(pages) == []  # deleted with the cancel
        page_file.write_bytes(left_behind)  # as a writer racing the cancel would leave it
        status, raw = await _post(session, b + BASE + "/tasks", {"plan-task": tokens[0]})
        assert status == 404, raw
        assert b"cancelled" in raw
        assert page_file.exists()  # never read; the budget evicts it

        page_file.unlink()
        # 3. A damaged page file is ignored (and dropped): B plans and writes the page.
        tokens = await plan_on_a()
        (page_file,) = await _wait_for_pages(pages)
        raw_page = bytearray(page_file.read_bytes())
        raw_page[-2] ^= 0x20
        page_file.write_bytes(bytes(raw_page))
        used = await _metric(session, b, "icefloe_planner_pages_shared_used_total")
        status, from_b = await _post(session, b + BASE + "/tasks", {"plan-task": tokens[0]})
        assert status == 200, from_b
        assert await _metric(session, b, "icefloe_planner_pages_shared_used_total") == used
        # A holds the plan and serves the page it wrote ahead: the bytes B wrote.
        status, from_a = await _post(session, a + BASE + "/tasks", {"plan-task": tokens[0]})
        assert status == 200 and from_a == from_b
