"""The Grafana dashboard and Prometheus alert rules the chart ships, against the real services.

Operators look at these rather than read the services' code, so a query naming a metric the
services do not export would show an empty panel, or an alert that can never fire, without
anyone noticing. These tests start the coordinator and the planner as the chart runs them
(``icefloe coordinator``, ``icefloe planner``, as processes, against the session's tansu
broker and a file catalog), scrape ``/metrics`` and check every metric name in every
dashboard query and alert expression against what they export. The rules also pass
``promtool check rules`` and their unit tests (``promtool test rules``), with the promtool
binary of Debian's ``prometheus`` package that ``deploy/setup.sh`` puts in ``.tools/bin``.
The metrics page of the documentation must list exactly the exported metrics.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from servers import ServerProcess, probe_http, start_server

REPO_ROOT = Path(__file__).resolve().parent.parent
FILES = REPO_ROOT / "helm" / "icefloe" / "files"
RULES = FILES / "prometheus-rules.yaml"
RULE_TESTS = FILES / "prometheus-rules.test.yaml"
DASHBOARD = FILES / "grafana-dashboard.json"
METRICS_PAGE = REPO_ROOT / "docs" / "operations" / "metrics.md"


def promtool() -> str:
    local = REPO_ROOT / ".tools" / "bin" / "promtool"
    found = str(local) if local.exists() else shutil.which("promtool")
    assert found, "promtool is missing: `make setup` installs it into .tools/bin"
    return found


# -- PromQL: which metric names an expression reads -----------------------------------------

# Functions and aggregations are followed by "(", so they are told apart by that; these
# words are PromQL's operators and modifiers.
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring"}
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENTIFIER = re.compile(r"(?<![\w$.])([A-Za-z_:][A-Za-z0-9_:]*)(\s*\()?")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (label values and functions left out)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)  # strings
    text = re.sub(r"\{[^{}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\[\]]*\]", " ", text)  # range and subquery durations
    text = _GROUPING.sub(" ", text)
    names = set()
    for match in _IDENTIFIER.finditer(text):
        word, call = match[1], match[2]
        if call is None and word not in _KEYWORDS:
            names.add(word)
    return names


def test_metric_names_are_read_from_promql() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (namespace, le) (rate(a_bucket{x=~"y|z",'
        'le!="1"}[$__rate_interval]))) > 2 and on (pod) max without (t) (b) / ignoring(q) '
        'group_left(r) c offset 5m unless bool_thing{a="sum(d)"} > 64 * 1024'
    )
    assert metric_names(expr) == {"a_bucket", "b", "c", "bool_thing"}


def rule_expressions() -> list[tuple[str, str]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [(rule["alert"], rule["expr"]) for group in groups for rule in group["rules"]]


def dashboard_expressions() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    found = [
        (panel["title"], target["expr"])
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
    ]
    for variable in dashboard["templating"]["list"]:
        query = variable.get("definition") or ""
        match = re.fullmatch(r"label_values\((\w+),\s*\w+\)", query)
        if query:
            assert match, f"variable {variable['name']}: unexpected query {query!r}"
            found.append((f"variable {variable['name']}", match[1]))
    return found


# -- the services' own /metrics ---------------------------------------------------------------


def exported_series(exposition: str) -> dict[str, str]:
    """Series names a Prometheus scraping this text can query -> the family's type.

    Labelled metrics with no child yet have no sample, only ``# TYPE``, so the series are
    derived from the type the way Prometheus names them.
    """
    series: dict[str, str] = {}
    for line in exposition.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            if kind == "histogram":
                for suffix in ("_bucket", "_count", "_sum", "_created"):
                    series[name + suffix] = kind
            elif kind == "summary":
                for suffix in ("", "_count", "_sum", "_created"):
                    series[name + suffix] = kind
            elif kind == "counter":
                series[name] = kind
                series[name.removesuffix("_total") + "_created"] = kind
            else:
                series.setdefault(name, kind)
        elif line and not line.startswith("#"):
            series.setdefault(re.split(r"[{ ]", line, maxsplit=1)[0], "sample")
    return series


def documented_families(exposition: str) -> dict[str, str]:
    """The families of the exposition as the metrics page names them (``_created`` aside)."""
    families = {}
    for line in exposition.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            families[name] = kind
    return {
        name: kind
        for name, kind in families.items()
        if not (name.endswith("_created") and kind == "gauge")
    }


def _service(name: str, args: list[str], env: dict[str, str], log_dir: Path) -> ServerProcess:
    return start_server(
        name,
        lambda port: [sys.executable, "-m", "icefloe.cli", *args, str(port)],
        probe_http,
        env=env,
        log_dir=log_dir,
    )


def _get(port: int, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as response:
        return str(response.read().decode())


@pytest.fixture(scope="module")
def exposition(kafka_broker: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Both services' ``/metrics``, concatenated, once the coordinator joined its group."""
    work = tmp_path_factory.mktemp("monitoring")
    run = uuid.uuid4().hex[:8]
    catalog = f"file://{work}/warehouse"
    common = {"ICEFLOE_LOG_FORMAT": "text", "ICEFLOE_PLANNER_LOG_FORMAT": "text"}
    coordinator_env = {
        **common,
        "ICEFLOE_CATALOG": catalog,
        "ICEFLOE_BROKERS": kafka_broker,
        "ICEFLOE_EVENTS_TOPIC": f"monitoring-{run}.events",
        "ICEFLOE_RESULTS_TOPIC": f"monitoring-{run}.results",
        "ICEFLOE_DEAD_LETTER_TOPIC": f"monitoring-{run}.dead-letter",
        "ICEFLOE_MAINTENANCE_TOPIC": f"monitoring-{run}.maintenance",
        "ICEFLOE_GROUP_ID": f"monitoring-{run}",
        "ICEFLOE_TOPIC_PARTITIONS": "1",
        "ICEFLOE_HTTP_HOST": "127.0.0.1",
        # With the planner's disk cache the coordinator also exports its cache fills.
        "ICEFLOE_PLANNER_CACHE_DIR": str(work / "planner-cache"),
    }
    planner_env = {
        **common,
        "ICEFLOE_PLANNER_CATALOG": catalog,
        "ICEFLOE_PLANNER_BROKERS": kafka_broker,
        "ICEFLOE_PLANNER_RESULTS_TOPIC": f"monitoring-{run}.results",
        "ICEFLOE_PLANNER_HOST": "127.0.0.1",
    }
    coordinator = _service("coordinator", ["coordinator", "--http-port"], coordinator_env, work)
    try:
        planner = _service("planner", ["planner", "--port"], planner_env, work)
        try:
            _wait_ready(coordinator)
            yield _get(coordinator.port, "/metrics") + _get(planner.port, "/metrics")
        finally:
            planner.stop()
    finally:
        coordinator.stop()


