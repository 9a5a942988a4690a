"""Per-table batching: which events wait, which commits are ready, what goes in one snapshot.

This is the coordinator's state machine for one table in one source partition, kept free of
Kafka, catalogs and clocks-you-cannot-control so every rule can be tested on its own. The
service feeds it validated events in partition order and asks it for the next batch.

Units
-----
A *unit* is one commit id that became ready:

* a ``commit-requested`` event, with the pending ``files-written`` events it names (by
  event id or attempt id). Pending events of the same commit id from attempts it does not
  name are taken out too, as *excluded*: their files are orphans, reported for clean-up;
* a ``files-written`` event with ``complete: true``: a streaming micro-batch that is a
  unit by itself.

Batches
-------
Ready units are committed in arrival order, one batch at a time (at most one in flight).
A run of consecutive *append* units, or of consecutive *upsert* units, for the same branch,
with snapshot properties that do not contradict each other, becomes one snapshot when any of
these holds (upserts of a run are resolved in their order, each seeing the rows of those
before it, so batching them changes nothing a reader can see):

* its files reach ``max-files``, or its bytes ``max-bytes`` (the batch stops at the unit
  that crosses the limit, so a flood is cut into limit-sized snapshots);
* its oldest unit has been ready for ``max-wait-ms``;
* something else is queued behind it (a unit of another operation, another branch):
  waiting longer could only delay that unit;
* the service is draining (shutting down).

Every other operation (overwrite, row delta, rewrite) is committed alone, as soon as it is
at the head. Limits come from :class:`BatchLimits`, overridable per table by the table
properties ``icefloe.batch.max-files``, ``icefloe.batch.max-bytes`` and
``icefloe.batch.max-wait-ms``.

Offsets
-------
The batcher tracks the Kafka offset of every event of its table that is not *done* yet:
received but undecided, pending, in a ready unit, or in the batch being committed. An event
is done once committed, or once the caller has dead-lettered it or found it redundant and
released it. The smallest tracked offset is the table's *safe resume point*: restarting
from there can only re-read events, never skip one that is not done. Admissions that keep
an event (``PENDING``, ``READY``) keep its offset tracked until :meth:`TableBatcher.complete`;
for every other outcome the caller releases the offset once it has dealt with the event.
"""

from __future__ import annotations

import hashlib
import heapq
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Generic, TypeVar

from icefloe.errors import ValidationError
from icefloe.events import CommitOperation, CommitRequested, FilesWritten
from icefloe.spec.datafile import DataFile

BATCH_MAX_FILES = "icefloe.batch.max-files"
BATCH_MAX_BYTES = "icefloe.batch.max-bytes"
BATCH_MAX_WAIT_MS = "icefloe.batch.max-wait-ms"

_BATCHABLE = frozenset({CommitOperation.APPEND, CommitOperation.UPSERT})

_K = TypeVar("_K")
_V = TypeVar("_V")


@dataclass(frozen=True, slots=True)
class BatchLimits:
    """When a run of append units is committed; see the module docstring."""

    max_files: int = 1000
    max_bytes: int = 1 << 30
    max_wait_ms: int = 10_000

    def __post_init__(self) -> None:
        for name, minimum in (("max_files", 1), ("max_bytes", 1), ("max_wait_ms", 0)):
            value = getattr(self, name)
            if value < minimum:
                raise ValidationError(f"batch limit {name} must be >= {minimum}, got {value}")

    def with_table_properties(self, properties: Mapping[str, str]) -> BatchLimits:
        """These limits with the table's ``icefloe.batch.*`` overrides applied.

        Raises a ValidationError naming the property whose value is not a valid number.
        """
        values = {"max_files": self.max_files, "max_bytes": self.max_bytes}
        values["max_wait_ms"] = self.max_wait_ms
        for key, name, minimum in (
            (BATCH_MAX_FILES, "max_files", 1),
            (BATCH_MAX_BYTES, "max_bytes", 1),
            (BATCH_MAX_WAIT_MS, "max_wait_ms", 0),
        ):
            raw = properties.get(key)
            if raw is None:
                continue
            try:
                value = int(raw.strip())
            except ValueError:
                raise ValidationError(f"table property {key}={raw!r} is not an integer") from None
            if value < minimum:
                raise ValidationError(f"table property {key}={raw!r} must be >= {minimum}")
            values[name] = value
        return BatchLimits(**values)


