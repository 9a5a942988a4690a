"""Keyed tables: identifier fields set at creation and on an existing table, the spec's
rules refused by column name, and what a keyed writer asks of the table."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from icefloe.catalog.uri import load_catalog
from icefloe.errors import SchemaEvolutionError, ValidationError
from icefloe.spec.schema import Schema
from icefloe.spec.types import (
    DoubleType,
    FloatType,
    IntegerType,
    ListType,
    LongType,
    NestedField,
    StringType,
    StructType,
)
from icefloe.table.keyed import (
    identifier_columns,
    key_fields,
    set_identifier_fields,
    with_identifier_fields,
)

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "region", StringType(), required=True),
    NestedField(3, "name", StringType()),
    NestedField(4, "score", DoubleType(), required=True),
    NestedField(5, "ratio", FloatType(), required=True),
    NestedField(
        6, "loc", StructType(NestedField(7, "x", IntegerType(), required=True)), required=True
    ),
    NestedField(8, "opt", StructType(NestedField(9, "y", IntegerType(), required=True))),
    NestedField(10, "tags", ListType(11, StringType(), element_required=True), required=True),
)


def test_identifier_fields_follow_the_names_given() -> None:
    keyed = with_identifier_fields(SCHEMA, ["region", "id", "loc.x"])
    assert keyed.identifier_field_ids == (2, 1, 7)
    assert identifier_columns(keyed) == ["region", "id", "loc.x"]
    assert [f.name for f in key_fields(keyed, "db.t", "an upsert")] == ["region", "id", "x"]


@pytest.mark.parametrize(
    ("column", "reason"),
    [
        ("name", "optional"),
        ("score", "double"),
        ("ratio", "float"),
        ("opt.y", "parent struct 'opt' is optional"),
        ("tags.element", "inside list or map 'tags'"),
        ("loc", "not a primitive"),
        ("missing", "no such column"),
    ],
)
def test_columns_that_cannot_be_keys_are_refused_by_name(column: str, reason: str) -> None:
    with pytest.raises(SchemaEvolutionError, match=rf"'{column}'.*{reason}|{reason}.*'{column}'"):
        with_identifier_fields(SCHEMA, ["id", column])


def test_a_writer_is_told_how_to_key_an_unkeyed_table() -> None:
    with pytest.raises(ValidationError, match=r"db\.t has no identifier fields.*set-identifier"):
        key_fields(SCHEMA, "db.t", "mode='upsert'")


def test_existing_tables_are_keyed_and_unkeyed_by_new_schemas(tmp_path: Path) -> None:
    async def scenario() -> None:
        catalog = load_catalog(f"file://{tmp_path}/wh")
        await catalog.create_namespace("db")
        table = await catalog.create_table("db.t", SCHEMA)
        keyed = await set_identifier_fields(catalog, "db.t", ["id", "region"])
        assert identifier_columns(keyed.metadata.schema()) == ["id", "region"]
        assert keyed.metadata.current_schema_id != table.metadata.current_schema_id
        again = await set_identifier_fields(catalog, "db.t", ["id", "region"])
        assert again.metadata_location == keyed.metadata_location  # nothing to commit
        with pytest.raises(SchemaEvolutionError, match=r"db\.t.*'name'.*optional"):
            await set_identifier_fields(catalog, "db.t", ["name"])
        unkeyed = await set_identifier_fields(catalog, "db.t", [])
        assert unkeyed.metadata.schema().identifier_field_ids == ()
        await catalog.close()

    asyncio.run(scenario())
