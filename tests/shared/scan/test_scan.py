"""Scan planning over real tables: never miss a file, prune what metrics allow, match PyIceberg.

The tables are written by icefloe itself (Parquet data files with footer metrics, manifests,
commits through a file-system catalog) and evolve the way production tables do: several
appends, a second partition spec, position deletes, an overwrite, a schema change, a tag
and a branch. Random filters in the REST JSON form are then planned three ways:

* by :func:`plan_scan` (the code under test);
* by an oracle that reads every data file back with pyarrow and evaluates the filter on each
  row in plain Python, following the expressions spec (a file holding a matching row must
  be planned);
* by PyIceberg's client-side ``plan_files`` on the same metadata file: our files must be
  the same set or a subset of PyIceberg's (that is still complete, by the oracle). Filters
  with NOT are not compared: PyIceberg negates ``x < v`` into ``x >= v``, dropping the NaN
  and null rows the expressions spec keeps, so its plan is no reference there.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import io
import math
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples
from icefloe.catalog.fs import FileSystemCatalog
from icefloe.deletes.index import DELETE_FILE_PATH_ID
from icefloe.errors import NotFoundError, ValidationError
from icefloe.expressions import AlwaysTrue, EqualTo, GreaterThan, IsNull, LessThan
from icefloe.expressions.json_form import parse_expression
from icefloe.io.fileio import LocalFileIO
from icefloe.manifests.cache import CachedManifest, ManifestCache
from icefloe.parquet.files import write_files
from icefloe.scan.planning import ScanPlan, append_snapshots, plan_scan
from icefloe.spec.datafile import DataFile, DataFileContent
from icefloe.spec.metadata_builder import LAST_ADDED, MetadataBuilder
from icefloe.spec.partition import PartitionSpecBuilder
from icefloe.spec.schema import Schema
from icefloe.spec.snapshot import SnapshotRef
from icefloe.spec.types import (
    DoubleType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
    TimestampType,
)
from icefloe.table.catalog import Table
from icefloe.table.snapshot_producer import fast_append, overwrite_files, row_delta

DAY_US = 86_400_000_000
FIRST_DAY = 19_723  # 2024-01-01
EPOCH = dt.datetime(1970, 1, 1)

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "ts", TimestampType(), required=True),
    NestedField(3, "name", StringType()),
    NestedField(4, "amount", DoubleType()),
    NestedField(5, "category", IntegerType()),
)
ARROW = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("ts", pa.timestamp("us"), nullable=False),
        pa.field("name", pa.string()),
        pa.field("amount", pa.float64()),
        pa.field("category", pa.int32()),
    ]
)


def make_batch(first_id: int, rows: int, first_day: int, days: int) -> pa.Table:
    """Rows with ids rising with time; some nulls, NaNs and signed zeros on the way."""
    ids = list(range(first_id, first_id + rows))
    step = days * DAY_US // rows
    start = (FIRST_DAY + first_day) * DAY_US
    amounts: list[float | None] = []
    for i in ids:
        if i % 17 == 0:
            amounts.append(None)
        elif i % 23 == 0:
            amounts.append(math.nan)
        elif i % 29 == 0:
            amounts.append(-0.0)
        else:
            amounts.append(float((i * 37) % 1000) - 500.0)
    return pa.table(
        {
            "id": ids,
            "ts": [start + k * step for k in range(rows)],
            "name": [None if i % 11 == 0 else f"user-{(i * 7) % 60:03d}" for i in ids],
            "amount": amounts,
            "category": [None if i % 13 == 0 else i % 4 for i in ids],
        },
        schema=ARROW,
    )


# ---------------------------------------------------------------------------------------------
# The table: appends, spec evolution, deletes, an overwrite, refs and a schema change
# ---------------------------------------------------------------------------------------------


class Built:
    """The table and what was written to it (a plain class: hypothesis prints it briefly)."""

    def __init__(
        self,
        metadata_location: str,
        snapshots: dict[str, int],
        files: dict[str, DataFile],
        live: frozenset[str],
        deleted_positions: dict[str, set[int]],
        position_deletes: dict[str, set[str]],
        table: Table,
    ) -> None:
        self.metadata_location = metadata_location
        self.snapshots = snapshots  # step name → snapshot id
        self.files = files  # every data file ever added, by path
        self.live = live  # data files of the current snapshot
        self.deleted_positions = deleted_positions  # data file → positions deleted
        self.position_deletes = position_deletes  # data file → delete files naming it
        self.table = table

    def __repr__(self) -> str:
        return f"Built({self.metadata_location!r})"


class Rows(dict[str, list[dict[str, Any]]]):
    def __repr__(self) -> str:
        return f"Rows({len(self)} files)"


async def _append(table: Table, batch: pa.Table) -> tuple[Table, list[DataFile]]:
    files = await write_files(
        table.io, batch, table.location, schema=table.metadata.schema(), spec=table.metadata.spec()
    )
    return await fast_append(table, files).commit(), files


def _position_delete_file(
    table: Table, target: DataFile, positions: list[int], name: str
) -> DataFile:
    path = f"{table.location}/data/deletes/{name}.parquet"
    delete_table = pa.table(
        {"file_path": [target.file_path] * len(positions), "pos": positions},
        schema=pa.schema(
            [
                pa.field(
                    "file_path",
                    pa.string(),
                    nullable=False,
                    metadata={b"PARQUET:field_id": str(DELETE_FILE_PATH_ID).encode()},
                ),
                pa.field(
                    "pos", pa.int64(), nullable=False, metadata={b"PARQUET:field_id": b"2147483545"}
                ),
            ]
        ),
    )
    buffer = io.BytesIO()
    pq.write_table(delete_table, buffer)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_bytes(buffer.getvalue())
    encoded = target.file_path.encode()
    return DataFile(
        file_path=path,
        file_format="parquet",
        partition=target.partition,
        record_count=len(positions),
        file_size_in_bytes=len(buffer.getvalue()),
        content=DataFileContent.POSITION_DELETES,
        spec_id=target.spec_id,
        lower_bounds={DELETE_FILE_PATH_ID: encoded},
        upper_bounds={DELETE_FILE_PATH_ID: encoded},
        referenced_data_file=target.file_path,
    )


async def build_table(warehouse: Path) -> Built:
    catalog = FileSystemCatalog("scan", str(warehouse), LocalFileIO())
    await catalog.create_namespace("db")
    spec = PartitionSpecBuilder(SCHEMA).add_field("ts", "day").add_field("id", "bucket[4]").build()
    table = await catalog.create_table("db.events", SCHEMA, spec)
    snapshots: dict[str, int] = {}
    files: dict[str, DataFile] = {}

    def mark(step: str) -> None:
        current = table.metadata.current_snapshot()
        assert current is not None
        snapshots[step] = current.snapshot_id

    table, added = await _append(table, make_batch(0, 400, 0, 4))
    files.update((f.file_path, f) for f in added)
    mark("a")
    table, added = await _append(table, make_batch(400, 400, 2, 4))
    files.update((f.file_path, f) for f in added)
    mark("b")

    # Spec evolution: new files are partitioned by category instead.
    evolved = (
        PartitionSpecBuilder(
            SCHEMA,
            spec_id=1,
            last_partition_id=table.metadata.last_partition_id,
            previous_specs=table.metadata.partition_specs,
        )
        .add_field("category", "identity")
        .build()
    )
    metadata = (
        MetadataBuilder(table.metadata)
        .add_partition_spec(evolved)
        .set_default_spec(LAST_ADDED)
        .build(table.metadata_location)
    )
    table = await catalog.commit(table, metadata)
    table, added = await _append(table, make_batch(800, 300, 5, 3))
    files.update((f.file_path, f) for f in added)
    mark("c")

    # Position deletes on two files of the first batch and one of the third.
    ordered = sorted(files.values(), key=lambda f: f.file_path)
    targets = [
        next(f for f in ordered if f.spec_id == 0),
        [f for f in ordered if f.spec_id == 0][3],
        next(f for f in ordered if f.spec_id == 1),
    ]
    deleted_positions: dict[str, set[int]] = {}
    position_deletes: dict[str, set[str]] = {}
    deletes = []
    for k, target in enumerate(targets):
        positions = list(range(0, target.record_count, 3))
        deleted_positions[target.file_path] = set(positions)
        delete = _position_delete_file(table, target, positions, f"pos-{k}")
        position_deletes[target.file_path] = {delete.file_path}
        deletes.append(delete)
    table = await row_delta(table, [], deletes).commit()
    mark("deletes")

    # Overwrite: one file of batch b is replaced by a file holding its first half.
    victim = next(f for f in ordered if f.spec_id == 0 and f.file_path not in deleted_positions)
    rows = pq.read_table(victim.file_path).slice(0, victim.record_count // 2)
    replacement = await write_files(
        table.io, rows.cast(ARROW), table.location, schema=SCHEMA, spec=table.metadata.spec()
    )
    table = await overwrite_files(table, [victim.file_path], replacement).commit()
    files.update((f.file_path, f) for f in replacement)
    mark("overwrite")

    # Refs: a tag on the first snapshot and a branch on the third.
    metadata = (
        MetadataBuilder(table.metadata)
        .set_ref("first", SnapshotRef.tag(snapshots["a"]))
        .set_ref("spec-change", SnapshotRef.branch(snapshots["c"]))
        .build(table.metadata_location)
    )
    table = await catalog.commit(table, metadata)

    # A column added after every snapshot was written.
    grown = Schema(*SCHEMA.fields, NestedField(6, "note", StringType()))
    metadata = (
        MetadataBuilder(table.metadata)
        .add_schema(grown)
        .set_current_schema(LAST_ADDED)
        .build(table.metadata_location)
    )
    table = await catalog.commit(table, metadata)

    live = frozenset(files) - {victim.file_path}
    return Built(
        table.metadata_location,
        snapshots,
        files,
        live,
        deleted_positions,
        position_deletes,
        table,
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    return asyncio.run(build_table(tmp_path_factory.mktemp("scan")))


@pytest.fixture(scope="module")
def rows_by_file(built: Built) -> dict[str, list[dict[str, Any]]]:
    """Every data file's rows as Python values (timestamps as micros), read with pyarrow."""
    out = Rows()
    for path in built.files:
        table = pq.read_table(path)
        table = table.set_column(1, "ts", table.column("ts").cast(pa.int64()))
        out[path] = table.to_pylist()
    return out


