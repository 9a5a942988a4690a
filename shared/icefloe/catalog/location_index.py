"""Which table lives where: an index of table locations kept with the catalog.

On a metastore catalog (Redis, DynamoDB) a table's location is whatever its metadata says,
and on the file-system catalog a registered table keeps the location of the metadata it
was registered from. Two tables whose locations overlap (one contains the other) share
files, and purging one deletes the other's. Finding overlaps by loading every table costs a
read per table; the index answers with a few range reads:

* Redis: one sorted set (``{prefix}:locations``) of ``<location>/\\x1f<table>`` members, all
  of score 0, so ``ZRANGEBYLEX`` finds the tables at or below a location and those at each
  of its ancestors;
* DynamoDB: one item per table in the catalog's table (``identifier`` ``~location``,
  ``namespace`` the same member), found with ``begins_with`` queries on the sort key;
* any other catalog: no stored index; every table of the namespace tree is loaded
  (:class:`ScannedLocations`, linear in the number of tables).

Entries are written by the metastore catalogs when they create, register or move a table
(whoever asks: the REST catalog, a coordinator, the core library), by the REST catalog when
it renames or drops one, and filled from the catalog's existing tables the first time a
process uses the index (a shared marker record says it was done). Claims are optimistic and safe under
concurrency: a claimer adds its entry and then looks for others, so of two overlapping
claims at least one sees the other and withdraws.

Other engines write the same catalog without it (PyIceberg's or Java's DynamoDB catalog;
icefloe's own core drops and renames), so an entry is a hint, verified against the catalog
before it refuses anything: an entry whose table no longer exists at that location is
stale. A stale entry is removed, and since it says the catalog changed behind the index
(the table may have been renamed, its location now another name's), the catalog's tables
are scanned again and every one the index lacks is entered before the question is
answered. The scan is also repeated every :data:`RESCAN_S` (the shared marker expires),
which bounds how long a table created outside the REST catalog goes unseen.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Set as AbstractSet
from typing import Any

from icefloe.errors import InvalidFileError, NotFoundError, ValidationError
from icefloe.io.locations import location_key
from icefloe.table.catalog import Catalog, Namespace, TableIdentifier

log = logging.getLogger(__name__)

_SEP = "\x1f"  # no normal location holds a control character
_TOP = "\U0010ffff"
# (Not "location-index-filled": that marker, of earlier versions, never expires.)
_FILLED = "location-index-scanned"
RESCAN_S = 300.0  # how often some process scans the catalog for tables the index lacks


def _ancestors(key: str) -> list[str]:
    """Proper ancestors of a location key, each ending in ``/`` (``s3://b/``, ``file:///``)."""
    scheme, _, rest = key.partition("://")
    out: list[str] = []
    position = 0
    while True:
        position = rest.find("/", position)
        if position < 0 or position + 1 >= len(rest):
            return out
        out.append(f"{scheme}://{rest[: position + 1]}")
        position += 1


def _member(key: str, table: TableIdentifier) -> str:
    return f"{key}{_SEP}{table}"


def _parse(member: str) -> tuple[str, TableIdentifier]:
    key, _, table = member.rpartition(_SEP)
    return key, TableIdentifier.parse(table)


def _overlap(a: str, b: str) -> bool:
    return a.startswith(b) or b.startswith(a)


class LocationIndex(ABC):
    """Entries ``(location key, table)``; :meth:`near` returns those that may overlap."""

    stored = True

    @abstractmethod
    async def add(self, key: str, table: TableIdentifier) -> None: ...

    @abstractmethod
    async def remove(self, key: str, table: TableIdentifier) -> None: ...

    @abstractmethod
    async def near(self, key: str) -> list[tuple[str, TableIdentifier]]:
        """Entries at ``key``, below it, or at one of its ancestors."""

    @abstractmethod
    async def tables(self) -> set[TableIdentifier]:
        """The tables of every entry."""


class RedisLocations(LocationIndex):
    def __init__(self, redis: Any, tag: str) -> None:
        self.redis = redis
        self.name = f"{tag}:locations"

    async def add(self, key: str, table: TableIdentifier) -> None:
        await self.redis.zadd(self.name, {_member(key, table): 0})

    async def remove(self, key: str, table: TableIdentifier) -> None:
        await self.redis.zrem(self.name, _member(key, table))

    async def near(self, key: str) -> list[tuple[str, TableIdentifier]]:
        pipe = self.redis.pipeline(transaction=False)
        pipe.zrangebylex(self.name, f"[{key}", f"({key}{_TOP}")
        for ancestor in _ancestors(key):
            pipe.zrangebylex(self.name, f"[{ancestor}{_SEP}", f"({ancestor}{_SEP}{_TOP}")
        found = await pipe.execute()
        return [_parse(m) for members in found for m in members]

    async def tables(self) -> set[TableIdentifier]:
        return {_parse(m)[1] for m in await self.redis.zrange(self.name, 0, -1)}


LOCATION_ROW = "~location"


class DynamoDbLocations(LocationIndex):
    def __init__(self, catalog: Any) -> None:
        self.catalog = catalog  # a DynamoDbCatalog: its client and table

    def _key(self, key: str, table: TableIdentifier) -> dict[str, Any]:
        return {"identifier": {"S": LOCATION_ROW}, "namespace": {"S": _member(key, table)}}

    async def add(self, key: str, table: TableIdentifier) -> None:
        db = await self.catalog._db()
        await db.put_item(TableName=self.catalog.table_name, Item=self._key(key, table))

    async def remove(self, key: str, table: TableIdentifier) -> None:
        db = await self.catalog._db()
        await db.delete_item(TableName=self.catalog.table_name, Key=self._key(key, table))

    async def _starting(self, prefix: str) -> list[tuple[str, TableIdentifier]]:
        db = await self.catalog._db()
        out: list[tuple[str, TableIdentifier]] = []
        start: dict[str, Any] | None = None
        while True:
            extra: dict[str, Any] = {"ExclusiveStartKey": start} if start else {}
            if prefix:
                extra["KeyConditionExpression"] = "identifier = :i AND begins_with(#n, :p)"
                extra["ExpressionAttributeNames"] = {"#n": "namespace"}
                extra["ExpressionAttributeValues"] = {
                    ":i": {"S": LOCATION_ROW},
                    ":p": {"S": prefix},
                }
            else:  # (a key condition may not hold an empty string)
                extra["KeyConditionExpression"] = "identifier = :i"
                extra["ExpressionAttributeValues"] = {":i": {"S": LOCATION_ROW}}
            page = await db.query(TableName=self.catalog.table_name, ConsistentRead=True, **extra)
            out.extend(_parse(item["namespace"]["S"]) for item in page.get("Items", []))
            start = page.get("LastEvaluatedKey")
            if not start:
                return out

    async def tables(self) -> set[TableIdentifier]:
        return {table for _, table in await self._starting("")}

    async def near(self, key: str) -> list[tuple[str, TableIdentifier]]:
        found = await self._starting(key)
        for ancestor in _ancestors(key):
            found.extend(await self._starting(ancestor + _SEP))
        return found


class ScannedLocations(LocationIndex):
    """No stored index: every table of the catalog is loaded when asked."""

    stored = False

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog

    async def add(self, key: str, table: TableIdentifier) -> None:
        return None

    async def remove(self, key: str, table: TableIdentifier) -> None:
        return None

    async def near(self, key: str) -> list[tuple[str, TableIdentifier]]:
        return [(k, t) for k, t in await all_table_locations(self.catalog) if _overlap(k, key)]

    async def tables(self) -> set[TableIdentifier]:
        return set()


async def all_table_locations(
    catalog: Catalog, known: AbstractSet[TableIdentifier] = frozenset()
) -> list[tuple[str, TableIdentifier]]:
    """Every table of the namespace tree but ``known`` with its location key (one load per
    table)."""
    out: list[tuple[str, TableIdentifier]] = []
    pending: list[Namespace] = list(await catalog.list_namespaces())
    while pending:
        namespace = pending.pop()
        try:
            pending.extend(await catalog.list_namespaces(namespace))
            tables = await catalog.list_tables(namespace)
        except NotFoundError:
            continue
        for ident in tables:
            if ident in known:
                continue
            try:
                table = await catalog.load_table(ident)
            except (NotFoundError, InvalidFileError, ValidationError) as e:
                log.warning("location index: skipping table %s: %s", ident, e)
                continue
            out.append((location_key(table.location), ident))
    return out


def location_index(catalog: Catalog) -> LocationIndex:
    """The index of ``catalog`` (see the module docstring)."""
    stored = getattr(catalog, "_location_index", lambda: None)()
    return stored if isinstance(stored, LocationIndex) else ScannedLocations(catalog)


class TableLocations:
    """The catalog's tables by location: claims, releases and overlap questions."""

    def __init__(self, catalog: Catalog, index: LocationIndex | None = None) -> None:
        self.catalog = catalog
        self.index = index or location_index(catalog)
        self._scanned_at: float | None = None  # monotonic; None: not yet in this process

    async def _fill(self) -> None:
        """Enter the catalog's tables the index lacks (tables made before the index was,
        or by other engines), unless some process did within :data:`RESCAN_S`."""
        if not self.index.stored:
            return
        now = time.monotonic()
        if self._scanned_at is not None and now - self._scanned_at < RESCAN_S:
            return
        from icefloe.catalog.records import catalog_records

        records = catalog_records(self.catalog)
        if await records.get(_FILLED) is None:
            await self._scan()
            await records.put(_FILLED, b"1", RESCAN_S)
        self._scanned_at = now

    async def _scan(self) -> list[tuple[str, TableIdentifier]]:
        """The catalog's tables the index has no entry for, each entered in it: one listing
        of the catalog, and one load per table found. (Entered tables are verified when
        met; a stale entry's table is rescanned by name when it has none left.)"""
        found = await all_table_locations(self.catalog, await self.index.tables())
        for key, ident in found:
            await self.index.add(key, ident)
        return found

    async def _live(self, key: str, table: TableIdentifier) -> bool:
        """Whether ``table`` still exists at ``key``; a stale entry is removed."""
        try:
            current = await self.catalog.load_table(table)
        except NotFoundError:
            current = None
        if current is not None and location_key(current.location) == key:
            return True
        if self.index.stored:
            log.info("location index: removing stale entry %s at %s", table, key)
            await self.index.remove(key, table)
        return False

    async def overlapping_table(
        self, location: str, *, excluding: TableIdentifier | None = None
    ) -> TableIdentifier | None:
        """A live table, other than ``excluding``, whose location overlaps ``location``."""
        await self._fill()
        key = location_key(location)
        stale = False
        for other_key, other in await self.index.near(key):
            if other == excluding or not _overlap(other_key, key):
                continue
            if await self._live(other_key, other):
                return other
            stale = True
        if stale:
            # Changed behind the index: a renamed table's location is under a name the
            # index does not know yet.
            log.info("location index: stale entries near %s; scanning the catalog", key)
            for other_key, other in await self._scan():
                if other != excluding and _overlap(other_key, key):
                    return other
        return None

    async def claim(self, location: str, table: TableIdentifier) -> TableIdentifier | None:
        """Enter ``table`` at ``location`` unless another live table overlaps it (returned
        then, with nothing entered)."""
        await self._fill()
        key = location_key(location)
        await self.index.add(key, table)
        other = await self.overlapping_table(location, excluding=table)
        if other is not None:
            await self.index.remove(key, table)
        return other

    async def release(self, location: str, table: TableIdentifier) -> None:
        await self.index.remove(location_key(location), table)

    async def moved(
        self, old: tuple[str, TableIdentifier], new: tuple[str, TableIdentifier]
    ) -> None:
        """A table renamed or relocated: its entry follows (added first, then removed)."""
        if old != new:
            await self.index.add(location_key(new[0]), new[1])
            await self.release(*old)
