"""The table routes of the REST catalog's write side: ``createTable`` (also
``stage-create``: metadata returned and, on a local disk, the table's metadata and data
folders made, as engines write their first files there before the create commit),
``registerTable`` (``overwrite`` swaps the pointer of an existing table), ``dropTable``
(``purgeRequested`` deletes the reachable files that lie under the table's own location and
the allowed locations, refused when another table's location overlaps) and ``renameTable``
(406 where the catalog cannot: file-system tables are found by their path).
"""

from __future__ import annotations

import logging

from aiohttp import web

from icefloe.errors import (
    AlreadyExistsError,
    CommitFailedError,
    InvalidFileError,
    NotFoundError,
    ValidationError,
)
from icefloe.planner.attempt_outcomes import metadata_digest, noted_create
from icefloe.planner.auth import audit, principal_of
from icefloe.planner.catalog_writes import CatalogWrites
from icefloe.planner.errors import ApiError, bad_request
from icefloe.planner.idempotency import attempt_of
from icefloe.planner.write_requests import (
    CreateTableRequest,
    RegisterTableRequest,
    RenameTableRequest,
    check_name,
    identifier_of,
    path_namespace,
    path_table,
    read_body,
    snapshot_id_of,
    with_field_ids,
)
from icefloe.spec.metadata_builder import new_table_metadata
from icefloe.spec.partition import PartitionSpec
from icefloe.spec.schema import Schema
from icefloe.spec.sort_order import SortOrder
from icefloe.table.catalog import Table, TableIdentifier, data_dir, metadata_dir
from icefloe.table.maintenance import purge_table_files

log = logging.getLogger(__name__)


