"""What the coordinator produces: table-committed announcements and dead letters, each sent
until the broker acknowledges it.

Why a module: a rejected event is done only once its dead letter is acknowledged (until then
it holds its partition's offset back), and every commit is announced on the results topic; so
sending is part of the exactly-once argument. It is retried without end on transient errors,
and a dead letter the topic refuses as too large is never cut or dropped but retried, loudly.
The consume side (:mod:`icefloe.coordinator.consumer_group`) and the table workers
(:mod:`icefloe.coordinator.table_worker`) only hand messages over.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError, MessageSizeTooLargeError

from icefloe.coordinator.batcher import SourceEvent
from icefloe.coordinator.config import BACKOFF, CoordinatorConfig
from icefloe.coordinator.metrics import CoordinatorMetrics
from icefloe.coordinator.offsets import PartitionState
from icefloe.errors import EventRejectedError
from icefloe.events import DeadLetter, TableCommitted, encode_event, event_key
from icefloe.retry import Retry, RetryEvent

log = logging.getLogger("icefloe.coordinator")


class Outbox:
    """The producer side of the service: results and dead letters, each sent until acked."""

    def __init__(self, config: CoordinatorConfig, metrics: CoordinatorMetrics) -> None:
        self.config = config
        self.metrics = metrics
        self.producer: AIOKafkaProducer | None = None  # set (and started) by the service

    async def _send_until_acked(self, topic: str, value: bytes, key: bytes | None) -> None:
        assert self.producer is not None
        producer = self.producer

        def on_retry(event: RetryEvent) -> None:
            log.warning(
                "producing to %s failed (%s); retrying in %.1fs", topic, event.error, event.delay_s
            )

        policy = Retry(
            BACKOFF,
            transient=(KafkaError,),
            permanent=(MessageSizeTooLargeError,),
            on_retry=on_retry,
        )
        await policy.call(lambda: producer.send_and_wait(topic, value=value, key=key))

    async def publish_results(self, messages: Sequence[TableCommitted]) -> None:
        await asyncio.gather(
            *(
                self._send_until_acked(
                    self.config.results_topic, encode_event(m), event_key(m.table)
                )
                for m in messages
            )
        )

    def _dead_letter_value(
        self, ps: PartitionState, event: SourceEvent, error: EventRejectedError, table: str | None
    ) -> DeadLetter:
        return DeadLetter.for_bytes(
            event.raw,
            f"{error.kind}: {error}",
            ps.tp.topic,
            ps.tp.partition,
            event.offset,
            key=event.key,
            table=table,
        )

    async def dead_letter(
        self,
        ps: PartitionState,
        events: Sequence[SourceEvent],
        error: EventRejectedError,
        *,
        table: str | None = None,
    ) -> None:
        """Publish dead letters and wait for the acknowledgement (then they are done)."""
        await asyncio.gather(*(self.send_dead_letter(ps, e, error, table) for e in events))

    async def send_dead_letter(
        self, ps: PartitionState, event: SourceEvent, error: EventRejectedError, table: str | None
    ) -> None:
        self.metrics.dead_lettered.labels(error.kind).inc()
        log.info(
            "dead-lettered offset %d: %s: %s",
            event.offset,
            error.kind,
            error,
            extra={
                "partition": ps.source,
                "offset": event.offset,
                "kind": error.kind,
                "table": table,
            },
        )
        letter = self._dead_letter_value(ps, event, error, table)
        value = encode_event(letter)

        def on_too_large(retry: RetryEvent) -> None:
            # Never cut the original and never drop it: the event stays not done (its
            # offset is held) until the dead-letter topic accepts it, loudly.
            self.metrics.dead_letters_too_large.inc()
            log.error(
                "dead letter for offset %d of %s (%d bytes) is larger than the "
                "dead-letter topic %r accepts (%s): raise that topic's max.message.bytes "
                "(and the brokers' message.max.bytes); retrying in %.0fs, the partition's "
                "offset is held until then",
                event.offset,
                ps.source,
                len(value),
                self.config.dead_letter_topic,
                retry.error,
                retry.delay_s,
                extra={"partition": ps.source, "offset": event.offset, "bytes": len(value)},
            )

        policy = Retry(BACKOFF, transient=(MessageSizeTooLargeError,), on_retry=on_too_large)
        await policy.call(
            lambda: self._send_until_acked(self.config.dead_letter_topic, value, event.key)
        )
