"""The client's two errors, below memstream's root :class:`MemstreamError`."""

from __future__ import annotations

from memstream.contract.exceptions import MemstreamError


class MemstreamAPIError(MemstreamError):
    """The API answered with an error: HTTP ``status`` and its stable ``code``."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"HTTP {status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


class MemstreamConnectionError(MemstreamError):
    """The API or the broker could not be reached, or did not confirm a write in time.

    A write that failed this way may still have landed: repeat it with the same message ids.
    """
