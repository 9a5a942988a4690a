"""The planner's manifest cache: exact agreement with the per-file evaluators, and the budget.

The central law: for any manifest and any filter, the rows :class:`FilePruner` selects over
the cached Arrow columns are exactly the live entries whose partition satisfies the filter's
inclusive projection (decided by the row evaluator on the partition tuple) and whose metrics
the :class:`~icefloe.expressions.evaluators.MetricsEvaluator` cannot rule out. The vectorized path is an
accelerator of those evaluators, never a second set of semantics, so they are the oracle.
"""

from __future__ import annotations

import asyncio
import io
import math
import struct
import uuid
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from manifest_fixtures import PRIMITIVE_FIELDS, write_manifest

from hypothesis_budget import examples
from icefloe.errors import InvalidFileError, ValidationError
from icefloe.expressions import (
    AlwaysTrue,
    And,
    BooleanExpression,
    BoundLiteralPredicate,
    BoundSetPredicate,
    BoundTerm,
    BoundUnaryPredicate,
    Not,
    Operation,
    Or,
    Reference,
    TransformTerm,
    rewrite_not,
)
from icefloe.expressions.binding import bind_reference, bind_term
from icefloe.expressions.evaluators import MetricsEvaluator, compile_row_filter
from icefloe.expressions.projection import inclusive_projection
from icefloe.io.fileio import FileIO, LocalFileIO
from icefloe.manifests.cache import (
    CachedManifest,
    FilePruner,
    ManifestCache,
    arrow_to_values,
    decode_bounds,
    values_to_arrow,
)
from icefloe.manifests.manifest import (
    ManifestEntry,
    ManifestEntryStatus,
    ManifestWriter,
    read_manifest,
)
from icefloe.manifests.manifest_list import ManifestFile, write_manifest_list
from icefloe.manifests.store import ManifestStore, store_key
from icefloe.spec.datafile import DataFile, DataFileContent
from icefloe.spec.partition import PartitionSpec, PartitionSpecBuilder
from icefloe.spec.schema import Schema
from icefloe.spec.snapshot import Snapshot
from icefloe.spec.types import (
    BinaryType,
    BooleanType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    NestedField,
    PrimitiveType,
    StringType,
    UUIDType,
)
from icefloe.spec.values import to_bytes

SCHEMA = Schema(*PRIMITIVE_FIELDS)
SPEC = (
    PartitionSpecBuilder(SCHEMA)
    .add_field("i", "identity")
    .add_field("l", "bucket[8]")
    .add_field("s", "truncate[2]")
    .add_field("d", "identity")
    .add_field("ts", "day")
    .add_field("dec", "identity")
    .add_field("u", "identity")
    .add_field("b", "identity")
    .build()
)
SPECS = {SPEC.spec_id: SPEC}
PARTITION_TYPE = SPEC.partition_type(SCHEMA)
SNAPSHOT_ID = 77
SEQ = 5

# ---------------------------------------------------------------------------------------------
# Values
# ---------------------------------------------------------------------------------------------

_F32 = struct.Struct("<f")


def _f32(x: float) -> float:
    return float(_F32.unpack(_F32.pack(x))[0])


floats32 = st.sampled_from([-1.5, -0.0, 0.0, 0.25, 3.0, 7.5, 1e6]).map(_f32)
doubles = st.sampled_from([-2.5, -0.0, 0.0, 0.1, 1.0, 3.25, 100.0])
strings = st.sampled_from(["", "a", "ab", "abc", "b", "ba", "zz", "é", "éa"])
uuids = st.sampled_from([uuid.UUID(int=i << 100) for i in (0, 1, 7, 15)])
decimals = st.sampled_from([Decimal("-1.50"), Decimal("0.00"), Decimal("2.25"), Decimal("99.99")])
binaries = st.sampled_from([b"", b"\x00", b"\x01\x02", b"\x80", b"\xff\xff"])

VALUES: dict[int, st.SearchStrategy[Any]] = {
    1: st.integers(-5, 5),
    2: st.integers(-(2**40), 2**40) | st.integers(-5, 5),
    3: strings,
    4: doubles,
    5: st.integers(19_000, 19_010),
    6: decimals,
    7: uuids,
    8: st.booleans(),
    9: binaries,
    10: floats32,
    11: st.integers(19_000 * 86_400_000_000, 19_003 * 86_400_000_000),
}
FLOATING = {4, 10}

