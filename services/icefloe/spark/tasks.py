"""What runs inside Spark tasks: writing Parquet data files and reading scan tasks.

Everything here executes in Spark's Python workers, far from the driver: no Kafka, no
catalog, no event loop borrowed from the driver. A task gets a small, picklable job
description (:class:`WriteJob`, :class:`ReadJob`) whose schema and spec travel as JSON,
talks to storage through its own :class:`~icefloe.fileio.FileIO` on an event loop it owns
for the task's lifetime, and hands back plain Arrow record batches.

Writing
-------
:func:`write_task` is a ``mapInArrow`` function. It shapes Spark's Arrow batches into the
table schema (Spark has no uuid, fixed, time or nanosecond types, so those arrive as
strings, binaries and longs and are converted with checks here, the rest is
:func:`~icefloe.arrow_schema.conform_table`), splits rows by partition with the table's
spec (:func:`~icefloe.parquet.partition_table`, vectorized), and keeps one open
:class:`~icefloe.parquet.ParquetFileWriter` per partition: rows are buffered per partition
until they make a row group of ``write.parquet.row-group-size-bytes``, and a file rolls at
``write.target-file-size-bytes``. Files on local disk are written in place; files for an
object store are built in memory and uploaded through the FileIO as each one completes.

File names carry the job, the Spark partition and the task attempt::

    <data dir>/<partition path>/<job id>-<spark partition:05d>-<task attempt id>-<n:05d>.parquet

so the driver can find every file a job wrote, including those of attempts that died
before reporting, and delete the ones it did not commit. The task returns one row per file
(:data:`WRITE_RESULT_SCHEMA`): its content-file JSON and the attempt that wrote it. Spark
delivers to the driver only the rows of the attempt that succeeded for each partition,
which is what makes the collected rows exactly the set to commit.

A task that raises deletes the files it wrote before re-raising. Once its files are
complete, and before it reports them, a task tells the worker's :class:`TaskHooks` (the
default does nothing). Tests install hooks in the Python workers that fail an attempt at
that point, as an attempt that dies while reporting would: the files stay behind for the
driver to clean up.

Writing changes by key
----------------------
An upsert or delete by key runs two ``mapInArrow`` steps around a shuffle by key:
:func:`change_rows_task` turns input rows into change rows (numbered in arrival order,
from ``partition id << 40``), and :func:`change_task`, once every change of a key is in
its task, folds them to the last change per key (:mod:`icefloe.spark.changes`), writes the
surviving rows through the same :class:`FanoutWriter` and every key it touched as one key
file (:func:`write_key_file`: the key columns with their field ids and metrics, content
equality-deletes over the identifier fields, the table's spec with null partition values,
named ``<job id>-<partition>-<attempt>-keys.parquet`` so the driver's clean-up finds it).

Reading
-------
:func:`read_task` is a ``mapInArrow`` function over rows holding one scan task each (a data
file, the delete files that apply to it and its residual filter, as the planner returned
them). It reads the data file by field id as the read schema (renames, added columns with
their ``initial-default``, dropped columns and type promotions, see
:func:`~icefloe.arrow_schema.project_table`), removes the rows named by position delete
files, then those matched by equality delete files (null matches null, as the spec says),
then keeps the rows the residual filter accepts, and converts the result to the Arrow
types Spark expects for the DataFrame's schema.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from icefloe.arrow_schema import arrow_to_schema, field_id_of, list_layout, to_arrow_array
from icefloe.binding import bind
from icefloe.content_file import content_file_from_json, content_file_to_json
from icefloe.datafile import DataFile, DataFileContent, FileFormat
from icefloe.delete_index import is_deletion_vector
from icefloe.deletion_vector import DeletionVector, deletion_vector_from_blob
from icefloe.errors import InvalidFileError, ValidationError
from icefloe.expression_json import parse_expression
from icefloe.expressions import (
    AlwaysFalse,
    AlwaysTrue,
    BooleanExpression,
    BooleanExpressionVisitor,
    BoundLiteralPredicate,
    BoundPredicate,
    BoundReference,
    BoundSetPredicate,
    BoundTransform,
    Operation,
    visit,
)
from icefloe.fileio import FileIO, load_file_io, parse_location
from icefloe.parquet import ParquetFileWriter, partition_table, read_data_file
from icefloe.parquet_options import (
    DEFAULT_TARGET_FILE_SIZE_BYTES,
    TARGET_FILE_SIZE_BYTES,
    ParquetWriteOptions,
)
from icefloe.partition import PartitionSpec
from icefloe.row_lineage import with_lineage_fields, with_row_lineage
from icefloe.schema import Schema
from icefloe.spark.changes import ChangeSpec, fold, nest_keys, normalize
from icefloe.transforms import IdentityTransform
from icefloe.types import (
    FixedType,
    IcebergType,
    ListType,
    MapType,
    NestedField,
    NestedType,
    StructType,
    TimestampNanoType,
    TimestamptzNanoType,
    TimeType,
    UUIDType,
)

WRITE_RESULT_SCHEMA = (
    "task_attempt_id long, partition_id int, attempt_number int, stage_id int, file string"
)
WRITE_RESULT_ARROW = pa.schema(
    [
        pa.field("task_attempt_id", pa.int64()),
        pa.field("partition_id", pa.int32()),
        pa.field("attempt_number", pa.int32()),
        pa.field("stage_id", pa.int32()),
        pa.field("file", pa.string()),
    ]
)
READ_TASK_COLUMN = "task"

POSITION_DELETE_PATH_ID = 2147483546
POSITION_DELETE_POS_ID = 2147483545

_MICROS_PER_DAY = 86_400_000_000
_MAX_BUFFERED_BYTES = 256 << 20
"""Rows a task may hold across all partitions before flushing the largest buffers early."""
_OUTPUT_BATCH_ROWS = 65_536


# ---------------------------------------------------------------------------------------
# Task identity and hooks
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TaskInfo:
    """Which Spark task attempt is running (all zeros outside Spark)."""

    partition_id: int = 0
    attempt_number: int = 0
    task_attempt_id: int = 0
    stage_id: int = 0

    @classmethod
    def current(cls) -> TaskInfo:
        from pyspark import TaskContext

        context = TaskContext.get()
        if context is None:
            return cls()
        return cls(
            partition_id=context.partitionId(),
            attempt_number=context.attemptNumber(),
            task_attempt_id=context.taskAttemptId(),
            stage_id=context.stageId(),
        )


class TaskHooks:
    """What a task tells an observer in its Python worker; this one does nothing.

    Tests install others with :func:`install_task_hooks` in the workers (through a PySpark
    daemon of their own) to fail a task attempt at a chosen point.
    """

    def files_complete(self, info: TaskInfo) -> None:
        """A task attempt's files are complete and about to be reported to the driver."""


