"""The clients over real sockets: urllib3 against a local stub HTTP server (the standard
library's), the sync client directly and the async one through its worker threads. A port
nobody listens on is a refused connection (failover); a stub that answers too late is a
read timeout (no failover: the worker may have taken the request)."""

from __future__ import annotations

import asyncio
import contextvars
import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from memstream.client import (
    AsyncMemoryClient,
    MemoryClient,
    MemstreamAPIError,
    MemstreamConnectionError,
    Request,
    Response,
    __version__,
)
from memstream.contract.http_api import paths

pytestmark = pytest.mark.unit
KEY = "sk-stub-key"
PAGE = {"memories": [], "next_cursor": None}


class Stub(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.seen: list[dict[str, Any]] = []
        self.status = 200
        self.answer: Any = PAGE
        self.hold = threading.Event()  # set: the stub answers; clear: it waits (a timeout)
        self.hold.set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(BaseHTTPRequestHandler):
    server: Stub

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        self.server.seen.append({"method": self.command, "path": self.path,
                                 "headers": dict(self.headers),
                                 "body": json.loads(body) if body else None})
        self.server.hold.wait(5)
        data = json.dumps(self.server.answer).encode()
        self.send_response(self.server.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = _answer

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass


@pytest.fixture
def stub() -> Iterator[Stub]:
    server = Stub()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.hold.set()
    server.shutdown()
    server.server_close()


def closed_port() -> str:
    """A URL nothing listens on (the port was free a moment ago)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def test_the_sync_client_sends_key_agent_query_and_json_and_parses_the_answer(stub):
    with MemoryClient(stub.url, KEY, tenant_id="acme") as client:
        assert client.get_all(user_id="ana", status="active", page_size=5) == []
        stub.answer = {"query_id": "q1", "memories": [], "items": []}
        assert client.search("tea", user_id="ana").query_id == "q1"
    get, post = stub.seen
    assert get["method"] == "GET"
    assert get["path"] == paths.fill(paths.MEMORIES, tenant="acme", user="ana") + \
        "?limit=5&status=active"
    assert get["headers"]["Authorization"] == f"Bearer {KEY}"
    assert get["headers"]["User-Agent"] == f"memstream-client/{__version__}"
    assert post["body"] == {"query": "tea"}
    assert post["headers"]["Content-Type"] == "application/json"


def test_the_async_client_goes_through_the_same_transport(stub):
    stub.answer = {"messages": [{"message_id": "m1", "session_id": "s1", "topic": "t",
                                 "partition": 0, "offset": 3}]}

    async def use() -> list[str]:
        async with AsyncMemoryClient(stub.url, KEY, tenant_id="acme") as client:
            return await client.add([{"content": "hi", "message_id": "m1"}],
                                    user_id="ana", session_id="s1")

    assert asyncio.run(use()) == ["m1"]
    [post] = stub.seen
    assert post["headers"]["Idempotency-Key"]
    assert post["body"]["messages"][0]["message_id"] == "m1"


def test_an_error_answer_is_the_api_error_with_its_code(stub):
    stub.status = 403
    stub.answer = {"error": {"code": "forbidden", "message": "another tenant"}}
    with MemoryClient(stub.url, KEY, tenant_id="acme") as client, \
            pytest.raises(MemstreamAPIError) as err:
        client.get_all(user_id="ana")
    assert (err.value.status, err.value.code) == (403, "forbidden")


def test_a_refused_connection_fails_over_to_the_next_worker(stub):
    with MemoryClient([closed_port(), stub.url], KEY, tenant_id="acme") as client:
        assert client.get_all(user_id="ana") == []
        assert client._current == 1  # the one that answered is asked first next time
    with MemoryClient(closed_port(), KEY, tenant_id="acme") as client, \
            pytest.raises(MemstreamConnectionError, match="unreachable"):
        client.get_all(user_id="ana")


def test_a_read_timeout_is_a_connection_error_and_no_other_worker_is_asked(stub):
    other = Stub()  # would answer at once, if it were asked
    threading.Thread(target=other.serve_forever, daemon=True).start()
    stub.hold.clear()
    try:
        with MemoryClient([stub.url, other.url], KEY, tenant_id="acme",
                          timeout=0.3) as client, pytest.raises(MemstreamConnectionError):
            client.get_all(user_id="ana")
        assert len(stub.seen) == 1 and other.seen == []
    finally:
        stub.hold.set()
        other.shutdown()
        other.server_close()


def test_one_client_serves_many_threads_at_once(stub):
    errors: list[BaseException] = []
    with MemoryClient(stub.url, KEY, tenant_id="acme") as client:
        def call() -> None:
            try:
                for _ in range(5):
                    client.get_all(user_id="ana")
            except BaseException as exc:  # collected, asserted below
                errors.append(exc)

        threads = [threading.Thread(target=call) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == [] and len(stub.seen) == 40


REQUEST_TAG: contextvars.ContextVar[str] = contextvars.ContextVar("request_tag", default="")


def test_the_async_client_runs_many_requests_at_once_with_the_callers_context():
    """20 requests under way together (more than the loop's default executor has threads on
    a small machine), each seeing the context variables of the task that made it."""
    together = threading.Barrier(20, timeout=10)
    tags: list[str] = []

    def transport(request: Request) -> Response:
        together.wait()  # every request waits until all 20 are in flight
        tags.append(REQUEST_TAG.get())
        return Response(200, json=PAGE)

    async def one(client: AsyncMemoryClient, n: int) -> None:
        REQUEST_TAG.set(f"task-{n}")
        assert await client.get_all(user_id="ana") == []

    async def use() -> None:
        async with AsyncMemoryClient("http://w", KEY, tenant_id="acme",
                                     transport=transport) as client:
            await asyncio.gather(*(one(client, n) for n in range(20)))

    asyncio.run(use())
    assert sorted(tags) == sorted(f"task-{n}" for n in range(20))


def test_a_proxy_of_the_environment_carries_the_requests_and_no_proxy_is_honoured(
        stub, monkeypatch):
    """HTTP_PROXY / NO_PROXY as httpx read them: the stub is the proxy here, so it is asked
    for the worker's absolute URL (a name that resolves nowhere: only the proxy reaches it)."""
    monkeypatch.setenv("HTTP_PROXY", stub.url)
    monkeypatch.delenv("http_proxy", raising=False)
    monkeypatch.setenv("NO_PROXY", "bypassed.invalid")
    monkeypatch.delenv("no_proxy", raising=False)
    with MemoryClient("http://worker.invalid:6066", KEY, tenant_id="acme") as client:
        assert client.get_all(user_id="ana") == []
    [seen] = stub.seen
    assert seen["path"].startswith("http://worker.invalid:6066/v1/tenants/acme/users/ana/")
    with MemoryClient("http://bypassed.invalid:6066", KEY, tenant_id="acme") as client, \
            pytest.raises(MemstreamConnectionError):
        client.get_all(user_id="ana")
    assert len(stub.seen) == 1  # not through the proxy
