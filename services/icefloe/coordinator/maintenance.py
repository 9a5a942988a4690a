"""Maintenance the coordinator runs by itself, per table, by each table's policy.

Every coordinator replica runs one :class:`MaintenanceRunner`. It maintains exactly the
tables the replica owns, so a table is maintained by one replica at a time, and by the next
owner after a rebalance. A replica owns the tables of the Kafka partitions assigned to it:
those it has seen events for (``owned``, a callable the coordinator provides), and every
table of the catalog whose events *would* go to one of those partitions, had it any
(:func:`partition_of`: the writers' own key, :func:`icefloe.events.event_key`, through the
producers' default partitioner, murmur2 as in Kafka's Java client). Without the second, a
table that received no event since the replica started (a quiet table, a table written
before the coordinator came up, a table whose writers stopped) would never be maintained.
The catalog's tables are listed at most once per ``interval_s``. A table whose events a
custom partitioner sends elsewhere may be visited by two replicas; each visit is its own
conditional commit, so that costs work, never correctness.

Tables are visited one at a time; each is due every ``interval_s``, the first visit half to
one interval (at random) after the replica first sees the table, so that a start-up or a
rebalance does not set every table off at once.

A visit (:func:`icefloe.table.maintenance_policy.run_maintenance`) computes the table's health,
decides what its policy asks for (expire snapshots by age and count, remove orphan files
older than the safety window, rewrite manifests past a count or small-manifest ratio), and
does it, each action as its own commit through the catalog's conditional swap with retries.
It takes no lock the commit path uses, so it never blocks a commit: a table worker whose
swap loses to a maintenance commit retries as against any concurrent writer, and its
validation is unchanged. Expiry never goes inside ``min_retain_ms``
(``ICEFLOE_MAINTENANCE_MIN_RETAIN_MS``, a floor for every table), nor removes a snapshot
recording commit ids inside the table's own dedup window (``icefloe.dedup.window-ms``,
which the coordinator's commits write from ``ICEFLOE_DEDUP_WINDOW_MS`` on tables that set
none); :func:`icefloe.table.maintenance_policy.expiry_retention` says which holds what. When
orphan removal last ran is recorded in the table, so a restart or a new owner does not
list the location again before the interval is up.

Compaction candidates are announced, not compacted (compaction needs an engine), except on keyed
tables that the coordinator compacts itself between their commits (``icefloe.coordinator.compactor``,
:func:`~icefloe.coordinator.compactor.compacts_itself`): when the
table's compaction plan has work, a ``compaction-candidates`` JSON message, keyed by table,
goes to the maintenance topic for a scheduled Spark job (``icefloe.spark.compact``) to pick
up::

    {"type": "compaction-candidates", "table": "ns.t", "snapshot-id": 1, "groups": 2,
     "files": 40, "bytes": 12345, "expected-output-files": 2, "partitions": 2,
     "produced-at-ms": 1700000000000}

and the per-table gauges on ``/metrics`` show the same, with the health figures:
``icefloe_table_data_files``, ``icefloe_table_data_bytes``,
``icefloe_table_average_file_size_bytes``, ``icefloe_table_small_file_ratio``,
``icefloe_table_delete_files``, ``icefloe_table_manifests``,
``icefloe_table_small_manifest_ratio``, ``icefloe_table_snapshots``,
``icefloe_table_metadata_file_bytes``, ``icefloe_table_compaction_candidate_files``, all
labelled ``table``; plus counters of runs, actions, expired snapshots and removed orphans.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.partitioner import DefaultPartitioner
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from icefloe.coordinator.compactor import compacts_itself
from icefloe.errors import NotFoundError
from icefloe.events import event_key
from icefloe.manifests.reader import ManifestReader
from icefloe.table.catalog import Catalog, Namespace
from icefloe.table.health import TableHealth
from icefloe.table.maintenance_policy import Action, MaintenanceReport, run_maintenance

log = logging.getLogger("icefloe.maintenance")

CANDIDATES_EVENT_TYPE = "compaction-candidates"
DEFAULT_TOPIC = "icefloe.maintenance"
_TICK_S = 1.0

Publish = Callable[[str, bytes, bytes], Awaitable[None]]
"""Send (topic, key, value); the coordinator's Kafka producer."""


