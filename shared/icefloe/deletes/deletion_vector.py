"""Deletion vectors (v3): deleted row positions of one data file, as a Puffin blob.

Spec: "Deletion Vectors" (table spec) and the ``deletion-vector-v1`` blob (Puffin spec).

Positions are 64-bit, split into a 32-bit *key* (high half) and a 32-bit sub-position (low
half); each key has a 32-bit Roaring bitmap of its sub-positions. The vector is serialized
in the 64-bit Roaring "portable" format:

* the number of keys (buckets), 8 bytes little endian;
* per key, ascending: the key, 4 bytes little endian, then that key's 32-bit bitmap in the
  portable Roaring serialization (what CRoaring, Java's RoaringBitmap and pyroaring write).

The blob wraps it::

    length (4 bytes, big endian)  = len(magic) + len(vector)
    magic  D1 D3 39 64
    vector
    CRC-32 of magic + vector (4 bytes, big endian)

The blob is never compressed, its ``fields`` are ``[2147483645]`` (the ``_pos`` column),
its snapshot id and sequence number are -1 (inherited from the manifest), and its properties
carry ``referenced-data-file`` and ``cardinality``.

This module is pure apart from :func:`read_deletion_vector` / :func:`write_deletion_vectors`
(which take a FileIO), so compaction and the writers can build, merge and drop vectors
without an engine.
"""

from __future__ import annotations

import struct
import uuid
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from pyroaring import BitMap

from icefloe.deletes.index import is_deletion_vector
from icefloe.deletes.puffin import PendingBlob, read_footer, write_puffin
from icefloe.errors import InvalidFileError, ValidationError
from icefloe.spec.datafile import DataFile, DataFileContent, FileFormat

BLOB_TYPE = "deletion-vector-v1"
MAGIC = b"\xd1\xd3\x39\x64"
# Reserved field id of the ``_pos`` metadata column: the field a DV blob is "about".
POS_FIELD_ID = 2147483645
# Reserved field ids of the ``file_path`` and ``pos`` columns of position delete files.
DELETE_FILE_PATH_ID = 2147483546
DELETE_POS_ID = 2147483545
REFERENCED_DATA_FILE = "referenced-data-file"
CARDINALITY = "cardinality"
# As in Java's RoaringPositionBitmap: keys are non-negative ints below Integer.MAX_VALUE.
MAX_KEY = 0x7FFFFFFE
MAX_POSITION = (MAX_KEY << 32) | 0xFFFFFFFF

_U32_LE = struct.Struct("<I")
_U64_LE = struct.Struct("<Q")
_U32_BE = struct.Struct(">I")
_U16_LE = struct.Struct("<H")
# Portable Roaring cookies (format spec of RoaringBitmap).
_SERIAL_COOKIE_NO_RUNCONTAINER = 12346
_SERIAL_COOKIE = 12347
_NO_OFFSET_THRESHOLD = 4
_ARRAY_MAX = 4096


