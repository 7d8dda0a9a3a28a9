"""The worker's Prometheus metrics: a dedicated registry whose collector reads the
:class:`~memstream.streams.counters.Counters` at scrape time (the one source of truth),
plus the consumer lag and the store size, and the JSON summary of SPEC §8.

Served by :mod:`memstream.web.http_metrics` on the worker's own HTTP server
(``/metrics``, ``/v1/metrics/summary``); :func:`attach` wires them in :mod:`web.serve`.
Label values come from fixed sets (:func:`memory.governance_metrics.bounded`) or are topic names and
partition numbers: never a tenant, a user or content.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from memstream.contract.http_api.metrics import (
    GovernanceMetrics,
    MetricsSummary,
    Quantiles,
    RawCounts,
)
from memstream.memory import governance_metrics as m
from memstream.streams.counters import Counters
from memstream.web.http_base import DEPS

if TYPE_CHECKING:  # the worker's pipeline (its declared parts), not imported at run time
    from memstream.streams.pipeline import Pipeline

log = logging.getLogger(__name__)
COUNT_TIMEOUT_S = 10.0
Lags = Callable[[], Mapping[tuple[str, int], int]]


@dataclass(frozen=True)
class MetricsDeps:
    """What the metrics routes (:mod:`memstream.web.http_metrics`) serve, set on the HTTP app."""

    registry: CollectorRegistry
    metrics_key: str | None  # None: only the admin key opens the metrics
    summary: Callable[[], MetricsSummary]
    refresh: Callable[[], Awaitable[None]]  # cached values (the store size) brought up to date
    cluster: Callable[[], dict[str, Any]] | None = None  # web.routing.cluster_status


METRICS = web.AppKey("memstream_metrics", MetricsDeps)


class StoreSize:
    """The store's record count, counted again (in a thread) at most every ``every_s``:
    a scrape reads the cached value and at most one count runs at a time."""

    def __init__(self, count: Callable[[], int], every_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._count, self._every, self._clock = count, every_s, clock
        self._lock = asyncio.Lock()
        self.value: int | None = None
        self._at: float | None = None

    async def refresh(self) -> None:
        if self._at is not None and self._clock() - self._at < self._every:
            return
        async with self._lock:
            if self._at is not None and self._clock() - self._at < self._every:
                return
            try:
                self.value = await asyncio.wait_for(asyncio.to_thread(self._count),
                                                    COUNT_TIMEOUT_S)
            except Exception as exc:  # the gauge keeps its last value; the scrape goes on
                log.warning("metrics: counting the store failed (%s)", type(exc).__name__)
            self._at = self._clock()


def _histogram(name: str, doc: str, b: m.Buckets) -> HistogramMetricFamily:
    buckets = [(floatToGoString(le) if not math.isinf(le) else "+Inf", float(n))
               for le, n in b.cumulative()]
    return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=b.total)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


def _labelled(name: str, doc: str, label: str, counts: Mapping[str, int]) -> Metric:
    family = CounterMetricFamily(name, doc, labels=[label])
    for value, n in sorted(counts.items()):
        family.add_metric([value], n)
    return family


def _pairs(name: str, doc: str, labels: tuple[str, str],
           counts: Mapping[tuple[str, str], int]) -> Metric:
    family = CounterMetricFamily(name, doc, labels=list(labels))
    for pair, n in sorted(counts.items()):
        family.add_metric(list(pair), n)
    return family


class PipelineCollector(Collector):
    """Every memstream metric, read from the counters when Prometheus scrapes."""

    def __init__(self, counters: Counters, lags: Lags = dict,
                 store: StoreSize | None = None,
                 auth_failures: Mapping[str, int] | None = None,
                 key_records: Callable[[], Mapping[str, int]] | None = None,
                 api_key_records: Mapping[str, int] | None = None) -> None:
        self.c, self.lags, self.store = counters, lags, store
        self.auth_failures = auth_failures  # the HTTP app's LoginGuard.counts (live)
        self.key_records = key_records  # the user-keys view's set-aside records, by kind
        self.api_key_records = api_key_records  # the api-keys follower's (live), by kind

    def collect(self) -> Iterator[Metric]:
        c = self.c
        yield _counter("memstream_messages", "Chat messages read by the ingest stage",
                       c.messages)
        yield _counter("memstream_duplicate_messages",
                       "Chat messages dropped as duplicates (producer retries)", c.duplicates)
        changes = CounterMetricFamily(
            "memstream_memory_changes", "Memory changes applied (write volume), by op and "
            "lineage kind", labels=["op", "kind"])
        for (op, kind), n in sorted(c.changes.items()):
            changes.add_metric([op, kind], n)
        yield changes
        yield _counter("memstream_conflicts", "Conversation changes (extraction, tool) that "
                       "UPDATE or DELETE a stored memory", conflicts(c))
        yield _counter("memstream_user_deletions", "Memories deleted by a user or operator",
                       user_deletions(c))
        yield _counter("memstream_consolidation_merges",
                       "Duplicate memories merged by the consolidation job",
                       c.consolidation_merges)
        yield _counter("memstream_forget_requests", "Forget-me requests taken by the API",
                       c.forget_requests)
        yield _counter("memstream_retrievals", "Retrievals served (search, context, "
                       "memory_search)", c.searches)
        yield _counter("memstream_retrievals_with_results", "Retrievals whose best memory "
                       "reached metrics_hit_relevance (hit rate numerator)",
                       c.retrievals_with_results)
        yield _labelled("memstream_feedback", "Feedback on retrieved memories", "verdict",
                        {"used": c.feedback_used, "not_useful": c.feedback_not_useful})
        yield _histogram("memstream_retrieval_latency_seconds",
                         "Time to answer a retrieval (search, context, memory_search)",
                         c.retrieval_latency)
        yield _counter("memstream_llm_calls", "LLM calls of the decisions made here",
                       c.llm_calls)
        yield _labelled("memstream_llm_tokens", "LLM tokens of the decisions made here", "kind",
                        {"prompt": c.prompt_tokens, "completion": c.completion_tokens})
        yield _labelled("memstream_jobs", "Extraction jobs sent, by trigger reason (first "
                        "attempts)", "trigger", c.jobs_by_trigger)
        yield _counter("memstream_jobs_resent", "Jobs sent again after their timeout",
                       c.jobs_resent)
        yield GaugeMetricFamily("memstream_messages_overdue", "Chat messages not yet "
                                "scanned although their idle flush and a job timeout have "
                                "passed (0 when healthy: more is a lost message or job)",
                                value=c.messages_overdue)
        yield _counter("memstream_misplaced_records", "Producers' records that arrived on a "
                       "partition other than murmur2(key) % partitions (another client's "
                       "partitioner), re-routed through the repartition topic", c.misplaced_records)
        yield _counter("memstream_trivial_jobs", "Jobs resolved without an LLM call (every "
                       "user message trivial)", c.trivial_resolved)
        yield _labelled("memstream_job_results", "Job results read by the ingest stage",
                        "status", {"done": c.results_done, "failed": c.results_failed,
                                   "fenced": c.results_fenced})
        yield _histogram("memstream_extraction_lag_seconds", "Newest message of a job "
                         "(its timestamp) to the job's changes applied", c.extraction_lag)
        yield _labelled("memstream_dead_letters", "Records set aside on the dead-letter "
                        "topic, by reason class", "reason_class", c.dead_letters_by_class)
        yield _pairs("memstream_batches_set_aside", "Record batches no reader here could "
                     "decode, set aside by reference on the dead-letter topic (topic, "
                     "partition, offset range), by topic and error class", ("topic", "reason"),
                     c.batches_set_aside)
        yield _pairs("memstream_fetch_failures", "Polls of a stage loop that failed with no "
                     "undecodable batch found (the loop waits and polls again), by stage and "
                     "error class", ("stage", "error"), c.fetch_failures)
        yield _labelled("memstream_records_unauthenticated", "Records of the topics that "
                        "carry authority (tool requests, jobs, decisions, job results) "
                        "without a valid MAC: set aside without their value, nothing "
                        "changed", "topic", c.records_unauthenticated)
        lag = GaugeMetricFamily("memstream_consumer_lag", "Records not yet committed "
                                "(highwater - committed offset)", labels=["topic", "partition"])
        for (topic, partition), n in sorted(self.lags().items()):
            lag.add_metric([topic, str(partition)], n)
        yield lag
        if self.auth_failures is not None:
            yield _labelled("memstream_auth_failures", "Failed key checks of the HTTP API, "
                            "by reason (unknown_key; rate_limited: a wrong key past the limit; "
                            "request_rate: a valid key past its request rate)",
                            "reason", self.auth_failures)
        if self.key_records is not None:
            yield _labelled("memstream_user_key_records_rejected", "Records of the user-keys "
                            "topic set aside (malformed, not opening, not verifying: forged), "
                            "by kind", "kind", self.key_records())
        if self.api_key_records is not None:
            yield _labelled("memstream_api_key_records_rejected", "Records of the api-keys "
                            "topic set aside (malformed, or a record or tombstone whose "
                            "signature does not verify: forged), by kind", "kind",
                            dict(self.api_key_records))
        if self.store is not None and self.store.value is not None:
            yield GaugeMetricFamily("memstream_store_records", "Memory version records in "
                                    "the store (cached count)", value=self.store.value)


def conflicts(c: Counters) -> int:
    return sum(n for (op, kind), n in c.changes.items() if m.is_conflict(op, kind))


def user_deletions(c: Counters) -> int:
    return sum(n for (op, kind), n in c.changes.items() if m.is_user_deletion(op, kind))


def snapshot(c: Counters, at: float) -> m.Snapshot:
    return m.Snapshot(
        at=at, changes=sum(c.changes.values()),
        adds=sum(n for (op, _), n in c.changes.items() if op == "add"),
        conversation_changes=sum(n for (_, kind), n in c.changes.items()
                                 if kind in m.CONVERSATION_KINDS),
        conflicts=conflicts(c), user_deletions=user_deletions(c),
        consolidation_merges=c.consolidation_merges, retrievals=c.searches,
        retrievals_with_results=c.retrievals_with_results, feedback_used=c.feedback_used,
        feedback_not_useful=c.feedback_not_useful, messages=c.messages,
        llm_calls=c.llm_calls, prompt_tokens=c.prompt_tokens,
        completion_tokens=c.completion_tokens)


def _quantiles(b: m.Buckets) -> Quantiles:
    cumulative = b.cumulative()
    return Quantiles(count=b.count, sum_s=b.total, p50_s=m.quantile(0.5, cumulative),
                     p99_s=m.quantile(0.99, cumulative))


def summary(c: Counters, now: float, store_records: int | None = None,
            lags: Mapping[tuple[str, int], int] | None = None) -> MetricsSummary:
    """The governance metrics since the worker started (its counters began at zero)."""
    snap = snapshot(c, now)
    gov = m.governance(m.Snapshot(at=c.started_at), snap)
    raw = {k: v for k, v in vars(snap).items() if k != "at"}
    return MetricsSummary(
        started_at=datetime.fromtimestamp(c.started_at, UTC), elapsed_s=now - c.started_at,
        governance=GovernanceMetrics(**vars(gov)),
        retrieval_latency=_quantiles(c.retrieval_latency),
        extraction_lag=_quantiles(c.extraction_lag),
        raw=RawCounts(**raw, jobs_by_trigger=dict(c.jobs_by_trigger),
                      trivial_jobs=c.trivial_resolved,
                      dead_letters=dict(c.dead_letters_by_class), store_records=store_records,
                      consumer_lag=sum(lags.values()) if lags else None))


def registry_for(collector: PipelineCollector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)  # not the process-global default
    registry.register(collector)
    return registry


def attach(app: web.Application, p: Pipeline,
           api_key_records: Mapping[str, int] | None = None) -> MetricsDeps:
    """Serve the pipeline's metrics on ``app`` (built by ``web.http.build_http_app``)."""
    # looked up at each count: follows a store the worker switched to (a rebuild)
    store = StoreSize(lambda: p.services.store.count(), p.settings.metrics_store_count_s)

    def lags() -> dict[tuple[str, int], int]:  # the owned loops' (their inputs)
        found: dict[tuple[str, int], int] = {}
        for loop in p.loops:
            found.update(loop.lags())
        return found

    guard = app[DEPS].guard if DEPS in app else None
    keys = p.user_keys
    collector = PipelineCollector(p.counters, lags, store,
                                  guard.counts if guard is not None else None,
                                  (lambda: dict(keys.rejected_kinds)) if keys is not None
                                  else None, api_key_records)
    key = p.settings.metrics_key
    deps = MetricsDeps(
        registry=registry_for(collector),
        metrics_key=key.get_secret_value() if key is not None else None,
        summary=lambda: summary(p.counters, time.time(), store.value, lags()),
        refresh=store.refresh)
    app[METRICS] = deps
    return deps
