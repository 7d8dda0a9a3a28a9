"""Hobbies and sports, for the offline rules model (:mod:`memory.rules`): "I'm into bouldering
now", "I've taken up pottery", "climbing is my thing now", "I got hooked on chess", 最近迷上了
攀岩, 现在每周去游泳, 入坑了摄影, 开始学吉他了.

People have several hobbies at once, so a hobby takes the ``hobby`` slot (a new one replaces
the old) only where the user marks the change: "now", "these days", "lately", 现在, 最近,
"my new hobby", or an old one stopped ("I gave up tennis and took up golf", 不能打球了).
Anything else is a hobby added beside the others. Only known activities count ("I'm into
you", "I took up the offer", 迷上了他 are not hobbies)."""

from __future__ import annotations

import re

from memstream.memory.decisions import Candidate
from memstream.memory.rule_words import END, OWN, ZEND, Rule, clean

_HOBBY_EN = (
    r"climbing|bouldering|running|jogging|swimming|cycling|biking|mountain biking|hiking|"
    r"trekking|walking|surfing|skiing|snowboarding|skating|skateboarding|rowing|kayaking|"
    r"canoeing|paddleboarding|sailing|diving|scuba diving|yoga|pilates|crossfit|boxing|"
    r"kickboxing|karate|judo|jiu-jitsu|jiu jitsu|bjj|taekwondo|kung fu|fencing|archery|tennis|"
    r"padel|squash|badminton|golf|football|soccer|basketball|volleyball|baseball|softball|"
    r"rugby|cricket|hockey|table tennis|ping pong|pickleball|frisbee|dancing|salsa|ballet|"
    r"tango|pottery|ceramics|knitting|crochet|crocheting|sewing|quilting|embroidery|painting|"
    r"drawing|sketching|watercolou?rs?|calligraphy|photography|gardening|baking|cooking|"
    r"woodworking|chess|birdwatching|birding|fishing|gaming|meditation|weightlifting|lifting|"
    r"powerlifting|triathlons?|marathons?|piano|guitar|bass|violin|cello|drums|ukulele|"
    r"singing|choir|writing|reading|journaling|sourdough|brewing|camping|climbing gyms?")
# a hobby: up to two words before a known activity ("trail running", "Brazilian jiu-jitsu")
_WHAT_EN = (r"(?:(?i:the) )?(?P<what>(?:(?!(?i:the|a|an|my|our|your|his|her|their|some|any|no|"
            r"more|less|too|of|and|to|for|with|about|in|on|at|it|this|that)\b)[\w-]+ ){0,2}?"
            rf"(?i:{_HOBBY_EN}))(?=[,.;!?]|$|\s+(?i:and|but|so|now|again|these days|lately|"
            r"recently|last|this|a few|every|twice|on|at|in|with|since|for|because|too|as well|"
            r"instead|after|before|during|which|is|was|has)\b)")
_HOBBY_ZH = (r"攀岩|抱石|游泳|跑步|夜跑|马拉松|健身|瑜伽|普拉提|骑行|单车|徒步|爬山|登山|滑雪|"
             r"冲浪|潜水|滑板|轮滑|滑冰|拳击|泰拳|散打|跆拳道|空手道|柔道|柔术|击剑|射箭|网球|羽毛球|乒乓球|"
             r"篮球|足球|排球|棒球|高尔夫|台球|飞盘|匹克球|壁球|舞蹈|跳舞|街舞|芭蕾|钢琴|吉他|"
             r"尤克里里|小提琴|大提琴|古筝|二胡|架子鼓|唱歌|声乐|摄影|画画|油画|水彩|素描|国画|书法|"
             r"陶艺|烘焙|烹饪|编织|钩针|刺绣|园艺|钓鱼|露营|围棋|象棋|国际象棋|冥想|太极|八段锦|"
             r"皮划艇|桨板|帆船|马术|(?:(?![一二三四五六七八九十两几次个地气眼全])[\u4e00-\u9fff]){0,3}"
             r"(?:球|舞|拳)")
_WHAT_ZH = r"(?P<what>[\u4e00-\u9fffA-Za-z]{1,8}?)"
_IS_HOBBY_ZH = re.compile(rf"(?:室内|户外|野外|公路|山地|自由|花样|越野)?(?:{_HOBBY_ZH})")

