"""Parquet data files: metrics from the footer, partitioning, rolling, reading by field id."""

from __future__ import annotations

import io
import json
import math
import os
import re
import struct
import uuid
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples
from icefloe.arrow.schema import field_id_of, from_arrow_array, to_arrow_array
from icefloe.errors import InvalidFileError, ValidationError
from icefloe.io.fileio import LocalFileIO
from icefloe.parquet.files import (
    MemoryOutputs,
    ParquetFileWriter,
    partition_table,
    read_data_file,
    write_data_file,
    write_files,
    write_partitioned,
)
from icefloe.parquet.metrics import compute_metrics
from icefloe.parquet.options import MetricsConfig, MetricsMode, ParquetWriteOptions
from icefloe.spec.datafile import DataFile
from icefloe.spec.partition import PartitionField, PartitionSpec
from icefloe.spec.schema import Schema
from icefloe.spec.sort_order import NullOrder, SortDirection, SortField, SortOrder
from icefloe.spec.transforms import (
    BucketTransform,
    DayTransform,
    HourTransform,
    IdentityTransform,
    MonthTransform,
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
    ListType,
    LongType,
    MapType,
    NestedField,
    PrimitiveType,
    StringType,
    StructType,
    TimestampNanoType,
    TimestampType,
    TimestamptzNanoType,
    TimestamptzType,
    TimeType,
    UUIDType,
)
from icefloe.spec.values import compare, from_bytes, truncate_lower_bound, truncate_upper_bound


def _write(
    table: pa.Table, schema: Schema, properties: dict[str, str] | None = None, **kwargs: Any
) -> tuple[DataFile, bytes]:
    buf = io.BytesIO()
    df = write_data_file(
        table,
        buf,
        schema=schema,
        properties=properties or {},
        file_path="s3://bucket/t/data/f.parquet",
        **kwargs,
    )
    return df, buf.getvalue()


def _footer(data: bytes) -> pq.FileMetaData:
    return pq.ParquetFile(pa.BufferReader(data)).metadata


def _same(a: Any, b: Any) -> bool:
    """Equality that treats NaN as equal to itself and tells -0.0 from +0.0."""
    if isinstance(a, float) and isinstance(b, float):
        return struct.pack("<d", a) == struct.pack("<d", b) or (math.isnan(a) and math.isnan(b))
    return bool(a == b)


# ---------------------------------------------------------------------------------------
# Metrics for every primitive type, checked against values computed from the data
# ---------------------------------------------------------------------------------------

_ALL_TYPES: list[tuple[PrimitiveType, st.SearchStrategy[Any]]] = [
    (BooleanType(), st.booleans()),
    (IntegerType(), st.integers(-(2**31), 2**31 - 1)),
    (LongType(), st.integers(-(2**63), 2**63 - 1)),
    (FloatType(), st.floats(width=32)),
    (DoubleType(), st.floats()),
    (DecimalType(9, 2), st.decimals(Decimal("-9999999.99"), Decimal("9999999.99"), places=2)),
    (DecimalType(18, 4), st.decimals(Decimal("-1e13") + 1, Decimal("1e13") - 1, places=4)),
    (DecimalType(38, 5), st.decimals(Decimal("-1e32") + 1, Decimal("1e32") - 1, places=5)),
    (DateType(), st.integers(-(2**31), 2**31 - 1)),
    (TimeType(), st.integers(0, 86_400_000_000 - 1)),
    (TimestampType(), st.integers(-(2**63), 2**63 - 1)),
    (TimestamptzType(), st.integers(-(2**63), 2**63 - 1)),
    (TimestampNanoType(), st.integers(-(2**63), 2**63 - 1)),
    (TimestamptzNanoType(), st.integers(-(2**63), 2**63 - 1)),
    (StringType(), st.text(max_size=40)),
    (UUIDType(), st.uuids()),
    (FixedType(5), st.binary(min_size=5, max_size=5)),
    (BinaryType(), st.binary(max_size=40)),
]
_WIDE_SCHEMA = Schema(*(NestedField(i + 1, f"c{i + 1}", t) for i, (t, _) in enumerate(_ALL_TYPES)))


@st.composite
def _wide_rows(draw: st.DrawFn) -> dict[str, list[Any]]:
    n = draw(st.integers(1, 25))
    return {
        f"c{i + 1}": draw(st.lists(st.none() | values, min_size=n, max_size=n))
        for i, (_, values) in enumerate(_ALL_TYPES)
    }


def _table_from_internal(schema: Schema, columns: dict[str, list[Any]]) -> pa.Table:
    return pa.table({f.name: to_arrow_array(f.field_type, columns[f.name]) for f in schema.fields})


