"""The main job on embedded defaults: broker + worker + the bundled sample conversations.

Produces the samples the way a chat service would (keyed tenant/user, interleaved users,
session-end events, one session left to the idle timeout), plays the extractor by
acknowledging each job after ``extract_latency`` seconds (:mod:`memstream.stand_in`; the
real extractor arrives with the memory core), and prints every job emitted plus the calls
saved against one extraction per message.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path

import click

from memstream import broker as local_broker
from memstream.kafka_io import send_events, start_producer
from memstream.process import WorkerProcess
from memstream.settings import Settings
from memstream.stand_in import AckExtractor
from topics.registry import Topics, create_topics, delete_topics, registry
from topics.schemas import ChatMessage, Event, SessionEvent


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


async def _produce(topics: Topics, settings: Settings, events: list[Event], gap: float) -> None:
    producer = await start_producer(settings.bootstrap_servers)
    try:
        for e in events:
            topic = topics.messages if isinstance(e, ChatMessage) else topics.session_events
            await send_events(producer, topic.name, [e])
            await asyncio.sleep(gap)
    finally:
        await producer.stop()


@dataclass
class Tally:
    messages: int
    user_turns: int
    extractor: AckExtractor


async def _run(settings: Settings, events: list[Event], latency: float) -> Tally:
    topics = registry(settings)
    msgs = [e for e in events if isinstance(e, ChatMessage)]
    tally = Tally(len(msgs), sum(1 for m in msgs if m.role == "user"),
                  AckExtractor(settings, latency))
    extractor = asyncio.create_task(tally.extractor.run(len(msgs), timeout=120))
    await _produce(topics, settings, events, gap=0.05)
    await extractor
    return tally


def _report(tally: Tally, settings: Settings) -> None:
    click.echo("\nExtraction jobs emitted (what an LLM would be asked to read):")
    click.echo(f"  {'user':14} {'session':10} {'range':>8} {'msgs':>4}  reason       first message")
    jobs = [j for j, _ in tally.extractor.jobs]
    trivial = tally.extractor.trivial
    for j in jobs:
        first = j.messages[0].content[:48]
        click.echo(f"  {j.tenant_id + '/' + j.user_id:14} {j.session_id:10} "
                   f"{f'[{j.from_seq},{j.to_seq})':>8} {len(j.messages):>4}  "
                   f"{j.reason.value:12} {first}")
    click.echo(f"\nResolved without an LLM call (all user turns trivial): {len(trivial)}")
    for r in trivial:
        click.echo(f"  {r.tenant_id + '/' + r.user_id:14} {r.session_id:10} "
                   f"[{r.from_seq},{r.to_seq})")
    calls = len(jobs)
    click.echo(
        f"\nmessages: {tally.messages} ({tally.user_turns} user turns)   "
        f"extraction calls: {calls}   trivial resolved: {len(trivial)}\n"
        f"calls avoided vs one per message: {tally.messages - calls} "
        f"({100 * (1 - calls / tally.messages):.0f}% fewer); "
        f"vs one per user turn: {tally.user_turns - calls} "
        f"({100 * (1 - calls / max(tally.user_turns, 1)):.0f}% fewer)\n"
        f"messages covered by completed jobs: {tally.extractor.covered}/{tally.messages}"
    )
    by_reason: dict[str, int] = {}
    for j in jobs:
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
