"""One logging setup for every service: JSON or text lines, and the same HTTP access log."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from icefloe.coordinator.config import CoordinatorConfig
from icefloe.errors import ValidationError
from icefloe.planner.config import PlannerConfig
from icefloe.runtime.http import ServiceHttp
from icefloe.runtime.logs import JsonLogFormatter, configure_logging


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def test_json_lines_carry_the_extra_fields(
    restore_logging: None, capsys: pytest.CaptureFixture[str]
) -> None:
    configure_logging("debug", "json")
    logging.getLogger("icefloe.test").info("committed %s", "db.t", extra={"snapshot_id": 7})
    line = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert line["level"] == "info" and line["logger"] == "icefloe.test"
    assert line["msg"] == "committed db.t" and line["snapshot_id"] == 7
    assert logging.getLogger().level == logging.DEBUG
    assert logging.getLogger("aiokafka").level == logging.WARNING


def test_text_lines_are_for_people(
    restore_logging: None, capsys: pytest.CaptureFixture[str]
) -> None:
    configure_logging("WARNING", "text")
    logging.getLogger("icefloe.test").info("not shown")
    logging.getLogger("icefloe.test").warning("shown")
    err = capsys.readouterr().err
    assert "not shown" not in err and "WARNING icefloe.test: shown" in err


def test_every_service_names_its_log_settings_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    coordinator = CoordinatorConfig.load({"catalog": "file:///w", "log_level": "debug"})
    planner = PlannerConfig.load({"catalog": "file:///w", "log_format": "text"})
    assert (coordinator.log_level, coordinator.log_format) == ("DEBUG", "json")
    assert (planner.log_level, planner.log_format) == ("INFO", "text")
    with pytest.raises(ValidationError, match=r"setting ICEFLOE_LOG_LEVEL: .*unknown log level"):
        CoordinatorConfig.load({"catalog": "file:///w", "log_level": "loud"})
    with pytest.raises(ValidationError, match="setting ICEFLOE_PLANNER_LOG_FORMAT: "):
        PlannerConfig.load({"catalog": "file:///w", "log_format": "xml"})


async def test_the_health_server_logs_each_request_like_the_planner(
    caplog: pytest.LogCaptureFixture,
) -> None:
    http = ServiceHttp(CollectorRegistry(), ready=lambda: False, host="127.0.0.1", port=0)
    await http.start()
    try:
        with caplog.at_level(logging.INFO, logger="icefloe.access"):
            async with aiohttp.ClientSession() as session:
                for path in ("/healthz", "/readyz", "/nowhere"):
                    async with session.get(http.url + path) as response:
                        await response.read()
    finally:
        await http.stop()
    records = [r for r in caplog.records if r.name == "icefloe.access"]
    lines = [json.loads(JsonLogFormatter().format(r)) for r in records]
    assert [(x["path"], x["status"]) for x in lines] == [
        ("/healthz", 200),
        ("/readyz", 503),
        ("/nowhere", 404),
    ]
    assert lines[0]["route"] == "/healthz" and lines[2]["route"] == "unmatched"
    assert all(x["method"] == "GET" and x["ms"] >= 0 for x in lines)


async def test_the_access_log_can_be_turned_off(caplog: pytest.LogCaptureFixture) -> None:
    registry = CollectorRegistry()
    http = ServiceHttp(registry, ready=lambda: True, host="127.0.0.1", port=0, access_log=False)
    await http.start()
    try:
        with caplog.at_level(logging.INFO, logger="icefloe.access"):
            async with aiohttp.ClientSession() as session, session.get(http.url + "/healthz"):
                pass
    finally:
        await http.stop()
    assert not [r for r in caplog.records if r.name == "icefloe.access"]
