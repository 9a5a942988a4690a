"""Committed appends per second on one table, by 1, 4 and 16 concurrent committers.

A commit coordinator is bounded by how fast one table takes appends while several writers
race for its pointer. That depends on the pointer store (a create-if-absent metadata file on
a local disk, a conditional ``PutObject`` on S3, a Lua compare-and-swap in Redis, a
conditional ``UpdateItem`` in DynamoDB) and on what a losing attempt costs before it can try
again, so every catalog is measured, each beside PyIceberg's ``SqlCatalog`` on sqlite doing
the same appends in the same run. Implementations are timed in interleaved rounds (see
:func:`icefloe.dev.bench.measure_interleaved`), so a burst of load hits all of them alike.

What one run is, for N committers and ``appends`` appends (split as evenly as possible):

* **icefloe** (one figure per catalog): N asyncio tasks in this process, sharing one catalog
  client and one :class:`~icefloe.manifests.reader.ManifestReader`, as a coordinator does.
  Each loads the table, then commits its appends one at a time, each one ``DataFile`` built
  in memory, with ``fast_append(table, [file]).commit(policy)``. A conflict reloads the table
  and rebuilds on it (the new file's manifest is written once and reused).
* **pyiceberg-sql**: N threads in this process sharing one ``SqlCatalog`` (a sqlite file, a
  local warehouse). Each loads the table, then per append opens a transaction, adds the same
  ``DataFile`` values with ``update_snapshot().fast_append().append_data_file(...)`` and
  calls ``commit_transaction()``, whose own retry loop refreshes and rebuilds the snapshot
  after a ``CommitFailedException``. No Parquet is written or read by either side (PyIceberg's
  ``append``/``add_files`` would write or read Parquet; this path does neither), so both
  measure the commit only: manifest, manifest list, metadata file, pointer swap, retries.

Both retry with the same table properties (``commit.retry.*``: many retries, 2 to 100 ms
waits) but each with its own backoff: icefloe draws full jitter, PyIceberg doubles its wait
with 10% jitter. Every run starts on a fresh, empty table of the same schema and spec; the
clock covers loading the table and all commits, not creating or checking it. Durability is
not the same: icefloe's local FileIO fsyncs every file and directory entry it creates,
PyIceberg's does not (sqlite fsyncs its own commit). Redis and DynamoDB tables keep their
metadata files on the local disk, like the PyIceberg peer, so their figures show the pointer
store and not S3.

After every run, untimed, the table is loaded again and must hold exactly the appended files,
each once, in exactly one snapshot per append: a benchmark that loses or doubles commits
fails instead of reporting a figure.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import tempfile
import threading
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlencode

from icefloe.catalog.uri import load_catalog
from icefloe.dev.bench import BenchContext, Figure, Timing, Warmup, benchmark
from icefloe.dev.bench_manifest import BenchmarkCheckError
from icefloe.dev.local_stack import ACCESS_KEY_ID, REGION, SECRET_ACCESS_KEY, LocalStack
from icefloe.errors import ValidationError
from icefloe.manifests.reader import ManifestReader
from icefloe.spec.datafile import DataFile, FileFormat
from icefloe.spec.partition import PartitionField, PartitionSpec
from icefloe.spec.schema import Schema
from icefloe.spec.transforms import IdentityTransform
from icefloe.spec.types import LongType, NestedField, StringType
from icefloe.spec.values import to_bytes
from icefloe.table.catalog import Catalog, TableIdentifier, data_dir
from icefloe.table.commit import (
    MAX_WAIT_MS,
    MIN_WAIT_MS,
    NUM_RETRIES,
    TOTAL_TIMEOUT_MS,
    RetryPolicy,
)
from icefloe.table.snapshot_producer import fast_append

COMMITTER_COUNTS: Final = (1, 4, 16)
CATALOGS: Final = ("fs-local", "fs-s3", "redis", "dynamodb")
PEER: Final = "pyiceberg-sql"
NAMESPACE: Final = "bench"
CATEGORIES: Final = 4
RECORDS_PER_FILE: Final = 1_000
FILE_SIZE: Final = 64 * 1024

# Both libraries read these table properties; icefloe is also handed the same policy.
RETRY_PROPERTIES: Final[Mapping[str, str]] = {
    NUM_RETRIES: "100000",
    MIN_WAIT_MS: "2",
    MAX_WAIT_MS: "100",
    TOTAL_TIMEOUT_MS: "900000",
}
POLICY: Final = RetryPolicy.from_properties(RETRY_PROPERTIES)

SCHEMA: Final = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "category", StringType()),
)
SPEC: Final = PartitionSpec(0, (PartitionField(2, 1000, "category", IdentityTransform()),))


# ---------------------------------------------------------------------------------------
# The appended files: the same values for both libraries
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AppendedFile:
    """What one append adds, independent of either library's DataFile type."""

    path: str
    category: str
    first_id: int

    @property
    def last_id(self) -> int:
        return self.first_id + RECORDS_PER_FILE - 1

    def metrics(self) -> dict[str, Any]:
        """Column metrics as a writer would report them (ids are distinct, no nulls)."""
        return {
            "column_sizes": {1: FILE_SIZE * 3 // 4, 2: FILE_SIZE // 4},
            "value_counts": {1: RECORDS_PER_FILE, 2: RECORDS_PER_FILE},
            "null_value_counts": {1: 0, 2: 0},
            "lower_bounds": {
                1: to_bytes(LongType(), self.first_id),
                2: to_bytes(StringType(), self.category),
            },
            "upper_bounds": {
                1: to_bytes(LongType(), self.last_id),
                2: to_bytes(StringType(), self.category),
            },
        }


def plan_appends(data_location: str, committers: int, appends: int) -> list[list[AppendedFile]]:
    """The files each committer appends: ``appends`` split as evenly as possible.

    Paths are unique within a run; each committer spreads its files over the categories.
    """
    if committers < 1:
        raise ValidationError(
            f"a commit benchmark run needs at least 1 committer, not {committers}"
        )
    if appends < committers:
        raise ValidationError(
            f"{appends} appends cannot keep {committers} committers busy; "
            f"set appends to at least {committers}"
        )
    base, extra = divmod(appends, committers)
    plan: list[list[AppendedFile]] = []
    for c in range(committers):
        files = []
        for i in range(base + (1 if c < extra else 0)):
            category = f"c{(c + i) % CATEGORIES}"
            files.append(
                AppendedFile(
                    path=f"{data_location}/category={category}/c{c:02d}-{i:05d}.parquet",
                    category=category,
                    first_id=(c * appends + i) * RECORDS_PER_FILE,
                )
            )
        plan.append(files)
    return plan


def icefloe_data_file(f: AppendedFile) -> DataFile:
    return DataFile(
        file_path=f.path,
        file_format=FileFormat.PARQUET,
        partition=(f.category,),
        record_count=RECORDS_PER_FILE,
        file_size_in_bytes=FILE_SIZE,
        spec_id=SPEC.spec_id,
        **f.metrics(),
    )


def pyiceberg_data_file(f: AppendedFile) -> Any:
    from pyiceberg.manifest import DataFile as PyDataFile
    from pyiceberg.manifest import DataFileContent
    from pyiceberg.manifest import FileFormat as PyFileFormat
    from pyiceberg.typedef import Record

    data_file = PyDataFile.from_args(
        content=DataFileContent.DATA,
        file_path=f.path,
        file_format=PyFileFormat.PARQUET,
        partition=Record(f.category),
        record_count=RECORDS_PER_FILE,
        file_size_in_bytes=FILE_SIZE,
        **f.metrics(),
    )
    data_file.spec_id = SPEC.spec_id
    return data_file


# ---------------------------------------------------------------------------------------
# The check (after the clock)
# ---------------------------------------------------------------------------------------


def check_appended(
    what: str, table: str, expected: Sequence[str], live: Sequence[str], snapshots: int
) -> None:
    """``live`` must be exactly ``expected``, each file once, one snapshot per append."""
    counts = collections.Counter(live)
    wanted = set(expected)
    doubled = sorted(p for p, n in counts.items() if n > 1)
    missing = sorted(wanted - counts.keys())
    unexpected = sorted(counts.keys() - wanted)
    if doubled or missing or unexpected or len(live) != len(expected):
        details = []
        for label, paths in (("missing", missing), ("doubled", doubled), ("unknown", unexpected)):
            if paths:
                details.append(f"{len(paths)} {label} (e.g. {paths[0]})")
        raise BenchmarkCheckError(
            f"{what}: table {table} holds {len(live)} live files after {len(expected)} "
            f"committed appends: {', '.join(details) or 'counts differ'}; its figure is void"
        )
    if snapshots != len(expected):
        raise BenchmarkCheckError(
            f"{what}: table {table} has {snapshots} snapshots after {len(expected)} committed "
            "appends (one each expected); its figure is void"
        )


# ---------------------------------------------------------------------------------------
# Contenders: one implementation on one store
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RunTally:
    """What one run did: commits made, attempts they took, conflicts they lost."""

    committers: int
    commits: int
    attempts: int
    conflicts: int
    warmup: bool


@dataclass(frozen=True, slots=True)
class _Unchecked:
    table: str
    expected: list[str]


class Contender(ABC):
    """Runs N committers on a fresh table per run and checks each run's table afterwards.

    :meth:`setup` is the measurement's untimed setup: it checks the previous run's table and
    creates the next one. :meth:`settle` checks the last run's table once the timing is done.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.tallies: list[RunTally] = []
        self._table: tuple[str, str] | None = None  # (identifier, data location)
        self._unchecked: _Unchecked | None = None

    def setup(self) -> None:
        self.settle()
        self._table = self._create_table(f"{NAMESPACE}.t{uuid.uuid4().hex[:12]}")

    def run(self, committers: int, appends: int, *, warmup: bool = False) -> None:
        if self._table is None:
            raise ValidationError(f"{self.name}: run() needs setup() first (no table)")
        identifier, data_location = self._table
        self._table = None  # each table takes exactly one run
        plan = plan_appends(data_location, committers, appends)
        attempts, conflicts = self._append(identifier, plan)
        self.tallies.append(RunTally(committers, appends, attempts, conflicts, warmup))
        self._unchecked = _Unchecked(identifier, [f.path for files in plan for f in files])

    def settle(self) -> None:
        if self._unchecked is None:
            return
        unchecked, self._unchecked = self._unchecked, None
        live, snapshots = self._live_files(unchecked.table)
        check_appended(self.name, unchecked.table, unchecked.expected, live, snapshots)

    def conflicts_per_commit(self, committers: int) -> float:
        """Mean conflicts per committed append over the timed runs with ``committers``."""
        timed = [t for t in self.tallies if t.committers == committers and not t.warmup]
        commits = sum(t.commits for t in timed)
        return sum(t.conflicts for t in timed) / commits if commits else float("nan")

    @abstractmethod
    def _create_table(self, identifier: str) -> tuple[str, str]:
        """Create an empty table; return its identifier and data location."""

    @abstractmethod
    def _append(self, identifier: str, plan: list[list[AppendedFile]]) -> tuple[int, int]:
        """One committer per plan entry, concurrently; return (attempts, conflicts)."""

    @abstractmethod
    def _live_files(self, identifier: str) -> tuple[list[str], int]:
        """Paths of the live data files in a freshly loaded table, and its snapshot count."""

    @abstractmethod
    def close(self) -> None: ...


class IcefloeContender(Contender):
    """icefloe on one catalog, its committers as asyncio tasks on ``runner``'s loop."""

    def __init__(self, name: str, catalog: Catalog, runner: asyncio.Runner) -> None:
        super().__init__(name)
        self.catalog = catalog
        self._runner = runner
        self._namespace_ready = False

    def _create_table(self, identifier: str) -> tuple[str, str]:
        return self._runner.run(self._create(identifier))

    async def _create(self, identifier: str) -> tuple[str, str]:
        ident = TableIdentifier.parse(identifier)
        if not self._namespace_ready:
            if not await self.catalog.namespace_exists(ident.namespace):
                await self.catalog.create_namespace(ident.namespace)
            self._namespace_ready = True
        table = await self.catalog.create_table(ident, SCHEMA, SPEC, properties=RETRY_PROPERTIES)
        return str(ident), data_dir(table.metadata)

    def _append(self, identifier: str, plan: list[list[AppendedFile]]) -> tuple[int, int]:
        return self._runner.run(self._append_async(identifier, plan))

    async def _append_async(
        self, identifier: str, plan: list[list[AppendedFile]]
    ) -> tuple[int, int]:
        # One reader for the process, as the coordinator shares one: a committer rebuilding
        # on a base another committer wrote finds its manifest list already decoded.
        reader = ManifestReader(self.catalog.io)
        totals = collections.Counter[str]()

        async def committer(files: list[AppendedFile]) -> None:
            table = await self.catalog.load_table(identifier)
            for f in files:
                producer = fast_append(table, [icefloe_data_file(f)], reader=reader)
                table = await producer.commit(POLICY)
                totals["attempts"] += producer.stats.attempts
                totals["conflicts"] += producer.stats.conflicts

        async with asyncio.TaskGroup() as group:
            for files in plan:
                group.create_task(committer(files))
        return totals["attempts"], totals["conflicts"]

    def _live_files(self, identifier: str) -> tuple[list[str], int]:
        return self._runner.run(self._live_async(identifier))

    async def _live_async(self, identifier: str) -> tuple[list[str], int]:
        table = await self.catalog.load_table(identifier)
        snapshot = table.metadata.current_snapshot()
        if snapshot is None:
            return [], len(table.metadata.snapshots)
        reader = ManifestReader(table.io)  # a fresh one: read what storage really holds
        specs = table.metadata.specs()
        paths = []
        for manifest in await reader.manifests(snapshot):
            for entry in await reader.entries(manifest, specs, live_only=True):
                paths.append(entry.data_file.file_path)
        return paths, len(table.metadata.snapshots)

    def close(self) -> None:
        self._runner.run(self.catalog.close())


@contextlib.contextmanager
def _quiet(logger_name: str) -> Iterator[None]:
    """Mute a logger's warnings: PyIceberg logs one per retried commit, hundreds per run."""
    logger = logging.getLogger(logger_name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


class PyIcebergContender(Contender):
    """PyIceberg's SqlCatalog on a sqlite file, its committers as threads.

    Raises ImportError when PyIceberg (or its SQL extra) is not installed.
    """

    def __init__(self, directory: Path) -> None:
        super().__init__(PEER)
        from pyiceberg.catalog.sql import SqlCatalog
        from pyiceberg.exceptions import CommitFailedException
        from pyiceberg.partitioning import PartitionSpec as PyPartitionSpec
        from pyiceberg.schema import Schema as PySchema

        lock = threading.Lock()
        counts = collections.Counter[str]()
        self._counts = counts

        class CountingSqlCatalog(SqlCatalog):
            """Counts commit attempts and lost races; commits exactly as SqlCatalog does."""

            def commit_table(self, table: Any, requirements: Any, updates: Any) -> Any:
                with lock:
                    counts["attempts"] += 1
                try:
                    return super().commit_table(table, requirements, updates)
                except CommitFailedException:
                    with lock:
                        counts["conflicts"] += 1
                    raise

        directory.mkdir(parents=True, exist_ok=True)
        self.catalog = CountingSqlCatalog(
            "bench",
            uri=f"sqlite:///{directory / 'catalog.db'}",
            warehouse=(directory / "warehouse").as_uri(),
        )
        self.catalog.create_namespace(NAMESPACE)
        self._schema = PySchema.model_validate(SCHEMA.to_json())
        self._spec = PyPartitionSpec.model_validate(SPEC.to_json())

    def _create_table(self, identifier: str) -> tuple[str, str]:
        table = self.catalog.create_table(
            identifier,
            self._schema,
            partition_spec=self._spec,
            properties=dict(RETRY_PROPERTIES),
        )
        return identifier, f"{table.metadata.location.rstrip('/')}/data"

    def _append(self, identifier: str, plan: list[list[AppendedFile]]) -> tuple[int, int]:
        before = self._counts.copy()

        def committer(files: list[AppendedFile]) -> None:
            table = self.catalog.load_table(identifier)
            for f in files:
                transaction = table.transaction()
                with transaction.update_snapshot().fast_append() as append:
                    append.append_data_file(pyiceberg_data_file(f))
                transaction.commit_transaction()

        with _quiet("pyiceberg"), ThreadPoolExecutor(len(plan)) as pool:
            for future in [pool.submit(committer, files) for files in plan]:
                future.result()
        after = self._counts
        return after["attempts"] - before["attempts"], after["conflicts"] - before["conflicts"]

    def _live_files(self, identifier: str) -> tuple[list[str], int]:
        table = self.catalog.load_table(identifier)
        paths = [task.file.file_path for task in table.scan().plan_files()]
        return paths, len(table.metadata.snapshots)

    def close(self) -> None:
        self.catalog.engine.dispose()


# ---------------------------------------------------------------------------------------
# The benchmark
# ---------------------------------------------------------------------------------------


def catalog_uris(stack: LocalStack, directory: Path, bucket: str) -> dict[str, str]:
    """``load_catalog`` URIs of the four catalogs on ``stack``'s servers.

    ``bucket`` must already exist on the stack's S3; local warehouses go under ``directory``.
    """
    redis_query = {"warehouse": (directory / "redis").as_uri(), "prefix": "icefloe-bench"}
    dynamodb_query = {
        "endpoint": stack.dynamodb_endpoint,
        "region": REGION,
        "warehouse": (directory / "dynamodb").as_uri(),
        "dynamodb.access-key-id": ACCESS_KEY_ID,
        "dynamodb.secret-access-key": SECRET_ACCESS_KEY,
    }
    return {
        "fs-local": (directory / "fs").as_uri(),
        "fs-s3": f"s3://{bucket}/warehouse?{urlencode(stack.s3_properties())}",
        "redis": f"{stack.redis_url}?{urlencode(redis_query)}",
        "dynamodb": f"dynamodb://icefloe_bench?{urlencode(dynamodb_query)}",
    }


def committer_counts(largest: int) -> tuple[int, ...]:
    """The standard counts up to ``largest``, and ``largest`` itself (``--set``)."""
    if largest < 1:
        raise ValidationError(f"max_committers must be at least 1, got {largest}")
    return tuple(sorted({n for n in COMMITTER_COUNTS if n < largest} | {largest}))


def run_commit_benchmark(
    ctx: BenchContext, uris: Mapping[str, str], directory: Path, runner: asyncio.Runner
) -> list[Figure]:
    """icefloe on each catalog of ``uris`` beside PyIceberg, for each N committers.

    ``runner`` owns the event loop the catalogs' clients live on; PyIceberg's catalog and
    warehouse go under ``directory``. Sizes: ``appends`` per run (all committers together)
    and ``max_committers`` (the largest N).
    """
    appends = ctx.size("appends", full=48, quick=16)
    counts = committer_counts(ctx.size("max_committers", full=16, quick=16))
    contenders: dict[str, Contender] = {}
    try:
        for name, uri in uris.items():
            contenders[name] = IcefloeContender(name, load_catalog(uri, f"bench-{name}"), runner)
        try:
            contenders[PEER] = PyIcebergContender(directory / "pyiceberg")
        except ImportError as e:
            ctx.note(f"pyiceberg (with its sql extra) is not installed ({e}); no peer figures")
        return measure_commits(ctx, contenders, appends=appends, counts=counts)
    finally:
        for contender in contenders.values():
            contender.close()


def measure_commits(
    ctx: BenchContext,
    contenders: Mapping[str, Contender],
    *,
    appends: int,
    counts: Sequence[int],
) -> list[Figure]:
    """Time every contender in interleaved rounds, for each N in ``counts``.

    Returns one figure per (icefloe contender, N), catalogs in the order given, each with
    the PyIceberg peer (the contender named :data:`PEER`) measured in the same rounds.
    """
    if not counts:
        raise ValidationError("a commit benchmark needs at least one committer count")
    if appends < max(counts):
        raise ValidationError(
            f"appends={appends} cannot keep {max(counts)} committers busy; "
            f"set appends to at least {max(counts)}"
        )
    by_count: dict[int, dict[str, Timing]] = {}
    for n in counts:
        runs: dict[str, Callable[[], object]] = {}
        warmups: dict[str, Warmup] = {}
        for name, contender in contenders.items():
            runs[name] = _bind(contender.run, n, appends, warmup=False)
            # One append per committer warms connections, caches and imports.
            warmups[name] = _bind(contender.run, n, n, warmup=True)
        by_count[n] = ctx.compare(
            runs,
            work=appends,
            setup={name: c.setup for name, c in contenders.items()},
            warmup=warmups,
        )
        for contender in contenders.values():
            contender.settle()
    figures = []
    for name in contenders:
        if name == PEER:
            continue
        for n in counts:
            timings = by_count[n]
            peers = {PEER: timings[PEER]} if PEER in timings else {}
            figures.append(Figure(f"{name} N={n}", "appends/s", timings[name], peers))

    ctx.params["committers"] = "/".join(str(n) for n in counts)
    ctx.params["retry_wait_ms"] = f"{POLICY.min_wait_ms}-{POLICY.max_wait_ms}"
    for n in counts:
        rates = ", ".join(
            f"{name} {c.conflicts_per_commit(n):.2f}" for name, c in contenders.items()
        )
        ctx.note(f"conflicts (each one a retry) per committed append, N={n}: {rates}")
    ctx.note(
        "N committers: N asyncio tasks (icefloe) or N threads (PyIceberg) in one process; "
        "one DataFile per commit, no Parquet; a fresh table per run, checked after it"
    )
    ctx.note(
        f"{PEER}: SqlCatalog on sqlite, local warehouse, transaction fast_append + its own "
        "commit retries; the same peer figure stands beside every catalog"
    )
    return figures


def _bind(
    run: Callable[..., None], committers: int, appends: int, *, warmup: bool
) -> Callable[[], None]:
    def bound() -> None:
        run(committers, appends, warmup=warmup)

    return bound


@benchmark("commits")
def commits_benchmark(ctx: BenchContext) -> list[Figure]:
    """Committed appends/s on one table, 1/4/16 concurrent committers, per catalog."""
    # Started from this thread, which outlives them (the servers' parent-death signal is
    # tied to the starting thread); the event loop below runs on it too.
    with (
        tempfile.TemporaryDirectory(prefix="icefloe-bench-commits-") as tmp,
        LocalStack(redis=True, dynamodb=True, s3=True) as stack,
        asyncio.Runner() as runner,
    ):
        bucket = stack.create_bucket(f"icefloe-bench-{uuid.uuid4().hex[:12]}")
        uris = catalog_uris(stack, Path(tmp), bucket)
        return run_commit_benchmark(ctx, uris, Path(tmp), runner)
