"""``icefloe scan TABLE``: plan a scan with the planner's core and print its tasks or rows.

Without ``--rows`` each line is one file scan task as the REST API returns it (the data
file, its delete files and the residual filter). With ``--rows`` the data files are read,
position and equality deletes applied, and each matching row is printed as JSON: a way to
check what a filter selects without an engine. Deletion vectors (v3 Puffin blobs) are read
with one ranged read each.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
from collections.abc import Sequence
from typing import Any, TextIO

import pyarrow as pa
import pyarrow.parquet as pq

from icefloe.arrow.schema import from_arrow_array
from icefloe.deletes.deletion_vector import read_deletion_vector
from icefloe.deletes.index import is_deletion_vector
from icefloe.errors import IcefloeError, InvalidFileError, ValidationError
from icefloe.expressions import BooleanExpression
from icefloe.expressions.evaluators import compile_row_filter
from icefloe.expressions.json_form import expression_to_json, parse_filter_text
from icefloe.manifests.cache import ManifestCache
from icefloe.parquet.files import read_data_file
from icefloe.scan.planning import FileScanTask, ScanPlan, plan_scan
from icefloe.spec.datafile import DataFile, DataFileContent
from icefloe.spec.row_lineage import LINEAGE_NAMES, with_lineage_fields, with_row_lineage
from icefloe.spec.schema import Schema
from icefloe.spec.types import NestedType, PrimitiveType, StructType
from icefloe.table.catalog import Catalog


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("table", help="namespace.table")
    parser.add_argument("--catalog", help="catalog URI (default: $ICEFLOE_CATALOG)")
    parser.add_argument(
        "--filter",
        "--where",
        dest="filter",
        help="row filter, as written in PyIceberg: \"ts >= '2024-01-01T00:00:00' and id in "
        "(1, 2)\" (or expression JSON, starting with '{'; or @file holding either)",
    )
    when = parser.add_mutually_exclusive_group()
    when.add_argument("--snapshot", type=int, help="snapshot id (default: current)")
    when.add_argument("--ref", help="branch or tag name")
    when.add_argument("--as-of-ms", type=int, help="the snapshot current at this epoch ms")
    when.add_argument(
        "--since", type=int, metavar="SNAPSHOT", help="incremental: appends after this snapshot"
    )
    parser.add_argument(
        "--until", type=int, metavar="SNAPSHOT", help="with --since (default: current)"
    )
    parser.add_argument("--select", help="comma-separated columns to print with --rows")
    parser.add_argument("--stats", help="comma-separated columns whose stats tasks include")
    parser.add_argument(
        "--case-insensitive", action="store_true", help="match column names in any case"
    )
    parser.add_argument(
        "--use-snapshot-schema",
        action="store_true",
        help="with --snapshot or --ref: bind the filter to that snapshot's schema",
    )
    parser.add_argument("--rows", action="store_true", help="print rows instead of tasks")
    parser.add_argument(
        "--row-lineage",
        action="store_true",
        help="with --rows on v3 tables: add _row_id and _last_updated_sequence_number",
    )
    parser.add_argument("--limit", type=int, help="stop after this many tasks or rows")


def filter_argument(text: str | None) -> BooleanExpression | None:
    """A filter as a command line takes it: the filter syntax
    (:func:`icefloe.expressions.parser.parse_filter`), or expression JSON when it starts with
    ``{``; ``@path`` reads either from a file."""
    if text is None:
        return None
    if text.startswith("@"):
        with open(text[1:], encoding="utf-8") as f:
            text = f.read()
    return parse_filter_text(text)


def _names(text: str | None) -> list[str] | None:
    return None if not text else [n.strip() for n in text.split(",") if n.strip()]


async def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    from icefloe.catalog.uri import load_catalog

    uri = args.catalog or os.environ.get("ICEFLOE_CATALOG")
    if not uri:
        raise IcefloeError("no catalog: pass --catalog URI or set ICEFLOE_CATALOG")
    catalog = load_catalog(uri)
    try:
        return await scan(catalog, args, out or sys.stdout)
    finally:
        await catalog.close()


async def scan(catalog: Catalog, args: argparse.Namespace, out: TextIO) -> int:
    if args.until is not None and args.since is None:
        raise ValidationError("--until needs --since")
    if args.limit is not None and args.limit < 0:
        raise ValidationError(f"--limit must be >= 0, got {args.limit}")
    table = await catalog.load_table(args.table)
    end = args.until
    if args.since is not None and end is None:
        current = table.metadata.current_snapshot()
        if current is None:
            raise ValidationError(f"table {args.table} has no snapshot to scan until")
        end = current.snapshot_id
    plan = await plan_scan(
        table.metadata,
        ManifestCache(table.io),
        snapshot_id=args.snapshot,
        ref=args.ref,
        as_of_ms=args.as_of_ms,
        start_snapshot_id=args.since,
        end_snapshot_id=end,
        row_filter=filter_argument(args.filter),
        case_sensitive=not args.case_insensitive,
        select=_names(args.select),
        use_snapshot_schema=args.use_snapshot_schema,
        stats_fields=_names(args.stats),
    )
    lineage = bool(getattr(args, "row_lineage", False))
    if lineage and not args.rows:
        raise ValidationError("--row-lineage needs --rows")
    if lineage and table.metadata.format_version < 3:
        raise ValidationError(
            f"--row-lineage: table {args.table} is format v{table.metadata.format_version}; "
            "row lineage exists from v3"
        )
    if args.rows:
        printed = 0
        for task in plan.tasks():
            for row in await task_rows(table.io, plan, task, row_lineage=lineage):
                if args.limit is not None and printed >= args.limit:
                    return 0
                out.write(json.dumps(row, default=str) + "\n")
                printed += 1
        return 0
    tasks = plan.tasks(0, args.limit)
    for task in tasks:
        out.write(json.dumps(task_json(plan, task), default=str) + "\n")
    return 0


def task_json(plan: ScanPlan, task: FileScanTask) -> dict[str, Any]:
    """One task in the REST API's JSON form, with its delete files inline."""
    from icefloe.scan.tasks_json import content_file_json

    return {
        "data-file": content_file_json(task.data_file, plan, plan.stats_field_ids),
        "delete-files": [content_file_json(d, plan, frozenset()) for d in task.delete_files],
        "residual-filter": expression_to_json(task.residual, legacy=True),
        "data-sequence-number": task.data_sequence_number,
    }


# ---------------------------------------------------------------------------------------------
# Rows
# ---------------------------------------------------------------------------------------------


def _struct_tuple(t: StructType, value: Any) -> Any:
    if value is None:
        return None
    return tuple(_internal(f.field_type, value.get(f.name)) for f in t.fields)


def _internal(t: Any, value: Any) -> Any:
    if isinstance(t, StructType):
        return _struct_tuple(t, value)
    return value


def rows_as_tuples(table: pa.Table, schema: Schema) -> list[tuple[Any, ...]]:
    """Rows in the internal representation, nested structs as tuples (what evaluators read)."""
    columns = []
    for field in schema.fields:
        column = table.column(field.name)
        t = field.field_type
        if isinstance(t, PrimitiveType):
            columns.append(from_arrow_array(t, column))
        elif isinstance(t, StructType):
            columns.append([_struct_tuple(t, v) for v in column.to_pylist()])
        else:
            columns.append(column.to_pylist())
    return list(zip(*columns)) if columns else [() for _ in range(table.num_rows)]


async def _read(io_: Any, path: str) -> bytes:
    data: bytes = await io_.read(path)
    return data


async def task_rows(
    io_: Any, plan: ScanPlan, task: FileScanTask, *, row_lineage: bool = False
) -> list[dict[str, Any]]:
    """The rows of one task that survive its deletes and residual, as projected JSON rows.

    With ``row_lineage`` each row also carries ``_row_id`` and
    ``_last_updated_sequence_number``, inherited from the file where null (v3).
    """
    schema = plan.schema
    read_schema = with_lineage_fields(schema) if row_lineage else schema
    data = read_data_file(
        await _read(io_, task.data_file.file_path), read_schema, location=task.data_file.file_path
    )
    if row_lineage:
        data = with_row_lineage(
            data,
            first_row_id=task.data_file.first_row_id,
            data_sequence_number=task.data_sequence_number,
        )
    keep = [True] * data.num_rows
    tuples = rows_as_tuples(data, schema)
    for delete in task.delete_files:
        if is_deletion_vector(delete):
            deleted = (await read_deletion_vector(io_, delete)).deleted_mask(len(keep))
            for pos in deleted.nonzero()[0].tolist():
                keep[pos] = False
            continue
        raw = await _read(io_, delete.file_path)
        if delete.content == DataFileContent.POSITION_DELETES:
            for pos in _positions(raw, delete, task.data_file):
                if 0 <= pos < len(keep):
                    keep[pos] = False
        else:
            _apply_equality(raw, delete, schema, tuples, keep)
    test = compile_row_filter(task.residual)
    wanted = {f.name for f in plan.projected_schema.fields}
    names = [f.name for f in schema.fields]
    if row_lineage:
        wanted.update(LINEAGE_NAMES)
        names.extend(LINEAGE_NAMES)
    out = []
    rows = data.to_pylist()
    for i, row in enumerate(rows):
        if keep[i] and test(tuples[i]):
            out.append({n: row[n] for n in names if n in wanted})
    return out


def _positions(raw: bytes, delete: DataFile, data_file: DataFile) -> list[int]:
    try:
        table = pq.read_table(io.BytesIO(raw), columns=["file_path", "pos"])
    except (pa.ArrowException, OSError) as e:
        raise InvalidFileError(delete.file_path, f"not a position delete file: {e}") from e
    paths = table.column("file_path").to_pylist()
    positions = table.column("pos").to_pylist()
    return [p for f, p in zip(paths, positions) if f == data_file.file_path]


def _apply_equality(
    raw: bytes, delete: DataFile, schema: Schema, rows: Sequence[tuple[Any, ...]], keep: list[bool]
) -> None:
    ids = list(delete.equality_ids or ())
    positions = []
    fields = []
    for fid in ids:
        field = schema.find_field(fid)
        if field is None or isinstance(field.field_type, NestedType):
            raise IcefloeError(
                f"{delete.file_path}: equality column {fid} is not a top-level column of "
                f"schema {schema.schema_id}"
            )
        positions.append(next(i for i, f in enumerate(schema.fields) if f.field_id == fid))
        fields.append(field)
    delete_schema = Schema(*fields)
    deleted = read_data_file(raw, delete_schema, location=delete.file_path)
    values = set(rows_as_tuples(deleted, delete_schema))
    for i, row in enumerate(rows):
        if keep[i] and tuple(row[p] for p in positions) in values:
            keep[i] = False


__all__ = ["add_arguments", "filter_argument", "rows_as_tuples", "run", "scan", "task_rows"]
