"""Iceberg filter expressions: an immutable model of predicates over table columns.

Expressions start *unbound*: they name columns (``Reference("ts")``) and carry literals as the
caller wrote them. :mod:`icefloe.binding` resolves them against a schema into *bound*
expressions whose terms know the field id, type and row position and whose literals are
already converted to the column's internal representation (see :mod:`icefloe.types`), so
evaluators never convert or look anything up per row or per file.

Semantics follow the expressions spec: two-valued, null-safe logic. ``x < 5`` is false for a
null or NaN ``x``, ``x != 5`` is true for a null ``x``, and ``NOT`` is an exact complement.
The last point matters for :func:`rewrite_not`: ``NOT (x < 5)`` is *not* ``x >= 5`` (a null
row matches the former only), so a bound order comparison negates to
``x >= 5 OR x IS NULL [OR x IS NaN]``. Unbound order comparisons cannot know whether their
column is nullable or floating point, so they keep their ``Not`` until they are bound.

The constructors of ``And``, ``Or`` and ``Not`` simplify on the spot (``And(x, AlwaysTrue())``
is ``x``), which keeps projected and residual filters small without a separate pass.
"""

from __future__ import annotations

import datetime as dt
import math
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from decimal import Decimal
from enum import Enum
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from icefloe.errors import ValidationError
from icefloe.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    IcebergType,
    NestedField,
    PrimitiveType,
    StringType,
    TimestampType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

if TYPE_CHECKING:
    from icefloe.transforms import Transform

T = TypeVar("T")


# ---------------------------------------------------------------------------------------------
# Operations
# ---------------------------------------------------------------------------------------------


class Operation(Enum):
    """Predicate operations, valued by their JSON ``type`` names."""

    IS_NULL = "is-null"
    NOT_NULL = "not-null"
    IS_NAN = "is-nan"
    NOT_NAN = "not-nan"
    LT = "lt"
    LT_EQ = "lt-eq"
    GT = "gt"
    GT_EQ = "gt-eq"
    EQ = "eq"
    NOT_EQ = "not-eq"
    STARTS_WITH = "starts-with"
    NOT_STARTS_WITH = "not-starts-with"
    IN = "in"
    NOT_IN = "not-in"

    @property
    def is_unary(self) -> bool:
        return self in _UNARY_OPS

    @property
    def is_literal(self) -> bool:
        """Whether the operation compares its term with exactly one literal."""
        return self in _LITERAL_OPS

    @property
    def is_set(self) -> bool:
        return self is Operation.IN or self is Operation.NOT_IN

    @property
    def is_order(self) -> bool:
        """lt, lt-eq, gt, gt-eq: the operations whose negation must also admit nulls/NaNs."""
        return self in _ORDER_OPS

    @property
    def complement(self) -> Operation | None:
        """The exact two-valued complement, or None for order comparisons (see module doc)."""
        return _COMPLEMENT.get(self)

    @property
    def order_negation(self) -> Operation:
        """For order comparisons: the comparison that holds for exactly the other non-null,
        non-NaN values (``lt`` → ``gt-eq``)."""
        return _ORDER_NEGATION[self]

    @property
    def flipped(self) -> Operation | None:
        """The operation with its operands swapped (``5 < x`` is ``x > 5``), if there is one."""
        return _FLIPPED.get(self)

    @classmethod
    def from_json(cls, name: str) -> Operation:
        try:
            return cls(name)
        except ValueError:
            raise ValidationError(
                f"unknown predicate type {name!r}; expected one of {[op.value for op in cls]}"
            ) from None

    def __str__(self) -> str:
        return self.value