# the change: "now" or an old hobby stopped ("gave up tennis", 不能打球了, 好久没去了)
_NOW = re.compile(r"\b(?:now|these days|nowadays|lately|recently|at the moment|instead|new|"
                  r"latest|anymore|any more|no longer|(?<!never )(?<!n't )(?:gave up|given up|"
                  r"quit|stopped|dropped))\b|"
                  r"现在|如今|最近|这阵子|这段时间|近来|不再|不能|放弃|好久没|停了|"
                  r"不(?:去|打|玩|练|跑|游|跳)了|没(?:去|打|玩|练)了", re.I)
_STOPPED = re.compile(r"\b(?:gave up|given up|quit|stopped|dropped|no longer \w+|instead of) "
                      + _WHAT_EN.replace("?P<what>", "?P<old>"))


def hobby(what: str, m: re.Match[str], zh: bool = False) -> Candidate:
    """A hobby: of the ``hobby`` slot only where the sentence of ``m`` marks a change."""
    near = m.string[max(0, m.start() - 160): m.end() + 160]
    old = _STOPPED.search(near)
    replaces = clean(old.group("old")) if old and old.group("old") != what else None
    text = f"爱好是{what}" if zh else f"Hobby: {what.lower()}"
    return Candidate(text, importance=5, slot="hobby" if _NOW.search(near) else None,
                     replaces=replaces)


def _en(m: re.Match[str]) -> Candidate | None:
    return hobby(clean(m.group("what")), m)


def _zh(m: re.Match[str]) -> Candidate | None:
    """The activity as a noun: 打羽毛球 -> 羽毛球, 去健身房 -> 健身, 去攀岩馆 -> 攀岩."""
    what = re.sub(r"^(?:(?:去|练|打|踢|学|玩|做|上|跳)(?=..))+", "", m.group("what"))
    what = re.sub(r"(?<=..)(?:房|馆|场|课|班)$", "", what)
    if not _IS_HOBBY_ZH.fullmatch(what):
        return None
    return hobby(what, m, zh=True)


_INTO = (r"(?:(?i:really|totally|so|very|big|heavily|seriously|fully|properly|quite|super|"
         r"now|all) )*")
HOBBIES = [
    Rule(re.compile(r"(?:'m|'ve been|'ve gotten|\b(?i:am|have been|got|getting|gotten)) " + _INTO
                    + r"(?i:into) " + _WHAT_EN), _en),
    Rule(re.compile(r"\b(?i:taken up|took up|taking up|picked up|started|begun|began|started "
                    r"learning|'m learning|am learning) (?:(?i:doing|playing) )?" + _WHAT_EN),
         _en),
    Rule(re.compile(r"(?:'m|\b(?i:am|got|getting|been|became|become)) " + _INTO
                    + r"(?i:hooked on|addicted to|obsessed with) " + _WHAT_EN), _en),
    Rule(re.compile(r"(?:^|[,;:]\s*|\b(?:and|but|so|now) )" + _WHAT_EN + r" (?i:is|'s|has become|"
                    r"became) (?:(?i:now|really|totally|definitely) )?(?i:my|our) (?:(?i:new|"
                    r"latest|big|current|main|favourite|favorite) )?(?i:thing|obsession|hobby|"
                    r"passion|sport|jam|happy place|escape)\b"), _en, OWN),
    Rule(re.compile(r"\b(?i:my|our) (?:(?i:new|latest|current|main|big) )?(?i:hobby|sport|"
                    r"obsession|passion)(?: (?i:these days|now|at the moment|lately))? (?i:is|'s) "
                    r"(?:(?i:now) )?" + _WHAT_EN + END), _en, OWN),
    # 最近迷上了攀岩, 入坑了摄影, 入了摄影的坑
    Rule(re.compile(r"(?:迷上了?|爱上了?|喜欢上了?|入坑了?|入了|沉迷于?|痴迷于?|开始(?:学|练|玩|打)了?)"
                    + _WHAT_ZH + r"(?:的坑)?" + ZEND), _zh),
    # 现在每周去游泳, 最近一周去三次岩馆
    Rule(re.compile(r"(?:每周|每天|每个?周末|经常|常常|天天|(?:每周|一周)[一二三四五六七两几\d]次)"
                    r"(?:都|会|固定)?(?P<what>(?:去|练|打|踢|学|玩|跳)[\u4e00-\u9fffA-Za-z]{1,7}?)"
                    + ZEND), _zh),
]
