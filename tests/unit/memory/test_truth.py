"""What is true now (memory.truth): which turns state something replaced, by what and
when; read from both stores by the versions' lineage (store.versions)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from memstream.memory.archive import Turn
from memstream.memory.embedding import HashingEmbedder
from memstream.memory.model import Memory, MemoryType, Source, Status
from memstream.memory.store import Scope
from memstream.memory.truth import assess, resolve, states, truth_of

pytestmark = pytest.mark.unit

DAY = 86_400.0
NOW = 100 * DAY
EMB = HashingEmbedder()


def version(content: str, *, mid: str = "m1", v: int = 1, said: str = "a", at: float = DAY,
            status: Status = Status.ACTIVE, lineage: tuple[str, ...] | None = None,
            **extra: object) -> Memory:
    """Version ``v`` of memory ``mid``, stated by message ``said`` on day ``at``."""
    return Memory(memory_id=mid, tenant_id="t1", user_id="u1", type=MemoryType.EPISODIC,
                  content=content, importance=5, created_at=at, updated_at=at,
                  valid_from=at + 5, source=Source("s1", 0, 1, "j", f"op-{mid}-{v}",
                                                   lineage or (said,), at),
                  version=v, status=status, extra=dict(extra))


def closed(m: Memory, at: float, status: Status = Status.SUPERSEDED, **extra: object) -> Memory:
    return replace(m, status=status, valid_to=at, extra={**m.extra, **extra})


def turn(said: str, text: str = "I live in Lyon", at: float = DAY, context: str | None = None,
         context_text: str = "Where do you live?") -> Turn:
    ctx = None if context is None else {"message_id": context, "role": "assistant",
                                        "content": context_text, "ts": at - 60}
    return Turn(f"t-{said}", "s1", said, 1, "user", text, at, ctx)


LYON = version("Lives in Lyon", said="a", at=1 * DAY)
PORTO = version("Lives in Porto", v=2, said="b", at=2 * DAY)
BERLIN = version("Lives in Berlin", v=3, said="c", at=3 * DAY)


def chains(*versions: Memory) -> dict[str, list[Memory]]:
    out: dict[str, list[Memory]] = {}
    for v in sorted(versions, key=lambda v: v.version):
        out.setdefault(v.memory_id, []).append(v)
    return out


def test_an_update_replaces_what_the_older_turn_stated():
    old = closed(LYON, 2 * DAY)
    r = resolve(old, chains(old, PORTO), NOW)
    assert r is not None and (r.kind, r.current, r.direct, r.at) == (
        "superseded", PORTO, True, 2 * DAY)  # the replacing statement's event time
    assert resolve(PORTO, chains(old, PORTO), NOW) is None  # the live one is true


def test_a_chain_names_what_holds_now_and_when_the_first_change_came():
    a, b = closed(LYON, 2 * DAY), closed(PORTO, 3 * DAY)
    r = resolve(a, chains(a, b, BERLIN), NOW)
    assert r is not None and (r.current, r.direct, r.at) == (BERLIN, False, 2 * DAY)
    r = resolve(b, chains(a, b, BERLIN), NOW)
    assert r is not None and (r.current, r.direct, r.at) == (BERLIN, True, 3 * DAY)


def test_a_value_that_came_back_or_a_version_that_says_the_same_replaces_nothing():
    back = replace(LYON, version=3, source=replace(LYON.source, message_ids=("c",)))
    a, b = closed(LYON, 2 * DAY), closed(PORTO, 3 * DAY)
    assert resolve(a, chains(a, b, back), NOW) is None  # Lyon -> Porto -> Lyon
    downweighted = replace(LYON, version=2, extra={"weight": 0.5})
    assert resolve(a, chains(a, downweighted), NOW) is None  # a decay's version
    merged = closed(LYON, 2 * DAY, merged_into="m9")
    survivor = version("Lives in Lyon, France", mid="m9")
    assert resolve(merged, chains(merged, survivor), NOW) is None


def test_another_memory_can_hold_the_value_now():
    lost = closed(LYON, 2 * DAY, superseded_by="m9")  # a consolidation kept the newest
    newer = version("Lives in Porto", mid="m9", said="b", at=2 * DAY)
    r = resolve(lost, chains(lost, newer), NOW)
    assert r is not None and (r.kind, r.current) == ("superseded", newer)
    late = version("Lives in Lyon", mid="m8", status=Status.SUPERSEDED, history_of="m9")
    r = resolve(late, chains(late, newer), NOW)  # a late fact kept as history
    assert r is not None and r.current == newer


def test_a_retraction_and_an_expiry_end_a_statement():
    mocks = closed(version("Uses mocks"), 4 * DAY, Status.DELETED, closed_kind="extraction")
    r = resolve(mocks, chains(mocks), NOW)
    assert r is not None and (r.kind, r.at, r.current) == ("deleted", 4 * DAY, None)
    said = replace(mocks, extra={**mocks.extra, "closed_ts": 3 * DAY})  # when it was said
    assert resolve(said, chains(said), NOW).at == 3 * DAY  # type: ignore[union-attr]
    budget = replace(version("Budget this month: 50k"), expires_at=30 * DAY)
    swept = closed(budget, 30 * DAY, Status.DELETED, closed_kind="consolidation")
    assert resolve(swept, chains(swept), NOW).kind == "expired"  # type: ignore[union-attr]
    r = resolve(budget, chains(budget), NOW)  # not swept yet: expired all the same
    assert r is not None and (r.kind, r.at) == ("expired", 30 * DAY)
    assert resolve(budget, chains(budget), 10 * DAY) is None
    archived = closed(LYON, 9 * DAY, Status.ARCHIVED)  # decayed: still true
    assert resolve(archived, chains(archived), NOW) is None


def test_a_turn_states_a_version_of_a_narrow_lineage_or_of_its_words():
    narrow, wide = LYON, version("Lives in Lyon", lineage=("x", "a", "y", "z"))
    assert states(narrow, "a", "anything at all", 0.0)
    assert not states(narrow, "q", "I live in Lyon", 0.0)  # not in its lineage
    assert states(wide, "a", "We live in Lyon now", 0.0)
    assert not states(wide, "a", "I love hiking", 0.0)  # the job's other message
    assert states(wide, "a", "I love hiking", DAY)  # the lineage names it by its time


def test_assess_marks_hides_and_reads_a_turns_context():
    old = closed(LYON, 2 * DAY)
    by_user = closed(version("PIN is 4711", mid="m5", said="p"), 3 * DAY, Status.DELETED,
                     closed_kind="deletion")
    reply = Turn("t-r", "s1", "r", 2, "assistant", "Nice, Lyon is lovely!", DAY,
                 {"message_id": "a", "role": "user", "content": "I live in Lyon", "ts": DAY})
    moved = turn("b", "We moved to Porto", 2 * DAY, context="a")
    found = assess([turn("a"), turn("p", "my PIN is 4711"), reply, moved],
                   [old, PORTO, by_user], NOW)
    assert set(found.replaced) == {"t-a", "t-r"}  # the reply shows its context's statement
    assert found.replaced["t-a"].current == PORTO
    assert found.hidden == {"t-p"}
    assert found.states_live["t-b"] == {"m1"}  # it states the live one: not stale


def test_a_user_deletion_hides_every_statement_of_the_memory():
    old = closed(LYON, 2 * DAY)
    deleted = closed(PORTO, 5 * DAY, Status.DELETED, closed_kind="deletion")
    found = assess([turn("a"), turn("b", "We moved to Porto", 2 * DAY)], [old, deleted], NOW)
    assert found.hidden == {"t-a", "t-b"} and not found.replaced


def test_truth_of_reads_the_versions_by_lineage_and_follows_them(store):
    old = closed(LYON, 2 * DAY)
    other_user = replace(old, user_id="u2", memory_id="m7")
    store.write([old, PORTO, version("Works at Acme", mid="m2", said="w"),
                 other_user], [EMB.embed(["x"])[0]] * 4)
    scope = Scope("t1", "u1")
    assert {v.memory_id for v in store.versions(scope, message_ids=["a"])} == {"m1"}
    assert {(v.memory_id, v.version) for v in store.versions(scope, memory_ids=["m1"])} == {
        ("m1", 1), ("m1", 2)}
    assert store.versions(scope) == []
    found = truth_of(store, scope, [turn("a"), turn("w", "I work at Acme")], NOW)
    assert set(found.replaced) == {"t-a"} and found.replaced["t-a"].current == PORTO
    assert found.states_live["t-w"] == {"m2"}
    assert truth_of(store, Scope("t1", "u3"), [turn("a")], NOW).replaced == {}


def test_an_edge_shard_made_before_the_lineage_index_gets_it_once(tmp_path):
    import qdrant_edge as qe

    from memstream.memory.store import edge
    from memstream.memory.store.edge import EdgeStore

    path = tmp_path / "old"
    store = EdgeStore(path, EMB.dim)
    store.write([closed(LYON, 2 * DAY), PORTO], [EMB.embed(["x"])[0]] * 2)
    store.close()
    # what a shard of the release before held: no index, no packed lineage
    shard = qe.EdgeShard.load(str(path / "shard"), edge._config(qe, EMB.dim, sparse=True))
    records, _ = shard.scroll(qe.ScrollRequest(limit=10, with_payload=True))
    for r in records:
        payload = dict(r.payload)
        payload["source"] = {k: v for k, v in payload["source"].items() if k != "message_ids"}
        shard.update(qe.UpdateOperation.overwrite_payload([r.id], payload))
    shard.update(qe.UpdateOperation.delete_field_index("source.message_ids"))
    assert "source.message_ids" not in shard.info().payload_schema
    assert shard.scroll(qe.ScrollRequest(limit=10, filter=qe.Filter(must=[qe.FieldCondition(
        key="source.message_ids", match=qe.MatchValue("a"))])))[0] == []
    shard.flush()
    shard.close()
    reopened = EdgeStore(path, EMB.dim)
    try:
        assert [(v.memory_id, v.version) for v in
                reopened.versions(Scope("t1", "u1"), message_ids=["a"])] == [("m1", 1)]
    finally:
        reopened.close()
