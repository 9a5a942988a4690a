"""Manifests: write → read round trips, inheritance, summaries, errors, PyIceberg interop."""

from __future__ import annotations

import io
import json
import math
import struct
import uuid
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import fastavro
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples
from icefloe.avro.codec import parsed_avro_schema, read_header
from icefloe.errors import InvalidFileError, UnsupportedFormatVersion, ValidationError
from icefloe.manifests.manifest import (
    DEFAULT_BLOCK_SIZE,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestWriter,
    manifest_entry_struct,
    read_manifest,
    read_manifest_metadata,
    write_manifest,
)
from icefloe.manifests.manifest_list import UNASSIGNED_SEQ
from icefloe.spec.datafile import DataFile, DataFileContent
from icefloe.spec.partition import PartitionField, PartitionSpec
from icefloe.spec.schema import Schema
from icefloe.spec.transforms import (
    BucketTransform,
    DayTransform,
    HourTransform,
    IdentityTransform,
    MonthTransform,
    Transform,
    TruncateTransform,
    VoidTransform,
    YearTransform,
)
from icefloe.spec.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
    TimestampNanoType,
    TimestampType,
    TimestamptzNanoType,
    TimestamptzType,
    TimeType,
    UUIDType,
)
from icefloe.spec.values import from_bytes

SCHEMA = Schema(
    NestedField(1, "id", LongType(), True),
    NestedField(2, "ts", TimestamptzType(), False),
    NestedField(3, "data", StringType(), False),
    NestedField(4, "price", DecimalType(10, 2), False),
    NestedField(5, "u", UUIDType(), False),
    NestedField(6, "d", DateType(), False),
    NestedField(7, "f", FloatType(), False),
    NestedField(8, "dbl", DoubleType(), False),
    NestedField(9, "flag", BooleanType(), False),
    NestedField(10, "i", IntegerType(), False),
    NestedField(11, "t", TimeType(), False),
    NestedField(12, "tsn", TimestampNanoType(), False),
    NestedField(13, "fx", FixedType(4), False),
    NestedField(14, "bin", BinaryType(), False),
    NestedField(15, "tsl", TimestampType(), False),
    NestedField(16, "tsnz", TimestamptzNanoType(), False),
    schema_id=4,
)

# (source id, partition name, transform): every transform, every identity result type.
ALL_FIELDS: list[tuple[int, str, Transform]] = [
    *((f.field_id, f"{f.name}_identity", IdentityTransform()) for f in SCHEMA.fields),
    (1, "id_bucket", BucketTransform(8)),
    (3, "data_trunc", TruncateTransform(3)),
    (10, "i_trunc", TruncateTransform(10)),
    (4, "price_trunc", TruncateTransform(50)),
    (14, "bin_trunc", TruncateTransform(2)),
    (6, "d_year", YearTransform()),
    (2, "ts_month", MonthTransform()),
    (2, "ts_day", DayTransform()),
    (2, "ts_hour", HourTransform()),
    (3, "data_void", VoidTransform()),
    (5, "u_bucket", BucketTransform(4)),
]
ALL_SPEC = PartitionSpec(
    3, tuple(PartitionField(s, 1000 + i, n, t) for i, (s, n, t) in enumerate(ALL_FIELDS))
)
DAY_SPEC = PartitionSpec(1, (PartitionField(2, 1000, "ts_day", DayTransform()),))
UNPARTITIONED = PartitionSpec.unpartitioned()


def row(i: int) -> dict[int, Any]:
    """Source values for row ``i``, by field id, in the internal representation."""
    return {
        1: i * 1_000_003,
        2: 1_700_000_000_000_000 + i * 86_400_000_000,
        3: f"data-{i}-é",
        4: Decimal(f"{i}.25") if i % 2 else Decimal(f"-{i}.50"),
        5: uuid.UUID(int=i * 7919),
        6: 19_000 + i * 40,
        7: float(i) / 4,
        8: -float(i) * 1.5,
        9: i % 2 == 0,
        10: i * 3 - 20,
        11: (i * 3_600_000_000) % 86_400_000_000,
        12: 1_700_000_000_000_000_123 + i,
        13: bytes([i % 256, 1, 2, 3]),
        14: bytes(range(i % 5)),
        15: -(10**12) * i,
        16: 2**62 - i,
    }


def partition_of(spec: PartitionSpec, values: dict[int, Any]) -> tuple[Any, ...]:
    return tuple(
        f.transform.apply(SCHEMA.find_type(f.source_id), values[f.source_id]) for f in spec.fields
    )


def data_file(
    i: int,
    spec: PartitionSpec = ALL_SPEC,
    content: DataFileContent = DataFileContent.DATA,
    **changes: Any,
) -> DataFile:
    f = DataFile(
        file_path=f"s3://bucket/warehouse/t/data/{i:05d}.parquet",
        file_format="parquet",
        partition=partition_of(spec, row(i)),
        record_count=100 + i,
        file_size_in_bytes=4096 + i,
        content=content,
        spec_id=spec.spec_id,
        column_sizes={1: 10 + i, 3: 30},
        value_counts={1: 100 + i, 3: 100 + i},
        null_value_counts={1: 0, 3: i},
        nan_value_counts={7: 0},
        lower_bounds={1: struct.pack("<q", i), 3: b"a"},
        upper_bounds={1: struct.pack("<q", i + 10), 3: b"z"},
        key_metadata=b"\x00key",
        split_offsets=[4, 1024 + i],
        sort_order_id=1 if content != DataFileContent.POSITION_DELETES else None,
    )
    if content == DataFileContent.EQUALITY_DELETES:
        f.equality_ids = [1, 3]
    if content == DataFileContent.POSITION_DELETES:
        f.referenced_data_file = f"s3://bucket/warehouse/t/data/{i:05d}.parquet"
    return f.copy(**changes)