def _check_bounds(
    t: PrimitiveType, values: list[Any], df: DataFile, fid: int, width: int | None
) -> None:
    present = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if not present:
        assert fid not in df.lower_bounds and fid not in df.upper_bounds
        return
    lo, hi = present[0], present[0]
    for v in present[1:]:
        lo = v if compare(t, v, lo) < 0 else lo
        hi = v if compare(t, v, hi) > 0 else hi
    lower = from_bytes(t, df.lower_bounds[fid])
    if isinstance(t, (FloatType, DoubleType)):
        # -0.0 and +0.0 are interchangeable as values but not as bounds: the law is that
        # the bounds bracket every value in the total order where -0.0 < +0.0.
        upper = from_bytes(t, df.upper_bounds[fid])
        assert lower == lo and upper == hi
        assert all(compare(t, lower, v) <= 0 <= compare(t, upper, v) for v in present)
        return
    if width is not None and isinstance(t, (StringType, BinaryType)):
        assert lower == truncate_lower_bound(t, lo, width)
        expected_upper = truncate_upper_bound(t, hi, width)
        if expected_upper is None:
            assert fid not in df.upper_bounds
        else:
            assert from_bytes(t, df.upper_bounds[fid]) == expected_upper
        return
    assert lower == lo
    assert from_bytes(t, df.upper_bounds[fid]) == hi


@settings(max_examples=examples(30), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_wide_rows())
def test_footer_metrics_match_the_data_for_every_primitive_type(
    columns: dict[str, list[Any]],
) -> None:
    table = _table_from_internal(_WIDE_SCHEMA, columns)
    df, data = _write(table, _WIDE_SCHEMA)
    n = table.num_rows
    assert df.record_count == n
    assert df.file_size_in_bytes == len(data)
    assert df.file_format == "parquet"
    assert df.lower_bounds is not None and df.upper_bounds is not None
    footer = _footer(data)
    assert df.split_offsets is not None and len(df.split_offsets) == footer.num_row_groups
    sizes: Counter[int] = Counter()
    for g in range(footer.num_row_groups):
        for c in range(footer.num_columns):
            sizes[c + 1] += footer.row_group(g).column(c).total_compressed_size
    assert df.column_sizes == dict(sizes)
    for i, (t, _) in enumerate(_ALL_TYPES):
        fid = i + 1
        values = columns[f"c{fid}"]
        assert df.value_counts[fid] == n
        assert df.null_value_counts is not None
        assert df.null_value_counts[fid] == sum(v is None for v in values)
        if isinstance(t, (FloatType, DoubleType)):
            assert df.nan_value_counts is not None
            expected_nans = sum(isinstance(v, float) and math.isnan(v) for v in values)
            assert df.nan_value_counts[fid] == expected_nans
        _check_bounds(t, values, df, fid, 16)
    # and the file reads back to the same values
    back = read_data_file(data, _WIDE_SCHEMA)
    for f in _WIDE_SCHEMA.fields:
        assert isinstance(f.field_type, PrimitiveType)
        got = from_arrow_array(f.field_type, back.column(f.name))
        assert all(_same(a, b) for a, b in zip(got, columns[f.name], strict=True))


def test_field_ids_on_every_parquet_field() -> None:
    schema = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "s", StructType(NestedField(3, "x", IntegerType()))),
        NestedField(4, "l", ListType(5, StringType(), element_required=False)),
        NestedField(6, "m", MapType(7, StringType(), 8, DoubleType(), value_required=False)),
    )
    table = pa.table(
        {
            "id": [1],
            "s": [{"x": 1}],
            "l": [["a"]],
            "m": pa.array([[("k", 1.0)]], pa.map_(pa.string(), pa.float64())),
        }
    )
    _, data = _write(table, schema)
    pf = pq.ParquetFile(pa.BufferReader(data))
    # The Parquet schema itself (not the stored Arrow schema) carries the ids.
    from_parquet = pf.metadata.schema.to_arrow_schema()
    ids: list[int | None] = []

    def walk(f: pa.Field) -> None:
        ids.append(field_id_of(f))
        t = f.type
        if pa.types.is_struct(t):
            for i in range(t.num_fields):
                walk(t.field(i))
        elif pa.types.is_map(t):
            walk(t.key_field)
            walk(t.item_field)
        elif pa.types.is_list(t) or pa.types.is_large_list(t):
            walk(t.value_field)

    for f in from_parquet:
        walk(f)
    assert ids == [1, 2, 3, 4, 5, 6, 7, 8]
    text = str(pf.schema)
    for fid in range(1, 9):
        assert f"field_id={fid} " in text
    assert "required int64 field_id=1 id" in text
    assert json.loads(pf.metadata.metadata[b"iceberg.schema"]) == schema.to_json()


def test_decimal_physical_types_follow_the_spec() -> None:
    schema = Schema(
        NestedField(1, "a", DecimalType(9, 2)),
        NestedField(2, "b", DecimalType(18, 2)),
        NestedField(3, "c", DecimalType(19, 2)),
    )
    d = Decimal("1.50")
    table = pa.table({"a": [d], "b": [d], "c": [d]})
    _, data = _write(table, schema)
    footer = _footer(data)
    physical = [footer.row_group(0).column(i).physical_type for i in range(3)]
    assert physical == ["INT32", "INT64", "FIXED_LEN_BYTE_ARRAY"]


