"""FileIO: one contract, checked against the local file system and a real S3 API (SeaweedFS).

The contract tests run once per backend; the S3 leg needs the ``s3_server`` server and is an
integration test. Backend-specific guarantees (temp files, fsync before link, error mapping,
the retried-put ambiguity of S3) are tested on their own below.
"""

from __future__ import annotations

import asyncio
import errno
import os
import re
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError
from hypothesis import given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples
from icefloe.errors import AlreadyExistsError, FileIOError, NotFoundError, ValidationError
from icefloe.io import fileio
from icefloe.io.fileio import (
    FileIO,
    LocalFileIO,
    RoutingFileIO,
    S3FileIO,
    join_location,
    load_file_io,
    parent_location,
    parse_location,
    to_file_uri,
)
from servers import S3Endpoint, free_port

# --------------------------------------------------------------------------------------
# Locations
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("location", "expected"),
    [
        ("s3://bucket/a/b.json", ("s3", "bucket", "a/b.json")),
        ("S3A://bucket/a", ("s3a", "bucket", "a")),
        ("s3n://bucket", ("s3n", "bucket", "")),
        ("s3://bucket/", ("s3", "bucket", "")),
        (
            "s3://b/p/ts_day=2017-11-16/x%20y.parquet",
            ("s3", "b", "p/ts_day=2017-11-16/x%20y.parquet"),
        ),
        ("s3://b/k?v=1#frag", ("s3", "b", "k?v=1#frag")),
        ("file:///tmp/wh/t", ("file", None, "/tmp/wh/t")),
        ("file://localhost/tmp/x", ("file", None, "/tmp/x")),
        ("file:/tmp/hadoop-style", ("file", None, "/tmp/hadoop-style")),
        ("FILE:///tmp/x", ("file", None, "/tmp/x")),
        ("/abs/path", ("file", None, "/abs/path")),
        ("relative/path", ("file", None, "relative/path")),
        ("a:b/c", ("file", None, "a:b/c")),
    ],
)
def test_parse_location(location: str, expected: tuple[str, str | None, str]) -> None:
    assert parse_location(location) == expected


@pytest.mark.parametrize(
    ("location", "fragment"),
    [
        ("", "empty location"),
        ("s3:///key", "no bucket"),
        ("s3://", "no bucket"),
        ("file://otherhost/x", "otherhost"),
        ("file:relative", "must be absolute"),
    ],
)
def test_parse_location_rejects_malformed(location: str, fragment: str) -> None:
    with pytest.raises(ValidationError, match=fragment):
        parse_location(location)


def test_join_location() -> None:
    assert join_location("s3://b/warehouse/", "db", "/t/") == "s3://b/warehouse/db/t"
    assert join_location("s3://b", "metadata", "v1.json") == "s3://b/metadata/v1.json"
    assert join_location("file:///", "tmp") == "file:///tmp"
    assert join_location("/", "tmp", "", "x") == "/tmp/x"
    assert join_location("rel", "x") == "rel/x"


@pytest.mark.parametrize(
    ("location", "parent"),
    [
        ("s3://b/a/c.json", "s3://b/a"),
        ("s3://b/a/c/", "s3://b/a"),
        ("s3://b/c.json", "s3://b"),
        ("s3://b", "s3://b"),
        ("file:///a/b", "file:///a"),
        ("file:///a", "file:///"),
        ("file:/a/b", "file:/a"),
        ("/a/b/", "/a"),
        ("/a", "/"),
        ("/", "/"),
        ("x", "."),
    ],
)
def test_parent_location(location: str, parent: str) -> None:
    assert parent_location(location) == parent


_segment = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="/"),
    min_size=1,
    max_size=12,
)


@settings(max_examples=examples(200))
@given(
    base=st.sampled_from(["s3://bucket", "s3://bucket/wh/", "file:///tmp", "/tmp/wh", "rel"]),
    segments=st.lists(_segment, min_size=1, max_size=5),
)
def test_join_then_split_round_trips(base: str, segments: list[str]) -> None:
    joined = join_location(base, *segments)
    scheme, _, path = parse_location(joined)
    assert scheme == parse_location(base)[0]
    assert path.endswith("/".join(segments))
    assert parent_location(joined) == join_location(base, *segments[:-1]).rstrip("/")
    assert join_location(parent_location(joined), segments[-1]) == joined