class OffsetSet:
    """Offsets not yet done, with a cheap minimum (a heap with lazy deletion)."""

    __slots__ = ("_heap", "_live")

    def __init__(self) -> None:
        self._heap: list[int] = []
        self._live: set[int] = set()

    def add(self, offset: int) -> None:
        if offset not in self._live:
            self._live.add(offset)
            heapq.heappush(self._heap, offset)

    def discard(self, offset: int) -> None:
        self._live.discard(offset)
        heap = self._heap
        while heap and heap[0] not in self._live:
            heapq.heappop(heap)
        if len(heap) > 64 and len(heap) > 4 * len(self._live):
            self._heap = sorted(self._live)  # a sorted list is a valid heap

    def min(self) -> int | None:
        return self._heap[0] if self._heap else None

    def min_excluding(self, excluded: frozenset[int] | set[int]) -> int | None:
        """The smallest offset not in ``excluded``."""
        if not excluded:
            return self.min()
        best: int | None = None
        for offset in self._live:
            if offset not in excluded and (best is None or offset < best):
                best = offset
        return best

    def __contains__(self, offset: object) -> bool:
        return offset in self._live

    def __len__(self) -> int:
        return len(self._live)

    def __iter__(self) -> Iterator[int]:
        return iter(sorted(self._live))


class _BoundedMap(Generic[_K, _V]):
    """An insertion-ordered map that forgets its oldest entries beyond ``capacity``."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._items: OrderedDict[_K, _V] = OrderedDict()

    def put(self, key: _K, value: _V) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def get(self, key: _K) -> _V | None:
        return self._items.get(key)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)


@dataclass(eq=False, slots=True)
class PendingFiles:
    """A validated files-written event with its decoded files and where it was read."""

    event: FilesWritten
    offset: int
    data_files: tuple[DataFile, ...]
    delete_files: tuple[DataFile, ...] = ()
    received_at: float = 0.0
    raw: bytes = b""
    key: bytes | None = None

    @property
    def file_count(self) -> int:
        return len(self.data_files) + len(self.delete_files)

    @property
    def byte_count(self) -> int:
        return sum(f.file_size_in_bytes for f in self.data_files) + sum(
            f.file_size_in_bytes for f in self.delete_files
        )


@dataclass(frozen=True, slots=True)
class SourceEvent:
    """An event's original bytes and position, for dead-lettering it byte for byte."""

    raw: bytes
    key: bytes | None
    offset: int


@dataclass(eq=False, slots=True)
class Unit:
    """One ready commit: the request plus the files-written events it takes and leaves out."""

    request: CommitRequested
    offset: int
    selected: tuple[PendingFiles, ...]
    excluded: tuple[PendingFiles, ...] = ()
    ready_at: float = 0.0
    raw: bytes = b""
    key: bytes | None = None
    streaming: bool = False

    @property
    def commit_id(self) -> str:
        return self.request.commit_id

    @property
    def operation(self) -> CommitOperation:
        return self.request.operation

    @property
    def branch(self) -> str:
        return self.request.target_branch

    @property
    def is_append(self) -> bool:
        return self.request.operation == CommitOperation.APPEND

    @property
    def is_batchable(self) -> bool:
        """Whether runs of this unit's operation share a snapshot (appends, upserts)."""
        return self.request.operation in _BATCHABLE

    @property
    def data_files(self) -> list[DataFile]:
        return [f for p in self.selected for f in p.data_files]

    @property
    def delete_files(self) -> list[DataFile]:
        return [f for p in self.selected for f in p.delete_files]

    @property
    def file_count(self) -> int:
        return sum(p.file_count for p in self.selected)

    @property
    def byte_count(self) -> int:
        return sum(p.byte_count for p in self.selected)

    @property
    def offsets(self) -> frozenset[int]:
        """Offsets of every event this unit consumes (request, selected and excluded)."""
        return frozenset(
            [self.offset, *(p.offset for p in self.selected), *(p.offset for p in self.excluded)]
        )

    @property
    def min_offset(self) -> int:
        return min(self.offsets)

    @property
    def produced_at_ms(self) -> int:
        """When its oldest event was produced: commit latency is measured from here."""
        return min([self.request.produced_at_ms, *(p.event.produced_at_ms for p in self.selected)])

    @property
    def orphan_files(self) -> list[str]:
        return [path for p in self.excluded for path in p.event.file_paths]

    def source_events(self) -> list[SourceEvent]:
        """The request and every files-written event of the unit, to dead-letter them all."""
        out = [SourceEvent(self.raw, self.key, self.offset)]
        for p in (*self.selected, *self.excluded):
            if p.offset != self.offset:
                out.append(SourceEvent(p.raw, p.key, p.offset))
        return out


