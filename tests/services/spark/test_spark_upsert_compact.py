"""Compaction on upsert tables, end to end: Spark upserts through the coordinator, icefloe's
Spark compaction applies the deletes the upserts left, and later upserts still resolve.

The coordinator keeps one key index per table; compaction moves every row into new files,
so the next upsert must find each key in its new file (the index follows the table, not
the files it saw last). On v3 every row keeps its ``_row_id`` and sequence number through
the rewrite; rows the later upsert replaces get the upsert's sequence number. The table
health counts the deleted rows before and none after.
"""

from __future__ import annotations

from typing import Any

import pytest
from pyspark.sql import SparkSession
from test_spark_compact import _lineage
from test_spark_upsert_commit import SCHEMA, check_storage, table_rows

import icefloe.spark as ispark
from icefloe.coordinator.compactor import AUTO_ENABLED
from icefloe.deletes.index import is_deletion_vector
from icefloe.spec.datafile import DataFileContent
from icefloe.table.health import table_health

pytestmark = pytest.mark.integration

COLUMNS = "id long, region string, v long"


def upsert(spark: SparkSession, stack: Any, name: str, rows: list[tuple[int, str, int]]) -> None:
    df = spark.createDataFrame(rows, COLUMNS).repartition(2)
    ispark.write(df, name, mode="upsert", config=stack.config)


@pytest.mark.parametrize("format_version", [2, 3])
def test_compaction_applies_upsert_deletes_and_later_upserts_find_the_moved_rows(
    spark: SparkSession, spark_stack: Any, format_version: int
) -> None:
    # Spark compacts here (as a user who turned the coordinator's compaction off does)
    name = spark_stack.create_table(
        SCHEMA, properties={AUTO_ENABLED: "false"}, format_version=format_version
    )
    upsert(spark, spark_stack, name, [(i, "eu", i) for i in range(100)])
    upsert(spark, spark_stack, name, [(i, "us", i * 10) for i in range(50, 80)])
    gone = spark.createDataFrame([(i,) for i in range(10)], "id long")
    ispark.write(gone, name, mode="delete", config=spark_stack.config)
    expected = {i: ("eu", i) for i in range(10, 50)} | {i: ("us", i * 10) for i in range(50, 80)}
    expected |= {i: ("eu", i) for i in range(80, 100)}
    assert table_rows(spark, spark_stack, name) == expected

    health = spark_stack.run(table_health(spark_stack.load(name)))
    assert health.deleted_rows == 40  # 30 replaced, 10 deleted
    assert health.deleted_row_ratio == pytest.approx(40 / 130)
    assert (health.deletion_vectors > 0) == (format_version >= 3)
    assert (health.deletion_vector_bytes > 0) == (format_version >= 3)
    lineage = _lineage(spark_stack, name) if format_version >= 3 else {}

    result = ispark.compact(spark, name, options={"rewrite_all": True}, config=spark_stack.config)
    assert result.rewritten_data_files > 0
    live = spark_stack.live_files(name)
    assert all(f.content == DataFileContent.DATA for f in live), "the deletes were applied"
    assert table_rows(spark, spark_stack, name) == expected
    after = spark_stack.run(table_health(spark_stack.load(name)))
    assert (after.deleted_rows, after.delete_files, after.records) == (0, 0, len(expected))
    if format_version >= 3:
        assert _lineage(spark_stack, name) == lineage
    compacted = {f.file_path for f in live}

    # upserts after the compaction: every key is found in the file compaction moved it to
    upsert(spark, spark_stack, name, [(i, "ap", -i) for i in range(40, 120)])
    gone = spark.createDataFrame([(i,) for i in (12, 45, 90, 115)], "id long")
    ispark.write(gone, name, mode="delete", config=spark_stack.config)
    expected |= {i: ("ap", -i) for i in range(40, 120)}
    for i in (12, 45, 90, 115):
        del expected[i]
    assert table_rows(spark, spark_stack, name) == expected  # no key live twice
    check_storage(spark_stack, name)
    live = spark_stack.live_files(name)
    data = {f.file_path for f in live if f.content == DataFileContent.DATA}
    deletes = [f for f in live if f.content != DataFileContent.DATA]
    assert deletes and compacted & data
    if format_version >= 3:
        assert all(is_deletion_vector(d) and d.referenced_data_file in data for d in deletes)
        # the replaced rows were found in the compacted files
        assert {d.referenced_data_file for d in deletes} & compacted
        now = _lineage(spark_stack, name)
        untouched = [i for i in range(13, 40)]  # kept their ids and sequence numbers
        assert {i: now[i] for i in untouched} == {i: lineage[i] for i in untouched}
        row_ids = [r for r, _ in now.values()]
        assert len(set(row_ids)) == len(row_ids)
        upserted = {now[i][1] for i in range(40, 120) if i in now}  # one commit's rows
        assert len(upserted) == 1 and min(upserted) > max(s for _, s in lineage.values())
