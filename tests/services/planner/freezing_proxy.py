"""A TCP proxy that stops a client's traffic at the first request holding a marker.

Put between a planner process and its Redis catalog, it stops the planner at an exact point
of a request: the first command that holds ``marker`` (the store of an idempotent answer,
the pointer swap's script) is never forwarded, nor is anything after it, so the process
can be killed there knowing what the store has and has not seen. No hook in the planner.
"""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import urlsplit

from icefloe.dev.local_stack import free_port


class FreezingProxy:
    def __init__(self, upstream_url: str) -> None:
        parts = urlsplit(upstream_url)
        self.host, self.upstream_port = parts.hostname or "127.0.0.1", parts.port or 6379
        self.scheme = parts.scheme
        self.port = free_port()
        self.marker: bytes | None = None
        self.frozen = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def arm(self, marker: bytes) -> None:
        """Freeze every connection from the first client write that holds ``marker``."""
        self.marker = marker

    async def __aenter__(self) -> FreezingProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await task

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(self.host, self.upstream_port)
        for task in (
            asyncio.create_task(self._pump(reader, up_writer, upstream=True)),
            asyncio.create_task(self._pump(up_reader, writer, upstream=False)),
        ):
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, upstream: bool
    ) -> None:
        try:
            while chunk := await reader.read(65536):
                if upstream and self.marker is not None and self.marker in chunk:
                    self.frozen.set()
                if upstream and self.frozen.is_set():
                    continue  # swallowed: the store never sees it
                writer.write(chunk)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()
