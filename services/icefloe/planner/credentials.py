"""Storage credentials vended to REST clients: scoped to one table's location and to reading
or writing as the caller's token allows.

A client that asks for ``X-Iceberg-Access-Delegation: vended-credentials`` (or calls
``GET …/tables/{t}/credentials``) gets S3 keys in the spec's ``StorageCredential`` form: a
``prefix`` (each directory the table writes to, :func:`icefloe.io.locations.table_locations`)
and a ``config`` with ``s3.access-key-id``, ``s3.secret-access-key`` and, for temporary
keys, ``s3.session-token`` and ``s3.session-token-expires-at-ms``. Read tokens get
read-only keys; plans always get read-only keys (a plan's files are only read).

Two sources (``ICEFLOE_REST_VENDED_CREDENTIALS``):

* ``sts``, what production on AWS should run: ``AssumeRole`` on ``vend_sts_role_arn`` with a
  session policy allowing only ``s3:GetObject`` (and, for write tokens, ``s3:PutObject``,
  ``s3:DeleteObject`` and the multipart actions) on ``arn:aws:s3:::bucket/key/*`` of each
  table directory, and ``s3:ListBucket`` only for those prefixes. The keys are the
  intersection of the role's policy and the session policy, so they reach nothing but the
  table, and expire after ``vend_sts_duration_s``. Minted keys are reused per (table
  directories, scope) until five minutes before they expire.
* ``static``: one read identity and one write identity per warehouse, configured by the
  operator (``vend_read_*``/``vend_write_*``) and restricted in the object store itself
  (SeaweedFS's ``-s3.config``: ``Read:bucket``/``List:bucket`` for the reader, plus
  ``Write:bucket`` for the writer). This is what stores without a session-policy STS can do:
  the keys are scoped to the warehouse and to the scope, **not** to one table (the
  ``prefix`` only tells the client where to use them), and they do not expire.

Tables on a local file system get no credentials (an empty list): there is nothing to vend.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from icefloe.errors import ValidationError
from icefloe.io.fileio import (
    S3_ACCESS_KEY_ID,
    S3_ENDPOINT,
    S3_REGION,
    S3_SECRET_ACCESS_KEY,
    S3_SESSION_TOKEN,
)
from icefloe.io.locations import Location, normal_location, table_locations
from icefloe.planner.errors import ApiError
from icefloe.planner.write_config import RestCatalogSettings

S3_SESSION_TOKEN_EXPIRES_AT_MS: Final = "s3.session-token-expires-at-ms"
# Minted keys are handed out again until this long before they expire.
REUSE_MARGIN_S: Final = 300.0
_READ_ACTIONS: Final = ("s3:GetObject", "s3:GetObjectVersion")
_WRITE_ACTIONS: Final = (
    "s3:PutObject",
    "s3:DeleteObject",
    "s3:AbortMultipartUpload",
    "s3:ListMultipartUploadParts",
)
_SESSION_NAME_CHARS: Final = re.compile(r"[^\w+=,.@-]")


@dataclass(frozen=True, slots=True)
class StorageKeys:
    """One set of S3 keys; ``expires_at`` (epoch seconds) only for temporary keys."""

    access_key_id: str
    secret_access_key: str
    session_token: str | None = None
    expires_at: float | None = None

    def config(self) -> dict[str, str]:
        out = {S3_ACCESS_KEY_ID: self.access_key_id, S3_SECRET_ACCESS_KEY: self.secret_access_key}
        if self.session_token is not None:
            out[S3_SESSION_TOKEN] = self.session_token
        if self.expires_at is not None:
            out[S3_SESSION_TOKEN_EXPIRES_AT_MS] = str(int(self.expires_at * 1000))
        return out


def s3_roots(location: str, properties: Mapping[str, str]) -> list[Location]:
    """The table's directories in normal form, those on S3 only (no duplicates)."""
    out: list[Location] = []
    for root in table_locations(location, properties):
        try:
            normal = normal_location(root)
        except ValidationError:
            continue
        if normal.bucket is not None and normal.scheme == "s3" and normal not in out:
            out.append(normal)
    return out


def session_policy(roots: list[Location], *, write: bool) -> dict[str, Any]:
    """The IAM session policy allowing exactly the table's objects, for reading or writing."""
    objects = [
        f"arn:aws:s3:::{r.bucket}/{r.path}/*" if r.path else f"arn:aws:s3:::{r.bucket}/*"
        for r in roots
    ]
    actions = [*_READ_ACTIONS, *(_WRITE_ACTIONS if write else ())]
    statements: list[dict[str, Any]] = [{"Effect": "Allow", "Action": actions, "Resource": objects}]
    for bucket in sorted({r.bucket for r in roots if r.bucket is not None}):
        prefixes = [p for r in roots if r.bucket == bucket for p in _list_prefixes(r)]
        statements.append(
            {
                "Effect": "Allow",
                "Action": ["s3:ListBucket"],
                "Resource": [f"arn:aws:s3:::{bucket}"],
                "Condition": {"StringLike": {"s3:prefix": prefixes}},
            }
        )
    return {"Version": "2012-10-17", "Statement": statements}


