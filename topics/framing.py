"""Confluent Schema Registry framing on the producers' topics: pure, bytes in, bytes out.

A schema-registry serializer (Confluent's ``KafkaJsonSchemaSerializer``, confluent-kafka's
``JSONSerializer``, their Go, .NET and JavaScript twins) writes a value as the "wire
format": the magic byte ``0x00``, the schema id as 4 bytes big-endian, then the payload.
memstream reads the JSON serializer's records on the messages and session-events topics
like plain JSON, the id kept (:attr:`Unframed.schema_id`), never resolved: the worker
needs no registry, and the JSON itself is validated as always (``codec.decode``).

The same header before Avro binary or Protobuf (whose payload starts with the message-index
array, a varint count, ``0x00`` for the common ``[0]``) is not JSON: such a record is
refused with a reason that names it (kind ``not_json``: it goes to the dead-letter topic
with the usual bounded copy of its bytes). A plain JSON value never starts with ``0x00``
(JSON text starts with whitespace or a value, and NUL is neither), so a value is framed
exactly when its first byte is ``0x00``, and a plain JSON value reads as it always has.
"""

from __future__ import annotations

from typing import NamedTuple

from memstream.core.errors import InvalidRecord

MAGIC = 0x00
HEADER_BYTES = 5  # magic byte + schema id (int32, big-endian)
_JSON_SPACE = b" \t\r\n"  # the whitespace JSON allows before a value


class Unframed(NamedTuple):
    """A value's payload and, when it came framed, the schema id of its header."""

    schema_id: int | None
    payload: bytes


def frame(schema_id: int, payload: bytes) -> bytes:
    """``payload`` in Confluent's wire format (what a registry serializer writes)."""
    return bytes([MAGIC]) + schema_id.to_bytes(4, "big") + payload


def _non_json(schema_id: int, payload: bytes) -> InvalidRecord:
    if not payload:
        what = "record with no payload"
    elif payload[0] == 0x00:  # Protobuf's message-index array [0], then binary
        what = "Protobuf (message index [0])"
    else:
        what = "non-JSON (Avro or Protobuf)"
    return InvalidRecord("not_json", f"schema-registry framed {what} (schema id {schema_id}): "
                                     "memstream reads JSON only (use the JSON Schema serializer)")


def unframe(value: bytes) -> Unframed:
    """The JSON payload of ``value`` and its schema id (None: not framed, read as it is).

    Raises :class:`InvalidRecord` (kind ``not_json``) for a framed value whose payload is
    not a JSON object (Avro, Protobuf) and for a header cut short."""
    if not value or value[0] != MAGIC:
        return Unframed(None, value)
    if len(value) < HEADER_BYTES:
        raise InvalidRecord(
            "not_json", f"schema-registry header cut short: {len(value)} of "
                        f"{HEADER_BYTES} bytes (magic byte 0 + 4-byte schema id)")
    schema_id = int.from_bytes(value[1:HEADER_BYTES], "big")
    payload = value[HEADER_BYTES:]
    if not payload.lstrip(_JSON_SPACE).startswith(b"{"):
        raise _non_json(schema_id, payload)
    return Unframed(schema_id, payload)
