"""Compaction on Spark beside Spark's plain rewrite of the same files, and planning before
and after compaction, same run.

A table of synthetic taxi trips (:func:`icefloe.dev.spark_demo_job.taxi_trips`) is written as a
stream would write it: many small appends (``batches`` Spark jobs of two tasks each), with a
position delete file on a tenth of the data files. Then:

* **compact**, icefloe: :func:`icefloe.spark.compaction.stage_compaction`, everything a
  compaction does before its commit: planning from the manifests, the Spark job reading the
  small files with their deletes applied and writing target-size Iceberg files (field ids,
  metrics), and collecting them on the driver. The commit (Kafka round trip, one snapshot)
  does not depend on the data size and is left out, as in the write benchmark.
* **compact**, spark-rewrite: ``spark.read.parquet(<the same files>).coalesce(n).write
  .parquet(...)`` into as many files as icefloe writes: Spark's own rewrite of the same
  rows, without deletes to apply or Iceberg metadata to produce.

Figures: rows/s, kB/s and files/s of input. Then the compaction is committed (directly
through the catalog: no coordinator runs in a benchmark) and a full scan is planned on the
table before and after (:func:`icefloe.scan.planning.plan_scan`, cold manifest cache): the planning
latency, with the number of files each plan selects in the notes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import SparkSession

import icefloe.spark as ispark
from icefloe.arrow.schema import FIELD_ID_KEY
from icefloe.catalog.uri import load_catalog
from icefloe.dev.bench import BenchContext, Figure, Kind, Timing, benchmark
from icefloe.dev.bench_spark import spark_session
from icefloe.dev.spark_demo_job import TRIPS_SCHEMA, run_sync, taxi_trips
from icefloe.io.fileio import LocalFileIO
from icefloe.manifests.cache import ManifestCache
from icefloe.scan.planning import plan_scan
from icefloe.spark.compaction import StagedCompaction, stage_compaction
from icefloe.spark.config import SparkConfig
from icefloe.spec.datafile import DataFile, DataFileContent
from icefloe.spec.partition import PartitionSpec
from icefloe.table.catalog import Table
from icefloe.table.snapshot_producer import fast_append, rewrite_files, row_delta

IDENTIFIER = "bench.compact"
OPTIONS = {"min_input_files": 2, "target_file_size_bytes": 64 << 20}


def _position_deletes(table: Table, data_file: DataFile, every: int) -> DataFile:
    location = f"{table.metadata.location}/data/pos-{Path(data_file.file_path).stem}.parquet"
    positions = list(range(0, data_file.record_count, every))
    rows = pa.table(
        {
            "file_path": pa.array([data_file.file_path] * len(positions), pa.string()),
            "pos": pa.array(positions, pa.int64()),
        },
        schema=pa.schema(
            [
                pa.field("file_path", pa.string(), False, {FIELD_ID_KEY: b"2147483546"}),
                pa.field("pos", pa.int64(), False, {FIELD_ID_KEY: b"2147483545"}),
            ]
        ),
    )
    local = Path(location.removeprefix("file://"))
    pq.write_table(rows, local)
    return DataFile(
        location,
        "parquet",
        data_file.partition,
        len(positions),
        local.stat().st_size,
        content=DataFileContent.POSITION_DELETES,
        spec_id=data_file.spec_id,
        referenced_data_file=data_file.file_path,
    )


def _build_table(
    spark: SparkSession, uri: str, config: SparkConfig, rows: int, batches: int
) -> list[DataFile]:
    """The streamed table: ``batches`` small appends, deletes on every tenth file."""

    async def create() -> None:
        catalog = load_catalog(uri)
        try:
            await catalog.create_namespace("bench")
            await catalog.create_table(
                IDENTIFIER,
                TRIPS_SCHEMA,
                PartitionSpec.unpartitioned(),
                properties={"write.parquet.compression-codec": "zstd"},
            )
        finally:
            await catalog.close()

    run_sync(create())
    per_batch = max(1, rows // batches)
    files: list[DataFile] = []
    for b in range(batches):
        df = taxi_trips(spark, per_batch, first_id=b * per_batch, partitions=2)
        files.extend(ispark.stage_write(df, IDENTIFIER, config=config).files)

    async def commit() -> None:
        catalog = load_catalog(uri)
        try:
            table = await catalog.load_table(IDENTIFIER)
            table = await fast_append(table, files).commit()
            deletes = [_position_deletes(table, f, 7) for f in files[::10]]
            await row_delta(table, [], deletes).commit()
        finally:
            await catalog.close()

    run_sync(commit())
    return files


def _plan_ms(uri: str) -> tuple[int, float]:
    """(files selected, seconds) of a cold full-scan plan of the table's head."""
    import time

    async def plan() -> tuple[int, float]:
        catalog = load_catalog(uri)
        try:
            table = await catalog.load_table(IDENTIFIER)
            cache = ManifestCache(LocalFileIO(), 1 << 30, decode_in_thread=False)
            start = time.perf_counter()
            result = await plan_scan(table.metadata, cache, offload=False)
            tasks = result.tasks()
            return len(tasks), time.perf_counter() - start
        finally:
            await catalog.close()

    return asyncio.run(plan())


