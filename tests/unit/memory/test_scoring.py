"""Retrieval scoring (SPEC §5): recency decay, weights, normalisation, visibility, ties."""

from __future__ import annotations

import itertools
import math

import pytest

from memstream.core.errors import ConfigError
from memstream.memory.model import Memory, MemoryType, Source, Status
from memstream.memory.scoring import Weights, rank, recency, visible

pytestmark = pytest.mark.unit

HOUR = 3600.0
NOW = 1_800_000_000.0
_ids = itertools.count()


def mem(content: str = "Lives in Berlin.", *, importance: int = 5, age_h: float = 0.0,
        accessed_h: float | None = None, mid: str | None = None, **changes) -> Memory:
    """A memory updated ``age_h`` hours before NOW (and accessed ``accessed_h`` hours before)."""
    ts = NOW - age_h * HOUR
    base = Memory(
        memory_id=mid or f"m{next(_ids)}", tenant_id="t1", user_id="u1",
        type=MemoryType.EPISODIC, content=content, importance=importance,
        created_at=ts, updated_at=ts, valid_from=ts,
        source=Source("s1", 0, 1, "j1", "op1"),
        last_accessed_at=None if accessed_h is None else NOW - accessed_h * HOUR)
    return base.evolve(**changes)


# --- recency ----------------------------------------------------------------------------


@pytest.mark.parametrize("hours", [0, 1, 24, 24 * 30, 24 * 90])
def test_recency_decays_per_hour(hours):
    assert recency(mem(age_h=hours), NOW, 0.995) == pytest.approx(0.995**hours)


def test_recency_after_a_day():
    assert recency(mem(age_h=24), NOW, 0.995) == pytest.approx(0.8867, abs=1e-4)


def test_recency_is_monotone_in_age():
    values = [recency(mem(age_h=h), NOW, 0.995) for h in (0, 1, 10, 100, 1000)]
    assert values == sorted(values, reverse=True)
    assert values[0] == 1.0 and values[-1] < 0.01


def test_recency_prefers_last_access_then_updated_then_created():
    accessed = mem(age_h=100, accessed_h=2)
    assert recency(accessed, NOW, 0.995) == pytest.approx(0.995**2)
    updated = mem(age_h=100).evolve(updated_at=NOW - 5 * HOUR)
    assert recency(updated, NOW, 0.995) == pytest.approx(0.995**5)
    created_only = mem(age_h=7).evolve(updated_at=None)  # an old payload without it
    assert recency(created_only, NOW, 0.995) == pytest.approx(0.995**7)


def test_future_timestamp_does_not_exceed_one():
    skewed = mem(age_h=-3)  # written by a clock 3 hours ahead
    assert recency(skewed, NOW, 0.995) == 1.0
    assert rank([(skewed, 1.0)], NOW, Weights(), 1)[0].recency == 1.0


# --- weights and order --------------------------------------------------------------------


def test_weights_swap_order_of_old_relevant_and_recent_weak():
    old_relevant = mem("Allergic to peanuts.", age_h=24 * 60)
    recent_weak = mem("Had pasta for lunch.", age_h=1)
    candidates = [(old_relevant, 0.9), (recent_weak, 0.4)]

    by_relevance = rank(candidates, NOW, Weights(recency=0.2, relevance=2.0), k=2)
    by_recency = rank(candidates, NOW, Weights(recency=2.0, relevance=0.2), k=2)

    assert [s.memory for s in by_relevance] == [old_relevant, recent_weak]
    assert [s.memory for s in by_recency] == [recent_weak, old_relevant]


def test_score_is_weighted_sum_of_the_returned_components():
    w = Weights(recency=0.5, importance=2.0, relevance=1.5)
    (s,) = rank([(mem(importance=7, age_h=10), 0.6)], NOW, w, k=1)
    assert s.recency == pytest.approx(0.995**10)
    assert s.importance == pytest.approx(6 / 9)
    assert s.relevance == pytest.approx(0.6)
    assert s.score == pytest.approx(0.5 * s.recency + 2.0 * s.importance + 1.5 * s.relevance)


@pytest.mark.parametrize(("importance", "expected"), [(1, 0.0), (10, 1.0), (4, 1 / 3)])
def test_importance_normalised_from_one_to_ten(importance, expected):
    (s,) = rank([(mem(importance=importance), 0.5)], NOW, Weights(), k=1)
    assert s.importance == pytest.approx(expected)


def test_ties_are_stable_in_input_order():
    same = [mem(f"fact {n}") for n in range(5)]
    ranked = rank([(m, 0.5) for m in same], NOW, Weights(), k=5)
    assert [s.memory for s in ranked] == same
    ranked_rev = rank([(m, 0.5) for m in reversed(same)], NOW, Weights(), k=5)
    assert [s.memory for s in ranked_rev] == list(reversed(same))


def test_equal_score_breaks_tie_on_relevance():
    # a: fully relevant, least important; b: the reverse. Equal weights, equal totals.
    a = mem("a", importance=1)
    b = mem("b", importance=10)
    ranked = rank([(b, 0.0), (a, 1.0)], NOW, Weights(), k=2)
    assert ranked[0].score == ranked[1].score
    assert [s.memory for s in ranked] == [a, b]


