"""The staging protocol every Spark job of icefloe follows, writes and compactions alike.

A job loads the table it writes against (evolving its schema first when asked), has its
tasks write files named after the job (:func:`icefloe.spark.write_tasks.is_job_file`), publishes
``files-written`` events split to fit the broker, asks the coordinator to commit them, and
afterwards deletes what is certainly not in the table: every file of the job when nothing of
it was committed, or the files of failed and speculative attempts (looked for only when Spark
says some attempt may have failed). Before giving up on an unconfirmed commit it asks the
table whether its commit id is there.

Why a module: the writer (:mod:`icefloe.spark.writer`) and compaction
(:mod:`icefloe.spark.compaction`) both follow these steps. Kept here under public names, the
rules that make a job's clean-up safe are written once and neither module reaches into the
other.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable

from pyspark.sql import SparkSession
from pyspark.sql import types as st

from icefloe.errors import NotFoundError
from icefloe.events import FilesWritten, encode_event
from icefloe.spark.channel import BACKGROUND
from icefloe.spark.types import spark_to_iceberg_type
from icefloe.spark.write_tasks import is_job_file
from icefloe.spec.datafile import DataFile
from icefloe.spec.metadata import TableMetadata
from icefloe.spec.metadata_builder import MetadataBuilder
from icefloe.spec.schema import Schema
from icefloe.spec.schema_update import UpdateSchema
from icefloe.spec.types import NestedField, StructType
from icefloe.table.catalog import Catalog, Table, TableIdentifier
from icefloe.table.commit import commit_with_retry
from icefloe.table.commit_index import CommitIndex

log = logging.getLogger("icefloe.spark")


def _merged_struct(table: StructType, incoming: st.StructType) -> tuple[StructType, bool]:
    """The table's struct plus the incoming fields it lacks (by name, recursively into
    structs); the table's own fields are kept exactly, so nothing is promoted or loosened."""
    by_name = {f.name: f for f in table.fields}
    fields = list(table.fields)
    changed = False
    counter = iter(range(1_000_000_000, 2_000_000_000))
    for incoming_field in incoming.fields:
        existing = by_name.get(incoming_field.name)
        if existing is None:
            new_type = spark_to_iceberg_type(
                incoming_field.dataType, lambda: next(counter), incoming_field.name
            )
            fields.append(NestedField(next(counter), incoming_field.name, new_type))
            changed = True
        elif isinstance(existing.field_type, StructType) and isinstance(
            incoming_field.dataType, st.StructType
        ):
            merged, child_changed = _merged_struct(existing.field_type, incoming_field.dataType)
            if child_changed:
                fields[fields.index(existing)] = existing.replace(field_type=merged)
                changed = True
    return StructType(*fields), changed


async def _evolve_schema(catalog: Catalog, table: Table, incoming: st.StructType) -> Table:
    """Add the DataFrame's new columns to the table (optional, fresh ids), if it has any."""

    async def build(base: Table) -> TableMetadata:
        metadata = base.metadata
        schema = metadata.schema()
        merged, changed = _merged_struct(schema.struct, incoming)
        if not changed:
            return metadata
        update = UpdateSchema(schema, metadata.last_column_id, metadata.format_version)
        new_schema, last_column_id = update.union_by_name(Schema.from_struct(merged)).apply()
        return (
            MetadataBuilder(metadata)
            .add_schema(new_schema, last_column_id)
            .set_current_schema(-1)
            .build(base.metadata_location)
        )

    def applied(current: Table) -> bool:
        return not _merged_struct(current.metadata.schema().struct, incoming)[1]

    if applied(table):
        return table
    evolved = await commit_with_retry(catalog, table, build, applied)
    log.info(
        "evolved the schema of %s to schema %d for new DataFrame columns",
        table.identifier,
        evolved.metadata.current_schema_id,
    )
    return evolved


async def load_for_write(
    uri: str, identifier: TableIdentifier, incoming: st.StructType | None
) -> tuple[Table, Catalog]:
    catalog = await BACKGROUND.catalog(uri)
    table = await catalog.load_table(identifier)
    if incoming is not None:
        table = await _evolve_schema(catalog, table, incoming)
    return table, catalog


def split_events(
    make: Callable[[list[DataFile]], FilesWritten], files: list[DataFile], max_bytes: int
) -> list[FilesWritten]:
    event = make(files)
    if len(files) <= 1 or len(encode_event(event)) <= max_bytes:
        return [event]
    half = len(files) // 2
    return split_events(make, files[:half], max_bytes) + split_events(make, files[half:], max_bytes)


def attempts_may_have_failed(spark: SparkSession, stages: Iterable[int]) -> bool:
    """Whether some task attempt may have left files behind: Spark saw failed tasks or stage
    retries, or speculation may have run duplicates. Unknown counts as yes."""
    context = spark.sparkContext
    if (context.getConf().get("spark.speculation") or "false").lower() == "true":
        return True
    tracker = context.statusTracker()
    for stage_id in stages:
        info = tracker.getStageInfo(stage_id)
        if info is None or info.numFailedTasks > 0 or info.currentAttemptId > 0:
            return True
    return False


async def delete_job_files(
    uri: str, job_id: str, directories: Iterable[str], keep: set[str]
) -> list[str]:
    """Delete the job's files under ``directories`` that are not in ``keep``."""
    catalog = await BACKGROUND.catalog(uri)
    deleted: list[str] = []
    for directory in sorted(set(directories)):
        try:
            async for info in catalog.io.list(directory):
                if is_job_file(info.path, job_id) and info.path not in keep:
                    await catalog.io.delete(info.path)
                    deleted.append(info.path)
        except NotFoundError:
            continue
    if deleted:
        log.info("deleted %d uncommitted file(s) of job %s", len(deleted), job_id)
    return deleted


async def delete_paths(uri: str, paths: Iterable[str]) -> None:
    catalog = await BACKGROUND.catalog(uri)
    for path in paths:
        with contextlib.suppress(NotFoundError):
            await catalog.io.delete(path)


async def committed_in(uri: str, identifier: TableIdentifier, commit_id: str) -> int | None:
    """The snapshot of the table that recorded ``commit_id`` (any branch, any writer), if
    any: the same rule the coordinator deduplicates by (:mod:`icefloe.table.commit_index`)."""
    catalog = await BACKGROUND.catalog(uri)
    table = await catalog.load_table(identifier)
    index = CommitIndex()
    index.update(table.metadata)
    return index.get(commit_id)
