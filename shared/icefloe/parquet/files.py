"""Iceberg data files in Parquet: write them with field ids and metrics, read them by id.

Writers (Spark tasks, the demo, interop tests) hand this module an Arrow table and get back
Parquet bytes plus the :class:`~icefloe.spec.datafile.DataFile` that describes them, ready for a
"files written" event: one file (:class:`ParquetFileWriter`, :func:`write_data_file`), or
rows split by partition and rolled at the target file size (:func:`write_partitioned`).
Readers get an Arrow table projected by field id onto the read schema
(:func:`read_data_file`), so renamed, added and promoted columns read as the table says.

Two parts live apart: the table properties that configure a write
(:mod:`icefloe.parquet.options`) and the column metrics taken from the footer the writer
just produced (:mod:`icefloe.parquet.metrics`).

Output goes to a local path or to any writable binary stream: object stores are reached
through :class:`~icefloe.io.fileio.FileIO` by writing into memory first
(:class:`MemoryOutputs`, :func:`write_files`), because FileIO uploads whole objects.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from typing import IO, TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from icefloe.arrow.schema import (
    arrow_to_schema,
    conform_table,
    field_id_of,
    file_schema_to_arrow,
    from_arrow_array,
    project_table,
)
from icefloe.errors import InvalidFileError, ValidationError
from icefloe.parquet.metrics import compute_metrics
from icefloe.parquet.options import (
    DATA_PATH,
    MetricsConfig,
    ParquetWriteOptions,
    target_file_size,
)
from icefloe.spec.datafile import DataFile, DataFileContent, FileFormat
from icefloe.spec.schema import Schema
from icefloe.spec.types import (
    IcebergType,
    NestedField,
    NestedType,
    PrimitiveType,
    walk_fields,
)

if TYPE_CHECKING:
    from icefloe.io.fileio import FileIO
    from icefloe.spec.partition import PartitionSpec
    from icefloe.spec.sort_order import SortOrder


log = logging.getLogger(__name__)

ICEBERG_SCHEMA_KEY = "iceberg.schema"

# ---------------------------------------------------------------------------------------
# Writing one file
# ---------------------------------------------------------------------------------------


class _CountingSink:
    """A write-only stream that counts bytes, so the file size is known without a stat."""

    def __init__(self, inner: IO[bytes]) -> None:
        self._inner = inner
        self.count = 0
        self.closed = False

    def write(self, data: Any) -> int:
        self._inner.write(data)
        n = memoryview(data).nbytes
        self.count += n
        return n

    def tell(self) -> int:
        return self.count

    def flush(self) -> None:
        self._inner.flush()

    def writable(self) -> bool:
        return True

    def close(self) -> None:
        # The caller owns the underlying stream (and may still need its buffer).
        self.closed = True


Output = str | os.PathLike[str] | IO[bytes]


def _local_path(location: str) -> str:
    if location.startswith("file://"):
        return location[len("file://") :]
    if location.startswith("file:"):
        return location[len("file:") :]
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*://", location):
        raise ValidationError(
            f"cannot open {location!r} as a local file; write into memory "
            "(MemoryOutputs / io.BytesIO) and upload it with a FileIO"
        )
    return location


class ParquetFileWriter:
    """Writes one Iceberg data file, possibly in several appends, and describes it.

    Each :meth:`write` call conforms the rows to ``schema`` and adds row groups of at most
    ``write.parquet.row-group-size-bytes`` (estimated) and ``row-group-limit`` rows;
    :attr:`bytes_written` lets a caller roll to a new file at a target size. :meth:`close`
    finishes the footer and returns the DataFile with its metrics.
    """

    def __init__(
        self,
        output: Output,
        *,
        schema: Schema,
        spec: PartitionSpec | None = None,
        partition: tuple[Any, ...] = (),
        properties: Mapping[str, str] | None = None,
        file_path: str | None = None,
        sort_order: SortOrder | None = None,
    ) -> None:
        n_fields = len(spec.fields) if spec is not None else 0
        if not isinstance(partition, tuple) or len(partition) != n_fields:
            raise ValidationError(
                f"partition {partition!r:.200} does not match partition spec "
                f"{spec.spec_id if spec is not None else 0} with {n_fields} fields"
            )
        if spec is not None and spec.has_unknown_transform:
            raise ValidationError(
                f"cannot write data with partition spec {spec.spec_id}: it uses a transform "
                "this implementation does not know"
            )
        if isinstance(output, (str, os.PathLike)):
            location = os.fspath(output)
            self.file_path = file_path or location
        elif file_path is None:
            raise ValidationError("file_path is required when writing to a stream")
        else:
            self.file_path = file_path
        self.schema = schema
        self.spec_id = spec.spec_id if spec is not None else 0
        self.partition = partition
        self.sort_order_id = sort_order.order_id if sort_order is not None else None
        props = properties or {}
        self.options = ParquetWriteOptions.from_properties(props, schema)
        self.metrics_config = MetricsConfig.from_properties(schema, props, sort_order)
        self.arrow_schema = file_schema_to_arrow(
            schema, metadata={ICEBERG_SCHEMA_KEY: json.dumps(schema.to_json())}
        )
        self._written: list[pa.Table] = []
        self._collector: list[pq.FileMetaData] = []
        self._exit = contextlib.ExitStack()
        self._owned_path: str | None = None
        try:
            stream: IO[bytes]
            if isinstance(output, (str, os.PathLike)):
                path = _local_path(os.fspath(output))
                parent = os.path.dirname(path)
                if parent:
                    os.makedirs(parent, exist_ok=True)
                stream = self._exit.enter_context(open(path, "wb"))  # noqa: SIM115
                self._owned_path = path
            else:
                stream = output
            self._sink = _CountingSink(stream)
            self._writer = pq.ParquetWriter(
                self._sink,
                self.arrow_schema,
                metadata_collector=self._collector,
                **self.options.writer_kwargs(self.arrow_schema),
            )
        except OSError as e:
            self._exit.close()
            raise InvalidFileError(self.file_path, f"cannot open for writing: {e}") from e
        except BaseException:
            self._exit.close()
            raise
        self._closed = False

    @property
    def bytes_written(self) -> int:
        return self._sink.count

    @property
    def rows_written(self) -> int:
        return sum(t.num_rows for t in self._written)

    def write(self, table: pa.Table) -> None:
        if self._closed:
            raise ValidationError(f"data file {self.file_path!r} is already closed")
        conformed = conform_table(table, self.schema)
        if conformed.num_rows == 0:
            return
        rows = self.options.rows_per_row_group(conformed)
        try:
            self._writer.write_table(conformed, row_group_size=rows)
        except (pa.ArrowException, OSError) as e:
            raise InvalidFileError(self.file_path, f"Parquet write failed: {e}") from e
        self._written.append(conformed)

    def close(self) -> DataFile:
        if self._closed:
            raise ValidationError(f"data file {self.file_path!r} is already closed")
        self._closed = True
        try:
            self._writer.close()
            self._sink.flush()
        except (pa.ArrowException, OSError) as e:
            raise InvalidFileError(self.file_path, f"Parquet write failed: {e}") from e
        finally:
            self._exit.close()
        if not self._collector:
            raise InvalidFileError(self.file_path, "the Parquet writer produced no footer")
        data = pa.concat_tables(self._written) if self._written else self.arrow_schema.empty_table()
        metrics = compute_metrics(
            self._collector[0], self.schema, self.metrics_config, data=data, location=self.file_path
        )
        return DataFile(
            file_path=self.file_path,
            file_format=FileFormat.PARQUET,
            partition=self.partition,
            record_count=metrics.record_count,
            file_size_in_bytes=self._sink.count,
            content=DataFileContent.DATA,
            spec_id=self.spec_id,
            column_sizes=metrics.column_sizes,
            value_counts=metrics.value_counts,
            null_value_counts=metrics.null_value_counts,
            nan_value_counts=metrics.nan_value_counts,
            lower_bounds=metrics.lower_bounds,
            upper_bounds=metrics.upper_bounds,
            split_offsets=metrics.split_offsets,
            sort_order_id=self.sort_order_id,
        )

    def abort(self) -> None:
        """Stop without a DataFile. A local file this writer created is removed; a partial
        stream is the caller's to discard."""
        if not self._closed:
            self._closed = True
            with contextlib.suppress(pa.ArrowException, OSError):
                self._writer.close()
            self._exit.close()
            if self._owned_path is not None:
                with contextlib.suppress(OSError):
                    os.remove(self._owned_path)


