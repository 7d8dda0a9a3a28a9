"""Counts, for the offline rules model (:mod:`memory.rules`): children, team size, pets per
species and company size ("we have three kids now", 我们团队现在有12个人) -> ``children``,
``team_size``, ``pets:<species>``, ``company_size``."""

from __future__ import annotations

import re

from memstream.memory.decisions import Candidate
from memstream.memory.rule_words import ANY, CJK, EN_N, ORD, OWN, ZH_N, Rule, n_of, number

SPECIES_EN = (r"(?:cats?|kittens?|dogs?|pupp(?:y|ies)|rabbits?|bunn(?:y|ies)|hamsters?|"
              r"guinea pigs?|parrots?|budgies?|birds?|goldfish|fish|turtles?|tortoises?|"
              r"snakes?|lizards?|horses?|chickens?|hens?|ferrets?|gerbils?|rats?|mice)")
_SPECIES_KEY = {"kitten": "cat", "puppy": "dog", "puppie": "dog", "bunny": "rabbit",
                "bunnie": "rabbit", "budgie": "bird", "goldfish": "fish", "hen": "chicken",
                "mice": "mouse", "猫": "cat", "猫咪": "cat", "小猫": "cat", "狗": "dog",
                "狗狗": "dog", "小狗": "dog", "兔子": "rabbit", "仓鼠": "hamster", "鹦鹉": "bird",
                "鱼": "fish", "金鱼": "fish", "乌龟": "turtle", "龟": "turtle"}
SPECIES_ZH = "猫咪|小猫|猫|狗狗|小狗|狗|兔子|仓鼠|鹦鹉|金鱼|鱼|乌龟|龟"


def species(word: str) -> str:
    """The singular key of a species word: "puppies" -> "dog", "猫咪" -> "cat"."""
    w = word.lower()
    w = w[:-3] + "y" if w.endswith("ies") else (w[:-1] if w.endswith("s") else w)
    return _SPECIES_KEY.get(w, w)


# --- children, team, pets, company, family ------------------------------------------------
_KID = r"(?i:kids?|child(?:ren)?|sons?|daughters?|boys?|girls?|babies|baby|little ones?)"
_MORE_KIDS = re.compile(rf",? (?i:and) (?P<n>{EN_N}|(?i:a|one)) (?:(?i:little|young) )?"
                        r"(?i:sons?|daughters?|boys?|girls?|kids?|child(?:ren)?)\b")


def children(n: int | None, zh: bool = False) -> Candidate | None:
    if n is None or not 0 < n < 30:
        return None
    text = f"有{n}个孩子" if zh else f"Has {n} child" + ("" if n == 1 else "ren")
    return Candidate(text, importance=7, slot="children")


def count_text(slot: str, n: int, like: str) -> str:
    """The memory of ``slot`` saying ``n``, in the language and words of ``like`` (the
    memory it replaces: its first number becomes ``n``)."""
    if slot == "children":
        found = children(n, zh=CJK.search(like) is not None)
        if found is not None:
            return found.text
    return re.sub(r"\d+", str(n), like, count=1)


# "Little Nora arrived", "our baby was born", "we had a baby girl": one more child, no count
_BIRTH = (r"(?<!['’]s )\b(?:(?i:our|my) )?(?:(?i:little|baby|new baby|baby boy|baby girl|"
          r"little one)(?:,? [A-Z][a-z]+,?)?|[A-Z][a-z]+,? (?i:our|my) (?:(?i:new|little) )?"
          r"(?i:baby|son|daughter|boy|girl),?) (?i:arrived|was born|is here|has arrived|"
          r"just arrived|finally arrived|came into the world)\b(?! (?i:late|early|home|back|to|"
          r"from|at (?:school|work|the|my|our))\b)")
