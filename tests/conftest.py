"""Session-wide fixtures: real servers, each started only when a test asks for it.

Every fixture here is session-scoped and lazy, so a unit-test run starts nothing, and a
server shared by many tests is started once and stopped by PID when the session ends.
Each is a one-server :class:`~icefloe.dev.local_stack.LocalStack`. Tests that use them carry
``@pytest.mark.integration``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from java_iceberg import JavaIceberg
from servers import LocalStack, S3Endpoint, start_moto_s3

# Hypothesis profiles. "dev" (the default) explores freshly on every run, so developers keep
# finding new cases; "ci" (chosen when CI=true, or with HYPOTHESIS_PROFILE=ci) derandomizes,
# so CI is repeatable and a red run is reproduced by running it again. No deadlines in
# either: the machines are shared and a slow example is not a failure.
settings.register_profile("dev", deadline=None)
settings.register_profile("fast", deadline=None, max_examples=20)  # `make test-fast`
settings.register_profile(
    "ci",
    deadline=None,
    derandomize=True,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") == "true" else "dev")
)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Endpoint]:
    """A SeaweedFS S3 server (real, atomic ``If-None-Match: *`` conditional writes)."""
    with LocalStack(s3=True) as stack:
        yield stack.s3


@pytest.fixture(scope="session")
def moto_server() -> Iterator[str]:
    """Endpoint URL of a (single-threaded) moto server, only for what the real servers lack:
    DynamoDB's TransactWriteItems, which dynalite does not implement."""
    server = start_moto_s3()
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        server.stop()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[str]:
    """URL of a redis with its append-only file (as production needs): ``redis://...``."""
    with LocalStack(redis=True) as stack:
        yield stack.redis_url


@pytest.fixture(scope="session")
def dynalite() -> Iterator[str]:
    """Endpoint URL of a dynalite on disk (DynamoDB API with real conditional writes)."""
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
