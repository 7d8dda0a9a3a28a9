"""Scoring a prompt block against a knowledge-update story (SPEC §9d), pure: string checks,
no model, no broker (``benchmarks/updates.py`` runs the stories; any other script can score
blocks it kept, e.g. a ``--keep-data`` run's ``answers.jsonl``).

The block is read line by line (``## `` headers and blank lines are not lines). A line
*is marked* when it carries the product's stale mark: it starts ``- (YYYY-MM-DD,
replaced ``, ``- (YYYY-MM-DD, no longer true`` or ``- (YYYY-MM-DD, expired``. Values
(:func:`memstream.dev.updates_stories.mentions`) are looked for in the line's text after
its leading parenthesis (so a date's digits never count as a number) and in the mark's
``by: ...`` (or ``now: ...``) part, which states what replaced it. A marked line presents
as current only what its ``by:`` part says: its own text is what it says stopped being
true (a control's value shown as "replaced" is not recalled).

Per story (:class:`Verdict`):

- ``current_in_block``: some line mentions a current form (a marked line: in its ``by:``);
- ``stale_first``: an unmarked line mentioning a stale form comes before the first line
  mentioning a current form, or the current value is absent while such a line exists (a
  line with both counts as mentioning the current one);
- ``ok`` ("current first"): the current value is there and no stale value (an update or
  chain) or distractor (a control) is shown before it; a control's recall is
  ``current_in_block`` alone;
- ``stale_unmarked``: unmarked lines with a stale form and no current one;
- ``current_marked``: marked lines whose own text (not its ``by:``) holds a current form
  and no stale one: the current value presented as no longer true;
- ``distractor_first``: a line with a distractor (someone else's value) before the first
  current line;
- ``repeated``: lines that repeat an earlier line or one of its messages (a turn shown
  alone and again inside its pair; should be 0);
- ``filler_lines``: lines whose text comes from a filler session: most of their words (or
  CJK character pairs) are those of a filler turn, and no other turn of the story matches
  as well (a turn line is judged by its own turn, not by the previous turn it quotes).
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from memstream.dev.updates_stories import Story, mentions

MARK = re.compile(r"- \(\d{4}-\d{2}-\d{2}, (?:replaced |no longer true|expired)")
_BY = re.compile(r"\b(?:by|now):\s*(.*)$", re.S)  # "replaced DAY by: X" / "; now: X"
_ROLE = re.compile(r"\[(?:user|assistant|system|tool)\]\s*")
_TURN_SPLIT = re.compile(r" / (?=\[(?:user|assistant|system|tool)\])")
_WORD = re.compile(r"[a-z0-9\u00c0-\u024f]+(?:'[a-z]+)?")
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]+")
_STOP = frozenset(
    "a an the i me my we our us you your he she it its they them their to of in on at for "
    "and or but so is are was were be been am do did does have has had not no with from "
    "that this there what which who how when where just about as by if then than too very "
    "s t ll ve re d m user user's".split())
FILLER_SHARE = 0.6  # of a line's words a filler turn must hold


@dataclass(frozen=True)
class Line:
    """One line of a prompt block: its text, what follows the leading parenthesis, the
    mark's ``by:`` part, and whether it carries the stale mark."""

    text: str
    body: str
    by: str = ""
    marked: bool = False

    @property
    def as_current(self) -> str:
        """Where a value is taken as presented as current: a marked line's ``by:`` part
        (its own text is what stopped being true), else the body and any ``by:`` part."""
        if self.marked:
            return self.by
        return f"{self.body} \n {self.by}" if self.by else self.body


def _paren_end(text: str, start: int) -> int | None:
    """The index of the ``)`` closing the ``(`` at ``start`` (nesting counted), or None."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return i
    return None


def parse_line(text: str) -> Line:
    marked = MARK.match(text) is not None
    if text.startswith("- ("):
        end = _paren_end(text, 2)
        if end is not None:
            inner = text[3:end]
            by = _BY.search(inner)
            return Line(text, text[end + 1:].strip(), by.group(1).strip() if by else "",
                        marked)
    return Line(text, text[2:].strip() if text.startswith("- ") else text.strip(), "", marked)


def parse_block(block: str) -> list[Line]:
    """The block's content lines (headers and blank lines left out)."""
    return [parse_line(t) for t in (r.strip() for r in block.splitlines())
            if t and not t.startswith("## ")]


