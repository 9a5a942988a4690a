"""The pydantic plumbing of icefloe's JSON models: spec names on the wire, typed errors.

Table metadata, snapshots, REST updates and requirements, and Kafka events are all pydantic
models of JSON the spec (or the event contract) names with hyphens. They share three rules,
kept here so that each model module does not grow its own copy: python names in code and
hyphenated names on the wire (:func:`hyphenate`), unknown fields ignored, and a pydantic
error turned into one icefloe error that names the field (:func:`pydantic_error_to_icefloe`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import pydantic
from pydantic import BaseModel, ConfigDict, TypeAdapter
from pydantic_core import ErrorDetails

from icefloe.errors import IcefloeError, ValidationError

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


def hyphenate(name: str) -> str:
    """The spec's JSON name of a python field name (``snapshot_id`` -> ``snapshot-id``)."""
    return name.replace("_", "-")


class IcebergModel(BaseModel):
    """Base for the JSON models: hyphenated names on the wire, python names in code.

    Aliases come from :func:`hyphenate` rather than per-field ``alias=`` so that type
    checkers see the python names as constructor keywords. Unknown JSON fields are ignored,
    as the Java parser ignores them, so metadata from a newer writer of the same format
    version still loads.
    """

    model_config = ConfigDict(
        alias_generator=hyphenate, populate_by_name=True, frozen=True, extra="ignore"
    )

    def to_json(self) -> dict[str, Any]:
        """The spec's JSON object: aliases as keys, absent optional fields omitted."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")

    @classmethod
    def from_json(cls: type[M], obj: Any, what: str | None = None) -> M:
        return model_from_json(cls, obj, what or cls.__name__)


def describe_loc(loc: Sequence[int | str]) -> str:
    """Where in a document pydantic found a problem, as a path: ``snapshots[2].summary``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def describe_problem(
    error: ErrorDetails,
    name_of: Callable[[Sequence[int | str]], str] | None = None,
    *,
    inputs: bool = True,
) -> str:
    """One pydantic problem as a phrase that names the field and says what was wrong.

    By default a field is named by its JSON path (``snapshots[1].summary: ...``, ``missing
    required field 'timestamp-ms' in snapshots[1]``); ``name_of`` names it the way the user
    wrote it instead (``field 'table'``, ``setting ICEFLOE_CATALOG``). ``inputs=False``
    leaves the offending value out of the message (settings may hold secrets).
    """
    loc = tuple(error.get("loc", ()))
    if error.get("type") == "missing":
        if name_of is not None:
            return f"missing required {name_of(loc)}"
        field = str(loc[-1]) if loc else "?"
        parent = describe_loc(loc[:-1])
        return f"missing required field {field!r}" + (f" in {parent}" if parent else "")
    cause = (error.get("ctx") or {}).get("error")
    if isinstance(cause, IcefloeError):
        msg = str(cause)
    else:
        msg = str(error.get("msg", "invalid value"))
        msg = msg[:1].lower() + msg[1:]
        if inputs and "input" in error and error.get("type") != "value_error":
            msg += f" (got {error['input']!r:.80})"
    where = (name_of or describe_loc)(loc) if loc else ""
    return f"{where}: {msg}" if where else msg


def describe_problems(
    err: pydantic.ValidationError,
    name_of: Callable[[Sequence[int | str]], str] | None = None,
    *,
    inputs: bool = True,
    limit: int = 10,
) -> str:
    """Each of pydantic's problems (:func:`describe_problem`), the first ``limit`` of them."""
    problems = [describe_problem(e, name_of, inputs=inputs) for e in err.errors()]
    text = "; ".join(problems[:limit])
    if len(problems) > limit:
        text += f"; and {len(problems) - limit} more problem(s)"
    return text


def icefloe_cause(err: pydantic.ValidationError) -> IcefloeError | None:
    """The first icefloe error raised inside a validator, if any."""
    for e in err.errors():
        cause = (e.get("ctx") or {}).get("error")
        if isinstance(cause, IcefloeError):
            return cause
    return None


def pydantic_error_to_icefloe(err: pydantic.ValidationError, what: str) -> IcefloeError:
    """Turn pydantic's error list into one typed icefloe error naming the field.

    An icefloe error raised inside a validator keeps its class (UnsupportedFormatVersion
    stays UnsupportedFormatVersion) so callers can still tell the cases apart.
    """
    text = f"{what}: " + describe_problems(err)
    original = icefloe_cause(err)
    if original is not None and err.error_count() == 1 and isinstance(original, ValidationError):
        return type(original)(text)
    return ValidationError(text)


def union_from_json(adapter: TypeAdapter[T], obj: Any, what: str) -> T:
    """Validate ``obj`` into one of a discriminated union of models (REST updates and
    requirements), raising an icefloe error instead of pydantic's."""
    try:
        return adapter.validate_python(obj)
    except pydantic.ValidationError as e:
        raise pydantic_error_to_icefloe(e, what) from None


def model_from_json(cls: type[M], obj: Any, what: str) -> M:
    """Validate ``obj`` into ``cls``, raising an icefloe error instead of pydantic's."""
    try:
        return cls.model_validate(obj)
    except pydantic.ValidationError as e:
        raise pydantic_error_to_icefloe(e, what) from None


__all__ = [
    "IcebergModel",
    "describe_loc",
    "describe_problem",
    "describe_problems",
    "hyphenate",
    "icefloe_cause",
    "model_from_json",
    "pydantic_error_to_icefloe",
    "union_from_json",
]
