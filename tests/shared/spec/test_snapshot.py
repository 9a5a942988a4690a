"""Snapshot models: JSON form, per-model validation, summaries and their running totals."""

from __future__ import annotations

from typing import Any

import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples
from icefloe.errors import ValidationError
from icefloe.spec.model import hyphenate
from icefloe.spec.snapshot import (
    MAIN_BRANCH,
    BlobMetadata,
    MetadataLogEntry,
    Operation,
    PartitionStatisticsFile,
    Snapshot,
    SnapshotLogEntry,
    SnapshotRef,
    SnapshotRefType,
    StatisticsFile,
    Summary,
    generate_snapshot_id,
    update_totals,
)

V2_SNAPSHOT: dict[str, Any] = {
    "snapshot-id": 3055729675574597004,
    "parent-snapshot-id": 3051729675574597004,
    "sequence-number": 1,
    "timestamp-ms": 1555100955770,
    "manifest-list": "s3://a/b/2.avro",
    "summary": {"operation": "append", "added-data-files": "4", "engine-name": "spark"},
    "schema-id": 1,
}


def test_snapshot_reads_spec_json_into_python_fields() -> None:
    s = Snapshot.from_json(V2_SNAPSHOT)
    assert s.snapshot_id == 3055729675574597004
    assert s.parent_snapshot_id == 3051729675574597004
    assert s.sequence_number == 1
    assert s.timestamp_ms == 1555100955770
    assert s.manifest_list == "s3://a/b/2.avro"
    assert s.schema_id == 1
    assert s.operation is Operation.APPEND
    assert s.summary is not None and s.summary["engine-name"] == "spark"


@pytest.mark.parametrize(
    "obj",
    [
        V2_SNAPSHOT,
        # v1: a list of manifests instead of a manifest list, no summary, no sequence number
        {"snapshot-id": 1, "timestamp-ms": 10, "manifests": ["s3://m/1.avro", "s3://m/2.avro"]},
        # v3: row lineage and an encryption key id
        {
            "snapshot-id": 7,
            "sequence-number": 3,
            "timestamp-ms": 99,
            "manifest-list": "s3://ml.avro",
            "summary": {"operation": "overwrite"},
            "first-row-id": 1000,
            "added-rows": 375,
            "key-id": "k1",
        },
    ],
)
def test_snapshot_json_round_trip(obj: dict[str, Any]) -> None:
    s = Snapshot.from_json(obj)
    out = s.to_json()
    assert Snapshot.from_json(out) == s
    expected = {"sequence-number": 0, **obj}  # sequence-number defaults to 0 (Appendix E)
    assert out == expected


def test_snapshot_is_immutable() -> None:
    s = Snapshot.from_json(V2_SNAPSHOT)
    with pytest.raises(pydantic.ValidationError, match="frozen"):
        s.snapshot_id = 5


def test_equal_snapshots_hash_alike() -> None:
    a = Snapshot.from_json(V2_SNAPSHOT)
    b = Snapshot.from_json(a.to_json())
    assert a == b and hash(a) == hash(b)
    assert len({a, b}) == 1


def test_snapshot_constructs_with_python_names() -> None:
    s = Snapshot(
        snapshot_id=5,
        timestamp_ms=6,
        manifest_list="s3://x",
        summary=Summary(Operation.DELETE, {"deleted-records": "3"}),
    )
    assert s.to_json()["summary"] == {"operation": "delete", "deleted-records": "3"}


@pytest.mark.parametrize("missing", ["snapshot-id", "timestamp-ms", "manifest-list"])
def test_snapshot_missing_required_field_is_named(missing: str) -> None:
    obj = {k: v for k, v in V2_SNAPSHOT.items() if k != missing}
    with pytest.raises(ValidationError, match=f"missing required field '{missing}'"):
        Snapshot.from_json(obj)


@pytest.mark.parametrize(
    ("field", "value"),
    [("snapshot-id", "3055"), ("timestamp-ms", True), ("manifest-list", 5), ("schema-id", 1.0)],
)
def test_snapshot_rejects_wrongly_typed_json(field: str, value: Any) -> None:
    with pytest.raises(ValidationError, match=field):
        Snapshot.from_json({**V2_SNAPSHOT, field: value})


def test_snapshot_cannot_have_both_manifest_list_and_manifests() -> None:
    with pytest.raises(ValidationError, match="'manifests' must be omitted"):
        Snapshot.from_json({**V2_SNAPSHOT, "manifests": ["s3://m.avro"]})


@pytest.mark.parametrize(("field", "value"), [("first-row-id", -1), ("added-rows", -5)])
def test_snapshot_rejects_negative_row_lineage(field: str, value: int) -> None:
    with pytest.raises(ValidationError, match=field):
        Snapshot.from_json({**V2_SNAPSHOT, "first-row-id": 0, "added-rows": 0, field: value})


