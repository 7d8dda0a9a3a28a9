"""Several base URLs: a worker that cannot be reached (no connection) or answers 502/503/504
is skipped for the next one, and the one that answered is asked first next time. A request
that may have reached a worker (a read timeout) is never sent to another."""

from __future__ import annotations

import asyncio
import json

import pytest

from memstream.client import (
    AsyncMemoryClient,
    ConnectError,
    MemoryClient,
    Request,
    Response,
    TransportError,
)
from memstream.client._errors import MemstreamAPIError, MemstreamConnectionError

pytestmark = pytest.mark.unit
URLS = ["http://w1:6066", "http://w2:6066", "http://w3:6066"]
PAGE = {"memories": [], "next_cursor": None}


class Workers:
    """Each host answers as told: a status code, or an exception to raise."""

    def __init__(self, **behaviour: object) -> None:
        self.behaviour = behaviour
        self.asked: list[str] = []

    def __call__(self, request: Request) -> Response:
        host = request.host
        self.asked.append(host)
        how = self.behaviour.get(host, 200)
        if isinstance(how, Exception):
            raise how
        body = PAGE if how == 200 else {"error": {"code": "unavailable", "message": "x"}}
        return Response(int(how), content=json.dumps(body).encode(),  # type: ignore
                              headers={"Content-Type": "application/json"})


def client(workers: Workers, urls: list[str] = URLS) -> MemoryClient:
    return MemoryClient(urls, "key", tenant_id="acme", transport=workers)


def test_an_unreachable_worker_is_skipped_and_the_answering_one_is_asked_first_after():
    workers = Workers(w1=ConnectError("refused"))
    with client(workers) as c:
        assert c.get_all(user_id="ana") == []
        assert workers.asked == ["w1", "w2"]
        c.get_all(user_id="ana")
    assert workers.asked == ["w1", "w2", "w2"]


def test_a_503_goes_to_the_next_worker():
    workers = Workers(w1=503, w2=502)
    with client(workers) as c:
        assert c.get_all(user_id="ana") == []
    assert workers.asked == ["w1", "w2", "w3"]


def test_when_every_worker_fails_the_last_answer_or_error_is_raised():
    workers = Workers(w1=503, w2=503, w3=503)
    with client(workers) as c, pytest.raises(MemstreamAPIError) as err:
        c.get_all(user_id="ana")
    assert err.value.status == 503 and workers.asked == ["w1", "w2", "w3"]
    down = Workers(**{h: ConnectError("refused") for h in ("w1", "w2", "w3")})
    with client(down) as c, pytest.raises(MemstreamConnectionError):
        c.get_all(user_id="ana")
    assert down.asked == ["w1", "w2", "w3"]


def test_a_read_timeout_is_not_sent_to_another_worker():
    workers = Workers(w1=TransportError("slow"))
    with client(workers) as c, pytest.raises(MemstreamConnectionError):
        c.get_all(user_id="ana")
    assert workers.asked == ["w1"]


def test_a_404_is_an_answer_not_a_reason_to_fail_over():
    workers = Workers(w1=404)
    with client(workers) as c, pytest.raises(MemstreamAPIError) as err:
        c.get_all(user_id="ana")
    assert err.value.status == 404 and workers.asked == ["w1"]


def test_the_async_client_fails_over_the_same_way():
    workers = Workers(w1=ConnectError("refused"), w2=503)

    async def use() -> None:
        async with AsyncMemoryClient(URLS, "key", tenant_id="acme", transport=workers) as c:
            assert await c.get_all(user_id="ana") == []
            assert await c.get_all(user_id="ana") == []

    asyncio.run(use())
    assert workers.asked == ["w1", "w2", "w3", "w3"]


def test_one_url_as_before_and_no_url_refused():
    workers = Workers()
    with client(workers, ["http://w1:6066/"]) as c:
        c.get_all(user_id="ana")
        assert c.base_url == "http://w1:6066"
    assert workers.asked == ["w1"]
    with pytest.raises(ValueError):
        MemoryClient([], "key", tenant_id="acme")


def test_a_write_keeps_its_idempotency_key_on_every_worker_it_is_tried_on():
    keys: list[tuple[str, str | None]] = []

    def answer(request: Request) -> Response:
        keys.append((request.host, request.header("Idempotency-Key")))
        if request.host == "w1":
            return Response(503, json={"error": {"code": "unavailable", "message": "x"}})
        return Response(200, json={"tool_call_id": None, "name": "memory_insert",
                                         "status": "ok", "content": "done"})

    with MemoryClient(URLS, "key", tenant_id="acme",
                      transport=answer) as c:
        c.execute_tool("memory_insert", {"content": "tea"}, user_id="ana")
        c.execute_tool("memory_insert", {"content": "tea"}, user_id="ana")
    (h1, k1), (h2, k2), (h3, k3) = keys
    assert (h1, h2, h3) == ("w1", "w2", "w2")
    assert k1 and k1 == k2  # the failover sent the same key
    assert k3 and k3 != k1  # a new call, a new key
