"""Settings of the planner service, from ``ICEFLOE_PLANNER_*`` environment variables and flags.

Flags of ``icefloe planner`` override the environment (they are passed as init values, which
pydantic-settings ranks above the environment), as for the coordinator. Kafka settings are
optional: without ``brokers`` the planner refreshes tables by polling alone.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from icefloe.errors import ValidationError
from icefloe.runtime import kafka as kafka_settings
from icefloe.runtime import logs
from icefloe.runtime import settings as settings_flags
from icefloe.runtime.kafka import KafkaSettings

ENV_PREFIX = "ICEFLOE_PLANNER_"


class PlannerConfig(BaseSettings, KafkaSettings):
    """Everything the planner needs to run; see the module docstring for precedence."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, extra="ignore", frozen=True, populate_by_name=True
    )

    # -- tables -----------------------------------------------------------------------------
    catalog: str = Field(..., min_length=1, description="catalog URI, see icefloe.catalog.uri")
    refresh_interval_ms: int = Field(
        30_000, ge=100, description="no answer reflects a table state older than this"
    )
    table_idle_ms: int = Field(
        3_600_000, ge=1000, description="forget tables nobody asked about for this long"
    )
    trusted_refresh_interval_ms: int = Field(
        300_000,
        ge=100,
        description="with trusted events, tables are still read from the catalog this often, "
        "so commits by other writers become visible",
    )
    trust_events: bool = Field(
        True,
        description="a caught-up results topic vouches for tables without events (set false "
        "when tables are also committed outside the coordinator)",
    )

    # -- cache and plans ----------------------------------------------------------------------
    cache_max_bytes: int = Field(
        512 << 20,
        ge=0,
        description="memory for decoded manifests, cached or held by plans (one budget: "
        "RSS stays within it plus a fixed overhead, see the README's planner sizing)",
    )
    cache_dir: str | None = Field(
        None,
        description="directory for decoded manifests as Arrow IPC files (memory-mapped, "
        "shared by processes, kept across restarts); unset: memory only",
    )
    cache_disk_max_bytes: int = Field(8 << 30, ge=0, description="budget of cache_dir")
    manifest_load_concurrency: int = Field(16, ge=1)
    planning_concurrency: int = Field(
        2, ge=1, le=256, description="plans pruned or pages serialized at once (threads)"
    )
    planning_thread_nice: int = Field(
        0,
        ge=0,
        le=19,
        description="nice increment of the threads that plan, decode manifests and write "
        "pages (Linux; 0: as the process), so a busy machine runs the event loop that "
        "answers /healthz before them",
    )
    tasks_per_page: int = Field(
        5000,
        ge=1,
        description="file scan tasks per response page (about 1.3 MB of JSON at 5000: a "
        "million-file plan is 200 round trips, not 1000)",
    )
    plan_ttl_ms: int = Field(600_000, ge=1000, description="how long a plan id stays valid")
    max_plans: int = Field(10_000, ge=1, description="plans kept at once (oldest dropped)")
    plan_max_bytes: int = Field(
        256 << 20,
        ge=0,
        description="share of cache_max_bytes held plans may keep outside the cache "
        "(selected rows, manifests the cache evicted); past it, or when pinned manifests "
        "leave the cache no room, the oldest plans are dropped and planned again from their "
        "signed plan-task tokens when fetched",
    )
    arrow_allocator: Literal["jemalloc", "mimalloc", "system"] = Field(
        "jemalloc",
        description="allocator of Arrow buffers; jemalloc returns freed pages at once "
        "(mimalloc, pyarrow's default, keeps the page writer's buffers: about 60 MiB more)",
    )
    max_request_bytes: int = Field(
        1 << 20, ge=1024, description="largest request body (filters included): 413 above"
    )
    scan_planning_mode: Literal["server", "client", "none"] = Field(
        "server",
        description="advertised in /v1/config defaults and loadTable config ('none': not "
        "advertised); a table property scan-planning-mode overrides it per table",
    )
    scan_planning_mode_forced: bool = Field(
        False, description="advertise the mode as a config override rather than a default"
    )
    access_log: bool = Field(True, description=logs.ACCESS_LOG_HELP)

    # -- HTTP ---------------------------------------------------------------------------------
    workers: int = Field(
        1,
        ge=1,
        le=64,
        description="processes serving the port (SO_REUSEPORT); set cache_dir so they share "
        "decoded manifests",
    )
    host: str = "0.0.0.0"
    port: int = Field(8181, ge=0, le=65535, description="0 picks a free port")
    prefix: str = Field(
        "", pattern=r"^[A-Za-z0-9._~-]*$", description="REST path prefix: /v1/{prefix}/..."
    )
    token: SecretStr | None = Field(None, description="bearer token clients must send")
    token_scope: Literal["read", "write"] | None = Field(
        None,
        description="what the token grants: 'read' (unset: read, with a startup warning "
        "when it was the only way to write) or 'write' (it may also write the catalog); "
        "environment only, like the token (a --token-scope flag would also answer to --token)",
        json_schema_extra={"flag": False},
    )
    plan_secret: SecretStr | None = Field(
        None,
        description="HMAC key signing plan ids and plan-task tokens; the same on every "
        "replica so any replica serves any plan (environment only, no flag)",
        json_schema_extra={"flag": False},
    )
    plan_secret_file: str | None = Field(
        None,
        description="file holding plan_secret (a mounted Secret); environment only",
        json_schema_extra={"flag": False},
    )
    warehouse: str | None = Field(None, description="advertised in the config defaults")

    # -- Kafka (optional; unset brokers: poll only; see icefloe.runtime.kafka) ----------------
    client_id: str = kafka_settings.client_id_field("icefloe-planner")
    results_topic: str = Field("icefloe.results", min_length=1)

    log_level: logs.LogLevel = Field("INFO", description=logs.LOG_LEVEL_HELP)
    log_format: logs.LogFormat = Field("json", description=logs.LOG_FORMAT_HELP)

    @classmethod
    def load(cls, overrides: Mapping[str, Any] | None = None) -> PlannerConfig:
        """Settings from the environment with ``overrides`` (non-None values) on top.

        Raises a ValidationError naming each bad setting by its environment variable.
        """
        return settings_flags.load_settings(cls, overrides, ENV_PREFIX, "planner")

    # -- derived --------------------------------------------------------------------------

    @property
    def refresh_interval_s(self) -> float:
        return self.refresh_interval_ms / 1000.0

    def require_brokers(self) -> str:
        if not self.brokers:
            raise ValidationError(f"{ENV_PREFIX}BROKERS is not set")
        return self.brokers


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per setting; every flag defaults to None so only given flags override."""
    settings_flags.add_arguments(parser, PlannerConfig, ENV_PREFIX)


def overrides_from_args(args: argparse.Namespace) -> dict[str, Any]:
    return settings_flags.overrides_from_args(args, PlannerConfig)
