"""Reading a snapshot's manifest list and manifests through a FileIO, with a small cache.

Manifest lists and manifests are immutable once written, so a decoded copy keyed by path
never goes stale. Committers re-read the parent snapshot's manifests on every retry, and
the cache turns those re-reads into dictionary lookups.

Finding a few files in a large table (the data files a row delta deletes rows from, their
deletes, the deletes a rewrite must validate against, the live paths) goes through
:meth:`ManifestReader.select` and :meth:`ManifestReader.file_paths`, which decode manifests
to Arrow with the planner's decoder and cache (:class:`~icefloe.manifests.cache.ManifestCache`)
and build objects only for the hits (:mod:`icefloe.manifests.entry_query`). ``columnar=False`` answers
them entry by entry instead: the reference, kept for tests and ``make bench``. Manifests
under ``columnar_min_bytes`` are read entry by entry either way, where fastavro is cheaper
than the native reader's fixed costs.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping
from typing import Any

from icefloe.errors import InvalidFileError, ValidationError
from icefloe.io.fileio import FileIO
from icefloe.manifests.cache import DEFAULT_LOAD_CONCURRENCY, ManifestCache
from icefloe.manifests.cached import CachedManifest
from icefloe.manifests.decoded_writer import DEFAULT_MAX_PENDING_BYTES, DecodedManifestWriter
from icefloe.manifests.entry_query import EntryQuery, entry_paths, selected_entries
from icefloe.manifests.manifest import ManifestEntry, read_manifest, read_manifest_metadata
from icefloe.manifests.manifest_list import ManifestContent, ManifestFile, read_manifest_list
from icefloe.manifests.store import ManifestStore
from icefloe.spec.partition import PartitionSpec
from icefloe.spec.schema import Schema
from icefloe.spec.snapshot import Snapshot

# Manifests smaller than this are read entry by entry even on the Arrow path (see _split):
# about 500 entries with full metrics.
COLUMNAR_MIN_BYTES = 128 << 10

# Manifests decoded at once by the Arrow walks: the cache's default load concurrency.
_CHUNK = DEFAULT_LOAD_CONCURRENCY


class _LRU:
    """Path → decoded value, bounded by the encoded size of what it holds."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, tuple[int, Any]] = OrderedDict()
        self._bytes = 0

    def get(self, key: str) -> Any:
        hit = self._items.get(key)
        if hit is None:
            return None
        self._items.move_to_end(key)
        return hit[1]

    def put(self, key: str, size: int, value: Any) -> None:
        if size > self.max_bytes:
            return
        old = self._items.pop(key, None)
        if old is not None:
            self._bytes -= old[0]
        self._items[key] = (size, value)
        self._bytes += size
        while self._bytes > self.max_bytes:
            _, (evicted, _) = self._items.popitem(last=False)
            self._bytes -= evicted


