"""The coordinator benchmark on tiny sizes: every figure present, every run's tables checked.

Nothing here asserts how fast anything is. What is asserted: the file stream is what the
benchmark promises (round-robin, unique, the same files whatever the table), its events
decode back to its files, percentiles are nearest-rank, the checks after each run catch
lost, doubled and foreign files and commit ids, a dead letter or a lossy committer fails
the benchmark, and the registered benchmark reports every figure with its peer.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import math
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples
from icefloe.coordinator.config import CoordinatorConfig, add_arguments, overrides_from_args
from icefloe.dev.bench import BenchContext, Kind
from icefloe.dev.bench_commits import RECORDS_PER_FILE, SCHEMA, SPEC
from icefloe.dev.bench_coordinator import (
    BenchRig,
    Coordinated,
    ResultsTracker,
    RigSettings,
    Sizes,
    StreamEvent,
    StreamRun,
    StreamTable,
    TableState,
    Uncoordinated,
    check_coordinated,
    check_uncoordinated,
    coordinator_benchmark,
    coordinator_flags,
    encode_stream,
    percentile,
    plan_stream,
    run_coordinator_benchmark,
    writers_peer,
)
from icefloe.dev.bench_manifest import BenchmarkCheckError
from icefloe.errors import ValidationError
from icefloe.events import DeadLetter, FilesWritten, TableCommitted, event_key, parse_event


def stream_tables(n: int, root: str = "file:///wh/bench") -> list[StreamTable]:
    return [StreamTable(f"bench.t{i}", f"{root}/t{i}/data", SCHEMA, SPEC) for i in range(n)]


def state_of(events: list[StreamEvent], snapshots: int | None = None) -> TableState:
    """What a table holding exactly ``events`` (one snapshot each, unless told) looks like."""
    return TableState(
        [f.file_path for e in events for f in e.files],
        [e.commit_id for e in events],
        len(events) if snapshots is None else snapshots,
    )


# -- the file stream -------------------------------------------------------------------------


@settings(max_examples=examples(40), deadline=None)
@given(st.integers(1, 7), st.integers(1, 60), st.integers(1, 4))
def test_the_stream_goes_round_robin_with_unique_files(
    tables: int, events: int, files_per_event: int
) -> None:
    targets = stream_tables(tables)
    stream = plan_stream(targets, events, files_per_event, "run")
    assert len(stream) == events
    assert [e.table for e in stream] == [targets[i % tables] for i in range(events)]
    assert len({e.commit_id for e in stream}) == events
    files = [f for e in stream for f in e.files]
    assert all(len(e.files) == files_per_event for e in stream)
    assert len({f.file_path for f in files}) == events * files_per_event
    for event in stream:
        for f in event.files:
            assert f.file_path.startswith(f"{event.table.data_location}/category={f.partition[0]}/")
            assert f.record_count == RECORDS_PER_FILE
    # every file describes rows of its own
    assert f.lower_bounds is not None and f.upper_bounds is not None
    ranges = sorted(
        (int.from_bytes(f.lower_bounds[1], "little"), int.from_bytes(f.upper_bounds[1], "little"))
        for f in files
        if f.lower_bounds is not None and f.upper_bounds is not None
    )
    assert all(a[1] < b[0] for a, b in itertools.pairwise(ranges))


def test_two_runs_of_one_size_commit_the_same_files_up_to_the_location() -> None:
    ours = plan_stream(stream_tables(1, "file:///a"), 10, 2, "coordinated")
    theirs = plan_stream(stream_tables(1, "file:///b"), 10, 2, "writers")
    for a, b in zip(ours, theirs, strict=True):
        for fa, fb in zip(a.files, b.files, strict=True):
            assert fa.file_path.removeprefix("file:///a") == fb.file_path.removeprefix("file:///b")
            assert (fa.partition, fa.record_count, fa.lower_bounds, fa.upper_bounds) == (
                fb.partition,
                fb.record_count,
                fb.lower_bounds,
                fb.upper_bounds,
            )
    assert {e.commit_id for e in ours}.isdisjoint(e.commit_id for e in theirs)


def test_a_stream_needs_tables_and_events() -> None:
    with pytest.raises(ValidationError, match="at least one table"):
        plan_stream([], 3, 2, "x")
    with pytest.raises(ValidationError, match="events=0"):
        plan_stream(stream_tables(1), 0, 2, "x")
    with pytest.raises(ValidationError, match="files_per_event=0"):
        plan_stream(stream_tables(1), 3, 0, "x")


def test_events_are_complete_files_written_that_decode_to_the_streams_files() -> None:
    stream = plan_stream(stream_tables(3), 6, 2, "enc")
    for event, (value, key) in zip(stream, encode_stream(stream), strict=True):
        assert key == event_key(event.table.identifier)
        parsed = parse_event(value)
        assert isinstance(parsed, FilesWritten)
        assert parsed.complete and parsed.commit_id == event.commit_id
        assert parsed.table == event.table.identifier
        data, deletes = parsed.decode_files(SCHEMA, {SPEC.spec_id: SPEC})
        assert deletes == []
        assert [(f.file_path, f.partition, f.record_count) for f in data] == [
            (f.file_path, f.partition, f.record_count) for f in event.files
        ]
        assert [f.lower_bounds for f in data] == [f.lower_bounds for f in event.files]
    stamped = stream[0].files_written(produced_at_ms=1234)
    assert stamped.produced_at_ms == 1234


# -- percentiles -------------------------------------------------------------------------------


@settings(max_examples=examples(100), deadline=None)
@given(
    st.lists(st.integers(0, 10_000), min_size=1, max_size=200),
    st.floats(0.001, 1.0, allow_nan=False),
)
def test_percentiles_are_nearest_rank(values: list[int], fraction: float) -> None:
    p = percentile(values, fraction)
    assert p in values
    rank = math.ceil(fraction * len(values))
    assert sum(v <= p for v in values) >= rank  # at least that share at or below it
    assert sum(v < p for v in values) < rank  # and it is the smallest such value


def test_percentile_examples_and_refusals() -> None:
    hundred = list(range(100, 0, -1))
    assert (percentile(hundred, 0.5), percentile(hundred, 0.99), percentile(hundred, 1.0)) == (
        50,
        99,
        100,
    )
    assert percentile([7], 0.99) == 7
    with pytest.raises(ValidationError, match="at least one value"):
        percentile([], 0.5)
    with pytest.raises(ValidationError, match="in \\(0, 1\\]"):
        percentile([1, 2], 0.0)


# -- the checks after each run ----------------------------------------------------------------


def test_the_checks_accept_exactly_the_stream() -> None:
    events = plan_stream(stream_tables(1), 5, 2, "ok")
    check_uncoordinated("writers", "bench.t0", events, state_of(events))
    # the coordinator batches: fewer snapshots than events is the point
    check_coordinated("coordinator", "bench.t0", events, state_of(events, snapshots=2))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: TableState(s.live_paths[:-1], s.commit_ids, 2), "1 missing files"),
        (lambda s: TableState(s.live_paths + s.live_paths[:1], s.commit_ids, 2), "1 doubled"),
        (lambda s: TableState([*s.live_paths, "x"], s.commit_ids, 2), "1 unknown files \\(e.g. x"),
        (lambda s: TableState(s.live_paths, s.commit_ids[1:], 2), "1 missing commit ids"),
        (lambda s: TableState(s.live_paths, s.commit_ids * 2, 2), "5 doubled commit ids"),
        (lambda s: TableState(s.live_paths, s.commit_ids, 6), "6 snapshots for 5 events"),
    ],
)
def test_the_coordinated_check_fails_loudly(
    change: Callable[[TableState], TableState], message: str
) -> None:
    events = plan_stream(stream_tables(1), 5, 2, "bad")
    state = change(state_of(events))
    with pytest.raises(BenchmarkCheckError, match=message):
        check_coordinated("coordinator", "bench.t0", events, state)


def test_the_uncoordinated_check_fails_loudly() -> None:
    events = plan_stream(stream_tables(1), 4, 2, "bad")
    good = state_of(events)
    with pytest.raises(BenchmarkCheckError, match="2 missing files"):
        check_uncoordinated("writers", "bench.t0", events, TableState(good.live_paths[2:], [], 4))
    with pytest.raises(BenchmarkCheckError, match="3 snapshots for 4 appends"):
        check_uncoordinated("writers", "bench.t0", events, TableState(good.live_paths, [], 3))


# -- configuration ------------------------------------------------------------------------------


def test_subprocess_flags_give_the_same_settings() -> None:
    settings_ = RigSettings("127.0.0.1:9092", "redis://127.0.0.1:6379/0", Path("/wh"), False, 100)
    config = settings_.coordinator_config()
    assert config.check_files is False
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    parsed = overrides_from_args(parser.parse_args(coordinator_flags(config)))
    again = CoordinatorConfig.load(parsed)
    for name in config.model_fields_set:
        assert getattr(again, name) == getattr(config, name), name
    assert "--http-port" not in coordinator_flags(config, exclude=("http_port",))


def test_sizes_must_make_sense() -> None:
    ctx = BenchContext(quick=True)
    sizes = Sizes.from_context(ctx)
    assert sizes.latency_events == sizes.rate * sizes.latency_seconds
    with pytest.raises(ValidationError, match="cannot reach tables=8"):
        Sizes.from_context(BenchContext(quick=True, sizes={"tables": 8, "events": 5}))
    # the comparison is on one table: its stream need not reach the others
    wide = Sizes.from_context(
        BenchContext(quick=True, sizes={"tables": 40, "events": 40, "compare_events": 16})
    )
    assert (wide.tables, wide.compare_events) == (40, 16)
    with pytest.raises(ValidationError, match="cannot keep 16 writers busy"):
        Sizes.from_context(BenchContext(quick=True, sizes={"compare_events": 10}))


# -- the results tracker --------------------------------------------------------------------------


def committed(commit_ids: tuple[str, ...], latency_ms: int) -> TableCommitted:
    return TableCommitted(
        table="bench.t0",
        snapshot_id=42,
        sequence_number=1,
        metadata_location="file:///wh/bench/t0/metadata/00001.metadata.json",
        commit_ids=commit_ids,
        latency_ms=latency_ms,
    )


async def test_visibility_is_the_oldest_events_time_plus_the_reported_latency() -> None:
    tracker = ResultsTracker("127.0.0.1:1", "r", "d")
    tracker._record(committed(("a", "b", "c"), latency_ms=300), received_ms=10_000)
    # a later announcement of the same commit (acknowledged again) changes nothing
    tracker._record(committed(("a",), latency_ms=9_999), received_ms=20_000)
    produced = {"a": 1_100, "b": 1_000, "c": 1_250}
    assert {c: tracker.visible_at_ms(c, produced) for c in produced} == {
        "a": 1_300,
        "b": 1_300,
        "c": 1_300,
    }
    await tracker.wait_for(["a", "b", "c"], alive=lambda: None)  # all announced already


async def test_a_dead_letter_fails_the_run() -> None:
    tracker = ResultsTracker("127.0.0.1:1", "r", "d")
    tracker._record(
        DeadLetter.for_bytes(b"{}", "bad-path: file is outside", "events", 3, 17, table="bench.t0"),
        received_ms=0,
    )
    with pytest.raises(BenchmarkCheckError, match="offset 17\\) because: bad-path"):
        await tracker.wait_for(["never"], alive=lambda: None)


# -- against real servers ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def rig(
    kafka_broker: str, redis_server: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BenchRig]:
    """A coordinator in this process (faster to start in tests) on the session's servers."""
    warehouse = tmp_path_factory.mktemp("bench-coordinator")
    with asyncio.Runner() as runner:
        rig = BenchRig(runner, RigSettings(kafka_broker, redis_server, warehouse, True, 50))
        rig.start()
        try:
            yield rig
        finally:
            rig.close()


