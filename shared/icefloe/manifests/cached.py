r"""One decoded manifest as Arrow columns, with inherited values filled in.

:class:`CachedManifest` is what the planner's cache holds per manifest: one Arrow array per
entry column (file path, status, sequence numbers, counts, the metric maps) and one per
partition field, decoded by a native Avro reader (:mod:`icefloe.manifests.arrow`) or, as the
reference and fallback, by fastavro. Per-column arrays cut out of the metric maps (counts and
decoded bounds of one column) are derived on first use and counted against the cache's
budget. Plans keep compact copies of their selected rows (:meth:`CachedManifest.compact`);
only callers that need Python objects turn rows into :class:`~icefloe.spec.datafile.DataFile`\ s
(:meth:`CachedManifest.rows`).
"""

from __future__ import annotations

import functools
import json
import logging
import math
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from icefloe.arrow.values import (
    arrow_to_values,
    decode_bounds,
    row_numbers,
    values_to_arrow,
)
from icefloe.avro.arrow import ReaderUnavailable, reader_chain
from icefloe.errors import IcefloeError, InvalidFileError, ValidationError
from icefloe.manifests.arrow import ArrowDecodeUnavailable, configured_decoder, decode_columns
from icefloe.manifests.manifest import (
    ManifestEntryStatus,
    read_manifest,
    read_manifest_metadata,
)
from icefloe.manifests.manifest_list import ManifestFile
from icefloe.manifests.store import ManifestStore
from icefloe.spec.datafile import DataFile, DataFileContent
from icefloe.spec.partition import PartitionSpec
from icefloe.spec.schema import Schema
from icefloe.spec.types import (
    PrimitiveType,
    StructType,
)

log = logging.getLogger(__name__)

# A fixed per-manifest overhead added to Arrow's buffer sizes, so thousands of tiny manifests
# cannot hide behind a budget that only counts their buffers.
_MANIFEST_OVERHEAD = 4096

_COUNT_MAP = pa.map_(pa.int32(), pa.int64())
_BOUND_MAP = pa.map_(pa.int32(), pa.binary())
COUNT_COLUMNS = ("column_sizes", "value_counts", "null_value_counts", "nan_value_counts")
BOUND_COLUMNS = ("lower_bounds", "upper_bounds")


