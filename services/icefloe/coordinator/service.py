"""The coordinator service: files-written events on Kafka become few, exactly-once snapshots.

Writers publish what they wrote (:mod:`icefloe.events`); this service, one consumer group
with any number of replicas, commits it. Kafka partition assignment decides which replica
owns which tables, because events are keyed by table: all of a table's events are in one
partition, in order.

Flow
----
The consume loop reads records and parses them. Anything that is not a valid event is
dead-lettered at once. Valid events go to their table's worker, an asyncio task that exists
only while its table has work, so an idle table costs nothing and never holds up another.
A worker loads its table lazily (on its first event), checks each event against the table
(:class:`~icefloe.coordinator.committer.TableCommitter`), feeds the per-table state machine
(:class:`~icefloe.coordinator.batcher.TableBatcher`) and commits the batches it releases, one at a
time; different tables commit in parallel.

Exactly once
------------
Correctness never depends on Kafka transactions or the idempotent producer; it rests on the
table itself:

1. *Units.* A commit id becomes ready with its commit-requested (taking the files-written
   events it names, leaving other attempts' files out and reporting them as orphans) or as a
   files-written event with ``complete: true``. Units commit in arrival order; runs of
   appends, and runs of upserts, are batched into one snapshot
   (:mod:`icefloe.coordinator.batcher`). Upserts are resolved in that order into row
   deletes (:mod:`icefloe.coordinator.upsert`); their key files are deleted once the
   commit holding them is announced.
2. *The table records what it holds.* Each snapshot's summary carries ``icefloe.commit-ids``,
   ``icefloe.offsets`` (the table's safe resume point per source partition: every one of its
   events below it is done) and ``icefloe.positions`` (how far the committer had read, as a
   running maximum). See :mod:`icefloe.coordinator.history`.
3. *Check on every base, by commit id.* Before each attempt, and on the reloaded table
   after each conflict, the committer drops units whose commit ids the table already holds
   (the dedup index over every snapshot it lists, :mod:`icefloe.table.commit_index`, kept
   incrementally) and refuses files already live. The catalog's conditional swap
   serializes committers, so a restarted process, a new owner after a rebalance, or a
   zombie replica still consuming the same partition can never apply a commit id twice or
   add a file twice. An unknown swap outcome is resolved by reloading and checking, never
   by a blind retry. Events whose commit id the table holds are acknowledged again (a new
   ``table-committed`` naming the snapshot that holds it), not dead-lettered.
4. *Skip what is done, announce it again.* When a worker loads its table it reads the
   highest resume point recorded for its partition (unless it was recorded for another
   incarnation of the topic: another Kafka topic id, or a position beyond the partition's
   end; then nothing is skipped by offset) and skips the table's
   events below it, announcing again each commit among them the table holds: a crash
   between the catalog swap and the announcement leaves exactly those events to re-read.
5. *Kafka offsets last.* Offsets are committed (manually) only after the table commit and
   its announcement, as each partition's low watermark: the smallest offset any of its
   tables still tracks (received, pending, ready or being committed; a dead-lettered event
   counts as done once the dead-letter topic acknowledged it), else the position. A crash
   anywhere therefore only re-reads events, and steps 3 and 4 make re-reading harmless.

Validation never blocks a partition: an invalid event (malformed, unknown table, schema or
spec, partition values of the wrong type, inconsistent counts, a path outside the table or
with ``..``, a missing file or a wrong size, a file already in the table, a request naming
events that never arrived, files-written events abandoned without a request) is published
to the dead-letter topic with its original bytes and a reason ``<kind>: <message>``, and is
then done. Each snapshot is announced by a ``table-committed`` event on the results topic.

Operations: ``/healthz``, ``/readyz`` (ready once the consumer has joined its group) and
``/metrics`` (:mod:`icefloe.runtime.http`); structured JSON logs; on SIGTERM or SIGINT it
stops consuming, commits every ready unit, commits its Kafka offsets and exits 0.

Where each part lives
---------------------
This module is the wiring: it parses the settings, builds the catalog, the manifest reader,
the batch limits, the key-index opener, the metrics, the outbox, the consumer group and
maintenance, and runs them until a stop. The parts are modules named after them:

- :mod:`icefloe.coordinator.consumer_group`: the consume loop, rebalances, offset commits
  and housekeeping (step 5);
- :mod:`icefloe.coordinator.table_worker`: one table's worker (steps 1, 3 and 4);
- :mod:`icefloe.coordinator.offsets`: a partition's state and its low watermark;
- :mod:`icefloe.coordinator.outbox`: results and dead letters, sent until acknowledged;
- :mod:`icefloe.coordinator.metrics`: the Prometheus series;
- :mod:`icefloe.coordinator.batcher`, :mod:`icefloe.coordinator.committer` (with
  :mod:`~icefloe.coordinator.history`, :mod:`~icefloe.coordinator.commit_hooks`,
  :mod:`~icefloe.coordinator.event_checks` and :mod:`~icefloe.coordinator.overwrite_filters`)
  and :mod:`icefloe.coordinator.upsert`: batching and committing one table;
- :mod:`icefloe.coordinator.maintenance`: maintenance of the tables this replica owns.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import logging
import signal
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from aiokafka.admin import NewTopic
from aiokafka.errors import KafkaError

from icefloe.catalog.uri import load_catalog
from icefloe.coordinator.batcher import (
    BatchLimits,
)
from icefloe.coordinator.commit_hooks import CommitHooks, install_commit_hooks
from icefloe.coordinator.config import (
    CoordinatorConfig,
    add_arguments,
    overrides_from_args,
)
from icefloe.coordinator.consumer_group import ConsumerGroup
from icefloe.coordinator.maintenance import MaintenanceRunner, producer_publish, settings_from
from icefloe.coordinator.metrics import CoordinatorMetrics, PlannerCacheCollector
from icefloe.coordinator.outbox import Outbox
from icefloe.coordinator.upsert import KeyIndexOpener
from icefloe.key_index import KeyIndex
from icefloe.manifests.reader import ManifestReader
from icefloe.manifests.store import ManifestStore
from icefloe.runtime import kafka
from icefloe.runtime.command import ArgumentParser, run_command
from icefloe.runtime.http import ServiceHttp
from icefloe.runtime.logs import configure_logging
from icefloe.table.catalog import Catalog

log = logging.getLogger("icefloe.coordinator")

_MAX_REQUEST_BYTES = 64 << 20

# At a stop, how long the coordinator waits for queued planner-cache fills (commits are
# already acknowledged; a fill left behind only means the planner decodes those manifests).
_CACHE_FLUSH_S = 10.0


class Coordinator:
    """The running service; :meth:`run` until :meth:`request_stop` (or a signal)."""

    def __init__(
        self,
        config: CoordinatorConfig,
        *,
        catalog: Catalog | None = None,
        hooks: CommitHooks | None = None,
    ) -> None:
        self.config = config
        self.hooks = hooks if hooks is not None else CommitHooks()
        self.catalog = catalog if catalog is not None else load_catalog(config.catalog)
        self._owns_catalog = catalog is None
        install_commit_hooks(self.catalog, self.hooks)
        store = (
            ManifestStore(config.planner_cache_dir, config.planner_cache_disk_max_bytes)
            if config.planner_cache_dir
            else None
        )
        self.reader = ManifestReader(self.catalog.io, store=store)
        self.default_limits = BatchLimits(
            config.batch_max_files, config.batch_max_bytes, config.batch_max_wait_ms
        )
        # Every table's key index opens here: the one place its settings are bound.
        self.open_key_index: KeyIndexOpener = functools.partial(
            KeyIndex.open,
            memory_budget_bytes=config.key_index_memory_bytes,
            spill_dir=config.key_index_spill_dir,
        )
        self.metrics = CoordinatorMetrics()
        if self.reader.decoded_writer is not None:
            self.metrics.registry.register(PlannerCacheCollector(self.reader.decoded_writer))
        self.outbox = Outbox(config, self.metrics)
        self.group = ConsumerGroup(
            config,
            self.metrics,
            self.outbox,
            catalog=self.catalog,
            hooks=self.hooks,
            reader=self.reader,
            default_limits=self.default_limits,
            open_key_index=self.open_key_index,
        )
        self.http = ServiceHttp(
            self.metrics.registry,
            ready=lambda: self.ready,
            healthy=lambda: not self._failed,
            host=config.http_host,
            port=config.http_port,
            detail=self.group.readiness_detail,
            access_log=config.access_log,
        )
        self._failed = False
        # Maintenance of the tables this replica owns (icefloe.coordinator.maintenance).
        self.maintenance = MaintenanceRunner(
            self.catalog,
            settings_from(config),
            self.metrics.registry,
            lambda: [
                t for ps in self.group.partitions.values() if not ps.revoked for t in ps.tables
            ],
            publish=producer_publish(lambda: self.outbox.producer),
            reader=self.reader,
            assigned=lambda: [
                tp.partition for tp, ps in self.group.partitions.items() if not ps.revoked
            ],
            partition_count=lambda: len(
                (
                    self.group.consumer
                    and self.group.consumer.partitions_for_topic(config.events_topic)
                )
                or ()
            ),
        )

    @property
    def ready(self) -> bool:
        return self.group.ready

    @property
    def active_tables(self) -> int:
        """Tables whose worker is running (has events to handle or units to commit)."""
        return self.group.active_tables

    def request_stop(self) -> None:
        self.group.request_stop()

    # -- lifecycle -------------------------------------------------------------------------

    async def run(self) -> None:
        """Serve until stopped; commits ready work and Kafka offsets before returning."""
        config = self.config
        options = config.kafka_options()
        await self.http.start()
        try:
            if config.create_topics:
                await self._create_topics(options)
            # Dead letters carry their original byte for byte (base64, so 4/3 of it): the
            # client must never be the limit; the broker's topic setting is.
            self.outbox.producer = kafka.producer(options, max_request_size=_MAX_REQUEST_BYTES)
            await self.outbox.producer.start()
            await self.group.start(options)
            housekeeping = asyncio.create_task(self.group.housekeeping(), name="icefloe-offsets")
            self.maintenance.start()
            try:
                await self.group.consume()
                await self.group.drain()
            finally:
                housekeeping.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await housekeeping
        except BaseException:
            self._failed = True
            raise
        finally:
            await self._close()

    async def _close(self) -> None:
        await self.maintenance.stop()
        self.group.cancel_workers()
        await kafka.stop_quietly(self.group.consumer, self.outbox.producer)
        writer = self.reader.decoded_writer
        if writer is not None and not await asyncio.to_thread(writer.flush, _CACHE_FLUSH_S):
            log.warning(
                "stopping with %d decoded manifest(s) not yet in the planner cache; the "
                "planner will decode them itself",
                writer.stats.pending,
            )
        self.group.cancel_background()
        await self.http.stop()
        if self._owns_catalog:
            await self.catalog.close()

    async def _create_topics(self, options: Mapping[str, Any]) -> None:
        config = self.config
        admin = kafka.admin(options)
        await admin.start()
        try:
            existing = set(await admin.list_topics())
            wanted = [
                NewTopic(name, config.topic_partitions, config.topic_replication_factor)
                for name in (
                    config.events_topic,
                    config.results_topic,
                    config.dead_letter_topic,
                    config.maintenance_topic,
                )
                if name not in existing
            ]
            if wanted:
                response = await admin.create_topics(wanted)
                for topic, code, message in getattr(response, "topic_errors", ()):
                    if code not in (0, 36):  # 36: created meanwhile by someone else
                        raise KafkaError(f"cannot create topic {topic!r}: {message} ({code})")
                log.info("created topics %s", [t.name for t in wanted])
        finally:
            await admin.close()


# -- entry points ------------------------------------------------------------------------


async def run_coordinator(
    config: CoordinatorConfig,
    *,
    install_signal_handlers: bool = True,
    hooks: CommitHooks | None = None,
) -> int:
    """Run the service until SIGTERM/SIGINT; 0 after a clean stop."""
    coordinator = Coordinator(config, hooks=hooks)
    loop = asyncio.get_running_loop()
    if install_signal_handlers:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, coordinator.request_stop)
    try:
        await coordinator.run()
    finally:
        if install_signal_handlers:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
    return 0


async def run_from_args(args: argparse.Namespace, hooks: CommitHooks | None = None) -> int:
    """The ``icefloe coordinator`` subcommand: environment settings, flags on top."""
    config = CoordinatorConfig.load(overrides_from_args(args))
    configure_logging(config.log_level, config.log_format)
    return await run_coordinator(config, hooks=hooks)


def main(argv: Sequence[str] | None = None, *, hooks: CommitHooks | None = None) -> int:
    """``python -m icefloe.coordinator [flags]``: the same as ``icefloe coordinator``.

    ``hooks`` observes every commit's stages (tests pass one that ends the process at a
    stage); by default nothing observes them.
    """
    parser = ArgumentParser(
        prog="icefloe coordinator",
        description="the commit coordinator service (flags override ICEFLOE_*)",
    )
    add_arguments(parser)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    return run_command(run_from_args(args, hooks))


if __name__ == "__main__":
    sys.exit(main())
