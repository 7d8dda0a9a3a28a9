"""The watermark + coalescing state machine of SPEC §3, as pure functions over plain data.

One :class:`UserState` per ``tenant/user`` holds every open session of that user. Each
function takes the state, an input and ``now`` (seconds, injected) and returns a
:class:`Step`: the new state plus what to emit. Inputs are never mutated.

Rules:
- per session, ``watermark`` = messages already scanned; a job covers ``[watermark, count)``;
- at most one job in flight per user (its decisions all touch the same memory set);
- a trigger while a job runs is remembered in the session's ``pending`` reason (the dirty
  flag); when the job completes the watermark advances to what it covered, and one new job
  covers everything that is due then;
- ``explicit`` and ``session_end`` fire below the threshold, ``idle`` after a quiet period;
- a job whose user messages are all trivial is resolved at once, without an LLM call;
- a failed job leaves the watermark where it was and is retried with exponential backoff as
  the same job (id, seq and range), in flight meanwhile: another copy of it (a re-send, a
  duplicate) may still be applied, and its result must close the loop (a retry under a new
  seq would decide that range a second time). The user's other work waits, as behind any
  job in flight;
- a job that gets no result within ``job_timeout`` is re-sent under the same id and seq;
- every job gets the user's next ``seq`` (strictly increasing, kept in the snapshot): the
  store fences on it (:mod:`memory.fencing`); a ``fenced`` result re-issues the range under a
  seq above the one the store holds when the store holds this seq or a later one; when it
  holds an earlier one (a memory this copy read moved on: another copy of the job may have
  written it, killed before its cursor), the same job goes again and stays in flight, like
  a failed one, so that other copy's result still closes it;
- a session that is fully scanned and quiet for ``forget_after`` is dropped, so the state
  of a long-lived user stays bounded;
- an agent's tool write (``on_tool``) waits in the user's tool queue and goes out as a job
  of its own kind (reason ``tool``) under the same seq and the same one-in-flight rule, so
  it never races an extraction job of the user; queued tools go before extraction jobs
  (an agent waits for its answer), a retried request id is taken once;
- an ended session is kept (trimmed) until then: a message that arrives up to
  ``late_grace`` after the end event (the end travels on another topic and may overtake
  the last messages) is flushed at once, a later one reopens the session, and sequence
  numbers never restart.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from datetime import UTC, datetime

from memstream.memory.ingest_state import (
    InFlight,
    Msg,
    Policy,
    QueuedTool,
    SessionState,
    Step,
    UserState,
)
from memstream.memory.trigger_rules import is_explicit, is_trivial
from memstream.topics.schemas import (
    ChatMessage,
    ExtractionJob,
    JobMessage,
    JobResult,
    JobStatus,
    Role,
    ToolRequest,
    ToolWrite,
    TriggerReason,
)

# Which reason a session's dirty flag keeps when several apply (lower wins).
_PRIORITY = {
    TriggerReason.EXPLICIT: 0,
    TriggerReason.THRESHOLD: 1,
    TriggerReason.SESSION_END: 2,
    TriggerReason.IDLE: 3,
}


def _ts(now: float) -> datetime:
    return datetime.fromtimestamp(now, UTC)


def job_id(tenant: str, user: str, session: str, first: Msg, last: Msg) -> str:
    """Deterministic: the same range of the same messages always gets the same id."""
    raw = "\x1f".join(
        [tenant, user, session, str(first.seq), str(last.seq), first.message_id, last.message_id]
    )
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


def _stronger(a: TriggerReason | None, b: TriggerReason | None) -> TriggerReason | None:
    if a is None or b is None:
        return a or b
    return a if _PRIORITY[a] <= _PRIORITY[b] else b


def _with_session(state: UserState, sid: str, session: SessionState | None) -> UserState:
    sessions = dict(state.sessions)
    if session is None:
        sessions.pop(sid, None)
    else:
        sessions[sid] = session
    return replace(state, sessions=sessions)


def due_reason(s: SessionState, now: float, policy: Policy) -> TriggerReason | None:
    """Why this session needs a job now (ignoring whether one is in flight), or None."""
    if s.count <= s.watermark:
        return None
    if s.retry_at is not None and now < s.retry_at:
        return None
    if s.count - s.watermark >= policy.min_new_messages:
        return _stronger(s.pending, TriggerReason.THRESHOLD)
    if s.pending is not None:
        return s.pending
    if s.ended:
        return TriggerReason.SESSION_END
    if now - s.last_activity >= policy.idle_timeout_s:
        return TriggerReason.IDLE
    return None


def _oldest_unscanned(s: SessionState) -> str:
    """ISO timestamp of the session's first unscanned message (UTC, sortable)."""
    return next((m.ts for m in s.buffer if m.seq >= s.watermark), "")


