"""Event schemas: the contract between chat services, memstream and downstream consumers.

The records a chat service writes (:class:`ChatMessage`, :class:`SessionEvent`), their base
:class:`Event` and the id rules live in the client distribution
(:mod:`memstream.contract.records`), so a client builds them without the server; they are
imported here, where every other event builds on them.

Every event is JSON (UTF-8) with a ``schema_version``. Records on the co-partitioned topics
are keyed ``"<tenant_id>/<user_id>"`` so that one user's traffic is ordered on one
partition. Unknown fields are ignored (tolerant reader); an unknown schema version is not.
"""

from __future__ import annotations

import base64
import math
import sys
import unicodedata
from array import array
from collections.abc import Sequence
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    SerializationInfo,
    TypeAdapter,
    ValidationError,
)

from memstream.contract.records import (
    ID_PATTERN,
    MAX_QUERY_CHARS,
    SCHEMA_VERSION,
    WIRE,
    ChatMessage,
    Event,
    Ident,
    Role,
    SessionEvent,
    SessionEventKind,
    Timestamp,
    user_key,
)

__all__ = ["ID_PATTERN", "MAX_QUERY_CHARS", "SCHEMA_VERSION", "WIRE", "ChatMessage", "Event",
           "Ident", "Role", "SessionEvent", "SessionEventKind", "Timestamp", "user_key"]

# --- vectors on the wire ---------------------------------------------------------------
# A change event's vector travels as the base64 of its packed little-endian float32 values
# (2,732 characters for 512 dimensions, against ~11 KB of JSON floats that cost ~50 us to
# parse): float32 is what Qdrant keeps anyway. Events written before 2026-12-02 carry a JSON
# list of floats; both read the same, forever (:data:`Vector`).

_SWAP = sys.byteorder != "little"
# pydantic-core's base64 decoder (Rust) takes 2 us where the base64 module takes 10 us for
# 512 dimensions; it is reached through JSON, hence the quotes around the text.
_BASE64 = TypeAdapter(bytes, config=ConfigDict(val_json_bytes="base64"))


def _finite(values: list[float]) -> list[float]:
    # float32 values: their float64 sum cannot overflow, and a NaN or infinity stays one
    if not math.isfinite(sum(values)):
        raise ValueError("vector holds a non-finite value (or one beyond float32's range)")
    return values


def pack_vector(vector: Sequence[float]) -> str:
    """The wire form of a vector: base64 (standard, padded) of little-endian float32."""
    packed = array("f", vector)
    if _SWAP:
        packed.byteswap()
    return base64.b64encode(packed.tobytes()).decode("ascii")


def unpack_vector(text: str) -> list[float]:
    """The floats of a packed vector; ValueError when ``text`` is not one."""
    if len(text) % 4 or '"' in text or "\\" in text:
        raise ValueError("vector is neither a list of numbers nor padded base64")
    try:
        raw = _BASE64.validate_json(f'"{text}"')
    except ValidationError:
        raise ValueError("vector is neither a list of numbers nor base64") from None
    if len(raw) % 4:
        raise ValueError(f"packed vector of {len(raw)} bytes is not float32 values")
    values = array("f", raw)
    if _SWAP:
        values.byteswap()
    return _finite(values.tolist())


def _vector_in(value: Any) -> list[float] | None:
    """A vector as read: None, packed (a string), or a list of numbers (the events written
    before packing), rounded to float32 as a packed one reads, so both read equal."""
    if value is None:
        return None
    if isinstance(value, str):
        return unpack_vector(value)
    if not isinstance(value, list | tuple):
        raise ValueError("vector must be a list of numbers or a packed (base64) string")
    try:
        return _finite(array("f", value).tolist())
    except (TypeError, OverflowError):
        raise ValueError("vector must be a list of numbers (within float32's range)") from None


def _vector_out(value: list[float] | None, info: SerializationInfo) -> str | list[float] | None:
    context = info.context
    if value is not None and info.mode_is_json() and isinstance(context, dict) \
            and context.get("packed_vectors"):
        return pack_vector(value)
    return value


