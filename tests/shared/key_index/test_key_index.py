"""The key index: positions of keys in the data files it covers, kept equal to the live set.

The laws are checked against the reference implementation the index replaced (a dict of
key tuples per file, :class:`ReferenceIndex` below): whatever the sequence of syncs (files
added, removed, re-added by a rollback), stages, discards, restarts from a checkpoint and
memory budgets, a lookup answers exactly what the reference answers.
"""

from __future__ import annotations

import asyncio
import datetime
import decimal
import hashlib
import io
import json
import logging
import tempfile
import uuid
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples
from icefloe.arrow.schema import schema_to_arrow
from icefloe.errors import ValidationError
from icefloe.io.fileio import LocalFileIO, S3FileIO
from icefloe.key_index import KeyIndex, SyncChanges, key_schema, key_tuples
from icefloe.key_index import runs as run_ops
from icefloe.key_index.checkpoint import CHECKPOINT_DIR
from icefloe.key_index.encoding import KeyEncoding
from icefloe.parquet.files import write_data_file
from icefloe.spec.datafile import DataFile
from icefloe.spec.schema import Schema
from icefloe.spec.types import (
    DateType,
    DecimalType,
    DoubleType,
    IcebergType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
    TimestamptzType,
    UUIDType,
)
from servers import S3Endpoint

Key = tuple[Any, ...]


class ReferenceIndex:
    """The straightforward index the real one is held to: a dict of key tuples per file."""

    def __init__(self) -> None:
        self.files: dict[str, dict[Key, list[int]]] = {}
        self.staged: dict[str, dict[Key, list[int]]] = {}

    def sync(self, live: Mapping[str, dict[Key, list[int]]]) -> None:
        for path in [p for p in self.files if p not in live]:
            del self.files[path]
        for path, by_key in live.items():
            if path not in self.files:
                self.files[path] = by_key
        self.staged.clear()

    def lookup(self, keys: Sequence[Key]) -> dict[str, list[int]]:
        wanted = set(keys)
        out: dict[str, set[int]] = defaultdict(set)
        for path, by_key in (*self.files.items(), *self.staged.items()):
            for k in wanted.intersection(by_key):
                out[path].update(by_key[k])
        return {p: sorted(v) for p, v in out.items() if v}


def positions_by_key(keys: Sequence[Key]) -> dict[Key, list[int]]:
    out: dict[Key, list[int]] = defaultdict(list)
    for position, key in enumerate(keys):
        out[key].append(position)
    return dict(out)


def as_lists(found: Mapping[str, np.ndarray[Any, Any]]) -> dict[str, list[int]]:
    for positions in found.values():
        assert positions.dtype == np.int64
    return {p: v.tolist() for p, v in found.items()}


# -- key types, with small domains so keys repeat within and across files ------------------

U = [uuid.UUID(int=i * 0x1_0000_0001) for i in range(4)]
D = decimal.Decimal
KEY_KINDS: dict[str, tuple[list[IcebergType], list[Key]]] = {
    "long": ([LongType()], [(v,) for v in (-(2**63), -1, 0, 1, 7, 2**63 - 1)]),
    "int": ([IntegerType()], [(v,) for v in (-(2**31), 0, 5, 2**31 - 1)]),
    "string": ([StringType()], [(v,) for v in ("", "a", "ab", "é", "a\x00", "bc")]),
    "uuid": ([UUIDType()], [(u,) for u in U]),
    "date": ([DateType()], [(datetime.date(2020, 1, d),) for d in (1, 2, 3)]),
    "timestamptz": (
        [TimestamptzType()],
        [(datetime.datetime(2024, 5, 1, h, tzinfo=datetime.UTC),) for h in (0, 1, 23)],
    ),
    "decimal": ([DecimalType(9, 2)], [(D(v),) for v in ("0.00", "1.50", "-0.01", "1.05")]),
    "string+string": (
        [StringType(), StringType()],
        [(a, b) for a in ("", "a", "ab") for b in ("", "c", "bc")],
    ),
    "long+string": ([LongType(), StringType()], [(a, b) for a in (0, 1) for b in ("x", "xy")]),
}


