"""The consumer (now in the client distribution) still takes the server's ``Settings`` as
it is: the same topics the registry names, the same keys, the same Kafka connection."""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from memstream.consumer import ConsumerSettings, MemoryChanges
from memstream.consumer.opening import Opener
from memstream.core import kafka
from memstream.core.settings import Settings
from memstream.sealing import envelope as crypto
from memstream.sealing.key_records import Keyring, encode_read_key
from memstream.topics.registry import registry

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("prefix", ["memstream", "acme.prod"])
def test_the_reader_reads_the_topics_the_registry_names(prefix):
    settings = Settings(topic_prefix=prefix)
    reader = MemoryChanges(settings, group_id="g")
    topics = registry(settings)
    assert reader.topic == topics.memory_events.name
    assert reader._opener._topic == topics.user_keys.name
    assert MemoryChanges(ConsumerSettings(topic_prefix=prefix), group_id="g").topic == \
        reader.topic


def test_the_servers_key_settings_give_the_same_keyring():
    kek = crypto.new_kek()
    fields = {"master_key": SecretStr("a master key of some length"), "master_key_version": 2,
              "master_key_previous": SecretStr("1:an older master key value"),
              "read_keys": SecretStr(encode_read_key("t1", {"k1": kek})),
              "forget_markers_legacy": True}
    server, client = Keyring.of(Settings(**fields)), Keyring.of(ConsumerSettings(**fields))
    assert server == client and server.version == 2 and set(server.wrapping) == {1, 2}
    assert server.read == {"t1": {"k1": kek}} and server.legacy_markers


def test_the_consumers_connection_is_the_servers():
    settings = Settings(bootstrap_servers="k1:9092,k2:9092",
                        kafka_security_protocol="SASL_PLAINTEXT",
                        kafka_sasl_username="reader", kafka_sasl_password=SecretStr("pw"))
    assert ConsumerSettings.of(settings).aiokafka_options() == kafka.connection(settings)
    assert Opener(settings, "keys", require_content=False)._settings is settings
