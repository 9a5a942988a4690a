"""Compaction without an engine: rewrite a plan's file groups with pyarrow and commit them.

:mod:`icefloe.table.compaction` decides *what* to rewrite; the Spark job is one way to carry it
out. This module is the other, for a process that holds no engine (the coordinator, which
compacts the upsert tables it commits to, :mod:`icefloe.coordinator.compactor`):

1. for each group, in turn, each data file is fetched through the table's FileIO and read
   one row group at a time, projected by field id onto the table's current schema
   (:func:`~icefloe.parquet.files.read_row_groups`); the rows its deletion vector or position
   delete files delete are dropped with one boolean mask per row group;
2. the surviving rows stream into new Parquet files of the group's spec and partition,
   rolled at ``write.target-file-size-bytes``, written with Iceberg field ids and column
   metrics by the core's writer (:class:`~icefloe.parquet.files.ParquetFileWriter`) and uploaded;
3. on v3 tables every row's ``_row_id`` and ``_last_updated_sequence_number`` are written
   explicitly, as read with inheritance (spec: "Row Lineage"), so rows keep their ids;
4. one ``replace`` snapshot removes the group's files (and delete files that applied only
   to them, :meth:`~icefloe.table.compaction.CompactionPlan.droppable_deletes`; a DV goes with its
   data file) and adds the new ones, through the snapshot producer with its rewrite
   validation from the planned snapshot, with its manifests merged (small ones bin-packed
   into one per spec and content, so the head is as cheap to plan as an appended table's):
   a delete committed since on a replaced file
   (another engine's DELETE or MERGE) fails it with ValidationConflictError, and a removed
   file no longer live fails it too. Nothing is committed then, and the new files are
   deleted.

Memory: one input file's bytes, the rows gathered for the next output row group
(``write.parquet.row-group-size-bytes``), and the rows of the output file being written (the
writer keeps them to measure NaN counts and long-string bounds), so about one target-size
file decoded; groups are done one at a time. Parsing, masking and encoding run in
worker threads (:func:`asyncio.to_thread`), never on the event loop.

A group whose files carry equality deletes is left out (:func:`rewritable`): applying them
needs the rows of every file they cover, which is the Spark job's work; on tables the
coordinator upserts into there are none (it resolves keys into positions).

A crash before the commit leaves only unreferenced files (the orphan clean-up removes them);
after it, the table holds the new files and nothing else is needed: the replace is one
atomic swap, so no row is ever lost or doubled.
"""

from __future__ import annotations

import asyncio
import io
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from icefloe.deletes.deletion_vector import positions_in_delete_file, read_deletion_vector
from icefloe.deletes.index import is_deletion_vector
from icefloe.errors import (
    CommitFailedError,
    InvalidFileError,
    NotFoundError,
    ValidationConflictError,
    ValidationError,
)
from icefloe.io.fileio import FileIO
from icefloe.parquet.files import ParquetFileWriter, data_location, read_data_file, read_row_groups
from icefloe.parquet.options import ParquetWriteOptions, target_file_size
from icefloe.spec.datafile import DataFile, DataFileContent
from icefloe.spec.row_lineage import with_lineage_fields, with_row_lineage, without_lineage_metrics
from icefloe.spec.schema import Schema
from icefloe.spec.snapshot import Operation
from icefloe.table.catalog import Table
from icefloe.table.commit import RetryPolicy
from icefloe.table.compaction import CompactionPlan, FileGroup, RewriteTask
from icefloe.table.snapshot_producer import SnapshotProducer

SUMMARY_REWRITE = "icefloe.rewrite"
"""Summary key of snapshots this module commits (its value names who rewrote)."""


def rewritable(group: FileGroup) -> bool:
    """Whether this module can rewrite ``group``: no equality deletes apply to its files."""
    return not any(
        d.content == DataFileContent.EQUALITY_DELETES for t in group.tasks for d in t.deletes
    )


def select_groups(plan: CompactionPlan, max_bytes: int) -> list[FileGroup]:
    """The plan's rewritable groups, in plan order, up to ``max_bytes`` of input (the
    first group is taken whatever its size, so a run always makes progress)."""
    out: list[FileGroup] = []
    total = 0
    for group in plan.groups:
        if not rewritable(group):
            continue
        if out and total + group.input_bytes > max_bytes:
            break
        out.append(group)
        total += group.input_bytes
    return out


@dataclass(slots=True)
class RewrittenGroup:
    """A group's new files, with the key columns of each when asked (row ``i`` of the keys
    is position ``i`` of the file), and how many deleted rows the rewrite dropped."""

    group: FileGroup
    files: list[DataFile] = field(default_factory=list)
    keys: dict[str, pa.Table] = field(default_factory=dict)
    deleted_rows: int = 0


