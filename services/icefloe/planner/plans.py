"""Plans held between a plan request and the fetches of its other pages.

A plan is a :class:`~icefloe.scan.ScanPlan` (selected rows of cached manifests) with the
page size it was issued with. Held plans are a cache, not state: every plan id is signed and
self-describing (:mod:`icefloe.planner.tokens`), so a plan dropped here, or never made on
this replica, is planned again from its token when a page of it is asked for.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from icefloe.catalog import TableIdentifier
from icefloe.scan import ScanPlan


@dataclass
class StoredPlan:
    plan_id: str
    table: TableIdentifier
    plan: ScanPlan
    page_size: int
    expires_at: float
    fetched: set[int]
    key: str = ""

    @property
    def pages(self) -> int:
        return max(1, -(-len(self.plan) // self.page_size))

    @property
    def nbytes(self) -> int:
        return int(getattr(self.plan, "nbytes", 0))

    def tokens(self) -> list[str]:
        return [f"{self.plan_id}:{page}" for page in range(1, self.pages)]


class PlanStore:
    """Plans by key, dropped on cancel, on expiry, when the store is full (oldest first), when
    their selected rows exceed ``max_bytes`` together (oldest first), and shortly after
    every page was fetched (a grace period lets clients retry a fetch). A dropped plan whose
    id is signed and self-describing is planned again when a page of it is asked for."""

    FETCHED_GRACE_S = 30.0

    def __init__(
        self,
        ttl_s: float,
        max_plans: int,
        clock: Callable[[], float],
        max_bytes: int | None = None,
    ) -> None:
        self.ttl_s = ttl_s
        self.max_plans = max_plans
        self.max_bytes = max_bytes
        self.clock = clock
        self._plans: OrderedDict[str, StoredPlan] = OrderedDict()
        self._bytes = 0
        self._cancelled: OrderedDict[str, float] = OrderedDict()
        self._next_sweep = float("-inf")

    def __len__(self) -> int:
        return len(self._plans)

    @property
    def bytes(self) -> int:
        return self._bytes

    def add(
        self,
        table: TableIdentifier,
        plan: ScanPlan,
        page_size: int,
        *,
        plan_id: str | None = None,
        key: str | None = None,
    ) -> StoredPlan:
        self.sweep()
        if plan_id is None:
            plan_id = uuid.uuid4().hex
        key = plan_id if key is None else key
        old = self._plans.pop(key, None)
        if old is not None:
            self._bytes -= old.nbytes
        while len(self._plans) >= self.max_plans:
            self._drop_oldest()
        stored = StoredPlan(plan_id, table, plan, page_size, self.clock() + self.ttl_s, {0}, key)
        if stored.pages == 1:
            stored.expires_at = min(stored.expires_at, self.clock() + self.FETCHED_GRACE_S)
        self._plans[key] = stored
        self._bytes += stored.nbytes
        if self.max_bytes is not None:
            while self._bytes > self.max_bytes and len(self._plans) > 1:
                self._drop_oldest()
        return stored

    def _drop_oldest(self) -> None:
        _, dropped = self._plans.popitem(last=False)
        self._bytes -= dropped.nbytes

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
        stored = self._plans.get(key)
        if stored is None or stored.table != table:
            return False
        del self._plans[key]
        self._bytes -= stored.nbytes
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
        for key in [k for k, s in self._plans.items() if s.expires_at <= now]:
            self._bytes -= self._plans.pop(key).nbytes
        for key in [k for k, until in self._cancelled.items() if until <= now]:
            del self._cancelled[key]
