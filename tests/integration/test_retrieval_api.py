"""Retrieval, hit recording, the short-term window and agent tools, end to end: a real
broker, one worker serving the HTTP API, the Python client (``memstream.client``).

Every test has a tenant of its own on the module's shared worker and waits on barriers
(a job result, a memory's statistics, an API answer), never on fixed sleeps.
"""

from __future__ import annotations

import asyncio
import itertools
from datetime import UTC, datetime, timedelta
from typing import TypeVar

import pytest
import pytest_asyncio

from memstream.client import AsyncMemoryClient, MemstreamAPIError
from memstream.core.kafka_io import TopicReader
from memstream.core.settings import Settings
from memstream.memory.store import Scope
from memstream.memory.store.edge import EdgeStore
from memstream.memory.store.rebuild_fold import rebuild
from memstream.topics.schemas import AccessEvent, MemoryChange
from memstream.web.keys_topic import create_key
from tests.integration.conftest import free_port, remembered, running, until, wait_covered

pytestmark = pytest.mark.integration
T = TypeVar("T")
ADMIN = "admin-key-7-0123456789abcdef0123456789"


PORT = free_port()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def api(kafka_bootstrap, tmp_path_factory):
    async with running(kafka_bootstrap, tmp_path_factory.mktemp("api"), extract_enabled=True,
                       web_enabled=True, web_port=PORT, admin_key=ADMIN) as h:
        client = AsyncMemoryClient(f"http://127.0.0.1:{PORT}", ADMIN, tenant_id="probe")

        async def healthy() -> bool | None:
            return True if await client.tools() else None

        await until(healthy, "the API to answer", timeout=120)
        await client.aclose()
        yield h


def client_for(h, tenant: str, key: str = ADMIN) -> AsyncMemoryClient:
    return AsyncMemoryClient(f"http://127.0.0.1:{PORT}", key, tenant_id=tenant,
                             bootstrap_servers=h.settings.bootstrap_servers,
                             topic_prefix=h.settings.topic_prefix)


async def test_add_then_context_round_trip(api, tenant):
    async with client_for(api, tenant) as c:
        await remembered(api, c, tenant, "ana", "s1",
                         ["Remember this: I live in Lisbon", "I am allergic to penicillin"])
        ctx = await c.context("where do I live?", user_id="ana", session_id="s1")
    contents = [m.content for m in ctx.memories]
    assert "Lives in Lisbon" in contents
    assert [w.content for w in ctx.window] == ["Remember this: I live in Lisbon",
                                                "I am allergic to penicillin"]
    assert "Lives in Lisbon" in ctx.prompt_block and ctx.query_id


async def test_hits_update_statistics_and_survive_a_rebuild(api, tenant, tmp_path):
    async with client_for(api, tenant) as c:
        await remembered(api, c, tenant, "ben", "s1", ["Remember this: I live in Porto"])
        for _ in range(3):
            found = await c.search("city", user_id="ben")
        memory_id = found.memories[0].memory_id

        async def counted() -> int | None:
            mems = await c.get_all(user_id="ben")
            hit = next(m for m in mems if m.memory_id == memory_id)
            return hit.access_count if hit.access_count >= 3 else None

        assert await until(counted, "three hits folded") == 3
        await c.feedback(found.query_id, memory_id, user_id="ben", useful=True)
        with pytest.raises(MemstreamAPIError) as unknown:  # only memories the user can see
            await c.feedback(found.query_id, "made-up", user_id="ben", useful=True)
        assert unknown.value.status == 404
        live = next(m for m in await c.get_all(user_id="ben") if m.memory_id == memory_id)
    assert live.last_accessed_at is not None
    b = api.settings
    changes = await read_all(b, api.topics.memory_changes.name, MemoryChange, tenant)
    hits = await read_all(b, api.topics.memory_access.name, AccessEvent, tenant)
    store = EdgeStore(tmp_path / "rebuilt", 512)
    try:
        rebuild(store, changes, hits)
        stats = store.access_stats(Scope(tenant, "ben"), [memory_id])[memory_id]
        assert (stats.access_count, stats.last_accessed_at) == (3, live.last_accessed_at)
        assert [m.content for m in store.list(Scope(tenant, "ben"))] == ["Lives in Porto"]
    finally:
        store.close()


async def read_all(settings: Settings, topic: str, model, tenant: str) -> list:
    reader = await TopicReader(settings, topic).start()
    try:
        await reader.settle(1.0)
    finally:
        await reader.stop()
    found = [model.model_validate_json(r.value) for r in reader.records]
    return [x for x in found if x.tenant_id == tenant]


