"""icefloe's Spark writer end to end: Spark jobs write Parquet, the coordinator commits.

Each test creates its own tables in the session's catalog; the Spark session, coordinator
and planner are shared (``conftest.py``). Written data is checked three ways: read back
through :func:`icefloe.spark.read`, decoded file by file with the core's Parquet reader, and
(for the type round trip) read by PyIceberg, an independent implementation.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import random
import shutil
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from task_faults import FirstAttemptFails, InjectedFault, fault

import icefloe.spark as ispark
from hypothesis_budget import examples
from icefloe.errors import ValidationError
from icefloe.expressions import EqualTo
from icefloe.parquet.files import read_data_file
from icefloe.spark.config import SparkConfig
from icefloe.spark.tasks import TaskInfo, install_task_hooks
from icefloe.spark.write_tasks import (
    WRITE_RESULT_ARROW,
    WriteJob,
    is_job_file,
    job_file_name,
    prepare_input,
    write_task,
)
from icefloe.spec.partition import PartitionSpec, PartitionSpecBuilder
from icefloe.spec.schema import Schema
from icefloe.spec.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestampNanoType,
    TimestampType,
    TimestamptzNanoType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

UTC = dt.UTC
EPOCH = dt.datetime(1970, 1, 1, tzinfo=UTC)


def canonical(df: DataFrame) -> list[str]:
    """Rows as sorted JSON text (Spark's own rendering), for order-free comparison."""
    rendered = df.select(F.to_json(F.struct(*[F.col(c) for c in df.columns])).alias("j"))
    return sorted(r.j for r in rendered.collect())


# -- inside a task (no Spark) ---------------------------------------------------------------------

TASK_SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "u", UUIDType()),
    NestedField(3, "fx", FixedType(2)),
    NestedField(4, "tod", TimeType()),
)


def _job(tmp_path: Path, **properties: str) -> WriteJob:
    location = f"file://{tmp_path}/table"
    return WriteJob(
        job_id="job1",
        table_location=location,
        data_dir=f"{location}/data",
        schema_json=json.dumps(TASK_SCHEMA.to_json()),
        spec_json=json.dumps(PartitionSpec.unpartitioned().to_json()),
        properties=properties,
        io_properties={},
    )


def _batch(ids: list[int | None]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {
            "id": pa.array(ids, pa.int64()),
            "u": pa.array([str(uuid.UUID(int=i or 0)) for i in ids], pa.string()),
            "fx": pa.array([b"ab"] * len(ids), pa.binary()),
            "tod": pa.array([1_000_000] * len(ids), pa.int64()),
        }
    )


def test_a_task_returns_one_row_per_file_it_wrote(tmp_path: Path) -> None:
    info = TaskInfo(partition_id=3, attempt_number=1, task_attempt_id=77, stage_id=5)
    out = pa.Table.from_batches(
        list(write_task(_job(tmp_path), [_batch([1, 2]), _batch([3])], info))
    )
    assert out.schema == WRITE_RESULT_ARROW
    assert out.column("task_attempt_id").to_pylist() == [77]
    (written,) = [json.loads(text) for text in out.column("file").to_pylist()]
    assert written["record-count"] == 3
    assert written["file-path"].endswith(f"/data/{job_file_name('job1', 3, 77, 1)}")
    stored = read_data_file(written["file-path"], TASK_SCHEMA).to_pylist()
    assert stored[2] == {"id": 3, "u": uuid.UUID(int=3), "fx": b"ab", "tod": dt.time(0, 0, 1)}


def test_a_task_that_fails_deletes_the_files_it_wrote(tmp_path: Path) -> None:
    job = _job(tmp_path, **{"write.target-file-size-bytes": "1"})  # a file per row group
    with pytest.raises(ValidationError, match="'id' is required"):
        list(write_task(job, [_batch([1, 2]), _batch([None])], TaskInfo()))
    assert not list(tmp_path.rglob("*.parquet"))


