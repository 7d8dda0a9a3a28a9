"""core/tracing.py without Kafka: the W3C header's parse and format, the disabled path
(nothing read, nothing added), a job's parent and links, the spans of a record and the
ones it sends, a batch's spans settled, the LLM span's attributes, JSON log lines with the
trace ids."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from memstream.core import json_log, tracing
from memstream.core.settings import Settings

pytestmark = pytest.mark.unit

W3C = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"  # the spec's example
TRACE, SPAN = 0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7


@pytest.fixture
def exporter():
    found = InMemorySpanExporter()
    tracing.configure(Settings(), exporter=found)
    yield found
    tracing.shutdown()


def record(headers=(), topic="p.messages", partition=1, offset=7):
    return SimpleNamespace(topic=topic, partition=partition, offset=offset, headers=headers)


# --- the header ------------------------------------------------------------------------------

def test_the_specs_example_parses_and_formats_back():
    assert tracing.parse_traceparent(W3C) == (TRACE, SPAN, 1)
    assert tracing.parse_traceparent(W3C.decode()) == (TRACE, SPAN, 1)
    assert tracing.format_traceparent(TRACE, SPAN, 1) == W3C
    assert tracing.format_traceparent(1, 2, 0) == (
        b"00-00000000000000000000000000000001-0000000000000002-00")


@pytest.mark.parametrize("value", [
    None, b"", b"garbage", b"\xff\xfe",
    b"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # version ff: invalid
    b"00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # all-zero trace id
    b"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # all-zero span id
    b"00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01",  # upper case
    b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",  # 00 with more
    b"00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",  # short trace id
])
def test_invalid_values_are_no_parent(value):
    assert tracing.parse_traceparent(value) is None


def test_a_later_version_may_carry_more_fields():
    later = W3C.replace(b"00-", b"01-", 1) + b"-whatever"
    assert tracing.parse_traceparent(later) == (TRACE, SPAN, 1)


def test_the_first_header_of_the_name_is_taken():
    headers = [("x", b"1"), ("traceparent", W3C), ("traceparent", b"other")]
    assert tracing.header(headers, "traceparent") == W3C
    assert tracing.header(None, "traceparent") is None


def test_a_record_without_header_has_a_trace_id_of_its_place_in_the_log():
    one = tracing.record_trace_id("app", "t", 0, 5)
    assert one == tracing.record_trace_id("app", "t", 0, 5)  # read again: the same trace
    assert one != tracing.record_trace_id("app", "t", 0, 6)
    assert one != tracing.record_trace_id("app", "t", 1, 5)
    assert 0 < one < 2 ** 128


# --- a job's parent and links ------------------------------------------------------------------

def test_the_trigger_is_the_parent_and_the_other_messages_links():
    assert tracing.choose_parent("m3", ["m1", "m2", "m3"], "old", "r") == ("m3", ["m1", "m2"])


def test_without_trigger_the_newest_message_is_the_parent():
    assert tracing.choose_parent(None, ["m1", "m2"], "old", "r") == ("m2", ["m1"])


def test_a_resent_job_continues_its_earlier_attempt_then_the_record_in_hand():
    assert tracing.choose_parent(None, [], "old", "r") == ("old", [])
    assert tracing.choose_parent(None, [], None, "r") == ("r", [])
    assert tracing.choose_parent(None, [], None, None) == (None, [])


def test_message_traces_are_bounded_and_taken_by_the_job():
    traces = tracing.MessageTraces(per_user=2, users=2)
    for n in range(3):
        traces.seen(b"u", ("t", 0, n), f"m{n}")
    traces.seen(b"u", ("t", 0, 2), "m2-again")  # read again: replaces, no duplicate
    assert traces.parent_of_job(b"u", "j", None, None) == ("m2-again", ["m1"])
    assert traces.parent_of_job(b"u", "j", None, "result") == ("result", [])  # taken
    traces.sent("j", "job-ctx")
    assert traces.parent_of_job(b"u", "j", None, "result") == ("job-ctx", [])  # re-sent
    for user in (b"a", b"b", b"c"):
        traces.seen(user, ("t", 0, 0), "x")
    assert traces.parent_of_job(b"a", "k", None, None) == (None, [])  # the oldest user out


# --- off -------------------------------------------------------------------------------------

class Untouchable:
    """Headers that fail when read: the disabled path must not look at them."""

    def __iter__(self):
        raise AssertionError("headers read while tracing is off")


def test_off_reads_no_header_and_adds_none():
    tracing.shutdown()
    assert not tracing.enabled()
    spans: list[object] = []
    assert tracing.consume("ingest", record(Untouchable()), spans) is None
    assert tracing.produce("job", None, "t", spans) is None
    assert spans == []
    out = ("t", b"k", b"v")
    assert tracing.traced(out, None) is out
    assert tracing.headers(None) == ()
    with tracing.active(None), tracing.llm_call("m", "p") as span:
        assert span is None
    traces = tracing.MessageTraces()
    traces.seen(b"u", ("t", 0, 1), None)
    assert tracing.job(traces, b"u", "j", None, None, "t", spans) is None


def test_off_by_default_in_settings():
    assert Settings().tracing == "off"
    tracing.configure(Settings())
    assert not tracing.enabled()


def test_otlp_honours_the_endpoint_setting():
    tracing.configure(Settings(tracing="otlp", otlp_endpoint="http://collector:4318"))
    try:
        processor = tracing._provider._active_span_processor._span_processors[0]
        assert processor._batch_processor._exporter._endpoint == (
            "http://collector:4318/v1/traces")
    finally:
        tracing.shutdown()


def test_otlp_without_the_exporter_installed_is_a_config_error(monkeypatch):
    import sys

    from memstream.core.errors import ConfigError

    monkeypatch.setitem(sys.modules,
                        "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
    with pytest.raises(ConfigError, match=r"memstream\[otlp\]"):
        tracing.configure(Settings(tracing="otlp"))
    assert not tracing.enabled()


# --- on --------------------------------------------------------------------------------------

def test_a_record_with_traceparent_continues_the_producers_trace(exporter):
    spans: list[object] = []
    span = tracing.consume("ingest", record([("traceparent", W3C),
                                             ("tracestate", b"vendor=abc")]), spans)
    ctx = span.get_span_context()
    assert ctx.trace_id == TRACE and spans == [span]
    out = tracing.traced(("t", b"k", b"v"), span)
    assert out[:3] == ("t", b"k", b"v")
    assert dict(out[3]) == {"traceparent": tracing.format_traceparent(TRACE, ctx.span_id, 1),
                            "tracestate": b"vendor=abc"}
    tracing.settle(spans, "committed")
    (done,) = exporter.get_finished_spans()
    assert done.parent.span_id == SPAN and done.parent.is_remote
    assert done.attributes["messaging.system"] == "kafka"
    assert done.attributes["messaging.destination.name"] == "p.messages"
    assert done.attributes["messaging.destination.partition.id"] == "1"
    assert done.attributes["messaging.kafka.offset"] == 7
    assert done.attributes[tracing.TRANSACTION] == "committed"
    assert spans == []


def test_a_record_without_traceparent_starts_a_trace_of_its_place(exporter):
    spans: list[object] = []
    first = tracing.consume("ingest", record([("traceparent", b"bad")]), spans, "app")
    again = tracing.consume("ingest", record(), spans, "app")  # read again (aborted)
    expected = tracing.record_trace_id("app", "p.messages", 1, 7)
    assert first.get_span_context().trace_id == expected == again.get_span_context().trace_id
    assert first.get_span_context().span_id != again.get_span_context().span_id
    other = tracing.consume("ingest", record(), spans, "other-app")
    assert other.get_span_context().trace_id != expected


def test_an_aborted_batchs_spans_are_marked(exporter):
    spans: list[object] = []
    tracing.consume("apply", record(), spans)
    tracing.settle(spans, "aborted")
    (done,) = exporter.get_finished_spans()
    assert done.attributes[tracing.TRANSACTION] == "aborted"
    assert done.status.status_code == StatusCode.ERROR


def test_a_job_continues_its_trigger_and_links_the_other_messages(exporter):
    spans: list[object] = []
    traces = tracing.MessageTraces()
    m1 = tracing.consume("ingest", record(offset=1), spans)
    m2 = tracing.consume("ingest", record(offset=2), spans)
    m2_again = tracing.consume("ingest", record(offset=2), spans)  # the batch read again
    for where, span in ((1, m1), (2, m2), (2, m2_again)):
        traces.seen(b"u", ("p.messages", 1, where), tracing.context_of(span))
    job = tracing.job(traces, b"u", "j1", m2_again, m2_again, "p.jobs", spans,
                      memstream__job__id="j1")
    tracing.settle(spans, "committed")
    done = {s.context.span_id: s for s in exporter.get_finished_spans()}
    sent = done[job.get_span_context().span_id]
    assert sent.parent.span_id == m2_again.get_span_context().span_id
    assert [link.context for link in sent.links] == [m1.get_span_context()]
    assert sent.attributes["memstream.job.id"] == "j1"
    assert sent.attributes["messaging.operation.type"] == "send"
    # the job re-sent by a timer (no message since): its earlier attempt's trace
    spans = []
    again = tracing.job(traces, b"u", "j1", None, None, "p.jobs", spans)
    assert again.get_span_context().trace_id == job.get_span_context().trace_id
    tracing.settle(spans, "committed")


def test_the_llm_span_carries_model_tokens_and_latency(exporter):
    spans: list[object] = []
    parent = tracing.consume("extract", record(), spans)
    with tracing.active(parent), tracing.llm_call("gpt-x", "CombinedReply") as span:
        tracing.llm_usage(span, "gpt-x-2025", 321, 12)
    with pytest.raises(TimeoutError), tracing.active(parent), tracing.llm_call("gpt-x", "C"):
        raise TimeoutError
    tracing.settle(spans, "committed")
    ok, failed = [s for s in exporter.get_finished_spans() if s.name == "chat gpt-x"]
    assert ok.parent.span_id == parent.get_span_context().span_id
    assert ok.attributes["gen_ai.operation.name"] == "chat"
    assert ok.attributes["gen_ai.request.model"] == "gpt-x"
    assert ok.attributes["gen_ai.response.model"] == "gpt-x-2025"
    assert ok.attributes["gen_ai.usage.input_tokens"] == 321
    assert ok.attributes["gen_ai.usage.output_tokens"] == 12
    assert ok.attributes["memstream.llm.latency_ms"] >= 0
    assert failed.status.status_code == StatusCode.ERROR
    assert failed.attributes["error.type"] == "TimeoutError"


# --- log lines -------------------------------------------------------------------------------

def _line(logger_name: str = "memstream.test") -> logging.LogRecord:
    return logging.LogRecord(logger_name, logging.WARNING, __file__, 1, "job %s failed",
                             ("j1",), None)


def test_json_log_lines_carry_the_current_trace_and_span(exporter):
    spans: list[object] = []
    span = tracing.consume("extract", record(), spans)
    line = _line()
    with tracing.active(span):
        json_log.TraceIds().filter(line)
    got = json.loads(json_log.JsonFormatter().format(line))
    ctx = span.get_span_context()
    assert got["message"] == "job j1 failed" and got["level"] == "WARNING"
    assert got["trace_id"] == f"{ctx.trace_id:032x}" and got["span_id"] == f"{ctx.span_id:016x}"
    tracing.settle(spans, "committed")


def test_json_log_lines_without_a_span_have_no_ids():
    tracing.shutdown()
    line = _line()
    json_log.TraceIds().filter(line)
    got = json.loads(json_log.JsonFormatter().format(line))
    assert "trace_id" not in got and got["logger"] == "memstream.test"


def test_json_is_installed_only_when_asked():
    logger = logging.getLogger("memstream.test.json")
    handler = logging.StreamHandler()
    logger.addHandler(handler)
    try:
        json_log.install(logger, "text")
        assert not isinstance(handler.formatter, json_log.JsonFormatter)
        json_log.install(logger, "json")
        assert isinstance(handler.formatter, json_log.JsonFormatter)
    finally:
        logger.removeHandler(handler)


# --- the HTTP way in: the caller's trace continued by the records it produces ------------------

class HeaderProducer:
    """A producer that keeps each record's headers and acknowledges at once."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, list[tuple[str, bytes]] | None]] = []

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def send(self, topic, key, value, headers=None):
        import asyncio
        self.sent.append((topic, headers))
        done = asyncio.get_running_loop().create_future()
        done.set_result(SimpleNamespace(topic=topic, partition=0, offset=len(self.sent) - 1))
        return done