def plan(built: Built, **kwargs: Any) -> ScanPlan:
    async def run() -> ScanPlan:
        cache = ManifestCache(LocalFileIO())
        return await plan_scan(built.table.metadata, cache, **kwargs)

    return asyncio.run(run())


def planned(p: ScanPlan) -> set[str]:
    return {t.data_file.file_path for t in p.tasks()}


# ---------------------------------------------------------------------------------------------
# Random filters in the REST (legacy term) JSON form, with a plain-Python oracle
# ---------------------------------------------------------------------------------------------


def _iso(micros: int) -> str:
    return (EPOCH + dt.timedelta(microseconds=micros)).isoformat()


def _micros(text: str) -> int:
    delta = dt.datetime.fromisoformat(text) - EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


LITERALS: dict[str, st.SearchStrategy[Any]] = {
    "id": st.integers(-5, 1200),
    "ts": st.integers((FIRST_DAY - 1) * DAY_US, (FIRST_DAY + 9) * DAY_US).map(_iso),
    "name": st.sampled_from([f"user-{k:03d}" for k in (0, 7, 13, 42, 59, 99)]),
    "amount": st.sampled_from([-500.0, -0.0, 0.0, 1.5, 250.0, 499.0, 1e9]),
    "category": st.integers(-1, 5),
}
PREFIXES = st.sampled_from(["user-0", "user-04", "user-1", "u", "zzz", ""])


