"""Upserts and deletes by key from Spark: what :func:`icefloe.spark.stage_write` writes.

A keyed write runs in Spark: rows become change rows, are partitioned by key, folded per
task to the last change of each key, and each task writes the surviving rows as data
files and every key it touched as one key file. These tests read those files back and
hold them to the fold computed in the test, and check every refusal that must come before
any job runs. Committing them is the coordinator's part (``test_spark_upsert_commit.py``).
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as st

import icefloe.spark as ispark
from icefloe.arrow.schema import field_id_of
from icefloe.errors import SchemaEvolutionError, ValidationError
from icefloe.events import CommitOperation
from icefloe.parquet.files import read_data_file
from icefloe.spark.changes import ChangeSpec
from icefloe.spark.tasks import TaskInfo
from icefloe.spark.write_tasks import WriteJob, change_rows_task, change_task, is_job_file
from icefloe.spark.writer import StagedWrite, commit_request
from icefloe.spec.datafile import DataFile, DataFileContent
from icefloe.spec.partition import PartitionSpec, PartitionSpecBuilder
from icefloe.spec.schema import Schema
from icefloe.spec.types import DoubleType, LongType, NestedField, StringType, StructType

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "region", StringType(), required=True),
    NestedField(3, "v", StringType()),
    identifier_field_ids=[1, 2],
)


def _local(path: str) -> str:
    return path.removeprefix("file://").removeprefix("file:")


def _rows(files: list[DataFile], schema: Schema) -> list[tuple[Any, ...]]:
    out = []
    for f in files:
        for row in read_data_file(_local(f.file_path), schema).to_pylist():
            out.append(tuple(row[n.name] for n in schema.fields))
    return out


def _keys(staged: StagedWrite) -> list[tuple[Any, ...]]:
    """Every key the staged write's key files name, checked as key files on the way."""
    keys: list[tuple[Any, ...]] = []
    for f in staged.key_files:
        assert f.content == DataFileContent.EQUALITY_DELETES
        assert f.equality_ids == [1, 2]
        assert all(v is None for v in f.partition)
        assert is_job_file(f.file_path, staged.job_id)
        assert f.lower_bounds is not None and set(f.lower_bounds) == {1, 2}
        parquet = pq.read_table(_local(f.file_path))
        assert [field_id_of(c) for c in parquet.schema] == [1, 2]
        assert f.record_count == parquet.num_rows
        keys.extend(zip(parquet.column("id").to_pylist(), parquet.column("region").to_pylist()))
    return keys


def _check_events(staged: StagedWrite) -> None:
    data = [p for e in staged.events for p in (d["file-path"] for d in e.data_files)]
    deletes = [p for e in staged.events for p in (d["file-path"] for d in e.delete_files)]
    assert sorted(data) == sorted(staged.paths)
    assert sorted(deletes) == sorted(staged.key_paths)
    for e in staged.events:
        for d in e.delete_files:
            assert d["content"] == "equality-deletes" and d["equality-ids"] == [1, 2]


@pytest.mark.integration
def test_an_upsert_writes_the_last_row_of_each_key_and_a_key_file_per_task(
    spark: SparkSession, spark_stack: Any
) -> None:
    spec = PartitionSpecBuilder(SCHEMA).add_field("region", "identity").build()
    name = spark_stack.create_table(SCHEMA, spec)
    rows = [(i % 7, "eu" if i % 2 else "us", f"v{i}", (i * 37) % 50) for i in range(50)]
    df = spark.createDataFrame(rows, "id long, region string, v string, seq int").repartition(3)
    staged = ispark.stage_write(df, name, mode="upsert", order_by="seq", config=spark_stack.config)
    last: dict[tuple[int, str], tuple[int, str]] = {}
    for i, region, v, seq in rows:
        if (i, region) not in last or seq > last[(i, region)][0]:
            last[(i, region)] = (seq, v)
    assert sorted(_rows(staged.files, SCHEMA)) == sorted(
        (k[0], k[1], v) for k, (_, v) in last.items()
    )
    keys = _keys(staged)
    assert Counter(keys) == Counter(set(last)), "each key once, in exactly one key file"
    assert {f.partition for f in staged.files} <= {("eu",), ("us",)}
    _check_events(staged)
    request = commit_request(staged, "upsert")
    assert request.operation == CommitOperation.UPSERT
    assert set(request.event_ids) == {e.event_id for e in staged.events}
    assert json.loads(request.model_dump_json(by_alias=True))["operation"] == "upsert"
    staged.discard()
    assert spark_stack.stored_files(name) == set()


