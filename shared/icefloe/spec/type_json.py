"""The JSON form of types and struct fields (spec Appendix C), as schemas are stored.

This is a module of its own, above :mod:`icefloe.spec.types` and :mod:`icefloe.spec.values`, because a
field's ``initial-default`` and ``write-default`` are written in the JSON single-value form,
which :mod:`icefloe.spec.values` owns and which itself needs the types. Keeping the JSON here lets
the types stay a leaf that knows no values (as Java keeps ``SchemaParser`` apart from
``Types``). Primitive types are written by name (:meth:`PrimitiveType.to_json
<icefloe.spec.types.PrimitiveType.to_json>`, parsed by :func:`~icefloe.spec.types.primitive_from_string`).
"""

from __future__ import annotations

from typing import Any

from icefloe.errors import ValidationError
from icefloe.spec.types import (
    IcebergType,
    ListType,
    MapType,
    NestedField,
    PrimitiveType,
    StructType,
    primitive_from_string,
)
from icefloe.spec.values import from_json_value, to_json_value


def type_to_json(t: IcebergType) -> Any:
    """A type's Appendix C JSON form: a string for a primitive, an object otherwise."""
    if isinstance(t, PrimitiveType):
        return t.to_json()
    if isinstance(t, StructType):
        return {"type": "struct", "fields": [field_to_json(f) for f in t.fields]}
    if isinstance(t, ListType):
        return {
            "type": "list",
            "element-id": t.element_id,
            "element": type_to_json(t.element_type),
            "element-required": t.element_required,
        }
    if isinstance(t, MapType):
        return {
            "type": "map",
            "key-id": t.key_id,
            "key": type_to_json(t.key_type),
            "value-id": t.value_id,
            "value": type_to_json(t.value_type),
            "value-required": t.value_required,
        }
    raise ValidationError(f"no JSON form for type {t!r:.200}")  # pragma: no cover


def _require(obj: dict[str, Any], key: str, what: str) -> Any:
    if key not in obj:
        raise ValidationError(f"{what} is missing required field {key!r}: {obj!r:.200}")
    return obj[key]


def type_from_json(obj: Any) -> IcebergType:
    """Parse a type from its Appendix C JSON form (a string or a struct/list/map object)."""
    if isinstance(obj, str):
        return primitive_from_string(obj)
    if not isinstance(obj, dict):
        raise ValidationError(f"a type must be a JSON string or object, got {obj!r:.200}")
    kind = obj.get("type")
    if kind == "struct":
        fields = _require(obj, "fields", "struct type")
        if not isinstance(fields, list):
            raise ValidationError(f"struct 'fields' must be a list, got {fields!r:.200}")
        return StructType(*(field_from_json(f) for f in fields))
    if kind == "list":
        return ListType(
            _int(_require(obj, "element-id", "list type"), "element-id"),
            type_from_json(_require(obj, "element", "list type")),
            _bool(_require(obj, "element-required", "list type"), "element-required"),
        )
    if kind == "map":
        return MapType(
            _int(_require(obj, "key-id", "map type"), "key-id"),
            type_from_json(_require(obj, "key", "map type")),
            _int(_require(obj, "value-id", "map type"), "value-id"),
            type_from_json(_require(obj, "value", "map type")),
            _bool(_require(obj, "value-required", "map type"), "value-required"),
        )
    raise ValidationError(f"unknown nested type {kind!r} in {obj!r:.200}")


def _int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(f"{name!r} must be an integer, got {value!r:.100}")
    return value


def _bool(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise ValidationError(f"{name!r} must be a boolean, got {value!r:.100}")
    return value


def field_from_json(obj: Any) -> NestedField:
    """Parse one struct field, converting defaults from the JSON single-value form."""
    if not isinstance(obj, dict):
        raise ValidationError(f"a struct field must be a JSON object, got {obj!r:.200}")
    field_id = _int(_require(obj, "id", "struct field"), "id")
    name = _require(obj, "name", f"field {field_id}")
    if not isinstance(name, str):
        raise ValidationError(f"field {field_id}: 'name' must be a string, got {name!r:.100}")
    field_type = type_from_json(_require(obj, "type", f"field {field_id} ({name})"))
    doc = obj.get("doc")
    try:
        initial = obj.get("initial-default")
        write = obj.get("write-default")
        initial = None if initial is None else from_json_value(field_type, initial)
        write = None if write is None else from_json_value(field_type, write)
    except ValidationError as e:
        raise ValidationError(f"field {field_id} ({name}): bad default value: {e}") from e
    return NestedField(
        field_id,
        name,
        field_type,
        _bool(_require(obj, "required", f"field {field_id} ({name})"), "required"),
        doc,
        initial,
        write,
    )


def field_to_json(f: NestedField) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": f.field_id,
        "name": f.name,
        "required": f.required,
        "type": type_to_json(f.field_type),
    }
    if f.doc is not None:
        out["doc"] = f.doc
    if f.initial_default is not None:
        out["initial-default"] = to_json_value(f.field_type, f.initial_default)
    if f.write_default is not None:
        out["write-default"] = to_json_value(f.field_type, f.write_default)
    return out


__all__ = ["field_from_json", "field_to_json", "type_from_json", "type_to_json"]