# ---------------------------------------------------------------------------------------
# Metrics modes
# ---------------------------------------------------------------------------------------

_MODE_SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "name", StringType()),
    NestedField(3, "blob", BinaryType()),
    NestedField(4, "score", DoubleType()),
)
_MODE_TABLE = pa.table(
    {
        "id": [3, 1, 2],
        "name": ["alphabet soup is long", "zzzz", None],
        "blob": [b"\x00" * 20, b"\xff" * 20, b"\x10"],
        "score": [1.0, float("nan"), None],
    }
)


def test_default_truncates_strings_and_binary_to_16() -> None:
    df, _ = _write(_MODE_TABLE, _MODE_SCHEMA)
    assert df.lower_bounds is not None and df.upper_bounds is not None
    assert df.lower_bounds[2] == b"alphabet soup is"
    assert df.upper_bounds[2] == b"zzzz"
    assert df.lower_bounds[3] == b"\x00" * 16
    # no 16-byte upper bound exists for twenty 0xFF bytes
    assert 3 not in df.upper_bounds
    assert df.nan_value_counts == {4: 1}
    assert from_bytes(DoubleType(), df.upper_bounds[4]) == 1.0


def test_metrics_modes_per_column() -> None:
    props = {
        "write.metadata.metrics.default": "counts",
        "write.metadata.metrics.column.id": "full",
        "write.metadata.metrics.column.name": "truncate(3)",
        "write.metadata.metrics.column.blob": "none",
        "write.metadata.metrics.column.dropped_long_ago": "full",
    }
    df, _ = _write(_MODE_TABLE, _MODE_SCHEMA, props)
    assert set(df.column_sizes or {}) == {1, 2, 3, 4}
    assert set(df.value_counts or {}) == {1, 2, 4}
    assert set(df.null_value_counts or {}) == {1, 2, 4}
    assert df.nan_value_counts == {4: 1}
    assert df.lower_bounds == {1: (1).to_bytes(8, "little"), 2: b"alp"}
    assert df.upper_bounds == {
        1: (3).to_bytes(8, "little"),
        2: b"zz{",
    }  # "zzz" + 1 at the last place


def test_full_mode_keeps_long_values() -> None:
    props = {"write.metadata.metrics.default": "full"}
    df, _ = _write(_MODE_TABLE, _MODE_SCHEMA, props)
    assert df.lower_bounds is not None and df.upper_bounds is not None
    assert df.lower_bounds[2] == b"alphabet soup is long"
    assert df.upper_bounds[3] == b"\xff" * 20


def test_invalid_metrics_mode_names_the_property() -> None:
    with pytest.raises(ValidationError, match=r"write\.metadata\.metrics\.column\.name"):
        _write(_MODE_TABLE, _MODE_SCHEMA, {"write.metadata.metrics.column.name": "truncate(0)"})
    assert MetricsMode.parse(" Truncate( 8 ) ") == MetricsMode.parse("truncate(8)")


def test_inferred_defaults_stop_after_the_column_limit_unless_default_is_set() -> None:
    props = {"write.metadata.metrics.max-inferred-column-defaults": "2"}
    cfg = MetricsConfig.from_properties(_MODE_SCHEMA, props)
    assert [str(cfg.mode(i)) for i in (1, 2, 3, 4)] == [
        "truncate(16)",
        "truncate(16)",
        "none",
        "none",
    ]
    explicit = MetricsConfig.from_properties(
        _MODE_SCHEMA, {**props, "write.metadata.metrics.default": "full"}
    )
    assert {str(explicit.mode(i)) for i in (1, 2, 3, 4)} == {"full"}


def test_sort_order_columns_get_at_least_truncated_bounds() -> None:
    order = SortOrder(
        1, (SortField(2, IdentityTransform(), SortDirection.ASC, NullOrder.NULLS_FIRST),)
    )
    props = {"write.metadata.metrics.default": "none"}
    df, _ = _write(_MODE_TABLE, _MODE_SCHEMA, props, sort_order=order)
    assert df.sort_order_id == 1
    assert df.lower_bounds == {2: b"alphabet soup is"}
    assert set(df.value_counts or {}) == {2}


def test_all_nan_and_all_null_columns_have_counts_but_no_bounds() -> None:
    schema = Schema(NestedField(1, "f", FloatType()), NestedField(2, "g", DoubleType()))
    table = pa.table(
        {
            "f": pa.array([float("nan"), float("nan")], pa.float32()),
            "g": pa.array([None, None], pa.float64()),
        }
    )
    df, _ = _write(table, schema)
    assert df.nan_value_counts == {1: 2, 2: 0}
    assert df.null_value_counts == {1: 0, 2: 2}
    assert df.value_counts == {1: 2, 2: 2}
    assert df.lower_bounds == {} and df.upper_bounds == {}


