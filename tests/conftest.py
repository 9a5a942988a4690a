"""Session-wide fixtures: real servers, each started only when a test asks for it.

Every fixture here is session-scoped and lazy, so a unit-test run starts nothing, and a
server shared by many tests is started once and stopped by PID when the session ends.
Each is a one-server :class:`~icefloe.local_stack.LocalStack`. Tests that use them carry
``@pytest.mark.integration``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from java_iceberg import JavaIceberg
from servers import LocalStack, MotoS3


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[MotoS3]:
    """A single-threaded moto S3 server (exact ``If-None-Match`` conditional writes)."""
    with LocalStack(s3=True) as stack:
        yield stack.s3


@pytest.fixture(scope="session")
def redis_server() -> Iterator[str]:
    """URL of a throw-away redis (no persistence): ``redis://127.0.0.1:PORT/0``."""
    with LocalStack(redis=True) as stack:
        yield stack.redis_url


@pytest.fixture(scope="session")
def dynalite() -> Iterator[str]:
    """Endpoint URL of an in-memory dynalite (DynamoDB API with real conditional writes)."""
    with LocalStack(dynamodb=True) as stack:
        yield stack.dynamodb_endpoint


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[str]:
    """Bootstrap servers (``127.0.0.1:PORT``) of an in-memory tansu Kafka broker."""
    with LocalStack(kafka=True) as stack:
        yield stack.kafka_bootstrap


@pytest.fixture(scope="session")
def java_iceberg() -> Iterator[JavaIceberg]:
    """Apache Iceberg Java 1.10.2 on Spark 3.5 (its own venv), started once per session."""
    java = JavaIceberg()
    try:
        yield java
    finally:
        java.close()
