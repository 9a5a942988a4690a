"""icefloe from PySpark: write DataFrames through the coordinator, read tables via the planner.

Writing (:func:`write`)
-----------------------
The driver never writes table metadata. It loads the table (schema, spec, properties) from
the catalog, checks the DataFrame against the schema by name (missing required columns and
incompatible types fail here, before any task runs; ``merge_schema=True`` first adds the
DataFrame's new columns to the table), and runs one Spark job whose tasks write Parquet data
files (:mod:`icefloe.spark.tasks`). Each task returns its files' content-file JSON and its
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

Exactly once for streams (:func:`foreach_batch_sink`)
----------------------------------------------------
A micro-batch's commit id is ``<query id or sink id>:<batch id>``, stable across restarts
from a checkpoint. The sink skips a batch whose commit id the table's history already
records, and the coordinator acknowledges a commit id it already applied instead of
committing it again; when that happens, the replay's own files are found absent from the
acknowledged snapshot and deleted.

Reading (:func:`read`)
----------------------
The driver asks the scan planner (REST ``planTableScan``, following ``plan-tasks`` through
``fetchScanTasks``, polling while the plan is ``submitted``) for file scan tasks and builds a
DataFrame from them: one row per task, turned into table rows by :func:`read_task` in
``mapInArrow``. Types map to Spark as Iceberg's Spark integration does, except where Spark
has no equivalent: ``uuid`` reads as its string form, ``fixed`` as binary, ``time`` as a long
of microseconds since midnight and ``timestamp_ns``/``timestamptz_ns`` as longs of
nanoseconds since the epoch (never truncated silently); writes accept those forms back.

Kafka clients and catalogs live on one background event loop per driver process, shared by
every job and thread (streaming queries run their batches on their own threads), so a job
does not pay for a new connection, and :func:`write` works from code that already runs an
event loop. :func:`shutdown` closes them; it also runs at interpreter exit.

Configuration comes from :class:`~icefloe.spark.config.SparkConfig`: ``config=`` arguments,
then ``spark.icefloe.*`` session settings, then ``ICEFLOE_*`` environment variables.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import importlib.util
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar
from urllib.parse import quote

import aiohttp
import pyarrow as pa
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as st

from icefloe.arrow_schema import conform_table
from icefloe.binding import bind
from icefloe.catalog import Catalog, Table, TableIdentifier, data_dir
from icefloe.catalog_uri import load_catalog
from icefloe.commit import commit_with_retry
from icefloe.commit_index import CommitIndex
from icefloe.content_file import content_file_from_json
from icefloe.datafile import DataFile
from icefloe.errors import (
    CommitStateUnknownError,
    EventRejectedError,
    IcefloeError,
    NotFoundError,
    SchemaEvolutionError,
    ValidationError,
)
from icefloe.events import (
    CommitOperation,
    CommitRequested,
    DeadLetter,
    FilesWritten,
    TableCommitted,
    encode_event,
    event_key,
    parse_event,
)
from icefloe.expression_json import expression_to_json, parse_expression
from icefloe.expressions import (
    AlwaysTrue,
    BooleanExpression,
    BooleanExpressionVisitor,
    BoundPredicate,
)
from icefloe.expressions import visit as visit_expression
from icefloe.manifest_reader import ManifestReader
from icefloe.metadata import TableMetadata
from icefloe.metadata_builder import MetadataBuilder
from icefloe.partition import PartitionSpec
from icefloe.schema import Schema
from icefloe.schema_update import UpdateSchema
from icefloe.spark.config import SPARK_CONF_PREFIX, SparkConfig
from icefloe.spark.tasks import (
    READ_TASK_COLUMN,
    WRITE_RESULT_SCHEMA,
    ReadJob,
    WriteJob,
    is_job_file,
    prepare_input,
    read_task,
    write_task,
)
from icefloe.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    GeographyType,
    GeometryType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestampNanoType,
    TimestampType,
    TimestamptzNanoType,
    TimestamptzType,
    TimeType,
    UnknownType,
    UUIDType,
)

log = logging.getLogger("icefloe.spark")

WriteMode = Literal["append", "overwrite", "overwrite-partitions"]
ConfigArg = SparkConfig | Mapping[str, Any] | None
FilterArg = BooleanExpression | Mapping[str, Any] | bool | str | None

STREAMING_QUERY_ID_PROPERTY = "sql.streaming.queryId"
"""The local property Spark sets to the streaming query's id while a batch runs."""
BATCH_ID_PROPERTY = "spark.streaming.batch-id"
QUERY_ID_PROPERTY = "spark.streaming.query-id"

_STATS_KEYS = (
    "column-sizes",
    "value-counts",
    "null-value-counts",
    "nan-value-counts",
    "lower-bounds",
    "upper-bounds",
)
_PLAN_POLL_MIN_S = 0.05
_PLAN_POLL_MAX_S = 2.0

T = TypeVar("T")


# ---------------------------------------------------------------------------------------
# The driver's background event loop and what lives on it
# ---------------------------------------------------------------------------------------