def test_a_task_that_fails_once_its_files_are_complete_leaves_them_behind(
    tmp_path: Path,
) -> None:
    previous = install_task_hooks(FirstAttemptFails("raise:0"))
    try:
        with pytest.raises(InjectedFault, match="fault injected"):
            list(write_task(_job(tmp_path), [_batch([1])], TaskInfo(partition_id=0)))
        assert len(list(tmp_path.rglob("*.parquet"))) == 1
        # Only the first attempt of the named partition fails.
        retried = TaskInfo(partition_id=0, attempt_number=1)
        assert len(list(write_task(_job(tmp_path), [_batch([1])], retried))) == 1
    finally:
        install_task_hooks(previous)


def test_spark_stand_ins_are_checked_before_conversion() -> None:
    def table(**columns: pa.Array) -> pa.Table:
        return pa.table(columns)

    with pytest.raises(ValidationError, match=r"'u'.*not a UUID"):
        prepare_input(table(u=pa.array(["nope"])), TASK_SCHEMA)
    with pytest.raises(ValidationError, match=r"'fx'.*fixed\[2\].*3 bytes"):
        prepare_input(table(fx=pa.array([b"abc"])), TASK_SCHEMA)
    with pytest.raises(ValidationError, match=r"'tod'.*outside"):
        prepare_input(table(tod=pa.array([86_400_000_000], pa.int64())), TASK_SCHEMA)
    converted = prepare_input(table(u=pa.array([uuid.UUID(int=5).bytes])), TASK_SCHEMA)
    assert converted.column("u").type == pa.uuid()


# -- every type ---------------------------------------------------------------------------------

ALL_TYPES = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "b", BooleanType()),
    NestedField(3, "i", IntegerType()),
    NestedField(4, "f", FloatType()),
    NestedField(5, "d", DoubleType()),
    NestedField(6, "dec", DecimalType(9, 2)),
    NestedField(7, "wide", DecimalType(38, 10)),
    NestedField(8, "day", DateType()),
    NestedField(9, "tod", TimeType()),
    NestedField(10, "ts", TimestampType()),
    NestedField(11, "tstz", TimestamptzType()),
    NestedField(12, "s", StringType()),
    NestedField(13, "u", UUIDType()),
    NestedField(14, "fx", FixedType(4)),
    NestedField(15, "bin", BinaryType()),
    NestedField(
        16,
        "st",
        StructType(NestedField(17, "a", IntegerType()), NestedField(18, "z", StringType())),
    ),
    NestedField(19, "li", ListType(20, LongType(), element_required=False)),
    NestedField(21, "m", MapType(22, StringType(), 23, DoubleType(), value_required=False)),
    NestedField(
        24,
        "ls",
        ListType(25, StructType(NestedField(26, "x", IntegerType())), element_required=False),
    ),
)
ALL_TYPES_SPARK = (
    "id long, b boolean, i int, f float, d double, dec decimal(9,2), wide decimal(38,10), "
    "day date, tod long, ts timestamp_ntz, tstz timestamp, s string, u string, fx binary, "
    "bin binary, st struct<a:int,z:string>, li array<long>, m map<string,double>, "
    "ls array<struct<x:int>>"
)

_timestamps = hs.datetimes(min_value=dt.datetime(1900, 1, 1), max_value=dt.datetime(2200, 1, 1))


_ROW = hs.tuples(
    hs.none() | hs.booleans(),
    hs.none() | hs.integers(-(2**31), 2**31 - 1),
    hs.none() | hs.floats(width=32, allow_nan=False),
    hs.none() | hs.floats(allow_nan=False),
    hs.none() | hs.decimals(-(10**6), 10**6, places=2, allow_nan=False, allow_infinity=False),
    hs.none() | hs.decimals(-(10**20), 10**20, places=10, allow_nan=False, allow_infinity=False),
    hs.none() | hs.dates(dt.date(1900, 1, 1), dt.date(2200, 1, 1)),
    hs.none() | hs.integers(0, 86_400_000_000 - 1),
    hs.none() | _timestamps,
    hs.none() | _timestamps.map(lambda t: t.replace(tzinfo=UTC)),
    hs.none() | hs.text(max_size=40),
    hs.none() | hs.uuids().map(str),
    hs.none() | hs.binary(min_size=4, max_size=4),
    hs.none() | hs.binary(max_size=30),
    hs.none() | hs.tuples(hs.none() | hs.integers(-5, 5), hs.none() | hs.text(max_size=5)),
    hs.none() | hs.lists(hs.none() | hs.integers(-(2**63), 2**63 - 1), max_size=4),
    hs.none()
    | hs.dictionaries(hs.text(max_size=4), hs.none() | hs.floats(allow_nan=False), max_size=3),
    hs.none() | hs.lists(hs.none() | hs.tuples(hs.integers(-9, 9)), max_size=3),
)


