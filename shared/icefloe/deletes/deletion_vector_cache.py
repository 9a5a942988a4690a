"""A bounded cache of deleted positions, keyed by the immutable bytes that hold them.

A row delta on v3 merges each target data file's new deleted positions with the DV the file
already has, so every upsert commit would re-read (a ranged read and a Roaring decode) the
DVs the previous commit of the same coordinator just wrote: on a table whose upserts keep
hitting the same files that read is most of the merge. The coordinator owns the table's
commits, so it keeps what it wrote (and what it read) here, across commits.

Staleness is ruled out by what the cache is keyed by, not by invalidation: an entry is the
positions held by one *delete file's content*, named by its path, its blob offset and its
length (and, for a position delete file, the data file whose positions were taken from it).
Iceberg files are immutable and every writer names a new file (a UUID), so those bytes hold
those positions forever. The committer still finds, on each attempt's base, which DV (or
position delete file) each target file has *in that snapshot*, from the manifests; it only
looks the positions up here. So:

* a foreign engine that deletes rows between two of our commits writes a new DV (a new
  Puffin file): its key is not here, it is read, and the old entry is simply never asked
  for again (it ages out, or is dropped when a merge replaces it);
* an attempt that wrote its Puffin file and then crashed, or lost its swap, leaves an entry
  that no snapshot names: the next attempt (this process or the next owner, which starts
  empty) meets the base's own DV and reads or finds *that* one; nothing can be poisoned;
* an entry is never mutated: :meth:`DeletionVector.union` returns a new vector.

Memory is bounded by ``max_bytes``, counted as each vector's serialized size (the blob's
length, about what its Roaring containers take in memory), least recently used first out.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Final

from icefloe.deletes.deletion_vector import DeletionVector
from icefloe.spec.datafile import DataFile

DEFAULT_MAX_BYTES: Final = 64 * 2**20
# What an entry costs beyond its bytes (the key, the dict slot, the vector object).
_ENTRY_OVERHEAD: Final = 256

CacheKey = tuple[str, int | None, int | None, str]
"""(delete file path, blob offset, blob length, data file path): one immutable source of
positions for one data file."""


def cache_key(delete_file: DataFile, data_path: str) -> CacheKey:
    """The key of the positions ``delete_file`` holds for ``data_path``."""
    return (
        delete_file.file_path,
        delete_file.content_offset,
        delete_file.content_size_in_bytes,
        data_path,
    )


@dataclass(slots=True)
class CacheStats:
    """Hits, misses and what the cache holds (for benchmarks and tests)."""

    hits: int = 0
    misses: int = 0
    evictions: int = 0
    entries: int = 0
    bytes: int = 0


class DeletionVectorCache:
    """Positions by delete file content (:data:`CacheKey`), least recently used out first
    once they take more than ``max_bytes``. Not thread safe: one event loop uses it."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes={max_bytes} must be >= 0")
        self.max_bytes = max_bytes
        self._entries: OrderedDict[CacheKey, tuple[DeletionVector, int]] = OrderedDict()
        self.stats = CacheStats()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def get(self, key: CacheKey) -> DeletionVector | None:
        found = self._entries.get(key)
        if found is None:
            self.stats.misses += 1
            return None
        self._entries.move_to_end(key)
        self.stats.hits += 1
        return found[0]

    def put(self, key: CacheKey, vector: DeletionVector, size: int | None = None) -> None:
        """Remember ``vector`` as the positions under ``key``; ``size`` is its serialized
        length when known (a DV entry's ``content_size_in_bytes``)."""
        cost = _ENTRY_OVERHEAD + (size if size is not None else 8 * len(vector))
        if cost > self.max_bytes:
            return  # bigger than the whole budget: not worth evicting everything for
        self.discard(key)
        self._entries[key] = (vector, cost)
        self.stats.bytes += cost
        while self.stats.bytes > self.max_bytes:
            _, (_, dropped) = self._entries.popitem(last=False)
            self.stats.bytes -= dropped
            self.stats.evictions += 1
        self.stats.entries = len(self._entries)

    def discard(self, key: CacheKey) -> None:
        """Forget ``key`` (its delete file was replaced: nothing will ask for it again)."""
        found = self._entries.pop(key, None)
        if found is not None:
            self.stats.bytes -= found[1]
        self.stats.entries = len(self._entries)

    def clear(self) -> None:
        self._entries.clear()
        self.stats.bytes = 0
        self.stats.entries = 0


__all__ = ["DEFAULT_MAX_BYTES", "CacheKey", "CacheStats", "DeletionVectorCache", "cache_key"]
