"""Column metrics of a Parquet data file, as its ``data_file`` entry records them.

Metrics come from the footer the writer just produced (the same numbers any engine reads
back), converted to Iceberg's bounds, with three exceptions the footer cannot answer: NaN
counts are counted from the data; string and binary values longer than the writer's
statistics limit leave no footer min/max, so those bounds are computed from the data; and
columns inside lists and maps get counts but no bounds, as in the reference implementation.
The metrics mode of each column (:class:`~icefloe.parquet.options.MetricsConfig`) decides
what is kept and how far bounds are truncated.
"""

from __future__ import annotations

import decimal
import json
import math
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from icefloe.arrow.schema import (
    field_id_of,
    from_arrow_array,
    list_layout,
)
from icefloe.errors import InvalidFileError, ValidationError
from icefloe.parquet.options import MetricsConfig, MetricsMode, MetricsModeKind
from icefloe.spec.schema import Schema
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
    PrimitiveType,
    StringType,
    TimestampNanoType,
    TimestampType,
    TimestamptzNanoType,
    TimestamptzType,
    TimeType,
    UUIDType,
)
from icefloe.spec.values import compare, to_bytes, truncate_lower_bound, truncate_upper_bound

if TYPE_CHECKING:
    pass


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


__all__ = ["ParquetMetrics", "compute_metrics"]