def _list_prefixes(root: Location) -> list[str]:
    return [root.path, f"{root.path}/*"] if root.path else ["*"]


class CredentialVendor:
    """Storage credentials for a table and a scope (see the module docstring)."""

    def __init__(
        self,
        settings: RestCatalogSettings,
        catalog_properties: Mapping[str, str],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.mode = settings.vended_credentials
        self.settings = settings
        self.catalog_properties = catalog_properties
        self.clock = clock
        self._minted: dict[tuple[tuple[Location, ...], bool], StorageKeys] = {}
        if self.mode == "static":
            self._static = {
                False: _static_keys(settings, write=False),
                True: _static_keys(settings, write=True),
            }
        if self.mode == "sts" and not settings.vend_sts_role_arn:
            raise ValidationError(
                "ICEFLOE_REST_VENDED_CREDENTIALS=sts needs ICEFLOE_REST_VEND_STS_ROLE_ARN"
            )

    @property
    def enabled(self) -> bool:
        return self.mode != "off"

    async def storage_credentials(
        self, location: str, properties: Mapping[str, str], *, write: bool
    ) -> list[dict[str, Any]]:
        """The spec's ``storage-credentials`` for the table: one entry per S3 directory."""
        roots = s3_roots(location, properties)
        if not roots or not self.enabled:
            return []
        keys = await self._keys(roots, write=write)
        return [{"prefix": str(root), "config": keys.config()} for root in roots]

    async def _keys(self, roots: list[Location], *, write: bool) -> StorageKeys:
        if self.mode == "static":
            return self._static[write]
        key = (tuple(roots), write)
        cached = self._minted.get(key)
        if cached is not None and (cached.expires_at or 0) - REUSE_MARGIN_S > self.clock():
            return cached
        keys = await self._assume_role(roots, write=write)
        now = self.clock()
        for stale in [k for k, v in self._minted.items() if (v.expires_at or 0) <= now]:
            del self._minted[stale]
        self._minted[key] = keys
        return keys

    async def _assume_role(self, roots: list[Location], *, write: bool) -> StorageKeys:
        """One ``AssumeRole`` call with the table's session policy (aioboto3)."""
        import aioboto3
        from botocore.exceptions import BotoCoreError, ClientError

        settings = self.settings
        key_id, secret = self.planner_keys()
        session = aioboto3.Session(
            aws_access_key_id=key_id,
            aws_secret_access_key=secret,
            region_name=self.catalog_properties.get(S3_REGION) or None,
        )
        name = _SESSION_NAME_CHARS.sub("-", f"icefloe-{'write' if write else 'read'}")[:64]
        try:
            async with session.client("sts", endpoint_url=settings.vend_sts_endpoint) as sts:
                answer = await sts.assume_role(
                    RoleArn=settings.vend_sts_role_arn or "",
                    RoleSessionName=name,
                    Policy=json.dumps(session_policy(roots, write=write)),
                    DurationSeconds=settings.vend_sts_duration_s,
                )
        except (BotoCoreError, ClientError) as e:
            raise ApiError(
                503,
                "ServiceUnavailableException",
                f"could not mint storage credentials (STS AssumeRole failed: {type(e).__name__})",
            ) from None
        creds = answer["Credentials"]
        return StorageKeys(
            creds["AccessKeyId"],
            creds["SecretAccessKey"],
            creds["SessionToken"],
            creds["Expiration"].timestamp(),
        )

    def planner_keys(self) -> tuple[str | None, str | None]:
        """The planner's own S3 keys: the settings', else the catalog's (None: the default
        AWS credential chain, e.g. a pod's role)."""
        settings = self.settings
        key_id = settings.storage_access_key_id or self.catalog_properties.get(S3_ACCESS_KEY_ID)
        secret = (
            settings.storage_secret_access_key.get_secret_value()
            if settings.storage_secret_access_key is not None
            else self.catalog_properties.get(S3_SECRET_ACCESS_KEY)
        )
        return key_id, secret

    def client_endpoint(self) -> str | None:
        """The S3 endpoint clients are told to use (None: AWS's)."""
        return self.settings.client_s3_endpoint or self.catalog_properties.get(S3_ENDPOINT)


def _static_keys(settings: RestCatalogSettings, *, write: bool) -> StorageKeys:
    kind = "write" if write else "read"
    key_id = getattr(settings, f"vend_{kind}_access_key_id")
    secret = getattr(settings, f"vend_{kind}_secret_access_key")
    if not key_id or secret is None:
        raise ValidationError(
            f"ICEFLOE_REST_VENDED_CREDENTIALS=static needs ICEFLOE_REST_VEND_{kind.upper()}"
            f"_ACCESS_KEY_ID and ICEFLOE_REST_VEND_{kind.upper()}_SECRET_ACCESS_KEY"
        )
    return StorageKeys(key_id, secret.get_secret_value())
