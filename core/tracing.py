"""One trace per message (docs/tracing.md): OpenTelemetry spans for every hop, carried
from record to record in W3C ``traceparent`` / ``tracestate`` Kafka headers.

Off by default (``MEMSTREAM_TRACING=off``): no tracer, nothing parsed, no header added;
each helper returns at its first line (``_tracer is None``). On, the stages call the few
helpers below and the loop (:mod:`streams.owned_loop`) ends the spans of a batch once its
transaction is settled: ``memstream.transaction`` is ``committed``, ``aborted`` (the batch
is read again: its spans stay, marked, status error) or ``retried`` (an in-place retry).

The header's parse and format and the choice of a job's parent and links are pure
(:mod:`core.traceparent`, re-exported here).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from typing import Any

from memstream.core.traceparent import (
    TRACEPARENT,
    TRACESTATE,
    Headers,
    MessageTraces,
    choose_parent,
    format_traceparent,
    header,
    parse_traceparent,
    record_trace_id,
)

__all__ = ["TRACEPARENT", "TRACESTATE", "TRANSACTION", "Headers", "MessageTraces", "active",
           "choose_parent", "configure", "consume", "context_of", "continued", "current",
           "enabled", "format_traceparent", "header", "headers", "job", "llm_call",
           "llm_usage", "note", "parse_traceparent", "produce", "record_trace_id", "settle",
           "shutdown", "traced"]
TRANSACTION = "memstream.transaction"  # committed | acknowledged | aborted | retried | failed

_tracer: Any = None  # None: tracing off (the no-op path)
_provider: Any = None
_forced_trace_id: ContextVar[int | None] = ContextVar("memstream_trace_id", default=None)


# --- setup -----------------------------------------------------------------------------------

def enabled() -> bool:
    return _tracer is not None


def configure(settings: Any, exporter: Any = None, batch: bool = False) -> None:
    """Tracing as ``settings`` say (``tracing``: off | otlp | console); ``exporter``: an
    exporter of the caller's (the tests' in-memory one), sent to at once (``batch``: in
    batches, as the worker's)."""
    global _tracer, _provider
    mode = getattr(settings, "tracing", "off")
    if mode == "off" and exporter is None:
        shutdown()
        return
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    class Ids(RandomIdGenerator):
        def generate_trace_id(self) -> int:
            return _forced_trace_id.get() or super().generate_trace_id()

    attributes = {"service.name": "memstream"}
    instance = settings.instance_id() if hasattr(settings, "instance_id") else ""
    if instance:
        attributes["service.instance.id"] = instance
    resource = Resource.create(attributes)  # OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES win
    ratio = float(getattr(settings, "tracing_sample_ratio", 1.0))
    provider = TracerProvider(resource=resource, id_generator=Ids(),
                              sampler=ParentBased(TraceIdRatioBased(ratio)))
    if exporter is not None:
        provider.add_span_processor(BatchSpanProcessor(exporter) if batch
                                    else SimpleSpanProcessor(exporter))
    elif mode == "console":
        import sys

        from opentelemetry.sdk.trace.export import ConsoleSpanExporter
        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter(
            out=sys.stderr, formatter=lambda span: span.to_json(indent=None) + "\n")))
    else:
        provider.add_span_processor(BatchSpanProcessor(_otlp_exporter(settings)))
    shutdown()
    _provider, _tracer = provider, provider.get_tracer("memstream")


def _otlp_exporter(settings: Any) -> Any:
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError as exc:  # the optional extra
        from memstream.core.errors import ConfigError
        raise ConfigError("MEMSTREAM_TRACING=otlp needs the OTLP exporter: "
                          "pip install 'memstream[otlp]'") from exc
    endpoint = getattr(settings, "otlp_endpoint", None)
    if endpoint:  # else OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT, or http://localhost:4318
        endpoint = endpoint.rstrip("/")
        if not endpoint.endswith("/v1/traces"):
            endpoint += "/v1/traces"
    return OTLPSpanExporter(endpoint=endpoint or None)