PARTITION_VALUES: list[st.SearchStrategy[Any]] = [
    st.none() | st.integers(-5, 5),  # i
    st.none() | st.integers(0, 7),  # bucket
    st.none() | st.sampled_from(["", "a", "ab", "ba", "zz", "é"]),  # truncate[2]
    st.none() | doubles | st.just(math.nan),  # d
    st.none() | st.integers(19_000, 19_004),  # day
    st.none() | decimals,
    st.none() | uuids,
    st.none() | st.booleans(),
]


def _encode_bound(fid: int, value: Any, narrow: bool) -> bytes:
    t = SCHEMA.find_type(fid)
    assert isinstance(t, PrimitiveType)
    # Bounds written before a promotion keep their old width: 4-byte longs and doubles.
    if narrow and fid == 2 and -(2**31) <= value < 2**31:
        return to_bytes(IntegerType(), value)
    if narrow and fid == 4 and not math.isnan(value) and _f32(value) == value:
        return to_bytes(FloatType(), value)
    return to_bytes(t, value)


@st.composite
def data_files(draw: st.DrawFn, index: int) -> DataFile:
    partition = tuple(draw(s) for s in PARTITION_VALUES)
    record_count = draw(st.sampled_from([-1, 0, 1, 5, 100]))
    counts: dict[str, dict[int, int]] = {
        "value_counts": {},
        "null_value_counts": {},
        "nan_value_counts": {},
    }
    lower: dict[int, bytes] = {}
    upper: dict[int, bytes] = {}
    for fid, values in VALUES.items():
        if draw(st.booleans()):
            counts["value_counts"][fid] = draw(st.integers(0, 6))
        if draw(st.booleans()):
            counts["null_value_counts"][fid] = draw(st.integers(0, 6))
        if fid in FLOATING and draw(st.booleans()):
            counts["nan_value_counts"][fid] = draw(st.integers(0, 6))
        narrow = draw(st.booleans())
        if draw(st.integers(0, 3)):
            lo = draw(values)
            hi = draw(values)
            if fid in FLOATING and draw(st.integers(0, 9)) == 0:
                lo = math.nan  # an old writer's NaN bound: unusable
            lower[fid] = _encode_bound(fid, lo, narrow)
            if draw(st.integers(0, 3)):
                upper[fid] = _encode_bound(fid, hi, narrow)
    return DataFile(
        file_path=f"s3://bucket/data/f-{index:04d}.parquet",
        file_format="parquet",
        partition=partition,
        record_count=record_count,
        file_size_in_bytes=1000 + index,
        value_counts=counts["value_counts"] or None,
        null_value_counts=counts["null_value_counts"],
        nan_value_counts=counts["nan_value_counts"] if draw(st.booleans()) else None,
        lower_bounds=lower,
        upper_bounds=upper if draw(st.integers(0, 5)) else None,
        split_offsets=[4] if index % 3 == 0 else None,
        sort_order_id=index % 2 or None,
    )


# ---------------------------------------------------------------------------------------------
# Filters, built bound so literals are exactly the internal values
# ---------------------------------------------------------------------------------------------


def _ref(fid: int) -> BoundTerm:
    name = SCHEMA.find_column_name(fid)
    assert name is not None
    return bind_reference(SCHEMA, Reference(name))


_TRANSFORM_TERMS: list[tuple[str, str, st.SearchStrategy[Any]]] = [
    ("bucket[8]", "l", st.integers(0, 7)),
    ("day", "ts", st.integers(19_000, 19_004)),
    ("truncate[2]", "s", st.sampled_from(["", "a", "ab", "é"])),
]


