"""Compaction on Spark end to end: real Spark, tansu, the coordinator and a redis catalog.

Rows are compared before and after by reading the table back through the scan planner and
by decoding every live file with the core's Parquet reader; files are checked in the
metadata (none lost, none twice) and in storage (nothing of a failed attempt left behind).
"""

from __future__ import annotations

import json
import shutil
import threading
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession
from task_faults import fault

import icefloe.spark as ispark
from icefloe.arrow.schema import FIELD_ID_KEY
from icefloe.cli.scan import task_rows
from icefloe.expressions import EqualTo
from icefloe.manifests.cache import ManifestCache
from icefloe.parquet.files import ParquetFileWriter
from icefloe.scan.planning import plan_scan
from icefloe.spark.compaction import (
    COMPACTION_JOB_PROPERTY,
    CompactionConflictError,
    commit_compaction,
    stage_compaction,
)
from icefloe.spec.datafile import DataFile, DataFileContent
from icefloe.spec.partition import PartitionSpecBuilder
from icefloe.spec.schema import Schema
from icefloe.spec.sort_order import SortOrderBuilder
from icefloe.spec.types import DoubleType, LongType, NestedField, StringType
from icefloe.table.snapshot_producer import row_delta
from java_iceberg import JavaIceberg

pytestmark = pytest.mark.integration

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "cat", StringType()),
    NestedField(3, "v", DoubleType()),
)
SPARK_SCHEMA = "id long, cat string, v double"
TARGET = 1 << 20


def _rows(start: int, n: int) -> list[tuple[int, str | None, float]]:
    cats = ["a", "b", None]
    return [(i, cats[i % 3], float(i) / 7) for i in range(start, start + n)]


def _append(spark: SparkSession, stack: Any, name: str, start: int, n: int) -> int | None:
    df = spark.createDataFrame(_rows(start, n), SPARK_SCHEMA)
    return ispark.write(df, name, config=stack.config)


def _ids(spark: SparkSession, stack: Any, name: str) -> Counter[int]:
    return Counter(r.id for r in ispark.read(spark, name, config=stack.config).collect())


def _table(stack: Any, partitioned: bool = True, **props: str) -> str:
    spec = (
        PartitionSpecBuilder(SCHEMA).add_field("cat", "identity").build() if partitioned else None
    )
    properties = {"write.target-file-size-bytes": str(TARGET), **props}
    return stack.create_table(SCHEMA, spec, properties)


def _compaction_snapshots(stack: Any, name: str) -> list[Any]:
    return [
        s
        for s in stack.load(name).metadata.snapshots
        if s.summary is not None and COMPACTION_JOB_PROPERTY in s.summary.properties
    ]


def test_compaction_while_a_stream_of_appends_continues(
    spark: SparkSession, spark_stack: Any
) -> None:
    name = _table(spark_stack)
    for k in range(8):
        _append(spark, spark_stack, name, k * 30, 30)
    before_files = spark_stack.live_files(name)
    assert len(before_files) >= 8 * 3  # each append writes a file per category (or more)

    # appends keep landing while the compaction runs
    stop = threading.Event()
    errors: list[BaseException] = []
    appended: list[int] = []
    first = threading.Event()

    def stream() -> None:
        k = 100
        try:
            while not stop.is_set() or len(appended) < 2:
                _append(spark, spark_stack, name, k * 30, 30)
                appended.append(k)
                first.set()
                k += 1
        except BaseException as e:  # reported below
            errors.append(e)
            first.set()

    appender = threading.Thread(target=stream, name="appender")
    appender.start()
    first.wait()
    try:
        result = ispark.compact(
            spark, name, options={"min_input_files": 2}, config=spark_stack.config
        )
    finally:
        stop.set()
        appender.join()
    assert not errors, errors

    expected = Counter(i for k in [*range(8), *appended] for i in range(k * 30, k * 30 + 30))
    assert _ids(spark, spark_stack, name) == expected  # every row once: none lost, none doubled
    live = spark_stack.live_files(name)
    paths = [f.file_path for f in live]
    assert len(paths) == len(set(paths))
    planned = _live_at(spark_stack, name, result.planned_snapshot_id)
    assert len(planned) >= len(before_files)  # the stream's first appends may be in the plan
    (compaction,) = _compaction_snapshots(spark_stack, name)
    # every file planned was rewritten; the compacted ones are one per category
    assert result.rewritten_data_files == len(planned)
    assert not {f.file_path for f in planned} & set(paths)
    compacted = [f for f in live if result_job(compaction) in f.file_path]
    assert len(compacted) == 3 == result.added_data_files
    assert sum(f.record_count for f in compacted) == sum(f.record_count for f in planned)
    assert result.rows == sum(f.record_count for f in planned)
    # the stream went on: appends committed on both sides of the compaction
    seqs = sorted(
        s.sequence_number
        for s in spark_stack.load(name).metadata.snapshots
        if s.snapshot_id != compaction.snapshot_id
    )
    assert seqs[-1] > compaction.sequence_number
    # nothing of the job is left in storage but its committed files
    stored = {p for p in spark_stack.stored_files(name) if result_job(compaction) in p}
    assert stored == {f.file_path for f in compacted}

    # a second run finds nothing worth rewriting among files of the target shape
    again = ispark.compact(spark, name, options={"min_input_files": 50}, config=spark_stack.config)
    assert again.committed == []


