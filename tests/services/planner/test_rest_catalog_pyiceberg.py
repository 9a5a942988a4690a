"""PyIceberg's RestCatalog writing through icefloe: the real client against the real server.

The planner runs on a real port (in a thread: PyIceberg's client is synchronous) over a
file-system and a Redis catalog. PyIceberg creates namespaces and tables, appends,
overwrites, deletes, evolves the schema and the partition spec, expires snapshots and runs a
staged create transaction; after each step the rows PyIceberg reads back (planned by the
server), the rows icefloe reads from the catalog itself, and the rows the test expects agree.
Several PyIceberg clients then append to one table at once, and finally PyIceberg appends
while the coordinator commits Kafka events to the same table: nothing is lost and the
history is one line.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa
import pytest
from coordinating import coordinator_config, raise_if_stopped, running_coordinator
from rest_catalog_server import (
    READ,
    WRITE,
    Server,
    icefloe_rows,
    rest_catalog,
    server_fixture,  # noqa: F401  (the planner: one per module, file-system and Redis catalogs)
)

from icefloe.catalog.uri import load_catalog
from icefloe.manifests.reader import ManifestReader
from icefloe.parquet.files import write_files
from icefloe.table.catalog import Catalog

pytestmark = pytest.mark.interop

ARROW = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("cat", pa.string())])


def rows(table: pa.Table) -> list[dict[str, Any]]:
    return sorted(table.select(ARROW.names).to_pylist(), key=lambda r: r["id"])


def batch(ids: range, cat: str | None = None) -> pa.Table:
    return pa.table({"id": list(ids), "cat": [cat or "abc"[i % 3] for i in ids]}, schema=ARROW)


def assert_rows(server: Server, table: Any, name: str, expected: list[dict[str, Any]]) -> None:
    table = table.refresh()
    assert rows(table.scan().to_arrow()) == expected
    assert server.run(icefloe_rows(server.catalog, name)) == expected
    loaded = server.run(server.catalog.load_table(name))
    assert loaded.metadata_location == table.metadata_location


def assert_linear(metadata: Any) -> None:
    """Every snapshot is an ancestor of main, each the parent of the next (expired
    ancestors end the chain)."""
    snapshots = {s.snapshot_id: s for s in metadata.snapshots}
    chain = []
    current = metadata.current_snapshot_id
    while current is not None and current in snapshots:
        chain.append(current)
        current = snapshots[current].parent_snapshot_id
    assert set(chain) == set(snapshots)
    sequence = [snapshots[s].sequence_number for s in reversed(chain)]
    assert sequence == sorted(set(sequence))


def test_pyiceberg_creates_writes_evolves_and_expires(server: Server) -> None:
    from pyiceberg.exceptions import ForbiddenError, NamespaceNotEmptyError
    from pyiceberg.expressions import EqualTo, LessThan
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.transforms import IdentityTransform
    from pyiceberg.types import DoubleType, LongType, NestedField, StringType

    rest = rest_catalog(server)
    rest.create_namespace("life", {"owner": "ann", "tier": "gold"})
    summary = rest.update_namespace_properties("life", removals={"tier"}, updates={"k": "v"})
    assert summary.removed == ["tier"] and summary.updated == ["k"]
    assert rest.load_namespace_properties("life") == {"owner": "ann", "k": "v"}
    schema = Schema(
        NestedField(1, "id", LongType(), required=True), NestedField(2, "cat", StringType())
    )
    spec = PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "cat"))
    table = rest.create_table("life.t", schema, partition_spec=spec)
    name = "life.t"
    assert rest.list_tables("life") == [("life", "t")]

    table.append(batch(range(0, 60)))
    table.append(batch(range(60, 90)))
    expected = rows(pa.concat_tables([batch(range(0, 60)), batch(range(60, 90))]))
    assert_rows(server, table, name, expected)

    table.overwrite(batch(range(100, 110), "a"), overwrite_filter=EqualTo("cat", "a"))
    expected = [r for r in expected if r["cat"] != "a"] + rows(batch(range(100, 110), "a"))
    expected.sort(key=lambda r: r["id"])
    assert_rows(server, table, name, expected)

    table.delete(LessThan("id", 20))
    expected = [r for r in expected if r["id"] >= 20]
    assert_rows(server, table, name, expected)

    with table.update_schema() as update:
        update.add_column("score", DoubleType())
    with table.update_spec() as update:
        # Identity: PyIceberg writes bucket partitions only with the optional pyiceberg-core.
        update.add_identity("id")
    table = table.refresh()
    assert [f.name for f in table.schema().fields] == ["id", "cat", "score"]
    assert len(table.metadata.partition_specs) == 2
    scored = pa.table(
        {"id": [200, 201], "cat": ["b", "c"], "score": [1.5, None]},
        schema=pa.schema([*ARROW, pa.field("score", pa.float64())]),
    )
    table.append(scored)
    expected = sorted(expected + rows(scored), key=lambda r: r["id"])
    assert_rows(server, table, name, expected)
    icefloe_table = server.run(server.catalog.load_table(name))
    assert icefloe_table.metadata.current_schema_id == table.schema().schema_id
    assert icefloe_table.metadata.default_spec_id == table.spec().spec_id

    # Expire every snapshot but the current one: the rows stay, the history shrinks.
    table = table.refresh()
    assert_linear(table.metadata)
    old = [
        s.snapshot_id
        for s in table.snapshots()
        if s.snapshot_id != table.current_snapshot().snapshot_id
    ]  # type: ignore[union-attr]
    assert len(old) >= 4
    table.maintenance.expire_snapshots().by_ids(old).commit()
    table = table.refresh()
    assert [s.snapshot_id for s in table.snapshots()] == [table.current_snapshot().snapshot_id]  # type: ignore[union-attr]
    assert_rows(server, table, name, expected)
    assert_linear(table.metadata)

    # A read token reads but cannot write.
    reader = rest_catalog(server, token=READ)
    assert rows(reader.load_table(name).scan().to_arrow()) == expected
    with pytest.raises(ForbiddenError):
        reader.load_table(name).append(batch(range(500, 501)))
    with pytest.raises(ForbiddenError):
        reader.create_namespace("nope")

    with pytest.raises(NamespaceNotEmptyError):
        rest.drop_namespace("life")
    rest.purge_table(name)
    assert not rest.table_exists(name)
    rest.drop_namespace("life")
    assert ("life",) not in rest.list_namespaces()


def test_staged_create_transaction(server: Server) -> None:
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType

    rest = rest_catalog(server)
    rest.create_namespace("staged")
    schema = Schema(
        NestedField(1, "id", LongType(), required=True), NestedField(2, "cat", StringType())
    )
    tx = rest.create_table_transaction("staged.t", schema, properties={"made-by": "tx"})
    tx.append(batch(range(0, 25)))
    assert not rest.table_exists("staged.t")
    assert tx.commit_transaction().properties["made-by"] == "tx"
    table = rest.load_table("staged.t")
    assert_rows(server, table, "staged.t", rows(batch(range(0, 25))))
    if server.service.catalog.supports_rename:
        rest.rename_table("staged.t", "staged.moved")
        moved = rest.load_table("staged.moved")
        assert_rows(server, moved, "staged.moved", rows(batch(range(0, 25))))
        rest.drop_table("staged.moved")
    else:
        # Not advertised in /v1/config, so the client refuses before asking (the server
        # would answer 406).
        with pytest.raises(NotImplementedError):
            rest.rename_table("staged.t", "staged.moved")
        rest.drop_table("staged.t")


def test_keyed_tables_created_and_evolved_through_rest(server: Server) -> None:
    """Identifier fields travel through the REST catalog: a create that names them, and a
    schema update that changes them (PyIceberg's ``set_identifier_fields``), are stored
    as given; one the spec forbids (an optional column) is a 400 naming it, not applied."""
    import requests
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType

    rest = rest_catalog(server)
    rest.create_namespace("keyed")
    schema = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "code", StringType(), required=True),
        NestedField(3, "v", StringType()),
        identifier_field_ids=[1],
    )
    table = rest.create_table("keyed.t", schema)

    def stored() -> list[str]:
        current = server.run(server.catalog.load_table("keyed.t")).metadata.schema()
        return [str(current.find_column_name(i)) for i in current.identifier_field_ids]

    assert stored() == ["id"]
    assert table.schema().identifier_field_names() == {"id"}
    with table.update_schema() as update:
        update.set_identifier_fields("id", "code")
    assert stored() == ["id", "code"]
    assert rest.load_table("keyed.t").schema().identifier_field_names() == {"id", "code"}

    loaded = rest.load_table("keyed.t")
    current = loaded.metadata.current_schema_id
    bad = {
        "requirements": [{"type": "assert-current-schema-id", "current-schema-id": current}],
        "updates": [
            {
                "action": "add-schema",
                "schema": {
                    **loaded.schema().model_dump(by_alias=True),
                    "schema-id": current + 1,
                    "identifier-field-ids": [3],
                },
            },
            {"action": "set-current-schema", "schema-id": -1},
        ],
    }
    response = requests.post(
        f"{server.url}/v1/namespaces/keyed/tables/t",
        json=bad,
        headers={"Authorization": f"Bearer {WRITE}"},
        timeout=60,
    )
    assert response.status_code == 400, response.text
    assert "'v'" in response.json()["error"]["message"]
    assert stored() == ["id", "code"]


def _append_with_retries(server: Server, name: str, ids: range) -> int:
    """A client's append, reloaded and retried on 409 as a writer would; returns conflicts."""
    from pyiceberg.exceptions import CommitFailedException

    rest = rest_catalog(server)
    conflicts = 0
    while True:
        table = rest.load_table(name)
        try:
            table.append(batch(ids))
            return conflicts
        except CommitFailedException:
            conflicts += 1


def test_concurrent_pyiceberg_appends_are_linear_and_nothing_is_lost(server: Server) -> None:
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType

    rest = rest_catalog(server)
    rest.create_namespace("race")
    schema = Schema(
        NestedField(1, "id", LongType(), required=True), NestedField(2, "cat", StringType())
    )
    table = rest.create_table("race.t", schema)
    clients, per_client = 4, 3
    ranges = [
        range(c * 1000 + k * 10, c * 1000 + k * 10 + 10)
        for c in range(clients)
        for k in range(per_client)
    ]
    with ThreadPoolExecutor(clients) as pool:
        sum(pool.map(lambda r: _append_with_retries(server, "race.t", r), ranges))
    table = table.refresh()
    expected = sorted((r for ids in ranges for r in rows(batch(ids))), key=lambda r: r["id"])
    assert_rows(server, table, "race.t", expected)
    assert len(table.snapshots()) == len(ranges)
    assert_linear(table.metadata)


def test_appends_through_rest_while_the_coordinator_commits(
    server: Server, kafka_broker: str
) -> None:
    """PyIceberg appends through icefloe while the coordinator commits Kafka events to the same
    table: every file of both lands exactly once, along one line of snapshots."""

    uri = server.catalog_uri
    prefix = f"rc{uuid.uuid4().hex[:8]}"
    rest = rest_catalog(server)
    rest.create_namespace("mixed")
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType

    schema = Schema(
        NestedField(1, "id", LongType(), required=True), NestedField(2, "cat", StringType())
    )
    table = rest.create_table("mixed.t", schema)
    name = "mixed.t"
    coordinator_files: list[str] = []

    async def coordinate() -> None:
        config = coordinator_config(kafka_broker, uri, prefix)
        async with running_coordinator(config) as (_, task):
            await feed(task)

    async def feed(task: asyncio.Task[None]) -> None:
        ranges = {f"c{n}": range(10_000 + n * 5, 10_000 + n * 5 + 5) for n in range(12)}
        coordinator_files.extend(await send_jobs(task, kafka_broker, uri, prefix, name, ranges))

    with ThreadPoolExecutor(3) as pool:
        background = pool.submit(asyncio.run, coordinate())
        ranges = [range(k * 10, k * 10 + 10) for k in range(8)]
        sum(pool.map(lambda r: _append_with_retries(server, name, r), ranges))
        background.result()
    # The coordinator's last commits reach the planner within its refresh interval (its
    # promise for commits it did not make); REST commits it made, it serves at once.
    current = server.run(server.catalog.load_table(name)).metadata_location
    while table.refresh().metadata_location != current:
        time.sleep(0.05)
    table = table.refresh()
    live = server.run(live_files(server.catalog, name))
    assert all(n == 1 for n in Counter(live).values()), "a file is live twice"
    assert set(coordinator_files) <= set(live)
    expected = sorted(
        [r for ids in ranges for r in rows(batch(ids))]
        + [r for n in range(12) for r in rows(batch(range(10_000 + n * 5, 10_000 + n * 5 + 5)))],
        key=lambda r: r["id"],
    )
    assert_rows(server, table, name, expected)
    assert_linear(table.metadata)


async def send_jobs(
    task: asyncio.Task[None],
    brokers: str,
    uri: str,
    prefix: str,
    name: str,
    jobs: dict[str, range],
) -> list[str]:
    """Writer jobs through Kafka: per commit id a Parquet file of the ids in its range, its
    files-written and its commit-requested; returns the files once all are live."""
    from aiokafka import AIOKafkaProducer

    from icefloe.events import (
        CommitOperation,
        CommitRequested,
        FilesWritten,
        encode_event,
        event_key,
    )

    catalog = load_catalog(uri)
    producer = AIOKafkaProducer(bootstrap_servers=brokers, acks="all")
    await producer.start()
    paths: list[str] = []
    try:
        icefloe_table = await catalog.load_table(name)
        md = icefloe_table.metadata
        for commit_id, ids in jobs.items():
            # A writer job's Parquet file, with field ids as Iceberg writers write them.
            files = await write_files(
                icefloe_table.io,
                batch(ids),
                icefloe_table.location,
                schema=md.schema(),
                spec=md.spec(),
            )
            attempt = f"{commit_id}/a"
            event = FilesWritten.from_data_files(
                name, commit_id, "writer", attempt, md.schema(), md.spec(), files
            )
            await producer.send(f"{prefix}.events", encode_event(event), key=event_key(name))
            request = CommitRequested(
                table=name,
                commit_id=commit_id,
                operation=CommitOperation.APPEND,
                attempt_ids=(attempt,),
            )
            await producer.send(f"{prefix}.events", encode_event(request), key=event_key(name))
            paths.extend(f.file_path for f in files)
            await asyncio.sleep(0.05)
        await producer.flush()
        # Wait until every file is live (bounded by the coordinator itself).
        while not set(paths) <= set(await live_files(catalog, name)):
            raise_if_stopped(task)
            await asyncio.sleep(0.1)
    finally:
        await producer.stop()
        await catalog.close()
    return paths


def test_icefloe_refuses_to_drop_dedup_evidence_for_pyiceberg(
    server: Server, kafka_broker: str
) -> None:
    """PyIceberg's expire_snapshots().by_id() of a snapshot the coordinator committed inside
    the dedup window is refused with a 400 naming the setting (it used to answer 200, and a
    retry of that job was then applied twice); so is removing the dedup ledger. Once the
    table's window is lowered, the same expiry goes through."""
    from pyiceberg.exceptions import BadRequestError
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType

    from icefloe.table.commit_index import DEDUP_WINDOW_MS
    from icefloe.table.dedup_ledger import LEDGER_PROPERTY

    uri = server.catalog_uri
    prefix = f"rc{uuid.uuid4().hex[:8]}"
    rest = rest_catalog(server)
    rest.create_namespace("dedup")
    schema = Schema(
        NestedField(1, "id", LongType(), required=True), NestedField(2, "cat", StringType())
    )
    name = "dedup.t"
    table = rest.create_table(name, schema)

    async def coordinate() -> None:
        async with running_coordinator(coordinator_config(kafka_broker, uri, prefix)) as (_, task):
            for job, ids in (("job-x", range(3)), ("job-y", range(3, 6))):  # two snapshots
                await send_jobs(task, kafka_broker, uri, prefix, name, {job: ids})

    asyncio.run(coordinate())
    current = server.run(server.catalog.load_table(name)).metadata_location
    while table.refresh().metadata_location != current:
        time.sleep(0.05)
    table = table.refresh()
    assert len(table.snapshots()) == 2
    first = table.snapshots()[0].snapshot_id
    assert LEDGER_PROPERTY in table.properties

    with pytest.raises(BadRequestError, match=DEDUP_WINDOW_MS):
        table.maintenance.expire_snapshots().by_id(first).commit()
    with pytest.raises(BadRequestError, match="dedup ledger"), table.transaction() as tx:
        tx.remove_properties(LEDGER_PROPERTY)
    table = table.refresh()
    assert first in {s.snapshot_id for s in table.snapshots()}
    assert LEDGER_PROPERTY in table.properties

    with table.transaction() as tx:
        tx.set_properties({DEDUP_WINDOW_MS: "0"})
    table = table.refresh()
    table.maintenance.expire_snapshots().by_id(first).commit()
    assert first not in {s.snapshot_id for s in table.refresh().snapshots()}


async def live_files(catalog: Catalog, name: str) -> list[str]:
    table = await catalog.load_table(name)
    head = table.metadata.current_snapshot()
    if head is None:
        return []
    reader = ManifestReader(table.io)
    out = []
    for manifest in await reader.manifests(head):
        for entry in await reader.entries(manifest, table.metadata.specs(), live_only=True):
            out.append(entry.data_file.file_path)
    return out
