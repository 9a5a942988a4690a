"""The Spark side of ``make demo``: synthetic taxi trips written through icefloe.

The demo driver (:mod:`icefloe.dev.demo`) owns the stack (broker, catalog, coordinator,
planner) and the report; this module owns the Spark jobs it runs:

* :func:`taxi_trips` builds a DataFrame of realistic trips (timestamps, ids, amounts,
  strings and a nested pickup location) of any size, generated inside Spark from a seed,
  so a million rows cost no driver memory and a rerun produces the same rows;
* :func:`create_trips_table` creates the table they go to, partitioned by pickup day;
* :func:`write_trips` writes one batch job through :func:`icefloe.spark.write`;
* :func:`stream_trips` runs several streaming queries at once (Spark runs each on its own
  thread), each committing micro-batches through :func:`icefloe.spark.foreach_batch_sink`.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

import icefloe.spark as ispark
from icefloe.catalog.uri import load_catalog
from icefloe.errors import AlreadyExistsError, IcefloeError
from icefloe.spark.config import SparkConfig
from icefloe.spec.partition import PartitionSpec, PartitionSpecBuilder
from icefloe.spec.schema import Schema
from icefloe.spec.types import (
    BooleanType,
    DecimalType,
    DoubleType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
    StructType,
    TimestamptzType,
)
from icefloe.table.catalog import TableIdentifier

T = TypeVar("T")

TRIPS_SCHEMA = Schema(
    NestedField(1, "trip_id", LongType(), required=True),
    NestedField(2, "vendor_id", IntegerType(), required=True),
    NestedField(3, "pickup_ts", TimestamptzType(), required=True),
    NestedField(4, "dropoff_ts", TimestamptzType(), required=True),
    NestedField(5, "passenger_count", IntegerType()),
    NestedField(6, "distance_km", DoubleType()),
    NestedField(7, "fare", DecimalType(10, 2)),
    NestedField(8, "tip", DecimalType(10, 2)),
    NestedField(9, "total", DecimalType(10, 2)),
    NestedField(10, "payment_type", StringType()),
    NestedField(11, "pickup_zone", StringType()),
    NestedField(12, "store_and_forward", BooleanType()),
    NestedField(
        13,
        "pickup",
        StructType(NestedField(14, "lat", DoubleType()), NestedField(15, "lon", DoubleType())),
    ),
)

START_MICROS = 1_735_689_600_000_000  # 2025-01-01T00:00:00Z
DAYS = 14
_DAY_MICROS = 86_400_000_000
_ZONES = (
    "Midtown",
    "Upper East Side",
    "Harlem",
    "Williamsburg",
    "JFK Airport",
    "LaGuardia",
    "Financial District",
    "Astoria",
    "Park Slope",
    "Chelsea",
    "SoHo",
    "Long Island City",
)
_PAYMENTS = ("card", "cash", "app", "voucher")


def trips_spec(schema: Schema = TRIPS_SCHEMA) -> PartitionSpec:
    """Trips are partitioned by pickup day, as most queries ask for a date range."""
    return PartitionSpecBuilder(schema).add_field("pickup_ts", "day").build()


def _unit(id_column: Column, seed: int, salt: int) -> Column:
    """A pseudo-random double in [0, 1) from the trip id: stable for any partitioning."""
    hashed = F.xxhash64(id_column, F.lit(seed), F.lit(salt))
    return F.pmod(hashed, F.lit(1_000_003)).cast("double") / F.lit(1_000_003.0)


def trip_columns(id_column: Column, seed: int = 0) -> list[Column]:
    """The trip columns computed from a long id column (see :func:`taxi_trips`)."""
    u = [_unit(id_column, seed, salt) for salt in range(10)]
    pickup_micros = F.lit(START_MICROS) + (u[0] * F.lit(DAYS * _DAY_MICROS)).cast("long")
    minutes = F.lit(3.0) + u[1] * u[1] * F.lit(80.0)
    distance = F.round(minutes * (F.lit(0.25) + u[2] * F.lit(0.6)), 3)
    fare = (F.lit(2.5) + distance * F.lit(1.75)).cast("decimal(10,2)")
    tip = F.when(u[3] < 0.3, F.lit(0)).otherwise(fare * u[4] * 0.25).cast("decimal(10,2)")
    zones = F.array(*[F.lit(z) for z in _ZONES])
    payments = F.array(*[F.lit(p) for p in _PAYMENTS])
    return [
        id_column.cast("long").alias("trip_id"),
        (F.floor(u[5] * 4) + 1).cast("int").alias("vendor_id"),
        F.timestamp_micros(pickup_micros).alias("pickup_ts"),
        F.timestamp_micros(pickup_micros + (minutes * F.lit(60_000_000)).cast("long")).alias(
            "dropoff_ts"
        ),
        F.when(u[6] < 0.02, F.lit(None))
        .otherwise(F.floor(u[6] * 6) + 1)
        .cast("int")
        .alias("passenger_count"),
        distance.alias("distance_km"),
        fare.alias("fare"),
        tip.alias("tip"),
        (fare + tip).cast("decimal(10,2)").alias("total"),
        F.element_at(payments, (F.floor(u[7] * len(_PAYMENTS)) + 1).cast("int")).alias(
            "payment_type"
        ),
        F.element_at(zones, (F.floor(u[8] * len(_ZONES)) + 1).cast("int")).alias("pickup_zone"),
        (u[9] < 0.01).alias("store_and_forward"),
        F.struct(
            F.round(F.lit(40.55) + u[2] * F.lit(0.35), 6).alias("lat"),
            F.round(F.lit(-74.05) + u[5] * F.lit(0.3), 6).alias("lon"),
        ).alias("pickup"),
    ]


def taxi_trips(
    spark: SparkSession,
    rows: int,
    *,
    first_id: int = 0,
    seed: int = 0,
    partitions: int | None = None,
) -> DataFrame:
    """``rows`` synthetic trips with ids ``first_id``, ``first_id + 1``, ... over 14 days."""
    ids = spark.range(first_id, first_id + rows, numPartitions=partitions)
    return ids.select(*trip_columns(F.col("id"), seed))


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to completion whether or not the caller's thread runs a loop."""
    result: list[T] = []
    failure: list[BaseException] = []

    def target() -> None:
        try:
            result.append(asyncio.run(coro))
        except BaseException as e:
            failure.append(e)

    thread = threading.Thread(target=target, name="icefloe-demo-setup")
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return result[0]


