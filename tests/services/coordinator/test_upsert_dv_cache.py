"""The committer's cache of deletion vectors (icefloe.deletes.deletion_vector_cache) on upserts.

The committer keeps the DVs it wrote (and read) between commits so that merging the next
batch's deletes into a file's DV does not read it back from its Puffin file. The law: the
cache never changes what is committed. Whatever happened to a file's DV between two of our
commits (another engine's delete merged into it, a rollback to before it, a crash of ours
after the Puffin write and before the swap), the next upsert merges into the DV the base
has, and the table reads as the fold of every change in commit order.

The "other engine" here is a row delta committed by a SnapshotProducer of its own (no
shared cache, as another process); Java's own DELETE between two upserts is in
test_upsert_interop_java.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_table_committer import Env
from test_upsert import keyed_env, upsert_unit
from upsert_fixtures import live_delete_files, table_rows

from icefloe.coordinator.committer import CommitHooks, TableCommitter
from icefloe.deletes.deletion_vector import DeletionVector, read_deletion_vector
from icefloe.deletes.deletion_vector_cache import DeletionVectorCache, cache_key
from icefloe.spec.datafile import DataFile
from icefloe.spec.metadata_builder import MetadataBuilder
from icefloe.spec.snapshot import MAIN_BRANCH, SnapshotRef
from icefloe.table.catalog import Table
from icefloe.table.snapshot_producer import row_delta


@pytest.fixture
async def env(tmp_path: Path) -> Any:
    e = await keyed_env(tmp_path, 3)
    yield e
    await e.catalog.close()


Rows = dict[int, tuple[str, int]]


async def first_file(env: Env, committer: TableCommitter, keys: int = 20) -> tuple[Rows, str]:
    """Commit keys 0..keys-1 in one data file; the rows and that file's path."""
    unit = upsert_unit(env, "c0", [(k, "c", k, f"v{k}") for k in range(keys)])
    await committer.commit([unit], resume_offset=0, position=unit.offset + 1)
    (data,) = unit.data_files
    return {k: (f"v{k}", k) for k in range(keys)}, data.file_path


async def dv_of(table: Table, data_path: str) -> DeletionVector:
    """The positions the live DV of ``data_path`` deletes (empty without one)."""
    dvs = [d for d in await live_delete_files(table) if d.referenced_data_file == data_path]
    assert len(dvs) <= 1, "two DVs for one data file"
    return await read_deletion_vector(table.io, dvs[0]) if dvs else DeletionVector()


async def upsert(
    env: Env, committer: TableCommitter, commit_id: str, changes: list[Any], rows: Rows
) -> None:
    unit = upsert_unit(env, commit_id, changes)
    outcome = await committer.commit([unit], resume_offset=0, position=unit.offset + 1)
    assert [u.commit_id for u in outcome.committed_units] == [commit_id], outcome.rejected
    for key, op, order, value in changes:
        if op == "d":
            rows.pop(key, None)
        else:
            rows[key] = (value, order)


def puffin_reads(env: Env) -> list[str]:
    """Count the ranged reads of Puffin files (DV reads) from now on."""
    io = env.catalog.io
    reads: list[str] = []
    inner = io.read_range

    async def counting(path: str, start: int, length: int) -> bytes:
        if path.endswith(".puffin"):
            reads.append(path)
        return await inner(path, start, length)

    io.read_range = counting  # type: ignore[method-assign]
    return reads


async def test_the_dvs_a_committer_wrote_are_merged_without_reading_them_back(env: Env) -> None:
    committer = env.committer()
    rows, path = await first_file(env, committer)
    reads = puffin_reads(env)
    for i, keys in enumerate([(0, 1), (2, 3), (4, 5, 6)], start=1):
        changes = [(k, "d", 100 + i, "") for k in keys]
        await upsert(env, committer, f"c{i}", changes, rows)
    assert reads == [], "a DV this committer wrote was read back"
    assert committer.deletion_vectors.stats.hits == 2  # the 2nd and 3rd merge
    table = await env.reload()
    assert await table_rows(table) == rows
    assert (await dv_of(table, path)).to_numpy().tolist() == list(range(7))


async def test_a_foreign_delete_between_two_upserts_is_merged_not_overwritten(env: Env) -> None:
    committer = env.committer()
    rows, path = await first_file(env, committer)
    await upsert(env, committer, "c1", [(k, "d", 101, "") for k in range(5)], rows)
    # Another engine deletes rows 10..14 of the same file: its DV (merged with ours, as
    # Java's is) replaces the one our cache holds.
    table = await env.reload()
    data = next(f for f in (await committer.live_data_files(table.metadata, MAIN_BRANCH)).values())
    assert data.file_path == path
    await row_delta(table, [], []).delete_positions(data, range(10, 15)).commit()
    for k in range(10, 15):
        rows.pop(k)
    misses = committer.deletion_vectors.stats.misses
    await upsert(env, committer, "c2", [(k, "d", 102, "") for k in (15, 16)], rows)
    assert committer.deletion_vectors.stats.misses == misses + 1, "the foreign DV was read"
    table = await env.reload()
    assert await table_rows(table) == rows
    merged = (await dv_of(table, path)).to_numpy().tolist()
    assert merged == [*range(5), *range(10, 17)]


