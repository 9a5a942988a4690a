"""The planner's manifest cache: decoded manifests kept as Arrow columns, pruned in bulk.

Manifest lists and manifests never change once written, so their decoded contents can be
kept by path for as long as memory allows. The planner answers most scans from this cache,
and a warm scan must not walk a hundred thousand Python objects to find the dozen files a
filter selects. Each manifest is therefore kept as one Arrow array per column (file path,
status, sequence numbers, partition values per field, counts and the metric maps), and the
filters are evaluated over whole arrays with ``pyarrow.compute``:

* partition predicates (the inclusive projection of the row filter onto the manifest's own
  partition spec) compare a partition column with a literal;
* metric predicates use per-column arrays of value, null and NaN counts and of decoded lower
  and upper bounds. Those are cut out of the metric maps the first time a filter needs that
  column of that manifest, and kept (and counted against the budget) from then on.

Only the files that survive pruning become :class:`~icefloe.datafile.DataFile` objects.
Predicates the arrays cannot decide (transform terms, ``starts-with`` on metrics, very large
``IN`` lists, values Arrow cannot hold) fall back to the per-file evaluators of
:mod:`icefloe.evaluators`, run only on the rows still in question, so both paths agree
exactly: the vectorized code is an accelerator, never a second set of semantics.

The cache is bounded by a byte budget (least recently used manifests are dropped first) and
counts hits, misses, evictions and bytes for the planner's metrics.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import sys
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from icefloe.datafile import DataFile, DataFileContent
from icefloe.errors import IcefloeError, InvalidFileError, ValidationError
from icefloe.evaluators import MetricsEvaluator, compile_row_filter
from icefloe.expressions import (
    AlwaysFalse,
    AlwaysTrue,
    And,
    BooleanExpression,
    BoundLiteralPredicate,
    BoundPredicate,
    BoundReference,
    BoundSetPredicate,
    BoundTransform,
    Not,
    Operation,
    Or,
    flatten,
)
from icefloe.fileio import FileIO
from icefloe.manifest import (
    ManifestEntryStatus,
    read_manifest,
    read_manifest_metadata,
)
from icefloe.manifest_arrow import ArrowDecodeUnavailable, configured_decoder, decode_columns
from icefloe.manifest_list import ManifestContent, ManifestFile, read_manifest_list
from icefloe.manifest_store import ManifestStore
from icefloe.partition import PartitionSpec
from icefloe.schema import Schema
from icefloe.snapshot import Snapshot
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
    LongType,
    PrimitiveType,
    StringType,
    StructType,
    TimestampNanoType,
    TimestampType,
    TimestamptzNanoType,
    TimestamptzType,
    TimeType,
    UnknownType,
    UUIDType,
)
from icefloe.values import from_bytes

log = logging.getLogger(__name__)

DEFAULT_MAX_BYTES = 512 << 20
DEFAULT_LOAD_CONCURRENCY = 16

# Fixed per-object overheads added to Arrow's buffer sizes, so thousands of tiny manifests
# cannot hide behind a budget that only counts their buffers.
_MANIFEST_OVERHEAD = 4096
_MANIFEST_FILE_OVERHEAD = 512

# IN lists longer than this are decided per file (a bisect per file beats an OR of this many
# array comparisons).
_MAX_VECTOR_SET = 32

_LITTLE_ENDIAN = sys.byteorder == "little"
_BOOL = pa.bool_()

_COUNT_MAP = pa.map_(pa.int32(), pa.int64())
_BOUND_MAP = pa.map_(pa.int32(), pa.binary())
_COUNT_COLUMNS = ("column_sizes", "value_counts", "null_value_counts", "nan_value_counts")
_BOUND_COLUMNS = ("lower_bounds", "upper_bounds")


# ---------------------------------------------------------------------------------------------
# Iceberg values as Arrow arrays
# ---------------------------------------------------------------------------------------------

_TEMPORAL_64 = (
    LongType,
    TimeType,
    TimestampType,
    TimestamptzType,
    TimestampNanoType,
    TimestamptzNanoType,
)


def arrow_storage_type(t: IcebergType) -> Any:
    """The Arrow type that holds a column of ``t``'s internal values for comparison, or None.

    Dates and times stay plain integers (days, micros, nanos), exactly as the internal
    representation and the bound literals are, so comparisons need no conversion. UUIDs are
    their 16 big-endian bytes, whose unsigned byte order is the spec's UUID order.
    """
    if isinstance(t, BooleanType):
        return pa.bool_()
    if isinstance(t, IntegerType | DateType):
        return pa.int32()
    if isinstance(t, _TEMPORAL_64):
        return pa.int64()
    if isinstance(t, FloatType):
        return pa.float32()
    if isinstance(t, DoubleType):
        return pa.float64()
    if isinstance(t, StringType):
        return pa.string()
    if isinstance(t, BinaryType | FixedType):
        return pa.binary()
    if isinstance(t, UUIDType):
        return pa.binary(16)
    if isinstance(t, DecimalType):
        return pa.decimal128(t.precision, t.scale)
    if isinstance(t, UnknownType):
        return pa.null()
    return None


def _to_storage(t: IcebergType, value: Any) -> Any:
    if value is not None and isinstance(t, UUIDType):
        return value.bytes if isinstance(value, uuid.UUID) else bytes(value)
    return value


def values_to_arrow(t: IcebergType, values: Sequence[Any]) -> Any:
    """Internal values as an Arrow array of :func:`arrow_storage_type`, or None if they do
    not fit (a type Arrow cannot compare, or a value outside the type)."""
    storage = arrow_storage_type(t)
    if storage is None:
        return None
    try:
        if isinstance(t, UUIDType):
            return pa.array([_to_storage(t, v) for v in values], storage)
        return pa.array(values, storage)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        return None


def arrow_to_values(t: IcebergType, array: Any) -> list[Any]:
    """An array made by :func:`values_to_arrow` back in the internal representation."""
    values: list[Any] = array.to_pylist()
    if isinstance(t, UUIDType):
        return [None if b is None else uuid.UUID(bytes=b) for b in values]
    return values


def _scalar(t: IcebergType, value: Any) -> Any:
    storage = arrow_storage_type(t)
    if storage is None:
        raise ValidationError(f"no Arrow form for {t}")
    return pa.scalar(_to_storage(t, value), storage)


def _row_numbers(n: int) -> Any:
    if n == 0:
        return pa.array([], pa.int64())
    return pc.subtract(pc.cumulative_sum(pa.repeat(pa.scalar(1, pa.int64()), n)), 1)


def _true(n: int) -> Any:
    return pa.repeat(pa.scalar(True), n)


def _false(n: int) -> Any:
    return pa.repeat(pa.scalar(False), n)


def _filled(mask: Any, value: Any) -> Any:
    """An array with nulls replaced: Iceberg's predicates are two-valued."""
    return pc.fill_null(mask, value) if mask.null_count else mask


