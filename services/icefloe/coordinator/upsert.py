"""Upserts: change batches on keyed tables, resolved at commit into row deletes, in order.

An ``upsert`` unit (see :mod:`icefloe.events`) brings data files holding the new row of each
key and *key files* naming every key whose existing rows go (equality-delete Parquet files
over the table's identifier fields). Key files are never committed: on every attempt, on
the base that attempt builds on, the committer

1. brings the table's :class:`~icefloe.key_index.KeyIndex` to the base's live data files
   (``sync``), forgetting what an earlier attempt staged;
2. for each upsert unit of the batch *in Kafka order*: reads the keys of its key files and
   of its data files, looks them up (``lookup``: rows live in the base *and* rows that
   earlier units of this snapshot add), deletes those positions
   (:meth:`~icefloe.table.snapshot_producer.SnapshotProducer.delete_positions`: one merged
   deletion vector per data file on v3, position delete files on v2), then stages the
   unit's data files so the units after it see them.

So readers never meet an equality delete, the table's order of upserts is the order of their
commit-requested events on the partition, and a foreign commit between our build and our
swap only makes the swap fail: the next attempt resolves again on the new base (a row moved
by a concurrent compaction is found in its new file; a DV is never written for a file that
is gone). The data files' own keys are looked up too, so a writer whose key files miss a
key it writes still replaces that key's row.

What is refused (dead-lettered, naming the problem, never a crash): upserts on a table of
format v1, without identifier fields, or whose identifier fields can be null (a field in an
optional struct); a key file that is not an equality-delete Parquet file, or whose
``equality-ids`` are not the identifier fields; a unit whose data files hold a key twice;
files that cannot be read as the key columns.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from icefloe.coordinator.batcher import Unit
from icefloe.errors import (
    EventRejectedError,
    IcefloeError,
    InvalidFileError,
    NotFoundError,
    ValidationConflictError,
    ValidationError,
)
from icefloe.events import CommitOperation
from icefloe.io.fileio import FileIO
from icefloe.key_index import KeyIndex, key_schema
from icefloe.parquet.files import read_data_file
from icefloe.spec.datafile import DataFile, DataFileContent, FileFormat
from icefloe.spec.metadata import TableMetadata
from icefloe.spec.schema import Schema
from icefloe.spec.snapshot import Operation
from icefloe.table.snapshot_producer import SnapshotProducer

KeyIndexOpener = Callable[[FileIO, str, Schema, Sequence[int]], Awaitable[KeyIndex]]
"""How a committer opens a table's key index: ``KeyIndex.open`` with the service's settings
bound (the memory budget, once the scalable index takes it)."""

_READ_CONCURRENCY = 8


def is_upsert(units: Sequence[Unit]) -> bool:
    return bool(units) and units[0].operation == CommitOperation.UPSERT


def key_ids_of(metadata: TableMetadata, what: str) -> tuple[int, ...]:
    """The table's identifier field ids, or EventRejectedError when upserts cannot apply."""
    if metadata.format_version < 2:
        raise EventRejectedError(
            "invalid-request",
            f"{what}: upserts need table format v2 or later (they delete rows by position); "
            f"the table is v{metadata.format_version}",
        )
    schema = metadata.schema()
    ids = schema.identifier_field_ids
    if not ids:
        raise EventRejectedError(
            "not-keyed",
            f"{what}: the table has no identifier fields (schema {schema.schema_id}); upserts "
            "replace rows by key: set identifier-field-ids on the table",
        )
    for fid in ids:
        field = schema.find_field(fid)
        if field is None:
            raise EventRejectedError(
                "not-keyed", f"{what}: identifier field id {fid} is not in the table's schema"
            )
        parent = schema.parent_id(fid)
        nullable = not field.required
        while parent is not None and not nullable:
            nullable = not schema.field(parent).required
            parent = schema.parent_id(parent)
        if nullable:
            raise EventRejectedError(
                "not-keyed",
                f"{what}: identifier field {schema.find_column_name(fid)!r} can be null "
                "(it or a struct holding it is optional); keys must be required",
            )
    return tuple(ids)


def check_key_files(unit: Unit, key_ids: Sequence[int], table: str) -> None:
    """Every delete file of an upsert unit must be a key file over the identifier fields."""
    want = sorted(key_ids)
    for f in unit.delete_files:
        where = f"table {table}: upsert commit id {unit.commit_id!r}: key file {f.file_path!r}"
        if f.content != DataFileContent.EQUALITY_DELETES:
            raise EventRejectedError(
                "invalid-key-file",
                f"{where} has content {f.content.name.lower().replace('_', '-')!r}; key files "
                "are equality-delete files naming the keys whose rows the upsert replaces",
            )
        if f.file_format != FileFormat.PARQUET:
            raise EventRejectedError(
                "invalid-key-file", f"{where} is {f.file_format!r}; key files must be Parquet"
            )
        if sorted(f.equality_ids or ()) != want:
            raise EventRejectedError(
                "invalid-key-file",
                f"{where} has equality-ids {list(f.equality_ids or ())}, but the table's "
                f"identifier field ids are {list(key_ids)}",
            )


class UnitRefused(IcefloeError):
    """An upsert unit that cannot be resolved; ``maybe_committed`` when the reason (a file
    gone) may mean another committer already applied it and cleaned up."""

    def __init__(self, unit: Unit, error: EventRejectedError, maybe_committed: bool = False):
        super().__init__(str(error))
        self.unit = unit
        self.error = error
        self.maybe_committed = maybe_committed


