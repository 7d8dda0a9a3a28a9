"""Re-extraction from the messages topic, the pure part (SPEC §9, ``memstream replay``).

Messages become jobs exactly through the ingest stage's own state machine
(:mod:`memory.coalescing`): each user's messages in topic order, session-end events merged
in by their timestamps, each job completed at once (the next one may follow). Time is the
messages' own: ``now`` is a message's ``ts`` (never earlier than the previous event's), the
idle flush fires at ``last_activity + idle_timeout_s`` between two messages, and what is
still below the threshold at the end of the range is flushed as ``idle`` (the live stage
would do the same ``idle_timeout_s`` later). So job ids, seqs and times, and everything
decided from them, are the same on every run.

Where replay can differ from what the live stage did: live measured idle time and the
late-end grace on the worker's clock (arrival), replay on the messages' timestamps; live
checks timers every ``tick_interval_s`` (a few seconds later than replay's exact deadline);
and live, while a user's job was in flight, held new messages back and folded them into
one later job (coalescing), where replay's jobs complete at once — replay forms the jobs
of an idle pipeline: as many as live at most, often the same.

The budget: a job costs ``calls`` LLM calls (rules model: 0; ``combined``: exactly 1;
``two_step``: 1 extract + 1 decide per candidate fact, known only after the extract call —
estimated as one per user message, bounded by the reply schema's cap of
:data:`FACT_CAP` facts). Tokens are estimated from the prompt texts with
:func:`memory.prompt_block.estimate_tokens` (see :func:`job_cost`).
"""

from __future__ import annotations

import heapq
import json
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache
from typing import Literal

from pydantic import BaseModel

from memstream.core.errors import MemstreamError
from memstream.memory.coalescing import next_deadline, on_message, on_result, on_session_end
from memstream.memory.coalescing import on_tick as tick
from memstream.memory.ingest_state import Policy, Step, UserState
from memstream.memory.llm import openai_model as llm
from memstream.memory.prompt_block import estimate_tokens
from memstream.memory.trigger_rules import is_trivial
from memstream.topics.schemas import (
    ChatMessage,
    ExtractionJob,
    JobResult,
    JobStatus,
    Role,
    SessionEvent,
)

Event = ChatMessage | SessionEvent
Mode = Literal["rules", "combined", "two_step"]
FACT_CAP = 50  # llm.ExtractReply: at most 50 facts per extract reply
ASSUMED_MEMORY_CHARS = 60  # a stored memory line shown to the model (typical, not a bound)
COMPLETION_TOKENS_PER_FACT = 40  # one fact or change in a reply, JSON included (a guess)
COMPLETION_TOKENS_DECIDE = 30  # one {"op", "target", "reason"} reply (a guess)
MAX_TICKS = 100_000  # timer rounds between two events: a guard, never reached


class OverBudget(MemstreamError):
    """The next job's calls would take the run past ``--max-calls``."""


@dataclass(frozen=True)
class Filters:
    """Which messages take part: a time range on the message timestamp (``until``
    exclusive), a tenant, a user."""

    since: datetime | None = None
    until: datetime | None = None
    tenant: str | None = None
    user: str | None = None

    def keeps(self, e: Event) -> bool:
        return ((self.tenant is None or e.tenant_id == self.tenant)
                and (self.user is None or e.user_id == self.user)
                and (self.since is None or e.ts >= self.since)
                and (self.until is None or e.ts < self.until))


def by_user(messages: Iterable[ChatMessage],
            ends: Iterable[SessionEvent] = ()) -> dict[tuple[str, str], list[Event]]:
    """Each user's events in the order the ingest stage meets them: messages in topic order
    (one user's are on one partition), session ends merged in by their timestamps (on
    another topic: live interleaves them by arrival; ties: the message first)."""
    msgs: dict[tuple[str, str], list[ChatMessage]] = defaultdict(list)
    done: dict[tuple[str, str], list[SessionEvent]] = defaultdict(list)
    for m in messages:
        msgs[(m.tenant_id, m.user_id)].append(m)
    for e in ends:
        done[(e.tenant_id, e.user_id)].append(e)
    out: dict[tuple[str, str], list[Event]] = {}
    for key in sorted(set(msgs) | set(done)):
        mine: list[Event] = list(msgs[key])
        theirs: list[Event] = list(done[key])
        out[key] = list(heapq.merge(mine, theirs, key=_when))
    return out