# ---------------------------------------------------------------------------------------------
# Bounds decoding
# ---------------------------------------------------------------------------------------------

# type → (byte width, Arrow type of that width); widened to the column type afterwards.
_FIXED_WIDTH: dict[type, tuple[tuple[int, Any], ...]] = {
    IntegerType: ((4, pa.int32()),),
    DateType: ((4, pa.int32()),),
    LongType: ((8, pa.int64()), (4, pa.int32())),  # a 4-byte long bound was written as int
    TimeType: ((8, pa.int64()),),
    TimestampType: ((8, pa.int64()),),
    TimestamptzType: ((8, pa.int64()),),
    TimestampNanoType: ((8, pa.int64()),),
    TimestamptzNanoType: ((8, pa.int64()),),
    FloatType: ((4, pa.float32()),),
    DoubleType: ((8, pa.float64()), (4, pa.float32())),  # a 4-byte double bound was a float
}


def _reinterpret(raw: Any, width: int, arrow_type: Any) -> Any | None:
    """Binary values of exactly ``width`` bytes reinterpreted as little-endian numbers.

    Iceberg's binary form of numbers is little-endian, as Arrow's buffers are on
    little-endian machines, so the value bytes of the binary array can be viewed as a
    numeric array directly. None when some value has another width.
    """
    if not _LITTLE_ENDIAN:
        return None
    n = len(raw)
    valid = pc.is_valid(raw)
    filled = pc.fill_null(raw, pa.scalar(b"\x00" * width, pa.binary())) if raw.null_count else raw
    lengths = pc.binary_length(filled)
    bounds = pc.min_max(lengths)
    if bounds["min"].as_py() != width or bounds["max"].as_py() != width:
        return None
    filled = pa.concat_arrays([filled])  # a fresh array: offset 0, offsets start at 0
    offsets = pa.Array.from_buffers(pa.int32(), 1, [None, filled.buffers()[1]])
    start = offsets[0].as_py()
    data = filled.buffers()[2].slice(start, n * width)
    numbers = pa.Array.from_buffers(arrow_type, n, [None, data])
    if raw.null_count:
        numbers = pc.if_else(valid, numbers, pa.scalar(None, arrow_type))
    return numbers


def decode_bounds(
    t: PrimitiveType, raw: Any, describe: Callable[[int], str], column: str, which: str
) -> Any:
    """Binary bounds (Appendix D, one per row, null where absent) as an array of ``t``.

    NaN bounds become null, as the per-file evaluator treats them as absent. A value that
    does not decode raises :class:`InvalidFileError` naming the file (``describe(row)``).
    """
    storage = arrow_storage_type(t)
    if storage is None:
        raise ValidationError(f"column {column!r} of type {t} has no comparable bounds")
    n = len(raw)
    if raw.null_count == n:
        return pa.nulls(n, storage)
    decoded = None
    for width, arrow_type in _FIXED_WIDTH.get(type(t), ()):
        numbers = _reinterpret(raw, width, arrow_type)
        if numbers is not None:
            decoded = numbers if numbers.type == storage else numbers.cast(storage)
            break
    if decoded is None and isinstance(t, StringType):
        try:
            decoded = raw.cast(pa.string())
        except pa.ArrowInvalid:
            decoded = None  # not UTF-8 somewhere: the slow path names the file
    if decoded is None and isinstance(t, BinaryType | FixedType):
        decoded = raw
    if decoded is None:
        values: list[Any] = []
        for row, data in enumerate(raw.to_pylist()):
            if data is None:
                values.append(None)
                continue
            try:
                values.append(_to_storage(t, from_bytes(t, data)))
            except ValidationError as e:
                raise InvalidFileError(
                    describe(row), f"the {which} bound of column {column!r} is not a {t} value: {e}"
                ) from None
        decoded = pa.array(values, storage)
    if isinstance(t, FloatType | DoubleType) and decoded.null_count < n:
        decoded = pc.if_else(_filled(pc.is_nan(decoded), False), pa.scalar(None, storage), decoded)
    return decoded


# ---------------------------------------------------------------------------------------------
# One cached manifest
# ---------------------------------------------------------------------------------------------


def _map_value(array: Any, parents: Any, key: int, row_numbers: Any) -> Any:
    """The value of ``key`` in each row's map of a ``map<int, V>`` column (one map per
    file); null where the map or the key is absent. ``parents`` is each map entry's row."""
    keys = array.keys
    value_type = array.type.item_type
    if len(keys) == 0:
        return pa.nulls(len(array), value_type)
    hit = pc.equal(keys, key)
    rows = pc.filter(parents, hit)
    if len(rows) == 0:
        return pa.nulls(len(array), value_type)
    values = pc.filter(array.items, hit)
    return pc.take(values, pc.index_in(row_numbers, value_set=rows))


@dataclass(frozen=True, slots=True)
class ManifestRows:
    """Decoded entries of one manifest, for the rows a plan selected."""

    data_files: list[DataFile]
    data_sequence_numbers: list[int]