def test_k_limits_and_nonpositive_k_is_empty():
    candidates = [(mem(), 0.1 * n) for n in range(6)]
    assert len(rank(candidates, NOW, Weights(), 3)) == 3
    assert rank(candidates, NOW, Weights(), 0) == []
    assert rank(candidates, NOW, Weights(), -1) == []
    assert rank([], NOW, Weights(), 5) == []


def test_duplicate_memory_id_keeps_best():
    weak = mem("v1", mid="same", version=1)
    strong = mem("v2", mid="same", version=2)
    other = mem("other")
    ranked = rank([(weak, 0.1), (other, 0.5), (strong, 0.9)], NOW, Weights(), k=5)
    assert [s.memory for s in ranked] == [strong, other]


# --- normalisation ------------------------------------------------------------------------


def test_absolute_clips_cosine():
    low, high = rank([(mem("neg"), -0.4), (mem("over"), 1.2)], NOW, Weights(), k=2)[::-1]
    assert (low.relevance, high.relevance) == (0.0, 1.0)


def test_absolute_keeps_weak_set_weak_minmax_stretches_it():
    weak = [(mem("a"), 0.10), (mem("b"), 0.15), (mem("c"), 0.20)]
    absolute = rank(weak, NOW, Weights(), k=3)
    minmax = rank(weak, NOW, Weights(normalise="minmax"), k=3)
    assert absolute[0].relevance == pytest.approx(0.20)
    assert minmax[0].relevance == 1.0 and minmax[-1].relevance == 0.0
    assert minmax[1].relevance == pytest.approx(0.5)


def test_minmax_constant_component_is_half():
    same_age = [(mem("a", importance=3), 0.3), (mem("b", importance=8), 0.7)]
    ranked = rank(same_age, NOW, Weights(normalise="minmax"), k=2)
    assert all(s.recency == 0.5 for s in ranked)
    (single,) = rank([(mem(importance=9), 0.8)], NOW, Weights(normalise="minmax"), k=1)
    assert (single.recency, single.importance, single.relevance) == (0.5, 0.5, 0.5)


def test_minmax_and_absolute_can_disagree_on_order():
    # Importance spans 5..6 (tiny absolute gap, full minmax gap); relevance 0.1..0.9.
    a = mem("a", importance=6)
    b = mem("b", importance=5)
    candidates = [(a, 0.1), (b, 0.9), (mem("c", importance=5), 0.1)]
    w_abs = Weights(importance=3.0, relevance=1.0)
    w_mm = Weights(importance=3.0, relevance=1.0, normalise="minmax")
    assert rank(candidates, NOW, w_abs, 1)[0].memory == b
    assert rank(candidates, NOW, w_mm, 1)[0].memory == a


# --- decay weight -------------------------------------------------------------------------


@pytest.mark.parametrize(("weight", "factor"), [
    (0.5, 0.5), (0, 0.0), (1, 1.0), (1.5, 1.0), (-0.1, 1.0), ("0.5", 1.0), (True, 1.0),
    (None, 1.0), (math.nan, 1.0)])
def test_decay_weight_factor(weight, factor):
    plain = mem("x")
    marked = mem("x", extra={} if weight is None else {"weight": weight})
    (base,) = rank([(plain, 0.7)], NOW, Weights(), 1)
    (down,) = rank([(marked, 0.7)], NOW, Weights(), 1)
    assert down.score == pytest.approx(base.score * factor)


def test_decay_weight_changes_order():
    faded = mem("faded", importance=9, extra={"weight": 0.1})
    fresh = mem("fresh", importance=5)
    ranked = rank([(faded, 0.8), (fresh, 0.5)], NOW, Weights(), 2)
    assert [s.memory for s in ranked] == [fresh, faded]


# --- visibility ---------------------------------------------------------------------------


@pytest.mark.parametrize(("status", "statuses", "shown"), [
    (Status.ACTIVE, ("active",), True),
    (Status.ARCHIVED, ("active",), False),
    (Status.DELETED, ("active",), False),
    (Status.SUPERSEDED, ("active",), False),
    (Status.ARCHIVED, ("active", "archived"), True),
    (Status.ACTIVE, ("archived",), False),
])
def test_visible_by_status(status, statuses, shown):
    assert visible(mem(status=status), NOW, statuses) is shown


def test_expired_hidden_unless_asked():
    expired = mem(expires_at=NOW - 1)
    at_the_second = mem(expires_at=NOW)
    later = mem(expires_at=NOW + 1)
    assert not visible(expired, NOW)
    assert not visible(at_the_second, NOW)
    assert visible(later, NOW)
    assert visible(expired, NOW, include_expired=True)
    assert not visible(mem(status=Status.ARCHIVED, expires_at=NOW + 1), NOW,
                       include_expired=True)


@pytest.mark.parametrize("bad", [
    {"decay": 0.0}, {"decay": 1.5}, {"recency": -1.0}, {"relevance": math.inf},
    {"normalise": "zscore"}])
def test_weights_reject_nonsense(bad):
    with pytest.raises(ConfigError):
        Weights(**bad)
