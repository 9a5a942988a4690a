"""An Avro container file's records as one Arrow table, decoded in native code.

Manifests are Avro, and decoding them dominates a cold scan plan. Two native readers turn a
container file into Arrow columns without a Python object per value:

* ``datafusion`` (the default): Apache DataFusion's Avro reader (Rust). About four times
  faster than DuckDB's on a 5,000-entry manifest (measured in ``make bench``'s ``planner
  decode`` and in the README): DuckDB's reader goes through a generic value per datum,
  ~6 µs per manifest entry whatever is projected.
* ``duckdb``: DuckDB's ``avro`` extension, loaded from the ``duckdb-extension-avro``
  wheel's file with DuckDB's automatic installing and loading of extensions switched off (a
  planner never downloads code at run time). It stays as the second reader: it needs none of
  the header rewrite below, and it is what the planner used before.

Both readers release the GIL while decoding, so worker threads decode manifests in parallel.

Neither reader is trusted to notice a damaged file (DataFusion returns the records of the
blocks it could read from a truncated file, without an error), so the container's blocks are
walked here first (counts, sizes and sync markers; no decoding) and the reader must return
exactly the records they hold. DataFusion cannot plan a record with no fields (an
unpartitioned manifest's ``partition``): such a field encodes as zero bytes, so it is removed
from the header's schema before reading, which leaves every other field's decoding unchanged.

Anything a reader cannot do raises :class:`ArrowDecodeUnavailable` with the reason; callers
fall back to the fastavro reference path, which names the defect of a malformed file
precisely.
"""

from __future__ import annotations

import atexit
import functools
import json
import logging
import os
import shutil
import tempfile
import threading
from importlib import resources
from pathlib import Path
from typing import Any

import pyarrow as pa

from icefloe.avro.codec import AVRO_MAGIC, SYNC_SIZE, read_header
from icefloe.errors import IcefloeError, InvalidFileError, ValidationError

log = logging.getLogger(__name__)

READERS = ("datafusion", "duckdb")
DEFAULT_READER = "datafusion"

# Records per Arrow batch from DataFusion: large enough that a manifest is one batch (Java
# writes up to ~8 MiB manifests, tens of thousands of entries), so nothing is concatenated.
_BATCH_ROWS = 1 << 17


class ArrowDecodeUnavailable(IcefloeError):
    """A native reader could not decode this file into the expected columns (the reason says
    why); the caller tries the next reader of :func:`reader_chain`, then fastavro."""


class ReaderUnavailable(ArrowDecodeUnavailable):
    """The reader's library is missing or fails to load on this machine (logged once, when
    first found; every later file skips the reader quietly)."""


def reader_chain(decoder: str) -> tuple[str, ...]:
    """The readers to try in turn for a decoder setting: DataFusion's, then DuckDB's (so a
    file or a machine DataFusion fails on still decodes natively); ``duckdb`` alone; and
    for ``verify``, the default's chain (:data:`DEFAULT_READER`)."""
    first = DEFAULT_READER if decoder == "verify" else decoder
    if first not in READERS:
        raise ValidationError(f"no Avro reader {first!r}: the readers are {list(READERS)}")
    return (first,) if first == "duckdb" else (first, "duckdb")


# ---------------------------------------------------------------------------------------------
# The container's blocks, checked without decoding
# ---------------------------------------------------------------------------------------------


def _varint(data: bytes, pos: int, location: str) -> tuple[int, int]:
    """A zig-zag varint (Avro ``long``) at ``pos``: its value and the position after it."""
    shift = 0
    raw = 0
    while True:
        if pos >= len(data):
            raise ArrowDecodeUnavailable(f"{location}: a block header is truncated")
        byte = data[pos]
        pos += 1
        raw |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (raw >> 1) ^ -(raw & 1), pos
        shift += 7
        if shift > 63:
            raise ArrowDecodeUnavailable(f"{location}: a block header has an overlong varint")