@dataclass(slots=True)
class RewriteResult:
    """A committed rewrite: the table after it and what moved."""

    table: Table
    snapshot_id: int
    groups: list[RewrittenGroup]
    removed_deletes: list[str]

    @property
    def added(self) -> list[DataFile]:
        return [f for g in self.groups for f in g.files]

    @property
    def removed(self) -> list[str]:
        return sorted(p for g in self.groups for p in g.group.paths)

    @property
    def keys(self) -> dict[str, pa.Table]:
        return {p: k for g in self.groups for p, k in g.keys.items()}

    @property
    def input_bytes(self) -> int:
        return sum(g.group.input_bytes for g in self.groups)


class _DeleteCache:
    """Position delete files read once per rewrite (one may cover many data files)."""

    def __init__(self, io: FileIO) -> None:
        self.io = io
        self.raw: dict[str, bytes] = {}

    async def mask(self, task: RewriteTask) -> np.ndarray[Any, np.dtype[np.bool_]]:
        """Deleted rows of the task's data file, as a boolean mask over its positions."""
        n = task.data_file.record_count
        mask = np.zeros(n, dtype=np.bool_)
        for d in task.deletes:
            if d.content != DataFileContent.POSITION_DELETES:
                raise ValidationError(
                    f"{task.data_file.file_path}: delete file {d.file_path} is not a position "
                    "delete; the engine-free rewrite applies deletes by position only"
                )
            if is_deletion_vector(d):
                dv = await read_deletion_vector(self.io, d)
            else:
                raw = self.raw.get(d.file_path)
                if raw is None:
                    raw = self.raw[d.file_path] = await self.io.read(d.file_path)
                dv = await asyncio.to_thread(
                    positions_in_delete_file, raw, d.file_path, task.data_file.file_path
                )
            mask |= dv.deleted_mask(n)
        return mask


class _GroupWriter:
    """New files for one group: rows are gathered into full row groups (an input file's row
    groups are small on a streaming table, and a reader pays per row group), files roll at
    the target size, and each closed file's bytes wait in ``closed`` for the upload."""

    def __init__(self, table: Table, group: FileGroup, write_schema: Schema, target: int) -> None:
        metadata = table.metadata
        spec = metadata.spec_by_id(group.spec_id)
        if spec is None:
            raise ValidationError(
                f"{table.identifier}: partition spec {group.spec_id} of the files to rewrite "
                "is not in the table metadata"
            )
        self.table = table
        self.spec = spec
        self.partition = group.partition
        self.schema = write_schema
        self.target = target
        options = ParquetWriteOptions.from_properties(metadata.properties, write_schema)
        self.row_group_bytes = options.row_group_size_bytes
        self.row_group_rows = options.row_group_limit
        base = data_location(metadata.location, metadata.properties)
        if spec.fields and not spec.is_unpartitioned:
            base = f"{base}/{spec.partition_path(group.partition, metadata.schema())}"
        self.prefix = f"{base}/{uuid.uuid4()}-rewrite"
        self.count = 0
        self.writer: ParquetFileWriter | None = None
        self.buffer: io.BytesIO | None = None
        self.pending: list[pa.Table] = []
        self.pending_bytes = 0
        self.pending_rows = 0
        self.closed: list[tuple[DataFile, bytes]] = []

    def write(self, rows: pa.Table) -> None:
        if rows.num_rows == 0:
            return
        self.pending.append(rows)
        self.pending_bytes += rows.nbytes
        self.pending_rows += rows.num_rows
        if self.pending_bytes >= self.row_group_bytes or self.pending_rows >= self.row_group_rows:
            self._flush()

    def _flush(self) -> None:
        if not self.pending:
            return
        rows = pa.concat_tables(self.pending)
        self.pending, self.pending_bytes, self.pending_rows = [], 0, 0
        if self.writer is None:
            self.count += 1
            self.buffer = io.BytesIO()
            self.writer = ParquetFileWriter(
                self.buffer,
                schema=self.schema,
                spec=self.spec,
                partition=self.partition,
                properties=self.table.metadata.properties,
                file_path=f"{self.prefix}-{self.count:05d}.parquet",
            )
        self.writer.write(rows)
        if self.writer.bytes_written >= self.target:
            self._close()

    def finish(self) -> None:
        """Write what is gathered and close the last file."""
        self._flush()
        self._close()

    def _close(self) -> None:
        if self.writer is None or self.buffer is None:
            return
        data_file = without_lineage_metrics(self.writer.close())
        self.closed.append((data_file, self.buffer.getvalue()))
        self.writer, self.buffer = None, None

    def abort(self) -> None:
        if self.writer is not None:
            self.writer.abort()
        self.writer, self.buffer, self.pending = None, None, []


