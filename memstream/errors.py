"""The one root error of memstream and its short, documented subclasses."""

from __future__ import annotations


class MemstreamError(Exception):
    """Root of every error memstream raises on purpose."""


class ConfigError(MemstreamError):
    """Settings that cannot work together."""


class BrokerError(MemstreamError):
    """The local Kafka broker could not be fetched, started, reached or stopped."""


class InvalidRecord(MemstreamError):
    """A record that breaks the topic contract; it goes to the dead-letter topic.

    ``kind`` is a short machine-readable reason (``not_json``, ``schema``, ``version``,
    ``key``, ``too_large``, ``empty``), ``str(exc)`` the readable one.
    """

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
