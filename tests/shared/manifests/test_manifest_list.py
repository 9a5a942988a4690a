"""Manifest lists: assignment of sequence numbers and row ids, round trips, PyIceberg interop."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fastavro
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples
from icefloe.avro.codec import read_header
from icefloe.errors import InvalidFileError, UnsupportedFormatVersion, ValidationError
from icefloe.manifests.manifest import ManifestWriter, read_manifest
from icefloe.manifests.manifest_list import (
    UNASSIGNED_SEQ,
    ManifestContent,
    ManifestFile,
    ManifestListWriter,
    PartitionFieldSummary,
    read_manifest_list,
    read_manifest_list_metadata,
    write_manifest_list,
)
from icefloe.spec.datafile import DataFile
from icefloe.spec.partition import PartitionField, PartitionSpec
from icefloe.spec.schema import Schema
from icefloe.spec.transforms import IdentityTransform
from icefloe.spec.types import LongType, NestedField, StringType

SNAPSHOT = 3051729675574597004


def manifest(
    i: int,
    *,
    content: ManifestContent = ManifestContent.DATA,
    seq: int = UNASSIGNED_SEQ,
    min_seq: int = UNASSIGNED_SEQ,
    snapshot: int | None = SNAPSHOT,
    first_row_id: int | None = None,
    **changes: Any,
) -> ManifestFile:
    return ManifestFile(
        manifest_path=f"s3://bucket/t/metadata/m{i}.avro",
        manifest_length=5000 + i,
        partition_spec_id=i % 3,
        content=content,
        sequence_number=seq,
        min_sequence_number=min_seq,
        added_snapshot_id=snapshot,
        added_files_count=i,
        existing_files_count=2 * i,
        deleted_files_count=1,
        added_rows_count=100 * i,
        existing_rows_count=1000 * i,
        deleted_rows_count=7,
        partitions=[
            PartitionFieldSummary(True, False, b"\x01\x00\x00\x00", b"\x09\x00\x00\x00"),
            PartitionFieldSummary(False, None, None, None),
        ],
        key_metadata=b"km" if i % 2 else None,
        first_row_id=first_row_id,
    ).copy(**changes)


def write_list(
    manifests: list[ManifestFile],
    *,
    version: int,
    seq: int | None = 12,
    first_row_id: int | None = 1000,
    parent: int | None = 42,
) -> tuple[bytes, list[ManifestFile], int | None]:
    out = io.BytesIO()
    written, next_row_id = write_manifest_list(
        out,
        manifests,
        format_version=version,
        snapshot_id=SNAPSHOT,
        parent_snapshot_id=parent,
        sequence_number=seq,
        first_row_id=first_row_id,
    )
    return out.getvalue(), written, next_row_id


# -- assignment and round trips --------------------------------------------------------------


def test_v2_assigns_the_commit_sequence_number_to_new_manifests_only() -> None:
    new = manifest(1)
    carried = manifest(2, seq=5, min_seq=3, snapshot=77)
    new_with_old_data = manifest(3, min_seq=4)
    data, written, next_row_id = write_list([new, carried, new_with_old_data], version=2)
    assert [(m.sequence_number, m.min_sequence_number) for m in written] == [
        (12, 12),
        (5, 3),
        (12, 4),
    ]
    assert next_row_id is None
    assert read_manifest_list(data, location="s3://bucket/t/metadata/snap.avro") == written


@pytest.mark.parametrize("version", [1, 2, 3])
def test_round_trip_keeps_every_field_the_version_has(version: int) -> None:
    manifests = [manifest(i, seq=i, min_seq=i, first_row_id=10 * i) for i in range(1, 5)]
    data, written, _ = write_list(manifests, version=version)
    read = read_manifest_list(data, location="list")
    if version == 1:
        # v1 lists have no content or sequence numbers: the spec says read them as 0 / data
        expected = [
            m.copy(sequence_number=0, min_sequence_number=0, first_row_id=None) for m in manifests
        ]
    elif version == 2:
        expected = [m.copy(first_row_id=None) for m in manifests]
    else:
        expected = manifests
    assert read == expected
    assert written == expected  # the writer returns what readers of the list will see


@pytest.mark.parametrize("version", [2, 3])
def test_delete_manifests_round_trip(version: int) -> None:
    deletes = manifest(1, content=ManifestContent.DELETES, first_row_id=99)
    data, _, next_row_id = write_list([deletes], version=version)
    (read,) = read_manifest_list(data, location="list")
    assert read.content == ManifestContent.DELETES
    assert read.first_row_id is None  # delete manifests never carry row ids
    assert next_row_id == (1000 if version == 3 else None)


def test_v3_assigns_first_row_ids_from_added_and_existing_rows() -> None:
    a = manifest(1)  # 100 added + 1000 existing rows
    keeps = manifest(2, seq=3, min_seq=3, snapshot=5, first_row_id=7)
    deletes = manifest(3, content=ManifestContent.DELETES)
    b = manifest(4)
    data, written, next_row_id = write_list([a, keeps, deletes, b], version=3, first_row_id=1000)
    assert [m.first_row_id for m in written] == [1000, 7, None, 1000 + 1100]
    assert next_row_id == 1000 + 1100 + 4400
    assert [m.first_row_id for m in read_manifest_list(data, location="list")] == [
        1000,
        7,
        None,
        2100,
    ]


def test_manifests_written_before_their_snapshot_id_was_known_get_the_commits() -> None:
    data, written, _ = write_list([manifest(1, snapshot=None)], version=2)
    assert written[0].added_snapshot_id == SNAPSHOT
    assert read_manifest_list(data, location="list")[0].added_snapshot_id == SNAPSHOT


@pytest.mark.parametrize("version", [1, 2, 3])
def test_key_value_metadata(version: int) -> None:
    data, _, _ = write_list([], version=version, parent=None)
    meta = read_manifest_list_metadata(data)
    expected = {
        "snapshot-id": str(SNAPSHOT),
        "parent-snapshot-id": "null",
        "format-version": str(version),
    }
    if version >= 2:
        expected["sequence-number"] = "12"
    if version >= 3:
        expected["first-row-id"] = "1000"
    assert meta == expected
    assert read_manifest_list(data, location="list") == []


@pytest.mark.parametrize("version", [1, 2, 3])
def test_avro_layout_follows_the_spec(version: int) -> None:
    data, _, _ = write_list([manifest(1, seq=1, min_seq=1)], version=version)
    meta, _ = read_header(data, "list")
    schema = json.loads(meta["avro.schema"])
    assert schema["name"] == "manifest_file"
    ids = {f["name"]: f["field-id"] for f in schema["fields"]}
    assert ids["manifest_path"] == 500 and ids["added_snapshot_id"] == 503
    assert ("sequence_number" in ids) == (version >= 2)
    assert ("content" in ids) == (version >= 2)
    assert ("first_row_id" in ids) == (version >= 3)
    partitions = next(f for f in schema["fields"] if f["name"] == "partitions")
    summary = partitions["type"][1]["items"]
    assert partitions["type"][1]["element-id"] == 508
    assert summary["name"] == "r508"
    assert {f["name"]: f["field-id"] for f in summary["fields"]} == {
        "contains_null": 509,
        "contains_nan": 518,
        "lower_bound": 510,
        "upper_bound": 511,
    }
    counts_required = version >= 2
    added = next(f for f in schema["fields"] if f["name"] == "added_files_count")
    assert isinstance(added["type"], str) == counts_required


def test_manifest_and_list_together_give_entries_their_inherited_values() -> None:
    schema = Schema(NestedField(1, "id", LongType(), True), NestedField(2, "cat", StringType()))
    spec = PartitionSpec(0, (PartitionField(2, 1000, "cat", IdentityTransform()),))
    out = io.BytesIO()
    with ManifestWriter(out, spec=spec, schema=schema, format_version=3, snapshot_id=None) as w:
        for i in range(3):
            w.add(DataFile(f"s3://b/f{i}.parquet", "parquet", (f"c{i % 2}",), 10 * (i + 1), 100))
    mf = w.to_manifest_file("s3://b/m.avro", len(out.getvalue()))
    assert mf.partitions == [PartitionFieldSummary(False, False, b"c0", b"c1")]
    data, (row,), next_row_id = write_list([mf], version=3, seq=9, first_row_id=500)
    (row,) = read_manifest_list(data, location="list")
    assert (row.sequence_number, row.min_sequence_number, row.first_row_id) == (9, 9, 500)
    assert next_row_id == 560
    entries = read_manifest(out.getvalue(), location=row.manifest_path, manifest_file=row)
    assert [(e.snapshot_id, e.sequence_number, e.data_file.first_row_id) for e in entries] == [
        (SNAPSHOT, 9, 500),
        (SNAPSHOT, 9, 510),
        (SNAPSHOT, 9, 530),
    ]


@settings(max_examples=examples(40), deadline=None)
@given(
    st.lists(
        st.builds(
            ManifestFile,
            manifest_path=st.text(min_size=1, max_size=30),
            manifest_length=st.integers(0, 2**63 - 1),
            partition_spec_id=st.integers(0, 2**31 - 1),
            content=st.sampled_from(ManifestContent),
            sequence_number=st.integers(0, 2**62),
            min_sequence_number=st.integers(0, 2**62),
            added_snapshot_id=st.integers(-(2**63), 2**63 - 1),
            added_files_count=st.integers(0, 2**31 - 1),
            existing_files_count=st.integers(0, 2**31 - 1),
            deleted_files_count=st.integers(0, 2**31 - 1),
            added_rows_count=st.integers(0, 2**40),
            existing_rows_count=st.integers(0, 2**40),
            deleted_rows_count=st.integers(0, 2**40),
            partitions=st.none()
            | st.lists(
                st.builds(
                    PartitionFieldSummary,
                    contains_null=st.booleans(),
                    contains_nan=st.none() | st.booleans(),
                    lower_bound=st.none() | st.binary(max_size=16),
                    upper_bound=st.none() | st.binary(max_size=16),
                ),
                max_size=4,
            ),
            key_metadata=st.none() | st.binary(max_size=8),
            first_row_id=st.none() | st.integers(0, 2**40),
        ),
        max_size=6,
    )
)
def test_any_v3_manifest_list_round_trips(manifests: list[ManifestFile]) -> None:
    data, written, _ = write_list(manifests, version=3)
    assert read_manifest_list(data, location="list") == written
    for before, after in zip(manifests, written):
        if before.content == ManifestContent.DELETES:
            assert after.first_row_id is None
        elif before.first_row_id is not None:
            assert after.first_row_id == before.first_row_id


# -- errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"format_version": 2, "sequence_number": None}, ValidationError, "sequence number"),
        ({"format_version": 3, "first_row_id": None}, ValidationError, "first-row-id"),
        ({"format_version": 0}, UnsupportedFormatVersion, "format version 0"),
    ],
)
def test_writer_refuses_invalid_configurations(
    kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    args: dict[str, Any] = {
        "snapshot_id": 1,
        "parent_snapshot_id": None,
        "sequence_number": 1,
        "first_row_id": 0,
    } | kwargs
    with pytest.raises(error, match=message):
        ManifestListWriter(io.BytesIO(), **args)


def test_writer_refuses_manifests_it_cannot_record() -> None:
    v1 = ManifestListWriter(
        io.BytesIO(), format_version=1, snapshot_id=1, parent_snapshot_id=None, sequence_number=None
    )
    with pytest.raises(ValidationError, match=r"m1\.avro.*v1 tables cannot have delete"):
        v1.add(manifest(1, content=ManifestContent.DELETES))
    out = io.BytesIO()
    v2 = ManifestListWriter(
        out, format_version=2, snapshot_id=1, parent_snapshot_id=None, sequence_number=3
    )
    with pytest.raises(ValidationError, match=r"m2\.avro.*unassigned sequence_number.*snapshot 9"):
        v2.add(manifest(2, snapshot=9))
    with pytest.raises(ValidationError, match=r"m3\.avro.*added_rows_count is required"):
        v2.add(manifest(3, seq=1, min_seq=1, added_rows_count=None))
    with pytest.raises(ValidationError, match=r"m4\.avro.*cannot be written"):
        v2.add(manifest(4, seq=1, min_seq=1, manifest_length="long"))
    v2.add(manifest(5, seq=1, min_seq=1))
    v2.close()
    with pytest.raises(ValidationError, match="closed"):
        v2.add(manifest(6, seq=1, min_seq=1))
    # the rejected manifests left nothing behind
    assert read_manifest_list(out.getvalue(), location="list") == [manifest(5, seq=1, min_seq=1)]


def test_a_rejected_manifest_takes_no_row_ids() -> None:
    writer = ManifestListWriter(
        io.BytesIO(),
        format_version=3,
        snapshot_id=SNAPSHOT,
        parent_snapshot_id=None,
        sequence_number=1,
        first_row_id=10,
    )
    with pytest.raises(ValidationError, match="cannot be written"):
        writer.add(manifest(1, manifest_length="long"))
    assert writer.next_row_id == 10
    assert writer.add(manifest(2)).first_row_id == 10
    assert writer.next_row_id == 10 + 200 + 2000


def rewrite_header(
    data: bytes, change: Callable[[dict[str, Any]], None], **meta_changes: str
) -> bytes:
    meta, end = read_header(data, "list")
    meta.update(meta_changes)
    schema = json.loads(meta["avro.schema"])
    change(schema)
    meta["avro.schema"] = json.dumps(schema)
    header = io.BytesIO()
    header.write(b"Obj\x01")
    fastavro.schemaless_writer(
        header,
        fastavro.parse_schema({"type": "map", "values": "bytes"}),
        {k: v.encode() for k, v in meta.items()},
    )
    return header.getvalue() + data[end - 16 :]


def test_fields_are_found_by_id_whatever_their_names() -> None:
    """Java's v1 lists call field 504 ``added_data_files_count``; ids are what count."""
    data, _, _ = write_list([manifest(i) for i in range(1, 4)], version=1)

    def java_v1_names(schema: dict[str, Any]) -> None:
        for f in schema["fields"]:
            f["name"] = {
                "added_files_count": "added_data_files_count",
                "existing_files_count": "existing_data_files_count",
                "deleted_files_count": "deleted_data_files_count",
            }.get(f["name"], "z_" + f["name"])

    renamed = rewrite_header(data, java_v1_names)
    assert read_manifest_list(renamed, location="list") == read_manifest_list(data, location="list")