@pytest.mark.integration
# The stack's Kafka consumers shuffle with the global `random` in their threads while
# examples are drawn; hypothesis warns about any such use, though generation is unaffected.
@pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisDeprecationWarning")
@settings(
    max_examples=examples(3),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(values=hs.lists(_ROW, min_size=1, max_size=12))
def test_every_type_round_trips(spark: SparkSession, spark_stack: Any, values: list[Any]) -> None:
    rows = [(n, *v) for n, v in enumerate(values)]
    name = spark_stack.create_table(ALL_TYPES)
    df = spark.createDataFrame(rows, ALL_TYPES_SPARK)
    snapshot_id = ispark.write(df, name, config=spark_stack.config)
    assert snapshot_id == spark_stack.load(name).metadata.current_snapshot_id
    back = ispark.read(spark, name, config=spark_stack.config)
    assert back.schema.simpleString() == df.schema.simpleString()
    assert canonical(back) == canonical(df)


@pytest.mark.integration
def test_stored_types_follow_the_iceberg_mapping(spark: SparkSession, spark_stack: Any) -> None:
    """The files hold Iceberg's types (uuid, fixed, time in micros, UTC timestamps), which
    the core reader and PyIceberg both decode to the values Spark was given."""
    u = uuid.UUID("12345678-1234-5678-1234-567812345678")
    when = dt.datetime(2024, 2, 29, 13, 14, 15, 123456)
    rows = [
        (
            1,
            True,
            7,
            1.5,
            2.25,
            decimal.Decimal("1234567.89"),
            decimal.Decimal("-12345678901234567890.0123456789"),
            dt.date(2024, 2, 29),
            3_723_000_001,
            when,
            when.replace(tzinfo=UTC),
            "héllo",
            str(u),
            b"\x00\x01\x02\x03",
            b"\xff",
            (1, "a"),
            [1, None, 3],
            {"k": 1.0},
            [(4,)],
        ),
        (2, *([None] * 18)),
    ]
    name = spark_stack.create_table(ALL_TYPES)
    ispark.write(spark.createDataFrame(rows, ALL_TYPES_SPARK), name, config=spark_stack.config)
    table = spark_stack.load(name)
    schema = table.metadata.schema()
    files = spark_stack.live_files(name)
    stored = [r for f in files for r in read_data_file(f.file_path, schema).to_pylist()]
    first = next(r for r in stored if r["id"] == 1)
    micros = int((when.replace(tzinfo=UTC) - EPOCH).total_seconds()) * 1_000_000 + 123456
    assert first["u"] == u
    assert first["fx"] == b"\x00\x01\x02\x03"
    assert first["tod"] == dt.time(1, 2, 3, 1)
    assert first["ts"] == when
    assert first["tstz"] == when.replace(tzinfo=UTC)
    assert first["dec"] == decimal.Decimal("1234567.89")
    assert first["li"] == [1, None, 3]
    assert first["m"] == [("k", 1.0)]
    assert first["st"] == {"a": 1, "z": "a"}
    for data_file in files:
        # Metrics come from the footer: counts for every column, bounds where meaningful.
        assert data_file.value_counts is not None
        assert data_file.value_counts[schema.find_field_id("id")] == data_file.record_count
        assert data_file.split_offsets
    holder = next(f for f in files if 1 in _ids(f.file_path, schema))
    assert holder.lower_bounds is not None and holder.upper_bounds is not None
    assert holder.lower_bounds[schema.find_field_id("u")] == u.bytes
    assert holder.upper_bounds[schema.find_field_id("tstz")] == micros.to_bytes(8, "little")
    assert schema.find_field_id("li.element") not in holder.lower_bounds  # inside a list
    from pyiceberg.table import StaticTable

    scanned = StaticTable.from_metadata(table.metadata_location).scan().to_arrow().to_pylist()
    by_id = {r["id"]: r for r in scanned}
    assert set(by_id) == {1, 2}
    assert by_id[1]["tstz"] == when.replace(tzinfo=UTC)
    assert by_id[1]["ts"] == when
    assert by_id[1]["tod"] == dt.time(1, 2, 3, 1)
    assert by_id[1]["dec"] == decimal.Decimal("1234567.89")
    assert by_id[1]["wide"] == decimal.Decimal("-12345678901234567890.0123456789")
    assert by_id[1]["s"] == "héllo"
    assert by_id[1]["u"] == u
    assert by_id[1]["fx"] == b"\x00\x01\x02\x03"
    assert by_id[1]["ls"] == [{"x": 4}]
    assert by_id[2]["s"] is None and by_id[2]["st"] is None


def _ids(path: str, schema: Schema) -> set[int]:
    return set(read_data_file(path, schema.select(["id"])).column("id").to_pylist())


@pytest.mark.integration
def test_nanosecond_timestamps_round_trip_as_longs(spark: SparkSession, spark_stack: Any) -> None:
    schema = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "ns", TimestampNanoType()),
        NestedField(3, "ns_tz", TimestamptzNanoType()),
    )
    name = spark_stack.create_table(schema, format_version=3)
    rows = [(1, 1_700_000_000_123_456_789, -5), (2, None, 0)]
    df = spark.createDataFrame(rows, "id long, ns long, ns_tz long")
    ispark.write(df, name, config=spark_stack.config)
    stored = read_data_file(spark_stack.live_files(name)[0].file_path, schema)
    assert str(stored.schema.field("ns").type) == "timestamp[ns]"
    assert canonical(ispark.read(spark, name, config=spark_stack.config)) == canonical(df)


