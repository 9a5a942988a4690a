"""Who may read and who may write through the REST catalog, and the audit log of every write.

Bearer tokens come from :class:`~icefloe.planner.write_config.RestCatalogSettings`: a read
token opens every read route, a write token every route. The planner's own
``ICEFLOE_PLANNER_TOKEN`` is one more token, a read token unless the operator grants it
writes with ``ICEFLOE_PLANNER_TOKEN_SCOPE=write`` (see :func:`planner_token_principals`):
reading never implies writing unless the operator says so. Clients that only speak OAuth2
(DuckDB's Iceberg secret, Java's ``credential``) exchange ``client_id``/``client_secret``
for a token at ``POST /v1/oauth/tokens`` (client-credentials grant): the client id is the
principal's name, the secret its configured token, and the access token issued, valid for
``oauth_token_ttl_s``, is signed with that configured token (:mod:`icefloe.planner.signed_tokens`),
so every replica configured with the principal accepts it.

Every write request, whatever its outcome (refused by the token check, too large, invalid,
failed or done), produces one JSON line on the ``icefloe.audit`` logger: who, what operation,
on which namespace or table, the HTTP status, and for commits the snapshot and metadata file
before and after. Write routes are the routes named ``write.<operationId>``
(:func:`write_operation`); the planner's request middleware writes the line of every refused
one, the handlers that of every success.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import logging
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Middleware

from icefloe.planner import signed_tokens
from icefloe.planner.errors import ApiError
from icefloe.planner.write_config import ANONYMOUS, Principal, RestCatalogSettings

log = logging.getLogger(__name__)
audit_log = logging.getLogger("icefloe.audit")

PRINCIPAL_KEY = web.RequestKey("icefloe.principal", Principal)
OAUTH_PATH = "/v1/oauth/tokens"
# Route names of the write routes: ``write.<operationId>``.
WRITE_ROUTE_PREFIX = "write."
# Who the audit log names for a request whose token was missing or not valid.
UNAUTHENTICATED = Principal("unauthenticated", False)
PLANNER_PRINCIPAL = "planner"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class TokenAuthority:
    """Maps bearer tokens to principals; issues short-lived tokens for OAuth2 clients."""

    def __init__(
        self,
        settings: RestCatalogSettings,
        clock: Callable[[], float] = time.time,
        *,
        extra: Mapping[str, Principal] | None = None,
    ) -> None:
        # ``extra``: tokens configured elsewhere (the planner's); the REST lists win.
        self.principals = {**(extra or {}), **settings.principals()}
        self.ttl_s = settings.oauth_token_ttl_s
        self.clock = clock

    @property
    def enabled(self) -> bool:
        return bool(self.principals)

    def _configured(self, token: str) -> Principal | None:
        found = None
        for known, principal in self.principals.items():
            # Compare with every token, so timing does not tell how many were tried.
            if hmac.compare_digest(known.encode(), token.encode()):
                found = principal
        return found

    def principal_for(self, token: str) -> Principal | None:
        if token.startswith(signed_tokens.PREFIX):
            return signed_tokens.verify(token, self.principals, self.clock())
        return self._configured(token)

    def authenticate(self, header: str) -> Principal:
        """The principal a request's ``Authorization`` header names; ApiError 401 if none."""
        if not self.enabled:
            return ANONYMOUS
        scheme, _, given = header.partition(" ")
        if not header:
            raise ApiError(401, "NotAuthorizedException", "missing bearer token")
        if scheme.lower() != "bearer" or not given.strip():
            raise ApiError(
                401, "NotAuthorizedException", "expected 'Authorization: Bearer <token>'"
            )
        principal = self.principal_for(given.strip())
        if principal is None:
            raise ApiError(
                401, "NotAuthorizedException", "the bearer token is not valid (or has expired)"
            )
        return principal

    def issue(self, client_id: str, client_secret: str) -> tuple[str, Principal] | None:
        principal = self._configured(client_secret)
        if principal is None or not hmac.compare_digest(
            principal.name.encode(), client_id.encode()
        ):
            return None
        token = signed_tokens.issue(client_secret, principal, self.clock() + self.ttl_s)
        return token, principal


def write_operation(request: web.Request) -> str | None:
    """The operationId of a write route (named ``write.<operationId>``); None for reads."""
    name = request.match_info.route.name
    if name is not None and name.startswith(WRITE_ROUTE_PREFIX):
        return name[len(WRITE_ROUTE_PREFIX) :]
    return None