def drop_id(field: str) -> Callable[[dict[str, Any]], None]:
    def change(schema: dict[str, Any]) -> None:
        for f in schema["fields"]:
            if f["name"] == field:
                f["field-id"] = 9999

    return change


def retype(field: str, avro_type: Any) -> Callable[[dict[str, Any]], None]:
    def change(schema: dict[str, Any]) -> None:
        next(f for f in schema["fields"] if f["name"] == field)["type"] = avro_type

    return change


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (drop_id("manifest_path"), "required field 500 'manifest_path' is missing"),
        (drop_id("added_snapshot_id"), "required field 503 'added_snapshot_id' is missing"),
        (retype("manifest_path", "long"), "field 500 'manifest_path' has type long"),
        (retype("manifest_length", "string"), "field 501 'manifest_length' has type string"),
    ],
)
def test_non_manifest_lists_raise_invalid_file_errors(
    change: Callable[[dict[str, Any]], None], message: str
) -> None:
    data, _, _ = write_list([manifest(1, seq=1, min_seq=1)], version=2)
    with pytest.raises(InvalidFileError, match=message) as info:
        read_manifest_list(rewrite_header(data, change), location="s3://b/snap-1.avro")
    assert info.value.location == "s3://b/snap-1.avro"


def test_broken_and_foreign_files() -> None:
    data, _, _ = write_list([manifest(i, seq=1, min_seq=1) for i in range(40)], version=2)
    out = io.BytesIO()
    fastavro.writer(
        out, {"type": "record", "name": "x", "fields": [{"name": "a", "type": "int"}]}, [{"a": 1}]
    )
    cases = [
        (data[: len(data) - 50], "cannot decode Avro record"),
        (b"Obj", "bad magic"),
        (out.getvalue(), "not an Iceberg manifest list"),
    ]
    for payload, message in cases:
        with pytest.raises(InvalidFileError, match=message):
            read_manifest_list(payload, location="s3://b/snap-1.avro")
    future = rewrite_header(data, lambda schema: None, **{"format-version": "9"})
    with pytest.raises(UnsupportedFormatVersion, match=r"snap-1\.avro: format-version 9"):
        read_manifest_list(future, location="s3://b/snap-1.avro")