class _Background:
    """One event loop thread per process for Kafka clients, catalogs and HTTP sessions."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.catalogs: dict[str, Catalog] = {}
        self.channels: dict[tuple[Any, ...], CommitChannel] = {}
        self.channel_locks: dict[tuple[Any, ...], asyncio.Lock] = {}

    def _ensure(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._thread is None or not self._thread.is_alive():
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name="icefloe-spark-driver", daemon=True
                )
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the background loop and wait for it from this thread."""
        future = asyncio.run_coroutine_threadsafe(coro, self._ensure())
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    async def catalog(self, uri: str) -> Catalog:
        found = self.catalogs.get(uri)
        if found is None:
            found = self.catalogs[uri] = load_catalog(uri)
        return found

    async def channel(self, config: SparkConfig) -> CommitChannel:
        key = config.cache_key()
        lock = self.channel_locks.setdefault(key, asyncio.Lock())
        async with lock:
            found = self.channels.get(key)
            if found is None or found.broken:
                if found is not None:
                    await found.close()
                found = CommitChannel(config)
                await found.start()
                self.channels[key] = found
            return found

    async def _close_all(self) -> None:
        channels, self.channels = list(self.channels.values()), {}
        catalogs, self.catalogs = list(self.catalogs.values()), {}
        for channel in channels:
            with contextlib.suppress(Exception):
                await channel.close()
        for catalog in catalogs:
            with contextlib.suppress(Exception):
                await catalog.close()

    def shutdown(self, timeout_s: float = 30.0) -> None:
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None or not thread.is_alive():
            return
        future = asyncio.run_coroutine_threadsafe(self._close_all(), loop)
        with contextlib.suppress(Exception):
            future.result(timeout_s)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout_s)
        if not thread.is_alive():
            loop.close()
        self.channel_locks.clear()


_BACKGROUND = _Background()


def shutdown() -> None:
    """Close the Kafka clients and catalogs this process opened for Spark jobs."""
    _BACKGROUND.shutdown()


atexit.register(shutdown)


def _settings(spark: SparkSession, config: ConfigArg) -> SparkConfig:
    if isinstance(config, SparkConfig):
        return config
    # Launch settings, then session settings (spark.conf.set) on top.
    conf = {
        key: value
        for key, value in spark.sparkContext.getConf().getAll()
        if key.startswith(SPARK_CONF_PREFIX)
    }
    conf.update({k: v for k, v in spark.conf.getAll.items() if k.startswith(SPARK_CONF_PREFIX)})
    return SparkConfig.load(conf, config)


# ---------------------------------------------------------------------------------------
# The commit channel: events out, results and rejections in
# ---------------------------------------------------------------------------------------


class CommitChannel:
    """A producer to the events topic and a consumer of the results and dead-letter topics.

    The consumer reads from the topics' ends as of :meth:`start`, so every result produced
    after a commit request is sent is seen; waiters are keyed by commit id.
    """

    def __init__(self, config: SparkConfig) -> None:
        self.config = config
        self.broken = False
        self._producer: AIOKafkaProducer | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._listener: asyncio.Task[None] | None = None
        self._waiters: dict[str, _Waiter] = {}

    async def start(self) -> None:
        options = self.config.kafka_options()
        self._consumer = AIOKafkaConsumer(
            **options, group_id=None, enable_auto_commit=False, auto_offset_reset="latest"
        )
        await self._consumer.start()
        try:
            available = await self._consumer.topics()
            partitions: list[TopicPartition] = []
            for topic in (self.config.results_topic, self.config.dead_letter_topic):
                ids = self._consumer.partitions_for_topic(topic) if topic in available else None
                if not ids:
                    raise ValidationError(
                        f"Kafka topic {topic!r} does not exist on {self.config.brokers}: start "
                        "the coordinator first (it creates its topics), or check "
                        "spark.icefloe.results-topic / dead-letter-topic"
                    )
                partitions.extend(TopicPartition(topic, p) for p in sorted(ids))
            self._consumer.assign(partitions)
            await self._consumer.seek_to_end(*partitions)
            for tp in partitions:
                await self._consumer.position(tp)
            self._producer = AIOKafkaProducer(
                **options,
                acks="all",
                enable_idempotence=False,
                linger_ms=5,
                max_request_size=max(1 << 20, 2 * self.config.event_max_bytes),
            )
            await self._producer.start()
        except BaseException:
            await self.close()
            raise
        self._listener = asyncio.create_task(self._listen(), name="icefloe-spark-results")

    async def close(self) -> None:
        self.broken = True
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._listener
        for client in (self._producer, self._consumer):
            if client is not None:
                with contextlib.suppress(Exception):
                    await client.stop()
        self._producer = self._consumer = None

    async def _listen(self) -> None:
        assert self._consumer is not None
        try:
            while True:
                batches = await self._consumer.getmany(timeout_ms=500, max_records=1000)
                for records in batches.values():
                    for record in records:
                        self._dispatch(record.value or b"")
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self.broken = True
            for waiter in self._waiters.values():
                waiter.fail(CommitStateUnknownError(f"lost the results topic while waiting: {e}"))
            raise

    def _dispatch(self, value: bytes) -> None:
        try:
            event = parse_event(value)
        except ValidationError:
            return  # not ours to judge: the coordinator's contract, other producers
        if isinstance(event, TableCommitted):
            for commit_id in event.commit_ids:
                waiter = self._waiters.get(commit_id)
                if waiter is not None:
                    waiter.committed(event)
        elif isinstance(event, DeadLetter):
            try:
                original = parse_event(event.original)
            except ValidationError:
                return
            if isinstance(original, FilesWritten | CommitRequested):
                waiter = self._waiters.get(original.commit_id)
                if waiter is not None:
                    waiter.rejected(original, event.reason)

    async def commit(
        self, events: Sequence[FilesWritten], request: CommitRequested, timeout_s: float
    ) -> TableCommitted:
        """Publish ``events`` then ``request``; the ``table-committed`` of its commit id.

        Raises EventRejectedError when the coordinator dead-letters the request or one of
        its events (nothing was committed), CommitStateUnknownError when no answer came in
        time (the commit may still happen).
        """
        if self.broken or self._producer is None:
            raise CommitStateUnknownError("the commit channel is closed")
        if request.commit_id in self._waiters:
            raise ValidationError(
                f"commit id {request.commit_id!r} is already being committed by this process"
            )
        waiter = _Waiter(request, asyncio.get_running_loop().create_future())
        self._waiters[request.commit_id] = waiter
        key = event_key(request.table)
        topic = self.config.events_topic
        requested = False
        try:
            await asyncio.gather(
                *(self._producer.send_and_wait(topic, encode_event(e), key) for e in events)
            )
            requested = True
            await self._producer.send_and_wait(topic, encode_event(request), key)
            return await asyncio.wait_for(asyncio.shield(waiter.future), timeout_s)
        except TimeoutError:
            raise CommitStateUnknownError(
                f"no table-committed for commit id {request.commit_id!r} of {request.table} "
                f"within {timeout_s:g}s; the coordinator may still commit it. Its files were "
                "kept; the table was checked for the commit id before this was raised, and "
                "retrying with the same commit id is safe (a commit id is applied at most once)"
            ) from None
        except KafkaError as e:
            if requested:
                raise CommitStateUnknownError(
                    f"sending the commit request for {request.commit_id!r} failed ({e}); it "
                    "may or may not have reached the coordinator"
                ) from e
            raise
        finally:
            self._waiters.pop(request.commit_id, None)