def kind_schema(kind: str) -> Schema:
    types, _ = KEY_KINDS[kind]
    fields = [NestedField(i + 1, f"k{i}", t, required=True) for i, t in enumerate(types)]
    value = NestedField(len(fields) + 1, "v", StringType())
    return Schema(*fields, value, identifier_field_ids=[f.field_id for f in fields])


def key_table(schema: Schema, keys: Sequence[Key]) -> pa.Table:
    ks = key_schema(schema, schema.identifier_field_ids)
    arrow = schema_to_arrow(ks)
    columns = [[k[i] for k in keys] for i in range(len(ks.fields))]
    return pa.table(
        [pa.array(c, type=f.type) for c, f in zip(columns, arrow, strict=True)], schema=arrow
    )


def write_file(schema: Schema, path: str, keys: Sequence[Key]) -> DataFile:
    rows = key_table(schema, keys).append_column("v", pa.array([str(k) for k in keys]))
    return write_data_file(rows, path, schema=schema, file_path=path)


# -- the law --------------------------------------------------------------------------------

steps = st.lists(
    st.one_of(
        st.tuples(st.just("sync"), st.sets(st.integers(0, 5))),
        st.tuples(st.just("stage"), st.integers(0, 5)),
        st.tuples(st.just("discard"), st.just(0)),
        st.tuples(st.just("restart"), st.just(0)),
        st.tuples(st.just("lookup"), st.lists(st.integers(0, 20), max_size=8)),
    ),
    min_size=1,
    max_size=14,
)


@settings(max_examples=examples(60))
@given(
    kind=st.sampled_from(sorted(KEY_KINDS)),
    files=st.lists(st.lists(st.integers(0, 20), max_size=12), min_size=6, max_size=6),
    program=steps,
    budget=st.sampled_from([0, 1 << 30]),
    hinted=st.booleans(),
)
def test_lookup_equals_the_reference(
    kind: str, files: list[list[int]], program: list[tuple[str, Any]], budget: int, hinted: bool
) -> None:
    """Syncs (adds, removes, rollbacks), stages, discards, restarts from a checkpoint, each
    lookup equal to the reference's; with a zero budget every run is spilled. ``hinted``:
    each sync names its version and what changed since the previous one (as the
    coordinator does after its own commit), so only those paths are compared."""
    schema = kind_schema(kind)
    domain = KEY_KINDS[kind][1]

    def key(i: int) -> Key:
        return domain[i % len(domain)]

    async def run(tmp: str) -> None:
        fio = LocalFileIO()
        pool = [
            write_file(schema, f"{tmp}/f{n}.parquet", [key(i) for i in f])
            for n, f in enumerate(files)
        ]
        contents = [positions_by_key([key(i) for i in f]) for f in files]
        options: dict[str, Any] = {"memory_budget_bytes": budget, "spill_dir": tmp}
        index = await KeyIndex.open(
            fio, f"{tmp}/table", schema, schema.identifier_field_ids, **options
        )
        oracle = ReferenceIndex()
        live: set[int] = set()
        version = 0
        for op, arg in program:
            if op == "sync":
                before, live = live, set(arg)
                changed = SyncChanges(
                    version,
                    [pool[n].file_path for n in live - before],
                    [pool[n].file_path for n in before - live],
                )
                version += 1
                await index.sync(
                    {pool[n].file_path: pool[n] for n in live},
                    version=version if hinted else None,
                    changed=changed if hinted else None,
                )
                oracle.sync({pool[n].file_path: contents[n] for n in live})
                assert index.covered == {pool[n].file_path for n in live}
            elif op == "stage":
                keys = key_table(schema, [key(i) for i in files[arg]])
                index.stage(pool[arg], keys)
                oracle.staged[pool[arg].file_path] = contents[arg]
            elif op == "discard":
                index.discard_staged()
                oracle.staged.clear()
            elif op == "restart":
                await index.checkpoint()
                index = await KeyIndex.open(
                    fio, f"{tmp}/table", schema, schema.identifier_field_ids, **options
                )
                await index.sync({pool[n].file_path: pool[n] for n in live}, version=version)
                oracle.staged.clear()  # the new owner's attempt stages afresh
            else:
                wanted = [key(i) for i in arg]
                assert as_lists(await index.lookup(key_table(schema, wanted))) == oracle.lookup(
                    wanted
                )
        everything = list(domain)
        assert as_lists(await index.lookup(key_table(schema, everything))) == oracle.lookup(
            everything
        )
        if budget == 0:
            index.discard_staged()  # staged runs stay in memory: small, and gone soon
            assert index.stats().memory_bytes == 0

    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(run(tmp))