_hooks = TaskHooks()


def install_task_hooks(hooks: TaskHooks) -> TaskHooks:
    """Make ``hooks`` this process's task hooks; returns the ones they replace."""
    global _hooks
    previous, _hooks = _hooks, hooks
    return previous


def task_hooks() -> TaskHooks:
    """This process's task hooks."""
    return _hooks


# ---------------------------------------------------------------------------------------
# Storage from inside a task
# ---------------------------------------------------------------------------------------


def is_local(location: str) -> bool:
    return parse_location(location)[0] == "file"


class TaskIO:
    """A FileIO with an event loop of its own, for synchronous task code.

    Local files bypass the FileIO: the Parquet writer and reader use the path directly,
    which avoids holding a whole file in memory. Everything else goes through the FileIO.
    """

    def __init__(self, location: str, properties: Mapping[str, str]) -> None:
        self._location = location
        self._properties = dict(properties)
        self._runner: asyncio.Runner | None = None
        self._io: FileIO | None = None

    def _call(self, coro_factory: Any) -> Any:
        if self._runner is None:
            self._runner = asyncio.Runner()
        if self._io is None:
            self._io = load_file_io(self._location, self._properties)
        io_ = self._io
        return self._runner.run(coro_factory(io_))

    def upload(self, location: str, data: bytes) -> None:
        self._call(lambda io_: io_.write(location, data))

    def read(self, location: str) -> bytes:
        result: bytes = self._call(lambda io_: io_.read(location))
        return result

    def delete(self, location: str) -> None:
        if is_local(location):
            with contextlib.suppress(FileNotFoundError):
                os.remove(parse_location(location)[2])
            return
        self._call(lambda io_: io_.delete(location))

    def read_range(self, location: str, start: int, length: int) -> bytes:
        """``length`` bytes at ``start`` (deletion vectors are read this way, not whole)."""
        if is_local(location):
            with open(parse_location(location)[2], "rb") as f:
                f.seek(start)
                return f.read(length)
        result: bytes = self._call(lambda io_: io_.read_range(location, start, length))
        return result

    def source(self, location: str) -> str | bytes:
        """What :func:`~icefloe.parquet.read_data_file` should read for ``location``."""
        return parse_location(location)[2] if is_local(location) else self.read(location)

    def close(self) -> None:
        try:
            if self._io is not None and self._runner is not None:
                io_, self._io = self._io, None
                self._runner.run(io_.close())
        finally:
            if self._runner is not None:
                self._runner.close()
                self._runner = None


# ---------------------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WriteJob:
    """Everything a write task needs, picklable and small (schema and spec as JSON)."""

    job_id: str
    table_location: str
    data_dir: str
    schema_json: str
    spec_json: str
    properties: Mapping[str, str]
    io_properties: Mapping[str, str]

    @property
    def schema(self) -> Schema:
        return _schema(self.schema_json)

    @property
    def spec(self) -> PartitionSpec:
        return _spec(self.spec_json)

    @property
    def target_file_size_bytes(self) -> int:
        raw = self.properties.get(TARGET_FILE_SIZE_BYTES)
        if raw is None:
            return DEFAULT_TARGET_FILE_SIZE_BYTES
        try:
            value = int(str(raw).strip())
        except ValueError:
            raise ValidationError(
                f"table property {TARGET_FILE_SIZE_BYTES}={raw!r} must be an integer"
            ) from None
        if value <= 0:
            raise ValidationError(f"table property {TARGET_FILE_SIZE_BYTES}={raw!r} must be > 0")
        return value


@lru_cache(maxsize=64)
def _schema(text: str) -> Schema:
    return Schema.from_json(json.loads(text))


@lru_cache(maxsize=64)
def _spec(text: str) -> PartitionSpec:
    return PartitionSpec.from_json(json.loads(text))


def job_file_name(job_id: str, partition_id: int, task_attempt_id: int, n: int) -> str:
    return f"{job_id}-{partition_id:05d}-{task_attempt_id}-{n:05d}.parquet"


def is_job_file(location: str, job_id: str) -> bool:
    """Whether ``location`` is a data file written by job ``job_id`` (any attempt)."""
    name = location.rsplit("/", 1)[-1]
    return name.startswith(f"{job_id}-") and name.endswith(".parquet")


def _needs_adapting(t: IcebergType) -> bool:
    if isinstance(t, UUIDType | FixedType | TimeType | TimestampNanoType | TimestamptzNanoType):
        return True
    if isinstance(t, NestedType):
        return any(_needs_adapting(f.field_type) for f in t.fields)
    return False


def _adapt_uuid(arr: pa.Array, path: str) -> pa.Array:
    if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
        raw: list[bytes | None] = []
        for value in arr.to_pylist():
            if value is None:
                raw.append(None)
                continue
            try:
                raw.append(uuid.UUID(value).bytes)
            except ValueError:
                raise ValidationError(
                    f"column {path!r} is a uuid column, but {value!r:.60} is not a UUID"
                ) from None
        return pa.ExtensionArray.from_storage(pa.uuid(), pa.array(raw, pa.binary(16)))
    if pa.types.is_binary(arr.type) or pa.types.is_large_binary(arr.type):
        return pa.ExtensionArray.from_storage(pa.uuid(), _fixed(arr, 16, path))
    return arr


