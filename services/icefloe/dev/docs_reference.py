"""The reference pages of the documentation site, generated from the code when it is built.

An operator's guide that lists settings by hand drifts the day someone adds one. So the
tables of ``docs/operations/settings.md``, ``docs/operations/helm-values.md`` and the table
properties of ``docs/concepts/maintenance.md`` (from
:data:`icefloe.table.maintenance_policy.PROPERTIES`) are written here, at build time, from what
the code really reads: each service's pydantic settings
model (name, environment variable, default, description), the command line the service
derives from it (:func:`icefloe.runtime.settings.add_arguments`, so the flag column is the
parser's own), and the chart's ``values.yaml`` (defaults and the comments above each key)
with ``values.schema.json`` (types, enumerations, bounds).

A page asks for a table with a line of its own, ``<!-- generated: NAME -->``, which
:func:`on_page_markdown` (an MkDocs hook, named in ``mkdocs.yml``) replaces; an unknown
NAME fails the build. ``tests/test_docs.py`` checks that every setting and every chart value
appears on the built pages.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml  # type: ignore[import-untyped]
from pydantic_settings import BaseSettings

from icefloe.coordinator import config as coordinator_config
from icefloe.planner import config as planner_config
from icefloe.planner import write_config
from icefloe.runtime import settings as settings_flags
from icefloe.spark import config as spark_config
from icefloe.table import maintenance_policy

REPO_ROOT = Path(__file__).resolve().parents[3]
CHART = REPO_ROOT / "helm" / "icefloe"

MARKER = re.compile(r"^<!-- generated: ([a-z][a-z-]*) -->$", re.MULTILINE)


# -- settings of the services ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Setting:
    """One row of a settings table."""

    name: str
    environment: str
    flag: str  # the command-line flag(s) or Spark key, or "" when there is none
    default: str
    description: str


@dataclass(frozen=True, slots=True)
class SettingsSource:
    """A settings model and how its service lets an operator set each field."""

    title: str
    model: type[BaseSettings]
    env_prefix: str
    flag_column: str  # "flag", "Spark key" or "" (environment only)
    flags: Callable[[str], str]


def _parser_flags(
    add_arguments: Callable[[argparse.ArgumentParser], None],
) -> Callable[[str], str]:
    """Field name -> its flags, read from the parser the service itself builds."""
    parser = argparse.ArgumentParser(add_help=False)
    add_arguments(parser)
    by_dest = {
        action.dest: " / ".join(action.option_strings)
        for action in parser._actions
        if action.option_strings
    }
    return lambda name: by_dest.get(name, "")


def _spark_key(name: str) -> str:
    return spark_config.SPARK_CONF_PREFIX + name.replace("_", "-")


def settings_sources() -> list[SettingsSource]:
    """Every settings model a deployment configures, in the order the guide shows them."""
    return [
        SettingsSource(
            "Coordinator (`icefloe coordinator`)",
            coordinator_config.CoordinatorConfig,
            coordinator_config.ENV_PREFIX,
            "flag",
            _parser_flags(coordinator_config.add_arguments),
        ),
        SettingsSource(
            "Planner (`icefloe planner`)",
            planner_config.PlannerConfig,
            planner_config.ENV_PREFIX,
            "flag",
            _parser_flags(planner_config.add_arguments),
        ),
        SettingsSource(
            "REST catalog write side (in `icefloe planner`)",
            write_config.RestCatalogSettings,
            write_config.ENV_PREFIX,
            "",
            lambda name: "",
        ),
        SettingsSource(
            "Spark jobs (`icefloe.spark`)",
            spark_config.SparkConfig,
            str(spark_config.SparkConfig.model_config.get("env_prefix", "")),
            "Spark key",
            lambda name: (
                ""
                if settings_flags.is_secret(spark_config.SparkConfig.model_fields[name])
                else _spark_key(name)
            ),
        ),
    ]


# What the settings models do not describe yet, by environment variable, for the settings
# page only. A setting that gains a description in its model must leave this table: the test
# (tests/test_docs.py) fails on an entry for a described or unknown setting, so the page has
# one source per setting. Better still: move these into the models' Field descriptions,
# where `--help` shows them too.
UNDESCRIBED: dict[str, str] = {
    "ICEFLOE_EVENTS_TOPIC": "topic writers publish files-written and commit-requested "
    "events to, keyed by table",
    "ICEFLOE_RESULTS_TOPIC": "topic the coordinator announces table-committed events on",
    "ICEFLOE_DEAD_LETTER_TOPIC": "topic refused events go to, each with its original bytes "
    "and the reason",
    "ICEFLOE_GROUP_ID": "Kafka consumer group the coordinator replicas form",
    "ICEFLOE_CREATE_TOPICS": "create missing topics at start-up (needs the Kafka ACL to "
    "create topics)",
    "ICEFLOE_TOPIC_PARTITIONS": "partitions of the topics it creates; the events topic's "
    "partitions bound how many replicas share the tables",
    "ICEFLOE_TOPIC_REPLICATION_FACTOR": "replication factor of the topics it creates",
    "ICEFLOE_SESSION_TIMEOUT_MS": "consumer group session timeout: a replica silent this long "
    "loses its partitions to the others",
    "ICEFLOE_BATCH_MAX_FILES": "a table's ready commits become one snapshot once this many "
    "files are pending (table property icefloe.batch.max-files overrides it)",
    "ICEFLOE_BATCH_MAX_BYTES": "... or this many bytes (table property icefloe.batch.max-bytes)",
    "ICEFLOE_BATCH_MAX_WAIT_MS": "... or once the oldest has waited this long (table property "
    "icefloe.batch.max-wait-ms)",
    "ICEFLOE_FILE_CHECK_CONCURRENCY": "data files checked at once (with check_files)",
    "ICEFLOE_MAINTENANCE_TOPIC": "topic compaction-candidates messages are announced on",
    "ICEFLOE_HTTP_HOST": "address of the /healthz, /readyz and /metrics server",
    "ICEFLOE_OFFSET_COMMIT_INTERVAL_MS": "how often Kafka offsets are committed (never past "
    "an event whose commit is not yet announced)",
    "ICEFLOE_MAX_INFLIGHT_EVENTS": "events read but not yet done, above which consuming pauses",
    "ICEFLOE_SHUTDOWN_TIMEOUT_MS": "on SIGTERM, how long tables may take to commit what is "
    "ready before the coordinator exits anyway",
    "ICEFLOE_PLANNER_MANIFEST_LOAD_CONCURRENCY": "manifests read and decoded at once",
    "ICEFLOE_PLANNER_HOST": "address the REST server binds",
    "ICEFLOE_PLANNER_RESULTS_TOPIC": "the coordinator's results topic, followed to refresh "
    "tables as soon as they are committed",
    "ICEFLOE_WRITER_ID": "names the writer in its files-written events",
    "ICEFLOE_PLANNER_TIMEOUT_S": "how long a read waits for the planner: a request, a plan "
    "to complete, or the table's newest snapshot to become visible",
}


def _human(name: str, value: Any) -> str:
    """A default as written in the environment, with a readable size or duration beside it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    text = str(value)
    if isinstance(value, int) and value > 0:
        if name.endswith("_bytes") and value >= 1024:
            for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
                if value % size == 0:
                    return f"{text} ({value // size} {unit})"
        if name.endswith("_ms") and value >= 1000 and value % 1000 == 0:
            seconds = value // 1000
            for unit, size in (("d", 86400), ("h", 3600), ("min", 60), ("s", 1)):
                if seconds % size == 0:
                    return f"{text} ({seconds // size} {unit})"
    return text


