"""Which files a compaction rewrites, and how they are grouped: the engine-free half of it.

A streaming table collects small files (one or more per micro-batch and partition) and,
with upserts, delete files that every reader must apply. Compaction replaces such files by
fewer, larger ones holding the same rows, with the deletes already applied. This module
decides *what* to rewrite, from metadata and manifests only; an engine (the Spark job in
``icefloe.spark.compaction``) reads, writes and commits. The coordinator's maintenance uses the
same plan to announce candidates, so what it announces is what a compaction would do.

The policy, per partition (spec and values), as Java's ``RewriteDataFiles`` bin-pack:

* a data file is a *candidate* when it is smaller than ``min-file-size-bytes`` (default
  75 % of the target), larger than ``max-file-size-bytes`` (default 180 % of the target),
  or has at least ``delete-file-threshold`` delete files applying to it;
* a partition is rewritten when it has ``min-input-files`` candidates, or at least two
  whose sizes add up to the target, or one candidate with deletes to apply, or one file
  above the maximum (split);
* its candidates are bin-packed (first fit, largest first) into groups of about the
  target size; each group becomes one or a few files of ``write.target-file-size-bytes``.

``where`` limits the scope to files that may hold matching rows (partition values and
column metrics); a file is always rewritten whole.

Delete files the rewrite makes useless are removed by the same commit: a position or
equality delete file whose every live data file it applies to (spec scope rules, sequence
numbers and metrics, through :class:`~icefloe.deletes.index.DeleteFileIndex`) is rewritten.
Files added later have newer sequence numbers, so such a delete can never apply to them.

Format v3 tables (spec: "Row Lineage", "Deletion Vectors"): a data file's deletion vector
makes it a file with deletes like any delete file, and is never listed among the deletes to
drop by path (one Puffin file holds the vectors of many data files): the snapshot producer
removes a data file's DV together with the data file. The plan says
:attr:`CompactionPlan.row_lineage`, and an engine carrying it out must then write every
row's ``_row_id`` and ``_last_updated_sequence_number`` explicitly into the new files, as
read with inheritance (:func:`icefloe.spec.row_lineage.with_row_lineage`), so rows keep their
ids across the rewrite. A schema with a column named like a lineage column is refused.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from icefloe.deletes.index import DeleteFileIndex, is_deletion_vector, partition_key
from icefloe.errors import ValidationError
from icefloe.expressions import AlwaysTrue, BooleanExpression
from icefloe.expressions.binding import bind
from icefloe.expressions.evaluators import MetricsEvaluator, compile_row_filter
from icefloe.expressions.projection import inclusive_projection
from icefloe.manifests.reader import ManifestReader
from icefloe.parquet.options import DEFAULT_TARGET_FILE_SIZE_BYTES, TARGET_FILE_SIZE_BYTES
from icefloe.spec.datafile import DataFile, DataFileContent
from icefloe.spec.metadata import TableMetadata
from icefloe.spec.row_lineage import LINEAGE_NAMES
from icefloe.spec.snapshot import MAIN_BRANCH, Snapshot
from icefloe.table.catalog import Table

MIN_FILE_SIZE_BYTES = "icefloe.compaction.min-file-size-bytes"
MAX_FILE_SIZE_BYTES = "icefloe.compaction.max-file-size-bytes"
MIN_INPUT_FILES = "icefloe.compaction.min-input-files"
DELETE_FILE_THRESHOLD = "icefloe.compaction.delete-file-threshold"
MIN_INPUT_FILES_DEFAULT = 5
DELETE_FILE_THRESHOLD_DEFAULT = 1
MIN_FILE_RATIO = 0.75
MAX_FILE_RATIO = 1.8


class CompactionUnsupportedError(ValidationError):
    """The table cannot be compacted by this implementation (say, a v3 table whose schema
    has a column named like a row-lineage metadata column)."""


@dataclass(frozen=True, slots=True)
class CompactionPolicy:
    """What makes a file worth rewriting; see the module docs for the rules and defaults."""

    target_file_size_bytes: int
    min_file_size_bytes: int
    max_file_size_bytes: int
    min_input_files: int = MIN_INPUT_FILES_DEFAULT
    delete_file_threshold: int = DELETE_FILE_THRESHOLD_DEFAULT
    rewrite_all: bool = False

    def __post_init__(self) -> None:
        if self.target_file_size_bytes <= 0:
            raise ValidationError(
                f"target file size must be positive, got {self.target_file_size_bytes}"
            )
        if not 0 <= self.min_file_size_bytes <= self.target_file_size_bytes:
            raise ValidationError(
                f"min file size {self.min_file_size_bytes} must be between 0 and the target "
                f"{self.target_file_size_bytes}"
            )
        if self.max_file_size_bytes < self.target_file_size_bytes:
            raise ValidationError(
                f"max file size {self.max_file_size_bytes} must be at least the target "
                f"{self.target_file_size_bytes}"
            )
        if self.min_input_files < 1:
            raise ValidationError(f"min input files must be at least 1, got {self.min_input_files}")
        if self.delete_file_threshold < 1:
            raise ValidationError(
                f"delete file threshold must be at least 1, got {self.delete_file_threshold}"
            )

    @classmethod
    def for_table(
        cls, metadata: TableMetadata, overrides: Mapping[str, Any] | None = None
    ) -> CompactionPolicy:
        """The policy from the table's properties, with ``overrides`` (field names) on top."""
        o = dict(overrides or {})
        unknown = set(o) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValidationError(
                f"unknown compaction option(s) {sorted(unknown)}; known: "
                f"{sorted(cls.__dataclass_fields__)}"
            )
        target = o.get("target_file_size_bytes") or metadata.int_property(
            TARGET_FILE_SIZE_BYTES, DEFAULT_TARGET_FILE_SIZE_BYTES
        )
        target = int(target)
        min_size = o.get("min_file_size_bytes")
        if min_size is None:
            min_size = metadata.int_property(MIN_FILE_SIZE_BYTES, int(target * MIN_FILE_RATIO))
        max_size = o.get("max_file_size_bytes")
        if max_size is None:
            max_size = metadata.int_property(MAX_FILE_SIZE_BYTES, int(target * MAX_FILE_RATIO))
        min_inputs = o.get("min_input_files")
        if min_inputs is None:
            min_inputs = metadata.int_property(MIN_INPUT_FILES, MIN_INPUT_FILES_DEFAULT)
        threshold = o.get("delete_file_threshold")
        if threshold is None:
            threshold = metadata.int_property(DELETE_FILE_THRESHOLD, DELETE_FILE_THRESHOLD_DEFAULT)
        return cls(
            target_file_size_bytes=target,
            min_file_size_bytes=int(min(min_size, target)),
            max_file_size_bytes=int(max(max_size, target)),
            min_input_files=int(min_inputs),
            delete_file_threshold=int(threshold),
            rewrite_all=bool(o.get("rewrite_all", False)),
        )


