"""The namespace routes of the REST catalog's write side: ``createNamespace``,
``dropNamespace`` (409 ``NamespaceNotEmptyException`` when it holds tables or namespaces) and
``updateProperties`` (``updated``/``removed``/``missing``; 422 for a key both set and
removed). Each success is audited here; refusals by the planner's request middleware."""

from __future__ import annotations

from aiohttp import web

from icefloe.errors import AlreadyExistsError, NotFoundError
from icefloe.planner.auth import audit, principal_of
from icefloe.planner.catalog_writes import CatalogWrites
from icefloe.planner.errors import ApiError
from icefloe.planner.write_requests import (
    CreateNamespaceRequest,
    UpdateNamespacePropertiesRequest,
    check_name,
    path_namespace,
    read_body,
)


class NamespaceRoutes:
    """The namespace write handlers."""

    def __init__(self, writes: CatalogWrites) -> None:
        self.writes = writes
        self.catalog = writes.catalog

    async def create_namespace(self, request: web.Request) -> web.StreamResponse:
        body = await read_body(request, CreateNamespaceRequest)
        namespace = tuple(check_name(p, "namespace level") for p in body.namespace)
        try:
            await self.catalog.create_namespace(namespace, body.properties)
        except AlreadyExistsError as e:
            raise ApiError(409, "AlreadyExistsException", str(e)) from None
        properties = await self.catalog.load_namespace_properties(namespace)
        audit(
            principal_of(request),
            "createNamespace",
            status=200,
            namespace=".".join(namespace),
        )
        return web.json_response({"namespace": list(namespace), "properties": properties})

    async def drop_namespace(self, request: web.Request) -> web.StreamResponse:
        namespace = path_namespace(request.match_info["namespace"])
        await self.writes.namespace_or_404(namespace)
        try:
            await self.catalog.drop_namespace(namespace)
        except NotFoundError as e:
            raise ApiError(404, "NoSuchNamespaceException", str(e)) from None
        audit(principal_of(request), "dropNamespace", status=204, namespace=".".join(namespace))
        return web.Response(status=204)

    async def update_namespace_properties(self, request: web.Request) -> web.StreamResponse:
        namespace = path_namespace(request.match_info["namespace"])
        body = await read_body(request, UpdateNamespacePropertiesRequest)
        both = sorted(set(body.removals) & set(body.updates))
        if both:
            raise ApiError(
                422,
                "UnprocessableEntityException",
                f"properties {both} are both updated and removed; send each key once",
            )
        before = await self.writes.namespace_or_404(namespace)
        removals = set(body.removals)
        try:
            await self.catalog.update_namespace_properties(namespace, removals, body.updates)
        except NotFoundError as e:
            raise ApiError(404, "NoSuchNamespaceException", str(e)) from None
        removed = sorted(k for k in removals if k in before)
        missing = sorted(k for k in removals if k not in before)
        audit(
            principal_of(request),
            "updateProperties",
            status=200,
            namespace=".".join(namespace),
            updated=sorted(body.updates),
            removed=removed,
        )
        return web.json_response(
            {"updated": sorted(body.updates), "removed": removed, "missing": missing}
        )
