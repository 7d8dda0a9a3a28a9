"""``memstream search`` asks the worker's API and falls back to the store when no worker
answers: the client's connection error (not a transport library's) is that signal."""

from __future__ import annotations

import socket

import pytest

from memstream.core.settings import Settings
from memstream.ops.search import search_http

pytestmark = pytest.mark.unit


def test_no_worker_answering_means_the_local_store():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    found = search_http(Settings(), "acme", "ana", "tea", 3,
                        base_url=f"http://127.0.0.1:{port}", api_key="k")
    assert found is None
