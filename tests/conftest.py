"""Session-wide fixtures: real servers, each started only when a test asks for it.

Every fixture here is session-scoped and lazy, so a unit-test run starts nothing, and a
server shared by many tests is started once and stopped by PID when the session ends.
Tests that use them carry ``@pytest.mark.integration``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from servers import (
    HOST,
    MotoS3,
    start_dynalite,
    start_moto_s3,
    start_redis,
    start_tansu,
)


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[MotoS3]:
    """A single-threaded moto S3 server (exact ``If-None-Match`` conditional writes)."""
    server = start_moto_s3()
    try:
        yield MotoS3(endpoint_url=f"http://{HOST}:{server.port}")
    finally:
        server.stop()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[str]:
    """URL of a throw-away redis (no persistence): ``redis://127.0.0.1:PORT/0``."""
    server = start_redis()
    try:
        yield f"redis://{HOST}:{server.port}/0"
    finally:
        server.stop()


@pytest.fixture(scope="session")
def dynalite() -> Iterator[str]:
    """Endpoint URL of an in-memory dynalite (DynamoDB API with real conditional writes)."""
    server = start_dynalite()
    try:
        yield f"http://{HOST}:{server.port}"
    finally:
        server.stop()


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[str]:
    """Bootstrap servers (``127.0.0.1:PORT``) of an in-memory tansu Kafka broker."""
    server = start_tansu()
    try:
        yield f"{HOST}:{server.port}"
    finally:
        server.stop()
