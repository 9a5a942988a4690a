"""The async catalog interface and the metadata-file protocol every catalog shares.

A catalog maps table identifiers to the location of the table's current metadata file and
swaps that pointer atomically. Everything else (namespaces, listing, properties) is
bookkeeping around that one conditional write. Concrete catalogs implement the pointer
store: :mod:`icefloe.catalog.fs` (the spec's file-system tables), :mod:`icefloe.catalog.redis`
and :mod:`icefloe.catalog.dynamodb` (metastore tables).
"""

from __future__ import annotations

import logging
import re
import uuid
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from icefloe.errors import (
    AlreadyExistsError,
    CommitFailedError,
    CommitStateUnknownError,
    NotFoundError,
    UnsupportedOperationError,
    ValidationError,
)
from icefloe.io.fileio import FileIO
from icefloe.io.locations import location_key, resolve_table_path
from icefloe.spec.metadata import TableMetadata, parse_table_metadata
from icefloe.spec.snapshot import Snapshot

Namespace = tuple[str, ...]
_log = logging.getLogger(__name__)

# Table properties that govern metadata files (names as Java and PyIceberg spell them).
PREVIOUS_VERSIONS_MAX = "write.metadata.previous-versions-max"
PREVIOUS_VERSIONS_MAX_DEFAULT = 100
DELETE_AFTER_COMMIT = "write.metadata.delete-after-commit.enabled"
METADATA_PATH = "write.metadata.path"
DATA_PATH = "write.data.path"
# Parsed metadata files a catalog keeps (see Catalog.parse_metadata).
PARSED_METADATA_CACHE_ENTRIES = 8

_METASTORE_FILE = re.compile(r"^(\d+)-[0-9a-fA-F-]+\.metadata\.json(\.gz)?$")
_FS_FILE = re.compile(r"^v(\d+)\.metadata\.json(\.gz)?$")


def parse_namespace(ns: str | Namespace) -> Namespace:
    """Namespaces are dotted strings on the wire (``a.b``) and tuples in code."""
    parts = tuple(ns.split(".")) if isinstance(ns, str) else tuple(ns)
    if not parts or any(not p for p in parts):
        raise ValidationError(f"invalid namespace {ns!r}: levels must be non-empty")
    return parts


@dataclass(frozen=True, slots=True)
class TableIdentifier:
    namespace: Namespace
    name: str

    @classmethod
    def parse(cls, text: str | TableIdentifier) -> TableIdentifier:
        """``ns.table`` or ``a.b.table``: the last level is the table name."""
        if isinstance(text, TableIdentifier):
            return text
        parts = text.split(".")
        if len(parts) < 2 or any(not p for p in parts):
            raise ValidationError(f"invalid table identifier {text!r}: expected 'namespace.table'")
        return cls(tuple(parts[:-1]), parts[-1])

    @property
    def namespace_name(self) -> str:
        return ".".join(self.namespace)

    def __str__(self) -> str:
        return f"{self.namespace_name}.{self.name}"


@dataclass(slots=True)
class Table:
    """A loaded table: its identifier, current metadata and where that metadata lives."""

    identifier: TableIdentifier
    metadata: TableMetadata
    metadata_location: str
    catalog: Catalog = field(repr=False)
    # The store's own version of the pointer row when it has one (DynamoDB's ``v``):
    # committing conditions on it, exactly as Java's DynamoDbCatalog does.
    version_token: str | None = None

    @property
    def io(self) -> FileIO:
        return self.catalog.io

    @property
    def location(self) -> str:
        return self.metadata.location

    async def refresh(self) -> Table:
        fresh = await self.catalog.load_table(self.identifier)
        self.metadata, self.metadata_location = fresh.metadata, fresh.metadata_location
        self.version_token = fresh.version_token
        return self


@dataclass(frozen=True, slots=True)
class TableChange:
    """One table's part of a multi-table commit: ``base`` None creates the table."""

    identifier: TableIdentifier
    base: Table | None
    new_metadata: TableMetadata


def metadata_version(location: str | None) -> int:
    """The version number V in ``<V>-<uuid>.metadata.json`` or ``v<V>.metadata.json``; -1 if none."""
    if not location:
        return -1
    name = location.rsplit("/", 1)[-1]
    m = _METASTORE_FILE.match(name) or _FS_FILE.match(name)
    return int(m.group(1)) if m else -1


