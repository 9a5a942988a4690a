"""The table format versions icefloe reads and writes, and the checks of a version.

Table metadata, manifests and manifest lists each name a format version (the metadata in
``format-version``, the Avro files in their key-value metadata), and the spec requires a
reader to refuse a version it does not know. One module holds the versions and the checks so
that all three agree on them, and so that the manifest modules need not import each other,
or the table metadata, to share a constant.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from icefloe.errors import InvalidFileError, UnsupportedFormatVersion, ValidationError

SUPPORTED_FORMAT_VERSIONS = (1, 2, 3)
MIN_FORMAT_VERSION = 1
MAX_FORMAT_VERSION = 3


def check_format_version(version: Any) -> int:
    """The version as an int, or UnsupportedFormatVersion naming it (spec: must throw)."""
    if isinstance(version, bool) or not isinstance(version, int):
        raise ValidationError(f"'format-version' must be an integer, got {version!r:.50}")
    if version not in SUPPORTED_FORMAT_VERSIONS:
        raise UnsupportedFormatVersion(
            f"unsupported table format-version {version}: icefloe reads and writes versions "
            f"{MIN_FORMAT_VERSION} to {MAX_FORMAT_VERSION}"
        )
    return version


def check_format_version_in(version: Any, where: str) -> int:
    """:func:`check_format_version` with the file named in the message."""
    try:
        return check_format_version(version)
    except ValidationError as e:
        raise type(e)(f"{where}: {e}") from None


def check_write_version(version: int, what: str) -> None:
    """Refuse to write a ``what`` (manifest, manifest list) for an unsupported version."""
    if version not in SUPPORTED_FORMAT_VERSIONS:
        raise UnsupportedFormatVersion(
            f"cannot write a {what} for format version {version}; "
            f"supported versions are {list(SUPPORTED_FORMAT_VERSIONS)}"
        )


def format_version_of(meta: Mapping[str, str], location: str, default: int) -> int:
    """The ``format-version`` key-value metadata of a manifest or manifest list."""
    text = meta.get("format-version")
    if text is None:
        return default
    try:
        version = int(text)
    except ValueError:
        raise InvalidFileError(location, f"format-version {text!r} is not a number") from None
    if version not in SUPPORTED_FORMAT_VERSIONS:
        raise UnsupportedFormatVersion(
            f"{location}: format-version {version} is not supported "
            f"(supported: {list(SUPPORTED_FORMAT_VERSIONS)})"
        )
    return version


__all__ = [
    "MAX_FORMAT_VERSION",
    "MIN_FORMAT_VERSION",
    "SUPPORTED_FORMAT_VERSIONS",
    "check_format_version",
    "check_format_version_in",
    "check_write_version",
    "format_version_of",
]
