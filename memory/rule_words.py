"""The shared vocabulary of the offline rules model (:mod:`memory.rules`): numbers in
English and Chinese, weekday names, the endings of a value, the cleaning of a value, and the
:class:`Rule` record every phrase family is a table of. Pure data and pure functions."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from memstream.memory.decisions import Candidate

# --- numbers ---------------------------------------------------------------------------

_EN_NUM = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
           "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13,
           "fourteen": 14, "fifteen": 15, "sixteen": 16, "seventeen": 17, "eighteen": 18,
           "nineteen": 19, "twenty": 20, "thirty": 30, "forty": 40, "fifty": 50,
           "a dozen": 12, "a": 1, "an": 1, "a hundred": 100, "one hundred": 100}
_ORD = {"first": 1, "second": 2, "third": 3, "fourth": 4, "fifth": 5, "sixth": 6,
        "seventh": 7, "eighth": 8, "ninth": 9, "tenth": 10}
_ZH_DIGIT = {"零": 0, "〇": 0, "一": 1, "二": 2, "两": 2, "三": 3, "四": 4, "五": 5, "六": 6,
             "七": 7, "八": 8, "九": 9}
_ZH_UNIT = {"十": 10, "百": 100, "千": 1000, "万": 10000}

EN_N = (r"(?:\d{1,3}(?:,\d{3})+|\d+|a dozen|(?:a|one|two|three|four|five|six|seven|eight|nine)"
        r" hundred|eleven|twelve|thirteen|fourteen|fifteen|sixteen|seventeen|eighteen|"
        r"nineteen|twenty|thirty|forty|fifty|one|two|three|four|five|six|seven|eight|nine|ten)")
ORD = r"(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|\d+(?:st|nd|rd|th))"
ZH_N = r"(?:\d+|[一二两三四五六七八九十百千万]+)"


def number(word: str) -> int | None:
    """``word`` as an integer: digits, English words and ordinals, Chinese numerals."""
    w = word.strip().lower().replace(",", "")
    if w.isdigit():
        return int(w)
    if w in _EN_NUM:
        return _EN_NUM[w]
    if w in _ORD:
        return _ORD[w]
    if m := re.fullmatch(r"(\d+)(?:st|nd|rd|th)", w):
        return int(m.group(1))
    if m := re.fullmatch(r"(\w+) hundred", w):
        head = _EN_NUM.get(m.group(1))
        return None if head is None else head * 100
    return _zh_number(w)


def _zh_number(s: str) -> int | None:
    if not s or any(ch not in _ZH_DIGIT and ch not in _ZH_UNIT for ch in s):
        return None
    total = section = digit = 0
    for ch in s:
        if ch in _ZH_DIGIT:
            digit = _ZH_DIGIT[ch]
        elif _ZH_UNIT[ch] == 10000:
            total += (section + digit) * 10000
            section = digit = 0
        else:
            section += (digit or 1) * _ZH_UNIT[ch]
            digit = 0
    return total + section + digit


FULL_DAY_EN = r"(?:Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday)"
WEEKDAY_EN = rf"(?:{FULL_DAY_EN}|Mon|Tues?|Wed|Thu(?:rs?)?|Fri|Sat|Sun)"


# A rule's ``who``: ME, a verb phrase that counts only when the user is its subject (see
# memory.rule_speaker.speaker_is_user); OWN, the pattern names the user's own thing ("my team
# ...", "my favourite ..."); ANY, whoever's words (budgets, instructions, remembered text).
ME, OWN, ANY = "me", "own", "any"
CJK = re.compile(r"[\u4e00-\u9fff]")

Activity = tuple[str, str]  # a scheduled activity as said ("piano lessons") and its key


@dataclass(frozen=True)
class Rule:
    """One phrase family: ``build`` makes the candidate of a match (None: not a fact after
    all); ``activity`` (schedules) names the activity it mentions, for a later "now I go on
    Thursdays" that leaves it out; ``cue``, words the match needs before it, in its own
    clause or the one just before (which may end the previous sentence: "We moved again!
    This time it's Lyon."), said by ``cue_who`` (ME: the user is their subject)."""

    pattern: re.Pattern[str]
    build: Callable[[re.Match[str]], Candidate | None]
    who: str = ME
    activity: Callable[[re.Match[str]], Activity | None] | None = None
    cue: re.Pattern[str] | None = None
    cue_who: str = ANY


END = r"(?=[,.;!?，。；！？]|\band\b|$)"
ZEND = r"(?=了|啦|[，。！；,.!？?～~、]|$)"
_TRAIL = re.compile(
    r"(?:\s+(?:now|these days|nowadays|lately|anymore|any more|at the moment|right now|instead|"
    r"too|as well|again|already|full-time|permanently|for good|recently|at last|finally|"
    r"(?:last|this|next) (?:week|month|year|summer|spring|autumn|fall|winter)|"
    r"(?:a|one|two|three|a few|a couple of|few|several|\d+) (?:days?|weeks?|months?|years?) ago|"
    r"in \d{4}|since \w+|for (?:work|good|now|a while)|at (?:work|home)))+$", re.I)
PRONOUN = re.compile(r"(?:it|this|that|them|those|these|one|some|something|anything|him|her|"
                     r"you|me|us|what|which|who|there|here)\b", re.I)
CHANGE = re.compile(r"\b(?:now|these days|nowadays|lately|switched|moved|changed|instead|"
                    r"anymore|any more|no longer|started|from now on)\b|"
                    r"现在|如今|改|换|转|开始|最近",
                    re.I)


def clean(text: str) -> str:
    return text.strip(" ,.;!?，。；！？:：\"'").strip()


def trim(text: str) -> str:
    """``text`` without the time words a value trails ("Porto now" -> "Porto")."""
    return clean(_TRAIL.sub("", clean(text)))


def zh_value(text: str) -> str:
    return re.sub(r"(?:了|啦|呀|啊|吧|哦)+$", "", clean(text))


def n_of(m: re.Match[str], group: str = "n") -> int | None:
    word = m.groupdict().get(group)
    return None if word is None else number(word)

