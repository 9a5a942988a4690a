"""The local stack: real servers come up, are usable through what the stack exports, and
never outlive their owner, however the owner ends (clean exit, exception, cancellation,
SIGINT, SIGTERM, SIGHUP, SIGKILL).

Process deaths are observed through pidfds opened while the server is known to be alive,
so a recycled PID can never pass for a server that is still running.
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import aioboto3
import pytest
import redis.asyncio as aioredis
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from hypothesis import given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples
from icefloe.catalog.uri import load_catalog
from icefloe.coordinator.config import CoordinatorConfig
from icefloe.dev.local_stack import (
    REDIS_SERVER_ENV,
    TANSU_ENV,
    LocalStack,
    format_exports,
    owns_listening_port,
    probe_redis,
)
from icefloe.errors import IcefloeError, ServerStartError
from icefloe.io.fileio import S3FileIO
from icefloe.planner.config import PlannerConfig
from icefloe.spec.schema import Schema
from icefloe.spec.types import LongType, NestedField, StringType

# A SIGKILLed owner's servers die by the kernel's parent-death signal, which the test can
# only observe after the fact; this bounds the wait so a regression fails instead of hangs.
ORPHAN_HANG_GUARD_S = 60.0


def _pidfd(pid: int) -> int:
    return os.pidfd_open(pid)


def _has_exited(pidfd: int, wait_s: float = 0.0) -> bool:
    """Whether the process behind ``pidfd`` has terminated (waiting up to ``wait_s``)."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(int(wait_s * 1000)))


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out.extend(int(child) for child in (task / "children").read_text().split())
    return out


def _parse_exports(text: str) -> dict[str, str]:
    env: dict[str, str] = {}
    for line in text.splitlines():
        keyword, assignment = shlex.split(line)
        assert keyword == "export"
        name, _, value = assignment.partition("=")
        env[name] = value
    return env


SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "name", StringType()),
)


# --------------------------------------------------------------------------------------
# All four servers
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def full_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    workdir = tmp_path_factory.mktemp("full-stack")
    with LocalStack(kafka=True, redis=True, dynamodb=True, s3=True, workdir=workdir) as stack:
        yield stack


@pytest.mark.integration
async def test_each_server_answers_its_own_protocol(full_stack: LocalStack) -> None:
    topic = f"icefloe-test-{uuid.uuid4().hex[:12]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=full_stack.kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])
        assert topic in await admin.list_topics()
    finally:
        await admin.close()

    client = aioredis.from_url(full_stack.redis_url)
    try:
        assert await client.ping()
    finally:
        await client.aclose()

    session = aioboto3.Session()
    async with session.client(
        "dynamodb",
        endpoint_url=full_stack.dynamodb_endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    ) as ddb:
        assert "TableNames" in await ddb.list_tables()

    bucket = full_stack.create_bucket()
    io = S3FileIO.from_properties(full_stack.s3_properties())
    try:
        location = f"s3://{bucket}/probe/object.bin"
        await io.write(location, b"through the stack's FileIO properties")
        assert await io.read(location) == b"through the stack's FileIO properties"
    finally:
        await io.close()


@pytest.mark.integration
def test_servers_own_their_ports_and_log_into_the_workdir(full_stack: LocalStack) -> None:
    assert set(full_stack.servers) == {"kafka", "redis", "dynamodb", "s3"}
    for server in full_stack.servers.values():
        assert server.running
        assert owns_listening_port(server.pid, server.port) is True
        assert server.log_path == full_stack.workdir / f"{server.name}-{server.port}.log"
    assert full_stack.servers["s3"].name == "seaweedfs"  # a real object store, not moto
    assert full_stack.kafka_bootstrap == f"127.0.0.1:{full_stack.servers['kafka'].port}"
    assert full_stack.redis_url == f"redis://127.0.0.1:{full_stack.servers['redis'].port}/0"
    assert full_stack.s3_endpoint == f"http://127.0.0.1:{full_stack.servers['s3'].port}"
    assert full_stack.s3_properties()["s3.path-style-access"] == "true"