def test_to_file_uri(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert to_file_uri("x/y.json") == f"file://{tmp_path}/x/y.json"
    assert to_file_uri("file:///abs") == "file:///abs"
    with pytest.raises(ValidationError, match="not a local path"):
        to_file_uri("s3://b/k")


# --------------------------------------------------------------------------------------
# Choosing an implementation
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("location", "kind"),
    [
        ("s3", S3FileIO),
        ("s3://bucket/warehouse", S3FileIO),
        ("s3a://bucket/warehouse", S3FileIO),
        ("file", LocalFileIO),
        ("file:///tmp/warehouse", LocalFileIO),
        ("/tmp/warehouse", LocalFileIO),
    ],
)
def test_load_file_io_picks_by_scheme(location: str, kind: type[FileIO]) -> None:
    assert type(load_file_io(location)) is kind


def test_load_file_io_rejects_unknown_scheme() -> None:
    with pytest.raises(ValidationError, match=r"gs://b/wh: no FileIO for scheme 'gs'"):
        load_file_io("gs://b/wh")


def test_s3_properties_are_read_like_pyiceberg() -> None:
    io = S3FileIO.from_properties(
        {
            "s3.endpoint": "http://127.0.0.1:9000",
            "client.region": "eu-west-1",
            "s3.access-key-id": "AK",
            "client.secret-access-key": "SK",
            "s3.path-style-access": "TRUE",
            "s3.connect-timeout": "2.5",
            "s3.retry.num-retries": "2",
        }
    )
    assert io.endpoint_url == "http://127.0.0.1:9000"
    assert io.region == "eu-west-1"
    assert io.path_style is True
    assert io._access_key_id == "AK" and io._secret_access_key == "SK"
    assert io._connect_timeout == 2.5
    assert io._max_attempts == 3
    # s3.* wins over client.*
    assert S3FileIO.from_properties({"s3.region": "a", "client.region": "b"}).region == "a"


@pytest.mark.parametrize(
    ("properties", "fragment"),
    [
        ({"s3.path-style-access": "maybe"}, "s3.path-style-access='maybe'"),
        ({"s3.connect-timeout": "soon"}, "s3.connect-timeout='soon'"),
        ({"s3.request-timeout": "-1"}, "must be positive"),
        ({"s3.retry.num-retries": "x"}, "s3.retry.num-retries='x'"),
        (
            {"s3.path-style-access": "true", "s3.force-virtual-addressing": "true"},
            "choose one addressing style",
        ),
    ],
)
def test_s3_properties_are_validated(properties: dict[str, str], fragment: str) -> None:
    with pytest.raises(ValidationError, match=fragment.replace("(", r"\(")):
        S3FileIO.from_properties(properties)


# --------------------------------------------------------------------------------------
# The contract, for every backend
# --------------------------------------------------------------------------------------


class Backend:
    """A FileIO under test and a fresh, empty root location to work in."""

    def __init__(self, io: FileIO, root: str) -> None:
        self.io = io
        self.root = root

    def at(self, *parts: str) -> str:
        return join_location(self.root, *parts)


@pytest.fixture(
    params=[
        "local-uri",
        "local-plain",
        pytest.param("s3", marks=pytest.mark.integration),
        pytest.param("routing-s3", marks=pytest.mark.integration),
    ]
)
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    kind: str = request.param
    io: FileIO
    if kind == "local-uri":
        io, root = LocalFileIO(), to_file_uri(str(tmp_path / "root"))
    elif kind == "local-plain":
        io, root = LocalFileIO(), str(tmp_path / "root")
    else:
        s3: S3Endpoint = request.getfixturevalue("s3_server")
        bucket = s3.create_bucket()
        properties = s3.file_io_properties()
        io = RoutingFileIO(properties) if kind == "routing-s3" else load_file_io("s3", properties)
        root = f"s3://{bucket}/warehouse"
    async with io:
        yield Backend(io, root)


async def test_write_read_overwrite(backend: Backend) -> None:
    io, path = backend.io, backend.at("db", "t", "metadata", "v1.metadata.json")
    await io.write(path, b'{"format-version": 2}')
    assert await io.exists(path)
    assert await io.read(path) == b'{"format-version": 2}'
    assert await io.size(path) == 21
    await io.write(path, b"replaced")
    assert await io.read(path) == b"replaced"
    assert await io.size(path) == 8


