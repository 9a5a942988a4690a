"""Namespace and table names in the read routes' paths, checked before they reach storage.

Catalogs map names to storage paths: a name that is a path step of its own would let a
request reach outside the warehouse, and one longer than a path component can be would fail
in storage with a message naming the server's paths.
"""

from __future__ import annotations

from aiohttp import web

from icefloe.planner.errors import bad_request
from icefloe.table.catalog import Namespace, TableIdentifier

NAMESPACE_SEPARATOR = "\x1f"
MAX_NAME_BYTES = 255  # a file name component on common filesystems and object stores


def check_name(name: str, what: str) -> str:
    """``name`` if it is a safe path step of at most :data:`MAX_NAME_BYTES`, else 400."""
    if not name or name in (".", "..") or "/" in name or "\x00" in name:
        raise bad_request(
            f"invalid {what} {name[:64]!r}: names must be non-empty, not '.' or '..', "
            "and contain no '/'"
        )
    if len(name.encode("utf-8")) > MAX_NAME_BYTES:
        raise bad_request(
            f"invalid {what} {name[:32]!r}...: names are limited to {MAX_NAME_BYTES} bytes (UTF-8)"
        )
    return name


def parse_namespace(text: str) -> Namespace:
    """A namespace path parameter: levels separated by the unit separator (0x1F)."""
    if not text:
        raise bad_request("the namespace is empty")
    return tuple(check_name(p, "namespace level") for p in text.split(NAMESPACE_SEPARATOR))


def table_identifier(request: web.Request) -> TableIdentifier:
    """The table a ``.../namespaces/{namespace}/tables/{table}/...`` route names."""
    namespace = parse_namespace(request.match_info["namespace"])
    return TableIdentifier(namespace, check_name(request.match_info["table"], "table name"))


def table_key(ident: TableIdentifier) -> str:
    """The table's name as plan tokens carry it (levels and name joined by 0x1F)."""
    return NAMESPACE_SEPARATOR.join((*ident.namespace, ident.name))
