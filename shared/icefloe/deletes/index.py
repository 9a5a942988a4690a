"""Which delete files apply to which data file (spec: "Scan Planning", "Delete Formats").

A planner reads every live delete file of the snapshot that survives partition pruning once,
indexes it here, and then asks, for each data file it keeps, which deletes a reader must
apply. The scope rules are the spec's:

* a **deletion vector** (v3) applies to the data file named by its ``referenced_data_file``,
  in the same partition (spec and values), when the data file's data sequence number is
  less than or equal to the vector's. When one applies, position delete files are ignored
  for that data file (a vector replaces them);
* a **position delete file** applies to data files of the same partition (spec and values)
  whose data sequence number is less than or equal to the delete's (equal: rows deleted in
  the commit that added them). A non-null ``referenced_data_file`` limits it to that one
  file, and otherwise the bounds of its ``file_path`` column rule out the files whose path
  lies outside them. Position deletes are never global;
* an **equality delete file** applies to data files whose data sequence number is strictly
  less than the delete's, in the same partition, or everywhere when the delete file's spec
  is unpartitioned. The column metrics of the equality columns can rule a data file out:
  when the data file's values and the deleted values cannot meet, no row can be deleted.

Partition values are compared as the spec requires: floating point values by their bit
pattern (so -0.0 and 0.0 are different partitions, and all NaNs are one).
"""

from __future__ import annotations

import bisect
import math
import struct
from collections.abc import Iterable, Mapping
from typing import Any

from icefloe.errors import ValidationError
from icefloe.spec.datafile import DataFile, DataFileContent, FileFormat
from icefloe.spec.partition import PartitionSpec
from icefloe.spec.schema import Schema
from icefloe.spec.types import DoubleType, FloatType, PrimitiveType
from icefloe.spec.values import from_bytes

# Reserved field id of the ``file_path`` column of position delete files.
DELETE_FILE_PATH_ID = 2147483546

_DOUBLE = struct.Struct("<d")
_CANONICAL_NAN = _DOUBLE.pack(math.nan)


def partition_key(values: tuple[Any, ...]) -> tuple[Any, ...]:
    """A partition tuple made hashable by the spec's equality: floats by their bits."""
    if not any(type(v) is float for v in values):
        return values
    return tuple(_float_bits(v) if type(v) is float else v for v in values)


def _float_bits(v: float) -> tuple[str, bytes]:
    return ("float", _CANONICAL_NAN if math.isnan(v) else _DOUBLE.pack(v))


def is_deletion_vector(f: DataFile) -> bool:
    """A v3 deletion vector: a position delete stored as a blob of a Puffin file."""
    return f.content == DataFileContent.POSITION_DELETES and (
        f.file_format == FileFormat.PUFFIN or f.content_offset is not None
    )


class _Bucket:
    """Deletes of one scope, ordered by data sequence number for range lookups.

    Sorting happens on the first lookup and publishes the sorted lists as one tuple, so
    threads building tasks of one plan concurrently never see half-sorted lists.
    """

    __slots__ = ("_entries", "_view")

    def __init__(self) -> None:
        self._entries: list[tuple[int, DataFile]] = []
        self._view: tuple[list[int], list[DataFile]] | None = None

    def add(self, seq: int, f: DataFile) -> None:
        self._entries.append((seq, f))
        self._view = None

    def _sorted(self) -> tuple[list[int], list[DataFile]]:
        view = self._view
        if view is None:
            ordered = sorted(self._entries, key=lambda e: e[0])
            view = ([s for s, _ in ordered], [f for _, f in ordered])
            self._view = view
        return view

    def at_least(self, seq: int) -> list[DataFile]:
        """Deletes with a data sequence number >= ``seq``."""
        seqs, files = self._sorted()
        return files[bisect.bisect_left(seqs, seq) :]

    def above(self, seq: int) -> list[DataFile]:
        """Deletes with a data sequence number > ``seq``."""
        seqs, files = self._sorted()
        return files[bisect.bisect_right(seqs, seq) :]

    def ordered(self) -> tuple[list[int], list[DataFile]]:
        """Data sequence numbers and deletes, in the order lookups return them."""
        return self._sorted()


