"""The commit path's Arrow lookups select exactly the entries the entry-by-entry reader does.

Random manifests (format v1, v2 and v3; partitioned and not; added, existing and deleted
entries; data files, position delete files with and without a referenced data file, DVs,
equality deletes) are written with the real writer, then asked the same random
:class:`EntryQuery` through :meth:`ManifestReader.select` with ``columnar=True`` (the
planner's Arrow decoder) and ``columnar=False`` (fastavro, entry by entry): the manifests
and entries must be the same, and so must :meth:`ManifestReader.file_paths` (live entries, and all). The partition
summaries of the manifest list must never rule out a partition a live entry is in.
"""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from manifest_fixtures import write_manifest

from hypothesis_budget import examples
from icefloe.manifests.entry_query import EntryQuery, summaries_may_contain
from icefloe.manifests.manifest import ManifestContent, ManifestEntry, ManifestEntryStatus
from icefloe.manifests.manifest_list import ManifestFile
from icefloe.manifests.reader import ManifestReader
from icefloe.spec.datafile import DataFile, DataFileContent, FileFormat
from icefloe.spec.partition import PartitionSpec, PartitionSpecBuilder
from icefloe.spec.schema import Schema
from icefloe.spec.types import IntegerType, LongType, NestedField, StringType

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "p", IntegerType()),
    NestedField(3, "q", StringType()),
)
PARTITIONED = PartitionSpecBuilder(SCHEMA).add_field("p", "identity").add_field("q", "identity")
SPECS = {"none": PartitionSpec.unpartitioned(), "pq": PARTITIONED.build()}
POOL = [f"s3://b/t/data/f{i}.parquet" for i in range(8)]


