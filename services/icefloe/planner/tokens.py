"""Plan ids and plan-task tokens that any planner replica can serve.

A plan made by one replica used to live only in its memory, so load balancers needed client
affinity and a scale-down turned in-flight plan tasks into 404s. A plan id now *describes*
the plan: the table, the planning request, the snapshot it was planned against (so every
page comes from the same snapshot, whichever replica serves it), the page size and an
expiry, compressed and signed with HMAC-SHA256 under a secret shared by the replicas. A
replica that still holds the plan serves pages from memory; any other replica (or the same
one after the plan was dropped to bound memory) verifies the signature and plans again,
which is cheap with a warm manifest cache. Plan-task tokens are ``<plan-id>:<page>``.

The request is embedded only while it compresses to at most :data:`MAX_EMBEDDED` bytes, so
that tokens (which a response lists once per page) stay small; a plan of a larger request
gets a *local* id that only the replica holding it can serve (another answers 404 with a
message saying to plan again).

The secret comes from the environment (``ICEFLOE_PLANNER_PLAN_SECRET``) or a file named by
``ICEFLOE_PLANNER_PLAN_SECRET_FILE`` (a mounted Kubernetes secret), never a command-line flag,
which other users of the host could read. Without one, a random per-process secret is used
and tokens are valid on this replica only.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SECRET_ENV = "ICEFLOE_PLANNER_PLAN_SECRET"
SECRET_FILE_ENV = "ICEFLOE_PLANNER_PLAN_SECRET_FILE"
MAX_EMBEDDED = 3072
MAX_TOKEN_CHARS = 8192
MAX_PAGE_DIGITS = 9
_SIG_BYTES = 20
_ASCII_DIGITS = frozenset("0123456789")


class TokenError(Exception):
    """A plan id or plan-task token that is malformed, forged or expired (a 404: the
    message is safe to show the client)."""


class SecretError(Exception):
    """The configured plan secret cannot be used."""


def load_secret(value: str | None, path: str | None) -> tuple[bytes, bool]:
    """The plan-token secret (``value``, else the contents of the file ``path``) and whether
    one was configured (False: a random secret, valid in this process only)."""
    if value:
        if len(value.encode("utf-8")) < 16:
            raise SecretError(f"{SECRET_ENV} must be at least 16 bytes")
        return value.encode("utf-8"), True
    if path:
        try:
            data = Path(path).read_bytes().strip()
        except OSError as e:
            raise SecretError(f"{SECRET_FILE_ENV}: cannot read the secret file: {e}") from None
        if len(data) < 16:
            raise SecretError(f"{SECRET_FILE_ENV}: the secret must be at least 16 bytes")
        return data, True
    return secrets.token_bytes(32), False


@dataclass(frozen=True, slots=True)
class PlanIdentity:
    """What a plan id says about its plan."""

    plan_id: str
    key: str  # unique per plan, for the local plan store
    table: str  # namespace levels and name joined by 0x1F
    request: dict[str, Any] | None  # None: a local plan (the request was too large to embed)
    snapshot_id: int | None
    page_size: int
    expires_at: float


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class PlanTokens:
    """Issues and opens signed plan ids (see the module docstring)."""

    def __init__(self, secret: bytes) -> None:
        if not secret:
            raise SecretError("the plan secret is empty")
        self._secret = secret

    def _sign(self, payload: bytes) -> str:
        return _b64(hmac.new(self._secret, payload, hashlib.sha256).digest()[:_SIG_BYTES])

    def issue(
        self,
        *,
        table: str,
        request: dict[str, Any],
        snapshot_id: int | None,
        page_size: int,
        expires_at: float,
    ) -> PlanIdentity:
        key = secrets.token_hex(8)
        body: dict[str, Any] = {
            "v": 1,
            "k": key,
            "t": table,
            "s": snapshot_id,
            "n": page_size,
            "x": int(expires_at),
        }
        canonical = json.dumps(request, separators=(",", ":"), sort_keys=True).encode("utf-8")
        packed = zlib.compress(canonical, 6)
        embedded = len(packed) <= MAX_EMBEDDED
        if embedded:
            body["q"] = _b64(packed)
        payload = zlib.compress(json.dumps(body, separators=(",", ":")).encode("utf-8"), 6)
        plan_id = f"{_b64(payload)}.{self._sign(payload)}"
        return PlanIdentity(
            plan_id,
            key,
            table,
            request if embedded else None,
            snapshot_id,
            page_size,
            float(int(expires_at)),
        )

    def open(self, plan_id: str, now: float) -> PlanIdentity:
        """The plan a plan id describes; :class:`TokenError` if forged, malformed or expired."""
        if len(plan_id) > MAX_TOKEN_CHARS or not plan_id.isascii():
            raise TokenError("not a plan id issued by this planner")
        encoded, dot, signature = plan_id.partition(".")
        if not dot or not encoded or not signature:
            raise TokenError("not a plan id issued by this planner")
        try:
            payload = _unb64(encoded)
        except ValueError:
            raise TokenError("not a plan id issued by this planner") from None
        if not hmac.compare_digest(signature, self._sign(payload)):
            raise TokenError("not a plan id issued by this planner (bad signature)")
        try:
            body = json.loads(zlib.decompress(payload, bufsize=MAX_TOKEN_CHARS))
            request = None
            if "q" in body:
                request = json.loads(zlib.decompress(_unb64(body["q"])))
            identity = PlanIdentity(
                plan_id,
                str(body["k"]),
                str(body["t"]),
                request,
                None if body["s"] is None else int(body["s"]),
                int(body["n"]),
                float(body["x"]),
            )
        except (ValueError, KeyError, TypeError, zlib.error):
            raise TokenError("not a plan id issued by this planner") from None
        if identity.page_size < 1 or (
            identity.request is not None and not isinstance(request, dict)
        ):
            raise TokenError("not a plan id issued by this planner")
        if identity.expires_at <= now:
            raise TokenError("the plan has expired; plan the scan again")
        return identity


def parse_plan_task(token: str) -> tuple[str, int]:
    """``<plan-id>:<page>`` → (plan id, page). Only ASCII digits, at most nine of them, make a
    page (``str.isdigit`` would take ``²`` and ``٣``); anything else is a :class:`TokenError`."""
    plan_id, colon, page_text = token.rpartition(":")
    if (
        not colon
        or not plan_id
        or not page_text
        or len(page_text) > MAX_PAGE_DIGITS
        or not set(page_text) <= _ASCII_DIGITS
    ):
        raise TokenError("not a plan task issued by this planner")
    return plan_id, int(page_text)


__all__ = [
    "MAX_EMBEDDED",
    "SECRET_ENV",
    "SECRET_FILE_ENV",
    "PlanIdentity",
    "PlanTokens",
    "SecretError",
    "TokenError",
    "load_secret",
    "parse_plan_task",
]
