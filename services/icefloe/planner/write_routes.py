"""The write side of the Iceberg REST catalog, served by the planner next to its read routes.

Routes (REST OpenAPI names), all through the planner's catalog, each in the module of its
concept:

* namespaces (:mod:`icefloe.planner.namespace_routes`): ``createNamespace``,
  ``dropNamespace``, ``updateProperties``;
* tables (:mod:`icefloe.planner.table_routes`): ``createTable`` (also ``stage-create``),
  ``registerTable``, ``dropTable`` (``purgeRequested``), ``renameTable``;
* commits (:mod:`icefloe.planner.commit_routes`): ``updateTable`` and ``commitTransaction``,
  through the catalog's conditional swap, so REST commits and coordinator batches never
  lose each other's changes.

What they share (the location policy and index, the planner's table state) is
:mod:`icefloe.planner.catalog_writes`'s, their request bodies and names
:mod:`icefloe.planner.write_requests`'. Every location a request names or a commit adds
(table locations, location-bearing properties, manifest lists, manifests, data files,
registered metadata files) obeys :class:`~icefloe.planner.location_policy.LocationPolicy`.

This module registers them (and the OAuth2 token route), honours ``Idempotency-Key``, and
maps typed errors to the spec's answers: raised as :class:`ApiError` in the spec's types and
answered (and, refused or failed, audited) by the planner's request middleware, never a
traceback. Tokens and the audit log are :mod:`icefloe.planner.auth`'s. The planner sees a
REST commit at once: the new metadata goes straight into its table state.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web

from icefloe.catalog.records import catalog_records
from icefloe.errors import (
    AlreadyExistsError,
    CommitFailedError,
    CommitStateUnknownError,
    NamespaceNotEmptyError,
    NotFoundError,
    UnsupportedOperationError,
    ValidationError,
)
from icefloe.planner.auth import OAUTH_PATH, WRITE_ROUTE_PREFIX, TokenAuthority, oauth_tokens
from icefloe.planner.catalog_writes import CatalogWrites
from icefloe.planner.commit_routes import CommitRoutes
from icefloe.planner.errors import ApiError
from icefloe.planner.idempotency import IDEMPOTENCY_LIFETIME, IdempotentRequests
from icefloe.planner.namespace_routes import NamespaceRoutes
from icefloe.planner.service_view import PlannerService
from icefloe.planner.table_routes import TableRoutes
from icefloe.planner.write_config import RestCatalogSettings

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# (method, path under /v1/{prefix}/, operation id, handler method of the route objects)
ROUTES: tuple[tuple[str, str, str, str], ...] = (
    ("POST", "namespaces", "createNamespace", "create_namespace"),
    ("DELETE", "namespaces/{namespace}", "dropNamespace", "drop_namespace"),
    (
        "POST",
        "namespaces/{namespace}/properties",
        "updateProperties",
        "update_namespace_properties",
    ),
    ("POST", "namespaces/{namespace}/tables", "createTable", "create_table"),
    ("POST", "namespaces/{namespace}/register", "registerTable", "register_table"),
    ("POST", "namespaces/{namespace}/tables/{table}", "updateTable", "update_table"),
    ("DELETE", "namespaces/{namespace}/tables/{table}", "dropTable", "drop_table"),
    ("POST", "tables/rename", "renameTable", "rename_table"),
    ("POST", "transactions/commit", "commitTransaction", "commit_transaction"),
)
WRITE_ENDPOINTS: tuple[tuple[str, str], ...] = tuple(
    (method, "/v1/{prefix}/" + path) for method, path, _, _ in ROUTES
)
OPENAPI_FILE = Path(__file__).with_name("write_openapi.json")


class WriteRoutes:
    """The write handlers over a planner service's catalog and table state."""

    def __init__(
        self, service: PlannerService, settings: RestCatalogSettings, authority: TokenAuthority
    ) -> None:
        self.service = service
        self.settings = settings
        self.catalog = service.catalog
        self.authority = authority
        writes = CatalogWrites(service, settings)
        self.handlers = (
            NamespaceRoutes(writes),
            TableRoutes(writes),
            CommitRoutes(writes, settings, service.registry),
        )
        self.endpoints: list[tuple[str, str]] = []
        self.idempotency = (
            IdempotentRequests(
                catalog_records(self.catalog),
                settings.idempotency_key_lifetime_s,
                settings.idempotency_lease_s,
            )
            if settings.idempotency_key_lifetime_s > 0
            else None
        )

    # -- registration -----------------------------------------------------------------------

    def register(self, app: web.Application, prefix: str) -> list[tuple[str, str]]:
        """Add the routes, named ``write.<operationId>`` (how the token check and the audit
        of refusals know a write); return the endpoints to advertise in ``/v1/config``, in
        the spec's ``{prefix}`` form."""
        app.router.add_post(OAUTH_PATH, self._oauth)
        base = f"/v1/{prefix}/" if prefix else "/v1/"
        advertised = []
        if self.idempotency is not None:
            app[IDEMPOTENCY_LIFETIME] = self.idempotency.lifetime
        for method, path, operation, attribute in ROUTES:
            wrapped = self._wrap(self._handler(attribute), operation)
            if self.idempotency is not None:
                wrapped = self.idempotency.wrap(wrapped)
            app.router.add_route(method, base + path, wrapped, name=WRITE_ROUTE_PREFIX + operation)
            if operation != "renameTable" or self.catalog.supports_rename:
                advertised.append((method, "/v1/{prefix}/" + path))
        self.endpoints = advertised
        return advertised

    def _handler(self, attribute: str) -> Handler:
        """The handler named ``attribute`` in :data:`ROUTES`, of whichever route object has it."""
        for routes in self.handlers:
            handler: Handler | None = getattr(routes, attribute, None)
            if handler is not None:
                return handler
        raise AttributeError(f"no write handler {attribute!r}")

    def _wrap(self, handler: Handler, operation: str) -> Handler:
        """Map the write side's typed errors to the spec's answers, raised as ApiError for
        the planner's request middleware to answer and audit (successes audit inside the
        handler); storage failures and the unexpected pass on to the middleware, which
        answers them as it does every route's (503, 500)."""

        async def wrapped(request: web.Request) -> web.StreamResponse:
            try:
                return await handler(request)
            except (ApiError, web.HTTPException):
                raise
            except NamespaceNotEmptyError as e:
                error = ApiError(409, "NamespaceNotEmptyException", str(e))
            except ValidationError as e:
                error = ApiError(400, "BadRequestException", str(e))
            except NotFoundError as e:
                error = ApiError(404, _not_found_type(str(e)), str(e))
            except AlreadyExistsError as e:
                error = ApiError(409, "AlreadyExistsException", str(e))
            except CommitFailedError as e:
                error = ApiError(409, "CommitFailedException", str(e))
            except UnsupportedOperationError as e:
                error = ApiError(406, "UnsupportedOperationException", str(e))
            except CommitStateUnknownError as e:
                log.error("%s %s: %s", request.method, request.path, e)
                error = ApiError(500, "CommitStateUnknownException", str(e))
            raise error

        wrapped.__name__ = operation
        return wrapped

    async def _oauth(self, request: web.Request) -> web.StreamResponse:
        return await oauth_tokens(self.authority, request)


