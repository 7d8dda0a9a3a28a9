"""When the windowed jobs run (SPEC §6), as a pure state machine per user.

The maintenance fold (:mod:`streams.jobs_fold`) folds the memory-change topic and timer rounds
into one :class:`UserJobs` per ``tenant/user`` and turns what is due into commands. A
command is not the work: it becomes a write request of its own kind on the tool-requests
topic, so the ingest stage runs it as a job of the user (serialised with extraction, fenced
by the user's seq) and the extract / apply stages decide and apply it like any other job.

- **Reflection** (Generative Agents): the importance of every new memory written by
  extraction or an agent's tool call is added to ``importance_sum`` (reflections and the
  jobs' own changes excluded, as in the Generative Agents code); reaching
  ``reflection_threshold`` emits one ``reflect`` command and resets the sum. Trivial turns
  write no memory, so twenty "ok"s never add anything.
- **Consolidation**: a user with new memories gets a ``consolidate`` command
  ``consolidation_interval_s`` after the first new memory since the last run.
- **Decay**: a user with memories gets a ``decay`` command every ``decay_interval_s``.

Commands carry deterministic request ids (``reflect-3`` is the user's third reflection):
a command sent twice (a crash between send and commit) is taken once by the ingest stage.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from memstream.topics.schemas import MemoryChange

USER_WRITES = ("extraction", "tool")  # lineage kinds that count as new memories
KINDS = ("reflect", "consolidate", "decay")


@dataclass(frozen=True)
class JobsPolicy:
    reflection_threshold: int = 150
    consolidation_interval_s: float = 86_400.0
    decay_interval_s: float = 86_400.0
    enabled: tuple[str, ...] = KINDS


@dataclass(frozen=True)
class UserJobs:
    tenant_id: str
    user_id: str
    importance_sum: int = 0
    reflections: int = 0  # commands sent so far, per kind (they number the request ids)
    consolidations: int = 0
    decays: int = 0
    new_memories: bool = False  # since the last consolidation
    next_consolidation: float | None = None
    next_decay: float | None = None

    def snapshot(self) -> dict[str, Any]:
        return {"v": 1, **asdict(self)}

    @classmethod
    def restore(cls, data: dict[str, Any]) -> UserJobs:
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class Command:
    kind: str  # reflect | consolidate | decay
    request_id: str


def on_change(state: UserJobs, change: MemoryChange, now: float,
              policy: JobsPolicy) -> tuple[UserJobs, list[Command]]:
    """Count a new memory of the user; a reflection is due when the sum reaches the
    threshold."""
    if change.lineage.kind not in USER_WRITES or change.op in ("delete", "restate"):
        return state, []
    if change.after.get("status", "active") != "active":  # a late fact kept as history
        return state, []
    if (change.after.get("extra") or {}).get("kind") == "reflection":
        return state, []
    state = replace(
        state, importance_sum=state.importance_sum + int(change.after.get("importance", 0)),
        new_memories=True,
        next_consolidation=(state.next_consolidation if state.next_consolidation is not None
                            else now + policy.consolidation_interval_s),
        next_decay=(state.next_decay if state.next_decay is not None
                    else now + policy.decay_interval_s))
    if state.importance_sum < policy.reflection_threshold or "reflect" not in policy.enabled:
        return state, []
    n = state.reflections + 1
    return replace(state, importance_sum=0, reflections=n), [Command("reflect", f"reflect-{n}")]


def on_tick(state: UserJobs, now: float, policy: JobsPolicy) -> tuple[UserJobs, list[Command]]:
    """Consolidation and decay commands for what is due at ``now``."""
    out: list[Command] = []
    if state.next_consolidation is not None and state.next_consolidation <= now:
        if state.new_memories and "consolidate" in policy.enabled:
            n = state.consolidations + 1
            out.append(Command("consolidate", f"consolidate-{n}"))
            state = replace(state, consolidations=n)
        state = replace(state, new_memories=False, next_consolidation=None)
    if state.next_decay is not None and state.next_decay <= now:
        if "decay" in policy.enabled:
            n = state.decays + 1
            out.append(Command("decay", f"decay-{n}"))
            state = replace(state, decays=n)
        state = replace(state, next_decay=now + policy.decay_interval_s)
    return state, out


def next_due(state: UserJobs) -> float | None:
    """When :func:`on_tick` would next do something for this user, or None."""
    times = [t for t in (state.next_consolidation, state.next_decay) if t is not None]
    return min(times) if times else None
