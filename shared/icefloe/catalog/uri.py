"""Open a catalog from one URI, so services, the CLI and tests configure it the same way.

=================================================  =========================================
``file:///var/lib/warehouse``                      file-system tables under that folder
``s3://bucket/warehouse?endpoint=http://…``        file-system tables on S3 (conditional puts)
``redis://host:6379/0?warehouse=s3://bucket/wh``   Redis pointers, metadata under ``warehouse``
``dynamodb://iceberg?endpoint=…&region=…&warehouse=…``  DynamoDB pointers in table ``iceberg``
=================================================  =========================================

Query parameters ``s3.*`` (``s3.endpoint``, ``s3.access-key-id``, ...) configure the FileIO
as PyIceberg's properties do; ``endpoint`` on an ``s3://`` URI is short for ``s3.endpoint``.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from icefloe.errors import ValidationError
from icefloe.io.fileio import load_file_io
from icefloe.table.catalog import Catalog


def load_catalog(
    uri: str, name: str = "icefloe", properties: Mapping[str, str] | None = None
) -> Catalog:
    """A catalog for ``uri``; ``properties`` add to (and override) the URI's query."""
    parts = urlsplit(uri)
    query = dict(parse_qsl(parts.query))
    query.update(properties or {})
    scheme = parts.scheme or "file"
    if scheme in ("file", "s3", "s3a", "s3n"):
        from icefloe.catalog.fs import FileSystemCatalog

        if scheme != "file" and "endpoint" in query:
            query.setdefault("s3.endpoint", query.pop("endpoint"))
        warehouse: str = (
            urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))
            if parts.scheme
            else parts.path
        )
        io = load_file_io(warehouse, query)
        return FileSystemCatalog(name, warehouse, io, query)
    warehouse = query.get("warehouse", "")
    if not warehouse:
        raise ValidationError(
            f"catalog URI {uri!r} needs a 'warehouse' parameter (where metadata files go)"
        )
    io = load_file_io(warehouse, query)
    if scheme in ("redis", "rediss"):
        from icefloe.catalog.redis import RedisCatalog

        redis_url = urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))
        return RedisCatalog(name, redis_url, io, query, prefix=query.get("prefix", "icefloe"))
    if scheme == "dynamodb":
        from icefloe.catalog.dynamodb import DynamoDbCatalog

        return DynamoDbCatalog(
            name,
            io,
            query,
            table_name=parts.netloc or query.get("table-name", "iceberg"),
            endpoint_url=query.get("endpoint") or query.get("dynamodb.endpoint"),
            region=query.get("region") or query.get("dynamodb.region"),
            access_key_id=query.get("dynamodb.access-key-id"),
            secret_access_key=query.get("dynamodb.secret-access-key"),
            session_token=query.get("dynamodb.session-token"),
        )
    raise ValidationError(
        f"unsupported catalog URI scheme {scheme!r} in {uri!r}: "
        "use file://, s3://, redis:// or dynamodb://"
    )