def _default(name: str, info: Any) -> str:
    if info.is_required():
        return "**required**"
    if info.default is None:
        return "unset"
    return f"`{_human(name, info.default)}`" if info.default != "" else '`""`'


def _description(info: Any, environment: str) -> str:
    text = info.description or UNDESCRIBED.get(environment, "")
    if settings_flags.is_secret(info):
        text += (
            "; a secret: from the environment or a file of the variable's name in "
            f"`{settings_flags.SECRETS_DIR_ENV}`, never a flag"
        )
    choices = _literal_choices(info.annotation)
    if choices:
        text += "; one of " + ", ".join(f"`{c}`" for c in choices)
    return text.strip("; ")


def _literal_choices(annotation: Any) -> list[Any]:
    """The values of a ``Literal[...]`` annotation, also inside ``Literal[...] | None``."""
    if get_origin(annotation) is Literal:
        return list(get_args(annotation))
    return [c for arg in get_args(annotation) for c in _literal_choices(arg)]


def settings_rows(source: SettingsSource) -> Iterator[Setting]:
    for name, info in source.model.model_fields.items():
        environment = f"{source.env_prefix}{name.upper()}"
        yield Setting(
            name=name,
            environment=environment,
            flag=source.flags(name),
            default=_default(name, info),
            description=_description(info, environment),
        )


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def settings_table(source: SettingsSource) -> str:
    head = ["setting", "environment variable"]
    if source.flag_column:
        head.append(source.flag_column)
    head += ["default", "description"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in settings_rows(source):
        cells = [f"`{row.name}`", f"`{row.environment}`"]
        if source.flag_column:
            cells.append(f"`{row.flag}`" if row.flag else "—")
        cells += [row.default, _cell(row.description)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def settings_page() -> str:
    """Every settings table, one section per model."""
    parts = []
    for source in settings_sources():
        parts += [f"## {source.title}", "", settings_table(source), ""]
    return "\n".join(parts)


# -- the Helm chart's values ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ChartValue:
    """One key of values.yaml (a leaf, or a mapping the file comments on)."""

    path: str
    type: str
    default: str
    description: str


_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][A-Za-z0-9_.-]*):(?P<rest>.*)$")


