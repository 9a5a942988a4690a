"""Keyed tables for upsert tests: a change stream, its last-write-wins fold, the data and key
files a CDC writer would write for each batch, and the rows a reader sees.

A change is ``(key, op, ord, value)``: ``op`` is ``c``/``u``/``r`` (the key's row becomes
``value``) or ``d`` (the key goes), ``ord`` the source position (an LSN). Within a batch the
change with the highest ``ord`` wins per key (a later duplicate of the same change changes
nothing); batches apply in commit order, which is Kafka order.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from icefloe.cli.scan import task_rows
from icefloe.dev.bench_upsert import duckdb_reader, pyiceberg_read
from icefloe.manifests.cache import ManifestCache
from icefloe.manifests.reader import ManifestReader
from icefloe.parquet.files import write_data_file
from icefloe.scan.planning import plan_scan
from icefloe.spec.datafile import DataFile, DataFileContent
from icefloe.spec.partition import PartitionSpec
from icefloe.spec.schema import Schema
from icefloe.spec.types import LongType, NestedField, StringType
from icefloe.table.catalog import Table

KEYED_SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "value", StringType()),
    NestedField(3, "ord", LongType()),
    identifier_field_ids=[1],
)
KEY_SCHEMA = Schema(NestedField(1, "id", LongType(), required=True))

Change = tuple[int, str, int, str]


def keyed_table(version: int) -> dict[str, Any]:
    """``create_tables`` options of an unpartitioned keyed table of format ``version``."""
    return {
        "schema": KEYED_SCHEMA,
        "spec": PartitionSpec.unpartitioned(),
        "format_version": version,
    }


def fold_batch(changes: Iterable[Change]) -> dict[int, tuple[str, int] | None]:
    """Key → its row after the batch (``(value, ord)``), or None when the batch deletes it."""
    best: dict[int, Change] = {}
    for change in changes:
        key, _, order, _ = change
        if key not in best or order >= best[key][2]:
            best[key] = change
    return {
        key: None if op == "d" else (value, order) for key, (_, op, order, value) in best.items()
    }


def apply_fold(
    state: dict[int, tuple[str, int]], folded: dict[int, tuple[str, int] | None]
) -> None:
    for key, row in folded.items():
        if row is None:
            state.pop(key, None)
        else:
            state[key] = row


def _write(table: Table, rows: pa.Table, schema: Schema, name: str) -> DataFile:
    path = f"{table.metadata.location}/data/{name}-{uuid.uuid4().hex[:8]}.parquet"
    local = Path(path.removeprefix("file://"))
    local.parent.mkdir(parents=True, exist_ok=True)
    return write_data_file(rows, str(local), schema=schema, file_path=path)


def data_files_for(
    table: Table, folded: dict[int, tuple[str, int] | None], pieces: int = 1
) -> list[DataFile]:
    """The batch's new rows, one row per key, split into up to ``pieces`` files."""
    rows = sorted((k, v[0], v[1]) for k, v in folded.items() if v is not None)
    out = []
    size = max(1, -(-len(rows) // max(1, pieces)))
    for start in range(0, len(rows), size):
        chunk = rows[start : start + size]
        arrow = pa.table(
            {
                "id": pa.array([r[0] for r in chunk], pa.int64()),
                "value": pa.array([r[1] for r in chunk], pa.string()),
                "ord": pa.array([r[2] for r in chunk], pa.int64()),
            }
        )
        out.append(_write(table, arrow, KEYED_SCHEMA, "data"))
    return out


def key_file_for(
    table: Table, keys: Sequence[int], *, equality_ids: Sequence[int] = (1,), **changes: Any
) -> DataFile:
    """A key file (equality-delete Parquet over ``id``) naming ``keys``."""
    written = _write(table, pa.table({"id": pa.array(list(keys), pa.int64())}), KEY_SCHEMA, "keys")
    return written.copy(
        content=DataFileContent.EQUALITY_DELETES, equality_ids=list(equality_ids), **changes
    )


async def table_rows(table: Table) -> dict[int, tuple[str, int]]:
    """The rows a reader sees (deletes applied), by key; fails on a key seen twice."""
    out: dict[int, tuple[str, int]] = {}
    if table.metadata.current_snapshot() is None:
        return out
    plan = await plan_scan(table.metadata, ManifestCache(table.io))
    for task in plan.tasks():
        for row in await task_rows(table.io, plan, task):
            assert row["id"] not in out, f"key {row['id']} is live twice"
            out[row["id"]] = (row["value"], row["ord"])
    return out


async def live_delete_files(table: Table) -> list[DataFile]:
    head = table.metadata.current_snapshot()
    if head is None:
        return []
    reader = ManifestReader(table.io)
    out = []
    for manifest in await reader.manifests(head):
        for entry in await reader.entries(manifest, table.metadata.specs(), live_only=True):
            if entry.data_file.content != DataFileContent.DATA:
                out.append(entry.data_file)
    return out


@functools.cache
def _duckdb() -> Callable[[str], pa.Table]:
    return duckdb_reader()  # one connection, the extensions loaded once


def other_engines_rows(location: str) -> dict[str, dict[int, tuple[str, int]]]:
    """The table whose metadata file is ``location`` as PyIceberg and DuckDB 1.5.5 (the
    iceberg extension from its wheel, nothing auto-installed) read it, by engine and key;
    fails on a key either engine sees twice."""
    out = {}
    for engine, read in (("PyIceberg", pyiceberg_read), ("DuckDB", _duckdb())):
        rows = read(location).select(["id", "value", "ord"]).to_pylist()
        out[engine] = {r["id"]: (r["value"], r["ord"]) for r in rows}
        assert len(out[engine]) == len(rows), f"{engine} sees a key twice in {location}"
    return out
