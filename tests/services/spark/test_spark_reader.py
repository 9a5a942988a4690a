"""icefloe's Spark reader: DataFrames from the planner's scan tasks.

The Spark tests read tables written by :func:`icefloe.spark.write` and changed under it
(schema evolution, delete files) through the planner service (``conftest.py``), which
prunes files but leaves the rows of the files it keeps to the reader's residual filter.
The planning client's handling of the REST protocol (asynchronous plans, plan tasks, delete
file references, errors) is checked against a scripted server. The property tests check
the reader's Arrow filters and equality-delete matching against the core's row-at-a-time
evaluator and a plain Python set, without Spark.
"""

from __future__ import annotations

import datetime as dt
import decimal
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from hypothesis import given, settings
from hypothesis import strategies as hs
from pyspark.sql import SparkSession

import icefloe.spark as ispark
from hypothesis_budget import examples
from icefloe.arrow.schema import FIELD_ID_KEY, to_arrow_array
from icefloe.errors import NotFoundError, ValidationError
from icefloe.expressions import (
    And,
    BooleanExpression,
    EqualTo,
    GreaterThanOrEqual,
    In,
    IsNaN,
    IsNull,
    LessThan,
    Not,
    NotEqualTo,
    NotIn,
    NotNaN,
    NotNull,
    NotStartsWith,
    Or,
    StartsWith,
)
from icefloe.expressions.binding import bind
from icefloe.expressions.evaluators import Evaluator
from icefloe.parquet.files import ParquetFileWriter
from icefloe.spark.config import SparkConfig
from icefloe.spark.read_tasks import equality_delete_mask, filter_mask
from icefloe.spec.datafile import DataFile, DataFileContent
from icefloe.spec.metadata_builder import MetadataBuilder
from icefloe.spec.schema import Schema
from icefloe.spec.schema_update import UpdateSchema
from icefloe.spec.types import (
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
    StructType,
)
from icefloe.table.catalog import TableIdentifier
from icefloe.table.snapshot_producer import row_delta

BASIC = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "cat", StringType()),
    NestedField(3, "v", DoubleType()),
)


def _rows(spark: SparkSession, name: str, config: Any, **kwargs: Any) -> list[dict[str, Any]]:
    frame = ispark.read(spark, name, config=config, **kwargs)
    return sorted((r.asDict(recursive=True) for r in frame.collect()), key=lambda r: r["id"])


# -- filters and deletes as Arrow masks (no Spark; before the Spark tests start the stack) ------

FLAT = Schema(
    NestedField(1, "a", LongType()),
    NestedField(2, "b", DoubleType()),
    NestedField(3, "c", StringType()),
    NestedField(4, "d", DateType()),
    NestedField(5, "e", DecimalType(6, 2)),
    NestedField(6, "f", BooleanType()),
    NestedField(7, "s", StructType(NestedField(8, "x", LongType()))),
)

_values = {
    "a": hs.none() | hs.integers(-5, 5),
    "b": hs.none() | hs.sampled_from([-1.5, 0.0, -0.0, 2.0, float("nan"), float("inf")]),
    "c": hs.none() | hs.sampled_from(["", "a", "ab", "abc", "b", "ba"]),
    "d": hs.none() | hs.integers(-3, 3),
    "e": hs.none() | hs.sampled_from([decimal.Decimal(x) for x in ("-1.00", "0.00", "1.50")]),
    "f": hs.none() | hs.booleans(),
    "x": hs.none() | hs.integers(-2, 2),
}
_struct_row = hs.tuples(
    _values["a"], _values["b"], _values["c"], _values["d"], _values["e"], _values["f"],
    hs.none() | hs.tuples(_values["x"]),
)  # fmt: skip


