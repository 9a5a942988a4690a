"""Faults in Spark task attempts, injected from the tests: the shipped tasks only call a hook.

The tests' Spark session runs its Python workers from :mod:`task_faults_daemon`, and every
worker installs :class:`FirstAttemptFails` as its task hooks
(:func:`icefloe.spark.tasks.install_task_hooks`). Those do nothing unless a test asks, with
:func:`fault`, for the first attempt of one Spark partition to fail once its files are
complete: ``raise`` (the task raises) or ``crash`` (the worker exits without reporting, as on
a lost executor). Either leaves the attempt's files behind for the driver to clean up.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from icefloe.errors import IcefloeError
from icefloe.spark.tasks import TaskHooks, TaskInfo

FAULT_PROPERTY = "icefloe.test.fault"
"""The Spark local property that asks for a fault: ``raise:<partition>``, ``crash:<partition>``."""


class InjectedFault(IcefloeError):
    """The failure a ``raise`` fault makes a task attempt raise."""


class FirstAttemptFails(TaskHooks):
    """Fail the first attempt of the partition a fault names (``spec``, or else the Spark
    local property :data:`FAULT_PROPERTY` of the job)."""

    def __init__(self, spec: str | None = None) -> None:
        self.spec = spec

    def files_complete(self, info: TaskInfo) -> None:
        spec = self.spec if self.spec is not None else _local_property()
        if not spec or info.attempt_number != 0:
            return
        mode, _, target = spec.partition(":")
        if mode not in ("raise", "crash"):
            raise ValueError(f"{FAULT_PROPERTY}={spec!r}: expected raise:<n> or crash:<n>")
        if target.strip() != str(info.partition_id):
            return
        if mode == "crash":
            os._exit(17)  # the worker dies without reporting, as on a lost executor
        raise InjectedFault(
            f"fault injected ({spec}) in attempt 0 of Spark partition {info.partition_id}"
        )


def _local_property() -> str | None:
    from pyspark import TaskContext

    context = TaskContext.get()
    return None if context is None else context.getLocalProperty(FAULT_PROPERTY)


@contextmanager
def fault(spark: Any, spec: str) -> Iterator[None]:
    """Jobs started in the block fail the first attempt of the partition ``spec`` names."""
    spark.sparkContext.setLocalProperty(FAULT_PROPERTY, spec)
    try:
        yield
    finally:
        spark.sparkContext.setLocalProperty(FAULT_PROPERTY, None)
