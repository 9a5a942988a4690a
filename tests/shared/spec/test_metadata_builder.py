"""Metadata builder: table creation, every update action and its rules, format upgrades,
REST update and requirement JSON, and PyIceberg compatibility of the results."""

from __future__ import annotations

import itertools
import json
import time
from typing import Any
from uuid import UUID

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples
from icefloe.errors import CommitFailedError, UnsupportedFormatVersion, ValidationError
from icefloe.spec.metadata import TableMetadata, parse_table_metadata
from icefloe.spec.metadata_builder import MetadataBuilder, new_table_metadata
from icefloe.spec.partition import PartitionField, PartitionSpec
from icefloe.spec.schema import Schema
from icefloe.spec.snapshot import (
    Operation,
    PartitionStatisticsFile,
    Snapshot,
    SnapshotRef,
    SnapshotRefType,
    StatisticsFile,
    Summary,
)
from icefloe.spec.sort_order import NullOrder, SortDirection, SortField, SortOrder
from icefloe.spec.transforms import (
    BucketTransform,
    DayTransform,
    IdentityTransform,
    TruncateTransform,
    UnknownTransform,
)
from icefloe.spec.types import (
    LongType,
    NestedField,
    StringType,
    StructType,
    TimestampNanoType,
    TimestampType,
)
from icefloe.table.requirements import (
    AssertRefSnapshotId,
    parse_table_requirement,
    validate_requirements,
)
from icefloe.table.updates import (
    AddSnapshotUpdate,
    SetSnapshotRefUpdate,
    apply_updates,
    parse_table_update,
)

LOCATION = "s3://bucket/db/events"


def caller_schema() -> Schema:
    """A schema with the caller's own (meaningless) ids, as a create-table request has."""
    return Schema(
        NestedField(10, "id", LongType(), required=True),
        NestedField(20, "ts", TimestampType()),
        NestedField(30, "data", StringType()),
        NestedField(40, "loc", StructType(NestedField(41, "city", StringType()))),
        identifier_field_ids=[10],
    )


def caller_spec() -> PartitionSpec:
    return PartitionSpec(
        7,
        (
            PartitionField(20, 5, "ts_day", DayTransform()),
            PartitionField(10, 6, "id_bucket", BucketTransform(16)),
        ),
    )


def caller_order() -> SortOrder:
    return SortOrder(
        9, (SortField(41, IdentityTransform(), SortDirection.ASC, NullOrder.NULLS_FIRST),)
    )


def new_table(version: int = 2, props: dict[str, str] | None = None) -> TableMetadata:
    return new_table_metadata(
        caller_schema(), caller_spec(), caller_order(), LOCATION, props, format_version=version
    )


def snapshot(
    m: TableMetadata | MetadataBuilder,
    snapshot_id: int,
    *,
    parent: int | None = None,
    sequence_number: int | None = None,
    timestamp_ms: int | None = None,
    added_rows: int | None = None,
    first_row_id: int | None = None,
    operation: Operation | None = Operation.APPEND,
) -> Snapshot:
    version = m.format_version
    if sequence_number is None:
        assert isinstance(m, TableMetadata)
        sequence_number = m.next_sequence_number()
    lineage: dict[str, Any] = {}
    if version >= 3:
        assert isinstance(m, TableMetadata)
        lineage = {
            "first_row_id": m.next_row_id if first_row_id is None else first_row_id,
            "added_rows": 10 if added_rows is None else added_rows,
        }
    return Snapshot(
        snapshot_id=snapshot_id,
        parent_snapshot_id=parent,
        sequence_number=sequence_number,
        timestamp_ms=int(time.time() * 1000) if timestamp_ms is None else timestamp_ms,
        manifest_list=f"{LOCATION}/metadata/snap-{snapshot_id}.avro",
        summary=None if operation is None else Summary(operation, {"added-records": "10"}),
        **lineage,
    )


def append(
    m: TableMetadata, snapshot_id: int, branch: str = "main", timestamp_ms: int | None = None
) -> TableMetadata:
    parent = m.snapshot_by_ref(branch)
    snap = snapshot(
        m,
        snapshot_id,
        parent=None if parent is None else parent.snapshot_id,
        timestamp_ms=timestamp_ms,
    )
    return (
        MetadataBuilder(m)
        .add_snapshot(snap)
        .set_ref(branch, SnapshotRef.branch(snapshot_id))
        .build()
    )


# -- creating tables -------------------------------------------------------------------------------


@pytest.mark.parametrize("version", [1, 2, 3])
def test_new_table_assigns_fresh_ids(version: int) -> None:
    m = new_table(version, {"owner": "me"})
    schema = m.schema()
    assert [f.field_id for f in schema.all_fields()] == [1, 2, 3, 4, 5]
    assert schema.find_field_id("loc.city") == 5
    assert schema.identifier_field_ids == (1,)
    assert schema.schema_id == 0 and m.last_column_id == 5
    spec = m.spec()
    assert spec.spec_id == 0
    assert [(f.source_id, f.field_id, f.name) for f in spec.fields] == [
        (2, 1000, "ts_day"),
        (1, 1001, "id_bucket"),
    ]
    assert m.last_partition_id == 1001
    order = m.sort_order()
    assert order.order_id == 1 and order.fields[0].source_id == 5
    assert m.format_version == version
    assert m.properties == {"owner": "me"}
    assert m.location == LOCATION
    assert isinstance(m.table_uuid, UUID)
    assert m.current_snapshot() is None and m.snapshots == ()
    assert m.next_row_id == (0 if version >= 3 else None)
    assert parse_table_metadata(m.to_json_bytes()) == m


