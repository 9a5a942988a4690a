"""Upserts next to Apache Iceberg Java 1.10.2: Java reads what icefloe's upserts commit, and
Java's own ``MERGE INTO`` and ``DELETE FROM`` interleave with them on the same keyed table.

icefloe's side is the committer (:class:`~icefloe.coordinator.committer.TableCommitter`)
committing upsert units directly, without Kafka; Java's side is the ``java_iceberg`` session
fixture (Spark 3.5; merge-on-read on v2 and v3, copy-on-write on v3), over the same
HadoopCatalog warehouse. The oracle is the
sequential application of every change, icefloe's and Java's, in the order they committed.
After every step both engines must read exactly the oracle's rows, ``main`` must reference
no equality-delete file, and on v3 every data file has at most one deletion vector. After
every icefloe commit the key index covers exactly the live data files, and every live row
Java sees (``_file``, ``_pos``) is among the positions the index gives for its key, so rows
Java's MERGE added (in files icefloe never wrote) are found and replaced by the next upsert.
Java's maintenance too (``rewrite_data_files``, ``rollback_to_snapshot``,
``set_current_snapshot``, ``expire_snapshots``) leaves the index true, kept in memory or
opened by a new owner from a checkpoint made before the change; PyIceberg and DuckDB then
read the oracle's rows as well.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from test_table_committer import SOURCE, Env
from upsert_fixtures import (
    KEYED_SCHEMA,
    Change,
    apply_fold,
    data_files_for,
    fold_batch,
    key_file_for,
    live_delete_files,
    other_engines_rows,
    table_rows,
)

from icefloe.catalog.fs import FileSystemCatalog
from icefloe.cli.scan import task_rows
from icefloe.coordinator.committer import TableCommitter
from icefloe.deletes.index import is_deletion_vector
from icefloe.events import CommitOperation
from icefloe.io.fileio import FileIO, LocalFileIO
from icefloe.key_index import KeyIndex
from icefloe.manifests.cache import ManifestCache
from icefloe.scan.planning import plan_scan
from icefloe.spec.datafile import DataFileContent
from icefloe.spec.schema import Schema
from java_iceberg import JavaIceberg

pytestmark = [pytest.mark.interop, pytest.mark.integration]

MOR = {
    "write.delete.mode": "merge-on-read",
    "write.update.mode": "merge-on-read",
    "write.merge.mode": "merge-on-read",
}
KEYS = 40
TABLE = "{cat}.db.keyed"

State = dict[int, tuple[str, int]]


class Interleaved:
    """One keyed table written by icefloe's committer and by Java, with the oracle's rows."""

    def __init__(self, java: JavaIceberg, warehouse: Path, env: Env) -> None:
        self.java = java
        self.warehouse = warehouse
        self.env = env
        self.expected: State = {}
        self.ord = 0
        self.indexes: list[KeyIndex] = []
        self.committer = TableCommitter(env.catalog, env.name, SOURCE, open_key_index=self.open)
        self.commits = 0

    async def open(
        self, io: FileIO, location: str, schema: Schema, key_ids: Sequence[int]
    ) -> KeyIndex:
        index = await KeyIndex.open(io, location, schema, key_ids)
        self.indexes.append(index)
        return index

    def sql(self, statement: str) -> list[dict[str, Any]]:
        return self.java.sql(self.warehouse, statement)

    async def icefloe_upsert(
        self, rng: random.Random, size: int, keys: Sequence[int] | None = None
    ) -> None:
        """One CDC batch: inserts, updates, deletes and re-inserts, duplicated and shuffled
        (``size`` random keys, or one change for each of ``keys``)."""
        changes: list[Change] = []
        for key in keys if keys is not None else [rng.randrange(KEYS) for _ in range(size)]:
            self.ord += 1
            op = rng.choice("cudr" if self.expected else "c")
            changes.append((key, op, self.ord, f"ice{self.ord}"))
        changes += rng.sample(changes, k=min(3, len(changes)))
        rng.shuffle(changes)
        await self.icefloe_changes(changes)

    async def icefloe_changes(self, changes: list[Change]) -> None:
        """One CDC batch of the given changes, committed by icefloe."""
        folded = fold_batch(changes)
        self.commits += 1
        commit_id = f"ice-{self.commits}"
        data = data_files_for(self.env.table, folded, pieces=2)
        unit = self.env.unit(
            commit_id, data, CommitOperation.UPSERT, [key_file_for(self.env.table, sorted(folded))]
        )
        outcome = await self.committer.commit([unit], resume_offset=0, position=self.env.offset)
        assert not outcome.rejected, outcome.rejected
        assert [u.commit_id for u in outcome.committed_units] == [commit_id]
        apply_fold(self.expected, folded)
        await self.check_index()

    async def live_data(self) -> frozenset[str]:
        table = await self.env.reload()
        return frozenset(await self.committer.live_data_files(table.metadata, "main"))

    async def java_changes(self, statement: str) -> None:
        """Run Java's statement; merge-on-read keeps every data file (it adds deletes),
        copy-on-write replaces the files holding changed rows."""
        before = await self.live_data()
        self.sql(statement)
        removed = before - await self.live_data()
        copy_on_write = self.env.table.metadata.properties["write.merge.mode"] == "copy-on-write"
        assert bool(removed) == copy_on_write, statement

    async def java_merge(self, rng: random.Random) -> None:
        """Java's MERGE INTO: updates matched keys, deletes some, inserts the unmatched."""
        rows = []
        for key in rng.sample(range(KEYS), k=12):
            self.ord += 1
            drop = key in self.expected and rng.random() < 0.3
            rows.append((key, None if drop else f"java{self.ord}", self.ord))
        values = ", ".join(f"({k}, {'NULL' if v is None else repr(v)}, {o})" for k, v, o in rows)
        await self.java_changes(
            f"MERGE INTO {TABLE} t USING (SELECT * FROM VALUES {values} AS s(id, value, ord)) s "
            "ON t.id = s.id "
            "WHEN MATCHED AND s.value IS NULL THEN DELETE "
            "WHEN MATCHED THEN UPDATE SET * "
            "WHEN NOT MATCHED AND s.value IS NOT NULL THEN INSERT *"
        )
        for k, v, o in rows:
            if v is None:
                self.expected.pop(k, None)
            else:
                self.expected[k] = (v, o)

    async def java_delete(self, modulus: int, remainder: int) -> None:
        await self.java_changes(f"DELETE FROM {TABLE} WHERE id % {modulus} = {remainder}")
        for k in [k for k in self.expected if k % modulus == remainder]:
            del self.expected[k]

    def java_rows(self, extra: str = "") -> list[dict[str, Any]]:
        return self.sql(f"SELECT id, value, ord{extra} FROM {TABLE} ORDER BY id")

    async def check(self) -> None:
        """Both engines read the oracle's rows; no equality delete; one DV per file on v3."""
        table = await self.env.reload()
        want = [{"id": k, "value": v, "ord": o} for k, (v, o) in sorted(self.expected.items())]
        assert self.java_rows() == want
        assert await table_rows(table) == self.expected
        deletes = await live_delete_files(table)
        assert not [d for d in deletes if d.content == DataFileContent.EQUALITY_DELETES]
        if table.metadata.format_version >= 3:
            assert all(is_deletion_vector(d) for d in deletes)
            targets = Counter(d.referenced_data_file for d in deletes)
            assert not [t for t, n in targets.items() if n > 1], "two DVs for one data file"
        else:
            assert not [d for d in deletes if is_deletion_vector(d)]

    async def check_other_readers(self) -> None:
        """PyIceberg and DuckDB read the oracle's rows from the table's current metadata."""
        location = (await self.env.reload()).metadata_location
        for engine, rows in other_engines_rows(location).items():
            assert rows == self.expected, engine

    async def head(self) -> int:
        snapshot_id = (await self.env.reload()).metadata.current_snapshot_id
        assert snapshot_id is not None
        return snapshot_id

    def new_owner(self) -> None:
        """A new committer, as after a restart or rebalance: its key index is opened from the
        last checkpoint, which may name files no longer live (or no longer stored)."""
        self.committer = TableCommitter(
            self.env.catalog, self.env.name, SOURCE, open_key_index=self.open
        )

    async def check_index(self) -> None:
        """The key index covers the live data files and finds every live row where Java
        sees it: the files Java's MERGE added, the positions in them."""
        index = self.indexes[-1]
        table = await self.env.reload()
        live = await self.committer.live_data_files(table.metadata, "main")
        assert index.covered == frozenset(live)
        located = self.sql(f"SELECT id, _file, _pos FROM {TABLE} ORDER BY id")
        found = await index.lookup(
            pa.table({"id": pa.array([r["id"] for r in located], pa.int64())})
        )
        for row in located:
            assert row["_file"] in found, f"key {row['id']}: {row['_file']} not in the index"
            assert row["_pos"] in set(found[row["_file"]].tolist()), f"key {row['id']}"