class CachedManifest:
    """One manifest's entries as Arrow columns, with inherited values already filled in.

    Partition columns follow the field order of the table's partition spec for the
    manifest's spec id (the order of ``DataFile.partition``), typed by the schema the
    manifest was written with, since a column may have been dropped or promoted since.
    """

    def __init__(
        self,
        manifest: ManifestFile,
        spec: PartitionSpec,
        partition_type: StructType,
        columns: dict[str, Any],
        partitions: list[Any] | None,
        partition_tuples: list[tuple[Any, ...]] | None,
    ) -> None:
        self.manifest = manifest
        self.path = manifest.manifest_path
        self.spec = spec
        self.spec_id = manifest.partition_spec_id
        self.content = manifest.content
        self.partition_type = partition_type
        self._columns = columns
        self._partitions = partitions
        self._tuples = partition_tuples
        self.num_rows = len(columns["file_path"])
        self._maps = frozenset(_COUNT_COLUMNS + _BOUND_COLUMNS)
        self._derived: dict[tuple[Any, ...], Any] = {}
        self._lock = threading.Lock()
        self._on_grow: Callable[[int], None] | None = None
        base = sum(int(a.nbytes) for a in columns.values())
        base += sum(int(a.nbytes) for a in partitions or ())
        if partition_tuples is not None:
            base += 64 * len(partition_tuples) * max(1, len(partition_type.fields))
        self._base_bytes = base + _MANIFEST_OVERHEAD
        self._derived_bytes = 0

    # -- construction ---------------------------------------------------------------------

    @classmethod
    def decode(
        cls,
        data: bytes,
        manifest: ManifestFile,
        specs: Mapping[int, PartitionSpec],
        schema: Schema,
        *,
        decoder: str | None = None,
    ) -> CachedManifest:
        """Decode a manifest's bytes (read with ``manifest``'s list row, for inheritance).

        ``decoder`` is ``duckdb`` (Arrow straight from DuckDB's Avro reader, falling back to
        fastavro with a logged reason), ``fastavro`` (the reference path) or ``verify``
        (both, raising :class:`ManifestDecodeMismatch` if they differ); None reads
        ``ICEFLOE_MANIFEST_DECODER`` (:func:`~icefloe.manifest_arrow.configured_decoder`).
        """
        location = manifest.manifest_path
        spec = specs.get(manifest.partition_spec_id)
        if spec is None:
            raise ValidationError(
                f"manifest {location} uses partition spec {manifest.partition_spec_id}, "
                f"which the table does not have (specs: {sorted(specs)})"
            )
        partition_type = _writer_partition_type(data, location, spec, schema)
        decoder = configured_decoder() if decoder is None else decoder
        if decoder != "fastavro":
            try:
                decoded = decode_columns(data, manifest, spec, partition_type)
            except ArrowDecodeUnavailable as unavailable:
                log.warning("decoding %s with fastavro: %s", location, unavailable)
            else:
                arrow = cls(manifest, spec, partition_type, decoded[0], decoded[1], None)
                if decoder == "verify":
                    reference = cls.decode(data, manifest, specs, schema, decoder="fastavro")
                    _same_columns(arrow, reference)
                return arrow
        entries = read_manifest(data, location=location, manifest_file=manifest, spec_by_id=specs)
        n = len(entries)
        status: list[int] = []
        snapshot_ids: list[int | None] = []
        data_seqs: list[int | None] = []
        file_seqs: list[int | None] = []
        files = []
        for e in entries:
            status.append(e.status)
            snapshot_ids.append(e.snapshot_id)
            data_seqs.append(e.sequence_number)
            file_seqs.append(e.file_sequence_number)
            files.append(e.data_file)
        try:
            columns = _file_columns(files)
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as e:
            raise InvalidFileError(location, f"manifest entries cannot be cached: {e}") from e
        columns["status"] = pa.array(status, pa.int8())
        columns["snapshot_id"] = pa.array(snapshot_ids, pa.int64())
        columns["data_sequence_number"] = pa.array(data_seqs, pa.int64())
        columns["file_sequence_number"] = pa.array(file_seqs, pa.int64())
        partitions: list[Any] | None = []
        for pos, field in enumerate(partition_type.fields):
            array = values_to_arrow(field.field_type, [f.partition[pos] for f in files])
            if array is None:
                partitions = None
                break
            assert partitions is not None
            partitions.append(array)
        tuples = None if partitions is not None else [f.partition for f in files]
        assert len(columns["file_path"]) == n
        return cls(manifest, spec, partition_type, columns, partitions, tuples)

    # -- accounting -----------------------------------------------------------------------

    @property
    def nbytes(self) -> int:
        """Bytes held: Arrow buffers, per-column arrays derived so far, and an overhead."""
        return self._base_bytes + self._derived_bytes

    def _remember(self, key: tuple[Any, ...], make: Callable[[], Any]) -> Any:
        found = self._derived.get(key)
        if found is not None:
            return found
        value = make()
        with self._lock:
            found = self._derived.get(key)
            if found is not None:
                return found
            self._derived[key] = value
            grown = int(value.nbytes) if hasattr(value, "nbytes") else 64
            self._derived_bytes += grown
            callback = self._on_grow
        if callback is not None:
            callback(grown)
        return value

    # -- columns --------------------------------------------------------------------------

    def row_numbers(self) -> Any:
        return self._remember(("rows",), lambda: _row_numbers(self.num_rows))

    def column(self, name: str) -> Any:
        return self._columns[name]

    def status_mask(self, which: str) -> Any:
        """``live`` (ADDED or EXISTING) or ``added`` rows, as a boolean array."""
        status = self._columns["status"]
        if which == "live":
            return self._remember(
                ("status", which), lambda: pc.not_equal(status, int(ManifestEntryStatus.DELETED))
            )
        if which == "added":
            return self._remember(
                ("status", which), lambda: pc.equal(status, int(ManifestEntryStatus.ADDED))
            )
        raise ValidationError(f"unknown entry selection {which!r}")

    def partition_column(self, pos: int) -> Any | None:
        """The Arrow array of partition field ``pos``, or None if it is not kept as Arrow."""
        if self._partitions is None:
            return None
        return self._partitions[pos]

    def partition_tuples(self) -> list[tuple[Any, ...]]:
        """Every row's partition tuple in the internal representation (for fallbacks)."""
        if self._tuples is not None:
            return self._tuples
        assert self._partitions is not None

        def make() -> Any:
            per_field = [
                arrow_to_values(f.field_type, arr)
                for f, arr in zip(self.partition_type.fields, self._partitions or ())
            ]
            return _TupleList(list(zip(*per_field)) if per_field else [()] * self.num_rows)

        found: list[tuple[Any, ...]] = self._remember(("tuples",), make).items
        return found

    def _map_value(self, name: str, field_id: int) -> Any:
        array = self._columns[name]

        def parents() -> Any:
            offsets = pa.ListArray.from_arrays(array.offsets, array.keys)
            return pc.list_parent_indices(offsets).cast(pa.int64())

        entry_rows = self._remember(("parents", name), parents)
        return _map_value(array, entry_rows, field_id, self.row_numbers())

    def counts(self, name: str, field_id: int) -> Any:
        """Per-row ``value_counts`` (etc.) of one column: int64, null where not recorded."""
        return self._remember(("count", name, field_id), lambda: self._map_value(name, field_id))

    def raw_bounds(self, name: str, field_id: int) -> Any:
        """Per-row binary bound of one column, as stored (null where absent)."""
        return self._map_value(name, field_id)

    def bounds(self, name: str, field_id: int, t: PrimitiveType, column: str) -> Any:
        """Per-row decoded lower or upper bound of one column as type ``t`` (null if absent)."""
        paths = self._columns["file_path"]
        which = "lower" if name == "lower_bounds" else "upper"

        def make() -> Any:
            raw = self._map_value(name, field_id)
            return decode_bounds(t, raw, lambda row: str(paths[row]), column, which)

        return self._remember(("bound", name, field_id, t), make)

    # -- materializing --------------------------------------------------------------------

    def compact(self, indices: Any) -> CachedManifest:
        """A new, uncached manifest holding only the given rows (in that order).

        Plans keep these rather than the cached manifest, so a plan held for paging never
        keeps a manifest alive after the cache evicted it, and its memory is that of the
        rows it returns. Selecting every row returns the manifest itself (a copy would
        hold the same bytes).
        """
        take = indices if isinstance(indices, pa.Array) else pa.array(indices, pa.int64())
        if len(take) == self.num_rows:
            return self
        columns = {name: pc.take(arr, take) for name, arr in self._columns.items()}
        partitions = (
            None if self._partitions is None else [pc.take(a, take) for a in self._partitions]
        )
        tuples = None
        if self._tuples is not None:
            tuples = [self._tuples[i] for i in take.to_pylist()]
        return CachedManifest(
            self.manifest, self.spec, self.partition_type, columns, partitions, tuples
        )

    def rows(self, indices: Sequence[int] | Any, *, with_metrics: bool = True) -> ManifestRows:
        """DataFiles (and data sequence numbers) of the given rows, in that order.

        ``with_metrics=False`` leaves the column metric maps out (None), for callers that do
        not return them: building a dict per map and file is most of the cost of a row.
        """
        take = indices if isinstance(indices, pa.Array) else pa.array(indices, pa.int64())
        if len(take) == 0:
            return ManifestRows([], [])
        cols: dict[str, list[Any]] = {}
        for name, arr in self._columns.items():
            if name in self._maps:
                cols[name] = _map_dicts(pc.take(arr, take)) if with_metrics else [None] * len(take)
            else:
                cols[name] = pc.take(arr, take).to_pylist()
        if self._tuples is not None:
            tuples = [self._tuples[i] for i in take.to_pylist()]
        else:
            per_field = [
                arrow_to_values(f.field_type, pc.take(arr, take))
                for f, arr in zip(self.partition_type.fields, self._partitions or ())
            ]
            tuples = list(zip(*per_field)) if per_field else [()] * len(take)
        files = _data_files(cols, tuples, self.spec_id)
        seqs = [0 if s is None else s for s in cols["data_sequence_number"]]
        return ManifestRows(files, seqs)


