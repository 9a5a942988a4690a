"""A "victim" table's data files, real bytes on disk, for tests of what a purge may delete."""

from __future__ import annotations

from pathlib import Path

from icefloe.spec.datafile import DataFile
from icefloe.table.catalog import Table
from icefloe.table.snapshot_producer import fast_append


async def append_victim_files(table: Table, files: int) -> list[Path]:
    """Write ``files`` small files under the table's ``data`` folder and append them."""
    data = Path(table.location.removeprefix("file://")) / "data"
    data.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(files):
        path = data / f"part-{i}.parquet"
        path.write_bytes(b"victim data %d" % i)
        paths.append(path)
    await fast_append(
        table, [DataFile(str(p), "parquet", (), 1, p.stat().st_size) for p in paths]
    ).commit()
    return paths


def intact(paths: list[Path]) -> bool:
    """Whether every victim file still holds what it was written with."""
    return all(p.read_bytes() == b"victim data %d" % i for i, p in enumerate(paths))
