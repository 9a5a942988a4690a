"""Small expiring records kept with a catalog, shared by every process that uses it.

Some REST catalog state must hold across planner replicas without a store of its own: the
first answer to a request sent with an ``Idempotency-Key`` is one. It lives where the
catalog lives, so replicas that share a catalog share it:

* Redis: one string key per record (``{prefix}:record:<key>``), ``SET NX PX`` to claim;
* DynamoDB: one item per record in the catalog's table (``identifier`` ``~record``,
  ``namespace`` the key), claimed with a conditional put; its ``ttl`` attribute (epoch
  seconds) is what DynamoDB's time-to-live may be pointed at;
* anything else (the file-system catalog): one JSON file per record under
  ``<warehouse>/_icefloe/records/``, claimed with the storage's atomic create-if-absent.

A record past its expiry is absent whatever the store has done with it yet, so expiry is
exact on every store (an expired record is replaced on the next claim).
"""

from __future__ import annotations

import base64
import json
import re
import time
from abc import ABC, abstractmethod
from typing import Any

from botocore.exceptions import ClientError

from icefloe.errors import AlreadyExistsError, NotFoundError, ValidationError
from icefloe.io.fileio import FileIO
from icefloe.table.catalog import Catalog

_KEY = re.compile(r"^[A-Za-z0-9_.:-]{1,200}$")


def _check_key(key: str) -> str:
    if not _KEY.match(key):
        raise ValidationError(f"invalid record key {key[:80]!r}: letters, digits and _.:- only")
    return key


class Records(ABC):
    """Put-if-absent, get, replace and delete of small values, each with an expiry."""

    @abstractmethod
    async def claim(self, key: str, value: bytes, ttl_s: float) -> bool:
        """Store ``value`` only if no live record has ``key``; whether it was stored."""

    @abstractmethod
    async def get(self, key: str) -> bytes | None:
        """The live record's value, or None."""

    @abstractmethod
    async def put(self, key: str, value: bytes, ttl_s: float) -> None:
        """Store ``value`` whatever was there."""

    @abstractmethod
    async def delete(self, key: str) -> None:
        """Remove the record (absent is not an error)."""


class RedisRecords(Records):
    def __init__(self, redis: Any, tag: str) -> None:
        self.redis = redis
        self.tag = tag

    def _name(self, key: str) -> str:
        return f"{self.tag}:record:{_check_key(key)}"

    async def claim(self, key: str, value: bytes, ttl_s: float) -> bool:
        done = await self.redis.set(
            self._name(key), _text(value), nx=True, px=max(1, int(ttl_s * 1000))
        )
        return bool(done)

    async def get(self, key: str) -> bytes | None:
        text = await self.redis.get(self._name(key))
        return None if text is None else _bytes(text)

    async def put(self, key: str, value: bytes, ttl_s: float) -> None:
        await self.redis.set(self._name(key), _text(value), px=max(1, int(ttl_s * 1000)))

    async def delete(self, key: str) -> None:
        await self.redis.delete(self._name(key))


RECORD_ROW = "~record"


class DynamoDbRecords(Records):
    def __init__(self, catalog: Any) -> None:
        self.catalog = catalog  # a DynamoDbCatalog: its client and table

    def _key(self, key: str) -> dict[str, Any]:
        return {"identifier": {"S": RECORD_ROW}, "namespace": {"S": _check_key(key)}}

    def _item(self, key: str, value: bytes, ttl_s: float) -> dict[str, Any]:
        expires = time.time() + ttl_s
        return {
            **self._key(key),
            "value": {"B": value},
            "expires_ms": {"N": str(int(expires * 1000))},
            "ttl": {"N": str(int(expires) + 1)},
        }

    async def claim(self, key: str, value: bytes, ttl_s: float) -> bool:
        db = await self.catalog._db()
        try:
            await db.put_item(
                TableName=self.catalog.table_name,
                Item=self._item(key, value, ttl_s),
                ConditionExpression="attribute_not_exists(identifier) OR expires_ms < :now",
                ExpressionAttributeValues={":now": {"N": str(int(time.time() * 1000))}},
            )
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
                return False
            raise
        return True

    async def get(self, key: str) -> bytes | None:
        db = await self.catalog._db()
        response = await db.get_item(
            TableName=self.catalog.table_name, Key=self._key(key), ConsistentRead=True
        )
        item = response.get("Item")
        if item is None or int(item["expires_ms"]["N"]) < time.time() * 1000:
            return None
        return bytes(item["value"]["B"])

    async def put(self, key: str, value: bytes, ttl_s: float) -> None:
        db = await self.catalog._db()
        await db.put_item(TableName=self.catalog.table_name, Item=self._item(key, value, ttl_s))

    async def delete(self, key: str) -> None:
        db = await self.catalog._db()
        await db.delete_item(TableName=self.catalog.table_name, Key=self._key(key))


class FileRecords(Records):
    """One file per record; the expiry is inside it."""

    def __init__(self, io: FileIO, root: str) -> None:
        self.io = io
        self.root = root.rstrip("/")

    def _path(self, key: str) -> str:
        return f"{self.root}/{_check_key(key)}.json"

    @staticmethod
    def _encode(value: bytes, ttl_s: float) -> bytes:
        expires = time.time() + ttl_s
        return json.dumps({"expires": expires, "value": base64.b64encode(value).decode()}).encode()

    async def _read(self, path: str) -> bytes | None:
        try:
            record = json.loads(await self.io.read(path))
        except NotFoundError:
            return None
        except ValueError:  # a torn or foreign file: treat as absent
            return None
        if float(record.get("expires", 0)) < time.time():
            return None
        return base64.b64decode(record["value"])

    async def claim(self, key: str, value: bytes, ttl_s: float) -> bool:
        path = self._path(key)
        for _ in range(2):
            try:
                await self.io.write_once(path, self._encode(value, ttl_s))
                return True
            except AlreadyExistsError:
                if await self._read(path) is not None:
                    return False
                await self.io.delete(path)  # expired: replace it (one claimer wins the create)
        return False

    async def get(self, key: str) -> bytes | None:
        return await self._read(self._path(key))

    async def put(self, key: str, value: bytes, ttl_s: float) -> None:
        await self.io.write(self._path(key), self._encode(value, ttl_s))

    async def delete(self, key: str) -> None:
        await self.io.delete(self._path(key))


def catalog_records(catalog: Catalog) -> Records:
    """The records store of ``catalog`` (see the module docstring)."""
    # A metastore catalog names its own store (``_records``), so this module needs no
    # import of the concrete catalogs (they import it).
    own = getattr(catalog, "_records", None)
    if own is not None:
        records: Records = own()
        return records
    warehouse = catalog.properties.get("warehouse")
    if not warehouse:
        raise ValidationError(
            f"catalog {catalog.name!r} has no 'warehouse' property: records need a place"
        )
    return FileRecords(catalog.io, f"{warehouse.rstrip('/')}/_icefloe/records")


def _text(value: bytes) -> str:
    return base64.b64encode(value).decode()


def _bytes(text: str) -> bytes:
    return base64.b64decode(text)
