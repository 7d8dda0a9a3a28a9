"""Worker-local counters (exported as Prometheus metrics by :mod:`web.prometheus`, logged on
shutdown): the one source of truth of what this process counted since it started.

Plain ints and dicts updated in the event loop; labelled counts are dicts keyed by bounded
label values only (``memory.governance_metrics.bounded``): never a tenant, a user or content.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from typing import TypeVar

from memstream.memory.governance_metrics import LAG_BUCKETS, LATENCY_BUCKETS, Buckets

K = TypeVar("K")


@dataclass
class Counters:
    messages: int = 0
    duplicates: int = 0
    session_events: int = 0
    jobs_emitted: int = 0
    jobs_resent: int = 0
    trivial_resolved: int = 0
    turns_swept: int = 0  # archived turns past archive_days deleted from the store
    results_done: int = 0
    results_failed: int = 0
    results_fenced: int = 0  # re-issued under a new seq (memory.fencing)
    stale_results: int = 0
    messages_overdue: int = 0  # a gauge: unscanned past every trigger (ingest_state.overdue)
    ticks: int = 0
    # producers' records that arrived off their key's partition, re-routed (streams.placement)
    misplaced_records: int = 0
    # fencing (memory.fencing): jobs not decided again, decisions refused or re-published
    jobs_skipped: int = 0
    decisions_fenced: int = 0
    decisions_duplicate: int = 0
    decisions_republished: int = 0
    # stage.until_handled: transient failures retried in place, records set aside as internal
    handler_retries: int = 0
    handler_failures: int = 0
    # retrieval (web.backend): queries served, hits recorded / folded, feedback, tool calls
    tool_requests: int = 0
    tool_requests_refused: int = 0
    searches: int = 0
    retrievals_with_results: int = 0  # best memory at or above metrics_hit_relevance
    hits_recorded: int = 0
    access_events_folded: int = 0
    feedback_used: int = 0
    feedback_not_useful: int = 0
    tool_calls: int = 0
    # windowed jobs (streams.jobs_fold): commands sent; consolidation merges (SPEC §8)
    jobs_commands: int = 0
    consolidation_merges: int = 0
    user_deletions: int = 0  # deletions answered to an API caller (web.backend_history)
    forget_requests: int = 0  # forget-me (right to erasure) requests
    # LLM spend of the decisions made here (streams.extract)
    llm_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # labelled (web.prometheus): (op, lineage kind) of applied changes, jobs by trigger
    # reason (first attempts), dead letters by reason class
    changes: dict[tuple[str, str], int] = field(default_factory=dict)
    jobs_by_trigger: dict[str, int] = field(default_factory=dict)
    dead_letters_by_class: dict[str, int] = field(default_factory=dict)
    # owned loops' polls (streams.undecodable): batches set aside by (topic, error class),
    # failed polls nothing explained by (stage, error class)
    batches_set_aside: dict[tuple[str, str], int] = field(default_factory=dict)
    fetch_failures: dict[tuple[str, str], int] = field(default_factory=dict)
    # records of the topics that carry authority without a valid MAC, by the topic's role
    # (streams.record_checks): set aside, nothing changed
    records_unauthenticated: dict[str, int] = field(default_factory=dict)
    retrieval_latency: Buckets = field(default_factory=lambda: Buckets(LATENCY_BUCKETS))
    extraction_lag: Buckets = field(default_factory=lambda: Buckets(LAG_BUCKETS))
    started_at: float = field(default_factory=time.time)  # wall clock, for per-day rates

    @property
    def dead_letters(self) -> int:
        return sum(self.dead_letters_by_class.values())

    def as_dict(self) -> dict[str, int]:
        """The plain counts (for the shutdown log line)."""
        found = {f.name: getattr(self, f.name) for f in fields(self)}
        out = {k: v for k, v in found.items() if isinstance(v, int)}
        out["dead_letters"] = self.dead_letters
        out["changes"] = sum(self.changes.values())
        return out


def add(counts: dict[K, int], key: K, n: int = 1) -> None:
    counts[key] = counts.get(key, 0) + n
