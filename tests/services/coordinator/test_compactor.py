"""The coordinator's own compaction of upsert tables (icefloe.coordinator.compactor, over the
engine-free rewrite of icefloe.table.rewrite), on local file-system tables with real Parquet files.

The laws: after every commit and every compaction, a reader (icefloe's row reader, PyIceberg,
DuckDB) sees exactly the last-write-wins fold of the change stream; compaction leaves no
delete behind for the rows it moved and keeps every row's lineage on v3; the key index
stays true (a later upsert of a moved key deletes its row in the new file); a delete another
writer commits between plan and commit aborts the rewrite, never that writer; a kill -9 at
any point of a compaction leaves at most unreferenced files.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from test_table_committer import Env
from test_upsert import keyed_env, upsert_unit
from upsert_fixtures import Change, apply_fold, fold_batch, live_delete_files, table_rows

from icefloe.cli.scan import task_rows
from icefloe.coordinator.committer import TableCommitter
from icefloe.coordinator.compactor import (
    AUTO_ENABLED,
    AUTO_MIN_NEW_FILES,
    AutoCompactionPolicy,
    TableCompactor,
    compaction_due,
    compacts_itself,
)
from icefloe.errors import ValidationConflictError, ValidationError
from icefloe.manifests.cache import ManifestCache
from icefloe.manifests.reader import ManifestReader
from icefloe.scan.planning import plan_scan
from icefloe.spec.datafile import DataFileContent
from icefloe.spec.metadata_builder import MetadataBuilder
from icefloe.spec.snapshot import Operation
from icefloe.table.catalog import Table
from icefloe.table.compaction import plan_compaction
from icefloe.table.rewrite import SUMMARY_REWRITE, rewrite_and_commit, select_groups
from icefloe.table.snapshot_producer import SnapshotProducer

KEYS = 40


def random_batch(rng: random.Random, n: int, order: list[int]) -> list[Change]:
    changes: list[Change] = []
    for _ in range(rng.randint(1, 12)):
        order[0] += 1
        key = rng.randrange(KEYS)
        changes.append((key, rng.choice("cuurd"), order[0], f"v{n}.{key}"))
    return changes


async def set_properties(env: Env, **properties: str) -> None:
    table = await env.reload()
    builder = MetadataBuilder(table.metadata).set_properties(properties)
    env.table = await env.catalog.commit(table, builder.build(table.metadata_location))


async def data_paths(table: Table) -> set[str]:
    head = table.metadata.current_snapshot()
    if head is None:
        return set()
    reader = ManifestReader(table.io)
    out = set()
    for manifest in await reader.manifests(head):
        for entry in await reader.entries(manifest, table.metadata.specs(), live_only=True):
            if entry.data_file.content == DataFileContent.DATA:
                out.add(entry.data_file.file_path)
    return out


async def lineage(table: Table) -> dict[int, tuple[int, int]]:
    """Key → (_row_id, _last_updated_sequence_number) as a v3 reader sees them."""
    out = {}
    plan = await plan_scan(table.metadata, ManifestCache(table.io))
    for task in plan.tasks():
        for row in await task_rows(table.io, plan, task, row_lineage=True):
            out[row["id"]] = (row["_row_id"], row["_last_updated_sequence_number"])
    return out


@pytest.fixture(params=[2, 3])
async def env(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    e = await keyed_env(tmp_path, request.param)
    await set_properties(e, **{AUTO_MIN_NEW_FILES: "3"})
    yield e
    await e.catalog.close()


async def test_upserts_and_compactions_keep_the_fold_and_the_key_index_true(env: Env) -> None:
    """Compaction runs after commits as the worker runs it; each later upsert resolves its
    keys through the index the compaction updated (moved rows in their new files)."""
    committer = env.committer()
    compactor = TableCompactor(committer)
    rng = random.Random(19)
    order = [0]
    expected: dict[int, tuple[str, int]] = {}
    compactions = 0
    for n in range(24):
        changes = random_batch(rng, n, order)
        outcome = await committer.commit(
            [upsert_unit(env, f"b{n}", changes)], resume_offset=0, position=env.offset
        )
        assert not outcome.rejected, outcome.rejected
        apply_fold(expected, fold_batch(changes))
        before = committer.table
        assert before is not None
        lineage_before = await lineage(before) if env.table.metadata.format_version >= 3 else {}
        result = await compactor.maybe_compact()
        table = await env.reload()
        assert await table_rows(table) == expected
        if result is None:
            continue
        compactions += 1
        head = table.metadata.current_snapshot()
        assert head is not None and head.summary is not None
        assert head.summary.operation == Operation.REPLACE
        assert head.summary.get(SUMMARY_REWRITE) == "icefloe"
        # Every file with deletes was rewritten: no delete is left, one file holds the rows.
        assert await live_delete_files(table) == []
        assert len(await data_paths(table)) == 1
        # The index covers exactly the live files, with the moved rows' new positions.
        index = await committer.key_index(table.metadata)
        assert index.covered == frozenset(await data_paths(table))
        if table.metadata.format_version >= 3:
            assert await lineage(table) == lineage_before, "rows lost their lineage"
    assert compactions >= 4
    # A fresh committer (a new owner) resumes from the checkpoint and upserts every key.
    fresh = TableCommitter(env.catalog, env.name, "other/0")
    changes = [(k, "u", order[0] + 1, f"last.{k}") for k in range(KEYS)]
    outcome = await fresh.commit(
        [upsert_unit(env, "last", changes)], resume_offset=0, position=env.offset
    )
    assert not outcome.rejected
    apply_fold(expected, fold_batch(changes))
    assert await table_rows(await env.reload()) == expected


async def test_other_readers_see_exactly_the_fold_after_compaction(env: Env) -> None:
    pytest.importorskip("pyiceberg")
    from icefloe.dev.bench_upsert import duckdb_reader, pyiceberg_read

    committer = env.committer()
    compactor = TableCompactor(committer)
    rng = random.Random(7)
    order = [0]
    expected: dict[int, tuple[str, int]] = {}
    for n in range(7):
        changes = random_batch(rng, n, order)
        await committer.commit(
            [upsert_unit(env, f"b{n}", changes)], resume_offset=0, position=env.offset
        )
        apply_fold(expected, fold_batch(changes))
        await compactor.maybe_compact()
    assert compactor.runs >= 1
    table = await env.reload()
    readers = [pyiceberg_read]
    try:
        readers.append(duckdb_reader())
    except ImportError:
        pass  # DuckDB's iceberg extension is optional in the dev environment
    for read in readers:
        rows = read(table.metadata_location).to_pylist()
        got = {r["id"]: (r["value"], r["ord"]) for r in rows}
        assert len(got) == len(rows) and got == expected


async def test_a_delete_committed_between_plan_and_commit_aborts_the_rewrite(env: Env) -> None:
    """Another engine's delete on a planned file wins; the rewrite's files are removed."""
    committer = env.committer()
    rng = random.Random(3)
    order = [0]
    for n in range(4):
        await committer.commit(
            [upsert_unit(env, f"b{n}", random_batch(rng, n, order))],
            resume_offset=0,
            position=env.offset,
        )
    table = await env.reload()
    plan = await plan_compaction(table)
    groups = select_groups(plan, 1 << 30)
    assert groups
    victim = groups[0].tasks[0].data_file
    foreign = SnapshotProducer(table, Operation.DELETE)
    foreign.delete_positions(victim, [0])
    await foreign.commit()
    before = set(Path(env.table.location.removeprefix("file://")).rglob("*.parquet"))
    with pytest.raises(ValidationConflictError):
        await rewrite_and_commit(table, plan, groups)
    after = set(Path(env.table.location.removeprefix("file://")).rglob("*.parquet"))
    assert after == before, "the aborted rewrite left files behind"
    head = (await env.reload()).metadata.current_snapshot()
    assert head is not None and head.snapshot_id == foreign.snapshot_id


async def test_the_trigger_reads_summaries_and_the_switch_turns_it_off(env: Env) -> None:
    committer = env.committer()
    rng = random.Random(5)
    order = [0]
    for n in range(3):
        await committer.commit(
            [upsert_unit(env, f"b{n}", random_batch(rng, n, order))],
            resume_offset=0,
            position=env.offset,
        )
    table = await env.reload()
    assert compaction_due(table.metadata, AutoCompactionPolicy.for_table(table.metadata))
    await set_properties(env, **{AUTO_ENABLED: "false"})
    committer.table = await env.reload()
    assert await TableCompactor(committer).maybe_compact() is None
    assert (await env.reload()).metadata.current_snapshot().summary.operation != "replace"  # type: ignore[union-attr]
    assert not compacts_itself((await env.reload()).metadata)  # announced to engines again
    await set_properties(env, **{AUTO_ENABLED: "maybe"})
    with pytest.raises(ValidationError, match=AUTO_ENABLED):
        AutoCompactionPolicy.for_table((await env.reload()).metadata)
    assert not compacts_itself((await env.reload()).metadata)
    await set_properties(env, **{AUTO_ENABLED: "true"})
    assert compacts_itself((await env.reload()).metadata)


_CRASHING = textwrap.dedent(
    """
    import asyncio, os, signal, sys
    from icefloe.catalog.uri import load_catalog
    from icefloe.coordinator.committer import TableCommitter
    from icefloe.coordinator.compactor import TableCompactor
    import icefloe.table.rewrite as rewrite
    import icefloe.key_index.index as index_module

    uri, table, point = sys.argv[1:4]

    def die(*_a, **_k):
        os.kill(os.getpid(), signal.SIGKILL)

    if point == "before-commit":
        rewrite.SnapshotProducer.commit = die
    elif point == "before-index-checkpoint":
        index_module.KeyIndex.checkpoint = die

    async def main():
        catalog = load_catalog(uri)
        committer = TableCommitter(catalog, table, "crash/0")
        table_ = await committer.load()
        # Open the index as the worker has it after its upserts.
        await committer.key_index(table_.metadata)
        await TableCompactor(committer).maybe_compact()

    asyncio.run(main())
    """
)


@pytest.mark.parametrize("point", ["before-commit", "before-index-checkpoint"])
async def test_a_kill_9_during_a_compaction_loses_and_doubles_nothing(
    env: Env, point: str, tmp_path: Path
) -> None:
    committer = env.committer()
    rng = random.Random(11)
    order = [0]
    expected: dict[int, tuple[str, int]] = {}
    for n in range(5):
        changes = random_batch(rng, n, order)
        await committer.commit(
            [upsert_unit(env, f"b{n}", changes)], resume_offset=0, position=env.offset
        )
        apply_fold(expected, fold_batch(changes))
    table = await env.reload()
    uri = f"file://{tmp_path}/wh"
    script = tmp_path / "crash.py"
    script.write_text(_CRASHING)
    proc = subprocess.run(
        [sys.executable, str(script), uri, env.name, point],
        capture_output=True,
        text=True,
        env={**os.environ},
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    after = await env.reload()
    assert await table_rows(after) == expected
    committed = after.metadata.current_snapshot() != table.metadata.current_snapshot()
    assert committed == (point == "before-index-checkpoint")
    # A new owner upserts every key: each old row is found and deleted exactly once.
    fresh = TableCommitter(env.catalog, env.name, "after/0")
    changes = [(k, "u", order[0] + 1, f"after.{k}") for k in range(KEYS)]
    outcome = await fresh.commit(
        [upsert_unit(env, "after", changes)], resume_offset=0, position=env.offset
    )
    assert not outcome.rejected
    apply_fold(expected, fold_batch(changes))
    assert await table_rows(await env.reload()) == expected
    json.dumps(expected)  # the oracle stays plain data
