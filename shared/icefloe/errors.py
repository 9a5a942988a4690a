"""Typed exceptions shared by every layer of icefloe.

Callers catch these instead of library internals (KeyError, fastavro or botocore
errors) so a message can always name the file and the field that was wrong.
"""

from __future__ import annotations

from pathlib import Path


class IcefloeError(Exception):
    """Base class for every error icefloe raises on purpose."""


class ValidationError(IcefloeError, ValueError):
    """Input that does not follow the Iceberg spec (metadata, schemas, values, events)."""


class UnsupportedFormatVersion(ValidationError):
    """A table-metadata or manifest format-version this implementation cannot handle."""


class SchemaEvolutionError(ValidationError):
    """A schema change that the spec forbids (bad promotion, required column added, ...)."""


class InvalidFileError(IcefloeError):
    """A metadata, manifest or data file that cannot be decoded; the message names the file."""

    def __init__(self, location: str, reason: str) -> None:
        super().__init__(f"{location}: {reason}")
        self.location = location
        self.reason = reason


class FileIOError(IcefloeError, OSError):
    """Storage failure (missing file, permission, transport) for a named location."""


class NotFoundError(IcefloeError, LookupError):
    """A namespace, table, snapshot, ref or file that does not exist."""


class AlreadyExistsError(IcefloeError):
    """Create-if-absent found something already there (file, table, namespace)."""


class NamespaceNotEmptyError(ValidationError):
    """Dropping a namespace that still holds tables or child namespaces."""


class UnsupportedOperationError(IcefloeError):
    """The operation is valid but this catalog cannot do it (e.g. rename a file-system table)."""


class CommitFailedError(IcefloeError):
    """The conditional swap lost: someone else committed first. Safe to reload and retry."""


class CommitStateUnknownError(IcefloeError):
    """The commit request may or may not have reached the store; check before retrying."""


class ValidationConflictError(IcefloeError):
    """A retried operation is no longer valid on the new base (e.g. a rewritten file is gone)."""


class EventRejectedError(ValidationError):
    """An event the coordinator refuses and dead-letters; ``kind`` is a short, stable class
    of the reason (``unknown-table``, ``bad-path``, ...) so metrics can count by it while
    the message stays precise."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class ServerStartError(IcefloeError, RuntimeError):
    """A local server (``python -m icefloe.dev.local_stack``, test fixtures) did not come up.

    The message carries the command and the tail of its log; the logs of failed attempts
    are kept for inspection and listed in ``log_paths``.
    """

    def __init__(self, message: str, log_paths: list[Path] | None = None) -> None:
        super().__init__(message)
        self.log_paths: list[Path] = list(log_paths or [])