def _fixed(arr: pa.Array, length: int, path: str) -> pa.Array:
    lengths = pc.binary_length(arr)
    wrong = pc.sum(pc.not_equal(lengths, length)).as_py() or 0
    if wrong:
        sample = next(
            n for n in lengths.to_pylist() if n is not None and n != length
        )  # pragma: no branch - wrong > 0 guarantees one
        raise ValidationError(
            f"column {path!r} holds fixed[{length}] values, but {wrong} value(s) have another "
            f"length (e.g. {sample} bytes)"
        )
    return arr.cast(pa.binary(length))


def _adapt(arr: pa.Array, t: IcebergType, path: str) -> pa.Array:
    """Spark's stand-ins for types it lacks, turned into the Iceberg type's Arrow form."""
    if isinstance(t, UUIDType):
        return _adapt_uuid(arr, path)
    if isinstance(t, FixedType):
        if pa.types.is_binary(arr.type) or pa.types.is_large_binary(arr.type):
            return _fixed(arr, t.length, path)
        return arr
    if isinstance(t, TimeType):
        if pa.types.is_integer(arr.type):
            out_of_day = pc.sum(
                pc.or_(pc.less(arr, 0), pc.greater_equal(arr, _MICROS_PER_DAY))
            ).as_py()
            if out_of_day:
                raise ValidationError(
                    f"column {path!r} is a time column given as microseconds since midnight, "
                    f"but {out_of_day} value(s) are outside [0, {_MICROS_PER_DAY})"
                )
            return arr.cast(pa.int64()).cast(pa.time64("us"))
        return arr
    if isinstance(t, TimestampNanoType | TimestamptzNanoType):
        if pa.types.is_integer(arr.type):
            tz = "UTC" if isinstance(t, TimestamptzNanoType) else None
            return arr.cast(pa.int64()).cast(pa.timestamp("ns", tz=tz))
        return arr
    if isinstance(t, StructType) and pa.types.is_struct(arr.type):
        by_name = {f.name: f for f in t.fields}
        children = []
        fields = []
        flat = (
            arr.flatten() if arr.null_count else [arr.field(i) for i in range(arr.type.num_fields)]
        )
        for i in range(arr.type.num_fields):
            child_field = arr.type.field(i)
            child = flat[i]
            target = by_name.get(child_field.name)
            if target is not None and _needs_adapting(target.field_type):
                child = _adapt(child, target.field_type, f"{path}.{child_field.name}")
            children.append(child)
            fields.append(pa.field(child_field.name, child.type, child_field.nullable))
        mask = arr.is_null() if arr.null_count else None
        return pa.StructArray.from_arrays(children, fields=fields, mask=mask)
    if isinstance(t, ListType) and (pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type)):
        offsets, start, length = list_layout(arr)
        values = _adapt(arr.values.slice(start, length), t.element_type, f"{path}.element")
        mask = arr.is_null() if arr.null_count else None
        return pa.ListArray.from_arrays(offsets, values, mask=mask)
    if isinstance(t, MapType) and pa.types.is_map(arr.type):
        offsets, start, length = list_layout(arr)
        keys = _adapt(arr.keys.slice(start, length), t.key_type, f"{path}.key")
        items = _adapt(arr.items.slice(start, length), t.value_type, f"{path}.value")
        mask = arr.is_null() if arr.null_count else None
        return pa.MapArray.from_arrays(offsets, keys, items, mask=mask)
    return arr


def prepare_input(table: pa.Table, schema: Schema) -> pa.Table:
    """Spark's Arrow data shaped for :func:`~icefloe.arrow_schema.conform_table`.

    Columns are matched by name; only columns whose table type Spark cannot represent
    directly are touched (uuid from strings or 16-byte binaries, fixed[n] from binaries of
    that length, time from microseconds since midnight, nanosecond timestamps from longs).
    """
    fields = {f.name: f for f in schema.fields}
    columns = []
    changed = False
    for name, column in zip(table.column_names, table.columns):
        target = fields.get(name)
        if target is not None and _needs_adapting(target.field_type):
            column = pa.chunked_array(
                [_adapt(chunk, target.field_type, name) for chunk in column.chunks]
            )
            changed = True
        columns.append(column)
    if not changed:
        return table
    return pa.Table.from_arrays(columns, names=table.column_names)


@dataclass
class _OpenFile:
    writer: ParquetFileWriter
    location: str
    stream: io.BytesIO | None


@dataclass
class _Pending:
    """Rows of one partition waiting to become a row group."""

    tables: list[pa.Table] = field(default_factory=list)
    rows: int = 0
    nbytes: int = 0


