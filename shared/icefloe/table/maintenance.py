"""Table maintenance: expire snapshots, remove orphan files, rewrite manifests, purge.

Expiry follows the spec's "Snapshot Retention Policy" exactly, per ref, with the table
properties as defaults, plus one rule of icefloe's: a snapshot that records commit ids
(``icefloe.commit-ids``) is kept while it is younger than the table's dedup window
(``icefloe.dedup.window-ms``, default 7 days; :mod:`icefloe.table.commit_index`), since those ids
are what keeps a retried commit from being applied twice. Expiring such a snapshot by id
inside the window is refused. Files are deleted only after the metadata change is committed, and
only if no retained snapshot can still reach them, so a crash mid-way leaves orphans (which
``remove_orphan_files`` collects later) but never a dangling reference.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from icefloe.errors import NotFoundError, ValidationError
from icefloe.manifests.manifest_list import ManifestFile
from icefloe.manifests.reader import ManifestReader
from icefloe.spec.metadata import TableMetadata
from icefloe.spec.metadata_builder import MetadataBuilder
from icefloe.spec.snapshot import MAIN_BRANCH, Operation, Snapshot
from icefloe.table.catalog import Table
from icefloe.table.commit import RetryPolicy, commit_with_retry
from icefloe.table.commit_index import check_snapshot_removal, dedup_window_ms, snapshots_in_window
from icefloe.table.snapshot_producer import SnapshotProducer

MAX_SNAPSHOT_AGE_MS = "history.expire.max-snapshot-age-ms"
MAX_SNAPSHOT_AGE_MS_DEFAULT = 5 * 24 * 3600 * 1000
MIN_SNAPSHOTS_TO_KEEP = "history.expire.min-snapshots-to-keep"
MIN_SNAPSHOTS_TO_KEEP_DEFAULT = 1
MAX_REF_AGE_MS = "history.expire.max-ref-age-ms"
GC_ENABLED = "gc.enabled"


@dataclass(slots=True)
class ExpireResult:
    expired_snapshot_ids: list[int] = field(default_factory=list)
    removed_refs: list[str] = field(default_factory=list)
    deleted_data_files: int = 0
    deleted_manifests: int = 0
    deleted_manifest_lists: int = 0
    deleted_statistics_files: int = 0


def _now_ms() -> int:
    return int(time.time() * 1000)


def retained_snapshots(
    metadata: TableMetadata,
    *,
    now_ms: int,
    older_than_ms: int | None = None,
    retain_last: int | None = None,
    dedup_window: bool = True,
) -> tuple[set[int], list[str]]:
    """The snapshot ids the retention policy keeps, and the refs it removes.

    ``older_than_ms`` (an absolute timestamp) and ``retain_last`` override the table-level
    defaults, not a ref's own settings. Snapshots on no ref are kept while younger than the
    age limit, as Java does, so an in-flight commit's parent is never pulled away.
    ``dedup_window=False`` leaves out the snapshots only the dedup window keeps (to tell
    what holds a snapshot back, :func:`icefloe.table.maintenance_policy.expiry_retention`; expiry
    itself always keeps them).
    """
    table_max_age = metadata.int_property(MAX_SNAPSHOT_AGE_MS, MAX_SNAPSHOT_AGE_MS_DEFAULT)
    default_cutoff = older_than_ms if older_than_ms is not None else now_ms - table_max_age
    default_keep = (
        retain_last
        if retain_last is not None
        else metadata.int_property(MIN_SNAPSHOTS_TO_KEEP, MIN_SNAPSHOTS_TO_KEEP_DEFAULT)
    )
    if default_keep < 1:
        raise ValidationError(f"retain_last must be at least 1, got {default_keep}")
    table_max_ref_age = (
        metadata.int_property(MAX_REF_AGE_MS, 0) if MAX_REF_AGE_MS in metadata.properties else None
    )

    retained: set[int] = set()
    removed_refs: list[str] = []
    for name, ref in metadata.refs.items():
        snapshot = metadata.snapshot_by_id(ref.snapshot_id)
        if snapshot is None:
            continue
        max_ref_age = ref.max_ref_age_ms
        if max_ref_age is None:
            max_ref_age = table_max_ref_age
        expired_ref = max_ref_age is not None and snapshot.timestamp_ms < now_ms - max_ref_age
        if name != MAIN_BRANCH and expired_ref:
            removed_refs.append(name)
            continue
        retained.add(snapshot.snapshot_id)
        if not ref.is_branch:
            continue
        keep = ref.min_snapshots_to_keep or default_keep
        cutoff = (
            now_ms - ref.max_snapshot_age_ms
            if ref.max_snapshot_age_ms is not None
            else default_cutoff
        )
        for i, ancestor in enumerate(metadata.ancestors_of(snapshot.snapshot_id)):
            if ancestor.timestamp_ms < cutoff and i >= keep:
                break
            retained.add(ancestor.snapshot_id)

    # icefloe's exactly-once window: commit ids younger than it must stay in the table.
    if dedup_window:
        retained |= snapshots_in_window(metadata, now_ms, dedup_window_ms(metadata.properties))

    on_a_ref: set[int] = set()
    for name, ref in metadata.refs.items():
        if name in removed_refs:
            continue
        if ref.is_branch:
            on_a_ref.update(s.snapshot_id for s in metadata.ancestors_of(ref.snapshot_id))
        else:
            on_a_ref.add(ref.snapshot_id)  # a tag references its snapshot, not the history
    for s in metadata.snapshots:
        if s.snapshot_id not in on_a_ref and s.timestamp_ms >= default_cutoff:
            retained.add(s.snapshot_id)
    return retained, removed_refs


async def _reachable(
    reader: ManifestReader,
    metadata: TableMetadata,
    snapshots: Iterable[Snapshot],
    *,
    live_only: bool = False,
) -> tuple[set[str], set[str], set[str]]:
    """(manifest lists, manifests, content files) that ``snapshots`` reference.

    With ``live_only`` a file counts only where it is part of a snapshot: a DELETED entry
    records that the snapshot removed the file, so it keeps no file alive.
    """
    lists: set[str] = set()
    manifests: set[str] = set()
    specs = metadata.specs()
    seen: set[str] = set()
    unseen: list[ManifestFile] = []
    for s in snapshots:
        if s.manifest_list:
            lists.add(s.manifest_list)
        for m in await reader.manifests(s):
            manifests.add(m.manifest_path)
            if m.manifest_path in seen:
                continue
            seen.add(m.manifest_path)
            unseen.append(m)
    files = await reader.file_paths(unseen, specs, metadata.schema(), live_only=live_only)
    return lists, manifests, files


async def expire_snapshots(
    table: Table,
    *,
    older_than_ms: int | None = None,
    retain_last: int | None = None,
    snapshot_ids: Iterable[int] = (),
    delete_files: bool = True,
    now_ms: int | None = None,
    policy: RetryPolicy | None = None,
) -> ExpireResult:
    """Expire snapshots by the retention policy (plus ``snapshot_ids``), then delete files
    that only expired snapshots reached."""
    now = now_ms if now_ms is not None else _now_ms()
    explicit = set(snapshot_ids)
    result = ExpireResult()
    planned: dict[str, set[int]] = {}
    bases: list[TableMetadata] = []

    async def build(current: Table) -> TableMetadata:
        metadata = current.metadata
        retained, removed_refs = retained_snapshots(
            metadata, now_ms=now, older_than_ms=older_than_ms, retain_last=retain_last
        )
        for sid in explicit:
            if metadata.snapshot_by_id(sid) is None:
                raise NotFoundError(f"snapshot {sid} is not in table {current.identifier}")
            check_snapshot_removal(metadata, [sid], now, current.identifier)
            if any(r.snapshot_id == sid for n, r in metadata.refs.items() if n not in removed_refs):
                raise ValidationError(
                    f"snapshot {sid} is referenced by a branch or tag: remove the ref first"
                )
        expired = {
            s.snapshot_id
            for s in metadata.snapshots
            if s.snapshot_id not in retained or s.snapshot_id in explicit
        }
        planned["expired"] = expired
        bases.append(metadata)
        result.removed_refs = removed_refs
        builder = MetadataBuilder(metadata)
        for name in removed_refs:
            builder.remove_ref(name)
        if expired:
            builder.remove_snapshots(sorted(expired))
        return builder.build(current.metadata_location)

    def applied(current: Table) -> bool:
        return not any(
            current.metadata.snapshot_by_id(s) for s in planned.get("expired", ())
        ) and not any(name in current.metadata.refs for name in result.removed_refs)

    retained, removed_refs = retained_snapshots(
        table.metadata, now_ms=now, older_than_ms=older_than_ms, retain_last=retain_last
    )
    if (
        not removed_refs
        and not explicit
        and retained >= {s.snapshot_id for s in table.metadata.snapshots}
    ):
        return result  # nothing to expire: no new metadata version for nothing

    committed = await commit_with_retry(table.catalog, table, build, applied, policy=policy)
    # File clean-up compares the base the committed change was built on with the result.
    before = bases[-1]
    expired_ids = sorted(planned.get("expired", set()))
    result.expired_snapshot_ids = expired_ids
    gc = before.properties.get(GC_ENABLED, "true").lower() != "false"
    if not delete_files or not expired_ids or not gc:
        return result

    reader = ManifestReader(table.io)
    expired = [s for s in before.snapshots if s.snapshot_id in set(expired_ids)]
    kept = list(committed.metadata.snapshots)
    old_lists, old_manifests, old_files = await _reachable(reader, before, expired)
    new_lists, new_manifests, new_files = await _reachable(
        reader, committed.metadata, kept, live_only=True
    )
    for path in old_files - new_files:
        await table.io.delete(path)
        result.deleted_data_files += 1
    for path in old_manifests - new_manifests:
        await table.io.delete(path)
        result.deleted_manifests += 1
    for path in old_lists - new_lists:
        await table.io.delete(path)
        result.deleted_manifest_lists += 1
    kept_stats = {s.statistics_path for s in committed.metadata.statistics}
    for stats in before.statistics:
        if stats.snapshot_id in set(expired_ids) and stats.statistics_path not in kept_stats:
            await table.io.delete(stats.statistics_path)
            result.deleted_statistics_files += 1
    return result


async def reachable_files(table: Table) -> set[str]:
    """Every file the table's metadata can reach, current and logged metadata included."""
    metadata = table.metadata
    reader = ManifestReader(table.io)
    lists, manifests, files = await _reachable(reader, metadata, metadata.snapshots)
    out = lists | manifests | files
    out.add(table.metadata_location)
    out.update(e.metadata_file for e in metadata.metadata_log)
    out.update(s.statistics_path for s in metadata.statistics)
    out.update(s.statistics_path for s in metadata.partition_statistics)
    return out


