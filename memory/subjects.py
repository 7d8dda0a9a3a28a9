"""What a statement is about, pure: the profile subjects people update (SPEC §9d), named
by cue words in English and Chinese.

A knowledge update rarely repeats the words of the question it answers: "Where does the
user live?" is answered by "We finally got the keys to a flat in Porto", "用户在哪里上班？"
by "我跳槽到字节了". The bundled embedder cannot tell those from small talk (its cosines of
answers and of filler overlap: docs/archive.md), so retrieval also knows the handful of
subjects a user's facts change on, each by a list of cue words. A query about a subject
also searches the turns by its cues (:func:`cue_terms`, a small weight beside the query's
own words); a turn that shares a subject with the query matches it by words; and two
statements about the same subject are ordered by time, the newest first.

A subject is named as the rules model's slot (``residence``, ``employer``, ...), so a
memory with a slot is about that subject whatever its words. Cue words are matched as
index terms (:func:`memory.lexical.terms`: stemmed English words, CJK runs as characters
and pairs), so "moved", "moving" and "move" are one cue.

:func:`about_someone_else` tells a statement about another person ("My sister moved to
Paris", "我妹妹搬到北京了") from one about the speaker: it updates nobody's memory.
"""

from __future__ import annotations

import re
from functools import lru_cache

from memstream.memory import lexical

_CUES: dict[str, tuple[str, str]] = {  # subject -> (English cue words, Chinese cue words)
    "residence": (
        "live lives living lived reside resident based city town village move moved moving "
        "relocate relocated settle settled flat apartment house home neighbourhood "
        "neighborhood rent rented landlord lease hometown address suburb",
        "住 搬 定居 城市 房子 租房 老家 落户 安家"),
    "employer": (
        "work works working worked job jobs company employer employed office career role "
        "position hired joined join quit resign resigned startup freelance freelancer "
        "self-employed consultant consulting contract gig salary promotion promoted offer "
        "laid redundant unemployed retired business",
        "工作 上班 公司 跳槽 入职 辞职 创业 单位 职位 上岗 离职 退休 打工 老板"),
    "children": (
        "child children kid kids son sons daughter daughters baby babies born pregnant "
        "newborn toddler twins",
        "孩子 儿子 女儿 宝宝 出生 怀孕 二胎 三胎 娃"),
    "pets": (
        "pet pets cat cats dog dogs kitten kittens puppy puppies adopt adopted rabbit "
        "hamster parrot",
        "猫 狗 宠物 领养 兔子 仓鼠 鹦鹉"),
    "team_size": (
        "team teams report reports headcount engineers hire hires hiring squad staff "
        "employees people members",
        "团队 下属 招人 扩招 组员 组里 成员 员工 手下"),
    "partner": (
        "partner girlfriend boyfriend wife husband spouse married marry marrying engaged "
        "fiance fiancee wedding dating divorced divorce relationship",
        "女朋友 男朋友 老婆 老公 妻子 丈夫 结婚 对象 离婚 订婚 恋爱 分手"),
    "tool": (
        "use uses using used switch switched switching editor ide phone laptop computer "
        "browser app apps tool tools software keyboard",
        "改用 换成 换了 在用 手机 电脑 编辑器 软件 工具 浏览器"),
    "schedule": (
        "monday mondays tuesday tuesdays wednesday wednesdays thursday thursdays friday "
        "fridays saturday saturdays sunday sundays weekday weekdays weekend weekends morning "
        "mornings evening evenings schedule timetable class classes lesson lessons gym "
        "training shift shifts weekly",
        "周一 周二 周三 周四 周五 周六 周日 周末 星期 每周 早上 晚上 上课 课程 健身 时间表"),
    "diet": (
        "eat eats eating meat vegetarian vegan diet food meal meals cook cooking drink "
        "drinks coffee tea",
        "吃素 吃肉 饮食 素食 咖啡 喝茶"),
    "preference": (
        "favourite favorite prefer prefers preferred love loves enjoy enjoys fan",
        "喜欢 最爱 偏好 爱看 爱听 最喜欢"),
    "hobby": (
        "hobby hobbies sport sports exercise workout workouts running jogging swimming "
        "climbing bouldering hiking cycling tennis football soccer basketball badminton golf "
        "yoga pilates dancing taken hooked",
        "运动 爱好 打球 游泳 跑步 健身 锻炼 迷上 爱上 入坑 篮球 足球 羽毛球 网球 瑜伽"),
}
# a slot of the rules model -> its subject (a slot "tool:editor" is about "tool")
_SLOTS = {"company_size": "team_size", "budget": "preference", "favourite": "preference",
          "sport": "hobby", "family_size": "children"}
