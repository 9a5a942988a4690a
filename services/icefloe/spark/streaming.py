"""Structured Streaming into icefloe: a ``foreachBatch`` sink that commits each micro-batch
exactly once.

Why a module: a stream adds one rule to a write, the commit id of a micro-batch
(``<query id or sink id>:<batch id>``, stable across restarts from a checkpoint), and the
skip of a batch the table already records (:func:`icefloe.spark.staging.committed_in`);
everything else is :func:`icefloe.spark.writer.write`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Literal

from pyspark.sql import DataFrame

from icefloe.errors import ValidationError
from icefloe.spark.changes import Envelope
from icefloe.spark.channel import BACKGROUND, ConfigArg, resolve_settings
from icefloe.spark.staging import committed_in
from icefloe.spark.writer import KEYED_MODES, OrderArg, write
from icefloe.table.catalog import TableIdentifier

log = logging.getLogger("icefloe.spark")

STREAMING_QUERY_ID_PROPERTY = "sql.streaming.queryId"
"""The local property Spark sets to the streaming query's id while a batch runs."""
BATCH_ID_PROPERTY = "spark.streaming.batch-id"
QUERY_ID_PROPERTY = "spark.streaming.query-id"


def foreach_batch_sink(
    table: str | TableIdentifier,
    *,
    sink_id: str | None = None,
    mode: Literal["append", "overwrite", "upsert", "delete"] = "append",
    branch: str | None = None,
    merge_schema: bool = False,
    snapshot_properties: Mapping[str, str] | None = None,
    config: ConfigArg = None,
    timeout_s: float | None = None,
    op_column: str | None = None,
    order_column: OrderArg = None,
    envelope: Envelope | None = None,
) -> Callable[[DataFrame, int], None]:
    """A ``foreachBatch`` function that commits each micro-batch to ``table`` exactly once.

    The commit id is ``<sink_id>:<batch id>``; ``sink_id`` defaults to the streaming query's
    id, which survives restarts from the same checkpoint. Give one explicitly when several
    queries (or a new checkpoint) must share one sequence of batch ids. ``mode='overwrite'``
    replaces the table's rows with each batch (for the complete output mode).

    ``mode='upsert'`` applies each micro-batch to a keyed table as a change stream: with
    ``op_column`` (Debezium's operations) or ``envelope='debezium'``, the last change of
    each key within the batch wins by ``order_column`` (a source position such as the LSN,
    or ``ts_ms``; then arrival order), a delete or tombstone removes the key, and a key may
    be deleted and inserted again. Without ``op_column`` every row is an upsert (several
    rows of one key are folded by ``order_column``, or by arrival order without one).
    Batches commit in order, each after the one before.
    """
    identifier = TableIdentifier.parse(table)
    if mode not in KEYED_MODES and (
        op_column is not None or order_column is not None or envelope is not None
    ):
        raise ValidationError(
            f"op_column, order_column and envelope describe a change stream; mode={mode!r} "
            "takes none of them (use mode='upsert')"
        )
    # a stream holds the same key many times: without an ordering column, arrival decides
    order_by: OrderArg = order_column
    if mode == "upsert" and order_column is None:
        order_by = ()

    def sink(df: DataFrame, batch_id: int) -> None:
        query_id = sink_id or df.sparkSession.sparkContext.getLocalProperty(
            STREAMING_QUERY_ID_PROPERTY
        )
        if not query_id:
            raise ValidationError(
                f"foreach_batch_sink for {identifier} runs outside a streaming query: pass "
                "sink_id so each batch gets a stable commit id"
            )
        commit_id = f"{query_id}:{batch_id}"
        settings = resolve_settings(df.sparkSession, config)
        done = BACKGROUND.run(committed_in(settings.require_catalog(), identifier, commit_id))
        if done is not None:
            log.info(
                "batch %d of %s is already in %s (snapshot %d): skipped",
                batch_id,
                query_id,
                identifier,
                done,
            )
            return
        props = {BATCH_ID_PROPERTY: str(batch_id), QUERY_ID_PROPERTY: str(query_id)}
        props.update(snapshot_properties or {})
        write(
            df,
            identifier,
            mode,
            branch=branch,
            merge_schema=merge_schema,
            snapshot_properties=props,
            commit_id=commit_id,
            config=settings,
            timeout_s=timeout_s,
            order_by=order_by,
            op_column=op_column,
            envelope=envelope,
        )

    return sink


__all__ = [
    "BATCH_ID_PROPERTY",
    "QUERY_ID_PROPERTY",
    "STREAMING_QUERY_ID_PROPERTY",
    "foreach_batch_sink",
]
