"""The ``icefloe`` console command: thin wrappers over the core library.

Every subcommand exits 0 on success and 1 with a one-line ``icefloe: error: ...`` naming
the problem on bad input, so scripts can rely on the exit status and people on the text.
Catalogs are chosen by URI (``--catalog`` or ``ICEFLOE_CATALOG``); see
:mod:`icefloe.catalog.uri`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

from icefloe.errors import IcefloeError
from icefloe.runtime.command import ArgumentParser, run_command
from icefloe.runtime.logs import configure_logging

Handler = Callable[[argparse.Namespace], Coroutine[Any, Any, int]]


def _print_json(obj: Any, *, compact: bool = False) -> None:
    if compact:
        print(json.dumps(obj, separators=(",", ":"), default=str))
    else:
        print(json.dumps(obj, indent=2, default=str))


# -- metadata / manifest ----------------------------------------------------------------------


async def _read_location(path: str) -> bytes:
    from icefloe.io.fileio import load_file_io

    io = load_file_io(path)
    try:
        return await io.read(path)
    finally:
        await io.close()


async def cmd_metadata_check(args: argparse.Namespace) -> int:
    from icefloe.spec.metadata import parse_table_metadata

    metadata = parse_table_metadata(await _read_location(args.file), location=args.file)
    _print_json(metadata.to_json())
    return 0


async def cmd_manifest_show(args: argparse.Namespace) -> int:
    from icefloe.cli.manifest import describe_avro_file

    for record in describe_avro_file(await _read_location(args.file), location=args.file):
        _print_json(record, compact=True)
    return 0


# -- namespaces and tables --------------------------------------------------------------------


def _catalog_uri(args: argparse.Namespace) -> str:
    uri: str | None = args.catalog or os.environ.get("ICEFLOE_CATALOG")
    if not uri:
        raise IcefloeError("no catalog: pass --catalog URI or set ICEFLOE_CATALOG")
    return uri


async def _with_catalog(args: argparse.Namespace, fn: Callable[[Any], Awaitable[int]]) -> int:
    from icefloe.catalog.uri import load_catalog

    catalog = load_catalog(_catalog_uri(args))
    try:
        return await fn(catalog)
    finally:
        await catalog.close()


async def cmd_namespace(args: argparse.Namespace) -> int:
    async def run(catalog: Any) -> int:
        if args.ns_command == "create":
            from icefloe.cli.table import parse_properties

            await catalog.create_namespace(args.namespace, parse_properties(args.property))
        elif args.ns_command == "list":
            for ns in await catalog.list_namespaces(args.parent or ()):
                print(".".join(ns))
        elif args.ns_command == "show":
            _print_json(await catalog.load_namespace_properties(args.namespace))
        elif args.ns_command == "drop":
            await catalog.drop_namespace(args.namespace)
        return 0

    return await _with_catalog(args, run)


async def cmd_table(args: argparse.Namespace) -> int:
    if args.table_command in ("maintain", "compact"):  # the long-running ones log as they go
        configure_logging(args.log_level, args.log_format)

    async def run(catalog: Any) -> int:
        from icefloe.cli.table import (
            create_table,
            describe_table,
            expire_table,
            list_snapshots,
            set_table_identifier_fields,
            table_properties,
        )

        if args.table_command == "create":
            table = await create_table(catalog, args)
            print(table.metadata_location)
        elif args.table_command == "set-identifier-fields":
            table = await set_table_identifier_fields(catalog, args)
            print(table.metadata_location)
        elif args.table_command == "properties":
            _print_json(await table_properties(catalog, args.table, args.set, args.unset))
        elif args.table_command == "describe":
            _print_json(await describe_table(catalog, args.table))
        elif args.table_command == "snapshots":
            for row in await list_snapshots(catalog, args.table):
                _print_json(row, compact=True)
        elif args.table_command == "expire":
            _print_json(await expire_table(catalog, args))
        elif args.table_command == "drop":
            await catalog.drop_table(args.table, purge=args.purge)
        elif args.table_command == "list":
            for ident in await catalog.list_tables(args.namespace):
                print(ident)
        elif args.table_command in ("health", "maintain"):
            from icefloe.cli import maintenance as maintenance_cli

            action = (
                maintenance_cli.health
                if args.table_command == "health"
                else (maintenance_cli.maintain)
            )
            _print_json(await action(catalog, args.table, args.min_retain_ms))
        return 0

    if args.table_command == "compact":
        from icefloe.cli import maintenance as maintenance_cli

        # Spark drives its own event loop use (icefloe.spark's background loop): run it off
        # this one.
        result = await asyncio.to_thread(maintenance_cli.compact, _catalog_uri(args), args)
        _print_json(result)
        return 0
    return await _with_catalog(args, run)


async def cmd_coordinator(args: argparse.Namespace) -> int:
    from icefloe.coordinator import service

    return await service.run_from_args(args)


async def cmd_planner(args: argparse.Namespace) -> int:
    from icefloe.planner.serving import run_from_args

    return await run_from_args(args)


async def cmd_scan(args: argparse.Namespace) -> int:
    from icefloe.cli.scan import run

    return await run(args)


# -- parser -----------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="icefloe", description="Iceberg commit coordinator, scan planner and tools"
    )
    from icefloe.version import __version__

    parser.add_argument("--version", action="version", version=f"icefloe {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    metadata = sub.add_parser("metadata", help="table-metadata files")
    msub = metadata.add_subparsers(dest="metadata_command", required=True)
    check = msub.add_parser("check", help="validate a metadata JSON file and print it normalized")
    check.add_argument("file", help="local path, file:// or s3:// URI")
    check.set_defaults(handler=cmd_metadata_check)

    manifest = sub.add_parser("manifest", help="manifest and manifest-list Avro files")
    mfsub = manifest.add_subparsers(dest="manifest_command", required=True)
    show = mfsub.add_parser("show", help="decode a manifest or manifest list to JSON lines")
    show.add_argument("file", help="local path, file:// or s3:// URI")
    show.set_defaults(handler=cmd_manifest_show)

    def with_catalog(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--catalog", help="catalog URI (default: $ICEFLOE_CATALOG)")
        return p

    ns = sub.add_parser("namespace", help="create, list, show and drop namespaces")
    nsub = ns.add_subparsers(dest="ns_command", required=True)
    p = with_catalog(nsub.add_parser("create", help="create a namespace"))
    p.add_argument("namespace", help="the namespace, levels separated by dots")
    p.add_argument("--property", "-p", action="append", help="key=value (repeatable)")
    p = with_catalog(nsub.add_parser("list", help="list namespaces (under PARENT)"))
    p.add_argument("parent", nargs="?", help="list only below this namespace")
    p = with_catalog(nsub.add_parser("show", help="print a namespace's properties"))
    p.add_argument("namespace", help="the namespace, levels separated by dots")
    p = with_catalog(nsub.add_parser("drop", help="drop an empty namespace"))
    p.add_argument("namespace", help="the namespace, levels separated by dots")
    ns.set_defaults(handler=cmd_namespace)

    table = sub.add_parser(
        "table",
        help="create, set properties or identifier fields, describe, list snapshots, expire, "
        "drop, health, maintain, compact",
    )
    tsub = table.add_subparsers(dest="table_command", required=True)
    p = with_catalog(tsub.add_parser("create", help="create a table"))
    p.add_argument("table", help="namespace.table")
    p.add_argument("--schema", required=True, help="schema JSON (Appendix C) or @file")
    p.add_argument(
        "--partition-by",
        action="append",
        default=[],
        help="a partition field, e.g. day(ts), bucket(16, id), id (repeatable)",
    )
    p.add_argument("--location", help="the table's location (default: under the warehouse)")
    p.add_argument(
        "--format-version", type=int, default=2, choices=(1, 2, 3), help="Iceberg format version"
    )
    p.add_argument("--property", "-p", action="append", help="key=value (repeatable)")
    p.add_argument(
        "--identifier-field",
        action="append",
        default=[],
        metavar="COLUMN",
        help="an identifier (key) column, required and primitive; dotted when nested "
        "(repeatable): makes the table keyed, for upserts and deletes by key",
    )
    p = with_catalog(
        tsub.add_parser(
            "set-identifier-fields",
            help="make these columns a table's identifier (key) fields; none makes it unkeyed",
        )
    )
    p.add_argument("table", help="namespace.table")
    p.add_argument("columns", nargs="*", metavar="COLUMN", help="identifier columns, in order")
    p = with_catalog(
        tsub.add_parser(
            "properties",
            help="print a table's properties; with --set/--unset change them in one commit",
        )
    )
    p.add_argument("table", help="namespace.table")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set this property (repeatable)",
    )
    p.add_argument(
        "--unset",
        action="append",
        default=[],
        metavar="KEY",
        help="remove this property (repeatable)",
    )
    p = with_catalog(tsub.add_parser("describe", help="print a table's metadata summary"))
    p.add_argument("table", help="namespace.table")
    p = with_catalog(tsub.add_parser("snapshots", help="list a table's snapshots, a line each"))
    p.add_argument("table", help="namespace.table")
    p = with_catalog(tsub.add_parser("expire", help="expire old snapshots"))
    p.add_argument("table", help="namespace.table")
    p.add_argument("--older-than-ms", type=int, help="expire snapshots older than this epoch ms")
    p.add_argument(
        "--retain-last", type=int, default=1, help="always keep this many most recent snapshots"
    )
    p = with_catalog(tsub.add_parser("drop", help="drop a table"))
    p.add_argument("table", help="namespace.table")
    p.add_argument("--purge", action="store_true", help="also delete data and metadata files")
    p = with_catalog(tsub.add_parser("list", help="list the tables of a namespace"))
    p.add_argument("namespace", help="the namespace, levels separated by dots")
    from icefloe.cli.maintenance import add_arguments as add_maintenance_arguments

    add_maintenance_arguments(tsub, with_catalog)
    table.set_defaults(handler=cmd_table)

    from icefloe.coordinator.config import add_arguments as add_coordinator_arguments

    coordinator = sub.add_parser(
        "coordinator", help="run the commit coordinator service (flags override ICEFLOE_*)"
    )
    add_coordinator_arguments(coordinator)
    coordinator.set_defaults(handler=cmd_coordinator)

    from icefloe.planner.config import add_arguments as add_planner_arguments

    planner = sub.add_parser(
        "planner", help="run the scan planner service (flags override ICEFLOE_PLANNER_*)"
    )
    add_planner_arguments(planner)
    planner.set_defaults(handler=cmd_planner)

    from icefloe.cli.scan import add_arguments as add_scan_arguments

    scan = sub.add_parser("scan", help="plan a scan of a table and print its tasks or rows")
    add_scan_arguments(scan)
    scan.set_defaults(handler=cmd_scan)

    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler = args.handler
    return run_command(handler(args))


if __name__ == "__main__":
    sys.exit(main())
