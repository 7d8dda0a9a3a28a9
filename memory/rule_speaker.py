"""Who is speaking, for the offline rules model (:mod:`memory.rules`): whether a phrase is a
fact the user states about themselves, not someone else's ("my sister moved"), a question, a
hypothetical or a negation. English and Chinese; pure."""

from __future__ import annotations

import re

from memstream.memory.rule_words import ANY, CJK, OWN

REL_EN = (r"(?:sister|brother|sibling|mom|mum|mother|dad|father|parents?|wife|husband|partner|"
          r"girlfriend|boyfriend|fianc[ée]e?|friends?|colleague|co-?worker|boss|manager|son|"
          r"daughter|kids?|children|neighbou?r|room-?mate|flatmate|cousin|uncle|aunt|grandma|"
          r"grandpa|grandmother|grandfather|in-laws?|niece|nephew|team-?mate|client|student)")
REL_ZH = ("妹妹|姐姐|哥哥|弟弟|爸爸|妈妈|爸|妈|父亲|母亲|父母|儿子|女儿|朋友|同事|老板|领导|经理|"
          "老公|老婆|丈夫|妻子|男朋友|女朋友|男友|女友|对象|邻居|室友|同学|老师|客户|家人|亲戚|"
          "叔叔|阿姨|舅舅|爷爷|奶奶|外公|外婆|表哥|表姐|表弟|表妹|堂哥|堂姐|孩子|闺蜜|兄弟|上司|"
          "合伙人|先生|太太|媳妇|公公|婆婆|岳父|岳母")

_EN_TIME = (r"(?:now|these days|nowadays|lately|recently|currently|today|yesterday|at last|"
            r"as of (?:today|now|this (?:week|month|year))|"
            r"(?:last|this|earlier this|over the) (?:week|weekend|month|year|spring|summer|"
            r"autumn|fall|winter|few (?:weeks|months|years))|in (?:\d{4}|january|february|march|"
            r"april|may|june|july|august|september|october|november|december)|"
            r"(?:a|one|two|three|four|five|six|a few|a couple of|few|several|\d+) "
            r"(?:days?|weeks?|months?|years?) ago|since (?:then|\d{4}|last \w+))")
_EN_OPEN = (r"(?:so|and|but|well|ok(?:ay)?|oh|yes|yeah|yep|yup|btw|by the way|also|anyway|"
            r"actually|update|news|fyi|guess what|good news|big news|great news|quick update|"
            r"then|hey|haha|lol|wow|plus|honestly|finally|after all that|long story short|"
            + _EN_TIME + ")")
_EN_BOUND = (r"(?:^|[,;:(—–]\s*|\s-\s|\b(?:and|but|so|because|cause|since|as|then|now that|"
             r"though|although|while|plus|and now|but now|so now|and then)\s+)")
_EN_SUBJ = (r"(?P<subj>i|we|(?:(?:my|our|the) )?[\w'-]+(?: [\w'-]+)? and i|me and (?:my |our )?"
            r"[\w'-]+|our (?:whole )?family|my family)")
_EN_ADV = (r"(?:just|finally|recently|now|also|actually|officially|eventually|already|both|all|"
           r"still|currently|really|then|lately|even|mostly|basically|happily|permanently|"
           r"usually|always|normally|regularly|typically|generally|mainly|only|at last|"
           r"once again|again|too|here|since|proudly|somehow|fully|completely|totally|been)")
_EN_AUX = r"(?:'ve|'m|'re|have|am|are|been|" + _EN_ADV[3:]
TAIL_EN = re.compile(rf"{_EN_BOUND}(?:{_EN_OPEN}[,!:]?\s+)*(?:{_EN_SUBJ}(?:\s*{_EN_AUX}\b)*"
                     rf"|(?:{_EN_ADV}\s+)*)\s*$", re.I)
START_EN = re.compile(rf"^\s*(?:{_EN_OPEN}[,!:]?\s+)*{_EN_SUBJ}\b", re.I)
THIRD_EN = re.compile(rf"\b(?:he|she|they|you|his|her|their|him|them)\b|"
                      rf"\b(?:my|our) {REL_EN}\b(?! and i\b)", re.I)

_ZH_TIME = (r"(?:现在|如今|目前|最近|近来|这几天|这些天|这阵子|这段时间|今天|昨天|前天|刚才|前几天|"
            r"前些天|前段时间|前阵子|不久前|年初|年底|月初|月底|上半年|下半年|春节后|年后|"
            r"上个?(?:月|周|星期|礼拜|季度)|这个?(?:月|周|星期|礼拜)|本(?:月|周)|"
            r"[今去前]年(?:初|底|年初|年底)?|\d{2,4}年(?:\d{1,2}月)?份?(?:初|底)?|"
            r"[一二三四五六七八九十两几半\d]+个?(?:月|年|周|星期|礼拜|天)(?:前|以前)|"
            r"从(?:今天|这周|这个月|上个?月|上周|[^，,。]{1,4}?)(?:起|开始))")
_ZH_OPEN = (r"(?:对了|哦|噢|嗯|啊|哈哈|哈|另外|顺便说一下|顺便说一句|顺便|告诉你|跟你说|和你说|"
            r"好消息|其实|话说|所以|然后|而且|但是|不过|可是|后来|最后|因为|于是|结果|总之|"
            r"是的|没错|唉|哎|终于|" + _ZH_TIME + ")")
_ZH_ADV = (r"(?:已经|终于|刚刚|刚|才|也|都|又|正式|总算|一直|早就|其实|还|就|这次|一起|全家|"
           r"第[一二三]天|头一天|第一周|"
           r"一家人|俩|通常|一般|平时|确实|真的|已|顺利|成功|算是|主要|开始|基本上|基本|"
           + _ZH_TIME + ")")
