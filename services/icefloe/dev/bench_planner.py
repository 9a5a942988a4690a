"""Scan planning latency: icefloe's planner beside PyIceberg's ``plan_files``, same metadata.

Tables of 10k, 100k and 1M data files (``--quick``: 1k, 10k, 50k) are generated as
manifests directly (no Parquet), like a production table partitioned by ``day(ts)`` and
``bucket[16](user_id)``: files are written in time order, each file covering a slice of a
day and a range of ids, with full column metrics. Three scans are planned:

* **full**: no filter, every file;
* **selective**: one hour of one day and one user, as a dashboard asks: the manifest list's
  partition summaries skip most manifests, partition values and metrics the rest;
* **metrics-only**: one id, which no partition field can help with: every manifest is
  opened and only column bounds find the file.

icefloe is measured **cold** (a new manifest cache for every run: read, decode with a native
Avro reader in worker threads, prune), **warm** (the cache the planner service keeps between
requests) and **restarted** (a new in-memory cache over the persisted on-disk store of
decoded manifests, memory-mapped: a restarted or new replica); PyIceberg has no cache
between scans, so its one figure stands beside all three. Each icefloe figure is the plan
*and every page of its REST response* (``file-scan-tasks`` with the data file JSON, residuals
and delete files, in the planner's pages, written by :mod:`icefloe.scan.tasks_json`): everything a
client needs, where PyIceberg's figure stops at its ``FileScanTask`` objects. The file paths
are read back from that JSON after the clock stops and must equal PyIceberg's. **manifest decode** is entries/s of one manifest into the cache's columns
beside PyIceberg's manifest reader. Sizes set equal run once (``--set files-small=100000
--set files-medium=100000`` runs 100k and the large size only).

Memory: the cache's bytes per cached manifest entry, beside the bytes the same manifest
takes as decoded Python ``DataFile`` objects (measured with ``tracemalloc``).

After the clock stops the plans are checked: icefloe and PyIceberg must select the same
files for every scan.
"""

from __future__ import annotations

import asyncio
import gc
import io
import re
import shutil
import struct
import tempfile
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from icefloe.dev.bench import (
    BenchContext,
    Figure,
    Kind,
    Timing,
    benchmark,
    measure,
    measure_interleaved,
)
from icefloe.errors import IcefloeError
from icefloe.expressions import BooleanExpression
from icefloe.expressions.json_form import parse_expression
from icefloe.io.fileio import LocalFileIO
from icefloe.manifests.cache import CachedManifest, ManifestCache
from icefloe.manifests.manifest import ManifestWriter, read_manifest
from icefloe.manifests.manifest_list import ManifestFile, ManifestListWriter
from icefloe.manifests.store import ManifestStore
from icefloe.planner.config import PlannerConfig
from icefloe.scan.planning import plan_scan
from icefloe.scan.tasks_json import scan_tasks_bytes
from icefloe.spec.datafile import DataFile
from icefloe.spec.metadata import TableMetadata
from icefloe.spec.metadata_builder import MetadataBuilder, new_table_metadata
from icefloe.spec.partition import PartitionSpec, PartitionSpecBuilder
from icefloe.spec.schema import Schema
from icefloe.spec.snapshot import Operation, Snapshot, SnapshotRef, Summary
from icefloe.spec.sort_order import SortOrder
from icefloe.spec.transforms import BucketTransform
from icefloe.spec.types import DoubleType, LongType, NestedField, StringType, TimestampType

DAY_US = 86_400_000_000
HOUR_US = 3_600_000_000
FIRST_DAY = 19_723  # 2024-01-01
FILES_PER_DAY = 500
IDS_PER_FILE = 1000
SNAPSHOT_ID = 1_234_567
# A full plan of a million files takes minutes (PyIceberg's, and icefloe's cold one): from
# this size on every measurement is a single run without warm-up.
SINGLE_RUN_FROM = 500_000

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "ts", TimestampType(), required=True),
    NestedField(3, "user_id", LongType()),
    NestedField(4, "event", StringType()),
    NestedField(5, "amount", DoubleType()),
)
_LONG = struct.Struct("<q")
_DOUBLE = struct.Struct("<d")
_BUCKET = BucketTransform(16)


class BenchmarkCheckError(IcefloeError):
    """A measured implementation produced a wrong plan."""


# ---------------------------------------------------------------------------------------
# The generated table
# ---------------------------------------------------------------------------------------


