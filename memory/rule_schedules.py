"""Schedules, for the offline rules model (:mod:`memory.rules`): one slot per activity ("I go
to the gym on Mondays", 我把健身改到周四了 -> ``schedule:<activity>``), working hours and days,
and the elliptic moves ("now I go on Thursdays") whose activity was named before."""

from __future__ import annotations

import re

from memstream.memory.decisions import Candidate
from memstream.memory.rule_words import (
    CHANGE,
    CJK,
    EN_N,
    FULL_DAY_EN,
    OWN,
    WEEKDAY_EN,
    ZH_N,
    Activity,
    Rule,
    clean,
    n_of,
)

# schedules: one slot per activity
_DAYS_PL = rf"(?i:{FULL_DAY_EN}s)"
_DAY1 = rf"(?i:{WEEKDAY_EN})"
_PART = r"(?i:mornings?|evenings?|nights?|afternoons?)"
_AND = r"(?:,? (?i:and|&|or)|,)"
_RECUR = (rf"(?:(?:(?i:on) )?{_DAYS_PL}(?:{_AND} {_DAYS_PL})*(?: {_PART})?"
          rf"|(?:(?i:on) )?{_DAY1} (?i:mornings|evenings|nights|afternoons)"
          rf"|(?i:every|each) (?:(?i:other) )?(?:{_DAY1}|(?i:day|morning|evening|night|weekday|"
          rf"weekend|week))(?:{_AND} {_DAY1})*(?: {_PART})?"
          r"|(?i:on weekends|on weekdays|at weekends|at the weekend|weekday mornings|weekday "
          r"evenings|twice a week|once a week|three times a week|daily))")
_ANYDAY = rf"(?:{_RECUR}|(?:(?i:on) )?{_DAY1}(?:{_AND} {_DAY1})*(?: {_PART})?)"
_HOUR = r"(?:\d{1,2}(?::\d{2})?(?!\d)(?: ?(?i:am|pm|a\.m\.|p\.m\.))?|(?i:noon|midnight))"
_TO = r"(?: (?i:to|until|till|through) |\s?[-–]\s?)"
_CLOCK = rf"(?P<clock> (?i:at|from) {_HOUR}(?:{_TO}{_HOUR})?)?"
_ACT = r"(?P<act>[A-Za-z][a-z'-]*(?: [a-z][a-z'-]*){0,2}?)"
_CONTAINER = re.compile(r"\s+(?:sessions?|workouts?|visits?|days?|times?|slots?|routine)$", re.I)
_ACT_KIND = re.compile(r"\s+(?:class(?:es)?|lessons?|practice|training|appointments?)$", re.I)
_NOT_ACT = re.compile(r"(?:there|here|home|out|it|them|back|bed|sleep|that|this|one|some|to|"
                      r"somewhere|a|the|my|work|school|office|on|in|at|every|each|them|it)$",
                      re.I)
_HABIT = re.compile(r"gym|yoga|pilates|class|lesson|training|practice|session|workout|swim|run|"
                    r"choir|rehearsal|therapy|tennis|football|soccer|basketball|climb|boxing|"
                    r"danc|spin|crossfit|piano|guitar|violin|tutor|physio|badminton|volleyball|"
                    r"hockey|karate|judo|martial|meditation|cycling|rowing|lifting|健身|瑜伽|课|"
                    r"训练|锻炼|游泳|跑步|练习|普拉提|球|舞|琴|补习|家教|康复|理疗|攀岩|拳|骑行|合唱|排练",
                    re.I)
_HABIT_EN = (r"gym|yoga|pilates|swimming|running|tennis|football|soccer|basketball|climbing|"
             r"boxing|dance|spin|crossfit|piano|guitar|violin|choir|therapy|physio|badminton|"
             r"volleyball|hockey|karate|judo|meditation|cycling|rowing|training|practice|"
             r"tutoring|lessons?|class(?:es)?")
