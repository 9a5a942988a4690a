"""The planner's manifest cache: decoded manifest lists and manifests by path, within a budget.

Manifest lists and manifests never change once written, so their decoded contents can be
kept by path for as long as memory allows. Manifests are kept as
:class:`~icefloe.manifests.cached.CachedManifest` (Arrow columns), which
:mod:`icefloe.manifests.file_pruner` prunes in bulk; lists as their rows. The cache shares the load of
one path between concurrent plans, optionally persists decoded manifests on disk
(:mod:`icefloe.manifests.store`), and counts hits, misses, evictions and bytes for the
planner's metrics.

The byte budget is one budget for every decoded manifest the process holds, not only for
the cache's entries: plans held for paging *pin* the manifests they select from (the
cached manifests themselves for a full scan, compact copies for a selective one), and a
pinned manifest stays in memory whether or not the cache still lists it. So the cache
counts each manifest once, whoever holds it: its entries, plus pinned manifests it does not
list, plus bytes holders :meth:`charge` (a page written ahead). Eviction takes the least
recently used entries nobody pins (evicting a pinned one would free nothing), so entries
plus pinned bytes stay within ``max_bytes`` as long as holders keep their pins within a
share of it (the planner's plan store does: see ``icefloe.planner.plans``).

Manifests *in flight* count too. A manifest being read and decoded is in memory before it
is an entry: its file's bytes, then its columns. So a load first *reserves* an estimate of
both from the same budget (the file's ``manifest_length`` from the manifest list, times one
plus the decode expansion: decoded bytes per file byte, the largest ratio met so far; the
first load of a cache runs alone, so no concurrent load is admitted on a guess), and waits
in line while other reservations, pinned manifests and outside bytes leave no room; the
reservation becomes the entry when the load ends, and is released however the load ends
(decoded, failed, cancelled). Entries nobody pins are not evicted for a reservation (the
value makes its own room when stored): evicting them made concurrent plans of a table larger
than the budget decode its manifests again and again, which measured worse in resident
memory than the reservations saved. So memory for decoded manifests is at most twice the
budget (entries, and reservations beside what is pinned), not the unbounded sum of loads in
flight. A load is never refused: one admitted while no other is in flight (a manifest larger
than the whole budget, or a budget pinned full) runs alone, so reservations are at most the
budget or one manifest's, and waiting cannot deadlock (a load in flight waits for nothing
but its read and decode). Not counted: a
manifest list's bytes while it loads (its length is not known before it is read), and the
decoders' own transient buffers. A plan being
made or answered holds the manifests it read until its response is written: inside
:meth:`ManifestCache.holding` every manifest the task (and the tasks it starts) gets is
pinned until the block ends, so concurrent plans of a table larger than the budget share one
decoded copy (pinned entries are not evicted) instead of each evicting the others' manifests
while still holding them, and a load waiting for room asks the holders of held plans to
drop some (``on_pressure``).

The names of the modules this one was split into are re-exported, so older imports work.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from icefloe.arrow.values import (
    arrow_storage_type,
    arrow_to_values,
    decode_bounds,
    values_to_arrow,
)
from icefloe.errors import InvalidFileError, ValidationError
from icefloe.io.fileio import FileIO
from icefloe.manifests.cached import CachedManifest, ManifestDecodeMismatch, ManifestRows
from icefloe.manifests.file_pruner import (
    FilePruner,
    PruneCounts,
    metrics_leaf_mask,
    partition_leaf_mask,
)
from icefloe.manifests.manifest import (
    read_manifest_metadata,
)
from icefloe.manifests.manifest_list import ManifestContent, ManifestFile, read_manifest_list
from icefloe.manifests.store import ManifestStore
from icefloe.spec.partition import PartitionSpec
from icefloe.spec.schema import Schema
from icefloe.spec.snapshot import Snapshot

log = logging.getLogger(__name__)

DEFAULT_MAX_BYTES = 512 << 20
DEFAULT_LOAD_CONCURRENCY = 16

# A fixed per-row overhead of a cached manifest list, besides its paths and summaries.
_MANIFEST_FILE_OVERHEAD = 512

# Decoded bytes per byte of manifest file, reserved for the first load of a cache, which
# runs alone (the bench's generated manifests, 5,000 entries, deflate: 164 kB files that
# decode to 2.7 MB of columns, 16.6 times). Later loads reserve by the largest ratio the
# cache has met: a guess made for concurrent loads would, too high, evict the entries they
# are loading beside, and too low, let them past the budget.
DEFAULT_DECODE_EXPANSION = 17.0


class _Waiter:
    """A load waiting for room in the budget; ``granted`` is set (under the cache's lock)
    when its bytes are counted, before its future is resolved on its loop."""

    __slots__ = ("future", "granted", "length")

    def __init__(self, length: int, future: asyncio.Future[None]) -> None:
        self.length = length  # of the manifest file: the estimate is made when admitted
        self.future = future
        self.granted = 0  # the bytes reserved once admitted


class _Holder:
    """The manifests a :meth:`ManifestCache.holding` block pinned, until it ends."""

    __slots__ = ("cache", "manifests", "open")

    def __init__(self, cache: ManifestCache) -> None:
        self.cache = cache
        self.manifests: list[CachedManifest] = []
        self.open = True


_HOLDER: contextvars.ContextVar[_Holder | None] = contextvars.ContextVar(
    "icefloe_manifest_holder", default=None
)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


# ---------------------------------------------------------------------------------------------
# The cache
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CacheStats:
    hits: int
    misses: int
    evictions: int
    entries: int
    bytes: int
    max_bytes: int
    bytes_read: int
    pinned_bytes: int = 0  # distinct bytes pinned by holders (plans), cached or not
    outside_bytes: int = 0  # pinned bytes the cache does not list, plus charged bytes
    inflight_bytes: int = 0  # reserved by loads in flight (file bytes and columns)
    loads_in_flight: int = 0  # loads holding a reservation
    loads_waiting: int = 0  # loads waiting for room in the budget

    @property
    def held_bytes(self) -> int:
        """Every decoded manifest byte in memory, counted once, and what loads in flight
        reserved: at most ``max_bytes`` while holders keep their pins within their share,
        but for one load admitted alone."""
        return self.bytes + self.outside_bytes + self.inflight_bytes


class _ManifestList:
    __slots__ = ("manifests", "nbytes")

    def __init__(self, manifests: list[ManifestFile]) -> None:
        self.manifests = manifests
        size = 0
        for m in manifests:
            size += _MANIFEST_FILE_OVERHEAD + len(m.manifest_path)
            for s in m.partitions or ():
                size += 96 + len(s.lower_bound or b"") + len(s.upper_bound or b"")
        self.nbytes = size


class ManifestCache:
    """Decoded manifest lists and manifests by path, within ``max_bytes`` (LRU).

    Loads of one path are shared: concurrent plans missing the same manifest read and decode
    it once. Decoding runs in a worker thread so the event loop keeps serving requests.
    ``max_bytes=0`` disables caching (every read is a miss), which tests use as a reference.
    """

    def __init__(
        self,
        io: FileIO,
        max_bytes: int = DEFAULT_MAX_BYTES,
        *,
        load_concurrency: int = DEFAULT_LOAD_CONCURRENCY,
        decode_in_thread: bool = True,
        store: ManifestStore | None = None,
    ) -> None:
        if max_bytes < 0:
            raise ValidationError(f"cache max_bytes must be >= 0, got {max_bytes}")
        if load_concurrency < 1:
            raise ValidationError(f"load_concurrency must be >= 1, got {load_concurrency}")
        self.io = io
        self.max_bytes = max_bytes
        self.decode_in_thread = decode_in_thread
        self.store = store
        self._items: OrderedDict[str, Any] = OrderedDict()
        self._bytes = 0
        # Pinned manifests by identity: [manifest, pins]. Identity, since a plan's compact
        # copy shares its path with the cached manifest it was cut from.
        self._pins: dict[int, list[Any]] = {}
        self._pinned_bytes = 0  # distinct pinned manifests, cached or not
        self._outside_bytes = 0  # pinned manifests not cached, plus charged bytes
        self._lock = threading.Lock()
        # Called (outside the lock, from any thread) when pinned manifests leave no room, or
        # the bytes held outside the entries grew (a pinned entry evicted or derived a
        # column): the plan store checks its share and drops its oldest plans. Unset, the
        # cache just holds what is pinned.
        self.on_pressure: Callable[[], None] | None = None
        self._loading: dict[str, asyncio.Future[Any]] = {}
        # Loads in flight: their reserved bytes and number, and the loads waiting in line.
        self._inflight_bytes = 0
        self._inflight_loads = 0
        self._waiters: deque[_Waiter] = deque()
        # Decoded bytes per file byte: the largest ratio met, None until a manifest is decoded.
        self.decode_expansion: float | None = None
        self._semaphore = asyncio.Semaphore(load_concurrency)
        self._hits = 0
        self._misses = 0
        self._evictions = 0
        self._bytes_read = 0

    # -- bookkeeping ----------------------------------------------------------------------

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(
                hits=self._hits,
                misses=self._misses,
                evictions=self._evictions,
                entries=len(self._items),
                bytes=self._bytes,
                max_bytes=self.max_bytes,
                bytes_read=self._bytes_read,
                pinned_bytes=self._pinned_bytes,
                outside_bytes=self._outside_bytes,
                inflight_bytes=self._inflight_bytes,
                loads_in_flight=self._inflight_loads,
                loads_waiting=len(self._waiters),
            )

    def clear(self) -> None:
        moved = False
        with self._lock:
            for value in self._items.values():
                if isinstance(value, CachedManifest):
                    if id(value) in self._pins:
                        self._outside_bytes += int(value.nbytes)  # its holders keep it
                        moved = True
                    else:
                        value._on_grow = None
            self._items.clear()
            self._bytes = 0
            self._wake()
        if moved:
            self._pressure()

    def _pressure(self) -> None:
        if self.on_pressure is not None:
            self.on_pressure()

    # -- pins (the one budget) ----------------------------------------------------------------

    def pin(self, manifests: Sequence[CachedManifest]) -> None:
        """Count ``manifests`` as held (by a plan) until :meth:`unpin`: each distinct one once,
        whether the cache lists it or not; pinned entries are not evicted (that would free
        nothing). Pins nest: a manifest pinned twice is unpinned twice."""
        with self._lock:
            for m in manifests:
                self._pin_one(m)
            self._evict()

    def _pin_one(self, m: CachedManifest) -> None:
        found = self._pins.get(id(m))
        if found is not None:
            found[1] += 1
            return
        self._pins[id(m)] = [m, 1]
        size = int(m.nbytes)
        self._pinned_bytes += size
        if not self._cached(m):
            self._outside_bytes += size
            m._on_grow = self._grow_callback(m)

    def _take(self, holder: _Holder | None, value: Any) -> None:
        """Pin ``value`` for ``holder`` (under the lock), if it is a manifest and the
        holder's block has not ended."""
        if holder is not None and holder.open and isinstance(value, CachedManifest):
            self._pin_one(value)
            holder.manifests.append(value)

    def unpin(self, manifests: Sequence[CachedManifest]) -> None:
        """Release pins taken by :meth:`pin`; a manifest no longer pinned and not cached is
        no longer counted (its memory goes with its last reference)."""
        with self._lock:
            for m in manifests:
                found = self._pins.get(id(m))
                if found is None or found[0] is not m:
                    continue
                found[1] -= 1
                if found[1] > 0:
                    continue
                del self._pins[id(m)]
                size = int(m.nbytes)
                self._pinned_bytes -= size
                if not self._cached(m):
                    self._outside_bytes -= size
                    m._on_grow = None
            self._evict()  # entries pins kept past the budget
            self._wake()

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """Pin every manifest this task, and the tasks it starts meanwhile, gets from the
        cache until the block ends: a plan being made or answered holds the manifests it
        read, so they are counted (and not evicted to be decoded again by the next plan)
        until then. A task started inside that loads after the block ended pins nothing."""
        holder = _Holder(self)
        token = _HOLDER.set(holder)
        try:
            yield
        finally:
            _HOLDER.reset(token)
            holder.open = False
            self.unpin(holder.manifests)

    def over_budget(self) -> bool:
        """Whether entries and outside bytes exceed ``max_bytes`` with every entry nobody
        pins evicted: then only a holder releasing pins (a plan store dropping plans) can
        bring memory back within the budget."""
        with self._lock:
            return self._evict()

    def charge(self, nbytes: int) -> None:
        """Count ``nbytes`` (negative to release) that a holder keeps beside its pinned
        manifests (a page written ahead), so the cache makes room for them too."""
        with self._lock:
            self._outside_bytes += nbytes
            self._evict()
            self._wake()

    def _cached(self, m: Any) -> bool:
        path = getattr(m, "path", None)
        return path is not None and self._items.get(path) is m

    def _grow_callback(self, m: Any) -> Callable[[int], None]:
        key, ident = m.path, id(m)
        return lambda grown: self._grew(key, ident, grown)

    def _lookup(self, key: str, holder: _Holder | None = None) -> Any:
        with self._lock:
            value = self._items.get(key)
            if value is None:
                self._misses += 1
                return None
            self._hits += 1
            self._items.move_to_end(key)
            self._take(holder, value)  # in the same step: not evicted in between
            return value

    def _store(
        self, key: str, value: Any, reserved: int = 0, holder: _Holder | None = None
    ) -> None:
        """Cache ``value``; what its load reserved is released, and ``holder`` pins it, in
        the same step (an entry evicted for another load before its holder pinned it would
        have to be counted again outside the cache)."""
        size = int(value.nbytes)
        with self._lock:
            self._unreserve(reserved)
            self._take(holder, value)
            if size > self.max_bytes:
                self._wake()
                return
            old = self._items.pop(key, None)
            moved = False
            if old is not None:
                self._bytes -= int(old.nbytes)
                if id(old) in self._pins:
                    self._outside_bytes += int(old.nbytes)  # its holders keep it
                    moved = True
                elif isinstance(old, CachedManifest):
                    old._on_grow = None
            if id(value) in self._pins:
                self._outside_bytes -= size  # pinned already: now counted as an entry
            self._items[key] = value
            self._bytes += size
            if isinstance(value, CachedManifest):
                value._on_grow = self._grow_callback(value)
            over = self._evict()
            self._wake()
        if over or moved:
            self._pressure()

    def _grew(self, key: str, ident: int, grown: int) -> None:
        """A manifest derived a column (from any thread): count it where it is held."""
        outside = False
        with self._lock:
            value = self._items.get(key)
            if value is not None and id(value) == ident:
                self._bytes += grown
            elif ident not in self._pins:
                return
            else:
                self._outside_bytes += grown
                outside = True
            if ident in self._pins:
                self._pinned_bytes += grown
            over = self._evict()
        if over or outside:
            self._pressure()

    def _evict(self) -> bool:
        """Drop least recently used entries nobody pins until entries and outside bytes fit;
        whether they still do not (every entry left is pinned)."""
        if self._bytes + self._outside_bytes <= self.max_bytes:
            return False
        for key in list(self._items):
            if self._bytes + self._outside_bytes <= self.max_bytes:
                break
            value = self._items[key]
            if id(value) in self._pins:
                continue  # its holders keep it: evicting it would free nothing
            del self._items[key]
            self._bytes -= int(value.nbytes)
            self._evictions += 1
            if isinstance(value, CachedManifest):
                value._on_grow = None
        return self._bytes + self._outside_bytes > self.max_bytes

    # -- loads in flight ------------------------------------------------------------------

    def _admit(self, length: int) -> int:
        """Reserve for a load of a ``length``-byte manifest if it may start now (under the
        lock): alone, or, once the decode expansion is known, with room for it beside the
        other reservations and what no eviction frees (pinned manifests, outside bytes).
        Entries nobody pins are not evicted for it: its value makes its own room when
        stored. The bytes reserved, 0 if it may not start."""
        nbytes = self._estimate(length)
        if self._inflight_loads and (
            self.decode_expansion is None
            or self._kept_bytes() + self._inflight_bytes + nbytes > self.max_bytes
        ):
            return 0
        self._inflight_bytes += nbytes
        self._inflight_loads += 1
        return nbytes

    def _kept_bytes(self) -> int:
        """Bytes no eviction can free (under the lock): pinned entries and outside bytes."""
        pinned = sum(int(v.nbytes) for v in self._items.values() if id(v) in self._pins)
        return pinned + self._outside_bytes

    def _unreserve(self, nbytes: int) -> None:
        if nbytes:
            self._inflight_bytes -= nbytes
            self._inflight_loads -= 1

    def _wake(self) -> None:
        """Admit the loads waiting in line, in order, while the first fits (under the lock;
        from any thread: a waiter's future is resolved on its own loop)."""
        while self._waiters:
            granted = self._admit(self._waiters[0].length)
            if not granted:
                return
            waiter = self._waiters.popleft()
            waiter.granted = granted
            with contextlib.suppress(RuntimeError):  # its loop closed: nobody waits
                waiter.future.get_loop().call_soon_threadsafe(_resolve, waiter.future)

    async def _reserve(self, length: int) -> int:
        """Reserve for a load of a ``length``-byte manifest about to start, waiting in line
        for room; the bytes reserved (released with :meth:`_release`, or by :meth:`_store`
        when the value becomes an entry). Nothing is reserved in a cache that keeps
        nothing, or for a manifest of unknown length."""
        if length <= 0 or self.max_bytes == 0:
            return 0
        with self._lock:
            if not self._waiters:
                granted = self._admit(length)
                if granted:
                    return granted
            waiter = _Waiter(length, asyncio.get_running_loop().create_future())
            self._waiters.append(waiter)
        self._pressure()  # held plans may make room
        try:
            await waiter.future
        except asyncio.CancelledError:
            with self._lock:
                if waiter.granted:
                    self._unreserve(waiter.granted)  # admitted just as it was cancelled
                else:
                    self._waiters.remove(waiter)
                self._wake()
            raise
        return waiter.granted

    def _release(self, nbytes: int) -> None:
        with self._lock:
            self._unreserve(nbytes)
            self._wake()

    def _estimate(self, length: int) -> int:
        """Bytes a load of a ``length``-byte manifest holds before it is an entry: the file
        and its columns."""
        expansion = self.decode_expansion
        if expansion is None:
            expansion = DEFAULT_DECODE_EXPANSION
        return length + int(length * expansion)

    def _learn(self, length: int, value: CachedManifest) -> None:
        if length > 0:
            ratio = int(value.nbytes) / length
            with self._lock:
                known = self.decode_expansion
                self.decode_expansion = ratio if known is None else max(known, ratio)

    async def _load(
        self,
        key: str,
        load: Callable[[], Any],
        length: int = 0,
        holder: _Holder | None = None,
    ) -> Any:
        """The value at ``key``, loaded with ``load`` once however many ask at once, and
        pinned for ``holder``; ``length`` is the file's, for the reservation."""
        while True:
            cached = self._lookup(key, holder)
            if cached is not None:
                return cached
            pending = self._loading.get(key)
            if pending is None:
                break
            try:
                shared = await asyncio.shield(pending)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if not pending.cancelled() or (task is not None and task.cancelling()):
                    raise
                # The plan loading it was cancelled, not this one: load it here.
                continue
            with self._lock:
                self._take(holder, shared)
                self._evict()
            return shared
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._loading[key] = future
        reserved = 0
        loaded = False
        try:
            reserved = await self._reserve(length)
            value = await load()
            loaded = True
        except asyncio.CancelledError:
            future.cancel()  # those sharing the load load it themselves
            raise
        except BaseException as e:
            future.set_exception(e)
            future.exception()  # retrieved: waiters re-raise it, nobody logs it as lost
            raise
        finally:
            self._loading.pop(key, None)
            if not loaded:
                self._release(reserved)
        future.set_result(value)
        self._store(key, value, reserved, holder)
        return value

    async def _read(self, path: str) -> bytes:
        async with self._semaphore:
            data = await self.io.read(path)
        with self._lock:
            self._bytes_read += len(data)
        return data

    async def _decode(self, fn: Callable[..., Any], *args: Any) -> Any:
        if self.decode_in_thread:
            return await asyncio.to_thread(fn, *args)
        return fn(*args)

    # -- manifest lists ---------------------------------------------------------------------

    async def manifest_list(self, snapshot: Snapshot) -> list[ManifestFile]:
        """The manifests of a snapshot (v1 snapshots that list manifests directly too)."""
        if snapshot.manifest_list is not None:
            path = snapshot.manifest_list

            async def load_list() -> _ManifestList:
                data = await self._read(path)
                return _ManifestList(await self._decode(_decode_list, data, path))

            return list((await self._load(path, load_list)).manifests)
        paths = tuple(snapshot.manifests or ())
        key = f"snapshot-manifests:{snapshot.snapshot_id}:" + "\x00".join(paths)

        async def load_v1() -> _ManifestList:
            rows = []
            for path in paths:
                data = await self._read(path)
                rows.append(_v1_manifest_file(data, path, snapshot.snapshot_id))
            return _ManifestList(rows)

        return list((await self._load(key, load_v1)).manifests)

    # -- manifests --------------------------------------------------------------------------

    async def manifest(
        self, manifest: ManifestFile, specs: Mapping[int, PartitionSpec], schema: Schema
    ) -> CachedManifest:
        """A manifest's entries, decoded with its manifest list row (for inheritance)."""
        path = manifest.manifest_path

        async def load() -> CachedManifest:
            store = self.store
            if store is not None:
                found = await self._decode(_from_store, store, manifest, specs)
                if found is not None:
                    return found
            data = await self._read(path)
            cached: CachedManifest = await self._decode(
                CachedManifest.decode, data, manifest, specs, schema
            )
            self._learn(len(data), cached)
            if store is not None:
                await self._decode(cached.persist, store)
            return cached

        holder = _HOLDER.get()
        if holder is not None and holder.cache is not self:
            holder = None
        value: CachedManifest = await self._load(path, load, manifest.manifest_length, holder)
        if self.store is not None and value.store is None:
            value.store = self.store  # values derived from all its rows are shared there
        return value

    async def manifests(
        self,
        manifests: Sequence[ManifestFile],
        specs: Mapping[int, PartitionSpec],
        schema: Schema,
    ) -> list[CachedManifest]:
        """Several manifests, loaded concurrently (reads bounded by ``load_concurrency``)."""
        return list(await asyncio.gather(*(self.manifest(m, specs, schema) for m in manifests)))


def _from_store(
    store: ManifestStore, manifest: ManifestFile, specs: Mapping[int, PartitionSpec]
) -> CachedManifest | None:
    """A manifest's columns memory-mapped from the on-disk store, or None if absent."""
    spec = specs.get(manifest.partition_spec_id)
    if spec is None:
        return None  # decoding names the problem
    stored = store.load(manifest)
    if stored is None:
        return None
    return CachedManifest(
        manifest, spec, stored.partition_type, stored.columns, stored.partitions, None
    )


def _decode_list(data: bytes, path: str) -> list[ManifestFile]:
    return read_manifest_list(data, location=path)


def _v1_manifest_file(data: bytes, path: str, snapshot_id: int) -> ManifestFile:
    meta = read_manifest_metadata(data, location=path)
    try:
        spec_id = int(meta.get("partition-spec-id", "0"))
    except ValueError:
        raise InvalidFileError(path, "partition-spec-id metadata is not an integer") from None
    return ManifestFile(
        manifest_path=path,
        manifest_length=len(data),
        partition_spec_id=spec_id,
        content=ManifestContent.DATA,
        sequence_number=0,
        min_sequence_number=0,
        added_snapshot_id=snapshot_id,
    )


__all__ = [
    "DEFAULT_DECODE_EXPANSION",
    "DEFAULT_MAX_BYTES",
    "CacheStats",
    "CachedManifest",
    "FilePruner",
    "ManifestCache",
    "ManifestDecodeMismatch",
    "ManifestRows",
    "PruneCounts",
    "arrow_storage_type",
    "arrow_to_values",
    "decode_bounds",
    "metrics_leaf_mask",
    "partition_leaf_mask",
    "values_to_arrow",
]
