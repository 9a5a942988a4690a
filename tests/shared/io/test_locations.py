"""The location normal form and containment (icefloe.io.locations) against hostile paths.

The property: a location built from a root and generated segments is within the root exactly
when every segment is a plain name (or, on a local disk, empty), and whenever it is within,
what the operating system would resolve it to lies under the root too. Dot steps, also
percent-encoded once or twice, other schemes and buckets, and symbolic links leading out are
never within.
"""

from __future__ import annotations

import os
import posixpath
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hypothesis_budget import examples
from icefloe.errors import ValidationError
from icefloe.io.locations import (
    LocationError,
    first_outside,
    normal_location,
    resolve_table_path,
    table_locations,
    within,
    within_any,
)

PLAIN = st.text(
    alphabet=st.characters(
        categories=("Ll", "Lu", "Nd"), include_characters="_-=é%", exclude_characters="/"
    ),
    min_size=1,
    max_size=8,
).filter(lambda s: s not in (".", "..") and "%2" not in s.lower() and "%" not in s)
HOSTILE = st.sampled_from(
    [
        "..",
        ".",
        "%2e%2e",
        "%2E%2e",
        "%2e",
        "%252e%252e",
        "a%2f..%2fb",
        "..%2f",
        "%2e%2e%5c",
    ]
)


def _is_plain(segment: str) -> bool:
    return segment not in (".", "..") and "%" not in segment


@settings(max_examples=examples(300))
@given(
    st.lists(st.one_of(PLAIN, HOSTILE, st.just("")), min_size=1, max_size=8),
    st.sampled_from(["/wh", "file:///wh", "file:/wh", "/wh/"]),
    st.sampled_from(["/wh", "file:///wh/", "file:/wh"]),
)
def test_local_locations_are_within_only_when_every_step_is_a_name(
    segments: list[str], root: str, spelled: str
) -> None:
    location = spelled.rstrip("/") + "/" + "/".join(segments)
    inside = within(location, root)
    assert inside == all(s == "" or _is_plain(s) for s in segments)
    if inside:
        local = normal_location(location).path
        assert posixpath.normpath(local).startswith("/wh")


@settings(max_examples=examples(200))
@given(st.lists(st.one_of(PLAIN, HOSTILE, st.just("")), min_size=1, max_size=6))
def test_object_store_keys_refuse_dot_steps_and_empty_steps(segments: list[str]) -> None:
    location = "s3a://bucket/wh/" + "/".join(segments)
    inner_empty = any(s == "" for s in segments[:-1])
    inside = within(location, "s3://bucket/wh")
    assert inside == (all(s == "" or _is_plain(s) for s in segments) and not inner_empty)


@pytest.mark.parametrize(
    "location",
    [
        "s3://other/wh/t",  # another bucket
        "s3://bucket/wh2/t",  # a sibling prefix
        "gs://bucket/wh/t",  # another scheme
        "hdfs://bucket/wh/t",
        "file://host/wh/t",  # a file URI with a host
        "wh/t",  # relative
        "/wh/t\x00",
        "/wh/\nt",
        "",
    ],
)
def test_other_schemes_buckets_and_malformed_locations_are_outside(location: str) -> None:
    assert not within(location, "s3://bucket/wh")
    assert not within(location, "/wh") or location.startswith("/wh/")


def test_normal_form_and_table_directories() -> None:
    assert str(normal_location("file:/wh//db/t/")) == "file:///wh/db/t"
    assert normal_location("s3n://b/wh/t") == normal_location("s3://b/wh/t")
    for bad in ("/wh/../etc", "s3://b/wh//t", "/wh/%2e%2e/etc", "relative/path"):
        with pytest.raises(LocationError):
            normal_location(bad)
    assert issubclass(LocationError, ValidationError)
    assert resolve_table_path("s3://b/wh/t", "custom/meta/") == "s3://b/wh/t/custom/meta"
    assert resolve_table_path("s3://b/wh/t", "s3://b/elsewhere/") == "s3://b/elsewhere"
    assert resolve_table_path("/wh/t", "file:/x") == "file:/x"
    roots = table_locations("/wh/t", {"write.data.path": "/wh/d", "write.object-storage.path": "o"})
    assert roots == ["/wh/t", "/wh/d", "/wh/t/metadata", "/wh/t/o"]
    assert within("/wh", "/") and within("s3://b/k", "s3://b")


def test_symbolic_links_leading_out_are_not_within(tmp_path: Path) -> None:
    warehouse, outside = tmp_path / "wh", tmp_path / "outside"
    warehouse.mkdir()
    outside.mkdir()
    (warehouse / "link").symlink_to(outside, target_is_directory=True)
    (warehouse / "inner").mkdir()
    (warehouse / "inner-link").symlink_to(warehouse / "inner", target_is_directory=True)
    escaping = str(warehouse / "link" / "t" / "data.parquet")
    assert within(escaping, str(warehouse))  # by name only
    assert not within(escaping, str(warehouse), resolve_links=True)
    assert within(str(warehouse / "inner-link" / "f"), str(warehouse), resolve_links=True)
    # A warehouse configured through a link holds what is named through the same link;
    # both the names and the resolved paths must be within.
    link = tmp_path / "wh-link"
    link.symlink_to(warehouse, target_is_directory=True)
    assert within(str(link / "t"), str(link), resolve_links=True)
    assert not within(str(link / "link" / "t"), str(link), resolve_links=True)
    assert not within(str(warehouse / "t"), str(link), resolve_links=True)
    assert os.path.realpath(escaping).startswith(str(outside))


SPELLED = st.sampled_from(
    ["/wh", "file:/wh", "file:///wh", "file://localhost/wh", "s3://b/wh", "s3a://b/wh", "s3://c/wh"]
)


@settings(max_examples=examples(300))
@given(
    st.lists(
        st.tuples(SPELLED, st.lists(st.one_of(PLAIN, HOSTILE, st.just("")), max_size=5)),
        max_size=6,
    ),
    st.lists(st.sampled_from(["/wh", "file:///wh/", "s3n://b/wh", "s3://b", "/"]), max_size=3),
)
def test_first_outside_decides_as_within_does(
    spelled: list[tuple[str, list[str]]], roots: list[str]
) -> None:
    """The batch check (text first, the exact rule where text cannot decide) finds exactly
    the first path the exact rule refuses."""
    paths = [base + "/" + "/".join(steps) for base, steps in spelled]
    expected = next((p for p in paths if not within_any(p, roots)), None)
    assert first_outside(paths, roots) == expected


def test_first_outside_resolves_links_once_per_folder(tmp_path: Path) -> None:
    warehouse, outside = tmp_path / "wh", tmp_path / "outside"
    (warehouse / "t" / "data").mkdir(parents=True)
    outside.mkdir()
    (warehouse / "t" / "linked").symlink_to(outside, target_is_directory=True)
    good = [f"file://{warehouse}/t/data/f{i}.parquet" for i in range(1000)]
    bad = f"{warehouse}/t/linked/f.parquet"
    assert first_outside(good, [str(warehouse)], resolve_links=True) is None
    assert first_outside([*good, bad], [str(warehouse)], resolve_links=True) == bad
    assert first_outside([*good, bad], [str(warehouse)]) is None  # names only