def test_new_table_format_version_property_is_reserved() -> None:
    m = new_table_metadata(
        caller_schema(), caller_spec(), caller_order(), LOCATION + "/", {"format-version": "3"}
    )
    assert m.format_version == 3
    assert "format-version" not in m.properties
    assert m.location == LOCATION
    with pytest.raises(ValidationError, match="'format-version' must be an integer"):
        new_table_metadata(
            caller_schema(), caller_spec(), caller_order(), LOCATION, {"format-version": "x"}
        )
    with pytest.raises(UnsupportedFormatVersion, match="format-version 4"):
        new_table(4)


def test_new_table_unsorted_and_unpartitioned() -> None:
    m = new_table_metadata(
        caller_schema(), PartitionSpec.unpartitioned(), SortOrder.unsorted(), LOCATION
    )
    assert m.spec().is_unpartitioned and m.last_partition_id == 999
    assert m.sort_order().is_unsorted and m.default_sort_order_id == 0


def test_new_table_keeps_the_given_uuid() -> None:
    uid = UUID("9c12d441-03fe-4693-9a96-a0705ddf69c1")
    m = new_table_metadata(caller_schema(), caller_spec(), caller_order(), LOCATION, table_uuid=uid)
    assert m.table_uuid == uid


def test_new_table_refuses_specs_on_missing_columns_and_v3_types_in_v2() -> None:
    bad_spec = PartitionSpec(0, (PartitionField(99, 1000, "nope", IdentityTransform()),))
    with pytest.raises(ValidationError, match="source column id 99"):
        new_table_metadata(caller_schema(), bad_spec, SortOrder.unsorted(), LOCATION)
    bad_transform = PartitionSpec(0, (PartitionField(30, 1000, "d", DayTransform()),))
    with pytest.raises(ValidationError, match="day"):
        new_table_metadata(caller_schema(), bad_transform, SortOrder.unsorted(), LOCATION)
    nanos = Schema(NestedField(1, "ts", TimestampNanoType()))
    with pytest.raises(ValidationError, match="needs format v3"):
        new_table_metadata(nanos, PartitionSpec.unpartitioned(), SortOrder.unsorted(), LOCATION)
    assert new_table_metadata(
        nanos, PartitionSpec.unpartitioned(), SortOrder.unsorted(), LOCATION, format_version=3
    )


# -- schemas, specs, sort orders ---------------------------------------------------------------------


def evolved_schema(m: TableMetadata) -> Schema:
    return Schema(*m.schema().fields, NestedField(6, "extra", LongType()), identifier_field_ids=[1])


def test_add_schema_and_set_current_with_last_added() -> None:
    m = new_table()
    new = MetadataBuilder(m).add_schema(evolved_schema(m)).set_current_schema(-1).build()
    assert new.current_schema_id == 1
    assert new.last_column_id == 6
    assert new.schema().find_field("extra") is not None
    assert new.schema_by_id(0) == m.schema()


def test_add_identical_schema_reuses_its_id() -> None:
    m = new_table()
    b = MetadataBuilder(m).add_schema(m.schema().with_id(42))
    assert b.changes == ()
    assert b.build() is m
    b.set_current_schema(-1)
    assert b.build() is m  # already current: nothing changed


def test_add_schema_never_lowers_last_column_id() -> None:
    m = new_table()
    with pytest.raises(ValidationError, match="below the table's 5"):
        MetadataBuilder(m).add_schema(m.schema(), last_column_id=3)
    with pytest.raises(ValidationError, match="below the schema's highest field id 6"):
        MetadataBuilder(m).add_schema(evolved_schema(m), last_column_id=5)
    grown = MetadataBuilder(m).add_schema(evolved_schema(m), last_column_id=10).build()
    assert grown.last_column_id == 10


def test_set_current_schema_errors() -> None:
    m = new_table()
    with pytest.raises(ValidationError, match="no schema was added"):
        MetadataBuilder(m).set_current_schema(-1)
    with pytest.raises(ValidationError, match="schema 3 does not exist"):
        MetadataBuilder(m).set_current_schema(3)


def test_remove_schemas_keeps_the_current_one() -> None:
    m = MetadataBuilder(new_table()).add_schema(evolved_schema(new_table())).build()
    assert len(m.schemas) == 2
    assert [s.schema_id for s in MetadataBuilder(m).remove_schemas([1]).build().schemas] == [0]
    with pytest.raises(ValidationError, match="cannot remove the current schema 0"):
        MetadataBuilder(m).remove_schemas([0])


def test_add_spec_new_and_reused() -> None:
    m = new_table()
    spec = PartitionSpec(0, (PartitionField(3, 1002, "data_trunc", TruncateTransform(4)),))
    new = MetadataBuilder(m).add_partition_spec(spec).set_default_spec(-1).build()
    assert new.default_spec_id == 1
    assert new.last_partition_id == 1002
    assert new.spec().fields == spec.fields
    # the same fields again (any ids) are the existing spec
    again = MetadataBuilder(new).add_partition_spec(
        PartitionSpec(5, (PartitionField(3, 1010, "data_trunc", TruncateTransform(4)),))
    )
    assert again.changes == ()
    assert again.set_default_spec(-1).build() is new


