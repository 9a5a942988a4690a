"""Terms: what a predicate tests, a column or a transform of one, unbound or bound.

Unbound terms name a column (by name, or by field id so stored filters survive renames) as
the caller wrote it. Binding (:mod:`icefloe.expressions.binding`) resolves them against a schema into
bound terms that carry the field, its type and an :class:`Accessor` compiled to read the
value out of a row, so evaluators never look a column up per row.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

from icefloe.errors import ValidationError
from icefloe.spec.transforms import Transform, parse_transform
from icefloe.spec.types import DoubleType, FloatType, IcebergType, NestedField


class Term:
    """What a predicate tests: a column reference or a transform of one."""

    __slots__ = ()


class UnboundTerm(Term):
    __slots__ = ()


class BoundTerm(Term):
    """A term resolved against a schema: knows its result type and how to read a row."""

    __slots__ = ()

    @property
    @abstractmethod
    def ref(self) -> BoundReference: ...

    @property
    @abstractmethod
    def result_type(self) -> IcebergType: ...

    @property
    @abstractmethod
    def nullable(self) -> bool:
        """Whether the term can evaluate to null for some row."""

    @property
    def may_be_nan(self) -> bool:
        return isinstance(self.result_type, FloatType | DoubleType)


class Reference(UnboundTerm):
    """A column by (dotted) name, resolved when bound."""

    __slots__ = ("name",)
    name: str

    def __init__(self, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise ValidationError(f"a column reference needs a non-empty name, got {name!r}")
        object.__setattr__(self, "name", name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("references are immutable")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Reference) and other.name == self.name

    def __hash__(self) -> int:
        return hash(("ref", self.name))

    def __repr__(self) -> str:
        return f"Reference({self.name!r})"

    def __str__(self) -> str:
        return self.name


class IdReference(UnboundTerm):
    """A column by field id: how stored expressions survive column renames."""

    __slots__ = ("field_id",)
    field_id: int

    def __init__(self, field_id: int) -> None:
        if isinstance(field_id, bool) or not isinstance(field_id, int):
            raise ValidationError(f"a field id reference needs an int id, got {field_id!r}")
        object.__setattr__(self, "field_id", field_id)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("references are immutable")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, IdReference) and other.field_id == self.field_id

    def __hash__(self) -> int:
        return hash(("id-ref", self.field_id))

    def __repr__(self) -> str:
        return f"IdReference({self.field_id})"

    def __str__(self) -> str:
        return f"#{self.field_id}"


class TransformTerm(UnboundTerm):
    """A partition transform applied to a column, such as ``bucket[16](id)``."""

    __slots__ = ("term", "transform")
    transform: Transform
    term: Reference | IdReference

    def __init__(self, transform: Transform | str, term: Reference | IdReference | str) -> None:
        if isinstance(transform, str):
            transform = parse_transform(transform)
        if isinstance(term, str):
            term = Reference(term)
        if not isinstance(term, Reference | IdReference):
            raise ValidationError(f"a transform applies to a column reference, got {term!r}")
        object.__setattr__(self, "transform", transform)
        object.__setattr__(self, "term", term)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("terms are immutable")

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, TransformTerm)
            and other.transform == self.transform
            and other.term == self.term
        )

    def __hash__(self) -> int:
        return hash(("transform", self.transform, self.term))

    def __repr__(self) -> str:
        return f"TransformTerm({self.transform!r}, {self.term!r})"

    def __str__(self) -> str:
        return f"{self.transform}({self.term})"


class Accessor:
    """Reads one field from a row given as nested tuples (struct values are tuples).

    ``positions`` is the path of struct positions from the row to the field. A null struct
    on the way yields null, as the field is then absent from the row.
    """

    __slots__ = ("get", "positions")
    positions: tuple[int, ...]
    get: Callable[[Sequence[Any]], Any]

    def __init__(self, positions: Sequence[int]) -> None:
        path = tuple(positions)
        if not path:
            raise ValidationError("an accessor needs at least one position")
        object.__setattr__(self, "positions", path)
        object.__setattr__(self, "get", _compile_accessor(path))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("accessors are immutable")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Accessor) and other.positions == self.positions

    def __hash__(self) -> int:
        return hash(self.positions)

    def __repr__(self) -> str:
        return f"Accessor({list(self.positions)})"


def _compile_accessor(path: tuple[int, ...]) -> Callable[[Sequence[Any]], Any]:
    if len(path) == 1:
        pos = path[0]

        def get_one(row: Sequence[Any]) -> Any:
            return row[pos]

        return get_one
    *parents, last = path

    def get_nested(row: Sequence[Any]) -> Any:
        value: Any = row
        for pos in parents:
            value = value[pos]
            if value is None:
                return None
        return value[last]

    return get_nested


class BoundReference(BoundTerm):
    """A column resolved to its schema field.

    ``accessor`` is None for columns inside a list or a map: they have no single value per
    row (and no usable bounds), so row evaluators refuse them and metrics evaluators treat
    them as unknown.
    """

    __slots__ = ("_nullable", "accessor", "field", "name")
    field: NestedField
    name: str
    accessor: Accessor | None
    _nullable: bool

    def __init__(
        self,
        field: NestedField,
        accessor: Accessor | None,
        name: str | None = None,
        nullable: bool | None = None,
    ) -> None:
        object.__setattr__(self, "field", field)
        object.__setattr__(self, "name", field.name if name is None else name)
        object.__setattr__(self, "accessor", accessor)
        object.__setattr__(self, "_nullable", field.optional if nullable is None else nullable)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("references are immutable")

    @property
    def ref(self) -> BoundReference:
        return self

    @property
    def field_id(self) -> int:
        return self.field.field_id

    @property
    def field_type(self) -> IcebergType:
        return self.field.field_type

    @property
    def result_type(self) -> IcebergType:
        return self.field.field_type

    @property
    def nullable(self) -> bool:
        """Optional, or inside an optional struct (whose nullness hides the field)."""
        return self._nullable

    @property
    def in_list_or_map(self) -> bool:
        return self.accessor is None

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, BoundReference)
            and other.field == self.field
            and other.name == self.name
            and other.accessor == self.accessor
            and other._nullable == self._nullable
        )

    def __hash__(self) -> int:
        return hash(("bound-ref", self.field.field_id, self.name))

    def __repr__(self) -> str:
        return f"BoundReference({self.name!r}, id={self.field_id}, {self.field_type})"

    def __str__(self) -> str:
        return self.name


class BoundTransform(BoundTerm):
    """A transform applied to a bound column; ``result_type`` is the transform's result."""

    __slots__ = ("_result_type", "reference", "transform")
    transform: Transform
    reference: BoundReference
    _result_type: IcebergType

    def __init__(self, transform: Transform, reference: BoundReference) -> None:
        if not transform.can_transform(reference.field_type) or transform.is_unknown:
            raise ValidationError(
                f"transform {transform} cannot be applied to column {reference.name!r} "
                f"of type {reference.field_type}"
            )
        object.__setattr__(self, "transform", transform)
        object.__setattr__(self, "reference", reference)
        object.__setattr__(self, "_result_type", transform.result_type(reference.field_type))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("terms are immutable")

    @property
    def ref(self) -> BoundReference:
        return self.reference

    @property
    def result_type(self) -> IcebergType:
        return self._result_type

    @property
    def nullable(self) -> bool:
        return self.reference.nullable or self.transform.is_void

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, BoundTransform)
            and other.transform == self.transform
            and other.reference == self.reference
        )

    def __hash__(self) -> int:
        return hash(("bound-transform", self.transform, self.reference))

    def __repr__(self) -> str:
        return f"BoundTransform({self.transform!r}, {self.reference!r})"

    def __str__(self) -> str:
        return f"{self.transform}({self.reference.name})"


__all__ = [
    "Accessor",
    "BoundReference",
    "BoundTerm",
    "BoundTransform",
    "IdReference",
    "Reference",
    "Term",
    "TransformTerm",
    "UnboundTerm",
]
