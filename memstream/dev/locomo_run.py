"""Running LOCOMO through the real pipeline: a worker per trigger policy, the conversations
produced to its messages topic with their own timestamps, every question asked through
:class:`~memstream.client.AsyncMemoryClient` (``benchmarks/locomo.py`` is the command).

Per policy it reports, per category and overall: evidence recall@5 / @10 (no LLM needed),
and with an answering endpoint J (LLM as judge), F1 and BLEU-1; then extraction calls and
tokens per 100 messages (from the decisions topic), memories per conversation, search
latency p50 / p95, and the answer context's tokens against the whole conversation's.
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


@dataclass
class Result:
    policy: str
    tally: Tally
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
    width: list[float] = field(default_factory=list)
    seconds: float = 0.0

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
            "lineage_turns_mean": round(statistics.mean(self.width), 2) if self.width else 0,
            "seconds": round(self.seconds, 1),
            "categories": {k: self.tally.row(k) for k in sorted(self.tally.asked)},
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


async def _ask(client: AsyncMemoryClient, conv: Conversation, qa: QA, k: int,
               turns: dict[str, frozenset[str]], result: Result) -> list[Retrieved]:
    ranked = []
    for user in conv.users:
        started = time.perf_counter()
        found = await client.search(qa.question, user_id=user, limit=k)
        result.search_ms.append((time.perf_counter() - started) * 1000)
        ranked.append([Retrieved(m.memory_id, m.score, turns.get(m.memory_id, frozenset()),
                                 m.content) for m in found.memories])
    return merge(*ranked, k=k)


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
        turns = lineages(decisions)
        for d in {d.job_id: d for d in decisions}.values():
            result.llm_calls += d.llm_calls
            result.prompt_tokens += d.prompt_tokens
            result.completion_tokens += d.completion_tokens
        url = f"http://{settings.web_host}:{settings.web_port}"
        async with AsyncMemoryClient(url, ADMIN, tenant_id=TENANT, timeout=60.0) as client:
            for conv in conversations:
                result.memories.append(sum([len(await client.get_all(user_id=u))
                                            for u in conv.users]))
                whole = tokens(" ".join(t.text for t in conv.turns))
                for qa in conv.qa[:limit]:
                    top = await _ask(client, conv, qa, k, turns, result)
                    result.tally.add(qa, top)
                    result.width.append(sum(len(r.turns) for r in top) / len(top) if top
                                        else 0.0)
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