# ``list[float] | None`` in code (float32 values); serialized packed under the :data:`WIRE`
# context (what ``Event.dumps`` writes), as a list of floats otherwise; read from either.
Vector = Annotated[
    list[float] | None,
    PlainValidator(_vector_in, json_schema_input_type=str | list[float] | None),
    PlainSerializer(_vector_out, return_type=str | list[float] | None),
]



class TriggerReason(StrEnum):
    THRESHOLD = "threshold"
    EXPLICIT = "explicit"
    SESSION_END = "session_end"
    IDLE = "idle"
    TOOL = "tool"  # an agent's memory tool call (memory_insert, core_memory_replace)


class ToolWrite(BaseModel):
    """A memory write asked for by an agent's tool call: becomes a job of its own kind.

    ``memory_insert``: ``content`` (+ ``importance``, ``memory_type``);
    ``core_memory_replace``: ``label``, ``old_content``, ``content`` (the new text);
    ``delete``: ``target_id`` or ``all_memories``; ``rollback``: ``target_id``, ``version``;
    ``undo_job``: ``target_id`` (the job).
    """

    model_config = ConfigDict(frozen=True, extra="ignore")

    # memory_insert / core_memory_replace: an agent's tool call; reflect / consolidate /
    # decay: a windowed job's command (jobs.triggers), same path
    name: Literal["memory_insert", "core_memory_replace", "reflect", "consolidate", "decay",
                  "delete", "rollback", "undo_job", "forget"]
    request_id: str = Field("", max_length=128)  # taken once per id (content-derived)
    call_id: str = Field("", max_length=128)  # the model's tool call id (lineage)
    principal: str = Field("", max_length=128)  # which key asked: key id or "admin" (audit)
    content: str = Field("", max_length=4_000)
    importance: int = Field(5, ge=1, le=10)
    memory_type: Literal["episodic", "procedural"] = "episodic"
    label: str | None = None
    old_content: str = Field("", max_length=4_000)
    # delete / rollback / undo_job: a user's or operator's correction (memory.governance)
    target_id: str = Field("", max_length=128)  # the memory (delete, rollback) or job (undo)
    version: int = Field(0, ge=0)  # rollback: the version to return to
    all_memories: bool = False  # delete: every memory of the user
    reason: str = Field("", max_length=500)  # why (audit; never content)


class ToolRequest(Event):
    """An agent's memory write, produced by the API to the tool-requests topic (keyed
    tenant/user, co-partitioned with the messages) so the ingest stage serialises it with the
    user's extraction jobs: one job in flight per user, whatever its kind."""

    request_id: Ident  # the tool call id: a retried request is taken once
    tenant_id: Ident
    user_id: Ident
    session_id: Ident | None = None
    write: ToolWrite
    principal: str = ""  # which key asked (key id; "admin"), for the audit trail
    ts: Timestamp


class JobMessage(BaseModel):
    """A message as carried inside a job, with its per-session sequence number."""

    model_config = ConfigDict(frozen=True)

    seq: int
    message_id: str
    role: Role
    content: str
    ts: datetime


class ExtractionJob(Event):
    """Extract memories from messages ``[from_seq, to_seq)`` of one session.

    ``job_id`` is a hash of (tenant, user, session, range): a re-sent job has the same id.
    ``seq`` is the job's per-user sequence number (strictly increasing, assigned by the ingest
    stage; a re-sent job keeps it): the store records the last one it applied and never
    decides or applies a job at or below it again (SPEC §4, effects exactly once, in order).
    ``context`` holds a few already-scanned messages before the range, for reference only.
    """

    job_id: str
    seq: int = Field(0, ge=0)
    tenant_id: str
    user_id: str
    session_id: str
    from_seq: int
    to_seq: int
    reason: TriggerReason
    messages: list[JobMessage]
    context: list[JobMessage] = Field(default_factory=list)
    attempt: int = 1
    created_at: datetime
    tool: ToolWrite | None = None  # a tool job (reason "tool"): no messages, no LLM call


