"""recall() over a real store (both backends): scope, visibility, blocks and hit statistics."""

from __future__ import annotations

import pytest

from memstream.memory.access_stats import AccessStats
from memstream.memory.embedding import HashingEmbedder
from memstream.memory.model import GLOBAL_USER
from memstream.memory.retrieval import Query, memory_dict, recall
from memstream.memory.scoring import Weights
from memstream.memory.store import Scope
from tests.unit.builders import make_store, memory

pytestmark = pytest.mark.unit

EMB = HashingEmbedder()
HOUR = 3600.0
NOW = 1000 * HOUR
W = Weights()


@pytest.fixture(params=["edge", "server"])
def store(request, tmp_path):
    s = make_store(request.param, tmp_path, EMB.dim)
    yield s
    s.close()


def put(store, *memories) -> None:
    store.write(list(memories), EMB.embed([m.content for m in memories]))


def ask(store, text="tea", user="u1", weights=W, **kw):
    return recall(store, EMB, Query("t1", user, text, **kw), NOW, weights)


def ids(found) -> list[str]:
    return [s.memory.memory_id for s in found.scored]


def test_other_users_never_come_back_and_the_global_scope_does(store):
    put(store, memory("Drinks green tea", mid="mine"),
        memory("Drinks green tea", mid="theirs", user="u2"),
        memory("Green tea contains caffeine", mid="shared", user=GLOBAL_USER, type="semantic"),
        memory("Drinks green tea", mid="elsewhere", tenant="t2"))
    assert sorted(ids(ask(store, "green tea", k=10))) == ["mine", "shared"]
    assert ids(ask(store, "green tea", k=10, include_global=False)) == ["mine"]
    assert sorted(ids(ask(store, "green tea", user="u2", k=10))) == ["shared", "theirs"]
    assert [memory_dict(s.memory)["scope"] for s in ask(store, "caffeine", k=1).scored] == [
        "global"]


def test_archived_expired_superseded_and_deleted_are_hidden_by_default(store):
    put(store, memory("Drinks black tea", mid="active"),
        memory("Drinks oolong tea", mid="archived", status="archived"),
        memory("Drinks mint tea", mid="expired", expires_at=NOW - 1),
        memory("Drinks later tea", mid="later", expires_at=NOW + HOUR),
        memory("Drinks white tea", mid="old", status="superseded"),
        memory("Drinks herbal tea", mid="gone", status="deleted"))
    assert sorted(ids(ask(store, "drinks tea", k=10))) == ["active", "later"]
    assert ids(ask(store, "drinks tea", k=10, statuses=("archived",))) == ["archived"]
    assert sorted(ids(ask(store, "drinks tea", k=10, statuses=("active", "superseded")))) == [
        "active", "later", "old"]
    assert sorted(ids(ask(store, "drinks tea", k=10, include_expired=True))) == [
        "active", "expired", "later"]


def test_k_bounds_the_answer_and_an_empty_query_finds_nothing(store):
    put(store, *[memory(f"Drinks tea number {n}", mid=f"m{n}") for n in range(8)])
    assert len(ask(store, "drinks tea", k=3).scored) == 3
    assert ask(store, "   ").scored == []


def test_procedural_rules_come_apart_own_first_then_global(store):
    put(store, memory("Drinks tea every morning", mid="fact"),
        memory("Always answer about tea in German", mid="rule-low", type="procedural",
               importance=3),
        memory("Never recommend coffee instead of tea", mid="rule-high", type="procedural",
               importance=9),
        memory("Cite sources about tea", mid="rule-global", type="procedural",
               user=GLOBAL_USER),
        memory("Talk like a pirate about tea", mid="rule-u2", type="procedural", user="u2"),
        memory("Old tea rule", mid="rule-old", type="procedural", status="archived"))
    found = ask(store, "tea", k=10)
    assert ids(found) == ["fact"]
    assert [m.memory_id for m in found.procedural] == ["rule-high", "rule-low", "rule-global"]
    assert [m.memory_id for m in ask(store, "tea", include_global=False).procedural] == [
        "rule-high", "rule-low"]
    assert ask(store, "tea", k=10).procedural == found.procedural
    assert recall(store, EMB, Query("t1", "u1", "tea"), NOW, W, procedural=False,
                  core=False).procedural == []