@benchmark("spark-compact")
def spark_compact_benchmark(ctx: BenchContext) -> list[Figure]:
    """Compaction rows/s beside Spark's plain rewrite; planning before and after."""
    rows = ctx.size("rows", full=1_000_000, quick=100_000)
    batches = ctx.size("batches", full=40, quick=10)
    spark, owned = spark_session()
    root = Path(tempfile.mkdtemp(prefix="icefloe-bench-compact-"))
    uri = f"file://{root / 'warehouse'}"
    config = SparkConfig(catalog=uri)
    staged: list[StagedCompaction] = []
    spark_out = root / "spark-rewrite"
    try:
        files = _build_table(spark, uri, config, rows, batches)
        total_rows = sum(f.record_count for f in files)
        total_bytes = sum(f.file_size_in_bytes for f in files)
        paths = [f.file_path.removeprefix("file://") for f in files]
        outputs = [1]

        def drop() -> None:
            while staged:
                staged.pop().discard()
            shutil.rmtree(spark_out, ignore_errors=True)

        def icefloe_run() -> None:
            s = stage_compaction(spark, IDENTIFIER, options=OPTIONS, config=config)
            outputs[0] = max(1, len(s.paths))
            staged.append(s)

        def spark_run() -> None:
            frame = spark.read.parquet(*paths).coalesce(outputs[0])
            frame.write.mode("overwrite").option("compression", "zstd").parquet(str(spark_out))

        timings = ctx.compare(
            {"icefloe": icefloe_run, "spark-rewrite": spark_run},
            work=total_rows,
            setup={"icefloe": drop, "spark-rewrite": drop},
        )
        ours, theirs = timings["icefloe"], timings["spark-rewrite"]
        figures = [
            Figure("compact rows in", "rows/s", icefloe=ours, peers={"spark-rewrite": theirs}),
            Figure(
                "compact kB in",
                "kB/s",
                icefloe=_rework(ours, total_bytes // 1000),
                peers={"spark-rewrite": _rework(theirs, total_bytes // 1000)},
            ),
            Figure(
                "compact files in",
                "files/s",
                icefloe=_rework(ours, len(files)),
                peers={"spark-rewrite": _rework(theirs, len(files))},
            ),
        ]

        # planning before and after a committed compaction
        before_files, _ = _plan_ms(uri)
        before = ctx.measure(lambda: _plan_ms(uri), work=1)
        drop()
        final = stage_compaction(spark, IDENTIFIER, options=OPTIONS, config=config)

        async def commit() -> None:
            catalog = load_catalog(uri)
            try:
                table = await catalog.load_table(IDENTIFIER)
                removed = [t.data_file.file_path for g in final.plan.groups for t in g.tasks]
                dropped = [d.file_path for d in final.plan.droppable_deletes(set(removed))]
                added = [f for o in final.outputs for f in o.files]
                await (
                    rewrite_files(table, removed + dropped, added)
                    .validate_from_snapshot(final.plan.snapshot_id)
                    .commit()
                )
            finally:
                await catalog.close()

        run_sync(commit())
        after_files, _ = _plan_ms(uri)
        after = ctx.measure(lambda: _plan_ms(uri), work=1)
        figures.append(
            Figure(
                "full-scan plan after compaction",
                "ms/plan",
                icefloe=after,
                peers={"before-compaction": before},
                kind=Kind.LATENCY,
            )
        )
        ctx.note(
            f"{total_rows:,} taxi trips in {len(files)} small files ({total_bytes / 1e6:.1f} MB, "
            f"{batches} appends of 2 tasks), position deletes on every 10th file; local[2], "
            f"zstd, local disk. icefloe = plan + Spark job applying deletes and writing "
            f"Iceberg files with metrics ({outputs[0]} output file(s)); spark-rewrite = "
            "read.parquet + coalesce + write.parquet of the same files. The plan figure "
            f"scans {before_files} data files before and {after_files} after."
        )
        return figures
    finally:
        while staged:
            staged.pop().discard()
        ispark.shutdown()
        if owned:
            spark.stop()
        shutil.rmtree(root, ignore_errors=True)


def _rework(timing: Timing, work: int) -> Timing:
    """The same samples, counted in another unit of work."""
    return dataclasses.replace(timing, work=max(1, work))