def write(
    files: list[DataFile],
    *,
    version: int,
    spec: PartitionSpec = ALL_SPEC,
    content: ManifestContent = ManifestContent.DATA,
    snapshot_id: int | None = 99,
    fill: Callable[[ManifestWriter], None] | None = None,
) -> tuple[bytes, ManifestFile]:
    out = io.BytesIO()
    with ManifestWriter(
        out,
        spec=spec,
        schema=SCHEMA,
        format_version=version,
        snapshot_id=snapshot_id,
        content=content,
    ) as writer:
        for f in files:
            writer.add(f)
        if fill is not None:
            fill(writer)
    data = out.getvalue()
    return data, writer.to_manifest_file("s3://bucket/warehouse/t/metadata/m0.avro", len(data))


def committed(mf: ManifestFile, seq: int, first_row_id: int | None = None) -> ManifestFile:
    """The row a manifest list writer of a commit with ``seq`` would produce."""
    return mf.copy(
        sequence_number=seq,
        min_sequence_number=seq
        if mf.min_sequence_number == UNASSIGNED_SEQ
        else mf.min_sequence_number,
        first_row_id=first_row_id,
    )


def expected_after_read(f: DataFile, version: int) -> DataFile:
    """What a format version can store of ``f``."""
    if version == 1:
        f = f.copy(equality_ids=None, referenced_data_file=None)
    if version <= 2:
        f = f.copy(first_row_id=None, content_offset=None, content_size_in_bytes=None)
    return f


# -- round trips -----------------------------------------------------------------------------


@pytest.mark.parametrize("version", [1, 2, 3])
def test_data_manifest_round_trips_every_partition_result_type(version: int) -> None:
    files = [data_file(i) for i in range(12)]
    data, mf = write(files, version=version)
    entries = read_manifest(data, location=mf.manifest_path)
    assert [e.data_file for e in entries] == [expected_after_read(f, version) for f in files]
    assert all(e.status == ManifestEntryStatus.ADDED and e.snapshot_id == 99 for e in entries)
    # values come back in the internal representation: the same Python types, decimals at
    # the column's scale, and null for the void field
    for e, f in zip(entries, files):
        assert [type(v) for v in e.data_file.partition] == [type(v) for v in f.partition]
        price = e.data_file.partition[ALL_FIELDS.index((4, "price_identity", IdentityTransform()))]
        assert price.as_tuple().exponent == -2
        assert e.data_file.partition[ALL_FIELDS.index((3, "data_void", VoidTransform()))] is None


@pytest.mark.parametrize("version", [2, 3])
@pytest.mark.parametrize(
    "content", [DataFileContent.POSITION_DELETES, DataFileContent.EQUALITY_DELETES]
)
def test_delete_manifest_round_trips(version: int, content: DataFileContent) -> None:
    files = [data_file(i, DAY_SPEC, content) for i in range(5)]
    data, mf = write(files, version=version, spec=DAY_SPEC, content=ManifestContent.DELETES)
    assert mf.content == ManifestContent.DELETES
    assert read_manifest_metadata(data)["content"] == "deletes"
    entries = read_manifest(data, location="m", manifest_file=committed(mf, 3, first_row_id=50))
    assert [e.data_file for e in entries] == files  # delete files never get row ids


def test_v3_deletion_vectors_keep_their_blob_location() -> None:
    dv = data_file(
        1,
        DAY_SPEC,
        DataFileContent.POSITION_DELETES,
        file_format="puffin",
        content_offset=4,
        content_size_in_bytes=42,
        split_offsets=None,
    )
    data, _ = write([dv], version=3, spec=DAY_SPEC, content=ManifestContent.DELETES)
    (entry,) = read_manifest(data, location="m")
    assert entry.data_file == dv


def test_v3_existing_data_files_keep_their_first_row_id() -> None:
    f = data_file(3, first_row_id=500)
    data, _ = write(
        [],
        version=3,
        fill=lambda w: w.existing(ManifestEntry(ManifestEntryStatus.ADDED, 4, 2, 2, f)),
    )
    (entry,) = read_manifest(data, location="m")
    assert entry.data_file == f
    assert (entry.status, entry.snapshot_id, entry.sequence_number) == (
        ManifestEntryStatus.EXISTING,
        4,
        2,
    )


def test_empty_and_unpartitioned_manifests() -> None:
    data, mf = write([], version=2, spec=UNPARTITIONED)
    assert read_manifest(data, location="m") == []
    assert mf.added_files_count == 0 and mf.partitions == []
    files = [data_file(i, UNPARTITIONED) for i in range(3)]
    data, mf = write(files, version=2, spec=UNPARTITIONED)
    assert [e.data_file.partition for e in read_manifest(data, location="m")] == [()] * 3


def test_partition_names_that_are_not_avro_names() -> None:
    spec = PartitionSpec(
        2,
        (
            PartitionField(2, 1000, "ts day", DayTransform()),
            PartitionField(3, 1001, "1-data", IdentityTransform()),
        ),
    )
    files = [data_file(i, spec) for i in range(3)]
    data, _ = write(files, version=2, spec=spec)
    assert [e.data_file for e in read_manifest(data, location="m")] == files
    meta = read_manifest_metadata(data)
    assert [f["name"] for f in json.loads(meta["partition-spec"])] == ["ts day", "1-data"]


