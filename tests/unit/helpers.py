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