# -- partitioning ---------------------------------------------------------------------------------

PARTITIONED = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "name", StringType()),
    NestedField(3, "cat", StringType()),
    NestedField(4, "amount", LongType()),
    NestedField(5, "d1", DateType()),
    NestedField(6, "d2", DateType()),
    NestedField(7, "ts", TimestampType()),
    NestedField(8, "tstz", TimestamptzType()),
    NestedField(9, "price", DecimalType(10, 2)),
    NestedField(10, "flag", BooleanType()),
)


@pytest.mark.integration
def test_partitioned_writes_agree_with_the_core_transforms(
    spark: SparkSession, spark_stack: Any
) -> None:
    spec = (
        PartitionSpecBuilder(PARTITIONED)
        .add_field("cat", "identity")
        .add_field("id", "bucket[4]")
        .add_field("name", "truncate[2]")
        .add_field("amount", "truncate[10]")
        .add_field("d1", "year")
        .add_field("d2", "month")
        .add_field("ts", "day")
        .add_field("tstz", "hour")
        .add_field("price", "bucket[3]")
        .add_field("flag", "void")
        .build()
    )
    name = spark_stack.create_table(PARTITIONED, spec)
    rng = random.Random(7)
    rows = []
    for n in range(80):
        base = dt.datetime(2023, 12, 30, 22) + dt.timedelta(hours=rng.randrange(80))
        rows.append(
            (
                n,
                rng.choice(["apple", "apricot", "banana", None, "b"]),
                rng.choice(["x", "y", None]),
                rng.randrange(-30, 30),
                dt.date(2019 + rng.randrange(3), 1, 1) + dt.timedelta(days=rng.randrange(400)),
                None if n % 9 == 0 else dt.date(2024, 1, 1) + dt.timedelta(days=rng.randrange(90)),
                base,
                base.replace(tzinfo=UTC) + dt.timedelta(minutes=rng.randrange(120)),
                decimal.Decimal(rng.randrange(-10_000, 10_000)) / 100,
                rng.random() < 0.5,
            )
        )
    df = spark.createDataFrame(
        rows,
        "id long, name string, cat string, amount long, d1 date, d2 date, "
        "ts timestamp_ntz, tstz timestamp, price decimal(10,2), flag boolean",
    ).repartition(2)
    ispark.write(df, name, config=spark_stack.config)
    table = spark_stack.load(name)
    schema, table_spec = table.metadata.schema(), table.metadata.spec()
    seen: Counter[int] = Counter()
    for data_file in spark_stack.live_files(name):
        assert f"/{table_spec.partition_path(data_file.partition, schema)}/" in data_file.file_path
        rows_in_file = read_data_file(data_file.file_path, schema)
        assert rows_in_file.num_rows == data_file.record_count
        for row in _internal_rows(rows_in_file, schema):
            expected = tuple(
                pf.transform.apply(schema.find_type(pf.source_id), row[pf.source_id])
                for pf in table_spec.fields
            )
            assert expected == data_file.partition
            seen[row[1]] += 1
    assert seen == Counter(range(80))


