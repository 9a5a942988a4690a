"""Where REST writers may put tables, and which files a table may own.

Without this, a write token could make the server write metadata files anywhere it can
(a table ``location`` or ``write.metadata.path`` outside the warehouse), read any file as
"metadata" (register), or, by committing a snapshot whose manifest list is another table's
and purging the table, make the server delete that table's files. The rules:

* every table location and every location-bearing property (``write.data.path``,
  ``write.metadata.path``, ``write.object-storage.path``, …; relative values resolved under
  the location) lies under an allowed prefix (``ICEFLOE_REST_ALLOWED_LOCATIONS``, default
  the warehouse), in the normal form of :mod:`icefloe.io.locations`: ``..``, ``.``, ``//`` in
  keys and percent-encoded dot steps are refused, other schemes and buckets are outside,
  and on a local disk symbolic links are followed before deciding;
* a commit may add only snapshots whose manifest list, manifests and new data and delete
  files (and statistics files) lie under the table's own directories;
* a table moves only into a location of its own: a new table's custom location, and the
  location a commit moves a table to, must hold no file yet (else a writer could create a
  table at another table's location and purge it);
* a purge deletes only what lies under the purged table's own location.

Refusals are 403 ``ForbiddenException``, for a location without a normal form as for one
outside the allowed set. Messages name the client's location and the rule, never the
server's configured prefixes (those go to the log).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping

from icefloe.errors import InvalidFileError, NotFoundError, ValidationError
from icefloe.io.fileio import FileIO
from icefloe.io.locations import (
    LOCATION_PROPERTIES,
    Roots,
    first_outside,
    normal_location,
    resolve_table_path,
    table_locations,
    within_any,
)
from icefloe.manifests.cache import ManifestCache
from icefloe.planner.errors import ApiError
from icefloe.spec.metadata import TableMetadata

log = logging.getLogger(__name__)


def _forbidden(message: str) -> ApiError:
    return ApiError(403, "ForbiddenException", message)


class LocationPolicy:
    """The allowed prefixes and the checks every write route applies with them."""

    def __init__(self, prefixes: Iterable[str]) -> None:
        self.prefixes = [p.strip() for p in prefixes if p.strip()]
        for prefix in self.prefixes:
            normal_location(prefix)  # a bad setting fails at startup, naming itself

    def allows(self, location: str) -> bool:
        """Whether ``location`` lies under an allowed prefix (links followed on local disk)."""
        if not self.prefixes:
            return True
        return within_any(location, self.prefixes, resolve_links=True)

    def _allowed(self) -> Callable[[str], bool]:
        """:meth:`allows` for many paths (links resolved once per folder)."""
        if not self.prefixes:
            return lambda _: True
        return Roots(self.prefixes, resolve_links=True)

    def check(self, location: str, what: str) -> None:
        """403 for a location without a normal form or outside the allowed set."""
        try:
            normal_location(location)
        except ValidationError as e:
            raise _forbidden(f"{what}: {e}") from None
        if not self.allows(location):
            log.warning("refused %s %r: outside %s", what, location[:200], self.prefixes)
            raise _forbidden(
                f"{what} {location[:200]!r} is outside the locations this catalog allows "
                "(ICEFLOE_REST_ALLOWED_LOCATIONS)"
            )

    def check_table(self, location: str, properties: Mapping[str, str]) -> None:
        """The table location and each location-bearing property it sets."""
        self.check(location, "table location")
        for key in LOCATION_PROPERTIES:
            value = properties.get(key)
            if value:
                self.check(resolve_table_path(location, value), f"table property {key}")

    async def check_unused(self, io: FileIO, location: str, what: str) -> None:
        """403 if ``location`` already holds a file (another table's, or anything else)."""
        async for _ in io.list(location):
            raise _forbidden(
                f"{what} {location[:200]!r} already holds files; a table's location must be "
                "its own (choose an empty one)"
            )

    def purgeable(self, metadata: TableMetadata) -> Callable[[str], bool]:
        """What a purge of the table may delete: files under its own location, allowed."""
        own, allowed = Roots([metadata.location], resolve_links=True), self._allowed()
        return lambda path: own(path) and allowed(path)

    async def check_commit(
        self,
        io: FileIO,
        manifests: ManifestCache,
        base: TableMetadata | None,
        new: TableMetadata,
        table: str,
    ) -> None:
        """Refuse a commit's new metadata if it moves the table outside the allowed set or
        adds files the table may not own (see the module docstring). Manifests are read
        through the planner's cache (decoded off the event loop, and warm for the next plan
        of the table)."""
        roots = table_locations(new.location, new.properties)
        if base is None or roots != table_locations(base.location, base.properties):
            self.check_table(new.location, new.properties)
        if base is not None and new.location != base.location:
            await self.check_unused(io, new.location, "table location")
        known = set() if base is None else {s.snapshot_id for s in base.snapshots}
        old_stats = set() if base is None else _statistics_paths(base)
        await self._owned(roots, "statistics file", sorted(_statistics_paths(new) - old_stats))
        schema, specs = new.schema(), new.specs()
        for snapshot in (s for s in new.snapshots if s.snapshot_id not in known):
            what = f"snapshot {snapshot.snapshot_id}"
            # Each file is checked before it is read: the server reads nothing it should not.
            if snapshot.manifest_list is not None:
                await self._owned(roots, f"{what}'s manifest list", [snapshot.manifest_list])
            else:
                await self._owned(roots, f"{what}'s manifest", list(snapshot.manifests or ()))
            try:
                listed = await manifests.manifest_list(snapshot)
                await self._owned(roots, f"{what}'s manifest", [m.manifest_path for m in listed])
                added = [m for m in listed if m.added_snapshot_id == snapshot.snapshot_id]
                for cached in await manifests.manifests(added, specs, schema):
                    files = cached.column("file_path").to_pylist()
                    await self._owned(roots, f"{what}'s data or delete file", files)
            except (NotFoundError, InvalidFileError, ValidationError) as e:
                log.warning("table %s: %s's manifests are unreadable: %s", table, what, e)
                raise ApiError(
                    400,
                    "BadRequestException",
                    f"table {table}: {what}'s manifest list or manifests are missing or "
                    "invalid; write them before committing the snapshot",
                ) from None

    async def _owned(self, roots: list[str], what: str, paths: list[str]) -> None:
        """403 unless every path lies under one of the table's ``roots`` (links followed)."""
        if not paths:
            return
        outside = await asyncio.to_thread(first_outside, paths, roots, resolve_links=True)
        if outside is not None:
            raise _forbidden(
                f"{what} {outside[:200]!r} is outside the table's own directories; a commit "
                "may only add files under the table location (or its write.*.path properties)"
            )


def _statistics_paths(metadata: TableMetadata) -> set[str]:
    paths = {s.statistics_path for s in metadata.statistics}
    paths.update(s.statistics_path for s in metadata.partition_statistics)
    return paths
