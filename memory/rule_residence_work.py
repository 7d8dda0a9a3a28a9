"""Where the user lives and works, for the offline rules model (:mod:`memory.rules`):
"we finally moved to Porto", 我现在住在成都 -> ``residence``; "I joined Initech", 我跳槽到字节跳动了
-> ``employer``."""

from __future__ import annotations

import re

from memstream.memory.decisions import Candidate
from memstream.memory.rule_tools import tool
from memstream.memory.rule_words import CJK, END, ME, OWN, WEEKDAY_EN, Rule, clean

NOT_PLACE_ZH = frozenset({"新家", "新房", "新房子", "新公寓", "这里", "那里", "这边", "那边",
                          "附近", "郊区", "市区", "城里", "乡下", "老家", "国外", "外地", "一起",
                          "家里", "宿舍", "公司", "隔壁", "楼下", "楼上", "对面", "别处"})
NOT_ORG_ZH = frozenset({"家", "家里", "公司", "单位", "这里", "那里", "这边", "那边", "外地",
                        "国外", "海外", "本地", "附近", "新公司", "大厂", "外企", "国企",
                        "创业公司", "初创公司", "家附近", "同一家公司", "这家公司", "那家公司",
                        "总部", "办公室", "公司里", "银行", "学校", "医院"})


# --- residence -------------------------------------------------------------------------
_PLACE = (r"(?P<city>(?:the )?[A-Z][\w'-]*(?:(?: (?:de|da|do|del|di|la|le|am|of|upon|sur|van|"
          r"von))? (?!I\b)[A-Z][\w'-]*)*)")
_NOT_NAME = re.compile(rf"(?:{WEEKDAY_EN}s?|January|February|March|April|May|June|July|August|"
                       r"September|October|November|December|I|I'm|Christmas|Easter|Home|The)$")
_ZPLACE = r"(?P<city>[A-Za-z][A-Za-z .'-]*[A-Za-z]|[\u4e00-\u9fff]{2,10}?)"
_ZPLACE_END = (r"(?=了|去了?|来了?|啦|呀|啊|住|生活|定居|工作|上班|的|这边|那边|那里|这里|快|"
               r"已经|有|"
               r"[一二三四五六七八九十两半几\d]|[，。！；,.!？?～~、\s]|$)")


_DAY_FIRST = re.compile(rf"(?:the )?{WEEKDAY_EN}s?\b")


def _lives(m: re.Match[str]) -> Candidate | None:
    city = clean(m.group("city"))
    if _NOT_NAME.match(city.removeprefix("the ")) or _DAY_FIRST.match(city) or tool(city) or \
            re.match(r"\s+as an?\b", m.string[m.end():]):
        return None  # "moved to the Saturday group", "moved to Arch"
    return Candidate(f"Lives in {city}", importance=7, slot="residence")


def _lives_zh(m: re.Match[str]) -> Candidate | None:
    city = m.group("city").strip()
    if city in NOT_PLACE_ZH or city[0] in "一这那新某个" or (CJK.search(city) is None and \
            _NOT_NAME.match(city)):
        return None
    return Candidate(f"住在{city}", importance=7, slot="residence")


def _this_time_zh(m: re.Match[str]) -> Candidate | None:
    """"又搬家了，这次是青岛": not "这次是第三次", "这次是我爸妈家附近", "这次是真的搬家"."""
    city = m.group("city")
    if city[0] in "第我你他她它咱真终又也还要" or "搬" in city:
        return None
    return _lives_zh(m)


# a move the user made, the cue of "this time it's Lyon" and of "we're in Denver now"
_MOVED = re.compile(r"\b(?:moved|moving|relocated|relocating|emigrated|packed up|made the (?:big )?"
                    r"move)\b(?! (?:my|the|our|it|them|that|this|a|an|his|her)\b)|"
                    r"搬家|搬了|搬走|又搬|搬到|搬去|搬过来", re.I)
_MOVE_WORD = re.compile(r"\b(?:moved|move|moving|relocat(?:ed|ing|ion|e)|emigrat(?:ed|ing|ion)|"
                        r"transfer(?:red)?|packed up|movers|new (?:flat|apartment|house|home|"
                        r"place))\b(?! (?:my|the|our|it|them|that|this|his|her)\b)", re.I)