def record_count(data: bytes, start: int, location: str) -> int:
    """The records in the container's data blocks, from ``start`` (the end of the header).

    Each block is a record count, a byte size, the (compressed) records and the header's
    16-byte sync marker; a truncated block or a wrong marker raises
    :class:`ArrowDecodeUnavailable`.
    """
    sync = data[start - SYNC_SIZE : start]
    pos, total, end = start, 0, len(data)
    while pos < end:
        # A block's count usually fits one byte: read that inline, the rest by _varint.
        byte = data[pos]
        if byte < 0x80:
            count, pos = (byte >> 1) ^ -(byte & 1), pos + 1
        else:
            count, pos = _varint(data, pos, location)
        size, pos = _varint(data, pos, location)
        if count < 0 or size < 0:
            raise ArrowDecodeUnavailable(f"{location}: a block has a negative count or size")
        pos += size
        if data[pos : pos + SYNC_SIZE] != sync:
            raise ArrowDecodeUnavailable(
                f"{location}: a block at byte {pos} is truncated or lacks its sync marker"
            )
        pos += SYNC_SIZE
        total += count
    return total


# ---------------------------------------------------------------------------------------------
# Header rewrite for DataFusion
# ---------------------------------------------------------------------------------------------


def _zigzag(n: int) -> bytes:
    raw = (n << 1) ^ (n >> 63)
    out = bytearray()
    while raw & ~0x7F:
        out.append((raw & 0x7F) | 0x80)
        raw >>= 7
    out.append(raw)
    return bytes(out)


def _is_empty_record(t: Any) -> bool:
    return isinstance(t, dict) and t.get("type") == "record" and not t.get("fields")


def _without_empty_records(t: Any, location: str) -> Any:
    """The Avro schema ``t`` with every field whose type is a record of no fields removed.

    Such a field's values take zero bytes, so the rest decodes the same without it. An empty
    record anywhere else (in a union, an array) is left to the fastavro path.
    """
    if isinstance(t, list):
        if any(_is_empty_record(b) for b in t):
            raise ArrowDecodeUnavailable(f"{location}: a union holds a record with no fields")
        return [_without_empty_records(b, location) for b in t]
    if not isinstance(t, dict):
        return t
    kind = t.get("type")
    if kind == "record":
        fields = []
        for f in t.get("fields", []):
            if _is_empty_record(f.get("type")):
                continue
            fields.append({**f, "type": _without_empty_records(f.get("type"), location)})
        return {**t, "fields": fields}
    if kind == "array":
        if _is_empty_record(t.get("items")):
            raise ArrowDecodeUnavailable(f"{location}: an array holds records with no fields")
        return {**t, "items": _without_empty_records(t.get("items"), location)}
    if kind == "map":
        if _is_empty_record(t.get("values")):
            raise ArrowDecodeUnavailable(f"{location}: a map holds records with no fields")
        return {**t, "values": _without_empty_records(t.get("values"), location)}
    if isinstance(kind, dict | list):
        return {**t, "type": _without_empty_records(kind, location)}
    return t


@functools.lru_cache(maxsize=64)
def _stripped_schema(text: str) -> str | None:
    """A schema text rid of empty records, or None if it has none (once per distinct text:
    a table's manifests share theirs). Raises :class:`ArrowDecodeUnavailable` naming no
    file (the caller adds it)."""
    try:
        schema = json.loads(text)
    except ValueError as e:
        raise ArrowDecodeUnavailable(f"the Avro schema is unusable: {e}") from e
    stripped = _without_empty_records(schema, "the file")
    if stripped == schema:
        return None
    if _is_empty_record(schema):
        raise ArrowDecodeUnavailable("the file's records have no fields")
    return json.dumps(stripped)


