"""OAuth2 access tokens that every planner replica accepts, with no shared store.

``POST /v1/oauth/tokens`` exchanges a principal's name and configured token for an access
token. A random token kept in one process's memory is refused by every other replica behind
the load balancer; these tokens carry their own proof instead:

    ift1.<base64url payload>.<base64url HMAC-SHA256(configured token, "ift1." + payload)>

The payload names the principal, whether it may write, and when the token expires (Unix
seconds: wall time, which replicas share, not one process's monotonic clock). The key is
the principal's configured token, which every replica has: a token is valid on every
replica configured with that principal, and rotating a principal's configured token
revokes the access tokens issued for it, and only those.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
from collections.abc import Mapping

from icefloe.planner.write_config import Principal

PREFIX = "ift1."


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(key: str, signed: str) -> bytes:
    return hmac.new(key.encode(), signed.encode(), hashlib.sha256).digest()


def issue(key: str, principal: Principal, expires_at: float) -> str:
    """An access token for ``principal`` (whose configured token is ``key``)."""
    payload = _b64(
        json.dumps(
            {
                "sub": principal.name,
                "write": principal.can_write,
                "exp": int(expires_at),
                "nonce": secrets.token_urlsafe(9),
            },
            separators=(",", ":"),
        ).encode()
    )
    signed = PREFIX + payload
    return f"{signed}.{_b64(_mac(key, signed))}"


def verify(token: str, principals: Mapping[str, Principal], now: float) -> Principal | None:
    """The principal a signed token names, if one of its configured tokens signed it and it
    has not expired; None otherwise (forged, expired, malformed or its principal gone)."""
    if not token.startswith(PREFIX):
        return None
    signed, _, signature = token.rpartition(".")
    try:
        claims = json.loads(_unb64(signed[len(PREFIX) :]))
        mac = _unb64(signature)
    except (ValueError, binascii.Error):
        return None
    if not isinstance(claims, dict) or not isinstance(claims.get("exp"), int):
        return None
    if claims["exp"] <= now:
        return None
    found = None
    for key, principal in principals.items():
        matches_principal = (principal.name, principal.can_write) == (
            claims.get("sub"),
            claims.get("write"),
        )
        # Every configured token is tried, so timing tells nothing about which matched.
        if hmac.compare_digest(_mac(key, signed), mac) and matches_principal:
            found = principal
    return found
