"""The knowledge-update benchmark's stories (SPEC §9d): their file format, the loader, the
checks a story file must pass, how a value's surface forms are matched in text, and the
events a chat service would produce for a story (``benchmarks/updates.py`` runs them,
:mod:`memstream.dev.updates_score` scores the answers, :mod:`memstream.dev.updates_run`
drives the pipeline).

A story is one user: sessions weeks apart, each with its own (historical) time, ended by a
session-end event, then one question. An ``update`` story states a fact, chats about
other things, says the fact changed (often without naming the old value), chats once
more, and asks; a ``chain`` changes it twice or more (A -> B -> C); a ``control`` states
it and never changes it (someone else's change, talk about the subject, a restatement).

File format (JSON, UTF-8; ``benchmarks/data/updates_stories.json`` is the shipped set, a
held-out set in the same format runs the same way)::

    {
     "schema": "memstream.updates/1",
     "about": "...",                                  # optional, free text
     "defaults": {"k": 5, "budget_chars": 1500},       # of the context call, per story
     "filler": {                                      # sessions shared by name
      "eggs": {"lang": "en", "turns": [["user", "How long should I boil an egg?"],
                                       ["assistant", "About six minutes..."]]}},
     "stories": [{
      "id": "en-res-porto",              # the user id too: [A-Za-z0-9][A-Za-z0-9._:@+=-]*
      "lang": "en",                      # en | zh
      "category": "residence",           # free text; the shipped set uses CATEGORIES
      "kind": "update",                  # update | chain | control
      "question": "Where does the user live?",
      "asked": "2026-04-06T10:00:00Z",   # when the question is asked (after every session)
      "current": ["Porto"],              # accepted surface forms of the current value
      "stale": ["Lisbon"],               # forms of every superseded value ([] for controls)
      "distractors": ["Vancouver"],      # optional: values of someone else, or not taken
      "k": 5, "budget_chars": 1500,      # optional: override the defaults
      "sessions": [                      # in time order
       {"at": "2026-01-03T08:00:00Z", "part": "state",
        "turns": [["user", "I live in Lisbon."], ["assistant", "Nice!"]]},
       {"at": "2026-01-20T15:07:00Z", "filler": "eggs"},
       {"at": "2026-02-04T09:20:00Z", "part": "change", "turns": [["user", "..."]]}]}]}

A session's ``part`` is ``state`` (the fact is first said), ``change`` (it changed),
``talk`` (about the subject, nothing changes) or, for a pool reference, ``filler``.

Surface forms are matched case-insensitively: as whole words where they start or end with
a Latin letter or digit (``3 kids`` never matches inside ``13 kids``, nor a number
inside a date, a time or a decimal: ``2026-03-01``, ``10:30``, ``3.2``), as plain
substrings where they are CJK (``杭州``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from functools import lru_cache
from itertools import pairwise
from pathlib import Path
from typing import Any

from memstream.topics.schemas import ChatMessage, Role, SessionEvent

SCHEMA = "memstream.updates/1"
KINDS = ("update", "chain", "control")
LANGS = ("en", "zh")
PARTS = ("state", "change", "talk", "filler")
CATEGORIES = ("residence", "employer", "tools", "preferences", "quantities", "relationships",
              "schedules")
ROLES = ("user", "assistant")
DEFAULTS = {"k": 5, "budget_chars": 1500}
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+=-]{0,63}")
_LATIN = "A-Za-z0-9\u00c0-\u024f"  # a form's Latin end must not touch another such character


class StoryError(ValueError):
    """A story file that does not follow the format."""


# --- surface forms ------------------------------------------------------------------------


@lru_cache(maxsize=4096)
def form_pattern(form: str) -> re.Pattern[str]:
    """``form`` as a case-insensitive pattern: whole word at a Latin end, plain at a CJK one."""
    head = f"(?<![{_LATIN}])" if re.match(f"[{_LATIN}]", form) else ""
    tail = f"(?![{_LATIN}])" if re.search(f"[{_LATIN}]$", form) else ""
    if form[:1].isdigit():  # not the end of a date, a time or a decimal: 2026-03, 10:30
        head += r"(?<!\d[-/.:])"
    if form[-1:].isdigit():
        tail += r"(?![-/.:]\d)"
    return re.compile(head + re.escape(form) + tail, re.IGNORECASE)


def mentions(text: str, forms: Iterable[str]) -> bool:
    """Whether ``text`` holds any of ``forms``."""
    return any(form_pattern(f).search(text) for f in forms if f)


# --- the stories ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Session:
    at: datetime
    part: str  # state | change | talk | filler
    turns: tuple[tuple[str, str], ...]  # (role, text)
    filler: str | None = None  # the pool's name, for a filler session

    def id(self, n: int) -> str:
        """The session id produced for the ``n``-th session (its part readable in it)."""
        return f"s{n}-{self.part}" + (f"-{self.filler}" if self.filler else "")


@dataclass(frozen=True)
class Story:
    id: str
    lang: str
    category: str
    kind: str
    question: str
    asked: datetime
    current: tuple[str, ...]
    stale: tuple[str, ...]
    sessions: tuple[Session, ...]
    distractors: tuple[str, ...] = ()
    k: int = DEFAULTS["k"]
    budget_chars: int = DEFAULTS["budget_chars"]

    def turns(self, filler: bool) -> list[str]:
        """The texts of the filler sessions' turns (``filler``), or of the others."""
        return [text for s in self.sessions if (s.part == "filler") == filler
                for _, text in s.turns]

    @property
    def changes(self) -> list[Session]:
        return [s for s in self.sessions if s.part == "change"]


