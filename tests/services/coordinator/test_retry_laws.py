"""The coordinator's retries, moved onto icefloe.retry, wait exactly as long as before."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples
from icefloe.catalog.fs import FileSystemCatalog
from icefloe.coordinator import config
from icefloe.coordinator.committer import TableCommitter
from icefloe.io.fileio import LocalFileIO
from icefloe.table.commit import RetryPolicy


@given(failures=st.integers(1, 200))
def test_service_backoff_doubles_from_a_fifth_of_a_second_to_ten(failures: int) -> None:
    before = min(10.0, 0.1 * (2 ** min(failures, 10)))  # the hand-written law it replaced
    assert config.BACKOFF.delay(failures) == before


@settings(max_examples=examples(200))
@given(
    min_wait=st.integers(0, 100_000),
    max_wait=st.integers(0, 200_000),
    failures=st.integers(1, 100),
)
def test_committer_backoff_is_the_table_policy_capped_at_thirty_seconds(
    min_wait: int, max_wait: int, failures: int
) -> None:
    policy = RetryPolicy(min_wait_ms=min_wait, max_wait_ms=max_wait)
    committer = TableCommitter(
        FileSystemCatalog("c", str(Path("/nonexistent")), LocalFileIO()),
        "db.t",
        "events-0",
        retry_policy=policy,
    )
    backoff = committer._transient_retry().backoff
    # The hand-written law it replaced: full jitter on [min, min(max, min * 2**min(n, 8))]
    # (never below min), then at most 30s.
    ceiling_ms = max(min_wait, min(max_wait, min_wait * 2 ** min(failures, 8)))
    assert backoff.base_s == min(min_wait / 1000.0, 30.0)
    assert backoff.ceiling(failures) == pytest.approx(min(ceiling_ms / 1000.0, 30.0))
    assert backoff.base_s <= backoff.delay(failures) <= backoff.ceiling(failures)