@st.composite
def predicate_json(draw: st.DrawFn) -> dict[str, Any]:
    column = draw(st.sampled_from(sorted(LITERALS)))
    ops = ["lt", "lt-eq", "gt", "gt-eq", "eq", "not-eq", "in", "not-in", "is-null", "not-null"]
    if column == "amount":
        ops += ["is-nan", "not-nan"]
    if column == "name":
        ops += ["starts-with", "not-starts-with"]
    op = draw(st.sampled_from(ops))
    if op in ("is-null", "not-null", "is-nan", "not-nan"):
        return {"type": op, "term": column}
    if op in ("in", "not-in"):
        values = draw(st.lists(LITERALS[column], min_size=1, max_size=4, unique=True))
        return {"type": op, "term": column, "values": values}
    if op in ("starts-with", "not-starts-with"):
        return {"type": op, "term": column, "value": draw(PREFIXES)}
    return {"type": op, "term": column, "value": draw(LITERALS[column])}


def filter_json() -> st.SearchStrategy[Any]:
    return st.recursive(
        predicate_json(),
        lambda kids: st.one_of(
            st.builds(lambda a, b: {"type": "and", "left": a, "right": b}, kids, kids),
            st.builds(lambda a, b: {"type": "or", "left": a, "right": b}, kids, kids),
            st.builds(lambda a, b: {"type": "and", "left": a, "right": b}, kids, kids),
            st.builds(lambda a, b: {"type": "or", "left": a, "right": b}, kids, kids),
            kids.map(lambda c: {"type": "not", "child": c}),
        ),
        max_leaves=4,
    )