async def test_empty_and_binary_and_large_files(backend: Backend) -> None:
    io = backend.io
    payloads = {
        "empty.bin": b"",
        "all-bytes.bin": bytes(range(256)) * 3,
        "large.bin": os.urandom(3 * 1024 * 1024 + 17),
    }
    for name, data in payloads.items():
        await io.write(backend.at(name), data)
    for name, data in payloads.items():
        assert await io.read(backend.at(name)) == data
        assert await io.size(backend.at(name)) == len(data)


async def test_literal_names_round_trip(backend: Backend) -> None:
    """URL-escaped partition values stay literal: "%20" is three characters, not a space."""
    name = backend.at("data", "ts_day=2017-11-16", "name=a%20b c", "00000-0-ü.parquet")
    await backend.io.write(name, b"x")
    assert await backend.io.read(name) == b"x"
    assert not await backend.io.exists(name.replace("%20", " "))
    assert [info.path async for info in backend.io.list(backend.at("data"))] == [name]


async def test_missing_files(backend: Backend) -> None:
    io, path = backend.io, backend.at("nope", "missing.avro")
    assert not await io.exists(path)
    with pytest.raises(NotFoundError, match=f"{re.escape(path)}: .*does not exist"):
        await io.read(path)
    with pytest.raises(NotFoundError, match=r"missing\.avro"):
        await io.read_range(path, 0, 4)
    with pytest.raises(NotFoundError, match=r"missing\.avro"):
        await io.read_range(path, 0, 0)
    with pytest.raises(NotFoundError, match=r"missing\.avro"):
        await io.size(path)
    await io.delete(path)  # missing is fine


async def test_delete(backend: Backend) -> None:
    io, path = backend.io, backend.at("snap-1.avro")
    await io.write(path, b"manifest list")
    await io.delete(path)
    assert not await io.exists(path)
    await io.delete(path)
    with pytest.raises(NotFoundError):
        await io.read(path)


async def test_read_range_matches_slicing(backend: Backend) -> None:
    io, path = backend.io, backend.at("data.parquet")
    data = bytes(range(200))
    await io.write(path, data)
    for start, length in [(0, 0), (0, 1), (0, 200), (10, 20), (190, 10), (195, 50), (199, 1),
                          (200, 5), (500, 3), (5, 0)]:  # fmt: skip
        assert await io.read_range(path, start, length) == data[start : start + length]


async def test_read_range_rejects_negative_bounds(backend: Backend) -> None:
    with pytest.raises(ValidationError, match="invalid byte range start=-1"):
        await backend.io.read_range(backend.at("x"), -1, 3)
    with pytest.raises(ValidationError, match="length=-3"):
        await backend.io.read_range(backend.at("x"), 0, -3)


async def test_write_once_creates_then_refuses(backend: Backend) -> None:
    io, path = backend.io, backend.at("metadata", "00001-abc.metadata.json")
    await io.write_once(path, b"first")
    with pytest.raises(AlreadyExistsError, match=f"{re.escape(path)}: .*already exists"):
        await io.write_once(path, b"second")
    assert await io.read(path) == b"first"
    await io.write(path, b"overwritten on purpose")  # plain write still replaces
    assert await io.read(path) == b"overwritten on purpose"


async def test_write_once_race_has_exactly_one_winner(backend: Backend) -> None:
    io, path = backend.io, backend.at("metadata", "00002-race.metadata.json")
    payloads = [f"writer-{i}".encode() * 1000 for i in range(16)]
    results = await asyncio.gather(
        *(io.write_once(path, payload) for payload in payloads), return_exceptions=True
    )
    winners = [i for i, result in enumerate(results) if result is None]
    losers = [result for result in results if result is not None]
    assert len(winners) == 1, results
    assert len(losers) == 15 and all(isinstance(r, AlreadyExistsError) for r in losers), results
    assert await io.read(path) == payloads[winners[0]]


