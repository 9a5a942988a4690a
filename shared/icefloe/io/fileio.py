"""One async storage interface over the local file system and S3, addressed by URI.

Iceberg records every file by its full location (``s3://bucket/key``, ``file:///abs/path``
or a plain local path), so the rest of icefloe never joins paths or opens files itself: it
hands locations to a :class:`FileIO`. The one operation the commit protocol depends on is
:meth:`FileIO.write_once`, an atomic create-if-absent: on a local disk a fully written and
fsynced temporary file is hard-linked into place (a link never replaces an existing name),
on S3 the put carries ``If-None-Match: *``. Whoever loses the race gets
:class:`~icefloe.errors.AlreadyExistsError`, never a silently overwritten file.

Local operations run in worker threads so a slow disk never stalls the event loop that also
serves Kafka and HTTP traffic. Failures surface as :class:`~icefloe.errors.NotFoundError`
(the file or bucket does not exist) or :class:`~icefloe.errors.FileIOError`, each naming the
location; botocore and ``OSError`` details are chained, never leaked as the raised type.

Locations are used literally: percent escapes are not decoded, because Iceberg writers put
URL-escaped partition values into file names and those names must round-trip unchanged.

Why one module past 800 lines: one interface and its implementations (local, S3, routing by
scheme) keep one contract (``write_once``, the typed errors), which one test file checks on all.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import errno
import os
import posixpath
import re
import stat
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, Self, TypeVar

from botocore.exceptions import BotoCoreError, ClientError

from icefloe.errors import (
    AlreadyExistsError,
    FileIOError,
    IcefloeError,
    NotFoundError,
    ValidationError,
)

LOCAL_SCHEMES: Final = frozenset({"file"})
S3_SCHEMES: Final = frozenset({"s3", "s3a", "s3n"})
SUPPORTED_SCHEMES: Final = LOCAL_SCHEMES | S3_SCHEMES

# Property names shared with PyIceberg and Iceberg Java so one catalog configuration
# serves every engine. ``client.*`` are the cross-service fallbacks.
S3_ENDPOINT: Final = "s3.endpoint"
S3_REGION: Final = "s3.region"
S3_ACCESS_KEY_ID: Final = "s3.access-key-id"
S3_SECRET_ACCESS_KEY: Final = "s3.secret-access-key"
S3_SESSION_TOKEN: Final = "s3.session-token"
S3_PROFILE_NAME: Final = "s3.profile-name"
S3_PATH_STYLE_ACCESS: Final = "s3.path-style-access"
S3_FORCE_VIRTUAL_ADDRESSING: Final = "s3.force-virtual-addressing"
S3_ANONYMOUS: Final = "s3.anonymous"
S3_CONNECT_TIMEOUT: Final = "s3.connect-timeout"
S3_REQUEST_TIMEOUT: Final = "s3.request-timeout"
S3_MAX_CONNECTIONS: Final = "s3.max-connections"
S3_RETRY_NUM_RETRIES: Final = "s3.retry.num-retries"
CLIENT_REGION: Final = "client.region"
CLIENT_ACCESS_KEY_ID: Final = "client.access-key-id"
CLIENT_SECRET_ACCESS_KEY: Final = "client.secret-access-key"
CLIENT_SESSION_TOKEN: Final = "client.session-token"
CLIENT_PROFILE_NAME: Final = "client.profile-name"

_SCHEME_RE: Final = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")
# Temporary files written next to their target; list() hides them from readers.
_TMP_SUFFIX: Final = ".icefloe-tmp"
# Link failures that mean "this file system has no hard links", not "the target exists".
_NO_HARDLINK_ERRNOS: Final = frozenset(
    {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS, errno.EXDEV}
)
# S3 may answer 409 when two conditional writes to one key overlap; the loser must retry
# and will then see 412. A handful of short retries covers any realistic burst.
_CONDITIONAL_CONFLICT_RETRIES: Final = 8
_CONDITIONAL_CONFLICT_BACKOFF_S: Final = 0.05

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class FileInfo:
    """One file found by :meth:`FileIO.list`; ``path`` is in the same form as the prefix."""

    path: str
    size: int
    last_modified_ms: int


# --------------------------------------------------------------------------------------
# Locations
# --------------------------------------------------------------------------------------


def parse_location(uri: str) -> tuple[str, str | None, str]:
    """Split a location into ``(scheme, bucket_or_authority, path)``.

    Plain paths and ``file:`` URIs give ``("file", None, local_path)``; ``file:/abs`` (the
    Hadoop spelling) and ``file://localhost/abs`` are accepted too. Object-store URIs give
    the bucket and the key without its leading slash (``""`` for the bucket root). The
    scheme is lower-cased; everything else is kept byte for byte.
    """
    if not uri:
        raise ValidationError("empty location: expected a path or a URI such as s3://bucket/key")
    match = _SCHEME_RE.match(uri)
    if match is None:
        if uri[:5].lower() == "file:":
            rest = uri[5:]
            if not rest.startswith("/"):
                raise ValidationError(
                    f"{uri}: a file: location must be absolute (file:///abs/path)"
                )
            return "file", None, rest
        return "file", None, uri
    scheme = match.group(1).lower()
    rest = uri[match.end() :]
    authority, slash, path = rest.partition("/")
    if scheme in LOCAL_SCHEMES:
        if authority not in ("", "localhost"):
            raise ValidationError(
                f"{uri}: file URIs with a host ({authority!r}) are not supported; "
                "use file:///abs/path"
            )
        return "file", None, "/" + path if slash else "/"
    if not authority:
        raise ValidationError(f"{uri}: location has no bucket; expected {scheme}://bucket/key")
    return scheme, authority, path


def join_location(base: str, *parts: str) -> str:
    """Join path segments onto a location with ``/``, whatever its scheme.

    Empty segments are skipped and redundant slashes at the seams dropped, so
    ``join_location("s3://b/warehouse/", "db", "/t/")`` is ``"s3://b/warehouse/db/t"``.
    """
    result = base
    for part in parts:
        segment = part.strip("/")
        if not segment:
            continue
        result = result + segment if result.endswith("/") else f"{result}/{segment}"
    return result


def parent_location(location: str) -> str:
    """The directory (or key prefix) holding ``location``, in the same form, no trailing slash.

    The root of a bucket or of the file system is its own parent; a bare relative name's
    parent is ``"."``.
    """
    scheme, bucket, path = parse_location(location)
    if scheme not in LOCAL_SCHEMES:
        key = path.strip("/")
        root = f"{location[: location.index('://')]}://{bucket}"
        return f"{root}/{posixpath.dirname(key)}" if "/" in key else root
    # Whatever precedes the local path ("", "file:", "file://", "file://localhost").
    spelled = location[: len(location) - len(path)] if location.endswith(path) else ""
    trimmed = path.rstrip("/") or "/"
    parent = posixpath.dirname(trimmed) if trimmed != "/" else "/"
    return spelled + (parent or ".")


def to_file_uri(path: str) -> str:
    """A ``file:///`` URI for a local path, made absolute against the working directory."""
    scheme, _, local = parse_location(path)
    if scheme not in LOCAL_SCHEMES:
        raise ValidationError(f"{path}: not a local path")
    return "file://" + os.path.abspath(local)


