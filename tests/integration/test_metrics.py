"""``/metrics`` and ``/v1/metrics/summary`` on a real worker (real broker, HTTP API on):
messages of a fresh tenant become memories, a search is served, then the scrape is parsed
with prometheus_client's own parser. Waits on barriers (job results, metric values), never
on fixed sleeps.
"""

from __future__ import annotations

import aiohttp
import pytest
import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families

from memstream.client import AsyncMemoryClient
from tests.integration.conftest import free_port, running, until, wait_covered

pytestmark = pytest.mark.integration
ADMIN = "admin-key-metrics-1-0123456789abcdef"
METRICS_KEY = "metrics-key-2"
PORT = free_port()
BASE = f"http://127.0.0.1:{PORT}"
TEXTS = ["Remember this: I live in Lisbon", "I am allergic to penicillin",
         "My daughter is called Rita", "I work as a nurse"]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def worker(kafka_bootstrap, tmp_path_factory):
    async with running(kafka_bootstrap, tmp_path_factory.mktemp("metrics"),
                       extract_enabled=True, web_enabled=True, web_port=PORT,
                       admin_key=ADMIN, metrics_key=METRICS_KEY,
                       metrics_store_count_s=0) as h:
        client = AsyncMemoryClient(BASE, ADMIN, tenant_id="probe")

        async def healthy() -> bool | None:
            return True if await client.tools() else None

        await until(healthy, "the API to answer", timeout=120)
        await client.aclose()
        yield h


async def scrape(http: aiohttp.ClientSession, headers: dict[str, str]) -> dict:
    async with http.get(f"{BASE}/metrics", headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = await resp.text()
    return {f.name: f for f in text_string_to_metric_families(text)}


def total(families: dict, family: str, sample: str | None = None) -> float:
    name = sample or family + "_total"
    return sum(s.value for s in families.get(family, ()).samples if s.name == name) \
        if family in families else 0.0


async def test_metrics_count_a_conversation_and_a_search(worker, tenant):
    h, user = worker, "ana"
    async with AsyncMemoryClient(BASE, ADMIN, tenant_id=tenant,
                                 bootstrap_servers=h.settings.bootstrap_servers,
                                 topic_prefix=h.settings.topic_prefix) as client:
        await client.add([{"role": "user", "content": t} for t in TEXTS], user_id=user,
                         session_id="s1")
        await client.end_session(user_id=user, session_id="s1")
        await wait_covered(h, {(user, "s1"): len(TEXTS)}, tenant=tenant)
        memories = await client.get_all(user_id=user)
        assert memories
        found = await client.search(memories[0].content, user_id=user)
        assert found.memories

    key = {"Authorization": f"Bearer {METRICS_KEY}"}
    async with aiohttp.ClientSession() as http:
        for headers in ({}, {"X-API-Key": "wrong"}):
            for path in ("/metrics", "/v1/metrics/summary"):
                async with http.get(f"{BASE}{path}", headers=headers) as resp:
                    assert resp.status == 401, path
        assert (await scrape(http, {"X-API-Key": ADMIN}))  # the admin key opens it too

        async def settled() -> dict | None:  # the job's result and a commit: lag is known
            fams = await scrape(http, key)
            lag = fams.get("memstream_consumer_lag")
            done = total(fams, "memstream_extraction_lag_seconds",
                         "memstream_extraction_lag_seconds_count") >= 1
            return fams if done and lag is not None and lag.samples else None

        fams = await until(settled, "the extraction lag and consumer lag in /metrics")
        async with http.get(f"{BASE}/v1/metrics/summary", headers=key) as resp:
            assert resp.status == 200
            summary = await resp.json()

    assert total(fams, "memstream_messages") >= len(TEXTS)
    assert total(fams, "memstream_memory_changes") >= 1
    adds = [s for s in fams["memstream_memory_changes"].samples
            if s.labels == {"op": "add", "kind": "extraction"}]
    assert adds and adds[0].value >= 1
    assert total(fams, "memstream_retrievals") >= 1
    assert total(fams, "memstream_retrievals_with_results") >= 1  # the memory's own text
    assert total(fams, "memstream_retrieval_latency_seconds",
                 "memstream_retrieval_latency_seconds_count") >= 1
    jobs = {s.labels["trigger"]: s.value for s in fams["memstream_jobs"].samples
            if s.name == "memstream_jobs_total"}
    assert sum(jobs.values()) >= 1 and set(jobs) <= {"threshold", "session_end", "explicit",
                                                     "idle", "tool"}
    assert total(fams, "memstream_store_records", "memstream_store_records") >= len(adds)
    assert all(s.labels["topic"].startswith(h.settings.topic_prefix)
               for s in fams["memstream_consumer_lag"].samples)
    for family in fams.values():  # no tenant, no user, no content in any label
        for s in family.samples:
            for value in s.labels.values():
                assert tenant not in value and user not in value and "Lisbon" not in value

    raw = summary["raw"]
    assert raw["messages"] == total(fams, "memstream_messages")
    assert raw["changes"] == total(fams, "memstream_memory_changes")
    assert raw["retrievals"] == total(fams, "memstream_retrievals")
    assert summary["governance"]["hit_rate"] == pytest.approx(
        raw["retrievals_with_results"] / raw["retrievals"])
    assert summary["retrieval_latency"]["count"] >= 1
    assert summary["retrieval_latency"]["p99_s"] >= summary["retrieval_latency"]["p50_s"] > 0
    assert raw["jobs_by_trigger"] == {k: int(v) for k, v in jobs.items()}