def holds(expr: Any, row: dict[str, Any]) -> bool:
    """The expressions spec, written out: two-valued logic, nulls and NaNs fail comparisons."""
    kind = expr["type"]
    if kind == "and":
        return holds(expr["left"], row) and holds(expr["right"], row)
    if kind == "or":
        return holds(expr["left"], row) or holds(expr["right"], row)
    if kind == "not":
        return not holds(expr["child"], row)
    column = expr["term"]
    value = row[column]

    def lit(v: Any) -> Any:
        return _micros(v) if column == "ts" else v

    present = value is not None and not (isinstance(value, float) and math.isnan(value))
    if kind == "is-null":
        return value is None
    if kind == "not-null":
        return value is not None
    if kind == "is-nan":
        return isinstance(value, float) and math.isnan(value)
    if kind == "not-nan":
        return not (isinstance(value, float) and math.isnan(value))
    if kind in ("in", "not-in"):
        found = present and value in {lit(v) for v in expr["values"]}
        return found if kind == "in" else not found
    if kind in ("starts-with", "not-starts-with"):
        found = value is not None and value.startswith(expr["value"])
        return found if kind == "starts-with" else not found
    literal = lit(expr["value"])
    if kind == "not-eq":
        return not (present and value == literal)
    if not present:
        return False
    return {
        "lt": value < literal,
        "lt-eq": value <= literal,
        "gt": value > literal,
        "gt-eq": value >= literal,
        "eq": value == literal,
    }[kind]


def _has_not(expr: Any) -> bool:
    if expr["type"] == "not":
        return True
    return any(_has_not(expr[k]) for k in ("left", "right") if k in expr)


def files_holding(
    built: Built, rows_by_file: dict[str, list[dict[str, Any]]], expr: Any, live: set[str]
) -> set[str]:
    return {path for path in live if any(holds(expr, row) for row in rows_by_file[path])}


def pyiceberg_plan(built: Built, expr: Any, snapshot_id: int | None = None) -> dict[str, set[str]]:
    from pydantic import TypeAdapter
    from pyiceberg.expressions import BooleanExpression as PyExpr
    from pyiceberg.table import StaticTable

    table = StaticTable.from_metadata(built.metadata_location)
    row_filter = TypeAdapter(PyExpr).validate_python(expr)
    scan = table.scan(row_filter=row_filter, snapshot_id=snapshot_id)
    return {t.file.file_path: {d.file_path for d in t.delete_files} for t in scan.plan_files()}