def _when(e: Event) -> datetime:
    return e.ts


@dataclass
class Plan:
    """The jobs a replay runs, in run order, and what the machine saw."""

    jobs: list[ExtractionJob] = field(default_factory=list)
    messages: int = 0
    session_ends: int = 0
    duplicates: int = 0  # a message id seen again in its session (a producer retry)
    trivial: int = 0  # jobs resolved without a call (all user messages acknowledgements)
    users: int = 0

    def by_reason(self) -> dict[str, int]:
        return dict(sorted(Counter(j.reason.value for j in self.jobs).items()))


def _complete(step: Step, now: float, policy: Policy, out: Plan) -> UserState:
    """Every job the step emitted completes at once; the jobs that follow too."""
    out.trivial += len(step.resolved)
    state, pending = step.state, list(step.jobs)
    while pending:
        job = pending.pop(0)
        out.jobs.append(job)
        step = on_result(state, JobResult.for_job(job, JobStatus.DONE, job.created_at), now,
                         policy)
        out.trivial += len(step.resolved)
        state = step.state
        pending += step.jobs
    return state


def _tick_until(state: UserState, until: float, policy: Policy, out: Plan) -> UserState:
    """The timers (idle flush, forgetting quiet sessions) due up to ``until``, in order."""
    for _ in range(MAX_TICKS):
        due = next_deadline(state, policy)
        if due is None or due > until:
            return state
        state = _complete(tick(state, due, policy), due, policy, out)
    raise RuntimeError(f"timers of {state.tenant_id}/{state.user_id} never settle")


def plan_user(events: Sequence[Event], policy: Policy, out: Plan, flush: bool = True) -> None:
    """Run one user's events through the ingest machine; jobs go to ``out.jobs``."""
    if not events:
        return
    state = UserState(events[0].tenant_id, events[0].user_id)
    now = -math.inf
    for e in events:
        at = max(now, e.ts.timestamp())
        state = _tick_until(state, at, policy, out)
        now = at
        if isinstance(e, ChatMessage):
            out.messages += 1
            step = on_message(state, e, now, policy)
            out.duplicates += step.duplicate
        else:
            out.session_ends += 1
            step = on_session_end(state, e.session_id, now, policy, ts=e.ts.timestamp())
        state = _complete(step, now, policy, out)
    if flush:  # the end of the range: what is left is flushed as live's idle timer would
        _tick_until(state, now + policy.idle_timeout_s, policy, out)


def run_order(job: ExtractionJob) -> tuple[datetime, str, str, int]:
    """Jobs by time, then user, then seq: one user's in seq order, the run deterministic."""
    return (job.created_at, job.tenant_id, job.user_id, job.seq)


def plan(events: dict[tuple[str, str], list[Event]], policy: Policy,
         flush: bool = True) -> Plan:
    out = Plan(users=len(events))
    for user_events in events.values():
        plan_user(user_events, policy, out, flush)
    out.jobs.sort(key=run_order)
    return out


# --- the budget -----------------------------------------------------------------------

@dataclass(frozen=True)
class JobCost:
    calls: int  # expected calls (combined: exact; two_step: one decide per user message)
    calls_max: int  # upper bound (two_step: 1 + FACT_CAP)
    prompt_tokens: int
    completion_tokens: int


@cache
def _system(name: str, schema: type[BaseModel]) -> int:
    """Tokens of the system text the model sends (built as :meth:`llm.OpenAIModel._ask`
    builds it)."""
    return estimate_tokens(llm.prompt(name).replace(
        "{schema}", json.dumps(schema.model_json_schema(), ensure_ascii=False)))


def _listing_tokens(shown: int) -> int:
    line = "1. " + "x" * ASSUMED_MEMORY_CHARS + "\n"
    return estimate_tokens("(none)") if shown == 0 else shown * estimate_tokens(line)


def user_facts(job: ExtractionJob) -> int:
    """The user messages of a job that can carry a fact (not acknowledgements)."""
    return sum(1 for m in job.messages if m.role == Role.USER and not is_trivial(m.content))


