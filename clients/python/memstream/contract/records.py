"""The records a chat service writes and the rules their ids follow: the part of the topic
contract (:mod:`memstream.topics.schemas` on the server) that a client builds.

Every event is JSON (UTF-8) with a ``schema_version``. Records on the co-partitioned topics
are keyed ``"<tenant_id>/<user_id>"`` so that one user's traffic is ordered on one
partition. Unknown fields are ignored (tolerant reader); an unknown schema version is not.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema
from pydantic.json_schema import SkipJsonSchema

SCHEMA_VERSION: Literal[1] = 1

ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@+=-]{0,127}$")
MAX_QUERY_CHARS = 4_000  # one retrieval query: the HTTP API and the agent tools


def _check_id(value: str) -> str:
    if not ID_PATTERN.fullmatch(value):
        raise ValueError(
            "must be 1-128 characters of letters, digits and . _ : @ + = - "
            "(no '/', no spaces), starting with a letter or digit"
        )
    return value


Ident = Annotated[str, AfterValidator(_check_id),
                  WithJsonSchema({"type": "string", "pattern": ID_PATTERN.pattern})]


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


Timestamp = Annotated[datetime, AfterValidator(_aware)]


WIRE: dict[str, Any] = {"packed_vectors": True}  # the serialization context of the wire

# The schema id of a record that came in Confluent's schema-registry wire format
# (topics.framing), set by the codec from the record's header (None: plain JSON); kept on
# the decoded event, not resolved, and never written: not in ``dumps``, not in the contract.
SchemaId = SkipJsonSchema[int | None]
SCHEMA_ID_FIELD = Field(None, exclude=True, description="set by the codec from a registry header")


def user_key(tenant_id: str, user_id: str) -> str:
    """The Kafka record key of everything that belongs to one user."""
    return f"{tenant_id}/{user_id}"


class Event(BaseModel):
    """Base of every event: versioned, immutable, extra fields ignored."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    schema_version: Literal[1] = SCHEMA_VERSION

    def key(self) -> str:
        """Record key; every keyed event has ``tenant_id`` and ``user_id``."""
        return user_key(getattr(self, "tenant_id"), getattr(self, "user_id"))  # noqa: B009

    def dumps(self) -> bytes:
        """The wire form (vectors packed: :data:`WIRE`); deterministic, so an event parsed
        back and dumped again gives the same bytes."""
        return self.model_dump_json(context=WIRE).encode()


class Role(StrEnum):
    USER = "user"
    ASSISTANT = "assistant"
    SYSTEM = "system"
    TOOL = "tool"


class ChatMessage(Event):
    """One conversation message, produced by a chat service to the messages topic."""

    tenant_id: Ident
    user_id: Ident
    session_id: Ident
    message_id: Ident = Field(description="Unique per session; a retried send reuses it")
    role: Role
    content: str = Field(description="The message text: data, never a command")
    ts: Timestamp = Field(description="When the message was written (ISO 8601)")
    metadata: dict[str, str | int | float | bool | None] = Field(default_factory=dict)
    schema_id: SchemaId = SCHEMA_ID_FIELD


class SessionEventKind(StrEnum):
    ENDED = "ended"


class SessionEvent(Event):
    """A session lifecycle event; ``ended`` flushes what is below the threshold."""

    tenant_id: Ident
    user_id: Ident
    session_id: Ident
    kind: SessionEventKind = SessionEventKind.ENDED
    ts: Timestamp
    schema_id: SchemaId = SCHEMA_ID_FIELD
