"""The spec's "File System Tables": no metastore, the metadata file name is the pointer.

Layout under the warehouse (as Hadoop tables lay it out)::

    <warehouse>/<ns1>/<ns2>/.namespace.json        namespace marker and properties
    <warehouse>/<ns1>/<ns2>/<table>/metadata/v<V>.metadata.json
    <warehouse>/<ns1>/<ns2>/<table>/metadata/version-hint.text

Java's HadoopCatalog writes no marker: a namespace is any directory that is not a table
(a table has ``metadata/*.metadata.json``). Both are namespaces here, so tables Java made
are listed; icefloe itself still writes the marker, which Java ignores.

Committing version V+1 is one create-if-absent of ``v<V+1>.metadata.json``: a hard link of
a fully written temporary file locally, ``PutObject`` with ``If-None-Match: *`` on S3. Both
refuse to overwrite, so exactly one of several racing committers wins. ``version-hint.text``
is only a hint for readers: the current version is found by probing upward from it.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Mapping

from icefloe.errors import (
    AlreadyExistsError,
    CommitFailedError,
    CommitStateUnknownError,
    NamespaceNotEmptyError,
    NotFoundError,
    UnsupportedOperationError,
    ValidationError,
)
from icefloe.io.fileio import FileIO, LocalFileIO, parse_location
from icefloe.spec.metadata import TableMetadata
from icefloe.table.catalog import (
    Catalog,
    Namespace,
    Table,
    TableIdentifier,
    parse_namespace,
    previous_files_to_delete,
)

NAMESPACE_MARKER = ".namespace.json"
VERSION_HINT = "version-hint.text"
_VERSION_FILE = re.compile(r"/v(\d+)\.metadata\.json$")


class FileSystemCatalog(Catalog):
    """Tables whose pointer is the highest ``v<V>.metadata.json`` in their metadata folder."""

    def __init__(
        self, name: str, warehouse: str, io: FileIO, properties: Mapping[str, str] | None = None
    ):
        props = dict(properties or {})
        props["warehouse"] = warehouse.rstrip("/")
        super().__init__(name, io, props)
        self.warehouse = warehouse.rstrip("/")
        # The newest version this client has seen per table: where loads start probing
        # instead of reading the hint file. Only a starting point, never trusted: versions a
        # load cannot find send it back to listing the folder.
        self._seen: dict[TableIdentifier, int] = {}

    # -- paths ----------------------------------------------------------------------------

    def _ns_path(self, namespace: Namespace) -> str:
        return "/".join((self.warehouse, *namespace))

    def _table_path(self, ident: TableIdentifier) -> str:
        return f"{self._ns_path(ident.namespace)}/{ident.name}"

    def _metadata_path(self, ident: TableIdentifier) -> str:
        return f"{self._table_path(ident)}/metadata"

    def _version_file(self, ident: TableIdentifier, version: int) -> str:
        return f"{self._metadata_path(ident)}/v{version}.metadata.json"

    async def default_table_location(self, identifier: TableIdentifier) -> str:
        return self._table_path(identifier)

    # -- namespaces ---------------------------------------------------------------------

    async def create_namespace(
        self, namespace: str | Namespace, properties: Mapping[str, str] | None = None
    ) -> None:
        ns = parse_namespace(namespace)
        body = json.dumps(dict(properties or {}), sort_keys=True).encode()
        try:
            await self.io.write_once(f"{self._ns_path(ns)}/{NAMESPACE_MARKER}", body)
        except AlreadyExistsError:
            raise AlreadyExistsError(f"namespace {'.'.join(ns)!r} already exists") from None

    async def list_namespaces(self, parent: str | Namespace = ()) -> list[Namespace]:
        base = parse_namespace(parent) if parent else ()
        if base:
            await self.load_namespace_properties(base)  # a missing parent is an error
        prefix = self._ns_path(base) if base else self.warehouse
        found: set[Namespace] = set()
        async for info in self.io.list(prefix):
            if not info.path.endswith("/" + NAMESPACE_MARKER):
                continue
            rel = info.path[len(self.warehouse) + 1 : -len(NAMESPACE_MARKER) - 1]
            ns = tuple(rel.split("/"))
            if ns[: len(base)] == base and len(ns) == len(base) + 1:
                found.add(ns)
        # HadoopCatalog namespaces: child directories that are not tables.
        for name in await self._child_dirs(prefix):
            ns = (*base, name)
            if ns not in found and not await self._is_table_dir(self._ns_path(ns)):
                found.add(ns)
        return sorted(found)

    async def _child_dirs(self, prefix: str) -> set[str]:
        """Names of the directories directly under ``prefix`` (object stores: prefixes)."""
        if isinstance(self.io, LocalFileIO):
            path = parse_location(prefix)[2]

            def scan() -> set[str]:
                try:
                    with os.scandir(path) as entries:
                        return {
                            e.name for e in entries if e.is_dir() and not e.name.startswith(".")
                        }
                except (FileNotFoundError, NotADirectoryError):
                    return set()

            return await asyncio.to_thread(scan)
        names: set[str] = set()
        async for info in self.io.list(prefix):
            rel = info.path[len(prefix.rstrip("/")) + 1 :]
            if "/" in rel and not rel.startswith("."):
                names.add(rel.split("/", 1)[0])
        return names

    async def _is_table_dir(self, path: str) -> bool:
        """As Java's HadoopCatalog decides: the folder has ``metadata/*.metadata.json``."""
        async for info in self.io.list(f"{path}/metadata"):
            if info.path.endswith(".metadata.json"):
                return True
        return False

    async def _is_plain_namespace_dir(self, ns: Namespace) -> bool:
        """A HadoopCatalog namespace: an existing directory (no marker) that is no table."""
        if not ns:
            return False
        path = self._ns_path(ns)
        parent = self._ns_path(ns[:-1]) if len(ns) > 1 else self.warehouse
        if ns[-1] not in await self._child_dirs(parent):
            return False
        return not await self._is_table_dir(path)

    async def load_namespace_properties(self, namespace: str | Namespace) -> dict[str, str]:
        ns = parse_namespace(namespace)
        try:
            raw = await self.io.read(f"{self._ns_path(ns)}/{NAMESPACE_MARKER}")
        except NotFoundError:
            if await self._is_plain_namespace_dir(ns):
                return {}  # made by Java's HadoopCatalog: a directory with no properties
            raise NotFoundError(f"namespace {'.'.join(ns)!r} does not exist") from None
        props = json.loads(raw)
        if not isinstance(props, dict):
            raise ValidationError(f"namespace {'.'.join(ns)!r}: marker file is not an object")
        return {str(k): str(v) for k, v in props.items()}

    async def update_namespace_properties(
        self,
        namespace: str | Namespace,
        removals: set[str] | None = None,
        updates: Mapping[str, str] | None = None,
    ) -> None:
        ns = parse_namespace(namespace)
        props = await self.load_namespace_properties(ns)
        for key in removals or ():
            props.pop(key, None)
        props.update(updates or {})
        body = json.dumps(props, sort_keys=True).encode()
        await self.io.write(f"{self._ns_path(ns)}/{NAMESPACE_MARKER}", body)

    async def drop_namespace(self, namespace: str | Namespace) -> None:
        ns = parse_namespace(namespace)
        await self.load_namespace_properties(ns)
        if await self.list_tables(ns):
            raise NamespaceNotEmptyError(f"namespace {'.'.join(ns)!r} is not empty")
        if await self.list_namespaces(ns):
            raise NamespaceNotEmptyError(f"namespace {'.'.join(ns)!r} has child namespaces")
        marker = f"{self._ns_path(ns)}/{NAMESPACE_MARKER}"
        if await self.io.exists(marker):
            await self.io.delete(marker)
        if isinstance(self.io, LocalFileIO):
            # HadoopCatalog sees any directory as a namespace: remove the empty folder too.
            path = parse_location(self._ns_path(ns))[2]
            await asyncio.to_thread(_remove_empty_dir, path)

    # -- tables -------------------------------------------------------------------------

    async def list_tables(self, namespace: str | Namespace) -> list[TableIdentifier]:
        ns = parse_namespace(namespace)
        await self.load_namespace_properties(ns)
        prefix = self._ns_path(ns) + "/"
        names: set[str] = set()
        async for info in self.io.list(self._ns_path(ns)):
            rel = info.path[len(prefix) :]
            parts = rel.split("/")
            if len(parts) == 3 and parts[1] == "metadata" and _VERSION_FILE.search(info.path):
                names.add(parts[0])
        return [TableIdentifier(ns, n) for n in sorted(names)]

    async def _read_hint(self, ident: TableIdentifier) -> int:
        try:
            return int((await self.io.read(f"{self._metadata_path(ident)}/{VERSION_HINT}")).strip())
        except (NotFoundError, ValueError):
            return 0

    async def _newest_from(self, ident: TableIdentifier, version: int) -> int:
        while await self.io.exists(self._version_file(ident, version + 1)):
            version += 1
        return version

    async def _listed_version(self, ident: TableIdentifier) -> int:
        """The highest version in the metadata folder (then probed past, for racing commits)."""
        version = 0
        async for info in self.io.list(self._metadata_path(ident)):
            if m := _VERSION_FILE.search(info.path):
                version = max(version, int(m.group(1)))
        if version == 0:
            raise NotFoundError(f"table {ident} does not exist")
        return await self._newest_from(ident, version)

    async def _current_version(self, ident: TableIdentifier) -> int:
        """Highest committed version: start at the hint (or a listing), probe until a gap."""
        version = self._seen.get(ident) or await self._read_hint(ident)
        if version <= 0 or not await self.io.exists(self._version_file(ident, version)):
            # No usable hint (old versions may have been deleted): list the folder instead.
            return await self._listed_version(ident)
        return await self._newest_from(ident, version)

    async def load_table(self, identifier: str | TableIdentifier) -> Table:
        """The newest version, found with as few requests as possible.

        Probing starts from the newest version this client saw (else the hint) and the file
        is read without checking it first: on S3 every request counts, and a start that
        turns out not to exist only costs a listing.
        """
        ident = TableIdentifier.parse(identifier)
        start = self._seen.get(ident) or await self._read_hint(ident)
        data: bytes | None = None
        version = 0
        if start > 0:
            version = await self._newest_from(ident, start)
            try:
                data = await self.io.read(self._version_file(ident, version))
            except NotFoundError:
                data = None
        if data is None:
            version = await self._listed_version(ident)
            data = await self.io.read(self._version_file(ident, version))
        location = self._version_file(ident, version)
        self._seen[ident] = version
        return Table(ident, self.parse_metadata(location, data), location, self)

    async def _create_table_pointer(
        self, identifier: TableIdentifier, metadata: TableMetadata
    ) -> str:
        if metadata.location.rstrip("/") != self._table_path(identifier):
            raise ValidationError(
                f"file-system table {identifier} must live at {self._table_path(identifier)}, "
                f"not {metadata.location}"
            )
        location = self._version_file(identifier, 1)
        try:
            await self.io.write_once(location, metadata.to_json_bytes())
        except AlreadyExistsError:
            raise AlreadyExistsError(f"table {identifier} already exists") from None
        await self._write_hint(identifier, 1)
        return location

    async def register_table(
        self, identifier: str | TableIdentifier, metadata_location: str
    ) -> Table:
        ident = TableIdentifier.parse(identifier)
        metadata = await self.read_metadata(metadata_location)
        location = await self._create_table_pointer(ident, metadata)
        return Table(ident, metadata, location, self)

    async def commit(self, table: Table, new_metadata: TableMetadata) -> Table:
        m = _VERSION_FILE.search(table.metadata_location)
        if not m:
            raise ValidationError(
                f"{table.metadata_location} is not a file-system table version file"
            )
        version = int(m.group(1)) + 1
        location = self._version_file(table.identifier, version)
        body = new_metadata.to_json_bytes()
        try:
            await self.io.write_once(location, body)
        except AlreadyExistsError:
            self._seen[table.identifier] = max(self._seen.get(table.identifier, 0), version)
            raise CommitFailedError(
                f"table {table.identifier} moved past version {version - 1} concurrently"
            ) from None
        except Exception as e:  # the create may or may not have happened
            landed = await self._holds(location, body)
            if landed is None:
                raise CommitStateUnknownError(
                    f"commit of {table.identifier} to {location} could not be confirmed "
                    f"(storage failed with: {e}); reload the table before retrying"
                ) from e
            if not landed:
                raise CommitFailedError(
                    f"commit of {table.identifier} to {location} was not applied "
                    f"(storage error: {e})"
                ) from e
        self._seen[table.identifier] = max(self._seen.get(table.identifier, 0), version)
        await self._write_hint(table.identifier, version)
        for stale in previous_files_to_delete(table.metadata, new_metadata):
            await self.io.delete(stale)
        return Table(table.identifier, new_metadata, location, self)

    async def _holds(self, location: str, body: bytes) -> bool | None:
        """After a failed create: does ``location`` hold ``body``? None if unreadable."""
        try:
            return await self.io.read(location) == body
        except NotFoundError:
            return False
        except Exception:
            return None

    async def _write_hint(self, ident: TableIdentifier, version: int) -> None:
        """Best effort: icefloe probes past a stale hint, so a lost hint costs only a probe.

        Readers that trust the hint without probing (PyIceberg's StaticTable) need it to end
        on the newest version, though, and racing committers can write their hints out of
        order. So after writing, a committer that sees a newer version writes that instead:
        the last hint written is then always checked against every committed version.
        """
        hint = f"{self._metadata_path(ident)}/{VERSION_HINT}"
        try:
            while True:
                await self.io.write(hint, str(version).encode())
                newest = version
                while await self.io.exists(self._version_file(ident, newest + 1)):
                    newest += 1
                if newest == version:
                    return
                version = newest
        except Exception:
            pass

    async def rename_table(
        self, source: str | TableIdentifier, destination: str | TableIdentifier
    ) -> None:
        raise UnsupportedOperationError(
            f"file-system tables are found by their path, so renaming {source} would move "
            "every file; tables that must be renamed belong in a Redis or DynamoDB catalog"
        )

    async def drop_table(self, identifier: str | TableIdentifier, purge: bool = False) -> None:
        ident = TableIdentifier.parse(identifier)
        if purge:
            from icefloe.table.maintenance import purge_table_files

            # Reachable files may live outside the table folder (write.data.path, imports).
            await purge_table_files(await self.load_table(ident))
        else:
            await self._current_version(ident)
        self._seen.pop(ident, None)
        root = self._table_path(ident) if purge else self._metadata_path(ident)
        async for info in self.io.list(root):
            await self.io.delete(info.path)
        # Left as empty folders they would read as namespaces (HadoopCatalog's rule).
        await self.io.remove_empty_dirs(self._table_path(ident))


def _remove_empty_dir(path: str) -> None:
    try:
        os.rmdir(path)
    except OSError:
        pass  # not empty (data left behind) or already gone: the namespace is gone either way
