"""How icefloe's services and Spark jobs connect to Kafka: brokers, SASL, TLS, protocol.

The coordinator, the planner and the Spark jobs each declare the connection settings they
accept as fields of their own settings class (their environment variables and flags differ,
and a job needs fewer of them), but they must agree on what those settings mean: which
security protocol an unset one defaults to, which combinations are refused, and what
keyword arguments aiokafka is given. Those rules live here, once.
"""

from __future__ import annotations

import ssl
from typing import Any, Literal

from pydantic import SecretStr

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]


def check_sasl(
    mechanism: SaslMechanism | None, username: str | None, password: SecretStr | None
) -> None:
    """Refuse a SASL mechanism without credentials (ValueError, for pydantic validators)."""
    if mechanism is not None and (username is None or password is None):
        raise ValueError(f"sasl_mechanism {mechanism} needs sasl_username and sasl_password")


def check_client_certificate(certfile: str | None, keyfile: str | None) -> None:
    """Refuse half a client certificate (ValueError, for pydantic validators)."""
    if (certfile is None) != (keyfile is None):
        raise ValueError("tls_certfile and tls_keyfile must be given together")


def derive_security_protocol(
    explicit: SecurityProtocol | None, sasl_mechanism: SaslMechanism | None, tls: bool
) -> SecurityProtocol:
    """The protocol set explicitly, else the one the SASL and TLS settings imply."""
    if explicit is not None:
        return explicit
    if sasl_mechanism is not None:
        return "SASL_SSL" if tls else "SASL_PLAINTEXT"
    return "SSL" if tls else "PLAINTEXT"


def uses_tls(protocol: SecurityProtocol) -> bool:
    return protocol in ("SSL", "SASL_SSL")


def client_ssl_context(
    cafile: str | None,
    certfile: str | None = None,
    keyfile: str | None = None,
    key_password: SecretStr | None = None,
) -> ssl.SSLContext:
    """A client TLS context: system CAs unless a CA file, plus the client certificate if any."""
    context = ssl.create_default_context(cafile=cafile)
    if certfile is not None:
        password = key_password.get_secret_value() if key_password else None
        context.load_cert_chain(certfile, keyfile, password)
    return context


def connection_options(
    *,
    brokers: str,
    client_id: str,
    security_protocol: SecurityProtocol,
    ssl_context: ssl.SSLContext | None,
    sasl_mechanism: SaslMechanism | None,
    sasl_username: str | None,
    sasl_password: SecretStr | None,
) -> dict[str, Any]:
    """Connection keyword arguments shared by aiokafka's consumer, producer and admin.

    ``brokers`` is the comma-separated list as configured; blanks around entries are ignored.
    """
    options: dict[str, Any] = {
        "bootstrap_servers": [b.strip() for b in brokers.split(",") if b.strip()],
        "client_id": client_id,
        "security_protocol": security_protocol,
    }
    if ssl_context is not None:
        options["ssl_context"] = ssl_context
    if sasl_mechanism is not None:
        assert sasl_password is not None  # refused earlier by check_sasl
        options["sasl_mechanism"] = sasl_mechanism
        options["sasl_plain_username"] = sasl_username
        options["sasl_plain_password"] = sasl_password.get_secret_value()
    return options


__all__ = [
    "SaslMechanism",
    "SecurityProtocol",
    "check_client_certificate",
    "check_sasl",
    "client_ssl_context",
    "connection_options",
    "derive_security_protocol",
    "uses_tls",
]
