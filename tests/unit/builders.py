"""Builders shared by the unit tests: the one module test modules import helpers from
(no test module imports another). Fixtures shared by several modules live in a
``conftest.py`` instead (``tests/unit/memory/conftest.py``: the ``store`` fixture)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import aiohttp
from aiohttp.test_utils import TestClient, TestServer
from aiokafka.errors import IllegalStateError
from aiokafka.structs import TopicPartition

from memstream.contract.http_api import paths
from memstream.contract.http_api.api import (
    Accepted,
    ContextRequest,
    ContextResponse,
    ErrorBody,
    ErrorCode,
    FeedbackRequest,
    Health,
    MemoryOut,
    MemoryPage,
    Principal,
    ScoredMemory,
    SearchRequest,
    SearchResponse,
    ToolCallRequest,
    ToolResult,
)
from memstream.contract.http_api.intake import (
    MessageAccepted,
    MessagesAccepted,
    MessagesRequest,
    SessionEndAccepted,
    SessionEndRequest,
)
from memstream.core import record_auth
from memstream.memory.coalescing import Policy, UserState, on_message
from memstream.memory.store import Scope
from memstream.topics.schemas import (
    ChatMessage,
    ExtractionJob,
    JobMessage,
    JobResult,
    JobStatus,
    Lineage,
    MemoryChange,
    TriggerReason,
)
from memstream.web.http import build_http_app

_ids = itertools.count()
# the cluster secret of the stage tests' settings: their records carry its MAC, as a worker's
# producer signs them (core.record_auth)
CLUSTER_SECRET = "unit-tests-cluster-secret-0123456789abcdef"


def mac(topic: str, key: bytes | None, value: bytes | None,
        secret: str = CLUSTER_SECRET) -> tuple[tuple[str, bytes], ...]:
    """The headers a worker's producer gives a record of ``topic`` (a default-prefixed
    topic that carries authority: its MAC; any other: none)."""
    role = record_auth.role_of(topic, "memstream")
    if role is None:
        return ()
    return (record_auth.header(record_auth.RecordKeys.of(secret), role, key, value),)


def msg(text: str = "I live in Berlin and work at Siemens", *, session: str = "s1",
        role: str = "user", mid: str | None = None, tenant: str = "t1",
        user: str = "u1", minute: int = 0) -> ChatMessage:
    return ChatMessage(
        tenant_id=tenant, user_id=user, session_id=session,
        message_id=mid or f"m{next(_ids)}", role=role, content=text,
        ts=datetime(2026, 1, 1, 0, minute, tzinfo=UTC),
    )


def result(job, status: JobStatus = JobStatus.DONE, now: float = 0.0) -> JobResult:
    return JobResult.for_job(job, status, datetime.fromtimestamp(now, UTC))


# --- added for the retrieval / tool-job tests (issue 7) ------------------------------------

def make_store(kind: str, tmp_path, dim: int):
    """An empty store of either backend: ``"edge"`` (on disk) or ``"server"`` (in memory)."""
    if kind == "edge":
        from memstream.memory.store.edge import EdgeStore

        return EdgeStore(tmp_path / "edge", dim)
    from qdrant_client import QdrantClient

    from memstream.memory.store.server import ServerStore

    return ServerStore("memories", dim, client=QdrantClient(":memory:"))


def memory(content: str, *, mid: str, user: str = "u1", tenant: str = "t1",
           type: str = "episodic", status: str = "active", importance: int = 5,
           at: float = 0.0, version: int = 1, slot: str | None = None,
           expires_at: float | None = None):
    """A stored version record, written directly (no decision path)."""
    from memstream.memory.model import Memory, MemoryType, Source, Status

    return Memory(mid, tenant, user, MemoryType(type), content, importance, at, at, at,
                  Source("s0", 0, 1, "j0", f"op-{mid}-{version}"), version=version,
                  status=Status(status), slot=slot, expires_at=expires_at)


def tool_request(content: str = "The user prefers green tea", *, rid: str = "call-1",
                 name: str = "memory_insert", label: str | None = None,
                 old: str = "", tenant: str = "t1", user: str = "u1",
                 session: str | None = None):
    """An agent's tool write as the API produces it."""
    from memstream.topics.schemas import ToolRequest, ToolWrite

    write = ToolWrite(name=name, content=content, label=label,
                      old_content=old)
    return ToolRequest(request_id=rid, tenant_id=tenant, user_id=user, session_id=session,
                       write=write, ts=datetime(2026, 1, 1, tzinfo=UTC))


