"""What every Spark task of icefloe shares: who it is, its hooks, and its own storage.

Everything here executes in Spark's Python workers, far from the driver: no Kafka, no
catalog, no event loop borrowed from the driver. A task gets a small, picklable job
description (:class:`~icefloe.spark.write_tasks.WriteJob`,
:class:`~icefloe.spark.read_tasks.ReadJob`) whose schema and spec travel as JSON,
talks to storage through its own :class:`~icefloe.io.fileio.FileIO` on an event loop it owns
for the task's lifetime, and hands back plain Arrow record batches.

Why a module: writing tasks (:mod:`icefloe.spark.write_tasks`) and reading tasks
(:mod:`icefloe.spark.read_tasks`) share what makes a function a task here: who the task is
(:class:`TaskInfo`), the hooks tests install in the workers (:class:`TaskHooks`), storage
opened from inside the task (:class:`TaskIO`) and the job description's JSON.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from icefloe.io.fileio import FileIO, load_file_io, parse_location
from icefloe.spec.schema import Schema

OUTPUT_BATCH_ROWS = 65_536
"""Rows per Arrow batch a task hands back to Spark."""


# ---------------------------------------------------------------------------------------
# Task identity and hooks
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TaskInfo:
    """Which Spark task attempt is running (all zeros outside Spark)."""

    partition_id: int = 0
    attempt_number: int = 0
    task_attempt_id: int = 0
    stage_id: int = 0

    @classmethod
    def current(cls) -> TaskInfo:
        from pyspark import TaskContext

        context = TaskContext.get()
        if context is None:
            return cls()
        return cls(
            partition_id=context.partitionId(),
            attempt_number=context.attemptNumber(),
            task_attempt_id=context.taskAttemptId(),
            stage_id=context.stageId(),
        )


class TaskHooks:
    """What a task tells an observer in its Python worker; this one does nothing.

    Tests install others with :func:`install_task_hooks` in the workers (through a PySpark
    daemon of their own) to fail a task attempt at a chosen point.
    """

    def files_complete(self, info: TaskInfo) -> None:
        """A task attempt's files are complete and about to be reported to the driver."""


_hooks = TaskHooks()


def install_task_hooks(hooks: TaskHooks) -> TaskHooks:
    """Make ``hooks`` this process's task hooks; returns the ones they replace."""
    global _hooks
    previous, _hooks = _hooks, hooks
    return previous


def task_hooks() -> TaskHooks:
    """This process's task hooks."""
    return _hooks


# ---------------------------------------------------------------------------------------
# Storage from inside a task
# ---------------------------------------------------------------------------------------


def is_local(location: str) -> bool:
    return parse_location(location)[0] == "file"


class TaskIO:
    """A FileIO with an event loop of its own, for synchronous task code.

    Local files bypass the FileIO: the Parquet writer and reader use the path directly,
    which avoids holding a whole file in memory. Everything else goes through the FileIO.
    """

    def __init__(self, location: str, properties: Mapping[str, str]) -> None:
        self._location = location
        self._properties = dict(properties)
        self._runner: asyncio.Runner | None = None
        self._io: FileIO | None = None

    def _call(self, coro_factory: Any) -> Any:
        if self._runner is None:
            self._runner = asyncio.Runner()
        if self._io is None:
            self._io = load_file_io(self._location, self._properties)
        io_ = self._io
        return self._runner.run(coro_factory(io_))

    def upload(self, location: str, data: bytes) -> None:
        self._call(lambda io_: io_.write(location, data))

    def read(self, location: str) -> bytes:
        result: bytes = self._call(lambda io_: io_.read(location))
        return result

    def delete(self, location: str) -> None:
        if is_local(location):
            with contextlib.suppress(FileNotFoundError):
                os.remove(parse_location(location)[2])
            return
        self._call(lambda io_: io_.delete(location))

    def read_range(self, location: str, start: int, length: int) -> bytes:
        """``length`` bytes at ``start`` (deletion vectors are read this way, not whole)."""
        if is_local(location):
            with open(parse_location(location)[2], "rb") as f:
                f.seek(start)
                return f.read(length)
        result: bytes = self._call(lambda io_: io_.read_range(location, start, length))
        return result

    def source(self, location: str) -> str | bytes:
        """What :func:`~icefloe.parquet.files.read_data_file` should read for ``location``."""
        return parse_location(location)[2] if is_local(location) else self.read(location)

    def close(self) -> None:
        try:
            if self._io is not None and self._runner is not None:
                io_, self._io = self._io, None
                self._runner.run(io_.close())
        finally:
            if self._runner is not None:
                self._runner.close()
                self._runner = None


@lru_cache(maxsize=64)
def schema_from_json(text: str) -> Schema:
    """A job description's schema (parsed once per worker and schema)."""
    return Schema.from_json(json.loads(text))


__all__ = [
    "OUTPUT_BATCH_ROWS",
    "TaskHooks",
    "TaskIO",
    "TaskInfo",
    "install_task_hooks",
    "is_local",
    "schema_from_json",
    "task_hooks",
]