@pytest.mark.integration
def test_a_delete_by_key_writes_only_key_files(spark: SparkSession, spark_stack: Any) -> None:
    name = spark_stack.create_table(SCHEMA)
    df = spark.createDataFrame(
        [(1, "eu", 5.0), (2, "us", 1.0), (1, "eu", 7.0)], "id long, region string, junk double"
    )
    staged = ispark.stage_write(df, name, mode="delete", config=spark_stack.config)
    assert staged.files == []
    assert sorted(_keys(staged)) == [(1, "eu"), (2, "us")]
    _check_events(staged)
    staged.discard()


ENVELOPE = st.StructType(
    [
        st.StructField(
            "before",
            st.StructType.fromJson(
                json.loads(
                    '{"type":"struct","fields":[{"name":"id","type":"long","nullable":true,"metadata":{}},'
                    '{"name":"region","type":"string","nullable":true,"metadata":{}},'
                    '{"name":"v","type":"string","nullable":true,"metadata":{}}]}'
                )
            ),
        ),
        st.StructField(
            "after",
            st.StructType.fromJson(
                json.loads(
                    '{"type":"struct","fields":[{"name":"id","type":"long","nullable":true,"metadata":{}},'
                    '{"name":"region","type":"string","nullable":true,"metadata":{}},'
                    '{"name":"v","type":"string","nullable":true,"metadata":{}}]}'
                )
            ),
        ),
        st.StructField("op", st.StringType()),
        st.StructField("source", st.StructType([st.StructField("lsn", st.LongType())])),
        st.StructField("ts_ms", st.LongType()),
    ]
)


def _debezium(op: str | None, lsn: int | None, before: Any = None, after: Any = None) -> str:
    """One Debezium message value as Kafka carries it (null for a tombstone)."""
    if op is None:
        return "null"
    row = lambda r: None if r is None else {"id": r[0], "region": r[1], "v": r[2]}  # noqa: E731
    return json.dumps(
        {"before": row(before), "after": row(after), "op": op, "source": {"lsn": lsn}, "ts_ms": 1}
    )


@pytest.mark.integration
def test_a_debezium_stream_is_folded_by_source_position(
    spark: SparkSession, spark_stack: Any
) -> None:
    name = spark_stack.create_table(SCHEMA)
    messages = [
        _debezium("r", 1, after=(1, "eu", "snap")),
        _debezium("u", 5, before=(1, "eu", "snap"), after=(1, "eu", "new")),
        _debezium("c", 3, after=(2, "us", "two")),
        _debezium("d", 4, before=(2, "us", "two")),
        _debezium(None, None),  # the tombstone after the delete
        _debezium("c", 9, after=(2, "us", "again")),
        _debezium("c", 2, after=(3, "us", "three")),
        _debezium("d", 6, before=(3, "us", "three")),
        _debezium("u", 4, before=(1, "eu", "x"), after=(1, "eu", "older")),  # out of order
    ]
    raw = spark.createDataFrame([(m,) for m in messages], "value string").repartition(2)
    plain = raw.select(F.from_json("value", ENVELOPE).alias("e")).select("e.*")
    # the same messages as Debezium's JSON converter writes them with schemas enabled
    wrapped = st.StructType(
        [st.StructField("schema", st.StringType()), st.StructField("payload", ENVELOPE)]
    )
    enveloped = raw.select(
        F.from_json(
            F.when(F.col("value") == "null", F.lit("null")).otherwise(
                F.concat(F.lit('{"schema": "{}", "payload": '), F.col("value"), F.lit("}"))
            ),
            wrapped,
        ).alias("m")
    ).select("m.*")
    for df in (plain, enveloped):
        staged = ispark.stage_write(
            df,
            name,
            mode="upsert",
            envelope="debezium",
            order_by="source.lsn",
            config=spark_stack.config,
        )
        assert sorted(_rows(staged.files, SCHEMA)) == [(1, "eu", "new"), (2, "us", "again")]
        assert sorted(_keys(staged)) == [(1, "eu"), (2, "us"), (3, "us")]
        staged.discard()

    flat = spark.createDataFrame(
        [(1, "eu", "a", "c", 1), (1, "eu", None, "d", 2), (4, "eu", "b", "u", 1)],
        "id long, region string, v string, op string, lsn long",
    )
    staged = ispark.stage_write(
        flat, name, mode="upsert", op_column="op", order_by="lsn", config=spark_stack.config
    )
    assert _rows(staged.files, SCHEMA) == [(4, "eu", "b")]
    assert sorted(_keys(staged)) == [(1, "eu"), (4, "eu")]
    staged.discard()


