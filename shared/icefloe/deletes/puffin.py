"""Puffin files: blobs of indexes, statistics and deletion vectors, with a JSON footer.

Layout (Puffin spec, version 1)::

    Magic Blob_1 ... Blob_n Footer
    Footer = Magic FooterPayload FooterPayloadSize Flags Magic

``Magic`` is ``PFA1`` (``50 46 41 31``). ``FooterPayload`` is UTF-8 JSON
``{"blobs": [BlobMetadata...], "properties": {...}}``; ``FooterPayloadSize`` is its length
as a 4-byte little-endian integer and ``Flags`` four bytes whose bit 0 of byte 0 says the
payload is compressed (LZ4). Each ``BlobMetadata`` gives the blob's ``type``, ``fields``,
``snapshot-id``, ``sequence-number``, ``offset`` and ``length`` in the file, an optional
``compression-codec`` and ``properties``.

Readers of deletion vectors need only one blob, whose offset and length the manifest entry
already holds (``content_offset``, ``content_size_in_bytes``), so :func:`read_footer` is for
checking files and for tools; the hot path reads the blob range directly.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from icefloe.errors import InvalidFileError

MAGIC = b"PFA1"
FOOTER_STRUCT = struct.Struct("<ii")  # FooterPayloadSize, Flags (little endian)
FLAG_COMPRESSED = 0x1
CREATED_BY = "icefloe"
# The smallest possible file: Magic, then a footer with an empty payload.
_MIN_SIZE = len(MAGIC) * 3 + FOOTER_STRUCT.size


@dataclass(frozen=True, slots=True)
class BlobMetadata:
    """One blob's entry in the footer (Puffin spec: "BlobMetadata")."""

    type: str
    fields: tuple[int, ...]
    snapshot_id: int
    sequence_number: int
    offset: int
    length: int
    compression_codec: str | None = None
    properties: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "type": self.type,
            "fields": list(self.fields),
            "snapshot-id": self.snapshot_id,
            "sequence-number": self.sequence_number,
            "offset": self.offset,
            "length": self.length,
        }
        if self.compression_codec is not None:
            out["compression-codec"] = self.compression_codec
        if self.properties:
            out["properties"] = dict(self.properties)
        return out

    @classmethod
    def from_json(cls, obj: Any, location: str) -> BlobMetadata:
        if not isinstance(obj, dict):
            raise InvalidFileError(location, f"Puffin blob metadata must be an object: {obj!r}")

        def required(key: str, kind: type) -> Any:
            value = obj.get(key)
            if value is None or not isinstance(value, kind) or isinstance(value, bool):
                raise InvalidFileError(
                    location, f"Puffin blob metadata needs {key!r} ({kind.__name__}): {obj!r}"
                )
            return value

        fields = required("fields", list)
        if not all(isinstance(f, int) and not isinstance(f, bool) for f in fields):
            raise InvalidFileError(location, f"Puffin blob 'fields' must be integers: {fields}")
        props = obj.get("properties") or {}
        if not isinstance(props, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in props.items()
        ):
            raise InvalidFileError(location, f"Puffin blob 'properties' must map strings: {props}")
        codec = obj.get("compression-codec")
        if codec is not None and not isinstance(codec, str):
            raise InvalidFileError(location, f"Puffin 'compression-codec' is not a string: {codec}")
        offset, length = required("offset", int), required("length", int)
        if offset < 0 or length < 0:
            raise InvalidFileError(location, f"Puffin blob offset/length is negative: {obj!r}")
        return cls(
            type=required("type", str),
            fields=tuple(fields),
            snapshot_id=required("snapshot-id", int),
            sequence_number=required("sequence-number", int),
            offset=offset,
            length=length,
            compression_codec=codec,
            properties=props,
        )


@dataclass(frozen=True, slots=True)
class PuffinFooter:
    """The footer of a Puffin file: its blobs and file properties."""

    blobs: tuple[BlobMetadata, ...]
    properties: Mapping[str, str]
    footer_size: int  # the whole footer, magic to magic (table statistics record it)


def read_footer(data: bytes, location: str) -> PuffinFooter:
    """Parse the footer of a whole Puffin file, checking magics and every blob's range."""
    if len(data) < _MIN_SIZE:
        raise InvalidFileError(location, f"not a Puffin file: only {len(data)} bytes")
    if data[:4] != MAGIC:
        raise InvalidFileError(location, f"not a Puffin file: starts with {data[:4]!r}")
    if data[-4:] != MAGIC:
        raise InvalidFileError(location, f"not a Puffin file: ends with {data[-4:]!r}")
    size, flags = FOOTER_STRUCT.unpack_from(data, len(data) - 4 - FOOTER_STRUCT.size)
    payload_end = len(data) - 4 - FOOTER_STRUCT.size
    payload_start = payload_end - size
    footer_start = payload_start - 4
    if size < 0 or footer_start < 4:
        raise InvalidFileError(location, f"Puffin footer payload size {size} exceeds the file")
    if data[footer_start:payload_start] != MAGIC:
        raise InvalidFileError(location, "Puffin footer does not start with the magic")
    if flags & FLAG_COMPRESSED:
        raise InvalidFileError(
            location, "Puffin footer payload is LZ4-compressed, which icefloe does not read"
        )
    try:
        payload = json.loads(data[payload_start:payload_end].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InvalidFileError(location, f"Puffin footer payload is not JSON: {e}") from None
    if not isinstance(payload, dict) or not isinstance(payload.get("blobs"), list):
        raise InvalidFileError(location, "Puffin footer payload has no 'blobs' list")
    blobs = tuple(BlobMetadata.from_json(b, location) for b in payload["blobs"])
    for b in blobs:
        if b.offset < 4 or b.offset + b.length > footer_start:
            raise InvalidFileError(
                location,
                f"Puffin blob {b.type} at {b.offset}+{b.length} lies outside the blob area",
            )
    props = payload.get("properties") or {}
    if not isinstance(props, dict):
        raise InvalidFileError(location, "Puffin footer 'properties' is not an object")
    return PuffinFooter(blobs, {str(k): str(v) for k, v in props.items()}, len(data) - footer_start)


@dataclass(frozen=True, slots=True)
class PendingBlob:
    """A blob to write: its bytes and its metadata less the offset and length."""

    type: str
    data: bytes
    fields: Sequence[int] = ()
    snapshot_id: int = -1
    sequence_number: int = -1
    properties: Mapping[str, str] = field(default_factory=dict)


def write_puffin(
    blobs: Sequence[PendingBlob], properties: Mapping[str, str] | None = None
) -> tuple[bytes, list[BlobMetadata]]:
    """A whole Puffin file (uncompressed footer) and the metadata of each blob in order."""
    out = bytearray(MAGIC)
    written: list[BlobMetadata] = []
    for b in blobs:
        written.append(
            BlobMetadata(
                type=b.type,
                fields=tuple(b.fields),
                snapshot_id=b.snapshot_id,
                sequence_number=b.sequence_number,
                offset=len(out),
                length=len(b.data),
                properties=dict(b.properties),
            )
        )
        out += b.data
    props = {"created-by": CREATED_BY, **(properties or {})}
    payload = json.dumps(
        {"blobs": [m.to_json() for m in written], "properties": props}, separators=(",", ":")
    ).encode("utf-8")
    out += MAGIC
    out += payload
    out += FOOTER_STRUCT.pack(len(payload), 0)
    out += MAGIC
    return bytes(out), written


__all__ = [
    "MAGIC",
    "BlobMetadata",
    "PendingBlob",
    "PuffinFooter",
    "read_footer",
    "write_puffin",
]
