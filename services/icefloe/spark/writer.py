"""icefloe from PySpark: write DataFrames through the coordinator.

Writing (:func:`write`)
-----------------------
The driver never writes table metadata. It loads the table (schema, spec, properties) from
the catalog, checks the DataFrame against the schema by name (missing required columns and
incompatible types fail here, before any task runs; ``merge_schema=True`` first adds the
DataFrame's new columns to the table), and runs one Spark job whose tasks write Parquet data
files (:mod:`icefloe.spark.write_tasks`). Each task returns its files' content-file JSON and its
task attempt id; Spark hands the driver the rows of exactly one successful attempt per
partition, so the collected rows are the files to commit.

The driver then publishes ``files-written`` events (one or more per task attempt, split to
stay under the broker's message size) and one ``commit-requested`` naming those events and
attempts, and waits, up to ``commit_timeout_s``, for the coordinator's ``table-committed``
carrying its commit id; the snapshot id is the result. A rejection on the dead-letter topic
fails the write at once with the coordinator's reason. Files of failed or speculative
attempts (found by listing the directories the job wrote to, only when Spark reports failed
tasks or runs speculation) and files the coordinator reports as orphans are deleted after
the commit; if the commit cannot be confirmed (timeout) or is rejected, the driver first
looks for its commit id in the table's snapshots: found, the write succeeded (a lost or
refused announcement); not found after a timeout, nothing is deleted, since the coordinator
may still commit it. No clean-up ever deletes a file the table holds.

Upserts and deletes by key (``mode="upsert"``, ``mode="delete"``)
-----------------------------------------------------------------
On a keyed table (identifier fields, :mod:`icefloe.table.keyed`) the driver first checks,
before any job runs, that the table's keys are required columns the DataFrame has (in
Debezium's ``after`` for an envelope), and that the rows fit the schema. The job then has
two steps: a narrow map turns rows into change rows (:func:`icefloe.spark.changes.normalize`,
which also numbers them in arrival order), the rows are repartitioned by key so that every
change of a key meets in one task, and each task folds its changes to the last one per key
(:func:`icefloe.spark.changes.fold`) and writes the surviving rows as data files
(partitioned as the table) plus one *key file* naming every key it touched
(:func:`icefloe.spark.write_tasks.change_task`). The commit-requested's operation is
``upsert``: the coordinator removes each key's old row (deletion vectors on v3, position
deletes on v2) and adds the new ones in one snapshot. Key files are never committed: once
the outcome is decided (committed, acknowledged as a replay, or rejected) the driver
deletes them; after a timeout with the commit id not in the table it keeps them, since
the coordinator may still commit and reads them when it does. A task's refusal (a key
given twice without ``order_by``, an unknown operation, a null key) reaches the caller
as a ValidationError with the task's message, and the job's files are deleted.

Exactly once for streams (:func:`icefloe.spark.streaming.foreach_batch_sink`)
----------------------------------------------------------------------------
A micro-batch's commit id is ``<query id or sink id>:<batch id>``, stable across restarts
from a checkpoint. The sink skips a batch whose commit id the table's history already
records, and the coordinator acknowledges a commit id it already applied instead of
committing it again; when that happens, the replay's own files are found absent from the
acknowledged snapshot and deleted.

The Spark types (:mod:`icefloe.spark.types`), the driver's event loop and commit channel
(:mod:`icefloe.spark.channel`), the staging protocol writes share with compaction (loading
the table, splitting events, deleting a job's files: :mod:`icefloe.spark.staging`), the
streaming sink (:mod:`icefloe.spark.streaming`), what runs in the tasks
(:mod:`icefloe.spark.write_tasks`) and reading (:mod:`icefloe.spark.reader`) are modules of
their own.

Configuration comes from :class:`~icefloe.spark.config.SparkConfig`: ``config=`` arguments,
then ``spark.icefloe.*`` session settings, then ``ICEFLOE_*`` environment variables.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import re
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as st

from icefloe.arrow.schema import conform_table
from icefloe.errors import (
    CommitStateUnknownError,
    EventRejectedError,
    IcefloeError,
    ValidationError,
)
from icefloe.events import (
    CommitOperation,
    CommitRequested,
    FilesWritten,
    TableCommitted,
)
from icefloe.expressions import (
    AlwaysTrue,
)
from icefloe.expressions.binding import bind
from icefloe.expressions.json_form import expression_to_json, parse_expression
from icefloe.manifests.reader import ManifestReader
from icefloe.spark.changes import (
    ARRIVAL_COLUMN,
    OP_COLUMN,
    ChangeSpec,
    Envelope,
)
from icefloe.spark.channel import BACKGROUND, ConfigArg, resolve_settings
from icefloe.spark.config import SparkConfig
from icefloe.spark.staging import (
    attempts_may_have_failed,
    committed_in,
    delete_job_files,
    delete_paths,
    load_for_write,
    split_events,
)
from icefloe.spark.types import (
    FilterArg,
    arrow_schema_of,
    filter_to_json,
    map_in_arrow,
)
from icefloe.spark.write_tasks import (
    WRITE_RESULT_SCHEMA,
    WriteJob,
    change_rows_task,
    change_task,
    prepare_input,
    write_task,
)
from icefloe.spec.content_file import content_file_from_json
from icefloe.spec.datafile import DataFile, DataFileContent
from icefloe.spec.partition import PartitionSpec
from icefloe.spec.schema import Schema
from icefloe.table.catalog import TableIdentifier, data_dir
from icefloe.table.keyed import key_fields

log = logging.getLogger("icefloe.spark")

WriteMode = Literal["append", "overwrite", "overwrite-partitions", "upsert", "delete"]
KEYED_MODES = ("upsert", "delete")
OrderArg = str | Sequence[str] | None


# ---------------------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------------------


@dataclass
class StagedWrite:
    """A written but uncommitted Spark job: its files and the events that describe them."""

    identifier: TableIdentifier
    commit_id: str
    job_id: str
    schema: Schema
    spec: PartitionSpec
    base_snapshot_id: int | None
    data_dir: str
    files: list[DataFile]
    events: list[FilesWritten]
    attempt_ids: tuple[str, ...]
    needs_listing: bool
    catalog_uri: str
    config: SparkConfig = field(repr=False)
    key_files: list[DataFile] = field(default_factory=list)
    """An upsert's or delete's key files: read by the coordinator, never committed, so
    deleted once the commit is decided (never while its outcome is unknown)."""

    @property
    def record_count(self) -> int:
        return sum(f.record_count for f in self.files)

    @property
    def paths(self) -> set[str]:
        """The data files the commit adds to the table (key files are not among them)."""
        return {f.file_path for f in self.files}

    @property
    def key_paths(self) -> set[str]:
        return {f.file_path for f in self.key_files}

    def discard(self) -> None:
        """Delete every file of this job (it will not be committed)."""
        BACKGROUND.run(
            delete_job_files(self.catalog_uri, self.job_id, self.directories, keep=set())
        )

    @property
    def directories(self) -> set[str]:
        """Where the job wrote (the data directory when it wrote nothing)."""
        written = [*self.files, *self.key_files]
        return {f.file_path.rsplit("/", 1)[0] for f in written} or {self.data_dir}


def check_dataframe_schema(df_schema: st.StructType, schema: Schema, timezone: str = "UTC") -> None:
    """Raise a ValidationError if rows of ``df_schema`` cannot be written to ``schema``:
    unknown or duplicate columns, missing required columns, incompatible types."""
    empty = arrow_schema_of(df_schema, timezone).empty_table()
    conform_table(prepare_input(empty, schema), schema)


def _operation(mode: str, overwrite_filter: FilterArg) -> tuple[CommitOperation, Any]:
    if mode == "append":
        if overwrite_filter is not None:
            raise ValidationError("overwrite_filter is only allowed with mode='overwrite'")
        return CommitOperation.APPEND, None
    if mode == "overwrite":
        flt = filter_to_json(overwrite_filter)
        return CommitOperation.OVERWRITE, (expression_to_json(AlwaysTrue()) if flt is None else flt)
    if mode == "overwrite-partitions":
        if overwrite_filter is not None:
            raise ValidationError(
                "mode='overwrite-partitions' replaces the partitions written; it takes no filter"
            )
        return CommitOperation.OVERWRITE, None
    if mode in KEYED_MODES:
        if overwrite_filter is not None:
            raise ValidationError(f"mode={mode!r} changes rows by key; it takes no filter")
        return CommitOperation.UPSERT, None
    raise ValidationError(
        f"unknown write mode {mode!r}; use 'append', 'overwrite', 'overwrite-partitions', "
        "'upsert' or 'delete'"
    )


def _paths_of(value: OrderArg) -> tuple[str, ...]:
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)


def _field_at(struct: st.StructType, path: str) -> st.StructField | None:
    """The Spark field at a dotted ``path`` (a top-level name with dots matches first)."""
    if path in struct.names:
        return struct[path]
    node: st.DataType = struct
    found: st.StructField | None = None
    for name in path.split("."):
        if not isinstance(node, st.StructType) or name not in node.names:
            return None
        found = node[name]
        node = found.dataType
    return found


def _only_paths(struct: st.StructType, paths: Sequence[str]) -> st.StructType:
    """``struct`` cut down to the fields at ``paths`` (and the structs holding them)."""
    fields: list[st.StructField] = []
    for f in struct.fields:
        inner = [p[len(f.name) + 1 :] for p in paths if p.startswith(f"{f.name}.")]
        if f.name in paths:
            fields.append(f)
        elif inner and isinstance(f.dataType, st.StructType):
            fields.append(st.StructField(f.name, _only_paths(f.dataType, inner), f.nullable))
    return st.StructType(fields)


def _change_plan(
    df_schema: st.StructType,
    schema: Schema,
    identifier: TableIdentifier,
    mode: str,
    *,
    order_by: OrderArg,
    op_column: str | None,
    envelope: Envelope | None,
    timezone: str,
) -> tuple[ChangeSpec, st.StructType]:
    """Check a keyed write before any job runs; its change spec and the Spark schema of
    its change rows (:func:`icefloe.spark.changes.normalize`)."""
    what = f"mode={mode!r}"
    keys = key_fields(schema, identifier, what)
    key_paths = tuple(str(schema.find_column_name(f.field_id)) for f in keys)
    orders = _paths_of(order_by)
    if envelope is not None:
        if envelope != "debezium":
            raise ValidationError(f"unknown envelope {envelope!r}; the one known is 'debezium'")
        missing = [n for n in ("before", "after", "op") if n not in df_schema.names]
        if missing:
            raise ValidationError(
                f"envelope='debezium' needs the columns before, after and op; the DataFrame "
                f"lacks {missing} (columns: {df_schema.names})"
            )
        after = df_schema["after"].dataType
        if not isinstance(after, st.StructType):
            raise ValidationError(
                f"the Debezium envelope's 'after' must be a struct of the row, not "
                f"{after.simpleString()}"
            )
        row = after
        data_columns = tuple(row.names)
    else:
        row = df_schema
        # the operation column is never data; an ordering column is when the table has it
        data_columns = tuple(
            n
            for n in df_schema.names
            if n != op_column and (n not in orders or schema.find_field(n) is not None)
        )
        if op_column is not None and _field_at(df_schema, op_column) is None:
            raise ValidationError(
                f"the operation column {op_column!r} is not a column of the DataFrame "
                f"(columns: {df_schema.names})"
            )
    for path in key_paths:
        if _field_at(row, path) is None:
            where = "the envelope's 'after' (and 'before')" if envelope else "the DataFrame"
            raise ValidationError(
                f"{what} on {identifier} needs the key column {path!r} (an identifier field), "
                f"but {where} has no such column"
            )
    order_fields: list[st.StructField] = []
    for i, path in enumerate(orders):
        found = _field_at(df_schema, path)
        if found is None:
            raise ValidationError(
                f"the ordering column {path!r} is not a column of the DataFrame "
                f"(columns: {df_schema.names})"
            )
        if isinstance(found.dataType, st.StructType | st.ArrayType | st.MapType):
            raise ValidationError(
                f"the ordering column {path!r} is a {found.dataType.simpleString()}; it must "
                "hold comparable values (a number, string, timestamp, ...)"
            )
        order_fields.append(st.StructField(f"__icefloe_order_{i}", found.dataType, True))
    spec = ChangeSpec(
        keys=key_paths,
        mode="delete" if mode == "delete" else "upsert",
        op_column=op_column,
        order_by=orders,
        envelope=envelope,
        data_columns=data_columns if mode == "upsert" else (),
        # rows of one key twice with nothing to order them by: refused, not guessed at
        unique=mode == "upsert" and order_by is None and op_column is None and envelope is None,
    )
    data = st.StructType([row[n] for n in spec.data_columns])
    try:
        if mode == "upsert":
            check_dataframe_schema(data, schema, timezone)
        else:
            check_dataframe_schema(_only_paths(row, key_paths), schema.select(list(key_paths)))
    except ValidationError as e:
        raise ValidationError(f"cannot write this DataFrame to {identifier}: {e}") from None
    key_types = [_field_at(row, path) for path in key_paths]
    changes = st.StructType(
        [
            *(st.StructField(f.name, f.dataType, True) for f in data.fields),
            *(
                st.StructField(f"__icefloe_key_{i}", f.dataType, True)
                for i, f in enumerate(key_types)
                if f is not None
            ),
            st.StructField(OP_COLUMN, st.ByteType(), True),
            *order_fields,
            st.StructField(ARRIVAL_COLUMN, st.LongType(), True),
        ]
    )
    return spec, changes


def stage_write(
    df: DataFrame,
    table: str | TableIdentifier,
    *,
    merge_schema: bool = False,
    commit_id: str | None = None,
    config: ConfigArg = None,
    branch: str | None = None,
    mode: WriteMode = "append",
    order_by: OrderArg = None,
    op_column: str | None = None,
    envelope: Envelope | None = None,
) -> StagedWrite:
    """Write ``df``'s data files and build their events, without committing anything.

    :func:`write` is this followed by :func:`commit_staged`; benchmarks and custom
    pipelines may call the two steps themselves. ``mode`` matters only for ``upsert`` and
    ``delete``, which fold the rows by key first and also write key files (see
    :func:`write`); ``order_by``, ``op_column`` and ``envelope`` describe their changes.
    """
    settings = resolve_settings(df.sparkSession, config)
    uri = settings.require_catalog()
    identifier = TableIdentifier.parse(table)
    timezone = df.sparkSession.conf.get("spark.sql.session.timeZone") or "UTC"
    keyed = mode in KEYED_MODES
    if not keyed and (order_by is not None or op_column is not None or envelope is not None):
        raise ValidationError(
            f"order_by, op_column and envelope describe changes by key; mode={mode!r} takes "
            "none of them (use mode='upsert')"
        )
    if keyed and merge_schema:
        raise ValidationError(f"merge_schema is not supported with mode={mode!r}")
    if envelope == "debezium":
        df = _debezium_payload(df)
    loaded, catalog = BACKGROUND.run(
        load_for_write(uri, identifier, df.schema if merge_schema else None)
    )
    metadata = loaded.metadata
    schema, spec = metadata.schema(), metadata.spec()
    change: tuple[ChangeSpec, st.StructType] | None = None
    if keyed:
        change = _change_plan(
            df.schema,
            schema,
            identifier,
            mode,
            order_by=order_by,
            op_column=op_column,
            envelope=envelope,
            timezone=timezone,
        )
    else:
        try:
            check_dataframe_schema(df.schema, schema, timezone)
        except ValidationError as e:
            hint = "" if merge_schema else " (merge_schema=True adds new columns to the table)"
            raise ValidationError(
                f"cannot write this DataFrame to {identifier}: {e}{hint}"
            ) from None
    head = metadata.snapshot_by_ref(branch or "main")
    job = WriteJob(
        job_id=uuid.uuid4().hex,
        table_location=metadata.location,
        data_dir=data_dir(metadata),
        schema_json=json.dumps(schema.to_json()),
        spec_json=json.dumps(spec.to_json()),
        properties=dict(metadata.properties),
        io_properties=dict(catalog.properties),
    )
    if change is None:
        result = map_in_arrow(df, functools.partial(write_task, job), WRITE_RESULT_SCHEMA)
    else:
        change_spec, change_schema = change
        rows_of_changes = map_in_arrow(
            df, functools.partial(change_rows_task, change_spec), change_schema
        )
        by_key = _by_key(df, rows_of_changes, change_spec)
        result = map_in_arrow(
            by_key, functools.partial(change_task, job, change_spec), WRITE_RESULT_SCHEMA
        )
    try:
        rows = result.collect()
    except Exception as e:
        log.warning("Spark job %s writing %s failed; deleting its files", job.job_id, identifier)
        with contextlib.suppress(Exception):
            BACKGROUND.run(delete_job_files(uri, job.job_id, {job.data_dir}, keep=set()))
        refused = task_validation_error(e)
        if refused is not None:
            raise ValidationError(f"cannot write this DataFrame to {identifier}: {refused}") from e
        raise
    specs = {spec.spec_id: spec}
    by_attempt: dict[str, list[DataFile]] = {}
    stages: set[int] = set()
    for row in rows:
        attempt_id = f"{job.job_id}:{row.stage_id}:{row.task_attempt_id}"
        data_file = content_file_from_json(json.loads(row.file), specs=specs, schema=schema)
        by_attempt.setdefault(attempt_id, []).append(data_file)
        stages.add(row.stage_id)
    the_commit_id = commit_id or job.job_id
    events: list[FilesWritten] = []
    for attempt_id, files in sorted(by_attempt.items()):
        for start in range(0, len(files), settings.event_max_files):
            chunk = files[start : start + settings.event_max_files]

            def make(part: list[DataFile], attempt_id: str = attempt_id) -> FilesWritten:
                return FilesWritten.from_data_files(
                    identifier,
                    the_commit_id,
                    settings.writer_id,
                    attempt_id,
                    schema,
                    spec,
                    [f for f in part if f.content == DataFileContent.DATA],
                    [f for f in part if f.content != DataFileContent.DATA],
                )

            events.extend(split_events(make, chunk, settings.event_max_bytes))
    written = [f for fs in by_attempt.values() for f in fs]
    files = [f for f in written if f.content == DataFileContent.DATA]
    key_files = [f for f in written if f.content != DataFileContent.DATA]
    return StagedWrite(
        identifier=identifier,
        commit_id=the_commit_id,
        job_id=job.job_id,
        schema=schema,
        spec=spec,
        base_snapshot_id=None if head is None else head.snapshot_id,
        data_dir=job.data_dir,
        files=files,
        events=events,
        attempt_ids=tuple(sorted(by_attempt)),
        needs_listing=attempts_may_have_failed(df.sparkSession, stages),
        catalog_uri=uri,
        config=settings,
        key_files=key_files,
    )


def _debezium_payload(df: DataFrame) -> DataFrame:
    """Debezium's JSON converter with schemas enabled wraps each value as ``{"schema":
    ..., "payload": {...}}``: the envelope is the payload, taken out here."""
    if "op" in df.columns or "payload" not in df.columns:
        return df
    payload = df.schema["payload"].dataType
    if isinstance(payload, st.StructType) and "op" in payload.names:
        return df.select("payload.*")
    return df


def _by_key(df: DataFrame, changes: DataFrame, spec: ChangeSpec) -> DataFrame:
    """``changes`` partitioned by key, so every change of a key meets in one task.

    Each task writes a key file, so the number of tasks matters: with adaptive query
    execution Spark coalesces the shuffle's partitions to its advisory size; without it,
    as many partitions as the input has (not ``spark.sql.shuffle.partitions``, 200 by
    default, which would make 200 key files of a small micro-batch)."""
    keys = [F.col(c) for c in spec.key_columns]
    conf = df.sparkSession.conf
    adaptive = (conf.get("spark.sql.adaptive.enabled") or "true").lower() == "true"
    coalesces = (
        conf.get("spark.sql.adaptive.coalescePartitions.enabled") or "true"
    ).lower() == "true"
    if adaptive and coalesces:
        return changes.repartition(*keys)
    return changes.repartition(max(1, df.rdd.getNumPartitions()), *keys)


_TASK_REFUSAL = re.compile(r"icefloe\.errors\.ValidationError: (.+)")


def task_validation_error(error: BaseException) -> str | None:
    """The message of the ValidationError a Spark task raised, if that is why ``error``
    (the job's failure, a Py4J or PySpark exception around the task's traceback) came."""
    found = _TASK_REFUSAL.findall(str(error))
    if not found:
        found = re.findall(r"(?m)^ValidationError: (.+)$", str(error))
    return found[-1].strip() if found else None


async def _snapshot_adds_any(uri: str, committed: TableCommitted, paths: set[str]) -> bool:
    """Whether the acknowledged snapshot added any of ``paths``; True when it cannot tell,
    so that files are only ever deleted when they are certainly not in the table."""
    catalog = await BACKGROUND.catalog(uri)
    metadata = await catalog.read_metadata(committed.metadata_location)
    snapshot = metadata.snapshot_by_id(committed.snapshot_id)
    if snapshot is None:
        return True
    reader = ManifestReader(catalog.io)
    specs = metadata.specs()
    for manifest in await reader.manifests(snapshot):
        if manifest.added_snapshot_id != snapshot.snapshot_id:
            continue
        for entry in await reader.entries(manifest, specs):
            if entry.snapshot_id == snapshot.snapshot_id and entry.data_file.file_path in paths:
                return True
    return False


def commit_request(
    staged: StagedWrite,
    mode: WriteMode = "append",
    overwrite_filter: FilterArg = None,
    *,
    branch: str | None = None,
    snapshot_properties: Mapping[str, str] | None = None,
) -> CommitRequested:
    """The commit-requested event that asks the coordinator to commit ``staged``: an
    ``upsert`` for the keyed modes, naming every event (data and key files) of the job."""
    operation, filter_json = _operation(mode, overwrite_filter)
    return CommitRequested(
        table=str(staged.identifier),
        commit_id=staged.commit_id,
        operation=operation,
        event_ids=tuple(e.event_id for e in staged.events),
        attempt_ids=staged.attempt_ids,
        overwrite_filter=filter_json,
        snapshot_properties=dict(snapshot_properties or {}),
        branch=branch,
        base_snapshot_id=staged.base_snapshot_id
        if operation is CommitOperation.OVERWRITE
        else None,
    )


def commit_staged(
    staged: StagedWrite,
    mode: WriteMode = "append",
    overwrite_filter: FilterArg = None,
    *,
    branch: str | None = None,
    snapshot_properties: Mapping[str, str] | None = None,
    timeout_s: float | None = None,
    verify_files: bool = False,
) -> int | None:
    """Ask the coordinator to commit a staged write; the snapshot id, or None if there was
    nothing to commit. ``verify_files`` checks, for commit ids that may have been committed
    before (stream replays), that the acknowledged snapshot holds this job's files."""
    _, filter_json = _operation(mode, overwrite_filter)
    settings = staged.config
    uri = staged.catalog_uri
    if filter_json is not None:
        try:
            bind(staged.schema, parse_expression(filter_json))
        except ValidationError as e:
            raise ValidationError(
                f"overwrite_filter does not apply to {staged.identifier}: {e}"
            ) from None
    if not staged.events and filter_json is None:
        log.info("nothing to commit to %s (the DataFrame was empty)", staged.identifier)
        BACKGROUND.run(_cleanup(staged, committed=None))
        return None
    request = commit_request(
        staged, mode, overwrite_filter, branch=branch, snapshot_properties=snapshot_properties
    )
    timeout = timeout_s if timeout_s is not None else settings.commit_timeout_s

    async def run() -> TableCommitted:
        channel = await BACKGROUND.channel(settings)
        return await channel.commit(staged.events, request, timeout)

    started = time.monotonic()
    try:
        committed = BACKGROUND.run(run())
    except (EventRejectedError, CommitStateUnknownError) as e:
        # Before retrying, giving up or deleting anything, ask the table itself: the
        # commit id may be in it (a lost announcement, or a replay refused as such).
        holder = BACKGROUND.run(committed_in(uri, staged.identifier, staged.commit_id))
        if holder is not None:
            log.warning(
                "commit id %s of %s is in the table (snapshot %d) although the coordinator "
                "answered %s: %s; taking it as committed",
                staged.commit_id,
                staged.identifier,
                holder,
                type(e).__name__,
                e,
            )
            BACKGROUND.run(_cleanup(staged, committed=None, only_not_live=True))
            return holder
        if isinstance(e, EventRejectedError):
            BACKGROUND.run(_cleanup(staged, committed=None, only_not_live=True))
        raise
    log.info(
        "committed %d file(s), %d row(s) to %s as snapshot %d in %.0f ms (commit id %s)",
        len(staged.files),
        staged.record_count,
        staged.identifier,
        committed.snapshot_id,
        (time.monotonic() - started) * 1000,
        staged.commit_id,
    )
    if verify_files and staged.files:
        ours = staged.paths
        # An acknowledgement from the dedup ledger (snapshot expired since) cannot say
        # which files the commit added: delete only what the table does not hold.
        if committed.snapshot_expired or not BACKGROUND.run(
            _snapshot_adds_any(uri, committed, ours)
        ):
            log.info(
                "commit id %s of %s was already committed in snapshot %d; this replay's %d "
                "file(s) are not in the table and are deleted",
                staged.commit_id,
                staged.identifier,
                committed.snapshot_id,
                len(ours),
            )
            BACKGROUND.run(
                _cleanup(staged, committed=None, orphans=committed.orphan_files, only_not_live=True)
            )
            return committed.snapshot_id
    BACKGROUND.run(_cleanup(staged, committed=committed, orphans=committed.orphan_files))
    return committed.snapshot_id