@pytest.mark.integration
def test_keyed_writes_are_refused_by_name_before_or_by_their_tasks(
    spark: SparkSession, spark_stack: Any
) -> None:
    config = spark_stack.config
    unkeyed = spark_stack.create_table(Schema(NestedField(1, "id", LongType(), required=True)))
    one = spark.createDataFrame([(1, "eu", "a")], "id long, region string, v string")
    with pytest.raises(ValidationError, match="no identifier fields"):
        ispark.write(one, unkeyed, mode="upsert", config=config)
    name = spark_stack.create_table(SCHEMA)
    with pytest.raises(ValidationError, match=r"key column 'region'"):
        ispark.write(spark.createDataFrame([(1,)], "id long"), name, mode="delete", config=config)
    with pytest.raises(ValidationError, match=r"'region'.*string|string.*'region'"):
        ispark.write(
            spark.createDataFrame([(1, 2)], "id long, region int"), name, "delete", config=config
        )
    with pytest.raises(ValidationError, match="ordering column 'nope'"):
        ispark.write(one, name, mode="upsert", order_by="nope", config=config)
    with pytest.raises(ValidationError, match="operation column 'op'"):
        ispark.write(one, name, mode="upsert", op_column="op", config=config)
    with pytest.raises(ValidationError, match="lacks"):
        ispark.write(one, name, mode="upsert", envelope="debezium", config=config)
    with pytest.raises(ValidationError, match="mode='append' takes none"):
        ispark.write(one, name, order_by="v", config=config)
    with pytest.raises(ValidationError, match="write mode"):
        ispark.write(one, name, "upsrt", config=config)  # type: ignore[arg-type]
    assert spark_stack.stored_files(name) == set()
    # found by the tasks: no files are left behind
    twice = spark.createDataFrame(
        [(1, "eu", "a"), (1, "eu", "b"), (2, "eu", "c")], "id long, region string, v string"
    )
    with pytest.raises(ValidationError, match=r"key \(id=1, region='eu'\) appears 2 times"):
        ispark.write(twice, name, mode="upsert", config=config)
    ops = spark.createDataFrame(
        [(1, "eu", "a", "c"), (2, "eu", "b", "t")], "id long, region string, v string, op string"
    )
    with pytest.raises(ValidationError, match=r"operation column 'op' holds 't'"):
        ispark.write(ops, name, mode="upsert", op_column="op", config=config)
    nulls = spark.createDataFrame([(None, "eu", "a")], "id long, region string, v string")
    with pytest.raises(ValidationError, match=r"key column 'id' is null"):
        ispark.write(nulls, name, mode="upsert", config=config)
    assert spark_stack.stored_files(name) == set()
    assert spark_stack.load(name).metadata.current_snapshot() is None


@pytest.mark.integration
def test_keyed_tables_from_the_spark_api(spark: SparkSession, spark_stack: Any) -> None:
    config = spark_stack.config
    spark_stack.create_table(SCHEMA)  # makes the namespace
    schema = st.StructType(
        [
            st.StructField("id", st.LongType(), nullable=False),
            st.StructField("day", st.DateType(), nullable=False),
            st.StructField("v", st.StringType()),
            st.StructField("x", st.DoubleType(), nullable=False),
        ]
    )
    table = ispark.create_table(
        spark,
        "spark.keyed_api",
        schema,
        partition_by=["day(day)"],
        identifier_fields=["id"],
        config=config,
    )
    assert table.metadata.schema().identifier_field_ids == (1,)
    assert [f.name for f in table.metadata.spec().fields] == ["day_day"]
    with pytest.raises(SchemaEvolutionError, match=r"'v'.*optional"):
        ispark.create_table(spark, "spark.bad", schema, identifier_fields=["v"], config=config)
    with pytest.raises(SchemaEvolutionError, match=r"'x'.*double"):
        ispark.create_table(spark, "spark.bad", schema, identifier_fields=["x"], config=config)
    evolved = ispark.set_identifier_fields(spark, "spark.keyed_api", ["id", "day"], config=config)
    schema_now = evolved.metadata.schema()
    assert [schema_now.find_column_name(i) for i in schema_now.identifier_field_ids] == [
        "id",
        "day",
    ]
    assert ispark.schema_of(schema).find_field("x").field_type == DoubleType()  # type: ignore[union-attr]


