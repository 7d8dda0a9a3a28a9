"""The episodic archive: the sparse encoder (EN, ZH), the archive changes of a job, the
turn records in both stores (dense, sparse, window, sweep, erase), the fusion and the
dedup by lineage."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from memstream.memory import lexical
from memstream.memory.applying import apply_change, apply_decision, build_decision
from memstream.memory.archive import (
    ARCHIVE_OP,
    TURN_STATUS,
    Turn,
    archive_changes,
    stated_by,
    turns_of,
    weighted_rrf,
)
from memstream.memory.embedding import HashingEmbedder
from memstream.memory.extraction import JobOutcome
from memstream.memory.hybrid import Fusion, fuse, recall_turns, turn_candidates
from memstream.memory.model import Memory, MemoryType, Source
from memstream.memory.scoring import Scored
from memstream.memory.store import Scope, TurnWindow, checksum, held_records
from memstream.memory.store.rebuild_fold import rebuild
from memstream.topics.schemas import ExtractionJob, JobMessage, TriggerReason

pytestmark = pytest.mark.unit

EMB = HashingEmbedder()
T0 = datetime(2026, 3, 1, tzinfo=UTC)


class _Model:
    name = "rules"
    prompt_version = "test"


def conversation(lines: list[tuple[str, str]], *, job_id: str = "job-1", seq: int = 1,
                 user: str = "u1", session: str = "s1", start: int = 0,
                 context: list[tuple[str, str]] = (), day: int = 0) -> ExtractionJob:
    def message(n: int, role: str, text: str) -> JobMessage:
        return JobMessage(seq=n, message_id=f"{session}-m{n}", role=role, content=text,
                          ts=T0 + timedelta(days=day, minutes=n))

    before = [message(start - len(context) + i, r, t) for i, (r, t) in enumerate(context)]
    msgs = [message(start + i, r, t) for i, (r, t) in enumerate(lines)]
    return ExtractionJob(job_id=job_id, seq=seq, tenant_id="t1", user_id=user,
                         session_id=session, from_seq=start, to_seq=start + len(lines),
                         reason=TriggerReason.THRESHOLD, messages=msgs, context=before,
                         created_at=T0)


def archived(store, job: ExtractionJob) -> list:
    """Decide ``job`` with no memory op (the archive alone) and apply it."""
    changes = archive_changes(job, EMB.embed, EMB.name, 1.0)
    decision = build_decision(job, JobOutcome(), _Model(), 1.0, changes)
    apply_decision(store, decision)
    return changes


# --- the sparse encoder --------------------------------------------------------------------

def test_english_terms_are_stemmed_lower_cased_and_stop_words_dropped():
    assert lexical.terms("The Painters were PAINTING landscapes!") == [
        "painter", "paint", "landscap"]
    assert lexical.terms("I moved to Porto in 2024") == ["move", "porto", "2024"]


def test_chinese_text_is_indexed_as_characters_and_their_pairs():
    assert lexical.terms("我喜欢咖啡") == ["我", "喜", "欢", "咖", "啡",
                                          "我喜", "喜欢", "欢咖", "咖啡"]
    # a word of the query matches the text wherever it stands, mixed scripts too
    doc, q = lexical.document("我每天早上喝咖啡, latte please"), lexical.query("咖啡")
    assert set(q.indices) <= set(doc.indices)
    assert lexical.term_id("latt") in lexical.document("lattes").indices


def test_document_weights_saturate_with_term_frequency_and_shrink_with_length():
    once = dict(zip(*(lambda v: (v.indices, v.values))(lexical.document("coffee")),
                    strict=True))
    thrice = dict(zip(*(lambda v: (v.indices, v.values))(
        lexical.document("coffee coffee coffee")), strict=True))
    long = dict(zip(*(lambda v: (v.indices, v.values))(
        lexical.document("coffee " + " ".join(f"word{i}" for i in range(60)))), strict=True))
    cid = lexical.term_id("coffe")
    assert once[cid] < thrice[cid] < lexical.K1 + 1  # more, but bounded
    assert long[cid] < once[cid]
    assert lexical.query("coffee coffee tea").values == (1.0, 1.0)
    assert not lexical.document("the and of") and not lexical.query("?!")


# --- the archive changes of a job ---------------------------------------------------------

def test_a_jobs_non_trivial_user_and_assistant_turns_are_archived_with_their_context():
    job = conversation([("user", "I adopted a dog named Biscuit"), ("assistant", "ok"),
                        ("system", "be brief"), ("assistant", "What breed is Biscuit?"),
                        ("user", "thanks")], context=[("user", "Guess what happened!")],
                       start=1)
    kept = turns_of(job)
    assert [(m.content, c.content if c else None) for m, c in kept] == [
        ("I adopted a dog named Biscuit", "Guess what happened!"),
        ("What breed is Biscuit?", None)]  # its previous message is a system one
    changes = archive_changes(job, EMB.embed, EMB.name, 5.0)
    assert [c.op for c in changes] == [ARCHIVE_OP, ARCHIVE_OP]
    first = changes[0]
    assert first.records[0]["status"] == TURN_STATUS and "content" not in first.after
    assert {k: v for k, v in first.records[0].items() if k not in ("content", "context")} == (
        first.after)
    assert first.lineage.message_ids == ["s1-m0", "s1-m1"] and first.lineage.kind == "archive"
    assert first.vector is not None and len(first.vector) == EMB.dim
    # a tool job archives nothing; the same job archives the same ids again
    assert [c.change_id for c in archive_changes(job, EMB.embed, EMB.name, 9.0)] == [
        c.change_id for c in changes]


def test_archived_turns_are_written_once_and_never_seen_as_memories(store):
    job = conversation([("user", "I adopted a dog named Biscuit"),
                        ("assistant", "Biscuit is a lovely name for a beagle")])
    changes = archived(store, job)
    scope = Scope("t1", "u1")
    assert store.list(scope, statuses=None) == [] and store.count() == 0
    found = store.search_turns(scope, 5, sparse=lexical.query("beagle"))
    assert [p["content"] for p, _ in found] == ["Biscuit is a lovely name for a beagle"]
    near = store.search_turns(scope, 5, vector=EMB.embed(["dog named Biscuit"])[0])
    assert {p["message_id"] for p, _ in near} == {"s1-m0", "s1-m1"}
    # applied again (a replay): nothing new; another user sees nothing
    assert not any(apply_change(store, c) for c in changes)
    assert store.search_turns(Scope("t1", "u2"), 5, sparse=lexical.query("beagle")) == []
    assert store.search_turns(Scope("t2", "u1"), 5, vector=near[0][0] and
                              EMB.embed(["dog"])[0]) == []


def test_a_turn_search_keeps_to_its_session_and_time_range_and_the_sweep_drops_old_turns(store):
    archived(store, conversation([("user", "my sister lives in Lisbon")], session="s1"))
    archived(store, conversation([("user", "my brother lives in Lisbon too")], session="s2",
                                 job_id="job-2", seq=2, day=10))
    scope, words = Scope("t1", "u1"), lexical.query("Lisbon")
    assert len(store.search_turns(scope, 5, sparse=words)) == 2
    one = store.search_turns(scope, 5, sparse=words, window=TurnWindow(session_id="s2"))
    assert [p["session_id"] for p, _ in one] == ["s2"]
    later = T0.timestamp() + 5 * 86_400
    assert [p["session_id"] for p, _ in store.search_turns(
        scope, 5, sparse=words, window=TurnWindow(since=later))] == ["s2"]
    assert [p["session_id"] for p, _ in store.search_turns(
        scope, 5, sparse=words, window=TurnWindow(until=later))] == ["s1"]
    assert store.sweep_turns(later) == 1
    assert [p["session_id"] for p, _ in store.search_turns(scope, 5, sparse=words)] == ["s2"]


def test_a_forget_me_erases_the_archive_and_a_rebuild_reproduces_it(store, tmp_path):
    from memstream.memory.store.edge import EdgeStore

    changes = archived(store, conversation([("user", "I run marathons in Berlin"),
                                            ("assistant", "Which one was your fastest?")]))
    changes += archived(store, conversation([("user", "Berlin in 3:05, last year")],
                                            job_id="job-2", seq=2, start=2))
    rebuilt = EdgeStore(tmp_path / "rebuilt", EMB.dim)
    try:
        rebuild(rebuilt, changes)
        scope, words = Scope("t1", "u1"), lexical.query("Berlin marathon")
        assert ([p for p, _ in rebuilt.search_turns(scope, 5, sparse=words)]
                == [p for p, _ in store.search_turns(scope, 5, sparse=words)])
        assert len(rebuilt.search_turns(scope, 5, sparse=words)) == 3
    finally:
        rebuilt.close()
    assert held_records(store, Scope("t1", "u1")) == 3  # the turns count as the user's
    store.erase(Scope("t1", "u1"))
    assert held_records(store, Scope("t1", "u1")) == 0
    assert store.search_turns(Scope("t1", "u1"), 5, sparse=lexical.query("Berlin")) == []
    assert store.search_turns(Scope("t1", "u1"), 5, vector=EMB.embed(["Berlin"])[0]) == []


# --- fusion and dedup ----------------------------------------------------------------------

def turn(mid: str, msg: str, ts: float = 0.0, context: str | None = None) -> Turn:
    return Turn(mid, "s1", msg, 1, "user", f"text {mid}", ts,
                {"message_id": context, "role": "assistant", "content": "q"} if context
                else None)


def scored(mid: str, message_ids: tuple[str, ...], score: float = 1.0) -> Scored:
    """A memory "memory <mid>" (related to a query of those words), ``score`` its score and
    its relevance."""
    m = Memory(memory_id=mid, tenant_id="t1", user_id="u1", type=MemoryType.EPISODIC,
               content=f"memory {mid}", importance=5, created_at=0.0, updated_at=0.0,
               valid_from=0.0, source=Source("s1", 0, 1, "j", "op-" + mid, message_ids))
    return Scored(m, score, 0.0, 0.0, score)


def test_weighted_rrf_adds_each_lists_reciprocal_rank():
    fused = weighted_rrf([(1.0, ["a", "b"]), (0.5, ["b", "c"]), (0.0, ["d"])], k=10)
    assert fused == pytest.approx({"a": 1 / 11, "b": 1 / 12 + 0.5 / 11, "c": 0.5 / 12})


def test_a_turn_found_by_meaning_and_words_rises_above_one_found_once():
    f = Fusion(weights=(1.0, 1.0, 1.0, 0.0), k=10)
    both, dense_only, sparse_only = turn("t1", "m1"), turn("t2", "m2"), turn("t3", "m3")
    items = fuse([], [dense_only, both], [sparse_only, both], f, k=4, query="text")
    assert items[0].kind == "turn" and items[0].turn == both
    assert {i.key for i in items} == {"t:t1", "t:t2", "t:t3"}
    assert [i.key for i in fuse([], [dense_only], [sparse_only], f, k=1,
                                query="text")] == ["t:t2"]  # a tie goes by key


def test_the_memories_that_answer_lead_every_turn():
    f = Fusion(weights=(0.5, 1.0, 1.0, 0.0), memory_floor=0.15)
    answer = scored("x", ("m9",), 0.4)
    items = fuse([answer], [turn("t1", "m1")], [turn("t1", "m1")], f, k=3, query="memory x")
    assert [i.key for i in items] == ["m:x", "t:t1"] and items[0].score > 1 > items[1].score
    # related by meaning alone, or by words alone: it does not lead (nor take a place)
    weak = scored("x", ("m9",), 0.1)
    assert [i.key for i in fuse([weak], [turn("t1", "m1")], [], f, k=3,
                                query="memory x")] == ["t:t1"]
    assert [i.key for i in fuse([answer], [turn("t1", "m1")], [], f, k=3,
                                query="unrelated words")] == ["t:t1"]


def test_sources_narrow_the_fusion_and_recency_breaks_ties_toward_newer_turns():
    old, new = turn("t1", "m1", ts=10.0), turn("t2", "m2", ts=20.0)
    mem = [scored("x", ("m9",), 0.9), scored("y", ("m8",), 0.5)]
    only_mem = fuse(mem, [old], [old], Fusion(sources="memories"), k=5, query="memory")
    assert [i.key for i in only_mem] == ["m:x", "m:y"]
    only_turns = fuse(mem, [old, new], [], Fusion(sources="turns", weights=(1, 1, 0, 0)), k=5,
                      query="memory")
    assert [i.key for i in only_turns] == ["t:t1", "t:t2"]
    recent = fuse([], [old, new], [new, old], Fusion(weights=(1, 1, 1, 0.5)), k=5)
    assert [i.key for i in recent] == ["t:t2", "t:t1"]
    flat = fuse([], [old, new], [new, old], Fusion(weights=(1, 1, 1, 0.5), recency=False), k=5)
    assert flat[0].score == pytest.approx(flat[1].score)


def test_a_turn_a_returned_memory_states_in_full_is_left_out():
    stated = turn("t1", "m1", context="m0")
    wider = turn("t2", "m5")
    assert stated_by(stated, [("m1",)]) and stated_by(stated, [("m0", "m1")])
    assert not stated_by(stated, [("m1", "m2")]) and not stated_by(stated, [()])
    assert not stated_by(stated, [("m0",)])  # a memory of its context alone: not this turn
    items = fuse([scored("x", ("m1",)), scored("y", ("m4", "m5", "m6"))],
                 [stated, wider], [stated, wider], Fusion(), k=10, query="memory")
    assert {i.key for i in items} == {"m:x", "m:y", "t:t2"}


def test_turn_candidates_apply_the_archives_age_bound(store):
    archived(store, conversation([("user", "we hiked the Alps")], day=0))
    archived(store, conversation([("user", "we hiked the Andes")], job_id="job-2", seq=2,
                                 start=1, day=40))
    now = T0.timestamp() + 45 * 86_400
    vector, scope = EMB.embed(["hiked"])[0], Scope("t1", "u1")
    dense, sparse = turn_candidates(store, scope, vector, "hiked", Fusion(), now)
    assert len(dense) == len(sparse) == 2
    dense, sparse = turn_candidates(store, scope, vector, "hiked",
                                    Fusion(archive_days=30), now)
    assert [t.content for t in dense] == [t.content for t in sparse] == ["we hiked the Andes"]
    dense, sparse = turn_candidates(store, scope, vector, "hiked", Fusion(match="sparse"), now)
    assert dense == [] and len(sparse) == 2


@pytest.mark.parametrize("archive", [True, False])
def test_a_range_of_trivial_user_turns_goes_as_a_job_only_to_archive_an_assistant_turn(archive):
    from memstream.memory.coalescing import on_message
    from memstream.memory.ingest_state import Policy, UserState
    from tests.unit.builders import msg

    def run(lines: list[tuple[str, str]]) -> tuple[list, list]:
        state, jobs, resolved = UserState("t1", "u1"), [], []
        for role, text in lines:
            step = on_message(state, msg(text, role=role), 0.0,
                              Policy(min_new_messages=4, archive=archive))
            state, jobs, resolved = step.state, jobs + step.jobs, resolved + step.resolved
        return jobs, resolved

    jobs, resolved = run([("user", "ok"), ("assistant", "Here is the second half of the story"),
                          ("user", "谢谢"), ("user", "继续")])
    assert [(j.from_seq, j.to_seq) for j in jobs] == ([(0, 4)] if archive else [])
    assert [(r.from_seq, r.to_seq) for r in resolved] == ([] if archive else [(0, 4)])
    jobs, resolved = run([("user", "ok"), ("assistant", "👍"), ("user", "谢谢"),
                          ("system", "the user is tired")])
    assert jobs == [] and [(r.from_seq, r.to_seq) for r in resolved] == [(0, 4)]


def test_the_meaning_query_leaves_out_proper_names_and_nothing_else():
    from memstream.memory.hybrid import meaning_query

    assert meaning_query("When did Caroline go to the LGBTQ support group?") == (
        "When did go to the LGBTQ support group?")
    assert meaning_query("What is Melanie's favourite food? Ask Ben.") == (
        "What is favourite food? Ask .")
    assert meaning_query("what did I say about the trip") == "what did I say about the trip"
    assert meaning_query("我住在哪里") == "我住在哪里"
    assert meaning_query("Lisbon") == "Lisbon"  # nothing would be left: unchanged
    assert meaning_query(" What did José say?") == "What did say?"
    assert meaning_query("(Where) did Anna go") == "(Where) did go"
    assert meaning_query("Tell me: Where does Ana live") == "Tell me: Where does live"


def test_one_users_words_do_not_move_anothers_ranking(store):
    archived(store, conversation([("user", "I ate an apple and a pear")]))
    before = store.search_turns(Scope("t1", "u1"), 5, sparse=lexical.query("apple"))
    for n in range(5):  # other users who talk of apples: the word is common there
        archived(store, conversation([("user", "apple apple apple")], user=f"o{n}",
                                     job_id=f"o{n}"))
    after = store.search_turns(Scope("t1", "u1"), 5, sparse=lexical.query("apple"))
    assert [s for _, s in after] == pytest.approx([s for _, s in before])


def test_turns_past_the_archive_days_are_not_compared_by_a_verify(store):
    archived(store, conversation([("user", "an old turn about Oslo")], day=0))
    archived(store, conversation([("user", "a new turn about Oslo")], job_id="job-2", seq=2,
                                 start=1, day=40))
    since = T0.timestamp() + 30 * 86_400
    everything = checksum.digests(store.scan(vectors=True))
    kept = checksum.digests(store.scan(vectors=True), since)
    assert everything.users[("t1", "u1")][0] == 2 and kept.users[("t1", "u1")][0] == 1
    store.sweep_turns(since)
    assert checksum.digests(store.scan(vectors=True)).users == kept.users


def test_the_turns_a_memory_deleted_by_the_user_came_from_are_not_returned(store):
    from memstream.memory.model import Status

    archived(store, conversation([("user", "my PIN is 4711, keep it"),
                                  ("user", "my bank is in Porto")]))
    gone = Memory(memory_id="m1", tenant_id="t1", user_id="u1", type=MemoryType.EPISODIC,
                  content="PIN is 4711", importance=5, created_at=0.0, updated_at=0.0,
                  valid_from=0.0, source=Source("s1", 0, 2, "j", "op-1", ("s1-m0",)),
                  status=Status.DELETED, extra={"closed_kind": "deletion"})
    contradicted = replace_memory(gone, "m2", ("s1-m1",), "delete")
    store.write([gone, contradicted], [EMB.embed(["PIN"])[0]] * 2)
    vector, scope = EMB.embed(["PIN bank"])[0], Scope("t1", "u1")
    dense, sparse, truth = recall_turns(store, scope, vector, "PIN 4711 bank Porto",
                                        Fusion(), 0.0)
    # the user's deletion hides its source turn; a model's DELETE (a retraction) marks it
    assert {t.message_id for t in dense} == {"s1-m0", "s1-m1"}
    items = fuse([], dense, sparse, Fusion(), 5, query="PIN 4711 bank Porto", truth=truth)
    assert [(i.turn.message_id, i.replaced.kind) for i in items if i.turn and i.replaced] == [
        ("s1-m1", "deleted")]
    assert {i.turn.message_id for i in items if i.turn} == {"s1-m1"}


def replace_memory(m: Memory, mid: str, ids: tuple[str, ...], kind: str) -> Memory:
    from dataclasses import replace as copy

    return copy(m, memory_id=mid, source=copy(m.source, op_id="op-" + mid, message_ids=ids),
                extra={"closed_kind": kind})
