"""What runs inside Spark tasks to write: Parquet data files, and the key files of upserts.

Writing
-------
:func:`write_task` is a ``mapInArrow`` function. It shapes Spark's Arrow batches into the
table schema (Spark has no uuid, fixed, time or nanosecond types, so those arrive as
strings, binaries and longs and are converted with checks here, the rest is
:func:`~icefloe.arrow.schema.conform_table`), splits rows by partition with the table's
spec (:func:`~icefloe.parquet.files.partition_table`, vectorized), and keeps one open
:class:`~icefloe.parquet.files.ParquetFileWriter` per partition: rows are buffered per partition
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
complete, and before it reports them, a task tells the worker's :class:`~icefloe.spark.tasks.TaskHooks` (the
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

Why a module: this is the worker side of every write and compaction job, with its own
rules (file names the driver's clean-up finds, one attempt's rows per partition, files
deleted when a task raises); task identity, hooks and storage are :mod:`icefloe.spark.tasks`.
About 600 lines: the type adapters Spark needs and the fan-out writer are most of it.
"""

from __future__ import annotations

import contextlib
import io
import json
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from icefloe.arrow.schema import list_layout
from icefloe.errors import ValidationError
from icefloe.parquet.files import ParquetFileWriter, partition_table
from icefloe.parquet.options import (
    DEFAULT_TARGET_FILE_SIZE_BYTES,
    TARGET_FILE_SIZE_BYTES,
    ParquetWriteOptions,
)
from icefloe.spark.changes import ChangeSpec, fold, nest_keys, normalize
from icefloe.spark.tasks import (
    OUTPUT_BATCH_ROWS,
    TaskInfo,
    TaskIO,
    is_local,
    schema_from_json,
    task_hooks,
)
from icefloe.spec.content_file import content_file_to_json
from icefloe.spec.datafile import DataFile, DataFileContent
from icefloe.spec.partition import PartitionSpec
from icefloe.spec.schema import Schema
from icefloe.spec.types import (
    FixedType,
    IcebergType,
    ListType,
    MapType,
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

_MICROS_PER_DAY = 86_400_000_000
_MAX_BUFFERED_BYTES = 256 << 20
"""Rows a task may hold across all partitions before flushing the largest buffers early."""


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
        return schema_from_json(self.schema_json)

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
    """Spark's Arrow data shaped for :func:`~icefloe.arrow.schema.conform_table`.

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
        yield from rows.to_batches(max_chunksize=OUTPUT_BATCH_ROWS)


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


__all__ = [
    "WRITE_RESULT_ARROW",
    "WRITE_RESULT_SCHEMA",
    "FanoutWriter",
    "WriteJob",
    "change_rows_task",
    "change_task",
    "is_job_file",
    "job_file_name",
    "key_file_name",
    "prepare_input",
    "result_batch",
    "write_key_file",
    "write_task",
]
