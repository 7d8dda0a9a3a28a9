"""The metrics of SPEC §8: the pure computations (memory.governance_metrics), the counting
done by the stages, the Prometheus collector (names, labels, values) and the two HTTP routes."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from memstream.contract.http_api.api import Principal
from memstream.core.errors import InvalidRecord
from memstream.memory import coalescing as machine
from memstream.memory import governance_metrics as m
from memstream.memory.ingest_state import Policy, UserState
from memstream.streams.apply import count_applied
from memstream.streams.counters import Counters
from memstream.streams.dead_letters import set_aside
from memstream.streams.extract import count_spend
from memstream.streams.stage import Work
from memstream.topics.schemas import JobDecision, JobStatus, Lineage, MemoryChange
from memstream.web import prometheus as sm
from memstream.web.http import build_http_app
from memstream.web.prometheus import METRICS, MetricsDeps
from tests.unit.builders import msg, result

pytestmark = pytest.mark.unit

METRICS_KEY = "metrics-key-123"
ADMIN_KEY = "admin-key-456-0123456789abcdef0123"
TENANT_KEY = "tenant-key-789"
# what a label may be called; values come from fixed sets or are topics / partitions
ALLOWED_LABELS = {"op": m.CHANGE_OPS | {"other"}, "kind": m.LINEAGE_KINDS | {"other",
                  "prompt", "completion"}, "verdict": {"used", "not_useful"},
                  "trigger": m.TRIGGERS | {"other"}, "status": {"done", "failed", "fenced"},
                  "reason_class": m.DEAD_LETTER_CLASSES | {"other"}, "le": None,
                  "topic": None, "partition": None}


# --- pure computations ---------------------------------------------------------------
def test_ratios_and_rates_never_divide_by_zero():
    assert m.ratio(3, 0) is None and m.ratio(0, 0) is None and m.ratio(1, 4) == 0.25
    assert m.per_day(0, 10, 0) is None and m.per_day(0, 10, -5) is None
    assert m.per_day(0, 10, m.MIN_WINDOW_S - 1) is None  # too short a window to project
    assert m.per_day(100, 150, m.DAY_S / 2) == 100.0
    assert m.per_day(100, 30, m.DAY_S) == 30.0  # a restart: the counter began again at 0
    assert m.increase(5, 9) == 4 and m.increase(9, 2) == 2


def snap(at: float, **kw: int) -> m.Snapshot:
    return m.Snapshot(at=at, **kw)


def test_the_six_governance_metrics():
    before = snap(0, changes=50, adds=40, conversation_changes=40, conflicts=4,
                  user_deletions=1, consolidation_merges=2, retrievals=100,
                  retrievals_with_results=20, feedback_used=3, feedback_not_useful=1,
                  messages=10, llm_calls=5, prompt_tokens=500, completion_tokens=100)
    after = snap(m.DAY_S, changes=550, adds=240, conversation_changes=240, conflicts=54,
                 user_deletions=21, consolidation_merges=12, retrievals=200,
                 retrievals_with_results=45, feedback_used=9, feedback_not_useful=3,
                 messages=110, llm_calls=30, prompt_tokens=2500, completion_tokens=600)
    g = m.governance(before, after)
    assert g.write_volume_per_day == 500.0  # ×10 the day before: the alert's case
    assert g.hit_rate == 0.25  # below 30%: the store does not match needs
    assert g.feedback_useful_rate == 0.75
    assert g.conflict_rate == 0.25  # 50 conflicts / 200 conversation changes
    assert g.user_deletion_rate == 0.1  # 20 deleted / 200 added
    assert g.consolidation_per_day == 10.0
    assert g.llm_calls_per_message == 0.25 and g.tokens_per_message == 25.0


def test_governance_without_data_is_none_not_an_error():
    g = m.governance(snap(10), snap(10))
    assert all(v is None for v in vars(g).values())
    g = m.governance(snap(0), snap(m.MIN_WINDOW_S, retrievals=4))
    assert g.hit_rate == 0.0 and g.write_volume_per_day == 0.0 and g.conflict_rate is None


def test_buckets_and_quantiles_as_histogram_quantile():
    b = m.Buckets((0.1, 0.2, 0.4))
    for v in (0.05, 0.15, 0.15, 0.3, -1.0, math.nan):  # a negative counts as 0, NaN not
        b.observe(v)
    assert b.counts == [2, 2, 1, 0] and b.count == 5
    assert b.cumulative() == [(0.1, 2), (0.2, 4), (0.4, 5), (math.inf, 5)]
    assert m.quantile(0.5, b.cumulative()) == pytest.approx(0.125)  # rank 2.5 in (0.1, 0.2]
    assert m.quantile(0.99, b.cumulative()) == pytest.approx(0.2 + 0.2 * 0.95)
    assert m.quantile(0.0, b.cumulative()) == 0.0
    b.observe(9.0)  # beyond the last bound: the highest finite bound, as PromQL says
    assert m.quantile(0.99, b.cumulative()) == 0.4


def test_quantiles_without_observations_are_none():
    assert m.quantile(0.5, m.Buckets(m.LATENCY_BUCKETS).cumulative()) is None
    assert m.quantile(0.5, []) is None
    with pytest.raises(ValueError):
        m.quantile(1.5, [(1.0, 1)])
    with pytest.raises(ValueError):
        m.Buckets((0.2, 0.1))


def test_labels_are_bounded_to_fixed_sets():
    assert m.bounded("schema", m.DEAD_LETTER_CLASSES) == "schema"
    assert m.bounded("user alice@example.com said", m.DEAD_LETTER_CLASSES) == "other"
    assert m.is_conflict("update", "extraction") and m.is_conflict("delete", "tool")
    assert not m.is_conflict("add", "extraction") and not m.is_conflict("update", "decay")
    assert m.is_user_deletion("delete", "deletion") and not m.is_user_deletion("delete", "decay")


# --- extraction lag --------------------------------------------------------------------
def in_flight() -> tuple[UserState, object]:
    policy = Policy(min_new_messages=2, context_messages=0)
    state = UserState("t1", "u1")
    step = None
    for minute in (1, 3):
        step = machine.on_message(state, msg(minute=minute), 0.0, policy)
        state = step.state
    assert step is not None and len(step.jobs) == 1
    return state, step.jobs[0]


def test_extraction_lag_is_from_the_newest_message_to_the_result():
    state, job = in_flight()
    newest = datetime(2026, 1, 1, 0, 3, tzinfo=UTC).timestamp()
    assert m.extraction_lag(state, result(job, now=newest + 42.5)) == 42.5
    assert m.extraction_lag(state, result(job, now=newest - 5)) == 0.0  # clock skew


def test_extraction_lag_only_for_the_job_in_flight_and_done():
    state, job = in_flight()
    assert m.extraction_lag(state, result(job, JobStatus.FAILED, 1e9)) is None
    assert m.extraction_lag(state, result(job.model_copy(update={"job_id": "x"}), now=1e9)) \
        is None
    done = machine.on_result(state, result(job, now=1e9), 1e9, Policy()).state
    assert m.extraction_lag(done, result(job, now=1e9)) is None  # replayed: none in flight


# --- counting in the stages ------------------------------------------------------------
def change(op: str, kind: str, n: int = 0) -> MemoryChange:
    return MemoryChange(
        change_id=f"c{op}{kind}{n}", op=op, tenant_id="acme", user_id="u1", memory_id="m",
        version=1, before=None, after={}, records=[], model="rules", prompt_version="1",
        lineage=Lineage(session_id="s", from_seq=0, to_seq=1, job_id="j", kind=kind),
        decided_at=datetime.now(UTC))


def decision(**kw: object) -> JobDecision:
    return JobDecision(job_id="j", tenant_id="acme", user_id="u1", session_id="s",
                       from_seq=0, to_seq=1, status=JobStatus.DONE, **kw)


def test_applied_changes_merges_and_spend_are_counted():
    c = Counters()
    count_applied(c, decision(decisions={"merged": 2}),
                  [change("add", "extraction"), change("update", "extraction", 1),
                   change("delete", "deletion"), change("update", "consolidation")])
    count_spend(c, decision(llm_calls=3, prompt_tokens=100, completion_tokens=20))
    assert c.changes == {("add", "extraction"): 1, ("update", "extraction"): 1,
                         ("delete", "deletion"): 1, ("update", "consolidation"): 1}
    assert c.consolidation_merges == 2 and sm.conflicts(c) == 1 and sm.user_deletions(c) == 1
    assert (c.llm_calls, c.prompt_tokens, c.completion_tokens) == (3, 100, 20)


def test_dead_letters_are_counted_by_a_bounded_reason_class():
    p = SimpleNamespace(topics=SimpleNamespace(dead_letters=SimpleNamespace(name="t.dlq")),
                        counters=Counters(), clock=lambda: 1e9)
    record = SimpleNamespace(topic="t.messages", partition=0, offset=1, key=b"a/b", value=b"")
    work = Work()
    for kind in ("schema", "schema", "the user's secret text"):
        set_aside(p, work, InvalidRecord(kind, "bad"), record)
    assert p.counters.dead_letters_by_class == {"schema": 2, "other": 1}
    assert p.counters.dead_letters == 3 and len(work.out) == 3


# --- the collector -----------------------------------------------------------------------
def busy_counters() -> Counters:
    c = Counters(messages=7, searches=4, retrievals_with_results=3, feedback_used=1,
                 llm_calls=2, prompt_tokens=50, completion_tokens=9, trivial_resolved=1)
    count_applied(c, decision(), [change("add", "extraction"), change("update", "tool")])
    c.jobs_by_trigger["threshold"] = 2
    c.dead_letters_by_class["schema"] = 1
    c.records_unauthenticated["tool-requests"] = 3
    c.retrieval_latency.observe(0.004)
    c.extraction_lag.observe(12.0)
    return c


def scrape(c: Counters, lags: dict | None = None, store: sm.StoreSize | None = None) -> dict:
    collector = sm.PipelineCollector(c, lambda: lags or {}, store)
    text = generate_latest(sm.registry_for(collector)).decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(families: dict, sample: str, **labels: str) -> float:
    name = sample.removesuffix("_total").removesuffix("_bucket").removesuffix("_count")
    name = name.removesuffix("_sum")
    return sum(s.value for s in families[name].samples
               if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()))


def test_the_collector_exposes_the_counters():
    fams = scrape(busy_counters(), {("it.memstream.messages", 1): 5})
    assert value(fams, "memstream_messages_total") == 7
    assert value(fams, "memstream_memory_changes_total", op="add", kind="extraction") == 1
    assert value(fams, "memstream_conflicts_total") == 1
    assert value(fams, "memstream_retrievals_total") == 4
    assert value(fams, "memstream_retrievals_with_results_total") == 3
    assert value(fams, "memstream_feedback_total", verdict="used") == 1
    assert value(fams, "memstream_llm_tokens_total", kind="prompt") == 50
    assert value(fams, "memstream_jobs_total", trigger="threshold") == 2
    assert value(fams, "memstream_trivial_jobs_total") == 1
    assert value(fams, "memstream_dead_letters_total", reason_class="schema") == 1
    assert value(fams, "memstream_records_unauthenticated_total", topic="tool-requests") == 3
    assert value(fams, "memstream_retrieval_latency_seconds_count") == 1
    assert value(fams, "memstream_retrieval_latency_seconds_bucket", le="0.005") == 1
    assert value(fams, "memstream_retrieval_latency_seconds_bucket", le="0.0025") == 0
    assert value(fams, "memstream_extraction_lag_seconds_sum") == 12.0
    assert value(fams, "memstream_consumer_lag", topic="it.memstream.messages",
                 partition="1") == 5
    assert fams["memstream_messages"].type == "counter"
    assert fams["memstream_retrieval_latency_seconds"].type == "histogram"
    assert "memstream_store_records" not in fams  # never counted yet: absent, not 0


def test_set_aside_user_key_records_are_counted_by_kind():
    kinds = {"unsigned": 2, "undecryptable": 1}
    collector = sm.PipelineCollector(Counters(), key_records=lambda: kinds)
    text = generate_latest(sm.registry_for(collector)).decode()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    assert value(fams, "memstream_user_key_records_rejected_total", kind="unsigned") == 2
    assert value(fams, "memstream_user_key_records_rejected_total", kind="undecryptable") == 1
    assert "memstream_user_key_records_rejected" not in scrape(Counters())  # no keys here


def test_set_aside_api_key_records_are_counted_by_kind():
    rejected: dict[str, int] = {}  # the follower's live dict: a scrape reads it as it is now
    collector = sm.PipelineCollector(Counters(), api_key_records=rejected)
    rejected["unsigned"] = 3
    text = generate_latest(sm.registry_for(collector)).decode()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    assert value(fams, "memstream_api_key_records_rejected_total", kind="unsigned") == 3
    assert "memstream_api_key_records_rejected" not in scrape(Counters())  # no follower


def test_every_label_is_from_a_fixed_set_and_carries_no_id():
    fams = scrape(busy_counters(), {("it.memstream.messages", 0): 1})
    for family in fams.values():
        for sample in family.samples:
            for label, val in sample.labels.items():
                assert label in ALLOWED_LABELS, (family.name, label)
                allowed = ALLOWED_LABELS[label]
                assert allowed is None or val in allowed, (family.name, label, val)
                assert "acme" not in val and "u1" not in val


async def test_the_store_size_is_cached_and_a_failure_keeps_the_last_value():
    now, calls = [0.0], []

    def count() -> int:
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("store down")
        return 10 * len(calls)

    store = sm.StoreSize(count, 30.0, clock=lambda: now[0])
    await store.refresh()
    await store.refresh()  # within 30 s: the cached value
    assert store.value == 10 and len(calls) == 1
    now[0] = 31.0
    await store.refresh()
    assert store.value == 20
    now[0] = 62.0
    await store.refresh()
    assert store.value == 20 and len(calls) == 3
    assert value(scrape(Counters(), store=store), "memstream_store_records") == 20


def test_the_summary_matches_the_counters():
    c = busy_counters()
    s = sm.summary(c, c.started_at + m.DAY_S, store_records=5, lags={("t", 0): 2})
    assert s.raw.changes == 2 and s.raw.conflicts == 1 and s.raw.retrievals == 4
    assert s.governance.write_volume_per_day == pytest.approx(2.0)
    assert s.governance.hit_rate == 0.75 and s.governance.conflict_rate == 0.5
    assert s.governance.llm_calls_per_message == pytest.approx(2 / 7)
    assert s.retrieval_latency.count == 1 and s.retrieval_latency.p50_s is not None
    assert s.raw.jobs_by_trigger == {"threshold": 2} and s.raw.consumer_lag == 2
    assert s.raw.store_records == 5 and s.extraction_lag.p99_s is not None


# --- the routes --------------------------------------------------------------------------
class Keys:
    def authorise(self, presented: str) -> Principal | None:
        return {ADMIN_KEY: Principal(key_id="admin", admin=True),
                TENANT_KEY: Principal(key_id="k", tenant_id="acme")}.get(presented)


def app_with_metrics(attach: bool = True):
    app = build_http_app(SimpleNamespace(ready=lambda: True), Keys())  # type: ignore[arg-type]
    c = busy_counters()

    async def refresh() -> None:
        return None

    if attach:
        app[METRICS] = MetricsDeps(sm.registry_for(sm.PipelineCollector(c)), METRICS_KEY,
                                   lambda: sm.summary(c, c.started_at + 60), refresh)
    return app


@pytest.mark.parametrize("headers,status", [
    ({}, 401), ({"Authorization": "Bearer wrong"}, 401), ({"X-API-Key": TENANT_KEY}, 401),
    ({"Authorization": f"Bearer {METRICS_KEY}"}, 200), ({"X-API-Key": METRICS_KEY}, 200),
    ({"Authorization": f"Bearer {ADMIN_KEY}"}, 200)])
async def test_metrics_answer_the_metrics_key_or_the_admin_key(headers, status):
    async with TestClient(TestServer(app_with_metrics())) as client:
        for path in ("/metrics", "/v1/metrics/summary"):
            resp = await client.get(path, headers=headers)
            assert resp.status == status, path
    if status == 401:
        assert resp.headers["WWW-Authenticate"] == "Bearer"


async def test_metrics_are_prometheus_text_and_the_summary_json():
    async with TestClient(TestServer(app_with_metrics())) as client:
        resp = await client.get("/metrics", headers={"X-API-Key": METRICS_KEY})
        assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        fams = {f.name: f for f in text_string_to_metric_families(await resp.text())}
        assert value(fams, "memstream_messages_total") == 7
        body = await (await client.get("/v1/metrics/summary",
                                       headers={"X-API-Key": METRICS_KEY})).json()
    assert body["raw"]["messages"] == 7 and body["governance"]["hit_rate"] == 0.75


async def test_an_app_without_metrics_says_so_to_the_admin_only():
    async with TestClient(TestServer(app_with_metrics(attach=False))) as client:
        assert (await client.get("/metrics", headers={"X-API-Key": METRICS_KEY})).status == 401
        assert (await client.get("/metrics", headers={"X-API-Key": ADMIN_KEY})).status == 503
