"""Manifest entries written and read per second: icefloe, PyIceberg and raw fastavro.

The coordinator writes a manifest for every commit batch and the planner decodes thousands of
them, so entries per second bound both. Three implementations do the same work on the same
records, in one process, timed in interleaved rounds so that a burst of load on the machine
hits all of them alike:

* **icefloe**: :class:`~icefloe.manifests.manifest.ManifestWriter` fed :class:`~icefloe.spec.datafile.DataFile`
  objects, and :func:`~icefloe.manifests.manifest.read_manifest` producing entries with inherited
  snapshot ids and sequence numbers.
* **pyiceberg**: ``pyiceberg.manifest.write_manifest`` fed PyIceberg ``ManifestEntry`` objects
  holding the same values, and ``ManifestFile.fetch_manifest_entry``. PyIceberg decodes with
  its own Cython decoder and builds each file's six metric maps lazily, on first use; the
  extra read peer ``pyiceberg+maps`` also uses them, which is the work icefloe's reader does.
* **fastavro**: ``fastavro.writer`` fed ready-made dict records in exactly the Avro schema
  icefloe writes (the v2 ``manifest_entry``), with fastavro's union-branch hints on optional
  arrays (its fastest input form), and ``fastavro.reader``. No conversion either way: this is
  the floor for code built on fastavro, as icefloe's Avro layer is. PyIceberg has its own
  Avro encoder and decoder, so it is not bound by this floor.

The default size is 50,000 entries: about 13 MB of manifest, above the 8 MB target size
(``commit.manifest.target-size-bytes``) Java and icefloe aim manifests at, so as large as a
table's manifests normally get; ``--set entries=N`` changes it. Building the inputs
(DataFiles, PyIceberg objects, dicts) happens before the clock starts. Everything is written
to memory with the deflate codec (Java's and icefloe's default). All readers decode the same
bytes, the manifest icefloe wrote, so the read figures compare decoders, not file layouts
(PyIceberg writes one Avro block per entry, which makes its own files about 1.7 times as
large).

After the clock stops, the outputs are checked, so a figure can never come from work that
was done wrong: icefloe reads back all three files and must find exactly the input files, and
the other readers must return every entry in order.
"""

from __future__ import annotations

import io
import json
import random
import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import Any, Final

import fastavro

from icefloe.avro.codec import parsed_avro_schema
from icefloe.dev.bench import BenchContext, Figure, Timing, benchmark
from icefloe.errors import IcefloeError
from icefloe.manifests.manifest import (
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestWriter,
    manifest_entry_struct,
    read_manifest,
)
from icefloe.spec.datafile import DataFile, FileFormat
from icefloe.spec.partition import PartitionSpec, PartitionSpecBuilder
from icefloe.spec.schema import Schema
from icefloe.spec.types import (
    BinaryType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    NestedField,
    PrimitiveType,
    StringType,
    TimestamptzType,
)
from icefloe.spec.values import to_bytes

FORMAT_VERSION: Final = 2
SNAPSHOT_ID = 4_815_162_342
SEQUENCE_NUMBER = 7
CODEC: Final = "deflate"
MANIFEST_PATH = "s3://warehouse/db/events/metadata/bench-m0.avro"

_DAY_MICROS = 86_400_000_000
_START_DAY = 19_723  # 2024-01-01

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "ts", TimestamptzType(), required=True),
    NestedField(3, "user_id", LongType()),
    NestedField(4, "event", StringType()),
    NestedField(5, "amount", DoubleType()),
    NestedField(6, "score", FloatType()),
    NestedField(7, "quantity", IntegerType()),
    NestedField(8, "event_date", DateType()),
    NestedField(9, "price", DecimalType(12, 2)),
    NestedField(10, "payload", BinaryType()),
)
SPEC = PartitionSpecBuilder(SCHEMA).add_field("ts", "day").add_field("id", "bucket[16]").build()

_EVENTS = ("click", "view", "purchase", "signup", "logout", "search", "add_to_cart")