class LossyWriters(Uncoordinated):
    """Claims to commit the whole stream but leaves its last event out."""

    def _commit(self, run: StreamRun, *, timed: bool) -> None:
        self.rig.call(self.rig.commit_uncoordinated(run.stream[:-1], self.writers))


class StrayCoordinated(Coordinated):
    """Sends one event whose files lie outside its table: the coordinator dead-letters it."""

    def _encode(self, stream: list[StreamEvent]) -> list[tuple[bytes, bytes]]:
        first = stream[0]
        files = tuple(
            dataclasses.replace(f, file_path=f"file:///elsewhere/{uuid.uuid4().hex}.parquet")
            for f in first.files
        )
        return encode_stream([StreamEvent(first.table, first.commit_id, files), *stream[1:]])


@pytest.mark.integration
def test_a_lossy_writer_fails_the_benchmark(rig: BenchRig) -> None:
    writers = LossyWriters(rig, tables=1, events=20, files_per_event=2, writers=4)
    writers.setup()
    writers.run()
    with pytest.raises(BenchmarkCheckError, match=r"4 writers: table .* 2 missing files"):
        writers.settle()


@pytest.mark.integration
def test_a_dead_lettered_event_fails_the_benchmark(rig: BenchRig) -> None:
    coordinated = StrayCoordinated(rig, tables=1, events=6, files_per_event=2)
    coordinated.setup()
    try:
        with pytest.raises(BenchmarkCheckError, match=r"dead-lettered.*bad-path"):
            coordinated.run()
    finally:
        rig.tracker.dead_letters.clear()