_HAD_BABY = (r"\b(?i:we|I) (?:(?i:just|finally) )?(?i:had|welcomed) (?i:a|our) (?:(?i:new|healthy|"
             r"beautiful) )?(?i:baby|son|daughter)(?: (?i:boy|girl))?\b(?! (?i:shower|monitor|seat|"
             r"sitter|food|clothes|gate|names?)\b)")


def one_more_child(zh: bool = False) -> Candidate:
    return Candidate("添了一个孩子" if zh else "Had a new baby", importance=7, slot="children",
                     grows=1)


def _have_kids(m: re.Match[str]) -> Candidate | None:
    n, plural = n_of(m), not re.search(r"(?i:kid|child|son|daughter|boy|girl|baby|one)$",
                                     m.group("what"))
    if n is None or (n == 1) == plural:
        return None
    more = _MORE_KIDS.match(m.string, m.end())
    return children(n + (number(more.group("n")) or 0) if more else n)


def _team(m: re.Match[str], zh: bool = False) -> Candidate | None:
    n = n_of(m)
    if n is None or not 1 < n < 10_000:
        return None
    if (m.groupdict().get("whose") or "").lower() == "the" and not re.search(
            r"\b(?:I|we|our|my)\b", m.string[: m.start()], re.I):
        return None  # "the team" is the user's only in the user's story
    return Candidate(f"团队有{n}人" if zh else f"Team has {n} people", importance=6,
                     slot="team_size")


def _pets(m: re.Match[str]) -> Candidate | None:
    ordinal = "ord" in m.re.groupindex
    n = n_of(m, "ord" if ordinal else "n")
    said = m.group("sp")
    plural = species(said) != said.lower() or said.lower() in ("fish", "goldfish", "mice")
    if n is None or not 0 < n < 50 or (not ordinal and (n > 1) != plural):
        return None
    word = species(said)
    return Candidate(f"Has {n} {word}" + ("" if n == 1 or word == "fish" else "s"),
                     importance=5, slot=f"pets:{word}")


def _company(m: re.Match[str]) -> Candidate | None:
    n = n_of(m)
    noun = (m.groupdict().get("noun") or "").lower()
    verb = (m.groupdict().get("verb") or "").lower()
    if n is None or n < 2:
        return None
    if not noun and not re.search(r"grew|grown|shrank|expanded|doubled|up to|down to|reached|"
                                  r"hit|crossed|passed|topped|surpassed", verb) and not \
            m.groupdict().get("what"):
        return None
    return Candidate(f"Company has {n} employees", importance=6, slot="company_size")


_COMPANY_CUE = re.compile(r"\b(?:company|startup|firm|business|employees|staff|hired|hiring|"
                          r"headcount|org|organi[sz]ation|agency)\b", re.I)


def _we_are_n(m: re.Match[str]) -> Candidate | None:
    n, noun = n_of(m), m.group("noun").lower()
    if n is None:
        return None
    if noun not in ("employees", "staff") and not _COMPANY_CUE.search(m.string) and not (
            n >= 20 and re.search(r"\b(?:now|already|grown|grew)\b", m.string, re.I)):
        return None
    return Candidate(f"Company has {n} employees", importance=6, slot="company_size")


_SPECIES_ONE = (r"(?:cat|kitten|dog|puppy|rabbit|bunny|hamster|guinea pig|parrot|budgie|bird|fish|"
                r"turtle|tortoise|snake|lizard|horse|chicken|hen|ferret|gerbil|rat)")


def _household(m: re.Match[str]) -> Candidate | None:
    """"we're a three-cat household now": the pets of a species."""
    n, word = n_of(m), species(m.group("sp"))
    if n is None or not 0 < n < 50:
        return None
    return Candidate(f"Has {n} {word}" + ("" if n == 1 or word == "fish" else "s"),
                     importance=5, slot=f"pets:{word}")


