"""The commit benchmark on tiny sizes: every figure present, every run's table checked.

Nothing here asserts how fast anything is. What is asserted: the appends are split as
promised, both libraries get the same file values, the after-run check catches lost,
doubled and foreign files, the bookkeeping adds up (attempts = commits + conflicts), and the
registered benchmark reports one figure per catalog and committer count beside PyIceberg.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples
from icefloe.catalog.uri import load_catalog
from icefloe.dev.bench import BenchContext, Kind
from icefloe.dev.bench_commits import (
    CATALOGS,
    PEER,
    RECORDS_PER_FILE,
    AppendedFile,
    Contender,
    IcefloeContender,
    PyIcebergContender,
    check_appended,
    commits_benchmark,
    committer_counts,
    icefloe_data_file,
    measure_commits,
    plan_appends,
    pyiceberg_data_file,
)
from icefloe.dev.bench_manifest import BenchmarkCheckError
from icefloe.errors import ValidationError

DATA = "file:///warehouse/bench/t/data"


@pytest.fixture
def runner() -> Iterator[asyncio.Runner]:
    # Contenders drive their own loop; pytest-asyncio's loop is not running in sync tests.
    with asyncio.Runner() as r:
        yield r


def local_contender(tmp_path: Path, runner: asyncio.Runner) -> IcefloeContender:
    catalog = load_catalog((tmp_path / "fs").as_uri(), "bench-fs-local")
    return IcefloeContender("fs-local", catalog, runner)


# -- the appended files ---------------------------------------------------------------------


@settings(max_examples=examples(60), deadline=None)
@given(st.integers(1, 16).flatmap(lambda n: st.tuples(st.just(n), st.integers(n, 200))))
def test_appends_are_split_evenly_over_the_committers(case: tuple[int, int]) -> None:
    committers, appends = case
    plan = plan_appends(DATA, committers, appends)
    sizes = [len(files) for files in plan]
    assert len(plan) == committers
    assert sum(sizes) == appends
    assert max(sizes) - min(sizes) <= 1
    files = [f for per_committer in plan for f in per_committer]
    assert len({f.path for f in files}) == appends
    assert all(f.path.startswith(f"{DATA}/category={f.category}/") for f in files)
    # id ranges never overlap, so the bounds describe distinct rows
    ranges = sorted((f.first_id, f.last_id) for f in files)
    assert all(a[1] < b[0] for a, b in itertools.pairwise(ranges))


def test_idle_committers_are_refused() -> None:
    with pytest.raises(ValidationError, match="at least 16"):
        plan_appends(DATA, 16, 15)
    with pytest.raises(ValidationError, match="at least 1 committer"):
        plan_appends(DATA, 0, 4)


def test_committer_counts_follow_the_largest() -> None:
    assert committer_counts(16) == (1, 4, 16)
    assert committer_counts(4) == (1, 4)
    assert committer_counts(8) == (1, 4, 8)
    assert committer_counts(1) == (1,)
    with pytest.raises(ValidationError, match="max_committers"):
        committer_counts(0)


def test_both_libraries_get_the_same_file_values() -> None:
    f = AppendedFile(f"{DATA}/category=c2/c03-00007.parquet", "c2", 42_000)
    ours = icefloe_data_file(f)
    ours.validate()
    theirs = pyiceberg_data_file(f)
    assert (theirs.file_path, tuple(theirs.partition)) == (ours.file_path, ours.partition)
    assert (theirs.record_count, theirs.file_size_in_bytes) == (
        ours.record_count,
        ours.file_size_in_bytes,
    )
    assert theirs.spec_id == ours.spec_id
    for name in ("column_sizes", "value_counts", "null_value_counts"):
        assert dict(getattr(theirs, name)) == getattr(ours, name)
    assert dict(theirs.lower_bounds) == ours.lower_bounds
    assert dict(theirs.upper_bounds) == ours.upper_bounds
    assert ours.upper_bounds is not None
    assert int.from_bytes(ours.upper_bounds[1], "little") == 42_000 + RECORDS_PER_FILE - 1


# -- the check after each run ------------------------------------------------------------------


def test_check_accepts_exactly_the_appended_files() -> None:
    expected = ["a", "b", "c"]
    check_appended("icefloe", "bench.t", expected, ["c", "a", "b"], 3)


@pytest.mark.parametrize(
    ("live", "snapshots", "message"),
    [
        (["a", "b"], 3, "2 live files after 3 committed appends: 1 missing \\(e.g. c\\)"),
        (["a", "b", "c", "c"], 3, "1 doubled \\(e.g. c\\)"),
        (["a", "b", "c", "x"], 3, "1 unknown \\(e.g. x\\)"),
        (["a", "b", "c"], 2, "2 snapshots after 3 committed appends"),
    ],
)
def test_check_fails_loudly_on_a_lost_doubled_or_foreign_commit(
    live: list[str], snapshots: int, message: str
) -> None:
    with pytest.raises(BenchmarkCheckError, match=message):
        check_appended("icefloe", "bench.t", ["a", "b", "c"], live, snapshots)


class LossyContender(IcefloeContender):
    """Claims to append every planned file but drops each committer's last one."""

    def _append(self, identifier: str, plan: list[list[AppendedFile]]) -> tuple[int, int]:
        return super()._append(identifier, [files[:-1] for files in plan])


