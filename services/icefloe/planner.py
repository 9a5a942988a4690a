"""The planner service: an Iceberg REST catalog (read side) with server-side scan planning.

Engines plan an Iceberg scan by reading the metadata file, the manifest list and many
manifests on every query. This service does that work once per manifest, keeps the decoded
manifests in memory (:mod:`icefloe.manifest_cache`) and answers the REST catalog's
``planTableScan`` with the files to read. The API follows the Iceberg REST OpenAPI document,
trimmed to what is implemented (served at ``/openapi.yaml``):

* ``GET /v1/config``: ``endpoints`` lists exactly the routes below and ``overrides`` sets
  ``scan-planning-mode=server`` (PyIceberg's switch to server-side planning);
* namespaces (list, load, exists) and tables (list, load, exists);
* ``POST .../plan``: plans synchronously and answers ``completed``. The first page of
  file scan tasks comes inline; larger scans list ``plan-tasks`` tokens, each fetched with
  ``POST .../tasks``. ``GET``/``DELETE .../plan/{plan-id}`` fetch and release a plan.
  Besides ``snapshot-id`` and the incremental ``start-snapshot-id``/``end-snapshot-id``,
  requests may use two documented extensions for time travel: ``ref`` (a branch or tag
  name) and ``as-of-timestamp-ms`` (the snapshot current at that time, from the log);
* ``/healthz``, ``/readyz`` and Prometheus ``/metrics``.

Errors use the spec's error model (``{"error": {"message", "type", "code"}}``): 400 for
malformed requests and filters naming unknown columns, 404 for unknown namespaces, tables,
snapshots, plans and plan tasks, 401/403 for a missing or wrong bearer token when one is
configured. Bad input never produces a 500: everything a client sends is validated before
it reaches planning, and planning itself reports bad input with typed exceptions.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import signal
import sys
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pydantic
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from icefloe.catalog import Catalog, Namespace, TableIdentifier
from icefloe.content_file import content_file_to_json
from icefloe.datafile import DataFile
from icefloe.errors import (
    FileIOError,
    IcefloeError,
    InvalidFileError,
    NotFoundError,
    ValidationError,
)
from icefloe.expression_json import expression_to_json, parse_expression
from icefloe.manifest_cache import ManifestCache
from icefloe.metadata import TableMetadata
from icefloe.planner_config import PlannerConfig
from icefloe.rest_catalog_config import RestCatalogSettings
from icefloe.scan import ScanPlan, plan_scan
from icefloe.service_http import ServiceHttp
from icefloe.table_refresher import ResultsConsumer, TableRefresher, TableState

log = logging.getLogger(__name__)

NAMESPACE_SEPARATOR = "\x1f"
SCAN_PLANNING_MODE = "scan-planning-mode"
OPENAPI_FILE = Path(__file__).with_name("planner_openapi.json")

# (method, path) of every implemented route, as the OpenAPI document spells the path.
ENDPOINTS: tuple[tuple[str, str], ...] = (
    ("GET", "/v1/{prefix}/namespaces"),
    ("GET", "/v1/{prefix}/namespaces/{namespace}"),
    ("HEAD", "/v1/{prefix}/namespaces/{namespace}"),
    ("GET", "/v1/{prefix}/namespaces/{namespace}/tables"),
    ("GET", "/v1/{prefix}/namespaces/{namespace}/tables/{table}"),
    ("HEAD", "/v1/{prefix}/namespaces/{namespace}/tables/{table}"),
    ("POST", "/v1/{prefix}/namespaces/{namespace}/tables/{table}/plan"),
    ("GET", "/v1/{prefix}/namespaces/{namespace}/tables/{table}/plan/{plan-id}"),
    ("DELETE", "/v1/{prefix}/namespaces/{namespace}/tables/{table}/plan/{plan-id}"),
    ("POST", "/v1/{prefix}/namespaces/{namespace}/tables/{table}/tasks"),
)


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------


class ApiError(Exception):
    """An error answered in the REST error model."""

    def __init__(self, code: int, error_type: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.error_type = error_type
        self.message = message


def _bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequestException", message)


def error_response(code: int, error_type: str, message: str, *, head: bool = False) -> web.Response:
    if head:
        return web.Response(status=code)
    body = {"error": {"message": message, "type": error_type, "code": code}}
    return web.json_response(body, status=code)


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


def _problems(err: pydantic.ValidationError) -> str:
    parts = []
    for e in err.errors()[:5]:
        where = ".".join(str(p) for p in e.get("loc", ())) or "body"
        parts.append(f"{where}: {e.get('msg', 'invalid')}")
    return "; ".join(parts)


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


def _check_name(name: str, what: str) -> str:
    # Catalogs map names to storage paths: a name that is a path step of its own would
    # let a request reach outside the warehouse.
    if not name or name in (".", "..") or "/" in name or "\x00" in name:
        raise _bad_request(
            f"invalid {what} {name!r}: names must be non-empty, not '.' or '..', and contain no '/'"
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


def content_file_json(f: DataFile, plan: ScanPlan, stats: frozenset[int]) -> dict[str, Any]:
    """A data or delete file in REST form, with column stats only for ``stats`` (ids)."""
    out = content_file_to_json(f, plan.specs[f.spec_id], plan.schema, set(stats))
    for key in (
        "column-sizes",
        "value-counts",
        "null-value-counts",
        "nan-value-counts",
        "lower-bounds",
        "upper-bounds",
    ):
        value = out.get(key)
        if value is not None and not value["keys"]:
            del out[key]
    return out


def scan_tasks_json(plan: ScanPlan, start: int, stop: int) -> dict[str, Any]:
    """The ``ScanTasks`` object of tasks ``start``..``stop``, with their delete files."""
    tasks = plan.tasks(start, stop)
    delete_files: list[dict[str, Any]] = []
    delete_index: dict[str, int] = {}
    file_tasks = []
    residuals: dict[Any, Any] = {}
    no_stats: frozenset[int] = frozenset()
    for task in tasks:
        refs = []
        for d in task.delete_files:
            index = delete_index.get(d.file_path)
            if index is None:
                index = delete_index[d.file_path] = len(delete_files)
                delete_files.append(content_file_json(d, plan, no_stats))
            refs.append(index)
        residual = residuals.get(task.residual)
        if residual is None:
            residual = residuals[task.residual] = expression_to_json(task.residual, legacy=True)
        entry: dict[str, Any] = {
            "data-file": content_file_json(task.data_file, plan, plan.stats_field_ids),
            "residual-filter": residual,
        }
        if refs:
            entry["delete-file-references"] = refs
        file_tasks.append(entry)
    out: dict[str, Any] = {"file-scan-tasks": file_tasks}
    if delete_files:
        out["delete-files"] = delete_files
    return out


def metadata_json(metadata: TableMetadata, snapshots: str) -> dict[str, Any]:
    out = metadata.to_json()
    if snapshots == "refs":
        referenced = {ref.snapshot_id for ref in metadata.refs.values()}
        out["snapshots"] = [s for s in out["snapshots"] if s["snapshot-id"] in referenced]
    return out


# ---------------------------------------------------------------------------------------------
# Plans kept between requests
# ---------------------------------------------------------------------------------------------


@dataclass
class StoredPlan:
    plan_id: str
    table: TableIdentifier
    plan: ScanPlan
    page_size: int
    expires_at: float
    fetched: set[int]

    @property
    def pages(self) -> int:
        return max(1, -(-len(self.plan) // self.page_size))

    def tokens(self) -> list[str]:
        return [f"{self.plan_id}:{page}" for page in range(1, self.pages)]


class PlanStore:
    """Plans by id, dropped on cancel, on expiry, when the store is full (oldest first), and
    shortly after every page was fetched (a grace period lets clients retry a fetch)."""

    FETCHED_GRACE_S = 30.0

    def __init__(self, ttl_s: float, max_plans: int, clock: Callable[[], float]) -> None:
        self.ttl_s = ttl_s
        self.max_plans = max_plans
        self.clock = clock
        self._plans: OrderedDict[str, StoredPlan] = OrderedDict()

    def __len__(self) -> int:
        return len(self._plans)

    def add(self, table: TableIdentifier, plan: ScanPlan, page_size: int) -> StoredPlan:
        self.sweep()
        while len(self._plans) >= self.max_plans:
            self._plans.popitem(last=False)
        stored = StoredPlan(
            uuid.uuid4().hex, table, plan, page_size, self.clock() + self.ttl_s, {0}
        )
        if stored.pages == 1:
            stored.expires_at = min(stored.expires_at, self.clock() + self.FETCHED_GRACE_S)
        self._plans[stored.plan_id] = stored
        return stored

    def get(self, plan_id: str, table: TableIdentifier) -> StoredPlan | None:
        self.sweep()
        stored = self._plans.get(plan_id)
        if stored is None or stored.table != table:
            return None
        return stored

    def page_fetched(self, stored: StoredPlan, page: int) -> None:
        stored.fetched.add(page)
        if len(stored.fetched) >= stored.pages:
            stored.expires_at = min(stored.expires_at, self.clock() + self.FETCHED_GRACE_S)

    def remove(self, plan_id: str, table: TableIdentifier) -> bool:
        stored = self._plans.get(plan_id)
        if stored is None or stored.table != table:
            return False
        del self._plans[plan_id]
        return True

    def sweep(self) -> None:
        now = self.clock()
        for plan_id in [p for p, s in self._plans.items() if s.expires_at <= now]:
            del self._plans[plan_id]


# ---------------------------------------------------------------------------------------------
# The OpenAPI document
# ---------------------------------------------------------------------------------------------

_EXTENSIONS = {
    "ref": {
        "description": "icefloe extension: plan a point-in-time scan of the snapshot a branch "
        "or tag points to. Excludes snapshot-id, as-of-timestamp-ms and incremental scans.",
        "type": "string",
    },
    "as-of-timestamp-ms": {
        "description": "icefloe extension: plan a point-in-time scan of the snapshot that was "
        "current at this time (milliseconds since the epoch), found in the snapshot log.",
        "type": "integer",
        "format": "int64",
    },
}


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _refs(item)


def trim_openapi(
    spec: Mapping[str, Any], endpoints: tuple[tuple[str, str], ...] = ENDPOINTS
) -> dict[str, Any]:
    """The REST OpenAPI document cut down to ``endpoints`` and what they reference,
    with the planning request's extensions documented."""
    wanted: dict[str, set[str]] = {}
    for method, path in (*endpoints, ("GET", "/v1/config")):
        wanted.setdefault(path, set()).add(method.lower())
    paths: dict[str, Any] = {}
    for path, item in spec["paths"].items():
        if path not in wanted:
            continue
        kept = {
            k: v for k, v in item.items() if k in wanted[path] or k in ("parameters", "summary")
        }
        paths[path] = kept
    components = spec.get("components", {})
    keep: dict[str, set[str]] = {}
    pending = list(_refs(paths)) + list(_refs(spec.get("security", [])))
    while pending:
        ref = pending.pop()
        if not ref.startswith("#/components/"):
            continue
        _, _, section, name = ref.split("/", 3)
        if name in keep.setdefault(section, set()):
            continue
        keep[section].add(name)
        pending.extend(_refs(components.get(section, {}).get(name, {})))
    trimmed_components: dict[str, Any] = {}
    for section, names in components.items():
        if section == "securitySchemes":
            trimmed_components[section] = names
            continue
        chosen = {n: v for n, v in names.items() if n in keep.get(section, set())}
        if chosen:
            trimmed_components[section] = chosen
    request = trimmed_components.get("schemas", {}).get("PlanTableScanRequest")
    if request is not None:
        request = json.loads(json.dumps(request))
        request.setdefault("properties", {}).update(_EXTENSIONS)
        trimmed_components["schemas"]["PlanTableScanRequest"] = request
    out = {k: v for k, v in spec.items() if k not in ("paths", "components")}
    out["info"] = dict(spec.get("info", {}))
    out["info"]["title"] = "icefloe planner (Apache Iceberg REST Catalog API subset)"
    out["paths"] = paths
    out["components"] = trimmed_components
    return out


