"""Delegated storage access in the REST catalog: vended credentials and remote signing.

The planner's hooks call :class:`AccessDelegation`:

* loadTable and createTable answers (:meth:`AccessDelegation.decorate`): when the client's
  ``X-Iceberg-Access-Delegation`` header asks for ``vended-credentials``, the answer's
  ``storage-credentials`` (and, for clients that only read ``config``, the same keys in
  ``config``) hold keys for the table's directories in the token's scope
  (:mod:`icefloe.planner.credentials`); when it asks for ``remote-signing``, ``config``
  says ``s3.remote-signing-enabled`` (and, for PyIceberg, ``s3.signer``) and where the
  signer is: ``s3.signer.uri`` and
  ``s3.signer.endpoint`` (and the spec's deprecated ``signer.uri``/``signer.endpoint``)
  name the table's own sign route, so even clients that only know those settings sign
  through a route that knows the table; ``remote-signing-config`` carries the table's name
  for clients that post to ``/v1/aws/s3/sign``. Either way ``s3.endpoint``,
  ``s3.path-style-access`` and ``client.region`` tell the client where the store is.
  Temporary (STS) keys come with ``client.refresh-credentials-endpoint`` (the table's
  credentials route, where Java's S3FileIO asks for new keys before they expire), and an
  answer carrying delegated access is never ``304 Not Modified`` (its keys are fresh);
* completed plans (:meth:`AccessDelegation.plan_credentials`): read-only keys for the
  plan's files, the spec's plan-scoped ``storage-credentials``;
* the routes: ``GET …/tables/{t}/credentials`` (loadCredentials; read-only with a
  ``planId``), ``POST …/tables/{t}/sign`` (signRequest) and ``POST /v1/aws/s3/sign`` (the
  path older clients default to; it needs the table named in ``properties``, since a
  signature is only given for the table's own files: :mod:`icefloe.planner.signer`).

Nothing is delegated unless the operator configured it (``ICEFLOE_REST_VENDED_CREDENTIALS``,
``ICEFLOE_REST_REMOTE_SIGNING``); a client asking for a mechanism that is off gets an answer
without it, as the spec allows.
"""

from __future__ import annotations

import functools
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

import pydantic
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, StrictStr

from icefloe.io.fileio import S3_ENDPOINT, S3_PATH_STYLE_ACCESS, S3_REGION
from icefloe.planner.auth import audit, principal_of
from icefloe.planner.credentials import CredentialVendor, s3_roots
from icefloe.planner.errors import ApiError
from icefloe.planner.signer import (
    READ_METHODS,
    SigningKeys,
    check_request,
    parse_target,
    sign,
    signing_credentials,
)
from icefloe.planner.write_config import RestCatalogSettings
from icefloe.spec.metadata import TableMetadata
from icefloe.spec.model import describe_problems

DELEGATION_HEADER: Final = "X-Iceberg-Access-Delegation"
VENDED: Final = "vended-credentials"
SIGNING: Final = "remote-signing"
LEGACY_SIGN_PATH: Final = "/v1/aws/s3/sign"
# remote-signing-config properties naming the table, for /v1/aws/s3/sign.
NAMESPACE_PROPERTY: Final = "icefloe.namespace"
TABLE_PROPERTY: Final = "icefloe.table"
DEFAULT_REGION: Final = "us-east-1"
REFRESH_ENDPOINT: Final = "client.refresh-credentials-endpoint"

# (namespace as in the URL path, table name) → the table's current metadata; 404 if none.
TableLookup = Callable[[str, str], Awaitable[TableMetadata]]


class SignRequest(BaseModel):
    """The spec's RemoteSignRequest."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    region: StrictStr
    uri: StrictStr
    method: StrictStr
    headers: dict[StrictStr, list[StrictStr]]
    properties: dict[StrictStr, StrictStr] = Field(default_factory=dict)
    body: StrictStr | None = None
    provider: StrictStr = "s3"


def requested(request: web.Request) -> set[str]:
    """The mechanisms the client's ``X-Iceberg-Access-Delegation`` header lists."""
    raw = request.headers.get(DELEGATION_HEADER, "")
    return {part.strip().lower() for part in raw.split(",") if part.strip()}