def shutdown() -> None:
    """Flush and stop the exporter (the worker's exit); tracing is off after."""
    global _tracer, _provider
    provider, _provider, _tracer = _provider, None, None
    if provider is not None:
        provider.shutdown()


# --- spans of the stages ---------------------------------------------------------------------

def _messaging(topic: str, partition: int | None, offset: int | None, operation: str
               ) -> dict[str, Any]:
    found: dict[str, Any] = {"messaging.system": "kafka", "messaging.destination.name": topic,
                             "messaging.operation.type": operation}
    if partition is not None:
        found["messaging.destination.partition.id"] = str(partition)
    if offset is not None:
        found["messaging.kafka.offset"] = offset
    return found


def _remote(headers: Any) -> Any:
    """The context of a record's ``traceparent`` (and ``tracestate``), or None."""
    parsed = parse_traceparent(header(headers, TRACEPARENT))
    if parsed is None:
        return None
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

    state = header(headers, TRACESTATE)
    try:
        text = state.decode("ascii") if isinstance(state, bytes) else state
        trace_state = TraceState.from_header([text]) if text else None
    except (UnicodeDecodeError, ValueError):
        trace_state = None
    ctx = SpanContext(parsed[0], parsed[1], is_remote=True,
                      trace_flags=TraceFlags(parsed[2] & 1), trace_state=trace_state)
    return trace.set_span_in_context(NonRecordingSpan(ctx))


def continued(traceparent: str | None, tracestate: str | None = None
              ) -> AbstractContextManager[Any]:
    """The trace of an HTTP request's ``traceparent`` header current in the block (the
    HTTP way in: the records it produces continue the caller's trace)."""
    if _tracer is None or not traceparent:
        return nullcontext()
    ctx = _remote(((TRACEPARENT, traceparent), (TRACESTATE, tracestate or "")))
    return nullcontext() if ctx is None else _attached(ctx)


@contextmanager
def _attached(ctx: Any) -> Iterator[None]:
    from opentelemetry import context

    token = context.attach(ctx)
    try:
        yield
    finally:
        context.detach(token)


def current() -> Any:
    """The span current here (a request's remote parent included), or None."""
    if _tracer is None:
        return None
    from opentelemetry import trace

    span = trace.get_current_span()
    return span if span.get_span_context().is_valid else None


def consume(stage: str, record: Any, spans: list[Any], app_id: str = "",
            **attributes: Any) -> Any:
    """The span of a stage handling one input record (CONSUMER, ended by the loop once the
    transaction is settled): a child of the record's ``traceparent``, else the root of a
    trace whose id :func:`record_trace_id` derives from the record. None when off."""
    if _tracer is None:
        return None
    from opentelemetry.trace import SpanKind

    parent = _remote(getattr(record, "headers", None))
    attrs = {**_messaging(record.topic, record.partition, record.offset, "process"),
             **_dotted(attributes)}
    token = None
    if parent is None:
        token = _forced_trace_id.set(record_trace_id(app_id, record.topic, record.partition,
                                                     record.offset))
    try:
        span = _tracer.start_span(stage, context=parent, kind=SpanKind.CONSUMER,
                                  attributes=attrs)
    finally:
        if token is not None:
            _forced_trace_id.reset(token)
    spans.append(span)
    return span


def produce(name: str, parent: Any, topic: str, spans: list[Any], links: Sequence[Any] = (),
            **attributes: Any) -> Any:
    """The span of a record a stage sends (PRODUCER; its context goes in the record's
    headers), a child of ``parent`` (a span or a span context; None: a new trace), linked
    to ``links``. None when off."""
    if _tracer is None:
        return None
    from opentelemetry import trace
    from opentelemetry.trace import Link, NonRecordingSpan, SpanKind

    ctx = None
    if parent is not None:
        parent_span = parent if hasattr(parent, "get_span_context") else NonRecordingSpan(parent)
        ctx = trace.set_span_in_context(parent_span)
    span = _tracer.start_span(name, context=ctx, kind=SpanKind.PRODUCER,
                              links=[Link(c) for c in links],
                              attributes={**_messaging(topic, None, None, "send"),
                                          **_dotted(attributes)})
    spans.append(span)
    return span