_UNARY_OPS = frozenset({Operation.IS_NULL, Operation.NOT_NULL, Operation.IS_NAN, Operation.NOT_NAN})
_ORDER_OPS = frozenset({Operation.LT, Operation.LT_EQ, Operation.GT, Operation.GT_EQ})
_LITERAL_OPS = _ORDER_OPS | {
    Operation.EQ,
    Operation.NOT_EQ,
    Operation.STARTS_WITH,
    Operation.NOT_STARTS_WITH,
}
_COMPLEMENT = {
    Operation.IS_NULL: Operation.NOT_NULL,
    Operation.NOT_NULL: Operation.IS_NULL,
    Operation.IS_NAN: Operation.NOT_NAN,
    Operation.NOT_NAN: Operation.IS_NAN,
    Operation.EQ: Operation.NOT_EQ,
    Operation.NOT_EQ: Operation.EQ,
    Operation.STARTS_WITH: Operation.NOT_STARTS_WITH,
    Operation.NOT_STARTS_WITH: Operation.STARTS_WITH,
    Operation.IN: Operation.NOT_IN,
    Operation.NOT_IN: Operation.IN,
}
_ORDER_NEGATION = {
    Operation.LT: Operation.GT_EQ,
    Operation.LT_EQ: Operation.GT,
    Operation.GT: Operation.LT_EQ,
    Operation.GT_EQ: Operation.LT,
}
_FLIPPED = {
    Operation.LT: Operation.GT,
    Operation.LT_EQ: Operation.GT_EQ,
    Operation.GT: Operation.LT,
    Operation.GT_EQ: Operation.LT_EQ,
    Operation.EQ: Operation.EQ,
    Operation.NOT_EQ: Operation.NOT_EQ,
}


# ---------------------------------------------------------------------------------------------
# Literals
# ---------------------------------------------------------------------------------------------

_EPOCH_ORDINAL = dt.date(1970, 1, 1).toordinal()
_EPOCH_NAIVE = dt.datetime(1970, 1, 1)
_EPOCH_UTC = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _micros(delta: dt.timedelta) -> int:
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _infer(value: Any) -> tuple[Any, PrimitiveType | None]:
    """(internal value, type) of a Python value; type None for JSON-native int/float/str."""
    if isinstance(value, bool):
        return value, BooleanType()
    if isinstance(value, int | str):
        return value, None
    if isinstance(value, float):
        if math.isnan(value):
            raise ValidationError("a literal cannot be NaN: use is-nan / not-nan instead")
        return value, None
    if isinstance(value, Decimal):
        _, digits, exponent = value.as_tuple()
        if not isinstance(exponent, int):
            raise ValidationError(f"a decimal literal must be finite, got {value}")
        scale = -exponent
        precision = max(len(digits), scale, 1)
        if precision > 38:
            raise ValidationError(
                f"decimal literal {value} needs {precision} digits; Iceberg decimals hold 38"
            )
        return value, DecimalType(precision, scale)
    if isinstance(value, uuid.UUID):
        return value, UUIDType()
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value), BinaryType()
    if isinstance(value, dt.datetime):
        if value.utcoffset() is None:
            return _micros(value - _EPOCH_NAIVE), TimestampType()
        return _micros(value - _EPOCH_UTC), TimestamptzType()
    if isinstance(value, dt.date):
        return value.toordinal() - _EPOCH_ORDINAL, DateType()
    if isinstance(value, dt.time):
        micros = ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000
        return micros + value.microsecond, TimeType()
    raise ValidationError(
        f"unsupported literal {value!r:.80} of Python type {type(value).__name__}; use bool, "
        "int, float, str, Decimal, UUID, bytes, date, time or datetime"
    )


_TYPED_CHECKS: dict[type, Callable[[Any], bool]] = {
    BooleanType: lambda v: isinstance(v, bool),
    FloatType: lambda v: isinstance(v, float | int) and not isinstance(v, bool),
    DoubleType: lambda v: isinstance(v, float | int) and not isinstance(v, bool),
    DecimalType: lambda v: isinstance(v, Decimal) and v.is_finite(),
    UUIDType: lambda v: isinstance(v, uuid.UUID),
}


def _check_typed(value: Any, type_: PrimitiveType) -> Any:
    if value is None:
        raise ValidationError("a literal cannot be null: use is-null / not-null instead")
    check = _TYPED_CHECKS.get(type(type_))
    if check is None:
        if isinstance(type_, StringType):
            ok = isinstance(value, str)
        elif isinstance(type_, BinaryType | FixedType):
            ok = isinstance(value, bytes | bytearray | memoryview)
            value = bytes(value) if ok else value
            if ok and isinstance(type_, FixedType) and len(value) != type_.length:
                raise ValidationError(
                    f"a {type_} literal needs exactly {type_.length} bytes, got {len(value)}"
                )
        else:  # int, long, date, time and the timestamps: ints in the internal representation
            ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = check(value)
    if not ok:
        raise ValidationError(
            f"a {type_} literal must hold its internal representation, got "
            f"{type(value).__name__} {value!r:.80}"
        )
    if isinstance(type_, FloatType | DoubleType):
        value = float(value)
        if math.isnan(value):
            raise ValidationError("a literal cannot be NaN: use is-nan / not-nan instead")
    from icefloe.values import to_bytes

    to_bytes(type_, value)  # range, precision and scale checks of the type
    return value