def _map_value(array: Any, parents: Any, key: int, row_numbers: Any) -> Any:
    """The value of ``key`` in each row's map of a ``map<int, V>`` column (one map per
    file); null where the map or the key is absent. ``parents`` is each map entry's row.

    A row whose map holds ``key`` twice takes its first entry's value. The entries found
    are in row order, so when each row has at most one (always, for maps written by a
    conforming writer) they are spread by position (and are the answer as they are when
    every row has one); only duplicates need the hash lookup of ``index_in``: a cold plan
    cuts several such columns out of every manifest it decodes.
    """
    keys = array.keys
    value_type = array.type.item_type
    n = len(array)
    if len(keys) == 0:
        return pa.nulls(n, value_type)
    hit = pc.equal(keys, key)
    rows = pc.filter(parents, hit)
    if len(rows) == 0:
        return pa.nulls(n, value_type)
    values = pc.filter(array.items, hit)
    found = rows.to_numpy()
    if len(found) < 2 or bool((found[1:] > found[:-1]).all()):
        if len(found) == n:
            return values  # n distinct rows ascending in [0, n): every row, in order
        where = np.full(n, -1, dtype=np.int64)
        where[found] = np.arange(len(found), dtype=np.int64)
        return pc.take(values, pa.array(where, mask=where < 0))
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
        self._maps = frozenset(COUNT_COLUMNS + BOUND_COLUMNS)
        self._derived: dict[tuple[Any, ...], Any] = {}
        self._lock = threading.Lock()
        self._on_grow: Callable[[int], None] | None = None
        # The disk store of the cache that holds this manifest (set by the cache): where
        # values derived from all its rows are shared with the host's other processes.
        self.store: ManifestStore | None = None
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

        ``decoder`` is ``datafusion`` or ``duckdb`` (Arrow straight from that native Avro
        reader; what it cannot decode goes to the next reader of
        :func:`~icefloe.avro.arrow.reader_chain`, then to fastavro, each time with a logged
        reason), ``fastavro`` (the reference path) or ``verify`` (the default readers and
        fastavro, raising :class:`ManifestDecodeMismatch` if they differ); None reads
        ``ICEFLOE_MANIFEST_DECODER`` (:func:`~icefloe.manifests.arrow.configured_decoder`).
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
        readers = () if decoder == "fastavro" else reader_chain(decoder)
        for k, reader in enumerate(readers):
            try:
                decoded = decode_columns(data, manifest, spec, partition_type, reader=reader)
            except ReaderUnavailable:
                continue  # logged once, when the reader was found missing
            except ArrowDecodeUnavailable as unavailable:
                then = readers[k + 1] if k + 1 < len(readers) else "fastavro"
                log.warning("decoding %s with %s: %s", location, then, unavailable)
                continue
            arrow = cls(manifest, spec, partition_type, decoded[0], decoded[1], None)
            if decoder == "verify":
                reference = cls.decode(data, manifest, specs, schema, decoder="fastavro")
                same_columns(arrow, reference)
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
        return self._remember(("rows",), lambda: row_numbers(self.num_rows))

    def derived(
        self, key: tuple[Any, ...], make: Callable[[], Any], *, shared: str | None = None
    ) -> Any:
        """A value computed from this manifest's rows once (``make()``, which must give the
        same value for the same ``key`` every time) and kept with it, its ``nbytes``
        counted in the manifest's bytes as the columns derived for filters are: a writer
        of the REST JSON keeps the task texts of every row here, so the next full plan of
        the table serves its pages by copying them.

        ``shared`` (a text naming all that ``key`` names, stable across processes) also
        keeps an Arrow array in the cache's disk store (:attr:`store`) and looks for it
        there first, so the planner processes of a host, and a restarted one, write it once.
        """
        store = self.store
        if shared is None or store is None:
            return self._remember(("derived", *key), make)

        def load_or_make() -> Any:
            found = store.load_derived(self.manifest, shared)
            if found is not None:
                return found
            value = make()
            store.save_derived(self.manifest, shared, value)
            return value

        return self._remember(("derived", *key), load_or_make)

    def has_derived(self, key: tuple[Any, ...]) -> bool:
        """Whether :meth:`derived` holds a value for ``key`` already."""
        return ("derived", *key) in self._derived

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
        # One take over a record batch of every column: one call instead of one per column.
        batch = self._remember(("batch",), self._batch).batch
        taken = batch.take(take)
        names = list(self._columns)
        columns = {name: taken.column(i) for i, name in enumerate(names)}
        partitions = None
        if self._partitions is not None:
            partitions = [taken.column(len(names) + k) for k in range(len(self._partitions))]
        tuples = None
        if self._tuples is not None:
            tuples = [self._tuples[i] for i in take.to_pylist()]
        return CachedManifest(
            self.manifest, self.spec, self.partition_type, columns, partitions, tuples
        )

    def persist(self, store: ManifestStore) -> bool | None:
        """Save the columns to a disk store under this manifest's list row: whether the
        store wrote them, or None for a manifest whose partition values Arrow cannot hold
        (it is not stored: it is decoded each time)."""
        if self._partitions is None:
            return None
        return store.save(self.manifest, self._columns, self._partitions, self.partition_type)

    def _batch(self) -> _Batch:
        arrays = list(self._columns.values()) + list(self._partitions or ())
        names = list(self._columns) + [
            f"__partition_{k}" for k in range(len(self._partitions or ()))
        ]
        return _Batch(pa.RecordBatch.from_arrays(arrays, names=names))

    def _full(self, take: Any) -> bool:
        """Whether ``take`` lists every row in order (then nothing needs taking)."""
        n = self.num_rows
        return len(take) == n and n > 0 and take[0].as_py() == 0 and take[n - 1].as_py() == n - 1

    def rows(self, indices: Sequence[int] | Any, *, with_metrics: bool = True) -> ManifestRows:
        """DataFiles (and data sequence numbers) of the given rows, in that order.

        ``with_metrics=False`` leaves the column metric maps out (None), for callers that do
        not return them: building a dict per map and file is most of the cost of a row.
        """
        take = indices if isinstance(indices, pa.Array) else pa.array(indices, pa.int64())
        if len(take) == 0:
            return ManifestRows([], [])
        full = self._full(take)

        def cut(arr: Any) -> Any:
            return arr if full else pc.take(arr, take)

        cols: dict[str, list[Any]] = {}
        for name, arr in self._columns.items():
            if name in self._maps:
                cols[name] = map_dicts(cut(arr)) if with_metrics else [None] * len(take)
            else:
                cols[name] = cut(arr).to_pylist()
        if self._tuples is not None:
            tuples = [self._tuples[i] for i in take.to_pylist()]
        else:
            per_field = [
                arrow_to_values(f.field_type, cut(arr))
                for f, arr in zip(self.partition_type.fields, self._partitions or ())
            ]
            tuples = list(zip(*per_field)) if per_field else [()] * len(take)
        files = _data_files(cols, tuples, self.spec_id)
        seqs = [0 if s is None else s for s in cols["data_sequence_number"]]
        return ManifestRows(files, seqs)


