"""Settings of the REST catalog's write side, from ``ICEFLOE_REST_*`` environment variables.

Deliberately not flags: tokens on a command line end up in ``ps`` output and shell history,
so they come from the environment or, better, from files a secret store mounts
(``ICEFLOE_REST_WRITE_TOKENS_FILE=/run/secrets/icefloe-writers``).

A token list is ``name=token`` entries separated by commas (environment) or lines (files;
``#`` starts a comment). The name is who the audit log says made a change; a bare token is
named ``reader`` or ``writer``. Holders of a write token may also read; holders of a read
token may only read. The planner's own ``ICEFLOE_PLANNER_TOKEN`` is one more read token (a
write token with ``ICEFLOE_PLANNER_TOKEN_SCOPE=write``). With no token configured at all,
tokens are not checked (a warning at startup says so).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pydantic
from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from icefloe.errors import ValidationError
from icefloe.runtime import settings as settings_flags

ENV_PREFIX = "ICEFLOE_REST_"


@dataclass(frozen=True, slots=True)
class Principal:
    """Who sent a request, and whether they may change the catalog."""

    name: str
    can_write: bool


ANONYMOUS = Principal("anonymous", True)


def parse_tokens(text: str, default_name: str, where: str) -> dict[str, str]:
    """``name=token`` entries (commas or lines) as token → name; ValidationError names the bad one."""
    out: dict[str, str] = {}
    for number, raw in enumerate(text.replace(",", "\n").splitlines(), start=1):
        entry = raw.strip()
        if not entry or entry.startswith("#"):
            continue
        name, sep, token = entry.partition("=")
        if not sep:
            name, token = default_name, entry
        name, token = name.strip(), token.strip()
        if not name or not token:
            raise ValidationError(f"{where}: entry {number} must be 'name=token' or a token")
        if len(token) < 8:
            raise ValidationError(
                f"{where}: the token of {name!r} is shorter than 8 characters; use a random one"
            )
        out[token] = name
    return out


class RestCatalogSettings(BaseSettings):
    """See the module docstring; every field is read from ``ICEFLOE_REST_<NAME>``."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, extra="ignore", frozen=True, populate_by_name=True
    )

    writes: bool = Field(True, description="serve the write routes (namespaces, tables, commits)")
    read_tokens: SecretStr | None = Field(None, description="name=token entries that may read")
    read_tokens_file: Path | None = Field(None, description="file of read tokens, one a line")
    write_tokens: SecretStr | None = Field(None, description="name=token entries that may write")
    write_tokens_file: Path | None = Field(None, description="file of write tokens, one a line")
    allowed_locations: str | None = Field(
        None,
        description="comma-separated prefixes that table locations, registered metadata files "
        "and purges must stay under (default: the catalog's warehouse)",
    )
    commit_retries: int = Field(
        8, ge=0, le=100, description="lost swaps re-checked and retried before answering 409"
    )
    oauth_token_ttl_s: int = Field(
        3600, ge=60, description="lifetime of tokens issued by /v1/oauth/tokens"
    )

    # -- access delegation (icefloe.planner.credentials, icefloe.planner.signer) ------------
    vended_credentials: Literal["off", "static", "sts"] = Field(
        "off",
        description="storage credentials for clients that ask for vended-credentials: 'static' "
        "hands out the configured read or write keys (vend_read_access_key_id and the like) "
        "by token scope, 'sts' mints temporary keys with AssumeRole (vend_sts_role_arn) and a "
        "session policy scoped to the table's location and the token's scope; 'off' vends none",
    )
    vend_read_access_key_id: str | None = Field(
        None, description="static vending: the access key id read tokens receive"
    )
    vend_read_secret_access_key: SecretStr | None = Field(
        None, description="static vending: its secret (an identity that may only read)"
    )
    vend_write_access_key_id: str | None = Field(
        None, description="static vending: the access key id write tokens receive"
    )
    vend_write_secret_access_key: SecretStr | None = Field(
        None, description="static vending: its secret (an identity that may read and write)"
    )
    vend_sts_role_arn: str | None = Field(
        None, description="sts vending: the role assumed for each table and scope"
    )
    vend_sts_endpoint: str | None = Field(
        None, description="sts vending: the STS endpoint (unset: AWS's regional endpoint)"
    )
    vend_sts_duration_s: int = Field(
        3600, ge=900, le=43200, description="sts vending: lifetime of the minted credentials"
    )
    remote_signing: bool = Field(
        False,
        description="sign clients' S3 requests under their table's location with the planner's "
        "own keys (/v1/aws/s3/sign and the per-table sign route), advertised in loadTable",
    )
    storage_access_key_id: str | None = Field(
        None,
        description="the planner's own S3 key id, for remote signing and STS calls (unset: the "
        "catalog's s3.access-key-id)",
    )
    storage_secret_access_key: SecretStr | None = Field(
        None, description="its secret (unset: the catalog's s3.secret-access-key)"
    )
    client_s3_endpoint: str | None = Field(
        None,
        description="the S3 endpoint advertised to clients with vended credentials or signing "
        "(unset: the catalog's s3.endpoint)",
    )
    public_url: str | None = Field(
        None,
        description="the planner's base URL as clients reach it, for s3.signer.uri (unset: "
        "the scheme and host of each request)",
    )
    idempotency_key_lifetime_s: int = Field(
        1800,
        ge=0,
        description="how long the first answer to a request with an Idempotency-Key is kept "
        "for its retries (advertised as idempotency-key-lifetime; 0: keys are not honoured)",
    )
    idempotency_lease_s: float = Field(
        60.0,
        gt=0,
        description="how long a key stays claimed by a request whose replica stopped "
        "answering (renewed while the request runs)",
    )

    def allowed_location_list(self) -> list[str]:
        """The configured allowed prefixes (none: the catalog's warehouse applies)."""
        text = self.allowed_locations or ""
        return [p.strip() for p in text.split(",") if p.strip()]

    @classmethod
    def load(cls, overrides: dict[str, Any] | None = None) -> RestCatalogSettings:
        try:
            return cls(**(overrides or {}))
        except pydantic.ValidationError as e:
            problems = settings_flags.describe_problems(e, lambda loc: f"{ENV_PREFIX}{loc.upper()}")
            raise ValidationError(f"invalid REST catalog settings: {problems}") from None

    def principals(self) -> dict[str, Principal]:
        """Token → principal. A token listed as both read and write may write."""
        out: dict[str, Principal] = {}
        for can_write, inline, file, default in (
            (False, self.read_tokens, self.read_tokens_file, "reader"),
            (True, self.write_tokens, self.write_tokens_file, "writer"),
        ):
            kind = "WRITE" if can_write else "READ"
            sources: list[tuple[str, str]] = []
            if inline is not None:
                sources.append((inline.get_secret_value(), f"{ENV_PREFIX}{kind}_TOKENS"))
            if file is not None:
                try:
                    text = file.read_text(encoding="utf-8")
                except OSError as e:
                    raise ValidationError(
                        f"{ENV_PREFIX}{kind}_TOKENS_FILE: cannot read {file}: {e.strerror}"
                    ) from None
                sources.append((text, f"{ENV_PREFIX}{kind}_TOKENS_FILE ({file})"))
            for text, where in sources:
                for token, name in parse_tokens(text, default, where).items():
                    out[token] = Principal(name, can_write)
        return out