def test_out_of_range_content_values_are_reported() -> None:
    data, _, _ = write_list([manifest(1, seq=1, min_seq=1)], version=2)
    (rec,) = fastavro.reader(io.BytesIO(data))
    rec["content"] = 5  # type: ignore[index]
    out = io.BytesIO()
    meta, _ = read_header(data, "list")
    fastavro.writer(out, json.loads(meta["avro.schema"]), [rec])
    with pytest.raises(InvalidFileError, match=r"entry 0 is malformed: KeyError: 5"):
        read_manifest_list(out.getvalue(), location="list")


# -- interop with PyIceberg ----------------------------------------------------------------------


def pyiceberg_io() -> Any:
    from pyiceberg.io.pyarrow import PyArrowFileIO

    return PyArrowFileIO()


@pytest.mark.interop
@pytest.mark.parametrize("version", [1, 2])
def test_icefloe_reads_what_pyiceberg_wrote(version: int, tmp_path: Path) -> None:
    from pyiceberg.manifest import ManifestContent as PContent
    from pyiceberg.manifest import ManifestFile as PManifestFile
    from pyiceberg.manifest import PartitionFieldSummary as PSummary
    from pyiceberg.manifest import write_manifest_list as py_write_manifest_list

    ours = [manifest(i, snapshot=SNAPSHOT) for i in range(1, 4)]
    theirs = [
        PManifestFile.from_args(
            manifest_path=m.manifest_path,
            manifest_length=m.manifest_length,
            partition_spec_id=m.partition_spec_id,
            content=PContent.DATA,
            sequence_number=-1,
            min_sequence_number=-1,
            added_snapshot_id=m.added_snapshot_id,
            added_files_count=m.added_files_count,
            existing_files_count=m.existing_files_count,
            deleted_files_count=m.deleted_files_count,
            added_rows_count=m.added_rows_count,
            existing_rows_count=m.existing_rows_count,
            deleted_rows_count=m.deleted_rows_count,
            partitions=[
                PSummary.from_args(
                    contains_null=s.contains_null,
                    contains_nan=s.contains_nan,
                    lower_bound=s.lower_bound,
                    upper_bound=s.upper_bound,
                )
                for s in m.partitions or []
            ],
            key_metadata=m.key_metadata,
        )
        for m in ours
    ]
    path = str(tmp_path / "snap.avro")
    with py_write_manifest_list(
        version, pyiceberg_io().new_output(path), SNAPSHOT, 42, 12, "deflate"
    ) as w:
        w.add_manifests(theirs)
    data = Path(path).read_bytes()
    seq = 12 if version == 2 else 0
    assert read_manifest_list(data, location=path) == [
        m.copy(sequence_number=seq, min_sequence_number=seq) for m in ours
    ]
    meta = read_manifest_list_metadata(data, location=path)
    assert meta["snapshot-id"] == str(SNAPSHOT) and meta["parent-snapshot-id"] == "42"