class FanoutWriter:
    """One open data file per partition; row groups from buffered rows; rolling files."""

    def __init__(self, job: WriteJob, info: TaskInfo, task_io: TaskIO) -> None:
        self.job = job
        self.info = info
        self.io = task_io
        self.schema = job.schema
        self.spec = job.spec
        self.options = ParquetWriteOptions.from_properties(job.properties, self.schema)
        self.target = job.target_file_size_bytes
        self.data_dir = job.data_dir
        self._open: dict[tuple[Any, ...], _OpenFile] = {}
        self._pending: dict[tuple[Any, ...], _Pending] = {}
        self._buffered = 0
        self._counter = 0
        self._finished: list[DataFile] = []
        self._started: list[str] = []

    @property
    def files(self) -> list[DataFile]:
        return list(self._finished)

    def write(self, table: pa.Table) -> None:
        for partition, rows in partition_table(table, self.schema, self.spec):
            pending = self._pending.setdefault(partition, _Pending())
            pending.tables.append(rows)
            pending.rows += rows.num_rows
            pending.nbytes += rows.nbytes
            self._buffered += rows.nbytes
            if pending.rows >= self._row_group_rows(pending):
                self._flush(partition)
        while self._buffered > _MAX_BUFFERED_BYTES and self._pending:
            largest = max(self._pending, key=lambda p: self._pending[p].nbytes)
            self._flush(largest)

    def _row_group_rows(self, pending: _Pending) -> int:
        row_bytes = max(1, pending.nbytes // max(1, pending.rows))
        by_size = self.options.row_group_size_bytes // row_bytes
        by_file = self.target // row_bytes
        return max(1, min(self.options.row_group_limit, by_size, by_file))

    def _flush(self, partition: tuple[Any, ...]) -> None:
        pending = self._pending.pop(partition, None)
        if pending is None or not pending.rows:
            return
        self._buffered -= pending.nbytes
        rows = pa.concat_tables(pending.tables)
        current = self._open.get(partition) or self._start(partition)
        current.writer.write(rows)
        if current.writer.bytes_written >= self.target:
            self._finish(partition)

    def _start(self, partition: tuple[Any, ...]) -> _OpenFile:
        self._counter += 1
        directory = self.data_dir
        if self.spec.fields and not self.spec.is_unpartitioned:
            directory = f"{directory}/{self.spec.partition_path(partition, self.schema)}"
        name = job_file_name(
            self.job.job_id, self.info.partition_id, self.info.task_attempt_id, self._counter
        )
        location = f"{directory}/{name}"
        self._started.append(location)
        stream = None if is_local(location) else io.BytesIO()
        writer = ParquetFileWriter(
            location if stream is None else stream,
            schema=self.schema,
            spec=self.spec,
            partition=partition,
            properties=self.job.properties,
            file_path=location,
        )
        opened = _OpenFile(writer, location, stream)
        self._open[partition] = opened
        return opened

    def _finish(self, partition: tuple[Any, ...]) -> None:
        opened = self._open.pop(partition)
        data_file = opened.writer.close()
        if opened.stream is not None:
            self.io.upload(opened.location, opened.stream.getvalue())
        self._finished.append(data_file)

    def close(self) -> list[DataFile]:
        for partition in list(self._pending):
            self._flush(partition)
        for partition in list(self._open):
            self._finish(partition)
        return self.files

    def abort(self) -> None:
        """Stop and delete every file this writer started (best effort)."""
        for opened in self._open.values():
            opened.writer.abort()
        self._open.clear()
        self._pending.clear()
        for location in self._started:
            with contextlib.suppress(Exception):
                self.io.delete(location)


def write_task(
    job: WriteJob, batches: Iterable[pa.RecordBatch], info: TaskInfo | None = None
) -> Iterator[pa.RecordBatch]:
    """The ``mapInArrow`` body of a write: rows in, one result row per data file out."""
    info = info if info is not None else TaskInfo.current()
    task_io = TaskIO(job.table_location, job.io_properties)
    schema, spec = job.schema, job.spec
    writer = FanoutWriter(job, info, task_io)
    try:
        for batch in batches:
            if batch.num_rows:
                writer.write(prepare_input(pa.Table.from_batches([batch]), schema))
        files = writer.close()
    except BaseException:
        writer.abort()
        task_io.close()
        raise
    task_io.close()
    task_hooks().files_complete(info)
    if files:
        yield result_batch(info, files, spec, schema)


def result_batch(
    info: TaskInfo, files: Sequence[DataFile], spec: PartitionSpec, schema: Schema
) -> pa.RecordBatch:
    """What a write task reports: a row per file, its content-file JSON and its attempt."""
    return pa.RecordBatch.from_pydict(
        {
            "task_attempt_id": [info.task_attempt_id] * len(files),
            "partition_id": [info.partition_id] * len(files),
            "attempt_number": [info.attempt_number] * len(files),
            "stage_id": [info.stage_id] * len(files),
            "file": [json.dumps(content_file_to_json(f, spec, schema)) for f in files],
        },
        schema=WRITE_RESULT_ARROW,
    )


# ---------------------------------------------------------------------------------------
# Writing changes by key (upsert, delete)
# ---------------------------------------------------------------------------------------


def key_file_name(job_id: str, partition_id: int, task_attempt_id: int) -> str:
    """A task attempt's key file: a job file (:func:`is_job_file`), so clean-up finds it."""
    return f"{job_id}-{partition_id:05d}-{task_attempt_id}-keys.parquet"


def change_rows_task(
    spec: ChangeSpec, batches: Iterable[pa.RecordBatch], info: TaskInfo | None = None
) -> Iterator[pa.RecordBatch]:
    """The ``mapInArrow`` body that turns input rows into change rows
    (:func:`~icefloe.spark.changes.normalize`), before they are partitioned by key.

    Arrival positions start at ``partition id << 40``, so they are distinct across tasks
    and follow the input's order within each."""
    info = info if info is not None else TaskInfo.current()
    seen = 0
    for batch in batches:
        if not batch.num_rows:
            continue
        rows = normalize(pa.Table.from_batches([batch]), spec, (info.partition_id << 40) + seen)
        seen += batch.num_rows
        yield from rows.to_batches(max_chunksize=_OUTPUT_BATCH_ROWS)


def write_key_file(
    job: WriteJob, info: TaskInfo, task_io: TaskIO, spec: ChangeSpec, keys: pa.Table
) -> DataFile:
    """One Parquet file of ``keys`` (flat key columns) with the key columns' field ids and
    metrics, described as an equality-delete file over the identifier fields.

    It carries the table's current spec with every partition value null: a key file names
    keys wherever their rows live, and is never committed (the coordinator resolves it)."""
    schema, table_spec = job.schema, job.spec
    key_schema = schema.select(list(spec.keys))
    location = (
        f"{job.data_dir}/{key_file_name(job.job_id, info.partition_id, info.task_attempt_id)}"
    )
    stream = None if is_local(location) else io.BytesIO()
    writer = ParquetFileWriter(
        location if stream is None else stream,
        schema=key_schema,
        spec=table_spec,
        partition=tuple(None for _ in table_spec.fields),
        properties=job.properties,
        file_path=location,
    )
    try:
        writer.write(prepare_input(nest_keys(keys, spec.keys), key_schema))
        written = writer.close()
    except BaseException:
        writer.abort()
        raise
    if stream is not None:
        task_io.upload(location, stream.getvalue())
    return written.copy(
        content=DataFileContent.EQUALITY_DELETES,
        equality_ids=list(schema.identifier_field_ids),
    )


def change_task(
    job: WriteJob,
    spec: ChangeSpec,
    batches: Iterable[pa.RecordBatch],
    info: TaskInfo | None = None,
) -> Iterator[pa.RecordBatch]:
    """The ``mapInArrow`` body of an upsert or delete by key, over change rows partitioned
    so that every change of a key is in this task: fold them to the last change per key
    (:func:`~icefloe.spark.changes.fold`), write the surviving rows as data files
    (partitioned as the table) and every key touched as one key file; one result row per
    file, as :func:`write_task`'s."""
    info = info if info is not None else TaskInfo.current()
    tables = [pa.Table.from_batches([b]) for b in batches if b.num_rows]
    if not tables:
        return
    folded = fold(pa.concat_tables(tables), spec)
    del tables
    task_io = TaskIO(job.table_location, job.io_properties)
    schema, table_spec = job.schema, job.spec
    writer = FanoutWriter(job, info, task_io)
    key_file: DataFile | None = None
    try:
        if folded.rows.num_rows:
            writer.write(prepare_input(folded.rows, schema))
        files = writer.close()
        key_file = write_key_file(job, info, task_io, spec, folded.keys)
    except BaseException:
        writer.abort()
        with contextlib.suppress(Exception):
            task_io.delete(
                f"{job.data_dir}/{key_file_name(job.job_id, info.partition_id, info.task_attempt_id)}"
            )
        task_io.close()
        raise
    task_io.close()
    task_hooks().files_complete(info)
    yield result_batch(info, [*files, key_file], table_spec, schema)


# ---------------------------------------------------------------------------------------
# Reading: filters as Arrow masks
# ---------------------------------------------------------------------------------------


def column_by_id(table: pa.Table, schema: Schema, field_id: int) -> pa.Array:
    """The values of a (possibly nested) column of ``table``, a table shaped as ``schema``.

    A null struct on the way makes its fields null, as the spec's accessors read them.
    """
    path: list[NestedField] = []
    fid: int | None = field_id
    while fid is not None:
        path.append(schema.field(fid))
        fid = schema.parent_id(fid)
    path.reverse()
    if any(not isinstance(schema.field(p.field_id).field_type, StructType) for p in path[:-1]):
        raise ValidationError(
            f"column {schema.find_column_name(field_id)!r} is inside a list or map: it has no "
            "single value per row"
        )
    column = table.column(path[0].name).combine_chunks()
    for f in path[1:]:
        index = column.type.get_field_index(f.name)
        column = column.flatten()[index]
    return column


def _literal_array(t: IcebergType, values: Sequence[Any], like: pa.DataType) -> pa.Array:
    arr = to_arrow_array(t, list(values))
    if isinstance(arr, pa.ExtensionArray):
        arr = arr.storage
    if not arr.type.equals(like):
        arr = arr.cast(like)
    return arr


class _MaskBuilder(BooleanExpressionVisitor[pa.Array]):
    """A non-null boolean mask per predicate, combined with plain two-valued logic.

    Each leaf already folds Iceberg's null semantics into its result (``x != 5`` is true
    for a null ``x``, ``x < 5`` false), so AND, OR and NOT never see a null.
    """

    def __init__(self, table: pa.Table, schema: Schema) -> None:
        self.table = table
        self.schema = schema
        self.n = table.num_rows

    def _constant(self, value: bool) -> pa.Array:
        return pa.repeat(pa.scalar(value), self.n)

    def visit_true(self) -> pa.Array:
        return self._constant(True)

    def visit_false(self) -> pa.Array:
        return self._constant(False)

    def visit_not(self, child_result: pa.Array) -> pa.Array:
        return pc.invert(child_result)

    def visit_and(self, left_result: pa.Array, right_result: pa.Array) -> pa.Array:
        return pc.and_(left_result, right_result)

    def visit_or(self, left_result: pa.Array, right_result: pa.Array) -> pa.Array:
        return pc.or_(left_result, right_result)

    def _values(self, predicate: BoundPredicate) -> tuple[pa.Array, IcebergType]:
        term = predicate.term
        if isinstance(term, BoundReference):
            values = column_by_id(self.table, self.schema, term.field_id)
            result_type = term.field_type
        elif isinstance(term, BoundTransform):
            source = column_by_id(self.table, self.schema, term.ref.field_id)
            values = term.transform.apply_array(term.ref.field_type, source)
            if isinstance(values, pa.ChunkedArray):
                values = values.combine_chunks()
            result_type = term.result_type
        else:  # pragma: no cover - binding produces only these two
            raise ValidationError(f"cannot evaluate term {term!r}")
        if isinstance(values, pa.ExtensionArray):
            values = values.storage
        if pa.types.is_dictionary(values.type):
            values = values.dictionary_decode()
        return values, result_type

    def visit_bound_predicate(self, predicate: BoundPredicate) -> pa.Array:
        values, t = self._values(predicate)
        op = predicate.op
        if op is Operation.IS_NULL:
            return values.is_null()
        if op is Operation.NOT_NULL:
            return values.is_valid()
        if op is Operation.IS_NAN:
            return pc.fill_null(pc.is_nan(values), False)
        if op is Operation.NOT_NAN:
            return pc.fill_null(pc.invert(pc.is_nan(values)), True)
        if isinstance(predicate, BoundSetPredicate):
            value_set = _literal_array(t, sorted(predicate.literals, key=repr), values.type)
            if pa.types.is_floating(values.type):
                # is_in hashes bit patterns; make -0.0 match 0.0 as the comparisons do.
                values, value_set = pc.add(values, 0.0), pc.add(value_set, 0.0)
            found = pc.is_in(values, value_set=value_set)
            return pc.invert(found) if op is Operation.NOT_IN else found
        if not isinstance(predicate, BoundLiteralPredicate):  # pragma: no cover
            raise ValidationError(f"cannot evaluate predicate {predicate}")
        if op in (Operation.STARTS_WITH, Operation.NOT_STARTS_WITH):
            found = pc.fill_null(pc.starts_with(values, pattern=predicate.literal), False)
            return pc.invert(found) if op is Operation.NOT_STARTS_WITH else found
        literal = _literal_array(t, [predicate.literal], values.type)[0]
        compare = {
            Operation.LT: pc.less,
            Operation.LT_EQ: pc.less_equal,
            Operation.GT: pc.greater,
            Operation.GT_EQ: pc.greater_equal,
            Operation.EQ: pc.equal,
            Operation.NOT_EQ: pc.not_equal,
        }[op]
        return pc.fill_null(compare(values, literal), op is Operation.NOT_EQ)


def filter_mask(table: pa.Table, schema: Schema, expr: BooleanExpression) -> pa.Array:
    """Which rows of ``table`` (shaped as ``schema``) a bound expression accepts."""
    if isinstance(expr, AlwaysTrue):
        return pa.repeat(pa.scalar(True), table.num_rows)
    if isinstance(expr, AlwaysFalse):
        return pa.repeat(pa.scalar(False), table.num_rows)
    return visit(expr, _MaskBuilder(table, schema))


# ---------------------------------------------------------------------------------------
# Reading: deletes
# ---------------------------------------------------------------------------------------


def _placeholder(dt: pa.DataType) -> pa.Scalar:
    """Any non-null value of ``dt``: stands in for nulls in null-safe join keys."""
    if pa.types.is_boolean(dt):
        return pa.scalar(False)
    if pa.types.is_string(dt) or pa.types.is_large_string(dt):
        return pa.scalar("", dt)
    if pa.types.is_binary(dt) or pa.types.is_large_binary(dt):
        return pa.scalar(b"", dt)
    if pa.types.is_fixed_size_binary(dt):
        return pa.scalar(b"\x00" * dt.byte_width, dt)
    if pa.types.is_floating(dt):
        return pa.scalar(0.0, dt)
    return pa.array([0], pa.int64()).cast(dt)[0]


def _key_columns(columns: Sequence[pa.Array]) -> dict[str, pa.Array]:
    """Null-safe join keys: per column, a null flag and the value with nulls filled."""
    keys: dict[str, pa.Array] = {}
    for i, column in enumerate(columns):
        if isinstance(column, pa.ExtensionArray):
            column = column.storage
        if pa.types.is_dictionary(column.type):
            column = column.dictionary_decode()
        keys[f"n{i}"] = column.is_null().cast(pa.int8())
        filled = pc.coalesce(column, _placeholder(column.type)) if column.null_count else column
        keys[f"v{i}"] = filled.cast(pa.int8()) if pa.types.is_boolean(filled.type) else filled
    return keys


def equality_delete_mask(
    data_keys: Sequence[pa.Array], delete_keys: Sequence[pa.Array]
) -> pa.Array:
    """True for data rows whose key equals some delete row's key (null equals null)."""
    n = len(data_keys[0]) if data_keys else 0
    if not n or not delete_keys or not len(delete_keys[0]):
        return pa.repeat(pa.scalar(False), n)
    left = pa.table({**_key_columns(data_keys), "__row": pa.array(range(n), pa.int64())})
    right = (
        pa.table(_key_columns(delete_keys))
        .group_by([f"{k}{i}" for i in range(len(delete_keys)) for k in ("n", "v")])
        .aggregate([])
    )
    names = [c for c in right.column_names]
    matched = left.join(right, keys=names, join_type="left semi", use_threads=False)
    return pc.is_in(left.column("__row"), value_set=matched.column("__row"))


@dataclass
class _DeleteCache:
    """Delete files read once per task, whatever number of data files they apply to."""

    positions: dict[str, pa.Table] = field(default_factory=dict)
    equality: dict[str, tuple[Schema, pa.Table]] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------
# Reading: scan tasks
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReadJob:
    """Everything a read task needs besides the scan tasks themselves."""

    table_schema_json: str
    read_schema_json: str
    output_names: tuple[str, ...]
    specs_json: str
    table_location: str
    io_properties: Mapping[str, str]
    output_schema: pa.Schema
    case_sensitive: bool = True
    # v3 rewrites: read ``_row_id`` and ``_last_updated_sequence_number`` with inheritance
    # (each task then needs its "data-sequence-number"); see icefloe.row_lineage.
    row_lineage: bool = False

    @property
    def table_schema(self) -> Schema:
        return _schema(self.table_schema_json)

    @property
    def read_schema(self) -> Schema:
        return _schema(self.read_schema_json)

    @property
    def specs(self) -> dict[int, PartitionSpec]:
        return _specs(self.specs_json)


@lru_cache(maxsize=16)
def _specs(text: str) -> dict[int, PartitionSpec]:
    specs = [PartitionSpec.from_json(s) for s in json.loads(text)]
    return {s.spec_id: s for s in specs}


def _identity_constants(data_file: DataFile, spec: PartitionSpec, schema: Schema) -> dict[int, Any]:
    """Identity partition values: what a column absent from the file reads as."""
    out: dict[int, Any] = {}
    for pf, value in zip(spec.fields, data_file.partition):
        if isinstance(pf.transform, IdentityTransform) and schema.find_field(pf.source_id):
            out[pf.source_id] = value
    return out


class ScanTaskReader:
    """Reads the scan tasks of one Spark partition; delete files are read once each."""

    def __init__(self, job: ReadJob, task_io: TaskIO) -> None:
        self.job = job
        self.io = task_io
        self.table_schema = job.table_schema
        self.read_schema = (
            with_lineage_fields(job.read_schema) if job.row_lineage else job.read_schema
        )
        self.specs = job.specs
        self.cache = _DeleteCache()

    def _content_file(self, obj: Any, what: str) -> DataFile:
        try:
            return content_file_from_json(obj, specs=self.specs, schema=self.table_schema)
        except ValidationError as e:
            raise ValidationError(f"scan task {what}: {e}") from None

    def read(self, task: Mapping[str, Any]) -> pa.Table:
        data_file = self._content_file(task.get("data-file"), "data-file")
        if data_file.file_format != FileFormat.PARQUET:
            raise InvalidFileError(
                data_file.file_path,
                f"{data_file.file_format} data files are not supported; icefloe reads Parquet",
            )
        deletes = [self._content_file(d, "delete file") for d in task.get("delete-files", ())]
        equality = [d for d in deletes if d.content == DataFileContent.EQUALITY_DELETES]
        positions = [d for d in deletes if d.content == DataFileContent.POSITION_DELETES]
        equality_schemas = [self._equality_schema(d) for d in equality]
        read_schema = self._with_extra_columns(equality_schemas)
        spec = self.specs[data_file.spec_id]
        table = read_data_file(
            self.io.source(data_file.file_path),
            read_schema,
            constants=_identity_constants(data_file, spec, read_schema),
            location=data_file.file_path,
        )
        if self.job.row_lineage:
            # Before any row is dropped: an inherited _row_id is first_row_id + position.
            table = with_row_lineage(
                table,
                first_row_id=data_file.first_row_id,
                data_sequence_number=_data_sequence_number(task, data_file),
            )
        keep: pa.Array | None = None
        if positions and table.num_rows:
            deleted = self._deleted_positions(data_file.file_path, positions)
            if len(deleted):
                rows = pa.array(range(table.num_rows), pa.int64())
                keep = pc.invert(pc.is_in(rows, value_set=deleted))
        for delete_file, eq_schema in zip(equality, equality_schemas):
            if not table.num_rows:
                break
            _, delete_rows = self.cache.equality[delete_file.file_path]
            ids = list(delete_file.equality_ids or [])
            hit = equality_delete_mask(
                [column_by_id(table, read_schema, fid) for fid in ids],
                [column_by_id(delete_rows, eq_schema, fid) for fid in ids],
            )
            keep = pc.invert(hit) if keep is None else pc.and_(keep, pc.invert(hit))
        residual = task.get("residual-filter")
        if residual is not None and residual is not True:
            try:
                bound = bind(self.table_schema, parse_expression(residual), self.job.case_sensitive)
            except ValidationError as e:
                raise ValidationError(
                    f"scan task for {data_file.file_path}: residual filter does not apply: {e}"
                ) from None
            mask = filter_mask(table, read_schema, bound)
            keep = mask if keep is None else pc.and_(keep, mask)
        if keep is not None:
            table = table.filter(keep)
        return table.select(list(self.job.output_names))

    def _with_extra_columns(self, equality_schemas: Sequence[Schema]) -> Schema:
        """The read schema plus delete columns it lacks (columns dropped since, say)."""
        extra: list[NestedField] = []
        known = {f.field_id for f in self.read_schema.all_fields()}
        for eq_schema in equality_schemas:
            for f in eq_schema.fields:
                if f.field_id not in known:
                    extra.append(f.replace(name=f"__icefloe_delete_{f.field_id}", required=False))
                    known.add(f.field_id)
        if not extra:
            return self.read_schema
        return Schema(*self.read_schema.fields, *extra, schema_id=self.read_schema.schema_id)

    def _equality_schema(self, delete_file: DataFile) -> Schema:
        cached = self.cache.equality.get(delete_file.file_path)
        if cached is not None:
            return cached[0]
        ids = list(delete_file.equality_ids or [])
        source = self.io.source(delete_file.file_path)
        import pyarrow.parquet as pq

        try:
            handle = pa.BufferReader(source) if isinstance(source, bytes) else source
            file_schema = arrow_to_schema(pq.read_schema(handle))
        except (pa.ArrowException, OSError, ValidationError) as e:
            raise InvalidFileError(delete_file.file_path, f"unreadable delete file: {e}") from e
        names: list[str] = []
        for fid in ids:
            name = file_schema.find_column_name(fid)
            if name is None:
                raise InvalidFileError(
                    delete_file.file_path,
                    f"equality field id {fid} is not a column of the delete file",
                )
            names.append(name)
        eq_schema = file_schema.select(names)
        rows = read_data_file(source, eq_schema, location=delete_file.file_path)
        self.cache.equality[delete_file.file_path] = (eq_schema, rows)
        return eq_schema

    def _deletion_vector(self, delete_file: DataFile) -> DeletionVector:
        """The DV blob the entry points at: one ranged read, length, magic and CRC checked."""
        if delete_file.content_offset is None or delete_file.content_size_in_bytes is None:
            raise InvalidFileError(
                delete_file.file_path,
                "deletion vector entry has no content-offset/content-size-in-bytes",
            )
        blob = self.io.read_range(
            delete_file.file_path, delete_file.content_offset, delete_file.content_size_in_bytes
        )
        return deletion_vector_from_blob(blob, delete_file)

    def _deleted_positions(self, data_path: str, delete_files: Sequence[DataFile]) -> pa.Array:
        found: list[pa.Array] = []
        for delete_file in delete_files:
            if is_deletion_vector(delete_file):
                if delete_file.referenced_data_file != data_path:
                    continue
                found.append(pa.array(self._deletion_vector(delete_file).to_numpy()))
                continue
            if (
                delete_file.referenced_data_file is not None
                and delete_file.referenced_data_file != data_path
            ):
                continue
            rows = self.cache.positions.get(delete_file.file_path)
            if rows is None:
                rows = read_position_deletes(
                    self.io.source(delete_file.file_path), delete_file.file_path
                )
                self.cache.positions[delete_file.file_path] = rows
            mine = rows.filter(pc.equal(rows.column("file_path"), data_path))
            found.extend(mine.column("pos").chunks)
        if not found:
            return pa.array([], pa.int64())
        return pa.concat_arrays([c.cast(pa.int64()) for c in found])


def _data_sequence_number(task: Mapping[str, Any], data_file: DataFile) -> int:
    """The task's ``data-sequence-number``, which lineage inheritance needs."""
    value = task.get("data-sequence-number")
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValidationError(
            f"scan task for {data_file.file_path}: reading row lineage needs a non-negative "
            f"integer data-sequence-number, got {value!r}"
        )
    return value


def read_position_deletes(source: str | bytes, location: str) -> pa.Table:
    """The ``file_path`` and ``pos`` columns of a position delete file, found by field id.

    Their ids are reserved (above any table column's), so they are read here directly
    rather than through a table :class:`~icefloe.schema.Schema`.
    """
    import pyarrow.parquet as pq

    try:
        handle = pa.BufferReader(source) if isinstance(source, bytes) else source
        parquet = pq.ParquetFile(handle)
        wanted = {POSITION_DELETE_PATH_ID: "file_path", POSITION_DELETE_POS_ID: "pos"}
        names: dict[str, str] = {}
        for f in parquet.schema_arrow:
            fid = field_id_of(f)
            if fid in wanted:
                names[wanted[fid]] = f.name
        if set(names) != {"file_path", "pos"}:
            raise InvalidFileError(
                location,
                "not a position delete file: columns with field ids "
                f"{POSITION_DELETE_PATH_ID} (file_path) and {POSITION_DELETE_POS_ID} (pos) "
                "are required",
            )
        data = parquet.read(columns=[names["file_path"], names["pos"]])
    except (pa.ArrowException, OSError) as e:
        raise InvalidFileError(location, f"unreadable position delete file: {e}") from e
    return pa.table(
        {
            "file_path": data.column(0).cast(pa.large_string()),
            "pos": data.column(1).cast(pa.int64()),
        }
    )


def to_spark_arrow(arr: pa.Array, target: pa.DataType) -> pa.Array:
    """Arrow data of Iceberg's types recast to the Arrow types Spark expects.

    uuid becomes its canonical string, fixed becomes binary, time and nanosecond
    timestamps become longs (microseconds since midnight, nanoseconds since the epoch),
    and the large string and binary types become the 32-bit ones Spark reads.
    """
    if arr.type.equals(target):
        return arr
    if isinstance(arr, pa.ExtensionArray) and isinstance(arr.type, pa.UuidType):
        text = [None if b is None else str(uuid.UUID(bytes=b)) for b in arr.storage.to_pylist()]
        return pa.array(text, target)
    if pa.types.is_struct(target):
        children = (
            arr.flatten() if arr.null_count else [arr.field(i) for i in range(arr.type.num_fields)]
        )
        converted = [
            to_spark_arrow(child, target.field(i).type) for i, child in enumerate(children)
        ]
        fields = [target.field(i) for i in range(target.num_fields)]
        return pa.StructArray.from_arrays(
            converted, fields=fields, mask=arr.is_null() if arr.null_count else None
        )
    if pa.types.is_map(target):
        offsets, start, length = list_layout(arr)
        keys = to_spark_arrow(arr.keys.slice(start, length), target.key_type)
        items = to_spark_arrow(arr.items.slice(start, length), target.item_type)
        return pa.MapArray.from_arrays(
            offsets, keys, items, type=target, mask=arr.is_null() if arr.null_count else None
        )
    if pa.types.is_list(target):
        offsets, start, length = list_layout(arr)
        values = to_spark_arrow(arr.values.slice(start, length), target.value_type)
        return pa.ListArray.from_arrays(
            offsets, values, type=target, mask=arr.is_null() if arr.null_count else None
        )
    if pa.types.is_null(target):
        return pa.nulls(len(arr))
    return arr.cast(target)


def to_spark_table(table: pa.Table, schema: pa.Schema) -> pa.Table:
    columns = [
        pa.chunked_array([to_spark_arrow(c, f.type) for c in col.chunks], type=f.type)
        for col, f in zip(table.columns, schema)
    ]
    return pa.Table.from_arrays(columns, schema=schema)


def read_task(job: ReadJob, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The ``mapInArrow`` body of a read: scan tasks (JSON) in, table rows out."""
    task_io = TaskIO(job.table_location, job.io_properties)
    reader = ScanTaskReader(job, task_io)
    try:
        for batch in batches:
            for text in batch.column(READ_TASK_COLUMN).to_pylist():
                if text is None:
                    continue
                try:
                    task = json.loads(text)
                except ValueError as e:
                    raise ValidationError(f"scan task is not JSON: {e}") from None
                table = to_spark_table(reader.read(task), job.output_schema)
                yield from table.to_batches(max_chunksize=_OUTPUT_BATCH_ROWS)
    finally:
        task_io.close()


__all__ = [
    "READ_TASK_COLUMN",
    "WRITE_RESULT_ARROW",
    "WRITE_RESULT_SCHEMA",
    "FanoutWriter",
    "ReadJob",
    "ScanTaskReader",
    "TaskHooks",
    "TaskIO",
    "TaskInfo",
    "WriteJob",
    "change_rows_task",
    "change_task",
    "column_by_id",
    "equality_delete_mask",
    "filter_mask",
    "install_task_hooks",
    "is_job_file",
    "job_file_name",
    "key_file_name",
    "prepare_input",
    "read_task",
    "result_batch",
    "task_hooks",
    "to_spark_arrow",
    "to_spark_table",
    "write_key_file",
    "write_task",
]
