"""Where each key of a keyed table lives: key → (data file, row position).

An upsert or a delete by key must find the rows it replaces. Writers cannot know (many write
at once, and other engines change the table), so the coordinator resolves keys at commit,
against the table it commits on, and turns them into deletion vectors (v3) or position
deletes (v2): no equality delete ever reaches the table, and readers pay nothing.

The index is a function of *which data files it covers* and nothing else: it maps each key
of each covered file to the positions holding it. Data files are immutable, so an entry can
never become wrong, only irrelevant (its file no longer live) or dead (its row deleted since,
which is harmless: deleting a deleted row again changes nothing). :meth:`KeyIndex.sync`
makes the covered set equal to the live data files of the snapshot a commit builds on,
reading the key columns of files it did not cover and forgetting files no longer live, so
the index stays true after any change any engine makes: compaction (positions move into new
files), other engines' appends, deletes and MERGE, rollback, expiry.

Within one snapshot an upsert must also find rows that earlier upserts of the same batch add:
:meth:`KeyIndex.stage` adds such not-yet-committed files for the current attempt, and
:meth:`KeyIndex.discard_staged` forgets them when the attempt is abandoned.

How it scales:

* Keys are fixed-width words (:mod:`icefloe.key_index.encoding`: the exact ``int64`` of a
  single integer-like key, else a 128-bit digest of the key tuple), kept in sorted runs of
  flat numpy arrays (:mod:`icefloe.key_index.runs`), 16 or 24 bytes a key. Lookup is a
  vectorized binary search of the sorted batch in every run.
* Runs form an LSM: each sync adds a run for the files it read, and a run is merged into
  the one before it while that one is no bigger, so a table of N keys has O(log N) runs and
  each key is rewritten O(log N) times. Forgotten files are masked, and dropped when their
  run is merged or when they are most of it.
* Memory is bounded by ``memory_budget_bytes``: beyond it the biggest runs move to Arrow IPC
  files in ``spill_dir``, memory-mapped and searched in place. No run grows past an eighth
  of the budget, which also bounds the transient buffers of a merge.
* :meth:`KeyIndex.checkpoint` writes the runs built since the last checkpoint and a small
  manifest under the table location (:mod:`icefloe.key_index.checkpoint`);
  :meth:`KeyIndex.open` loads the newest whole checkpoint, and its first ``sync`` reads only
  the files committed since. A checkpoint only ever says which files' keys it holds, so an
  old or skipped one costs reading time, never a missed row.

Reading a data file's keys fetches its footer and then only the key columns' chunks
(:mod:`icefloe.key_index.key_columns`), not the whole file. CPU work (decoding, hashing,
sorting, merging, searching) runs in worker threads.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import pyarrow as pa

from icefloe.errors import ValidationError
from icefloe.io.fileio import FileIO
from icefloe.key_index import runs as run_ops
from icefloe.key_index.checkpoint import UNUSABLE, CheckpointStore, RunRef
from icefloe.key_index.encoding import EncodedKeys, KeyEncoding
from icefloe.key_index.key_columns import read_key_columns
from icefloe.key_index.runs import Run
from icefloe.spec.datafile import DataFile, DataFileContent
from icefloe.spec.schema import Schema

log = logging.getLogger(__name__)

Key = tuple[Any, ...]
Positions = np.ndarray[Any, np.dtype[np.int64]]

DEFAULT_MEMORY_BUDGET_BYTES: Final = 256 * 2**20
# Runs up to this size always merge, whatever the budget (a tiny budget still gets an LSM).
_MIN_RUN_CAP_BYTES: Final = 64 * 2**10
# Data files read at once while syncing.
_READ_CONCURRENCY: Final = 8


def key_schema(schema: Schema, key_ids: Sequence[int]) -> Schema:
    """The schema of a table's key columns (its identifier fields), in key order."""
    if not key_ids:
        raise ValidationError(
            f"schema {schema.schema_id} has no identifier fields: upserts and deletes by key "
            "need a keyed table (set identifier-field-ids)"
        )
    fields = []
    for fid in key_ids:
        field = schema.find_field(fid)
        if field is None:
            raise ValidationError(f"identifier field id {fid} is not in schema {schema.schema_id}")
        fields.append(field)
    return Schema(*fields, schema_id=schema.schema_id)


