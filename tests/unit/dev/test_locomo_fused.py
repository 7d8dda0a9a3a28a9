"""The LOCOMO harness's views (memories, archived turns, fused, width-capped, ablations):
merging both speakers' items, width-capped recall, the stating turn of a memory, the
requests asked per question, and the client's fusion options."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from memstream.client import AsyncMemoryClient, Request, Response
from memstream.contract.http_api.api import RecallItem, SearchResponse
from memstream.dev import locomo
from memstream.dev.locomo import Retrieved, Tally, evidence_hit, merge
from memstream.dev.locomo_run import (
    MEMORIES,
    VIEWS,
    Known,
    Result,
    _ask,
    stated_turns,
)

pytestmark = pytest.mark.unit
MINI = Path(__file__).resolve().parents[2] / "data" / "locomo_mini.json"


@pytest.fixture
def conv() -> locomo.Conversation:
    return locomo.load(MINI)[0]


def turn(tid: str, score: float, ids: list[str]) -> Retrieved:
    return Retrieved(tid, score, frozenset(ids), kind="turn", stated=frozenset(ids[-1:]))


def test_both_speakers_turns_of_one_lineage_count_once_memories_never_merge():
    ana = [turn("t-a", 0.5, ["D1:1", "D1:2"]), Retrieved("m1", 0.4, frozenset({"D1:2"}))]
    ben = [turn("t-b", 0.6, ["D1:1", "D1:2"]), Retrieved("m2", 0.4, frozenset({"D1:2"})),
           turn("t-c", 0.1, ["D1:2", "D1:3"])]
    ranked = merge(ana, ben, k=10)
    assert [r.memory_id for r in ranked] == ["t-b", "m1", "m2", "t-c"]  # best kept
    assert [r.memory_id for r in merge(ana, ben, k=2)] == ["t-b", "m1"]


def test_width_capped_recall_counts_a_wide_memory_only_as_its_stating_turn():
    wide = Retrieved("m", 1.0, frozenset({"D1:1", "D1:2", "D1:3", "D1:4"}))
    stated = Retrieved("m", 1.0, wide.turns, stated=frozenset({"D1:3"}))
    narrow = Retrieved("n", 1.0, frozenset({"D1:2", "D1:3"}))
    assert evidence_hit([wide], ["D1:3"], 10) and not evidence_hit([wide], ["D1:3"], 10, True)
    assert evidence_hit([stated], ["D1:3"], 10, True)
    assert not evidence_hit([stated], ["D1:2"], 10, True)  # in its lineage, not its source
    assert evidence_hit([narrow], ["D1:2"], 10, True)
    assert evidence_hit([turn("t", 1.0, ["D1:2", "D1:3"])], ["D1:2"], 10, True)
    assert not evidence_hit([narrow], ["D9:9"], 10)


def test_the_tally_counts_capped_hits_apart(conv):
    wide = [Retrieved("m", 1.0, frozenset({"D1:1", "D1:2", "D1:3"}))]
    plain, capped = Tally(), Tally()
    plain.add(conv.qa[0], wide)
    capped.add(conv.qa[0], wide, capped=True)
    assert plain.row("overall")["recall@5"] == 1.0 and capped.row("overall")["recall@5"] == 0.0


def change(mid: str, user: str, kind: str = "extraction", event_ts: float | None = None,
           restated: float | None = None, merged: list[str] | None = None) -> Any:
    extra: dict[str, Any] = {}
    if restated is not None:
        extra["restated_ts"] = restated
    if merged:
        extra["merged"] = merged
    return SimpleNamespace(memory_id=mid, user_id=user, after={
        "source": {"event_ts": event_ts}, "extra": extra},
        lineage=SimpleNamespace(kind=kind, message_ids=[]))


def test_a_memory_s_stating_turns_come_from_its_versions_event_times():
    said = {("u", 10.0): "D1:1", ("u", 40.0): "D1:2", ("u", 70.0): "D1:3", ("v", 10.0): "X"}
    decisions = [SimpleNamespace(changes=[change("a", "u", event_ts=10.0),
                                          change("b", "u", event_ts=70.0000001),
                                          change("c", "u", event_ts=999.0)]),
                 SimpleNamespace(changes=[change("a", "u", event_ts=10.0, restated=40.0),
                                          change("a", "u", "consolidation", merged=["b"]),
                                          change("t-1", "u", "archive", event_ts=70.0)])]
    found = stated_turns(decisions, said)  # type: ignore[arg-type]
    assert found["a"] == {"D1:1", "D1:2", "D1:3"}  # its statement, restatement, merged part
    assert found["b"] == {"D1:3"} and found["c"] == frozenset()
    assert not found.get("t-1")  # an archived turn is not a memory
    assert stated_turns(decisions, {})["a"] == frozenset()  # unknown: a model's run


def item(kind: str, iid: str, score: float, ids: list[str]) -> RecallItem:
    return RecallItem(kind=kind, id=iid, content=iid, score=score, event_time=0.0,  # type: ignore[arg-type]
                      session_id="s1", message_ids=ids)


def test_a_turn_item_s_lineage_is_its_messages_a_memory_s_the_decisions():
    known = Known({"m": frozenset({"D1:1", "D1:2", "D1:3"})}, {"m": frozenset({"D1:2"})})
    t = known.item(item("turn", "t", 0.2, ["D1:4", "D1:5"]))
    assert (t.kind, t.turns, t.stated) == ("turn", {"D1:4", "D1:5"}, {"D1:5"})
    m = known.item(item("memory", "m", 0.3, ["D1:9"]))  # the decisions' lineage, not the item's
    assert (m.kind, m.turns, m.stated) == ("memory", {"D1:1", "D1:2", "D1:3"}, {"D1:2"})


class FakeClient:
    """Answers every search with one memory and one turn per user, the turn the same for
    both users (both archive it); records what was asked."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, dict[str, Any]]] = []

    async def search(self, query: str, *, user_id: str, limit: int | None = None,
                     **options: Any) -> SearchResponse:
        self.asked.append((user_id, options))
        mid = f"m-{user_id}"
        items = [] if options.get("sources") == "turns" else [
            item("memory", mid, 0.09 if user_id.endswith("Ana") else 0.08, [])]
        items.append(item("turn", f"t-{user_id}", 0.05, ["D1:1", "D1:2"]))
        return SearchResponse.model_validate({"query_id": "q", "memories": [
            {"memory_id": mid, "version": 1, "type": "semantic", "content": mid,
             "importance": 3, "status": "active", "scope": "user", "created_at": 0.0,
             "updated_at": 0.0, "valid_from": 0.0, "score": 0.5, "recency": 1.0,
             "importance_score": 0.5, "relevance": 0.5}],
            "items": [i.model_dump() for i in items]})