# --- filler -------------------------------------------------------------------------------


def _grams(text: str) -> set[str]:
    """Content words (lower case, stop words out) and CJK character pairs."""
    low = text.lower()
    words = {w for w in _WORD.findall(low) if w not in _STOP}
    pairs = {run[i:i + 2] for run in _CJK.findall(low) for i in range(max(1, len(run) - 1))}
    return words | pairs


def _own_turn(line: Line) -> str:
    """A turn line's own turn (``[assistant] previous / [user] this``: this), role tags out;
    a memory line's text."""
    return _ROLE.sub("", _TURN_SPLIT.split(line.body)[-1])


def filler_judge(story: Story) -> Callable[[Line], bool]:
    """Whether a line comes from one of ``story``'s filler sessions."""
    filler = [_grams(t) for t in story.turns(filler=True)]
    other = [_grams(t) for t in story.turns(filler=False)]

    def share(grams: set[str], turns: list[set[str]]) -> float:
        return max((len(grams & t) / len(grams) for t in turns), default=0.0)

    def judge(line: Line) -> bool:
        grams = _grams(_own_turn(line))
        if not grams:
            return False
        best = share(grams, filler)
        return best >= FILLER_SHARE and best > share(grams, other)

    return judge


def said(line: Line) -> list[str]:
    """The messages a line shows (``[user] a / [assistant] b``: both, role tags kept), or
    its text (a memory line)."""
    parts = _TURN_SPLIT.split(line.body)
    return [p.strip() for p in parts] if _ROLE.match(line.body) else [line.body.strip()]


def repeats(lines: Sequence[Line]) -> int:
    """Lines that repeat an earlier line or one of its messages (a turn shown alone and
    again inside its pair)."""
    seen: set[str] = set()
    n = 0
    for line in lines:
        mine = said(line)
        n += bool(seen & set(mine))
        seen |= set(mine)
    return n


# --- one story -----------------------------------------------------------------------------


@dataclass
class Verdict:
    """One story's answer, scored; the pipeline's counts are filled in by the runner."""

    id: str
    lang: str
    category: str
    kind: str
    current_in_block: bool
    stale_first: bool
    first_current: int | None  # 1-based line numbers, None: no such line
    first_stale: int | None  # the first unmarked stale line (without a current form)
    lines: int
    chars: int
    marked: int
    stale_unmarked: int
    current_marked: int
    distractor_first: bool
    repeated: int
    filler_lines: int
    memory_items: int = 0  # what the context answer's items hold
    turn_items: int = 0
    filler_items: int = 0  # items whose source session is a filler one (by lineage)
    memories: int = 0  # the user's live memories after the run
    context_ms: float = 0.0

    @property
    def ok(self) -> bool:
        """The current value is there and nothing competing comes first: no stale value
        (an update or chain), no distractor (a control)."""
        return self.current_in_block and not self.stale_first and not (
            self.kind == "control" and self.distractor_first)

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, **asdict(self)}


def score(story: Story, block: str) -> Verdict:
    """``block`` (a ``context`` answer's prompt block) scored against ``story``."""
    lines = parse_block(block)
    is_filler = filler_judge(story)
    first_current = first_stale = first_distractor = None
    stale_unmarked = current_marked = 0
    for n, line in enumerate(lines, 1):
        current = mentions(line.as_current, story.current)
        stale = not current and mentions(line.body, story.stale)
        if current and first_current is None:
            first_current = n
        if stale and not line.marked:
            stale_unmarked += 1
            if first_stale is None:
                first_stale = n
        if line.marked and mentions(line.body, story.current) and not mentions(
                line.body, story.stale):
            current_marked += 1
        if first_distractor is None and mentions(line.body, story.distractors):
            first_distractor = n
    return Verdict(
        id=story.id, lang=story.lang, category=story.category, kind=story.kind,
        current_in_block=first_current is not None,
        stale_first=first_stale is not None and (first_current is None
                                                 or first_stale < first_current),
        first_current=first_current, first_stale=first_stale, lines=len(lines),
        chars=len(block), marked=sum(line.marked for line in lines),
        stale_unmarked=stale_unmarked, current_marked=current_marked,
        distractor_first=first_distractor is not None and (
            first_current is None or first_distractor < first_current),
        repeated=repeats(lines),
        filler_lines=sum(is_filler(line) for line in lines))


