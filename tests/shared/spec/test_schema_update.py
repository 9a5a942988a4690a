"""Tests for icefloe.spec.schema_update: the spec's schema-evolution and default-value rules."""

from __future__ import annotations

import json
import re
import uuid
from decimal import Decimal
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples
from icefloe.errors import SchemaEvolutionError, ValidationError
from icefloe.spec.schema import Schema
from icefloe.spec.schema_update import UpdateSchema, assign_fresh_ids, is_promotion_allowed
from icefloe.spec.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    GeographyType,
    GeometryType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestampNanoType,
    TimestampType,
    TimestamptzNanoType,
    TimestamptzType,
    TimeType,
    UnknownType,
    UUIDType,
    VariantType,
)

BASE = Schema(
    NestedField(1, "id", IntegerType(), required=True),
    NestedField(2, "data", StringType()),
    NestedField(
        3,
        "location",
        StructType(
            NestedField(4, "lat", FloatType(), required=True),
            NestedField(5, "long", FloatType(), required=True),
        ),
    ),
    NestedField(6, "tags", ListType(7, StructType(NestedField(8, "x", IntegerType())), True)),
    NestedField(
        9,
        "props",
        MapType(10, StringType(), 11, StructType(NestedField(12, "v", LongType())), False),
    ),
    NestedField(13, "day", DateType()),
    NestedField(14, "price", DecimalType(9, 2)),
    NestedField(
        15,
        "points",
        MapType(16, StructType(NestedField(17, "k", IntegerType(), True)), 18, IntegerType()),
    ),
    NestedField(19, "nothing", UnknownType()),
    schema_id=0,
    identifier_field_ids=[1],
)
LAST = 19


def update(version: int = 2, **kwargs: Any) -> UpdateSchema:
    return UpdateSchema(BASE, LAST, version, **kwargs)


def names(schema: Schema) -> list[str]:
    return [f.name for f in schema.fields]


# -- construction ---------------------------------------------------------------------------


def test_last_column_id_below_highest_id_is_refused() -> None:
    with pytest.raises(SchemaEvolutionError, match=r"last_column_id 5"):
        UpdateSchema(BASE, 5, 2)


def test_bad_format_version_is_refused() -> None:
    with pytest.raises(ValidationError, match=r"format_version"):
        UpdateSchema(BASE, LAST, 0)


def test_no_changes_keeps_columns_and_bumps_schema_id() -> None:
    schema, last = update().apply()
    assert schema.same_columns(BASE)
    assert schema.schema_id == 1
    assert last == LAST


def test_explicit_new_schema_id() -> None:
    schema, _ = update().add_column("extra", StringType()).apply(new_schema_id=7)
    assert schema.schema_id == 7


def test_apply_is_repeatable_and_does_not_mutate() -> None:
    builder = update().add_column("extra", StringType()).rename_column("data", "payload")
    first = builder.apply()
    second = builder.apply()
    assert first == second


# -- add_column -----------------------------------------------------------------------------


def test_add_top_level_column_gets_next_id() -> None:
    schema, last = update().add_column("extra", StringType(), doc="why").apply()
    added = schema.field("extra")
    assert added == NestedField(20, "extra", StringType(), False, "why")
    assert names(schema)[-1] == "extra"
    assert last == 20


def test_added_nested_type_gets_fresh_ids_fields_before_children() -> None:
    nested = StructType(
        NestedField(100, "a", StructType(NestedField(101, "c", LongType()))),
        NestedField(102, "b", ListType(103, StringType(), False)),
        NestedField(104, "m", MapType(105, StringType(), 106, IntegerType())),
    )
    schema, last = update().add_column("loc", nested).apply()
    assert schema.find_field_id("loc") == 20
    assert schema.find_field_id("loc.a") == 21
    assert schema.find_field_id("loc.b") == 22
    assert schema.find_field_id("loc.m") == 23
    assert schema.find_field_id("loc.a.c") == 24
    assert schema.find_field_id("loc.b.element") == 25
    assert schema.find_field_id("loc.m.key") == 26
    assert schema.find_field_id("loc.m.value") == 27
    assert last == 27


def test_add_inside_struct_by_dotted_and_tuple_path() -> None:
    schema, _ = (
        update()
        .add_column("location.alt", DoubleType())
        .add_column(("location", "acc.m"), DoubleType())
        .apply()
    )
    loc = schema.find_type("location")
    assert isinstance(loc, StructType)
    assert [f.name for f in loc.fields] == ["lat", "long", "alt", "acc.m"]


def test_add_inside_list_element_and_map_value() -> None:
    schema, last = (
        update()
        .add_column("tags.element.y", LongType())
        .add_column("props.value.w", StringType())
        .add_column("tags.z", LongType())  # naming the list adds to its element struct
        .add_column("props.u", LongType())  # naming the map adds to its value struct
        .apply()
    )
    assert schema.find_field_id("tags.element.y") == 20
    assert schema.find_field_id("props.value.w") == 21
    assert schema.find_field_id("tags.element.z") == 22
    assert schema.find_field_id("props.value.u") == 23
    assert last == 23


def test_add_to_a_column_added_in_the_same_change() -> None:
    schema, _ = (
        update()
        .add_column("s", StructType(NestedField(1, "a", IntegerType())))
        .add_column("s.b", StringType())
        .apply()
    )
    assert schema.find_field_id("s.b") == 22


def test_add_inside_map_key_is_refused() -> None:
    with pytest.raises(SchemaEvolutionError, match=r"points.key.extra"):
        update().add_column("points.key.extra", IntegerType())


def test_add_to_non_struct_parent_is_refused() -> None:
    with pytest.raises(SchemaEvolutionError, match=r"'data.sub'.*string, not a struct"):
        update().add_column("data.sub", IntegerType())