@pytest.mark.integration
def test_environment_is_what_the_services_read(
    full_stack: LocalStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = full_stack.environment()
    assert env["ICEFLOE_REDIS_URL"] == full_stack.redis_url
    assert env["ICEFLOE_DYNAMODB_ENDPOINT"] == full_stack.dynamodb_endpoint
    assert env["ICEFLOE_S3_ENDPOINT"] == full_stack.s3_endpoint
    assert env["ICEFLOE_WAREHOUSE"] == "s3://icefloe-warehouse/warehouse"
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    coordinator = CoordinatorConfig.load()
    planner = PlannerConfig.load()
    assert coordinator.brokers == planner.brokers == full_stack.kafka_bootstrap
    assert coordinator.catalog == planner.catalog == full_stack.catalog_uri()
    # Asking twice finds the warehouse bucket already there.
    assert full_stack.environment() == env


# --------------------------------------------------------------------------------------
# The catalog URI, for each choice of pointer store and warehouse
# --------------------------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize(
    ("servers", "scheme", "warehouse_prefix"),
    [
        ({"redis": True, "s3": True}, "redis", "s3://icefloe-warehouse/"),
        ({"redis": True}, "redis", "file://"),
        ({"dynamodb": True, "s3": True}, "dynamodb", "s3://icefloe-warehouse/"),
        ({"s3": True}, "s3", "s3://icefloe-warehouse/"),
        ({}, "file", "file://"),
    ],
)
async def test_catalog_uri_opens_a_working_catalog(
    servers: dict[str, bool], scheme: str, warehouse_prefix: str
) -> None:
    async with LocalStack(**servers) as stack:
        uri = await asyncio.to_thread(stack.catalog_uri)
        assert urlsplit(uri).scheme == scheme
        catalog = load_catalog(uri)
        try:
            await catalog.create_namespace("demo")
            created = await catalog.create_table("demo.trips", SCHEMA)
        finally:
            await catalog.close()
        reopened = load_catalog(uri)
        try:
            loaded = await reopened.load_table("demo.trips")
        finally:
            await reopened.close()
        assert loaded.metadata_location == created.metadata_location
        assert loaded.metadata_location.startswith(warehouse_prefix)
        assert loaded.metadata.schema().find_field("name").field_id == 2


# --------------------------------------------------------------------------------------
# Lifecycle and failures
# --------------------------------------------------------------------------------------


@pytest.mark.integration
def test_stop_ends_every_server_and_removes_a_temporary_workdir() -> None:
    stack = LocalStack(redis=True)
    with pytest.raises(IcefloeError, match="not running"):
        _ = stack.redis_url
    with stack:
        workdir = stack.workdir
        server = stack.servers["redis"]
        pidfd = _pidfd(server.pid)
        assert server.log_path.parent == workdir
        with pytest.raises(IcefloeError, match="kafka=True"):
            _ = stack.kafka_bootstrap
    try:
        assert _has_exited(pidfd)
    finally:
        os.close(pidfd)
    assert server.process.returncode is not None
    assert not workdir.exists()
    with pytest.raises(IcefloeError, match="not running"):
        _ = stack.redis_url
    with pytest.raises(IcefloeError, match="create a new one"):
        stack.start()


@pytest.mark.integration
def test_exception_in_the_block_still_stops_the_servers(tmp_path: Path) -> None:
    with pytest.raises(ZeroDivisionError), LocalStack(redis=True, workdir=tmp_path) as stack:
        server = stack.servers["redis"]
        pidfd = _pidfd(server.pid)
        _ = 1 / 0
    try:
        assert _has_exited(pidfd)
    finally:
        os.close(pidfd)
    assert server.log_path.exists(), "a caller-given workdir keeps its logs"


def _executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.mark.integration
def test_failed_start_reports_the_log_tail_and_stops_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = _executable(tmp_path / "broken-redis", "#!/bin/sh\necho no redis today >&2\nexit 4\n")
    monkeypatch.setenv(REDIS_SERVER_ENV, str(broken))
    workdir = tmp_path / "stack"
    stack = LocalStack(kafka=True, redis=True, workdir=workdir)
    with pytest.raises(ServerStartError) as info:
        stack.start()
    message = str(info.value)
    assert "redis failed to start 3 times" in message
    assert "exited with code 4" in message
    assert "no redis today" in message
    assert len(info.value.log_paths) == 3
    assert all(path.parent == workdir and path.exists() for path in info.value.log_paths)
    names = sorted(p.name for p in stack.processes)
    assert names == ["redis", "redis", "redis", "tansu"]
    assert all(p.process.returncode is not None for p in stack.processes)
    with pytest.raises(IcefloeError, match="not running"):
        _ = stack.kafka_bootstrap