class Literal:
    """A constant in a predicate, optionally typed.

    Untyped literals are the JSON-native values ``int``, ``float`` and ``str``: their meaning
    depends on the column they are compared with (``"2017-11-16"`` is a date for a date
    column, per the JSON single-value form). Every other Python value carries its type:
    ``bool`` is boolean, ``Decimal`` a decimal of its own precision and scale, ``date`` /
    ``time`` / ``datetime`` are converted to days / micros (``datetime`` with a zone is a
    ``timestamptz``), ``UUID`` is uuid and ``bytes`` binary. ``Literal(value, type)`` takes a
    value already in the internal representation of ``type``.

    Literals are never null or NaN: the spec requires ``is-null`` and ``is-nan`` instead.
    """

    __slots__ = ("type", "value")
    value: Any
    type: PrimitiveType | None

    def __init__(self, value: Any, type: PrimitiveType | None = None) -> None:
        if isinstance(value, Literal):
            if type is not None and value.type != type:
                raise ValidationError(f"literal {value} is not of type {type}")
            value, type = value.value, value.type
        elif type is None:
            if value is None:
                raise ValidationError("a literal cannot be null: use is-null / not-null instead")
            value, type = _infer(value)
        else:
            value = _check_typed(value, type)
        object.__setattr__(self, "value", value)
        object.__setattr__(self, "type", type)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("literals are immutable")

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Literal)
            and self.type == other.type
            and type(self.value) is type(other.value)
            and self.value == other.value
        )

    def __hash__(self) -> int:
        return hash((self.type, self.value))

    def __repr__(self) -> str:
        if self.type is None:
            return f"Literal({self.value!r})"
        return f"Literal({self.value!r}, {self.type!r})"

    def __str__(self) -> str:
        return repr(self.value) if self.type is None else f"{self.value!r}::{self.type}"


def _literal(value: Any) -> Literal:
    return value if isinstance(value, Literal) else Literal(value)


# ---------------------------------------------------------------------------------------------
# Terms
# ---------------------------------------------------------------------------------------------


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
            from icefloe.transforms import parse_transform

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


def _term(term: str | Term) -> UnboundTerm:
    if isinstance(term, str):
        return Reference(term)
    if isinstance(term, UnboundTerm):
        return term
    raise ValidationError(
        f"an unbound predicate needs a column name or unbound term, got {term!r:.80}"
    )


# ---------------------------------------------------------------------------------------------
# Boolean expressions
# ---------------------------------------------------------------------------------------------


class BooleanExpression(ABC):
    """A predicate tree. Immutable and hashable; ``~``, ``&`` and ``|`` build new trees."""

    __slots__ = ()

    @abstractmethod
    def negate(self) -> BooleanExpression:
        """The exact complement (see the module docstring for order comparisons)."""

    def __invert__(self) -> BooleanExpression:
        return self.negate()

    def __and__(self, other: BooleanExpression) -> BooleanExpression:
        return And(self, other)

    def __or__(self, other: BooleanExpression) -> BooleanExpression:
        return Or(self, other)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")


class AlwaysTrue(BooleanExpression):
    """The constant true (a singleton)."""

    __slots__ = ()
    _instance: ClassVar[AlwaysTrue | None] = None

    def __new__(cls) -> AlwaysTrue:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def negate(self) -> BooleanExpression:
        return AlwaysFalse()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AlwaysTrue)

    def __hash__(self) -> int:
        return hash(True)

    def __repr__(self) -> str:
        return "AlwaysTrue()"

    def __str__(self) -> str:
        return "true"


class AlwaysFalse(BooleanExpression):
    """The constant false (a singleton)."""

    __slots__ = ()
    _instance: ClassVar[AlwaysFalse | None] = None

    def __new__(cls) -> AlwaysFalse:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def negate(self) -> BooleanExpression:
        return AlwaysTrue()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AlwaysFalse)

    def __hash__(self) -> int:
        return hash(False)

    def __repr__(self) -> str:
        return "AlwaysFalse()"

    def __str__(self) -> str:
        return "false"


