"""The documentation site: it builds in strict mode, and its reference pages cannot drift.

``make docs`` (part of ``make test``) builds the site with MkDocs in strict mode, so a broken
link, a missing anchor or a page left out of the navigation fails. This test builds it the
same way into a temporary directory and reads the built pages: every setting of every
settings model (by its environment variable, with its flag) must be on the settings page,
and every value of the chart's ``values.yaml`` and ``values.schema.json`` on the Helm values
page. The expectations come from the models and the chart directly, not from the generator
(:mod:`icefloe.dev.docs_reference`), so a generator that skipped a setting would fail here.
"""

from __future__ import annotations

import html
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from icefloe.coordinator.config import CoordinatorConfig
from icefloe.dev import docs_reference
from icefloe.planner.config import PlannerConfig
from icefloe.planner.write_config import RestCatalogSettings
from icefloe.runtime.settings import is_secret
from icefloe.spark.config import SparkConfig

REPO_ROOT = Path(__file__).resolve().parent.parent
CHART = REPO_ROOT / "helm" / "icefloe"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    assert "WARNING" not in result.stderr, result.stderr
    return out


def _clean(fragment: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", fragment)).split())


def sections(site: Path, page: str) -> dict[str, dict[str, list[str]]]:
    """Each h2 section's (or, without one, the page's) table rows: first cell -> cells."""
    raw = (site / page / "index.html").read_text()
    out: dict[str, dict[str, list[str]]] = {}
    for chunk in re.split(r"<h2\b", raw):
        heading = re.search(r">(.*?)</h2>", chunk, re.DOTALL)
        title = _clean(heading[1]) if heading else ""
        table: dict[str, list[str]] = {}
        for row in re.findall(r"<tr>(.*?)</tr>", chunk, re.DOTALL):
            cells = [_clean(c) for c in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", row, re.DOTALL)]
            if cells:
                table.setdefault(cells[0], cells)
        out[title] = table
    return out


MODELS: list[tuple[type[Any], str, bool]] = [
    (CoordinatorConfig, "ICEFLOE_", True),
    (PlannerConfig, "ICEFLOE_PLANNER_", True),
    (RestCatalogSettings, "ICEFLOE_REST_", False),
    (SparkConfig, "ICEFLOE_", False),
]


def test_every_setting_of_every_service_is_on_the_settings_page(site: Path) -> None:
    by_title = {
        title.split()[0]: table
        for title, table in sections(site, "operations/settings").items()
        if title
    }
    for model, prefix, has_flags in MODELS:
        title = {
            CoordinatorConfig: "Coordinator",
            PlannerConfig: "Planner",
            RestCatalogSettings: "REST",
            SparkConfig: "Spark",
        }[model]
        table = by_title[title]
        for name, info in model.model_fields.items():
            assert name in table, f"{title}: {name} is missing from the settings page"
            row = table[name]
            assert row[1] == f"{prefix}{name.upper()}", (title, name, row)
            flag = "--" + name.replace("_", "-")
            if has_flags and not is_secret(info) and (info.json_schema_extra or {}) == {}:
                assert row[2].split(" / ")[0] == flag, (title, name, row)
            elif has_flags:
                assert row[2] == "—", f"{title}: {name} has no flag"
            if model is SparkConfig:
                key = "spark.icefloe." + name.replace("_", "-")
                assert row[2] == ("—" if is_secret(info) else key), (name, row)
            if info.is_required():
                assert "required" in row[-2]
            description = info.description or docs_reference.UNDESCRIBED[row[1]]
            assert description.split(";")[0] in row[-1], (title, name, row)


def _leaves(node: Any, path: str = "") -> Iterator[str]:
    if isinstance(node, dict) and node:
        for key, value in node.items():
            yield from _leaves(value, f"{path}.{key}" if path else key)
    else:
        yield path


def test_every_chart_value_is_on_the_helm_values_page(site: Path) -> None:
    table = sections(site, "operations/helm-values")[""]
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())
    expected = set(_leaves(values)) | {
        p
        for p in docs_reference.schema_paths(schema)
        if not any(leaf.startswith(p + ".") for leaf in _leaves(values))
    }
    assert len(expected) > 150
    missing = sorted(expected - table.keys())
    assert not missing, f"chart values missing from the Helm values page: {missing}"
    assert table["coordinator.enabled"][1:3] == ["boolean", "true"]
    assert table["planner.cacheMaxBytes"][2] == "536870912"
    assert "RSS" in table["planner.cacheMaxBytes"][3], "the comment above the key describes it"
    assert table["image.pullPolicy"][1] == 'string: "Always", "IfNotPresent", "Never"'
    # What a value sets comes from the templates, and the setting's description with it.
    batching = table["coordinator.batching.maxFiles"][3]
    assert "sets ICEFLOE_BATCH_MAX_FILES" in batching
    assert docs_reference.UNDESCRIBED["ICEFLOE_BATCH_MAX_FILES"] in batching
    assert "ICEFLOE_PLANNER_RESULTS_TOPIC" in table["topics.results"][3]


def test_every_setting_is_described_once() -> None:
    """Descriptions the docs add for settings whose model has none may only fill gaps: an
    entry for a setting described in its model (or for no setting) fails, so the page never
    holds two descriptions of one setting."""
    undescribed = {
        f"{prefix}{name.upper()}"
        for model, prefix, _ in MODELS
        for name, info in model.model_fields.items()
        if not info.description
    }
    assert set(docs_reference.UNDESCRIBED) <= undescribed, sorted(
        set(docs_reference.UNDESCRIBED) - undescribed
    )
    assert undescribed <= set(docs_reference.UNDESCRIBED), (
        f"settings with no description anywhere: {sorted(undescribed - set(docs_reference.UNDESCRIBED))}"
    )


def test_an_unknown_generated_section_fails_the_build() -> None:
    with pytest.raises(ValueError, match="unknown generated section 'settngs'"):
        docs_reference.expand("text\n<!-- generated: settngs -->\n")


def test_comments_above_a_key_describe_it() -> None:
    text = (
        "# About the file.\n\n"
        "# -- Section --------\n"
        "outer:\n"
        "  # What inner is,\n"
        "  # on two lines.\n"
        "  inner: 1  # and a trailing note\n"
        "  list:\n"
        "    - name: x\n"
        "  after: 2\n"
        "top: 3\n"
    )
    assert docs_reference.values_comments(text) == {
        "outer.inner": "What inner is, on two lines. and a trailing note"
    }


class _Recording(dict[str, str]):
    """Table properties that remember every key looked up (iteration, as a copy does, is
    not a lookup)."""

    read: set[str]

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.read = set()

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key: str) -> str:
        self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        self.read.add(str(key))
        return super().__contains__(key)