COW = {k: "copy-on-write" for k in MOR}


@pytest.fixture(
    params=[(2, MOR), (3, MOR), (3, COW)],
    ids=["v2-merge-on-read", "v3-merge-on-read", "v3-copy-on-write"],
)
async def interleaved(
    request: pytest.FixtureRequest, java_iceberg: JavaIceberg, tmp_path: Path
) -> Any:
    """Java's merge-on-read writes DVs / position deletes beside icefloe's; copy-on-write
    rewrites whole files, dropping the ones holding icefloe's rows and their DVs."""
    version, modes = request.param
    catalog = FileSystemCatalog("ice", str(tmp_path), LocalFileIO())
    await catalog.create_namespace("db")
    table = await catalog.create_table(
        "db.keyed", KEYED_SCHEMA, properties=modes, format_version=version
    )
    yield Interleaved(java_iceberg, tmp_path, Env(catalog, table))
    await catalog.close()


async def test_java_reads_exactly_the_rows_icefloe_upserts_leave(
    interleaved: Interleaved,
) -> None:
    rng = random.Random(19)
    at: dict[int, list[dict[str, Any]]] = {}
    for size in (30, 15, 15, 20):
        await interleaved.icefloe_upsert(rng, size)
        await interleaved.check()
        head = (await interleaved.env.reload()).metadata.current_snapshot_id
        assert head is not None
        at[head] = [
            {"id": k, "value": v, "ord": o} for k, (v, o) in sorted(interleaved.expected.items())
        ]
    for snapshot_id, rows in at.items():  # and at every earlier snapshot (time travel)
        query = f"SELECT id, value, ord FROM {TABLE} VERSION AS OF {snapshot_id} ORDER BY id"
        assert interleaved.sql(query) == rows, snapshot_id
    table = await interleaved.env.reload()
    java_snapshots = interleaved.sql(f"SELECT snapshot_id, operation FROM {TABLE}.snapshots")
    assert [s["snapshot_id"] for s in java_snapshots] == [
        s.snapshot_id for s in table.metadata.snapshots
    ]
    if table.metadata.format_version >= 3:
        # row lineage: icefloe's inherited _row_id / _last_updated_sequence_number are Java's
        plan = await plan_scan(table.metadata, ManifestCache(table.io))
        ours = sorted(
            [
                row
                for t in plan.tasks()
                for row in await task_rows(table.io, plan, t, row_lineage=True)
            ],
            key=lambda r: r["id"],
        )
        keys = ("id", "_row_id", "_last_updated_sequence_number")
        java = interleaved.java_rows(", _row_id, _last_updated_sequence_number")
        assert [{k: r[k] for k in keys} for r in ours] == [{k: r[k] for k in keys} for r in java]
        assert len({r["_row_id"] for r in java}) == len(java)