def test_signed_zeros_are_bracketed_in_total_order() -> None:
    # Spec: -0.0 precedes +0.0 for bounds. A zero bound is widened to -0.0 (lower) and
    # +0.0 (upper), so it holds whichever zeros the column has.
    schema = Schema(NestedField(1, "pos", DoubleType()), NestedField(2, "neg", FloatType()))
    table = pa.table(
        {"pos": [0.0, 1.0], "neg": pa.array([-0.0, -1.0, float("nan")], pa.float32())[:2]}
    )
    df, _ = _write(table, schema)
    assert df.lower_bounds is not None and df.upper_bounds is not None
    lower_pos = from_bytes(DoubleType(), df.lower_bounds[1])
    upper_neg = from_bytes(FloatType(), df.upper_bounds[2])
    assert (lower_pos, math.copysign(1.0, lower_pos)) == (0.0, -1.0)
    assert (upper_neg, math.copysign(1.0, upper_neg)) == (0.0, 1.0)
    assert compare(DoubleType(), lower_pos, 0.0) <= 0
    assert compare(FloatType(), upper_neg, -0.0) >= 0


def test_values_beyond_the_parquet_statistics_limit_still_get_bounds() -> None:
    # parquet-cpp drops min/max for values over 4 KiB; the writer falls back to the data.
    schema = Schema(NestedField(1, "doc", StringType()), NestedField(2, "raw", BinaryType()))
    table = pa.table({"doc": ["b" * 10_000, "a" + "z" * 9_000], "raw": [b"\x01" * 5000, b"\x02"]})
    df, data = _write(table, schema)
    assert not _footer(data).row_group(0).column(0).statistics.has_min_max
    assert df.lower_bounds == {1: b"a" + b"z" * 15, 2: b"\x01" * 16}
    assert df.upper_bounds == {1: b"b" * 15 + b"c", 2: b"\x02"}


def test_nested_struct_leaves_have_bounds_list_and_map_leaves_only_counts() -> None:
    schema = Schema(
        NestedField(1, "s", StructType(NestedField(2, "x", IntegerType()))),
        NestedField(3, "l", ListType(4, IntegerType(), element_required=False)),
        NestedField(5, "m", MapType(6, StringType(), 7, FloatType(), value_required=False)),
    )
    table = pa.table(
        {
            "s": [{"x": 5}, None, {"x": -2}],
            "l": [[1, 2], None, [None]],
            "m": pa.array([[("a", float("nan"))], [], None], pa.map_(pa.string(), pa.float32())),
        }
    )
    df, _ = _write(table, schema)
    assert df.lower_bounds == {2: (-2).to_bytes(4, "little", signed=True)}
    assert df.upper_bounds == {2: (5).to_bytes(4, "little", signed=True)}
    assert df.value_counts == {2: 3, 4: 4, 6: 3, 7: 3}
    assert df.null_value_counts == {2: 1, 4: 2, 6: 2, 7: 2}
    assert df.nan_value_counts == {7: 1}


def test_row_groups_split_offsets_and_bounds_aggregate() -> None:
    schema = Schema(
        NestedField(1, "n", LongType(), required=True), NestedField(2, "s", StringType())
    )
    table = pa.table({"n": list(range(100, 0, -1)), "s": [f"v{i:03d}" for i in range(100)]})
    df, data = _write(table, schema, {"write.parquet.row-group-limit": "30"})
    footer = _footer(data)
    assert footer.num_row_groups == 4
    assert df.split_offsets is not None and df.split_offsets == sorted(df.split_offsets)
    assert len(set(df.split_offsets)) == 4
    assert df.split_offsets[0] == 4  # right after the "PAR1" magic
    assert df.lower_bounds == {1: (1).to_bytes(8, "little"), 2: b"v000"}
    assert df.upper_bounds == {1: (100).to_bytes(8, "little"), 2: b"v099"}
    assert df.value_counts == {1: 100, 2: 100}


def test_row_group_size_bytes_bounds_row_groups() -> None:
    table = pa.table({"n": pa.array(range(10_000), pa.int64())})
    options = ParquetWriteOptions.from_properties({"write.parquet.row-group-size-bytes": "8000"})
    assert options.rows_per_row_group(table) == 1000
    schema = Schema(NestedField(1, "n", LongType()))
    _, data = _write(table, schema, {"write.parquet.row-group-size-bytes": "8000"})
    assert _footer(data).num_row_groups == 10


