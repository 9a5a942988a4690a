"""The dedup ledger: the dedup window's commit ids, carried forward with the table itself.

A snapshot's summary records the commit ids it applied (``icefloe.commit-ids``), but any
engine can expire that snapshot — Java's ``expire_snapshots`` procedure on a catalog icefloe
never hears of, PyIceberg, a REST client — and with it the only record that the commit
happened. A retried job would then be applied twice. The ledger is what survives: the table
property ``icefloe.dedup.ledger`` lists, for every snapshot the coordinator committed inside
the dedup window (:func:`icefloe.table.commit_index.dedup_window_ms`), its id, its time and a
digest of each commit id it applied. Table properties are carried by every engine's commit
and untouched by snapshot expiry and orphan-file removal (a file referenced only from a
property or a summary would be an orphan to Java's ``remove_orphan_files``; a statistics
file is dropped with its snapshot), so the ledger outlives the snapshots it describes.

Format (version 1), kept compact because every metadata version carries it::

    v1 <snapshot-id>:<timestamp-ms>:<digests> <snapshot-id>:<timestamp-ms>:<digests> ...

Entries are in commit order (appended at the end, pruned from the front once older than the
window). ``<digests>`` is the concatenation of one 16-character digest per commit id: the
URL-safe base64 of the 96-bit BLAKE2b of its UTF-8 bytes. 96 bits make a false match (a new
commit id taken for a recorded one) about 1 in 10^24 per lookup against 40,000 recorded
ids; the commit ids themselves stay in the snapshot summaries while those exist.

Reading is incremental (:class:`DedupLedger`): a new metadata version normally adds one
entry at the end, so only entries not taken in before are parsed.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Container, Iterable, Sequence

LEDGER_PROPERTY = "icefloe.dedup.ledger"
LEDGER_VERSION = "v1"
DIGEST_CHARS = 16
_HEADER = LEDGER_VERSION + " "


def commit_digest(commit_id: str) -> str:
    """The 16-character digest the ledger records for ``commit_id``."""
    raw = hashlib.blake2b(commit_id.encode("utf-8"), digest_size=12).digest()
    return base64.urlsafe_b64encode(raw).decode("ascii")


def ledger_entry(snapshot_id: int, timestamp_ms: int, commit_ids: Iterable[str]) -> str:
    """One snapshot's entry: ``<snapshot-id>:<timestamp-ms>:<digests>``."""
    digests = "".join(commit_digest(c) for c in commit_ids)
    return f"{snapshot_id}:{timestamp_ms}:{digests}"


def _parse_entry(text: str) -> tuple[int, int, list[str]] | None:
    """``(snapshot id, timestamp, digests)`` of one entry, or None when it is not one."""
    parts = text.split(":")
    if len(parts) != 3:
        return None
    sid, ts, digests = parts
    try:
        snapshot_id, timestamp_ms = int(sid), int(ts)
    except ValueError:
        return None
    if not digests or len(digests) % DIGEST_CHARS:
        return None
    return (
        snapshot_id,
        timestamp_ms,
        [digests[i : i + DIGEST_CHARS] for i in range(0, len(digests), DIGEST_CHARS)],
    )


def _entry_timestamp(text: str) -> int | None:
    first = text.find(":")
    second = text.find(":", first + 1)
    if first < 0 or second < 0:
        return None
    try:
        return int(text[first + 1 : second])
    except ValueError:
        return None


def extend_ledger(raw: str | None, entries: Sequence[str], cutoff_ms: int) -> str:
    """The ledger after ``raw``: entries older than ``cutoff_ms`` pruned from the front,
    ``entries`` appended. An unreadable ``raw`` is replaced (the snapshots' own summaries
    and the caller's seeding still hold what it would have said).

    Cost: the pruned entries are parsed, the rest is copied once (a string concatenation).
    """
    kept = ""
    if raw is not None and raw.startswith(_HEADER):
        pos = len(_HEADER)
        while pos < len(raw):
            end = raw.find(" ", pos)
            if end < 0:
                end = len(raw)
            timestamp = _entry_timestamp(raw[pos:end])
            if timestamp is not None and timestamp >= cutoff_ms:
                break
            pos = end + 1
        kept = raw[pos:]
    tail = " ".join(entries)
    if kept and tail:
        return f"{_HEADER}{kept} {tail}"
    return f"{_HEADER}{kept or tail}"


class DedupLedger:
    """What the ledgers seen so far recorded: commit digest -> snapshot id, taken in
    incrementally (a commit id, once recorded, stays known, like the dedup index)."""

    __slots__ = ("_by_digest", "_last_raw", "snapshots")

    def __init__(self) -> None:
        self._by_digest: dict[str, int] = {}
        self._last_raw: str | None = None
        self.snapshots: set[int] = set()  # snapshot ids some ledger listed

    def take_in(self, raw: str | None, known: Container[int] = ()) -> int:
        """Read the entries of ``raw`` not read before; returns how many were read.

        The ledger grows at the end, so the walk goes backwards from the last entry and
        stops at the first snapshot already taken in: everything before it was in a ledger
        read earlier. The first ledger is read whole. The digests of snapshots in ``known``
        are not kept (the caller holds their commit ids already, from their summaries)."""
        if raw is None or raw is self._last_raw or raw == self._last_raw:
            return 0
        if not raw.startswith(_HEADER):
            return 0
        first = self._last_raw is None
        self._last_raw = raw
        read = 0
        end = len(raw)
        while end > len(_HEADER):
            start = raw.rfind(" ", len(_HEADER) - 1, end) + 1
            entry_start, entry_end = start, end
            end = start - 1
            # The snapshot id first: most entries stop the walk or are known already.
            colon = raw.find(":", entry_start, entry_end)
            try:
                snapshot_id = int(raw[entry_start:colon]) if colon > 0 else None
            except ValueError:
                snapshot_id = None
            if snapshot_id is None:
                continue
            if not first and snapshot_id in self.snapshots:
                break
            if snapshot_id in known:
                read += 1
                self.snapshots.add(snapshot_id)
                continue
            parsed = _parse_entry(raw[entry_start:entry_end])
            if parsed is None:
                continue
            read += 1
            self.snapshots.add(snapshot_id)
            for digest in parsed[2]:
                self._by_digest.setdefault(digest, snapshot_id)
        return read

    def get(self, commit_id: str) -> int | None:
        """The snapshot a ledger recorded for ``commit_id``, or None."""
        if not self._by_digest:
            return None
        return self._by_digest.get(commit_digest(commit_id))

    def __len__(self) -> int:
        return len(self._by_digest)
