"""What a statement is about (memory.subjects): cue words in English and Chinese, slots,
the words' search's cues, someone else's news."""

from __future__ import annotations

import pytest

from memstream.memory import lexical
from memstream.memory.subjects import about_someone_else, cue_terms, of_slot, of_text

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("text", "subject"), [
    ("Where does the user live?", "residence"),
    ("We finally got the keys to a flat in Porto", "residence"),
    ("用户住在哪里？", "residence"),
    ("上个月我们终于搬到杭州了", "residence"),
    ("Which company does the user work for?", "employer"),
    ("我跳槽到字节了", "employer"),
    ("How many kids does the user have?", "children"),
    ("我们家老二出生了，现在两个孩子", "children"),
    ("I switched to VS Code for everything", "tool"),
    ("手机换成了华为", "tool"),
    ("How big is the user's team?", "team_size"),
    ("组里现在十五个人了", "team_size"),
    ("My girlfriend Anna and I got engaged", "partner"),
    ("我和女朋友订婚了", "partner"),
    ("Gym is on Thursdays now", "schedule"),
    ("最近迷上了攀岩", "hobby"),
])
def test_a_subject_is_named_by_its_cue_words(text, subject):
    assert subject in of_text(text)


@pytest.mark.parametrize("text", ["How long should I boil an egg?", "用户喜欢什么颜色",
                                  "今天天气不错", "Thanks, that helps a lot!"])
def test_small_talk_names_no_profile_subject(text):
    assert not of_text(text) - {"preference", "diet"}


def test_a_chinese_cue_is_found_as_written():
    assert "tool" not in of_text("用户在哪里上班？")  # 用 of 用户 ("the user") is no cue
    assert "partner" not in of_text("我和朋友去爬山")  # 朋友 alone is a friend
    assert "partner" in of_text("我的男朋友叫王浩")


def test_slots_name_subjects_and_the_search_gets_their_cues():
    assert of_slot("tool:editor") == {"tool"} and of_slot("residence") == {"residence"}
    assert of_slot("favourite:film") == {"preference"} and of_slot(None) == frozenset()
    assert of_slot("unknown") == frozenset()
    cues = cue_terms(frozenset({"residence"}))
    assert {"move", "flat", "住", "搬"} <= cues
    assert set(lexical.terms("we relocated")) <= cues  # stemmed as the index stems


@pytest.mark.parametrize(("text", "subject", "theirs"), [
    ("My sister just moved to Vancouver, so I'll be flying west a lot.", "residence", True),
    ("My sister just moved to Vancouver.", None, True),
    ("We moved to Porto, and my sister loves it.", "residence", False),
    ("My manager left for a competitor. I'm staying though.", None, False),
    ("He got a job at Google.", "employer", True),
    ("我妹妹搬到北京了。", "residence", True),
    ("我妹妹搬到北京了，所以我也搬过去了。", "residence", False),
    ("我搬到杭州了。", "residence", False),
    ("Guess who just got the keys to a flat in Edinburgh!", "residence", False),
])
def test_someone_elses_news_is_told_from_the_speakers_own(text, subject, theirs):
    assert about_someone_else(text, subject) is theirs
