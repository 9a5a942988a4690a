"""Which data files an overwrite removes: by filter, or by the partitions it replaces.

Why a module: an overwrite's filter is decided per file from partition values and column
metrics (inclusive and strict projections), on every base an attempt builds on; the snapshot
producer of the committer (:mod:`icefloe.coordinator.committer`) asks these two functions and
nothing else about it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from icefloe.errors import ValidationConflictError, ValidationError
from icefloe.expressions import BooleanExpression
from icefloe.expressions.binding import bind
from icefloe.expressions.evaluators import (
    MetricsEvaluator,
    StrictMetricsEvaluator,
    compile_row_filter,
)
from icefloe.expressions.projection import inclusive_projection, strict_projection
from icefloe.spec.datafile import DataFile, DataFileContent
from icefloe.spec.metadata import TableMetadata
from icefloe.table.commit_index import SUMMARY_COMMIT_IDS as SUMMARY_COMMIT_IDS
from icefloe.table.commit_index import summary_commit_ids as summary_commit_ids
from icefloe.table.snapshot_producer import FileFilter


def overwrite_filter(metadata: TableMetadata, expr: BooleanExpression) -> FileFilter:
    """Which live files an overwrite by ``expr`` removes.

    A file whose rows all match (by partition or by metrics) is removed; one that cannot
    hold a match is kept; a data file that may hold both refuses the overwrite, since
    removing it would drop rows the filter keeps.
    """
    schema = metadata.schema()
    bind(schema, expr)  # a filter naming unknown columns fails here, with the column named
    strict_rows = StrictMetricsEvaluator(schema, expr)
    may_rows = MetricsEvaluator(schema, expr, include_empty_files=True)
    per_spec: dict[int, tuple[Any, Any]] = {}

    def partition_tests(spec_id: int, base: TableMetadata) -> tuple[Any, Any]:
        tests = per_spec.get(spec_id)
        if tests is None:
            spec = base.spec_by_id(spec_id)
            if spec is None:
                raise ValidationError(f"partition spec {spec_id} is not a spec of the table")
            tests = (
                compile_row_filter(strict_projection(schema, spec)(expr)),
                compile_row_filter(inclusive_projection(schema, spec)(expr)),
            )
            per_spec[spec_id] = tests
        return tests

    def removes(data_file: DataFile, base: TableMetadata) -> bool:
        strict_part, may_part = partition_tests(data_file.spec_id, base)
        if strict_part(data_file.partition) or strict_rows.eval(data_file):
            return True
        if data_file.content != DataFileContent.DATA:
            return False
        if not may_part(data_file.partition) or not may_rows.eval(data_file):
            return False
        raise ValidationConflictError(
            f"data file {data_file.file_path} may hold rows both matching and not matching "
            "the overwrite filter; rewrite it before overwriting by this filter"
        )

    return removes


def replace_partitions_filter(added: Sequence[DataFile]) -> FileFilter:
    """Dynamic overwrite: remove every live file in a partition the new files write."""
    partitions = {(f.spec_id, f.partition) for f in added}

    def removes(data_file: DataFile, base: TableMetadata) -> bool:
        return (data_file.spec_id, data_file.partition) in partitions

    return removes