class TableRoutes:
    """The table write handlers (commits are :mod:`icefloe.planner.commit_routes`')."""

    def __init__(self, writes: CatalogWrites) -> None:
        self.writes = writes
        self.service = writes.service
        self.catalog = writes.catalog
        self.locations = writes.locations
        self.tables_by_location = writes.tables_by_location

    async def create_table(self, request: web.Request) -> web.StreamResponse:
        namespace = path_namespace(request.match_info["namespace"])
        body = await read_body(request, CreateTableRequest)
        ident = TableIdentifier(namespace, check_name(body.name, "table name"))
        await self.writes.namespace_or_404(namespace)
        attempt = attempt_of(request)
        made = await noted_create(self.catalog, ident, attempt)
        if made is not None:  # (before the checks: its location is in use now, by it)
            return await self._created(request, made)
        schema = Schema.from_json(body.schema_)
        spec = (
            PartitionSpec.from_json(with_field_ids(body.partition_spec))
            if body.partition_spec is not None
            else PartitionSpec.unpartitioned()
        )
        order = (
            SortOrder.from_json(body.write_order)
            if body.write_order is not None
            else SortOrder.unsorted()
        )
        default = await self.catalog.default_table_location(ident)
        location = body.location or default
        self.locations.check_table(location, body.properties)
        if location != default:
            await self.locations.check_unused(self.catalog.io, location, "table location")
        await self.writes.refuse_overlap(ident, location)
        metadata = new_table_metadata(schema, spec, order, location, body.properties)
        principal = principal_of(request)
        if body.stage_create:
            if await self.catalog.table_exists(ident):
                raise ApiError(409, "AlreadyExistsException", f"table {ident} already exists")
            # Engines write the first manifest (DuckDB) and data files before the create
            # commit: on a local disk their folders must exist (object stores have none).
            for folder in (metadata_dir(metadata), data_dir(metadata)):
                await self.catalog.io.make_dirs(folder)
            audit(principal, "createTable", status=200, table=str(ident), staged=True)
            return await self.writes.load_result(request, ident.name, None, metadata)
        if attempt is not None:
            await attempt.note({"create": str(ident), "digest": metadata_digest(metadata)})
        try:
            table = await self.catalog.create_table_with_metadata(ident, metadata)
        except AlreadyExistsError as e:
            raise ApiError(409, "AlreadyExistsException", str(e)) from None
        return await self._created(request, table)

    async def _created(self, request: web.Request, table: Table) -> web.StreamResponse:
        await self.writes.claim_new(table)
        self.writes.seen(table)
        audit(
            principal_of(request),
            "createTable",
            status=200,
            table=str(table.identifier),
            **{"metadata-location": table.metadata_location},
        )
        return await self.writes.load_result(
            request, table.identifier.name, table.metadata_location, table.metadata
        )

    async def register_table(self, request: web.Request) -> web.StreamResponse:
        namespace = path_namespace(request.match_info["namespace"])
        body = await read_body(request, RegisterTableRequest)
        ident = TableIdentifier(namespace, check_name(body.name, "table name"))
        await self.writes.namespace_or_404(namespace)
        self.locations.check(body.metadata_location, "metadata file")
        try:
            metadata = await self.catalog.read_metadata(body.metadata_location)
        except (NotFoundError, InvalidFileError, ValidationError) as e:
            raise bad_request(f"cannot register {ident}: {e}") from None
        self.locations.check_table(metadata.location, metadata.properties)
        existing: Table | None = None
        if body.overwrite:
            try:
                existing = await self.catalog.load_table(ident)
            except NotFoundError:
                existing = None
        # Refused before anything changes: a registered table whose location overlaps
        # another table's would share its files, and purging it would delete them.
        await self.writes.refuse_overlap(ident, metadata.location)
        if existing is None:
            try:
                table = await self.catalog.register_table(ident, body.metadata_location)
            except AlreadyExistsError as e:
                raise ApiError(409, "AlreadyExistsException", str(e)) from None
            await self.writes.claim_new(table)
        else:
            try:
                table = await self.catalog.register_over(existing, body.metadata_location)
            except CommitFailedError:
                raise ApiError(
                    409,
                    "CommitFailedException",
                    f"table {ident} changed while it was being overwritten; retry the register",
                ) from None
            await self.tables_by_location.moved((existing.location, ident), (table.location, ident))
        self.writes.seen(table)
        audit(
            principal_of(request),
            "registerTable",
            status=200,
            table=str(ident),
            overwrite=existing is not None or None,
            **{
                "metadata-location": table.metadata_location,
                "previous-metadata-location": existing.metadata_location if existing else None,
                "snapshot-id": snapshot_id_of(table.metadata),
            },
        )
        return await self.writes.load_result(
            request, ident.name, table.metadata_location, table.metadata
        )

    async def drop_table(self, request: web.Request) -> web.StreamResponse:
        ident = path_table(request)
        purge_text = request.query.get("purgeRequested", "false").lower()
        if purge_text not in ("true", "false"):
            raise bad_request(f"purgeRequested must be true or false, got {purge_text!r}")
        purge = purge_text == "true"
        await self.writes.namespace_or_404(ident.namespace, "NoSuchTableException")
        refused: list[str] = []
        try:
            table = await self.catalog.load_table(ident)
            if purge:
                await self._refuse_shared_purge(table)
            await self.catalog.drop_table(ident)
        except NotFoundError:
            raise ApiError(404, "NoSuchTableException", f"table {ident} does not exist") from None
        self.service.refresher.dropped(ident)
        await self.tables_by_location.release(table.location, ident)
        if purge:
            # After the pointer is gone, so no reader meets a half-deleted table; only what
            # lies within the allowed locations is deleted.
            refused = await purge_table_files(table, self.locations.purgeable(table.metadata))
            if refused:
                log.warning(
                    "purging %s left %d files outside its location (or the allowed "
                    "locations), e.g. %s",
                    ident,
                    len(refused),
                    refused[0],
                )
        audit(
            principal_of(request),
            "dropTable",
            status=204,
            table=str(ident),
            purge=purge,
            **{"files-kept-outside-table-location": len(refused) or None},
        )
        return web.Response(status=204)

    async def _refuse_shared_purge(self, table: Table) -> None:
        """403 (nothing dropped) when another table's location overlaps this one's: their
        files are mixed, and a purge would delete the other table's."""
        other = await self.tables_by_location.overlapping_table(
            table.location, excluding=table.identifier
        )
        if other is not None:
            raise ApiError(
                403,
                "ForbiddenException",
                f"purging {table.identifier} is refused: its location overlaps the location of "
                f"table {other}, whose files a purge would delete; drop it without "
                "purgeRequested",
            )

    async def rename_table(self, request: web.Request) -> web.StreamResponse:
        body = await read_body(request, RenameTableRequest)
        source, destination = identifier_of(body.source), identifier_of(body.destination)
        if not self.catalog.supports_rename:
            await self.catalog.rename_table(source, destination)  # raises, naming why
        await self.writes.namespace_or_404(destination.namespace)
        try:
            location = (await self.catalog.load_table(source)).location
            await self.catalog.rename_table(source, destination)
        except NotFoundError as e:
            kind = "NoSuchNamespaceException" if "namespace" in str(e) else "NoSuchTableException"
            raise ApiError(404, kind, str(e)) from None
        self.service.refresher.dropped(source)
        await self.tables_by_location.moved((location, source), (location, destination))
        audit(
            principal_of(request),
            "renameTable",
            status=204,
            table=str(source),
            destination=str(destination),
        )
        return web.Response(status=204)