def data_file(i: int, spec_id: int) -> DataFile:
    """File ``i`` of the table: a slice of one day, a range of ids, one user bucket."""
    day = FIRST_DAY + i // FILES_PER_DAY
    slot = DAY_US // FILES_PER_DAY
    ts_lo = day * DAY_US + (i % FILES_PER_DAY) * slot
    user_lo = (i * 7919) % 100_000
    bucket = _BUCKET.apply(LongType(), user_lo)
    id_lo = i * IDS_PER_FILE
    return DataFile(
        file_path=f"s3://warehouse/db/events/data/ts_day={day}/b={bucket}/{i:08d}.parquet",
        file_format="parquet",
        partition=(day, bucket),
        record_count=IDS_PER_FILE,
        file_size_in_bytes=64 << 20,
        spec_id=spec_id,
        column_sizes={1: 8000, 2: 8000, 3: 4000, 4: 3000, 5: 8000},
        value_counts={1: 1000, 2: 1000, 3: 1000, 4: 1000, 5: 1000},
        null_value_counts={1: 0, 2: 0, 3: 10, 4: 0, 5: 3},
        nan_value_counts={5: 0},
        lower_bounds={
            1: _LONG.pack(id_lo),
            2: _LONG.pack(ts_lo),
            3: _LONG.pack(user_lo),
            4: b"click",
            5: _DOUBLE.pack(-100.0),
        },
        upper_bounds={
            1: _LONG.pack(id_lo + IDS_PER_FILE - 1),
            2: _LONG.pack(ts_lo + slot - 1),
            3: _LONG.pack(user_lo),
            4: b"view",
            5: _DOUBLE.pack(1000.0),
        },
        split_offsets=[4],
        sort_order_id=0,
    )


@dataclass
class Generated:
    metadata: TableMetadata
    metadata_location: str
    files: int
    manifests: int
    directory: Path


def events_table(location: str, version: int) -> TableMetadata:
    """The empty table the generated files belong to, partitioned by day and user bucket."""
    spec = PartitionSpecBuilder(SCHEMA).add_field("ts", "day").add_field("user_id", "bucket[16]")
    return new_table_metadata(
        SCHEMA, spec.build(), SortOrder.unsorted(), location, {}, format_version=version
    )


def write_data_manifests(
    metadata_dir: Path,
    spec: PartitionSpec,
    schema: Schema,
    files: int,
    per_manifest: int,
    version: int,
    snapshot_id: int,
) -> list[ManifestFile]:
    """Files ``0 .. files - 1`` (:func:`data_file`) added in manifests of ``per_manifest``."""
    rows = []
    for m, start in enumerate(range(0, files, per_manifest)):
        buffer = io.BytesIO()
        with ManifestWriter(
            buffer, spec=spec, schema=schema, format_version=version, snapshot_id=snapshot_id
        ) as writer:
            for i in range(start, min(files, start + per_manifest)):
                writer.add(data_file(i, spec.spec_id))
        path = metadata_dir / f"m{m:05d}.avro"
        path.write_bytes(buffer.getvalue())
        rows.append(writer.to_manifest_file(str(path), buffer.tell()))
    return rows


def generate(directory: Path, files: int, per_manifest: int, name: str = "table") -> Generated:
    """Write ``files`` entries into manifests, a manifest list and a metadata file, for a
    table at ``directory/name``."""
    location = str(directory / name)
    base = events_table(location, 2)
    schema, spec = base.schema(), base.spec()
    metadata_dir = directory / name / "metadata"
    metadata_dir.mkdir(parents=True)
    rows = write_data_manifests(metadata_dir, spec, schema, files, per_manifest, 2, SNAPSHOT_ID)
    list_path = metadata_dir / "snap-1.avro"
    buffer = io.BytesIO()
    with ManifestListWriter(
        buffer,
        format_version=2,
        snapshot_id=SNAPSHOT_ID,
        parent_snapshot_id=None,
        sequence_number=1,
    ) as list_writer:
        list_writer.add_all(rows)
    list_path.write_bytes(buffer.getvalue())
    snapshot = Snapshot(
        snapshot_id=SNAPSHOT_ID,
        sequence_number=1,
        timestamp_ms=base.last_updated_ms + 1,
        manifest_list=str(list_path),
        summary=Summary(Operation.APPEND, {"added-data-files": str(files)}),
        schema_id=schema.schema_id,
    )
    metadata = (
        MetadataBuilder(base)
        .add_snapshot(snapshot)
        .set_ref("main", SnapshotRef.branch(SNAPSHOT_ID))
        .build()
    )
    metadata_location = metadata_dir / "v1.metadata.json"
    metadata_location.write_bytes(metadata.to_json_bytes())
    return Generated(metadata, str(metadata_location), files, len(rows), directory)


