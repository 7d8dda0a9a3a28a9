"""``memstream replay`` on the real broker, through the CLI: a dry run, a run recording the
answers of a local OpenAI-compatible server, the same replay offline from the recording
(server stopped) into another store — identical memories —, and --max-calls stopping a run
that --resume then completes."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from memstream.dev.openai_stub import OpenAITestServer, Reply, chat_json
from memstream.memory import rules
from memstream.memory.embedding import UseEmbedder
from memstream.memory.store import Scope
from memstream.memory.store.edge import EdgeStore
from memstream.topics.schemas import ChatMessage, SessionEvent

pytestmark = pytest.mark.integration
T0 = datetime(2026, 2, 1, 9, 0, tzinfo=UTC)
CLI = str(Path(sys.executable).parent / "memstream")


def conversations(tenant: str) -> list[ChatMessage | SessionEvent]:
    """Two users, four sessions: every trigger reason, an UPDATE of a place and a count,
    a trivial-only ending."""
    out: list[ChatMessage | SessionEvent] = []
    at = {"n": 0}

    def say(user: str, session: str, day: int, role: str, text: str) -> None:
        at["n"] += 1
        out.append(ChatMessage(tenant_id=tenant, user_id=user, session_id=session,
                               message_id=f"m{at['n']}", role=role, content=text,
                               ts=T0 + timedelta(days=day, minutes=at["n"])))

    def ended(user: str, session: str, day: int) -> None:
        at["n"] += 1
        out.append(SessionEvent(tenant_id=tenant, user_id=user, session_id=session,
                                ts=T0 + timedelta(days=day, minutes=at["n"])))

    say("ana", "a1", 0, "user", "Hi, I live in Berlin.")
    say("ana", "a1", 0, "assistant", "Hello Ana!")
    say("ana", "a1", 0, "user", "I work at Siemens.")
    ended("ana", "a1", 0)  # 3 messages: session_end
    say("ben", "b1", 0, "user", "I live in Lisbon.")
    say("ben", "b1", 0, "assistant", "Nice city.")
    say("ben", "b1", 0, "user", "I prefer short answers.")
    say("ben", "b1", 0, "assistant", "Understood.")  # threshold
    say("ben", "b1", 0, "user", "thanks")
    ended("ben", "b1", 0)  # trivial only: no call
    say("ana", "a2", 1, "user", "We moved from Berlin to Munich last week.")
    say("ana", "a2", 1, "assistant", "Congratulations!")
    say("ana", "a2", 1, "user", "I have 2 children.")
    say("ana", "a2", 1, "assistant", "Lovely.")  # threshold
    say("ana", "a2", 1, "user", "Actually we now have 3 children.")
    say("ana", "a2", 1, "assistant", "Congrats again!")
    say("ana", "a2", 1, "user", "Remember this: I am allergic to peanuts.")  # explicit
    say("ana", "a2", 1, "assistant", "Noted.")
    say("ana", "a2", 1, "user", "I prefer long answers.")  # left open: idle flush
    return out


def _slot(text: str) -> str:
    words = re.sub(r"\d+", "#", text).split()
    return " ".join(words[:2]) if text.startswith(("Lives in", "Works at")) else " ".join(words)


def oracle(body: dict[str, Any]) -> Reply:
    """A combined-mode model that answers with the rules' facts: same text -> NOOP, same
    kind of fact (place, employer, number of children) -> UPDATE, else ADD."""
    system, user = body["messages"][0]["content"], body["messages"][1]["content"]
    listed = re.findall(r"^(\d+)\. (.+?)(?:  \[about the same thing\])?$", user, re.M)
    said = [json.loads(line)["text"] for line in user.split("New messages:", 1)[1].splitlines()
            if line.startswith("{") and json.loads(line)["role"] == "user"]
    changes: list[dict[str, Any]] = []
    for c in (c for text in said for c in rules.extract_text(text) if c.new_fact):
        fact = {"text": c.text, "type": c.type.value, "importance": c.importance,
                "slot": c.slot}
        same = [int(i) for i, t in listed if t == c.text]
        near = [int(i) for i, t in listed if _slot(t) == _slot(c.text)]
        if same:
            changes.append({"op": "NOOP", "target": same[0]})
        elif near:
            changes.append({"op": "UPDATE", "target": near[0], "fact": fact,
                            "reason": "changed"})
        else:
            changes.append({"op": "ADD", "fact": fact, "reason": "new"})
    return chat_json({"changes": changes}, prompt_tokens=(len(system) + len(user)) // 4,
                     completion_tokens=15 * len(changes) + 5)


async def cli(env: dict[str, str], *args: str) -> tuple[int, list[str], dict[str, Any]]:
    """Run ``memstream replay`` (the console script); exit code, output lines, JSON summary."""
    proc = await asyncio.to_thread(subprocess.run, [CLI, "replay", *args], env=env,
                                   capture_output=True, text=True, timeout=300)
    lines = proc.stdout.strip().splitlines()
    assert lines and lines[-1].startswith("{"), proc.stdout + proc.stderr
    return proc.returncode, lines, json.loads(lines[-1])


def memories(path: Path, tenant: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every version record of each user (all statuses), as comparable tuples."""
    store = EdgeStore(path, UseEmbedder.dim)
    try:
        return {user: sorted(
            (m.memory_id, m.version, m.type.value, m.content, m.status.value, m.importance,
             m.created_at, m.valid_from, m.valid_to, m.source.job_id, m.source.op_id)
            for m in store.list(Scope(tenant, user), statuses=None))
            for user in ("ana", "ben")}
    finally:
        store.close()


