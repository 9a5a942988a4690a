"""Settings of icefloe's Spark writer and reader, shared with the coordinator's environment.

A Spark job needs three addresses: the catalog (to read the table's schema and spec and to
evolve it), the Kafka brokers and topics the coordinator listens on (to ask for commits),
and the scan planner (to read). The names are the coordinator's (``ICEFLOE_CATALOG``,
``ICEFLOE_BROKERS``, ``ICEFLOE_EVENTS_TOPIC``, ...), so one environment configures the
coordinator and every job that writes through it.

Precedence, highest first: keyword arguments in code, the Spark session's configuration
(``spark.icefloe.<name>`` with dashes, e.g. ``spark.icefloe.events-topic``, which is how a
cluster sets them for every job), ``ICEFLOE_<NAME>`` environment variables, defaults.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import pydantic
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from icefloe.errors import ValidationError
from icefloe.runtime import kafka as kafka_settings
from icefloe.runtime import settings as settings_flags
from icefloe.runtime.kafka import KafkaSettings

SPARK_CONF_PREFIX = "spark.icefloe."


class SparkConfig(BaseSettings, KafkaSettings):
    """Where a Spark job finds the catalog, the coordinator's topics and the planner."""

    model_config = SettingsConfigDict(
        env_prefix="ICEFLOE_", extra="ignore", frozen=True, populate_by_name=True
    )

    catalog: str | None = Field(default=None, description="catalog URI (see icefloe.catalog.uri)")

    # -- the coordinator's Kafka topics (the connection: icefloe.runtime.kafka) --------------
    client_id: str = kafka_settings.client_id_field("icefloe-spark")
    events_topic: str = Field(default="icefloe.events", min_length=1)
    results_topic: str = Field(default="icefloe.results", min_length=1)
    dead_letter_topic: str = Field(default="icefloe.dead-letter", min_length=1)

    # -- committing -------------------------------------------------------------------------
    commit_timeout_s: float = Field(
        default=300.0, gt=0, description="how long a write waits for its table-committed event"
    )
    event_max_files: int = Field(
        default=500, ge=1, description="files per files-written event; large jobs send several"
    )
    event_max_bytes: int = Field(
        default=768 * 1024,
        ge=16 * 1024,
        description="encoded size above which a files-written event is split (brokers refuse "
        "messages over their message.max.bytes, 1 MiB by default)",
    )
    writer_id: str = Field(default="icefloe-spark", min_length=1)

    # -- reading ----------------------------------------------------------------------------
    planner_url: str | None = Field(
        default=None, description="base URL of the scan planner's REST API"
    )
    planner_prefix: str | None = Field(
        default=None, description="the REST catalog {prefix}, if any"
    )
    planner_timeout_s: float = Field(default=120.0, gt=0)

    @classmethod
    def load(
        cls,
        spark_conf: Mapping[str, str] | None = None,
        overrides: Mapping[str, Any] | None = None,
    ) -> SparkConfig:
        """Settings from ``overrides``, then ``spark.icefloe.*`` keys, then the environment
        and ``ICEFLOE_SECRETS_DIR``.

        Secrets (``sasl_password``, ``tls_key_password``) are refused as Spark keys: a
        ``--conf`` is visible to every user of the machine; set them in the environment or
        the secrets directory, as for the coordinator. Raises a ValidationError naming each
        bad setting by its Spark key.
        """
        given: dict[str, Any] = {}
        for key, value in (spark_conf or {}).items():
            if key.startswith(SPARK_CONF_PREFIX):
                name = key[len(SPARK_CONF_PREFIX) :].replace("-", "_")
                if name not in cls.model_fields:
                    continue
                if settings_flags.is_secret(cls.model_fields[name]):
                    raise ValidationError(
                        f"{key} is a secret: set ICEFLOE_{name.upper()} in the environment or a "
                        f"file of that name in ${settings_flags.SECRETS_DIR_ENV}, not a Spark key"
                    )
                given[name] = value
        given.update({k: v for k, v in (overrides or {}).items() if v is not None})
        unknown = sorted(set(overrides or {}) - set(cls.model_fields))
        if unknown:
            raise ValidationError(
                f"unknown icefloe Spark settings {unknown}; known: {sorted(cls.model_fields)}"
            )
        try:
            settings: type[BaseSettings] = cls  # its __init__ takes the secrets directory
            return cast(SparkConfig, settings(_secrets_dir=settings_flags.secrets_dir(), **given))
        except pydantic.ValidationError as e:
            problems = settings_flags.describe_problems(
                e, lambda loc: f"{SPARK_CONF_PREFIX}{loc.replace('_', '-')}"
            )
            raise ValidationError(f"invalid icefloe Spark settings: {problems}") from None

    def require_catalog(self) -> str:
        if not self.catalog:
            raise ValidationError(
                "no catalog configured: set spark.icefloe.catalog (or ICEFLOE_CATALOG) to the "
                "catalog URI the coordinator uses, e.g. redis://host:6379/0?warehouse=s3://b/wh"
            )
        return self.catalog

    def require_brokers(self) -> str:
        if not self.brokers:
            raise ValidationError(
                "no Kafka brokers configured: set spark.icefloe.brokers (or ICEFLOE_BROKERS) to "
                "the bootstrap servers of the coordinator's events topic"
            )
        return self.brokers

    def cache_key(self) -> tuple[Any, ...]:
        """What identifies one Kafka connection: jobs with equal keys share a channel."""
        return (
            *self.connection_key(),
            self.events_topic,
            self.results_topic,
            self.dead_letter_topic,
        )


__all__ = ["SPARK_CONF_PREFIX", "SparkConfig"]