def test_add_spec_must_bind_to_the_current_schema() -> None:
    m = new_table()
    with pytest.raises(ValidationError, match=r"add-spec: .*source column id 42"):
        MetadataBuilder(m).add_partition_spec(
            PartitionSpec(0, (PartitionField(42, 1002, "x", IdentityTransform()),))
        )
    with pytest.raises(ValidationError, match="unknown transforms"):
        MetadataBuilder(m).add_partition_spec(
            PartitionSpec(0, (PartitionField(1, 1002, "z", UnknownTransform("zorder")),))
        )


def test_v1_specs_need_sequential_field_ids() -> None:
    m = new_table(1)
    with pytest.raises(ValidationError, match="v1 tables need partition field ids numbered"):
        MetadataBuilder(m).add_partition_spec(
            PartitionSpec(0, (PartitionField(3, 1002, "data", IdentityTransform()),))
        )
    ok = PartitionSpec(0, (PartitionField(3, 1000, "data", IdentityTransform()),))
    assert MetadataBuilder(m).add_partition_spec(ok).build().partition_specs[1].fields == ok.fields


def test_default_spec_and_removal() -> None:
    m = new_table()
    with pytest.raises(ValidationError, match="no spec was added"):
        MetadataBuilder(m).set_default_spec(-1)
    with pytest.raises(ValidationError, match="partition spec 4 does not exist"):
        MetadataBuilder(m).set_default_spec(4)
    with pytest.raises(ValidationError, match="cannot remove the default spec 0"):
        MetadataBuilder(m).remove_partition_specs([0])
    two = MetadataBuilder(m).add_partition_spec(PartitionSpec.unpartitioned()).build()
    assert [
        s.spec_id for s in MetadataBuilder(two).remove_partition_specs([1]).build().partition_specs
    ] == [0]


def test_sort_orders() -> None:
    m = new_table()
    order = SortOrder(
        1, (SortField(1, IdentityTransform(), SortDirection.DESC, NullOrder.NULLS_LAST),)
    )
    new = MetadataBuilder(m).add_sort_order(order).set_default_sort_order(-1).build()
    assert new.default_sort_order_id == 2
    assert new.sort_order().fields == order.fields
    # an identical order is reused, the unsorted order is always 0
    assert MetadataBuilder(new).add_sort_order(order).changes == ()
    unsorted = (
        MetadataBuilder(new).add_sort_order(SortOrder.unsorted()).set_default_sort_order(-1).build()
    )
    assert unsorted.default_sort_order_id == 0 and unsorted.sort_order().is_unsorted
    assert MetadataBuilder(new).set_default_sort_order(0).build().sort_order().is_unsorted
    with pytest.raises(ValidationError, match="sort order 8 does not exist"):
        MetadataBuilder(m).set_default_sort_order(8)
    with pytest.raises(ValidationError, match="no sort order was added"):
        MetadataBuilder(m).set_default_sort_order(-1)
    with pytest.raises(ValidationError, match="add-sort-order"):
        MetadataBuilder(m).add_sort_order(
            SortOrder(
                1, (SortField(77, IdentityTransform(), SortDirection.ASC, NullOrder.NULLS_FIRST),)
            )
        )


# -- snapshots and refs ------------------------------------------------------------------------------


def test_append_moves_main_and_logs_it() -> None:
    m = new_table()
    m1 = append(m, 1, timestamp_ms=m.last_updated_ms + 1000)
    snap = m1.current_snapshot()
    assert snap is not None and snap.snapshot_id == 1
    assert m1.last_sequence_number == 1
    assert m1.refs["main"] == SnapshotRef.branch(1)
    assert [(e.snapshot_id, e.timestamp_ms) for e in m1.snapshot_log] == [(1, snap.timestamp_ms)]
    # the table changed when the snapshot was made
    assert m1.last_updated_ms == snap.timestamp_ms
    m2 = append(m1, 2, timestamp_ms=m.last_updated_ms + 2000)
    assert m2.last_sequence_number == 2
    assert [s.snapshot_id for s in m2.ancestors_of(2)] == [2, 1]
    assert [e.snapshot_id for e in m2.snapshot_log] == [1, 2]
    assert m2.snapshot_as_of(m2.snapshot_log[0].timestamp_ms).snapshot_id == 1


def test_add_snapshot_rules_v2() -> None:
    m = append(new_table(), 1)
    with pytest.raises(ValidationError, match="a snapshot with this id already exists"):
        MetadataBuilder(m).add_snapshot(snapshot(m, 1, sequence_number=2))
    with pytest.raises(
        ValidationError, match="must be greater than the table's last-sequence-number 1"
    ):
        MetadataBuilder(m).add_snapshot(snapshot(m, 2, sequence_number=1))
    with pytest.raises(ValidationError, match="need a summary with an 'operation'"):
        MetadataBuilder(m).add_snapshot(snapshot(m, 2, operation=None))
    v1_style = Snapshot(snapshot_id=2, sequence_number=2, timestamp_ms=1, manifests=("s3://m",))
    with pytest.raises(ValidationError, match="need a 'manifest-list'"):
        MetadataBuilder(m).add_snapshot(v1_style)


def test_add_snapshot_rules_v1() -> None:
    m = new_table(1)
    with pytest.raises(ValidationError, match="v1 tables have no sequence numbers"):
        MetadataBuilder(m).add_snapshot(snapshot(m, 1, sequence_number=3))
    v1 = Snapshot(snapshot_id=1, timestamp_ms=int(time.time() * 1000), manifests=("s3://m",))
    new = MetadataBuilder(m).add_snapshot(v1).set_ref("main", SnapshotRef.branch(1)).build()
    assert new.last_sequence_number == 0
    out = new.to_json()
    assert "sequence-number" not in out["snapshots"][0] and "last-sequence-number" not in out