def create_trips_table(
    catalog_uri: str,
    identifier: str = "nyc.trips",
    *,
    properties: Mapping[str, str] | None = None,
    exist_ok: bool = True,
) -> str:
    """Create the trips table (and its namespace); returns its identifier."""
    ident = TableIdentifier.parse(identifier)

    async def create() -> None:
        catalog = load_catalog(catalog_uri)
        try:
            if not await catalog.namespace_exists(ident.namespace):
                await catalog.create_namespace(ident.namespace)
            if exist_ok and await catalog.table_exists(ident):
                return
            await catalog.create_table(
                ident, TRIPS_SCHEMA, trips_spec(), properties=dict(properties or {})
            )
        except AlreadyExistsError:
            if not exist_ok:
                raise
        finally:
            await catalog.close()

    run_sync(create())
    return str(ident)


@dataclass(frozen=True)
class WriteSummary:
    snapshot_id: int | None
    rows: int
    seconds: float


def write_trips(
    spark: SparkSession,
    identifier: str,
    rows: int,
    *,
    first_id: int = 0,
    seed: int = 0,
    partitions: int | None = None,
    config: SparkConfig | Mapping[str, Any] | None = None,
) -> WriteSummary:
    """One batch job: ``rows`` trips written and committed through the coordinator."""
    started = time.perf_counter()
    df = taxi_trips(spark, rows, first_id=first_id, seed=seed, partitions=partitions)
    snapshot_id = ispark.write(df, identifier, config=config)
    return WriteSummary(snapshot_id, rows, time.perf_counter() - started)