def test_file_formats_are_read_case_insensitively() -> None:
    data, _ = write([data_file(1, DAY_SPEC, file_format="PARQUET")], version=2, spec=DAY_SPEC)
    (entry,) = read_manifest(data, location="m")
    assert entry.data_file.file_format == "parquet"


def test_spec_by_id_orders_partition_tuples_by_field_id() -> None:
    spec = PartitionSpec(
        5,
        (
            PartitionField(2, 1000, "ts_day", DayTransform()),
            PartitionField(1, 1001, "id_bucket", BucketTransform(8)),
            PartitionField(5, 1002, "u", IdentityTransform()),
        ),
    )
    data, mf = write([data_file(i, spec) for i in range(3)], version=2, spec=spec)
    same_fields_other_order = PartitionSpec(5, (spec.fields[2], spec.fields[0], spec.fields[1]))
    entries = read_manifest(
        data, location="m", manifest_file=mf, spec_by_id={5: same_fields_other_order}
    )
    for i, e in enumerate(entries):
        day, bucket, u = partition_of(spec, row(i))
        assert e.data_file.partition == (u, day, bucket)
        assert e.data_file.spec_id == 5


# -- layout and key-value metadata -----------------------------------------------------------


def avro_schema_of(data: bytes) -> dict[str, Any]:
    meta, _ = read_header(data, "m")
    return json.loads(meta["avro.schema"])  # type: ignore[no-any-return]


def field_ids(record: dict[str, Any]) -> dict[str, int]:
    return {f["name"]: f["field-id"] for f in record["fields"]}


@pytest.mark.parametrize("version", [1, 2, 3])
def test_avro_layout_and_metadata_follow_the_spec(version: int) -> None:
    data, _ = write([data_file(1, DAY_SPEC)], version=version, spec=DAY_SPEC)
    schema = avro_schema_of(data)
    assert schema["name"] == "manifest_entry"
    entry_ids = field_ids(schema)
    expected_entry = {"status": 0, "snapshot_id": 1, "data_file": 2}
    if version >= 2:
        expected_entry |= {"sequence_number": 3, "file_sequence_number": 4}
    assert entry_ids == expected_entry
    df = next(f for f in schema["fields"] if f["name"] == "data_file")["type"]
    assert df["name"] == "r2"
    ids = field_ids(df)
    assert ("block_size_in_bytes" in ids) == (version == 1)
    assert ("content" in ids) == (version >= 2)
    assert ("equality_ids" in ids) == (version >= 2)
    assert ("first_row_id" in ids) == (version >= 3)
    assert ("content_offset" in ids) == (version >= 3)
    partition = next(f for f in df["fields"] if f["name"] == "partition")["type"]
    assert partition["name"] == "r102"
    assert partition["fields"][0]["field-id"] == 1000
    assert partition["fields"][0]["type"] == ["null", {"type": "int", "logicalType": "date"}]
    sizes = next(f for f in df["fields"] if f["name"] == "column_sizes")["type"][1]
    assert sizes["logicalType"] == "map" and sizes["items"]["name"] == "k117_v118"

    meta = read_manifest_metadata(data)
    assert Schema.from_json(json.loads(meta["schema"])) == SCHEMA
    assert meta["schema-id"] == "4"
    assert json.loads(meta["partition-spec"]) == DAY_SPEC.to_json()["fields"]
    assert meta["partition-spec-id"] == "1"
    assert meta["format-version"] == str(version)
    assert meta.get("content") == (None if version == 1 else "data")
    assert not any(k.startswith("avro.") for k in meta)


def test_v1_writes_the_default_block_size() -> None:
    data, _ = write([data_file(1, DAY_SPEC)], version=1, spec=DAY_SPEC)
    (rec,) = fastavro.reader(io.BytesIO(data))
    assert rec["data_file"]["block_size_in_bytes"] == DEFAULT_BLOCK_SIZE  # type: ignore[index,call-overload]


# -- inheritance -----------------------------------------------------------------------------


def entries_of_every_kind(writer: ManifestWriter) -> None:
    writer.add(data_file(10, DAY_SPEC), sequence_number=2)
    writer.existing(ManifestEntry(ManifestEntryStatus.ADDED, 11, 3, 4, data_file(11, DAY_SPEC)))
    writer.delete(ManifestEntry(ManifestEntryStatus.EXISTING, 12, 1, 1, data_file(12, DAY_SPEC)))


def test_v2_sequence_number_and_snapshot_id_inheritance() -> None:
    data, mf = write(
        [data_file(1, DAY_SPEC)],
        version=2,
        spec=DAY_SPEC,
        snapshot_id=None,
        fill=entries_of_every_kind,
    )
    raw = read_manifest(data, location="m")
    assert [(e.status, e.snapshot_id, e.sequence_number, e.file_sequence_number) for e in raw] == [
        (ManifestEntryStatus.ADDED, None, None, None),
        (ManifestEntryStatus.ADDED, None, 2, None),
        (ManifestEntryStatus.EXISTING, 11, 3, 4),
        (ManifestEntryStatus.DELETED, None, 1, 1),
    ]
    row = committed(mf.copy(added_snapshot_id=500), 8)
    inherited = read_manifest(data, location="m", manifest_file=row)
    assert [(e.snapshot_id, e.sequence_number, e.file_sequence_number) for e in inherited] == [
        (500, 8, 8),
        (500, 2, 8),  # an explicit data sequence number is kept
        (11, 3, 4),
        (500, 1, 1),
    ]
    assert [e.is_live for e in inherited] == [True, True, True, False]
    live = read_manifest(data, location="m", manifest_file=row, discard_deleted=True)
    assert [e.data_file.file_path for e in live] == [e.data_file.file_path for e in inherited[:3]]