async def test_java_merge_and_delete_interleave_with_icefloe_upserts(
    interleaved: Interleaved,
) -> None:
    rng = random.Random(5)
    await interleaved.icefloe_upsert(rng, 40)
    await interleaved.check()
    await interleaved.java_merge(rng)
    await interleaved.check()
    await interleaved.icefloe_upsert(rng, 20)
    await interleaved.check()
    await interleaved.java_delete(7, 3)
    await interleaved.check()
    await interleaved.icefloe_upsert(rng, 20)
    await interleaved.check()
    # and once more around, so icefloe's DVs and Java's land on the same files again
    await interleaved.java_merge(rng)
    await interleaved.java_delete(5, 1)
    await interleaved.icefloe_upsert(rng, 25)
    await interleaved.check()
    assert interleaved.expected, "the sequence left rows to compare"
    assert len(interleaved.indexes) == 1, "one key index, kept up to date across Java's commits"


@pytest.mark.parametrize(
    "interleaved",
    # copy-on-write replaces the files holding changed rows; rewrite_data_files here replaces
    # every file, so the merge-on-read tables cover that case too
    [(2, MOR), (3, MOR)],
    ids=["v2-merge-on-read", "v3-merge-on-read"],
    indirect=True,
)
async def test_the_key_index_stays_true_through_java_compaction_rollback_and_expiry(
    interleaved: Interleaved,
) -> None:
    """After each change Java makes (DELETE, MERGE INTO, rewrite_data_files moving every row
    to new positions, rollback_to_snapshot, set_current_snapshot to a snapshot that is not
    an ancestor, expire_snapshots removing files), the next icefloe upsert of every live key
    deletes exactly the row each key has, whether the committer kept its index in memory or
    a new owner opened it from a checkpoint made before the change."""
    it = interleaved
    rng = random.Random(23)
    table = "db.keyed"

    async def upsert_every_key() -> None:
        """Touch every live key (and a few absent ones): each must keep one row, or go."""
        await it.icefloe_upsert(rng, 0, [*sorted(it.expected), *rng.sample(range(KEYS), 3)])
        await it.check()

    await it.icefloe_upsert(rng, 40)
    await it.check()
    first, at_first = await it.head(), dict(it.expected)
    await it.java_delete(5, 0)
    await upsert_every_key()
    await it.java_merge(rng)
    await upsert_every_key()

    # Java's compaction moves every row: the index's positions name files no longer live
    before = await it.live_data()
    it.sql(
        f"CALL {{cat}}.system.rewrite_data_files(table => '{table}', "
        "options => map('rewrite-all', 'true'))"
    )
    after = await it.live_data()
    assert after and not before & after, "every data file rewritten"
    await it.check()
    await it.check_other_readers()
    await upsert_every_key()
    it.new_owner()  # its checkpoint was made before the next Java change
    await it.java_merge(rng)
    it.sql(
        f"CALL {{cat}}.system.rewrite_data_files(table => '{table}', "
        "options => map('rewrite-all', 'true'))"
    )
    await upsert_every_key()
    await it.check_other_readers()

    # rollback: the table goes back to the first snapshot and its rows
    old_head, at_old_head = await it.head(), dict(it.expected)
    it.sql(f"CALL {{cat}}.system.rollback_to_snapshot('{table}', {first})")
    it.expected = dict(at_first)
    await it.check()
    await upsert_every_key()
    await it.icefloe_upsert(rng, 15)
    await it.check_other_readers()
    # and forward to a snapshot that is not an ancestor of the head icefloe committed on
    it.sql(f"CALL {{cat}}.system.set_current_snapshot('{table}', {old_head})")
    it.expected = dict(at_old_head)
    await it.check()
    it.new_owner()  # its checkpoint covers files of the abandoned history
    await upsert_every_key()
    await it.java_delete(3, 1)
    await upsert_every_key()

    # expiry deletes the files only expired snapshots reference (the abandoned history's,
    # and those compaction replaced), which the last checkpoint may still name
    it.sql(f"CALL {{cat}}.system.rollback_to_snapshot('{table}', {old_head})")
    it.expected = dict(at_old_head)
    it.sql(
        f"CALL {{cat}}.system.expire_snapshots(table => '{table}', "
        "older_than => TIMESTAMP '2999-01-01 00:00:00', retain_last => 1)"
    )
    assert len((await it.env.reload()).metadata.snapshots) == 1
    await it.check()
    it.new_owner()
    await upsert_every_key()
    await it.java_merge(rng)
    await upsert_every_key()
    await it.check_other_readers()
    assert it.expected, "the sequence left rows to compare"


