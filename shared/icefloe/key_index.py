"""Where each key of a keyed table lives: key → (data file, row position).

An upsert or a delete by key must find the rows it replaces. Writers cannot know (many write
at once, and other engines change the table), so the coordinator resolves keys at commit,
against the table it commits on, and turns them into deletion vectors (v3) or position
deletes (v2): no equality delete ever reaches the table, and readers pay nothing.

The index is a function of *which data files it covers* and nothing else: it maps each key
of each covered file to the positions holding it. Data files are immutable, so an entry can
never become wrong, only irrelevant (its file no longer live) or dead (its row deleted since,
which is harmless: deleting a deleted row again changes nothing). :meth:`KeyIndex.sync`
makes the covered set equal to the live data files of the snapshot a commit builds on,
reading the key columns of files it did not cover and forgetting files no longer live, so
the index stays true after any change any engine makes: compaction (positions move into new
files), other engines' appends, deletes and MERGE, rollback, expiry.

Within one snapshot an upsert must also find rows that earlier upserts of the same batch add:
:meth:`KeyIndex.stage` adds such not-yet-committed files for the current attempt, and
:meth:`KeyIndex.discard_staged` forgets them when the attempt is abandoned.

This module is the interface and a straightforward in-memory implementation (exact keys, a
dict per key); it is the reference the scalable one is held to.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from icefloe.datafile import DataFile, DataFileContent
from icefloe.errors import ValidationError
from icefloe.fileio import FileIO
from icefloe.parquet import read_data_file
from icefloe.schema import Schema

Key = tuple[Any, ...]


def key_schema(schema: Schema, key_ids: Sequence[int]) -> Schema:
    """The schema of a table's key columns (its identifier fields), in key order."""
    if not key_ids:
        raise ValidationError(
            f"schema {schema.schema_id} has no identifier fields: upserts and deletes by key "
            "need a keyed table (set identifier-field-ids)"
        )
    fields = []
    for fid in key_ids:
        field = schema.find_field(fid)
        if field is None:
            raise ValidationError(f"identifier field id {fid} is not in schema {schema.schema_id}")
        fields.append(field)
    return Schema(*fields, schema_id=schema.schema_id)


def key_tuples(keys: pa.Table) -> list[Key]:
    """The rows of a key table as tuples (the reference implementation's representation)."""
    columns = [c.to_pylist() for c in keys.columns]
    return list(zip(*columns, strict=True)) if columns else []


class KeyIndex:
    """Keys of the data files a table's branch holds live, for resolving upserts.

    ``io`` reads data files; ``schema`` and ``key_ids`` name the key columns (the table's
    identifier fields). Positions are returned as sorted ``int64`` numpy arrays.
    """

    def __init__(self, io: FileIO, schema: Schema, key_ids: Sequence[int]) -> None:
        self.io = io
        self.key_ids = tuple(key_ids)
        self.schema = key_schema(schema, self.key_ids)
        self._files: dict[str, dict[Key, list[int]]] = {}
        self._staged: dict[str, dict[Key, list[int]]] = {}

    @classmethod
    async def open(
        cls, io: FileIO, table_location: str, schema: Schema, key_ids: Sequence[int]
    ) -> KeyIndex:
        """The index of a table as its last checkpoint under ``table_location`` left it
        (this reference implementation keeps none: it starts empty and ``sync`` fills it)."""
        del table_location
        return cls(io, schema, key_ids)

    async def checkpoint(self) -> None:
        """Persist what a new owner needs to resume without rescanning (reference: nothing)."""

    @property
    def covered(self) -> frozenset[str]:
        """Paths of the committed data files the index covers."""
        return frozenset(self._files)

    async def read_keys(self, data_file: DataFile) -> pa.Table:
        """The key columns of a data file, in row order (row ``i`` is position ``i``)."""
        if data_file.content != DataFileContent.DATA:
            raise ValidationError(f"{data_file.file_path} is not a data file")
        raw = await self.io.read(data_file.file_path)
        return await asyncio.to_thread(
            read_data_file, raw, self.schema, location=data_file.file_path
        )

    async def sync(self, live: Mapping[str, DataFile]) -> None:
        """Cover exactly the data files of ``live`` (path → data file; delete files are
        ignored): read the keys of new ones, forget those no longer live."""
        for path in [p for p in self._files if p not in live]:
            del self._files[path]
        for path, data_file in live.items():
            if data_file.content != DataFileContent.DATA or path in self._files:
                continue
            staged = self._staged.pop(path, None)
            self._files[path] = (
                staged if staged is not None else _positions(await self.read_keys(data_file))
            )
        self._staged.clear()

    def stage(self, data_file: DataFile, keys: pa.Table) -> None:
        """Cover a data file the current attempt adds (its key columns given)."""
        if keys.num_rows != data_file.record_count:
            raise ValidationError(
                f"{data_file.file_path}: {keys.num_rows} key rows for "
                f"{data_file.record_count} records"
            )
        self._staged[data_file.file_path] = _positions(keys)

    def discard_staged(self) -> None:
        """Forget the files staged by an attempt that will not commit."""
        self._staged.clear()

    async def lookup(self, keys: pa.Table) -> dict[str, np.ndarray[Any, np.dtype[np.int64]]]:
        """Data file path → sorted positions of the rows (covered or staged) whose key is
        one of ``keys``. Rows already deleted may be included: deleting them again is a
        no-op."""
        wanted = set(key_tuples(keys))
        out: dict[str, np.ndarray[Any, np.dtype[np.int64]]] = {}
        for path, by_key in (*self._files.items(), *self._staged.items()):
            hits = [p for k in wanted.intersection(by_key) for p in by_key[k]]
            if hits:
                out[path] = np.array(sorted(hits), dtype=np.int64)
        return out


def _positions(keys: pa.Table) -> dict[Key, list[int]]:
    out: dict[Key, list[int]] = defaultdict(list)
    for position, key in enumerate(key_tuples(keys)):
        out[key].append(position)
    return dict(out)


__all__ = ["Key", "KeyIndex", "key_schema", "key_tuples"]
