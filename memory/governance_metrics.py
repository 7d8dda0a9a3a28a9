"""The governance metrics of SPEC §8 as pure functions over plain numbers (no Prometheus,
no Kafka): what the worker's ``/v1/metrics/summary`` answers and what the PromQL rules of
docs/operations.md compute from the exported counters.

Definitions (docs/operations.md, "Metrics", lists them with their alerts):

- **write volume**: memory changes applied per day (every op of every lineage kind);
- **hit rate**: retrievals whose best returned memory has a relevance (cosine) at or above
  ``metrics_hit_relevance`` (default: the embedder's ``related_threshold``), over all
  retrievals (search, context, ``memory_search``);
- **conflict rate**: conflicts over conversation changes, where a *conflict* is an
  UPDATE or DELETE of a stored memory decided from conversation (lineage ``extraction`` or
  ``tool``): new information that contradicts (supersedes) what was stored;
- **user deletion rate**: memories deleted by a user or operator (DELETE with lineage
  ``deletion``) over memories added;
- **consolidation rate**: duplicates merged by the consolidation job per day;
- **retrieval latency**: p50 / p99 from the histogram's buckets (linear interpolation
  inside a bucket, as PromQL's ``histogram_quantile``).

Every ratio with a zero denominator is ``None`` ("no data"), never an error.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from memstream.memory.ingest_state import UserState
from memstream.topics.schemas import JobResult, JobStatus

DAY_S = 86_400.0
# 1 ms .. 1 s (+Inf): a retrieval is an embedding plus a local vector search
LATENCY_BUCKETS: tuple[float, ...] = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                      0.5, 1.0)
# message -> change applied: seconds (threshold, explicit) to hours (idle flush, backoff)
LAG_BUCKETS: tuple[float, ...] = (0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0,
                                  1800.0, 3600.0, 4 * 3600.0, DAY_S)

CONVERSATION_KINDS = frozenset({"extraction", "tool"})
# InvalidRecord kinds (memstream.core.errors): the dead-letter label takes these, or "other"
DEAD_LETTER_CLASSES = frozenset({
    "empty", "too_large", "not_json", "depth", "number", "unicode", "version", "schema",
    "date", "key", "extraction_failed", "apply_failed", "internal", "undecryptable",
    "tenant", "undecodable", "unauthenticated"})
CHANGE_OPS = frozenset({"add", "update", "delete", "erase", "restate", "archive"})
LINEAGE_KINDS = frozenset({"extraction", "tool", "reflection", "consolidation", "decay",
                           "deletion", "rollback", "forget", "archive"})
TRIGGERS = frozenset({"threshold", "explicit", "session_end", "idle", "tool"})


def bounded(value: str, allowed: frozenset[str]) -> str:
    """A label value from a fixed set, else "other": labels never carry free text."""
    return value if value in allowed else "other"


def ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator > 0 else None


def increase(before: float, after: float) -> float:
    """How much a counter grew; a reset (a restart: after < before) counts from zero."""
    return after - before if after >= before else after


MIN_WINDOW_S = 3600.0  # the shortest window a per-day rate is projected from


def per_day(before: float, after: float, elapsed_s: float) -> float | None:
    """A counter's growth between two readings ``elapsed_s`` apart, scaled to one day;
    None below :data:`MIN_WINDOW_S` (a minute's burst times 1,440 is noise, not a rate)."""
    if elapsed_s < MIN_WINDOW_S:
        return None
    return increase(before, after) * DAY_S / elapsed_s


def is_conflict(op: str, kind: str) -> bool:
    return kind in CONVERSATION_KINDS and op in ("update", "delete")


def is_user_deletion(op: str, kind: str) -> bool:
    return op == "delete" and kind == "deletion"


# --- histograms --------------------------------------------------------------------------
@dataclass
class Buckets:
    """A histogram kept as plain counts: ``counts[i]`` observations ``<= bounds[i]`` and
    above the bound before; the last entry is the +Inf bucket."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0  # the sum of the observations

    def __post_init__(self) -> None:
        if list(self.bounds) != sorted(set(self.bounds)):
            raise ValueError("bucket bounds must be strictly increasing")
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        if not math.isfinite(value):
            return
        value = max(0.0, value)
        i = next((n for n, b in enumerate(self.bounds) if value <= b), len(self.bounds))
        self.counts[i] += 1
        self.total += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, observations at or below it), ending with (+Inf, count)."""
        out, running = [], 0
        for bound, n in zip((*self.bounds, math.inf), self.counts, strict=True):
            running += n
            out.append((bound, running))
        return out


def quantile(q: float, cumulative: Sequence[tuple[float, float]]) -> float | None:
    """The ``q`` quantile from cumulative buckets, as PromQL's ``histogram_quantile``:
    linear inside the bucket it falls in; in the +Inf bucket, the highest finite bound.
    None without observations."""
    if not 0.0 <= q <= 1.0:
        raise ValueError("q must be within [0, 1]")
    if not cumulative or cumulative[-1][1] <= 0:
        return None
    rank = q * cumulative[-1][1]
    lower, below = 0.0, 0.0
    for bound, seen in cumulative:
        if seen >= rank and seen > below:
            if math.isinf(bound):
                return lower
            return lower + (bound - lower) * (rank - below) / (seen - below)
        if not math.isinf(bound):
            lower = bound
        below = seen
    return lower


# --- extraction lag -----------------------------------------------------------------------
def extraction_lag(state: UserState, result: JobResult) -> float | None:
    """Seconds from the newest message of the job ``result`` closes (its ``ts``, set by the
    producer) to ``result.finished_at`` (stamped by the apply stage once the job's changes
    are in the store and published). None when the result is not the user's job in flight
    (stale, replayed), not done, a tool job, or its messages are no longer buffered."""
    flight = state.in_flight
    if (flight is None or flight.kind != "extract" or flight.job_id != result.job_id
            or result.status != JobStatus.DONE):
        return None
    session = state.sessions.get(flight.session_id)
    if session is None:
        return None
    stamps = [m.ts for m in session.buffer if flight.from_seq <= m.seq < flight.to_seq]
    if not stamps:
        return None
    try:
        newest = max(datetime.fromisoformat(ts).timestamp() for ts in stamps)
    except ValueError:
        return None
    return max(0.0, result.finished_at.timestamp() - newest)


# --- the governance snapshot -----------------------------------------------------------
@dataclass(frozen=True)
class Snapshot:
    """The raw numbers the governance metrics come from, read at ``at`` (seconds)."""

    at: float
    changes: int = 0  # every applied change
    adds: int = 0
    conversation_changes: int = 0  # lineage extraction / tool
    conflicts: int = 0
    user_deletions: int = 0
    consolidation_merges: int = 0
    retrievals: int = 0
    retrievals_with_results: int = 0
    feedback_used: int = 0
    feedback_not_useful: int = 0
    messages: int = 0
    llm_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass(frozen=True)
class Governance:
    write_volume_per_day: float | None
    hit_rate: float | None
    feedback_useful_rate: float | None
    conflict_rate: float | None
    user_deletion_rate: float | None
    consolidation_per_day: float | None
    llm_calls_per_message: float | None
    tokens_per_message: float | None


def governance(before: Snapshot, now: Snapshot) -> Governance:
    """The six governance metrics (plus LLM spend per message) between two snapshots."""
    elapsed = now.at - before.at

    def grew(name: str) -> float:
        return increase(getattr(before, name), getattr(now, name))

    messages = grew("messages")
    return Governance(
        write_volume_per_day=per_day(before.changes, now.changes, elapsed),
        hit_rate=ratio(grew("retrievals_with_results"), grew("retrievals")),
        feedback_useful_rate=ratio(grew("feedback_used"),
                                   grew("feedback_used") + grew("feedback_not_useful")),
        conflict_rate=ratio(grew("conflicts"), grew("conversation_changes")),
        user_deletion_rate=ratio(grew("user_deletions"), grew("adds")),
        consolidation_per_day=per_day(before.consolidation_merges,
                                      now.consolidation_merges, elapsed),
        llm_calls_per_message=ratio(grew("llm_calls"), messages),
        tokens_per_message=ratio(grew("prompt_tokens") + grew("completion_tokens"), messages),
    )
