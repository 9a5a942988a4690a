"""The write routes' request bodies and names, validated before anything is written.

Bodies are the REST spec's request models (unknown keys ignored, as clients add their own);
a malformed one is a 400 naming what was wrong. Names become storage paths and
Redis/DynamoDB keys, so a namespace level or table name is 1 to :data:`MAX_NAME_BYTES` bytes
of UTF-8 without separators or control characters (stricter than the read routes, which
must still find tables other writers named).
"""

from __future__ import annotations

import re
from typing import Any, TypeVar

import pydantic
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr

from icefloe.errors import ValidationError
from icefloe.planner.errors import bad_request
from icefloe.spec.metadata import TableMetadata
from icefloe.spec.model import describe_problems
from icefloe.spec.partition import PARTITION_FIELD_ID_START
from icefloe.table.catalog import Namespace, TableIdentifier

M = TypeVar("M", bound=BaseModel)

NAMESPACE_SEPARATOR = "\x1f"
MAX_NAME_BYTES = 255  # a path component on common file systems and object stores
# Names become storage paths and Redis/DynamoDB keys: no separators, no control characters.
_BAD_NAME = re.compile(r"[/\\.\x00-\x1f\x7f]")


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True, frozen=True)


class CreateNamespaceRequest(_Body):
    namespace: list[StrictStr] = Field(..., min_length=1)
    properties: dict[StrictStr, StrictStr] = Field(default_factory=dict)


class UpdateNamespacePropertiesRequest(_Body):
    removals: list[StrictStr] = Field(default_factory=list)
    updates: dict[StrictStr, StrictStr] = Field(default_factory=dict)


class CreateTableRequest(_Body):
    name: StrictStr
    location: StrictStr | None = Field(None, min_length=1)
    schema_: dict[str, Any] = Field(..., alias="schema")
    partition_spec: dict[str, Any] | None = Field(None, alias="partition-spec")
    write_order: dict[str, Any] | None = Field(None, alias="write-order")
    stage_create: StrictBool = Field(False, alias="stage-create")
    properties: dict[StrictStr, StrictStr] = Field(default_factory=dict)


class RegisterTableRequest(_Body):
    name: StrictStr
    metadata_location: StrictStr = Field(..., alias="metadata-location", min_length=1)
    overwrite: StrictBool = False


class IdentifierBody(_Body):
    namespace: list[StrictStr]
    name: StrictStr


class RenameTableRequest(_Body):
    source: IdentifierBody
    destination: IdentifierBody


class CommitTableRequest(_Body):
    identifier: IdentifierBody | None = None
    requirements: list[Any]
    updates: list[Any]


class CommitTransactionRequest(_Body):
    table_changes: list[CommitTableRequest] = Field(..., alias="table-changes", min_length=1)


async def read_body(request: web.Request, model: type[M]) -> M:
    """The request's body as ``model``; 400 naming the problems when it is not one."""
    raw = await request.read()
    if not raw.strip():
        raise bad_request(f"the request needs a JSON {model.__name__} body")
    try:
        return model.model_validate_json(raw)
    except pydantic.ValidationError as e:
        raise bad_request(f"invalid {model.__name__}: {describe_problems(e, limit=5)}") from None
    except (ValidationError, ValueError) as e:
        raise bad_request(f"invalid {model.__name__}: {e}") from None


def check_name(name: str, what: str) -> str:
    """A namespace level or table name that is safe as a path step and a key: its UTF-8
    length is what file systems and object stores limit, not its number of characters."""
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:  # a lone surrogate ("\ud800") has no UTF-8 form
        size = -1
    if not 0 < size <= MAX_NAME_BYTES or _BAD_NAME.search(name):
        raise bad_request(
            f"invalid {what} {name[:80]!r}: names must be 1 to {MAX_NAME_BYTES} bytes of "
            "UTF-8 without '/', '\\', '.' or control characters"
        )
    return name


def path_namespace(text: str) -> Namespace:
    """A namespace path parameter: levels separated by the unit separator (0x1F)."""
    if not text:
        raise bad_request("the namespace is empty")
    return tuple(check_name(p, "namespace level") for p in text.split(NAMESPACE_SEPARATOR))


def identifier_of(body: IdentifierBody) -> TableIdentifier:
    """The table a body's identifier names, its namespace and name checked."""
    if not body.namespace:
        raise bad_request(f"table identifier {body.name!r} has an empty namespace")
    return TableIdentifier(
        tuple(check_name(p, "namespace level") for p in body.namespace),
        check_name(body.name, "table name"),
    )


def path_table(request: web.Request) -> TableIdentifier:
    """The table a ``.../namespaces/{namespace}/tables/{table}`` route names."""
    return TableIdentifier(
        path_namespace(request.match_info["namespace"]),
        check_name(request.match_info["table"], "table name"),
    )


def with_field_ids(spec: dict[str, Any]) -> dict[str, Any]:
    """A create request's spec may leave ids out: the new table assigns them anyway."""
    fields = spec.get("fields", [])
    if not isinstance(fields, list):
        raise bad_request(f"partition-spec needs a 'fields' list, got {fields!r:.100}")
    return {
        **spec,
        "spec-id": spec.get("spec-id", 0),
        "fields": [
            {**f, "field-id": PARTITION_FIELD_ID_START + i}
            if isinstance(f, dict) and f.get("field-id") is None
            else f
            for i, f in enumerate(fields)
        ],
    }


def snapshot_id_of(metadata: TableMetadata | None) -> int | None:
    """The current snapshot's id (for the audit log), if there is one."""
    if metadata is None:
        return None
    current = metadata.current_snapshot()
    return current.snapshot_id if current is not None else None
