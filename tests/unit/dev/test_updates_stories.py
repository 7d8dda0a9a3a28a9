"""The knowledge-update stories (benchmarks/data/updates_stories.json) and their loader
(dev/updates_stories.py): the shipped set is valid, a broken one is refused,
and a story becomes the events a chat service would produce."""

from __future__ import annotations

import copy
import json
from collections import Counter
from pathlib import Path

import pytest

from memstream.dev.updates_stories import (
    CATEGORIES,
    StoryError,
    events,
    load,
    mentions,
    parse,
    problems,
    shorten,
)
from memstream.topics.schemas import ChatMessage, SessionEvent

pytestmark = pytest.mark.unit
SHIPPED = Path(__file__).resolve().parents[3] / "benchmarks" / "data" / "updates_stories.json"


@pytest.fixture(scope="module")
def raw() -> dict:
    return json.loads(SHIPPED.read_text("utf-8"))


def test_the_shipped_set_loads_and_is_valid(raw):
    stories = load(SHIPPED)
    assert problems(stories) == [] and len(stories) >= 44
    kinds = Counter(s.kind for s in stories)
    assert kinds["update"] >= 10 and kinds["chain"] >= 6 and kinds["control"] >= 10
    langs = Counter(s.lang for s in stories)
    assert langs["zh"] >= 14 and langs["en"] >= 14
    assert {s.category for s in stories} == set(CATEGORIES)
    assert len({s.id for s in stories}) == len(stories)
    # filler is shared by name: the file stays small
    assert all("turns" not in s for st in raw["stories"] for s in st["sessions"]
               if "filler" in s)


def test_every_story_is_in_time_order_and_asked_after_its_change():
    for s in load(SHIPPED):
        times = [x.at for x in s.sessions]
        assert times == sorted(times) and len(set(times)) == len(times), s.id
        assert s.asked > times[-1], s.id
        if s.kind != "control":
            assert s.changes and s.asked > s.changes[-1].at, s.id
            assert s.stale and mentions(" ".join(t for _, t in s.changes[-1].turns),
                                        s.current), s.id
            # one more filler session after the (last) change, before the question
            assert s.sessions[-1].part == "filler", s.id
        else:
            assert not s.stale and not s.changes, s.id


def test_a_broken_story_is_refused(raw):
    def broken(edit) -> list[str]:
        data = copy.deepcopy(raw)
        edit(data["stories"][0])
        return problems(parse(data))

    assert any("time order" in p for p in broken(
        lambda s: s["sessions"].__setitem__(1, {**s["sessions"][1],
                                                "at": "2025-12-01T00:00:00Z"})))
    assert any("not asked after" in p for p in broken(
        lambda s: s.__setitem__("asked", "2026-01-01T00:00:00Z")))
    assert any("change sessions" in p for p in broken(
        lambda s: s.__setitem__("kind", "control")))
    assert any("names a value" in p for p in broken(
        lambda s: s.__setitem__("stale", ["Lisbon", "egg"])))
    assert any("current value" in p for p in broken(
        lambda s: s.__setitem__("current", ["Madrid"])))
    data = copy.deepcopy(raw)
    data["stories"][0]["sessions"][1]["filler"] = "nope"
    with pytest.raises(StoryError, match="no filler 'nope'"):
        parse(data)
    with pytest.raises(StoryError, match="schema"):
        parse({"stories": []})


def test_load_picks_stories_by_id():
    picked = load(SHIPPED, ["zh-res-hangzhou", "en-res-porto"])
    assert [s.id for s in picked] == ["en-res-porto", "zh-res-hangzhou"]  # file order
    with pytest.raises(StoryError, match="no stories"):
        load(SHIPPED, ["en-res-porto", "nobody"])


def test_a_story_becomes_its_messages_and_session_ends():
    (s,) = load(SHIPPED, ["en-res-porto"])
    evs = events(s, "t")
    msgs = [e for e in evs if isinstance(e, ChatMessage)]
    ends = [e for e in evs if isinstance(e, SessionEvent)]
    assert len(ends) == len(s.sessions) and len(msgs) == sum(len(x.turns) for x in s.sessions)
    assert {e.user_id for e in evs} == {"en-res-porto"} and {e.tenant_id for e in evs} == {"t"}
    assert [e.ts for e in evs] == sorted(e.ts for e in evs)
    assert msgs[0].session_id == "s0-state" and msgs[0].message_id == "s0-state-m0"
    assert ends[1].session_id == "s1-filler-eggs" and msgs[0].role == "user"
    assert len({(m.session_id, m.message_id) for m in msgs}) == len(msgs)


def test_the_smoke_cuts_filler_only():
    (s,) = load(SHIPPED, ["en-res-porto"])
    short = shorten(s, 2)
    assert [len(x.turns) for x in short.sessions] == [
        len(x.turns) if x.part != "filler" else 2 for x in s.sessions]


def test_surface_forms_match_whole_words_or_cjk_substrings():
    assert mentions("We moved to PORTO.", ["Porto"])
    assert not mentions("Portobello Road", ["Porto"])
    assert mentions("我用VS Code写代码", ["VS Code"]) and mentions("住在杭州了", ["杭州"])
    assert not mentions("有13 kids", ["3 kids"]) and not mentions("2026-03-01", ["3", "1"])
    assert not mentions("部门18人", ["8人"]) and mentions("团队8人", ["8人"])
    assert not mentions("anything", []) and mentions("a 4-day week", ["4-day week"])
