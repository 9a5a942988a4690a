"""Iceberg data files in Parquet: writing them with field ids and metrics, reading them
by id (files), their column metrics (metrics) and the write.* properties (options)."""
