"""The write side of the Iceberg REST catalog, served by the planner next to its read routes.

Routes (REST OpenAPI names), all through the planner's catalog:

* ``createNamespace``, ``dropNamespace`` (409 ``NamespaceNotEmptyException`` when it holds
  tables or namespaces), ``updateProperties`` (``updated``/``removed``/``missing``; 422 for a
  key both set and removed);
* ``createTable`` (also ``stage-create``: metadata returned and, on a local disk, the table's
  metadata and data folders made, as engines write their first files there before the
  create commit), ``registerTable``, ``dropTable`` (``purgeRequested`` deletes the reachable
  files that lie under the table's own location),
  ``renameTable`` (406 where the catalog cannot: file-system tables are found by their path);
* ``updateTable`` and ``commitTransaction``: requirements checked and updates applied by
  :mod:`icefloe.table.changes` through the catalog's conditional swap, re-checked after every
  lost swap, so REST commits and coordinator batches never lose each other's changes. A failed
  requirement is 409 ``CommitFailedException`` with nothing applied; 500
  ``CommitStateUnknownException`` only when the store cannot say whether the swap happened.
  Transactions of several tables are atomic on catalogs with multi-key writes (Redis,
  DynamoDB) and 406 elsewhere, before anything is written.

Every location a request names or a commit adds (table locations, location-bearing
properties, manifest lists, manifests, data files, registered metadata files) obeys
:class:`~icefloe.planner.location_policy.LocationPolicy`.

Errors are raised as :class:`ApiError` in the spec's types and answered (and, refused or
failed, audited) by the planner's request middleware, never a traceback. Tokens and the audit
log are :mod:`icefloe.planner.auth`'s. The planner sees a REST commit at once: the new metadata goes
straight into its table state.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import sys
import weakref
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pydantic
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr

from icefloe.catalog.location_index import TableLocations
from icefloe.catalog.records import catalog_records
from icefloe.errors import (
    AlreadyExistsError,
    CommitFailedError,
    CommitStateUnknownError,
    FileIOError,
    IcefloeError,
    InvalidFileError,
    NamespaceNotEmptyError,
    NotFoundError,
    UnsupportedOperationError,
    ValidationError,
)
from icefloe.manifests.cache import ManifestCache
from icefloe.planner.auth import (
    OAUTH_PATH,
    WRITE_ROUTE_PREFIX,
    TokenAuthority,
    audit,
    oauth_tokens,
    principal_of,
)
from icefloe.planner.config import PlannerConfig
from icefloe.planner.delegation import AccessDelegation
from icefloe.planner.errors import ApiError
from icefloe.planner.idempotency import (
    IDEMPOTENCY_LIFETIME,
    Attempt,
    IdempotentRequests,
    attempt_of,
)
from icefloe.planner.load_result import table_config, table_etag
from icefloe.planner.location_policy import LocationPolicy
from icefloe.planner.refresher import TableRefresher
from icefloe.planner.write_config import RestCatalogSettings
from icefloe.spec.metadata import TableMetadata
from icefloe.spec.metadata_builder import new_table_metadata
from icefloe.spec.model import describe_problems
from icefloe.spec.partition import PARTITION_FIELD_ID_START, PartitionSpec
from icefloe.spec.schema import Schema
from icefloe.spec.sort_order import SortOrder
from icefloe.table.catalog import (
    Catalog,
    Namespace,
    Table,
    TableChange,
    TableIdentifier,
    data_dir,
    metadata_dir,
)
from icefloe.table.changes import DEFAULT_POLICY, CommitOutcome, TableCommit, commit_table_changes
from icefloe.table.commit import CommitStats, RetryPolicy
from icefloe.table.maintenance import purge_table_files
from icefloe.table.maintenance_policy import check_policy_change

log = logging.getLogger(__name__)
M = TypeVar("M", bound=BaseModel)


class PlannerService(Protocol):
    """What the write routes use of the planner that serves them
    (:class:`icefloe.planner.app.PlannerService`, which imports this module, not the reverse)."""

    @property
    def config(self) -> PlannerConfig: ...

    @property
    def catalog(self) -> Catalog: ...

    @property
    def refresher(self) -> TableRefresher: ...

    @property
    def cache(self) -> ManifestCache: ...

    @property
    def registry(self) -> CollectorRegistry: ...

    @property
    def delegation(self) -> AccessDelegation: ...


NAMESPACE_SEPARATOR = "\x1f"
MAX_NAME_BYTES = 255  # a path component on common file systems and object stores
# Names become storage paths and Redis/DynamoDB keys: no separators, no control characters.
_BAD_NAME = re.compile(r"[/\\.\x00-\x1f\x7f]")


def _bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequestException", message)


# ---------------------------------------------------------------------------------------------
# Request bodies
# ---------------------------------------------------------------------------------------------


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


async def _body(request: web.Request, model: type[M]) -> M:
    raw = await request.read()
    if not raw.strip():
        raise _bad_request(f"the request needs a JSON {model.__name__} body")
    try:
        return model.model_validate_json(raw)
    except pydantic.ValidationError as e:
        raise _bad_request(f"invalid {model.__name__}: {describe_problems(e, limit=5)}") from None
    except (ValidationError, ValueError) as e:
        raise _bad_request(f"invalid {model.__name__}: {e}") from None


def check_name(name: str, what: str) -> str:
    """A namespace level or table name that is safe as a path step and a key: its UTF-8
    length is what file systems and object stores limit, not its number of characters."""
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:  # a lone surrogate ("\ud800") has no UTF-8 form
        size = -1
    if not 0 < size <= MAX_NAME_BYTES or _BAD_NAME.search(name):
        raise _bad_request(
            f"invalid {what} {name[:80]!r}: names must be 1 to {MAX_NAME_BYTES} bytes of "
            "UTF-8 without '/', '\\', '.' or control characters"
        )
    return name


def path_namespace(text: str) -> Namespace:
    if not text:
        raise _bad_request("the namespace is empty")
    return tuple(check_name(p, "namespace level") for p in text.split(NAMESPACE_SEPARATOR))


def _identifier(body: IdentifierBody) -> TableIdentifier:
    if not body.namespace:
        raise _bad_request(f"table identifier {body.name!r} has an empty namespace")
    return TableIdentifier(
        tuple(check_name(p, "namespace level") for p in body.namespace),
        check_name(body.name, "table name"),
    )


def _path_table(request: web.Request) -> TableIdentifier:
    return TableIdentifier(
        path_namespace(request.match_info["namespace"]),
        check_name(request.match_info["table"], "table name"),
    )


def _with_field_ids(spec: dict[str, Any]) -> dict[str, Any]:
    """A create request's spec may leave ids out: the new table assigns them anyway."""
    fields = spec.get("fields", [])
    if not isinstance(fields, list):
        raise _bad_request(f"partition-spec needs a 'fields' list, got {fields!r:.100}")
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


