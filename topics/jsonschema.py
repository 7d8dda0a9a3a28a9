"""The contract as JSON Schema files (``docs/schemas/``), generated from the pydantic models,
so teams in other languages can validate what they produce and read.

    memstream schemas            # write them
    memstream schemas --check    # exit 1 if a file is not what the models say (tests run it)

Inputs (what chat services produce) are described as the workers accept them; outputs
(what downstream services and operators read) as the workers write them. Pure but for
:func:`write`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from memstream.contract.events import MemoryEvent
from memstream.topics.schemas import ChatMessage, DeadLetter, SessionEvent

BASE_URI = "urn:memstream:schema:"  # names, not addresses: the files are in docs/schemas
Mode = Literal["validation", "serialization"]

# file -> (model, topic suffix, produced by, mode)
SCHEMAS: dict[str, tuple[type[BaseModel], str, str, Mode]] = {
    "chat-message.v1.json": (ChatMessage, "messages", "chat services", "validation"),
    "session-event.v1.json": (SessionEvent, "session-events", "chat services", "validation"),
    "memory-event.v1.json": (MemoryEvent, "memory-events", "memstream", "serialization"),
    "dead-letter.v1.json": (DeadLetter, "dead-letters", "memstream", "serialization"),
}


def schema_of(name: str) -> dict[str, Any]:
    model, topic, producer, mode = SCHEMAS[name]
    schema = model.model_json_schema(mode=mode)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": BASE_URI + name,
        "$comment": f"Generated from {model.__module__}.{model.__name__} by `memstream "
                    f"schemas`; topic <prefix>.{topic}, produced by {producer}. Within "
                    "schema_version 1 fields are only added; readers ignore unknown ones.",
        **schema,
    }


def render(name: str) -> str:
    return json.dumps(schema_of(name), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def stale(directory: Path) -> list[str]:
    """The files of ``directory`` that differ from what the models generate (or are missing)."""
    out = []
    for name in SCHEMAS:
        path = directory / name
        if not path.exists() or path.read_text(encoding="utf-8") != render(name):
            out.append(name)
    return out


def write(directory: Path) -> list[str]:
    directory.mkdir(parents=True, exist_ok=True)
    for name in SCHEMAS:
        (directory / name).write_text(render(name), encoding="utf-8")
    return list(SCHEMAS)
