"""What deciding one job produced (:class:`JobOutcome`), and the model's usage and
insights: the data every decider shares (extraction, the windowed jobs, corrections)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from memstream.memory.decisions import PlannedOp
from memstream.memory.model import Memory


@dataclass(frozen=True)
class Usage:
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.calls + other.calls, self.prompt_tokens + other.prompt_tokens,
                     self.completion_tokens + other.completion_tokens)


@dataclass(frozen=True)
class Insight:
    """A higher-level statement a reflection inferred about the user (Generative Agents).

    ``evidence`` holds the 1-based numbers of the memories shown to the model, never ids:
    the caller maps them back to the memories it numbered (the reflection's lineage)."""

    text: str
    evidence: tuple[int, ...]
    importance: int = 8


@dataclass
class JobOutcome:
    """What deciding one job produced: ops (with the vector of each new version)."""

    ops: list[tuple[PlannedOp, list[float] | None]] = field(default_factory=list)
    decisions: Counter[str] = field(default_factory=Counter)
    usage: Usage = Usage()
    trivial: bool = False
    read: dict[str, int] = field(default_factory=dict)  # stored memory id -> version seen
    error: str | None = None  # a tool write that could not be done (nothing changes)
    erase: int | None = None  # forget-me: erase the user (how many version records it saw)
    seq: int = 0  # the job's seq
    # stored memory ids whose version read was written at the job's seq or later: by another
    # decision of this job, half-applied (its cursor not written), which must be applied first
    pending: set[str] = field(default_factory=set)

    def saw(self, hits: Sequence[tuple[Memory, float]]) -> None:
        """Remember the stored versions the decision read (checked again at apply time)."""
        for m, _ in hits:
            self.read[m.memory_id] = m.version
            if self.seq and m.job_seq >= self.seq:
                self.pending.add(m.memory_id)