@pytest.mark.parametrize(
    ("codec", "expected"),
    [("zstd", "ZSTD"), ("gzip", "GZIP"), ("snappy", "SNAPPY"), ("uncompressed", "UNCOMPRESSED")],
)
def test_compression_codec_property(codec: str, expected: str) -> None:
    props = {} if codec == "zstd" else {"write.parquet.compression-codec": codec}
    _, data = _write(_MODE_TABLE, _MODE_SCHEMA, props)
    assert _footer(data).row_group(0).column(0).compression == expected


def test_bad_writer_properties_name_the_property() -> None:
    with pytest.raises(ValidationError, match="compression-codec"):
        _write(_MODE_TABLE, _MODE_SCHEMA, {"write.parquet.compression-codec": "lzma"})
    with pytest.raises(ValidationError, match="row-group-limit"):
        _write(_MODE_TABLE, _MODE_SCHEMA, {"write.parquet.row-group-limit": "many"})


def test_bloom_filter_property_writes_a_filter() -> None:
    props = {"write.parquet.bloom-filter-enabled.column.name": "true"}
    _, data = _write(_MODE_TABLE, _MODE_SCHEMA, props)
    footer = _footer(data)
    assert footer.row_group(0).column(1).bloom_filter_offset is not None
    assert footer.row_group(0).column(0).bloom_filter_offset is None


def test_compute_metrics_without_data_omits_nan_counts() -> None:
    df, data = _write(_MODE_TABLE, _MODE_SCHEMA)
    metrics = compute_metrics(_footer(data), _MODE_SCHEMA)
    assert metrics.nan_value_counts == {}
    assert metrics.lower_bounds == df.lower_bounds
    assert metrics.value_counts == df.value_counts


# ---------------------------------------------------------------------------------------
# Files, paths and streams
# ---------------------------------------------------------------------------------------


def test_write_to_local_path_and_file_uri(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b.parquet"
    df = write_data_file(_MODE_TABLE, str(path), schema=_MODE_SCHEMA)
    assert df.file_path == str(path)
    assert df.file_size_in_bytes == os.path.getsize(path)
    uri = f"file://{tmp_path}/c.parquet"
    df2 = write_data_file(_MODE_TABLE, uri, schema=_MODE_SCHEMA)
    assert df2.file_path == uri
    assert read_data_file(uri, _MODE_SCHEMA).num_rows == 3
    with pytest.raises(ValidationError, match="FileIO"):
        write_data_file(_MODE_TABLE, "s3://bucket/x.parquet", schema=_MODE_SCHEMA)
    with pytest.raises(ValidationError, match="file_path"):
        write_data_file(_MODE_TABLE, io.BytesIO(), schema=_MODE_SCHEMA)


def test_partition_tuple_must_match_the_spec() -> None:
    spec = PartitionSpec(3, (PartitionField(1, 1000, "id", IdentityTransform()),))
    with pytest.raises(ValidationError, match="partition spec 3"):
        _write(_MODE_TABLE, _MODE_SCHEMA, spec=spec, partition=())
    df, _ = _write(_MODE_TABLE, _MODE_SCHEMA, spec=spec, partition=(7,))
    assert df.spec_id == 3 and df.partition == (7,)


def test_incremental_writer_appends_row_groups() -> None:
    buf = io.BytesIO()
    writer = ParquetFileWriter(buf, schema=_MODE_SCHEMA, file_path="mem://x")
    writer.write(_MODE_TABLE)
    first = writer.bytes_written
    writer.write(_MODE_TABLE.slice(1))
    assert writer.bytes_written > first
    df = writer.close()
    assert df.record_count == 5
    assert df.file_size_in_bytes == len(buf.getvalue())
    assert df.null_value_counts is not None and df.null_value_counts[2] == 2
    with pytest.raises(ValidationError, match="closed"):
        writer.write(_MODE_TABLE)


# ---------------------------------------------------------------------------------------
# Partitioning
# ---------------------------------------------------------------------------------------

_PART_SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "ts", TimestamptzType()),
    NestedField(3, "name", StringType()),
    NestedField(4, "day", DateType()),
    NestedField(5, "info", StructType(NestedField(6, "code", IntegerType()))),
)
_PART_SPEC = PartitionSpec(
    1,
    (
        PartitionField(2, 1000, "ts_hour", HourTransform()),
        PartitionField(1, 1001, "id_bucket", BucketTransform(3)),
        PartitionField(3, 1002, "name_trunc", TruncateTransform(2)),
        PartitionField(4, 1003, "day_month", MonthTransform()),
        PartitionField(4, 1004, "day_year", YearTransform()),
        PartitionField(2, 1005, "ts_day", DayTransform()),
        PartitionField(6, 1006, "code", IdentityTransform()),
        PartitionField(3, 1007, "gone", VoidTransform()),
    ),
)


