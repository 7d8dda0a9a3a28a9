"""A windowed job's work (jobs.work) decided and applied like any job of the user."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from memstream.jobs.work import WindowedWork
from memstream.memory.applying import apply_decision, build_decision
from memstream.memory.embedding import HashingEmbedder
from memstream.memory.extraction import Extractor, Insight, RulesModel, Usage
from memstream.memory.store import Scope
from memstream.topics.schemas import ExtractionJob, ToolWrite, TriggerReason
from tests.unit.builders import make_store, memory

pytestmark = pytest.mark.unit

EMB = HashingEmbedder()
NOW = 1_800_000_000.0
FACTS = [("Lives in Munich", "m-city", "residence"), ("Has 3 children", "m-kids", "children"),
         ("Works at Siemens", "m-job", "employer")]


@pytest.fixture(params=["edge", "server"])
def store(request, tmp_path):
    s = make_store(request.param, tmp_path, EMB.dim)
    for n, (text, mid, slot) in enumerate(FACTS):
        m = memory(text, mid=mid, slot=slot, importance=6 + n, at=NOW - 3600 * (3 - n))
        s.write([m], EMB.embed([text]))
    yield s
    s.close()


def job(kind: str, seq: int = 1) -> ExtractionJob:
    return ExtractionJob(job_id=f"{kind}-{seq}", seq=seq, tenant_id="t1", user_id="u1",
                         session_id="tool", from_seq=0, to_seq=0, reason=TriggerReason.TOOL,
                         messages=[], created_at=datetime.fromtimestamp(NOW, UTC),
                         tool=ToolWrite(name=kind, request_id=f"{kind}-{seq}",
                                        principal=f"job:{kind}"))


def run(ex: Extractor, kind: str, seq: int = 1):
    j = job(kind, seq)
    out = ex.decide(j, NOW)
    applied = apply_decision(ex.store, build_decision(j, out, ex.model, NOW))
    return out, applied


class Reflective(RulesModel):
    """A model with a reflection step: cites memories 3 and 1 of those it is shown."""

    name = "fake-llm"
    reflect_prompt_version = "reflect-v1"

    def __init__(self) -> None:
        self.shown: list[tuple[int, str]] = []

    def reflect(self, memories):
        self.shown = [(n, m.content) for n, m in memories]
        return [Insight("Settled family life in Bavaria", (3, 1))], Usage(2, 50, 10)


def test_llm_insights_keep_their_evidence_as_real_ids(store):
    model = Reflective()
    out, applied = run(Extractor(model, EMB, store, windowed=WindowedWork()), "reflect")
    [change] = applied.publish
    shown = dict(model.shown)
    expected = {mid for text, mid, _ in FACTS if text in (shown[3], shown[1])}
    assert set(change.after["extra"]["evidence"]) == expected and len(expected) == 2
    assert change.after["extra"]["kind"] == "reflection" and change.after["importance"] >= 8
    assert (change.lineage.kind, change.lineage.actor) == ("reflection", "job:reflect")
    assert change.prompt_version == "reflect-v1" and out.usage.calls == 2


def test_offline_reflection_is_a_profile_updated_not_duplicated(store):
    ex = Extractor(RulesModel(), EMB, store, windowed=WindowedWork())
    _, first = run(ex, "reflect", 1)
    [added] = first.publish
    assert added.op == "add" and "Munich" in added.after["content"]
    assert set(added.after["extra"]["evidence"]) == {"m-city", "m-kids", "m-job"}
    _, again = run(ex, "reflect", 2)
    assert again.publish == []  # nothing new: the same profile, no second reflection
    reflections = [m for m in store.list(Scope("t1", "u1")) if m.extra.get("kind")]
    assert len(reflections) == 1


def test_decay_archives_after_ninety_idle_days_through_the_apply_path(store):
    ex = Extractor(RulesModel(), EMB, store, windowed=WindowedWork())
    j = job("decay")
    out = ex.decide(j, NOW + 91 * 86_400)
    applied = apply_decision(store, build_decision(j, out, ex.model, NOW + 91 * 86_400))
    assert {c.after["status"] for c in applied.publish} == {"archived"}
    assert store.list(Scope("t1", "u1")) == []  # none live; all restorable
    assert len(store.list(Scope("t1", "u1"), ["archived"])) == 3
