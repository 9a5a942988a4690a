"""``Idempotency-Key`` on the REST catalog's mutating routes (REST spec, Iceberg 1.11).

A client that sends a mutation with ``Idempotency-Key: <uuid>`` and retries it with the same
key (after a timeout, a dropped connection, a 5xx) must not apply it twice: the retry gets
the first answer, status and body, without running the operation again. Replicas behind a
load balancer share the catalog, so the answers are kept with it
(:mod:`icefloe.catalog.records`: Redis, DynamoDB or files beside the warehouse), never in
one process:

1. the first request with a key claims it with a *pending* record (put-if-absent), holding
   a hash of the request (method, path, principal, body);
2. it runs; a final answer (2xx, and the deterministic 4xx: everything but 408, 425 and
   429) replaces the record with the answer, kept for ``idempotency-key-lifetime``; a 5xx
   or a crash deletes it, so a retry runs the operation again (the spec: 5xx is not
   finalized);
3. a request that finds the key claimed waits for the answer and replays it, so of
   concurrent requests with one key exactly one executes. A pending record lives for a
   lease renewed while the operation runs: a replica that dies mid-request frees the key
   when its lease runs out, and a waiting retry then takes the key over.

A replica can die after its operation took effect and before its answer was stored; a
takeover that simply ran the operation again would commit twice, or answer 409 for the
commit that did happen. So a handler *notes* what it is about to do before it does it
(:meth:`Attempt.note`: for a commit, each table's base metadata and a digest of the new
metadata), in a record kept for the key's lifetime, and the attempt that takes the key over
gets that note (:attr:`Attempt.prior`) to find out from the catalog whether the effect
happened, answering for it if it did. The note survives a 5xx too, so the retry of a
``CommitStateUnknownException`` is answered with the commit's real outcome.

The same key with a different request (another body, path, method or principal) is refused
with 422 ``UnprocessableEntityException`` (the IETF idempotency-key draft's answer; the REST
spec only says a key must not be reused across operations). A key that is not a UUID is 400.
Replays carry ``Idempotent-Replayed: true``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from icefloe.catalog.records import Records
from icefloe.planner.auth import principal_of
from icefloe.planner.errors import ApiError

log = logging.getLogger(__name__)

HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
LIFETIME_FIELD = "idempotency-key-lifetime"
# Set on the app when keys are honoured: /v1/config advertises it (a top-level field).
IDEMPOTENCY_LIFETIME = web.AppKey(LIFETIME_FIELD, str)
_UUID = re.compile(r"^[0-9a-fA-F]{8}-(?:[0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}$")
_NOT_FINAL_4XX = frozenset({408, 425, 429})
_REPLAYED_HEADERS = ("ETag",)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def is_final(status: int) -> bool:
    """Whether an answer is stored and replayed (the spec's finalization rules)."""
    return 200 <= status < 300 or (400 <= status < 500 and status not in _NOT_FINAL_4XX)


def iso_duration(seconds: int) -> str:
    """``PT30M`` style (what Java's ``Duration.parse`` and the spec's examples use)."""
    if seconds % 3600 == 0:
        return f"PT{seconds // 3600}H"
    if seconds % 60 == 0:
        return f"PT{seconds // 60}M"
    return f"PT{seconds}S"


class Attempt:
    """One execution of a request sent with a key: what its handler may note before an
    effect, and what an earlier attempt with the same key noted before it stopped."""

    def __init__(
        self,
        records: Records,
        name: str,
        fingerprint: str,
        lifetime_s: int,
        prior: dict[str, Any] | None,
    ) -> None:
        self._records = records
        self._name = name
        self._fingerprint = fingerprint
        self._lifetime_s = lifetime_s
        self.prior = prior

    async def note(self, intent: dict[str, Any]) -> None:
        """Record ``intent`` (JSON) before the effect it describes, replacing an earlier
        note of this attempt; a later attempt with the key reads it as :attr:`prior`."""
        record = {"fingerprint": self._fingerprint, "intent": intent}
        await self._records.put(self._name, json.dumps(record).encode(), self._lifetime_s)


_ATTEMPT = web.RequestKey("icefloe.idempotency.attempt", Attempt)  # for the handler


def attempt_of(request: web.Request) -> Attempt | None:
    """The attempt of a request sent with an ``Idempotency-Key`` (None without one)."""
    return request.get(_ATTEMPT)


class IdempotentRequests:
    """Runs mutating handlers at most once per key, over a shared records store."""

    def __init__(self, records: Records, lifetime_s: int, lease_s: float) -> None:
        self.records = records
        self.lifetime_s = lifetime_s
        self.lease_s = lease_s

    @property
    def lifetime(self) -> str:
        return iso_duration(self.lifetime_s)

    def wrap(self, handler: Handler) -> Handler:
        async def idempotent(request: web.Request) -> web.StreamResponse:
            key = request.headers.get(HEADER)
            if key is None:
                return await handler(request)
            return await self._run(request, key, handler)

        idempotent.__name__ = getattr(handler, "__name__", "idempotent")
        return idempotent

    async def _fingerprint(self, request: web.Request) -> str:
        digest = hashlib.sha256()
        for part in (request.method, request.path_qs, principal_of(request).name):
            digest.update(part.encode("utf-8", "surrogatepass") + b"\0")
        digest.update(await request.read())
        return digest.hexdigest()

    async def _run(self, request: web.Request, key: str, handler: Handler) -> web.StreamResponse:
        if not _UUID.match(key):
            raise ApiError(
                400,
                "BadRequestException",
                f"{HEADER} {key[:60]!r} is not a UUID; send a new UUID (v7) per operation",
            )
        name = "idempotency:" + key.lower()
        fingerprint = await self._fingerprint(request)
        pending = json.dumps({"state": "pending", "fingerprint": fingerprint}).encode()
        wait = 0.02
        while not await self.records.claim(name, pending, self.lease_s):
            stored = await self.records.get(name)
            if stored is None:  # expired or released between the claim and the read
                continue
            record = json.loads(stored)
            if record.get("fingerprint") != fingerprint:
                raise _reused(key)
            if record.get("state") == "done":
                return _replay(record)
            await asyncio.sleep(wait)  # another request with this key is running
            wait = min(1.0, wait * 2)
        holder = asyncio.create_task(self._hold(name, pending))
        try:
            request[_ATTEMPT] = await self._attempt(name, fingerprint, key)
        except BaseException:
            await self._finish(holder, name, fingerprint, 500)
            raise
        try:
            response = await handler(request)
        except ApiError as e:
            await self._finish(holder, name, fingerprint, e.code, error=e)
            raise
        except BaseException:
            await self._finish(holder, name, fingerprint, 500)
            raise
        await self._finish(holder, name, fingerprint, response.status, response=response)
        return response

    async def _attempt(self, name: str, fingerprint: str, key: str) -> Attempt:
        """This attempt, with the note an earlier attempt with the key left, if any."""
        notes = name + ":intent"
        stored = await self.records.get(notes)
        prior = None
        if stored is not None:
            record = json.loads(stored)
            if record.get("fingerprint") != fingerprint:
                raise _reused(key)
            prior = record.get("intent")
            log.info("%s: taking over from an attempt that stopped (noted %s)", name, prior)
        return Attempt(self.records, notes, fingerprint, self.lifetime_s, prior)

    async def _hold(self, name: str, pending: bytes) -> None:
        """Renew the pending record's lease while the operation runs."""
        while True:
            await asyncio.sleep(self.lease_s / 3)
            await self.records.put(name, pending, self.lease_s)

    async def _finish(
        self,
        holder: asyncio.Task[None],
        name: str,
        fingerprint: str,
        status: int,
        *,
        error: ApiError | None = None,
        response: web.StreamResponse | None = None,
    ) -> None:
        holder.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await holder
        record: dict[str, Any] = {"state": "done", "fingerprint": fingerprint, "status": status}
        if error is not None:
            record["error"] = {"type": error.error_type, "message": error.message}
        elif isinstance(response, web.Response):
            body = response.body
            record["body"] = bytes(body).decode("utf-8") if isinstance(body, bytes) else ""
            record["content-type"] = response.content_type
            record["headers"] = {
                h: response.headers[h] for h in _REPLAYED_HEADERS if h in response.headers
            }
        try:
            if is_final(status) and (error is not None or isinstance(response, web.Response)):
                await self.records.put(name, json.dumps(record).encode(), self.lifetime_s)
                # The answer stands for the note: no attempt runs after it.
                await self.records.delete(name + ":intent")
            else:
                await self.records.delete(name)
        except Exception:
            # The answer stands; a retry may run again, as it would without a key.
            log.exception("could not store the answer for %s", name)
            with contextlib.suppress(Exception):
                await self.records.delete(name)


def _reused(key: str) -> ApiError:
    return ApiError(
        422,
        "UnprocessableEntityException",
        f"{HEADER} {key} was already used for a different request; "
        "send a new key for a new operation",
    )


def _replay(record: dict[str, Any]) -> web.StreamResponse:
    status = int(record["status"])
    error = record.get("error")
    if error is not None:
        raise ApiError(status, str(error["type"]), str(error["message"]))
    headers = {**record.get("headers", {}), REPLAYED_HEADER: "true"}
    body = record.get("body") or None
    if body is None:
        return web.Response(status=status, headers=headers)
    return web.Response(
        status=status,
        text=body,
        content_type=record.get("content-type") or "application/json",
        headers=headers,
    )