async def test_every_view_is_asked_for_both_speakers_and_merged(conv):
    client, result = FakeClient(), Result("p", Tally())
    wide = frozenset({"D1:1", "D1:2", "D1:3", "D1:4", "D1:5"})
    known = Known({f"m-{u}": wide for u in conv.users}, {})
    views = await _ask(client, conv, conv.qa[0], 10, known, result)  # type: ignore[arg-type]
    assert set(views) == {v.name for v in VIEWS}
    assert len(client.asked) == 2 * 5  # fused (memories too), turns, dense, sparse, no recency
    primary = [o for _, o in client.asked[:2]]
    assert primary == [{"sources": "fused", "turn_match": "hybrid", "recency": True}] * 2
    assert all(o["record_hits"] is False for _, o in client.asked[2:])
    assert {(o["sources"], o["turn_match"], o["recency"]) for _, o in client.asked[2:]} == {
        ("turns", "hybrid", True), ("fused", "dense", True), ("fused", "sparse", True),
        ("fused", "hybrid", False)}
    assert len(result.search_ms) == 2  # the fused request's latency only
    assert [r.memory_id for r in views[MEMORIES]] == [f"m-{u}" for u in conv.users]
    fused = views["fused"]
    assert [r.kind for r in fused] == ["memory", "memory", "turn"]  # one turn for both users
    assert [r.kind for r in views["turns"]] == ["turn"]
    for v in VIEWS:
        result.views[v.name].add(conv.qa[0], views[v.name], v.capped)  # evidence D1:2
    summary = result.summary()
    assert summary["categories"] == {k: result.tally.row(k) for k in ("overall", "single-hop")}
    rows = {name: v["categories"]["overall"] for name, v in summary["views"].items()}
    assert rows[MEMORIES]["recall@5"] == 1.0 and rows["memories, width-capped"]["recall@5"] == 0
    assert rows["fused, width-capped"]["recall@5"] == 1.0  # the turn counts
    widths = {name: v["lineage_turns_mean"] for name, v in summary["views"].items()}
    assert widths[MEMORIES] == summary["lineage_turns_mean"] == 5.0
    assert widths["turns"] == 2.0 and widths["fused"] == 4.0


async def test_the_client_sends_fusion_options_only_when_given():
    bodies: list[dict[str, Any]] = []

    def answer(request: Request) -> Response:
        bodies.append(json.loads(request.content))
        return Response(200, json={"query_id": "q", "memories": [], "items": [
            item("turn", "t", 0.1, ["D1:1", "D1:2"]).model_dump()]})

    async with AsyncMemoryClient("http://x", "k", tenant_id="t",
                                 transport=answer) as client:
        plain = await client.search("q", user_id="u")
        narrowed = await client.search("q", user_id="u", sources="turns", turn_match="sparse",
                                       recency=False, record_hits=False)
    assert bodies[0] == {"query": "q"}
    assert bodies[1] == {"query": "q", "record_hits": False, "sources": "turns",
                         "turn_match": "sparse", "recency": False}
    assert plain.items[0].message_ids == ["D1:1", "D1:2"] and narrowed.items[0].kind == "turn"
