"""Iceberg data files in Parquet: write them with field ids and metrics, read them by id.

Writers (Spark tasks, the demo, interop tests) hand this module an Arrow table and get back
Parquet bytes plus the :class:`~icefloe.datafile.DataFile` that describes them, ready for a
"files written" event. Metrics come from the Parquet footer the writer just produced — the
same numbers any engine would read back — with three exceptions the footer cannot answer:

* NaN counts (Parquet statistics do not carry them) are counted from the data;
* float bounds come from the footer, which already excludes NaN and writes a zero as
  ``-0.0`` lower / ``+0.0`` upper, which is what the spec's total order requires;
* string/binary values longer than the Parquet writer's statistics limit leave no
  footer min/max, so those bounds are computed from the data before truncation.

Columns inside lists and maps get counts but no bounds, as in the reference
implementation: their footer statistics mix values of different rows and cannot be used
to skip files by a row predicate. Geometry, geography and variant columns get counts only.

Table properties follow the names Iceberg Java uses, so one table configuration serves
every engine: ``write.parquet.compression-codec`` (default zstd), ``-compression-level``,
``write.parquet.row-group-size-bytes``, ``write.parquet.row-group-limit`` (rows),
``write.parquet.page-size-bytes``, ``write.parquet.page-row-limit``,
``write.parquet.dict-size-bytes``, ``write.parquet.bloom-filter-enabled.column.<col>``,
``write.parquet.bloom-filter-fpp.column.<col>``, ``write.metadata.metrics.default``
(default ``truncate(16)``), ``write.metadata.metrics.column.<col>``,
``write.metadata.metrics.max-inferred-column-defaults``, ``write.target-file-size-bytes``
and ``write.data.path``.

Output goes to a local path or to any writable binary stream: object stores are reached
through :class:`~icefloe.fileio.FileIO` by writing into memory first
(:class:`MemoryOutputs`, :func:`write_files`), because FileIO uploads whole objects.
"""

from __future__ import annotations

import contextlib
import decimal
import io
import json
import logging
import math
import os
import re
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from enum import Enum
from typing import IO, TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from icefloe.arrow_schema import (
    arrow_to_schema,
    conform_table,
    field_id_of,
    file_schema_to_arrow,
    from_arrow_array,
    list_layout,
    project_table,
)
from icefloe.datafile import DataFile, DataFileContent, FileFormat
from icefloe.errors import InvalidFileError, ValidationError
from icefloe.schema import Schema
from icefloe.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    NestedType,
    PrimitiveType,
    StringType,
    StructType,
    TimestampNanoType,
    TimestampType,
    TimestamptzNanoType,
    TimestamptzType,
    TimeType,
    UUIDType,
    walk_fields,
)
from icefloe.values import compare, to_bytes, truncate_lower_bound, truncate_upper_bound

if TYPE_CHECKING:
    from icefloe.fileio import FileIO
    from icefloe.partition import PartitionSpec
    from icefloe.sort_order import SortOrder

log = logging.getLogger(__name__)

# -- table property names (shared with Iceberg Java and PyIceberg) ----------------------

COMPRESSION_CODEC = "write.parquet.compression-codec"
COMPRESSION_LEVEL = "write.parquet.compression-level"
ROW_GROUP_SIZE_BYTES = "write.parquet.row-group-size-bytes"
ROW_GROUP_LIMIT = "write.parquet.row-group-limit"
PAGE_SIZE_BYTES = "write.parquet.page-size-bytes"
PAGE_ROW_LIMIT = "write.parquet.page-row-limit"
DICT_SIZE_BYTES = "write.parquet.dict-size-bytes"
BLOOM_FILTER_ENABLED_PREFIX = "write.parquet.bloom-filter-enabled.column."
BLOOM_FILTER_FPP_PREFIX = "write.parquet.bloom-filter-fpp.column."
METRICS_DEFAULT = "write.metadata.metrics.default"
METRICS_COLUMN_PREFIX = "write.metadata.metrics.column."
METRICS_MAX_INFERRED_COLUMNS = "write.metadata.metrics.max-inferred-column-defaults"
TARGET_FILE_SIZE_BYTES = "write.target-file-size-bytes"
DATA_PATH = "write.data.path"

DEFAULT_COMPRESSION_CODEC = "zstd"
DEFAULT_ROW_GROUP_SIZE_BYTES = 128 * 1024 * 1024
DEFAULT_ROW_GROUP_LIMIT = 1024 * 1024
DEFAULT_PAGE_SIZE_BYTES = 1024 * 1024
DEFAULT_PAGE_ROW_LIMIT = 20_000
DEFAULT_DICT_SIZE_BYTES = 2 * 1024 * 1024
DEFAULT_BLOOM_FILTER_FPP = 0.01
DEFAULT_METRICS_MODE = "truncate(16)"
DEFAULT_METRICS_MAX_INFERRED_COLUMNS = 100
DEFAULT_TARGET_FILE_SIZE_BYTES = 512 * 1024 * 1024

ICEBERG_SCHEMA_KEY = "iceberg.schema"

# Iceberg codec names -> pyarrow's
_CODECS = {
    "zstd": "zstd",
    "gzip": "gzip",
    "snappy": "snappy",
    "lz4": "lz4",
    "brotli": "brotli",
    "uncompressed": "none",
    "none": "none",
}


# ---------------------------------------------------------------------------------------
# Property parsing
# ---------------------------------------------------------------------------------------


def _int_property(properties: Mapping[str, str], key: str, default: int, minimum: int = 1) -> int:
    raw = properties.get(key)
    if raw is None:
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise ValidationError(f"table property {key}={raw!r} must be an integer") from None
    if value < minimum:
        raise ValidationError(f"table property {key}={raw!r} must be at least {minimum}")
    return value


def _float_property(properties: Mapping[str, str], key: str, default: float) -> float:
    raw = properties.get(key)
    if raw is None:
        return default
    try:
        value = float(str(raw).strip())
    except ValueError:
        raise ValidationError(f"table property {key}={raw!r} must be a number") from None
    if not 0.0 < value < 1.0:
        raise ValidationError(f"table property {key}={raw!r} must be between 0 and 1")
    return value