@dataclass(frozen=True, slots=True)
class MaintenanceSettings:
    """How the runner works; the policy itself lives in each table's properties."""

    enabled: bool = True
    interval_s: float = 300.0
    min_retain_ms: int = 24 * 3600 * 1000
    topic: str | None = DEFAULT_TOPIC


class TableMetrics:
    """Per-table health gauges and maintenance counters, in the coordinator's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        p = "icefloe_table"

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(f"{p}_{name}", doc, ["table"], registry=r)

        self.gauges: dict[str, tuple[Gauge, Callable[[TableHealth], float]]] = {
            "data_files": (gauge("data_files", "Live data files"), lambda h: h.data_files),
            "data_bytes": (gauge("data_bytes", "Bytes of live data files"), lambda h: h.data_bytes),
            "records": (gauge("records", "Rows in live data files"), lambda h: h.records),
            "average_file_size_bytes": (
                gauge("average_file_size_bytes", "Average data file size"),
                lambda h: h.average_file_size_bytes,
            ),
            "small_files": (
                gauge("small_files", "Data files below the compaction minimum size"),
                lambda h: h.small_files,
            ),
            "small_file_ratio": (
                gauge("small_file_ratio", "Share of data files that are small"),
                lambda h: h.small_file_ratio,
            ),
            "delete_files": (
                gauge("delete_files", "Live position and equality delete files"),
                lambda h: h.delete_files,
            ),
            "deleted_rows": (
                gauge("deleted_rows", "Rows deleted by position in live data files"),
                lambda h: h.deleted_rows,
            ),
            "deleted_row_ratio": (
                gauge("deleted_row_ratio", "Deleted rows per row stored in live data files"),
                lambda h: h.deleted_row_ratio,
            ),
            "deletion_vector_bytes": (
                gauge("deletion_vector_bytes", "Bytes of live deletion vectors"),
                lambda h: h.deletion_vector_bytes,
            ),
            "manifests": (gauge("manifests", "Manifests of the head"), lambda h: h.manifests),
            "small_manifest_ratio": (
                gauge("small_manifest_ratio", "Share of manifests that are small"),
                lambda h: h.small_manifest_ratio,
            ),
            "snapshots": (gauge("snapshots", "Snapshots in the metadata"), lambda h: h.snapshots),
            "metadata_file_bytes": (
                gauge("metadata_file_bytes", "Size of the current metadata file"),
                lambda h: h.metadata_file_bytes,
            ),
        }
        self.candidate_files = gauge(
            "compaction_candidate_files", "Data files a compaction would rewrite now"
        )
        self.candidate_groups = gauge(
            "compaction_candidate_groups", "File groups a compaction would write now"
        )
        m = "icefloe_maintenance"
        self.runs = Counter(f"{m}_runs", "Maintenance visits", ["outcome"], registry=r)
        self.actions = Counter(f"{m}_actions", "Maintenance actions run", ["action"], registry=r)
        self.expired = Counter(f"{m}_expired_snapshots", "Snapshots expired", registry=r)
        self.orphans = Counter(f"{m}_removed_orphans", "Orphan files removed", registry=r)
        self.duration = Histogram(f"{m}_duration_seconds", "One table's visit", registry=r)
        self._tables: set[str] = set()

    def update(self, table: str, health: TableHealth, candidates: tuple[int, int]) -> None:
        for g, value in self.gauges.values():
            g.labels(table).set(value(health))
        self.candidate_files.labels(table).set(candidates[0])
        self.candidate_groups.labels(table).set(candidates[1])
        self._tables.add(table)

    def forget(self, table: str) -> None:
        """Drop a table's series (it is no longer owned here: its new owner reports it)."""
        if table not in self._tables:
            return
        self._tables.discard(table)
        for g, _ in self.gauges.values():
            with contextlib.suppress(KeyError):
                g.remove(table)
        for g in (self.candidate_files, self.candidate_groups):
            with contextlib.suppress(KeyError):
                g.remove(table)

    @property
    def tables(self) -> set[str]:
        return set(self._tables)


def settings_from(config: Any) -> MaintenanceSettings:
    """The runner's settings from the coordinator's ``maintenance_*`` settings."""
    return MaintenanceSettings(
        enabled=config.maintenance_enabled,
        interval_s=config.maintenance_interval_ms / 1000.0,
        min_retain_ms=config.maintenance_min_retain_ms,
        topic=config.maintenance_topic,
    )


