"""The partner, for the offline rules model (:mod:`memory.rules`): "my girlfriend Anna",
"I married Tom", "we broke up", 我的女朋友叫小雨, 我结婚了 -> ``partner``."""

from __future__ import annotations

import re

from memstream.memory.decisions import Candidate
from memstream.memory.rule_speaker import REL_ZH, clause
from memstream.memory.rule_words import OWN, Rule

_NAME = r"[A-Z][a-z]+(?:-[A-Z][a-z]+)?"
_NOT_A_NAME = re.compile(r"(?:I|The|And|But|So|Yesterday|Today|Last|This|Next|Dr|Mr|Mrs|Ms|"
                         r"When|If|Is|Was|Has|Had)$")


def _zname(*after: str) -> str:
    """A Chinese name (or an English one) followed by one of ``after`` or the end."""
    stops = "|".join((*after, r"[，。！；,.!？?～~、\s]", "$", "了", "啊", "呀", "是", "在", "和"))
    return rf"(?P<name>[\u4e00-\u9fff]{{1,3}}?|[A-Z][a-z]+)(?={stops})"


def _with(m: re.Match[str], named: str, unnamed: str) -> Candidate | None:
    """"I got married to Tom" / "Tom and I got married" / "we got married"."""
    name = m.groupdict().get("name") or m.groupdict().get("name2")
    if name is None and (said := re.search(rf"\b({_NAME}) and I\s+(?:\w+\s+)?$",
                                           m.string[: m.start()])):
        name = said.group(1)
    return _partner(f"{named} {name}", name) if name else _partner(unnamed)


def _partner(text: str, name: str | None = None) -> Candidate | None:
    if name is not None and (_NOT_A_NAME.match(name) or name in ("他", "她")):
        return None
    return Candidate(text, importance=7, slot="partner")


# a partner the clause says is gone ("I broke up with my boyfriend Marcus")
_ENDED = re.compile(r"\b(?:broke up|break up|breaking up|split|separated|separating|divorc\w*|"
                    r"left me|dumped|ex)\b", re.I)


def _named_partner(m: re.Match[str]) -> Candidate | None:
    start, end = clause(m.string, m.start(), m.end())
    if _ENDED.search(m.string, start, end):
        return None
    rel = m.group("rel").lower().replace("é", "e")
    rel = {"fiance": "Fiancé", "fiancee": "Fiancée"}.get(rel, rel.capitalize())
    return _partner(f"{rel}: {m.group('name')}", m.group("name"))


def _single(m: re.Match[str]) -> Candidate | None:
    return _partner("Divorced" if "divorc" in m.group(0).lower() else "Is single")


# "I'm seeing Anna for lunch", "seeing someone about the roof": an appointment, not a partner
_APPOINTMENT = re.compile(r" (?:about|for|at|on|tomorrow|today|tonight|later|this|next|in|from|"
                          r"to|after|before|soon|again|every|once|twice)\b", re.I)
_ROMANCE = re.compile(r"\b(?:boyfriend|girlfriend|partner|dating|date|relationship|together|"
                      r"split|broke up|single|in love|romantic|someone new|crush|divorced?)\b",
                      re.I)


def _seeing_someone(m: re.Match[str]) -> Candidate | None:
    """"I'm seeing someone new now, Daniel": a new partner, named or not."""
    name = m.group("name")
    if name and not _NOT_A_NAME.match(name):
        return _partner(f"Dating {name}", name)
    if not name and _APPOINTMENT.match(m.string, m.end()):
        return None
    return _partner("Is seeing someone")


def _seeing(m: re.Match[str]) -> Candidate | None:
    """"I'm seeing Daniel now.", "I've been seeing Daniel for a few months", "I'm seeing
    Daniel since Marcus and I split up": a partner only said as one, never an appointment or
    a show ("I'm seeing Anna tonight", "I'm seeing Hamilton!")."""
    after = m.string[m.end():]
    span = re.match(r" (?:for (?:a|some|a few|a couple of|several|\d+|two|three|four|five|six)"
                    r"(?: \w+)? (?:weeks|months|years|while)|since)\b", after)
    now = re.fullmatch(r" (?:now|these days)\s*[.!]*\s*", after)  # "I'm seeing Daniel now."
    near = m.string[max(0, m.start() - 160): m.end() + 160]
    if not span and not now and (_APPOINTMENT.match(after) or not _ROMANCE.search(near)):
        return None
    return _partner(f"Dating {m.group('name')}", m.group("name"))


def _together(m: re.Match[str]) -> Candidate | None:
    """"Daniel and I are together now": the partner is named before "and I" (a "we" alone
    says nothing a stored partner does not say better)."""
    said = re.search(rf"\b({_NAME}) and I\s+$", m.string[: m.start()])
    return _partner(f"Dating {said.group(1)}", said.group(1)) if said else None