def _bool_property(properties: Mapping[str, str], key: str) -> bool:
    raw = str(properties.get(key, "false")).strip().lower()
    if raw not in ("true", "false"):
        raise ValidationError(f"table property {key}={properties[key]!r} must be true or false")
    return raw == "true"


class MetricsModeKind(Enum):
    NONE = "none"
    COUNTS = "counts"
    TRUNCATE = "truncate"
    FULL = "full"


_TRUNCATE_RE = re.compile(r"^truncate\(\s*(\d+)\s*\)$")


@dataclass(frozen=True)
class MetricsMode:
    """How much a column's metrics say: nothing, counts, truncated bounds or full bounds."""

    kind: MetricsModeKind
    length: int | None = None

    @classmethod
    def parse(cls, text: str, key: str = METRICS_DEFAULT) -> MetricsMode:
        normalized = text.strip().lower()
        if normalized in ("none", "counts", "full"):
            return cls(MetricsModeKind(normalized))
        m = _TRUNCATE_RE.match(normalized)
        if m and int(m.group(1)) > 0:
            return cls(MetricsModeKind.TRUNCATE, int(m.group(1)))
        raise ValidationError(
            f"table property {key}={text!r} is not a metrics mode; use none, counts, full or "
            "truncate(N) with N > 0"
        )

    @property
    def has_counts(self) -> bool:
        return self.kind is not MetricsModeKind.NONE

    @property
    def has_bounds(self) -> bool:
        return self.kind in (MetricsModeKind.TRUNCATE, MetricsModeKind.FULL)

    def __str__(self) -> str:
        if self.kind is MetricsModeKind.TRUNCATE:
            return f"truncate({self.length})"
        return self.kind.value


_NONE = MetricsMode(MetricsModeKind.NONE)
_COUNTS = MetricsMode(MetricsModeKind.COUNTS)
_TRUNCATE_16 = MetricsMode(MetricsModeKind.TRUNCATE, 16)


@dataclass(frozen=True)
class MetricsConfig:
    """The metrics mode of every column, resolved from table properties like Iceberg Java.

    Without an explicit ``write.metadata.metrics.default``, only the first
    ``max-inferred-column-defaults`` top-level columns (and everything nested in them) get
    the default ``truncate(16)``; wider tables get no metrics for the rest, which keeps
    manifests small. Columns of the sort order get at least ``truncate(16)``, and
    per-column properties override both. Properties naming columns that no longer exist
    (dropped after the property was set) are ignored.
    """

    default: MetricsMode
    columns: Mapping[int, MetricsMode] = field(default_factory=dict)

    def mode(self, field_id: int) -> MetricsMode:
        return self.columns.get(field_id, self.default)

    @classmethod
    def from_properties(
        cls,
        schema: Schema,
        properties: Mapping[str, str] | None = None,
        sort_order: SortOrder | None = None,
    ) -> MetricsConfig:
        props = properties or {}
        columns: dict[int, MetricsMode] = {}
        configured = props.get(METRICS_DEFAULT)
        if configured is not None:
            default = MetricsMode.parse(configured, METRICS_DEFAULT)
        else:
            default = MetricsMode.parse(DEFAULT_METRICS_MODE)
            limit = _int_property(
                props, METRICS_MAX_INFERRED_COLUMNS, DEFAULT_METRICS_MAX_INFERRED_COLUMNS, 0
            )
            if len(schema.fields) > limit:
                for top in schema.fields[:limit]:
                    columns[top.field_id] = default
                    if isinstance(top.field_type, (StructType, ListType, MapType)):
                        for nested in _walk(top.field_type):
                            columns[nested.field_id] = default
                default = _NONE
        if sort_order is not None:
            sorted_default = _TRUNCATE_16 if not default.has_bounds else default
            for sf in sort_order.fields:
                if sf.transform.preserves_order and schema.find_field(sf.source_id) is not None:
                    columns[sf.source_id] = sorted_default
        for key, value in props.items():
            if not key.startswith(METRICS_COLUMN_PREFIX):
                continue
            name = key[len(METRICS_COLUMN_PREFIX) :]
            mode = MetricsMode.parse(str(value), key)
            fid = schema.find_field_id(name)
            if fid is None:
                log.debug("ignoring %s: schema %s has no column %r", key, schema.schema_id, name)
                continue
            columns[fid] = mode
        return cls(default, columns)


def _walk(t: StructType | ListType | MapType) -> Iterator[NestedField]:
    for f in t.fields:
        yield f
        if isinstance(f.field_type, (StructType, ListType, MapType)):
            yield from _walk(f.field_type)


