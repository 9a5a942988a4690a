"""Partition specs (spec: "Partitioning", "Partition Evolution", Appendix C "Partition Specs").

A spec is pure metadata: it names, for each partition field, the source column, the
transform and the id under which the partition value is stored in manifests. Partition
values everywhere in icefloe are tuples in spec-field order, in the internal value
representation, so a spec is all that is needed to type them (:meth:`partition_type`) or
lay them out as a path (:meth:`partition_path`).

Parsing is lenient in the ways the spec asks readers to be (unknown transforms, v1 specs
without field ids, v3 ``source-ids``) and strict elsewhere. New specs are made with
:class:`PartitionSpecBuilder`, which applies the writer-side rules: default names, fresh
field ids above the table's ``last-partition-id``, reuse of ids from earlier specs, and
no redundant or colliding fields.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote_plus

from icefloe.errors import ValidationError
from icefloe.spec.schema import Schema
from icefloe.spec.transforms import (
    BucketTransform,
    DayTransform,
    HourTransform,
    IdentityTransform,
    MonthTransform,
    Transform,
    TruncateTransform,
    VoidTransform,
    YearTransform,
    bind_source,
    parse_transform,
    source_ids_from_json,
)
from icefloe.spec.types import IcebergType, NestedField, StructType, UnknownType

PARTITION_FIELD_ID_START = 1000
# ``last-partition-id`` of a table that never had a partition field.
UNASSIGNED_PARTITION_ID = PARTITION_FIELD_ID_START - 1
INITIAL_SPEC_ID = 0


def _json_int(obj: dict[str, Any], key: str, what: str) -> int:
    if key not in obj:
        raise ValidationError(f"{what} is missing required field {key!r}: {obj!r:.200}")
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(f"{what}: {key!r} must be an integer, got {value!r:.100}")
    return value


def _json_str(obj: dict[str, Any], key: str, what: str) -> str:
    if key not in obj:
        raise ValidationError(f"{what} is missing required field {key!r}: {obj!r:.200}")
    value = obj[key]
    if not isinstance(value, str):
        raise ValidationError(f"{what}: {key!r} must be a string, got {value!r:.100}")
    return value


@dataclass(frozen=True)
class PartitionField:
    """One partition field: ``transform(source column)`` stored under ``field_id``.

    ``source_ids`` is only set for multi-argument transforms read from v3 metadata (which
    are unknown here and carried through untouched); otherwise it is empty and
    ``source_id`` is the one source column.
    """

    source_id: int
    field_id: int
    name: str
    transform: Transform
    source_ids: tuple[int, ...] = field(default=(), kw_only=True)

    def __post_init__(self) -> None:
        if not isinstance(self.transform, Transform):
            raise ValidationError(
                f"partition field {self.name!r}: transform must be a Transform, got "
                f"{self.transform!r:.100}"
            )
        if not self.name:
            raise ValidationError(f"partition field {self.field_id} has an empty name")
        if self.source_ids and self.source_ids[0] != self.source_id:
            raise ValidationError(
                f"partition field {self.name!r}: source_id {self.source_id} must be the first "
                f"of source_ids {list(self.source_ids)}"
            )

    @property
    def all_source_ids(self) -> tuple[int, ...]:
        return self.source_ids or (self.source_id,)

    def to_json(self) -> dict[str, Any]:
        # source-id is always written (v1/v2 require it, v3 accepts it); source-ids only for
        # multi-argument transforms, as Appendix C asks.
        out: dict[str, Any] = {
            "name": self.name,
            "transform": str(self.transform),
            "source-id": self.source_id,
        }
        if len(self.source_ids) > 1:
            out["source-ids"] = list(self.source_ids)
        out["field-id"] = self.field_id
        return out

    @classmethod
    def from_json(cls, obj: Any, default_field_id: int | None = None) -> PartitionField:
        """Parse one field; ``default_field_id`` stands in for v1's missing ``field-id``."""
        if not isinstance(obj, dict):
            raise ValidationError(f"a partition field must be a JSON object, got {obj!r:.200}")
        name = _json_str(obj, "name", "partition field")
        what = f"partition field {name!r}"
        transform = parse_transform(_json_str(obj, "transform", what))
        source_ids = source_ids_from_json(obj, transform, what)
        if "field-id" in obj or default_field_id is None:
            field_id = _json_int(obj, "field-id", what)
        else:
            field_id = default_field_id
        return cls(
            source_ids[0],
            field_id,
            name,
            transform,
            source_ids=source_ids if len(source_ids) > 1 else (),
        )

    def __str__(self) -> str:
        sources = ", ".join(str(i) for i in self.all_source_ids)
        return f"{self.field_id}: {self.name}: {self.transform}({sources})"


