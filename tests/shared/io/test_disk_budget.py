"""The shared cache directories' byte budget: count, then delete the oldest first."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from tests.hypothesis_budget import examples

from icefloe.io.disk_budget import shrink_oldest


def _write(folder: Path, sizes: list[int]) -> list[Path]:
    paths = []
    for i, size in enumerate(sizes):
        path = folder / f"f{i:03d}"
        path.write_bytes(b"x" * size)
        os.utime(path, (1_000 + i, 1_000 + i))  # written in this order
        paths.append(path)
    return paths


@settings(max_examples=examples(40), deadline=None)
@given(
    sizes=st.lists(st.integers(0, 500), min_size=0, max_size=12),
    max_bytes=st.integers(1, 3_000),
)
def test_over_the_budget_the_oldest_go_first_down_to_nine_tenths(
    sizes: list[int], max_bytes: int
) -> None:
    with tempfile.TemporaryDirectory() as d:
        folder = Path(d)
        paths = _write(folder, sizes)
        left = shrink_oldest(paths, max_bytes)
        kept = [p for p in paths if p.exists()]
        assert left == sum(p.stat().st_size for p in kept)
        if sum(sizes) <= max_bytes:
            assert kept == paths  # within the budget nothing is deleted
        else:
            assert left <= max_bytes * 9 // 10
            assert kept == paths[len(paths) - len(kept) :]  # the newest are the ones kept
            # and no fewer than needed: one more (the newest deleted) would fit again
            gone = paths[: len(paths) - len(kept)]
            assert left + sizes[len(gone) - 1] > max_bytes * 9 // 10


def test_a_file_another_process_deleted_is_skipped(tmp_path: Path) -> None:
    paths = _write(tmp_path, [100, 100, 100])
    paths[0].unlink()
    assert shrink_oldest(paths, 150) == 100
    assert [p.exists() for p in paths] == [False, False, True]