def job(texts, *, job_id="job-1", user="u1", tenant="t1", session="s1", start=0):
    """An extraction job of ``texts`` (one user message each), seq 0."""
    msgs = [JobMessage(seq=start + i, message_id=f"{job_id}-{i}", role="user", content=t,
                       ts=datetime(2026, 3, 1, tzinfo=UTC)) for i, t in enumerate(texts)]
    return ExtractionJob(job_id=job_id, tenant_id=tenant, user_id=user, session_id=session,
                         from_seq=start, to_seq=start + len(texts),
                         reason=TriggerReason.THRESHOLD, messages=msgs,
                         created_at=datetime(2026, 3, 1, tzinfo=UTC))


# --- Kafka clients for the owned loops' unit tests (streams/owned_loop.py) ------------------

class FakeProducer:
    def __init__(self, fail: BaseException | None = None) -> None:
        self.fail = fail
        self.committed: list[list[tuple[str, bytes | None, bytes | None, int | None]]] = []
        self.offsets: list[dict[TopicPartition, int]] = []
        self._open: list[tuple[str, bytes | None, bytes | None, int | None]] | None = None
        self._ends: dict[tuple[str, int], int] = {}
        # (topic, partition) -> the timestamp and headers each record was sent with
        self.stamped: list[tuple[str, int | None, int | None, list[tuple[str, bytes]]]] = []
        self.stopped = False

    async def begin_transaction(self) -> None:
        self._open = []
        self._offsets: dict[TopicPartition, int] = {}

    async def send(self, topic, key=None, value=None, partition=None, timestamp_ms=None,
                   headers=None):
        assert self._open is not None
        self._open.append((topic, key, value, partition))
        self.stamped.append((topic, partition, timestamp_ms, list(headers or [])))
        delivered = asyncio.get_running_loop().create_future()
        where = (topic, partition or 0)  # what the broker says it wrote
        self._ends[where] = self._ends.get(where, 0) + 1
        delivered.set_result(SimpleNamespace(topic=topic, partition=where[1],
                                             offset=self._ends[where] - 1))
        return delivered

    async def send_offsets_to_transaction(self, offsets, group_id):
        self._offsets = {tp: o.offset for tp, o in offsets.items()}

    async def commit_transaction(self) -> None:
        if self.fail is not None:
            self._open = None
            raise self.fail
        assert self._open is not None
        self.committed.append(self._open)
        if self._offsets:  # (a timer round's transaction sends none)
            self.offsets.append(self._offsets)
        self._open = None

    async def stop(self) -> None:
        self.stopped = True


class FakeConsumer:
    def __init__(self, assigned: set[TopicPartition],
                 committed: dict[TopicPartition, int] | None = None) -> None:
        self.assigned = assigned
        self.committed_at = committed or {}  # default: never committed (starts at 0)
        self.seeks: list[tuple[TopicPartition, int]] = []
        self.high: dict[TopicPartition, int | None] = {}  # default 0: read to the end
        self.positions: dict[TopicPartition, int] = {}
        self.paused_tps: set[TopicPartition] = set()
        self.listener: Any = None

    def subscribe(self, topics: list[str], listener: Any = None) -> None:
        self.listener = listener

    def assignment(self) -> set[TopicPartition]:
        return set(self.assigned)

    def _held(self, tps: Any) -> None:
        if set(tps) - self.assigned:  # as aiokafka's subscription state
            raise IllegalStateError(f"No current assignment for {set(tps) - self.assigned}")

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self._held([tp])
        self.seeks.append((tp, offset))

    def pause(self, *tps: TopicPartition) -> None:
        self._held(tps)
        self.paused_tps |= set(tps)

    def resume(self, *tps: TopicPartition) -> None:
        self._held(tps)
        self.paused_tps -= set(tps)

    async def committed(self, tp: TopicPartition) -> int | None:
        return self.committed_at.get(tp)

    async def beginning_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return dict.fromkeys(tps, 0)

    def highwater(self, tp: TopicPartition) -> int | None:
        return self.high.get(tp, 0)

    async def position(self, tp: TopicPartition) -> int:
        return self.positions.get(tp, 0)