@dataclass(frozen=True)
class PartitionSpec:
    """An immutable partition spec. ``fields`` may be given as any iterable of fields."""

    spec_id: int
    fields: tuple[PartitionField, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "fields", tuple(self.fields))
        if isinstance(self.spec_id, bool) or not isinstance(self.spec_id, int) or self.spec_id < 0:
            raise ValidationError(f"spec id must be a non-negative int, got {self.spec_id!r}")
        ids: dict[int, str] = {}
        names: set[str] = set()
        for f in self.fields:
            if not isinstance(f, PartitionField):
                raise ValidationError(
                    f"partition spec {self.spec_id}: fields must be PartitionFields, got {f!r:.100}"
                )
            if f.field_id in ids:
                raise ValidationError(
                    f"partition spec {self.spec_id}: field id {f.field_id} is used by both "
                    f"{ids[f.field_id]!r} and {f.name!r}"
                )
            if f.name in names:
                raise ValidationError(
                    f"partition spec {self.spec_id}: partition name {f.name!r} is used twice"
                )
            ids[f.field_id] = f.name
            names.add(f.name)

    # -- construction -------------------------------------------------------------------

    @classmethod
    def unpartitioned(cls) -> PartitionSpec:
        return cls(INITIAL_SPEC_ID, ())

    @classmethod
    def from_json(cls, obj: Any) -> PartitionSpec:
        """Parse Appendix C spec JSON.

        Also accepts a bare field list, the v1 ``partition-spec`` form, as spec 0. Fields
        without ``field-id`` (v1) get ids counting up from 1000, as the reference
        implementation assigned them.
        """
        fields: Any
        if isinstance(obj, list):
            spec_id, fields = INITIAL_SPEC_ID, obj
        elif isinstance(obj, dict):
            spec_id = _json_int(obj, "spec-id", "partition spec")
            fields = obj.get("fields")
            if not isinstance(fields, list):
                raise ValidationError(
                    f"partition spec {spec_id} is missing its 'fields' list: {obj!r:.200}"
                )
        else:
            raise ValidationError(
                f"a partition spec must be a JSON object or field list, got {obj!r:.200}"
            )
        parsed: list[PartitionField] = []
        last_id = UNASSIGNED_PARTITION_ID
        for f in fields:
            pf = PartitionField.from_json(f, default_field_id=last_id + 1)
            last_id = max(last_id, pf.field_id)
            parsed.append(pf)
        return cls(spec_id, tuple(parsed))

    def to_json(self) -> dict[str, Any]:
        return {"spec-id": self.spec_id, "fields": [f.to_json() for f in self.fields]}

    def fields_to_json(self) -> list[dict[str, Any]]:
        """The bare field list: the deprecated v1 ``partition-spec`` metadata field."""
        return [f.to_json() for f in self.fields]

    # -- properties -----------------------------------------------------------------------

    @property
    def is_unpartitioned(self) -> bool:
        """No fields, or only void ones: every file lands in the same (empty) partition."""
        return all(f.transform.is_void for f in self.fields)

    @property
    def is_partitioned(self) -> bool:
        return not self.is_unpartitioned

    @property
    def last_assigned_field_id(self) -> int:
        return max((f.field_id for f in self.fields), default=UNASSIGNED_PARTITION_ID)

    @property
    def has_unknown_transform(self) -> bool:
        """Whether a field uses a transform icefloe cannot apply: such specs are read-only."""
        return any(f.transform.is_unknown for f in self.fields)

    def field_by_id(self, field_id: int) -> PartitionField | None:
        for f in self.fields:
            if f.field_id == field_id:
                return f
        return None

    def fields_by_source_id(self, source_id: int) -> list[PartitionField]:
        """The fields that read a column: what a filter on that column can be projected to."""
        return [f for f in self.fields if source_id in f.all_source_ids]

    def compatible_with(self, other: PartitionSpec) -> bool:
        """The spec's equivalence: same fields (source ids, transform, name), ids aside.

        Writers must reuse an existing compatible spec rather than add a new one.
        """
        return len(self.fields) == len(other.fields) and all(
            a.all_source_ids == b.all_source_ids and a.transform == b.transform and a.name == b.name
            for a, b in zip(self.fields, other.fields)
        )

    # -- binding to a schema -------------------------------------------------------------

    def _what(self, f: PartitionField) -> str:
        return f"partition spec {self.spec_id} field {f.name!r} (id {f.field_id})"

    def check_compatible(self, schema: Schema) -> None:
        """Raise unless every field can be computed from ``schema``.

        Void fields are exempt (their source column may have been dropped since v1 tables
        replaced dropped fields by void), and unknown transforms are accepted as readers
        must tolerate them; applying one fails instead.
        """
        for f in self.fields:
            if f.transform.is_void:
                continue
            for source_id in f.all_source_ids:
                bind_source(schema, source_id, f.transform, self._what(f))

    def partition_type(self, schema: Schema) -> StructType:
        """The struct of partition values: id = field id, optional, transform result type.

        A source column that no longer exists (a void field of a v1 table, or an old spec
        after a drop) yields type ``unknown``, since nothing else can be derived for it.
        """
        fields: list[NestedField] = []
        for f in self.fields:
            source = schema.find_field(f.source_id)
            result: IcebergType
            if source is None:
                result = UnknownType()
            else:
                try:
                    result = f.transform.result_type(source.field_type)
                except ValidationError as e:
                    raise ValidationError(f"{self._what(f)}: {e}") from e
            fields.append(NestedField(f.field_id, f.name, result, required=False))
        return StructType(*fields)

    def partition_path(self, values: tuple[Any, ...], schema: Schema) -> str:
        """The Hive-style path of a partition tuple, e.g. ``ts_day=2017-11-16/id_bucket=3``.

        Names and values are escaped as Java's URLEncoder does (space as ``+``), so paths
        match those written by the reference implementation and PyIceberg.
        """
        if not isinstance(values, tuple) or len(values) != len(self.fields):
            count = len(values) if isinstance(values, (tuple, list)) else "?"
            raise ValidationError(
                f"partition spec {self.spec_id} has {len(self.fields)} fields but the partition "
                f"value has {count}: {values!r:.200}"
            )
        struct = self.partition_type(schema)
        parts = []
        for f, nf, value in zip(self.fields, struct.fields, values):
            try:
                human = f.transform.to_human_string(nf.field_type, value)
            except ValidationError as e:
                raise ValidationError(f"{self._what(f)}: cannot format {value!r:.60}: {e}") from e
            parts.append(f"{quote_plus(f.name, safe='')}={quote_plus(human, safe='')}")
        return "/".join(parts)

    def __str__(self) -> str:
        if not self.fields:
            return f"[] (spec {self.spec_id})"
        body = "\n".join(f"  {f}" for f in self.fields)
        return f"[  # spec {self.spec_id}\n{body}\n]"