def producer_publish(producer: Callable[[], AIOKafkaProducer | None]) -> Publish:
    """Publish through whichever producer ``producer()`` returns when a message is sent."""

    async def publish(topic: str, key: bytes, value: bytes) -> None:
        current = producer()
        if current is None:
            raise RuntimeError("the Kafka producer is not running")
        await current.send_and_wait(topic, value, key=key)

    return publish


def candidates_message(report: MaintenanceReport) -> dict[str, Any] | None:
    """The ``compaction-candidates`` message for a run, or None when there is nothing to do."""
    plan = report.compaction
    if plan is None or not plan.groups:
        return None
    if not any(p.action == Action.COMPACT for p in report.planned):
        return None
    return {
        "type": CANDIDATES_EVENT_TYPE,
        "table": report.table,
        "snapshot-id": plan.snapshot_id,
        "groups": len(plan.groups),
        "files": plan.input_files,
        "bytes": plan.input_bytes,
        "expected-output-files": plan.expected_output_files(),
        "partitions": len({(g.spec_id, repr(g.partition)) for g in plan.groups}),
        "produced-at-ms": int(time.time() * 1000),
    }


_PARTITIONER = DefaultPartitioner()


def partition_of(table: str, partitions: int) -> int:
    """The partition of a ``partitions``-partition events topic that ``table``'s events go
    to: the writers' key through the producers' default partitioner."""
    every = list(range(partitions))
    partition: int = _PARTITIONER(event_key(table), every, every)
    return partition


async def catalog_tables(catalog: Catalog) -> list[str]:
    """Every table of the catalog, namespaces walked from the root."""
    out: list[str] = []
    pending: list[Namespace] = [()]
    seen: set[Namespace] = set()
    while pending:
        namespace = pending.pop()
        if namespace in seen:
            continue
        seen.add(namespace)
        children = await catalog.list_namespaces(namespace)
        pending.extend(c for c in children if c not in seen)
        if namespace:
            out.extend(str(t) for t in await catalog.list_tables(namespace))
    return sorted(out)