@dataclass(frozen=True)
class ParquetWriteOptions:
    """Parquet writer settings derived from table properties."""

    compression: str = DEFAULT_COMPRESSION_CODEC
    compression_level: int | None = None
    row_group_size_bytes: int = DEFAULT_ROW_GROUP_SIZE_BYTES
    row_group_limit: int = DEFAULT_ROW_GROUP_LIMIT
    page_size_bytes: int = DEFAULT_PAGE_SIZE_BYTES
    page_row_limit: int = DEFAULT_PAGE_ROW_LIMIT
    dict_size_bytes: int = DEFAULT_DICT_SIZE_BYTES
    bloom_filter_columns: Mapping[int, float] = field(default_factory=dict)

    @classmethod
    def from_properties(
        cls, properties: Mapping[str, str] | None = None, schema: Schema | None = None
    ) -> ParquetWriteOptions:
        props = properties or {}
        codec_text = str(props.get(COMPRESSION_CODEC, DEFAULT_COMPRESSION_CODEC)).strip().lower()
        codec = _CODECS.get(codec_text)
        if codec is None:
            raise ValidationError(
                f"table property {COMPRESSION_CODEC}={codec_text!r} is not supported; use one "
                f"of {sorted(_CODECS)}"
            )
        level = None
        if props.get(COMPRESSION_LEVEL) not in (None, "", "null"):
            level = _int_property(props, COMPRESSION_LEVEL, 0, minimum=-(2**31))
        bloom: dict[int, float] = {}
        if schema is not None:
            for key in props:
                if not key.startswith(BLOOM_FILTER_ENABLED_PREFIX) or not _bool_property(
                    props, key
                ):
                    continue
                name = key[len(BLOOM_FILTER_ENABLED_PREFIX) :]
                fid = schema.find_field_id(name)
                if fid is None:
                    log.debug("ignoring %s: no column %r", key, name)
                    continue
                fpp_key = BLOOM_FILTER_FPP_PREFIX + name
                bloom[fid] = _float_property(props, fpp_key, DEFAULT_BLOOM_FILTER_FPP)
        return cls(
            compression=codec,
            compression_level=level,
            row_group_size_bytes=_int_property(
                props, ROW_GROUP_SIZE_BYTES, DEFAULT_ROW_GROUP_SIZE_BYTES
            ),
            row_group_limit=_int_property(props, ROW_GROUP_LIMIT, DEFAULT_ROW_GROUP_LIMIT),
            page_size_bytes=_int_property(props, PAGE_SIZE_BYTES, DEFAULT_PAGE_SIZE_BYTES),
            page_row_limit=_int_property(props, PAGE_ROW_LIMIT, DEFAULT_PAGE_ROW_LIMIT),
            dict_size_bytes=_int_property(props, DICT_SIZE_BYTES, DEFAULT_DICT_SIZE_BYTES),
            bloom_filter_columns=bloom,
        )

    def rows_per_row_group(self, table: pa.Table) -> int:
        """Rows per row group: the byte target over the in-memory row width, capped by count.

        Arrow's in-memory size over-estimates the encoded size, so row groups land at or
        below ``row-group-size-bytes``, as the reference writer's do.
        """
        if table.num_rows == 0:
            return self.row_group_limit
        row_bytes = max(1, table.nbytes // table.num_rows)
        return max(1, min(self.row_group_limit, self.row_group_size_bytes // row_bytes))

    def writer_kwargs(self, arrow_schema: pa.Schema) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "compression": self.compression,
            "compression_level": self.compression_level,
            "data_page_size": self.page_size_bytes,
            "max_rows_per_page": self.page_row_limit,
            "dictionary_pagesize_limit": self.dict_size_bytes,
            # Iceberg stores decimal(P<=9) as int32 and decimal(P<=18) as int64.
            "store_decimal_as_integer": True,
            "use_compliant_nested_type": True,
            "write_statistics": True,
        }
        if self.bloom_filter_columns:
            paths = _parquet_paths(arrow_schema)
            kwargs["bloom_filter_options"] = {
                paths[fid]: {"fpp": fpp}
                for fid, fpp in self.bloom_filter_columns.items()
                if fid in paths
            }
        return kwargs


def _parquet_paths(arrow_schema: pa.Schema) -> dict[int, str]:
    """Field id -> Parquet column path (``a.b``, ``l.list.element``, ``m.key_value.key``)."""
    out: dict[int, str] = {}

    def walk(f: pa.Field, path: str) -> None:
        fid = field_id_of(f)
        if fid is not None:
            out[fid] = path
        t = f.type
        if pa.types.is_struct(t):
            for i in range(t.num_fields):
                walk(t.field(i), f"{path}.{t.field(i).name}")
        elif pa.types.is_map(t):
            walk(t.key_field, f"{path}.key_value.key")
            walk(t.item_field, f"{path}.key_value.value")
        elif pa.types.is_list(t) or pa.types.is_large_list(t):
            walk(t.value_field, f"{path}.list.element")

    for f in arrow_schema:
        walk(f, f.name)
    return out


# ---------------------------------------------------------------------------------------
# Metrics from the footer
# ---------------------------------------------------------------------------------------


@dataclass
class ParquetMetrics:
    """The metric fields of a DataFile, as computed from one Parquet file."""

    record_count: int
    column_sizes: dict[int, int]
    value_counts: dict[int, int]
    null_value_counts: dict[int, int]
    nan_value_counts: dict[int, int]
    lower_bounds: dict[int, bytes]
    upper_bounds: dict[int, bytes]
    split_offsets: list[int]


@dataclass(frozen=True)
class _Leaf:
    field_id: int | None
    repeated: bool


def _leaves(arrow_schema: pa.Schema) -> list[_Leaf]:
    """Parquet leaf columns in file order, from the Arrow view of the file's schema."""
    out: list[_Leaf] = []

    def walk(f: pa.Field, repeated: bool, fid: int | None) -> None:
        t = f.type
        if pa.types.is_struct(t):
            for i in range(t.num_fields):
                child = t.field(i)
                walk(child, repeated, field_id_of(child))
        elif pa.types.is_map(t):
            walk(t.key_field, True, field_id_of(t.key_field))
            walk(t.item_field, True, field_id_of(t.item_field))
        elif pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
            walk(t.value_field, True, field_id_of(t.value_field))
        else:
            out.append(_Leaf(fid, repeated))

    for f in arrow_schema:
        walk(f, False, field_id_of(f))
    return out


_BOUNDED = (
    BooleanType,
    IntegerType,
    LongType,
    FloatType,
    DoubleType,
    DecimalType,
    DateType,
    TimeType,
    TimestampType,
    TimestamptzType,
    TimestampNanoType,
    TimestamptzNanoType,
    StringType,
    UUIDType,
    FixedType,
    BinaryType,
)

_UNIT_SCALE = {"milliseconds": 1_000_000, "microseconds": 1_000, "nanoseconds": 1}


def _time_unit(logical_type: Any) -> str | None:
    try:
        info = json.loads(logical_type.to_json())
    except (AttributeError, ValueError):
        return None
    unit = info.get("timeUnit") if isinstance(info, dict) else None
    return unit if isinstance(unit, str) else None


def _rescale(raw: int, unit: str | None, nanos_per_target_unit: int, upper: bool) -> int | None:
    if unit not in _UNIT_SCALE:
        return None
    nanos_per_source = _UNIT_SCALE[unit]
    if nanos_per_source >= nanos_per_target_unit:
        return raw * (nanos_per_source // nanos_per_target_unit)
    factor = nanos_per_target_unit // nanos_per_source
    # Coarsening must round outwards so the bound still holds.
    return -((-raw) // factor) if upper else raw // factor


def _stat_value(t: PrimitiveType, raw: Any, column: Any, upper: bool) -> Any:
    """A footer min/max (physical value) in icefloe's internal representation, or None."""
    physical = column.physical_type
    if physical == "INT96":
        return None
    if isinstance(t, BooleanType):
        return bool(raw)
    if isinstance(t, (IntegerType, LongType, DateType)):
        return int(raw)
    if isinstance(t, (FloatType, DoubleType)):
        # Some writers let NaN into min/max; NaN is never a valid bound.
        value = float(raw)
        return None if math.isnan(value) else value
    if isinstance(t, (TimeType, TimestampType, TimestamptzType)):
        return _rescale(int(raw), _time_unit(column.statistics.logical_type), 1_000, upper)
    if isinstance(t, (TimestampNanoType, TimestamptzNanoType)):
        return _rescale(int(raw), _time_unit(column.statistics.logical_type), 1, upper)
    if isinstance(t, DecimalType):
        # int32/int64 physical decimals give the unscaled int; fixed gives big-endian bytes
        unscaled = raw if isinstance(raw, int) else int.from_bytes(raw, "big", signed=True)
        return decimal.Decimal(unscaled).scaleb(-t.scale, _EXACT)
    if isinstance(t, StringType):
        try:
            return bytes(raw).decode("utf-8") if not isinstance(raw, str) else raw
        except UnicodeDecodeError:
            return None
    if isinstance(t, UUIDType):
        data = bytes(raw)
        return uuid.UUID(bytes=data) if len(data) == 16 else None
    if isinstance(t, (FixedType, BinaryType)):
        return raw.encode() if isinstance(raw, str) else bytes(raw)
    return None


_EXACT = decimal.Context(prec=100)


def _lower_bound_bytes(t: PrimitiveType, value: Any, mode: MetricsMode) -> bytes:
    if mode.kind is MetricsModeKind.TRUNCATE and isinstance(t, (StringType, BinaryType)):
        assert mode.length is not None
        value = truncate_lower_bound(t, value, mode.length)
    return to_bytes(t, value)


def _upper_bound_bytes(t: PrimitiveType, value: Any, mode: MetricsMode) -> bytes | None:
    if mode.kind is MetricsModeKind.TRUNCATE and isinstance(t, (StringType, BinaryType)):
        assert mode.length is not None
        value = truncate_upper_bound(t, value, mode.length)
        if value is None:
            return None
    return to_bytes(t, value)


def _subtree_ids(f: pa.Field) -> set[int]:
    ids: set[int] = set()
    fid = field_id_of(f)
    if fid is not None:
        ids.add(fid)
    t = f.type
    if pa.types.is_struct(t):
        for i in range(t.num_fields):
            ids |= _subtree_ids(t.field(i))
    elif pa.types.is_map(t):
        ids |= _subtree_ids(t.key_field) | _subtree_ids(t.item_field)
    elif pa.types.is_list(t) or pa.types.is_large_list(t):
        ids |= _subtree_ids(t.value_field)
    return ids


def _leaf_values(table: pa.Table, field_ids: set[int]) -> dict[int, list[pa.Array]]:
    """The values of some leaf columns, without those hidden by a null parent, in one pass."""
    found: dict[int, list[pa.Array]] = {fid: [] for fid in field_ids}

    def walk(arr: pa.Array, f: pa.Field) -> None:
        if not _subtree_ids(f) & field_ids:
            return
        fid = field_id_of(f)
        if fid in found:
            found[fid].append(arr)
            return
        t = f.type
        if pa.types.is_struct(t):
            children = arr.flatten()
            for i in range(t.num_fields):
                walk(children[i], t.field(i))
        elif pa.types.is_map(t):
            mask = arr.is_null() if arr.null_count else None
            offsets, start, length = list_layout(arr)
            for child, child_field in ((arr.keys, t.key_field), (arr.items, t.item_field)):
                rows = pa.ListArray.from_arrays(offsets, child.slice(start, length), mask=mask)
                walk(rows.flatten(), child_field)
        elif pa.types.is_list(t) or pa.types.is_large_list(t):
            walk(arr.flatten(), t.value_field)

    for i, f in enumerate(table.schema):
        for chunk in table.column(i).chunks:
            walk(chunk, f)
    return found


def _nan_count(arrays: list[pa.Array]) -> int:
    total = 0
    for arr in arrays:
        if len(arr):
            total += int(pc.sum(pc.is_nan(arr)).as_py() or 0)
    return total


def _data_min_max(t: PrimitiveType, arrays: list[pa.Array]) -> tuple[Any, Any] | None:
    """Min and max straight from the data, for columns whose footer lost its statistics."""
    lo: Any = None
    hi: Any = None
    for arr in arrays:
        if len(arr) == arr.null_count:
            continue
        try:
            mm = pc.min_max(arr)
            values = from_arrow_array(t, pa.array([mm["min"], mm["max"]]))
        except (pa.ArrowException, ValidationError):
            return None
        if isinstance(t, (FloatType, DoubleType)):
            if math.isnan(values[0]) or math.isnan(values[1]):
                continue  # only NaN here, and NaN is never a bound
            # min_max does not order -0.0 before +0.0; widen zeros to stay a sound bound.
            values = [-0.0 if values[0] == 0 else values[0], 0.0 if values[1] == 0 else values[1]]
        if lo is None or compare(t, values[0], lo) < 0:
            lo = values[0]
        if hi is None or compare(t, values[1], hi) > 0:
            hi = values[1]
    return None if lo is None else (lo, hi)


def compute_metrics(
    metadata: pq.FileMetaData,
    schema: Schema,
    config: MetricsConfig | None = None,
    *,
    data: pa.Table | None = None,
    location: str = "<parquet file>",
) -> ParquetMetrics:
    """DataFile metrics for a Parquet file from its footer.

    ``schema`` is the Iceberg schema the file was written with; columns whose ids it does
    not know are skipped. ``data``, when the caller still holds the rows (a writer does),
    supplies NaN counts and bounds the footer lacks; without it NaN counts are omitted.
    A column whose statistics are missing from any row group gets no null count and no
    bounds, since no sound value can be given for it.
    """
    config = config or MetricsConfig.from_properties(schema)
    try:
        leaves = _leaves(metadata.schema.to_arrow_schema())
    except (pa.ArrowException, ValueError) as e:
        raise InvalidFileError(location, f"cannot read the Parquet schema: {e}") from e
    if len(leaves) != metadata.num_columns:
        raise InvalidFileError(
            location,
            f"footer has {metadata.num_columns} columns but its schema describes {len(leaves)}",
        )
    column_sizes: dict[int, int] = {}
    value_counts: dict[int, int] = {}
    null_counts: dict[int, int] = {}
    lowers: dict[int, Any] = {}
    uppers: dict[int, Any] = {}
    missing_stats: set[int] = set()
    needs_data: set[int] = set()
    split_offsets: list[int] = []
    types: dict[int, PrimitiveType] = {}

    for rg_index in range(metadata.num_row_groups):
        rg = metadata.row_group(rg_index)
        starts: list[int] = []
        for col_index, leaf in enumerate(leaves):
            column = rg.column(col_index)
            starts.append(
                column.dictionary_page_offset
                if column.has_dictionary_page and column.dictionary_page_offset
                else column.data_page_offset
            )
            fid = leaf.field_id
            if fid is None:
                continue
            f = schema.find_field(fid)
            if f is None or not isinstance(f.field_type, PrimitiveType):
                continue
            t = f.field_type
            types[fid] = t
            column_sizes[fid] = column_sizes.get(fid, 0) + column.total_compressed_size
            mode = config.mode(fid)
            if not mode.has_counts:
                continue
            value_counts[fid] = value_counts.get(fid, 0) + column.num_values
            stats = column.statistics if column.is_stats_set else None
            if stats is None or not stats.has_null_count:
                missing_stats.add(fid)
                continue
            null_counts[fid] = null_counts.get(fid, 0) + stats.null_count
            if not mode.has_bounds or leaf.repeated or not isinstance(t, _BOUNDED):
                continue
            if not stats.has_min_max:
                # Floats: every non-null value was NaN, which bounds exclude anyway.
                if column.num_values > stats.null_count and not isinstance(
                    t, (FloatType, DoubleType)
                ):
                    needs_data.add(fid)
                continue
            lo = _stat_value(t, stats.min_raw, column, upper=False)
            hi = _stat_value(t, stats.max_raw, column, upper=True)
            if lo is None or hi is None:
                needs_data.add(fid)
                continue
            if fid not in lowers or compare(t, lo, lowers[fid]) < 0:
                lowers[fid] = lo
            if fid not in uppers or compare(t, hi, uppers[fid]) > 0:
                uppers[fid] = hi
        if starts:
            split_offsets.append(min(starts))

    for fid in needs_data:
        lowers.pop(fid, None)
        uppers.pop(fid, None)
        if data is not None and fid not in missing_stats:
            found = _data_min_max(types[fid], _leaf_values(data, {fid})[fid])
            if found is not None:
                lowers[fid], uppers[fid] = found
    for fid in missing_stats:
        null_counts.pop(fid, None)
        lowers.pop(fid, None)
        uppers.pop(fid, None)

    nan_counts: dict[int, int] = {}
    if data is not None:
        float_ids = {
            fid
            for fid, t in types.items()
            if isinstance(t, (FloatType, DoubleType)) and config.mode(fid).has_counts
        }
        for fid, arrays in _leaf_values(data, float_ids).items():
            nan_counts[fid] = _nan_count(arrays)

    lower_bounds: dict[int, bytes] = {}
    upper_bounds: dict[int, bytes] = {}
    for fid, value in lowers.items():
        lower_bounds[fid] = _lower_bound_bytes(types[fid], value, config.mode(fid))
    for fid, value in uppers.items():
        upper = _upper_bound_bytes(types[fid], value, config.mode(fid))
        if upper is not None:
            upper_bounds[fid] = upper

    return ParquetMetrics(
        record_count=metadata.num_rows,
        column_sizes=column_sizes,
        value_counts=value_counts,
        null_value_counts=null_counts,
        nan_value_counts=nan_counts,
        lower_bounds=lower_bounds,
        upper_bounds=upper_bounds,
        split_offsets=sorted(split_offsets),
    )


# ---------------------------------------------------------------------------------------
# Writing one file
# ---------------------------------------------------------------------------------------


class _CountingSink:
    """A write-only stream that counts bytes, so the file size is known without a stat."""

    def __init__(self, inner: IO[bytes]) -> None:
        self._inner = inner
        self.count = 0
        self.closed = False

    def write(self, data: Any) -> int:
        self._inner.write(data)
        n = memoryview(data).nbytes
        self.count += n
        return n

    def tell(self) -> int:
        return self.count

    def flush(self) -> None:
        self._inner.flush()

    def writable(self) -> bool:
        return True

    def close(self) -> None:
        # The caller owns the underlying stream (and may still need its buffer).
        self.closed = True


Output = str | os.PathLike[str] | IO[bytes]


def _local_path(location: str) -> str:
    if location.startswith("file://"):
        return location[len("file://") :]
    if location.startswith("file:"):
        return location[len("file:") :]
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*://", location):
        raise ValidationError(
            f"cannot open {location!r} as a local file; write into memory "
            "(MemoryOutputs / io.BytesIO) and upload it with a FileIO"
        )
    return location


class ParquetFileWriter:
    """Writes one Iceberg data file, possibly in several appends, and describes it.

    Each :meth:`write` call conforms the rows to ``schema`` and adds row groups of at most
    ``write.parquet.row-group-size-bytes`` (estimated) and ``row-group-limit`` rows;
    :attr:`bytes_written` lets a caller roll to a new file at a target size. :meth:`close`
    finishes the footer and returns the DataFile with its metrics.
    """

    def __init__(
        self,
        output: Output,
        *,
        schema: Schema,
        spec: PartitionSpec | None = None,
        partition: tuple[Any, ...] = (),
        properties: Mapping[str, str] | None = None,
        file_path: str | None = None,
        sort_order: SortOrder | None = None,
    ) -> None:
        n_fields = len(spec.fields) if spec is not None else 0
        if not isinstance(partition, tuple) or len(partition) != n_fields:
            raise ValidationError(
                f"partition {partition!r:.200} does not match partition spec "
                f"{spec.spec_id if spec is not None else 0} with {n_fields} fields"
            )
        if spec is not None and spec.has_unknown_transform:
            raise ValidationError(
                f"cannot write data with partition spec {spec.spec_id}: it uses a transform "
                "this implementation does not know"
            )
        if isinstance(output, (str, os.PathLike)):
            location = os.fspath(output)
            self.file_path = file_path or location
        elif file_path is None:
            raise ValidationError("file_path is required when writing to a stream")
        else:
            self.file_path = file_path
        self.schema = schema
        self.spec_id = spec.spec_id if spec is not None else 0
        self.partition = partition
        self.sort_order_id = sort_order.order_id if sort_order is not None else None
        props = properties or {}
        self.options = ParquetWriteOptions.from_properties(props, schema)
        self.metrics_config = MetricsConfig.from_properties(schema, props, sort_order)
        self.arrow_schema = file_schema_to_arrow(
            schema, metadata={ICEBERG_SCHEMA_KEY: json.dumps(schema.to_json())}
        )
        self._written: list[pa.Table] = []
        self._collector: list[pq.FileMetaData] = []
        self._exit = contextlib.ExitStack()
        self._owned_path: str | None = None
        try:
            stream: IO[bytes]
            if isinstance(output, (str, os.PathLike)):
                path = _local_path(os.fspath(output))
                parent = os.path.dirname(path)
                if parent:
                    os.makedirs(parent, exist_ok=True)
                stream = self._exit.enter_context(open(path, "wb"))  # noqa: SIM115
                self._owned_path = path
            else:
                stream = output
            self._sink = _CountingSink(stream)
            self._writer = pq.ParquetWriter(
                self._sink,
                self.arrow_schema,
                metadata_collector=self._collector,
                **self.options.writer_kwargs(self.arrow_schema),
            )
        except OSError as e:
            self._exit.close()
            raise InvalidFileError(self.file_path, f"cannot open for writing: {e}") from e
        except BaseException:
            self._exit.close()
            raise
        self._closed = False

    @property
    def bytes_written(self) -> int:
        return self._sink.count

    @property
    def rows_written(self) -> int:
        return sum(t.num_rows for t in self._written)

    def write(self, table: pa.Table) -> None:
        if self._closed:
            raise ValidationError(f"data file {self.file_path!r} is already closed")
        conformed = conform_table(table, self.schema)
        if conformed.num_rows == 0:
            return
        rows = self.options.rows_per_row_group(conformed)
        try:
            self._writer.write_table(conformed, row_group_size=rows)
        except (pa.ArrowException, OSError) as e:
            raise InvalidFileError(self.file_path, f"Parquet write failed: {e}") from e
        self._written.append(conformed)

    def close(self) -> DataFile:
        if self._closed:
            raise ValidationError(f"data file {self.file_path!r} is already closed")
        self._closed = True
        try:
            self._writer.close()
            self._sink.flush()
        except (pa.ArrowException, OSError) as e:
            raise InvalidFileError(self.file_path, f"Parquet write failed: {e}") from e
        finally:
            self._exit.close()
        if not self._collector:
            raise InvalidFileError(self.file_path, "the Parquet writer produced no footer")
        data = pa.concat_tables(self._written) if self._written else self.arrow_schema.empty_table()
        metrics = compute_metrics(
            self._collector[0], self.schema, self.metrics_config, data=data, location=self.file_path
        )
        return DataFile(
            file_path=self.file_path,
            file_format=FileFormat.PARQUET,
            partition=self.partition,
            record_count=metrics.record_count,
            file_size_in_bytes=self._sink.count,
            content=DataFileContent.DATA,
            spec_id=self.spec_id,
            column_sizes=metrics.column_sizes,
            value_counts=metrics.value_counts,
            null_value_counts=metrics.null_value_counts,
            nan_value_counts=metrics.nan_value_counts,
            lower_bounds=metrics.lower_bounds,
            upper_bounds=metrics.upper_bounds,
            split_offsets=metrics.split_offsets,
            sort_order_id=self.sort_order_id,
        )

    def abort(self) -> None:
        """Stop without a DataFile. A local file this writer created is removed; a partial
        stream is the caller's to discard."""
        if not self._closed:
            self._closed = True
            with contextlib.suppress(pa.ArrowException, OSError):
                self._writer.close()
            self._exit.close()
            if self._owned_path is not None:
                with contextlib.suppress(OSError):
                    os.remove(self._owned_path)


def write_data_file(
    table: pa.Table,
    output: Output,
    *,
    schema: Schema,
    spec: PartitionSpec | None = None,
    partition: tuple[Any, ...] = (),
    properties: Mapping[str, str] | None = None,
    file_path: str | None = None,
    sort_order: SortOrder | None = None,
) -> DataFile:
    """Write ``table`` as one Parquet data file and return its DataFile.

    ``output`` is a local path (or ``file:`` URI), or a writable binary stream such as
    ``io.BytesIO`` for object stores, in which case ``file_path`` (the location the bytes
    will be uploaded to) is required. ``partition`` is the tuple of partition values of
    every row, in ``spec`` field order; see :func:`partition_table` to compute it.
    """
    writer = ParquetFileWriter(
        output,
        schema=schema,
        spec=spec,
        partition=partition,
        properties=properties,
        file_path=file_path,
        sort_order=sort_order,
    )
    try:
        writer.write(table)
    except BaseException:
        writer.abort()
        raise
    return writer.close()


# ---------------------------------------------------------------------------------------
# Partitioning and rolling
# ---------------------------------------------------------------------------------------


def _source_column(table: pa.Table, schema: Schema, source_id: int, what: str) -> pa.ChunkedArray:
    name = schema.find_column_name(source_id)
    if name is None:
        raise ValidationError(f"{what}: source column id {source_id} is not in the schema")
    if schema.is_in_list_or_map(source_id):
        raise ValidationError(f"{what}: source column {name!r} is inside a list or map")
    # Walk struct parents by field name; flatten() nulls children of null structs.
    path: list[NestedField] = []
    fid: int | None = source_id
    while fid is not None:
        path.append(schema.field(fid))
        fid = schema.parent_id(fid)
    path.reverse()
    column: pa.ChunkedArray = table.column(path[0].name)
    for f in path[1:]:
        chunks = []
        for chunk in column.chunks:
            idx = chunk.type.get_field_index(f.name)
            chunks.append(chunk.flatten()[idx])
        column = pa.chunked_array(chunks, type=column.type.field(f.name).type)
    return column


def _row_numbers(n: int) -> pa.Array:
    if n == 0:
        return pa.array([], pa.int64())
    return pc.subtract(pc.cumulative_sum(pa.repeat(pa.scalar(1, pa.int64()), n)), 1)


def _grouping_key(arr: pa.Array) -> pa.Array:
    if isinstance(arr, pa.ExtensionArray):
        return arr.storage
    return arr


def partition_table(
    table: pa.Table, schema: Schema, spec: PartitionSpec
) -> Iterator[tuple[tuple[Any, ...], pa.Table]]:
    """Split rows by partition: (partition tuple, rows conformed to ``schema``) per partition.

    Partition values are computed with each field's vectorized transform and rows are
    grouped with Arrow's hash group-by, so the cost is a few kernels, not a Python loop per
    row. Tuples are in spec-field order and internal representation; void fields are
    None. Empty input yields nothing.
    """
    if spec.has_unknown_transform:
        raise ValidationError(
            f"cannot write data with partition spec {spec.spec_id}: it uses a transform this "
            "implementation does not know"
        )
    conformed = conform_table(table, schema)
    if conformed.num_rows == 0:
        return
    if not spec.fields or spec.is_unpartitioned:
        yield tuple(None for _ in spec.fields), conformed
        return
    partition_type = spec.partition_type(schema)
    keys: dict[str, pa.Array] = {}
    key_fields: list[tuple[int, str, IcebergType]] = []
    for pos, (pf, nf) in enumerate(zip(spec.fields, partition_type.fields)):
        if pf.transform.is_void:
            continue
        what = f"partition field {pf.name!r}"
        source = _source_column(conformed, schema, pf.source_id, what)
        source_type = schema.find_type(pf.source_id)
        try:
            values = pf.transform.apply_array(source_type, source)
        except ValidationError as e:
            raise ValidationError(f"{what}: {e}") from e
        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks()
        name = f"k{pos}"
        keys[name] = _grouping_key(values)
        key_fields.append((pos, name, nf.field_type))
    keys["__row"] = _row_numbers(conformed.num_rows)
    grouped = pa.table(keys).group_by([n for _, n, _ in key_fields], use_threads=False)
    result = grouped.aggregate([("__row", "list")])
    decoded: dict[int, list[Any]] = {}
    for pos, name, result_type in key_fields:
        assert isinstance(result_type, PrimitiveType)
        decoded[pos] = from_arrow_array(result_type, result.column(name))
    rows = result.column("__row_list")
    for g in range(result.num_rows):
        partition = tuple(
            decoded[pos][g] if pos in decoded else None for pos in range(len(spec.fields))
        )
        yield partition, conformed.take(rows[g].values)


OutputFactory = Callable[[str], AbstractContextManager[IO[bytes]]]


@contextlib.contextmanager
def local_output(location: str) -> Iterator[IO[bytes]]:
    """Open a local path or ``file:`` URI for writing, creating parent directories.

    A file left incomplete by an error inside the block is removed.
    """
    path = _local_path(location)
    parent = os.path.dirname(path)
    try:
        if parent:
            os.makedirs(parent, exist_ok=True)
        f = open(path, "wb")  # noqa: SIM115 - closed below, removed on failure
    except OSError as e:
        raise InvalidFileError(location, f"cannot open for writing: {e}") from e
    try:
        with f:
            yield f
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(path)
        raise


class MemoryOutputs:
    """An output factory that keeps each written file in memory, for upload via FileIO."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}

    @contextlib.contextmanager
    def __call__(self, location: str) -> Iterator[IO[bytes]]:
        buffer = io.BytesIO()
        yield buffer
        self.files[location] = buffer.getvalue()


def data_location(table_location: str, properties: Mapping[str, str] | None = None) -> str:
    """Where data files go: ``write.data.path``, else ``<table location>/data``."""
    configured = (properties or {}).get(DATA_PATH)
    base = configured if configured else f"{table_location.rstrip('/')}/data"
    return base.rstrip("/")


def write_partitioned(
    table: pa.Table,
    table_location: str,
    *,
    schema: Schema,
    spec: PartitionSpec,
    properties: Mapping[str, str] | None = None,
    open_output: OutputFactory | None = None,
    target_file_size_bytes: int | None = None,
    sort_order: SortOrder | None = None,
) -> list[DataFile]:
    """Write rows as data files, one or more per partition, rolling at the target size.

    Files are named ``<data location>/<partition path>/<uuid>-<n>.parquet`` with one uuid
    per call and ``n`` counting files. Files roll at ``write.target-file-size-bytes``
    (or ``target_file_size_bytes``), checked after each row group, so a file overshoots the
    target by at most one row group. ``open_output`` opens a location for writing; the
    default writes local files, and :class:`MemoryOutputs` collects bytes for a FileIO.
    """
    props = properties or {}
    target = target_file_size_bytes or _int_property(
        props, TARGET_FILE_SIZE_BYTES, DEFAULT_TARGET_FILE_SIZE_BYTES
    )
    if target <= 0:
        raise ValidationError(f"target file size must be positive, got {target}")
    opener: OutputFactory = open_output or local_output
    options = ParquetWriteOptions.from_properties(props, schema)
    base = data_location(table_location, props)
    write_id = uuid.uuid4()
    counter = 0
    files: list[DataFile] = []
    for partition, rows in partition_table(table, schema, spec):
        directory = base
        if spec.fields and not spec.is_unpartitioned:
            directory = f"{base}/{spec.partition_path(partition, schema)}"
        row_bytes = max(1, rows.nbytes // max(1, rows.num_rows))
        chunk_rows = max(1, min(options.rows_per_row_group(rows), target // row_bytes))
        offset = 0
        while offset < rows.num_rows:
            counter += 1
            location = f"{directory}/{write_id}-{counter:05d}.parquet"
            with opener(location) as stream:
                writer = ParquetFileWriter(
                    stream,
                    schema=schema,
                    spec=spec,
                    partition=partition,
                    properties=props,
                    file_path=location,
                    sort_order=sort_order,
                )
                try:
                    while offset < rows.num_rows and writer.bytes_written < target:
                        writer.write(rows.slice(offset, chunk_rows))
                        offset += chunk_rows
                except BaseException:
                    writer.abort()
                    raise
                files.append(writer.close())
    return files


async def write_files(
    file_io: FileIO,
    table: pa.Table,
    table_location: str,
    *,
    schema: Schema,
    spec: PartitionSpec,
    properties: Mapping[str, str] | None = None,
    target_file_size_bytes: int | None = None,
    sort_order: SortOrder | None = None,
) -> list[DataFile]:
    """:func:`write_partitioned` into memory, then upload every file through ``file_io``."""
    outputs = MemoryOutputs()
    files = write_partitioned(
        table,
        table_location,
        schema=schema,
        spec=spec,
        properties=properties,
        open_output=outputs,
        target_file_size_bytes=target_file_size_bytes,
        sort_order=sort_order,
    )
    for data_file in files:
        await file_io.write(data_file.file_path, outputs.files[data_file.file_path])
    return files


# ---------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------

Source = str | os.PathLike[str] | bytes | bytearray | memoryview | IO[bytes]


def read_data_file(
    source: Source,
    read_schema: Schema,
    *,
    file_schema: Schema | None = None,
    row_filter: pc.Expression | None = None,
    constants: Mapping[int, Any] | None = None,
    location: str | None = None,
) -> pa.Table:
    """Read a Parquet data file as ``read_schema`` (see :func:`project_table`).

    ``source`` is a local path, the file's bytes (fetched through a FileIO) or a readable
    stream. Only the top-level columns the read schema needs are decoded. ``row_filter``
    is a pyarrow expression over read-schema column names, applied after projection.
    ``constants`` supplies values for columns absent from the file (identity partition
    values). ``location`` names the file in errors.
    """
    where = location or (os.fspath(source) if isinstance(source, (str, os.PathLike)) else "<bytes>")
    if isinstance(source, (bytes, bytearray, memoryview)):
        handle: Any = pa.BufferReader(bytes(source))
    elif isinstance(source, (str, os.PathLike)):
        handle = _local_path(os.fspath(source))
    else:
        handle = source
    try:
        pf = pq.ParquetFile(handle)
        arrow_schema = pf.schema_arrow
    except (pa.ArrowException, OSError) as e:
        raise InvalidFileError(where, f"not a readable Parquet file: {e}") from e
    try:
        if file_schema is None:
            file_schema = arrow_to_schema(arrow_schema)
    except ValidationError as e:
        raise InvalidFileError(where, str(e)) from e
    wanted = {f.field_id for f in read_schema.all_fields()}
    columns = []
    for f in arrow_schema:
        fid = field_id_of(f)
        top = file_schema.find_field(fid) if fid is not None else file_schema.find_field(f.name)
        if top is None:
            continue
        subtree = {top.field_id}
        if isinstance(top.field_type, NestedType):
            subtree.update(n.field_id for n in walk_fields(top.field_type))
        if subtree & wanted:
            columns.append(f.name)
    try:
        data = pf.read(columns=columns)
    except (pa.ArrowException, OSError) as e:
        raise InvalidFileError(where, f"cannot decode Parquet data: {e}") from e
    try:
        projected = project_table(data, file_schema, read_schema, constants=constants)
    except ValidationError as e:
        raise InvalidFileError(where, str(e)) from e
    if row_filter is not None:
        try:
            projected = projected.filter(row_filter)
        except (pa.ArrowException, TypeError) as e:
            raise ValidationError(f"{where}: cannot apply row filter {row_filter}: {e}") from e
    return projected


__all__ = [
    "COMPRESSION_CODEC",
    "METRICS_COLUMN_PREFIX",
    "METRICS_DEFAULT",
    "ROW_GROUP_LIMIT",
    "ROW_GROUP_SIZE_BYTES",
    "TARGET_FILE_SIZE_BYTES",
    "MemoryOutputs",
    "MetricsConfig",
    "MetricsMode",
    "ParquetFileWriter",
    "ParquetMetrics",
    "ParquetWriteOptions",
    "compute_metrics",
    "data_location",
    "local_output",
    "partition_table",
    "read_data_file",
    "write_data_file",
    "write_files",
    "write_partitioned",
]
