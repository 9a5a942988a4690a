"""A plan cancelled on one planner replica is cancelled on all of them.

Plan ids and plan-task tokens are signed descriptions of the plan, so any replica sharing
the plan secret serves them, planning again from the token when it has not held the plan.
Remembering a cancellation in one process (:meth:`icefloe.planner.plans.PlanStore.cancel`)
therefore cancels it on that replica only. The cancellation is also written with the
catalog (:mod:`icefloe.catalog.records`: Redis, DynamoDB, or a file beside the warehouse)
for as long as the plan could live, and every replica asks for it before it serves the
plan: one small read per plan fetch or page of tasks.

Storage trouble never fails a request here: a cancellation that cannot be stored is
logged (the replica that took it still refuses the plan), and one that cannot be read
counts as not cancelled, as it would without sharing.
"""

from __future__ import annotations

import hashlib
import logging

from icefloe.catalog.records import Records

log = logging.getLogger(__name__)


def _name(key: str) -> str:
    return "plan-cancelled:" + hashlib.sha256(key.encode()).hexdigest()[:40]


class SharedCancellations:
    def __init__(self, records: Records | None, ttl_s: float) -> None:
        self.records = records
        self.ttl_s = ttl_s

    async def cancel(self, key: str) -> None:
        if self.records is None:
            return
        try:
            await self.records.put(_name(key), b"1", self.ttl_s)
        except Exception as e:
            log.warning("plan cancellation not shared with other replicas: %s", e)

    async def cancelled(self, key: str) -> bool:
        if self.records is None:
            return False
        try:
            return await self.records.get(_name(key)) is not None
        except Exception as e:
            log.warning("cannot read shared plan cancellations: %s", e)
            return False
