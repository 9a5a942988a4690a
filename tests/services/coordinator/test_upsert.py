"""Upserts through the committer (icefloe.coordinator.upsert): key files resolved against the
table into DVs (v3) or position deletes (v2), in order, on every attempt's base.

The law: after every commit, the rows a reader sees (deletes applied, by ``icefloe scan``'s
row reader) are the last-write-wins fold of the change stream, whatever the batching, the
duplicates and disorder inside a batch, re-inserted keys, foreign compactions between
commits and foreign commits between our build and our swap. Equality deletes never reach the
table. Tables are local file-system tables with real Parquet files.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_table_committer import SOURCE, Env
from upsert_fixtures import (
    KEYED_SCHEMA,
    Change,
    apply_fold,
    data_files_for,
    fold_batch,
    key_file_for,
    live_delete_files,
    table_rows,
)

from hypothesis_budget import examples
from icefloe.catalog.uri import load_catalog
from icefloe.coordinator.batcher import Unit
from icefloe.coordinator.committer import TableCommitter
from icefloe.deletes.index import is_deletion_vector
from icefloe.errors import EventRejectedError
from icefloe.events import CommitOperation, CommitRequested
from icefloe.io.fileio import FileIO
from icefloe.key_index import KeyIndex
from icefloe.manifests.reader import ManifestReader
from icefloe.parquet.files import write_data_file
from icefloe.spec.datafile import DataFileContent
from icefloe.spec.schema import Schema
from icefloe.spec.types import LongType, NestedField, StringType, StructType
from icefloe.table.catalog import Table
from icefloe.table.commit_index import summary_commit_ids
from icefloe.table.snapshot_producer import rewrite_files

UPSERT = CommitOperation.UPSERT


async def keyed_env(root: Path, version: int, schema: Schema = KEYED_SCHEMA) -> Env:
    catalog = load_catalog(f"file://{root}/wh")
    if not await catalog.namespace_exists("db"):
        await catalog.create_namespace("db")
    table = await catalog.create_table("db.keyed", schema, format_version=version)
    return Env(catalog, table)


def upsert_unit(env: Env, commit_id: str, changes: list[Change], pieces: int = 1) -> Unit:
    """The unit a CDC writer publishes for one batch: its folded rows and all its keys."""
    folded = fold_batch(changes)
    data = data_files_for(env.table, folded, pieces)
    keys = key_file_for(env.table, sorted(folded))
    return env.unit(commit_id, data, UPSERT, [keys])


async def compact(table: Table) -> Table:
    """A foreign compaction: every live row rewritten into one new file (positions move)."""
    rows = await table_rows(table)
    if not rows:
        return table
    arrow = pa.table(
        {
            "id": pa.array(sorted(rows), pa.int64()),
            "value": pa.array([rows[k][0] for k in sorted(rows)], pa.string()),
            "ord": pa.array([rows[k][1] for k in sorted(rows)], pa.int64()),
        }
    )
    path = f"{table.metadata.location}/data/compacted-{len(table.metadata.snapshots)}.parquet"
    new = write_data_file(arrow, path.removeprefix("file://"), schema=KEYED_SCHEMA, file_path=path)
    removed = [f.file_path for f in await live_delete_files(table) if not is_deletion_vector(f)]
    head = table.metadata.current_snapshot()
    assert head is not None
    reader = ManifestReader(table.io)
    for manifest in await reader.manifests(head):
        for entry in await reader.entries(manifest, table.metadata.specs(), live_only=True):
            if entry.data_file.content == DataFileContent.DATA:
                removed.append(entry.data_file.file_path)
    return await rewrite_files(table, removed, [new]).commit()


@st.composite
def change_streams(draw: st.DrawFn) -> tuple[list[list[Change]], list[int], list[int], set[int]]:
    """Batches of changes with increasing source positions, then, per batch, duplicated and
    shuffled; how many batches each commit takes; files per batch; compactions after."""
    order = 0
    batches: list[list[Change]] = []
    for _ in range(draw(st.integers(1, 6))):
        raw = draw(
            st.lists(
                st.tuples(st.integers(0, 9), st.sampled_from("cudr"), st.sampled_from("xyz")),
                min_size=1,
                max_size=10,
            )
        )
        changes: list[Change] = []
        for key, op, value in raw:
            order += 1
            changes.append((key, op, order, f"{value}{order}"))
        repeats = draw(st.lists(st.integers(0, len(changes) - 1), max_size=3))
        changes += [changes[i] for i in repeats]
        batches.append(list(draw(st.permutations(changes))))
    groups: list[int] = []
    left = len(batches)
    while left:
        size = draw(st.integers(1, min(3, left)))
        groups.append(size)
        left -= size
    pieces = [draw(st.integers(1, 2)) for _ in batches]
    compactions = draw(st.sets(st.integers(0, len(groups) - 1), max_size=2))
    return batches, groups, pieces, compactions


@pytest.mark.parametrize("version", [2, 3])
@settings(
    max_examples=examples(30),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(stream=change_streams())
async def test_the_table_is_the_last_write_wins_fold_after_every_commit(
    tmp_path_factory: pytest.TempPathFactory,
    version: int,
    stream: tuple[list[list[Change]], list[int], list[int], set[int]],
) -> None:
    batches, groups, pieces, compactions = stream
    env = await keyed_env(tmp_path_factory.mktemp("fold"), version)
    try:
        committer = env.committer()
        expected: dict[int, tuple[str, int]] = {}
        done = 0
        for g, size in enumerate(groups):
            units = []
            for i in range(done, done + size):
                units.append(upsert_unit(env, f"b{i}", batches[i], pieces[i]))
                apply_fold(expected, fold_batch(batches[i]))
            done += size
            outcome = await committer.commit(units, resume_offset=0, position=env.offset)
            assert not outcome.rejected, outcome.rejected
            assert len(outcome.snapshots) == 1
            table = await env.reload()
            assert await table_rows(table) == expected
            deletes = await live_delete_files(table)
            assert not [d for d in deletes if d.content == DataFileContent.EQUALITY_DELETES]
            if version >= 3:
                assert all(is_deletion_vector(d) for d in deletes)
                targets = Counter(d.referenced_data_file for d in deletes)
                assert not [t for t, n in targets.items() if n > 1], "two DVs for one file"
            else:
                assert not [d for d in deletes if is_deletion_vector(d)]
            if g in compactions:
                env.table = await compact(table)
                assert await table_rows(env.table) == expected
        table = await env.reload()
        ids = [c for s in table.metadata.snapshots for c in summary_commit_ids(s)]
        assert sorted(ids) == sorted(f"b{i}" for i in range(len(batches)))
    finally:
        await env.catalog.close()


@pytest.fixture(params=[2, 3])
async def env(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    e = await keyed_env(tmp_path, request.param)
    yield e
    await e.catalog.close()


async def test_an_upsert_replaces_rows_and_names_its_operation_as_java_does(env: Env) -> None:
    committer = env.committer()
    first = upsert_unit(env, "c1", [(1, "c", 1, "a"), (2, "c", 2, "b")])
    outcome = await committer.commit([first], resume_offset=0, position=2)
    snapshot, _ = outcome.snapshots[0]
    assert snapshot.summary is not None and snapshot.summary.operation == "append"
    second = upsert_unit(env, "c2", [(2, "u", 3, "B"), (3, "c", 4, "c")])
    outcome = await committer.commit([second], resume_offset=0, position=4)
    snapshot, _ = outcome.snapshots[0]
    assert snapshot.summary is not None and snapshot.summary.operation == "overwrite"
    third = upsert_unit(env, "c3", [(1, "d", 5, "")])
    outcome = await committer.commit([third], resume_offset=0, position=6)
    snapshot, _ = outcome.snapshots[0]
    assert snapshot.summary is not None and snapshot.summary.operation == "delete"
    assert await table_rows(await env.reload()) == {2: ("B", 3), 3: ("c", 4)}
    summary = snapshot.summary
    assert json.loads(summary["icefloe.commit-ids"]) == ["c3"]


async def test_a_key_the_key_files_miss_is_still_replaced(env: Env) -> None:
    """The data files' own keys are looked up too: a writer whose key files miss a key it
    writes must not leave two rows for it."""
    committer = env.committer()
    await committer.commit(
        [upsert_unit(env, "c1", [(1, "c", 1, "a")])], resume_offset=0, position=1
    )
    data = data_files_for(env.table, {1: ("b", 2)})
    keys = key_file_for(env.table, [7])
    await committer.commit([env.unit("c2", data, UPSERT, [keys])], resume_offset=0, position=3)
    assert await table_rows(await env.reload()) == {1: ("b", 2)}


async def test_a_foreign_commit_between_build_and_swap_is_resolved_again(env: Env) -> None:
    """Another engine compacts the table while our attempt is built: the swap fails, the next
    attempt resolves on the compacted base (rows found in their new file); no DV or position
    delete for the compacted-away file is ever committed."""
    committer = env.committer()
    await committer.commit(
        [upsert_unit(env, "c1", [(k, "c", k, "v") for k in range(5)])], resume_offset=0, position=1
    )
    real_commit = env.catalog.commit
    compacted: list[Table] = []

    async def racing(table: Table, metadata: Any) -> Table:
        if not compacted:
            env.catalog.commit = real_commit  # type: ignore[method-assign]
            compacted.append(await compact(await env.catalog.load_table(env.name)))
            env.catalog.commit = racing  # type: ignore[method-assign]
        return await real_commit(table, metadata)

    env.catalog.commit = racing  # type: ignore[method-assign]
    unit = upsert_unit(env, "c2", [(1, "u", 10, "new"), (3, "d", 11, "")])
    outcome = await committer.commit([unit], resume_offset=0, position=3)
    assert [u.commit_id for u in outcome.committed_units] == ["c2"] and not outcome.rejected
    assert outcome.stats.conflicts >= 1
    table = await env.reload()
    assert await table_rows(table) == {0: ("v", 0), 1: ("new", 10), 2: ("v", 2), 4: ("v", 4)}
    live = await committer.live_data_files(table.metadata, "main")
    deletes = await live_delete_files(table)
    assert deletes and all(d.referenced_data_file in live for d in deletes)
    # the failed attempt's delete file (for the compacted-away file) was removed again
    reader = ManifestReader(table.io)
    referenced = set()
    for snapshot in table.metadata.snapshots:
        for manifest in await reader.manifests(snapshot):
            for entry in await reader.entries(manifest, table.metadata.specs()):
                referenced.add(entry.data_file.file_path)
    data_dir = Path(table.metadata.location.removeprefix("file://")) / "data"
    written = {f"file://{p}" for p in data_dir.iterdir() if "-deletes." in p.name}
    assert written and written <= referenced


async def test_consecutive_upserts_in_one_snapshot_see_each_other(env: Env) -> None:
    committer = env.committer()
    units = [
        upsert_unit(env, "c1", [(1, "c", 1, "a"), (2, "c", 2, "b")]),
        upsert_unit(env, "c2", [(1, "u", 3, "A")]),
        upsert_unit(env, "c3", [(1, "d", 4, ""), (2, "u", 5, "B")]),
        upsert_unit(env, "c4", [(1, "c", 6, "again")]),
    ]
    outcome = await committer.commit(units, resume_offset=0, position=8)
    assert len(outcome.snapshots) == 1
    assert await table_rows(await env.reload()) == {1: ("again", 6), 2: ("B", 5)}


async def test_a_replayed_upsert_batch_is_applied_once(env: Env) -> None:
    """The same commit ids again (a new attempt id and new files): acknowledged, not
    applied, from a fresh committer too (the dedup index covers upserts)."""
    first = [upsert_unit(env, "c1", [(1, "c", 1, "a")]), upsert_unit(env, "c2", [(1, "u", 2, "b")])]
    await env.committer().commit(first, resume_offset=0, position=4)
    retry = [upsert_unit(env, "c2", [(1, "u", 2, "b")]), upsert_unit(env, "c3", [(2, "c", 3, "c")])]
    outcome = await env.committer().commit(retry, resume_offset=0, position=8)
    assert set(outcome.already_committed) == {"c2"}
    assert [u.commit_id for u in outcome.committed_units] == ["c3"]
    assert await table_rows(await env.reload()) == {1: ("b", 2), 2: ("c", 3)}


@pytest.mark.parametrize("interval", [0.0, 3600.0])
async def test_the_key_index_is_opened_once_and_checkpointed_when_due(
    env: Env, interval: float
) -> None:
    """Checkpointed on the first upsert commit, then at most every interval (each commit
    with 0), and on checkpoint_key_index (giving the table up, going idle) if commits
    since were not; a checkpoint with nothing new is not asked for."""
    opened: list[KeyIndex] = []
    checkpoints = Counter[int]()

    class Counting(KeyIndex):
        async def checkpoint(self) -> None:
            checkpoints[id(self)] += 1

    async def opener(io: FileIO, location: str, schema: Schema, key_ids: Any) -> KeyIndex:
        assert location == env.table.metadata.location and list(key_ids) == [1]
        index = Counting(io, schema, key_ids)
        opened.append(index)
        return index

    committer = TableCommitter(
        env.catalog, env.name, SOURCE, open_key_index=opener, key_index_checkpoint_s=interval
    )
    for i in range(3):
        unit = upsert_unit(env, f"c{i}", [(1, "u", i, f"v{i}")])
        await committer.commit([unit], resume_offset=0, position=2 * i + 2)
    assert len(opened) == 1
    assert checkpoints[id(opened[0])] == (3 if interval == 0 else 1)
    await committer.checkpoint_key_index()
    assert checkpoints[id(opened[0])] == (3 if interval == 0 else 2)
    await committer.checkpoint_key_index()  # nothing new since
    assert checkpoints[id(opened[0])] == (3 if interval == 0 else 2)
    # after the commit the index covers the committed snapshot, staged files included
    live = await committer.live_data_files((await env.reload()).metadata, "main")
    assert opened[0].covered == frozenset(live)


async def test_key_files_are_deleted_after_the_commit_and_never_committed(env: Env) -> None:
    committer = env.committer()
    unit = upsert_unit(env, "c1", [(1, "c", 1, "a")])
    outcome = await committer.commit([unit], resume_offset=0, position=2)
    (key_file,) = unit.delete_files
    assert Path(key_file.file_path.removeprefix("file://")).exists()
    assert key_file.file_path not in await committer.live_paths(outcome.table.metadata, "main")  # type: ignore[union-attr]
    await committer.delete_key_files(outcome.committed_units)
    assert not Path(key_file.file_path.removeprefix("file://")).exists()
    for f in unit.data_files:
        assert Path(f.file_path.removeprefix("file://")).exists()


# -- refusals -----------------------------------------------------------------------------


async def refusal(env: Env, unit: Unit) -> EventRejectedError:
    outcome = await env.committer().commit([unit], resume_offset=0, position=2)
    assert not outcome.snapshots
    ((refused, error),) = outcome.rejected
    assert refused is unit
    return error


async def request_refusal(tmp_path: Path, version: int, schema: Schema) -> EventRejectedError:
    """The refusal of an upsert on a new table of this schema and version: as its
    commit-requested arrives, and again at commit."""
    env = await keyed_env(tmp_path, version, schema)
    try:
        request = CommitRequested(
            table=env.name, commit_id="c1", operation=UPSERT, attempt_ids=("c1-a0",)
        )
        with pytest.raises(EventRejectedError) as e:
            await env.committer().validate_commit_requested(request)
        # and again at commit, on each base (the table may change after the request came)
        at_commit = await refusal(env, upsert_unit(env, "c2", [(1, "c", 1, "a")]))
        assert at_commit.kind == e.value.kind
        assert str(at_commit).split(": ", 1)[1] == str(e.value).split(": ", 1)[1]
        return e.value
    finally:
        await env.catalog.close()


async def test_a_table_without_identifier_fields_refuses_upserts(tmp_path: Path) -> None:
    error = await request_refusal(tmp_path, 3, Schema(*KEYED_SCHEMA.fields))
    assert error.kind == "not-keyed" and "no identifier fields" in str(error)
    assert "set identifier-field-ids" in str(error)


async def test_a_nullable_key_refuses_upserts(tmp_path: Path) -> None:
    schema = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(
            2, "key", StructType(NestedField(3, "k", LongType(), required=True)), required=False
        ),
        identifier_field_ids=[3],
    )
    error = await request_refusal(tmp_path, 2, schema)
    assert error.kind == "not-keyed" and "'key.k' can be null" in str(error)


async def test_format_v1_refuses_upserts(tmp_path: Path) -> None:
    error = await request_refusal(tmp_path, 1, KEYED_SCHEMA)
    assert error.kind == "invalid-request" and "format v2 or later" in str(error)


async def test_key_files_over_other_columns_are_refused(env: Env) -> None:
    data = data_files_for(env.table, {1: ("a", 1)})
    keys = key_file_for(env.table, [1], equality_ids=[1, 3])
    error = await refusal(env, env.unit("c1", data, UPSERT, [keys]))
    assert error.kind == "invalid-key-file" and "equality-ids [1, 3]" in str(error)
    assert "identifier field ids are [1]" in str(error)


async def test_key_files_that_are_not_equality_deletes_are_refused(env: Env) -> None:
    data = data_files_for(env.table, {1: ("a", 1)})
    positions = key_file_for(env.table, [1]).copy(
        content=DataFileContent.POSITION_DELETES, equality_ids=None
    )
    if env.table.metadata.format_version >= 3:
        positions = positions.copy(referenced_data_file=data[0].file_path)
    error = await refusal(env, env.unit("c1", data, UPSERT, [positions]))
    assert error.kind == "invalid-key-file" and "'position-deletes'" in str(error)


async def test_key_files_that_are_not_parquet_are_refused(env: Env) -> None:
    data = data_files_for(env.table, {1: ("a", 1)})
    keys = key_file_for(env.table, [1], file_format="avro")
    error = await refusal(env, env.unit("c1", data, UPSERT, [keys]))
    assert error.kind == "invalid-key-file" and "must be Parquet" in str(error)


async def test_unreadable_key_files_and_duplicate_keys_are_refused(env: Env) -> None:
    data = data_files_for(env.table, {1: ("a", 1)})
    junk = key_file_for(env.table, [1])
    Path(junk.file_path.removeprefix("file://")).write_bytes(b"not parquet")
    error = await refusal(env, env.unit("c1", data, UPSERT, [junk]))
    assert error.kind == "invalid-key-file" and "cannot read the key columns" in str(error)
    twice = [*data_files_for(env.table, {1: ("a", 1)}), *data_files_for(env.table, {1: ("b", 2)})]
    error = await refusal(env, env.unit("c2", twice, UPSERT, [key_file_for(env.table, [1])]))
    assert error.kind == "duplicate-key" and "appears 2 times" in str(error)


async def test_a_refused_unit_leaves_the_rest_of_the_batch_to_commit(env: Env) -> None:
    good = upsert_unit(env, "c1", [(1, "c", 1, "a")])
    data = data_files_for(env.table, {2: ("b", 2)})
    bad = env.unit("c2", data, UPSERT, [key_file_for(env.table, [2], equality_ids=[2])])
    later = upsert_unit(env, "c3", [(1, "u", 3, "A")])
    outcome = await env.committer().commit([good, bad, later], resume_offset=0, position=6)
    assert [u.commit_id for u, _ in outcome.rejected] == ["c2"]
    assert [u.commit_id for u in outcome.committed_units] == ["c1", "c3"]
    assert await table_rows(await env.reload()) == {1: ("A", 3)}


async def test_a_missing_key_file_of_a_commit_applied_elsewhere_is_acknowledged(env: Env) -> None:
    """A zombie on a stale base finds the key files gone (the owner committed and deleted
    them): it looks in the table and acknowledges the commit instead of refusing it."""
    unit = upsert_unit(env, "c1", [(1, "c", 1, "a")])
    zombie = env.committer()
    await zombie.load()
    owner = env.committer()
    outcome = await owner.commit([unit], resume_offset=0, position=2)
    await owner.delete_key_files(outcome.committed_units)
    snapshot_id = outcome.snapshots[0][0].snapshot_id
    stale = await zombie.commit([unit], resume_offset=0, position=2)
    assert stale.already_committed == {"c1": snapshot_id} and not stale.rejected
    missing = env.unit(
        "c2", data_files_for(env.table, {2: ("b", 2)}), UPSERT, [key_file_for(env.table, [2])]
    )
    Path(missing.delete_files[0].file_path.removeprefix("file://")).unlink()
    error = await refusal(env, missing)
    assert error.kind == "missing-file"


async def test_upserts_and_appends_on_a_keyed_table_batch_apart(env: Env) -> None:
    """An append is not resolved (it adds rows as they are); the next upsert sees them."""
    append = env.unit("a1", data_files_for(env.table, {5: ("x", 1)}))
    await env.committer().commit([append], resume_offset=0, position=2)
    await env.committer().commit(
        [upsert_unit(env, "u1", [(5, "u", 2, "y")])], resume_offset=0, position=4
    )
    assert await table_rows(await env.reload()) == {5: ("y", 2)}


def test_schema_of_fixtures_is_keyed() -> None:
    assert KEYED_SCHEMA.identifier_field_ids == (1,)
    assert isinstance(KEYED_SCHEMA.find_type(2), StringType)


async def test_an_index_pointing_nowhere_makes_the_attempt_retry_not_refuse(env: Env) -> None:
    """Deletes for a file that is no longer live are never written: a build that would is
    turned into a conflict and resolved again on a fresh base."""
    committer = env.committer()
    await committer.commit(
        [upsert_unit(env, "c1", [(1, "c", 1, "a")])], resume_offset=0, position=2
    )
    calls = Counter[str]()
    real = KeyIndex.lookup

    async def stale_lookup(self: KeyIndex, keys: pa.Table) -> Any:
        calls["lookup"] += 1
        found = await real(self, keys)
        if calls["lookup"] == 1:
            return {"file:///gone.parquet": next(iter(found.values()))} if found else found
        return found

    KeyIndex.lookup = stale_lookup  # type: ignore[method-assign]
    try:
        unit = upsert_unit(env, "c2", [(1, "u", 2, "b")])
        outcome = await committer.commit([unit], resume_offset=0, position=4)
    finally:
        KeyIndex.lookup = real  # type: ignore[method-assign]
    assert [u.commit_id for u in outcome.committed_units] == ["c2"] and not outcome.rejected
    assert await table_rows(await env.reload()) == {1: ("b", 2)}
