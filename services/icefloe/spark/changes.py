"""Change rows folded to the last change per key: the writer side of upserts, in Arrow.

An upsert or delete by key (``spark.write(..., mode="upsert" | "delete")``, a change
stream through ``foreach_batch_sink(..., mode="upsert")``) reaches the table as one
``upsert`` commit (:mod:`icefloe.events`): data files holding the new row of every key that
survives the batch, and key files naming every key the batch touched, whose old rows the
coordinator removes. Between the DataFrame and those files, two pure steps run here, with no
Spark import, so the rules are tested on their own:

:func:`normalize` (a narrow map, before any shuffle)
    turns one task's rows into *change rows* of one shape: the table's data columns, then
    the key (``__icefloe_key_<i>``, one flat column per identifier field), the operation
    (``__icefloe_op``: 0 upsert, 1 delete), the ordering values (``__icefloe_order_<i>``)
    and the arrival position (``__icefloe_arrival``). Rows come as

    * plain rows (``op_column`` None): each row upserts (or, in delete mode, deletes) its key;
    * flat change rows: ``op_column`` holds a Debezium operation, ``c`` (create), ``r``
      (snapshot read) and ``u`` (update) upsert, ``d`` deletes, and a null operation is a
      tombstone, which deletes its key (a tombstone without a key is skipped);
    * Debezium envelopes (``envelope="debezium"``): ``before``, ``after``, ``op``,
      ``source``, ``ts_ms``. The row is ``after``'s fields; the key is taken from ``after``,
      or from ``before`` for a delete; an envelope whose ``op``, ``before`` and ``after`` are
      all null (a tombstone whose value was null) carries no key and is skipped. An update
      that changes the key also deletes the old key (``before``'s), just before it.

    Any other operation value (Debezium's ``t`` truncate or ``m`` message) is refused with
    a :class:`~icefloe.errors.ValidationError` naming it, and so is a change without a key:
    nothing is dropped silently.

:func:`fold` (per task, once rows are partitioned by key)
    keeps, for each key, the change with the greatest ordering values (compared column by
    column; a null orders first), ties broken by the greatest arrival position: the last
    change wins, out-of-order changes lose to later ones, and a key deleted and inserted
    again ends inserted. The result is the rows of the keys whose last change is an upsert,
    and every key touched, upserted or deleted (the key file). When the caller asks for
    unique keys (a batch upsert with no ordering column), a key given twice is an error
    naming it.

The arrival position of a row is ``arrival_start`` plus its index in what one
:func:`normalize` call saw; the Spark writer starts each task at ``partition id << 40``, so
positions are distinct, deterministic for a given input, and follow the input's order
within a partition (Kafka's offset order for a Kafka source).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from icefloe.errors import ValidationError

KEY_PREFIX = "__icefloe_key_"
ORDER_PREFIX = "__icefloe_order_"
OP_COLUMN = "__icefloe_op"
ARRIVAL_COLUMN = "__icefloe_arrival"

OP_UPSERT = 0
OP_DELETE = 1

UPSERT_OPS = ("c", "r", "u")
DELETE_OPS = ("d",)
DEBEZIUM_FIELDS = ("before", "after", "op")

Envelope = Literal["debezium"]
ChangeMode = Literal["upsert", "delete"]


@dataclass(frozen=True)
class ChangeSpec:
    """How the rows of one write describe changes to a keyed table.

    ``keys`` are the identifier fields' column paths (dotted for nested fields), in the
    table's identifier order; ``order_by`` the ordering columns' paths (in the row, or in
    the envelope for Debezium: ``source.lsn``, ``ts_ms``); ``data_columns`` the top-level
    columns written to the table (of the row, or of ``after``); ``unique`` asks
    :func:`fold` to refuse a key given twice.
    """

    keys: tuple[str, ...]
    mode: ChangeMode = "upsert"
    op_column: str | None = None
    order_by: tuple[str, ...] = ()
    envelope: Envelope | None = None
    data_columns: tuple[str, ...] = ()
    unique: bool = False

    def __post_init__(self) -> None:
        if not self.keys:
            raise ValidationError("a change needs at least one key column")
        if self.mode not in ("upsert", "delete"):
            raise ValidationError(f"unknown change mode {self.mode!r}; use 'upsert' or 'delete'")
        if self.envelope not in (None, "debezium"):
            raise ValidationError(
                f"unknown envelope {self.envelope!r}; the one known is 'debezium'"
            )
        if self.envelope is not None and self.op_column is not None:
            raise ValidationError("a Debezium envelope carries its own 'op'; give no op_column")
        if self.mode == "delete" and (self.op_column is not None or self.envelope is not None):
            raise ValidationError(
                "mode='delete' deletes every key given; a change stream (op_column or envelope) "
                "is written with mode='upsert'"
            )

    @property
    def key_columns(self) -> list[str]:
        return [f"{KEY_PREFIX}{i}" for i in range(len(self.keys))]

    @property
    def order_columns(self) -> list[str]:
        return [f"{ORDER_PREFIX}{i}" for i in range(len(self.order_by))]


@dataclass(frozen=True)
class Folded:
    """One task's fold: the rows to write (data columns) and every key touched."""

    rows: pa.Table
    keys: pa.Table
    """Flat key columns (``__icefloe_key_<i>``), one row per distinct key."""

    @property
    def deleted(self) -> int:
        return self.keys.num_rows - self.rows.num_rows