class DeleteFileIndex:
    """Delete files of one snapshot, indexed for :meth:`for_data_file`.

    ``specs`` are the table's partition specs (to tell unpartitioned equality deletes) and
    ``schema`` types the equality columns' bounds; a column missing from it is never used
    to rule a file out.
    """

    def __init__(self, specs: Mapping[int, PartitionSpec], schema: Schema) -> None:
        self.specs = specs
        self.schema = schema
        self._global_eq = _Bucket()
        self._eq: dict[tuple[int, tuple[Any, ...]], _Bucket] = {}
        self._pos: dict[tuple[int, tuple[Any, ...]], _Bucket] = {}
        self._pos_by_path: dict[str, _Bucket] = {}
        self._dvs: dict[str, _Bucket] = {}
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def add(self, delete_file: DataFile, data_sequence_number: int) -> None:
        """Index one live delete file with its (inherited) data sequence number."""
        f = delete_file
        seq = data_sequence_number
        if f.content == DataFileContent.DATA:
            raise ValidationError(f"{f.file_path}: a data file is not a delete file")
        spec = self.specs.get(f.spec_id)
        if spec is None:
            raise ValidationError(
                f"delete file {f.file_path} uses partition spec {f.spec_id}, which the table "
                f"does not have (specs: {sorted(self.specs)})"
            )
        key = (f.spec_id, partition_key(f.partition))
        if f.content == DataFileContent.EQUALITY_DELETES:
            if not f.equality_ids:
                raise ValidationError(f"equality delete file {f.file_path} lists no equality_ids")
            if spec.is_unpartitioned:
                self._global_eq.add(seq, f)
            else:
                self._eq.setdefault(key, _Bucket()).add(seq, f)
        elif is_deletion_vector(f):
            if not f.referenced_data_file:
                raise ValidationError(
                    f"deletion vector in {f.file_path} has no referenced_data_file"
                )
            if f.referenced_data_file in self._dvs:
                # The spec allows at most one DV per data file in a snapshot; two mean a
                # writer did not merge, and applying either alone could resurrect rows.
                (other,) = self._dvs[f.referenced_data_file].at_least(0)
                raise ValidationError(
                    f"two deletion vectors for data file {f.referenced_data_file}: "
                    f"{other.file_path}@{other.content_offset} and "
                    f"{f.file_path}@{f.content_offset} (a snapshot may hold at most one)"
                )
            self._dvs.setdefault(f.referenced_data_file, _Bucket()).add(seq, f)
        elif f.referenced_data_file:
            self._pos_by_path.setdefault(f.referenced_data_file, _Bucket()).add(seq, f)
        else:
            self._pos.setdefault(key, _Bucket()).add(seq, f)
        self._count += 1

    def add_all(self, files: Iterable[tuple[DataFile, int]]) -> DeleteFileIndex:
        for f, seq in files:
            self.add(f, seq)
        return self

    def referenced_paths(self) -> frozenset[str]:
        """Data file paths that deletion vectors or path-scoped position deletes name."""
        return frozenset(self._dvs) | frozenset(self._pos_by_path)

    def scopes_partition(self, spec_id: int, partition: tuple[Any, ...]) -> bool:
        """Whether partition-scoped position or equality deletes exist for this partition."""
        key = (spec_id, partition_key(partition))
        return key in self._pos or key in self._eq

    def max_global_sequence(self) -> int | None:
        """The highest data sequence number of a global equality delete, None if none."""
        seqs, _ = self._global_eq._sorted()
        return seqs[-1] if seqs else None

    def has_equality_deletes(self) -> bool:
        return bool(self._eq) or self.max_global_sequence() is not None

    # -- the scopes, for callers that select deletes for many rows at once ----------------------

    def scopes_equality(self, spec_id: int, partition: tuple[Any, ...]) -> bool:
        """Whether partition-scoped equality deletes exist for this partition."""
        return (spec_id, partition_key(partition)) in self._eq

    def path_deletes(
        self, path: str
    ) -> tuple[tuple[list[int], list[DataFile]], tuple[list[int], list[DataFile]]]:
        """The deletion vectors and the path-scoped position deletes naming data file
        ``path``, each with their sequence numbers, in lookup order. As in
        :meth:`for_data_file`, one applies to a file of its partition (:func:`same_partition`)
        whose sequence number is ``<=`` its own, and an applying vector replaces every
        position delete."""
        dvs = self._dvs.get(path)
        by_path = self._pos_by_path.get(path)
        return (
            dvs.ordered() if dvs is not None else ([], []),
            by_path.ordered() if by_path is not None else ([], []),
        )

    def has_partition_position_deletes(self) -> bool:
        return bool(self._pos)

    def partition_position_deletes(
        self, spec_id: int, partition: tuple[Any, ...]
    ) -> tuple[list[int], list[DataFile]]:
        """Position deletes scoped to a partition, with their sequence numbers, in lookup
        order (each applies to files with ``seq <=`` its own whose path lies within its
        bounds: :func:`path_bounds`)."""
        bucket = self._pos.get((spec_id, partition_key(partition)))
        return bucket.ordered() if bucket is not None else ([], [])

    def equality_deletes_for(
        self, data_file: DataFile, data_sequence_number: int
    ) -> list[DataFile]:
        """The equality deletes a reader must apply to ``data_file`` (global, then of its
        partition), as :meth:`for_data_file` lists them after the position deletes."""
        seq = data_sequence_number
        out = [d for d in self._global_eq.above(seq) if self._may_share_rows(data_file, d)]
        bucket = self._eq.get((data_file.spec_id, partition_key(data_file.partition)))
        if bucket is not None:
            out.extend(d for d in bucket.above(seq) if self._may_share_rows(data_file, d))
        return out

    def for_data_file(self, data_file: DataFile, data_sequence_number: int) -> list[DataFile]:
        """The delete files a reader must apply to ``data_file`` (in no particular order)."""
        if not self._count:
            return []
        seq = data_sequence_number
        path = data_file.file_path
        key = (data_file.spec_id, partition_key(data_file.partition))
        out: list[DataFile] = []

        dvs = self._dvs.get(path)
        vectors = (
            [d for d in dvs.at_least(seq) if _same_partition(d, key)] if dvs is not None else []
        )
        if vectors:
            out.extend(vectors)
        else:
            by_path = self._pos_by_path.get(path)
            if by_path is not None:
                out.extend(d for d in by_path.at_least(seq) if _same_partition(d, key))
            bucket = self._pos.get(key)
            if bucket is not None:
                out.extend(d for d in bucket.at_least(seq) if _path_within(d, path))

        out.extend(self.equality_deletes_for(data_file, seq))
        return out

    # -- equality delete pruning --------------------------------------------------------------

    def _may_share_rows(self, data: DataFile, delete: DataFile) -> bool:
        """False when the metrics prove no data row equals any deleted row."""
        return all(self._column_may_match(data, delete, fid) for fid in delete.equality_ids or ())

    def _column_may_match(self, data: DataFile, delete: DataFile, fid: int) -> bool:
        data_nulls = _count(data.null_value_counts, fid)
        delete_nulls = _count(delete.null_value_counts, fid)
        data_values = _count(data.value_counts, fid)
        delete_values = _count(delete.value_counts, fid)
        # A null delete value matches null data values (spec: "Equality Delete Files").
        nulls_may_meet = data_nulls != 0 and delete_nulls != 0
        if nulls_may_meet:
            return True
        data_only_nulls = (
            data_nulls is not None and data_values is not None and (data_nulls >= data_values)
        )
        delete_only_nulls = (
            delete_nulls is not None
            and delete_values is not None
            and (delete_nulls >= delete_values)
        )
        if data_only_nulls or delete_only_nulls:
            return False  # one side has only nulls and the other no null
        field_ = self.schema.find_field(fid)
        if field_ is None or not isinstance(field_.field_type, PrimitiveType):
            return True
        t = field_.field_type
        if isinstance(t, FloatType | DoubleType) and (
            _count(data.nan_value_counts, fid) != 0 and _count(delete.nan_value_counts, fid) != 0
        ):
            return True  # NaN bounds are never recorded; NaN rows may meet NaN deletes
        data_lower = _bound(t, data.lower_bounds, fid)
        data_upper = _bound(t, data.upper_bounds, fid)
        delete_lower = _bound(t, delete.lower_bounds, fid)
        delete_upper = _bound(t, delete.upper_bounds, fid)
        if data_upper is not None and delete_lower is not None and data_upper < delete_lower:
            return False
        return not (
            data_lower is not None and delete_upper is not None and delete_upper < data_lower
        )


