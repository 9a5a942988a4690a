"""The planner's worker threads run at a lower priority than its event loop when asked
(``ICEFLOE_PLANNER_PLANNING_THREAD_NICE``), so a busy machine answers ``/healthz`` first.

Linux schedules threads as tasks of their own, each with its nice value: the pool's
initializer raises each worker thread's, never the event-loop thread's. Checked on the
thread itself and on a real ``icefloe planner`` process through ``/proc``.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import aiohttp
import pytest
from planner_process import planner_process

from icefloe.planner.serving import lower_thread_priority, planning_executor

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="per-thread nice is Linux's")


def thread_nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def test_the_pool_threads_run_niced_and_the_calling_thread_does_not() -> None:
    base = thread_nice()
    with planning_executor(5) as pool:
        niced = {pool.submit(thread_nice).result() for _ in range(4)}
    assert niced == {min(19, base + 5)}
    assert thread_nice() == base


def test_nothing_changes_without_an_increment_and_nice_stops_at_19() -> None:
    base = thread_nice()
    with planning_executor(0) as pool:
        assert pool.submit(thread_nice).result() == base
    with planning_executor(40) as pool:
        assert pool.submit(thread_nice).result() == 19

    def twice() -> int:
        lower_thread_priority(3)
        lower_thread_priority(3)  # relative each time: the thread's own value, raised
        return thread_nice()

    with planning_executor(0) as pool:
        assert pool.submit(twice).result() == min(19, base + 6)


def task_nices(pid: int) -> dict[int, tuple[str, int]]:
    """tid → (thread name, nice) of every thread of ``pid``, from /proc."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        stat = (task / "stat").read_text()
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        out[int(task.name)] = (name, int(fields[16]))  # field 19 of stat: nice
    return out


async def test_a_planner_process_nices_its_worker_threads_not_its_loop(tmp_path: Path) -> None:
    base = thread_nice()  # the planner process inherits this one's
    async with (
        aiohttp.ClientSession() as session,
        planner_process(tmp_path, session, planning_thread_nice="7") as (url, process),
    ):
        # Listing the file-system catalog's namespaces reads the directory in a thread.
        async with session.get(url + "/v1/namespaces") as response:
            assert response.status == 200, await response.text()
        threads = task_nices(process.pid)
    # Threads are not named in /proc (Python names them for itself only): the niced ones are
    # the pool's (and any a pool thread started, which inherit its nice value).
    niced = {nice for nice in (nice for _, nice in threads.values()) if nice != base}
    assert niced == {min(19, base + 7)}, threads
    assert threads[process.pid][1] == base  # the event loop's thread