@st.composite
def predicates(draw: st.DrawFn) -> BooleanExpression:
    if draw(st.integers(0, 9)) == 0:
        transform, column, values = draw(st.sampled_from(_TRANSFORM_TERMS))
        term = bind_term(SCHEMA, TransformTerm(transform, column))
        op = draw(st.sampled_from([Operation.EQ, Operation.LT_EQ, Operation.NOT_EQ]))
        return BoundLiteralPredicate(op, term, draw(values))
    fid = draw(st.sampled_from(sorted(VALUES)))
    ref = _ref(fid)
    values = VALUES[fid]
    ops = [
        Operation.IS_NULL,
        Operation.NOT_NULL,
        Operation.LT,
        Operation.LT_EQ,
        Operation.GT,
        Operation.GT_EQ,
        Operation.EQ,
        Operation.NOT_EQ,
        Operation.IN,
        Operation.NOT_IN,
    ]
    if fid in FLOATING:
        ops += [Operation.IS_NAN, Operation.NOT_NAN]
    if fid == 3:
        ops += [Operation.STARTS_WITH, Operation.NOT_STARTS_WITH]
    op = draw(st.sampled_from(ops))
    if op.is_unary:
        return BoundUnaryPredicate(op, ref)
    if op.is_set:
        size = draw(st.sampled_from([1, 2, 3, 40]))
        if size == 40 and fid in (1, 2, 5, 11):
            base = draw(values)
            literals = {base + k for k in range(size)}
        else:
            literals = set(draw(st.lists(values, min_size=1, max_size=size)))
        return BoundSetPredicate(op, ref, literals)
    return BoundLiteralPredicate(op, ref, draw(values))


def filters() -> st.SearchStrategy[BooleanExpression]:
    return st.recursive(
        predicates(),
        lambda children: st.one_of(
            st.tuples(children, children).map(lambda t: And(*t)),
            st.tuples(children, children).map(lambda t: Or(*t)),
            children.map(Not),
        ),
        max_leaves=5,
    )


# ---------------------------------------------------------------------------------------------
# Manifests in memory
# ---------------------------------------------------------------------------------------------

STATUSES = [ManifestEntryStatus.ADDED, ManifestEntryStatus.EXISTING, ManifestEntryStatus.DELETED]


def write(
    files: list[DataFile],
    statuses: list[ManifestEntryStatus],
    *,
    spec: PartitionSpec = SPEC,
    schema: Schema = SCHEMA,
    path: str = "s3://bucket/metadata/m.avro",
) -> tuple[bytes, ManifestFile]:
    """Files in their statuses, those not added by an older snapshot."""
    entries = [
        (
            status,
            f
            if status == ManifestEntryStatus.ADDED
            else ManifestEntry(status, SNAPSHOT_ID - 1, SEQ - 1, SEQ - 1, f),
        )
        for f, status in zip(files, statuses)
    ]
    return write_manifest(
        entries,
        spec=spec,
        schema=schema,
        snapshot_id=SNAPSHOT_ID,
        path=path,
        sequence_number=SEQ,
        min_sequence_number=SEQ - 1,
    )


def oracle(
    files: list[DataFile], statuses: list[ManifestEntryStatus], expr: BooleanExpression
) -> list[int]:
    partition_filter = inclusive_projection(SCHEMA, SPEC)(expr)
    in_partition = compile_row_filter(partition_filter)
    metrics = MetricsEvaluator(SCHEMA, expr)
    return [
        i
        for i, (f, status) in enumerate(zip(files, statuses))
        if status != ManifestEntryStatus.DELETED and in_partition(f.partition) and metrics(f)
    ]


@st.composite
def manifests(draw: st.DrawFn) -> tuple[list[DataFile], list[ManifestEntryStatus]]:
    n = draw(st.integers(0, 24))
    files = [draw(data_files(i)) for i in range(n)]
    statuses = [draw(st.sampled_from(STATUSES)) for _ in range(n)]
    return files, statuses