@pytest.mark.parametrize("interleaved", [(3, MOR)], ids=["v3-merge-on-read"], indirect=True)
async def test_a_java_delete_between_two_upserts_is_merged_into_the_next_dv(
    interleaved: Interleaved,
) -> None:
    """icefloe's committer keeps the DV it wrote for a file; Java then deletes other rows of
    that file (its DV, merged with ours, replaces it). The next upsert must merge into
    Java's DV, read from its Puffin file, not into the one icefloe remembers."""
    ice = interleaved
    await ice.icefloe_changes([(k, "c", k, f"v{k}") for k in range(KEYS)])
    ice.ord = KEYS
    await ice.icefloe_changes([(k, "d", KEYS + 1, "") for k in range(5)])
    await ice.check()
    await ice.java_changes(f"DELETE FROM {TABLE} WHERE id BETWEEN 5 AND 9")
    for k in range(5, 10):
        del ice.expected[k]
    await ice.check()
    misses = ice.committer.deletion_vectors.stats.misses
    await ice.icefloe_changes([(10, "d", KEYS + 2, ""), (11, "u", KEYS + 2, "again")])
    await ice.check()
    assert ice.committer.deletion_vectors.stats.misses > misses, "Java's DV was read"
    assert sorted(ice.expected) == [*range(11, KEYS)]