def context_of(span: Any) -> Any:
    return None if span is None else span.get_span_context()


def headers(span: Any) -> Headers:
    """The ``traceparent`` (and ``tracestate``) headers that continue ``span``."""
    if span is None:
        return ()
    ctx = span.get_span_context()
    found: Headers = ((TRACEPARENT, format_traceparent(ctx.trace_id, ctx.span_id,
                                                       int(ctx.trace_flags))),)
    if ctx.trace_state:
        found += ((TRACESTATE, ctx.trace_state.to_header().encode("ascii")),)
    return found


def traced(record: tuple[str, bytes | None, bytes | None], span: Any) -> Any:
    """``record`` with the headers that continue ``span``: (topic, key, value, headers); the
    record as it is when there is no span (tracing off)."""
    if span is None:
        return record
    return (*record, headers(span))


def settle(spans: list[Any], outcome: str) -> None:
    """End the spans of a batch: ``committed`` (``acknowledged``: records of the HTTP way
    in), or ``aborted`` / ``retried`` / ``failed`` (status error: the records are read or
    tried again, under the same trace)."""
    if not spans:
        return
    from opentelemetry.trace import Status, StatusCode

    for span in spans:
        span.set_attribute(TRANSACTION, outcome)
        if outcome not in ("committed", "acknowledged"):
            span.set_status(Status(StatusCode.ERROR, f"transaction {outcome}"))
        span.end()
    spans.clear()


def active(span: Any) -> AbstractContextManager[Any]:
    """``span`` current in the block (what the worker threads it starts see)."""
    if span is None:
        return nullcontext()
    from opentelemetry.trace import use_span
    return use_span(span, end_on_exit=False)


def _dotted(attributes: dict[str, Any]) -> dict[str, Any]:
    """Keyword arguments as attribute names: ``memstream__job__id`` -> ``memstream.job.id``."""
    return {k.replace("__", "."): v for k, v in attributes.items() if v is not None}


def note(span: Any, **attributes: Any) -> None:
    if span is not None:
        span.set_attributes(_dotted(attributes))


@contextmanager
def llm_call(model: str, prompt: str, provider: str = "openai") -> Iterator[Any]:
    """The span of one LLM request (GenAI semantic conventions), a child of the current
    span; the caller reports the usage with :func:`llm_usage`. Nothing when off."""
    if _tracer is None:
        yield None
        return
    from opentelemetry.trace import SpanKind, Status, StatusCode

    started = time.monotonic()
    with _tracer.start_as_current_span(
            f"chat {model}", kind=SpanKind.CLIENT, record_exception=True,
            set_status_on_exception=False,
            attributes={"gen_ai.operation.name": "chat", "gen_ai.provider.name": provider,
                        "gen_ai.system": provider, "gen_ai.request.model": model,
                        "gen_ai.request.temperature": 0.0, "gen_ai.output.type": "json",
                        "memstream.llm.prompt": prompt}) as span:
        try:
            yield span
        except BaseException as exc:
            span.set_attribute("error.type", type(exc).__name__)
            span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            raise
        finally:
            span.set_attribute("memstream.llm.latency_ms",
                               round((time.monotonic() - started) * 1000, 1))


def llm_usage(span: Any, response_model: str | None, input_tokens: int,
              output_tokens: int) -> None:
    if span is None:
        return
    if response_model:
        span.set_attribute("gen_ai.response.model", response_model)
    span.set_attribute("gen_ai.usage.input_tokens", input_tokens)
    span.set_attribute("gen_ai.usage.output_tokens", output_tokens)




def job(traces: MessageTraces, user: bytes, job_id: str, trigger: Any, current: Any,
        topic: str, spans: list[Any], **attributes: Any) -> Any:
    """The span of a job the ingest stage sends now: its parent and links as
    :meth:`MessageTraces.parent_of_job` chooses them. None when off."""
    if _tracer is None:
        return None
    parent, links = traces.parent_of_job(user, job_id, context_of(trigger), context_of(current))
    span = produce("job", parent, topic, spans, links, **attributes)
    traces.sent(job_id, context_of(span))
    return span
