"""Running LOCOMO through the real pipeline: a worker per trigger policy, the conversations
produced to its messages topic with their own timestamps, every question asked through
:class:`~memstream.client.AsyncMemoryClient` (``benchmarks/locomo.py`` is the command).

Per policy it reports, per category and overall: evidence recall@5 / @10 (no LLM needed)
and the mean lineage width of what was retrieved, for each :data:`VIEWS` entry (memories
only, archived turns only, both fused, width-capped, and the fusion's ablations); with an
answering endpoint J (LLM as judge), F1 and BLEU-1 (of the memories); then extraction
calls and tokens per 100 messages (from the decisions topic), memories per conversation,
search latency p50 / p95, and the answer context's tokens against the whole conversation's.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memstream.client import AsyncMemoryClient
from memstream.client._ops import Sources, TurnMatch
from memstream.contract.http_api.api import RecallItem, SearchResponse
from memstream.core.kafka_io import TopicReader, send_events, start_producer
from memstream.core.settings import Settings
from memstream.dev.locomo import (
    QA,
    Conversation,
    Retrieved,
    Tally,
    covered,
    events,
    merge,
    tokens,
)
from memstream.dev.locomo_judge import Judge
from memstream.dev.process import WorkerProcess
from memstream.topics.layout import create_topics
from memstream.topics.registry import all_topic_names, delete_topics, registry
from memstream.topics.schemas import ChatMessage, JobDecision

ADMIN = "locomo-admin-key-0123456789abcdef0"
TENANT = "locomo"


@dataclass
class Policy:
    """One row of the side-by-side: a name and the settings it changes."""

    name: str
    overrides: dict[str, Any] = field(default_factory=dict)


POLICIES = {
    "per-turn": Policy("per-turn", {"min_new_messages": 1}),
    "shipped": Policy("shipped (>= 4)", {}),
    "6": Policy("threshold 6", {"min_new_messages": 6}),
    "8": Policy("threshold 8", {"min_new_messages": 8}),
}


@dataclass(frozen=True)
class Ask:
    """A search's fusion options (contract.http_api.api.SearchRequest)."""

    sources: Sources = "fused"
    turn_match: TurnMatch = "hybrid"
    recency: bool = True


@dataclass(frozen=True)
class View:
    """One way of asking, and what of its answer is scored."""

    name: str
    ask: Ask = Ask()
    items: bool = True  # the fused ``items`` (else the ``memories``)
    capped: bool = False  # width-capped recall (memstream.dev.locomo.Retrieved.counts)


FUSED = Ask()
MEMORIES = "memories"
VIEWS = (
    View(MEMORIES, items=False),  # the ``memories`` of the fused request: unchanged by it
    View("memories, width-capped", items=False, capped=True),
    View("turns", Ask(sources="turns")),
    View("fused"),  # = the hybrid ablation row: dense and sparse turns, recency
    View("fused, width-capped", capped=True),
    View("fused: dense turns only", Ask(turn_match="dense")),
    View("fused: sparse turns only", Ask(turn_match="sparse")),
    View("fused: no recency", Ask(recency=False)),
)


@dataclass
class Scores:
    """One view's tally and the lineage width of every item it retrieved."""

    tally: Tally = field(default_factory=Tally)
    widths: list[int] = field(default_factory=list)

    def add(self, qa: QA, top: Sequence[Retrieved], capped: bool) -> None:
        self.tally.add(qa, top, capped)
        self.widths.extend(len(r.turns) for r in top)

    @property
    def width(self) -> float:
        return round(statistics.mean(self.widths), 2) if self.widths else 0.0

    def summary(self) -> dict[str, Any]:
        rows = {k: self.tally.row(k) for k in sorted(self.tally.asked)}
        return {"lineage_turns_mean": self.width, "categories": {
            k: {f: row[f] for f in ("questions", "recall@5", "recall@10")}
            for k, row in rows.items()}}


