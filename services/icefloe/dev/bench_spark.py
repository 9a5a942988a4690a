"""Spark write throughput: icefloe's writer beside Spark's own Parquet writer, same run.

Both write the same cached DataFrame of synthetic taxi trips
(:func:`icefloe.dev.spark_demo_job.taxi_trips`), with the same number of tasks and zstd
compression, into a local temporary directory:

* **icefloe**: :func:`icefloe.spark.stage_write`, which is everything a write does before
  waiting for the coordinator: the Spark job writing Iceberg data files (field ids, the
  table's partitioning, rolling, footer metrics), collecting the files on the driver and
  building the ``files-written`` events, which are then encoded as they would be sent. The
  commit itself (Kafka round trip, the coordinator's snapshot) is left out: it does not
  depend on the data size.
* **spark-parquet**: ``df.write.parquet`` (for the partitioned figure,
  ``partitionBy`` on the pickup day, which Spark derives with ``to_date``).

Spark runs ``local[2]`` unless ``ICEFLOE_BENCH_SPARK_MASTER`` says otherwise; an already
active session is reused as it is.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import icefloe.spark as ispark
from icefloe.dev.bench import BenchContext, Figure, benchmark
from icefloe.dev.spark_demo_job import TRIPS_SCHEMA, run_sync, taxi_trips, trips_spec
from icefloe.events import encode_event
from icefloe.spark.config import SparkConfig
from icefloe.spec.partition import PartitionSpec

MASTER_ENV = "ICEFLOE_BENCH_SPARK_MASTER"
TASKS = 2


def spark_session() -> tuple[SparkSession, bool]:
    """The active Spark session, else a new local one; and whether the caller owns it."""
    active = SparkSession.getActiveSession()
    if active is not None:
        return active, False
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    session = (
        SparkSession.builder.master(os.environ.get(MASTER_ENV, "local[2]"))
        .appName("icefloe-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(TASKS))
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    return session, True


def _create_table(catalog_uri: str, identifier: str, spec: PartitionSpec) -> None:
    from icefloe.catalog.uri import load_catalog

    async def create() -> None:
        catalog = load_catalog(catalog_uri)
        try:
            if not await catalog.namespace_exists("bench"):
                await catalog.create_namespace("bench")
            await catalog.create_table(
                identifier,
                TRIPS_SCHEMA,
                spec,
                properties={"write.parquet.compression-codec": "zstd"},
            )
        finally:
            await catalog.close()

    run_sync(create())


def _icefloe_write(df: DataFrame, identifier: str, config: SparkConfig) -> ispark.StagedWrite:
    staged = ispark.stage_write(df, identifier, config=config)
    for event in staged.events:
        encode_event(event)
    return staged


def _figure(
    ctx: BenchContext,
    label: str,
    df: DataFrame,
    small: DataFrame,
    rows: int,
    spec: PartitionSpec,
    root: Path,
    config: SparkConfig,
) -> Figure:
    identifier = f"bench.trips_{'day' if spec.fields else 'flat'}"
    _create_table(config.require_catalog(), identifier, spec)
    staged: list[ispark.StagedWrite] = []
    spark_out = root / f"spark-{identifier}"
    partitioned = bool(spec.fields)

    def drop_outputs() -> None:
        while staged:
            staged.pop().discard()
        shutil.rmtree(spark_out, ignore_errors=True)

    def icefloe_run(frame: DataFrame = df) -> None:
        staged.append(_icefloe_write(frame, identifier, config))

    def spark_run(frame: DataFrame = df) -> None:
        if partitioned:
            frame = frame.withColumn("pickup_day", F.to_date("pickup_ts"))
        out = frame.write.mode("overwrite").option("compression", "zstd")
        if partitioned:
            out = out.partitionBy("pickup_day")
        out.parquet(str(spark_out))

    ours = ctx.measure(
        icefloe_run, work=rows, setup=drop_outputs, warmup=lambda: icefloe_run(small)
    )
    theirs = ctx.measure(spark_run, work=rows, setup=drop_outputs, warmup=lambda: spark_run(small))
    drop_outputs()
    return Figure(f"write {label}", "rows/s", icefloe=ours, peers={"spark-parquet": theirs})


@benchmark("spark-write")
def spark_write_benchmark(ctx: BenchContext) -> list[Figure]:
    """Rows per second written from Spark: icefloe's writer beside df.write.parquet."""
    rows = ctx.size("rows", full=2_000_000, quick=200_000)
    spark, owned = spark_session()
    root = Path(tempfile.mkdtemp(prefix="icefloe-bench-spark-"))
    try:
        config = SparkConfig(catalog=f"file://{root / 'warehouse'}")
        df = taxi_trips(spark, rows, partitions=TASKS).cache()
        df.count()
        small = taxi_trips(spark, max(1000, rows // 50), partitions=TASKS).cache()
        small.count()
        figures = [
            _figure(
                ctx, "unpartitioned", df, small, rows, PartitionSpec.unpartitioned(), root, config
            ),
            _figure(ctx, "by day", df, small, rows, trips_spec(), root, config),
        ]
        ctx.note(
            f"{rows:,} taxi trips (13 columns, one nested), cached, {TASKS} tasks, zstd, local "
            "disk. icefloe = data files with field ids and footer metrics + files-written "
            "events built and encoded; the commit wait is not included."
        )
        df.unpersist()
        small.unpersist()
        return figures
    finally:
        ispark.shutdown()
        if owned:
            spark.stop()
        shutil.rmtree(root, ignore_errors=True)
