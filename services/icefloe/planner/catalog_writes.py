"""What the write routes share: the catalog, the location policy and index, and the
planner's table state they keep current.

Every location a request names or a commit adds obeys
:class:`~icefloe.planner.location_policy.LocationPolicy`; on catalogs with a stored location
index (metastore catalogs) no table's location may contain another's, checked when a table
is made or moved (:meth:`CatalogWrites.refuse_overlap`, :meth:`CatalogWrites.claim_new`).
The planner answers from a committed state at once, not after a refresh
(:meth:`CatalogWrites.seen`).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from icefloe.catalog.location_index import TableLocations
from icefloe.errors import NotFoundError
from icefloe.planner.errors import ApiError
from icefloe.planner.load_result import table_config, table_etag
from icefloe.planner.location_policy import LocationPolicy
from icefloe.planner.service_view import PlannerService
from icefloe.planner.write_config import RestCatalogSettings
from icefloe.spec.metadata import TableMetadata
from icefloe.table.catalog import Namespace, Table, TableIdentifier


class CatalogWrites:
    """The write handlers' shared state over a planner service's catalog."""

    def __init__(self, service: PlannerService, settings: RestCatalogSettings) -> None:
        self.service = service
        self.catalog = service.catalog
        self.locations = LocationPolicy(
            settings.allowed_location_list() or [self.catalog.properties.get("warehouse", "")]
        )
        self.tables_by_location = TableLocations(self.catalog)

    async def namespace_or_404(
        self, namespace: Namespace, error_type: str = "NoSuchNamespaceException"
    ) -> dict[str, str]:
        """The namespace's properties, or 404 in ``error_type``: the spec answers an unknown
        namespace with NoSuchTableException on the routes of one table (drop, commit)."""
        try:
            return await self.catalog.load_namespace_properties(namespace)
        except NotFoundError:
            raise ApiError(
                404, error_type, f"namespace {'.'.join(namespace)!r} does not exist"
            ) from None

    async def load_result(
        self, request: web.Request, name: str, location: str | None, metadata: TableMetadata
    ) -> web.Response:
        """A LoadTableResult: metadata, config, delegated access; an ETag with a location."""
        body: dict[str, Any] = {
            "metadata": metadata.to_json(),
            "config": table_config(metadata.properties, self.service.config.scan_planning_mode),
        }
        if location is not None:
            body["metadata-location"] = location
        await self.service.delegation.decorate(request, body, metadata, name)
        if location is None:
            return web.json_response(body)
        return web.json_response(body, headers={"ETag": table_etag(location)})

    def seen(self, table: Table) -> None:
        """The planner answers from the committed state at once, not after a refresh."""
        self.service.refresher.committed(table.identifier, table.metadata, table.metadata_location)

    @property
    def indexed(self) -> bool:
        """Whether tables are checked for overlapping locations when they are made or
        moved: with a stored location index (metastore catalogs). The file-system catalog
        keeps every table at its own path and refuses any other location itself (400);
        overlaps it can still hold (a namespace folder inside a table's) are caught when a
        purge asks."""
        return self.tables_by_location.index.stored

    async def refuse_overlap(self, ident: TableIdentifier, location: str) -> None:
        """403 if another table's location contains ``location`` or lies within it."""
        if not self.indexed:
            return
        other = await self.tables_by_location.overlapping_table(location, excluding=ident)
        if other is not None:
            raise overlap_error(location, other)

    async def claim_new(self, table: Table) -> None:
        """Enter a table just created or registered in the location index; if another
        table's location overlaps (a concurrent claim), undo the creation and refuse."""
        if not self.indexed:
            return
        other = await self.tables_by_location.claim(table.location, table.identifier)
        if other is None:
            return
        await self.catalog.drop_table(table.identifier)
        self.service.refresher.dropped(table.identifier)
        raise overlap_error(table.location, other)


def overlap_error(location: str, other: TableIdentifier) -> ApiError:
    """The 403 for a table location that overlaps ``other``'s."""
    return ApiError(
        403,
        "ForbiddenException",
        f"table location {location[:200]!r} overlaps the location of table {other} (one "
        "contains the other); a table's location must be its own",
    )
