"""The read side of the Iceberg REST catalog: config, namespaces, tables, and the OpenAPI
document the planner serves.

* ``GET /v1/config``: ``endpoints`` lists exactly the routes registered in the app (so routes
  other modules add appear too) and ``scan-planning-mode`` (PyIceberg's switch to
  server-side planning) is advertised as configured: a default, an override, or not at all;
  a table property of that name overrides it in loadTable's ``config``;
* namespaces (list, load, exists) and tables (list, load, exists); loadTable answers with an
  ``ETag`` and ``304`` for a matching ``If-None-Match`` (never when it vends credentials,
  which expire).
"""

from __future__ import annotations

import json
from collections.abc import Collection
from pathlib import Path
from typing import Any

from aiohttp import web

from icefloe.errors import NotFoundError
from icefloe.planner.config import PlannerConfig
from icefloe.planner.delegation import AccessDelegation
from icefloe.planner.errors import bad_request
from icefloe.planner.idempotency import IDEMPOTENCY_LIFETIME
from icefloe.planner.load_result import SCAN_PLANNING_MODE, matches, table_config, table_etag
from icefloe.planner.names import parse_namespace, table_identifier
from icefloe.planner.openapi import ENDPOINTS, served_openapi
from icefloe.planner.table_lookup import TableLookup, no_namespace
from icefloe.spec.metadata import TableMetadata
from icefloe.table.catalog import Catalog, Namespace

OPENAPI_FILE = Path(__file__).with_name("openapi.json")