def _internal_rows(table: Any, schema: Schema) -> list[dict[int, Any]]:
    """Rows keyed by field id, values in icefloe's internal representation."""
    from icefloe.arrow.schema import from_arrow_array

    columns = {
        f.field_id: from_arrow_array(f.field_type, table.column(f.name)) for f in schema.fields
    }
    return [{fid: values[i] for fid, values in columns.items()} for i in range(table.num_rows)]


@pytest.mark.integration
def test_files_roll_at_the_target_size_with_whole_row_groups(
    spark: SparkSession, spark_stack: Any
) -> None:
    schema = Schema(
        NestedField(1, "id", LongType(), required=True), NestedField(2, "payload", StringType())
    )
    name = spark_stack.create_table(
        schema,
        properties={
            "write.target-file-size-bytes": str(96 * 1024),
            "write.parquet.compression-codec": "uncompressed",
            "write.metadata.metrics.column.payload": "truncate(4)",
        },
    )
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "500")
    try:
        df = spark.range(0, 6000, numPartitions=2).select(
            F.col("id"), F.sha2(F.col("id").cast("string"), 256).alias("payload")
        )
        ispark.write(df, name, config=spark_stack.config)
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    files = spark_stack.live_files(name)
    assert sum(f.record_count for f in files) == 6000
    assert len(files) > 2  # rolled: more than one file per task
    import pyarrow.parquet as pq

    for data_file in files:
        path = data_file.file_path.removeprefix("file://")
        metadata = pq.ParquetFile(path).metadata
        # Spark's 500-row batches were buffered into row groups of many batches.
        assert metadata.num_rows == data_file.record_count
        assert metadata.num_rows / metadata.num_row_groups > 500
        assert len(data_file.upper_bounds[2]) <= 5  # type: ignore[index]


# -- failures and exactly once ----------------------------------------------------------------------


@pytest.mark.integration
def test_a_failed_task_attempt_leaves_no_committed_duplicate(
    spark: SparkSession, spark_stack: Any
) -> None:
    """A task attempt that dies after writing its files (its Python worker exits, as on a
    lost executor) is retried; only the retry's files are committed, the others deleted."""
    schema = Schema(
        NestedField(1, "id", LongType(), required=True), NestedField(2, "s", StringType())
    )
    name = spark_stack.create_table(schema)
    df = spark.range(0, 2000, numPartitions=2).select("id", F.col("id").cast("string").alias("s"))
    with fault(spark, "crash:1"):
        staged = ispark.stage_write(df, name, config=spark_stack.config)
    assert staged.needs_listing  # Spark reported the failed attempt
    left_behind = {p for p in spark_stack.stored_files(name) if is_job_file(p, staged.job_id)}
    assert left_behind > staged.paths  # the failed attempt's files are still there
    ispark.commit_staged(staged)
    live = spark_stack.live_files(name)
    assert {f.file_path for f in live} == staged.paths
    assert spark_stack.stored_files(name) == staged.paths
    back = ispark.read(spark, name, config=spark_stack.config)
    assert back.count() == 2000 and back.select("id").distinct().count() == 2000