def auth_middleware(authority: TokenAuthority) -> Middleware:
    """Authenticate ``/v1/`` requests and refuse writes to read-only principals.

    Refusals are raised as :class:`ApiError` (401, 403), so the planner's request middleware,
    outside this one, answers, access-logs and audits them like every other error."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not request.path.startswith("/v1/") or request.path == OAUTH_PATH:
            return await handler(request)
        request[PRINCIPAL_KEY] = UNAUTHENTICATED  # who the audit names if this refuses
        principal = authority.authenticate(request.headers.get("Authorization", ""))
        request[PRINCIPAL_KEY] = principal
        if write_operation(request) is not None and not principal.can_write:
            raise ApiError(
                403,
                "ForbiddenException",
                f"{principal.name!r} holds a read-only token; writes need a write token",
            )
        return await handler(request)

    return middleware


def planner_token_principals(
    token: str | None, scope: str | None, settings: RestCatalogSettings
) -> dict[str, Principal]:
    """``ICEFLOE_PLANNER_TOKEN`` as a principal: it reads, and writes only with
    ``ICEFLOE_PLANNER_TOKEN_SCOPE=write``. Logs, at startup, what an operator upgrading
    from the time it could write must know."""
    if token is None:
        if settings.writes and not settings.principals():
            log.warning(
                "no token is configured (ICEFLOE_PLANNER_TOKEN, ICEFLOE_REST_READ_TOKENS, "
                "ICEFLOE_REST_WRITE_TOKENS): anyone who reaches this port may read and write "
                "the catalog; set ICEFLOE_REST_WRITES=false or configure tokens"
            )
        return {}
    can_write = scope == "write"
    if can_write:
        log.warning(
            "ICEFLOE_PLANNER_TOKEN_SCOPE=write: the planner token may write the catalog; give "
            "writers their own tokens in ICEFLOE_REST_WRITE_TOKENS and drop the scope"
        )
    elif (
        scope is None
        and settings.writes
        and settings.write_tokens is None
        and (settings.write_tokens_file is None)
    ):
        log.warning(
            "ICEFLOE_PLANNER_TOKEN now grants reads only: write requests with it are refused "
            "(403). Writers need a token in ICEFLOE_REST_WRITE_TOKENS, or set "
            "ICEFLOE_PLANNER_TOKEN_SCOPE=write to keep the old behaviour (the token writes)"
        )
    return {token: Principal(PLANNER_PRINCIPAL, can_write)}


def principal_of(request: web.Request) -> Principal:
    principal = request.get(PRINCIPAL_KEY)
    return principal if isinstance(principal, Principal) else ANONYMOUS


def _basic_credentials(header: str) -> tuple[str, str] | None:
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic" or not encoded.strip():
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    client_id, sep, client_secret = decoded.partition(":")
    if not sep:
        return None
    return urllib.parse.unquote_plus(client_id), urllib.parse.unquote_plus(client_secret)


def _oauth_error(status: int, error: str, description: str) -> web.Response:
    return web.json_response({"error": error, "error_description": description}, status=status)


async def oauth_tokens(authority: TokenAuthority, request: web.Request) -> web.Response:
    """``POST /v1/oauth/tokens``: the client-credentials grant only."""
    try:
        form: Mapping[str, Any] = await request.post()
    except Exception:
        return _oauth_error(400, "invalid_request", "the body must be form-encoded")
    grant = form.get("grant_type")
    if grant != "client_credentials":
        return _oauth_error(
            400, "unsupported_grant_type", f"only client_credentials is supported, got {grant!r}"
        )
    client_id, client_secret = form.get("client_id"), form.get("client_secret")
    basic = _basic_credentials(request.headers.get("Authorization", ""))
    if basic is not None:  # RFC 6749 2.3.1 client_secret_basic (DuckDB sends this)
        client_id, client_secret = basic
    if not isinstance(client_id, str) or not isinstance(client_secret, str):
        return _oauth_error(400, "invalid_request", "client_id and client_secret are required")
    if not authority.enabled:
        return _oauth_error(
            400, "invalid_client", "this catalog has no tokens configured; send no credentials"
        )
    issued = authority.issue(client_id, client_secret)
    if issued is None:
        return _oauth_error(401, "invalid_client", "unknown client_id or wrong client_secret")
    token, principal = issued
    audit(principal, "getToken", status=200)
    return web.json_response(
        {
            "access_token": token,
            "token_type": "bearer",
            "expires_in": authority.ttl_s,
            "issued_token_type": "urn:ietf:params:oauth:token-type:access_token",
        }
    )


def audit(principal: Principal, operation: str, *, status: int, **fields: Any) -> None:
    """One JSON line on the ``icefloe.audit`` logger; None fields are left out."""
    record: dict[str, Any] = {
        "time": datetime.now(UTC).isoformat(timespec="milliseconds"),
        "principal": principal.name,
        "operation": operation,
        "status": status,
    }
    record.update({k: v for k, v in fields.items() if v is not None})
    audit_log.info(json.dumps(record, sort_keys=False, default=str))
