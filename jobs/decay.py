"""Decay (SPEC §6): what nobody retrieves fades, then goes to the archive; what outlived its
time to live expires. A pure planner over one user's live memories with their hit
statistics joined (:func:`memory.retrieval.join_stats`); :mod:`jobs.triggers` decides when
it runs, :mod:`jobs.work` runs it like any job of the user.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from memstream.core.errors import ConfigError
from memstream.memory.decisions import Context
from memstream.memory.model import Memory, MemoryType, Status
from memstream.memory.plan import Plan, close, eligible, expire, expired, is_reflection, revise
from memstream.memory.scoring import decay_weight, last_touched

DAY = 86_400.0


@dataclass(frozen=True)
class DecayPolicy:
    downweight_days: float = 30
    archive_days: float = 90
    slow_factor: float = 3.0  # reflections and procedural memories decay this many times slower
    weight: float = 0.5  # the down-weight factor written to extra["weight"]

    def __post_init__(self) -> None:
        if not 0 < self.downweight_days <= self.archive_days:
            raise ConfigError("decay needs 0 < downweight_days <= archive_days")
        if self.slow_factor < 1:
            raise ConfigError(f"slow_factor must be >= 1, got {self.slow_factor!r}")
        if not 0 <= self.weight < 1:
            raise ConfigError(f"weight must be in [0, 1), got {self.weight!r}")


def _slowness(m: Memory, policy: DecayPolicy) -> float:
    """Distilled memories (reflections) and rules of how to act fade slower than raw facts."""
    return policy.slow_factor if is_reflection(m) or m.type == MemoryType.PROCEDURAL else 1.0


def plan_decay(memories: Sequence[Memory], now: float, policy: DecayPolicy,
               ctx: Context) -> Plan:
    """Expire what outlived its TTL, archive what nobody retrieved for ``archive_days``,
    down-weight (once) what nobody retrieved for ``downweight_days``; boundaries count."""
    plan = Plan()
    for i in eligible(memories, ctx):
        m = memories[i]
        if expired(m, now):
            expire(plan, ctx, m, now)
            continue
        idle = now - last_touched(m)
        slow = _slowness(m, policy)
        days = int(idle // DAY)
        if idle >= policy.archive_days * slow * DAY:
            close(plan, ctx, m, Status.ARCHIVED, now, now,
                   f"archived: no retrieval for {days} days", "archived")
        elif idle >= policy.downweight_days * slow * DAY and decay_weight(m) > policy.weight:
            revise(plan, ctx, m, now, f"down-weighted: no retrieval for {days} days",
                    "downweighted", extra={**m.extra, "weight": policy.weight, "decayed_at": now})
    return plan