def _count(counts: Mapping[int, int] | None, fid: int) -> int | None:
    return None if counts is None else counts.get(fid)


def _bound(t: PrimitiveType, bounds: Mapping[int, bytes] | None, fid: int) -> Any:
    """A decoded bound, or None when absent, undecodable or NaN (then it proves nothing)."""
    raw = None if bounds is None else bounds.get(fid)
    if raw is None:
        return None
    try:
        value = from_bytes(t, raw)
    except ValidationError:
        return None
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def _same_partition(delete: DataFile, key: tuple[int, tuple[Any, ...]]) -> bool:
    return (delete.spec_id, partition_key(delete.partition)) == key


def same_partition(delete: DataFile, spec_id: int, partition: tuple[Any, ...]) -> bool:
    """Whether a delete file is in this partition (spec and values, floats by their bits)."""
    return _same_partition(delete, (spec_id, partition_key(partition)))


def path_bounds(delete: DataFile) -> tuple[bytes | None, bytes | None]:
    """The lower and upper bound of a position delete's ``file_path`` column (UTF-8 bytes,
    whose order is code point order), None where absent: paths outside them have no row
    deleted by it."""
    lower = (delete.lower_bounds or {}).get(DELETE_FILE_PATH_ID)
    upper = (delete.upper_bounds or {}).get(DELETE_FILE_PATH_ID)
    return lower, upper


def _path_within(delete: DataFile, path: str) -> bool:
    """Whether ``path`` lies within the bounds of a position delete's ``file_path`` column."""
    lower, upper = path_bounds(delete)
    encoded = path.encode("utf-8")
    # UTF-8 bytes order is code point order, so the raw bounds compare as strings do.
    if lower is not None and encoded < lower:
        return False
    return not (upper is not None and encoded > upper)


__all__ = [
    "DELETE_FILE_PATH_ID",
    "DeleteFileIndex",
    "is_deletion_vector",
    "partition_key",
    "path_bounds",
    "same_partition",
]
