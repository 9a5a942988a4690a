"""Apache Iceberg Java 1.10.2 (Spark 3.5) and icefloe read each other's tables, v2 and v3.

The Java side is the ``java_iceberg`` session fixture: one Spark 3.5 session with Iceberg's
runtime, in its own venv, addressed with SQL over a pipe. Tables live in a HadoopCatalog
warehouse, which is the layout of icefloe's file-system catalog, so both sides open the same
folders with no conversion. Every comparison is of rows as each side reads them.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from icefloe.catalog import Table
from icefloe.catalog_fs import FileSystemCatalog
from icefloe.delete_index import is_deletion_vector
from icefloe.deletion_vector import read_deletion_vector
from icefloe.fileio import LocalFileIO
from icefloe.manifest_cache import ManifestCache
from icefloe.scan import plan_scan
from java_iceberg import JavaIceberg

pytestmark = [pytest.mark.interop, pytest.mark.integration]

MOR = "'write.delete.mode'='merge-on-read','write.update.mode'='merge-on-read'"


def load(warehouse: Path, name: str) -> Table:
    catalog = FileSystemCatalog("java", str(warehouse), LocalFileIO())
    return asyncio.run(catalog.load_table(name))


def plan_tasks(table: Table) -> list[Any]:
    plan = asyncio.run(plan_scan(table.metadata, ManifestCache(table.io)))
    return list(plan.tasks())


def test_java_v3_merge_on_read_writes_one_deletion_vector_per_data_file(
    java_iceberg: JavaIceberg, tmp_path: Path
) -> None:
    wh = tmp_path
    java_iceberg.sql(
        wh,
        "CREATE TABLE {cat}.db.t (id bigint, s string) USING iceberg "
        f"TBLPROPERTIES ('format-version'='3',{MOR})",
    )
    java_iceberg.sql(wh, "INSERT INTO {cat}.db.t VALUES (1,'a'),(2,'b'),(3,'c'),(4,'d')")
    java_iceberg.sql(wh, "DELETE FROM {cat}.db.t WHERE id = 2")
    java_iceberg.sql(wh, "DELETE FROM {cat}.db.t WHERE id = 4")

    table = load(wh, "db.t")
    assert table.metadata.format_version == 3
    tasks = plan_tasks(table)
    assert len(tasks) == 1
    (dv,) = tasks[0].delete_files  # the second DELETE merged the first vector and replaced it
    assert is_deletion_vector(dv)
    assert dv.file_format == "puffin"
    assert dv.referenced_data_file == tasks[0].data_file.file_path
    assert dv.record_count == 2
    rows = java_iceberg.sql(wh, "SELECT id FROM {cat}.db.t ORDER BY id")
    assert rows == [{"id": 1}, {"id": 3}]


# -- Java writes, icefloe reads ---------------------------------------------------------------


class JavaHistory:
    """A table Java changed step by step, with Java's rows at each snapshot."""

    def __init__(self, warehouse: Path, name: str, version: int) -> None:
        self.warehouse = warehouse
        self.name = name
        self.version = version
        self.rows_at: dict[int, list[dict[str, Any]]] = {}
        self.lineage_at: dict[int, list[dict[str, Any]]] = {}


def _java_history(java: JavaIceberg, warehouse: Path, version: int) -> JavaHistory:
    name = f"db.hist_v{version}"
    t = "{cat}." + name
    java.sql(
        warehouse,
        f"CREATE TABLE {t} (id bigint, s string, d date) USING iceberg "
        f"PARTITIONED BY (bucket(4, id)) TBLPROPERTIES ('format-version'='{version}',{MOR})",
    )
    values = ",".join(f"({i}, 's{i}', DATE'2024-01-01' + {i % 7})" for i in range(20))
    java.sql(warehouse, f"INSERT INTO {t} VALUES {values}")
    more = ",".join(f"({i}, 's{i}', NULL)" for i in range(20, 30))
    java.sql(warehouse, f"INSERT INTO {t} VALUES {more}")
    java.sql(warehouse, f"DELETE FROM {t} WHERE id % 3 = 0")
    java.sql(warehouse, f"UPDATE {t} SET s = concat(s, '-u') WHERE id % 5 = 1")
    java.sql(warehouse, f"DELETE FROM {t} WHERE id IN (7, 22)")
    java.sql(warehouse, f"UPDATE {t} SET s = 'again' WHERE id = 11")
    history = JavaHistory(warehouse, name, version)
    snapshots = java.sql(warehouse, f"SELECT snapshot_id FROM {t}.snapshots ORDER BY committed_at")
    lineage = ", _row_id, _last_updated_sequence_number" if version >= 3 else ""
    for row in snapshots:
        sid = row["snapshot_id"]
        history.rows_at[sid] = java.sql(
            warehouse, f"SELECT id, s, d FROM {t} VERSION AS OF {sid} ORDER BY id"
        )
        if lineage:
            history.lineage_at[sid] = java.sql(
                warehouse, f"SELECT id{lineage} FROM {t} VERSION AS OF {sid} ORDER BY id"
            )
    return history


