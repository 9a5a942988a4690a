"""Commit latency of one upsert batch on a v3 table of a million data files.

An upsert batch commits as a v3 row delta: positions deleted in a few data files, each
merged with the deletion vector the file already has. The commit must find those files'
live entries and their DVs in the table's manifests. The table (``--quick``: 50k files) is
generated as manifests directly, like the planner benchmark's (partitioned by ``day(ts)``
and ``bucket[16](user_id)``, 5,000 entries per manifest, full metrics), plus one delete
manifest of existing DVs (one Puffin file, a DV for every 500th data file, as earlier
upserts leave). The row delta deletes positions in 10 data files spread over the table,
half of which already have a DV.

Figures (each one attempt, :meth:`SnapshotProducer.build`: read the manifests, merge the DVs,
write the Puffin file, the rewritten delete manifest and the manifest list; no catalog swap):

* **row delta, cold**: a new :class:`ManifestReader` per commit, on the Arrow path (the
  planner's decoder, manifests pruned by the manifest list's partition summaries) beside
  the entry-by-entry path it replaces (``columnar=False``: every live manifest decoded with
  fastavro into entry objects) and beside PyIceberg reading every live manifest entry of the
  same snapshot (``fetch_manifest_entry``, which its own delete and overwrite producers do);
* **row delta, warm**: the reader a coordinator keeps between commits;
* **live paths rebuild**: the coordinator's set of live file paths (``live_paths``) from
  scratch, Arrow beside entry by entry, and beside the same PyIceberg read.

Both paths' snapshots are checked to have the same summary (DVs added and removed, delete
counts) after the clock stops, and the live path sets must be equal.
"""

from __future__ import annotations

import io
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from icefloe.catalog.fs import FileSystemCatalog
from icefloe.deletes.deletion_vector import DeletionVector, build_deletion_vector_file
from icefloe.dev.bench import BenchContext, Figure, Kind, Timing, benchmark
from icefloe.dev.bench_planner import (
    BenchmarkCheckError,
    data_file,
    events_table,
    write_data_manifests,
)
from icefloe.io.fileio import LocalFileIO
from icefloe.manifests.manifest import ManifestWriter
from icefloe.manifests.manifest_list import ManifestContent, write_manifest_list
from icefloe.manifests.reader import ManifestReader
from icefloe.spec.metadata import TableMetadata
from icefloe.spec.metadata_builder import MetadataBuilder
from icefloe.spec.snapshot import Operation, Snapshot, SnapshotRef, Summary
from icefloe.table.catalog import Table, TableIdentifier
from icefloe.table.snapshot_producer import SnapshotProducer

SNAPSHOT_ID = 7_654_321
DV_EVERY = 500  # files 250, 750, ... have a DV already
TARGETS = 10
# From this size on each measurement is one run without warm-up (the entry-by-entry path and
# PyIceberg take tens of seconds a run on a million files).
SINGLE_RUN_FROM = 500_000


@dataclass
class Generated:
    table: Table
    metadata_location: str
    files: int
    manifests: int
    dvs: int


