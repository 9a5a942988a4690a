"""A metastore catalog in Redis, through redis-py's asyncio client (``redis.asyncio``).

Every key shares one hash tag (``{prefix}``) so the multi-key Lua scripts below also run on
Redis Cluster, where a script may only touch keys of one slot. A catalog is small (one hash
per table), so keeping it on one shard costs nothing that matters.

Keys::

    {icefloe}:namespaces              set of dotted namespace names
    {icefloe}:ns:<ns>                 hash of namespace properties
    {icefloe}:tables:<ns>             set of table names in the namespace
    {icefloe}:table:<ns>.<table>      hash: metadata_location, previous_metadata_location,
                                      v (a uuid per commit), created_at, updated_at

The pointer swap is one server-side script: it compares the stored location with the base
the committer read and writes the new one only if they are equal, so no committer can
overwrite a commit it did not see.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from redis.asyncio import Redis

from icefloe.errors import (
    AlreadyExistsError,
    CommitFailedError,
    NamespaceNotEmptyError,
    NotFoundError,
)
from icefloe.io.fileio import FileIO
from icefloe.table.catalog import MetastoreCatalog, Namespace, TableIdentifier, parse_namespace

_CREATE_TABLE = """
if redis.call('SISMEMBER', KEYS[3], ARGV[1]) == 0 then return -1 end
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'metadata_location', ARGV[3], 'previous_metadata_location', '',
           'v', ARGV[4], 'created_at', ARGV[5], 'updated_at', ARGV[5])
redis.call('SADD', KEYS[2], ARGV[2])
return 1
"""

_SWAP = """
local current = redis.call('HGET', KEYS[1], 'metadata_location')
if not current then return -1 end
if current ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'metadata_location', ARGV[2], 'previous_metadata_location', ARGV[1],
           'v', ARGV[3], 'updated_at', ARGV[4])