def _snapshot_id(metadata: TableMetadata | None) -> int | None:
    if metadata is None:
        return None
    current = metadata.current_snapshot()
    return current.snapshot_id if current is not None else None


# ---------------------------------------------------------------------------------------------
# Routes
# ---------------------------------------------------------------------------------------------

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# (method, path under /v1/{prefix}/, operation id, WriteRoutes method)
ROUTES: tuple[tuple[str, str, str, str], ...] = (
    ("POST", "namespaces", "createNamespace", "create_namespace"),
    ("DELETE", "namespaces/{namespace}", "dropNamespace", "drop_namespace"),
    (
        "POST",
        "namespaces/{namespace}/properties",
        "updateProperties",
        "update_namespace_properties",
    ),
    ("POST", "namespaces/{namespace}/tables", "createTable", "create_table"),
    ("POST", "namespaces/{namespace}/register", "registerTable", "register_table"),
    ("POST", "namespaces/{namespace}/tables/{table}", "updateTable", "update_table"),
    ("DELETE", "namespaces/{namespace}/tables/{table}", "dropTable", "drop_table"),
    ("POST", "tables/rename", "renameTable", "rename_table"),
    ("POST", "transactions/commit", "commitTransaction", "commit_transaction"),
)
WRITE_ENDPOINTS: tuple[tuple[str, str], ...] = tuple(
    (method, "/v1/{prefix}/" + path) for method, path, _, _ in ROUTES
)
OPENAPI_FILE = Path(__file__).with_name("write_openapi.json")


_LOST_SWAPS: weakref.WeakKeyDictionary[CollectorRegistry, Counter] = weakref.WeakKeyDictionary()


