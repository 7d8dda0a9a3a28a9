"""Running the knowledge-update stories through the real pipeline (``benchmarks/updates.py``
is the command): topics of their own on the broker, a worker process, every story's
sessions produced to the messages topic with their own timestamps, each ended by its
session-end event; one ``context`` call per story through
:class:`~memstream.client.AsyncMemoryClient` once the job results cover every message, its
prompt block scored by :func:`memstream.dev.updates_score.score`. The topics are deleted
afterwards; the worker's data directory is kept only when asked (``keep``), with every
answer beside it.

Sessions are delivered in rounds, as sessions weeks apart are in real life: round ``n``
is every story's ``n``-th session (users interleaved, as a chat service sends them), its
session ends a moment after its messages, and the next round is produced once the job
results cover it. A session is then decided with every earlier one applied, whatever the
extraction's latency: the job boundaries, and so a model's prompts, are the same from run
to run (``--recorded`` replays them), unless an end still overtakes its session's last
message on the way in (the messages and the ends are two topics).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from memstream.client import AsyncMemoryClient
from memstream.core.kafka_io import TopicReader, send_events, start_producer
from memstream.core.settings import Settings
from memstream.dev.locomo import covered
from memstream.dev.locomo_run import interleave, llm_costs
from memstream.dev.process import WorkerProcess
from memstream.dev.updates_score import Verdict, score
from memstream.dev.updates_stories import Story, events
from memstream.topics.layout import create_topics
from memstream.topics.registry import all_topic_names, delete_topics, registry
from memstream.topics.schemas import ChatMessage, JobDecision, SessionEvent

Event = ChatMessage | SessionEvent
ADMIN = "updates-admin-key-0123456789abcdef"
ENDS_AFTER_S = 1.0  # a round's session ends are sent this long after its messages
TENANT = "updates"


@dataclass
class Run:
    """What one run measured: a verdict per story and the pipeline's counts."""

    verdicts: list[Verdict] = field(default_factory=list)
    answers: list[dict[str, Any]] = field(default_factory=list)  # per story: block, items
    messages: int = 0
    covered: int = 0  # messages a job result covers (decided, trivial or failed)
    jobs: int = 0
    failed: int = 0
    llm_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    produce_to_covered_s: float = 0.0
    seconds: float = 0.0

    def pipeline(self) -> dict[str, Any]:
        ms = [v.context_ms for v in self.verdicts]
        return {"messages": self.messages, "messages_covered": self.covered,
                "jobs": self.jobs, "jobs_failed": self.failed, "llm_calls": self.llm_calls,
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens,
                "produce_to_covered_s": round(self.produce_to_covered_s, 1),
                "context_ms_p50": round(statistics.median(ms), 1) if ms else None,
                "context_ms_max": round(max(ms), 1) if ms else None,
                "seconds": round(self.seconds, 1)}


def _session_parts(stories: Sequence[Story]) -> dict[tuple[str, str], str]:
    """(user, session id) -> the session's part."""
    return {(s.id, x.id(n)): x.part for s in stories for n, x in enumerate(s.sessions)}


class Coverage:
    """The job results and decisions of the run's topics, read once from the beginning:
    how many messages the results cover (decided, trivial, or failed: a job a model cannot
    answer ends failed with its dead letter; its retry is not waited for)."""

    def __init__(self, settings: Settings, progress: Callable[[int], None]) -> None:
        self.topics = registry(settings)
        self.reader = TopicReader(settings, self.topics.decisions.name,
                                  self.topics.job_results.name)
        self.progress = progress
        self.seen: set[tuple[str, str, int]] = set()  # (user, session, seq in the session)
        self.read = 0

    def fold(self) -> None:
        before = len(self.seen)
        for r in self.reader.records[self.read:]:
            if r.topic == self.topics.job_results.name:
                self.seen.update(covered([json.loads(r.value)]))
        self.read = len(self.reader.records)
        if len(self.seen) != before:
            self.progress(len(self.seen) - before)

    async def until(self, expected: int, deadline: float, stall_s: float) -> bool:
        """Wait until ``expected`` messages are covered (True), or nothing new was covered
        for ``stall_s``, or ``deadline`` (monotonic) passed: a user whose range keeps
        failing holds its later messages back (the watermark never passes them)."""
        moved, count = time.monotonic(), len(self.seen)

        def done(_: Any) -> bool:
            nonlocal moved, count
            self.fold()
            if len(self.seen) != count:
                moved, count = time.monotonic(), len(self.seen)
            return count >= expected or time.monotonic() - moved > stall_s

        with contextlib.suppress(TimeoutError):
            await self.reader.wait_for(done, max(0.0, deadline - time.monotonic()))
        return len(self.seen) >= expected

    def results(self) -> tuple[list[JobDecision], int, int]:
        """Every decision, the number of jobs (trivial ones included) and of failed ones."""
        results = [json.loads(r.value) for r in self.reader.records
                   if r.topic == self.topics.job_results.name]
        decisions = [JobDecision.model_validate_json(r.value) for r in self.reader.records
                     if r.topic == self.topics.decisions.name]
        return (decisions, len({d["job_id"] for d in results}),
                len({d["job_id"] for d in results if d["status"] == "failed"}))


