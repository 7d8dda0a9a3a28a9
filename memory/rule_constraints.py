"""Constraints, allergies, budgets, standing instructions, retractions and "remember ...",
for the offline rules model (:mod:`memory.rules`)."""

from __future__ import annotations

import re

from memstream.memory.decisions import Candidate
from memstream.memory.model import MemoryType
from memstream.memory.rule_words import ANY, END, OWN, Rule, clean

# constraints, allergies, budgets, standing instructions
_PERIOD_DAYS = {"week": 7, "month": 30, "year": 365}
_ADVERB = {"weekly": "week", "monthly": "month", "yearly": "year"}


def _budget(period: str, what: str | None, amount: str) -> Candidate:
    """``period`` is "week", "month" or "year"; the memory expires with it."""
    what = clean(what or "")
    label = f"Budget for {what}" if what else "Budget"
    return Candidate(f"{label} this {period}: {clean(amount)}", importance=6,
                     expires_in_days=_PERIOD_DAYS[period],
                     slot=f"budget:{what.lower() or 'general'}")


OTHERS = [
    Rule(re.compile(r"\b(?:we|I) (?:don't|do not|won't|will not) accept "
                    r"(?P<what>[\w -]{1,60}?)" + END,
                    re.I),
         lambda m: Candidate(f"Does not accept {clean(m.group('what'))}", importance=8), OWN),
    Rule(re.compile(r"不接受(?P<what>[\u4e00-\u9fffA-Za-z]{1,12}?)(?:[，。！；,.!]|$)"),
         lambda m: Candidate(f"不接受{m.group('what')}", importance=8)),
    Rule(re.compile(r"\b(?:(?i:severely|very|quite|mildly|deathly|slightly|highly|extremely|"
                    r"really|also) )?(?i:allergic to) (?P<what>[\w -]{1,60}?)" + END),
         lambda m: Candidate(f"Allergic to {clean(m.group('what'))}", importance=9)),
    Rule(re.compile(r"对(?P<what>[\u4e00-\u9fff]{1,8})过敏"),
         lambda m: Candidate(f"对{m.group('what')}过敏", importance=9)),
    Rule(re.compile(r"\bbudget (?:for (?P<what>[\w ]{1,60}?) )?"
                    r"(?P<period>this (?:week|month|year)) is "
                    r"(?P<amount>[\w€$£¥.,]+(?: (?:euros?|dollars?|k|yuan))?)", re.I),
         lambda m: _budget(m.group("period").split()[-1].lower(), m.group("what"),
                           m.group("amount")), OWN),
    Rule(re.compile(r"\b(?:my|our) (?P<period>(?:weekly|monthly|yearly)) budget (?:for "
                    r"(?P<what>[\w ]{1,60}?) )?is (?P<amount>[\w€$£¥.,]+)", re.I),
         lambda m: _budget(_ADVERB[m.group("period").lower()], m.group("what"),
                           m.group("amount")), OWN),
    Rule(re.compile(r"(?P<period>这个月|本月|这周|本周|今年)的?(?P<what>[\u4e00-\u9fff]{0,6}?)预算是?"
                    r"(?P<amount>[\d.,万千]+[元块]?)"),
         lambda m: Candidate(f"{m.group('period')}{m.group('what')}预算{m.group('amount')}",
                             importance=6, slot=f"budget:{m.group('what') or 'general'}",
                             expires_in_days=7 if "周" in m.group("period") else
                             (365 if "年" in m.group("period") else 30)), OWN),
    Rule(re.compile(r"\bfrom now on,? (?P<what>[\w ,'-]{1,60}?)" + r"(?=[.;!?。]|$)", re.I),
         lambda m: Candidate(clean(m.group("what"))[:1].upper() + clean(m.group("what"))[1:],
                             MemoryType.PROCEDURAL, 7), ANY),
    Rule(re.compile(r"以后都(?P<what>[\u4e00-\u9fffA-Za-z]{2,20})"),
         lambda m: Candidate(f"以后都{clean(m.group('what'))}", MemoryType.PROCEDURAL, 7), ANY),
]

RETRACT = [
    re.compile(r"\bI (?:no longer|don't|do not) (?P<what>[\w -]{1,60}?)(?: any ?more)?" + END,
               re.I),
    re.compile(r"我不再(?P<what>[\u4e00-\u9fffA-Za-z]{1,12}?)了?(?:[，。！；,.!]|$)"),
]
RETRACT_GUARD = re.compile(r"\bno longer\b|\bany ?more\b|不再")
REMEMBER = [
    # an instruction, not a memory of the user's ("I remember my first day at IBM")
    re.compile(r"(?<!\bi )(?<!\bwe )(?<!\bthey )(?<!\bhe )(?<!\bshe )(?<!\bstill )"
               r"(?<!\bcan't )(?<!\bdon't )(?<!\bdo )(?<!\bdid )(?<!\bcould )(?<!\bto )"
               r"\b(?:please )?remember(?: this| that)?\s*[:,-]?\s*(?P<what>.+)", re.I),
    re.compile(r"记住[：:，,]?(?P<what>.+)"),
]