return 1
"""

_RENAME_TABLE = """
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
if redis.call('SISMEMBER', KEYS[5], ARGV[2]) == 0 then return -2 end
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
redis.call('RENAME', KEYS[1], KEYS[2])
redis.call('HSET', KEYS[2], 'v', ARGV[4], 'updated_at', ARGV[5])
redis.call('SREM', KEYS[3], ARGV[1])
redis.call('SADD', KEYS[4], ARGV[3])
return 1
"""

# KEYS: per table its hash and its namespace's table set, then the namespaces set.
# ARGV: per table namespace, name, expected location ('' to create), new location, token;
# then the time. Every check runs before any write: all tables move, or none.
_SWAP_MANY = """
local n = (#KEYS - 1) / 2
local namespaces = KEYS[#KEYS]
for i = 1, n do
  local b = (i - 1) * 5
  local current = redis.call('HGET', KEYS[2 * i - 1], 'metadata_location')
  if ARGV[b + 3] == '' then
    if current then return {0, i} end
    if redis.call('SISMEMBER', namespaces, ARGV[b + 1]) == 0 then return {-2, i} end
  else
    if not current then return {-1, i} end
    if current ~= ARGV[b + 3] then return {0, i} end
  end
end
local now = ARGV[#ARGV]
for i = 1, n do
  local b = (i - 1) * 5
  local key = KEYS[2 * i - 1]
  if ARGV[b + 3] == '' then
    redis.call('HSET', key, 'metadata_location', ARGV[b + 4], 'previous_metadata_location', '',
               'v', ARGV[b + 5], 'created_at', now, 'updated_at', now)
    redis.call('SADD', KEYS[2 * i], ARGV[b + 2])
  else
    redis.call('HSET', key, 'metadata_location', ARGV[b + 4],
               'previous_metadata_location', ARGV[b + 3], 'v', ARGV[b + 5], 'updated_at', now)
  end
end
return {1, 0}
"""

_DROP_TABLE = """
if redis.call('DEL', KEYS[1]) == 0 then return 0 end
redis.call('SREM', KEYS[2], ARGV[1])
return 1
"""

_DROP_NAMESPACE = """
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 0 then return -1 end
if redis.call('SCARD', KEYS[2]) > 0 then return 0 end
redis.call('SREM', KEYS[1], ARGV[1])
redis.call('DEL', KEYS[3])
return 1
"""


def _now_ms() -> str:
    return str(int(time.time() * 1000))


class RedisCatalog(MetastoreCatalog):
    supports_rename = True
    supports_multi_table_commits = True

    def __init__(
        self,
        name: str,
        url: str,
        io: FileIO,
        properties: Mapping[str, str] | None = None,
        prefix: str = "icefloe",
    ) -> None:
        super().__init__(name, io, properties)
        self.url = url
        # decode_responses=True makes every reply a str, which redis-py's stubs cannot express.
        self.redis: Any = Redis.from_url(url, decode_responses=True)
        self._tag = "{" + prefix + "}"
        self._create = self.redis.register_script(_CREATE_TABLE)
        self._swap = self.redis.register_script(_SWAP)
        self._drop_table = self.redis.register_script(_DROP_TABLE)
        self._drop_ns = self.redis.register_script(_DROP_NAMESPACE)
        self._rename = self.redis.register_script(_RENAME_TABLE)
        self._swap_many = self.redis.register_script(_SWAP_MANY)

    # -- keys -----------------------------------------------------------------------------

    @property
    def _namespaces_key(self) -> str:
        return f"{self._tag}:namespaces"

    def _ns_key(self, ns: Namespace) -> str:
        return f"{self._tag}:ns:{'.'.join(ns)}"

    def _tables_key(self, ns: Namespace) -> str:
        return f"{self._tag}:tables:{'.'.join(ns)}"

    def _table_key(self, ident: TableIdentifier) -> str:
        return f"{self._tag}:table:{ident}"

    # -- namespaces ---------------------------------------------------------------------

    async def create_namespace(
        self, namespace: str | Namespace, properties: Mapping[str, str] | None = None
    ) -> None:
        ns = parse_namespace(namespace)
        name = ".".join(ns)
        async with self.redis.pipeline(transaction=True) as pipe:
            await pipe.watch(self._namespaces_key)
            if await pipe.sismember(self._namespaces_key, name):
                raise AlreadyExistsError(f"namespace {name!r} already exists")
            pipe.multi()
            pipe.sadd(self._namespaces_key, name)
            if properties:
                pipe.hset(self._ns_key(ns), mapping=dict(properties))
            await pipe.execute()

    async def list_namespaces(self, parent: str | Namespace = ()) -> list[Namespace]:
        base = parse_namespace(parent) if parent else ()
        names = await self.redis.smembers(self._namespaces_key)
        out = [tuple(n.split(".")) for n in names]
        return sorted(ns for ns in out if ns[: len(base)] == base and len(ns) == len(base) + 1)

    async def load_namespace_properties(self, namespace: str | Namespace) -> dict[str, str]:
        ns = parse_namespace(namespace)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.sismember(self._namespaces_key, ".".join(ns))
            pipe.hgetall(self._ns_key(ns))
            exists, props = await pipe.execute()
        if not exists:
            raise NotFoundError(f"namespace {'.'.join(ns)!r} does not exist")
        return dict(props)

    async def update_namespace_properties(
        self,
        namespace: str | Namespace,
        removals: set[str] | None = None,
        updates: Mapping[str, str] | None = None,
    ) -> None:
        ns = parse_namespace(namespace)
        await self.load_namespace_properties(ns)
        async with self.redis.pipeline(transaction=True) as pipe:
            if removals:
                pipe.hdel(self._ns_key(ns), *removals)
            if updates:
                pipe.hset(self._ns_key(ns), mapping=dict(updates))
            await pipe.execute()

    async def drop_namespace(self, namespace: str | Namespace) -> None:
        ns = parse_namespace(namespace)
        name = ".".join(ns)
        if await self.list_namespaces(ns):
            raise NamespaceNotEmptyError(f"namespace {name!r} has child namespaces")
        result = await self._drop_ns(
            keys=[self._namespaces_key, self._tables_key(ns), self._ns_key(ns)], args=[name]
        )
        if result == -1:
            raise NotFoundError(f"namespace {name!r} does not exist")
        if result == 0:
            raise NamespaceNotEmptyError(f"namespace {name!r} is not empty")

    # -- tables -------------------------------------------------------------------------

    async def list_tables(self, namespace: str | Namespace) -> list[TableIdentifier]:
        ns = parse_namespace(namespace)
        await self.load_namespace_properties(ns)
        names = await self.redis.smembers(self._tables_key(ns))
        return [TableIdentifier(ns, n) for n in sorted(names)]

    async def _load_pointer(self, identifier: TableIdentifier) -> tuple[str, str | None]:
        row: dict[str, Any] = await self.redis.hgetall(self._table_key(identifier))
        location = row.get("metadata_location")
        if not location:
            raise NotFoundError(f"table {identifier} does not exist")
        return location, row.get("v")

    async def _create_pointer(
        self, identifier: TableIdentifier, metadata_location: str
    ) -> str | None:
        token = str(uuid.uuid4())
        result = await self._create(
            keys=[
                self._table_key(identifier),
                self._tables_key(identifier.namespace),
                self._namespaces_key,
            ],
            args=[identifier.namespace_name, identifier.name, metadata_location, token, _now_ms()],
        )
        if result == -1:
            raise NotFoundError(f"namespace {identifier.namespace_name!r} does not exist")
        if result == 0:
            raise AlreadyExistsError(f"table {identifier} already exists")
        return token

    async def _swap_pointer(
        self, identifier: TableIdentifier, expected: str, token: str | None, new: str
    ) -> str | None:
        new_token = str(uuid.uuid4())
        # A RedisError here leaves the outcome unknown; the base class re-reads the pointer.
        result = await self._swap(
            keys=[self._table_key(identifier)], args=[expected, new, new_token, _now_ms()]
        )
        if result == -1:
            raise CommitFailedError(f"table {identifier} was dropped concurrently")
        if result == 0:
            raise CommitFailedError(
                f"table {identifier} was committed concurrently (pointer is no longer {expected})"
            )
        return new_token

    async def _swap_pointers(
        self, swaps: Sequence[tuple[TableIdentifier, str | None, str | None, str]]
    ) -> list[str | None]:
        keys: list[str] = []
        args: list[str] = []
        tokens: list[str | None] = []
        for ident, expected, _token, new in swaps:
            token = str(uuid.uuid4())
            tokens.append(token)
            keys += [self._table_key(ident), self._tables_key(ident.namespace)]
            args += [ident.namespace_name, ident.name, expected or "", new, token]
        result = await self._swap_many(keys=[*keys, self._namespaces_key], args=[*args, _now_ms()])
        status, index = int(result[0]), int(result[1])
        if status == 1:
            return tokens
        ident = swaps[index - 1][0]
        if status == -2:
            raise NotFoundError(f"namespace {ident.namespace_name!r} does not exist")
        if status == -1:
            raise CommitFailedError(f"table {ident} was dropped concurrently")
        if swaps[index - 1][1] is None:
            raise CommitFailedError(f"table {ident} was created concurrently")
        raise CommitFailedError(f"table {ident} was committed concurrently")

    async def rename_table(
        self, source: str | TableIdentifier, destination: str | TableIdentifier
    ) -> None:
        """One script moves the pointer row: a concurrent commit to the old name then fails."""
        src, dst = TableIdentifier.parse(source), TableIdentifier.parse(destination)
        result = await self._rename(
            keys=[
                self._table_key(src),
                self._table_key(dst),
                self._tables_key(src.namespace),
                self._tables_key(dst.namespace),
                self._namespaces_key,
            ],
            args=[src.name, dst.namespace_name, dst.name, str(uuid.uuid4()), _now_ms()],
        )
        if result == -1:
            raise NotFoundError(f"table {src} does not exist")
        if result == -2:
            raise NotFoundError(f"namespace {dst.namespace_name!r} does not exist")
        if result == 0:
            raise AlreadyExistsError(f"table {dst} already exists")

    async def drop_table(self, identifier: str | TableIdentifier, purge: bool = False) -> None:
        ident = TableIdentifier.parse(identifier)
        table = await self.load_table(ident) if purge else None
        result = await self._drop_table(
            keys=[self._table_key(ident), self._tables_key(ident.namespace)], args=[ident.name]
        )
        if result == 0:
            raise NotFoundError(f"table {ident} does not exist")
        if table is not None:
            from icefloe.table.maintenance import purge_table_files

            await purge_table_files(table)

    def _records(self) -> Any:
        """Small records (idempotency answers, plan cancellations) in this Redis."""
        from icefloe.catalog.records import RedisRecords

        return RedisRecords(self.redis, self._tag)

    def _location_index(self) -> Any:
        from icefloe.catalog.location_index import RedisLocations

        return RedisLocations(self.redis, self._tag)

    async def close(self) -> None:
        await self.redis.aclose()
        await super().close()