def default_partition_name(source_name: str, transform: Transform) -> str:
    """The name the reference implementation gives a field when none is chosen."""
    if isinstance(transform, IdentityTransform):
        return source_name
    if isinstance(transform, BucketTransform):
        return f"{source_name}_bucket"
    if isinstance(transform, TruncateTransform):
        return f"{source_name}_trunc"
    if isinstance(transform, YearTransform):
        return f"{source_name}_year"
    if isinstance(transform, MonthTransform):
        return f"{source_name}_month"
    if isinstance(transform, DayTransform):
        return f"{source_name}_day"
    if isinstance(transform, HourTransform):
        return f"{source_name}_hour"
    if isinstance(transform, VoidTransform):
        return f"{source_name}_null"
    raise ValidationError(f"no default partition name for transform {transform}; pass a name")


class PartitionSpecBuilder:
    """Builds a new partition spec for a table, following the writer rules of the spec.

    ``last_partition_id`` is the table's ``last-partition-id`` (999 for a new table); new
    fields get ids above it. ``previous_specs`` are the table's existing specs: a field
    with the same source and transform as an earlier field (and the same name, when one is
    given) takes that field's id, so manifests of all specs agree on what an id means.
    After :meth:`build`, :attr:`last_partition_id` is the value to store in the metadata.
    """

    def __init__(
        self,
        schema: Schema,
        spec_id: int = INITIAL_SPEC_ID,
        last_partition_id: int = UNASSIGNED_PARTITION_ID,
        *,
        previous_specs: Iterable[PartitionSpec] = (),
    ) -> None:
        self._schema = schema
        self._spec_id = spec_id
        self._last_partition_id = max(last_partition_id, UNASSIGNED_PARTITION_ID)
        # Latest spec first: its fields win when history holds several candidates.
        self._history = [
            f
            for spec in sorted(previous_specs, key=lambda s: s.spec_id, reverse=True)
            for f in spec.fields
        ]
        self._fields: list[PartitionField] = []
        self._dedup: dict[tuple[int, str], PartitionField] = {}

    @property
    def last_partition_id(self) -> int:
        return self._last_partition_id

    def add_field(
        self, source: str | int, transform: Transform | str, name: str | None = None
    ) -> PartitionSpecBuilder:
        """Add ``transform(source)``; ``source`` is a column name (dotted for nested) or id."""
        t = parse_transform(transform) if isinstance(transform, str) else transform
        if t.is_unknown:
            raise ValidationError(
                f"cannot partition by unknown transform {t}: writers must not use it"
            )
        source_id, source_name = self._resolve(source)
        what = f"partition field {name or default_partition_name(source_name, t)!r}"
        bind_source(self._schema, source_id, t, what)
        if name is not None and not name:
            raise ValidationError(f"partition field on {source_name!r} has an empty name")

        reused = self._reusable(source_id, t, name)
        if reused is not None:
            new_field = reused
        else:
            new_field = PartitionField(
                source_id,
                self._last_partition_id + 1,
                name if name is not None else default_partition_name(source_name, t),
                t,
            )
        self._check_name(new_field, source_name)
        self._check_redundant(new_field)
        if any(f.field_id == new_field.field_id for f in self._fields):
            raise ValidationError(
                f"partition field {new_field.name!r} would reuse field id {new_field.field_id}, "
                "already taken in this spec"
            )
        if reused is None:
            self._last_partition_id = new_field.field_id
        self._fields.append(new_field)
        return self

    def build(self) -> PartitionSpec:
        spec = PartitionSpec(self._spec_id, tuple(self._fields))
        spec.check_compatible(self._schema)
        return spec

    # -- rules ----------------------------------------------------------------------------

    def _resolve(self, source: str | int) -> tuple[int, str]:
        if isinstance(source, bool) or not isinstance(source, (str, int)):
            raise ValidationError(f"a partition source must be a column name or id, got {source!r}")
        f = self._schema.find_field(source)
        if f is None:
            what = f"id {source}" if isinstance(source, int) else repr(source)
            raise ValidationError(
                f"cannot partition by column {what}: schema {self._schema.schema_id} has no "
                "such column"
            )
        name = self._schema.find_column_name(f.field_id)
        assert name is not None  # every field found by id has a path
        return f.field_id, name

    def _reusable(self, source_id: int, t: Transform, name: str | None) -> PartitionField | None:
        for f in self._history:
            if (
                f.source_id == source_id
                and not f.source_ids
                and f.transform == t
                and (name is None or f.name == name)
            ):
                return f
        return None

    def _check_name(self, new_field: PartitionField, source_name: str) -> None:
        if any(f.name == new_field.name for f in self._fields):
            raise ValidationError(
                f"partition name {new_field.name!r} is used more than once; pass a distinct name"
            )
        column = self._schema.find_field(new_field.name)
        if column is None:
            return
        if isinstance(new_field.transform, IdentityTransform):
            if column.field_id != new_field.source_id:
                raise ValidationError(
                    f"identity partition {new_field.name!r} on column {source_name!r} has the "
                    f"name of another column; name it after {source_name!r} or something unused"
                )
            return
        raise ValidationError(
            f"partition name {new_field.name!r} ({new_field.transform} of {source_name!r}) is "
            "the name of a table column; only an identity partition may share it"
        )

    def _check_redundant(self, new_field: PartitionField) -> None:
        if new_field.transform.is_void:
            return  # void fields mark dropped fields in v1 and may repeat
        key = (new_field.source_id, new_field.transform.dedup_name)
        existing = self._dedup.get(key)
        if existing is not None:
            raise ValidationError(
                f"partition field {new_field.name!r} ({new_field.transform}) is redundant with "
                f"{existing.name!r} ({existing.transform}) on the same column"
            )
        self._dedup[key] = new_field