def test_unassigned_manifest_sequence_number_is_not_inherited() -> None:
    data, mf = write([data_file(1, DAY_SPEC)], version=2, spec=DAY_SPEC)
    (entry,) = read_manifest(data, location="m", manifest_file=mf)
    assert entry.sequence_number is None and entry.snapshot_id == 99


def test_v1_sequence_numbers_read_as_zero() -> None:
    data, mf = write([data_file(1, DAY_SPEC)], version=1, spec=DAY_SPEC, fill=entries_of_every_kind)
    entries = read_manifest(data, location="m", manifest_file=committed(mf, 0))
    assert {(e.sequence_number, e.file_sequence_number) for e in entries} == {(0, 0)}
    assert [e.snapshot_id for e in entries] == [99, 99, 11, 99]


def test_v3_first_row_id_inheritance() -> None:
    files = [
        data_file(1, DAY_SPEC),  # ADDED: gets 1000
        data_file(2, DAY_SPEC, first_row_id=7),  # ADDED: the writer clears it, gets 1101
    ]

    def more(writer: ManifestWriter) -> None:
        writer.existing(
            ManifestEntry(
                ManifestEntryStatus.ADDED, 5, 1, 1, data_file(3, DAY_SPEC, first_row_id=3)
            )
        )
        writer.delete(ManifestEntry(ManifestEntryStatus.ADDED, 5, 1, 1, data_file(4, DAY_SPEC)))
        writer.add(data_file(5, DAY_SPEC))

    data, mf = write(files, version=3, spec=DAY_SPEC, fill=more)
    entries = read_manifest(data, location="m", manifest_file=committed(mf, 2, first_row_id=1000))
    counts = [e.data_file.record_count for e in entries]
    assert counts == [101, 102, 103, 104, 105]
    assert [e.data_file.first_row_id for e in entries] == [
        1000,
        1000 + 101,
        3,  # an existing file keeps its id
        1000 + 101 + 102,  # deleted entries take part, so ids never depend on the filter
        1000 + 101 + 102 + 104,
    ]
    live = read_manifest(
        data,
        location="m",
        manifest_file=committed(mf, 2, first_row_id=1000),
        discard_deleted=True,
    )
    assert [e.data_file.first_row_id for e in live][-1] == 1000 + 101 + 102 + 104
    # without a first_row_id in the manifest list row nothing is assigned
    assert read_manifest(data, location="m")[0].data_file.first_row_id is None


# -- the manifest list row -------------------------------------------------------------------


def test_counts_and_min_sequence_number() -> None:
    data, mf = write([data_file(1, DAY_SPEC)], version=2, spec=DAY_SPEC, fill=entries_of_every_kind)
    assert (mf.added_files_count, mf.existing_files_count, mf.deleted_files_count) == (2, 1, 1)
    assert (mf.added_rows_count, mf.existing_rows_count, mf.deleted_rows_count) == (
        101 + 110,
        111,
        112,
    )
    assert mf.sequence_number == UNASSIGNED_SEQ
    assert mf.min_sequence_number == 2  # the deleted entry's 1 does not count
    assert mf.partition_spec_id == DAY_SPEC.spec_id
    assert mf.added_snapshot_id == 99
    assert mf.manifest_length == len(data)
    _, only_new = write([data_file(1, DAY_SPEC)], version=2, spec=DAY_SPEC)
    assert only_new.min_sequence_number == UNASSIGNED_SEQ


def test_partition_summaries_cover_every_entry() -> None:
    files = [data_file(i) for i in range(6)]
    _, mf = write(files, version=2)
    assert mf.partitions is not None and len(mf.partitions) == len(ALL_SPEC.fields)
    ptype = ALL_SPEC.partition_type(SCHEMA)
    for i, (summary, field) in enumerate(zip(mf.partitions, ptype.fields)):
        values = [f.partition[i] for f in files]
        present = [v for v in values if v is not None]
        assert summary.contains_null == (None in values)
        assert summary.contains_nan is False
        if not present:
            assert summary.lower_bound is None and summary.upper_bound is None
            continue
        assert summary.lower_bound is not None and summary.upper_bound is not None
        lower = from_bytes(field.field_type, summary.lower_bound)  # type: ignore[arg-type]
        upper = from_bytes(field.field_type, summary.upper_bound)  # type: ignore[arg-type]
        assert lower in present and upper in present
        if not isinstance(field.field_type, UUIDType | BinaryType | FixedType):
            assert (lower, upper) == (min(present), max(present))


def test_summaries_handle_nulls_nans_and_signed_zeros() -> None:
    spec = PartitionSpec(
        7,
        (
            PartitionField(8, 1000, "dbl", IdentityTransform()),
            PartitionField(3, 1001, "data", IdentityTransform()),
        ),
    )

    def f(i: int, dbl: float | None, s: str | None) -> DataFile:
        return data_file(i, spec, partition=(dbl, s))

    _, mf = write(
        [f(1, -0.0, None), f(2, 0.0, "b"), f(3, math.nan, "a")],
        version=2,
        spec=spec,
        fill=lambda w: w.delete(ManifestEntry(ManifestEntryStatus.ADDED, 1, 1, 1, f(4, -5.0, "z"))),
    )
    assert mf.partitions is not None
    dbl, data = mf.partitions
    assert (dbl.contains_null, dbl.contains_nan) == (False, True)
    assert dbl.lower_bound == struct.pack("<d", -5.0)  # deleted entries count, as in Java
    assert dbl.upper_bound == struct.pack("<d", 0.0)
    assert (data.contains_null, data.lower_bound, data.upper_bound) == (True, b"a", b"z")

    _, zeros = write([f(1, -0.0, "x"), f(2, 0.0, "x")], version=2, spec=spec)
    assert zeros.partitions is not None
    assert zeros.partitions[0].lower_bound == struct.pack("<d", -0.0)
    assert zeros.partitions[0].upper_bound == struct.pack("<d", 0.0)

    _, only_nan = write([f(1, math.nan, None)], version=2, spec=spec)
    assert only_nan.partitions is not None
    assert only_nan.partitions[0].lower_bound is None
    assert only_nan.partitions[0].contains_nan is True