class ManifestDecodeMismatch(IcefloeError):
    """The DuckDB and fastavro decodings of one manifest differ (``verify`` mode)."""


def _same_columns(arrow: CachedManifest, reference: CachedManifest) -> None:
    """Raise :class:`ManifestDecodeMismatch` unless both decodings hold the same values."""
    where = arrow.path
    if arrow.num_rows != reference.num_rows:
        raise ManifestDecodeMismatch(
            f"{where}: {arrow.num_rows} rows from DuckDB, {reference.num_rows} from fastavro"
        )
    for name, expected in reference._columns.items():
        got = arrow._columns.get(name)
        if got is None:
            raise ManifestDecodeMismatch(f"{where}: DuckDB gave no column {name!r}")
        if name in arrow._maps:
            same = _map_dicts(got) == _map_dicts(expected)
        else:
            same = _same_values(got.to_pylist(), expected.to_pylist()) and got.type == expected.type
        if not same:
            raise ManifestDecodeMismatch(f"{where}: column {name!r} differs between decoders")
    if not _same_values(arrow.partition_tuples(), reference.partition_tuples()):
        raise ManifestDecodeMismatch(f"{where}: partition values differ between decoders")


def _same_values(a: Any, b: Any) -> bool:
    """Equality that takes NaN as equal to NaN (and tells -0.0 from 0.0)."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or (
            a == b and math.copysign(1, a) == math.copysign(1, b)
        )
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same_values(x, y) for x, y in zip(a, b))
    return bool(a == b) and type(a) is type(b)


class _TupleList:
    """A list kept in the derived-column cache (which counts ``nbytes``)."""

    __slots__ = ("items", "nbytes")

    def __init__(self, items: list[tuple[Any, ...]]) -> None:
        self.items = items
        self.nbytes = 64 * len(items) * max(1, len(items[0]) if items else 1)


def _writer_partition_type(
    data: bytes, location: str, spec: PartitionSpec, schema: Schema
) -> StructType:
    """The partition struct in table-spec order, typed by the manifest writer's schema.

    The writer's schema (manifest key-value metadata) still has columns dropped since, and
    their types before any promotion, which is what the stored values are. The table's
    schema is the fallback when the metadata is unusable.
    """
    fallback = spec.partition_type(schema)
    try:
        meta = read_manifest_metadata(data, location=location)
        writer_schema = Schema.from_json(json.loads(meta["schema"]))
        fields = json.loads(meta["partition-spec"])
        writer_spec = PartitionSpec.from_json(
            fields if isinstance(fields, list) else fields.get("fields", [])
        )
        written = {f.field_id: f for f in writer_spec.partition_type(writer_schema).fields}
    except (IcefloeError, KeyError, ValueError, TypeError, AttributeError):
        return fallback
    return StructType(*(written.get(f.field_id, f) for f in fallback.fields))


def _file_columns(files: list[DataFile]) -> dict[str, Any]:
    def ints(values: Iterable[int | None], t: Any = None) -> Any:
        return pa.array(list(values), pa.int64() if t is None else t)

    columns: dict[str, Any] = {
        "file_path": pa.array([f.file_path for f in files], pa.string()),
        "file_format": pa.array([f.file_format for f in files], pa.string()).dictionary_encode(),
        "content": ints((int(f.content) for f in files), pa.int8()),
        "record_count": ints(f.record_count for f in files),
        "file_size_in_bytes": ints(f.file_size_in_bytes for f in files),
        "key_metadata": pa.array([f.key_metadata for f in files], pa.binary()),
        "split_offsets": pa.array([f.split_offsets for f in files], pa.list_(pa.int64())),
        "equality_ids": pa.array([f.equality_ids for f in files], pa.list_(pa.int32())),
        "sort_order_id": ints((f.sort_order_id for f in files), pa.int32()),
        "first_row_id": ints(f.first_row_id for f in files),
        "referenced_data_file": pa.array([f.referenced_data_file for f in files], pa.string()),
        "content_offset": ints(f.content_offset for f in files),
        "content_size_in_bytes": ints(f.content_size_in_bytes for f in files),
    }
    for name in _COUNT_COLUMNS:
        columns[name] = pa.array([getattr(f, name) for f in files], _COUNT_MAP)
    for name in _BOUND_COLUMNS:
        columns[name] = pa.array([getattr(f, name) for f in files], _BOUND_MAP)
    return columns


_CONTENTS = {c.value: c for c in DataFileContent}


def _map_dicts(array: Any) -> list[dict[int, Any] | None]:
    """A map column as Python dicts (None for null maps).

    Converting the flat key and value arrays once and cutting them by offsets is several
    times faster than ``to_pylist`` on the map array, which builds a tuple per entry.
    """
    offsets = array.offsets.to_pylist()
    start, stop = offsets[0], offsets[-1]
    pairs = iter(
        zip(
            array.keys.slice(start, stop - start).to_pylist(),
            array.items.slice(start, stop - start).to_pylist(),
        )
    )
    valid = array.is_valid().to_pylist() if array.null_count else None
    out: list[dict[int, Any] | None] = []
    for i in range(len(array)):
        taken = dict(islice(pairs, offsets[i + 1] - offsets[i]))
        out.append(None if valid is not None and not valid[i] else taken)
    return out


def _data_files(
    cols: dict[str, list[Any]], partitions: list[tuple[Any, ...]], spec_id: int
) -> list[DataFile]:
    out = []
    for i, partition in enumerate(partitions):
        out.append(
            DataFile(
                file_path=cols["file_path"][i],
                file_format=cols["file_format"][i],
                partition=tuple(partition),
                record_count=cols["record_count"][i],
                file_size_in_bytes=cols["file_size_in_bytes"][i],
                content=_CONTENTS[cols["content"][i]],
                spec_id=spec_id,
                column_sizes=cols["column_sizes"][i],
                value_counts=cols["value_counts"][i],
                null_value_counts=cols["null_value_counts"][i],
                nan_value_counts=cols["nan_value_counts"][i],
                lower_bounds=cols["lower_bounds"][i],
                upper_bounds=cols["upper_bounds"][i],
                key_metadata=cols["key_metadata"][i],
                split_offsets=cols["split_offsets"][i],
                equality_ids=cols["equality_ids"][i],
                sort_order_id=cols["sort_order_id"][i],
                first_row_id=cols["first_row_id"][i],
                referenced_data_file=cols["referenced_data_file"][i],
                content_offset=cols["content_offset"][i],
                content_size_in_bytes=cols["content_size_in_bytes"][i],
            )
        )
    return out


# ---------------------------------------------------------------------------------------------
# Vectorized pruning
# ---------------------------------------------------------------------------------------------


class _Unvectorizable(Exception):
    """This predicate must be decided per file."""


def _evaluate(
    expr: BooleanExpression,
    candidates: Any,
    leaf: Callable[[BoundPredicate, Any], Any],
) -> Any:
    """The rows among ``candidates`` for which ``expr`` holds (false outside them).

    AND narrows the candidates for its right side and OR only tries the rows its left side
    did not take, so a predicate that must run per file only runs on rows still in doubt.
    """
    if isinstance(expr, AlwaysTrue):
        return candidates
    if isinstance(expr, AlwaysFalse):
        return _false(len(candidates))
    if isinstance(expr, And):
        mask = candidates
        for part in flatten(expr, And):
            mask = _evaluate(part, mask, leaf)
        return mask
    if isinstance(expr, Or):
        taken = _false(len(candidates))
        remaining = candidates
        for part in flatten(expr, Or):
            hit = _evaluate(part, remaining, leaf)
            taken = pc.or_(taken, hit)
            remaining = pc.and_(remaining, pc.invert(hit))
        return taken
    if isinstance(expr, Not):
        raise ValidationError("pruning needs NOT rewritten away; call rewrite_not first")
    if isinstance(expr, BoundPredicate):
        return pc.and_(candidates, leaf(expr, candidates))
    raise ValidationError(f"cannot prune with {expr!r:.80}: bind the filter first")


def _per_row(candidates: Any, test: Callable[[int], bool]) -> Any:
    """Run ``test`` on the candidate rows only; false elsewhere."""
    chosen = set(pc.indices_nonzero(candidates).to_pylist())
    return pa.array([i in chosen and test(i) for i in range(len(candidates))], _BOOL)


def _is_floating(t: IcebergType) -> bool:
    return isinstance(t, FloatType | DoubleType)


def _set_mask(column: Any, t: IcebergType, values: frozenset[Any]) -> Any:
    """Whether each (non-null) value is in ``values``: null rows are false.

    Floats are compared with ``equal`` rather than a hash lookup, so that -0.0 matches 0.0 as
    it does in Python and in the per-file evaluators.
    """
    if _is_floating(t):
        if len(values) > _MAX_VECTOR_SET:
            raise _Unvectorizable
        mask = _false(len(column))
        for v in values:
            mask = pc.or_(mask, _filled(pc.equal(column, _scalar(t, v)), False))
        return mask
    value_set = pa.array([_to_storage(t, v) for v in values], column.type)
    return _filled(pc.is_in(column, value_set=value_set), False)


def partition_leaf_mask(manifest: CachedManifest, pred: BoundPredicate) -> Any:
    """A partition predicate over a partition column, with the row evaluator's semantics."""
    term = pred.term
    if isinstance(term, BoundTransform) or term.ref.accessor is None:
        raise _Unvectorizable
    positions = term.ref.accessor.positions
    if len(positions) != 1:
        raise _Unvectorizable
    column = manifest.partition_column(positions[0])
    if column is None:
        raise _Unvectorizable
    t = term.ref.field_type
    op = pred.op
    try:
        if op is Operation.IS_NULL:
            return pc.is_null(column)
        if op is Operation.NOT_NULL:
            return pc.is_valid(column)
        if op is Operation.IS_NAN:
            return _filled(pc.is_nan(column), False)
        if op is Operation.NOT_NAN:
            return _filled(pc.invert(pc.is_nan(column)), True)
        if isinstance(pred, BoundSetPredicate):
            found = _set_mask(column, t, pred.literals)
            if op is Operation.IN:
                return _filled(pc.and_(pc.is_valid(column), found), False)
            return pc.invert(_filled(pc.and_(pc.is_valid(column), found), False))
        assert isinstance(pred, BoundLiteralPredicate)
        lit = pred.literal
        if op is Operation.STARTS_WITH or op is Operation.NOT_STARTS_WITH:
            if not isinstance(lit, str) or not pa.types.is_string(column.type):
                raise _Unvectorizable
            found = _filled(pc.starts_with(column, pattern=lit), False)
            return found if op is Operation.STARTS_WITH else pc.invert(found)
        scalar = _scalar(t, lit)
        compare = _COMPARE.get(op)
        if compare is None:
            raise _Unvectorizable
        return _filled(compare(column, scalar), op is Operation.NOT_EQ)
    except (pa.ArrowException, TypeError, ValueError, OverflowError, ValidationError):
        raise _Unvectorizable from None


