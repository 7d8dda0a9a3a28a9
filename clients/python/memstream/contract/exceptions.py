"""The root of every error memstream raises on purpose, the server's and the client's."""

from __future__ import annotations


class MemstreamError(Exception):
    """Root of every error memstream raises on purpose."""