def _leaf() -> Any:
    def literal_for(column: str) -> Any:
        return {
            "a": hs.integers(-5, 5),
            "b": hs.sampled_from([-1.5, 0.0, 2.0]),
            "c": hs.sampled_from(["", "a", "ab", "b"]),
            "d": hs.dates(dt.date(1969, 12, 29), dt.date(1970, 1, 4)),
            "e": hs.sampled_from([decimal.Decimal("0.00"), decimal.Decimal("1.50")]),
            "f": hs.booleans(),
            "s.x": hs.integers(-2, 2),
        }[column]

    def predicate(column: str) -> Any:
        comparisons: list[Any] = [EqualTo, NotEqualTo, LessThan, GreaterThanOrEqual]
        if column == "f":
            comparisons = [EqualTo, NotEqualTo]
        options = [
            hs.sampled_from([IsNull, NotNull]).map(lambda op: op(column)),
            hs.tuples(hs.sampled_from(comparisons), literal_for(column)).map(
                lambda t: t[0](column, t[1])
            ),
            hs.tuples(
                hs.sampled_from([In, NotIn]), hs.lists(literal_for(column), min_size=1, max_size=3)
            ).map(lambda t: t[0](column, t[1])),
        ]
        if column == "b":
            options.append(hs.sampled_from([IsNaN, NotNaN]).map(lambda op: op(column)))
        if column == "c":
            options.append(
                hs.tuples(hs.sampled_from([StartsWith, NotStartsWith]), literal_for("c")).map(
                    lambda t: t[0](column, t[1])
                )
            )
        return hs.one_of(options)

    return hs.sampled_from(["a", "b", "c", "d", "e", "f", "s.x"]).flatmap(predicate)


_expressions = hs.recursive(
    _leaf(),
    lambda inner: hs.one_of(
        hs.tuples(inner, inner).map(lambda t: And(*t)),
        hs.tuples(inner, inner).map(lambda t: Or(*t)),
        inner.map(Not),
    ),
    max_leaves=6,
)


def _arrow_table(rows: list[tuple[Any, ...]]) -> pa.Table:
    columns = {
        f.name: to_arrow_array(f.field_type, [r[i] for r in rows])
        for i, f in enumerate(FLAT.fields)
    }
    return pa.table(columns)


@settings(max_examples=examples(150), deadline=None)
@given(rows=hs.lists(_struct_row, max_size=25), expr=_expressions)
def test_arrow_filters_agree_with_the_row_evaluator(
    rows: list[tuple[Any, ...]], expr: BooleanExpression
) -> None:
    bound = bind(FLAT, expr)
    evaluator = Evaluator(FLAT, bound)
    mask = filter_mask(_arrow_table(rows), FLAT, bound).to_pylist()
    assert mask == [evaluator(row) for row in rows]


_keys = hs.tuples(hs.none() | hs.integers(0, 3), hs.none() | hs.sampled_from(["x", "y"]))


@settings(max_examples=examples(200), deadline=None)
@given(data=hs.lists(_keys, max_size=30), deletes=hs.lists(_keys, max_size=6))
def test_equality_deletes_match_null_to_null(
    data: list[tuple[Any, Any]], deletes: list[tuple[Any, Any]]
) -> None:
    def columns(rows: list[tuple[Any, Any]]) -> list[pa.Array]:
        return [
            pa.array([r[0] for r in rows], pa.int64()),
            pa.array([r[1] for r in rows], pa.large_string()),
        ]

    mask = equality_delete_mask(columns(data), columns(deletes)).to_pylist()
    assert mask == [row in set(deletes) for row in data]


# -- the planning client against a scripted server (no Spark) -------------------------------------


def _content(path: str, content: str = "data") -> dict[str, Any]:
    return {
        "spec-id": 0,
        "content": content,
        "file-path": path,
        "file-format": "parquet",
        "partition": [],
        "file-size-in-bytes": 10,
        "record-count": 1,
        "lower-bounds": {"keys": [1], "values": [1]},
    }


class ScriptedPlanner:
    """Answers planning requests from a script: each route pops its next response."""

    def __init__(self, script: dict[str, list[tuple[int, Any]]]) -> None:
        self.script = script
        self.calls: list[tuple[str, Any]] = []

    def app(self) -> web.Application:
        app = web.Application()
        base = "/v1/pre/namespaces/{ns}/tables/{table}"
        app.router.add_post(base + "/plan", self._handler("plan"))
        app.router.add_get(base + "/plan/{plan_id}", self._handler("fetch"))
        app.router.add_delete(base + "/plan/{plan_id}", self._handler("cancel"))
        app.router.add_post(base + "/tasks", self._handler("tasks"))
        return app

    def _handler(self, route: str) -> Any:
        async def handle(request: web.Request) -> web.Response:
            body = await request.json() if request.can_read_body else None
            self.calls.append((route, body or dict(request.match_info)))
            status, payload = self.script[route].pop(0)
            if status == 204:
                return web.Response(status=204)
            return web.json_response(payload, status=status)

        return handle


async def _serve(planner: ScriptedPlanner) -> TestServer:
    server = TestServer(planner.app())
    await server.start_server()
    return server