@dataclass(frozen=True, slots=True)
class Batch:
    """Units committed together as one snapshot (several only when all are appends or all
    are upserts)."""

    units: tuple[Unit, ...]
    trigger: str

    @property
    def commit_ids(self) -> list[str]:
        return [u.commit_id for u in self.units]

    @property
    def branch(self) -> str:
        return self.units[0].branch

    @property
    def is_append(self) -> bool:
        return all(u.is_append for u in self.units)

    @property
    def operation(self) -> CommitOperation:
        """The operation of its units (a batch of several holds one operation)."""
        return self.units[0].operation

    @property
    def file_count(self) -> int:
        return sum(u.file_count for u in self.units)

    @property
    def byte_count(self) -> int:
        return sum(u.byte_count for u in self.units)

    @property
    def offsets(self) -> frozenset[int]:
        return frozenset(o for u in self.units for o in u.offsets)

    @property
    def min_offset(self) -> int:
        return min(u.min_offset for u in self.units)


class CommitStatus(Enum):
    NEW = "new"
    QUEUED = "queued"  # a unit of this commit id is ready or being committed
    COMMITTED = "committed"


class Admission(Enum):
    PENDING = "pending"  # kept, waiting for its commit-requested
    READY = "ready"  # a unit is ready
    DUPLICATE = "duplicate"  # a redelivery of something already taken: release it
    LATE = "late"  # files for a commit id that is already queued or committed
    MISSING_EVENTS = "missing-events"  # a request naming events that never arrived
    NO_FILES = "no-files"  # a request that selects nothing where files are required


@dataclass(frozen=True, slots=True)
class Admitted:
    admission: Admission
    unit: Unit | None = None
    reason: str | None = None


@dataclass(slots=True)
class _CommitFiles:
    """Pending files-written events of one commit id, by event id, in arrival order."""

    events: dict[str, PendingFiles] = field(default_factory=dict)


def event_fingerprint(event: FilesWritten) -> bytes:
    """What makes a files-written event itself (commit id, attempt, branch, completeness
    and files), as a short digest: a redelivery has the same, a reused event id not."""
    h = hashlib.blake2b(digest_size=16)
    for part in (event.commit_id, event.attempt_id, event.branch or "", str(event.complete)):
        h.update(part.encode())
        h.update(b"\0")
    for path in sorted(event.file_paths):
        h.update(path.encode())
        h.update(b"\0")
    return h.digest()


def _properties_conflict(merged: Mapping[str, str], extra: Mapping[str, str]) -> bool:
    return any(k in merged and merged[k] != v for k, v in extra.items())


