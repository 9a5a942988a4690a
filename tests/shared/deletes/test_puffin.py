"""Puffin files: footer layout, magics, and refusal of malformed files."""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples
from icefloe.deletes.puffin import PendingBlob, read_footer, write_puffin
from icefloe.errors import InvalidFileError


@settings(max_examples=examples(50), deadline=None)
@given(st.lists(st.binary(max_size=64), max_size=5))
def test_written_blobs_are_found_by_the_footer(payloads: list[bytes]) -> None:
    blobs = [
        PendingBlob("t", p, fields=(1,), properties={"i": str(i)}) for i, p in enumerate(payloads)
    ]
    data, metas = write_puffin(blobs)
    footer = read_footer(data, "f.puffin")
    assert footer.blobs == tuple(metas)
    assert [data[m.offset : m.offset + m.length] for m in footer.blobs] == payloads
    assert footer.properties["created-by"] == "icefloe"
    # Footer: magic, payload, 4-byte LE payload size, 4 flag bytes (0), magic.
    size = struct.unpack_from("<i", data, len(data) - 12)[0]
    assert data[-8:] == b"\x00\x00\x00\x00PFA1"
    assert data[len(data) - 12 - size - 4 : len(data) - 12 - size] == b"PFA1"
    assert footer.footer_size == size + 16


def _with_payload(payload: bytes, flags: int = 0) -> bytes:
    return b"PFA1" + b"PFA1" + payload + struct.pack("<ii", len(payload), flags) + b"PFA1"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"PFA1", "only 4 bytes"),
        (b"XXXX" + _with_payload(b"{}")[4:], "starts with"),
        (_with_payload(b"{}")[:-1] + b"2", "ends with"),
        (_with_payload(b'{"blobs": []}', flags=1), "compressed"),
        (_with_payload(b"not json"), "not JSON"),
        (_with_payload(b'{"nope": 1}'), "'blobs'"),
        (_with_payload(json.dumps({"blobs": [{"type": "t"}]}).encode()), "'fields'"),
        (
            _with_payload(
                json.dumps(
                    {
                        "blobs": [
                            {
                                "type": "t",
                                "fields": [],
                                "snapshot-id": 1,
                                "sequence-number": 1,
                                "offset": 4,
                                "length": 100,
                            }
                        ]
                    }
                ).encode()
            ),
            "outside",
        ),
        (b"PFA1" + b"PFA1{}" + struct.pack("<ii", 999, 0) + b"PFA1", "exceeds"),
    ],
)
def test_malformed_files_are_refused(data: bytes, message: str) -> None:
    with pytest.raises(InvalidFileError, match=message):
        read_footer(data, "f.puffin")