def test_v3_row_lineage() -> None:
    m = new_table(3)
    m1 = MetadataBuilder(m).add_snapshot(snapshot(m, 1, added_rows=100)).build()
    assert m1.next_row_id == 100
    assert m1.current_snapshot_id is None  # added, not yet on a branch
    # the next snapshot, even on another branch, starts where the table's row ids are
    m2 = (
        MetadataBuilder(m1)
        .add_snapshot(snapshot(m1, 2, added_rows=5))
        .set_ref("dev", SnapshotRef.branch(2))
        .build()
    )
    assert m2.next_row_id == 105 and m2.snapshot_by_ref("dev").first_row_id == 100  # type: ignore[union-attr]
    with pytest.raises(
        ValidationError, match="first-row-id 0 must equal the table's next-row-id 105"
    ):
        MetadataBuilder(m2).add_snapshot(snapshot(m2, 3, first_row_id=0))
    no_lineage = Snapshot(
        snapshot_id=3, sequence_number=3, timestamp_ms=1, manifest_list="s3://ml",
        summary=Summary(Operation.APPEND),
    )  # fmt: skip
    with pytest.raises(ValidationError, match="need 'first-row-id' and 'added-rows'"):
        MetadataBuilder(m2).add_snapshot(no_lineage)


def test_set_ref_rules() -> None:
    m = append(new_table(), 1)
    with pytest.raises(ValidationError, match="snapshot 99 does not exist"):
        MetadataBuilder(m).set_ref("b", SnapshotRef.branch(99))
    with pytest.raises(ValidationError, match="'main' must be a branch"):
        MetadataBuilder(m).set_ref("main", SnapshotRef.tag(1))
    assert MetadataBuilder(m).set_ref("main", SnapshotRef.branch(1)).build() is m
    tagged = MetadataBuilder(m).set_ref("v1.0", SnapshotRef.tag(1, max_ref_age_ms=5)).build()
    assert tagged.refs["v1.0"].max_ref_age_ms == 5
    assert tagged.current_snapshot_id == 1 and len(tagged.snapshot_log) == 1


def test_rollback_logs_the_move_at_build_time() -> None:
    m = append(append(new_table(), 1), 2)
    rolled = MetadataBuilder(m).set_ref("main", SnapshotRef.branch(1)).build()
    assert rolled.current_snapshot_id == 1
    last = rolled.snapshot_log[-1]
    assert last.snapshot_id == 1 and last.timestamp_ms == rolled.last_updated_ms
    assert [e.snapshot_id for e in rolled.snapshot_log] == [1, 2, 1]


def test_remove_ref() -> None:
    m = append(new_table(), 1)
    m = MetadataBuilder(m).set_ref("t", SnapshotRef.tag(1)).build()
    no_tag = MetadataBuilder(m).remove_ref("t").build()
    assert "t" not in no_tag.refs and no_tag.current_snapshot_id == 1
    no_main = MetadataBuilder(m).remove_ref("main").build()
    assert no_main.current_snapshot_id is None and "main" not in no_main.refs
    assert no_main.to_json()["current-snapshot-id"] == -1
    assert MetadataBuilder(m).remove_ref("absent").build() is m


def test_remove_snapshots_cleans_refs_statistics_and_log() -> None:
    m = append(append(append(new_table(), 1), 2), 3)
    stats = StatisticsFile(
        snapshot_id=1, statistics_path="s3://s.puffin", file_size_in_bytes=1,
        file_footer_size_in_bytes=1, blob_metadata=(),
    )  # fmt: skip
    pstats = PartitionStatisticsFile(snapshot_id=1, statistics_path="s3://p", file_size_in_bytes=1)
    m = (
        MetadataBuilder(m)
        .set_ref("old", SnapshotRef.tag(1))
        .set_statistics(stats)
        .set_partition_statistics(pstats)
        .build()
    )
    expired = MetadataBuilder(m).remove_snapshots([1, 404]).build()
    assert [s.snapshot_id for s in expired.snapshots] == [2, 3]
    assert (
        "old" not in expired.refs
        and expired.statistics == ()
        and expired.partition_statistics == ()
    )
    assert [e.snapshot_id for e in expired.snapshot_log] == [2, 3]
    assert [s.snapshot_id for s in expired.ancestors_of(3)] == [3, 2]
    # expiring the current snapshot drops main with it
    gone = MetadataBuilder(expired).remove_snapshots([3]).build()
    assert gone.current_snapshot_id is None and gone.snapshot_log == ()
    assert MetadataBuilder(m).remove_snapshots([404]).build() is m


def test_snapshot_log_keeps_only_history_after_the_last_expired_entry() -> None:
    m = append(append(new_table(), 1), 2)
    m = MetadataBuilder(m).set_ref("main", SnapshotRef.branch(1)).build()  # log: 1, 2, 1
    m = append(m, 3)  # log: 1, 2, 1, 3
    expired = MetadataBuilder(m).remove_snapshots([2]).build()
    assert [e.snapshot_id for e in expired.snapshot_log] == [1, 3]


# -- properties, location, statistics, keys ----------------------------------------------------------