def test_summary_reads_as_the_json_string_map() -> None:
    summary = Summary.from_json({"operation": "replace", "added-data-files": "2", "x": "y"})
    assert summary.operation is Operation.REPLACE
    assert summary["operation"] == "replace"
    assert dict(summary) == {"operation": "replace", "added-data-files": "2", "x": "y"}
    assert len(summary) == 3
    assert summary == {"operation": "replace", "added-data-files": "2", "x": "y"}
    assert summary.properties == {"added-data-files": "2", "x": "y"}
    assert summary.get_int(Summary.ADDED_DATA_FILES) == 2
    assert summary.get_int("x") is None
    assert summary.get_int("absent") is None
    assert summary.get("absent") is None


def test_summary_without_operation_is_a_v1_summary() -> None:
    summary = Summary.from_json({"added-records": "1"})
    assert summary.operation is None
    assert "operation" not in summary
    assert summary.to_json() == {"added-records": "1"}


def test_summary_refuses_unknown_operation_and_non_string_values() -> None:
    with pytest.raises(ValidationError, match="unknown operation 'merge'"):
        Summary.from_json({"operation": "merge"})
    with pytest.raises(ValidationError, match="must be strings: 'added-records'"):
        Summary.from_json({"operation": "append", "added-records": 5})
    with pytest.raises(ValidationError, match="JSON object"):
        Summary.from_json(["append"])


def test_summary_constants_are_the_spec_names() -> None:
    assert Summary.TOTAL_RECORDS == "total-records"
    assert Summary.ADDED_DATA_FILES == "added-data-files"
    assert Summary.REMOVED_EQUALITY_DELETE_FILES == "removed-equality-delete-files"
    assert str(Operation.OVERWRITE) == "overwrite"


def test_update_totals_without_a_previous_snapshot_starts_from_zero() -> None:
    added = {
        "operation": "append",
        "added-data-files": "2",
        "added-records": "100",
        "added-files-size": "2048",
    }
    out = update_totals(None, added)
    assert out == {
        **added,
        "total-records": "100",
        "total-files-size": "2048",
        "total-data-files": "2",
        "total-delete-files": "0",
        "total-position-deletes": "0",
        "total-equality-deletes": "0",
    }


def test_update_totals_adds_and_removes_from_the_previous_totals() -> None:
    previous = {
        "operation": "append",
        "total-records": "100",
        "total-data-files": "4",
        "total-files-size": "4000",
        "total-delete-files": "1",
        "total-position-deletes": "7",
        "total-equality-deletes": "0",
    }
    added = {
        "operation": "overwrite",
        "added-records": "10",
        "deleted-records": "30",
        "added-data-files": "1",
        "deleted-data-files": "2",
        "removed-files-size": "1500",
        "added-delete-files": "2",
        "removed-delete-files": "1",
        "removed-position-deletes": "7",
        "added-equality-deletes": "3",
    }
    out = update_totals(previous, added)
    assert out["operation"] == "overwrite"
    assert out["total-records"] == "80"
    assert out["total-data-files"] == "3"
    assert out["total-files-size"] == "2500"
    assert out["total-delete-files"] == "2"
    assert out["total-position-deletes"] == "0"
    assert out["total-equality-deletes"] == "3"


def test_update_totals_leaves_out_totals_it_cannot_trust() -> None:
    previous = {"total-records": "5", "total-data-files": "junk"}
    out = update_totals(previous, {"deleted-records": "9", "added-data-files": "1"})
    # previous lacked most totals, held junk for one, and records would go negative
    for key in (
        "total-records",
        "total-data-files",
        "total-files-size",
        "total-delete-files",
        "total-position-deletes",
        "total-equality-deletes",
    ):
        assert key not in out
    assert out == {"deleted-records": "9", "added-data-files": "1"}


def test_update_totals_replaces_stale_totals_in_the_deltas() -> None:
    out = update_totals({"total-records": "1"}, {"total-records": "999", "added-records": "1"})
    assert out["total-records"] == "2"


_counts = st.integers(min_value=0, max_value=10**12)


@settings(max_examples=examples(60))
@given(previous=_counts, added=_counts, removed=_counts)
def test_update_totals_law(previous: int, added: int, removed: int) -> None:
    out = update_totals(
        {"total-records": str(previous)},
        {"added-records": str(added), "deleted-records": str(removed)},
    )
    expected = previous + added - removed
    if expected >= 0:
        assert out["total-records"] == str(expected)
    else:
        assert "total-records" not in out


@settings(max_examples=examples(30))
@given(st.lists(st.tuples(_counts, _counts), min_size=1, max_size=8))
def test_update_totals_chain_equals_sum_of_deltas(deltas: list[tuple[int, int]]) -> None:
    summary: dict[str, str] | None = None
    for added, size in deltas:
        summary = update_totals(
            summary, {"added-data-files": str(added), "added-files-size": str(size)}
        )
    assert summary is not None
    assert summary["total-data-files"] == str(sum(a for a, _ in deltas))
    assert summary["total-files-size"] == str(sum(s for _, s in deltas))


