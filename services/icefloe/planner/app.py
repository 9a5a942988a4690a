"""The planner service: an Iceberg REST catalog (read side) with server-side scan planning.

Engines plan an Iceberg scan by reading the metadata file, the manifest list and many
manifests on every query. This service does that work once per manifest, keeps the decoded
manifests in memory (:mod:`icefloe.manifests.cache`) and answers the REST catalog's
``planTableScan`` with the files to read. The API follows the Iceberg REST OpenAPI document,
trimmed to what is implemented (served at ``/openapi.yaml``):

* ``GET /v1/config``: ``endpoints`` lists exactly the routes registered in the app (so routes
  other modules add appear too) and ``scan-planning-mode`` (PyIceberg's switch to
  server-side planning) is advertised as configured: a default, an override, or not at all;
  a table property of that name overrides it in loadTable's ``config``;
* namespaces (list, load, exists) and tables (list, load, exists);
* ``POST .../plan``: plans synchronously and answers ``completed``. The first page of
  file scan tasks comes inline; larger scans list ``plan-tasks`` tokens, each fetched with
  ``POST .../tasks``. Plan ids and tokens are signed descriptions of the plan
  (:mod:`icefloe.planner.tokens`), so any replica sharing the secret serves them; a task's
  residual is omitted when it is the request's filter. ``GET``/``DELETE .../plan/{plan-id}`` fetch and release a plan.
  Besides ``snapshot-id`` and the incremental ``start-snapshot-id``/``end-snapshot-id``,
  requests may use two documented extensions for time travel: ``ref`` (a branch or tag
  name) and ``as-of-timestamp-ms`` (the snapshot current at that time, from the log);
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
logger. Bad input never produces a 500: everything a client sends is validated before it
reaches planning, and planning itself reports bad input with typed exceptions.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Collection, Iterator
from pathlib import Path
from typing import Any

import pydantic
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from icefloe.catalog.records import Records, catalog_records
from icefloe.errors import (
    FileIOError,
    IcefloeError,
    InvalidFileError,
    NotFoundError,
    ValidationError,
)
from icefloe.expressions.json_form import parse_expression
from icefloe.io.fileio import parse_location
from icefloe.manifests.cache import ManifestCache
from icefloe.manifests.store import ManifestStore
from icefloe.planner.auth import (
    TokenAuthority,
    audit,
    auth_middleware,
    planner_token_principals,
    principal_of,
    write_operation,
)
from icefloe.planner.config import PlannerConfig
from icefloe.planner.delegation import AccessDelegation
from icefloe.planner.errors import ApiError, error_response
from icefloe.planner.idempotency import IDEMPOTENCY_LIFETIME
from icefloe.planner.load_result import SCAN_PLANNING_MODE, matches, table_config, table_etag
from icefloe.planner.memory import use_arrow_allocator
from icefloe.planner.openapi import ENDPOINTS, served_openapi, trim_openapi
from icefloe.planner.pages_ahead import PagesAhead
from icefloe.planner.plan_cancellations import SharedCancellations
from icefloe.planner.plans import PlanStore, StoredPlan
from icefloe.planner.refresher import TableCommittedFeed, TableRefresher, TableState
from icefloe.planner.tokens import (
    SECRET_ENV,
    SECRET_FILE_ENV,
    PlanTokens,
    SecretError,
    TokenError,
    load_secret,
    parse_plan_task,
)
from icefloe.planner.write_config import RestCatalogSettings
from icefloe.runtime.byte_budget import ByteBudget
from icefloe.runtime.http import ServiceHttp
from icefloe.runtime.logs import configure_logging, log_access
from icefloe.runtime.released_body import json_bytes_response
from icefloe.scan.planning import ScanPlan, plan_scan
from icefloe.scan.tasks_json import page_is_written, scan_tasks_wrapped
from icefloe.spec.metadata import TableMetadata
from icefloe.spec.model import describe_problems
from icefloe.table.catalog import Catalog, Namespace, TableIdentifier

log = logging.getLogger(__name__)

# Request bodies of the largest size (ICEFLOE_PLANNER_MAX_REQUEST_BYTES) held at once; small
# bodies (a selective filter is a few hundred bytes) share the same bytes by the thousand.
BODIES_IN_FLIGHT = 16

# Request bodies above this are parsed (JSON, validation, filter) in a worker thread.
OFFLOAD_BODY_BYTES = 32 << 10
# Pages of fewer tasks than this are written inline when asked for (a thread hop costs more
# than writing them) and never ahead of time.
INLINE_PAGE_TASKS = 16
# Pages written ahead of their fetch (icefloe.planner.pages_ahead), in all: a fixed part of
# the service's memory, whatever the number of held plans (a 5,000-task page is ~1.3 MiB).
PAGES_AHEAD_MAX_BYTES = 32 << 20

NAMESPACE_SEPARATOR = "\x1f"
OPENAPI_FILE = Path(__file__).with_name("openapi.json")


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------


def _bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequestException", message)


# ---------------------------------------------------------------------------------------------
# Requests
# ---------------------------------------------------------------------------------------------


class PlanRequest(BaseModel):
    """The planTableScan body (PlanTableScanRequest) plus the two time-travel extensions."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True, frozen=True)

    snapshot_id: StrictInt | None = Field(None, alias="snapshot-id")
    select: list[StrictStr] | None = None
    filter: Any = None
    min_rows_requested: StrictInt | None = Field(None, alias="min-rows-requested", ge=0)
    case_sensitive: StrictBool = Field(True, alias="case-sensitive")
    use_snapshot_schema: StrictBool = Field(False, alias="use-snapshot-schema")
    start_snapshot_id: StrictInt | None = Field(None, alias="start-snapshot-id")
    end_snapshot_id: StrictInt | None = Field(None, alias="end-snapshot-id")
    stats_fields: list[StrictStr] | None = Field(None, alias="stats-fields")
    ref: StrictStr | None = Field(None, min_length=1)
    as_of_timestamp_ms: StrictInt | None = Field(None, alias="as-of-timestamp-ms")


class FetchTasksRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True, frozen=True)

    plan_task: StrictStr = Field(..., alias="plan-task")


async def _json_body(request: web.Request, *, required: bool) -> dict[str, Any]:
    raw = await request.read()
    if not raw.strip():
        if required:
            raise _bad_request("the request needs a JSON object body")
        return {}
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise _bad_request(f"the request body is not valid JSON: {e}") from None
    except RecursionError:
        raise _bad_request("the request body is nested too deeply") from None
    if not isinstance(body, dict):
        raise _bad_request(f"the request body must be a JSON object, got {type(body).__name__}")
    return body


MAX_NAME_BYTES = 255  # a file name component on common filesystems and object stores


def _check_name(name: str, what: str) -> str:
    # Catalogs map names to storage paths: a name that is a path step of its own would
    # let a request reach outside the warehouse, and one longer than a path component
    # can be would fail in storage with a message naming the server's paths.
    if not name or name in (".", "..") or "/" in name or "\x00" in name:
        raise _bad_request(
            f"invalid {what} {name[:64]!r}: names must be non-empty, not '.' or '..', "
            "and contain no '/'"
        )
    if len(name.encode("utf-8")) > MAX_NAME_BYTES:
        raise _bad_request(
            f"invalid {what} {name[:32]!r}...: names are limited to {MAX_NAME_BYTES} bytes (UTF-8)"
        )
    return name


def parse_namespace(text: str) -> Namespace:
    """A namespace path parameter: levels separated by the unit separator (0x1F)."""
    if not text:
        raise _bad_request("the namespace is empty")
    return tuple(_check_name(p, "namespace level") for p in text.split(NAMESPACE_SEPARATOR))


def _table_identifier(request: web.Request) -> TableIdentifier:
    namespace = parse_namespace(request.match_info["namespace"])
    return TableIdentifier(namespace, _check_name(request.match_info["table"], "table name"))


# ---------------------------------------------------------------------------------------------
# Responses
# ---------------------------------------------------------------------------------------------


# The file-scan-tasks JSON is written by icefloe.scan.tasks_json, column by column from the plan's
# Arrow rows.


def metadata_json(metadata: TableMetadata, snapshots: str) -> dict[str, Any]:
    out = metadata.to_json()
    if snapshots == "refs":
        referenced = {ref.snapshot_id for ref in metadata.refs.values()}
        out["snapshots"] = [s for s in out["snapshots"] if s["snapshot-id"] in referenced]
    return out


# ---------------------------------------------------------------------------------------------
# Metrics
# ---------------------------------------------------------------------------------------------


class _StateCollector:
    """Cache, plan and table figures read at scrape time."""

    def __init__(self, service: PlannerService) -> None:
        self.service = service

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        s = self.service
        stats = s.cache.stats()
        for name, value, doc in (
            ("cache_hits", stats.hits, "manifest cache hits"),
            ("cache_misses", stats.misses, "manifest cache misses"),
            ("cache_evictions", stats.evictions, "manifests evicted from the cache"),
            ("cache_read_bytes", stats.bytes_read, "bytes of manifests and lists read"),
            ("plans_dropped_for_memory", s.plans.dropped_for_memory, "plans dropped for room"),
        ):
            counter = CounterMetricFamily(f"icefloe_planner_{name}", doc)
            counter.add_metric([], value)
            yield counter
        for name, value, doc in (
            ("cache_bytes", stats.bytes, "bytes held by the manifest cache"),
            ("cache_max_bytes", stats.max_bytes, "manifest cache budget"),
            ("cache_entries", stats.entries, "manifest lists and manifests cached"),
            ("plans", len(s.plans), "plans held for plan-task fetches"),
            ("plan_bytes", s.plans.bytes, "bytes held plans keep outside the cache"),
            ("plan_pinned_bytes", s.plans.pinned_bytes, "manifest bytes held plans pin"),
            ("memory_bytes", stats.held_bytes, "decoded manifests in memory: cache + plans"),
            ("pages_ahead_bytes", s.ahead.nbytes, "bytes of plan pages written ahead of fetches"),
            ("tables", len(s.refresher.tables), "tables held in memory"),
        ):
            gauge = GaugeMetricFamily(f"icefloe_planner_{name}", doc)
            gauge.add_metric([], value)
            yield gauge
        reloads = CounterMetricFamily(
            "icefloe_planner_table_reloads", "table metadata refreshes", labels=["reason"]
        )
        for reason, count in s.refresher.reloads.items():
            reloads.add_metric([reason], count)
        yield reloads


