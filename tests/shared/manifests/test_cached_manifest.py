"""Per-column arrays cut out of a cached manifest's metric maps.

The pruner reads one column's counts and bounds as an array with one value per file, cut out
of the ``map<int, V>`` columns. The law: row ``i`` holds the value of the first entry of row
``i``'s map with that key, null where the map is null or lacks the key, whatever the maps
(empty, null, keys repeated within a map, every row holding the key or none).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples
from icefloe.manifests.cached import CachedManifest
from icefloe.manifests.manifest_list import ManifestFile
from icefloe.spec.partition import PartitionSpec
from icefloe.spec.types import StructType

COUNT_MAP = pa.map_(pa.int32(), pa.int64())
BOUND_MAP = pa.map_(pa.int32(), pa.binary())

KEYS = st.integers(1, 4)


def _manifest(columns: dict[str, Any], n: int) -> CachedManifest:
    columns = {"file_path": pa.array([f"f{i}" for i in range(n)], pa.string()), **columns}
    row = ManifestFile(manifest_path="m.avro", manifest_length=1, partition_spec_id=0)
    return CachedManifest(row, PartitionSpec.unpartitioned(), StructType(), columns, [], None)


def _first(m: list[tuple[int, Any]] | None, key: int) -> Any:
    if m is None:
        return None
    return next((v for k, v in m if k == key), None)


def _maps(values: st.SearchStrategy[Any]) -> st.SearchStrategy[list[Any]]:
    one = st.none() | st.lists(st.tuples(KEYS, values), max_size=5)
    return st.lists(one, min_size=1, max_size=30)


@settings(max_examples=examples(200))
@given(
    counts=_maps(st.integers(0, 1000) | st.none()),
    key=KEYS,
    everywhere=st.booleans(),
)
def test_a_count_column_is_each_rows_first_entry_of_the_key(
    counts: list[Any], key: int, everywhere: bool
) -> None:
    if everywhere:  # the common case: every file has the column, once
        counts = [
            [(key, i)] + [(k, v) for k, v in m or [] if k != key] for i, m in enumerate(counts)
        ]
    m = _manifest({"value_counts": pa.array(counts, COUNT_MAP)}, len(counts))
    got = m.counts("value_counts", key)
    assert got.type == pa.int64()
    assert got.to_pylist() == [_first(c, key) for c in counts]


@settings(max_examples=examples(200))
@given(bounds=_maps(st.binary(max_size=9)), key=KEYS)
def test_a_bound_column_is_each_rows_first_entry_of_the_key(bounds: list[Any], key: int) -> None:
    m = _manifest({"lower_bounds": pa.array(bounds, BOUND_MAP)}, len(bounds))
    got = m.raw_bounds("lower_bounds", key)
    assert got.type == pa.binary()
    assert got.to_pylist() == [_first(b, key) for b in bounds]
