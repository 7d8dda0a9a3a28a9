"""The ready-made prompt block (SPEC §5): core memory, procedural rules and ranked memories
as plain text for a system prompt, cut to a character and/or token budget. Pure.

Layout (a section is left out when it has no line)::

    ## Core memory
    [profile] Name: Ada.
    [instructions] Answer in German.
    ## How to act
    - Confirm before booking.
    ## What you remember about the user
    - (2026-01-05) Lives in Berlin.
    - (2025-11-02) (general knowledge) The office closes at 18:00.
    ## From earlier conversations (newest first)
    - (2025-10-30) [assistant] How was the move? / [user] Done! Berlin at last.
    - (2025-06-02, replaced 2025-10-28 by: Lives in Berlin) [user] We live in Hamburg.

The memories are the current truth (SPEC §9d), in rank order, each dated by the statement
that made it (its event time; ``valid_from`` where none is known). The turns are dated
evidence: those of the best rank that fit, listed newest first, and a turn whose statement
was replaced says so in its date: ``replaced DAY by: what holds now`` (``replaced DAY; now:
...`` when versions came between), ``no longer true since DAY`` (retracted), ``expired
DAY``; an excerpt holding more than one message of the user quotes the stale statement
first (``"Has 2 children" replaced DAY by: Has 3 children``).

Global-scope memories (``user_id == GLOBAL_USER``) stay in the ranked list, marked
``(general knowledge)``, rather than getting a section of their own: one list keeps the
budget's rank order a single, strict order.

Memory text is data, never a command: every content line is flattened to one line (line
breaks and other control characters become spaces) and always starts with ``- `` or
``[label] ``, so stored text can never open a ``## `` header of its own.
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, tzinfo
from typing import Any

from memstream.memory.archive import Turn
from memstream.memory.hybrid import Item, stated_at
from memstream.memory.model import GLOBAL_USER, Memory
from memstream.memory.scoring import Scored
from memstream.memory.truth import Replaced

CORE_HEADER = "## Core memory"
PROCEDURAL_HEADER = "## How to act"
MEMORIES_HEADER = "## What you remember about the user"
TURNS_HEADER = "## From earlier conversations (newest first)"
GENERAL = "(general knowledge)"

# Scripts where one character is about one token (or more) in BPE tokenizers.
_CJK_RANGES = (
    (0x1100, 0x11FF),  # Hangul Jamo
    (0x3040, 0x30FF),  # Hiragana, Katakana
    (0x3130, 0x318F),  # Hangul Compatibility Jamo
    (0x31F0, 0x31FF),  # Katakana Phonetic Extensions
    (0x3400, 0x4DBF),  # CJK Unified Ideographs Extension A
    (0x4E00, 0x9FFF),  # CJK Unified Ideographs
    (0xAC00, 0xD7AF),  # Hangul Syllables
    (0xF900, 0xFAFF),  # CJK Compatibility Ideographs
    (0x20000, 0x3134F),  # CJK Unified Ideographs Extensions B..G
)


def _is_cjk(ch: str) -> bool:
    code = ord(ch)
    return any(low <= code <= high for low, high in _CJK_RANGES)


def estimate_tokens(text: str) -> int:
    """An estimate of the tokens ``text`` takes, meant to err high.

    No tokenizer is available offline (tiktoken downloads its BPE tables at run time), so:
    one token per CJK character (ideographs, kana, Hangul) and one per started group of four
    other characters. English prose averages 4 to 4.5 characters per token in the OpenAI
    tokenizers, so the estimate is slightly high there; dense digits, code or other non-Latin
    scripts can take more tokens than estimated, so keep a margin under hard model limits.
    """
    cjk = sum(1 for ch in text if _is_cjk(ch))
    return cjk + math.ceil((len(text) - cjk) / 4)


@dataclass(frozen=True)
class Block:
    text: str
    truncated: bool  # the budget left something out
    kept: int  # how many of the scored memories made it in
    # the evidence that made it in, as listed: the items of each line (memory.hybrid.Item)
    evidence: tuple[tuple[Item, ...], ...] = ()
    memories: tuple[Scored, ...] = ()  # the memories that made it in, as listed


def one_line(text: str) -> str:
    """``text`` on one line: control characters and line/paragraph separators become spaces,
    runs of white space collapse."""
    cleaned = "".join(
        " " if unicodedata.category(ch) in ("Cc", "Zl", "Zp") else ch for ch in text)
    return " ".join(cleaned.split())


def _day(ts: float, tz: tzinfo) -> str:
    try:
        return datetime.fromtimestamp(ts, tz).date().isoformat()
    except (OverflowError, OSError, ValueError):
        return "unknown date"


def memory_line(memory: Memory, tz: tzinfo = UTC) -> str:
    """``- (YYYY-MM-DD) content``, dated by the statement that made it (or last restated
    it: :attr:`Memory.stated_ts`), else by ``valid_from``: the day the fact became known."""
    mark = f" {GENERAL}" if memory.user_id == GLOBAL_USER else ""
    return f"- ({_day(memory.stated_ts or memory.valid_from, tz)}){mark} {one_line(memory.content)}"


def stale_mark(r: Replaced, tz: tzinfo = UTC, *, named: bool = False) -> str:
    """What a turn's date says of a replaced statement (see the module doc); ``named``:
    the statement quoted first (an excerpt of several messages, not all of them stale)."""
    at = "" if r.at is None else f" {_day(r.at, tz)}"
    what = f"\"{one_line(r.stated.content)}\" " if named else ""
    if r.kind == "expired":
        return f"{what}expired{at}"
    if r.kind == "deleted":
        return f"{what}no longer true{' since' + at if at else ''}"
    if r.current is None:
        return f"{what}replaced{at}"
    now = one_line(r.current.content)
    return f"{what}replaced{at} by: {now}" if r.direct else f"{what}replaced{at}; now: {now}"


def turn_line(turn: Turn, tz: tzinfo = UTC, replaced: Replaced | None = None) -> str:
    """``- (YYYY-MM-DD) [role] context / [role] text``, dated by the turn's event time, and
    marked when what it states was replaced (:func:`stale_mark`; named when the context
    is the user's too)."""
    said = f"[{one_line(turn.role)}] {one_line(turn.content)}"
    ctx = turn.context or {}
    users = int(turn.role == "user")
    if str(ctx.get("content") or "").strip():
        said = f"[{one_line(str(ctx.get('role', '')))}] {one_line(str(ctx['content']))} / {said}"
        users += ctx.get("role") == "user"
    mark = "" if replaced is None else f", {stale_mark(replaced, tz, named=users > 1)}"
    return f"- ({_day(turn.ts, tz)}{mark}) {said}"


def core_lines(core: Mapping[str, str]) -> list[str]:
    """``[label] line`` for every non-blank line of every core block, in mapping order."""
    lines = []
    for label, text in core.items():
        tag = one_line(label).replace("[", "(").replace("]", ")")
        lines += [f"[{tag}] {one_line(row)}" for row in text.splitlines() if row.strip()]
    return lines


class _Budget:
    """Accumulates lines while both budgets hold; the first line that does not fit closes
    the block, so nothing of lower priority can displace something of higher priority."""

    def __init__(self, chars: int | None, tokens: int | None) -> None:
        self.chars, self.tokens = chars, tokens
        self.lines: list[str] = []
        self.full = False

    def _fits(self, lines: list[str]) -> bool:
        text = "\n".join(lines)
        return ((self.chars is None or len(text) <= self.chars)
                and (self.tokens is None or estimate_tokens(text) <= self.tokens))

    def section(self, header: str, lines: Sequence[str]) -> int:
        """Add ``header`` and as many leading ``lines`` as fit; returns how many fit."""
        added = 0
        for line in lines:
            if self.full:
                break
            trial = self.lines + ([header] if added == 0 else []) + [line]
            if not self._fits(trial):
                self.full = True
                break
            self.lines, added = trial, added + 1
        return added


def excerpts(evidence: Sequence[Item]) -> list[list[Item]]:
    """The evidence as lines, in rank order: turns that share a message (a turn and the
    reply it is the context of) make one excerpt, at the best rank of its turns, so no
    message is shown twice; a memory is a line of its own."""
    groups: list[list[Item]] = []
    held: list[set[str]] = []
    for item in evidence:
        mine = set() if item.turn is None else set(item.turn.message_ids)
        found = [n for n, ids in enumerate(held) if ids & mine]
        if not found:
            groups.append([item])
            held.append(mine)
            continue
        first = found[0]
        for n in reversed(found[1:]):  # it joins two excerpts: one
            groups[first] += groups.pop(n)
            held[first] |= held.pop(n)
        groups[first].append(item)
        held[first] |= mine
    return groups


def excerpt_line(group: Sequence[Item], tz: tzinfo = UTC) -> str:
    """One evidence line: a memory (:func:`memory_line`), a turn (:func:`turn_line`), or
    the messages of several turns in their session's order, dated by the first turn and
    marked by the newest replacement among them (naming the replaced statement when the
    excerpt holds more than one message of the user)."""
    turns = [i.turn for i in group if i.turn is not None]
    if not turns:
        assert group[0].memory is not None
        return memory_line(group[0].memory.memory, tz)
    claims = [i.replaced for i in group if i.replaced is not None]
    claim = max(claims, key=lambda r: r.at or 0.0) if claims else None
    if len(turns) == 1:
        return turn_line(turns[0], tz, claim)
    said: dict[str, tuple[int, str, str]] = {}
    for t in turns:
        ctx = t.context or {}
        if str(ctx.get("content") or "").strip() and ctx.get("message_id"):
            said.setdefault(str(ctx["message_id"]),
                            (t.seq - 1, str(ctx.get("role", "")), str(ctx["content"])))
        said[t.message_id] = (t.seq, t.role, t.content)
    text = " / ".join(f"[{one_line(role)}] {one_line(content)}"
                      for _, role, content in sorted(said.values(), key=lambda m: m[0]))
    # more than one statement of the user in the excerpt: say which one is stale
    named = sum(role == "user" for _, role, _ in said.values()) > 1
    mark = "" if claim is None else f", {stale_mark(claim, tz, named=named)}"
    return f"- ({_day(min(t.ts for t in turns), tz)}{mark}) {text}"


def said_at(group: Sequence[Item]) -> float:
    """When the newest of an evidence line's statements was made."""
    return max(i.turn.ts if i.turn is not None else
               stated_at(i.memory.memory) if i.memory is not None else 0.0 for i in group)


def prompt_block(core: Mapping[str, str], memories: Sequence[Scored],
                 procedural: Sequence[Memory], *, budget_chars: int | None = None,
                 budget_tokens: int | None = None, tz: tzinfo = UTC,
                 evidence: Sequence[Item] = ()) -> Block:
    """Render the block within the budgets: core first, then procedural rules, then the
    memories in rank order, then the evidence (memory.hybrid.fuse: archived turns, and a
    memory something newer was said on) as excerpts (:func:`excerpts`): those of the best
    rank that fit, listed newest first; whole lines only, none twice. ``truncated`` is set
    when anything was left out; both budgets, when given, hold for the whole text."""
    budget = _Budget(budget_chars, budget_tokens)
    facts = [memory_line(s.memory, tz) for s in memories]
    groups = excerpts(evidence)
    lines = [excerpt_line(g, tz) for g in groups]
    facts_once, once = _once(facts), _once(lines, set(facts))
    wanted = [core_lines(core),
              [f"- {one_line(m.content)}" for m in procedural if m.content.strip()],
              [facts[n] for n in facts_once], [lines[n] for n in once]]
    headers = (CORE_HEADER, PROCEDURAL_HEADER, MEMORIES_HEADER, TURNS_HEADER)
    added = [budget.section(h, lines) for h, lines in zip(headers, wanted, strict=True)]
    truncated = any(n < len(lines) for n, lines in zip(added, wanted, strict=True))
    shown = sorted(once[:added[3]], key=lambda n: (-said_at(groups[n]), n))  # newest first
    if shown:
        budget.lines[-len(shown):] = [lines[n] for n in shown]
    kept = tuple(memories[n] for n in facts_once[:added[2]])
    return Block("\n".join(budget.lines), truncated, len(kept),
                 tuple(tuple(groups[n]) for n in shown), kept)


def fused_block(core: Mapping[str, str], items: Sequence[Item], procedural: Sequence[Memory],
                **budget: Any) -> Block:
    """:func:`prompt_block` of a fused answer (memory.hybrid.fuse): the memories that lead
    are the memories, every other item the evidence."""
    lead = [i.memory for i in items if i.memory is not None and i.newer is None]
    return prompt_block(core, lead, procedural, evidence=[
        i for i in items if i.memory is None or i.newer is not None], **budget)


def _once(lines: Sequence[str], seen: set[str] | None = None) -> list[int]:
    """The indices of the lines not seen before them (nor in ``seen``)."""
    seen = set(seen or ())
    out = []
    for n, line in enumerate(lines):
        if line not in seen:
            seen.add(line)
            out.append(n)
    return out