class DeletionVector:
    """A set of deleted row positions, kept as one 32-bit Roaring bitmap per high key."""

    __slots__ = ("_buckets",)

    def __init__(self, buckets: Mapping[int, BitMap] | None = None) -> None:
        self._buckets: dict[int, BitMap] = {k: b for k, b in (buckets or {}).items() if b}

    @classmethod
    def from_positions(cls, positions: Iterable[int]) -> DeletionVector:
        """A vector of ``positions``; each must be in ``[0, MAX_POSITION]``."""
        arr = np.fromiter((int(p) for p in positions), dtype=np.int64)
        return cls.from_array(arr)

    @classmethod
    def from_array(cls, positions: np.ndarray[Any, Any]) -> DeletionVector:
        """A vector from an integer numpy array of positions (vectorized)."""
        arr = np.asarray(positions)
        if arr.size == 0:
            return cls()
        if arr.dtype.kind not in "iu":
            raise ValidationError(f"row positions must be integers, got {arr.dtype}")
        if arr.dtype.kind == "i" and int(arr.min()) < 0:
            raise ValidationError(f"row position {int(arr.min())} is negative")
        top = int(arr.max())
        if top > MAX_POSITION:
            raise ValidationError(
                f"row position {top} exceeds the largest a deletion vector holds ({MAX_POSITION})"
            )
        if top <= 0xFFFFFFFF:
            # One bucket (every file under 4G rows): no split by high key, whose np.unique
            # costs far more than the bitmap for the few positions an upsert deletes per file.
            return cls({0: BitMap(arr.astype(np.uint32))})
        u = arr.astype(np.uint64)
        keys = (u >> np.uint64(32)).astype(np.uint32)
        low = (u & np.uint64(0xFFFFFFFF)).astype(np.uint32)
        buckets: dict[int, BitMap] = {}
        for key in np.unique(keys).tolist():
            buckets[int(key)] = BitMap(low[keys == key])
        return cls(buckets)

    def __len__(self) -> int:
        return sum(len(b) for b in self._buckets.values())

    @property
    def cardinality(self) -> int:
        return len(self)

    def __contains__(self, position: object) -> bool:
        if not isinstance(position, int) or position < 0:
            return False
        b = self._buckets.get(position >> 32)
        return b is not None and (position & 0xFFFFFFFF) in b

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DeletionVector) and self._buckets == other._buckets

    def __hash__(self) -> int:  # mutable-free value semantics are not needed: identity hash
        return id(self)

    def __repr__(self) -> str:
        return f"DeletionVector(cardinality={len(self)})"

    def __iter__(self) -> Iterator[int]:
        """Positions in ascending order."""
        for key in sorted(self._buckets):
            high = key << 32
            for low in self._buckets[key]:
                yield high | low

    def last(self) -> int | None:
        """The largest position, or None when empty (a bound check without
        materializing every position)."""
        if not self._buckets:
            return None
        key = max(self._buckets)
        return (key << 32) | self._buckets[key].max()

    def to_numpy(self) -> np.ndarray[Any, np.dtype[np.int64]]:
        """Positions in ascending order as an int64 array (vectorized readers)."""
        parts = [
            np.asarray(self._buckets[k].to_array(), dtype=np.int64) + (k << 32)
            for k in sorted(self._buckets)
        ]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def union(self, other: DeletionVector) -> DeletionVector:
        """A new vector with the positions of both (merging a new DV with an old one)."""
        buckets = {k: b.copy() for k, b in self._buckets.items()}
        for k, b in other._buckets.items():
            if k in buckets:
                buckets[k] |= b
            else:
                buckets[k] = b.copy()
        return DeletionVector(buckets)

    def deleted_mask(self, num_rows: int, offset: int = 0) -> np.ndarray[Any, np.dtype[np.bool_]]:
        """Boolean array, True where row ``offset + i`` (i < num_rows) is deleted."""
        mask = np.zeros(num_rows, dtype=np.bool_)
        end = offset + num_rows
        for key, b in self._buckets.items():
            high = key << 32
            if high >= end or high + 0xFFFFFFFF < offset:
                continue
            lows = np.asarray(b.to_array(), dtype=np.int64) + high
            lows = lows[(lows >= offset) & (lows < end)]
            mask[lows - offset] = True
        return mask

    # -- serialization ------------------------------------------------------------------

    def serialize(self) -> bytes:
        """The 64-bit Roaring portable serialization (keys ascending, run-optimized)."""
        out = bytearray(_U64_LE.pack(len(self._buckets)))
        for key in sorted(self._buckets):
            b = self._buckets[key].copy()
            b.run_optimize()
            out += _U32_LE.pack(key)
            out += b.serialize()
        return bytes(out)

    @classmethod
    def deserialize(cls, data: bytes, location: str = "<deletion vector>") -> DeletionVector:
        """Parse the 64-bit portable format; every malformation is an InvalidFileError."""
        if len(data) < 8:
            raise InvalidFileError(location, "deletion vector bitmap is shorter than its header")
        (count,) = _U64_LE.unpack_from(data, 0)
        pos = 8
        buckets: dict[int, BitMap] = {}
        last = -1
        for _ in range(count):
            if pos + 4 > len(data):
                raise InvalidFileError(location, "deletion vector bitmap is truncated")
            (key,) = _U32_LE.unpack_from(data, pos)
            pos += 4
            if key <= last:
                raise InvalidFileError(location, "deletion vector keys are not ascending")
            if key > MAX_KEY:
                raise InvalidFileError(location, f"deletion vector key {key} is out of range")
            end = _portable_end(data, pos, location)
            try:
                buckets[key] = BitMap.deserialize(data[pos:end])
            except (ValueError, MemoryError) as e:
                raise InvalidFileError(location, f"invalid Roaring bitmap: {e}") from None
            pos = end
            last = key
        if pos != len(data):
            raise InvalidFileError(
                location, f"deletion vector bitmap has {len(data) - pos} trailing bytes"
            )
        return cls(buckets)

    def to_blob(self) -> bytes:
        """The ``deletion-vector-v1`` blob: length, magic, vector, CRC-32 (big endian)."""
        body = MAGIC + self.serialize()
        return _U32_BE.pack(len(body)) + body + _U32_BE.pack(zlib.crc32(body))

    @classmethod
    def from_blob(cls, blob: bytes, location: str = "<deletion vector>") -> DeletionVector:
        """Parse a ``deletion-vector-v1`` blob, checking its length, magic and CRC."""
        if len(blob) < 12:
            raise InvalidFileError(location, f"deletion vector blob of {len(blob)} bytes")
        (length,) = _U32_BE.unpack_from(blob, 0)
        if length != len(blob) - 8:
            raise InvalidFileError(
                location,
                f"deletion vector blob says {length} bytes of magic and vector, "
                f"has {len(blob) - 8}",
            )
        body = blob[4:-4]
        if body[:4] != MAGIC:
            raise InvalidFileError(
                location, f"deletion vector magic is {body[:4].hex()}, expected d1d33964"
            )
        (crc,) = _U32_BE.unpack_from(blob, len(blob) - 4)
        if zlib.crc32(body) != crc:
            raise InvalidFileError(location, "deletion vector CRC-32 does not match its content")
        return cls.deserialize(body[4:], location)


