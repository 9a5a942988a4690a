"""Pages written ahead, shared by the planner processes of a host through a disk directory.

With ``ICEFLOE_PLANNER_WORKERS=2`` the kernel hands each new connection to either process.
A client whose next ``plan-tasks`` fetch lands on the other process (a new connection, a
pool of fetchers, a load balancer) used to find no page written ahead there: that process
planned the whole scan again from the signed token (a hundred milliseconds and more for a
million files) just to write one page the first process had already written. So a page
written ahead (:mod:`icefloe.planner.pages_ahead`) is also put here, and a process asked for
a page looks here before it plans: a hit is served as it is, without the plan.

Safety, as an adversary would try it:

* A page is named by a digest of the plan's key and the page number, and its header holds
  a digest of the whole plan id (signed: table, request, snapshot, page size, expiry) and
  the page number; a file whose header names another plan or page is never served. Callers
  look here only after the token verified and the plan was found not cancelled, here or
  on another replica (:mod:`icefloe.planner.plan_cancellations`); a cancel also deletes the
  plan's files.
* Files are written to a temporary name and renamed into place, so a reader never sees a
  partial page; the header also holds the body's length and CRC-32, so a file damaged or
  truncated on disk is deleted and reported as a miss (the caller writes the page itself).
* Two processes writing the same page at once each rename a complete file over the other:
  the bytes are the same (a page is a function of its signed plan), and a reader holds
  whichever inode it opened.
* A page is deleted when it is taken (one fetch per page, as in memory), and the directory
  is kept within ``max_bytes`` by deleting the oldest files first. The other processes
  write there too, so each writer counts the directory again whenever it has written a
  sixteenth of the budget since it last did (or its own count says it is over): the
  directory holds at most ``max_bytes`` plus a sixteenth of it per writing process.
"""

from __future__ import annotations

import hashlib
import logging
import os
import struct
import tempfile
import threading
import zlib
from pathlib import Path

from icefloe.io.disk_budget import shrink_oldest, unlink_quietly

log = logging.getLogger(__name__)

MAGIC = b"icefloe-plan-page-1\n"
# digest of the plan id, page, body length, CRC-32 of the body
_HEADER = struct.Struct(">32sQQI")
SUFFIX = ".page"
# Pages kept on disk at once, in all: a 5,000-task page of a full plan is about 1.3 MiB,
# and a client reading pages in order leaves one or two of its plan here.
DEFAULT_MAX_BYTES = 64 << 20


def _plan_digest(plan_id: str) -> bytes:
    return hashlib.sha256(plan_id.encode("utf-8")).digest()


def _prefix(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:32]