def test_properties_and_location() -> None:
    m = new_table(props={"a": "1", "b": "2"})
    new = (
        MetadataBuilder(m)
        .set_properties({"c": "3", "a": "9"})
        .remove_properties(["b", "absent"])
        .set_location("s3://other/place/")
        .build()
    )
    assert new.properties == {"a": "9", "c": "3"}
    assert new.location == "s3://other/place"
    with pytest.raises(ValidationError, match="property values must be strings"):
        MetadataBuilder(m).set_properties({"n": 1})  # type: ignore[dict-item]
    with pytest.raises(ValidationError, match="non-empty"):
        MetadataBuilder(m).set_location("")


def test_statistics_replace_and_remove() -> None:
    m = append(new_table(), 1)
    first = StatisticsFile(
        snapshot_id=1, statistics_path="s3://a.puffin", file_size_in_bytes=1,
        file_footer_size_in_bytes=1, blob_metadata=(),
    )  # fmt: skip
    second = first.model_copy(update={"statistics_path": "s3://b.puffin"})
    m1 = MetadataBuilder(m).set_statistics(first).set_statistics(second).build()
    assert [s.statistics_path for s in m1.statistics] == ["s3://b.puffin"]
    assert MetadataBuilder(m1).remove_statistics(1).build().statistics == ()
    assert MetadataBuilder(m1).remove_statistics(2).build() is m1
    p = PartitionStatisticsFile(snapshot_id=1, statistics_path="s3://p", file_size_in_bytes=3)
    m2 = MetadataBuilder(m).set_partition_statistics(p).build()
    assert m2.partition_statistics == (p,)
    assert MetadataBuilder(m2).remove_partition_statistics(1).build().partition_statistics == ()


def test_assign_uuid_only_once() -> None:
    m = new_table()
    assert m.table_uuid is not None
    assert MetadataBuilder(m).assign_uuid(m.table_uuid).build() is m
    with pytest.raises(ValidationError, match="never reassigned"):
        MetadataBuilder(m).assign_uuid("9c12d441-03fe-4693-9a96-a0705ddf69c1")
    with pytest.raises(ValidationError, match="is not a UUID"):
        MetadataBuilder(m).assign_uuid("nope")


# -- build, metadata log --------------------------------------------------------------------------------


def test_build_without_changes_returns_the_base() -> None:
    m = new_table()
    assert MetadataBuilder(m).build("s3://x/v1.metadata.json") is m


def test_build_appends_previous_file_to_the_metadata_log() -> None:
    m = new_table()
    new = (
        MetadataBuilder(m).set_properties({"k": "v"}).build(f"{LOCATION}/metadata/v1.metadata.json")
    )
    assert [(e.metadata_file, e.timestamp_ms) for e in new.metadata_log] == [
        (f"{LOCATION}/metadata/v1.metadata.json", m.last_updated_ms)
    ]
    assert new.last_updated_ms >= m.last_updated_ms


def test_metadata_log_is_trimmed_to_previous_versions_max() -> None:
    m = new_table(props={"write.metadata.previous-versions-max": "2"})
    for i in range(5):
        m = MetadataBuilder(m).set_properties({"i": str(i)}).build(f"{LOCATION}/metadata/v{i}.json")
    assert [e.metadata_file for e in m.metadata_log] == [
        f"{LOCATION}/metadata/v3.json",
        f"{LOCATION}/metadata/v4.json",
    ]
    bad = MetadataBuilder(m).set_properties({"write.metadata.previous-versions-max": "many"})
    with pytest.raises(ValidationError, match="previous-versions-max' must be an integer"):
        bad.build("x")


# -- format upgrades ------------------------------------------------------------------------------------


def test_upgrade_v1_to_v2_to_v3() -> None:
    v1 = append(new_table(1), 1)
    v1_json = v1.to_json()
    assert "schema" in v1_json and "last-sequence-number" not in v1_json

    v2 = MetadataBuilder(v1).upgrade_format_version(2).build()
    v2_json = v2.to_json()
    assert v2_json["format-version"] == 2
    assert "schema" not in v2_json and "partition-spec" not in v2_json
    assert v2_json["last-sequence-number"] == 0
    assert v2.snapshots == v1.snapshots and v2.current_snapshot_id == 1
    v2 = append(v2, 2)
    assert v2.current_snapshot().sequence_number == 1  # type: ignore[union-attr]

    v3 = MetadataBuilder(v2).upgrade_format_version(3).build()
    assert v3.next_row_id == 0
    assert all(s.first_row_id is None for s in v3.snapshots)  # pre-upgrade: no row ids
    v3 = append(v3, 3)
    assert v3.next_row_id == 10 and v3.current_snapshot().first_row_id == 0  # type: ignore[union-attr]
    assert parse_table_metadata(v3.to_json_bytes()) == v3
    assert v3.to_json()["next-row-id"] == 10


def test_upgrade_rules() -> None:
    m = new_table(2)
    assert MetadataBuilder(m).upgrade_format_version(2).build() is m
    with pytest.raises(ValidationError, match="cannot downgrade table format-version from 2 to 1"):
        MetadataBuilder(m).upgrade_format_version(1)
    with pytest.raises(UnsupportedFormatVersion, match="format-version 4"):
        MetadataBuilder(m).upgrade_format_version(4)


def test_v3_types_need_an_upgrade_first() -> None:
    m = new_table(2)
    nanos = Schema(*m.schema().fields, NestedField(6, "ts_ns", TimestampNanoType()))
    with pytest.raises(ValidationError, match="needs format v3"):
        MetadataBuilder(m).add_schema(nanos).set_current_schema(-1).build()
    upgraded = MetadataBuilder(m).upgrade_format_version(3).add_schema(nanos).build()
    assert upgraded.schema_by_id(1) is not None


