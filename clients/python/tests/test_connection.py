"""The client's Kafka connection: given as an object, read from the server's variables, and
turned into aiokafka's keywords with the same security settings as the server's clients."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest
from pydantic import SecretStr, ValidationError

from memstream.client import KafkaConnection, MemoryClient

pytestmark = pytest.mark.unit
needs_aiokafka = pytest.mark.skipif(importlib.util.find_spec("aiokafka") is None,
                                    reason="the kafka extra is not installed")


def test_any_object_with_the_fields_gives_its_connection():
    settings = SimpleNamespace(bootstrap_servers="k1:9093", kafka_security_protocol="SASL_SSL",
                               kafka_sasl_mechanism="SCRAM-SHA-512", kafka_sasl_username="chat",
                               kafka_sasl_password=SecretStr("pw"), input_topics="per-tenant",
                               unrelated=1)
    connection = KafkaConnection.of(settings)
    assert connection.bootstrap_servers == "k1:9093"
    assert connection.kafka_sasl_mechanism == "SCRAM-SHA-512"
    assert connection.input_topics == "per-tenant"
    assert connection.kafka_ssl_cafile is None  # a field it lacks: the default
    assert KafkaConnection.of(connection) is connection
    assert "pw" not in repr(connection)


def test_the_environment_is_read_with_the_servers_names():
    env = {"MEMSTREAM_BOOTSTRAP_SERVERS": "k:9092", "MEMSTREAM_KAFKA_SECURITY_PROTOCOL": "SSL",
           "MEMSTREAM_KAFKA_SSL_CAFILE": "/etc/ca.pem", "MEMSTREAM_INPUT_TOPICS": "",
           "OTHER": "x"}
    connection = KafkaConnection.from_env(env)
    assert connection.kafka_security_protocol == "SSL"
    assert connection.kafka_ssl_cafile == Path("/etc/ca.pem")
    assert connection.input_topics == "shared"  # empty: unset


def test_sasl_without_a_login_is_refused():
    with pytest.raises(ValidationError, match="needs kafka_sasl_username"):
        KafkaConnection(kafka_security_protocol="SASL_PLAINTEXT")


def test_plaintext_options_carry_no_secret():
    assert KafkaConnection(bootstrap_servers="b:1").aiokafka_options() == {
        "bootstrap_servers": "b:1", "security_protocol": "PLAINTEXT"}


@needs_aiokafka
def test_sasl_ssl_options_carry_the_login_and_a_tls_context():
    import ssl

    options = KafkaConnection(kafka_security_protocol="SASL_SSL", kafka_sasl_username="u",
                              kafka_sasl_password=SecretStr("p"),
                              kafka_sasl_mechanism="SCRAM-SHA-256").aiokafka_options()
    assert isinstance(options.pop("ssl_context"), ssl.SSLContext)
    assert options == {"bootstrap_servers": "127.0.0.1:9092", "security_protocol": "SASL_SSL",
                       "sasl_mechanism": "SCRAM-SHA-256", "sasl_plain_username": "u",
                       "sasl_plain_password": "p"}


def test_the_client_takes_bootstrap_servers_over_the_connections():
    connection = KafkaConnection(bootstrap_servers="from-settings:1",
                                 kafka_security_protocol="SSL")
    made: list[KafkaConnection] = []

    def factory(conn: KafkaConnection):  # never started: no add() is made
        made.append(conn)

    with MemoryClient("http://w", "k", tenant_id="acme", kafka=connection,
                      bootstrap_servers="given:2", producer_factory=factory) as client:
        assert client.bootstrap_servers == "given:2"
        assert client._producer._connection.kafka_security_protocol == "SSL"
        assert client._producer._connection.bootstrap_servers == "given:2"
