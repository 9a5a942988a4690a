"""The JSON form of filter expressions (expressions spec, Appendix B).

Two generations of the form exist and both are read:

* the current one, where predicates hold value expressions (``child``, ``left``/``right``),
  references are objects (``{"type": "reference", "name": "x"}`` or ``..."id": 3``) and
  transforms are function applications (``{"type": "apply", "function": ...}``);
* the deprecated REST one, where predicates hold a ``term`` (a bare column name or a
  ``{"type": "transform", ...}`` object) and a ``value``/``values``.

Writing uses the current form unless ``legacy=True`` asks for the deprecated one, which
older REST clients need for residual filters.

Literals are kept as they arrive (JSON-native values stay untyped) until the expression is
bound, because ``"2017-11-16"`` only means a date once it is compared with a date column.
Typed literals (``{"type": "literal", "value": ..., "data-type": "date"}``) are converted
right away. Errors name the offending part by its JSON path, such as ``$.left.child``.

:func:`parse_filter_text` reads a filter given as text in either form: JSON when it starts
with ``{``, else the filter syntax people write (:mod:`icefloe.expressions.parser`); the
command line and the Spark API take filters through it, so they read text alike.
"""

from __future__ import annotations

import json
from typing import Any

from icefloe.errors import ValidationError
from icefloe.expressions import (
    AlwaysFalse,
    AlwaysTrue,
    And,
    BooleanExpression,
    BooleanExpressionVisitor,
    BoundLiteralPredicate,
    BoundPredicate,
    BoundReference,
    BoundSetPredicate,
    BoundTerm,
    BoundTransform,
    IdReference,
    Literal,
    LiteralPredicate,
    Not,
    Operation,
    Or,
    Reference,
    SetPredicate,
    TransformTerm,
    UnboundPredicate,
    UnboundTerm,
    predicate,
    visit,
)
from icefloe.expressions.parser import parse_filter
from icefloe.spec.transforms import (
    BucketTransform,
    DayTransform,
    HourTransform,
    IdentityTransform,
    MonthTransform,
    Transform,
    TruncateTransform,
    YearTransform,
    parse_transform,
)
from icefloe.spec.types import BooleanType, PrimitiveType, primitive_from_string
from icefloe.spec.values import from_json_value, to_json_value

ICEBERG_FUNCTIONS = "iceberg_functions"

# Iceberg functions usable as predicate terms: name → (takes an int parameter, factory).
_ONE_ARG: dict[str, type[Transform]] = {
    "identity": IdentityTransform,
    "year": YearTransform,
    "month": MonthTransform,
    "day": DayTransform,
    "hour": HourTransform,
}
_PARAMETERIZED: dict[str, type[BucketTransform] | type[TruncateTransform]] = {
    "bucket": BucketTransform,
    "truncate": TruncateTransform,
}


def _show(obj: Any) -> str:
    text = json.dumps(obj, default=repr) if not isinstance(obj, str) else repr(obj)
    return text if len(text) <= 120 else text[:117] + "..."


def _error(path: str, message: str) -> ValidationError:
    return ValidationError(f"invalid expression at {path}: {message}")


def _require(obj: dict[str, Any], key: str, path: str) -> Any:
    if key not in obj:
        raise _error(path, f"{obj.get('type')!r} needs a {key!r} field, got {_show(obj)}")
    return obj[key]


def _check_keys(obj: dict[str, Any], allowed: set[str], path: str) -> None:
    extra = sorted(set(obj) - allowed - {"type"})
    if extra:
        raise _error(
            path,
            f"unexpected field(s) {extra} in {obj.get('type')!r}; allowed: {sorted(allowed)}",
        )


# ---------------------------------------------------------------------------------------------
# Parsing
# ---------------------------------------------------------------------------------------------


def parse_expression(source: Any) -> BooleanExpression:
    """Parse a filter from JSON text or from an already decoded JSON value."""
    try:
        if isinstance(source, str | bytes):
            try:
                source = json.loads(source)
            except json.JSONDecodeError as e:
                raise ValidationError(f"expression is not valid JSON: {e}") from None
        return _predicate(source, "$")
    except RecursionError:
        raise ValidationError("expression is nested too deeply to parse") from None