RESIDENCE = [
    Rule(re.compile(r"\b(?i:moved|relocated|emigrated|immigrated|made the (?:big )?move)"
                    r"(?: (?i:back|over|out|away|abroad|here|there|permanently|for good|house|"
                    r"home|again|once again|all the way|across the (?:country|world|pond)))*"
                    r"(?: (?i:from) (?P<old>[\w .'-]{1,60}?))? (?i:to|into) "
                    r"(?:(?i:a|an|our|my|the) "
                    r"(?:(?i:new|own|little|first|tiny|lovely) )?(?i:flat|apartment|house|place|"
                    r"home|condo|studio) (?i:in) )?" + _PLACE), _lives),
    Rule(re.compile(r"\b(?i:live|living|reside|residing|based|settled|settled down|put down "
                    r"roots|made (?:our|my) home)(?: (?i:now|permanently|full-time|here))? "
                    r"(?i:in) " + _PLACE), _lives),
    Rule(re.compile(r"\b(?i:my|our) (?:(?i:new) )?(?i:home|place|flat|apartment|house|address) "
                    r"(?i:is) (?:(?i:now) )?(?:(?i:in) )?" + _PLACE), _lives, OWN),
    Rule(re.compile(r"搬(?:家)?(?:到|去|来|回到?|回了)了?" + _ZPLACE + _ZPLACE_END), _lives_zh),
    Rule(re.compile(r"(?:住在|住到了?|定居在|定居于|定居到|安家在|落户(?:在|到)?|移居(?:到|至)?|常住)"
                    + _ZPLACE + _ZPLACE_END), _lives_zh),
    Rule(re.compile(r"在" + _ZPLACE + r"(?:定居|安家|落户|扎根|买房定居|生活|居住)"), _lives_zh),
    # after a move of the user's: "We moved again, this time to Lyon", 又搬家了！这次是青岛
    Rule(re.compile(r"\b(?i:this time)(?: (?i:round|around))?,? (?:(?i:it's|it is|it was|to|"
                    r"we're in|we are in|i'm in|i am in|we went to|we chose|we picked|we ended "
                    r"up in|we landed in) )(?:(?i:a|an|our|my|the) (?:(?i:new|little) )?"
                    r"(?i:flat|apartment|house|place|home) (?i:in) )?" + _PLACE), _lives, OWN,
         cue=_MOVED, cue_who=ME),
    Rule(re.compile(r"这次(?:是(?:搬(?:到|去|来)了?|在|去了?|到了?)?|选了|定在|换成了?|"
                    r"搬(?:到|去|来)了?|去了?|到了?|来了?)" + _ZPLACE + _ZPLACE_END),
         _this_time_zh, OWN, cue=_MOVED, cue_who=ME),
    # "we're in Denver since the start of the month", only after a move word
    Rule(re.compile(r"(?:'re|'m|\b(?i:are|am)) (?:(?i:now|finally|all|officially|happily|both|"
                    r"properly|fully|permanently) )*(?:(?i:over|out|up|down) )?(?i:in) " + _PLACE
                    + r"(?! (?i:for|on a|on business|visiting)\b)"), _lives, cue=_MOVE_WORD),
]

# --- employer --------------------------------------------------------------------------
_ORG = (r"(?P<org>(?:the )?(?:[A-Z]|\d+[A-Za-z])[\w&.'-]*(?:(?: (?:of|for|and|&|de))? (?!I\b)"
        r"[A-Z0-9&][\w&.'-]*)*)")
_ROLE = r"(?: (?i:as) (?:(?i:a|an|the) )?(?P<role>[\w -]{1,60}?)" + END + ")?"
_JOB_WORD = (r"(?i:engineer|developer|programmer|manager|designer|analyst|scientist|consultant|"
             r"lead|director|intern|teacher|nurse|doctor|researcher|architect|officer|specialist|"
             r"administrator|accountant|lawyer|writer|editor|marketer|recruiter|cto|ceo|cfo|coo|"
             r"vp|founder|co-founder|owner|head of [\w ]+|product owner|salesperson|"
             r"technician|professor|lecturer|pharmacist|chef|associate|partner)s?")
_JOB_CUE = re.compile(r"\b(?:job|work|role|position|team|company|employer|hired|joined|left|"
                      r"quit|resigned|engineer|"
                      r"developer|designer|manager|analyst|consultant|colleagues?|office|startup|"
                      r"firm|salary|boss)\b", re.I)
_CORP = re.compile(r"\b(?:Inc|Corp|Corporation|Ltd|GmbH|Labs?|Technologies|Tech|Systems|Group|"
                   r"AG|LLC|Software|Bank|Consulting|Studios?)\b")
_ZORG = r"(?!在)(?P<org>[A-Za-z][\w&.\- ]*[\w&]|[A-Za-z]|[\u4e00-\u9fffA-Za-z0-9&]{2,12}?)"
_ZORG_END = (r"(?=了|啦|上班|工作|当|做|担任|实习|(?:的)?第[一二三四五六七八九十\d]+(?:天|周)|"
             r"[，。！；,.!？?～~、]|$)")