# -- REST updates and requirements ---------------------------------------------------------------------


def test_rest_updates_json() -> None:
    m = new_table()
    snap = snapshot(m, 11)
    updates: list[dict[str, Any]] = [
        {"action": "add-schema", "schema": evolved_schema(m).to_json(), "last-column-id": 6},
        {"action": "set-current-schema", "schema-id": -1},
        {"action": "add-spec", "spec": {"fields": [
            {"name": "id_bucket", "transform": "bucket[16]", "source-id": 1},
            {"name": "extra", "transform": "identity", "source-id": 6},
        ]}},
        {"action": "set-default-spec", "spec-id": -1},
        {"action": "add-sort-order", "sort-order": {"order-id": 5, "fields": [
            {"transform": "identity", "source-id": 6, "direction": "asc", "null-order": "nulls-first"}
        ]}},
        {"action": "set-default-sort-order", "sort-order-id": -1},
        {"action": "add-snapshot", "snapshot": snap.to_json()},
        {"action": "set-snapshot-ref", "ref-name": "main", "type": "branch", "snapshot-id": 11},
        {"action": "set-properties", "updates": {"k": "v"}},
        {"action": "remove-properties", "removals": ["absent"]},
        {"action": "set-location", "location": "s3://moved"},
        {"action": "set-statistics", "snapshot-id": 11, "statistics": {
            "snapshot-id": 11, "statistics-path": "s3://s.puffin", "file-size-in-bytes": 4,
            "file-footer-size-in-bytes": 2, "blob-metadata": []}},
        {"action": "set-partition-statistics", "partition-statistics": {
            "snapshot-id": 11, "statistics-path": "s3://p.parquet", "file-size-in-bytes": 4}},
        {"action": "remove-statistics", "snapshot-id": 999},
    ]  # fmt: skip
    new = apply_updates(m, updates, f"{LOCATION}/metadata/v1.metadata.json")
    assert new.current_schema_id == 1 and new.last_column_id == 6
    # id_bucket keeps the id it had in spec 0, the new field gets the next id
    assert [(f.name, f.field_id) for f in new.spec().fields] == [
        ("id_bucket", 1001),
        ("extra", 1002),
    ]
    assert new.last_partition_id == 1002 and new.default_spec_id == 1
    assert new.default_sort_order_id == 2
    assert new.current_snapshot_id == 11
    assert new.properties["k"] == "v" and new.location == "s3://moved"
    assert len(new.statistics) == 1 and len(new.partition_statistics) == 1
    assert len(new.metadata_log) == 1
    # typed updates serialize back to the same REST JSON
    for u in updates:
        assert parse_table_update(parse_table_update(u).to_json()) == parse_table_update(u)


def test_rest_create_transaction_from_nothing() -> None:
    schema = Schema(NestedField(1, "id", LongType(), required=True))
    updates: list[dict[str, Any]] = [
        {"action": "assign-uuid", "uuid": "9c12d441-03fe-4693-9a96-a0705ddf69c1"},
        {"action": "upgrade-format-version", "format-version": 1},
        {"action": "add-schema", "schema": schema.to_json()},
        {"action": "set-current-schema", "schema-id": -1},
        {"action": "add-spec", "spec": {"spec-id": 0, "fields": [
            {"name": "id", "transform": "identity", "source-id": 1}]}},
        {"action": "set-default-spec", "spec-id": -1},
        {"action": "add-sort-order", "sort-order": {"order-id": 0, "fields": []}},
        {"action": "set-default-sort-order", "sort-order-id": -1},
        {"action": "set-location", "location": LOCATION},
        {"action": "set-properties", "updates": {"owner": "etl"}},
    ]  # fmt: skip
    validate_requirements(None, [{"type": "assert-create"}])
    m = apply_updates(None, updates)
    assert m.format_version == 1
    assert str(m.table_uuid) == "9c12d441-03fe-4693-9a96-a0705ddf69c1"
    assert m.last_column_id == 1 and m.spec().fields[0].field_id == 1000
    assert m.sort_order().is_unsorted and m.location == LOCATION
    assert m.properties == {"owner": "etl"}
    minimal = apply_updates(None, updates[2:4] + updates[8:9])
    assert minimal.format_version == 2 and minimal.spec().is_unpartitioned
    with pytest.raises(ValidationError, match="a new table needs a location"):
        apply_updates(None, updates[2:4])
    with pytest.raises(ValidationError, match="a new table needs a schema"):
        apply_updates(None, updates[8:])


def test_rest_update_errors_name_the_action() -> None:
    with pytest.raises(ValidationError, match="'merge-everything'"):
        parse_table_update({"action": "merge-everything"})
    with pytest.raises(ValidationError, match="missing required field 'snapshot'"):
        parse_table_update({"action": "add-snapshot"})
    with pytest.raises(ValidationError, match="a tag cannot set 'min-snapshots-to-keep'"):
        parse_table_update(
            {"action": "set-snapshot-ref", "ref-name": "t", "type": "tag", "snapshot-id": 1,
             "min-snapshots-to-keep": 2}
        )  # fmt: skip
    with pytest.raises(ValidationError, match="differs from the statistics file's snapshot-id"):
        parse_table_update(
            {"action": "set-statistics", "snapshot-id": 2, "statistics": {
                "snapshot-id": 1, "statistics-path": "s3://s", "file-size-in-bytes": 1,
                "file-footer-size-in-bytes": 1, "blob-metadata": []}}
        )  # fmt: skip
    with pytest.raises(ValidationError, match="add-spec"):
        parse_table_update({"action": "add-spec", "spec": {"fields": "nope"}})
    m = new_table()
    with pytest.raises(ValidationError, match="snapshot 5 does not exist"):
        apply_updates(m, [{"action": "set-snapshot-ref", "ref-name": "main", "type": "branch",
                           "snapshot-id": 5}])  # fmt: skip