def test_snapshot_ref_branch_and_tag() -> None:
    branch = SnapshotRef.branch(5, min_snapshots_to_keep=2, max_snapshot_age_ms=10)
    assert branch.is_branch
    assert branch.to_json() == {
        "snapshot-id": 5,
        "type": "branch",
        "min-snapshots-to-keep": 2,
        "max-snapshot-age-ms": 10,
    }
    tag = SnapshotRef.tag(6, max_ref_age_ms=100)
    assert not tag.is_branch and tag.ref_type is SnapshotRefType.TAG
    assert SnapshotRef.from_json(tag.to_json()) == tag
    assert MAIN_BRANCH == "main"


@pytest.mark.parametrize("field", ["min-snapshots-to-keep", "max-snapshot-age-ms"])
def test_tags_cannot_carry_branch_retention(field: str) -> None:
    with pytest.raises(ValidationError, match=f"a tag cannot set '{field}'"):
        SnapshotRef.from_json({"snapshot-id": 1, "type": "tag", field: 3})


@pytest.mark.parametrize(
    "field", ["min-snapshots-to-keep", "max-snapshot-age-ms", "max-ref-age-ms"]
)
def test_ref_retention_values_must_be_positive(field: str) -> None:
    with pytest.raises(ValidationError, match=f"'{field}' must be positive"):
        SnapshotRef.from_json({"snapshot-id": 1, "type": "branch", field: 0})


def test_ref_type_must_be_branch_or_tag() -> None:
    with pytest.raises(ValidationError, match="type"):
        SnapshotRef.from_json({"snapshot-id": 1, "type": "bookmark"})


def test_log_entries_round_trip() -> None:
    s = SnapshotLogEntry.from_json({"snapshot-id": 1, "timestamp-ms": 2})
    assert (s.snapshot_id, s.timestamp_ms) == (1, 2)
    assert s.to_json() == {"snapshot-id": 1, "timestamp-ms": 2}
    m = MetadataLogEntry.from_json({"metadata-file": "s3://m/v1.metadata.json", "timestamp-ms": 3})
    assert m.metadata_file == "s3://m/v1.metadata.json"
    assert MetadataLogEntry.from_json(m.to_json()) == m


def test_statistics_files_round_trip() -> None:
    obj: dict[str, Any] = {
        "snapshot-id": 3055729675574597004,
        "statistics-path": "s3://a/b/stats.puffin",
        "file-size-in-bytes": 413,
        "file-footer-size-in-bytes": 42,
        "blob-metadata": [
            {
                "type": "apache-datasketches-theta-v1",
                "snapshot-id": 3055729675574597004,
                "sequence-number": 1,
                "fields": [1, 2],
                "properties": {"ndv": "12"},
            }
        ],
    }
    stats = StatisticsFile.from_json(obj)
    assert stats.blob_metadata[0] == BlobMetadata.from_json(obj["blob-metadata"][0])
    assert stats.blob_metadata[0].fields == (1, 2)
    assert stats.to_json() == obj
    part = PartitionStatisticsFile.from_json(
        {"snapshot-id": 1, "statistics-path": "s3://p.parquet", "file-size-in-bytes": 9}
    )
    assert part.to_json() == {
        "snapshot-id": 1,
        "statistics-path": "s3://p.parquet",
        "file-size-in-bytes": 9,
    }


def test_statistics_file_missing_blob_metadata_is_named() -> None:
    with pytest.raises(ValidationError, match="missing required field 'blob-metadata'"):
        StatisticsFile.from_json(
            {
                "snapshot-id": 1,
                "statistics-path": "s3://s",
                "file-size-in-bytes": 1,
                "file-footer-size-in-bytes": 1,
            }
        )


def test_generated_snapshot_ids_are_positive_longs_and_distinct() -> None:
    ids = {generate_snapshot_id() for _ in range(2000)}
    assert len(ids) == 2000
    assert all(0 <= i < 2**63 for i in ids)


def test_hyphenate() -> None:
    assert hyphenate("file_footer_size_in_bytes") == "file-footer-size-in-bytes"


_longs = st.integers(min_value=0, max_value=2**63 - 1)
_text = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-./:", min_size=1, max_size=30)


@st.composite
def snapshots(draw: st.DrawFn) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "snapshot-id": draw(_longs),
        "sequence-number": draw(_longs),
        "timestamp-ms": draw(_longs),
    }
    if draw(st.booleans()):
        obj["parent-snapshot-id"] = draw(_longs)
    if draw(st.booleans()):
        obj["manifest-list"] = draw(_text)
    else:
        obj["manifests"] = draw(st.lists(_text, max_size=3))
    if draw(st.booleans()):
        props = draw(st.dictionaries(_text.filter(lambda k: k != "operation"), _text, max_size=4))
        op = draw(st.sampled_from([None, *[o.value for o in Operation]]))
        obj["summary"] = props if op is None else {"operation": op, **props}
    if draw(st.booleans()):
        obj["schema-id"] = draw(st.integers(min_value=0, max_value=100))
    if draw(st.booleans()):
        obj["first-row-id"] = draw(_longs)
        obj["added-rows"] = draw(_longs)
    return obj


@settings(max_examples=examples(80))
@given(snapshots())
def test_snapshot_round_trip_property(obj: dict[str, Any]) -> None:
    s = Snapshot.from_json(obj)
    assert s.to_json() == obj
    assert Snapshot.from_json(s.to_json()) == s