def _predicate(obj: Any, path: str) -> BooleanExpression:
    if obj is True:
        return AlwaysTrue()
    if obj is False:
        return AlwaysFalse()
    if not isinstance(obj, dict):
        raise _error(
            path, f"expected a predicate (true, false or an object with 'type'), got {_show(obj)}"
        )
    kind = obj.get("type")
    if not isinstance(kind, str):
        raise _error(path, f"a predicate object needs a string 'type', got {_show(obj)}")
    if kind in ("true", "false"):
        _check_keys(obj, set(), path)
        return AlwaysTrue() if kind == "true" else AlwaysFalse()
    if kind in ("and", "or"):
        _check_keys(obj, {"left", "right"}, path)
        left = _predicate(_require(obj, "left", path), f"{path}.left")
        right = _predicate(_require(obj, "right", path), f"{path}.right")
        return And(left, right) if kind == "and" else Or(left, right)
    if kind == "not":
        _check_keys(obj, {"child"}, path)
        return Not(_predicate(_require(obj, "child", path), f"{path}.child"))
    try:
        op = Operation(kind)
    except ValueError:
        known = ["true", "false", "and", "or", "not", *(o.value for o in Operation)]
        raise _error(path, f"unknown predicate type {kind!r}; expected one of {known}") from None
    if "term" in obj:
        return _legacy_predicate(op, obj, path)
    if op.is_unary:
        _check_keys(obj, {"child"}, path)
        term = _operand_term(_require(obj, "child", path), f"{path}.child")
        return predicate(op, term)
    if op.is_set:
        _check_keys(obj, {"child", "values"}, path)
        term = _operand_term(_require(obj, "child", path), f"{path}.child")
        return predicate(op, term, _literals(_require(obj, "values", path), f"{path}.values"))
    _check_keys(obj, {"left", "right"}, path)
    lhs = _value_expression(_require(obj, "left", path), f"{path}.left")
    rhs = _value_expression(_require(obj, "right", path), f"{path}.right")
    if isinstance(lhs, UnboundTerm) and isinstance(rhs, Literal):
        return predicate(op, lhs, [rhs])
    if isinstance(lhs, Literal) and isinstance(rhs, UnboundTerm):
        flipped = op.flipped
        if flipped is None:
            raise _error(path, f"{op} needs the column on the left and the literal on the right")
        return predicate(flipped, rhs, [lhs])
    what = "two columns" if isinstance(lhs, UnboundTerm) else "two literals"
    raise _error(path, f"{op} between {what} is not supported; compare a column with a literal")


def _legacy_predicate(op: Operation, obj: dict[str, Any], path: str) -> UnboundPredicate:
    term = _legacy_term(obj["term"], f"{path}.term")
    if op.is_unary:
        _check_keys(obj, {"term"}, path)
        return predicate(op, term)
    if op.is_set:
        _check_keys(obj, {"term", "values"}, path)
        return predicate(op, term, _literals(_require(obj, "values", path), f"{path}.values"))
    _check_keys(obj, {"term", "value"}, path)
    return predicate(op, term, [_literal(_require(obj, "value", path), f"{path}.value")])


def _operand_term(obj: Any, path: str) -> UnboundTerm:
    value = _value_expression(obj, path)
    if not isinstance(value, UnboundTerm):
        raise _error(path, f"expected a reference or function application, got {_show(obj)}")
    return value


def _value_expression(obj: Any, path: str) -> UnboundTerm | Literal:
    """EXPR of the current form: a literal, a reference or an apply."""
    if isinstance(obj, dict):
        kind = obj.get("type")
        if kind == "reference":
            return _reference(obj, path)
        if kind == "apply":
            return _apply(obj, path)
        if kind == "transform":
            return _legacy_transform(obj, path)
        if kind == "literal":
            return _literal(obj, path)
        raise _error(
            path, f"expected a literal, a reference or an apply expression, got {_show(obj)}"
        )
    return _literal(obj, path)