_ZDAY = r"(?:周|星期|礼拜)[一二三四五六日天]"
_ZDAYS = rf"{_ZDAY}(?:(?:和|、|跟|及|与)(?:{_ZDAY}|[一二三四五六日天]))*"
_ZPART = r"(?:早上|晚上|下午|上午|中午|傍晚)"
_ZWHEN = rf"(?:每(?:个)?{_ZDAYS}|每天|每个?(?:周末|工作日)|每周[一二三四五六七两]次)"
_ZVERB = r"(?:去|上|练|打|学|做|跳|参加)"
_ZWHAT = rf"(?P<what>{_ZVERB}[\u4e00-\u9fffA-Za-z]{{1,6}}?)"
_ZMOVE = r"(?:改到|改成|换到|换成|调到|调整到|挪到|改在|换在|改为|移到)了?(?:每)?"
_ZHOUR = (r"(?:早上|上午|中午|下午|晚上)?(?:\d{1,2}(?::\d{2})?|[一二三四五六七八九十]{1,3})"
          r"(?:点(?:半)?)?")


_GERUND = {"swim": "swimming", "run": "running", "jog": "jogging", "cycle": "cycling",
           "climb": "climbing", "meditate": "meditation", "work out": "working out",
           "lift": "lifting", "box": "boxing", "dance": "dancing", "skate": "skating",
           "surf": "surfing", "row": "rowing", "hike": "hiking", "volunteer": "volunteering"}


def activity(m: re.Match[str]) -> Activity | None:
    """The activity a schedule match names, as said and as its slot's key."""
    if "what" in m.re.groupindex:
        what = m.group("what")
        key = re.sub(rf"^{_ZVERB}", "", what)
        key = re.sub(r"(?:房|馆|场|课|班|中心|时间)$", "", key) or key
        if what.endswith(("房", "馆", "场", "中心")) and not re.match(_ZVERB, what):
            what = "去" + what
        elif what.endswith(("课", "班")) and not re.match(_ZVERB, what):
            what = "上" + what
        return None if key in ("时间", "课程", "安排", "计划") else (what, key)
    act = re.sub(r"^(?:the|my|our|a|an) ", "", m.group("act").lower())
    act = _GERUND.get(act, act)
    if _NOT_ACT.match(act):
        return None
    shown = _CONTAINER.sub("", act) or act
    return shown, _ACT_KIND.sub("", shown) or shown


def schedule(act: Activity, when: str, clock: str | None = None) -> Candidate:
    shown, key = act
    if CJK.search(shown):
        return Candidate(f"{when}{shown}", importance=5, slot=f"schedule:{key}")
    when = clean(when)
    if re.match(_DAY1, when):
        when = "on " + when
    text = f"{shown[:1].upper()}{shown[1:]} {when}" + (f" {clean(clock)}" if clock else "")
    return Candidate(text, importance=5, slot=f"schedule:{key}")


def _scheduled(m: re.Match[str], moved: bool = False) -> Candidate | None:
    act = activity(m)
    if act is None:
        return None
    said = m.groupdict()
    if "what" in m.re.groupindex:
        when = said.get("when") or "每" + said["days"]
        return schedule(act, when + (said.get("part") or ""))
    if moved and not re.fullmatch(_RECUR, m.group("when")) and not _HABIT.search(act[0]) \
            and not re.search(r"\b(?:now|back|always|usually)\b", m.group(0), re.I):
        return None
    return schedule(act, m.group("when"), said.get("clock"))


def elliptic(m: re.Match[str], act: Activity) -> Candidate | None:
    """"now I go on Thursdays" / "I moved to the Saturday group instead" / "现在改到周四了":
    the activity is the last one mentioned."""
    said = m.groupdict()
    if "days" in said:
        return schedule(act, "每" + said["days"] + (said.get("part") or "")) \
            if CJK.search(act[0]) else None
    if CJK.search(act[0]) or not CHANGE.search(m.string):
        return None
    when = _weekly(m.group("when")) if "group" in said else m.group("when")
    return schedule(act, when, said.get("clock"))