def _trim(s: SessionState, policy: Policy) -> SessionState:
    keep_from = s.watermark - policy.context_messages
    return replace(s, buffer=tuple(m for m in s.buffer if m.seq >= keep_from))


def _job_for(state: UserState, sid: str, s: SessionState, reason: TriggerReason,
             now: float, attempt: int = 1, to_seq: int | None = None,
             seq: int | None = None) -> ExtractionJob:
    end = s.count if to_seq is None else to_seq
    new = [m for m in s.buffer if s.watermark <= m.seq < end]
    ctx = [m for m in s.buffer if m.seq < s.watermark]

    def wire(m: Msg) -> JobMessage:
        return JobMessage(seq=m.seq, message_id=m.message_id, role=Role(m.role),
                          content=m.content, ts=datetime.fromisoformat(m.ts))

    return ExtractionJob(
        job_id=job_id(state.tenant_id, state.user_id, sid, new[0], new[-1]),
        seq=state.next_seq if seq is None else seq,
        tenant_id=state.tenant_id, user_id=state.user_id, session_id=sid,
        from_seq=s.watermark, to_seq=end, reason=reason,
        messages=[wire(m) for m in new], context=[wire(m) for m in ctx],
        attempt=attempt, created_at=_ts(now),
    )


def _close(state: UserState, sid: str, s: SessionState, policy: Policy) -> UserState:
    """Store a session whose watermark moved; an ended, fully scanned one is slimmed."""
    if s.ended and s.watermark >= s.count:
        s = replace(s, buffer=(), recent_ids=s.recent_ids[-policy.ended_dedup_ids:])
        return _with_session(state, sid, s)
    return _with_session(state, sid, _trim(s, policy))


TOOL_SESSION = "tool"  # the session id of a tool job that names none


def tool_job_id(tenant: str, user: str, request_id: str) -> str:
    """Deterministic: the API can wait for the job of the request it sent."""
    raw = "\x1f".join([tenant, user, "tool", request_id])
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


def _tool_job(state: UserState, tool: QueuedTool, now: float, seq: int,
              attempt: int = 1) -> ExtractionJob:
    return ExtractionJob(
        job_id=tool_job_id(state.tenant_id, state.user_id, tool.request_id), seq=seq,
        tenant_id=state.tenant_id, user_id=state.user_id, session_id=tool.session_id,
        from_seq=0, to_seq=0, reason=TriggerReason.TOOL, messages=[], attempt=attempt,
        created_at=_ts(now), tool=ToolWrite.model_validate(tool.write),
    )


def on_tool(state: UserState, req: ToolRequest, now: float, policy: Policy) -> Step:
    """Queue an agent's tool write (once per request id) and start it if nothing runs."""
    taken = {rid for rid, _ in state.recent_tools}
    full = len(state.tools) >= policy.max_queued_tools and req.write.name != "forget"
    if req.request_id in taken or full:  # a forget-me is never refused for a full queue
        return Step(state, duplicate=True)
    write = req.write.model_dump(mode="json") | {"request_id": req.request_id,
                                                  "principal": req.principal}
    queued = QueuedTool(req.request_id, req.session_id or TOOL_SESSION, write,
                        req.ts.timestamp())
    recent = (*state.recent_tools, (req.request_id, now))[-policy.tool_dedup_ids:]
    if req.write.name == "forget":
        # Forget-me: buffered messages and queued writes are the user's content, dropped
        # now (the shell drops the session windows with them), and the erasure goes next.
        # A job still in flight is let go: applied before the erasure, it is erased with
        # the rest; decided after it, the cursor the erasure leaves fences it (lower seq).
        state = replace(state, sessions={}, tools=(queued,), in_flight=None,
                        recent_tools=recent, forgotten_before=req.ts.timestamp())
        return pump(state, now, policy)
    state = replace(state, tools=(*state.tools, queued), recent_tools=recent)
    return pump(state, now, policy)


