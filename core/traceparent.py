"""The W3C Trace Context header of Kafka records and the choice of a job's parent and
links: pure, no OpenTelemetry (:mod:`core.tracing` makes the spans).
"""

from __future__ import annotations

import hashlib
import re
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
Headers = tuple[tuple[str, bytes], ...]
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")


def parse_traceparent(value: bytes | str | None) -> tuple[int, int, int] | None:
    """(trace id, parent span id, flags) of a W3C ``traceparent`` value, or None when it is
    not a valid one (version ``ff``, all-zero ids, upper case, a version-00 value with
    anything after the flags: W3C Trace Context, section 3.2)."""
    if value is None:
        return None
    if isinstance(value, bytes):
        try:
            value = value.decode("ascii")
        except UnicodeDecodeError:
            return None
    m = _TRACEPARENT.fullmatch(value.strip())
    if m is None:
        return None
    version, trace_id, span_id, flags, rest = m.groups()
    if version == "ff" or (version == "00" and rest) or (rest and not rest.startswith("-")):
        return None
    if int(trace_id, 16) == 0 or int(span_id, 16) == 0:
        return None
    return int(trace_id, 16), int(span_id, 16), int(flags, 16)


def format_traceparent(trace_id: int, span_id: int, flags: int) -> bytes:
    """The W3C ``traceparent`` value (version 00) as the header's bytes."""
    return f"00-{trace_id:032x}-{span_id:016x}-{flags & 0xff:02x}".encode("ascii")


def header(headers: Iterable[tuple[str, Any]] | None, name: str) -> Any:
    """The first header ``name`` of a record, or None."""
    for key, value in headers or ():
        if key == name:
            return value
    return None


def record_trace_id(app_id: str, topic: str, partition: int, offset: int) -> int:
    """The trace id of a record that came without a ``traceparent``: derived from where it
    lies in the log, so that reading it again (an aborted transaction) continues the same
    trace."""
    digest = hashlib.sha256(f"{app_id}/{topic}/{partition}/{offset}".encode()).digest()
    return int.from_bytes(digest[:16], "big") or 1


def choose_parent(trigger: Any, pending: Sequence[Any], earlier: Any,
                  current: Any) -> tuple[Any, list[Any]]:
    """A job's parent and links. ``trigger``: the record that made the job now (a message
    at the watermark, a session end, a tool request); ``pending``: the user's messages
    since the last job, oldest first; ``earlier``: the job's earlier attempt (a re-send);
    ``current``: the record being handled (a job result), or None (a timer). The parent is
    the first of those that exists; the other messages are links."""
    if trigger is not None:
        return trigger, [c for c in pending if c != trigger]
    if pending:
        return pending[-1], list(pending[:-1])
    if earlier is not None:
        return earlier, []
    return current, []


# --- the messages a job covers ---------------------------------------------------------------

class MessageTraces:
    """Per user, the span contexts of the messages handled since the user's last job (the
    next job's parent and links), and per job id the context of its last attempt (a re-sent
    job continues it). In memory and bounded: after a restart a job links only what this
    worker saw (best effort: links are not part of the exactly-once contract)."""

    def __init__(self, per_user: int = 32, users: int = 10_000, jobs: int = 10_000) -> None:
        self.per_user, self.users, self.jobs = per_user, users, jobs
        self._pending: OrderedDict[bytes, dict[tuple[str, int, int], Any]] = OrderedDict()
        self._jobs: OrderedDict[str, Any] = OrderedDict()

    def seen(self, user: bytes, where: tuple[str, int, int], ctx: Any) -> None:
        """A message of ``user`` at ``where`` (topic, partition, offset), its span context
        ``ctx``: read again, it replaces its earlier attempt's."""
        if ctx is None:
            return
        found = self._pending.setdefault(user, {})
        found.pop(where, None)
        found[where] = ctx
        while len(found) > self.per_user:
            del found[next(iter(found))]
        self._pending.move_to_end(user)
        while len(self._pending) > self.users:
            self._pending.popitem(last=False)

    def parent_of_job(self, user: bytes, job_id: str, trigger: Any, current: Any
                      ) -> tuple[Any, list[Any]]:
        """The parent and links of ``user``'s job sent now (:func:`choose_parent`); the
        user's messages are taken."""
        pending = list(self._pending.pop(user, {}).values())
        return choose_parent(trigger, pending, self._jobs.get(job_id), current)

    def sent(self, job_id: str, ctx: Any) -> None:
        """The context of the job's attempt just sent (a re-send continues it)."""
        self._jobs[job_id] = ctx
        self._jobs.move_to_end(job_id)
        while len(self._jobs) > self.jobs:
            self._jobs.popitem(last=False)
