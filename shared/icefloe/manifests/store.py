"""Decoded manifests persisted on local disk as Arrow IPC files, memory-mapped when read.

A planner replica that restarts, or a new one that scales out, would otherwise decode every
manifest of every table again before its plans are fast. Manifests never change once written,
so their decoded columns can be kept on disk by manifest path: the file is the exact Arrow
layout the cache holds, and reading it back is a ``mmap`` (no decoding, no copy; pages are
shared by every process on the host that maps the same file and live in the page cache, which
the kernel can reclaim, rather than on the heap).

Files are named by a hash of the manifest path and the values the manifest inherits from its
manifest list row (snapshot id, sequence number, first row id), which are fixed once the
manifest is committed. Writes go to a temporary file renamed into place, so concurrent
processes never see a partial file; a file that does not read back is deleted and reported
as a miss. The directory is kept within ``max_bytes`` by deleting the least recently written
files.

Beside a manifest's columns the store keeps arrays *derived* from all its rows
(:meth:`ManifestStore.save_derived`, named by a text that says all the value depends on):
the REST task texts of a full plan, which one planner process writes and every other
process of the host maps instead of writing them again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from icefloe.errors import IcefloeError, ValidationError
from icefloe.io.disk_budget import shrink_oldest, unlink_quietly
from icefloe.manifests.manifest_list import ManifestFile
from icefloe.spec.schema import Schema
from icefloe.spec.types import StructType

log = logging.getLogger(__name__)

FORMAT = b"icefloe-manifest-columns-1"
DERIVED_FORMAT = b"icefloe-manifest-derived-1"
_PARTITION_PREFIX = "__partition_"


@dataclass(frozen=True, slots=True)
class StoredColumns:
    """A manifest's cache columns and partition columns, as read back from disk."""

    columns: dict[str, Any]
    partitions: list[Any]
    partition_type: StructType
    nbytes: int


def store_key(manifest: ManifestFile, derived: str | None = None) -> str:
    """The file name of a manifest's decoded columns, or of a value ``derived`` from them
    (:meth:`ManifestStore.save_derived`)."""
    identity = "\x00".join(
        str(v)
        for v in (
            manifest.manifest_path,
            manifest.added_snapshot_id,
            manifest.sequence_number,
            manifest.first_row_id,
            manifest.partition_spec_id,
        )
    )
    if derived is not None:
        identity += "\x00derived\x00" + derived
    return hashlib.sha256(identity.encode("utf-8")).hexdigest() + ".arrow"


