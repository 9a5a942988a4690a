"""S3 remote signing: the planner signs a client's S3 request with its own keys, only for the
client's table and only as far as the client's token reaches.

A client without storage keys sends the REST spec's ``RemoteSignRequest`` (method, region,
URI, headers, and for ``DeleteObjects`` the body) and gets back the URI and the headers to
send, ``Authorization`` included (AWS Signature V4, botocore's S3 signer). Before signing,
:func:`check_request` decides what the request would touch:

* the bucket and key come from the URI, path-style (``endpoint/bucket/key``) or
  virtual-hosted (``bucket.endpoint/key``), on the configured S3 endpoint (or AWS's) only;
  the key is percent-decoded once, as S3 does, and must lie under one of the table's
  directories in the normal form of :mod:`icefloe.io.locations` (so ``..``, ``.``, ``//`` and
  their percent-encoded spellings are refused, as are other buckets);
* listings (``GET`` on the bucket) must name a ``prefix`` strictly inside a table directory
  (``t/`` or ``t/data``, never ``t``, which would also list ``t2``), and a bulk delete
  (``POST ?delete``) must list only keys inside the table;
* only the object and listing sub-resources Iceberg's file IO uses are signed (multipart
  uploads, ``x-id``, ``versionId``); ``?acl``, ``?policy`` and the like are refused;
* ``GET``/``HEAD`` need a read token, ``PUT``/``POST``/``DELETE`` a write token.

Refusals are 403 ``ForbiddenException`` naming what was refused; malformed requests 400.
The payload is not signed (``UNSIGNED-PAYLOAD``, unless the client sent its own
``x-amz-content-sha256``): the planner never sees object data. A bulk delete's body is the
exception: its SHA-256 and MD5 are signed as computed by the signer, so the store refuses
any body other than the one whose keys were checked.
"""

from __future__ import annotations

import base64
import hashlib
import re
import urllib.parse
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Final
from xml.etree import ElementTree

from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from icefloe.errors import ValidationError
from icefloe.io.locations import Location, normal_location
from icefloe.planner.errors import ApiError

READ_METHODS: Final = frozenset({"GET", "HEAD"})
WRITE_METHODS: Final = frozenset({"PUT", "POST", "DELETE"})
UNSIGNED_PAYLOAD: Final = "UNSIGNED-PAYLOAD"
_OBJECT_QUERY: Final = frozenset({"x-id", "uploads", "uploadId", "partNumber", "versionId"})
_LIST_QUERY: Final = frozenset(
    {
        "x-id",
        "list-type",
        "prefix",
        "delimiter",
        "continuation-token",
        "start-after",
        "max-keys",
        "encoding-type",
        "fetch-owner",
        "marker",
    }
)
_AWS_HOST: Final = re.compile(r"^(?:(?P<bucket>.+)\.)?s3(?:[.-](?:[a-z0-9-]+\.)*)?amazonaws\.com$")
_DELETE_BODY_MAX: Final = 1 << 20
# (access key id, secret access key, session token or None)
SigningKeys = tuple[str, str, str | None]
# Headers a signer must not pass on from a client, or that change in transit.
_NOT_SIGNED: Final = frozenset(
    {"authorization", "x-amz-date", "x-amz-security-token", "x-amz-content-sha256"}
)


def _forbidden(message: str) -> ApiError:
    return ApiError(403, "ForbiddenException", message)


def _bad(message: str) -> ApiError:
    return ApiError(400, "BadRequestException", message)


@dataclass(frozen=True, slots=True)
class Target:
    """What a request touches: a bucket, and keys or a listing prefix in it."""

    bucket: str
    keys: tuple[str, ...]
    list_prefix: str | None = None


