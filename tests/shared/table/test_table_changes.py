"""REST commit semantics over the conditional swap: a lost swap is re-checked, never lost.

A file-system catalog on local disk whose ``commit`` lets a rival commit land first, exactly
between the moment the REST commit read the table and the moment it swaps: the coordinator
or another client winning the race.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest

from icefloe.catalog.fs import FileSystemCatalog
from icefloe.errors import (
    AlreadyExistsError,
    CommitFailedError,
    NotFoundError,
    UnsupportedOperationError,
)
from icefloe.io.fileio import LocalFileIO
from icefloe.spec.metadata import TableMetadata
from icefloe.spec.schema import Schema
from icefloe.spec.types import LongType, NestedField
from icefloe.table.catalog import Table, TableChange, TableIdentifier
from icefloe.table.changes import TableCommit, commit_table_changes
from icefloe.table.commit import CommitStats, RetryPolicy
from icefloe.table.updates import apply_updates

SCHEMA = Schema(NestedField(1, "id", LongType(), required=True))
FAST = RetryPolicy(num_retries=3, min_wait_ms=1, max_wait_ms=2, total_timeout_ms=10_000)
T = TableIdentifier(("db",), "t")


class RacedCatalog(FileSystemCatalog):
    """Before each of the next ``rivals`` swaps, a rival commit lands first."""

    def __init__(self, warehouse: Path) -> None:
        super().__init__("raced", str(warehouse), LocalFileIO())
        self.rivals: list[list[dict[str, Any]]] = []
        self.swaps = 0

    async def commit(self, table: Table, new_metadata: TableMetadata) -> Table:
        self.swaps += 1
        if self.rivals:
            rival = self.rivals.pop(0)
            current = await self.load_table(table.identifier)
            await super().commit(
                current, apply_updates(current.metadata, rival, current.metadata_location)
            )
        return await super().commit(table, new_metadata)


@pytest.fixture
async def catalog(tmp_path: Path) -> RacedCatalog:
    cat = RacedCatalog(tmp_path)
    await cat.create_namespace("db")
    await cat.create_table(T, SCHEMA)
    return cat


def props(**values: str) -> dict[str, Any]:
    return {"action": "set-properties", "updates": values}


async def test_a_lost_swap_is_retried_when_the_requirements_still_hold(
    catalog: RacedCatalog,
) -> None:
    catalog.rivals = [[props(rival="1")], [props(rival2="1")]]
    commit = TableCommit.parse(
        T, [{"type": "assert-current-schema-id", "current-schema-id": 0}], [props(mine="1")]
    )
    stats = CommitStats()
    (outcome,) = await commit_table_changes(catalog, [commit], FAST, stats)
    assert outcome.changed and catalog.swaps == 3
    assert (stats.attempts, stats.conflicts) == (3, 2)
    table = await catalog.load_table(T)
    assert table.metadata.properties == {"rival": "1", "rival2": "1", "mine": "1"}
    assert table.metadata_location == outcome.table.metadata_location
    # Three versions after the first: rival, rival, ours; each logged once.
    assert len(table.metadata.metadata_log) == 3


async def test_a_lost_swap_whose_requirement_now_fails_is_a_conflict_with_nothing_applied(
    catalog: RacedCatalog,
) -> None:
    wider = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "x", LongType()))
    catalog.rivals = [
        [
            {"action": "add-schema", "schema": wider.to_json()},
            {"action": "set-current-schema", "schema-id": -1},
        ]
    ]
    commit = TableCommit.parse(
        T, [{"type": "assert-current-schema-id", "current-schema-id": 0}], [props(mine="1")]
    )
    with pytest.raises(CommitFailedError, match="assert-current-schema-id"):
        await commit_table_changes(catalog, [commit], FAST)
    table = await catalog.load_table(T)
    assert table.metadata.current_schema_id == 1
    assert "mine" not in table.metadata.properties
    assert len(table.metadata.metadata_log) == 1  # the rival's version only


async def test_missing_tables_creates_and_unsupported_transactions(catalog: RacedCatalog) -> None:
    with pytest.raises(NotFoundError):
        await commit_table_changes(
            catalog, [TableCommit.parse(TableIdentifier(("db",), "nope"), [], [props(a="1")])]
        )
    other = TableIdentifier(("db",), "u")
    await catalog.create_table(other, SCHEMA)
    both = [TableCommit.parse(T, [], [props(a="1")]), TableCommit.parse(other, [], [props(a="1")])]
    before = (await catalog.load_table(T)).metadata_location
    with pytest.raises(UnsupportedOperationError, match="atomically"):
        await commit_table_changes(catalog, both)
    assert (await catalog.load_table(T)).metadata_location == before
    # assert-create on an existing table: a conflict, not an overwrite.
    create = TableCommit.parse(T, [{"type": "assert-create"}], [])
    with pytest.raises(CommitFailedError, match="assert-create"):
        await commit_table_changes(catalog, [create])


def test_create_transactions_may_add_the_spec_before_setting_the_schema() -> None:
    """DuckDB's create order: add-schema, add-spec, ..., set-current-schema last."""
    schema = {
        "type": "struct",
        "fields": [{"id": 1, "name": "id", "type": "long", "required": True}],
    }
    metadata = apply_updates(
        None,
        [
            {"action": "assign-uuid", "uuid": "3bf800d2-04e5-4a92-a2fb-57c943722726"},
            {"action": "add-schema", "schema": schema},
            {
                "action": "add-spec",
                "spec": {"fields": [{"source-id": 1, "transform": "bucket[2]", "name": "b"}]},
            },
            {"action": "set-default-spec", "spec-id": -1},
            {"action": "add-sort-order", "sort-order": {"order-id": 0, "fields": []}},
            {"action": "set-default-sort-order", "sort-order-id": -1},
            {"action": "set-location", "location": "/tmp/t"},
            {"action": "set-current-schema", "schema-id": -1},
        ],
    )
    assert metadata.spec().fields[0].source_id == 1
    assert metadata.current_schema_id == 0