@st.composite
def _part_rows(draw: st.DrawFn) -> dict[str, list[Any]]:
    n = draw(st.integers(0, 40))
    hour = 3_600_000_000

    def column(values: st.SearchStrategy[Any]) -> list[Any]:
        return draw(st.lists(values, min_size=n, max_size=n))

    return {
        "id": column(st.integers(-(2**63), 2**63 - 1)),
        "ts": column(st.none() | st.integers(-50, 50).map(lambda h: h * hour + 17)),
        "name": column(st.none() | st.sampled_from(["", "a", "ab", "abc", "abd", "zé"])),
        "day": column(st.none() | st.integers(-800, 800)),
        "info": column(st.none() | st.fixed_dictionaries({6: st.none() | st.integers(0, 2)})),
    }


@settings(max_examples=examples(40), deadline=None)
@given(_part_rows())
def test_partition_table_agrees_with_scalar_transforms(columns: dict[str, list[Any]]) -> None:
    table = _table_from_internal(_PART_SCHEMA, columns)
    seen: set[tuple[Any, ...]] = set()
    ids: list[int] = []
    for partition, rows in partition_table(table, _PART_SCHEMA, _PART_SPEC):
        assert rows.num_rows > 0
        assert partition not in seen
        seen.add(partition)
        ids.extend(rows.column("id").to_pylist())
        row_values = {
            f.field_id: from_arrow_array(f.field_type, rows.column(f.name))  # type: ignore[arg-type]
            for f in _PART_SCHEMA.fields
            if f.field_id != 5
        }
        info = rows.column("info").to_pylist()
        row_values[6] = [None if v is None else v["code"] for v in info]
        for r in range(rows.num_rows):
            expected = tuple(
                pf.transform.apply(
                    _PART_SCHEMA.find_type(pf.source_id), row_values[pf.source_id][r]
                )
                for pf in _PART_SPEC.fields
            )
            assert partition == expected
    assert sorted(ids) == sorted(columns["id"])


def test_unpartitioned_spec_yields_the_whole_table() -> None:
    parts = list(partition_table(_MODE_TABLE, _MODE_SCHEMA, PartitionSpec.unpartitioned()))
    assert [(p, t.num_rows) for p, t in parts] == [((), 3)]


def test_partitioning_by_uuid_and_decimal_identity() -> None:
    schema = Schema(NestedField(1, "u", UUIDType()), NestedField(2, "d", DecimalType(10, 2)))
    spec = PartitionSpec(
        0,
        (
            PartitionField(1, 1000, "u", IdentityTransform()),
            PartitionField(2, 1001, "d", IdentityTransform()),
        ),
    )
    u1, u2 = uuid.uuid4(), uuid.uuid4()
    table = _table_from_internal(
        schema, {"u": [u1, u2, u1, None], "d": [Decimal("1.00"), None, Decimal("1.00"), None]}
    )
    got = {p: t.num_rows for p, t in partition_table(table, schema, spec)}
    assert got == {(u1, Decimal("1.00")): 2, (u2, None): 1, (None, None): 1}


def test_partitioning_refuses_unknown_transforms() -> None:
    from icefloe.spec.transforms import UnknownTransform

    spec = PartitionSpec(0, (PartitionField(1, 1000, "x", UnknownTransform("zorder")),))
    with pytest.raises(ValidationError, match="spec 0"):
        list(partition_table(_MODE_TABLE, _MODE_SCHEMA, spec))


def _part_table(n: int) -> pa.Table:
    hour = 3_600_000_000
    return _table_from_internal(
        _PART_SCHEMA,
        {
            "id": list(range(n)),
            "ts": [(i % 3) * 24 * hour for i in range(n)],
            "name": [f"name {i % 2}" for i in range(n)],
            "day": [0] * n,
            "info": [{6: 1}] * n,
        },
    )


def test_write_partitioned_names_files_and_rolls(tmp_path: Path) -> None:
    spec = PartitionSpec(
        2,
        (
            PartitionField(2, 1000, "ts_day", DayTransform()),
            PartitionField(3, 1001, "name", IdentityTransform()),
        ),
    )
    table = _part_table(3000)
    location = f"file://{tmp_path}/tbl"
    files = write_partitioned(
        table,
        location,
        schema=_PART_SCHEMA,
        spec=spec,
        target_file_size_bytes=4096,
        properties={"write.parquet.compression-codec": "uncompressed"},
    )
    pattern = re.compile(
        re.escape(f"{location}/data/")
        + r"ts_day=1970-01-0[1-3]/name=name\+[01]/[0-9a-f-]{36}-\d{5}\.parquet$"
    )
    assert all(pattern.match(f.file_path) for f in files), [f.file_path for f in files]
    assert len({f.file_path for f in files}) == len(files)
    by_partition = Counter(f.partition for f in files)
    assert len(by_partition) == 6
    assert all(count > 1 for count in by_partition.values())  # rolled within partitions
    assert sum(f.record_count for f in files) == 3000
    ids: list[int] = []
    for f in files:
        assert f.file_size_in_bytes == os.path.getsize(f.file_path[len("file://") :])
        back = read_data_file(f.file_path, _PART_SCHEMA)
        ids.extend(back.column("id").to_pylist())
        assert back.num_rows == f.record_count
        assert f.spec_id == 2
    assert sorted(ids) == list(range(3000))


