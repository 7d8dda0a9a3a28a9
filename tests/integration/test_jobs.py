"""The windowed jobs on the real broker: reflection, TTL expiry by decay, a crash during a
reflection, and consolidation of a duplicate a sloppy model let in.

Time is travelled with ``clock_offset_s`` (the worker's clock), never by sleeping; waits
are barriers on the memory-change topic.
"""

from __future__ import annotations

import json

import pytest

from memstream.core.kafka_io import TopicReader
from memstream.dev.openai_stub import OpenAITestServer, Reply, chat_json
from memstream.dev.process import WorkerProcess
from memstream.topics.schemas import MemoryChange
from tests.integration.conftest import chat, end, turns, wait_covered

pytestmark = pytest.mark.integration
DAY = 86_400.0


async def changes_of(h, reader: TopicReader, tenant: str, user: str, kind: str | tuple[str, ...],
                     n: int = 1, timeout: float = 90.0,
                     where=lambda c: True) -> list[MemoryChange]:
    kinds = (kind,) if isinstance(kind, str) else kind

    def pick(records) -> list[MemoryChange]:
        out = [MemoryChange.model_validate_json(r.value) for r in records]
        return [c for c in out
                if (c.tenant_id, c.user_id) == (tenant, user) and c.lineage.kind in kinds
                and where(c)]

    def found(records) -> bool:
        return len(pick(records)) >= n

    await reader.wait_for(found, timeout)
    return pick(reader.records)


async def test_reflection_then_ttl_expiry_after_a_crash_mid_reflection(harness, tmp_path):
    h = await harness(extract_enabled=True, embedder="hashing", jobs_enabled=True,
                      reflection_threshold=12,
                      consolidation_interval_s=3600.0, decay_interval_s=2.0)
    worker = h.worker()
    reader = await TopicReader(h.settings, h.topics.memory_changes.name).start()
    try:
        await h.send(*turns("ann", "a1", ["I live in Lisbon", "I work at Acme as a developer",
                                          "My budget for furniture this month is 3000 euros"]),
                     end(session="a1", user="ann"))
        await wait_covered(h, {("ann", "a1"): 6})
        # The facts' importance crosses 12: the jobs agent sends one reflect command. Kill the
        # worker as soon as that job is on its way, before (or while) it is applied.
        await h.jobs.wait_for(lambda rs: any(j.tool and j.tool.name == "reflect"
                                             for j in h.job_list()), 60)
        worker.restart(kill=True, wait=True)
        [first] = await changes_of(h, reader, "acme", "ann", "reflection")
        await reader.settle(2.0)
        everything = [MemoryChange.model_validate_json(r.value) for r in reader.records]
        reflections = {c.change_id for c in everything if c.lineage.kind == "reflection"}
        assert reflections == {first.change_id}  # decided and applied once, not lost
        facts = {c.memory_id for c in everything if c.lineage.kind == "extraction"}
        evidence = set(first.after["extra"]["evidence"])
        assert evidence and evidence <= facts
        assert "Lisbon" in first.after["content"] and first.lineage.actor == "job:reflect"
        # 31 days later: the budget's time to live has passed; the first sweep due expires
        # it (decay and consolidation are both due then: whichever is taken first).
        worker.stop()
        later = h.settings.model_copy(update={"clock_offset_s": 31 * DAY})
        h.workers.append(WorkerProcess(later, tmp_path / "worker-later.log").start())
        gone = await changes_of(h, reader, "acme", "ann", ("decay", "consolidation"),
                                where=lambda c: c.after["status"] == "deleted")
        # one change (a change re-published after a kill comes again with the same id)
        assert len({c.change_id for c in gone}) == 1, [(c.op, c.reason) for c in gone]
        assert "3000" in gone[0].before["content"]
        assert "expired" in gone[0].reason
    finally:
        await reader.stop()


def sloppy_model(request: dict) -> Reply:
    """A model that lets a paraphrase in as a new memory (ADD), then, asked by the
    consolidation pass, judges the pair the same thing (NOOP)."""
    name = request.get("response_format", {}).get("json_schema", {}).get("name", "")
    text = json.dumps(request["messages"][-1]["content"], ensure_ascii=False)
    if name == "CombinedReply":
        fact = "Lives in Lisbon" if "I live in Lisbon" in text else "Home is in Lisbon"
        return chat_json({"changes": [{"op": "ADD", "fact": {"text": fact, "importance": 6}}]})
    if name == "DecideReply":
        return chat_json({"op": "NOOP", "target": 1, "reason": "the same place"})
    return chat_json({})


async def test_a_duplicate_from_two_sessions_is_consolidated(harness):
    with OpenAITestServer(responder=sloppy_model) as llm:
        h = await harness(extract_enabled=True, embedder="hashing", llm="openai", jobs_enabled=True,
                          llm_base_url=llm.url, llm_api_key="k", similarity_threshold=0.3,
                          reflection_threshold=1000, consolidation_interval_s=1.0,
                          decay_interval_s=3600.0)
        h.worker()
        reader = await TopicReader(h.settings,
                                   h.topics.memory_changes.name).start()
        try:
            for session, text in (("b1", "Remember this: I live in Lisbon"),
                                  ("b2", "Remember this: my home is Lisbon")):
                await h.send(chat(text, user="bo", session=session), end(session, "bo"))
                await wait_covered(h, {("bo", session): 1})
            merged = await changes_of(h, reader, "acme", "bo", "consolidation", n=2)
        finally:
            await reader.stop()
    closed = [c for c in merged if c.op == "delete"]
    kept = [c for c in merged if c.op == "update"]
    assert len(closed) == 1 and len(kept) == 1
    assert closed[0].after["extra"]["merged_into"] == kept[0].memory_id
    assert kept[0].after["extra"]["merged"] == [closed[0].memory_id]
    assert {closed[0].before["content"], kept[0].after["content"]} == {
        "Lives in Lisbon", "Home is in Lisbon"}
