"""Decode a manifest or a manifest list into JSON-able records for ``icefloe manifest show``.

The kind is told by the Avro key-value metadata the spec requires: a manifest carries its
``partition-spec`` and ``schema``, a manifest list does not. A manifest's files are shown
in the REST content-file form with bounds decoded through the manifest's own schema, which
is what a person debugging a table wants to read.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Any

from icefloe.avro.codec import read_header
from icefloe.errors import InvalidFileError, ValidationError
from icefloe.manifests.manifest import read_manifest
from icefloe.manifests.manifest_list import read_manifest_list
from icefloe.spec.content_file import content_file_to_json
from icefloe.spec.partition import PartitionSpec
from icefloe.spec.schema import Schema


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if hasattr(value, "value") and hasattr(value, "name"):  # enums
        return value.name.lower()
    return value


def describe_avro_file(data: bytes, *, location: str) -> Iterator[dict[str, Any]]:
    """One record per manifest-list row or manifest entry."""
    meta, _ = read_header(data, location)
    if "partition-spec" not in meta:
        for manifest in read_manifest_list(data, location=location):
            yield {"kind": "manifest-file", **_jsonable(manifest)}
        return
    try:
        schema = Schema.from_json(json.loads(meta["schema"]))
        spec = PartitionSpec.from_json(
            {
                "spec-id": int(meta.get("partition-spec-id", "0")),
                "fields": json.loads(meta["partition-spec"]),
            }
        )
    except (KeyError, ValueError, ValidationError) as e:
        raise InvalidFileError(location, f"manifest metadata is unreadable: {e}") from e
    for entry in read_manifest(data, location=location, spec_by_id={spec.spec_id: spec}):
        yield {
            "kind": "manifest-entry",
            "status": entry.status.name.lower(),
            "snapshot-id": entry.snapshot_id,
            "sequence-number": entry.sequence_number,
            "file-sequence-number": entry.file_sequence_number,
            "data-file": content_file_to_json(entry.data_file, spec, schema),
        }
