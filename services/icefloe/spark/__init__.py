"""icefloe on Spark: ``from icefloe import spark`` then ``spark.write(df, ...)``,
``spark.read(...)``, ``spark.foreach_batch_sink(...)``, ``spark.compact(...)``,
``spark.create_table(...)``, ``spark.set_identifier_fields(...)`` and ``spark.shutdown()``. The implementation lives in the modules of this package."""

from icefloe.spark.channel import CommitChannel, shutdown
from icefloe.spark.compaction import compact
from icefloe.spark.reader import PlannerClient, PlanningError, ScanPlan, read
from icefloe.spark.streaming import BATCH_ID_PROPERTY, foreach_batch_sink
from icefloe.spark.tables import create_table, schema_of, set_identifier_fields
from icefloe.spark.types import iceberg_to_spark_type, spark_schema, spark_to_iceberg_type
from icefloe.spark.writer import (
    StagedWrite,
    check_dataframe_schema,
    commit_staged,
    stage_write,
    write,
)

__all__ = [
    "BATCH_ID_PROPERTY",
    "CommitChannel",
    "PlannerClient",
    "PlanningError",
    "ScanPlan",
    "StagedWrite",
    "check_dataframe_schema",
    "commit_staged",
    "compact",
    "create_table",
    "foreach_batch_sink",
    "iceberg_to_spark_type",
    "read",
    "schema_of",
    "set_identifier_fields",
    "shutdown",
    "spark_schema",
    "spark_to_iceberg_type",
    "stage_write",
    "write",
]
