"""The whole pure pipeline as one hypothesis state machine, driven through faults.

What runs is production code end to end, minus Kafka: the ingest machine
(``memory.coalescing``, one ``UserState`` per user, an injected clock), the extract stage's
``skip_decided`` / ``decide_with_retries`` (``Extractor`` with the rules model, the hashing
embedder and a Qdrant Edge store), the apply stage's ``apply_decision`` and ``publish``. The
topics are modelled: a pool of extraction jobs and of job results (delivered, duplicated,
reordered or dropped), one decision queue per user (a partition: read in order, a record
is read again after a crash), and the memory-change topic, which only receives the events
of a *committed* apply step. Faults:

- chat messages of two users in two sessions, some written long before they arrive (their
  ``ts`` is the event time), producer retries, session ends;
- the clock moving on and ticks (idle flush, job-timeout re-sends, retry backoff);
- jobs and results duplicated, delayed / reordered or dropped (a dropped job comes back
  only through the ingest stage's job-timeout re-send); extraction failing;
- the extract stage's check-then-decide race (the cursor is read, the apply stage moves
  on, the job is decided against the newer store: a job decided twice to other ops);
- the apply step killed after its store write but before its transaction commits (its
  events and result are lost, the decision is read again), killed between two of its store
  writes (a half-applied decision), or run twice (at-least-once: committed, read again);
- a later decision of a partition handed to the apply stage before an earlier one (as when
  Faust read the decisions: it dropped a fetched record around a recovery, and memstream
  handed it over again late).

Checked after every step: one change id, one payload on the topic; the cursor never moves
back; job seqs strictly increase and a re-sent job keeps its seq and range; no job
applied twice and no message in two applied jobs; one live memory per single-valued slot
(except while a half-applied decision waits to be applied again).
Checked once everything is drained (every record delivered, every timeout passed):

- I3: every change the store holds (each version's opening op and closing op) has a
  committed event with that id on the topic, and each id has one payload, byte for byte;
- I2: per session the done/trivial results the ingest stage took tile its messages exactly
  once, and the applied jobs are exactly the done ones;
- the live value of each slot is what the production rules give when the applied jobs are
  replayed in a plain model (event time per job, a restatement changes nothing), and
- I4: it is the value of the newest message by event time, wherever the README promises it
  (the newest statement's job is the newest job that states the slot: a job that mixes a
  very late message with newer ones takes the newest time);
- replaying the topic into an empty store (``apply_change`` in order) gives the same
  records as the store (checksums) and the same live memories.

Four production issues this machine found are fixed (below, each with its diagnosis; the
tests at the bottom reproduce them minimally); it generates every fault combination.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import os
import sys
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from memstream.contract.events import MemoryEvent
from memstream.memory.applying import apply_change, apply_decision, build_decision
from memstream.memory.coalescing import (
    next_deadline,
    on_message,
    on_result,
    on_session_end,
    on_tick,
)
from memstream.memory.embedding import HashingEmbedder
from memstream.memory.extraction import Extractor, RulesModel
from memstream.memory.fencing import Verdict
from memstream.memory.ingest_state import Policy, Step, UserState
from memstream.memory.model import Memory
from memstream.memory.store import Scope, checksum
from memstream.streams.apply import publish
from memstream.streams.counters import Counters
from memstream.streams.extract import decide_with_retries, failed_decision, skip_decided
from memstream.streams.stage import Work
from memstream.topics.publishing import is_public, public_event
from memstream.topics.schemas import (
    ChatMessage,
    ExtractionJob,
    JobDecision,
    JobMessage,
    JobResult,
    JobStatus,
    MemoryChange,
    TriggerReason,
)
from tests.unit.builders import make_store

pytestmark = pytest.mark.unit

# Production issues the machine found (each was a strict xfail until fixed):
#
# 1. (fixed) A restatement did not refresh the live version's event time; now a NOOP
#    against an older live version restates it (RESTATE: ``extra.restated_ts``), and the
#    plain model below follows: a statement older than the newest statement of the live
#    value becomes history.
# 2. (fixed) A failed copy of a job made its messages decided twice: the ingest stage took
#    copy 1's FAILED, retried the range under a new seq and dropped copy 2's DONE as stale.
#    Now a failed job that was re-sent goes again as the same job and stays in flight, so
#    any copy's result closes it; the machine fails any copy at any time.
# 3. (fixed) A half-applied decision overtaken by another decision of its job lost its
#    events: D1 killed between its writes, a copy decided against that store (D2) applied
#    first, D1 back as DONE published only D2's kept events. Now D1, back, also publishes
#    its own changes the store holds and D2 did not publish (memory.applying.overtaken_writes);
#    the machine hands a half-applied decision over in any order.
# 4. (fixed) A copy fenced because a memory it read moved on, while another copy of its job
#    was half-applied, made the ingest stage re-issue the range under a new seq and then
#    drop the other copy's DONE as stale (decided twice). Now a job fenced while the store
#    holds an earlier seq goes again as itself and stays in flight
#    (tests/unit/memory/test_fencing.py shows the rule).
# 5. (fixed) A copy decided against a half-applied store, which updated the version the
#    other copy had added, was applied first: its UPDATE was published before that ADD and
#    a replay failed. Now a decision that read a version written at its job's seq or later
#    (``read_pending``) is fenced until that decision is applied.

T0 = 1_767_225_600  # 2026-01-01T00:00:00Z, the simulated clock's start (whole seconds)
P = Policy(min_new_messages=3, context_messages=2, idle_timeout_s=100, job_timeout_s=300,
           retry_backoff_s=10, retry_backoff_max_s=40, late_grace_s=30,
           forget_after_s=1e9)  # sessions are never forgotten: their seqs never restart
SETTINGS = SimpleNamespace(job_timeout_s=P.job_timeout_s, job_deadline_fraction=0.8,
                           extract_backoff_s=0.01, extract_backoff_max_s=0.01,
                           extract_retries=0, archive=True)
USERS = ("u1", "u2")
SESSIONS = ("a", "b")
# text -> (slot, the content the rules model extracts); None: nothing to remember
TEXTS: dict[str, tuple[str, str] | None] = {
    "I live in Lisbon": ("residence", "Lives in Lisbon"),
    "We moved from Lisbon to Madrid last week.": ("residence", "Lives in Madrid"),
    "We moved from Madrid to Berlin last week.": ("residence", "Lives in Berlin"),
    "please remember I live in Lisbon": ("residence", "Lives in Lisbon"),  # explicit: at once
    "we have 2 kids": ("children", "Has 2 children"),
    "so we have 3 kids now": ("children", "Has 3 children"),
    "ok": None,  # trivial
}
ASSISTANT = "Sure, noted."  # never extracted; a job of only these and "ok" is trivial
_tenants = itertools.count()


class Crash(Exception):
    """The apply worker was killed (SIGKILL) in the middle of a store write sequence."""


class Killable:
    """The store, killed before its ``budget``-th write (``write``/``set_cursor``/``erase``)."""

    def __init__(self, store: Any, budget: int) -> None:
        self._store = store
        self._budget = budget
        self.writes = 0

    def _spend(self) -> None:
        if self.writes == self._budget:
            raise Crash
        self.writes += 1

    def write(self, *args: Any, **kwargs: Any) -> None:
        self._spend()
        self._store.write(*args, **kwargs)

    def set_cursor(self, *args: Any, **kwargs: Any) -> None:
        self._spend()
        self._store.set_cursor(*args, **kwargs)

    def erase(self, *args: Any, **kwargs: Any) -> int:
        self._spend()
        return int(self._store.erase(*args, **kwargs))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


@dataclass
class Slot:
    """The plain model of one user's single-valued slot, following the production rules:
    a fact's event time is its own message's; a statement older than the live value's newest
    statement (its own or a restatement's) becomes history; a restatement moves that time."""

    value: str | None = None
    made: float = -math.inf  # event time of the statement that made the live version
    confirmed: float = -math.inf  # newest statement of the live value (restatements too)


@dataclass
class Env:
    live: Any
    replay: Any
    loop: asyncio.AbstractEventLoop


def ts_of(m: ChatMessage) -> float:
    return m.ts.timestamp()


class PipelineMachine(RuleBasedStateMachine):
    def __init__(self, env: Env) -> None:
        super().__init__()
        self.env = env
        self.tenant = f"pm{next(_tenants)}"
        self.store = env.live
        self.extractor = Extractor(RulesModel(), HashingEmbedder(), env.live)
        self.now = float(T0)
        self.ingest = {u: UserState(self.tenant, u) for u in USERS}
        # the topics
        self.jobs: list[ExtractionJob] = []  # extraction-jobs, not yet taken
        self.deciding: list[ExtractionJob] = []  # taken, checked against the cursor
        self.decisions: dict[str, list[JobDecision]] = {u: [] for u in USERS}  # partitions
        self.results: list[JobResult] = []  # job-results, not yet taken by the ingest stage
        self.topic: list[bytes] = []  # memory-changes: committed events, in order
        self.events: list[MemoryEvent] = []  # memory-events: committed, in order
        self.payloads: dict[str, bytes] = {}  # change id -> its one payload
        # what happened, for the checks
        self.sent: dict[tuple[str, int], ExtractionJob] = {}  # (job id, seq) -> job as sent
        self.max_seq = dict.fromkeys(USERS, 0)
        self.accepted: dict[str, list[ChatMessage]] = {u: [] for u in USERS}
        self.last: dict[str, ChatMessage] = {}
        self.count: Counter[tuple[str, str]] = Counter()  # (user, session) -> messages taken
        self.covered: dict[tuple[str, str], list[tuple[int, int]]] = defaultdict(list)
        self.done: dict[str, list[tuple[str, int, int]]] = {u: [] for u in USERS}
        self.applied: dict[str, list[ExtractionJob]] = {u: [] for u in USERS}  # in order
        self.model: dict[tuple[str, str], Slot] = defaultdict(Slot)
        # per user: a decision killed between its store writes, until it is applied again
        self.half_applied: dict[str, JobDecision | None] = dict.fromkeys(USERS)
        self.cursor_seq = dict.fromkeys(USERS, 0)
        self.p: Any = SimpleNamespace(  # what the stages' functions use of a Pipeline
            services=SimpleNamespace(store=env.live, extractor=self.extractor,
                                     model=self.extractor.model,
                                     embedder=self.extractor.embedder),
            settings=SETTINGS, counters=Counters(), user_keys=None,
            topics=SimpleNamespace(memory_changes=SimpleNamespace(name="changes"),
                                   memory_events=SimpleNamespace(name="events"),
                                   job_results=SimpleNamespace(name="results")),
            waiters=SimpleNamespace(resolve=lambda *_: None), clock=lambda: self.now)

    # --- plumbing --------------------------------------------------------------------------

    def run(self, coro: Any) -> Any:
        return self.env.loop.run_until_complete(coro)

    def scope(self, user: str) -> Scope:
        return Scope(self.tenant, user)

    def absorb(self, user: str, step: Step) -> None:
        """The ingest stage's outputs of one record (its transaction always commits)."""
        assert len(step.jobs) <= 1, "one job in flight per user"
        for job in step.jobs:
            key = (job.job_id, job.seq)
            if key in self.sent:  # a re-send after the job timeout: same id, seq, range
                first = self.sent[key]
                assert (job.from_seq, job.to_seq, job.attempt > 1) == (
                    first.from_seq, first.to_seq, True)
            else:
                assert job.seq > self.max_seq[user], "job seqs strictly increase"
                self.max_seq[user] = job.seq
                self.sent[key] = job
            self.jobs.append(ExtractionJob.model_validate_json(job.dumps()))
        for res in step.resolved:
            assert res.status == JobStatus.TRIVIAL and res.llm_calls == 0
            self.covered[(user, res.session_id)].append((res.from_seq, res.to_seq))
        self.ingest[user] = step.state

    def take_result(self, res: JobResult) -> None:
        user = res.user_id
        step = on_result(self.ingest[user], res, self.now, P)
        if not step.duplicate and res.status in (JobStatus.DONE, JobStatus.TRIVIAL):
            self.covered[(user, res.session_id)].append((res.from_seq, res.to_seq))
            self.done[user].append((res.session_id, res.from_seq, res.to_seq))
        self.absorb(user, step)

    def send_decision(self, decision: JobDecision) -> None:
        self.decisions[decision.user_id].append(JobDecision.model_validate_json(decision.dumps()))

    def extract(self, job: ExtractionJob, fail: bool = False) -> None:
        """The extract stage, one job: the cursor check, then decide (or fail)."""
        skipped = self.run(skip_decided(self.p, job))
        if skipped is not None:
            event("extract: at or below the cursor, not decided")
            self.send_decision(skipped)
        elif fail:
            self.send_decision(failed_decision(job, "model unavailable"))
        else:
            self.send_decision(self.run(decide_with_retries(self.p, job)))

    def apply(self, user: str, index: int, how: str, budget: int = 0) -> None:
        """The apply stage, one decision of the user's partition, as one transaction."""
        half = self.half_applied[user]
        decision = self.decisions[user][index]
        store = Killable(self.store, budget) if how == "killed_mid_write" else self.store
        try:
            applied = apply_decision(store, decision)
        except Crash:
            if isinstance(store, Killable) and store.writes:
                event("apply killed between two store writes")
                self.half_applied[user] = decision
            return  # nothing committed: the decision is read again after the restart
        if decision is half:
            self.half_applied[user] = None
        event(f"apply {how}: {applied.verdict.value} -> {applied.status.value}")
        self.note_applied(decision, applied)
        key = f"{self.tenant}/{user}".encode()
        work = Work()
        self.run(publish(self.p, work, key, decision, applied))
        if how in ("killed_after_write", "killed_mid_write"):
            return  # the transaction is aborted: its events and its result are lost
        for topic, _, value in work.out:
            assert value is not None
            if topic == "changes":
                change = MemoryChange.model_validate_json(value)
                first = self.payloads.setdefault(change.change_id, value)
                assert first == value, f"change {change.change_id} published with two payloads"
                self.topic.append(value)
            elif topic == "events":  # downstream's copy: right after its change event
                public = MemoryEvent.model_validate_json(value)
                assert public == public_event(MemoryChange.model_validate_json(self.topic[-1]))
                self.events.append(public)
            else:
                self.results.append(JobResult.model_validate_json(value))
        if how != "at_least_once":  # at least once: committed, but read again
            del self.decisions[user][index]

    def note_applied(self, decision: JobDecision, applied: Any) -> None:
        user = decision.user_id
        if applied.verdict != Verdict.APPLY or applied.status not in (JobStatus.DONE,
                                                                      JobStatus.TRIVIAL):
            return
        job = self.sent[(decision.job_id, decision.seq)]
        for other in self.applied[user]:
            assert other.seq != job.seq, f"job {job.seq} applied twice"
            if other.session_id == job.session_id:
                assert other.to_seq <= job.from_seq or job.to_seq <= other.from_seq, (
                    f"messages applied twice: {other.from_seq, other.to_seq} and "
                    f"{job.from_seq, job.to_seq} of session {job.session_id}")
        self.applied[user].append(job)
        self.follow(user, job)

    def follow(self, user: str, job: ExtractionJob) -> None:
        """The plain model of the slots, one applied job."""
        for m in sorted(job.messages, key=lambda m: (m.ts, m.seq)):
            said = TEXTS.get(m.content) if m.role == "user" else None
            if said is None:
                continue
            event_time = m.ts.timestamp()  # a fact is dated by the message that states it
            slot, value = said
            s = self.model[(user, slot)]
            if s.value is None:
                s.value, s.made, s.confirmed = value, event_time, event_time
            elif value == s.value:
                s.confirmed = max(s.confirmed, event_time)
            elif event_time < s.confirmed:
                pass  # older than the live value's newest statement: history, never live
            else:
                s.value, s.made, s.confirmed = value, event_time, event_time

    def busy(self, user: str) -> bool:
        state = self.ingest[user]
        return state.in_flight is not None or any(
            s.count > s.watermark for s in state.sessions.values())

    # --- rules: the chat services ---------------------------------------------------------

    @rule(user=st.sampled_from(USERS), session=st.sampled_from(SESSIONS),
          run=st.lists(st.tuples(st.sampled_from([*TEXTS, ASSISTANT]),
                                 st.sampled_from([0, 0, 0, 40, 90, 250])),
                       min_size=1, max_size=4))
    def messages(self, user: str, session: str, run: list[tuple[str, int]]) -> None:
        """A run of messages of one session, each written ``lag`` seconds before it
        arrives (another producer held it back): out of event-time order."""
        for text, lag in run:
            n = sum(map(len, self.accepted.values()))
            when = self.now - lag + n / 1000  # unique event times
            msg = ChatMessage(tenant_id=self.tenant, user_id=user, session_id=session,
                              message_id=f"{user}-{n}", role="assistant" if text == ASSISTANT
                              else "user", content=text, ts=datetime.fromtimestamp(when, UTC))
            step = on_message(self.ingest[user], msg, self.now, P)
            assert not step.duplicate
            self.accepted[user].append(msg)
            self.last[user] = msg
            self.count[(user, session)] += 1
            self.absorb(user, step)

    @precondition(lambda self: self.last)
    @rule(i=st.integers(0, 1))
    def producer_retry(self, i: int) -> None:
        """A producer sends a user's last message again (same message id)."""
        user = sorted(self.last)[i % len(self.last)]
        step = on_message(self.ingest[user], self.last[user], self.now, P)
        assert step.duplicate and step.state == self.ingest[user]

    @rule(user=st.sampled_from(USERS), session=st.sampled_from(SESSIONS))
    def session_end(self, user: str, session: str) -> None:
        self.absorb(user, on_session_end(self.ingest[user], session, self.now, P, self.now))

    # --- rules: time -----------------------------------------------------------------------

    @rule(dt=st.sampled_from([1, 30, 120, 400]))
    def clock(self, dt: int) -> None:
        """Time passes; the ticker ticks every user (idle flush, job-timeout re-send, retry
        after backoff)."""
        self.now += dt
        for user in USERS:
            self.absorb(user, on_tick(self.ingest[user], self.now, P))

    # --- rules: the extract stage ----------------------------------------------------------

    @precondition(lambda self: self.jobs)
    @rule(i=st.integers(0, 7), how=st.sampled_from(
        ["decide", "decide", "duplicate", "duplicate", "drop", "fail", "race"]))
    def take_job(self, i: int, how: str) -> None:
        """Take a job (any of the pending: delayed / reordered) and decide it; ``duplicate``
        keeps it to be taken again; ``drop`` loses it (only the ingest stage's timeout
        brings it back); ``race``: its cursor check passes now, its decision comes later."""
        job = self.jobs[i % len(self.jobs)]
        if how != "duplicate":
            self.jobs.remove(job)
        if how == "drop":
            return
        if how == "race":
            if self.run(skip_decided(self.p, job)) is None:
                self.deciding.append(job)
                return
            how = "decide"
        if how == "fail":
            self.fail(job)
        else:
            self.extract(job)

    def fail(self, job: ExtractionJob) -> None:
        """The extraction fails (the model is unavailable until the job's deadline), whatever
        other copy of the job exists or is applied."""
        self.extract(job, fail=True)

    @precondition(lambda self: self.deciding)
    @rule(i=st.integers(0, 3))
    def decide_late(self, i: int) -> None:
        """A job whose cursor check passed earlier is decided against the store as it is now
        (the apply stage may have applied another decision of it meanwhile)."""
        job = self.deciding.pop(i % len(self.deciding))
        self.send_decision(self.run(decide_with_retries(self.p, job)))

    # --- rules: the apply stage ------------------------------------------------------------

    @precondition(lambda self: any(self.decisions.values()))
    @rule(i=st.integers(0, 1), how=st.sampled_from(
        ["commit", "commit", "killed_after_write", "killed_mid_write", "at_least_once"]),
        budget=st.integers(0, 3))
    def apply_next(self, i: int, how: str, budget: int) -> None:
        """The next decision of a user's partition; killed after the store write (the
        transaction with its events aborts), killed between two store writes, or applied
        and published but read again (at-least-once)."""
        users = [u for u in USERS if self.decisions[u]]
        self.apply(users[i % len(users)], 0, how, budget)

    @precondition(lambda self: any(len(q) > 1 for q in self.decisions.values()))
    @rule(i=st.integers(0, 1), j=st.integers(0, 3), how=st.sampled_from(
        ["commit", "killed_after_write", "killed_mid_write"]), budget=st.integers(0, 3))
    def apply_handed_over_late(self, i: int, j: int, how: str, budget: int) -> None:
        """A later decision of a partition first: around a restart Faust can drop a fetched
        record, which memstream hands over again once a later one was taken (README,
        "No commit passes a record still being handled")."""
        users = [u for u in USERS if len(self.decisions[u]) > 1]
        user = users[i % len(users)]
        event("apply: a later decision handed over first")
        self.apply(user, 1 + j % (len(self.decisions[user]) - 1), how, budget)

    # --- rules: the ingest stage's results -------------------------------------------------

    @precondition(lambda self: self.results)
    @rule(i=st.integers(0, 7), how=st.sampled_from(["take", "take", "duplicate", "drop"]))
    def deliver_result(self, i: int, how: str) -> None:
        res = self.results[i % len(self.results)]
        if how != "duplicate":
            self.results.remove(res)
        if how != "drop":
            self.take_result(res)

    # --- invariants after every step ---------------------------------------------------------

    @invariant()
    def the_cursor_never_moves_back(self) -> None:
        for user in USERS:
            cursor = self.store.cursor(self.scope(user))
            seq = cursor.seq if cursor else 0
            assert seq >= self.cursor_seq[user], "the cursor moved back"
            self.cursor_seq[user] = seq

    @invariant()
    def one_live_memory_per_slot(self) -> None:
        for user in USERS:
            # A half-applied decision may show two live versions until it is applied again
            # (README: "visibly half-done"); its replay rewrites an ADD's version as ACTIVE
            # before the UPDATE after it closes it again.
            if self.half_applied[user] is None:
                self.check_slots(user)

    def check_slots(self, user: str) -> list[Memory]:
        live = self.store.list(self.scope(user))
        by_slot = Counter(m.slot for m in live)
        for slot, n in by_slot.items():
            assert n == 1, f"{user}: {n} live memories of slot {slot}: " + ", ".join(
                m.content for m in live if m.slot == slot)
        return live

    # --- the end: drain, then the end-to-end checks ------------------------------------------

    def drain(self) -> None:
        for _ in range(2000):
            user = next((u for u in USERS if self.decisions[u]), None)
            if user is not None:
                self.apply(user, 0, "commit")
            elif self.deciding:
                self.send_decision(self.run(decide_with_retries(self.p, self.deciding.pop(0))))
            elif self.jobs:
                self.extract(self.jobs.pop(0))
            elif self.results:
                self.take_result(self.results.pop(0))
            else:
                due = [d for u in USERS if self.busy(u)
                       and (d := next_deadline(self.ingest[u], P)) is not None]
                if not due:
                    return
                self.now = max(self.now, min(due))
                for u in USERS:
                    self.absorb(u, on_tick(self.ingest[u], self.now, P))
        raise AssertionError("the pipeline did not drain")

    def teardown(self) -> None:
        if sys.exc_info()[0] is not None:
            return  # a step failed: that is the report, not what draining would say
        self.drain()
        for user in USERS:
            self.check_user(user)

    def check_user(self, user: str) -> None:
        scope = self.scope(user)
        state = self.ingest[user]
        assert state.in_flight is None and not self.busy(user)
        # I2: the done / trivial results the ingest stage took tile each session once, and
        # the jobs applied to the store are exactly the done ones
        for session in SESSIONS:
            position = 0
            for start, end in sorted(self.covered[(user, session)]):
                assert start == position, f"{user}/{session}: gap or overlap at {start}"
                position = end
            assert position == self.count[(user, session)]
        assert sorted(self.done[user]) == sorted(
            (j.session_id, j.from_seq, j.to_seq) for j in self.applied[user])

        # I3: every change the store holds has its committed event, one payload per id
        on_topic = {MemoryChange.model_validate_json(v).change_id for v in self.topic}
        records = self.store.list(scope, statuses=None)
        for m in records:
            assert m.source.op_id in on_topic, f"{m.content} v{m.version}: no event"
            closed_by = m.extra.get("closed_by")
            assert closed_by is None or closed_by in on_topic, f"{m.content}: close lost"
        assert len(self.payloads) == len(on_topic)
        # I3b: downstream's public events carry the same changes, in the same order
        # (a restatement is not a public event)
        assert [e.change_id for e in self.events] == [
            c.change_id for c in map(MemoryChange.model_validate_json, self.topic)
            if is_public(c)]

        # the live values: the plain model (production rules), and I4 where promised
        live = self.check_slots(user)
        for slot in ("residence", "children"):
            model = self.model[(user, slot)]
            values = [m for m in live if m.slot == slot]
            assert [m.content for m in values] == ([model.value] if model.value else [])
            if values:
                assert values[0].source.event_ts == model.made
            self.check_newest_wins(user, slot, values)

        # replaying the topic into an empty store gives the same store
        for value in self.topic:
            change = MemoryChange.model_validate_json(value)
            if change.user_id == user:
                apply_change(self.env.replay, change)
        rebuilt = self.env.replay.list(scope, statuses=None)
        assert sorted((m.memory_id, m.version, m.content) for m in rebuilt if m.live) == sorted(
            (m.memory_id, m.version, m.content) for m in live)
        assert checksum.compare(
            checksum.digests(self.store.scan(self.tenant, user, vectors=True)),
            checksum.digests(self.env.replay.scan(self.tenant, user, vectors=True))).ok
        assert len(rebuilt) == len(records)

    def check_newest_wins(self, user: str, slot: str, values: list[Memory]) -> None:
        """I4: the live value is the newest statement's (by event time) when that
        statement's job is the newest job stating the slot."""
        said = [m for m in self.accepted[user] if (TEXTS.get(m.content) or ("", ""))[0] == slot
                and m.role == "user"]
        if not said:
            assert values == []
            return
        newest = max(said, key=ts_of)
        jobs = [j for j in self.applied[user]
                if any((TEXTS.get(m.content) or ("", ""))[0] == slot for m in j.messages)]
        [mine] = [j for j in jobs if newest.message_id in {m.message_id for m in j.messages}]

        def when(j: ExtractionJob) -> float:
            return max(m.ts.timestamp() for m in j.messages)

        late = any(ts_of(m) < ts_of(p) for p, m in itertools.pairwise(self.accepted[user]))
        if any(when(j) > when(mine) for j in jobs if j is not mine):
            event("I4 not promised: a job mixed a late statement with newer messages")
            return
        event(f"I4 checked ({'out of' if late else 'in'} event-time order)")
        expected = TEXTS[newest.content]
        assert expected is not None
        assert [m.content for m in values] == [expected[1]], (
            f"{user}/{slot}: live {[m.content for m in values]}, newest statement "
            f"{newest.content!r}")


# --- running it ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    """One store for every example (each gets a tenant of its own: an empty scope), one for
    the replays, one event loop (the stages' functions are async)."""
    base = tmp_path_factory.mktemp("pipeline")
    dim = HashingEmbedder().dim
    live, replay = make_store("edge", base / "live", dim), make_store("edge", base / "replay", dim)
    loop = asyncio.new_event_loop()
    yield Env(live, replay, loop)
    loop.run_until_complete(loop.shutdown_default_executor())
    loop.close()
    live.close()
    replay.close()


def test_the_pipeline_through_faults(env: Env) -> None:
    class OnTheseStores(PipelineMachine):
        def __init__(self) -> None:
            super().__init__(env)

    run_state_machine_as_test(
        OnTheseStores,
        # 100 x 30 in the test command; benchmarks/machine.py runs the nightly size
        settings=settings(max_examples=int(os.environ.get("MEMSTREAM_MACHINE_EXAMPLES", "100")),
                          stateful_step_count=int(os.environ.get("MEMSTREAM_MACHINE_STEPS", "30")),
                          deadline=None,
                          suppress_health_check=[HealthCheck.too_slow]))


# --- the issues the machine found, minimal ------------------------------------------------------

def _job(tenant: str, texts_at: list[tuple[str, float]], seq: int, start: int = 0
         ) -> ExtractionJob:
    """A job of user u1 whose messages were written at ``T0 + at``."""
    msgs = [JobMessage(seq=start + i, message_id=f"m{start + i}", role="user", content=text,
                       ts=datetime.fromtimestamp(T0 + at, UTC))
            for i, (text, at) in enumerate(texts_at)]
    return ExtractionJob(job_id=f"j{seq}", seq=seq, tenant_id=tenant, user_id="u1",
                         session_id="s1", from_seq=start, to_seq=start + len(msgs),
                         reason=TriggerReason.THRESHOLD, messages=msgs,
                         created_at=datetime.fromtimestamp(T0, UTC))


def _decide(env: Env, job: ExtractionJob, now: float) -> JobDecision:
    ex = Extractor(RulesModel(), HashingEmbedder(), env.live)
    return build_decision(job, ex.decide(job, now), ex.model, now)


def _decide_and_apply(env: Env, job: ExtractionJob, now: float) -> None:
    assert apply_decision(env.live, _decide(env, job, now)).verdict == Verdict.APPLY


def _live(env: Env, tenant: str) -> list[str]:
    return sorted(m.content for m in env.live.list(Scope(tenant, "u1")))


def test_a_late_move_older_than_a_restatement_is_history(env: Env) -> None:
    tenant = f"pm{next(_tenants)}"
    _decide_and_apply(env, _job(tenant, [("I live in Lisbon", 0)], 1), T0 + 100)
    _decide_and_apply(env, _job(tenant, [("I live in Lisbon", 30)], 2, 1), T0 + 200)  # NOOP
    # written at t=20, delivered last
    late = _job(tenant, [("We moved from Lisbon to Madrid last week.", 20)], 3, 2)
    _decide_and_apply(env, late, T0 + 300)
    assert _live(env, tenant) == ["Lives in Lisbon"]  # the newest statement (t=30)


def test_a_late_job_with_two_old_statements_keeps_one_live_value(env: Env) -> None:
    """Found by the machine, fixed in d8c5239: the first late statement became history,
    the extractor's overlay offered it to the second as live, which updated it to an
    ACTIVE version 2 next to the real live memory."""
    tenant = f"pm{next(_tenants)}"
    _decide_and_apply(env, _job(tenant, [("We moved from Lisbon to Madrid last week.", 30)],
                                1), T0 + 100)
    # both written before the move to Madrid, delivered after it, in one job
    late = _job(tenant, [("We moved from Madrid to Berlin last week.", 5),
                         ("I live in Lisbon", 10)], 2, 1)
    _decide_and_apply(env, late, T0 + 200)
    assert _live(env, tenant) == ["Lives in Madrid"]  # not also "Lives in Lisbon"


def test_a_failed_copy_of_a_re_sent_job_does_not_reopen_its_range(env: Env) -> None:
    tenant = f"pm{next(_tenants)}"
    state = UserState(tenant, "u1")
    texts = ["I live in Lisbon", "We moved from Lisbon to Madrid last week.", "ok"]
    for i, text in enumerate(texts):
        step = on_message(state, ChatMessage(
            tenant_id=tenant, user_id="u1", session_id="s1", message_id=f"m{i}", role="user",
            content=text, ts=datetime.fromtimestamp(T0 + i, UTC)), T0 + i, P)
        state = step.state
    [job] = step.jobs  # seq 1, messages [0, 3)
    step = on_tick(state, T0 + 400, P)  # no result within the job timeout: re-sent
    [again], state = step.jobs, step.state
    assert (again.job_id, again.seq) == (job.job_id, job.seq) == (job.job_id, 1)
    # copy 1: the model is down, the job fails; copy 2: decided and applied
    failed = apply_decision(env.live, failed_decision(job, "model unavailable"))
    done = apply_decision(env.live, _decide(env, again, T0 + 410))
    assert (failed.status, done.status) == (JobStatus.FAILED, JobStatus.DONE)
    # the results in that order: FAILED keeps the job in flight (the same job goes again
    # after the backoff), so DONE still finds it and closes the range
    step = on_result(state, JobResult.for_job(job, JobStatus.FAILED,
                                              datetime.fromtimestamp(T0 + 411, UTC)), T0 + 411, P)
    assert step.jobs == [] and step.state.in_flight is not None
    [retry] = on_tick(step.state, T0 + 430, P).jobs  # were DONE slower: the same job again
    assert (retry.job_id, retry.seq, retry.from_seq, retry.to_seq) == (job.job_id, 1, 0, 3)
    assert apply_decision(env.live, _decide(env, retry, T0 + 431)).verdict == Verdict.DONE
    step = on_result(step.state, JobResult.for_job(again, JobStatus.DONE,
                                                   datetime.fromtimestamp(T0 + 432, UTC)),
                     T0 + 432, P)
    assert not step.duplicate and step.state.in_flight is None
    assert step.state.sessions["s1"].watermark == 3 and on_tick(step.state, T0 + 500, P).jobs == []
    history = sorted((m.version, m.content) for m in env.live.list(
        Scope(tenant, "u1"), statuses=None))
    assert history == [(1, "Lives in Lisbon"), (2, "Lives in Madrid")]  # decided once


def test_a_half_applied_decision_overtaken_publishes_its_events(env: Env) -> None:
    tenant = f"pm{next(_tenants)}"
    job = _job(tenant, [("I live in Lisbon", 0)], 1)
    d1 = _decide(env, job, T0 + 100)  # ADD "Lives in Lisbon"
    with pytest.raises(Crash):  # killed after the change's write, before the cursor's
        apply_decision(Killable(env.live, 1), d1)
    # a copy decided against the half-applied store by a model that did not look there
    # (one that read d1's write waits for d1: the next test)
    d2 = _decide(env, job, T0 + 400).model_copy(update={"read_versions": {},
                                                         "read_pending": []})
    assert d2.changes == [] and d2.decision_id != d1.decision_id  # NOOP: "already known"
    published = apply_decision(env.live, d2).publish  # handed over before d1
    again = apply_decision(env.live, d1)  # d1 comes back: DONE, d2's kept events (none)
    # and its own write, which d2 did not publish
    assert again.verdict == Verdict.DONE
    published += again.publish
    held = {m.source.op_id for m in env.live.list(Scope(tenant, "u1"), statuses=None)}
    assert held <= {c.change_id for c in published}, "a stored change never published"


def test_a_copy_that_read_a_half_applied_decision_waits_for_it(env: Env) -> None:
    """Found by the machine: d1 killed after its ADD; d2, decided against that store,
    updated the ADD's version and was applied first, so its UPDATE was published before
    the ADD (which only d1 publishes) and a replay of the topic failed on it."""
    tenant = f"pm{next(_tenants)}"
    job = _job(tenant, [("we have 2 kids", 0), ("so we have 3 kids now", 5)], 1)
    d1 = _decide(env, job, T0 + 100)  # ADD 2 children, UPDATE it to 3
    assert [c.op for c in d1.changes] == ["add", "update"]
    with pytest.raises(Crash):  # killed after the ADD, before the UPDATE and the cursor
        apply_decision(Killable(env.live, 1), d1)
    d2 = _decide(env, job, T0 + 400)  # a copy, against the half-applied store
    [added] = d2.read_pending  # it read the version d1 added
    assert added == d1.changes[0].memory_id and d2.changes
    first = apply_decision(env.live, d2)  # handed over before d1: not applied, goes again
    assert (first.verdict, first.status, first.applied_seq) == (
        Verdict.FENCED, JobStatus.FENCED, 0) and first.publish == []
    published = apply_decision(env.live, d1).publish  # d1 back: completed
    assert [c.op for c in published] == ["add", "update"]
    retry = apply_decision(env.live, _decide(env, job, T0 + 500))  # the same job again
    assert retry.verdict == Verdict.DONE
    published += retry.publish
    for change in published:  # the topic replays in its order
        apply_change(env.replay, change)
    assert _live(env, tenant) == ["Has 3 children"] == sorted(
        m.content for m in env.replay.list(Scope(tenant, "u1")))
