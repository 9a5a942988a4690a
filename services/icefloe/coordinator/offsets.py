"""What the coordinator keeps of each assigned partition, and the Kafka offset it may commit.

Why a module: step 5 of the exactly-once argument (:mod:`icefloe.coordinator.service`), *Kafka
offsets last*, rests on one computation: a partition's low watermark, the smallest offset any
of its tables still tracks (received, pending, ready or being committed), or any record no
table owns still tracks until its dead letter is acknowledged, else the position. It reads here
on its own, apart from the consume loop that commits it
(:mod:`icefloe.coordinator.consumer_group`) and the table workers whose batchers track the
offsets (:mod:`icefloe.coordinator.table_worker`). The state is generic in its workers so that
this module needs only what the watermark reads of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from aiokafka import TopicPartition

from icefloe.coordinator.batcher import OffsetSet, SourceEvent, TableBatcher
from icefloe.coordinator.history import source_key


class TracksOffsets(Protocol):
    """What the low watermark reads of a partition's table worker."""

    @property
    def batcher(self) -> TableBatcher: ...


WorkerT = TypeVar("WorkerT", bound=TracksOffsets)


@dataclass(frozen=True, slots=True)
class ConsumedRecord:
    """What the coordinator keeps of a consumer record."""

    offset: int
    key: bytes | None
    value: bytes

    @property
    def source(self) -> SourceEvent:
        return SourceEvent(self.value, self.key, self.offset)


class PartitionState(Generic[WorkerT]):
    """One assigned source partition: its position, its tables and its loose offsets."""

    def __init__(self, tp: TopicPartition) -> None:
        self.tp = tp
        self.source = source_key(tp.topic, tp.partition)
        self.position: int | None = None
        self.committed: int | None = None
        self.tables: dict[str, WorkerT] = {}
        self.loose = OffsetSet()  # records no table owns (unparseable), until dead-lettered
        self.revoked = False

    def low_watermark(self) -> int | None:
        """The Kafka offset it is safe to commit: nothing below it is still to be done."""
        if self.position is None:
            return None
        candidates = [self.position]
        loose = self.loose.min()
        if loose is not None:
            candidates.append(loose)
        for worker in self.tables.values():
            smallest = worker.batcher.min_tracked
            if smallest is not None:
                candidates.append(smallest)
        return min(candidates)