@dataclass(slots=True)
class RewriteTask:
    """One data file to rewrite, with the delete files a reader must apply to it."""

    data_file: DataFile
    sequence_number: int
    deletes: list[DataFile]


@dataclass(slots=True)
class FileGroup:
    """Files of one partition rewritten together into about one target-size file."""

    spec_id: int
    partition: tuple[Any, ...]
    tasks: list[RewriteTask]

    @property
    def input_bytes(self) -> int:
        return sum(t.data_file.file_size_in_bytes for t in self.tasks)

    @property
    def input_rows(self) -> int:
        return sum(t.data_file.record_count for t in self.tasks)

    @property
    def paths(self) -> set[str]:
        return {t.data_file.file_path for t in self.tasks}


@dataclass(slots=True)
class CompactionPlan:
    """What one compaction rewrites, planned on ``snapshot``."""

    snapshot: Snapshot | None
    policy: CompactionPolicy
    groups: list[FileGroup] = field(default_factory=list)
    # Each live delete file with the set of live data files it applies to.
    delete_scope: dict[str, tuple[DataFile, frozenset[str]]] = field(default_factory=dict)
    data_files: int = 0
    candidate_files: int = 0
    # v3: the rewrite must carry _row_id and _last_updated_sequence_number explicitly.
    row_lineage: bool = False

    @property
    def snapshot_id(self) -> int | None:
        return None if self.snapshot is None else self.snapshot.snapshot_id

    @property
    def input_files(self) -> int:
        return sum(len(g.tasks) for g in self.groups)

    @property
    def input_bytes(self) -> int:
        return sum(g.input_bytes for g in self.groups)

    def droppable_deletes(self, rewritten: set[str]) -> list[DataFile]:
        """Delete files that apply only to files in ``rewritten`` (which the new files
        replace with the deletes applied), so the same commit may remove them."""
        out = []
        for d, scope in self.delete_scope.values():
            if scope and scope <= rewritten:
                out.append(d)
        return out

    def expected_output_files(self) -> int:
        target = self.policy.target_file_size_bytes
        return sum(max(1, -(-g.input_bytes // target)) for g in self.groups)


async def plan_compaction(
    table: Table,
    *,
    where: BooleanExpression | None = None,
    policy: CompactionPolicy | None = None,
    branch: str = MAIN_BRANCH,
    reader: ManifestReader | None = None,
) -> CompactionPlan:
    """The files of ``table``'s ``branch`` head that a compaction should rewrite."""
    metadata = table.metadata
    row_lineage = metadata.format_version >= 3
    if row_lineage:
        clash = [f.name for f in metadata.schema().fields if f.name in LINEAGE_NAMES]
        if clash:
            raise CompactionUnsupportedError(
                f"cannot compact {table.identifier}: its column {clash[0]!r} has the name of "
                "a row-lineage metadata column, which a v3 rewrite must write; rename the "
                "column first"
            )
    policy = policy or CompactionPolicy.for_table(metadata)
    snapshot = metadata.snapshot_by_ref(branch)
    plan = CompactionPlan(snapshot, policy, row_lineage=row_lineage)
    if snapshot is None:
        return plan
    reader = reader or ManifestReader(table.io)
    schema = metadata.schema()
    specs = metadata.specs()
    data: list[tuple[DataFile, int]] = []
    deletes: list[tuple[DataFile, int]] = []
    for manifest in await reader.manifests(snapshot):
        for e in await reader.entries(manifest, specs, live_only=True):
            seq = e.sequence_number if e.sequence_number is not None else 0
            target = data if e.data_file.content == DataFileContent.DATA else deletes
            target.append((e.data_file, seq))
    index = DeleteFileIndex(specs, schema).add_all(deletes)
    plan.data_files = len(data)

    may_match = _scope(metadata, where)
    # DVs are left out: the producer drops a DV with its data file, and their shared Puffin
    # path must never be named as a file to remove.
    droppable = [(d, s) for d, s in deletes if not is_deletion_vector(d)]
    scope: dict[str, set[str]] = {d.file_path: set() for d, _ in droppable}
    by_partition: dict[tuple[int, tuple[Any, ...]], list[RewriteTask]] = defaultdict(list)
    for f, seq in data:
        applying = index.for_data_file(f, seq)
        for d in applying:
            if not is_deletion_vector(d):
                scope[d.file_path].add(f.file_path)
        if not may_match(f):
            continue
        size = f.file_size_in_bytes
        candidate = (
            policy.rewrite_all
            or size < policy.min_file_size_bytes
            or size > policy.max_file_size_bytes
            or len(applying) >= policy.delete_file_threshold
        )
        if candidate:
            key = (f.spec_id, partition_key(f.partition))
            by_partition[key].append(RewriteTask(f, seq, applying))
    plan.candidate_files = sum(len(v) for v in by_partition.values())
    plan.delete_scope = {d.file_path: (d, frozenset(scope[d.file_path])) for d, _ in droppable}

    for (spec_id, _), tasks in sorted(by_partition.items(), key=lambda kv: repr(kv[0])):
        if not _worth_rewriting(tasks, policy):
            continue
        for bin_ in _bin_pack(tasks, policy.target_file_size_bytes):
            if len(bin_) == 1 and not _alone_worth_it(bin_[0], policy):
                continue
            plan.groups.append(FileGroup(spec_id, bin_[0].data_file.partition, bin_))
    return plan


def _scope(metadata: TableMetadata, where: BooleanExpression | None) -> Any:
    if where is None or isinstance(where, AlwaysTrue):
        return lambda f: True
    schema = metadata.schema()
    bind(schema, where)  # unknown columns fail here, named
    rows = MetricsEvaluator(schema, where, include_empty_files=True)
    tests: dict[int, Any] = {}

    def may_match(f: DataFile) -> bool:
        test = tests.get(f.spec_id)
        if test is None:
            spec = metadata.spec_by_id(f.spec_id)
            if spec is None:
                return True
            test = compile_row_filter(inclusive_projection(schema, spec)(where))
            tests[f.spec_id] = test
        return bool(test(f.partition)) and rows.eval(f)

    return may_match


def _worth_rewriting(tasks: list[RewriteTask], policy: CompactionPolicy) -> bool:
    if policy.rewrite_all or len(tasks) >= policy.min_input_files:
        return True
    if len(tasks) >= 2 and sum(t.data_file.file_size_in_bytes for t in tasks) >= (
        policy.target_file_size_bytes
    ):
        return True
    return any(_alone_worth_it(t, policy) for t in tasks)


def _alone_worth_it(task: RewriteTask, policy: CompactionPolicy) -> bool:
    """A single file is rewritten only to apply its deletes or to split it."""
    return (
        policy.rewrite_all
        or len(task.deletes) >= policy.delete_file_threshold
        or task.data_file.file_size_in_bytes > policy.max_file_size_bytes
    )


def _bin_pack(tasks: list[RewriteTask], target: int) -> list[list[RewriteTask]]:
    """First fit, largest first: few bins, none much above ``target``."""
    bins: list[tuple[int, list[RewriteTask]]] = []
    for t in sorted(tasks, key=lambda t: (-t.data_file.file_size_in_bytes, t.data_file.file_path)):
        size = t.data_file.file_size_in_bytes
        for i, (used, members) in enumerate(bins):
            if used + size <= target:
                members.append(t)
                bins[i] = (used + size, members)
                break
        else:
            bins.append((size, [t]))
    return [members for _, members in bins]


__all__ = [
    "DELETE_FILE_THRESHOLD",
    "MAX_FILE_SIZE_BYTES",
    "MIN_FILE_SIZE_BYTES",
    "MIN_INPUT_FILES",
    "CompactionPlan",
    "CompactionPolicy",
    "CompactionUnsupportedError",
    "FileGroup",
    "RewriteTask",
    "plan_compaction",
]
