"""What resolving upsert keys costs: the key index at 1M and 10M keys, long and string keys.

The coordinator resolves each key of an upsert batch to the rows it replaces through
:class:`~icefloe.key_index.KeyIndex`. Figures, for a single ``long`` key (exact ``int64``
words) and a single ``string`` key (128-bit digests), over ``keys`` (1M) and ``big_keys``
(10M) distinct keys in ``files`` Parquet files on the local disk:

* **rebuild**: ``sync`` from empty (read, decode, encode, sort every key), in keys/s.
  Peers: the dict-per-key reference the index replaced (1M only: at 10M it takes minutes
  and gigabytes), and decoding the key columns alone (the floor any rebuild pays).
* **resume**: ``open`` from the newest checkpoint plus the ``sync`` that adds one file
  committed since, beside a rebuild of the same live set.
* **lookup**: one batch of ``batch`` keys (10k, half of them present). Peers: the same
  index with every run spilled (memory budget 0), the reference's dict lookups (1M), and a
  scan of every key with pyarrow's ``is_in`` (no index at all).

Bytes per key in memory (the run arrays), on disk (the checkpoint's run files) and the
reference's (``tracemalloc`` on a 100k sample) are printed as notes.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import tracemalloc
from collections import defaultdict
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from icefloe.dev.bench import BenchContext, Figure, Kind, benchmark
from icefloe.io.fileio import LocalFileIO
from icefloe.key_index import KeyIndex, key_tuples
from icefloe.key_index.checkpoint import CHECKPOINT_DIR
from icefloe.parquet.files import write_data_file
from icefloe.spec.datafile import DataFile
from icefloe.spec.schema import Schema
from icefloe.spec.types import LongType, NestedField, StringType

KINDS = ("long", "string")


def _schema(kind: str) -> Schema:
    key = LongType() if kind == "long" else StringType()
    return Schema(
        NestedField(1, "k", key, required=True),
        NestedField(2, "v", LongType()),
        identifier_field_ids=[1],
    )


def _keys(kind: str, values: np.ndarray[Any, np.dtype[np.int64]]) -> pa.Array:
    """Distinct keys from distinct integers: the integers, or strings like ``user-…``."""
    ints = pa.array(values, pa.int64())
    if kind == "long":
        return ints
    text = pc.cast(ints, pa.large_string())

    def lit(v: str) -> pa.Scalar:
        return pa.scalar(v, pa.large_string())

    return pc.binary_join_element_wise(lit("user-"), text, lit("-eu"), lit(""))


def _write_files(kind: str, directory: Path, keys: int, files: int) -> list[DataFile]:
    """``keys`` distinct keys, shuffled, in ``files`` data files."""
    directory.mkdir(parents=True)
    rng = np.random.default_rng(19)
    values = rng.permutation(keys).astype(np.int64) * 7919 + 13
    schema = _schema(kind)
    out = []
    for n, part in enumerate(np.array_split(values, files)):
        rows = pa.table({"k": _keys(kind, part), "v": pa.array(part)})
        path = str(directory / f"f{n:04d}.parquet")
        out.append(write_data_file(rows, path, schema=schema, file_path=path))
    return out


def _batch(kind: str, keys: int, size: int) -> pa.Table:
    """``size`` keys to look up: half present, half absent."""
    rng = np.random.default_rng(7)
    present = rng.choice(keys, size // 2, replace=False).astype(np.int64) * 7919 + 13
    absent = rng.choice(keys, size - size // 2, replace=False).astype(np.int64) * 7919 + 14
    return pa.table({"k": _keys(kind, np.concatenate([present, absent]))})


def _reference_build(files: Sequence[DataFile]) -> dict[str, dict[Any, list[int]]]:
    """The dict-per-key reference the index replaced: key tuple → positions, per file."""
    out = {}
    for f in files:
        by_key: dict[Any, list[int]] = defaultdict(list)
        for position, key in enumerate(key_tuples(pq.read_table(f.file_path, columns=["k"]))):
            by_key[key].append(position)
        out[f.file_path] = dict(by_key)
    return out


def _reference_lookup(index: dict[str, dict[Any, list[int]]], keys: pa.Table) -> int:
    wanted = set(key_tuples(keys))
    return sum(len(by_key[k]) for by_key in index.values() for k in wanted.intersection(by_key))


def _decode_only(files: Sequence[DataFile]) -> None:
    for f in files:
        pq.read_table(f.file_path, columns=["k"])


def _dir_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*.arrow"))


class _Kind:
    """One key kind at one size: its files, a checkpointed table location, the runner."""

    def __init__(self, ctx: BenchContext, runner: asyncio.Runner, kind: str, keys: int) -> None:
        self.ctx, self.runner, self.kind, self.keys = ctx, runner, kind, keys
        self.tmp = Path(tempfile.mkdtemp(prefix=f"icefloe-bench-key-index-{kind}-"))
        files = ctx.size("files", full=50, quick=10)
        try:
            self.files = _write_files(kind, self.tmp / "data", keys, files + 1)
        except BaseException:
            self.close()
            raise
        self.committed, self.new = self.files[:-1], self.files[-1]
        self.schema = _schema(kind)
        self.location = str(self.tmp / "table")
        self.live = {f.file_path: f for f in self.files}
        self.spill = str(self.tmp / "spill")
        os.makedirs(self.spill)

    def run(self, make: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
        return self.runner.run(make())

    async def rebuilt(
        self, budget: int | None = None, live: dict[str, DataFile] | None = None
    ) -> KeyIndex:
        options = {} if budget is None else {"memory_budget_bytes": budget}
        index = KeyIndex(
            LocalFileIO(),
            self.schema,
            [1],
            table_location=self.location,
            spill_dir=self.spill,
            **options,
        )
        await index.sync(live if live is not None else self.live)
        return index

    async def resumed(self) -> KeyIndex:
        index = await KeyIndex.open(
            LocalFileIO(), self.location, self.schema, [1], spill_dir=self.spill
        )
        await index.sync(self.live)
        return index

    def close(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)


def _figures(
    ctx: BenchContext, runner: asyncio.Runner, kind: str, keys: int, with_reference: bool
) -> list[Figure]:
    size = f"{keys / 1e6:g}M {kind} keys"
    k = _Kind(ctx, runner, kind, keys)
    try:
        rebuild_runs: dict[str, Callable[[], object]] = {
            "icefloe": lambda: k.run(k.rebuilt),
            "decode key columns only": lambda: _decode_only(k.files),
        }
        if with_reference:
            rebuild_runs["reference (dict per key)"] = lambda: _reference_build(k.files)
        rebuild = ctx.compare(rebuild_runs, work=keys)

        # The checkpoint a new owner resumes from: every file but the newest.
        index = k.run(lambda: k.rebuilt(live={f.file_path: f for f in k.committed}))
        k.run(index.checkpoint)
        disk = _dir_bytes(Path(k.location) / CHECKPOINT_DIR)
        resume = ctx.compare(
            {"icefloe": lambda: k.run(k.resumed), "rebuild": lambda: k.run(k.rebuilt)}, work=1
        )

        full = k.run(k.rebuilt)
        spilled = k.run(lambda: k.rebuilt(budget=0))
        batch_size = ctx.size("batch", full=10_000, quick=10_000)
        batch = _batch(kind, keys, batch_size)
        found = k.run(lambda: full.lookup(batch))
        assert sum(len(v) for v in found.values()) == batch_size // 2, "lookup missed keys"
        all_keys = pa.chunked_array(
            [pq.read_table(f.file_path, columns=["k"]).column(0).combine_chunks() for f in k.files]
        ).combine_chunks()
        lookup_runs: dict[str, Callable[[], object]] = {
            "icefloe": lambda: k.run(lambda: full.lookup(batch)),
            "icefloe, all runs spilled": lambda: k.run(lambda: spilled.lookup(batch)),
            "scan every key (pyarrow is_in)": lambda: pc.indices_nonzero(
                pc.is_in(all_keys, value_set=batch.column(0))
            ),
        }
        if with_reference:
            reference = _reference_build(k.files)
            lookup_runs["reference (dict per key)"] = lambda: _reference_lookup(reference, batch)
        lookup = ctx.compare(lookup_runs, work=1)

        stats = full.stats()
        ctx.note(
            f"{size}: {stats.memory_bytes / stats.keys:.1f} bytes/key in memory "
            f"({stats.runs} runs), {disk / stats.keys:.1f} bytes/key in the checkpoint; "
            f"budget 0: {spilled.stats().spilled_bytes / stats.keys:.1f} bytes/key spilled, "
            f"{spilled.stats().memory_bytes} bytes in memory; "
            f"rebuild {rebuild['icefloe'].best / keys * 1e6:.2f} s per million keys"
        )
    finally:
        k.close()
    rebuild_icefloe = rebuild.pop("icefloe")
    return [
        Figure(f"rebuild, {size}", "keys", rebuild_icefloe, rebuild),
        Figure(
            f"resume from checkpoint, {size}",
            "resumes",
            resume.pop("icefloe"),
            resume,
            kind=Kind.LATENCY,
        ),
        Figure(
            f"lookup {batch_size:,} keys, {size}",
            "batches",
            lookup.pop("icefloe"),
            lookup,
            kind=Kind.LATENCY,
        ),
    ]


def _reference_bytes_per_key(kind: str, keys: int = 100_000) -> float:
    """Memory the dict-per-key reference holds per key (``tracemalloc``, on a sample)."""
    tmp = Path(tempfile.mkdtemp(prefix="icefloe-bench-key-index-ref-"))
    try:
        files = _write_files(kind, tmp / "data", keys, 4)
        tracemalloc.start()
        start = tracemalloc.take_snapshot()
        kept = _reference_build(files)
        end = tracemalloc.take_snapshot()
        tracemalloc.stop()
        del kept
        return sum(s.size_diff for s in end.compare_to(start, "filename")) / keys
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@benchmark("key-index")
def key_index_benchmark(ctx: BenchContext) -> list[Figure]:
    """Key index: rebuild, resume from a checkpoint and lookup, at 1M and 10M keys."""
    keys = ctx.size("keys", full=1_000_000, quick=100_000)
    big = ctx.size("big_keys", full=10_000_000, quick=300_000)
    figures: list[Figure] = []
    with asyncio.Runner() as runner:
        for kind in KINDS:
            figures += _figures(ctx, runner, kind, keys, with_reference=True)
            figures += _figures(ctx, runner, kind, big, with_reference=False)
            ctx.note(
                f"reference (dict per key), {kind} keys: "
                f"{_reference_bytes_per_key(kind, min(keys, 100_000)):.0f} bytes/key in memory"
            )
    return figures
