"""The OpenAI-compatible path over real HTTP against a local scripted test server."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest
from openai import OpenAI

from memstream.core.retry import RetriesExhausted, deadline_scope
from memstream.core.settings import Settings
from memstream.dev.openai_stub import OpenAITestServer, Reply, chat, chat_json, error
from memstream.memory.decisions import Candidate
from memstream.memory.embedding import EmbeddingError, HashingEmbedder, OpenAIEmbedder
from memstream.memory.extraction import Extractor
from memstream.memory.llm.openai_model import DECIDE_PROMPT, EXTRACT_PROMPT, LLMError, OpenAIModel
from memstream.memory.model import Memory, OpKind, Source
from memstream.memory.store import Scope
from memstream.memory.store.edge import EdgeStore
from memstream.topics.schemas import ExtractionJob, JobMessage, TriggerReason

pytestmark = pytest.mark.unit

FACTS = {"facts": [{"text": "Lives in Munich", "type": "episodic", "importance": 7,
                    "slot": "residence"}]}


@pytest.fixture
def server():
    with OpenAITestServer() as s:
        yield s


def model(server, retries=3, timeout=2.0, mode="two_step") -> OpenAIModel:
    settings = Settings(llm="openai", llm_base_url=server.url, llm_api_key="sk-test",
                        llm_model="test-model", llm_retries=retries, llm_timeout_s=timeout,
                        llm_mode=mode)
    client = OpenAI(base_url=server.url, api_key="sk-test", max_retries=0, timeout=timeout)
    return OpenAIModel(settings, client=client, sleep=lambda s: None)


def msgs(*texts):
    return [JobMessage(seq=i, message_id=f"m{i}", role="user", content=t,
                       ts=datetime(2026, 1, 1, tzinfo=UTC)) for i, t in enumerate(texts)]


def mem(content, mid="real-uuid-1"):
    return Memory(mid, "t", "u", "episodic", content, 5, 0.0, 0.0, 0.0,
                  Source("s", 0, 1, "j", "o"), slot="residence")


def test_extract_uses_json_schema_and_counts_tokens(server):
    server.script = [chat_json(FACTS, prompt_tokens=321, completion_tokens=12)]
    cands, usage = model(server).extract(msgs("We moved to Munich"), [])
    assert [(c.text, c.slot) for c in cands] == [("Lives in Munich", "residence")]
    assert (usage.calls, usage.prompt_tokens, usage.completion_tokens) == (1, 321, 12)
    path, body = server.requests[0]
    assert path == "/v1/chat/completions" and body["model"] == "test-model"
    assert body["response_format"]["type"] == "json_schema"
    assert "We moved to Munich" in body["messages"][1]["content"]


def test_falls_back_to_json_mode_and_remembers(server):
    m = model(server)
    server.script = [error(400, "response_format json_schema is not supported"),
                     chat_json(FACTS), chat_json(FACTS)]
    m.extract(msgs("x"), [])
    m.extract(msgs("y"), [])
    formats = [body["response_format"]["type"] for _, body in server.requests]
    assert formats == ["json_schema", "json_object", "json_object"]


def test_a_500_that_names_json_schema_falls_back_to_json_object_with_the_schema(server):
    # llama.cpp's server answers json_schema with a 500; it takes json_object + schema
    m = model(server)
    server.script = [error(500, "Unsupported response_format type: json_schema"),
                     chat_json(FACTS), chat_json(FACTS)]
    m.extract(msgs("x"), [])
    m.extract(msgs("y"), [])
    formats = [body["response_format"] for _, body in server.requests]
    assert [f["type"] for f in formats] == ["json_schema", "json_object", "json_object"]
    assert formats[1]["schema"]["title"] == "ExtractReply" and formats[2] == formats[1]


def test_a_server_that_refuses_the_schema_gets_plain_json_object(server):
    server.script = [error(400, "response_format json_schema is not supported"),
                     error(400, "Additional properties are not allowed ('schema' was unexpected)"),
                     chat_json(FACTS)]
    cands, _ = model(server).extract(msgs("We moved to Munich"), [])
    assert [c.text for c in cands] == ["Lives in Munich"]
    formats = [body["response_format"] for _, body in server.requests]
    assert formats[-1] == {"type": "json_object"} and len(formats) == 3


@pytest.mark.parametrize("failure", [
    error(429, "rate limited"), error(500), error(503), error(408), error(409),
    chat("this is not json {"), chat_json({"facts": [{"text": "x", "importance": 42}]}),
    chat_json({"something": "else"}),
], ids=["429", "500", "503", "408", "409", "malformed-json", "schema-invalid", "wrong-shape"])
def test_transient_failures_are_retried(server, failure):
    server.script = [failure, chat_json(FACTS)]
    cands, usage = model(server).extract(msgs("We moved to Munich"), [])
    assert [c.text for c in cands] == ["Lives in Munich"] and len(server.requests) == 2
    assert usage.calls >= 1


def test_timeout_is_retried(server):
    server.script = [Reply(200, {}, delay=1.5), chat_json(FACTS)]
    cands, _ = model(server, timeout=0.5).extract(msgs("We moved to Munich"), [])
    assert [c.text for c in cands] == ["Lives in Munich"]


def test_gives_up_after_the_retries(server):
    server.script = [error(500)] * 3
    with pytest.raises(LLMError, match="after 3 attempts"):
        model(server, retries=2).extract(msgs("x"), [])
    assert len(server.requests) == 3


def test_a_failing_server_gives_up_before_the_job_deadline(server, tmp_path):
    """Per-call retries (8 allowed, ~13 s of backoff) stop when the next one would not fit
    in the deadline the extractor passes down; the job is not redone around them."""
    settings = Settings(llm="openai", llm_model="test-model", llm_mode="two_step",
                        llm_retries=8, llm_backoff_s=0.05, llm_timeout_s=2.0)
    client = OpenAI(base_url=server.url, api_key="sk-test", max_retries=0, timeout=2.0)
    m = OpenAIModel(settings, client=client)  # real sleep, real clock
    store = EdgeStore(tmp_path / "s", HashingEmbedder().dim)
    server.script = []  # every request: 500
    start = time.time()
    deadline = start + 3.0
    with pytest.raises(LLMError, match="deadline") as info:
        Extractor(m, HashingEmbedder(), store).decide(_job("j", "We moved to Munich"), start,
                                                      deadline=deadline)
    assert time.time() < deadline
    assert isinstance(info.value.__cause__, RetriesExhausted)
    assert 3 <= info.value.__cause__.attempts == len(server.requests) < 9
    store.close()


def test_a_slow_call_is_cut_off_at_the_deadline(server):
    """The client's own timeout (30 s here) is clipped to the time left."""
    server.script = [Reply(200, {}, delay=4.0)]
    m = model(server, timeout=30.0)
    start = time.time()
    with deadline_scope(start + 1.5), pytest.raises(LLMError, match="APITimeoutError"):
        m.extract(msgs("We moved to Munich"), [])
    assert time.time() - start < 2.5 and len(server.requests) == 1