def write_data_file(
    table: pa.Table,
    output: Output,
    *,
    schema: Schema,
    spec: PartitionSpec | None = None,
    partition: tuple[Any, ...] = (),
    properties: Mapping[str, str] | None = None,
    file_path: str | None = None,
    sort_order: SortOrder | None = None,
) -> DataFile:
    """Write ``table`` as one Parquet data file and return its DataFile.

    ``output`` is a local path (or ``file:`` URI), or a writable binary stream such as
    ``io.BytesIO`` for object stores, in which case ``file_path`` (the location the bytes
    will be uploaded to) is required. ``partition`` is the tuple of partition values of
    every row, in ``spec`` field order; see :func:`partition_table` to compute it.
    """
    writer = ParquetFileWriter(
        output,
        schema=schema,
        spec=spec,
        partition=partition,
        properties=properties,
        file_path=file_path,
        sort_order=sort_order,
    )
    try:
        writer.write(table)
    except BaseException:
        writer.abort()
        raise
    return writer.close()


# ---------------------------------------------------------------------------------------
# Partitioning and rolling
# ---------------------------------------------------------------------------------------


def _source_column(table: pa.Table, schema: Schema, source_id: int, what: str) -> pa.ChunkedArray:
    name = schema.find_column_name(source_id)
    if name is None:
        raise ValidationError(f"{what}: source column id {source_id} is not in the schema")
    if schema.is_in_list_or_map(source_id):
        raise ValidationError(f"{what}: source column {name!r} is inside a list or map")
    # Walk struct parents by field name; flatten() nulls children of null structs.
    path: list[NestedField] = []
    fid: int | None = source_id
    while fid is not None:
        path.append(schema.field(fid))
        fid = schema.parent_id(fid)
    path.reverse()
    column: pa.ChunkedArray = table.column(path[0].name)
    for f in path[1:]:
        chunks = []
        for chunk in column.chunks:
            idx = chunk.type.get_field_index(f.name)
            chunks.append(chunk.flatten()[idx])
        column = pa.chunked_array(chunks, type=column.type.field(f.name).type)
    return column