async def _live_files(uri: str, identifier: TableIdentifier) -> set[str]:
    """Every file live in any branch or tag of the table (read from its manifests)."""
    catalog = await BACKGROUND.catalog(uri)
    table = await catalog.load_table(identifier)
    metadata = table.metadata
    reader = ManifestReader(catalog.io)
    specs = metadata.specs()
    live: set[str] = set()
    seen: set[str] = set()
    for ref in metadata.refs.values():
        snapshot = metadata.snapshot_by_id(ref.snapshot_id)
        if snapshot is None:
            continue
        for manifest in await reader.manifests(snapshot):
            if manifest.manifest_path in seen:
                continue
            seen.add(manifest.manifest_path)
            for entry in await reader.entries(manifest, specs, live_only=True):
                live.add(entry.data_file.file_path)
    return live


async def _cleanup(
    staged: StagedWrite,
    committed: TableCommitted | None,
    orphans: Sequence[str] = (),
    *,
    only_not_live: bool = False,
) -> None:
    """Delete what is certainly not in the table: the job's files when nothing of it was
    committed, otherwise files of other attempts and the coordinator's orphans.

    ``only_not_live`` first reads which files the table holds and never deletes one of
    them: for outcomes decided without a table-committed naming this job's snapshot (a
    rejection, or a commit id found already applied)."""
    try:
        if committed is None:
            keep = (
                await _live_files(staged.catalog_uri, staged.identifier) if only_not_live else set()
            )
            await delete_job_files(staged.catalog_uri, staged.job_id, staged.directories, keep)
            await delete_paths(staged.catalog_uri, [p for p in staged.paths if p not in keep])
        elif staged.needs_listing:
            await delete_job_files(
                staged.catalog_uri, staged.job_id, staged.directories, keep=staged.paths
            )
        # Key files are never in the table: once the outcome is decided (which is when
        # this runs), the coordinator has no more use for them.
        await delete_paths(staged.catalog_uri, sorted(staged.key_paths))
        if orphans:
            await delete_paths(staged.catalog_uri, [p for p in orphans if p not in staged.paths])
    except IcefloeError as e:
        log.warning("clean-up of job %s left files behind: %s", staged.job_id, e)


