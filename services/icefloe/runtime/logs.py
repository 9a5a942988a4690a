"""Logging for every icefloe process: one setup, JSON lines by default, and HTTP access logs.

Services and long-running commands call :func:`configure_logging` once with their
``log_level`` and ``log_format`` settings (``--log-level``, ``--log-format``; the same
names in every service). ``json`` writes one object a line to stderr, as log collectors
expect: ``ts``, ``level``, ``logger``, ``msg``, any ``extra`` fields, and ``exc`` with the
traceback; ``text`` writes a line a person reads.

Every HTTP server logs its requests the same way (:func:`log_access`): one line per request
on the ``icefloe.access`` logger, its fields (method, path, route, status, ms, bytes,
remote) as ``extra`` fields, so a JSON line carries them at its top level.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Annotated, Any, Literal, TextIO

from aiohttp import web
from pydantic import AfterValidator

LogFormat = Literal["json", "text"]
LOG_FORMATS: tuple[LogFormat, ...] = ("json", "text")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LOG_LEVEL_HELP = "log level: " + ", ".join(LOG_LEVELS)
LOG_FORMAT_HELP = "log lines: json (one object a line, for collectors) or text"
ACCESS_LOG_HELP = "one line per HTTP request on the icefloe.access logger"
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
ACCESS_LOGGER = "icefloe.access"

access_log = logging.getLogger(ACCESS_LOGGER)

_STANDARD_ATTRS = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
}

_QUIET = ("aiokafka", "aiohttp.access", "py4j")
"""Chatty libraries, held at WARNING unless the level asked for is higher."""


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message and the ``extra`` fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD_ATTRS and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def check_level(level: str) -> str:
    """``level`` in upper case, or a ValueError naming the levels there are."""
    upper = level.strip().upper()
    if upper not in LOG_LEVELS:
        raise ValueError(f"unknown log level {level!r}; use one of {', '.join(LOG_LEVELS)}")
    return upper


LogLevel = Annotated[str, AfterValidator(check_level)]
"""A settings field holding a log level (any case; kept in upper case)."""


class _IcefloeHandler(logging.StreamHandler[TextIO]):
    """The handler :func:`configure_logging` installs (and replaces when called again)."""


def configure_logging(level: str = "INFO", log_format: LogFormat = "json") -> None:
    """Send every logger's records to stderr, as JSON lines or text, from ``level`` up.

    Called again, it replaces its own handler; handlers others installed stay.
    """
    handler = _IcefloeHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonLogFormatter())
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [h for h in root.handlers if not isinstance(h, _IcefloeHandler)]
    root.addHandler(handler)
    root.setLevel(check_level(level))
    for name in _QUIET:
        logging.getLogger(name).setLevel(max(root.level, logging.WARNING))


def add_log_arguments(parser: argparse.ArgumentParser, log_format: LogFormat = "text") -> None:
    """``--log-level`` and ``--log-format`` for a command without a settings class (the
    services get theirs, with environment variables, from their settings)."""
    parser.add_argument("--log-level", type=check_level, default="INFO", help=LOG_LEVEL_HELP)
    parser.add_argument(
        "--log-format", choices=LOG_FORMATS, default=log_format, help=LOG_FORMAT_HELP
    )


def log_access(request: web.Request, status: int, elapsed_s: float, size: int | None) -> None:
    """One access-log line for a request answered with ``status`` after ``elapsed_s``."""
    if not access_log.isEnabledFor(logging.INFO):
        return
    resource = request.match_info.route.resource
    route = resource.canonical if resource is not None else "unmatched"
    ms = round(elapsed_s * 1000, 3)
    path = request.path[:256]
    access_log.info(
        "%s %s %d %.1f ms",
        request.method,
        path,
        status,
        ms,
        extra={
            "method": request.method,
            "path": path,
            "route": route,
            "status": status,
            "ms": ms,
            "bytes": size,
            "remote": request.remote,
        },
    )


__all__ = [
    "ACCESS_LOGGER",
    "ACCESS_LOG_HELP",
    "LOG_FORMATS",
    "LOG_FORMAT_HELP",
    "LOG_LEVELS",
    "LOG_LEVEL_HELP",
    "JsonLogFormatter",
    "LogFormat",
    "LogLevel",
    "add_log_arguments",
    "check_level",
    "configure_logging",
    "log_access",
]
