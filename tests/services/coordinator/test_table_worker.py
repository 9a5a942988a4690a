"""The table worker's handling of file checks that run ahead of their events."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

from icefloe.coordinator.table_worker import _settle
from icefloe.errors import EventRejectedError


async def test_a_check_its_event_did_not_need_is_settled_without_a_never_retrieved_error() -> None:
    """An exact replay of files already in the table is acknowledged without awaiting the
    check that ran ahead of it; the check's rejection ("already in the table") must not
    surface as asyncio's "Task exception was never retrieved" error, and a check still
    running must stop."""
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    try:

        async def rejected() -> None:
            raise EventRejectedError("duplicate-file", "file is already in the table")

        finished = asyncio.ensure_future(rejected())
        running = asyncio.ensure_future(asyncio.sleep(3600))
        await asyncio.sleep(0)
        assert finished.done()
        _settle(finished)
        _settle(running)
        await asyncio.sleep(0)
        assert running.cancelled()
        del finished, running
        gc.collect()
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(previous)
    assert reported == []
