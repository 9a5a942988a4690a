"""How icefloe's services and Spark jobs connect to Kafka: brokers, SASL, TLS, protocol.

:class:`KafkaSettings` is the one connection settings model: the coordinator's, the
planner's and the Spark jobs' settings classes inherit its fields, so they accept the same
settings under the same names (``brokers``, ``sasl_mechanism``, ``tls_cafile``, ...; each
under its service's environment prefix: ``ICEFLOE_BROKERS``, ``ICEFLOE_PLANNER_BROKERS``,
``spark.icefloe.brokers``) and agree on what they mean: which security protocol an unset
one defaults to, which combinations are refused, and what keyword arguments aiokafka is
given. The secrets (``sasl_password``, ``tls_key_password``) come from the environment or a
secrets file only, never from a flag (:mod:`icefloe.runtime.settings`).
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Literal, Protocol

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from pydantic import BaseModel, Field, SecretStr, model_validator

from icefloe.errors import ValidationError
from icefloe.events import Event, encode_event, event_key, parse_event

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


def brokers_field(default: str | None) -> Any:
    """The ``brokers`` field with a service's default (None: Kafka is optional there)."""
    return Field(default, min_length=1, description=BROKERS_HELP)


def client_id_field(default: str) -> Any:
    """The ``client_id`` field with a service's default."""
    return Field(default, min_length=1, description=CLIENT_ID_HELP)


BROKERS_HELP = "Kafka bootstrap servers, host:port[,host:port]"
CLIENT_ID_HELP = "client id the brokers see (logs, quotas)"


class KafkaSettings(BaseModel):
    """The Kafka connection settings, inherited by each service's settings class.

    A service re-declares ``brokers`` (with :func:`brokers_field`) and ``client_id`` (with
    :func:`client_id_field`) to give them its defaults, and may override
    :meth:`require_brokers` to say where its brokers are set.
    """

    brokers: str | None = brokers_field(None)
    client_id: str = client_id_field("icefloe")
    security_protocol: SecurityProtocol | None = Field(
        default=None,
        description="PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL; default: derived from the "
        "SASL and TLS settings",
    )
    sasl_mechanism: SaslMechanism | None = Field(
        default=None, description="SASL mechanism; needs sasl_username and sasl_password"
    )
    sasl_username: str | None = Field(default=None, description="SASL user name")
    sasl_password: SecretStr | None = Field(
        default=None, description="SASL password (environment or secrets file only)"
    )
    tls_cafile: str | None = Field(
        default=None, description="CA bundle (PEM) for the brokers' certificates; unset: system CAs"
    )
    tls_certfile: str | None = Field(
        default=None, description="client certificate (PEM), with tls_keyfile"
    )
    tls_keyfile: str | None = Field(default=None, description="client key (PEM), with tls_certfile")
    tls_key_password: SecretStr | None = Field(
        default=None, description="password of tls_keyfile (environment or secrets file only)"
    )

    @model_validator(mode="after")
    def _kafka_consistent(self) -> KafkaSettings:
        check_sasl(self.sasl_mechanism, self.sasl_username, self.sasl_password)
        check_client_certificate(self.tls_certfile, self.tls_keyfile)
        return self

    @property
    def effective_security_protocol(self) -> SecurityProtocol:
        tls = self.tls_cafile is not None or self.tls_certfile is not None
        return derive_security_protocol(self.security_protocol, self.sasl_mechanism, tls)

    def require_brokers(self) -> str:
        """The brokers; ValidationError when they are not configured."""
        if not self.brokers:
            raise ValidationError("no Kafka brokers configured (brokers)")
        return self.brokers

    def ssl_context(self) -> ssl.SSLContext | None:
        """A client TLS context when the protocol uses TLS (system CAs unless a CA file)."""
        if not uses_tls(self.effective_security_protocol):
            return None
        return client_ssl_context(
            self.tls_cafile, self.tls_certfile, self.tls_keyfile, self.tls_key_password
        )

    def kafka_options(self) -> dict[str, Any]:
        """Connection keyword arguments shared by aiokafka's consumer, producer and admin."""
        return connection_options(
            brokers=self.require_brokers(),
            client_id=self.client_id,
            security_protocol=self.effective_security_protocol,
            ssl_context=self.ssl_context(),
            sasl_mechanism=self.sasl_mechanism,
            sasl_username=self.sasl_username,
            sasl_password=self.sasl_password,
        )

    def connection_key(self) -> tuple[Any, ...]:
        """What identifies one connection: settings with equal keys may share clients."""
        return (
            self.brokers,
            self.client_id,
            self.effective_security_protocol,
            self.sasl_mechanism,
            self.sasl_username,
            self.tls_cafile,
            self.tls_certfile,
            self.tls_keyfile,
        )