@pytest.mark.integration
def test_every_figure_on_an_in_process_coordinator(rig: BenchRig) -> None:
    ctx = BenchContext(
        quick=True,
        repeat=2,
        sizes={"events": 12, "tables": 3, "rate": 60, "latency_seconds": 1, "compare_events": 16},
    )
    figures = run_coordinator_benchmark(ctx, rig, Sizes.from_context(ctx))
    assert [(f.name, f.unit, f.kind) for f in figures] == [
        ("1 table", "events/s", Kind.RATE),
        ("1 table", "files/s", Kind.RATE),
        ("3 tables", "events/s", Kind.RATE),
        ("3 tables", "files/s", Kind.RATE),
        ("latency p50 1 table @60/s", "ms", Kind.LATENCY),
        ("latency p99 1 table @60/s", "ms", Kind.LATENCY),
        ("latency p50 3 tables @60/s", "ms", Kind.LATENCY),
        ("latency p99 3 tables @60/s", "ms", Kind.LATENCY),
        ("vs writers, 1 table", "files/s", Kind.RATE),
    ]
    for figure in figures:
        assert len(figure.icefloe.seconds) == 2  # one value per timed run
        assert math.isfinite(figure.value(figure.icefloe)) and figure.value(figure.icefloe) > 0
    rates = {(f.name, f.unit): f.icefloe.work for f in figures if f.kind is Kind.RATE}
    assert rates[("1 table", "events/s")] == 12 and rates[("1 table", "files/s")] == 24
    assert rates[("vs writers, 1 table", "files/s")] == 32
    (versus,) = [f for f in figures if f.peers]
    assert list(versus.peers) == [writers_peer(16)]
    assert versus.speedup(writers_peer(16)) > 0
    p50, p99 = figures[4], figures[5]
    assert p50.value(p50.icefloe) <= p99.value(p99.icefloe)
    assert any("lost" in n and "races per committed append" in n for n in ctx.notes)
    assert any("in the benchmark's process" in n for n in ctx.notes)


@pytest.mark.integration
def test_the_registered_benchmark_runs_the_coordinator_in_its_own_process() -> None:
    ctx = BenchContext(
        quick=True,
        repeat=1,
        sizes={"events": 8, "tables": 2, "rate": 40, "latency_seconds": 1, "compare_events": 16},
    )
    figures = coordinator_benchmark(ctx)
    assert len(figures) == 9 and all(f.value(f.icefloe) > 0 for f in figures)
    assert ctx.params["in_process"] == 0 and ctx.params["batch_max_wait_ms"] == 100
    assert any("in a child process of its own" in n for n in ctx.notes)