def parse_target(method: str, uri: str, endpoint: str | None, body: str | None) -> Target:
    """The bucket and keys ``uri`` addresses (see the module docstring); 403 or 400 if none."""
    parts = urllib.parse.urlsplit(uri)
    host = (parts.hostname or "").lower()
    if parts.scheme not in ("http", "https") or not host:
        raise _bad(f"uri {uri[:200]!r} is not an http(s) URL")
    path = parts.path
    bucket: str | None = None
    if endpoint:
        ends = urllib.parse.urlsplit(endpoint)
        ehost, eport = (ends.hostname or "").lower(), ends.port
        if parts.port != eport:
            raise _forbidden(f"uri {uri[:200]!r} is not on this catalog's S3 endpoint")
        if host != ehost:
            if not host.endswith("." + ehost):
                raise _forbidden(f"uri {uri[:200]!r} is not on this catalog's S3 endpoint")
            bucket = host[: -len(ehost) - 1]
    else:
        match = _AWS_HOST.match(host)
        if match is None:
            raise _forbidden(f"uri {uri[:200]!r} is not an S3 endpoint")
        bucket = match.group("bucket")
    if bucket is None:
        bucket, _, raw_key = path.lstrip("/").partition("/")
    else:
        raw_key = path[1:] if path.startswith("/") else path
    if not bucket:
        raise _forbidden("requests without a bucket (ListBuckets) are not signed")
    query = urllib.parse.parse_qs(parts.query, keep_blank_values=True)
    key = urllib.parse.unquote(raw_key)
    if key:
        _only(query, _OBJECT_QUERY, uri)
        return Target(bucket, (key,))
    if method == "POST" and "delete" in query:
        _only(query, {"delete", "x-id"}, uri)
        return Target(bucket, _delete_keys(body))
    if method in READ_METHODS and "prefix" in query:
        _only(query, _LIST_QUERY, uri)
        return Target(bucket, (), query["prefix"][0])
    raise _forbidden(
        f"{method} {uri[:200]!r}: only object requests, listings with a prefix and bulk "
        "deletes are signed"
    )


def _only(query: Mapping[str, list[str]], allowed: Collection[str], uri: str) -> None:
    extra = sorted(k for k in query if k not in allowed)
    if extra:
        raise _forbidden(f"uri {uri[:200]!r}: the sub-resource {extra[0]!r} is not signed")


def _delete_keys(body: str | None) -> tuple[str, ...]:
    """The keys of a ``DeleteObjects`` body (no DTDs or entities: refused, not expanded)."""
    if not body:
        raise _bad("a bulk delete (POST ?delete) must send its body to be signed")
    if len(body) > _DELETE_BODY_MAX or "<!" in body:
        raise _bad("the bulk delete body is too large or holds a DTD")
    try:
        root = ElementTree.fromstring(body)
    except ElementTree.ParseError:
        raise _bad("the bulk delete body is not XML") from None
    keys = tuple(el.text or "" for el in root.iter() if el.tag.rsplit("}", 1)[-1] == "Key")
    if not keys:
        raise _bad("the bulk delete body names no key")
    return keys


def check_request(
    method: str,
    target: Target,
    roots: list[Location],
    *,
    can_write: bool,
) -> None:
    """403 unless ``can_write`` allows ``method`` and every key (or the listing prefix) lies
    inside one of the table's ``roots``."""
    if method in WRITE_METHODS:
        if not can_write:
            raise _forbidden(f"{method} needs a write token; this token may only read")
    elif method not in READ_METHODS:
        raise _forbidden(f"{method} requests are not signed")
    for key in target.keys:
        if not _inside(target.bucket, key, roots):
            raise _forbidden(
                f"s3://{target.bucket}/{key[:200]} is outside the table's location; the "
                "signer signs only requests for the table's own files"
            )
    if target.list_prefix is not None and not _inside(target.bucket, target.list_prefix, roots):
        raise _forbidden(
            f"listing s3://{target.bucket}/{target.list_prefix[:200]} would reach outside the "
            "table's location; list a prefix ending in '/' inside it"
        )


