"""A commit on the Arrow path (pruned by partition summaries) builds the snapshot the
entry-by-entry path builds.

Random v3 tables, partitioned or not, are built by real commits on a local file-system
catalog: appends over several manifests and row deltas that leave deletion vectors (real
Puffin files). Then one more operation is built twice on the same base, with a
:class:`ManifestReader` on the Arrow path and one with ``columnar=False`` (the entry-by-entry
reference, unpruned): a row delta on random data files (with and without a DV already), a
delete by path, or a rewrite validated from an older snapshot. Both must succeed or fail
alike, and the snapshots must hold the same live files, DV cardinalities and summary.
"""

from __future__ import annotations

import asyncio
import tempfile
from typing import Any

from hypothesis import event, given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples
from icefloe.catalog.fs import FileSystemCatalog
from icefloe.errors import ValidationConflictError, ValidationError
from icefloe.io.fileio import LocalFileIO
from icefloe.manifests.reader import ManifestReader
from icefloe.spec.datafile import DataFile, DataFileContent
from icefloe.spec.metadata import TableMetadata
from icefloe.spec.partition import PartitionSpecBuilder
from icefloe.spec.schema import Schema
from icefloe.spec.types import IntegerType, LongType, NestedField
from icefloe.table.catalog import Table, TableIdentifier
from icefloe.table.snapshot_producer import (
    SnapshotProducer,
    delete_files,
    fast_append,
    rewrite_files,
    row_delta,
)

SCHEMA = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "p", IntegerType()))


def _file(table: Table, i: int, p: int | None, partitioned: bool) -> DataFile:
    return DataFile(
        file_path=f"{table.location}/data/f{i}.parquet",
        file_format="parquet",
        partition=(p,) if partitioned else (),
        record_count=20,
        file_size_in_bytes=100,
    )


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, Any]:
    appends = draw(
        st.lists(
            st.lists(st.none() | st.integers(0, 4), min_size=1, max_size=6), min_size=1, max_size=4
        )
    )
    files = sum(len(a) for a in appends)
    index = st.integers(0, files - 1)
    deltas = draw(st.lists(st.lists(index, min_size=1, max_size=3), max_size=3))
    kind = draw(st.sampled_from(["row-delta", "delete", "rewrite"]))
    return {
        "partitioned": draw(st.booleans()),
        "appends": appends,
        "deltas": deltas,
        "kind": kind,
        "targets": draw(st.lists(index, min_size=1, max_size=4)),
        "positions": draw(st.lists(st.integers(0, 19), min_size=1, max_size=3)),
        "validate_from": draw(st.integers(0, 10)),
    }


async def _live(table: Table, metadata: TableMetadata) -> Any:
    snapshot = metadata.current_snapshot()
    assert snapshot is not None
    reader = ManifestReader(table.io, columnar=False)
    out = []
    for m in await reader.manifests(snapshot):
        for e in await reader.entries(m, metadata.specs(), live_only=True):
            f = e.data_file
            if f.content == DataFileContent.DATA:
                out.append(("data", f.file_path, f.partition, e.sequence_number))
            else:
                out.append(("dv", f.referenced_data_file, f.partition, f.record_count))
    return sorted(out, key=repr)


async def _run(directory: str, s: dict[str, Any]) -> None:
    catalog = FileSystemCatalog("t", f"{directory}/wh", LocalFileIO())
    await catalog.create_namespace("db")
    spec = (
        PartitionSpecBuilder(SCHEMA).add_field("p", "identity").build()
        if s["partitioned"]
        else None
    )
    table = await catalog.create_table(
        TableIdentifier(("db",), "t"), SCHEMA, spec, format_version=3
    )
    files: list[DataFile] = []
    history: list[int | None] = [None]
    for batch in s["appends"]:
        new = [_file(table, len(files) + k, p, s["partitioned"]) for k, p in enumerate(batch)]
        files += new
        table = await fast_append(table, new).commit()
        history.append(table.metadata.current_snapshot_id)
    for picked in s["deltas"]:
        pairs = [(files[i], [i % 20, (i * 7) % 20]) for i in sorted(set(picked))]
        table = await row_delta(table, [], [], deleted_positions=pairs).commit()
        history.append(table.metadata.current_snapshot_id)

    def producer(reader: ManifestReader) -> SnapshotProducer:
        targets = [files[i] for i in sorted(set(s["targets"]))]
        if s["kind"] == "row-delta":
            pairs = [(f, s["positions"]) for f in targets]
            return row_delta(table, [], [], deleted_positions=pairs, reader=reader)
        if s["kind"] == "delete":
            return delete_files(table, [f.file_path for f in targets], reader=reader)
        compacted = targets[0].copy(file_path=f"{table.location}/data/compacted.parquet")
        rewrite = rewrite_files(table, [targets[0].file_path], [compacted], reader=reader)
        return rewrite.validate_from_snapshot(history[s["validate_from"] % len(history)])

    outcomes = []
    for columnar in (True, False):
        reader = ManifestReader(table.io, columnar=columnar, columnar_min_bytes=0)
        p = producer(reader)
        try:
            built = await p.build(table)
        except (ValidationError, ValidationConflictError) as e:
            outcomes.append(("refused", type(e).__name__))
            continue
        snapshot = built.current_snapshot()
        assert snapshot is not None and snapshot.summary is not None
        outcomes.append(("built", await _live(table, built), snapshot.summary.properties))
    assert outcomes[0] == outcomes[1]
    event(f"{s['kind']}: {outcomes[0][0]}")


@settings(max_examples=examples(60), deadline=None)
@given(scenarios())
def test_the_arrow_path_builds_the_snapshot_the_entry_path_builds(s: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        asyncio.run(_run(directory, s))