@pytest.mark.integration
def test_a_streaming_batch_replayed_after_a_restart_commits_once(
    spark: SparkSession, spark_stack: Any, tmp_path: Path
) -> None:
    schema = Schema(
        NestedField(1, "id", LongType(), required=True), NestedField(2, "s", StringType())
    )
    name = spark_stack.create_table(schema)
    source, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    source.mkdir()
    for n in range(3):
        lines = [f'{{"id": {n * 10 + i}, "s": "batch{n}"}}' for i in range(10)]
        (source / f"part-{n}.json").write_text("\n".join(lines) + "\n")

    def run_stream() -> None:
        query = (
            spark.readStream.schema("id long, s string")
            .option("maxFilesPerTrigger", 1)
            .json(str(source))
            .writeStream.foreachBatch(ispark.foreach_batch_sink(name, config=spark_stack.config))
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()

    run_stream()
    table = spark_stack.load(name)
    snapshots = len(table.metadata.snapshots)
    assert ispark.read(spark, name, config=spark_stack.config).count() == 30
    # The restart replays the last batch: the sink committed it, the checkpoint did not.
    last = max(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    (checkpoint / "commits" / str(last)).unlink()
    (checkpoint / "commits" / f".{last}.crc").unlink(missing_ok=True)
    run_stream()
    assert len(spark_stack.load(name).metadata.snapshots) == snapshots
    back = ispark.read(spark, name, config=spark_stack.config)
    assert back.count() == 30 and back.select("id").distinct().count() == 30
    assert spark_stack.stored_files(name) == {f.file_path for f in spark_stack.live_files(name)}
    summaries = [s.summary or {} for s in spark_stack.load(name).metadata.snapshots]
    assert sorted(s.get(ispark.BATCH_ID_PROPERTY) for s in summaries) == ["0", "1", "2"]
    shutil.rmtree(checkpoint)


@pytest.mark.integration
def test_a_replayed_commit_id_is_acknowledged_and_its_files_deleted(
    spark: SparkSession, spark_stack: Any
) -> None:
    """The coordinator's side of exactly once: a commit id already in the table is not
    applied again, and the replay's own files, which are in no snapshot, are removed."""
    schema = Schema(NestedField(1, "id", LongType(), required=True))
    name = spark_stack.create_table(schema)
    df = spark.range(0, 50, numPartitions=2)
    first = ispark.write(df, name, commit_id="job-42", config=spark_stack.config)
    again = ispark.write(df, name, commit_id="job-42", config=spark_stack.config)
    assert again == first
    assert ispark.read(spark, name, config=spark_stack.config).count() == 50
    assert spark_stack.stored_files(name) == {f.file_path for f in spark_stack.live_files(name)}


@pytest.mark.integration
def test_an_unanswered_retry_finds_its_commit_id_in_the_table_and_keeps_live_files(
    spark: SparkSession, spark_stack: Any
) -> None:
    """A writer that gets no answer (here: it listens to the wrong topic, so every
    table-committed is lost to it) looks for its commit id in the table before retrying or
    deleting anything: found, the write succeeded; only files not in the table are removed."""
    schema = Schema(NestedField(1, "id", LongType(), required=True))
    name = spark_stack.create_table(schema)
    df = spark.range(0, 40, numPartitions=2)
    first = ispark.write(df, name, commit_id="job-lost", config=spark_stack.config)
    live_before = {f.file_path for f in spark_stack.live_files(name)}
    deaf = spark_stack.config.model_copy(update={"results_topic": spark_stack.config.events_topic})
    again = ispark.write(df, name, commit_id="job-lost", config=deaf, timeout_s=3.0)
    assert again == first
    assert {f.file_path for f in spark_stack.live_files(name)} == live_before
    assert spark_stack.stored_files(name) == live_before
    assert ispark.read(spark, name, config=spark_stack.config).count() == 40


# -- modes, schemas and events ------------------------------------------------------------------------


@pytest.mark.integration
def test_overwrite_modes(spark: SparkSession, spark_stack: Any) -> None:
    schema = Schema(
        NestedField(1, "id", LongType(), required=True), NestedField(2, "cat", StringType())
    )
    spec = PartitionSpecBuilder(schema).add_field("cat", "identity").build()
    name = spark_stack.create_table(schema, spec)
    config = spark_stack.config
    ispark.write(
        spark.createDataFrame([(1, "a"), (2, "b"), (3, "c")], "id long, cat string"),
        name,
        config=config,
    )
    ispark.write(
        spark.createDataFrame([(10, "a")], "id long, cat string"),
        name,
        "overwrite",
        overwrite_filter=EqualTo("cat", "a"),
        config=config,
    )
    rows = {(r.id, r.cat) for r in ispark.read(spark, name, config=config).collect()}
    assert rows == {(10, "a"), (2, "b"), (3, "c")}
    ispark.write(
        spark.createDataFrame([(20, "b")], "id long, cat string"),
        name,
        "overwrite-partitions",
        config=config,
    )
    rows = {(r.id, r.cat) for r in ispark.read(spark, name, config=config).collect()}
    assert rows == {(10, "a"), (20, "b"), (3, "c")}
    ispark.write(
        spark.createDataFrame([(30, "z")], "id long, cat string"), name, "overwrite", config=config
    )
    assert [(r.id, r.cat) for r in ispark.read(spark, name, config=config).collect()] == [(30, "z")]
    assert (
        ispark.write(spark.createDataFrame([], "id long, cat string"), name, config=config) is None
    )


@pytest.mark.integration
def test_dataframes_that_do_not_fit_the_schema_fail_before_any_task(
    spark: SparkSession, spark_stack: Any
) -> None:
    schema = Schema(
        NestedField(1, "id", LongType(), required=True), NestedField(2, "s", StringType())
    )
    name = spark_stack.create_table(schema)
    config = spark_stack.config
    with pytest.raises(ValidationError, match=r"'id'.*missing"):
        ispark.write(spark.createDataFrame([("a",)], "s string"), name, config=config)
    with pytest.raises(ValidationError, match=r"'id'.*string"):
        ispark.write(
            spark.createDataFrame([("1", "a")], "id string, s string"), name, config=config
        )
    with pytest.raises(ValidationError, match="merge_schema"):
        ispark.write(spark.createDataFrame([(1, 2)], "id long, other int"), name, config=config)
    with pytest.raises(ValidationError, match="write mode"):
        ispark.write(
            spark.createDataFrame([(1, "a")], "id long, s string"), name, "upsrt", config=config
        )  # type: ignore[arg-type]
    assert spark_stack.load(name).metadata.current_snapshot() is None


@pytest.mark.integration
def test_merge_schema_adds_the_new_columns(spark: SparkSession, spark_stack: Any) -> None:
    schema = Schema(
        NestedField(1, "id", LongType(), required=True), NestedField(2, "s", StringType())
    )
    name = spark_stack.create_table(schema)
    df = spark.createDataFrame(
        [(1, "a", 5, (1.5, "q"))], "id long, s string, extra int, st struct<x:double,y:string>"
    )
    ispark.write(df, name, merge_schema=True, config=spark_stack.config)
    evolved = spark_stack.load(name).metadata.schema()
    assert [f.name for f in evolved.fields] == ["id", "s", "extra", "st"]
    assert evolved.find_field("id").required  # existing columns are left as they were
    assert evolved.find_type("st.y") == StringType()
    assert canonical(ispark.read(spark, name, config=spark_stack.config)) == canonical(df)


@pytest.mark.integration
def test_large_jobs_publish_their_files_in_several_events(
    spark: SparkSession, spark_stack: Any
) -> None:
    schema = Schema(
        NestedField(1, "id", LongType(), required=True), NestedField(2, "k", IntegerType())
    )
    spec = PartitionSpecBuilder(schema).add_field("k", "identity").build()
    name = spark_stack.create_table(schema, spec)
    config = SparkConfig(**{**spark_stack.config.model_dump(), "event_max_files": 2})
    df = spark.range(0, 300, numPartitions=2).select("id", (F.col("id") % 7).cast("int").alias("k"))
    staged = ispark.stage_write(df, name, config=config)
    assert len(staged.files) == 14  # 7 partitions x 2 tasks
    assert len(staged.events) >= 7 and all(len(e.data_files) <= 2 for e in staged.events)
    assert {e.attempt_id for e in staged.events} == set(staged.attempt_ids)
    snapshot_id = ispark.commit_staged(staged)
    assert snapshot_id == spark_stack.load(name).metadata.current_snapshot_id
    assert len(spark_stack.live_files(name)) == 14


# -- settings ----------------------------------------------------------------------------------------


def test_settings_come_from_code_then_spark_then_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ICEFLOE_BROKERS", "env:9092")
    monkeypatch.setenv("ICEFLOE_EVENTS_TOPIC", "env.events")
    monkeypatch.setenv("ICEFLOE_CATALOG", "file:///env")
    spark_conf = {
        "spark.icefloe.events-topic": "spark.events",
        "spark.icefloe.catalog": "file:///spark",
        "spark.other": "ignored",
    }
    settings = SparkConfig.load(spark_conf, {"catalog": "file:///code"})
    assert (settings.brokers, settings.events_topic, settings.catalog) == (
        "env:9092",
        "spark.events",
        "file:///code",
    )
    with pytest.raises(ValidationError, match=r"spark\.icefloe\.event-max-files"):
        SparkConfig.load({"spark.icefloe.event-max-files": "0"})
    with pytest.raises(ValidationError, match="unknown icefloe Spark settings"):
        SparkConfig.load({}, {"brokerz": "x"})
    monkeypatch.delenv("ICEFLOE_BROKERS")
    with pytest.raises(ValidationError, match="ICEFLOE_BROKERS"):
        SparkConfig.load({}).kafka_options()


# -- the demo's jobs ------------------------------------------------------------------------------------


@pytest.mark.integration
def test_the_demo_jobs_write_trips_in_batches_and_concurrent_streams(
    spark: SparkSession, spark_stack: Any, tmp_path: Path
) -> None:
    from icefloe.dev.spark_demo_job import (
        TRIPS_SCHEMA,
        create_trips_table,
        stream_trips,
        taxi_trips,
        write_trips,
    )

    name = create_trips_table(spark_stack.catalog_uri, f"demo.trips_{uuid.uuid4().hex[:8]}")
    ispark.check_dataframe_schema(taxi_trips(spark, 10).schema, TRIPS_SCHEMA)
    batch = write_trips(spark, name, 3000, config=spark_stack.config)
    assert batch.snapshot_id is not None and batch.rows == 3000
    progress: list[tuple[int, int]] = []
    writers = stream_trips(
        spark,
        name,
        str(tmp_path / "checkpoints"),
        writers=2,
        batches=2,
        rows_per_batch=100,
        config=spark_stack.config,
        on_batch=lambda writer, batch_id, rows, seconds: progress.append((writer, batch_id)),
    )
    assert sorted(progress) == [(w, b) for w in range(2) for b in range(2)]
    assert [w.rows for w in writers] == [200, 200]
    trips = ispark.read(spark, name, config=spark_stack.config)
    assert trips.count() == 3400 and trips.select("trip_id").distinct().count() == 3400
    days = {r.d for r in trips.selectExpr("to_date(pickup_ts) AS d").distinct().collect()}
    assert len(days) == 14
    assert len(spark_stack.load(name).metadata.snapshots) == 5  # one batch job, four micro-batches


@pytest.mark.integration
def test_writes_and_reads_through_object_storage(spark: SparkSession, s3_spark_stack: Any) -> None:
    """Tasks upload their files through the S3 FileIO, readers fetch them through it, and a
    failed attempt's uploads are found by listing the bucket and deleted."""
    stack = s3_spark_stack
    schema = Schema(
        NestedField(1, "id", LongType(), required=True), NestedField(2, "cat", StringType())
    )
    spec = PartitionSpecBuilder(schema).add_field("cat", "identity").build()
    name = stack.create_table(schema, spec)
    df = spark.range(0, 600, numPartitions=2).select(
        "id", (F.col("id") % 3).cast("string").alias("cat")
    )
    with fault(spark, "raise:0"):
        staged = ispark.stage_write(df, name, config=stack.config)
    assert all(path.startswith("s3://") for path in staged.paths)
    assert stack.stored_files(name) > staged.paths
    ispark.commit_staged(staged)
    assert stack.stored_files(name) == staged.paths == {f.file_path for f in stack.live_files(name)}
    assert canonical(ispark.read(spark, name, config=stack.config)) == canonical(df)