@pytest.mark.integration
@pytest.mark.parametrize("store", ["redis", "dynamodb"])
async def test_multi_table_swaps_are_all_or_nothing(
    store: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """One stale base among several: no table moves, and the new metadata files are removed."""
    from icefloe.catalog.uri import load_catalog

    if store == "redis":
        uri = f"{request.getfixturevalue('redis_server')}?warehouse={tmp_path}&prefix=m{uuid4().hex[:8]}"
    else:
        moto_endpoint = request.getfixturevalue("moto_server")  # TransactWriteItems
        uri = (
            f"dynamodb://m{uuid4().hex[:8]}?endpoint={moto_endpoint}&region=us-east-1"
            f"&warehouse={tmp_path}&dynamodb.access-key-id=test&dynamodb.secret-access-key=test"
        )
    catalog = load_catalog(uri)
    try:
        assert catalog.supports_multi_table_commits
        await catalog.create_namespace("db")
        a = await catalog.create_table("db.a", SCHEMA)
        b = await catalog.create_table("db.b", SCHEMA)

        def changed(table: Table, **values: str) -> TableMetadata:
            return apply_updates(table.metadata, [props(**values)], table.metadata_location)

        await catalog.commit(b, changed(b, rival="1"))  # b's base is now stale
        files_before = {p for p in tmp_path.rglob("*.metadata.json")}
        with pytest.raises(CommitFailedError):
            await catalog.commit_tables(
                [
                    TableChange(a.identifier, a, changed(a, x="1")),
                    TableChange(b.identifier, b, changed(b, x="1")),
                ]
            )
        assert (await catalog.load_table("db.a")).metadata_location == a.metadata_location
        assert "x" not in (await catalog.load_table("db.b")).metadata.properties
        assert {p for p in tmp_path.rglob("*.metadata.json")} == files_before
        # With fresh bases both move together, and a create rides along.
        a, b = await catalog.load_table("db.a"), await catalog.load_table("db.b")
        created = apply_updates(
            None,
            [
                {"action": "assign-uuid", "uuid": str(uuid4())},
                {"action": "add-schema", "schema": SCHEMA.to_json()},
                {"action": "set-current-schema", "schema-id": -1},
                {"action": "add-spec", "spec": {"fields": []}},
                {"action": "set-default-spec", "spec-id": -1},
                {"action": "add-sort-order", "sort-order": {"order-id": 0, "fields": []}},
                {"action": "set-default-sort-order", "sort-order-id": -1},
                {"action": "set-location", "location": f"{tmp_path}/db/c"},
            ],
        )
        c = TableIdentifier(("db",), "c")
        done = await catalog.commit_tables(
            [
                TableChange(a.identifier, a, changed(a, x="1")),
                TableChange(b.identifier, b, changed(b, x="1")),
                TableChange(c, None, created),
            ]
        )
        assert [t.identifier.name for t in done] == ["a", "b", "c"]
        for name in ("db.a", "db.b"):
            assert (await catalog.load_table(name)).metadata.properties.get("x") == "1"
        assert (await catalog.load_table("db.c")).metadata.table_uuid == created.table_uuid
        # Renaming moves the pointer; the old name is gone, the new one already taken fails.
        await catalog.rename_table("db.c", "db.d")
        assert not await catalog.table_exists("db.c")
        with pytest.raises(AlreadyExistsError):
            await catalog.rename_table("db.d", "db.a")
    finally:
        await catalog.close()


async def test_dedup_evidence_is_never_removed_through_a_rest_commit(
    catalog: RacedCatalog,
) -> None:
    """A snapshot recording commit ids inside the dedup window, and the dedup ledger, are
    refused with a ValidationError (HTTP 400) naming the setting, before anything is
    written; outside the window (after lowering it) the same removal applies."""
    import json

    from icefloe.errors import ValidationError
    from icefloe.spec.metadata_builder import MetadataBuilder
    from icefloe.spec.snapshot import Operation, Snapshot, SnapshotRef, Summary
    from icefloe.table.commit_index import DEDUP_WINDOW_MS, SUMMARY_COMMIT_IDS
    from icefloe.table.dedup_ledger import LEDGER_PROPERTY

    table = await catalog.load_table(T)
    builder = MetadataBuilder(table.metadata)
    for sid in (1, 2):
        builder.add_snapshot(
            Snapshot(
                snapshot_id=sid,
                parent_snapshot_id=sid - 1 or None,
                sequence_number=sid,
                timestamp_ms=table.metadata.last_updated_ms + sid,
                manifest_list=f"{table.location}/metadata/snap-{sid}.avro",
                summary=Summary(Operation.APPEND, {SUMMARY_COMMIT_IDS: json.dumps([f"c{sid}"])}),
            )
        ).set_ref("main", SnapshotRef.branch(sid))
    builder.set_properties({LEDGER_PROPERTY: "v1 1:1:AAAAAAAAAAAAAAAA"})
    await catalog.commit(table, builder.build(table.metadata_location))

    expire = {"action": "remove-snapshots", "snapshot-ids": [1]}
    for updates in (
        [expire],
        [{"action": "remove-properties", "removals": [LEDGER_PROPERTY]}],
        [props(**{LEDGER_PROPERTY: "v1 "})],
    ):
        with pytest.raises(ValidationError, match=f"{DEDUP_WINDOW_MS}|dedup ledger"):
            await commit_table_changes(catalog, [TableCommit.parse(T, [], updates)], FAST)
    after = await catalog.load_table(T)
    assert after.metadata.snapshot_by_id(1) is not None
    assert LEDGER_PROPERTY in after.metadata.properties

    lower = TableCommit.parse(T, [], [props(**{DEDUP_WINDOW_MS: "0"})])
    await commit_table_changes(catalog, [lower], FAST)
    await commit_table_changes(catalog, [TableCommit.parse(T, [], [expire])], FAST)
    assert (await catalog.load_table(T)).metadata.snapshot_by_id(1) is None
