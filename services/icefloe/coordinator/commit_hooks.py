"""The stages of a commit, and the observer that hears them.

A commit passes three stages: ``after-manifests`` (manifests and manifest list written),
``after-metadata`` (the new metadata file written, the pointer not yet swapped) and
``after-swap``. The committer (:mod:`icefloe.coordinator.committer`) tells a
:class:`CommitHooks` observer of each; the default one does nothing. Tests install one that
ends the process at a stage (see ``tests/services/coordinator/crashing_coordinator.py``) to
prove the protocol; nothing in the shipped service does. ``after-metadata`` is seen by
wrapping the catalog's FileIO (:func:`install_commit_hooks`), only for observers that ask for
it; on file-system tables writing the metadata file *is* the swap, so that stage only means
something for metastore catalogs (Redis, DynamoDB).

Why a module: the stages are the protocol's crash points, named once for the committer that
reports them, the service that installs the observer and the tests that crash there.
"""

from __future__ import annotations

import contextvars
from collections.abc import AsyncIterator

from icefloe.io.fileio import FileInfo, FileIO
from icefloe.table.catalog import Catalog
from icefloe.table.commit_index import SUMMARY_COMMIT_IDS as SUMMARY_COMMIT_IDS
from icefloe.table.commit_index import summary_commit_ids as summary_commit_ids

COMMIT_STAGES = ("after-manifests", "after-metadata", "after-swap")


class CommitHooks:
    """An observer of a commit's stages (see the module docstring); this one does nothing.

    ``after-manifests`` and ``after-swap`` are always reported; ``after-metadata`` only to
    observers that list it in ``stages``, since seeing it costs a FileIO wrapper
    (:func:`install_commit_hooks`).
    """

    stages: frozenset[str] = frozenset()

    def on_stage(self, stage: str) -> None:
        """Called when a commit reaches ``stage``, one of :data:`COMMIT_STAGES`."""


# The hooks of the commit running in this task, for the FileIO wrapper to tell.
COMMITTING: contextvars.ContextVar[CommitHooks | None] = contextvars.ContextVar(
    "icefloe_committing", default=None
)


class StageFileIO(FileIO):
    """Delegates to ``inner``; inside a commit, tells its hooks ``after-metadata`` once a
    metadata file has been written (before the catalog swaps its pointer to it)."""

    def __init__(self, inner: FileIO) -> None:
        self.inner = inner

    async def read(self, path: str) -> bytes:
        return await self.inner.read(path)

    async def read_range(self, path: str, start: int, length: int) -> bytes:
        return await self.inner.read_range(path, start, length)

    async def write(self, path: str, data: bytes) -> None:
        await self.inner.write(path, data)

    async def write_once(self, path: str, data: bytes) -> None:
        await self.inner.write_once(path, data)
        hooks = COMMITTING.get()
        if hooks is not None and path.endswith(".metadata.json"):
            hooks.on_stage("after-metadata")

    async def delete(self, path: str) -> None:
        await self.inner.delete(path)

    async def exists(self, path: str) -> bool:
        return await self.inner.exists(path)

    async def size(self, path: str) -> int:
        return await self.inner.size(path)

    async def list(self, prefix: str) -> AsyncIterator[FileInfo]:
        async for info in self.inner.list(prefix):
            yield info

    async def close(self) -> None:
        await self.inner.close()


def install_commit_hooks(catalog: Catalog, hooks: CommitHooks) -> None:
    """Wrap the catalog's FileIO when ``hooks`` wants to hear ``after-metadata``."""
    if "after-metadata" in hooks.stages and not isinstance(catalog.io, StageFileIO):
        catalog.io = StageFileIO(catalog.io)