class AccessDelegation:
    """See the module docstring; built once per app from the REST settings."""

    def __init__(self, settings: RestCatalogSettings, catalog_properties: Mapping[str, str]):
        self.vendor = CredentialVendor(settings, catalog_properties)
        self.signing = settings.remote_signing
        self.public_url = settings.public_url.rstrip("/") if settings.public_url else None
        self.region = catalog_properties.get(S3_REGION) or DEFAULT_REGION
        self.path_style = catalog_properties.get(S3_PATH_STYLE_ACCESS)
        self._keys = signing_credentials(*self.vendor.planner_keys()) if self.signing else None

    # -- hooks ------------------------------------------------------------------------------

    async def decorate(
        self, request: web.Request, body: dict[str, Any], metadata: TableMetadata, table: str
    ) -> None:
        """Add what the client asked for and the operator enabled to the load-table ``body``
        of ``table`` (a name in the request's namespace)."""
        vend = self.vends_to(request)
        signed = SIGNING in requested(request) and self.signing
        if not (vend or signed) or not s3_roots(metadata.location, metadata.properties):
            return
        config: dict[str, str] = body.setdefault("config", {})
        config.update(self._store_config())
        if vend:
            write = principal_of(request).can_write
            creds = await self.vendor.storage_credentials(
                metadata.location, metadata.properties, write=write
            )
            body["storage-credentials"] = creds
            if creds:
                config.update(creds[0]["config"])
                if self.vendor.mode == "sts":
                    # Java's S3FileIO asks here for new keys before these expire.
                    config[REFRESH_ENDPOINT] = _table_route(request, table, "credentials")
        if signed:
            namespace = request.match_info["namespace"]
            endpoint = _table_route(request, table, "sign")
            url = self._base_url(request)
            config.update(
                {
                    "s3.remote-signing-enabled": "true",
                    # What PyIceberg reads instead (its fsspec FileIO; pyarrow's ignores it).
                    "s3.signer": "S3V4RestSigner",
                    "s3.signer.uri": url,
                    "s3.signer.endpoint": endpoint,
                    "signer.uri": url,
                    "signer.endpoint": endpoint,
                }
            )
            body["remote-signing-config"] = {
                "properties": {NAMESPACE_PROPERTY: namespace, TABLE_PROPERTY: table}
            }

    def delegates(self, request: web.Request) -> bool:
        """Whether a load-table answer to ``request`` carries delegated access."""
        wanted = requested(request)
        return (VENDED in wanted and self.vendor.enabled) or (SIGNING in wanted and self.signing)

    def vends_to(self, request: web.Request) -> bool:
        """Whether the client asked for vended credentials and the operator enabled them."""
        return VENDED in requested(request) and self.vendor.enabled

    async def plan_credentials(self, metadata: TableMetadata) -> list[dict[str, Any]]:
        """Read-only keys for a completed plan's files (the plan's storage-credentials)."""
        return await self.vendor.storage_credentials(
            metadata.location, metadata.properties, write=False
        )

    def register(self, app: web.Application, base: str, lookup: TableLookup) -> None:
        """The loadCredentials and signRequest routes (``base`` is ``/v1/{prefix}/``)."""
        table = base + "namespaces/{namespace}/tables/{table}"
        r = app.router
        r.add_get(table + "/credentials", self._credentials_route(lookup), allow_head=False)
        if self._keys is not None:
            r.add_post(table + "/sign", self._sign_route(lookup, self._keys, from_path=True))
            r.add_post(LEGACY_SIGN_PATH, self._sign_route(lookup, self._keys, from_path=False))

    # -- routes -----------------------------------------------------------------------------

    def _credentials_route(
        self, lookup: TableLookup
    ) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def load_credentials(request: web.Request) -> web.Response:
            info = request.match_info
            metadata = await lookup(info["namespace"], info["table"])
            write = principal_of(request).can_write and "planId" not in request.query
            creds = await self.vendor.storage_credentials(
                metadata.location, metadata.properties, write=write
            )
            return web.json_response({"storage-credentials": creds})

        return load_credentials

    def _sign_route(
        self, lookup: TableLookup, keys: Callable[[], SigningKeys], *, from_path: bool
    ) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def sign_request(request: web.Request) -> web.Response:
            try:
                body = SignRequest.model_validate_json(await request.read())
            except pydantic.ValidationError as e:
                raise ApiError(
                    400, "BadRequestException", f"invalid sign request: {describe_problems(e)}"
                ) from None
            if body.provider != "s3":
                raise ApiError(
                    400, "BadRequestException", f"provider {body.provider!r}: only s3 is signed"
                )
            if from_path:
                namespace, table = request.match_info["namespace"], request.match_info["table"]
            else:
                namespace = body.properties.get(NAMESPACE_PROPERTY, "")
                table = body.properties.get(TABLE_PROPERTY, "")
                if not namespace or not table:
                    raise ApiError(
                        400,
                        "BadRequestException",
                        f"{LEGACY_SIGN_PATH} signs only for a table: pass the "
                        "remote-signing-config properties of the table's loadTable answer, "
                        "or use the table's sign route (s3.signer.endpoint)",
                    )
            metadata = await lookup(namespace, table)
            method = body.method.upper()
            principal = principal_of(request)
            # Signed writes change storage: each one, granted or refused, gets an audit line.
            audited = functools.partial(
                audit,
                principal,
                "signRequest",
                table=f"{namespace}.{table}",
                method=method,
                uri=body.uri[:500],
            )
            try:
                target = parse_target(method, body.uri, self.vendor.client_endpoint(), body.body)
                roots = s3_roots(metadata.location, metadata.properties)
                check_request(method, target, roots, can_write=principal.can_write)
            except ApiError as e:
                if method not in READ_METHODS:
                    audited(status=e.code, error=e.message)
                raise
            headers = sign(method, body.uri, body.headers, body.region, keys(), body.body)
            if method not in READ_METHODS:
                audited(status=200)
            return web.json_response({"uri": body.uri, "headers": headers})

        return sign_request

    # -- helpers ----------------------------------------------------------------------------

    def _store_config(self) -> dict[str, str]:
        out = {"client.region": self.region, S3_REGION: self.region}
        endpoint = self.vendor.client_endpoint()
        if endpoint:
            out[S3_ENDPOINT] = endpoint
        if self.path_style:
            out[S3_PATH_STYLE_ACCESS] = self.path_style
        return out

    def _base_url(self, request: web.Request) -> str:
        if self.public_url:
            return self.public_url
        return f"{request.scheme}://{request.host}"


def _table_route(request: web.Request, table: str, route: str) -> str:
    """``v1/{prefix}/namespaces/{ns}/tables/{table}/{route}`` for the request's namespace,
    relative to the catalog's base URI (as clients resolve ``s3.signer.endpoint``)."""
    namespace = urllib.parse.quote(request.match_info["namespace"], safe="")
    base = request.path.split("/namespaces/")[0].lstrip("/")
    return f"{base}/namespaces/{namespace}/tables/{urllib.parse.quote(table, safe='')}/{route}"