# -- the original examples ------------------------------------------------------------------

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "region", StringType(), required=True),
    NestedField(3, "v", StringType()),
    identifier_field_ids=[1, 2],
)


def _write(tmp: Path, name: str, ids: list[int], regions: list[str]) -> DataFile:
    return write_file(SCHEMA, str(tmp / name), list(zip(ids, regions, strict=True)))


async def test_lookup_follows_sync_and_staging(tmp_path: Path) -> None:
    a = _write(tmp_path, "a.parquet", [1, 2, 3], ["eu", "eu", "us"])
    b = _write(tmp_path, "b.parquet", [3, 4], ["us", "us"])
    index = KeyIndex(LocalFileIO(), SCHEMA, SCHEMA.identifier_field_ids)
    await index.sync({a.file_path: a})
    keys = pa.table({"id": pa.array([3, 4], pa.int64()), "region": ["us", "us"]})
    assert as_lists(await index.lookup(keys)) == {a.file_path: [2]}
    index.stage(b, await index.read_keys(b))
    assert as_lists(await index.lookup(keys)) == {a.file_path: [2], b.file_path: [0, 1]}
    index.discard_staged()
    await index.sync({b.file_path: b})  # a compacted away, b live
    assert index.covered == {b.file_path}
    assert as_lists(await index.lookup(keys)) == {b.file_path: [0, 1]}


def test_unkeyed_schema_is_refused() -> None:
    plain = Schema(NestedField(1, "id", LongType(), required=True))
    with pytest.raises(ValidationError, match="identifier fields"):
        key_schema(plain, plain.identifier_field_ids)


# -- the encoding ---------------------------------------------------------------------------


def words(kind: str, keys: Sequence[Key]) -> list[tuple[int, int]]:
    schema = kind_schema(kind)
    encoded = KeyEncoding(key_schema(schema, schema.identifier_field_ids)).encode(
        key_table(schema, keys)
    )
    assert encoded.lo is not None
    return list(zip(encoded.hi.tolist(), encoded.lo.tolist(), strict=True))


def md5_words(encoding: bytes) -> tuple[int, int]:
    digest = hashlib.md5(encoding).digest()
    return int.from_bytes(digest[:8], "little"), int.from_bytes(digest[8:], "little")


def test_hashed_keys_are_the_md5_of_the_canonical_encoding() -> None:
    """Fixed forever (checkpoints depend on it): length-prefixed UTF-8, 16-byte uuids and
    unscaled decimals, 8-byte little-endian integers, columns concatenated in key order."""
    assert words("string", [("ab",)]) == [md5_words(b"\x02\x00\x00\x00ab")]
    assert words("uuid", [(U[1],)]) == [md5_words(U[1].bytes)]
    assert words("decimal", [(D("1.50"),)]) == [md5_words((150).to_bytes(16, "little"))]
    assert words("long+string", [(1, "x")]) == [
        md5_words((1).to_bytes(8, "little") + b"\x01\x00\x00\x00x")
    ]


def test_composite_keys_do_not_run_together() -> None:
    a, b = words("string+string", [("a", "bc"), ("ab", "c")])
    assert a != b


