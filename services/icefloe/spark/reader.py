"""Reading Iceberg tables into Spark through the scan planner (:func:`read`).

The driver asks the scan planner (REST ``planTableScan``, following ``plan-tasks`` through
``fetchScanTasks``, polling while the plan is ``submitted``) for file scan tasks and builds a
DataFrame from them: one row per task, turned into table rows by :func:`read_task` in
``mapInArrow``. Types map as :mod:`icefloe.spark.types` says.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import aiohttp
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as st

from icefloe.errors import (
    IcefloeError,
    NotFoundError,
    ValidationError,
)
from icefloe.expressions import (
    BooleanExpressionVisitor,
    BoundPredicate,
)
from icefloe.expressions import visit as visit_expression
from icefloe.expressions.binding import bind
from icefloe.expressions.json_form import parse_expression
from icefloe.retry import Backoff, Retry
from icefloe.spark.channel import BACKGROUND, ConfigArg, resolve_settings
from icefloe.spark.config import SparkConfig
from icefloe.spark.read_tasks import READ_TASK_COLUMN, ReadJob, read_task
from icefloe.spark.types import (
    FilterArg,
    arrow_schema_of,
    filter_to_json,
    map_in_arrow,
    spark_schema,
)
from icefloe.spec.metadata import TableMetadata
from icefloe.table.catalog import TableIdentifier

_STATS_KEYS = (
    "column-sizes",
    "value-counts",
    "null-value-counts",
    "nan-value-counts",
    "lower-bounds",
    "upper-bounds",
)
# Polls of a submitted plan, and waits for the planner to see a snapshot: 0.05s, 0.1s, ...
# up to 2s (the first wait is twice the base, so the base is half of it).
_PLAN_POLL = Backoff(0.025, 2.0, jitter=False)


# ---------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------


class PlanningError(IcefloeError):
    """The scan planner failed or refused a request; the message carries its answer."""


@dataclass
class ScanPlan:
    """File scan tasks with their delete files inlined (``delete-files``) and residuals."""

    tasks: list[dict[str, Any]] = field(default_factory=list)


class PlannerClient:
    """The client side of REST scan planning (``planTableScan``, ``fetchScanTasks``...)."""

    def __init__(self, base_url: str, prefix: str | None = None, timeout_s: float = 120.0):
        self.base_url = base_url.rstrip("/")
        self.prefix = prefix.strip("/") if prefix else None
        self.timeout_s = timeout_s

    def _table_url(self, identifier: TableIdentifier) -> str:
        namespace = quote("\x1f".join(identifier.namespace), safe="")
        root = f"{self.base_url}/v1/" + (f"{quote(self.prefix, safe='')}/" if self.prefix else "")
        return f"{root}namespaces/{namespace}/tables/{quote(identifier.name, safe='')}"

    async def _call(
        self,
        session: aiohttp.ClientSession,
        method: str,
        url: str,
        body: Any = None,
        what: str = "",
    ) -> Any:
        try:
            async with session.request(method, url, json=body) as response:
                text = await response.text()
                if response.status == 204:
                    return None
                try:
                    payload = json.loads(text) if text else None
                except ValueError:
                    payload = None
                if response.status >= 400:
                    error = (payload or {}).get("error", {}) if isinstance(payload, dict) else {}
                    message = error.get("message") or text[:300] or response.reason
                    kind = error.get("type") or f"HTTP {response.status}"
                    if response.status == 404:
                        raise NotFoundError(f"{what}: {kind}: {message}")
                    if response.status == 400:
                        raise ValidationError(f"{what}: {kind}: {message}")
                    raise PlanningError(f"{what}: {kind} ({response.status}): {message}")
                if not isinstance(payload, dict):
                    raise PlanningError(f"{what}: the planner answered {text[:200]!r}, not JSON")
                return payload
        except aiohttp.ClientError as e:
            raise PlanningError(f"{what}: cannot reach the planner at {url}: {e}") from e

    async def load_table(self, identifier: TableIdentifier) -> tuple[TableMetadata, dict[str, str]]:
        """``loadTable``: the table's current metadata and the ``config`` the catalog hands
        to clients (storage properties such as ``s3.endpoint``)."""
        async with self._session() as session:
            payload = await self._call(
                session, "GET", self._table_url(identifier), what=f"loading {identifier}"
            )
        try:
            metadata = TableMetadata.from_json(payload["metadata"], what=f"table {identifier}")
        except (KeyError, TypeError):
            raise PlanningError(f"loading {identifier}: the answer has no 'metadata'") from None
        config = payload.get("config") or {}
        return metadata, {str(k): str(v) for k, v in config.items()}

    def _session(self) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))

    async def plan(self, identifier: TableIdentifier, request: Mapping[str, Any]) -> ScanPlan:
        """Every file scan task of a scan, following plan tasks and polling async plans."""
        url = f"{self._table_url(identifier)}/plan"
        what = f"planning a scan of {identifier}"
        plan = ScanPlan()
        plan_id: str | None = None
        finished = False
        deadline = time.monotonic() + self.timeout_s
        async with self._session() as session:
            try:
                result = await self._call(session, "POST", url, dict(request), what)
                plan_id = result.get("plan-id")
                polls = 0
                while result.get("status") == "submitted":
                    if plan_id is None:
                        raise PlanningError(f"{what}: 'submitted' without a plan-id")
                    if time.monotonic() > deadline:
                        raise PlanningError(
                            f"{what}: plan {plan_id} not completed within {self.timeout_s:g}s"
                        )
                    polls += 1
                    await asyncio.sleep(_PLAN_POLL.delay(polls))
                    result = await self._call(
                        session, "GET", f"{url}/{quote(plan_id, safe='')}", what=what
                    )
                status = result.get("status")
                if status == "failed":
                    error = result.get("error") or {}
                    raise PlanningError(f"{what}: planning failed: {error.get('message', error)}")
                if status != "completed":
                    raise PlanningError(f"{what}: unexpected planning status {status!r}")
                # A task without a residual uses the request's filter (REST spec).
                default = request.get("filter")
                pending = list(self._collect(result, plan, what, default))
                tasks_url = f"{self._table_url(identifier)}/tasks"
                while pending:
                    page = await self._call(
                        session, "POST", tasks_url, {"plan-task": pending.pop()}, what
                    )
                    pending.extend(self._collect(page, plan, what, default))
                finished = True
            finally:
                if plan_id is not None and not finished:
                    with contextlib.suppress(Exception):
                        await self._call(
                            session, "DELETE", f"{url}/{quote(plan_id, safe='')}", what=what
                        )
        return plan

    @staticmethod
    def _collect(
        page: Mapping[str, Any], plan: ScanPlan, what: str, default_residual: Any = None
    ) -> list[str]:
        deletes = page.get("delete-files") or []
        for task in page.get("file-scan-tasks") or []:
            if not isinstance(task, dict) or not isinstance(task.get("data-file"), dict):
                raise PlanningError(f"{what}: a file scan task has no 'data-file': {task!r:.200}")
            refs = task.get("delete-file-references") or []
            try:
                inlined = [deletes[i] for i in refs]
            except (IndexError, TypeError):
                raise PlanningError(
                    f"{what}: task for {task['data-file'].get('file-path')} references delete "
                    f"files {refs}, but the response lists {len(deletes)}"
                ) from None
            plan.tasks.append(
                {
                    "data-file": _without_stats(task["data-file"]),
                    "delete-files": [_without_stats(d) for d in inlined],
                    "residual-filter": task.get("residual-filter", default_residual),
                }
            )
        plan_tasks = page.get("plan-tasks") or []
        if not all(isinstance(t, str) for t in plan_tasks):
            raise PlanningError(f"{what}: 'plan-tasks' must be strings")
        return list(plan_tasks)


def _without_stats(content_file: Mapping[str, Any]) -> dict[str, Any]:
    """A content file without column stats: readers do not need them, and bounds of
    columns dropped since would not even parse against the current schema."""
    return {k: v for k, v in content_file.items() if k not in _STATS_KEYS}


class _ColumnNames(BooleanExpressionVisitor[set[str]]):
    """The (dotted) column names a bound expression reads."""

    def visit_true(self) -> set[str]:
        return set()

    def visit_false(self) -> set[str]:
        return set()

    def visit_not(self, child_result: set[str]) -> set[str]:
        return child_result

    def visit_and(self, left_result: set[str], right_result: set[str]) -> set[str]:
        return left_result | right_result

    def visit_or(self, left_result: set[str], right_result: set[str]) -> set[str]:
        return left_result | right_result

    def visit_bound_predicate(self, predicate: BoundPredicate) -> set[str]:
        return {predicate.ref.name}


async def _load_for_read(
    settings: SparkConfig, identifier: TableIdentifier
) -> tuple[TableMetadata, dict[str, str]]:
    if settings.catalog:
        catalog = await BACKGROUND.catalog(settings.catalog)
        table = await catalog.load_table(identifier)
        return table.metadata, dict(catalog.properties)
    return await _planner(settings).load_table(identifier)


async def _plan_when_visible(
    planner: PlannerClient, identifier: TableIdentifier, request: Mapping[str, Any], wait_s: float
) -> ScanPlan:
    """Plan, waiting up to ``wait_s`` for the planner to see the snapshot.

    The snapshot id comes from the catalog, which the planner follows with a lag of up to
    its refresh interval: right after a commit it may not know the snapshot (or the table)
    yet, and answers 404 for something that exists. Read-your-writes is worth a short wait.
    """
    policy = Retry(_PLAN_POLL, transient=(NotFoundError,), deadline_s=wait_s)
    return await policy.call(lambda: planner.plan(identifier, request))


def _planner(settings: SparkConfig) -> PlannerClient:
    if not settings.planner_url:
        raise ValidationError(
            "no scan planner configured: set spark.icefloe.planner-url (or ICEFLOE_PLANNER_URL)"
            " to the planner's REST address"
        )
    return PlannerClient(settings.planner_url, settings.planner_prefix, settings.planner_timeout_s)


def read(
    spark: SparkSession,
    table: str | TableIdentifier,
    filter: FilterArg = None,
    snapshot_id: int | None = None,
    columns: Sequence[str] | None = None,
    *,
    branch: str | None = None,
    case_sensitive: bool = True,
    config: ConfigArg = None,
) -> DataFrame:
    """A DataFrame of ``table``'s rows, planned by the scan planner.

    ``filter`` (an icefloe expression or its JSON) selects rows; ``snapshot_id`` (or
    ``branch``) time-travels, reading with the schema of that snapshot; ``columns`` (dotted
    names allowed) projects.
    """
    settings = resolve_settings(spark, config)
    identifier = TableIdentifier.parse(table)
    metadata, io_properties = BACKGROUND.run(_load_for_read(settings, identifier))
    if snapshot_id is not None and branch is not None:
        raise ValidationError("pass snapshot_id or branch, not both")
    snapshot = (
        metadata.snapshot_by_id(snapshot_id)
        if snapshot_id is not None
        else metadata.snapshot_by_ref(branch or "main")
    )
    if snapshot is None and (snapshot_id is not None or branch is not None):
        what = f"snapshot {snapshot_id}" if snapshot_id is not None else f"branch {branch!r}"
        raise NotFoundError(f"table {identifier} has no {what}")
    schema = metadata.schema()
    if snapshot_id is not None and snapshot is not None and snapshot.schema_id is not None:
        schema = metadata.schema_by_id(snapshot.schema_id) or schema
    projected = schema.select(list(columns), case_sensitive) if columns else schema
    out_schema = spark_schema(projected)
    filter_json = filter_to_json(filter)
    filter_names: set[str] = set()
    if filter_json is not None:
        try:
            bound = bind(schema, parse_expression(filter_json), case_sensitive)
        except ValidationError as e:
            raise ValidationError(f"filter does not apply to {identifier}: {e}") from None
        filter_names = visit_expression(bound, _ColumnNames())
    if snapshot is None:
        return spark.createDataFrame([], out_schema)
    request: dict[str, Any] = {
        "snapshot-id": snapshot.snapshot_id,
        "case-sensitive": case_sensitive,
        "use-snapshot-schema": snapshot_id is not None,
    }
    if columns:
        request["select"] = list(columns)
    if filter_json is not None:
        request["filter"] = filter_json
    wait_s = settings.planner_timeout_s if settings.catalog else 0.0
    plan = BACKGROUND.run(_plan_when_visible(_planner(settings), identifier, request, wait_s))
    if not plan.tasks:
        return spark.createDataFrame([], out_schema)
    # Rows are read with the filter's and the equality deletes' columns too, then projected.
    equality_ids = {
        fid
        for task in plan.tasks
        for delete in task["delete-files"]
        if delete.get("content") == "equality-deletes"
        for fid in delete.get("equality-ids") or ()
    }
    wanted = [
        *(columns or [f.name for f in schema.fields]),
        *sorted(filter_names),
        *sorted(n for fid in equality_ids if (n := schema.find_column_name(fid)) is not None),
    ]
    read_schema = schema.select(list(dict.fromkeys(wanted)), case_sensitive)
    timezone = spark.conf.get("spark.sql.session.timeZone") or "UTC"
    job = ReadJob(
        table_schema_json=json.dumps(schema.to_json()),
        read_schema_json=json.dumps(read_schema.to_json()),
        output_names=tuple(f.name for f in projected.fields),
        specs_json=json.dumps([s.to_json() for s in metadata.partition_specs]),
        table_location=metadata.location,
        io_properties=io_properties,
        output_schema=arrow_schema_of(out_schema, timezone),
        case_sensitive=case_sensitive,
    )
    slices = max(1, min(len(plan.tasks), 4 * spark.sparkContext.defaultParallelism))
    by_size = sorted(
        plan.tasks, key=lambda t: int(t["data-file"].get("file-size-in-bytes", 0)), reverse=True
    )
    balanced = [task for i in range(slices) for task in by_size[i::slices]]
    rdd = spark.sparkContext.parallelize([(json.dumps(t),) for t in balanced], slices)
    tasks_df = spark.createDataFrame(
        rdd, st.StructType([st.StructField(READ_TASK_COLUMN, st.StringType())])
    )
    return map_in_arrow(tasks_df, functools.partial(read_task, job), out_schema)
