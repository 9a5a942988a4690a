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
import pyarrow.parquet as pq
import pytest

from icefloe.catalog.fs import FileSystemCatalog
from icefloe.deletes.deletion_vector import read_deletion_vector
from icefloe.deletes.index import is_deletion_vector
from icefloe.errors import ValidationError
from icefloe.io.fileio import LocalFileIO
from icefloe.manifests.cache import ManifestCache
from icefloe.parquet.files import write_data_file
from icefloe.scan.planning import plan_scan
from icefloe.spec.datafile import DataFile, DataFileContent
from icefloe.spec.metadata_builder import MetadataBuilder
from icefloe.spec.partition import PartitionSpecBuilder
from icefloe.spec.schema import Schema
from icefloe.spec.schema_update import UpdateSchema
from icefloe.spec.types import (
    IntegerType,
    LongType,
    NestedField,
    StringType,
    TimestampNanoType,
    TimestamptzNanoType,
)
from icefloe.table.catalog import Table
from icefloe.table.snapshot_producer import data_file_location, fast_append, row_delta
from java_iceberg import JavaIceberg

pytestmark = [pytest.mark.interop, pytest.mark.integration]

MOR = "'write.delete.mode'='merge-on-read','write.update.mode'='merge-on-read'"


def load(warehouse: Path, name: str) -> Table:
    catalog = FileSystemCatalog("java", str(warehouse), LocalFileIO())
    return asyncio.run(catalog.load_table(name))


def plan_tasks(table: Table, snapshot_id: int | None = None) -> list[Any]:
    plan = asyncio.run(plan_scan(table.metadata, ManifestCache(table.io), snapshot_id=snapshot_id))
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
    # Java's compaction: rewritten files drop their deletes (and DVs), rows keep their ids.
    java.sql(
        warehouse,
        f"CALL {{cat}}.system.rewrite_data_files(table => '{name}', "
        "options => map('min-input-files', '1', 'delete-file-threshold', '1'))",
    )
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
    from icefloe.cli.main import main

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
    *_, before_rewrite, rewritten = history.rows_at
    kinds = {
        "puffin" if is_deletion_vector(d) else d.file_format
        for task in plan_tasks(table, before_rewrite)
        for d in task.delete_files
    }
    assert kinds == ({"puffin"} if version == 3 else {"parquet"})
    current = table.metadata.current_snapshot()
    assert current is not None and current.snapshot_id == rewritten
    assert current.summary is not None and current.summary.operation == "replace"
    assert len(history.rows_at) == 7
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
    before_rewrite = list(history.rows_at)[-2]
    dvs = [d for task in plan_tasks(table, before_rewrite) for d in task.delete_files]
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
    from icefloe.spark.read_tasks import ReadJob, ScanTaskReader
    from icefloe.spark.tasks import TaskIO
    from icefloe.spec.content_file import content_file_to_json

    history = java_histories[3]
    table = load(history.warehouse, history.name)
    before_rewrite = list(history.rows_at)[-2]  # the last snapshot with Java's DVs
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
        for task in plan_tasks(table, before_rewrite):
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
    expected = history.rows_at[before_rewrite]
    got = sorted(({"id": r["id"], "s": r["s"], "d": r["d"]} for r in rows), key=lambda r: r["id"])
    assert [(r["id"], r["s"]) for r in got] == [(r["id"], r["s"]) for r in expected]
    assert [None if r["d"] is None else r["d"].isoformat() for r in got] == [
        r["d"] for r in expected
    ]


