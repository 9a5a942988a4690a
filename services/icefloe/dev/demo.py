"""``make demo``: the whole system on one machine.

1. starts a local stack: a Kafka-compatible broker (tansu) and Redis (or dynalite with
   ``--dynamodb``; SeaweedFS's S3 for the warehouse with ``--s3``);
2. starts the coordinator and the planner as their own processes (``icefloe coordinator``,
   ``icefloe planner``), as they run in production;
3. runs a PySpark job that writes a partitioned table of synthetic taxi trips (1M rows by
   default) through the coordinator, then several concurrent streaming writers committing
   micro-batches, showing progress;
4. prints the commits the coordinator published (snapshots, files, latencies);
5. answers one filtered scan through the planner, with Spark and with PyIceberg's REST
   client (server-side planning), and checks both against the rows Spark generated;
6. stops everything it started and exits 0 only if every check held.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

TABLE = "nyc.trips"
FILTER_DAY = 3  # trips picked up on 2025-01-04 ...
FILTER_ZONE = "JFK Airport"  # ... at the airport


def say(message: str) -> None:
    print(message, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, what: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(
                f"{what} exited with {process.returncode}; log:\n{log.read_text()[-3000:]}"
            )
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{what} did not become ready at {url}; log:\n{log.read_text()[-3000:]}")


@contextmanager
def service(
    name: str, args: list[str], env: dict[str, str], ready_url: str, logs: Path
) -> Iterator[None]:
    log = logs / f"{name}.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "icefloe.cli", *args],
            env={**os.environ, **env},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_http(ready_url, name, process, log)
        say(f"  {name} ready (pid {process.pid}, log {log})")
        yield
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def read_results(brokers: str, topic: str) -> list[dict[str, Any]]:
    """Every table-committed event the coordinator published, oldest first."""
    from aiokafka import AIOKafkaConsumer

    async def consume() -> list[dict[str, Any]]:
        consumer = AIOKafkaConsumer(
            topic, bootstrap_servers=brokers, auto_offset_reset="earliest", enable_auto_commit=False
        )
        await consumer.start()
        out: list[dict[str, Any]] = []
        try:
            while True:
                batch = await consumer.getmany(timeout_ms=2000)
                if not batch:
                    return out
                for records in batch.values():
                    out.extend(json.loads(r.value) for r in records if r.value)
        finally:
            await consumer.stop()

    return asyncio.run(consume())


def run(args: argparse.Namespace) -> int:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from icefloe.dev.local_stack import LocalStack

    work = Path(args.workdir or tempfile.mkdtemp(prefix="icefloe-demo-")).resolve()
    if work.exists() and args.workdir:
        shutil.rmtree(work)
    (work / "logs").mkdir(parents=True)
    started = time.perf_counter()
    checks: list[tuple[str, bool]] = []
    say(f"icefloe demo in {work}")
    with LocalStack(
        kafka=True,
        redis=not args.dynamodb,
        dynamodb=args.dynamodb,
        s3=args.s3,
        workdir=work / "stack",
    ) as stack:
        say(
            f"  broker {stack.kafka_bootstrap}"
            + (
                f", redis {stack.redis_url}"
                if not args.dynamodb
                else f", dynalite {stack.dynamodb_endpoint}"
            )
        )
        query: dict[str, str] = {}
        if args.s3:
            bucket = stack.create_bucket("icefloe-demo")
            query["warehouse"] = f"s3://{bucket}/warehouse"
            query.update(stack.s3_properties())
        else:
            query["warehouse"] = f"file://{work}/warehouse"
        if args.dynamodb:
            query.update({"endpoint": stack.dynamodb_endpoint, "region": "us-east-1"})
            catalog = f"dynamodb://icefloe_demo?{urlencode(query)}"
        else:
            catalog = f"{stack.redis_url}?{urlencode(query)}"
        coordinator_port, planner_port = free_port(), free_port()
        common = {"ICEFLOE_BROKERS": stack.kafka_bootstrap, "ICEFLOE_CATALOG": catalog}
        if args.dynamodb:
            common.update({"AWS_ACCESS_KEY_ID": "demo", "AWS_SECRET_ACCESS_KEY": "demo"})
            os.environ.update({"AWS_ACCESS_KEY_ID": "demo", "AWS_SECRET_ACCESS_KEY": "demo"})
        coordinator_env = {
            **common,
            "ICEFLOE_HTTP_PORT": str(coordinator_port),
            "ICEFLOE_HTTP_HOST": "127.0.0.1",
            "ICEFLOE_BATCH_MAX_WAIT_MS": "1000",
            "ICEFLOE_TOPIC_PARTITIONS": "4",
            "ICEFLOE_SESSION_TIMEOUT_MS": "6000",
            "ICEFLOE_LOG_FORMAT": "text",
        }
        planner_env = {
            **common,
            "ICEFLOE_PLANNER_CATALOG": catalog,
            "ICEFLOE_PLANNER_BROKERS": stack.kafka_bootstrap,
            "ICEFLOE_PLANNER_HOST": "127.0.0.1",
            "ICEFLOE_PLANNER_PORT": str(planner_port),
        }
        logs = work / "logs"
        with (
            service(
                "coordinator",
                ["coordinator"],
                coordinator_env,
                f"http://127.0.0.1:{coordinator_port}/readyz",
                logs,
            ),
            service(
                "planner",
                ["planner"],
                planner_env,
                f"http://127.0.0.1:{planner_port}/healthz",
                logs,
            ),
        ):
            checks += spark_part(
                args, catalog, stack.kafka_bootstrap, f"http://127.0.0.1:{planner_port}", work
            )
            say("")
            say("commits published by the coordinator (results topic):")
            results = [
                r
                for r in read_results(stack.kafka_bootstrap, "icefloe.results")
                if r.get("type") == "table-committed"
            ]
            latencies = sorted(int(r.get("latency-ms", 0)) for r in results)
            for r in results:
                say(
                    f"  snapshot {r['snapshot-id']}  seq {r.get('sequence-number')}  "
                    f"{len(r.get('commit-ids', []))} commit id(s)  +{r.get('added-data-files', 0)} files  "
                    f"+{r.get('added-records', 0):,} rows  latency {r.get('latency-ms')} ms"
                )
            if latencies:
                p50 = latencies[len(latencies) // 2]
                p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
                say(
                    f"  {len(results)} snapshots; event-to-commit latency p50 {p50} ms, p99 {p99} ms"
                )
            checks.append(
                (
                    "the coordinator published a table-committed event per snapshot",
                    len(results) >= 2,
                )
            )
    say("")
    say("summary")
    ok = True
    for what, passed in checks:
        ok &= passed
        say(f"  [{'ok' if passed else 'FAILED'}] {what}")
    say(
        f"demo {'succeeded' if ok else 'FAILED'} in {time.perf_counter() - started:.0f}s; everything it started is stopped"
    )
    if ok and not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


def spark_part(
    args: argparse.Namespace, catalog: str, brokers: str, planner_url: str, work: Path
) -> list[tuple[str, bool]]:
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import icefloe.spark as ispark
    from icefloe.dev.spark_demo_job import (
        START_MICROS,
        create_trips_table,
        stream_trips,
        taxi_trips,
        write_trips,
    )
    from icefloe.expressions import And, EqualTo, GreaterThanOrEqual, LessThan
    from icefloe.spark.config import SparkConfig

    checks: list[tuple[str, bool]] = []
    config = SparkConfig(
        catalog=catalog, brokers=brokers, planner_url=planner_url, commit_timeout_s=600.0
    )
    say("")
    say("starting Spark (local[2]) ...")
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("icefloe-demo")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.memory", "2g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        create_trips_table(catalog, TABLE)
        say(f"created {TABLE}, partitioned by day(pickup_ts)")
        say(f"batch job: writing {args.rows:,} trips through the coordinator ...")
        batch = write_trips(spark, TABLE, args.rows, partitions=4, config=config)
        say(
            f"  committed as snapshot {batch.snapshot_id}: {batch.rows:,} rows in {batch.seconds:.1f}s ({batch.rows / batch.seconds:,.0f} rows/s)"
        )
        checks.append(("batch job committed", batch.snapshot_id is not None))

        say(
            f"streaming: {args.writers} concurrent writers x {args.batches} micro-batches of {args.batch_rows:,} rows ..."
        )

        def progress(writer: int, batch_id: int, rows: int, seconds: float) -> None:
            say(f"  writer {writer} batch {batch_id}: {rows:,} rows committed in {seconds:.1f}s")

        streams = stream_trips(
            spark,
            TABLE,
            str(work / "checkpoints"),
            writers=args.writers,
            batches=args.batches,
            rows_per_batch=args.batch_rows,
            config=config,
            on_batch=progress,
        )
        streamed = sum(s.rows for s in streams)
        total_rows = args.rows + streamed

        day_start = START_MICROS + FILTER_DAY * 86_400_000_000
        filter_expr = And(
            And(
                GreaterThanOrEqual("pickup_ts", day_start),
                LessThan("pickup_ts", day_start + 86_400_000_000),
            ),
            EqualTo("pickup_zone", FILTER_ZONE),
        )
        lo = F.timestamp_micros(F.lit(day_start))
        hi = F.timestamp_micros(F.lit(day_start + 86_400_000_000))
        matches = (
            (F.col("pickup_ts") >= lo)
            & (F.col("pickup_ts") < hi)
            & (F.col("pickup_zone") == FILTER_ZONE)
        )
        generated = taxi_trips(spark, args.rows, partitions=4)
        batch_ids = {r.trip_id for r in generated.where(matches).select("trip_id").collect()}

        say("")
        say(
            f"filtered scan through the planner: pickups on day {FILTER_DAY + 1} of the data at {FILTER_ZONE}"
        )
        t0 = time.perf_counter()
        everything = ispark.read(spark, TABLE, config=config)
        counted = everything.count()
        say(
            f"  Spark read the whole table: {counted:,} rows (expected {total_rows:,}) in {time.perf_counter() - t0:.1f}s"
        )
        checks.append(
            (
                f"the table holds every written row exactly once ({total_rows:,})",
                counted == total_rows
                and everything.select("trip_id").distinct().count() == total_rows,
            )
        )
        t0 = time.perf_counter()
        spark_rows = ispark.read(spark, TABLE, filter=filter_expr, config=config)
        spark_ids = {r.trip_id for r in spark_rows.select("trip_id").collect()}
        say(f"  Spark (planner tasks): {len(spark_ids):,} rows in {time.perf_counter() - t0:.1f}s")

        from pyiceberg.catalog.rest import RestCatalog

        rest = RestCatalog("planner", uri=planner_url)
        table = rest.load_table(TABLE)
        row_filter = (
            f"pickup_ts >= '{_iso(day_start)}' AND pickup_ts < '{_iso(day_start + 86_400_000_000)}' "
            f"AND pickup_zone = '{FILTER_ZONE}'"
        )
        t0 = time.perf_counter()
        scan = table.scan(row_filter=row_filter)
        arrow = scan.to_arrow()
        py_ids = set(arrow.column("trip_id").to_pylist())
        say(
            f"  PyIceberg (REST catalog, server-side planning): {len(py_ids):,} rows in {time.perf_counter() - t0:.1f}s"
        )
        every_match = {r.trip_id for r in everything.where(matches).select("trip_id").collect()}
        say(
            f"  rows matching when Spark filters the whole table itself: {len(every_match):,} "
            f"({len(batch_ids):,} of them from the batch job's generated rows)"
        )
        checks.append(
            (
                "Spark and PyIceberg return the same rows through the planner",
                spark_ids == py_ids and len(py_ids) > 0,
            )
        )
        checks.append(
            (
                "the planner's answer is exactly the matching rows",
                spark_ids == every_match and batch_ids <= spark_ids,
            )
        )
    finally:
        ispark.shutdown()
        spark.stop()
    return checks


def _iso(micros: int) -> str:
    from icefloe.spec.values import micros_to_datetime

    return micros_to_datetime(micros, tz=True).isoformat()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="icefloe-demo", description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows of the batch job")
    parser.add_argument("--writers", type=int, default=3, help="concurrent streaming writers")
    parser.add_argument("--batches", type=int, default=3, help="micro-batches per writer")
    parser.add_argument("--batch-rows", type=int, default=20_000, help="rows per micro-batch")
    parser.add_argument(
        "--dynamodb", action="store_true", help="DynamoDB (dynalite) pointers instead of Redis"
    )
    parser.add_argument("--s3", action="store_true", help="keep the warehouse in S3 (SeaweedFS)")
    parser.add_argument("--workdir", help="where to keep logs and the local warehouse")
    parser.add_argument("--keep", action="store_true", help="keep the work directory after success")
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
