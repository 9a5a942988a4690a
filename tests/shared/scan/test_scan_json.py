"""The column writer of ``file-scan-tasks`` JSON gives the same JSON as the per-file reference.

Tables are committed through a real file-system catalog (data and delete files are
described, not written: planning reads only metadata), and exercise what the column writer
must get right: partition values of every kind (double with -0.0, 0.0, NaN and null;
strings that need escaping; dates), two partition specs, key metadata, split offsets and
sort order ids present or absent, v3 first row ids, position deletes scoped by partition or
by file, equality deletes global and by partition, and v3 deletion vectors sharing one Puffin
file. Every page of every plan, for several filters and page sizes, must equal the reference.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples
from icefloe.catalog.fs import FileSystemCatalog
from icefloe.deletes.index import DELETE_FILE_PATH_ID
from icefloe.expressions.json_form import parse_expression
from icefloe.io.fileio import LocalFileIO
from icefloe.manifests.cache import ManifestCache
from icefloe.manifests.store import ManifestStore
from icefloe.scan import tasks_json as scan_json
from icefloe.scan.planning import ScanPlan, plan_scan
from icefloe.scan.tasks_json import scan_tasks_bytes, scan_tasks_json
from icefloe.spec.datafile import DataFile, DataFileContent
from icefloe.spec.metadata_builder import LAST_ADDED, MetadataBuilder
from icefloe.spec.partition import PartitionSpecBuilder
from icefloe.spec.schema import Schema
from icefloe.spec.types import DateType, DoubleType, LongType, NestedField, StringType
from icefloe.table.catalog import Table
from icefloe.table.snapshot_producer import fast_append, row_delta

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "amount", DoubleType()),
    NestedField(3, "name", StringType()),
    NestedField(4, "day", DateType()),
)
AMOUNTS = [-0.0, 0.0, float("nan"), None, 1.5, -2.25]
NAMES = ["plain", 'quote"d', "back\\slash", "new\nline", "été", None]


def _canonical(value: Any) -> str:
    """JSON text that tells -0.0 from 0.0 and takes NaN as equal to NaN."""
    return json.dumps(value, sort_keys=True)


def _data(location: str, i: int, spec_id: int, partition: tuple[Any, ...]) -> DataFile:
    name = NAMES[i % len(NAMES)] or "none"
    return DataFile(
        file_path=f"{location}/data/{name}/{i:04d}.parquet",
        file_format="parquet",
        partition=partition,
        record_count=10 + i,
        file_size_in_bytes=1000 + i,
        spec_id=spec_id,
        value_counts={1: 10 + i, 2: 10 + i},
        null_value_counts={1: 0, 2: i % 3},
        lower_bounds={1: (i * 100).to_bytes(8, "little", signed=True)},
        upper_bounds={1: (i * 100 + 99).to_bytes(8, "little", signed=True)},
        key_metadata=bytes([i, 255]) if i % 4 == 0 else None,
        split_offsets=[4, 100 + i] if i % 3 == 0 else None,
        sort_order_id=0 if i % 2 == 0 else None,
    )


async def _v2_table(warehouse: Path) -> Table:
    """Unpartitioned first (a global equality delete), then partitioned by amount and name."""
    catalog = FileSystemCatalog("json", str(warehouse), LocalFileIO())
    await catalog.create_namespace("db")
    table = await catalog.create_table("db.v2", SCHEMA)
    loc = table.location
    first = [_data(loc, i, 0, ()) for i in range(6)]
    table = await fast_append(table, first).commit()
    global_eq = DataFile(
        f"{loc}/data/eq-global.parquet",
        "parquet",
        (),
        3,
        10,
        content=DataFileContent.EQUALITY_DELETES,
        equality_ids=[1],
        lower_bounds={1: (0).to_bytes(8, "little", signed=True)},
        upper_bounds={1: (250).to_bytes(8, "little", signed=True)},
    )
    table = await row_delta(table, [], [global_eq]).commit()
    spec = (
        PartitionSpecBuilder(
            SCHEMA,
            spec_id=1,
            last_partition_id=table.metadata.last_partition_id,
            previous_specs=table.metadata.partition_specs,
        )
        .add_field("amount", "identity")
        .add_field("name", "identity")
        .add_field("day", "identity")
        .build()
    )
    metadata = (
        MetadataBuilder(table.metadata)
        .add_partition_spec(spec)
        .set_default_spec(LAST_ADDED)
        .build(table.metadata_location)
    )
    table = await catalog.commit(table, metadata)
    second = [
        _data(loc, i, 1, (AMOUNTS[i % 6], NAMES[(i // 2) % 6], None if i % 5 == 0 else 19_000 + i))
        for i in range(6, 40)
    ]
    table = await fast_append(table, second).commit()
    target = second[3]
    by_file = DataFile(
        f"{loc}/data/pos-by-file.parquet",
        "parquet",
        target.partition,
        2,
        10,
        content=DataFileContent.POSITION_DELETES,
        spec_id=1,
        referenced_data_file=target.file_path,
        lower_bounds={DELETE_FILE_PATH_ID: target.file_path.encode()},
        upper_bounds={DELETE_FILE_PATH_ID: target.file_path.encode()},
    )
    by_partition = DataFile(
        f"{loc}/data/pos-partition.parquet",
        "parquet",
        second[7].partition,
        2,
        10,
        content=DataFileContent.POSITION_DELETES,
        spec_id=1,
    )
    partition_eq = DataFile(
        f"{loc}/data/eq-partition.parquet",
        "parquet",
        second[0].partition,
        2,
        10,
        content=DataFileContent.EQUALITY_DELETES,
        spec_id=1,
        equality_ids=[1],
    )
    table = await row_delta(table, [], [by_file, by_partition, partition_eq]).commit()
    later = [_data(loc, i, 1, (AMOUNTS[i % 6], NAMES[i % 6], 19_000)) for i in range(40, 46)]
    table = await fast_append(table, later).commit()
    # Three files of one partition, and a position delete of that partition whose file_path
    # bounds cover two of them (paths of names "back\\slash" < "new\nline" < "été").
    shared = [_data(loc, i, 1, (1.5, "plain", 19_500)) for i in (50, 51, 52)]
    table = await fast_append(table, shared).commit()
    bounded = DataFile(
        f"{loc}/data/pos-bounded.parquet",
        "parquet",
        (1.5, "plain", 19_500),
        2,
        10,
        content=DataFileContent.POSITION_DELETES,
        spec_id=1,
        lower_bounds={DELETE_FILE_PATH_ID: shared[0].file_path.encode()},
        upper_bounds={DELETE_FILE_PATH_ID: shared[1].file_path.encode()},
    )
    return await row_delta(table, [], [bounded]).commit()


async def _v3_table(warehouse: Path) -> Table:
    """v3: first row ids, and deletion vectors of several data files in one Puffin file."""
    catalog = FileSystemCatalog("json3", str(warehouse), LocalFileIO())
    await catalog.create_namespace("db")
    spec = PartitionSpecBuilder(SCHEMA).add_field("name", "identity").build()
    table = await catalog.create_table("db.v3", SCHEMA, spec, format_version=3)
    loc = table.location
    files = [_data(loc, i, 0, (NAMES[i % 6],)) for i in range(12)]
    table = await fast_append(table, files).commit()
    dvs = [
        DataFile(
            f"{loc}/data/dvs.puffin",
            "puffin",
            f.partition,
            1,
            500,
            content=DataFileContent.POSITION_DELETES,
            spec_id=0,
            referenced_data_file=f.file_path,
            content_offset=4 + 40 * k,
            content_size_in_bytes=40,
        )
        for k, f in enumerate(files[::3])
    ]
    return await row_delta(table, [], dvs).commit()


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> list[Table]:
    root = tmp_path_factory.mktemp("scan-json")

    async def build() -> list[Table]:
        return [await _v2_table(root / "v2"), await _v3_table(root / "v3")]

    return asyncio.run(build())


def _plan(table: Table, expr: dict[str, Any] | None, **kwargs: Any) -> ScanPlan:
    async def run() -> ScanPlan:
        row_filter = None if expr is None else parse_expression(expr)
        return await plan_scan(
            table.metadata, ManifestCache(table.io), row_filter=row_filter, **kwargs
        )

    return asyncio.run(run())


FILTERS: list[dict[str, Any] | None] = [
    None,
    {"type": "eq", "term": "amount", "value": 0.0},
    {"type": "not-eq", "term": "amount", "value": -0.0},
    {"type": "is-nan", "term": "amount"},
    {"type": "starts-with", "term": "name", "value": "b"},
    {
        "type": "or",
        "left": {"type": "lt", "term": "id", "value": 1500},
        "right": {"type": "is-null", "term": "name"},
    },
    {"type": "gt-eq", "term": "day", "value": "2022-01-10"},
]


@pytest.mark.parametrize("columns_from", [0, scan_json.COLUMNS_FROM_ROWS])
@pytest.mark.parametrize("which", [0, 1], ids=["v2", "v3"])
@pytest.mark.parametrize("expr", FILTERS, ids=lambda e: "none" if e is None else e["type"])
def test_every_page_matches_the_per_file_reference(
    tables: list[Table],
    which: int,
    expr: dict[str, Any] | None,
    columns_from: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With ``columns_from`` 0 every page is written by columns, however few its rows."""
    monkeypatch.setattr(scan_json, "COLUMNS_FROM_ROWS", columns_from)
    p = _plan(tables[which], expr)
    for size in (1, 4, 7, 1000):
        for start in range(0, max(1, len(p)), size):
            ours = json.loads(scan_tasks_bytes(p, start, start + size))
            reference = scan_tasks_json(p, start, start + size)
            assert _canonical(ours) == _canonical(reference), (size, start)