def _works(m: re.Match[str], need_cue: bool = False, org: str | None = None) -> Candidate | None:
    org = clean(m.group("org") if org is None else org)
    role = m.groupdict().get("role")
    if not org or _NOT_NAME.match(org) or org.endswith("'s"):
        return None
    # a product ("joined Slack", "started with Python") is an employer only said as one
    made = tool(org)
    if made is not None and made[1] not in ("search", "phone", "computer"):
        need_cue = need_cue or not re.search(r"\b(?:work|working|job|role|position|gig|"
                                             r"internship|hired|recruited|employed|offer)\b",
                                             m.group(0), re.I)
    around = m.string[: m.start()] + " " + m.string[m.end():]
    if need_cue and not (role or _JOB_CUE.search(around) or _CORP.search(org)):
        return None
    return Candidate(f"Works at {org}" + (f" as {clean(role)}" if role else ""), importance=6,
                     slot="employer")


# "my first day at X": not a school, a holiday, or a memory of long ago
_NOT_EMPLOYER = re.compile(r"(?:University|College|School|High|Academy|Uni|Kindergarten|"
                           r"Nursery|Camp|Festival|Fest|Conference|Con|Park|Land|land|World|"
                           r"world|Beach|Resort|Hotel|Airport|Gym|Club|Harvard|Oxford|Cambridge|"
                           r"Stanford|MIT|Yale|Princeton|Berkeley)\b")
_LOOKING_BACK = re.compile(r"\b(?:remember|back in|years ago|reminds? me|anniversary|like my "
                           r"first|used to)\b", re.I)
# an offer "I took" is a job, not a friend's offer of a sofa, a lift or help
_NOT_JOB_OFFER = re.compile(r"\b(?:car|house|flat|apartment|sofa|couch|bike|price|deal|discount|"
                            r"lift|ride|drink|tea|coffee|help|trade|swap|bid|rent|seat|room)\b|"
                            r"\boffer (?:to|of|on|for)\b", re.I)


def _near(m: re.Match[str], reach: int = 120) -> str:
    """The words around a match (a run-on paste costs no more per match than a sentence)."""
    return m.string[max(0, m.start() - reach): m.end() + reach]


def _first_day(m: re.Match[str]) -> Candidate | None:
    if _NOT_EMPLOYER.search(m.group("org")) or _LOOKING_BACK.search(_near(m)):
        return None
    return _works(m)


# words that open a sentence, capitalised, before the name of an employer
_OPENER = re.compile(r"(?:When|Then|So|And|But|After|Once|Finally|Eventually|Today|Yesterday|"
                     r"Luckily|Thankfully|Well|Anyway|Actually|Basically|Now|Because|Since) ")
_NOT_ORG = re.compile(r"(?:He|She|They|It|We|You|This|That|My|Our|His|Her|Their|Someone|"
                      r"Somebody|Everyone|Nobody|Mom|Mum|Dad)$")


def _offer_taken(m: re.Match[str]) -> Candidate | None:
    org = m.group("org")
    while (opener := _OPENER.match(org)) is not None:
        org = org[opener.end():]
    if _NOT_ORG.match(org) or _NOT_JOB_OFFER.search(_near(m)):
        return None
    return _works(m, org=org)


_HESITATE_ZH = re.compile(r"考虑|纠结|犹豫|要不要|还没|拒|不去|没去|去不去|选哪|还是|几家|两家|"
                          r"好几|多个|谈薪|等等")


def _offer_zh(m: re.Match[str]) -> Candidate | None:
    """"我拿到了字节的offer": the job, unless the user is still choosing."""
    if re.search(r"[和跟、与]", m.group("org")) or _HESITATE_ZH.search(m.string):
        return None
    return _works_zh(m)


def _works_zh(m: re.Match[str]) -> Candidate | None:
    org = m.group("org").strip()
    if org in NOT_ORG_ZH or re.match(r"[一这那某]|.*(?:一家|一个)", org):
        return None
    return Candidate(f"在{org}工作", importance=6, slot="employer")


