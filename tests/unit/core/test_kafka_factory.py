"""The one Kafka client factory: every client gets the connection settings, and a login is
never half configured (the SASL broker itself: tests/integration/test_sasl.py)."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import pytest
from pydantic import ValidationError

from memstream.core import kafka
from memstream.core.errors import BrokerError
from memstream.core.settings import Settings
from memstream.dev import broker as local_broker

pytestmark = pytest.mark.unit
LOGIN = {"kafka_security_protocol": "SASL_PLAINTEXT", "kafka_sasl_username": "svc",
         "kafka_sasl_password": "pw-123"}


def test_plaintext_is_the_default_and_carries_no_login():
    args = kafka.connection(Settings(bootstrap_servers="b:1"))
    assert args == {"bootstrap_servers": "b:1", "security_protocol": "PLAINTEXT"}


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
async def test_sasl_reaches_every_client_kind(mechanism):
    s = Settings(bootstrap_servers="b:1", kafka_sasl_mechanism=mechanism, **LOGIN)
    args = kafka.connection(s)
    assert args["security_protocol"] == "SASL_PLAINTEXT"
    assert (args["sasl_mechanism"], args["sasl_plain_username"],
            args["sasl_plain_password"]) == (mechanism, "svc", "pw-123")
    producer, consumer, admin = kafka.producer(s), kafka.consumer(s, "t"), kafka.admin(s)
    assert producer.client._sasl_plain_password == "pw-123"
    assert consumer._client._sasl_mechanism == mechanism
    assert admin._client._security_protocol == "SASL_PLAINTEXT"
    await admin.close()
    await producer.stop()
    await consumer.stop()


def test_a_sasl_protocol_without_a_login_is_refused_at_start_up():
    with pytest.raises(ValidationError, match="kafka_sasl_username and kafka_sasl_password"):
        Settings(kafka_security_protocol="SASL_SSL", kafka_sasl_username="svc")


def test_the_password_is_never_printed():
    s = Settings(**LOGIN)
    assert "pw-123" not in repr(s) and "pw-123" not in str(s.model_dump())


def test_ssl_builds_one_context(tmp_path: Path):
    s = Settings(kafka_security_protocol="SSL")
    args = kafka.connection(s)
    assert isinstance(args["ssl_context"], ssl.SSLContext) and "sasl_mechanism" not in args
    missing = Settings(kafka_security_protocol="SSL", kafka_ssl_cafile=tmp_path / "no.pem")
    with pytest.raises(OSError):
        kafka.connection(missing)  # a CA file that is not there fails before any connection
    both = kafka.connection(Settings(**{**LOGIN, "kafka_security_protocol": "SASL_SSL"}))
    assert isinstance(both["ssl_context"], ssl.SSLContext) and both["sasl_plain_username"]


def test_the_local_broker_checks_its_login_before_writing_it(tmp_path: Path):
    base = {"kafka_home": tmp_path, "kafka_port": 1}
    with pytest.raises(BrokerError, match="MEMSTREAM_KAFKA_SASL_USERNAME"):
        local_broker._sasl_block(Settings(**base))
    with pytest.raises(BrokerError, match="letters, digits"):
        local_broker._sasl_block(Settings(**base, kafka_sasl_username="a b",
                                          kafka_sasl_password="x"))
    with pytest.raises(BrokerError, match="quotes"):
        local_broker._sasl_block(Settings(**base, kafka_sasl_username="svc",
                                          kafka_sasl_password='x"; user_admin="y'))
    block = local_broker._sasl_block(Settings(**base, kafka_sasl_username="svc",
                                              kafka_sasl_password="pw-123"))
    assert 'user_svc="pw-123"' in block and "sasl.enabled.mechanisms=PLAIN" in block


def test_a_client_of_the_local_broker_logs_in_only_when_it_was_started_so(tmp_path: Path):
    s = Settings(kafka_home=tmp_path, kafka_port=7, **LOGIN)
    paths = local_broker.paths_for(s)
    paths.run.mkdir(parents=True)
    paths.listener_file.write_text("SASL_PLAINTEXT")
    assert local_broker.client_settings(s).kafka_security_protocol == "SASL_PLAINTEXT"
    assert local_broker.client_settings(s).bootstrap_servers == "127.0.0.1:7"
    paths.listener_file.write_text("PLAINTEXT")
    assert local_broker.client_settings(s).kafka_security_protocol == "PLAINTEXT"


def test_the_in_the_clear_warning_is_said_once(caplog):
    import logging

    log = logging.getLogger("aiokafka.conn")
    with caplog.at_level(logging.WARNING, logger="aiokafka.conn"):
        for _ in range(3):
            log.warning("Sending username and password in the clear")
            log.warning("something else")
    said = [r.getMessage() for r in caplog.records]
    assert said.count("something else") == 3
    assert said.count("Sending username and password in the clear") <= 1


class _SlowStop:
    """A consumer whose stop takes a few loop turns."""

    def __init__(self) -> None:
        self.stopped = False

    async def stop(self) -> None:
        for _ in range(3):
            await asyncio.sleep(0)
        self.stopped = True


async def test_a_caller_cancelled_while_stopping_a_consumer_waits_for_the_stop():
    """A task group cancels a read whose sibling failed while the read stops its consumer
    (a refused login): the stop still ends, so no consumer is collected unclosed."""
    client = _SlowStop()
    task = asyncio.ensure_future(kafka.stopped(client))  # type: ignore[arg-type]
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert client.stopped
    calm = _SlowStop()
    await kafka.stopped(calm)  # type: ignore[arg-type]
    assert calm.stopped