# "I moved to the Saturday group": a class, a group, a slot held on that day every week
_GROUP = (r"(?i:group|class|classes|session|lesson|slot|course|cohort|meetup|practice|training|"
          r"workout)")
_TO_THE_DAY = (r"\b(?i:moved|switched|changed|transferred|swapped|jumped|went back|gone back)"
               r"(?: (?i:over|back))? (?i:to|into) (?i:the|a) "
               rf"(?P<when>(?i:{FULL_DAY_EN})(?: (?i:morning|evening|night|afternoon))?)")


def _weekly(when: str) -> str:
    """"Saturday" -> "Saturdays", "Saturday morning" -> "Saturday mornings"."""
    return when + "s"


def _group_activity(m: re.Match[str]) -> Activity | None:
    """The activity of "the Saturday yoga class" ("yoga class", key "yoga") or "the Saturday
    Spanish group" ("spanish")."""
    act, group = m.group("act").lower(), m.group("group").lower()
    if re.fullmatch(r"class(?:es)?|lesson|practice|training", group):
        act = f"{act} {group}"
    act = _GERUND.get(act, act)
    if _NOT_ACT.match(act):
        return None
    shown = _CONTAINER.sub("", act) or act
    return shown, _ACT_KIND.sub("", shown) or shown


def _to_the_day(m: re.Match[str]) -> Candidate | None:
    act = _group_activity(m)
    return None if act is None else schedule(act, _weekly(m.group("when")))


def _hours(m: re.Match[str]) -> Candidate:
    zh = CJK.search(m.group(0)) is not None
    t1, t2 = clean(m.group("t1")), clean(m.group("t2"))
    return Candidate(f"上班时间{t1}到{t2}" if zh else f"Works {t1} to {t2}", importance=5,
                     slot="schedule:work hours")


def _days(m: re.Match[str]) -> Candidate | None:
    n = n_of(m)
    if n is None or not 0 < n < 8:
        return None
    text = f"每周工作{n}天" if CJK.search(m.group(0)) else f"Works {n} days a week"
    return Candidate(text, importance=5, slot="schedule:work days")