def test_keys_are_read_as_the_column_type() -> None:
    """Equal values given in another width or scale find the same rows; lossy ones are
    refused, as are nulls, missing columns and float keys."""
    schema = kind_schema("decimal")
    encoding = KeyEncoding(key_schema(schema, schema.identifier_field_ids))
    exact = encoding.encode(pa.table({"k0": pa.array([D("1.5")], pa.decimal128(12, 3))}))
    assert words("decimal", [(D("1.50"),)]) == list(
        zip(
            exact.hi.tolist(),
            (exact.lo if exact.lo is not None else exact.hi).tolist(),
            strict=True,
        )
    )
    with pytest.raises(ValidationError, match="cannot be read as"):
        encoding.encode(pa.table({"k0": pa.array([D("1.555")], pa.decimal128(12, 3))}))
    with pytest.raises(ValidationError, match="null"):
        encoding.encode(pa.table({"k0": pa.array([None], pa.decimal128(9, 2))}))
    with pytest.raises(ValidationError, match="expected the 1 key columns"):
        encoding.encode(pa.table({"a": [1], "b": [2]}))
    longs = kind_schema("long")
    as_int32 = KeyEncoding(key_schema(longs, [1])).encode(
        pa.table({"k0": pa.array([7], pa.int32())})
    )
    assert as_int32.lo is None and as_int32.hi.tolist() == [7]
    floats = Schema(NestedField(1, "f", DoubleType(), required=True))
    with pytest.raises(ValidationError, match="cannot be a key"):
        KeyEncoding(floats)


# -- runs, spilling, checkpoints -------------------------------------------------------------


class CountingIO(LocalFileIO):
    """A local FileIO that counts reads of data files (to see what a resume rescans)."""

    def __init__(self) -> None:
        super().__init__()
        self.data_reads: list[str] = []

    async def read(self, path: str) -> bytes:
        if path.endswith(".parquet"):
            self.data_reads.append(path)
        return await super().read(path)


def long_files(tmp: Path, count: int, rows: int = 50) -> list[DataFile]:
    schema = kind_schema("long")
    return [
        write_file(schema, str(tmp / f"d{n}.parquet"), [((n * 7 + i) % 300,) for i in range(rows)])
        for n in range(count)
    ]


def long_oracle(files: Sequence[DataFile]) -> ReferenceIndex:
    oracle = ReferenceIndex()
    import pyarrow.parquet as pq

    oracle.sync(
        {
            f.file_path: positions_by_key(key_tuples(pq.read_table(f.file_path, columns=["k0"])))
            for f in files
        }
    )
    return oracle


ALL_LONGS = [(v,) for v in range(300)]


async def test_a_hint_that_does_not_add_up_falls_back_to_every_path(tmp_path: Path) -> None:
    """A sync hinted with what changed since the version the index covers compares only
    those paths; one whose hint leaves a new file out (the index would then cover fewer
    files than are live) compares every path, and so reads the file the hint missed."""
    schema = kind_schema("long")
    a, b, c, d = long_files(tmp_path, 4)
    index = KeyIndex(LocalFileIO(), schema, [1])
    await index.sync({a.file_path: a, b.file_path: b}, version=1)
    exact = SyncChanges(1, [c.file_path], [a.file_path])
    await index.sync({b.file_path: b, c.file_path: c}, version=2, changed=exact)
    assert index.covered == {b.file_path, c.file_path}
    short = SyncChanges(2, [], [])  # d was added, the hint does not say so
    await index.sync({b.file_path: b, c.file_path: c, d.file_path: d}, version=3, changed=short)
    assert index.covered == {b.file_path, c.file_path, d.file_path}
    stale = SyncChanges(1, [a.file_path], [])  # not the version the index covers: ignored
    await index.sync({a.file_path: a}, version=4, changed=stale)
    assert index.covered == {a.file_path}
    found = await index.lookup(key_table(schema, ALL_LONGS))
    assert as_lists(found) == long_oracle([a]).lookup(ALL_LONGS)


async def test_runs_stay_logarithmic_and_spill_past_the_budget(tmp_path: Path) -> None:
    schema = kind_schema("long")
    files = long_files(tmp_path, 64)
    index = KeyIndex(LocalFileIO(), schema, [1], memory_budget_bytes=4096, spill_dir=str(tmp_path))
    for n in range(1, 65):
        await index.sync({f.file_path: f for f in files[:n]})
    stats = index.stats()
    assert stats.files == 64 and stats.keys == 64 * 50
    assert stats.runs <= 7  # one sync, one run; binary-counter merges keep log2(64) + 1
    assert stats.memory_bytes <= 4096 < stats.spilled_bytes
    found = await index.lookup(key_table(schema, ALL_LONGS))
    assert as_lists(found) == long_oracle(files).lookup(ALL_LONGS)