async def _properties_maintenance_reads(warehouse: Path) -> set[str]:
    """Every table property maintenance reads to decide what a table needs (its health, its
    policy, what holds expiry back, orphans, the compaction plan), recorded on a table where
    every action is due."""
    import time

    from icefloe.catalog.uri import load_catalog
    from icefloe.spec.datafile import DataFile
    from icefloe.spec.partition import PartitionSpec
    from icefloe.spec.schema import Schema
    from icefloe.spec.snapshot import MAIN_BRANCH, SnapshotRef
    from icefloe.spec.types import LongType, NestedField
    from icefloe.table.catalog import Table
    from icefloe.table.health import table_health
    from icefloe.table.maintenance_policy import (
        MaintenancePolicy,
        compaction_candidates,
        decide,
        expiry_retention,
    )
    from icefloe.table.snapshot_producer import fast_append

    catalog = load_catalog(f"file://{warehouse}")
    try:
        await catalog.create_namespace("db")
        table = await catalog.create_table(
            "db.t",
            Schema(NestedField(1, "id", LongType(), required=True)),
            PartitionSpec(0, ()),
            properties={"icefloe.maintenance.remove-orphans.last-run-ms": "1"},
        )
        for n in range(3):
            f = DataFile(f"{table.location}/data/{n}.parquet", "parquet", (), 1, 10)
            table = await fast_append(table, [f]).commit()
        metadata = table.metadata
        assert metadata.current_snapshot() is not None
        tagged = metadata.model_copy(
            update={
                "refs": {
                    **metadata.refs,
                    "old": SnapshotRef.tag(metadata.snapshots[0].snapshot_id),
                    MAIN_BRANCH: metadata.refs[MAIN_BRANCH],
                }
            }
        )
        recording = _Recording(tagged.properties)
        object.__setattr__(tagged, "properties", recording)
        watched = Table(table.identifier, tagged, table.metadata_location, catalog)
        now = int(time.time() * 1000) + 30 * 86_400_000
        policy = MaintenancePolicy.for_table(tagged)
        health = await table_health(watched, now_ms=now)
        plan = await compaction_candidates(watched)
        expiry_retention(tagged, policy, now_ms=now, min_retain_ms=0)
        planned = decide(tagged, health, plan, policy, now_ms=now, min_retain_ms=0)
        assert planned, "every action should be due on this table"
        return recording.read
    finally:
        await catalog.close()


def test_every_table_property_maintenance_reads_is_on_the_maintenance_page(
    site: Path, tmp_path: Path
) -> None:
    import asyncio

    from icefloe.table.maintenance_policy import PROPERTIES

    rows: dict[str, list[str]] = {}
    for table in sections(site, "concepts/maintenance").values():
        rows.update(table)
    read = asyncio.run(_properties_maintenance_reads(tmp_path))
    assert {"icefloe.maintenance.max-snapshots", "icefloe.dedup.window-ms"} <= read
    assert "history.expire.min-snapshots-to-keep" in read
    assert "icefloe.maintenance.remove-orphans.interval-ms" in read
    missing = sorted(read - rows.keys())
    assert not missing, f"read by maintenance, missing from its page: {missing}"
    listed = {p.key for p in PROPERTIES}
    assert listed <= rows.keys() and not read - listed
    for prop in PROPERTIES:  # the default and the meaning as the code states them
        assert rows[prop.key][2] == prop.default and rows[prop.key][3] == prop.meaning, prop