@dataclass
class _Waiter:
    request: CommitRequested
    future: asyncio.Future[TableCommitted]

    def committed(self, event: TableCommitted) -> None:
        if not self.future.done():
            self.future.set_result(event)

    def fail(self, error: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(error)

    def rejected(self, original: FilesWritten | CommitRequested, reason: str) -> None:
        kind, _, message = reason.partition(": ")
        if isinstance(original, FilesWritten):
            if original.event_id not in self.request.event_ids:
                return  # another run's events of this commit id
            if kind == "late-files":
                # The commit id is already queued or done: a replay. The acknowledgement
                # (table-committed) follows, and the replay's files are then cleaned up.
                return
            what = f"files-written event {original.event_id}"
        elif original.event_id == self.request.event_id:
            what = "the commit request"
        else:
            return
        self.fail(
            EventRejectedError(
                kind or "rejected",
                f"the coordinator rejected {what} of commit {self.request.commit_id!r} for "
                f"{self.request.table}: {message or reason}",
            )
        )


# ---------------------------------------------------------------------------------------
# Type mapping between Iceberg and Spark
# ---------------------------------------------------------------------------------------


def iceberg_to_spark_type(t: IcebergType) -> st.DataType:
    """The Spark type a column of Iceberg type ``t`` reads as (see the module docstring)."""
    simple: dict[type[IcebergType], st.DataType] = {
        BooleanType: st.BooleanType(),
        IntegerType: st.IntegerType(),
        LongType: st.LongType(),
        FloatType: st.FloatType(),
        DoubleType: st.DoubleType(),
        DateType: st.DateType(),
        TimeType: st.LongType(),
        TimestampType: st.TimestampNTZType(),
        TimestamptzType: st.TimestampType(),
        TimestampNanoType: st.LongType(),
        TimestamptzNanoType: st.LongType(),
        StringType: st.StringType(),
        UUIDType: st.StringType(),
        BinaryType: st.BinaryType(),
        FixedType: st.BinaryType(),
        GeometryType: st.BinaryType(),
        GeographyType: st.BinaryType(),
        UnknownType: st.NullType(),
    }
    found = simple.get(type(t))
    if found is not None:
        return found
    if isinstance(t, DecimalType):
        return st.DecimalType(t.precision, t.scale)
    if isinstance(t, StructType):
        return st.StructType(
            [
                st.StructField(f.name, iceberg_to_spark_type(f.field_type), not f.required)
                for f in t.fields
            ]
        )
    if isinstance(t, ListType):
        return st.ArrayType(iceberg_to_spark_type(t.element_type), not t.element_required)
    if isinstance(t, MapType):
        return st.MapType(
            iceberg_to_spark_type(t.key_type),
            iceberg_to_spark_type(t.value_type),
            not t.value_required,
        )
    raise ValidationError(f"Iceberg type {t} cannot be read into Spark by icefloe")


def spark_schema(schema: Schema) -> st.StructType:
    """The Spark schema of a table schema."""
    struct = iceberg_to_spark_type(schema.struct)
    assert isinstance(struct, st.StructType)
    return struct


def spark_to_iceberg_type(
    dt: st.DataType, next_id: Callable[[], int], path: str, format_version: int = 2
) -> IcebergType:
    """The Iceberg type to store a new Spark column of type ``dt`` (fresh field ids)."""
    if isinstance(dt, st.BooleanType):
        return BooleanType()
    if isinstance(dt, st.ByteType | st.ShortType | st.IntegerType):
        return IntegerType()
    if isinstance(dt, st.LongType):
        return LongType()
    if isinstance(dt, st.FloatType):
        return FloatType()
    if isinstance(dt, st.DoubleType):
        return DoubleType()
    if isinstance(dt, st.DecimalType):
        return DecimalType(dt.precision, dt.scale)
    if isinstance(dt, st.StringType | st.VarcharType | st.CharType):
        return StringType()
    if isinstance(dt, st.BinaryType):
        return BinaryType()
    if isinstance(dt, st.DateType):
        return DateType()
    if isinstance(dt, st.TimestampType):
        return TimestamptzType()
    if isinstance(dt, st.TimestampNTZType):
        return TimestampType()
    if isinstance(dt, st.TimeType):
        return TimeType()
    if isinstance(dt, st.NullType) and format_version >= 3:
        return UnknownType()
    if isinstance(dt, st.StructType):
        return StructType(
            *(
                NestedField(
                    next_id(),
                    f.name,
                    spark_to_iceberg_type(f.dataType, next_id, f"{path}.{f.name}", format_version),
                    required=False,
                )
                for f in dt.fields
            )
        )
    if isinstance(dt, st.ArrayType):
        element_id = next_id()
        return ListType(
            element_id,
            spark_to_iceberg_type(dt.elementType, next_id, f"{path}.element", format_version),
            element_required=not dt.containsNull,
        )
    if isinstance(dt, st.MapType):
        key_id, value_id = next_id(), next_id()
        return MapType(
            key_id,
            spark_to_iceberg_type(dt.keyType, next_id, f"{path}.key", format_version),
            value_id,
            spark_to_iceberg_type(dt.valueType, next_id, f"{path}.value", format_version),
            value_required=not dt.valueContainsNull,
        )
    raise SchemaEvolutionError(
        f"column {path!r} has Spark type {dt.simpleString()}, which icefloe cannot add to an "
        f"Iceberg v{format_version} table"
    )


def _arrow_schema_of(df_schema: st.StructType, timezone: str) -> pa.Schema:
    from pyspark.errors import PySparkException
    from pyspark.sql.pandas.types import to_arrow_schema

    try:
        return to_arrow_schema(df_schema, timezone=timezone)
    except (PySparkException, TypeError, ValueError) as e:
        raise ValidationError(
            f"the DataFrame ({df_schema.simpleString():.200}) has a column Spark cannot hand "
            f"to Python as Arrow: {e}"
        ) from None


def _map_in_arrow(
    df: DataFrame, func: Callable[..., Any], schema: str | st.StructType
) -> DataFrame:
    """``df.mapInArrow`` without PySpark's pandas requirement (Arrow is all it uses).

    PySpark builds the UDF behind ``mapInArrow`` with ``pandas_udf``, which insists on
    pandas being installed although Arrow batches never touch it; without pandas the same
    UDF is built directly.
    """
    jdf = getattr(df, "_jdf", None)
    if importlib.util.find_spec("pandas") is None and jdf is not None:
        from pyspark.sql.pandas import functions as pandas_functions
        from pyspark.util import PythonEvalType

        udf = pandas_functions.vectorized_udf(  # type: ignore[attr-defined]
            func,
            returnType=schema,
            functionType=PythonEvalType.SQL_MAP_ARROW_ITER_UDF,
            kind="pandas",
        )
        column = udf(*[df[c] for c in df.columns])
        return DataFrame(jdf.mapInArrow(column._jc, False, None), df.sparkSession)
    return df.mapInArrow(func, schema)


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

    @property
    def record_count(self) -> int:
        return sum(f.record_count for f in self.files)

    @property
    def paths(self) -> set[str]:
        return {f.file_path for f in self.files}

    def discard(self) -> None:
        """Delete every file of this job (it will not be committed)."""
        _BACKGROUND.run(
            _delete_job_files(self.catalog_uri, self.job_id, self.directories, keep=set())
        )

    @property
    def directories(self) -> set[str]:
        """Where the job wrote (the data directory when it wrote nothing)."""
        return {f.file_path.rsplit("/", 1)[0] for f in self.files} or {self.data_dir}


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


async def _load_for_write(
    uri: str, identifier: TableIdentifier, incoming: st.StructType | None
) -> tuple[Table, Catalog]:
    catalog = await _BACKGROUND.catalog(uri)
    table = await catalog.load_table(identifier)
    if incoming is not None:
        table = await _evolve_schema(catalog, table, incoming)
    return table, catalog


def check_dataframe_schema(df_schema: st.StructType, schema: Schema, timezone: str = "UTC") -> None:
    """Raise a ValidationError if rows of ``df_schema`` cannot be written to ``schema``:
    unknown or duplicate columns, missing required columns, incompatible types."""
    empty = _arrow_schema_of(df_schema, timezone).empty_table()
    conform_table(prepare_input(empty, schema), schema)


def _filter_json(expr: FilterArg) -> Any:
    if expr is None:
        return None
    if isinstance(expr, BooleanExpression):
        return expression_to_json(expr)
    if isinstance(expr, str):
        try:
            return json.loads(expr)
        except ValueError:
            raise ValidationError(
                f"filter {expr!r:.80} is not JSON: pass an icefloe expression or its JSON form "
                "(expressions spec)"
            ) from None
    return expr if isinstance(expr, bool) else dict(expr)


def _operation(mode: str, overwrite_filter: FilterArg) -> tuple[CommitOperation, Any]:
    if mode == "append":
        if overwrite_filter is not None:
            raise ValidationError("overwrite_filter is only allowed with mode='overwrite'")
        return CommitOperation.APPEND, None
    if mode == "overwrite":
        flt = _filter_json(overwrite_filter)
        return CommitOperation.OVERWRITE, (expression_to_json(AlwaysTrue()) if flt is None else flt)
    if mode == "overwrite-partitions":
        if overwrite_filter is not None:
            raise ValidationError(
                "mode='overwrite-partitions' replaces the partitions written; it takes no filter"
            )
        return CommitOperation.OVERWRITE, None
    raise ValidationError(
        f"unknown write mode {mode!r}; use 'append', 'overwrite' or 'overwrite-partitions'"
    )


def _split_events(
    make: Callable[[list[DataFile]], FilesWritten], files: list[DataFile], max_bytes: int
) -> list[FilesWritten]:
    event = make(files)
    if len(files) <= 1 or len(encode_event(event)) <= max_bytes:
        return [event]
    half = len(files) // 2
    return _split_events(make, files[:half], max_bytes) + _split_events(
        make, files[half:], max_bytes
    )


def stage_write(
    df: DataFrame,
    table: str | TableIdentifier,
    *,
    merge_schema: bool = False,
    commit_id: str | None = None,
    config: ConfigArg = None,
    branch: str | None = None,
) -> StagedWrite:
    """Write ``df``'s data files and build their events, without committing anything.

    :func:`write` is this followed by :func:`commit_staged`; benchmarks and custom
    pipelines may call the two steps themselves.
    """
    settings = _settings(df.sparkSession, config)
    uri = settings.require_catalog()
    identifier = TableIdentifier.parse(table)
    timezone = df.sparkSession.conf.get("spark.sql.session.timeZone") or "UTC"
    loaded, catalog = _BACKGROUND.run(
        _load_for_write(uri, identifier, df.schema if merge_schema else None)
    )
    metadata = loaded.metadata
    schema, spec = metadata.schema(), metadata.spec()
    try:
        check_dataframe_schema(df.schema, schema, timezone)
    except ValidationError as e:
        hint = "" if merge_schema else " (merge_schema=True adds new columns to the table)"
        raise ValidationError(f"cannot write this DataFrame to {identifier}: {e}{hint}") from None
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
    result = _map_in_arrow(df, functools.partial(write_task, job), WRITE_RESULT_SCHEMA)
    try:
        rows = result.collect()
    except Exception:
        log.warning("Spark job %s writing %s failed; deleting its files", job.job_id, identifier)
        with contextlib.suppress(Exception):
            _BACKGROUND.run(_delete_job_files(uri, job.job_id, {job.data_dir}, keep=set()))
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
                    part,
                )

            events.extend(_split_events(make, chunk, settings.event_max_bytes))
    files = [f for fs in by_attempt.values() for f in fs]
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
        needs_listing=_attempts_may_have_failed(df.sparkSession, stages),
        catalog_uri=uri,
        config=settings,
    )