def test_write_manifest_helper_measures_the_stream() -> None:
    out = io.BytesIO(b"prefix")
    out.seek(6)
    mf = write_manifest(
        out,
        [data_file(i, DAY_SPEC) for i in range(3)],
        spec=DAY_SPEC,
        schema=SCHEMA,
        format_version=2,
        snapshot_id=1,
        path="mem://m.avro",
    )
    assert mf.manifest_length == len(out.getvalue()) - 6
    assert len(read_manifest(out.getvalue()[6:], location="mem://m.avro")) == 3


# -- writer errors -----------------------------------------------------------------------------


def new_writer(**kwargs: Any) -> ManifestWriter:
    args: dict[str, Any] = {
        "spec": DAY_SPEC,
        "schema": SCHEMA,
        "format_version": 2,
        "snapshot_id": 1,
    } | kwargs
    return ManifestWriter(io.BytesIO(), **args)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"format_version": 1, "content": ManifestContent.DELETES}, ValidationError, "v1"),
        ({"format_version": 1, "snapshot_id": None}, ValidationError, "snapshot id"),
        ({"format_version": 4}, UnsupportedFormatVersion, "format version 4"),
    ],
)
def test_writer_refuses_invalid_configurations(
    kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        new_writer(**kwargs)


def test_writer_errors_name_the_data_file() -> None:
    writer = new_writer()
    with pytest.raises(ValidationError, match=r"00001\.parquet.*POSITION_DELETES.*data manifest"):
        writer.add(data_file(1, DAY_SPEC, DataFileContent.POSITION_DELETES))
    with pytest.raises(ValidationError, match=r"00002\.parquet.*2 values.*1 fields"):
        writer.add(data_file(2, DAY_SPEC, partition=(1, 2)))
    with pytest.raises(ValidationError, match=r"00003\.parquet.*record_count"):
        writer.add(data_file(3, DAY_SPEC, record_count="many"))
    with pytest.raises(ValidationError, match=r"00004\.parquet.*sequence numbers"):
        writer.existing(
            ManifestEntry(ManifestEntryStatus.ADDED, 1, None, None, data_file(4, DAY_SPEC))
        )
    with pytest.raises(ValidationError, match=r"00005\.parquet.*snapshot id"):
        writer.existing(
            ManifestEntry(ManifestEntryStatus.ADDED, None, 1, 1, data_file(5, DAY_SPEC))
        )
    delete_writer = new_writer(content=ManifestContent.DELETES)
    with pytest.raises(ValidationError, match=r"00006\.parquet.*DATA.*deletes manifest"):
        delete_writer.add(data_file(6, DAY_SPEC))
    spec = PartitionSpec(9, (PartitionField(4, 1000, "price", IdentityTransform()),))
    decimal_writer = new_writer(spec=spec)
    with pytest.raises(ValidationError, match=r"00007\.parquet.*digits after the point"):
        decimal_writer.add(data_file(7, spec, partition=(Decimal("1.005"),)))
    # nothing bad was written: the writer is still usable
    writer.add(data_file(8, DAY_SPEC))
    writer.close()
    with pytest.raises(ValidationError, match="closed"):
        writer.add(data_file(9, DAY_SPEC))
    assert writer.entry_count == 1


def test_rejected_files_leave_no_trace_in_the_manifest() -> None:
    """fastavro fails halfway through a bad record; nothing of it may reach the file."""
    out = io.BytesIO()
    good: list[DataFile] = []
    with ManifestWriter(out, spec=DAY_SPEC, schema=SCHEMA, format_version=2, snapshot_id=1) as w:
        for i in range(300):
            if i % 7 == 3:
                with pytest.raises(ValidationError, match=f"{i:05d}"):
                    w.add(data_file(i, DAY_SPEC, upper_bounds={1: "not bytes"}))
            else:
                good.append(data_file(i, DAY_SPEC))
                w.add(good[-1])
    mf = w.to_manifest_file("m", len(out.getvalue()))
    assert mf.added_files_count == len(good)
    assert [e.data_file for e in read_manifest(out.getvalue(), location="m")] == good


def test_an_exception_inside_the_context_does_not_flush() -> None:
    out = io.BytesIO()
    with (
        pytest.raises(RuntimeError),
        ManifestWriter(out, spec=DAY_SPEC, schema=SCHEMA, format_version=2, snapshot_id=1) as w,
    ):
        w.add(data_file(1, DAY_SPEC))
        raise RuntimeError("boom")
    with pytest.raises(ValidationError, match="closed"):
        w.add(data_file(2, DAY_SPEC))


# -- reader errors -----------------------------------------------------------------------------


def rewrite_header(data: bytes, change: Callable[[dict[str, Any], dict[str, str]], None]) -> bytes:
    """The same file with its header's schema / metadata changed (the blocks are untouched)."""
    meta, end = read_header(data, "m")
    schema = json.loads(meta["avro.schema"])
    change(schema, meta)
    meta["avro.schema"] = json.dumps(schema)
    header = io.BytesIO()
    header.write(b"Obj\x01")
    fastavro.schemaless_writer(
        header,
        fastavro.parse_schema({"type": "map", "values": "bytes"}),
        {k: v.encode() for k, v in meta.items()},
    )
    return header.getvalue() + data[end - 16 :]


def rename_everything(schema: Any) -> None:
    if isinstance(schema, list):
        for s in schema:
            rename_everything(s)
    elif isinstance(schema, dict):
        for f in schema.get("fields", []):
            f["name"] = "x_" + f["name"]
            rename_everything(f["type"])
        for key in ("items", "values", "type"):
            if isinstance(schema.get(key), dict | list):
                rename_everything(schema[key])


@pytest.mark.parametrize("version", [1, 2, 3])
def test_columns_are_resolved_by_field_id_not_by_name(version: int) -> None:
    files = [data_file(i) for i in range(4)]
    data, mf = write(files, version=version)
    renamed = rewrite_header(data, lambda schema, meta: rename_everything(schema))
    assert '"file_path"' not in json.dumps(avro_schema_of(renamed))
    assert [e.data_file for e in read_manifest(renamed, location="m", manifest_file=mf)] == [
        e.data_file for e in read_manifest(data, location="m", manifest_file=mf)
    ]


def foreign_avro(**field_props: Any) -> bytes:
    out = io.BytesIO()
    field = {"name": "name", "type": "string", **field_props}
    schema = {"type": "record", "name": "user", "fields": [field]}
    fastavro.writer(out, schema, [{"name": "x"}], metadata={"schema": "{}", "partition-spec": "[]"})
    return out.getvalue()


def drop_field(record_name: str, field: str) -> Callable[[dict[str, Any], dict[str, str]], None]:
    def change(schema: dict[str, Any], meta: dict[str, str]) -> None:
        def walk(s: Any) -> None:
            if isinstance(s, list):
                for x in s:
                    walk(x)
            elif isinstance(s, dict):
                if s.get("name") == record_name and "fields" in s:
                    for f in s["fields"]:
                        if f["name"] == field:
                            f["name"] = "renamed"
                            del f["field-id"]
                for f in s.get("fields", []):
                    walk(f["type"])
                for key in ("items", "values"):
                    walk(s.get(key))

        walk(schema)

    return change


def set_meta(key: str, value: str | None) -> Callable[[dict[str, Any], dict[str, str]], None]:
    def change(schema: dict[str, Any], meta: dict[str, str]) -> None:
        if value is None:
            del meta[key]
        else:
            meta[key] = value

    return change


def retype(field: str, avro_type: Any) -> Callable[[dict[str, Any], dict[str, str]], None]:
    def change(schema: dict[str, Any], meta: dict[str, str]) -> None:
        df = next(f for f in schema["fields"] if f["name"] == "data_file")["type"]
        next(f for f in df["fields"] if f["name"] == field)["type"] = avro_type

    return change


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (drop_field("r2", "file_path"), "field-id"),
        (set_meta("partition-spec", None), "'partition-spec' is missing"),
        (set_meta("schema", None), "'schema' is missing"),
        (set_meta("format-version", "4"), "format-version 4"),
        (set_meta("format-version", "two"), "format-version 'two'"),
        (set_meta("content", "stuff"), "'content' must be"),
        (set_meta("partition-spec-id", "x"), "partition-spec-id"),
        (retype("record_count", "string"), "103 'record_count' has type string"),
        (retype("file_path", "long"), "100 'file_path' has type long"),
    ],
)
def test_non_iceberg_manifests_raise_invalid_file_errors(
    change: Callable[[dict[str, Any], dict[str, str]], None], message: str
) -> None:
    data, _ = write([data_file(1, DAY_SPEC)], version=2, spec=DAY_SPEC)
    broken = rewrite_header(data, change)
    with pytest.raises((InvalidFileError, UnsupportedFormatVersion), match=message) as info:
        read_manifest(broken, location="s3://bucket/bad.avro")
    assert "s3://bucket/bad.avro" in str(info.value)