CUE_WEIGHT = 0.3  # a cue's weight in the words' search, beside the query's own words (1)


def _terms(words: str) -> frozenset[str]:
    """A cue list's index terms: an English word's stem, a Chinese word itself when it is
    one or two characters, else its character pairs (the words' search indexes pairs)."""
    out: set[str] = set()
    for word in words.split():
        found = lexical.terms(word)
        cjk = [t for t in found if lexical.is_cjk(t)]
        if cjk:
            out |= {t for t in cjk if len(t) == min(len(word), 2)}
        else:
            out |= set(found)
    return frozenset(out)


@lru_cache(maxsize=1)
def cues() -> dict[str, frozenset[str]]:
    """subject -> its cue terms (what the words' search adds to a query about it)."""
    return {name: _terms(f"{en} {zh}") for name, (en, zh) in _CUES.items()}


@lru_cache(maxsize=1)
def _matchers() -> dict[str, tuple[frozenset[str], re.Pattern[str] | None]]:
    """subject -> (its English cue stems, its Chinese cue words as one pattern): a Chinese
    word is found as it is written (女朋友, never 朋友 alone), as no term holds it whole."""
    out = {}
    for name, (en, zh) in _CUES.items():
        words = sorted(zh.split(), key=len, reverse=True)
        out[name] = (frozenset(lexical.terms(en)),
                     re.compile("|".join(map(re.escape, words))) if words else None)
    return out


@lru_cache(maxsize=4096)
def of_text(text: str) -> frozenset[str]:
    """The subjects a text names by a cue word."""
    terms = frozenset(lexical.terms(text))
    return frozenset(name for name, (en, zh) in _matchers().items()
                     if en & terms or (zh is not None and zh.search(text)))


def of_slot(slot: str | None) -> frozenset[str]:
    """The subject a rules-model slot names ("tool:editor" -> tool), if any."""
    if not slot:
        return frozenset()
    head = slot.split(":", 1)[0]
    head = _SLOTS.get(head, head)
    return frozenset({head}) if head in _CUES else frozenset()


def cue_terms(subjects: frozenset[str]) -> frozenset[str]:
    """Every cue term of these subjects (the words' search adds them to a query)."""
    return frozenset().union(*(cues()[s] for s in subjects)) if subjects else frozenset()


_OTHERS_EN = (r"sister|brother|sibling|mom|mum|mother|dad|father|parents?|grandma|grandpa|"
              r"grandmother|grandfather|aunt|uncle|cousin|niece|nephew|friend|friends|"
              r"colleague|colleagues|coworker|co-worker|boss|manager|neighbou?r|roommate|"
              r"flatmate|classmate|teacher|landlord|in-laws?")
_OTHER_EN = re.compile(
    rf"\b(?:my|our|a|the)\s+(?:\w+\s+)?(?:{_OTHERS_EN})\b(?:'s)?|^\s*(?:he|she|they)\b|"
    rf"[.!?;,]\s*(?:he|she|they)\b", re.I)
_SELF_EN = re.compile(r"\b(?:i|i'm|i've|i'd|i'll|we|we're|we've|we'd|we'll|us)\b", re.I)
_OTHER_ZH = re.compile(r"(?:我|我们)?(?:妹妹|姐姐|弟弟|哥哥|爸爸|妈妈|父母|爷爷|奶奶|外公|外婆|"
                       r"叔叔|阿姨|舅舅|表哥|表姐|表妹|表弟|堂哥|朋友|同事|领导|老板|邻居|室友|"
                       r"同学|老师|房东)|他|她")


_CLAUSE = re.compile(r"[.!?;,:，。！？；：]|\b(?:so|and|but|because|while|though|although)\b|"
                     r"所以|但是|不过|因为|而且", re.I)


def _someone_else(clause: str) -> bool:
    if _OTHER_EN.search(clause):
        return _SELF_EN.search(_OTHER_EN.sub(" ", clause)) is None
    if _OTHER_ZH.search(clause):
        return "我" not in _OTHER_ZH.sub("", clause)
    return False


def about_someone_else(text: str, subject: str | None = None) -> bool:
    """Whether a statement (on ``subject``: the clauses that name it by a cue) is about
    another person rather than the speaker: it names someone else (a relative, a friend,
    a colleague, "he", "she") and nothing of the speaker's own ("I", "we"; 我 alone, not
    我妹妹). "My sister just moved to Vancouver, so I'll fly west a lot" is the sister's
    move."""
    clauses = [c for c in _CLAUSE.split(text) if c.strip()]
    if subject is not None:
        clauses = [c for c in clauses if subject in of_text(c)] or clauses
    return bool(clauses) and all(_someone_else(c) for c in clauses)
