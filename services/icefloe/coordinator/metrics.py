"""The coordinator's Prometheus series, in a registry of its own.

Why a module: the series are the coordinator's contract with operators (the Grafana dashboard
and the alert rules the Helm chart ships name them, and a test checks that every query names a
series the services export). Declared in one place, they read as the list of what an operator
can watch, apart from the code that moves them (:mod:`icefloe.coordinator.table_worker`,
:mod:`icefloe.coordinator.consumer_group`, :mod:`icefloe.coordinator.outbox`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from icefloe.manifests.decoded_writer import DecodedManifestWriter


class CoordinatorMetrics:
    """The service's Prometheus series, in a registry of its own."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        p = "icefloe_coordinator"
        self.consumed = Counter(f"{p}_events_consumed", "Records read", ["type"], registry=r)
        self.batched = Counter(
            f"{p}_events_batched", "Events taken into ready commit units", ["type"], registry=r
        )
        self.committed = Counter(
            f"{p}_events_committed", "Events whose commit reached the table", registry=r
        )
        self.dead_lettered = Counter(
            f"{p}_events_dead_lettered",
            "Events sent to the dead-letter topic",
            ["reason"],
            registry=r,
        )
        self.skipped = Counter(
            f"{p}_events_skipped", "Events found already done", ["why"], registry=r
        )
        self.snapshots = Counter(f"{p}_snapshots_committed", "Snapshots committed", registry=r)
        self.files = Counter(f"{p}_files_committed", "Files added by commits", registry=r)
        self.commit_latency = Histogram(
            f"{p}_commit_latency_seconds",
            "From the oldest included event's produced-at to the table commit",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900),
            registry=r,
        )
        self.commit_duration = Histogram(
            f"{p}_commit_duration_seconds", "Time spent committing one batch", registry=r
        )
        self.conflicts = Counter(
            f"{p}_commit_conflicts", "Commits that lost the catalog swap", registry=r
        )
        self.retries = Counter(f"{p}_commit_retries", "Commit attempts after the first", registry=r)
        self.lag = Gauge(
            f"{p}_consumer_lag", "High watermark minus position", ["partition"], registry=r
        )
        self.tables_active = Gauge(f"{p}_tables_active", "Tables with a running worker", registry=r)
        self.partitions = Gauge(f"{p}_partitions_assigned", "Assigned partitions", registry=r)
        self.dead_letters_too_large = Counter(
            f"{p}_dead_letters_too_large",
            "Dead letters the dead-letter topic refused as too large (retried, never cut)",
            registry=r,
        )
        self.topic_recreated = Counter(
            f"{p}_topic_recreated",
            "Tables whose recorded resume point belongs to another incarnation of the topic "
            "(re-created or truncated: another topic id, or offsets beyond its end)",
            ["partition"],
            registry=r,
        )
        self.acknowledged_expired = Counter(
            f"{p}_acknowledged_expired",
            "Commit ids acknowledged again whose snapshot was since expired (from the ledger)",
            registry=r,
        )
        self.pending = Gauge(
            f"{p}_pending_events",
            "files-written events waiting for their commit-requested",
            registry=r,
        )
        self.pending_oldest = Gauge(
            f"{p}_pending_oldest_seconds",
            "How long the oldest pending files-written event has waited",
            registry=r,
        )
        self.dedup_gap = Gauge(
            f"{p}_dedup_window_gap_seconds",
            "How much of the dedup window the table's retained history may not cover",
            ["table"],
            registry=r,
        )


class PlannerCacheCollector:
    """The decoded-manifest writer's counts (the planner-cache fills), read at scrape time."""

    def __init__(self, writer: DecodedManifestWriter) -> None:
        self.writer = writer

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        stats = self.writer.stats
        family = CounterMetricFamily(
            "icefloe_coordinator_planner_cache_manifests",
            "Committed manifests handed to the planner's disk cache, by outcome (written; "
            "skipped: partition values the cache cannot hold; failed; dropped: queue full)",
            labels=["outcome"],
        )
        for outcome, value in (
            ("written", stats.written),
            ("skipped", stats.skipped),
            ("failed", stats.failed),
            ("dropped", stats.dropped),
        ):
            family.add_metric([outcome], value)
        yield family
        pending = GaugeMetricFamily(
            "icefloe_coordinator_planner_cache_pending_bytes",
            "Bytes of committed manifests queued for the planner's disk cache",
        )
        pending.add_metric([], stats.pending_bytes)
        yield pending
