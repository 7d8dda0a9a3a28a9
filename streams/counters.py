"""Worker-local counters of the ingest stage (exported as metrics, logged on shutdown)."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class Counters:
    messages: int = 0
    duplicates: int = 0
    dead_letters: int = 0
    session_events: int = 0
    jobs_emitted: int = 0
    jobs_resent: int = 0
    trivial_resolved: int = 0
    results_done: int = 0
    results_failed: int = 0
    results_fenced: int = 0  # re-issued under a new seq (memory.fencing)
    stale_results: int = 0
    ticks: int = 0
    # fencing (memory.fencing): jobs not decided again, decisions refused or re-published
    jobs_skipped: int = 0
    decisions_fenced: int = 0
    decisions_duplicate: int = 0
    decisions_republished: int = 0
    # streams.guard: transient failures retried in place, records set aside as internal
    handler_retries: int = 0
    handler_failures: int = 0
    # retrieval (streams.api): queries served, hits recorded / folded, feedback, tool calls
    tool_requests: int = 0
    tool_requests_refused: int = 0
    searches: int = 0
    hits_recorded: int = 0
    access_events_folded: int = 0
    feedback_used: int = 0
    feedback_not_useful: int = 0
    tool_calls: int = 0
    # windowed jobs (jobs.agents): commands sent; consolidation merges (SPEC §8)
    jobs_commands: int = 0
    consolidation_merges: int = 0
    user_deletions: int = 0  # memories deleted by a user or operator (SPEC §8)
    forget_requests: int = 0  # forget-me (right to erasure) requests

    def as_dict(self) -> dict[str, int]:
        return asdict(self)
