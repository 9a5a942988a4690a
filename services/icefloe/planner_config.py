"""Settings of the planner service, from ``ICEFLOE_PLANNER_*`` environment variables and flags.

Flags of ``icefloe planner`` override the environment (they are passed as init values, which
pydantic-settings ranks above the environment), as for the coordinator. Kafka settings are
optional: without ``brokers`` the planner refreshes tables by polling alone.
"""

from __future__ import annotations

import argparse
import ssl
from collections.abc import Mapping
from typing import Any, Literal

import pydantic
from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from icefloe.errors import ValidationError

ENV_PREFIX = "ICEFLOE_PLANNER_"

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]


class PlannerConfig(BaseSettings):
    """Everything the planner needs to run; see the module docstring for precedence."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, extra="ignore", frozen=True, populate_by_name=True
    )

    # -- tables -----------------------------------------------------------------------------
    catalog: str = Field(..., min_length=1, description="catalog URI, see icefloe.catalog_uri")
    refresh_interval_ms: int = Field(
        30_000, ge=100, description="no answer reflects a table state older than this"
    )
    table_idle_ms: int = Field(
        3_600_000, ge=1000, description="forget tables nobody asked about for this long"
    )
    trust_events: bool = Field(
        True,
        description="a caught-up results topic vouches for tables without events (set false "
        "when tables are also committed outside the coordinator)",
    )

    # -- cache and plans ----------------------------------------------------------------------
    cache_max_bytes: int = Field(512 << 20, ge=0, description="manifest cache budget")
    manifest_load_concurrency: int = Field(16, ge=1)
    tasks_per_page: int = Field(1000, ge=1, description="file scan tasks per response page")
    plan_ttl_ms: int = Field(600_000, ge=1000, description="how long a plan id stays valid")
    max_plans: int = Field(10_000, ge=1, description="plans kept at once (oldest dropped)")

    # -- HTTP ---------------------------------------------------------------------------------
    host: str = "0.0.0.0"
    port: int = Field(8181, ge=0, le=65535, description="0 picks a free port")
    prefix: str = Field(
        "", pattern=r"^[A-Za-z0-9._~-]*$", description="REST path prefix: /v1/{prefix}/..."
    )
    token: SecretStr | None = Field(None, description="bearer token clients must send")
    warehouse: str | None = Field(None, description="advertised in the config defaults")

    # -- Kafka (optional) ---------------------------------------------------------------------
    brokers: str | None = Field(None, description="host:port[,host:port]; unset: poll only")
    results_topic: str = Field("icefloe.results", min_length=1)
    client_id: str = "icefloe-planner"
    security_protocol: SecurityProtocol | None = None
    sasl_mechanism: SaslMechanism | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    tls_cafile: str | None = None
    tls_certfile: str | None = None
    tls_keyfile: str | None = None

    log_level: str = "INFO"

    @model_validator(mode="after")
    def _consistent(self) -> PlannerConfig:
        if self.sasl_mechanism is not None and (
            self.sasl_username is None or self.sasl_password is None
        ):
            raise ValueError(
                f"sasl_mechanism {self.sasl_mechanism} needs sasl_username and sasl_password"
            )
        if (self.tls_certfile is None) != (self.tls_keyfile is None):
            raise ValueError("tls_certfile and tls_keyfile must be given together")
        return self

    @classmethod
    def load(cls, overrides: Mapping[str, Any] | None = None) -> PlannerConfig:
        """Settings from the environment with ``overrides`` (non-None values) on top.

        Raises a ValidationError naming each bad setting by its environment variable.
        """
        given = {k: v for k, v in (overrides or {}).items() if v is not None}
        try:
            return cls(**given)
        except pydantic.ValidationError as e:
            problems = []
            for err in e.errors():
                loc = ".".join(str(p) for p in err.get("loc", ()))
                where = f"{ENV_PREFIX}{loc.upper()}" if loc else "settings"
                problems.append(f"{where}: {err.get('msg', 'invalid value')}")
            raise ValidationError("invalid planner settings: " + "; ".join(problems)) from None

    # -- derived --------------------------------------------------------------------------

    @property
    def refresh_interval_s(self) -> float:
        return self.refresh_interval_ms / 1000.0

    @property
    def effective_security_protocol(self) -> SecurityProtocol:
        if self.security_protocol is not None:
            return self.security_protocol
        tls = self.tls_cafile is not None or self.tls_certfile is not None
        if self.sasl_mechanism is not None:
            return "SASL_SSL" if tls else "SASL_PLAINTEXT"
        return "SSL" if tls else "PLAINTEXT"

    def kafka_options(self) -> dict[str, Any]:
        """Connection keyword arguments for aiokafka's consumer."""
        if not self.brokers:
            raise ValidationError(f"{ENV_PREFIX}BROKERS is not set")
        options: dict[str, Any] = {
            "bootstrap_servers": [b.strip() for b in self.brokers.split(",") if b.strip()],
            "client_id": self.client_id,
            "security_protocol": self.effective_security_protocol,
        }
        if self.effective_security_protocol in ("SSL", "SASL_SSL"):
            context = ssl.create_default_context(cafile=self.tls_cafile)
            if self.tls_certfile is not None:
                context.load_cert_chain(self.tls_certfile, self.tls_keyfile)
            options["ssl_context"] = context
        if self.sasl_mechanism is not None:
            assert self.sasl_password is not None  # checked by _consistent
            options["sasl_mechanism"] = self.sasl_mechanism
            options["sasl_plain_username"] = self.sasl_username
            options["sasl_plain_password"] = self.sasl_password.get_secret_value()
        return options


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per setting; every flag defaults to None so only given flags override."""
    for name, info in PlannerConfig.model_fields.items():
        flag = "--" + name.replace("_", "-")
        annotation = info.annotation
        text = info.description or ""
        env = f"{ENV_PREFIX}{name.upper()}"
        help_text = f"{text} (env {env})" if text else f"env {env}"
        if annotation is bool:
            parser.add_argument(
                flag, dest=name, action=argparse.BooleanOptionalAction, default=None, help=help_text
            )
        elif annotation is int or annotation == (int | None):
            parser.add_argument(flag, dest=name, type=int, default=None, help=help_text)
        else:
            parser.add_argument(flag, dest=name, default=None, help=help_text)


def overrides_from_args(args: argparse.Namespace) -> dict[str, Any]:
    return {
        name: getattr(args, name)
        for name in PlannerConfig.model_fields
        if getattr(args, name, None) is not None
    }