_COMPARE: dict[Operation, Callable[[Any, Any], Any]] = {
    Operation.LT: pc.less,
    Operation.LT_EQ: pc.less_equal,
    Operation.GT: pc.greater,
    Operation.GT_EQ: pc.greater_equal,
    Operation.EQ: pc.equal,
    Operation.NOT_EQ: pc.not_equal,
}


class _Stats:
    """The metric arrays of one column of one manifest, fetched as predicates need them."""

    def __init__(self, manifest: CachedManifest, ref: BoundReference) -> None:
        self.m = manifest
        self.ref = ref
        self.fid = ref.field_id
        self.n = manifest.num_rows

    def counts(self, name: str) -> Any:
        return self.m.counts(name, self.fid)

    def lower(self) -> Any:
        t = self.ref.field_type
        assert isinstance(t, PrimitiveType)
        return self.m.bounds("lower_bounds", self.fid, t, self.ref.name)

    def upper(self) -> Any:
        t = self.ref.field_type
        assert isinstance(t, PrimitiveType)
        return self.m.bounds("upper_bounds", self.fid, t, self.ref.name)

    def all_null(self) -> Any:
        return _filled(
            pc.greater_equal(self.counts("null_value_counts"), self.counts("value_counts")), False
        )

    def all_nan(self) -> Any:
        return _filled(
            pc.greater_equal(self.counts("nan_value_counts"), self.counts("value_counts")), False
        )

    def all_null_or_nan(self) -> Any:
        nans = _filled(self.counts("nan_value_counts"), 0)
        nulls_and_nans = pc.add(self.counts("null_value_counts"), nans)
        return _filled(pc.greater_equal(nulls_and_nans, self.counts("value_counts")), False)

    def no_nulls(self) -> Any:
        if not self.ref.nullable:
            return _true(self.n)
        return _filled(pc.equal(self.counts("null_value_counts"), 0), False)

    def no_nans(self) -> Any:
        if not _is_floating(self.ref.field_type):
            return _true(self.n)
        return _filled(pc.equal(self.counts("nan_value_counts"), 0), False)