class MemoryIO:
    """Reads from a dict: all the readers under test call."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}

    async def read(self, path: str) -> bytes:
        return self.files[path]


@st.composite
def data_files(
    draw: st.DrawFn, version: int, content: ManifestContent, spec: PartitionSpec
) -> DataFile:
    partition: tuple[Any, ...] = ()
    if spec.fields:
        partition = (
            draw(st.none() | st.integers(-3, 3)),
            draw(st.none() | st.sampled_from(["a", "b", "zz"])),
        )
    path = draw(st.sampled_from(POOL))
    common: dict[str, Any] = {"partition": partition, "record_count": draw(st.integers(1, 50))}
    if content == ManifestContent.DATA:
        return DataFile(path, "parquet", file_size_in_bytes=100, **common)
    kind = draw(
        st.sampled_from(
            ["position", "equality", "dv"] if version >= 3 else ["position", "equality"]
        )
    )
    if kind == "equality":
        return DataFile(
            path.replace(".parquet", "-eq.parquet"),
            "parquet",
            file_size_in_bytes=10,
            content=DataFileContent.EQUALITY_DELETES,
            equality_ids=[1],
            **common,
        )
    referenced = (
        draw(st.none() | st.sampled_from(POOL))
        if kind == "position"
        else draw(st.sampled_from(POOL))
    )
    if kind == "dv":
        return DataFile(
            f"s3://b/t/data/d{draw(st.integers(0, 3))}-deletes.puffin",
            FileFormat.PUFFIN,
            file_size_in_bytes=10,
            content=DataFileContent.POSITION_DELETES,
            referenced_data_file=referenced,
            content_offset=draw(st.integers(4, 400)),
            content_size_in_bytes=20,
            **common,
        )
    return DataFile(
        path.replace(".parquet", "-pos.parquet"),
        "parquet",
        file_size_in_bytes=10,
        content=DataFileContent.POSITION_DELETES,
        referenced_data_file=referenced,
        **common,
    )


@st.composite
def tables(draw: st.DrawFn) -> tuple[MemoryIO, list[ManifestFile], PartitionSpec]:
    version = draw(st.sampled_from([1, 2, 3]))
    spec = SPECS[draw(st.sampled_from(sorted(SPECS)))]
    io = MemoryIO()
    manifests = []
    for k in range(draw(st.integers(1, 4))):
        content = ManifestContent.DATA
        if version >= 2 and draw(st.booleans()):
            content = ManifestContent.DELETES
        rows: list[tuple[ManifestEntryStatus, DataFile | ManifestEntry]] = []
        for _ in range(draw(st.integers(0, 10))):
            status = draw(st.sampled_from(list(ManifestEntryStatus)))
            f = draw(data_files(version, content, spec))
            if status == ManifestEntryStatus.ADDED:
                rows.append((status, f))
            else:
                seq = None if version == 1 else draw(st.integers(0, k + 1))
                rows.append((status, ManifestEntry(status, 7 + k, seq, seq, f)))
        path = f"s3://b/t/metadata/m{k}.avro"
        seq_row: dict[str, Any] = {"added_snapshot_id": 100 + k}
        if version >= 2:
            seq_row |= {"sequence_number": k + 2, "min_sequence_number": 0}
        data, row = write_manifest(
            rows, spec=spec, schema=SCHEMA, version=version, content=content, path=path, **seq_row
        )
        if version >= 3 and content == ManifestContent.DATA:
            row = row.copy(first_row_id=1000 * k)
        io.files[path] = data
        manifests.append(row)
    return io, manifests, spec


def queries() -> st.SearchStrategy[EntryQuery]:
    paths = st.frozensets(st.sampled_from(POOL), max_size=3)
    return st.builds(
        EntryQuery,
        paths=paths,
        referenced=paths,
        unscoped_position_deletes=st.booleans(),
        newer_than=st.none() | st.integers(-1, 5),
    )


def _select(
    io: MemoryIO,
    manifests: list[ManifestFile],
    spec: PartitionSpec,
    query: EntryQuery,
    columnar: bool,
) -> Any:
    reader = ManifestReader(io, columnar=columnar, columnar_min_bytes=0)  # type: ignore[arg-type]
    specs = {0: spec}

    async def run() -> Any:
        selected = await reader.select(manifests, specs, SCHEMA, query)
        live = await reader.file_paths(manifests, specs, SCHEMA)
        every = await reader.file_paths(manifests, specs, SCHEMA, live_only=False)
        return [(m.manifest_path, hits) for m, hits in selected], live, every

    return asyncio.run(run())


@settings(max_examples=examples(150), deadline=None)
@given(tables(), queries())
def test_arrow_selection_equals_the_entry_by_entry_selection(
    table: tuple[MemoryIO, list[ManifestFile], PartitionSpec], query: EntryQuery
) -> None:
    io, manifests, spec = table
    arrow = _select(io, manifests, spec, query, columnar=True)
    reference = _select(io, manifests, spec, query, columnar=False)
    assert arrow == reference


@settings(max_examples=examples(100), deadline=None)
@given(tables())
def test_partition_summaries_never_rule_out_a_live_entrys_partition(
    table: tuple[MemoryIO, list[ManifestFile], PartitionSpec],
) -> None:
    io, manifests, spec = table
    reader = ManifestReader(io, columnar=False)  # type: ignore[arg-type]
    ptype = spec.partition_type(SCHEMA)
    for m in manifests:
        entries = asyncio.run(reader.entries(m, {0: spec}, live_only=True))
        for e in entries:
            assert summaries_may_contain(m, ptype, [e.data_file.partition])


def test_summaries_rule_out_partitions_outside_their_bounds() -> None:
    spec = SPECS["pq"]
    files = [DataFile(POOL[i], "parquet", (i, "a"), 1, 1) for i in (1, 2)]
    _, row = write_manifest(
        [(ManifestEntryStatus.ADDED, f) for f in files], spec=spec, schema=SCHEMA
    )
    ptype = spec.partition_type(SCHEMA)
    assert summaries_may_contain(row, ptype, [(2, "a")])
    assert not summaries_may_contain(row, ptype, [(3, "a")])
    assert not summaries_may_contain(row, ptype, [(1, "b")])
    assert not summaries_may_contain(row, ptype, [(None, "a")])  # no null p in it
    assert summaries_may_contain(row, ptype, [(3, "a"), (1, "a")])
    assert not summaries_may_contain(row, ptype, [])
    assert summaries_may_contain(row.copy(partitions=None), ptype, [(3, "a")])
