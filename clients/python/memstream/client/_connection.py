"""The client's Kafka connection: bootstrap servers, security protocol, SASL, TLS files and
the input topics' layout, with the names (and ``MEMSTREAM_`` variables) of the server's
settings, so the server's ``Settings`` can be given as it is (:meth:`KafkaConnection.of`).

Building a Kafka client from it needs the ``kafka`` extra (aiokafka), imported only then.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, SecretStr, model_validator

from memstream.contract.exceptions import MemstreamError

KAFKA_EXTRA = "Kafka needs the kafka extra: pip install 'memstream-client[kafka]'"


def aiokafka() -> ModuleType:
    """aiokafka (with its helpers), or the error that names the extra to install."""
    try:
        module = importlib.import_module("aiokafka")
        importlib.import_module("aiokafka.helpers")
    except ImportError as exc:
        raise MemstreamError(KAFKA_EXTRA) from exc
    return module


class KafkaConnection(BaseModel):
    """How the client reaches Kafka; the password stays a ``SecretStr`` until a Kafka
    client is built, and is never printed."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    bootstrap_servers: str = "127.0.0.1:9092"
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = (
        "PLAINTEXT")
    kafka_sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = "PLAIN"
    kafka_sasl_username: str | None = None
    kafka_sasl_password: SecretStr | None = None
    kafka_ssl_cafile: Path | None = None
    kafka_ssl_certfile: Path | None = None  # mutual TLS
    kafka_ssl_keyfile: Path | None = None
    input_topics: Literal["shared", "per-tenant"] = "shared"  # docs/tenancy.md

    @model_validator(mode="after")
    def _login(self) -> KafkaConnection:
        if self.kafka_security_protocol.startswith("SASL") and not (
                self.kafka_sasl_username and self.kafka_sasl_password):
            raise ValueError(f"kafka_security_protocol {self.kafka_security_protocol} needs "
                             "kafka_sasl_username and kafka_sasl_password")
        return self

    @classmethod
    def of(cls, source: object) -> KafkaConnection:
        """The connection of any object with these attributes: memstream's own ``Settings``
        has them all (a field it lacks keeps its default)."""
        if isinstance(source, cls):
            return source
        return cls(**{name: getattr(source, name) for name in cls.model_fields
                      if hasattr(source, name)})

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> KafkaConnection:
        """From ``MEMSTREAM_BOOTSTRAP_SERVERS``, ``MEMSTREAM_KAFKA_SECURITY_PROTOCOL``, ...:
        the server's variables, read the same way (unset: the default)."""
        env = os.environ if environ is None else environ
        found = {name: env[f"MEMSTREAM_{name.upper()}"] for name in cls.model_fields
                 if env.get(f"MEMSTREAM_{name.upper()}")}
        return cls.model_validate(found)

    def aiokafka_options(self) -> dict[str, Any]:
        """aiokafka's connection keywords: bootstrap servers, security protocol, SASL, TLS
        (the keywords of the server's own clients, ``memstream.core.kafka.connection``)."""
        options: dict[str, Any] = {"bootstrap_servers": self.bootstrap_servers,
                                   "security_protocol": self.kafka_security_protocol}
        if self.kafka_security_protocol in ("SSL", "SASL_SSL"):
            options["ssl_context"] = aiokafka().helpers.create_ssl_context(
                cafile=self.kafka_ssl_cafile, certfile=self.kafka_ssl_certfile,
                keyfile=self.kafka_ssl_keyfile)
        if self.kafka_security_protocol.startswith("SASL"):
            assert self.kafka_sasl_password is not None  # checked when built
            options.update(sasl_mechanism=self.kafka_sasl_mechanism,
                           sasl_plain_username=self.kafka_sasl_username,
                           sasl_plain_password=self.kafka_sasl_password.get_secret_value())
        return options
