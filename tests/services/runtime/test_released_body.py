"""Responses drop their body once written, so idle keep-alive connections hold no pages."""

from __future__ import annotations

from aiohttp import ClientSession, web
from aiohttp.test_utils import TestServer

from icefloe.runtime.released_body import json_bytes_response


async def test_a_sent_body_is_released_while_the_connection_stays_open() -> None:
    sent: list[web.Response] = []
    body = b'{"pages":"' + b"x" * (2 << 20) + b'"}'

    async def page(request: web.Request) -> web.Response:
        response = json_bytes_response(body)
        sent.append(response)
        return response

    app = web.Application()
    app.router.add_get("/page", page)
    server = TestServer(app)
    await server.start_server()
    try:
        async with ClientSession() as session:  # one pooled keep-alive connection
            for _ in range(3):
                async with session.get(server.make_url("/page")) as r:
                    assert r.status == 200
                    assert r.content_type == "application/json"
                    assert await r.read() == body
            # The connection is idle and open; aiohttp's loop still refers to the last
            # response, which no longer holds its two megabytes.
            assert len(sent) == 3
            assert all(s.body is None for s in sent)
            assert all(s.body_length >= len(body) for s in sent)  # it was all written
    finally:
        await server.close()