def _lost_swaps_counter(registry: CollectorRegistry) -> Counter:
    """One counter per registry, however often the service builds its app."""
    counter = _LOST_SWAPS.get(registry)
    if counter is None:
        counter = _LOST_SWAPS[registry] = Counter(
            "icefloe_rest_lost_swaps",
            "REST commits whose swap lost to another committer and were re-checked",
            registry=registry,
        )
    return counter


class WriteRoutes:
    """The write handlers over a planner service's catalog and table state."""

    def __init__(
        self, service: PlannerService, settings: RestCatalogSettings, authority: TokenAuthority
    ) -> None:
        self.service = service
        self.settings = settings
        self.catalog = service.catalog
        self.authority = authority
        self.locations = LocationPolicy(
            settings.allowed_location_list() or [self.catalog.properties.get("warehouse", "")]
        )
        self.policy = RetryPolicy(
            num_retries=settings.commit_retries,
            min_wait_ms=DEFAULT_POLICY.min_wait_ms,
            max_wait_ms=DEFAULT_POLICY.max_wait_ms,
            total_timeout_ms=DEFAULT_POLICY.total_timeout_ms,
        )
        self.tables_by_location = TableLocations(self.catalog)
        self.endpoints: list[tuple[str, str]] = []
        self.stats = CommitStats()
        self._lost_swaps = _lost_swaps_counter(service.registry)
        self.idempotency = (
            IdempotentRequests(
                catalog_records(self.catalog),
                settings.idempotency_key_lifetime_s,
                settings.idempotency_lease_s,
            )
            if settings.idempotency_key_lifetime_s > 0
            else None
        )

    # -- registration -----------------------------------------------------------------------

    def register(self, app: web.Application, prefix: str) -> list[tuple[str, str]]:
        """Add the routes, named ``write.<operationId>`` (how the token check and the audit
        of refusals know a write); return the endpoints to advertise in ``/v1/config``, in
        the spec's ``{prefix}`` form."""
        app.router.add_post(OAUTH_PATH, self._oauth)
        base = f"/v1/{prefix}/" if prefix else "/v1/"
        advertised = []
        if self.idempotency is not None:
            app[IDEMPOTENCY_LIFETIME] = self.idempotency.lifetime
        for method, path, operation, attribute in ROUTES:
            wrapped = self._wrap(getattr(self, attribute), operation)
            if self.idempotency is not None:
                wrapped = self.idempotency.wrap(wrapped)
            app.router.add_route(method, base + path, wrapped, name=WRITE_ROUTE_PREFIX + operation)
            if operation != "renameTable" or self.catalog.supports_rename:
                advertised.append((method, "/v1/{prefix}/" + path))
        self.endpoints = advertised
        return advertised

    def _wrap(self, handler: Handler, operation: str) -> Handler:
        """Map typed errors to the spec's answers, raised as ApiError for the planner's
        request middleware to answer and audit (successes audit inside the handler)."""

        async def wrapped(request: web.Request) -> web.StreamResponse:
            try:
                return await handler(request)
            except (ApiError, web.HTTPException):
                raise
            except NamespaceNotEmptyError as e:
                error = ApiError(409, "NamespaceNotEmptyException", str(e))
            except ValidationError as e:
                error = ApiError(400, "BadRequestException", str(e))
            except NotFoundError as e:
                error = ApiError(404, _not_found_type(str(e)), str(e))
            except AlreadyExistsError as e:
                error = ApiError(409, "AlreadyExistsException", str(e))
            except CommitFailedError as e:
                error = ApiError(409, "CommitFailedException", str(e))
            except UnsupportedOperationError as e:
                error = ApiError(406, "UnsupportedOperationException", str(e))
            except CommitStateUnknownError as e:
                log.error("%s %s: %s", request.method, request.path, e)
                error = ApiError(500, "CommitStateUnknownException", str(e))
            except FileIOError as e:
                log.error("%s %s: storage failed: %s", request.method, request.path, e)
                error = ApiError(
                    503,
                    "ServiceUnavailableException",
                    "table storage is unavailable; retry later (details in the server's log)",
                )
            except IcefloeError as e:
                log.error("%s %s: %s", request.method, request.path, e)
                error = ApiError(500, "InternalServerError", "internal error; see the server log")
            except Exception:
                log.exception("%s %s failed", request.method, request.path)
                error = ApiError(500, "InternalServerError", "internal error; see the server log")
            raise error

        wrapped.__name__ = operation
        return wrapped

    async def _oauth(self, request: web.Request) -> web.StreamResponse:
        return await oauth_tokens(self.authority, request)

    # -- namespaces -------------------------------------------------------------------------

    async def create_namespace(self, request: web.Request) -> web.StreamResponse:
        body = await _body(request, CreateNamespaceRequest)
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

    async def _namespace_or_404(
        self, namespace: Namespace, error_type: str = "NoSuchNamespaceException"
    ) -> dict[str, str]:
        """The namespace's properties, or 404 in ``error_type``: the spec answers an unknown
        namespace with NoSuchTableException on the routes of one table (drop, commit)."""
        try:
            return await self.catalog.load_namespace_properties(namespace)
        except NotFoundError:
            raise ApiError(
                404, error_type, f"namespace {'.'.join(namespace)!r} does not exist"
            ) from None

    async def drop_namespace(self, request: web.Request) -> web.StreamResponse:
        namespace = path_namespace(request.match_info["namespace"])
        await self._namespace_or_404(namespace)
        try:
            await self.catalog.drop_namespace(namespace)
        except NotFoundError as e:
            raise ApiError(404, "NoSuchNamespaceException", str(e)) from None
        audit(principal_of(request), "dropNamespace", status=204, namespace=".".join(namespace))
        return web.Response(status=204)

    async def update_namespace_properties(self, request: web.Request) -> web.StreamResponse:
        namespace = path_namespace(request.match_info["namespace"])
        body = await _body(request, UpdateNamespacePropertiesRequest)
        both = sorted(set(body.removals) & set(body.updates))
        if both:
            raise ApiError(
                422,
                "UnprocessableEntityException",
                f"properties {both} are both updated and removed; send each key once",
            )
        before = await self._namespace_or_404(namespace)
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

    # -- tables -----------------------------------------------------------------------------

    async def _load_result(
        self, request: web.Request, name: str, location: str | None, metadata: TableMetadata
    ) -> web.Response:
        body: dict[str, Any] = {
            "metadata": metadata.to_json(),
            "config": table_config(metadata.properties, self.service.config.scan_planning_mode),
        }
        if location is not None:
            body["metadata-location"] = location
        await self.service.delegation.decorate(request, body, metadata, name)
        if location is None:
            return web.json_response(body)
        return web.json_response(body, headers={"ETag": table_etag(location)})

    def _seen(self, table: Table) -> None:
        """The planner answers from the committed state at once, not after a refresh."""
        self.service.refresher.committed(table.identifier, table.metadata, table.metadata_location)

    @property
    def _indexed(self) -> bool:
        """Whether tables are checked for overlapping locations when they are made or
        moved: with a stored location index (metastore catalogs). The file-system catalog
        keeps every table at its own path and refuses any other location itself (400);
        overlaps it can still hold (a namespace folder inside a table's) are caught when a
        purge asks."""
        return self.tables_by_location.index.stored

    async def _refuse_overlap(self, ident: TableIdentifier, location: str) -> None:
        """403 if another table's location contains ``location`` or lies within it."""
        if not self._indexed:
            return
        other = await self.tables_by_location.overlapping_table(location, excluding=ident)
        if other is not None:
            raise _overlap_error(location, other)

    async def _claim_new(self, table: Table) -> None:
        """Enter a table just created or registered in the location index; if another
        table's location overlaps (a concurrent claim), undo the creation and refuse."""
        if not self._indexed:
            return
        other = await self.tables_by_location.claim(table.location, table.identifier)
        if other is None:
            return
        await self.catalog.drop_table(table.identifier)
        self.service.refresher.dropped(table.identifier)
        raise _overlap_error(table.location, other)

    async def create_table(self, request: web.Request) -> web.StreamResponse:
        namespace = path_namespace(request.match_info["namespace"])
        body = await _body(request, CreateTableRequest)
        ident = TableIdentifier(namespace, check_name(body.name, "table name"))
        await self._namespace_or_404(namespace)
        attempt = attempt_of(request)
        made = await _noted_create(self.catalog, ident, attempt)
        if made is not None:  # (before the checks: its location is in use now, by it)
            return await self._created(request, made)
        schema = Schema.from_json(body.schema_)
        spec = (
            PartitionSpec.from_json(_with_field_ids(body.partition_spec))
            if body.partition_spec is not None
            else PartitionSpec.unpartitioned()
        )
        order = (
            SortOrder.from_json(body.write_order)
            if body.write_order is not None
            else SortOrder.unsorted()
        )
        default = await self.catalog.default_table_location(ident)
        location = body.location or default
        self.locations.check_table(location, body.properties)
        if location != default:
            await self.locations.check_unused(self.catalog.io, location, "table location")
        await self._refuse_overlap(ident, location)
        metadata = new_table_metadata(schema, spec, order, location, body.properties)
        principal = principal_of(request)
        if body.stage_create:
            if await self.catalog.table_exists(ident):
                raise ApiError(409, "AlreadyExistsException", f"table {ident} already exists")
            # Engines write the first manifest (DuckDB) and data files before the create
            # commit: on a local disk their folders must exist (object stores have none).
            for folder in (metadata_dir(metadata), data_dir(metadata)):
                await self.catalog.io.make_dirs(folder)
            audit(principal, "createTable", status=200, table=str(ident), staged=True)
            return await self._load_result(request, ident.name, None, metadata)
        if attempt is not None:
            await attempt.note({"create": str(ident), "digest": _digest(metadata)})
        try:
            table = await self.catalog.create_table_with_metadata(ident, metadata)
        except AlreadyExistsError as e:
            raise ApiError(409, "AlreadyExistsException", str(e)) from None
        return await self._created(request, table)

    async def _created(self, request: web.Request, table: Table) -> web.StreamResponse:
        await self._claim_new(table)
        self._seen(table)
        audit(
            principal_of(request),
            "createTable",
            status=200,
            table=str(table.identifier),
            **{"metadata-location": table.metadata_location},
        )
        return await self._load_result(
            request, table.identifier.name, table.metadata_location, table.metadata
        )

    async def register_table(self, request: web.Request) -> web.StreamResponse:
        namespace = path_namespace(request.match_info["namespace"])
        body = await _body(request, RegisterTableRequest)
        ident = TableIdentifier(namespace, check_name(body.name, "table name"))
        await self._namespace_or_404(namespace)
        self.locations.check(body.metadata_location, "metadata file")
        try:
            metadata = await self.catalog.read_metadata(body.metadata_location)
        except (NotFoundError, InvalidFileError, ValidationError) as e:
            raise _bad_request(f"cannot register {ident}: {e}") from None
        self.locations.check_table(metadata.location, metadata.properties)
        existing: Table | None = None
        if body.overwrite:
            try:
                existing = await self.catalog.load_table(ident)
            except NotFoundError:
                existing = None
        # Refused before anything changes: a registered table whose location overlaps
        # another table's would share its files, and purging it would delete them.
        await self._refuse_overlap(ident, metadata.location)
        if existing is None:
            try:
                table = await self.catalog.register_table(ident, body.metadata_location)
            except AlreadyExistsError as e:
                raise ApiError(409, "AlreadyExistsException", str(e)) from None
            await self._claim_new(table)
        else:
            try:
                table = await self.catalog.register_over(existing, body.metadata_location)
            except CommitFailedError:
                raise ApiError(
                    409,
                    "CommitFailedException",
                    f"table {ident} changed while it was being overwritten; retry the register",
                ) from None
            await self.tables_by_location.moved((existing.location, ident), (table.location, ident))
        self._seen(table)
        audit(
            principal_of(request),
            "registerTable",
            status=200,
            table=str(ident),
            overwrite=existing is not None or None,
            **{
                "metadata-location": table.metadata_location,
                "previous-metadata-location": existing.metadata_location if existing else None,
                "snapshot-id": _snapshot_id(table.metadata),
            },
        )
        return await self._load_result(request, ident.name, table.metadata_location, table.metadata)

    async def drop_table(self, request: web.Request) -> web.StreamResponse:
        ident = _path_table(request)
        purge_text = request.query.get("purgeRequested", "false").lower()
        if purge_text not in ("true", "false"):
            raise _bad_request(f"purgeRequested must be true or false, got {purge_text!r}")
        purge = purge_text == "true"
        await self._namespace_or_404(ident.namespace, "NoSuchTableException")
        refused: list[str] = []
        try:
            table = await self.catalog.load_table(ident)
            if purge:
                await self._refuse_shared_purge(table)
            await self.catalog.drop_table(ident)
        except NotFoundError:
            raise ApiError(404, "NoSuchTableException", f"table {ident} does not exist") from None
        self.service.refresher.dropped(ident)
        await self.tables_by_location.release(table.location, ident)
        if purge:
            # After the pointer is gone, so no reader meets a half-deleted table; only what
            # lies within the allowed locations is deleted.
            refused = await purge_table_files(table, self.locations.purgeable(table.metadata))
            if refused:
                log.warning(
                    "purging %s left %d files outside its location (or the allowed "
                    "locations), e.g. %s",
                    ident,
                    len(refused),
                    refused[0],
                )
        audit(
            principal_of(request),
            "dropTable",
            status=204,
            table=str(ident),
            purge=purge,
            **{"files-kept-outside-table-location": len(refused) or None},
        )
        return web.Response(status=204)

    async def _refuse_shared_purge(self, table: Table) -> None:
        """403 (nothing dropped) when another table's location overlaps this one's: their
        files are mixed, and a purge would delete the other table's."""
        other = await self.tables_by_location.overlapping_table(
            table.location, excluding=table.identifier
        )
        if other is not None:
            raise ApiError(
                403,
                "ForbiddenException",
                f"purging {table.identifier} is refused: its location overlaps the location of "
                f"table {other}, whose files a purge would delete; drop it without "
                "purgeRequested",
            )

    async def rename_table(self, request: web.Request) -> web.StreamResponse:
        body = await _body(request, RenameTableRequest)
        source, destination = _identifier(body.source), _identifier(body.destination)
        if not self.catalog.supports_rename:
            await self.catalog.rename_table(source, destination)  # raises, naming why
        await self._namespace_or_404(destination.namespace)
        try:
            location = (await self.catalog.load_table(source)).location
            await self.catalog.rename_table(source, destination)
        except NotFoundError as e:
            kind = "NoSuchNamespaceException" if "namespace" in str(e) else "NoSuchTableException"
            raise ApiError(404, kind, str(e)) from None
        self.service.refresher.dropped(source)
        await self.tables_by_location.moved((location, source), (location, destination))
        audit(
            principal_of(request),
            "renameTable",
            status=204,
            table=str(source),
            destination=str(destination),
        )
        return web.Response(status=204)

    # -- commits ----------------------------------------------------------------------------

    def _commit(self, ident: TableIdentifier, body: CommitTableRequest) -> TableCommit:
        try:
            return TableCommit.parse(ident, body.requirements, body.updates)
        except ValidationError as e:
            raise _bad_request(f"commit to {ident}: {e}") from None

    async def _check_change(self, change: TableChange) -> None:
        """The new metadata of a commit obeys the location policy, and its maintenance
        properties hold values maintenance can read (before the swap)."""
        base = change.base.metadata if change.base is not None else None
        await self.locations.check_commit(
            self.catalog.io, self.service.cache, base, change.new_metadata, str(change.identifier)
        )
        if base is None or base.location != change.new_metadata.location:
            await self._refuse_overlap(change.identifier, change.new_metadata.location)
        await check_policy_change(change)  # maintenance properties it can read

    async def _run(
        self, commits: list[TableCommit], attempt: Attempt | None
    ) -> list[CommitOutcome]:
        """The commits' outcomes: those of an earlier attempt with the request's
        Idempotency-Key when it committed before it stopped (see :func:`_noted_outcomes`),
        else of committing them now, noted for a later attempt before the swap."""
        for commit in commits:
            if not commit.creates:
                await self._namespace_or_404(commit.identifier.namespace, "NoSuchTableException")
        if attempt is not None and attempt.prior is not None:
            earlier = await _noted_outcomes(self.catalog, commits, attempt.prior)
            if earlier is not None:
                return earlier
        noted: dict[str, Any] = {}

        async def check(change: TableChange) -> None:
            await self._check_change(change)
            if attempt is None:
                return
            if str(change.identifier) in noted:  # checked again: a new swap after a lost one
                noted.clear()
            noted[str(change.identifier)] = {
                "base": change.base.metadata_location if change.base is not None else None,
                "digest": _digest(change.new_metadata),
            }
            await attempt.note({"commits": noted})

        stats = CommitStats()
        try:
            return await commit_table_changes(
                self.catalog, commits, self.policy, stats, check=check
            )
        except NotFoundError as e:  # the spec's one 404 of updateTable and commitTransaction
            raise ApiError(404, "NoSuchTableException", str(e)) from None
        finally:
            self._lost_swaps.inc(stats.conflicts)
            self.stats.attempts += stats.attempts
            self.stats.conflicts += stats.conflicts

    async def _index_commit(self, commit: TableCommit, outcome: CommitOutcome) -> None:
        """A created or relocated table's entry in the location index."""
        table = outcome.table
        if outcome.base_location is None:
            await self._claim_new(table)
        elif outcome.changed and any(u.action == "set-location" for u in commit.updates):
            base = await self.catalog.read_metadata(outcome.base_location)
            await self.tables_by_location.moved(
                (base.location, table.identifier), (table.location, table.identifier)
            )

    def _audit_commit(
        self, request: web.Request, operation: str, commit: TableCommit, outcome: CommitOutcome
    ) -> None:
        if outcome.changed:
            self._seen(outcome.table)
        audit(
            principal_of(request),
            operation,
            status=200 if operation == "updateTable" else 204,
            table=str(commit.identifier),
            updates=[u.action for u in commit.updates],
            created=outcome.base_location is None or None,
            changed=outcome.changed,
            **{
                "snapshot-id": _snapshot_id(outcome.table.metadata),
                "metadata-location": outcome.table.metadata_location,
                "previous-metadata-location": outcome.base_location,
            },
        )

    async def update_table(self, request: web.Request) -> web.StreamResponse:
        ident = _path_table(request)
        body = await _body(request, CommitTableRequest)
        if body.identifier is not None and _identifier(body.identifier) != ident:
            raise _bad_request(
                f"the body names table {_identifier(body.identifier)}, the path {ident}"
            )
        commit = self._commit(ident, body)
        (outcome,) = await self._run([commit], attempt_of(request))
        await self._index_commit(commit, outcome)
        self._audit_commit(request, "updateTable", commit, outcome)
        return web.json_response(
            {
                "metadata-location": outcome.table.metadata_location,
                "metadata": outcome.table.metadata.to_json(),
            },
            headers={"ETag": table_etag(outcome.table.metadata_location)},
        )

    async def commit_transaction(self, request: web.Request) -> web.StreamResponse:
        body = await _body(request, CommitTransactionRequest)
        commits = []
        for change in body.table_changes:
            if change.identifier is None:
                raise _bad_request("every table change of a transaction needs its 'identifier'")
            commits.append(self._commit(_identifier(change.identifier), change))
        outcomes = await self._run(commits, attempt_of(request))
        for commit, outcome in zip(commits, outcomes, strict=True):
            await self._index_commit(commit, outcome)
            self._audit_commit(request, "commitTransaction", commit, outcome)
        return web.Response(status=204)