def test_add_to_missing_parent_is_refused() -> None:
    with pytest.raises(SchemaEvolutionError, match=r"'nope'"):
        update().add_column("nope.sub", IntegerType())


@pytest.mark.parametrize("path", ["data", "location.lat", "tags.element.x"])
def test_add_duplicate_name_is_refused(path: str) -> None:
    with pytest.raises(SchemaEvolutionError, match=r"already has a column named"):
        update().add_column(path, IntegerType())


def test_add_duplicate_of_added_column_is_refused() -> None:
    builder = update().add_column("extra", IntegerType())
    with pytest.raises(SchemaEvolutionError, match=r"'extra'"):
        builder.add_column("extra", LongType())


def test_duplicate_check_respects_case_sensitivity() -> None:
    schema, _ = update().add_column("DATA", StringType()).apply()
    assert "DATA" in names(schema)
    with pytest.raises(SchemaEvolutionError, match=r"'DATA'.*'data'"):
        update(case_sensitive=False).add_column("DATA", StringType())


def test_delete_then_add_same_name_gets_a_new_id() -> None:
    schema, last = update().delete_column("data").add_column("data", LongType()).apply()
    assert schema.field("data").field_id == 20
    assert schema.find_field(2) is None
    assert last == 20


def test_required_column_refused_in_v1_v2() -> None:
    for version in (1, 2):
        with pytest.raises(SchemaEvolutionError, match=r"required column 'extra'"):
            update(version).add_column("extra", IntegerType(), required=True)


def test_required_column_allowed_with_incompatible_changes() -> None:
    schema, _ = (
        update(2, allow_incompatible_changes=True)
        .add_column("extra", IntegerType(), required=True)
        .apply()
    )
    assert schema.field("extra").required


def test_required_column_in_v3_needs_initial_default() -> None:
    with pytest.raises(SchemaEvolutionError, match=r"'extra' without an initial-default"):
        update(3).add_column("extra", IntegerType(), required=True)
    with pytest.raises(SchemaEvolutionError, match=r"'extra' without an initial-default"):
        update(3).add_column("extra", IntegerType(), required=True, write_default=3)
    schema, _ = (
        update(3).add_column("extra", IntegerType(), required=True, initial_default=5).apply()
    )
    added = schema.field("extra")
    assert added.required
    assert (added.initial_default, added.write_default) == (5, 5)


def test_write_default_may_differ_from_initial_default() -> None:
    schema, _ = (
        update(3).add_column("extra", StringType(), initial_default="a", write_default="b").apply()
    )
    assert (schema.field("extra").initial_default, schema.field("extra").write_default) == (
        "a",
        "b",
    )


def test_defaults_need_v3() -> None:
    with pytest.raises(SchemaEvolutionError, match=r"initial-default of column 'extra'.*version 3"):
        update(2).add_column("extra", IntegerType(), initial_default=1)


@pytest.mark.parametrize(
    "field_type", [UnknownType(), VariantType(), GeometryType(), GeographyType()]
)
def test_defaults_of_null_only_types_are_refused(field_type: IcebergType) -> None:
    with pytest.raises(SchemaEvolutionError, match=r"'extra'.*must default to null"):
        update(3).add_column("extra", field_type, initial_default=b"\x00")
    schema, _ = update(3).add_column("extra", field_type).apply()
    assert schema.field("extra").initial_default is None


def test_struct_default_may_only_be_null_or_empty() -> None:
    point = StructType(
        NestedField(1, "x", IntegerType(), True, initial_default=0, write_default=0),
        NestedField(2, "y", IntegerType(), False, initial_default=0),
    )
    schema, _ = update(3).add_column("point", point, initial_default={}).apply()
    assert schema.field("point").initial_default == {}
    assert schema.find_field("point.x").initial_default == 0  # type: ignore[union-attr]
    with pytest.raises(SchemaEvolutionError, match=r"'point'.*empty struct"):
        update(3).add_column("point", point, initial_default={21: 3})


def test_struct_default_with_required_field_lacking_default_is_refused() -> None:
    point = StructType(NestedField(1, "x", IntegerType(), True))
    with pytest.raises(SchemaEvolutionError, match=r"'point.x' has no initial-default"):
        update(3).add_column("point", point, initial_default={})


@pytest.mark.parametrize(
    ("field_type", "value"),
    [
        (IntegerType(), "1"),
        (IntegerType(), 2**31),
        (IntegerType(), True),
        (BooleanType(), 1),
        (StringType(), b"x"),
        (DecimalType(4, 2), Decimal("1.234")),
        (DecimalType(4, 2), Decimal("123.4")),
        (FixedType(2), b"abc"),
        (UUIDType(), "not-a-uuid"),
        (TimeType(), -1),
        (ListType(1, IntegerType(), True), [1, None]),
        (MapType(1, StringType(), 2, IntegerType()), {"a": "b"}),
    ],
)
def test_default_of_wrong_shape_is_refused(field_type: IcebergType, value: Any) -> None:
    with pytest.raises(SchemaEvolutionError, match=r"initial-default of column 'extra'"):
        update(3).add_column("extra", field_type, initial_default=value)


@pytest.mark.parametrize(
    ("field_type", "value", "stored"),
    [
        (DecimalType(9, 2), Decimal("1.5"), Decimal("1.50")),
        (DoubleType(), 1, 1.0),
        (FixedType(2), bytearray(b"ab"), b"ab"),
        (UUIDType(), uuid.UUID(int=7), uuid.UUID(int=7)),
        (TimestamptzType(), 1_700_000_000_000_000, 1_700_000_000_000_000),
        (BinaryType(), b"\x00", b"\x00"),
        (ListType(1, IntegerType(), False), [1, None], [1, None]),
        (MapType(1, StringType(), 2, LongType()), {"a": 1}, {"a": 1}),
    ],
)
def test_defaults_are_normalized_and_serializable(
    field_type: IcebergType, value: Any, stored: Any
) -> None:
    schema, _ = update(3).add_column("extra", field_type, initial_default=value).apply()
    assert schema.field("extra").initial_default == stored
    assert Schema.from_json(json.loads(json.dumps(schema.to_json()))) == schema


