"""Tests for icefloe.spec.sort_order: JSON (Appendix C), validation and order satisfaction."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples
from icefloe.errors import ValidationError
from icefloe.spec.schema import Schema
from icefloe.spec.sort_order import (
    UNSORTED_ORDER_ID,
    NullOrder,
    SortDirection,
    SortField,
    SortOrder,
    SortOrderBuilder,
)
from icefloe.spec.transforms import (
    BucketTransform,
    DayTransform,
    HourTransform,
    IdentityTransform,
    TruncateTransform,
    UnknownTransform,
)
from icefloe.spec.types import (
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    TimestampType,
)

# Apache Iceberg's conformance files, copied into the repository (tests/fixtures)
CONFORMANCE = Path(__file__).resolve().parents[2] / "fixtures" / "conformance" / "table-metadata"

SCHEMA = Schema(
    NestedField(1, "x", LongType(), required=True),
    NestedField(2, "y", LongType(), required=True),
    NestedField(3, "z", LongType(), required=True),
    NestedField(4, "ts", TimestampType()),
    NestedField(5, "name", StringType()),
    NestedField(6, "props", MapType(7, StringType(), 8, StringType())),
    NestedField(9, "nums", ListType(10, LongType())),
)

APPENDIX_C_ORDER = {
    "order-id": 1,
    "fields": [
        {
            "transform": "identity",
            "source-id": 2,
            "direction": "asc",
            "null-order": "nulls-first",
        },
        {
            "transform": "bucket[4]",
            "source-id": 3,
            "direction": "desc",
            "null-order": "nulls-last",
        },
    ],
}


def appendix_c_order(order_id: int = 1) -> SortOrder:
    return SortOrder(
        order_id,
        (
            SortField(2, IdentityTransform(), SortDirection.ASC, NullOrder.NULLS_FIRST),
            SortField(3, BucketTransform(4), SortDirection.DESC, NullOrder.NULLS_LAST),
        ),
    )


def test_appendix_c_example_round_trip() -> None:
    order = SortOrder.from_json(APPENDIX_C_ORDER)
    assert order == appendix_c_order()
    assert order.to_json() == APPENDIX_C_ORDER
    assert SortOrder.from_json(json.loads(json.dumps(order.to_json()))) == order


@pytest.mark.parametrize("name", ["V2Valid.json", "V2ValidMinimal.json", "V3ValidMinimal.json"])
def test_conformance_sort_orders(name: str) -> None:
    metadata = json.loads((CONFORMANCE / name).read_text())
    orders = [SortOrder.from_json(o) for o in metadata["sort-orders"]]
    assert orders == [appendix_c_order(3)]
    assert [o.to_json() for o in orders] == metadata["sort-orders"]
    orders[0].check_compatible(SCHEMA)


def test_unsorted() -> None:
    order = SortOrder.unsorted()
    assert order.order_id == UNSORTED_ORDER_ID == 0
    assert order.is_unsorted
    assert order.to_json() == {"order-id": 0, "fields": []}
    assert SortOrder.from_json({"order-id": 0, "fields": []}) == order
    assert str(order) == "unsorted"


def test_order_id_zero_is_reserved_for_unsorted() -> None:
    with pytest.raises(ValidationError, match="reserved for the unsorted order"):
        appendix_c_order(0)
    with pytest.raises(ValidationError, match="sort order 4 has no fields"):
        SortOrder(4, ())
    with pytest.raises(ValidationError, match="non-negative"):
        SortOrder(-1, ())


def test_tolerant_enum_spellings() -> None:
    f = SortField.from_json(
        {
            "transform": " Bucket[4] ",
            "source-id": 3,
            "direction": "DESC",
            "null-order": "NULLS_LAST",
        }
    )
    assert f == SortField(3, BucketTransform(4), SortDirection.DESC, NullOrder.NULLS_LAST)
    as_strings = SortField(3, BucketTransform(4), "desc", "nulls-last")  # type: ignore[arg-type]
    assert as_strings == f
    assert as_strings.direction is SortDirection.DESC


def test_v3_source_ids() -> None:
    f = SortField.from_json(
        {
            "transform": "identity",
            "source-ids": [2],
            "direction": "asc",
            "null-order": "nulls-first",
        }
    )
    assert f == SortField(2, IdentityTransform(), SortDirection.ASC, NullOrder.NULLS_FIRST)
    multi = {
        "transform": "zorder",
        "source-id": 1,
        "source-ids": [1, 2],
        "direction": "asc",
        "null-order": "nulls-last",
    }
    g = SortField.from_json(multi)
    assert g.all_source_ids == (1, 2)
    assert g.to_json() == multi
    order = SortOrder(5, (g,))
    assert order.has_unknown_transform
    order.check_compatible(SCHEMA)


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        ([], "sort order must be a JSON object"),
        ({"fields": []}, "missing required field 'order-id'"),
        ({"order-id": "1", "fields": []}, "'order-id' must be an integer"),
        ({"order-id": 1}, "missing its 'fields' list"),
        ({"order-id": 1, "fields": [7]}, "sort field must be a JSON object"),
        (
            {
                "order-id": 1,
                "fields": [{"source-id": 1, "direction": "asc", "null-order": "nulls-first"}],
            },
            "missing required field 'transform'",
        ),
        (
            {
                "order-id": 1,
                "fields": [
                    {
                        "transform": "identity",
                        "source-id": 1,
                        "direction": "up",
                        "null-order": "nulls-first",
                    }
                ],
            },
            "direction must be 'asc' or 'desc', got 'up'",
        ),
        (
            {
                "order-id": 1,
                "fields": [
                    {
                        "transform": "identity",
                        "source-id": 1,
                        "direction": "asc",
                        "null-order": "first",
                    }
                ],
            },
            "null-order must be 'nulls-first' or 'nulls-last'",
        ),
        (
            {
                "order-id": 1,
                "fields": [
                    {"transform": "identity", "direction": "asc", "null-order": "nulls-first"}
                ],
            },
            "missing 'source-id'",
        ),
        (
            {
                "order-id": 1,
                "fields": [
                    {
                        "transform": 4,
                        "source-id": 1,
                        "direction": "asc",
                        "null-order": "nulls-first",
                    }
                ],
            },
            "'transform' must be a string",
        ),
    ],
)
def test_bad_json_is_a_clear_error(obj: Any, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        SortOrder.from_json(obj)


FIELDS = st.builds(
    SortField,
    st.integers(1, 50),
    st.sampled_from(
        [
            IdentityTransform(),
            BucketTransform(16),
            TruncateTransform(3),
            DayTransform(),
            UnknownTransform("zorder"),
        ]
    ),
    st.sampled_from(list(SortDirection)),
    st.sampled_from(list(NullOrder)),
)


@settings(max_examples=examples(100))
@given(order_id=st.integers(1, 10_000), fields=st.lists(FIELDS, min_size=1, max_size=5))
def test_json_round_trip(order_id: int, fields: list[SortField]) -> None:
    order = SortOrder(order_id, tuple(fields))
    assert SortOrder.from_json(json.loads(json.dumps(order.to_json()))) == order


def test_check_compatible() -> None:
    appendix_c_order().check_compatible(SCHEMA)
    bad = {
        "source column id 42 is not in schema": SortField(
            42, IdentityTransform(), SortDirection.ASC, NullOrder.NULLS_FIRST
        ),
        "'props' is a map": SortField(
            6, IdentityTransform(), SortDirection.ASC, NullOrder.NULLS_FIRST
        ),
        "inside a list or map": SortField(
            10, IdentityTransform(), SortDirection.ASC, NullOrder.NULLS_FIRST
        ),
        "day cannot be applied to column 'x' of type long": SortField(
            1, DayTransform(), SortDirection.ASC, NullOrder.NULLS_FIRST
        ),
    }
    for message, f in bad.items():
        with pytest.raises(ValidationError, match=f"sort order 2 field .*{message}"):
            SortOrder(2, (f,)).check_compatible(SCHEMA)


def test_satisfies() -> None:
    hourly = SortOrderBuilder(SCHEMA, 1).asc("ts", "hour").asc("name").build()
    daily = SortOrderBuilder(SCHEMA, 2).asc("ts", "day").build()
    by_ts = SortOrderBuilder(SCHEMA, 3).asc("ts").build()
    assert hourly.satisfies(daily)
    assert hourly.satisfies(SortOrder.unsorted())
    assert hourly.satisfies(hourly)
    assert by_ts.satisfies(daily)
    assert not daily.satisfies(hourly)
    assert not daily.satisfies(by_ts)
    assert not SortOrder.unsorted().satisfies(daily)
    desc = SortOrderBuilder(SCHEMA, 4).desc("ts", "day").build()
    assert not hourly.satisfies(desc)
    nulls_last = SortOrderBuilder(SCHEMA, 5).asc("ts", "day", NullOrder.NULLS_LAST).build()
    assert not hourly.satisfies(nulls_last)


def test_same_order_ignores_id() -> None:
    assert appendix_c_order(1).same_order(appendix_c_order(7))
    assert appendix_c_order(1) != appendix_c_order(7)


def test_builder() -> None:
    order = (
        SortOrderBuilder(SCHEMA, order_id=3)
        .asc("y")
        .desc("z", BucketTransform(4))
        .asc("ts", HourTransform(), null_order="nulls-last")
        .build()
    )
    assert order.order_id == 3
    assert order.fields[:2] == appendix_c_order().fields
    assert order.fields[2] == SortField(4, HourTransform(), SortDirection.ASC, NullOrder.NULLS_LAST)
    assert "hour(4) asc nulls-last" in str(order)
    assert SortOrderBuilder(SCHEMA).build() == SortOrder.unsorted()


def test_builder_rejects_bad_fields() -> None:
    builder = SortOrderBuilder(SCHEMA)
    with pytest.raises(ValidationError, match="no such column"):
        builder.asc("missing")
    with pytest.raises(ValidationError, match="day cannot be applied to column 'x'"):
        builder.asc("x", "day")
    with pytest.raises(ValidationError, match="unknown transform zorder"):
        builder.desc("x", "zorder")
    with pytest.raises(ValidationError, match="inside a list or map"):
        builder.asc("nums.element")
    with pytest.raises(ValidationError, match="null-order"):
        builder.asc("x", null_order="sometimes")