# --- many stories --------------------------------------------------------------------------


def _pct(n: int, of: int) -> float | None:
    return round(100 * n / of, 1) if of else None


def row(verdicts: Sequence[Verdict]) -> dict[str, Any]:
    """One table row: the figures of ``verdicts``."""
    changed = [v for v in verdicts if v.kind != "control"]
    controls = [v for v in verdicts if v.kind == "control"]

    def mean(xs: Iterable[float]) -> float:
        got = list(xs)
        return round(statistics.mean(got), 1) if got else 0.0

    return {
        "stories": len(verdicts),
        "current_in_block_pct": _pct(sum(v.current_in_block for v in verdicts), len(verdicts)),
        "ok_pct": _pct(sum(v.ok for v in verdicts), len(verdicts)),
        "updates": len(changed),
        "stale_first": sum(v.stale_first for v in changed),
        "controls": len(controls),
        "control_recall_pct": _pct(sum(v.current_in_block for v in controls), len(controls)),
        "distractor_first": sum(v.distractor_first for v in controls),
        "stale_unmarked_lines": sum(v.stale_unmarked for v in verdicts),
        "marked_lines": sum(v.marked for v in verdicts),
        "current_marked_lines": sum(v.current_marked for v in verdicts),
        "repeated_lines": sum(v.repeated for v in verdicts),
        "filler_lines": sum(v.filler_lines for v in verdicts),
        "filler_items": sum(v.filler_items for v in verdicts),
        "block_chars_mean": mean(v.chars for v in verdicts),
        "lines_mean": mean(v.lines for v in verdicts),
        "memory_items_mean": mean(v.memory_items for v in verdicts),
        "turn_items_mean": mean(v.turn_items for v in verdicts),
        "memories_mean": mean(v.memories for v in verdicts),
    }


GROUPS = ("category", "lang", "kind")


def summary(verdicts: Sequence[Verdict]) -> dict[str, Any]:
    """Overall and per category, language and kind (``by_category``, ``by_lang``, ...)."""
    out: dict[str, Any] = {"overall": row(verdicts)}
    for g in GROUPS:
        keys = sorted({getattr(v, g) for v in verdicts})
        out[f"by_{g}"] = {k: row([v for v in verdicts if getattr(v, g) == k]) for k in keys}
    return out


COLUMNS = (("stories", "stories"), ("current in block %", "current_in_block_pct"),
           ("current first %", "ok_pct"), ("stale first", "stale_first"),
           ("control recall %", "control_recall_pct"), ("distractor first", "distractor_first"),
           ("stale unmarked", "stale_unmarked_lines"), ("marked", "marked_lines"),
           ("filler lines", "filler_lines"), ("filler items", "filler_items"),
           ("repeated", "repeated_lines"), ("chars", "block_chars_mean"),
           ("memory / turn items", None))


def _cells(r: dict[str, Any]) -> list[str]:
    return [f"{r['memory_items_mean']} / {r['turn_items_mean']}" if key is None
            else "-" if r[key] is None else str(r[key]) for _, key in COLUMNS]


def table(figures: dict[str, Any]) -> str:
    """The markdown table of a :func:`summary`: a row per category, language and kind,
    then overall."""
    lines = ["| group | " + " | ".join(c for c, _ in COLUMNS) + " |",
             "|---" * (len(COLUMNS) + 1) + "|"]
    for g in GROUPS:
        lines += [f"| {g}: {k} | " + " | ".join(_cells(r)) + " |"
                  for k, r in figures[f"by_{g}"].items()]
    lines.append("| **overall** | " + " | ".join(_cells(figures["overall"])) + " |")
    return "\n".join(lines)
