"""The records of the HTTP way in, built and checked without I/O: a request's chat messages
(and a session's end) become the records a chat service would produce, checked by the
codec the ingest stage reads them with (:func:`memstream.topics.codec.decode`, the same
byte and character limits), so a record the API accepts is never dead-lettered and one it
refuses would have been.

- The path's tenant and user are the records' (a message naming others is 400); the key is
  ``tenant/user``, as the topic contract requires.
- Each message has a ``message_id``: the caller's, or one derived from the request's
  ``Idempotency-Key``, the message's place and what it says (:func:`derived_id`), so a
  retry with the same key produces the same ids and the ingest stage, which drops a message
  id it has seen in the session (``memory.coalescing.on_message``), takes it once.
- Refusals name the message and the rule, never its text: 400, or 413 for content past
  ``max_content_chars`` / a record past ``max_message_bytes``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any, TypeVar

from memstream.contract.http_api.api import ErrorCode
from memstream.contract.http_api.intake import MessagesRequest
from memstream.core.errors import InvalidRecord
from memstream.topics.codec import check_message, decode
from memstream.topics.schemas import ChatMessage, Event, SessionEvent, user_key
from memstream.web.http_base import ApiError
from memstream.web.http_checks import bad

E = TypeVar("E", bound=Event)


def derived_id(idempotency_key: str, tenant: str, user: str, session: str, index: int,
               message: Mapping[str, Any]) -> str:
    """The id of a message sent without one: the same for a retry with the same
    ``Idempotency-Key``; a key reused for other messages gives other ids (none is lost)."""
    what = json.dumps([message.get("role"), message.get("content")], sort_keys=True)
    raw = "\x1f".join([idempotency_key, tenant, user, session, str(index), what])
    return "m-" + hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()[:40]


def _checked(model: type[E], fields: dict[str, Any], where: str, max_bytes: int) -> E:
    """``fields`` as the record a producer would send, decoded as the ingest stage does."""
    value = json.dumps(fields).encode()  # ASCII: a lone surrogate stays an escape, refused
    key = user_key(fields["tenant_id"], fields["user_id"]).encode()
    try:
        return decode(model, value, key, max_bytes=max_bytes)
    except InvalidRecord as exc:
        raise refusal(exc, where) from None


def refusal(exc: InvalidRecord, where: str) -> ApiError:
    if exc.kind == "too_large":
        return ApiError(413, ErrorCode.PAYLOAD_TOO_LARGE, f"{where}: {exc}")
    return bad(f"{where}: {exc.kind}: {exc}")


def _same(given: Any, wanted: str, where: str, name: str) -> None:
    if given is not None and given != wanted:
        raise bad(f"{where}: {name} is not the path's ({name} may be left out)")


def chat_messages(tenant: str, user: str, req: MessagesRequest, idempotency_key: str,
                  now: datetime, *, max_bytes: int, max_chars: int,
                  most: int | None = None) -> list[ChatMessage]:
    """The request's messages as records of the messages topic, in order (see the module
    doc); raises :class:`ApiError` (400 / 413) naming the first bad one. ``most``: the
    ingest stage's ``dedup_window`` (the message ids it remembers per session): a request
    of more could be applied twice when retried, so it is refused."""
    if most is not None and len(req.messages) > most:
        raise bad(f"messages: at most {most} per request (the message ids the ingest stage "
                  "remembers per session, MEMSTREAM_DEDUP_WINDOW: a retried request of more "
                  "could be taken twice); send them in several requests")
    out: list[ChatMessage] = []
    for i, m in enumerate(req.messages):
        where = f"messages[{i}]"
        fields = m.model_dump(mode="json", exclude_none=True)
        _same(fields.get("tenant_id"), tenant, where, "tenant_id")
        _same(fields.get("user_id"), user, where, "user_id")
        session = fields.get("session_id") or req.session_id
        if session is None:
            raise bad(f"{where}: no session_id (give it in the body or the message)")
        fields |= {"tenant_id": tenant, "user_id": user, "session_id": session}
        fields.setdefault("ts", now.isoformat())
        fields.setdefault("message_id", derived_id(idempotency_key, tenant, user, session,
                                                   i, fields))
        message = _checked(ChatMessage, fields, where, max_bytes)
        try:
            check_message(message, max_chars)
        except InvalidRecord as exc:
            raise refusal(exc, where) from None
        out.append(message)
    ids = [(m.session_id, m.message_id) for m in out]
    if len(set(ids)) != len(ids):
        raise bad("two messages of one session share a message_id")
    return out


def session_end(tenant: str, user: str, session: str, ts: datetime | None, now: datetime, *,
                max_bytes: int) -> SessionEvent:
    """The ``ended`` event of a session, as a record of the session-events topic."""
    fields = {"tenant_id": tenant, "user_id": user, "session_id": session, "kind": "ended",
              "ts": (ts or now).isoformat()}
    return _checked(SessionEvent, fields, "body", max_bytes)
