"""The windowed jobs' shell: a thin fold around :mod:`jobs.triggers`.

The apply loop (:mod:`streams.apply`) folds each change it publishes, and in its timer
round (``punctuate``) each due user of a partition, with the :class:`TaskFold` of the
partition's task (opened from the loop's :class:`MaintenanceFold`): one
:class:`~jobs.triggers.UserJobs` per user in the changelog-backed ``maintenance`` table,
and the commands the machine emits sent to the tool-requests topic, in the same
transaction as the table write (exactly-once: a crash neither loses a due reflection nor
sends it twice; the ingest stage also takes a request id once).

Timers: the cost of a round must not grow with all users. A :class:`DueIndex` per task
(a heap of next-due times, built from the table at the partition's first round, then kept
up to date by the fold) names the due users; only they are ticked. Faust's windowed tables
are not used: their expiry is unreliable after rebalances and restarts (faust-streaming
#385, #250), and a plain table plus due times recovers exactly.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from memstream.core.settings import Settings
from memstream.jobs import triggers
from memstream.streams.ingest_tables import LoopTable, TableSlice
from memstream.streams.pipeline import Pipeline
from memstream.streams.stage import Record
from memstream.topics.schemas import MemoryChange, ToolRequest, ToolWrite


def policy_from(settings: Settings) -> triggers.JobsPolicy:
    return triggers.JobsPolicy(
        reflection_threshold=settings.reflection_threshold,
        consolidation_interval_s=settings.consolidation_interval_s,
        decay_interval_s=settings.decay_interval_s, enabled=tuple(settings.jobs))


class DueIndex:
    """Next-due time per user key, cheapest first; stale entries are skipped on pop."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, bytes]] = []
        self._due: dict[bytes, float] = {}

    def push(self, key: bytes, due: float | None) -> None:
        if due is None:
            self._due.pop(key, None)
            return
        if self._due.get(key) == due:
            return
        self._due[key] = due
        heapq.heappush(self._heap, (due, key))

    def pop_due(self, now: float) -> list[bytes]:
        out: list[bytes] = []
        while self._heap and self._heap[0][0] <= now:
            due, key = heapq.heappop(self._heap)
            if self._due.get(key) == due:
                del self._due[key]
                out.append(key)
        return out

    def __len__(self) -> int:
        return len(self._due)


def due_index(items: Iterable[tuple[bytes, Any]]) -> DueIndex:
    """The next due times of a table's users (its snapshots), as a heap."""
    index = DueIndex()
    for key, raw in items:
        if raw:
            index.push(key, triggers.next_due(triggers.UserJobs.restore(raw)))
    return index


class MaintenanceFold:
    """The windowed jobs' fold of a loop: the ``maintenance`` table (a
    :class:`~streams.ingest_tables.LoopTable` the apply loop owns) and the policy; each
    partition task's processor folds through a :class:`TaskFold` of its own."""

    def __init__(self, p: Pipeline) -> None:
        self.p = p
        self.table: LoopTable = p.maintenance
        self.policy = policy_from(p.settings)

    def open(self, table: TableSlice) -> TaskFold:
        """The fold of one partition's task, writing its slice of the table."""
        return TaskFold(self.p, self.policy, table)


class TaskFold:
    """Changes and due times of one partition's users folded into its slice of the
    ``maintenance`` table (written inside the task's batches and timer rounds, committed
    with them), the commands that emits, and the partition's :class:`DueIndex`."""

    def __init__(self, p: Pipeline, policy: triggers.JobsPolicy, table: TableSlice) -> None:
        self.p = p
        self.policy = policy
        self.table = table
        self.index: DueIndex | None = None  # built from the table at its first round

    def _state(self, key: bytes, tenant: str, user: str) -> triggers.UserJobs:
        raw = self.table.get(key)
        return triggers.UserJobs.restore(raw) if raw else triggers.UserJobs(tenant, user)

    def fold(self, change: MemoryChange) -> list[Record]:
        """One change of a user into the table; the tool requests of the commands it emits,
        to send in the same transaction."""
        key = change.key().encode()
        state = self._state(key, change.tenant_id, change.user_id)
        now = self.p.clock()
        return self._took(key, state, *triggers.on_change(state, change, now, self.policy), now)

    def punctuate(self, now: float) -> list[Record]:
        """The partition's users whose next job is due by ``now``, ticked."""
        if self.index is None:  # the table was restored, the heap was not
            self.index = due_index(self.table.items())
        out: list[Record] = []
        for key in self.index.pop_due(now):
            tenant, _, user = key.decode().partition("/")
            state = self._state(key, tenant, user)
            out += self._took(key, state, *triggers.on_tick(state, now, self.policy), now)
        return out

    def _took(self, key: bytes, state: triggers.UserJobs, new: triggers.UserJobs,
              commands: list[triggers.Command], now: float) -> list[Record]:
        p = self.p
        if new != state:
            self.table[key] = new.snapshot()
        if self.index is not None:
            self.index.push(key, triggers.next_due(new))
        out: list[Record] = []
        for command in commands:
            p.counters.jobs_commands += 1
            request = ToolRequest(
                request_id=command.request_id, tenant_id=new.tenant_id, user_id=new.user_id,
                write=ToolWrite(name=command.kind), principal=f"job:{command.kind}",
                ts=datetime.fromtimestamp(now, UTC))
            out.append((p.topics.tool_requests.name, key, request.dumps()))
        return out