@dataclass
class Result:
    policy: str
    tally: Tally  # the memories view's (J, F1, BLEU-1 too: the answers are from memories)
    messages: int = 0
    jobs: int = 0
    failed: int = 0  # jobs that ended failed (a dead letter each)
    covered: int = 0  # messages a job result covers (decided, trivial or failed)
    llm_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    memories: list[int] = field(default_factory=list)  # live memories per conversation
    search_ms: list[float] = field(default_factory=list)
    context_tokens: list[int] = field(default_factory=list)
    conversation_tokens: list[int] = field(default_factory=list)
    views: dict[str, Scores] = field(default_factory=dict)
    seconds: float = 0.0

    def __post_init__(self) -> None:
        for v in VIEWS:
            self.views.setdefault(v.name, Scores())
        self.views[MEMORIES].tally = self.tally

    def per_100(self, n: int) -> float:
        return round(100 * n / self.messages, 2) if self.messages else 0.0

    def summary(self) -> dict[str, Any]:
        def pct(xs: Sequence[float], q: int) -> float | None:
            return round(statistics.quantiles(xs, n=100)[q - 1], 2) if len(xs) > 1 else None

        return {
            "policy": self.policy, "messages": self.messages,
            "messages_covered": self.covered, "jobs": self.jobs,
            "jobs_per_100_messages": self.per_100(self.jobs), "jobs_failed": self.failed,
            "llm_calls_per_100_messages": self.per_100(self.llm_calls),
            "prompt_tokens_per_100_messages": self.per_100(self.prompt_tokens),
            "completion_tokens_per_100_messages": self.per_100(self.completion_tokens),
            "memories_per_conversation": round(statistics.mean(self.memories), 1)
            if self.memories else 0,
            "search_ms_p50": pct(self.search_ms, 50), "search_ms_p95": pct(self.search_ms, 95),
            "context_tokens_mean": round(statistics.mean(self.context_tokens), 1)
            if self.context_tokens else 0,
            "conversation_tokens_mean": round(statistics.mean(self.conversation_tokens), 1)
            if self.conversation_tokens else 0,
            "lineage_turns_mean": self.views[MEMORIES].width,
            "seconds": round(self.seconds, 1),
            "categories": {k: self.tally.row(k) for k in sorted(self.tally.asked)},
            "views": {name: v.summary() for name, v in self.views.items()},
        }


def interleave(evs: Sequence[Any]) -> list[Any]:
    """Round-robin over users, each user's order kept: many conversations at once, as a
    chat service sees them (a user's next turn comes after the others' turns)."""
    per_user: dict[str, list[Any]] = {}
    for e in evs:
        per_user.setdefault(e.key(), []).append(e)
    queues = [list(reversed(q)) for q in per_user.values()]
    out: list[Any] = []
    while any(queues):
        for q in queues:
            if q:
                out.append(q.pop())
    return out


async def _produce(settings: Settings, evs: list[Any], pace_s: float) -> None:
    topics = registry(settings)
    producer = await start_producer(settings)
    try:
        for e in interleave(evs):  # one by one: a session's end after its messages
            topic = topics.messages if isinstance(e, ChatMessage) else topics.session_events
            await send_events(producer, topic.name, [e])
            if pace_s:
                await asyncio.sleep(pace_s)
    finally:
        await producer.stop()


async def _decided(settings: Settings, expected: int, timeout: float, stall_s: float,
                   progress: Callable[[int], None],
                   ) -> tuple[list[JobDecision], int, int, int]:
    """Every decision, the number of jobs (trivial ones included) and of failed ones, and
    how many messages the results cover: decided, trivial, or failed (a job a model cannot
    answer ends failed with its dead letter; its retry is not waited for). Waits until all
    ``expected`` are covered, or nothing new was covered for ``stall_s``: a user whose range
    keeps failing holds its later messages back (the watermark never passes them)."""
    topics = registry(settings)
    reader = await TopicReader(settings, topics.decisions.name, topics.job_results.name).start()
    seen: set[tuple[str, str, int]] = set()  # (user, session, message seq in the session)
    read = 0
    moved = time.monotonic()

    def done(records: list[Any]) -> bool:
        nonlocal read, moved
        before = len(seen)
        for r in records[read:]:
            if r.topic == topics.job_results.name:
                seen.update(covered([json.loads(r.value)]))
        read = len(records)
        if len(seen) != before:
            progress(len(seen) - before)
            moved = time.monotonic()
        return len(seen) >= expected or time.monotonic() - moved > stall_s

    try:
        await reader.wait_for(done, timeout)
        await reader.settle(1.0)
    finally:
        await reader.stop()
    results = [json.loads(r.value) for r in reader.records
               if r.topic == topics.job_results.name]
    jobs = {d["job_id"] for d in results}
    failed = {d["job_id"] for d in results if d["status"] == "failed"}
    return [JobDecision.model_validate_json(r.value) for r in reader.records
            if r.topic == topics.decisions.name], len(jobs), len(failed), len(seen)