async def test_list_is_recursive_and_bounded_by_the_directory(backend: Backend) -> None:
    io = backend.io
    files = {
        backend.at("t", "metadata", "v1.metadata.json"): b"1",
        backend.at("t", "data", "a=1", "f1.parquet"): b"22",
        backend.at("t", "data", "a=2", "deeper", "f2.parquet"): b"333",
        backend.at("t", "z.txt"): b"",
        backend.at("t2", "not-below-t.txt"): b"4444",
        backend.at("t.sibling"): b"55555",
    }
    for path, data in files.items():
        await io.write(path, data)
    below_t = sorted(p for p in files if p.startswith(backend.at("t") + "/"))

    # The order is the store's (S3-compatible stores differ), so compare as sorted lists.
    listed = sorted([info async for info in io.list(backend.at("t"))], key=lambda info: info.path)
    assert [info.path for info in listed] == below_t
    assert all(info.size == len(files[info.path]) for info in listed)
    assert all(info.last_modified_ms > 1_600_000_000_000 for info in listed)
    with_slash = [info async for info in io.list(backend.at("t") + "/")]
    assert sorted(with_slash, key=lambda info: info.path) == listed
    assert [info async for info in io.list(backend.at("does-not-exist"))] == []
    everything = [info.path async for info in io.list(backend.root)]
    assert sorted(everything) == sorted(files)


# --------------------------------------------------------------------------------------
# Local specifics
# --------------------------------------------------------------------------------------


def _entries(directory: Path) -> list[str]:
    return sorted(os.listdir(directory))


async def test_local_write_once_leaves_no_temporary_files(tmp_path: Path) -> None:
    io = LocalFileIO()
    target = tmp_path / "deep" / "er" / "v1.json"
    await io.write_once(str(target), b"v1")
    with pytest.raises(AlreadyExistsError):
        await io.write_once(str(target), b"v1 again")
    await io.write(str(target.parent / "other.json"), b"x")
    assert _entries(target.parent) == ["other.json", "v1.json"]


