"""The one codec of the contract: bytes in, a validated event out, or a clear reason.

``decode`` never lets a bad record through and never raises anything but
:class:`~memstream.core.errors.InvalidRecord`, whose ``kind`` and message go to the dead-letter
topic with a bounded copy of the original (``dead_letter``). What it guards against, at the
door, so that nothing downstream (state snapshots, the store, other consumers) meets it:

- size: the byte limit is checked first, on the bytes aiokafka hands over (a compressed
  batch is already decompressed), so huge but shallow values (a million metadata entries)
  never reach the parser; internal topics pass a larger limit;
- text: strict UTF-8, no NaN / Infinity (nor ``1e999``), integers within signed 64 bits
  (a 5,000-digit literal never reaches ``int()``), at most :data:`MAX_DEPTH` nested
  arrays/objects, no lone UTF-16 surrogate (``"\\ud800"``) in any string or key;
- framing: on the messages and session-events topics (:data:`FRAMED_MODELS`) a value in
  Confluent's schema-registry wire format is read as its JSON payload, the schema id kept
  on the event (``schema_id``); Avro or Protobuf behind the header is refused by name
  (:mod:`memstream.topics.framing`);
- contract: a JSON object, ``schema_version`` absent or the integer :data:`SCHEMA_VERSION`
  (``true`` and ``1.0`` are not), the model's fields, every datetime convertible to UTC
  within years :data:`MIN_YEAR`..:data:`MAX_YEAR`, and for keyed events a record key equal
  to ``tenant/user``.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import math
import re
from datetime import UTC, datetime
from enum import Enum
from typing import Annotated, Any, Literal, NoReturn, TypeVar, get_args, get_origin

from pydantic import BaseModel, ValidationError

from memstream.core.errors import InvalidRecord
from memstream.topics.framing import unframe
from memstream.topics.schemas import SCHEMA_VERSION, ChatMessage, DeadLetter, Event, SessionEvent

M = TypeVar("M", bound=BaseModel)

# What chat services produce may come in Confluent's schema-registry wire format (topics.framing)
FRAMED_MODELS: frozenset[type[BaseModel]] = frozenset({ChatMessage, SessionEvent})

MAX_DEPTH = 32  # nested arrays/objects; our deepest event (a decision's records) uses ~6
INT_MIN, INT_MAX = -(2**63), 2**63 - 1
MIN_YEAR, MAX_YEAR = 1970, 9999
_INT_DIGITS = 20  # longer literals are out of range anyway; checked before int() runs
_SURROGATE = re.compile("[\ud800-\udfff]")
_ESCAPED_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")
_HOLDS_DATES = (datetime, BaseModel, list, tuple, dict)

# What a dead letter keeps, so that it always fits its topic (1 MiB max.message.bytes):
# 256 KiB of value (349,528 base64 characters: a whole record up to the default
# max_message_bytes) + 1 KiB of key + 2,000 characters of reason + a few hundred bytes of
# fields stay far below the limit, whatever the original's size.
DEAD_LETTER_VALUE_BYTES = 256 * 1024
DEAD_LETTER_KEY_BYTES = 1024
DEAD_LETTER_REASON_CHARS = 2000


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors(include_input=False)[:5]:
        where = ".".join(str(p) for p in err["loc"]) or "record"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)


def _show(value: object, limit: int = 60) -> str:
    """A short, printable picture of a value for a reason text (never the whole value)."""
    if isinstance(value, str | bytes | int | float | bool) or value is None:
        text = repr(value)
        return text if len(text) <= limit else text[:limit] + "...'"
    return f"a JSON {'object' if isinstance(value, dict) else 'array'}"


def _bad_number(kind: str, literal: str) -> NoReturn:
    raise InvalidRecord("number", f"{kind} {_show(literal, 40)} is not allowed")


def _parse_int(literal: str) -> int:
    if len(literal.lstrip("-")) > _INT_DIGITS:
        _bad_number("integer with more than 20 digits", literal[:30])
    value = int(literal)
    if not INT_MIN <= value <= INT_MAX:
        _bad_number("integer outside signed 64 bits", literal)
    return value


def _parse_constant(literal: str) -> NoReturn:
    _bad_number("non-finite number", literal)  # NaN, Infinity, -Infinity


def _check_str(text: str, where: str) -> None:
    if _SURROGATE.search(text):
        raise InvalidRecord("unicode", f"{where} contains a lone UTF-16 surrogate")


def _parse_float(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
        raise InvalidRecord("number", "a number overflows to infinity")
    return value


def _check_depth(data: object) -> None:
    """At most :data:`MAX_DEPTH` nested arrays/objects, one level at a time (a parsed
    value's containers are exactly ``dict`` and ``list``)."""
    level: list[Any] = [[data]]
    for depth in range(MAX_DEPTH + 1):
        below = [v for node in level for v in (node.values() if type(node) is dict else node)
                 if type(v) is dict or type(v) is list]
        if not below:
            return
        if depth >= MAX_DEPTH:
            raise InvalidRecord("depth", f"nested deeper than {MAX_DEPTH} arrays/objects")
        level = below


def _check_strings(data: object) -> None:
    """No lone surrogate in any string or key of a parsed JSON value, without recursion."""
    stack: list[Any] = [data]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            _check_str(node, "a string")
        elif isinstance(node, dict):
            for k in node:
                _check_str(k, "a key")
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


def parse_json(value: bytes) -> Any:
    """Strict UTF-8 JSON with the limits above (no model yet)."""
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRecord(
            "not_json", f"not UTF-8 JSON: {exc.reason} at byte {exc.start}") from None
    try:
        data = json.loads(text, parse_int=_parse_int, parse_float=_parse_float,
                          parse_constant=_parse_constant)
    except json.JSONDecodeError as exc:
        raise InvalidRecord("not_json", f"not JSON: {exc.msg} at char {exc.pos}") from None
    except RecursionError:
        raise InvalidRecord("depth", f"nested deeper than {MAX_DEPTH} arrays/objects") from None
    _check_depth(data)
    # strict UTF-8 holds no surrogate: a parsed string can only get one from an escape
    if _ESCAPED_SURROGATE.search(text) is not None:
        _check_strings(data)
    return data


def _check_version(data: dict[str, Any]) -> None:
    version = data.get("schema_version", SCHEMA_VERSION)
    if type(version) is not int or version != SCHEMA_VERSION:  # True == 1, 1.0 == 1
        raise InvalidRecord(
            "version",
            f"unknown schema_version {_show(version)} (this worker reads {SCHEMA_VERSION})",
        )


def _check_datetime(value: datetime, where: str) -> None:
    try:
        utc = value.astimezone(UTC) if value.tzinfo is not None else value
    except (OverflowError, ValueError):
        raise InvalidRecord("date", f"{where}: {value.isoformat()} is not a time in UTC") from None
    if not MIN_YEAR <= utc.year <= MAX_YEAR:
        raise InvalidRecord(
            "date", f"{where}: {value.isoformat()} is outside years {MIN_YEAR}..{MAX_YEAR}")


_NO_DATES = (str, int, float, bool, bytes, type(None), Enum)
_JSON_CONTAINERS = (dict, list, tuple, set, frozenset)  # bare: the parser's values only


def _holds_dates(tp: Any, seen: frozenset[type] = frozenset()) -> bool:
    """Whether a value of type ``tp`` can hold a datetime once validated. ``Any``, plain
    JSON types and literals cannot (pydantic leaves their strings as strings); a type this
    does not know (``AwareDatetime``, a ``TypedDict``, a forward reference) can, and a model
    already on the path (a recursive one) is walked: never skip what may hold one."""
    if tp is Any or tp is object or tp is Ellipsis or tp in _JSON_CONTAINERS \
            or get_origin(tp) is Literal:
        return False
    if get_origin(tp) is Annotated:
        return _holds_dates(get_args(tp)[0], seen)
    if isinstance(tp, type) and get_origin(tp) is None:
        if issubclass(tp, BaseModel):
            return tp in seen or bool(_date_fields(tp, seen | {tp}))
        return issubclass(tp, datetime) or not issubclass(tp, _NO_DATES)
    args = get_args(tp)
    return any(_holds_dates(arg, seen) for arg in args) if args else True


@functools.cache
def _date_fields(model: type[BaseModel], seen: frozenset[type] = frozenset()) -> tuple[str, ...]:
    """The fields of ``model`` whose values can hold a datetime, by their types."""
    return tuple(name for name, info in model.model_fields.items()
                 if _holds_dates(info.annotation, seen | {model}))


def check_datetimes(event: BaseModel) -> None:
    """Every datetime anywhere in ``event`` converts to UTC within the sane range (only the
    fields whose types can hold one are walked)."""
    stack: list[tuple[object, str]] = [(event, "")]
    while stack:
        node, where = stack.pop()
        if isinstance(node, datetime):
            _check_datetime(node, where)
            continue
        if isinstance(node, BaseModel):
            children: Any = ((f, getattr(node, f)) for f in _date_fields(type(node)))
        elif isinstance(node, dict):
            children = node.items()
        elif isinstance(node, list | tuple):
            children = enumerate(node)
        else:
            continue
        stack.extend((v, f"{where}.{k}" if where else str(k)) for k, v in children
                     if isinstance(v, _HOLDS_DATES))


def _check_key(event: BaseModel, key: bytes | None) -> None:
    if not (isinstance(event, Event) and "tenant_id" in type(event).model_fields):
        return
    expected = event.key()
    if key is None:
        raise InvalidRecord("key", f"record has no key (expected {expected!r})")
    if key != expected.encode():
        raise InvalidRecord(
            "key", f"record key {_show(key)} does not match tenant/user {expected!r}")


def _validate(model: type[M], payload: bytes, key: bytes | None, schema_id: int | None) -> M:
    data = parse_json(payload)
    if not isinstance(data, dict):
        raise InvalidRecord("schema", f"expected a JSON object, got {_show(data)}")
    _check_version(data)
    if model in FRAMED_MODELS:  # the header's id (None: not framed), never one the JSON claims
        data["schema_id"] = schema_id
    try:
        event = model.model_validate(data)
    except ValidationError as exc:
        raise InvalidRecord("schema", f"{model.__name__} invalid: {_describe(exc)}") from None
    check_datetimes(event)
    _check_key(event, key)
    return event


def _decode(model: type[M], value: bytes | None, key: bytes | None,
            max_bytes: int | None) -> M:
    if not value:
        raise InvalidRecord("empty", "record has no value (tombstone)" if value is None
                            else "record value is empty")
    if max_bytes is not None and len(value) > max_bytes:
        raise InvalidRecord("too_large", f"record is {len(value)} bytes, limit {max_bytes}")
    if model not in FRAMED_MODELS:
        return _validate(model, value, key, None)
    schema_id, payload = unframe(value)
    try:
        return _validate(model, payload, key, schema_id)
    except InvalidRecord as exc:  # a framed record's reason names its schema id
        if schema_id is None:
            raise
        raise InvalidRecord(exc.kind, f"{exc} (schema-registry framed JSON, schema id "
                                      f"{schema_id})") from None


def decode(
    model: type[M], value: bytes | None, key: bytes | None = None, *, max_bytes: int | None = None
) -> M:
    """Parse and validate one record of ``model``; a keyed model needs the matching key.

    ``max_bytes`` bounds the (decompressed) value; None means no limit. Raises only
    :class:`InvalidRecord`: an unexpected error while validating is reported as kind
    ``schema`` naming the exception, so that no input can crash a stage.
    """
    try:
        return _decode(model, value, key, max_bytes)
    except InvalidRecord:
        raise
    except Exception as exc:  # a validator bug must not let one record stop a partition
        raise InvalidRecord("schema", f"{model.__name__} could not be validated: "
                                      f"{type(exc).__name__}") from exc


def decode_own(model: type[M], value: bytes | None) -> M:
    """One record of a topic only memstream writes (the memory-change topic: our own
    transactional producer), on a hot path (a rebuild folds the whole topic): pydantic-core
    parses and validates the bytes in one pass, without :func:`decode`'s tree walks (depth,
    surrogates, integer sizes, dates, key), which guard against what chat services send.
    A record that does not validate (its ``schema_version`` included) is still refused:
    raises only :class:`InvalidRecord`."""
    if not value:
        raise InvalidRecord("empty", "record has no value (tombstone)" if value is None
                            else "record value is empty")
    try:
        event = model.model_validate_json(value)
    except ValidationError as exc:
        raise InvalidRecord("schema", f"{model.__name__} invalid: {_describe(exc)}") from None
    except Exception as exc:  # a validator bug: reported as the record's fault, never a crash
        raise InvalidRecord("schema", f"{model.__name__} could not be validated: "
                                      f"{type(exc).__name__}") from exc
    return event


def check_message(message: ChatMessage, max_chars: int) -> None:
    """Content rules that pydantic types alone do not say."""
    if not message.content.strip():
        raise InvalidRecord("empty", "content is empty")
    if len(message.content) > max_chars:
        raise InvalidRecord(
            "too_large", f"content is {len(message.content)} characters, limit {max_chars}"
        )
    if "\x00" in message.content:
        raise InvalidRecord("schema", "content contains NUL characters")


def _bounded_text(text: str, limit: int) -> str:
    safe = text.encode("utf-8", "backslashreplace").decode("utf-8")  # no lone surrogates
    return safe if len(safe) <= limit else safe[: limit - 3] + "..."


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def dead_letter(
    exc: InvalidRecord,
    *,
    topic: str,
    partition: int,
    offset: int,
    key: bytes | None,
    value: bytes | None,
    now: datetime,
) -> DeadLetter:
    """The dead letter of one record: bounded (it always fits its topic), with the length
    and sha256 of the whole original, which stays at ``topic/partition/offset``."""
    raw = value or b""
    return DeadLetter(
        reason=_bounded_text(str(exc), DEAD_LETTER_REASON_CHARS),
        kind=_bounded_text(exc.kind, 40),
        source_topic=topic,
        partition=partition,
        offset=offset,
        key_b64=_b64(key[:DEAD_LETTER_KEY_BYTES]) if key is not None else None,
        key_truncated=key is not None and len(key) > DEAD_LETTER_KEY_BYTES,
        value_b64=_b64(raw[:DEAD_LETTER_VALUE_BYTES]),
        truncated=len(raw) > DEAD_LETTER_VALUE_BYTES,
        value_length=len(raw),
        value_sha256=hashlib.sha256(raw).hexdigest(),
        failed_at=now,
    )