@dataclass
class StreamWriterSummary:
    """What one streaming writer committed: its batches' rows and durations."""

    writer: int
    query_id: str
    batches: list[tuple[int, int, float]] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return sum(rows for _, rows, _ in self.batches)


BatchCallback = Callable[[int, int, int, float], None]
"""``on_batch(writer, batch_id, rows, seconds)``, called after each committed batch."""


def stream_trips(
    spark: SparkSession,
    identifier: str,
    checkpoint_root: str,
    *,
    writers: int = 3,
    batches: int = 4,
    rows_per_batch: int = 10_000,
    first_id: int = 1_000_000_000,
    seed: int = 1,
    config: SparkConfig | Mapping[str, Any] | None = None,
    on_batch: BatchCallback | None = None,
    timeout_s: float = 600.0,
) -> list[StreamWriterSummary]:
    """``writers`` concurrent streaming queries, each committing ``batches`` micro-batches
    of ``rows_per_batch`` trips through the foreachBatch sink, then stopped.

    Trip ids never collide: writer ``n`` numbers its trips from
    ``first_id + n * batches * rows_per_batch``. Each query checkpoints under
    ``checkpoint_root``; its sink id is the query's own id, so a restart from the same
    checkpoint would commit each batch once.
    """
    run = uuid.uuid4().hex[:8]
    summaries: list[StreamWriterSummary] = []
    finished: list[threading.Event] = []
    errors: list[BaseException] = []
    queries = []
    for n in range(writers):
        summary = StreamWriterSummary(n, "")
        done = threading.Event()
        sink = ispark.foreach_batch_sink(identifier, config=config)
        offset = first_id + n * batches * rows_per_batch

        def each_batch(
            df: DataFrame,
            batch_id: int,
            n: int = n,
            summary: StreamWriterSummary = summary,
            done: threading.Event = done,
            sink: Callable[[DataFrame, int], None] = sink,
            offset: int = offset,
        ) -> None:
            if batch_id >= batches:
                done.set()
                return
            started = time.perf_counter()
            try:
                trips = df.select(*trip_columns(F.col("value") + F.lit(offset), seed))
                sink(trips, batch_id)
            except BaseException as e:
                errors.append(e)
                done.set()
                raise
            seconds = time.perf_counter() - started
            summary.batches.append((batch_id, rows_per_batch, seconds))
            if on_batch is not None:
                on_batch(n, batch_id, rows_per_batch, seconds)
            if batch_id + 1 >= batches:
                done.set()

        source = (
            spark.readStream.format("rate-micro-batch")
            .option("rowsPerBatch", rows_per_batch)
            .option("numPartitions", 2)
            .load()
        )
        query = (
            source.writeStream.foreachBatch(each_batch)
            .queryName(f"icefloe-demo-{run}-writer{n}")
            .option("checkpointLocation", f"{checkpoint_root.rstrip('/')}/{run}/writer{n}")
            .start()
        )
        summary.query_id = str(query.id)
        queries.append(query)
        summaries.append(summary)
        finished.append(done)
    deadline = time.monotonic() + timeout_s
    try:
        for done in finished:
            if not done.wait(max(0.0, deadline - time.monotonic())):
                raise IcefloeError(
                    f"streaming writers did not commit {batches} batches within {timeout_s:g}s"
                )
    finally:
        for query in queries:
            query.stop()
    if errors:
        raise errors[0]
    return summaries


__all__ = [
    "TRIPS_SCHEMA",
    "StreamWriterSummary",
    "WriteSummary",
    "create_trips_table",
    "run_sync",
    "stream_trips",
    "taxi_trips",
    "trip_columns",
    "trips_spec",
    "write_trips",
]
