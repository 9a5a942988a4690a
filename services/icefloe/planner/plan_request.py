"""What a plan request asks, validated and parsed before it reaches planning.

The planTableScan body (:class:`PlanRequest`, the spec's PlanTableScanRequest plus two
time-travel extensions) and the fetchScanTasks body (:class:`FetchTasksRequest`). A filter is
the client's: it may nest deeper than Python's recursion limit or weigh a megabyte, so its
depth is measured without recursion (:func:`json_depth`) and refused past
:data:`MAX_FILTER_DEPTH` with a 400 naming the limit; big bodies are parsed in a worker
thread by the caller. Everything here answers bad input with a 400, never a 500.
"""

from __future__ import annotations

import json
from typing import Any

import pydantic
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from icefloe.expressions.json_form import parse_expression
from icefloe.planner.errors import bad_request
from icefloe.spec.model import describe_problems


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
    """The fetchScanTasks body: one plan-task token."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True, frozen=True)

    plan_task: StrictStr = Field(..., alias="plan-task")


async def json_body(request: web.Request, *, required: bool) -> dict[str, Any]:
    """The request's body as a JSON object (``{}`` when empty and not ``required``)."""
    raw = await request.read()
    if not raw.strip():
        if required:
            raise bad_request("the request needs a JSON object body")
        return {}
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise bad_request(f"the request body is not valid JSON: {e}") from None
    except RecursionError:
        raise bad_request("the request body is nested too deeply") from None
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a JSON object, got {type(body).__name__}")
    return body


def parse_plan_request(raw: bytes) -> tuple[PlanRequest, Any]:
    """Validate a planTableScan body and parse its filter (CPU work for big filters: called
    in a worker thread for large bodies)."""
    if not raw.strip():
        body: Any = {}
    else:
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise bad_request(f"the request body is not valid JSON: {e}") from None
        except RecursionError:
            raise bad_request(TOO_DEEP) from None
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a JSON object, got {type(body).__name__}")
    try:
        req = PlanRequest.model_validate(body)
    except pydantic.ValidationError as e:
        raise bad_request(f"invalid plan request: {describe_problems(e, limit=5)}") from None
    if req.snapshot_id is not None and (
        req.start_snapshot_id is not None or req.end_snapshot_id is not None
    ):
        raise bad_request(
            "snapshot-id (point in time) and start/end-snapshot-id (incremental) exclude each other"
        )
    if req.start_snapshot_id is not None and req.end_snapshot_id is None:
        raise bad_request("end-snapshot-id is required with start-snapshot-id")
    if req.filter is not None:
        depth = json_depth(req.filter, MAX_FILTER_DEPTH)
        if depth > MAX_FILTER_DEPTH:
            raise bad_request(
                f"the filter nests more than {MAX_FILTER_DEPTH} levels deep (the limit, "
                "MAX_FILTER_DEPTH); flatten it, e.g. a long chain of 'or' equalities into "
                "one 'in'"
            )
    try:
        row_filter = None if req.filter is None else parse_expression(req.filter)
    except RecursionError:
        raise bad_request(TOO_DEEP) from None
    return req, row_filter


# How deep a plan request's filter may nest (JSON objects and arrays within the filter). An
# 800-deep AND chain, as a client folding 800 conditions left to right sends, is planned;
# deeper ones are refused with a 400 naming this limit rather than meet Python's recursion
# limit (about 1000 frames) somewhere between parsing and answering.
MAX_FILTER_DEPTH = 900
TOO_DEEP = (
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


def reparse_plan_request(request: Any) -> tuple[PlanRequest, Any]:
    """A plan request embedded in a token, validated and parsed again (a worker thread's
    work: an embedded request may be a highly compressible megabyte)."""
    return parse_plan_request(json.dumps(request).encode("utf-8"))