def test_unknown_columns_must_be_optional() -> None:
    with pytest.raises(SchemaEvolutionError, match=r"'extra'.*unknown columns must be optional"):
        update(3, allow_incompatible_changes=True).add_column("extra", UnknownType(), required=True)
    nested = StructType(NestedField(1, "u", UnknownType(), True))
    with pytest.raises(SchemaEvolutionError, match=r"'s.u' of type unknown must be optional"):
        update(3).add_column("s", nested)
    deeper = StructType(NestedField(2, "t", nested))
    with pytest.raises(SchemaEvolutionError, match=r"'s.t.u' of type unknown must be optional"):
        update(3).add_column("s", deeper)


def test_v3_types_are_refused_in_v2() -> None:
    with pytest.raises(SchemaEvolutionError, match=r"timestamp_ns in column 'extra'.*version 3"):
        update(2).add_column("extra", TimestampNanoType())
    nested = ListType(1, VariantType(), False)
    with pytest.raises(SchemaEvolutionError, match=r"variant in column 'extra.element'"):
        update(2).add_column("extra", nested)


def test_invalid_paths_are_refused() -> None:
    with pytest.raises(SchemaEvolutionError, match=r"invalid column path"):
        update().add_column("location..x", IntegerType())
    with pytest.raises(SchemaEvolutionError, match=r"invalid column path"):
        update().rename_column((), "x")


# -- rename_column --------------------------------------------------------------------------


def test_rename_keeps_id() -> None:
    schema, last = (
        update().rename_column("data", "payload").rename_column("location.lat", "latitude").apply()
    )
    assert schema.field("payload").field_id == 2
    assert schema.field("location.latitude").field_id == 4
    assert last == LAST


def test_rename_in_list_element_struct() -> None:
    schema, _ = update().rename_column("tags.element.x", "xx").apply()
    assert schema.field("tags.element.xx").field_id == 8


def test_paths_after_rename_still_name_the_base_column() -> None:
    schema, _ = (
        update()
        .rename_column("location", "place")
        .add_column("location.alt", DoubleType())
        .rename_column("location.lat", "latitude")
        .apply()
    )
    assert schema.find_field_id("place.alt") == 20
    assert schema.find_field_id("place.latitude") == 4


def test_rename_to_existing_name_is_refused() -> None:
    with pytest.raises(SchemaEvolutionError, match=r"rename column 'data' to 'id'"):
        update().rename_column("data", "id")
    with pytest.raises(SchemaEvolutionError, match=r"'location' already has a column named 'long'"):
        update().rename_column("location.lat", "long")


def test_rename_to_name_differing_in_case() -> None:
    schema, _ = update().rename_column("data", "ID").apply()
    assert names(schema)[:2] == ["id", "ID"]
    with pytest.raises(SchemaEvolutionError, match=r"'data' to 'ID'"):
        update(case_sensitive=False).rename_column("data", "ID")


def test_rename_freed_name_can_be_reused() -> None:
    schema, _ = update().rename_column("data", "payload").add_column("data", LongType()).apply()
    assert schema.field("payload").field_id == 2
    assert schema.field("data").field_id == 20


def test_rename_to_same_name_is_noop() -> None:
    schema, _ = update().rename_column("data", "data").apply()
    assert schema.same_columns(BASE)


def test_rename_list_element_is_refused() -> None:
    with pytest.raises(SchemaEvolutionError, match=r"'tags.element'.*fixed names"):
        update().rename_column("tags.element", "item")


def test_rename_unknown_column_is_refused() -> None:
    with pytest.raises(SchemaEvolutionError, match=r"rename column 'missing'.*no such column"):
        update().rename_column("missing", "x")


def test_case_insensitive_lookup() -> None:
    schema, _ = update(case_sensitive=False).rename_column("LOCATION.LAT", "latitude").apply()
    assert schema.field("location.latitude").field_id == 4
    with pytest.raises(SchemaEvolutionError, match=r"'LOCATION.LAT'"):
        update().rename_column("LOCATION.LAT", "latitude")


def test_column_name_with_dot_is_addressable() -> None:
    schema, _ = update().add_column(("a.b",), IntegerType()).apply()
    assert schema.fields[-1].name == "a.b"
    again, _ = UpdateSchema(schema, 20, 2).rename_column(("a.b",), "c").apply()
    assert again.field("c").field_id == 20
    dotted, _ = UpdateSchema(schema, 20, 2).rename_column("a.b", "d").apply()
    assert dotted.field("d").field_id == 20


# -- delete_column --------------------------------------------------------------------------


def test_delete_column_and_nested_column() -> None:
    schema, last = update().delete_column("data").delete_column("location.long").apply()
    assert schema.find_field(2) is None
    assert schema.find_field(5) is None
    assert schema.field("location.lat").field_id == 4
    assert last == LAST


def test_delete_in_map_value_struct() -> None:
    schema, _ = update().delete_column("props.value.v").apply()
    value_type = schema.find_type("props.value")
    assert value_type == StructType()