def _start_tool(state: UserState, now: float) -> Step:
    job = _tool_job(state, state.tools[0], now, state.next_seq)
    flight = InFlight(job.job_id, job.seq, job.session_id, 0, 0, TriggerReason.TOOL, now,
                      kind="tool")
    return Step(replace(state, in_flight=flight, next_seq=job.seq + 1), jobs=[job])


def pump(state: UserState, now: float, policy: Policy) -> Step:
    """If no job is in flight, start the most urgent due one (trivial ones resolve inline)."""
    resolved: list[JobResult] = []
    while state.in_flight is None:
        # Among due sessions (and the first queued tool write), the one whose oldest
        # unscanned message is oldest goes first: facts must reach the store in
        # conversation order, or an older "2 kids" decided after a newer "3 kids" would
        # overwrite it. (Explicit makes a session due at once; it does not let newer
        # messages overtake older ones; a tool write takes its turn by its own time.)
        due = [
            (_oldest_unscanned(s), sid, r)
            for sid, s in state.sessions.items()
            if (r := due_reason(s, now, policy)) is not None
        ]
        if state.tools and (not due or _ts(state.tools[0].ts).isoformat() <= min(due)[0]):
            return _with_resolved(_start_tool(state, now), resolved)
        if not due:
            break
        _, sid, reason = min(due)
        s = state.sessions[sid]
        job = _job_for(state, sid, s, reason, now)
        if all(_nothing_to_keep(m, policy) for m in s.buffer if m.seq >= s.watermark):
            resolved.append(_trivial_result(job, now))
            done = replace(s, watermark=s.count, pending=None, failures=0, retry_at=None)
            state = _close(state, sid, done, policy)
            continue
        flight = InFlight(job.job_id, job.seq, sid, job.from_seq, job.to_seq, reason, now)
        state = replace(_with_session(state, sid, replace(s, pending=None)), in_flight=flight,
                        next_seq=job.seq + 1)
        return Step(state, jobs=[job], resolved=resolved)
    return Step(state, resolved=resolved)


def _nothing_to_keep(m: Msg, policy: Policy) -> bool:
    """A message that needs no job: a trivial user turn, a system or tool message, and an
    assistant turn unless the archive keeps it."""
    if m.role == Role.USER:
        return m.trivial
    return not (policy.archive and m.role == Role.ASSISTANT and not is_trivial(m.content))


def _with_resolved(step: Step, resolved: list[JobResult]) -> Step:
    return replace(step, resolved=resolved + step.resolved)


def _trivial_result(job: ExtractionJob, now: float) -> JobResult:
    return JobResult.for_job(job, JobStatus.TRIVIAL, _ts(now))


