"""Retrieval scoring (SPEC §5): ``score = a*recency + b*importance + c*relevance``, pure.

The vector store hands back ``(memory, cosine)`` candidates; :func:`visible` says which a
caller may see and :func:`rank` orders them. Time is always passed in (``now``, epoch
seconds), so a test can step a clock through months of decay in microseconds.

Normalisation. ``"absolute"`` (the default) maps each component to [0, 1] on a fixed scale:
recency is already ``decay ** hours``, importance is ``(i - 1) / 9``, relevance is the cosine
clipped to [0, 1]. ``"minmax"`` is the Generative Agents recipe: each component min-max
normalised over this candidate set. Absolute is the default because min-max

- makes one query's scores incomparable with another's (0.7 means "70 % of the way between
  this query's worst and best hit"), so no threshold or metric can be set on them;
- turns a uniformly weak candidate set into relevance 1.0 for the best weak hit;
- gives no signal at all for a candidate set of one (every component becomes constant).

Under min-max a constant component (every candidate equal, or a single candidate) is 0.5
for all, so it neither helps nor hurts anyone and the other components decide.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Literal

from memstream.core.errors import ConfigError
from memstream.memory.model import Memory

_HOUR = 3600.0
Component = tuple[float, float, float]  # recency, importance, relevance


@dataclass(frozen=True)
class Weights:
    """How much each component counts (SPEC default: equal) and how fast recency decays."""

    recency: float = 1.0
    importance: float = 1.0
    relevance: float = 1.0
    decay: float = 0.995  # per hour since last access
    normalise: Literal["absolute", "minmax"] = "absolute"

    def __post_init__(self) -> None:
        for name in ("recency", "importance", "relevance"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"weight {name} must be a finite number >= 0, got {value!r}")
        if not (0 < self.decay <= 1):
            raise ConfigError(f"decay must be in (0, 1], got {self.decay!r}")
        if self.normalise not in ("absolute", "minmax"):
            raise ConfigError(f"normalise must be 'absolute' or 'minmax', got {self.normalise!r}")


@dataclass(frozen=True)
class Scored:
    """A ranked memory; the components are the normalised values the score was built from."""

    memory: Memory
    score: float
    recency: float
    importance: float
    relevance: float


def last_touched(memory: Memory) -> float:
    """When the memory was last used: accessed, else updated, else created."""
    for ts in (memory.last_accessed_at, memory.updated_at, memory.created_at):
        if ts is not None:
            return ts
    return 0.0  # unreachable with a well-formed Memory; keeps the type a float


def recency(memory: Memory, now: float, decay: float) -> float:
    """``decay ** hours`` since last access; a future timestamp (clock skew) counts as 0 h."""
    hours = max(0.0, (now - last_touched(memory)) / _HOUR)
    return float(decay**hours)


def visible(memory: Memory, now: float, statuses: Collection[str] = ("active",),
            include_expired: bool = False) -> bool:
    """Whether a caller asking for ``statuses`` may see ``memory`` at ``now``.

    Archived, superseded and deleted memories come back only when asked for by status; an
    expired one (``expires_at <= now``) only with ``include_expired``.
    """
    if memory.status.value not in statuses:
        return False
    expired = memory.expires_at is not None and memory.expires_at <= now
    return include_expired or not expired


def decay_weight(memory: Memory) -> float:
    """The decay job's down-weight factor in ``extra["weight"]``; anything but [0, 1] is 1."""
    weight = memory.extra.get("weight")
    if isinstance(weight, bool) or not isinstance(weight, int | float):
        return 1.0
    return float(weight) if 0.0 <= weight <= 1.0 else 1.0


def _raw(memory: Memory, cosine: float, now: float, decay: float) -> Component:
    importance = (min(max(memory.importance, 1), 10) - 1) / 9
    relevance = cosine if math.isfinite(cosine) else 0.0
    return recency(memory, now, decay), importance, relevance


def _absolute(raw: Sequence[Component]) -> list[Component]:
    return [(r, i, min(max(v, 0.0), 1.0)) for r, i, v in raw]


def _scale(values: Sequence[float]) -> list[float]:
    low, high = min(values), max(values)
    span = high - low
    return [0.5 if span <= 0 else (x - low) / span for x in values]


def _minmax(raw: Sequence[Component]) -> list[Component]:
    rec, imp, rel = (_scale([c[n] for c in raw]) for n in range(3))
    return list(zip(rec, imp, rel, strict=True))


def rank(candidates: Sequence[tuple[Memory, float]], now: float, weights: Weights,
         k: int) -> list[Scored]:
    """The top ``k`` of ``(memory, cosine)`` candidates, best first.

    Ties keep a stable order: score, then relevance, then input order. When the same
    ``memory_id`` comes back more than once (a version found by two searches) only its
    best-scoring entry is kept. Min-max bounds are taken over all candidates given, so
    filter with :func:`visible` before ranking.
    """
    if k <= 0 or not candidates:
        return []
    raw = [_raw(m, cosine, now, weights.decay) for m, cosine in candidates]
    normed = _minmax(raw) if weights.normalise == "minmax" else _absolute(raw)
    scored = []
    for (memory, _), (r, i, v) in zip(candidates, normed, strict=True):
        total = weights.recency * r + weights.importance * i + weights.relevance * v
        scored.append(Scored(memory, total * decay_weight(memory), r, i, v))
    order = sorted(range(len(scored)), key=lambda n: (-scored[n].score, -scored[n].relevance, n))
    seen: set[str] = set()
    best: list[Scored] = []
    for n in order:
        if scored[n].memory.memory_id in seen:
            continue
        seen.add(scored[n].memory.memory_id)
        best.append(scored[n])
        if len(best) == k:
            break
    return best