async def remove_orphan_files(
    table: Table, *, older_than_ms: int | None = None, dry_run: bool = False
) -> list[str]:
    """Delete files under the table location that no metadata reaches and that are older
    than ``older_than_ms`` (default: 3 days ago, so in-flight writes are never touched)."""
    cutoff = older_than_ms if older_than_ms is not None else _now_ms() - 3 * 24 * 3600 * 1000
    reachable = await reachable_files(table)
    orphans: list[str] = []
    async for info in table.io.list(table.location):
        name = info.path.rsplit("/", 1)[-1]
        if name == "version-hint.text" or info.path in reachable:
            continue
        if info.last_modified_ms >= cutoff:
            continue
        orphans.append(info.path)
    if not dry_run:
        for path in orphans:
            await table.io.delete(path)
    return orphans


async def rewrite_manifests(
    table: Table, *, snapshot_properties: dict[str, str] | None = None
) -> Table:
    """Bin-pack the current snapshot's manifests into target-size ones (a ``replace``)."""
    producer = SnapshotProducer(
        table,
        Operation.REPLACE,
        snapshot_properties=snapshot_properties,
        merge_manifests=True,
        merge_min_count=2,
    )
    return await producer.commit()


async def purge_table_files(table: Table, within: Callable[[str], bool] | None = None) -> list[str]:
    """Delete everything the table reaches and everything under its location.

    ``within`` limits deletion to the paths it accepts (a REST catalog must not let whoever
    committed a file path make the server delete it); the refused paths are returned.
    """
    try:
        paths = await reachable_files(table)
    except Exception:
        paths = set()  # unreadable metadata: fall back to the location listing
    async for info in table.io.list(table.location):
        paths.add(info.path)
    refused: list[str] = []
    if within is not None:
        # ``within`` may ask the file system (symbolic links): off the event loop.
        candidates = sorted(paths)
        refused = await asyncio.to_thread(lambda: [p for p in candidates if not within(p)])
    for path in paths.difference(refused):
        await table.io.delete(path)
    if not refused:
        await table.io.remove_empty_dirs(table.location)
    return refused