class UpsertResolution:
    """One batch's upsert units, resolved again on each attempt's base (see the module
    docstring). Keys read from files are kept across attempts: files never change."""

    def __init__(self, units: Sequence[Unit], table: str) -> None:
        self.units = list(units)
        self.table = table
        self._keys: dict[str, pa.Table] = {}
        self._key_ids: tuple[int, ...] = ()

    @property
    def key_files(self) -> list[str]:
        """Paths of the batch's key files: in no snapshot, deleted once it commits."""
        return [f.file_path for u in self.units for f in u.delete_files]

    async def resolve(
        self,
        index: KeyIndex,
        io: FileIO,
        schema: Schema,
        live: Mapping[str, DataFile],
        producer: SnapshotProducer,
    ) -> None:
        """Set ``producer``'s deletes and operation for the base whose live data files are
        ``live`` (``index`` must be synced to them)."""
        key_ids = tuple(schema.identifier_field_ids)
        if key_ids != self._key_ids:
            self._keys.clear()
            self._key_ids = key_ids
        keys_schema = key_schema(schema, key_ids)
        await self._read_all(index, io, keys_schema)
        producer.clear_deleted_positions()
        staged: dict[str, DataFile] = {}
        for unit in self.units:
            data_keys = [self._keys[f.file_path] for f in unit.data_files]
            if data_keys:
                _check_unique(unit, data_keys, self.table)
            wanted = [*(self._keys[f.file_path] for f in unit.delete_files), *data_keys]
            if wanted:
                keys = _distinct(wanted)
                for path, positions in (await index.lookup(keys)).items():
                    target = live.get(path) or staged.get(path)
                    if target is None:
                        raise ValidationConflictError(
                            f"table {self.table}: the key index names {path}, which is neither "
                            "live in the base nor added by this batch"
                        )
                    producer.delete_positions(target, _positions(positions))
            for f, keys in zip(unit.data_files, data_keys, strict=True):
                try:
                    index.stage(f, keys)
                except ValidationError as e:
                    raise UnitRefused(unit, _refusal(unit, f, e, self.table)) from None
                staged[f.file_path] = f
        has_data = any(u.data_files for u in self.units)
        if not producer.deletes_positions:
            producer.operation = Operation.APPEND
        else:  # as Java's RowDelta: rows deleted and added is an overwrite
            producer.operation = Operation.OVERWRITE if has_data else Operation.DELETE

    async def _read_all(self, index: KeyIndex, io: FileIO, keys_schema: Schema) -> None:
        limit = asyncio.Semaphore(_READ_CONCURRENCY)

        async def read(unit: Unit, f: DataFile) -> None:
            async with limit:
                try:
                    if f.content == DataFileContent.DATA:
                        keys = await index.read_keys(f)
                    else:
                        raw = await io.read(f.file_path)
                        keys = await asyncio.to_thread(
                            read_data_file, raw, keys_schema, location=f.file_path
                        )
                except NotFoundError:
                    raise UnitRefused(
                        unit,
                        EventRejectedError(
                            "missing-file",
                            f"table {self.table}: upsert commit id {unit.commit_id!r}: file "
                            f"{f.file_path!r} does not exist",
                        ),
                        maybe_committed=True,
                    ) from None
                except (InvalidFileError, ValidationError) as e:
                    raise UnitRefused(unit, _refusal(unit, f, e, self.table)) from None
                self._keys[f.file_path] = keys

        pending = [
            read(u, f)
            for u in self.units
            for f in (*u.delete_files, *u.data_files)
            if f.file_path not in self._keys
        ]
        tasks = [asyncio.ensure_future(c) for c in pending]
        try:
            await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


def _refusal(unit: Unit, f: DataFile, error: Exception, table: str) -> EventRejectedError:
    kind = "invalid-file" if f.content == DataFileContent.DATA else "invalid-key-file"
    return EventRejectedError(
        kind,
        f"table {table}: upsert commit id {unit.commit_id!r}: cannot read the key columns of "
        f"{f.file_path!r}: {error}",
    )


def _check_unique(unit: Unit, data_keys: Sequence[pa.Table], table: str) -> None:
    """An upsert holds at most one row per key: two would both stay live."""
    keys = _concat(data_keys)
    names = keys.column_names
    counts = keys.group_by(names).aggregate([([], "count_all")])
    repeated = counts.filter(pc.greater(counts.column("count_all"), 1))
    if repeated.num_rows:
        first = {n: repeated.column(n)[0].as_py() for n in names}
        raise UnitRefused(
            unit,
            EventRejectedError(
                "duplicate-key",
                f"table {table}: upsert commit id {unit.commit_id!r}: key {first} appears "
                f"{repeated.column('count_all')[0].as_py()} times in its data files "
                f"({repeated.num_rows} key(s) repeated); an upsert writes one row per key",
            ),
        )


def _concat(tables: Sequence[pa.Table]) -> pa.Table:
    first = tables[0].schema
    return pa.concat_tables([t if t.schema == first else t.cast(first) for t in tables])


def _distinct(tables: Sequence[pa.Table]) -> pa.Table:
    keys = _concat(tables)
    return keys.group_by(keys.column_names).aggregate([]) if len(tables) > 1 else keys


def _positions(positions: Any) -> np.ndarray[Any, np.dtype[np.int64]]:
    return np.asarray(positions, dtype=np.int64)


__all__ = [
    "KeyIndexOpener",
    "UnitRefused",
    "UpsertResolution",
    "check_key_files",
    "is_upsert",
    "key_ids_of",
]
