"""The installed icefloe's version, for ``icefloe --version``, logs and the REST catalog.

Read from the distribution's metadata, so the one place that sets it is pyproject.toml.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version


def _installed_version() -> str:
    try:
        return version("icefloe")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "0+unknown"


__version__ = _installed_version()

__all__ = ["__version__"]
