"""Sorted runs: the key index's unit of storage, search, merge, spill and checkpoint.

A run holds the entries (key words, file, position) of a few data files, sorted by the key's
first word, in four flat numpy arrays: ``hi`` (``int64`` exact keys or ``uint64`` digest
words), ``lo`` (the second digest word, absent for exact keys), ``file`` (``uint32``, an
index into the run's own ``paths``) and ``pos`` (``uint32`` row positions). That is 16 bytes
an entry for exact keys and 24 for hashed ones, with no Python object per key.

A run never changes once built. Files leave a run by being marked dead in its ``alive``
mask; merging runs (:func:`merge`) drops dead entries, which is how the index's LSM keeps
both the number of runs (lookup cost) and the dead weight small.

The serialized form is an Arrow IPC file (one record batch, the paths in the schema
metadata): the same bytes are a spilled run (memory-mapped, searched in place) and a
checkpointed run (named by the SHA-256 of its bytes, so a run is written once however many
checkpoints name it, and a damaged copy is recognised).
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import pyarrow as pa

from icefloe.errors import ValidationError
from icefloe.key_index.encoding import EncodedKeys, Words

RUN_FORMAT: Final = "icefloe-key-index-run/1"
_METADATA_KEY: Final = b"icefloe.key-index.run"
_MAX_POSITIONS: Final = 2**32


@dataclass(eq=False)
class Run:
    """Entries of the data files ``paths``, sorted by ``hi``; see the module docstring."""

    hi: Words
    lo: Words | None
    file: Words
    pos: Words
    paths: tuple[str, ...]
    # Whether each of ``paths`` is still covered; entries of dead files are skipped.
    alive: np.ndarray[Any, np.dtype[np.bool_]] = field(init=False)
    # Entries per file of ``paths``, for the dead weight.
    file_rows: Words = field(init=False)
    # SHA-256 of the serialized bytes once known (spilled or checkpointed).
    name: str | None = None
    # The memory map a spilled run's arrays view (None while they live in memory).
    mapped: pa.MemoryMappedFile | pa.Buffer | None = None

    def __post_init__(self) -> None:
        self.alive = np.ones(len(self.paths), dtype=np.bool_)
        self.file_rows = np.bincount(self.file, minlength=len(self.paths))
        if len(self.file_rows) != len(self.paths):
            raise ValidationError("run entries name files beyond its path list")

    def __len__(self) -> int:
        return len(self.hi)

    @property
    def nbytes(self) -> int:
        """Bytes of the entry arrays (in memory, or mapped from disk when spilled)."""
        lo = 0 if self.lo is None else self.lo.nbytes
        return int(self.hi.nbytes + lo + self.file.nbytes + self.pos.nbytes)

    @property
    def spilled(self) -> bool:
        return isinstance(self.mapped, pa.MemoryMappedFile)

    @property
    def live_rows(self) -> int:
        return int(self.file_rows[self.alive].sum())

    @property
    def live_paths(self) -> list[str]:
        return [p for p, a in zip(self.paths, self.alive.tolist(), strict=True) if a]


def build(files: Sequence[tuple[str, EncodedKeys]]) -> Run:
    """One run over the keys of ``files`` (path, keys in row order)."""
    counts = np.array([len(keys) for _, keys in files], dtype=np.int64)
    if counts.size and int(counts.max()) >= _MAX_POSITIONS:
        big = files[int(counts.argmax())][0]
        raise ValidationError(f"{big}: more than 2**32 rows in one data file")
    total = int(counts.sum())
    exact = bool(files) and files[0][1].lo is None
    hi = np.concatenate([k.hi for _, k in files]) if files else np.empty(0, np.int64)
    lo = (
        None if exact or not files else np.concatenate([k.lo for _, k in files if k.lo is not None])
    )
    file_ids = np.repeat(np.arange(len(files), dtype=np.uint32), counts)
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    pos = (np.arange(total, dtype=np.int64) - starts).astype(np.uint32)
    order = sort_order(hi)
    return Run(
        hi[order],
        None if lo is None else lo[order],
        file_ids[order],
        pos[order],
        tuple(path for path, _ in files),
    )


def sort_order(hi: Words) -> Words:
    """The permutation that sorts ``hi`` (int64 or uint64).

    ``np.argsort`` of 64-bit values is several times slower than ``np.sort`` (which has
    SIMD kernels), so the row index is packed into the low bits of one ``uint64`` beside
    the key and that is value-sorted: exact when the keys span fewer than
    ``2**(64 - index bits)`` values (identifiers, dates, timestamps), else by the keys' top
    bits, which orders random digests all but completely; a final check catches the rest
    and finishes with a stable sort that finds the order nearly done.
    """
    n = len(hi)
    if n < 2:
        return np.arange(n)
    bits = (n - 1).bit_length()
    index_mask = np.uint64((1 << bits) - 1)
    # An order-preserving view as uint64: flip the sign bit of int64 keys.
    unsigned = hi.view(np.uint64) ^ np.uint64(1 << 63) if hi.dtype == np.int64 else hi
    low = unsigned.min()
    span = int(unsigned.max() - low)
    index = np.arange(n, dtype=np.uint64)
    if span < 1 << (64 - bits):
        packed = ((unsigned - low) << np.uint64(bits)) | index
    else:
        packed = (unsigned & ~index_mask) | index
    packed.sort()
    order = (packed & index_mask).astype(np.int64)
    ordered = hi[order]
    if bool(np.any(ordered[1:] < ordered[:-1])):
        order = order[np.argsort(ordered, kind="stable")]
    return order


def merge(runs: Sequence[Run]) -> Run:
    """One run with the live entries of ``runs`` (their dead files dropped)."""
    his, los, files, poss = [], [], [], []
    paths: list[str] = []
    for run in runs:
        keep = run.alive[run.file]
        renumber = np.cumsum(run.alive, dtype=np.int64) - 1 + len(paths)
        his.append(run.hi[keep])
        if run.lo is not None:
            los.append(run.lo[keep])
        files.append(renumber[run.file[keep]].astype(np.uint32))
        poss.append(run.pos[keep])
        paths.extend(run.live_paths)
    hi = np.concatenate(his)
    # Timsort finds the input runs already sorted: merging is linear, not n log n.
    order = np.argsort(hi, kind="stable")
    return Run(
        hi[order],
        np.concatenate(los)[order] if los else None,
        np.concatenate(files)[order],
        np.concatenate(poss)[order],
        tuple(paths),
    )


def probe(
    run: Run, hi: Words, lo: Words | None
) -> tuple[np.ndarray[Any, np.dtype[np.int64]], Words]:
    """(file ids, positions) of the live entries of ``run`` whose key is one of the keys
    ``hi``/``lo`` (which must be distinct; sorted is faster)."""
    left = np.searchsorted(run.hi, hi, side="left")
    right = np.searchsorted(run.hi, hi, side="right")
    counts = right - left
    total = int(counts.sum())
    if total == 0:
        return np.empty(0, np.int64), np.empty(0, np.uint32)
    hit = counts > 0
    left, counts = left[hit], counts[hit]
    idx = np.repeat(left - (np.cumsum(counts) - counts), counts) + np.arange(total)
    if lo is not None:
        assert run.lo is not None
        idx = idx[run.lo[idx] == np.repeat(lo[hit], counts)]
    file_ids = run.file[idx].astype(np.int64)
    live = run.alive[file_ids]
    return file_ids[live], run.pos[idx][live]


# ---------------------------------------------------------------------------------------
# Serialized form
# ---------------------------------------------------------------------------------------


def serialize(run: Run, signature: str) -> pa.Buffer:
    """The run as an Arrow IPC file; ``signature`` is the key encoding it was made under."""
    if isinstance(run.mapped, pa.MemoryMappedFile):
        run.mapped.seek(0)
        return run.mapped.read_buffer()
    if isinstance(run.mapped, pa.Buffer):
        return run.mapped
    columns = {"hi": run.hi, **({"lo": run.lo} if run.lo is not None else {})}
    columns |= {"file": run.file, "pos": run.pos}
    meta = {"format": RUN_FORMAT, "signature": signature, "paths": list(run.paths)}
    batch = pa.record_batch(
        [pa.array(v) for v in columns.values()],
        schema=pa.schema(
            [pa.field(k, pa.from_numpy_dtype(v.dtype), nullable=False) for k, v in columns.items()],
            metadata={_METADATA_KEY: json.dumps(meta).encode()},
        ),
    )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue()


def digest(data: pa.Buffer | bytes) -> str:
    return hashlib.sha256(memoryview(data)).hexdigest()


def deserialize(data: pa.Buffer | pa.MemoryMappedFile, signature: str, exact: bool) -> Run:
    """A run from its serialized bytes, checked: the format, the encoding it was made under,
    the column types, the sort order and the file ids. Raises ValidationError otherwise."""
    try:
        source = data if isinstance(data, pa.MemoryMappedFile) else pa.BufferReader(data)
        reader = pa.ipc.open_file(source)
        if reader.num_record_batches != 1:
            raise ValidationError(f"{reader.num_record_batches} record batches, expected 1")
        batch = reader.get_batch(0)
        meta = json.loads((batch.schema.metadata or {}).get(_METADATA_KEY, b"null"))
    except (pa.ArrowException, ValueError, OSError) as e:
        raise ValidationError(f"not a key index run: {e}") from e
    if not isinstance(meta, dict) or meta.get("format") != RUN_FORMAT:
        raise ValidationError("not a key index run (no run metadata)")
    if meta.get("signature") != signature:
        raise ValidationError(f"made for keys {meta.get('signature')!r}, not {signature!r}")
    paths = meta.get("paths")
    if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
        raise ValidationError("run metadata has no path list")
    expected = {"hi": pa.int64() if exact else pa.uint64(), "file": pa.uint32(), "pos": pa.uint32()}
    if not exact:
        expected["lo"] = pa.uint64()
    if set(batch.schema.names) != set(expected):
        raise ValidationError(f"run columns {batch.schema.names}, expected {sorted(expected)}")
    arrays: dict[str, Words] = {}
    for name, dtype in expected.items():
        column = batch.column(name)
        if column.type != dtype or column.null_count:
            raise ValidationError(f"run column {name} is {column.type} with nulls or mistyped")
        arrays[name] = column.to_numpy(zero_copy_only=True)
    hi = arrays["hi"]
    if len(hi) > 1 and bool(np.any(hi[1:] < hi[:-1])):
        raise ValidationError("run keys are not sorted")
    run = Run(hi, arrays.get("lo"), arrays["file"], arrays["pos"], tuple(paths))
    run.mapped = data
    return run


def _mapped_copy(data: pa.Buffer | bytes, directory: str) -> pa.MemoryMappedFile:
    """``data`` written to a file in ``directory`` and memory-mapped. The file is unlinked
    at once (the mapping keeps it), so a crash leaves nothing behind."""
    path = os.path.join(directory, f"icefloe-key-index-{uuid.uuid4().hex}.arrow")
    with open(path, "wb") as f:
        f.write(memoryview(data))
    try:
        return pa.memory_map(path)
    finally:
        os.unlink(path)


def spill(run: Run, directory: str, signature: str) -> Run:
    """The run moved to disk: same entries and ``alive`` mask, its arrays now paged from a
    memory-mapped file in ``directory``."""
    spilled = deserialize(
        _mapped_copy(serialize(run, signature), directory), signature, run.lo is None
    )
    spilled.alive = run.alive
    spilled.name = run.name
    return spilled


def load(data: bytes, directory: str | None, signature: str, exact: bool) -> Run:
    """A checkpointed run from its bytes: in memory, or (``directory`` given) spilled."""
    source = pa.py_buffer(data) if directory is None else _mapped_copy(data, directory)
    return deserialize(source, signature, exact)


__all__ = [
    "RUN_FORMAT",
    "Run",
    "build",
    "deserialize",
    "digest",
    "load",
    "merge",
    "probe",
    "serialize",
    "spill",
]