# --------------------------------------------------------------------------------------
# Interface
# --------------------------------------------------------------------------------------


class FileIO(ABC):
    """Async access to files by location. Implementations are safe for concurrent use."""

    @abstractmethod
    async def read(self, path: str) -> bytes:
        """The whole file. Raises NotFoundError when it does not exist."""

    @abstractmethod
    async def read_range(self, path: str, start: int, length: int) -> bytes:
        """``length`` bytes from offset ``start``; fewer only where the file ends first."""

    @abstractmethod
    async def write(self, path: str, data: bytes) -> None:
        """Create or replace the file. Readers see the old or the new content, never a mix."""

    @abstractmethod
    async def write_once(self, path: str, data: bytes) -> None:
        """Create the file only if absent, atomically; AlreadyExistsError if it exists."""

    @abstractmethod
    async def delete(self, path: str) -> None:
        """Remove the file; a file that is already gone is not an error."""

    @abstractmethod
    async def exists(self, path: str) -> bool:
        """Whether a file (not a directory or bare prefix) exists at the location."""

    @abstractmethod
    async def size(self, path: str) -> int:
        """Length in bytes. Raises NotFoundError when the file does not exist."""

    @abstractmethod
    def list(self, prefix: str) -> AsyncIterator[FileInfo]:
        """Every file below the directory ``prefix``, recursively.

        The order is the store's: by path on a local disk and on AWS S3, but S3-compatible
        stores differ (SeaweedFS lists directory by directory), so callers must not rely
        on it.

        ``prefix`` names a directory: ``s3://b/data`` lists ``data/…`` but not
        ``data2/…``. A prefix with nothing below it yields nothing.
        """

    async def remove_empty_dirs(self, prefix: str) -> None:  # noqa: B027 - no folders
        """Remove the folders below (and at) ``prefix`` that hold no file.

        Object stores have no folders, so this does nothing there; on a local disk, folders
        left empty after deleting a table's files would otherwise read as namespaces (the
        rule of Java's HadoopCatalog).
        """

    async def make_dirs(self, prefix: str) -> None:  # noqa: B027 - no folders
        """Make the folder ``prefix`` (and its parents) exist.

        Object stores have no folders, so this does nothing there; on a local disk, engines
        that write their first file into a table's folder (DuckDB writes a staged table's
        first manifest into ``metadata/``) expect the folder to be there.
        """

    async def close(self) -> None:  # noqa: B027 - optional hook, most IOs hold nothing
        """Release clients and connections. The IO must not be used afterwards."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


def _check_range(path: str, start: int, length: int) -> None:
    if start < 0 or length < 0:
        raise ValidationError(
            f"{path}: invalid byte range start={start} length={length}; both must be >= 0"
        )


# --------------------------------------------------------------------------------------
# Local file system
# --------------------------------------------------------------------------------------


class _TargetExists(Exception):
    """Raised in worker threads; becomes AlreadyExistsError naming the caller's location."""


