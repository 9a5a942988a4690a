"""A table's state for a read or plan route, or the 404 the REST spec gives that route.

The spec answers an unknown table with ``NoSuchTableException``; some operations (plans)
may say instead that the namespace is unknown, others (loadTable, tableExists) must not, as
Spark's metadata tables need (``ns.t.files`` is first looked up as table ``files`` in
namespace ``ns.t``).
"""

from __future__ import annotations

from icefloe.errors import NotFoundError
from icefloe.planner.errors import ApiError
from icefloe.planner.names import check_name, parse_namespace
from icefloe.planner.refresher import TableRefresher, TableState
from icefloe.spec.metadata import TableMetadata
from icefloe.table.catalog import Catalog, Namespace, TableIdentifier


def no_namespace(namespace: Namespace) -> ApiError:
    """The spec's 404 for an unknown namespace."""
    return ApiError(
        404, "NoSuchNamespaceException", f"namespace {'.'.join(namespace)!r} does not exist"
    )


class TableLookup:
    """Tables' states from the planner's refresher, unknown ones answered as 404s."""

    def __init__(self, catalog: Catalog, refresher: TableRefresher) -> None:
        self.catalog = catalog
        self.refresher = refresher

    async def get(self, ident: TableIdentifier, *, tell_namespace: bool = True) -> TableState:
        """The table's state; 404 ``NoSuchTableException``, or ``NoSuchNamespaceException``
        where the operation's spec allows it (``tell_namespace``) and that is the reason."""
        try:
            return await self.refresher.get(ident)
        except NotFoundError:
            exists = await self.catalog.namespace_exists(ident.namespace)
            if not exists and tell_namespace:
                raise no_namespace(ident.namespace) from None
            reason = "" if exists else f" (namespace {ident.namespace_name!r} does not exist)"
            raise ApiError(
                404, "NoSuchTableException", f"table {ident} does not exist{reason}"
            ) from None

    async def metadata_at(self, namespace: str, table: str) -> TableMetadata:
        """A table's metadata from its path segments (the delegation routes' lookup)."""
        ident = TableIdentifier(parse_namespace(namespace), check_name(table, "table name"))
        return (await self.get(ident, tell_namespace=False)).metadata