# ---------------------------------------------------------------------------------------
# Paths into rows
# ---------------------------------------------------------------------------------------


def _child(arr: pa.Array, name: str, where: str) -> pa.Array:
    """A struct's child, null where the struct is null."""
    if not pa.types.is_struct(arr.type):
        raise ValidationError(f"{where} is not a struct, so it has no field {name!r}")
    index = arr.type.get_field_index(name)
    if index < 0:
        raise ValidationError(f"{where} has no field {name!r}")
    return arr.flatten()[index] if arr.null_count else arr.field(index)


def column_at(table: pa.Table, path: str, what: str) -> pa.Array:
    """The values at ``path`` (dotted through structs) of ``table``; a null struct on the
    way makes them null. A column whose own name has dots is found by that name first."""
    if path in table.column_names:
        return table.column(path).combine_chunks()
    head, *rest = path.split(".")
    if head not in table.column_names:
        raise ValidationError(f"{what} {path!r} is not a column (columns: {table.column_names})")
    arr = table.column(head).combine_chunks()
    where = head
    for name in rest:
        arr = _child(arr, name, f"{what} {path!r}: {where}")
        where = f"{where}.{name}"
    return arr


def _struct_table(arr: pa.Array, names: Sequence[str]) -> pa.Table:
    """The fields ``names`` of a struct array as table columns (null rows stay null)."""
    children = (
        arr.flatten() if arr.null_count else [arr.field(i) for i in range(arr.type.num_fields)]
    )
    by_name = {arr.type.field(i).name: children[i] for i in range(arr.type.num_fields)}
    return pa.table({name: by_name[name] for name in names})


def nest_keys(keys: pa.Table, paths: Sequence[str]) -> pa.Table:
    """Flat key columns as a table shaped by the key paths: top-level columns by name,
    nested ones as structs holding only the key fields (a key file's shape)."""
    tree: dict[str, Any] = {}
    for i, path in enumerate(paths):
        node = tree
        *parents, leaf = path.split(".") if path not in keys.column_names else [path]
        for name in parents:
            node = node.setdefault(name, {})
        node[leaf] = keys.column(f"{KEY_PREFIX}{i}").combine_chunks()

    def build(node: dict[str, Any]) -> dict[str, pa.Array]:
        out: dict[str, pa.Array] = {}
        for name, value in node.items():
            if isinstance(value, dict):
                children = build(value)
                out[name] = pa.StructArray.from_arrays(
                    list(children.values()), names=list(children)
                )
            else:
                out[name] = value
        return out

    if keys.num_rows == 0 and not keys.column_names:
        return pa.table({})
    return pa.table(build(tree))


# ---------------------------------------------------------------------------------------
# normalize: input rows -> change rows
# ---------------------------------------------------------------------------------------


def _ops(values: pa.Array, op_column: str) -> pa.Array:
    """Operation codes (0 upsert, 1 delete) from Debezium's letters; a null (a tombstone)
    reads as an upsert here, for the caller to decide."""
    text = values.cast(pa.string()) if not pa.types.is_string(values.type) else values
    upsert = pc.is_in(text, value_set=pa.array(UPSERT_OPS))
    delete = pc.is_in(text, value_set=pa.array(DELETE_OPS))
    unknown = pc.and_(pc.is_valid(text), pc.invert(pc.or_(upsert, delete)))
    if pc.any(unknown).as_py():
        bad = sorted({v for v in text.filter(unknown).to_pylist()})
        raise ValidationError(
            f"operation column {op_column!r} holds {bad[0]!r}"
            + (f" (and {len(bad) - 1} other unknown value(s))" if len(bad) > 1 else "")
            + f": known operations are {', '.join(UPSERT_OPS)} (upsert) and "
            f"{', '.join(DELETE_OPS)} (delete), null for a tombstone"
        )
    return pc.if_else(delete, pa.scalar(OP_DELETE, pa.int8()), pa.scalar(OP_UPSERT, pa.int8()))


