"""The HTTP way in (memstream.web.http_ingest, .ingest_records, .backend_ingest): the real
route and the real record building and producing, over a fake producer; the records are
checked as the ingest stage reads them."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.errors import KafkaConnectionError

from memstream.contract.http_api import paths
from memstream.contract.http_api.api import ErrorCode
from memstream.contract.http_api.intake import (
    MAX_BATCH_MESSAGES,
    MessageIn,
    MessagesAccepted,
    MessagesRequest,
    SessionEndAccepted,
    SessionEndRequest,
)
from memstream.core.settings import Settings
from memstream.topics.codec import decode
from memstream.topics.registry import registry
from memstream.topics.schemas import ChatMessage, SessionEvent
from memstream.web import backend_ingest, ingest_records
from memstream.web.http import ROUTES
from memstream.web.http_base import ApiError
from memstream.web.openapi import openapi_document
from tests.unit.builders import ADMIN_KEY, FakeBackend, bearer, error_of, serve

pytestmark = pytest.mark.unit

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
SECRET_TEXT = "my IBAN is DE89 3704 0044"  # must never come back in an error
MESSAGES = paths.fill(paths.MESSAGES, tenant="acme", user="u1")


def end_path(session: str = "s1", tenant: str = "acme") -> str:
    return paths.fill(paths.SESSION_END, tenant=tenant, user="u1", session_id=session)


class FakeProducer:
    """An aiokafka producer that acknowledges at the next offset of each topic, or fails
    (``fail``), or never acknowledges (``hang``)."""

    def __init__(self, world: World) -> None:
        self.world = world

    async def start(self) -> None:
        self.world.started += 1
        if self.world.fail_start is not None:
            raise self.world.fail_start

    async def send(self, topic: str, key: bytes, value: bytes) -> asyncio.Future[Any]:
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self.world.hang:
            return done
        offset = sum(1 for t, _, _ in self.world.records if t == topic)
        self.world.records.append((topic, key, value))
        done.set_result(SimpleNamespace(topic=topic, partition=1, offset=offset))
        return done

    async def stop(self) -> None:
        self.world.stopped += 1


class World:
    def __init__(self) -> None:
        self.records: list[tuple[str, bytes, bytes]] = []
        self.started = self.stopped = 0
        self.fail_start: Exception | None = None
        self.hang = False


class ProducingBackend(FakeBackend):
    """The fake backend with the worker's real way in (``backend_ingest``) over a fake
    producer and a fake pipeline (settings, topics, clock)."""

    def __init__(self, world: World, timeout_s: float = 5.0, **settings: Any) -> None:
        super().__init__()
        s = Settings.model_construct(**{**Settings().model_dump(), **settings})
        self.p = SimpleNamespace(settings=s, topics=registry(s), clock=NOW.timestamp)
        self.producer = backend_ingest.IngestProducer(s, timeout_s, lambda _: FakeProducer(world))

    async def add_messages(self, tenant: str, user: str, req: MessagesRequest,
                           idempotency_key: str | None = None) -> MessagesAccepted:
        self._record("add_messages", tenant, user)
        return await backend_ingest.add_messages(self.p, self.producer, tenant, user, req,
                                                 idempotency_key)

    async def end_session(self, tenant: str, user: str, session: str,
                          req: SessionEndRequest) -> SessionEndAccepted:
        self._record("end_session", tenant, user, session)
        return await backend_ingest.end_session(self.p, self.producer, tenant, user, session,
                                                req)


def produced(world: World) -> list[ChatMessage]:
    """The records as the ingest stage decodes them (key included)."""
    return [decode(ChatMessage, value, key) for topic, key, value in world.records
            if topic.endswith(".messages")]


# --- the route, end to end over a fake producer ------------------------------------------
async def test_messages_are_produced_keyed_tenant_user_and_answered_202_with_offsets():
    world = World()
    body = {"session_id": "s1", "messages": [
        {"role": "user", "content": "I moved to Munich", "message_id": "given-1"},
        {"role": "assistant", "content": "Noted!", "metadata": {"lang": "en"},
         "ts": "2026-02-01T08:00:00+00:00", "session_id": "s2", "tenant_id": "acme"}]}
    async with serve(ProducingBackend(world)) as (client, _):
        resp = await client.post(MESSAGES, json=body, headers=bearer())
        assert resp.status == 202, await resp.text()
        got = MessagesAccepted.model_validate(await resp.json())
        assert resp.headers["Idempotency-Key"]
    msgs = produced(world)
    assert [(t, k) for t, k, _ in world.records] == [("memstream.messages", b"acme/u1")] * 2
    assert [(m.message_id, m.session_id, m.role, m.content) for m in msgs] == [
        ("given-1", "s1", "user", "I moved to Munich"),
        (msgs[1].message_id, "s2", "assistant", "Noted!")]
    assert msgs[1].message_id.startswith("m-") and msgs[1].metadata == {"lang": "en"}
    assert [m.ts for m in msgs] == [NOW, datetime(2026, 2, 1, 8, tzinfo=UTC)]
    assert [(a.message_id, a.session_id, a.topic, a.partition, a.offset)
            for a in got.messages] == [("given-1", "s1", "memstream.messages", 1, 0),
                                       (msgs[1].message_id, "s2", "memstream.messages", 1, 1)]


async def test_a_retry_with_the_same_idempotency_key_produces_the_same_message_ids():
    world = World()
    body = {"session_id": "s1", "messages": [{"role": "user", "content": "I like tea"},
                                             {"role": "user", "content": "I like tea"}]}
    async with serve(ProducingBackend(world)) as (client, _):
        for key in ("retry-1", "retry-1", "other-2"):
            resp = await client.post(MESSAGES, json=body,
                                     headers={**bearer(), "Idempotency-Key": key})
            assert resp.status == 202 and resp.headers["Idempotency-Key"] == key
    ids = [m.message_id for m in produced(world)]
    assert ids[0:2] == ids[2:4]  # the retry: the same ids, dropped by ingest as copies
    assert ids[0] != ids[1]  # two equal messages of one request are two messages
    assert not set(ids[4:]) & set(ids[:4])  # another key: other messages


async def test_a_session_end_is_produced_to_the_session_events_topic():
    world = World()
    async with serve(ProducingBackend(world)) as (client, _):
        resp = await client.post(end_path("s-9"), headers=bearer())
        assert resp.status == 202, await resp.text()
        answer = SessionEndAccepted.model_validate(await resp.json())
        with_ts = await client.post(end_path("s-9"), json={"ts": "2026-02-01T08:00:00Z"},
                                    headers=bearer())
        assert with_ts.status == 202
    [(topic, key, value), (_, _, later)] = world.records
    event = decode(SessionEvent, value, key)
    assert (topic, key) == ("memstream.session-events", b"acme/u1")
    assert (event.session_id, event.kind, event.ts) == ("s-9", "ended", NOW)
    assert decode(SessionEvent, later, key).ts == datetime(2026, 2, 1, 8, tzinfo=UTC)
    assert (answer.session_id, answer.topic, answer.offset) == (
        "s-9", "memstream.session-events", 0)


@pytest.mark.parametrize(("message", "status"), [
    ({"role": "robot", "content": SECRET_TEXT}, 400),
    ({"role": "user", "content": "   "}, 400),  # blank
    ({"role": "user", "content": SECRET_TEXT + "\x00"}, 400),
    ({"role": "user", "content": SECRET_TEXT, "tenant_id": "globex"}, 400),
    ({"role": "user", "content": SECRET_TEXT, "user_id": "u2"}, 400),
    ({"role": "user", "content": SECRET_TEXT, "message_id": "a/b"}, 400),
    ({"role": "user", "content": SECRET_TEXT, "ts": "0001-01-01T00:00:00Z"}, 400),
    ({"role": "user", "content": SECRET_TEXT, "schema_version": 2}, 400),
    ({"role": "user", "content": SECRET_TEXT + "\ud800"}, 400),  # a lone surrogate
    ({"role": "user", "content": SECRET_TEXT * 1000}, 413),  # past max_content_chars
], ids=["role", "blank", "nul", "tenant", "user", "message-id", "year", "version",
        "surrogate", "too-long"])
async def test_an_invalid_message_is_refused_naming_the_rule_not_the_text(message, status):
    world = World()
    body = {"session_id": "s1", "messages": [{"role": "user", "content": "fine"}, message]}
    backend = ProducingBackend(world, max_content_chars=2000)
    async with serve(backend, max_body=1_000_000) as (client, _):
        resp = await client.post(MESSAGES, data=json.dumps(body), headers=bearer())
        text = await error_of(resp, status, ErrorCode.BAD_REQUEST if status == 400
                              else ErrorCode.PAYLOAD_TOO_LARGE)
    assert "IBAN" not in text and "DE89" not in text
    assert world.records == []  # nothing of a request is sent when one message is bad


@pytest.mark.parametrize("body", [
    {"messages": []},
    {"session_id": "s1", "messages": [{"role": "user", "content": "x"}] * (MAX_BATCH_MESSAGES + 1)},
    {"messages": [{"role": "user", "content": "no session anywhere"}]},
    {"session_id": "s1", "messages": [{"role": "user", "content": "a", "message_id": "m1"},
                                      {"role": "user", "content": "b", "message_id": "m1"}]},
    {"session_id": "s1", "messages": "not a list"},
    {"session_id": "s1", "messages": [{"role": "user", "content": "x"}], "extra": 1},
], ids=["empty", "too-many", "no-session", "same-id", "not-a-list", "unknown-field"])
async def test_a_bad_batch_is_400_and_sends_nothing(body):
    world = World()
    async with serve(ProducingBackend(world)) as (client, _):
        resp = await client.post(MESSAGES, json=body, headers=bearer())
        await error_of(resp, 400, ErrorCode.BAD_REQUEST)
    assert world.records == []


async def test_a_body_past_the_limit_is_413_before_anything_is_parsed():
    world = World()
    big = {"session_id": "s1", "messages": [{"role": "user", "content": "x" * 5000}]}
    async with serve(ProducingBackend(world), max_body=2048) as (client, _):
        resp = await client.post(MESSAGES, json=big, headers=bearer())
        await error_of(resp, 413, ErrorCode.PAYLOAD_TOO_LARGE)
    assert world.records == [] and world.started == 0


async def test_keys_and_tenants_are_checked_before_the_body():
    world = World()
    async with serve(ProducingBackend(world)) as (client, backend):
        await error_of(await client.post(MESSAGES, data=b"{not json"), 401,
                       ErrorCode.UNAUTHORIZED)
        other = paths.fill(paths.MESSAGES, tenant="globex", user="u1")
        await error_of(await client.post(other, data=b"{not json", headers=bearer()), 403,
                       ErrorCode.FORBIDDEN)
        await error_of(await client.post(end_path(tenant="globex"), headers=bearer()), 403,
                       ErrorCode.FORBIDDEN)
        await error_of(await client.post(end_path("bad%20id"), headers=bearer()), 400,
                       ErrorCode.BAD_REQUEST)
        admin = await client.post(other, headers=bearer(ADMIN_KEY), json={
            "session_id": "s1", "messages": [{"role": "user", "content": "hi"}]})
        assert admin.status == 202  # the admin key opens every tenant
    assert backend.calls == [("add_messages", "globex", "u1")]


@pytest.mark.parametrize("trouble", ["refused", "hangs"])
async def test_a_broker_that_is_away_is_503_never_a_hang(trouble):
    world = World()
    if trouble == "refused":
        world.fail_start = KafkaConnectionError("Unable to bootstrap")
    else:
        world.hang = True
    body = {"session_id": "s1", "messages": [{"role": "user", "content": "hi"}]}
    async with serve(ProducingBackend(world, timeout_s=0.3)) as (client, _):
        resp = await asyncio.wait_for(client.post(MESSAGES, json=body, headers=bearer()), 5)
        text = await error_of(resp, 503, ErrorCode.UNAVAILABLE)
        assert "Idempotency-Key" in text and resp.headers["Retry-After"]
        resp = await asyncio.wait_for(client.post(end_path(), headers=bearer()), 5)
        await error_of(resp, 503, ErrorCode.UNAVAILABLE)
        if trouble == "refused":  # the broker is back: the next request starts a producer
            world.fail_start = None
            assert (await client.post(MESSAGES, json=body, headers=bearer())).status == 202
    assert world.stopped >= (2 if trouble == "refused" else 0)


async def test_the_producer_is_started_once_and_stopped_on_close():
    world = World()
    backend = ProducingBackend(world)
    body = {"session_id": "s1", "messages": [{"role": "user", "content": "hi"}]}
    async with serve(backend) as (client, _):
        for _ in range(3):
            assert (await client.post(MESSAGES, json=body, headers=bearer())).status == 202
    assert world.started == 1
    await backend.producer.close()
    assert world.stopped == 1


async def test_a_backend_that_cannot_produce_answers_503():
    class ReadOnly(FakeBackend):
        add_messages = None  # type: ignore[assignment]

    async with serve(ReadOnly()) as (client, _):
        resp = await client.post(MESSAGES, json={"session_id": "s1", "messages": [
            {"role": "user", "content": "hi"}]}, headers=bearer())
        await error_of(resp, 503, ErrorCode.UNAVAILABLE)


# --- the records, pure ------------------------------------------------------------------
def test_a_derived_id_depends_on_key_place_and_content_only():
    msg = {"role": "user", "content": "hi"}
    one = ingest_records.derived_id("k1", "acme", "u1", "s1", 0, msg)
    assert one == ingest_records.derived_id("k1", "acme", "u1", "s1", 0, dict(msg))
    assert len({one,
                ingest_records.derived_id("k2", "acme", "u1", "s1", 0, msg),
                ingest_records.derived_id("k1", "acme", "u1", "s1", 1, msg),
                ingest_records.derived_id("k1", "acme", "u2", "s1", 0, msg),
                ingest_records.derived_id("k1", "acme", "u1", "s1", 0,
                                          {**msg, "content": "ho"})}) == 5


def test_a_request_of_more_messages_than_ingest_remembers_ids_is_refused():
    """A retry is taken once only while every id of it is still in the session's dedup
    window: a request of more messages than that could be applied twice."""
    req = MessagesRequest(session_id="s1", messages=[
        MessageIn(role="user", content=f"m{i}") for i in range(5)])
    with pytest.raises(ApiError) as refused:
        ingest_records.chat_messages("acme", "u1", req, "k", NOW, max_bytes=10_000,
                                     max_chars=1000, most=4)
    assert refused.value.status == 400
    assert len(ingest_records.chat_messages("acme", "u1", req, "k", NOW, max_bytes=10_000,
                                            max_chars=1000, most=5)) == 5


def test_a_session_end_with_a_time_outside_the_contract_is_refused():
    with pytest.raises(ApiError) as refused:
        ingest_records.session_end("acme", "u1", "s1", datetime(1960, 1, 1, tzinfo=UTC), NOW,
                                   max_bytes=1000)
    assert refused.value.status == 400


# --- the document -----------------------------------------------------------------------
def test_the_document_says_202_and_names_the_session_id():
    doc = openapi_document(ROUTES)
    post = doc["paths"][paths.MESSAGES]["post"]
    assert set(post["responses"]) >= {"202", "400", "401", "403", "413", "429", "503"}
    assert "200" not in post["responses"]
    assert post["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/MessagesRequest")
    end = doc["paths"][paths.SESSION_END]["post"]
    assert "202" in end["responses"] and not end["requestBody"]["required"]
    assert {p["name"] for p in end["parameters"]} >= {"tenant", "user", "session_id",
                                                       "Idempotency-Key"}


async def test_the_real_producer_with_no_broker_is_503_within_its_timeout():
    """aiokafka itself (nothing listens on the port): the errors it raises are the 503."""
    settings = Settings.model_construct(**{**Settings().model_dump(),
                                           "bootstrap_servers": "127.0.0.1:9"})
    producer = backend_ingest.IngestProducer(settings, timeout_s=3.0)
    event = SessionEvent(tenant_id="acme", user_id="u1", session_id="s1", ts=NOW)
    try:
        started = asyncio.get_running_loop().time()
        with pytest.raises(ApiError) as refused:
            await producer.send("memstream.session-events", [event])
        assert refused.value.status == 503
        assert asyncio.get_running_loop().time() - started < 6.0
    finally:
        await producer.close()
