"""The main job on embedded defaults: broker + worker + the bundled sample conversations.

Produces the samples the way a chat service would (keyed tenant/user, interleaved users,
session-end events, one session left to the idle timeout), plays the extractor by
acknowledging each job after ``extract_latency`` seconds (the real extractor arrives with
the memory core), and prints every job emitted plus the calls saved against one
extraction per message.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path

import click

from memstream import broker as local_broker
from memstream.kafka_io import TopicReader, send_events, start_producer
from memstream.process import WorkerProcess
from memstream.settings import Settings
from topics.registry import Topics, create_topics, delete_topics, registry
from topics.schemas import (
    ChatMessage,
    Event,
    ExtractionJob,
    JobResult,
    JobStatus,
    SessionEvent,
)


def load_samples() -> list[Event]:
    """The bundled conversations as events, in conversation order."""
    text = resources.files("memstream").joinpath("samples/conversations.jsonl").read_text("utf-8")
    events: list[Event] = []
    now = datetime.now(UTC)
    for n, line in enumerate(text.splitlines()):
        row = json.loads(line)
        if row.get("event") == "ended":
            events.append(SessionEvent(ts=now, **{k: v for k, v in row.items() if k != "event"}))
        else:
            events.append(ChatMessage(message_id=f"{row['session_id']}-{n}", ts=now, **row))
    return events


def interleave(events: list[Event]) -> list[Event]:
    """Round-robin over users, keeping each user's order: several chats at once."""
    per_user: dict[str, list[Event]] = {}
    for e in events:
        per_user.setdefault(e.key(), []).append(e)
    out: list[Event] = []
    while any(per_user.values()):
        for queue in per_user.values():
            if queue:
                out.append(queue.pop(0))
    return out


@dataclass
class Tally:
    messages: int = 0
    user_turns: int = 0
    jobs: list[ExtractionJob] = field(default_factory=list)
    trivial: list[JobResult] = field(default_factory=list)
    covered: int = 0


async def _extractor(topics: Topics, settings: Settings, tally: Tally, latency: float,
                     expected: int, timeout: float) -> None:
    """Stand-in extractor: acknowledge each job; stop once every message is covered."""
    b = settings.bootstrap_servers
    jobs = await TopicReader(b, topics.jobs.name).start()
    results = await TopicReader(b, topics.job_results.name).start()
    producer = await start_producer(b)
    deadline = time.monotonic() + timeout
    try:
        while tally.covered < expected and time.monotonic() < deadline:
            for record in await jobs.poll(0.1):
                job = ExtractionJob.model_validate_json(record.value)
                tally.jobs.append(job)
                await asyncio.sleep(latency)
                tally.covered += job.to_seq - job.from_seq
                await send_events(producer, topics.job_results.name, [JobResult(
                    job_id=job.job_id, tenant_id=job.tenant_id, user_id=job.user_id,
                    session_id=job.session_id, from_seq=job.from_seq, to_seq=job.to_seq,
                    status=JobStatus.DONE, llm_calls=1, finished_at=datetime.now(UTC),
                )])
            for record in await results.poll(0.05):
                res = JobResult.model_validate_json(record.value)
                if res.status == JobStatus.TRIVIAL:
                    tally.trivial.append(res)
                    tally.covered += res.to_seq - res.from_seq
    finally:
        await producer.stop()
        await jobs.stop()
        await results.stop()


async def _produce(topics: Topics, settings: Settings, events: list[Event], gap: float) -> None:
    producer = await start_producer(settings.bootstrap_servers)
    try:
        for e in events:
            topic = topics.messages if isinstance(e, ChatMessage) else topics.session_events
            await send_events(producer, topic.name, [e])
            await asyncio.sleep(gap)
    finally:
        await producer.stop()


async def _run(settings: Settings, events: list[Event], latency: float) -> Tally:
    topics = registry(settings)
    tally = Tally()
    msgs = [e for e in events if isinstance(e, ChatMessage)]
    tally.messages = len(msgs)
    tally.user_turns = sum(1 for m in msgs if m.role == "user")
    extractor = asyncio.create_task(
        _extractor(topics, settings, tally, latency, len(msgs), timeout=120)
    )
    await _produce(topics, settings, events, gap=0.05)
    await extractor
    return tally


def _report(tally: Tally, settings: Settings) -> None:
    click.echo("\nExtraction jobs emitted (what an LLM would be asked to read):")
    click.echo(f"  {'user':14} {'session':10} {'range':>8} {'msgs':>4}  reason       first message")
    for j in tally.jobs:
        first = j.messages[0].content[:48]
        click.echo(f"  {j.tenant_id + '/' + j.user_id:14} {j.session_id:10} "
                   f"{f'[{j.from_seq},{j.to_seq})':>8} {len(j.messages):>4}  "
                   f"{j.reason.value:12} {first}")
    click.echo(f"\nResolved without an LLM call (all user turns trivial): {len(tally.trivial)}")
    for r in tally.trivial:
        click.echo(f"  {r.tenant_id + '/' + r.user_id:14} {r.session_id:10} "
                   f"[{r.from_seq},{r.to_seq})")
    calls = len(tally.jobs)
    click.echo(
        f"\nmessages: {tally.messages} ({tally.user_turns} user turns)   "
        f"extraction calls: {calls}   trivial resolved: {len(tally.trivial)}\n"
        f"calls avoided vs one per message: {tally.messages - calls} "
        f"({100 * (1 - calls / tally.messages):.0f}% fewer); "
        f"vs one per user turn: {tally.user_turns - calls} "
        f"({100 * (1 - calls / max(tally.user_turns, 1)):.0f}% fewer)\n"
        f"messages covered by completed jobs: {tally.covered}/{tally.messages}"
    )
    by_reason: dict[str, int] = {}
    for j in tally.jobs:
        by_reason[j.reason.value] = by_reason.get(j.reason.value, 0) + 1
    click.echo(f"jobs by trigger: {by_reason}   (threshold: {settings.min_new_messages} "
               f"new messages, idle timeout: {settings.idle_timeout_s:.0f}s)")


def run_demo(base: Settings, *, keep_broker: bool, extract_latency: float) -> None:
    run = f"demo-{uuid.uuid4().hex[:8]}"
    work = Path(tempfile.mkdtemp(prefix="memstream-demo-"))
    settings = base.model_copy(update={
        "topic_prefix": run, "app_id": run, "data_dir": work,
        "idle_timeout_s": 3.0, "tick_interval_s": 0.5, "web_enabled": False,
    })
    local = settings.bootstrap_servers == f"127.0.0.1:{settings.kafka_port}"
    started_broker = False
    if local and local_broker.read_pid(local_broker.paths_for(settings)) is None:
        click.echo(f"starting Apache Kafka {settings.kafka_version} (KRaft) on "
                   f"{settings.bootstrap_servers} ...")
        local_broker.start(settings)
        started_broker = True
    asyncio.run(create_topics(settings))
    worker = WorkerProcess(settings, work / "worker.log")
    click.echo("starting the memstream worker ...")
    worker.start()
    try:
        events = interleave(load_samples())
        click.echo(f"producing {len(events)} sample events from "
                   f"{len({e.key() for e in events})} users ...")
        tally = asyncio.run(_run(settings, events, extract_latency))
        _report(tally, settings)
    finally:
        worker.stop()
        asyncio.run(delete_topics(settings, [t.name for t in registry(settings).all()] + [
            f"{run}-ingest-state-changelog", f"{run}-__assignor-__leader"]))
        shutil.rmtree(work, ignore_errors=True)
        if started_broker and not keep_broker:
            local_broker.stop(settings)
