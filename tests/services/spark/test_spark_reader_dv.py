"""icefloe's Spark reader applies the deletion vectors icefloe writes on v3 tables.

A v3 table written by :func:`icefloe.spark.write`, rows deleted twice by position through
``row_delta(deleted_positions=...)`` (the second merging with the first DV and replacing
it), then read through the planner service and the Spark read tasks.
"""

from __future__ import annotations

from typing import Any

import pytest
from pyspark.sql import SparkSession

import icefloe.spark as ispark
from icefloe.deletes.index import is_deletion_vector
from icefloe.parquet.files import read_data_file
from icefloe.spec.schema import Schema
from icefloe.spec.types import DoubleType, LongType, NestedField, StringType
from icefloe.table.snapshot_producer import row_delta

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "cat", StringType()),
    NestedField(3, "v", DoubleType()),
)


@pytest.mark.integration
def test_spark_reads_apply_icefloe_deletion_vectors(spark: SparkSession, spark_stack: Any) -> None:
    name = spark_stack.create_table(SCHEMA, format_version=3)
    config = spark_stack.config
    rows = [(i, "abc"[i % 3], float(i)) for i in range(20)]
    ispark.write(
        spark.createDataFrame(rows, "id long, cat string, v double").coalesce(1),
        name,
        config=config,
    )
    (data_file,) = [f for f in spark_stack.live_files(name) if f.content == 0]
    in_file = read_data_file(data_file.file_path, SCHEMA).column("id").to_pylist()

    async def delete(positions: list[int]) -> None:
        current = await spark_stack.catalog.load_table(name)
        await row_delta(current, [], [], deleted_positions=[(data_file, positions)]).commit()

    spark_stack.run(delete([0, 5]))
    spark_stack.run(delete([6]))
    doomed = {in_file[p] for p in (0, 5, 6)}
    (dv,) = [f for f in spark_stack.live_files(name) if is_deletion_vector(f)]
    assert (dv.referenced_data_file, dv.record_count) == (data_file.file_path, 3)
    frame = ispark.read(spark, name, config=config)
    got = sorted(r["id"] for r in frame.collect())
    assert got == [i for i in range(20) if i not in doomed]
    filtered = ispark.read(spark, name, config=config, columns=["id"])
    assert sorted(r["id"] for r in filtered.collect()) == got
