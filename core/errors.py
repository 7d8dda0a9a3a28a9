"""The one root error of memstream and its short, documented subclasses."""

from __future__ import annotations

# the root, the errors the client distribution raises too (memstream.sealing) and describe
from memstream.contract.exceptions import ConfigError, InvalidRecord, MemstreamError, describe

__all__ = ["BrokerError", "ConfigError", "InvalidRecord", "MemstreamError", "describe", "trace"]


class BrokerError(MemstreamError):
    """The local Kafka broker could not be fetched, started, reached or stopped."""


def trace(exc: BaseException, limit: int = 30) -> str:
    """A traceback fit for a log line: each frame's file, line, function and code, then
    :func:`describe` of ``exc`` (never its message: ``log.exception`` would print it, and
    with it whatever value the error quotes)."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__, limit=-limit)
    lines = [f'  File "{f.filename}", line {f.lineno}, in {f.name}'
             + (f"\n    {f.line}" if f.line else "") for f in frames]
    return "\n".join(["Traceback (most recent call last):", *lines, describe(exc)])