def _inside(bucket: str, key: str, roots: list[Location]) -> bool:
    """Whether ``s3://bucket/key`` lies strictly inside a root, as does every key starting
    with it (for a listing prefix): ``t/x`` and ``t/`` are inside ``t``; ``t`` itself is not
    (as a listing prefix it would also list ``t2``)."""
    text = key[:-1] if key.endswith("/") else key
    if text.endswith("/"):
        return False  # an empty last step: a different key from the folder's
    try:
        where = normal_location(f"s3://{bucket}/{text}")
    except ValidationError:
        return False
    return any(
        root.contains(where) and (key.endswith("/") or where.path != root.path) for root in roots
    )


class _FixedPayloadAuth(S3SigV4Auth):
    """SigV4 for S3 with a payload hash decided by the signer, not computed from a body it
    does not have."""

    def __init__(self, credentials: Credentials, region: str, payload_hash: str) -> None:
        super().__init__(credentials, "s3", region)
        self._payload_hash = payload_hash

    def payload(self, request: AWSRequest) -> str:
        return self._payload_hash


def sign(
    method: str,
    uri: str,
    headers: Mapping[str, list[str]],
    region: str,
    keys: SigningKeys,
    body: str | None = None,
) -> dict[str, list[str]]:
    """The headers the client must add to (or change in) its request: the signature's.

    The payload is signed as the client declared it (``x-amz-content-sha256``, else
    ``UNSIGNED-PAYLOAD``), except when the signer checked a ``body`` (bulk deletes): then its
    SHA-256 and MD5 are the signer's own, so the store refuses any other body than the one
    whose keys were checked."""
    flat: dict[str, str] = {}
    declared = UNSIGNED_PAYLOAD
    for name, values in headers.items():
        lower = name.lower()
        if lower == "x-amz-content-sha256":
            declared = ", ".join(values) or UNSIGNED_PAYLOAD
        elif lower not in _NOT_SIGNED and not (body is not None and lower == "content-md5"):
            flat[name] = ", ".join(values)
    payload = body.encode() if body is not None else b""
    if body is not None:
        declared = hashlib.sha256(payload).hexdigest()
        flat["Content-MD5"] = base64.b64encode(hashlib.md5(payload).digest()).decode()
    request = AWSRequest(method=method, url=uri, headers=flat, data=payload)
    _FixedPayloadAuth(Credentials(*keys), region, declared).add_auth(request)
    sent = {k.lower(): ", ".join(v) for k, v in headers.items()}
    # Only what the client must add or change: Java's signer client merges these into its
    # request, PyIceberg's appends them (a full echo would duplicate Host and the like).
    return {k: [str(v)] for k, v in request.headers.items() if sent.get(k.lower()) != str(v)}


def signing_credentials(key_id: str | None, secret: str | None) -> Callable[[], SigningKeys]:
    """The planner's keys for signing: the configured pair, else botocore's default chain
    (environment, profile, a pod's web-identity role; refreshed as they expire).
    ValidationError at startup if there are none."""
    if key_id and secret:
        fixed = (key_id, secret, None)
        return lambda: fixed
    if key_id or secret:
        raise ValidationError(
            "ICEFLOE_REST_STORAGE_ACCESS_KEY_ID and ICEFLOE_REST_STORAGE_SECRET_ACCESS_KEY "
            "go together: set both, or neither to use the default AWS credentials"
        )
    import botocore.session

    found = botocore.session.get_session().get_credentials()
    if found is None:
        raise ValidationError(
            "ICEFLOE_REST_REMOTE_SIGNING=true needs the planner's own S3 keys: "
            "ICEFLOE_REST_STORAGE_ACCESS_KEY_ID and ICEFLOE_REST_STORAGE_SECRET_ACCESS_KEY, "
            "s3.access-key-id and s3.secret-access-key in the catalog URI, or AWS credentials"
        )

    def current() -> SigningKeys:
        frozen = found.get_frozen_credentials()
        return str(frozen.access_key), str(frozen.secret_key), frozen.token

    return current