def _check_expr(value: Any, where: str) -> BooleanExpression:
    if not isinstance(value, BooleanExpression):
        raise ValidationError(f"{where} must be a boolean expression, got {value!r:.80}")
    return value


def _balanced(
    combine: Callable[[BooleanExpression, BooleanExpression], BooleanExpression],
    items: Sequence[BooleanExpression],
) -> BooleanExpression:
    """Combine many operands as a balanced tree: depth log(n), so recursion stays shallow."""
    if len(items) == 1:
        return items[0]
    mid = len(items) // 2
    return combine(_balanced(combine, items[:mid]), _balanced(combine, items[mid:]))


class And(BooleanExpression):
    """Conjunction. ``And(a, b, c, ...)`` accepts any number of operands (at least two)."""

    __slots__ = ("left", "right")
    left: BooleanExpression
    right: BooleanExpression

    def __new__(  # type: ignore[misc]
        cls, left: BooleanExpression, right: BooleanExpression, *rest: BooleanExpression
    ) -> BooleanExpression:
        if rest:
            return _balanced(And, (left, right, *rest))
        _check_expr(left, "the left operand of AND")
        _check_expr(right, "the right operand of AND")
        if isinstance(left, AlwaysFalse) or isinstance(right, AlwaysFalse):
            return AlwaysFalse()
        if isinstance(left, AlwaysTrue):
            return right
        if isinstance(right, AlwaysTrue) or left == right:
            return left
        self = super().__new__(cls)
        object.__setattr__(self, "left", left)
        object.__setattr__(self, "right", right)
        return self

    def negate(self) -> BooleanExpression:
        return Or(self.left.negate(), self.right.negate())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, And) and other.left == self.left and other.right == self.right

    def __hash__(self) -> int:
        return hash(("and", self.left, self.right))

    def __repr__(self) -> str:
        return f"And({self.left!r}, {self.right!r})"

    def __str__(self) -> str:
        return f"({self.left} and {self.right})"


class Or(BooleanExpression):
    """Disjunction. ``Or(a, b, c, ...)`` accepts any number of operands (at least two)."""

    __slots__ = ("left", "right")
    left: BooleanExpression
    right: BooleanExpression

    def __new__(  # type: ignore[misc]
        cls, left: BooleanExpression, right: BooleanExpression, *rest: BooleanExpression
    ) -> BooleanExpression:
        if rest:
            return _balanced(Or, (left, right, *rest))
        _check_expr(left, "the left operand of OR")
        _check_expr(right, "the right operand of OR")
        if isinstance(left, AlwaysTrue) or isinstance(right, AlwaysTrue):
            return AlwaysTrue()
        if isinstance(left, AlwaysFalse):
            return right
        if isinstance(right, AlwaysFalse) or left == right:
            return left
        self = super().__new__(cls)
        object.__setattr__(self, "left", left)
        object.__setattr__(self, "right", right)
        return self

    def negate(self) -> BooleanExpression:
        return And(self.left.negate(), self.right.negate())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Or) and other.left == self.left and other.right == self.right

    def __hash__(self) -> int:
        return hash(("or", self.left, self.right))

    def __repr__(self) -> str:
        return f"Or({self.left!r}, {self.right!r})"

    def __str__(self) -> str:
        return f"({self.left} or {self.right})"


class Not(BooleanExpression):
    """Negation. ``Not(AlwaysTrue())`` is ``AlwaysFalse()`` and ``Not(Not(x))`` is ``x``."""

    __slots__ = ("child",)
    child: BooleanExpression

    def __new__(cls, child: BooleanExpression) -> BooleanExpression:  # type: ignore[misc]
        _check_expr(child, "the operand of NOT")
        if isinstance(child, AlwaysTrue):
            return AlwaysFalse()
        if isinstance(child, AlwaysFalse):
            return AlwaysTrue()
        if isinstance(child, Not):
            return child.child
        self = super().__new__(cls)
        object.__setattr__(self, "child", child)
        return self

    def negate(self) -> BooleanExpression:
        return self.child

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Not) and other.child == self.child

    def __hash__(self) -> int:
        return hash(("not", self.child))

    def __repr__(self) -> str:
        return f"Not({self.child!r})"

    def __str__(self) -> str:
        return f"not {self.child}"


