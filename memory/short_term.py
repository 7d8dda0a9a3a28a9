"""The short-term window (SPEC §5): a session's recent messages, in fixed chunks, pure.

The ingest stage keeps every session's last messages in a changelog-backed table (it
survives restarts). A table value is rewritten on every change and written to the
changelog whole, so one value per session holding 200 messages would cost ~40 KB of
changelog per message. Messages are kept in chunks of ``CHUNK`` instead (key
``tenant/user/session#n`` holds seqs ``[n*CHUNK, (n+1)*CHUNK)``): a message rewrites only
its own chunk, and the chunk that falls out of the kept range is deleted.

``context`` returns the last ``short_term_turns`` messages (a turn = one message);
``conversation_search`` searches the last ``conversation_keep`` messages of a session.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

CHUNK = 10

Row = list[Any]  # [seq, message_id, role, content, ts_iso]


def chunk_key(tenant: str, user: str, session: str, chunk: int) -> bytes:
    return f"{tenant}/{user}/{session}#{chunk}".encode()


def chunk_of(seq: int) -> int:
    return seq // CHUNK


def chunks_covering(count: int, last: int) -> range:
    """Chunk numbers holding the last ``last`` of ``count`` messages (oldest first)."""
    if count <= 0 or last <= 0:
        return range(0)
    return range(chunk_of(max(0, count - last)), chunk_of(count - 1) + 1)


def kept_chunks(keep: int) -> int:
    """Chunks to keep so that the last ``keep`` messages are always there."""
    return (keep + CHUNK - 1) // CHUNK + 1 if keep > 0 else 0


def expired_chunk(seq: int, keep: int) -> int | None:
    """The chunk to delete when message ``seq`` opens a new chunk, if any."""
    if seq % CHUNK:
        return None
    old = chunk_of(seq) - kept_chunks(keep)
    return old if old >= 0 else None


def append(rows: Sequence[Row] | None, row: Row) -> list[Row]:
    """A chunk with ``row`` added (a message seen twice replaces itself)."""
    kept = [r for r in rows or () if r[0] != row[0]]
    return sorted([*kept, row], key=lambda r: r[0])


def last_rows(get: Callable[[bytes], Sequence[Row] | None], tenant: str, user: str,
              session: str, count: int, last: int) -> list[Row]:
    """The last ``last`` messages of a session that has ``count`` messages."""
    rows: list[Row] = []
    for n in chunks_covering(count, last):
        rows += get(chunk_key(tenant, user, session, n)) or []
    return rows[-last:] if last > 0 else []


_WORD = re.compile(r"\w+", re.UNICODE)


def _terms(text: str) -> set[str]:
    words = {w.lower() for w in _WORD.findall(text)}
    # CJK text has no spaces: index its characters as terms too.
    return words | {ch for w in words for ch in w if "\u3400" <= ch <= "\u9fff"}


def search(rows: Sequence[Row], query: str, limit: int) -> list[Row]:
    """Messages sharing the most query terms, newest first among equals."""
    wanted = _terms(query)
    if not wanted:
        return []
    scored = [(len(wanted & _terms(str(r[3]))), r[0], r) for r in rows]
    hits = [x for x in scored if x[0] > 0]
    hits.sort(key=lambda x: (-x[0], -x[1]))
    return [r for _, _, r in hits[:limit]]
