"""What the manifest decoding and caching tests share: a schema of every primitive kind that
partitions, and a manifest written in memory from data files and entries."""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Iterable
from typing import Any

from icefloe.manifests.manifest import (
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestWriter,
)
from icefloe.manifests.manifest_list import ManifestFile
from icefloe.spec.datafile import DataFile
from icefloe.spec.partition import PartitionSpec
from icefloe.spec.schema import Schema
from icefloe.spec.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
    TimestampType,
    UUIDType,
)

PRIMITIVE_FIELDS = (
    NestedField(1, "i", IntegerType()),
    NestedField(2, "l", LongType(), required=True),
    NestedField(3, "s", StringType()),
    NestedField(4, "d", DoubleType()),
    NestedField(5, "dt", DateType()),
    NestedField(6, "dec", DecimalType(9, 2)),
    NestedField(7, "u", UUIDType()),
    NestedField(8, "b", BooleanType()),
    NestedField(9, "bin", BinaryType()),
    NestedField(10, "f", FloatType()),
    NestedField(11, "ts", TimestampType()),
)
"""Field ids 1-11: a column of each primitive type a partition or a metric bound takes."""


def write_manifest(
    entries: Iterable[tuple[ManifestEntryStatus, DataFile | ManifestEntry]],
    *,
    spec: PartitionSpec,
    schema: Schema,
    version: int = 2,
    snapshot_id: int = 42,
    content: ManifestContent = ManifestContent.DATA,
    path: str = "s3://b/t/metadata/m.avro",
    **row: Any,
) -> tuple[bytes, ManifestFile]:
    """A manifest's bytes and its manifest-list row (with ``row``'s fields replaced).

    Each entry is written with its status: added (a data file, by ``snapshot_id``),
    existing or deleted (an entry, with its own snapshot id and sequence numbers).
    """
    buffer = io.BytesIO()
    with ManifestWriter(
        buffer,
        spec=spec,
        schema=schema,
        format_version=version,
        snapshot_id=snapshot_id,
        content=content,
    ) as writer:
        for status, entry in entries:
            if status == ManifestEntryStatus.ADDED:
                writer.add(entry.data_file if isinstance(entry, ManifestEntry) else entry)
            elif isinstance(entry, DataFile):
                raise ValueError(f"a {status.name.lower()} entry needs a ManifestEntry")
            elif status == ManifestEntryStatus.EXISTING:
                writer.existing(entry)
            else:
                writer.delete(entry)
    manifest = writer.to_manifest_file(path, buffer.tell())
    return buffer.getvalue(), dataclasses.replace(manifest, **row)


def id_file(location: str, i: int, s: str) -> DataFile:
    """Data file ``i`` of a table partitioned by identity of string column ``s`` (field 2),
    holding ids ``10 i`` to ``10 i + 9`` in field 1: metrics a scan can prune by."""
    return DataFile(
        file_path=f"{location}/data/s={s}/{i}.parquet",
        file_format="parquet",
        partition=(s,),
        record_count=10,
        file_size_in_bytes=100,
        value_counts={1: 10},
        null_value_counts={1: 0},
        lower_bounds={1: (i * 10).to_bytes(8, "little")},
        upper_bounds={1: (i * 10 + 9).to_bytes(8, "little")},
    )
