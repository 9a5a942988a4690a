"""PyIceberg's RestCatalog against the planner: server-side planning, the same rows.

The real client: PyIceberg 0.12 reads ``/v1/config``, sees ``scan-planning-mode=server`` and
the planning endpoints, and from then on plans every scan through ``POST .../plan`` (paging
through plan tasks) instead of reading manifests itself. The table evolves its partition
spec, carries position deletes and an overwrite, so the plans carry delete files and files
of two specs. Every scan must return the rows PyIceberg returns when it plans client-side
from the same metadata file, and the rows a plain pyarrow oracle computes from the written
files (deleted positions removed).

Partition values are never null here: PyIceberg 0.12's REST models refuse a null partition
value (which the REST spec's content-file form allows), so such tables cannot be planned
server-side by this client.
"""

from __future__ import annotations

import asyncio
import io
import logging
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from icefloe.catalog.fs import FileSystemCatalog
from icefloe.deletes.index import DELETE_FILE_PATH_ID
from icefloe.io.fileio import LocalFileIO
from icefloe.parquet.files import write_files
from icefloe.planner.app import PlannerService
from icefloe.planner.config import PlannerConfig
from icefloe.spec.datafile import DataFile, DataFileContent
from icefloe.spec.metadata_builder import LAST_ADDED, MetadataBuilder
from icefloe.spec.partition import PartitionSpecBuilder
from icefloe.spec.schema import Schema
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

pytestmark = pytest.mark.interop

TOKEN = "planner-token"
DAY_US = 86_400_000_000
FIRST_DAY = 19_723
SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "ts", TimestampType(), required=True),
    NestedField(3, "name", StringType()),
    NestedField(4, "amount", DoubleType()),
    NestedField(5, "category", IntegerType(), required=True),
)
ARROW = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("ts", pa.timestamp("us"), nullable=False),
        pa.field("name", pa.string()),
        pa.field("amount", pa.float64()),
        pa.field("category", pa.int32(), nullable=False),
    ]
)


def batch(first: int, rows: int, first_day: int, days: int) -> pa.Table:
    ids = list(range(first, first + rows))
    step = days * DAY_US // rows
    return pa.table(
        {
            "id": ids,
            "ts": [(FIRST_DAY + first_day) * DAY_US + k * step for k in range(rows)],
            "name": [None if i % 7 == 0 else f"user-{(i * 13) % 40:02d}" for i in ids],
            "amount": [None if i % 11 == 0 else float((i * 31) % 500) for i in ids],
            "category": [i % 5 for i in ids],
        },
        schema=ARROW,
    )


class Written:
    def __init__(self, warehouse: Path) -> None:
        self.warehouse = warehouse
        self.metadata_location = ""
        self.snapshots: list[int] = []
        self.live: set[str] = set()
        self.deleted: dict[str, set[int]] = {}  # data file → deleted positions
        self.delete_files: dict[str, str] = {}  # data file → its position delete file

    def __repr__(self) -> str:
        return f"Written({self.warehouse})"

    def rows(self, predicate: pc.Expression | None = None) -> list[dict[str, Any]]:
        """The oracle: live files read with pyarrow, deleted positions dropped, filtered."""
        tables = []
        for path in sorted(self.live):
            table = pq.read_table(path)
            gone = self.deleted.get(path, set())
            keep = pa.array([i not in gone for i in range(table.num_rows)])
            tables.append(table.filter(keep).select(ARROW.names).cast(ARROW))
        data = pa.concat_tables(tables)
        if predicate is not None:
            data = data.filter(predicate)
        return _sorted(data)


def _sorted(table: pa.Table) -> list[dict[str, Any]]:
    return table.select(ARROW.names).sort_by("id").to_pylist()


async def _append(table: Table, data: pa.Table) -> tuple[Table, list[DataFile]]:
    files = await write_files(
        table.io, data, table.location, schema=table.metadata.schema(), spec=table.metadata.spec()
    )
    return await fast_append(table, files).commit(), files


def _delete_file(table: Table, target: DataFile, positions: list[int]) -> DataFile:
    path = Path(table.location) / "data" / "deletes" / f"{Path(target.file_path).stem}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    data = pa.table(
        {"file_path": [target.file_path] * len(positions), "pos": positions},
        schema=pa.schema([pa.field("file_path", pa.string()), pa.field("pos", pa.int64())]),
    )
    buffer = io.BytesIO()
    pq.write_table(data, buffer)
    path.write_bytes(buffer.getvalue())
    encoded = target.file_path.encode()
    return DataFile(
        str(path),
        "parquet",
        target.partition,
        len(positions),
        len(buffer.getvalue()),
        content=DataFileContent.POSITION_DELETES,
        spec_id=target.spec_id,
        lower_bounds={DELETE_FILE_PATH_ID: encoded},
        upper_bounds={DELETE_FILE_PATH_ID: encoded},
        referenced_data_file=target.file_path,
    )


