"""``GET /v1/live``: 200 while the process and its event loop run, ready or not; the
startup probes answer it (and a 503 ``/v1/health``) before the HTTP API serves."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request

import pytest

from memstream.contract.http_api import paths
from memstream.core.settings import Settings
from memstream.web import probes
from tests.unit.builders import FakeBackend, serve

pytestmark = pytest.mark.unit


async def test_live_answers_without_a_key_while_the_worker_is_not_ready():
    backend = FakeBackend()
    backend.is_ready = False
    async with serve(backend) as (client, _):
        resp = await client.get(paths.LIVE)
        assert (resp.status, await resp.json()) == (200, {"status": "alive"})
        resp = await client.get(paths.HEALTH)
        assert resp.status == 503
    assert backend.calls == []


def get(port: int, path: str) -> tuple[int, dict]:
    import json

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        body = err.read()
        return err.code, json.loads(body) if err.headers.get_content_type() == \
            "application/json" else {"text": body.decode()}


def free() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_startup_probes_serve_until_handed_over():
    port = free()
    settings = Settings(web_enabled=True, web_port=port)
    started = probes.start_early(settings)
    try:
        assert started is not None and started.serving
        assert get(port, paths.LIVE) == (200, {"status": "alive"})
        status, body = get(port, paths.HEALTH)
        assert (status, body["status"], body["waiting"]) == (503, "starting", ["broker"])
        probes.waiting_for("worker")
        assert get(port, paths.HEALTH)[1]["waiting"] == ["worker"]
        assert get(port, paths.SEARCH)[0] == 404  # nothing else
    finally:
        probes.hand_over()
    with socket.socket() as s:  # the port is free for the API (which reuses addresses too)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen()
    probes.hand_over()  # idempotent


def test_no_startup_probes_without_the_api():
    assert probes.start_early(Settings(web_enabled=False)) is None


def test_a_port_taken_is_not_fatal():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        p = probes.StartupProbes("127.0.0.1", taken.getsockname()[1]).start()
        assert not p.serving
        p.stop()