def _live_at(stack: Any, name: str, snapshot_id: int | None) -> list[DataFile]:
    from icefloe.manifests.reader import ManifestReader

    async def files() -> list[DataFile]:
        table = await stack.catalog.load_table(name)
        snapshot = table.metadata.snapshot_by_id(snapshot_id)
        assert snapshot is not None
        reader = ManifestReader(table.io)
        out = []
        for manifest in await reader.manifests(snapshot):
            entries = await reader.entries(manifest, table.metadata.specs(), live_only=True)
            out.extend(e.data_file for e in entries)
        return out

    return list(stack.run(files()))


def result_job(snapshot: Any) -> str:
    return str(snapshot.summary.properties[COMPACTION_JOB_PROPERTY])


def _write_position_deletes(path: Path, data_path: str, positions: list[int]) -> int:
    table = pa.table(
        {
            "file_path": pa.array([data_path] * len(positions), pa.string()),
            "pos": pa.array(positions, pa.int64()),
        },
        schema=pa.schema(
            [
                pa.field("file_path", pa.string(), False, {FIELD_ID_KEY: b"2147483546"}),
                pa.field("pos", pa.int64(), False, {FIELD_ID_KEY: b"2147483545"}),
            ]
        ),
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return path.stat().st_size


def _position_delete(stack: Any, name: str, data_file: DataFile, positions: list[int]) -> DataFile:
    table = stack.load(name)
    location = f"{table.metadata.location}/data/pos-{uuid.uuid4().hex}.parquet"
    size = _write_position_deletes(
        Path(location.removeprefix("file://")), data_file.file_path, positions
    )
    return DataFile(
        location,
        "parquet",
        data_file.partition,
        len(positions),
        size,
        content=DataFileContent.POSITION_DELETES,
        spec_id=data_file.spec_id,
        referenced_data_file=data_file.file_path,
    )


def _commit_deletes(stack: Any, name: str, deletes: list[DataFile]) -> None:
    async def commit() -> None:
        current = await stack.catalog.load_table(name)
        await row_delta(current, [], deletes).commit()

    stack.run(commit())


def _ids_in(data_file: DataFile) -> list[int]:
    from icefloe.parquet.files import read_data_file

    return list(read_data_file(data_file.file_path, SCHEMA).column("id").to_pylist())


def test_a_concurrent_row_delta_fails_the_compaction_cleanly_and_a_retry_succeeds(
    spark: SparkSession, spark_stack: Any
) -> None:
    name = _table(spark_stack, partitioned=False)
    for k in range(4):
        _append(spark, spark_stack, name, k * 10, 10)
    files = spark_stack.live_files(name)
    staged = stage_compaction(
        spark, name, options={"min_input_files": 2}, config=spark_stack.config
    )
    assert staged.paths and all(Path(p.removeprefix("file://")).exists() for p in staged.paths)

    # while the compaction was running, a row delta deleted rows of a file it rewrites
    victim = files[0]
    doomed = _ids_in(victim)[:3]
    _commit_deletes(spark_stack, name, [_position_delete(spark_stack, name, victim, [0, 1, 2])])
    head_before = spark_stack.load(name).metadata.current_snapshot_id

    with pytest.raises(CompactionConflictError, match="applies to") as failure:
        commit_compaction(staged)
    assert failure.value.result.committed == []
    # nothing committed, nothing left behind: the job's files are gone from storage
    assert spark_stack.load(name).metadata.current_snapshot_id == head_before
    assert not {p for p in spark_stack.stored_files(name) if staged.job_id in p}
    after = Counter(i for k in range(4) for i in range(k * 10, k * 10 + 10)) - Counter(doomed)
    assert _ids(spark, spark_stack, name) == after

    # a retry plans on the new state: the delete is applied and then dropped with its file
    result = ispark.compact(spark, name, options={"min_input_files": 2}, config=spark_stack.config)
    assert result.rewritten_delete_files == 1 and result.added_data_files == 1
    assert _ids(spark, spark_stack, name) == after
    live = spark_stack.live_files(name)
    assert [f.content for f in live] == [DataFileContent.DATA]
    assert live[0].record_count == sum(after.values())


def test_an_overwrite_of_a_rewritten_file_fails_the_compaction(
    spark: SparkSession, spark_stack: Any
) -> None:
    name = _table(spark_stack)
    for k in range(3):
        _append(spark, spark_stack, name, k * 9, 9)
    staged = stage_compaction(
        spark, name, options={"min_input_files": 2}, config=spark_stack.config
    )
    ispark.write(
        spark.createDataFrame([(1000, "a", 0.0)], SPARK_SCHEMA),
        name,
        mode="overwrite",
        overwrite_filter=EqualTo("cat", "a"),
        config=spark_stack.config,
    )
    with pytest.raises(CompactionConflictError) as failure:
        commit_compaction(staged, max_files_per_commit=1)
    # the chunks of the untouched categories committed; the "a" one did not
    assert len(failure.value.result.committed) >= 1 and len(failure.value.result.failed) >= 1
    kept = {p for p in spark_stack.stored_files(name) if staged.job_id in p}
    assert kept == {
        f.file_path for f in spark_stack.live_files(name) if staged.job_id in f.file_path
    }
    expected = Counter(i for i in range(27) if i % 3 != 0) + Counter([1000])
    assert _ids(spark, spark_stack, name) == expected


def test_compaction_applies_equality_deletes_and_sorts(
    spark: SparkSession, spark_stack: Any
) -> None:
    name = _table(spark_stack, partitioned=False)
    for k in range(3):
        _append(spark, spark_stack, name, k * 20, 20)
    table = spark_stack.load(name)
    equality_path = f"{table.metadata.location}/data/eq-{uuid.uuid4().hex}.parquet"
    writer = ParquetFileWriter(equality_path, schema=SCHEMA.select(["cat"]))
    writer.write(pa.table({"cat": pa.array(["b", None], pa.large_string())}))
    eq = writer.close().copy(content=DataFileContent.EQUALITY_DELETES, equality_ids=[2])
    _commit_deletes(spark_stack, name, [eq])
    # a row written after the delete is not deleted by it
    spark_stack.run(_set_sort_order(spark_stack, name))
    _append(spark, spark_stack, name, 1000, 2)
    expected = _ids(spark, spark_stack, name)
    assert 1001 in expected and 1 not in expected

    result = ispark.compact(
        spark, name, sort=True, options={"rewrite_all": True}, config=spark_stack.config
    )
    assert result.rewritten_delete_files == 1
    assert _ids(spark, spark_stack, name) == expected
    (only,) = spark_stack.live_files(name)
    ids = _ids_in(only)
    assert ids == sorted(ids, reverse=True)
    # an independent reader agrees
    from pyiceberg.table import StaticTable

    table = spark_stack.load(name)
    scanned = StaticTable.from_metadata(table.metadata_location).scan().to_arrow()
    assert Counter(scanned.column("id").to_pylist()) == expected


def test_a_failed_task_attempt_leaves_nothing_behind(spark: SparkSession, spark_stack: Any) -> None:
    name = _table(spark_stack)
    for k in range(3):
        _append(spark, spark_stack, name, k * 9, 9)
    with fault(spark, "crash:1"):
        staged = stage_compaction(
            spark, name, options={"min_input_files": 2}, config=spark_stack.config
        )
    assert staged.needs_listing
    stored = {p for p in spark_stack.stored_files(name) if staged.job_id in p}
    assert stored > staged.paths  # the dead attempt's files are still there
    result = commit_compaction(staged)
    assert result.added_data_files == 3
    stored = {p for p in spark_stack.stored_files(name) if staged.job_id in p}
    assert (
        stored
        == staged.paths
        == {f.file_path for f in spark_stack.live_files(name) if staged.job_id in f.file_path}
    )
    assert _ids(spark, spark_stack, name) == Counter(range(27))


async def _set_sort_order(stack: Any, name: str) -> None:
    from icefloe.spec.metadata_builder import MetadataBuilder
    from icefloe.table.commit import commit_with_retry

    table = await stack.catalog.load_table(name)
    order = SortOrderBuilder(table.metadata.schema(), order_id=1).desc("id").build()

    async def build(base: Any) -> Any:
        return (
            MetadataBuilder(base.metadata)
            .add_sort_order(order)
            .set_default_sort_order(-1)
            .build(base.metadata_location)
        )

    await commit_with_retry(
        stack.catalog, table, build, lambda t: t.metadata.default_sort_order_id != 0
    )


def _lineage(stack: Any, name: str) -> dict[int, tuple[int, int]]:
    """id -> (_row_id, _last_updated_sequence_number), through icefloe's row-lineage read."""

    async def read() -> list[dict[str, Any]]:
        table = await stack.catalog.load_table(name)
        plan = await plan_scan(table.metadata, ManifestCache(table.io))
        rows: list[dict[str, Any]] = []
        for task in plan.tasks():
            rows.extend(await task_rows(table.io, plan, task, row_lineage=True))
        return rows

    rows = stack.run(read())
    out = {r["id"]: (r["_row_id"], r["_last_updated_sequence_number"]) for r in rows}
    assert len(out) == len(rows)  # ids are unique in these tables
    return out


def _compacted_v3_table(
    spark: SparkSession, stack: Any
) -> tuple[str, dict[int, tuple[int, int]], Any]:
    """A partitioned v3 table with DVs on two files, compacted; returns its name, the
    lineage read before compaction and the compaction's result."""
    name = stack.create_table(
        SCHEMA,
        PartitionSpecBuilder(SCHEMA).add_field("cat", "identity").build(),
        {"write.target-file-size-bytes": str(TARGET)},
        format_version=3,
    )
    for k in range(3):
        _append(spark, stack, name, k * 12, 12)
    files = sorted(stack.live_files(name), key=lambda f: f.file_path)
    victims = files[:2]
    doomed = set(_ids_in(victims[0])[:2]) | {_ids_in(victims[1])[1]}

    async def delete() -> None:
        current = await stack.catalog.load_table(name)
        await row_delta(
            current, [], [], deleted_positions=[(victims[0], [0, 1]), (victims[1], [1])]
        ).commit()

    stack.run(delete())
    assert sum(f.content != DataFileContent.DATA for f in stack.live_files(name)) == 2
    before = _lineage(stack, name)
    assert set(before) == set(range(36)) - doomed
    assert all(r is not None and s is not None for r, s in before.values())

    result = ispark.compact(spark, name, options={"min_input_files": 2}, config=stack.config)
    assert result.rewritten_data_files == len(files) and result.rewritten_delete_files == 0
    return name, before, result


def test_v3_compaction_applies_dvs_and_keeps_every_rows_lineage(
    spark: SparkSession, spark_stack: Any
) -> None:
    name, before, _ = _compacted_v3_table(spark, spark_stack)

    # same rows, same ids and sequence numbers: lineage survived the rewrite
    assert _lineage(spark_stack, name) == before
    live = spark_stack.live_files(name)
    assert all(f.content == DataFileContent.DATA for f in live)  # DVs dropped with their files
    job = result_job(_compaction_snapshots(spark_stack, name)[0])
    assert all(job in f.file_path for f in live)
    for f in live:  # written explicitly, under their reserved field ids, never null
        data = pq.read_table(f.file_path.removeprefix("file://"))
        for column, field_id in (
            ("_row_id", b"2147483540"),
            ("_last_updated_sequence_number", b"2147483539"),
        ):
            field = data.schema.field(column)
            assert field.metadata is not None and field.metadata[FIELD_ID_KEY] == field_id
            assert data.column(column).null_count == 0

    # rows appended later get fresh ids, never one a compacted row holds
    _append(spark, spark_stack, name, 100, 5)
    after = _lineage(spark_stack, name)
    row_ids = [r for r, _ in after.values()]
    assert len(set(row_ids)) == len(row_ids) == len(before) + 5
    assert _ids(spark, spark_stack, name) == Counter(list(before)) + Counter(range(100, 105))


def test_a_concurrent_dv_on_a_rewritten_file_fails_a_v3_compaction_cleanly(
    spark: SparkSession, spark_stack: Any
) -> None:
    name = spark_stack.create_table(
        SCHEMA, None, {"write.target-file-size-bytes": str(TARGET)}, format_version=3
    )
    for k in range(3):
        _append(spark, spark_stack, name, k * 10, 10)
    staged = stage_compaction(
        spark, name, options={"min_input_files": 2}, config=spark_stack.config
    )
    victim = sorted(spark_stack.live_files(name), key=lambda f: f.file_path)[0]
    doomed = _ids_in(victim)[:2]

    async def delete() -> None:
        current = await spark_stack.catalog.load_table(name)
        await row_delta(current, [], [], deleted_positions=[(victim, [0, 1])]).commit()

    spark_stack.run(delete())
    before = _lineage(spark_stack, name)
    with pytest.raises(CompactionConflictError, match="applies to"):
        commit_compaction(staged)
    assert not {p for p in spark_stack.stored_files(name) if staged.job_id in p}
    assert _lineage(spark_stack, name) == before
    # a retry applies the DV and keeps every row's id
    ispark.compact(spark, name, options={"min_input_files": 2}, config=spark_stack.config)
    assert _lineage(spark_stack, name) == before
    assert set(before) == set(range(30)) - set(doomed)
    assert [f.content for f in spark_stack.live_files(name)] == [DataFileContent.DATA]


def test_a_sorted_v3_compaction_moves_each_rows_id_with_the_row(
    spark: SparkSession, spark_stack: Any
) -> None:
    name = spark_stack.create_table(
        SCHEMA, None, {"write.target-file-size-bytes": str(TARGET)}, format_version=3
    )
    for k in range(3):
        _append(spark, spark_stack, name, k * 10, 10)
    victim = sorted(spark_stack.live_files(name), key=lambda f: f.file_path)[1]

    async def delete() -> None:
        current = await spark_stack.catalog.load_table(name)
        await row_delta(current, [], [], deleted_positions=[(victim, [3])]).commit()

    spark_stack.run(delete())
    spark_stack.run(_set_sort_order(spark_stack, name))
    before = _lineage(spark_stack, name)
    ispark.compact(spark, name, sort=True, options={"rewrite_all": True}, config=spark_stack.config)
    (only,) = spark_stack.live_files(name)
    ids = _ids_in(only)
    assert ids == sorted(ids, reverse=True) and len(ids) == 29  # rows moved: ids follow them
    assert _lineage(spark_stack, name) == before


@pytest.mark.interop
def test_java_reads_a_compacted_v3_table_with_the_same_rows_and_row_ids(
    spark: SparkSession, spark_stack: Any, java_iceberg: JavaIceberg, tmp_path: Path
) -> None:
    name, before, _ = _compacted_v3_table(spark, spark_stack)
    # Java opens it through a HadoopCatalog: the current metadata as v1 of db.t (every path
    # in it is absolute, so the data stays where the compaction wrote it)
    metadata = spark_stack.load(name).metadata_location
    folder = tmp_path / "db" / "t" / "metadata"
    folder.mkdir(parents=True)
    shutil.copy(metadata.removeprefix("file://"), folder / "v1.metadata.json")
    (folder / "version-hint.text").write_text("1")

    rows = java_iceberg.sql(
        tmp_path,
        "SELECT id, cat, v, _row_id, _last_updated_sequence_number FROM {cat}.db.t ORDER BY id",
    )
    assert {r["id"]: (r["_row_id"], r["_last_updated_sequence_number"]) for r in rows} == before
    ours = sorted(
        (r.id, r.cat, r.v) for r in ispark.read(spark, name, config=spark_stack.config).collect()
    )
    assert [(r["id"], r["cat"], r["v"]) for r in rows] == ours


def test_the_cli_compacts_and_reports_health(
    spark: SparkSession,
    spark_stack: Any,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from icefloe.cli.main import main

    name = _table(spark_stack)
    for k in range(3):
        _append(spark, spark_stack, name, k * 9, 9)
    config = spark_stack.config
    for key, value in (
        ("BROKERS", config.brokers),
        ("EVENTS_TOPIC", config.events_topic),
        ("RESULTS_TOPIC", config.results_topic),
        ("DEAD_LETTER_TOPIC", config.dead_letter_topic),
    ):
        monkeypatch.setenv(f"ICEFLOE_{key}", value)
    uri = spark_stack.catalog_uri

    assert main(["table", "health", name, "--catalog", uri, "--min-retain-ms", "0"]) == 0
    before = json.loads(capsys.readouterr().out)
    assert before["health"]["data_files"] == len(spark_stack.live_files(name))
    assert before["health"]["small_file_ratio"] == 1.0
    assert "compact" in {a["action"] for a in before["next"]}

    code = main(["table", "compact", name, "--catalog", uri, "-o", "min_input_files=2"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads(out)["added_data_files"] == 3

    assert main(["table", "health", name, "--catalog", uri]) == 0
    after = json.loads(capsys.readouterr().out)
    assert after["health"]["data_files"] == 3
    assert "compact" not in {a["action"] for a in after["next"]}
    assert _ids(spark, spark_stack, name) == Counter(range(27))

    # bad input is named, not a traceback
    assert main(["table", "compact", name, "--catalog", uri, "-o", "min_input_files"]) == 1
    assert "name=value" in capsys.readouterr().err
    assert main(["table", "compact", name, "--catalog", uri, "-o", "bogus=1"]) == 1
    assert "unknown compaction option" in capsys.readouterr().err


def test_rows_sort_by_the_sort_order_with_nulls_where_it_says() -> None:
    from icefloe.spark.compaction import sort_rows

    rows = pa.table(
        {
            "id": pa.array([3, 1, 2, 4, 5], pa.int64()),
            "cat": pa.array(["b", None, "a", "b", None], pa.large_string()),
            "v": pa.array([0.5, 0.1, None, 0.2, 0.3], pa.float64()),
        }
    )
    first = SortOrderBuilder(SCHEMA).asc("cat", null_order="nulls-first").desc("id").build()
    assert sort_rows(rows, SCHEMA, first).column("id").to_pylist() == [5, 1, 2, 4, 3]
    last = SortOrderBuilder(SCHEMA).desc("cat", null_order="nulls-last").asc("id").build()
    assert sort_rows(rows, SCHEMA, last).column("id").to_pylist() == [3, 4, 2, 1, 5]
    by_bucket = SortOrderBuilder(SCHEMA).asc("id", "truncate[2]").asc("v").build()
    assert sort_rows(rows, SCHEMA, by_bucket).column("id").to_pylist() == [1, 2, 3, 4, 5]