# ---------------------------------------------------------------------------------------------
# Unbound predicates
# ---------------------------------------------------------------------------------------------


class UnboundPredicate(BooleanExpression):
    """A test of an unbound term. Subclasses fix the operation (``EqualTo`` is ``eq``)."""

    __slots__ = ("term",)
    op: ClassVar[Operation]
    term: UnboundTerm

    def negate(self) -> BooleanExpression:
        complement = self.op.complement
        if complement is None:
            return Not(self)
        return self._with_op(complement)

    @abstractmethod
    def _with_op(self, op: Operation) -> UnboundPredicate: ...


class UnaryPredicate(UnboundPredicate):
    """is-null, not-null, is-nan, not-nan."""

    __slots__ = ()

    def __init__(self, term: str | UnboundTerm) -> None:
        object.__setattr__(self, "term", _term(term))

    def _with_op(self, op: Operation) -> UnboundPredicate:
        cls = _UNARY_CLASSES[op]
        return cls(self.term)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.term == self.term

    def __hash__(self) -> int:
        return hash((self.op, self.term))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.term!r})"

    def __str__(self) -> str:
        return f"{self.term} {self.op}"


class LiteralPredicate(UnboundPredicate):
    """A comparison of a term with one literal (lt, eq, starts-with, ...)."""

    __slots__ = ("literal",)
    literal: Literal

    def __init__(self, term: str | UnboundTerm, value: Any) -> None:
        object.__setattr__(self, "term", _term(term))
        object.__setattr__(self, "literal", _literal(value))

    def _with_op(self, op: Operation) -> UnboundPredicate:
        return _LITERAL_CLASSES[op](self.term, self.literal)

    def __eq__(self, other: object) -> bool:
        return (
            type(other) is type(self) and other.term == self.term and other.literal == self.literal
        )

    def __hash__(self) -> int:
        return hash((self.op, self.term, self.literal))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.term!r}, {self.literal!r})"

    def __str__(self) -> str:
        return f"{self.term} {self.op} {self.literal}"


class SetPredicate(UnboundPredicate):
    """in / not-in: membership in a set of literals (kept in first-seen order)."""

    __slots__ = ("literals",)
    literals: tuple[Literal, ...]

    def __init__(self, term: str | UnboundTerm, values: Iterable[Any]) -> None:
        if isinstance(values, str | bytes):
            raise ValidationError(
                f"{self.op} needs a collection of values, got the single value {values!r:.80}"
            )
        literals = tuple(dict.fromkeys(_literal(v) for v in values))
        object.__setattr__(self, "term", _term(term))
        object.__setattr__(self, "literals", literals)

    def _with_op(self, op: Operation) -> UnboundPredicate:
        return _SET_CLASSES[op](self.term, self.literals)

    def __eq__(self, other: object) -> bool:
        return (
            type(other) is type(self)
            and other.term == self.term
            and set(other.literals) == set(self.literals)
        )

    def __hash__(self) -> int:
        return hash((self.op, self.term, frozenset(self.literals)))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.term!r}, {list(self.literals)!r})"

    def __str__(self) -> str:
        return f"{self.term} {self.op} ({', '.join(str(lit) for lit in self.literals)})"


class IsNull(UnaryPredicate):
    __slots__ = ()
    op = Operation.IS_NULL


class NotNull(UnaryPredicate):
    __slots__ = ()
    op = Operation.NOT_NULL


class IsNaN(UnaryPredicate):
    __slots__ = ()
    op = Operation.IS_NAN


class NotNaN(UnaryPredicate):
    __slots__ = ()
    op = Operation.NOT_NAN


class LessThan(LiteralPredicate):
    __slots__ = ()
    op = Operation.LT


class LessThanOrEqual(LiteralPredicate):
    __slots__ = ()
    op = Operation.LT_EQ


class GreaterThan(LiteralPredicate):
    __slots__ = ()
    op = Operation.GT


class GreaterThanOrEqual(LiteralPredicate):
    __slots__ = ()
    op = Operation.GT_EQ


class EqualTo(LiteralPredicate):
    __slots__ = ()
    op = Operation.EQ


class NotEqualTo(LiteralPredicate):
    __slots__ = ()
    op = Operation.NOT_EQ