def _family(m: re.Match[str]) -> Candidate | None:
    """"we're a family of five now": the household's size (its children are not said)."""
    n = n_of(m)
    if n is None or not 1 < n < 20:
        return None
    return Candidate(f"Family of {n}", importance=6, slot="family_size")


def _reports(m: re.Match[str]) -> Candidate | None:
    """"I've got ten direct reports now": the user's team, as its size."""
    n = n_of(m)
    if n is None or not 0 < n < 10_000:
        return None
    return Candidate(f"Has {n} direct reports", importance=6, slot="team_size")


_ABOUT = r"(?:(?i:about|around|roughly|almost|nearly|over|just over|just under|more than) )?"
QUANTITIES = [
    Rule(re.compile(rf"\b(?i:have|'ve got|have got|got)(?: (?i:now|already|got))? "
                    rf"(?P<n>{EN_N}|(?i:a|one)) (?:(?i:little|young|small|beautiful|wonderful|"
                    rf"lovely|amazing|grown-up|grown) )?(?P<what>{_KID})\b(?!'| (?i:in|at|on) "
                    r"(?i:my|the|our) (?i:class|team|group|care|school))"), _have_kids),
    Rule(re.compile(rf"\b(?i:our|my) (?P<ord>(?i:{ORD}))(?: (?i:child|kid|baby|son|daughter|boy|"
                    r"girl|little one))?(?:,? [A-Z]\w+,?)? (?i:was born|arrived|is here|came|"
                    r"has arrived|just arrived|was delivered|is born)\b"),
         lambda m: children(n_of(m, "ord")), OWN),
    # "we had another baby last week, our third"
    Rule(re.compile(r"\b(?i:another|one more) (?:(?i:baby|child|kid|son|daughter|little one)"
                    r"(?: (?i:boy|girl))?|(?i:boy|girl))\b[^,;.]{0,30}?,? (?i:our|my) "
                    rf"(?P<ord>(?i:{ORD}))\b(?! (?i:grand\w*|niece|nephew|cousin|this|in|of)\b)"),
         lambda m: children(n_of(m, "ord")), OWN),
    Rule(re.compile(rf"\b(?i:had|welcomed|gave birth to|delivered)(?: (?i:our|my))? "
                    rf"(?P<ord>(?i:{ORD})) (?i:child|kid|baby|son|daughter|boy|girl)\b"),
         lambda m: children(n_of(m, "ord"))),
    Rule(re.compile(rf"(?:'m|\b(?i:am)) (?:(?i:now) )?(?:(?i:a) )?(?:(?i:proud|happy|busy|tired|"
                    rf"single) )?(?i:mom|mum|mother|dad|father|parent) (?i:of) (?P<n>{EN_N})\b"),
         lambda m: children(n_of(m))),
    Rule(re.compile(_BIRTH), lambda m: one_more_child(), ANY),
    Rule(re.compile(_HAD_BABY), lambda m: one_more_child(), ANY),
    Rule(re.compile(r"(?:我们家|我家|我们)?(?:宝宝|小宝贝|儿子|女儿|二宝|小家伙)(?:终于|顺利|已经)?"
                    r"(?:出生了|出生啦|降生了|诞生了|出世了)|(?:我|我们|老婆|太太|妻子)(?:刚|刚刚)?生了"
                    r"(?:个|一个)(?:儿子|女儿|宝宝|男孩|女孩)"),
         lambda m: one_more_child(zh=True), ANY),
    Rule(re.compile(rf"有了?(?P<n>{ZH_N})个(?:孩子|小孩|娃|宝宝|宝贝|子女|小朋友)"),
         lambda m: children(n_of(m), zh=True)),
    Rule(re.compile(rf"第(?P<n>{ZH_N})个(?:孩子|宝宝|娃|小孩|宝贝)(?:也)?(?:出生了|出生啦|降生了|"
                    r"诞生了|落地了|来了|出世了)"), lambda m: children(n_of(m), zh=True)),
    Rule(re.compile(r"(?:生了)?(?:(?P<n>[二三四五两])胎|老(?P<lao>[二三四五]))(?:也)?(?:出生了|出生啦|"
                    r"降生了|诞生了|落地了|来了|出世了|宝宝出生了)?"),
         lambda m: children(number(m.group("n") or m.group("lao")), zh=True)
         if re.search(r"生|来了|落地|出世", m.group(0)) else None),
    Rule(re.compile(r"\b(?P<whose>(?i:my|our|the)) (?i:team|group|department|squad|crew|unit)"
                    r"(?: (?i:at work))? "
                    r"(?:(?i:now|currently|just) )?(?i:has|is|grew to|has grown to|is up to|"
                    r"is down to|shrank to|went to|went up to|went down to|is now|now has|"
                    r"expanded to|doubled to|is at|counts|has become|got to|reached|is now at|"
                    rf"consists of)(?: (?i:now))? {_ABOUT}(?P<n>{EN_N})(?: (?i:people|members|"
                    r"engineers|folks|devs|developers|persons|staff|employees|designers|people "
                    r"strong))?(?= *(?:[,.;!?]|(?i:now)\b|(?i:these days)|(?i:and)\b|$))"),
         _team, OWN),
    Rule(re.compile(r"(?:'re|\b(?i:are)) (?:(?i:now|already) )?(?i:a|an) (?P<n>\d+)[- ](?i:person|"
                    r"people|strong) (?P<what>(?i:company|startup|firm|business|team))"),
         lambda m: _team(m) if m.group("what").lower() == "team" else _company(m)),
    Rule(re.compile(rf"\b(?i:manage|lead|run|head|am on|'m on|'re|are|work in|work on|now lead) "
                    rf"(?i:a team of) (?P<n>{EN_N})\b"), _team),
    Rule(re.compile(rf"\b(?i:have|'ve got|have got|got|now have)(?: (?i:now))? {_ABOUT}"
                    rf"(?P<n>{EN_N}) (?i:direct reports|people (?:reporting|who report) "
                    r"(?:directly )?to me)\b"),
         _reports),
    Rule(re.compile(rf"(?:^|[,;:]\s*|\b(?:and|so|now) )(?P<n>(?i:{EN_N})) (?i:people|engineers|"
                    r"developers|designers|folks) (?:(?i:now) )?(?i:report) (?:(?i:directly) )?"
                    r"(?i:to me)\b"), _reports, OWN),
    Rule(re.compile(r"\b(?i:manage|lead|oversee|supervise|'m managing|am managing|'m leading|"
                    rf"am leading|now manage|now lead)(?: (?i:now))? {_ABOUT}(?P<n>{EN_N}) "
                    r"(?i:people|engineers|developers|designers|analysts|nurses|staff|folks)\b"),
         _team),
    Rule(re.compile(rf"\b(?i:there are) (?:(?i:now) )?(?P<n>{EN_N}) (?i:of us) (?i:on|in) "
                    r"(?i:my|our|the) (?i:team)"), _team, OWN),
    Rule(re.compile(r"(?:团队|小组|部门|组里|团队里|组)(?:现在|目前|已经|又|也|一共|总共)*(?:有|扩(?:大|张|充)?"
                    r"到了?|增加到了?|增长到了?|壮大到了?|变成了?|缩(?:减|小)?(?:到|为|成)了?|减少到了?|"
                    rf"达到了?|发展到了?|(?<=现在|目前|一共|总共))(?:了)?(?P<n>{ZH_N})(?:多)?(?:个|名|位)?(?:人|成员|同事|员工|"
                    r"工程师)"), lambda m: _team(m, zh=True)),
    Rule(re.compile(rf"\b(?i:have|'ve got|have got|own)(?: (?i:now|already))? (?P<n>{EN_N}|"
                    rf"(?i:a|an|one)) (?P<sp>(?i:{SPECIES_EN}))\b(?! (?i:allerg|food|sitter|"
                    r"walker|bed|hair|person|lover|toy|tattoo|shelter|show))"), _pets),
    Rule(re.compile(r"\b(?i:got|adopted|rescued|brought home|have|welcomed)(?: (?i:a|our)) "
                    rf"(?P<ord>(?i:second|third|fourth|fifth)) (?P<sp>(?i:{SPECIES_EN}))\b"),
         _pets),
    Rule(re.compile(r"(?:'re|'m|\b(?i:are|am)) (?:(?i:now|officially|proudly|happily|a proud) )*"
                    rf"(?i:an?|the) (?P<n>{EN_N})[- ](?P<sp>(?i:{_SPECIES_ONE}))[- ]"
                    r"(?i:household|family|home|house)\b"), _household),
    Rule(re.compile(r"(?:'re|\b(?i:are)) (?:(?i:now|officially|finally|proudly|happily) )*(?i:a) "
                    rf"(?i:family|household) (?i:of) (?P<n>{EN_N})\b"), _family),
    Rule(re.compile(rf"(?:养了?|有)(?P<n>{ZH_N})(?P<mw>只|条|个|头|匹)(?P<sp>{SPECIES_ZH})"),
         lambda m: None if n_of(m) is None else Candidate(
             f"养{n_of(m)}{m.group('mw')}{m.group('sp')}", importance=5,
             slot=f"pets:{species(m.group('sp'))}")),
    Rule(re.compile(r"\b(?i:our|my) (?i:company|startup|firm|business|organi[sz]ation|org|agency|"
                    r"shop|studio)(?: (?i:now|currently|just))? (?P<verb>(?i:has|employs|grew to|"
                    r"crossed|passed|topped|surpassed|has "
                    r"grown to|is up to|is now at|is at|is now|reached|hit|now has|has reached|"
                    rf"shrank to|is down to|went to|went up to|doubled to|expanded to|is))(?: "
                    rf"(?i:now))? {_ABOUT}(?P<n>{EN_N})(?: (?P<noun>(?i:employees|people|staff|"
                    r"staffers|workers|FTEs|team members|engineers)))?\b"), _company, OWN),
    Rule(re.compile(r"(?:'re|\b(?i:are)) (?:(?i:now|already|currently|officially|almost|nearly|"
                    rf"about|around|over) )*(?P<n>{EN_N}) (?P<noun>(?i:people|employees|staff|"
                    r"strong|persons))\b"), _we_are_n),
    Rule(re.compile(rf"\b(?P<verb>(?i:employ|now employ|have|now have|'ve got|grew to|have grown "
                    rf"to|'ve grown to|expanded to|scaled to|doubled to|shrank to|are down to|"
                    rf"are up to))(?: (?i:now))? {_ABOUT}(?P<n>{EN_N}) (?P<noun>(?i:employees|"
                    r"staff|staffers|FTEs|full-time employees|people))\b"),
         lambda m: _company(m) if m.group("noun").lower() != "people"
         or re.search(r"\bto$|employ", m.group("verb")) else None),
    Rule(re.compile(r"公司(?:现在|目前|已经|也|一共|总共)*(?:有|扩张到了?|扩大到了?|增长到了?|发展到了?|"
                    rf"缩减到了?|裁到了?|达到了?|壮大到了?)(?:了)?(?P<n>{ZH_N})(?:多)?(?:名|个|位)?"
                    r"(?:员工|人|雇员)"),
         lambda m: None if n_of(m) is None else Candidate(f"公司有{n_of(m)}名员工", importance=6,
                                                       slot="company_size")),
    Rule(re.compile(rf"有(?P<n>{ZH_N})(?:多)?(?:名|位)(?:员工|雇员)"),
         lambda m: None if n_of(m) is None else Candidate(f"公司有{n_of(m)}名员工", importance=6,
                                                       slot="company_size")),
]
