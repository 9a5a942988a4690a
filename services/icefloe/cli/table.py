"""The ``icefloe table ...`` subcommands, kept apart from argument parsing in ``cli.py``."""

from __future__ import annotations

import argparse
import json
from typing import Any

from icefloe.catalog import Catalog, Table
from icefloe.errors import ValidationError
from icefloe.keyed_table import set_identifier_fields, with_identifier_fields
from icefloe.maintenance import expire_snapshots
from icefloe.partition import parse_partition_spec
from icefloe.schema import Schema


def _load_schema(text: str) -> Schema:
    if text.startswith("@"):
        with open(text[1:], encoding="utf-8") as f:
            text = f.read()
    try:
        return Schema.from_json(json.loads(text))
    except json.JSONDecodeError as e:
        raise ValidationError(f"--schema is not valid JSON: {e}") from None


async def create_table(catalog: Catalog, args: argparse.Namespace) -> Table:
    schema = _load_schema(args.schema)
    if args.identifier_field:
        schema = with_identifier_fields(schema, args.identifier_field, args.format_version)
    props: dict[str, str] = {}
    for pair in args.property or ():
        key, _, value = pair.partition("=")
        props[key] = value
    return await catalog.create_table(
        args.table,
        schema,
        spec=parse_partition_spec(args.partition_by, schema),
        location=args.location,
        properties=props,
        format_version=args.format_version,
    )


async def set_table_identifier_fields(catalog: Catalog, args: argparse.Namespace) -> Table:
    return await set_identifier_fields(catalog, args.table, args.columns)


async def describe_table(catalog: Catalog, identifier: str) -> dict[str, Any]:
    table = await catalog.load_table(identifier)
    m = table.metadata
    current = m.current_snapshot()
    return {
        "identifier": str(table.identifier),
        "metadata-location": table.metadata_location,
        "format-version": m.format_version,
        "location": m.location,
        "table-uuid": str(m.table_uuid),
        "schema": m.schema().to_json(),
        "partition-spec": m.spec().to_json(),
        "sort-order": m.sort_order().to_json(),
        "properties": dict(m.properties),
        "current-snapshot": current.to_json() if current else None,
        "snapshots": len(m.snapshots),
        "refs": {name: ref.to_json() for name, ref in m.refs.items()},
    }


async def list_snapshots(catalog: Catalog, identifier: str) -> list[dict[str, Any]]:
    table = await catalog.load_table(identifier)
    return [s.to_json() for s in table.metadata.snapshots]


async def expire_table(catalog: Catalog, args: argparse.Namespace) -> dict[str, Any]:
    table = await catalog.load_table(args.table)
    result = await expire_snapshots(
        table, older_than_ms=args.older_than_ms, retain_last=args.retain_last
    )
    return {
        "expired-snapshot-ids": result.expired_snapshot_ids,
        "removed-refs": result.removed_refs,
        "deleted-data-files": result.deleted_data_files,
        "deleted-manifests": result.deleted_manifests,
        "deleted-manifest-lists": result.deleted_manifest_lists,
    }
