"""Builders shared by the unit tests."""

from __future__ import annotations

import asyncio
import itertools
from datetime import UTC, datetime

from aiokafka.structs import TopicPartition

from memstream.topics.schemas import (
    ChatMessage,
    ExtractionJob,
    JobMessage,
    JobResult,
    JobStatus,
    TriggerReason,
)

_ids = itertools.count()


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
        from memstream.memory.store_edge import EdgeStore

        return EdgeStore(tmp_path / "edge", dim)
    from qdrant_client import QdrantClient

    from memstream.memory.store_server import ServerStore

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

    async def begin_transaction(self) -> None:
        self._open = []

    async def send(self, topic, key=None, value=None, partition=None):
        assert self._open is not None
        self._open.append((topic, key, value, partition))
        delivered = asyncio.get_running_loop().create_future()
        delivered.set_result(None)
        return delivered

    async def send_offsets_to_transaction(self, offsets, group_id):
        self._offsets = {tp: o.offset for tp, o in offsets.items()}

    async def commit_transaction(self) -> None:
        if self.fail is not None:
            self._open = None
            raise self.fail
        assert self._open is not None
        self.committed.append(self._open)
        self.offsets.append(self._offsets)
        self._open = None

    async def stop(self) -> None:
        pass


class FakeConsumer:
    def __init__(self, assigned: set[TopicPartition]) -> None:
        self.assigned = assigned
        self.seeks: list[tuple[TopicPartition, int]] = []

    def assignment(self) -> set[TopicPartition]:
        return self.assigned

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.seeks.append((tp, offset))
