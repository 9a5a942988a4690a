"""Upserts beside Apache Iceberg Java's own ``MERGE INTO`` (merge-on-read) on Spark 3.5.

The same change batches as the ``upsert`` benchmark (:func:`~icefloe.dev.bench_upsert.
change_batches`: each ``batch`` distinct keys out of ``keys``, a tenth of them deletes) are
applied ``commits`` times, one commit per batch, to a fresh v3 keyed table (``--set
java_format_version=2`` for v2) two ways:

* **icefloe**: the batch's data file and key file written (Parquet, as a CDC writer would)
  and committed as an upsert unit through the coordinator's committer (the key index
  resolves the keys into DVs);
* **Java MERGE INTO**: Iceberg Java 1.10.2 in a Spark 3.5 session (``local[1]``), the table
  in a HadoopCatalog, ``write.merge.mode=merge-on-read``; each batch is a Parquet file of
  ``(id, value, ord, op)`` written before the clock starts, and one statement per batch::

      MERGE INTO t USING (SELECT * FROM parquet.`batch`) s ON t.id = s.id
      WHEN MATCHED AND s.op = 'd' THEN DELETE
      WHEN MATCHED THEN UPDATE SET t.value = s.value, t.ord = s.ord
      WHEN NOT MATCHED AND s.op <> 'd' THEN INSERT (id, value, ord) VALUES (...)

  which Spark plans, joins against the table, writes data and DV files for, and commits.

Both figures include writing the new rows' Parquet (Java's MERGE writes them itself) and
exclude starting Spark. Each timed run starts from an empty table; after each, both tables
are checked against the last-write-wins fold of the batches, so a wrong answer never makes
a figure.

Java runs in the interop environment ``.venv-java`` (``make setup``:
deploy/setup_java_interop.sh), driven through the interop tests' driver
(``tests/java_iceberg.py``), so this benchmark runs from a checkout. Where Java, its jars
or the driver are missing, the report says so and the figure is left out.
"""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from icefloe.coordinator.committer import TableCommitter
from icefloe.dev.bench import BenchContext, Figure, benchmark
from icefloe.dev.bench_upsert import (
    SOURCE,
    Batch,
    UpsertRun,
    batch_files,
    change_batches,
    commit_upserts,
    fold,
    pyiceberg_read,
)
from icefloe.table.catalog import Table

REPO = Path(__file__).resolve().parents[3]
JAVA_MERGE = "Java Iceberg 1.10.2 MERGE INTO (Spark 3.5, merge-on-read)"
MOR = {
    "write.delete.mode": "merge-on-read",
    "write.update.mode": "merge-on-read",
    "write.merge.mode": "merge-on-read",
}


def _java_iceberg() -> Any:
    """The interop tests' :class:`JavaIceberg` class, loaded from the checkout."""
    path = REPO / "tests" / "java_iceberg.py"
    spec = importlib.util.spec_from_file_location("icefloe_bench_java_iceberg", path)
    if spec is None or spec.loader is None or not path.exists():
        raise ImportError(f"{path} is missing (the benchmark runs from a checkout)")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.JavaIceberg


def merge_source(batch: Batch) -> pa.Table:
    """The batch as MERGE's source: every touched key, with its new row or ``op = 'd'``."""
    rows = batch.rows
    deleted = pc.invert(pc.is_in(batch.keys["id"], value_set=rows["id"]))
    gone = batch.keys.filter(deleted)
    n = gone.num_rows
    return pa.concat_tables(
        [
            rows.append_column("op", pa.array(["u"] * rows.num_rows)),
            pa.table(
                {
                    "id": gone["id"],
                    "value": pa.nulls(n, pa.string()),
                    "ord": pa.nulls(n, pa.int64()),
                    "op": pa.array(["d"] * n),
                }
            ),
        ]
    )


def merge_statement(table: str, source: str) -> str:
    return (
        f"MERGE INTO {table} t USING (SELECT * FROM parquet.`{source}`) s ON t.id = s.id "
        "WHEN MATCHED AND s.op = 'd' THEN DELETE "
        "WHEN MATCHED THEN UPDATE SET t.value = s.value, t.ord = s.ord "
        "WHEN NOT MATCHED AND s.op <> 'd' THEN INSERT (id, value, ord) "
        "VALUES (s.id, s.value, s.ord)"
    )