_SIGNED_ZERO_OPS = frozenset({Operation.LT, Operation.GT, Operation.NOT_EQ, Operation.NOT_IN})


def _has_zero(pred: BoundPredicate) -> bool:
    if isinstance(pred, BoundSetPredicate):
        return any(v == 0.0 for v in pred.literals)
    return isinstance(pred, BoundLiteralPredicate) and pred.literal == 0.0


def metrics_leaf_mask(manifest: CachedManifest, pred: BoundPredicate) -> Any:
    """May each file hold rows matching ``pred``, by its metrics? Mirrors
    :class:`~icefloe.evaluators.MetricsEvaluator` predicate by predicate."""
    n = manifest.num_rows
    term = pred.term
    if isinstance(term, BoundTransform):
        return _true(n)
    ref = term.ref
    if ref.accessor is None or not isinstance(ref.field_type, PrimitiveType):
        return _true(n)
    t = ref.field_type
    if arrow_storage_type(t) is None:
        raise _Unvectorizable
    st = _Stats(manifest, ref)
    op = pred.op
    try:
        if op is Operation.IS_NULL:
            return _filled(pc.not_equal(st.counts("null_value_counts"), 0), True)
        if op is Operation.NOT_NULL:
            return pc.invert(st.all_null())
        if op is Operation.IS_NAN:
            may = _filled(pc.not_equal(st.counts("nan_value_counts"), 0), True)
            return pc.and_(may, pc.invert(st.all_null()))
        if op is Operation.NOT_NAN:
            return pc.invert(st.all_nan())
        if op is Operation.STARTS_WITH or op is Operation.NOT_STARTS_WITH:
            raise _Unvectorizable
        if _is_floating(t) and op in _SIGNED_ZERO_OPS and _has_zero(pred):
            raise _Unvectorizable  # -0.0 vs 0.0 as Double.compare: the per-file evaluator
        lower, upper = st.lower(), st.upper()
        if op is Operation.NOT_EQ or op is Operation.NOT_IN:
            if isinstance(pred, BoundSetPredicate):
                single = _set_mask(lower, t, pred.literals)
            else:
                assert isinstance(pred, BoundLiteralPredicate)
                single = _filled(pc.equal(lower, _scalar(t, pred.literal)), False)
            one_value = _filled(pc.equal(lower, upper), False)
            clean = pc.and_(st.no_nulls(), st.no_nans())
            return pc.invert(pc.and_(pc.and_(clean, one_value), single))
        if isinstance(pred, BoundSetPredicate):
            if len(pred.literals) > _MAX_VECTOR_SET:
                raise _Unvectorizable
            within = _false(n)
            for v in pred.literals:
                s = _scalar(t, v)
                above = _filled(pc.less_equal(lower, s), True)
                below = _filled(pc.greater_equal(upper, s), True)
                within = pc.or_(within, pc.and_(above, below))
            return pc.and_(pc.invert(st.all_null_or_nan()), within)
        assert isinstance(pred, BoundLiteralPredicate)
        s = _scalar(t, pred.literal)
        if op is Operation.LT:
            may = _filled(pc.less(lower, s), True)
        elif op is Operation.LT_EQ:
            may = _filled(pc.less_equal(lower, s), True)
        elif op is Operation.GT:
            may = _filled(pc.greater(upper, s), True)
        elif op is Operation.GT_EQ:
            may = _filled(pc.greater_equal(upper, s), True)
        elif op is Operation.EQ:
            may = pc.and_(
                _filled(pc.less_equal(lower, s), True), _filled(pc.greater_equal(upper, s), True)
            )
        else:
            raise _Unvectorizable
        return pc.and_(pc.invert(st.all_null_or_nan()), may)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        raise _Unvectorizable from None


@dataclass
class PruneCounts:
    """What pruning did, summed over the manifests a pruner saw."""

    considered: int = 0
    by_partition: int = 0
    by_metrics: int = 0
    selected: int = 0


