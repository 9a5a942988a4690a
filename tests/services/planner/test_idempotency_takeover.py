"""An ``Idempotency-Key``'s lease taken over after its replica died mid-request.

The retry of a commit whose outcome was unknown (500 ``CommitStateUnknownException``, not
stored) is answered the same way, from the note the first attempt left.

Two real planner processes share one Redis catalog; replica A reaches Redis through a
:class:`FreezingProxy`, which stops it at an exact point of a request with a key, and A is
then killed with SIGKILL while it holds the key's lease. The same request retried on
replica B, before and after the lease runs out, must leave exactly one commit in the table
(not two, not none) and get one answer, replayed to every later retry.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import signal
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer
from freezing_proxy import FreezingProxy
from planner_process import planner_process

from icefloe.catalog.fs import FileSystemCatalog
from icefloe.catalog.uri import load_catalog
from icefloe.errors import CommitStateUnknownError
from icefloe.io.fileio import LocalFileIO
from icefloe.planner.app import PlannerService
from icefloe.planner.config import PlannerConfig
from icefloe.planner.write_config import RestCatalogSettings
from icefloe.spec.metadata import TableMetadata
from icefloe.table.catalog import Table

ID: dict[str, Any] = {"id": 1, "name": "id", "type": "long", "required": True}
SCHEMA = {"type": "struct", "schema-id": 0, "fields": [ID]}
EVOLVE = {
    # What an engine sends to add a column: the schema it read, then the new one.
    "requirements": [{"type": "assert-current-schema-id", "current-schema-id": 0}],
    "updates": [
        {
            "action": "add-schema",
            "schema": {
                "type": "struct",
                "schema-id": 1,
                "fields": [
                    ID,
                    {"id": 2, "name": "note", "type": "string", "required": False},
                ],
            },
            "last-column-id": 2,
        },
        {"action": "set-current-schema", "schema-id": -1},
    ],
}
LEASE_S = "1.5"


async def _kill_at(
    marker: bytes,
    redis_server: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: tuple[str, Any] = ("/v1/namespaces/db/tables/t", EVOLVE),
    table_name: str = "db.t",
) -> tuple[list[tuple[int, Any, dict[str, str]]], Any]:
    """Replica A stopped at the first Redis command holding ``marker`` during an
    idempotent ``request`` (path and body: a schema change of db.t unless given), then
    killed; the same request retried three times on B. Returns the retries' (status,
    body, headers) and ``table_name`` as the catalog has it."""
    monkeypatch.setenv("ICEFLOE_REST_IDEMPOTENCY_LEASE_S", LEASE_S)
    warehouse = tmp_path / "wh"
    prefix = f"p{uuid.uuid4().hex[:10]}"
    direct = f"{redis_server}?warehouse={warehouse}&prefix={prefix}"
    path, body = request
    headers = {"Idempotency-Key": str(uuid.uuid4())}
    async with (
        FreezingProxy(redis_server) as proxy,
        aiohttp.ClientSession() as session,
        planner_process(
            warehouse, session, catalog=f"{proxy.url}?warehouse={warehouse}&prefix={prefix}"
        ) as (url_a, process_a),
        planner_process(warehouse, session, catalog=direct) as (url_b, _),
    ):
        assert (await session.post(f"{url_b}/v1/namespaces", json={"namespace": ["db"]})).ok
        made = await session.post(
            f"{url_b}/v1/namespaces/db/tables", json={"name": "t", "schema": SCHEMA}
        )
        assert made.status == 200, await made.text()
        proxy.arm(marker)
        first = asyncio.create_task(session.post(url_a + path, json=body, headers=headers))
        await proxy.frozen.wait()
        process_a.send_signal(signal.SIGKILL)
        await process_a.wait()
        with contextlib.suppress(aiohttp.ClientError):
            await first  # the connection died with A
        answers = []
        for _ in range(3):  # the first one while A's lease is still running
            retry = await session.post(url_b + path, json=body, headers=headers)
            answered = {k.lower(): v for k, v in retry.headers.items()}
            answers.append((retry.status, await retry.json(), answered))
    catalog = load_catalog(direct)
    try:
        table = await catalog.load_table(table_name)
    finally:
        await catalog.close()
    return answers, table


def _check_one_answer(answers: list[tuple[int, Any, dict[str, str]]], table: Any) -> None:
    """Three 200s, the later two replays of the first, which names the current metadata."""
    statuses = [status for status, _, _ in answers]
    assert statuses == [200, 200, 200], answers
    bodies = [body for _, body, _ in answers]
    assert bodies[1] == bodies[0] and bodies[2] == bodies[0]
    assert [h.get("idempotent-replayed") for _, _, h in answers] == [None, "true", "true"]
    assert bodies[0]["metadata-location"] == table.metadata_location
    assert answers[0][2]["etag"] == answers[1][2]["etag"]


def _check_one_commit(answers: list[tuple[int, Any, dict[str, str]]], table: Any) -> None:
    _check_one_answer(answers, table)
    # One commit after the create: one earlier metadata file, the two schemas.
    assert len(table.metadata.metadata_log) == 1, table.metadata.metadata_log
    assert [s.schema_id for s in table.metadata.schemas] == [0, 1]


# Records are stored base64-encoded: 15 bytes are 20 characters, unpadded.
DONE = base64.b64encode(b'{"state": "done')


@pytest.mark.integration
async def test_a_replica_killed_after_its_commit_is_answered_for_not_repeated(
    redis_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A is killed after the swap, before the answer is stored: B must not commit again
    (that would be a 409 or a second schema) but answer what A would have."""
    answers, table = await _kill_at(DONE, redis_server, tmp_path, monkeypatch)
    _check_one_commit(answers, table)