def _for_datafusion(data: bytes, meta: dict[str, str], end: int, location: str) -> bytes:
    """The file with its schema rid of empty records (the same bytes if it has none)."""
    if "avro.schema" not in meta:
        raise ArrowDecodeUnavailable(f"{location}: the Avro schema is unusable: no avro.schema")
    try:
        stripped = _stripped_schema(meta["avro.schema"])
    except ArrowDecodeUnavailable as e:
        raise ArrowDecodeUnavailable(f"{location}: {e}") from e
    if stripped is None:
        return data
    items = {**meta, "avro.schema": stripped}
    header = bytearray(AVRO_MAGIC)
    header += _zigzag(len(items))
    for key, value in items.items():
        k, v = key.encode("utf-8"), value.encode("utf-8")
        header += _zigzag(len(k)) + k + _zigzag(len(v)) + v
    header += b"\x00"
    return bytes(header) + data[end - SYNC_SIZE :]


# ---------------------------------------------------------------------------------------------
# The readers
# ---------------------------------------------------------------------------------------------

_local = threading.local()
_lock = threading.Lock()
_unavailable: dict[str, str] = {}
_duckdb: Any = None
_scratch_dir: str | None = None


def _scratch() -> str:
    """Where file bytes are put for a reader to open: RAM-backed /dev/shm if present."""
    global _scratch_dir
    with _lock:
        if _scratch_dir is None:
            shm = Path("/dev/shm")
            base = str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None
            _scratch_dir = tempfile.mkdtemp(prefix="icefloe-manifests-", dir=base)
            atexit.register(shutil.rmtree, _scratch_dir, True)
        return _scratch_dir


def _remember_unavailable(reader: str, e: BaseException) -> ReaderUnavailable:
    reason = f"the {reader} Avro reader is unavailable: {type(e).__name__}: {e}"
    with _lock:
        first = reader not in _unavailable
        _unavailable[reader] = reason
    if first:
        log.warning("%s", reason)
    return ReaderUnavailable(reason)


def _datafusion_context() -> Any:
    """This thread's DataFusion session (one partition per file: the planner decodes
    several manifests at once in its own threads)."""
    ctx = getattr(_local, "datafusion", None)
    if ctx is not None:
        return ctx
    if "datafusion" in _unavailable:
        raise ReaderUnavailable(_unavailable["datafusion"])
    try:
        import datafusion

        # One scan of all columns has nothing for the logical optimizer to do, and an Avro
        # file has no statistics to collect: both only add to the fixed cost per file.
        config = (
            datafusion.SessionConfig()
            .with_target_partitions(1)
            .with_batch_size(_BATCH_ROWS)
            .with_repartition_file_scans(False)
            .set("datafusion.optimizer.max_passes", "0")
            .set("datafusion.execution.collect_statistics", "false")
        )
        ctx = datafusion.SessionContext(config)
    except Exception as e:  # ImportError and the library's own errors
        raise _remember_unavailable("datafusion", e) from e
    _local.datafusion = ctx
    return ctx


def extension_path() -> Path:
    """The ``avro.duckdb_extension`` file shipped in the ``duckdb-extension-avro`` wheel."""
    root = resources.files("duckdb_extension_avro")
    found = sorted(Path(str(root)).glob("extensions/*/avro.duckdb_extension"))
    if not found:
        raise ArrowDecodeUnavailable("the duckdb-extension-avro package has no extension file")
    return found[-1]