def test_spark_read_tasks_read_java_row_lineage_for_a_rewrite(
    java_histories: dict[int, JavaHistory],
) -> None:
    """What a v3 compaction reads (the task code with ``row_lineage``) is Java's lineage:
    inherited ids, and the explicit ones Java's updates wrote, before deletes drop rows."""
    from icefloe.spark.read_tasks import ReadJob, ScanTaskReader
    from icefloe.spark.tasks import TaskIO
    from icefloe.spec.content_file import content_file_to_json
    from icefloe.spec.row_lineage import LINEAGE_NAMES

    history = java_histories[3]
    table = load(history.warehouse, history.name)
    meta = table.metadata
    schema = meta.schema()
    job = ReadJob(
        table_schema_json=json.dumps(schema.to_json()),
        read_schema_json=json.dumps(schema.to_json()),
        output_names=("id", *LINEAGE_NAMES),
        specs_json=json.dumps([s.to_json() for s in meta.partition_specs]),
        table_location=meta.location,
        io_properties={},
        output_schema=pa.schema([]),
        row_lineage=True,
    )
    task_io = TaskIO(meta.location, {})
    reader = ScanTaskReader(job, task_io)
    rows: list[dict[str, Any]] = []
    specs = meta.specs()
    try:
        for task in plan_tasks(table):
            tj = {
                "data-file": content_file_to_json(
                    task.data_file, specs[task.data_file.spec_id], schema
                ),
                "delete-files": [
                    content_file_to_json(d, specs[d.spec_id], schema) for d in task.delete_files
                ],
                "data-sequence-number": task.data_sequence_number,
            }
            rows.extend(reader.read(tj).to_pylist())
            with pytest.raises(ValidationError, match="data-sequence-number"):
                reader.read({**tj, "data-sequence-number": None})
    finally:
        task_io.close()
    current = meta.current_snapshot()
    assert current is not None
    assert sorted(rows, key=lambda r: r["id"]) == history.lineage_at[current.snapshot_id]


# -- icefloe writes, Java reads ---------------------------------------------------------------

ICE_SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "s", StringType()),
    NestedField(3, "c", StringType()),
)


def _position_delete_file(table: Table, name: str, deletes: dict[str, list[int]]) -> DataFile:
    """A v2 Parquet position delete file (file_path, pos by their reserved field ids)."""
    paths = [p for p, ps in sorted(deletes.items()) for _ in ps]
    positions = [x for _, ps in sorted(deletes.items()) for x in sorted(ps)]
    arrow_schema = pa.schema(
        [
            pa.field("file_path", pa.string(), False, {b"PARQUET:field_id": b"2147483546"}),
            pa.field("pos", pa.int64(), False, {b"PARQUET:field_id": b"2147483545"}),
        ]
    )
    location = f"{table.metadata.location}/data/{name}-deletes.parquet"
    pq.write_table(pa.table([paths, positions], schema=arrow_schema), location)
    return DataFile(
        file_path=location,
        file_format="parquet",
        partition=(),
        record_count=len(positions),
        file_size_in_bytes=Path(location).stat().st_size,
        content=DataFileContent.POSITION_DELETES,
        spec_id=0,
    )


async def _icefloe_table(warehouse: Path, version: int) -> tuple[Table, dict[str, DataFile]]:
    catalog = FileSystemCatalog("ice", str(warehouse), LocalFileIO())
    if ("db",) not in await catalog.list_namespaces():
        await catalog.create_namespace("db")
    spec = PartitionSpecBuilder(ICE_SCHEMA).add_field("c", "identity").build()
    table = await catalog.create_table(
        f"db.ice_v{version}", ICE_SCHEMA, spec, format_version=version
    )
    files = {}
    for c, ids in (("a", range(0, 10)), ("b", range(10, 16))):
        path = data_file_location(table, f"c={c}", f"{c}.parquet")
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        rows = pa.table(
            {
                "id": pa.array(list(ids), pa.int64()),
                "s": [f"s{i}" for i in ids],
                "c": [c] * len(ids),
            }
        )
        files[c] = write_data_file(
            rows,
            path,
            schema=table.metadata.schema(),
            spec=table.metadata.spec(),
            partition=(c,),
            file_path=path,
        )
    table = await fast_append(table, list(files.values())).commit()
    return table, files


async def _icefloe_delete(
    table: Table, files: dict[str, DataFile], deletes: dict[str, list[int]], name: str
) -> Table:
    if table.metadata.format_version >= 3:
        pairs = [(files[c], ps) for c, ps in deletes.items()]
        return await row_delta(table, [], [], deleted_positions=pairs).commit()
    unpartitioned_deletes = []
    for c, ps in deletes.items():  # v2: one position delete file per partition
        f = _position_delete_file(table, f"{name}-{c}", {files[c].file_path: ps})
        unpartitioned_deletes.append(f.copy(partition=(c,)))
    return await row_delta(table, [], unpartitioned_deletes).commit()


