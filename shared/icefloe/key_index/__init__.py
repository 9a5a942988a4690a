"""The key index: key → (data file, row position) for resolving upserts on keyed tables.

:mod:`icefloe.key_index.index` holds the interface and the design argument; the encoding
of keys as fixed-width words, the sorted runs and the checkpoints are its own modules.
"""

from icefloe.key_index.index import (
    DEFAULT_MEMORY_BUDGET_BYTES,
    Key,
    KeyIndex,
    KeyIndexStats,
    Positions,
    SyncChanges,
    key_schema,
    key_tuples,
)

__all__ = [
    "DEFAULT_MEMORY_BUDGET_BYTES",
    "Key",
    "KeyIndex",
    "KeyIndexStats",
    "Positions",
    "SyncChanges",
    "key_schema",
    "key_tuples",
]
