"""Forget-me in the worker (SPEC §7): sealing change events, the read fence, the erasure.

With ``MEMSTREAM_MASTER_KEY`` set, the worker follows the user-keys topic
(:class:`memstream.memory.crypto.user_keys.UserKeys`); the apply stage seals every change
event with the user's data key before publishing it, and its public event with the same key
(:func:`seal_all`). A forget-me request
first sets the user's signed marker and shreds the user's keys (from then on no read
returns a memory of the user created before it, on any worker following the topic), then
sends the erasure as a job of the user: the ingest stage drops the buffered messages, the
apply stage deletes every record of the user from the store (:meth:`MemoryStore.erase`),
publishes the audit record (op ``erase``: who, when, why, how many; never content) and
shreds any key created meanwhile (:func:`after_erase`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from memstream.contract.events import MemoryEvent
from memstream.core.settings import Settings
from memstream.memory.crypto import change_sealing
from memstream.memory.model import Memory
from memstream.sealing import envelope as crypto
from memstream.streams.pipeline import Pipeline
from memstream.topics.publishing import is_public, public_event
from memstream.topics.schemas import MemoryChange

log = logging.getLogger(__name__)
READY_S = 60.0



async def seal_all(p: Pipeline, changes: Sequence[MemoryChange]
                   ) -> list[tuple[MemoryChange, MemoryEvent | None]]:
    """The change events as published, each with its public event (``topics.publishing``; None:
    not a public one), both sealed with the user's data key (a forget-me's erase record
    stays plain: it holds no content)."""
    events = [(c, public_event(c) if is_public(c) else None) for c in changes]
    if p.user_keys is None:
        return events
    if not p.user_keys.ready and not await p.user_keys.wait_ready(READY_S):
        # a key made before the topic is read could be a user's second: tried again later
        raise TimeoutError("the user-keys topic is not read to its end yet")
    out = []
    for c, e in events:
        if c.op == "erase":
            out.append((c, e))
            continue
        key_id, key = await p.user_keys.key_for_write(c.tenant_id, c.user_id)
        out.append((change_sealing.seal_change(c, key_id, key),
                    None if e is None else crypto.seal_event(e, key_id, key)))
    return out


async def after_erase(p: Pipeline, changes: Sequence[MemoryChange]) -> None:
    """Shred the keys of users erased by ``changes`` (keys made since the request)."""
    if p.user_keys is None:
        return
    for c in changes:
        if c.op == "erase":
            await p.user_keys.forget(c.tenant_id, c.user_id, c.decided_at.timestamp(),
                                     c.lineage.job_id, c.lineage.actor)


def fenced(p: Pipeline, tenant: str, user: str) -> float | None:
    """When the user asked to be forgotten (their older memories are hidden), or None."""
    return None if p.user_keys is None else p.user_keys.forgotten_at(tenant, user)


def visible(p: Pipeline, tenant: str, user: str, memories: Sequence[Memory]) -> list[Memory]:
    """``memories`` without those a forget-me hides until the erasure has run."""
    at = fenced(p, tenant, user)
    if at is None:
        return list(memories)
    return [m for m in memories if m.created_at > at]


# --- segment rolling: compaction and retention within the bound ------------------------
# Kafka compacts or deletes only closed segments, and a segment closes (rolls) on the next
# append after segment.ms: a quiet partition would keep a forgotten user's overwritten
# records in its open segment indefinitely. Every half bound, the worker appends to every
# partition of the tables' changelogs (in the ingest and apply loops' timer rounds: a value
# then a tombstone under a key no user has) and to the user-keys topic.

ROLL_KEY = b"\x00roll"


def roll_tables(*tables: Any) -> None:
    """A roll (in the ingest loop: its two tables; in the apply loop, or the jobs-only
    worker's: the maintenance table): one append and its tombstone per table slice of the
    partition's task; nothing stays in the tables."""
    for table in tables:
        table[ROLL_KEY] = 1
        del table[ROLL_KEY]


class RollSchedule:
    """When one partition's table segments roll (a task's processor holds one): every half
    erasure bound (first at the first timer round of the partition here)."""

    def __init__(self, settings: Settings) -> None:
        self.every = settings.erasure_bound_s / 2
        self.next = 0.0

    def due(self, now: float) -> bool:
        if now < self.next:
            return False
        self.next = now + self.every
        return True