@contextlib.contextmanager
def _local_errors(location: str, action: str) -> Iterator[None]:
    """Translate OSError into icefloe errors naming the location the caller used."""
    try:
        yield
    except IcefloeError:
        raise
    except _TargetExists:
        raise AlreadyExistsError(f"{location}: file already exists") from None
    except FileNotFoundError as exc:
        raise NotFoundError(f"{location}: file does not exist (while trying to {action})") from exc
    except IsADirectoryError as exc:
        raise FileIOError(f"{location}: is a directory, expected a file") from exc
    except (NotADirectoryError, FileExistsError) as exc:
        # FileExistsError only comes from creating parent directories: one is a file.
        raise FileIOError(
            f"{location}: cannot {action}: a parent of this path is a file, not a directory"
        ) from exc
    except PermissionError as exc:
        raise FileIOError(f"{location}: permission denied while trying to {action}") from exc
    except OSError as exc:
        raise FileIOError(f"{location}: cannot {action}: {exc.strerror or exc}") from exc


def _fsync_directory(directory: str) -> None:
    """Make a new directory entry durable; a crash must not lose a committed metadata file."""
    try:
        fd = os.open(directory or ".", os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return  # Not supported here (e.g. some network file systems): nothing more to do.
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _temp_name(directory: str, name: str) -> str:
    # Stay well under NAME_MAX even for long target names.
    return os.path.join(directory, f".{name[:120]}.{uuid.uuid4().hex[:16]}{_TMP_SUFFIX}")


def _make_parents(directory: str) -> None:
    """Create missing directories and make their entries durable, outermost first."""
    missing: list[str] = []
    current = os.path.abspath(directory or ".")
    while not os.path.isdir(current):
        missing.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    if not missing:
        return
    os.makedirs(directory, exist_ok=True)
    for created in reversed(missing):
        _fsync_directory(os.path.dirname(created))


def _write_temp(directory: str, name: str, data: bytes) -> str:
    """Write ``data`` to a fresh fsynced temporary file next to the target; return its path."""
    _make_parents(directory)
    tmp = _temp_name(directory, name)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    try:
        _write_all(fd, data)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.close(fd)
    return tmp


def _local_write(path: str, data: bytes) -> None:
    directory, name = os.path.split(path)
    tmp = _write_temp(directory, name, data)
    try:
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_directory(directory)


def _local_write_exclusive(path: str, data: bytes) -> None:
    """Create-if-absent via a durable temp file hard-linked into place.

    ``link`` fails with EEXIST rather than replacing, and the target appears complete or not
    at all. Where hard links are unavailable, fall back to ``O_EXCL`` creation, which keeps
    the exclusivity but lets a reader observe the file while it is still being written.
    """
    directory, name = os.path.split(path)
    tmp = _write_temp(directory, name, data)
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise _TargetExists from None
    except OSError as exc:
        if exc.errno not in _NO_HARDLINK_ERRNOS:
            raise
        _local_create_exclusive(path, data)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    _fsync_directory(directory)


def _local_create_exclusive(path: str, data: bytes) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    except FileExistsError:
        raise _TargetExists from None
    try:
        _write_all(fd, data)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    os.close(fd)


def _local_read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _local_read_range(path: str, start: int, length: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(start)
        chunks: list[bytes] = []
        remaining = length
        while remaining > 0:
            chunk = f.read(remaining)
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)


def _local_delete(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _local_is_file(path: str) -> bool:
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return False


def _local_size(path: str) -> int:
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, "not a regular file", path)
    return st.st_size


def _local_remove_empty_dirs(directory: str) -> None:
    """Deepest first, so a folder whose sub-folders were all empty goes too."""
    for dirpath, _, _ in sorted(os.walk(directory), key=lambda w: -len(w[0])):
        with contextlib.suppress(OSError):  # not empty, or already gone
            os.rmdir(dirpath)


def _local_make_dirs(directory: str) -> None:
    os.makedirs(directory, exist_ok=True)


def _local_walk(directory: str) -> list[tuple[str, int, int]]:
    """(relative path with ``/`` separators, size, mtime ms) for every file below a dir."""
    found: list[tuple[str, int, int]] = []
    pending = [("", directory)]
    while pending:
        rel_dir, abs_dir = pending.pop()
        try:
            entries = list(os.scandir(abs_dir))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in entries:
            rel = f"{rel_dir}{entry.name}"
            if entry.is_dir(follow_symlinks=False):
                pending.append((rel + "/", entry.path))
            elif entry.name.endswith(_TMP_SUFFIX) and entry.name.startswith("."):
                continue
            else:
                try:
                    st = entry.stat()
                except FileNotFoundError:
                    continue  # removed while we were walking
                if stat.S_ISREG(st.st_mode):
                    found.append((rel, st.st_size, st.st_mtime_ns // 1_000_000))
    found.sort()
    return found


class LocalFileIO(FileIO):
    """Files on a local or mounted file system; accepts ``file:`` URIs and plain paths."""

    @staticmethod
    def _path(location: str) -> str:
        scheme, _, path = parse_location(location)
        if scheme not in LOCAL_SCHEMES:
            raise ValidationError(
                f"{location}: LocalFileIO only handles file: URIs and plain paths, not "
                f"{scheme}://; use load_file_io() or RoutingFileIO for mixed locations"
            )
        return path

    async def _run(self, location: str, action: str, func: Callable[..., _T], *args: Any) -> _T:
        path = self._path(location)
        with _local_errors(location, action):
            return await asyncio.to_thread(func, path, *args)

    async def read(self, path: str) -> bytes:
        return await self._run(path, "read", _local_read)

    async def read_range(self, path: str, start: int, length: int) -> bytes:
        _check_range(path, start, length)
        return await self._run(path, "read", _local_read_range, start, length)

    async def write(self, path: str, data: bytes) -> None:
        await self._run(path, "write", _local_write, bytes(data))

    async def write_once(self, path: str, data: bytes) -> None:
        await self._run(path, "create", _local_write_exclusive, bytes(data))

    async def delete(self, path: str) -> None:
        await self._run(path, "delete", _local_delete)

    async def exists(self, path: str) -> bool:
        return await self._run(path, "check", _local_is_file)

    async def size(self, path: str) -> int:
        return await self._run(path, "stat", _local_size)

    async def list(self, prefix: str) -> AsyncIterator[FileInfo]:
        files = await self._run(prefix, "list", _local_walk)
        base = prefix.rstrip("/")
        if not base or base.endswith(":"):
            base = prefix  # the root: "/" or "file:///" already ends in a separator
        sep = "" if base.endswith("/") else "/"
        for rel, size, mtime_ms in files:
            yield FileInfo(f"{base}{sep}{rel}", size, mtime_ms)

    async def remove_empty_dirs(self, prefix: str) -> None:
        await self._run(prefix, "remove empty folders", _local_remove_empty_dirs)

    async def make_dirs(self, prefix: str) -> None:
        await self._run(prefix, "make folders", _local_make_dirs)


# --------------------------------------------------------------------------------------
# S3
# --------------------------------------------------------------------------------------


def _client_error_code(exc: ClientError) -> tuple[str, int]:
    error = exc.response.get("Error", {})
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
    return str(error.get("Code", "")), int(status or 0)


def _s3_error(location: str, action: str, exc: Exception) -> IcefloeError:
    """Map a botocore failure to an icefloe error naming the location and what to check."""
    if isinstance(exc, ClientError):
        code, status = _client_error_code(exc)
        message = exc.response.get("Error", {}).get("Message", "")
        if code in _MISSING_KEY_CODES:
            return NotFoundError(f"{location}: object does not exist (while trying to {action})")
        if code == "NoSuchBucket":
            _, bucket, _ = parse_location(location)
            return NotFoundError(f"{location}: bucket {bucket!r} does not exist")
        if code in ("AccessDenied", "403", "Forbidden") or status == 403:
            return FileIOError(
                f"{location}: access denied while trying to {action}; check the credentials "
                "and the bucket policy (S3 also answers 403 for a missing object when "
                "s3:ListBucket is not granted)"
            )
        detail = f"{code} (HTTP {status})" + (f": {message}" if message else "")
        return FileIOError(f"{location}: cannot {action}: S3 error {detail}")
    return FileIOError(f"{location}: cannot {action}: {exc}")


# OSError covers aiohttp's connection errors and TimeoutError without importing aiohttp.
_S3_FAILURES: Final = (BotoCoreError, ClientError, OSError)
# HEAD answers a missing key with a bare 404, GET with NoSuchKey.
_MISSING_KEY_CODES: Final = frozenset({"NoSuchKey", "NotFound", "404"})


def _parse_bool(properties: Mapping[str, str], key: str) -> bool | None:
    raw = properties.get(key)
    if raw is None:
        return None
    value = raw.strip().lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise ValidationError(f"file IO property {key}={raw!r}: expected true or false")


def _parse_number(properties: Mapping[str, str], key: str) -> float | None:
    raw = properties.get(key)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ValidationError(f"file IO property {key}={raw!r}: expected a number") from None
    if value <= 0:
        raise ValidationError(f"file IO property {key}={raw!r}: must be positive")
    return value


class S3FileIO(FileIO):
    """Objects in S3 or an S3-compatible store, through one lazily opened aioboto3 client.

    Arguments left as ``None`` fall back to the standard AWS configuration chain
    (``AWS_ACCESS_KEY_ID``, ``AWS_REGION``, ``AWS_ENDPOINT_URL_S3``, profiles, instance
    roles), exactly as the AWS SDKs do.
    """

    def __init__(
        self,
        endpoint_url: str | None = None,
        region: str | None = None,
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        session_token: str | None = None,
        path_style: bool = False,
        *,
        profile_name: str | None = None,
        anonymous: bool = False,
        connect_timeout: float | None = None,
        read_timeout: float | None = None,
        max_connections: int = 32,
        max_attempts: int | None = None,
    ) -> None:
        self.endpoint_url = endpoint_url
        self.region = region
        self.path_style = path_style
        self._access_key_id = access_key_id
        self._secret_access_key = secret_access_key
        self._session_token = session_token
        self._profile_name = profile_name
        self._anonymous = anonymous
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._max_connections = max_connections
        self._max_attempts = max_attempts
        self._client: Any = None
        self._stack: AsyncExitStack | None = None
        self._lock = asyncio.Lock()
        self._closed = False

    @classmethod
    def from_properties(cls, properties: Mapping[str, str] | None = None) -> S3FileIO:
        """Build from catalog/table properties (``s3.*`` with ``client.*`` fallbacks)."""
        props = properties or {}

        def pick(*keys: str) -> str | None:
            for key in keys:
                if props.get(key):
                    return props[key]
            return None

        path_style = _parse_bool(props, S3_PATH_STYLE_ACCESS)
        force_virtual = _parse_bool(props, S3_FORCE_VIRTUAL_ADDRESSING)
        if path_style and force_virtual:
            raise ValidationError(
                f"file IO properties {S3_PATH_STYLE_ACCESS} and {S3_FORCE_VIRTUAL_ADDRESSING} "
                "are both true; choose one addressing style"
            )
        max_connections = _parse_number(props, S3_MAX_CONNECTIONS)
        retries = props.get(S3_RETRY_NUM_RETRIES)
        if retries is not None and not (retries.strip().isdigit()):
            raise ValidationError(
                f"file IO property {S3_RETRY_NUM_RETRIES}={retries!r}: expected an integer >= 0"
            )
        return cls(
            endpoint_url=pick(S3_ENDPOINT),
            region=pick(S3_REGION, CLIENT_REGION),
            access_key_id=pick(S3_ACCESS_KEY_ID, CLIENT_ACCESS_KEY_ID),
            secret_access_key=pick(S3_SECRET_ACCESS_KEY, CLIENT_SECRET_ACCESS_KEY),
            session_token=pick(S3_SESSION_TOKEN, CLIENT_SESSION_TOKEN),
            path_style=bool(path_style),
            profile_name=pick(S3_PROFILE_NAME, CLIENT_PROFILE_NAME),
            anonymous=bool(_parse_bool(props, S3_ANONYMOUS)),
            connect_timeout=_parse_number(props, S3_CONNECT_TIMEOUT),
            read_timeout=_parse_number(props, S3_REQUEST_TIMEOUT),
            max_connections=int(max_connections) if max_connections else 32,
            max_attempts=int(retries) + 1 if retries is not None else None,
        )

    async def _get_client(self) -> Any:
        if self._client is not None:
            return self._client
        async with self._lock:
            if self._closed:
                raise FileIOError("S3FileIO is closed; create a new one")
            if self._client is None:
                self._client = await self._open_client()
        return self._client

    async def _open_client(self) -> Any:
        # Imported here: aioboto3 is heavy and only deployments that touch S3 need it.
        import aioboto3
        from aiobotocore.config import AioConfig
        from botocore import UNSIGNED

        options: dict[str, Any] = {"max_pool_connections": self._max_connections}
        if self.path_style:
            options["s3"] = {"addressing_style": "path"}
        if self._connect_timeout is not None:
            options["connect_timeout"] = self._connect_timeout
        if self._read_timeout is not None:
            options["read_timeout"] = self._read_timeout
        if self._anonymous:
            options["signature_version"] = UNSIGNED
        if self._max_attempts is not None:
            options["retries"] = {"total_max_attempts": self._max_attempts, "mode": "standard"}
        stack = AsyncExitStack()
        try:
            session = aioboto3.Session(
                aws_access_key_id=self._access_key_id,
                aws_secret_access_key=self._secret_access_key,
                aws_session_token=self._session_token,
                region_name=self.region,
                profile_name=self._profile_name,
            )
            client = await stack.enter_async_context(
                session.client("s3", endpoint_url=self.endpoint_url, config=AioConfig(**options))
            )
        except _S3_FAILURES as exc:
            await stack.aclose()
            where = self.endpoint_url or "the default S3 endpoint"
            raise FileIOError(f"cannot open an S3 client for {where}: {exc}") from exc
        self._stack = stack
        return client

    async def close(self) -> None:
        async with self._lock:
            self._closed = True
            stack, self._stack, self._client = self._stack, None, None
        if stack is not None:
            await stack.aclose()

    @staticmethod
    def _bucket_key(location: str, *, allow_root: bool = False) -> tuple[str, str]:
        scheme, bucket, key = parse_location(location)
        if scheme not in S3_SCHEMES or bucket is None:
            raise ValidationError(
                f"{location}: S3FileIO only handles s3://bucket/key locations; "
                "use load_file_io() or RoutingFileIO for mixed locations"
            )
        if not key and not allow_root:
            raise ValidationError(f"{location}: location names a bucket, not an object")
        return bucket, key

    async def read(self, path: str) -> bytes:
        bucket, key = self._bucket_key(path)
        client = await self._get_client()
        try:
            response = await client.get_object(Bucket=bucket, Key=key)
            async with response["Body"] as body:
                data: bytes = await body.read()
        except _S3_FAILURES as exc:
            raise _s3_error(path, "read", exc) from exc
        return data

    async def read_range(self, path: str, start: int, length: int) -> bytes:
        _check_range(path, start, length)
        if length == 0:
            await self.size(path)  # still report a missing file
            return b""
        bucket, key = self._bucket_key(path)
        client = await self._get_client()
        try:
            response = await client.get_object(
                Bucket=bucket, Key=key, Range=f"bytes={start}-{start + length - 1}"
            )
            async with response["Body"] as body:
                data: bytes = await body.read()
        except ClientError as exc:
            code, status = _client_error_code(exc)
            if code == "InvalidRange" or status == 416:
                return b""  # the range starts at or past the end of the object
            raise _s3_error(path, "read", exc) from exc
        except _S3_FAILURES as exc:
            raise _s3_error(path, "read", exc) from exc
        return data

    async def write(self, path: str, data: bytes) -> None:
        bucket, key = self._bucket_key(path)
        client = await self._get_client()
        try:
            await client.put_object(Bucket=bucket, Key=key, Body=bytes(data))
        except _S3_FAILURES as exc:
            raise _s3_error(path, "write", exc) from exc

    async def write_once(self, path: str, data: bytes) -> None:
        bucket, key = self._bucket_key(path)
        payload = bytes(data)
        client = await self._get_client()
        for attempt in range(_CONDITIONAL_CONFLICT_RETRIES + 1):
            try:
                await client.put_object(Bucket=bucket, Key=key, Body=payload, IfNoneMatch="*")
                return
            except ClientError as exc:
                code, status = _client_error_code(exc)
                if code == "PreconditionFailed" or status == 412:
                    if await self._retried_put_landed(exc, path, payload):
                        return
                    raise AlreadyExistsError(f"{path}: object already exists") from exc
                conflict = code == "ConditionalRequestConflict" or status == 409
                if conflict and attempt < _CONDITIONAL_CONFLICT_RETRIES:
                    await asyncio.sleep(_CONDITIONAL_CONFLICT_BACKOFF_S * (2**attempt))
                    continue
                raise _s3_error(path, "create", exc) from exc
            except _S3_FAILURES as exc:
                raise _s3_error(path, "create", exc) from exc
        raise FileIOError(  # pragma: no cover - the loop always returns or raises
            f"{path}: conditional create kept conflicting with concurrent writers"
        )

    async def _retried_put_landed(self, exc: ClientError, path: str, payload: bytes) -> bool:
        """Whether a 412 answers a transport-level retry of our own successful put.

        botocore retries timeouts and 5xx on its own; if the first attempt was stored, the
        retry is refused with 412 although this writer created the object. Only when a retry
        happened, the stored bytes decide: identical content means the create took effect.
        """
        retries = exc.response.get("ResponseMetadata", {}).get("RetryAttempts", 0)
        if not retries:
            return False
        try:
            return await self.read(path) == payload
        except IcefloeError:
            return False

    async def delete(self, path: str) -> None:
        bucket, key = self._bucket_key(path)
        client = await self._get_client()
        try:
            await client.delete_object(Bucket=bucket, Key=key)
        except ClientError as exc:
            code, _ = _client_error_code(exc)
            if code in _MISSING_KEY_CODES:
                return
            raise _s3_error(path, "delete", exc) from exc
        except _S3_FAILURES as exc:
            raise _s3_error(path, "delete", exc) from exc

    async def _head(self, path: str, action: str) -> dict[str, Any] | None:
        bucket, key = self._bucket_key(path)
        client = await self._get_client()
        try:
            head: dict[str, Any] = await client.head_object(Bucket=bucket, Key=key)
        except ClientError as exc:
            code, status = _client_error_code(exc)
            if code != "NoSuchBucket" and (code in _MISSING_KEY_CODES or status == 404):
                return None
            raise _s3_error(path, action, exc) from exc
        except _S3_FAILURES as exc:
            raise _s3_error(path, action, exc) from exc
        return head

    async def exists(self, path: str) -> bool:
        return await self._head(path, "check") is not None

    async def size(self, path: str) -> int:
        head = await self._head(path, "stat")
        if head is None:
            raise NotFoundError(f"{path}: object does not exist")
        return int(head["ContentLength"])

    async def list(self, prefix: str) -> AsyncIterator[FileInfo]:
        bucket, key = self._bucket_key(prefix, allow_root=True)
        scheme = parse_location(prefix)[0]
        key_prefix = key.rstrip("/") + "/" if key.strip("/") else ""
        client = await self._get_client()
        paginator = client.get_paginator("list_objects_v2")
        try:
            async for page in paginator.paginate(Bucket=bucket, Prefix=key_prefix):
                for obj in page.get("Contents", ()):
                    modified = obj["LastModified"]
                    yield FileInfo(
                        f"{scheme}://{bucket}/{obj['Key']}",
                        int(obj["Size"]),
                        int(modified.timestamp() * 1000),
                    )
        except _S3_FAILURES as exc:
            raise _s3_error(prefix, "list", exc) from exc


# --------------------------------------------------------------------------------------
# Choosing an implementation
# --------------------------------------------------------------------------------------


def _scheme_of(location_or_scheme: str) -> str:
    lowered = location_or_scheme.lower()
    if lowered in SUPPORTED_SCHEMES:
        return lowered
    return parse_location(location_or_scheme)[0]


def _new_file_io(scheme: str, properties: Mapping[str, str], where: str) -> FileIO:
    if scheme in LOCAL_SCHEMES:
        return LocalFileIO()
    if scheme in S3_SCHEMES:
        return S3FileIO.from_properties(properties)
    raise ValidationError(
        f"{where}: no FileIO for scheme {scheme!r}; supported: {sorted(SUPPORTED_SCHEMES)}"
    )


def load_file_io(location_or_scheme: str, properties: Mapping[str, str] | None = None) -> FileIO:
    """The FileIO for a warehouse/table location or a bare scheme (``"s3"``, ``"file"``).

    The result serves only that scheme; use :class:`RoutingFileIO` when one table mixes
    storage systems.
    """
    scheme = _scheme_of(location_or_scheme)
    return _new_file_io(scheme, properties or {}, location_or_scheme)


class RoutingFileIO(FileIO):
    """Dispatches each location to a per-scheme FileIO, created on first use."""

    def __init__(self, properties: Mapping[str, str] | None = None) -> None:
        self._properties = dict(properties or {})
        self._ios: dict[str, FileIO] = {}

    def _io(self, location: str) -> FileIO:
        scheme = parse_location(location)[0]
        key = "s3" if scheme in S3_SCHEMES else scheme
        io = self._ios.get(key)
        if io is None:
            io = _new_file_io(scheme, self._properties, location)
            self._ios[key] = io
        return io

    async def read(self, path: str) -> bytes:
        return await self._io(path).read(path)

    async def read_range(self, path: str, start: int, length: int) -> bytes:
        return await self._io(path).read_range(path, start, length)

    async def write(self, path: str, data: bytes) -> None:
        await self._io(path).write(path, data)

    async def write_once(self, path: str, data: bytes) -> None:
        await self._io(path).write_once(path, data)

    async def delete(self, path: str) -> None:
        await self._io(path).delete(path)

    async def exists(self, path: str) -> bool:
        return await self._io(path).exists(path)

    async def size(self, path: str) -> int:
        return await self._io(path).size(path)

    async def list(self, prefix: str) -> AsyncIterator[FileInfo]:
        async for info in self._io(prefix).list(prefix):
            yield info

    async def remove_empty_dirs(self, prefix: str) -> None:
        await self._io(prefix).remove_empty_dirs(prefix)

    async def make_dirs(self, prefix: str) -> None:
        await self._io(prefix).make_dirs(prefix)

    async def close(self) -> None:
        ios, self._ios = builtins.list(self._ios.values()), {}
        for io in ios:
            await io.close()