def _digest(metadata: TableMetadata) -> str:
    return hashlib.sha256(metadata.to_json_bytes()).hexdigest()


async def _noted_outcomes(
    catalog: Catalog, commits: list[TableCommit], prior: dict[str, Any]
) -> list[CommitOutcome] | None:
    """What an earlier attempt of the same request did, from the note it left before its
    swap (each table's base metadata location and a digest of its new metadata): the
    outcomes, with the tables as they are now, if it committed; None if it did not (nothing
    noted, or the metadata after its base is another writer's, or there is none).

    Its swap moved every noted table or none (multi-table swaps are atomic), so a mix, or
    a base no longer in a table's metadata log, leaves the outcome unknown.
    """
    noted = prior.get("commits")
    if not isinstance(noted, dict) or not noted:
        return None
    outcomes: list[CommitOutcome] = []
    found: set[bool] = set()
    for commit in commits:
        try:
            table = await catalog.load_table(commit.identifier)
        except NotFoundError:
            if commit.creates:
                found.add(False)
                continue
            raise
        note = noted.get(str(commit.identifier))
        if not isinstance(note, dict):  # nothing to change in that table then
            outcomes.append(CommitOutcome(table, table.metadata_location, False))
            continue
        base = note.get("base")
        found.add(await _noted_successor(catalog, table, base, note.get("digest")))
        outcomes.append(CommitOutcome(table, base, True))
    if found == {True}:
        log.info("an earlier attempt committed %s; answering for it", sorted(noted))
        return outcomes
    if found <= {False}:
        return None
    raise CommitStateUnknownError(
        "an earlier attempt of this request left its tables partly committed, which an "
        "atomic commit cannot; reload them before retrying with a new Idempotency-Key"
    )