def test_write_partitioned_into_memory_honours_data_path() -> None:
    outputs = MemoryOutputs()
    files = write_partitioned(
        _part_table(10),
        "s3://bucket/tbl",
        schema=_PART_SCHEMA,
        spec=PartitionSpec.unpartitioned(),
        properties={"write.data.path": "s3://other/place/"},
        open_output=outputs,
    )
    assert len(files) == 1
    assert files[0].file_path.startswith("s3://other/place/")
    assert files[0].partition == ()
    assert set(outputs.files) == {files[0].file_path}
    assert read_data_file(outputs.files[files[0].file_path], _PART_SCHEMA).num_rows == 10


async def test_write_files_uploads_through_fileio(tmp_path: Path) -> None:
    files = await write_files(
        LocalFileIO(),
        _part_table(20),
        str(tmp_path / "tbl"),
        schema=_PART_SCHEMA,
        spec=_PART_SPEC,
    )
    assert sum(f.record_count for f in files) == 20
    for f in files:
        assert os.path.getsize(f.file_path) == f.file_size_in_bytes


# ---------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------


def test_read_with_evolved_schema_filter_and_constants() -> None:
    _, data = _write(_MODE_TABLE, _MODE_SCHEMA)
    read = Schema(
        NestedField(4, "points", DoubleType()),
        NestedField(1, "key", LongType(), required=True),
        NestedField(9, "region", StringType()),
    )
    out = read_data_file(
        data, read, row_filter=pc.field("key") >= 2, constants={9: "eu"}, location="f.parquet"
    )
    assert out.column_names == ["points", "key", "region"]
    assert sorted(out.to_pylist(), key=lambda r: r["key"]) == [
        {"points": None, "key": 2, "region": "eu"},
        {"points": 1.0, "key": 3, "region": "eu"},
    ]


def test_read_errors_name_the_file() -> None:
    with pytest.raises(InvalidFileError, match=r"broken\.parquet"):
        read_data_file(b"not parquet", _MODE_SCHEMA, location="broken.parquet")
    no_ids = io.BytesIO()
    pq.write_table(pa.table({"a": [1]}), no_ids)
    with pytest.raises(InvalidFileError, match=r"plain\.parquet.*'a'"):
        read_data_file(no_ids.getvalue(), _MODE_SCHEMA, location="plain.parquet")
    _, data = _write(_MODE_TABLE, _MODE_SCHEMA)
    with pytest.raises(InvalidFileError, match=r"evolved\.parquet"):
        read_data_file(data, Schema(NestedField(2, "name", LongType())), location="evolved.parquet")


def test_read_files_without_ids_by_name_with_a_file_schema() -> None:
    plain = io.BytesIO()
    pq.write_table(pa.table({"a": pa.array([1, 2], pa.int32())}), plain)
    file_schema = Schema(NestedField(1, "a", IntegerType()))
    out = read_data_file(
        plain.getvalue(), Schema(NestedField(1, "b", LongType())), file_schema=file_schema
    )
    assert out.to_pylist() == [{"b": 1}, {"b": 2}]


# ---------------------------------------------------------------------------------------
# Cross-checks with PyIceberg 0.12
# ---------------------------------------------------------------------------------------


