"""Delegated storage access against a real SeaweedFS with authentication on: vended
credentials (static per-scope identities, and STS AssumeRole with a session policy) and S3
remote signing. Clients here hold no storage keys of their own: everything they read or
write goes through what the planner vends or signs, and SeaweedFS (or the signer) refuses
what the token's scope or the table's location does not allow.

SeaweedFS runs with ``-s3.config`` (an admin identity for the planner, a reader and a
writer limited to the warehouse bucket) and ``-s3.iam.config`` (an STS signing key and one
role the planner assumes, narrowed per table by a session policy).
"""

from __future__ import annotations

import asyncio
import base64
import functools
import hashlib
import json
import logging
import urllib.parse
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import boto3
import botocore.exceptions
import pytest
from aiohttp.test_utils import TestClient, TestServer
from yarl import URL

from icefloe.catalog.uri import load_catalog
from icefloe.dev.local_stack import HOST, ServerProcess, _weed_command, start_server, weed_binary
from icefloe.planner.app import PlannerService
from icefloe.planner.config import PlannerConfig
from icefloe.planner.write_config import RestCatalogSettings
from icefloe.table.catalog import Catalog

READ = "reader-token-0001"
WRITE = "writer-token-0001"
ADMIN = ("icefloe-admin", "icefloe-admin-secret")
READER = ("vend-reader", "vend-reader-secret")
WRITER = ("vend-writer", "vend-writer-secret")
BUCKET = "icefloe-vend"
ROLE = "arn:aws:iam::role/IcefloeVend"
REGION = "us-east-1"
SCHEMA = {
    "type": "struct",
    "schema-id": 0,
    "fields": [{"id": 1, "name": "id", "type": "long", "required": True}],
}
VENDED = {"X-Iceberg-Access-Delegation": "vended-credentials"}
# The operator's read and write identities, handed out by the token's scope.
STATIC_VENDING = {
    "vended_credentials": "static",
    "vend_read_access_key_id": READER[0],
    "vend_read_secret_access_key": READER[1],
    "vend_write_access_key_id": WRITER[0],
    "vend_write_secret_access_key": WRITER[1],
}
SIGNING = {"X-Iceberg-Access-Delegation": "remote-signing"}

Client = TestClient[Any, Any]


def _identity(name: str, keys: tuple[str, str], actions: list[str]) -> dict[str, Any]:
    return {
        "name": name,
        "credentials": [{"accessKey": keys[0], "secretKey": keys[1]}],
        "actions": actions,
    }


S3_CONFIG = {
    "identities": [
        _identity("admin", ADMIN, ["Admin", "Read", "List", "Tagging", "Write"]),
        _identity("reader", READER, [f"Read:{BUCKET}", f"List:{BUCKET}"]),
        _identity("writer", WRITER, [f"Read:{BUCKET}", f"List:{BUCKET}", f"Write:{BUCKET}"]),
    ]
}
IAM_CONFIG = {
    "sts": {
        "tokenDuration": 3_600_000_000_000,
        "maxSessionLength": 43_200_000_000_000,
        "issuer": "icefloe-test-sts",
        "signingKey": "aWNlZmxvZS10ZXN0LXNpZ25pbmcta2V5LTMyLWNoYXJzISE=",
    },
    "policy": {"defaultEffect": "Deny", "storeType": "memory"},
    "roles": [
        {
            "roleName": "IcefloeVend",
            "roleArn": ROLE,
            "trustPolicy": {
                "Version": "2012-10-17",
                "Statement": [
                    {"Effect": "Allow", "Principal": {"AWS": "*"}, "Action": ["sts:AssumeRole"]}
                ],
            },
            "attachedPolicies": ["S3All"],
        }
    ],
    "policies": [
        {
            "name": "S3All",
            "document": {
                "Version": "2012-10-17",
                "Statement": [
                    {"Effect": "Allow", "Action": "s3:*", "Resource": "*"},
                    {"Effect": "Allow", "Action": "sts:ValidateSession", "Resource": "*"},
                ],
            },
        }
    ],
}


def s3_client(endpoint: str, keys: tuple[str, ...]) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id=keys[0],
        aws_secret_access_key=keys[1],
        aws_session_token=keys[2] if len(keys) > 2 else None,
    )


