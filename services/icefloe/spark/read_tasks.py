"""What runs inside Spark tasks to read: scan tasks as Arrow batches, deletes applied.

Reading
-------
:func:`read_task` is a ``mapInArrow`` function over rows holding one scan task each (a data
file, the delete files that apply to it and its residual filter, as the planner returned
them). It reads the data file by field id as the read schema (renames, added columns with
their ``initial-default``, dropped columns and type promotions, see
:func:`~icefloe.arrow.schema.project_table`), removes the rows named by position delete
files, then those matched by equality delete files (null matches null, as the spec says),
then keeps the rows the residual filter accepts, and converts the result to the Arrow
types Spark expects for the DataFrame's schema.

Why a module: this is the worker side of :func:`icefloe.spark.read` and of compaction's
reads, with the spec's rules for applying deletes; task identity, hooks and storage are
:mod:`icefloe.spark.tasks`.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from icefloe.arrow.schema import arrow_to_schema, field_id_of, list_layout, to_arrow_array
from icefloe.deletes.deletion_vector import DeletionVector, deletion_vector_from_blob
from icefloe.deletes.index import is_deletion_vector
from icefloe.errors import InvalidFileError, ValidationError
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
from icefloe.expressions.binding import bind
from icefloe.expressions.json_form import parse_expression
from icefloe.parquet.files import read_data_file
from icefloe.spark.tasks import OUTPUT_BATCH_ROWS, TaskIO, schema_from_json
from icefloe.spec.content_file import content_file_from_json
from icefloe.spec.datafile import DataFile, DataFileContent, FileFormat
from icefloe.spec.partition import PartitionSpec
from icefloe.spec.row_lineage import with_lineage_fields, with_row_lineage
from icefloe.spec.schema import Schema
from icefloe.spec.transforms import IdentityTransform
from icefloe.spec.types import IcebergType, NestedField, StructType

READ_TASK_COLUMN = "task"

POSITION_DELETE_PATH_ID = 2147483546
POSITION_DELETE_POS_ID = 2147483545


# ---------------------------------------------------------------------------------------
# Filters as Arrow masks
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
# Deletes
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
# Scan tasks
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
        return schema_from_json(self.table_schema_json)

    @property
    def read_schema(self) -> Schema:
        return schema_from_json(self.read_schema_json)

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
    rather than through a table :class:`~icefloe.spec.schema.Schema`.
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
                yield from table.to_batches(max_chunksize=OUTPUT_BATCH_ROWS)
    finally:
        task_io.close()


__all__ = [
    "POSITION_DELETE_PATH_ID",
    "POSITION_DELETE_POS_ID",
    "READ_TASK_COLUMN",
    "ReadJob",
    "ScanTaskReader",
    "column_by_id",
    "equality_delete_mask",
    "filter_mask",
    "read_position_deletes",
    "read_task",
    "to_spark_arrow",
    "to_spark_table",
]
