"""The per-tenant audit log (SPEC §4 "who changed what, when"; §7 "the audit keeps that the
erasure happened"): every change event of the memory-change topic, as who / what / when
without content.

An entry carries the op, the user, the memory and version, the lineage kind (extraction,
tool, reflection, consolidation, decay, deletion, rollback, forget), the actor (the API key
that asked, or the windowed job), the job, the time. The decision's reason is kept only
for a forget-me (the operator's "why"): other reasons may quote what the user said.
Change events are read with a plain consumer (not a stage's loop), so following the topic
changes nothing in the worker's transactions. A turn kept in the episodic archive (op
``archive``) is no change of a memory and no one's act: it is not an entry (one per chat
turn, it would push the memories' changes out of the bounded log).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from typing import Any

from aiokafka import TopicPartition

from memstream.core.settings import Settings
from memstream.core.topic_reader import Record, follow
from memstream.topics.schemas import MemoryChange

log = logging.getLogger(__name__)
PER_TENANT = 10_000  # newest entries kept per tenant in a worker
SEEN_IDS = 200_000


def entry(change: MemoryChange) -> dict[str, Any]:
    """One audit entry: who did what, when; never content."""
    out: dict[str, Any] = {
        "at": change.decided_at.timestamp(), "op": change.op, "user_id": change.user_id,
        "memory_id": change.memory_id, "version": change.version,
        "kind": change.lineage.kind, "actor": change.lineage.actor or None,
        "job_id": change.lineage.job_id, "change_id": change.change_id}
    if change.op == "erase":
        out["reason"] = change.reason
        out["version_records"] = int((change.after or {}).get("version_records", 0))
    return out


class AuditLog:
    """Follows the memory-change topic into bounded per-tenant logs (newest last)."""

    def __init__(self, settings: Settings, topic: str, per_tenant: int = PER_TENANT) -> None:
        self.settings, self.topic, self.per_tenant = settings, topic, per_tenant
        self._logs: dict[str, deque[dict[str, Any]]] = {}
        # change ids lately seen (a republished change counts once; it follows its first
        # publication closely, so a bounded memory is enough)
        self._seen: dict[str, None] = {}
        self._task: asyncio.Task[None] | None = None
        self._positions: dict[TopicPartition, int] = {}

    def take(self, value: bytes | None) -> None:
        if not value:
            return
        try:
            change = MemoryChange.model_validate_json(value)
        except ValueError:
            return
        if change.change_id in self._seen or change.op == "archive":
            return
        self._seen[change.change_id] = None
        if len(self._seen) > SEEN_IDS:
            del self._seen[next(iter(self._seen))]
        log = self._logs.setdefault(change.tenant_id, deque(maxlen=self.per_tenant))
        log.append(entry(change))

    def page(self, tenant: str, *, offset: int, limit: int,
             user: str | None = None, kind: str | None = None) -> tuple[list[dict[str, Any]],
                                                                          bool]:
        """Newest first; (entries, more)."""
        rows = [e for e in reversed(self._logs.get(tenant, ()))
                if (user is None or e["user_id"] == user) and (kind is None or e["kind"] == kind)]
        return rows[offset:offset + limit], len(rows) > offset + limit

    async def start(self) -> None:
        self._task = asyncio.create_task(self._follow())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def _take_all(self, records: list[Record]) -> None:
        for r in records:
            self.take(r.value)

    async def _follow(self) -> None:
        """Until stopped: the topic (which the worker creates at start) is waited for, and a
        broker error resumes where the log had got, after a second."""
        while True:
            try:
                await follow(self.settings, self.topic, self._take_all,
                             positions=self._positions, poll_s=1.0)
            except Exception as exc:
                log.warning("audit log: following %s failed (%s); retrying", self.topic,
                            type(exc).__name__)
            await asyncio.sleep(1.0)
