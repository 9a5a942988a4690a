"""Sort orders (spec: "Sorting", Appendix C "Sort Orders").

A sort order declares how rows are ordered inside data files; files record the id of the
order they satisfy, so the table keeps every order it ever declared. Order id 0 is
reserved for "unsorted" and is the only order without fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from icefloe.errors import ValidationError
from icefloe.spec.schema import Schema
from icefloe.spec.transforms import (
    Transform,
    bind_source,
    parse_transform,
    source_ids_from_json,
)

UNSORTED_ORDER_ID = 0
INITIAL_SORT_ORDER_ID = 1


def _parse_enum_name(text: Any, key: str, what: str) -> str:
    if not isinstance(text, str):
        raise ValidationError(f"{what}: {key!r} must be a string, got {text!r:.100}")
    # The reference implementation accepts ASC, nulls_first, NULLS-LAST, ...
    return text.strip().lower().replace("_", "-")


class SortDirection(StrEnum):
    ASC = "asc"
    DESC = "desc"

    @classmethod
    def parse(cls, text: Any, what: str = "sort field") -> SortDirection:
        name = _parse_enum_name(text, "direction", what)
        try:
            return cls(name)
        except ValueError:
            raise ValidationError(
                f"{what}: direction must be 'asc' or 'desc', got {text!r}"
            ) from None


class NullOrder(StrEnum):
    NULLS_FIRST = "nulls-first"
    NULLS_LAST = "nulls-last"

    @classmethod
    def parse(cls, text: Any, what: str = "sort field") -> NullOrder:
        name = _parse_enum_name(text, "null-order", what)
        try:
            return cls(name)
        except ValueError:
            raise ValidationError(
                f"{what}: null-order must be 'nulls-first' or 'nulls-last', got {text!r}"
            ) from None


@dataclass(frozen=True)
class SortField:
    """``transform(source column)`` sorted in ``direction`` with nulls per ``null_order``.

    ``source_ids`` is set only for multi-argument transforms read from v3 metadata (unknown
    here, carried through); otherwise empty.
    """

    source_id: int
    transform: Transform
    direction: SortDirection
    null_order: NullOrder
    source_ids: tuple[int, ...] = field(default=(), kw_only=True)

    def __post_init__(self) -> None:
        if not isinstance(self.transform, Transform):
            raise ValidationError(
                f"sort field on column id {self.source_id}: transform must be a Transform, "
                f"got {self.transform!r:.100}"
            )
        # Accept the JSON spellings too, so SortField(1, t, "asc", "nulls-first") works.
        object.__setattr__(self, "direction", SortDirection.parse(self.direction))
        object.__setattr__(self, "null_order", NullOrder.parse(self.null_order))
        if self.source_ids and self.source_ids[0] != self.source_id:
            raise ValidationError(
                f"sort field: source_id {self.source_id} must be the first of source_ids "
                f"{list(self.source_ids)}"
            )

    @property
    def all_source_ids(self) -> tuple[int, ...]:
        return self.source_ids or (self.source_id,)

    def satisfies(self, other: SortField) -> bool:
        """Whether rows sorted by this field are also sorted by ``other``."""
        return (
            self.all_source_ids == other.all_source_ids
            and self.direction == other.direction
            and self.null_order == other.null_order
            and self.transform.satisfies_order_of(other.transform)
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"transform": str(self.transform), "source-id": self.source_id}
        if len(self.source_ids) > 1:
            out["source-ids"] = list(self.source_ids)
        out["direction"] = self.direction.value
        out["null-order"] = self.null_order.value
        return out

    @classmethod
    def from_json(cls, obj: Any) -> SortField:
        if not isinstance(obj, dict):
            raise ValidationError(f"a sort field must be a JSON object, got {obj!r:.200}")
        what = "sort field"
        for key in ("transform", "direction", "null-order"):
            if key not in obj:
                raise ValidationError(f"{what} is missing required field {key!r}: {obj!r:.200}")
        text = obj["transform"]
        if not isinstance(text, str):
            raise ValidationError(f"{what}: 'transform' must be a string, got {text!r:.100}")
        transform = parse_transform(text)
        source_ids = source_ids_from_json(obj, transform, what)
        what = f"sort field on column id {source_ids[0]}"
        return cls(
            source_ids[0],
            transform,
            SortDirection.parse(obj["direction"], what),
            NullOrder.parse(obj["null-order"], what),
            source_ids=source_ids if len(source_ids) > 1 else (),
        )

    def __str__(self) -> str:
        sources = ", ".join(str(i) for i in self.all_source_ids)
        return f"{self.transform}({sources}) {self.direction.value} {self.null_order.value}"


@dataclass(frozen=True)
class SortOrder:
    """An immutable sort order; ``fields`` may be given as any iterable of sort fields."""

    order_id: int
    fields: tuple[SortField, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "fields", tuple(self.fields))
        oid = self.order_id
        if isinstance(oid, bool) or not isinstance(oid, int) or oid < 0:
            raise ValidationError(f"sort order id must be a non-negative int, got {oid!r}")
        for f in self.fields:
            if not isinstance(f, SortField):
                raise ValidationError(
                    f"sort order {oid}: fields must be SortFields, got {f!r:.100}"
                )
        if oid == UNSORTED_ORDER_ID and self.fields:
            raise ValidationError(
                f"sort order id {UNSORTED_ORDER_ID} is reserved for the unsorted order but "
                f"has {len(self.fields)} fields; give the order another id"
            )
        if oid != UNSORTED_ORDER_ID and not self.fields:
            raise ValidationError(
                f"sort order {oid} has no fields; the unsorted order must use id "
                f"{UNSORTED_ORDER_ID}"
            )

    @classmethod
    def unsorted(cls) -> SortOrder:
        return cls(UNSORTED_ORDER_ID, ())

    @property
    def is_unsorted(self) -> bool:
        return not self.fields

    @property
    def has_unknown_transform(self) -> bool:
        return any(f.transform.is_unknown for f in self.fields)

    def same_order(self, other: SortOrder) -> bool:
        """Equal apart from the id: used to reuse an existing order instead of adding one."""
        return self.fields == other.fields

    def satisfies(self, other: SortOrder) -> bool:
        """Whether data sorted by this order is also sorted by ``other``.

        True when ``other`` is unsorted or a prefix of this order, field by field, allowing
        finer transforms to satisfy coarser ones (``hour`` satisfies ``day``).
        """
        if len(other.fields) > len(self.fields):
            return False
        return all(mine.satisfies(theirs) for mine, theirs in zip(self.fields, other.fields))

    def check_compatible(self, schema: Schema) -> None:
        """Raise unless every field's source column exists and suits its transform.

        Unknown transforms are accepted (readers must tolerate them); applying one fails.
        """
        for f in self.fields:
            what = f"sort order {self.order_id} field {f}"
            for source_id in f.all_source_ids:
                bind_source(schema, source_id, f.transform, what)

    def to_json(self) -> dict[str, Any]:
        return {"order-id": self.order_id, "fields": [f.to_json() for f in self.fields]}

    @classmethod
    def from_json(cls, obj: Any) -> SortOrder:
        if not isinstance(obj, dict):
            raise ValidationError(f"a sort order must be a JSON object, got {obj!r:.200}")
        if "order-id" not in obj:
            raise ValidationError(f"sort order is missing required field 'order-id': {obj!r:.200}")
        oid = obj["order-id"]
        if isinstance(oid, bool) or not isinstance(oid, int):
            raise ValidationError(f"sort order 'order-id' must be an integer, got {oid!r:.100}")
        fields = obj.get("fields")
        if not isinstance(fields, list):
            raise ValidationError(f"sort order {oid} is missing its 'fields' list: {obj!r:.200}")
        return cls(oid, tuple(SortField.from_json(f) for f in fields))

    def __str__(self) -> str:
        if not self.fields:
            return "unsorted"
        return f"[  # order {self.order_id}\n" + "\n".join(f"  {f}" for f in self.fields) + "\n]"


class SortOrderBuilder:
    """Builds a sort order by column name, checking each field against the schema."""

    def __init__(self, schema: Schema, order_id: int = INITIAL_SORT_ORDER_ID) -> None:
        self._schema = schema
        self._order_id = order_id
        self._fields: list[SortField] = []

    def asc(
        self,
        source: str | int,
        transform: Transform | str = "identity",
        null_order: NullOrder | str = NullOrder.NULLS_FIRST,
    ) -> SortOrderBuilder:
        """Ascending; nulls first by default, as in the reference implementation."""
        return self._add(source, transform, SortDirection.ASC, null_order)

    def desc(
        self,
        source: str | int,
        transform: Transform | str = "identity",
        null_order: NullOrder | str = NullOrder.NULLS_LAST,
    ) -> SortOrderBuilder:
        """Descending; nulls last by default, as in the reference implementation."""
        return self._add(source, transform, SortDirection.DESC, null_order)

    def _add(
        self,
        source: str | int,
        transform: Transform | str,
        direction: SortDirection,
        null_order: NullOrder | str,
    ) -> SortOrderBuilder:
        t = parse_transform(transform) if isinstance(transform, str) else transform
        if t.is_unknown:
            raise ValidationError(f"cannot sort by unknown transform {t}: writers must not use it")
        if isinstance(source, bool) or not isinstance(source, (str, int)):
            raise ValidationError(f"a sort source must be a column name or id, got {source!r}")
        column = self._schema.find_field(source)
        if column is None:
            what = f"id {source}" if isinstance(source, int) else repr(source)
            raise ValidationError(
                f"cannot sort by column {what}: schema {self._schema.schema_id} has no such column"
            )
        bind_source(self._schema, column.field_id, t, f"sort field {t}({source})")
        self._fields.append(SortField(column.field_id, t, direction, NullOrder.parse(null_order)))
        return self

    def build(self) -> SortOrder:
        if not self._fields:
            return SortOrder.unsorted()
        return SortOrder(self._order_id, tuple(self._fields))


__all__ = [
    "INITIAL_SORT_ORDER_ID",
    "UNSORTED_ORDER_ID",
    "NullOrder",
    "SortDirection",
    "SortField",
    "SortOrder",
    "SortOrderBuilder",
]
