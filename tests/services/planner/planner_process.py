"""``icefloe planner`` in a process of its own, for tests that need a real one."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from icefloe.dev.bench_planner_service import wait_healthy
from icefloe.dev.local_stack import free_port


@asynccontextmanager
async def planner_process(
    warehouse: Path, session: Any, *, attempts: int = 600, **settings: str
) -> AsyncIterator[tuple[str, asyncio.subprocess.Process]]:
    """A planner over the file-system catalog at ``warehouse``, with ``settings`` as
    ``ICEFLOE_PLANNER_<NAME>`` variables; yields its URL, once ``/healthz`` answers on
    ``session``, and the process. Stopped with SIGTERM, which it must exit cleanly on, unless the
    test killed it."""
    port = free_port()
    env = {
        **os.environ,
        "ICEFLOE_PLANNER_CATALOG": f"file://{warehouse}",
        "ICEFLOE_PLANNER_HOST": "127.0.0.1",
        "ICEFLOE_PLANNER_PORT": str(port),
        **{f"ICEFLOE_PLANNER_{name.upper()}": value for name, value in settings.items()},
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "icefloe.cli", "planner", env=env
    )
    url = f"http://127.0.0.1:{port}"
    try:
        await wait_healthy(session, url, attempts=attempts)
        yield url, process
    finally:
        if process.returncode is None:  # a test may have killed it
            process.send_signal(signal.SIGTERM)
            assert await process.wait() == 0
