"""Keys as fixed-width numbers: what the key index sorts, searches and stores.

A key index holds millions of keys, so a key is never a Python object: each key tuple
becomes one or two 64-bit words, computed column-wise over Arrow buffers.

* A single integer-like key column (``int``, ``long``, ``date``, ``time``, the timestamps)
  is its exact value as ``int64``: no hash, no collision, and ``int`` promoted to ``long``
  keeps its value.
* Any other key is the MD5 digest of a canonical encoding of the key tuple, read as two
  little-endian ``uint64`` words. 128 bits make a false match (which would delete a row
  that was not asked for) as unlikely as a disk's undetected bit flip, and MD5 is stable
  forever, which a checkpoint written today and read next year needs (MD5 serves here as a
  well-mixed, fixed function, not as a defence against anyone: a writer who can choose
  keys can already delete rows).

The canonical encoding is type-aware, so values Iceberg considers equal encode equally and
different tuples never encode alike: integers and temporal values as 8 little-endian bytes,
a decimal as its 16-byte unscaled value at the *column's* scale, a uuid as its 16 bytes,
``fixed(L)`` as its L bytes, a boolean as one byte, and strings (UTF-8) and binaries as a
4-byte length followed by the bytes, so ``("a", "bc")`` and ``("ab", "c")`` differ. Every
input is first cast to the column's type, so a key given as ``decimal(10, 3)`` for a
``decimal(12, 2)`` column either rescales exactly or is refused.

Identifier fields are never null, float, double or nested in lists or maps (spec,
"Identifier Field IDs"); such keys are refused with an error naming the column.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Final

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from icefloe.arrow.schema import primitive_to_arrow
from icefloe.errors import ValidationError
from icefloe.spec.schema import Schema
from icefloe.spec.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    FixedType,
    IntegerType,
    LongType,
    PrimitiveType,
    StringType,
    TimestampNanoType,
    TimestampType,
    TimestamptzNanoType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

# Bumped whenever the encoding changes: checkpoints written under another version are ignored.
ENCODING_VERSION: Final = 1

_EXACT_TYPES: Final = (
    IntegerType,
    LongType,
    DateType,
    TimeType,
    TimestampType,
    TimestamptzType,
    TimestampNanoType,
    TimestamptzNanoType,
)
_VARIABLE_TYPES: Final = (StringType, BinaryType)
_FIXED_TYPES: Final = (UUIDType, DecimalType, FixedType, BooleanType)

Words = np.ndarray[Any, np.dtype[Any]]


@dataclass(frozen=True, slots=True)
class EncodedKeys:
    """Keys in row order: ``hi`` (``int64`` exact keys, or the first digest word as
    ``uint64``) and ``lo`` (the second digest word; ``None`` for exact keys)."""

    hi: Words
    lo: Words | None

    def __len__(self) -> int:
        return len(self.hi)


class KeyEncoding:
    """How the keys of one key schema become fixed-width words (see the module docstring)."""

    def __init__(self, key_schema: Schema) -> None:
        self.fields = key_schema.fields
        self.types: list[PrimitiveType] = []
        for field in self.fields:
            t = field.field_type
            if not isinstance(t, (*_EXACT_TYPES, *_VARIABLE_TYPES, *_FIXED_TYPES)):
                raise ValidationError(
                    f"identifier field {field.name!r} (id {field.field_id}) has type {t}, "
                    "which cannot be a key: identifier fields are primitive and not "
                    "float or double"
                )
            assert isinstance(t, PrimitiveType)
            self.types.append(t)
        self.arrow_types = [primitive_to_arrow(t) for t in self.types]
        self.exact = len(self.types) == 1 and isinstance(self.types[0], _EXACT_TYPES)

    @property
    def signature(self) -> str:
        """What a persisted run's words depend on: the encoding and the key columns' ids
        and types. A checkpoint made under another signature means nothing here."""
        columns = ",".join(
            f"{f.field_id}:{t}" for f, t in zip(self.fields, self.types, strict=True)
        )
        return f"{'exact' if self.exact else 'md5'}/{ENCODING_VERSION}/{columns}"

    def conform(self, keys: pa.Table) -> list[pa.Array]:
        """The key columns of ``keys`` (in key order) cast to the key types, nulls refused."""
        if keys.num_columns != len(self.fields):
            names = ", ".join(f.name for f in self.fields)
            raise ValidationError(
                f"keys have {keys.num_columns} columns ({', '.join(keys.column_names)}); "
                f"expected the {len(self.fields)} key columns ({names})"
            )
        out: list[pa.Array] = []
        for field, target, column in zip(self.fields, self.arrow_types, keys.columns, strict=True):
            if column.null_count:
                raise ValidationError(
                    f"key column {field.name!r} holds {column.null_count} null(s): "
                    "identifier fields are required"
                )
            array = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
            if isinstance(array.type, pa.ExtensionType) and not isinstance(
                target, pa.ExtensionType
            ):
                array = array.storage
            if array.type != target:
                try:
                    array = array.cast(target)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
                    raise ValidationError(
                        f"key column {field.name!r} of type {array.type} cannot be read as "
                        f"{self.types[len(out)]}: {e}"
                    ) from e
            out.append(array)
        return out

    def encode(self, keys: pa.Table) -> EncodedKeys:
        """The words of every row of ``keys`` (CPU-bound: call it off the event loop)."""
        columns = self.conform(keys)
        if self.exact:
            return EncodedKeys(_int64(columns[0]), None)
        parts = [p for t, c in zip(self.types, columns, strict=True) for p in _canonical(t, c)]
        if len(parts) == 1:
            blob = parts[0]
        else:
            blob = pc.binary_join_element_wise(*parts, pa.scalar(b"", pa.large_binary()))
        return _md5_words(blob)


def _int64(array: pa.Array) -> Words:
    if pa.types.is_date32(array.type):
        array = array.cast(pa.int32())
    return np.asarray(array.cast(pa.int64()).to_numpy(zero_copy_only=False), dtype=np.int64)


def _fixed_bytes(array: pa.Array, width: int) -> pa.Array:
    """A fixed-width array's values buffer as ``large_binary`` values of ``width`` bytes."""
    data = array.buffers()[1]
    assert data is not None
    view = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(width), len(array), [None, data], offset=array.offset
    )
    return view.cast(pa.large_binary())


