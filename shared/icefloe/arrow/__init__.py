"""Iceberg in Arrow: schemas as Arrow schemas, Arrow data projected onto Iceberg schemas,
and Iceberg values as Arrow arrays for vectorized comparison."""
