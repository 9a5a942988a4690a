"""A metastore catalog in DynamoDB (aioboto3), item for item like Apache Iceberg's Java
``DynamoDbCatalog``, so Java's and PyIceberg's DynamoDB catalogs load what icefloe commits.

Items (one DynamoDB table, default name ``iceberg``)::

    identifier (hash key)   "<ns>.<table>" for tables, "NAMESPACE" for namespace rows
    namespace  (range key)  "<ns>"
    v                       a fresh uuid on every write: the optimistic-lock version
    created_at, updated_at  epoch milliseconds (numbers)
    p.<key>                 properties; tables carry p.table_type = ICEBERG,
                            p.metadata_location and p.previous_metadata_location

GSI ``namespace-identifier`` (namespace hash, identifier range) lists a namespace's rows.
A commit is one ``UpdateItem`` conditioned on ``v = :v`` (the version read with the base),
a create one ``PutItem`` conditioned on ``attribute_not_exists(identifier)``.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import aioboto3
from botocore.exceptions import ClientError

from icefloe.errors import (
    AlreadyExistsError,
    CommitFailedError,
    IcefloeError,
    NamespaceNotEmptyError,
    NotFoundError,
)
from icefloe.io.fileio import FileIO
from icefloe.table.catalog import MetastoreCatalog, Namespace, TableIdentifier, parse_namespace

NAMESPACE_ROW = "NAMESPACE"
GSI = "namespace-identifier"
PREFIX = "p."
METADATA_LOCATION = "p.metadata_location"
PREVIOUS_METADATA_LOCATION = "p.previous_metadata_location"
TABLE_TYPE = "p.table_type"


def _now() -> dict[str, str]:
    return {"N": str(int(time.time() * 1000))}


def _code(e: ClientError) -> str:
    return str(e.response.get("Error", {}).get("Code", ""))


class DynamoDbCatalog(MetastoreCatalog):
    supports_rename = True
    supports_multi_table_commits = True

    def __init__(
        self,
        name: str,
        io: FileIO,
        properties: Mapping[str, str] | None = None,
        *,
        table_name: str = "iceberg",
        endpoint_url: str | None = None,
        region: str | None = None,
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        session_token: str | None = None,
    ) -> None:
        super().__init__(name, io, properties)
        self.table_name = table_name
        self.endpoint_url = endpoint_url
        self._session = aioboto3.Session(
            aws_access_key_id=access_key_id,
            aws_secret_access_key=secret_access_key,
            aws_session_token=session_token,
            region_name=region or "us-east-1",
        )
        self._stack = contextlib.AsyncExitStack()
        self._client: Any = None

    async def _db(self) -> Any:
        """One client for the catalog's lifetime, created (with the table) on first use."""
        if self._client is None:
            self._client = await self._stack.enter_async_context(
                self._session.client("dynamodb", endpoint_url=self.endpoint_url)
            )
            await self._ensure_table()
        return self._client

    async def _ensure_table(self) -> None:
        try:
            await self._client.describe_table(TableName=self.table_name)
            return
        except ClientError as e:
            if _code(e) != "ResourceNotFoundException":
                raise
        try:
            await self._client.create_table(
                TableName=self.table_name,
                AttributeDefinitions=[
                    {"AttributeName": "identifier", "AttributeType": "S"},
                    {"AttributeName": "namespace", "AttributeType": "S"},
                ],
                KeySchema=[
                    {"AttributeName": "identifier", "KeyType": "HASH"},
                    {"AttributeName": "namespace", "KeyType": "RANGE"},
                ],
                GlobalSecondaryIndexes=[
                    {
                        "IndexName": GSI,
                        "KeySchema": [
                            {"AttributeName": "namespace", "KeyType": "HASH"},
                            {"AttributeName": "identifier", "KeyType": "RANGE"},
                        ],
                        "Projection": {"ProjectionType": "KEYS_ONLY"},
                    }
                ],
                BillingMode="PAY_PER_REQUEST",
            )
        except ClientError as e:
            if _code(e) != "ResourceInUseException":  # another process created it first
                raise
        waiter = self._client.get_waiter("table_exists")
        await waiter.wait(
            TableName=self.table_name, WaiterConfig={"Delay": 0.2, "MaxAttempts": 100}
        )

    async def _get(self, identifier: str, namespace: str) -> dict[str, Any] | None:
        db = await self._db()
        resp = await db.get_item(
            TableName=self.table_name,
            Key={"identifier": {"S": identifier}, "namespace": {"S": namespace}},
            ConsistentRead=True,
        )
        item: dict[str, Any] | None = resp.get("Item")
        return item

    # -- namespaces ---------------------------------------------------------------------

    async def create_namespace(
        self, namespace: str | Namespace, properties: Mapping[str, str] | None = None
    ) -> None:
        ns = ".".join(parse_namespace(namespace))
        item = {
            "identifier": {"S": NAMESPACE_ROW},
            "namespace": {"S": ns},
            "v": {"S": str(uuid.uuid4())},
            "created_at": _now(),
            "updated_at": _now(),
        }
        for key, value in (properties or {}).items():
            item[PREFIX + key] = {"S": str(value)}
        db = await self._db()
        try:
            await db.put_item(
                TableName=self.table_name,
                Item=item,
                ConditionExpression="attribute_not_exists(#ns)",
                ExpressionAttributeNames={"#ns": "namespace"},
            )
        except ClientError as e:
            if _code(e) == "ConditionalCheckFailedException":
                raise AlreadyExistsError(f"namespace {ns!r} already exists") from None
            raise

    async def list_namespaces(self, parent: str | Namespace = ()) -> list[Namespace]:
        base = parse_namespace(parent) if parent else ()
        db = await self._db()
        found: list[Namespace] = []
        paginator = db.get_paginator("query")
        async for page in paginator.paginate(
            TableName=self.table_name,
            KeyConditionExpression="identifier = :id",
            ExpressionAttributeValues={":id": {"S": NAMESPACE_ROW}},
            ConsistentRead=True,
        ):
            for item in page.get("Items", []):
                ns = tuple(item["namespace"]["S"].split("."))
                if ns[: len(base)] == base and len(ns) == len(base) + 1:
                    found.append(ns)
        return sorted(found)

    async def load_namespace_properties(self, namespace: str | Namespace) -> dict[str, str]:
        ns = ".".join(parse_namespace(namespace))
        item = await self._get(NAMESPACE_ROW, ns)
        if item is None:
            raise NotFoundError(f"namespace {ns!r} does not exist")
        return {k[len(PREFIX) :]: v["S"] for k, v in item.items() if k.startswith(PREFIX)}

    async def update_namespace_properties(
        self,
        namespace: str | Namespace,
        removals: set[str] | None = None,
        updates: Mapping[str, str] | None = None,
    ) -> None:
        ns = ".".join(parse_namespace(namespace))
        names = {"#v": "v", "#u": "updated_at"}
        values: dict[str, Any] = {":v": {"S": str(uuid.uuid4())}, ":u": _now()}
        sets = ["#v = :v", "#u = :u"]
        for i, (key, value) in enumerate((updates or {}).items()):
            names[f"#s{i}"] = PREFIX + key
            values[f":s{i}"] = {"S": str(value)}
            sets.append(f"#s{i} = :s{i}")
        expression = "SET " + ", ".join(sets)
        removed = [k for k in (removals or ()) if k not in (updates or {})]
        if removed:
            for i, key in enumerate(removed):
                names[f"#r{i}"] = PREFIX + key
            expression += " REMOVE " + ", ".join(f"#r{i}" for i in range(len(removed)))
        db = await self._db()
        try:
            await db.update_item(
                TableName=self.table_name,
                Key={"identifier": {"S": NAMESPACE_ROW}, "namespace": {"S": ns}},
                UpdateExpression=expression,
                ConditionExpression="attribute_exists(identifier)",
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=values,
            )
        except ClientError as e:
            if _code(e) == "ConditionalCheckFailedException":
                raise NotFoundError(f"namespace {ns!r} does not exist") from None
            raise

    async def drop_namespace(self, namespace: str | Namespace) -> None:
        ns_tuple = parse_namespace(namespace)
        ns = ".".join(ns_tuple)
        if await self.list_tables(ns_tuple):
            raise NamespaceNotEmptyError(f"namespace {ns!r} is not empty")
        if await self.list_namespaces(ns_tuple):
            raise NamespaceNotEmptyError(f"namespace {ns!r} has child namespaces")
        db = await self._db()
        try:
            await db.delete_item(
                TableName=self.table_name,
                Key={"identifier": {"S": NAMESPACE_ROW}, "namespace": {"S": ns}},
                ConditionExpression="attribute_exists(identifier)",
            )
        except ClientError as e:
            if _code(e) == "ConditionalCheckFailedException":
                raise NotFoundError(f"namespace {ns!r} does not exist") from None
            raise

    # -- tables -------------------------------------------------------------------------

    async def list_tables(self, namespace: str | Namespace) -> list[TableIdentifier]:
        ns_tuple = parse_namespace(namespace)
        ns = ".".join(ns_tuple)
        await self.load_namespace_properties(ns_tuple)
        db = await self._db()
        out: list[TableIdentifier] = []
        paginator = db.get_paginator("query")
        async for page in paginator.paginate(
            TableName=self.table_name,
            IndexName=GSI,
            KeyConditionExpression="#ns = :ns",
            ExpressionAttributeNames={"#ns": "namespace"},
            ExpressionAttributeValues={":ns": {"S": ns}},
        ):
            for item in page.get("Items", []):
                ident = item["identifier"]["S"]
                if ident != NAMESPACE_ROW:
                    out.append(TableIdentifier.parse(ident))
        return sorted(out, key=str)

    async def _load_pointer(self, identifier: TableIdentifier) -> tuple[str, str | None]:
        item = await self._get(str(identifier), identifier.namespace_name)
        if item is None:
            raise NotFoundError(f"table {identifier} does not exist")
        if item.get(TABLE_TYPE, {}).get("S", "").lower() != "iceberg":
            raise NotFoundError(f"{identifier} is not an Iceberg table")
        return item[METADATA_LOCATION]["S"], item.get("v", {}).get("S")

    async def _create_pointer(
        self, identifier: TableIdentifier, metadata_location: str
    ) -> str | None:
        if not await self.namespace_exists(identifier.namespace):
            raise NotFoundError(f"namespace {identifier.namespace_name!r} does not exist")
        token = str(uuid.uuid4())
        item = {
            "identifier": {"S": str(identifier)},
            "namespace": {"S": identifier.namespace_name},
            "v": {"S": token},
            "created_at": _now(),
            "updated_at": _now(),
            TABLE_TYPE: {"S": "ICEBERG"},
            METADATA_LOCATION: {"S": metadata_location},
            PREVIOUS_METADATA_LOCATION: {"S": ""},
        }
        db = await self._db()
        try:
            await db.put_item(
                TableName=self.table_name,
                Item=item,
                ConditionExpression="attribute_not_exists(identifier)",
            )
        except ClientError as e:
            if _code(e) == "ConditionalCheckFailedException":
                raise AlreadyExistsError(f"table {identifier} already exists") from None
            raise
        return token

    async def _swap_pointer(
        self, identifier: TableIdentifier, expected: str, token: str | None, new: str
    ) -> str | None:
        if token is None:
            # The base was loaded without its version (e.g. after an unknown outcome): read
            # it now, and only go on if the row still points at the base we built on.
            current, token = await self._load_pointer(identifier)
            if current != expected or token is None:
                raise CommitFailedError(
                    f"table {identifier} was committed concurrently (pointer is {current})"
                )
        new_token = str(uuid.uuid4())
        db = await self._db()
        try:
            await db.update_item(
                TableName=self.table_name,
                Key={
                    "identifier": {"S": str(identifier)},
                    "namespace": {"S": identifier.namespace_name},
                },
                UpdateExpression="SET #v = :new_v, #u = :u, #ml = :ml, #pml = :pml",
                ConditionExpression="#v = :v",
                ExpressionAttributeNames={
                    "#v": "v",
                    "#u": "updated_at",
                    "#ml": METADATA_LOCATION,
                    "#pml": PREVIOUS_METADATA_LOCATION,
                },
                ExpressionAttributeValues={
                    ":v": {"S": token},
                    ":new_v": {"S": new_token},
                    ":u": _now(),
                    ":ml": {"S": new},
                    ":pml": {"S": expected},
                },
            )
        except ClientError as e:
            if _code(e) == "ConditionalCheckFailedException":
                raise CommitFailedError(
                    f"table {identifier} was committed concurrently (version {token} is stale)"
                ) from None
            raise
        return new_token

    def _key(self, identifier: TableIdentifier) -> dict[str, Any]:
        return {
            "identifier": {"S": str(identifier)},
            "namespace": {"S": identifier.namespace_name},
        }

    def _namespace_check(self, namespace: str) -> dict[str, Any]:
        return {
            "ConditionCheck": {
                "TableName": self.table_name,
                "Key": {"identifier": {"S": NAMESPACE_ROW}, "namespace": {"S": namespace}},
                "ConditionExpression": "attribute_exists(identifier)",
            }
        }

    async def _transact(self, items: list[dict[str, Any]]) -> list[str]:
        """Run TransactWriteItems; on cancellation, the reason code of each item (else [])."""
        db = await self._db()
        try:
            await db.transact_write_items(TransactItems=items)
        except ClientError as e:
            if _code(e) != "TransactionCanceledException":
                raise
            reasons = e.response.get("CancellationReasons") or []
            return [str(r.get("Code", "None")) for r in reasons] or ["Unknown"]
        return []

    async def _swap_pointers(
        self, swaps: Sequence[tuple[TableIdentifier, str | None, str | None, str]]
    ) -> list[str | None]:
        """One TransactWriteItems: a conditional put per created table (and a check that its
        namespace exists), a conditional update per committed one."""
        items: list[dict[str, Any]] = []
        tokens: list[str | None] = []
        where: list[tuple[int, str]] = []  # item index → (swap index, what it checks)
        for i, (ident, expected, token, new) in enumerate(swaps):
            new_token = str(uuid.uuid4())
            tokens.append(new_token)
            if expected is None:
                where.append((i, "namespace"))
                items.append(self._namespace_check(ident.namespace_name))
                where.append((i, "create"))
                items.append(
                    {
                        "Put": {
                            "TableName": self.table_name,
                            "Item": {
                                **self._key(ident),
                                "v": {"S": new_token},
                                "created_at": _now(),
                                "updated_at": _now(),
                                TABLE_TYPE: {"S": "ICEBERG"},
                                METADATA_LOCATION: {"S": new},
                                PREVIOUS_METADATA_LOCATION: {"S": ""},
                            },
                            "ConditionExpression": "attribute_not_exists(identifier)",
                        }
                    }
                )
                continue
            if token is None:
                current, token = await self._load_pointer(ident)
                if current != expected or token is None:
                    raise CommitFailedError(f"table {ident} was committed concurrently")
            where.append((i, "commit"))
            items.append(
                {
                    "Update": {
                        "TableName": self.table_name,
                        "Key": self._key(ident),
                        "UpdateExpression": "SET #v = :new_v, #u = :u, #ml = :ml, #pml = :pml",
                        "ConditionExpression": "#v = :v",
                        "ExpressionAttributeNames": {
                            "#v": "v",
                            "#u": "updated_at",
                            "#ml": METADATA_LOCATION,
                            "#pml": PREVIOUS_METADATA_LOCATION,
                        },
                        "ExpressionAttributeValues": {
                            ":v": {"S": token},
                            ":new_v": {"S": new_token},
                            ":u": _now(),
                            ":ml": {"S": new},
                            ":pml": {"S": expected},
                        },
                    }
                }
            )
        reasons = await self._transact(items)
        if not reasons:
            return tokens
        for (i, what), code in zip(where, reasons, strict=False):
            if code != "ConditionalCheckFailed":
                continue
            ident = swaps[i][0]
            if what == "namespace":
                raise NotFoundError(f"namespace {ident.namespace_name!r} does not exist")
            if what == "create":
                raise CommitFailedError(f"table {ident} was created concurrently")
            raise CommitFailedError(f"table {ident} was committed concurrently")
        # Cancelled for another reason (a conflicting transaction, throttling): not applied.
        raise CommitFailedError(f"the commit of {len(swaps)} tables was cancelled: {reasons}")

    async def rename_table(
        self, source: str | TableIdentifier, destination: str | TableIdentifier
    ) -> None:
        """One transaction: the new row is put, the old one deleted if unchanged since read."""
        src, dst = TableIdentifier.parse(source), TableIdentifier.parse(destination)
        item = await self._get(str(src), src.namespace_name)
        if item is None or item.get(TABLE_TYPE, {}).get("S", "").lower() != "iceberg":
            raise NotFoundError(f"table {src} does not exist")
        if src == dst:  # one transaction cannot put and delete the same item
            raise AlreadyExistsError(f"table {dst} already exists")
        moved = {**item, **self._key(dst), "v": {"S": str(uuid.uuid4())}, "updated_at": _now()}
        reasons = await self._transact(
            [
                self._namespace_check(dst.namespace_name),
                {
                    "Put": {
                        "TableName": self.table_name,
                        "Item": moved,
                        "ConditionExpression": "attribute_not_exists(identifier)",
                    }
                },
                {
                    "Delete": {
                        "TableName": self.table_name,
                        "Key": self._key(src),
                        "ConditionExpression": "#v = :v",
                        "ExpressionAttributeNames": {"#v": "v"},
                        "ExpressionAttributeValues": {":v": item["v"]},
                    }
                },
            ]
        )
        if not reasons:
            return
        if reasons[0] == "ConditionalCheckFailed":
            raise NotFoundError(f"namespace {dst.namespace_name!r} does not exist")
        if len(reasons) > 1 and reasons[1] == "ConditionalCheckFailed":
            raise AlreadyExistsError(f"table {dst} already exists")
        if len(reasons) > 2 and reasons[2] == "ConditionalCheckFailed":
            raise CommitFailedError(f"table {src} changed while it was renamed; retry")
        raise IcefloeError(f"renaming {src} to {dst} was cancelled: {reasons}")

    async def drop_table(self, identifier: str | TableIdentifier, purge: bool = False) -> None:
        ident = TableIdentifier.parse(identifier)
        table = await self.load_table(ident) if purge else None
        db = await self._db()
        try:
            await db.delete_item(
                TableName=self.table_name,
                Key={"identifier": {"S": str(ident)}, "namespace": {"S": ident.namespace_name}},
                ConditionExpression="attribute_exists(identifier)",
            )
        except ClientError as e:
            if _code(e) == "ConditionalCheckFailedException":
                raise NotFoundError(f"table {ident} does not exist") from None
            raise IcefloeError(f"dropping {ident} failed: {e}") from e
        if table is not None:
            from icefloe.table.maintenance import purge_table_files

            await purge_table_files(table)

    def _records(self) -> Any:
        """Small records (idempotency answers, plan cancellations) as items of this table."""
        from icefloe.catalog.records import DynamoDbRecords

        return DynamoDbRecords(self)

    def _location_index(self) -> Any:
        from icefloe.catalog.location_index import DynamoDbLocations

        return DynamoDbLocations(self)

    async def close(self) -> None:
        await self._stack.aclose()
        self._client = None
        await super().close()
