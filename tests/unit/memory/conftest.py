"""Fixtures shared by the memory tests."""

from __future__ import annotations

import pytest

from memstream.memory.embedding import HashingEmbedder
from memstream.memory.store.edge import EdgeStore
from memstream.memory.store.server import ServerStore


@pytest.fixture(params=["edge", "server"])
def store(request, tmp_path):
    """An empty store of each backend (Edge on disk, server in memory); modules that need
    another store define their own ``store``."""
    dim = HashingEmbedder().dim
    if request.param == "edge":
        s = EdgeStore(tmp_path / "edge", dim)
    else:
        from qdrant_client import QdrantClient

        s = ServerStore("memories", dim, client=QdrantClient(":memory:"))
    yield s
    s.close()
