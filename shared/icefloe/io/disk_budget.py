"""A directory of cache files under a byte budget, shared by the processes of a host.

The planner's manifest store and its shared plan pages both keep files that any process
may write, read (memory-mapped) or delete at any time. Each writer counts what it wrote
since it last looked; when that passes the budget, it counts the directory again, since
other processes write there too, and deletes the least recently written files. This is
the one place that count and that eviction happen.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path


def shrink_oldest(files: Iterable[Path], max_bytes: int) -> int:
    """Count ``files`` and, when they hold more than ``max_bytes``, delete the least recently
    written until 90% of it is used; the bytes left. A file that vanishes meanwhile (another
    process deleted it) is skipped; a deleted file stays readable to whoever mapped it."""
    found = []
    for path in files:
        try:
            st = path.stat()
        except OSError:
            continue
        found.append((st.st_mtime, st.st_size, path))
    found.sort()
    total = sum(size for _, size, _ in found)
    goal = max_bytes * 9 // 10 if total > max_bytes else total
    for _, size, path in found:
        if total <= goal:
            break
        try:
            path.unlink()
        except OSError:
            continue
        total -= size
    return total


def unlink_quietly(path: str | Path) -> None:
    """Delete ``path`` if it is still there: another process may have evicted it first."""
    try:
        os.unlink(path)
    except OSError:
        pass
