"""Server-side scan planning: plan, fetch a plan, cancel it, fetch its pages of tasks.

``POST .../plan`` plans synchronously and answers ``completed``. The first page of file scan
tasks comes inline; larger scans list ``plan-tasks`` tokens, each fetched with
``POST .../tasks``. Plan ids and tokens are signed descriptions of the plan
(:mod:`icefloe.planner.tokens`), so any replica sharing the secret serves them: a plan held
here is served from memory (:mod:`icefloe.planner.plans`), one made elsewhere (or dropped)
is planned again from the request its token embeds. ``GET``/``DELETE .../plan/{plan-id}``
fetch and release a plan; a cancellation is shared with the other replicas
(:mod:`icefloe.planner.plan_cancellations`).

The event loop stays responsive (``/healthz`` answers while hostile plans run): requests
past their body are admitted a few at a time, CPU work (big bodies, planning, page writing)
runs in worker threads holding one of ``planning_concurrency`` slots, and the page after the
one just served is written ahead of its fetch (:mod:`icefloe.planner.pages_ahead`).
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Callable
from typing import Any

import pydantic
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter

from icefloe.errors import NotFoundError
from icefloe.manifests.cache import ManifestCache
from icefloe.planner.config import PlannerConfig
from icefloe.planner.delegation import AccessDelegation
from icefloe.planner.errors import ApiError, bad_request
from icefloe.planner.names import table_identifier, table_key
from icefloe.planner.pages_ahead import PagesAhead
from icefloe.planner.plan_cancellations import SharedCancellations
from icefloe.planner.plan_request import (
    FetchTasksRequest,
    PlanRequest,
    json_body,
    parse_plan_request,
    reparse_plan_request,
)
from icefloe.planner.plans import PlanStore, StoredPlan
from icefloe.planner.refresher import TableState
from icefloe.planner.single_flight import SingleFlight
from icefloe.planner.table_lookup import TableLookup
from icefloe.planner.tokens import PlanIdentity, PlanTokens, TokenError, parse_plan_task
from icefloe.runtime.released_body import json_bytes_response
from icefloe.scan.planning import ScanPlan, plan_scan
from icefloe.scan.tasks_json import page_is_written, scan_tasks_wrapped
from icefloe.spec.model import describe_problems
from icefloe.table.catalog import TableIdentifier

# Request bodies above this are parsed (JSON, validation, filter) in a worker thread.
OFFLOAD_BODY_BYTES = 32 << 10
# Pages of fewer tasks than this are written inline when asked for (a thread hop costs more
# than writing them) and never ahead of time.
INLINE_PAGE_TASKS = 16


class PlanRoutes:
    """The plan and plan-task routes over the planner's held plans and manifest cache."""

    delegation: AccessDelegation  # vended credentials for plans, set by register()

    def __init__(
        self,
        config: PlannerConfig,
        tables: TableLookup,
        cache: ManifestCache,
        plans: PlanStore,
        ahead: PagesAhead,
        tokens: PlanTokens,
        cancellations: SharedCancellations,
        registry: CollectorRegistry,
        wall_clock: Callable[[], float],
    ) -> None:
        self.config = config
        self.tables = tables
        self.cache = cache
        self.plans = plans
        self.ahead = ahead
        self.tokens = tokens
        self.cancellations = cancellations
        self.wall_clock = wall_clock
        # Planning threads hold the GIL between Arrow kernels: a few at a time keep the
        # event loop (and /healthz) responsive; more would only queue for the GIL.
        self._cpu_slots = asyncio.Semaphore(config.planning_concurrency)
        # Plan and page requests past their body are admitted a few at a time: the event
        # loop runs each one's parsing, token and small plans itself, and a /healthz probe
        # waits behind every handler step queued before it. Queued requests cost nothing.
        self._admission = asyncio.Semaphore(2 * config.planning_concurrency)
        self._serving: set[tuple[str, int]] = set()  # pages being written for a fetch
        self._replans: SingleFlight[StoredPlan] = SingleFlight()  # plans planned again
        self._planned = Counter(
            "icefloe_planner_planned_files",
            "data files in planned scans, and files pruned by partition and by metrics",
            ["outcome"],
            registry=registry,
        )

    def register(self, router: web.UrlDispatcher, table: str, delegation: AccessDelegation) -> None:
        """The routes under a table's path (``.../namespaces/{namespace}/tables/{table}``)."""
        self.delegation = delegation
        router.add_post(table + "/plan", self._plan)
        router.add_get(table + "/plan/{plan_id}", self._fetch_plan, allow_head=False)
        router.add_delete(table + "/plan/{plan_id}", self._cancel_plan)
        router.add_post(table + "/tasks", self._fetch_tasks)

    async def _plan(self, request: web.Request) -> web.Response:
        ident = table_identifier(request)
        raw = await request.read()
        credentials = None
        if self.delegation.vends_to(request):
            state = await self.tables.get(ident)
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
                req, row_filter = await asyncio.to_thread(parse_plan_request, raw)
        else:
            req, row_filter = parse_plan_request(raw)
        plan = await self._make_plan(ident, req, row_filter)
        snapshot_id = plan.snapshot.snapshot_id if plan.snapshot is not None else None
        issue = functools.partial(
            self.tokens.issue,
            table=table_key(ident),
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
        state = await self.tables.get(ident)
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
        served, being written for a fetch, or cheap enough to write when asked for (cheaper,
        too, than sharing it with the other processes through the disk: a page of a full
        plan whose task texts are written is a copy of them)."""
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
        write = functools.partial(self._page, plan, start, stop, b"{", b"}")
        self.ahead.start(stored.key, plan, page, write, stored.plan_id)

    async def _open_plan_id(
        self, ident: TableIdentifier, plan_id: str, error_type: str, what: str
    ) -> PlanIdentity:
        """What a plan id of this table says, if it is valid, unexpired and not cancelled."""
        try:
            identity = self.tokens.open(plan_id, self.wall_clock())
        except TokenError as e:
            raise _missing(ident, error_type, what, str(e)) from None
        if identity.table != table_key(ident):
            raise _missing(ident, error_type, what, "it belongs to another table")
        if self.plans.cancelled(identity.key) or await self.cancellations.cancelled(identity.key):
            raise _missing(ident, error_type, what, "the plan was cancelled")
        return identity

    async def _resolve(
        self,
        ident: TableIdentifier,
        plan_id: str,
        error_type: str,
        what: str,
        identity: PlanIdentity | None = None,
    ) -> StoredPlan:
        """The plan a plan id names (``identity``: opened already): held here, or planned
        again from its signed request."""

        def missing(reason: str) -> ApiError:
            return _missing(ident, error_type, what, reason)

        if identity is None:
            identity = await self._open_plan_id(ident, plan_id, error_type, what)
        stored = self.plans.get(identity.key, ident)
        if stored is not None:
            return stored
        # Fetches of one plan's pages at once (a pool of fetchers) plan it again once.
        replan = functools.partial(self._replan, ident, identity, missing)
        return await self._replans.run(identity.key, replan)

    async def _replan(
        self, ident: TableIdentifier, identity: PlanIdentity, missing: Callable[[str], ApiError]
    ) -> StoredPlan:
        if identity.request is None:
            raise missing(
                "the plan was made by another replica (or dropped) and its request was too "
                "large to embed in the token; plan the scan again"
            )
        try:
            async with self._cpu_slots:
                req, row_filter = await asyncio.to_thread(reparse_plan_request, identity.request)
        except ApiError:
            raise missing("the plan's request no longer validates; plan the scan again") from None
        plan = await self._make_plan(ident, req, row_filter, pinned_snapshot=identity.snapshot_id)
        return self.plans.add(
            ident, plan, identity.page_size, plan_id=identity.plan_id, key=identity.key
        )

    async def _fetch_plan(self, request: web.Request) -> web.Response:
        ident = table_identifier(request)
        async with self._admission:
            with self.cache.holding():
                stored = await self._resolve(
                    ident, request.match_info["plan_id"], "NoSuchPlanIdException", "the plan"
                )
                return _json_bytes_response(await self._completed(stored))

    async def _cancel_plan(self, request: web.Request) -> web.Response:
        ident = table_identifier(request)
        plan_id = request.match_info["plan_id"]
        try:
            identity = self.tokens.open(plan_id, self.wall_clock())
        except TokenError as e:
            raise ApiError(
                404, "NoSuchPlanIdException", f"the plan of table {ident} does not exist: {e}"
            ) from None
        if identity.table != table_key(ident) or self.plans.cancelled(identity.key):
            raise ApiError(
                404, "NoSuchPlanIdException", f"the plan of table {ident} does not exist"
            )
        if await self.cancellations.cancelled(identity.key):
            raise ApiError(
                404, "NoSuchPlanIdException", f"the plan of table {ident} does not exist"
            )
        self.plans.remove(identity.key, ident)
        self.plans.cancel(identity.key)
        await self.ahead.forget(identity.key)
        await self.cancellations.cancel(identity.key)
        return web.Response(status=204)

    async def _fetch_tasks(self, request: web.Request) -> web.Response:
        ident = table_identifier(request)
        body = await json_body(request, required=True)
        async with self._admission:
            with self.cache.holding():
                return await self._fetch_tasks_admitted(ident, body)

    async def _fetch_tasks_admitted(
        self, ident: TableIdentifier, body: dict[str, Any]
    ) -> web.Response:
        try:
            req = FetchTasksRequest.model_validate(body)
        except pydantic.ValidationError as e:
            raise bad_request(
                f"invalid fetch-tasks request: {describe_problems(e, limit=5)}"
            ) from None
        what = "the plan task"
        try:
            plan_id, page = parse_plan_task(req.plan_task)
        except TokenError as e:
            raise ApiError(
                404, "NoSuchPlanTaskException", f"{what} of table {ident} does not exist: {e}"
            ) from None
        identity = await self._open_plan_id(ident, plan_id, "NoSuchPlanTaskException", what)
        if self.plans.get(identity.key, ident) is None:  # a page written ahead elsewhere?
            shared = await self.ahead.take_shared(plan_id, identity.key, page)
            if shared is not None:
                return _json_bytes_response(shared)
        stored = await self._resolve(ident, plan_id, "NoSuchPlanTaskException", what, identity)
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
            body_out = await self.ahead.take(stored.key, stored.plan, page, stored.plan_id)
            if body_out is None:
                start = page * stored.page_size
                stop = start + stored.page_size
                body_out = await self._page(stored.plan, start, stop, b"{", b"}")
        finally:
            self._serving.discard(serving)
        self.plans.page_fetched(stored, page)
        self._write_ahead(stored, page + 1)
        return _json_bytes_response(body_out)


def _missing(ident: TableIdentifier, error_type: str, what: str, reason: str) -> ApiError:
    return ApiError(404, error_type, f"{what} of table {ident} does not exist: {reason}")


def _json_bytes_response(body: bytes) -> web.Response:
    # Released once written: an idle keep-alive connection would hold its last page.
    return json_bytes_response(body)