async def test_the_planning_client_polls_pages_and_inlines_deletes() -> None:
    pages = {
        "plan": [(200, {"status": "submitted", "plan-id": "p1"})],
        "fetch": [
            (200, {"status": "submitted"}),
            (
                200,
                {
                    "status": "completed",
                    "plan-tasks": ["t1"],
                    "delete-files": [_content("d1", "position-deletes")],
                    "file-scan-tasks": [
                        {"data-file": _content("a"), "delete-file-references": [0]}
                    ],
                },
            ),
        ],
        "tasks": [
            (
                200,
                {
                    "plan-tasks": ["t2"],
                    "file-scan-tasks": [
                        {"data-file": _content("b"), "residual-filter": {"type": "true"}}
                    ],
                },
            ),
            (200, {"file-scan-tasks": [{"data-file": _content("c")}]}),
        ],
    }
    planner = ScriptedPlanner(pages)
    server = await _serve(planner)
    try:
        client = ispark.PlannerClient(str(server.make_url("/")), prefix="pre")
        request = {"snapshot-id": 7, "filter": {"type": "eq", "term": "x", "value": 1}}
        plan = await client.plan(TableIdentifier(("a", "b"), "t"), request)
    finally:
        await server.close()
    assert [t["data-file"]["file-path"] for t in plan.tasks] == ["a", "b", "c"]
    assert [d["file-path"] for d in plan.tasks[0]["delete-files"]] == ["d1"]
    assert "lower-bounds" not in plan.tasks[0]["data-file"]  # stats are not shipped to tasks
    assert plan.tasks[1]["residual-filter"] == {"type": "true"}
    # A task without a residual gets the request's filter, as the REST spec says.
    assert plan.tasks[2]["residual-filter"] == request["filter"]
    assert planner.calls[0] == ("plan", request)
    assert [route for route, _ in planner.calls] == ["plan", "fetch", "fetch", "tasks", "tasks"]
    assert planner.calls[3][1] == {"plan-task": "t1"}


async def test_the_planning_client_reports_failures_and_releases_plans() -> None:
    error = {"error": {"message": "no column x", "type": "BadRequestException", "code": 400}}
    planner = ScriptedPlanner(
        {
            "plan": [
                (400, error),
                (404, {"error": {"message": "gone", "type": "NoSuchTableException"}}),
                (200, {"status": "submitted", "plan-id": "p2"}),
                (200, {"status": "completed", "plan-id": "p3", "plan-tasks": ["t9"]}),
            ],
            "fetch": [(200, {"status": "failed", "error": {"message": "out of memory"}})],
            "tasks": [(500, {"error": {"message": "boom", "type": "ServerError"}})],
            "cancel": [(204, None), (204, None)],
        }
    )
    server = await _serve(planner)
    client = ispark.PlannerClient(str(server.make_url("/")), prefix="pre")
    table = TableIdentifier(("ns",), "t")
    try:
        with pytest.raises(ValidationError, match="no column x"):
            await client.plan(table, {})
        with pytest.raises(NotFoundError, match="gone"):
            await client.plan(table, {})
        with pytest.raises(ispark.PlanningError, match="out of memory"):
            await client.plan(table, {})
        with pytest.raises(ispark.PlanningError, match=r"boom"):
            await client.plan(table, {})
    finally:
        await server.close()
    cancelled = [body["plan_id"] for route, body in planner.calls if route == "cancel"]
    assert cancelled == ["p2", "p3"]  # unfinished plans are released


# -- Spark reads ------------------------------------------------------------------------------------


@pytest.mark.integration
def test_filters_projections_and_time_travel(spark: SparkSession, spark_stack: Any) -> None:
    name = spark_stack.create_table(BASIC)
    config = spark_stack.config
    cats = ["a", "b", None]
    first = spark.createDataFrame(
        [(i, cats[i % 3], i / 2) for i in range(10)], "id long, cat string, v double"
    )
    snapshot = ispark.write(first.repartition(3), name, config=config)
    ispark.write(
        spark.createDataFrame(
            [(i, "a", 0.0) for i in range(10, 14)], "id long, cat string, v double"
        ),
        name,
        config=config,
    )
    assert len(spark_stack.live_files(name)) > 2  # the plan is paged through plan tasks
    everything = _rows(spark, name, config)
    assert [r["id"] for r in everything] == list(range(14))

    selected = _rows(
        spark,
        name,
        config,
        filter=And(GreaterThanOrEqual("id", 5), EqualTo("cat", "a")),
        columns=["id"],
    )
    assert selected == [{"id": i} for i in (6, 9, 10, 11, 12, 13)]
    not_a = _rows(spark, name, config, filter=NotEqualTo("cat", "a"), columns=["id", "v"])
    assert [r["id"] for r in not_a] == [1, 2, 4, 5, 7, 8]  # null != 'a' holds, as specified
    as_json = _rows(spark, name, config, filter={"type": "is-null", "term": "cat"})
    assert [r["id"] for r in as_json] == [2, 5, 8]
    # a filter as people write it, and as JSON text, select the same rows
    written = _rows(spark, name, config, filter="id >= 5 and cat = 'a'", columns=["id"])
    assert written == selected
    as_text = _rows(spark, name, config, filter='{"type": "is-null", "term": "cat"}')
    assert as_text == as_json
    old = _rows(spark, name, config, snapshot_id=snapshot)
    assert [r["id"] for r in old] == list(range(10))


