"""The ingest stage's per-user state (see :mod:`memory.coalescing`): plain frozen data, and
its JSON snapshot for the changelog-backed table.

One :class:`UserState` per ``tenant/user`` holds every open session of the user, the job in
flight, the user's next job seq and the agent tool writes waiting for their turn.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from memstream.topics.schemas import ExtractionJob, JobResult, TriggerReason


@dataclass(frozen=True)
class Policy:
    """The knobs of the trigger policy (all from settings)."""

    min_new_messages: int = 4
    context_messages: int = 4
    idle_timeout_s: float = 1800.0
    job_timeout_s: float = 600.0
    retry_backoff_s: float = 30.0
    retry_backoff_max_s: float = 3600.0
    dedup_window: int = 64
    forget_after_s: float = 7 * 86_400.0  # a fully scanned, quiet session is dropped
    late_grace_s: float = 60.0  # a message this soon after the end event still belongs to it
    ended_dedup_ids: int = 64  # message ids an ended session keeps (producer retries)
    max_queued_tools: int = 1000  # tool writes waiting per user; more are refused
    tool_dedup_ids: int = 256  # tool request ids remembered per user (client retries)
    # the episodic archive is on: a range resolves inline only when its assistant turns are
    # trivial too (they are archived by the job, without an LLM call: memory.archive)
    archive: bool = False


@dataclass(frozen=True)
class Msg:
    """A buffered message: what a job needs to carry, plus the classification."""

    seq: int
    message_id: str
    role: str
    content: str
    ts: str
    trivial: bool


@dataclass(frozen=True)
class SessionState:
    count: int = 0  # messages accepted; the next one gets seq == count
    watermark: int = 0  # messages [0, watermark) are scanned
    buffer: tuple[Msg, ...] = ()  # from max(0, watermark - context) to count
    recent_ids: tuple[str, ...] = ()  # message ids seen lately (producer retries)
    last_activity: float = 0.0
    pending: TriggerReason | None = None  # the dirty flag, with the reason it was set
    ended: bool = False
    ended_at: float | None = None
    end_ts: float | None = None  # the end event's own timestamp (when the session ended)
    failures: int = 0
    retry_at: float | None = None


@dataclass(frozen=True)
class InFlight:
    job_id: str
    seq: int
    session_id: str
    from_seq: int
    to_seq: int
    reason: TriggerReason
    sent_at: float
    attempt: int = 1
    kind: str = "extract"  # or "tool"
    # the job failed: the same job goes again then (another copy may still be applied; its
    # result must find the job in flight, see coalescing.on_result)
    retry_at: float | None = None

    def resend_at(self, policy: Policy) -> float:
        """When this job is sent again unless its result arrives first."""
        return self.retry_at if self.retry_at is not None else self.sent_at + policy.job_timeout_s


@dataclass(frozen=True)
class QueuedTool:
    """An agent's tool write waiting for its turn (plain data for the snapshot)."""

    request_id: str
    session_id: str
    write: dict[str, object]  # ToolWrite fields
    ts: float


@dataclass(frozen=True)
class UserState:
    tenant_id: str
    user_id: str
    sessions: dict[str, SessionState] = field(default_factory=dict)
    in_flight: InFlight | None = None
    next_seq: int = 1  # the seq of the user's next job
    tools: tuple[QueuedTool, ...] = ()  # tool writes waiting, in arrival order
    # (request id, when taken) of tool writes taken lately: a retried request is taken once
    # as long as it is remembered (``forget_after``), even once its job is done
    recent_tools: tuple[tuple[str, float], ...] = ()
    # a forget-me's time: messages written before it and read after it (another topic, a
    # backlog) are dropped, not extracted after the erasure (kept ``forget_after``)
    forgotten_before: float | None = None

    @property
    def idle(self) -> bool:
        """Nothing to remember: no session, no job in flight, no tool write waiting or
        remembered."""
        return (not self.sessions and self.in_flight is None and not self.tools
                and not self.recent_tools and self.forgotten_before is None)


@dataclass(frozen=True)
class Step:
    """What one input produced: the new state and the records to send."""

    state: UserState
    jobs: list[ExtractionJob] = field(default_factory=list)
    resolved: list[JobResult] = field(default_factory=list)  # trivial jobs, no LLM call
    duplicate: bool = False


def snapshot(state: UserState) -> dict[str, object]:
    """A JSON-ready snapshot for the changelog-backed table (see :func:`restore`)."""
    return {
        "v": 1,
        "tenant_id": state.tenant_id,
        "user_id": state.user_id,
        "next_seq": state.next_seq,
        "tools": [list(t.__dict__.values()) for t in state.tools],
        "recent_tools": [list(t) for t in state.recent_tools],
        "forgotten_before": state.forgotten_before,
        "in_flight": None if state.in_flight is None else {
            **state.in_flight.__dict__, "reason": state.in_flight.reason.value,
        },
        "sessions": {
            sid: {
                **{k: v for k, v in s.__dict__.items() if k not in ("buffer", "recent_ids")},
                "pending": s.pending.value if s.pending else None,
                "buffer": [list(m.__dict__.values()) for m in s.buffer],
                "recent_ids": list(s.recent_ids),
            }
            for sid, s in state.sessions.items()
        },
    }


def restore(data: dict[str, object]) -> UserState:
    """Rebuild the state from :func:`snapshot` output."""
    flight = data.get("in_flight")
    sessions_raw = data.get("sessions") or {}
    assert isinstance(sessions_raw, dict)
    sessions = {}
    for sid, raw in sessions_raw.items():
        fields = dict(raw)
        fields["buffer"] = tuple(Msg(*m) for m in fields["buffer"])
        fields["recent_ids"] = tuple(fields["recent_ids"])
        fields["pending"] = TriggerReason(fields["pending"]) if fields["pending"] else None
        sessions[sid] = SessionState(**fields)
    in_flight = None
    if isinstance(flight, dict):
        in_flight = InFlight(**{"seq": 0, **flight, "reason": TriggerReason(flight["reason"])})
    next_seq = data.get("next_seq", 1)
    assert isinstance(next_seq, int)
    tools = tuple(QueuedTool(*t) for t in data.get("tools") or ())  # type: ignore[attr-defined]
    recent = tuple((str(r), float(t)) for r, t in data.get("recent_tools") or ())  # type: ignore[attr-defined]
    forgotten = data.get("forgotten_before")
    return UserState(str(data["tenant_id"]), str(data["user_id"]), sessions, in_flight,
                     next_seq, tools, recent,
                     float(forgotten) if isinstance(forgotten, int | float) else None)


def overdue(snap: dict[str, object], now: float, policy: Policy, slack_s: float = 0.0) -> int:
    """Messages of a :func:`snapshot` not yet scanned although every trigger that must take
    them has passed: the session was quiet for longer than the idle flush plus a job's
    timeout (``slack_s`` more), and no retry of a failed job is waiting. On a healthy
    pipeline this is 0; a message lost on its way makes it grow (the
    ``memstream_messages_overdue`` gauge and its alert). Read off the snapshot as it is
    stored (no restore): it runs over every owned user on each tick."""
    late = policy.idle_timeout_s + policy.job_timeout_s + slack_s
    sessions = snap.get("sessions") or {}
    assert isinstance(sessions, dict)
    return sum(int(s["count"]) - int(s["watermark"]) for s in sessions.values()
               if s["count"] > s["watermark"] and s.get("retry_at") is None
               and now - float(s["last_activity"]) > late)
