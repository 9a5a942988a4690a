"""The planner service: an Iceberg REST catalog (read side) with server-side scan planning.

Engines plan an Iceberg scan by reading the metadata file, the manifest list and many
manifests on every query. This service does that work once per manifest, keeps the decoded
manifests in memory (:mod:`icefloe.manifests.cache`) and answers the REST catalog's
``planTableScan`` with the files to read. The API follows the Iceberg REST OpenAPI document,
trimmed to what is implemented (served at ``/openapi.yaml``):

* the catalog's read routes, ``GET /v1/config``, namespaces and tables
  (:mod:`icefloe.planner.catalog_routes`);
* scan planning, ``POST .../plan``, ``GET``/``DELETE .../plan/{plan-id}`` and
  ``POST .../tasks`` (:mod:`icefloe.planner.plan_routes`). Besides ``snapshot-id`` and the
  incremental ``start-snapshot-id``/``end-snapshot-id``, requests may use two documented
  extensions for time travel: ``ref`` (a branch or tag name) and ``as-of-timestamp-ms`` (the
  snapshot current at that time, from the log) (:mod:`icefloe.planner.plan_request`);
* vended credentials and remote signing (:mod:`icefloe.planner.delegation`), the catalog's
  write routes (:mod:`icefloe.planner.write_routes`);
* ``/healthz``, ``/readyz`` and Prometheus ``/metrics``.

Errors use the spec's error model (``{"error": {"message", "type", "code"}}``), in the types
the REST spec gives each operation: 400 for malformed requests, names over 255 bytes and
filters naming unknown columns, 404 for unknown namespaces, tables, snapshots, plans and plan
tasks (forged or malformed tokens included; loadTable and tableExists answer
``NoSuchTableException`` also when the namespace is unknown, as the spec says and as Spark's
metadata tables need: ``ns.t.files`` is first looked up as table ``files`` in namespace
``ns.t``), 406 for unsupported operations, 413 for bodies over ``max_request_bytes`` (refused
before they are read when they announce their length), 401 for a missing or unknown bearer
token and 403 for a read token on a write route (:mod:`icefloe.planner.auth`); storage
failures are 503. No message names the server's warehouse (it reads ``<warehouse>``; the log
has the paths). Every request, refused or not, is logged as one JSON line on the
``icefloe.access`` logger, and every refused or failed write also on the ``icefloe.audit``
logger (:mod:`icefloe.planner.middleware`). Bad input never produces a 500: everything a
client sends is validated before it reaches planning, and planning itself reports bad input
with typed exceptions.

This module wires them: :class:`PlannerService` builds the core objects (catalog, manifest
cache, table refresher, plan store) and the route objects over them, starts and stops the
background work, and builds the app; :mod:`icefloe.planner.serving` runs it in processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
import time
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CollectorRegistry

from icefloe.catalog.records import Records, catalog_records
from icefloe.errors import ValidationError
from icefloe.manifests.cache import ManifestCache
from icefloe.manifests.store import ManifestStore
from icefloe.planner.auth import TokenAuthority, auth_middleware, planner_token_principals
from icefloe.planner.catalog_routes import CatalogRoutes
from icefloe.planner.config import PlannerConfig
from icefloe.planner.delegation import AccessDelegation
from icefloe.planner.metrics import StateCollector
from icefloe.planner.middleware import RequestMiddleware, private_roots
from icefloe.planner.openapi import trim_openapi
from icefloe.planner.pages_ahead import PagesAhead
from icefloe.planner.plan_cancellations import SharedCancellations
from icefloe.planner.plan_routes import PlanRoutes
from icefloe.planner.plans import PlanStore
from icefloe.planner.refresher import TableCommittedFeed, TableRefresher
from icefloe.planner.shared_pages import SharedPages
from icefloe.planner.table_lookup import TableLookup
from icefloe.planner.tokens import SECRET_ENV, SECRET_FILE_ENV, PlanTokens, SecretError, load_secret
from icefloe.planner.write_config import RestCatalogSettings
from icefloe.runtime.http import ServiceHttp
from icefloe.table.catalog import Catalog

log = logging.getLogger(__name__)

# Pages written ahead of their fetch (icefloe.planner.pages_ahead), in all: a fixed part of
# the service's memory, whatever the number of held plans (a 5,000-task page is ~1.3 MiB).
PAGES_AHEAD_MAX_BYTES = 32 << 20


class PlannerService:
    """The REST planner over one catalog. ``start``/``stop`` run it; :meth:`app` for tests."""

    delegation: AccessDelegation  # vended credentials and remote signing, set by app()

    def __init__(
        self,
        config: PlannerConfig,
        catalog: Catalog | None = None,
        *,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        plan_secret: bytes | None = None,
        rest: RestCatalogSettings | None = None,
    ) -> None:
        self.config = config
        self.rest_settings = rest  # None: from ICEFLOE_REST_* (see icefloe.planner.write_routes)
        self.write_endpoints: list[tuple[str, str]] = []
        if catalog is None:
            from icefloe.catalog.uri import load_catalog

            catalog = load_catalog(config.catalog)
        self.catalog = catalog
        self.clock = clock
        store = (
            ManifestStore(config.cache_dir, config.cache_disk_max_bytes)
            if config.cache_dir
            else None
        )
        self.cache = ManifestCache(
            catalog.io,
            config.cache_max_bytes,
            load_concurrency=config.manifest_load_concurrency,
            store=store,
        )
        self.refresher = TableRefresher(
            catalog,
            refresh_interval_s=config.refresh_interval_s,
            idle_after_s=config.table_idle_ms / 1000.0,
            trust_events=config.trust_events and bool(config.brokers),
            trusted_refresh_interval_s=max(
                config.trusted_refresh_interval_ms, config.refresh_interval_ms
            )
            / 1000.0,
            clock=clock,
        )
        self.plans = PlanStore(
            config.plan_ttl_ms / 1000.0,
            config.max_plans,
            clock,
            min(config.plan_max_bytes, config.cache_max_bytes),
            memory=self.cache,
        )
        if plan_secret is None:
            given = config.plan_secret.get_secret_value() if config.plan_secret else None
            try:
                plan_secret, configured = load_secret(given, config.plan_secret_file)
            except SecretError as e:
                raise ValidationError(f"invalid planner settings: {e}") from None
            if not configured:
                log.warning(
                    "no %s or %s: plan-task tokens are valid on this replica only",
                    SECRET_ENV,
                    SECRET_FILE_ENV,
                )
        self.tokens = PlanTokens(plan_secret)
        self.cancellations = SharedCancellations(
            _records_or_none(self.catalog), config.plan_ttl_ms / 1000.0
        )
        # One page ahead per plan, as many plans at once as pages are written at once,
        # shared with the other processes of the host through the disk cache.
        shared = SharedPages.beside(config.cache_dir, config.cache_disk_max_bytes)
        self.ahead = PagesAhead(config.planning_concurrency, PAGES_AHEAD_MAX_BYTES, shared)
        self.wall_clock = wall_clock
        self.consumer: TableCommittedFeed | None = None
        if config.brokers:
            self.consumer = TableCommittedFeed(
                self.refresher, config.results_topic, config.kafka_options()
            )
        self.registry = registry or CollectorRegistry()
        self.tables = TableLookup(catalog, self.refresher)
        self.middleware = RequestMiddleware(
            config, self.registry, private_roots([catalog.properties.get("warehouse", "")])
        )
        self.planning = PlanRoutes(
            config,
            self.tables,
            self.cache,
            self.plans,
            self.ahead,
            self.tokens,
            self.cancellations,
            self.registry,
            wall_clock,
        )
        self.registry.register(StateCollector(self.cache, self.plans, self.ahead, self.refresher))
        self._runner: web.AppRunner | None = None
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._started = False
        self.port = config.port

    # -- lifecycle ------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return self._started and (self.consumer is None or self.consumer.running)

    async def start_background(self) -> None:
        """Polling and (with brokers) the results consumer."""
        self._stop.clear()
        self._tasks.append(
            asyncio.create_task(self.refresher.run_polling(self._stop), name="planner-polling")
        )
        if self.consumer is not None:
            await self.consumer.start()
            self._tasks.append(
                asyncio.create_task(self.consumer.run(self._stop), name="planner-events")
            )
        self._started = True

    async def start(self, *, reuse_port: bool = False) -> None:
        await self.start_background()
        runner = web.AppRunner(self.app(), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.config.host, self.config.port, reuse_port=reuse_port)
        await site.start()
        self._runner = runner
        for address in runner.addresses:
            if isinstance(address, tuple) and len(address) >= 2:
                self.port = int(address[1])
                break
        log.info("planner serving on %s:%d", self.config.host, self.port)

    async def stop(self) -> None:
        self._stop.set()
        self._started = False
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        await self.ahead.close()
        if self.consumer is not None:
            await self.consumer.stop()
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    @property
    def url(self) -> str:
        host = self.config.host
        host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
        return f"http://{host}:{self.port}"

    # -- routing --------------------------------------------------------------------------

    def app(self) -> web.Application:
        rest = self.rest_settings or RestCatalogSettings.load()
        self.middleware.private_roots = private_roots(
            [self.catalog.properties.get("warehouse", ""), *rest.allowed_location_list()]
        )
        token = self.config.token.get_secret_value() if self.config.token is not None else None
        authority = TokenAuthority(
            rest, extra=planner_token_principals(token, self.config.token_scope, rest)
        )
        # The token check runs inside the request middleware, so refused requests are
        # answered, counted, access-logged and (writes) audited like every other.
        app = web.Application(
            middlewares=[self.middleware.middleware, auth_middleware(authority)],
            client_max_size=self.config.max_request_bytes,
        )
        base = f"/v1/{self.config.prefix}/" if self.config.prefix else "/v1/"
        table = base + "namespaces/{namespace}/tables/{table}"
        r = app.router
        self.delegation = AccessDelegation(rest, self.catalog.properties)
        catalog = CatalogRoutes(self.config, self.catalog, self.tables, self.delegation)
        catalog.register(r, base)
        self.planning.register(r, table, self.delegation)
        self.delegation.register(app, base, self.tables.metadata_at)
        from icefloe.planner.write_routes import register_write_routes

        self.write_endpoints = register_write_routes(app, self, rest, authority)
        catalog.write_endpoints = self.write_endpoints
        catalog.register_documents(r)
        health = ServiceHttp(self.registry, ready=lambda: self.ready)
        for route in health.app().router.routes():
            if route.method != "HEAD" and route.resource is not None:
                r.add_route(route.method, route.resource.canonical, route.handler)
        return app


def _records_or_none(catalog: Catalog) -> Records | None:
    """The catalog's shared records, or None (a catalog with nowhere to keep them)."""
    try:
        return catalog_records(catalog)
    except ValidationError as e:
        log.warning("plan cancellations are not shared between replicas: %s", e)
        return None


def main(argv: list[str] | None = None) -> int:
    """``python -m icefloe.planner.app openapi SPEC.yaml``: print the trimmed OpenAPI document."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] != "openapi":
        print("usage: python -m icefloe.planner.app openapi REST_SPEC.yaml", file=sys.stderr)
        return 2
    import yaml  # type: ignore[import-untyped]  # a development tool, not a dependency

    with open(args[1], encoding="utf-8") as f:
        spec = yaml.safe_load(f)
    print(json.dumps(trim_openapi(spec), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
