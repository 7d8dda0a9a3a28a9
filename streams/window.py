"""The short-term window table (see :mod:`memory.short_term`), written by the ingest stage.

Keys: ``tenant/user/session`` holds the session's message count (the head), and
``tenant/user/session#n`` its chunks. Written in the ingest loop, next to the ingest state,
so both live in changelogs of the same partition and come back together after a restart.
Read by the HTTP API in the same process (the worker owning the user's partition).
"""

from __future__ import annotations

from typing import Any

from memstream.core.settings import Settings
from memstream.memory import short_term
from memstream.topics.schemas import ChatMessage


def _head(tenant: str, user: str, session: str) -> bytes:
    return f"{tenant}/{user}/{session}".encode()


def keep(settings: Settings) -> int:
    return max(settings.short_term_turns, settings.conversation_keep)


def record(table: Any, settings: Settings, msg: ChatMessage, seq: int) -> None:
    """Remember message ``seq`` of its session (the ingest machine's numbering)."""
    n = keep(settings)
    if n == 0:
        return
    t, u, s = msg.tenant_id, msg.user_id, msg.session_id
    key = short_term.chunk_key(t, u, s, short_term.chunk_of(seq))
    row = [seq, msg.message_id, msg.role.value, msg.content, msg.ts.isoformat()]
    table[key] = short_term.append(table.get(key), row)
    head = _head(t, u, s)
    table[head] = max(int(table.get(head) or 0), seq + 1)
    old = short_term.expired_chunk(seq, n)
    if old is not None and table.get(short_term.chunk_key(t, u, s, old)) is not None:
        del table[short_term.chunk_key(t, u, s, old)]


def forget(table: Any, settings: Settings, tenant: str, user: str, session: str) -> None:
    """Drop a session's window (the ingest machine forgot the session)."""
    head = _head(tenant, user, session)
    count = int(table.get(head) or 0)
    for n in short_term.chunks_covering(count, keep(settings) + short_term.CHUNK):
        key = short_term.chunk_key(tenant, user, session, n)
        if table.get(key) is not None:
            del table[key]
    if table.get(head) is not None:
        del table[head]


def rows(table: Any, tenant: str, user: str, session: str, last: int) -> list[short_term.Row]:
    count = int(table.get(_head(tenant, user, session)) or 0)
    return short_term.last_rows(table.get, tenant, user, session, count, last)
