"""Current table metadata for the planner: refreshed by commit events, polled as a fallback.

The planner answers from table state it holds in memory, and the promise it makes is that
no answer reflects a state older than the refresh interval. Three things keep that promise:

* **events**: the coordinator publishes a ``table-committed`` event on its results topic for
  every commit; the planner reads the topic and applies each event at once, by reading the
  metadata file the event names. A commit is visible to plans within the event latency;
* **polling**: a background loop reloads, through the catalog, every table used recently
  whose state is getting old, so requests rarely wait for a reload;
* **at request time**, a state older than the interval is reloaded before it is used.

A table's state is "verified" at the time it was read from the catalog. When the results
topic is trusted (the coordinator is the only committer) and the consumer has read every
event produced before time T, a state read before T is still current at T: the consumer
would have applied any later commit. That extends the verification time, so with a healthy
consumer tables are reloaded rarely; but never for longer than ``trusted_refresh_interval_s``
after the last read from the catalog, so commits by writers other than the coordinator
become visible at that longer interval even while events are trusted.

An event is a claim, not a fact: anyone able to write to the results topic could name
another table's metadata. Before the planner moves a table to the metadata an event names,
that metadata must be the same table (its ``table-uuid`` and ``location``) and the file must
lie under the table's metadata directory; otherwise the event is rejected, logged, and the
table is reloaded from the catalog instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from icefloe.errors import IcefloeError, NotFoundError, ValidationError
from icefloe.events import Event, TableCommitted
from icefloe.retry import Backoff, Retry, RetryEvent
from icefloe.runtime import kafka
from icefloe.spec.metadata import TableMetadata
from icefloe.table.catalog import Catalog, TableIdentifier

log = logging.getLogger(__name__)

Clock = Callable[[], float]


@dataclass(frozen=True, slots=True)
class TableState:
    """A table's metadata as read at ``loaded_at`` (monotonic seconds)."""

    identifier: TableIdentifier
    metadata: TableMetadata
    metadata_location: str
    loaded_at: float


def is_newer(candidate: TableMetadata, candidate_location: str, current: TableState) -> bool:
    """Whether ``candidate`` is a later version of the table than ``current``."""
    if candidate_location == current.metadata_location:
        return False
    if any(e.metadata_file == current.metadata_location for e in candidate.metadata_log):
        return True
    old = current.metadata
    return (candidate.last_sequence_number, candidate.last_updated_ms) > (
        old.last_sequence_number,
        old.last_updated_ms,
    )


def same_table_problem(
    candidate: TableMetadata, candidate_location: str, current: TableState
) -> str | None:
    """Why ``candidate`` (read from ``candidate_location``) is not a version of ``current``'s
    table, or None if it is: same table uuid, same location, and a metadata file under the
    table's metadata directory (``write.metadata.path`` when set)."""
    old = current.metadata
    if candidate.table_uuid != old.table_uuid:
        return f"its metadata has table-uuid {candidate.table_uuid}, the table {old.table_uuid}"
    if candidate.location.rstrip("/") != old.location.rstrip("/"):
        return f"its metadata has location {candidate.location!r}, the table {old.location!r}"
    roots = {old.location.rstrip("/") + "/metadata/"}
    custom = old.properties.get("write.metadata.path")
    if custom:
        roots.add(custom.rstrip("/") + "/")
    if not any(candidate_location.startswith(r) for r in roots):
        return f"{candidate_location!r} is not under the table's metadata directory"
    return None


