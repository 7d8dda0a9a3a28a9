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
    ## From earlier conversations
    - (2025-10-30) [assistant] How was the move? / [user] Done! Berlin at last.

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

from memstream.memory.archive import Turn
from memstream.memory.model import GLOBAL_USER, Memory
from memstream.memory.scoring import Scored

CORE_HEADER = "## Core memory"
PROCEDURAL_HEADER = "## How to act"
MEMORIES_HEADER = "## What you remember about the user"
TURNS_HEADER = "## From earlier conversations"
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
    turns: tuple[Turn, ...] = ()  # the archived turns that made it in


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
    """``- (YYYY-MM-DD) content``, dated by ``valid_from``: the day the fact became known."""
    mark = f" {GENERAL}" if memory.user_id == GLOBAL_USER else ""
    return f"- ({_day(memory.valid_from, tz)}){mark} {one_line(memory.content)}"


def turn_line(turn: Turn, tz: tzinfo = UTC) -> str:
    """``- (YYYY-MM-DD) [role] context / [role] text``, dated by the turn's event time."""
    said = f"[{one_line(turn.role)}] {one_line(turn.content)}"
    ctx = turn.context or {}
    if str(ctx.get("content") or "").strip():
        said = f"[{one_line(str(ctx.get('role', '')))}] {one_line(str(ctx['content']))} / {said}"
    return f"- ({_day(turn.ts, tz)}) {said}"


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


def prompt_block(core: Mapping[str, str], memories: Sequence[Scored],
                 procedural: Sequence[Memory], *, budget_chars: int | None = None,
                 budget_tokens: int | None = None, tz: tzinfo = UTC,
                 turns: Sequence[Turn] = ()) -> Block:
    """Render the block within the budgets: core first, then procedural rules, then the
    memories in rank order, then the archived turns in rank order, whole lines only.
    ``truncated`` is set when anything was left out; both budgets, when given, hold for
    the whole text."""
    budget = _Budget(budget_chars, budget_tokens)
    wanted = [core_lines(core),
              [f"- {one_line(m.content)}" for m in procedural if m.content.strip()],
              [memory_line(s.memory, tz) for s in memories],
              [turn_line(t, tz) for t in turns]]
    headers = (CORE_HEADER, PROCEDURAL_HEADER, MEMORIES_HEADER, TURNS_HEADER)
    added = [budget.section(h, lines) for h, lines in zip(headers, wanted, strict=True)]
    truncated = any(n < len(lines) for n, lines in zip(added, wanted, strict=True))
    return Block("\n".join(budget.lines), truncated, added[2], tuple(turns[:added[3]]))
