"""Settings of the coordinator service, from ``ICEFLOE_*`` environment variables and flags.

One settings object serves the process: Kafka connection (brokers, SASL, TLS), topics and
group, the catalog URI, batching defaults, the file checks and the HTTP port. Flags of
``icefloe coordinator`` override the environment (they are passed as init values, which
pydantic-settings ranks above the environment), so a deployment sets the environment once
and an operator can still try a change from the command line.

Batching limits here are defaults: a table overrides them with the table properties
``icefloe.batch.max-files``, ``icefloe.batch.max-bytes`` and ``icefloe.batch.max-wait-ms``
(see :mod:`icefloe.coordinator.batcher`).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from icefloe.retry import Backoff
from icefloe.runtime import kafka as kafka_settings
from icefloe.runtime import logs
from icefloe.runtime import settings as settings_flags
from icefloe.runtime.kafka import KafkaSettings
from icefloe.table.commit_index import DEDUP_WINDOW_MS_DEFAULT

ENV_PREFIX = "ICEFLOE_"

_BACKOFF_MIN_S = 0.1
_BACKOFF_MAX_S = 10.0

# Retries of storage, catalog and Kafka calls: 0.2s, 0.4s, ... up to 10s, until they pass.
# Not a setting: every waiting loop of the service (table workers, the outbox) shares it.
BACKOFF = Backoff(_BACKOFF_MIN_S, _BACKOFF_MAX_S, jitter=False)


class CoordinatorConfig(BaseSettings, KafkaSettings):
    """Everything the coordinator needs to run; see the module docstring for precedence."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, extra="ignore", frozen=True, populate_by_name=True
    )

    # -- Kafka connection (the rest: icefloe.runtime.kafka.KafkaSettings) --------------------
    brokers: str = kafka_settings.brokers_field("localhost:9092")
    client_id: str = kafka_settings.client_id_field("icefloe-coordinator")

    # -- topics and group -------------------------------------------------------------------
    events_topic: str = Field("icefloe.events", min_length=1)
    results_topic: str = Field("icefloe.results", min_length=1)
    dead_letter_topic: str = Field("icefloe.dead-letter", min_length=1)
    group_id: str = Field("icefloe-coordinator", min_length=1)
    create_topics: bool = True
    topic_partitions: int = Field(16, ge=1)
    topic_replication_factor: int = Field(1, ge=1)
    session_timeout_ms: int = Field(10_000, ge=100)
    heartbeat_interval_ms: int | None = Field(
        None, ge=10, description="default: a third of the session timeout"
    )

    # -- tables -----------------------------------------------------------------------------
    catalog: str = Field(..., min_length=1, description="catalog URI, see icefloe.catalog.uri")
    batch_max_files: int = Field(1000, ge=1)
    batch_max_bytes: int = Field(1 << 30, ge=1)
    batch_max_wait_ms: int = Field(10_000, ge=0)
    check_files: bool = Field(True, description="check data files exist with the stated size")
    # The planner's own setting names (ICEFLOE_PLANNER_CACHE_DIR, ..._DISK_MAX_BYTES): one
    # value given to both makes planners on that disk or volume warm for new manifests.
    planner_cache_dir: str | None = Field(
        None,
        description="write the decoded columns of committed manifests to the planner's disk "
        "cache directory (shared volume or host path); unset: do not",
    )
    planner_cache_disk_max_bytes: int = Field(8 << 30, ge=0, description="its budget")
    file_check_concurrency: int = Field(32, ge=1)
    key_index_memory_bytes: int = Field(
        256 << 20,
        ge=1 << 20,
        description=(
            "memory budget of each keyed table's key index, which upserts resolve keys "
            "through; its runs beyond the budget are spilled to ICEFLOE_KEY_INDEX_SPILL_DIR "
            "and memory-mapped"
        ),
    )
    key_index_spill_dir: str | None = Field(
        None,
        description=(
            "local directory for key-index runs beyond the memory budget (a disk, not "
            "tmpfs, or spilling saves no memory); unset: the system's temporary directory"
        ),
    )
    abandon_after_ms: int = Field(
        600_000,
        ge=1,
        description=(
            "files-written events with no commit-requested this long are dead-lettered as "
            "'abandoned' (they hold the partition's committed offset back until then)"
        ),
    )
    dedup_window_ms: int = Field(
        DEDUP_WINDOW_MS_DEFAULT,
        ge=0,
        description=(
            "how far back a retried commit id is recognised, for tables that set none: "
            "written into a table's icefloe.dedup.window-ms by the first commit to it, so that "
            "maintenance, the CLI and the REST catalog keep the same window (the table's own "
            "value wins; change it there)"
        ),
    )

    # -- maintenance (icefloe.coordinator.maintenance; the policy is in table properties) ----------
    maintenance_enabled: bool = Field(True, description="maintain owned tables by their policy")
    maintenance_interval_ms: int = Field(300_000, ge=100, description="per table")
    maintenance_min_retain_ms: int = Field(
        86_400_000,
        ge=0,
        description=(
            "maintenance never expires a snapshot younger than this; snapshots carrying "
            "commit ids are also kept for the table's dedup window (icefloe.dedup.window-ms)"
        ),
    )
    maintenance_topic: str = Field("icefloe.maintenance", min_length=1)

    # -- service ----------------------------------------------------------------------------
    http_host: str = "0.0.0.0"
    http_port: int = Field(9464, ge=0, le=65535, description="0 picks a free port")
    offset_commit_interval_ms: int = Field(1000, ge=10)
    max_inflight_events: int = Field(100_000, ge=1)
    shutdown_timeout_ms: int = Field(60_000, ge=0)
    access_log: bool = Field(True, description=logs.ACCESS_LOG_HELP)
    log_level: logs.LogLevel = Field("INFO", description=logs.LOG_LEVEL_HELP)
    log_format: logs.LogFormat = Field("json", description=logs.LOG_FORMAT_HELP)

    @model_validator(mode="after")
    def _consistent(self) -> CoordinatorConfig:
        topics = [self.events_topic, self.results_topic, self.dead_letter_topic]
        if len(set(topics)) != len(topics):
            raise ValueError(f"events, results and dead-letter topics must differ, got {topics}")
        return self

    @classmethod
    def load(cls, overrides: Mapping[str, Any] | None = None) -> CoordinatorConfig:
        """Settings from the environment, with ``overrides`` (non-None values) on top.

        Raises a ValidationError naming each bad setting by its environment variable.
        """
        return settings_flags.load_settings(cls, overrides, ENV_PREFIX, "coordinator")

    # -- derived ----------------------------------------------------------------------------
    @property
    def effective_heartbeat_interval_ms(self) -> int:
        return self.heartbeat_interval_ms or max(10, self.session_timeout_ms // 3)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per setting (``--batch-max-files``, ``--check-files/--no-check-files``...).

    Every flag defaults to None, so only flags actually given override the environment.
    """
    settings_flags.add_arguments(parser, CoordinatorConfig, ENV_PREFIX)


def overrides_from_args(args: argparse.Namespace) -> dict[str, Any]:
    return settings_flags.overrides_from_args(args, CoordinatorConfig)
