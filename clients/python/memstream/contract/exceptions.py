"""The root of every error memstream raises on purpose, the server's and the client's, and
the errors both raise: settings that cannot work together, a record that breaks its topic's
contract (the server's ``memstream.core.errors`` has them too), and :func:`describe`, the
one way an exception is written to a log line or a record."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class MemstreamError(Exception):
    """Root of every error memstream raises on purpose."""


class ConfigError(MemstreamError):
    """Settings that cannot work together."""


class InvalidRecord(MemstreamError):
    """A record that breaks the topic contract; it goes to the dead-letter topic.

    ``kind`` is a short machine-readable reason, ``str(exc)`` the readable one (bounded, never
    the record's content):

    - ``empty``: no value (tombstone), an empty value, or blank message content;
    - ``too_large``: the (decompressed) value exceeds the topic's byte limit, or the content
      ``max_content_chars``;
    - ``not_json``: not strict UTF-8, or not JSON;
    - ``depth``: arrays/objects nested deeper than ``codec.MAX_DEPTH``;
    - ``number``: NaN / Infinity, a float that overflows, an integer outside signed 64 bits;
    - ``unicode``: a lone UTF-16 surrogate (``"\\ud800"``) in a string or key;
    - ``version``: ``schema_version`` present but not the integer this worker reads;
    - ``schema``: not an object, a missing or wrongly typed field, an id breaking the rules;
    - ``date``: a datetime that cannot be converted to UTC or falls outside 1970..9999;
    - ``key``: a keyed event whose record key is missing or not ``tenant/user``;
    - ``tenant``: a record of another tenant on a tenant's own input topic (per-tenant layout);
    - ``extraction_failed``: a valid job whose extraction failed after its retries;
    - ``internal``: a valid record the worker could not handle (a bug;
      ``streams.stage.until_handled``).
    """

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


# Exceptions whose text memstream or the transport wrote, never a record's content.
_OWN_TEXT = ("memstream.", "aiokafka.", "kafka.", "asyncio.")
# Built-in errors raised about the program's state, not about a value (ValueError, TypeError,
# KeyError and UnicodeError quote the value they refused: their text is left out).
_PLAIN_TEXT = (OSError, TimeoutError, RuntimeError, AssertionError)


def _path(error: Mapping[str, Any]) -> str:
    """A validation error's location with the names a caller chose left out: a key that is
    no declared field (``extra_forbidden``), a key of a mapping or anything that is not an
    identifier becomes ``*`` (a model's or a client's text can be a key)."""
    loc = list(error.get("loc", ()))
    if error.get("type") == "extra_forbidden" and loc:
        loc[-1] = "*"
    parts = [str(p) if isinstance(p, int) or (isinstance(p, str) and p.isidentifier()
                                                and len(p) <= 40) else "*" for p in loc]
    return ".".join(parts) or "(root)"


def describe(exc: BaseException, limit: int = 500) -> str:
    """``exc`` as text fit for a log line or an unsealed record: never a value it carries.

    A pydantic ``ValidationError`` gives its field paths and error kinds (its ``str`` holds
    the input: a user's text); an HTTP error of a client (``status_code``) its status; an
    error memstream raised on purpose, a transport, OS or runtime error its message (written
    about the program, not a value); anything else its type only (a ``ValueError`` quotes
    the value it refused).
    """
    name = type(exc).__name__
    errors = getattr(exc, "errors", None)
    if callable(errors) and hasattr(exc, "error_count"):  # pydantic's ValidationError
        try:
            found = errors(include_input=False, include_url=False, include_context=False)
        except TypeError:
            found = []
        where = sorted({f"{_path(e)}: {e.get('type')}" for e in found})
        text = f"{name}: {exc.error_count()} error(s): {'; '.join(where[:5])}"
    elif isinstance(status := getattr(exc, "status_code", None), int):
        text = f"{name}: HTTP {status}"
    elif isinstance(exc, _PLAIN_TEXT) or type(exc).__module__.startswith(_OWN_TEXT):
        text = f"{name}: {exc}" if str(exc) else name
    else:
        text = name
    return text[:limit]
