"""The signer's decisions, without a server: which bucket and keys a request URI touches, and
whether a token may have it signed. The law: a request is signed only if every key it
touches, read the way any store or engine might read it (percent-decoded up to three times),
has no ``.``/``..`` step and no empty step and lies strictly under a table directory."""

from __future__ import annotations

import urllib.parse

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples
from icefloe.io.locations import normal_location
from icefloe.planner.errors import ApiError
from icefloe.planner.signer import check_request, parse_target, sign

ENDPOINT = "http://127.0.0.1:9000"
ROOT = normal_location("s3://bucket/wh/db/t")
KEYS = ("AKIDEXAMPLE", "secret-example", None)


def decision(method: str, uri: str, *, can_write: bool = True, body: str | None = None) -> int:
    try:
        target = parse_target(method, uri, ENDPOINT, body)
        check_request(method, target, [ROOT], can_write=can_write)
    except ApiError as e:
        return e.code
    return 200


def acceptable(key: str) -> bool:
    """The oracle: what a key means to the most permissive reader of it."""
    if not key.startswith("wh/db/t/"):
        return False
    for text in _readings(key):
        steps = text.split("/")
        if any(s in (".", "..") for s in steps) or "" in steps[:-1]:
            return False
    return True


def _readings(key: str) -> list[str]:
    out = [key]
    for _ in range(3):
        out.append(urllib.parse.unquote(out[-1]))
    return out


segment = st.one_of(
    st.sampled_from([".", "..", "%2e", "%2E%2e", "%252e%252e", "", "data", "t", "u", "x%2Fy"]),
    st.text(alphabet="abc.%/2eE", min_size=1, max_size=6),
)


@settings(max_examples=examples(300))
@given(st.lists(segment, min_size=1, max_size=5), st.sampled_from(["wh/db/t", "wh/db", "wh/db/t2"]))
def test_signed_only_under_the_table(steps: list[str], base: str) -> None:
    key = base + "/" + "/".join(steps)
    uri = f"{ENDPOINT}/bucket/{urllib.parse.quote(key, safe='/%')}"
    status = decision("PUT", uri)
    # What the signer reads: the key percent-decoded once, as S3 does.
    if status == 200:
        assert acceptable(urllib.parse.unquote(key)), key


@pytest.mark.parametrize(
    ("method", "uri", "expected"),
    [
        ("GET", f"{ENDPOINT}/bucket/wh/db/t/data/a.parquet", 200),
        ("GET", "http://bucket.127.0.0.1:9000/wh/db/t/data/a.parquet", 200),
        ("GET", "https://bucket.s3.eu-west-1.amazonaws.com/wh/db/t/x", 403),  # not our store
        ("GET", "http://127.0.0.1:9001/bucket/wh/db/t/x", 403),  # another port
        ("GET", "ftp://127.0.0.1:9000/bucket/wh/db/t/x", 400),
        ("GET", f"{ENDPOINT}/bucket/wh/db/t", 403),  # beside the table, not in it
        ("PUT", f"{ENDPOINT}/bucket/wh/db/t/", 200),  # the table's directory marker
        ("GET", f"{ENDPOINT}/bucket/wh/db/t2/x", 403),
        ("GET", f"{ENDPOINT}/bucket?prefix=wh/db/t/", 200),
        ("GET", f"{ENDPOINT}/bucket?prefix=wh/db/t", 403),
        ("GET", f"{ENDPOINT}/bucket?prefix=wh/db/t/&acl", 403),
        ("PUT", f"{ENDPOINT}/bucket/wh/db/t/x?uploadId=1&partNumber=2", 200),
        ("PUT", f"{ENDPOINT}/bucket/wh/db/t/x?tagging", 403),
        ("OPTIONS", f"{ENDPOINT}/bucket/wh/db/t/x", 403),
    ],
)
def test_uris(method: str, uri: str, expected: int) -> None:
    assert decision(method, uri) == expected


def test_aws_hosts_without_an_endpoint() -> None:
    for uri in (
        "https://bucket.s3.eu-west-1.amazonaws.com/wh/db/t/x",
        "https://bucket.s3.amazonaws.com/wh/db/t/x",
        "https://s3.eu-west-1.amazonaws.com/bucket/wh/db/t/x",
    ):
        target = parse_target("GET", uri, None, None)
        assert (target.bucket, target.keys) == ("bucket", ("wh/db/t/x",)), uri
    with pytest.raises(ApiError):
        parse_target("GET", "https://bucket.evil.example/wh/db/t/x", None, None)


def test_read_tokens_get_only_reads_signed() -> None:
    uri = f"{ENDPOINT}/bucket/wh/db/t/data/a"
    assert decision("GET", uri, can_write=False) == 200
    assert decision("HEAD", uri, can_write=False) == 200
    for method in ("PUT", "POST", "DELETE"):
        assert decision(method, uri, can_write=False) == 403


def test_signature_covers_the_checked_bulk_delete_body() -> None:
    body = "<Delete><Object><Key>wh/db/t/a</Key></Object></Delete>"
    headers = {"Host": ["127.0.0.1:9000"], "Content-MD5": ["forged"]}
    signed = sign("POST", f"{ENDPOINT}/bucket?delete", headers, "us-east-1", KEYS, body)
    assert signed["Content-MD5"] != ["forged"]
    assert signed["X-Amz-Content-SHA256"][0] not in ("UNSIGNED-PAYLOAD", "")
    plain = sign(
        "PUT", f"{ENDPOINT}/bucket/wh/db/t/a", {"Host": ["127.0.0.1:9000"]}, "us-east-1", KEYS
    )
    assert plain["X-Amz-Content-SHA256"] == ["UNSIGNED-PAYLOAD"]
    assert plain["Authorization"][0].startswith("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/")
