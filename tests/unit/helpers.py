"""Builders shared by the unit tests."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime

from memstream.topics.schemas import ChatMessage, JobResult, JobStatus

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
