"""The change fold (:mod:`icefloe.spark.changes`) against a naive oracle, without Spark.

The law: :func:`normalize` then :func:`fold` equals a dict fold of the change stream, key
by key, keeping the change with the greatest (ordering value, arrival position), nulls
ordering first; a delete or tombstone leaves the key deleted, anything else leaves its row.
The streams mix inserts, snapshot reads, updates, deletes, tombstones, re-inserts of a
deleted key, duplicates and out-of-order changes, over composite keys, and arrive flat
(an operation column) or as Debezium envelopes, in one piece or split across calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from hypothesis_budget import examples
from icefloe.errors import ValidationError
from icefloe.spark.changes import (
    ARRIVAL_COLUMN,
    ChangeSpec,
    column_at,
    fold,
    nest_keys,
    normalize,
)

ROW = pa.struct([("k1", pa.int32()), ("k2", pa.string()), ("v", pa.int64())])


@dataclass(frozen=True)
class Change:
    k1: int
    k2: str
    op: str | None  # c, r, u, d; None = tombstone
    order: int | None
    v: int

    @property
    def key(self) -> tuple[int, str]:
        return (self.k1, self.k2)


changes = hs.builds(
    Change,
    k1=hs.integers(0, 3),
    k2=hs.sampled_from(["a", "b"]),
    op=hs.sampled_from(["c", "r", "u", "d", None]),
    order=hs.one_of(hs.none(), hs.integers(0, 5)),
    v=hs.integers(-1000, 1000),
)


def oracle(stream: list[Change]) -> tuple[set[tuple[int, str, int]], set[tuple[int, str]]]:
    """(rows left, keys touched) by the naive last-write-wins fold."""
    last: dict[tuple[int, str], tuple[tuple[int, int, int], Change]] = {}
    for arrival, change in enumerate(stream):
        rank = (0 if change.order is None else 1, change.order or 0, arrival)
        held = last.get(change.key)
        if held is None or rank > held[0]:
            last[change.key] = (rank, change)
    rows = {(c.k1, c.k2, c.v) for _, c in last.values() if c.op is not None and c.op != "d"}
    return rows, set(last)


SPEC = ChangeSpec(
    keys=("k1", "k2"), op_column="op", order_by=("lsn",), data_columns=("k1", "k2", "v")
)
DEBEZIUM = ChangeSpec(
    keys=("k1", "k2"), envelope="debezium", order_by=("source.lsn",), data_columns=("k1", "k2", "v")
)


def flat(stream: list[Change]) -> pa.Table:
    return pa.table(
        {
            "k1": pa.array([c.k1 for c in stream], pa.int32()),
            "k2": pa.array([c.k2 for c in stream], pa.string()),
            "v": pa.array([c.v for c in stream], pa.int64()),
            "op": pa.array([c.op for c in stream], pa.string()),
            "lsn": pa.array([c.order for c in stream], pa.int64()),
        }
    )


def envelope(stream: list[Change]) -> pa.Table:
    """Debezium's shape: an update's ``before`` is the key's row, a delete has only
    ``before``, a tombstone here is a delete event without ``op`` but with its key in
    neither image, so it is given as ``op='d'`` (a keyless tombstone is skipped)."""
    before, after, ops = [], [], []
    for c in stream:
        row = {"k1": c.k1, "k2": c.k2, "v": c.v}
        op = c.op or "d"
        ops.append(op)
        before.append(None if op in ("c", "r") else row)
        after.append(None if op == "d" else row)
    return pa.table(
        {
            "before": pa.array(before, ROW),
            "after": pa.array(after, ROW),
            "op": pa.array(ops, pa.string()),
            "source": pa.array(
                [{"lsn": c.order, "db": "inventory"} for c in stream],
                pa.struct([("lsn", pa.int64()), ("db", pa.string())]),
            ),
            "ts_ms": pa.array([1_700_000_000_000] * len(stream), pa.int64()),
        }
    )


def folded(table: pa.Table, spec: ChangeSpec, splits: list[int] = ()) -> Any:  # type: ignore[assignment]
    parts, start = [], 0
    for end in [*sorted(s for s in splits if 0 < s < table.num_rows), table.num_rows]:
        parts.append(normalize(table.slice(start, end - start), spec, arrival_start=start))
        start = end
    result = fold(pa.concat_tables(parts) if parts else normalize(table, spec), spec)
    rows = {(r["k1"], r["k2"], r["v"]) for r in result.rows.to_pylist()}
    keys = {(r["__icefloe_key_0"], r["__icefloe_key_1"]) for r in result.keys.to_pylist()}
    assert result.keys.num_rows == len(keys), "every key once in the key file"
    return rows, keys


@settings(max_examples=examples(200))
@given(stream=hs.lists(changes, max_size=40), splits=hs.lists(hs.integers(0, 40), max_size=3))
def test_the_fold_is_the_last_change_per_key(stream: list[Change], splits: list[int]) -> None:
    assert folded(flat(stream), SPEC, splits) == oracle(stream)


@settings(max_examples=examples(100))
@given(stream=hs.lists(changes, max_size=40))
def test_debezium_envelopes_fold_like_the_flat_stream(stream: list[Change]) -> None:
    as_deletes = [Change(c.k1, c.k2, c.op or "d", c.order, c.v) for c in stream]
    assert folded(envelope(stream), DEBEZIUM) == oracle(as_deletes)


@settings(max_examples=examples(100))
@given(stream=hs.lists(changes, max_size=30), data=hs.data())
def test_the_fold_does_not_depend_on_how_rows_are_shuffled_when_orders_differ(
    stream: list[Change], data: hs.DataObject
) -> None:
    """With distinct ordering values the arrival order does not matter: a shuffle (what
    Spark's exchange may do across input partitions) folds to the same rows."""
    distinct = [Change(c.k1, c.k2, c.op, i, c.v) for i, c in enumerate(stream)]
    shuffled = data.draw(hs.permutations(distinct))
    assert folded(flat(shuffled), SPEC) == folded(flat(distinct), SPEC) == oracle(distinct)


def test_a_key_deleted_and_inserted_again_ends_inserted() -> None:
    stream = [
        Change(1, "a", "c", 1, 10),
        Change(1, "a", "d", 2, 10),
        Change(1, "a", "c", 3, 30),
        Change(2, "a", "c", 5, 50),
        Change(2, "a", "d", 4, 0),  # late, but older: loses
    ]
    assert folded(flat(stream), SPEC) == ({(1, "a", 30), (2, "a", 50)}, {(1, "a"), (2, "a")})


def test_ties_go_to_the_later_arrival_and_nulls_order_first() -> None:
    stream = [
        Change(1, "a", "u", 7, 1),
        Change(1, "a", "u", 7, 2),
        Change(2, "a", "u", 1, 3),
        Change(2, "a", "u", None, 4),
    ]
    assert folded(flat(stream), SPEC)[0] == {(1, "a", 2), (2, "a", 3)}


def test_a_tombstone_deletes_its_key_and_a_keyless_one_is_skipped() -> None:
    table = pa.table(
        {
            "k1": pa.array([1, 2, None], pa.int32()),
            "k2": pa.array(["a", "a", None], pa.string()),
            "v": pa.array([1, 2, None], pa.int64()),
            "op": pa.array(["c", None, None], pa.string()),
            "lsn": pa.array([1, 2, 3], pa.int64()),
        }
    )
    assert folded(table, SPEC) == ({(1, "a", 1)}, {(1, "a"), (2, "a")})


def test_debezium_tombstones_are_skipped_and_an_update_that_moves_a_key_deletes_the_old() -> None:
    rows = [
        ({"k1": 1, "k2": "a", "v": 1}, {"k1": 9, "k2": "a", "v": 2}, "u", 1),
        (None, None, None, None),  # a tombstone: the Kafka value was null
        (None, {"k1": 1, "k2": "a", "v": 5}, "c", 0),  # older than the move: loses
    ]
    table = pa.table(
        {
            "before": pa.array([r[0] for r in rows], ROW),
            "after": pa.array([r[1] for r in rows], ROW),
            "op": pa.array([r[2] for r in rows], pa.string()),
            "source": pa.array(
                [None if r[3] is None else {"lsn": r[3]} for r in rows],
                pa.struct([("lsn", pa.int64())]),
            ),
        }
    )
    assert folded(table, DEBEZIUM) == ({(9, "a", 2)}, {(1, "a"), (9, "a")})


def test_plain_rows_upsert_or_delete_and_duplicates_are_refused_naming_the_key() -> None:
    table = pa.table({"id": pa.array([1, 2, 1], pa.int64()), "v": ["x", "y", "z"]})
    unique = ChangeSpec(keys=("id",), data_columns=("id", "v"), unique=True)
    with pytest.raises(ValidationError, match=r"key \(id=1\) appears 2 times.*order_by"):
        fold(normalize(table, unique), unique)
    last = ChangeSpec(keys=("id",), data_columns=("id", "v"))
    assert sorted(fold(normalize(table, last), last).rows.to_pylist(), key=str) == [
        {"id": 1, "v": "z"},
        {"id": 2, "v": "y"},
    ]
    deletes = ChangeSpec(keys=("id",), mode="delete")
    result = fold(normalize(table, deletes), deletes)
    assert result.rows.num_rows == 0 and result.deleted == 2
    assert sorted(result.keys.column("__icefloe_key_0").to_pylist()) == [1, 2]


@pytest.mark.parametrize(
    ("table", "spec", "message"),
    [
        (
            pa.table({"id": [1, 2], "op": ["c", "t"]}),
            ChangeSpec(keys=("id",), op_column="op", data_columns=("id",)),
            r"operation column 'op' holds 't'.*c, r, u.*d",
        ),
        (
            pa.table({"id": [1, 2, 3], "op": ["x", "c", "yy"]}),
            ChangeSpec(keys=("id",), op_column="op", data_columns=("id",)),
            r"holds 'x' \(and 1 other unknown value",
        ),
        (
            pa.table({"id": pa.array([1, None], pa.int64()), "op": ["c", "u"]}),
            ChangeSpec(keys=("id",), op_column="op", data_columns=("id",)),
            r"key column 'id' is null in 1 change",
        ),
        (
            pa.table({"id": pa.array([None], pa.int64())}),
            ChangeSpec(keys=("id",), data_columns=("id",)),
            r"key column 'id' is null in 1 row",
        ),
        (
            pa.table({"after": pa.array([{"k1": 1}], pa.struct([("k1", pa.int32())]))}),
            ChangeSpec(keys=("k1",), envelope="debezium", data_columns=("k1",)),
            r"lacks \['before', 'op'\]",
        ),
        (
            pa.table({"id": [1]}),
            ChangeSpec(keys=("nope",), data_columns=("id",)),
            r"key column 'nope' is not a column",
        ),
    ],
)
def test_bad_changes_are_refused_by_name(table: pa.Table, spec: ChangeSpec, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        fold(normalize(table, spec), spec)


def test_specs_that_cannot_describe_a_change_are_refused() -> None:
    with pytest.raises(ValidationError, match="at least one key"):
        ChangeSpec(keys=())
    with pytest.raises(ValidationError, match="envelope"):
        ChangeSpec(keys=("id",), envelope="maxwell")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="carries its own 'op'"):
        ChangeSpec(keys=("id",), envelope="debezium", op_column="op")
    with pytest.raises(ValidationError, match="mode='delete'"):
        ChangeSpec(keys=("id",), mode="delete", op_column="op")


def test_nested_keys_are_read_by_path_and_nested_again_for_the_key_file() -> None:
    inner = pa.struct([("x", pa.int64()), ("y", pa.string())])
    table = pa.table({"a": pa.array([{"x": 1, "y": "p"}, {"x": 1, "y": "q"}], inner), "b": [3, 4]})
    spec = ChangeSpec(keys=("a.x", "b"), data_columns=("a", "b"))
    assert column_at(table, "a.x", "key column").to_pylist() == [1, 1]
    result = fold(normalize(table, spec), spec)
    shaped = nest_keys(result.keys, spec.keys)
    assert shaped.schema.names == ["a", "b"]
    assert shaped.schema.field("a").type == pa.struct([("x", pa.int64())])
    assert sorted(shaped.to_pylist(), key=str) == [{"a": {"x": 1}, "b": 3}, {"a": {"x": 1}, "b": 4}]


def test_arrival_positions_continue_across_calls() -> None:
    table = pa.table({"id": pa.array([5, 6], pa.int64())})
    spec = ChangeSpec(keys=("id",), data_columns=("id",))
    assert normalize(table, spec, arrival_start=1 << 40).column(ARRIVAL_COLUMN).to_pylist() == [
        1 << 40,
        (1 << 40) + 1,
    ]