class TableBatcher:
    """The batching state of one table in one source partition (see the module docstring)."""

    def __init__(
        self,
        table: str,
        limits: BatchLimits | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        remember: int = 100_000,
    ) -> None:
        self.table = table
        self.limits = limits or BatchLimits()
        self._clock = clock
        self._offsets = OffsetSet()
        self._pending: dict[str, _CommitFiles] = {}
        self._pending_ids: dict[str, PendingFiles] = {}
        self._ready: deque[Unit] = deque()
        self._queued: dict[str, Unit] = {}
        self._in_flight: Batch | None = None
        self._committed: _BoundedMap[str, int] = _BoundedMap(remember)
        self._taken_event_ids: _BoundedMap[str, bytes] = _BoundedMap(remember)

    # -- offsets ---------------------------------------------------------------------------

    def track(self, offset: int) -> None:
        """Count an event as not done from the moment it is received."""
        self._offsets.add(offset)

    def release(self, offset: int) -> None:
        """The event at ``offset`` is done (dead-lettered, redundant or skipped)."""
        self._offsets.discard(offset)

    def is_tracked(self, offset: int) -> bool:
        return offset in self._offsets

    @property
    def min_tracked(self) -> int | None:
        return self._offsets.min()

    @property
    def tracked_count(self) -> int:
        return len(self._offsets)

    def safe_resume_point(self, position: int, batch: Batch | None = None) -> int:
        """Where to resume this table's events once ``batch`` (if any) is committed.

        ``position`` is the partition's next offset to read: with nothing else tracked,
        every event of this table before it is done.
        """
        smallest = self._offsets.min_excluding(batch.offsets if batch is not None else set())
        return position if smallest is None else min(smallest, position)

    # -- what is known about commit ids and events ----------------------------------------

    def commit_status(self, commit_id: str) -> CommitStatus:
        if commit_id in self._queued:
            return CommitStatus.QUEUED
        if commit_id in self._committed:
            return CommitStatus.COMMITTED
        return CommitStatus.NEW

    def committed_snapshot(self, commit_id: str) -> int | None:
        """The snapshot known to hold ``commit_id``, if it is known to be committed."""
        return self._committed.get(commit_id)

    def mark_committed(self, commits: Mapping[str, int]) -> None:
        """Record commit ids found in the table (by this or another coordinator)."""
        for commit_id, snapshot_id in commits.items():
            self._committed.put(commit_id, snapshot_id)

    def knows_event(self, event_id: str) -> bool:
        """Whether an event with this id is pending or was already taken into a unit."""
        return event_id in self._pending_ids or event_id in self._taken_event_ids

    def same_event(self, event: FilesWritten) -> bool:
        """Whether ``event`` is a redelivery of the known event with its id (same commit
        id, attempt and files), not a different event reusing the id."""
        pending = self._pending_ids.get(event.event_id)
        if pending is not None:
            return event_fingerprint(pending.event) == event_fingerprint(event)
        known = self._taken_event_ids.get(event.event_id)
        return known is None or known == event_fingerprint(event)

    def pending_events(self, commit_id: str | None = None) -> list[PendingFiles]:
        if commit_id is None:
            return list(self._pending_ids.values())
        group = self._pending.get(commit_id)
        return list(group.events.values()) if group else []

    # -- admission -------------------------------------------------------------------------

    def add_files(self, pending: PendingFiles) -> Admitted:
        """Admit a validated files-written event; a complete one becomes a unit at once."""
        event = pending.event
        if self.knows_event(event.event_id):
            return Admitted(Admission.DUPLICATE, reason=f"event {event.event_id} seen before")
        status = self.commit_status(event.commit_id)
        if status is not CommitStatus.NEW:
            return Admitted(
                Admission.LATE,
                reason=f"commit id {event.commit_id!r} is already {status.value}",
            )
        if event.complete:
            if self._pending.get(event.commit_id):
                return Admitted(
                    Admission.LATE,
                    reason=(
                        f"complete event for commit id {event.commit_id!r}, which already has "
                        "pending files-written events waiting for a commit-requested"
                    ),
                )
            unit = Unit(
                request=event.as_commit_request(),
                offset=pending.offset,
                selected=(pending,),
                ready_at=self._clock(),
                raw=pending.raw,
                key=pending.key,
                streaming=True,
            )
            self._enqueue(unit)
            return Admitted(Admission.READY, unit)
        self._pending.setdefault(event.commit_id, _CommitFiles()).events[event.event_id] = pending
        self._pending_ids[event.event_id] = pending
        return Admitted(Admission.PENDING)

    def add_request(
        self,
        request: CommitRequested,
        offset: int,
        *,
        raw: bytes = b"",
        key: bytes | None = None,
    ) -> Admitted:
        """Admit a validated commit-requested: a unit, a duplicate, or a refusal."""
        status = self.commit_status(request.commit_id)
        if status is not CommitStatus.NEW:
            return Admitted(
                Admission.DUPLICATE,
                reason=f"commit id {request.commit_id!r} is already {status.value}",
            )
        group = self._pending.get(request.commit_id)
        candidates = list(group.events.values()) if group else []
        selection = request.select(p.event for p in candidates)
        if selection.missing_event_ids:
            missing = sorted(selection.missing_event_ids)
            return Admitted(
                Admission.MISSING_EVENTS,
                reason=(
                    f"commit-requested for commit id {request.commit_id!r} names "
                    f"{len(missing)} files-written event(s) that were not received before it: "
                    f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}"
                ),
            )
        chosen = {e.event_id for e in selection.selected}
        left_out = {e.event_id for e in selection.excluded}
        needs_files = request.operation in (
            CommitOperation.APPEND,
            CommitOperation.ROW_DELTA,
            CommitOperation.UPSERT,
        )
        if needs_files and not chosen:
            return Admitted(
                Admission.NO_FILES,
                reason=(
                    f"{request.operation} commit-requested for commit id {request.commit_id!r} "
                    f"selects no files: no files-written event of attempt(s) "
                    f"{list(request.attempt_ids)} or event id(s) {list(request.event_ids)} "
                    "was received"
                ),
            )
        selected = tuple(p for p in candidates if p.event.event_id in chosen)
        excluded = tuple(p for p in candidates if p.event.event_id in left_out)
        for p in (*selected, *excluded):
            self._take_pending(p)
        unit = Unit(
            request=request,
            offset=offset,
            selected=selected,
            excluded=excluded,
            ready_at=self._clock(),
            raw=raw,
            key=key,
        )
        self._enqueue(unit)
        return Admitted(Admission.READY, unit)

    def drop_commit(self, commit_id: str) -> list[PendingFiles]:
        """Take out the pending events of a commit id found committed; caller releases them."""
        group = self._pending.get(commit_id)
        if group is None:
            return []
        out = list(group.events.values())
        for p in out:
            self._take_pending(p)
        return out

    def expire(self, max_age_s: float) -> list[PendingFiles]:
        """Take out pending events older than ``max_age_s`` (abandoned: their writer never
        asked for a commit); the caller dead-letters and releases them."""
        cutoff = self._clock() - max_age_s
        old = [p for p in self._pending_ids.values() if p.received_at <= cutoff]
        for p in old:
            self._take_pending(p)
        return old

    def _take_pending(self, p: PendingFiles) -> None:
        event = p.event
        self._pending_ids.pop(event.event_id, None)
        group = self._pending.get(event.commit_id)
        if group is not None:
            group.events.pop(event.event_id, None)
            if not group.events:
                del self._pending[event.commit_id]
        self._taken_event_ids.put(event.event_id, event_fingerprint(event))

    def _enqueue(self, unit: Unit) -> None:
        self._ready.append(unit)
        self._queued[unit.commit_id] = unit
        for p in unit.selected:
            self._taken_event_ids.put(p.event.event_id, event_fingerprint(p.event))

    # -- batching --------------------------------------------------------------------------

    @property
    def in_flight(self) -> Batch | None:
        return self._in_flight

    @property
    def ready_units(self) -> list[Unit]:
        return list(self._ready)

    @property
    def pending_count(self) -> int:
        return len(self._pending_ids)

    @property
    def has_work(self) -> bool:
        """Whether something is ready or being committed (pending events need no task)."""
        return bool(self._ready) or self._in_flight is not None

    @property
    def is_idle(self) -> bool:
        return not self.has_work and not self._offsets

    def next_deadline(self) -> float | None:
        """When the head of the queue becomes due by age (None: nothing is waiting)."""
        if self._in_flight is not None or not self._ready:
            return None
        head = self._ready[0]
        if not head.is_batchable:
            return head.ready_at
        return head.ready_at + self.limits.max_wait_ms / 1000.0

    def take_batch(self, *, draining: bool = False) -> Batch | None:
        """The next batch to commit, if one is due; it stays in flight until completed."""
        if self._in_flight is not None or not self._ready:
            return None
        head = self._ready[0]
        units: list[Unit] = []
        trigger: str | None = None
        if not head.is_batchable:
            units, trigger = [head], "alone"
        else:
            files = size = 0
            merged: dict[str, str] = {}
            blocked = False
            for unit in self._ready:
                props = unit.request.snapshot_properties
                if (
                    unit.operation != head.operation
                    or unit.branch != head.branch
                    or _properties_conflict(merged, props)
                ):
                    blocked = True
                    break
                units.append(unit)
                merged.update(props)
                files += unit.file_count
                size += unit.byte_count
                if files >= self.limits.max_files:
                    trigger = "max-files"
                    break
                if size >= self.limits.max_bytes:
                    trigger = "max-bytes"
                    break
            if trigger is None:
                if blocked:
                    trigger = "blocked"
                elif draining:
                    trigger = "draining"
                elif self._clock() - head.ready_at >= self.limits.max_wait_ms / 1000.0:
                    trigger = "max-wait"
                else:
                    return None
        for _ in units:
            self._ready.popleft()
        self._in_flight = Batch(tuple(units), trigger)
        return self._in_flight

    def complete(self, batch: Batch, committed: Mapping[str, int]) -> None:
        """The batch is dealt with: committed (``committed`` maps its commit ids to their
        snapshots) or, for units not in ``committed``, refused and dead-lettered."""
        if batch is not self._in_flight:
            raise ValidationError(f"table {self.table}: completing a batch that is not in flight")
        self._in_flight = None
        for unit in batch.units:
            self._queued.pop(unit.commit_id, None)
            for offset in unit.offsets:
                self._offsets.discard(offset)
        self.mark_committed({cid: sid for cid, sid in committed.items()})

    def abort(self, batch: Batch) -> None:
        """Put an uncommitted batch back at the head of the queue, to try again."""
        if batch is not self._in_flight:
            raise ValidationError(f"table {self.table}: aborting a batch that is not in flight")
        self._in_flight = None
        self._ready.extendleft(reversed(batch.units))

    def reset(self) -> Iterable[Unit]:
        """Forget everything (the partition was revoked): another owner will re-read it."""
        units = [*(self._in_flight.units if self._in_flight else ()), *self._ready]
        self._in_flight = None
        self._ready.clear()
        self._queued.clear()
        self._pending.clear()
        self._pending_ids.clear()
        self._offsets = OffsetSet()
        return units
