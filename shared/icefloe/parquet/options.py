"""How icefloe writes Parquet, configured by the table properties Iceberg Java uses.

A table's properties decide the codec, row group, page and dictionary sizes, bloom filters,
the metrics kept per column (``write.metadata.metrics.*``) and where files roll. They are
read here once per write into :class:`ParquetWriteOptions` and :class:`MetricsConfig`, apart
from the writer, so that a bad property fails before any byte is written and so that the
names and defaults shared with Java and PyIceberg can be read in one place.

Table properties follow the names Iceberg Java uses, so one table configuration serves
every engine: ``write.parquet.compression-codec`` (default zstd), ``-compression-level``,
``write.parquet.row-group-size-bytes``, ``write.parquet.row-group-limit`` (rows),
``write.parquet.page-size-bytes``, ``write.parquet.page-row-limit``,
``write.parquet.dict-size-bytes``, ``write.parquet.bloom-filter-enabled.column.<col>``,
``write.parquet.bloom-filter-fpp.column.<col>``, ``write.metadata.metrics.default``
(default ``truncate(16)``), ``write.metadata.metrics.column.<col>``,
``write.metadata.metrics.max-inferred-column-defaults``, ``write.target-file-size-bytes``
and ``write.data.path``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from icefloe.arrow.schema import (
    field_id_of,
)
from icefloe.errors import ValidationError
from icefloe.spec.schema import Schema
from icefloe.spec.types import (
    ListType,
    MapType,
    StructType,
    walk_fields,
)

if TYPE_CHECKING:
    from icefloe.spec.sort_order import SortOrder


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
                        for nested in walk_fields(top.field_type):
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


def target_file_size(properties: Mapping[str, str]) -> int:
    """``write.target-file-size-bytes``, where writers roll to a new file (default 512 MiB)."""
    return _int_property(properties, TARGET_FILE_SIZE_BYTES, DEFAULT_TARGET_FILE_SIZE_BYTES)


__all__ = [
    "BLOOM_FILTER_ENABLED_PREFIX",
    "BLOOM_FILTER_FPP_PREFIX",
    "COMPRESSION_CODEC",
    "COMPRESSION_LEVEL",
    "DATA_PATH",
    "DEFAULT_TARGET_FILE_SIZE_BYTES",
    "DICT_SIZE_BYTES",
    "METRICS_COLUMN_PREFIX",
    "METRICS_DEFAULT",
    "METRICS_MAX_INFERRED_COLUMNS",
    "PAGE_ROW_LIMIT",
    "PAGE_SIZE_BYTES",
    "ROW_GROUP_LIMIT",
    "ROW_GROUP_SIZE_BYTES",
    "TARGET_FILE_SIZE_BYTES",
    "MetricsConfig",
    "MetricsMode",
    "MetricsModeKind",
    "ParquetWriteOptions",
    "target_file_size",
]