def scans(files: int) -> dict[str, dict[str, Any] | None]:
    """Filter JSON per scan (the REST form both planners parse)."""
    middle = files // 2
    day = FIRST_DAY + middle // FILES_PER_DAY
    slot = DAY_US // FILES_PER_DAY
    hour_lo = day * DAY_US + (middle % FILES_PER_DAY) * slot
    user = (middle * 7919) % 100_000
    iso = _iso
    return {
        "full": None,
        "selective": {
            "type": "and",
            "left": {
                "type": "and",
                "left": {"type": "gt-eq", "term": "ts", "value": iso(hour_lo)},
                "right": {"type": "lt", "term": "ts", "value": iso(hour_lo + HOUR_US)},
            },
            "right": {"type": "eq", "term": "user_id", "value": user},
        },
        "metrics-only": {"type": "eq", "term": "id", "value": middle * IDS_PER_FILE + 17},
    }


def _iso(micros: int) -> str:
    import datetime as dt

    return (dt.datetime(1970, 1, 1) + dt.timedelta(microseconds=micros)).isoformat()


# ---------------------------------------------------------------------------------------
# The planners
# ---------------------------------------------------------------------------------------


class Icefloe:
    """Plans on a private event loop; ``cache`` None plans cold (a new cache per plan, whose
    manifests are decoded in worker threads, as the planner service does; PyIceberg reads
    manifests in a thread pool too)."""

    def __init__(self, generated: Generated) -> None:
        self.generated = generated
        self.loop = asyncio.new_event_loop()
        self.io = LocalFileIO()
        self.warm_cache = ManifestCache(self.io, 8 << 30, decode_in_thread=False)
        self.store_dir = generated.directory / "manifest-store"
        self.store = ManifestStore(self.store_dir, 8 << 30)

    def close(self) -> None:
        self.loop.close()

    def restarted_cache(self) -> ManifestCache:
        """A new, empty in-memory cache over the persisted store: a restarted replica."""
        return ManifestCache(self.io, 8 << 30, store=ManifestStore(self.store_dir, 8 << 30))

    def plan(self, row_filter: BooleanExpression | None, cache: ManifestCache | None) -> Pages:
        """Plan, then write every page of the REST response (what a client receives: the
        file scan tasks with their data file JSON, residuals and delete files), as the
        planner service does for a plan and its page fetches."""
        chosen = cache or ManifestCache(self.io, 8 << 30)

        async def run() -> Pages:
            plan = await plan_scan(
                self.generated.metadata, chosen, row_filter=row_filter, offload=False
            )
            return Pages(
                [scan_tasks_bytes(plan, start, start + PAGE) for start in range(0, len(plan), PAGE)]
            )

        return self.loop.run_until_complete(run())


PAGE: int = PlannerConfig.model_fields["tasks_per_page"].default  # the planner's pages
_FILE_PATH = re.compile(rb'"data-file":\{"spec-id":\d+,"content":"data","file-path":"([^"]*)"')


class Pages(list[bytes]):
    """The REST pages of one plan (JSON text each)."""

    def paths(self) -> list[str]:
        """The data file paths of the tasks, read back from the JSON (after the clock)."""
        out = []
        for page in self:
            tasks = _FILE_PATH.findall(page)
            out += [p.decode("utf-8") for p in tasks]
        return out


def _plan_restarted(ours: Icefloe, row_filter: BooleanExpression | None) -> Pages:
    return ours.plan(row_filter, ours.restarted_cache())


class PyIceberg:
    def __init__(self, generated: Generated) -> None:
        from pyiceberg.table import StaticTable

        self.table = StaticTable.from_metadata(generated.metadata_location)

    def plan(self, row_filter: Any) -> list[str]:
        scan = (
            self.table.scan(row_filter=row_filter) if row_filter is not None else self.table.scan()
        )
        return [t.file.file_path for t in scan.plan_files()]


def pyiceberg_filter(expr: dict[str, Any] | None) -> Any:
    """The PyIceberg expression of an icefloe expression JSON (None for no filter)."""
    if expr is None:
        return None
    from pydantic import TypeAdapter
    from pyiceberg.expressions import BooleanExpression as PyExpr

    return TypeAdapter(PyExpr).validate_python(expr)