@pytest.mark.parametrize(
    ("op", "match"),
    [
        (lambda u: u.rename_column("data", "x"), "rename column 'data'.*deleted"),
        (lambda u: u.update_column("data", doc="d"), "update column 'data'.*deleted"),
        (lambda u: u.delete_column("data"), "delete column 'data'.*deleted"),
        (lambda u: u.make_column_optional("data"), "'data'.*deleted"),
        (lambda u: u.move_first("data"), "move column 'data'.*deleted"),
        (lambda u: u.move_after("id", "data"), "'data'.*deleted"),
        (lambda u: u.set_identifier_fields("data"), "'data'.*deleted"),
    ],
)
def test_using_a_deleted_column_is_refused(op: Any, match: str) -> None:
    with pytest.raises(SchemaEvolutionError, match=match):
        op(update().delete_column("data"))


def test_using_a_field_of_a_deleted_struct_is_refused() -> None:
    builder = update().delete_column("location")
    with pytest.raises(SchemaEvolutionError, match=r"its parent 'location' is deleted"):
        builder.rename_column("location.lat", "y")
    with pytest.raises(SchemaEvolutionError, match=r"'location'.*deleted"):
        builder.add_column("location.alt", DoubleType())


def test_delete_identifier_field_is_refused_unless_identifiers_updated() -> None:
    builder = update(allow_incompatible_changes=True).delete_column("id")
    with pytest.raises(SchemaEvolutionError, match=r"identifier field 'id'"):
        builder.apply()
    schema, _ = builder.set_identifier_fields().apply()
    assert schema.identifier_field_ids == ()
    assert schema.find_field(1) is None


def test_delete_partition_source_is_refused() -> None:
    with pytest.raises(SchemaEvolutionError, match=r"'day'.*partition field"):
        update(partition_source_ids=frozenset({13})).delete_column("day")


def test_delete_list_element_is_refused() -> None:
    with pytest.raises(SchemaEvolutionError, match=r"'tags.element'"):
        update().delete_column("tags.element")


def test_delete_added_or_changed_column_is_refused() -> None:
    with pytest.raises(SchemaEvolutionError, match=r"'extra'.*added by this same change"):
        update().add_column("extra", IntegerType()).delete_column("extra")
    with pytest.raises(SchemaEvolutionError, match=r"'location': columns are added inside it"):
        update().add_column("location.alt", DoubleType()).delete_column("location")
    with pytest.raises(SchemaEvolutionError, match=r"'location'.*updated"):
        update().update_column("location.lat", DoubleType()).delete_column("location")
    with pytest.raises(SchemaEvolutionError, match=r"'data': a move"):
        update().move_first("data").delete_column("data")


# -- optional / required ---------------------------------------------------------------------


def test_make_column_optional() -> None:
    schema, _ = (
        update()
        .make_column_optional("location.lat")
        .make_column_optional("tags.element")
        .make_column_optional("data")  # already optional: no-op
        .apply()
    )
    assert schema.field("location.lat").optional
    tags = schema.find_type("tags")
    assert isinstance(tags, ListType) and not tags.element_required


def test_make_map_key_optional_is_refused() -> None:
    with pytest.raises(SchemaEvolutionError, match=r"'points.key'.*map keys"):
        update().make_column_optional("points.key")


def test_require_column_needs_incompatible_changes() -> None:
    with pytest.raises(SchemaEvolutionError, match=r"'data' required.*allow_incompatible"):
        update().require_column("data")
    schema, _ = update(allow_incompatible_changes=True).require_column("data").apply()
    assert schema.field("data").required
    same, _ = update().require_column("id").apply()  # already required: no-op
    assert same.same_columns(BASE)


def test_require_added_column_with_initial_default() -> None:
    schema, _ = (
        update(3)
        .add_column("extra", IntegerType(), initial_default=1)
        .require_column("extra")
        .apply()
    )
    assert schema.field("extra").required
    with pytest.raises(SchemaEvolutionError, match=r"'other' required"):
        update(3).add_column("other", IntegerType()).require_column("other")


def test_require_unknown_column_is_refused() -> None:
    with pytest.raises(SchemaEvolutionError, match=r"'nothing'.*unknown"):
        update(3, allow_incompatible_changes=True).require_column("nothing")


# -- update_column / promotions -------------------------------------------------------------

PROMOTIONS: list[tuple[IcebergType, IcebergType, int, bool]] = [
    (IntegerType(), LongType(), 1, True),
    (FloatType(), DoubleType(), 2, True),
    (DecimalType(9, 2), DecimalType(12, 2), 1, True),
    (DecimalType(9, 2), DecimalType(9, 2), 1, True),
    (DecimalType(9, 2), DecimalType(8, 2), 2, False),
    (DecimalType(9, 2), DecimalType(12, 3), 2, False),
    (LongType(), IntegerType(), 2, False),
    (IntegerType(), StringType(), 2, False),
    (IntegerType(), DoubleType(), 3, False),
    (DoubleType(), FloatType(), 3, False),
    (DateType(), TimestampType(), 2, False),
    (DateType(), TimestampType(), 3, True),
    (DateType(), TimestampNanoType(), 3, True),
    (DateType(), TimestamptzType(), 3, False),
    (DateType(), TimestamptzNanoType(), 3, False),
    (TimestampType(), TimestampNanoType(), 3, False),
    (UnknownType(), StringType(), 3, True),
    (UnknownType(), StructType(), 3, True),
    (UnknownType(), StringType(), 2, False),
    (StringType(), BinaryType(), 3, False),
    (UUIDType(), FixedType(16), 3, False),
    (BooleanType(), IntegerType(), 3, False),
]


@pytest.mark.parametrize(("source", "target", "version", "allowed"), PROMOTIONS)
def test_is_promotion_allowed(
    source: IcebergType, target: IcebergType, version: int, allowed: bool
) -> None:
    assert is_promotion_allowed(source, target, version) is allowed


