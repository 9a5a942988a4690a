"""Tests for icefloe.coordinator.batcher: the per-table batching state machine (no Kafka, no IO)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples
from icefloe.coordinator.batcher import (
    BATCH_MAX_BYTES,
    BATCH_MAX_FILES,
    BATCH_MAX_WAIT_MS,
    Admission,
    BatchLimits,
    CommitStatus,
    OffsetSet,
    PendingFiles,
    TableBatcher,
)
from icefloe.errors import ValidationError
from icefloe.events import CommitOperation, CommitRequested, FilesWritten
from icefloe.spec.datafile import DataFile
from icefloe.spec.partition import PartitionSpec
from icefloe.spec.schema import Schema
from icefloe.spec.types import LongType, NestedField

TABLE = "db.t"
SCHEMA = Schema(NestedField(1, "id", LongType(), required=True))
SPEC = PartitionSpec.unpartitioned()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Feed:
    """Hands events to a batcher with increasing offsets, as the coordinator does."""

    def __init__(self, limits: BatchLimits | None = None) -> None:
        self.clock = Clock()
        self.batcher = TableBatcher(
            TABLE, limits or BatchLimits(10, 1 << 40, 1000), clock=self.clock
        )
        self.offset = 0

    def next_offset(self) -> int:
        offset = self.offset
        self.offset += 1
        self.batcher.track(offset)
        return offset

    def files(
        self,
        commit_id: str,
        attempt: str = "a0",
        n: int = 1,
        size: int = 100,
        complete: bool = False,
        **kwargs: Any,
    ) -> tuple[FilesWritten, Any]:
        offset = self.next_offset()
        data = [
            DataFile(
                f"s3://b/t/data/{commit_id}-{attempt}-{offset}-{i}.parquet", "parquet", (), 1, size
            )
            for i in range(n)
        ]
        event = FilesWritten.from_data_files(
            TABLE,
            commit_id,
            "w",
            f"{commit_id}-{attempt}",
            SCHEMA,
            SPEC,
            data,
            complete=complete,
            **kwargs,
        )
        admitted = self.batcher.add_files(
            PendingFiles(event, offset, tuple(data), received_at=self.clock())
        )
        return event, admitted

    def request(
        self,
        commit_id: str,
        operation: CommitOperation = CommitOperation.APPEND,
        attempts: tuple[str, ...] = ("a0",),
        **kwargs: Any,
    ) -> Any:
        offset = self.next_offset()
        fields: dict[str, Any] = {"attempt_ids": tuple(f"{commit_id}-{a}" for a in attempts)}
        fields.update(kwargs)
        request = CommitRequested(table=TABLE, commit_id=commit_id, operation=operation, **fields)
        return self.batcher.add_request(request, offset)

    def append(self, commit_id: str, n: int = 1, size: int = 100) -> Any:
        self.files(commit_id, n=n, size=size)
        return self.request(commit_id)


def test_units_wait_until_max_wait_then_batch_together() -> None:
    feed = Feed(BatchLimits(max_files=100, max_bytes=1 << 40, max_wait_ms=5000))
    for c in ("c1", "c2", "c3"):
        assert feed.append(c).admission is Admission.READY
    assert feed.batcher.take_batch() is None
    assert feed.batcher.next_deadline() == pytest.approx(feed.clock.now + 5.0)
    feed.clock.now += 4.999
    assert feed.batcher.take_batch() is None
    feed.clock.now += 0.001
    batch = feed.batcher.take_batch()
    assert batch is not None
    assert batch.trigger == "max-wait"
    assert batch.commit_ids == ["c1", "c2", "c3"]
    assert batch.file_count == 3


def test_max_files_cuts_the_batch_at_the_crossing_unit() -> None:
    feed = Feed(BatchLimits(max_files=5, max_bytes=1 << 40, max_wait_ms=60_000))
    for c, n in (("c1", 2), ("c2", 2), ("c3", 2), ("c4", 1)):
        feed.append(c, n=n)
    batch = feed.batcher.take_batch()
    assert batch is not None and batch.trigger == "max-files"
    assert batch.commit_ids == ["c1", "c2", "c3"]
    feed.batcher.complete(batch, dict.fromkeys(batch.commit_ids, 1))
    # c4 alone is under every limit: it waits.
    assert feed.batcher.take_batch() is None
    assert [u.commit_id for u in feed.batcher.ready_units] == ["c4"]


def test_max_bytes_triggers() -> None:
    feed = Feed(BatchLimits(max_files=1000, max_bytes=1000, max_wait_ms=60_000))
    feed.append("c1", size=600)
    assert feed.batcher.take_batch() is None
    feed.append("c2", size=600)
    batch = feed.batcher.take_batch()
    assert batch is not None and batch.trigger == "max-bytes"
    assert batch.byte_count == 1200


def test_non_append_units_commit_alone_and_in_order() -> None:
    feed = Feed(BatchLimits(max_files=100, max_bytes=1 << 40, max_wait_ms=60_000))
    feed.append("a1")
    feed.append("a2")
    feed.files("ow")
    feed.request("ow", CommitOperation.OVERWRITE)
    feed.append("a3")
    first = feed.batcher.take_batch()
    assert first is not None
    # Appends ahead of an overwrite do not wait: the overwrite is queued behind them.
    assert (first.commit_ids, first.trigger) == (["a1", "a2"], "blocked")
    assert feed.batcher.take_batch() is None  # one batch in flight at a time
    feed.batcher.complete(first, {"a1": 1, "a2": 1})
    second = feed.batcher.take_batch()
    assert second is not None and (second.commit_ids, second.trigger) == (["ow"], "alone")
    feed.batcher.complete(second, {"ow": 2})
    assert feed.batcher.take_batch() is None  # a3 waits for its own limits
    third = feed.batcher.take_batch(draining=True)
    assert third is not None and third.commit_ids == ["a3"] and third.trigger == "draining"


def test_runs_of_upserts_batch_like_appends_and_apart_from_them() -> None:
    feed = Feed(BatchLimits(max_files=100, max_bytes=1 << 40, max_wait_ms=5000))
    upsert = CommitOperation.UPSERT
    feed.append("a1")
    for c in ("u1", "u2"):
        feed.files(c)
        assert feed.request(c, upsert).admission is Admission.READY
    feed.append("a2")
    for c in ("u3", "u4"):
        feed.files(c)
        feed.request(c, upsert)
    first = feed.batcher.take_batch()
    assert first is not None and (first.commit_ids, first.trigger) == (["a1"], "blocked")
    feed.batcher.complete(first, {"a1": 1})
    second = feed.batcher.take_batch()
    assert second is not None and (second.commit_ids, second.trigger) == (["u1", "u2"], "blocked")
    assert second.operation is upsert
    feed.batcher.complete(second, {"u1": 2, "u2": 2})
    third = feed.batcher.take_batch()
    assert third is not None and third.commit_ids == ["a2"]
    feed.batcher.complete(third, {"a2": 3})
    # a run of upserts at the head waits for its limits like appends do
    assert feed.batcher.take_batch() is None
    assert feed.batcher.next_deadline() == pytest.approx(feed.clock.now + 5.0)
    feed.clock.now += 5.0
    fourth = feed.batcher.take_batch()
    assert fourth is not None and (fourth.commit_ids, fourth.trigger) == (["u3", "u4"], "max-wait")


def test_an_upsert_that_selects_no_files_is_refused() -> None:
    feed = Feed()
    admitted = feed.request("u1", CommitOperation.UPSERT)
    assert admitted.admission is Admission.NO_FILES and "selects no files" in admitted.reason


def test_other_branch_and_contradicting_properties_split_batches() -> None:
    feed = Feed()
    feed.files("c1")
    feed.request("c1", snapshot_properties={"job": "x"})
    feed.files("c2")
    feed.request("c2", snapshot_properties={"job": "x", "k": "1"})
    feed.files("c3")
    feed.request("c3", snapshot_properties={"job": "y"})
    feed.files("c4")
    feed.request("c4", snapshot_properties={"job": "y"}, branch="audit")
    seen = []
    while (batch := feed.batcher.take_batch(draining=True)) is not None:
        seen.append(batch.commit_ids)
        feed.batcher.complete(batch, {})
    assert seen == [["c1", "c2"], ["c3"], ["c4"]]


def test_attempts_filtering_selects_named_attempts_and_reports_orphans() -> None:
    feed = Feed()
    kept, _ = feed.files("c1", attempt="a1", n=2)
    orphan, _ = feed.files("c1", attempt="a0", n=1)
    admitted = feed.request("c1", attempts=("a1",))
    assert admitted.admission is Admission.READY
    unit = admitted.unit
    assert [p.event.event_id for p in unit.selected] == [kept.event_id]
    assert [p.event.event_id for p in unit.excluded] == [orphan.event_id]
    assert unit.orphan_files == orphan.file_paths
    assert unit.file_count == 2
    assert feed.batcher.pending_count == 0
    # Every offset of the unit (request, kept and orphan events) is done on completion.
    assert unit.offsets == {0, 1, 2}
    batch = feed.batcher.take_batch(draining=True)
    assert batch is not None
    feed.batcher.complete(batch, {"c1": 7})
    assert feed.batcher.min_tracked is None
    assert feed.batcher.commit_status("c1") is CommitStatus.COMMITTED


def test_selection_by_event_id_and_missing_events() -> None:
    feed = Feed()
    event, _ = feed.files("c1")
    ok = feed.request("c1", attempts=(), event_ids=(event.event_id,))
    assert ok.admission is Admission.READY
    missing = feed.request("c2", attempts=(), event_ids=("nope",))
    assert missing.admission is Admission.MISSING_EVENTS
    assert "nope" in (missing.reason or "")
    nothing = feed.request("c3", attempts=("a9",))
    assert nothing.admission is Admission.NO_FILES
    # An overwrite by filter alone needs no files.
    by_filter = feed.request(
        "c4", CommitOperation.OVERWRITE, attempts=(), overwrite_filter={"type": "true"}
    )
    assert by_filter.admission is Admission.READY and by_filter.unit.file_count == 0


def test_complete_event_is_a_unit_by_itself() -> None:
    feed = Feed()
    _, admitted = feed.files("s1", n=3, complete=True)
    assert admitted.admission is Admission.READY
    unit = admitted.unit
    assert unit.streaming and unit.commit_id == "s1" and unit.file_count == 3
    assert unit.offsets == {0}
    assert len(unit.source_events()) == 1
    # Its commit id is now queued: a second complete event for it is late.
    _, again = feed.files("s1", attempt="a1", complete=True)
    assert again.admission is Admission.LATE


def test_duplicates_and_late_files() -> None:
    feed = Feed()
    event, _ = feed.files("c1")
    redelivered = feed.batcher.add_files(
        PendingFiles(event, feed.next_offset(), (), received_at=feed.clock())
    )
    assert redelivered.admission is Admission.DUPLICATE
    assert feed.request("c1").admission is Admission.READY
    assert feed.request("c1").admission is Admission.DUPLICATE
    _, late = feed.files("c1", attempt="a7")
    assert late.admission is Admission.LATE
    feed.batcher.mark_committed({"old": 3})
    assert feed.batcher.commit_status("old") is CommitStatus.COMMITTED
    assert feed.batcher.committed_snapshot("old") == 3


def test_resume_point_and_release() -> None:
    feed = Feed()
    feed.files("slow")  # offset 0 stays pending: no request yet
    feed.append("c1")  # offsets 1, 2
    batch = feed.batcher.take_batch(draining=True)
    assert batch is not None
    assert feed.batcher.safe_resume_point(position=3, batch=batch) == 0
    feed.batcher.complete(batch, {"c1": 1})
    assert feed.batcher.safe_resume_point(position=3) == 0
    assert feed.batcher.pending_events("slow")[0].offset == 0
    feed.request("slow")  # offset 3
    batch = feed.batcher.take_batch(draining=True)
    assert batch is not None
    assert feed.batcher.safe_resume_point(position=4, batch=batch) == 4
    feed.batcher.complete(batch, {"slow": 2})
    assert feed.batcher.is_idle


def test_abort_puts_the_batch_back_in_front() -> None:
    feed = Feed()
    feed.append("c1")
    feed.append("c2")
    batch = feed.batcher.take_batch(draining=True)
    assert batch is not None
    feed.append("c3")
    feed.batcher.abort(batch)
    again = feed.batcher.take_batch(draining=True)
    assert again is not None and again.commit_ids == ["c1", "c2", "c3"]
    with pytest.raises(ValidationError, match="not in flight"):
        feed.batcher.complete(batch, {})


def test_idle_table_has_no_deadline_and_abandoned_events_expire() -> None:
    feed = Feed()
    assert feed.batcher.is_idle and feed.batcher.next_deadline() is None
    feed.files("never-requested")
    assert not feed.batcher.has_work
    assert feed.batcher.next_deadline() is None
    assert feed.batcher.expire(60.0) == []
    feed.clock.now += 61
    expired = feed.batcher.expire(60.0)
    assert [p.event.commit_id for p in expired] == ["never-requested"]
    assert feed.batcher.pending_count == 0
    feed.batcher.release(expired[0].offset)
    assert feed.batcher.is_idle


def test_limits_from_table_properties() -> None:
    base = BatchLimits(100, 1000, 50)
    limits = base.with_table_properties(
        {BATCH_MAX_FILES: "7", BATCH_MAX_BYTES: " 2048 ", BATCH_MAX_WAIT_MS: "0"}
    )
    assert limits == BatchLimits(7, 2048, 0)
    assert base.with_table_properties({}) == base
    with pytest.raises(ValidationError, match=BATCH_MAX_FILES.replace(".", r"\.")):
        base.with_table_properties({BATCH_MAX_FILES: "lots"})
    with pytest.raises(ValidationError, match="must be >= 1"):
        base.with_table_properties({BATCH_MAX_BYTES: "0"})
    with pytest.raises(ValidationError, match="max_files"):
        BatchLimits(max_files=0)


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 50)), max_size=200))
def test_offset_set_minimum_matches_a_plain_set(ops: list[tuple[bool, int]]) -> None:
    offsets = OffsetSet()
    model: set[int] = set()
    for add, value in ops:
        if add:
            offsets.add(value)
            model.add(value)
        else:
            offsets.discard(value)
            model.discard(value)
        assert offsets.min() == (min(model) if model else None)
        assert len(offsets) == len(model)
    assert list(offsets) == sorted(model)
    excluded = {v for v in model if v % 2}
    assert offsets.min_excluding(excluded) == min(model - excluded, default=None)


_OPS = st.sampled_from(["append", "overwrite", "stream", "orphan"])


@settings(max_examples=examples(60), deadline=None)
@given(
    st.lists(st.tuples(_OPS, st.integers(1, 4)), min_size=1, max_size=25),
    st.integers(1, 6),
)
def test_every_unit_commits_once_in_arrival_order(
    plan: list[tuple[str, int]], max_files: int
) -> None:
    """Law: whatever arrives, batches hold each ready unit exactly once, in order; only
    appends share a batch; and when all is committed only never-requested files remain."""
    feed = Feed(BatchLimits(max_files=max_files, max_bytes=1 << 40, max_wait_ms=10))
    expected: list[str] = []
    orphans = 0
    for i, (op, n) in enumerate(plan):
        cid = f"c{i}"
        if op == "append":
            feed.append(cid, n=n)
        elif op == "overwrite":
            feed.files(cid, n=n)
            feed.request(cid, CommitOperation.OVERWRITE)
        elif op == "stream":
            feed.files(cid, n=n, complete=True)
        else:
            feed.files(cid, n=n)  # never requested
            orphans += 1
            continue
        expected.append(cid)
        if i % 3 == 0:
            feed.clock.now += 1  # let some batches become due by age
            while (batch := feed.batcher.take_batch()) is not None:
                _check_batch(batch, max_files)
                expected_prefix = expected[: len(batch.commit_ids)]
                assert batch.commit_ids == expected_prefix
                expected = expected[len(batch.commit_ids) :]
                feed.batcher.complete(batch, dict.fromkeys(batch.commit_ids, 1))
    while (batch := feed.batcher.take_batch(draining=True)) is not None:
        _check_batch(batch, max_files)
        assert batch.commit_ids == expected[: len(batch.commit_ids)]
        expected = expected[len(batch.commit_ids) :]
        feed.batcher.complete(batch, dict.fromkeys(batch.commit_ids, 1))
    assert expected == []
    assert feed.batcher.pending_count == orphans
    assert feed.batcher.tracked_count == orphans
    resume = feed.batcher.safe_resume_point(feed.offset)
    assert all(resume <= p.offset for p in feed.batcher.pending_events())


def _check_batch(batch: Any, max_files: int) -> None:
    if len(batch.units) > 1:
        assert batch.is_append
        # Only the last unit may cross the file limit.
        assert sum(u.file_count for u in batch.units[:-1]) < max_files


def test_a_redelivery_is_the_same_event_and_a_reused_event_id_is_not() -> None:
    feed = Feed()
    event, admitted = feed.files("c1")
    assert admitted.admission is Admission.PENDING
    assert feed.batcher.knows_event(event.event_id) and feed.batcher.same_event(event)
    other = feed.files("c1", attempt="a9")[0]
    impostor = other.model_copy(update={"event_id": event.event_id})
    assert not feed.batcher.same_event(impostor)
    # Still told apart once the event was taken into a unit.
    assert feed.request("c1").admission is Admission.READY
    assert feed.batcher.same_event(event) and not feed.batcher.same_event(impostor)