class FilePruner:
    """Selects the rows of cached manifests that may hold rows matching a row filter.

    Built once per plan and partition spec: ``partition_filter`` is the inclusive
    projection of the row filter onto that spec (bound to its partition struct) and
    ``row_filter`` the bound, NOT-free row filter for the metrics (None to skip metrics, as
    for delete files). Thread-safe apart from :attr:`counts`, which a plan owns.
    """

    def __init__(
        self,
        schema: Schema,
        partition_filter: BooleanExpression,
        row_filter: BooleanExpression | None,
        *,
        include_empty_files: bool = False,
    ) -> None:
        self.schema = schema
        self.partition_filter = partition_filter
        self.row_filter = row_filter
        self.include_empty_files = include_empty_files
        self.counts = PruneCounts()
        self._partition_tests: dict[BoundPredicate, Callable[[Sequence[Any]], bool]] = {}
        self._metrics_tests: dict[BoundPredicate, MetricsEvaluator] = {}

    def select(
        self,
        manifest: CachedManifest,
        *,
        which: str = "live",
        snapshot_ids: frozenset[int] | None = None,
    ) -> Any:
        """Row indices (int64 array) of the selected entries, in manifest order.

        ``which`` is ``live`` (ADDED and EXISTING entries) or ``added``; ``snapshot_ids``
        further keeps only entries added by those snapshots (incremental scans).
        """
        n = manifest.num_rows
        candidates = manifest.status_mask(which)
        if snapshot_ids is not None:
            ids = pa.array(sorted(snapshot_ids), pa.int64())
            added_by = _filled(pc.is_in(manifest.column("snapshot_id"), value_set=ids), False)
            candidates = pc.and_(candidates, added_by)
        considered = _count(candidates)
        in_partition = _evaluate(self.partition_filter, candidates, self._partition_leaf(manifest))
        after_partition = _count(in_partition)
        keep = in_partition
        if self.row_filter is not None and after_partition:
            keep = self._metrics(manifest, in_partition)
        selected = pc.indices_nonzero(keep) if n else pa.array([], pa.int64())
        self.counts.considered += considered
        self.counts.by_partition += considered - after_partition
        self.counts.by_metrics += after_partition - len(selected)
        self.counts.selected += len(selected)
        return selected.cast(pa.int64())

    # -- partition ----------------------------------------------------------------------

    def _partition_leaf(self, manifest: CachedManifest) -> Callable[[BoundPredicate, Any], Any]:
        def leaf(pred: BoundPredicate, candidates: Any) -> Any:
            try:
                return partition_leaf_mask(manifest, pred)
            except _Unvectorizable:
                pass
            test = self._partition_tests.get(pred)
            if test is None:
                test = self._partition_tests[pred] = compile_row_filter(pred)
            tuples = manifest.partition_tuples()
            return _per_row(candidates, lambda i: test(tuples[i]))

        return leaf

    # -- metrics ------------------------------------------------------------------------

    def _metrics(self, manifest: CachedManifest, candidates: Any) -> Any:
        assert self.row_filter is not None
        records = manifest.column("record_count")
        unknown = pc.less(records, 0)  # old v1 writers: metrics are unreliable
        if self.include_empty_files:
            nonempty = _true(manifest.num_rows)
        else:
            nonempty = pc.not_equal(records, 0)
        usable = pc.and_(candidates, pc.and_(nonempty, pc.invert(unknown)))
        matched = _evaluate(self.row_filter, usable, self._metrics_leaf(manifest))
        return pc.or_(matched, pc.and_(candidates, unknown))

    def _metrics_leaf(self, manifest: CachedManifest) -> Callable[[BoundPredicate, Any], Any]:
        def leaf(pred: BoundPredicate, candidates: Any) -> Any:
            try:
                return metrics_leaf_mask(manifest, pred)
            except _Unvectorizable:
                pass
            evaluator = self._metrics_tests.get(pred)
            if evaluator is None:
                evaluator = self._metrics_tests[pred] = MetricsEvaluator(
                    self.schema, pred, include_empty_files=True
                )
            return _per_file(manifest, candidates, pred, evaluator)

        return leaf


def _per_file(
    manifest: CachedManifest, candidates: Any, pred: BoundPredicate, evaluator: MetricsEvaluator
) -> Any:
    """The per-file evaluator on the candidate rows, given only the predicate's column."""
    fid = pred.term.ref.field_id
    columns = {
        name: manifest.counts(name, fid).to_pylist()
        for name in ("value_counts", "null_value_counts", "nan_value_counts")
    }
    raw = {name: manifest.raw_bounds(name, fid).to_pylist() for name in _BOUND_COLUMNS}
    paths = manifest.column("file_path")
    records = manifest.column("record_count")

    def one(name: str, values: dict[str, list[Any]], i: int) -> dict[int, Any] | None:
        v = values[name][i]
        return None if v is None else {fid: v}

    def test(i: int) -> bool:
        probe = DataFile(
            file_path=paths[i].as_py(),
            file_format="parquet",
            partition=(),
            record_count=records[i].as_py(),
            file_size_in_bytes=0,
            value_counts=one("value_counts", columns, i),
            null_value_counts=one("null_value_counts", columns, i),
            nan_value_counts=one("nan_value_counts", columns, i),
            lower_bounds=one("lower_bounds", raw, i),
            upper_bounds=one("upper_bounds", raw, i),
        )
        return evaluator.eval(probe)

    return _per_row(candidates, test)


def _count(mask: Any) -> int:
    total = pc.sum(mask).as_py()
    return int(total or 0)


# ---------------------------------------------------------------------------------------------
# The cache
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CacheStats:
    hits: int
    misses: int
    evictions: int
    entries: int
    bytes: int
    max_bytes: int
    bytes_read: int


class _ManifestList:
    __slots__ = ("manifests", "nbytes")

    def __init__(self, manifests: list[ManifestFile]) -> None:
        self.manifests = manifests
        size = 0
        for m in manifests:
            size += _MANIFEST_FILE_OVERHEAD + len(m.manifest_path)
            for s in m.partitions or ():
                size += 96 + len(s.lower_bound or b"") + len(s.upper_bound or b"")
        self.nbytes = size