@pytest.mark.parametrize("version", [2, 3])
def test_java_reads_icefloe_deletes_and_mixed_history(
    java_iceberg: JavaIceberg,
    tmp_path: Path,
    version: int,
    capsys: pytest.CaptureFixture[str],
) -> None:
    wh = tmp_path
    name = f"db.ice_v{version}"
    t = "{cat}." + name
    table, files = asyncio.run(_icefloe_table(wh, version))
    table = asyncio.run(_icefloe_delete(table, files, {"a": [1, 2], "b": [0]}, "d1"))
    table = asyncio.run(_icefloe_delete(table, files, {"a": [5]}, "d2"))
    deleted = {1, 2, 10, 5}
    expected = [i for i in range(16) if i not in deleted]
    java_rows = java_iceberg.sql(wh, f"SELECT id, s, c FROM {t} ORDER BY id")
    assert [r["id"] for r in java_rows] == expected
    assert java_rows[0] == {"id": 0, "s": "s0", "c": "a"}
    assert icefloe_rows(wh, name, capsys) == java_rows
    deletes = java_iceberg.sql(
        wh, f"SELECT file_format, record_count, partition.c AS c FROM {t}.delete_files ORDER BY c"
    )
    if version == 3:  # one DV per data file, the second delete merged into the first
        assert deletes == [
            {"file_format": "PUFFIN", "record_count": 3, "c": "a"},
            {"file_format": "PUFFIN", "record_count": 1, "c": "b"},
        ]
        lineage = java_iceberg.sql(
            wh, f"SELECT id, _row_id, _last_updated_sequence_number FROM {t} ORDER BY id"
        )
        ours = icefloe_rows(wh, name, capsys, "--row-lineage")
        assert [
            {k: r[k] for k in ("id", "_row_id", "_last_updated_sequence_number")} for r in ours
        ] == lineage
        assert [r["_row_id"] for r in lineage] == expected  # first-row-id 0, files in order
    else:
        assert {d["file_format"] for d in deletes} == {"PARQUET"}

    # Mixed history: Java deletes and updates on icefloe's deletes, icefloe deletes on Java's.
    java_iceberg.sql(
        wh,
        f"ALTER TABLE {t} SET TBLPROPERTIES ({MOR})",
    )
    java_iceberg.sql(wh, f"DELETE FROM {t} WHERE id IN (3, 11)")
    java_iceberg.sql(wh, f"UPDATE {t} SET s = 'java' WHERE id = 4")
    assert icefloe_rows(wh, name, capsys) == java_iceberg.sql(
        wh, f"SELECT id, s, c FROM {t} ORDER BY id"
    )
    table = load(wh, name)
    live_a = next(
        task.data_file
        for task in plan_tasks(table)
        if task.data_file.file_path == files["a"].file_path
    )
    table = asyncio.run(_icefloe_delete(table, {"a": live_a}, {"a": [9]}, "d3"))
    java_after = java_iceberg.sql(wh, f"SELECT id, s, c FROM {t} ORDER BY id")
    assert icefloe_rows(wh, name, capsys) == java_after
    assert 9 not in {r["id"] for r in java_after} and 3 not in {r["id"] for r in java_after}
    if version == 3:
        per_file = [task.delete_files for task in plan_tasks(load(wh, name))]
        assert all(len(ds) <= 1 for ds in per_file)
    # Java expires everything but the head; both still read the same rows.
    java_iceberg.sql(
        wh,
        f"CALL {{cat}}.system.expire_snapshots(table => '{name}', "
        "older_than => TIMESTAMP '2999-01-01 00:00:00', retain_last => 1)",
    )
    assert len(load(wh, name).metadata.snapshots) == 1
    assert icefloe_rows(wh, name, capsys) == java_after