def test_permanent_errors_are_not_retried(server):
    server.script = [error(401, "bad key"), chat_json(FACTS)]
    with pytest.raises(LLMError, match="AuthenticationError"):
        model(server).extract(msgs("x"), [])
    assert len(server.requests) == 1


def test_decide_sees_small_integers_never_real_ids(server):
    server.script = [chat_json({"op": "UPDATE", "target": 2, "reason": "moved"})]
    shown = [(1, mem("Works at Acme", "uuid-aaa"), 0.2),
             (2, mem("Lives in Berlin", "uuid-bbb"), 0.8)]
    decision, _ = model(server).decide(Candidate("Lives in Munich", slot="residence"), shown, 0.57)
    assert (decision.op, decision.target) == (OpKind.UPDATE, 2)
    prompt_text = server.requests[0][1]["messages"][1]["content"]
    assert "uuid-aaa" not in prompt_text and "uuid-bbb" not in prompt_text
    assert "2. Lives in Berlin" in prompt_text


def test_an_invented_target_is_retried(server):
    server.script = [chat_json({"op": "DELETE", "target": 7}), chat_json({"op": "ADD"})]
    shown = [(1, mem("Lives in Berlin"), 0.8)]
    decision, usage = model(server).decide(Candidate("Lives in Munich"), shown, 0.57)
    assert decision.op == OpKind.ADD and usage.calls == 2


