"""What is true now (SPEC §9d), pure over the store protocol: which of the archived turns a
retrieval returns state something that stopped being true, what replaced it and when.

A turn *states* a memory version when the turn's message is in the version's lineage
(``source.message_ids``): the message that stated it where the model says which (the rules
model does), else the job's messages, of which only the turns that say what the version
says count (:func:`states`). A stated version that is not live any more makes the turn
stale:

- **superseded**: a later version (an UPDATE), a contradiction kept newest by the
  consolidation (``extra.superseded_by``) or a late fact kept as history (``extra.history_of``)
  holds another value now. The live successor is what the agent must be told instead; the
  date is the event time of the statement that replaced it. A later version that says the
  same (a decay's down-weight, a merge into a duplicate: ``extra.merged_into``) replaces
  nothing, and a value that came back (Lyon -> Porto -> Lyon) is true again.
- **deleted**: retracted ("I no longer use mocks") or undone, with no successor. A memory
  the user or an operator deleted (lineage kind ``deletion``) hides its turns altogether
  (:attr:`Truth.hidden`), as the memory is never returned (SPEC §5).
- **expired**: its time to live passed.

Archived (decayed) memories are still true: their turns are not stale.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from memstream.memory import lexical
from memstream.memory.archive import Turn
from memstream.memory.model import Memory, Status
from memstream.memory.store import MemoryStore, Scope

Stale = Literal["superseded", "deleted", "expired"]
LINKS = ("superseded_by", "history_of", "merged_into")  # another memory holds the value now
MAX_ROUNDS = 3  # links followed from memory to memory (a chain of consolidations)
WIDE = 2  # a lineage of more messages states a turn only where their words agree
SAYS_SAME = 0.5  # ... at least this share of the version's terms is in the turn


@dataclass(frozen=True)
class Replaced:
    """What a turn stated that is no longer true, and what holds now."""

    kind: Stale
    stated: Memory  # the version the turn stated
    at: float | None  # when it stopped being true (the replacing statement's event time)
    current: Memory | None = None  # the live version that holds the value now
    direct: bool = True  # ``current`` replaced ``stated`` itself, no version between


@dataclass(frozen=True)
class Truth:
    """What the store says of a retrieval's turns."""

    replaced: dict[str, Replaced] = field(default_factory=dict)  # turn id -> its stale claim
    hidden: frozenset[str] = frozenset()  # turn ids: their statement was deleted by a person
    states_live: dict[str, frozenset[str]] = field(default_factory=dict)  # turn id -> memory ids


def norm(text: str) -> str:
    return re.sub(r"\W+", " ", text.lower()).strip()


def states(version: Memory, message_id: str, text: str, ts: float) -> bool:
    """Whether a turn (its message, text and event time) states ``version``: its message is
    in the lineage, and the lineage is narrow (the stating message and at most its context),
    or names this turn by its event time, or the turn holds most of the version's words."""
    ids = version.source.message_ids
    if message_id not in ids:
        return False
    if len(ids) <= WIDE or version.source.event_ts == ts:
        return True
    wanted = set(lexical.terms(version.content))
    return bool(wanted) and len(wanted & set(lexical.terms(text))) >= SAYS_SAME * len(wanted)


def _chains(versions: Iterable[Memory]) -> dict[str, list[Memory]]:
    chains: dict[str, list[Memory]] = {}
    for v in versions:
        chains.setdefault(v.memory_id, []).append(v)
    for chain in chains.values():
        chain.sort(key=lambda v: v.version)
    return chains


def _expired(v: Memory, now: float) -> bool:
    return v.expires_at is not None and v.expires_at <= now


def _ended(last: Memory, stated: Memory, now: float) -> Replaced | None:
    """A chain that holds nothing live: how it ended."""
    if last.status == Status.DELETED and not last.extra.get("merged_into"):
        if last.expires_at is not None and (last.valid_to or now) >= last.expires_at:
            return Replaced("expired", stated, last.expires_at)
        return Replaced("deleted", stated, last.extra.get("closed_ts") or last.valid_to)
    if last.status == Status.ACTIVE and _expired(last, now):
        return Replaced("expired", stated, last.expires_at)
    return None