async def _noted_successor(catalog: Catalog, table: Table, base: str | None, digest: Any) -> bool:
    """Whether the metadata that followed ``base`` in ``table``'s history (its first, when
    ``base`` is None) has ``digest``: the noted commit (or create) is the one that happened."""
    chain = [e.metadata_file for e in table.metadata.metadata_log]
    chain.append(table.metadata_location)
    if base is not None and base not in chain:
        raise CommitStateUnknownError(
            f"an earlier attempt of this request may have committed {table.identifier}, and "
            "its metadata log no longer reaches back to tell; reload the table before "
            "retrying with a new Idempotency-Key"
        )
    after = chain.index(base) + 1 if base is not None else 0
    if after >= len(chain):
        return False
    successor = chain[after]
    metadata = (
        table.metadata
        if successor == table.metadata_location
        else await catalog.read_metadata(successor)
    )
    return _digest(metadata) == digest


async def _noted_create(
    catalog: Catalog, ident: TableIdentifier, attempt: Attempt | None
) -> Table | None:
    """The table an earlier attempt of this createTable made before it stopped, if it did
    (its first metadata is the one that attempt noted)."""
    prior = attempt.prior if attempt is not None else None
    if prior is None or prior.get("create") != str(ident):
        return None
    try:
        table = await catalog.load_table(ident)
    except NotFoundError:
        return None
    if not await _noted_successor(catalog, table, None, prior.get("digest")):
        return None
    log.info("an earlier attempt created %s; answering for it", ident)
    return table


