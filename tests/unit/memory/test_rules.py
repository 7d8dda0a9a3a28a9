"""The offline rules extractor and decider, English and Chinese."""

from __future__ import annotations

import pytest

from memstream.memory.decisions import Candidate
from memstream.memory.model import Memory, MemoryType, OpKind, Source
from memstream.memory.rules import decide, extract_text

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("text", "expected"), [
    ("I moved from Berlin to Munich last week.", [("Lives in Munich", "residence")]),
    ("I moved to New York City in May", [("Lives in New York City", "residence")]),
    ("我以前住在上海，上个月搬到深圳了。", [("住在深圳", "residence")]),
    ("我住在杭州", [("住在杭州", "residence")]),
    ("we have 2 kids", [("Has 2 children", "children")]),
    ("We have three children.", [("Has 3 children", "children")]),
    ("我有两个孩子", [("有2个孩子", "children")]),
    ("I work at Siemens as a backend engineer.",
     [("Works at Siemens as backend engineer", "employer")]),
    ("我在阿里巴巴工作", [("在阿里巴巴工作", "employer")]),
    ("Our company has 200 employees", [("Company has 200 employees", "company_size")]),
    ("我们公司有200名员工，在杭州。", [("公司有200名员工", "company_size")]),
    ("We don't accept equity products.", [("Does not accept equity products", None)]),
    ("我们不接受股票类产品，只要低风险的。", [("不接受股票类产品", None)]),
    ("I'm allergic to penicillin", [("Allergic to penicillin", None)]),
    ("记住：我对花生过敏。", [("对花生过敏", None)]),
    ("I don't like spicy food", [("Dislikes spicy food", None)]),
    ("我喜欢爵士乐", [("喜欢爵士乐", None)]),
    ("Remember this: my son is called Leo", [("my son is called Leo", None)]),
    ("ok thanks", []), ("I don't have a car", []), ("What is the weather today?", []),
])
def test_extracts(text, expected):
    assert [(c.text, c.slot) for c in extract_text(text)] == expected


def test_budget_with_time_limit_expires():
    [c] = extract_text("My budget for furniture this month is 3000 euros.")
    assert (c.text, c.expires_in_days, c.slot) == (
        "Budget for furniture this month: 3000 euros", 30, "budget:furniture")
    [z] = extract_text("这个月的预算是5000元。")
    assert z.expires_in_days == 30 and z.text == "这个月预算5000元"


def test_instructions_and_answer_preferences_are_procedural():
    [a] = extract_text("From now on always answer with Python examples.")
    [b] = extract_text("Remember this: I prefer short answers.")
    [c] = extract_text("以后都用中文回答我。")
    assert {a.type, b.type, c.type} == {MemoryType.PROCEDURAL}


def test_retractions_keep_the_new_fact():
    cands = extract_text("I no longer use mocks in my tests, I use real services.")
    assert [(c.text, c.new_fact) for c in cands] == [
        ("use mocks in my tests", False), ("Uses real services", True)]
    [z] = extract_text("我不再吃辣了。")
    assert (z.text, z.new_fact) == ("吃辣", False)


def _m(content, slot=None, i="m"):
    return Memory(i, "t", "u", "episodic", content, 5, 0, 0, 0, Source("s", 0, 1, "j", "o"),
                  slot=slot)


@pytest.mark.parametrize(("text", "shown", "op", "target"), [
    ("Lives in Munich", [(1, _m("Lives in Berlin", "residence"), 0.8)], OpKind.UPDATE, 1),
    ("Lives in Munich", [(1, _m("Lives in Munich", "residence"), 1.0)], OpKind.NOOP, 1),
    ("Has 3 children", [(1, _m("Works at X"), 0.3), (2, _m("Has 2 children", "children"), 0.9)],
     OpKind.UPDATE, 2),
    ("Allergic to penicillin", [(1, _m("Allergic to peanuts"), 0.76)], OpKind.ADD, None),
    ("Allergic to peanuts", [(1, _m("Allergic to peanuts"), 1.0)], OpKind.NOOP, 1),
    ("Prefers tea", [], OpKind.ADD, None),
])
def test_decide(text, shown, op, target):
    slot = "residence" if "Lives" in text else ("children" if "children" in text else None)
    d = decide(Candidate(text, slot=slot), shown, threshold=0.57)
    assert (d.op, d.target) == (op, target)


def test_retraction_deletes_only_what_matches():
    stored = [(1, _m("Lives in Rome"), 0.2), (2, _m("Uses mocks in my tests"), 0.7)]
    d = decide(Candidate("use mocks in my tests", new_fact=False), stored, 0.57)
    assert (d.op, d.target) == (OpKind.DELETE, 2)
    none = decide(Candidate("eat meat", new_fact=False), [(1, _m("Lives in Rome"), 0.1)], 0.57)
    assert none.op == OpKind.NOOP
