"""Checkpoints of a key index in the table's storage, so a new owner resumes without a scan.

Layout, under ``<table location>/metadata/icefloe-key-index/``:

* ``runs/<sha256>.arrow``: one serialized run (:mod:`icefloe.key_index.runs`), named by
  the SHA-256 of its bytes. A run is written once (``write_once``) however many
  checkpoints name it, so a checkpoint only uploads the runs built since the last one.
* ``checkpoint-<seq>.json``: a small manifest naming the runs and, per run, the files in it
  that are no longer covered. ``seq`` increases by one per checkpoint and the manifest is
  created with ``write_once``, so two owners (a zombie after a rebalance) never overwrite
  each other's manifest: the loser takes the next number.

A manifest is trusted only whole: its own checksum, the encoding it was made under (the key
columns and their types), and every run it names present with the digest its name claims.
Anything less (a torn upload, a deleted run, garbage) is skipped with a warning and the
next older manifest is tried; with none left the index starts empty and ``sync`` rebuilds
it. Skipping is always safe, because a checkpoint only says which files' keys it holds,
and the next ``sync`` adds whatever live files it lacks and drops what is no longer live.

Cleanup keeps the newest :data:`KEEP_CHECKPOINTS` manifests and deletes older ones, and
runs that no kept manifest names and that are older than the oldest kept manifest (a run
written just now for a manifest not yet visible is left alone).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from icefloe.errors import AlreadyExistsError, InvalidFileError, NotFoundError, ValidationError
from icefloe.io.fileio import FileInfo, FileIO, join_location
from icefloe.key_index.runs import digest

log = logging.getLogger(__name__)

CHECKPOINT_DIR: Final = "metadata/icefloe-key-index"
KEEP_CHECKPOINTS: Final = 3
MANIFEST_FORMAT: Final = "icefloe-key-index-checkpoint/1"
_MANIFEST_RE: Final = re.compile(r"^checkpoint-(\d{1,19})\.json$")
_RUN_RE: Final = re.compile(r"^([0-9a-f]{64})\.arrow$")
_NAME_RACE_RETRIES: Final = 16
# What makes a checkpoint unusable (skipped), as opposed to storage failing (raised).
UNUSABLE: Final = (ValidationError, InvalidFileError, NotFoundError)


@dataclass(frozen=True, slots=True)
class RunRef:
    """A run a checkpoint names, and the indexes (in the run's path list) of its dead files."""

    name: str
    dead: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Manifest:
    seq: int
    location: str
    runs: tuple[RunRef, ...]


class CheckpointStore:
    """The checkpoints of one table's key index (see the module docstring)."""

    def __init__(self, io: FileIO, table_location: str, signature: str) -> None:
        self.io = io
        self.root = join_location(table_location, CHECKPOINT_DIR)
        self.signature = signature
        self.last_seq = 0

    def run_location(self, name: str) -> str:
        return join_location(self.root, "runs", f"{name}.arrow")

    async def _listing(self) -> tuple[dict[int, FileInfo], dict[str, FileInfo]]:
        manifests: dict[int, FileInfo] = {}
        runs: dict[str, FileInfo] = {}
        async for info in self.io.list(self.root):
            base = posixpath.basename(info.path)
            if (m := _MANIFEST_RE.match(base)) is not None:
                manifests[int(m.group(1))] = info
            elif (r := _RUN_RE.match(base)) is not None:
                runs[r.group(1)] = info
        if manifests:
            self.last_seq = max(self.last_seq, max(manifests))
        return manifests, runs

    async def manifests(self) -> list[tuple[int, str]]:
        """(seq, location) of every manifest, newest first."""
        manifests, _ = await self._listing()
        return [(seq, manifests[seq].path) for seq in sorted(manifests, reverse=True)]

    async def read_manifest(self, seq: int, location: str) -> Manifest:
        """The manifest at ``location``; ValidationError unless it is whole and ours."""
        raw = await self.io.read(location)
        try:
            doc = json.loads(raw)
            body = doc["body"]
            ok = doc["sha256"] == _body_digest(body)
        except (ValueError, KeyError, TypeError) as e:
            raise ValidationError(f"{location}: not a key index checkpoint ({e})") from e
        if not ok:
            raise ValidationError(f"{location}: checksum mismatch")
        if body.get("format") != MANIFEST_FORMAT or body.get("seq") != seq:
            raise ValidationError(f"{location}: unknown format or sequence number")
        if body.get("signature") != self.signature:
            raise ValidationError(
                f"{location}: made for keys {body.get('signature')!r}, not {self.signature!r}"
            )
        try:
            runs = tuple(
                RunRef(str(r["name"]), tuple(int(i) for i in r["dead"])) for r in body["runs"]
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ValidationError(f"{location}: malformed run list ({e})") from e
        if any(_RUN_RE.match(f"{r.name}.arrow") is None for r in runs):
            raise ValidationError(f"{location}: malformed run name")
        return Manifest(seq, location, runs)

    async def read_run(self, name: str) -> bytes:
        """A run's bytes, checked against its name; ValidationError if they differ."""
        location = self.run_location(name)
        data = await self.io.read(location)
        if await asyncio.to_thread(digest, data) != name:
            raise ValidationError(f"{location}: content does not match its digest")
        return data

    async def has_run(self, name: str) -> bool:
        return await self.io.exists(self.run_location(name))

    async def write_run(self, name: str, data: bytes) -> None:
        """Store a run under its digest ``name``. A file already there holds the same bytes
        unless it was damaged: then it is replaced (any content but this is garbage)."""
        location = self.run_location(name)
        try:
            await self.io.write_once(location, data)
        except AlreadyExistsError:
            try:
                await self.read_run(name)
            except ValidationError:
                log.warning("key index run %s was damaged; writing it again", location)
                await self.io.write(location, data)

    async def write_manifest(self, runs: Sequence[RunRef]) -> int:
        """A new manifest naming ``runs`` (already written); returns its sequence number."""
        for _ in range(_NAME_RACE_RETRIES):
            seq = self.last_seq + 1
            body = {
                "format": MANIFEST_FORMAT,
                "seq": seq,
                "signature": self.signature,
                "runs": [{"name": r.name, "dead": list(r.dead)} for r in runs],
            }
            doc = {"body": body, "sha256": _body_digest(body)}
            location = join_location(self.root, f"checkpoint-{seq:016d}.json")
            try:
                await self.io.write_once(location, json.dumps(doc).encode())
            except AlreadyExistsError:
                await self._listing()  # another owner took the number: take the next
                self.last_seq = max(self.last_seq, seq)
                continue
            self.last_seq = seq
            return seq
        raise AlreadyExistsError(f"{self.root}: could not claim a checkpoint number")

    async def cleanup(self, keep: int = KEEP_CHECKPOINTS) -> None:
        """Delete manifests older than the newest ``keep`` and the runs none of them names."""
        manifests, runs = await self._listing()
        newest = sorted(manifests, reverse=True)
        kept, old = newest[:keep], newest[keep:]
        named: set[str] = set()
        for seq in kept:
            try:
                named.update(
                    r.name for r in (await self.read_manifest(seq, manifests[seq].path)).runs
                )
            except UNUSABLE:
                continue
        for seq in old:
            await self.io.delete(manifests[seq].path)
        if not kept:
            return
        horizon = min(manifests[seq].last_modified_ms for seq in kept)
        for name, info in runs.items():
            if name not in named and info.last_modified_ms < horizon:
                await self.io.delete(info.path)


def _body_digest(body: Any) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


__all__ = [
    "CHECKPOINT_DIR",
    "KEEP_CHECKPOINTS",
    "UNUSABLE",
    "CheckpointStore",
    "Manifest",
    "RunRef",
]