class JobStatus(StrEnum):
    DONE = "done"  # extraction ran; the range is scanned
    TRIVIAL = "trivial"  # resolved without an LLM call: every user message is trivial
    FAILED = "failed"  # retries exhausted; the range stays unscanned and is retried later
    # Not applied: the store already holds a later job of the user (or another job under this
    # seq), or a memory the decision read has moved on. The ingest stage re-issues the range
    # under a new seq above ``applied_seq``; nothing of this decision reached the store.
    FENCED = "fenced"


class JobRange(Event):
    """Which job, of whom, over which messages: shared by the events that answer a job."""

    job_id: str
    seq: int = 0
    tenant_id: str
    user_id: str
    session_id: str
    from_seq: int
    to_seq: int

    @staticmethod
    def fields_of(job: ExtractionJob | JobRange) -> dict[str, object]:
        """The range fields of a job (or of another event about it), for a new event."""
        return {name: getattr(job, name) for name in JobRange.model_fields
                if name != "schema_version"}


class JobResult(JobRange):
    """Closes the coalescing loop for one job."""

    status: JobStatus
    error: str | None = None
    llm_calls: int = 0
    applied_seq: int | None = None  # FENCED: the last job seq the store has applied
    finished_at: datetime

    @classmethod
    def for_job(cls, job: ExtractionJob | JobRange, status: JobStatus, finished_at: datetime,
                *, llm_calls: int = 0, error: str | None = None,
                applied_seq: int | None = None) -> JobResult:
        """The result that closes ``job``'s loop."""
        return cls(**JobRange.fields_of(job), status=status, error=error,
                   llm_calls=llm_calls, applied_seq=applied_seq, finished_at=finished_at)


class DeadLetter(BaseModel):
    """A record set aside, with why, where it is, and enough of it to recognise it.

    ``value_b64`` holds the original value's bytes (base64), cut to a bounded prefix when the
    value is large (``truncated``); ``value_length`` and ``value_sha256`` describe the whole
    original, which stays at ``source_topic`` / ``partition`` / ``offset`` until retention.
    ``key_b64`` is the original key, bounded the same way (``key_truncated``), and ``reason``
    is bounded too, so a dead letter always fits its topic. ``kind``: see ``InvalidRecord``.
    """

    model_config = ConfigDict(frozen=True)

    schema_version: Literal[1] = SCHEMA_VERSION
    reason: str
    kind: str
    source_topic: str
    partition: int
    offset: int
    key_b64: str | None
    key_truncated: bool = False
    value_b64: str
    truncated: bool = False
    value_length: int
    value_sha256: str
    failed_at: datetime

    def dumps(self) -> bytes:
        return self.model_dump_json().encode()


class AccessKind(StrEnum):
    HIT = "hit"  # returned by a retrieval
    USED = "used"  # feedback: the caller used it
    NOT_USEFUL = "not_useful"  # feedback: retrieved but not useful


class AccessEvent(Event):
    """Retrievals and feedback, on the memory-access topic (keyed tenant/user). The worker
    folds them into each memory's ``last_accessed_at`` / ``access_count`` (and feedback
    counts), idempotently by ``event_id``; a rebuild folds the topic again."""

    event_id: str = Field(max_length=128)
    tenant_id: Ident
    user_id: Ident
    kind: AccessKind = AccessKind.HIT
    memory_ids: list[str] = Field(max_length=200)
    query_id: str = Field(max_length=128)
    ts: Timestamp


class Lineage(BaseModel):
    """Which conversation a change came from (``kind`` "tool": an agent's tool call; then
    ``job_id`` is the tool job and ``message_ids`` holds the request id)."""

    model_config = ConfigDict(frozen=True)

    session_id: str
    from_seq: int
    to_seq: int
    job_id: str
    message_ids: list[str] = Field(default_factory=list)
    seq: int = 0  # the job's per-user sequence number
    kind: Literal["extraction", "tool", "reflection", "consolidation", "decay", "deletion",
                  "rollback", "forget", "archive"] = "extraction"
    actor: str = ""  # tool writes: the API key that asked (key id, or "admin")