_ZH_SUBJ = (r"(?P<subj>我们?(?:家里|家|俩|两个|一家(?:人|三口|四口|五口)?|全家|夫妻俩?|两口子)?|"
            r"家里|咱们?(?:家|俩)?|我(?:和|跟|与)(?:我的?)?(?:(?![说讲告诉问聊觉认想听])"
            r"[\u4e00-\u9fffA-Za-z]){1,4}?(?:一起|俩|两个)?|(?:我的?)?(?:" + REL_ZH
            + ")(?:和|跟)我)")
TAIL_ZH = re.compile(rf"(?:^|[，,；;：:、]\s*)(?:{_ZH_OPEN}[，,]?)*(?:{_ZH_SUBJ}{_ZH_ADV}*"
                     rf"(?:的|带的|管的|负责的|所在的)?|{_ZH_ADV}*)\s*$")
START_ZH = re.compile(rf"^\s*(?:{_ZH_OPEN}[，,]?)*{_ZH_SUBJ}")
THIRD_ZH = re.compile(rf"他|她|它|你|您|(?<![和跟与])(?:{REL_ZH})(?![和跟]我)")

CLAUSE_SEP = re.compile(r"[,，;；:：]")
HYPOTHETICAL_START = re.compile(r"\s*(?:if|unless|suppose|supposing|assuming|in case|once|"
                                r"whether|如果|要是|假如|万一|假设|若|一旦|等到)", re.I)
HYPOTHETICAL = re.compile(
    r"\b(?:if|might|may|maybe|perhaps|would|could|should|will|won't|wouldn't|going to|gonna|"
    r"plan(?:ning)? to|thinking (?:of|about)|considering|wants? to|hope|hoping|wish|unless|"
    r"whether|not|never|no longer|don't|doesn't|didn't|isn't|aren't|wasn't)\b|'ll\b|'d\b|"
    r"如果|要是|假如|可能|也许|或许|打算|计划|准备|想|希望|万一|不是|没有|没|不", re.I)
QUESTION_ZH = re.compile(r"(?:吗|嘛|么|呢|吧)\s*[?？!！。.～~]*\s*$|是不是|有没有|要不要|会不会|"
                         r"能不能|该不该|是否")

# how far back from a fact its subject, its clause and an "if" are looked for: a run-on
# paste of thousands of words costs no more per match than a sentence does
_REACH = 240


def clause(sentence: str, start: int, end: int) -> tuple[int, int]:
    """The bounds of the clause (between commas, semicolons, colons) around ``start:end``."""
    lo = max(0, start - _REACH)
    before = [m.end() for m in CLAUSE_SEP.finditer(sentence, lo, start)]
    after = CLAUSE_SEP.search(sentence, end, end + _REACH)
    return (before[-1] if before else lo), (after.start() if after else
                                             min(len(sentence), end + _REACH))


# with no subject, an English base form is an imperative ("Use metric units"), not a fact
_DONE = re.compile(r"\w+(?:ed|ing)\b|(?:got|went|made|took|began|found|bought|had|became|been|"
                   r"quit|left|ran|swam|wed|allergic)\b", re.I)


def speaker_is_user(prefix: str, zh: bool, verb: str = "") -> bool:
    """Whether the words before a verb phrase (``verb``: its first words) make the user its
    subject: "I", "we", "my wife and I", "我", "我们", "我和老婆" (with adverbs and time
    words), or no subject at the start of the sentence ("Moved to Oslo", "搬到杭州了") or
    after a clause of the user's own with nobody else named."""
    near = prefix[-_REACH:]
    tail = (TAIL_ZH if zh else TAIL_EN).search(near)
    if tail is None:
        return False
    if tail.group("subj") is not None:
        return True
    if near == prefix and not prefix[: tail.start()].strip(" ,，"):
        return zh or _DONE.match(near[tail.end():] + verb) is not None
    start, third = (START_ZH, THIRD_ZH) if zh else (START_EN, THIRD_EN)
    return bool(start.match(prefix[:_REACH])) and not third.search(near)


def users_fact(sentence: str, m: re.Match[str], who: str) -> bool:
    """Whether match ``m`` of ``sentence`` is a fact the user states: not a question, not
    under an "if", and (for a verb phrase) with the user as its subject."""
    if who == ANY:
        return True
    start, end = clause(sentence, m.start(), m.end())
    said = sentence[start:end]
    if (end == len(sentence) and sentence.rstrip().endswith(("?", "？"))) or \
            QUESTION_ZH.search(said):
        return False
    if any(HYPOTHETICAL_START.match(c)
           for c in CLAUSE_SEP.split(sentence[max(0, start - _REACH): start])):
        return False
    if who == OWN:
        return not HYPOTHETICAL.search(sentence[start: m.start()])
    return speaker_is_user(sentence[: m.start()], CJK.search(m.group(0)) is not None,
                           m.group(0))


def cued(sentence: str, m: re.Match[str], before: str, cue: re.Pattern[str], who: str) -> bool:
    """Whether ``cue`` occurs (as ``who``'s words: see :func:`users_fact`) before match ``m``
    in its clause or in the clause before it, which may end ``before``, the previous sentence
    ("We moved again! This time it's Lyon.")."""
    start, _ = clause(sentence, m.start(), m.end())
    spans = [(sentence, start, m.start())]
    if start > 0:
        spans.append((sentence, clause(sentence, start - 1, start - 1)[0], start))
    elif before:
        spans.append((before, clause(before, len(before), len(before))[0], len(before)))
    return any(users_fact(text, c, who) for text, lo, hi in spans
               for c in cue.finditer(text, lo, hi))
