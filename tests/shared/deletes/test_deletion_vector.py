"""Deletion vectors: the 64-bit portable Roaring format in its ``deletion-vector-v1`` blob."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples
from icefloe.deletes.deletion_vector import (
    MAX_POSITION,
    DeletionVector,
    build_deletion_vector_file,
    dv_from_puffin,
    vectors_in_puffin,
)
from icefloe.deletes.puffin import read_footer
from icefloe.errors import InvalidFileError, ValidationError
from icefloe.spec.datafile import DataFile, DataFileContent

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "java"

# Positions spread over several 32-bit keys, with dense runs (run and bitmap containers).
positions = st.one_of(
    st.integers(0, 70_000),
    st.integers(0, 3).map(lambda k: k << 32).flatmap(lambda h: st.integers(h, h + 200_000)),
    st.integers(0, MAX_POSITION),
)
position_sets = st.one_of(
    st.sets(positions, max_size=300),
    st.tuples(st.integers(0, 1 << 33), st.integers(1, 20_000)).map(
        lambda t: set(range(t[0], t[0] + t[1]))
    ),
)


@settings(max_examples=examples(150), deadline=None)
@given(position_sets)
def test_positions_blob_positions_round_trip(ps: set[int]) -> None:
    dv = DeletionVector.from_positions(ps)
    assert len(dv) == len(ps)
    assert dv.last() == (max(ps) if ps else None)
    # From a numpy array in any order (one bucket or several): the same vector.
    assert DeletionVector.from_array(np.array(sorted(ps, reverse=True), dtype=np.uint64)) == dv
    blob = dv.to_blob()
    back = DeletionVector.from_blob(blob)
    assert list(back) == sorted(ps)
    assert back == dv
    assert back.to_blob() == blob  # serialization is canonical


@settings(max_examples=examples(60), deadline=None)
@given(st.sets(st.integers(0, 5000), max_size=200), st.sets(st.integers(0, 5000), max_size=200))
def test_union_is_set_union(a: set[int], b: set[int]) -> None:
    merged = DeletionVector.from_positions(a).union(DeletionVector.from_positions(b))
    assert list(merged) == sorted(a | b)


@settings(max_examples=examples(60), deadline=None)
@given(st.sets(st.integers(0, 3000), max_size=300), st.integers(0, 1500), st.integers(0, 2000))
def test_deleted_mask_matches_membership(ps: set[int], offset: int, n: int) -> None:
    dv = DeletionVector.from_positions(ps)
    mask = dv.deleted_mask(n, offset)
    assert mask.tolist() == [(offset + i) in ps for i in range(n)]


def test_java_written_blob_decodes_and_reencodes_byte_for_byte() -> None:
    data = (FIXTURES / "dv-positions-1.puffin").read_bytes()
    footer = read_footer(data, "java.puffin")
    assert footer.properties["created-by"].startswith("Apache Iceberg 1.10.2")
    (blob,) = footer.blobs
    assert blob.type == "deletion-vector-v1"
    assert blob.fields == (2147483645,)
    raw = data[blob.offset : blob.offset + blob.length]
    dv = DeletionVector.from_blob(raw)
    assert list(dv) == [1]
    assert dv.to_blob() == raw
    (ref,) = vectors_in_puffin(data, "java.puffin")
    assert ref == blob.properties["referenced-data-file"]


def _blob(vector: bytes) -> bytes:
    body = b"\xd1\xd3\x39\x64" + vector
    return struct.pack(">I", len(body)) + body + struct.pack(">I", zlib.crc32(body))


@pytest.mark.parametrize(
    ("blob", "message"),
    [
        (b"\x00" * 5, "blob of 5 bytes"),
        (DeletionVector.from_positions([1]).to_blob()[:-1], "says"),
        (b"\x00\x00\x00\x0c" + b"\xd1\xd3\x39\x65" + b"\x00" * 8 + b"\x00" * 4, "magic"),
        (DeletionVector.from_positions([1, 2]).to_blob()[:-4] + b"\x00\x00\x00\x00", "CRC"),
        (_blob(b"\x01" + b"\x00" * 7), "truncated"),
        (_blob(struct.pack("<QI", 1, 0) + b"\x00\x00\x00\x00"), "cookie"),
        (_blob(struct.pack("<Q", 0) + b"junk"), "trailing"),
        (
            _blob(
                struct.pack("<QI", 2, 5)
                + DeletionVector.from_positions([1]).serialize()[12:]
                + struct.pack("<I", 1)
                + DeletionVector.from_positions([1]).serialize()[12:]
            ),
            "ascending",
        ),
    ],
)
def test_malformed_blobs_are_refused_with_a_reason(blob: bytes, message: str) -> None:
    with pytest.raises(InvalidFileError, match=message):
        DeletionVector.from_blob(blob, "t.puffin")


@pytest.mark.parametrize("bad", [[-1], [MAX_POSITION + 1]])
def test_out_of_range_positions_are_refused(bad: list[int]) -> None:
    with pytest.raises(ValidationError, match="position"):
        DeletionVector.from_positions(bad)


def _data_file(path: str, partition: tuple[object, ...] = (), spec_id: int = 0) -> DataFile:
    return DataFile(path, "parquet", partition, 100, 1000, spec_id=spec_id)


def test_puffin_file_holds_one_blob_per_data_file_with_matching_entries() -> None:
    a, b = _data_file("s3://b/a.parquet", (1,), 1), _data_file("s3://b/b.parquet", (2,), 1)
    built = build_deletion_vector_file(
        "s3://b/d.puffin",
        [
            (a, DeletionVector.from_positions([0, 5])),
            (b, DeletionVector.from_positions(range(40))),
            (_data_file("s3://b/empty.parquet"), DeletionVector()),
        ],
    )
    assert [e.referenced_data_file for e in built.entries] == [a.file_path, b.file_path]
    for entry, df in zip(built.entries, (a, b)):
        assert entry.content == DataFileContent.POSITION_DELETES
        assert entry.file_format == "puffin"
        assert (entry.spec_id, entry.partition) == (df.spec_id, df.partition)
        assert entry.file_size_in_bytes == len(built.data)
    assert [e.record_count for e in built.entries] == [2, 40]
    assert list(dv_from_puffin(built.data, built.entries[1])) == list(range(40))
    footer = read_footer(built.data, "d.puffin")
    assert [(m.offset, m.length) for m in footer.blobs] == [
        (e.content_offset, e.content_size_in_bytes) for e in built.entries
    ]
    assert vectors_in_puffin(built.data, "d.puffin")[a.file_path] == DeletionVector.from_positions(
        [0, 5]
    )


def test_entry_whose_count_disagrees_with_the_blob_is_refused() -> None:
    a = _data_file("a.parquet")
    built = build_deletion_vector_file("d.puffin", [(a, DeletionVector.from_positions([3]))])
    wrong = built.entries[0].copy(record_count=2)
    with pytest.raises(InvalidFileError, match="cardinality"):
        dv_from_puffin(built.data, wrong)
    outside = built.entries[0].copy(content_offset=len(built.data))
    with pytest.raises(InvalidFileError, match="outside"):
        dv_from_puffin(built.data, outside)


def test_from_array_matches_from_positions() -> None:
    arr = np.array([7, 1 << 32, 3], dtype=np.int64)
    assert DeletionVector.from_array(arr) == DeletionVector.from_positions([3, 7, 1 << 32])
