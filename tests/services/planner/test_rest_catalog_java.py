"""Spark with Apache Iceberg's Java runtime (1.10.2, Spark 3.5) writing through icefloe.

Java's ``RESTCatalog`` is the reference REST client: here it is a Spark catalog of
``type=rest`` whose ``uri`` is the planner (real port, write routes on, a write token),
over a file-system and a Redis catalog. Spark creates a namespace and a v2 table, inserts,
deletes with merge-on-read (position delete files), compacts with
``system.rewrite_data_files`` and expires with ``system.expire_snapshots``, all through
icefloe; after each step icefloe's own reader and PyIceberg's ``RestCatalog`` read the same
rows Spark does. One JVM serves the whole session (the ``java_iceberg`` fixture); each
server gets its own Spark catalog name, since Spark keeps a catalog instance per name.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from coordinating import coordinator_config, raise_if_stopped, running_coordinator
from rest_catalog_server import (
    WRITE,
    Server,
    icefloe_rows,
    rest_catalog,
    server_fixture,  # noqa: F401  (the planner: one per module, file-system and Redis catalogs)
)

from icefloe.table.commit_index import DEDUP_WINDOW_MS
from java_iceberg import JavaIceberg, JavaIcebergError

pytestmark = pytest.mark.interop


def spark_catalog(java: JavaIceberg, server: Server) -> str:
    """A Spark catalog name for ``server``: Iceberg's REST client with the write token."""
    name = f"ice{uuid.uuid4().hex[:8]}"
    java.register_catalog(
        name,
        {
            "type": "rest",
            "uri": server.url,
            "token": WRITE,
            "cache-enabled": "false",
        },
    )
    return name


def java_rows(java: JavaIceberg, server: Server, statement: str) -> list[dict[str, Any]]:
    return sorted(java.sql(server.warehouse, statement), key=lambda r: r["id"])


def pyiceberg_rows(server: Server, name: str) -> list[dict[str, Any]]:
    table = rest_catalog(server).load_table(name)
    got = table.scan().to_arrow().select(["id", "cat"]).to_pylist()
    return sorted(got, key=lambda r: r["id"])


def assert_everyone_reads(
    java: JavaIceberg, server: Server, cat: str, name: str, expected: list[dict[str, Any]]
) -> None:
    """Spark (through icefloe), icefloe itself and PyIceberg read exactly ``expected``."""
    assert java_rows(java, server, f"SELECT id, cat FROM {cat}.{name}") == expected
    assert server.run(icefloe_rows(server.catalog, name)) == expected
    assert pyiceberg_rows(server, name) == expected


def test_java_spark_creates_inserts_deletes_compacts_and_expires(
    server: Server, java_iceberg: JavaIceberg
) -> None:
    java = java_iceberg
    cat = spark_catalog(java, server)
    name = "jv.t"
    java.sql(server.warehouse, f"CREATE NAMESPACE {cat}.jv")
    assert ("jv",) in rest_catalog(server).list_namespaces()
    java.sql(
        server.warehouse,
        f"CREATE TABLE {cat}.{name} (id BIGINT NOT NULL, cat STRING) USING iceberg "
        "PARTITIONED BY (cat) TBLPROPERTIES ('format-version'='2', "
        "'write.delete.mode'='merge-on-read', 'write.update.mode'='merge-on-read', "
        "'write.merge.mode'='merge-on-read')",
    )
    loaded = server.run(server.catalog.load_table(name))
    assert loaded.metadata.format_version == 2

    expected: list[dict[str, Any]] = []
    for start in (0, 40, 80):
        values = ", ".join(f"({i}, '{'abc'[i % 3]}')" for i in range(start, start + 40))
        java.sql(server.warehouse, f"INSERT INTO {cat}.{name} VALUES {values}")
        expected += [{"id": i, "cat": "abc"[i % 3]} for i in range(start, start + 40)]
    assert_everyone_reads(java, server, cat, name, expected)

    # Merge-on-read: Spark writes position delete files, no data file is rewritten.
    java.sql(server.warehouse, f"DELETE FROM {cat}.{name} WHERE id % 5 = 0")
    expected = [r for r in expected if r["id"] % 5 != 0]
    metadata = server.run(server.catalog.load_table(name)).metadata
    current = metadata.current_snapshot()
    assert current is not None and current.summary is not None
    assert current.summary["operation"] == "delete"
    assert int(current.summary["added-position-delete-files"]) > 0
    assert "deleted-data-files" not in current.summary
    assert_everyone_reads(java, server, cat, name, expected)

    # Compaction through icefloe: data and deletes rewritten into one file per partition.
    result = java.sql(
        server.warehouse,
        f"CALL {cat}.system.rewrite_data_files(table => '{name}', "
        "options => map('min-input-files', '1', 'delete-file-threshold', '1'))",
    )
    assert result[0]["rewritten_data_files_count"] > 0
    assert result[0]["added_data_files_count"] == 3
    metadata = server.run(server.catalog.load_table(name)).metadata
    current = metadata.current_snapshot()
    assert current is not None and current.summary is not None
    assert current.summary["operation"] == "replace"
    assert_everyone_reads(java, server, cat, name, expected)

    # Expiry through icefloe: everything but the current snapshot goes.
    snapshots_before = len(metadata.snapshots)
    assert snapshots_before > 1
    java.sql(
        server.warehouse,
        f"CALL {cat}.system.expire_snapshots(table => '{name}', "
        "older_than => TIMESTAMP '9999-12-31 00:00:00', retain_last => 1)",
    )
    metadata = server.run(server.catalog.load_table(name)).metadata
    assert [s.snapshot_id for s in metadata.snapshots] == [metadata.current_snapshot_id]
    assert_everyone_reads(java, server, cat, name, expected)