RELATIONSHIPS = [
    Rule(re.compile(r"\b(?i:my) (?:(?i:new|current|lovely|wonderful|beautiful|amazing) )?"
                    r"(?P<rel>(?i:girlfriend|boyfriend|wife|husband|partner|fianc[ée]e?|spouse))"
                    r"(?:'s name is|,)? (?:(?i:is) (?:(?i:called|named) )?|(?i:called|named) )?"
                    rf"(?P<name>{_NAME})\b"), _named_partner, OWN),
    Rule(re.compile(rf"\b(?:(?i:married) (?P<name>{_NAME})\b|(?i:got|'m|am|'re|are|'ve been|have "
                    r"been|just got|recently got|finally got) (?i:married)(?: (?i:to) "
                    rf"(?P<name2>{_NAME}))?)"),
         lambda m: _with(m, "Married to", "Is married")),
    Rule(re.compile(r"\b(?i:got|'m|am|'re|are|just got|recently got) (?i:engaged)(?: (?i:to) "
                    rf"(?P<name>{_NAME}))?"),
         lambda m: _with(m, "Engaged to", "Is engaged")),
    Rule(re.compile(r"\b(?i:'m|am|'ve been|have been|started|just started|began) (?:(?i:now) )?"
                    rf"(?i:dating|going out with|in a relationship with) (?P<name>{_NAME})\b"),
         lambda m: _partner(f"Dating {m.group('name')}", m.group("name"))),
    # a new partner, before a break-up the same sentence tells ("we split up, I'm seeing ...")
    Rule(re.compile(r"(?:'m|\b(?i:am|started|just started|began)|'ve been|\b(?i:have been)) "
                    r"(?:(?i:now|also) )?(?i:seeing|dating) (?i:someone|somebody)(?: (?i:new|else|"
                    r"special|nice|lovely|great|wonderful|amazing))?(?: (?i:now|again))?"
                    r"(?:(?:,| -| –| —|:) (?:(?i:called|named) )?|,? (?i:called|named) |,? "
                    rf"(?i:his|her|their) (?i:name is) )?(?P<name>{_NAME})?"), _seeing_someone),
    Rule(re.compile(r"(?:'m|\b(?i:am)|'ve been|\b(?i:have been)) (?:(?i:now|also) )?(?i:seeing) "
                    rf"(?P<name>{_NAME})\b(?!'s| [A-Z])"), _seeing),
    Rule(re.compile(r"\b(?:(?i:are|'ve been|have been)) (?:(?i:now|officially|finally|back|"
                    r"still) )*(?:(?i:dating|a couple|an item|seeing each other|in a relationship|"
                    r"going out)(?= *(?:(?i:now|again|officially)\b|(?i:for|since)\b|[,.;!?]|$))"
                    r"|(?i:together|back together)(?= (?i:now|again|officially)\b))"), _together),
    Rule(re.compile(r"\b(?:(?i:broke up|split up|separated|got divorced|'m divorced|am divorced|"
                    r"'re divorced|are divorced|divorced)\b|(?:'m|\b(?i:am)) (?:(?i:now|single "
                    r"again|officially) )*(?i:single)\b)"), _single),
    Rule(re.compile(r"(?P<rel>女朋友|男朋友|女友|男友|老婆|老公|妻子|丈夫|太太|未婚妻|未婚夫|对象|爱人|"
                    r"媳妇)(?:的名字)?(?:叫|名叫|叫做)" + _zname()),
         lambda m: _partner(f"{m.group('rel')}是{m.group('name')}", m.group("name"))),
    Rule(re.compile(r"(?:和|跟)" + _zname("结婚", "成婚", "领证") + r"(?:结婚|成婚|领证)了"),
         lambda m: _partner(f"已婚，配偶是{m.group('name')}", m.group("name"))
         or _partner("已婚")),
    Rule(re.compile(r"(?:结婚了|结婚啦|已婚|成家了|领证了)"), lambda m: _partner("已婚")),
    Rule(re.compile(r"(?:和|跟)" + _zname("订婚") + r"订婚了"),
         lambda m: _partner(f"已订婚，伴侣是{m.group('name')}", m.group("name"))
         or _partner("已订婚")),
    Rule(re.compile(r"订婚了|订婚啦"), lambda m: _partner("已订婚")),
    # a new partner, before a break-up the same sentence tells: 我们分手了，现在的男朋友叫王浩
    Rule(re.compile(r"(?:现在|目前|如今|新)的?(?P<rel>女朋友|男朋友|女友|男友|老婆|老公|对象|爱人|"
                    r"未婚妻|未婚夫)(?:的名字)?(?:叫|名叫|叫做)" + _zname()),
         lambda m: _partner(f"{m.group('rel')}是{m.group('name')}", m.group("name"))),
    Rule(re.compile(r"(?:正在|在)?(?:和|跟|与)" + _zname("交往", "谈恋爱", "恋爱", "在一起", "确定")
                    + r"(?:正在|在)?(?:交往|谈恋爱|恋爱了|在一起了|确定了?(?:恋爱)?关系)"),
         lambda m: None if re.fullmatch(REL_ZH, m.group("name")) else
         _partner(f"在和{m.group('name')}交往", m.group("name"))),
    Rule(re.compile(r"(?:分手了|分手啦|离婚了|离婚啦|(?:是)?(?:恢复)?单身(?:了|啦)?(?=[，。！；,.!？?]|$))"),
         lambda m: _partner("离婚" if "离婚" in m.group(0) else "单身")),
    Rule(re.compile(r"\b(?i:have|'ve got|got) (?i:a) (?:(?i:new) )?"
                    r"(?P<rel>(?i:girlfriend|boyfriend|partner|fianc[ée]e?))(?: (?i:now))?"
                    r"(?:,? (?:(?i:her|his|their) name is|"
                    rf"(?i:called|named)) (?P<name>{_NAME}))?"),
         lambda m: _named_partner(m) if m.group("name") else _partner(
             f"Has a {m.group('rel').lower()}")),
    Rule(re.compile(r"(?:交了|有了)(?:一个)?(?:新)?(?P<rel>女朋友|男朋友|对象)|有(?P<rel2>女朋友|男朋友|对象)了"),
         lambda m: _partner(f"有{m.group('rel') or m.group('rel2')}")),
]