def on_message(state: UserState, msg: ChatMessage, now: float, policy: Policy) -> Step:
    """Accept one message (once per message id) and start a job if one is due."""
    s = state.sessions.get(msg.session_id, SessionState())
    if msg.message_id in s.recent_ids:
        return Step(state, duplicate=True)
    if state.forgotten_before is not None and msg.ts.timestamp() <= state.forgotten_before:
        return Step(state, duplicate=True)  # written before the user asked to be forgotten
    is_user = msg.role == Role.USER
    buffered = Msg(
        seq=s.count, message_id=msg.message_id, role=msg.role.value, content=msg.content,
        ts=msg.ts.astimezone(UTC).isoformat(), trivial=is_user and is_trivial(msg.content),
    )
    pending = s.pending
    # Late by the clock of this worker (the end overtook the message on another topic), or
    # written before the session ended by the message's own time: a worker that restarts
    # behind a backlog reads both topics at different paces, and the end event's arrival
    # time alone would reopen the session and leave the message to the idle flush.
    written = msg.ts.timestamp()
    ended = s.ended and s.ended_at is not None and (
        now - s.ended_at <= policy.late_grace_s
        or (s.end_ts is not None and written <= s.end_ts + policy.late_grace_s))
    if is_user and is_explicit(msg.content):
        pending = _stronger(pending, TriggerReason.EXPLICIT)
    s = replace(
        s, count=s.count + 1, buffer=(*s.buffer, buffered),
        recent_ids=(*s.recent_ids, msg.message_id)[-policy.dedup_window:],
        last_activity=now, pending=pending, ended=ended,
        ended_at=s.ended_at if ended else None, end_ts=s.end_ts if ended else None,
    )
    return pump(_with_session(state, msg.session_id, s), now, policy)


def on_session_end(state: UserState, session_id: str, now: float, policy: Policy,
                   ts: float | None = None) -> Step:
    """Flush whatever the session holds below the threshold."""
    s = state.sessions.get(session_id)
    if s is not None and s.ended:
        return Step(state)
    if s is None:  # the end overtook every message of the session (another topic)
        s = SessionState(last_activity=now)
    return pump(_with_session(state, session_id,
                              replace(s, ended=True, ended_at=now, end_ts=ts)),
                now, policy)


def on_result(state: UserState, result: JobResult, now: float, policy: Policy) -> Step:
    """Close the loop: advance the watermark on success, schedule a retry on failure."""
    flight = state.in_flight
    if flight is None or flight.job_id != result.job_id or (result.seq and
                                                             flight.seq != result.seq):
        return Step(state, duplicate=True)  # stale or replayed result: already applied
    if flight.kind == "tool":
        return _on_tool_result(state, flight, result, now, policy)
    s = state.sessions.get(flight.session_id, SessionState())
    if result.status == JobStatus.FENCED and (result.applied_seq or 0) < flight.seq:
        # A memory this copy read moved on, and the store holds no job of this seq: it may
        # be another copy's write (a half-applied decision, read again later), whose result
        # must find the job in flight. This very job goes again, at once the first time.
        failures = s.failures + 1
        state = _with_session(state, flight.session_id, replace(s, failures=failures))
        if failures > 1:
            delay = _fenced_delay(policy, failures)
            return Step(replace(state, in_flight=replace(flight, retry_at=now + delay)))
        return _resend(state, flight, now)
    if result.status == JobStatus.FENCED:
        # The store holds this seq or a later one (this state was rolled back or forgotten):
        # issue the range again, under a seq above the store's. Back off only when it repeats.
        failures = s.failures + 1
        delay = _fenced_delay(policy, failures)
        s = replace(s, failures=failures, retry_at=now + delay if delay else None,
                    pending=_stronger(s.pending, flight.reason))
        state = replace(_with_session(state, flight.session_id, s),
                        next_seq=max(state.next_seq, (result.applied_seq or 0) + 1))
    elif result.status == JobStatus.FAILED:
        failures = s.failures + 1
        delay = min(policy.retry_backoff_s * 2 ** (failures - 1), policy.retry_backoff_max_s)
        s = replace(s, failures=failures, retry_at=now + delay,
                    pending=_stronger(s.pending, flight.reason))
        # this very job goes again, and stays in flight meanwhile: another copy of it (a
        # re-send, a duplicate) may still be applied, and its result must find it
        state = _with_session(state, flight.session_id, s)
        return Step(replace(state, in_flight=replace(flight, retry_at=now + delay)))
    else:
        s = replace(s, watermark=max(s.watermark, flight.to_seq), failures=0, retry_at=None)
        state = _close(state, flight.session_id, s, policy)
    return pump(replace(state, in_flight=None), now, policy)