def test_valid_promotions_apply() -> None:
    schema, last = (
        update(3)
        .update_column("id", LongType())
        .update_column("location.lat", DoubleType())
        .update_column("price", DecimalType(12, 2))
        .update_column("day", TimestampType())
        .update_column("nothing", StringType())
        .update_column("tags.element.x", LongType())
        .update_column("points.value", LongType())
        .apply()
    )
    assert schema.find_type("id") == LongType()
    assert schema.find_type("location.lat") == DoubleType()
    assert schema.find_type("price") == DecimalType(12, 2)
    assert schema.find_type("day") == TimestampType()
    assert schema.find_type("nothing") == StringType()
    assert schema.find_type("tags.element.x") == LongType()
    assert schema.find_type("points.value") == LongType()
    assert last == LAST
    assert schema.identifier_field_ids == (1,)


def test_chained_decimal_promotion() -> None:
    schema, _ = (
        update()
        .update_column("price", DecimalType(10, 2))
        .update_column("price", DecimalType(20, 2))
    ).apply()
    assert schema.find_type("price") == DecimalType(20, 2)


@pytest.mark.parametrize(
    ("path", "target", "version"),
    [
        ("id", StringType(), 2),
        ("price", DecimalType(9, 3), 2),
        ("price", DecimalType(8, 2), 2),
        ("day", TimestampType(), 2),
        ("day", TimestamptzType(), 3),
        ("location.lat", IntegerType(), 3),
    ],
)
def test_invalid_promotions_are_refused(path: str, target: IcebergType, version: int) -> None:
    with pytest.raises(
        SchemaEvolutionError, match=f"column '{path}' from .* to {re.escape(str(target))}"
    ):
        update(version).update_column(path, target)


def test_date_promotion_refused_for_partition_source() -> None:
    with pytest.raises(SchemaEvolutionError, match=r"'day'.*source of a partition field"):
        update(3, partition_source_ids=frozenset({13})).update_column("day", TimestampType())
    # int → long keeps bucket/identity values, so a partition source may be widened.
    schema, _ = (
        update(3, partition_source_ids=frozenset({1, 13})).update_column("id", LongType()).apply()
    )
    assert schema.find_type("id") == LongType()


def test_date_promotion_converts_defaults() -> None:
    base = Schema(NestedField(1, "d", DateType(), False, None, 2, 3))
    schema, _ = UpdateSchema(base, 1, 3).update_column("d", TimestampType()).apply()
    assert schema.field("d").initial_default == 2 * 86_400_000_000
    assert schema.field("d").write_default == 3 * 86_400_000_000
    nanos, _ = UpdateSchema(base, 1, 3).update_column("d", TimestampNanoType()).apply()
    assert nanos.field("d").initial_default == 2 * 86_400_000_000_000


def test_nested_type_changes_are_refused() -> None:
    with pytest.raises(SchemaEvolutionError, match=r"'location' from struct"):
        update().update_column("location", StringType())
    with pytest.raises(SchemaEvolutionError, match=r"'data' from string to struct"):
        update(3).update_column("data", StructType())


def test_map_key_type_change_is_refused() -> None:
    schema = Schema(NestedField(1, "m", MapType(2, IntegerType(), 3, StringType())))
    with pytest.raises(SchemaEvolutionError, match=r"'m.key'.*map keys"):
        UpdateSchema(schema, 3, 2).update_column("m.key", LongType())


def test_unknown_promoted_to_nested_gets_fresh_ids() -> None:
    target = StructType(NestedField(1, "a", IntegerType()), NestedField(2, "b", StringType()))
    schema, last = (
        update(3).update_column("nothing", target).add_column("nothing.c", LongType()).apply()
    )
    assert schema.find_field_id("nothing.a") == 20
    assert schema.find_field_id("nothing.b") == 21
    assert schema.find_field_id("nothing.c") == 22
    assert last == 22


def test_update_doc() -> None:
    schema, _ = update().update_column("location.lat", doc="degrees north").apply()
    assert schema.field("location.lat").doc == "degrees north"
    with pytest.raises(SchemaEvolutionError, match=r"'tags.element'.*docs"):
        update().update_column("tags.element", doc="nope")


def test_update_added_column() -> None:
    schema, _ = (
        update()
        .add_column("extra", IntegerType())
        .update_column("extra", LongType(), doc="later")
        .rename_column("extra", "more")
        .apply()
    )
    assert schema.field("more") == NestedField(20, "more", LongType(), False, "later")


# -- update_column_default ------------------------------------------------------------------


def test_update_column_default() -> None:
    builder = update(3).add_column("extra", IntegerType(), initial_default=1)
    schema, _ = builder.update_column_default("extra", 9).apply()
    assert (schema.field("extra").initial_default, schema.field("extra").write_default) == (1, 9)
    cleared, _ = update(3).update_column_default("data", "x").apply()
    assert cleared.field("data").write_default == "x"
    assert cleared.field("data").initial_default is None


def test_update_column_default_rules() -> None:
    with pytest.raises(SchemaEvolutionError, match=r"'data'.*version 3"):
        update(2).update_column_default("data", "x")
    with pytest.raises(SchemaEvolutionError, match=r"'nothing'.*must default to null"):
        update(3).update_column_default("nothing", 1)
    with pytest.raises(SchemaEvolutionError, match=r"'location'.*empty struct"):
        update(3).update_column_default("location", {4: 1.0})
    with pytest.raises(SchemaEvolutionError, match=r"'id'.*integer"):
        update(3).update_column_default("id", "one")
    schema, _ = update(3).update_column_default("location", {}).apply()
    assert schema.field("location").write_default == {}


# -- moves -----------------------------------------------------------------------------------