def metadata_dir(metadata: TableMetadata) -> str:
    return resolve_table_path(
        metadata.location, metadata.properties.get(METADATA_PATH) or "metadata"
    )


def data_dir(metadata: TableMetadata) -> str:
    return resolve_table_path(metadata.location, metadata.properties.get(DATA_PATH) or "data")


def new_metastore_metadata_location(metadata: TableMetadata, base_location: str | None) -> str:
    version = metadata_version(base_location) + 1
    return f"{metadata_dir(metadata)}/{version:05d}-{uuid.uuid4()}.metadata.json"


def previous_files_to_delete(base: TableMetadata, new: TableMetadata) -> list[str]:
    """Metadata files that fell off the metadata-log, when the table asks to delete them."""
    if new.properties.get(DELETE_AFTER_COMMIT, "false").lower() != "true":
        return []
    kept = {e.metadata_file for e in new.metadata_log}
    return [e.metadata_file for e in base.metadata_log if e.metadata_file not in kept]


class Catalog(ABC):
    """One async interface over every pointer store.

    ``commit`` is the only operation with concurrency semantics: it succeeds only if the
    table's current metadata location is still ``base_location``; otherwise it raises
    :class:`CommitFailedError` (reload and retry) or, when the outcome cannot be known,
    resolves it by re-reading the pointer before anything retries.
    """

    def __init__(self, name: str, io: FileIO, properties: Mapping[str, str] | None = None):
        self.name = name
        self.io = io
        self.properties = dict(properties or {})
        self._parsed: OrderedDict[str, tuple[bytes, TableMetadata]] = OrderedDict()

    # -- namespaces ---------------------------------------------------------------------

    @abstractmethod
    async def create_namespace(
        self, namespace: str | Namespace, properties: Mapping[str, str] | None = None
    ) -> None: ...

    @abstractmethod
    async def list_namespaces(self, parent: str | Namespace = ()) -> list[Namespace]: ...

    @abstractmethod
    async def load_namespace_properties(self, namespace: str | Namespace) -> dict[str, str]: ...

    @abstractmethod
    async def update_namespace_properties(
        self,
        namespace: str | Namespace,
        removals: set[str] | None = None,
        updates: Mapping[str, str] | None = None,
    ) -> None: ...

    @abstractmethod
    async def drop_namespace(self, namespace: str | Namespace) -> None: ...

    async def namespace_exists(self, namespace: str | Namespace) -> bool:
        try:
            await self.load_namespace_properties(namespace)
        except NotFoundError:
            return False
        return True

    # -- tables -------------------------------------------------------------------------

    @abstractmethod
    async def list_tables(self, namespace: str | Namespace) -> list[TableIdentifier]: ...

    @abstractmethod
    async def load_table(self, identifier: str | TableIdentifier) -> Table: ...

    @abstractmethod
    async def drop_table(self, identifier: str | TableIdentifier, purge: bool = False) -> None:
        """Forget the table; with ``purge`` also delete its metadata and data files."""

    @abstractmethod
    async def register_table(
        self, identifier: str | TableIdentifier, metadata_location: str
    ) -> Table: ...

    @abstractmethod
    async def _create_table_pointer(
        self, identifier: TableIdentifier, metadata: TableMetadata
    ) -> str:
        """Write the first metadata file and create the pointer if absent; return its location."""

    @abstractmethod
    async def commit(self, table: Table, new_metadata: TableMetadata) -> Table:
        """Swap ``table``'s pointer from ``table.metadata_location`` to new metadata."""

    # Capabilities the REST catalog advertises (and answers 406 for when missing).
    supports_rename: bool = False
    supports_multi_table_commits: bool = False

    async def rename_table(
        self, source: str | TableIdentifier, destination: str | TableIdentifier
    ) -> None:
        """Give a table a new identifier; its files stay where they are."""
        raise UnsupportedOperationError(
            f"catalog {self.name!r} ({type(self).__name__}) cannot rename tables"
        )

    async def create_table_with_metadata(
        self, identifier: str | TableIdentifier, metadata: TableMetadata
    ) -> Table:
        """Create a table whose first metadata was built elsewhere (a REST staged create).

        AlreadyExistsError if the table exists, NotFoundError if its namespace does not.
        """
        ident = TableIdentifier.parse(identifier)
        if not await self.namespace_exists(ident.namespace):
            raise NotFoundError(f"namespace {ident.namespace_name!r} does not exist")
        location = await self._create_table_pointer(ident, metadata)
        return Table(ident, metadata, location, self)

    async def commit_tables(self, changes: Sequence[TableChange]) -> list[Table]:
        """Commit several tables at once: all of them or none.

        Catalogs that can swap several pointers in one conditional write override this and
        set :attr:`supports_multi_table_commits`; the rest commit one table only and raise
        UnsupportedOperationError for more, rather than commit some and fail the others.
        """
        if len(changes) != 1:
            if not changes:
                return []
            raise UnsupportedOperationError(
                f"catalog {self.name!r} ({type(self).__name__}) cannot commit "
                f"{len(changes)} tables atomically; commit them one at a time"
            )
        change = changes[0]
        if change.base is None:
            return [await self.create_table_with_metadata(change.identifier, change.new_metadata)]
        return [await self.commit(change.base, change.new_metadata)]

    async def register_over(self, table: Table, metadata_location: str) -> Table:
        """Point an existing table at the metadata file ``metadata_location`` (a register
        with ``overwrite``), conditional on ``table`` still being current.

        Here: the registered metadata becomes the table's next version file (file-system
        tables are found by their version files); metastore catalogs swap the pointer.
        """
        metadata = await self.read_metadata(metadata_location)
        return await self.commit(table, metadata)

    async def load_table_at(
        self,
        identifier: str | TableIdentifier,
        *,
        snapshot_id: int | None = None,
        ref: str | None = None,
        as_of_ms: int | None = None,
    ) -> tuple[Table, Snapshot | None]:
        """The table and the snapshot it had at an id, a branch or tag, or a time.

        NotFoundError names what is missing; None is a table with no snapshots yet.
        """
        table = await self.load_table(identifier)
        snapshot = table.metadata.resolve_snapshot(
            snapshot_id=snapshot_id, ref=ref, as_of_ms=as_of_ms
        )
        return table, snapshot

    async def table_exists(self, identifier: str | TableIdentifier) -> bool:
        try:
            await self.load_table(identifier)
        except NotFoundError:
            return False
        return True

    async def create_table(
        self,
        identifier: str | TableIdentifier,
        schema: Any,
        spec: Any = None,
        sort_order: Any = None,
        location: str | None = None,
        properties: Mapping[str, str] | None = None,
        format_version: int = 2,
    ) -> Table:
        """Create a table with fresh field ids; fails with AlreadyExistsError if it exists."""
        from icefloe.spec.metadata_builder import new_table_metadata
        from icefloe.spec.partition import PartitionSpec
        from icefloe.spec.sort_order import SortOrder

        ident = TableIdentifier.parse(identifier)
        if not await self.namespace_exists(ident.namespace):
            raise NotFoundError(f"namespace {ident.namespace_name!r} does not exist")
        metadata = new_table_metadata(
            schema,
            spec if spec is not None else PartitionSpec.unpartitioned(),
            sort_order if sort_order is not None else SortOrder.unsorted(),
            location or await self.default_table_location(ident),
            dict(properties or {}),
            format_version=format_version,
        )
        location_ = await self._create_table_pointer(ident, metadata)
        return Table(ident, metadata, location_, self)

    async def default_table_location(self, identifier: TableIdentifier) -> str:
        warehouse = self.properties.get("warehouse")
        if not warehouse:
            raise ValidationError(
                f"catalog {self.name!r} has no 'warehouse' property: pass a table location"
            )
        ns_location = (await self.load_namespace_properties(identifier.namespace)).get("location")
        base = ns_location or f"{warehouse.rstrip('/')}/{'/'.join(identifier.namespace)}.db"
        return f"{base.rstrip('/')}/{identifier.name}"

    async def read_metadata(self, location: str) -> TableMetadata:
        return self.parse_metadata(location, await self.io.read(location))

    def parse_metadata(self, location: str, data: bytes) -> TableMetadata:
        """Parse metadata read from ``location``, reusing the last parse of the same bytes.

        Committers that lose a race all reload the winner's file, and parsing dominates a
        reload of a long-lived table. A hit needs identical bytes, not only the same name:
        a file-system table's ``v<N>.metadata.json`` comes back after a drop and re-create.
        """
        hit = self._parsed.get(location)
        if hit is not None and hit[0] == data:
            self._parsed.move_to_end(location)
            return hit[1]
        metadata = parse_table_metadata(data, location=location)
        self._parsed[location] = (data, metadata)
        while len(self._parsed) > PARSED_METADATA_CACHE_ENTRIES:
            self._parsed.popitem(last=False)
        return metadata

    async def close(self) -> None:
        await self.io.close()

    async def __aenter__(self) -> Catalog:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class MetastoreCatalog(Catalog):
    """Catalogs whose pointer lives in a key-value store (Redis, DynamoDB).

    Subclasses implement the pointer store; this class owns the metadata-file protocol:
    ``<V>-<uuid>.metadata.json`` written once, then one conditional swap, then the
    resolution of unknown outcomes by re-reading the pointer.
    """

    def _location_index(self) -> Any:
        """This store's :class:`icefloe.catalog.location_index.LocationIndex`, or None."""
        return None

    async def _index_location(
        self, identifier: TableIdentifier, location: str, previous: str | None = None
    ) -> None:
        """Keep the location index current after a table is created, registered or moved
        (so tables made by any writer, not only the REST catalog, are found there). A
        failure is logged, never raised: the pointer has already changed, and a missing
        entry only makes the overlap checks fall back to what they find."""
        index = self._location_index()
        if index is None or location == previous:
            return
        try:
            await index.add(location_key(location), identifier)
            if previous is not None:
                await index.remove(location_key(previous), identifier)
        except Exception as e:
            _log.warning("location index not updated for %s at %s: %s", identifier, location, e)

    @abstractmethod
    async def _load_pointer(self, identifier: TableIdentifier) -> tuple[str, str | None]:
        """Current metadata location and version token; NotFoundError if there is no table."""

    @abstractmethod
    async def _create_pointer(
        self, identifier: TableIdentifier, metadata_location: str
    ) -> str | None:
        """Create the pointer if absent (AlreadyExistsError otherwise); return its token."""

    @abstractmethod
    async def _swap_pointer(
        self, identifier: TableIdentifier, expected: str, token: str | None, new: str
    ) -> str | None:
        """Swap if the pointer is still ``expected`` (and ``token``, when given).

        Returns the new version token. Raises CommitFailedError if the pointer moved; any other exception means the
        outcome is unknown.
        """

    async def _swap_pointers(
        self, swaps: Sequence[tuple[TableIdentifier, str | None, str | None, str]]
    ) -> list[str | None]:
        """Swap several pointers in one conditional write: ``(identifier, expected, token,
        new)`` each, ``expected`` None to create the pointer. Returns the new tokens.

        Raises CommitFailedError if any pointer moved (or exists, for a create) and
        NotFoundError if a namespace is missing; any other exception leaves the outcome
        unknown. Only stores with multi-key transactions implement it.
        """
        raise UnsupportedOperationError(
            f"catalog {self.name!r} ({type(self).__name__}) cannot commit tables atomically"
        )

    async def commit_tables(self, changes: Sequence[TableChange]) -> list[Table]:
        if len(changes) <= 1 or not self.supports_multi_table_commits:
            return await super().commit_tables(changes)
        if len({c.identifier for c in changes}) != len(changes):
            raise ValidationError("a multi-table commit names the same table twice")
        locations = [
            new_metastore_metadata_location(
                c.new_metadata, c.base.metadata_location if c.base else None
            )
            for c in changes
        ]
        for change, location in zip(changes, locations, strict=True):
            await self.io.write_once(location, change.new_metadata.to_json_bytes())
        swaps = [
            (
                c.identifier,
                c.base.metadata_location if c.base else None,
                c.base.version_token if c.base else None,
                location,
            )
            for c, location in zip(changes, locations, strict=True)
        ]
        tokens: list[str | None] = [None] * len(changes)
        try:
            tokens = await self._swap_pointers(swaps)
        except (CommitFailedError, AlreadyExistsError, NotFoundError):
            for location in locations:
                await self.io.delete(location)
            raise
        except Exception as e:
            # One atomic write: the first table's pointer tells the fate of all of them.
            outcome = await self._committed(changes[0].identifier, locations[0])
            if outcome is None:
                raise CommitStateUnknownError(
                    f"commit of {len(changes)} tables could not be confirmed (the store "
                    f"failed with: {e}); reload the tables before retrying"
                ) from e
            if not outcome:
                raise CommitFailedError(
                    f"commit of {len(changes)} tables was not applied: {e}"
                ) from e
        for change in changes:
            if change.base is not None:
                for stale in previous_files_to_delete(change.base.metadata, change.new_metadata):
                    await self.io.delete(stale)
            await self._index_location(
                change.identifier,
                change.new_metadata.location,
                change.base.location if change.base is not None else None,
            )
        return [
            Table(c.identifier, c.new_metadata, location, self, token)
            for c, location, token in zip(changes, locations, tokens, strict=True)
        ]

    async def load_table(self, identifier: str | TableIdentifier) -> Table:
        ident = TableIdentifier.parse(identifier)
        location, token = await self._load_pointer(ident)
        return Table(ident, await self.read_metadata(location), location, self, token)

    async def _create_table_pointer(
        self, identifier: TableIdentifier, metadata: TableMetadata
    ) -> str:
        location = new_metastore_metadata_location(metadata, None)
        await self.io.write_once(location, metadata.to_json_bytes())
        try:
            await self._create_pointer(identifier, location)
        except (AlreadyExistsError, NotFoundError):
            # Definitely not created: the file would be an orphan in someone else's table.
            await self.io.delete(location)
            raise
        await self._index_location(identifier, metadata.location)
        return location

    async def register_table(
        self, identifier: str | TableIdentifier, metadata_location: str
    ) -> Table:
        ident = TableIdentifier.parse(identifier)
        if not await self.namespace_exists(ident.namespace):
            raise NotFoundError(f"namespace {ident.namespace_name!r} does not exist")
        metadata = await self.read_metadata(metadata_location)
        await self._create_pointer(ident, metadata_location)
        await self._index_location(ident, metadata.location)
        return Table(ident, metadata, metadata_location, self)

    async def register_over(self, table: Table, metadata_location: str) -> Table:
        """The pointer swapped to ``metadata_location`` itself (no copy is written)."""
        metadata = await self.read_metadata(metadata_location)
        token = await self._swap_pointer(
            table.identifier, table.metadata_location, table.version_token, metadata_location
        )
        await self._index_location(table.identifier, metadata.location, table.location)
        return Table(table.identifier, metadata, metadata_location, self, token)

    async def commit(self, table: Table, new_metadata: TableMetadata) -> Table:
        location = new_metastore_metadata_location(new_metadata, table.metadata_location)
        await self.io.write_once(location, new_metadata.to_json_bytes())
        new_token: str | None = None
        try:
            new_token = await self._swap_pointer(
                table.identifier, table.metadata_location, table.version_token, location
            )
        except CommitFailedError:
            await self.io.delete(location)
            raise
        except Exception as e:  # the request may or may not have been applied
            outcome = await self._committed(table.identifier, location)
            if outcome is None:
                raise CommitStateUnknownError(
                    f"commit of {table.identifier} to {location} could not be confirmed "
                    f"(the store failed with: {e}); reload the table before retrying"
                ) from e
            if not outcome:
                # The pointer does not name our file: it was not applied. The file is left
                # for orphan clean-up, since a delayed request can no longer succeed only
                # if the pointer has moved on, which we cannot assume.
                raise CommitFailedError(
                    f"commit of {table.identifier} was not applied (store error: {e})"
                ) from e
        for stale in previous_files_to_delete(table.metadata, new_metadata):
            await self.io.delete(stale)
        await self._index_location(table.identifier, new_metadata.location, table.location)
        return Table(table.identifier, new_metadata, location, self, new_token)

    async def _committed(self, identifier: TableIdentifier, location: str) -> bool | None:
        """After an unknown outcome: is ``location`` current (or an ancestor of current)?

        None when the pointer itself cannot be read, which leaves the outcome unknown.
        """
        try:
            current, _ = await self._load_pointer(identifier)
            if current == location:
                return True
            metadata = await self.read_metadata(current)
        except Exception:
            return None
        return any(e.metadata_file == location for e in metadata.metadata_log)