@benchmark("java-merge")
def java_merge_benchmark(ctx: BenchContext) -> list[Figure]:
    """Upserts: icefloe's commits beside Java Iceberg's MERGE INTO on Spark 3.5."""
    commits = ctx.size("java_commits", full=20, quick=5)
    batch = ctx.size("batch", full=2_000, quick=500)
    keys = ctx.size("keys", full=100_000, quick=5_000)
    version = ctx.size("java_format_version", full=3, quick=3)
    try:
        java = _java_iceberg()()
    except Exception as e:  # ImportError, JavaIcebergError: not installed where this runs
        ctx.note(
            f"Java Iceberg is not available here ({type(e).__name__}: {str(e)[:300]}); the "
            "MERGE INTO figure is left out (make setup installs it)"
        )
        return []
    batches = change_batches(commits, batch, keys)
    expected = fold(batches)
    work = sum(b.keys.num_rows for b in batches)
    try:
        with asyncio.Runner() as runner:
            run = UpsertRun(runner, version)
            try:
                return [_figure(ctx, run, java, batches, expected, work, commits)]
            finally:
                run.close()
    finally:
        java.close()


def _figure(
    ctx: BenchContext,
    run: UpsertRun,
    java: Any,
    batches: Sequence[Batch],
    expected: pa.Table,
    work: int,
    commits: int,
) -> Figure:
    warehouse = run.root / "java"
    sources = []
    for i, b in enumerate(batches):
        path = run.root / "merge-sources" / f"batch-{i:05d}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(merge_source(b), path)
        sources.append(str(path))
    names = itertools.count()
    state: dict[str, Any] = {}

    def java_setup() -> None:
        name = f"{{cat}}.db.merge_{next(names)}"
        properties = ", ".join(
            f"'{k}' = '{v}'" for k, v in {**MOR, "format-version": str(run.version)}.items()
        )
        java.sql(warehouse, "CREATE NAMESPACE IF NOT EXISTS {cat}.db")
        java.sql(
            warehouse,
            f"CREATE TABLE {name} (id BIGINT NOT NULL, value STRING, ord BIGINT) USING iceberg "
            f"TBLPROPERTIES ({properties})",
        )
        state["java"] = name

    def java_merges() -> None:
        for source in sources:
            java.sql(warehouse, merge_statement(state["java"], source))

    def java_check() -> None:
        count = java.sql(warehouse, f"SELECT count(*) AS n FROM {state['java']}")[0]["n"]
        if count != expected.num_rows:
            raise AssertionError(f"Java's table has {count} rows, the fold {expected.num_rows}")

    def icefloe_setup() -> None:
        state["icefloe"] = run.table("upsert_vs_merge")

    def icefloe_upserts() -> None:
        table: Table = state["icefloe"]
        files = batch_files(table, batches)  # the writer's Parquet: MERGE writes its own
        committer = TableCommitter(run.catalog, table.identifier, SOURCE)
        run.runner.run(commit_upserts(committer, table, files))

    def icefloe_check() -> None:
        got = pyiceberg_read(run.load(state["icefloe"]).metadata_location)
        if got.num_rows != expected.num_rows:
            raise AssertionError(
                f"icefloe's table has {got.num_rows} rows, not {expected.num_rows}"
            )

    def checked(go: Callable[[], None], check: Callable[[], None]) -> Callable[[], None]:
        def both() -> None:
            go()
            check()

        return both

    # The check runs on the clock too: a small read of the result, on both sides.
    timings = ctx.compare(
        {
            "icefloe": checked(icefloe_upserts, icefloe_check),
            JAVA_MERGE: checked(java_merges, java_check),
        },
        work=work,
        setup={"icefloe": icefloe_setup, JAVA_MERGE: java_setup},
        # Warm-up: the first batch once (Spark's planning and the JVM's JIT, imports and
        # the key index's first open), on the table the setup before it made.
        warmup={
            "icefloe": lambda: run.runner.run(
                commit_upserts(
                    TableCommitter(run.catalog, state["icefloe"].identifier, SOURCE),
                    state["icefloe"],
                    batch_files(state["icefloe"], batches[:1]),
                )
            ),
            JAVA_MERGE: lambda: java.sql(warehouse, merge_statement(state["java"], sources[0])),
        },
    )
    ctx.note(
        f"java-merge: {commits} batches of {len(batches[0].keys)} keys ({work} keys touched), "
        f"format v{run.version}, one commit per batch, each run on an empty table after a "
        "warm-up of one batch (JIT, Spark planning); both sides "
        "include writing the new rows' Parquet and a row count of the result; Spark local[1] "
        "(started once, outside the clock)"
    )
    return Figure(
        f"upsert commits beside MERGE INTO, {commits} batches",
        "rows/s",
        icefloe=timings["icefloe"],
        peers={JAVA_MERGE: timings[JAVA_MERGE]},
    )
