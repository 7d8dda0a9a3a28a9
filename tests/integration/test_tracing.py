"""One trace per message (docs/tracing.md, core/tracing.py): a chat message produced with a
W3C ``traceparent`` header, and one without, each reach their memory change event in one
trace (ingest -> job -> extract -> LLM -> apply -> change), the change event's
``traceparent`` header continuing it, exactly once though a transaction of the trace was
aborted and its records read again.

The stages run in their owned loops in this process (built as the worker builds them), so
the SDK's in-memory exporter sees every span; the LLM is the scripted OpenAI-compatible
server (memstream.dev.openai_stub). Redelivery: the first apply transaction that carries a
change event (of the message with a header) and the first ingest transaction that carries
a job (of the message without) fail before their commit; their loops read the batches
again from the committed offsets.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest
from aiokafka.errors import KafkaConnectionError
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from memstream.core import tracing
from memstream.core.kafka_io import TopicReader
from memstream.dev.openai_stub import OpenAITestServer, chat_json
from memstream.streams.app import build_app
from memstream.topics.schemas import MemoryChange
from tests.integration.conftest import chat, until

pytestmark = pytest.mark.integration

PRODUCER_TRACE = 0x4BF92F3577B34DA6A3CE929D0E0E4736
PRODUCER_SPAN = 0x00F067AA0BA902B7
BERLIN = {"changes": [{"op": "ADD", "fact": {"text": "Lives in Berlin", "importance": 7,
                                             "slot": "residence"}}]}


def fail_once(loop: Any, carries: Callable[[list[Any]], bool], failed: list[str]) -> None:
    """The first transaction of ``loop`` whose records ``carries`` fails before its commit
    (its records sent, the commit refused): the loop renews its producer and reads the
    batch again."""
    real = loop._transaction

    async def flaky(task: Any, work: Any, offsets: Any) -> Any:
        if failed or not carries(work.out):
            return await real(task, work, offsets)
        failed.append(loop.stage.name)
        producer = task.producer

        async def refused() -> None:
            raise KafkaConnectionError("commit refused (test)")

        producer.commit_transaction = refused
        return await real(task, work, offsets)

    loop._transaction = flaky


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    yield exporter
    tracing.shutdown()


def trace_of(record: Any) -> tuple[int, int, int] | None:
    return tracing.parse_traceparent(tracing.header(record.headers, tracing.TRACEPARENT))


async def test_one_trace_per_message_exactly_once_under_redelivery(harness, tenant, spans):
    with OpenAITestServer(responder=lambda body: chat_json(
            BERLIN, prompt_tokens=321, completion_tokens=12)) as llm:
        h = await harness(extract_enabled=True, embedder="hashing", llm="openai",
                          llm_base_url=llm.url, llm_api_key="sk-test", llm_model="test-model",
                          llm_mode="combined", min_new_messages=1, jobs_enabled=False,
                          store_partitioned=False, archive=False)
        tracing.configure(h.settings, exporter=spans)
        p = build_app(h.settings)
        fatal: list[str] = []
        loops = {loop.stage.name: loop for loop in p.loops}
        for loop in loops.values():
            loop.on_fatal = lambda reason, code=70: fatal.append(reason)
        t = h.topics
        failed: list[str] = []
        fail_once(loops["apply"], lambda out: any(
            r[0] == t.memory_changes.name and b'"user_id":"traced"' in r[2] for r in out), failed)
        ingest_failed: list[str] = []
        fail_once(loops["ingest"], lambda out: any(
            r[0] == t.jobs.name and b'"user_id":"plain"' in r[2] for r in out), ingest_failed)
        changes = await TopicReader(h.settings, t.memory_changes.name).start()
        try:
            for loop in loops.values():
                await loop.start()
            parent = tracing.format_traceparent(PRODUCER_TRACE, PRODUCER_SPAN, 1)
            traced_msg = chat("I moved to Berlin last month and I love it here",
                              tenant=tenant, user="traced")
            await h.producer.send_and_wait(
                t.messages.name, traced_msg.dumps(), traced_msg.key().encode(),
                headers=[("traceparent", parent), ("tracestate", b"vendor=abc")])
            plain_msg = chat("I moved to Berlin last month and I love it here",
                             tenant=tenant, user="plain")
            plain_meta = await h.producer.send_and_wait(
                t.messages.name, plain_msg.dumps(), plain_msg.key().encode())

            def of(user: str) -> list[Any]:
                return [r for r in changes.records
                        if MemoryChange.model_validate_json(r.value).user_id == user]

            await changes.wait_for(lambda rs: of("traced") and of("plain"), timeout=90)
            await changes.settle(2.0)
            assert not fatal
            assert failed == ["apply"] and ingest_failed == ["ingest"]  # both redelivered

            # the message with a traceparent: its change event, once, in the producer's trace
            (change,) = of("traced")
            assert trace_of(change)[0] == PRODUCER_TRACE
            assert tracing.header(change.headers, tracing.TRACESTATE) == b"vendor=abc"
            chain = await until(lambda: _chain(spans, PRODUCER_TRACE, trace_of(change)[1]),
                                "the committed spans of the traced message")
            ingest, job, extract, llm_span, apply, sent = chain
            assert ingest.parent.span_id == PRODUCER_SPAN and ingest.parent.is_remote
            assert ingest.attributes["messaging.system"] == "kafka"
            assert ingest.attributes["messaging.destination.name"] == t.messages.name
            assert job.attributes["memstream.job.reason"]
            assert llm_span.attributes["gen_ai.request.model"] == "test-model"
            assert llm_span.attributes["gen_ai.operation.name"] == "chat"
            assert llm_span.attributes["gen_ai.usage.input_tokens"] == 321
            assert llm_span.attributes["gen_ai.usage.output_tokens"] == 12
            assert llm_span.attributes["memstream.llm.latency_ms"] >= 0
            assert extract.attributes["memstream.job.status"] == "done"
            # read again, the decision the store took is answered from its kept events
            assert apply.attributes["memstream.apply.verdict"] == "republish"
            assert sent.attributes["memstream.change.op"] == "add"
            # the aborted apply attempt: its spans in the same trace, marked
            aborted = [s for s in spans.get_finished_spans()
                       if s.context.trace_id == PRODUCER_TRACE
                       and s.attributes.get(tracing.TRANSACTION) == "aborted"]
            assert {s.name for s in aborted} >= {"apply", "change"}
            assert all(not s.status.is_ok for s in aborted)
            committed_changes = [s for s in spans.get_finished_spans()
                                 if s.context.trace_id == PRODUCER_TRACE and s.name == "change"
                                 and s.attributes[tracing.TRANSACTION] == "committed"]
            assert len(committed_changes) == 1

            # the message without one: a trace started at ingest, kept through the redelivery
            (change,) = of("plain")
            expected = tracing.record_trace_id(h.settings.app_id, t.messages.name,
                                               plain_meta.partition, plain_meta.offset)
            assert trace_of(change)[0] == expected
            chain = await until(lambda: _chain(spans, expected, trace_of(change)[1]),
                                "the committed spans of the plain message")
            assert chain[0].parent is None  # the root: started at ingest
            ingests = [s for s in spans.get_finished_spans()
                       if s.context.trace_id == expected and s.name == "ingest"
                       and s.attributes["messaging.destination.name"] == t.messages.name]
            assert sorted(s.attributes[tracing.TRANSACTION] for s in ingests) == [
                "aborted", "committed"]
        finally:
            await changes.stop()
            await asyncio.gather(*(loop.stop() for loop in loops.values()))
            p.services.store.close()


async def _chain(exporter: InMemorySpanExporter, trace_id: int, last: int) -> list[Any] | None:
    """The committed spans from the change event's span (``last``) up to the ingest span,
    each the parent of the next: ingest, job, extract, the LLM call, apply, change."""
    found = {s.context.span_id: s for s in exporter.get_finished_spans()
             if s.context.trace_id == trace_id}
    if last not in found:
        return None
    chain = [found[last]]
    while chain[0].parent is not None and chain[0].parent.span_id in found:
        chain.insert(0, found[chain[0].parent.span_id])
    names = [s.name for s in chain]
    if names != ["ingest", "job", "extract", "apply", "change"]:
        return None
    llm = [s for s in found.values() if s.name == "chat test-model"
           and s.parent is not None and s.parent.span_id == chain[2].context.span_id]
    assert len(llm) == 1, [s.name for s in found.values()]
    assert all(s.attributes[tracing.TRANSACTION] == "committed" for s in chain)
    return [*chain[:3], llm[0], *chain[3:]]


async def test_a_worker_process_logs_json_lines_and_writes_its_spans(harness, tenant):
    """``memstream worker`` with MEMSTREAM_TRACING=console and MEMSTREAM_LOG_FORMAT=json:
    its spans (one JSON line each) continue the producer's trace; its log lines are JSON."""
    h = await harness(tracing="console", log_format="json")
    worker = h.worker()
    msg = chat("I moved to Berlin last month", tenant=tenant)
    parent = tracing.format_traceparent(PRODUCER_TRACE, PRODUCER_SPAN, 1)
    await h.producer.send_and_wait(h.topics.messages.name, msg.dumps(), msg.key().encode(),
                                   headers=[("traceparent", parent)])
    await h.ingested(1, timeout=60)

    async def exported() -> list[dict[str, Any]] | None:
        found = []
        for line in worker.log_path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                found.append(json.loads(line))
        spans = [s for s in found if s.get("name") == "ingest"
                 and s["context"]["trace_id"] == f"0x{PRODUCER_TRACE:032x}"]
        logs = [s for s in found if "level" in s and "logger" in s]
        return found if spans and logs else None

    await until(exported, "the ingest span and JSON log lines in the worker's log")