def _attempts_may_have_failed(spark: SparkSession, stages: Iterable[int]) -> bool:
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


async def _delete_job_files(
    uri: str, job_id: str, directories: Iterable[str], keep: set[str]
) -> list[str]:
    """Delete the job's files under ``directories`` that are not in ``keep``."""
    catalog = await _BACKGROUND.catalog(uri)
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


async def _delete(uri: str, paths: Iterable[str]) -> None:
    catalog = await _BACKGROUND.catalog(uri)
    for path in paths:
        with contextlib.suppress(NotFoundError):
            await catalog.io.delete(path)


async def _snapshot_adds_any(uri: str, committed: TableCommitted, paths: set[str]) -> bool:
    """Whether the acknowledged snapshot added any of ``paths``; True when it cannot tell,
    so that files are only ever deleted when they are certainly not in the table."""
    catalog = await _BACKGROUND.catalog(uri)
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
    operation, filter_json = _operation(mode, overwrite_filter)
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
        _BACKGROUND.run(_cleanup(staged, committed=None))
        return None
    request = CommitRequested(
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
    timeout = timeout_s if timeout_s is not None else settings.commit_timeout_s

    async def run() -> TableCommitted:
        channel = await _BACKGROUND.channel(settings)
        return await channel.commit(staged.events, request, timeout)

    started = time.monotonic()
    try:
        committed = _BACKGROUND.run(run())
    except (EventRejectedError, CommitStateUnknownError) as e:
        # Before retrying, giving up or deleting anything, ask the table itself: the
        # commit id may be in it (a lost announcement, or a replay refused as such).
        holder = _BACKGROUND.run(_committed_in(uri, staged.identifier, staged.commit_id))
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
            _BACKGROUND.run(_cleanup(staged, committed=None, only_not_live=True))
            return holder
        if isinstance(e, EventRejectedError):
            _BACKGROUND.run(_cleanup(staged, committed=None, only_not_live=True))
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
        if not _BACKGROUND.run(_snapshot_adds_any(uri, committed, ours)):
            log.info(
                "commit id %s of %s was already committed in snapshot %d; this replay's %d "
                "file(s) are not in the table and are deleted",
                staged.commit_id,
                staged.identifier,
                committed.snapshot_id,
                len(ours),
            )
            _BACKGROUND.run(
                _cleanup(staged, committed=None, orphans=committed.orphan_files, only_not_live=True)
            )
            return committed.snapshot_id
    _BACKGROUND.run(_cleanup(staged, committed=committed, orphans=committed.orphan_files))
    return committed.snapshot_id


async def _live_files(uri: str, identifier: TableIdentifier) -> set[str]:
    """Every file live in any branch or tag of the table (read from its manifests)."""
    catalog = await _BACKGROUND.catalog(uri)
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
            await _delete_job_files(staged.catalog_uri, staged.job_id, staged.directories, keep)
            await _delete(staged.catalog_uri, [p for p in staged.paths if p not in keep])
        elif staged.needs_listing:
            await _delete_job_files(
                staged.catalog_uri, staged.job_id, staged.directories, keep=staged.paths
            )
        if orphans:
            await _delete(staged.catalog_uri, [p for p in orphans if p not in staged.paths])
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
) -> int | None:
    """Write ``df`` to ``table`` ("ns.table") through the coordinator; the new snapshot id.

    ``mode``: ``append``; ``overwrite`` deletes the rows matching ``overwrite_filter`` (an
    icefloe expression or its JSON; the whole table when None) and adds ``df``;
    ``overwrite-partitions`` replaces the partitions ``df`` writes. Returns None when there
    was nothing to commit. ``commit_id`` (default: a fresh one) makes a retried job
    idempotent: a commit id the table already holds is acknowledged, not applied again.
    """
    _operation(mode, overwrite_filter)  # refuse a bad mode before running any job
    staged = stage_write(
        df, table, merge_schema=merge_schema, commit_id=commit_id, config=config, branch=branch
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


# ---------------------------------------------------------------------------------------
# Structured Streaming
# ---------------------------------------------------------------------------------------


async def _committed_in(uri: str, identifier: TableIdentifier, commit_id: str) -> int | None:
    """The snapshot of the table that recorded ``commit_id`` (any branch, any writer), if
    any: the same rule the coordinator deduplicates by (:mod:`icefloe.commit_index`)."""
    catalog = await _BACKGROUND.catalog(uri)
    table = await catalog.load_table(identifier)
    index = CommitIndex()
    index.update(table.metadata)
    return index.get(commit_id)


def foreach_batch_sink(
    table: str | TableIdentifier,
    *,
    sink_id: str | None = None,
    mode: Literal["append", "overwrite"] = "append",
    branch: str | None = None,
    merge_schema: bool = False,
    snapshot_properties: Mapping[str, str] | None = None,
    config: ConfigArg = None,
    timeout_s: float | None = None,
) -> Callable[[DataFrame, int], None]:
    """A ``foreachBatch`` function that commits each micro-batch to ``table`` exactly once.

    The commit id is ``<sink_id>:<batch id>``; ``sink_id`` defaults to the streaming query's
    id, which survives restarts from the same checkpoint. Give one explicitly when several
    queries (or a new checkpoint) must share one sequence of batch ids. ``mode='overwrite'``
    replaces the table's rows with each batch (for the complete output mode).
    """
    identifier = TableIdentifier.parse(table)

    def sink(df: DataFrame, batch_id: int) -> None:
        query_id = sink_id or df.sparkSession.sparkContext.getLocalProperty(
            STREAMING_QUERY_ID_PROPERTY
        )
        if not query_id:
            raise ValidationError(
                f"foreach_batch_sink for {identifier} runs outside a streaming query: pass "
                "sink_id so each batch gets a stable commit id"
            )
        commit_id = f"{query_id}:{batch_id}"
        settings = _settings(df.sparkSession, config)
        done = _BACKGROUND.run(_committed_in(settings.require_catalog(), identifier, commit_id))
        if done is not None:
            log.info(
                "batch %d of %s is already in %s (snapshot %d): skipped",
                batch_id,
                query_id,
                identifier,
                done,
            )
            return
        props = {BATCH_ID_PROPERTY: str(batch_id), QUERY_ID_PROPERTY: str(query_id)}
        props.update(snapshot_properties or {})
        write(
            df,
            identifier,
            mode,
            branch=branch,
            merge_schema=merge_schema,
            snapshot_properties=props,
            commit_id=commit_id,
            config=settings,
            timeout_s=timeout_s,
        )

    return sink


# ---------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------


class PlanningError(IcefloeError):
    """The scan planner failed or refused a request; the message carries its answer."""


@dataclass
class ScanPlan:
    """File scan tasks with their delete files inlined (``delete-files``) and residuals."""

    tasks: list[dict[str, Any]] = field(default_factory=list)


class PlannerClient:
    """The client side of REST scan planning (``planTableScan``, ``fetchScanTasks``...)."""

    def __init__(self, base_url: str, prefix: str | None = None, timeout_s: float = 120.0):
        self.base_url = base_url.rstrip("/")
        self.prefix = prefix.strip("/") if prefix else None
        self.timeout_s = timeout_s

    def _table_url(self, identifier: TableIdentifier) -> str:
        namespace = quote("\x1f".join(identifier.namespace), safe="")
        root = f"{self.base_url}/v1/" + (f"{quote(self.prefix, safe='')}/" if self.prefix else "")
        return f"{root}namespaces/{namespace}/tables/{quote(identifier.name, safe='')}"

    async def _call(
        self,
        session: aiohttp.ClientSession,
        method: str,
        url: str,
        body: Any = None,
        what: str = "",
    ) -> Any:
        try:
            async with session.request(method, url, json=body) as response:
                text = await response.text()
                if response.status == 204:
                    return None
                try:
                    payload = json.loads(text) if text else None
                except ValueError:
                    payload = None
                if response.status >= 400:
                    error = (payload or {}).get("error", {}) if isinstance(payload, dict) else {}
                    message = error.get("message") or text[:300] or response.reason
                    kind = error.get("type") or f"HTTP {response.status}"
                    if response.status == 404:
                        raise NotFoundError(f"{what}: {kind}: {message}")
                    if response.status == 400:
                        raise ValidationError(f"{what}: {kind}: {message}")
                    raise PlanningError(f"{what}: {kind} ({response.status}): {message}")
                if not isinstance(payload, dict):
                    raise PlanningError(f"{what}: the planner answered {text[:200]!r}, not JSON")
                return payload
        except aiohttp.ClientError as e:
            raise PlanningError(f"{what}: cannot reach the planner at {url}: {e}") from e

    async def load_table(self, identifier: TableIdentifier) -> tuple[TableMetadata, dict[str, str]]:
        """``loadTable``: the table's current metadata and the ``config`` the catalog hands
        to clients (storage properties such as ``s3.endpoint``)."""
        async with self._session() as session:
            payload = await self._call(
                session, "GET", self._table_url(identifier), what=f"loading {identifier}"
            )
        try:
            metadata = TableMetadata.from_json(payload["metadata"], what=f"table {identifier}")
        except (KeyError, TypeError):
            raise PlanningError(f"loading {identifier}: the answer has no 'metadata'") from None
        config = payload.get("config") or {}
        return metadata, {str(k): str(v) for k, v in config.items()}

    def _session(self) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))

    async def plan(self, identifier: TableIdentifier, request: Mapping[str, Any]) -> ScanPlan:
        """Every file scan task of a scan, following plan tasks and polling async plans."""
        url = f"{self._table_url(identifier)}/plan"
        what = f"planning a scan of {identifier}"
        plan = ScanPlan()
        plan_id: str | None = None
        finished = False
        deadline = time.monotonic() + self.timeout_s
        async with self._session() as session:
            try:
                result = await self._call(session, "POST", url, dict(request), what)
                plan_id = result.get("plan-id")
                delay = _PLAN_POLL_MIN_S
                while result.get("status") == "submitted":
                    if plan_id is None:
                        raise PlanningError(f"{what}: 'submitted' without a plan-id")
                    if time.monotonic() > deadline:
                        raise PlanningError(
                            f"{what}: plan {plan_id} not completed within {self.timeout_s:g}s"
                        )
                    await asyncio.sleep(delay)
                    delay = min(_PLAN_POLL_MAX_S, delay * 2)
                    result = await self._call(
                        session, "GET", f"{url}/{quote(plan_id, safe='')}", what=what
                    )
                status = result.get("status")
                if status == "failed":
                    error = result.get("error") or {}
                    raise PlanningError(f"{what}: planning failed: {error.get('message', error)}")
                if status != "completed":
                    raise PlanningError(f"{what}: unexpected planning status {status!r}")
                # A task without a residual uses the request's filter (REST spec).
                default = request.get("filter")
                pending = list(self._collect(result, plan, what, default))
                tasks_url = f"{self._table_url(identifier)}/tasks"
                while pending:
                    page = await self._call(
                        session, "POST", tasks_url, {"plan-task": pending.pop()}, what
                    )
                    pending.extend(self._collect(page, plan, what, default))
                finished = True
            finally:
                if plan_id is not None and not finished:
                    with contextlib.suppress(Exception):
                        await self._call(
                            session, "DELETE", f"{url}/{quote(plan_id, safe='')}", what=what
                        )
        return plan

    @staticmethod
    def _collect(
        page: Mapping[str, Any], plan: ScanPlan, what: str, default_residual: Any = None
    ) -> list[str]:
        deletes = page.get("delete-files") or []
        for task in page.get("file-scan-tasks") or []:
            if not isinstance(task, dict) or not isinstance(task.get("data-file"), dict):
                raise PlanningError(f"{what}: a file scan task has no 'data-file': {task!r:.200}")
            refs = task.get("delete-file-references") or []
            try:
                inlined = [deletes[i] for i in refs]
            except (IndexError, TypeError):
                raise PlanningError(
                    f"{what}: task for {task['data-file'].get('file-path')} references delete "
                    f"files {refs}, but the response lists {len(deletes)}"
                ) from None
            plan.tasks.append(
                {
                    "data-file": _without_stats(task["data-file"]),
                    "delete-files": [_without_stats(d) for d in inlined],
                    "residual-filter": task.get("residual-filter", default_residual),
                }
            )
        plan_tasks = page.get("plan-tasks") or []
        if not all(isinstance(t, str) for t in plan_tasks):
            raise PlanningError(f"{what}: 'plan-tasks' must be strings")
        return list(plan_tasks)


