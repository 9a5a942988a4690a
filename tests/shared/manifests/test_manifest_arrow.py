"""The native Avro readers (DataFusion's, DuckDB's) decode manifests to exactly the columns
the fastavro path makes.

The fastavro path (:func:`icefloe.manifests.manifest.read_manifest`) is the reference; every manifest
shape the writers produce is decoded by each reader and by fastavro and compared column by
column, and :func:`decode_columns` is called directly so a silent fallback cannot make a
comparison vacuous.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import threading
import uuid
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from manifest_fixtures import PRIMITIVE_FIELDS, write_manifest

from hypothesis_budget import examples
from icefloe.avro import arrow as avro_arrow
from icefloe.avro.arrow import READERS
from icefloe.avro.codec import read_header
from icefloe.errors import InvalidFileError
from icefloe.manifests.arrow import ArrowDecodeUnavailable, configured_decoder, decode_columns
from icefloe.manifests.cache import CachedManifest
from icefloe.manifests.cached import same_columns
from icefloe.manifests.manifest import ManifestEntry, ManifestEntryStatus
from icefloe.manifests.manifest_list import ManifestContent, ManifestFile
from icefloe.spec.datafile import DataFile, DataFileContent
from icefloe.spec.partition import PartitionSpec, PartitionSpecBuilder
from icefloe.spec.schema import Schema
from icefloe.spec.types import (
    FixedType,
    NestedField,
    TimestampNanoType,
    TimestamptzType,
    TimeType,
)

SCHEMA = Schema(
    *PRIMITIVE_FIELDS,
    NestedField(12, "tstz", TimestamptzType()),
    NestedField(13, "t", TimeType()),
    NestedField(14, "fx", FixedType(3)),
    NestedField(15, "tsn", TimestampNanoType()),
)
WIDE = (
    PartitionSpecBuilder(SCHEMA)
    .add_field("i", "identity")
    .add_field("l", "bucket[8]")
    .add_field("s", "truncate[2]")
    .add_field("d", "identity")
    .add_field("dt", "identity")
    .add_field("dec", "identity")
    .add_field("u", "identity")
    .add_field("b", "identity")
    .add_field("bin", "identity")
    .add_field("f", "identity")
    .add_field("ts", "identity")
    .add_field("tstz", "hour")
    .add_field("t", "identity")
    .add_field("fx", "identity")
    .add_field("tsn", "identity")
    .build()
)
UNPARTITIONED = PartitionSpec.unpartitioned()
WIDE_VALUES = [
    (3, 1, "ab", -0.0, 19_000, Decimal("2.25"), uuid.UUID(int=7 << 100), True, b"\x00\xff",
     1.5, 1_700_000_000_000_000, 470_000, 3_600_000_000, b"abc", 1_700_000_000_000_000_123),
    (None,) * 15,
    (-4, 7, "é", float("nan"), -3, Decimal("-99.99"), uuid.UUID(int=1), False, b"",
     -0.0, 0, -2, 0, b"\x00\x00\x00", -1),
]  # fmt: skip


def _file(i: int, partition: tuple[object, ...], **extra: object) -> DataFile:
    return DataFile(
        file_path=f"s3://b/t/data/{i:05d}.parquet",
        file_format="PARQUET" if i % 2 else "parquet",
        partition=partition,
        record_count=10 + i,
        file_size_in_bytes=1000 + i,
        column_sizes={1: 10, 2: 20} if i % 3 else None,
        value_counts={1: 10 + i, 2: 10 + i},
        null_value_counts={1: i % 2, 2: 0} if i % 4 else {},
        nan_value_counts={4: 1} if i % 5 == 0 else None,
        lower_bounds={2: (i).to_bytes(8, "little"), 3: b"a"},
        upper_bounds={2: (i + 5).to_bytes(8, "little")} if i % 2 else None,
        key_metadata=b"\x01key" if i % 3 == 0 else None,
        split_offsets=[4, 100] if i % 2 else None,
        sort_order_id=1 if i % 2 else None,
        **extra,  # type: ignore[arg-type]
    )


def _manifest(
    spec: PartitionSpec,
    version: int,
    files: list[DataFile],
    *,
    content: ManifestContent = ManifestContent.DATA,
    sequence_number: int = 9,
    first_row_id: int | None = None,
    existing: list[ManifestEntry] = (),  # type: ignore[assignment]
    deleted: list[ManifestEntry] = (),  # type: ignore[assignment]
) -> tuple[bytes, ManifestFile]:
    return write_manifest(
        [
            *((ManifestEntryStatus.ADDED, f) for f in files),
            *((ManifestEntryStatus.EXISTING, e) for e in existing),
            *((ManifestEntryStatus.DELETED, e) for e in deleted),
        ],
        spec=spec,
        schema=SCHEMA,
        version=version,
        content=content,
        sequence_number=sequence_number,
        first_row_id=first_row_id,
    )


@pytest.fixture(params=READERS)
def reader(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each native reader in turn; ``verify`` (the default reader) is pointed at it too."""
    name: str = request.param
    monkeypatch.setattr("icefloe.avro.arrow.DEFAULT_READER", name)
    return name