def test_foreign_and_broken_files_name_the_location() -> None:
    data, _ = write([data_file(i, DAY_SPEC) for i in range(50)], version=2, spec=DAY_SPEC)
    cases = {
        "foreign": (foreign_avro(), "not an Iceberg manifest: name: .*'field-id'"),
        "other-table": (foreign_avro(**{"field-id": 5}), "field 0 'status' is missing"),
        "truncated": (data[: len(data) - 100], "cannot decode Avro record"),
        "cut-header": (data[:500], "truncated or corrupt Avro header"),
        "empty": (b"", "bad magic"),
        "json": (b'{"not": "avro"}', "bad magic"),
    }
    for name, (payload, message) in cases.items():
        with pytest.raises(InvalidFileError, match=message) as info:
            read_manifest(payload, location=f"s3://bucket/{name}.avro")
        assert info.value.location == f"s3://bucket/{name}.avro"


def test_bad_values_in_entries_name_the_entry() -> None:
    data, _ = write(
        [data_file(1, DAY_SPEC), data_file(2, DAY_SPEC, file_format="csv")],
        version=2,
        spec=DAY_SPEC,
    )
    with pytest.raises(InvalidFileError, match=r"entry 1.*file_format.*csv"):
        read_manifest(data, location="m")


def test_unknown_status_values_are_reported() -> None:
    good, _ = write([data_file(1, DAY_SPEC)], version=2, spec=DAY_SPEC)
    (record,) = fastavro.reader(io.BytesIO(good))
    record["status"] = 7  # type: ignore[index]
    schema = parsed_avro_schema(
        manifest_entry_struct(DAY_SPEC.partition_type(SCHEMA), 2), "manifest_entry"
    )
    out = io.BytesIO()
    fastavro.writer(out, schema, [record], metadata=read_manifest_metadata(good))
    with pytest.raises(InvalidFileError, match=r"entry 0 is malformed: KeyError: 7"):
        read_manifest(out.getvalue(), location="m")