class StartsWith(LiteralPredicate):
    __slots__ = ()
    op = Operation.STARTS_WITH


class NotStartsWith(LiteralPredicate):
    __slots__ = ()
    op = Operation.NOT_STARTS_WITH


class In(SetPredicate):
    __slots__ = ()
    op = Operation.IN


class NotIn(SetPredicate):
    __slots__ = ()
    op = Operation.NOT_IN


_UNARY_CLASSES: dict[Operation, type[UnaryPredicate]] = {
    c.op: c for c in (IsNull, NotNull, IsNaN, NotNaN)
}
_LITERAL_CLASSES: dict[Operation, type[LiteralPredicate]] = {
    c.op: c
    for c in (
        LessThan,
        LessThanOrEqual,
        GreaterThan,
        GreaterThanOrEqual,
        EqualTo,
        NotEqualTo,
        StartsWith,
        NotStartsWith,
    )
}
_SET_CLASSES: dict[Operation, type[SetPredicate]] = {c.op: c for c in (In, NotIn)}


def predicate(
    op: Operation, term: str | UnboundTerm, values: Iterable[Any] = ()
) -> UnboundPredicate:
    """Build the unbound predicate for ``op``: no value for unary tests, one for
    comparisons, any number for in / not-in."""
    items = list(values)
    if op.is_unary:
        if items:
            raise ValidationError(f"{op} takes no value, got {items!r:.80}")
        return _UNARY_CLASSES[op](term)
    if op.is_set:
        return _SET_CLASSES[op](term, items)
    if len(items) != 1:
        raise ValidationError(f"{op} takes exactly one value, got {len(items)}")
    return _LITERAL_CLASSES[op](term, items[0])


# ---------------------------------------------------------------------------------------------
# Bound predicates
# ---------------------------------------------------------------------------------------------


class BoundPredicate(BooleanExpression):
    """A test of a bound term; literals are in the internal representation of its type."""

    __slots__ = ("op", "term")
    op: Operation
    term: BoundTerm

    @property
    def ref(self) -> BoundReference:
        return self.term.ref

    def negate(self) -> BooleanExpression:
        complement = self.op.complement
        if complement is not None:
            return self._with_op(complement)
        # NOT (x < v) holds for x >= v and also for null and NaN x, which x >= v rejects.
        result: BooleanExpression = self._with_op(self.op.order_negation)
        if self.term.nullable:
            result = Or(result, BoundUnaryPredicate(Operation.IS_NULL, self.term))
        if self.term.may_be_nan:
            result = Or(result, BoundUnaryPredicate(Operation.IS_NAN, self.term))
        return result

    @abstractmethod
    def _with_op(self, op: Operation) -> BoundPredicate: ...


class BoundUnaryPredicate(BoundPredicate):
    __slots__ = ()

    def __init__(self, op: Operation, term: BoundTerm) -> None:
        if not op.is_unary:
            raise ValidationError(f"{op} is not a unary test")
        object.__setattr__(self, "op", op)
        object.__setattr__(self, "term", term)

    def _with_op(self, op: Operation) -> BoundPredicate:
        return BoundUnaryPredicate(op, self.term)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, BoundUnaryPredicate)
            and other.op is self.op
            and other.term == self.term
        )

    def __hash__(self) -> int:
        return hash((self.op, self.term))

    def __repr__(self) -> str:
        return f"BoundUnaryPredicate({self.op.name}, {self.term!r})"

    def __str__(self) -> str:
        return f"{self.term} {self.op}"


class BoundLiteralPredicate(BoundPredicate):
    __slots__ = ("literal",)
    literal: Any

    def __init__(self, op: Operation, term: BoundTerm, literal: Any) -> None:
        if not op.is_literal:
            raise ValidationError(f"{op} does not compare with a single literal")
        if literal is None:
            raise ValidationError(f"{op} on {term} needs a non-null literal")
        object.__setattr__(self, "op", op)
        object.__setattr__(self, "term", term)
        object.__setattr__(self, "literal", literal)

    def _with_op(self, op: Operation) -> BoundPredicate:
        return BoundLiteralPredicate(op, self.term, self.literal)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, BoundLiteralPredicate)
            and other.op is self.op
            and other.term == self.term
            and type(other.literal) is type(self.literal)
            and other.literal == self.literal
        )

    def __hash__(self) -> int:
        return hash((self.op, self.term, self.literal))

    def __repr__(self) -> str:
        return f"BoundLiteralPredicate({self.op.name}, {self.term!r}, {self.literal!r})"

    def __str__(self) -> str:
        return f"{self.term} {self.op} {self.literal!r}"