async def test_resume_reads_only_files_committed_since_the_checkpoint(tmp_path: Path) -> None:
    schema = kind_schema("long")
    files = long_files(tmp_path, 12)
    table = str(tmp_path / "table")
    first = await KeyIndex.open(LocalFileIO(), table, schema, [1])
    await first.sync({f.file_path: f for f in files[:10]})
    await first.sync({f.file_path: f for f in files[1:10]})  # f0 compacted away
    await first.checkpoint()
    counting = CountingIO()
    second = await KeyIndex.open(counting, table, schema, [1])
    assert second.covered == {f.file_path for f in files[1:10]}
    live = files[2:12]
    await second.sync({f.file_path: f for f in live})
    assert sorted(counting.data_reads) == sorted(f.file_path for f in files[10:12])
    assert as_lists(await second.lookup(key_table(schema, ALL_LONGS))) == long_oracle(live).lookup(
        ALL_LONGS
    )


async def test_a_checkpoint_without_changes_writes_nothing_and_old_ones_are_cleaned(
    tmp_path: Path,
) -> None:
    schema = kind_schema("long")
    files = long_files(tmp_path, 8)
    table = str(tmp_path / "table")
    index = await KeyIndex.open(LocalFileIO(), table, schema, [1])
    for n in range(1, 9):
        await index.sync({f.file_path: f for f in files[:n]})
        await index.checkpoint()
        await index.checkpoint()  # nothing changed: no new manifest
    root = tmp_path / "table" / CHECKPOINT_DIR
    manifests = sorted(root.glob("checkpoint-*.json"))
    assert [m.name for m in manifests] == [f"checkpoint-{n:016d}.json" for n in (6, 7, 8)]
    named = {r["name"] for m in manifests for r in json.loads(m.read_text())["body"]["runs"]}
    oldest = min(m.stat().st_mtime for m in manifests)
    for run in (root / "runs").glob("*.arrow"):
        assert run.stem in named or run.stat().st_mtime >= oldest