async def rewrite_group(
    table: Table,
    group: FileGroup,
    *,
    row_lineage: bool,
    key_schema: Schema | None = None,
    written: list[str] | None = None,
) -> RewrittenGroup:
    """Write ``group``'s live rows into new files (uploaded, not committed).

    ``written`` collects the path of every file uploaded, so a caller can delete them if the
    commit does not happen; ``key_schema`` asks for the key columns of each new file.
    """
    metadata = table.metadata
    schema = metadata.schema()
    write_schema = with_lineage_fields(schema) if row_lineage else schema
    target = target_file_size(metadata.properties)
    out = RewrittenGroup(group)
    writer = _GroupWriter(table, group, write_schema, target)
    deletes = _DeleteCache(table.io)
    try:
        for task in sorted(group.tasks, key=lambda t: t.data_file.file_path):
            mask = await deletes.mask(task)
            raw = await table.io.read(task.data_file.file_path)
            out.deleted_rows += await asyncio.to_thread(
                _copy_live_rows, raw, task, mask, write_schema, row_lineage, writer
            )
        await asyncio.to_thread(writer.finish)
    except BaseException:
        writer.abort()
        raise
    for data_file, data in writer.closed:
        if written is not None:
            written.append(data_file.file_path)
        await table.io.write(data_file.file_path, data)
        out.files.append(data_file)
        if key_schema is not None:
            out.keys[data_file.file_path] = await asyncio.to_thread(
                read_data_file, data, key_schema, location=data_file.file_path
            )
    return out


def _copy_live_rows(
    raw: bytes,
    task: RewriteTask,
    deleted: np.ndarray[Any, np.dtype[np.bool_]],
    read_schema: Schema,
    row_lineage: bool,
    writer: _GroupWriter,
) -> int:
    """Stream one data file's rows, less the deleted ones, into ``writer``; returns how many
    rows were dropped. Runs in a worker thread."""
    f = task.data_file
    offset = 0
    for rows in read_row_groups(raw, read_schema, location=f.file_path):
        n = rows.num_rows
        if offset + n > f.record_count:
            raise InvalidFileError(
                f.file_path, f"holds more rows than its record count {f.record_count}"
            )
        if row_lineage:
            rows = with_row_lineage(
                rows,
                first_row_id=f.first_row_id,
                data_sequence_number=task.sequence_number,
                positions=np.arange(offset, offset + n, dtype=np.int64),
            )
        keep = ~deleted[offset : offset + n]
        if not keep.all():
            rows = rows.filter(pa.array(keep))
        writer.write(rows)
        offset += n
    if offset != f.record_count:
        raise InvalidFileError(
            f.file_path, f"holds {offset} rows, but its record count is {f.record_count}"
        )
    return int(deleted.sum())


async def rewrite_and_commit(
    table: Table,
    plan: CompactionPlan,
    groups: Sequence[FileGroup],
    *,
    key_schema: Schema | None = None,
    snapshot_properties: Mapping[str, str] | None = None,
    retry_policy: RetryPolicy | None = None,
) -> RewriteResult | None:
    """Rewrite ``groups`` (of ``plan``, planned on ``table``'s branch head) and commit them
    as one ``replace`` snapshot; None when there was nothing to rewrite.

    A commit that does not apply (ValidationConflictError: another writer deleted rows of a
    replaced file or removed it since the plan) or fails for good raises, after deleting
    the new files; an unknown outcome (CommitStateUnknownError) raises and keeps them,
    since the table may reference them.
    """
    if not groups:
        return None
    written: list[str] = []
    rewritten: list[RewrittenGroup] = []
    try:
        for group in groups:
            rewritten.append(
                await rewrite_group(
                    table,
                    group,
                    row_lineage=plan.row_lineage,
                    key_schema=key_schema,
                    written=written,
                )
            )
    except BaseException:
        await asyncio.shield(_delete_quietly(table.io, written))
        raise
    removed = {p for g in groups for p in g.paths}
    droppable = [d.file_path for d in plan.droppable_deletes(removed)]
    # Merged manifests: otherwise each manifest the rewrite touched stays beside the new
    # one holding only its removals, and every reader of this snapshot opens them all.
    producer = SnapshotProducer(
        table,
        Operation.REPLACE,
        snapshot_properties={SUMMARY_REWRITE: "icefloe", **(snapshot_properties or {})},
        merge_manifests=True,
        merge_min_count=2,
    )
    producer.add_files([f for g in rewritten for f in g.files])
    producer.delete_files([*sorted(removed), *droppable])
    producer.validate_from_snapshot(plan.snapshot_id)
    try:
        committed = await producer.commit(retry_policy)
    except (CommitFailedError, ValidationError, ValidationConflictError):
        # Definitely not committed (the producer says so by these): nothing references them.
        await _delete_quietly(table.io, written)
        raise
    return RewriteResult(committed, producer.snapshot_id, rewritten, droppable)


async def _delete_quietly(io_: FileIO, paths: Sequence[str]) -> None:
    """Remove files no snapshot references (best effort: what stays is an orphan)."""
    for path in paths:
        try:
            await io_.delete(path)
        except NotFoundError:
            pass
        except Exception:  # left to orphan clean-up
            continue


__all__ = [
    "SUMMARY_REWRITE",
    "RewriteResult",
    "RewrittenGroup",
    "rewritable",
    "rewrite_and_commit",
    "rewrite_group",
    "select_groups",
]
