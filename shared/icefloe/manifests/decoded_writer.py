"""Filling a planner's disk cache with the manifests a committer wrote, off the commit's path.

A committer sharing a planner's :class:`~icefloe.manifests.store.ManifestStore` directory
can save the decoded columns of the manifests it has just committed, so the planner plans
the new snapshot without reading or decoding them. That is a cache fill, not part of the
commit: the commit is correct and may be acknowledged without it, and a fill that never
happens (a crash, a full queue, a failed write) only means the planner decodes those
manifests itself. Decoding takes tens of milliseconds per manifest, so doing it before
acknowledging a commit put it on every commit's latency.

So :meth:`DecodedManifestWriter.submit` only queues the manifests' bytes and returns. One
worker thread decodes and saves them in order; it is started when there is work and ends
when the queue is empty, so an idle process holds no thread. The queue is bounded by the
bytes of manifest Avro it holds (the memory the queue costs): a submission that would pass
``max_pending_bytes`` is dropped and counted. Failures are logged and counted, never
raised into the committer. The thread is a daemon (a hung disk must not keep a stopping
process alive); :meth:`flush` waits for the queue with a bound, and an exit hook flushes
every writer for a few seconds so a normal interpreter exit keeps what was queued.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from icefloe.errors import ValidationError
from icefloe.manifests.manifest_list import ManifestFile
from icefloe.manifests.store import ManifestStore
from icefloe.spec.partition import PartitionSpec
from icefloe.spec.schema import Schema

log = logging.getLogger(__name__)

DEFAULT_MAX_PENDING_BYTES = 64 << 20
EXIT_FLUSH_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class DecodedWriterStats:
    """Counts since the writer was made, for metrics: manifests ``written`` to the store,
    ``skipped`` (the store cannot hold their partition values: the planner decodes them),
    ``failed`` (decoding or saving raised), ``dropped`` (the queue was full); and what is
    queued now, in manifests and bytes of Avro."""

    written: int
    skipped: int
    failed: int
    dropped: int
    pending: int
    pending_bytes: int


@dataclass(frozen=True, slots=True)
class _Job:
    manifests: tuple[tuple[ManifestFile, bytes], ...]
    specs: Mapping[int, PartitionSpec]
    schema: Schema
    size: int


class DecodedManifestWriter:
    """Decodes committed manifests and saves them to ``store`` in the background (see the
    module docstring)."""

    def __init__(
        self, store: ManifestStore, max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES
    ) -> None:
        if max_pending_bytes < 0:
            raise ValidationError(
                f"max_pending_bytes of the decoded-manifest writer must be >= 0, "
                f"got {max_pending_bytes}"
            )
        self.store = store
        self.max_pending_bytes = max_pending_bytes
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._jobs: deque[_Job] = deque()
        self._pending_bytes = 0
        self._pending = 0
        self._busy = False  # a job is being written (it has left the queue)
        self._worker: threading.Thread | None = None
        self._written = 0
        self._skipped = 0
        self._failed = 0
        self._dropped = 0
        _WRITERS.add(self)

    # -- submitting -----------------------------------------------------------------------

    def submit(
        self,
        manifests: Sequence[tuple[ManifestFile, bytes]],
        specs: Mapping[int, PartitionSpec],
        schema: Schema,
    ) -> bool:
        """Queue committed manifests (their list rows as committed, and the Avro bytes
        written) for decoding and saving; never blocks. False when the queue was full and
        they were dropped (counted: the planner will decode them itself)."""
        if not manifests:
            return True
        size = sum(len(data) for _, data in manifests)
        job = _Job(tuple(manifests), dict(specs), schema, size)
        with self._lock:
            if self._pending_bytes + size > self.max_pending_bytes:
                self._dropped += len(manifests)
                dropped = True
            else:
                dropped = False
                self._jobs.append(job)
                self._pending_bytes += size
                self._pending += len(manifests)
                if self._worker is None:
                    self._worker = threading.Thread(
                        target=self._run, name="icefloe-decoded-writer", daemon=True
                    )
                    self._worker.start()
        if dropped:
            log.warning(
                "decoded-manifest writer: queue full (%d bytes pending, limit %d); %d "
                "manifest(s) left for the planner to decode",
                self._pending_bytes,
                self.max_pending_bytes,
                len(manifests),
            )
        return not dropped

    # -- waiting --------------------------------------------------------------------------

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything queued is written (or ``timeout`` seconds pass); True when
        the queue is empty and no write is under way."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._idle:
            while self._jobs or self._busy:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._idle.wait(remaining)
        return True

    @property
    def stats(self) -> DecodedWriterStats:
        with self._lock:
            return DecodedWriterStats(
                self._written,
                self._skipped,
                self._failed,
                self._dropped,
                self._pending,
                self._pending_bytes,
            )

    # -- the worker -----------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._jobs:
                    self._worker = None
                    self._idle.notify_all()
                    return
                job = self._jobs.popleft()
                self._busy = True
            try:
                self._write(job)
            finally:
                with self._lock:
                    self._busy = False
                    self._pending_bytes -= job.size
                    self._pending -= len(job.manifests)
                    if not self._jobs:
                        self._idle.notify_all()

    def _write(self, job: _Job) -> None:
        from icefloe.manifests.cached import CachedManifest

        for manifest, data in job.manifests:
            try:
                decoded = CachedManifest.decode(data, manifest, job.specs, job.schema)
                saved = decoded.persist(self.store)
            except Exception as e:  # a cache fill, never a reason to stop the worker
                log.warning(
                    "decoded-manifest writer: cannot persist %s (the planner will decode "
                    "it itself): %s",
                    manifest.manifest_path,
                    e,
                )
                with self._lock:
                    self._failed += 1
                continue
            with self._lock:
                if saved is None:
                    self._skipped += 1
                elif saved:
                    self._written += 1
                else:
                    self._failed += 1


_WRITERS: weakref.WeakSet[DecodedManifestWriter] = weakref.WeakSet()


def _flush_at_exit() -> None:
    """Give queued fills a few seconds at a normal exit (daemon threads are not joined)."""
    deadline = time.monotonic() + EXIT_FLUSH_SECONDS
    for writer in list(_WRITERS):
        writer.flush(max(0.0, deadline - time.monotonic()))


atexit.register(_flush_at_exit)
