"""Running the planner: one process serving until it is told to stop, or ``workers``
processes on one port under a supervising parent.

Before the port opens a process pays its lazy imports (:func:`_warm_up`); once serving it
tunes the cyclic collector and the interpreter's switch interval so the event loop (and
``/healthz``) is not held behind planning threads (:func:`_tune_gc`). With
``planning_thread_nice`` the loop's default executor, which runs all of a planner's thread
work, is :func:`planning_executor`'s, its threads niced (off by default: in eight runs
beside runs without it, at load 5-14 on 2 cores, it lowered the ``/healthz`` median every
time but its p99 only in five, and slowed hostile plans up to 1.9 times; see the planner's
docs page).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from icefloe.errors import ValidationError
from icefloe.planner.app import PlannerService
from icefloe.planner.config import PlannerConfig
from icefloe.planner.memory import use_arrow_allocator
from icefloe.runtime.logs import configure_logging

log = logging.getLogger(__name__)


# The cyclic collector's first-generation threshold while serving. Each plan request makes
# a few thousand short-lived objects, so at the default (700) a collection runs every few
# requests and, every so often, a full one walks every long-lived object (cached manifest
# lists, compiled filters, held plans), pausing the event loop for tens of milliseconds
# under load (measured as /healthz p99 at 150 clients). The planner's data lives in Arrow
# buffers, not in reference cycles, so collecting less often costs little memory.
GC_THRESHOLD = (50_000, 20, 20)


# How long a thread holding the interpreter lock runs before one waiting for it may ask it
# to let go (Python's default: 5 ms). Planning threads run Python between Arrow kernels; the
# event loop gives the lock up at every wait for sockets and asks for it back each time, so
# one /healthz answer (accept, read, answer, close: several loop turns) waited up to 5 ms a
# turn behind them: measured p99 56-71 ms under 8 hostile plans with the loop itself busy
# under 2 ms per probe. At 0.5 ms a turn waits a tenth of that; the planning threads pay a
# few more hand-overs (microseconds each).
SWITCH_INTERVAL_S = 0.0005


def _tune_gc() -> None:
    """Move what startup made out of the collector's sight and collect less often; let the
    event loop have the interpreter lock back sooner (:data:`SWITCH_INTERVAL_S`)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLD)
    sys.setswitchinterval(SWITCH_INTERVAL_S)


def _warm_up() -> None:
    """Pay, before the port opens, what a process's first plan would pay on a request.

    Arrow turns a Python scalar argument of a compute function (``status != 2``) into an
    Arrow scalar through its pandas shim, which imports pandas the first time: 0.7-0.9 s
    on a loaded 2-core machine, measured as the first selective plan of a fresh worker
    (716-865 ms; 38 ms once this ran). A worker that started cold held every request on its
    connections for that long (/healthz p99 over a second with 2 workers)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    pc.not_equal(pa.array([0], pa.int32()), 0)


def lower_thread_priority(increment: int) -> None:
    """Raise the calling thread's nice value by ``increment`` (capped at 19), on Linux,
    where a thread is a task of its own; elsewhere, or when refused, leave it as it is.

    A thread pool's initializer: the planner's worker threads (planning, manifest decoding,
    page writing) then yield the CPU to the event-loop thread on a busy machine, so a
    ``/healthz`` probe's turn of the loop is not queued behind them. The interpreter lock
    still hands over as ever (:data:`SWITCH_INTERVAL_S`)."""
    if sys.platform != "linux" or increment <= 0:
        return
    tid = threading.get_native_id()
    try:
        current = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, min(19, current + increment))
    except OSError as e:
        log.warning("cannot lower the priority of planning thread %d: %s", tid, e)


def planning_executor(increment: int) -> ThreadPoolExecutor:
    """The pool that runs the service's thread work (``asyncio.to_thread`` and
    ``run_in_executor(None, ...)``: it becomes the loop's default), niced by ``increment``."""
    return ThreadPoolExecutor(
        thread_name_prefix="icefloe-planning",
        initializer=lower_thread_priority,
        initargs=(increment,),
    )


async def serve(
    config: PlannerConfig, *, reuse_port: bool = False, parent_pid: int | None = None
) -> None:
    """Run until SIGINT or SIGTERM (or, for a worker, until its supervisor is gone)."""

    use_arrow_allocator(config.arrow_allocator)
    service = PlannerService(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    if config.planning_thread_nice:
        loop.set_default_executor(planning_executor(config.planning_thread_nice))
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)

    async def orphaned() -> None:
        # A worker whose supervisor was killed (SIGKILL forwards nothing) must not linger.
        while not stop.is_set():
            await asyncio.sleep(1.0)
            if os.getppid() != parent_pid:
                log.warning("the supervising process is gone; stopping this worker")
                stop.set()

    watchdog = asyncio.create_task(orphaned()) if parent_pid is not None else None
    _warm_up()
    await service.start(reuse_port=reuse_port)
    _tune_gc()
    try:
        await stop.wait()
    finally:
        if watchdog is not None:
            watchdog.cancel()
        await service.stop()
        await service.catalog.close()


def _worker(overrides: dict[str, Any], parent_pid: int) -> None:
    """One of ``workers`` processes: the same settings, the port shared (SO_REUSEPORT)."""
    config = PlannerConfig.load(overrides)
    configure_logging(config.log_level, config.log_format)
    asyncio.run(serve(config, reuse_port=True, parent_pid=parent_pid))


def serve_workers(config: PlannerConfig, overrides: dict[str, Any]) -> int:
    """Run ``config.workers`` planner processes on one port (the kernel spreads connections).

    Python plans on one core per process; processes share the decoded manifests through the
    memory-mapped disk cache (``cache_dir``) and serve each other's plan tokens through the
    shared plan secret (a random one for this host when none is configured).
    """
    import multiprocessing
    import secrets as _secrets

    if config.port == 0:
        raise ValidationError("ICEFLOE_PLANNER_WORKERS > 1 needs a fixed ICEFLOE_PLANNER_PORT")
    if not config.plan_secret and not config.plan_secret_file:
        os.environ["ICEFLOE_PLANNER_PLAN_SECRET"] = _secrets.token_hex(32)
    if not config.cache_dir:
        log.warning("ICEFLOE_PLANNER_CACHE_DIR is unset: each worker decodes manifests itself")
    context = multiprocessing.get_context("spawn")
    child = {**overrides, "workers": 1}
    processes = [
        context.Process(target=_worker, args=(child, os.getpid())) for _ in range(config.workers)
    ]
    for process in processes:
        process.start()

    def forward(signum: int, frame: Any) -> None:
        for process in processes:
            if process.is_alive() and process.pid is not None:
                os.kill(process.pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    for process in processes:
        process.join()
    return max((p.exitcode or 0) for p in processes)


async def run_from_args(args: Any) -> int:
    from icefloe.planner.config import overrides_from_args

    overrides = overrides_from_args(args)
    config = PlannerConfig.load(overrides)
    configure_logging(config.log_level, config.log_format)
    if config.workers > 1:
        # The parent only supervises: blocking its (idle) loop on the main thread lets it
        # install the signal handlers that forward SIGTERM to the workers.
        return serve_workers(config, overrides)
    await serve(config)
    return 0