def test_moves_top_level() -> None:
    schema, _ = (
        update()
        .move_first("data")
        .move_after("id", "location")
        .move_before("nothing", "data")
        .apply()
    )
    assert names(schema) == [
        "nothing",
        "data",
        "location",
        "id",
        "tags",
        "props",
        "day",
        "price",
        "points",
    ]


def test_moves_nested_and_added() -> None:
    schema, _ = (
        update()
        .move_first("location.long")
        .add_column("tags.element.y", LongType())
        .move_first("tags.element.y")
        .add_column("extra", IntegerType())
        .move_before("extra", "id")
        .apply()
    )
    assert [f.name for f in schema.find_type("location").fields] == ["long", "lat"]  # type: ignore[attr-defined]
    assert [f.name for f in schema.find_type("tags.element").fields] == ["y", "x"]  # type: ignore[attr-defined]
    assert names(schema)[:2] == ["extra", "id"]


def test_move_across_structs_is_refused() -> None:
    with pytest.raises(SchemaEvolutionError, match=r"'location.lat' after 'id'.*different structs"):
        update().move_after("location.lat", "id")


def test_move_relative_to_itself_is_refused() -> None:
    with pytest.raises(SchemaEvolutionError, match=r"'data' before itself"):
        update().move_before("data", "data")


def test_move_list_element_is_refused() -> None:
    with pytest.raises(SchemaEvolutionError, match=r"'tags.element'.*reordered"):
        update().move_first("tags.element")


def test_move_missing_column_is_refused() -> None:
    with pytest.raises(SchemaEvolutionError, match=r"'ghost'"):
        update().move_after("data", "ghost")


# -- identifier fields -----------------------------------------------------------------------


def test_set_identifier_fields() -> None:
    base = Schema(
        NestedField(1, "id", LongType(), True),
        NestedField(2, "s", StructType(NestedField(3, "k", StringType(), True)), True),
        NestedField(4, "o", StructType(NestedField(5, "k", StringType(), True)), False),
        NestedField(6, "f", DoubleType(), True),
        NestedField(7, "opt", StringType(), False),
        NestedField(8, "l", ListType(9, StructType(NestedField(10, "k", IntegerType(), True)))),
        NestedField(11, "v", VariantType(), True),
    )

    def ids(*paths: str) -> tuple[int, ...]:
        return (
            UpdateSchema(base, 11, 3).set_identifier_fields(*paths).apply()[0].identifier_field_ids
        )

    assert ids("id", "s.k") == (1, 3)
    for path, match in [
        ("f", "'f' cannot be an identifier field: double"),
        ("opt", "'opt' cannot be an identifier field: it is optional"),
        ("o.k", "'o.k' cannot be an identifier field: its parent struct 'o' is optional"),
        ("l.element.k", "'l.element.k' cannot be an identifier field: it is inside list"),
        ("s", "'s' cannot be an identifier field: it is struct"),
        ("v", "'v' cannot be an identifier field: it is variant"),
    ]:
        with pytest.raises(SchemaEvolutionError, match=match):
            ids(path)
    with pytest.raises(SchemaEvolutionError, match=r"'missing'"):
        ids("missing")


def test_identifier_made_optional_is_refused_at_apply() -> None:
    builder = update().make_column_optional("id")
    with pytest.raises(SchemaEvolutionError, match=r"'id' cannot be an identifier field"):
        builder.apply()


def test_identifier_on_added_column() -> None:
    schema, _ = (
        update(3)
        .add_column("key", StringType(), required=True, initial_default="k")
        .set_identifier_fields("id", "key")
        .apply()
    )
    assert schema.identifier_field_ids == (1, 20)


def test_identifier_follows_rename() -> None:
    schema, _ = update().rename_column("id", "key").apply()
    assert schema.identifier_field_ids == (1,)
    assert schema.field("key").field_id == 1


# -- union_by_name ---------------------------------------------------------------------------


def test_union_with_itself_is_noop() -> None:
    schema, last = update().union_by_name(BASE).apply()
    assert schema.same_columns(BASE)
    assert last == LAST


def test_union_adds_promotes_and_relaxes() -> None:
    incoming = Schema(
        NestedField(100, "id", LongType(), True),
        NestedField(101, "data", StringType(), False, "the payload"),
        NestedField(
            102,
            "location",
            StructType(
                NestedField(103, "lat", DoubleType(), False),
                NestedField(104, "alt", DoubleType(), True),
            ),
        ),
        NestedField(
            105,
            "tags",
            ListType(106, StructType(NestedField(107, "y", StringType())), True),
        ),
        NestedField(
            108,
            "props",
            MapType(109, StringType(), 110, StructType(NestedField(111, "w", IntegerType()))),
        ),
        NestedField(112, "price", DecimalType(5, 2)),  # narrower: the table keeps (9, 2)
        NestedField(113, "new", ListType(114, IntegerType())),
    )
    schema, last = update().union_by_name(incoming).apply()
    assert schema.find_type("id") == LongType()
    assert schema.field("data").doc == "the payload"
    assert schema.field("location.lat").optional
    assert schema.find_type("location.lat") == DoubleType()
    alt = schema.field("location.alt")
    assert (alt.field_id, alt.optional) == (20, True)  # added as optional: no default in v2
    assert schema.find_field_id("tags.element.y") == 21
    assert schema.find_field_id("props.value.w") == 22
    assert schema.find_type("price") == DecimalType(9, 2)
    assert schema.find_field_id("new") == 23
    assert schema.find_field_id("new.element") == 24
    assert last == 24
    assert schema.field("location.long").required  # untouched columns stay as they were


def test_union_keeps_required_with_initial_default_in_v3() -> None:
    incoming = Schema(NestedField(1, "extra", IntegerType(), True, None, 4, 4))
    schema, _ = update(3).union_by_name(incoming).apply()
    assert schema.field("extra").required
    assert schema.field("extra").initial_default == 4