def test_a_missing_program_fails_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TANSU_ENV, str(tmp_path / "no-such-tansu"))
    stack = LocalStack(kafka=True, redis=True)
    with pytest.raises(ServerStartError, match=f"{TANSU_ENV}=.*no-such-tansu"):
        stack.start()
    assert stack.processes == []


@pytest.mark.integration
async def test_cancelled_start_leaves_no_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pid_file = tmp_path / "pid"
    never_ready = _executable(
        tmp_path / "never-ready", f"#!/bin/sh\necho $$ > {pid_file}\nexec sleep 600\n"
    )
    monkeypatch.setenv(REDIS_SERVER_ENV, str(never_ready))
    stack = LocalStack(redis=True, workdir=tmp_path / "stack")
    task = asyncio.create_task(stack.astart())
    while not (pid_file.exists() and pid_file.read_text().endswith("\n")):
        assert not task.done(), f"start-up ended early: {task.exception()!r}"
        await asyncio.sleep(0.01)
    pidfd = _pidfd(int(pid_file.read_text()))
    try:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert _has_exited(pidfd)
    finally:
        os.close(pidfd)


# --------------------------------------------------------------------------------------
# No orphans when the owner is interrupted
# --------------------------------------------------------------------------------------

_OWNER = """
import asyncio, json, sys, time
from icefloe.dev.local_stack import LocalStack

def report(stack):
    pids = [p.pid for p in stack.processes]
    print(json.dumps({"pids": pids, "workdir": str(stack.workdir)}), flush=True)

if sys.argv[1] == "sync":
    with LocalStack(redis=True, dynamodb=True) as stack:
        report(stack)
        while True:
            time.sleep(3600)
else:
    async def main():
        async with LocalStack(redis=True, dynamodb=True) as stack:
            report(stack)
            await asyncio.Event().wait()
    asyncio.run(main())
"""


@pytest.mark.integration
@pytest.mark.parametrize(
    ("mode", "signum"),
    [
        ("sync", signal.SIGINT),
        ("sync", signal.SIGTERM),
        ("sync", signal.SIGHUP),
        ("sync", signal.SIGKILL),
        ("async", signal.SIGINT),
        ("async", signal.SIGTERM),
        ("async", signal.SIGKILL),
    ],
    ids=lambda v: v.name if isinstance(v, signal.Signals) else v,
)
def test_interrupted_owner_leaves_no_server_behind(mode: str, signum: signal.Signals) -> None:
    owner = subprocess.Popen(
        [sys.executable, "-c", _OWNER, mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a terminal's Ctrl-C would reach only the owner, too
    )
    pidfds: list[int] = []
    workdir: Path | None = None
    try:
        assert owner.stdout is not None and owner.stderr is not None
        line = owner.stdout.readline()
        assert line, f"the owner failed to start its stack:\n{owner.stderr.read()}"
        report = json.loads(line)
        workdir = Path(report["workdir"])
        assert len(report["pids"]) == 2
        assert sorted(_children(owner.pid)) == sorted(report["pids"])
        pidfds = [_pidfd(pid) for pid in report["pids"]]
        owner.send_signal(signum)
        _, stderr = owner.communicate()
        if signum == signal.SIGKILL:
            assert all(_has_exited(fd, ORPHAN_HANG_GUARD_S) for fd in pidfds), "orphaned server"
        else:
            # The owner stopped its servers before it ended: they are gone already.
            assert all(_has_exited(fd) for fd in pidfds), stderr
            assert not workdir.exists(), "the temporary workdir outlived its stack"
        if signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGKILL):
            assert owner.returncode == -signum, "the owner must still die of the signal"
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
        for fd in pidfds:
            os.close(fd)
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)