async def test_the_http_way_in_continues_the_callers_trace(exporter):
    from tests.unit.builders import bearer, serve
    from tests.unit.web.test_http_ingest import MESSAGES, ProducingBackend, World

    backend = ProducingBackend(World())
    fake = HeaderProducer()
    backend.producer._factory = lambda _: fake
    body = {"session_id": "s1", "messages": [{"role": "user", "content": "I moved"}]}
    async with serve(backend) as (client, _):
        given = await client.post(MESSAGES, json=body, headers={
            **bearer(), "traceparent": W3C.decode(), "tracestate": "vendor=abc"})
        plain = await client.post(MESSAGES, json=body, headers=bearer())
        assert given.status == plain.status == 202
    (_, first), (_, second) = fake.sent
    assert tracing.parse_traceparent(tracing.header(first, "traceparent"))[0] == TRACE
    assert tracing.header(first, "tracestate") == b"vendor=abc"
    produced = {s.context.span_id: s for s in exporter.get_finished_spans()}
    span = produced[tracing.parse_traceparent(tracing.header(first, "traceparent"))[1]]
    assert span.name == "produce" and span.parent.span_id == SPAN
    assert span.attributes[tracing.TRANSACTION] == "acknowledged" and span.status.is_ok
    root = produced[tracing.parse_traceparent(tracing.header(second, "traceparent"))[1]]
    assert root.parent is None and root.context.trace_id != TRACE  # a trace of its own