class ManifestReader:
    """``store``, when given, is where committers persist the decoded columns of the
    manifests they commit (see :meth:`SnapshotProducer.commit`): a planner reading the same
    directory is then warm for them. They are written in the background by
    ``decoded_writer`` (see :mod:`icefloe.manifests.decoded_writer`), after the commit returns."""

    def __init__(
        self,
        io: FileIO,
        cache_bytes: int = 64 << 20,
        *,
        store: ManifestStore | None = None,
        max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
        columnar: bool = True,
        columnar_min_bytes: int = COLUMNAR_MIN_BYTES,
        columns_cache_bytes: int = 64 << 20,
    ) -> None:
        self.io = io
        self.columnar = columnar
        self.columnar_min_bytes = columnar_min_bytes
        # Decoded columns of the manifests commits look files up in, within their own budget.
        self.columns = ManifestCache(io, columns_cache_bytes)
        self.store = store
        self.decoded_writer = (
            DecodedManifestWriter(store, max_pending_bytes) if store is not None else None
        )
        self._cache = _LRU(cache_bytes)

    async def manifests(self, snapshot: Snapshot) -> list[ManifestFile]:
        """The snapshot's manifests (v1 snapshots listing manifests directly are supported)."""
        if snapshot.manifest_list is not None:
            key = snapshot.manifest_list
            cached = self._cache.get(key)
            if cached is None:
                data = await self.io.read(key)
                cached = read_manifest_list(data, location=key)
                self._cache.put(key, len(data), cached)
            return list(cached)
        out = []
        for path in snapshot.manifests or ():
            data = await self.io.read(path)
            meta = read_manifest_metadata(data, location=path)
            try:
                spec_id = int(meta.get("partition-spec-id", "0"))
            except ValueError:
                raise InvalidFileError(
                    path, "partition-spec-id metadata is not an integer"
                ) from None
            out.append(
                ManifestFile(
                    manifest_path=path,
                    manifest_length=len(data),
                    partition_spec_id=spec_id,
                    content=ManifestContent.DATA,
                    sequence_number=0,
                    min_sequence_number=0,
                    added_snapshot_id=snapshot.snapshot_id,
                )
            )
        return out

    def remember_manifest_list(self, path: str, size: int, manifests: list[ManifestFile]) -> None:
        """Cache a manifest list this process has just written, as reading it would return it.

        The next commit on the table builds on exactly this list, so a committer that
        shares the reader never decodes its own output again.
        """
        self._cache.put(path, size, list(manifests))

    def remember_manifest(self, manifest: ManifestFile, entries: list[ManifestEntry]) -> None:
        """Cache the entries of a manifest this process has just committed, as
        :meth:`entries` would read them (inherited values filled in from ``manifest``, its
        committed list row).

        A coordinator's next commit on the table rewrites the delete manifest the last one
        wrote (the deletion vectors it replaces are in it): without this it would read back
        and decode every entry it has just encoded."""
        self._cache.put(manifest.manifest_path, manifest.manifest_length, list(entries))

    async def entries(
        self,
        manifest: ManifestFile,
        specs: Mapping[int, PartitionSpec],
        *,
        live_only: bool = False,
    ) -> list[ManifestEntry]:
        """The manifest's entries with inherited snapshot ids and sequence numbers filled in."""
        _check_spec(manifest, specs)
        key = manifest.manifest_path
        cached: list[ManifestEntry] | None = self._cache.get(key)
        if cached is None:
            data = await self.io.read(key)
            cached = read_manifest(data, location=key, manifest_file=manifest, spec_by_id=specs)
            self._cache.put(key, len(data), cached)
        if live_only:
            return [e for e in cached if e.is_live]
        return list(cached)

    async def decoded(
        self, manifests: list[ManifestFile], specs: Mapping[int, PartitionSpec], schema: Schema
    ) -> list[CachedManifest]:
        """The manifests as the planner's Arrow columns (read and decoded concurrently, off
        the event loop, and cached)."""
        for m in manifests:
            _check_spec(m, specs)
        return await self.columns.manifests(manifests, specs, schema)

    async def _decoded_chunks(
        self, manifests: list[ManifestFile], specs: Mapping[int, PartitionSpec], schema: Schema
    ) -> AsyncIterator[tuple[ManifestFile, CachedManifest]]:
        """Decoded manifests a chunk at a time (as many as the cache loads at once), so a
        walk over a large table holds the columns of one chunk beyond the cache's budget,
        not of every manifest."""
        for start in range(0, len(manifests), _CHUNK):
            chunk = manifests[start : start + _CHUNK]
            for pair in zip(chunk, await self.decoded(chunk, specs, schema)):
                yield pair

    def _split(self, manifests: list[ManifestFile]) -> tuple[list[ManifestFile], set[str]]:
        """The manifests to decode as Arrow, and the paths of the rest (read entry by entry):
        small manifests are cheaper through fastavro than the native reader's fixed costs
        (the first decode in a process starts DataFusion, seconds on a loaded machine)."""
        if not self.columnar:
            return [], {m.manifest_path for m in manifests}
        # A manifest whose entries are cached as objects (read before, or remembered at
        # commit) is answered from them, however large: no read, no decode.
        large = [
            m
            for m in manifests
            if m.manifest_length >= self.columnar_min_bytes
            and self._cache.get(m.manifest_path) is None
        ]
        small = {m.manifest_path for m in manifests} - {m.manifest_path for m in large}
        return large, small

    async def select(
        self,
        manifests: list[ManifestFile],
        specs: Mapping[int, PartitionSpec],
        schema: Schema,
        query: EntryQuery,
        *,
        with_metrics: bool = True,
    ) -> list[tuple[ManifestFile, list[ManifestEntry]]]:
        """The entries ``query`` selects, per manifest that has any (in the given order).

        ``with_metrics=False`` lets the Arrow path leave the column metric maps out of the
        entries (most of the cost of building one); entries read one by one have them."""
        large, small = self._split(manifests)
        found: dict[str, list[ManifestEntry]] = {}
        async for m, decoded in self._decoded_chunks(large, specs, schema):
            found[m.manifest_path] = selected_entries(decoded, query, with_metrics=with_metrics)
        out: list[tuple[ManifestFile, list[ManifestEntry]]] = []
        for m in manifests:
            if m.manifest_path in small:
                hits = [e for e in await self.entries(m, specs) if query.matches(e)]
            else:
                hits = found[m.manifest_path]
            if hits:
                out.append((m, hits))
        return out

    async def file_paths(
        self,
        manifests: list[ManifestFile],
        specs: Mapping[int, PartitionSpec],
        schema: Schema,
        *,
        live_only: bool = True,
    ) -> set[str]:
        """Paths of the entries of ``manifests`` (only the live ones with ``live_only``)."""
        large, small = self._split(manifests)
        paths: set[str] = set()
        for m in manifests:
            if m.manifest_path in small:
                entries = await self.entries(m, specs, live_only=live_only)
                paths.update(e.data_file.file_path for e in entries)
        async for _, decoded in self._decoded_chunks(large, specs, schema):
            paths.update(entry_paths(decoded, live_only=live_only))
        return paths


def _check_spec(manifest: ManifestFile, specs: Mapping[int, PartitionSpec]) -> None:
    if manifest.partition_spec_id not in specs:
        raise ValidationError(
            f"manifest {manifest.manifest_path} uses partition spec "
            f"{manifest.partition_spec_id}, which the table does not have"
        )