def _not_found_type(message: str) -> str:
    if message.startswith("namespace"):
        return "NoSuchNamespaceException"
    if message.startswith("table"):
        return "NoSuchTableException"
    return "NotFoundException"


def register_write_routes(
    app: web.Application,
    service: PlannerService,
    settings: RestCatalogSettings,
    authority: TokenAuthority,
) -> list[tuple[str, str]]:
    """The planner's one hook: serve the write routes on ``app`` unless disabled.

    Returns the endpoints to advertise (none when ``ICEFLOE_REST_WRITES=false``).
    """
    if not settings.writes:
        return []
    if service.refresher.trust_events:
        # The results topic vouches only for the coordinator's commits. REST commits made by
        # this replica are served at once, but those made through another replica publish no
        # event: without polling, this replica would never see them.
        log.info(
            "REST writes are enabled: tables are re-read every refresh interval even when "
            "the results topic is caught up (ICEFLOE_PLANNER_TRUST_EVENTS is ignored)"
        )
        service.refresher.trust_events = False
    routes = WriteRoutes(service, settings, authority)
    return routes.register(app, service.config.prefix)


def main(argv: list[str] | None = None) -> int:
    """``python -m icefloe.planner.write_routes openapi SPEC.yaml``: the write routes' OpenAPI document
    (what ``write_openapi.json`` holds; schemathesis fuzzes the server with it)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] != "openapi":
        print(
            "usage: python -m icefloe.planner.write_routes openapi REST_SPEC.yaml", file=sys.stderr
        )
        return 2
    import yaml  # type: ignore[import-untyped]  # a development tool, not a dependency

    from icefloe.planner.openapi import trim_openapi

    with open(args[1], encoding="utf-8") as f:
        spec = yaml.safe_load(f)
    document = trim_openapi(spec, WRITE_ENDPOINTS)
    document["info"]["title"] = (
        "icefloe REST catalog writes (Apache Iceberg REST Catalog API subset)"
    )
    print(json.dumps(document, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
