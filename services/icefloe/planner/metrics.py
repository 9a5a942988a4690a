"""The planner's state as Prometheus figures, read at scrape time: the manifest cache, held
plans, pages written ahead and tables in memory (request metrics are the middleware's)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from icefloe.manifests.cache import ManifestCache
from icefloe.planner.pages_ahead import PagesAhead
from icefloe.planner.plans import PlanStore
from icefloe.planner.refresher import TableRefresher


class StateCollector:
    """Cache, plan and table figures read at scrape time."""

    def __init__(
        self, cache: ManifestCache, plans: PlanStore, ahead: PagesAhead, refresher: TableRefresher
    ) -> None:
        self.cache = cache
        self.plans = plans
        self.ahead = ahead
        self.refresher = refresher

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        s = self
        stats = s.cache.stats()
        for name, value, doc in (
            ("cache_hits", stats.hits, "manifest cache hits"),
            ("cache_misses", stats.misses, "manifest cache misses"),
            ("cache_evictions", stats.evictions, "manifests evicted from the cache"),
            ("cache_read_bytes", stats.bytes_read, "bytes of manifests and lists read"),
            ("plans_dropped_for_memory", s.plans.dropped_for_memory, "plans dropped for room"),
            ("pages_shared_used", s.ahead.shared_used, "pages another process wrote ahead"),
        ):
            counter = CounterMetricFamily(f"icefloe_planner_{name}", doc)
            counter.add_metric([], value)
            yield counter
        for name, value, doc in (
            ("cache_bytes", stats.bytes, "bytes held by the manifest cache"),
            ("cache_max_bytes", stats.max_bytes, "manifest cache budget"),
            ("cache_entries", stats.entries, "manifest lists and manifests cached"),
            ("plans", len(s.plans), "plans held for plan-task fetches"),
            ("plan_bytes", s.plans.bytes, "bytes held plans keep outside the cache"),
            ("plan_pinned_bytes", s.plans.pinned_bytes, "manifest bytes held plans pin"),
            ("memory_bytes", stats.held_bytes, "decoded manifests in memory: cache + plans"),
            ("pages_ahead_bytes", s.ahead.nbytes, "bytes of plan pages written ahead of fetches"),
            ("tables", len(s.refresher.tables), "tables held in memory"),
        ):
            gauge = GaugeMetricFamily(f"icefloe_planner_{name}", doc)
            gauge.add_metric([], value)
            yield gauge
        reloads = CounterMetricFamily(
            "icefloe_planner_table_reloads", "table metadata refreshes", labels=["reason"]
        )
        for reason, count in s.refresher.reloads.items():
            reloads.add_metric([reason], count)
        yield reloads