def resolve(v: Memory, chains: dict[str, list[Memory]], now: float,
            seen: frozenset[str] = frozenset()) -> Replaced | None:
    """Whether version ``v`` is no longer true (None: it is, or nothing says otherwise)."""
    chain = chains.get(v.memory_id, [v])
    later = [x for x in chain if x.version > v.version]
    link = next(((k, str(x.extra[k])) for x in [v, *later] for k in LINKS
                 if x.extra.get(k) and x.status == Status.SUPERSEDED), None)
    if link is not None and link[1] not in seen and link[1] in chains:
        kind, other = link
        if kind == "merged_into":  # the same fact, held by a duplicate now
            return None
        live = [x for x in chains[other] if x.live]
        if not live:
            return _ended(chains[other][-1], v, now) if chains[other] else None
        current = live[-1]
        if norm(current.content) == norm(v.content):
            return None
        if _expired(current, now):
            return Replaced("expired", v, current.expires_at)
        return Replaced("superseded", v, current.stated_ts or current.valid_from, current)
    if v.live and not later:
        return Replaced("expired", v, v.expires_at) if _expired(v, now) else None
    if v.status == Status.ARCHIVED and not later:
        return None
    live = [x for x in [v, *later] if x.live]
    if not live:
        return _ended(([v, *later])[-1], v, now)
    current = live[-1]
    if _expired(current, now):
        return Replaced("expired", v, current.expires_at)
    first = next((x for x in later if norm(x.content) != norm(v.content)), None)
    if first is None or norm(current.content) == norm(v.content):
        return None  # nothing else said since, or the value came back
    return Replaced("superseded", v, first.stated_ts or first.valid_from, current,
                    direct=first is current)


def _erased(v: Memory, chains: dict[str, list[Memory]]) -> bool:
    """Whether the memory of ``v`` was deleted by the user or an operator (its last version
    closed by a deletion): none of its statements is returned."""
    last = chains.get(v.memory_id, [v])[-1]
    return last.status == Status.DELETED and last.extra.get("closed_kind") == "deletion"


def assess(turns: Sequence[Turn], versions: Sequence[Memory], now: float) -> Truth:
    """Each turn's claim against the versions that state it (see the module doc).
    ``versions``: every version of the memories the turns' messages are in the lineage of,
    and of the memories those link to."""
    chains = _chains(versions)
    by_message: dict[str, list[Memory]] = {}
    for v in versions:
        for i in v.source.message_ids:
            by_message.setdefault(i, []).append(v)
    replaced: dict[str, Replaced] = {}
    hidden: set[str] = set()
    live: dict[str, frozenset[str]] = {}
    for t in turns:
        own = by_message.get(t.message_id, [])
        if any(_erased(v, chains) for v in own):
            hidden.add(t.memory_id)
            continue
        stated = [v for v in own if states(v, t.message_id, t.content, t.ts)]
        before = (t.context or {}).get("message_id")
        if not stated and before:  # the line shows its context turn too
            text, ts = str((t.context or {}).get("content", "")), (t.context or {}).get("ts")
            stated = [v for v in by_message.get(str(before), [])
                      if states(v, str(before), text, float(ts) if ts is not None else -1.0)
                      and not _erased(v, chains)]
        live[t.memory_id] = frozenset(v.memory_id for v in stated if v.live)
        claims = [r for v in stated if (r := resolve(v, chains, now)) is not None]
        if claims:  # the newest replacement speaks for the turn
            replaced[t.memory_id] = max(claims, key=lambda r: (r.at or 0.0))
    return Truth(replaced, frozenset(hidden), live)


def truth_of(store: MemoryStore, scope: Scope, turns: Sequence[Turn], now: float) -> Truth:
    """:func:`assess` with the versions read from the store: those the turns' messages are
    in the lineage of, then every version of their memories and of those they link to."""
    if not turns:
        return Truth()
    own = Scope(scope.tenant_id, scope.user_id)
    ids = list(dict.fromkeys(i for t in turns for i in t.message_ids))
    found = {(v.memory_id, v.version): v for v in store.versions(own, message_ids=ids)}
    if all(v.live and not _expired(v, now) for v in found.values()):
        return assess(turns, list(found.values()), now)  # nothing closed: one read
    wanted = {v.memory_id for v in found.values()}
    asked: set[str] = set()
    for _ in range(MAX_ROUNDS):
        missing = sorted(wanted - asked)
        if not missing:
            break
        asked |= set(missing)
        for v in store.versions(own, memory_ids=missing):
            found[v.memory_id, v.version] = v
        wanted |= {str(v.extra[k]) for v in found.values() for k in LINKS if v.extra.get(k)}
    return assess(turns, list(found.values()), now)
