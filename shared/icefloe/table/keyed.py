"""Keyed tables: a table whose schema names identifier fields (``identifier-field-ids``).

Upserts and deletes by key (the ``upsert`` commit operation, :mod:`icefloe.events`) need
to know which columns make a row's key. Iceberg records that in the schema's
``identifier-field-ids``, and the spec restricts them: an identifier field must be a
required primitive column, not ``float`` or ``double``, and not inside an optional struct,
a list or a map. This module is the one place those fields are set, at table creation
(:func:`with_identifier_fields`) and on an existing table (:func:`set_identifier_fields`,
a new schema committed through :func:`~icefloe.table.commit.commit_with_retry`), and the one
place a writer asks for them (:func:`key_fields`), so the Spark API, the CLI and the
writer refuse the same things with the same messages, naming the column.
"""

from __future__ import annotations

from collections.abc import Sequence

from icefloe.errors import SchemaEvolutionError, ValidationError
from icefloe.spec.metadata import TableMetadata
from icefloe.spec.metadata_builder import MetadataBuilder
from icefloe.spec.schema import Schema
from icefloe.spec.schema_update import UpdateSchema
from icefloe.spec.types import NestedField, StructType
from icefloe.table.catalog import Catalog, Table, TableIdentifier
from icefloe.table.commit import commit_with_retry


def with_identifier_fields(
    schema: Schema, columns: Sequence[str], format_version: int = 2
) -> Schema:
    """``schema`` with ``columns`` (names, dotted for nested fields) as its identifier
    fields, in that order; the spec's rules are checked and a refusal names the column.

    Meant for a schema about to create a table (its ids are reassigned at creation and the
    identifier fields follow their columns)."""
    update = UpdateSchema(schema, max(schema.highest_field_id, 0), format_version)
    try:
        evolved, _ = update.set_identifier_fields(*columns).apply(new_schema_id=schema.schema_id)
    except SchemaEvolutionError as e:
        raise SchemaEvolutionError(f"identifier fields {list(columns)}: {e}") from None
    return evolved


async def set_identifier_fields(
    catalog: Catalog, identifier: str | TableIdentifier, columns: Sequence[str]
) -> Table:
    """Make ``columns`` the identifier fields of an existing table (a new current schema,
    committed with retries on conflicts); an empty list makes the table unkeyed again.

    Setting the fields the table already has commits nothing."""
    table = await catalog.load_table(identifier)

    def evolved(metadata: TableMetadata) -> tuple[Schema, int]:
        update = UpdateSchema(metadata.schema(), metadata.last_column_id, metadata.format_version)
        try:
            return update.set_identifier_fields(*columns).apply()
        except SchemaEvolutionError as e:
            raise SchemaEvolutionError(
                f"cannot set identifier fields {list(columns)} on {table.identifier}: {e}"
            ) from None

    def applied(current: Table) -> bool:
        schema = current.metadata.schema()
        return schema.identifier_field_ids == evolved(current.metadata)[0].identifier_field_ids

    async def build(base: Table) -> TableMetadata:
        metadata = base.metadata
        new_schema, last_column_id = evolved(metadata)
        return (
            MetadataBuilder(metadata)
            .add_schema(new_schema, last_column_id)
            .set_current_schema(-1)
            .build(base.metadata_location)
        )

    if applied(table):
        return table
    return await commit_with_retry(catalog, table, build, applied)


def identifier_columns(schema: Schema) -> list[str]:
    """The identifier fields' full column names (dotted when nested), in schema order."""
    names: list[str] = []
    for fid in schema.identifier_field_ids:
        name = schema.find_column_name(fid)
        if name is None:
            raise ValidationError(
                f"identifier field id {fid} is not a column of schema {schema.schema_id}"
            )
        names.append(name)
    return names


def key_fields(schema: Schema, table: str | TableIdentifier, what: str) -> list[NestedField]:
    """The identifier fields a keyed ``what`` (an upsert, a delete by key) works by.

    Raises a ValidationError when the table has none (saying how to set them) or when one
    breaks the spec's rules (a table written by another engine may), naming the column."""
    if not schema.identifier_field_ids:
        raise ValidationError(
            f"{what} needs a keyed table, but {table} has no identifier fields: set them "
            "with icefloe.spark.set_identifier_fields(spark, table, [...]) or "
            "`icefloe table set-identifier-fields TABLE COLUMN...`"
        )
    names = identifier_columns(schema)
    fields: list[NestedField] = []
    for fid, name in zip(schema.identifier_field_ids, names):
        field = schema.field(fid)
        if not field.required:
            raise ValidationError(
                f"{what} on {table}: identifier field {name!r} is optional; identifier "
                "fields must be required columns"
            )
        parent = schema.parent_id(fid)
        while parent is not None:
            outer = schema.field(parent)
            if not isinstance(outer.field_type, StructType) or not outer.required:
                raise ValidationError(
                    f"{what} on {table}: identifier field {name!r} is inside "
                    f"{schema.find_column_name(parent)!r}, which is not a required struct"
                )
            parent = schema.parent_id(parent)
        fields.append(field)
    return fields


__all__ = ["identifier_columns", "key_fields", "set_identifier_fields", "with_identifier_fields"]
