"""Real servers for integration tests: moto (S3), redis, dynalite (DynamoDB), tansu (Kafka).

The process handling (free ports, readiness that only counts a server's *own* listening
socket, stop by PID with SIGTERM then SIGKILL, no orphans) lives in
:mod:`icefloe.dev.local_stack`, shared with ``make demo``, ``make bench`` and ``python -m
icefloe.dev.local_stack``. This module keeps the names the tests import.
"""

from __future__ import annotations

from icefloe.dev.local_stack import (
    HOST,
    KEEP_LOGS_ENV,
    START_ATTEMPTS,
    START_TIMEOUT_S,
    STOP_GRACE_S,
    LocalStack,
    ServerProcess,
    free_port,
    owns_listening_port,
    probe_http,
    probe_kafka,
    probe_redis,
    start_dynalite,
    start_moto_s3,
    start_redis,
    start_server,
    start_tansu,
)
from icefloe.dev.local_stack import S3Endpoint as S3Endpoint
from icefloe.errors import ServerStartError

__all__ = [
    "HOST",
    "KEEP_LOGS_ENV",
    "START_ATTEMPTS",
    "START_TIMEOUT_S",
    "STOP_GRACE_S",
    "LocalStack",
    "S3Endpoint",
    "ServerProcess",
    "ServerStartError",
    "free_port",
    "owns_listening_port",
    "probe_http",
    "probe_kafka",
    "probe_redis",
    "start_dynalite",
    "start_moto_s3",
    "start_redis",
    "start_server",
    "start_tansu",
]