def test_file_system_catalog_lists_java_hadoop_namespaces_and_tables(
    java_iceberg: JavaIceberg, tmp_path: Path
) -> None:
    wh = tmp_path
    java_iceberg.sql(wh, "CREATE NAMESPACE {cat}.top")
    java_iceberg.sql(wh, "CREATE NAMESPACE {cat}.top.inner")
    java_iceberg.sql(wh, "CREATE TABLE {cat}.top.inner.t (id bigint) USING iceberg")
    java_iceberg.sql(wh, "CREATE TABLE {cat}.top.u (id bigint) USING iceberg")
    catalog = FileSystemCatalog("java", str(wh), LocalFileIO())

    async def listing() -> tuple[Any, ...]:
        return (
            await catalog.list_namespaces(),
            await catalog.list_namespaces("top"),
            [str(t) for t in await catalog.list_tables("top")],
            [str(t) for t in await catalog.list_tables("top.inner")],
            await catalog.load_namespace_properties("top.inner"),
        )

    assert asyncio.run(listing()) == (
        [("top",)],
        [("top", "inner")],
        ["top.u"],
        ["top.inner.t"],
        {},
    )
    # ... and Java sees what icefloe creates there.
    asyncio.run(catalog.create_namespace("made_by_icefloe"))
    namespaces = java_iceberg.sql(wh, "SHOW NAMESPACES IN {cat}")
    assert {r["namespace"] for r in namespaces} == {"top", "made_by_icefloe"}


def test_v3_types_and_defaults_icefloe_writes_java_reads(
    java_iceberg: JavaIceberg, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """timestamp_ns / timestamptz_ns values, and initial defaults for rows written before
    the column existed, as icefloe writes them and Java reads them.

    Spark 3.5 has no nanosecond timestamp type (Iceberg's Spark 3.5 runtime refuses to
    convert ``timestamp_ns``), so Java loads that table's metadata (its snapshots table)
    while icefloe reads its rows; the defaults are read by both.
    """
    wh = tmp_path
    ns_schema = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "ts", TimestampNanoType()),
        NestedField(3, "tstz", TimestamptzNanoType()),
    )
    ns = 1_700_000_000_123_456_789

    async def write(name: str, schema: Schema, rows: pa.Table) -> Table:
        catalog = FileSystemCatalog("ice", str(wh), LocalFileIO())
        if ("db",) not in await catalog.list_namespaces():
            await catalog.create_namespace("db")
        table = await catalog.create_table(f"db.{name}", schema, format_version=3)
        path = data_file_location(table, "", f"{name}.parquet")
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        f = write_data_file(rows, path, schema=table.metadata.schema(), file_path=path)
        return await fast_append(table, [f]).commit()

    async def add_defaults(table: Table) -> Table:
        metadata = table.metadata
        new_schema, last = (
            UpdateSchema(metadata.schema(), metadata.last_column_id, metadata.format_version)
            .add_column("k", IntegerType(), initial_default=7)
            .add_column("label", StringType(), initial_default="dflt")
            .apply()
        )
        new_metadata = (
            MetadataBuilder(metadata)
            .add_schema(new_schema, last)
            .set_current_schema(-1)
            .build(table.metadata_location)
        )
        return await table.catalog.commit(table, new_metadata)

    ids = pa.array([1, 2], pa.int64())
    asyncio.run(
        write(
            "ns",
            ns_schema,
            pa.table(
                {
                    "id": ids,
                    "ts": pa.array([ns, None], pa.timestamp("ns")),
                    "tstz": pa.array([ns + 1, ns + 2], pa.timestamp("ns", tz="UTC")),
                }
            ),
        )
    )
    defaults = asyncio.run(
        write(
            "defaults",
            Schema(NestedField(1, "id", LongType(), required=True)),
            pa.table({"id": ids}),
        )
    )
    asyncio.run(add_defaults(defaults))

    assert java_iceberg.sql(wh, "SELECT count(*) AS n FROM {cat}.db.ns.snapshots") == [{"n": 1}]
    ours = icefloe_rows(wh, "db.ns", capsys)
    assert ours[0]["ts"].startswith("2023-11-14") and ours[0]["ts"].endswith("123456789")
    assert ours[1]["ts"] is None
    assert ours[1]["tstz"].endswith("123456791+00:00")

    got = java_iceberg.sql(wh, "SELECT id, k, label FROM {cat}.db.defaults ORDER BY id")
    assert got == [{"id": 1, "k": 7, "label": "dflt"}, {"id": 2, "k": 7, "label": "dflt"}]
    assert icefloe_rows(wh, "db.defaults", capsys) == got