def _portable_end(data: bytes, start: int, location: str) -> int:
    """Where the portable 32-bit Roaring bitmap starting at ``start`` ends."""

    def need(n: int) -> None:
        if pos + n > len(data):
            raise InvalidFileError(location, "Roaring bitmap is truncated")

    pos = start
    need(4)
    (cookie,) = _U32_LE.unpack_from(data, pos)
    pos += 4
    run_flags = b""
    if cookie & 0xFFFF == _SERIAL_COOKIE:
        n = (cookie >> 16) + 1
        need((n + 7) // 8)
        run_flags = data[pos : pos + (n + 7) // 8]
        pos += (n + 7) // 8
    elif cookie == _SERIAL_COOKIE_NO_RUNCONTAINER:
        need(4)
        (n,) = _U32_LE.unpack_from(data, pos)
        pos += 4
    else:
        raise InvalidFileError(location, f"not a portable Roaring bitmap (cookie {cookie:#x})")
    need(4 * n)
    cards = [_U16_LE.unpack_from(data, pos + 4 * i + 2)[0] + 1 for i in range(n)]
    pos += 4 * n
    if not run_flags or n >= _NO_OFFSET_THRESHOLD:
        need(4 * n)
        pos += 4 * n  # offsets
    for i, card in enumerate(cards):
        if run_flags and run_flags[i // 8] & (1 << (i % 8)):
            need(2)
            (runs,) = _U16_LE.unpack_from(data, pos)
            pos += 2 + 4 * runs
        elif card <= _ARRAY_MAX:
            pos += 2 * card
        else:
            pos += 8192
        need(0)
    return pos


# -- DV files --------------------------------------------------------------------------------


def dv_from_puffin(data: bytes, delete_file: DataFile) -> DeletionVector:
    """The vector a DV manifest entry points at, from the bytes of its whole Puffin file."""
    return deletion_vector_from_blob(_blob_of(data, delete_file, whole_file=True), delete_file)


def _blob_of(data: bytes, f: DataFile, whole_file: bool) -> bytes:
    if f.content_offset is None or f.content_size_in_bytes is None:
        raise InvalidFileError(
            f.file_path, "deletion vector entry has no content_offset/content_size_in_bytes"
        )
    if not whole_file:
        return data
    end = f.content_offset + f.content_size_in_bytes
    if f.content_offset < 4 or end > len(data):
        raise InvalidFileError(
            f.file_path,
            f"deletion vector at {f.content_offset}+{f.content_size_in_bytes} lies outside the "
            f"file of {len(data)} bytes",
        )
    return data[f.content_offset : end]


def deletion_vector_from_blob(blob: bytes, f: DataFile) -> DeletionVector:
    """Parse the blob of DV entry ``f``; its cardinality must equal ``f.record_count``."""
    where = f"{f.file_path}@{f.content_offset}"
    dv = DeletionVector.from_blob(blob, where)
    if len(dv) != f.record_count:
        raise InvalidFileError(
            where,
            f"deletion vector holds {len(dv)} positions, its manifest entry says "
            f"{f.record_count} (record_count must be the cardinality)",
        )
    return dv


async def read_deletion_vector(io: Any, delete_file: DataFile) -> DeletionVector:
    """Read the one blob ``delete_file`` points at (a ranged read) and check it."""
    f = delete_file
    if not is_deletion_vector(f):
        raise ValidationError(f"{f.file_path} is not a deletion vector")
    if f.content_offset is None or f.content_size_in_bytes is None:
        raise InvalidFileError(
            f.file_path, "deletion vector entry has no content_offset/content_size_in_bytes"
        )
    blob: bytes = await io.read_range(f.file_path, f.content_offset, f.content_size_in_bytes)
    if len(blob) != f.content_size_in_bytes:
        raise InvalidFileError(
            f.file_path,
            f"deletion vector at {f.content_offset}+{f.content_size_in_bytes} lies outside "
            "the file",
        )
    return deletion_vector_from_blob(blob, f)


@dataclass(frozen=True, slots=True)
class DeletionVectorFile:
    """The bytes of one Puffin file of DVs and the manifest entries describing them."""

    location: str
    data: bytes
    entries: list[DataFile]


def build_deletion_vector_file(
    location: str, vectors: Sequence[tuple[DataFile, DeletionVector]]
) -> DeletionVectorFile:
    """One Puffin file holding a DV per data file, with the DV manifest entries.

    Each entry takes its data file's spec and partition (the spec's scope rule) and
    ``referenced_data_file``; ``record_count`` is the cardinality. Empty vectors are left
    out: a DV deletes at least one row.
    """
    seen: set[str] = set()
    kept: list[tuple[DataFile, DeletionVector]] = []
    for data_file, dv in vectors:
        if data_file.content != DataFileContent.DATA:
            raise ValidationError(f"{data_file.file_path}: a DV must reference a data file")
        if data_file.file_path in seen:
            raise ValidationError(
                f"two deletion vectors for {data_file.file_path} in one file: merge them first"
            )
        seen.add(data_file.file_path)
        if len(dv):
            kept.append((data_file, dv))
    blobs = [
        PendingBlob(
            type=BLOB_TYPE,
            data=dv.to_blob(),
            fields=(POS_FIELD_ID,),
            properties={REFERENCED_DATA_FILE: df.file_path, CARDINALITY: str(len(dv))},
        )
        for df, dv in kept
    ]
    data, metas = write_puffin(blobs)
    entries = [
        DataFile(
            file_path=location,
            file_format=FileFormat.PUFFIN,
            partition=df.partition,
            record_count=len(dv),
            file_size_in_bytes=len(data),
            content=DataFileContent.POSITION_DELETES,
            spec_id=df.spec_id,
            referenced_data_file=df.file_path,
            content_offset=meta.offset,
            content_size_in_bytes=meta.length,
        )
        for (df, dv), meta in zip(kept, metas)
    ]
    return DeletionVectorFile(location, data, entries)


async def write_deletion_vectors(
    io: Any, directory: str, vectors: Sequence[tuple[DataFile, DeletionVector]]
) -> list[DataFile]:
    """Write one Puffin file of DVs under ``directory`` (create-if-absent); its entries."""
    location = f"{directory.rstrip('/')}/{uuid.uuid4()}-deletes.puffin"
    built = build_deletion_vector_file(location, vectors)
    if not built.entries:
        return []
    await io.write_once(location, built.data)
    return built.entries


def positions_in_delete_file(data: bytes, location: str, data_path: str) -> DeletionVector:
    """The positions a Parquet position delete file deletes in ``data_path``.

    Columns are found by their reserved field ids (``file_path`` 2147483546, ``pos``
    2147483545). Used to fold v2 position deletes into the DV that replaces them.
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from icefloe.arrow.schema import field_id_of

    try:
        parquet = pq.ParquetFile(pa.BufferReader(data))
        names = {field_id_of(f): f.name for f in parquet.schema_arrow}
        if DELETE_FILE_PATH_ID not in names or DELETE_POS_ID not in names:
            raise InvalidFileError(
                location,
                f"not a position delete file: columns with field ids {DELETE_FILE_PATH_ID} "
                f"(file_path) and {DELETE_POS_ID} (pos) are required",
            )
        table = parquet.read(columns=[names[DELETE_FILE_PATH_ID], names[DELETE_POS_ID]])
    except (pa.ArrowException, OSError) as e:
        raise InvalidFileError(location, f"unreadable position delete file: {e}") from e
    mine = table.filter(pc.equal(table.column(0), data_path))
    return DeletionVector.from_array(mine.column(1).to_numpy())


def vectors_in_puffin(data: bytes, location: str) -> dict[str, DeletionVector]:
    """Every DV blob of a Puffin file by referenced data file (tools, tests, checks)."""
    out: dict[str, DeletionVector] = {}
    for blob in read_footer(data, location).blobs:
        if blob.type != BLOB_TYPE:
            continue
        ref = blob.properties.get(REFERENCED_DATA_FILE)
        if not ref:
            raise InvalidFileError(
                location, f"DV blob at {blob.offset} has no {REFERENCED_DATA_FILE}"
            )
        if blob.compression_codec:
            raise InvalidFileError(location, "deletion vector blobs must not be compressed")
        dv = DeletionVector.from_blob(
            data[blob.offset : blob.offset + blob.length], f"{location}@{blob.offset}"
        )
        card = blob.properties.get(CARDINALITY)
        if card is not None and card != str(len(dv)):
            raise InvalidFileError(
                location, f"DV blob at {blob.offset} says cardinality {card}, holds {len(dv)}"
            )
        out[ref] = dv
    return out


__all__ = [
    "BLOB_TYPE",
    "MAGIC",
    "POS_FIELD_ID",
    "DeletionVector",
    "DeletionVectorFile",
    "build_deletion_vector_file",
    "deletion_vector_from_blob",
    "dv_from_puffin",
    "is_deletion_vector",
    "positions_in_delete_file",
    "read_deletion_vector",
    "vectors_in_puffin",
    "write_deletion_vectors",
]