class CatalogRoutes:
    """The read routes over a catalog and the planner's table states."""

    def __init__(
        self,
        config: PlannerConfig,
        catalog: Catalog,
        tables: TableLookup,
        delegation: AccessDelegation,
    ) -> None:
        self.config = config
        self.catalog = catalog
        self.tables = tables
        self.delegation = delegation
        # Write routes the app serves too (set once they are registered): /v1/config lists them.
        self.write_endpoints: list[tuple[str, str]] = []
        self._openapi: dict[str, Any] | None = None

    def register(self, router: web.UrlDispatcher, base: str) -> None:
        """The config, namespace and table routes under ``base`` (``/v1/{prefix}/``)."""
        ns = base + "namespaces/{namespace}"
        table = ns + "/tables/{table}"
        router.add_get("/v1/config", self._config, allow_head=False)
        router.add_get(base + "namespaces", self._list_namespaces, allow_head=False)
        router.add_get(ns, self._load_namespace, allow_head=False)
        router.add_route("HEAD", ns, self._namespace_exists)
        router.add_get(ns + "/tables", self._list_tables, allow_head=False)
        router.add_get(table, self._load_table, allow_head=False)
        router.add_route("HEAD", table, self._table_exists)

    def register_documents(self, router: web.UrlDispatcher) -> None:
        """``/openapi.yaml`` and ``/openapi.json``: the trimmed REST OpenAPI document."""
        router.add_get("/openapi.yaml", self._openapi_document, allow_head=False)
        router.add_get("/openapi.json", self._openapi_document, allow_head=False)

    # -- config and documents -------------------------------------------------------------

    def _planning_mode_config(self) -> dict[str, str]:
        """The planner's scan-planning-mode as /v1/config advertises it."""
        mode = self.config.scan_planning_mode
        return {} if mode == "none" else {SCAN_PLANNING_MODE: mode}

    async def _config(self, request: web.Request) -> web.Response:
        """GET /v1/config: defaults, overrides, endpoints (and the idempotency lifetime)."""
        overrides: dict[str, str] = {}
        defaults: dict[str, str] = {}
        planning = self._planning_mode_config()
        (overrides if self.config.scan_planning_mode_forced else defaults).update(planning)
        if self.config.prefix:
            overrides["prefix"] = self.config.prefix
        if self.config.warehouse:
            defaults["warehouse"] = self.config.warehouse
        body: dict[str, Any] = {
            "defaults": defaults,
            "overrides": overrides,
            "endpoints": advertised_endpoints(
                request.app.router,
                self.config.prefix,
                {f"{m} {p}" for m, p in (*ENDPOINTS, *self.write_endpoints)},
            ),
        }
        lifetime = request.app.get(IDEMPOTENCY_LIFETIME)
        if lifetime is not None:  # its presence tells clients keys are honoured
            body["idempotency-key-lifetime"] = lifetime
        return web.json_response(body)

    async def _openapi_document(self, request: web.Request) -> web.Response:
        if self._openapi is None:
            document = json.loads(OPENAPI_FILE.read_text(encoding="utf-8"))
            self._openapi = served_openapi(document, self.config.prefix)
        text = json.dumps(self._openapi, indent=1)
        kind = "application/json" if request.path.endswith(".json") else "application/yaml"
        return web.Response(text=text, content_type=kind)

    # -- namespaces -----------------------------------------------------------------------

    async def _list_namespaces(self, request: web.Request) -> web.Response:
        parent_text = request.query.get("parent", "")
        parent: Namespace = parse_namespace(parent_text) if parent_text else ()
        if parent and not await self.catalog.namespace_exists(parent):
            raise no_namespace(parent)
        namespaces = await self.catalog.list_namespaces(parent)
        return web.json_response({"namespaces": [list(n) for n in namespaces]})

    async def _load_namespace(self, request: web.Request) -> web.Response:
        namespace = parse_namespace(request.match_info["namespace"])
        try:
            properties = await self.catalog.load_namespace_properties(namespace)
        except NotFoundError:
            raise no_namespace(namespace) from None
        return web.json_response({"namespace": list(namespace), "properties": properties})

    async def _namespace_exists(self, request: web.Request) -> web.Response:
        namespace = parse_namespace(request.match_info["namespace"])
        if not await self.catalog.namespace_exists(namespace):
            raise no_namespace(namespace)
        return web.Response(status=204)

    async def _list_tables(self, request: web.Request) -> web.Response:
        namespace = parse_namespace(request.match_info["namespace"])
        try:
            tables = await self.catalog.list_tables(namespace)
        except NotFoundError:
            raise no_namespace(namespace) from None
        return web.json_response(
            {"identifiers": [{"namespace": list(t.namespace), "name": t.name} for t in tables]}
        )

    # -- tables ---------------------------------------------------------------------------

    async def _load_table(self, request: web.Request) -> web.Response:
        ident = table_identifier(request)
        snapshots = request.query.get("snapshots", "all")
        if snapshots not in ("all", "refs"):
            raise bad_request(f"snapshots must be 'all' or 'refs', got {snapshots!r}")
        state = await self.tables.get(ident, tell_namespace=False)
        etag = table_etag(state.metadata_location, snapshots)
        # Delegated access is fresh in every answer (keys expire): never "not modified".
        fresh = self.delegation.delegates(request)
        if matches(request.headers.get("If-None-Match"), etag) and not fresh:
            return web.Response(status=304, headers={"ETag": etag})
        body = {
            "metadata-location": state.metadata_location,
            "metadata": metadata_json(state.metadata, snapshots),
            "config": self._table_config(state.metadata),
        }
        await self.delegation.decorate(request, body, state.metadata, ident.name)
        return web.json_response(body, headers={"ETag": etag})

    def _table_config(self, metadata: TableMetadata) -> dict[str, str]:
        """The planner's scan-planning-mode unless the table's property sets its own."""
        return table_config(metadata.properties, self.config.scan_planning_mode)

    async def _table_exists(self, request: web.Request) -> web.Response:
        await self.tables.get(table_identifier(request), tell_namespace=False)
        return web.Response(status=204)

    # -- planning -------------------------------------------------------------------------


def metadata_json(metadata: TableMetadata, snapshots: str) -> dict[str, Any]:
    """loadTable's ``metadata``: with ``snapshots=refs``, only the referenced snapshots."""
    out = metadata.to_json()
    if snapshots == "refs":
        referenced = {ref.snapshot_id for ref in metadata.refs.values()}
        out["snapshots"] = [s for s in out["snapshots"] if s["snapshot-id"] in referenced]
    return out


def advertised_endpoints(
    router: web.UrlDispatcher, prefix: str, capable: Collection[str]
) -> list[str]:
    """``METHOD /v1/{prefix}/...`` for every REST route registered in ``router`` that the
    service can also serve with its catalog (``capable``: a route such as rename is
    registered everywhere but answers 406 on catalogs that cannot do it). Deriving the list
    from the router keeps it from naming a route that does not exist."""
    base = f"/v1/{prefix}/" if prefix else "/v1/"
    out: list[str] = []
    for route in router.routes():
        resource = route.resource
        if resource is None or route.method == "*":
            continue
        path = resource.canonical
        if not path.startswith(base) or path.rstrip("/") == "/v1/config":
            continue
        spec_path = "/v1/{prefix}/" + path[len(base) :]
        spec_path = spec_path.replace("{plan_id}", "{plan-id}")
        entry = f"{route.method} {spec_path}"
        if entry in capable and entry not in out:
            out.append(entry)
    return out