def _reference(obj: dict[str, Any], path: str) -> Reference | IdReference:
    _check_keys(obj, {"name", "id", "term"}, path)
    present = [k for k in ("name", "id", "term") if k in obj]
    if len(present) != 1:
        raise _error(path, f"a reference needs exactly one of 'name' or 'id', got {_show(obj)}")
    value = obj[present[0]]
    if present[0] == "id":
        if isinstance(value, bool) or not isinstance(value, int):
            raise _error(path, f"a reference 'id' must be an integer, got {_show(value)}")
        return IdReference(value)
    if not isinstance(value, str) or not value:
        raise _error(path, f"a reference name must be a non-empty string, got {_show(value)}")
    return Reference(value)


def _legacy_term(obj: Any, path: str) -> UnboundTerm:
    """TERM of the deprecated form: a bare name, a reference or a transform object."""
    if isinstance(obj, str):
        if not obj:
            raise _error(path, "a column name must not be empty")
        return Reference(obj)
    if isinstance(obj, dict):
        kind = obj.get("type")
        if kind == "reference":
            return _reference(obj, path)
        if kind == "transform":
            return _legacy_transform(obj, path)
        if kind == "apply":
            return _apply(obj, path)
    raise _error(path, f"expected a column name or a transform term, got {_show(obj)}")


def _legacy_transform(obj: dict[str, Any], path: str) -> TransformTerm:
    _check_keys(obj, {"transform", "term"}, path)
    text = _require(obj, "transform", path)
    if not isinstance(text, str):
        raise _error(f"{path}.transform", f"a transform must be a string, got {_show(text)}")
    try:
        transform = parse_transform(text)
    except ValidationError as e:
        raise _error(f"{path}.transform", str(e)) from None
    if transform.is_unknown:
        raise _error(f"{path}.transform", f"unknown transform {text!r}")
    inner = _legacy_term(_require(obj, "term", path), f"{path}.term")
    if not isinstance(inner, Reference | IdReference):
        raise _error(f"{path}.term", "a transform applies to a column, not to another transform")
    return TransformTerm(transform, inner)


def _function_name(ref: Any, path: str) -> str:
    catalog: Any = None
    identifier: Any
    if isinstance(ref, str):
        identifier = [ref]
    elif isinstance(ref, list):
        identifier = ref
    elif isinstance(ref, dict):
        _check_keys(ref, {"catalog", "identifier"}, path)
        catalog = ref.get("catalog")
        identifier = _require(ref, "identifier", path)
    else:
        raise _error(path, f"a function reference must be a name, list or object: {_show(ref)}")
    if not isinstance(identifier, list) or not all(isinstance(p, str) for p in identifier):
        raise _error(path, f"a function identifier is a list of names, got {_show(identifier)}")
    if catalog not in (None, ICEBERG_FUNCTIONS) or len(identifier) != 1:
        shown = ".".join([*([catalog] if catalog else []), *identifier])
        raise _error(
            path,
            f"function {shown!r} is not supported: filters can only apply Iceberg partition "
            f"transforms ({sorted([*_ONE_ARG, *_PARAMETERIZED])})",
        )
    return str(identifier[0]).lower()


def _apply(obj: dict[str, Any], path: str) -> TransformTerm:
    _check_keys(obj, {"function", "arguments"}, path)
    name = _function_name(_require(obj, "function", path), f"{path}.function")
    args = _require(obj, "arguments", path)
    if not isinstance(args, list):
        raise _error(f"{path}.arguments", f"expected a list, got {_show(args)}")
    transform: Transform
    if name in _ONE_ARG:
        if len(args) != 1:
            raise _error(f"{path}.arguments", f"{name} takes one argument, got {len(args)}")
        transform = _ONE_ARG[name]()
    elif name in _PARAMETERIZED:
        if len(args) != 2:
            raise _error(
                f"{path}.arguments", f"{name} takes two arguments (N, column), got {len(args)}"
            )
        param = _literal(args[0], f"{path}.arguments[0]")
        if param.type is not None or not isinstance(param.value, int):
            raise _error(f"{path}.arguments[0]", f"{name} needs an integer parameter")
        try:
            transform = _PARAMETERIZED[name](param.value)
        except ValidationError as e:
            raise _error(f"{path}.arguments[0]", str(e)) from None
    else:
        raise _error(
            f"{path}.function",
            f"unknown function {name!r}; filters can apply {sorted([*_ONE_ARG, *_PARAMETERIZED])}",
        )
    arg_path = f"{path}.arguments[{len(args) - 1}]"
    column = _value_expression(args[-1], arg_path)
    if not isinstance(column, Reference | IdReference):
        raise _error(arg_path, f"{name} must be applied to a column reference")
    return TransformTerm(transform, column)


