"""Content files: the ``data_file`` struct of a manifest entry (spec: "Data File Fields").

One record type serves data files, position deletes and equality deletes, as in the spec.
It is what writers produce, what events carry, what manifests store and what the planner
returns, so it lives on its own with no IO and no Avro.

``partition`` is a tuple of partition values in the order of the partition spec's fields,
in the internal value representation (see :mod:`icefloe.spec.types`): a tuple hashes, so files
can be grouped by partition cheaply. Bounds are kept in their binary single-value form
(Appendix D) exactly as read, because decoding them needs the schema at write time.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import IntEnum
from typing import Any

from icefloe.errors import ValidationError


class DataFileContent(IntEnum):
    DATA = 0
    POSITION_DELETES = 1
    EQUALITY_DELETES = 2


class FileFormat:
    """File format names as the spec spells them in manifests (lower case)."""

    AVRO = "avro"
    ORC = "orc"
    PARQUET = "parquet"
    PUFFIN = "puffin"
    ALL = frozenset({AVRO, ORC, PARQUET, PUFFIN})

    @classmethod
    def parse(cls, name: str) -> str:
        normalized = name.lower()
        if normalized not in cls.ALL:
            raise ValidationError(
                f"unknown file format {name!r}; expected one of {sorted(cls.ALL)}"
            )
        return normalized


@dataclass(slots=True)
class DataFile:
    """A data or delete file with its partition tuple and column metrics."""

    file_path: str
    file_format: str
    partition: tuple[Any, ...]
    record_count: int
    file_size_in_bytes: int
    content: DataFileContent = DataFileContent.DATA
    spec_id: int = 0
    column_sizes: dict[int, int] | None = None
    value_counts: dict[int, int] | None = None
    null_value_counts: dict[int, int] | None = None
    nan_value_counts: dict[int, int] | None = None
    lower_bounds: dict[int, bytes] | None = None
    upper_bounds: dict[int, bytes] | None = None
    key_metadata: bytes | None = None
    split_offsets: list[int] | None = None
    equality_ids: list[int] | None = None
    sort_order_id: int | None = None
    first_row_id: int | None = None
    referenced_data_file: str | None = None
    content_offset: int | None = None
    content_size_in_bytes: int | None = None
    # Writer-side annotations that are not part of the manifest struct.
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def copy(self, **changes: Any) -> DataFile:
        return replace(self, **changes)

    def validate(self) -> None:
        """Check the invariants any writer must hold; raise naming the file and field."""

        def bad(what: str) -> ValidationError:
            return ValidationError(f"data file {self.file_path!r}: {what}")

        if not self.file_path:
            raise ValidationError("data file has an empty file_path")
        if self.record_count < 0:
            raise bad(f"record_count is negative ({self.record_count})")
        if self.file_size_in_bytes < 0:
            raise bad(f"file_size_in_bytes is negative ({self.file_size_in_bytes})")
        for name in ("column_sizes", "value_counts", "null_value_counts", "nan_value_counts"):
            counts = getattr(self, name)
            if counts:
                for fid, n in counts.items():
                    if n < 0:
                        raise bad(f"{name}[{fid}] is negative ({n})")
        if self.value_counts and self.null_value_counts:
            for fid, nulls in self.null_value_counts.items():
                total = self.value_counts.get(fid)
                if total is not None and nulls > total:
                    raise bad(
                        f"null_value_counts[{fid}]={nulls} exceeds value_counts[{fid}]={total}"
                    )
        if self.content == DataFileContent.EQUALITY_DELETES and not self.equality_ids:
            raise bad("equality delete files must list equality_ids")
        if self.split_offsets and any(
            b < a for a, b in zip(self.split_offsets, self.split_offsets[1:])
        ):
            raise bad("split_offsets must be sorted ascending")
