"""The planner's refresher does not take a commit event's word for which metadata a table has,
and reads the catalog at a longer interval even while events are trusted."""

from __future__ import annotations

from pathlib import Path

from test_planner import Manual, append, batch, build_world

from icefloe.catalog.fs import FileSystemCatalog
from icefloe.events import TableCommitted
from icefloe.io.fileio import LocalFileIO
from icefloe.planner.refresher import TableRefresher
from icefloe.table.catalog import TableIdentifier


def _event(table: str, location: str, snapshot_id: int, seq: int) -> TableCommitted:
    return TableCommitted(
        table=table,
        snapshot_id=snapshot_id,
        sequence_number=seq,
        metadata_location=location,
        commit_ids=["c1"],
        latency_ms=1,
    )


async def test_an_event_naming_another_tables_metadata_is_rejected(tmp_path: Path) -> None:
    world = await build_world(tmp_path)
    catalog = FileSystemCatalog("planner", str(tmp_path), LocalFileIO())
    other = await catalog.create_table("db.other", world.table.metadata.schema())
    other, _ = await append(other, batch(0, 3, 0))
    refresher = TableRefresher(catalog, refresh_interval_s=10, clock=Manual())
    ident = TableIdentifier.parse("db.events")
    before = await refresher.get(ident)
    snapshot = other.metadata.current_snapshot()
    assert snapshot is not None
    forged = _event(
        "db.events",
        other.metadata_location,
        snapshot.snapshot_id,
        other.metadata.last_sequence_number + 100,
    )
    assert not await refresher.apply_event(forged)
    after = await refresher.get(ident)
    assert after.metadata_location == before.metadata_location
    assert after.metadata.table_uuid == world.table.metadata.table_uuid
    assert refresher.rejected_events == 1
    # A genuine commit of the table itself is still applied.
    table, _ = await append(world.table, batch(500, 3, 0))
    snap = table.metadata.current_snapshot()
    assert snap is not None
    genuine = _event(
        "db.events", table.metadata_location, snap.snapshot_id, table.metadata.last_sequence_number
    )
    assert await refresher.apply_event(genuine)
    assert (await refresher.get(ident)).metadata_location == table.metadata_location


async def test_trusted_events_still_let_other_writers_commits_through(tmp_path: Path) -> None:
    world = await build_world(tmp_path)
    catalog = FileSystemCatalog("planner", str(tmp_path), LocalFileIO())
    clock = Manual()
    refresher = TableRefresher(
        catalog, refresh_interval_s=10, trusted_refresh_interval_s=60, clock=clock
    )
    ident = TableIdentifier.parse("db.events")
    first = await refresher.get(ident)
    table, _ = await append(world.table, batch(700, 3, 0))  # another writer: no event
    clock.now += 30
    refresher.events_confirmed(clock.now)  # the (trusted) topic is caught up
    assert (await refresher.get(ident)).metadata_location == first.metadata_location
    clock.now += 31  # past the trusted interval: the catalog is read again
    refresher.events_confirmed(clock.now)
    assert (await refresher.get(ident)).metadata_location == table.metadata_location
