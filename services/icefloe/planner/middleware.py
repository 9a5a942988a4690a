"""The planner's request middleware: every request answered, counted and logged alike.

One place turns what a handler raised into the REST error model: :class:`ApiError` as
given, typed core errors into their status (400, 404, 503 for storage), anything else into a
500 whose details stay in the log. Messages never name the server's warehouse (they read
``<warehouse>``). Every request, refused or not, is counted (Prometheus), access-logged as
one JSON line, and every refused or failed write also audited. Bodies over
``max_request_bytes`` are refused before they are read when they announce their length, and
the bodies held at once are bounded (:mod:`icefloe.runtime.byte_budget`).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Awaitable, Callable, Collection

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram

from icefloe.errors import (
    FileIOError,
    IcefloeError,
    InvalidFileError,
    NotFoundError,
    ValidationError,
)
from icefloe.io.fileio import parse_location
from icefloe.planner.auth import audit, principal_of, write_operation
from icefloe.planner.config import PlannerConfig
from icefloe.planner.errors import ApiError, bad_request, error_response
from icefloe.planner.plan_request import TOO_DEEP
from icefloe.runtime.byte_budget import ByteBudget
from icefloe.runtime.logs import log_access

log = logging.getLogger(__name__)

# Request bodies of the largest size (ICEFLOE_PLANNER_MAX_REQUEST_BYTES) held at once; small
# bodies (a selective filter is a few hundred bytes) share the same bytes by the thousand.
BODIES_IN_FLIGHT = 16

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class RequestMiddleware:
    """The middleware (``app.middlewares``) of one planner: its request metrics live in the
    service's registry, so one instance serves every app the service builds."""

    def __init__(
        self,
        config: PlannerConfig,
        registry: CollectorRegistry,
        private_roots: list[str],
    ) -> None:
        self.config = config
        # Spellings of the warehouse (and allowed locations) that messages must not show.
        self.private_roots = private_roots
        # Request bodies in memory at once: the body limit for each of a few dozen requests.
        self._bodies = ByteBudget(BODIES_IN_FLIGHT * config.max_request_bytes)
        self._requests = Counter(
            "icefloe_planner_requests",
            "REST requests by route, method and status",
            ["route", "method", "status"],
            registry=registry,
        )
        self._latency = Histogram(
            "icefloe_planner_request_seconds",
            "REST request latency by route",
            ["route"],
            registry=registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
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
            error = bad_request(TOO_DEEP)
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
        for root in self.private_roots:
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


def private_roots(locations: Collection[str]) -> list[str]:
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