@pytest.fixture(scope="module")
def java_histories(
    java_iceberg: JavaIceberg, tmp_path_factory: pytest.TempPathFactory
) -> dict[int, JavaHistory]:
    warehouse = tmp_path_factory.mktemp("java-history")
    return {v: _java_history(java_iceberg, warehouse, v) for v in (2, 3)}


def icefloe_rows(
    warehouse: Path, name: str, capsys: pytest.CaptureFixture[str], *extra: str
) -> list[dict[str, Any]]:
    from icefloe.cli import main

    capsys.readouterr()
    code = main(["scan", name, "--catalog", f"file://{warehouse}", "--rows", *extra])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    rows = [json.loads(line) for line in captured.out.splitlines() if line.strip()]
    return sorted(rows, key=lambda r: r["id"])


@pytest.mark.parametrize("version", [2, 3])
def test_icefloe_reads_java_merge_on_read_rows_at_every_snapshot(
    java_histories: dict[int, JavaHistory], version: int, capsys: pytest.CaptureFixture[str]
) -> None:
    history = java_histories[version]
    table = load(history.warehouse, history.name)
    kinds = {
        "puffin" if is_deletion_vector(d) else d.file_format
        for task in plan_tasks(table)
        for d in task.delete_files
    }
    assert kinds == ({"puffin"} if version == 3 else {"parquet"})
    assert len(history.rows_at) == 6
    for sid, expected in history.rows_at.items():
        got = icefloe_rows(history.warehouse, history.name, capsys, "--snapshot", str(sid))
        assert got == expected, f"snapshot {sid}"


def test_icefloe_row_lineage_matches_java_at_every_snapshot(
    java_histories: dict[int, JavaHistory], capsys: pytest.CaptureFixture[str]
) -> None:
    history = java_histories[3]
    for sid, expected in history.lineage_at.items():
        got = icefloe_rows(
            history.warehouse, history.name, capsys, "--snapshot", str(sid), "--row-lineage"
        )
        keys = ("id", "_row_id", "_last_updated_sequence_number")
        assert [{k: r[k] for k in keys} for r in got] == expected, f"snapshot {sid}"
    # Updated rows kept their ids (Java copies _row_id into the new files) and took the
    # update's sequence number; the check above compared icefloe's inheritance with Java's.
    first, *_, last = history.lineage_at.values()
    ids_then = {r["id"]: r["_row_id"] for r in first}
    for r in last:
        if r["id"] in ids_then:
            assert r["_row_id"] == ids_then[r["id"]]
    assert len({r["_row_id"] for r in last}) == len(last)
    assert max(r["_last_updated_sequence_number"] for r in last) > 1


def test_java_deletion_vectors_decode_and_reencode_byte_for_byte(
    java_histories: dict[int, JavaHistory],
) -> None:
    history = java_histories[3]
    table = load(history.warehouse, history.name)
    dvs = [d for task in plan_tasks(table) for d in task.delete_files]
    assert dvs
    for d in dvs:
        data = Path(d.file_path.removeprefix("file:")).read_bytes()
        blob = data[d.content_offset : d.content_offset + d.content_size_in_bytes]
        dv = asyncio.run(read_deletion_vector(table.io, d))
        assert len(dv) == d.record_count
        assert dv.to_blob() == blob


def test_spark_read_tasks_apply_java_deletion_vectors(
    java_histories: dict[int, JavaHistory],
) -> None:
    """The icefloe Spark reader's task code (no Spark needed) on Java's DV scan tasks."""
    from icefloe.content_file import content_file_to_json
    from icefloe.spark_tasks import ReadJob, ScanTaskReader, TaskIO

    history = java_histories[3]
    table = load(history.warehouse, history.name)
    meta = table.metadata
    schema = meta.schema()
    job = ReadJob(
        table_schema_json=json.dumps(schema.to_json()),
        read_schema_json=json.dumps(schema.to_json()),
        output_names=tuple(f.name for f in schema.fields),
        specs_json=json.dumps([s.to_json() for s in meta.partition_specs]),
        table_location=meta.location,
        io_properties={},
        output_schema=pa.schema([]),
    )
    task_io = TaskIO(meta.location, {})
    reader = ScanTaskReader(job, task_io)
    rows: list[dict[str, Any]] = []
    try:
        for task in plan_tasks(table):
            specs = meta.specs()
            tj = {
                "data-file": content_file_to_json(
                    task.data_file, specs[task.data_file.spec_id], schema
                ),
                "delete-files": [
                    content_file_to_json(d, specs[d.spec_id], schema) for d in task.delete_files
                ],
            }
            rows.extend(reader.read(tj).to_pylist())
    finally:
        task_io.close()
    current = meta.current_snapshot()
    assert current is not None
    expected = history.rows_at[current.snapshot_id]
    got = sorted(({"id": r["id"], "s": r["s"], "d": r["d"]} for r in rows), key=lambda r: r["id"])
    assert [(r["id"], r["s"]) for r in got] == [(r["id"], r["s"]) for r in expected]
    assert [None if r["d"] is None else r["d"].isoformat() for r in got] == [
        r["d"] for r in expected
    ]