def _without_stats(content_file: Mapping[str, Any]) -> dict[str, Any]:
    """A content file without column stats: readers do not need them, and bounds of
    columns dropped since would not even parse against the current schema."""
    return {k: v for k, v in content_file.items() if k not in _STATS_KEYS}


class _ColumnNames(BooleanExpressionVisitor[set[str]]):
    """The (dotted) column names a bound expression reads."""

    def visit_true(self) -> set[str]:
        return set()

    def visit_false(self) -> set[str]:
        return set()

    def visit_not(self, child_result: set[str]) -> set[str]:
        return child_result

    def visit_and(self, left_result: set[str], right_result: set[str]) -> set[str]:
        return left_result | right_result

    def visit_or(self, left_result: set[str], right_result: set[str]) -> set[str]:
        return left_result | right_result

    def visit_bound_predicate(self, predicate: BoundPredicate) -> set[str]:
        return {predicate.ref.name}


async def _load_for_read(
    settings: SparkConfig, identifier: TableIdentifier
) -> tuple[TableMetadata, dict[str, str]]:
    if settings.catalog:
        catalog = await _BACKGROUND.catalog(settings.catalog)
        table = await catalog.load_table(identifier)
        return table.metadata, dict(catalog.properties)
    return await _planner(settings).load_table(identifier)