class MemoryChange(Event):
    """One applied ADD / UPDATE / DELETE, on the memory-change topic (the store's source of
    truth: replaying these in order into an empty store rebuilds it without any LLM call).

    ``records`` are the version records to store (UPDATE: the closed old version and the
    new one); ``vector`` is the embedding of the new version (None for DELETE): float32
    values, written packed (base64 of little-endian float32) by :meth:`Event.dumps`, read
    from that or from a list of floats (the events written before 2026-12-02).
    """

    change_id: str  # the deterministic op id: downstream consumers deduplicate on it
    # erase: a forget-me (memory_id "*"); restate: a live version restamped by a newer
    # statement of it (same version; not a public event: topics.publishing.is_public);
    # archive: a turn kept in the episodic archive (memory.archive; not a public event either)
    op: Literal["add", "update", "delete", "erase", "restate", "archive"]
    tenant_id: str
    user_id: str
    memory_id: str
    version: int
    before: dict[str, Any] | None
    after: dict[str, Any]
    records: list[dict[str, Any]]
    vector: Vector = None
    reason: str = ""
    lineage: Lineage
    model: str
    prompt_version: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    decided_at: datetime
    # the content fields above sealed with the user's data key (sealing.envelope); None: plain
    sealed: str | None = None


class JobDecision(JobRange):
    """Internal: what the extract stage decided for one job, for the apply stage.

    ``read_versions`` maps every stored memory the decision read to the live version it saw:
    the apply stage refuses the whole decision (FENCED: decided again) if one of them moved on.
    ``decision_id`` names this very decision by what it does, wall clock left out: a job
    decided twice (a re-sent or re-consumed job) to other ops has two; only the changes of
    the one the store recorded are ever published (the store keeps them with its cursor and
    publishes them again whichever decision of the job comes next).
    """

    status: JobStatus
    decision_id: str = ""
    read_versions: dict[str, int] = Field(default_factory=dict)
    # of those, the memories whose version read was written at this job's seq or later: by
    # another decision of the job left half-applied; the apply stage fences this decision
    # until that one is applied (its changes published before any change acting on them)
    read_pending: list[str] = Field(default_factory=list)
    applied_seq: int | None = None  # FENCED by the extract stage: the store's last seq
    changes: list[MemoryChange] = Field(default_factory=list)
    decisions: dict[str, int] = Field(default_factory=dict)
    llm_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    model: str = ""
    prompt_version: str = ""
    error: str | None = None


class UserKeyRecord(BaseModel):
    """One record of the user-keys topic (layouts: memstream.sealing.key_records): a
    tenant's key-encryption key wrapped under a master key version (``tenant/!kek/<id>``:
    ``wrapped``, ``master``), a user's data key wrapped under a tenant KEK
    (``tenant/user/<key id>``: ``wrapped``, ``kek``), or the signed forget-me marker
    (``tenant/user/!forgotten``: ``at``, ``request_id``, ``actor``, ``kek``, ``keys``,
    ``sig``)."""

    model_config = ConfigDict(extra="ignore")

    wrapped: str | None = None
    created_at: float | None = None
    master: int | None = None
    kek: str | None = None
    at: float | None = None
    request_id: str | None = None
    actor: str | None = None
    keys: list[str] | None = None
    sig: str | None = None


# --- the api-keys topic (the HTTP API's keys: web.keys mints and checks them) ---------


def _no_controls(value: str) -> str:
    # Labels are printed by `memstream keys list`: no terminal control sequences.
    if any(unicodedata.category(c) == "Cc" for c in value):
        raise ValueError("must not contain control characters")
    return value


class KeyRecord(BaseModel):
    """One API key as stored: the tenant it opens and the SHA-256 of the whole key."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    schema_version: Literal[1] = 1
    key_id: str = Field(pattern=r"^[0-9a-f]{16}$")
    tenant_id: Ident
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", repr=False)  # repr: kept out of logs
    label: Annotated[str, Field(max_length=200), AfterValidator(_no_controls)] = ""
    created_at: Timestamp
    revoked_at: Timestamp | None = None
    # "" (missing) never verifies; a record is only accepted signed (see the module doc).
    signature: str = Field("", pattern=r"^(?:[0-9a-f]{64})?$", repr=False)

    def dumps(self) -> bytes:
        return self.model_dump_json().encode()