def _overlap_error(location: str, other: TableIdentifier) -> ApiError:
    return ApiError(
        403,
        "ForbiddenException",
        f"table location {location[:200]!r} overlaps the location of table {other} (one "
        "contains the other); a table's location must be its own",
    )


def _not_found_type(message: str) -> str:
    if message.startswith("namespace"):
        return "NoSuchNamespaceException"
    if message.startswith("table"):
        return "NoSuchTableException"
    return "NotFoundException"


def register_write_routes(
    app: web.Application,
    service: PlannerService,
    settings: RestCatalogSettings,
    authority: TokenAuthority,
) -> list[tuple[str, str]]:
    """The planner's one hook: serve the write routes on ``app`` unless disabled.

    Returns the endpoints to advertise (none when ``ICEFLOE_REST_WRITES=false``).
    """
    if not settings.writes:
        return []
    if service.refresher.trust_events:
        # The results topic vouches only for the coordinator's commits. REST commits made by
        # this replica are served at once, but those made through another replica publish no
        # event: without polling, this replica would never see them.
        log.info(
            "REST writes are enabled: tables are re-read every refresh interval even when "
            "the results topic is caught up (ICEFLOE_PLANNER_TRUST_EVENTS is ignored)"
        )
        service.refresher.trust_events = False
    routes = WriteRoutes(service, settings, authority)
    return routes.register(app, service.config.prefix)


def main(argv: list[str] | None = None) -> int:
    """``python -m icefloe.planner.write_routes openapi SPEC.yaml``: the write routes' OpenAPI document
    (what ``write_openapi.json`` holds; schemathesis fuzzes the server with it)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] != "openapi":
        print(
            "usage: python -m icefloe.planner.write_routes openapi REST_SPEC.yaml", file=sys.stderr
        )
        return 2
    import yaml  # type: ignore[import-untyped]  # a development tool, not a dependency

    from icefloe.planner.openapi import trim_openapi

    with open(args[1], encoding="utf-8") as f:
        spec = yaml.safe_load(f)
    document = trim_openapi(spec, WRITE_ENDPOINTS)
    document["info"]["title"] = (
        "icefloe REST catalog writes (Apache Iceberg REST Catalog API subset)"
    )
    print(json.dumps(document, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
