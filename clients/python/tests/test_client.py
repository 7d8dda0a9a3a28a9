"""The Python client against a transport callable and a fake producer: requests, parsing,
errors and produced records, the same test bodies for the sync and the async client."""

from __future__ import annotations

import asyncio
import inspect
import json
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from aiokafka.errors import KafkaConnectionError
from pydantic import ValidationError

from memstream.client import (
    AsyncMemoryClient,
    ConnectError,
    KafkaConnection,
    MemoryClient,
    MemstreamAPIError,
    MemstreamConnectionError,
    Request,
    Response,
    api_error,
)
from memstream.contract.exceptions import MemstreamError
from memstream.contract.http_api import paths
from memstream.contract.http_api.api import ContextResponse, MemoryOut, SearchResponse, ToolResult
from memstream.contract.records import ChatMessage, SessionEvent

pytestmark = pytest.mark.unit

BASE = "http://memstream.test"
KEY = "sk-tenant-acme-7f3a9c"
TENANT, USER = "acme", "u1"
NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def at(route: str) -> str:
    """A route of :mod:`memstream.contract.http_api.paths` for the test's tenant and user."""
    return paths.fill(route, tenant=TENANT, user=USER)


def memory(memory_id: str, content: str = "Lives in Munich", **extra: Any) -> dict[str, Any]:
    return {"memory_id": memory_id, "version": 1, "type": "semantic", "content": content,
            "importance": 7, "status": "active", "scope": "user", "created_at": 1.0e9,
            "updated_at": 1.0e9, "valid_from": 1.0e9, **extra}


def scored(memory_id: str, content: str, score: float) -> dict[str, Any]:
    return memory(memory_id, content, score=score, recency=0.9, importance_score=0.7,
                  relevance=0.8)


class Server:
    """Answers requests with the given responses, in order, and keeps the requests."""

    def __init__(self, *responses: Response | Exception) -> None:
        self.responses = list(responses)
        self.requests: list[Request] = []

    def __call__(self, request: Request) -> Response:
        self.requests.append(request)
        reply = self.responses.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return reply

    def only(self) -> Request:
        assert len(self.requests) == 1
        return self.requests[0]


def sent(request: Request, method: str, path: str) -> Any:
    """Checks method, path and key of one request; returns its JSON body (None if empty)."""
    assert (request.method, request.path) == (method, path)
    assert request.header("authorization") == f"Bearer {KEY}"
    return json.loads(request.content) if request.content else None


