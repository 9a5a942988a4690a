"""Kafka topic ids: which incarnation of a topic a consumer reads.

Offsets only mean something within one incarnation of a topic: deleted and re-created under
the same name, its offsets restart at 0. Kafka gives every topic a UUID when it is created
(KIP-516) and the Metadata response carries it from version 10 on. aiokafka (0.14) sends
Metadata only up to version 5 and has no public way to read topic ids, so this module
defines the version 10 request and response with aiokafka's own protocol types (it supports
flexible versions) and sends it over the consumer's connection.

The answer is None for a topic whose id cannot be known — a broker older than Kafka 2.8
(Metadata below version 10), the all-zero id such a broker reports, an error — so callers
fall back to what offsets alone can tell.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from io import BytesIO
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import (
    AbstractType,
    Boolean,
    CompactArray,
    CompactString,
    Int16,
    Int32,
    Schema,
    TaggedFields,
)

log = logging.getLogger(__name__)

_ZERO = uuid.UUID(int=0)


class _Uuid(AbstractType[uuid.UUID]):
    """Kafka's UUID: 16 bytes, big-endian."""

    @classmethod
    def encode(cls, value: uuid.UUID | None) -> bytes:
        return (value or _ZERO).bytes

    @classmethod
    def decode(cls, data: BytesIO) -> uuid.UUID:
        return uuid.UUID(bytes=data.read(16))


class _MetadataResponseV10(Response):
    API_KEY = 3
    API_VERSION = 10
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "brokers",
            CompactArray(
                ("node_id", Int32),
                ("host", CompactString("utf-8")),
                ("port", Int32),
                ("rack", CompactString("utf-8")),
                ("tags", TaggedFields),
            ),
        ),
        ("cluster_id", CompactString("utf-8")),
        ("controller_id", Int32),
        (
            "topics",
            CompactArray(
                ("error_code", Int16),
                ("name", CompactString("utf-8")),
                ("topic_id", _Uuid),
                ("is_internal", Boolean),
                (
                    "partitions",
                    CompactArray(
                        ("error_code", Int16),
                        ("partition_index", Int32),
                        ("leader_id", Int32),
                        ("leader_epoch", Int32),
                        ("replica_nodes", CompactArray(Int32)),
                        ("isr_nodes", CompactArray(Int32)),
                        ("offline_replicas", CompactArray(Int32)),
                        ("tags", TaggedFields),
                    ),
                ),
                ("topic_authorized_operations", Int32),
                ("tags", TaggedFields),
            ),
        ),
        ("cluster_authorized_operations", Int32),
        ("tags", TaggedFields),
    )


class _MetadataRequestV10(RequestStruct):
    FLEXIBLE_VERSION = True
    API_KEY = 3
    API_VERSION = 10
    RESPONSE_TYPE = _MetadataResponseV10
    SCHEMA = Schema(
        (
            "topics",
            CompactArray(
                ("topic_id", _Uuid), ("name", CompactString("utf-8")), ("tags", TaggedFields)
            ),
        ),
        ("allow_auto_topic_creation", Boolean),
        ("include_cluster_authorized_operations", Boolean),
        ("include_topic_authorized_operations", Boolean),
        ("tags", TaggedFields),
    )


class _TopicIdsRequest(Request[_MetadataRequestV10]):
    API_KEY = 3

    def __init__(self, topics: Sequence[str]) -> None:
        self.topics = list(topics)

    def build(self, request_struct_class: type[_MetadataRequestV10]) -> _MetadataRequestV10:
        return request_struct_class([(None, t, {}) for t in self.topics], False, False, False, {})


async def topic_ids(consumer: AIOKafkaConsumer, topics: Sequence[str]) -> dict[str, str | None]:
    """Each topic's id (a UUID string), or None where it cannot be known (see the module
    docstring). Never raises for a broker's sake: an unknown id only means less checking."""
    out: dict[str, str | None] = dict.fromkeys(topics)
    # aiokafka has no public way to send a request of its own: use the consumer's client.
    client: Any = consumer._client
    try:
        node = client.get_random_node()
        if node is None:
            return out
        response = await client.send(node, _TopicIdsRequest(topics))
    except Exception as e:  # an old broker (no Metadata v10), a lost connection, ...
        log.warning("could not read Kafka topic ids of %s (%s: %s)", topics, type(e).__name__, e)
        return out
    for topic in response.topics:
        error_code, name, topic_id = topic[0], topic[1], topic[2]
        if name in out and error_code == 0 and topic_id != _ZERO:
            out[name] = str(topic_id)
    return out