def _ready(port: int) -> bool:
    """Ready when the admin can create the bucket and write to it."""
    client = s3_client(f"http://{HOST}:{port}", ADMIN)
    try:
        try:
            client.create_bucket(Bucket=BUCKET)
        except client.exceptions.BucketAlreadyOwnedByYou:
            pass
        client.put_object(Bucket=BUCKET, Key="ready", Body=b"ok")
        return True
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError):
        return False


def _command(config: Path, iam: Path, port: int) -> list[str]:
    return [*_weed_command(weed_binary(), port), f"-s3.config={config}", f"-s3.iam.config={iam}"]


@pytest.fixture(scope="module")
def authed_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A SeaweedFS S3 gateway with authentication, identities and an STS role."""
    work = tmp_path_factory.mktemp("weed-auth")
    config, iam = work / "s3.json", work / "iam.json"
    config.write_text(json.dumps(S3_CONFIG))
    iam.write_text(json.dumps(IAM_CONFIG))
    server: ServerProcess = start_server(
        "seaweedfs-auth",
        functools.partial(_command, config, iam),
        _ready,
        env={"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "", "S3_BUCKET": ""},
        log_dir=work,
    )
    try:
        yield f"http://{HOST}:{server.port}"
    finally:
        server.stop()


class Served:
    def __init__(self, client: Client, service: PlannerService, endpoint: str) -> None:
        self.client, self.service, self.endpoint = client, service, endpoint

    @property
    def catalog(self) -> Catalog:
        return self.service.catalog

    async def create(self, name: str, headers: dict[str, str] | None = None) -> Any:
        """A table ``db.<name>`` created with the write token; the loadTable answer."""
        response = await self.client.post(
            "/v1/namespaces/db/tables",
            json={"name": name, "schema": SCHEMA},
            headers={"Authorization": f"Bearer {WRITE}", **(headers or {})},
        )
        assert response.status == 200, await response.text()
        return await response.json()

    async def load(self, name: str, token: str, headers: dict[str, str]) -> Any:
        response = await self.client.get(
            f"/v1/namespaces/db/tables/{name}",
            headers={"Authorization": f"Bearer {token}", **headers},
        )
        assert response.status == 200, await response.text()
        return await response.json()


@pytest.fixture
async def serve(authed_s3: str) -> AsyncIterator[Callable[..., Any]]:
    """``await serve(**rest_settings)``: a planner over a fresh warehouse in the bucket."""
    started: list[tuple[Client, Catalog]] = []

    async def make(**rest: Any) -> Served:
        warehouse = f"s3://{BUCKET}/wh-{uuid.uuid4().hex[:8]}"
        catalog = load_catalog(
            f"{warehouse}?endpoint={authed_s3}&s3.region={REGION}"
            f"&s3.access-key-id={ADMIN[0]}&s3.secret-access-key={ADMIN[1]}"
            "&s3.path-style-access=true"
        )
        config = PlannerConfig(catalog=warehouse, host="127.0.0.1", port=0)
        settings = RestCatalogSettings(read_tokens=READ, write_tokens=WRITE, **rest)
        service = PlannerService(config, catalog, rest=settings)
        client: Client = TestClient(TestServer(service.app()))
        await client.start_server()
        started.append((client, catalog))
        response = await client.post(
            "/v1/namespaces",
            json={"namespace": ["db"]},
            headers={"Authorization": f"Bearer {WRITE}"},
        )
        assert response.status == 200, await response.text()
        return Served(client, service, authed_s3)

    yield make
    for client, catalog in started:
        await client.close()
        await catalog.close()


def split(location: str) -> tuple[str, str]:
    bucket, _, key = location.removeprefix("s3://").partition("/")
    return bucket, key


def keys_of(credential: dict[str, Any]) -> tuple[str, ...]:
    config = credential["config"]
    token = config.get("s3.session-token")
    base = (config["s3.access-key-id"], config["s3.secret-access-key"])
    return (*base, token) if token else base


def denied(call: Callable[[], Any]) -> str:
    with pytest.raises(botocore.exceptions.ClientError) as info:
        call()
    return str(info.value.response["Error"]["Code"])


# ---------------------------------------------------------------------------------------------
# Vended credentials
# ---------------------------------------------------------------------------------------------


async def test_static_vending_gives_each_scope_its_identity(serve: Any) -> None:
    served = await serve(**STATIC_VENDING)
    created = await served.create("t", VENDED)
    location = created["metadata"]["location"]
    (writer_cred,) = [c for c in created["storage-credentials"] if c["prefix"] == location]
    assert keys_of(writer_cred) == WRITER
    assert created["config"]["s3.endpoint"] == served.endpoint
    loaded = await served.load("t", READ, VENDED)
    reader_cred = next(c for c in loaded["storage-credentials"] if c["prefix"] == location)
    assert keys_of(reader_cred) == READER
    bucket, key = split(location)
    writer = s3_client(served.endpoint, keys_of(writer_cred))
    writer.put_object(Bucket=bucket, Key=f"{key}/data/a.parquet", Body=b"written")
    reader = s3_client(served.endpoint, keys_of(reader_cred))
    body = reader.get_object(Bucket=bucket, Key=f"{key}/data/a.parquet")["Body"].read()
    assert body == b"written"
    code = denied(lambda: reader.put_object(Bucket=bucket, Key=f"{key}/data/b", Body=b"x"))
    assert code == "AccessDenied"
    # Keys are never answered "not modified": a client revalidating gets them afresh.
    response = await served.client.get(
        "/v1/namespaces/db/tables/t",
        headers={"Authorization": f"Bearer {READ}", "If-None-Match": "x", **VENDED},
    )
    etag = response.headers["ETag"]
    response = await served.client.get(
        "/v1/namespaces/db/tables/t",
        headers={"Authorization": f"Bearer {READ}", "If-None-Match": etag, **VENDED},
    )
    assert response.status == 200
    assert (await response.json())["storage-credentials"]
    # Without the header, nothing is vended (and revalidation answers 304 as before).
    response = await served.client.get(
        "/v1/namespaces/db/tables/t",
        headers={"Authorization": f"Bearer {READ}", "If-None-Match": etag},
    )
    assert response.status == 304
    plain = await served.load("t", WRITE, {})
    assert "storage-credentials" not in plain
    assert "s3.access-key-id" not in plain["config"]


async def test_sts_vending_is_scoped_to_the_table_and_the_token(serve: Any, authed_s3: str) -> None:
    served = await serve(
        vended_credentials="sts", vend_sts_role_arn=ROLE, vend_sts_endpoint=authed_s3
    )
    created = await served.create("t", VENDED)
    other = await served.create("u")
    location = created["metadata"]["location"]
    bucket, key = split(location)
    _, other_key = split(other["metadata"]["location"])
    cred = next(c for c in created["storage-credentials"] if c["prefix"] == location)
    assert "s3.session-token" in cred["config"]
    assert int(cred["config"]["s3.session-token-expires-at-ms"]) > 0
    refresh = created["config"]["client.refresh-credentials-endpoint"]
    assert refresh == "v1/namespaces/db/tables/t/credentials"
    writer = s3_client(served.endpoint, keys_of(cred))
    writer.put_object(Bucket=bucket, Key=f"{key}/data/a.parquet", Body=b"mine")
    assert writer.get_object(Bucket=bucket, Key=f"{key}/data/a.parquet")["Body"].read() == b"mine"
    # Another table's prefix, and the bucket outside the table, are out of reach.
    assert (
        denied(lambda: writer.put_object(Bucket=bucket, Key=f"{other_key}/data/x", Body=b"x"))
        == "AccessDenied"
    )
    metadata_key = split(other["metadata-location"])[1]
    assert denied(lambda: writer.get_object(Bucket=bucket, Key=metadata_key)) == "AccessDenied"
    # A read token's keys read the table and cannot write it.
    response = await served.client.get(
        "/v1/namespaces/db/tables/t/credentials", headers={"Authorization": f"Bearer {READ}"}
    )
    assert response.status == 200, await response.text()
    read_cred = next(
        c for c in (await response.json())["storage-credentials"] if c["prefix"] == location
    )
    reader = s3_client(served.endpoint, keys_of(read_cred))
    assert reader.get_object(Bucket=bucket, Key=f"{key}/data/a.parquet")["Body"].read() == b"mine"
    assert (
        denied(lambda: reader.put_object(Bucket=bucket, Key=f"{key}/data/b", Body=b"x"))
        == "AccessDenied"
    )
    # A plan's credentials are read-only, even for a write token.
    response = await served.client.post(
        "/v1/namespaces/db/tables/t/plan",
        json={},
        headers={"Authorization": f"Bearer {WRITE}", **VENDED},
    )
    assert response.status == 200, await response.text()
    plan_cred = (await response.json())["storage-credentials"][0]
    planner_keys = s3_client(served.endpoint, keys_of(plan_cred))
    assert (
        denied(lambda: planner_keys.put_object(Bucket=bucket, Key=f"{key}/data/c", Body=b"x"))
        == "AccessDenied"
    )


async def test_credentials_of_a_missing_table_are_404(serve: Any) -> None:
    served = await serve(**STATIC_VENDING)
    response = await served.client.get(
        "/v1/namespaces/db/tables/nope/credentials", headers={"Authorization": f"Bearer {READ}"}
    )
    assert response.status == 404
    assert (await response.json())["error"]["type"] == "NoSuchTableException"


# ---------------------------------------------------------------------------------------------
# Remote signing
# ---------------------------------------------------------------------------------------------


async def sign(
    served: Served, token: str, method: str, url: str, path: str | None = None, **extra: Any
) -> aiohttp.ClientResponse:
    headers = {"Host": url.split("/")[2]}
    if method == "PUT":
        headers["Content-Length"] = str(len(extra.pop("data", b"")))
    body = {
        "region": REGION,
        "uri": url,
        "method": method,
        "headers": {k: [v] for k, v in headers.items()},
        **extra,
    }
    return await served.client.post(
        path or "/v1/namespaces/db/tables/t/sign",
        json=body,
        headers={"Authorization": f"Bearer {token}"},
    )


async def send(
    method: str, url: str, signed: dict[str, list[str]], data: bytes = b""
) -> tuple[int, bytes]:
    headers = {k: ", ".join(v) for k, v in signed.items()}
    async with (
        aiohttp.ClientSession(skip_auto_headers=["Content-Type"]) as session,
        session.request(
            method, URL(url, encoded=True), headers=headers, data=data or None
        ) as response,
    ):
        return response.status, await response.read()


async def test_remote_signing_reads_and_writes_only_the_table(
    serve: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="icefloe.audit")
    served = await serve(remote_signing=True)
    created = await served.create("t", SIGNING)
    await served.create("u")
    config = created["config"]
    assert config["s3.remote-signing-enabled"] == "true"
    assert config["s3.signer.endpoint"] == "v1/namespaces/db/tables/t/sign"
    assert config["s3.signer"] == "S3V4RestSigner"
    location = created["metadata"]["location"]
    bucket, key = split(location)
    url = f"{served.endpoint}/{bucket}/{key}/data/signed.parquet"

    response = await sign(served, WRITE, "PUT", url, data=b"signed bytes")
    assert response.status == 200, await response.text()
    answer = await response.json()
    assert answer["uri"] == url
    assert await send("PUT", url, answer["headers"], b"signed bytes") == (200, b"")

    response = await sign(served, READ, "GET", url)
    assert response.status == 200, await response.text()
    assert await send("GET", url, (await response.json())["headers"]) == (200, b"signed bytes")

    # A read token gets no signature for a write.
    response = await sign(served, READ, "PUT", url, data=b"x")
    assert response.status == 403
    assert "write token" in (await response.json())["error"]["message"]
    # Each signed or refused write has its audit line; reads have none.
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "icefloe.audit"]
    signs = [
        (x["principal"], x["method"], x["status"]) for x in lines if x["operation"] == "signRequest"
    ]
    assert signs == [("writer", "PUT", 200), ("reader", "PUT", 403)]
    # Unsigned, SeaweedFS refuses the client (it holds no keys).
    status, _ = await send("PUT", url, {"Host": [url.split("/")[2]]}, b"x")
    assert status == 403


@pytest.mark.parametrize(
    "suffix",
    [
        "../u/data/x",
        "%2e%2e/u/data/x",
        "data/../../u/data/x",
        "data//x",
        "./data/x",
        "data/%252e%252e/x",
    ],
)
async def test_signer_refuses_paths_leaving_the_table(serve: Any, suffix: str) -> None:
    served = await serve(remote_signing=True)
    created = await served.create("t")
    bucket, key = split(created["metadata"]["location"])
    response = await sign(served, WRITE, "PUT", f"{served.endpoint}/{bucket}/{key}/{suffix}")
    assert response.status == 403, await response.text()


async def test_signer_refuses_other_tables_buckets_hosts_and_subresources(serve: Any) -> None:
    served = await serve(remote_signing=True)
    created = await served.create("t")
    other = await served.create("u")
    bucket, key = split(created["metadata"]["location"])
    _, other_key = split(other["metadata"]["location"])
    base = served.endpoint
    refused = [
        ("GET", f"{base}/{bucket}/{other_key}/metadata/x.json"),
        ("PUT", f"{base}/other-bucket/{key}/data/x"),
        ("GET", f"http://evil.example:1/{bucket}/{key}/data/x"),
        ("PUT", f"{base}/{bucket}/{key}/data/x?acl"),
        ("GET", f"{base}/{bucket}?list-type=2&prefix={key}"),  # would also list t2...
        ("GET", f"{base}/{bucket}?list-type=2"),
        ("GET", f"{base}/"),
        ("PATCH", f"{base}/{bucket}/{key}/data/x"),
    ]
    for method, url in refused:
        response = await sign(served, WRITE, method, url)
        assert response.status == 403, (method, url, await response.text())
    # As S3 clients send it: the query percent-encoded (the signature covers it as sent).
    list_url = f"{base}/{bucket}?list-type=2&prefix={urllib.parse.quote(key + '/', safe='')}"
    listing = await sign(served, READ, "GET", list_url)
    assert listing.status == 200, await listing.text()
    status, body = await send("GET", list_url, (await listing.json())["headers"])
    assert status == 200 and b"metadata" in body, body
    # The legacy path signs only when the table is named, and then by the same rules.
    url = f"{base}/{bucket}/{key}/data/x"
    response = await sign(served, WRITE, "PUT", url, path="/v1/aws/s3/sign")
    assert response.status == 400
    named = {"icefloe.namespace": "db", "icefloe.table": "t"}
    response = await sign(served, WRITE, "PUT", url, path="/v1/aws/s3/sign", properties=named)
    assert response.status == 200, await response.text()
    other_url = f"{base}/{bucket}/{other_key}/data/x"
    response = await sign(served, WRITE, "PUT", other_url, path="/v1/aws/s3/sign", properties=named)
    assert response.status == 403


async def test_bulk_delete_is_signed_only_for_the_tables_keys(serve: Any) -> None:
    served = await serve(remote_signing=True)
    created = await served.create("t")
    other = await served.create("u")
    bucket, key = split(created["metadata"]["location"])
    _, other_key = split(other["metadata"]["location"])
    url = f"{served.endpoint}/{bucket}?delete"

    def body(*keys: str) -> str:
        objects = "".join(f"<Object><Key>{k}</Key></Object>" for k in keys)
        return f'<Delete xmlns="http://s3.amazonaws.com/doc/2006-03-01/">{objects}</Delete>'

    admin = s3_client(served.endpoint, ADMIN)
    for name in ("a", "b"):
        admin.put_object(Bucket=bucket, Key=f"{key}/data/{name}", Body=b"x")
    admin.put_object(Bucket=bucket, Key=f"{other_key}/data/victim", Body=b"v")
    mine = body(f"{key}/data/a", f"{key}/data/b")
    ok = await sign(served, WRITE, "POST", url, body=mine)
    assert ok.status == 200, await ok.text()
    signed = (await ok.json())["headers"]
    # The signature holds only for the body whose keys were checked: another body (the
    # other table's key) is refused by the store, whatever Content-MD5 the client sends.
    forged = body(f"{other_key}/data/victim").encode()
    forged_md5 = base64.b64encode(hashlib.md5(forged).digest()).decode()
    status, _ = await send("POST", url, {**signed, "Content-MD5": [forged_md5]}, forged)
    assert status in (400, 403), status
    assert admin.get_object(Bucket=bucket, Key=f"{other_key}/data/victim")["Body"].read() == b"v"
    status, _ = await send("POST", url, signed, mine.encode())
    assert status == 200
    listed = admin.list_objects_v2(Bucket=bucket, Prefix=f"{key}/data/")
    assert listed.get("KeyCount", 0) == 0
    bad = await sign(served, WRITE, "POST", url, body=body(f"{key}/data/a", f"{other_key}/m"))
    assert bad.status == 403
    entity = '<!DOCTYPE d [<!ENTITY e "x">]>' + body(f"{key}/data/a")
    assert (await sign(served, WRITE, "POST", url, body=entity)).status == 400
    assert (await sign(served, READ, "POST", url, body=body(f"{key}/data/a"))).status == 403


async def test_signing_routes_are_absent_unless_enabled(serve: Any) -> None:
    served = await serve()
    created = await served.create(
        "t", {"X-Iceberg-Access-Delegation": "vended-credentials,remote-signing"}
    )
    assert "storage-credentials" not in created
    assert "s3.remote-signing-enabled" not in created["config"]
    response = await sign(served, WRITE, "GET", f"{served.endpoint}/{BUCKET}/x")
    assert response.status in (404, 405)


# ---------------------------------------------------------------------------------------------
# A real client: PyIceberg's RestCatalog holding no storage keys
# ---------------------------------------------------------------------------------------------


def _pyiceberg_round_trip(
    url: str, refused_as: type[Exception] = OSError, **properties: str
) -> tuple[list[int], str]:
    """Create, append and scan as a writer, then try to append as a reader, which fails
    with ``refused_as`` (blocking); both catalogs have ``properties``."""
    import pyarrow as pa
    from pyiceberg.catalog.rest import RestCatalog

    schema = pa.schema([pa.field("id", pa.int64(), False)])

    def rows(*ids: int) -> pa.Table:
        return pa.table({"id": pa.array(ids, pa.int64())}, schema=schema)

    writer = RestCatalog("w", uri=url, token=WRITE, **properties)
    table = writer.create_table(("db", "py"), schema)
    table.append(rows(1, 2, 3))
    table.append(rows(4))
    ids = sorted(writer.load_table(("db", "py")).scan().to_arrow().column("id").to_pylist())
    reader = RestCatalog("r", uri=url, token=READ, **properties)
    read_table = reader.load_table(("db", "py"))
    assert sorted(read_table.scan().to_arrow().column("id").to_pylist()) == ids
    with pytest.raises(refused_as) as refused:
        read_table.append(rows(5))
    return ids, str(refused.value)


async def test_pyiceberg_without_keys_writes_and_reads_through_vended_credentials(
    serve: Any, authed_s3: str
) -> None:
    served = await serve(
        vended_credentials="sts", vend_sts_role_arn=ROLE, vend_sts_endpoint=authed_s3
    )
    url = str(served.client.make_url("")).rstrip("/")
    ids, refusal = await asyncio.to_thread(_pyiceberg_round_trip, url)
    assert ids == [1, 2, 3, 4]
    assert "ACCESS_DENIED" in refusal.upper().replace(" ", "_"), refusal


async def test_pyiceberg_without_keys_writes_and_reads_through_remote_signing(
    serve: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """PyIceberg's signer (``s3.signer``, which the planner's config names) works only in
    its fsspec FileIO (s3fs): every S3 request it sends is signed by the planner, and a read
    token gets no write signed."""
    from pyiceberg.exceptions import SignError

    caplog.set_level(logging.INFO, logger="icefloe.audit")
    served = await serve(remote_signing=True)
    url = str(served.client.make_url("")).rstrip("/")
    ids, refusal = await asyncio.to_thread(
        _pyiceberg_round_trip,
        url,
        SignError,
        **{
            "header.X-Iceberg-Access-Delegation": "remote-signing",
            "py-io-impl": "pyiceberg.io.fsspec.FsspecFileIO",
            # (s3.signer: S3V4RestSigner comes from the planner's loadTable config.)
        },
    )
    assert ids == [1, 2, 3, 4]
    assert "Failed to sign request 403" in refusal, refusal
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "icefloe.audit"]
    signed = [(x["principal"], x["status"]) for x in lines if x["operation"] == "signRequest"]
    # The writer's data, manifest and manifest-list PUTs, twice; the reader's data PUT.
    assert signed.count(("writer", 200)) == 6 and signed[-1] == ("reader", 403), signed