async def test_the_http_way_in_adds_no_header_when_off():
    from tests.unit.builders import bearer, serve
    from tests.unit.web.test_http_ingest import MESSAGES, ProducingBackend, World

    tracing.shutdown()
    backend = ProducingBackend(World())
    fake = HeaderProducer()
    backend.producer._factory = lambda _: fake
    body = {"session_id": "s1", "messages": [{"role": "user", "content": "I moved"}]}
    async with serve(backend) as (client, _):
        resp = await client.post(MESSAGES, json=body,
                                 headers={**bearer(), "traceparent": W3C.decode()})
        assert resp.status == 202
    assert fake.sent == [(fake.sent[0][0], None)]


# --- the ingest stage, off and on ----------------------------------------------------------------

def _ingest_batch(tmp_path, headers_of):
    import asyncio
    import uuid
    from datetime import UTC, datetime

    from memstream.streams.app import build_app
    from memstream.streams.ingest import IngestStage
    from memstream.streams.stage import processor_of
    from memstream.topics.schemas import ChatMessage

    settings = Settings(data_dir=tmp_path, embedder="hashing", web_enabled=False,
                        partitions=1, min_new_messages=2, store_partitioned=False,
                        cluster_secret="unit-tests-cluster-secret-0123456789abcdef")
    p = build_app(settings)
    try:
        stage = IngestStage(p)
        records = []
        for n in range(2):
            m = ChatMessage(tenant_id="t", user_id="u", session_id="s",
                            message_id=uuid.uuid4().hex, role="user",
                            content=f"I moved to Berlin, fact {n}", ts=datetime.now(UTC))
            records.append(SimpleNamespace(
                topic=p.topics.messages.name, partition=0, offset=n, key=m.key().encode(),
                value=m.dumps(), headers=headers_of(n), timestamp=0))
        work = asyncio.run(processor_of(stage, 0).process(records))
        tracing.settle(work.spans, "committed")
        return p, work
    finally:
        p.services.store.close()