class BoundSetPredicate(BoundPredicate):
    __slots__ = ("literals",)
    literals: frozenset[Any]

    def __init__(self, op: Operation, term: BoundTerm, literals: Iterable[Any]) -> None:
        if not op.is_set:
            raise ValidationError(f"{op} is not a set test")
        values = frozenset(literals)
        if None in values:
            raise ValidationError(f"{op} on {term} cannot test for null: use is-null")
        object.__setattr__(self, "op", op)
        object.__setattr__(self, "term", term)
        object.__setattr__(self, "literals", values)

    def _with_op(self, op: Operation) -> BoundPredicate:
        return BoundSetPredicate(op, self.term, self.literals)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, BoundSetPredicate)
            and other.op is self.op
            and other.term == self.term
            and other.literals == self.literals
        )

    def __hash__(self) -> int:
        return hash((self.op, self.term, self.literals))

    def __repr__(self) -> str:
        return f"BoundSetPredicate({self.op.name}, {self.term!r}, {set(self.literals)!r})"

    def __str__(self) -> str:
        try:
            ordered = sorted(self.literals)
        except TypeError:  # pragma: no cover - literals of one bound type always compare
            ordered = sorted(self.literals, key=repr)
        shown = ", ".join(repr(v) for v in ordered)
        return f"{self.term} {self.op} ({shown})"


# ---------------------------------------------------------------------------------------------
# Visitors
# ---------------------------------------------------------------------------------------------


class BooleanExpressionVisitor(Generic[T], ABC):
    """Post-order visitor: each hook receives its children's results."""

    @abstractmethod
    def visit_true(self) -> T: ...

    @abstractmethod
    def visit_false(self) -> T: ...

    @abstractmethod
    def visit_not(self, child_result: T) -> T: ...

    @abstractmethod
    def visit_and(self, left_result: T, right_result: T) -> T: ...

    @abstractmethod
    def visit_or(self, left_result: T, right_result: T) -> T: ...

    def visit_unbound_predicate(self, predicate: UnboundPredicate) -> T:
        raise ValidationError(
            f"{type(self).__name__} needs a bound expression; bind {predicate} to a schema first"
        )

    def visit_bound_predicate(self, predicate: BoundPredicate) -> T:
        raise ValidationError(
            f"{type(self).__name__} works on unbound expressions, got bound {predicate}"
        )


def visit(expr: BooleanExpression, visitor: BooleanExpressionVisitor[T]) -> T:
    """Run ``visitor`` over ``expr`` bottom-up.

    Iterative rather than recursive, so a filter with thousands of ``OR`` branches (as
    engines generate for large IN lists) cannot exhaust Python's recursion limit.
    """
    results: list[T] = []
    # Each stack entry is (node, children_done).
    stack: list[tuple[BooleanExpression, bool]] = [(expr, False)]
    while stack:
        node, done = stack.pop()
        if isinstance(node, And | Or):
            if not done:
                stack.append((node, True))
                stack.append((node.right, False))
                stack.append((node.left, False))
                continue
            right = results.pop()
            left = results.pop()
            if isinstance(node, And):
                results.append(visitor.visit_and(left, right))
            else:
                results.append(visitor.visit_or(left, right))
        elif isinstance(node, Not):
            if not done:
                stack.append((node, True))
                stack.append((node.child, False))
                continue
            results.append(visitor.visit_not(results.pop()))
        elif isinstance(node, AlwaysTrue):
            results.append(visitor.visit_true())
        elif isinstance(node, AlwaysFalse):
            results.append(visitor.visit_false())
        elif isinstance(node, BoundPredicate):
            results.append(visitor.visit_bound_predicate(node))
        elif isinstance(node, UnboundPredicate):
            results.append(visitor.visit_unbound_predicate(node))
        else:
            raise ValidationError(f"not a boolean expression: {node!r:.80}")
    return results.pop()