class SharedPages:
    """Page bodies by (plan, page) in ``directory``, within ``max_bytes`` (see the module
    docstring). Every method does file I/O: call them from a worker thread."""

    def __init__(self, directory: str | os.PathLike[str], max_bytes: int = DEFAULT_MAX_BYTES):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._bytes = self._count()
        self._since_count = 0  # bytes this process wrote since it last counted the directory
        self.writes = 0
        self.hits = 0
        self.damaged = 0

    @classmethod
    def beside(cls, cache_dir: str | None, disk_budget: int) -> SharedPages | None:
        """The pages directory of a planner's disk cache (``plan-pages`` under it), within
        :data:`DEFAULT_MAX_BYTES` or the cache's own budget if smaller; None without a disk
        cache or with a zero budget (nothing is shared)."""
        budget = min(DEFAULT_MAX_BYTES, disk_budget)
        if not cache_dir or budget <= 0:
            return None
        return cls(Path(cache_dir, "plan-pages"), budget)

    def _path(self, key: str, page: int) -> Path:
        return self.directory / f"{_prefix(key)}-{page}{SUFFIX}"

    def _files(self) -> list[Path]:
        return [p for p in self.directory.glob("*" + SUFFIX) if p.is_file()]

    def _count(self) -> int:
        total = 0
        for p in self._files():
            try:
                total += p.stat().st_size
            except OSError:
                continue
        return total

    def has(self, key: str, page: int) -> bool:
        """Whether a page is stored (maybe by another process): no need to write it."""
        return self._path(key, page).exists()

    def put(self, plan_id: str, key: str, page: int, body: bytes) -> bool:
        """Store ``body`` as ``page`` of the plan ``plan_id`` (whose key is ``key``); best
        effort: False, logged, if it cannot be written or is larger than the budget."""
        size = len(MAGIC) + _HEADER.size + len(body)
        if size > self.max_bytes:
            return False
        header = MAGIC + _HEADER.pack(_plan_digest(plan_id), page, len(body), zlib.crc32(body))
        target = self._path(key, page)
        try:
            fd, tmp = tempfile.mkstemp(dir=self.directory, suffix=".tmp")
        except OSError as e:
            log.warning("shared plan pages: cannot write in %s: %s", self.directory, e)
            return False
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(header)
                f.write(body)
            with self._lock:
                os.replace(tmp, target)
                self.writes += 1
                self._bytes += size
                self._since_count += size
                if self._bytes > self.max_bytes or self._since_count > self.max_bytes // 16:
                    self._shrink()
        except OSError as e:
            log.warning("shared plan pages: cannot write %s: %s", target.name, e)
            unlink_quietly(Path(tmp))
            return False
        return True

    def take(self, plan_id: str, key: str, page: int) -> bytes | None:
        """The body of ``page`` of plan ``plan_id`` if stored whole, removed from the
        directory (a page is fetched once; a retry writes it again); else None."""
        path = self._path(key, page)
        try:
            with open(path, "rb") as f:
                head = f.read(len(MAGIC) + _HEADER.size)
                body = f.read()
        except FileNotFoundError:
            return None
        except OSError as e:
            log.warning("shared plan pages: cannot read %s: %s", path.name, e)
            return None
        whole = _whole(head, body, plan_id, page)
        if whole:
            self.hits += 1
        else:
            log.warning("shared plan pages: dropping %s (damaged or not this plan's)", path.name)
            self.damaged += 1
        self._remove(path, len(head) + len(body))
        return body if whole else None

    def discard(self, key: str, page: int) -> None:
        """Delete a stored page without reading it (it was served from memory)."""
        path = self._path(key, page)
        try:
            size = path.stat().st_size
        except OSError:
            return
        self._remove(path, size)

    def forget(self, key: str) -> None:
        """Delete every stored page of the plan ``key`` (it was cancelled)."""
        for path in self.directory.glob(f"{_prefix(key)}-*{SUFFIX}"):
            try:
                size = path.stat().st_size
            except OSError:
                continue
            self._remove(path, size)

    def _remove(self, path: Path, size: int) -> None:
        with self._lock:
            try:
                path.unlink()
            except OSError:
                return  # another process took it first
            self._bytes = max(0, self._bytes - size)

    def _shrink(self) -> None:
        """Count the directory again and delete its oldest files if it is over the budget
        (:func:`~icefloe.io.disk_budget.shrink_oldest`); called with the lock held."""
        self._since_count = 0
        self._bytes = shrink_oldest(self._files(), self.max_bytes)


def _whole(head: bytes, body: bytes, plan_id: str, page: int) -> bool:
    """Whether a stored file (its header and the rest) is whole and was written for this
    plan and page."""
    if len(head) != len(MAGIC) + _HEADER.size or head[: len(MAGIC)] != MAGIC:
        return False
    digest, stored_page, length, crc = _HEADER.unpack_from(head, len(MAGIC))
    return (
        digest == _plan_digest(plan_id)
        and stored_page == page
        and len(body) == length
        and zlib.crc32(body) == crc
    )


__all__ = ["DEFAULT_MAX_BYTES", "SharedPages"]