@pytest.mark.interop
def test_pyiceberg_computes_the_same_statistics_from_the_footer() -> None:
    from pyiceberg.io.pyarrow import (
        compute_statistics_plan,
        data_file_statistics_from_parquet_metadata,
        parquet_path_to_id_mapping,
    )
    from pyiceberg.schema import Schema as PySchema

    schema = Schema(
        NestedField(1, "b", BooleanType()),
        NestedField(2, "i", IntegerType(), required=True),
        NestedField(3, "l", LongType()),
        NestedField(4, "f", FloatType()),
        NestedField(5, "d", DoubleType()),
        NestedField(6, "dec", DecimalType(9, 2)),
        NestedField(7, "big", DecimalType(30, 3)),
        NestedField(8, "day", DateType()),
        NestedField(9, "ts", TimestampType()),
        NestedField(10, "tstz", TimestamptzType()),
        NestedField(11, "s", StringType()),
        NestedField(12, "bin", BinaryType()),
        NestedField(13, "st", StructType(NestedField(14, "x", LongType()))),
        NestedField(15, "tags", ListType(16, StringType(), element_required=False)),
    )
    columns: dict[str, list[Any]] = {
        "b": [True, None, False],
        "i": [5, -3, 7],
        "l": [None, 2**40, -(2**40)],
        "f": [1.5, -2.25, None],
        "d": [0.5, None, 1e300],
        "dec": [Decimal("1.25"), Decimal("-9.99"), None],
        "big": [Decimal("123456789012345678901234567.891"), None, Decimal("-1.000")],
        "day": [18000, None, -5],
        "ts": [1, 2**50, None],
        "tstz": [None, -(2**40), 3],
        "s": ["a string longer than sixteen chars", "b", None],
        "bin": [b"\x00\x01", None, b"\xff" * 30],
        "st": [{14: 1}, None, {14: None}],
        "tags": [["x", None], None, []],
    }
    table = _table_from_internal(schema, columns)
    props = {"write.metadata.metrics.column.bin": "full"}
    df, data = _write(table, schema, props)
    py_schema = PySchema.model_validate_json(json.dumps(schema.to_json()))
    stats = data_file_statistics_from_parquet_metadata(
        _footer(data),
        compute_statistics_plan(py_schema, props),
        parquet_path_to_id_mapping(py_schema),
    ).to_serialized_dict()
    assert stats["record_count"] == df.record_count
    assert stats["column_sizes"] == df.column_sizes
    assert stats["value_counts"] == df.value_counts
    assert stats["null_value_counts"] == df.null_value_counts
    assert stats["split_offsets"] == df.split_offsets
    # PyIceberg keeps no bounds for leaves of nested structs; Iceberg Java (and icefloe)
    # does, since a struct leaf holds one value per row. Everything else is identical.
    assert df.lower_bounds is not None and df.upper_bounds is not None
    assert from_bytes(LongType(), df.lower_bounds.pop(14)) == 1
    assert from_bytes(LongType(), df.upper_bounds.pop(14)) == 1
    assert stats["lower_bounds"] == df.lower_bounds
    assert stats["upper_bounds"] == df.upper_bounds


@pytest.mark.interop
def test_pyiceberg_reads_our_file_by_field_id(tmp_path: Path) -> None:
    from pyiceberg.expressions import AlwaysTrue
    from pyiceberg.io.pyarrow import ArrowScan, PyArrowFileIO, pyarrow_to_schema
    from pyiceberg.manifest import DataFile as PyDataFile
    from pyiceberg.manifest import DataFileContent, FileFormat
    from pyiceberg.schema import Schema as PySchema
    from pyiceberg.table import FileScanTask
    from pyiceberg.table.metadata import TableMetadataUtil
    from pyiceberg.typedef import Record

    schema = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "u", UUIDType()),
        NestedField(3, "s", StructType(NestedField(4, "x", IntegerType()))),
        NestedField(5, "tags", ListType(6, StringType())),
        NestedField(7, "m", MapType(8, StringType(), 9, DoubleType(), value_required=False)),
    )
    u = uuid.uuid4()
    table = _table_from_internal(
        schema,
        {
            "id": [1, 2],
            "u": [u, None],
            "s": [{4: 10}, None],
            "tags": [["a", "b"], None],
            "m": [{"k": 1.5}, None],
        },
    )
    path = str(tmp_path / "f.parquet")
    df = write_data_file(table, path, schema=schema)
    py_schema = PySchema.model_validate_json(json.dumps(schema.to_json()))
    assert pyarrow_to_schema(pq.ParquetFile(path).schema_arrow) == py_schema
    metadata = TableMetadataUtil.parse_raw(
        json.dumps(
            {
                "format-version": 2,
                "table-uuid": str(uuid.uuid4()),
                "location": str(tmp_path),
                "last-sequence-number": 0,
                "last-updated-ms": 0,
                "last-column-id": schema.highest_field_id,
                "current-schema-id": 0,
                "schemas": [schema.to_json()],
                "default-spec-id": 0,
                "partition-specs": [{"spec-id": 0, "fields": []}],
                "last-partition-id": 999,
                "default-sort-order-id": 0,
                "sort-orders": [{"order-id": 0, "fields": []}],
            }
        )
    )
    renamed = schema.to_json()
    renamed["fields"] = [dict(f, name=f"{f['name']}_v2") for f in renamed["fields"]]
    py_data_file = PyDataFile.from_args(
        content=DataFileContent.DATA,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=Record(),
        record_count=df.record_count,
        file_size_in_bytes=df.file_size_in_bytes,
    )
    py_data_file.spec_id = 0
    out = ArrowScan(
        metadata,
        PyArrowFileIO(),
        PySchema.model_validate_json(json.dumps(renamed)),
        AlwaysTrue(),
    ).to_table([FileScanTask(py_data_file)])
    assert out.column_names == ["id_v2", "u_v2", "s_v2", "tags_v2", "m_v2"]
    rows = out.to_pylist()
    assert rows[0]["id_v2"] == 1 and rows[0]["u_v2"] == u
    assert rows[0]["s_v2"] == {"x": 10} and rows[0]["tags_v2"] == ["a", "b"]
    assert rows[0]["m_v2"] == [("k", 1.5)]
    assert rows[1] == {"id_v2": 2, "u_v2": None, "s_v2": None, "tags_v2": None, "m_v2": None}