def test_the_tables_exercise_what_they_claim(tables: list[Table]) -> None:
    v2 = scan_tasks_json(_plan(tables[0], None), 0, 1000)
    tasks = v2["file-scan-tasks"]
    kinds = {d["content"] for d in v2["delete-files"]}
    assert kinds == {"position-deletes", "equality-deletes"}
    assert any("delete-file-references" in t for t in tasks)
    assert any("delete-file-references" not in t for t in tasks)
    assert {t["data-file"]["spec-id"] for t in tasks} == {0, 1}
    partitions = [t["data-file"]["partition"] for t in tasks if t["data-file"]["spec-id"] == 1]
    assert {_canonical(p[0]) for p in partitions} >= {"-0.0", "0.0", "NaN", "null"}
    assert any("key-metadata" in t["data-file"] for t in tasks)
    bounded = v2["delete-files"].index(
        next(d for d in v2["delete-files"] if d["file-path"].endswith("pos-bounded.parquet"))
    )
    covered = [
        t["data-file"]["file-path"].rsplit("/", 1)[-1]
        for t in tasks
        if bounded in t.get("delete-file-references", [])
    ]
    assert sorted(covered) == ["0050.parquet", "0051.parquet"]  # not 0052: outside the bounds
    v3 = scan_tasks_json(_plan(tables[1], None), 0, 1000)
    assert len(v3["delete-files"]) == 4  # four DVs in one Puffin file, told apart by offset
    assert all("first-row-id" in t["data-file"] for t in v3["file-scan-tasks"])
    filtered = scan_tasks_json(_plan(tables[0], FILTERS[5]), 0, 1000)
    assert any("residual-filter" in t for t in filtered["file-scan-tasks"])


