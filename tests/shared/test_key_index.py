"""The key index: positions of keys in the data files it covers, kept equal to the live set."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pyarrow as pa
import pytest

from icefloe.datafile import DataFile
from icefloe.errors import ValidationError
from icefloe.fileio import LocalFileIO
from icefloe.key_index import KeyIndex, key_schema
from icefloe.parquet import write_data_file
from icefloe.schema import Schema
from icefloe.types import LongType, NestedField, StringType

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "region", StringType(), required=True),
    NestedField(3, "v", StringType()),
    identifier_field_ids=[1, 2],
)


def _write(tmp: Path, name: str, ids: list[int], regions: list[str]) -> DataFile:
    rows = pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "region": pa.array(regions),
            "v": pa.array([f"{i}" for i in ids]),
        }
    )
    path = str(tmp / name)
    return write_data_file(rows, path, schema=SCHEMA, file_path=path)


def test_lookup_follows_sync_and_staging(tmp_path: Path) -> None:
    async def run() -> None:
        a = _write(tmp_path, "a.parquet", [1, 2, 3], ["eu", "eu", "us"])
        b = _write(tmp_path, "b.parquet", [3, 4], ["us", "us"])
        index = KeyIndex(LocalFileIO(), SCHEMA, SCHEMA.identifier_field_ids)
        await index.sync({a.file_path: a})
        keys = pa.table({"id": pa.array([3, 4], pa.int64()), "region": ["us", "us"]})
        assert {p: v.tolist() for p, v in (await index.lookup(keys)).items()} == {a.file_path: [2]}
        index.stage(b, await index.read_keys(b))
        found = await index.lookup(keys)
        assert {p: v.tolist() for p, v in found.items()} == {
            a.file_path: [2],
            b.file_path: [0, 1],
        }
        index.discard_staged()
        await index.sync({b.file_path: b})  # a compacted away, b live
        assert index.covered == {b.file_path}
        found = await index.lookup(keys)
        assert {p: v.tolist() for p, v in found.items()} == {b.file_path: [0, 1]}

    asyncio.run(run())


def test_unkeyed_schema_is_refused() -> None:
    plain = Schema(NestedField(1, "id", LongType(), required=True))
    with pytest.raises(ValidationError, match="identifier fields"):
        key_schema(plain, plain.identifier_field_ids)