def llm_costs(decisions: Sequence[JobDecision]) -> tuple[int, int, int]:
    """LLM calls, prompt and completion tokens of the jobs decided (a job decided twice,
    after a crash, counts once)."""
    jobs = {d.job_id: d for d in decisions}.values()
    return (sum(d.llm_calls for d in jobs), sum(d.prompt_tokens for d in jobs),
            sum(d.completion_tokens for d in jobs))


def lineages(decisions: Sequence[JobDecision]) -> dict[str, frozenset[str]]:
    """Every turn any version of a memory came from (a merged memory: its parts' too)."""
    turns: defaultdict[str, set[str]] = defaultdict(set)
    merged: defaultdict[str, set[str]] = defaultdict(set)
    for d in decisions:
        for c in d.changes:
            if c.lineage.kind == "extraction":
                turns[c.memory_id] |= set(c.lineage.message_ids)
            merged[c.memory_id] |= set((c.after or {}).get("extra", {}).get("merged", ()))
    return {m: frozenset(turns[m].union(*(turns[x] for x in merged[m])))
            for m in set(turns) | set(merged)}


def stated_turns(decisions: Sequence[JobDecision], said: dict[tuple[str, float], str],
                 ) -> dict[str, frozenset[str]]:
    """The turns that stated each memory: the message whose event time a version (or a
    restatement of it) carries, found in ``said`` ((user, event time) -> message id; a
    merged memory: its parts' too). Only the rules model names the stating message; a
    model's version carries its job's newest message's time, so give ``said`` empty then
    (width-capped recall counts only narrow lineages: ``Retrieved.counts``)."""
    stated: defaultdict[str, set[str]] = defaultdict(set)
    merged: defaultdict[str, set[str]] = defaultdict(set)
    for d in decisions:
        for c in d.changes:
            after = c.after or {}
            if c.lineage.kind == "extraction":
                times = ((after.get("source") or {}).get("event_ts"),
                         (after.get("extra") or {}).get("restated_ts"))
                stated[c.memory_id].update(said[key] for t in times if t is not None
                                           if (key := (c.user_id, round(float(t), 3))) in said)
            merged[c.memory_id] |= set((after.get("extra") or {}).get("merged", ()))
    return {m: frozenset(stated[m].union(*(stated[x] for x in merged[m])))
            for m in set(stated) | set(merged)}


@dataclass(frozen=True)
class Known:
    """What the decisions say of each memory: its lineage and the turns that stated it."""

    turns: dict[str, frozenset[str]]
    stated: dict[str, frozenset[str]]

    def memory(self, memory_id: str, score: float, content: str) -> Retrieved:
        return Retrieved(memory_id, score, self.turns.get(memory_id, frozenset()), content,
                         "memory", self.stated.get(memory_id, frozenset()))

    def item(self, item: RecallItem) -> Retrieved:
        if item.kind == "memory":
            return self.memory(item.id, item.score, item.content)
        ids = frozenset(item.message_ids)  # the turn and the one before it
        return Retrieved(item.id, item.score, ids, item.content, "turn",
                         frozenset(item.message_ids[-1:]))


