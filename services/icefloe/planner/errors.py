"""The REST error model the planner and its write routes answer with."""

from __future__ import annotations

from aiohttp import web


class ApiError(Exception):
    """An error answered in the REST error model."""

    def __init__(self, code: int, error_type: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.error_type = error_type
        self.message = message


def bad_request(message: str) -> ApiError:
    """A 400 ``BadRequestException``: the client sent something malformed."""
    return ApiError(400, "BadRequestException", message)


def error_response(code: int, error_type: str, message: str, *, head: bool = False) -> web.Response:
    if head:
        return web.Response(status=code)
    body = {"error": {"message": message, "type": error_type, "code": code}}
    return web.json_response(body, status=code)