def test_remove_and_key_updates_json() -> None:
    m = append(append(new_table(3), 1), 2)
    m = apply_updates(
        m,
        [
            {"action": "add-encryption-key", "encryption-key": {
                "key-id": "k1", "encrypted-key-metadata": "AAAA"}},
            {"action": "set-snapshot-ref", "ref-name": "t", "type": "tag", "snapshot-id": 1},
        ],
    )  # fmt: skip
    assert m.to_json()["encryption-keys"] == [{"key-id": "k1", "encrypted-key-metadata": "AAAA"}]
    m = apply_updates(
        m,
        [
            {"action": "remove-snapshot-ref", "ref-name": "t"},
            {"action": "remove-snapshots", "snapshot-ids": [1]},
            {"action": "remove-encryption-key", "key-id": "k1"},
            {"action": "upgrade-format-version", "format-version": 3},
        ],
    )
    assert [s.snapshot_id for s in m.snapshots] == [2] and m.encryption_keys == ()


REQUIREMENTS_OK: list[dict[str, Any]] = [
    {"type": "assert-ref-snapshot-id", "ref": "main", "snapshot-id": 1},
    {"type": "assert-ref-snapshot-id", "ref": "new-branch", "snapshot-id": None},
    {"type": "assert-last-assigned-field-id", "last-assigned-field-id": 5},
    {"type": "assert-current-schema-id", "current-schema-id": 0},
    {"type": "assert-last-assigned-partition-id", "last-assigned-partition-id": 1001},
    {"type": "assert-default-spec-id", "default-spec-id": 0},
    {"type": "assert-default-sort-order-id", "default-sort-order-id": 1},
]


def test_requirements_that_hold() -> None:
    m = append(new_table(), 1)
    validate_requirements(m, REQUIREMENTS_OK)
    validate_requirements(m, [{"type": "assert-table-uuid", "uuid": str(m.table_uuid)}])


@pytest.mark.parametrize(
    ("requirement", "message"),
    [
        ({"type": "assert-create"}, "assert-create failed: table .* already exists"),
        ({"type": "assert-table-uuid", "uuid": "9c12d441-03fe-4693-9a96-a0705ddf69c1"},
         "assert-table-uuid failed"),
        ({"type": "assert-ref-snapshot-id", "ref": "main", "snapshot-id": 7},
         "ref 'main' is at snapshot 1, expected 7"),
        ({"type": "assert-ref-snapshot-id", "ref": "main", "snapshot-id": None},
         "ref 'main' was created concurrently"),
        ({"type": "assert-ref-snapshot-id", "ref": "dev", "snapshot-id": 1},
         "ref 'dev' is missing"),
        ({"type": "assert-last-assigned-field-id", "last-assigned-field-id": 4},
         "assert-last-assigned-field-id failed: last-column-id is 5, expected 4"),
        ({"type": "assert-current-schema-id", "current-schema-id": 3},
         "assert-current-schema-id failed"),
        ({"type": "assert-last-assigned-partition-id", "last-assigned-partition-id": 1000},
         "assert-last-assigned-partition-id failed"),
        ({"type": "assert-default-spec-id", "default-spec-id": 2}, "assert-default-spec-id failed"),
        ({"type": "assert-default-sort-order-id", "default-sort-order-id": 0},
         "assert-default-sort-order-id failed"),
    ],
)  # fmt: skip
def test_requirements_that_fail(requirement: dict[str, Any], message: str) -> None:
    m = append(new_table(), 1)
    with pytest.raises(CommitFailedError, match=message):
        validate_requirements(m, [requirement])


def test_requirements_on_a_missing_table() -> None:
    for r in REQUIREMENTS_OK:
        with pytest.raises(CommitFailedError, match="the table does not exist"):
            parse_table_requirement(r).validate(None)


def test_requirement_json_keeps_meaningful_null() -> None:
    r = parse_table_requirement({"type": "assert-ref-snapshot-id", "ref": "b", "snapshot-id": None})
    assert isinstance(r, AssertRefSnapshotId)
    assert r.to_json() == {"type": "assert-ref-snapshot-id", "ref": "b", "snapshot-id": None}
    with pytest.raises(ValidationError, match="missing required field 'snapshot-id'"):
        parse_table_requirement({"type": "assert-ref-snapshot-id", "ref": "b"})
    with pytest.raises(ValidationError, match="'assert-nothing'"):
        parse_table_requirement({"type": "assert-nothing"})


def test_typed_updates_can_be_built_in_code() -> None:
    m = new_table()
    snap = snapshot(m, 3)
    new = apply_updates(
        m,
        [
            AddSnapshotUpdate(snapshot=snap),
            SetSnapshotRefUpdate(ref_name="main", ref_type=SnapshotRefType.BRANCH, snapshot_id=3),
        ],
    )
    assert new.current_snapshot() == snap


# -- properties of many commits ---------------------------------------------------------------------