def _time(value: Any, where: str) -> datetime:
    try:
        at = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError as exc:
        raise StoryError(f"{where}: {value!r} is not an ISO 8601 time") from exc
    if at.tzinfo is None:
        raise StoryError(f"{where}: {value!r} has no time zone")
    return at


def _turns(value: Any, where: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, list) or not value:
        raise StoryError(f"{where}: turns must be a non-empty list of [role, text]")
    out = []
    for t in value:
        if (not isinstance(t, list) or len(t) != 2 or t[0] not in ROLES
                or not isinstance(t[1], str) or not t[1].strip()):
            raise StoryError(f"{where}: a turn must be [\"user\"|\"assistant\", text]: {t!r}")
        out.append((t[0], t[1]))
    return tuple(out)


def _forms(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(f, str) and f.strip() for f in value):
        raise StoryError(f"{where}: a list of non-empty strings")
    return tuple(value)


def parse(data: Any) -> list[Story]:
    """The stories of a parsed story file, their filler sessions resolved from the pool."""
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise StoryError(f"not a story file: its \"schema\" must be {SCHEMA!r}")
    defaults = {**DEFAULTS, **(data.get("defaults") or {})}
    pool = {name: _turns(f.get("turns"), f"filler {name}")
            for name, f in (data.get("filler") or {}).items()}
    stories = []
    for raw in data.get("stories") or []:
        where = f"story {raw.get('id')!r}"
        missing = [k for k in ("id", "lang", "category", "kind", "question", "asked",
                               "current", "stale", "sessions") if k not in raw]
        if missing:
            raise StoryError(f"{where}: missing {missing}")
        sessions = []
        for n, s in enumerate(raw["sessions"]):
            at = _time(s.get("at"), f"{where} session {n}")
            if "filler" in s:
                if s["filler"] not in pool:
                    raise StoryError(f"{where} session {n}: no filler {s['filler']!r}")
                sessions.append(Session(at, "filler", pool[s["filler"]], s["filler"]))
            elif s.get("part") in ("state", "change", "talk"):
                sessions.append(Session(at, s["part"], _turns(s.get("turns"),
                                                              f"{where} session {n}")))
            else:
                raise StoryError(f"{where} session {n}: part must be state, change or talk "
                                 "(or a \"filler\" name)")
        stories.append(Story(
            id=str(raw["id"]), lang=str(raw["lang"]), category=str(raw["category"]),
            kind=str(raw["kind"]), question=str(raw["question"]),
            asked=_time(raw["asked"], f"{where} asked"),
            current=_forms(raw["current"], f"{where} current"),
            stale=_forms(raw["stale"], f"{where} stale"),
            distractors=_forms(raw.get("distractors", []), f"{where} distractors"),
            sessions=tuple(sessions), k=int(raw.get("k", defaults["k"])),
            budget_chars=int(raw.get("budget_chars", defaults["budget_chars"]))))
    return stories