def _duckdb_cursor() -> Any:
    """This thread's cursor on one in-memory DuckDB database per process with the Avro
    extension loaded (loading takes a few hundred milliseconds, so it is done once; DuckDB
    connections are not thread-safe, cursors of one database share its extensions)."""
    global _duckdb
    cursor = getattr(_local, "duckdb", None)
    if cursor is not None:
        return cursor
    if "duckdb" in _unavailable:
        raise ReaderUnavailable(_unavailable["duckdb"])
    with _lock:
        if _duckdb is None:
            try:
                import duckdb

                db = duckdb.connect(
                    config={
                        "autoinstall_known_extensions": False,
                        "autoload_known_extensions": False,
                        "threads": 1,
                        "memory_limit": "1GB",
                    }
                )
                db.execute(f"LOAD '{_sql_string(str(extension_path()))}'")
            except Exception as e:  # ImportError, duckdb.Error, a missing extension file
                reason = f"the duckdb Avro reader is unavailable: {type(e).__name__}: {e}"
                _unavailable["duckdb"] = reason
                log.warning("%s", reason)
                raise ReaderUnavailable(reason) from e
            _duckdb = db
        cursor = _local.duckdb = _duckdb.cursor()
    return cursor


def _sql_string(text: str) -> str:
    return text.replace("'", "''")


# The Arrow schema DataFusion infers for a file, by the text of the file's Avro schema: a
# table's manifests share a few texts, and giving DataFusion the schema spares it reading and
# converting the file's header a second time (a sixth of its fixed cost per file, which is
# about two milliseconds). Inference is a function of the Avro schema alone.
_datafusion_schemas: dict[str, pa.Schema] = {}
_DATAFUSION_SCHEMAS = 64


def _read_datafusion(path: str, avro_schema: str) -> Any:
    ctx = _datafusion_context()
    schema = _datafusion_schemas.get(avro_schema)
    if schema is not None:
        return ctx.read_avro(path, schema=schema).to_arrow_table()
    frame = ctx.read_avro(path)
    if len(_datafusion_schemas) >= _DATAFUSION_SCHEMAS:
        _datafusion_schemas.clear()
    _datafusion_schemas[avro_schema] = frame.schema()
    return frame.to_arrow_table()


def _read_file(reader: str, path: str, avro_schema: str) -> Any:
    if reader == "datafusion":
        return _read_datafusion(path, avro_schema)
    return (
        _duckdb_cursor().execute(f"SELECT * FROM read_avro('{_sql_string(path)}')").to_arrow_table()
    )


def read_avro_table(
    data: bytes,
    location: str,
    reader: str = DEFAULT_READER,
    *,
    header: tuple[dict[str, str], int] | None = None,
) -> pa.Table:
    """An Avro container file's records as an Arrow table, decoded by ``reader``.

    ``header`` is the file's :func:`~icefloe.avro.codec.read_header` if the caller has read
    it already. Raises :class:`ArrowDecodeUnavailable` if the reader is missing, fails, or
    returns another number of records than the file's blocks hold.
    """
    if reader not in READERS:
        raise ArrowDecodeUnavailable(f"no Avro reader {reader!r} (readers: {list(READERS)})")
    if header is None:
        try:
            header = read_header(data, location)
        except InvalidFileError as e:
            raise ArrowDecodeUnavailable(str(e)) from e
    meta, end = header
    expected = record_count(data, end, location)
    if reader == "datafusion":
        data = _for_datafusion(data, meta, end, location)
    fd, path = tempfile.mkstemp(suffix=".avro", dir=_scratch())
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        try:
            table = _read_file(reader, path, meta.get("avro.schema", ""))
        except ArrowDecodeUnavailable:
            raise
        except Exception as e:  # the readers' own error types
            raise ArrowDecodeUnavailable(
                f"{reader} cannot read {location}: {type(e).__name__}: {e}"
            ) from e
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
    if not isinstance(table, pa.Table):
        raise ArrowDecodeUnavailable(f"{reader} returned {type(table).__name__} for {location}")
    if table.num_rows != expected:
        raise ArrowDecodeUnavailable(
            f"{reader} read {table.num_rows} records of {location}, whose blocks hold {expected}"
        )
    return table


__all__ = [
    "DEFAULT_READER",
    "READERS",
    "ArrowDecodeUnavailable",
    "ReaderUnavailable",
    "extension_path",
    "read_avro_table",
    "reader_chain",
    "record_count",
]