async def write_table(warehouse: Path) -> Written:
    out = Written(warehouse)
    catalog = FileSystemCatalog("rest", str(warehouse), LocalFileIO())
    await catalog.create_namespace("db")
    spec = PartitionSpecBuilder(SCHEMA).add_field("ts", "day").add_field("id", "bucket[4]").build()
    table = await catalog.create_table("db.events", SCHEMA, spec)
    files: list[DataFile] = []
    table, added = await _append(table, batch(0, 500, 0, 4))
    files += added
    out.snapshots.append(table.metadata.current_snapshot().snapshot_id)  # type: ignore[union-attr]
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
    table, added = await _append(table, batch(500, 300, 3, 3))
    files += added
    out.snapshots.append(table.metadata.current_snapshot().snapshot_id)  # type: ignore[union-attr]
    targets = [files[0], files[5], next(f for f in files if f.spec_id == 1)]
    deletes = []
    for target in targets:
        positions = list(range(1, target.record_count, 4))
        out.deleted[target.file_path] = set(positions)
        delete = _delete_file(table, target, positions)
        out.delete_files[target.file_path] = delete.file_path
        deletes.append(delete)
    table = await row_delta(table, [], deletes).commit()
    out.snapshots.append(table.metadata.current_snapshot().snapshot_id)  # type: ignore[union-attr]
    victim = next(f for f in files if f.file_path not in out.deleted and f.spec_id == 0)
    half = pq.read_table(victim.file_path).slice(0, victim.record_count // 2).cast(ARROW)
    replacement = await write_files(
        table.io, half, table.location, schema=SCHEMA, spec=table.metadata.spec()
    )
    table = await overwrite_files(table, [victim.file_path], replacement).commit()
    out.snapshots.append(table.metadata.current_snapshot().snapshot_id)  # type: ignore[union-attr]
    out.live = {f.file_path for f in files + replacement} - {victim.file_path}
    out.metadata_location = table.metadata_location
    return out


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Written:
    return asyncio.run(write_table(tmp_path_factory.mktemp("rest")))


@pytest.fixture(scope="module")
def planner_url(written: Written) -> Iterator[str]:
    """The planner on a free port in its own thread (PyIceberg's client is synchronous)."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    holder: dict[str, Any] = {}

    def run() -> None:
        asyncio.set_event_loop(loop)

        async def start() -> None:
            config = PlannerConfig(
                catalog=f"file://{written.warehouse}",
                host="127.0.0.1",
                port=0,
                token=TOKEN,
                tasks_per_page=5,
            )
            catalog = FileSystemCatalog("rest", str(written.warehouse), LocalFileIO())
            service = PlannerService(config, catalog)
            await service.start()
            holder["service"] = service

        loop.run_until_complete(start())
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=run, name="planner-for-pyiceberg", daemon=True)
    thread.start()
    ready.wait()
    service: PlannerService = holder["service"]
    yield service.url
    asyncio.run_coroutine_threadsafe(service.stop(), loop).result()
    loop.call_soon_threadsafe(loop.stop)
    thread.join()
    loop.close()


@pytest.fixture(scope="module")
def rest(planner_url: str) -> Any:
    from pyiceberg.catalog.rest import RestCatalog

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PyIceberg's notice about oauth2-server-uri
        return RestCatalog("planner", uri=planner_url, token=TOKEN)


def _static(written: Written) -> Any:
    from pyiceberg.table import StaticTable

    return StaticTable.from_metadata(written.metadata_location)


def test_the_client_switches_to_server_side_planning(rest: Any, written: Written) -> None:
    assert rest.supports_server_side_planning()
    assert rest.list_namespaces() == [("db",)]
    assert rest.list_tables("db") == [("db", "events")]
    assert rest.namespace_exists("db") and not rest.namespace_exists("nope")
    assert rest.table_exists("db.events") and not rest.table_exists("db.nope")
    table = rest.load_table("db.events")
    assert table.metadata_location == written.metadata_location
    assert table.metadata == _static(written).metadata


def test_a_wrong_token_is_refused(planner_url: str) -> None:
    from pyiceberg.catalog.rest import RestCatalog
    from pyiceberg.exceptions import UnauthorizedError

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(UnauthorizedError):
            RestCatalog("planner", uri=planner_url, token="wrong")


def _filters() -> list[tuple[str, Any, pc.Expression | None]]:
    from pyiceberg.expressions import (
        AlwaysTrue,
        And,
        EqualTo,
        GreaterThanOrEqual,
        In,
        IsNull,
        LessThan,
        Not,
        NotNull,
        Or,
        StartsWith,
    )

    lo, hi = (FIRST_DAY + 1) * DAY_US, (FIRST_DAY + 4) * DAY_US + 6 * 3_600_000_000
    ts = pa.timestamp("us")
    return [
        ("everything", AlwaysTrue(), None),
        (
            "ts range across both specs",
            And(
                GreaterThanOrEqual("ts", "2024-01-02T00:00:00"),
                LessThan("ts", "2024-01-05T06:00:00"),
            ),
            (pc.field("ts") >= pa.scalar(lo, ts)) & (pc.field("ts") < pa.scalar(hi, ts)),
        ),
        ("one id", EqualTo("id", 321), pc.field("id") == 321),
        ("ids in two specs", In("id", {3, 250, 640}), pc.field("id").isin([3, 250, 640])),
        ("a name prefix", StartsWith("name", "user-1"), pc.starts_with(pc.field("name"), "user-1")),
        ("null names", IsNull("name"), pc.field("name").is_null()),
        (
            "category or amount",
            Or(EqualTo("category", 2), LessThan("amount", 20.0)),
            (pc.field("category") == 2) | (pc.field("amount") < 20.0),
        ),
        (
            "not small amounts",
            And(NotNull("amount"), Not(LessThan("amount", 250.0))),
            pc.field("amount") >= 250.0,
        ),
    ]


@pytest.mark.parametrize("case", _filters(), ids=lambda c: c[0])
def test_server_planned_scans_return_the_rows_of_client_planning(
    rest: Any, written: Written, case: tuple[str, Any, pc.Expression | None]
) -> None:
    _, row_filter, oracle = case
    server = rest.load_table("db.events").scan(row_filter=row_filter)
    client = _static(written).scan(row_filter=row_filter)
    expected = written.rows(oracle)
    assert _sorted(server.to_arrow()) == expected
    assert _sorted(client.to_arrow()) == expected
    server_tasks = {t.file.file_path: t for t in server.plan_files()}
    client_tasks = {t.file.file_path: t for t in client.plan_files()}
    if "Not(" not in repr(row_filter):
        # Under NOT, PyIceberg drops the null and NaN rows the spec keeps (x >= v for
        # NOT x < v): it may prune files the spec's semantics cannot, so only rows count.
        assert set(server_tasks) <= set(client_tasks)
    for path, task in server_tasks.items():
        deletes = {d.file_path for d in task.delete_files}
        assert deletes == ({written.delete_files[path]} if path in written.delete_files else set())
        if path in client_tasks:
            assert deletes == {d.file_path for d in client_tasks[path].delete_files}
    holding = {
        path
        for path in written.live
        if oracle is None or pq.read_table(path).cast(ARROW).filter(oracle).num_rows
    }
    assert holding <= set(server_tasks)


def test_time_travel_through_the_rest_client(rest: Any, written: Written) -> None:
    first = written.snapshots[0]
    server = rest.load_table("db.events").scan(snapshot_id=first)
    client = _static(written).scan(snapshot_id=first)
    rows = _sorted(server.to_arrow())
    assert rows == _sorted(client.to_arrow())
    assert len(rows) == 500
    assert all(t.delete_files == set() for t in server.plan_files())


def test_column_selection_and_counts(rest: Any, written: Written) -> None:
    from pyiceberg.expressions import LessThan

    table = rest.load_table("db.events")
    selected = table.scan(row_filter=LessThan("id", 50), selected_fields=("id", "name")).to_arrow()
    assert selected.column_names == ["id", "name"]
    assert sorted(selected.column("id").to_pylist()) == [
        r["id"] for r in written.rows(pc.field("id") < 50)
    ]
    assert table.scan().count() == len(written.rows())


def test_the_access_log_shows_the_client_planning_through_plan_and_tasks(
    rest: Any, written: Written, caplog: pytest.LogCaptureFixture
) -> None:
    """Proof from the server's side: a PyIceberg scan is answered by ``/plan`` and (pages of
    five tasks) ``/tasks`` requests, and returns the rows of local planning."""
    with caplog.at_level(logging.INFO, logger="icefloe.access"):
        rows = rest.load_table("db.events").scan().to_arrow()
    answered = [
        (r.method, r.route, r.status)  # type: ignore[attr-defined]
        for r in caplog.records
        if r.name == "icefloe.access"
    ]
    base = "/v1/namespaces/{namespace}/tables/{table}"
    assert ("POST", base + "/plan", 200) in answered
    assert ("POST", base + "/tasks", 200) in answered
    assert _sorted(rows) == _sorted(_static(written).scan().to_arrow())