EMPLOYER = [
    Rule(re.compile(r"\b(?i:work(?:ing)?)(?: (?i:remotely|full-time|part-time|now|currently))? "
                    r"(?i:at|for) (?:(?i:a|an) [\w -]{1,30}? (?i:called|named) )?" + _ORG + _ROLE),
         _works),
    Rule(re.compile(r"\b(?i:work(?:ing)?) (?i:as) (?:(?i:a|an|the) )?(?P<role>[\w -]{1,40}?) "
                    r"(?i:at|for|with) " + _ORG), _works),
    Rule(re.compile(r"(?:'m|\b(?i:am)) (?:(?i:now|currently) )?(?i:a|an|the) (?P<role>[\w -]{0,30}?"
                    r"\b" + _JOB_WORD + r") (?i:at|for|with) " + _ORG),
         _works),
    Rule(re.compile(r"\b(?i:started|began|start)(?: (?i:a|my|the) (?:(?i:new|first|dream|"
                    r"full-time|part-time) )?(?i:job|role|position|gig|internship)| "
                    r"(?i:working|work))? (?i:at|with|for) " + _ORG + _ROLE), _works),
    Rule(re.compile(r"\b(?i:got|landed|took|accepted|found|scored|secured|have|'ve got)"
                    r"(?: (?i:a|an|the|my))?(?: (?i:new|dream|full-time|part-time|permanent|"
                    r"great))? (?i:job|role|position|gig|offer) (?i:at|with|from) "
                    + _ORG + _ROLE), _works),
    Rule(re.compile(r"\b(?i:joined|signed (?:on )?with) (?:(?i:the team at) )?" + _ORG + _ROLE),
         _works),
    Rule(re.compile(r"\b(?:(?i:got|was|been|just got) )?(?i:hired|recruited|poached|headhunted|"
                    r"taken on) (?i:by|at) " + _ORG + _ROLE), _works),
    Rule(re.compile(r"\b(?i:employed) (?i:at|by) " + _ORG + _ROLE), _works),
    Rule(re.compile(r"(?:'m|\b(?i:am)) (?:(?i:now|currently) )?(?i:at|with) " + _ORG + _ROLE),
         lambda m: _works(m, need_cue=True)),
    Rule(re.compile(r"\b(?i:my) (?:(?i:new|current) )?(?i:job|employer|company|workplace) "
                    r"(?i:is) (?:(?i:now) )?(?:(?i:at|with) )?" + _ORG + _ROLE), _works, OWN),
    Rule(re.compile(r"\b(?i:switched|changed|moved) (?i:jobs|companies|employers) (?i:to) "
                    + _ORG + _ROLE), _works),
    # "Today was my first day at Contoso"
    Rule(re.compile(r"\b(?i:my) (?i:first) (?i:day|week|shift|morning)(?: (?i:of work|on the job|"
                    r"back at work))? (?i:at|with) " + _ORG + _ROLE), _first_day, OWN),
    # "when Fabrikam made me an offer I took it", "Globex offered me the job and I accepted"
    Rule(re.compile(_ORG + r" (?i:made|gave|sent|offered) (?i:me) (?:(?i:an|a|the|their) )?"
                    r"(?:(?i:job|final|formal|great|good|amazing|generous|serious|full-time|"
                    r"permanent) )*(?P<what>(?i:offer|job|role|position|contract)),? "
                    r"(?:(?i:and|so) )?(?:I|i) (?:(?i:just|finally|happily|gladly|immediately) )?"
                    r"(?i:took it|took them up on it|accepted|said yes|signed|jumped at it)\b"),
         _offer_taken, OWN),
    Rule(re.compile(r"\b(?i:accepted|took|signed) (?P<org>(?:[A-Z]|\d+[A-Za-z])[\w&.-]*"
                    r"(?: [A-Z0-9&][\w&.-]*)*)'s (?:(?i:job|final|formal) )?(?i:offer|contract)"),
         _offer_taken),
    Rule(re.compile(r"在" + _ZORG + r"(?:上班|工作|任职|就职|供职|"
                    r"(?:做|当|担任)(?=[\u4e00-\u9fffA-Za-z]{2,}))"),
         _works_zh),
    Rule(re.compile(r"跳槽(?:到|去|进)了?" + _ZORG + _ZORG_END), _works_zh),
    Rule(re.compile(r"入职了?" + _ZORG + _ZORG_END), _works_zh),
    Rule(re.compile(r"加入了?(?P<org>[\u4e00-\u9fffA-Za-z0-9&]{1,10}(?:集团|公司|科技|网络|银行|证券|"
                    r"资本|实验室|工作室))"), _works_zh),
    Rule(re.compile(r"(?:去|到|进)了?" + _ZORG + r"(?:上班|工作|任职)"), _works_zh),
    # 拿到了字节的offer, 接了腾讯的offer
    Rule(re.compile(r"(?:拿到|拿下|接了|接受了|签了)了?(?P<org>[A-Za-z][\w&.\-]*|"
                    r"[\u4e00-\u9fffA-Za-z0-9&]{2,12}?)的(?i:offer|录用通知书?)"), _offer_zh),
]