class _Last:
    def __init__(self, produce: Callable[[], Any]) -> None:
        self.produce = produce
        self.value: Any = None

    def run(self) -> None:
        self.value = self.produce()

    def paths(self) -> list[str] | None:
        if self.value is None:
            return None
        return self.value.paths() if isinstance(self.value, Pages) else list(self.value)

    def clear(self) -> None:
        self.value = None  # the runner collects the heap before each timed run


def _bytes_per_decoded_datafile(generated: Generated) -> float:
    """tracemalloc's bytes per DataFile for one manifest decoded into Python objects."""
    cache_rows = asyncio.run(_first_manifest(generated))
    data, row = cache_rows
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        entries = read_manifest(
            data,
            location=row.manifest_path,
            manifest_file=row,
            spec_by_id=generated.metadata.specs(),
        )
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    return (after - before) / max(1, len(entries))


async def _first_manifest(generated: Generated) -> tuple[bytes, Any]:
    io_ = LocalFileIO()
    snapshot = generated.metadata.current_snapshot()
    assert snapshot is not None
    rows = await ManifestCache(io_, 0).manifest_list(snapshot)
    return await io_.read(rows[0].manifest_path), rows[0]


# ---------------------------------------------------------------------------------------
# The benchmark
# ---------------------------------------------------------------------------------------


def _size_figures(ctx: BenchContext, generated: Generated, label: str) -> list[Figure]:
    ours = Icefloe(generated)
    try:
        try:
            peer: PyIceberg | None = PyIceberg(generated)
        except ImportError as e:
            peer = None
            ctx.note(f"pyiceberg is not installed ({e}); its figures are missing")
        figures = []
        for scan_name, expr in scans(generated.files).items():
            row_filter = None if expr is None else parse_expression(expr)
            py_filter = pyiceberg_filter(expr)
            cold = _Last(partial(ours.plan, row_filter, None))
            warm = _Last(partial(ours.plan, row_filter, ours.warm_cache))
            restart = _Last(partial(_plan_restarted, ours, row_filter))
            ours.plan(row_filter, ours.warm_cache)  # fill the warm cache once, untimed
            if not any(ours.store_dir.glob("*.arrow")):
                ours.plan(None, ManifestCache(ours.io, 8 << 30, store=ours.store))  # persist
            single = generated.files >= SINGLE_RUN_FROM
            timings = measure_interleaved(
                {"cold": cold.run, "warm": warm.run, "restarted": restart.run},
                work=1,
                repeat=1 if single else ctx.repeat,
                setup={"cold": cold.clear, "warm": warm.clear, "restarted": restart.clear},
                warmup={"cold": not single, "warm": not single, "restarted": not single},
            )
            theirs: Timing | None = None
            their_plan: list[str] | None = None
            if peer is not None:
                last = _Last(partial(peer.plan, py_filter))
                theirs = measure(
                    last.run,
                    work=1,
                    repeat=1 if single else ctx.repeat,
                    setup=last.clear,
                    warmup=not single,
                )
                their_plan = last.value
            for which in ("cold", "warm", "restarted"):
                peers = {"pyiceberg plan_files": theirs} if theirs is not None else {}
                figures.append(
                    Figure(
                        f"{label} {scan_name} {which}",
                        "ms/plan",
                        timings[which],
                        peers,
                        kind=Kind.LATENCY,
                    )
                )
            _check(f"{label} {scan_name}", cold.paths(), warm.paths(), their_plan)
            _check(f"{label} {scan_name} restarted", restart.paths(), warm.paths(), their_plan)
        stats = ours.warm_cache.stats()
        per_entry = stats.bytes / generated.files
        python = _bytes_per_decoded_datafile(generated)
        ctx.note(
            f"{label}: {generated.manifests} manifests; warm cache {stats.bytes / 2**20:.1f} MiB, "
            f"{per_entry:.0f} bytes per cached entry (incl. columns cut out for filters) vs "
            f"{python:.0f} bytes per decoded Python DataFile ({python / per_entry:.1f}x)"
        )
        return figures
    finally:
        ours.close()