def served_openapi(document: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """The trimmed document with ``{prefix}`` resolved to this server's prefix."""
    out = json.loads(json.dumps(document))
    base = f"/v1/{prefix}/" if prefix else "/v1/"
    paths = {}
    for path, item in out["paths"].items():
        params = item.get("parameters")
        if params:
            item["parameters"] = [
                p for p in params if p.get("$ref") != "#/components/parameters/prefix"
            ]
        paths[path.replace("/v1/{prefix}/", base)] = item
    out["paths"] = paths
    out["servers"] = [{"url": "/"}]
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
        ):
            counter = CounterMetricFamily(f"icefloe_planner_{name}", doc)
            counter.add_metric([], value)
            yield counter
        for name, value, doc in (
            ("cache_bytes", stats.bytes, "bytes held by the manifest cache"),
            ("cache_max_bytes", stats.max_bytes, "manifest cache budget"),
            ("cache_entries", stats.entries, "manifest lists and manifests cached"),
            ("plans", len(s.plans), "plans held for plan-task fetches"),
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

    def __init__(
        self,
        config: PlannerConfig,
        catalog: Catalog | None = None,
        *,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.monotonic,
        rest: RestCatalogSettings | None = None,
    ) -> None:
        self.config = config
        self.rest_settings = rest  # None: from ICEFLOE_REST_* (see icefloe.rest_catalog)
        self.write_endpoints: list[tuple[str, str]] = []
        if catalog is None:
            from icefloe.catalog_uri import load_catalog

            catalog = load_catalog(config.catalog)
        self.catalog = catalog
        self.clock = clock
        self.cache = ManifestCache(
            catalog.io, config.cache_max_bytes, load_concurrency=config.manifest_load_concurrency
        )
        self.refresher = TableRefresher(
            catalog,
            refresh_interval_s=config.refresh_interval_s,
            idle_after_s=config.table_idle_ms / 1000.0,
            trust_events=config.trust_events and bool(config.brokers),
            clock=clock,
        )
        self.plans = PlanStore(config.plan_ttl_ms / 1000.0, config.max_plans, clock)
        self.consumer: ResultsConsumer | None = None
        if config.brokers:
            self.consumer = ResultsConsumer(
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

    async def start(self) -> None:
        await self.start_background()
        runner = web.AppRunner(self.app(), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.config.host, self.config.port)
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
        app = web.Application(middlewares=[self._middleware], client_max_size=8 << 20)
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
        from icefloe.rest_catalog import register_write_routes

        self.write_endpoints = register_write_routes(app, self, self.rest_settings)
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
        try:
            if request.path.startswith("/v1/"):
                self._authorize(request)
            response = await handler(request)
        except ApiError as e:
            response = error_response(e.code, e.error_type, e.message, head=head)
        except web.HTTPException as e:
            kind = "NotFoundException" if e.status == 404 else "HttpException"
            if e.status == 405:
                kind = "MethodNotAllowedException"
            response = error_response(e.status, kind, e.reason, head=head)
        except ValidationError as e:
            response = error_response(400, "BadRequestException", str(e), head=head)
        except NotFoundError as e:
            response = error_response(404, "NotFoundException", str(e), head=head)
        except InvalidFileError as e:
            log.error("%s %s: %s", request.method, request.path, e)
            response = error_response(500, "InvalidFileException", str(e), head=head)
        except FileIOError as e:
            log.error("%s %s: storage failed: %s", request.method, request.path, e)
            response = error_response(503, "ServiceUnavailableException", str(e), head=head)
        except IcefloeError as e:
            log.error("%s %s: %s", request.method, request.path, e)
            response = error_response(500, "InternalServerError", str(e), head=head)
        except Exception:
            log.exception("%s %s failed", request.method, request.path)
            response = error_response(
                500, "InternalServerError", "internal error; see the planner's log", head=head
            )
        self._requests.labels(route, request.method, str(response.status)).inc()
        self._latency.labels(route).observe(time.perf_counter() - started)
        return response

    def _authorize(self, request: web.Request) -> None:
        token = self.config.token
        if token is None:
            return
        header = request.headers.get("Authorization", "")
        scheme, _, given = header.partition(" ")
        if not header:
            raise ApiError(401, "NotAuthorizedException", "missing bearer token")
        if scheme.lower() != "bearer" or not given:
            raise ApiError(
                401, "NotAuthorizedException", "expected 'Authorization: Bearer <token>'"
            )
        if not hmac.compare_digest(given.strip().encode(), token.get_secret_value().encode()):
            raise ApiError(403, "ForbiddenException", "the bearer token is not valid here")

    # -- config and documents -------------------------------------------------------------

    async def _config(self, request: web.Request) -> web.Response:
        overrides = {SCAN_PLANNING_MODE: "server"}
        if self.config.prefix:
            overrides["prefix"] = self.config.prefix
        defaults = {}
        if self.config.warehouse:
            defaults["warehouse"] = self.config.warehouse
        return web.json_response(
            {
                "defaults": defaults,
                "overrides": overrides,
                "endpoints": [
                    f"{method} {path}" for method, path in (*ENDPOINTS, *self.write_endpoints)
                ],
            }
        )

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

    async def _table(self, ident: TableIdentifier) -> TableState:
        try:
            return await self.refresher.get(ident)
        except NotFoundError:
            if not await self.catalog.namespace_exists(ident.namespace):
                raise self._no_namespace(ident.namespace) from None
            raise ApiError(404, "NoSuchTableException", f"table {ident} does not exist") from None

    async def _load_table(self, request: web.Request) -> web.Response:
        ident = _table_identifier(request)
        snapshots = request.query.get("snapshots", "all")
        if snapshots not in ("all", "refs"):
            raise _bad_request(f"snapshots must be 'all' or 'refs', got {snapshots!r}")
        state = await self._table(ident)
        etag = (
            '"'
            + hashlib.sha256(f"{state.metadata_location}|{snapshots}".encode()).hexdigest()[:32]
            + '"'
        )
        if request.headers.get("If-None-Match") == etag:
            return web.Response(status=304, headers={"ETag": etag})
        body = {
            "metadata-location": state.metadata_location,
            "metadata": metadata_json(state.metadata, snapshots),
            "config": {SCAN_PLANNING_MODE: "server"},
        }
        return web.json_response(body, headers={"ETag": etag})

    async def _table_exists(self, request: web.Request) -> web.Response:
        await self._table(_table_identifier(request))
        return web.Response(status=204)

    # -- planning -------------------------------------------------------------------------

    async def _plan(self, request: web.Request) -> web.Response:
        ident = _table_identifier(request)
        body = await _json_body(request, required=False)
        try:
            req = PlanRequest.model_validate(body)
        except pydantic.ValidationError as e:
            raise _bad_request(f"invalid plan request: {_problems(e)}") from None
        if req.snapshot_id is not None and (
            req.start_snapshot_id is not None or req.end_snapshot_id is not None
        ):
            raise _bad_request(
                "snapshot-id (point in time) and start/end-snapshot-id (incremental) exclude "
                "each other"
            )
        if req.start_snapshot_id is not None and req.end_snapshot_id is None:
            raise _bad_request("end-snapshot-id is required with start-snapshot-id")
        row_filter = None if req.filter is None else parse_expression(req.filter)
        state = await self._table(ident)
        try:
            plan = await plan_scan(
                state.metadata,
                self.cache,
                snapshot_id=req.snapshot_id,
                ref=req.ref,
                as_of_ms=req.as_of_timestamp_ms,
                start_snapshot_id=req.start_snapshot_id,
                end_snapshot_id=req.end_snapshot_id,
                row_filter=row_filter,
                case_sensitive=req.case_sensitive,
                select=req.select,
                use_snapshot_schema=req.use_snapshot_schema,
                stats_fields=req.stats_fields,
            )
        except NotFoundError as e:
            raise ApiError(404, "NoSuchSnapshotException", str(e)) from None
        counts = plan.metrics.data_files
        self._planned.labels("selected").inc(counts.selected)
        self._planned.labels("pruned-by-partition").inc(counts.by_partition)
        self._planned.labels("pruned-by-metrics").inc(counts.by_metrics)
        stored = self.plans.add(ident, plan, self.config.tasks_per_page)
        body_out = await self._completed(stored)
        body_out["plan-id"] = stored.plan_id
        return web.json_response(body_out)

    async def _completed(self, stored: StoredPlan) -> dict[str, Any]:
        page = await asyncio.to_thread(scan_tasks_json, stored.plan, 0, stored.page_size)
        out: dict[str, Any] = {"status": "completed", **page}
        tokens = stored.tokens()
        if tokens:
            out["plan-tasks"] = tokens
        return out

    def _stored(self, request: web.Request, ident: TableIdentifier) -> StoredPlan:
        plan_id = request.match_info["plan_id"]
        stored = self.plans.get(plan_id, ident)
        if stored is None:
            raise ApiError(
                404, "NoSuchPlanIdException", f"plan {plan_id!r} of table {ident} does not exist"
            )
        return stored

    async def _fetch_plan(self, request: web.Request) -> web.Response:
        ident = _table_identifier(request)
        stored = self._stored(request, ident)
        return web.json_response(await self._completed(stored))

    async def _cancel_plan(self, request: web.Request) -> web.Response:
        ident = _table_identifier(request)
        if not self.plans.remove(request.match_info["plan_id"], ident):
            self._stored(request, ident)  # raises the 404
        return web.Response(status=204)

    async def _fetch_tasks(self, request: web.Request) -> web.Response:
        ident = _table_identifier(request)
        body = await _json_body(request, required=True)
        try:
            req = FetchTasksRequest.model_validate(body)
        except pydantic.ValidationError as e:
            raise _bad_request(f"invalid fetch-tasks request: {_problems(e)}") from None
        plan_id, _, page_text = req.plan_task.rpartition(":")
        stored = self.plans.get(plan_id, ident) if plan_id else None
        page = int(page_text) if page_text.isdigit() else -1
        if stored is None or not 1 <= page < stored.pages:
            raise ApiError(
                404,
                "NoSuchPlanTaskException",
                f"plan task {req.plan_task!r} of table {ident} does not exist (expired, "
                "cancelled or never issued)",
            )
        start = page * stored.page_size
        body_out = await asyncio.to_thread(
            scan_tasks_json, stored.plan, start, start + stored.page_size
        )
        self.plans.page_fetched(stored, page)
        return web.json_response(body_out)


# ---------------------------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------------------------


async def serve(config: PlannerConfig) -> None:
    """Run until SIGINT or SIGTERM."""
    service = PlannerService(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await service.start()
    try:
        await stop.wait()
    finally:
        await service.stop()
        await service.catalog.close()


async def run_from_args(args: Any) -> int:
    from icefloe.planner_config import overrides_from_args

    config = PlannerConfig.load(overrides_from_args(args))
    logging.basicConfig(
        level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    await serve(config)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m icefloe.planner openapi SPEC.yaml``: print the trimmed OpenAPI document."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] != "openapi":
        print("usage: python -m icefloe.planner openapi REST_SPEC.yaml", file=sys.stderr)
        return 2
    import yaml  # type: ignore[import-untyped]  # a development tool, not a dependency

    with open(args[1], encoding="utf-8") as f:
        spec = yaml.safe_load(f)
    print(json.dumps(trim_openapi(spec), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