async def generate(directory: Path, files: int, per_manifest: int) -> Generated:
    """A v3 table of ``files`` data files in manifests of ``per_manifest``, and a delete
    manifest of DVs for every :data:`DV_EVERY`-th file (a real Puffin file)."""
    location = str(directory / "table")
    base = events_table(location, 3)
    schema, spec = base.schema(), base.spec()
    metadata_dir = directory / "table" / "metadata"
    metadata_dir.mkdir(parents=True)
    (directory / "table" / "data").mkdir(parents=True)
    rows = write_data_manifests(metadata_dir, spec, schema, files, per_manifest, 3, SNAPSHOT_ID)
    vectors = [
        (data_file(i, spec.spec_id), DeletionVector.from_positions([1, 2, 3]))
        for i in range(DV_EVERY // 2, files, DV_EVERY)
    ]
    puffin_path = f"{location}/data/existing-deletes.puffin"
    puffin = build_deletion_vector_file(puffin_path, vectors)
    Path(puffin_path).write_bytes(puffin.data)
    buffer = io.BytesIO()
    with ManifestWriter(
        buffer,
        spec=spec,
        schema=schema,
        format_version=3,
        snapshot_id=SNAPSHOT_ID,
        content=ManifestContent.DELETES,
    ) as writer:
        for f in puffin.entries:
            writer.add(f)
    path = metadata_dir / "deletes.avro"
    path.write_bytes(buffer.getvalue())
    rows.append(writer.to_manifest_file(str(path), buffer.tell()))
    list_path = metadata_dir / "snap-1.avro"
    buffer = io.BytesIO()
    _, next_row_id = write_manifest_list(
        buffer,
        rows,
        format_version=3,
        snapshot_id=SNAPSHOT_ID,
        parent_snapshot_id=None,
        sequence_number=1,
        first_row_id=0,
    )
    list_path.write_bytes(buffer.getvalue())
    assert next_row_id is not None
    snapshot = Snapshot(
        snapshot_id=SNAPSHOT_ID,
        sequence_number=1,
        timestamp_ms=base.last_updated_ms + 1,
        manifest_list=str(list_path),
        summary=Summary(Operation.APPEND, {"added-data-files": str(files)}),
        schema_id=schema.schema_id,
        first_row_id=0,
        added_rows=next_row_id,
    )
    metadata: TableMetadata = (
        MetadataBuilder(base)
        .add_snapshot(snapshot)
        .set_ref("main", SnapshotRef.branch(SNAPSHOT_ID))
        .build()
    )
    metadata_location = metadata_dir / "v1.metadata.json"
    metadata_location.write_bytes(metadata.to_json_bytes())
    catalog = FileSystemCatalog("bench", str(directory / "wh"), LocalFileIO())
    table = Table(TableIdentifier(("db",), "events"), metadata, str(metadata_location), catalog)
    return Generated(table, str(metadata_location), files, len(rows), len(vectors))


def targets(files: int) -> list[int]:
    """:data:`TARGETS` files spread over the table; even ones have a DV already."""
    step = max(1, files // TARGETS)
    out = []
    for k in range(TARGETS):
        i = min(files - 1, k * step + DV_EVERY // 2 + (k % 2))
        out.append(i)
    return sorted(set(out))


async def row_delta(generated: Generated, reader: ManifestReader) -> dict[str, str]:
    """One attempt of the upsert batch's row delta; the new snapshot's summary."""
    table = generated.table
    spec_id = table.metadata.spec().spec_id
    producer = SnapshotProducer(table, Operation.DELETE, reader=reader)
    for i in targets(generated.files):
        producer.delete_positions(data_file(i, spec_id), [10, 20, 30 + i % 7])
    metadata = await producer.build(table)
    snapshot = metadata.snapshot_by_id(producer.snapshot_id)
    assert snapshot is not None and snapshot.summary is not None
    return dict(snapshot.summary.properties)


async def live_paths(generated: Generated, reader: ManifestReader) -> set[str]:
    metadata = generated.table.metadata
    snapshot = metadata.current_snapshot()
    assert snapshot is not None
    manifests = await reader.manifests(snapshot)
    return await reader.file_paths(manifests, metadata.specs(), metadata.schema())


async def _timed(run: Any, repeat: int, warmup: bool) -> Timing:
    if warmup:
        await run()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        await run()
        samples.append(time.perf_counter() - start)
    return Timing(tuple(samples), 1)


def _pyiceberg_reader(ctx: BenchContext, generated: Generated) -> Any:
    """PyIceberg reading every live entry of the snapshot's manifests, or None."""
    try:
        from pyiceberg.table import StaticTable

        table = StaticTable.from_metadata(generated.metadata_location)
        snapshot = table.current_snapshot()
        assert snapshot is not None

        async def read() -> int:
            n = 0
            for m in snapshot.manifests(table.io):
                n += len(m.fetch_manifest_entry(table.io, discard_deleted=True))
            return n

        return read
    except Exception as e:  # not installed, or cannot read v3 metadata
        ctx.note(f"pyiceberg cannot read the table ({type(e).__name__}: {e}); no peer figure")
        return None


@benchmark("commit-path")
async def commit_path_benchmark(ctx: BenchContext) -> list[Figure]:
    """One upsert batch's v3 row delta on 1M data files: Arrow path vs entry by entry vs PyIceberg."""
    files = ctx.size("files", full=1_000_000, quick=50_000)
    per_manifest = ctx.size("entries-per-manifest", full=5_000, quick=2_000)
    single = files >= SINGLE_RUN_FROM
    repeat = 1 if single else ctx.repeat
    root = Path(tempfile.mkdtemp(prefix="icefloe-bench-commit-path-"))
    try:
        generated = await generate(root, files, per_manifest)
        io_ = generated.table.io
        shared = ManifestReader(io_)
        peer = _pyiceberg_reader(ctx, generated)
        summaries: dict[str, dict[str, str]] = {}

        async def arrow_cold() -> None:
            summaries["arrow"] = await row_delta(generated, ManifestReader(io_))

        async def entries_cold() -> None:
            summaries["entries"] = await row_delta(generated, ManifestReader(io_, columnar=False))

        async def arrow_warm() -> None:
            await row_delta(generated, shared)

        cold = await _timed(arrow_cold, repeat, warmup=not single)
        before = await _timed(entries_cold, repeat, warmup=not single)
        warm = await _timed(arrow_warm, max(repeat, 3), warmup=True)
        theirs = await _timed(peer, repeat, warmup=not single) if peer is not None else None
        if summaries["arrow"] != summaries["entries"]:
            raise BenchmarkCheckError(
                f"row delta summaries differ: arrow {summaries['arrow']}, "
                f"entry by entry {summaries['entries']}"
            )
        if summaries["arrow"].get(Summary.ADDED_DVS) != str(len(targets(files))):
            raise BenchmarkCheckError(f"row delta added {summaries['arrow']} DVs")
        peers: dict[str, Timing] = {"entry by entry (before)": before}
        if theirs is not None:
            peers["pyiceberg read live entries"] = theirs
        label = f"{files / 1_000_000:g}M" if files >= 1_000_000 else f"{files / 1000:g}k"
        figures = [
            Figure(
                f"row delta, {len(targets(files))} files ({label} files), cold",
                "ms/commit",
                cold,
                peers,
                kind=Kind.LATENCY,
            ),
            Figure(
                f"row delta, {len(targets(files))} files ({label} files), warm reader",
                "ms/commit",
                warm,
                peers,
                kind=Kind.LATENCY,
            ),
        ]

        found: dict[str, set[str]] = {}

        async def paths_arrow() -> None:
            found["arrow"] = await live_paths(generated, ManifestReader(io_))

        async def paths_entries() -> None:
            found["entries"] = await live_paths(generated, ManifestReader(io_, columnar=False))

        p_arrow = await _timed(paths_arrow, repeat, warmup=not single)
        p_entries = await _timed(paths_entries, repeat, warmup=not single)
        if found["arrow"] != found["entries"] or len(found["arrow"]) != files + 1:
            raise BenchmarkCheckError(
                f"live paths differ: {len(found['arrow'])} vs {len(found['entries'])}"
            )
        p_peers: dict[str, Timing] = {"entry by entry (before)": p_entries}
        if theirs is not None:
            p_peers["pyiceberg read live entries"] = theirs
        figures.append(
            Figure(f"live paths rebuild ({label} files)", "ms", p_arrow, p_peers, kind=Kind.LATENCY)
        )
        ctx.note(
            f"{files:,} data files in {generated.manifests - 1} manifests, {generated.dvs:,} DVs "
            f"in one delete manifest; the row delta deletes positions in "
            f"{len(targets(files))} files, half with a DV. One attempt (build), no catalog "
            f"swap. Load average {os.getloadavg()[0]:.1f}."
        )
        return figures
    finally:
        shutil.rmtree(root, ignore_errors=True)
