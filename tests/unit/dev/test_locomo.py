"""The LOCOMO harness's pure parts on a LOCOMO-format fixture of our own
(tests/data/locomo_mini.json): events, recall, lineage, F1/BLEU-1, and the record/replay
of answering and judging calls over HTTP (the run itself: tests/integration/test_locomo.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import pytest

from memstream.dev import locomo
from memstream.dev.locomo import Retrieved, Tally, bleu1, evidence_hit, f1, merge
from memstream.dev.locomo_judge import Calls, Judge, RecordingMiss, label
from memstream.dev.locomo_run import lineages
from memstream.dev.openai_stub import OpenAITestServer, chat
from memstream.topics.schemas import ChatMessage, Role, SessionEvent

pytestmark = pytest.mark.unit
MINI = Path(__file__).resolve().parents[2] / "data" / "locomo_mini.json"


@pytest.fixture
def conv() -> locomo.Conversation:
    return locomo.load(MINI)[0]


def test_a_conversation_is_parsed_with_its_sessions_dates_and_questions(conv):
    assert conv.speakers == ("Ana", "Ben") and conv.users == ("mini-1.Ana", "mini-1.Ben")
    assert [s.at for s in conv.sessions] == [datetime(2024, 3, 3, 9, 15, tzinfo=UTC),
                                             datetime(2024, 4, 21, 18, 40, tzinfo=UTC)]
    assert [q.kind for q in conv.qa] == ["single-hop", "single-hop", "multi-hop", "temporal",
                                         "open-domain", "adversarial"]
    assert conv.qa[-1].answer == "blue"  # an adversarial question's answer field


def test_a_conversation_cut_to_its_first_sessions_keeps_the_questions_they_answer():
    (short,) = locomo.load(MINI, sessions=1)
    assert [s.number for s in short.sessions] == [1] and len(short.turns) == 6
    assert [q.evidence for q in short.qa] == [("D1:2",), ("D1:3",), ("D1:4",)]


def test_each_speaker_is_a_user_whose_own_turns_are_user_messages(conv):
    evs = locomo.events(conv, "t", gap_s=30)
    ana = [e for e in evs if e.user_id == "mini-1.Ana"]
    messages = [e for e in ana if isinstance(e, ChatMessage)]
    assert [m.message_id for m in messages][:3] == ["D1:1", "D1:2", "D1:3"]
    assert [m.role for m in messages][:3] == [Role.USER, Role.ASSISTANT, Role.USER]
    assert messages[1].ts == datetime(2024, 3, 3, 9, 15, 30, tzinfo=UTC)
    ends = [i for i, e in enumerate(ana) if isinstance(e, SessionEvent)]
    assert ends == [6, 13]  # each session closed after its last message
    assert ana[ends[0]].ts > messages[5].ts
    assert len(evs) == 2 * (12 + 2)


def test_an_odd_speaker_name_still_makes_a_valid_user_id():
    raw = {"sample_id": "conv 7", "qa": [], "conversation": {
        "speaker_a": "Zoë O'Neil", "speaker_b": "B", "session_1_date_time":
        "1:56 pm on 8 May, 2023", "session_1": [{"speaker": "B", "dia_id": "D1:1",
                                                "text": "hi"}]}}
    c = locomo.parse(raw)
    assert c.user_of("Zoë O'Neil") == "conv-7.Zo-O-Neil"
    assert locomo.events(c, "t")  # the contract accepts the ids


def test_recall_counts_a_question_when_a_top_k_memory_holds_an_evidence_turn():
    near = Retrieved("m1", 0.9, frozenset({"D1:4"}))
    far = Retrieved("m2", 0.1, frozenset({"D1:2", "D1:3"}))
    ranked = merge([far], [near], k=10)
    assert [r.memory_id for r in ranked] == ["m1", "m2"]
    assert evidence_hit(ranked, ["D1:3"], 10) and not evidence_hit(ranked, ["D1:3"], 1)
    assert not evidence_hit(ranked, ["D9:9"], 10)
    assert locomo.lineage_width(ranked) == 1.5 and locomo.lineage_width([]) == 0.0


def test_coverage_counts_each_session_s_messages_once_and_failed_ranges_too():
    def result(session: str, first: int, last: int, status: str = "done") -> dict:
        return {"user_id": "u", "session_id": session, "from_seq": first, "to_seq": last,
                "status": status}

    found = locomo.covered([result("s1", 0, 4), result("s2", 0, 4), result("s1", 2, 6),
                            result("s2", 4, 5, "failed"), result("s2", 5, 9, "fenced")])
    assert len(found) == 6 + 5  # s1: 0..5; s2: 0..4 (a fenced range is decided again)


def test_the_tally_reports_per_category_and_overall(conv):
    t = Tally()
    hit = [Retrieved("m", 1.0, frozenset({"D1:2"}))]
    t.add(conv.qa[0], hit)          # single-hop, evidence D1:2: a hit
    t.add(conv.qa[1], hit)          # single-hop, evidence D1:3: a miss
    t.add(conv.qa[3], [])           # temporal, nothing retrieved
    t.judge(conv.qa[0], True, "He lives in Porto")
    assert t.row("single-hop")["recall@10"] == 0.5 and t.row("temporal")["recall@5"] == 0.0
    overall = t.row("overall")
    assert (overall["questions"], overall["J"], overall["judged"]) == (3, 1.0, 1)
    assert overall["F1"] == round(f1("He lives in Porto", "Porto"), 3)


def test_f1_and_bleu1_on_known_pairs():
    assert f1("Porto", "porto.") == 1.0 and f1("Lisbon", "Porto") == 0.0
    assert f1("the city of Porto", "Porto") == pytest.approx(2 * (1 / 3) / (1 + 1 / 3))
    assert bleu1("Porto", "Porto") == 1.0 and bleu1("", "Porto") == 0.0
    assert bleu1("Porto", "Porto Portugal") == pytest.approx(0.3679, abs=1e-3)  # brevity


def test_a_memory_s_lineage_gathers_its_versions_and_what_was_merged_into_it():
    def change(mid: str, kind: str, ids: list[str], merged: list[str] | None = None):
        after = {"extra": {"merged": merged}} if merged else {}
        return SimpleNamespace(memory_id=mid, after=after,
                               lineage=SimpleNamespace(kind=kind, message_ids=ids))

    decisions = [SimpleNamespace(changes=[change("a", "extraction", ["D1:1"]),
                                          change("b", "extraction", ["D1:2"])]),
                 SimpleNamespace(changes=[change("a", "extraction", ["D1:5"]),
                                          change("a", "consolidation", ["req-1"], ["b"])])]
    assert lineages(decisions) == {"a": {"D1:1", "D1:5", "D1:2"}, "b": {"D1:2"}}  # type: ignore[arg-type]


def test_the_judge_s_label_reads_json_or_the_bare_word():
    assert label('{"reasoning": "same city", "label": "CORRECT"}')
    assert not label('```json\n{"label": "WRONG"}\n```')
    assert label("CORRECT.") and not label("I think this is WRONG") and not label("")


def test_answers_and_verdicts_are_recorded_and_replayed_offline(conv, tmp_path):
    path = tmp_path / "answers.jsonl"
    memories = [Retrieved("m", 1.0, frozenset({"D1:2"}), "Lives in Porto")]
    with OpenAITestServer() as server:
        server.script += [chat("Porto", 50, 2), chat('{"label": "CORRECT"}', 80, 6)]
        live = Judge(Calls(server.url, "k", "record", path), "small", "judge")
        assert live.score(conv.qa[0], memories) == ("Porto", True)
        assert [body["model"] for _, body in server.requests] == ["small", "judge"]
        assert "Lives in Porto" in server.requests[0][1]["messages"][1]["content"]
    replay = Judge(Calls(None, "k", "recorded", path), "small", "judge")
    assert replay.score(conv.qa[0], memories) == ("Porto", True)  # no server running
    assert (replay.calls.calls, replay.calls.prompt_tokens) == (2, 130)
    with pytest.raises(RecordingMiss):
        replay.score(conv.qa[1], memories)