def _literal(obj: Any, path: str) -> Literal:
    if isinstance(obj, dict):
        if obj.get("type") != "literal":
            raise _error(path, f"expected a literal value, got {_show(obj)}")
        _check_keys(obj, {"value", "data-type"}, path)
        value = _require(obj, "value", path)
        if "data-type" in obj:
            return _typed_literal(value, _data_type(obj["data-type"], f"{path}.data-type"), path)
        return _literal(value, f"{path}.value")
    if obj is None:
        raise _error(path, "a literal cannot be null; use is-null / not-null")
    if isinstance(obj, list):
        raise _error(path, "expected a single value, got a list (use in / not-in for sets)")
    if isinstance(obj, dict):  # pragma: no cover - handled above
        raise _error(path, f"expected a literal, got {_show(obj)}")
    try:
        return Literal(obj)
    except ValidationError as e:
        raise _error(path, str(e)) from None


def _data_type(obj: Any, path: str) -> PrimitiveType:
    if not isinstance(obj, str):
        raise _error(path, f"a literal data-type must be a primitive type name, got {_show(obj)}")
    try:
        return primitive_from_string(obj)
    except ValidationError as e:
        raise _error(path, str(e)) from None


def _typed_literal(value: Any, t: PrimitiveType, path: str) -> Literal:
    if value is None:
        raise _error(path, "a literal cannot be null; use is-null / not-null")
    try:
        return Literal(from_json_value(t, value), t)
    except ValidationError as e:
        raise _error(path, str(e)) from None


def _literals(obj: Any, path: str) -> list[Literal]:
    if isinstance(obj, list):
        return [_literal(item, f"{path}[{i}]") for i, item in enumerate(obj)]
    if isinstance(obj, dict) and obj.get("type") == "literals":
        _check_keys(obj, {"values", "data-type"}, path)
        t = _data_type(_require(obj, "data-type", path), f"{path}.data-type")
        values = _require(obj, "values", path)
        if not isinstance(values, list):
            raise _error(f"{path}.values", f"expected a list of values, got {_show(values)}")
        return [_typed_literal(v, t, f"{path}.values[{i}]") for i, v in enumerate(values)]
    raise _error(path, f"expected a list of literals, got {_show(obj)}")


# ---------------------------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------------------------


def expression_to_json(
    expr: BooleanExpression, *, legacy: bool = False, use_ids: bool = False
) -> Any:
    """The JSON value of ``expr`` (pass it to ``json.dumps``).

    ``legacy`` writes the deprecated term form that older REST clients read. Bound
    expressions are written with column names, or with field ids when ``use_ids`` (the form
    for stored expressions that must survive renames; not available with ``legacy``).
    """
    if legacy and use_ids:
        raise ValidationError("the deprecated expression form has no field-id references")
    return visit(expr, _Writer(legacy, use_ids))


def expression_to_json_text(
    expr: BooleanExpression, *, legacy: bool = False, use_ids: bool = False
) -> str:
    return json.dumps(expression_to_json(expr, legacy=legacy, use_ids=use_ids))


def _transform_function(transform: Transform) -> tuple[str, list[Any]]:
    if isinstance(transform, BucketTransform):
        return "bucket", [transform.num_buckets]
    if isinstance(transform, TruncateTransform):
        return "truncate", [transform.width]
    name = str(transform)
    if name not in _ONE_ARG:
        raise ValidationError(f"transform {transform} has no function form in expressions")
    return name, []