@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    version=st.sampled_from([1, 2, 3]),
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("append"), st.sampled_from(["main", "dev"])),
            st.tuples(st.just("expire-oldest"), st.just("")),
            st.tuples(st.just("rollback"), st.just("")),
        ),
        min_size=1,
        max_size=12,
    ),
)
def test_commit_sequences_keep_invariants(version: int, ops: list[tuple[str, str]]) -> None:
    m = new_table(version)
    next_id = 1
    for op, branch in ops:
        if op == "append":
            if version == 1:
                parent = m.snapshot_by_ref(branch)
                snap = Snapshot(
                    snapshot_id=next_id,
                    parent_snapshot_id=None if parent is None else parent.snapshot_id,
                    timestamp_ms=int(time.time() * 1000),
                    manifest_list=f"s3://ml-{next_id}",
                    summary=Summary(Operation.APPEND),
                )
                m = (
                    MetadataBuilder(m)
                    .add_snapshot(snap)
                    .set_ref(branch, SnapshotRef.branch(next_id))
                    .build()
                )
            else:
                m = append(m, next_id, branch)
            next_id += 1
        elif op == "expire-oldest" and m.snapshots:
            m = MetadataBuilder(m).remove_snapshots([m.snapshots[0].snapshot_id]).build()
        elif op == "rollback" and m.current_snapshot() is not None:
            current = m.current_snapshot()
            assert current is not None
            if current.parent_snapshot_id is not None and m.snapshot_by_id(
                current.parent_snapshot_id
            ):
                m = (
                    MetadataBuilder(m)
                    .set_ref("main", SnapshotRef.branch(current.parent_snapshot_id))
                    .build()
                )
        # invariants after every commit
        again = parse_table_metadata(m.to_json_bytes())
        assert again == m and again.to_json() == m.to_json()
        live = {s.snapshot_id for s in m.snapshots}
        assert all(e.snapshot_id in live for e in m.snapshot_log)
        assert all(r.snapshot_id in live for r in m.refs.values())
        assert (m.current_snapshot_id is None) == ("main" not in m.refs)
        if version >= 2:
            seqs = [s.sequence_number for s in m.snapshots]
            assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
            assert all(s <= m.last_sequence_number for s in seqs)
        if version >= 3:
            ranges = sorted((s.first_row_id or 0, s.added_rows or 0) for s in m.snapshots)
            for (a, n), (b, _) in itertools.pairwise(ranges):
                assert a + n <= b  # row id ranges never overlap
            assert m.next_row_id == 10 * (next_id - 1)


# -- PyIceberg reads what the builder makes --------------------------------------------------------------


@pytest.mark.interop
@pytest.mark.parametrize("version", [1, 2, 3])
def test_pyiceberg_reads_built_metadata(version: int) -> None:
    from pyiceberg.table.metadata import TableMetadataUtil

    m = new_table(version)
    m = append(m, 1) if version >= 2 else MetadataBuilder(m).add_snapshot(
        Snapshot(snapshot_id=1, timestamp_ms=int(time.time() * 1000), manifest_list="s3://ml",
                 summary=Summary(Operation.APPEND))
    ).set_ref("main", SnapshotRef.branch(1)).build()  # fmt: skip
    m = MetadataBuilder(m).set_ref("audit", SnapshotRef.tag(1)).build("s3://prev.metadata.json")
    theirs = TableMetadataUtil.parse_raw(m.to_json_bytes().decode())
    assert theirs.format_version == version
    assert theirs.current_snapshot_id == 1
    assert set(theirs.refs) == {"main", "audit"}
    assert [f.field_id for f in theirs.spec().fields] == [1000, 1001]
    assert theirs.sort_order().order_id == 1
    assert theirs.schema().identifier_field_ids == [1]
    assert [e.metadata_file for e in theirs.metadata_log] == ["s3://prev.metadata.json"]
    if version >= 3:
        assert theirs.next_row_id == 10


@pytest.mark.interop
def test_icefloe_applies_pyiceberg_serialized_updates() -> None:
    from pyiceberg.table.refs import SnapshotRefType as PyRefType
    from pyiceberg.table.snapshots import Operation as PyOperation
    from pyiceberg.table.snapshots import Snapshot as PySnapshot
    from pyiceberg.table.snapshots import Summary as PySummary
    from pyiceberg.table.update import AddSnapshotUpdate as PyAddSnapshot
    from pyiceberg.table.update import AssertRefSnapshotId as PyAssertRef
    from pyiceberg.table.update import SetPropertiesUpdate as PySetProperties
    from pyiceberg.table.update import SetSnapshotRefUpdate as PySetRef

    m = new_table()
    py_snap = PySnapshot(
        snapshot_id=5,
        sequence_number=1,
        timestamp_ms=int(time.time() * 1000),
        manifest_list="s3://ml-5.avro",
        summary=PySummary(PyOperation.APPEND, **{"added-data-files": "1"}),
        schema_id=0,
    )
    updates = [
        json.loads(u.model_dump_json())
        for u in (
            PyAddSnapshot(snapshot=py_snap),
            PySetRef(ref_name="main", type=PyRefType.BRANCH, snapshot_id=5),
            PySetProperties(updates={"a": "b"}),
        )
    ]
    requirement = json.loads(PyAssertRef(ref="main", snapshot_id=None).model_dump_json())
    validate_requirements(m, [requirement])
    new = apply_updates(m, updates)
    snap = new.current_snapshot()
    assert snap is not None and snap.summary is not None
    assert snap.snapshot_id == 5 and snap.summary["added-data-files"] == "1"
    assert new.properties == {"a": "b"}