async def test_replay_recorded_offline_is_identical_and_budgeted(harness, tmp_path):
    tenant = uuid.uuid4().hex
    h = await harness()
    await h.send(*conversations(tenant))
    s = h.settings
    base = {**os.environ, "MEMSTREAM_BOOTSTRAP_SERVERS": s.bootstrap_servers,
            "MEMSTREAM_TOPIC_PREFIX": s.topic_prefix, "MEMSTREAM_DATA_DIR": str(tmp_path / "live"),
            "MEMSTREAM_LLM": "openai", "MEMSTREAM_LLM_MODE": "combined",
            "MEMSTREAM_LLM_MODEL": "oracle-1", "MEMSTREAM_LLM_API_KEY": "sk-test",
            "MEMSTREAM_LLM_RETRIES": "0"}
    rec = tmp_path / "answers.jsonl"
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    only = ("--tenant", tenant)

    with OpenAITestServer(responder=oracle) as server:
        env = {**base, "MEMSTREAM_LLM_BASE_URL": server.url}
        code, lines, dry = await cli(env, "--dry-run", *only)
        assert code == 0 and dry["dry_run"] and server.requests == []
        assert dry["messages"] == 17 and dry["users"] == 2 and dry["trivial"] == 1
        assert dry["jobs_by_reason"] == {"explicit": 1, "idle": 1, "session_end": 1,
                                         "threshold": 2}
        assert dry["estimate"]["exact"] and dry["estimate"]["calls"] == 5
        assert any(line.startswith("LLM calls: 5") for line in lines)

        code, lines, first = await cli(env, "--into", str(a), "--record", str(rec), *only)
        assert code == 0, lines
        # the dry run said what the run did
        assert first["done"] == dry["jobs"] == 5 and first["stopped"] is None
        assert first["calls"] == dry["estimate"]["calls"] == len(server.requests)
        assert first["recording"]["recorded"] == 5
        # Berlin -> Munich, 2 -> 3 children; the 14 non-trivial turns kept in the archive
        assert first["ops"] == {"add": 7, "update": 2, "archive": 14}
        assert first["prompt_tokens"] > 0

    # the server is gone: the offline replay must answer everything from the recording
    offline = {**base, "MEMSTREAM_LLM_BASE_URL": "http://127.0.0.1:9/v1"}
    code, lines, second = await cli(offline, "--into", str(b), "--recorded", str(rec), *only)
    assert code == 0, lines
    assert second["recording"] == {"recorded": 0, "replayed": 5, "loaded": 5,
                                   "skipped_lines": 0}
    assert (second["calls"], second["prompt_tokens"], second["completion_tokens"]) == \
        (first["calls"], first["prompt_tokens"], first["completion_tokens"])
    built = memories(a, tenant)
    assert memories(b, tenant) == built
    ana = [m for m in built["ana"] if m[4] == "active"]
    assert {m[3] for m in ana} >= {"Lives in Munich", "Has 3 children", "Allergic to peanuts"}
    assert any(m[1] == 2 for m in ana)  # an UPDATE opened version 2
    assert len(built["ben"]) == 2

    # --max-calls stops before the first job that does not fit, nothing of it applied ...
    code, lines, part = await cli(offline, "--into", str(c), "--recorded", str(rec),
                                  "--max-calls", "2", *only)
    assert code == 3, lines
    assert part["done"] == 2 and part["calls"] == 2 and part["stopped_at"] is not None
    assert any(line.startswith("STOPPED before job 3 of 5") for line in lines)
    partial = memories(c, tenant)
    assert 0 < sum(map(len, partial.values())) < sum(map(len, built.values()))
    # ... and --resume completes it: the same store as the uninterrupted run
    code, lines, rest = await cli(offline, "--into", str(c), "--recorded", str(rec),
                                  "--resume", *only)
    assert code == 0 and rest["resumed"] == 2 and rest["done"] == 3, lines
    assert memories(c, tenant) == built


async def test_replay_refuses_the_live_store_and_misses_fail_loudly(harness, tmp_path):
    tenant = uuid.uuid4().hex
    h = await harness()
    await h.send(*conversations(tenant)[:4])
    s = h.settings
    env = {**os.environ, "MEMSTREAM_BOOTSTRAP_SERVERS": s.bootstrap_servers,
           "MEMSTREAM_TOPIC_PREFIX": s.topic_prefix, "MEMSTREAM_DATA_DIR": str(tmp_path / "live")}
    proc = await asyncio.to_thread(
        subprocess.run, [CLI, "replay", "--into", str(tmp_path / "live" / "qdrant")], env=env,
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "live store" in proc.stderr
    # an empty recording offline: the first job is a miss, an error naming the key, no call
    rec = tmp_path / "empty.jsonl"
    rec.write_text('{"format": "memstream-llm-record", "version": 1}\n')
    offline = {**env, "MEMSTREAM_LLM": "openai", "MEMSTREAM_LLM_MODEL": "oracle-1"}
    code, lines, out = await cli(offline, "--into", str(tmp_path / "x"), "--recorded",
                                 str(rec), "--tenant", tenant)
    assert code == 1 and out["failed"] and out["done"] == 0
    assert any("holds no answer" in line and "combined-v1" in line and "oracle-1" in line
               for line in lines), lines
