"""Which allocator Arrow's buffers come from in a planner process, and how soon freed memory
goes back to the system.

Decoded manifests are counted against the cache budget (:mod:`icefloe.manifests.cache`), but
the memory a process *keeps* also depends on its allocator: pyarrow's default, mimalloc,
keeps freed pages for reuse. Measured on a 100k-file table, a planner whose cache and held
plans accounted for the same 53 MiB kept about 190 MiB anonymous memory with mimalloc,
and about 130 MiB with jemalloc returning freed pages at once (decay 0), the difference
being the page writer's transient buffers (megabytes per full-plan page, written in worker
threads), which mimalloc kept per thread. So the planner allocates Arrow buffers from
jemalloc with decay 0 by default (``ICEFLOE_PLANNER_ARROW_ALLOCATOR``); ``mimalloc`` and
``system`` (glibc malloc) are kept for comparison, and a build of pyarrow without jemalloc
falls back to its default with a warning.
"""

from __future__ import annotations

import logging
from typing import Literal

log = logging.getLogger(__name__)

ArrowAllocator = Literal["jemalloc", "mimalloc", "system"]
ALLOCATORS: tuple[ArrowAllocator, ...] = ("jemalloc", "mimalloc", "system")


def use_arrow_allocator(name: ArrowAllocator) -> str:
    """Make ``name`` the default pool of this process's Arrow buffers; returns the backend
    in use (pyarrow's default when ``name`` is not built in)."""
    import pyarrow as pa

    try:
        if name == "jemalloc":
            pool = pa.jemalloc_memory_pool()
            # Freed pages go back at once rather than after a decay period that, without
            # jemalloc's background thread, only passes when something allocates again.
            pa.jemalloc_set_decay_ms(0)
        elif name == "mimalloc":
            pool = pa.mimalloc_memory_pool()
        else:
            pool = pa.system_memory_pool()
    except NotImplementedError:
        fallback = pa.default_memory_pool().backend_name
        log.warning("pyarrow has no %s allocator; Arrow buffers use %s", name, fallback)
        return str(fallback)
    pa.set_memory_pool(pool)
    return str(pool.backend_name)