_FORKER = """
import json, os, signal, sys
from icefloe.dev.local_stack import LocalStack, probe_redis

with LocalStack(redis=True) as stack:
    child = os.fork()
    if child == 0:
        sys.exit(0)  # unwinds through the with block and runs atexit, in the child
    os.waitpid(child, 0)
    child = os.fork()
    if child == 0:
        os.kill(os.getpid(), signal.SIGTERM)  # the inherited handler, in the child
    _, status = os.waitpid(child, 0)
    server = stack.servers["redis"]
    print(json.dumps({
        "running": server.running,
        "answers": probe_redis(server.port),
        "workdir": stack.workdir.exists(),
        "child_signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
    }), flush=True)
"""


@pytest.mark.integration
def test_a_forked_child_leaves_its_parents_servers_alone() -> None:
    result = subprocess.run(
        [sys.executable, "-c", _FORKER], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {
        "running": True,
        "answers": True,
        "workdir": True,
        "child_signal": signal.SIGTERM,
    }


# --------------------------------------------------------------------------------------
# python -m icefloe.dev.local_stack
# --------------------------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
def test_cli_exports_endpoints_and_runs_until_signalled(
    tmp_path: Path, signum: signal.Signals
) -> None:
    env_file = tmp_path / "stack.env"
    cli = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "icefloe.dev.local_stack",
            "--redis",
            "--env-file",
            str(env_file),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    pidfds: list[int] = []
    try:
        assert cli.stdout is not None and cli.stderr is not None
        lines: list[str] = []
        while not lines or not lines[-1].startswith("export ICEFLOE_PLANNER_CATALOG="):
            line = cli.stdout.readline()
            assert line, f"local-stack ended early:\n{cli.stderr.read()}"
            lines.append(line)
        exported = _parse_exports("".join(lines))
        assert env_file.read_text() == "".join(lines)
        assert set(exported) == {
            "ICEFLOE_REDIS_URL",
            "ICEFLOE_WAREHOUSE",
            "ICEFLOE_CATALOG",
            "ICEFLOE_PLANNER_CATALOG",
        }
        port = urlsplit(exported["ICEFLOE_REDIS_URL"]).port
        assert port is not None and probe_redis(port)
        (redis_pid,) = _children(cli.pid)
        assert owns_listening_port(redis_pid, port) is True
        pidfds.append(_pidfd(redis_pid))

        # What it printed is enough for the rest of the CLI to find the catalog.
        shell_env = {**os.environ, **exported}
        for command in (["namespace", "create", "demo"], ["namespace", "list"]):
            run = subprocess.run(
                [sys.executable, "-m", "icefloe.cli", *command],
                env=shell_env,
                capture_output=True,
                text=True,
            )
            assert run.returncode == 0, run.stderr
        assert run.stdout.split() == ["demo"]

        cli.send_signal(signum)
        _, stderr = cli.communicate()
        assert cli.returncode == 0, stderr
        assert "stopping" in stderr
        assert _has_exited(pidfds[0])
        assert not env_file.exists()
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
        for fd in pidfds:
            os.close(fd)


_SHELL_SAFE_TEXT = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40
)


@settings(max_examples=examples(40), deadline=None)
@given(st.dictionaries(st.from_regex(r"ICEFLOE_[A-Z_]{1,12}", fullmatch=True), _SHELL_SAFE_TEXT))
def test_exports_survive_a_shell_round_trip(env: dict[str, str]) -> None:
    script = format_exports(env) + 'for n in "$@"; do printf "%s\\0" "${!n}"; done\n'
    names = list(env)
    out = subprocess.run(
        ["bash", "-c", script, "bash", *names], capture_output=True, check=True
    ).stdout
    values = out.decode("utf-8", errors="surrogateescape").split("\0")[:-1] if names else []
    assert dict(zip(names, values)) == env


@pytest.mark.integration
def test_s3_starts_open_even_with_aws_credentials_in_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`weed mini` would turn on authentication on seeing AWS credentials (which another
    stack's environment exports) and then refuse the anonymous readiness probe."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "someone")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "something")
    with LocalStack(s3=True) as stack:
        bucket = stack.s3.create_bucket()
        stack.s3.boto3_client().put_object(Bucket=bucket, Key="k", Body=b"x")
        body = stack.s3.boto3_client().get_object(Bucket=bucket, Key="k")["Body"].read()
        assert body == b"x"
