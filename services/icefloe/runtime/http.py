"""The small HTTP side of every icefloe service: ``/healthz``, ``/readyz`` and ``/metrics``.

Orchestrators need to tell "the process is alive" (restart it if not) from "the process can
take traffic" (route to it only if so): the coordinator, for instance, is alive long before
it has joined its consumer group. Each service passes its own checks as callables, so this
module knows nothing about Kafka or catalogs. Metrics come from the service's own
prometheus_client registry, never the global one, so several services (or tests) in one
process do not mix their series. Each request gets one access-log line
(:func:`icefloe.runtime.logs.log_access`), as on every icefloe HTTP server.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from icefloe.runtime.logs import log_access

log = logging.getLogger(__name__)

Check = Callable[[], bool]


def _always() -> bool:
    return True


class ServiceHttp:
    """An aiohttp server for the three endpoints; ``port=0`` binds a free port."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        ready: Check,
        healthy: Check = _always,
        host: str = "0.0.0.0",
        port: int = 0,
        detail: Callable[[], str] | None = None,
        access_log: bool = True,
    ) -> None:
        self.registry = registry
        self.access_log = access_log
        self.ready = ready
        self.detail = detail  # extra lines for /readyz (what an operator should look at)
        self.healthy = healthy
        self.host = host
        self.port = port
        self._runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        app = web.Application(middlewares=[_access_log] if self.access_log else [])
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/metrics", self._metrics)
        return app

    async def start(self) -> None:
        runner = web.AppRunner(self.app(), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port)
        await site.start()
        self._runner = runner
        for address in runner.addresses:
            if isinstance(address, tuple) and len(address) >= 2:
                self.port = int(address[1])
                break
        log.info("serving /healthz, /readyz and /metrics on %s:%d", self.host, self.port)

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"http://{host}:{self.port}"

    async def _healthz(self, request: web.Request) -> web.Response:
        ok = _safe(self.healthy)
        return web.Response(status=200 if ok else 503, text="ok\n" if ok else "unhealthy\n")

    async def _readyz(self, request: web.Request) -> web.Response:
        ok = _safe(self.ready)
        text = "ready\n" if ok else "not ready\n"
        if self.detail is not None:
            try:
                text += self.detail()
            except Exception:
                log.exception("readiness detail failed")
        return web.Response(status=200 if ok else 503, text=text)

    async def _metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


@web.middleware
async def _access_log(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    started = time.perf_counter()
    status = 500
    size: int | None = None
    try:
        response = await handler(request)
        status, size = response.status, response.content_length
        return response
    except web.HTTPException as e:
        status, size = e.status, e.content_length
        raise
    finally:
        log_access(request, status, time.perf_counter() - started, size)


def _safe(check: Check) -> bool:
    """A check that raises counts as failing, and the reason is logged, not served."""
    try:
        return bool(check())
    except Exception:
        log.exception("health check failed")
        return False