class ManifestCache:
    """Decoded manifest lists and manifests by path, within ``max_bytes`` (LRU).

    Loads of one path are shared: concurrent plans missing the same manifest read and decode
    it once. Decoding runs in a worker thread so the event loop keeps serving requests.
    ``max_bytes=0`` disables caching (every read is a miss), which tests use as a reference.
    """

    def __init__(
        self,
        io: FileIO,
        max_bytes: int = DEFAULT_MAX_BYTES,
        *,
        load_concurrency: int = DEFAULT_LOAD_CONCURRENCY,
        decode_in_thread: bool = True,
        store: ManifestStore | None = None,
    ) -> None:
        if max_bytes < 0:
            raise ValidationError(f"cache max_bytes must be >= 0, got {max_bytes}")
        if load_concurrency < 1:
            raise ValidationError(f"load_concurrency must be >= 1, got {load_concurrency}")
        self.io = io
        self.max_bytes = max_bytes
        self.decode_in_thread = decode_in_thread
        self.store = store
        self._items: OrderedDict[str, Any] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._loading: dict[str, asyncio.Future[Any]] = {}
        self._semaphore = asyncio.Semaphore(load_concurrency)
        self._hits = 0
        self._misses = 0
        self._evictions = 0
        self._bytes_read = 0

    # -- bookkeeping ----------------------------------------------------------------------

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(
                hits=self._hits,
                misses=self._misses,
                evictions=self._evictions,
                entries=len(self._items),
                bytes=self._bytes,
                max_bytes=self.max_bytes,
                bytes_read=self._bytes_read,
            )

    def clear(self) -> None:
        with self._lock:
            for value in self._items.values():
                if isinstance(value, CachedManifest):
                    value._on_grow = None
            self._items.clear()
            self._bytes = 0

    def _lookup(self, key: str) -> Any:
        with self._lock:
            value = self._items.get(key)
            if value is None:
                self._misses += 1
                return None
            self._hits += 1
            self._items.move_to_end(key)
            return value

    def _store(self, key: str, value: Any) -> None:
        size = int(value.nbytes)
        with self._lock:
            if size > self.max_bytes:
                return
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= int(old.nbytes)
            self._items[key] = value
            self._bytes += size
            if isinstance(value, CachedManifest):
                value._on_grow = lambda grown, k=key: self._grew(k, grown)
            self._evict()

    def _grew(self, key: str, grown: int) -> None:
        with self._lock:
            if key in self._items:
                self._bytes += grown
                self._evict()

    def _evict(self) -> None:
        while self._bytes > self.max_bytes and self._items:
            _, value = self._items.popitem(last=False)
            self._bytes -= int(value.nbytes)
            self._evictions += 1
            if isinstance(value, CachedManifest):
                value._on_grow = None

    async def _load(self, key: str, load: Callable[[], Any]) -> Any:
        cached = self._lookup(key)
        if cached is not None:
            return cached
        pending = self._loading.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._loading[key] = future
        try:
            value = await load()
        except BaseException as e:
            future.set_exception(e)
            future.exception()  # retrieved: waiters re-raise it, nobody logs it as lost
            raise
        finally:
            self._loading.pop(key, None)
        future.set_result(value)
        self._store(key, value)
        return value

    async def _read(self, path: str) -> bytes:
        async with self._semaphore:
            data = await self.io.read(path)
        with self._lock:
            self._bytes_read += len(data)
        return data

    async def _decode(self, fn: Callable[..., Any], *args: Any) -> Any:
        if self.decode_in_thread:
            return await asyncio.to_thread(fn, *args)
        return fn(*args)

    # -- manifest lists ---------------------------------------------------------------------

    async def manifest_list(self, snapshot: Snapshot) -> list[ManifestFile]:
        """The manifests of a snapshot (v1 snapshots that list manifests directly too)."""
        if snapshot.manifest_list is not None:
            path = snapshot.manifest_list

            async def load_list() -> _ManifestList:
                data = await self._read(path)
                return _ManifestList(await self._decode(_decode_list, data, path))

            return list((await self._load(path, load_list)).manifests)
        paths = tuple(snapshot.manifests or ())
        key = f"snapshot-manifests:{snapshot.snapshot_id}:" + "\x00".join(paths)

        async def load_v1() -> _ManifestList:
            rows = []
            for path in paths:
                data = await self._read(path)
                rows.append(_v1_manifest_file(data, path, snapshot.snapshot_id))
            return _ManifestList(rows)

        return list((await self._load(key, load_v1)).manifests)

    # -- manifests --------------------------------------------------------------------------

    async def manifest(
        self, manifest: ManifestFile, specs: Mapping[int, PartitionSpec], schema: Schema
    ) -> CachedManifest:
        """A manifest's entries, decoded with its manifest list row (for inheritance)."""
        path = manifest.manifest_path

        async def load() -> CachedManifest:
            store = self.store
            if store is not None:
                found = await self._decode(_from_store, store, manifest, specs)
                if found is not None:
                    return found
            data = await self._read(path)
            cached: CachedManifest = await self._decode(
                CachedManifest.decode, data, manifest, specs, schema
            )
            if store is not None and cached._partitions is not None:
                await self._decode(
                    store.save, manifest, cached._columns, cached._partitions, cached.partition_type
                )
            return cached

        value: CachedManifest = await self._load(path, load)
        return value

    async def manifests(
        self,
        manifests: Sequence[ManifestFile],
        specs: Mapping[int, PartitionSpec],
        schema: Schema,
    ) -> list[CachedManifest]:
        """Several manifests, loaded concurrently (reads bounded by ``load_concurrency``)."""
        return list(await asyncio.gather(*(self.manifest(m, specs, schema) for m in manifests)))


def _from_store(
    store: ManifestStore, manifest: ManifestFile, specs: Mapping[int, PartitionSpec]
) -> CachedManifest | None:
    """A manifest's columns memory-mapped from the on-disk store, or None if absent."""
    spec = specs.get(manifest.partition_spec_id)
    if spec is None:
        return None  # decoding names the problem
    stored = store.load(manifest)
    if stored is None:
        return None
    return CachedManifest(
        manifest, spec, stored.partition_type, stored.columns, stored.partitions, None
    )


def _decode_list(data: bytes, path: str) -> list[ManifestFile]:
    return read_manifest_list(data, location=path)


def _v1_manifest_file(data: bytes, path: str, snapshot_id: int) -> ManifestFile:
    meta = read_manifest_metadata(data, location=path)
    try:
        spec_id = int(meta.get("partition-spec-id", "0"))
    except ValueError:
        raise InvalidFileError(path, "partition-spec-id metadata is not an integer") from None
    return ManifestFile(
        manifest_path=path,
        manifest_length=len(data),
        partition_spec_id=spec_id,
        content=ManifestContent.DATA,
        sequence_number=0,
        min_sequence_number=0,
        added_snapshot_id=snapshot_id,
    )


__all__ = [
    "DEFAULT_MAX_BYTES",
    "CacheStats",
    "CachedManifest",
    "FilePruner",
    "ManifestCache",
    "ManifestDecodeMismatch",
    "ManifestRows",
    "PruneCounts",
    "arrow_storage_type",
    "arrow_to_values",
    "decode_bounds",
    "metrics_leaf_mask",
    "partition_leaf_mask",
    "values_to_arrow",
]
