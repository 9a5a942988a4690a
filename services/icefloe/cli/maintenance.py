"""``icefloe table health``, ``icefloe table maintain`` and ``icefloe table compact``.

``health`` prints the figures the coordinator exports per table (:mod:`icefloe.table.health`),
what its maintenance would do next, with the reason for each action, and what holds snapshot
expiry back (``expiry``: how many snapshots the table's own limits keep, and how many the
``--min-retain-ms`` floor and the table's dedup window hold beyond them), computed by the
same policy code (:mod:`icefloe.table.maintenance_policy`). ``maintain`` runs that maintenance
once, now. ``compact`` runs the Spark compaction (:mod:`icefloe.spark.compaction`) on a local
Spark session (``--master``), committing through the coordinator whose Kafka brokers
``--brokers`` names (default ``$ICEFLOE_BROKERS``, the setting every Spark job reads); the
topics and the connection's security come from the ``ICEFLOE_*`` environment as for any
Spark job (:mod:`icefloe.spark.config`), the catalog from ``--catalog``.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from icefloe.cli.scan import filter_argument
from icefloe.coordinator.config import CoordinatorConfig
from icefloe.errors import ValidationError
from icefloe.runtime.logs import add_log_arguments
from icefloe.table.catalog import Catalog
from icefloe.table.health import table_health
from icefloe.table.maintenance_policy import (
    MaintenancePolicy,
    compaction_candidates,
    decide,
    expiry_retention,
    run_maintenance,
)

BROKERS_ENV = "ICEFLOE_BROKERS"
"""Where ``--brokers`` defaults from: the coordinator's and every Spark job's setting."""

MIN_RETAIN_ENV = "ICEFLOE_MAINTENANCE_MIN_RETAIN_MS"


def default_min_retain_ms() -> str:
    """``--min-retain-ms`` by default: the coordinator's floor, as its environment sets it
    (``ICEFLOE_MAINTENANCE_MIN_RETAIN_MS``) or its default, so that ``health`` says what the
    coordinator's runner would do. A string: argparse converts it (and names a bad one)
    only when the subcommand is used."""
    default = CoordinatorConfig.model_fields["maintenance_min_retain_ms"].default
    return os.environ.get(MIN_RETAIN_ENV, str(default))


def add_arguments(tsub: Any, with_catalog: Any) -> None:
    """Add the subcommands to ``icefloe table``'s subparsers."""
    for name, what in (
        ("health", "health figures and next maintenance"),
        ("maintain", "run the table's maintenance policy now"),
    ):
        p = with_catalog(tsub.add_parser(name, help=what))
        p.add_argument("table", help="namespace.table")
        p.add_argument(
            "--min-retain-ms",
            type=int,
            default=default_min_retain_ms(),
            help=f"expiry keeps every snapshot younger than this: the coordinator's floor "
            f"(default: ${MIN_RETAIN_ENV}, else the coordinator's; now %(default)s)",
        )
    add_log_arguments(p)  # maintain runs for a while: it logs as it goes
    p = with_catalog(tsub.add_parser("compact", help="compact small files with Spark"))
    p.add_argument("table", help="namespace.table")
    p.add_argument(
        "--where",
        help="compact only files that may hold rows matching this filter, as in icefloe scan "
        "--where (\"day >= '2024-01-01' and vendor_id in (1, 2)\", expression JSON or @file)",
    )
    p.add_argument("--sort", action="store_true", help="sort rows by the table's sort order")
    p.add_argument(
        "--option",
        "-o",
        action="append",
        default=[],
        help="policy override, e.g. min_input_files=2 or target_file_size_bytes=134217728",
    )
    p.add_argument("--master", default="local[*]", help="Spark master")
    p.add_argument(
        "--brokers",
        default=os.environ.get(BROKERS_ENV),
        help=f"Kafka bootstrap servers of the coordinator that commits the rewrite "
        f"(default: ${BROKERS_ENV}, now {os.environ.get(BROKERS_ENV) or 'unset'})",
    )
    add_log_arguments(p)


async def health(catalog: Catalog, identifier: str, min_retain_ms: int) -> dict[str, Any]:
    table = await catalog.load_table(identifier)
    now = int(time.time() * 1000)
    figures = await table_health(table, now_ms=now)
    plan = await compaction_candidates(table)
    policy = MaintenancePolicy.for_table(table.metadata)
    actions = decide(table.metadata, figures, plan, policy, now_ms=now, min_retain_ms=min_retain_ms)
    retention = expiry_retention(table.metadata, policy, now_ms=now, min_retain_ms=min_retain_ms)
    out: dict[str, Any] = {
        "health": figures.to_json(),
        "next": [a.to_json() for a in actions],
        "expiry": retention.to_json(),
    }
    if plan is None:
        out["compaction"] = "not supported for this table (format v3)"
    return out


async def maintain(catalog: Catalog, identifier: str, min_retain_ms: int) -> dict[str, Any]:
    table = await catalog.load_table(identifier)
    report = await run_maintenance(table, min_retain_ms=min_retain_ms)
    out = report.to_json()
    if report.health is not None:
        out["health"] = report.health.to_json()
    return out


def _options(pairs: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValidationError(f"--option {pair!r} must look like name=value")
        if value.lower() in ("true", "false"):
            out[key] = value.lower() == "true"
            continue
        try:
            out[key] = int(value)
        except ValueError:
            raise ValidationError(f"--option {pair!r}: the value must be an integer") from None
    return out


def compact(catalog_uri: str, args: argparse.Namespace) -> dict[str, Any]:
    """Run a compaction on a local Spark session; the result as JSON."""
    options = _options(args.option)
    where = filter_argument(args.where)
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    import icefloe.spark as ispark
    from icefloe.spark.compaction import compact as run_compaction

    # A context already running in this process (any thread) is its owner's to stop.
    ours = getattr(SparkContext, "_active_spark_context", None) is None
    spark = (
        SparkSession.builder.master(args.master)
        .appName("icefloe-compact")
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    try:
        result = run_compaction(
            spark,
            args.table,
            where=where,
            sort=args.sort,
            options=options,
            config={"catalog": catalog_uri, "brokers": args.brokers},
        )
        return result.to_json()
    finally:
        if ours:
            ispark.shutdown()
            spark.stop()


__all__ = ["add_arguments", "compact", "health", "maintain"]
