"""The test servers themselves: they start, speak their protocol, and stop by PID.

The integration tests below are the evidence that each fixture is a usable stand-in for the
production dependency (conditional writes included), and the process tests pin down the
start-up and shutdown behaviour every other integration test relies on.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator

import aioboto3
import pytest
import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from botocore.exceptions import ClientError

from servers import (
    HOST,
    S3Endpoint,
    ServerStartError,
    owns_listening_port,
    probe_http,
    start_server,
)

# --------------------------------------------------------------------------------------
# Process handling (no external servers needed)
# --------------------------------------------------------------------------------------

_LISTEN_FOREVER = (
    "import signal, socket, sys, time\n"
    "if sys.argv[2] == 'ignore-term':\n"
    "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen()\n"
    "while True:\n"
    "    c, _ = s.accept(); c.recv(1024); c.sendall(b'HTTP/1.0 204 No Content\\r\\n\\r\\n')\n"
    "    c.close()\n"
)


def _listener(port: int, mode: str) -> list[str]:
    return [sys.executable, "-c", _LISTEN_FOREVER, str(port), mode]


@pytest.fixture
def failed_start() -> Iterator[list[ServerStartError]]:
    """Collects expected start-up failures and removes the logs they keep for debugging."""
    errors: list[ServerStartError] = []
    yield errors
    for error in errors:
        for path in error.log_paths:
            path.unlink(missing_ok=True)


def test_owns_listening_port_distinguishes_processes() -> None:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert owns_listening_port(os.getpid(), port) is True
        other = subprocess.Popen(["sleep", "30"])
        try:
            assert owns_listening_port(other.pid, port) is False
        finally:
            other.kill()
            other.wait()


def test_start_server_reports_early_exit_with_log_tail(
    failed_start: list[ServerStartError],
) -> None:
    with pytest.raises(ServerStartError) as info:
        start_server(
            "doomed",
            lambda port: ["sh", "-c", f"echo cannot bind {port} >&2; exit 3"],
            probe_http,
            attempts=2,
        )
    failed_start.append(info.value)
    assert len(info.value.log_paths) == 2
    message = str(info.value)
    assert "doomed failed to start 2 times" in message
    assert "exited with code 3" in message
    assert "cannot bind" in message


def test_start_server_reports_a_server_that_never_answers(
    failed_start: list[ServerStartError],
) -> None:
    with pytest.raises(ServerStartError) as info:
        start_server(
            "silent",
            lambda port: ["sh", "-c", "echo warming up; exec sleep 30"],
            probe_http,
            timeout_s=0.5,
        )
    failed_start.append(info.value)
    assert "silent did not become ready" in str(info.value)
    assert "warming up" in str(info.value)


def test_start_server_requires_the_child_to_own_the_port(
    failed_start: list[ServerStartError],
) -> None:
    """A probe answered by someone else's socket must not pass for our server being up."""
    with pytest.raises(ServerStartError, match="impostor did not become ready") as info:
        start_server(
            "impostor",
            lambda port: ["sleep", "30"],
            lambda port: True,  # fooled by anything: only the ownership check can refuse
            timeout_s=0.5,
            attempts=1,
        )
    failed_start.append(info.value)


def test_started_server_owns_its_port_and_stops_on_sigterm() -> None:
    server = start_server("listener", lambda port: _listener(port, "plain"), probe_http)
    try:
        assert owns_listening_port(server.pid, server.port) is True
        assert probe_http(server.port)
    finally:
        server.stop()
    assert server.process.returncode == -signal.SIGTERM
    assert not server.log_path.exists()


def test_stop_escalates_to_sigkill_when_sigterm_is_ignored() -> None:
    server = start_server(
        "stubborn",
        lambda port: _listener(port, "ignore-term"),
        probe_http,
    )
    server.stop(grace_s=0.3)
    assert server.process.returncode == -signal.SIGKILL
    assert not server.log_path.exists()