def key_tuples(keys: pa.Table) -> list[Key]:
    """The rows of a key table as tuples (for callers and tests that want Python values)."""
    columns = [c.to_pylist() for c in keys.columns]
    return list(zip(*columns, strict=True)) if columns else []


@dataclass(frozen=True, slots=True)
class SyncChanges:
    """How a live set differs from the one of version ``since``: the paths of the files
    added and of those removed (a hint for :meth:`KeyIndex.sync`; paths of delete files
    may be among them)."""

    since: object
    added: Iterable[str]
    removed: Iterable[str]


@dataclass(frozen=True, slots=True)
class KeyIndexStats:
    """What an index holds: covered files, their keys, runs, and bytes in memory and spilled."""

    files: int
    keys: int
    runs: int
    memory_bytes: int
    spilled_bytes: int


class KeyIndex:
    """Keys of the data files a table's branch holds live, for resolving upserts.

    ``io`` reads data files; ``schema`` and ``key_ids`` name the key columns (the table's
    identifier fields). Positions are returned as sorted ``int64`` numpy arrays.
    ``table_location`` is where checkpoints go (none are written without it);
    ``memory_budget_bytes`` bounds the entries held in memory, the rest being spilled to
    memory-mapped files in ``spill_dir`` (the system's temporary directory by default).
    """

    def __init__(
        self,
        io: FileIO,
        schema: Schema,
        key_ids: Sequence[int],
        *,
        table_location: str | None = None,
        memory_budget_bytes: int = DEFAULT_MEMORY_BUDGET_BYTES,
        spill_dir: str | None = None,
    ) -> None:
        if memory_budget_bytes < 0:
            raise ValidationError(f"memory_budget_bytes={memory_budget_bytes} must be >= 0")
        self.io = io
        self.key_ids = tuple(key_ids)
        self.schema = key_schema(schema, self.key_ids)
        self.encoding = KeyEncoding(self.schema)
        self.memory_budget_bytes = memory_budget_bytes
        self.spill_dir = spill_dir or tempfile.gettempdir()
        self._run_cap = max(memory_budget_bytes // 8, _MIN_RUN_CAP_BYTES)
        self._store = (
            CheckpointStore(io, table_location, self.encoding.signature)
            if table_location is not None
            else None
        )
        self._runs: list[Run] = []
        self._where: dict[str, tuple[Run, int]] = {}  # covered path → (run, index in run)
        self._staged: list[Run] = []
        self._pending: list[tuple[str, pa.Table]] = []  # staged, not yet encoded
        self._stage_generation = 0
        self._version: object = None  # what the last completed sync covered (see sync)
        self._checkpointed: tuple[RunRef, ...] | None = None
        self._lock = asyncio.Lock()
        self._checkpoint_lock = asyncio.Lock()

    @classmethod
    async def open(
        cls,
        io: FileIO,
        table_location: str,
        schema: Schema,
        key_ids: Sequence[int],
        *,
        memory_budget_bytes: int = DEFAULT_MEMORY_BUDGET_BYTES,
        spill_dir: str | None = None,
    ) -> KeyIndex:
        """The index of a table as its newest usable checkpoint under ``table_location``
        left it (empty if there is none); the next ``sync`` brings it to the live files."""
        index = cls(
            io,
            schema,
            key_ids,
            table_location=table_location,
            memory_budget_bytes=memory_budget_bytes,
            spill_dir=spill_dir,
        )
        await index._restore()
        return index

    # -- reading -------------------------------------------------------------------------

    @property
    def covered(self) -> frozenset[str]:
        """Paths of the committed data files the index covers."""
        return frozenset(self._where)

    async def read_keys(self, data_file: DataFile) -> pa.Table:
        """The key columns of a data file, in row order (row ``i`` is position ``i``)."""
        if data_file.content != DataFileContent.DATA:
            raise ValidationError(f"{data_file.file_path} is not a data file")
        return await read_key_columns(self.io, data_file, self.schema)

    async def _read_encoded(self, data_file: DataFile) -> EncodedKeys:
        return await asyncio.to_thread(self.encoding.encode, await self.read_keys(data_file))

    def stats(self) -> KeyIndexStats:
        runs = [*self._runs, *self._staged]
        return KeyIndexStats(
            files=len(self._where),
            keys=sum(r.live_rows for r in self._runs),
            runs=len(runs),
            memory_bytes=sum(r.nbytes for r in runs if not r.spilled),
            spilled_bytes=sum(r.nbytes for r in runs if r.spilled),
        )

    # -- changing ------------------------------------------------------------------------

    async def sync(
        self,
        live: Mapping[str, DataFile],
        *,
        version: object = None,
        changed: SyncChanges | None = None,
    ) -> None:
        """Cover exactly the data files of ``live`` (path → data file; delete files are
        ignored): read the keys of new ones, forget those no longer live. Files staged by
        the current attempt that are now live are taken over without reading them.

        ``version`` names what ``live`` is the live set of (the coordinator passes the
        branch head's snapshot id): a sync to the version the last one reached, with
        nothing staged since, has nothing to do and returns at once, instead of comparing
        millions of paths.

        ``changed`` says how ``live`` differs from the live set of version
        ``changed.since`` (the coordinator's own commit, on the version the last sync
        reached): then only the paths it names are compared, not every live path. Should
        the index then not cover as many files as ``live`` holds (a wrong hint, or delete
        files in ``live``), every path is compared after all."""
        async with self._lock:
            if (
                version is not None
                and version == self._version
                and not self._pending
                and not self._staged
            ):
                return
            previous, self._version = self._version, None
            await self._encode_pending()
            incremental = changed is not None and previous is not None and previous == changed.since
            # A covered path is a data file's; a path never names another kind of file later.
            if incremental:
                assert changed is not None
                for path in changed.removed:
                    if path in self._where and path not in live:
                        run, i = self._where.pop(path)
                        run.alive[i] = False
            else:
                # Set operations on the key views (in C): a table of millions of files
                # changes by a few per commit, and this runs on every commit.
                self._forget(self._where.keys() - live.keys())
            promoted, taken = [], set()
            for run in self._staged:
                for i, path in enumerate(run.paths):
                    f = live.get(path)
                    if (
                        f is None
                        or f.content != DataFileContent.DATA
                        or path in self._where
                        or path in taken
                    ):
                        run.alive[i] = False
                    taken.add(path)
                if run.alive.any():
                    promoted.append(run)
            self._staged = []
            await self._install(promoted)
            if incremental:
                assert changed is not None
                fresh = {p for p in changed.added if p in live and p not in self._where}
                new = [f for p in fresh if (f := live[p]).content == DataFileContent.DATA]
                if len(self._where) + len(new) != len(live):
                    self._forget(self._where.keys() - live.keys())
                    incremental = False
            if not incremental:
                new = [
                    f
                    for p in live.keys() - self._where.keys()
                    if (f := live[p]).content == DataFileContent.DATA
                ]
            batch: list[tuple[str, EncodedKeys]] = []
            batch_bytes = 0
            for start in range(0, len(new), _READ_CONCURRENCY):
                window = new[start : start + _READ_CONCURRENCY]
                encoded = await asyncio.gather(*(self._read_encoded(f) for f in window))
                for data_file, keys in zip(window, encoded, strict=True):
                    batch.append((data_file.file_path, keys))
                    batch_bytes += keys.hi.nbytes * (2 if keys.lo is None else 3)
                if batch_bytes >= self._run_cap:
                    await self._install([await asyncio.to_thread(run_ops.build, batch)])
                    batch, batch_bytes = [], 0
            if batch:
                await self._install([await asyncio.to_thread(run_ops.build, batch)])
            self._version = version

    def _forget(self, paths: Iterable[str]) -> None:
        """Stop covering ``paths`` (no longer live)."""
        for path in paths:
            run, i = self._where.pop(path)
            run.alive[i] = False

    async def adopt(self, run: Run) -> None:
        """Cover the files of a run built elsewhere (:func:`icefloe.key_index.runs.build`):
        a bulk load, such as a rebuild done out of process or a benchmark's synthetic
        table. None of its files may be covered already."""
        async with self._lock:
            clash = [p for p in run.paths if p in self._where]
            if clash:
                raise ValidationError(
                    f"cannot adopt a run covering {len(clash)} file(s) the index already "
                    f"covers, such as {clash[0]}"
                )
            await self._install([run])
            self._version = None

    def stage(self, data_file: DataFile, keys: pa.Table) -> None:
        """Cover a data file the current attempt adds (its key columns given)."""
        if keys.num_rows != data_file.record_count:
            raise ValidationError(
                f"{data_file.file_path}: {keys.num_rows} key rows for "
                f"{data_file.record_count} records"
            )
        self.encoding.conform(keys)  # refuse bad keys now, not at the next lookup
        self._pending.append((data_file.file_path, keys))

    def discard_staged(self) -> None:
        """Forget the files staged by an attempt that will not commit."""
        self._pending.clear()
        self._staged = []
        self._stage_generation += 1

    async def _encode_pending(self) -> None:
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        generation = self._stage_generation

        def build() -> Run:
            return run_ops.build([(p, self.encoding.encode(k)) for p, k in pending])

        run = await asyncio.to_thread(build)
        if generation == self._stage_generation:  # not discarded meanwhile
            self._staged.append(run)

    async def _install(self, added: Sequence[Run]) -> None:
        """Add runs, then merge, drop and spill (in a thread) and index the new runs' files."""
        before = {id(r) for r in self._runs}
        settled = await asyncio.to_thread(self._settle, [*self._runs, *added])
        self._runs = settled
        for run in settled:
            if id(run) not in before:
                for i, path in enumerate(run.paths):
                    if run.alive[i]:
                        self._where[path] = (run, i)

    def _settle(self, runs: list[Run]) -> list[Run]:
        """The LSM's upkeep: drop empty runs, rewrite mostly dead ones, merge each run into
        the one before it while that is no bigger (and the result within the run cap), and
        spill the biggest runs while memory is over budget."""
        out: list[Run] = []
        for run in runs:
            if not run.alive.any():
                continue
            if 2 * run.live_rows < len(run):
                run = run_ops.merge([run])
            out.append(run)
            while (
                len(out) >= 2
                and out[-2].live_rows <= out[-1].live_rows
                and out[-2].nbytes + out[-1].nbytes <= self._run_cap
            ):
                out[-2:] = [run_ops.merge(out[-2:])]
        memory = sum(r.nbytes for r in [*out, *self._staged] if not r.spilled)
        while memory > self.memory_budget_bytes:
            resident = [i for i, r in enumerate(out) if not r.spilled]
            if not resident:
                break
            biggest = max(resident, key=lambda i: out[i].nbytes)
            memory -= out[biggest].nbytes
            out[biggest] = run_ops.spill(out[biggest], self.spill_dir, self.encoding.signature)
        return out

    # -- lookup --------------------------------------------------------------------------

    async def lookup(self, keys: pa.Table) -> dict[str, Positions]:
        """Data file path → sorted positions of the rows (covered or staged) whose key is
        one of ``keys``. Rows already deleted may be included: deleting them again is a
        no-op."""
        async with self._lock:
            await self._encode_pending()
            runs = [*self._runs, *self._staged]
            if keys.num_rows == 0 or not runs:
                self.encoding.conform(keys)
                return {}
            return await asyncio.to_thread(self._lookup, keys, runs)

    def _lookup(self, keys: pa.Table, runs: list[Run]) -> dict[str, Positions]:
        encoded = self.encoding.encode(keys)
        if encoded.lo is None:
            hi, lo = _distinct(np.sort(encoded.hi)), None
        else:
            order = np.lexsort((encoded.lo, encoded.hi))
            hi, lo = encoded.hi[order], encoded.lo[order]
            distinct = np.ones(len(hi), dtype=np.bool_)
            distinct[1:] = (hi[1:] != hi[:-1]) | (lo[1:] != lo[:-1])
            hi, lo = hi[distinct], lo[distinct]
        found: dict[str, list[np.ndarray[Any, np.dtype[Any]]]] = {}
        for run in runs:
            file_ids, positions = run_ops.probe(run, hi, lo)
            if not len(file_ids):
                continue
            order = np.argsort(file_ids, kind="stable")
            file_ids, positions = file_ids[order], positions[order]
            cuts = np.flatnonzero(np.diff(file_ids)) + 1
            for ids, pos in zip(np.split(file_ids, cuts), np.split(positions, cuts), strict=True):
                found.setdefault(run.paths[int(ids[0])], []).append(pos)
        return {
            path: _distinct(np.sort(np.concatenate(parts)).astype(np.int64))
            for path, parts in found.items()
        }

    # -- checkpoints ---------------------------------------------------------------------

    async def checkpoint(self) -> None:
        """Persist what a new owner needs to resume without rescanning: the runs written
        since the last checkpoint, then a manifest naming all of them. Does nothing when
        the index has no table location or nothing changed since the last checkpoint."""
        store = self._store
        if store is None:
            return
        async with self._checkpoint_lock:
            async with self._lock:
                runs = list(self._runs)
                dead = [tuple(np.flatnonzero(~r.alive).tolist()) for r in runs]
            refs = []
            for run, gone in zip(runs, dead, strict=True):
                # A run another owner's cleanup removed (two owners after a rebalance) is
                # written again: a manifest must never name a missing run.
                if run.name is None or not await store.has_run(run.name):
                    data, name = await asyncio.to_thread(self._serialized, run)
                    await store.write_run(name, data)
                    run.name = name
                refs.append(RunRef(run.name, gone))
            if tuple(refs) == self._checkpointed:
                return
            await store.write_manifest(refs)
            self._checkpointed = tuple(refs)
            await store.cleanup()

    def _serialized(self, run: Run) -> tuple[bytes, str]:
        data = run_ops.serialize(run, self.encoding.signature)
        return data.to_pybytes(), run_ops.digest(data)

    async def _restore(self) -> None:
        """Load the newest usable checkpoint (skipping, with a warning, any that is not)."""
        store = self._store
        assert store is not None
        for seq, location in await store.manifests():
            try:
                manifest = await store.read_manifest(seq, location)
                runs: list[Run] = []
                memory = 0
                for ref in manifest.runs:
                    data = await store.read_run(ref.name)
                    spill = (
                        self.spill_dir if memory + len(data) > self.memory_budget_bytes else None
                    )
                    run = await asyncio.to_thread(
                        run_ops.load, data, spill, self.encoding.signature, self.encoding.exact
                    )
                    if any(i >= len(run.paths) for i in ref.dead):
                        raise ValidationError(f"{location}: run {ref.name} has no file {ref.dead}")
                    run.alive[list(ref.dead)] = False
                    run.name = ref.name
                    memory += 0 if run.spilled else run.nbytes
                    runs.append(run)
            except UNUSABLE as e:
                log.warning("key index checkpoint %s is not usable, skipped: %s", location, e)
                continue
            seen: set[str] = set()
            for run in runs:  # a file in two runs (never written so) is covered once
                for i, path in enumerate(run.paths):
                    if run.alive[i] and path in seen:
                        run.alive[i] = False
                    elif run.alive[i]:
                        seen.add(path)
            self._checkpointed = tuple(
                RunRef(r.name or "", tuple(np.flatnonzero(~r.alive).tolist())) for r in runs
            )
            await self._install(runs)
            return


def _distinct(ordered: np.ndarray[Any, np.dtype[Any]]) -> np.ndarray[Any, np.dtype[Any]]:
    """The distinct values of a sorted array (``np.unique`` hashes: over ten times slower
    on the few thousand values a lookup handles)."""
    if len(ordered) < 2:
        return ordered
    keep = np.ones(len(ordered), dtype=np.bool_)
    keep[1:] = ordered[1:] != ordered[:-1]
    return ordered[keep]


__all__ = [
    "DEFAULT_MEMORY_BUDGET_BYTES",
    "Key",
    "KeyIndex",
    "KeyIndexStats",
    "Positions",
    "SyncChanges",
    "key_schema",
    "key_tuples",
]
