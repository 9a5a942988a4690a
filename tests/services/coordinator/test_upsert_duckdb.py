"""DuckDB 1.5.5 (the iceberg extension from its PyPI wheel, loaded from the file, nothing
installed or auto-loaded) reads keyed tables that icefloe's upserts write, at every snapshot.

icefloe's side is the committer committing upsert units directly (no Kafka): v2 tables get
position delete files, v3 tables deletion vectors. After each commit the metadata file that
commit wrote is kept with the oracle's rows (the last-write-wins fold of every batch so far);
at the end DuckDB's ``iceberg_scan`` of each of those metadata files, and PyIceberg's scan of
the same file, must return exactly that snapshot's rows: every live key once, no deleted key.
"""

from __future__ import annotations

import random
from pathlib import Path

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
from icefloe.coordinator.committer import TableCommitter
from icefloe.deletes.index import is_deletion_vector
from icefloe.events import CommitOperation
from icefloe.io.fileio import LocalFileIO
from icefloe.spec.datafile import DataFileContent

State = dict[int, tuple[str, int]]
KEYS = 30
COMMITS = 8


async def upsert_history(tmp_path: Path, version: int) -> list[tuple[str, State, int]]:
    """Upsert batches into a fresh keyed table of format ``version``: (metadata location,
    oracle rows, live delete files) after each commit."""
    catalog = FileSystemCatalog("ice", str(tmp_path), LocalFileIO())
    await catalog.create_namespace("db")
    table = await catalog.create_table("db.keyed", KEYED_SCHEMA, format_version=version)
    env = Env(catalog, table)
    committer = TableCommitter(catalog, env.name, SOURCE)
    rng = random.Random(version)
    expected: State = {}
    history: list[tuple[str, State, int]] = []
    order = 0
    try:
        for n in range(COMMITS):
            changes: list[Change] = []
            for _ in range(rng.randint(8, 20)):
                order += 1
                op = rng.choice("cudr") if n else "c"
                changes.append((rng.randrange(KEYS), op, order, f"v{order}"))
            changes += rng.sample(changes, k=3)  # duplicates inside the batch
            rng.shuffle(changes)
            folded = fold_batch(changes)
            data = data_files_for(env.table, folded, pieces=2)
            keys = key_file_for(env.table, sorted(folded))
            unit = env.unit(f"c{n}", data, CommitOperation.UPSERT, [keys])
            outcome = await committer.commit([unit], resume_offset=0, position=env.offset)
            assert not outcome.rejected, outcome.rejected
            apply_fold(expected, folded)
            loaded = await env.reload()
            assert await table_rows(loaded) == expected
            deletes = await live_delete_files(loaded)
            assert not [d for d in deletes if d.content == DataFileContent.EQUALITY_DELETES]
            assert all(is_deletion_vector(d) == (version >= 3) for d in deletes)
            history.append((loaded.metadata_location, dict(expected), len(deletes)))
    finally:
        await catalog.close()
    # the history must exercise deletes: rows replaced and keys removed
    assert any(n for _, _, n in history), "no commit deleted a row"
    return history


@pytest.mark.parametrize("version", [2, 3])
async def test_duckdb_and_pyiceberg_read_every_snapshot_of_an_upsert_table(
    version: int, tmp_path: Path
) -> None:
    history = await upsert_history(tmp_path, version)
    for location, expected, _ in history:
        for engine, rows in other_engines_rows(location).items():
            assert rows == expected, (engine, location)