async def test_local_fsyncs_file_before_linking_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Durability: the content reaches the disk before the name becomes visible."""
    events: list[str] = []
    real_fsync, real_link = os.fsync, os.link

    def fsync(fd: int) -> None:
        kind = "dir" if os.path.isdir(f"/proc/self/fd/{fd}") else "file"
        events.append(f"fsync-{kind}")
        real_fsync(fd)

    def link(src: Any, dst: Any, **kwargs: Any) -> None:
        events.append("link")
        real_link(src, dst, **kwargs)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "link", link)
    await LocalFileIO().write_once(str(tmp_path / "m.json"), b"{}")
    assert events == ["fsync-file", "link", "fsync-dir"]
    events.clear()
    # New parent directories are made durable too (tmp_path gains "a", "a" gains "b").
    await LocalFileIO().write_once(str(tmp_path / "a" / "b" / "m.json"), b"{}")
    assert events == ["fsync-dir", "fsync-dir", "fsync-file", "link", "fsync-dir"]


async def test_local_write_once_without_hard_links(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_links(src: Any, dst: Any, **kwargs: Any) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    io, path = LocalFileIO(), str(tmp_path / "v1.json")
    await io.write_once(path, b"one")
    with pytest.raises(AlreadyExistsError):
        await io.write_once(path, b"two")
    assert await io.read(path) == b"one"
    assert _entries(tmp_path) == ["v1.json"]


async def test_local_io_runs_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[threading.Thread] = []
    real_read = fileio._local_read

    def spy(path: str) -> bytes:
        threads.append(threading.current_thread())
        return real_read(path)

    monkeypatch.setattr(fileio, "_local_read", spy)
    path = str(tmp_path / "f")
    await LocalFileIO().write(path, b"x")
    assert await LocalFileIO().read(path) == b"x"
    assert threads and threads[0] is not threading.current_thread()


async def test_local_list_hides_in_flight_temporary_files(tmp_path: Path) -> None:
    (tmp_path / ".v2.json.0123456789abcdef.icefloe-tmp").write_bytes(b"partial")
    (tmp_path / ".hidden-but-real").write_bytes(b"kept")
    listed = [info.path async for info in LocalFileIO().list(str(tmp_path))]
    assert listed == [f"{tmp_path}/.hidden-but-real"]


async def test_local_errors_name_the_location(tmp_path: Path) -> None:
    io = LocalFileIO()
    (tmp_path / "file").write_bytes(b"x")
    under_file = str(tmp_path / "file" / "child.json")
    parent_is_file = f"{re.escape(under_file)}: .*parent of this path is a file"
    with pytest.raises(FileIOError, match=parent_is_file):
        await io.write(under_file, b"y")
    with pytest.raises(FileIOError, match=parent_is_file):
        await io.write_once(under_file, b"y")
    with pytest.raises(FileIOError, match=f"{re.escape(str(tmp_path))}: is a directory"):
        await io.read(str(tmp_path))
    with pytest.raises(FileIOError, match="is a directory"):
        await io.size(str(tmp_path))
    assert not await io.exists(str(tmp_path))
    assert not await io.exists(under_file)


async def test_local_os_errors_become_file_io_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Injected: the suite runs as root in CI, where real permission checks never fail.
    def denied(path: str, data: bytes) -> None:
        raise PermissionError(errno.EACCES, "Permission denied", path)

    def disk_full(path: str, data: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", path)

    target = str(tmp_path / "x")
    monkeypatch.setattr(fileio, "_local_write", denied)
    with pytest.raises(FileIOError, match=f"{re.escape(target)}: permission denied .* write"):
        await LocalFileIO().write(target, b"x")
    monkeypatch.setattr(fileio, "_local_write", disk_full)
    with pytest.raises(FileIOError, match="cannot write: No space left on device") as info:
        await LocalFileIO().write(target, b"x")
    assert isinstance(info.value.__cause__, OSError)


async def test_local_refuses_other_schemes() -> None:
    with pytest.raises(ValidationError, match="LocalFileIO only handles file"):
        await LocalFileIO().read("s3://bucket/key")


@settings(max_examples=examples(60), deadline=None)
@given(
    data=st.binary(max_size=300),
    start=st.integers(min_value=0, max_value=350),
    length=st.integers(min_value=0, max_value=350),
)
def test_local_read_range_is_slicing(
    tmp_path_factory: pytest.TempPathFactory, data: bytes, start: int, length: int
) -> None:
    path = str(tmp_path_factory.mktemp("range") / "f")

    async def scenario() -> bytes:
        io = LocalFileIO()
        await io.write(path, data)
        return await io.read_range(path, start, length)

    assert asyncio.run(scenario()) == data[start : start + length]


# --------------------------------------------------------------------------------------
# S3 specifics
# --------------------------------------------------------------------------------------


@pytest.mark.integration
async def test_s3_missing_bucket_is_named(s3_server: S3Endpoint) -> None:
    async with S3FileIO.from_properties(s3_server.file_io_properties()) as io:
        with pytest.raises(NotFoundError, match="bucket 'no-such-bucket-x' does not exist"):
            await io.read("s3://no-such-bucket-x/k")
        # AWS answers a put into a missing bucket with NoSuchBucket; SeaweedFS with
        # AccessDenied. Either way the error names the bucket.
        with pytest.raises((NotFoundError, FileIOError), match="no-such-bucket-x"):
            await io.write("s3://no-such-bucket-x/k", b"x")
        with pytest.raises(NotFoundError, match="no-such-bucket-x"):
            _ = [info async for info in io.list("s3://no-such-bucket-x/")]


@pytest.mark.integration
async def test_s3_client_is_opened_once_and_closed(s3_server: S3Endpoint) -> None:
    bucket = s3_server.create_bucket()
    io = S3FileIO.from_properties(s3_server.file_io_properties())
    await asyncio.gather(*(io.write(f"s3://{bucket}/k{i}", b"x") for i in range(8)))
    client = io._client
    assert client is not None
    assert await io.read(f"s3://{bucket}/k0") == b"x"
    assert io._client is client
    await io.close()
    with pytest.raises(FileIOError, match="S3FileIO is closed"):
        await io.read(f"s3://{bucket}/k0")


@pytest.mark.integration
async def test_routing_file_io_serves_mixed_locations(
    s3_server: S3Endpoint, tmp_path: Path
) -> None:
    bucket = s3_server.create_bucket()
    local, remote = to_file_uri(str(tmp_path / "m.avro")), f"s3://{bucket}/m.avro"
    async with RoutingFileIO(s3_server.file_io_properties()) as io:
        await io.write(local, b"on disk")
        await io.write_once(remote, b"in s3")
        assert await io.read(local) == b"on disk"
        assert await io.read(remote) == b"in s3"
        assert (tmp_path / "m.avro").read_bytes() == b"on disk"
        assert [i.path async for i in io.list(f"s3a://{bucket}")] == [f"s3a://{bucket}/m.avro"]
        with pytest.raises(ValidationError, match="no FileIO for scheme 'gs'"):
            await io.read("gs://bucket/x")


async def test_s3_unreachable_endpoint_is_a_file_io_error() -> None:
    io = S3FileIO(
        endpoint_url=f"http://127.0.0.1:{free_port()}",
        region="us-east-1",
        access_key_id="k",
        secret_access_key="s",
        path_style=True,
        max_attempts=1,
    )
    async with io:
        with pytest.raises(FileIOError, match=r"s3://b/k: cannot read: .*127\.0\.0\.1"):
            await io.read("s3://b/k")
        with pytest.raises(FileIOError, match="s3://b/k: cannot create"):
            await io.write_once("s3://b/k", b"x")


async def test_s3_refuses_other_schemes_and_bucket_roots() -> None:
    io = S3FileIO(region="us-east-1")
    with pytest.raises(ValidationError, match="S3FileIO only handles s3://"):
        await io.read("/tmp/x")
    with pytest.raises(ValidationError, match="names a bucket, not an object"):
        await io.write("s3://bucket/", b"x")


class _FakeS3:
    """Scripted put/get answers, to reach S3 outcomes a real server cannot produce on demand."""

    def __init__(self, put_errors: list[ClientError], stored: bytes | None) -> None:
        self.put_errors = put_errors
        self.stored = stored
        self.puts = 0
        self.gets = 0

    async def put_object(self, **kwargs: Any) -> dict[str, Any]:
        self.puts += 1
        assert kwargs["IfNoneMatch"] == "*"
        if self.put_errors:
            raise self.put_errors.pop(0)
        return {}

    async def get_object(self, **kwargs: Any) -> dict[str, Any]:
        self.gets += 1
        assert self.stored is not None
        return {"Body": _Body(self.stored)}


class _Body:
    def __init__(self, data: bytes) -> None:
        self.data = data

    async def __aenter__(self) -> _Body:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def read(self) -> bytes:
        return self.data


def _client_error(status: int, code: str, retries: int = 0) -> ClientError:
    response: Any = {
        "Error": {"Code": code, "Message": code},
        "ResponseMetadata": {"HTTPStatusCode": status, "RetryAttempts": retries},
    }
    return ClientError(response, "PutObject")


def _io_with(fake: _FakeS3) -> S3FileIO:
    io = S3FileIO(region="us-east-1")
    io._client = fake
    return io


async def test_s3_write_once_retries_conflicts_then_reports_the_winner() -> None:
    fake = _FakeS3(
        [
            _client_error(409, "ConditionalRequestConflict"),
            _client_error(412, "PreconditionFailed"),
        ],
        stored=b"theirs",
    )
    with pytest.raises(AlreadyExistsError):
        await _io_with(fake).write_once("s3://b/v1.json", b"ours")
    assert (fake.puts, fake.gets) == (2, 0)


async def test_s3_write_once_succeeds_after_a_conflict() -> None:
    fake = _FakeS3([_client_error(409, "ConditionalRequestConflict")], stored=None)
    await _io_with(fake).write_once("s3://b/v1.json", b"ours")
    assert fake.puts == 2


async def test_s3_write_once_recognises_its_own_retried_put() -> None:
    """412 after a transport retry, with our bytes stored: our first attempt landed."""
    fake = _FakeS3([_client_error(412, "PreconditionFailed", retries=1)], stored=b"ours")
    await _io_with(fake).write_once("s3://b/v1.json", b"ours")
    assert fake.gets == 1


async def test_s3_write_once_retried_put_with_foreign_bytes_lost() -> None:
    fake = _FakeS3([_client_error(412, "PreconditionFailed", retries=2)], stored=b"theirs")
    with pytest.raises(AlreadyExistsError, match=r"s3://b/v1\.json"):
        await _io_with(fake).write_once("s3://b/v1.json", b"ours")


async def test_s3_other_client_errors_are_file_io_errors() -> None:
    fake = _FakeS3([_client_error(403, "AccessDenied")], stored=None)
    with pytest.raises(FileIOError, match="s3://b/k: access denied while trying to create"):
        await _io_with(fake).write_once("s3://b/k", b"x")
    fake = _FakeS3([_client_error(500, "InternalError")], stored=None)
    with pytest.raises(FileIOError, match=r"S3 error InternalError \(HTTP 500\)"):
        await _io_with(fake).write_once("s3://b/k", b"x")