class TableRefresher:
    """Holds the tables the planner serves; see the module docstring for freshness."""

    def __init__(
        self,
        catalog: Catalog,
        *,
        refresh_interval_s: float,
        idle_after_s: float = 3600.0,
        trust_events: bool = True,
        trusted_refresh_interval_s: float | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        if refresh_interval_s <= 0:
            raise ValidationError(f"refresh interval must be positive, got {refresh_interval_s}")
        if trusted_refresh_interval_s is None:
            trusted_refresh_interval_s = 10 * refresh_interval_s
        if trusted_refresh_interval_s < refresh_interval_s:
            raise ValidationError(
                "the trusted refresh interval must be at least the refresh interval, got "
                f"{trusted_refresh_interval_s} < {refresh_interval_s}"
            )
        self.trusted_refresh_interval_s = trusted_refresh_interval_s
        self.rejected_events = 0
        self.catalog = catalog
        self.refresh_interval_s = refresh_interval_s
        self.idle_after_s = idle_after_s
        self.trust_events = trust_events
        self.clock = clock
        self._states: dict[TableIdentifier, TableState] = {}
        self._last_used: dict[TableIdentifier, float] = {}
        self._loading: dict[TableIdentifier, asyncio.Future[TableState]] = {}
        self._changed_while_loading: set[TableIdentifier] = set()
        self._events_confirmed_at: float | None = None
        self.reloads: dict[str, int] = {"request": 0, "poll": 0, "event": 0}

    # -- freshness ----------------------------------------------------------------------------

    def events_confirmed(self, at: float) -> None:
        """The results topic has been read up to everything produced before ``at``."""
        if self._events_confirmed_at is None or at > self._events_confirmed_at:
            self._events_confirmed_at = at

    def verified_at(self, state: TableState) -> float:
        confirmed = self._events_confirmed_at
        if self.trust_events and confirmed is not None and confirmed > state.loaded_at:
            # Trusted events vouch for the table, but only so long: other writers' commits
            # produce no event, so the catalog is read again at the longer interval.
            ceiling = state.loaded_at + self.trusted_refresh_interval_s - self.refresh_interval_s
            return min(confirmed, max(state.loaded_at, ceiling))
        return state.loaded_at

    def age(self, state: TableState) -> float:
        return self.clock() - self.verified_at(state)

    def is_fresh(self, state: TableState) -> bool:
        return self.age(state) <= self.refresh_interval_s

    @property
    def tables(self) -> list[TableIdentifier]:
        return list(self._states)

    # -- reading ------------------------------------------------------------------------------

    async def get(self, identifier: TableIdentifier | str) -> TableState:
        """The table's state, reloaded first unless it is fresh. NotFoundError if it is gone."""
        ident = TableIdentifier.parse(identifier)
        self._last_used[ident] = self.clock()
        state = self._states.get(ident)
        if state is not None and self.is_fresh(state):
            return state
        return await self._reload(ident, "request")

    async def _reload(self, ident: TableIdentifier, reason: str) -> TableState:
        pending = self._loading.get(ident)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[TableState] = asyncio.get_running_loop().create_future()
        self._loading[ident] = future
        try:
            state = await self._load(ident, reason)
            if ident in self._changed_while_loading:
                # An event arrived while the catalog was read: the read may predate it.
                self._changed_while_loading.discard(ident)
                state = await self._load(ident, reason)
        except BaseException as e:
            self._changed_while_loading.discard(ident)
            future.set_exception(e)
            future.exception()
            raise
        finally:
            self._loading.pop(ident, None)
        future.set_result(state)
        return state

    async def _load(self, ident: TableIdentifier, reason: str) -> TableState:
        started = self.clock()
        try:
            table = await self.catalog.load_table(ident)
        except NotFoundError:
            self.forget(ident)
            raise
        state = TableState(ident, table.metadata, table.metadata_location, started)
        current = self._states.get(ident)
        if current is not None and not is_newer(state.metadata, state.metadata_location, current):
            # Same version (or an event already moved us further): only re-verified.
            state = TableState(ident, current.metadata, current.metadata_location, started)
        self._states[ident] = state
        self.reloads[reason] += 1
        return state

    def committed(
        self, identifier: TableIdentifier, metadata: TableMetadata, metadata_location: str
    ) -> None:
        """A commit this process just made (a REST write): serve it at once.

        A load already under way may have read the table before the commit: it reloads.
        """
        if identifier in self._loading:
            self._changed_while_loading.add(identifier)
        current = self._states.get(identifier)
        if current is not None and not is_newer(metadata, metadata_location, current):
            return
        now = self.clock()
        self._states[identifier] = TableState(identifier, metadata, metadata_location, now)
        self._last_used[identifier] = now

    def dropped(self, identifier: TableIdentifier) -> None:
        """A table this process just dropped or renamed away: stop serving it now.

        A load under way may have read it before the drop: it reloads (and finds it gone).
        """
        if identifier in self._loading:
            self._changed_while_loading.add(identifier)
        self.forget(identifier)

    def forget(self, identifier: TableIdentifier) -> None:
        self._states.pop(identifier, None)
        self._last_used.pop(identifier, None)

    # -- events -------------------------------------------------------------------------------

    async def apply_event(self, event: TableCommitted) -> bool:
        """Move a known table to the metadata a commit event names; True if it moved."""
        try:
            ident = event.identifier
        except ValidationError:
            log.warning("table-committed event %s names an invalid table", event.event_id)
            return False
        if ident in self._loading:
            self._changed_while_loading.add(ident)
            return False
        current = self._states.get(ident)
        if current is None:
            return False  # nobody asked for it; a first request loads it fresh
        if event.metadata_location == current.metadata_location:
            return False
        try:
            metadata = await self.catalog.read_metadata(event.metadata_location)
        except IcefloeError as e:
            log.warning(
                "cannot read %s named by a table-committed event for %s (%s); reloading",
                event.metadata_location,
                ident,
                e,
            )
            with contextlib.suppress(IcefloeError):
                await self._reload(ident, "event")
            return True
        problem = same_table_problem(metadata, event.metadata_location, current)
        if problem is not None:
            self.rejected_events += 1
            log.warning(
                "rejecting table-committed event %s for %s: %s; reloading from the catalog",
                event.event_id,
                ident,
                problem,
            )
            with contextlib.suppress(IcefloeError):
                await self._reload(ident, "event")
            return False
        if not is_newer(metadata, event.metadata_location, current):
            return False
        # The event's version was committed after the current state was read (it is newer),
        # so it was the table's state at some time after ``current.loaded_at``: that is as
        # far as it is verified; the consumer's progress or polling vouches from then on.
        self._states[ident] = TableState(
            ident, metadata, event.metadata_location, current.loaded_at
        )
        self.reloads["event"] += 1
        return True

    # -- polling ------------------------------------------------------------------------------

    async def refresh_due(self) -> int:
        """Reload recently used tables that are half-way to stale; forget idle ones."""
        now = self.clock()
        reloaded = 0
        for ident in list(self._states):
            last_used = self._last_used.get(ident, 0.0)
            if now - last_used > self.idle_after_s:
                self.forget(ident)
                continue
            state = self._states.get(ident)
            if state is None or self.age(state) < self.refresh_interval_s / 2:
                continue
            try:
                await self._reload(ident, "poll")
                reloaded += 1
            except NotFoundError:
                log.info("table %s is gone; forgetting it", ident)
            except IcefloeError as e:
                log.warning("polling %s failed: %s", ident, e)
        return reloaded

    async def run_polling(self, stop: asyncio.Event) -> None:
        """Call :meth:`refresh_due` every quarter interval until ``stop`` is set."""
        period = self.refresh_interval_s / 4
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=period)
            if stop.is_set():
                return
            try:
                await self.refresh_due()
            except Exception:
                log.exception("table polling failed")


