"""A coordinator for tests that need one beside something else (a REST writer, Spark, a
maintenance schedule): settings on topics of their own, run in the caller's event loop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from icefloe.coordinator.config import CoordinatorConfig
from icefloe.coordinator.service import Coordinator


def coordinator_config(
    brokers: str, catalog: str, prefix: str, **changes: Any
) -> CoordinatorConfig:
    """Fast settings for tests, on the topics ``<prefix>.events``, ``.results``,
    ``.dead-letter`` and ``.maintenance`` and the group ``<prefix>-coordinator``."""
    values: dict[str, Any] = {
        "brokers": brokers,
        "catalog": catalog,
        "events_topic": f"{prefix}.events",
        "results_topic": f"{prefix}.results",
        "dead_letter_topic": f"{prefix}.dead-letter",
        "maintenance_topic": f"{prefix}.maintenance",
        "group_id": f"{prefix}-coordinator",
        "topic_partitions": 1,
        "session_timeout_ms": 2000,
        "http_port": 0,
        "http_host": "127.0.0.1",
        "batch_max_wait_ms": 20,
        "offset_commit_interval_ms": 100,
        "log_format": "text",
    }
    values.update(changes)
    return CoordinatorConfig(**values)


def raise_if_stopped(task: asyncio.Task[None]) -> None:
    """Fail with what stopped the coordinator's task, if it has stopped."""
    if task.done():
        task.result()  # raises what killed it
        raise AssertionError("the coordinator stopped on its own")


@contextlib.asynccontextmanager
async def running_coordinator(
    config: CoordinatorConfig,
) -> AsyncIterator[tuple[Coordinator, asyncio.Task[None]]]:
    """A coordinator running in this loop once it has joined its group; stopped cleanly."""
    coordinator = Coordinator(config)
    task = asyncio.create_task(coordinator.run())
    while not coordinator.ready:
        raise_if_stopped(task)
        await asyncio.sleep(0.05)
    try:
        yield coordinator, task
    finally:
        coordinator.request_stop()
        await task