def test_core_memory_is_a_dict_of_blocks_not_a_search_hit(store):
    put(store, memory("Name: Ann, drinks tea", mid="core-1", slot="core:profile", version=2),
        memory("Name: An, drinks tea", mid="core-1", slot="core:profile",
               status="superseded"),
        memory("Answer briefly about tea", mid="core-2", slot="core:instructions"),
        memory("Name: Bob, drinks tea", mid="core-3", slot="core:profile", user="u2"),
        memory("Drinks tea", mid="fact"))
    found = ask(store, "drinks tea", k=10)
    assert ids(found) == ["fact"]
    assert found.core == {"profile": "Name: Ann, drinks tea",
                          "instructions": "Answer briefly about tea"}
    assert ask(store, "drinks tea", user="u2").core == {"profile": "Name: Bob, drinks tea"}


def test_hit_statistics_are_joined_per_reader(store):
    put(store, memory("Drinks green tea", mid="mine"),
        memory("Green tea is a tea", mid="shared", user=GLOBAL_USER, type="semantic"))
    store.put_access(Scope("t1", "u1"), [AccessStats("mine", NOW - HOUR, 4),
                                         AccessStats("shared", NOW - 2 * HOUR, 2)])
    seen = {s.memory.memory_id: (s.memory.access_count, s.memory.last_accessed_at)
            for s in ask(store, "green tea", k=10).scored}
    assert seen == {"mine": (4, NOW - HOUR), "shared": (2, NOW - 2 * HOUR)}
    [other] = ask(store, "green tea", user="u2", k=10).scored  # u2's own hits: none
    assert (other.memory.access_count, other.memory.last_accessed_at) == (0, None)


def test_a_recent_hit_ranks_above_an_equally_relevant_memory_never_hit(store):
    put(store, memory("The user likes hiking in the mountains", mid="never-hit"),
        memory("The user likes hiking in the mountain", mid="hit"))
    query = "likes hiking in the mountains"
    favour_recency = Weights(recency=3.0, importance=1.0, relevance=1.0)
    ignore_recency = Weights(recency=0.0, importance=1.0, relevance=1.0)
    assert ids(ask(store, query, weights=favour_recency)) == ["never-hit", "hit"]
    store.put_access(Scope("t1", "u1"), [AccessStats("hit", NOW - HOUR, 1)])
    assert ids(ask(store, query, weights=favour_recency)) == ["hit", "never-hit"]
    assert ids(ask(store, query, weights=ignore_recency)) == ["never-hit", "hit"]
    store.put_access(Scope("t1", "u2"), [AccessStats("never-hit", NOW, 9)])  # not u1's hit
    assert ids(ask(store, query, weights=favour_recency)) == ["hit", "never-hit"]


# --- the store's list filters ----------------------------------------------------------------

def test_list_filters_by_type_and_slot(store):
    put(store, memory("a fact", mid="f"), memory("a rule", mid="r", type="procedural"),
        memory("profile", mid="p", slot="core:profile"),
        memory("home", mid="h", slot="residence"),
        memory("global rule", mid="g", type="procedural", user=GLOBAL_USER))
    scope = Scope("t1", "u1")

    def listed(**kw):
        return sorted(m.memory_id for m in store.list(scope, **kw))
    assert listed(types=["procedural"]) == ["r"]
    assert listed(types=["episodic"]) == ["f", "h", "p"]
    assert listed(slots=["core:profile", "residence"]) == ["h", "p"]
    assert listed(types=["procedural"], slots=["residence"]) == []
    assert listed(types=[], slots=None) == []
    assert sorted(m.memory_id for m in store.list(Scope("t1", "u1", include_global=True),
                                                  types=["procedural"])) == ["g", "r"]


def test_many_rules_near_the_query_do_not_crowd_out_the_facts(store):
    put(store, *[memory(f"Always drink tea rule {n}", mid=f"rule-{n}", type="procedural")
                 for n in range(30)], memory("Drinks tea daily", mid="fact"))
    assert ids(ask(store, "always drink tea rule", k=1)) == ["fact"]