def _bounds(rnd: random.Random, day: int) -> tuple[dict[int, bytes], dict[int, bytes]]:
    """Realistic lower/upper bounds (Appendix D bytes) for the ten columns of one file."""
    id_lo = rnd.randrange(0, 2**40)
    ts_lo = day * _DAY_MICROS + rnd.randrange(0, _DAY_MICROS // 2)
    user_lo = rnd.randrange(0, 10**7)
    events = sorted(rnd.sample(_EVENTS, 2))
    amount_lo = rnd.uniform(0, 100)
    score_lo = rnd.uniform(0, 1)
    qty_lo = rnd.randrange(0, 50)
    price_lo = Decimal(rnd.randrange(0, 10**6)).scaleb(-2)
    payload_lo = rnd.randbytes(8)
    lows = (
        id_lo,
        ts_lo,
        user_lo,
        events[0],
        amount_lo,
        score_lo,
        qty_lo,
        day,
        price_lo,
        payload_lo,
    )
    highs = (
        id_lo + rnd.randrange(1, 2**20),
        ts_lo + rnd.randrange(1, _DAY_MICROS // 2),
        user_lo + rnd.randrange(1, 10**5),
        events[1],
        amount_lo + rnd.uniform(1, 100),
        min(1.0, score_lo + rnd.uniform(0, 0.5)),
        qty_lo + rnd.randrange(1, 50),
        day,
        price_lo + Decimal(rnd.randrange(1, 10**5)).scaleb(-2),
        bytes([255]) + payload_lo[1:],
    )
    lower: dict[int, bytes] = {}
    upper: dict[int, bytes] = {}
    for f, lo, hi in zip(SCHEMA.fields, lows, highs):
        assert isinstance(f.field_type, PrimitiveType)
        lower[f.field_id] = to_bytes(f.field_type, lo)
        upper[f.field_id] = to_bytes(f.field_type, hi)
    return lower, upper


def make_data_files(count: int, seed: int = 20240101) -> list[DataFile]:
    """``count`` data files with a (day, bucket) partition and metrics for all ten columns.

    Deterministic for a seed, so runs on different machines describe the same files.
    """
    rnd = random.Random(seed)
    columns = [f.field_id for f in SCHEMA.fields]
    files = []
    for n in range(count):
        day = _START_DAY + rnd.randrange(0, 30)
        bucket = rnd.randrange(0, 16)
        records = rnd.randrange(1_000, 2_000_000)
        nulls = {c: (0 if c <= 2 else rnd.randrange(0, records // 10)) for c in columns}
        lower, upper = _bounds(rnd, day)
        files.append(
            DataFile(
                file_path=(
                    f"s3://warehouse/db/events/data/ts_day={day}/id_bucket={bucket}/"
                    f"{uuid.UUID(int=rnd.getrandbits(128))}-{n:05d}.parquet"
                ),
                file_format=FileFormat.PARQUET,
                partition=(day, bucket),
                record_count=records,
                file_size_in_bytes=rnd.randrange(1 << 20, 512 << 20),
                column_sizes={c: rnd.randrange(1_000, 50_000_000) for c in columns},
                value_counts=dict.fromkeys(columns, records),
                null_value_counts=nulls,
                nan_value_counts={5: 0, 6: rnd.randrange(0, 3)},
                lower_bounds=lower,
                upper_bounds=upper,
                split_offsets=[4],
                sort_order_id=0,
            )
        )
    return files


# ---------------------------------------------------------------------------------------
# The three implementations
# ---------------------------------------------------------------------------------------


def icefloe_write(files: list[DataFile]) -> tuple[bytes, ManifestFile]:
    buffer = io.BytesIO()
    with ManifestWriter(
        buffer, spec=SPEC, schema=SCHEMA, format_version=FORMAT_VERSION, snapshot_id=SNAPSHOT_ID
    ) as writer:
        for f in files:
            writer.add(f)
    manifest = writer.to_manifest_file(MANIFEST_PATH, buffer.tell())
    committed = manifest.copy(sequence_number=SEQUENCE_NUMBER, min_sequence_number=SEQUENCE_NUMBER)
    return buffer.getvalue(), committed


def icefloe_read(data: bytes, manifest: ManifestFile) -> list[ManifestEntry]:
    return read_manifest(
        data, location=MANIFEST_PATH, manifest_file=manifest, spec_by_id={SPEC.spec_id: SPEC}
    )


def _header_metadata() -> dict[str, str]:
    """The Iceberg key-value metadata icefloe writes, so the fastavro file is a manifest too."""
    return {
        "schema": json.dumps(SCHEMA.to_json()),
        "schema-id": str(SCHEMA.schema_id),
        "partition-spec": json.dumps(SPEC.to_json()["fields"]),
        "partition-spec-id": str(SPEC.spec_id),
        "format-version": str(FORMAT_VERSION),
        "content": "data",
    }


def _kv(m: dict[int, Any] | None) -> tuple[str, list[dict[str, Any]]] | None:
    return None if m is None else ("array", [{"key": k, "value": v} for k, v in m.items()])


def fastavro_records(files: list[DataFile], spec: PartitionSpec = SPEC) -> list[dict[str, Any]]:
    """The manifest_entry records of ``files`` as fastavro takes them (built untimed)."""
    names = [f.name for f in spec.partition_type(SCHEMA).fields]
    return [
        {
            "status": int(ManifestEntryStatus.ADDED),
            "snapshot_id": SNAPSHOT_ID,
            "sequence_number": None,
            "file_sequence_number": None,
            "data_file": {
                "content": int(f.content),
                "file_path": f.file_path,
                "file_format": f.file_format,
                "partition": dict(zip(names, f.partition)),
                "record_count": f.record_count,
                "file_size_in_bytes": f.file_size_in_bytes,
                "column_sizes": _kv(f.column_sizes),
                "value_counts": _kv(f.value_counts),
                "null_value_counts": _kv(f.null_value_counts),
                "nan_value_counts": _kv(f.nan_value_counts),
                "lower_bounds": _kv(f.lower_bounds),
                "upper_bounds": _kv(f.upper_bounds),
                "key_metadata": None,
                "split_offsets": None if f.split_offsets is None else ("array", f.split_offsets),
                "equality_ids": None,
                "sort_order_id": f.sort_order_id,
                "referenced_data_file": None,
            },
        }
        for f in files
    ]


def fastavro_schema() -> dict[str, Any]:
    return parsed_avro_schema(
        manifest_entry_struct(SPEC.partition_type(SCHEMA), FORMAT_VERSION), "manifest_entry"
    )


def fastavro_write(records: list[dict[str, Any]], schema: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    fastavro.writer(buffer, schema, records, codec=CODEC, metadata=_header_metadata())
    return buffer.getvalue()


def fastavro_read(data: bytes) -> list[Any]:
    return list(fastavro.reader(io.BytesIO(data)))


class PyIcebergPeer:
    """PyIceberg's manifest writer and reader over an in-memory PyIceberg FileIO.

    PyIceberg reads and writes through its FileIO abstraction, so a dict-backed one keeps its
    figures free of disk time, like the other two that use ``io.BytesIO``.
    """

    def __init__(self) -> None:
        from pyiceberg.io import FileIO, InputFile, OutputFile
        from pyiceberg.manifest import write_manifest
        from pyiceberg.partitioning import PartitionSpec as PyPartitionSpec
        from pyiceberg.schema import Schema as PySchema

        store: dict[str, bytes] = {}
        self.store = store

        class _Stream(io.BytesIO):
            def __init__(self, location: str) -> None:
                super().__init__()
                self.location = location

            def close(self) -> None:
                if not self.closed:
                    store[self.location] = self.getvalue()
                super().close()

        class _Input(InputFile):
            def __len__(self) -> int:
                return len(store[self.location])

            def exists(self) -> bool:
                return self.location in store

            def open(self, seekable: bool = True) -> io.BytesIO:
                return io.BytesIO(store[self.location])

        class _Output(OutputFile):
            def __len__(self) -> int:
                return len(store[self.location])

            def exists(self) -> bool:
                return self.location in store

            def to_input_file(self) -> Any:
                return _Input(self.location)

            def create(self, overwrite: bool = False) -> io.BytesIO:
                return _Stream(self.location)

        class _MemoryIO(FileIO):
            def new_input(self, location: str) -> Any:
                return _Input(location)

            def new_output(self, location: str) -> Any:
                return _Output(location)

            def delete(self, location: Any) -> None:
                store.pop(location if isinstance(location, str) else location.location, None)

        self.io = _MemoryIO()
        self.schema = PySchema.model_validate_json(json.dumps(SCHEMA.to_json()))
        self.spec = PyPartitionSpec.model_validate_json(json.dumps(SPEC.to_json()))
        self._write_manifest = write_manifest

    def entries(self, files: list[DataFile]) -> list[Any]:
        """PyIceberg ManifestEntry objects with the same values as ``files`` (built untimed)."""
        from pyiceberg.manifest import DataFile as PyDataFile
        from pyiceberg.manifest import DataFileContent, FileFormat
        from pyiceberg.manifest import ManifestEntry as PyManifestEntry
        from pyiceberg.manifest import ManifestEntryStatus as PyStatus
        from pyiceberg.typedef import Record

        out = []
        for f in files:
            data_file = PyDataFile.from_args(
                content=DataFileContent.DATA,
                file_path=f.file_path,
                file_format=FileFormat.PARQUET,
                partition=Record(*f.partition),
                record_count=f.record_count,
                file_size_in_bytes=f.file_size_in_bytes,
                column_sizes=f.column_sizes,
                value_counts=f.value_counts,
                null_value_counts=f.null_value_counts,
                nan_value_counts=f.nan_value_counts,
                lower_bounds=f.lower_bounds,
                upper_bounds=f.upper_bounds,
                split_offsets=f.split_offsets,
                sort_order_id=f.sort_order_id,
            )
            data_file.spec_id = SPEC.spec_id
            out.append(
                PyManifestEntry.from_args(
                    status=PyStatus.ADDED, snapshot_id=SNAPSHOT_ID, data_file=data_file
                )
            )
        return out

    def write(self, entries: list[Any], path: str) -> Any:
        with self._write_manifest(
            format_version=FORMAT_VERSION,
            spec=self.spec,
            schema=self.schema,
            output_file=self.io.new_output(path),
            snapshot_id=SNAPSHOT_ID,
            avro_compression=CODEC,
        ) as writer:
            for entry in entries:
                writer.add(entry)
        return writer.to_manifest_file()

    def manifest_file(self, path: str) -> Any:
        """A manifest list row for ``path`` as committed (so sequence numbers are inherited)."""
        from pyiceberg.manifest import ManifestContent
        from pyiceberg.manifest import ManifestFile as PyManifestFile

        return PyManifestFile.from_args(
            manifest_path=path,
            manifest_length=len(self.store[path]),
            partition_spec_id=SPEC.spec_id,
            content=ManifestContent.DATA,
            sequence_number=SEQUENCE_NUMBER,
            min_sequence_number=SEQUENCE_NUMBER,
            added_snapshot_id=SNAPSHOT_ID,
        )

    def read(self, manifest: Any) -> list[Any]:
        entries: list[Any] = manifest.fetch_manifest_entry(self.io, discard_deleted=False)
        return entries

    def read_with_maps(self, manifest: Any) -> list[Any]:
        """:meth:`read`, then use the six metric maps of every entry.

        PyIceberg builds a file's metric maps lazily, on first use, from the pairs it decoded.
        icefloe's reader returns them built, so this is PyIceberg doing the same work; a
        planner checking column bounds pays at least the bounds' share of it.
        """
        entries = self.read(manifest)
        for entry in entries:
            f = entry.data_file
            for metric in (
                f.column_sizes,
                f.value_counts,
                f.null_value_counts,
                f.nan_value_counts,
                f.lower_bounds,
                f.upper_bounds,
            ):
                len(metric)
        return entries


# ---------------------------------------------------------------------------------------
# Checks (after the clock)
# ---------------------------------------------------------------------------------------


class BenchmarkCheckError(IcefloeError):
    """An implementation produced wrong output, so its figure would be meaningless."""


def check_icefloe_entries(what: str, entries: list[ManifestEntry], files: list[DataFile]) -> None:
    if len(entries) != len(files):
        raise BenchmarkCheckError(f"{what}: read {len(entries)} entries, wrote {len(files)}")
    for i, (entry, expected) in enumerate(zip(entries, files)):
        if entry.data_file != expected:
            raise BenchmarkCheckError(
                f"{what}: entry {i} ({expected.file_path}) does not read back as written"
            )
        if (
            entry.status != ManifestEntryStatus.ADDED
            or entry.snapshot_id != SNAPSHOT_ID
            or entry.sequence_number != SEQUENCE_NUMBER
            or entry.file_sequence_number != SEQUENCE_NUMBER
        ):
            raise BenchmarkCheckError(
                f"{what}: entry {i} has status {entry.status}, snapshot {entry.snapshot_id}, "
                f"sequence numbers {entry.sequence_number}/{entry.file_sequence_number}; "
                f"expected ADDED, {SNAPSHOT_ID}, {SEQUENCE_NUMBER}/{SEQUENCE_NUMBER}"
            )


def check_paths(what: str, paths: list[str], files: list[DataFile]) -> None:
    expected = [f.file_path for f in files]
    if paths != expected:
        mismatch = next(
            (i for i, (a, b) in enumerate(zip(paths, expected)) if a != b),
            min(len(paths), len(expected)),
        )
        raise BenchmarkCheckError(
            f"{what}: returned {len(paths)} entries for {len(expected)} written; first "
            f"difference at entry {mismatch}"
        )


# ---------------------------------------------------------------------------------------
# The benchmark
# ---------------------------------------------------------------------------------------


class _Last:
    """Keeps the output of the latest timed run, so checks need no extra run.

    :meth:`clear` is the measurement's setup: the previous output is freed before the clock
    starts, so no run pays for deallocating the one before it.
    """

    def __init__(self, produce: Callable[[], Any]) -> None:
        self._produce = produce
        self.value: Any = None

    def run(self) -> None:
        self.value = self._produce()

    def clear(self) -> None:
        self.value = None


WARMUP_ENTRIES = 500


def _measured(
    ctx: BenchContext, n: int, runs: dict[str, tuple[_Last, Callable[[], Any]]]
) -> dict[str, Timing]:
    """Interleaved timings of ``{name: (holder of the full run, small warm-up run)}``."""
    return ctx.compare(
        {name: last.run for name, (last, _) in runs.items()},
        work=n,
        setup={name: last.clear for name, (last, _) in runs.items()},
        warmup={name: warm for name, (_, warm) in runs.items()},
    )


@benchmark("manifest")
def manifest_benchmark(ctx: BenchContext) -> list[Figure]:
    """Manifest entries written and read per second (v2, 2-field partition, 10 columns)."""
    n = ctx.size("entries", full=50_000, quick=10_000)
    files = make_data_files(n)
    records = fastavro_records(files)
    parsed = fastavro_schema()
    try:
        pyiceberg: PyIcebergPeer | None = PyIcebergPeer()
    except ImportError as e:
        pyiceberg = None
        ctx.note(f"pyiceberg is not installed ({e}); its figures are missing")
    # Warm-ups run on a small prefix: a full extra run would add a minute and warm nothing more.
    k = min(n, WARMUP_ENTRIES)
    small_bytes, small_manifest = icefloe_write(files[:k])
    py_path = "s3://warehouse/db/events/metadata/bench-pyiceberg-m0.avro"
    py_warmup_path = "s3://warehouse/db/events/metadata/bench-pyiceberg-warmup.avro"
    small_path = "s3://warehouse/db/events/metadata/bench-warmup.avro"

    # -- write -----------------------------------------------------------------------------
    ours = _Last(lambda: icefloe_write(files))
    avro = _Last(lambda: fastavro_write(records, parsed))
    writers: dict[str, tuple[_Last, Callable[[], Any]]] = {
        "icefloe": (ours, lambda: icefloe_write(files[:k])),
        "fastavro": (avro, lambda: fastavro_write(records[:k], parsed)),
    }
    if pyiceberg is not None:
        peer = pyiceberg
        py_entries = peer.entries(files)
        writers["pyiceberg"] = (
            _Last(lambda: peer.write(py_entries, py_path)),
            lambda: peer.write(py_entries[:k], py_warmup_path),
        )
    write_timings = _measured(ctx, n, writers)
    icefloe_bytes, manifest = ours.value
    fastavro_bytes: bytes = avro.value
    for last, _ in writers.values():
        last.clear()

    # -- read (everyone decodes the bytes icefloe wrote) -----------------------------------
    decoded = _Last(lambda: icefloe_read(icefloe_bytes, manifest))
    raw = _Last(lambda: fastavro_read(icefloe_bytes))
    readers: dict[str, tuple[_Last, Callable[[], Any]]] = {
        "icefloe": (decoded, lambda: icefloe_read(small_bytes, small_manifest)),
        "fastavro": (raw, lambda: fastavro_read(small_bytes)),
    }
    py_readers: dict[str, _Last] = {}
    if pyiceberg is not None:
        peer = pyiceberg
        peer.store[MANIFEST_PATH] = icefloe_bytes
        peer.store[small_path] = small_bytes
        py_manifest = peer.manifest_file(MANIFEST_PATH)
        py_small = peer.manifest_file(small_path)
        py_readers["pyiceberg"] = _Last(lambda: peer.read(py_manifest))
        py_readers["pyiceberg+maps"] = _Last(lambda: peer.read_with_maps(py_manifest))
        readers["pyiceberg"] = (py_readers["pyiceberg"], lambda: peer.read(py_small))
        readers["pyiceberg+maps"] = (
            py_readers["pyiceberg+maps"],
            lambda: peer.read_with_maps(py_small),
        )
    read_timings = _measured(ctx, n, readers)

    # -- checks: every output of the last round, and every written file --------------------
    check_icefloe_entries("icefloe reading its own manifest", decoded.value, files)
    check_paths("fastavro", [r["data_file"]["file_path"] for r in raw.value], files)
    sizes = {"icefloe": len(icefloe_bytes), "fastavro": len(fastavro_bytes)}
    if pyiceberg is not None:
        for name, last in py_readers.items():
            check_paths(name, [e.data_file.file_path for e in last.value], files)
            if any(e.sequence_number != SEQUENCE_NUMBER for e in last.value):
                raise BenchmarkCheckError(f"{name}: sequence numbers were not inherited")
            if dict(last.value[-1].data_file.lower_bounds) != files[-1].lower_bounds:
                raise BenchmarkCheckError(f"{name}: the last entry's lower bounds differ")
        py_bytes = pyiceberg.store[py_path]
        sizes["pyiceberg"] = len(py_bytes)
        check_icefloe_entries(
            "icefloe reading the PyIceberg-written manifest",
            icefloe_read(py_bytes, manifest.copy(manifest_path=py_path)),
            files,
        )
    for last, _ in readers.values():
        last.clear()
    check_icefloe_entries(
        "icefloe reading the fastavro-written manifest",
        icefloe_read(fastavro_bytes, manifest),
        files,
    )

    ctx.params["format_version"] = FORMAT_VERSION
    ctx.params["codec"] = CODEC
    ctx.note(
        "manifest size: "
        + ", ".join(f"{name} {size / n:.0f} B/entry" for name, size in sizes.items())
    )
    ctx.note("timed in interleaved rounds; all readers decode icefloe's manifest; outputs checked")
    return [
        Figure("write", "entries/s", write_timings.pop("icefloe"), write_timings),
        Figure("read", "entries/s", read_timings.pop("icefloe"), read_timings),
    ]
