"""Reading only the key columns of a data file: the footer, then the key columns' chunks.

Rebuilding or catching up a key index reads the key columns of every new data file. A
table's rows are usually much wider than its key, and on an object store a whole-file GET
of a 128 MiB file to decode an 8-byte key column wastes nearly all of it. So the footer is
fetched first (one ranged read of the file's tail), the byte ranges of the key columns'
chunks are taken from it, fetched concurrently, and the file is decoded from those pieces
alone (:class:`_Pieces`, a file that holds only the fetched ranges).

Anything unexpected (no field ids to find the key columns by, a reader that asks for bytes
outside the fetched chunks, a footer that does not parse) falls back to reading the whole
file, so this is only ever an optimisation: the decoded keys are the same either way.
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import Sequence
from typing import IO, Final, cast

import pyarrow as pa
import pyarrow.parquet as pq

from icefloe.arrow.schema import field_id_of
from icefloe.io.fileio import FileIO
from icefloe.parquet.files import read_data_file
from icefloe.spec.datafile import DataFile
from icefloe.spec.schema import Schema

# Bytes fetched from the end of a file in the first request: most footers fit.
TAIL_BYTES: Final = 64 * 2**10
# Files up to this size, or whose key chunks are more than half of them, are read whole:
# one request beats several when they would carry about the same bytes.
WHOLE_FILE_BYTES: Final = 1 * 2**20
# Ranges this close are fetched as one (more than pyarrow's 8 KiB read coalescing).
GAP_BYTES: Final = 64 * 2**10
_MAGIC: Final = b"PAR1"


class _Missing(Exception):
    """The decoder asked for bytes that were not fetched."""


class _Pieces(io.RawIOBase):
    """A read-only file of ``size`` bytes of which only ``pieces`` (offset → bytes) are
    known; a read outside them raises (and is remembered, so the caller can fall back)."""

    def __init__(self, size: int, pieces: dict[int, bytes]) -> None:
        super().__init__()
        self.size = size
        self.pieces = sorted(pieces.items())
        self.position = 0
        self.missed = False

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.size}[whence]
        self.position = base + offset
        return self.position

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        want = min(len(buffer), self.size - self.position)
        if want <= 0:
            return 0
        for start, data in self.pieces:
            if start <= self.position and self.position + want <= start + len(data):
                at = self.position - start
                buffer[:want] = data[at : at + want]
                self.position += want
                return want
        self.missed = True
        raise _Missing(f"bytes {self.position}..{self.position + want} were not fetched")


def _key_chunks(footer: _Pieces, key_ids: Sequence[int]) -> list[tuple[int, int]] | None:
    """(offset, length) of every chunk of the key columns, or None to read the whole file."""
    try:
        metadata = pq.read_metadata(footer)
        arrow = metadata.schema.to_arrow_schema()
    except (pa.ArrowException, OSError, _Missing):
        return None
    names = {f.name for f in arrow if field_id_of(f) in set(key_ids)}
    if len(names) != len(set(key_ids)):
        return None  # no field ids (a migrated file) or a nested key: let the full path decide
    ranges = []
    for g in range(metadata.num_row_groups):
        group = metadata.row_group(g)
        for c in range(group.num_columns):
            column = group.column(c)
            if column.path_in_schema.split(".")[0] not in names:
                continue
            start = column.data_page_offset
            if column.has_dictionary_page and column.dictionary_page_offset:
                start = min(start, column.dictionary_page_offset)
            ranges.append((start, column.total_compressed_size))
    return _coalesced(ranges)


def _coalesced(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Ranges joined across gaps of up to :data:`GAP_BYTES`: the Parquet reader coalesces
    nearby reads the same way, and each fetched piece must hold a whole read."""
    out: list[tuple[int, int]] = []
    for start, length in sorted(ranges):
        if out and start - (out[-1][0] + out[-1][1]) <= GAP_BYTES:
            first = out[-1][0]
            out[-1] = (first, max(out[-1][0] + out[-1][1], start + length) - first)
        else:
            out.append((start, length))
    return out


async def read_key_columns(io_: FileIO, data_file: DataFile, key_schema: Schema) -> pa.Table:
    """The key columns (``key_schema``) of ``data_file`` in row order, reading as little of
    the file as its footer allows."""
    path, size = data_file.file_path, data_file.file_size_in_bytes
    if size > WHOLE_FILE_BYTES:
        tail_start = max(0, size - TAIL_BYTES)
        tail = await io_.read_range(path, tail_start, size - tail_start)
        footer_length = int.from_bytes(tail[-8:-4], "little") if len(tail) >= 8 else -1
        if tail[-4:] == _MAGIC and 0 <= footer_length <= size - 12:
            if footer_length + 8 > len(tail):
                tail_start = size - 8 - footer_length
                tail = await io_.read_range(path, tail_start, footer_length + 8)
            pieces = {tail_start: tail}
            ids = [f.field_id for f in key_schema.fields]
            chunks = await asyncio.to_thread(_key_chunks, _Pieces(size, dict(pieces)), ids)
            if chunks is not None and 2 * sum(n for _, n in chunks) <= size:
                data = await asyncio.gather(*(io_.read_range(path, s, n) for s, n in chunks))
                pieces.update((s, d) for (s, _), d in zip(chunks, data, strict=True))
                source = _Pieces(size, pieces)
                try:
                    return await asyncio.to_thread(
                        read_data_file, cast(IO[bytes], source), key_schema, location=path
                    )
                except Exception:
                    if not source.missed:
                        raise
    raw = await io_.read(path)
    return await asyncio.to_thread(read_data_file, raw, key_schema, location=path)


__all__ = ["read_key_columns"]
