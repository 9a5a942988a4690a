"""Where a location really points, and whether it lies under another: one rule for every check.

A catalog that lets clients name locations (a table's ``location``, ``write.data.path``, a
snapshot's manifest list, a registered metadata file) must decide whether the location lies
under a root it trusts: the warehouse, the allowed prefixes, the table's own directory. A
prefix test on the raw text is not that decision: ``/wh/../etc``, ``/wh/./x``,
``file:/wh/x`` and ``file:///wh//x``, ``s3a://b/wh/x`` against ``s3://b/wh``,
``/wh/%2e%2e/etc`` (decoded by some engines' file systems, not by ours) and a symbolic link
under the warehouse that points elsewhere all defeat it, one way or the other. This module
gives every location one normal form (:func:`normal_location`) and answers containment on it
(:func:`within`), so the REST catalog, the coordinator's event checks and purges decide alike.

The normal form refuses rather than resolves what storage would not resolve the same way:

* ``.`` and ``..`` segments, also percent-encoded (``%2e%2e``, twice-encoded too): object
  stores keep them literally, local paths resolve them, other engines decode them first;
* empty segments (``//``) in an object-store key, where ``a//b`` and ``a/b`` are different
  objects; on a local file system they are the same directory and are collapsed;
* relative local paths, control characters and the NUL byte.

Schemes are compared canonically (``s3a``/``s3n`` are ``s3``; ``file:``, ``file://`` and
plain absolute paths are one local form); a location of another scheme or bucket is never
within a root. On the local file system :func:`within` can also resolve symbolic links
(``resolve_links``), so a link under a root that leads out of it does not count as under it.
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from icefloe.errors import ValidationError
from icefloe.io.fileio import parse_location

# Table properties naming a directory the table writes to (Java's TableProperties names):
# relative values are resolved against the table location.
LOCATION_PROPERTIES: Final = (
    "write.data.path",
    "write.metadata.path",
    "write.object-storage.path",
    "write.folder-storage.path",
)
_DEFAULT_DIRS: Final = {"write.data.path": "data", "write.metadata.path": "metadata"}
_SCHEME_ALIASES: Final = {"s3a": "s3", "s3n": "s3"}
# Percent-decoding rounds applied when looking for hidden dot segments (%252e%252e is
# %2e%2e once decoded, '..' twice).
_DECODE_ROUNDS: Final = 3


class LocationError(ValidationError):
    """A location that has no safe normal form (dot segments, empty keys, not absolute)."""


@dataclass(frozen=True, slots=True)
class Location:
    """A location in normal form: ``scheme`` is ``file`` or a canonical object-store scheme,
    ``bucket`` None for local paths, ``path`` without a trailing slash (``/abs/path`` for
    local paths, ``key/prefix`` or ``""`` for object stores)."""

    scheme: str
    bucket: str | None
    path: str

    def __str__(self) -> str:
        if self.bucket is None:
            return f"file://{self.path}"
        return f"{self.scheme}://{self.bucket}/{self.path}"

    def contains(self, other: Location) -> bool:
        """Whether ``other`` is this location or lies below it."""
        if (self.scheme, self.bucket) != (other.scheme, other.bucket):
            return False
        if self.path in ("", "/") or other.path == self.path:
            return True
        return other.path.startswith(self.path + "/")


def _hidden_dot_segment(segment: str) -> bool:
    """Whether a segment is, or decodes to a path holding, a ``.`` or ``..`` step."""
    text = segment
    for _ in range(_DECODE_ROUNDS):
        if "%" not in text:
            break
        text = urllib.parse.unquote(text)
        if any(part in (".", "..") for part in text.replace("\\", "/").split("/")):
            return True
    return False


def normal_location(location: str) -> Location:
    """The normal form of ``location`` (see the module docstring); LocationError if it has none."""
    if any(ord(c) < 0x20 or c == "\x7f" for c in location):
        raise LocationError(f"location {location[:200]!r} contains control characters")
    scheme, bucket, path = parse_location(location)
    scheme = _SCHEME_ALIASES.get(scheme, scheme)
    local = bucket is None
    if local and not path.startswith("/"):
        raise LocationError(f"location {location[:200]!r} is not absolute")
    segments = path.split("/")
    kept: list[str] = []
    for i, segment in enumerate(segments):
        if segment in (".", "..") or _hidden_dot_segment(segment):
            raise LocationError(
                f"location {location[:200]!r} has a '.' or '..' step; name the directory itself"
            )
        if segment:
            kept.append(segment)
        elif not local and 0 < i < len(segments) - 1:
            raise LocationError(
                f"location {location[:200]!r} has an empty step ('//'), which object stores "
                "keep as part of the key"
            )
    joined = "/".join(kept)
    return Location(scheme, bucket, "/" + joined if local else joined)


def _real(location: Location) -> Location:
    """A local location with its symbolic links resolved (the part that exists)."""
    if location.bucket is not None:
        return location
    return Location(location.scheme, None, os.path.realpath(location.path))


def within(location: str, root: str, *, resolve_links: bool = False) -> bool:
    """Whether ``location`` is ``root`` or lies under it, both in normal form; False for a
    location (or root) without one. ``resolve_links`` also follows symbolic links of local
    paths, so a link under ``root`` that leads out of it is not within it (a file-system
    call per location: use it where a client may have planted links)."""
    try:
        path, base = normal_location(location), normal_location(root)
    except ValidationError:
        return False
    if not base.contains(path):
        return False
    return not resolve_links or _real(base).contains(_real(path))


def within_any(location: str, roots: Iterable[str], *, resolve_links: bool = False) -> bool:
    """Whether ``location`` lies under one of ``roots`` (see :func:`within`)."""
    return any(within(location, root, resolve_links=resolve_links) for root in roots)


def _spellings(root: Location) -> tuple[str, ...]:
    """The textual prefixes (ending in ``/``) under which a location is within ``root``."""
    if root.bucket is None:
        base = root.path.rstrip("/")
        return tuple(f"{p}{base}/" for p in ("", "file:", "file://", "file://localhost"))
    key = f"{root.path}/" if root.path else ""
    schemes = [s for s, canonical in _SCHEME_ALIASES.items() if canonical == root.scheme]
    return tuple(f"{s}://{root.bucket}/{key}" for s in (root.scheme, *schemes))


def _plainly_below(rest: str) -> bool:
    """Whether the text after a root's prefix is only plain names: no dot step, empty step,
    percent escape or control character (anything else is left to the exact rule)."""
    steps = f"/{rest}/"
    return not (
        "%" in rest
        or "//" in steps
        or "/./" in steps
        or "/../" in steps
        or any(ord(c) < 0x20 or c == "\x7f" for c in rest)
    )


class Roots:
    """A set of roots asked about many locations: ``roots(path)`` is ``within_any(path,
    roots)``, made for thousands of paths (a commit's data files, a purge): a path spelled
    plainly under a root is decided by its text, the exact rule decides the rest, and
    symbolic links (``resolve_links``) are resolved once per folder, not once per file (a
    link in place of a file is not followed: deleting it removes the link, and reading it
    is the writer's own business)."""

    def __init__(self, roots: Iterable[str], *, resolve_links: bool = False) -> None:
        normal = []
        for root in roots:
            try:
                normal.append(normal_location(root))
            except ValidationError:
                continue
        self._spelled = [(p, r) for r in normal for p in _spellings(r)]
        self._prefixes = tuple(p for p, _ in self._spelled)
        self._raw = [str(r) for r in normal]
        self._real = [_real(r) for r in normal] if resolve_links else None
        self._folders: dict[str, bool] = {}

    def __call__(self, path: str) -> bool:
        plain, folder = _plain_folder(path, self._prefixes, self._spelled)
        if not plain:
            if not within_any(path, self._raw):
                return False
            location = normal_location(path)
            folder = os.path.dirname(location.path) if location.bucket is None else None
        if self._real is None or folder is None:
            return True
        inside = self._folders.get(folder)
        if inside is None:
            real = _real(Location("file", None, folder))
            inside = self._folders[folder] = any(r.contains(real) for r in self._real)
        return inside


def first_outside(
    paths: Iterable[str], roots: Iterable[str], *, resolve_links: bool = False
) -> str | None:
    """The first of ``paths`` not within any of ``roots`` (see :class:`Roots`), or None."""
    inside = Roots(roots, resolve_links=resolve_links)
    return next((p for p in paths if not inside(p)), None)


def _plain_folder(
    path: str, prefixes: tuple[str, ...], spelled: list[tuple[str, Location]]
) -> tuple[bool, str | None]:
    """Whether a path is spelled plainly under a root (the text alone decides), and then
    its local folder (None for object stores, which have no links)."""
    if not path.startswith(prefixes):
        return False, None
    for prefix, root in spelled:
        if path.startswith(prefix):
            rest = path[len(prefix) :]
            if not _plainly_below(rest):
                return False, None
            if root.bucket is not None:
                return True, None
            below = rest.rpartition("/")[0]
            return True, f"{root.path.rstrip('/')}/{below}".rstrip("/") or "/"
    return False, None


def resolve_table_path(table_location: str, value: str) -> str:
    """A location-bearing property's value as a location: absolute values as given, relative
    ones under the table location (as Iceberg resolves ``write.metadata.path``)."""
    if "://" in value or value.startswith("/") or value[:5].lower() == "file:":
        return value.rstrip("/") or value
    return f"{table_location.rstrip('/')}/{value.strip('/')}"


def table_locations(table_location: str, properties: Mapping[str, str]) -> list[str]:
    """Every directory a table writes to: its location and each location-bearing property
    (set or defaulted), the roots its files must lie under."""
    roots = [table_location.rstrip("/") or table_location]
    for key in LOCATION_PROPERTIES:
        value = properties.get(key) or _DEFAULT_DIRS.get(key)
        if value:
            resolved = resolve_table_path(table_location, value)
            if resolved not in roots:
                roots.append(resolved)
    return roots


def location_key(location: str) -> str:
    """The normal form of ``location`` ending in ``/``: prefixes are then path prefixes
    (the key of :mod:`icefloe.catalog.location_index`)."""
    return str(normal_location(location)).rstrip("/") + "/"
