"""Catalogs: one contract, checked against every pointer store icefloe ships.

The same suite runs on file-system tables on a local disk and on S3 (SeaweedFS), on Redis and on
DynamoDB (dynalite); the server-backed legs are integration tests. Each test gets a fresh
warehouse, key prefix or DynamoDB table, so tests never see each other's namespaces.

The concurrency test is the commit protocol's acceptance test: 16 committers racing 25
appends each must end with every file exactly once in a linear history, with nothing
referenced missing and nothing a losing attempt wrote left behind. PyIceberg then reads the
result, through its own StaticTable and (for DynamoDB) its own catalog.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import boto3
import pytest

from icefloe.catalog.dynamodb import DynamoDbCatalog
from icefloe.catalog.fs import FileSystemCatalog
from icefloe.catalog.redis import RedisCatalog
from icefloe.catalog.uri import load_catalog
from icefloe.errors import (
    AlreadyExistsError,
    CommitFailedError,
    CommitStateUnknownError,
    NotFoundError,
    ValidationError,
)
from icefloe.io.fileio import FileIO, LocalFileIO, S3FileIO
from icefloe.manifests.reader import ManifestReader
from icefloe.spec.datafile import DataFile
from icefloe.spec.metadata_builder import MetadataBuilder, new_table_metadata
from icefloe.spec.partition import PartitionField, PartitionSpec
from icefloe.spec.schema import Schema
from icefloe.spec.snapshot import SnapshotRef, Summary
from icefloe.spec.sort_order import SortOrder
from icefloe.spec.transforms import BucketTransform, DayTransform, IdentityTransform
from icefloe.spec.types import LongType, NestedField, StringType, TimestampType
from icefloe.table.catalog import (
    DELETE_AFTER_COMMIT,
    PREVIOUS_VERSIONS_MAX,
    Catalog,
    Table,
    TableIdentifier,
    data_dir,
    metadata_dir,
    metadata_version,
    parse_namespace,
)
from icefloe.table.commit import RetryPolicy
from icefloe.table.snapshot_producer import fast_append
from servers import S3Endpoint

COMMITTERS = 16
# Ten appends each (160 commits) keep the committers racing long after the first, forced
# 16-way conflict; every commit rewrites the whole snapshot log, so the time grows with the
# square of the total (400 commits took 27-69 s per catalog in CI for the same law).
APPENDS_PER_COMMITTER = 10

# --------------------------------------------------------------------------------------
# The catalogs under test
# --------------------------------------------------------------------------------------


@dataclass
class CatalogCase:
    """A catalog on a fresh store, plus what it takes to open a second client on it."""

    kind: str
    catalog: Catalog
    warehouse: str
    # A load_catalog() URI for the same store: a second, independent client.
    uri: str
    # FileIO properties a PyIceberg reader needs for the warehouse.
    read_properties: dict[str, str] = field(default_factory=dict)
    extra: dict[str, str] = field(default_factory=dict)

    def open_second(self) -> Catalog:
        return load_catalog(self.uri, name=f"{self.kind}-second")


@pytest.fixture
def scratch_dir(tmp_path: Path) -> Iterator[Path]:
    """A scratch folder, on tmpfs when the machine has one.

    Every commit fsyncs what it writes; on a disk those flushes, not the commit protocol,
    would decide how long the concurrency tests take.
    """
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        folder = Path(tempfile.mkdtemp(prefix="icefloe-catalog-test-", dir=shm))
        try:
            yield folder
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    else:
        yield tmp_path


FS_LOCAL = pytest.param("fs-local", id="fs-local")
FS_S3 = pytest.param("fs-s3", marks=pytest.mark.integration, id="fs-s3")
REDIS = pytest.param("redis", marks=pytest.mark.integration, id="redis")
DYNAMODB = pytest.param("dynamodb", marks=pytest.mark.integration, id="dynamodb")


def open_case(
    kind: str, request: pytest.FixtureRequest, scratch: Path, catalog_class: Any = None
) -> CatalogCase:
    """A catalog of ``kind`` on a store no other test uses.

    ``catalog_class`` substitutes a subclass (for fault injection), built the same way.
    """
    local_wh = str(scratch / "warehouse")
    if kind == "fs-local":
        cls = catalog_class or FileSystemCatalog
        catalog = cls("local", local_wh, LocalFileIO())
        return CatalogCase(kind, catalog, local_wh, local_wh)
    if kind == "fs-s3":
        s3: S3Endpoint = request.getfixturevalue("s3_server")
        props = s3.file_io_properties()
        warehouse = f"s3://{s3.create_bucket()}/warehouse"
        cls = catalog_class or FileSystemCatalog
        catalog = cls("s3", warehouse, S3FileIO.from_properties(props), props)
        uri = f"{warehouse}?{urlencode(props)}"
        return CatalogCase(kind, catalog, warehouse, uri, read_properties=props)
    if kind == "redis":
        url: str = request.getfixturevalue("redis_server")
        prefix = f"t{uuid.uuid4().hex[:12]}"
        cls = catalog_class or RedisCatalog
        catalog = cls("redis", url, LocalFileIO(), {"warehouse": local_wh}, prefix=prefix)
        uri = f"{url}?{urlencode({'warehouse': local_wh, 'prefix': prefix})}"
        return CatalogCase(kind, catalog, local_wh, uri, extra={"prefix": prefix})
    if kind == "dynamodb":
        endpoint: str = request.getfixturevalue("dynalite")
        table_name = f"iceberg_{uuid.uuid4().hex[:12]}"
        cls = catalog_class or DynamoDbCatalog
        catalog = cls(
            "dynamodb",
            LocalFileIO(),
            {"warehouse": local_wh},
            table_name=table_name,
            endpoint_url=endpoint,
            region="us-east-1",
            access_key_id="testing",
            secret_access_key="testing",
        )
        query = {
            "endpoint": endpoint,
            "region": "us-east-1",
            "warehouse": local_wh,
            "dynamodb.access-key-id": "testing",
            "dynamodb.secret-access-key": "testing",
        }
        uri = f"dynamodb://{table_name}?{urlencode(query)}"
        extra = {"table_name": table_name, "endpoint": endpoint}
        return CatalogCase(kind, catalog, local_wh, uri, extra=extra)
    raise AssertionError(f"unknown catalog kind {kind}")


@pytest.fixture(params=[FS_LOCAL, FS_S3, REDIS, DYNAMODB])
async def case(request: pytest.FixtureRequest, scratch_dir: Path) -> AsyncIterator[CatalogCase]:
    opened = open_case(request.param, request, scratch_dir)
    try:
        yield opened
    finally:
        await opened.catalog.close()


@pytest.fixture(params=[REDIS, DYNAMODB])
async def metastore_case(
    request: pytest.FixtureRequest, scratch_dir: Path
) -> AsyncIterator[CatalogCase]:
    opened = open_case(request.param, request, scratch_dir)
    try:
        yield opened
    finally:
        await opened.catalog.close()


@pytest.fixture(params=[FS_LOCAL, FS_S3])
async def fs_case(request: pytest.FixtureRequest, scratch_dir: Path) -> AsyncIterator[CatalogCase]:
    opened = open_case(request.param, request, scratch_dir)
    try:
        yield opened
    finally:
        await opened.catalog.close()


# --------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------


def events_schema() -> Schema:
    return Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "ts", TimestampType()),
        NestedField(3, "category", StringType()),
    )


def events_spec() -> PartitionSpec:
    """By category, day and a bucket of the id (source ids as the caller numbered them)."""
    return PartitionSpec(
        0,
        (
            PartitionField(3, 1000, "category", IdentityTransform()),
            PartitionField(2, 1001, "ts_day", DayTransform()),
            PartitionField(1, 1002, "id_bucket", BucketTransform(8)),
        ),
    )


def data_file(table: Table, name: str, *, category: str = "a", day: int = 19_000) -> DataFile:
    """A data file record for the events table; commits never open the file itself."""
    return DataFile(
        file_path=f"{data_dir(table.metadata)}/category={category}/{name}.parquet",
        file_format="parquet",
        partition=(category, day, len(name) % 8),
        record_count=10,
        file_size_in_bytes=1000,
    )


async def make_table(catalog: Catalog, name: str = "ns.events", **kwargs: Any) -> Table:
    ident = TableIdentifier.parse(name)
    if not await catalog.namespace_exists(ident.namespace):
        await catalog.create_namespace(ident.namespace)
    return await catalog.create_table(ident, events_schema(), events_spec(), **kwargs)


async def list_paths(io: FileIO, prefix: str) -> list[str]:
    return [info.path async for info in io.list(prefix)]


async def live_paths(table: Table) -> list[str]:
    snapshot = table.metadata.current_snapshot()
    if snapshot is None:
        return []
    reader = ManifestReader(table.io)
    out = []
    for manifest in await reader.manifests(snapshot):
        for entry in await reader.entries(manifest, table.metadata.specs(), live_only=True):
            out.append(entry.data_file.file_path)
    return out


def quick_retries() -> RetryPolicy:
    return RetryPolicy(num_retries=50, min_wait_ms=1, max_wait_ms=20)


def pyiceberg_paths(metadata_location: str, properties: dict[str, str]) -> list[str]:
    from pyiceberg.table import StaticTable

    table = StaticTable.from_metadata(metadata_location, properties=properties)
    return [task.file.file_path for task in table.scan().plan_files()]


# --------------------------------------------------------------------------------------
# Namespaces
# --------------------------------------------------------------------------------------


async def test_namespace_create_list_and_properties(case: CatalogCase) -> None:
    catalog = case.catalog
    await catalog.create_namespace("sales", {"owner": "ana", "tier": "gold"})
    await catalog.create_namespace(("sales", "emea"))
    await catalog.create_namespace("sales.emea.de", {"country": "DE"})
    await catalog.create_namespace("ops")

    assert await catalog.list_namespaces() == [("ops",), ("sales",)]
    assert await catalog.list_namespaces("sales") == [("sales", "emea")]
    assert await catalog.list_namespaces(("sales", "emea")) == [("sales", "emea", "de")]
    assert await catalog.list_namespaces("sales.emea.de") == []
    assert await catalog.namespace_exists("sales.emea")
    assert not await catalog.namespace_exists("sales.apac")

    with pytest.raises(AlreadyExistsError, match="sales"):
        await catalog.create_namespace("sales")

    assert await catalog.load_namespace_properties("sales") == {"owner": "ana", "tier": "gold"}
    assert await catalog.load_namespace_properties("sales.emea") == {}
    assert await catalog.load_namespace_properties("sales.emea.de") == {"country": "DE"}
    await catalog.update_namespace_properties(
        "sales", removals={"tier", "never-set"}, updates={"owner": "bo", "team": "x"}
    )
    assert await catalog.load_namespace_properties("sales") == {"owner": "bo", "team": "x"}
    await catalog.update_namespace_properties("sales", removals={"team"})
    assert await catalog.load_namespace_properties("sales") == {"owner": "bo"}

    with pytest.raises(NotFoundError, match="apac"):
        await catalog.load_namespace_properties("sales.apac")
    with pytest.raises(NotFoundError, match="apac"):
        await catalog.update_namespace_properties("sales.apac", updates={"a": "b"})


async def test_drop_namespace_refuses_non_empty(case: CatalogCase) -> None:
    catalog = case.catalog
    await catalog.create_namespace("parent")
    await catalog.create_namespace("parent.child")
    await make_table(catalog, "parent.child.t")

    with pytest.raises(ValidationError, match=re.escape("parent.child")):
        await catalog.drop_namespace("parent.child")  # holds a table
    with pytest.raises(ValidationError, match="parent"):
        await catalog.drop_namespace("parent")  # holds a namespace
    assert await catalog.namespace_exists("parent.child")
    assert await catalog.table_exists("parent.child.t")

    await catalog.drop_table("parent.child.t")
    await catalog.drop_namespace("parent.child")
    await catalog.drop_namespace("parent")
    assert await catalog.list_namespaces() == []
    with pytest.raises(NotFoundError, match="parent"):
        await catalog.drop_namespace("parent")


def test_namespace_and_identifier_parsing() -> None:
    assert parse_namespace("a.b") == ("a", "b")
    assert parse_namespace(("a",)) == ("a",)
    ident = TableIdentifier.parse("a.b.t")
    assert (ident.namespace, ident.name, str(ident)) == (("a", "b"), "t", "a.b.t")
    assert TableIdentifier.parse(ident) is ident
    for bad in ("", "a..b", ".a"):
        with pytest.raises(ValidationError, match="namespace"):
            parse_namespace(bad)
    for bad_ident in ("t", "a.", ".t", "a..t"):
        with pytest.raises(ValidationError, match="identifier"):
            TableIdentifier.parse(bad_ident)


# --------------------------------------------------------------------------------------
# Tables
# --------------------------------------------------------------------------------------


async def test_create_load_list_and_exists(case: CatalogCase) -> None:
    catalog = case.catalog
    created = await make_table(catalog, "ns.events", properties={"owner": "ana"})
    await make_table(catalog, "ns.clicks")

    assert [f.name for f in created.metadata.spec().fields] == ["category", "ts_day", "id_bucket"]
    assert created.metadata.properties["owner"] == "ana"
    # file-system tables live where their name says; metastore tables under <ns>.db
    layout = "ns" if isinstance(catalog, FileSystemCatalog) else "ns.db"
    assert created.location == f"{case.warehouse}/{layout}/events"
    assert await catalog.io.exists(created.metadata_location)

    loaded = await catalog.load_table("ns.events")
    assert loaded.metadata_location == created.metadata_location
    assert loaded.metadata.table_uuid == created.metadata.table_uuid
    assert loaded.metadata.schema() == created.metadata.schema()
    assert loaded.metadata.spec() == created.metadata.spec()
    assert loaded.metadata.current_snapshot() is None

    assert await catalog.list_tables("ns") == [
        TableIdentifier(("ns",), "clicks"),
        TableIdentifier(("ns",), "events"),
    ]
    assert await catalog.table_exists("ns.events")
    assert not await catalog.table_exists("ns.nope")

    with pytest.raises(AlreadyExistsError, match=re.escape("ns.events")):
        await make_table(catalog, "ns.events")
    # the refused create left no metadata file in the existing table's folder
    folder = await list_paths(catalog.io, metadata_dir(created.metadata))
    assert [p for p in folder if p.endswith(".metadata.json")] == [created.metadata_location]
    with pytest.raises(NotFoundError, match="nope"):
        await catalog.load_table("ns.nope")
    with pytest.raises(NotFoundError, match="missing"):
        await catalog.create_table("missing.t", events_schema())
    with pytest.raises(NotFoundError, match="missing"):
        await catalog.list_tables("missing")

    second = case.open_second()  # an independent client sees the same tables
    try:
        again = await second.load_table("ns.events")
        assert again.metadata_location == created.metadata_location
        assert await second.list_tables("ns") == await catalog.list_tables("ns")
    finally:
        await second.close()


async def test_create_table_in_each_format_version(case: CatalogCase) -> None:
    for version in (1, 2, 3):
        table = await make_table(case.catalog, f"ns.v{version}", format_version=version)
        table = await fast_append(table, [data_file(table, "f")]).commit(quick_retries())
        loaded = await case.catalog.load_table(f"ns.v{version}")
        assert loaded.metadata.format_version == version
        assert loaded.metadata.current_snapshot_id == table.metadata.current_snapshot_id
        assert await live_paths(loaded) == [data_file(table, "f").file_path]


async def test_register_table(case: CatalogCase) -> None:
    catalog = case.catalog
    await catalog.create_namespace("ns")
    ident = TableIdentifier.parse("ns.registered")
    metadata = new_table_metadata(
        events_schema(),
        events_spec(),
        SortOrder.unsorted(),
        await catalog.default_table_location(ident),
        {"origin": "elsewhere"},
    )
    staged = f"{case.warehouse}/staging/{uuid.uuid4()}.metadata.json"
    await catalog.io.write(staged, metadata.to_json_bytes())

    registered = await catalog.register_table(ident, staged)
    assert registered.metadata.table_uuid == metadata.table_uuid
    loaded = await catalog.load_table(ident)
    assert loaded.metadata.table_uuid == metadata.table_uuid
    assert loaded.metadata.properties["origin"] == "elsewhere"
    assert await catalog.list_tables("ns") == [ident]

    with pytest.raises(AlreadyExistsError, match=re.escape("ns.registered")):
        await catalog.register_table(ident, staged)
    with pytest.raises(NotFoundError):
        await catalog.register_table("ns.other", f"{case.warehouse}/staging/none.metadata.json")

    # the registered table takes commits like any other
    committed = await fast_append(loaded, [data_file(loaded, "f0")]).commit(quick_retries())
    reloaded = await catalog.load_table(ident)
    assert reloaded.metadata_location == committed.metadata_location
    assert await live_paths(reloaded) == [data_file(loaded, "f0").file_path]


async def test_register_committed_metadata_under_a_second_name(
    metastore_case: CatalogCase,
) -> None:
    """Metastore catalogs can point any name at any metadata file, history included."""
    catalog = metastore_case.catalog
    table = await make_table(catalog, "ns.source")
    files = [data_file(table, "f0"), data_file(table, "f1")]
    table = await fast_append(table, files).commit(quick_retries())

    copy = await catalog.register_table("ns.copy", table.metadata_location)
    assert copy.metadata.current_snapshot_id == table.metadata.current_snapshot_id
    loaded = await catalog.load_table("ns.copy")
    assert sorted(await live_paths(loaded)) == sorted(f.file_path for f in files)
    with pytest.raises(NotFoundError, match="ghost"):
        await catalog.register_table("ghost.copy", table.metadata_location)


async def test_drop_table_keeps_data_without_purge(case: CatalogCase) -> None:
    catalog = case.catalog
    table = await make_table(catalog)
    files = [data_file(table, f"f{i}") for i in range(3)]
    for f in files:
        await catalog.io.write(f.file_path, b"parquet bytes")
    await fast_append(table, files).commit(quick_retries())

    await catalog.drop_table("ns.events")
    assert not await catalog.table_exists("ns.events")
    assert await catalog.list_tables("ns") == []
    for f in files:
        assert await catalog.io.exists(f.file_path)
    with pytest.raises(NotFoundError, match=re.escape("ns.events")):
        await catalog.drop_table("ns.events")
    with pytest.raises(NotFoundError, match=re.escape("ns.events")):
        await catalog.load_table("ns.events")

    # the name is free again
    again = await make_table(catalog)
    assert again.metadata.table_uuid != table.metadata.table_uuid
    assert await live_paths(again) == []


async def test_drop_table_with_purge_deletes_files(case: CatalogCase) -> None:
    catalog = case.catalog
    table = await make_table(catalog)
    keep = await make_table(catalog, "ns.neighbour")
    for i in range(3):
        batch = [data_file(table, f"f{i}-{j}") for j in range(2)]
        for f in batch:
            await catalog.io.write(f.file_path, b"parquet bytes")
        table = await fast_append(table, batch).commit(quick_retries())
    assert len(await list_paths(catalog.io, table.location)) > 6

    await catalog.drop_table("ns.events", purge=True)
    assert not await catalog.table_exists("ns.events")
    assert await list_paths(catalog.io, table.location) == []
    # nothing outside the table was touched
    assert await catalog.io.exists(keep.metadata_location)
    assert await catalog.table_exists("ns.neighbour")


async def test_commit_on_a_stale_base_fails(case: CatalogCase) -> None:
    catalog = case.catalog
    await make_table(catalog)
    first = await catalog.load_table("ns.events")
    second = await catalog.load_table("ns.events")

    winner = await catalog.commit(
        first,
        MetadataBuilder(first.metadata)
        .set_properties({"who": "first"})
        .build(first.metadata_location),
    )
    with pytest.raises(CommitFailedError, match=re.escape("ns.events")):
        await catalog.commit(
            second,
            MetadataBuilder(second.metadata)
            .set_properties({"who": "second"})
            .build(second.metadata_location),
        )
    current = await catalog.load_table("ns.events")
    assert current.metadata_location == winner.metadata_location
    assert current.metadata.properties["who"] == "first"
    # the loser left no metadata file behind
    metadata_files = [
        p
        for p in await list_paths(catalog.io, metadata_dir(current.metadata))
        if p.endswith(".metadata.json")
    ]
    assert sorted(metadata_files) == sorted([first.metadata_location, winner.metadata_location])


async def test_commits_advance_version_and_metadata_log(case: CatalogCase) -> None:
    catalog = case.catalog
    table = await make_table(catalog)
    locations = [table.metadata_location]
    for i in range(3):
        new = MetadataBuilder(table.metadata).set_properties({"i": str(i)})
        table = await catalog.commit(table, new.build(table.metadata_location))
        locations.append(table.metadata_location)
    versions = [metadata_version(loc) for loc in locations]
    assert versions == list(range(versions[0], versions[0] + 4))
    loaded = await catalog.load_table("ns.events")
    assert loaded.metadata_location == locations[-1]
    assert [e.metadata_file for e in loaded.metadata.metadata_log] == locations[:-1]
    assert loaded.metadata.properties["i"] == "2"


async def test_old_metadata_files_deleted_after_commit_when_asked(case: CatalogCase) -> None:
    catalog = case.catalog
    table = await make_table(
        catalog, properties={DELETE_AFTER_COMMIT: "true", PREVIOUS_VERSIONS_MAX: "2"}
    )
    locations = [table.metadata_location]
    for i in range(4):
        new = MetadataBuilder(table.metadata).set_properties({"i": str(i)})
        table = await catalog.commit(table, new.build(table.metadata_location))
        locations.append(table.metadata_location)
    assert [e.metadata_file for e in table.metadata.metadata_log] == locations[-3:-1]
    for gone in locations[:-3]:
        assert not await catalog.io.exists(gone)
    for kept in locations[-3:]:
        assert await catalog.io.exists(kept)
    assert (await catalog.load_table("ns.events")).metadata_location == locations[-1]


# --------------------------------------------------------------------------------------
# Concurrency: 16 committers x 25 appends on one table
# --------------------------------------------------------------------------------------


@dataclass
class RaceResult:
    table: Table
    expected: list[str]
    attempts: int
    conflicts: int


async def race_appends(case: CatalogCase, table_name: str = "ns.events") -> RaceResult:
    """16 committers, half of them on a second client, each appending 10 files one by one.

    All committers first load the same base and wait for each other, so the first round is
    a guaranteed 16-way conflict; after that they race freely.
    """
    await make_table(case.catalog, table_name)
    second = case.open_second()
    start = asyncio.Barrier(COMMITTERS)
    # Backoff long enough that most committers sleep while a few race: shorter waits end
    # in conflict storms that take longer overall. An S3 attempt takes several requests
    # (manifest list, metadata file, conditional put), so it lasts far longer.
    if case.kind == "fs-s3":
        policy = RetryPolicy(num_retries=10_000, min_wait_ms=400, max_wait_ms=6000)
    else:
        policy = RetryPolicy(num_retries=10_000, min_wait_ms=150, max_wait_ms=2000)
    expected: list[str] = []
    totals = collections.Counter[str]()

    # One reader for the process, as a coordinator shares it: every parent manifest list
    # was written here, so no attempt decodes one again.
    reader = ManifestReader(case.catalog.io)

    async def committer(index: int) -> None:
        catalog = case.catalog if index % 2 == 0 else second
        table = await catalog.load_table(table_name)
        files = [
            data_file(table, f"c{index:02d}-{i:02d}", category=f"c{index % 4}", day=19_000 + i)
            for i in range(APPENDS_PER_COMMITTER)
        ]
        for f in files:
            await catalog.io.write(f.file_path, b"PAR1")
        expected.extend(f.file_path for f in files)
        await start.wait()
        for f in files:
            producer = fast_append(table, [f], reader=reader)
            table = await producer.commit(policy)
            totals["attempts"] += producer.stats.attempts
            totals["conflicts"] += producer.stats.conflicts

    try:
        await asyncio.gather(*(committer(i) for i in range(COMMITTERS)))
    finally:
        await second.close()
    table = await case.catalog.load_table(table_name)
    return RaceResult(table, expected, totals["attempts"], totals["conflicts"])


async def check_race_result(case: CatalogCase, result: RaceResult) -> None:
    table, metadata = result.table, result.table.metadata
    total = COMMITTERS * APPENDS_PER_COMMITTER
    assert len(result.expected) == total
    assert result.conflicts >= COMMITTERS - 1  # the first round alone guarantees these
    assert result.attempts == total + result.conflicts

    # every appended file is live exactly once
    live = await live_paths(table)
    duplicates = [p for p, n in collections.Counter(live).items() if n > 1]
    assert duplicates == []
    assert sorted(live) == sorted(result.expected)

    # a linear history: each snapshot's parent is the one committed just before it
    snapshots = sorted(metadata.snapshots, key=lambda s: s.sequence_number)
    assert len(snapshots) == total
    assert [s.sequence_number for s in snapshots] == list(range(1, total + 1))
    assert snapshots[0].parent_snapshot_id is None
    for parent, child in itertools.pairwise(snapshots):
        assert child.parent_snapshot_id == parent.snapshot_id
        assert child.timestamp_ms >= parent.timestamp_ms
    assert metadata.current_snapshot_id == snapshots[-1].snapshot_id
    assert [e.snapshot_id for e in metadata.snapshot_log] == [s.snapshot_id for s in snapshots]
    for n, s in enumerate(snapshots, start=1):
        assert s.summary is not None
        assert s.summary[Summary.TOTAL_DATA_FILES] == str(n)
        assert s.summary[Summary.ADDED_DATA_FILES] == "1"

    # Nothing referenced is missing. Fast appends never rewrite a manifest, so the newest
    # manifest list names every manifest: exactly one added by each snapshot.
    manifests = await ManifestReader(table.io).manifests(snapshots[-1])
    assert sorted(m.added_snapshot_id or 0 for m in manifests) == sorted(
        s.snapshot_id for s in snapshots
    )
    referenced = {m.manifest_path for m in manifests}
    referenced.update(s.manifest_list for s in snapshots if s.manifest_list)
    stored = set(await list_paths(table.io, table.location))
    assert referenced <= stored
    assert set(result.expected) <= stored
    # ... and nothing a losing attempt wrote is left behind
    assert {p for p in stored if p.endswith(".avro")} == referenced
    metadata_files = {p for p in stored if p.endswith(".metadata.json")}
    assert len(metadata_files) == total + 1  # one per commit plus the creation
    assert table.metadata_location in metadata_files


@pytest.mark.interop
async def test_concurrent_appends_are_all_kept_in_a_linear_history(case: CatalogCase) -> None:
    result = await race_appends(case)
    await check_race_result(case, result)

    # PyIceberg plans the same 160 files from the metadata icefloe wrote
    planned = await asyncio.to_thread(
        pyiceberg_paths, result.table.metadata_location, case.read_properties
    )
    assert sorted(planned) == sorted(result.expected)


# --------------------------------------------------------------------------------------
# Unknown commit outcomes in metastore catalogs
# --------------------------------------------------------------------------------------


class SwapFaults:
    """Mixin for a metastore catalog whose next swaps fail like a dropped connection.

    ``after``: the store applied the swap, then the reply was lost. ``before``: the request
    never reached the store. ``blind``: applied, reply lost, and the pointer cannot be
    re-read once either, so the catalog cannot tell what happened.
    """

    faults: list[str]
    pointer_failures: int

    async def _swap_pointer(
        self, identifier: TableIdentifier, expected: str, token: str | None, new: str
    ) -> str | None:
        fault = self.faults.pop(0) if self.faults else None
        if fault == "before":
            raise ConnectionResetError("connection reset before the request was sent")
        token = await super()._swap_pointer(identifier, expected, token, new)  # type: ignore[misc]
        if fault == "blind":
            self.pointer_failures += 1
        if fault in ("after", "blind"):
            raise ConnectionResetError("connection reset while reading the reply")
        return token

    async def _load_pointer(self, identifier: TableIdentifier) -> tuple[str, str | None]:
        if self.pointer_failures:
            self.pointer_failures -= 1
            raise ConnectionResetError("store unreachable")
        return await super()._load_pointer(identifier)  # type: ignore[misc, no-any-return]


class FaultyRedisCatalog(SwapFaults, RedisCatalog):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.faults, self.pointer_failures = [], 0


class FaultyDynamoDbCatalog(SwapFaults, DynamoDbCatalog):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.faults, self.pointer_failures = [], 0


@pytest.fixture(params=[REDIS, DYNAMODB])
async def faulty_case(
    request: pytest.FixtureRequest, scratch_dir: Path
) -> AsyncIterator[CatalogCase]:
    cls = FaultyRedisCatalog if request.param == "redis" else FaultyDynamoDbCatalog
    opened = open_case(request.param, request, scratch_dir, catalog_class=cls)
    try:
        yield opened
    finally:
        await opened.catalog.close()


async def test_lost_reply_after_an_applied_swap_is_a_success(faulty_case: CatalogCase) -> None:
    catalog = faulty_case.catalog
    assert isinstance(catalog, SwapFaults)
    table = await make_table(catalog)
    catalog.faults.append("after")
    producer = fast_append(table, [data_file(table, "f0")])
    committed = await producer.commit(quick_retries())

    assert producer.stats.attempts == 1
    loaded = await catalog.load_table("ns.events")
    assert loaded.metadata_location == committed.metadata_location
    assert [s.snapshot_id for s in loaded.metadata.snapshots] == [producer.snapshot_id]
    assert await live_paths(loaded) == [data_file(table, "f0").file_path]
    # the returned handle (which carries no version token now) still commits
    again = await fast_append(committed, [data_file(table, "f1")]).commit(quick_retries())
    assert len(again.metadata.snapshots) == 2


async def test_swap_that_never_reached_the_store_is_retried_once(
    faulty_case: CatalogCase,
) -> None:
    catalog = faulty_case.catalog
    assert isinstance(catalog, SwapFaults)
    table = await make_table(catalog)
    catalog.faults.append("before")
    with pytest.raises(CommitFailedError, match="not applied"):
        await catalog.commit(
            table,
            MetadataBuilder(table.metadata)
            .set_properties({"a": "b"})
            .build(table.metadata_location),
        )
    assert (await catalog.load_table("ns.events")).metadata_location == table.metadata_location

    catalog.faults.append("before")
    producer = fast_append(table, [data_file(table, "f0")])
    committed = await producer.commit(quick_retries())
    assert (producer.stats.attempts, producer.stats.conflicts) == (2, 1)
    loaded = await catalog.load_table("ns.events")
    assert loaded.metadata_location == committed.metadata_location
    assert [s.snapshot_id for s in loaded.metadata.snapshots] == [producer.snapshot_id]


async def test_unreadable_pointer_after_a_lost_reply_is_resolved_by_reloading(
    faulty_case: CatalogCase,
) -> None:
    catalog = faulty_case.catalog
    assert isinstance(catalog, SwapFaults)
    table = await make_table(catalog)

    catalog.faults.append("blind")
    with pytest.raises(CommitStateUnknownError, match="reload"):
        await catalog.commit(
            table,
            MetadataBuilder(table.metadata)
            .set_properties({"a": "b"})
            .build(table.metadata_location),
        )
    assert (await catalog.load_table("ns.events")).metadata.properties["a"] == "b"

    table = await catalog.load_table("ns.events")
    catalog.faults.append("blind")
    producer = fast_append(table, [data_file(table, "f0")])
    committed = await producer.commit(quick_retries())
    assert (producer.stats.attempts, producer.stats.unknown_outcomes) == (1, 1)
    loaded = await catalog.load_table("ns.events")
    assert loaded.metadata_location == committed.metadata_location
    assert [s.snapshot_id for s in loaded.metadata.snapshots] == [producer.snapshot_id]


# --------------------------------------------------------------------------------------
# Store specifics
# --------------------------------------------------------------------------------------


async def test_fs_readers_probe_past_a_stale_or_missing_version_hint(fs_case: CatalogCase) -> None:
    catalog = fs_case.catalog
    table = await make_table(catalog)
    for i in range(3):
        table = await fast_append(table, [data_file(table, f"f{i}")]).commit(quick_retries())
    hint = f"{metadata_dir(table.metadata)}/version-hint.text"
    assert (await catalog.io.read(hint)).strip() == b"4"

    await catalog.io.write(hint, b"2")  # stale
    assert (await catalog.load_table("ns.events")).metadata_location == table.metadata_location
    await catalog.io.write(hint, b"not a number")
    assert (await catalog.load_table("ns.events")).metadata_location == table.metadata_location
    await catalog.io.delete(hint)
    assert (await catalog.load_table("ns.events")).metadata_location == table.metadata_location
    await catalog.io.delete(f"{metadata_dir(table.metadata)}/v1.metadata.json")
    await catalog.io.write(hint, b"1")  # names a version that is gone
    assert (await catalog.load_table("ns.events")).metadata_location == table.metadata_location


async def test_fs_table_location_is_fixed_by_its_name(fs_case: CatalogCase) -> None:
    await fs_case.catalog.create_namespace("ns")
    with pytest.raises(ValidationError, match="must live at"):
        await fs_case.catalog.create_table(
            "ns.t", events_schema(), location=f"{fs_case.warehouse}/elsewhere"
        )


@pytest.mark.interop
async def test_fs_version_hint_leads_pyiceberg_to_the_current_version(
    fs_case: CatalogCase,
) -> None:
    """After racing commits the hint must still name the newest version: PyIceberg's
    StaticTable trusts it without probing further."""
    catalog = fs_case.catalog
    table = await make_table(catalog)
    policy = RetryPolicy(num_retries=1000, min_wait_ms=1, max_wait_ms=30)

    async def committer(index: int) -> list[str]:
        mine = await catalog.load_table("ns.events")
        paths = []
        for i in range(4):
            f = data_file(mine, f"h{index}-{i}")
            mine = await fast_append(mine, [f]).commit(policy)
            paths.append(f.file_path)
        return paths

    expected = [
        p for batch in await asyncio.gather(*(committer(i) for i in range(4))) for p in batch
    ]
    table = await catalog.load_table("ns.events")
    assert metadata_version(table.metadata_location) == 17
    planned = await asyncio.to_thread(pyiceberg_paths, table.location, fs_case.read_properties)
    assert sorted(planned) == sorted(expected)


@pytest.mark.integration
async def test_redis_keys_share_one_hash_tag(
    request: pytest.FixtureRequest, scratch_dir: Path
) -> None:
    """Every key of a catalog lives in one Redis Cluster slot, so its scripts may run there."""
    opened = open_case("redis", request, scratch_dir)
    catalog = opened.catalog
    assert isinstance(catalog, RedisCatalog)
    try:
        await catalog.create_namespace("a.b", {"owner": "ana"})
        await make_table(catalog, "a.b.t")
        prefix = "{" + opened.extra["prefix"] + "}"
        keys = [k async for k in catalog.redis.scan_iter(match=f"{prefix}*")]
        assert len(keys) >= 4
        assert all(k.startswith(prefix + ":") for k in keys)
    finally:
        await catalog.close()


def dynamodb_item(case: CatalogCase, identifier: str, namespace: str) -> dict[str, Any]:
    client = boto3.client(
        "dynamodb",
        endpoint_url=case.extra["endpoint"],
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    response = client.get_item(
        TableName=case.extra["table_name"],
        Key={"identifier": {"S": identifier}, "namespace": {"S": namespace}},
        ConsistentRead=True,
    )
    item: dict[str, Any] = response["Item"]
    return item


@pytest.fixture
async def dynamodb_case(
    request: pytest.FixtureRequest, scratch_dir: Path
) -> AsyncIterator[CatalogCase]:
    opened = open_case("dynamodb", request, scratch_dir)
    try:
        yield opened
    finally:
        await opened.catalog.close()


@pytest.mark.integration
async def test_dynamodb_items_follow_the_java_layout(dynamodb_case: CatalogCase) -> None:
    catalog = dynamodb_case.catalog
    await catalog.create_namespace("db", {"owner": "ana"})
    table = await make_table(catalog, "db.t")
    first_location = table.metadata_location
    before = await asyncio.to_thread(dynamodb_item, dynamodb_case, "db.t", "db")
    table = await fast_append(table, [data_file(table, "f")]).commit(quick_retries())
    item = await asyncio.to_thread(dynamodb_item, dynamodb_case, "db.t", "db")

    assert item["p.table_type"] == {"S": "ICEBERG"}
    assert item["p.metadata_location"] == {"S": table.metadata_location}
    assert item["p.previous_metadata_location"] == {"S": first_location}
    assert item["v"]["S"] != before["v"]["S"]
    assert "N" in item["created_at"] and "N" in item["updated_at"]
    ns_item = await asyncio.to_thread(dynamodb_item, dynamodb_case, "NAMESPACE", "db")
    assert ns_item["p.owner"] == {"S": "ana"}


def pyiceberg_dynamodb(case: CatalogCase) -> Any:
    """PyIceberg's own DynamoDB catalog on the same DynamoDB table as ``case``.

    PyIceberg 0.12 has no endpoint property for DynamoDB, so it gets a boto3 client for
    dynalite; the table name and credentials go through its documented properties.
    """
    from pyiceberg.catalog.dynamodb import DynamoDbCatalog as PyIcebergDynamoDbCatalog

    client = boto3.client(
        "dynamodb",
        endpoint_url=case.extra["endpoint"],
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    return PyIcebergDynamoDbCatalog(
        "pyiceberg",
        client=client,
        **{
            "table-name": case.extra["table_name"],
            "dynamodb.region": "us-east-1",
            "dynamodb.access-key-id": "testing",
            "dynamodb.secret-access-key": "testing",
            "warehouse": case.warehouse,
        },
    )


@pytest.mark.integration
@pytest.mark.interop
async def test_pyiceberg_dynamodb_catalog_loads_what_icefloe_committed(
    dynamodb_case: CatalogCase,
) -> None:
    catalog = dynamodb_case.catalog
    await catalog.create_namespace("db", {"owner": "ana"})
    table = await make_table(catalog, "db.events")
    expected = []
    for i in range(3):
        batch = [data_file(table, f"f{i}-{j}", category=f"k{j}") for j in range(2)]
        table = await fast_append(table, batch).commit(quick_retries())
        expected += [f.file_path for f in batch]

    def read_with_pyiceberg() -> tuple[Any, list[str], list[Any], list[Any], dict[str, str]]:
        py_catalog = pyiceberg_dynamodb(dynamodb_case)
        py_table = py_catalog.load_table(("db", "events"))
        paths = [t.file.file_path for t in py_table.scan().plan_files()]
        return (
            py_table,
            paths,
            py_catalog.list_namespaces(),
            py_catalog.list_tables("db"),
            py_catalog.load_namespace_properties("db"),
        )

    py_table, paths, namespaces, tables, ns_props = await asyncio.to_thread(read_with_pyiceberg)
    assert py_table.metadata_location == table.metadata_location
    assert py_table.metadata.current_snapshot_id == table.metadata.current_snapshot_id
    assert str(py_table.metadata.table_uuid) == str(table.metadata.table_uuid)
    assert [f.name for f in py_table.spec().fields] == ["category", "ts_day", "id_bucket"]
    assert sorted(paths) == sorted(expected)
    assert ("db",) in namespaces
    assert ("db", "events") in tables
    assert ns_props["owner"] == "ana"


@pytest.mark.integration
@pytest.mark.interop
async def test_icefloe_commits_to_a_table_pyiceberg_created(dynamodb_case: CatalogCase) -> None:
    from pyiceberg.schema import Schema as PySchema
    from pyiceberg.types import LongType as PyLongType
    from pyiceberg.types import NestedField as PyNestedField

    catalog = dynamodb_case.catalog
    await catalog.list_namespaces()  # creates the DynamoDB table before PyIceberg looks

    def create_with_pyiceberg() -> str:
        py_catalog = pyiceberg_dynamodb(dynamodb_case)
        py_catalog.create_namespace("py")
        created = py_catalog.create_table(
            ("py", "t"), PySchema(PyNestedField(1, "id", PyLongType(), required=True))
        )
        return str(created.metadata_location)

    location = await asyncio.to_thread(create_with_pyiceberg)
    table = await catalog.load_table("py.t")
    assert table.metadata_location == location
    f = DataFile(f"{table.location}/data/x.parquet", "parquet", (), 5, 100)
    table = await fast_append(table, [f]).commit(quick_retries())

    def load_with_pyiceberg() -> list[str]:
        py_table = pyiceberg_dynamodb(dynamodb_case).load_table(("py", "t"))
        assert py_table.metadata_location == table.metadata_location
        return [t.file.file_path for t in py_table.scan().plan_files()]

    assert await asyncio.to_thread(load_with_pyiceberg) == [f.file_path]


# --------------------------------------------------------------------------------------
# Catalog URIs
# --------------------------------------------------------------------------------------


async def test_load_catalog_file_uri(tmp_path: Path) -> None:
    catalog = load_catalog(f"file://{tmp_path}/wh", name="files")
    try:
        assert isinstance(catalog, FileSystemCatalog)
        assert catalog.name == "files"
        assert catalog.warehouse == f"file://{tmp_path}/wh"
        await catalog.create_namespace("ns")
        table = await catalog.create_table("ns.t", events_schema())
        assert table.location == f"file://{tmp_path}/wh/ns/t"
        assert (tmp_path / "wh" / "ns" / "t" / "metadata" / "v1.metadata.json").exists()
    finally:
        await catalog.close()
    plain = load_catalog(str(tmp_path / "plain"))
    try:
        assert isinstance(plain, FileSystemCatalog)
        assert plain.warehouse == str(tmp_path / "plain")
    finally:
        await plain.close()


async def test_load_catalog_s3_uri_configures_the_file_io() -> None:
    catalog = load_catalog(
        "s3://bucket/wh?endpoint=http://127.0.0.1:9&s3.path-style-access=true&s3.region=eu-west-1"
    )
    try:
        assert isinstance(catalog, FileSystemCatalog)
        assert catalog.warehouse == "s3://bucket/wh"
        assert isinstance(catalog.io, S3FileIO)
        assert catalog.io.endpoint_url == "http://127.0.0.1:9"
        assert catalog.io.region == "eu-west-1"
        assert catalog.io.path_style
    finally:
        await catalog.close()


async def test_load_catalog_metastore_uris(tmp_path: Path) -> None:
    redis_catalog = load_catalog(
        f"redis://127.0.0.1:1/2?warehouse={tmp_path}&prefix=team", properties={"x": "y"}
    )
    try:
        assert isinstance(redis_catalog, RedisCatalog)
        assert redis_catalog.url == "redis://127.0.0.1:1/2"
        assert redis_catalog.properties["x"] == "y"
        assert redis_catalog.properties["warehouse"] == str(tmp_path)
    finally:
        await redis_catalog.close()
    dynamo = load_catalog(
        f"dynamodb://cat?endpoint=http://127.0.0.1:1&region=eu-west-1&warehouse={tmp_path}"
    )
    try:
        assert isinstance(dynamo, DynamoDbCatalog)
        assert dynamo.table_name == "cat"
        assert dynamo.endpoint_url == "http://127.0.0.1:1"
    finally:
        await dynamo.close()


def test_load_catalog_rejects_bad_uris() -> None:
    with pytest.raises(ValidationError, match="warehouse"):
        load_catalog("redis://127.0.0.1:6379/0")
    with pytest.raises(ValidationError, match="warehouse"):
        load_catalog("dynamodb://iceberg?endpoint=http://127.0.0.1:1")
    with pytest.raises(ValidationError, match="unsupported catalog URI scheme 'thrift'"):
        load_catalog("thrift://metastore:9083?warehouse=/tmp/wh")


async def test_metastore_tables_default_to_the_namespace_location(
    metastore_case: CatalogCase,
) -> None:
    catalog = metastore_case.catalog
    elsewhere = f"{metastore_case.warehouse}/custom/place/"
    await catalog.create_namespace("placed", {"location": elsewhere})
    table = await make_table(catalog, "placed.t")
    assert table.location == f"{metastore_case.warehouse}/custom/place/t"
    table = await fast_append(table, [data_file(table, "f")]).commit(quick_retries())
    assert table.metadata_location.startswith(
        f"{metastore_case.warehouse}/custom/place/t/metadata/"
    )


async def test_reloads_share_one_parse_but_never_a_stale_one(case: CatalogCase) -> None:
    catalog = case.catalog
    first = await make_table(catalog)
    one, two = await catalog.load_table("ns.events"), await catalog.load_table("ns.events")
    assert one.metadata is two.metadata
    # a re-created file-system table reuses the name v1.metadata.json for new content
    await catalog.drop_table("ns.events", purge=True)
    again = await make_table(catalog)
    loaded = await catalog.load_table("ns.events")
    assert loaded.metadata.table_uuid == again.metadata.table_uuid
    assert loaded.metadata.table_uuid != first.metadata.table_uuid


async def test_load_table_at_a_snapshot_a_ref_or_a_time(tmp_path: Path) -> None:
    catalog = load_catalog(f"file://{tmp_path}/wh")
    await catalog.create_namespace("db")
    table = await catalog.create_table("db.t", Schema(NestedField(1, "id", LongType(), True)))
    _, none_yet = await catalog.load_table_at("db.t")
    assert none_yet is None
    first = await fast_append(
        table, [DataFile(f"{table.location}/data/a.parquet", "parquet", (), 1, 10)]
    ).commit()
    first_snapshot = first.metadata.current_snapshot()
    assert first_snapshot is not None
    builder = MetadataBuilder(first.metadata).set_ref(
        "v1", SnapshotRef.tag(first_snapshot.snapshot_id)
    )
    tagged = await catalog.commit(first, builder.build(first.metadata_location))
    second = await fast_append(
        tagged, [DataFile(f"{table.location}/data/b.parquet", "parquet", (), 1, 10)]
    ).commit()
    head = second.metadata.current_snapshot()
    assert head is not None and head.snapshot_id != first_snapshot.snapshot_id

    _, by_id = await catalog.load_table_at("db.t", snapshot_id=first_snapshot.snapshot_id)
    _, by_tag = await catalog.load_table_at("db.t", ref="v1")
    _, by_time = await catalog.load_table_at("db.t", as_of_ms=first_snapshot.timestamp_ms)
    _, current = await catalog.load_table_at("db.t")
    assert by_id == by_tag == first_snapshot
    assert by_time is not None and by_time.snapshot_id in (
        first_snapshot.snapshot_id,
        head.snapshot_id,
    )
    assert current == head
    with pytest.raises(NotFoundError, match="no branch or tag 'nope'"):
        await catalog.load_table_at("db.t", ref="nope")
    with pytest.raises(NotFoundError, match="no snapshot 7"):
        await catalog.load_table_at("db.t", snapshot_id=7)
    with pytest.raises(ValidationError, match="at most one"):
        await catalog.load_table_at("db.t", snapshot_id=7, ref="v1")
    await catalog.close()
