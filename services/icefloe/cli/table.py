"""The ``icefloe table ...`` subcommands, kept apart from argument parsing in ``main.py``.

``icefloe table properties`` changes an existing table's properties the way a REST client
does: one ``set-properties`` / ``remove-properties`` commit through
:func:`icefloe.table.changes.commit_table_changes`, so the catalog's conditional swap (a
concurrent coordinator commit is re-read, not overwritten) and the rules icefloe's REST
catalog applies (the dedup ledger ``icefloe.dedup.ledger`` cannot be set or removed by
hand) hold here too, from the same code.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from icefloe.errors import ValidationError
from icefloe.spec.partition import parse_partition_spec
from icefloe.spec.schema import Schema
from icefloe.table.catalog import Catalog, Table, TableIdentifier
from icefloe.table.changes import TableCommit, commit_table_changes
from icefloe.table.keyed import set_identifier_fields, with_identifier_fields
from icefloe.table.maintenance import expire_snapshots
from icefloe.table.maintenance_policy import check_policy_change
from icefloe.table.updates import RemovePropertiesUpdate, SetPropertiesUpdate, TableUpdate


def _load_schema(text: str) -> Schema:
    if text.startswith("@"):
        with open(text[1:], encoding="utf-8") as f:
            text = f.read()
    try:
        return Schema.from_json(json.loads(text))
    except json.JSONDecodeError as e:
        raise ValidationError(f"--schema is not valid JSON: {e}") from None


def parse_properties(pairs: Sequence[str] | None) -> dict[str, str]:
    """``key=value`` arguments as a map; ValidationError naming one that is not."""
    out: dict[str, str] = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValidationError(f"property {pair!r} must look like key=value")
        out[key.strip()] = value
    return out


async def create_table(catalog: Catalog, args: argparse.Namespace) -> Table:
    schema = _load_schema(args.schema)
    if args.identifier_field:
        schema = with_identifier_fields(schema, args.identifier_field, args.format_version)
    props = parse_properties(args.property)
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


async def table_properties(
    catalog: Catalog,
    identifier: str,
    set_pairs: Sequence[str] | None = None,
    unset: Sequence[str] | None = None,
) -> dict[str, str]:
    """Set and remove properties of ``identifier`` in one commit; its properties after.

    With nothing to set or remove it only reads them. A key both set and removed is
    refused (as the REST catalog refuses it for namespaces): say what you mean once.
    """
    updates = parse_properties(set_pairs)
    removals = tuple(dict.fromkeys(k.strip() for k in unset or ()))
    if any(not k for k in removals):
        raise ValidationError("--unset needs a property name")
    both = sorted(set(updates) & set(removals))
    if both:
        raise ValidationError(f"properties {both} are both set and unset; name each key once")
    if not updates and not removals:
        table = await catalog.load_table(identifier)
        return dict(table.metadata.properties)
    changes: list[TableUpdate] = []
    if updates:
        changes.append(SetPropertiesUpdate(updates=updates))
    if removals:
        changes.append(RemovePropertiesUpdate(removals=removals))
    commit = TableCommit(TableIdentifier.parse(identifier), (), tuple(changes))
    [outcome] = await commit_table_changes(catalog, [commit], check=check_policy_change)
    return dict(outcome.table.metadata.properties)