def write(
    df: DataFrame,
    table: str | TableIdentifier,
    mode: WriteMode = "append",
    overwrite_filter: FilterArg = None,
    branch: str | None = None,
    *,
    merge_schema: bool = False,
    snapshot_properties: Mapping[str, str] | None = None,
    commit_id: str | None = None,
    config: ConfigArg = None,
    timeout_s: float | None = None,
    order_by: OrderArg = None,
    op_column: str | None = None,
    envelope: Envelope | None = None,
) -> int | None:
    """Write ``df`` to ``table`` ("ns.table") through the coordinator; the new snapshot id.

    ``mode``: ``append``; ``overwrite`` deletes the rows matching ``overwrite_filter`` (an
    icefloe expression or its JSON; the whole table when None) and adds ``df``;
    ``overwrite-partitions`` replaces the partitions ``df`` writes. Returns None when there
    was nothing to commit. ``commit_id`` (default: a fresh one) makes a retried job
    idempotent: a commit id the table already holds is acknowledged, not applied again.

    On a keyed table (one with identifier fields), ``upsert`` inserts the rows whose key is
    new and replaces the row of every key already there; ``delete`` deletes the rows of the
    keys ``df`` holds (it needs only the key columns; other columns are ignored). A key
    given twice in an upsert is an error unless ``order_by`` names ordering columns (dotted
    paths allowed): then the row with the greatest values wins, ties going to the later
    row. ``op_column`` makes ``df`` a change stream (Debezium's ``c``, ``r``, ``u`` upsert,
    ``d`` and a null operation, a tombstone, delete), ``envelope="debezium"`` takes
    Debezium's ``before``/``after``/``op`` envelope as it is (or inside ``payload``, as
    the JSON converter with schemas writes it); see
    :mod:`icefloe.spark.changes` for the fold. The rows are partitioned by key in Spark,
    folded per task, and each task writes the surviving rows as data files and every key
    it touched as one key file; the coordinator removes the keys' old rows with deletion
    vectors (v3) or position deletes (v2) in the same commit.
    """
    _operation(mode, overwrite_filter)  # refuse a bad mode before running any job
    staged = stage_write(
        df,
        table,
        merge_schema=merge_schema,
        commit_id=commit_id,
        config=config,
        branch=branch,
        mode=mode,
        order_by=order_by,
        op_column=op_column,
        envelope=envelope,
    )
    return commit_staged(
        staged,
        mode,
        overwrite_filter,
        branch=branch,
        snapshot_properties=snapshot_properties,
        timeout_s=timeout_s,
        verify_files=commit_id is not None,
    )


__all__ = [
    "StagedWrite",
    "check_dataframe_schema",
    "commit_request",
    "commit_staged",
    "stage_write",
    "write",
]
