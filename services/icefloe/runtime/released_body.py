"""A response that lets go of its body once it is written.

aiohttp's connection loop keeps the last response of a keep-alive connection in a local
variable while it waits for that connection's next request (until the keep-alive timeout,
75 s by default). For the planner that is a page of a full plan, megabytes of JSON, per idle
connection: measured on a 100k-file table, each full plan asked over a pooled connection
left its 1.3 MB first page resident, about 1.3 MiB more RSS per plan request and not freed
when the plan was, so memory grew with the number of client connections rather than with
anything the planner counts. Dropping the body after the last byte is handed to the
transport makes a response's memory last as long as its sending.
"""

from __future__ import annotations

from aiohttp import web


class ReleasedBodyResponse(web.Response):
    """A :class:`aiohttp.web.Response` whose body is dropped once written (see the module
    docstring); headers and status stay, so logs and middlewares see the same response."""

    async def write_eof(self, data: bytes = b"") -> None:
        try:
            await super().write_eof(data)
        finally:
            self.body = None


def json_bytes_response(body: bytes) -> web.Response:
    """An ``application/json`` response of ready-made UTF-8 JSON text, released once sent."""
    return ReleasedBodyResponse(body=body, content_type="application/json")