async def _plan_when_visible(
    planner: PlannerClient, identifier: TableIdentifier, request: Mapping[str, Any], wait_s: float
) -> ScanPlan:
    """Plan, waiting up to ``wait_s`` for the planner to see the snapshot.

    The snapshot id comes from the catalog, which the planner follows with a lag of up to
    its refresh interval: right after a commit it may not know the snapshot (or the table)
    yet, and answers 404 for something that exists. Read-your-writes is worth a short wait.
    """
    deadline = time.monotonic() + wait_s
    delay = _PLAN_POLL_MIN_S
    while True:
        try:
            return await planner.plan(identifier, request)
        except NotFoundError:
            if time.monotonic() + delay > deadline:
                raise
            await asyncio.sleep(delay)
            delay = min(_PLAN_POLL_MAX_S, delay * 2)


def _planner(settings: SparkConfig) -> PlannerClient:
    if not settings.planner_url:
        raise ValidationError(
            "no scan planner configured: set spark.icefloe.planner-url (or ICEFLOE_PLANNER_URL)"
            " to the planner's REST address"
        )
    return PlannerClient(settings.planner_url, settings.planner_prefix, settings.planner_timeout_s)


def read(
    spark: SparkSession,
    table: str | TableIdentifier,
    filter: FilterArg = None,
    snapshot_id: int | None = None,
    columns: Sequence[str] | None = None,
    *,
    branch: str | None = None,
    case_sensitive: bool = True,
    config: ConfigArg = None,
) -> DataFrame:
    """A DataFrame of ``table``'s rows, planned by the scan planner.

    ``filter`` (an icefloe expression or its JSON) selects rows; ``snapshot_id`` (or
    ``branch``) time-travels, reading with the schema of that snapshot; ``columns`` (dotted
    names allowed) projects.
    """
    settings = _settings(spark, config)
    identifier = TableIdentifier.parse(table)
    metadata, io_properties = _BACKGROUND.run(_load_for_read(settings, identifier))
    if snapshot_id is not None and branch is not None:
        raise ValidationError("pass snapshot_id or branch, not both")
    snapshot = (
        metadata.snapshot_by_id(snapshot_id)
        if snapshot_id is not None
        else metadata.snapshot_by_ref(branch or "main")
    )
    if snapshot is None and (snapshot_id is not None or branch is not None):
        what = f"snapshot {snapshot_id}" if snapshot_id is not None else f"branch {branch!r}"
        raise NotFoundError(f"table {identifier} has no {what}")
    schema = metadata.schema()
    if snapshot_id is not None and snapshot is not None and snapshot.schema_id is not None:
        schema = metadata.schema_by_id(snapshot.schema_id) or schema
    projected = schema.select(list(columns), case_sensitive) if columns else schema
    out_schema = spark_schema(projected)
    filter_json = _filter_json(filter)
    filter_names: set[str] = set()
    if filter_json is not None:
        try:
            bound = bind(schema, parse_expression(filter_json), case_sensitive)
        except ValidationError as e:
            raise ValidationError(f"filter does not apply to {identifier}: {e}") from None
        filter_names = visit_expression(bound, _ColumnNames())
    if snapshot is None:
        return spark.createDataFrame([], out_schema)
    request: dict[str, Any] = {
        "snapshot-id": snapshot.snapshot_id,
        "case-sensitive": case_sensitive,
        "use-snapshot-schema": snapshot_id is not None,
    }
    if columns:
        request["select"] = list(columns)
    if filter_json is not None:
        request["filter"] = filter_json
    wait_s = settings.planner_timeout_s if settings.catalog else 0.0
    plan = _BACKGROUND.run(_plan_when_visible(_planner(settings), identifier, request, wait_s))
    if not plan.tasks:
        return spark.createDataFrame([], out_schema)
    # Rows are read with the filter's and the equality deletes' columns too, then projected.
    equality_ids = {
        fid
        for task in plan.tasks
        for delete in task["delete-files"]
        if delete.get("content") == "equality-deletes"
        for fid in delete.get("equality-ids") or ()
    }
    wanted = [
        *(columns or [f.name for f in schema.fields]),
        *sorted(filter_names),
        *sorted(n for fid in equality_ids if (n := schema.find_column_name(fid)) is not None),
    ]
    read_schema = schema.select(list(dict.fromkeys(wanted)), case_sensitive)
    timezone = spark.conf.get("spark.sql.session.timeZone") or "UTC"
    job = ReadJob(
        table_schema_json=json.dumps(schema.to_json()),
        read_schema_json=json.dumps(read_schema.to_json()),
        output_names=tuple(f.name for f in projected.fields),
        specs_json=json.dumps([s.to_json() for s in metadata.partition_specs]),
        table_location=metadata.location,
        io_properties=io_properties,
        output_schema=_arrow_schema_of(out_schema, timezone),
        case_sensitive=case_sensitive,
    )
    slices = max(1, min(len(plan.tasks), 4 * spark.sparkContext.defaultParallelism))
    by_size = sorted(
        plan.tasks, key=lambda t: int(t["data-file"].get("file-size-in-bytes", 0)), reverse=True
    )
    balanced = [task for i in range(slices) for task in by_size[i::slices]]
    rdd = spark.sparkContext.parallelize([(json.dumps(t),) for t in balanced], slices)
    tasks_df = spark.createDataFrame(
        rdd, st.StructType([st.StructField(READ_TASK_COLUMN, st.StringType())])
    )
    return _map_in_arrow(tasks_df, functools.partial(read_task, job), out_schema)


def compact(spark: SparkSession, table: str | TableIdentifier, **kwargs: Any) -> Any:
    """Compact ``table`` through the coordinator: :func:`icefloe.spark.compaction.compact`."""
    from icefloe.spark.compaction import compact as run_compaction

    return run_compaction(spark, table, **kwargs)


__all__ = [
    "CommitChannel",
    "PlannerClient",
    "PlanningError",
    "ScanPlan",
    "StagedWrite",
    "check_dataframe_schema",
    "commit_staged",
    "compact",
    "foreach_batch_sink",
    "iceberg_to_spark_type",
    "read",
    "shutdown",
    "spark_schema",
    "spark_to_iceberg_type",
    "stage_write",
    "write",
]