def test_java_spark_reads_metadata_tables_through_icefloe(
    server: Server, java_iceberg: JavaIceberg
) -> None:
    """``SELECT * FROM cat.ns.t.files``: Spark first loads table ``files`` in namespace
    ``ns.t`` and reads the metadata table only when that answers NoSuchTableException."""
    java = java_iceberg
    cat = spark_catalog(java, server)
    java.sql(server.warehouse, f"CREATE NAMESPACE {cat}.meta")
    java.sql(server.warehouse, f"CREATE TABLE {cat}.meta.t (id BIGINT, cat STRING) USING iceberg")
    for values in ("(1, 'a'), (2, 'b')", "(3, 'c')"):
        java.sql(server.warehouse, f"INSERT INTO {cat}.meta.t VALUES {values}")
    metadata = server.run(server.catalog.load_table("meta.t")).metadata
    files = java.sql(server.warehouse, f"SELECT file_path, record_count FROM {cat}.meta.t.files")
    rows = server.run(icefloe_rows(server.catalog, "meta.t", ("id",)))
    assert sum(f["record_count"] for f in files) == len(rows) == 3
    assert len(files) == 2
    snapshots = java.sql(server.warehouse, f"SELECT snapshot_id FROM {cat}.meta.t.snapshots")
    assert sorted(s["snapshot_id"] for s in snapshots) == sorted(
        s.snapshot_id for s in metadata.snapshots
    )
    history = java.sql(server.warehouse, f"SELECT * FROM {cat}.meta.t.history")
    assert len(history) == len(metadata.snapshots)


def assert_linear(metadata: Any) -> None:
    """Every snapshot is an ancestor of main, each the parent of the next (expired ancestors
    end the chain): no commit of Spark's or the coordinator's was made on a stale base."""
    snapshots = {s.snapshot_id: s for s in metadata.snapshots}
    chain = []
    current = metadata.current_snapshot_id
    while current is not None and current in snapshots:
        chain.append(current)
        current = snapshots[current].parent_snapshot_id
    assert set(chain) == set(snapshots)
    sequence = [snapshots[s].sequence_number for s in reversed(chain)]
    assert sequence == sorted(set(sequence))


