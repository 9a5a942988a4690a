"""The planner with the REST catalog's write routes on a real port, for synchronous clients.

PyIceberg's and DuckDB's clients block, so the server runs on its own event loop in a thread,
over a file-system catalog or (marked integration) a Redis catalog on the session's
redis-server. One server per test module; tests keep apart by using their own namespaces.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from icefloe.catalog.fs import FileSystemCatalog
from icefloe.catalog.uri import load_catalog
from icefloe.cli.scan import task_rows
from icefloe.io.fileio import LocalFileIO
from icefloe.manifests.cache import ManifestCache
from icefloe.planner.app import PlannerService
from icefloe.planner.config import PlannerConfig
from icefloe.planner.write_config import RestCatalogSettings
from icefloe.scan.planning import plan_scan
from icefloe.table.catalog import Catalog

WRITE = "writer-token-pyiceberg"
READ = "reader-token-pyiceberg"


@dataclass
class Server:
    url: str
    catalog_uri: str
    warehouse: Path
    loop: asyncio.AbstractEventLoop
    service: PlannerService

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    @property
    def catalog(self) -> Catalog:
        return self.service.catalog


def catalog_uri(kind: str, warehouse: Path, request: pytest.FixtureRequest) -> str:
    if kind == "fs":
        return f"file://{warehouse}"
    redis = request.getfixturevalue("redis_server")
    return f"{redis}?warehouse={warehouse}&prefix=py{uuid.uuid4().hex[:8]}"


@pytest.fixture(
    name="server",
    scope="module",
    params=["fs", pytest.param("redis", marks=pytest.mark.integration)],
)
def server_fixture(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    warehouse = tmp_path_factory.mktemp(f"rest-{request.param}")
    uri = catalog_uri(str(request.param), warehouse, request)
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    holder: dict[str, Any] = {}

    def run() -> None:
        asyncio.set_event_loop(loop)

        async def start() -> None:
            config = PlannerConfig(catalog=uri, host="127.0.0.1", port=0, refresh_interval_ms=200)
            if uri.startswith("file://"):
                catalog: Catalog = FileSystemCatalog("rest", str(warehouse), LocalFileIO())
            else:
                catalog = load_catalog(uri)
            settings = RestCatalogSettings(
                read_tokens=f"rita={READ}", write_tokens=f"pyiceberg={WRITE}"
            )
            service = PlannerService(config, catalog, rest=settings)
            await service.start()
            holder["service"] = service

        loop.run_until_complete(start())
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=run, name="planner-for-pyiceberg-writes", daemon=True)
    thread.start()
    ready.wait()
    service: PlannerService = holder["service"]
    yield Server(service.url, uri, warehouse, loop, service)

    async def stop() -> None:
        await service.stop()
        await service.catalog.close()

    asyncio.run_coroutine_threadsafe(stop(), loop).result()
    loop.call_soon_threadsafe(loop.stop)
    thread.join()
    loop.close()


def rest_catalog(server: Server, token: str = WRITE, **props: str) -> Any:
    from pyiceberg.catalog.rest import RestCatalog

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PyIceberg's notice about oauth2-server-uri
        return RestCatalog("icefloe", uri=server.url, token=token, **props)


async def icefloe_rows(
    catalog: Catalog, name: str, columns: Sequence[str] = ("id", "cat")
) -> list[dict[str, Any]]:
    """The rows as icefloe itself reads them from the catalog: plan, then read each task."""
    table = await catalog.load_table(name)
    if table.metadata.current_snapshot() is None:
        return []
    plan = await plan_scan(table.metadata, ManifestCache(table.io))
    out: list[dict[str, Any]] = []
    for task in plan.tasks():
        out.extend(await task_rows(table.io, plan, task))
    return sorted(({k: r[k] for k in columns} for r in out), key=lambda r: r["id"])
