"""The JSON of ``GET /v1/metrics/summary`` (admin key or metrics key): the governance
metrics of SPEC §8 computed over this worker's counters since it started, and the raw
numbers they come from (definitions: :mod:`memstream.memory.governance_metrics`).

Counters are per worker process and restart at zero: for a fleet or a time window, use the
Prometheus counters of ``/metrics`` and the PromQL of docs/operations.md instead.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field


class _Out(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)  # tolerant client


class GovernanceMetrics(_Out):
    """Ratios are 0..1; None: no data yet (a zero denominator)."""

    write_volume_per_day: float | None = Field(
        description="Memory changes applied per day (every op and lineage kind); None "
        "until the worker has run an hour (raw.changes holds the count)")
    hit_rate: float | None = Field(
        description="Retrievals whose best memory reached metrics_hit_relevance / retrievals")
    feedback_useful_rate: float | None = Field(
        description="Feedback 'used' / all feedback (when callers send feedback)")
    conflict_rate: float | None = Field(
        description="Conversation UPDATE/DELETE of a stored memory / conversation changes")
    user_deletion_rate: float | None = Field(
        description="Memories deleted by a user or operator / memories added")
    consolidation_per_day: float | None = Field(
        description="Duplicates merged by the consolidation job per day")
    llm_calls_per_message: float | None = None
    tokens_per_message: float | None = None


class Quantiles(_Out):
    """A histogram's count and sum, and its quantiles (seconds; None: no observation)."""

    count: int
    sum_s: float
    p50_s: float | None
    p99_s: float | None


class RawCounts(_Out):
    """What the metrics above were computed from (counts since the worker started)."""

    changes: int
    adds: int
    conversation_changes: int
    conflicts: int
    user_deletions: int
    consolidation_merges: int
    retrievals: int
    retrievals_with_results: int
    feedback_used: int
    feedback_not_useful: int
    messages: int
    llm_calls: int
    prompt_tokens: int
    completion_tokens: int
    jobs_by_trigger: dict[str, int]
    trivial_jobs: int
    dead_letters: dict[str, int]
    store_records: int | None = Field(description="Memory version records (cached count)")
    consumer_lag: int | None = Field(
        description="Records not yet committed, summed over this worker's input partitions")


class MetricsSummary(_Out):
    started_at: datetime
    elapsed_s: float
    governance: GovernanceMetrics
    retrieval_latency: Quantiles
    extraction_lag: Quantiles
    raw: RawCounts
