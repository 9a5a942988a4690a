"""An end-to-end job of icefloe's core alone (no Kafka, no services), checked by PyIceberg.

It creates a file-system table partitioned by ``day(pickup_ts)`` and ``bucket[16](trip_id)``,
writes two batches of synthetic taxi trips as Parquet data files (field ids and metrics
from the footer), commits them as two snapshots, then reads the table back with PyIceberg
(``StaticTable``) with and without a row filter and compares the rows with what was
written. Everything it prints is measured, nothing is canned; it exits non-zero if
PyIceberg disagrees.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import sys
import time
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from icefloe.catalog.fs import FileSystemCatalog
from icefloe.io.fileio import LocalFileIO
from icefloe.parquet.files import write_files
from icefloe.spec.partition import PartitionSpecBuilder
from icefloe.spec.schema import Schema
from icefloe.spec.types import (
    DecimalType,
    DoubleType,
    LongType,
    NestedField,
    StringType,
    StructType,
    TimestamptzType,
)
from icefloe.spec.values import micros_to_datetime
from icefloe.table.snapshot_producer import fast_append, merge_append

SCHEMA = Schema(
    NestedField(1, "trip_id", LongType(), required=True),
    NestedField(2, "pickup_ts", TimestamptzType(), required=True),
    NestedField(3, "vendor", StringType()),
    NestedField(4, "fare", DecimalType(10, 2)),
    NestedField(5, "distance_km", DoubleType()),
    NestedField(
        6,
        "pickup",
        StructType(NestedField(7, "lat", DoubleType()), NestedField(8, "lon", DoubleType())),
    ),
)

DAY_US = 86_400_000_000
START_US = 1_735_689_600_000_000  # 2025-01-01T00:00:00Z


def synthetic_trips(first_id: int, rows: int, seed: int) -> pa.Table:
    """Reproducible pseudo-random trips over 14 days."""
    rng = random.Random(seed)
    vendors = ("yellow", "green", "fhv", "lyft", "uber")
    ts, vendor, fare, distance, lat, lon = [], [], [], [], [], []
    for _ in range(rows):
        ts.append(START_US + rng.randrange(14 * DAY_US))
        vendor.append(vendors[rng.randrange(len(vendors))] if rng.random() > 0.01 else None)
        fare.append(Decimal(rng.randrange(250, 12_000)) / 100)
        distance.append(round(rng.expovariate(0.3), 3))
        lat.append(40.5 + rng.random() / 2)
        lon.append(-74.2 + rng.random() / 2)
    return pa.table(
        {
            "trip_id": pa.array(range(first_id, first_id + rows), pa.int64()),
            "pickup_ts": pa.array(ts, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
            "vendor": pa.array(vendor, pa.string()),
            "fare": pa.array(fare, pa.decimal128(10, 2)),
            "distance_km": pa.array(distance, pa.float64()),
            "pickup": pa.StructArray.from_arrays(
                [pa.array(lat, pa.float64()), pa.array(lon, pa.float64())], names=["lat", "lon"]
            ),
        }
    )


def _say(message: str) -> None:
    print(message, flush=True)


async def run(warehouse: Path, rows_per_batch: int) -> int:
    if warehouse.exists():
        shutil.rmtree(warehouse)
    warehouse.mkdir(parents=True)
    io = LocalFileIO()
    catalog = FileSystemCatalog("demo", str(warehouse), io)
    await catalog.create_namespace("nyc")
    spec = (
        PartitionSpecBuilder(SCHEMA)
        .add_field("pickup_ts", "day")
        .add_field("trip_id", "bucket[16]")
        .build()
    )
    table = await catalog.create_table(
        "nyc.trips", SCHEMA, spec=spec, properties={"write.target-file-size-bytes": "4194304"}
    )
    _say(f"created table nyc.trips at {table.location}")
    _say(
        f"  partitioned by {', '.join(f'{f.transform}({SCHEMA.find_column_name(f.source_id)})' for f in spec.fields)}"
    )

    written: list[pa.Table] = []
    for n, (commit, label) in enumerate(
        ((fast_append, "fast append"), (merge_append, "merge append"))
    ):
        batch = synthetic_trips(n * rows_per_batch, rows_per_batch, seed=17 + n)
        written.append(batch)
        t0 = time.perf_counter()
        meta = table.metadata
        files = await write_files(
            io,
            batch,
            table.location,
            schema=meta.schema(),
            spec=meta.spec(),
            properties=meta.properties,
        )
        t1 = time.perf_counter()
        table = await commit(table, files).commit()
        t2 = time.perf_counter()
        snap = table.metadata.current_snapshot()
        assert snap is not None and snap.summary is not None
        _say(
            f"snapshot {snap.snapshot_id} ({label}): {len(files)} data files, "
            f"{batch.num_rows:,} rows written in {t1 - t0:.2f}s, committed in {(t2 - t1) * 1000:.0f} ms; "
            f"total-records={snap.summary.get('total-records')} "
            f"total-data-files={snap.summary.get('total-data-files')}"
        )

    # Read back with PyIceberg, a different implementation, from the metadata alone.
    from pyiceberg.table import StaticTable

    static = StaticTable.from_metadata(table.metadata_location)
    expected = pa.concat_tables(written)
    t0 = time.perf_counter()
    got = static.scan().to_arrow()
    t1 = time.perf_counter()
    same = (
        got.sort_by("trip_id")
        .select(expected.column_names)
        .equals(expected.sort_by("trip_id").cast(got.select(expected.column_names).schema))
    )
    _say(
        f"PyIceberg read {got.num_rows:,} rows in {t1 - t0:.2f}s: {'identical to' if same else 'DIFFERENT FROM'} what was written"
    )

    day2 = START_US + 2 * DAY_US
    lo, hi = (micros_to_datetime(v, tz=True).isoformat() for v in (day2, day2 + DAY_US))
    row_filter = f"pickup_ts >= '{lo}' AND pickup_ts < '{hi}' AND vendor = 'green'"
    scan = static.scan(row_filter=row_filter)
    planned = list(scan.plan_files())
    filtered = scan.to_arrow()
    ts = pc.cast(expected["pickup_ts"], pa.int64())
    mask = pc.and_(
        pc.and_(pc.greater_equal(ts, day2), pc.less(ts, day2 + DAY_US)),
        pc.equal(expected["vendor"], "green"),
    )
    want = expected.filter(mask).num_rows
    total_files = len(list(static.scan().plan_files()))
    _say(
        f"filtered scan (day 3, vendor=green): PyIceberg planned {len(planned)} of {total_files} "
        f"files and returned {filtered.num_rows:,} rows; expected {want:,}"
    )
    ok = same and filtered.num_rows == want and len(planned) < total_files
    _say("demo " + ("succeeded" if ok else "FAILED"))
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="icefloe-demo", description=__doc__)
    parser.add_argument("--warehouse", default=".demo/warehouse")
    parser.add_argument("--rows", type=int, default=200_000, help="rows per batch")
    args = parser.parse_args(argv)
    return asyncio.run(run(Path(args.warehouse).resolve(), args.rows))


if __name__ == "__main__":
    sys.exit(main())