SCHEDULES = [
    Rule(re.compile(rf"\b(?i:go|head|get)(?: (?i:to))? (?:(?i:the|my|a|an) )?{_ACT} "
                    rf"(?P<when>{_RECUR}){_CLOCK}"), _scheduled, activity=activity),
    Rule(re.compile(r"\b(?i:have|do|take|attend|play|practi[sc]e|teach|train|coach|volunteer at|"
                    rf"work out at)(?: (?i:my|a|the|an|some))? {_ACT} (?P<when>{_RECUR}){_CLOCK}"),
         _scheduled, activity=activity),
    Rule(re.compile(rf"\b(?P<act>(?i:{'|'.join(_GERUND)}))\b (?P<when>{_RECUR}){_CLOCK}"),
         _scheduled, activity=activity),
    Rule(re.compile(r"\b(?i:moved|switched|changed|rescheduled|shifted|pushed|bumped|swapped|put)"
                    rf"(?: (?i:my|our|the))? {_ACT} (?i:to|over to|back to) (?P<when>{_ANYDAY})"
                    + _CLOCK), lambda m: _scheduled(m, moved=True), activity=activity),
    Rule(re.compile(rf"\b(?i:my|our) {_ACT} (?i:is|are) (?:(?i:now|moved to|back to|always|usually)"
                    rf" )?(?P<when>{_ANYDAY}){_CLOCK}"), lambda m: _scheduled(m, moved=True),
         OWN, activity=activity),
    Rule(re.compile(rf"(?:^|[,;:]\s*|\b(?:and|but|so|now) )(?P<act>(?i:{_HABIT_EN})"
                    r"(?: [a-z]+)?) (?:(?i:is|are|'s|moved|got moved|has moved|have moved|"
                    r"switched|changed)) (?:(?i:now|back) )?(?:(?i:to) )?"
                    rf"(?P<when>{_ANYDAY}){_CLOCK}"),
         lambda m: _scheduled(m, moved=True) if CHANGE.search(m.string) else None, OWN,
         activity=activity),
    Rule(re.compile(rf"(?:现在|如今|改成|改为)(?:每)?(?P<days>{_ZDAYS})(?:的?(?P<part>{_ZPART}))?"
                    rf"(?:都)?{_ZWHAT}(?=了|[，。！；,.!？?～~、]|$)"),
         _scheduled, activity=activity),
    Rule(re.compile(rf"(?P<when>{_ZWHEN})(?:的?(?P<part>{_ZPART}))?(?:都|会|一般|通常|固定|基本|"
                    rf"基本上)*{_ZWHAT}(?=了|[，。！；,.!？?～~、]|$)"),
         _scheduled, activity=activity),
    Rule(re.compile(rf"(?P<days>{_ZDAYS})(?:的?(?P<part>{_ZPART}))?(?:都|一般都|通常都|基本都|固定)"
                    rf"(?:会)?{_ZWHAT}(?=了|[，。！；,.!？?～~、]|$)"),
         _scheduled, activity=activity),
    Rule(re.compile(r"(?:把)?(?P<what>(?:(?![我你他她把们都也现已又在的])[\u4e00-\u9fffA-Za-z]){2,6}?)"
                    rf"(?:的时间|时间)?(?:现在|也|都|已经)*{_ZMOVE}(?P<days>{_ZDAYS})"
                    rf"(?:的?(?P<part>{_ZPART}))?"),
         lambda m: _scheduled(m) if _HABIT.search(m.group("what")) else None,
         activity=activity),
    Rule(re.compile(_TO_THE_DAY + r" (?!(?i:morning|evening|night|afternoon)\b)"
                    rf"(?P<act>[A-Za-z][a-z'-]*(?: [a-z][a-z'-]*)?) (?P<group>{_GROUP})\b"),
         _to_the_day, activity=_group_activity),
    Rule(re.compile(rf"\b(?i:work(?:ing)?)(?: (?i:now))? (?:(?i:from) )?(?P<t1>{_HOUR}){_TO}"
                    rf"(?P<t2>{_HOUR})"), _hours),
    Rule(re.compile(r"\b(?i:my|our) (?i:working|work|office|shift) (?i:hours) (?i:are|is)"
                    rf"(?: (?i:now))? (?:(?i:from) )?(?P<t1>{_HOUR}){_TO}(?P<t2>{_HOUR})"),
         _hours, OWN),
    Rule(re.compile(rf"\b(?i:work)(?: (?i:now|only))? (?P<n>{EN_N}) (?i:days) (?i:a|per) "
                    r"(?i:week)"), _days),
    Rule(re.compile(r"(?:上班|工作)时间(?:现在|已经)?(?:是|改成了?|变成了?|调整为|改为|改到了?)?(?:从)?"
                    rf"(?P<t1>{_ZHOUR})(?:到|至|-|~)(?P<t2>{_ZHOUR})"), _hours),
    Rule(re.compile(rf"每周(?:只)?(?:上|工作)(?P<n>{ZH_N})天(?:班)?"), _days),
]
ELLIPTIC = [
    re.compile(r"\b(?:(?i:go|do it|have it|have them|do them|moved it|switched it|changed it|"
               r"moved them|moved that|switched that))"
               rf"(?: (?i:now|instead))?(?: (?i:to|over to|back to))? (?P<when>{_ANYDAY})"
               + _CLOCK),
    re.compile(_TO_THE_DAY + rf" (?P<group>{_GROUP})\b"),
    re.compile(rf"{_ZMOVE}(?P<days>{_ZDAYS})(?:的?(?P<part>{_ZPART}))?"),
]