class ManifestDecodeMismatch(IcefloeError):
    """The native and fastavro decodings of one manifest differ (``verify`` mode)."""


def same_columns(arrow: CachedManifest, reference: CachedManifest) -> None:
    """Raise :class:`ManifestDecodeMismatch` unless both decodings hold the same values."""
    where = arrow.path
    if arrow.num_rows != reference.num_rows:
        raise ManifestDecodeMismatch(
            f"{where}: {arrow.num_rows} rows natively, {reference.num_rows} from fastavro"
        )
    for name, expected in reference._columns.items():
        got = arrow._columns.get(name)
        if got is None:
            raise ManifestDecodeMismatch(f"{where}: the native reader gave no column {name!r}")
        if name in arrow._maps:
            same = map_dicts(got) == map_dicts(expected)
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


class _Batch:
    """A manifest's columns as one record batch, for single-call takes. It shares the
    columns' buffers, so it adds no bytes to the budget beyond a small overhead."""

    __slots__ = ("batch",)
    nbytes = 64

    def __init__(self, batch: Any) -> None:
        self.batch = batch


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
    try:
        meta = read_manifest_metadata(data, location=location)
    except IcefloeError:
        return spec.partition_type(schema)
    texts = (meta.get("schema"), meta.get("partition-spec"))
    try:
        return _partition_type_of(*texts, spec, schema)
    except TypeError:  # a schema that does not hash (a default value of a nested type)
        return _partition_type_of.__wrapped__(*texts, spec, schema)


@functools.lru_cache(maxsize=64)
def _partition_type_of(
    schema_text: str | None, spec_text: str | None, spec: PartitionSpec, schema: Schema
) -> StructType:
    """:func:`_writer_partition_type` from the manifest's metadata texts, once per distinct
    texts and table spec and schema (a table's manifests share them; parsing the writer's
    schema and spec was a tenth of a 5,000-entry decode). Struct types are immutable."""
    fallback = spec.partition_type(schema)
    try:
        writer_schema = Schema.from_json(json.loads(schema_text))  # type: ignore[arg-type]
        fields = json.loads(spec_text)  # type: ignore[arg-type]
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
    for name in COUNT_COLUMNS:
        columns[name] = pa.array([getattr(f, name) for f in files], _COUNT_MAP)
    for name in BOUND_COLUMNS:
        columns[name] = pa.array([getattr(f, name) for f in files], _BOUND_MAP)
    return columns


_CONTENTS = {c.value: c for c in DataFileContent}


def map_dicts(array: Any) -> list[dict[int, Any] | None]:
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


__all__ = [
    "BOUND_COLUMNS",
    "COUNT_COLUMNS",
    "CachedManifest",
    "ManifestDecodeMismatch",
    "ManifestRows",
    "map_dicts",
    "same_columns",
]