def rounds(stories: Sequence[Story], tenant: str) -> list[tuple[list[Event], list[Event]]]:
    """Round ``n``: every story's ``n``-th session, its messages (users interleaved), then
    its end."""
    out: list[tuple[list[Event], list[Event]]] = []
    for story in stories:
        sessions: dict[str, list[Event]] = {}
        for e in events(story, tenant):
            sessions.setdefault(e.session_id, []).append(e)
        for n, evs in enumerate(sessions.values()):
            if n == len(out):
                out.append(([], []))
            out[n][0].extend(e for e in evs if isinstance(e, ChatMessage))
            out[n][1].extend(e for e in evs if not isinstance(e, ChatMessage))
    return [(interleave(said), ends) for said, ends in out]


async def run(stories: Sequence[Story], base: Settings, work: Path, *,
              timeout: float = 1800.0, stall_s: float = 120.0, pace_s: float = 0.0,
              keep: Path | None = None,
              progress: Callable[[str, int], None] = lambda what, n: None) -> Run:
    """Produce the stories round by round, wait until the job results cover each round,
    ask each story's question once. ``keep``: the worker's data directory (and its log,
    and ``answers.jsonl``) go there and stay; else under ``work``."""
    tag = uuid.uuid4().hex[:8]
    home = keep if keep is not None else work / tag
    settings = base.model_copy(update={
        "topic_prefix": f"updates-{tag}", "app_id": f"updates-{tag}",
        "data_dir": home / "worker", "extract_enabled": True, "web_enabled": True,
        "admin_key": ADMIN})
    result = Run()
    parts = _session_parts(stories)
    home.mkdir(parents=True, exist_ok=True)
    await create_topics(settings)
    worker = WorkerProcess(settings, home / "worker.log")
    started = time.perf_counter()
    try:
        await asyncio.to_thread(worker.start, 180.0)
        coverage = Coverage(settings, lambda n: progress("messages", n))
        topics = registry(settings)
        deadline = time.monotonic() + timeout
        produced = time.perf_counter()
        await coverage.reader.start()
        producer = None
        try:
            producer = await start_producer(settings)
            for said, ends in rounds(stories, TENANT):
                for e in said if pace_s else []:
                    await send_events(producer, topics.messages.name, [e])
                    await asyncio.sleep(pace_s)
                if not pace_s:  # one topic: each user's order is kept
                    await send_events(producer, topics.messages.name, said)
                # The ends go to another topic, read at its own pace: sent once the
                # messages had time to arrive, so that an end seldom overtakes the last
                # message of its session (which would split the session in two jobs).
                await asyncio.sleep(ENDS_AFTER_S)
                await send_events(producer, topics.session_events.name, ends)
                result.messages += len(said)
                await coverage.until(result.messages, deadline, stall_s)
            await coverage.reader.settle(1.0)
            coverage.fold()
        finally:
            if producer is not None:
                await producer.stop()
            await coverage.reader.stop()
        result.produce_to_covered_s = time.perf_counter() - produced
        result.covered = len(coverage.seen)
        decisions, result.jobs, result.failed = coverage.results()
        result.llm_calls, result.prompt_tokens, result.completion_tokens = llm_costs(decisions)
        url = f"http://{settings.web_host}:{settings.web_port}"
        async with AsyncMemoryClient(url, ADMIN, tenant_id=TENANT, timeout=60.0) as client:
            for story in stories:
                asked = time.perf_counter()
                ctx = await client.context(story.question, user_id=story.id, limit=story.k,
                                           budget_chars=story.budget_chars)
                ms = (time.perf_counter() - asked) * 1000
                live = await client.get_all(user_id=story.id)
                filler = [i for i in ctx.items
                          if parts.get((story.id, i.session_id)) == "filler"]
                verdict = replace(
                    score(story, ctx.prompt_block), context_ms=ms, memories=len(live),
                    memory_items=sum(i.kind == "memory" for i in ctx.items),
                    turn_items=sum(i.kind == "turn" for i in ctx.items),
                    filler_items=len(filler))
                result.verdicts.append(verdict)
                result.answers.append({
                    "id": story.id, "question": story.question,
                    "prompt_block": ctx.prompt_block, "truncated": ctx.truncated,
                    "items": [i.model_dump(mode="json") for i in ctx.items],
                    "memories": [m.content for m in live], "verdict": verdict.to_dict()})
                progress("stories", 1)
    finally:
        result.seconds = time.perf_counter() - started
        await asyncio.to_thread(worker.stop)
        await delete_topics(settings, all_topic_names(settings))
        if keep is not None:
            with (keep / "answers.jsonl").open("w", encoding="utf-8") as f:
                for a in result.answers:
                    f.write(json.dumps(a, ensure_ascii=False) + "\n")
    return result