@pytest.mark.integration
def test_key_files_outlive_an_unknown_outcome(
    spark: SparkSession, spark_stack: Any, kafka_broker: str
) -> None:
    """After a timeout with the commit id not in the table the coordinator may still commit
    the upsert, and it reads the key files when it does: nothing is deleted. (Here the
    events go to topics no coordinator reads.)"""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    from icefloe.errors import CommitStateUnknownError

    prefix = f"cdc-nowhere-{uuid.uuid4().hex[:8]}"

    async def topics() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_broker)
        await admin.start()
        try:
            await admin.create_topics(
                [NewTopic(f"{prefix}.{kind}", 1, 1) for kind in ("events", "results")]
            )
        finally:
            await admin.close()

    spark_stack.run(topics())
    name = spark_stack.create_table(SCHEMA)
    nowhere = spark_stack.config.model_copy(
        update={"events_topic": f"{prefix}.events", "results_topic": f"{prefix}.results"}
    )
    df = spark.createDataFrame([(1, "eu", "a")], "id long, region string, v string")
    staged = ispark.stage_write(df, name, mode="upsert", config=nowhere)
    with pytest.raises(CommitStateUnknownError):
        ispark.commit_staged(staged, "upsert", timeout_s=2.0)
    assert staged.key_paths and spark_stack.stored_files(name) >= staged.key_paths | staged.paths
    staged.discard()
    assert spark_stack.stored_files(name) == set()


# -- inside a task (no Spark) ---------------------------------------------------------------------

NESTED = Schema(
    NestedField(
        1,
        "loc",
        StructType(
            NestedField(2, "x", LongType(), required=True), NestedField(3, "y", StringType())
        ),
        required=True,
    ),
    NestedField(4, "v", StringType()),
    identifier_field_ids=[2],
)


def test_a_change_task_writes_the_fold_and_a_key_file_of_a_nested_key(tmp_path: Path) -> None:
    location = f"file://{tmp_path}/table"
    job = WriteJob(
        job_id="job7",
        table_location=location,
        data_dir=f"{location}/data",
        schema_json=json.dumps(NESTED.to_json()),
        spec_json=json.dumps(PartitionSpec.unpartitioned().to_json()),
        properties={},
        io_properties={},
    )
    spec = ChangeSpec(keys=("loc.x",), op_column="op", data_columns=("loc", "v"))
    loc = pa.struct([("x", pa.int64()), ("y", pa.string())])
    batch = pa.RecordBatch.from_pydict(
        {
            "loc": pa.array([{"x": 1, "y": "a"}, {"x": 2, "y": "b"}, {"x": 1, "y": "c"}], loc),
            "v": ["one", "two", "three"],
            "op": ["c", "c", "d"],
        }
    )
    info = TaskInfo(partition_id=4, attempt_number=0, task_attempt_id=41, stage_id=2)
    changes = list(change_rows_task(spec, [batch], info))
    out = pa.Table.from_batches(list(change_task(job, spec, changes, info)))
    files = [json.loads(f) for f in out.column("file").to_pylist()]
    assert [f["content"] for f in files] == ["data", "equality-deletes"]
    data, keys = files
    assert read_data_file(_local(data["file-path"]), NESTED).to_pylist() == [
        {"loc": {"x": 2, "y": "b"}, "v": "two"}
    ]
    assert keys["equality-ids"] == [2] and keys["record-count"] == 2
    assert keys["file-path"].endswith("/data/job7-00004-41-keys.parquet")
    assert keys["lower-bounds"] == {"keys": [2], "values": [1]}
    assert keys["upper-bounds"] == {"keys": [2], "values": [2]}
    stored = pq.read_table(_local(keys["file-path"]))
    assert sorted(r["loc"]["x"] for r in stored.to_pylist()) == [1, 2]
    assert field_id_of(stored.schema.field("loc").type.field(0)) == 2
    assert list(change_task(job, spec, [], info)) == []  # no changes, no files
