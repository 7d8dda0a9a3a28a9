"""The knowledge-update benchmark's scoring (dev/updates_score.py) on hand-written
prompt blocks: no broker, no worker (the run itself: benchmarks/updates.py --smoke)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from memstream.dev.updates_score import parse_block, parse_line, score, summary, table
from memstream.dev.updates_stories import Session, Story

pytestmark = pytest.mark.unit
T0 = datetime(2026, 1, 3, 9, 0, tzinfo=UTC)


def story(current: list[str], stale: list[str], *, kind: str = "update", lang: str = "en",
          distractors: tuple[str, ...] = (), filler: tuple[str, ...] = (),
          said: tuple[str, ...] = ("I live in Lisbon.",), sid: str = "s") -> Story:
    sessions = [Session(T0, "state", tuple(("user", t) for t in said))]
    if filler:
        sessions.append(Session(T0 + timedelta(days=9), "filler",
                                tuple(("user", t) for t in filler), "pool"))
    if kind != "control":
        sessions.append(Session(T0 + timedelta(days=20), "change", (("user", "We moved."),)))
    return Story(sid, lang, "residence", kind, "Where does the user live?",
                 T0 + timedelta(days=40), tuple(current), tuple(stale), tuple(sessions),
                 tuple(distractors))


PORTO = story(["Porto"], ["Lisbon"])


def block(*lines: str) -> str:
    return "\n".join(["## What you remember about the user", *lines])


def test_a_stale_line_before_the_current_one_is_stale_first():
    v = score(PORTO, block("- (2026-01-03) Lives in Lisbon", "- (2026-02-19) Lives in Porto"))
    assert v.current_in_block and v.stale_first and not v.ok
    assert (v.first_stale, v.first_current, v.stale_unmarked, v.lines) == (1, 2, 1, 2)


def test_the_current_value_first_and_a_marked_stale_line_below_it_is_right():
    v = score(PORTO, block(
        "- (2026-02-19) Lives in Porto",
        "## From earlier conversations (newest first)",
        "- (2026-01-03, replaced 2026-02-19 by: Lives in Porto) [user] I live in Lisbon."))
    assert v.ok and v.first_current == 1 and v.first_stale is None
    assert (v.marked, v.stale_unmarked, v.current_marked, v.lines) == (1, 0, 0, 2)


def test_a_marked_line_states_the_current_value_in_its_by_part_only():
    marked = "- (2026-01-03, replaced 2026-02-19 by: Lives in Porto) [user] I live in Lisbon."
    v = score(PORTO, block(marked, "- (2026-01-01) Lives in Lisbon"))
    assert v.current_in_block and v.first_current == 1 and not v.stale_first
    assert v.stale_unmarked == 1  # the unmarked one, below
    # "; now: ..." when versions came between
    assert score(PORTO, block("- (2026-01-03, replaced 2026-02-19; now: Lives in Porto) "
                              "[user] I live in Lisbon.")).ok
    # no by: part: the stale value is marked, the current one absent
    v = score(PORTO, block("- (2026-01-03, no longer true since 2026-02-19) [user] Lisbon!"))
    assert not v.current_in_block and not v.stale_first and v.marked == 1


def test_a_control_value_shown_as_replaced_is_not_recalled():
    toronto = story(["Toronto"], [], kind="control", distractors=("Vancouver",),
                    said=("I live in Toronto.",))
    v = score(toronto, block(
        "- (2026-03-01) Lives in Vancouver",
        "- (2026-01-12, replaced 2026-03-01 by: Lives in Vancouver) [user] I live in Toronto."))
    assert not v.current_in_block and not v.ok and not v.stale_first
    assert v.current_marked == 1 and v.distractor_first
    v = score(toronto, block("- (2026-01-12) Lives in Toronto", "- (2026-03-01) [user] My "
                             "sister just moved to Vancouver"))
    assert v.ok and not v.distractor_first


def test_a_line_with_both_values_counts_as_the_current_one():
    v = score(PORTO, block("- (2026-02-19) [user] We moved from Lisbon to Porto last week.",
                           "- (2026-01-03) Lives in Lisbon"))
    assert v.ok and v.first_current == 1 and v.first_stale == 2 and v.stale_unmarked == 1


def test_no_current_value_but_a_stale_one_is_stale_first():
    v = score(PORTO, block("- (2026-01-03) Lives in Lisbon"))
    assert not v.current_in_block and v.stale_first
    v = score(PORTO, block("- (2026-01-03) Likes tea"))
    assert not v.current_in_block and not v.stale_first and not v.ok
    assert not score(PORTO, "").current_in_block


def test_date_digits_never_count_as_a_number():
    team = story(["10 engineers", "10", "ten"], ["6 engineers", "6"], said=("6 engineers",))
    v = score(team, block("- (2026-03-10) Manages 6 engineers",
                          "- (2026-06-10) [user] Met on 2026-03-10 at 10:30, 3.2 km away"))
    assert not v.current_in_block and v.stale_first and v.stale_unmarked == 1
    v = score(team, block("- (2026-06-06) Manages 10 engineers", "- (2026-03-06) Manages 6"))
    assert v.ok and v.first_current == 1 and v.first_stale == 2


def test_whole_words_for_latin_text():
    tom = story(["Tom"], ["Bob"], said=("My husband Bob.",))
    assert not score(tom, block("- (2026-01-01) Tomorrow we see Bobby")).current_in_block
    v = score(tom, block("- (2026-01-01) Married to TOM, not bob"))
    assert v.current_in_block and v.ok  # case-insensitive; both on one line


def test_cjk_values_match_as_substrings():
    hz = story(["杭州"], ["上海"], lang="zh", said=("我住在上海。",))
    v = score(hz, block("- (2026-01-03) [user] 带了。我住在上海浦东，每天上班要一个小时。",
                        "- (2026-02-22) 住在杭州"))
    assert v.stale_first and v.first_current == 2
    assert score(hz, block("- (2026-02-22) 住在杭州", "- (2026-01-03) 我住在上海浦东")).ok
    team = story(["15人"], ["8人"], lang="zh", said=("团队有8人",))
    v = score(team, block("- (2026-01-03) 部门有18人", "- (2026-02-01) 团队现在15人"))
    assert v.ok and v.first_stale is None  # 8人 is not in 18人
    vs = story(["VS Code"], ["Sublime"], lang="zh", said=("我用Sublime",))
    assert score(vs, block("- (2026-02-01) 现在用VS Code写代码")).ok


def test_repeated_lines_are_counted():
    line = "- (2026-02-19) Lives in Porto"
    v = score(PORTO, block(line, "- (2026-01-01) Likes tea", line, line))
    assert v.repeated == 2 and v.lines == 4


def test_a_turn_shown_alone_and_again_inside_its_pair_is_a_repeat():
    alone = "- (2026-02-19) [user] We moved to Porto."
    pair = "- (2026-02-19) [user] We moved to Porto. / [assistant] Congratulations!"
    assert score(PORTO, block(alone, pair)).repeated == 1
    assert score(PORTO, block(pair, "- (2026-02-20) [user] Porto is sunny.")).repeated == 0


def test_lines_from_a_filler_session_are_counted():
    s = story(["Porto"], ["Lisbon"],
              filler=("How long should I boil an egg if I want the yolk still runny?",
                      "About six and a half minutes once the water is boiling."))
    v = score(s, block(
        "- (2026-02-19) Lives in Porto",
        "- (2026-01-12) [user] How long should I boil an egg if I want the yolk still runny? "
        "/ [assistant] About six and a half minutes once the water is boiling.",
        "- (2026-01-12) Boils eggs about six and a half minutes",
        "- (2026-01-03) [user] I live in Lisbon."))
    assert v.filler_lines == 2 and v.lines == 4


def test_headers_are_not_lines_and_core_lines_are():
    lines = parse_block("## Core memory\n[profile] Lives in Porto\n\n## How to act\n- Be brief")
    assert [(x.body, x.marked) for x in lines] == [("[profile] Lives in Porto", False),
                                                   ("Be brief", False)]
    assert score(PORTO, "## Core memory\n[profile] Lives in Porto").ok
    line = parse_line("- (2026-01-03, replaced 2026-02-19 by: Lives in Porto (Portugal)) x")
    assert (line.body, line.by, line.marked) == ("x", "Lives in Porto (Portugal)", True)
    assert parse_line("- (2026-01-03, expired 2026-02-01) Budget 50").marked
    assert not parse_line("- (2026-01-03) (general knowledge) replaced by: x").marked


def test_the_summary_groups_by_category_language_and_kind():
    control = story(["Toronto"], [], kind="control", said=("I live in Toronto.",), sid="c")
    verdicts = [score(PORTO, block("- (2026-02-19) Lives in Porto")),
                score(PORTO, block("- (2026-01-03) Lives in Lisbon")),
                score(control, block("- (2026-01-03) Lives in Toronto"))]
    figures = summary(verdicts)
    o = figures["overall"]
    assert (o["stories"], o["updates"], o["stale_first"], o["controls"]) == (3, 2, 1, 1)
    assert o["current_in_block_pct"] == 66.7 and o["control_recall_pct"] == 100.0
    assert figures["by_kind"]["update"]["control_recall_pct"] is None
    assert set(figures["by_lang"]) == {"en"} and set(figures["by_category"]) == {"residence"}
    text = table(figures)
    assert "| kind: control | 1 | 100.0 |" in text and "| **overall** | 3 |" in text
    assert verdicts[0].to_dict()["ok"] is True


def test_a_control_with_someone_elses_value_first_is_recalled_but_not_first():
    nanjing = story(["南京"], [], kind="control", lang="zh", distractors=("广州",),
                    said=("我住在南京。",))
    v = score(nanjing, block("- (2026-03-01) 住在广州",
                             "- (2026-01-12) [assistant] 南京的冬天确实难熬 / [user] 没有暖气",
                             "- (2026-01-12, replaced 2026-03-01 by: 住在广州) "
                             "[user] 我住在南京。"))
    assert v.current_in_block and v.distractor_first and not v.ok
    assert (v.first_current, v.current_marked) == (2, 1)
    figures = summary([v])["overall"]
    assert figures["control_recall_pct"] == 100.0 and figures["ok_pct"] == 0.0
    assert figures["distractor_first"] == 1