def job_cost(job: ExtractionJob, mode: Mode, top_k: int, known: int) -> JobCost:
    """Calls and tokens of one job. ``known``: memories the user is assumed to have when
    the job runs (the facts of the user's earlier jobs), so the listing of stored memories
    shown to the model is ``min(k, known)`` lines of :data:`ASSUMED_MEMORY_CHARS`.
    Prompt tokens: the system prompt (schema included) + the user text as the model builds
    it, by :func:`estimate_tokens` (~4 characters per token, one per CJK character; errs
    high); completion tokens: :data:`COMPLETION_TOKENS_PER_FACT` per fact (a guess)."""
    facts = user_facts(job)
    if mode == "rules" or facts == 0:
        return JobCost(0, 0, 0, 0)
    excerpt = estimate_tokens(llm._excerpt(job.messages, job.context))
    if mode == "combined":
        prompt = (_system(llm.COMBINED_PROMPT, llm.CombinedReply)
                  + estimate_tokens("Stored memories:\n\n\n")
                  + _listing_tokens(min(2 * top_k, known)) + excerpt)
        return JobCost(1, 1, prompt, 10 + COMPLETION_TOKENS_PER_FACT * facts)
    extract = _system(llm.EXTRACT_PROMPT, llm.ExtractReply) + excerpt
    decide = (_system(llm.DECIDE_PROMPT, llm.DecideReply)
              + estimate_tokens("Stored memories:\n\n\nNew fact: " + "x" * ASSUMED_MEMORY_CHARS)
              + _listing_tokens(min(top_k, known)))
    return JobCost(1 + facts, 1 + FACT_CAP, extract + facts * decide,
                   10 + COMPLETION_TOKENS_PER_FACT * facts + COMPLETION_TOKENS_DECIDE * facts)


@dataclass(frozen=True)
class Estimate:
    jobs: int
    calls: int
    calls_max: int
    prompt_tokens: int
    completion_tokens: int
    exact: bool  # calls are exact (rules, combined), not an estimate (two_step)

    def line(self) -> str:
        if self.exact:
            return f"LLM calls: {self.calls} (exact, without retries)"
        return (f"LLM calls: ~{self.calls} expected (1 extract + 1 decide per user message), "
                f"at most {self.calls_max} (1 + {FACT_CAP} facts per job: the reply "
                "schema's cap)")


def estimate(jobs: Sequence[ExtractionJob], mode: Mode, top_k: int) -> tuple[Estimate,
                                                                               list[JobCost]]:
    """The whole run's cost, and each job's (in run order)."""
    known: Counter[tuple[str, str]] = Counter()
    costs = []
    for job in jobs:
        key = (job.tenant_id, job.user_id)
        costs.append(job_cost(job, mode, top_k, known[key]))
        known[key] += user_facts(job)
    total = Estimate(
        jobs=len(jobs), calls=sum(c.calls for c in costs),
        calls_max=sum(c.calls_max for c in costs),
        prompt_tokens=sum(c.prompt_tokens for c in costs),
        completion_tokens=sum(c.completion_tokens for c in costs),
        exact=mode != "two_step")
    return total, costs


@dataclass
class Budget:
    """``--max-calls``: a job starts only if its calls fit in what is left. ``combined``
    knows them before the job (1); ``two_step`` checks its extract call (1) before the job
    and its decides (one per candidate) right after the extract, before any decide — so a
    stopped job never has anything applied. Calls count every request, retries included,
    and recorded answers count what they cost when recorded (a replay stops where the
    recorded run stopped). A retried call can take the total past the cap by its retries."""

    max_calls: int | None = None
    spent: int = 0

    def fits(self, calls: int) -> bool:
        return self.max_calls is None or self.spent + calls <= self.max_calls

    def check(self, calls: int, what: str) -> None:
        if not self.fits(calls):
            raise OverBudget(f"{what} needs {calls} call(s); {self.spent} of "
                             f"{self.max_calls} spent")

    def spend(self, calls: int) -> None:
        self.spent += calls


def start_calls(job: ExtractionJob, mode: Mode) -> int:
    """The calls a job must fit before it starts (two_step: its extract)."""
    return 0 if mode == "rules" or user_facts(job) == 0 else 1


def jobs_within(costs: Sequence[int], max_calls: int | None) -> int:
    """How many jobs (in run order, each costing ``costs[i]`` calls) run before the budget
    stops the run at the first one that does not fit."""
    budget = Budget(max_calls)
    for n, calls in enumerate(costs):
        if not budget.fits(calls):
            return n
        budget.spend(calls)
    return len(costs)