def _wait_ready(service: ServerProcess) -> None:
    """Until /readyz says ready (the coordinator: joined its group, topics created)."""
    while True:
        try:
            _get(service.port, "/readyz")
            return
        except OSError:
            time.sleep(0.2)


# -- the tests -----------------------------------------------------------------------------


def test_rules_pass_promtool_check() -> None:
    result = subprocess.run(
        [promtool(), "check", "rules", str(RULES)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rule_expressions())} rules found" in result.stdout


def test_rules_pass_their_unit_tests() -> None:
    result = subprocess.run(
        [promtool(), "test", "rules", RULE_TESTS.name],
        capture_output=True,
        text=True,
        cwd=FILES,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    tested = {
        case["alertname"]
        for group in yaml.safe_load(RULE_TESTS.read_text())["tests"]
        for case in group["alert_rule_test"]
    }
    assert tested <= {alert for alert, _ in rule_expressions()}


def test_every_alert_says_what_to_do() -> None:
    for alert, _ in rule_expressions():
        rule = next(
            r
            for g in yaml.safe_load(RULES.read_text())["groups"]
            for r in g["rules"]
            if r["alert"] == alert
        )
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, alert
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], alert


def test_dashboard_is_a_grafana_dashboard() -> None:
    dashboard: dict[str, Any] = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"] == "icefloe"
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["targets"], panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}"
        for target in panel["targets"]:
            for used in re.findall(r"\$(\w+)", target["expr"]):
                assert used in variables or used.startswith("__"), (panel["title"], used)


@pytest.mark.integration
def test_every_query_names_an_exported_metric(exposition: str) -> None:
    exported = exported_series(exposition)
    queries = [*rule_expressions(), *dashboard_expressions()]
    assert len(queries) > 40
    for where, expr in queries:
        names = metric_names(expr)
        assert names, f"{where}: no metric in {expr!r}"
        unknown = names - exported.keys()
        assert not unknown, f"{where}: {sorted(unknown)} are not exported by the services"


@pytest.mark.integration
def test_the_dashboard_shows_every_kind_of_metric(exposition: str) -> None:
    """Each exported family is on the dashboard, so nothing the services say goes unseen."""
    shown = {name for _, expr in dashboard_expressions() for name in metric_names(expr)}
    exported = exported_series(exposition)
    for family, kind in documented_families(exposition).items():
        series = {name for name in exported if name == family or name.startswith(family + "_")}
        if kind == "counter":
            series = {family}
        assert series & shown, f"{family} ({kind}) is on no dashboard panel"


@pytest.mark.integration
def test_the_metrics_page_lists_exactly_the_exported_metrics(exposition: str) -> None:
    page = METRICS_PAGE.read_text()
    listed = dict(re.findall(r"^\| `(icefloe_\w+)` \| (\w+) \|", page, re.MULTILINE))
    exported = documented_families(exposition)
    assert listed.keys() - exported.keys() == set(), "documented but not exported"
    assert exported.keys() - listed.keys() == set(), "exported but not documented"
    for name, kind in exported.items():
        assert listed[name] == kind, f"{name} is a {kind}, the page says {listed[name]}"
