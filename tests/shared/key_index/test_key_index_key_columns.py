"""Reading a data file's key columns fetches its footer and the key chunks, not the file,
and decodes exactly what a whole-file read decodes (falling back to one when in doubt)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from icefloe.io.fileio import LocalFileIO, S3FileIO
from icefloe.key_index import key_columns, key_schema
from icefloe.key_index.key_columns import read_key_columns
from icefloe.parquet.files import read_data_file, write_data_file
from icefloe.spec.datafile import DataFile
from icefloe.spec.schema import Schema
from icefloe.spec.types import LongType, NestedField, StringType
from servers import S3Endpoint

WIDE = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "region", StringType(), required=True),
    *[NestedField(i, f"c{i}", StringType()) for i in range(3, 13)],
    identifier_field_ids=[2, 1],
)
KEYS = key_schema(WIDE, WIDE.identifier_field_ids)


class CountingIO(LocalFileIO):
    def __init__(self) -> None:
        super().__init__()
        self.bytes_read = 0

    async def read(self, path: str) -> bytes:
        data = await super().read(path)
        self.bytes_read += len(data)
        return data

    async def read_range(self, path: str, start: int, length: int) -> bytes:
        data = await super().read_range(path, start, length)
        self.bytes_read += len(data)
        return data


def wide_file(tmp: Path, rows: int = 60_000) -> DataFile:
    ids = np.arange(rows)
    table = pa.table(
        {
            "id": pa.array(ids),
            "region": pa.array([f"r{i % 7}" for i in range(rows)]),
            **{f"c{i}": pa.array([f"{i}-{j}-some-payload" for j in ids]) for i in range(3, 13)},
        }
    )
    path = str(tmp / "wide.parquet")
    return write_data_file(
        table,
        path,
        schema=WIDE,
        file_path=path,
        properties={"write.parquet.row-group-size-bytes": str(1 << 20)},
    )


async def test_only_the_key_chunks_are_read(tmp_path: Path) -> None:
    data_file = wide_file(tmp_path)
    assert data_file.file_size_in_bytes > key_columns.WHOLE_FILE_BYTES
    counting = CountingIO()
    keys = await read_key_columns(counting, data_file, KEYS)
    assert keys.equals(read_data_file(data_file.file_path, KEYS))
    assert keys.column_names == ["region", "id"]
    assert counting.bytes_read < data_file.file_size_in_bytes / 4


async def test_a_wrong_guess_falls_back_to_the_whole_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data_file = wide_file(tmp_path)
    real = key_columns._key_chunks

    def first_chunk_only(footer: key_columns._Pieces, ids: list[int]) -> list[tuple[int, int]]:
        chunks = real(footer, ids)
        assert chunks
        return chunks[:1]

    monkeypatch.setattr(key_columns, "_key_chunks", first_chunk_only)
    counting = CountingIO()
    keys = await read_key_columns(counting, data_file, KEYS)
    assert keys.equals(read_data_file(data_file.file_path, KEYS))
    assert counting.bytes_read > data_file.file_size_in_bytes  # the pieces, then the file


async def test_small_files_are_read_whole(tmp_path: Path) -> None:
    data_file = wide_file(tmp_path, rows=100)
    counting = CountingIO()
    keys = await read_key_columns(counting, data_file, KEYS)
    assert keys.equals(read_data_file(data_file.file_path, KEYS))
    assert counting.bytes_read == data_file.file_size_in_bytes


@pytest.mark.integration
async def test_key_chunks_are_read_through_s3(s3_server: S3Endpoint, tmp_path: Path) -> None:
    local = wide_file(tmp_path)
    bucket = s3_server.create_bucket()
    remote = dataclasses.replace(local, file_path=f"s3://{bucket}/t/data/wide.parquet")
    async with S3FileIO.from_properties(s3_server.file_io_properties()) as s3:
        await s3.write(remote.file_path, Path(local.file_path).read_bytes())
        keys = await read_key_columns(s3, remote, KEYS)
    assert keys.equals(read_data_file(local.file_path, KEYS))