async def test_tool_writes_are_jobs_serialised_with_extraction(api, tenant):
    async with client_for(api, tenant) as c:
        # An extraction burst and a tool write of the same user, at the same time.
        burst = c.add([{"role": "user", "content": t} for t in
                       ["Remember this: I live in Oslo", "we have 2 kids", "I work at Acme",
                        "I prefer short answers"]], user_id="cat", session_id="s1")
        insert = c.execute_tool("memory_insert", {"content": "Prefers window seats"},
                                user_id="cat", tool_call_id="call-1")
        _, done = await asyncio.gather(burst, insert)
        assert done.status in ("ok", "queued"), done
        replaced = await c.execute_tool("core_memory_replace", {
            "label": "profile", "old_content": "", "new_content": "Name: Cat. Lives in Oslo."},
            user_id="cat")
        assert replaced.status in ("ok", "queued"), replaced
        await c.end_session(user_id="cat", session_id="s1")
        await wait_covered(api, {("cat", "s1"): 4}, tenant=tenant)

        async def with_core():
            ctx = await c.context("seats", user_id="cat")
            return ctx if ctx.core.get("profile") and any(
                m.content == "Prefers window seats" for m in ctx.memories) else None

        ctx = await until(with_core, "the tool writes applied")
    assert ctx.prompt_block.index("Name: Cat") < ctx.prompt_block.index("Prefers window seats")
    changes = await read_all(api.settings, api.topics.memory_changes.name,
                             MemoryChange, tenant)
    tool = [x for x in changes if x.lineage.kind == "tool"]
    assert {x.after["content"] for x in tool} == {"Prefers window seats",
                                                 "Name: Cat. Lives in Oslo."}
    inserted = next(x for x in tool if x.after["content"] == "Prefers window seats")
    assert inserted.lineage.message_ids == ["call-1"] and inserted.lineage.actor == "admin"
    # One job of the user in flight at a time: each job is sent only after the previous
    # job's result, whatever its kind; and seqs increase.
    await api.jobs.settle(1.0)
    await api.results.settle(0.5)
    first: dict[int, tuple[int, object]] = {}  # seq -> (when first sent, job): re-sends aside
    for r in api.jobs.records:
        j = _job(r)
        if j.tenant_id == tenant and j.seq not in first:
            first[j.seq] = (r.timestamp, j)
    jobs = [first[seq] for seq in sorted(first)]
    results = {(x.job_id, x.seq): ts for ts, x in _results(api, tenant)}
    assert any(j.tool for _, j in jobs) and any(not j.tool for _, j in jobs)
    for (_, before), (sent, _after) in itertools.pairwise(jobs):
        assert results[(before.job_id, before.seq)] <= sent


def _job(record):
    from memstream.topics.schemas import ExtractionJob

    return ExtractionJob.model_validate_json(record.value)


def _results(h, tenant: str):
    from memstream.topics.schemas import JobResult

    out = []
    for r in h.results.records:
        x = JobResult.model_validate_json(r.value)
        if x.tenant_id == tenant:
            out.append((r.timestamp, x))
    return out


async def test_a_tenant_key_opens_its_tenant_only(api, tenant):
    plaintext, _ = await create_key(api.settings, tenant, "test")
    async with client_for(api, tenant, plaintext) as mine:
        async def works():
            return await mine.get_all(user_id="dan") is not None or None

        await until(works, "the new key to reach the worker")
        other = AsyncMemoryClient(f"http://127.0.0.1:{PORT}", plaintext, tenant_id="zzother")
        with pytest.raises(MemstreamAPIError) as denied:
            await other.search("x", user_id="dan")
        await other.aclose()
        nokey = AsyncMemoryClient(f"http://127.0.0.1:{PORT}", "msk_0_nope", tenant_id=tenant)
        with pytest.raises(MemstreamAPIError) as unknown:
            await nokey.get_all(user_id="dan")
        await nokey.aclose()
    assert (denied.value.status, denied.value.code) == (403, "forbidden")
    assert (unknown.value.status, unknown.value.code) == (401, "unauthorized")


async def test_window_keeps_the_last_turns_across_a_kill(harness, tmp_path):
    port = free_port()
    h = await harness(extract_enabled=True, embedder="hashing", web_enabled=True,
                      web_port=port, admin_key=ADMIN)
    worker = h.worker()
    c = AsyncMemoryClient(f"http://127.0.0.1:{port}", ADMIN, tenant_id="acme",
                          bootstrap_servers=h.settings.bootstrap_servers,
                          topic_prefix=h.settings.topic_prefix)
    try:
        await c.add([{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}"}
                     for i in range(12)], user_id="eve", session_id="w1")
        expected = [f"turn {i}" for i in range(2, 12)]

        async def window():
            ctx = await c.context("turn", user_id="eve", session_id="w1", record_hits=False)
            got = [w.content for w in ctx.window]
            return got if got == expected else None

        assert await until(window, "the window before the kill", 120) == expected
        worker.restart(kill=True, wait=False)  # SIGKILL: no shutdown hook, no flush
        assert await until(window, "the window after the restart", 120) == expected
    finally:
        await c.aclose()