def test_prompts_are_versioned_files():
    two = OpenAIModel(Settings(llm_model="x", llm_mode="two_step"), client=None)
    assert two.prompt_version == f"{EXTRACT_PROMPT}+{DECIDE_PROMPT}" == "extract-v1+decide-v1"
    one = OpenAIModel(Settings(llm_model="x"), client=None)
    assert one.combined and one.prompt_version == "combined-v1"


def _job(job_id, text):
    return ExtractionJob(job_id=job_id, tenant_id="t", user_id="u", session_id="s",
                         from_seq=0, to_seq=1, reason=TriggerReason.EXPLICIT,
                         messages=msgs(text), created_at=datetime(2026, 1, 1, tzinfo=UTC))


BERLIN = {"text": "Lives in Berlin", "importance": 7, "slot": "residence"}
MUNICH = {"text": "Lives in Munich", "importance": 7, "slot": "residence"}
SCRIPTS = {  # the same conversation, answered the way each mode asks
    "two_step": [chat_json({"facts": [BERLIN]}), chat_json({"op": "ADD"}),
                 chat_json({"facts": [MUNICH]}), chat_json({"op": "UPDATE", "target": 1})],
    "combined": [chat_json({"changes": [{"op": "ADD", "fact": BERLIN}]}),
                 chat_json({"changes": [{"op": "UPDATE", "target": 1, "fact": MUNICH}]})],
}


@pytest.mark.parametrize("mode", ["two_step", "combined"])
def test_both_modes_turn_a_move_into_one_live_address(server, tmp_path, mode):
    from memstream.memory.applying import apply_change, change_for

    store = EdgeStore(tmp_path / "s", HashingEmbedder().dim)
    m = model(server, mode=mode)
    ex = Extractor(m, HashingEmbedder(), store)
    server.script = list(SCRIPTS[mode])
    calls = 0
    for i, text in enumerate(["I live in Berlin", "We moved to Munich"]):
        job = _job(f"j{i}", text)
        out = ex.decide(job, float(i))
        calls += out.usage.calls
        for op, vec in out.ops:
            apply_change(store, change_for(op, vec, job, out, m, float(i)))
    assert [x.content for x in store.list(Scope("t", "u"))] == ["Lives in Munich"]
    assert calls == (4 if mode == "two_step" else 2)
    if mode == "combined":
        listing = server.requests[1][1]["messages"][1]["content"]
        assert "1. Lives in Berlin" in listing
    store.close()


def test_combined_rejects_invented_targets_and_facts_missing(server):
    server.script = [chat_json({"changes": [{"op": "UPDATE", "target": 3, "fact": MUNICH}]}),
                     chat_json({"changes": [{"op": "ADD"}]}),
                     chat_json({"changes": [{"op": "ADD", "fact": MUNICH}]})]
    pairs, usage = model(server, mode="combined").extract_and_decide(
        msgs("We moved to Munich"), [], [(1, mem("Lives in Berlin"), 0.8)], 0.57)
    assert [(c.text, d.op) for c, d in pairs] == [("Lives in Munich", OpKind.ADD)]
    assert usage.calls == 3


def test_openai_embedder_over_http(server):
    server.script = [Reply(200, {"object": "list", "model": "e", "data": [
        {"object": "embedding", "index": 1, "embedding": [0.0, 2.0]},
        {"object": "embedding", "index": 0, "embedding": [3.0, 4.0]}],
        "usage": {"prompt_tokens": 2, "total_tokens": 2}}), error(500)]
    client = OpenAI(base_url=server.url, api_key="k", max_retries=0)
    emb = OpenAIEmbedder("e", 2, client=client)
    assert emb.embed(["a", "b"]) == [[0.6, 0.8], [0.0, 1.0]]
    with pytest.raises(EmbeddingError):
        emb.embed(["c"])
    assert Scope("t", "u").users() == ["u"]