@pytest.mark.integration
def test_reads_of_missing_things_fail_clearly(spark: SparkSession, spark_stack: Any) -> None:
    name = spark_stack.create_table(BASIC)
    config = spark_stack.config
    assert ispark.read(spark, name, config=config).count() == 0  # no snapshot yet
    with pytest.raises(ValidationError, match="nope"):
        ispark.read(spark, name, filter=EqualTo("nope", 1), config=config)
    with pytest.raises(NotFoundError):
        ispark.read(spark, name, snapshot_id=123, config=config)
    planner_only = SparkConfig(planner_url=spark_stack.config.planner_url)
    with pytest.raises(NotFoundError):
        ispark.read(spark, "spark.no_such_table", config=planner_only)
    unreachable = SparkConfig(planner_url="http://127.0.0.1:9", planner_timeout_s=5)
    with pytest.raises(ispark.PlanningError, match="cannot reach"):
        ispark.read(spark, name, config=unreachable)


@pytest.mark.integration
def test_reads_follow_schema_evolution(spark: SparkSession, spark_stack: Any) -> None:
    schema = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "i", IntegerType()),
        NestedField(3, "f", FloatType()),
        NestedField(4, "old", StringType()),
        NestedField(5, "gone", StringType()),
        NestedField(6, "st", StructType(NestedField(7, "a", IntegerType()))),
        NestedField(8, "price", DecimalType(6, 2)),
        NestedField(9, "day", DateType()),
    )
    name = spark_stack.create_table(schema, format_version=3)
    config = spark_stack.config
    df = spark.createDataFrame(
        [
            (1, 10, 1.5, "x", "g1", (1,), decimal.Decimal("1.25"), dt.date(2024, 1, 2)),
            (2, None, None, None, None, None, None, None),
        ],
        "id long, i int, f float, old string, gone string, st struct<a:int>, "
        "price decimal(6,2), day date",
    )
    before = ispark.write(df, name, config=config)

    async def evolve() -> None:
        table = await spark_stack.catalog.load_table(name)
        metadata = table.metadata
        update = (
            UpdateSchema(metadata.schema(), metadata.last_column_id, metadata.format_version)
            .rename_column("old", "renamed")
            .delete_column("gone")
            .update_column("i", LongType())
            .update_column("f", DoubleType())
            .update_column("price", DecimalType(10, 2))
            .add_column("added", StringType(), initial_default="dflt")
            .add_column("opt", LongType())
            .add_column("st.b", IntegerType(), initial_default=7)
        )
        new_schema, last_column_id = update.apply()
        new_metadata = (
            MetadataBuilder(metadata)
            .add_schema(new_schema, last_column_id)
            .set_current_schema(-1)
            .build(table.metadata_location)
        )
        await spark_stack.catalog.commit(table, new_metadata)

    spark_stack.run(evolve())
    frame = ispark.read(spark, name, config=config)
    assert frame.schema.simpleString() == (
        "struct<id:bigint,i:bigint,f:double,renamed:string,st:struct<a:int,b:int>,"
        "price:decimal(10,2),day:date,added:string,opt:bigint>"
    )
    rows = sorted((r.asDict(recursive=True) for r in frame.collect()), key=lambda r: r["id"])
    assert rows == [
        {
            "id": 1,
            "i": 10,
            "f": 1.5,
            "renamed": "x",
            "st": {"a": 1, "b": 7},
            "price": decimal.Decimal("1.25"),
            "day": dt.date(2024, 1, 2),
            "added": "dflt",
            "opt": None,
        },
        {
            "id": 2,
            "i": None,
            "f": None,
            "renamed": None,
            "st": None,
            "price": None,
            "day": None,
            "added": "dflt",
            "opt": None,
        },
    ]
    # Time travel reads with the snapshot's own schema.
    old = ispark.read(spark, name, snapshot_id=before, config=config)
    assert old.columns == ["id", "i", "f", "old", "gone", "st", "price", "day"]
    assert sorted(r.gone or "" for r in old.collect()) == ["", "g1"]