# -- clients ----------------------------------------------------------------------------
# Every aiokafka client of icefloe is built here, from KafkaSettings.kafka_options(), so the
# services agree on how they produce (acks from all replicas, no idempotence: exactly-once
# comes from commit ids, not from the producer) and how they consume (offsets are committed
# by hand, or not at all).


def producer(options: Mapping[str, Any], *, max_request_size: int) -> AIOKafkaProducer:
    """A producer that waits for all in-sync replicas and batches for 5ms."""
    return AIOKafkaProducer(
        **options,
        acks="all",
        enable_idempotence=False,
        linger_ms=5,
        max_request_size=max_request_size,
    )


def group_consumer(options: Mapping[str, Any], group_id: str, **extra: Any) -> AIOKafkaConsumer:
    """A consumer group member that commits its offsets itself, from the earliest offset."""
    return AIOKafkaConsumer(
        **options,
        group_id=group_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        **extra,
    )


def tail_consumer(options: Mapping[str, Any], *topics: str) -> AIOKafkaConsumer:
    """A consumer of no group that reads from the end (subscribed to ``topics``, if any)."""
    return AIOKafkaConsumer(
        *topics, **options, group_id=None, enable_auto_commit=False, auto_offset_reset="latest"
    )


def admin(options: Mapping[str, Any]) -> AIOKafkaAdminClient:
    return AIOKafkaAdminClient(**options)


async def send_event(
    producer: AIOKafkaProducer, topic: str, event: Event, key: bytes | None = None
) -> None:
    """Send ``event`` in its versioned JSON form, keyed by its table unless ``key`` is given,
    and wait for the acknowledgement."""
    table = getattr(event, "table", None)
    if key is None and table is not None:
        key = event_key(table)
    await producer.send_and_wait(topic, encode_event(event), key=key)


def decoded(batches: Mapping[Any, Iterable[Any]]) -> Iterator[Event | ValidationError]:
    """The records of a ``getmany()`` answer as events, in order; an unreadable value as its
    ValidationError (for the caller to count or skip); records without a value are skipped."""
    for records in batches.values():
        for record in records:
            if record.value is None:
                continue
            try:
                yield parse_event(record.value)
            except ValidationError as e:
                yield e


class _Stoppable(Protocol):
    async def stop(self) -> Any: ...


async def stop_quietly(*clients: _Stoppable | None) -> None:
    """Stop each client that exists, ignoring errors (closing after a failure)."""
    for client in clients:
        if client is not None:
            with contextlib.suppress(Exception):
                await client.stop()


__all__ = [
    "BROKERS_HELP",
    "CLIENT_ID_HELP",
    "KafkaSettings",
    "SaslMechanism",
    "SecurityProtocol",
    "admin",
    "brokers_field",
    "check_client_certificate",
    "check_sasl",
    "client_id_field",
    "client_ssl_context",
    "connection_options",
    "decoded",
    "derive_security_protocol",
    "group_consumer",
    "producer",
    "send_event",
    "stop_quietly",
    "tail_consumer",
    "uses_tls",
]