def test_a_contender_that_loses_commits_fails_the_benchmark(
    tmp_path: Path, runner: asyncio.Runner
) -> None:
    contender = LossyContender("fs-local", load_catalog(tmp_path.as_uri()), runner)
    try:
        contender.setup()
        contender.run(2, 6)
        with pytest.raises(BenchmarkCheckError, match="4 live files after 6 committed appends"):
            contender.settle()
        # measured through the framework, the check runs before the next run's table
        ctx = BenchContext(repeat=1)
        with pytest.raises(BenchmarkCheckError, match="2 missing"):
            measure_commits(ctx, {"fs-local": contender}, appends=4, counts=(2,))
    finally:
        contender.close()


def test_pyiceberg_tables_are_checked_too(tmp_path: Path) -> None:
    contender = PyIcebergContender(tmp_path / "pyiceberg")
    try:
        contender.setup()
        contender.run(2, 4)
        contender.settle()  # all four there
        contender.setup()
        contender.run(1, 2)
        assert contender._unchecked is not None
        identifier = contender._unchecked.table
        # a commit the benchmark did not make shows up as a foreign file
        table = contender.catalog.load_table(identifier)
        extra = AppendedFile(f"{table.metadata.location}/data/category=c0/x.parquet", "c0", 0)
        transaction = table.transaction()
        with transaction.update_snapshot().fast_append() as append:
            append.append_data_file(pyiceberg_data_file(extra))
        transaction.commit_transaction()
        with pytest.raises(BenchmarkCheckError, match="1 unknown"):
            contender.settle()
    finally:
        contender.close()


def test_a_run_needs_a_fresh_table(tmp_path: Path, runner: asyncio.Runner) -> None:
    contender = local_contender(tmp_path, runner)
    try:
        with pytest.raises(ValidationError, match="needs setup"):
            contender.run(1, 1)
        contender.setup()
        contender.run(1, 1)
        with pytest.raises(ValidationError, match="needs setup"):
            contender.run(1, 1)  # one table per run, so every run can be checked
        contender.settle()
    finally:
        contender.close()


# -- measuring -------------------------------------------------------------------------------


def test_local_catalog_beside_pyiceberg(tmp_path: Path, runner: asyncio.Runner) -> None:
    ctx = BenchContext(repeat=2)
    contenders: dict[str, Contender] = {
        "fs-local": local_contender(tmp_path, runner),
        PEER: PyIcebergContender(tmp_path / "pyiceberg"),
    }
    try:
        figures = measure_commits(ctx, contenders, appends=4, counts=(1, 2))
    finally:
        for contender in contenders.values():
            contender.close()
    assert [(f.name, f.unit, f.kind) for f in figures] == [
        ("fs-local N=1", "appends/s", Kind.RATE),
        ("fs-local N=2", "appends/s", Kind.RATE),
    ]
    for figure in figures:
        assert list(figure.peers) == [PEER]
        for timing in (figure.icefloe, *figure.peers.values()):
            assert timing.work == 4 and len(timing.seconds) == 2
        assert math.isfinite(figure.speedup(PEER)) and figure.speedup(PEER) > 0
    for contender in contenders.values():
        # per N: a warm-up (one append per committer) and two timed runs, all settled
        assert [(t.committers, t.commits, t.warmup) for t in contender.tallies] == [
            (1, 1, True),
            (1, 4, False),
            (1, 4, False),
            (2, 2, True),
            (2, 4, False),
            (2, 4, False),
        ]
        assert all(t.attempts == t.commits + t.conflicts for t in contender.tallies)
        assert contender.conflicts_per_commit(1) == 0  # nobody to race with
        assert contender._unchecked is None
    assert ctx.params == {"committers": "1/2", "retry_wait_ms": "2-100"}
    assert any(
        n.startswith("conflicts (each one a retry) per committed append, N=2: ") for n in ctx.notes
    )


def test_appends_must_keep_every_committer_busy(tmp_path: Path, runner: asyncio.Runner) -> None:
    contender = local_contender(tmp_path, runner)
    try:
        with pytest.raises(ValidationError, match="cannot keep 4 committers busy"):
            measure_commits(
                BenchContext(repeat=1), {"fs-local": contender}, appends=3, counts=(1, 4)
            )
    finally:
        contender.close()


@pytest.mark.integration
@pytest.mark.interop
def test_the_registered_benchmark_covers_every_catalog() -> None:
    ctx = BenchContext(quick=True, repeat=1, sizes={"appends": 2, "max_committers": 2})
    figures = commits_benchmark(ctx)
    assert [f.name for f in figures] == [f"{c} N={n}" for c in CATALOGS for n in (1, 2)]
    for figure in figures:
        assert list(figure.peers) == [PEER]
        assert figure.icefloe.work == 2 and len(figure.icefloe.seconds) == 1
        assert figure.value(figure.icefloe) > 0
    assert ctx.params["appends"] == 2 and ctx.params["max_committers"] == 2
    assert ctx.params["committers"] == "1/2"