def _row_numbers(n: int) -> pa.Array:
    if n == 0:
        return pa.array([], pa.int64())
    return pc.subtract(pc.cumulative_sum(pa.repeat(pa.scalar(1, pa.int64()), n)), 1)


def _grouping_key(arr: pa.Array) -> pa.Array:
    if isinstance(arr, pa.ExtensionArray):
        return arr.storage
    return arr


def partition_table(
    table: pa.Table, schema: Schema, spec: PartitionSpec
) -> Iterator[tuple[tuple[Any, ...], pa.Table]]:
    """Split rows by partition: (partition tuple, rows conformed to ``schema``) per partition.

    Partition values are computed with each field's vectorized transform and rows are
    grouped with Arrow's hash group-by, so the cost is a few kernels, not a Python loop per
    row. Tuples are in spec-field order and internal representation; void fields are
    None. Empty input yields nothing.
    """
    if spec.has_unknown_transform:
        raise ValidationError(
            f"cannot write data with partition spec {spec.spec_id}: it uses a transform this "
            "implementation does not know"
        )
    conformed = conform_table(table, schema)
    if conformed.num_rows == 0:
        return
    if not spec.fields or spec.is_unpartitioned:
        yield tuple(None for _ in spec.fields), conformed
        return
    partition_type = spec.partition_type(schema)
    keys: dict[str, pa.Array] = {}
    key_fields: list[tuple[int, str, IcebergType]] = []
    for pos, (pf, nf) in enumerate(zip(spec.fields, partition_type.fields)):
        if pf.transform.is_void:
            continue
        what = f"partition field {pf.name!r}"
        source = _source_column(conformed, schema, pf.source_id, what)
        source_type = schema.find_type(pf.source_id)
        try:
            values = pf.transform.apply_array(source_type, source)
        except ValidationError as e:
            raise ValidationError(f"{what}: {e}") from e
        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks()
        name = f"k{pos}"
        keys[name] = _grouping_key(values)
        key_fields.append((pos, name, nf.field_type))
    keys["__row"] = _row_numbers(conformed.num_rows)
    grouped = pa.table(keys).group_by([n for _, n, _ in key_fields], use_threads=False)
    result = grouped.aggregate([("__row", "list")])
    decoded: dict[int, list[Any]] = {}
    for pos, name, result_type in key_fields:
        assert isinstance(result_type, PrimitiveType)
        decoded[pos] = from_arrow_array(result_type, result.column(name))
    rows = result.column("__row_list")
    for g in range(result.num_rows):
        partition = tuple(
            decoded[pos][g] if pos in decoded else None for pos in range(len(spec.fields))
        )
        yield partition, conformed.take(rows[g].values)