class RebuildingVisitor(BooleanExpressionVisitor[BooleanExpression]):
    """Rebuilds constants and connectives as they were; subclasses say what becomes of each
    predicate (and of NOT, where it needs more than wrapping its rebuilt child)."""

    def visit_true(self) -> BooleanExpression:
        return AlwaysTrue()

    def visit_false(self) -> BooleanExpression:
        return AlwaysFalse()

    def visit_not(self, child_result: BooleanExpression) -> BooleanExpression:
        return Not(child_result)

    def visit_and(self, left: BooleanExpression, right: BooleanExpression) -> BooleanExpression:
        return And(left, right)

    def visit_or(self, left: BooleanExpression, right: BooleanExpression) -> BooleanExpression:
        return Or(left, right)


class _RewriteNot(RebuildingVisitor):
    def visit_not(self, child_result: BooleanExpression) -> BooleanExpression:
        return child_result.negate()

    def visit_unbound_predicate(self, predicate: UnboundPredicate) -> BooleanExpression:
        return predicate

    def visit_bound_predicate(self, predicate: BoundPredicate) -> BooleanExpression:
        return predicate


def rewrite_not(expr: BooleanExpression) -> BooleanExpression:
    """Push every NOT down into the predicates, preserving meaning exactly.

    A bound result contains no ``Not`` at all, which is what projections and metrics
    evaluators need. An unbound order comparison under NOT stays wrapped (its exact
    negation depends on the column; see the module docstring).
    """
    return visit(expr, _RewriteNot())


def is_bound(expr: BooleanExpression) -> bool:
    """Whether every predicate in ``expr`` is bound (constants count as bound)."""
    return visit(expr, _IsBound())


def flatten(expr: BooleanExpression, kind: type[And] | type[Or]) -> list[BooleanExpression]:
    """The operands of a chain of ``kind`` nodes, left to right, without recursion.

    Evaluators treat such a chain as one n-ary node, so the thousands of ORs an engine sends
    for a large IN list cost neither recursion depth nor a call per level.
    """
    out: list[BooleanExpression] = []
    stack = [expr]
    while stack:
        node = stack.pop()
        if isinstance(node, kind):
            stack.append(node.right)
            stack.append(node.left)
        else:
            out.append(node)
    return out


def bound_predicates(expr: BooleanExpression) -> list[BoundPredicate]:
    """Every bound predicate in ``expr`` (repeats included), found without recursion."""
    found: list[BoundPredicate] = []
    stack = [expr]
    while stack:
        node = stack.pop()
        if isinstance(node, And | Or):
            stack.extend((node.left, node.right))
        elif isinstance(node, Not):
            stack.append(node.child)
        elif isinstance(node, BoundPredicate):
            found.append(node)
    return found


class _IsBound(BooleanExpressionVisitor[bool]):
    def visit_true(self) -> bool:
        return True

    def visit_false(self) -> bool:
        return True

    def visit_not(self, child_result: bool) -> bool:
        return child_result

    def visit_and(self, left_result: bool, right_result: bool) -> bool:
        return left_result and right_result

    def visit_or(self, left_result: bool, right_result: bool) -> bool:
        return left_result and right_result

    def visit_unbound_predicate(self, predicate: UnboundPredicate) -> bool:
        return False

    def visit_bound_predicate(self, predicate: BoundPredicate) -> bool:
        return True


__all__ = [
    "Accessor",
    "AlwaysFalse",
    "AlwaysTrue",
    "And",
    "BooleanExpression",
    "BooleanExpressionVisitor",
    "BoundLiteralPredicate",
    "BoundPredicate",
    "BoundReference",
    "BoundSetPredicate",
    "BoundTerm",
    "BoundTransform",
    "BoundUnaryPredicate",
    "EqualTo",
    "GreaterThan",
    "GreaterThanOrEqual",
    "IdReference",
    "In",
    "IsNaN",
    "IsNull",
    "LessThan",
    "LessThanOrEqual",
    "Literal",
    "LiteralPredicate",
    "Not",
    "NotEqualTo",
    "NotIn",
    "NotNaN",
    "NotNull",
    "NotStartsWith",
    "Operation",
    "Or",
    "RebuildingVisitor",
    "Reference",
    "SetPredicate",
    "StartsWith",
    "Term",
    "TransformTerm",
    "UnaryPredicate",
    "UnboundPredicate",
    "UnboundTerm",
    "bound_predicates",
    "flatten",
    "is_bound",
    "predicate",
    "rewrite_not",
    "visit",
]
