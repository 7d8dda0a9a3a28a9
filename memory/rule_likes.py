"""Preferences, favourites and dislikes, for the offline rules model (:mod:`memory.rules`):
"I used to like jazz but now I prefer techno", "my favourite band is Radiohead"
(``favourite:<x>``), 以前喜欢A现在喜欢B, 我最喜欢的电影是X."""

from __future__ import annotations

import re

from memstream.memory.decisions import Candidate
from memstream.memory.model import MemoryType
from memstream.memory.rule_words import CJK, END, OWN, PRONOUN, ZEND, Rule, clean, trim, zh_value


# preferences and favourites
def _favourite(m: re.Match[str]) -> Candidate | None:
    zh = CJK.search(m.group(0)) is not None
    what, value = trim(m.group("x")).lower(), (zh_value if zh else trim)(m.group("y"))
    if not what or not value or re.match(r"(?:not|no|n't|不|没)", value) or \
            PRONOUN.fullmatch(value) or what in ("part", "bit", "moment", "one", "scene"):
        return None
    text = f"最喜欢的{what}是{value}" if zh else f"Favourite {what}: {value}"
    return Candidate(text, importance=5, slot=f"favourite:{what.removesuffix('s')}")


def _prefers(m: re.Match[str]) -> Candidate | None:
    """"I prefer tea (over coffee)": a preference; what it is preferred over, it replaces."""
    what = trim(m.group("what"))
    if not what or PRONOUN.match(what) or re.match(r"(?i:not|to say)\b", what):
        return None
    over = re.search(r"\s(?:over|rather than|more than|instead of)\s(?P<old>.+)$", what)
    replaces = clean(m.groupdict().get("old") or (over.group("old") if over else "")) or None
    return preference(f"Prefers {what}", replaces)


def _prefers_zh(m: re.Match[str]) -> Candidate | None:
    what = zh_value(m.group("what"))
    if not what or what.startswith(("的", "上", "过")):
        return None
    return preference(f"喜欢{what}", m.groupdict().get("old"))


def _gone_off(m: re.Match[str]) -> Candidate | None:
    if m.group("what"):
        return preference(f"Prefers {trim(m.group('what'))}", clean(m.group("old")))
    return Candidate(trim(m.group("old")), importance=5, new_fact=False)


_ANSWERS = re.compile(r"answer|repl|respon|explain|回答|回复", re.I)


def preference(text: str, replaces: str | None = None) -> Candidate:
    """A preference about how the agent should answer is a rule of behaviour."""
    kind = MemoryType.PROCEDURAL if _ANSWERS.search(text) else MemoryType.EPISODIC
    return Candidate(text, kind, 6 if kind == MemoryType.PROCEDURAL else 5, replaces=replaces)


_FAV = r"(?:(?i:new|current|absolute|all-time|all time|top|personal|very) )*(?i:favou?rite)"
_LIKE_AFTER = (r"(?:(?i:but|and) )?(?:(?i:now|these days|nowadays|lately),? )?(?:(?i:i|we) )?"
               r"(?:(?i:really|much|actually|now) )?(?i:prefer|like|love|enjoy|'m more into|"
               r"'m into|am into)")
PREFERENCES = [
    Rule(re.compile(r"\b(?i:my|our) " + _FAV + r" (?P<x>[a-zA-Z][\w -]{0,30}?) (?i:is|are|'s|"
                    r"has become|became)(?: (?i:now|currently|still|definitely|easily))? "
                    r"(?P<y>[^,;.!?]{1,60})"), _favourite, OWN),
    Rule(re.compile(r"(?:^|[,;:]\s*)(?!(?i:it|this|that|these|those|he|she|they|which|what|who|"
                    r"there|here)\b)(?P<y>[A-Z][\w'&-]*(?: [\w'&-]+){0,3}?) (?i:is|are) "
                    r"(?:(?i:now|currently|still|definitely) )?(?i:my|our) " + _FAV
                    + r" (?P<x>[a-z][\w -]{0,30}?)" + END), _favourite, OWN),
    Rule(re.compile(r"最喜欢的(?P<x>[\u4e00-\u9fffA-Za-z]{1,8}?)(?:现在|已经|如今|一直|还是|目前)?"
                    r"(?:是|变成了?|换成了?|成了)(?P<y>[^，,；;。！!？?]{1,60})"), _favourite),
    Rule(re.compile(r"\b(?i:used to) (?i:like|love|prefer|enjoy|be into) (?P<old>[^,;]{1,60}?),? "
                    + _LIKE_AFTER + r" (?P<what>[\w -]{1,60}?)" + END), _prefers),
    Rule(re.compile(r"\b(?i:gone|went|gone right) (?i:off) (?P<old>[\w -]{1,60}?)"
                    r"(?:,? (?i:and|but) "
                    r"(?:(?i:now) )?(?:(?i:i|we) )?(?i:prefer|like|love|enjoy|'m into) "
                    r"(?P<what>[\w -]{1,60}?))?" + END), _gone_off),
    Rule(re.compile(r"\b(?:(?i:come|grown|started|begun|learned|learnt) (?i:to) )?"
                    r"(?i:prefer|like|love|enjoy) (?P<what>[\w -]{1,60}?)" + END), _prefers),
    Rule(re.compile(r"以前(?:很|最|比较|特别|挺)?(?:喜欢|爱|偏好)(?P<old>[^，,；;。]{1,12}?)[，,]?\s*"
                    r"(?:但是?|不过|可是|而)?(?:我)?(?:现在|如今|最近|这些年|这几年|后来)(?:我)?"
                    r"(?:更|比较|则|却|倒是|反而)?(?:喜欢|爱|偏好)"
                    r"(?P<what>[\u4e00-\u9fffA-Za-z0-9 ]{1,12}?)" + ZEND), _prefers_zh),
    Rule(re.compile(r"比起(?P<old>[^，,；;。]{1,12}?)[，,]?\s*(?:我)?(?:现在|如今)?(?:还是)?更"
                    r"(?:喜欢|爱|偏好)(?P<what>[\u4e00-\u9fffA-Za-z0-9 ]{1,12}?)" + ZEND),
         _prefers_zh),
    Rule(re.compile(r"(?:很|比较|挺|特别|非常|真的|还是更|更|最)?(?:喜欢|偏好)"
                    r"(?P<what>[\u4e00-\u9fffA-Za-z]{1,12}?)" + ZEND), _prefers_zh),
    Rule(re.compile(r"\b(?i:don't|do not|really don't|never) (?i:like|enjoy) "
                    r"(?P<what>[\w -]{1,60}?)"
                    + END), lambda m: Candidate(f"Dislikes {trim(m.group('what'))}")),
    Rule(re.compile(r"不(?:喜欢|爱)(?P<what>[\u4e00-\u9fffA-Za-z]{1,12}?)(?:[，。！；,.!]|$)"),
         lambda m: Candidate(f"不喜欢{m.group('what')}", importance=5)),
]