def load(path: Path, ids: Sequence[str] | None = None) -> list[Story]:
    """The stories of ``path`` (``ids``: only those, in the file's order); raises
    :class:`StoryError` on a malformed file or a story that fails :func:`problems`."""
    stories = parse(json.loads(Path(path).read_text("utf-8")))
    found = problems(stories)
    if found:
        raise StoryError(f"{path}: " + "; ".join(found[:10]))
    if ids is not None:
        unknown = sorted(set(ids) - {s.id for s in stories})
        if unknown:
            raise StoryError(f"{path}: no stories {unknown}")
        stories = [s for s in stories if s.id in set(ids)]
    return stories


def problems(stories: Sequence[Story]) -> list[str]:
    """What is wrong with a story set: ids, kinds, time order, and the values' places (the
    first session states the first value, the last change states the current one, filler
    never names a value of the story). Empty: a valid set."""
    out: list[str] = []
    seen: set[str] = set()
    for s in stories:
        def bad(what: str, s: Story = s) -> None:
            out.append(f"{s.id}: {what}")

        if not _ID.fullmatch(s.id):
            bad("the id is not a valid user id")
        if s.id in seen:
            bad("the id is used twice")
        seen.add(s.id)
        if s.kind not in KINDS:
            bad(f"kind {s.kind!r} is not one of {KINDS}")
        if s.lang not in LANGS:
            bad(f"lang {s.lang!r} is not one of {LANGS}")
        if not s.current:
            bad("no current form")
        if (s.kind == "control") != (not s.stale):
            bad("a control has no stale forms, an update or chain has some")
        if s.k < 1 or s.budget_chars < 1:
            bad("k and budget_chars must be positive")
        both = [f for f in s.current if mentions(f, s.stale) or mentions(f, s.distractors)]
        if both:
            bad(f"current forms {both} match a stale or distractor form")
        times = [x.at for x in s.sessions]
        if any(b <= a for a, b in pairwise(times)):
            bad("sessions are not in time order")
        if not times or s.asked <= times[-1]:
            bad("the question is not asked after the last session")
        wanted = {"update": (1, 1), "chain": (2, 99), "control": (0, 0)}.get(s.kind, (0, 99))
        if not wanted[0] <= len(s.changes) <= wanted[1]:
            bad(f"{len(s.changes)} change sessions for a {s.kind}")
        if not s.sessions or s.sessions[0].part != "state":
            bad("the first session is not the statement")
            continue
        first = " ".join(t for _, t in s.sessions[0].turns)
        if not mentions(first, s.current if s.kind == "control" else s.stale):
            bad("the first session does not state the first value")
        if s.kind != "control":
            if mentions(first, s.current):
                bad("the first session already names the current value")
            last = " ".join(t for _, t in s.changes[-1].turns) if s.changes else ""
            if not mentions(last, s.current):
                bad("the last change does not name the current value")
        for x in s.sessions:
            if x.part == "filler" and mentions(" ".join(t for _, t in x.turns),
                                               (*s.current, *s.stale, *s.distractors)):
                bad(f"filler {x.filler!r} names a value of the story")
    return out


def shorten(story: Story, turns: int = 2) -> Story:
    """``story`` with each filler session cut to its first ``turns`` turns (the smoke)."""
    return replace(story, sessions=tuple(
        replace(x, turns=x.turns[:turns]) if x.part == "filler" else x for x in story.sessions))


def events(story: Story, tenant: str, gap_s: float = 40.0,
           ) -> list[ChatMessage | SessionEvent]:
    """What a chat service would produce for ``story``: each session's turns ``gap_s``
    apart from its time, then its end; the user id is the story's id."""
    out: list[ChatMessage | SessionEvent] = []
    for n, session in enumerate(story.sessions):
        sid = session.id(n)
        at = session.at
        for m, (role, text) in enumerate(session.turns):
            at = session.at + timedelta(seconds=gap_s * m)
            out.append(ChatMessage(tenant_id=tenant, user_id=story.id, session_id=sid,
                                   message_id=f"{sid}-m{m}", role=Role(role), content=text,
                                   ts=at))
        out.append(SessionEvent(tenant_id=tenant, user_id=story.id, session_id=sid,
                                ts=at + timedelta(seconds=gap_s)))
    return out
