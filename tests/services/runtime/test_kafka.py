"""The one place aiokafka clients are built (icefloe.runtime.kafka), and the one settings
model they are built from."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from icefloe.coordinator.config import CoordinatorConfig
from icefloe.errors import ValidationError
from icefloe.events import TableCommitted, encode_event
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


def test_spark_takes_secrets_from_the_environment_or_files_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ValidationError, match="is a secret: set ICEFLOE_SASL_PASSWORD"):
        SparkConfig.load({"spark.icefloe.sasl-password": "on the command line"})
    (tmp_path / "ICEFLOE_SASL_PASSWORD").write_text("from a file")
    monkeypatch.setenv("ICEFLOE_SECRETS_DIR", str(tmp_path))
    config = SparkConfig.load(
        {"spark.icefloe.sasl-mechanism": "PLAIN", "spark.icefloe.sasl-username": "u"}
    )
    assert config.sasl_password is not None
    assert config.sasl_password.get_secret_value() == "from a file"


def test_decoded_yields_events_and_the_errors_of_unreadable_values() -> None:
    event = TableCommitted(
        table="db.t",
        snapshot_id=1,
        sequence_number=1,
        metadata_location="file:///w/db/t/metadata/v1.metadata.json",
        commit_ids=("c",),
        latency_ms=0,
    )

    class Record:
        def __init__(self, value: bytes | None) -> None:
            self.value = value

    batches = {"tp": [Record(b"not json"), Record(None), Record(encode_event(event))]}
    decoded = list(kafka.decoded(batches))
    assert isinstance(decoded[0], ValidationError)
    assert decoded[1:] == [event]
