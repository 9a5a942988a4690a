"""The planner's REST endpoints and their OpenAPI document, cut from the Iceberg REST spec."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

# (method, path) of every implemented route, as the OpenAPI document spells the path.
ENDPOINTS: tuple[tuple[str, str], ...] = (
    ("GET", "/v1/{prefix}/namespaces"),
    ("GET", "/v1/{prefix}/namespaces/{namespace}"),
    ("HEAD", "/v1/{prefix}/namespaces/{namespace}"),
    ("GET", "/v1/{prefix}/namespaces/{namespace}/tables"),
    ("GET", "/v1/{prefix}/namespaces/{namespace}/tables/{table}"),
    ("HEAD", "/v1/{prefix}/namespaces/{namespace}/tables/{table}"),
    ("POST", "/v1/{prefix}/namespaces/{namespace}/tables/{table}/plan"),
    ("GET", "/v1/{prefix}/namespaces/{namespace}/tables/{table}/plan/{plan-id}"),
    ("DELETE", "/v1/{prefix}/namespaces/{namespace}/tables/{table}/plan/{plan-id}"),
    ("POST", "/v1/{prefix}/namespaces/{namespace}/tables/{table}/tasks"),
)


_EXTENSIONS = {
    "ref": {
        "description": "icefloe extension: plan a point-in-time scan of the snapshot a branch "
        "or tag points to. Excludes snapshot-id, as-of-timestamp-ms and incremental scans.",
        "type": "string",
    },
    "as-of-timestamp-ms": {
        "description": "icefloe extension: plan a point-in-time scan of the snapshot that was "
        "current at this time (milliseconds since the epoch), found in the snapshot log.",
        "type": "integer",
        "format": "int64",
    },
}


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _refs(item)


def trim_openapi(
    spec: Mapping[str, Any], endpoints: tuple[tuple[str, str], ...] = ENDPOINTS
) -> dict[str, Any]:
    """The REST OpenAPI document cut down to ``endpoints`` and what they reference,
    with the planning request's extensions documented."""
    wanted: dict[str, set[str]] = {}
    for method, path in (*endpoints, ("GET", "/v1/config")):
        wanted.setdefault(path, set()).add(method.lower())
    paths: dict[str, Any] = {}
    for path, item in spec["paths"].items():
        if path not in wanted:
            continue
        kept = {
            k: v for k, v in item.items() if k in wanted[path] or k in ("parameters", "summary")
        }
        paths[path] = kept
    components = spec.get("components", {})
    keep: dict[str, set[str]] = {}
    pending = list(_refs(paths)) + list(_refs(spec.get("security", [])))
    while pending:
        ref = pending.pop()
        if not ref.startswith("#/components/"):
            continue
        _, _, section, name = ref.split("/", 3)
        if name in keep.setdefault(section, set()):
            continue
        keep[section].add(name)
        pending.extend(_refs(components.get(section, {}).get(name, {})))
    trimmed_components: dict[str, Any] = {}
    for section, names in components.items():
        if section == "securitySchemes":
            trimmed_components[section] = names
            continue
        chosen = {n: v for n, v in names.items() if n in keep.get(section, set())}
        if chosen:
            trimmed_components[section] = chosen
    request = trimmed_components.get("schemas", {}).get("PlanTableScanRequest")
    if request is not None:
        request = json.loads(json.dumps(request))
        request.setdefault("properties", {}).update(_EXTENSIONS)
        trimmed_components["schemas"]["PlanTableScanRequest"] = request
    out = {k: v for k, v in spec.items() if k not in ("paths", "components")}
    out["info"] = dict(spec.get("info", {}))
    out["info"]["title"] = "icefloe planner (Apache Iceberg REST Catalog API subset)"
    out["paths"] = paths
    out["components"] = trimmed_components
    return out


def served_openapi(document: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """The trimmed document with ``{prefix}`` resolved to this server's prefix."""
    out = json.loads(json.dumps(document))
    base = f"/v1/{prefix}/" if prefix else "/v1/"
    paths = {}
    for path, item in out["paths"].items():
        params = item.get("parameters")
        if params:
            item["parameters"] = [
                p for p in params if p.get("$ref") != "#/components/parameters/prefix"
            ]
        paths[path.replace("/v1/{prefix}/", base)] = item
    out["paths"] = paths
    out["servers"] = [{"url": "/"}]
    return out