STATS_FIELDS = [["id"], ["amount", "id"], ["id", "amount", "name", "day"]]


@pytest.mark.parametrize("columns_from", [0, scan_json.COLUMNS_FROM_ROWS])
@pytest.mark.parametrize("which", [0, 1], ids=["v2", "v3"])
@pytest.mark.parametrize("stats", STATS_FIELDS, ids=lambda s: "+".join(s))
@pytest.mark.parametrize("expr", [None, FILTERS[5]], ids=["none", "or"])
def test_pages_with_column_stats_match_the_per_file_reference(
    tables: list[Table],
    which: int,
    stats: list[str],
    expr: dict[str, Any] | None,
    columns_from: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Plans asking for ``stats-fields`` are written by columns too: counts of one or several
    columns, bounds, columns some files have no stats for (name, day)."""
    monkeypatch.setattr(scan_json, "COLUMNS_FROM_ROWS", columns_from)
    p = _plan(tables[which], expr, stats_fields=stats)
    for size in (1, 5, 1000):
        for start in range(0, max(1, len(p)), size):
            ours = json.loads(scan_tasks_bytes(p, start, start + size))
            reference = scan_tasks_json(p, start, start + size)
            assert _canonical(ours) == _canonical(reference), (size, start)
    whole = scan_tasks_json(p, 0, 1000)["file-scan-tasks"]
    assert all("value-counts" in t["data-file"] for t in whole)
    assert all(t["data-file"]["lower-bounds"]["keys"] == [1] for t in whole)
    if "amount" in stats:
        assert any(t["data-file"]["null-value-counts"]["keys"] == [1, 2] for t in whole)


def test_a_manifests_later_pages_are_slices_of_texts_already_written(
    tables: list[Table], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scan_json, "COLUMNS_FROM_ROWS", 0)
    p = _plan(tables[1], None)  # v3, no position or equality deletes besides DVs
    assert not scan_json.page_is_written(p, 0, 4)  # it has deletes: always written anew
    v2 = _plan(
        tables[0], {"type": "not-null", "term": "id"}, snapshot_id=_first_snapshot(tables[0])
    )
    assert not len(v2.deletes)
    assert not scan_json.page_is_written(v2, 2, 4)
    first = scan_tasks_bytes(v2, 0, 2)
    assert first and scan_json.page_is_written(v2, 2, 4)
    assert json.loads(scan_tasks_bytes(v2, 2, 4)) == scan_tasks_json(v2, 2, 4)


def _first_snapshot(table: Table) -> int:
    return min(table.metadata.snapshots, key=lambda s: s.sequence_number).snapshot_id


@pytest.mark.parametrize("which", [0, 1], ids=["v2", "v3"])
def test_full_plans_of_one_cache_serve_the_texts_kept_by_the_first(
    tables: list[Table], which: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full scan's task texts are kept with the cached manifests (counted in the cache's
    bytes) and later full plans of the same cache, with other stats fields, at another
    snapshot (without the deletes), page through them: every page still equals the
    reference, whatever was written before it."""
    monkeypatch.setattr(scan_json, "COLUMNS_FROM_ROWS", 0)
    table = tables[which]
    cache = ManifestCache(table.io)

    def plan(**kwargs: Any) -> ScanPlan:
        return asyncio.run(plan_scan(table.metadata, cache, **kwargs))

    first = _first_snapshot(table)
    kinds: list[dict[str, Any]] = [
        {},
        {"stats_fields": ["id", "amount"]},
        {"snapshot_id": first},
        {},
        {"snapshot_id": first},
    ]
    for k, kwargs in enumerate(kinds):
        p = plan(**kwargs)
        before = cache.stats().bytes
        for size in (3, 1000, 2):
            for start in range(0, len(p), size):
                ours = json.loads(scan_tasks_bytes(p, start, start + size))
                assert _canonical(ours) == _canonical(scan_tasks_json(p, start, start + size))
        if k < 3:
            assert cache.stats().bytes > before  # the texts kept count against the budget
        else:
            assert cache.stats().bytes == before  # served from the texts the first kept
    no_deletes = plan(snapshot_id=first)
    assert not len(no_deletes.deletes)
    assert scan_json.page_is_written(no_deletes, 0, len(no_deletes))
    filtered = plan(row_filter=parse_expression(FILTERS[5]), snapshot_id=first)
    assert not len(filtered.deletes) and len(filtered) > 4
    assert not scan_json.page_is_written(filtered, 0, len(filtered))


def test_a_second_cache_over_the_same_disk_store_maps_the_texts_the_first_wrote(
    tables: list[Table], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two planner processes share a disk store: the full plan's task texts written by one
    are mapped from disk by the other, which writes no text itself, and its pages equal the
    reference; texts for other stats fields are written anew, not taken from the store."""
    monkeypatch.setattr(scan_json, "COLUMNS_FROM_ROWS", 0)
    table = tables[0]
    first = _first_snapshot(table)

    def pages(cache: ManifestCache, **kwargs: Any) -> list[bytes]:
        p = asyncio.run(plan_scan(table.metadata, cache, snapshot_id=first, **kwargs))
        out = [scan_tasks_bytes(p, start, start + 3) for start in range(0, len(p), 3)]
        for k, start in enumerate(range(0, len(p), 3)):
            reference = scan_tasks_json(p, start, start + 3)
            assert _canonical(json.loads(out[k])) == _canonical(reference)
        return out

    store = tmp_path / "store"
    written = pages(ManifestCache(table.io, store=ManifestStore(store, 1 << 30)))
    assert any(store.glob("*.arrow"))

    def no_writing(*args: Any) -> Any:
        raise AssertionError("the texts were written again")

    with monkeypatch.context() as patched:
        patched.setattr(scan_json, "_head", no_writing)
        again = pages(ManifestCache(table.io, store=ManifestStore(store, 1 << 30)))
    assert again == written
    with_stats = pages(
        ManifestCache(table.io, store=ManifestStore(store, 1 << 30)), stats_fields=["id"]
    )
    assert with_stats != written


# ---------------------------------------------------------------------------------------------
# Delete attachment: the law is DeleteFileIndex.for_data_file, per file
# ---------------------------------------------------------------------------------------------

ID_SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "p", LongType(), required=True),
)


def _id_bounds(lo: int, hi: int) -> dict[str, Any]:
    return {
        "lower_bounds": {1: lo.to_bytes(8, "little", signed=True)},
        "upper_bounds": {1: hi.to_bytes(8, "little", signed=True)},
    }


@st.composite
def _delete_scenarios(draw: st.DrawFn) -> dict[str, Any]:
    files = draw(st.integers(2, 10))
    partitions = [draw(st.integers(0, 2)) for _ in range(files)]
    deletes = draw(
        st.lists(
            st.tuples(
                st.sampled_from(["partition", "path", "bounded", "equality"]),
                st.integers(0, 2),  # partition
                st.integers(0, files - 1),  # a file (path scope, bounds, id range)
                st.integers(0, files - 1),
                st.booleans(),  # committed with the later files (else after the earlier)
            ),
            max_size=6,
        )
    )
    return {"partitions": partitions, "deletes": deletes}


async def _scenario_table(warehouse: Path, scenario: dict[str, Any]) -> Table:
    catalog = FileSystemCatalog("law", str(warehouse), LocalFileIO())
    await catalog.create_namespace("db")
    spec = PartitionSpecBuilder(ID_SCHEMA).add_field("p", "identity").build()
    table = await catalog.create_table("db.t", ID_SCHEMA, spec)
    loc = table.location
    files = [
        DataFile(
            f"{loc}/data/p={p}/{i:03d}.parquet",
            "parquet",
            (p,),
            10,
            100,
            value_counts={1: 10},
            null_value_counts={1: 0},
            **_id_bounds(i * 100, i * 100 + 99),
        )
        for i, p in enumerate(scenario["partitions"])
    ]
    half = len(files) // 2
    early = []
    late = []
    for k, (kind, p, a, b, after) in enumerate(scenario["deletes"]):
        lo, hi = sorted((a, b))
        common: dict[str, Any] = {"spec_id": 0}
        if kind == "equality":
            d = DataFile(
                f"{loc}/data/eq-{k}.parquet",
                "parquet",
                (p,),
                1,
                10,
                content=DataFileContent.EQUALITY_DELETES,
                equality_ids=[1],
                **_id_bounds(lo * 100 + 50, hi * 100 + 50),
                **common,
            )
        else:
            target = files[a]
            extra: dict[str, Any] = {}
            partition: tuple[Any, ...] = (p,)
            if kind == "path":
                extra["referenced_data_file"] = target.file_path
                partition = target.partition
            elif kind == "bounded":
                paths = sorted((files[a].file_path, files[b].file_path))
                extra["lower_bounds"] = {DELETE_FILE_PATH_ID: paths[0].encode()}
                extra["upper_bounds"] = {DELETE_FILE_PATH_ID: paths[1].encode()}
            d = DataFile(
                f"{loc}/data/pos-{k}.parquet",
                "parquet",
                partition,
                1,
                10,
                content=DataFileContent.POSITION_DELETES,
                **extra,
                **common,
            )
        (late if after else early).append(d)
    table = await fast_append(table, files[:half]).commit()
    if early:
        table = await row_delta(table, [], early).commit()
    # The later deletes come in the commit of the later files: same sequence number (a
    # position delete applies to them, an equality delete does not).
    return await row_delta(table, files[half:], late).commit()


@settings(max_examples=examples(30), deadline=None)
@given(scenario=_delete_scenarios(), columns_from=st.sampled_from([0, 3]))
def test_deletes_chosen_for_all_rows_at_once_follow_the_index_per_file(
    scenario: dict[str, Any], columns_from: int
) -> None:
    """Position deletes scoped by partition, by path and by path bounds, and equality
    deletes ruled in or out by id bounds, committed before or after some files: the pages
    written by columns list each task's deletes as DeleteFileIndex.for_data_file does (the
    reference), in its order, numbered the same."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        table = asyncio.run(_scenario_table(Path(tmp), scenario))
        p = _plan(table, None)
        original = scan_json.COLUMNS_FROM_ROWS
        scan_json.COLUMNS_FROM_ROWS = columns_from
        try:
            for size in (1, 3, 1000):
                for start in range(0, max(1, len(p)), size):
                    ours = json.loads(scan_tasks_bytes(p, start, start + size))
                    assert ours == scan_tasks_json(p, start, start + size), (size, start)
        finally:
            scan_json.COLUMNS_FROM_ROWS = original


def _chain(conjuncts: list[dict[str, Any]]) -> dict[str, Any]:
    """``c0 and c1 and ...`` folded left to right, as a client folds its conditions."""
    expression = conjuncts[0]
    for c in conjuncts[1:]:
        expression = {"type": "and", "left": expression, "right": c}
    return expression


_ID_CHAIN = [{"type": "not-eq", "term": "id", "value": -1 - i} for i in range(300)]


@pytest.mark.parametrize("columns_from", [0, scan_json.COLUMNS_FROM_ROWS])
@pytest.mark.parametrize("which", [0, 1], ids=["v2", "v3"])
def test_a_residual_that_decides_nothing_is_left_out_and_others_are_written_once(
    tables: list[Table], which: int, columns_from: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 300-deep chain on a column no partition field derives from leaves every task's
    residual the request's filter: no task repeats it (it was tens of kilobytes a task).
    With a conjunct on a partition column too, each partition's residual is either true
    (decided) or the rest of the chain, and each distinct one is serialized once a plan."""
    monkeypatch.setattr(scan_json, "COLUMNS_FROM_ROWS", columns_from)
    plain = _plan(tables[which], _chain(_ID_CHAIN))
    assert len(plain) > 0
    for start in range(0, len(plain), 3):
        page = json.loads(scan_tasks_bytes(plain, start, start + 3))
        assert _canonical(page) == _canonical(scan_tasks_json(plain, start, start + 3))
        assert not any("residual-filter" in t for t in page["file-scan-tasks"])
    day = {"type": "gt-eq", "term": "day", "value": "2022-01-10"}
    mixed = _plan(tables[which], _chain([day, *_ID_CHAIN]))
    residuals = set()
    for start in range(0, len(mixed), 2):
        text = scan_tasks_bytes(mixed, start, start + 2)
        page = json.loads(text)
        assert _canonical(page) == _canonical(scan_tasks_json(mixed, start, start + 2))
        residuals |= {
            json.dumps(t["residual-filter"], sort_keys=True)
            for t in page["file-scan-tasks"]
            if "residual-filter" in t
        }
    # Where day is a partition column the chain on id is what is left (or nothing at all);
    # the serialized texts kept are one per distinct residual object.
    assert len(residuals) <= 1
    texts = [text for _, text in mixed.residual_texts.values() if text is not None]
    assert len(texts) == len(set(texts)) == len(residuals)