async def test_a_question_only_an_older_sessions_turn_answers_comes_back_with_its_date(
        api, tenant):
    """The episodic archive: what the extractor kept nothing of is still found, in a
    session of months ago, dated; memories alone do not have it."""
    said = datetime(2025, 5, 7, 14, 0, tzinfo=UTC)
    older = [{"role": "user", "content": "The plumber Marco replaced the corroded valve "
              "under our kitchen sink", "ts": said.isoformat()},
             {"role": "assistant", "content": "Good that it was sorted before the holidays",
              "ts": (said + timedelta(minutes=1)).isoformat()}]
    async with client_for(api, tenant) as c:
        await c.add(older, user_id="cleo", session_id="s-old")
        await c.end_session(user_id="cleo", session_id="s-old")
        await wait_covered(api, {("cleo", "s-old"): 2}, tenant=tenant)
        await remembered(api, c, tenant, "cleo", "s-new", ["Remember this: I prefer window seats"])
        found = await c.search("who replaced the valve under the sink?", user_id="cleo",
                               limit=5)
        assert not any("Marco" in m.content for m in found.memories)
        turns = [i for i in found.items if i.kind == "turn"]
        assert turns and "Marco replaced the corroded valve" in turns[0].content
        assert (turns[0].session_id, turns[0].role) == ("s-old", "user")
        assert turns[0].event_time == said.timestamp() and turns[0].message_ids
        ctx = await c.context("who replaced the valve under the sink?", user_id="cleo",
                              session_id="s-new")
        assert "## From earlier conversations" in ctx.prompt_block
        assert "(2025-05-07) [user] The plumber Marco" in ctx.prompt_block
        # the agent's tool: the whole archive, then one session and a time range
        every = await c.execute_tool("conversation_search", {"query": "plumber valve"},
                                     user_id="cleo", session_id="s-new")
        assert "[2025-05-07T14:00] user: The plumber Marco" in every.content
        none = await c.execute_tool("conversation_search", {
            "query": "plumber valve", "since": "2026-01-01T00:00:00Z"}, user_id="cleo")
        assert "Marco" not in none.content
        # another user of the tenant sees nothing of it
        other = await c.search("who replaced the valve under the sink?", user_id="dora")
        assert not [i for i in other.items if i.kind == "turn"]


async def test_after_a_move_the_context_puts_the_new_city_first_and_marks_the_old_one(
        api, tenant):
    """SPEC §9d through the real pipeline: Berlin, other chat, the move to Munich, more
    chat; the agent's context leads with Munich, and the turn that said Berlin says it was
    replaced, when and by what."""
    async def session(sid: str, day: datetime, lines: list[tuple[str, str]]) -> None:
        await c.add([{"role": role, "content": text,
                      "ts": (day + timedelta(minutes=n)).isoformat()}
                     for n, (role, text) in enumerate(lines)], user_id="max", session_id=sid)
        await c.end_session(user_id="max", session_id=sid)
        await wait_covered(api, {("max", sid): len(lines)}, tenant=tenant)

    jan, mar = datetime(2026, 1, 10, 9, tzinfo=UTC), datetime(2026, 3, 2, 18, tzinfo=UTC)
    async with client_for(api, tenant) as c:
        await session("s1", jan, [("user", "Hi, I live in Berlin with my wife."),
                                  ("assistant", "Hello! How is Berlin treating you?")])
        await session("s2", jan + timedelta(days=20), [
            ("user", "How long should I boil an egg for a runny yolk?"),
            ("assistant", "About six minutes.")])
        await session("s3", mar, [("user", "We moved from Berlin to Munich last week."),
                                  ("assistant", "Congratulations on the move!")])
        await session("s4", mar + timedelta(days=3), [
            ("user", "Any tips for a rainy Sunday film?"),
            ("assistant", "Try something slow and warm.")])
        ctx = await c.context("Where does the user live?", user_id="max", limit=5,
                              budget_chars=1500, record_hits=False)
        tool = await c.execute_tool("conversation_search", {"query": "Berlin"}, user_id="max")
    assert ("user: Hi, I live in Berlin with my wife. (replaced 2026-03-02 by: Lives in "
            "Munich)") in tool.content, tool.content
    lines = ctx.prompt_block.splitlines()
    first = next(line for line in lines if "Munich" in line or "Berlin" in line)
    assert first == "- (2026-03-02) Lives in Munich", ctx.prompt_block
    berlin = [line for line in lines if "Berlin with my wife" in line]
    assert berlin == [berlin[0]] and berlin[0].startswith(
        "- (2026-01-10, replaced 2026-03-02 by: Lives in Munich) [user] Hi, I live in Berlin"), (
        ctx.prompt_block)
    assert lines.index(berlin[0]) > lines.index(first)
    assert "boil an egg" not in ctx.prompt_block  # filler is left out
    assert len(lines) == len(set(lines))
    [old] = [i for i in ctx.items if i.kind == "turn" and "Berlin with my wife" in i.content]
    assert old.stale == "superseded" and old.superseded_by is not None
    assert old.superseded_by.content == "Lives in Munich"
    assert old.valid_to == mar.timestamp() and old.line == berlin[0]
    assert ctx.items[0].kind == "memory" and ctx.items[0].content == "Lives in Munich"
