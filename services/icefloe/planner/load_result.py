"""What a LoadTableResult carries beside the metadata: its ``ETag`` and the table's ``config``.

* ``ETag`` (REST spec, LoadTableResponse, CreateTableResponse and CommitTableResponse): the
  metadata location names one version of a table (every commit writes a new file), so the
  tag is a hash of it and of the ``snapshots`` representation asked for (``all`` and
  ``refs`` are different bodies of one version and get different tags, as the spec asks).
  loadTable answers ``304 Not Modified`` when ``If-None-Match`` names the current tag; a
  tag from a create or commit answer (always the ``all`` representation) is one a later
  loadTable recognises.
* ``config``'s ``scan-planning-mode``: the table property of that name when it is
  ``server`` or ``client``, else the planner's configured mode (none when ``none``), so
  Iceberg 1.11 clients plan on the server where the table says so.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

SCAN_PLANNING_MODE = "scan-planning-mode"
PLANNING_MODES = ("server", "client")


def table_etag(metadata_location: str, snapshots: str = "all") -> str:
    """A strong entity tag (quoted) for one version and representation of a table."""
    digest = hashlib.sha256(f"{metadata_location}|{snapshots}".encode()).hexdigest()[:32]
    return f'"{digest}"'


def matches(if_none_match: str | None, etag: str) -> bool:
    """Whether an ``If-None-Match`` header names ``etag`` (RFC 9110: a list of tags, weak
    comparison, or ``*``)."""
    if not if_none_match:
        return False
    for candidate in if_none_match.split(","):
        tag = candidate.strip()
        if tag == "*" or tag.removeprefix("W/") == etag:
            return True
    return False


def table_config(properties: Mapping[str, str], configured_mode: str) -> dict[str, str]:
    """The ``config`` of a table's LoadTableResult (see the module docstring)."""
    mode = properties.get(SCAN_PLANNING_MODE)
    if mode in PLANNING_MODES:
        return {SCAN_PLANNING_MODE: mode}
    return {} if configured_mode == "none" else {SCAN_PLANNING_MODE: configured_mode}