async def _ask(client: AsyncMemoryClient, conv: Conversation, qa: QA, k: int,
               known: Known, result: Result) -> dict[str, list[Retrieved]]:
    """Every view's top ``k``, both speakers asked and merged by score. The fused request
    is asked first, one speaker after the other (its latency is the one reported, its hits
    recorded as before); the ablations' requests then at once, their hits not recorded."""
    found: dict[tuple[str, Ask], SearchResponse] = {}
    for user in conv.users:
        started = time.perf_counter()
        found[user, FUSED] = await client.search(
            qa.question, user_id=user, limit=k, sources=FUSED.sources,
            turn_match=FUSED.turn_match, recency=FUSED.recency)
        result.search_ms.append((time.perf_counter() - started) * 1000)
    asks = list(dict.fromkeys((user, v.ask) for v in VIEWS for user in conv.users
                              if (user, v.ask) not in found))
    answers = await asyncio.gather(*(client.search(
        qa.question, user_id=user, limit=k, sources=a.sources, turn_match=a.turn_match,
        recency=a.recency, record_hits=False) for user, a in asks))
    found.update(zip(asks, answers, strict=True))
    out = {}
    for v in VIEWS:
        per_user = [found[user, v.ask] for user in conv.users]
        out[v.name] = merge(*([known.item(i) for i in f.items] if v.items else
                              [known.memory(m.memory_id, m.score, m.content)
                               for m in f.memories] for f in per_user), k=k)
    return out


async def run_policy(policy: Policy, conversations: Sequence[Conversation], base: Settings,
                     work: Path, *, k: int = 10, limit: int | None = None,
                     judge: Judge | None = None, timeout: float = 1800.0,
                     pace_s: float = 0.0, stall_s: float = 120.0,
                     progress: Callable[[str, int], None] = lambda what, n: None) -> Result:
    """One worker on ``policy``: produce, wait, ask; its topics are deleted afterwards."""
    tag = uuid.uuid4().hex[:8]
    settings = base.model_copy(update={
        "topic_prefix": f"locomo-{tag}", "app_id": f"locomo-{tag}", "data_dir": work / tag,
        "extract_enabled": True, "web_enabled": True, "admin_key": ADMIN,
        **policy.overrides})
    result = Result(policy.name, Tally())
    evs = [e for conv in conversations for e in events(conv, TENANT)]
    result.messages = sum(isinstance(e, ChatMessage) for e in evs)
    await create_topics(settings)
    worker = WorkerProcess(settings, work / f"worker-{tag}.log")
    started = time.perf_counter()
    try:
        await asyncio.to_thread(worker.start, 180.0)
        waiting = asyncio.create_task(_decided(settings, result.messages, timeout, stall_s,
                                               lambda n: progress("messages", n)))
        await _produce(settings, evs, pace_s)
        decisions, result.jobs, result.failed, result.covered = await waiting
        # the stating message is known from its event time (the rules model's only)
        said = {(e.user_id, round(e.ts.timestamp(), 3)): e.message_id for e in evs
                if isinstance(e, ChatMessage)} if settings.llm == "rules" else {}
        known = Known(lineages(decisions), stated_turns(decisions, said))
        result.llm_calls, result.prompt_tokens, result.completion_tokens = llm_costs(decisions)
        url = f"http://{settings.web_host}:{settings.web_port}"
        async with AsyncMemoryClient(url, ADMIN, tenant_id=TENANT, timeout=60.0) as client:
            for conv in conversations:
                result.memories.append(sum([len(await client.get_all(user_id=u))
                                            for u in conv.users]))
                whole = tokens(" ".join(t.text for t in conv.turns))
                for qa in conv.qa[:limit]:
                    views = await _ask(client, conv, qa, k, known, result)
                    for v in VIEWS:
                        result.views[v.name].add(qa, views[v.name], v.capped)
                    top = views[MEMORIES]
                    result.context_tokens.append(tokens("\n".join(r.content for r in top)))
                    result.conversation_tokens.append(whole)
                    if judge is not None and qa.category != 5:  # no gold answer to judge
                        answer, correct = await asyncio.to_thread(judge.score, qa, top)
                        result.tally.judge(qa, correct, answer)
                    progress("questions", 1)
    finally:
        result.seconds = time.perf_counter() - started
        await asyncio.to_thread(worker.stop)
        await delete_topics(settings, all_topic_names(settings))
    return result
