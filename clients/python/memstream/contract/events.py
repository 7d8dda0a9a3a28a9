"""The public memory event: what downstream services read (``<prefix>.memory-events``).

The memory-change topic is the store's changelog: it carries every version record the store
writes and the embedding, which change whenever the store does. Downstream services (CRM
sync, caches, analytics) read this slim event instead, produced from each change event in
the same transaction, on the same partition (key ``tenant/user``), so both topics hold the
same changes in the same order. Its fields are a contract (``docs/consuming.md``): within
``schema_version`` 1 they only ever grow (new optional fields), and readers ignore fields
they do not know.

With a master key, ``before``, ``after`` and ``reason`` travel sealed with the user's data
key, the same key that seals the change event (:mod:`sealing.envelope`): a forget-me shreds
it, and every copy of the user's content on both topics stops opening at once.

Part of the wire contract (the ``memstream-client`` distribution: :mod:`memstream.consumer`
reads these); the server builds them from its change events
(:mod:`memstream.topics.publishing`).
Pure: no I/O.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from memstream.contract.records import Event, Timestamp

EventOp = Literal["add", "update", "delete", "erase"]


def _time(value: Any) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(float(value), UTC)


# What readers rely on: unknown fields are ignored, and every field the writer always
# writes is required in the JSON Schema (serialization mode), defaults or not.
_PUBLIC = ConfigDict(frozen=True, extra="ignore", json_schema_serialization_defaults_required=True)


def _stated(record: dict[str, Any]) -> float | None:
    times = [t for t in ((record.get("source") or {}).get("event_ts"),
                         (record.get("extra") or {}).get("restated_ts")) if t is not None]
    return max(times) if times else None


class MemoryState(BaseModel):
    """One version of a memory as downstream sees it: its content and how it stands."""

    model_config = _PUBLIC

    version: int = Field(description="1 for a new memory; an update opens version + 1")
    content: str = Field(description="The memory's text")
    type: str = Field(description="episodic (a user's facts), procedural (how to act) or "
                                  "semantic (the tenant's shared knowledge); an open set: "
                                  "read an unknown type as episodic")
    importance: int = Field(description="1..10, as the extractor rated it")
    status: str = Field(description="active (live), superseded (an older version, or a late "
                                    "fact kept as history), archived (decayed) or deleted; "
                                    "only active is live")
    slot: str | None = Field(None, description="The single-valued thing it is about "
                                               "(residence, employer, core:<label>), if any")
    created_at: Timestamp = Field(description="When the memory (version 1) was created")
    updated_at: Timestamp = Field(description="When this version was written or closed")
    valid_from: Timestamp = Field(description="When this version became true")
    valid_to: Timestamp | None = Field(None, description="When it stopped being true (closed)")
    expires_at: Timestamp | None = Field(None, description="When it expires (TTL), if ever")
    event_time: Timestamp | None = Field(
        None, description="Event time: the newest source message's timestamp (None for tool "
                          "writes and windowed jobs)")
    stated_time: Timestamp | None = Field(
        None, description="The event time of the newest statement of this version: "
                          "event_time, or a later restatement's (op restate); None when "
                          "neither is known")

    @classmethod
    def of(cls, record: dict[str, Any] | None) -> MemoryState | None:
        """From a memory record's payload (:meth:`memory.model.Memory.to_payload`)."""
        if not record or "content" not in record:
            return None
        source = record.get("source") or {}
        return cls(
            version=record["version"], content=record["content"], type=record["type"],
            importance=record["importance"], status=record["status"],
            slot=record.get("slot"), created_at=_time(record["created_at"]),
            updated_at=_time(record["updated_at"]), valid_from=_time(record["valid_from"]),
            valid_to=_time(record.get("valid_to")), expires_at=_time(record.get("expires_at")),
            event_time=_time(source.get("event_ts")), stated_time=_time(_stated(record)),
        )


class EventLineage(BaseModel):
    """Where the change came from: the messages, the job, who asked."""

    model_config = _PUBLIC

    kind: str = Field(description="What made it: extraction, tool, reflection, consolidation, "
                                  "decay, deletion, rollback, forget, ... (an open set)")
    session_id: str
    from_seq: int = Field(description="First message sequence number of the job (inclusive)")
    to_seq: int = Field(description="Last message sequence number of the job (exclusive)")
    message_ids: list[str] = Field(default_factory=list,
                                   description="The source messages (or the tool call id)")
    job_id: str
    job_seq: int = Field(0, description="The job's number among the user's jobs")
    actor: str = Field("", description="Tool writes and forget-me: the API key id that asked "
                                       "(or 'admin')")


class MemoryEvent(Event):
    """One applied change of one memory (add, update, delete) or a user's erasure (erase).

    A consumer applies them in order per user, deduplicates on ``change_id`` (a change can
    be published twice, byte-identical but for ``sealed``'s nonce) and, on ``erase``,
    deletes everything it holds of the user.
    """

    model_config = _PUBLIC

    change_id: str = Field(description="Unique per change; the same on a republished copy")
    op: EventOp
    tenant_id: str
    user_id: str = Field(description="The user; __global__ for the tenant's shared knowledge")
    memory_id: str = Field(description="The memory; '*' for erase")
    version: int = Field(description="The version this change leaves (delete: the version it "
                                     "closes; erase: 0)")
    before: MemoryState | None = Field(None, description="The version it replaces or closes "
                                                         "(None for add and erase)")
    after: MemoryState | None = Field(
        None, description="The version it leaves (add, update: usually active, a late fact "
                          "kept as history: superseded; delete: deleted or archived; erase: "
                          "None)")
    reason: str = Field("", description="Why, as the deciding model or the request said")
    lineage: EventLineage
    model: str = Field(description="The model (or rule extractor) that decided")
    prompt_version: str
    decided_at: Timestamp
    erased_versions: int | None = Field(None, description="erase: how many version records "
                                                          "were erased")
    sealed: str | None = Field(None, description="With a master key: before, after and reason, "
                                                 "sealed with the user's data key")


# The topics a downstream reader reads, named under the deployment's ``topic_prefix``.
MEMORY_EVENTS_TOPIC = "memory-events"  # these events
USER_KEYS_TOPIC = "user-keys"  # the users' data keys that open sealed ones (compacted)


def topic_name(prefix: str, name: str) -> str:
    """The full name of one of memstream's topics (``<prefix>.<name>``)."""
    return f"{prefix}.{name}"