def _check(
    what: str, cold: list[str] | None, warm: list[str] | None, theirs: list[str] | None
) -> None:
    if cold is None or warm is None or set(cold) != set(warm):
        raise BenchmarkCheckError(f"{what}: cold and warm icefloe plans differ")
    if not cold:
        raise BenchmarkCheckError(f"{what}: icefloe planned no file")
    if theirs is not None and set(cold) != set(theirs):
        raise BenchmarkCheckError(
            f"{what}: icefloe planned {len(cold)} files, PyIceberg {len(theirs)}; they must agree"
        )


# Rounds of the decode figure: one round is a few tens of milliseconds for icefloe (a few
# hundred for PyIceberg), so a best of 3 on a shared machine too often has every icefloe run
# preempted; more rounds, interleaved, give both sides the same chances (15: at a load of 5
# to 14 on two cores, a best of 7 still varied by a quarter from run to run).
DECODE_ROUNDS = 15


def _decode_figure(ctx: BenchContext, generated: Generated, label: str) -> Figure | None:
    """Entries/s decoding one manifest into the cache's Arrow columns (the default native
    reader, DataFusion's), beside PyIceberg's manifest reader
    (``ManifestFile.fetch_manifest_entry``), timed round by round (at least
    :data:`DECODE_ROUNDS`), and a note with icefloe's other decoders (DuckDB's reader, and
    the fastavro fallback) for reference."""
    data, row = asyncio.run(_first_manifest(generated))
    specs, schema = generated.metadata.specs(), generated.metadata.schema()
    entries = len(read_manifest(data, location=row.manifest_path))
    runs: dict[str, Callable[[], object]] = {
        "datafusion": lambda: CachedManifest.decode(data, row, specs, schema, decoder="datafusion"),
        "duckdb": lambda: CachedManifest.decode(data, row, specs, schema, decoder="duckdb"),
    }
    try:
        from pyiceberg.table import StaticTable

        table = StaticTable.from_metadata(generated.metadata_location)
        snapshot = table.current_snapshot()
        assert snapshot is not None
        manifest = snapshot.manifests(table.io)[0]
        runs["pyiceberg"] = lambda: manifest.fetch_manifest_entry(table.io, discard_deleted=True)
    except ImportError as e:
        ctx.note(f"pyiceberg is not installed ({e}); its decode figure is missing")
    timings = measure_interleaved(runs, work=entries, repeat=max(ctx.repeat, DECODE_ROUNDS))
    fallback = measure(
        lambda: CachedManifest.decode(data, row, specs, schema, decoder="fastavro"),
        work=entries,
        repeat=1,
        warmup=False,
    )
    peers: dict[str, Timing] = {}
    if "pyiceberg" in timings:
        peers["pyiceberg manifest reader"] = timings["pyiceberg"]
    ctx.note(
        f"decode ({label}, {entries} entries per manifest): icefloe with DuckDB's reader "
        f"{entries / timings['duckdb'].best:,.0f} entries/s, with the fastavro fallback "
        f"{entries / fallback.best:,.0f} entries/s"
    )
    return Figure(f"manifest decode ({entries} entries)", "entries/s", timings["datafusion"], peers)


def _label(files: int) -> str:
    if files < 1000:
        return str(files)
    if files < 1_000_000:
        return f"{files / 1000:g}k"
    return f"{files / 1_000_000:g}M"


@benchmark("planner")
def planner_benchmark(ctx: BenchContext) -> list[Figure]:
    """Scan planning latency (cold, warm) vs PyIceberg plan_files, 10k to 1M data files."""
    sizes = [
        ctx.size("files-small", full=10_000, quick=1_000),
        ctx.size("files-medium", full=100_000, quick=10_000),
        ctx.size("files-large", full=1_000_000, quick=50_000),
    ]
    per_manifest = ctx.size("entries-per-manifest", full=5_000, quick=2_000)
    figures: list[Figure] = []
    root = Path(tempfile.mkdtemp(prefix="icefloe-bench-planner-"))
    try:
        decoded = False
        for n in sorted(set(sizes)):  # equal sizes run once: a way to run fewer sizes
            label = _label(n)
            directory = root / label
            directory.mkdir()
            generated = generate(directory, n, per_manifest)
            if not decoded and n >= per_manifest:
                figure = _decode_figure(ctx, generated, label)
                if figure is not None:
                    figures.append(figure)
                decoded = True
            figures += _size_figures(ctx, generated, label)
            shutil.rmtree(directory, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    ctx.note(
        "cold: a new manifest cache per plan (read, decode, prune); warm: the planner's cache. "
        f"From {SINGLE_RUN_FROM:,} files on every figure is one run without warm-up."
    )
    return figures