# --------------------------------------------------------------------------------------
# The real servers
# --------------------------------------------------------------------------------------


@pytest.mark.integration
async def test_s3_round_trip_and_conditional_put(s3_server: S3Endpoint) -> None:
    bucket = s3_server.create_bucket()
    session = aioboto3.Session()
    async with session.client(
        "s3",
        endpoint_url=s3_server.endpoint_url,
        region_name=s3_server.region,
        aws_access_key_id=s3_server.access_key_id,
        aws_secret_access_key=s3_server.secret_access_key,
    ) as s3:
        await s3.put_object(Bucket=bucket, Key="k", Body=b"first", IfNoneMatch="*")
        with pytest.raises(ClientError) as info:
            await s3.put_object(Bucket=bucket, Key="k", Body=b"second", IfNoneMatch="*")
        assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
        response = await s3.get_object(Bucket=bucket, Key="k")
        async with response["Body"] as body:
            assert await body.read() == b"first"


@pytest.mark.integration
async def test_redis_server_answers_and_persists_with_its_append_only_file(
    redis_server: str,
) -> None:
    assert redis_server.startswith(f"redis://{HOST}:") and redis_server.endswith("/0")
    client = aioredis.from_url(redis_server)
    try:
        key = f"icefloe-test-{uuid.uuid4().hex}"
        assert await client.set(key, b"v", nx=True)
        assert not await client.set(key, b"w", nx=True)
        assert await client.get(key) == b"v"
        assert await client.config_get("save") == {"save": ""}
        # A Redis catalog that loses its data loses its tables: the stack persists, as
        # production must (append-only file, fsynced every second, in the stack's directory).
        assert await client.config_get("appendonly") == {"appendonly": "yes"}
        assert await client.config_get("appendfsync") == {"appendfsync": "everysec"}
        assert (await client.config_get("dir"))["dir"].endswith("redis-data")
    finally:
        await client.aclose()


@pytest.mark.integration
async def test_dynalite_conditional_put(dynalite: str) -> None:
    table = f"icefloe-test-{uuid.uuid4().hex[:12]}"
    session = aioboto3.Session()
    async with session.client(
        "dynamodb",
        endpoint_url=dynalite,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    ) as ddb:
        await ddb.create_table(
            TableName=table,
            KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
        await ddb.get_waiter("table_exists").wait(
            TableName=table, WaiterConfig={"Delay": 1, "MaxAttempts": 30}
        )
        item = {"id": {"S": "t"}, "v": {"N": "1"}}
        await ddb.put_item(
            TableName=table, Item=item, ConditionExpression="attribute_not_exists(id)"
        )
        with pytest.raises(ClientError) as info:
            await ddb.put_item(
                TableName=table, Item=item, ConditionExpression="attribute_not_exists(id)"
            )
        assert info.value.response["Error"]["Code"] == "ConditionalCheckFailedException"


@pytest.mark.integration
async def test_kafka_broker_creates_topic_produces_and_consumes(kafka_broker: str) -> None:
    topic = f"icefloe-test-{uuid.uuid4().hex[:12]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_broker)
    await admin.start()
    try:
        response = await admin.create_topics(
            [NewTopic(topic, num_partitions=1, replication_factor=1)]
        )
        assert [error[1] for error in response.topic_errors] == [0]
    finally:
        await admin.close()

    producer = AIOKafkaProducer(bootstrap_servers=kafka_broker)
    await producer.start()
    try:
        sent = await producer.send_and_wait(topic, b"files-written", key=b"db.t")
    finally:
        await producer.stop()
    assert sent.offset == 0

    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=kafka_broker,
        group_id=f"icefloe-test-{uuid.uuid4().hex[:8]}",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    try:
        message = await consumer.getone()
        await consumer.commit()
    finally:
        await consumer.stop()
    assert (message.key, message.value, message.offset) == (b"db.t", b"files-written", 0)
