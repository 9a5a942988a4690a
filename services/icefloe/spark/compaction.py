"""Compaction on Spark: rewrite small files (and the deletes on them) through the coordinator.

:func:`compact` plans on the driver (:func:`icefloe.table.compaction.plan_compaction`: which files
of which partitions, bin-packed into groups of about ``write.target-file-size-bytes``), runs
one Spark job with one task per group, and commits the result as ``rewrite`` requests to the
coordinator, so a compaction is serialized with the streaming appends of the same table like
any other commit and never races them on the catalog.

Each task reads its group's data files with the reader's own code
(:class:`~icefloe.spark.read_tasks.ScanTaskReader`: position deletes, then equality deletes, null
matching null), optionally sorts the rows by the table's sort order, and writes them with the
writer's :class:`~icefloe.spark.write_tasks.FanoutWriter` (Parquet with field ids and column
metrics, rolling at the target size). Output file names carry ``<job id>-b<group>`` so every
file of a group can be found, and deleted, by listing, whatever attempt wrote it.

Commits carry ``base-snapshot-id`` = the snapshot the plan read. The coordinator validates
the rewrite against it by sequence number (see :mod:`icefloe.table.snapshot_producer`): a row
delta that added deletes applying to a rewritten file, or an overwrite or delete that
removed one, since that snapshot makes the commit fail. The job then deletes the files of
the failed commit and raises :class:`CompactionConflictError`; nothing is left behind, and
running the compaction again plans on the new state. Groups are committed in chunks of at
most ``max_files_per_commit`` rewritten files, so one conflicting partition does not throw
away the work done for the others (their chunks commit).

Delete files that apply only to rewritten files are removed by the same commit (the new
files hold the rows with the deletes applied, and later data files have newer sequence
numbers, so those deletes could never apply again).

Format v3 tables: deletion vectors are applied like position deletes and leave with their
data files (the snapshot producer removes a removed file's DV; a DV's Puffin path is never
named in ``rewritten-files``, since it holds other files' vectors too). Row lineage is kept
(spec: "Row Lineage"): tasks read ``_row_id`` and ``_last_updated_sequence_number`` with
inheritance (first row id plus position, the file's data sequence number) before deletes
drop rows, and write both explicitly, under their reserved field ids, into the new files,
so every row keeps its id and the sequence number of its last update.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession
from pyspark.sql import types as st

from icefloe.errors import EventRejectedError, IcefloeError, ValidationError
from icefloe.events import CommitOperation, CommitRequested, FilesWritten, TableCommitted
from icefloe.expressions import BooleanExpression
from icefloe.expressions.json_form import parse_expression
from icefloe.spark.channel import BACKGROUND, ConfigArg, resolve_settings
from icefloe.spark.config import SparkConfig
from icefloe.spark.read_tasks import READ_TASK_COLUMN, ReadJob, ScanTaskReader, column_by_id
from icefloe.spark.staging import (
    attempts_may_have_failed,
    delete_job_files,
    delete_paths,
    load_for_write,
    split_events,
)
from icefloe.spark.tasks import TaskInfo, TaskIO, task_hooks
from icefloe.spark.types import FilterArg, filter_to_json, map_in_arrow
from icefloe.spark.write_tasks import FanoutWriter, WriteJob
from icefloe.spec.content_file import content_file_from_json, content_file_to_json
from icefloe.spec.datafile import DataFile
from icefloe.spec.metadata import TableMetadata
from icefloe.spec.partition import PartitionSpec
from icefloe.spec.row_lineage import LINEAGE_NAMES, with_lineage_fields, without_lineage_metrics
from icefloe.spec.schema import Schema
from icefloe.spec.sort_order import NullOrder, SortDirection, SortOrder
from icefloe.table.catalog import TableIdentifier, data_dir
from icefloe.table.compaction import (
    CompactionPlan,
    CompactionPolicy,
    FileGroup,
    plan_compaction,
)

log = logging.getLogger("icefloe.spark.compact")

GROUP_COLUMN = "group_id"
COMPACT_RESULT_SCHEMA = "group_id int, task_attempt_id long, stage_id int, file string"
_COMPACT_RESULT_ARROW = pa.schema(
    [
        pa.field("group_id", pa.int32()),
        pa.field("task_attempt_id", pa.int64()),
        pa.field("stage_id", pa.int32()),
        pa.field("file", pa.string()),
    ]
)
COMPACTION_JOB_PROPERTY = "spark.compaction.job-id"
MAX_FILES_PER_COMMIT_DEFAULT = 1000


class CompactionConflictError(IcefloeError):
    """Some groups could not be committed: files they rewrite changed since the plan.

    Their files were deleted; the chunks in ``result.committed`` did commit. Running the
    compaction again plans on the table as it is now.
    """

    def __init__(self, message: str, result: CompactionResult) -> None:
        super().__init__(message)
        self.result = result


@dataclass
class CompactionResult:
    """What a compaction did: counts, the snapshots it committed and what it gave up."""

    table: str
    planned_snapshot_id: int | None
    groups: int = 0
    rewritten_data_files: int = 0
    rewritten_delete_files: int = 0
    added_data_files: int = 0
    rewritten_bytes: int = 0
    added_bytes: int = 0
    rows: int = 0
    committed: list[int] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ---------------------------------------------------------------------------------------
# Inside Spark tasks
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CompactJob:
    """Everything a compaction task needs: how to read the old files and write new ones."""

    write: WriteJob
    read: ReadJob
    sort_order_json: str | None = None


def group_job_id(job_id: str, group: int) -> str:
    """The file-name prefix of one group's output: ``<job id>-b<group>``."""
    return f"{job_id}-b{group}"


