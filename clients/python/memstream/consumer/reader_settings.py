"""What a downstream reader needs without the server installed: the Kafka connection
(:class:`memstream.client.KafkaConnection`), the topics' prefix and the keys that open
sealed content, with the server's field names and ``MEMSTREAM_`` variables
(:meth:`ConsumerSettings.from_env`). The server's ``Settings`` can be given instead.
"""

from __future__ import annotations

from pydantic import Field, SecretStr

from memstream.client import KafkaConnection


class ConsumerSettings(KafkaConnection):
    """A reader's settings: the connection, ``topic_prefix`` and ``master_key`` (every
    tenant) or ``read_keys`` (``memstream keys create --tenant T --read-events``)."""

    topic_prefix: str = "memstream"
    master_key: SecretStr | None = None
    master_key_version: int = Field(1, ge=1)
    master_key_previous: SecretStr | None = None  # '<version>:<key>', comma separated
    forget_markers_legacy: bool = False
    read_keys: SecretStr | None = None