def _on_tool_result(state: UserState, flight: InFlight, result: JobResult, now: float,
                    policy: Policy) -> Step:
    """A tool job is done (or failed for good: the extract stage retried it and set it
    aside) and leaves the queue. A fenced one whose store holds an earlier seq (what it read
    moved on, or is another copy's half-applied write) goes again as itself, in flight, like
    an extraction job; one whose store holds its seq or a later one goes again under a seq
    above the store's."""
    if result.status == JobStatus.FENCED and (result.applied_seq or 0) < flight.seq \
            and state.tools:
        delay = _fenced_delay(policy, flight.attempt)
        if delay:
            return Step(replace(state, in_flight=replace(flight, retry_at=now + delay)))
        return _resend_tool(state, flight, now)
    if result.status == JobStatus.FENCED:
        state = replace(state, next_seq=max(state.next_seq, (result.applied_seq or 0) + 1))
    else:
        state = replace(state, tools=state.tools[1:])
    return pump(replace(state, in_flight=None), now, policy)


def _fenced_delay(policy: Policy, failures: int) -> float:
    """How long a job fenced ``failures`` times in a row waits: none the first time."""
    return 0.0 if failures == 1 else min(policy.retry_backoff_s * 2 ** (failures - 2),
                                         policy.retry_backoff_max_s)


def _resend(state: UserState, flight: InFlight, now: float) -> Step:
    """The extraction job in flight, sent again: the same id, seq and range."""
    again = replace(flight, sent_at=now, attempt=flight.attempt + 1, retry_at=None)
    job = _job_for(state, flight.session_id, state.sessions[flight.session_id], flight.reason,
                   now, attempt=again.attempt, to_seq=flight.to_seq, seq=flight.seq)
    return Step(replace(state, in_flight=again), jobs=[job])


def _resend_tool(state: UserState, flight: InFlight, now: float) -> Step:
    """The tool job in flight, sent again: the same request, seq and id."""
    again = replace(flight, sent_at=now, attempt=flight.attempt + 1, retry_at=None)
    return Step(replace(state, in_flight=again),
                jobs=[_tool_job(state, state.tools[0], now, flight.seq, again.attempt)])


def on_tick(state: UserState, now: float, policy: Policy) -> Step:
    """Timers: re-send an unanswered job, forget quiet sessions, flush idle ones, retry."""
    flight = state.in_flight
    if flight is not None and now >= flight.resend_at(policy):
        if flight.kind == "tool":
            if not state.tools:  # nothing left to re-send (a state restored half-way)
                return pump(replace(state, in_flight=None), now, policy)
            return _resend_tool(state, flight, now)
        return _resend(state, flight, now)
    busy = flight.session_id if flight is not None and flight.kind != "tool" else None
    stale = [
        sid for sid, s in state.sessions.items()
        if sid != busy and s.watermark >= s.count
        and now - s.last_activity >= policy.forget_after_s
    ]
    for sid in stale:
        state = _with_session(state, sid, None)
    kept = tuple(t for t in state.recent_tools if now - t[1] < policy.forget_after_s)
    if kept != state.recent_tools:
        state = replace(state, recent_tools=kept)
    if state.forgotten_before is not None and \
            now - state.forgotten_before >= policy.forget_after_s:
        state = replace(state, forgotten_before=None)
    return pump(state, now, policy)


def next_deadline(state: UserState, policy: Policy) -> float | None:
    """The earliest time at which ``on_tick`` would do something, or None."""
    if state.in_flight is not None:
        return state.in_flight.resend_at(policy)
    times: list[float] = []
    for s in state.sessions.values():
        if s.count <= s.watermark:
            times.append(s.last_activity + policy.forget_after_s)
        elif s.retry_at is not None:
            times.append(s.retry_at)
        else:
            times.append(s.last_activity + policy.idle_timeout_s)
    if state.recent_tools:
        times.append(state.recent_tools[0][1] + policy.forget_after_s)
    if state.forgotten_before is not None:
        times.append(state.forgotten_before + policy.forget_after_s)
    return min(times) if times else None