def test_java_spark_writes_and_compacts_while_the_coordinator_commits(
    server: Server, java_iceberg: JavaIceberg, kafka_broker: str
) -> None:
    """Spark inserts, deletes (merge-on-read) and compacts through icefloe while the
    coordinator commits Kafka events to the same table: every row of both lands exactly once,
    Spark's deletes hold, and the history is one line. Compaction by Spark rewrites files the
    coordinator committed, so the coordinator's bookkeeping must survive commits it did not
    make."""
    import pyarrow as pa
    from aiokafka import AIOKafkaProducer

    from icefloe.catalog.uri import load_catalog
    from icefloe.events import (
        CommitOperation,
        CommitRequested,
        FilesWritten,
        encode_event,
        event_key,
    )
    from icefloe.parquet.files import write_files

    java = java_iceberg
    cat = spark_catalog(java, server)
    name = "jmixed.t"
    java.sql(server.warehouse, f"CREATE NAMESPACE {cat}.jmixed")
    java.sql(
        server.warehouse,
        f"CREATE TABLE {cat}.{name} (id BIGINT NOT NULL, cat STRING) USING iceberg "
        "TBLPROPERTIES ('format-version'='2', 'write.delete.mode'='merge-on-read', "
        "'write.delete.isolation-level'='snapshot', 'commit.retry.num-retries'='50', "
        "'commit.retry.min-wait-ms'='20', 'commit.retry.max-wait-ms'='500')",
    )
    arrow = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("cat", pa.string())])
    uri = server.catalog_uri
    prefix = f"rj{uuid.uuid4().hex[:8]}"
    coordinator_ids: list[int] = []
    spark_done = threading.Event()

    async def coordinate() -> None:
        config = coordinator_config(kafka_broker, uri, prefix)
        async with running_coordinator(config) as (_, task):
            await feed(task)

    async def feed(task: asyncio.Task[None]) -> None:
        catalog = load_catalog(uri)
        producer = AIOKafkaProducer(bootstrap_servers=kafka_broker, acks="all")
        await producer.start()
        try:
            table = await catalog.load_table(name)
            md = table.metadata
            n = 0
            # Until Spark is done (and at least a few batches): the two really interleave.
            while not spark_done.is_set() or n < 6:
                ids = list(range(10_000 + n * 5, 10_000 + n * 5 + 5))
                data = pa.table({"id": ids, "cat": ["k"] * 5}, schema=arrow)
                files = await write_files(
                    table.io, data, table.location, schema=md.schema(), spec=md.spec()
                )
                event = FilesWritten.from_data_files(
                    name, f"c{n}", "writer", f"c{n}/a", md.schema(), md.spec(), files
                )
                await producer.send(f"{prefix}.events", encode_event(event), key=event_key(name))
                request = CommitRequested(
                    table=name,
                    commit_id=f"c{n}",
                    operation=CommitOperation.APPEND,
                    attempt_ids=(f"c{n}/a",),
                )
                await producer.send(f"{prefix}.events", encode_event(request), key=event_key(name))
                coordinator_ids.extend(ids)
                n += 1
                await asyncio.sleep(0.3)
            await producer.flush()
            # Done when every coordinator row is visible (rows, not files: Spark's compaction
            # may have rewritten the coordinator's files meanwhile).
            while True:
                got = {r["id"] for r in await icefloe_rows(catalog, name)}
                if set(coordinator_ids) <= got:
                    break
                raise_if_stopped(task)
                await asyncio.sleep(0.1)
        finally:
            await producer.stop()
            await catalog.close()

    def insert(ids: range) -> None:
        values = ", ".join(f"({i}, '{'abc'[i % 3]}')" for i in ids)
        java.sql(server.warehouse, f"INSERT INTO {cat}.{name} VALUES {values}")

    def coordinator_snapshots() -> int:
        metadata = server.run(server.catalog.load_table(name)).metadata
        return sum("icefloe.commit-ids" in (s.summary or {}) for s in metadata.snapshots)

    with ThreadPoolExecutor(1) as pool:
        background = pool.submit(asyncio.run, coordinate())
        for start in range(0, 40, 10):
            insert(range(start, start + 10))
            if start == 0:
                # Interleave for sure: a coordinator commit lands after Spark's first commit
                # and before its next (the coordinator may still be joining its group).
                seen = coordinator_snapshots()
                while coordinator_snapshots() == seen:
                    if background.done():
                        background.result()  # raises what stopped the coordinator
                        raise AssertionError("the coordinator stopped before committing")
                    time.sleep(0.1)
        java.sql(server.warehouse, f"DELETE FROM {cat}.{name} WHERE id < 15")
        java.sql(
            server.warehouse,
            f"CALL {cat}.system.rewrite_data_files(table => '{name}', "
            "options => map('min-input-files', '1', 'delete-file-threshold', '1'))",
        )
        for start in range(40, 60, 10):
            insert(range(start, start + 10))
        spark_done.set()
        background.result()

    expected = sorted(
        [{"id": i, "cat": "abc"[i % 3]} for i in range(15, 60)]
        + [{"id": i, "cat": "k"} for i in coordinator_ids],
        key=lambda r: r["id"],
    )
    # The coordinator's last commits reach the planner within its refresh interval (its
    # promise for commits it did not make); REST commits it made, it serves at once.
    current = server.run(server.catalog.load_table(name)).metadata_location
    while rest_catalog(server).load_table(name).metadata_location != current:
        time.sleep(0.05)
    assert_everyone_reads(java, server, cat, name, expected)
    metadata = rest_catalog(server).load_table(name).metadata
    assert_linear(metadata)
    # Interleaved, not one after the other: some coordinator commit lies between Spark's.
    made_by = [
        "coordinator" if "icefloe.commit-ids" in s.summary.additional_properties else "spark"
        for s in sorted(metadata.snapshots, key=lambda s: s.sequence_number)
    ]
    first, last = made_by.index("spark"), len(made_by) - 1 - made_by[::-1].index("spark")
    assert "coordinator" in made_by[first:last], made_by
    # Expiry through icefloe after the race: the coordinator's snapshots are dedup evidence
    # inside the window, so Java's procedure is refused naming the setting; once the table's
    # window is lowered it expires, and the rows stay.
    expire = (
        f"CALL {cat}.system.expire_snapshots(table => '{name}', "
        "older_than => TIMESTAMP '9999-12-31 00:00:00', retain_last => 1)"
    )
    with pytest.raises(JavaIcebergError, match=DEDUP_WINDOW_MS):
        java.sql(server.warehouse, expire)
    java.sql(
        server.warehouse,
        f"ALTER TABLE {cat}.{name} SET TBLPROPERTIES ('{DEDUP_WINDOW_MS}' = '0')",
    )
    java.sql(server.warehouse, expire)
    assert len(rest_catalog(server).load_table(name).metadata.snapshots) == 1
    assert_everyone_reads(java, server, cat, name, expected)
