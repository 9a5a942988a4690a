"""Plans held between a plan request and the fetches of its other pages.

A plan is a :class:`~icefloe.scan.planning.ScanPlan` (selected rows of cached manifests) with the
page size it was issued with. Held plans are a cache, not state: every plan id is signed and
self-describing (:mod:`icefloe.planner.tokens`), so a plan dropped here, or never made on
this replica, is planned again from its token when a page of it is asked for.

Held plans share the manifest cache's memory budget (:class:`~icefloe.manifest_cache.
ManifestCache`): a held plan *pins* the manifests its rows are in, which the cache then
counts once however many plans hold them and whether or not it still lists them. Summing
each plan's manifests instead would count a table's manifests once per full plan of it
(forty full plans of a 100k-file table "held" 2 GiB that was in fact the cache's 54 MiB),
and would not count a manifest the cache evicted while a plan kept it alive. So the store
drops its oldest plans while

* what plans keep outside the cache (pinned manifests it no longer lists, compact copies of
  selective plans' rows, bytes charged for pages written ahead) exceeds ``max_bytes``, the
  plans' share of the budget, which leaves the cache the rest for its own entries; or
* the cache's entries and what plans keep outside it exceed the whole budget with every
  entry nobody pins evicted (full plans pinning the cache's entries leave no room).

A plan that alone breaks either bound is not held at all: it serves its first page and its
other pages are planned again from their tokens. Memory for decoded manifests is then at
most the cache budget whatever the number of held plans.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from icefloe.manifests.cache import ManifestCache
from icefloe.manifests.cached import CachedManifest
from icefloe.scan.planning import ScanPlan
from icefloe.table.catalog import TableIdentifier

log = logging.getLogger(__name__)


@dataclass
class StoredPlan:
    plan_id: str
    table: TableIdentifier
    plan: ScanPlan
    page_size: int
    expires_at: float
    fetched: set[int]
    key: str = ""
    # The manifests pinned for the plan while it is held (the list unpinned on its drop).
    pinned: list[CachedManifest] = field(default_factory=list)
    # Bytes the plan keeps beside its manifests (a page written ahead), charged to the
    # cache's budget while the plan is held.
    own_bytes: int = 0

    @property
    def pages(self) -> int:
        return max(1, -(-len(self.plan) // self.page_size))

    def tokens(self) -> list[str]:
        return [f"{self.plan_id}:{page}" for page in range(1, self.pages)]


class PlanStore:
    """Plans by key, dropped on cancel, on expiry, when the store is full (oldest first), when
    they keep more than their share of the memory budget (oldest first, see the module
    docstring), and shortly after every page was fetched (a grace period lets clients retry
    a fetch). A dropped plan whose id is signed and self-describing is planned again when a
    page of it is asked for.

    ``memory`` is the manifest cache whose budget plans share; without it (tests of
    expiry and capacity) plans pin nothing and only their own bytes count against
    ``max_bytes``. The store may be asked to shed plans from a worker thread (the cache
    calls :meth:`shed` when a manifest derives a column past the budget), so its changes
    are made under a lock.
    """

    FETCHED_GRACE_S = 30.0
    # A plan too large to hold is said at most this often: every page of it plans again and
    # comes back here, and the remedy (a larger budget) is the same each time.
    TOO_LARGE_LOG_INTERVAL_S = 60.0

    def __init__(
        self,
        ttl_s: float,
        max_plans: int,
        clock: Callable[[], float],
        max_bytes: int | None = None,
        memory: ManifestCache | None = None,
    ) -> None:
        self.ttl_s = ttl_s
        self.max_plans = max_plans
        self.max_bytes = max_bytes
        self.clock = clock
        self.memory = memory
        self._plans: OrderedDict[str, StoredPlan] = OrderedDict()
        self._own_bytes = 0
        self._cancelled: OrderedDict[str, float] = OrderedDict()
        self._next_sweep = float("-inf")
        self._lock = threading.RLock()
        self.dropped_for_memory = 0
        self._too_large_said = float("-inf")
        if memory is not None:
            memory.on_pressure = self.shed

    def __len__(self) -> int:
        return len(self._plans)

    @property
    def bytes(self) -> int:
        """Bytes held plans add to memory: pinned manifests the cache does not list, and
        their own bytes (with ``memory``, as the cache counts them)."""
        if self.memory is None:
            return self._own_bytes
        return self.memory.stats().outside_bytes

    @property
    def pinned_bytes(self) -> int:
        """Distinct bytes of every manifest held plans pin, listed by the cache or not."""
        return 0 if self.memory is None else self.memory.stats().pinned_bytes

    def add(
        self,
        table: TableIdentifier,
        plan: ScanPlan,
        page_size: int,
        *,
        plan_id: str | None = None,
        key: str | None = None,
    ) -> StoredPlan:
        """Hold ``plan`` (returned as a StoredPlan whether or not it could be held)."""
        self.sweep()
        if plan_id is None:
            plan_id = uuid.uuid4().hex
        key = plan_id if key is None else key
        stored = StoredPlan(plan_id, table, plan, page_size, self.clock() + self.ttl_s, {0}, key)
        if stored.pages == 1:
            stored.expires_at = min(stored.expires_at, self.clock() + self.FETCHED_GRACE_S)
        with self._lock:
            old = self._plans.pop(key, None)
            if old is not None:
                self._release(old)
            while len(self._plans) >= self.max_plans:
                self._drop_oldest()
            if self.memory is not None:
                stored.pinned = plan.manifests()
                self.memory.pin(stored.pinned)
            self._plans[key] = stored
            self._fit()
            if key not in self._plans:
                self._say_too_large(stored)
        return stored

    def _say_too_large(self, stored: StoredPlan) -> None:
        """Warn (rate-limited) that a plan could not be held even alone: each of its pages
        is then planned again from its token, which for a full plan of a large table is
        the whole plan per page, so the operator should raise the budget."""
        now = self.clock()
        if now - self._too_large_said < self.TOO_LARGE_LOG_INTERVAL_S:
            return
        self._too_large_said = now
        held = sum(m.nbytes for m in stored.plan.manifests())
        log.warning(
            "a plan of table %s (%d tasks, its manifests %d MiB in memory) does not fit the "
            "planner's memory budget even alone, so every page of it is planned again when "
            "fetched; raise ICEFLOE_PLANNER_CACHE_MAX_BYTES (and PLAN_MAX_BYTES if set) "
            "above what the table's manifests take",
            stored.table,
            len(stored.plan),
            held >> 20,
        )

    def charge(self, stored: StoredPlan, nbytes: int) -> None:
        """Count ``nbytes`` more (or fewer, negative) that a held plan keeps beside its
        manifests; the oldest plans are dropped if that leaves no room (maybe this one)."""
        with self._lock:
            if self._plans.get(stored.key) is not stored:
                return  # not held: its bytes go with the request that holds it
            stored.own_bytes += nbytes
            self._own_bytes += nbytes
            if self.memory is not None:
                self.memory.charge(nbytes)
            self._fit()

    def shed(self) -> None:
        """Drop the oldest plans until held plans are within their share and the budget."""
        with self._lock:
            self._fit()

    def _over(self) -> bool:
        if self.memory is None:
            return self.max_bytes is not None and self._own_bytes > self.max_bytes
        if self.max_bytes is not None and self.memory.stats().outside_bytes > self.max_bytes:
            return True
        return self.memory.over_budget()

    def _fit(self) -> None:
        while self._plans and self._over():
            self._drop_oldest()
            self.dropped_for_memory += 1

    def _release(self, stored: StoredPlan) -> None:
        self._own_bytes -= stored.own_bytes
        if self.memory is not None:
            if stored.own_bytes:
                self.memory.charge(-stored.own_bytes)
            self.memory.unpin(stored.pinned)
        stored.own_bytes = 0
        stored.pinned = []

    def _drop_oldest(self) -> None:
        _, dropped = self._plans.popitem(last=False)
        self._release(dropped)

    def get(self, key: str, table: TableIdentifier) -> StoredPlan | None:
        self.sweep()
        stored = self._plans.get(key)
        if stored is None or stored.table != table:
            return None
        if stored.expires_at <= self.clock():
            self.sweep(force=True)
            return None
        return stored

    def page_fetched(self, stored: StoredPlan, page: int) -> None:
        stored.fetched.add(page)
        if len(stored.fetched) >= stored.pages:
            stored.expires_at = min(stored.expires_at, self.clock() + self.FETCHED_GRACE_S)

    def remove(self, key: str, table: TableIdentifier) -> bool:
        with self._lock:
            stored = self._plans.get(key)
            if stored is None or stored.table != table:
                return False
            del self._plans[key]
            self._release(stored)
        return True

    def cancel(self, key: str) -> None:
        """Remember a cancelled plan until it would have expired, so this replica does not
        plan it again from its token."""
        self._cancelled[key] = self.clock() + self.ttl_s
        while len(self._cancelled) > self.max_plans:
            self._cancelled.popitem(last=False)

    def cancelled(self, key: str) -> bool:
        until = self._cancelled.get(key)
        return until is not None and until > self.clock()

    # Expired plans are looked for at most this often: a sweep walks every held plan, which
    # per request would cost more than a selective plan itself with thousands held.
    SWEEP_INTERVAL_S = 1.0

    def sweep(self, *, force: bool = False) -> None:
        now = self.clock()
        if not force and now < self._next_sweep:
            return
        self._next_sweep = now + self.SWEEP_INTERVAL_S
        with self._lock:
            for key in [k for k, s in self._plans.items() if s.expires_at <= now]:
                self._release(self._plans.pop(key))
        for key in [k for k, until in self._cancelled.items() if until <= now]:
            del self._cancelled[key]