def test_union_incompatible_types_are_refused() -> None:
    with pytest.raises(SchemaEvolutionError, match=r"'data' from string to int"):
        update().union_by_name(Schema(NestedField(1, "data", IntegerType())))
    with pytest.raises(SchemaEvolutionError, match=r"'location'.*struct.*string"):
        update().union_by_name(Schema(NestedField(1, "location", StringType())))


def test_union_case_insensitive_matches_existing() -> None:
    schema, last = (
        update(case_sensitive=False)
        .union_by_name(Schema(NestedField(1, "DATA", StringType())))
        .apply()
    )
    assert schema.same_columns(BASE)
    assert last == LAST


# -- refused operations leave the builder unchanged ------------------------------------------


def test_refused_operation_leaves_builder_unchanged() -> None:
    builder = update().add_column("extra", IntegerType()).rename_column("data", "payload")
    before = builder.apply()
    with pytest.raises(SchemaEvolutionError):
        builder.add_column("s", StructType(NestedField(1, "v", VariantType())))
    with pytest.raises(SchemaEvolutionError):
        builder.add_column("x", IntegerType(), required=True)
    # union_by_name fails on its second column, after adding the first one
    partly_valid = Schema(
        NestedField(1, "zz", StringType()), NestedField(2, "location", StringType())
    )
    with pytest.raises(SchemaEvolutionError, match="'location'"):
        builder.union_by_name(partly_valid)
    with pytest.raises(SchemaEvolutionError, match=r"'points.value'.*docs"):
        builder.update_column("points.value", LongType(), doc="type is fine, doc is not")
    assert builder.apply() == before
    schema, last = builder.add_column("next", IntegerType()).apply()
    assert schema.field("next").field_id == last == 21


# -- assign_fresh_ids ------------------------------------------------------------------------


def test_assign_fresh_ids_renumbers_from_one() -> None:
    fresh, last = assign_fresh_ids(BASE)
    assert [f.field_id for f in fresh.fields] == list(range(1, 10))
    assert fresh.find_field_id("location.lat") == 10
    assert fresh.find_field_id("tags.element") == 12
    assert fresh.find_field_id("tags.element.x") == 13
    assert fresh.find_field_id("props.key") == 14
    assert last == max(f.field_id for f in fresh.all_fields()) == 19
    assert fresh.identifier_field_ids == (1,)
    assert fresh.column_names == BASE.column_names
    assert fresh.schema_id == BASE.schema_id


def test_assign_fresh_ids_maps_identifier_fields() -> None:
    schema = Schema(
        NestedField(50, "a", StringType()),
        NestedField(40, "b", LongType(), True),
        identifier_field_ids=[40],
    )
    fresh, last = assign_fresh_ids(schema)
    assert fresh.identifier_field_ids == (2,)
    assert fresh.field("b").field_id == 2
    assert last == 2


def test_assign_fresh_ids_with_custom_counter_and_empty_schema() -> None:
    counter = iter(range(100, 200))
    fresh, last = assign_fresh_ids(BASE, lambda: next(counter))
    assert min(f.field_id for f in fresh.all_fields()) == 100
    assert last == 118
    empty, empty_last = assign_fresh_ids(Schema())
    assert (empty.fields, empty_last) == ((), 0)
    with pytest.raises(SchemaEvolutionError, match=r"used twice"):
        assign_fresh_ids(BASE, lambda: 1)


def test_assign_fresh_ids_keeps_everything_but_ids() -> None:
    schema = Schema(NestedField(9, "a", IntegerType(), False, "doc", 1, 2))
    fresh, _ = assign_fresh_ids(schema)
    assert fresh.fields[0] == NestedField(1, "a", IntegerType(), False, "doc", 1, 2)


# -- property: ids stay unique and are never reused -----------------------------------------

PRIMITIVES = [IntegerType(), LongType(), StringType(), DoubleType(), DateType()]
ADD_TYPES: list[IcebergType] = [
    *PRIMITIVES,
    StructType(NestedField(1, "p", IntegerType()), NestedField(2, "q", StringType())),
    ListType(1, StructType(NestedField(2, "r", LongType())), False),
    MapType(1, StringType(), 2, IntegerType()),
]
NAMES = ["a", "b", "c", "x", "lat", "data"]
BASE_NO_IDENTIFIERS = Schema(*BASE.fields, schema_id=0)


def _random_operation(builder: UpdateSchema, draw: Any, paths: list[str]) -> None:
    kind = draw(
        st.sampled_from(
            [
                "add",
                "rename",
                "delete",
                "optional",
                "require",
                "type",
                "doc",
                "first",
                "before",
                "after",
            ]
        )
    )
    path = draw(st.sampled_from(paths))
    if kind == "add":
        parent = draw(st.sampled_from(["", *paths]))
        name = draw(st.sampled_from(NAMES))
        full = f"{parent}.{name}" if parent else name
        builder.add_column(full, draw(st.sampled_from(ADD_TYPES)))
        paths.append(full)
    elif kind == "rename":
        builder.rename_column(path, draw(st.sampled_from(NAMES)))
    elif kind == "delete":
        builder.delete_column(path)
    elif kind == "optional":
        builder.make_column_optional(path)
    elif kind == "require":
        builder.require_column(path)
    elif kind == "type":
        builder.update_column(path, draw(st.sampled_from([LongType(), DoubleType()])))
    elif kind == "doc":
        builder.update_column(path, doc=draw(st.sampled_from(NAMES)))
    elif kind == "first":
        builder.move_first(path)
    elif kind == "before":
        builder.move_before(path, draw(st.sampled_from(paths)))
    else:
        builder.move_after(path, draw(st.sampled_from(paths)))


