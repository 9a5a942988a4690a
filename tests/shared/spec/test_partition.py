"""Tests for icefloe.spec.partition: spec JSON, validation, partition types and paths, evolution."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples
from icefloe.errors import ValidationError
from icefloe.spec.partition import (
    PARTITION_FIELD_ID_START,
    PartitionField,
    PartitionSpec,
    PartitionSpecBuilder,
    default_partition_name,
)
from icefloe.spec.schema import Schema
from icefloe.spec.transforms import (
    BucketTransform,
    DayTransform,
    HourTransform,
    IdentityTransform,
    MonthTransform,
    Transform,
    TruncateTransform,
    UnknownTransform,
    VoidTransform,
    YearTransform,
)
from icefloe.spec.types import (
    DateType,
    DoubleType,
    IntegerType,
    ListType,
    LongType,
    NestedField,
    StringType,
    StructType,
    TimestamptzType,
    UnknownType,
)

# Apache Iceberg's conformance files, copied into the repository (tests/fixtures)
CONFORMANCE = Path(__file__).resolve().parents[2] / "fixtures" / "conformance" / "table-metadata"

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "data", StringType()),
    NestedField(3, "category", StringType()),
    NestedField(4, "ts", TimestamptzType()),
    NestedField(5, "tags", ListType(6, StringType())),
    NestedField(7, "point", StructType(NestedField(8, "x", DoubleType()))),
    NestedField(9, "d", DateType()),
    schema_id=3,
)

APPENDIX_C_SPEC = {
    "spec-id": 0,
    "fields": [
        {"source-id": 4, "field-id": 1000, "name": "ts_day", "transform": "day"},
        {"source-id": 1, "field-id": 1001, "name": "id_bucket", "transform": "bucket[16]"},
    ],
}


def appendix_c_spec() -> PartitionSpec:
    return PartitionSpec(
        0,
        (
            PartitionField(4, 1000, "ts_day", DayTransform()),
            PartitionField(1, 1001, "id_bucket", BucketTransform(16)),
        ),
    )


# --------------------------------------------------------------------------------------
# JSON
# --------------------------------------------------------------------------------------


def test_appendix_c_example_round_trip() -> None:
    spec = PartitionSpec.from_json(APPENDIX_C_SPEC)
    assert spec == appendix_c_spec()
    out = spec.to_json()
    assert out["spec-id"] == 0
    assert [dict(f) for f in out["fields"]] == APPENDIX_C_SPEC["fields"]
    assert PartitionSpec.from_json(json.loads(json.dumps(out))) == spec


@pytest.mark.parametrize("name", ["V2Valid.json", "V2ValidMinimal.json", "V3ValidMinimal.json"])
def test_conformance_partition_specs(name: str) -> None:
    metadata = json.loads((CONFORMANCE / name).read_text())
    specs = [PartitionSpec.from_json(s) for s in metadata["partition-specs"]]
    assert specs == [PartitionSpec(0, (PartitionField(1, 1000, "x", IdentityTransform()),))]
    assert [s.to_json() for s in specs] == metadata["partition-specs"]
    assert specs[0].last_assigned_field_id == metadata["last-partition-id"]


def test_v1_field_list_form() -> None:
    metadata = json.loads((CONFORMANCE / "V1Valid.json").read_text())
    spec = PartitionSpec.from_json(metadata["partition-spec"])
    assert spec == PartitionSpec(0, (PartitionField(1, 1000, "x", IdentityTransform()),))
    assert spec.fields_to_json() == metadata["partition-spec"]


def test_v1_fields_without_ids_count_up_from_1000() -> None:
    spec = PartitionSpec.from_json(
        {
            "spec-id": 2,
            "fields": [
                {"source-id": 4, "name": "ts_day", "transform": "day"},
                {"source-id": 1, "name": "id_bucket", "transform": "bucket[16]"},
                {"source-id": 3, "name": "category", "transform": "identity"},
            ],
        }
    )
    assert [f.field_id for f in spec.fields] == [1000, 1001, 1002]
    assert spec.last_assigned_field_id == 1002


def test_v3_source_ids() -> None:
    single = PartitionSpec.from_json(
        {
            "spec-id": 1,
            "fields": [{"source-ids": [4], "field-id": 1000, "name": "d", "transform": "day"}],
        }
    )
    assert single.fields[0] == PartitionField(4, 1000, "d", DayTransform())
    # A multi-argument transform is unknown here: carried through, written back as read.
    multi_json = {
        "name": "zz",
        "transform": "zorder",
        "source-id": 1,
        "source-ids": [1, 4],
        "field-id": 1001,
    }
    multi = PartitionSpec.from_json({"spec-id": 1, "fields": [multi_json]})
    f = multi.fields[0]
    assert f.transform == UnknownTransform("zorder")
    assert f.all_source_ids == (1, 4)
    assert multi.to_json()["fields"] == [multi_json]
    assert multi.has_unknown_transform
    assert multi.fields_by_source_id(4) == [f]
    with pytest.raises(ValidationError, match="takes one argument"):
        PartitionSpec.from_json(
            {
                "spec-id": 1,
                "fields": [
                    {"source-ids": [1, 4], "field-id": 1000, "name": "b", "transform": "bucket[2]"}
                ],
            }
        )


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        ("nope", "JSON object or field list"),
        ({"fields": []}, "missing required field 'spec-id'"),
        ({"spec-id": "0", "fields": []}, "'spec-id' must be an integer"),
        ({"spec-id": 0}, "missing its 'fields' list"),
        ({"spec-id": 0, "fields": ["x"]}, "partition field must be a JSON object"),
        (
            {"spec-id": 0, "fields": [{"source-id": 1, "field-id": 1000, "transform": "day"}]},
            "missing required field 'name'",
        ),
        (
            {"spec-id": 0, "fields": [{"source-id": 1, "field-id": 1000, "name": "a"}]},
            "partition field 'a' is missing required field 'transform'",
        ),
        (
            {"spec-id": 0, "fields": [{"field-id": 1000, "name": "a", "transform": "day"}]},
            "partition field 'a' is missing 'source-id'",
        ),
        (
            {
                "spec-id": 0,
                "fields": [{"source-id": 1, "field-id": True, "name": "a", "transform": "day"}],
            },
            "'field-id' must be an integer",
        ),
        (
            {
                "spec-id": 0,
                "fields": [
                    {"source-id": 1, "field-id": 1000, "name": "a", "transform": "day"},
                    {"source-id": 2, "field-id": 1000, "name": "b", "transform": "day"},
                ],
            },
            "field id 1000 is used by both 'a' and 'b'",
        ),
        (
            {
                "spec-id": 0,
                "fields": [
                    {"source-id": 1, "field-id": 1000, "name": "a", "transform": "day"},
                    {"source-id": 2, "field-id": 1001, "name": "a", "transform": "day"},
                ],
            },
            "partition name 'a' is used twice",
        ),
    ],
)
def test_bad_json_is_a_clear_error(obj: Any, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        PartitionSpec.from_json(obj)


TRANSFORMS = (
    st.sampled_from(
        [
            IdentityTransform(),
            VoidTransform(),
            YearTransform(),
            MonthTransform(),
            DayTransform(),
            HourTransform(),
            UnknownTransform("zorder"),
        ]
    )
    | st.builds(BucketTransform, st.integers(1, 2**31 - 1))
    | st.builds(TruncateTransform, st.integers(1, 2**31 - 1))
)


@st.composite
def specs(draw: st.DrawFn) -> PartitionSpec:
    n = draw(st.integers(0, 6))
    names = draw(st.lists(st.text(min_size=1, max_size=8), min_size=n, max_size=n, unique=True))
    ids = draw(st.lists(st.integers(1000, 5000), min_size=n, max_size=n, unique=True))
    fields = [
        PartitionField(draw(st.integers(1, 100)), field_id, name, draw(TRANSFORMS))
        for name, field_id in zip(names, ids)
    ]
    return PartitionSpec(draw(st.integers(0, 1000)), tuple(fields))


@settings(max_examples=examples(100))
@given(specs())
def test_json_round_trip(spec: PartitionSpec) -> None:
    text = json.dumps(spec.to_json())
    assert PartitionSpec.from_json(json.loads(text)) == spec
    assert PartitionSpec.from_json(spec.fields_to_json()).fields == spec.fields


# --------------------------------------------------------------------------------------
# Properties
# --------------------------------------------------------------------------------------


def test_unpartitioned() -> None:
    spec = PartitionSpec.unpartitioned()
    assert spec.spec_id == 0
    assert spec.fields == ()
    assert spec.is_unpartitioned
    assert not spec.is_partitioned
    assert spec.last_assigned_field_id == PARTITION_FIELD_ID_START - 1 == 999
    assert spec.partition_type(SCHEMA) == StructType()
    assert spec.partition_path((), SCHEMA) == ""
    assert spec.to_json() == {"spec-id": 0, "fields": []}


def test_only_void_fields_is_unpartitioned() -> None:
    spec = PartitionSpec(1, (PartitionField(4, 1000, "ts_day", VoidTransform()),))
    assert spec.is_unpartitioned
    assert appendix_c_spec().is_partitioned


def test_fields_may_be_given_as_a_list_and_specs_hash() -> None:
    spec = PartitionSpec(0, [PartitionField(1, 1000, "id", IdentityTransform())])  # type: ignore[arg-type]
    assert isinstance(spec.fields, tuple)
    assert hash(spec) == hash(
        PartitionSpec(0, (PartitionField(1, 1000, "id", IdentityTransform()),))
    )


def test_lookups() -> None:
    spec = appendix_c_spec()
    assert spec.field_by_id(1001) == PartitionField(1, 1001, "id_bucket", BucketTransform(16))
    assert spec.field_by_id(7) is None
    assert spec.fields_by_source_id(4) == [spec.fields[0]]
    assert spec.fields_by_source_id(2) == []
    assert str(spec.fields[1]) == "1001: id_bucket: bucket[16](1)"


def test_compatible_with_ignores_ids_only() -> None:
    spec = appendix_c_spec()
    renumbered = PartitionSpec(
        5,
        (
            PartitionField(4, 1010, "ts_day", DayTransform()),
            PartitionField(1, 1011, "id_bucket", BucketTransform(16)),
        ),
    )
    assert spec.compatible_with(renumbered)
    renamed = PartitionSpec(5, (PartitionField(4, 1000, "day", DayTransform()), spec.fields[1]))
    assert not spec.compatible_with(renamed)
    assert not spec.compatible_with(PartitionSpec(5, spec.fields[:1]))
    other_transform = PartitionSpec(
        5, (spec.fields[0], PartitionField(1, 1001, "id_bucket", BucketTransform(8)))
    )
    assert not spec.compatible_with(other_transform)


# --------------------------------------------------------------------------------------
# Binding to a schema
# --------------------------------------------------------------------------------------


def test_partition_type() -> None:
    struct = appendix_c_spec().partition_type(SCHEMA)
    assert struct == StructType(
        NestedField(1000, "ts_day", DateType(), required=False),
        NestedField(1001, "id_bucket", IntegerType(), required=False),
    )


def test_partition_type_of_dropped_source_is_unknown() -> None:
    spec = PartitionSpec(1, (PartitionField(99, 1000, "gone_null", VoidTransform()),))
    assert spec.partition_type(SCHEMA).fields[0].field_type == UnknownType()


def test_partition_type_of_incompatible_field_names_it() -> None:
    spec = PartitionSpec(1, (PartitionField(2, 1000, "data_day", DayTransform()),))
    with pytest.raises(ValidationError, match="partition spec 1 field 'data_day' \\(id 1000\\)"):
        spec.partition_type(SCHEMA)


def test_partition_path() -> None:
    spec = appendix_c_spec()
    day = (dt.date(2017, 11, 16) - dt.date(1970, 1, 1)).days
    assert spec.partition_path((day, 3), SCHEMA) == "ts_day=2017-11-16/id_bucket=3"
    assert spec.partition_path((None, None), SCHEMA) == "ts_day=null/id_bucket=null"


def test_partition_path_escapes_names_and_values() -> None:
    spec = PartitionSpec(
        0,
        (
            PartitionField(3, 1000, "category", IdentityTransform()),
            PartitionField(2, 1001, "data/trunc", TruncateTransform(4)),
            PartitionField(4, 1002, "ts_hour", HourTransform()),
        ),
    )
    path = spec.partition_path(("a b/c=d&é", "x?y#", 0), SCHEMA)
    assert path == "category=a+b%2Fc%3Dd%26%C3%A9/data%2Ftrunc=x%3Fy%23/ts_hour=1970-01-01-00"


def test_partition_path_arity_mismatch() -> None:
    with pytest.raises(ValidationError, match="has 2 fields but the partition value has 1"):
        appendix_c_spec().partition_path((1,), SCHEMA)
    with pytest.raises(ValidationError, match="has 2 fields"):
        appendix_c_spec().partition_path([1, 2], SCHEMA)  # type: ignore[arg-type]


def test_check_compatible() -> None:
    appendix_c_spec().check_compatible(SCHEMA)
    # Void fields may outlive their source column; unknown transforms must stay readable.
    PartitionSpec(1, (PartitionField(99, 1000, "gone", VoidTransform()),)).check_compatible(SCHEMA)
    PartitionSpec(1, (PartitionField(1, 1000, "z", UnknownTransform("z")),)).check_compatible(
        SCHEMA
    )
    bad = {
        "source column id 99 is not in schema 3": PartitionField(99, 1000, "a", DayTransform()),
        "'tags' is a list<string>": PartitionField(5, 1000, "a", IdentityTransform()),
        "inside a list or map": PartitionField(6, 1000, "a", IdentityTransform()),
        "day cannot be applied to column 'data' of type string": PartitionField(
            2, 1000, "a", DayTransform()
        ),
    }
    for message, f in bad.items():
        with pytest.raises(ValidationError, match=message):
            PartitionSpec(7, (f,)).check_compatible(SCHEMA)


def test_field_construction_errors() -> None:
    with pytest.raises(ValidationError, match="empty name"):
        PartitionField(1, 1000, "", IdentityTransform())
    with pytest.raises(ValidationError, match="must be a Transform"):
        PartitionField(1, 1000, "a", "identity")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="first of source_ids"):
        PartitionField(1, 1000, "a", UnknownTransform("z"), source_ids=(2, 1))
    with pytest.raises(ValidationError, match="non-negative"):
        PartitionSpec(-1, ())
    with pytest.raises(ValidationError, match="must be PartitionFields"):
        PartitionSpec(0, ("a",))  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------
# Builder and evolution
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("transform", "name"),
    [
        (IdentityTransform(), "ts"),
        (BucketTransform(16), "ts_bucket"),
        (YearTransform(), "ts_year"),
        (MonthTransform(), "ts_month"),
        (DayTransform(), "ts_day"),
        (HourTransform(), "ts_hour"),
        (VoidTransform(), "ts_null"),
    ],
)
def test_default_names(transform: Transform, name: str) -> None:
    assert default_partition_name("ts", transform) == name
    spec = PartitionSpecBuilder(SCHEMA).add_field("ts", transform).build()
    assert spec.fields == (PartitionField(4, 1000, name, transform),)


def test_default_name_for_truncate_and_unknown() -> None:
    assert default_partition_name("data", TruncateTransform(4)) == "data_trunc"
    with pytest.raises(ValidationError, match="pass a name"):
        default_partition_name("data", UnknownTransform("z"))


def test_builder_assigns_ids_from_1000() -> None:
    builder = PartitionSpecBuilder(SCHEMA)
    spec = builder.add_field("ts", "day").add_field("id", "bucket[16]").build()
    assert spec == appendix_c_spec()
    assert builder.last_partition_id == 1001


def test_builder_continues_after_last_partition_id() -> None:
    builder = PartitionSpecBuilder(SCHEMA, spec_id=3, last_partition_id=1004)
    spec = builder.add_field(3, IdentityTransform()).add_field("point.x", "identity").build()
    assert spec.spec_id == 3
    assert [(f.field_id, f.name, f.source_id) for f in spec.fields] == [
        (1005, "category", 3),
        (1006, "point.x", 8),
    ]
    assert builder.last_partition_id == 1006


def test_builder_reuses_ids_of_equivalent_historical_fields() -> None:
    v0 = appendix_c_spec()
    v1 = (
        PartitionSpecBuilder(SCHEMA, 1, v0.last_assigned_field_id, previous_specs=[v0])
        .add_field("id", BucketTransform(16))  # reused, though now first
        .add_field("category", IdentityTransform())  # new
        .add_field("ts", DayTransform(), name="day_of_ts")  # other name: a new field
        .build()
    )
    assert [(f.field_id, f.name) for f in v1.fields] == [
        (1001, "id_bucket"),
        (1002, "category"),
        (1003, "day_of_ts"),
    ]
    builder = PartitionSpecBuilder(SCHEMA, 2, 1003, previous_specs=[v0, v1])
    v2 = builder.add_field("ts", "day", name="ts_day").add_field("category", "identity").build()
    assert [(f.field_id, f.name) for f in v2.fields] == [(1000, "ts_day"), (1002, "category")]
    assert builder.last_partition_id == 1003


def test_builder_rejects_redundant_fields() -> None:
    with pytest.raises(ValidationError, match="redundant"):
        PartitionSpecBuilder(SCHEMA).add_field("ts", "day").add_field("ts", "hour")
    with pytest.raises(ValidationError, match="redundant"):
        PartitionSpecBuilder(SCHEMA).add_field("id", "bucket[4]").add_field(
            "id", "bucket[4]", name="again"
        )
    # Different bucket counts are different partitionings, and void fields may repeat.
    spec = (
        PartitionSpecBuilder(SCHEMA)
        .add_field("id", "bucket[4]")
        .add_field("id", "bucket[8]", name="id_bucket_8")
        .add_field("data", "void", name="a")
        .add_field("data", "void", name="b")
        .build()
    )
    assert len(spec.fields) == 4


def test_builder_name_rules() -> None:
    with pytest.raises(ValidationError, match="used more than once"):
        PartitionSpecBuilder(SCHEMA).add_field("id", "bucket[4]").add_field("id", "bucket[8]")
    with pytest.raises(ValidationError, match="is the name of a table column"):
        PartitionSpecBuilder(SCHEMA).add_field("id", "bucket[4]", name="data")
    with pytest.raises(ValidationError, match="has the name of another column"):
        PartitionSpecBuilder(SCHEMA).add_field("data", "identity", name="category")
    with pytest.raises(ValidationError, match="empty name"):
        PartitionSpecBuilder(SCHEMA).add_field("data", "identity", name="")
    spec = PartitionSpecBuilder(SCHEMA).add_field("data", "identity", name="data").build()
    assert spec.fields[0].name == "data"


def test_builder_rejects_bad_sources_and_transforms() -> None:
    builder = PartitionSpecBuilder(SCHEMA)
    with pytest.raises(ValidationError, match=r"column 'missing'.*no such column"):
        builder.add_field("missing", "identity")
    with pytest.raises(ValidationError, match="column id 42"):
        builder.add_field(42, "identity")
    with pytest.raises(ValidationError, match="day cannot be applied to column 'id'"):
        builder.add_field("id", "day")
    with pytest.raises(ValidationError, match="inside a list or map"):
        builder.add_field("tags.element", "identity")
    with pytest.raises(ValidationError, match="unknown transform zorder"):
        builder.add_field("id", "zorder")
    with pytest.raises(ValidationError, match="column name or id"):
        builder.add_field(1.5, "identity")  # type: ignore[arg-type]
    assert builder.build() == PartitionSpec.unpartitioned()


@pytest.mark.interop
@settings(max_examples=examples(50), deadline=None)
@given(
    day=st.integers(-719_162, 2_932_896),
    bucket=st.integers(0, 15) | st.none(),
    text=st.text(max_size=12) | st.none(),
    name=st.text(min_size=1, max_size=8).filter(lambda n: SCHEMA.find_field(n) is None),
)
def test_partition_path_matches_pyiceberg(
    day: int, bucket: int | None, text: str | None, name: str
) -> None:
    from pyiceberg.partitioning import PartitionField as PyField
    from pyiceberg.partitioning import PartitionSpec as PySpec
    from pyiceberg.schema import Schema as PySchema
    from pyiceberg.transforms import BucketTransform as PyBucket
    from pyiceberg.transforms import DayTransform as PyDay
    from pyiceberg.transforms import TruncateTransform as PyTruncate
    from pyiceberg.typedef import Record
    from pyiceberg.types import LongType as PyLong
    from pyiceberg.types import NestedField as PyNested
    from pyiceberg.types import StringType as PyString
    from pyiceberg.types import TimestamptzType as PyTimestamptz

    py_schema = PySchema(
        PyNested(1, "id", PyLong(), required=True),
        PyNested(2, "data", PyString(), required=False),
        PyNested(4, "ts", PyTimestamptz(), required=False),
    )
    py_spec = PySpec(
        PyField(4, 1000, PyDay(), "ts_day"),
        PyField(1, 1001, PyBucket(16), "id_bucket"),
        PyField(2, 1002, PyTruncate(20), name),
    )
    spec = PartitionSpec(
        0,
        (
            PartitionField(4, 1000, "ts_day", DayTransform()),
            PartitionField(1, 1001, "id_bucket", BucketTransform(16)),
            PartitionField(2, 1002, name, TruncateTransform(20)),
        ),
    )
    values = (day, bucket, text)
    assert spec.partition_path(values, SCHEMA) == py_spec.partition_to_path(
        Record(*values), py_schema
    )
