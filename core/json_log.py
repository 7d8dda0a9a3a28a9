"""The worker's log lines as JSON (``MEMSTREAM_LOG_FORMAT=json``), one object per line,
with the ids of the span in progress while tracing (``trace_id``, ``span_id``: the same
lowercase hex as the ``traceparent`` header and the tracing backend), so a log search and
a trace find each other. The message is what the code logged: no secret and no memory
content is ever logged (core.errors.describe), and none is added here.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

from memstream.core import tracing


class TraceIds(logging.Filter):
    """Stamps ``trace_id`` / ``span_id`` on each record (empty when no span is current)."""

    def filter(self, record: logging.LogRecord) -> bool:
        trace_id = span_id = ""
        if tracing.enabled():
            from opentelemetry import trace

            ctx = trace.get_current_span().get_span_context()
            if ctx.is_valid:
                trace_id, span_id = f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"
        record.trace_id, record.span_id = trace_id, span_id
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (UTC, ISO 8601), level, logger, message, the trace
    and span ids when set, the exception's text when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        for name in ("trace_id", "span_id"):
            value = getattr(record, name, "")
            if value:
                line[name] = value
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def install(logger: logging.Logger, log_format: str) -> None:
    """JSON lines on every handler of ``logger`` (the root logger once Faust's worker set it
    up), with the trace ids; text lines keep their format."""
    if log_format != "json":
        return
    ids, formatter = TraceIds(), JsonFormatter()
    for handler in logger.handlers:
        handler.addFilter(ids)
        handler.setFormatter(formatter)