class FakeClients:
    """A loop's clients (streams.loop_clients) that keep what they are told: one consumer,
    a producer per take or renewal (``renewals``: the next ones to hand out, else a new
    FakeProducer), no table to restore."""

    def __init__(self, consumer: FakeConsumer) -> None:
        self.the_consumer = consumer
        self.made: list[tuple[str, Any]] = []  # (transactional id, producer), in order
        self.renewals: list[Any] = []  # producers to hand out next (e.g. failing ones)
        self.restored: list[set[int]] = []

    def consumer(self, group: str, member: str | None, assignor: Any) -> FakeConsumer:
        return self.the_consumer

    async def producer(self, transactional_id: str) -> Any:
        made = self.renewals.pop(0) if self.renewals else FakeProducer()
        if isinstance(made, BaseException):
            raise made
        self.made.append((transactional_id, made))
        return made

    async def restore(self, tables: Any, partitions: set[int]) -> None:
        self.restored.append(set(partitions))

    async def first_offset(self, consumer: Any, tp: TopicPartition) -> int:
        return int((await consumer.beginning_offsets([tp]))[tp])


async def serving(loop: Any, partitions: set[int],
                  committed: dict[TopicPartition, int] | None = None) -> FakeClients:
    """``loop`` given ``partitions`` of its inputs as a consumer group would (revoke,
    assignment, the takes), with fake clients; returns them once every take is done."""
    tps = {TopicPartition(t, n) for t in loop.stage.inputs for n in partitions}
    clients = FakeClients(FakeConsumer(set(tps), committed))
    loop.clients = clients
    loop.connect()
    await loop.task_manager.revoked()
    await loop.task_manager.assigned(tps)
    await loop.task_manager.settled()
    clients.the_consumer.seeks.clear()  # (the takes' own)
    return clients


# --- the ingest machine of the tool-job and forget tests (memory.coalescing) ----------------

P = Policy(min_new_messages=4, context_messages=2, idle_timeout_s=100, job_timeout_s=50)


def fresh() -> UserState:
    return UserState("t1", "u1")


def feed(state, texts, now=0.0):
    jobs = []
    for text in texts:
        step = on_message(state, msg(text), now, P)
        state, jobs = step.state, jobs + step.jobs
    return state, jobs


def forget_request(rid: str = "forget-1", user: str = "u1"):
    return tool_request("", rid=rid, name="forget", user=user)


def live(store, user="u1"):
    """The contents of a user's live memories, sorted."""
    return sorted(m.content for m in store.list(Scope("t1", user)))


# --- a change event with a canary in it (sealing.envelope, web.audit) -----------------

CANARY = "canary-7f3a Lives in Reykjavik"


def change(user: str = "u1", cid: str = "c1") -> MemoryChange:
    after = {"memory_id": "m1", "content": CANARY, "version": 1}
    return MemoryChange(
        change_id=cid, op="add", tenant_id="t1", user_id=user, memory_id="m1", version=1,
        before=None, after=after, records=[after], vector=[0.25, -0.5], reason=CANARY,
        lineage=Lineage(session_id="s1", from_seq=0, to_seq=1, job_id="j1"), model="rules",
        prompt_version="v1", decided_at=datetime(2026, 1, 1, tzinfo=UTC))


# --- the HTTP layer against a fake backend and fake keys (web.http) -------------------------

TENANT_KEY = "key-acme-0123456789"
ADMIN_KEY = "key-admin-9876543210-0123456789abc"
KEYS = {TENANT_KEY: Principal(key_id="k-acme", tenant_id="acme"),
        ADMIN_KEY: Principal(key_id="k-admin", admin=True)}
TOOL = {"type": "function", "function": {"name": "memory_search", "parameters": {}}}
# The API's routes for one user: (method, path, a valid body, backend method), and their ids.
SCOPED = [
    ("GET", paths.MEMORIES, None, "list_memories"),
    ("POST", paths.SEARCH, {"query": "tea", "k": 3}, "search"),
    ("POST", paths.CONTEXT, {"query": "tea", "session_id": "s1"}, "context"),
    ("POST", paths.FEEDBACK, {"query_id": "q1", "memory_id": "m1", "useful": True},
     "feedback"),
    ("POST", paths.EXECUTE_TOOL, {"name": "memory_search", "arguments": {"query": "tea"}},
     "execute_tool"),
]
SCOPED_IDS = [s[1].removeprefix(paths.USER + "/") for s in SCOPED]
MEMORY = MemoryOut(memory_id="m1", version=1, type="episodic", content="likes tea",
                   importance=5, status="active", scope="user", created_at=1.0,
                   updated_at=1.0, valid_from=1.0)