# day(ts) | bucket(16, id) | truncate(4, name) | id
_PARTITION_TERM = re.compile(r"^\s*(\w+)\s*\(\s*(?:(\d+)\s*,\s*)?([\w.]+)\s*\)\s*$")


def parse_partition_spec(terms: Iterable[str], schema: Schema) -> PartitionSpec:
    """Build a spec from Spark-style terms: ``day(ts)``, ``bucket(16, id)``, ``id`` (the
    CLI's ``--partition-by`` and the Spark API's ``partition_by``)."""
    builder = PartitionSpecBuilder(schema)
    for term in terms:
        m = _PARTITION_TERM.match(term)
        if m is None:
            builder.add_field(term.strip(), "identity")
            continue
        name, width, column = m.groups()
        name = name.lower()
        if name in ("bucket", "truncate"):
            if width is None:
                raise ValidationError(f"partition term {term!r} needs a width: {name}(N, column)")
            builder.add_field(column, f"{name}[{width}]")
        elif name in ("year", "month", "day", "hour", "identity", "void"):
            builder.add_field(column, name)
        elif name in ("years", "months", "days", "hours"):
            builder.add_field(column, name[:-1])
        else:
            raise ValidationError(f"unknown partition transform {name!r} in {term!r}")
    return builder.build()


__all__ = [
    "INITIAL_SPEC_ID",
    "PARTITION_FIELD_ID_START",
    "UNASSIGNED_PARTITION_ID",
    "PartitionField",
    "PartitionSpec",
    "PartitionSpecBuilder",
    "default_partition_name",
    "parse_partition_spec",
]