# -- property: any data file survives the round trip -------------------------------------------

int_maps = st.dictionaries(st.integers(1, 2000), st.integers(0, 2**63 - 1), max_size=6)
bytes_maps = st.dictionaries(st.integers(1, 2000), st.binary(max_size=20), max_size=6)
opt = st.none


@st.composite
def data_files(draw: st.DrawFn, content: DataFileContent) -> DataFile:
    i = draw(st.integers(0, 10_000))
    values = row(i)
    values[3] = draw(st.text(max_size=12))
    values[2] = draw(st.integers(-(2**62), 2**62))
    values[4] = Decimal(draw(st.integers(-(10**9), 10**9))).scaleb(-2)
    values[5] = uuid.UUID(int=draw(st.integers(0, 2**128 - 1)))
    values[8] = draw(st.floats(allow_nan=False, allow_infinity=True))
    partition = tuple(
        None if draw(st.integers(0, 9)) == 0 else v for v in partition_of(ALL_SPEC, values)
    )
    return DataFile(
        file_path=draw(st.text(min_size=1, max_size=40)),
        file_format=draw(st.sampled_from(["parquet", "avro", "orc", "puffin"])),
        partition=partition,
        record_count=draw(st.integers(0, 2**63 - 1)),
        file_size_in_bytes=draw(st.integers(0, 2**63 - 1)),
        content=content,
        spec_id=ALL_SPEC.spec_id,
        column_sizes=draw(opt() | int_maps),
        value_counts=draw(opt() | int_maps),
        null_value_counts=draw(opt() | int_maps),
        nan_value_counts=draw(opt() | int_maps),
        lower_bounds=draw(opt() | bytes_maps),
        upper_bounds=draw(opt() | bytes_maps),
        key_metadata=draw(opt() | st.binary(max_size=16)),
        split_offsets=draw(opt() | st.lists(st.integers(0, 2**40), max_size=4).map(sorted)),
        equality_ids=draw(opt() | st.lists(st.integers(1, 100), max_size=3))
        if content != DataFileContent.DATA
        else None,
        sort_order_id=draw(opt() | st.integers(0, 100)),
        referenced_data_file=draw(opt() | st.text(max_size=20)),
        content_offset=draw(opt() | st.integers(0, 2**40)),
        content_size_in_bytes=draw(opt() | st.integers(0, 2**40)),
    )


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    version=st.sampled_from([1, 2, 3]),
    files=st.lists(data_files(DataFileContent.DATA), max_size=8),
)
def test_any_data_files_round_trip(version: int, files: list[DataFile]) -> None:
    data, mf = write(files, version=version)
    entries = read_manifest(data, location="m", manifest_file=committed(mf, 1))
    assert [e.data_file for e in entries] == [expected_after_read(f, version) for f in files]
    assert mf.added_files_count == len(files)
    assert mf.added_rows_count == sum(f.record_count for f in files)


@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    version=st.sampled_from([2, 3]),
    files=st.lists(data_files(DataFileContent.EQUALITY_DELETES), max_size=5),
)
def test_any_delete_files_round_trip(version: int, files: list[DataFile]) -> None:
    data, _ = write(files, version=version, content=ManifestContent.DELETES)
    entries = read_manifest(data, location="m")
    assert [e.data_file for e in entries] == [expected_after_read(f, version) for f in files]


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(files=st.lists(data_files(DataFileContent.DATA), min_size=1, max_size=8))
def test_summaries_never_exclude_a_partition_value(files: list[DataFile]) -> None:
    """Law: every partition value of every entry lies within its field's summary."""
    from icefloe.spec.values import compare

    _, mf = write(files, version=2)
    assert mf.partitions is not None
    ptype = ALL_SPEC.partition_type(SCHEMA)
    for i, (summary, field) in enumerate(zip(mf.partitions, ptype.fields)):
        t = field.field_type
        for f in files:
            v = f.partition[i]
            if v is None:
                assert summary.contains_null
            elif isinstance(v, float) and math.isnan(v):
                assert summary.contains_nan
            else:
                assert summary.lower_bound is not None and summary.upper_bound is not None
                assert compare(t, from_bytes(t, summary.lower_bound), v) <= 0  # type: ignore[arg-type]
                assert compare(t, v, from_bytes(t, summary.upper_bound)) <= 0  # type: ignore[arg-type]


# -- interop with PyIceberg ----------------------------------------------------------------------


def pyiceberg_io() -> Any:
    from pyiceberg.io.pyarrow import PyArrowFileIO

    return PyArrowFileIO()


def to_pyiceberg_spec_and_schema(spec: PartitionSpec) -> tuple[Any, Any]:
    from pyiceberg.partitioning import PartitionSpec as PSpec
    from pyiceberg.schema import Schema as PSchema

    return (
        PSpec.model_validate(spec.to_json()),
        PSchema.model_validate(SCHEMA.to_json()),
    )