def values_comments(text: str) -> dict[str, str]:
    """Dotted key -> the comment lines just above it (and its own trailing comment).

    Comments separated from a key by a blank line describe the file or a section, not the
    key; list items are values, not keys, and are skipped.
    """
    out: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    pending: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            pending = []
            continue
        if stripped.startswith("#"):
            body = stripped.lstrip("#").strip()
            if not body.startswith("--"):  # a section rule, "# -- Kafka ------"
                pending.append(body)
            continue
        match = _KEY.match(line)
        if match is None or stripped.startswith("-"):
            pending = []
            continue
        indent = len(match["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, match["key"]))
        path = ".".join(key for _, key in stack)
        trailing = match["rest"].partition(" #")[2].strip()
        comment = " ".join([*pending, trailing]).strip()
        if comment:
            out[path] = comment
        pending = []
    return out


def _schema_node(schema: dict[str, Any], path: str) -> dict[str, Any] | None:
    node: dict[str, Any] | None = schema
    for key in path.split("."):
        node = _resolve(schema, node)
        if node is None:
            return None
        node = node.get("properties", {}).get(key)
    return _resolve(schema, node) if node is not None else None


def _resolve(schema: dict[str, Any], node: dict[str, Any] | None) -> dict[str, Any] | None:
    while node is not None and "$ref" in node:
        ref = node["$ref"].removeprefix("#/").split("/")
        target: Any = schema
        for part in ref:
            target = target[part]
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def _schema_type(node: dict[str, Any] | None) -> str:
    if node is None:
        return ""
    kind = node.get("type", "")
    text = " or ".join(kind) if isinstance(kind, list) else str(kind)
    if "enum" in node:
        text += ": " + ", ".join(json.dumps(v) for v in node["enum"])
    bounds = [
        f"{op} {node[key]}"
        for key, op in (("minimum", "≥"), ("maximum", "≤"), ("minLength", "length ≥"))
        if key in node
    ]
    if bounds:
        text += " (" + ", ".join(bounds) + ")"
    return text


def schema_paths(schema: dict[str, Any], node: dict[str, Any] | None = None) -> Iterator[str]:
    """Every property path the schema declares, depth first."""
    node = _resolve(schema, schema if node is None else node)
    for key, child in (node or {}).get("properties", {}).items():
        yield key
        for sub in schema_paths(schema, child):
            yield f"{key}.{sub}"


_ALIAS = re.compile(r"\{\{-?\s*(\$\w+)\s*:=\s*\.Values\.([\w.]+)\s*-?\}\}")
_ENTRY = re.compile(r"^\s*((?:ICEFLOE|AWS)_\w+):\s*\{\{-?\s*(\$\w+|\.Values)\.([\w.]+)", re.M)


def chart_variables(chart: Path = CHART) -> dict[str, list[str]]:
    """Chart value -> the environment variables the templates set from it.

    Read from the ConfigMap templates' ``NAME: {{ .Values.path ... }}`` lines (and their
    ``$x := .Values.path`` aliases), so the page says what each value configures without
    a second list to keep in step.
    """
    out: dict[str, list[str]] = {}
    for template in sorted((chart / "templates").glob("*.yaml")):
        text = template.read_text()
        aliases = {alias: path for alias, path in _ALIAS.findall(text)}
        for variable, base, rest in _ENTRY.findall(text):
            root = aliases.get(base) if base != ".Values" else None
            path = f"{root}.{rest}" if root else rest
            out.setdefault(path, []).append(variable)
    return out


def _setting_descriptions() -> dict[str, str]:
    return {
        row.environment: row.description
        for source in settings_sources()
        for row in settings_rows(source)
        if row.description
    }


def chart_values(chart: Path = CHART) -> list[ChartValue]:
    """The chart's values, in file order, plus schema properties values.yaml leaves out."""
    text = (chart / "values.yaml").read_text()
    values = yaml.safe_load(text)
    schema = json.loads((chart / "values.schema.json").read_text())
    comments = values_comments(text)
    variables = chart_variables(chart)
    settings = _setting_descriptions()
    for path, names in variables.items():
        own = comments.get(path, "")
        described = own or next((settings[n] for n in names if n in settings), "")
        sets = "sets " + ", ".join(f"`{n}`" for n in names)
        comments[path] = f"{described} ({sets})" if described else sets
    rows: list[ChartValue] = []
    seen: set[str] = set()

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict) and node:
            if path and path in comments:
                rows.append(
                    ChartValue(path, _schema_type(_schema_node(schema, path)), "", comments[path])
                )
                seen.add(path)
            for key, value in node.items():
                walk(value, f"{path}.{key}" if path else key)
            return
        rows.append(
            ChartValue(
                path,
                _schema_type(_schema_node(schema, path)),
                json.dumps(node),
                comments.get(path, ""),
            )
        )
        seen.add(path)

    walk(values, "")
    for path in schema_paths(schema):
        if path not in seen and not _is_mapping_with_rows(path, seen):
            node = _schema_node(schema, path)
            rows.append(ChartValue(path, _schema_type(node), "", "not set by default"))
            seen.add(path)
    return rows


def _is_mapping_with_rows(path: str, seen: set[str]) -> bool:
    return any(other.startswith(path + ".") for other in seen)


def helm_values_table(chart: Path = CHART) -> str:
    lines = ["| value | type | default | description |", "|---|---|---|---|"]
    for row in chart_values(chart):
        default = f"`{row.default}`" if row.default else ""
        lines.append(
            f"| `{row.path}` | {_cell(row.type)} | {_cell(default)} | {_cell(row.description)} |"
        )
    return "\n".join(lines)


# -- the MkDocs hook ------------------------------------------------------------------------

# -- table properties maintenance reads --------------------------------------------------


def maintenance_properties_table() -> str:
    """Every table property maintenance reads (:data:`icefloe.table.maintenance_policy.PROPERTIES`),
    grouped by what it governs, with its default and meaning."""
    lines = ["| property | area | default | meaning |", "|---|---|---|---|"]
    for prop in maintenance_policy.PROPERTIES:
        lines.append(
            f"| `{prop.key}` | {prop.area} | {_cell(prop.default)} | {_cell(prop.meaning)} |"
        )
    return "\n".join(lines)


GENERATORS: dict[str, Callable[[], str]] = {
    "settings": settings_page,
    "helm-values": helm_values_table,
    "maintenance-properties": maintenance_properties_table,
}


def expand(markdown: str) -> str:
    """Replace each ``<!-- generated: NAME -->`` line with its table."""

    def replace(match: re.Match[str]) -> str:
        name = match[1]
        if name not in GENERATORS:
            raise ValueError(f"unknown generated section {name!r}; known: {sorted(GENERATORS)}")
        return GENERATORS[name]()

    return MARKER.sub(replace, markdown)


def on_page_markdown(markdown: str, **_: Any) -> str:
    """MkDocs hook: expand the generated sections of every page."""
    return expand(markdown)


__all__ = [
    "UNDESCRIBED",
    "ChartValue",
    "Setting",
    "SettingsSource",
    "chart_values",
    "chart_variables",
    "expand",
    "helm_values_table",
    "maintenance_properties_table",
    "on_page_markdown",
    "schema_paths",
    "settings_page",
    "settings_rows",
    "settings_sources",
    "values_comments",
]