def sort_rows(table: pa.Table, schema: Schema, order: SortOrder) -> pa.Table:
    """``table`` sorted by ``order``: each field's transform of its column, in its direction,
    with nulls first or last per field (a null flag sorts before each value)."""
    if order.is_unsorted or not table.num_rows:
        return table
    keys: dict[str, pa.Array] = {}
    sort_keys: list[tuple[str, str]] = []
    for i, f in enumerate(order.fields):
        source = column_by_id(table, schema, f.source_id)
        values = f.transform.apply_array(schema.find_type(f.source_id), source)
        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks()
        if isinstance(values, pa.ExtensionArray):
            values = values.storage
        nulls_first = f.null_order == NullOrder.NULLS_FIRST
        keys[f"n{i}"] = pc.is_null(values)
        keys[f"v{i}"] = values
        sort_keys.append((f"n{i}", "descending" if nulls_first else "ascending"))
        direction = "ascending" if f.direction == SortDirection.ASC else "descending"
        sort_keys.append((f"v{i}", direction))
    order_index = pc.sort_indices(pa.table(keys), sort_keys=sort_keys)
    return table.take(order_index)


def compact_task(job: CompactJob, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The ``mapInArrow`` body: rows of (group id, scan tasks JSON) in, written files out."""
    info = TaskInfo.current()
    task_io = TaskIO(job.write.table_location, job.write.io_properties)
    reader = ScanTaskReader(job.read, task_io)
    schema = job.write.schema  # with the lineage columns on v3
    table_schema = job.read.table_schema
    spec = job.write.spec
    order = (
        None
        if job.sort_order_json is None
        else SortOrder.from_json(json.loads(job.sort_order_json))
    )
    written: list[DataFile] = []
    out: list[pa.RecordBatch] = []
    try:
        for batch in batches:
            groups = batch.column(GROUP_COLUMN).to_pylist()
            texts = batch.column(READ_TASK_COLUMN).to_pylist()
            for group, text in zip(groups, texts):
                tasks = json.loads(text)
                write_job = dataclasses.replace(
                    job.write, job_id=group_job_id(job.write.job_id, int(group))
                )
                writer = FanoutWriter(write_job, info, task_io)
                try:
                    if order is not None:
                        rows = pa.concat_tables([reader.read(t) for t in tasks])
                        writer.write(sort_rows(rows, schema, order))
                    else:
                        for t in tasks:
                            rows = reader.read(t)
                            if rows.num_rows:
                                writer.write(rows)
                    files = [without_lineage_metrics(f) for f in writer.close()]
                except BaseException:
                    writer.abort()
                    raise
                written.extend(files)
                if files:
                    out.append(
                        pa.RecordBatch.from_pydict(
                            {
                                "group_id": [int(group)] * len(files),
                                "task_attempt_id": [info.task_attempt_id] * len(files),
                                "stage_id": [info.stage_id] * len(files),
                                "file": [
                                    json.dumps(content_file_to_json(f, spec, table_schema))
                                    for f in files
                                ],
                            },
                            schema=_COMPACT_RESULT_ARROW,
                        )
                    )
    except BaseException:
        for f in written:
            with contextlib.suppress(Exception):
                task_io.delete(f.file_path)
        task_io.close()
        raise
    task_io.close()
    task_hooks().files_complete(info)
    yield from out


# ---------------------------------------------------------------------------------------
# On the driver
# ---------------------------------------------------------------------------------------


@dataclass
class _GroupOutput:
    index: int
    group: FileGroup
    files: list[DataFile] = field(default_factory=list)
    attempt_id: str | None = None


def _task_json(group: FileGroup, metadata: TableMetadata, schema: Schema) -> list[dict[str, Any]]:
    specs = metadata.specs()
    out = []
    for t in group.tasks:
        out.append(
            {
                "data-file": content_file_to_json(t.data_file, specs[t.data_file.spec_id], schema),
                "delete-files": [
                    content_file_to_json(d, specs[d.spec_id], schema) for d in t.deletes
                ],
                "data-sequence-number": t.sequence_number,
            }
        )
    return out


def _where(where: FilterArg) -> BooleanExpression | None:
    raw = filter_to_json(where)
    if raw is None or raw is True:
        return None
    return parse_expression(raw)


def _sort_order(metadata: TableMetadata, sort: bool) -> SortOrder | None:
    if not sort:
        return None
    order = metadata.sort_order_by_id(metadata.default_sort_order_id)
    if order is None or order.is_unsorted:
        raise ValidationError(
            f"sort=True, but table {metadata.location} has no sort order: set one (a "
            "write order) or compact without sorting"
        )
    if order.has_unknown_transform:
        raise ValidationError(f"sort order {order} uses a transform icefloe does not know")
    return order


def _chunks(outputs: Sequence[_GroupOutput], max_files: int) -> list[list[_GroupOutput]]:
    chunks: list[list[_GroupOutput]] = []
    count = 0
    for o in outputs:
        n = len(o.group.tasks)
        if not chunks or (count + n > max_files and chunks[-1]):
            chunks.append([])
            count = 0
        chunks[-1].append(o)
        count += n
    return chunks


@dataclass
class StagedCompaction:
    """A compaction whose files are written but not committed (see :func:`stage_compaction`)."""

    identifier: TableIdentifier
    plan: CompactionPlan
    job_id: str
    schema: Schema
    spec: PartitionSpec
    outputs: list[_GroupOutput]
    directories: set[str]
    needs_listing: bool
    catalog_uri: str
    config: SparkConfig = field(repr=False)
    started: float = 0.0

    @property
    def paths(self) -> set[str]:
        return {f.file_path for o in self.outputs for f in o.files}

    def discard(self) -> None:
        """Delete every file of this compaction (it will not be committed)."""
        BACKGROUND.run(
            delete_job_files(self.catalog_uri, self.job_id, self.directories, keep=set())
        )


def stage_compaction(
    spark: SparkSession,
    table: str | TableIdentifier,
    *,
    where: FilterArg = None,
    sort: bool = False,
    options: Mapping[str, Any] | None = None,
    config: ConfigArg = None,
) -> StagedCompaction:
    """Plan a compaction and run its Spark job; nothing is committed yet.

    :func:`compact` is this followed by :func:`commit_compaction`.
    """
    started = time.monotonic()
    settings = resolve_settings(spark, config)
    uri = settings.require_catalog()
    identifier = TableIdentifier.parse(table)
    loaded, catalog = BACKGROUND.run(load_for_write(uri, identifier, None))
    metadata = loaded.metadata
    policy = CompactionPolicy.for_table(metadata, options)
    order = _sort_order(metadata, sort)
    plan = BACKGROUND.run(plan_compaction(loaded, where=_where(where), policy=policy))
    schema, spec = metadata.schema(), metadata.spec()
    job_id = uuid.uuid4().hex
    directories = {data_dir(metadata)}
    staged = StagedCompaction(
        identifier, plan, job_id, schema, spec, [], directories, False, uri, settings, started
    )
    if not plan.groups:
        log.info("nothing to compact in %s (%d data files)", identifier, plan.data_files)
        return staged
    # v3: the new files hold every row's lineage explicitly (spec: "Row Lineage"), so rows
    # keep their _row_id; the columns carry their reserved field ids.
    write_schema = with_lineage_fields(schema) if plan.row_lineage else schema
    output_names = tuple(f.name for f in schema.fields)
    if plan.row_lineage:
        output_names += LINEAGE_NAMES
    write_job = WriteJob(
        job_id=job_id,
        table_location=metadata.location,
        data_dir=data_dir(metadata),
        schema_json=json.dumps(write_schema.to_json()),
        spec_json=json.dumps(spec.to_json()),
        properties={
            **metadata.properties,
            "write.target-file-size-bytes": str(policy.target_file_size_bytes),
        },
        io_properties=dict(catalog.properties),
    )
    read_job = ReadJob(
        table_schema_json=json.dumps(schema.to_json()),
        read_schema_json=json.dumps(schema.to_json()),
        output_names=output_names,
        specs_json=json.dumps([s.to_json() for s in metadata.partition_specs]),
        table_location=metadata.location,
        io_properties=dict(catalog.properties),
        output_schema=pa.schema([]),
        row_lineage=plan.row_lineage,
    )
    job = CompactJob(write_job, read_job, None if order is None else json.dumps(order.to_json()))
    rows = [(i, json.dumps(_task_json(g, metadata, schema))) for i, g in enumerate(plan.groups)]
    rdd = spark.sparkContext.parallelize(rows, len(rows))
    tasks_df = spark.createDataFrame(
        rdd,
        st.StructType(
            [
                st.StructField(GROUP_COLUMN, st.IntegerType()),
                st.StructField(READ_TASK_COLUMN, st.StringType()),
            ]
        ),
    )
    log.info(
        "compacting %d file(s), %d byte(s) of %s in %d group(s) (job %s)",
        plan.input_files,
        plan.input_bytes,
        identifier,
        len(plan.groups),
        job_id,
    )
    try:
        collected = map_in_arrow(
            tasks_df, functools.partial(compact_task, job), COMPACT_RESULT_SCHEMA
        ).collect()
    except Exception:
        log.warning("compaction job %s of %s failed; deleting its files", job_id, identifier)
        with contextlib.suppress(Exception):
            staged.discard()
        raise
    staged.outputs = [_GroupOutput(i, g) for i, g in enumerate(plan.groups)]
    specs = {spec.spec_id: spec}
    stages: set[int] = set()
    for row in collected:
        out = staged.outputs[row.group_id]
        out.attempt_id = f"{job_id}:{row.stage_id}:{row.task_attempt_id}"
        out.files.append(content_file_from_json(json.loads(row.file), specs=specs, schema=schema))
        stages.add(row.stage_id)
    staged.needs_listing = attempts_may_have_failed(spark, stages)
    try:
        _check_row_counts(staged.outputs)
    except ValidationError:
        staged.discard()
        raise
    return staged


def commit_compaction(
    staged: StagedCompaction,
    *,
    max_files_per_commit: int = MAX_FILES_PER_COMMIT_DEFAULT,
    timeout_s: float | None = None,
) -> CompactionResult:
    """Commit a staged compaction through the coordinator, in chunks of at most
    ``max_files_per_commit`` rewritten files; raises :class:`CompactionConflictError` when
    a chunk fails validation (after deleting its files)."""
    if max_files_per_commit < 1:
        raise ValidationError(
            f"max_files_per_commit must be at least 1, got {max_files_per_commit}"
        )
    plan = staged.plan
    identifier = staged.identifier
    result = CompactionResult(str(identifier), plan.snapshot_id, groups=len(plan.groups))
    settings = staged.config
    timeout = timeout_s if timeout_s is not None else settings.commit_timeout_s
    for n, chunk in enumerate(_chunks(staged.outputs, max_files_per_commit)):
        _commit_chunk(chunk, n, staged=staged, timeout_s=timeout, result=result)
    result.seconds = time.monotonic() - staged.started
    if result.failed:
        raise CompactionConflictError(
            f"compaction of {identifier} committed {len(result.committed)} of "
            f"{len(result.committed) + len(result.failed)} chunk(s); the others conflicted "
            "with concurrent changes and their files were deleted (run it again): "
            + "; ".join(result.failed),
            result,
        )
    if result.committed:
        log.info(
            "compacted %s: %d data file(s) and %d delete file(s) into %d file(s) in %.1fs",
            identifier,
            result.rewritten_data_files,
            result.rewritten_delete_files,
            result.added_data_files,
            result.seconds,
        )
    return result


def compact(
    spark: SparkSession,
    table: str | TableIdentifier,
    *,
    where: FilterArg = None,
    sort: bool = False,
    options: Mapping[str, Any] | None = None,
    max_files_per_commit: int = MAX_FILES_PER_COMMIT_DEFAULT,
    config: ConfigArg = None,
    timeout_s: float | None = None,
) -> CompactionResult:
    """Compact ``table`` ("ns.table"): rewrite its small files (and files with deletes) into
    files of the target size, committed through the coordinator as ``rewrite`` snapshots.

    ``where`` (an icefloe expression or its JSON) limits it to files that may hold matching
    rows; ``sort`` orders rows by the table's sort order; ``options`` override the policy
    (:class:`~icefloe.table.compaction.CompactionPolicy` field names, e.g.
    ``{"min_input_files": 2, "target_file_size_bytes": 1 << 27}``). Raises
    :class:`CompactionConflictError` when a concurrent change to the rewritten files made a
    commit fail validation (its files are deleted; run it again).
    """
    if max_files_per_commit < 1:
        raise ValidationError(
            f"max_files_per_commit must be at least 1, got {max_files_per_commit}"
        )
    staged = stage_compaction(spark, table, where=where, sort=sort, options=options, config=config)
    return commit_compaction(staged, max_files_per_commit=max_files_per_commit, timeout_s=timeout_s)


def _check_row_counts(outputs: Sequence[_GroupOutput]) -> None:
    """A group without deletes must come out with exactly its rows; fewer or more would
    mean a reader or writer bug, and committing would lose or duplicate rows."""
    for o in outputs:
        if any(t.deletes for t in o.group.tasks):
            expected_max = o.group.input_rows
            if sum(f.record_count for f in o.files) > expected_max:
                raise ValidationError(
                    f"compaction produced more rows than it read for {sorted(o.group.paths)[:3]}"
                )
            continue
        got = sum(f.record_count for f in o.files)
        if got != o.group.input_rows:
            raise ValidationError(
                f"compaction of {len(o.group.tasks)} file(s) read {o.group.input_rows} row(s) "
                f"by their metadata but wrote {got}; nothing was committed"
            )


def _commit_chunk(
    chunk: list[_GroupOutput],
    n: int,
    *,
    staged: StagedCompaction,
    timeout_s: float,
    result: CompactionResult,
) -> None:
    plan, identifier, job_id = staged.plan, staged.identifier, staged.job_id
    schema, spec, settings = staged.schema, staged.spec, staged.config
    uri, directories, needs_listing = staged.catalog_uri, staged.directories, staged.needs_listing
    commit_id = f"compaction:{job_id}:{n}"
    rewritten = set().union(*(o.group.paths for o in chunk))
    drops = plan.droppable_deletes(rewritten)
    by_attempt: dict[str, list[DataFile]] = {}
    for o in chunk:
        if o.attempt_id is not None:
            by_attempt.setdefault(o.attempt_id, []).extend(o.files)
    events: list[FilesWritten] = []
    for attempt_id, files in sorted(by_attempt.items()):
        for start in range(0, len(files), settings.event_max_files):
            part = files[start : start + settings.event_max_files]

            def make(p: list[DataFile], attempt_id: str = attempt_id) -> FilesWritten:
                return FilesWritten.from_data_files(
                    identifier, commit_id, settings.writer_id, attempt_id, schema, spec, p
                )

            events.extend(split_events(make, part, settings.event_max_bytes))
    request = CommitRequested(
        table=str(identifier),
        commit_id=commit_id,
        operation=CommitOperation.REWRITE,
        event_ids=tuple(e.event_id for e in events),
        attempt_ids=tuple(sorted(by_attempt)),
        rewritten_files=tuple(sorted(rewritten | {d.file_path for d in drops})),
        snapshot_properties={COMPACTION_JOB_PROPERTY: job_id},
        base_snapshot_id=plan.snapshot_id,
    )
    ours = {f.file_path for o in chunk for f in o.files}
    group_ids = [group_job_id(job_id, o.index) for o in chunk]

    async def run() -> TableCommitted:
        channel = await BACKGROUND.channel(settings)
        return await channel.commit(events, request, timeout_s)

    async def discard(keep: set[str], orphans: Sequence[str] = ()) -> None:
        try:
            await delete_paths(uri, [p for p in ours if p not in keep])
            if needs_listing or not keep:
                for gid in group_ids:
                    await delete_job_files(uri, gid, directories, keep=keep)
            if orphans:
                await delete_paths(uri, [p for p in orphans if p not in keep])
        except IcefloeError as e:
            log.warning("clean-up of compaction %s left files behind: %s", commit_id, e)

    try:
        committed = BACKGROUND.run(run())
    except EventRejectedError as e:
        BACKGROUND.run(discard(set()))
        log.warning("compaction commit %s of %s was refused: %s", commit_id, identifier, e)
        result.failed.append(str(e))
        return
    BACKGROUND.run(discard(ours, committed.orphan_files))
    result.committed.append(committed.snapshot_id)
    result.rewritten_data_files += len(rewritten)
    result.rewritten_delete_files += len(drops)
    result.added_data_files += len(ours)
    result.rewritten_bytes += sum(o.group.input_bytes for o in chunk)
    result.added_bytes += sum(f.file_size_in_bytes for o in chunk for f in o.files)
    result.rows += sum(f.record_count for o in chunk for f in o.files)


__all__ = [
    "COMPACTION_JOB_PROPERTY",
    "CompactJob",
    "CompactionConflictError",
    "CompactionResult",
    "StagedCompaction",
    "commit_compaction",
    "compact",
    "compact_task",
    "group_job_id",
    "sort_rows",
    "stage_compaction",
]