# ---------------------------------------------------------------------------------------------
# The service
# ---------------------------------------------------------------------------------------------

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


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
        self._private_roots = _private_roots([catalog.properties.get("warehouse", "")])
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
        # Planning threads hold the GIL between Arrow kernels: a few at a time keep the
        # event loop (and /healthz) responsive; more would only queue for the GIL.
        self._cpu_slots = asyncio.Semaphore(config.planning_concurrency)
        # Plan and page requests past their body are admitted a few at a time: the event
        # loop runs each one's parsing, token and small plans itself, and a /healthz probe
        # waits behind every handler step queued before it. Queued requests cost nothing.
        self._admission = asyncio.Semaphore(2 * config.planning_concurrency)
        # Request bodies in memory at once: the body limit for each of a few dozen requests.
        self._bodies = ByteBudget(BODIES_IN_FLIGHT * config.max_request_bytes)
        # One page ahead per plan, as many plans at once as pages are written at once.
        self.ahead = PagesAhead(config.planning_concurrency, PAGES_AHEAD_MAX_BYTES)
        self._serving: set[tuple[str, int]] = set()  # pages being written for a fetch
        self.wall_clock = wall_clock
        self.consumer: TableCommittedFeed | None = None
        if config.brokers:
            self.consumer = TableCommittedFeed(
                self.refresher, config.results_topic, config.kafka_options()
            )
        self.registry = registry or CollectorRegistry()
        self._requests = Counter(
            "icefloe_planner_requests",
            "REST requests by route, method and status",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self._latency = Histogram(
            "icefloe_planner_request_seconds",
            "REST request latency by route",
            ["route"],
            registry=self.registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self._planned = Counter(
            "icefloe_planner_planned_files",
            "data files in planned scans, and files pruned by partition and by metrics",
            ["outcome"],
            registry=self.registry,
        )
        self.registry.register(_StateCollector(self))
        self._openapi: dict[str, Any] | None = None
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
        self._private_roots = _private_roots(
            [self.catalog.properties.get("warehouse", ""), *rest.allowed_location_list()]
        )
        token = self.config.token.get_secret_value() if self.config.token is not None else None
        authority = TokenAuthority(
            rest, extra=planner_token_principals(token, self.config.token_scope, rest)
        )
        # The token check runs inside the request middleware, so refused requests are
        # answered, counted, access-logged and (writes) audited like every other.
        app = web.Application(
            middlewares=[self._middleware, auth_middleware(authority)],
            client_max_size=self.config.max_request_bytes,
        )
        base = f"/v1/{self.config.prefix}/" if self.config.prefix else "/v1/"
        ns = base + "namespaces/{namespace}"
        table = ns + "/tables/{table}"
        r = app.router
        r.add_get("/v1/config", self._config, allow_head=False)
        r.add_get(base + "namespaces", self._list_namespaces, allow_head=False)
        r.add_get(ns, self._load_namespace, allow_head=False)
        r.add_route("HEAD", ns, self._namespace_exists)
        r.add_get(ns + "/tables", self._list_tables, allow_head=False)
        r.add_get(table, self._load_table, allow_head=False)
        r.add_route("HEAD", table, self._table_exists)
        r.add_post(table + "/plan", self._plan)
        r.add_get(table + "/plan/{plan_id}", self._fetch_plan, allow_head=False)
        r.add_delete(table + "/plan/{plan_id}", self._cancel_plan)
        r.add_post(table + "/tasks", self._fetch_tasks)
        self.delegation = AccessDelegation(rest, self.catalog.properties)
        self.delegation.register(app, base, self._metadata_at)
        from icefloe.planner.write_routes import register_write_routes

        self.write_endpoints = register_write_routes(app, self, rest, authority)
        r.add_get("/openapi.yaml", self._openapi_document, allow_head=False)
        r.add_get("/openapi.json", self._openapi_document, allow_head=False)
        health = ServiceHttp(self.registry, ready=lambda: self.ready)
        for route in health.app().router.routes():
            if route.method != "HEAD" and route.resource is not None:
                r.add_route(route.method, route.resource.canonical, route.handler)
        return app

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.perf_counter()
        resource = request.match_info.route.resource
        route = resource.canonical if resource is not None else "unmatched"
        head = request.method == "HEAD"
        error: ApiError | None = None
        try:
            if (request.content_length or 0) > self.config.max_request_bytes:
                # Refused before a byte of it is read.
                raise web.HTTPRequestEntityTooLarge(
                    max_size=self.config.max_request_bytes,
                    actual_size=request.content_length or 0,
                )
            if request.body_exists:
                # Bodies waiting for admission are bounded too (see icefloe.runtime.byte_budget).
                size = request.content_length or self.config.max_request_bytes
                async with self._bodies.reserve(size):
                    response = await handler(request)
            else:
                response = await handler(request)
        except ApiError as e:
            error = e
        except web.HTTPException as e:
            error = self._http_error(request, e)
        except ValidationError as e:
            error = ApiError(400, "BadRequestException", str(e))
        except NotFoundError as e:
            error = ApiError(404, "NotFoundException", str(e))
        except RecursionError:
            # Only a client's filter nests: one within MAX_FILTER_DEPTH that still met the
            # interpreter's limit somewhere in planning is the client's to flatten too.
            log.warning(
                "%s %s: the request nested too deeply to plan", request.method, request.path
            )
            error = _bad_request(_TOO_DEEP)
        except InvalidFileError as e:
            # Logged in full; the client is not told the server's file locations.
            log.error("%s %s: %s", request.method, request.path, e)
            error = ApiError(
                500, "InvalidFileException", "a table file is invalid; see the planner's log"
            )
        except FileIOError as e:
            log.error("%s %s: storage failed: %s", request.method, request.path, e)
            error = ApiError(
                503,
                "ServiceUnavailableException",
                "table storage is unavailable; retry later (details in the planner's log)",
            )
        except IcefloeError as e:
            log.error("%s %s: %s", request.method, request.path, e)
            error = ApiError(500, "InternalServerError", "internal error; see the planner's log")
        except Exception:
            log.exception("%s %s failed", request.method, request.path)
            error = ApiError(500, "InternalServerError", "internal error; see the planner's log")
        if error is not None:
            message = self._redact(error.message)
            response = error_response(error.code, error.error_type, message, head=head)
            operation = write_operation(request)
            if operation is not None:
                audit(
                    principal_of(request),
                    operation,
                    status=error.code,
                    path=request.path[:256],
                    error=f"{error.error_type}: {message}",
                )
        elapsed = time.perf_counter() - started
        self._requests.labels(route, request.method, str(response.status)).inc()
        self._latency.labels(route).observe(elapsed)
        if self.config.access_log:
            log_access(request, response.status, elapsed, response.content_length)
        return response

    def _redact(self, message: str) -> str:
        """The message with the server's warehouse location replaced by ``<warehouse>``."""
        for root in self._private_roots:
            if root in message:
                message = message.replace(root, "<warehouse>")
        return message

    def _http_error(self, request: web.Request, e: web.HTTPException) -> ApiError:
        if e.status == 405 and request.path.startswith("/v1/"):
            return ApiError(
                406,
                "UnsupportedOperationException",
                f"{request.method} {request.path[:200]} is not supported by this server; "
                "GET /v1/config lists the supported endpoints",
            )
        if e.status == 413:
            return ApiError(
                413,
                "RequestEntityTooLargeException",
                f"the request body exceeds {self.config.max_request_bytes} bytes "
                "(ICEFLOE_PLANNER_MAX_REQUEST_BYTES); send a smaller request",
            )
        kind = "NotFoundException" if e.status == 404 else "HttpException"
        return ApiError(e.status, kind, e.reason)

    # -- config and documents -------------------------------------------------------------

    def _planning_mode_config(self) -> dict[str, str]:
        mode = self.config.scan_planning_mode
        return {} if mode == "none" else {SCAN_PLANNING_MODE: mode}

    async def _config(self, request: web.Request) -> web.Response:
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
            raise self._no_namespace(parent)
        namespaces = await self.catalog.list_namespaces(parent)
        return web.json_response({"namespaces": [list(n) for n in namespaces]})

    @staticmethod
    def _no_namespace(namespace: Namespace) -> ApiError:
        return ApiError(
            404, "NoSuchNamespaceException", f"namespace {'.'.join(namespace)!r} does not exist"
        )

    async def _load_namespace(self, request: web.Request) -> web.Response:
        namespace = parse_namespace(request.match_info["namespace"])
        try:
            properties = await self.catalog.load_namespace_properties(namespace)
        except NotFoundError:
            raise self._no_namespace(namespace) from None
        return web.json_response({"namespace": list(namespace), "properties": properties})

    async def _namespace_exists(self, request: web.Request) -> web.Response:
        namespace = parse_namespace(request.match_info["namespace"])
        if not await self.catalog.namespace_exists(namespace):
            raise self._no_namespace(namespace)
        return web.Response(status=204)

    async def _list_tables(self, request: web.Request) -> web.Response:
        namespace = parse_namespace(request.match_info["namespace"])
        try:
            tables = await self.catalog.list_tables(namespace)
        except NotFoundError:
            raise self._no_namespace(namespace) from None
        return web.json_response(
            {"identifiers": [{"namespace": list(t.namespace), "name": t.name} for t in tables]}
        )

    # -- tables ---------------------------------------------------------------------------

    async def _table(self, ident: TableIdentifier, *, tell_namespace: bool = True) -> TableState:
        """The table's state; 404 ``NoSuchTableException``, or ``NoSuchNamespaceException``
        where the operation's spec allows it (``tell_namespace``) and that is the reason."""
        try:
            return await self.refresher.get(ident)
        except NotFoundError:
            exists = await self.catalog.namespace_exists(ident.namespace)
            if not exists and tell_namespace:
                raise self._no_namespace(ident.namespace) from None
            reason = "" if exists else f" (namespace {ident.namespace_name!r} does not exist)"
            raise ApiError(
                404, "NoSuchTableException", f"table {ident} does not exist{reason}"
            ) from None

    async def _load_table(self, request: web.Request) -> web.Response:
        ident = _table_identifier(request)
        snapshots = request.query.get("snapshots", "all")
        if snapshots not in ("all", "refs"):
            raise _bad_request(f"snapshots must be 'all' or 'refs', got {snapshots!r}")
        state = await self._table(ident, tell_namespace=False)
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

    async def _metadata_at(self, namespace: str, table: str) -> TableMetadata:
        """A table's metadata from its path segments (the delegation routes' lookup)."""
        ident = TableIdentifier(parse_namespace(namespace), _check_name(table, "table name"))
        return (await self._table(ident, tell_namespace=False)).metadata

    def _table_config(self, metadata: TableMetadata) -> dict[str, str]:
        """The planner's scan-planning-mode unless the table's property sets its own."""
        return table_config(metadata.properties, self.config.scan_planning_mode)

    async def _table_exists(self, request: web.Request) -> web.Response:
        await self._table(_table_identifier(request), tell_namespace=False)
        return web.Response(status=204)

    # -- planning -------------------------------------------------------------------------

    async def _plan(self, request: web.Request) -> web.Response:
        ident = _table_identifier(request)
        raw = await request.read()
        credentials = None
        if self.delegation.vends_to(request):
            state = await self._table(ident)
            credentials = await self.delegation.plan_credentials(state.metadata)
        async with self._admission:
            with self.cache.holding():  # the manifests it reads, until it is answered
                return await self._plan_admitted(ident, raw, credentials)

    async def _plan_admitted(
        self, ident: TableIdentifier, raw: bytes, credentials: list[dict[str, Any]] | None = None
    ) -> web.Response:
        if len(raw) > OFFLOAD_BODY_BYTES:
            # Parsing a big body holds the interpreter lock for seconds in all: it takes a
            # planning slot, so no more threads than those contend with the event loop.
            async with self._cpu_slots:
                req, row_filter = await asyncio.to_thread(_parse_plan_request, raw)
        else:
            req, row_filter = _parse_plan_request(raw)
        plan = await self._make_plan(ident, req, row_filter)
        snapshot_id = plan.snapshot.snapshot_id if plan.snapshot is not None else None
        issue = functools.partial(
            self.tokens.issue,
            table=_table_key(ident),
            request=req.model_dump(by_alias=True, exclude_none=True),
            snapshot_id=snapshot_id,
            page_size=self.config.tasks_per_page,
            expires_at=self.wall_clock() + self.config.plan_ttl_ms / 1000.0,
        )
        # A token embeds the request (JSON, compressed, signed): for a big one, off the loop.
        if len(raw) > OFFLOAD_BODY_BYTES:
            async with self._cpu_slots:
                identity = await asyncio.to_thread(issue)
        else:
            identity = issue()
        stored = self.plans.add(
            ident, plan, identity.page_size, plan_id=identity.plan_id, key=identity.key
        )
        return _json_bytes_response(
            await self._completed(stored, with_id=True, credentials=credentials)
        )

    async def _make_plan(
        self,
        ident: TableIdentifier,
        req: PlanRequest,
        row_filter: Any,
        *,
        pinned_snapshot: int | None = None,
    ) -> ScanPlan:
        state = await self._table(ident)
        async with self._cpu_slots:
            return await self._plan_now(state, req, row_filter, pinned_snapshot)

    async def _plan_now(
        self,
        state: TableState,
        req: PlanRequest,
        row_filter: Any,
        pinned_snapshot: int | None,
    ) -> ScanPlan:
        incremental = req.start_snapshot_id is not None or req.end_snapshot_id is not None
        snapshot_id, ref, as_of = req.snapshot_id, req.ref, req.as_of_timestamp_ms
        if pinned_snapshot is not None and not incremental:
            snapshot_id, ref, as_of = pinned_snapshot, None, None
        try:
            plan = await plan_scan(
                state.metadata,
                self.cache,
                snapshot_id=snapshot_id,
                ref=ref,
                as_of_ms=as_of,
                start_snapshot_id=req.start_snapshot_id,
                end_snapshot_id=req.end_snapshot_id,
                row_filter=row_filter,
                case_sensitive=req.case_sensitive,
                select=req.select,
                use_snapshot_schema=req.use_snapshot_schema,
                stats_fields=req.stats_fields,
            )
        except NotFoundError as e:
            raise ApiError(
                404, "NoSuchSnapshotException", f"table {state.identifier}: {e}"
            ) from None
        counts = plan.metrics.data_files
        self._planned.labels("selected").inc(counts.selected)
        self._planned.labels("pruned-by-partition").inc(counts.by_partition)
        self._planned.labels("pruned-by-metrics").inc(counts.by_metrics)
        return plan

    async def _completed(
        self,
        stored: StoredPlan,
        *,
        with_id: bool = False,
        credentials: list[dict[str, Any]] | None = None,
    ) -> bytes:
        """The completed-plan body: status, the first page's tasks, the other pages' tokens
        (and the plan-scoped storage credentials the client asked for)."""
        head: dict[str, Any] = {"status": "completed"}
        if with_id:
            head["plan-id"] = stored.plan_id
        if credentials is not None:
            head["storage-credentials"] = credentials
        tokens = stored.tokens()
        if tokens:
            head["plan-tasks"] = tokens
        prefix = json.dumps(head).encode("utf-8")[:-1] + b","
        body = await self._page(stored.plan, 0, stored.page_size, prefix, b"}")
        self._write_ahead(stored, 1)
        return body

    def _inline(self, plan: ScanPlan, start: int, stop: int) -> bool:
        """Whether a page is cheaper to write on the event loop than in a thread: a handful
        of tasks, or slices of texts already written."""
        return min(stop, len(plan)) - start <= INLINE_PAGE_TASKS or page_is_written(
            plan, start, stop
        )

    async def _page(
        self, plan: ScanPlan, start: int, stop: int, prefix: bytes, suffix: bytes
    ) -> bytes:
        """``prefix``, the members of a ScanTasks object (JSON text), ``suffix``: joined in
        one copy (a page is megabytes), written in a worker thread unless :meth:`_inline`."""
        if self._inline(plan, start, stop):
            return scan_tasks_wrapped(plan, start, stop, prefix, suffix)
        async with self._cpu_slots:
            return await asyncio.to_thread(scan_tasks_wrapped, plan, start, stop, prefix, suffix)

    def _write_ahead(self, stored: StoredPlan, page: int) -> None:
        """Start writing ``page`` of a plan whose previous page was just served, unless it is
        served, being written for a fetch, or cheap enough to write when asked for."""
        start = page * stored.page_size
        stop = start + stored.page_size
        if (
            page >= stored.pages
            or page in stored.fetched
            or (stored.key, page) in self._serving
            or self._inline(stored.plan, start, stop)
        ):
            return
        plan = stored.plan
        self.ahead.start(stored.key, plan, page, lambda: self._page(plan, start, stop, b"{", b"}"))

    async def _resolve(
        self, ident: TableIdentifier, plan_id: str, error_type: str, what: str
    ) -> StoredPlan:
        """The plan a plan id names: held here, or planned again from its signed request."""

        def missing(reason: str) -> ApiError:
            return ApiError(404, error_type, f"{what} of table {ident} does not exist: {reason}")

        try:
            identity = self.tokens.open(plan_id, self.wall_clock())
        except TokenError as e:
            raise missing(str(e)) from None
        if identity.table != _table_key(ident):
            raise missing("it belongs to another table")
        if self.plans.cancelled(identity.key) or await self.cancellations.cancelled(identity.key):
            raise missing("the plan was cancelled")
        stored = self.plans.get(identity.key, ident)
        if stored is not None:
            return stored
        if identity.request is None:
            raise missing(
                "the plan was made by another replica (or dropped) and its request was too "
                "large to embed in the token; plan the scan again"
            )
        try:
            async with self._cpu_slots:
                req, row_filter = await asyncio.to_thread(_reparse_plan_request, identity.request)
        except ApiError:
            raise missing("the plan's request no longer validates; plan the scan again") from None
        plan = await self._make_plan(ident, req, row_filter, pinned_snapshot=identity.snapshot_id)
        return self.plans.add(
            ident, plan, identity.page_size, plan_id=identity.plan_id, key=identity.key
        )

    async def _fetch_plan(self, request: web.Request) -> web.Response:
        ident = _table_identifier(request)
        async with self._admission:
            with self.cache.holding():
                stored = await self._resolve(
                    ident, request.match_info["plan_id"], "NoSuchPlanIdException", "the plan"
                )
                return _json_bytes_response(await self._completed(stored))

    async def _cancel_plan(self, request: web.Request) -> web.Response:
        ident = _table_identifier(request)
        plan_id = request.match_info["plan_id"]
        try:
            identity = self.tokens.open(plan_id, self.wall_clock())
        except TokenError as e:
            raise ApiError(
                404, "NoSuchPlanIdException", f"the plan of table {ident} does not exist: {e}"
            ) from None
        if identity.table != _table_key(ident) or self.plans.cancelled(identity.key):
            raise ApiError(
                404, "NoSuchPlanIdException", f"the plan of table {ident} does not exist"
            )
        if await self.cancellations.cancelled(identity.key):
            raise ApiError(
                404, "NoSuchPlanIdException", f"the plan of table {ident} does not exist"
            )
        self.plans.remove(identity.key, ident)
        self.plans.cancel(identity.key)
        self.ahead.drop(identity.key)
        await self.cancellations.cancel(identity.key)
        return web.Response(status=204)

    async def _fetch_tasks(self, request: web.Request) -> web.Response:
        ident = _table_identifier(request)
        body = await _json_body(request, required=True)
        async with self._admission:
            with self.cache.holding():
                return await self._fetch_tasks_admitted(ident, body)

    async def _fetch_tasks_admitted(
        self, ident: TableIdentifier, body: dict[str, Any]
    ) -> web.Response:
        try:
            req = FetchTasksRequest.model_validate(body)
        except pydantic.ValidationError as e:
            raise _bad_request(
                f"invalid fetch-tasks request: {describe_problems(e, limit=5)}"
            ) from None
        what = "the plan task"
        try:
            plan_id, page = parse_plan_task(req.plan_task)
        except TokenError as e:
            raise ApiError(
                404, "NoSuchPlanTaskException", f"{what} of table {ident} does not exist: {e}"
            ) from None
        stored = await self._resolve(ident, plan_id, "NoSuchPlanTaskException", what)
        if not 1 <= page < stored.pages:
            raise ApiError(
                404,
                "NoSuchPlanTaskException",
                f"{what} of table {ident} does not exist: the plan has pages 1 to "
                f"{stored.pages - 1} besides the first",
            )
        serving = (stored.key, page)
        self._serving.add(serving)
        try:
            body_out = await self.ahead.take(stored.key, stored.plan, page)
            if body_out is None:
                start = page * stored.page_size
                stop = start + stored.page_size
                body_out = await self._page(stored.plan, start, stop, b"{", b"}")
        finally:
            self._serving.discard(serving)
        self.plans.page_fetched(stored, page)
        self._write_ahead(stored, page + 1)
        return _json_bytes_response(body_out)


def _records_or_none(catalog: Catalog) -> Records | None:
    """The catalog's shared records, or None (a catalog with nowhere to keep them)."""
    try:
        return catalog_records(catalog)
    except ValidationError as e:
        log.warning("plan cancellations are not shared between replicas: %s", e)
        return None


def _private_roots(locations: Collection[str]) -> list[str]:
    """The spellings of the server's warehouse (and allowed) locations that error messages
    must not show, longest first (``file:///wh`` before ``/wh``)."""
    roots: set[str] = set()
    for location in locations:
        roots.add(location.rstrip("/"))
        try:
            scheme, bucket, path = parse_location(location)
        except ValidationError:
            continue
        local = path.rstrip("/")
        if scheme == "file" and bucket is None and local:
            roots |= {local, os.path.realpath(local), f"file://{local}"}
    return sorted((r for r in roots if len(r) > 1), key=len, reverse=True)


def _table_key(ident: TableIdentifier) -> str:
    return NAMESPACE_SEPARATOR.join((*ident.namespace, ident.name))


def _parse_plan_request(raw: bytes) -> tuple[PlanRequest, Any]:
    """Validate a planTableScan body and parse its filter (CPU work for big filters: called
    in a worker thread for large bodies)."""
    if not raw.strip():
        body: Any = {}
    else:
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise _bad_request(f"the request body is not valid JSON: {e}") from None
        except RecursionError:
            raise _bad_request(_TOO_DEEP) from None
    if not isinstance(body, dict):
        raise _bad_request(f"the request body must be a JSON object, got {type(body).__name__}")
    try:
        req = PlanRequest.model_validate(body)
    except pydantic.ValidationError as e:
        raise _bad_request(f"invalid plan request: {describe_problems(e, limit=5)}") from None
    if req.snapshot_id is not None and (
        req.start_snapshot_id is not None or req.end_snapshot_id is not None
    ):
        raise _bad_request(
            "snapshot-id (point in time) and start/end-snapshot-id (incremental) exclude each other"
        )
    if req.start_snapshot_id is not None and req.end_snapshot_id is None:
        raise _bad_request("end-snapshot-id is required with start-snapshot-id")
    if req.filter is not None:
        depth = json_depth(req.filter, MAX_FILTER_DEPTH)
        if depth > MAX_FILTER_DEPTH:
            raise _bad_request(
                f"the filter nests more than {MAX_FILTER_DEPTH} levels deep (the limit, "
                "MAX_FILTER_DEPTH); flatten it, e.g. a long chain of 'or' equalities into "
                "one 'in'"
            )
    try:
        row_filter = None if req.filter is None else parse_expression(req.filter)
    except RecursionError:
        raise _bad_request(_TOO_DEEP) from None
    return req, row_filter


# How deep a plan request's filter may nest (JSON objects and arrays within the filter). An
# 800-deep AND chain, as a client folding 800 conditions left to right sends, is planned;
# deeper ones are refused with a 400 naming this limit rather than meet Python's recursion
# limit (about 1000 frames) somewhere between parsing and answering.
MAX_FILTER_DEPTH = 900
_TOO_DEEP = (
    f"the request body is nested too deeply: a filter may nest at most {MAX_FILTER_DEPTH} "
    "levels (MAX_FILTER_DEPTH)"
)


def json_depth(value: Any, limit: int) -> int:
    """How deep a decoded JSON value nests (a scalar is 0), counted without recursion and
    only to just past ``limit``."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        depth += 1
        deepest = max(deepest, depth)
        if depth > limit:
            return depth
        stack.extend((c, depth) for c in children if isinstance(c, dict | list))
    return deepest


def _reparse_plan_request(request: Any) -> tuple[PlanRequest, Any]:
    """A plan request embedded in a token, validated and parsed again (a worker thread's
    work: an embedded request may be a highly compressible megabyte)."""
    return _parse_plan_request(json.dumps(request).encode("utf-8"))


def _json_bytes_response(body: bytes) -> web.Response:
    # Released once written: an idle keep-alive connection would hold its last page.
    return json_bytes_response(body)


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


# ---------------------------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------------------------


# The cyclic collector's first-generation threshold while serving. Each plan request makes
# a few thousand short-lived objects, so at the default (700) a collection runs every few
# requests and, every so often, a full one walks every long-lived object (cached manifest
# lists, compiled filters, held plans), pausing the event loop for tens of milliseconds
# under load (measured as /healthz p99 at 150 clients). The planner's data lives in Arrow
# buffers, not in reference cycles, so collecting less often costs little memory.
GC_THRESHOLD = (50_000, 20, 20)


# How long a thread holding the interpreter lock runs before one waiting for it may ask it
# to let go (Python's default: 5 ms). Planning threads run Python between Arrow kernels; the
# event loop gives the lock up at every wait for sockets and asks for it back each time, so
# one /healthz answer (accept, read, answer, close: several loop turns) waited up to 5 ms a
# turn behind them: measured p99 56-71 ms under 8 hostile plans with the loop itself busy
# under 2 ms per probe. At 0.5 ms a turn waits a tenth of that; the planning threads pay a
# few more hand-overs (microseconds each).
SWITCH_INTERVAL_S = 0.0005


def _tune_gc() -> None:
    """Move what startup made out of the collector's sight and collect less often; let the
    event loop have the interpreter lock back sooner (:data:`SWITCH_INTERVAL_S`)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLD)
    sys.setswitchinterval(SWITCH_INTERVAL_S)


def _warm_up() -> None:
    """Pay, before the port opens, what a process's first plan would pay on a request.

    Arrow turns a Python scalar argument of a compute function (``status != 2``) into an
    Arrow scalar through its pandas shim, which imports pandas the first time: 0.7-0.9 s
    on a loaded 2-core machine, measured as the first selective plan of a fresh worker
    (716-865 ms; 38 ms once this ran). A worker that started cold held every request on its
    connections for that long (/healthz p99 over a second with 2 workers)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    pc.not_equal(pa.array([0], pa.int32()), 0)


async def serve(
    config: PlannerConfig, *, reuse_port: bool = False, parent_pid: int | None = None
) -> None:
    """Run until SIGINT or SIGTERM (or, for a worker, until its supervisor is gone)."""

    use_arrow_allocator(config.arrow_allocator)
    service = PlannerService(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)

    async def orphaned() -> None:
        # A worker whose supervisor was killed (SIGKILL forwards nothing) must not linger.
        while not stop.is_set():
            await asyncio.sleep(1.0)
            if os.getppid() != parent_pid:
                log.warning("the supervising process is gone; stopping this worker")
                stop.set()

    watchdog = asyncio.create_task(orphaned()) if parent_pid is not None else None
    _warm_up()
    await service.start(reuse_port=reuse_port)
    _tune_gc()
    try:
        await stop.wait()
    finally:
        if watchdog is not None:
            watchdog.cancel()
        await service.stop()
        await service.catalog.close()


def _worker(overrides: dict[str, Any], parent_pid: int) -> None:
    """One of ``workers`` processes: the same settings, the port shared (SO_REUSEPORT)."""
    config = PlannerConfig.load(overrides)
    configure_logging(config.log_level, config.log_format)
    asyncio.run(serve(config, reuse_port=True, parent_pid=parent_pid))


def serve_workers(config: PlannerConfig, overrides: dict[str, Any]) -> int:
    """Run ``config.workers`` planner processes on one port (the kernel spreads connections).

    Python plans on one core per process; processes share the decoded manifests through the
    memory-mapped disk cache (``cache_dir``) and serve each other's plan tokens through the
    shared plan secret (a random one for this host when none is configured).
    """
    import multiprocessing
    import secrets as _secrets

    if config.port == 0:
        raise ValidationError("ICEFLOE_PLANNER_WORKERS > 1 needs a fixed ICEFLOE_PLANNER_PORT")
    if not config.plan_secret and not config.plan_secret_file:
        os.environ["ICEFLOE_PLANNER_PLAN_SECRET"] = _secrets.token_hex(32)
    if not config.cache_dir:
        log.warning("ICEFLOE_PLANNER_CACHE_DIR is unset: each worker decodes manifests itself")
    context = multiprocessing.get_context("spawn")
    child = {**overrides, "workers": 1}
    processes = [
        context.Process(target=_worker, args=(child, os.getpid())) for _ in range(config.workers)
    ]
    for process in processes:
        process.start()

    def forward(signum: int, frame: Any) -> None:
        for process in processes:
            if process.is_alive() and process.pid is not None:
                os.kill(process.pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    for process in processes:
        process.join()
    return max((p.exitcode or 0) for p in processes)


async def run_from_args(args: Any) -> int:
    from icefloe.planner.config import overrides_from_args

    overrides = overrides_from_args(args)
    config = PlannerConfig.load(overrides)
    configure_logging(config.log_level, config.log_format)
    if config.workers > 1:
        # The parent only supervises: blocking its (idle) loop on the main thread lets it
        # install the signal handlers that forward SIGTERM to the workers.
        return serve_workers(config, overrides)
    await serve(config)
    return 0


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