def corrupt_newest(root: Path, how: str) -> None:
    manifests = sorted(root.glob("checkpoint-*.json"))
    newest, older = manifests[-1], manifests[:-1]
    doc = json.loads(newest.read_text())
    kept = {r["name"] for m in older for r in json.loads(m.read_text())["body"]["runs"]}
    only_newest = [r["name"] for r in doc["body"]["runs"] if r["name"] not in kept]
    run = root / "runs" / f"{only_newest[0]}.arrow"
    if how == "garbage manifest":
        newest.write_bytes(b"\x00garbage")
    elif how == "truncated manifest":
        newest.write_bytes(newest.read_bytes()[:40])
    elif how == "edited manifest":
        doc["body"]["runs"][0]["dead"].append(0)  # the checksum no longer matches
        newest.write_text(json.dumps(doc))
    elif how == "missing run":
        run.unlink()
    elif how == "tampered run":
        data = bytearray(run.read_bytes())
        data[len(data) // 2] ^= 0xFF
        run.write_bytes(bytes(data))
    else:
        raise AssertionError(how)


@pytest.mark.parametrize(
    "how",
    ["garbage manifest", "truncated manifest", "edited manifest", "missing run", "tampered run"],
)
async def test_a_damaged_checkpoint_is_skipped_for_the_one_before(
    tmp_path: Path, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    schema = kind_schema("long")
    files = long_files(tmp_path, 6)
    table = str(tmp_path / "table")
    index = await KeyIndex.open(LocalFileIO(), table, schema, [1])
    await index.sync({f.file_path: f for f in files[:3]})
    await index.checkpoint()
    await index.sync({f.file_path: f for f in files})
    await index.checkpoint()
    corrupt_newest(tmp_path / "table" / CHECKPOINT_DIR, how)
    with caplog.at_level(logging.WARNING, logger="icefloe.key_index.index"):
        resumed = await KeyIndex.open(LocalFileIO(), table, schema, [1])
    assert "not usable" in caplog.text
    assert resumed.covered == {f.file_path for f in files[:3]}  # the older checkpoint
    await resumed.sync({f.file_path: f for f in files})
    assert as_lists(await resumed.lookup(key_table(schema, ALL_LONGS))) == long_oracle(
        files
    ).lookup(ALL_LONGS)
    await resumed.checkpoint()  # and the next checkpoint is whole again
    again = await KeyIndex.open(LocalFileIO(), table, schema, [1])
    assert again.covered == {f.file_path for f in files}


async def test_a_checkpoint_of_other_key_columns_is_not_used(tmp_path: Path) -> None:
    files = long_files(tmp_path, 2)
    table = str(tmp_path / "table")
    index = await KeyIndex.open(LocalFileIO(), table, kind_schema("long"), [1])
    await index.sync({f.file_path: f for f in files})
    await index.checkpoint()
    as_int = kind_schema("int")  # the same column id, another type
    other = await KeyIndex.open(LocalFileIO(), table, as_int, [1])
    assert other.covered == frozenset()


async def test_two_owners_never_overwrite_each_other(tmp_path: Path) -> None:
    """A zombie owner after a rebalance checkpoints too: each manifest gets its own
    number, and a new owner loads the newest."""
    schema = kind_schema("long")
    files = long_files(tmp_path, 4)
    table = str(tmp_path / "table")
    old = await KeyIndex.open(LocalFileIO(), table, schema, [1])
    new = await KeyIndex.open(LocalFileIO(), table, schema, [1])
    await old.sync({f.file_path: f for f in files[:2]})
    await new.sync({f.file_path: f for f in files})
    await old.checkpoint()
    await new.checkpoint()
    await old.sync({f.file_path: f for f in files[:3]})
    await asyncio.gather(old.checkpoint(), new.checkpoint())
    resumed = await KeyIndex.open(LocalFileIO(), table, schema, [1])
    assert resumed.covered in ({f.file_path for f in files[:3]}, {f.file_path for f in files})
    await resumed.sync({f.file_path: f for f in files})
    assert as_lists(await resumed.lookup(key_table(schema, ALL_LONGS))) == long_oracle(
        files
    ).lookup(ALL_LONGS)


@pytest.mark.integration
async def test_checkpoint_and_resume_through_s3(s3_server: S3Endpoint) -> None:
    schema = kind_schema("long+string")
    bucket = s3_server.create_bucket()
    table = f"s3://{bucket}/db/t"
    domain = KEY_KINDS["long+string"][1]
    async with S3FileIO.from_properties(s3_server.file_io_properties()) as s3:
        files = []
        for n in range(5):
            keys = [domain[(n + i) % len(domain)] for i in range(9)]
            rows = key_table(schema, keys).append_column("v", pa.array([str(k) for k in keys]))
            buf = io.BytesIO()
            path = f"{table}/data/f{n}.parquet"
            files.append(write_data_file(rows, buf, schema=schema, file_path=path))
            await s3.write(path, buf.getvalue())
        index = await KeyIndex.open(s3, table, schema, schema.identifier_field_ids)
        await index.sync({f.file_path: f for f in files[:3]})
        await index.checkpoint()
        resumed = await KeyIndex.open(s3, table, schema, schema.identifier_field_ids)
        assert resumed.covered == {f.file_path for f in files[:3]}
        await resumed.sync({f.file_path: f for f in files[1:]})
        fresh = KeyIndex(s3, schema, schema.identifier_field_ids)
        await fresh.sync({f.file_path: f for f in files[1:]})
        wanted = key_table(schema, domain)
        assert as_lists(await resumed.lookup(wanted)) == as_lists(await fresh.lookup(wanted))
        assert await resumed.lookup(wanted)


@settings(max_examples=examples(25))
@given(
    damage=st.lists(
        st.tuples(
            st.sampled_from(["flip", "truncate", "delete"]), st.integers(0, 10**6), st.integers(0)
        ),
        min_size=1,
        max_size=3,
    ),
)
def test_any_damage_to_checkpoints_costs_reading_never_a_row(
    damage: list[tuple[str, int, int]],
) -> None:
    """Bytes flipped, files cut short or deleted anywhere in the checkpoint directory:
    ``open`` never fails and never trusts what it cannot check, and after ``sync`` every
    lookup is the reference's."""
    schema = kind_schema("string")
    domain = KEY_KINDS["string"][1]

    async def run(tmp: Path) -> None:
        files = [
            write_file(schema, str(tmp / f"s{n}.parquet"), [domain[(n + i) % 6] for i in range(5)])
            for n in range(5)
        ]
        table = str(tmp / "table")
        index = await KeyIndex.open(LocalFileIO(), table, schema, [1])
        for n in (2, 4, 5):
            await index.sync({f.file_path: f for f in files[:n]})
            await index.checkpoint()
        root = tmp / "table" / CHECKPOINT_DIR
        for how, which, where in damage:
            targets = sorted(p for p in root.rglob("*") if p.is_file())
            if not targets:
                break
            target = targets[which % len(targets)]
            data = target.read_bytes()
            if how == "delete":
                target.unlink()
            elif how == "truncate":
                target.write_bytes(data[: where % max(1, len(data))])
            elif data:
                at = where % len(data)
                target.write_bytes(data[:at] + bytes([data[at] ^ 0x5A]) + data[at + 1 :])
        resumed = await KeyIndex.open(LocalFileIO(), table, schema, [1])
        assert resumed.covered <= {f.file_path for f in files[:5]}
        await resumed.sync({f.file_path: f for f in files})
        oracle = ReferenceIndex()
        oracle.sync(
            {
                f.file_path: positions_by_key([domain[(n + i) % 6] for i in range(5)])
                for n, f in enumerate(files)
            }
        )
        wanted = key_table(schema, domain)
        assert as_lists(await resumed.lookup(wanted)) == oracle.lookup(list(domain))

    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(run(Path(tmp)))


async def test_a_discard_during_a_lookup_is_not_undone(tmp_path: Path) -> None:
    """The lookup that was encoding the staged files when the attempt was abandoned must
    not bring them back."""
    a = _write(tmp_path, "a.parquet", [1], ["eu"])
    b = _write(tmp_path, "b.parquet", [1, 1], ["eu", "eu"])
    index = KeyIndex(LocalFileIO(), SCHEMA, SCHEMA.identifier_field_ids)
    await index.sync({a.file_path: a})
    keys = pa.table({"id": pa.array([1], pa.int64()), "region": ["eu"]})
    index.stage(b, await index.read_keys(b))
    during = asyncio.create_task(index.lookup(keys))
    await asyncio.sleep(0)  # the lookup has taken the staged files and is encoding them
    index.discard_staged()
    await during
    assert as_lists(await index.lookup(keys)) == {a.file_path: [0]}
    await index.sync({a.file_path: a, b.file_path: b})  # b committed by someone: read it
    assert as_lists(await index.lookup(keys)) == {a.file_path: [0], b.file_path: [0, 1]}


@settings(max_examples=examples(100))
@example(values=[2**63 - 1, -(2**63), 7, 5, 6, 5], spread=1, unsigned=False)  # the fix-up
@example(values=[-1, 3, -(2**63), 2], spread=1, unsigned=True)
@given(
    values=st.lists(st.integers(-(2**63), 2**63 - 1), max_size=300),
    spread=st.sampled_from([1, 3, 2**20, 2**62]),
    unsigned=st.booleans(),
)
def test_sort_order_sorts(values: list[int], spread: int, unsigned: bool) -> None:
    """The packed value sort is a permutation that sorts, whatever the keys' span (exact
    packing, top-bit packing with its stable fix-up)."""
    keys = np.array([v // spread for v in values], dtype=np.int64)
    if unsigned:
        keys = keys.view(np.uint64)
    order = run_ops.sort_order(keys)
    assert sorted(order.tolist()) == list(range(len(keys)))
    assert keys[order].tolist() == sorted(keys.tolist())