def _check(data: bytes, row: ManifestFile, spec: PartitionSpec, reader: str) -> CachedManifest:
    specs = {spec.spec_id: spec}
    partition_type = spec.partition_type(SCHEMA)
    columns, partitions = decode_columns(data, row, spec, partition_type, reader=reader)
    assert len(columns["file_path"]) == len(partitions[0]) if partitions else True
    verified = CachedManifest.decode(data, row, specs, SCHEMA, decoder="verify")
    reference = CachedManifest.decode(data, row, specs, SCHEMA, decoder="fastavro")
    everything = list(range(reference.num_rows))
    # repr: NaN partition values are unequal to themselves, their reprs are not
    assert repr(verified.rows(everything)) == repr(reference.rows(everything))
    return verified


@pytest.mark.parametrize("version", [1, 2, 3])
@pytest.mark.parametrize("spec", [WIDE, UNPARTITIONED], ids=["partitioned", "unpartitioned"])
def test_native_readers_decode_data_manifests_like_fastavro(
    version: int, spec: PartitionSpec, reader: str
) -> None:
    values = WIDE_VALUES if spec is WIDE else [()] * 3
    files = [_file(i, values[i % len(values)]) for i in range(12)]
    data, row = _manifest(spec, version, files)
    cached = _check(data, row, spec, reader)
    assert cached.num_rows == 12
    assert cached.column("file_format").to_pylist()[:2] == ["parquet", "parquet"]


def test_inheritance_of_sequence_numbers_snapshot_ids_and_row_ids(reader: str) -> None:
    files = [_file(i, WIDE_VALUES[0]) for i in range(5)]
    data, row = _manifest(WIDE, 3, files, sequence_number=11, first_row_id=1000)
    cached = _check(data, row, WIDE, reader)
    assert cached.column("data_sequence_number").to_pylist() == [11] * 5
    assert cached.column("snapshot_id").to_pylist() == [42] * 5
    counts = [10 + i for i in range(5)]
    assert cached.column("first_row_id").to_pylist() == [1000 + sum(counts[:i]) for i in range(5)]


def test_existing_and_deleted_entries_keep_their_own_sequence_numbers(reader: str) -> None:
    old = [
        ManifestEntry(ManifestEntryStatus.ADDED, 7, 3, 4, _file(i, WIDE_VALUES[1]))
        for i in range(4)
    ]
    data, row = _manifest(WIDE, 2, [_file(9, WIDE_VALUES[2])], existing=old[:2], deleted=old[2:])
    cached = _check(data, row, WIDE, reader)
    assert cached.column("status").to_pylist() == [1, 0, 0, 2, 2]
    assert cached.column("data_sequence_number").to_pylist() == [9, 3, 3, 3, 3]


@pytest.mark.parametrize("version", [2, 3])
def test_delete_manifests(version: int, reader: str) -> None:
    deletes = [
        _file(0, WIDE_VALUES[0], content=DataFileContent.POSITION_DELETES),
        _file(1, WIDE_VALUES[1], content=DataFileContent.EQUALITY_DELETES, equality_ids=[1, 2]),
    ]
    if version == 3:
        deletes.append(
            _file(
                2,
                WIDE_VALUES[2],
                content=DataFileContent.POSITION_DELETES,
                referenced_data_file="s3://b/t/data/00002.parquet",
                content_offset=4,
                content_size_in_bytes=40,
            )
        )
        deletes[-1] = dataclasses.replace(deletes[-1], file_format="puffin")
    data, row = _manifest(WIDE, version, deletes, content=ManifestContent.DELETES)
    cached = _check(data, row, WIDE, reader)
    assert cached.column("content").to_pylist() == [1, 2, 1][: len(deletes)]