@pytest.mark.interop
@settings(
    max_examples=examples(100),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(filter_json())
def test_random_filters_never_miss_a_file_and_agree_with_pyiceberg(
    built: Built, rows_by_file: dict[str, list[dict[str, Any]]], expr: Any
) -> None:
    p = plan(built, row_filter=parse_expression(expr))
    ours = {t.data_file.file_path: t for t in p.tasks()}
    must = files_holding(built, rows_by_file, expr, set(built.live))
    assert must <= set(ours), f"missed {sorted(must - set(ours))}"
    assert set(ours) <= built.live
    try:
        theirs = pyiceberg_plan(built, expr)
    except TypeError:
        # PyIceberg 0.12's residual evaluator compares null partition values with literals
        # and fails; there is nothing to compare with for this filter.
        theirs = None
    event(
        "pyiceberg: "
        + ("failed" if theirs is None else "no reference (not)" if _has_not(expr) else "compared")
    )
    if theirs is not None and not _has_not(expr):
        # Under NOT, PyIceberg rewrites NOT (x < v) as x >= v: it loses rows where x is NaN
        # or null (files it misses) and can prune where the spec's semantics cannot, so it
        # is no reference there; completeness was checked against the rows above.
        assert set(ours) <= set(theirs)
        for path, task in ours.items():
            assert {d.file_path for d in task.delete_files} <= theirs[path]
    for path, task in ours.items():
        assert built.position_deletes.get(path, set()) <= {d.file_path for d in task.delete_files}
    assert len(p) == len(ours) == p.metrics.files_selected


def test_an_unfiltered_scan_plans_every_live_file_with_its_deletes(built: Built) -> None:
    p = plan(built)
    tasks = p.tasks()
    assert {t.data_file.file_path for t in tasks} == built.live
    for t in tasks:
        assert {d.file_path for d in t.delete_files} == built.position_deletes.get(
            t.data_file.file_path, set()
        )
        assert t.residual == AlwaysTrue()
    assert {t.data_file.spec_id for t in tasks} == {0, 1}
    theirs = pyiceberg_plan(built, True)
    assert set(theirs) == built.live
    assert {p: d for p, d in theirs.items() if d} == built.position_deletes


def test_metrics_and_partition_summaries_prune(built: Built) -> None:
    # Days 0-1 exist only in the first batch: later manifests are skipped by their summaries
    # (the spec-1 manifest has no ts field, so its files go to metrics).
    late = plan(built, row_filter=LessThan("ts", _iso((FIRST_DAY + 1) * DAY_US)))
    assert late.metrics.manifests_skipped >= 1
    assert late.metrics.data_files.by_metrics + late.metrics.data_files.by_partition > 0
    # Amounts never exceed 500: column bounds rule out every file.
    none = plan(built, row_filter=GreaterThan("amount", 10_000.0))
    assert len(none) == 0
    assert none.metrics.data_files.by_metrics > 0
    # An id picks one bucket by partition, then one file by its id bounds.
    one = plan(built, row_filter=EqualTo("id", 123))
    assert len(one) == 1
    assert one.metrics.data_files.by_partition > 0


def test_residuals_drop_what_the_partition_proves(built: Built) -> None:
    day = FIRST_DAY + 1
    expr = parse_expression(
        {
            "type": "and",
            "left": {"type": "gt-eq", "term": "ts", "value": _iso(day * DAY_US)},
            "right": {"type": "lt", "term": "ts", "value": _iso((day + 1) * DAY_US)},
        }
    )
    p = plan(built, row_filter=expr)
    spec0 = [t for t in p.tasks() if t.data_file.spec_id == 0]
    assert spec0 and all(t.residual == AlwaysTrue() for t in spec0)
    spec1 = [t for t in p.tasks() if t.data_file.spec_id == 1]
    assert all(t.residual != AlwaysTrue() for t in spec1)


def test_time_travel_by_snapshot_ref_and_timestamp(built: Built) -> None:
    first = plan(built, snapshot_id=built.snapshots["a"])
    tagged = plan(built, ref="first")
    assert planned(first) == planned(tagged)
    assert all(t.delete_files == () for t in first.tasks())
    assert planned(first) < built.live | planned(first)
    branch = plan(built, ref="spec-change")
    assert {t.data_file.spec_id for t in branch.tasks()} == {0, 1}
    log = built.table.metadata.snapshot_log
    at_b = next(e for e in log if e.snapshot_id == built.snapshots["b"])
    assert planned(plan(built, as_of_ms=at_b.timestamp_ms)) == planned(
        plan(built, snapshot_id=built.snapshots["b"])
    )
    assert planned(plan(built, snapshot_id=built.snapshots["a"])) == set(
        pyiceberg_plan(built, True, built.snapshots["a"])
    )


def test_unknown_snapshots_refs_and_times_are_not_found(built: Built) -> None:
    with pytest.raises(NotFoundError, match="no snapshot 42"):
        plan(built, snapshot_id=42)
    with pytest.raises(NotFoundError, match="no branch or tag 'nope'"):
        plan(built, ref="nope")
    with pytest.raises(NotFoundError, match="no snapshot was current"):
        plan(built, as_of_ms=1)
    with pytest.raises(ValidationError, match="at most one"):
        plan(built, snapshot_id=built.snapshots["a"], ref="first")


def test_incremental_append_scans(built: Built) -> None:
    s = built.snapshots
    after_a = plan(built, start_snapshot_id=s["a"], end_snapshot_id=s["c"])
    added_b_c = {
        p for p, f in built.files.items() if p in planned(plan(built, snapshot_id=s["c"]))
    } - planned(plan(built, snapshot_id=s["a"]))
    assert planned(after_a) == added_b_c
    assert all(t.delete_files == () for t in after_a.tasks())
    # Only the deletes and the overwrite follow c: no appends, no files.
    assert len(plan(built, start_snapshot_id=s["c"], end_snapshot_id=s["overwrite"])) == 0
    everything = plan(built, end_snapshot_id=s["c"])
    assert planned(everything) == planned(plan(built, snapshot_id=s["c"]))
    filtered = plan(
        built, start_snapshot_id=s["a"], end_snapshot_id=s["c"], row_filter=IsNull("name")
    )
    assert planned(filtered) <= planned(after_a)
    appends = append_snapshots(built.table.metadata, s["a"], s["overwrite"])
    assert [x.snapshot_id for x in appends] == [s["b"], s["c"]]
    with pytest.raises(ValidationError, match="not an ancestor"):
        plan(built, start_snapshot_id=s["c"], end_snapshot_id=s["a"])
    with pytest.raises(NotFoundError):
        plan(built, start_snapshot_id=s["a"], end_snapshot_id=42)
    with pytest.raises(ValidationError, match="end-snapshot-id is required"):
        plan(built, start_snapshot_id=s["a"])
    with pytest.raises(ValidationError, match="cannot also use"):
        plan(built, start_snapshot_id=s["a"], end_snapshot_id=s["c"], ref="first")


def test_schema_selection_stats_fields_and_bad_columns(built: Built) -> None:
    s = built.snapshots
    on_new_column = parse_expression({"type": "is-null", "term": "note"})
    assert len(plan(built, row_filter=on_new_column)) == len(built.live)
    with pytest.raises(ValidationError, match="no column 'note'"):
        plan(built, snapshot_id=s["a"], use_snapshot_schema=True, row_filter=on_new_column)
    p = plan(built, select=["id", "NAME"], case_sensitive=False, stats_fields=["amount", "id"])
    assert [f.name for f in p.projected_schema.fields] == ["id", "name"]
    assert p.stats_field_ids == {1, 4}
    with pytest.raises(ValidationError, match="cannot select 'nope'"):
        plan(built, select=["nope"])
    with pytest.raises(ValidationError, match="stats-fields names column 'nope'"):
        plan(built, stats_fields=["nope"])
    with pytest.raises(ValidationError, match="no column 'Name'"):
        plan(built, row_filter=parse_expression({"type": "is-null", "term": "Name"}))


def test_tasks_are_built_lazily_for_any_range(built: Built) -> None:
    p = plan(built, row_filter=parse_expression({"type": "not-null", "term": "category"}))
    everything = p.tasks()
    assert len(everything) == len(p)
    pages = [p.tasks(start, start + 7) for start in range(0, len(p), 7)]
    assert [t.data_file.file_path for page in pages for t in page] == [
        t.data_file.file_path for t in everything
    ]
    assert p.tasks(len(p), len(p) + 5) == []
    assert p.tasks(5, 2) == []


def test_a_table_without_snapshots_plans_nothing(tmp_path: Path) -> None:
    async def run() -> ScanPlan:
        catalog = FileSystemCatalog("scan", str(tmp_path), LocalFileIO())
        await catalog.create_namespace("db")
        table = await catalog.create_table("db.empty", SCHEMA)
        return await plan_scan(table.metadata, ManifestCache(table.io))

    p = asyncio.run(run())
    assert len(p) == 0 and p.snapshot is None and p.tasks() == []


def test_equality_deletes_are_attached_by_sequence_number(tmp_path: Path) -> None:
    async def run() -> tuple[Table, list[DataFile], ScanPlan]:
        catalog = FileSystemCatalog("scan", str(tmp_path), LocalFileIO())
        await catalog.create_namespace("db")
        table = await catalog.create_table("db.eq", SCHEMA)
        table, first = await _append(table, make_batch(0, 50, 0, 1))
        delete = DataFile(
            f"{table.location}/data/eq-delete.parquet",
            "parquet",
            (),
            1,
            10,
            content=DataFileContent.EQUALITY_DELETES,
            equality_ids=[1],
        )
        table = await row_delta(table, [], [delete]).commit()
        table, second = await _append(table, make_batch(50, 50, 0, 1))
        p = await plan_scan(table.metadata, ManifestCache(table.io), offload=False)
        return table, first + second, p

    _, files, p = asyncio.run(run())
    by_path = {t.data_file.file_path: t for t in p.tasks()}
    assert set(by_path) == {f.file_path for f in files}
    older = [t for t in by_path.values() if t.data_sequence_number == 1]
    newer = [t for t in by_path.values() if t.data_sequence_number == 3]
    assert older and newer
    assert all(
        [d.file_path for d in t.delete_files] == [f"{tmp_path}/db/eq/data/eq-delete.parquet"]
        for t in older
    )
    assert all(t.delete_files == () for t in newer)


def test_a_held_plan_pins_no_cached_manifest(built: Built) -> None:
    """A plan keeps compact copies of its selected rows, so the cache's manifests die on
    eviction and the plan's memory is that of what it returns."""
    import gc
    import weakref

    async def run() -> tuple[ScanPlan, list[weakref.ref[Any]], ManifestCache]:
        cache = ManifestCache(LocalFileIO())
        p = await plan_scan(
            built.table.metadata,
            cache,
            row_filter=parse_expression({"type": "not-null", "term": "category"}),
        )
        refs = [weakref.ref(v) for v in cache._items.values() if isinstance(v, CachedManifest)]
        return p, refs, cache

    p, refs, cache = asyncio.run(run())
    before = [t.data_file.file_path for t in p.tasks()]
    cache.clear()
    gc.collect()
    alive = [r for r in refs if r() is not None]
    # Manifests all of whose rows were selected are shared, not copied; the rest are gone.
    assert len(alive) < len(refs)
    assert [t.data_file.file_path for t in p.tasks()] == before
    assert p.nbytes > 0


def test_tasks_without_metrics_differ_only_in_the_metric_maps(built: Built) -> None:
    import dataclasses

    p = plan(built, row_filter=parse_expression({"type": "not-null", "term": "category"}))
    maps = (
        "column_sizes",
        "value_counts",
        "null_value_counts",
        "nan_value_counts",
        "lower_bounds",
        "upper_bounds",
    )
    full, lean = p.tasks(), p.tasks(with_metrics=False)
    assert len(full) == len(lean) > 0
    for a, b in zip(full, lean):
        assert all(getattr(b.data_file, m) is None for m in maps)
        assert dataclasses.replace(a.data_file, **{m: None for m in maps}) == b.data_file
        assert (a.delete_files, a.residual, a.data_sequence_number) == (
            b.delete_files,
            b.residual,
            b.data_sequence_number,
        )


def test_compiled_filters_are_shared_only_by_the_same_request(built: Built) -> None:
    """Plans with the same filter share its compiled projections; a filter that differs only
    by the sign of a zero (equal as expressions) is compiled apart, and every plan is the
    one a fresh compilation gives."""
    from icefloe.scan import planning as scan_module

    filters = [
        {"type": "lt", "term": "amount", "value": 0.0},
        {"type": "lt", "term": "amount", "value": -0.0},
        {"type": "gt-eq", "term": "amount", "value": 0.0},
        {"type": "gt-eq", "term": "amount", "value": -0.0},
    ]
    cached = [planned(plan(built, row_filter=parse_expression(f))) for f in filters]
    again = [planned(plan(built, row_filter=parse_expression(f))) for f in filters]
    fresh = []
    for f in filters:
        scan_module._COMPILED._items.clear()
        fresh.append(planned(plan(built, row_filter=parse_expression(f))))
    assert cached == again == fresh
    schema = built.table.metadata.schema()
    keys = {
        scan_module._CompiledCache.key(
            built.table.metadata, schema, scan_module.ScanRequest(row_filter=parse_expression(f))
        )
        for f in filters
    }
    assert len(keys) == len(filters)
