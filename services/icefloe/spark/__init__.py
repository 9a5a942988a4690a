"""icefloe on Spark: ``from icefloe import spark`` then ``spark.write(df, ...)``,
``spark.read(...)``, ``spark.foreach_batch_sink(...)``, ``spark.compact(...)`` and
``spark.shutdown()``. The implementation lives in the modules of this package."""

from icefloe.spark.channel import CommitChannel, shutdown
from icefloe.spark.reader import PlannerClient, PlanningError, ScanPlan, read
from icefloe.spark.types import iceberg_to_spark_type, spark_schema, spark_to_iceberg_type
from icefloe.spark.writer import (
    BATCH_ID_PROPERTY,
    StagedWrite,
    check_dataframe_schema,
    commit_staged,
    compact,
    foreach_batch_sink,
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
    "foreach_batch_sink",
    "iceberg_to_spark_type",
    "read",
    "shutdown",
    "spark_schema",
    "spark_to_iceberg_type",
    "stage_write",
    "write",
]