def test_off_the_ingest_stage_reads_no_header_and_sends_records_as_before(tmp_path):
    tracing.shutdown()
    p, work = _ingest_batch(tmp_path, lambda n: Untouchable())
    jobs = [r for r in work.out if r[0] == p.topics.jobs.name]
    assert len(jobs) == 1 and all(len(r) == 3 for r in work.out) and work.spans == []


def test_on_the_job_continues_the_message_at_the_watermark_and_links_the_other(
        tmp_path, exporter):
    first = tracing.format_traceparent(TRACE, SPAN, 1)
    p, work = _ingest_batch(tmp_path, lambda n: [("traceparent", first)] if n == 0 else [])
    (job,) = [r for r in work.out if r[0] == p.topics.jobs.name]
    parent = tracing.parse_traceparent(tracing.header(job[3], "traceparent"))
    spans = {s.context.span_id: s for s in exporter.get_finished_spans()}
    sent = spans[parent[1]]
    ingest_of = {s.attributes["messaging.kafka.offset"]: s for s in spans.values()
                 if s.name == "ingest"}
    assert sent.name == "job" and sent.parent.span_id == ingest_of[1].context.span_id
    assert parent[0] == tracing.record_trace_id(p.settings.app_id, p.topics.messages.name, 0, 1)
    assert [link.context.trace_id for link in sent.links] == [TRACE]  # the first message