def test_an_unreadable_file_falls_back_to_fastavro_which_names_the_defect(
    caplog: pytest.LogCaptureFixture, reader: str
) -> None:
    data, row = _manifest(WIDE, 2, [_file(i, WIDE_VALUES[0]) for i in range(3)])
    truncated = data[: len(data) - 20]
    with pytest.raises(ArrowDecodeUnavailable, match="truncated"):
        decode_columns(truncated, row, WIDE, WIDE.partition_type(SCHEMA), reader=reader)
    with caplog.at_level(logging.WARNING), pytest.raises(InvalidFileError):
        CachedManifest.decode(truncated, row, {WIDE.spec_id: WIDE}, SCHEMA, decoder=reader)
    assert "decoding s3://b/t/metadata/m.avro with fastavro" in caplog.text


def test_the_decoder_setting_is_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ICEFLOE_MANIFEST_DECODER", "Verify")
    assert configured_decoder() == "verify"
    monkeypatch.setenv("ICEFLOE_MANIFEST_DECODER", "fast")
    with pytest.raises(Exception, match="ICEFLOE_MANIFEST_DECODER must be one of"):
        configured_decoder()


@pytest.fixture
def fresh_readers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forget the loaded readers (per thread) and the ones found unavailable, for this test."""
    monkeypatch.setattr(avro_arrow, "_local", threading.local())
    monkeypatch.setattr(avro_arrow, "_unavailable", {})
    monkeypatch.setattr(avro_arrow, "_duckdb", None)


@pytest.mark.usefixtures("fresh_readers")
def test_without_datafusion_duckdb_decodes_and_without_both_fastavro_does(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    data, row = _manifest(WIDE, 2, [_file(i, WIDE_VALUES[i % 3]) for i in range(6)])
    specs = {WIDE.spec_id: WIDE}
    reference = CachedManifest.decode(data, row, specs, SCHEMA, decoder="fastavro")
    everything = list(range(reference.num_rows))
    monkeypatch.setitem(sys.modules, "datafusion", None)  # `import datafusion` fails
    with caplog.at_level(logging.WARNING):
        by_duckdb = CachedManifest.decode(data, row, specs, SCHEMA, decoder="datafusion")
    assert "the datafusion Avro reader is unavailable: ModuleNotFoundError" in caplog.text
    assert "with fastavro" not in caplog.text
    assert by_duckdb.partition_column(0) is not None  # decoded to Arrow, not by fastavro
    assert repr(by_duckdb.rows(everything)) == repr(reference.rows(everything))
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        CachedManifest.decode(data, row, specs, SCHEMA, decoder="datafusion")
    assert not caplog.text  # said once, not for every manifest

    monkeypatch.setitem(sys.modules, "duckdb", None)
    monkeypatch.setattr(avro_arrow, "_local", threading.local())
    monkeypatch.setattr(avro_arrow, "_duckdb", None)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        by_fastavro = CachedManifest.decode(data, row, specs, SCHEMA, decoder="datafusion")
    assert "the duckdb Avro reader is unavailable: ModuleNotFoundError" in caplog.text
    assert "decoding" not in caplog.text  # no reader failed on the file itself
    assert repr(by_fastavro.rows(everything)) == repr(reference.rows(everything))


def test_the_blocks_are_counted_and_a_damaged_sync_marker_is_caught() -> None:
    data, row = _manifest(WIDE, 2, [_file(i, WIDE_VALUES[0]) for i in range(40)])
    _, start = read_header(data, row.manifest_path)
    assert avro_arrow.record_count(data, start, row.manifest_path) == 40
    damaged = bytearray(data)
    damaged[-1] ^= 0xFF  # the last block's sync marker
    with pytest.raises(ArrowDecodeUnavailable, match="lacks its sync marker"):
        avro_arrow.record_count(bytes(damaged), start, row.manifest_path)
    for reader in READERS:
        with pytest.raises(ArrowDecodeUnavailable, match="sync marker"):
            avro_arrow.read_avro_table(bytes(damaged), row.manifest_path, reader)


def test_only_fields_of_empty_records_are_dropped_for_datafusion() -> None:
    data, row = _manifest(UNPARTITIONED, 2, [_file(i, ()) for i in range(3)])
    table = avro_arrow.read_avro_table(data, row.manifest_path, "datafusion")
    data_file = table.schema.field("data_file").type
    names = [data_file.field(i).name for i in range(data_file.num_fields)]
    assert "partition" not in names and "file_path" in names and table.num_rows == 3
    in_union = {"type": "record", "name": "r", "fields": [
        {"name": "u", "type": ["null", {"type": "record", "name": "e", "fields": []}]},
    ]}  # fmt: skip
    with pytest.raises(ArrowDecodeUnavailable, match="a union holds a record with no fields"):
        avro_arrow._without_empty_records(in_union, "m.avro")


# -- the law, on generated manifests ---------------------------------------------------------

_FIELD_IDS = st.integers(1, 15)
_DELETE_KINDS = (DataFileContent.POSITION_DELETES, DataFileContent.EQUALITY_DELETES)


@st.composite
def _generated_manifest(draw: st.DrawFn) -> tuple[bytes, ManifestFile, PartitionSpec]:
    """A manifest of any version and content whose entries have any mix of statuses, null and
    empty metric maps, absent optional fields, and partition values with nulls and NaNs."""
    version = draw(st.sampled_from([1, 2, 3]))
    spec = draw(st.sampled_from([WIDE, UNPARTITIONED]))
    deletes = version >= 2 and draw(st.booleans())

    def metrics(values: st.SearchStrategy[Any]) -> Any:
        return draw(st.none() | st.dictionaries(_FIELD_IDS, values, max_size=4))

    files = []
    for i in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(_DELETE_KINDS)) if deletes else DataFileContent.DATA
        equality = kind == DataFileContent.EQUALITY_DELETES
        files.append(
            DataFile(
                file_path=f"s3://b/t/data/{i:05d}-{draw(st.text(max_size=3))}.parquet",
                file_format=draw(st.sampled_from(["PARQUET", "parquet", "AVRO", "orc"])),
                partition=draw(st.sampled_from(WIDE_VALUES)) if spec is WIDE else (),
                record_count=draw(st.integers(0, 1 << 40)),
                file_size_in_bytes=draw(st.integers(0, 1 << 40)),
                content=kind,
                column_sizes=metrics(st.integers(0, 1 << 40)),
                value_counts=metrics(st.integers(10, 1 << 40)),
                null_value_counts=metrics(st.integers(0, 10)),
                nan_value_counts=metrics(st.integers(0, 10)),
                lower_bounds=metrics(st.binary(max_size=9)),
                upper_bounds=metrics(st.binary(max_size=9)),
                key_metadata=draw(st.none() | st.binary(max_size=5)),
                split_offsets=draw(st.none() | st.lists(st.integers(0, 1 << 40)).map(sorted)),
                equality_ids=draw(st.lists(_FIELD_IDS, min_size=1)) if equality else None,
                sort_order_id=draw(st.none() | st.integers(0, 3)),
                first_row_id=draw(st.none() | st.integers(0, 1 << 40)) if version >= 3 else None,
            )
        )
    statuses = draw(st.lists(st.sampled_from(ManifestEntryStatus), min_size=len(files)))
    sequences = st.integers(0, 100) if version >= 2 else st.none()
    entries: list[tuple[ManifestEntryStatus, DataFile | ManifestEntry]] = []
    for status, f in zip(statuses, files):
        if status == ManifestEntryStatus.ADDED:
            entries.append((status, f))
        else:
            snapshot = draw(st.integers(1, 1 << 62))
            entries.append(
                (status, ManifestEntry(status, snapshot, draw(sequences), draw(sequences), f))
            )
    data, row = write_manifest(
        entries,
        spec=spec,
        schema=SCHEMA,
        version=version,
        content=ManifestContent.DELETES if deletes else ManifestContent.DATA,
        sequence_number=draw(st.integers(0, 1000)),
        first_row_id=draw(st.none() | st.integers(0, 1 << 40)) if version >= 3 else None,
    )
    return data, row, spec


@settings(max_examples=examples(25), deadline=None)
@given(generated=_generated_manifest())
def test_every_native_reader_decodes_any_manifest_as_fastavro_does(
    generated: tuple[bytes, ManifestFile, PartitionSpec],
) -> None:
    data, row, spec = generated
    partition_type = spec.partition_type(SCHEMA)
    reference = CachedManifest.decode(data, row, {spec.spec_id: spec}, SCHEMA, decoder="fastavro")
    everything = list(range(reference.num_rows))
    for native_reader in READERS:
        # decode_columns itself, so a silent fallback to fastavro cannot pass for the reader
        columns, partitions = decode_columns(data, row, spec, partition_type, reader=native_reader)
        native = CachedManifest(row, spec, partition_type, columns, partitions, None)
        same_columns(native, reference)  # every column, its type and its values
        assert repr(native.rows(everything)) == repr(reference.rows(everything))