INTEROP_SPEC = PartitionSpec(
    2,
    (
        PartitionField(2, 1000, "ts_day", DayTransform()),
        PartitionField(1, 1001, "id_bucket", BucketTransform(8)),
        PartitionField(3, 1002, "data_trunc", TruncateTransform(3)),
        PartitionField(10, 1003, "i", IdentityTransform()),
        PartitionField(4, 1004, "price", IdentityTransform()),
        PartitionField(8, 1005, "dbl", IdentityTransform()),
        PartitionField(15, 1006, "tsl", IdentityTransform()),
        PartitionField(14, 1007, "bin", IdentityTransform()),
        PartitionField(9, 1008, "flag", IdentityTransform()),
    ),
)


def py_partition_values(record: Any) -> tuple[Any, ...]:
    return tuple(record[i] for i in range(len(record)))


@pytest.mark.interop
@pytest.mark.parametrize("version", [1, 2])
def test_icefloe_reads_what_pyiceberg_wrote(version: int, tmp_path: Path) -> None:
    from pyiceberg.manifest import DataFile as PDataFile
    from pyiceberg.manifest import DataFileContent as PContent
    from pyiceberg.manifest import FileFormat as PFormat
    from pyiceberg.manifest import ManifestEntry as PEntry
    from pyiceberg.manifest import ManifestEntryStatus as PStatus
    from pyiceberg.manifest import write_manifest as py_write_manifest
    from pyiceberg.typedef import Record

    pspec, pschema = to_pyiceberg_spec_and_schema(INTEROP_SPEC)
    files = [data_file(i, INTEROP_SPEC) for i in range(10)]
    path = str(tmp_path / "py-manifest.avro")
    with py_write_manifest(
        version, pspec, pschema, pyiceberg_io().new_output(path), 77, "deflate"
    ) as w:
        for f in files:
            df = PDataFile.from_args(
                content=PContent.DATA,
                file_path=f.file_path,
                file_format=PFormat.PARQUET,
                partition=Record(*f.partition),
                record_count=f.record_count,
                file_size_in_bytes=f.file_size_in_bytes,
                column_sizes=f.column_sizes,
                value_counts=f.value_counts,
                null_value_counts=f.null_value_counts,
                nan_value_counts=f.nan_value_counts,
                lower_bounds=f.lower_bounds,
                upper_bounds=f.upper_bounds,
                key_metadata=f.key_metadata,
                split_offsets=f.split_offsets,
                sort_order_id=f.sort_order_id,
            )
            w.add(PEntry.from_args(status=PStatus.ADDED, snapshot_id=77, data_file=df))
    py_mf = w.to_manifest_file()
    data = Path(path).read_bytes()
    row = ManifestFile(
        manifest_path=path,
        manifest_length=len(data),
        partition_spec_id=INTEROP_SPEC.spec_id,
        sequence_number=4,
        min_sequence_number=4,
        added_snapshot_id=77,
    )
    entries = read_manifest(data, location=path, manifest_file=row)
    assert [e.data_file for e in entries] == files
    assert [(e.snapshot_id, e.sequence_number) for e in entries] == [
        (77, 4 if version == 2 else 0)
    ] * len(files)
    # and our summaries agree with PyIceberg's
    _, ours = write(files, version=version, spec=INTEROP_SPEC, snapshot_id=77)
    assert ours.partitions is not None
    assert [
        (s.contains_null, s.contains_nan, s.lower_bound, s.upper_bound) for s in ours.partitions
    ] == [(s.contains_null, s.contains_nan, s.lower_bound, s.upper_bound) for s in py_mf.partitions]
    assert (ours.added_files_count, ours.added_rows_count) == (
        py_mf.added_files_count,
        py_mf.added_rows_count,
    )


@pytest.mark.interop
@pytest.mark.parametrize("version", [1, 2, 3])
def test_pyiceberg_reads_what_icefloe_wrote(version: int, tmp_path: Path) -> None:
    from pyiceberg.manifest import ManifestContent as PManifestContent
    from pyiceberg.manifest import ManifestFile as PManifestFile

    files = [data_file(i, INTEROP_SPEC) for i in range(10)]
    data, _ = write(files, version=version, spec=INTEROP_SPEC, snapshot_id=55)
    path = tmp_path / "icefloe-manifest.avro"
    path.write_bytes(data)
    py_mf = PManifestFile.from_args(
        manifest_path=str(path),
        manifest_length=len(data),
        partition_spec_id=INTEROP_SPEC.spec_id,
        content=PManifestContent.DATA,
        sequence_number=6 if version >= 2 else 0,
        min_sequence_number=6 if version >= 2 else 0,
        added_snapshot_id=55,
    )
    entries = py_mf.fetch_manifest_entry(pyiceberg_io(), discard_deleted=False)
    assert len(entries) == len(files)
    for entry, f in zip(entries, files):
        df = entry.data_file
        assert entry.snapshot_id == 55
        assert entry.sequence_number == (6 if version >= 2 else 0)
        assert df.file_path == f.file_path
        assert str(df.file_format.value).lower() == f.file_format
        assert py_partition_values(df.partition) == f.partition
        assert (df.record_count, df.file_size_in_bytes) == (f.record_count, f.file_size_in_bytes)
        assert df.lower_bounds == f.lower_bounds and df.upper_bounds == f.upper_bounds
        assert df.value_counts == f.value_counts and df.null_value_counts == f.null_value_counts
        assert df.column_sizes == f.column_sizes and df.nan_value_counts == f.nan_value_counts
        assert df.split_offsets == f.split_offsets and df.key_metadata == f.key_metadata
        assert df.sort_order_id == f.sort_order_id