@pytest.mark.interop
@pytest.mark.parametrize("version", [1, 2, 3])
def test_pyiceberg_reads_what_icefloe_wrote(version: int, tmp_path: Path) -> None:
    from pyiceberg.manifest import read_manifest_list as py_read_manifest_list

    manifests = [manifest(i) for i in range(1, 4)]
    data, written, _ = write_list(manifests, version=version, seq=12)
    path = tmp_path / "snap.avro"
    path.write_bytes(data)
    theirs = list(py_read_manifest_list(pyiceberg_io().new_input(str(path))))
    assert len(theirs) == len(written)
    for p, m in zip(theirs, written):
        assert p.manifest_path == m.manifest_path
        assert p.manifest_length == m.manifest_length
        assert p.partition_spec_id == m.partition_spec_id
        assert int(p.content) == int(m.content)
        assert p.sequence_number == (12 if version >= 2 else 0)
        assert p.min_sequence_number == (12 if version >= 2 else 0)
        assert p.added_snapshot_id == m.added_snapshot_id
        assert (p.added_files_count, p.existing_files_count, p.deleted_files_count) == (
            m.added_files_count,
            m.existing_files_count,
            m.deleted_files_count,
        )
        assert (p.added_rows_count, p.existing_rows_count, p.deleted_rows_count) == (
            m.added_rows_count,
            m.existing_rows_count,
            m.deleted_rows_count,
        )
        assert [
            (s.contains_null, s.contains_nan, s.lower_bound, s.upper_bound) for s in p.partitions
        ] == [
            (s.contains_null, s.contains_nan, s.lower_bound, s.upper_bound)
            for s in m.partitions or []
        ]
        assert p.key_metadata == m.key_metadata