def _write_position_deletes(path: Path, data_path: str, positions: Sequence[int]) -> int:
    table = pa.table(
        {
            "file_path": pa.array([data_path] * len(positions), pa.string()),
            "pos": pa.array(positions, pa.int64()),
        },
        schema=pa.schema(
            [
                pa.field("file_path", pa.string(), False, {FIELD_ID_KEY: b"2147483546"}),
                pa.field("pos", pa.int64(), False, {FIELD_ID_KEY: b"2147483545"}),
            ]
        ),
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return path.stat().st_size


@pytest.mark.integration
def test_reads_apply_position_and_equality_deletes(spark: SparkSession, spark_stack: Any) -> None:
    name = spark_stack.create_table(BASIC)
    config = spark_stack.config
    cats = ["a", "b", None, "c"]
    rows = [(i, cats[i % 4], float(i)) for i in range(20)]
    ispark.write(
        spark.createDataFrame(rows, "id long, cat string, v double").coalesce(1),
        name,
        config=config,
    )
    table = spark_stack.load(name)
    schema = table.metadata.schema()
    (data_file,) = spark_stack.live_files(name)
    location = table.metadata.location
    from icefloe.parquet.files import read_data_file

    in_file = read_data_file(data_file.file_path, schema).column("id").to_pylist()
    doomed_positions = [0, 5, 6]
    doomed_by_position = {in_file[p] for p in doomed_positions}

    delete_path = f"{location}/data/deletes-{uuid.uuid4().hex}.parquet"
    size = _write_position_deletes(
        Path(delete_path.removeprefix("file://")), data_file.file_path, doomed_positions
    )
    position_deletes = DataFile(
        delete_path,
        "parquet",
        (),
        len(doomed_positions),
        size,
        content=DataFileContent.POSITION_DELETES,
    )
    equality_schema = schema.select(["cat"])
    equality_path = f"{location}/data/eq-deletes-{uuid.uuid4().hex}.parquet"
    writer = ParquetFileWriter(equality_path, schema=equality_schema)
    writer.write(pa.table({"cat": pa.array(["b", None], pa.large_string())}))
    equality_deletes = writer.close().copy(
        content=DataFileContent.EQUALITY_DELETES, equality_ids=[schema.find_field_id("cat")]
    )

    async def commit() -> None:
        current = await spark_stack.catalog.load_table(name)
        await row_delta(current, [], [position_deletes, equality_deletes]).commit()

    spark_stack.run(commit())
    expected = [i for i, cat, _ in rows if i not in doomed_by_position and cat not in ("b", None)]
    assert [r["id"] for r in _rows(spark, name, config)] == expected
    # Equality deletes only reach older data: a "b" row written afterwards stays.
    ispark.write(
        spark.createDataFrame([(100, "b", 1.0)], "id long, cat string, v double"),
        name,
        config=config,
    )
    assert [r["id"] for r in _rows(spark, name, config, columns=["id"])] == [*expected, 100]
    # The delete columns are read even when the projection leaves them out.
    filtered = _rows(spark, name, config, columns=["id"], filter=LessThan("v", 10.0))
    assert [r["id"] for r in filtered] == [*(i for i in expected if i < 10), 100]

    # A delete column dropped from the table still deletes (spec: Equality Delete Files).
    async def drop_cat() -> None:
        current = await spark_stack.catalog.load_table(name)
        metadata = current.metadata
        dropped, last_column_id = (
            UpdateSchema(metadata.schema(), metadata.last_column_id, metadata.format_version)
            .delete_column("cat")
            .apply()
        )
        new_metadata = (
            MetadataBuilder(metadata)
            .add_schema(dropped, last_column_id)
            .set_current_schema(-1)
            .build(current.metadata_location)
        )
        await spark_stack.catalog.commit(current, new_metadata)

    spark_stack.run(drop_cat())
    after_drop = _rows(spark, name, config)
    assert [r["id"] for r in after_drop] == [*expected, 100]
    assert set(after_drop[0]) == {"id", "v"}
