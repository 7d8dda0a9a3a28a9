"""Recorded LLM answers (memory/llm/recorded.py): keys, modes, the file, and the model hook."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from openai import OpenAI

from memstream.core.settings import Settings
from memstream.dev.openai_stub import OpenAITestServer, chat_json
from memstream.memory.extraction import Usage
from memstream.memory.llm.openai_model import EXTRACT_PROMPT, OpenAIModel
from memstream.memory.llm.recorded import (
    FORMAT,
    Recorder,
    RecordingError,
    RecordingMiss,
    RecordKey,
    record_key,
)
from memstream.topics.schemas import JobMessage

pytestmark = pytest.mark.unit

BASE = ("gpt-x", "extract-v1", "You extract facts.", "I live in Lisbon", "ExtractReply")


def live(text: str, calls: int = 1, prompt: int = 100, completion: int = 20):
    asked: list[int] = []

    def call() -> tuple[str, Usage]:
        asked.append(1)
        return text, Usage(calls, prompt, completion)

    call.asked = asked  # type: ignore[attr-defined]
    return call


def test_key_is_stable():
    key = record_key(*BASE)
    assert key == record_key(*BASE)
    assert (key.model, key.prompt_version) == ("gpt-x", "extract-v1")
    # the canonical request (sorted-key compact JSON of schema, system, user) is part of the
    # file format: changing it would orphan every recording made so far
    assert key.request_sha256 == \
        "bd15fba308e478a1e4b73d74518c382da4720565085d9fd3d69e8ca3b9d9c5a5"


@pytest.mark.parametrize("index,value", [
    (0, "gpt-y"), (1, "extract-v2"), (2, "You extract facts!"), (3, "I live in Porto"),
    (4, "DecideReply"),
], ids=["model", "prompt-version", "system", "user", "schema"])
def test_key_changes_with_any_part(index, value):
    parts = list(BASE)
    parts[index] = value
    assert record_key(*parts) != record_key(*BASE)


def test_record_then_replay_gives_the_same_answers_and_usage(tmp_path):
    path = tmp_path / "rec.jsonl"
    rec = Recorder(path, "record")
    k1, k2 = record_key(*BASE), record_key("gpt-x", "decide-v1", "s", "u", "DecideReply")
    assert rec.answer(k1, "ExtractReply", live('{"facts": []}', 2, 321, 12)) == \
        ('{"facts": []}', Usage(2, 321, 12))
    assert rec.answer(k2, "DecideReply", live('{"op": "ADD"}')) == \
        ('{"op": "ADD"}', Usage(1, 100, 20))
    lines = path.read_text().splitlines()
    assert json.loads(lines[0]) == {"format": FORMAT, "version": 1}
    assert len(lines) == 3

    offline = Recorder(path, "replay")
    never = live("must not be called")
    assert offline.answer(k2, "DecideReply", never) == ('{"op": "ADD"}', Usage(1, 100, 20))
    assert offline.answer(k1, "ExtractReply", never) == ('{"facts": []}', Usage(2, 321, 12))
    assert never.asked == [] and offline.stats.replayed == 2


def test_replay_miss_is_an_error_naming_the_key(tmp_path):
    path = tmp_path / "rec.jsonl"
    Recorder(path, "record").answer(record_key(*BASE), "ExtractReply", live("{}"))
    offline = Recorder(path, "replay")
    other = record_key("gpt-x", "extract-v1", "You extract facts.", "I live in Porto",
                       "ExtractReply")
    never = live("x")
    with pytest.raises(RecordingMiss) as err:
        offline.answer(other, "ExtractReply", never)
    assert other.request_sha256 in str(err.value) and "extract-v1" in str(err.value)
    assert "gpt-x" in str(err.value) and never.asked == []


def test_replay_needs_a_recording_of_this_format(tmp_path):
    with pytest.raises(RecordingError):
        Recorder(tmp_path / "missing.jsonl", "replay")
    bad = tmp_path / "v9.jsonl"
    bad.write_text(json.dumps({"format": FORMAT, "version": 9}) + "\n")
    with pytest.raises(RecordingError, match="version 9"):
        Recorder(bad, "replay")
    other = tmp_path / "other.jsonl"
    other.write_text('{"hello": 1}\n')
    with pytest.raises(RecordingError):
        Recorder(other, "auto")


def test_same_request_asked_twice_replays_in_recorded_order(tmp_path):
    path = tmp_path / "rec.jsonl"
    rec = Recorder(path, "record")
    key = record_key(*BASE)
    rec.answer(key, "ExtractReply", live("first"))
    rec.answer(key, "ExtractReply", live("second"))
    offline = Recorder(path, "replay")
    got = [offline.answer(key, "ExtractReply", live("x"))[0] for _ in range(3)]
    assert got == ["first", "second", "second"]


def test_auto_answers_from_the_file_and_records_misses(tmp_path):
    path = tmp_path / "rec.jsonl"
    Recorder(path, "record").answer(record_key(*BASE), "ExtractReply", live("known"))
    auto = Recorder(path, "auto")
    hit = live("fresh")
    assert auto.answer(record_key(*BASE), "ExtractReply", hit)[0] == "known"
    other = RecordKey("gpt-x", "extract-v1", "0" * 64)
    miss = live("fresh")
    assert auto.answer(other, "ExtractReply", miss)[0] == "fresh"
    assert hit.asked == [] and miss.asked == [1]
    assert Recorder(path, "replay").answer(other, "ExtractReply", live("x"))[0] == "fresh"


def test_a_torn_last_line_is_skipped_and_appending_goes_on(tmp_path):
    path = tmp_path / "rec.jsonl"
    Recorder(path, "record").answer(record_key(*BASE), "ExtractReply", live("ok"))
    with open(path, "a") as f:
        f.write('{"model": "gpt-x", "prompt_ver')  # a crash mid-write
    rec = Recorder(path, "auto")
    assert rec.stats.skipped_lines == 1 and rec.stats.loaded == 1
    other = RecordKey("m", "p", "1" * 64)
    rec.answer(other, "S", live("after"))
    again = Recorder(path, "replay")
    assert again.stats.loaded == 2 and again.stats.skipped_lines == 1
    assert again.answer(other, "S", live("x"))[0] == "after"


# --- the hook in the OpenAI model, over real HTTP -------------------------------------------

FACTS = {"facts": [{"text": "Lives in Munich", "type": "episodic", "importance": 7,
                    "slot": "residence"}]}


def model(url: str, recorder: Recorder) -> OpenAIModel:
    settings = Settings(llm="openai", llm_base_url=url, llm_model="test-model", llm_retries=0,
                        llm_timeout_s=2.0, llm_mode="two_step")
    return OpenAIModel(settings, client=OpenAI(base_url=url, api_key="k", max_retries=0,
                                               timeout=2.0),
                       sleep=lambda s: None, recorder=recorder)


def msgs(text: str) -> list[JobMessage]:
    return [JobMessage(seq=0, message_id="m0", role="user", content=text,
                       ts=datetime(2026, 1, 1, tzinfo=UTC))]


def test_model_records_then_replays_offline(tmp_path):
    path = tmp_path / "rec.jsonl"
    with OpenAITestServer() as server:
        server.script = [chat_json(FACTS, prompt_tokens=321, completion_tokens=12)]
        online = model(server.url, Recorder(path, "record"))
        cands, usage = online.extract(msgs("We moved to Munich"), [])
        assert len(server.requests) == 1
    row = json.loads(path.read_text().splitlines()[1])
    assert (row["model"], row["prompt_version"], row["schema"]) == \
        ("test-model", EXTRACT_PROMPT, "ExtractReply")

    dead = "http://127.0.0.1:9/v1"  # nothing listens: a live call would fail
    offline = model(dead, Recorder(path, "replay"))
    again, usage_again = offline.extract(msgs("We moved to Munich"), [])
    assert again == cands and usage_again == usage == Usage(1, 321, 12)
    with pytest.raises(RecordingMiss, match=EXTRACT_PROMPT):
        offline.extract(msgs("We moved to Hamburg"), [])


def test_a_worker_records_its_answers_and_replays_them_offline(tmp_path):
    from memstream.memory.services import build_services

    path = tmp_path / "worker.jsonl"
    msg = [JobMessage(seq=0, message_id="m0", role="user", content="We moved to Munich",
                      ts=datetime(2026, 1, 1, tzinfo=UTC))]
    facts = {"facts": [{"text": "Lives in Munich", "type": "episodic", "importance": 7,
                        "slot": "residence"}]}
    common = {"llm": "openai", "llm_mode": "two_step", "llm_model": "m", "embedder": "hashing",
              "store": "edge", "llm_record": path}
    with OpenAITestServer() as server:
        server.script.append(chat_json(facts))
        recording = build_services(Settings(data_dir=tmp_path / "a", llm_base_url=server.url,
                                            llm_record_mode="record", **common))
        live_found, _ = recording.model.extract(msg, [])
        recording.store.close()
    replaying = build_services(Settings(data_dir=tmp_path / "b", llm_record_mode="replay",
                                        **common))  # no endpoint: answers from the file
    replayed, usage = replaying.model.extract(msg, [])
    replaying.store.close()
    assert [c.text for c in replayed] == [c.text for c in live_found] == ["Lives in Munich"]
    assert usage.calls == 1 and len(server.requests) == 1
