"""Creating and evolving tables from PySpark: keyed tables for upserts and deletes by key.

The writer (:mod:`icefloe.spark.writer`) never creates a table; these calls do, through
the same catalog the writer loads from, and :func:`set_identifier_fields` makes an existing
table keyed. Identifier fields follow the spec's rules (required, primitive, not float or
double, not inside an optional struct, a list or a map; :mod:`icefloe.table.keyed`), and
a refusal names the column. A Spark schema's nullable columns become optional Iceberg
columns, so a key column must be declared ``nullable=False``; nested Spark struct fields
are always optional (for a nested key, pass an Iceberg :class:`~icefloe.spec.schema.Schema`).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

from pyspark.sql import SparkSession
from pyspark.sql import types as st

from icefloe.spark.channel import BACKGROUND, ConfigArg, resolve_settings
from icefloe.spark.types import spark_to_iceberg_type
from icefloe.spec.partition import parse_partition_spec
from icefloe.spec.schema import Schema
from icefloe.spec.types import NestedField
from icefloe.table.catalog import Table, TableIdentifier
from icefloe.table.keyed import set_identifier_fields as set_table_identifier_fields
from icefloe.table.keyed import with_identifier_fields


def schema_of(spark_schema: st.StructType, format_version: int = 2) -> Schema:
    """The Iceberg schema of a Spark schema (ids from 1; nullable columns optional)."""
    counter = itertools.count(1 + len(spark_schema.fields))
    fields = [
        NestedField(
            i + 1,
            f.name,
            spark_to_iceberg_type(f.dataType, lambda: next(counter), f.name, format_version),
            required=not f.nullable,
        )
        for i, f in enumerate(spark_schema.fields)
    ]
    return Schema(*fields)


def create_table(
    spark: SparkSession,
    table: str | TableIdentifier,
    schema: st.StructType | Schema,
    *,
    partition_by: Sequence[str] = (),
    identifier_fields: Sequence[str] = (),
    properties: Mapping[str, str] | None = None,
    format_version: int = 2,
    location: str | None = None,
    config: ConfigArg = None,
) -> Table:
    """Create ``table`` ("ns.table") in the configured catalog; the created table.

    ``partition_by`` takes Spark-style terms (``day(ts)``, ``bucket(16, id)``, ``id``);
    ``identifier_fields`` names the key columns (dotted when nested) that make the table
    keyed, for ``write(..., mode="upsert" | "delete")``.
    """
    settings = resolve_settings(spark, config)
    iceberg = schema if isinstance(schema, Schema) else schema_of(schema, format_version)
    if identifier_fields:
        iceberg = with_identifier_fields(iceberg, identifier_fields, format_version)
    spec = parse_partition_spec(partition_by, iceberg)

    async def create() -> Table:
        catalog = await BACKGROUND.catalog(settings.require_catalog())
        return await catalog.create_table(
            table,
            iceberg,
            spec=spec,
            location=location,
            properties=dict(properties or {}),
            format_version=format_version,
        )

    return BACKGROUND.run(create())


def set_identifier_fields(
    spark: SparkSession,
    table: str | TableIdentifier,
    columns: Sequence[str],
    *,
    config: ConfigArg = None,
) -> Table:
    """Make ``columns`` the identifier fields of an existing table (a new current schema);
    an empty list makes it unkeyed. The updated table."""
    settings = resolve_settings(spark, config)

    async def evolve() -> Table:
        catalog = await BACKGROUND.catalog(settings.require_catalog())
        return await set_table_identifier_fields(catalog, table, list(columns))

    return BACKGROUND.run(evolve())


__all__ = ["create_table", "schema_of", "set_identifier_fields"]