OutputFactory = Callable[[str], AbstractContextManager[IO[bytes]]]


@contextlib.contextmanager
def local_output(location: str) -> Iterator[IO[bytes]]:
    """Open a local path or ``file:`` URI for writing, creating parent directories.

    A file left incomplete by an error inside the block is removed.
    """
    path = _local_path(location)
    parent = os.path.dirname(path)
    try:
        if parent:
            os.makedirs(parent, exist_ok=True)
        f = open(path, "wb")  # noqa: SIM115 - closed below, removed on failure
    except OSError as e:
        raise InvalidFileError(location, f"cannot open for writing: {e}") from e
    try:
        with f:
            yield f
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(path)
        raise


class MemoryOutputs:
    """An output factory that keeps each written file in memory, for upload via FileIO."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}

    @contextlib.contextmanager
    def __call__(self, location: str) -> Iterator[IO[bytes]]:
        buffer = io.BytesIO()
        yield buffer
        self.files[location] = buffer.getvalue()


def data_location(table_location: str, properties: Mapping[str, str] | None = None) -> str:
    """Where data files go: ``write.data.path``, else ``<table location>/data``."""
    configured = (properties or {}).get(DATA_PATH)
    base = configured if configured else f"{table_location.rstrip('/')}/data"
    return base.rstrip("/")


def write_partitioned(
    table: pa.Table,
    table_location: str,
    *,
    schema: Schema,
    spec: PartitionSpec,
    properties: Mapping[str, str] | None = None,
    open_output: OutputFactory | None = None,
    target_file_size_bytes: int | None = None,
    sort_order: SortOrder | None = None,
) -> list[DataFile]:
    """Write rows as data files, one or more per partition, rolling at the target size.

    Files are named ``<data location>/<partition path>/<uuid>-<n>.parquet`` with one uuid
    per call and ``n`` counting files. Files roll at ``write.target-file-size-bytes``
    (or ``target_file_size_bytes``), checked after each row group, so a file overshoots the
    target by at most one row group. ``open_output`` opens a location for writing; the
    default writes local files, and :class:`MemoryOutputs` collects bytes for a FileIO.
    """
    props = properties or {}
    target = target_file_size_bytes or target_file_size(props)
    if target <= 0:
        raise ValidationError(f"target file size must be positive, got {target}")
    opener: OutputFactory = open_output or local_output
    options = ParquetWriteOptions.from_properties(props, schema)
    base = data_location(table_location, props)
    write_id = uuid.uuid4()
    counter = 0
    files: list[DataFile] = []
    for partition, rows in partition_table(table, schema, spec):
        directory = base
        if spec.fields and not spec.is_unpartitioned:
            directory = f"{base}/{spec.partition_path(partition, schema)}"
        row_bytes = max(1, rows.nbytes // max(1, rows.num_rows))
        chunk_rows = max(1, min(options.rows_per_row_group(rows), target // row_bytes))
        offset = 0
        while offset < rows.num_rows:
            counter += 1
            location = f"{directory}/{write_id}-{counter:05d}.parquet"
            with opener(location) as stream:
                writer = ParquetFileWriter(
                    stream,
                    schema=schema,
                    spec=spec,
                    partition=partition,
                    properties=props,
                    file_path=location,
                    sort_order=sort_order,
                )
                try:
                    while offset < rows.num_rows and writer.bytes_written < target:
                        writer.write(rows.slice(offset, chunk_rows))
                        offset += chunk_rows
                except BaseException:
                    writer.abort()
                    raise
                files.append(writer.close())
    return files


async def write_files(
    file_io: FileIO,
    table: pa.Table,
    table_location: str,
    *,
    schema: Schema,
    spec: PartitionSpec,
    properties: Mapping[str, str] | None = None,
    target_file_size_bytes: int | None = None,
    sort_order: SortOrder | None = None,
) -> list[DataFile]:
    """:func:`write_partitioned` into memory, then upload every file through ``file_io``."""
    outputs = MemoryOutputs()
    files = write_partitioned(
        table,
        table_location,
        schema=schema,
        spec=spec,
        properties=properties,
        open_output=outputs,
        target_file_size_bytes=target_file_size_bytes,
        sort_order=sort_order,
    )
    for data_file in files:
        await file_io.write(data_file.file_path, outputs.files[data_file.file_path])
    return files


# ---------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------

Source = str | os.PathLike[str] | bytes | bytearray | memoryview | IO[bytes]


def read_data_file(
    source: Source,
    read_schema: Schema,
    *,
    file_schema: Schema | None = None,
    row_filter: pc.Expression | None = None,
    constants: Mapping[int, Any] | None = None,
    location: str | None = None,
) -> pa.Table:
    """Read a Parquet data file as ``read_schema`` (see :func:`project_table`).

    ``source`` is a local path, the file's bytes (fetched through a FileIO) or a readable
    stream. Only the top-level columns the read schema needs are decoded. ``row_filter``
    is a pyarrow expression over read-schema column names, applied after projection.
    ``constants`` supplies values for columns absent from the file (identity partition
    values). ``location`` names the file in errors.
    """
    reader = _ProjectedReader(source, read_schema, file_schema, constants, location)
    try:
        data = reader.file.read(columns=reader.columns)
    except (pa.ArrowException, OSError) as e:
        raise InvalidFileError(reader.where, f"cannot decode Parquet data: {e}") from e
    projected = reader.project(data)
    if row_filter is not None:
        try:
            projected = projected.filter(row_filter)
        except (pa.ArrowException, TypeError) as e:
            raise ValidationError(
                f"{reader.where}: cannot apply row filter {row_filter}: {e}"
            ) from e
    return projected


def read_row_groups(
    source: Source,
    read_schema: Schema,
    *,
    file_schema: Schema | None = None,
    constants: Mapping[int, Any] | None = None,
    location: str | None = None,
) -> Iterator[pa.Table]:
    """A data file's rows as ``read_schema``, one row group at a time, in file order.

    What :func:`read_data_file` reads, for a caller that must not hold a whole file's
    decoded rows at once (a rewrite streaming rows from old files into new ones).
    """
    reader = _ProjectedReader(source, read_schema, file_schema, constants, location)
    for i in range(reader.file.num_row_groups):
        try:
            data = reader.file.read_row_group(i, columns=reader.columns)
        except (pa.ArrowException, OSError) as e:
            raise InvalidFileError(reader.where, f"cannot decode Parquet data: {e}") from e
        yield reader.project(data)


class _ProjectedReader:
    """An open Parquet file and what reading it as a read schema needs: the top-level
    columns to decode, and the projection from the file's schema."""

    def __init__(
        self,
        source: Source,
        read_schema: Schema,
        file_schema: Schema | None,
        constants: Mapping[int, Any] | None,
        location: str | None,
    ) -> None:
        where = location or (
            os.fspath(source) if isinstance(source, (str, os.PathLike)) else "<bytes>"
        )
        self.where = where
        self.read_schema = read_schema
        self.constants = constants
        if isinstance(source, (bytes, bytearray, memoryview)):
            handle: Any = pa.BufferReader(bytes(source))
        elif isinstance(source, (str, os.PathLike)):
            handle = _local_path(os.fspath(source))
        else:
            handle = source
        try:
            self.file = pq.ParquetFile(handle)
            arrow_schema = self.file.schema_arrow
        except (pa.ArrowException, OSError) as e:
            raise InvalidFileError(where, f"not a readable Parquet file: {e}") from e
        try:
            if file_schema is None:
                file_schema = arrow_to_schema(arrow_schema)
        except ValidationError as e:
            raise InvalidFileError(where, str(e)) from e
        self.file_schema = file_schema
        wanted = {f.field_id for f in read_schema.all_fields()}
        self.columns: list[str] = []
        for f in arrow_schema:
            fid = field_id_of(f)
            top = file_schema.find_field(fid) if fid is not None else file_schema.find_field(f.name)
            if top is None:
                continue
            subtree = {top.field_id}
            if isinstance(top.field_type, NestedType):
                subtree.update(n.field_id for n in walk_fields(top.field_type))
            if subtree & wanted:
                self.columns.append(f.name)

    def project(self, data: pa.Table) -> pa.Table:
        try:
            return project_table(data, self.file_schema, self.read_schema, constants=self.constants)
        except ValidationError as e:
            raise InvalidFileError(self.where, str(e)) from e


__all__ = [
    "ICEBERG_SCHEMA_KEY",
    "MemoryOutputs",
    "ParquetFileWriter",
    "data_location",
    "local_output",
    "partition_table",
    "read_data_file",
    "read_row_groups",
    "write_data_file",
    "write_files",
    "write_partitioned",
]