def _assemble(
    data: pa.Table,
    keys: Sequence[pa.Array],
    ops: pa.Array,
    order: Sequence[pa.Array],
    arrival: pa.Array,
    spec: ChangeSpec,
) -> pa.Table:
    columns: dict[str, pa.Array] = {
        name: data.column(name).combine_chunks() for name in data.column_names
    }
    for name, arr in zip(spec.key_columns, keys):
        columns[name] = arr
    columns[OP_COLUMN] = ops.cast(pa.int8())
    for name, arr in zip(spec.order_columns, order):
        columns[name] = arr
    columns[ARRIVAL_COLUMN] = arrival
    return pa.table(columns)


def _positions(start: int, n: int) -> pa.Array:
    return pa.array(np.arange(start, start + n, dtype=np.int64))


def _check_keys(keys: Sequence[pa.Array], spec: ChangeSpec, what: str) -> None:
    for path, arr in zip(spec.keys, keys):
        if arr.null_count:
            raise ValidationError(
                f"key column {path!r} is null in {arr.null_count} {what}: every change needs "
                "its key"
            )


def normalize(table: pa.Table, spec: ChangeSpec, arrival_start: int = 0) -> pa.Table:
    """One task's input rows as change rows (see the module docstring)."""
    arrival = _positions(arrival_start, table.num_rows)
    if spec.envelope == "debezium":
        return _normalize_debezium(table, spec, arrival)
    keys = [column_at(table, path, "key column") for path in spec.keys]
    order = [column_at(table, path, "ordering column") for path in spec.order_by]
    data = table.select(list(spec.data_columns)) if spec.mode == "upsert" else pa.table({})
    if spec.op_column is None:
        code = OP_DELETE if spec.mode == "delete" else OP_UPSERT
        ops = pa.repeat(pa.scalar(code, pa.int8()), table.num_rows)
        _check_keys(keys, spec, "row(s)")
        return _assemble(data, keys, ops, order, arrival, spec)
    raw = column_at(table, spec.op_column, "operation column")
    ops = _ops(raw, spec.op_column)
    tombstone = pc.is_null(raw)
    keyless = pc.and_(tombstone, _all_null(keys))
    ops = pc.if_else(tombstone, pa.scalar(OP_DELETE, pa.int8()), ops)
    rows = _assemble(data, keys, ops, order, arrival, spec)
    if pc.any(keyless).as_py():
        rows = rows.filter(pc.invert(keyless))
    _check_keys([rows.column(c).combine_chunks() for c in spec.key_columns], spec, "change(s)")
    return rows


def _all_null(arrays: Sequence[pa.Array]) -> pa.Array:
    result = pc.is_null(arrays[0])
    for arr in arrays[1:]:
        result = pc.and_(result, pc.is_null(arr))
    return result