class _Writer(BooleanExpressionVisitor[Any]):
    def __init__(self, legacy: bool, use_ids: bool) -> None:
        self.legacy = legacy
        self.use_ids = use_ids

    def visit_true(self) -> Any:
        return True

    def visit_false(self) -> Any:
        return False

    def visit_not(self, child_result: Any) -> Any:
        return {"type": "not", "child": child_result}

    def visit_and(self, left_result: Any, right_result: Any) -> Any:
        return {"type": "and", "left": left_result, "right": right_result}

    def visit_or(self, left_result: Any, right_result: Any) -> Any:
        return {"type": "or", "left": left_result, "right": right_result}

    # -- terms ------------------------------------------------------------------------------

    def _reference(self, name: str | None, field_id: int | None) -> Any:
        if self.legacy:
            if name is None:
                raise ValidationError(
                    f"field id reference #{field_id} has no deprecated (term) form"
                )
            return name
        if name is None or (self.use_ids and field_id is not None):
            return {"type": "reference", "id": field_id}
        return {"type": "reference", "name": name}

    def _transform(self, transform: Transform, column: Any) -> Any:
        if self.legacy:
            return {"type": "transform", "transform": str(transform), "term": column}
        name, params = _transform_function(transform)
        return {
            "type": "apply",
            "function": {"catalog": ICEBERG_FUNCTIONS, "identifier": [name]},
            "arguments": [*params, column],
        }

    def _unbound_term(self, term: UnboundTerm) -> Any:
        if isinstance(term, Reference):
            return self._reference(term.name, None)
        if isinstance(term, IdReference):
            return self._reference(None, term.field_id)
        assert isinstance(term, TransformTerm)
        return self._transform(term.transform, self._unbound_term(term.term))

    def _bound_term(self, term: BoundTerm) -> Any:
        if isinstance(term, BoundReference):
            return self._reference(term.name, term.field_id)
        assert isinstance(term, BoundTransform)
        return self._transform(term.transform, self._bound_term(term.reference))

    # -- literals ---------------------------------------------------------------------------

    def _literal(self, lit: Literal) -> Any:
        if lit.type is None:
            return lit.value
        value = to_json_value(lit.type, lit.value)
        if self.legacy or isinstance(lit.type, BooleanType):
            return value
        return {"type": "literal", "value": value, "data-type": lit.type.to_json()}

    def _bound_value(self, term: BoundTerm, value: Any) -> Any:
        return to_json_value(term.result_type, value)

    # -- predicates -------------------------------------------------------------------------

    def _shape(self, op: Operation, term: Any, values: list[Any] | None) -> dict[str, Any]:
        if self.legacy:
            out: dict[str, Any] = {"type": op.value, "term": term}
            if op.is_set:
                out["values"] = values
            elif values is not None:
                out["value"] = values[0]
            return out
        if op.is_unary:
            return {"type": op.value, "child": term}
        if op.is_set:
            return {"type": op.value, "child": term, "values": values}
        assert values is not None
        return {"type": op.value, "left": term, "right": values[0]}

    def visit_unbound_predicate(self, predicate: UnboundPredicate) -> Any:
        term = self._unbound_term(predicate.term)
        if isinstance(predicate, SetPredicate):
            return self._shape(predicate.op, term, [self._literal(v) for v in predicate.literals])
        if isinstance(predicate, LiteralPredicate):
            return self._shape(predicate.op, term, [self._literal(predicate.literal)])
        return self._shape(predicate.op, term, None)

    def visit_bound_predicate(self, predicate: BoundPredicate) -> Any:
        term = self._bound_term(predicate.term)
        if isinstance(predicate, BoundSetPredicate):
            values = [self._bound_value(predicate.term, v) for v in predicate.literals]
            values.sort(key=lambda v: json.dumps(v))  # a stable order for a set
            return self._shape(predicate.op, term, values)
        if isinstance(predicate, BoundLiteralPredicate):
            return self._shape(
                predicate.op, term, [self._bound_value(predicate.term, predicate.literal)]
            )
        return self._shape(predicate.op, term, None)


def parse_filter_text(text: str) -> BooleanExpression:
    """A filter written as text: expression JSON when it starts with ``{`` (after blanks),
    else the filter syntax (``a >= 1 and b in ('x', 'y')``)."""
    if text.lstrip().startswith("{"):
        return parse_expression(text)
    return parse_filter(text)


__all__ = [
    "ICEBERG_FUNCTIONS",
    "expression_to_json",
    "expression_to_json_text",
    "parse_expression",
    "parse_filter_text",
]