class MaintenanceRunner:
    """Visits the owned tables in turn; see the module docs.

    ``assigned`` (the events topic's partitions assigned here) and ``partition_count`` (how
    many it has) let the runner own the catalog's tables that have had no event here; without
    them it maintains only the tables ``owned`` names.
    """

    def __init__(
        self,
        catalog: Catalog,
        settings: MaintenanceSettings,
        registry: CollectorRegistry,
        owned: Callable[[], Iterable[str]],
        *,
        publish: Publish | None = None,
        reader: ManifestReader | None = None,
        assigned: Callable[[], Collection[int]] | None = None,
        partition_count: Callable[[], int] | None = None,
    ) -> None:
        self.catalog = catalog
        self.settings = settings
        self.metrics = TableMetrics(registry)
        self.owned = owned
        self.publish = publish
        self.reader = reader
        self.assigned = assigned
        self.partition_count = partition_count
        self.listed: list[str] = []  # the catalog's tables, as last listed
        self._listed_at: float | None = None
        self._listing = asyncio.Lock()
        self.next_due: dict[str, float] = {}
        # attempts made here (a failed run is retried after the interval too); a successful
        # run is recorded in the table itself (icefloe.table.maintenance_policy.record_orphans_run)
        self.last_orphan_run_ms: dict[str, int] = {}
        self.reports: dict[str, MaintenanceReport] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.settings.enabled and self._task is None:
            self._task = asyncio.create_task(self._loop(), name="icefloe-maintenance")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _loop(self) -> None:
        while True:
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("maintenance tick failed")
            await asyncio.sleep(min(_TICK_S, self.settings.interval_s))

    async def _list_catalog(self) -> None:
        """Refresh :attr:`listed`, at most once per interval; a failure keeps the last list."""
        async with self._listing:  # one listing at a time; a caller meanwhile waits for it
            started = time.monotonic()
            if self._listed_at is not None and started - self._listed_at < self.settings.interval_s:
                return
            try:
                self.listed = await catalog_tables(self.catalog)
            except Exception as e:
                log.warning("maintenance could not list the catalog's tables: %s", e)
            self._listed_at = started

    def owns(self, table: str) -> bool:
        """Whether this replica owns ``table`` now (see the module docs)."""
        if table in set(self.owned()):
            return True
        if self.assigned is None or self.partition_count is None:
            return False
        count = self.partition_count()
        return count > 0 and partition_of(table, count) in set(self.assigned())

    async def owned_tables(self) -> set[str]:
        """The tables this replica maintains now: those it has seen events for, and the
        catalog's tables that map to its partitions."""
        owned = set(self.owned())
        if self.assigned is None or self.partition_count is None:
            return owned
        count = self.partition_count()
        partitions = set(self.assigned())
        if count <= 0 or not partitions:
            return owned
        await self._list_catalog()
        owned.update(t for t in self.listed if partition_of(t, count) in partitions)
        return owned

    async def tick(self) -> None:
        """Visit every owned table that is due; forget tables no longer owned."""
        owned = await self.owned_tables()
        for gone in (set(self.next_due) | self.metrics.tables) - owned:
            self.next_due.pop(gone, None)
            self.metrics.forget(gone)
        now = time.monotonic()
        interval = self.settings.interval_s
        for table in sorted(owned):
            due = self.next_due.get(table)
            if due is None:
                # First sight (start-up, a rebalance): a full interval later, spread out,
                # so replicas and tables never all run at once.
                due = now + interval * random.uniform(0.5, 1.0)
                self.next_due[table] = due
            if due > now:
                continue
            if not self.owns(table):
                continue  # revoked meanwhile
            await self.visit(table)
            self.next_due[table] = time.monotonic() + interval

    async def visit(self, table: str) -> MaintenanceReport | None:
        """One maintenance run of ``table``; errors are logged and counted, never raised."""
        started = time.monotonic()
        try:
            loaded = await self.catalog.load_table(table)
        except NotFoundError:
            self.metrics.forget(table)
            return None
        except Exception as e:
            self.metrics.runs.labels("error").inc()
            log.warning("maintenance of %s could not load it: %s", table, e)
            return None
        now_ms = int(time.time() * 1000)
        try:
            report = await run_maintenance(
                loaded,
                min_retain_ms=self.settings.min_retain_ms,
                now_ms=now_ms,
                last_orphan_run_ms=self.last_orphan_run_ms.get(table),
                reader=self.reader,
            )
        except Exception as e:  # a bad policy property, unreadable manifests, ...
            self.metrics.runs.labels("error").inc()
            log.warning("maintenance of %s failed: %s", table, e, extra={"table": table})
            return None
        self.metrics.duration.observe(time.monotonic() - started)
        self.reports[table] = report
        for planned in report.planned:
            self.metrics.actions.labels(planned.action.value).inc()
            if planned.action == Action.REMOVE_ORPHANS:
                self.last_orphan_run_ms[table] = now_ms
        self.metrics.expired.inc(report.expired_snapshots)
        self.metrics.orphans.inc(report.removed_orphans)
        self.metrics.runs.labels("error" if report.errors else "ok").inc()
        plan = report.compaction
        if report.health is not None:
            candidates = (0, 0) if plan is None else (plan.input_files, len(plan.groups))
            self.metrics.update(table, report.health, candidates)
        if report.errors:
            log.warning("maintenance of %s: %s", table, "; ".join(report.errors))
        done = [p.action.value for p in report.planned if p.action != Action.COMPACT]
        if done:
            log.info(
                "maintenance of %s: %s (expired %d snapshot(s), removed %d orphan(s))",
                table,
                ", ".join(done),
                report.expired_snapshots,
                report.removed_orphans,
                extra={"table": table},
            )
        message = candidates_message(report)
        if message is not None and compacts_itself(loaded.metadata):
            # The coordinator compacts this table itself (icefloe.coordinator.compactor): a
            # Spark rewrite announced here would only race the table's upserts and lose.
            message = None
        if message is not None and self.publish is not None and self.settings.topic:
            try:
                await self.publish(
                    self.settings.topic,
                    event_key(table),
                    json.dumps(message, separators=(",", ":")).encode(),
                )
            except Exception as e:  # announcing is best effort: the metrics say it too
                log.warning("announcing compaction candidates of %s failed: %s", table, e)
        return report


__all__ = [
    "CANDIDATES_EVENT_TYPE",
    "DEFAULT_TOPIC",
    "MaintenanceRunner",
    "MaintenanceSettings",
    "TableMetrics",
    "candidates_message",
    "catalog_tables",
    "partition_of",
    "producer_publish",
    "settings_from",
]