def _normalize_debezium(table: pa.Table, spec: ChangeSpec, arrival: pa.Array) -> pa.Table:
    missing = [name for name in DEBEZIUM_FIELDS if name not in table.column_names]
    if missing:
        raise ValidationError(
            f"a Debezium envelope has columns before, after and op; this one lacks {missing}"
        )
    before = table.column("before").combine_chunks()
    after = table.column("after").combine_chunks()
    raw = table.column("op").combine_chunks()
    tombstone = pc.and_(pc.and_(pc.is_null(raw), pc.is_null(before)), pc.is_null(after))
    if pc.any(tombstone).as_py():
        keep = pc.invert(tombstone)
        table, arrival = table.filter(keep), arrival.filter(keep)
        before, after, raw = before.filter(keep), after.filter(keep), raw.filter(keep)
    if pc.any(pc.is_null(raw)).as_py():
        raise ValidationError(
            "a Debezium envelope has a null 'op' but a 'before' or 'after' value: it is "
            "neither a change nor a tombstone"
        )
    ops = _ops(raw, "op")
    is_delete = pc.equal(ops, pa.scalar(OP_DELETE, pa.int8()))
    after_keys = [_nested(after, path, "after") for path in spec.keys]
    before_keys = [_nested(before, path, "before") for path in spec.keys]
    keys = [pc.if_else(is_delete, b, a) for a, b in zip(after_keys, before_keys)]
    order = [column_at(table, path, "ordering column") for path in spec.order_by]
    if pa.types.is_null(after.type) or not pa.types.is_struct(after.type):
        raise ValidationError("the Debezium envelope's 'after' is not a struct of the row")
    data = _struct_table(after, spec.data_columns)
    # a change's position is 2 * arrival + 1; the delete of a key an update moved away
    # from is 2 * arrival, just before it
    doubled = pc.add(pc.multiply(arrival, 2), 1)
    rows = _assemble(data, keys, ops, order, doubled, spec)
    moved = pc.and_(
        pc.and_(pc.invert(is_delete), pc.is_valid(before)),
        _any_differs(before_keys, after_keys),
    )
    if pc.any(moved).as_py():
        old = _assemble(
            data.filter(moved),
            [k.filter(moved) for k in before_keys],
            pa.repeat(pa.scalar(OP_DELETE, pa.int8()), pc.sum(moved).as_py()),
            [o.filter(moved) for o in order],
            pc.multiply(arrival.filter(moved), 2),
            spec,
        )
        rows = pa.concat_tables([rows, old])
    _check_keys([rows.column(c).combine_chunks() for c in spec.key_columns], spec, "change(s)")
    return rows


def _nested(struct: pa.Array, path: str, name: str) -> pa.Array:
    arr = struct
    where = name
    for part in path.split("."):
        arr = _child(arr, part, f"key column {path!r}: envelope field {where!r}")
        where = f"{where}.{part}"
    return arr


def _any_differs(left: Sequence[pa.Array], right: Sequence[pa.Array]) -> pa.Array:
    result: pa.Array | None = None
    for a, b in zip(left, right):
        differs = pc.fill_null(pc.not_equal(a, b), False)
        result = differs if result is None else pc.or_(result, differs)
    assert result is not None
    return result


# ---------------------------------------------------------------------------------------
# fold: change rows -> last change per key
# ---------------------------------------------------------------------------------------


def _describe_key(keys: pa.Table, index: int, spec: ChangeSpec) -> str:
    values = [keys.column(c)[index].as_py() for c in spec.key_columns]
    return ", ".join(f"{path}={value!r}" for path, value in zip(spec.keys, values))


def fold(changes: pa.Table, spec: ChangeSpec) -> Folded:
    """The last change of every key in ``changes`` (normalized rows, see :func:`normalize`)."""
    data_names = [n for n in changes.column_names if not n.startswith("__icefloe_")]
    if changes.num_rows == 0:
        empty = changes.slice(0, 0)
        return Folded(rows=empty.select(data_names), keys=empty.select(spec.key_columns))
    sort_keys = [(name, "ascending", "at_start") for name in spec.order_columns]
    sort_keys.append((ARRIVAL_COLUMN, "ascending", "at_start"))
    order = pc.sort_indices(changes, sort_keys=sort_keys)
    ordered = changes.take(order)
    indexed = ordered.select(spec.key_columns).append_column(
        "__icefloe_index", pa.array(np.arange(ordered.num_rows, dtype=np.int64))
    )
    grouped = indexed.group_by(spec.key_columns, use_threads=False).aggregate(
        [("__icefloe_index", "max"), ("__icefloe_index", "count")]
    )
    if spec.unique:
        counts = grouped.column("__icefloe_index_count")
        twice = pc.greater(counts, 1)
        if pc.any(twice).as_py():
            first = pc.index(twice, True).as_py()
            raise ValidationError(
                f"key ({_describe_key(grouped, first, spec)}) appears "
                f"{counts[first].as_py()} times among the rows to upsert; give order_by= "
                "(an ordering column, the last row wins) or remove the duplicates"
            )
    winners = ordered.take(grouped.column("__icefloe_index_max"))
    upserted = pc.equal(winners.column(OP_COLUMN), pa.scalar(OP_UPSERT, pa.int8()))
    rows = winners.filter(upserted).select(data_names)
    return Folded(rows=rows, keys=winners.select(spec.key_columns))


__all__ = [
    "ARRIVAL_COLUMN",
    "KEY_PREFIX",
    "OP_COLUMN",
    "OP_DELETE",
    "OP_UPSERT",
    "ORDER_PREFIX",
    "ChangeSpec",
    "Folded",
    "column_at",
    "fold",
    "nest_keys",
    "normalize",
]