@settings(
    max_examples=examples(150),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(manifests(), filters())
def test_vectorized_pruning_selects_exactly_what_the_per_file_evaluators_select(
    manifest: tuple[list[DataFile], list[ManifestEntryStatus]], expr: BooleanExpression
) -> None:
    files, statuses = manifest
    data, row = write(files, statuses)
    cached = CachedManifest.decode(data, row, SPECS, SCHEMA)
    bound = rewrite_not(expr)
    pruner = FilePruner(SCHEMA, inclusive_projection(SCHEMA, SPEC)(bound), bound)
    selected = pruner.select(cached).to_pylist()
    assert selected == oracle(files, statuses, bound)
    assert pruner.counts.selected == len(selected)
    live = sum(s != ManifestEntryStatus.DELETED for s in statuses)
    assert pruner.counts.considered == live
    assert pruner.counts.by_partition + pruner.counts.by_metrics + len(selected) == live


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(manifests())
def test_cached_rows_are_the_manifest_entries_with_inherited_sequence_numbers(
    manifest: tuple[list[DataFile], list[ManifestEntryStatus]],
) -> None:
    files, statuses = manifest
    data, row = write(files, statuses)
    cached = CachedManifest.decode(data, row, SPECS, SCHEMA)
    expected = read_manifest(data, location=row.manifest_path, manifest_file=row, spec_by_id=SPECS)
    got = cached.rows(list(range(cached.num_rows)))
    assert _comparable(got.data_files) == _comparable([e.data_file for e in expected])
    assert got.data_sequence_numbers == [e.sequence_number for e in expected]
    added = [i for i, s in enumerate(statuses) if s == ManifestEntryStatus.ADDED]
    assert all(got.data_sequence_numbers[i] == SEQ for i in added)
    # A subset, out of order, comes back in the order asked for.
    picked = list(reversed(range(0, cached.num_rows, 2)))
    assert _comparable(cached.rows(picked).data_files) == _comparable(
        [expected[i].data_file for i in picked]
    )


def _comparable(files: list[DataFile]) -> list[DataFile]:
    """NaN partition values made equal to each other (NaN != NaN would fail any list compare)."""
    nan = "NaN"
    return [f.copy(partition=tuple(nan if v != v else v for v in f.partition)) for f in files]


def test_the_empty_selection_and_the_empty_manifest() -> None:
    data, row = write([], [])
    cached = CachedManifest.decode(data, row, SPECS, SCHEMA)
    bound = rewrite_not(BoundUnaryPredicate(Operation.IS_NULL, _ref(1)))
    pruner = FilePruner(SCHEMA, inclusive_projection(SCHEMA, SPEC)(bound), bound)
    assert pruner.select(cached).to_pylist() == []
    assert cached.rows([]).data_files == []


def test_incremental_selection_keeps_only_entries_added_by_the_given_snapshots() -> None:
    files = [
        DataFile(f"s3://b/f{i}.parquet", "parquet", (None,) * 8, 1, 10, value_counts={})
        for i in range(4)
    ]
    statuses = [
        ManifestEntryStatus.ADDED,
        ManifestEntryStatus.EXISTING,
        ManifestEntryStatus.DELETED,
        ManifestEntryStatus.ADDED,
    ]
    data, row = write(files, statuses)
    cached = CachedManifest.decode(data, row, SPECS, SCHEMA)
    pruner = FilePruner(SCHEMA, AlwaysTrue(), AlwaysTrue())
    assert pruner.select(cached, which="added").to_pylist() == [0, 3]
    only = frozenset({SNAPSHOT_ID})
    assert pruner.select(cached, which="added", snapshot_ids=only).to_pylist() == [0, 3]
    assert pruner.select(cached, which="added", snapshot_ids=frozenset({1})).to_pylist() == []
    assert pruner.select(cached).to_pylist() == [0, 1, 3]
    with pytest.raises(ValidationError, match="unknown entry selection"):
        pruner.select(cached, which="everything")


# ---------------------------------------------------------------------------------------------
# Bounds decoding and value conversion
# ---------------------------------------------------------------------------------------------


def _raw(values: list[bytes | None]) -> pa.Array:
    return pa.array(values, pa.binary())


def test_bounds_decode_with_promotion_nan_and_nulls() -> None:
    def path(row: int) -> str:
        return f"file-{row}"

    longs = decode_bounds(
        LongType(),
        _raw([to_bytes(IntegerType(), -3), None, to_bytes(IntegerType(), 7)]),
        path,
        "l",
        "lower",
    )
    assert longs.type == pa.int64() and longs.to_pylist() == [-3, None, 7]
    mixed = decode_bounds(
        LongType(),
        _raw([to_bytes(IntegerType(), 1), to_bytes(LongType(), 2**40)]),
        path,
        "l",
        "lower",
    )
    assert mixed.to_pylist() == [1, 2**40]
    doubles = decode_bounds(
        DoubleType(),
        _raw([to_bytes(DoubleType(), 1.5), to_bytes(DoubleType(), math.nan), None]),
        path,
        "d",
        "upper",
    )
    assert doubles.to_pylist() == [1.5, None, None]
    widened = decode_bounds(DoubleType(), _raw([to_bytes(FloatType(), 0.5)]), path, "d", "upper")
    assert widened.to_pylist() == [0.5]
    text = decode_bounds(StringType(), _raw([b"abc", "é".encode()]), path, "s", "lower")
    assert text.to_pylist() == ["abc", "é"]
    dec = decode_bounds(
        DecimalType(9, 2),
        _raw([to_bytes(DecimalType(9, 2), Decimal("1.25"))]),
        path,
        "dec",
        "lower",
    )
    assert dec.to_pylist() == [Decimal("1.25")]
    assert decode_bounds(IntegerType(), _raw([None, None]), path, "i", "lower").null_count == 2


def test_undecodable_bounds_name_the_file_and_column() -> None:
    with pytest.raises(InvalidFileError, match=r"file-1: the lower bound of column 's'"):
        decode_bounds(StringType(), _raw([b"ok", b"\xff\xfe"]), lambda r: f"file-{r}", "s", "lower")
    with pytest.raises(InvalidFileError, match=r"file-0: the upper bound of column 'i'"):
        decode_bounds(IntegerType(), _raw([b"\x01\x02\x03"]), lambda r: f"file-{r}", "i", "upper")


@pytest.mark.parametrize(
    ("t", "values"),
    [
        (IntegerType(), [1, None, -(2**31)]),
        (LongType(), [2**62, None]),
        (StringType(), ["é", None, ""]),
        (UUIDType(), [uuid.UUID(int=5), None]),
        (DecimalType(5, 2), [Decimal("1.25"), None]),
        (BinaryType(), [b"\x00\xff", None]),
        (BooleanType(), [True, False, None]),
        (DoubleType(), [math.inf, -0.0, None]),
    ],
)
def test_values_round_trip_through_arrow(t: PrimitiveType, values: list[Any]) -> None:
    array = values_to_arrow(t, values)
    assert array is not None
    assert arrow_to_values(t, array) == values


def test_values_arrow_cannot_hold_fall_back_to_python_tuples() -> None:
    assert values_to_arrow(IntegerType(), [2**40]) is None
    # A manifest whose partition values do not fit their declared Arrow type is still cached,
    # with Python tuples for its partitions, and pruned by the row evaluator.
    narrow = Schema(NestedField(1, "i", IntegerType()), NestedField(2, "l", LongType()))
    spec = PartitionSpecBuilder(narrow).add_field("i", "identity").build()
    files = [DataFile(f"s3://b/{v}.parquet", "parquet", (v,), 1, 1) for v in (1, 2, 3)]
    data, row = write(files, [ManifestEntryStatus.ADDED] * 3, spec=spec, schema=narrow)
    wide = Schema(NestedField(1, "i", LongType()), NestedField(2, "l", LongType()))
    cached = CachedManifest.decode(data, row, {0: spec}, wide)
    assert cached.partition_column(0) is not None
    assert cached.partition_tuples() == [(1,), (2,), (3,)]
    ref = bind_reference(wide, Reference("i"))
    bound = BoundLiteralPredicate(Operation.GT_EQ, ref, 2)
    pruner = FilePruner(wide, inclusive_projection(wide, spec)(bound), bound)
    assert pruner.select(cached).to_pylist() == [1, 2]
    # A literal beyond the partition column's width cannot be compared in Arrow: the per-row
    # evaluator decides instead, with the same answer.
    huge = BoundSetPredicate(Operation.IN, ref, {2**40, 3})
    pruner = FilePruner(wide, inclusive_projection(wide, spec)(huge), huge)
    assert pruner.select(cached).to_pylist() == [2]


def test_partition_types_come_from_the_writer_schema_after_a_column_is_dropped() -> None:
    old = Schema(NestedField(1, "i", IntegerType()), NestedField(2, "s", StringType()))
    spec = PartitionSpecBuilder(old).add_field("s", "identity").build()
    files = [DataFile(f"s3://b/{v}.parquet", "parquet", (v,), 1, 1) for v in ("x", "y")]
    data, row = write(files, [ManifestEntryStatus.ADDED] * 2, spec=spec, schema=old)
    dropped = Schema(NestedField(1, "i", IntegerType()), schema_id=1)
    cached = CachedManifest.decode(data, row, {0: spec}, dropped)
    assert cached.partition_type.fields[0].field_type == StringType()
    assert cached.rows([1]).data_files[0].partition == ("y",)


def test_a_manifest_of_an_unknown_spec_is_refused() -> None:
    data, row = write([], [])
    with pytest.raises(ValidationError, match="partition spec 0, which the table does not have"):
        CachedManifest.decode(data, row, {3: SPEC}, SCHEMA)


# ---------------------------------------------------------------------------------------------
# The cache: budget, LRU, sharing, statistics
# ---------------------------------------------------------------------------------------------


class CountingIO(LocalFileIO):
    def __init__(self) -> None:
        super().__init__()
        self.reads: dict[str, int] = {}

    async def read(self, path: str) -> bytes:
        self.reads[path] = self.reads.get(path, 0) + 1
        await asyncio.sleep(0)  # let concurrent loads of one path meet
        return await super().read(path)


def _store_manifests(tmp: Any, count: int, rows: int = 20) -> list[ManifestFile]:
    out = []
    for m in range(count):
        files = [
            DataFile(
                f"s3://b/m{m}/f{i}.parquet",
                "parquet",
                (i % 3, i % 8, "ab", 1.0, 19_000, None, None, True),
                10,
                100,
                value_counts={1: 10, 2: 10},
                null_value_counts={1: 0, 2: 0},
                lower_bounds={1: to_bytes(IntegerType(), i), 2: to_bytes(LongType(), i)},
                upper_bounds={1: to_bytes(IntegerType(), i + 5), 2: to_bytes(LongType(), i + 5)},
            )
            for i in range(rows)
        ]
        path = str(tmp / f"m{m}.avro")
        data, row = write(files, [ManifestEntryStatus.ADDED] * rows, path=path)
        with open(path, "wb") as f:
            f.write(data)
        out.append(row)
    return out


async def test_hits_misses_and_shared_loads(tmp_path: Any) -> None:
    io_ = CountingIO()
    rows = _store_manifests(tmp_path, 3)
    cache = ManifestCache(io_, 64 << 20)
    first = await asyncio.gather(*(cache.manifest(rows[0], SPECS, SCHEMA) for _ in range(5)))
    assert all(m is first[0] for m in first)
    assert io_.reads[rows[0].manifest_path] == 1  # five concurrent misses, one read
    again = await cache.manifest(rows[0], SPECS, SCHEMA)
    assert again is first[0]
    stats = cache.stats()
    assert stats.hits >= 1 and stats.misses >= 1
    assert stats.entries == 1 and stats.bytes == first[0].nbytes
    assert (
        stats.bytes_read == io_.reads[rows[0].manifest_path] * (tmp_path / "m0.avro").stat().st_size
    )
    loaded = await cache.manifests(rows, SPECS, SCHEMA)
    assert [m.path for m in loaded] == [r.manifest_path for r in rows]
    assert cache.stats().entries == 3
    cache.clear()
    assert cache.stats().entries == 0 and cache.stats().bytes == 0


async def test_the_budget_evicts_least_recently_used_and_counts_derived_columns(
    tmp_path: Any,
) -> None:
    io_ = CountingIO()
    rows = _store_manifests(tmp_path, 4)
    probe = ManifestCache(io_, 64 << 20)
    one = (await probe.manifest(rows[0], SPECS, SCHEMA)).nbytes
    cache = ManifestCache(io_, int(one * 2.5))
    a = await cache.manifest(rows[0], SPECS, SCHEMA)
    await cache.manifest(rows[1], SPECS, SCHEMA)
    await cache.manifest(rows[0], SPECS, SCHEMA)  # a is now the most recently used
    await cache.manifest(rows[2], SPECS, SCHEMA)  # evicts rows[1]
    stats = cache.stats()
    assert stats.evictions == 1 and stats.entries == 2 and stats.bytes <= stats.max_bytes
    reads = io_.reads.get(rows[1].manifest_path, 0)
    await cache.manifest(rows[1], SPECS, SCHEMA)
    assert io_.reads[rows[1].manifest_path] == reads + 1  # it had to be read again
    # Columns cut out of the metric maps for a filter are counted against the budget.
    before = a.nbytes
    a.bounds("lower_bounds", 1, IntegerType(), "i")
    a.counts("value_counts", 1)
    assert a.nbytes > before
    assert cache.stats().bytes <= cache.stats().max_bytes


async def test_a_zero_budget_caches_nothing(tmp_path: Any) -> None:
    io_ = CountingIO()
    rows = _store_manifests(tmp_path, 1)
    cache = ManifestCache(io_, 0)
    await cache.manifest(rows[0], SPECS, SCHEMA)
    await cache.manifest(rows[0], SPECS, SCHEMA)
    assert io_.reads[rows[0].manifest_path] == 2
    assert cache.stats().entries == 0


async def test_manifest_lists_are_cached_and_failed_loads_are_not(tmp_path: Any) -> None:
    io_ = CountingIO()
    rows = _store_manifests(tmp_path, 2)
    buffer = io.BytesIO()
    written, _ = write_manifest_list(
        buffer,
        rows,
        format_version=2,
        snapshot_id=SNAPSHOT_ID,
        parent_snapshot_id=None,
        sequence_number=SEQ,
    )
    list_path = tmp_path / "snap.avro"
    list_path.write_bytes(buffer.getvalue())
    snapshot = Snapshot(
        snapshot_id=SNAPSHOT_ID, sequence_number=SEQ, timestamp_ms=1, manifest_list=str(list_path)
    )
    cache = ManifestCache(io_)
    assert await cache.manifest_list(snapshot) == written
    assert await cache.manifest_list(snapshot) == written
    assert io_.reads[str(list_path)] == 1
    missing = Snapshot(snapshot_id=1, timestamp_ms=1, manifest_list=str(tmp_path / "missing.avro"))
    for _ in range(2):
        with pytest.raises(Exception, match=r"missing\.avro"):
            await cache.manifest_list(missing)
    assert io_.reads[str(tmp_path / "missing.avro")] == 2


async def test_v1_snapshots_listing_manifests_directly(tmp_path: Any) -> None:
    rows = _store_manifests(tmp_path, 2)
    snapshot = Snapshot(
        snapshot_id=3, timestamp_ms=1, manifests=tuple(r.manifest_path for r in rows)
    )
    cache = ManifestCache(LocalFileIO())
    listed = await cache.manifest_list(snapshot)
    assert [m.manifest_path for m in listed] == [r.manifest_path for r in rows]
    assert all(m.sequence_number == 0 and m.added_snapshot_id == 3 for m in listed)


def test_bad_settings_are_refused() -> None:
    io_: FileIO = LocalFileIO()
    with pytest.raises(ValidationError, match="max_bytes"):
        ManifestCache(io_, -1)
    with pytest.raises(ValidationError, match="load_concurrency"):
        ManifestCache(io_, 1, load_concurrency=0)


def test_delete_files_round_trip_with_their_delete_fields() -> None:
    spec = PartitionSpec.unpartitioned()
    deletes = [
        DataFile(
            "s3://b/del-0.parquet",
            "parquet",
            (),
            3,
            30,
            content=DataFileContent.EQUALITY_DELETES,
            equality_ids=[1, 2],
        ),
        DataFile(
            "s3://b/dv.puffin",
            "puffin",
            (),
            2,
            40,
            content=DataFileContent.POSITION_DELETES,
            referenced_data_file="s3://b/data.parquet",
            content_offset=4,
            content_size_in_bytes=36,
        ),
    ]
    buffer = io.BytesIO()
    from icefloe.manifests.manifest_list import ManifestContent

    with ManifestWriter(
        buffer,
        spec=spec,
        schema=SCHEMA,
        format_version=3,
        snapshot_id=SNAPSHOT_ID,
        content=ManifestContent.DELETES,
    ) as writer:
        for d in deletes:
            writer.add(d)
    row = writer.to_manifest_file("s3://b/dm.avro", buffer.tell()).copy(
        sequence_number=SEQ, min_sequence_number=SEQ
    )
    cached = CachedManifest.decode(buffer.getvalue(), row, {0: spec}, SCHEMA)
    assert cached.rows([0, 1]).data_files == deletes


# ---------------------------------------------------------------------------------------------
# The on-disk store: a restarted cache is warm
# ---------------------------------------------------------------------------------------------


async def test_a_new_cache_over_the_same_store_reads_no_manifest(tmp_path: Any) -> None:
    rows = _store_manifests(tmp_path, 3)
    store_dir = tmp_path / "store"
    first = ManifestCache(CountingIO(), 64 << 20, store=ManifestStore(store_dir, 64 << 20))
    decoded = await first.manifests(rows, SPECS, SCHEMA)
    assert len(list(store_dir.glob("*.arrow"))) == 3

    io_ = CountingIO()
    restarted = ManifestCache(io_, 64 << 20, store=ManifestStore(store_dir, 64 << 20))
    mapped = await restarted.manifests(rows, SPECS, SCHEMA)
    assert io_.reads == {}  # nothing read from storage, nothing decoded
    assert restarted.store is not None and restarted.store.hits == 3
    everything = list(range(20))
    for a, b in zip(decoded, mapped):
        assert repr(a.rows(everything)) == repr(b.rows(everything))
        assert a.partition_type == b.partition_type
    pruner = FilePruner(SCHEMA, AlwaysTrue(), AlwaysTrue())
    assert pruner.select(mapped[0]).to_pylist() == pruner.select(decoded[0]).to_pylist()


async def test_a_damaged_store_file_is_dropped_and_decoded_again(tmp_path: Any) -> None:
    rows = _store_manifests(tmp_path, 1)
    store = ManifestStore(tmp_path / "store", 64 << 20)
    await ManifestCache(LocalFileIO(), 64 << 20, store=store).manifest(rows[0], SPECS, SCHEMA)
    (stored,) = (tmp_path / "store").glob("*.arrow")
    stored.write_bytes(stored.read_bytes()[:100])
    io_ = CountingIO()
    again = await ManifestCache(io_, 64 << 20, store=store).manifest(rows[0], SPECS, SCHEMA)
    assert again.num_rows == 20 and io_.reads == {rows[0].manifest_path: 1}
    assert store.load(rows[0]) is not None  # rewritten after the decode


async def test_the_store_keeps_within_its_disk_budget(tmp_path: Any) -> None:
    rows = _store_manifests(tmp_path, 6)
    probe = ManifestStore(tmp_path / "probe", 64 << 20)
    await ManifestCache(LocalFileIO(), 64 << 20, store=probe).manifest(rows[0], SPECS, SCHEMA)
    one = probe.bytes
    store = ManifestStore(tmp_path / "store", int(one * 3.5))
    await ManifestCache(LocalFileIO(), 64 << 20, store=store).manifests(rows, SPECS, SCHEMA)
    on_disk = sum(p.stat().st_size for p in (tmp_path / "store").glob("*.arrow"))
    assert on_disk <= one * 3.5 and on_disk == store.bytes
    assert 1 <= len(list((tmp_path / "store").glob("*.arrow"))) <= 3


def test_concurrent_writers_keep_the_store_count_equal_to_the_disk(tmp_path: Any) -> None:
    """Planning threads save to one store at once, with a budget small enough that shrinks
    run between their writes; the store's count must stay what is on disk, within budget
    (a shrink recounting between another thread's rename and its count lost that file)."""
    from concurrent.futures import ThreadPoolExecutor

    rows = _store_manifests(tmp_path, 4)
    array = pa.array([f"text {i}" * 20 for i in range(400)], pa.string())
    probe = ManifestStore(tmp_path / "probe", 64 << 20)
    probe.save_derived(rows[0], "probe", array)
    store = ManifestStore(tmp_path / "store", probe.bytes * 5)

    def save(i: int) -> bool:
        return store.save_derived(rows[i % len(rows)], f"d{i % 13}", array)

    with ThreadPoolExecutor(8) as pool:
        assert all(pool.map(save, range(400)))
    on_disk = sum(p.stat().st_size for p in (tmp_path / "store").glob("*.arrow"))
    assert on_disk == store.bytes <= store.max_bytes
    assert not list((tmp_path / "store").glob("*.tmp"))


async def test_a_derived_value_is_shared_through_the_store_and_a_damaged_one_made_again(
    tmp_path: Any,
) -> None:
    rows = _store_manifests(tmp_path, 1)
    store = ManifestStore(tmp_path / "store", 64 << 20)
    one = await ManifestCache(LocalFileIO(), 64 << 20, store=store).manifest(rows[0], SPECS, SCHEMA)
    made: list[int] = []

    def make(tag: int) -> Any:
        made.append(tag)
        return pa.array([f"{tag}:{i}" for i in range(one.num_rows)], pa.string())

    first = one.derived(("texts",), lambda: make(1), shared="texts")
    other = await ManifestCache(LocalFileIO(), 64 << 20, store=store).manifest(
        rows[0], SPECS, SCHEMA
    )
    assert other is not one
    assert other.derived(("texts",), lambda: make(2), shared="texts").equals(first)
    assert other.derived(("else",), lambda: make(3), shared="else").to_pylist()[0] == "3:0"
    assert made == [1, 3] and other.has_derived(("texts",))
    texts = tmp_path / "store" / store_key(rows[0], "texts")
    texts.write_bytes(texts.read_bytes()[:50])
    third = await ManifestCache(LocalFileIO(), 64 << 20, store=store).manifest(
        rows[0], SPECS, SCHEMA
    )
    assert third.derived(("texts",), lambda: make(4), shared="texts").to_pylist()[0] == "4:0"
    assert store.load_derived(rows[0], "texts") is not None  # written again
    assert store.load_derived(rows[0], "another name") is None