async def test_a_rollback_to_before_our_dv_is_not_undone_by_the_cache(env: Env) -> None:
    """The cache holds the DV our c1 wrote; the table is rolled back to before c1, so the
    file's DV is gone from the base. c2's DV must hold c2's deletes only: rows c1 deleted
    are live again (as the rollback says)."""
    committer = env.committer()
    rows, path = await first_file(env, committer)
    before = rows.copy()
    head = (await env.reload()).metadata.current_snapshot_id
    assert head is not None
    await upsert(env, committer, "c1", [(k, "d", 101, "") for k in range(5)], rows)
    table = await env.reload()
    rolled = (
        MetadataBuilder(table.metadata)
        .set_ref(MAIN_BRANCH, SnapshotRef.branch(head))
        .build(table.metadata_location)
    )
    await env.catalog.commit(table, rolled)
    rows = before
    await upsert(env, committer, "c2", [(k, "d", 102, "") for k in (7, 8)], rows)
    table = await env.reload()
    assert await table_rows(table) == rows
    assert (await dv_of(table, path)).to_numpy().tolist() == [7, 8]


class _CrashAfterPuffin(CommitHooks):
    """Fails the first ``times`` attempts after their manifests (and Puffin file) are
    written and before the swap; ``fatal`` escapes the committer (a process dying)."""

    def __init__(self, times: int, fatal: bool) -> None:
        self.times = times
        self.fatal = fatal

    def on_stage(self, stage: str) -> None:
        if stage == "after-manifests" and self.times:
            self.times -= 1
            if self.fatal:
                raise _Died
            raise OSError("storage went away before the swap")


class _Died(BaseException):
    pass


@pytest.mark.parametrize("fatal", [False, True], ids=["same-process", "next-owner"])
async def test_a_crash_after_the_puffin_write_leaves_the_cache_unpoisoned(
    env: Env, fatal: bool
) -> None:
    """The failed attempt wrote a merged DV (its Puffin file) and cached it; no snapshot
    names it. The same committer's retry, and a new owner after the process died, both
    merge into the base's DV, and a later upsert merges into the one that committed."""
    committer = env.committer()
    rows, path = await first_file(env, committer)
    await upsert(env, committer, "c1", [(k, "d", 101, "") for k in range(3)], rows)
    crashing = env.committer(hooks=_CrashAfterPuffin(1, fatal))
    crashing.deletion_vectors = committer.deletion_vectors  # warm, as the same process
    changes = [(k, "d", 102, "") for k in (5, 6)]
    unit = upsert_unit(env, "c2", changes)
    if fatal:
        with pytest.raises(_Died):
            await crashing.commit([unit], resume_offset=0, position=unit.offset + 1)
        assert len(crashing.deletion_vectors) >= 2, "the dead attempt cached its merged DV"
        owner = env.committer()  # the next owner: its own, empty cache
    else:
        owner = crashing
    outcome = await owner.commit([unit], resume_offset=0, position=unit.offset + 1)
    assert [u.commit_id for u in outcome.committed_units] == ["c2"]
    for key, *_ in changes:
        rows.pop(key)
    await upsert(env, owner, "c3", [(9, "d", 103, ""), (30, "c", 103, "new")], rows)
    table = await env.reload()
    assert await table_rows(table) == rows
    assert (await dv_of(table, path)).to_numpy().tolist() == [0, 1, 2, 5, 6, 9]


def test_the_cache_is_bounded_and_least_recently_used_goes_first() -> None:
    cache = DeletionVectorCache(max_bytes=3 * 256 + 3 * 100)

    def key(n: int) -> Any:
        f = DataFile(
            file_path=f"s3://b/{n}.puffin",
            file_format="puffin",
            partition=(),
            record_count=1,
            file_size_in_bytes=1000,
            content=1,
            referenced_data_file=f"s3://b/d{n}.parquet",
            content_offset=4,
            content_size_in_bytes=100,
        )
        return cache_key(f, f"s3://b/d{n}.parquet")

    vectors = [DeletionVector.from_positions([n]) for n in range(4)]
    for n in range(3):
        cache.put(key(n), vectors[n], 100)
    assert cache.get(key(0)) is vectors[0]  # 0 is now the most recently used
    cache.put(key(3), vectors[3], 100)
    assert key(1) not in cache and len(cache) == 3 and cache.stats.evictions == 1
    assert cache.get(key(1)) is None and cache.stats.misses == 1
    cache.put(key(9), vectors[0], 10**9)  # bigger than the budget: not kept, nothing evicted
    assert len(cache) == 3 and cache.stats.bytes <= cache.max_bytes