ConsumerFactory = Callable[..., Any]
_FEED_PAUSE = Backoff(1.0, 1.0, jitter=False)  # after a failed poll


class TableCommittedFeed:
    """Feeds ``table-committed`` events from the results topic to a :class:`TableRefresher`.

    No consumer group: every planner instance reads every partition, from the end (a table
    is loaded fresh the first time it is asked for, so older events do not matter).
    """

    def __init__(
        self,
        refresher: TableRefresher,
        topic: str,
        options: dict[str, Any],
        *,
        consumer_factory: ConsumerFactory | None = None,
        poll_timeout_ms: int = 500,
    ) -> None:
        self.refresher = refresher
        self.topic = topic
        self.options = options
        self.poll_timeout_ms = poll_timeout_ms
        self._factory = consumer_factory
        self._consumer: Any = None
        self.events = 0
        self.rejected = 0
        self.last_confirmed: float | None = None
        self.running = False

    async def start(self) -> None:
        factory = self._factory or kafka.tail_consumer
        self._consumer = factory(self.options, self.topic)
        await self._consumer.start()
        self.running = True

    async def stop(self) -> None:
        self.running = False
        consumer, self._consumer = self._consumer, None
        await kafka.stop_quietly(consumer)

    async def poll_once(self) -> int:
        """Read one batch, apply its events, and confirm progress when caught up."""
        consumer = self._consumer
        if consumer is None:
            raise ValidationError("the results consumer is not started")
        started = self.refresher.clock()
        batches = await consumer.getmany(timeout_ms=self.poll_timeout_ms)
        applied = 0
        for event in kafka.decoded(batches):
            applied += await self._handle(event)
        if await self._caught_up(consumer):
            self.refresher.events_confirmed(started)
            self.last_confirmed = started
        return applied

    async def _handle(self, event: Event | ValidationError) -> int:
        if isinstance(event, ValidationError):
            self.rejected += 1
            log.warning("skipping an unreadable event on %s: %s", self.topic, event)
            return 0
        if not isinstance(event, TableCommitted):
            return 0
        self.events += 1
        return int(await self.refresher.apply_event(event))

    @staticmethod
    async def _caught_up(consumer: Any) -> bool:
        assignment = consumer.assignment()
        if not assignment:
            return False
        for tp in assignment:
            high = consumer.highwater(tp)
            if high is None:
                return False
            if await consumer.position(tp) < high:
                return False
        return True

    async def run(self, stop: asyncio.Event) -> None:
        """Poll until ``stop``; errors are logged and retried after a pause."""

        def failed(event: RetryEvent) -> None:
            log.error("reading %s failed; retrying", self.topic, exc_info=event.error)

        await Retry(_FEED_PAUSE, on_retry=failed).run_until(stop, self.poll_once)


__all__ = ["TableCommittedFeed", "TableRefresher", "TableState", "is_newer", "same_table_problem"]
