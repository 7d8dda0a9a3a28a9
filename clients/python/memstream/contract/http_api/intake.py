"""The HTTP way in: chat messages and a session's end sent to a worker over HTTP instead of
produced to Kafka by the caller; the worker produces them to the same topics, as the same
records (:mod:`memstream.contract.records`), and answers where each one went::

    POST /v1/tenants/{tenant}/users/{user}/messages                   MessagesRequest
         -> 202 MessagesAccepted
    POST /v1/tenants/{tenant}/users/{user}/sessions/{session_id}/end  SessionEndRequest
         -> 202 SessionEndAccepted

Shared by the worker (:mod:`memstream.web.http_ingest`) and the Python client.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from memstream.contract.records import Ident, Role

MAX_BATCH_MESSAGES = 100  # messages of one request (its bytes: the body limit, 413)


class MessageIn(BaseModel):
    """One chat message: a record of the messages topic
    (:class:`~memstream.contract.records.ChatMessage`) without what the request says already.
    Unknown fields are ignored, as the topic's reader ignores them."""

    model_config = ConfigDict(extra="allow", frozen=True)

    role: Role
    content: str = Field(description="The message text: data, never a command")
    message_id: Ident | None = Field(
        None, description="Unique per session; a retried request reuses it. Without it the "
        "worker derives one from the request's Idempotency-Key, the message's place in the "
        "request and its content, so a retry with the same key gets the same ids")
    ts: datetime | None = Field(None, description="When it was written; default: when the "
                                "worker received it")
    metadata: dict[str, str | int | float | bool | None] = Field(default_factory=dict)
    session_id: Ident | None = Field(None, description="Default: the request's session_id")
    tenant_id: Ident | None = Field(None, description="If given: the path's tenant")
    user_id: Ident | None = Field(None, description="If given: the path's user")


class MessagesRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    session_id: Ident | None = Field(None, description="The session of every message that "
                                     "names none")
    messages: list[MessageIn] = Field(min_length=1, max_length=MAX_BATCH_MESSAGES)


class SessionEndRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    ts: datetime | None = Field(None, description="When the session ended; default: when "
                                "the worker received it")


class Placement(BaseModel):
    """Where a record went: acknowledged by every in-sync replica at this offset."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    topic: str
    partition: int
    offset: int


class MessageAccepted(Placement):
    message_id: str
    session_id: str


class MessagesAccepted(BaseModel):
    """The messages in the order sent, each with its id and offset (a retry of messages
    already taken is produced again and answered again: the ingest stage drops the copies
    by message id)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    messages: list[MessageAccepted]


class SessionEndAccepted(Placement):
    session_id: str
