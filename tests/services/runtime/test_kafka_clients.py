"""The one place aiokafka clients are built (icefloe.runtime.kafka), and the one settings
model they are built from."""

from __future__ import annotations

from typing import Any

import pytest

from icefloe.coordinator.config import CoordinatorConfig
from icefloe.errors import ValidationError
from icefloe.planner.config import PlannerConfig
from icefloe.runtime import kafka
from icefloe.runtime.kafka import KafkaSettings
from icefloe.spark.config import SparkConfig

OPTIONS = {"bootstrap_servers": ["localhost:1"], "client_id": "t"}


async def test_tail_consumers_read_from_the_end_without_a_group() -> None:
    consumer = kafka.tail_consumer(OPTIONS, "results")
    assert consumer._group_id is None
    assert consumer._enable_auto_commit is False
    assert consumer._subscription.subscription.topics == {"results"}
    await kafka.stop_quietly(consumer, None)


async def test_group_consumers_commit_by_hand_from_the_earliest_offset() -> None:
    consumer = kafka.group_consumer(OPTIONS, "g", session_timeout_ms=10_000)
    assert consumer._group_id == "g"
    assert consumer._enable_auto_commit is False
    assert consumer._session_timeout_ms == 10_000
    await kafka.stop_quietly(consumer)


async def test_producers_wait_for_all_replicas() -> None:
    producer = kafka.producer(OPTIONS, max_request_size=1 << 21)
    assert producer.client._client_id == "t"
    assert producer._max_request_size == 1 << 21
    await kafka.stop_quietly(producer)


@pytest.mark.parametrize("settings", [CoordinatorConfig, PlannerConfig, SparkConfig])
def test_every_service_accepts_the_same_connection_settings(settings: type[Any]) -> None:
    for name in KafkaSettings.model_fields:
        assert name in settings.model_fields, f"{settings.__name__} lacks {name}"
        assert settings.model_fields[name].description, f"{name} has no help text"


def test_the_connection_rules_are_the_same_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    given = {
        "brokers": "a:1",
        "tls_certfile": "/c.pem",
        "tls_keyfile": "/k.pem",
        "tls_key_password": "pw",
    }
    monkeypatch.setenv("ICEFLOE_CATALOG", "file:///w")
    monkeypatch.setenv("ICEFLOE_PLANNER_CATALOG", "file:///w")
    for config in (
        CoordinatorConfig.load(given),
        PlannerConfig.load(given),
        SparkConfig.load({}, given),
    ):
        assert config.effective_security_protocol == "SSL"
        assert config.tls_key_password is not None
    for load in (
        lambda: CoordinatorConfig.load({"tls_certfile": "/c.pem"}),
        lambda: PlannerConfig.load({"tls_certfile": "/c.pem"}),
        lambda: SparkConfig.load({}, {"tls_certfile": "/c.pem"}),
    ):
        with pytest.raises(ValidationError, match="tls_keyfile"):
            load()