def _canonical(t: PrimitiveType, array: pa.Array) -> list[pa.Array]:
    """The canonical encoding of one key column, as one or two binary parts per row."""
    n = len(array)
    if isinstance(t, _EXACT_TYPES):
        words = _int64(array).astype("<i8", copy=False)
        return [_fixed_bytes(pa.array(words.view(np.int64)), 8)]
    if isinstance(t, _VARIABLE_TYPES):
        values = array.cast(pa.large_binary())
        lengths = np.asarray(pc.binary_length(values).to_numpy(), dtype="<u4")
        prefix = pa.FixedSizeBinaryArray.from_buffers(
            pa.binary(4), n, [None, pa.py_buffer(lengths)]
        ).cast(pa.large_binary())
        return [prefix, values]
    if isinstance(t, BooleanType):
        return [_fixed_bytes(array.cast(pa.uint8()), 1)]
    if isinstance(t, UUIDType):
        storage = array.storage if isinstance(array, pa.ExtensionArray) else array
        return [storage.cast(pa.large_binary())]
    if isinstance(t, FixedType):
        return [array.cast(pa.large_binary())]
    assert isinstance(t, DecimalType)
    return [_fixed_bytes(array, 16)]


_local = threading.local()


def _duckdb() -> Any:
    """One DuckDB connection per thread (a connection is not safe to share between threads)."""
    connection = getattr(_local, "connection", None)
    if connection is None:
        connection = duckdb.connect()
        connection.execute("SET threads = 1")  # callers already run in worker threads
        _local.connection = connection
    return connection


def _md5_words(blob: pa.Array) -> EncodedKeys:
    """MD5 of each value, as (first, second) little-endian uint64 words of the digest.

    DuckDB's ``md5_number`` computes the digest vectorized; it hands the 16 digest bytes
    back as an Arrow ``decimal128`` buffer, read here as words without conversion."""
    if len(blob) == 0:
        return EncodedKeys(np.empty(0, np.uint64), np.empty(0, np.uint64))
    connection = _duckdb()
    connection.register("icefloe_keys", pa.table({"k": blob}))
    try:
        result = connection.execute("SELECT md5_number(k) AS h FROM icefloe_keys").to_arrow_table()
    finally:
        connection.unregister("icefloe_keys")
    digests = result.column(0).combine_chunks()
    if digests.type.byte_width != 16 or len(digests) != len(blob):
        raise ValidationError(f"unexpected MD5 result {digests.type} for {len(blob)} keys")
    buffer = digests.buffers()[1]
    assert buffer is not None
    words = np.frombuffer(buffer, dtype="<u8", count=2 * len(blob), offset=digests.offset * 16)
    return EncodedKeys(
        np.ascontiguousarray(words[0::2], dtype=np.uint64),
        np.ascontiguousarray(words[1::2], dtype=np.uint64),
    )


__all__ = ["ENCODING_VERSION", "EncodedKeys", "KeyEncoding"]