class ManifestStore:
    """A directory of decoded manifests within ``max_bytes`` (see the module docstring)."""

    def __init__(self, directory: str | os.PathLike[str], max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValidationError(f"manifest store max_bytes must be >= 0, got {max_bytes}")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._bytes = sum(p.stat().st_size for p in self._files())
        self.hits = 0
        self.misses = 0
        self.writes = 0

    def _files(self) -> list[Path]:
        return [p for p in self.directory.glob("*.arrow") if p.is_file()]

    @property
    def bytes(self) -> int:
        return self._bytes

    def load(self, manifest: ManifestFile) -> StoredColumns | None:
        """The stored columns of ``manifest``, memory-mapped; None if not stored."""
        path = self.directory / store_key(manifest)
        try:
            source = pa.memory_map(str(path), "r")
        except FileNotFoundError:
            with self._lock:
                self.misses += 1
            return None
        except OSError as e:
            log.warning("manifest store: cannot open %s: %s", path, e)
            return None
        try:
            reader = pa.ipc.open_file(source)
            meta = reader.schema.metadata or {}
            if meta.get(b"format") != FORMAT or meta.get(b"manifest") != (
                manifest.manifest_path.encode("utf-8")
            ):
                raise ValueError("written for another manifest or format")
            batch = reader.get_batch(0) if reader.num_record_batches else None
            if batch is None:
                raise ValueError("no record batch")
            partition_type = Schema.from_json(json.loads(meta[b"partition-type"])).struct
        except (pa.ArrowException, ValueError, OSError, KeyError, IcefloeError) as e:
            log.warning("manifest store: dropping unreadable %s: %s", path, e)
            self._remove(path)
            return None
        columns: dict[str, Any] = {}
        partition_count = len(partition_type.fields)
        partitions: list[Any] = [None] * partition_count
        for name, column in zip(batch.schema.names, batch.columns):
            if name.startswith(_PARTITION_PREFIX):
                pos = int(name[len(_PARTITION_PREFIX) :])
                if pos >= partition_count:
                    self._remove(path)
                    return None
                partitions[pos] = column
            else:
                columns[name] = column
        if any(p is None for p in partitions):
            self._remove(path)
            return None
        with self._lock:
            self.hits += 1
        return StoredColumns(columns, partitions, partition_type, int(batch.nbytes))

    def load_derived(self, manifest: ManifestFile, name: str) -> Any | None:
        """The array saved by :meth:`save_derived` under ``name``, memory-mapped (so every
        process of the host shares its pages); None if absent or unreadable."""
        path = self.directory / store_key(manifest, name)
        try:
            source = pa.memory_map(str(path), "r")
        except OSError:
            return None
        try:
            reader = pa.ipc.open_file(source)
            meta = reader.schema.metadata or {}
            if (
                meta.get(b"format") != DERIVED_FORMAT
                or meta.get(b"manifest") != manifest.manifest_path.encode("utf-8")
                or meta.get(b"derived") != name.encode("utf-8")
                or reader.num_record_batches != 1
            ):
                raise ValueError("written for another manifest, value or format")
            batch = reader.get_batch(0)
            if batch.num_columns != 1:
                raise ValueError("not one column")
        except (pa.ArrowException, ValueError, OSError) as e:
            log.warning("manifest store: dropping unreadable %s: %s", path, e)
            self._remove(path)
            return None
        return batch.column(0)

    def save_derived(self, manifest: ManifestFile, name: str, array: Any) -> bool:
        """Persist one array computed from a manifest's rows under ``name`` (a text naming
        everything else the value depends on), for any process of the host to map (best
        effort, as :meth:`save`); within the same budget as the columns."""
        if self.max_bytes == 0:
            return False
        try:
            batch = pa.RecordBatch.from_arrays([array], names=["value"])
            batch = batch.replace_schema_metadata(
                {
                    b"format": DERIVED_FORMAT,
                    b"manifest": manifest.manifest_path.encode("utf-8"),
                    b"derived": name.encode("utf-8"),
                }
            )
            return self._write(store_key(manifest, name), batch)
        except (pa.ArrowException, OSError, ValueError) as e:
            log.warning("manifest store: cannot save %s of %s: %s", name, manifest.manifest_path, e)
            return False

    def _write(self, name: str, batch: Any) -> bool:
        """Write ``batch`` as file ``name`` (a temporary file renamed into place), count it
        and keep the directory within the budget."""
        fd, tmp = tempfile.mkstemp(dir=self.directory, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as raw, pa.ipc.new_file(raw, batch.schema) as writer:
                writer.write_batch(batch)
            size = os.path.getsize(tmp)
            target = self.directory / name
            # Placing the file, counting it and shrinking are one step under the lock: a
            # shrink recounts the directory, and one running between another thread's
            # rename and its count would drop that file from the count (or count it twice).
            with self._lock:
                try:
                    replaced = target.stat().st_size
                except FileNotFoundError:
                    replaced = 0
                os.replace(tmp, target)
                self.writes += 1
                self._bytes += size - replaced
                if self._bytes > self.max_bytes:
                    self._shrink()
        except BaseException:
            unlink_quietly(tmp)
            raise
        return True

    def save(
        self,
        manifest: ManifestFile,
        columns: dict[str, Any],
        partitions: list[Any],
        partition_type: StructType,
    ) -> bool:
        """Persist a manifest's columns (best effort: failures are logged, not raised);
        whether they were written (not with a zero budget, nor on an error)."""
        if self.max_bytes == 0:
            return False
        names = list(columns) + [f"{_PARTITION_PREFIX}{i}" for i in range(len(partitions))]
        arrays = list(columns.values()) + list(partitions)
        try:
            batch = pa.RecordBatch.from_arrays(arrays, names=names)
            batch = batch.replace_schema_metadata(
                {
                    b"format": FORMAT,
                    b"manifest": manifest.manifest_path.encode("utf-8"),
                    b"partition-type": json.dumps(
                        Schema.from_struct(partition_type).to_json()
                    ).encode("utf-8"),
                }
            )
            return self._write(store_key(manifest), batch)
        except (pa.ArrowException, OSError, ValueError) as e:
            log.warning("manifest store: cannot save %s: %s", manifest.manifest_path, e)
            return False

    def _remove(self, path: Path) -> None:
        with self._lock:
            try:
                size = path.stat().st_size
                path.unlink()
            except OSError:
                return
            self._bytes = max(0, self._bytes - size)

    def _shrink(self) -> None:
        """Count the directory again and delete its oldest files if it is over the budget
        (:func:`~icefloe.io.disk_budget.shrink_oldest`); called with the lock held."""
        self._bytes = shrink_oldest(self._files(), self.max_bytes)


__all__ = ["ManifestStore", "StoredColumns", "store_key"]
