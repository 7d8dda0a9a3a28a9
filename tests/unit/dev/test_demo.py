"""The demo's own logic (``memstream demo``): its samples dated days apart, a question for
every user, how it prints a `context` answer, and the verdict of its verified rebuild."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from memstream.dev import demo
from memstream.memory.store import checksum
from memstream.ops.rebuild_shards import ShardsRebuilt, verdict_line
from memstream.topics.schemas import ChatMessage

pytestmark = pytest.mark.unit
NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def test_each_conversation_is_dated_in_order_and_ends_its_days_before_now():
    events = demo.load_samples(NOW)
    sessions: dict[str, list] = {}
    for e in events:
        sessions.setdefault(e.session_id, []).append(e.ts)  # type: ignore[attr-defined]
    for session, stamps in sessions.items():
        assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps), session
        assert stamps[-1] == NOW - timedelta(days=demo.DAYS_AGO.get(session, 0)), session
    assert set(demo.DAYS_AGO) <= set(sessions)
    # a fact and the one that replaced it were said on different days
    said = {e.content: e.ts for e in events if isinstance(e, ChatMessage)}
    assert said["Hi, I live in Berlin."].date() < said[
        "I need to update my delivery address, I moved from Berlin to Munich last week."].date()
    # a budget "this month" lasts 30 days from when it was said: still live in the demo
    assert max(demo.DAYS_AGO.values()) < 30
    assert len({e.message_id for e in events if isinstance(e, ChatMessage)}) == sum(
        isinstance(e, ChatMessage) for e in events)


def test_every_user_of_the_samples_is_asked_a_question_of_their_own():
    users = {(e.tenant_id, e.user_id) for e in demo.load_samples(NOW)}  # type: ignore[attr-defined]
    assert set(demo.QUERIES) == users
    assert len(set(demo.QUERIES.values())) == len(users)


def _item(kind: str, content: str, stale: str | None = None) -> SimpleNamespace:
    return SimpleNamespace(kind=kind, content=content, stale=stale)


def test_a_context_answer_shows_the_memories_the_block_holds_and_the_block():
    ctx = SimpleNamespace(
        memories=[SimpleNamespace(content="Lives in Munich", score=1.84)],
        items=[_item("memory", "Lives in Munich"), _item("turn", "we moved to Munich"),
               _item("turn", "Hi, I live in Berlin.", "superseded")],
        truncated=False,
        prompt_block="## What you remember about the user\n- (2026-02-21) Lives in Munich\n"
                     "## From earlier conversations (newest first)\n- (2026-02-01, replaced "
                     "2026-02-21 by: Lives in Munich) [user] Hi, I live in Berlin.")
    lines = demo.context_lines("acme", "alice", "Where does the user live?", ctx)
    assert lines[0] == "  acme/alice asks: Where does the user live?"
    assert lines[1] == "    memories in the block: Lives in Munich (1.84)"
    assert lines[2] == "    earlier turns in the block: 2, 1 superseded since"
    assert lines[3] == "    prompt block:"
    assert lines[4:] == [f"      {x}" for x in ctx.prompt_block.splitlines()]

    # an item without the staleness fields (an older worker) counts as current; an empty
    # block says so
    bare = SimpleNamespace(memories=[], items=[SimpleNamespace(kind="turn", content="hi")],
                           truncated=True, prompt_block="")
    lines = demo.context_lines("acme", "carol", "q", bare)
    assert lines[1:] == ["    memories in the block: none",
                         "    earlier turns in the block: 1   (cut by the budget)",
                         "    prompt block: (empty)"]


def test_the_rebuild_verdict_counts_users_across_shards_and_names_the_differing():
    equal = checksum.compare(checksum.Digests({("t", "a"): (2, "x")}),
                             checksum.Digests({("t", "a"): (2, "x")}))
    differ = checksum.compare(
        checksum.Digests({("t", "b"): (3, "y"), ("t", "c"): (1, "z"), ("t", "d"): (1, "w")}),
        checksum.Digests({("t", "b"): (3, "Y"), ("t", "c"): (1, "z"), ("t", "e"): (1, "v")}))
    done = ShardsRebuilt(ok=False, shards=2, changes=9, verdicts={0: equal, 1: differ})
    v = done.verdict()
    assert (v.users, v.equal, v.differ, v.only_live, v.only_rebuilt) == (
        5, 2, [("t", "b")], [("t", "d")], [("t", "e")])
    assert not v.ok
    assert verdict_line(v, 2) == (
        "5 users compared in 2 shards: 2 equal, 1 differing, 1 only in the live shards, "
        "1 only in the rebuilt ones (e.g. t/b, t/d, t/e)")
    same = ShardsRebuilt(ok=True, shards=1, verdicts={0: equal}).verdict()
    assert verdict_line(same, 1) == "1 user compared in 1 shard: 1 equal, 0 differing"