@pytest.mark.integration
async def test_a_replica_killed_before_its_commit_leaves_it_to_the_retry(
    redis_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A is killed at the pointer swap (never sent): B runs the commit, once."""
    answers, table = await _kill_at(b"EVAL", redis_server, tmp_path, monkeypatch)
    _check_one_commit(answers, table)


@pytest.mark.integration
async def test_a_replica_killed_after_creating_a_table_is_answered_for(
    redis_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A is killed after the create, before the answer is stored: B answers 200 with the
    table A made, not 409 AlreadyExists (which the client would take for someone else's)."""
    create = ("/v1/namespaces/db/tables", {"name": "c", "schema": SCHEMA})
    answers, table = await _kill_at(DONE, redis_server, tmp_path, monkeypatch, create, "db.c")
    _check_one_answer(answers, table)
    assert not table.metadata.metadata_log  # one metadata file: the create


class LostAnswerCatalog(FileSystemCatalog):
    """Its next commit happens, and then the store's answer is lost."""

    lose_next = False

    async def commit(self, table: Table, new_metadata: TableMetadata) -> Table:
        committed = await super().commit(table, new_metadata)
        if self.lose_next:
            self.lose_next = False
            raise CommitStateUnknownError("the store timed out after the request")
        return committed


async def test_the_retry_of_an_unknown_outcome_gets_the_commits_answer(tmp_path: Path) -> None:
    catalog = LostAnswerCatalog("lost", str(tmp_path), LocalFileIO())
    config = PlannerConfig(catalog=f"file://{tmp_path}", host="127.0.0.1", port=0)
    service = PlannerService(config, catalog, rest=RestCatalogSettings())
    path = "/v1/namespaces/db/tables/t"
    headers = {"Idempotency-Key": str(uuid.uuid4())}
    async with TestClient(TestServer(service.app())) as client:
        await client.post("/v1/namespaces", json={"namespace": ["db"]})
        made = await client.post("/v1/namespaces/db/tables", json={"name": "t", "schema": SCHEMA})
        assert made.status == 200, await made.text()
        catalog.lose_next = True
        unknown = await client.post(path, json=EVOLVE, headers=headers)
        assert unknown.status == 500, await unknown.text()
        assert (await unknown.json())["error"]["type"] == "CommitStateUnknownException"
        answers = []
        for _ in range(3):
            retry = await client.post(path, json=EVOLVE, headers=headers)
            answered = {k.lower(): v for k, v in retry.headers.items()}
            answers.append((retry.status, await retry.json(), answered))
        table = await catalog.load_table("db.t")
    _check_one_commit(answers, table)