class FakeKafka:
    """A producer factory whose producers record what they are asked to do."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.fail = fail
        self.created: list[str] = []
        self.events: list[str] = []
        self.records: list[tuple[str, bytes, bytes]] = []
        self.threads: set[str] = set()

    def __call__(self, connection: KafkaConnection) -> FakeProducer:
        self.created.append(connection.bootstrap_servers)
        return FakeProducer(self)


class FakeProducer:
    def __init__(self, kafka: FakeKafka) -> None:
        self.kafka = kafka

    async def start(self) -> None:
        self.kafka.events.append("start")

    async def send(self, topic: str, value: bytes, key: bytes) -> asyncio.Future[None]:
        self.kafka.threads.add(threading.current_thread().name)
        if self.kafka.fail is not None:
            raise self.kafka.fail
        self.kafka.records.append((topic, key, value))
        done = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    async def stop(self) -> None:
        self.kafka.events.append("stop")


class Client:
    """One interface over both clients: async calls run on a private loop, so every test
    body below runs once against MemoryClient and once against AsyncMemoryClient."""

    def __init__(self, client: MemoryClient | AsyncMemoryClient) -> None:
        self.client = client
        self.loop = asyncio.new_event_loop()

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self.client, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            result = method(*args, **kwargs)
            return self.loop.run_until_complete(result) if inspect.isawaitable(result) else result

        return call

    def shut(self) -> None:
        """``close()`` or ``aclose()``."""
        if isinstance(self.client, AsyncMemoryClient):
            self.loop.run_until_complete(self.client.aclose())
        else:
            self.client.close()


@pytest.fixture(params=["sync", "async"])
def make(request: pytest.FixtureRequest) -> Iterator[Callable[..., Client]]:
    made: list[Client] = []

    def build(server: Server | None = None, **kwargs: Any) -> Client:
        handler = server or Server()
        cls = MemoryClient if request.param == "sync" else AsyncMemoryClient
        kwargs.setdefault("clock", lambda: NOW)
        made.append(Client(cls(BASE, KEY, tenant_id=TENANT, transport=handler, **kwargs)))
        return made[-1]

    yield build
    for client in made:
        client.shut()
        client.loop.close()


# --- HTTP: requests and typed answers --------------------------------------------------------


def test_search_sends_only_what_was_set_and_returns_typed_memories(make):
    server = Server(Response(200, json={
        "query_id": "q1", "memories": [scored("m1", "Lives in Munich", 0.8)],
        "procedural": [memory("p1", "Answer briefly", type="procedural")]}))
    result = make(server).search("where do I live", user_id=USER, limit=3,
                                 include_global=False)
    body = sent(server.only(), "POST", at(paths.SEARCH))
    assert body == {"query": "where do I live", "k": 3, "include_global": False}
    assert isinstance(result, SearchResponse) and result.query_id == "q1"
    assert [(m.memory_id, m.content, m.score) for m in result.memories] == [
        ("m1", "Lives in Munich", 0.8)]
    assert [m.memory_id for m in result.procedural] == ["p1"]


@pytest.mark.parametrize(("call", "error"), [
    (lambda c: c.search("q", user_id=USER, colour="blue"), ValidationError),  # unknown option
    (lambda c: c.search("", user_id=USER), ValidationError),
    (lambda c: c.search("q", user_id=USER, limit=0), ValidationError),
    (lambda c: c.search("q", user_id="a/../b"), ValueError),  # never reaches a URL path
    (lambda c: c.get_all(user_id=USER, page_size=0), ValueError),
    (lambda c: c.feedback("", "m1", user_id=USER, useful=True), ValidationError),
])
def test_invalid_calls_send_nothing(make, call, error):
    server = Server()
    with pytest.raises(error):
        call(make(server))
    assert server.requests == []


def test_context_posts_the_budget_and_parses_every_layer(make):
    server = Server(Response(200, json={
        "query_id": "q2", "memories": [scored("m1", "Vegetarian", 0.7)], "procedural": [],
        "core": {"persona": "Likes short answers"},
        "window": [{"seq": 4, "message_id": "x4", "role": "user", "content": "hi",
                    "ts": "2026-03-01T12:00:00Z"}],
        "prompt_block": "## Memories\n- Vegetarian", "truncated": True}))
    result = make(server).context("dinner ideas", user_id=USER, session_id="s1",
                                  budget_tokens=500)
    body = sent(server.only(), "POST", at(paths.CONTEXT))
    assert body == {"query": "dinner ideas", "session_id": "s1", "budget_tokens": 500}
    assert isinstance(result, ContextResponse)
    assert (result.core, result.truncated, result.window[0].seq) == (
        {"persona": "Likes short answers"}, True, 4)
    assert result.prompt_block.endswith("Vegetarian")


def test_get_all_follows_the_cursor_through_every_page(make):
    server = Server(
        Response(200, json={"memories": [memory("m1"), memory("m2")],
                                  "next_cursor": "c-2"}),
        Response(200, json={"memories": [memory("m3")], "next_cursor": None}))
    result = make(server).get_all(user_id=USER, status="archived", page_size=2)
    first, second = server.requests
    for request in (first, second):
        assert sent(request, "GET", at(paths.MEMORIES)) is None
    assert dict(first.params) == {"limit": "2", "status": "archived"}
    assert dict(second.params) == {"limit": "2", "status": "archived", "cursor": "c-2"}
    assert all(isinstance(m, MemoryOut) for m in result)
    assert [m.memory_id for m in result] == ["m1", "m2", "m3"]


def test_get_all_stops_on_a_repeated_cursor(make):
    page = {"memories": [memory("m1")], "next_cursor": "same"}
    server = Server(Response(200, json=page), Response(200, json=page))
    with pytest.raises(MemstreamError, match="repeated the cursor"):
        make(server).get_all(user_id=USER)
    assert len(server.requests) == 2


TOOL = {"type": "function", "function": {"name": "memory_search", "parameters": {}}}


@pytest.mark.parametrize("answer", [[TOOL], {"tools": [TOOL]}])
def test_tools_returns_the_openai_definitions(make, answer):
    server = Server(Response(200, json=answer))
    assert make(server).tools() == [TOOL]
    assert sent(server.only(), "GET", paths.TOOLS) is None


@pytest.mark.parametrize("arguments", [{"query": "coffee", "k": None}, '{"query": "coffee"}'])
def test_execute_tool_passes_the_model_arguments_through(make, arguments):
    server = Server(Response(200, json={
        "tool_call_id": "call_1", "name": "memory_search", "status": "ok",
        "content": "- Drinks oat flat whites", "data": {"hits": 1}}))
    result = make(server).execute_tool("memory_search", arguments, user_id=USER,
                                       tool_call_id="call_1")
    body = sent(server.only(), "POST", at(paths.EXECUTE_TOOL))
    assert body == {"name": "memory_search", "arguments": arguments, "tool_call_id": "call_1"}
    assert isinstance(result, ToolResult)
    assert (result.status, result.content, result.data) == (
        "ok", "- Drinks oat flat whites", {"hits": 1})


def test_feedback_posts_the_verdict(make):
    server = Server(Response(202, json={"accepted": True}))
    assert make(server).feedback("q1", "m7", user_id=USER, useful=False) is None
    body = sent(server.only(), "POST", at(paths.FEEDBACK))
    assert body == {"query_id": "q1", "memory_id": "m7", "useful": False}


# --- errors and the key ------------------------------------------------------------------------


def test_a_json_error_body_becomes_its_code(make):
    server = Server(Response(401, json={
        "error": {"code": "unauthorized", "message": "unknown or revoked key"}}))
    with pytest.raises(MemstreamAPIError) as caught:
        make(server).search("q", user_id=USER)
    err = caught.value
    assert (err.status, err.code, err.message) == (401, "unauthorized", "unknown or revoked key")
    assert KEY not in str(err)


@pytest.mark.parametrize(("status", "body", "code", "message"), [
    (500, b"<html>Internal Server Error</html>", "internal", "<html>Internal Server Error</html>"),
    (502, b"", "http_error", "HTTP 502"),
    (403, b'{"error": {"code": "brand_new", "message": "m"}}', "forbidden", None),
])
def test_a_non_contract_error_body_is_mapped_by_status(make, status, body, code, message):
    server = Server(Response(status, content=body))
    with pytest.raises(MemstreamAPIError) as caught:
        make(server).tools()
    assert (caught.value.status, caught.value.code) == (status, code)
    if message is not None:
        assert caught.value.message == message


def test_an_error_echoing_the_key_is_redacted(make):
    server = Server(Response(400, json={
        "error": {"code": "bad_request", "message": f"bad header Bearer {KEY}"}}))
    with pytest.raises(MemstreamAPIError) as caught:
        make(server).tools()
    assert KEY not in str(caught.value) and "***" in caught.value.message


def test_a_long_error_page_is_cut():
    err = api_error(500, b"x" * 10_000)
    assert err.code == "internal" and 0 < len(err.message) < 1_000


def test_an_unreachable_api_is_a_connection_error(make):
    server = Server(ConnectError("connection refused"))
    with pytest.raises(MemstreamConnectionError, match="unreachable"):
        make(server).tools()


def test_an_unexpected_success_body_is_a_memstream_error(make):
    server = Server(Response(200, json={"memories": "not a list"}))
    with pytest.raises(MemstreamError, match="SearchResponse"):
        make(server).search("q", user_id=USER)


def test_the_key_is_never_in_repr(make):
    client = make()
    assert KEY not in repr(client.client) and TENANT in repr(client.client)
    assert KEY not in repr(vars(client.client))


# --- Kafka: add and end_session ---------------------------------------------------------------


def test_add_produces_every_message_in_order_keyed_by_user(make):
    kafka = FakeKafka()
    client = make(bootstrap_servers="broker:9092", topic_prefix="ms", producer_factory=kafka)
    ids = client.add([
        {"role": "user", "content": "I moved to Munich", "message_id": "given-1",
         "name": "ignored OpenAI field", "tenant_id": "other", "ts": None},
        {"role": "assistant", "content": "Noted!", "ts": "2026-02-01T08:00:00Z"},
        ChatMessage(tenant_id=TENANT, user_id=USER, session_id="s1", message_id="cm-3",
                    role="user", content="Vegetarian, too", ts=NOW, metadata={"lang": "en"}),
    ], user_id=USER, session_id="s1")
    assert kafka.created == ["broker:9092"]
    assert [(topic, key) for topic, key, _ in kafka.records] == [("ms.messages", b"acme/u1")] * 3
    produced = [ChatMessage.model_validate_json(value) for _, _, value in kafka.records]
    assert [m.message_id for m in produced] == ids
    assert ids[0] == "given-1" and ids[2] == "cm-3"
    assert len(ids[1]) == 32 and int(ids[1], 16) >= 0  # uuid4 hex
    assert [(m.role, m.content) for m in produced] == [
        ("user", "I moved to Munich"), ("assistant", "Noted!"), ("user", "Vegetarian, too")]
    assert {(m.tenant_id, m.user_id, m.session_id) for m in produced} == {(TENANT, USER, "s1")}
    assert [m.ts for m in produced] == [NOW, datetime(2026, 2, 1, 8, tzinfo=UTC), NOW]
    assert produced[2].metadata == {"lang": "en"}


def test_add_a_string_is_one_message_with_the_role_and_fresh_ids(make):
    kafka = FakeKafka()
    client = make(bootstrap_servers="b:1", producer_factory=kafka)
    first = client.add("Call me Sam", user_id=USER, session_id="s1", role="user")
    second = client.add("Call me Sam", user_id=USER, session_id="s1")
    produced = [ChatMessage.model_validate_json(value) for _, _, value in kafka.records]
    assert [(m.role, m.content) for m in produced] == [("user", "Call me Sam")] * 2
    assert len(first) == len(second) == 1 and first != second
    assert kafka.created == ["b:1"] and kafka.events == ["start"]  # one producer, reused


@pytest.mark.parametrize("messages", [
    [{"role": "user", "content": "fine"}, {"role": "robot", "content": "bad role"}],
    [{"role": "user", "content": "fine"}, {"role": "user", "content": "   "}],
    [{"role": "user", "content": "a", "message_id": "m1"},
     {"role": "user", "content": "b", "message_id": "m1"}],
    [{"role": "user", "content": "fine"}, {"role": "user", "content": ["parts"]}],
    [{"role": "user", "content": "fine"}, "not a mapping"],
    [ChatMessage(tenant_id="other", user_id=USER, session_id="s1", message_id="x",
                 role="user", content="c", ts=NOW)],
    [],
])
def test_add_validates_everything_before_producing_anything(make, messages):
    kafka = FakeKafka()
    client = make(bootstrap_servers="b:1", producer_factory=kafka)
    with pytest.raises(ValueError):
        client.add(messages, user_id=USER, session_id="s1")
    assert kafka.records == [] and kafka.created == []


def accepted(*ids: str, session: str = "s1") -> Response:
    return Response(202, json={"messages": [
        {"message_id": i, "session_id": session, "topic": "memstream.messages",
         "partition": 1, "offset": n} for n, i in enumerate(ids)]})


def test_add_without_kafka_settings_posts_the_messages_over_http(make):
    kafka = FakeKafka()
    server = Server(accepted("given-1", "x"))
    client = make(server, producer_factory=kafka)
    ids = client.add([{"role": "user", "content": "I moved to Munich", "message_id": "given-1"},
                      {"role": "assistant", "content": "Noted!", "metadata": {"lang": "en"}}],
                     user_id=USER, session_id="s1")
    request = server.only()
    body = sent(request, "POST", at(paths.MESSAGES))
    assert ids == ["given-1", "x"]  # the ids the worker took them with
    assert body["session_id"] == "s1"
    assert [(m["role"], m["content"]) for m in body["messages"]] == [
        ("user", "I moved to Munich"), ("assistant", "Noted!")]
    assert body["messages"][0]["message_id"] == "given-1"
    assert len(body["messages"][1]["message_id"]) == 32  # made by the client, sent
    assert body["messages"][1]["metadata"] == {"lang": "en"}
    assert {datetime.fromisoformat(m["ts"]) for m in body["messages"]} == {NOW}
    assert len(request.header("Idempotency-Key")) == 32
    assert kafka.created == []  # no producer without Kafka settings


def test_add_over_http_sends_more_messages_than_a_dedup_window_in_several_requests(make):
    """A request of more messages than ingest remembers ids per session is refused (a retry
    of it could be taken twice), so the client splits a long add, each part with its key."""
    texts = [f"turn {i}" for i in range(70)]
    ids = [f"m{i}" for i in range(70)]
    server = Server(accepted(*ids[:64]), accepted(*ids[64:]))
    client = make(server)
    got = client.add([{"role": "user", "content": t, "message_id": i}
                      for t, i in zip(texts, ids, strict=True)], user_id=USER, session_id="s1")
    assert got == ids
    bodies = [sent(r, "POST", at(paths.MESSAGES)) for r in server.requests]
    assert [len(b["messages"]) for b in bodies] == [64, 6]
    assert [m["content"] for b in bodies for m in b["messages"]] == texts
    keys = {r.headers["Idempotency-Key"] for r in server.requests}
    assert len(keys) == 2


def test_add_over_http_validates_before_sending_and_raises_the_apis_refusal(make):
    server = Server(Response(403, json={"error": {
        "code": "forbidden", "message": "this key does not open this tenant"}}))
    client = make(server)
    with pytest.raises(ValueError):
        client.add([{"role": "robot", "content": "x"}], user_id=USER, session_id="s1")
    assert server.requests == []
    with pytest.raises(MemstreamAPIError) as refused:
        client.add("hello", user_id=USER, session_id="s1")
    assert refused.value.status == 403


def test_end_session_without_kafka_settings_posts_the_end(make):
    server = Server(Response(202, json={
        "session_id": "s9", "topic": "memstream.session-events", "partition": 0,
        "offset": 4}))
    make(server).end_session(user_id=USER, session_id="s9")
    request = server.only()
    assert sent(request, "POST", paths.fill(paths.SESSION_END, tenant=TENANT, user=USER,
                                            session_id="s9")) is None
    assert request.header("Idempotency-Key")


def test_with_kafka_settings_add_never_uses_http(make):
    kafka, server = FakeKafka(), Server()
    client = make(server, bootstrap_servers="b:1", producer_factory=kafka)
    client.add("hello", user_id=USER, session_id="s1")
    client.end_session(user_id=USER, session_id="s1")
    assert server.requests == [] and len(kafka.records) == 2


def test_a_failed_delivery_is_a_connection_error(make):
    kafka = FakeKafka(fail=KafkaConnectionError("broker down"))
    client = make(bootstrap_servers="b:1", producer_factory=kafka)
    with pytest.raises(MemstreamConnectionError, match="not confirmed"):
        client.add("hello", user_id=USER, session_id="s1")


def test_end_session_produces_a_session_event(make):
    kafka = FakeKafka()
    client = make(bootstrap_servers="b:1", producer_factory=kafka)
    client.end_session(user_id=USER, session_id="s9")
    [(topic, key, value)] = kafka.records
    event = SessionEvent.model_validate_json(value)
    assert (topic, key) == ("memstream.session-events", b"acme/u1")
    assert (event.tenant_id, event.user_id, event.session_id, event.kind, event.ts) == (
        TENANT, USER, "s9", "ended", NOW)


def test_closing_stops_the_producer_and_the_sync_clients_thread(make):
    kafka = FakeKafka()
    client = make(bootstrap_servers="b:1", producer_factory=kafka)
    client.add("hello", user_id=USER, session_id="s1")
    sync = isinstance(client.client, MemoryClient)
    assert kafka.threads == ({"memstream-client-kafka"} if sync else {"MainThread"})
    client.shut()
    client.shut()  # idempotent
    assert kafka.events == ["start", "stop"]
    assert "memstream-client-kafka" not in {t.name for t in threading.enumerate()}


def test_the_sync_client_works_as_a_context_manager():
    kafka = FakeKafka()
    server = Server(Response(200, json=[TOOL]))
    with MemoryClient(BASE, KEY, tenant_id=TENANT, bootstrap_servers="b:1",
                      transport=server, producer_factory=kafka) as client:
        client.add("hi", user_id=USER, session_id="s1")
        assert client.tools() == [TOOL]
    assert kafka.events == ["start", "stop"]


def test_the_async_client_works_as_a_context_manager():
    kafka = FakeKafka()
    server = Server(Response(200, json=[TOOL]))

    async def use() -> None:
        async with AsyncMemoryClient(BASE, KEY, tenant_id=TENANT, bootstrap_servers="b:1",
                                     transport=server, producer_factory=kafka) as client:
            await client.add("hi", user_id=USER, session_id="s1")
            assert await client.tools() == [TOOL]

    asyncio.run(use())
    assert kafka.events == ["start", "stop"]


@pytest.mark.parametrize("tenant", ["", "a/b", "has space"])
def test_a_bad_tenant_or_empty_key_is_refused_at_construction(tenant):
    with pytest.raises(ValueError):
        MemoryClient(BASE, KEY, tenant_id=tenant)
    with pytest.raises(ValueError):
        AsyncMemoryClient(BASE, "", tenant_id=TENANT)