def _check_ids(before: Schema, before_last: int, after: Schema, after_last: int) -> None:
    ids = [f.field_id for f in after.all_fields()]
    assert len(ids) == len(set(ids))
    assert after_last >= before_last
    assert after_last >= max(ids, default=0)
    old_ids = {f.field_id for f in before.all_fields()}
    for fid in ids:
        # an id is either an old column's or brand new: deleted ids never come back
        assert fid in old_ids or before_last < fid <= after_last


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), version=st.sampled_from([2, 3]), lenient=st.booleans())
def test_random_evolutions_keep_ids_unique_and_fresh(
    data: Any, version: int, lenient: bool
) -> None:
    schema, last = BASE_NO_IDENTIFIERS, LAST
    for _ in range(2):  # two commits in a row: the second must not reuse ids either
        builder = UpdateSchema(schema, last, version, allow_incompatible_changes=lenient)
        paths = list(schema.column_names)
        for _ in range(data.draw(st.integers(0, 10))):
            snapshot = builder.apply()
            try:
                _random_operation(builder, data.draw, paths)
            except SchemaEvolutionError:
                assert builder.apply() == snapshot  # refused calls change nothing
        new_schema, new_last = builder.apply()
        _check_ids(schema, last, new_schema, new_last)
        assert Schema.from_json(new_schema.to_json()) == new_schema
        schema, last = new_schema, new_last


# -- comparison with PyIceberg (test-only peer) ----------------------------------------------


def _pyiceberg_apply(base: Schema, last: int, steps: Any) -> Schema:
    from pyiceberg.schema import Schema as PySchema
    from pyiceberg.table.update.schema import UpdateSchema as PyUpdateSchema

    py_base = PySchema.model_validate(base.to_json())
    metadata = SimpleNamespace(partition_specs=[], schemas=[py_base], last_column_id=last)
    transaction: Any = SimpleNamespace(table_metadata=metadata)
    builder = PyUpdateSchema(transaction, schema=py_base)
    steps(builder)
    result = builder._apply()
    return Schema.from_json(json.loads(result.model_dump_json(by_alias=True)))


def _py_types() -> SimpleNamespace:
    from pyiceberg import types as t

    return SimpleNamespace(
        long=t.LongType(),
        double=t.DoubleType(),
        string=t.StringType(),
        decimal=t.DecimalType(12, 2),
        nested=t.StructType(
            t.NestedField(1, "a", t.StructType(t.NestedField(2, "c", t.LongType()))),
            t.NestedField(3, "b", t.ListType(4, t.StringType(), element_required=False)),
        ),
    )


def nested(first_id: int = 1) -> StructType:
    """struct<a: struct<c: long>, b: list<string>> with ids from ``first_id``."""
    return StructType(
        NestedField(first_id, "a", StructType(NestedField(first_id + 1, "c", LongType()))),
        NestedField(first_id + 2, "b", ListType(first_id + 3, StringType(), False)),
    )


NESTED = nested()


@pytest.mark.interop
def test_matches_pyiceberg_add_rename_move_promote() -> None:
    p = _py_types()

    def theirs(u: Any) -> None:
        u.add_column("loc", p.nested)
        u.add_column(("tags", "element", "y"), p.long)
        u.add_column(("location", "alt"), p.double, doc="metres")
        u.rename_column("data", "payload")
        u.update_column("id", p.long)
        u.update_column("price", p.decimal)
        u.make_column_optional("location.lat")
        u.move_first("day")
        u.move_after("location.alt", "location.lat")
        u.delete_column("props")

    mine, last = (
        update()
        .add_column("loc", NESTED)
        .add_column("tags.element.y", LongType())
        .add_column("location.alt", DoubleType(), doc="metres")
        .rename_column("data", "payload")
        .update_column("id", LongType())
        .update_column("price", DecimalType(12, 2))
        .make_column_optional("location.lat")
        .move_first("day")
        .move_after("location.alt", "location.lat")
        .delete_column("props")
        .apply()
    )
    expected = _pyiceberg_apply(BASE, LAST, theirs)
    assert mine.struct == expected.struct
    assert last == max(f.field_id for f in expected.all_fields())


@pytest.mark.interop
def test_matches_pyiceberg_union_by_name() -> None:
    incoming = Schema(
        NestedField(1, "id", LongType(), True),
        NestedField(2, "location", StructType(NestedField(3, "alt", DoubleType()))),
        NestedField(4, "tags", ListType(5, StructType(NestedField(6, "y", StringType())))),
        NestedField(7, "loc", nested(8)),
    )
    from pyiceberg.schema import Schema as PySchema

    py_incoming = PySchema.model_validate(incoming.to_json())
    mine, _ = update().union_by_name(incoming).apply()
    expected = _pyiceberg_apply(BASE, LAST, lambda u: u.union_by_name(py_incoming))
    assert mine.struct == expected.struct


@pytest.mark.interop
def test_matches_pyiceberg_fresh_ids() -> None:
    from pyiceberg.schema import Schema as PySchema
    from pyiceberg.schema import assign_fresh_schema_ids

    shuffled = Schema(
        NestedField(40, "a", nested(41), True),
        NestedField(30, "m", MapType(31, StringType(), 32, nested(33))),
        NestedField(20, "k", LongType(), True),
        identifier_field_ids=[20],
    )
    theirs = assign_fresh_schema_ids(PySchema.model_validate(shuffled.to_json()))
    expected = Schema.from_json(json.loads(theirs.model_dump_json(by_alias=True)))
    mine, _ = assign_fresh_ids(shuffled)
    assert mine.struct == expected.struct
    assert mine.identifier_field_ids == expected.identifier_field_ids