SCORED = ScoredMemory(**MEMORY.model_dump(), score=0.9, recency=1.0, importance_score=0.5,
                      relevance=0.8)


class FakeBackend:
    """Records every call; ``fail`` makes the next calls raise it."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.is_ready = True
        self.fail: BaseException | None = None
        self.idempotency_keys: list[str | None] = []  # of the writes, in order

    def ready(self) -> bool:
        return self.is_ready

    def serving(self, tenant: str, user: str) -> bool:
        return self.is_ready

    def health(self) -> Health:
        return Health(status="ok" if self.is_ready else "starting")

    def tools(self) -> list[dict[str, Any]]:
        return [TOOL]

    def _record(self, *call: Any) -> None:
        self.calls.append(call)
        if self.fail is not None:
            raise self.fail

    async def list_memories(self, tenant: str, user: str, *, limit: int, cursor: str | None,
                            status: str | None, type: str | None) -> MemoryPage:
        self._record("list_memories", tenant, user,
                     {"limit": limit, "cursor": cursor, "status": status, "type": type})
        return MemoryPage(memories=[MEMORY], next_cursor="next-1")

    async def search(self, tenant: str, user: str, req: SearchRequest) -> SearchResponse:
        self._record("search", tenant, user, req)
        return SearchResponse(query_id="q1", memories=[SCORED])

    async def context(self, tenant: str, user: str, req: ContextRequest) -> ContextResponse:
        self._record("context", tenant, user, req)
        return ContextResponse(query_id="q1", memories=[SCORED], procedural=[],
                               core={"profile": "p"}, window=[], prompt_block="block")

    async def feedback(self, tenant: str, user: str, req: FeedbackRequest) -> Accepted:
        self._record("feedback", tenant, user, req)
        return Accepted(id="f1")

    async def execute_tool(self, tenant: str, user: str, req: ToolCallRequest,
                           principal: Principal,
                           idempotency_key: str | None = None) -> ToolResult:
        self.idempotency_keys.append(idempotency_key)
        self._record("execute_tool", tenant, user, req, principal)
        return ToolResult(tool_call_id=req.tool_call_id, name=req.name, status="ok",
                          content="done")

    async def add_messages(self, tenant: str, user: str, req: MessagesRequest,
                           idempotency_key: str | None = None) -> MessagesAccepted:
        self.idempotency_keys.append(idempotency_key)
        self._record("add_messages", tenant, user, req)
        return MessagesAccepted(messages=[
            MessageAccepted(message_id=m.message_id or f"m{i}",
                            session_id=m.session_id or req.session_id or "s1",
                            topic="memstream.messages", partition=0, offset=i)
            for i, m in enumerate(req.messages)])

    async def end_session(self, tenant: str, user: str, session: str,
                          req: SessionEndRequest) -> SessionEndAccepted:
        self._record("end_session", tenant, user, session, req)
        return SessionEndAccepted(session_id=session, topic="memstream.session-events",
                                  partition=0, offset=0)


class FakeAuthoriser:
    def __init__(self, keys: dict[str, Principal]) -> None:
        self.keys = keys

    def authorise(self, presented: str) -> Principal | None:
        return self.keys.get(presented)


@asynccontextmanager
async def serve(backend: FakeBackend | None = None,
                max_body: int = 65536) -> AsyncIterator[tuple[TestClient, FakeBackend]]:
    backend = backend or FakeBackend()
    app = build_http_app(backend, FakeAuthoriser(KEYS), max_body_bytes=max_body)
    async with TestClient(TestServer(app)) as client:
        yield client, backend


def bearer(key: str = TENANT_KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def error_of(resp: aiohttp.ClientResponse, status: int, code: ErrorCode) -> str:
    assert resp.status == status, await resp.text()
    body = ErrorBody.model_validate(await resp.json())
    assert body.error.code == code
    return body.error.message
