"""Agent memory tools, MemGPT/Letta style (SPEC §5): OpenAI tool definitions, their
argument models and the pure core-memory edit. No I/O: the HTTP layer executes the calls,
and writes go through the same decision, apply and audit path as extracted memories.

The pydantic models are the single source of truth; :data:`TOOLS` is generated from them
(titles dropped, ``X | None = None`` shown as an optional ``X``), so a schema cannot drift
from the validation that :func:`parse_arguments` applies. The models are strict: a model
that sends ``"5"`` for an integer gets an ``invalid_arguments`` error it can correct,
rather than a silent coercion the schema never promised.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from memstream.core.errors import MemstreamError
from memstream.topics.schemas import MAX_QUERY_CHARS

CORE_LABELS = ("profile", "instructions")
CORE_MAX_CHARS = 2000  # per core block
MAX_INSERT_CHARS = 2000
_NOT_BLANK = r"\S"  # JSON Schema and pydantic both search (unanchored): some non-space


class ToolError(MemstreamError):
    """A tool call that cannot run; ``code`` is ``unknown_tool`` or ``invalid_arguments``,
    ``str(exc)`` a message written for the model that made the call."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class MemorySearchArgs(_Args):
    query: str = Field(min_length=1, max_length=MAX_QUERY_CHARS, pattern=_NOT_BLANK,
                       description="What to look for, in natural language.")
    k: int | None = Field(None, ge=1, le=20,
                          description="How many memories to return (default 5).")


class MemoryInsertArgs(_Args):
    content: str = Field(min_length=1, max_length=MAX_INSERT_CHARS, pattern=_NOT_BLANK,
                         description="One self-contained fact or rule, in a full sentence.")
    importance: int | None = Field(
        None, ge=1, le=10, description="1 = trivia, 10 = essential (default: estimated).")
    type: Literal["episodic", "procedural"] = Field(
        "episodic", description="episodic: a fact or event about the user; procedural: a "
                                "rule for how you should act.")


class CoreMemoryReplaceArgs(_Args):
    label: Literal["profile", "instructions"] = Field(
        description="profile: who the user is; instructions: how the user wants you to act.")
    old_content: str = Field(max_length=CORE_MAX_CHARS, description=(
        "Exact text to replace, copied from the block; an empty string appends instead."))
    new_content: str = Field(max_length=CORE_MAX_CHARS, description=(
        "The replacement text; an empty string deletes old_content."))


class ConversationSearchArgs(_Args):
    query: str = Field(min_length=1, max_length=MAX_QUERY_CHARS, pattern=_NOT_BLANK,
                       description="Words or a phrase to find in past messages.")
    session_id: str | None = Field(
        None, min_length=1, max_length=128,
        description="Only this conversation (default: every past conversation of the user).")
    since: datetime | None = Field(
        None, description="Only messages said at or after this time (ISO 8601).")
    until: datetime | None = Field(
        None, description="Only messages said before this time (ISO 8601).")
    limit: int | None = Field(None, ge=1, le=50,
                              description="How many messages to return (default 10).")


ARGUMENTS: dict[str, type[_Args]] = {
    "memory_search": MemorySearchArgs,
    "memory_insert": MemoryInsertArgs,
    "core_memory_replace": CoreMemoryReplaceArgs,
    "conversation_search": ConversationSearchArgs,
}

_DESCRIPTIONS = {
    "memory_search": (
        "Search your long-term memory of this user (and general knowledge) by meaning. Use it "
        "before answering when earlier facts, preferences or events could matter and they are "
        "not already in your context. Returns the best matches, each with its date."),
    "memory_insert": (
        "Save one new fact, event or rule to long-term memory so you can recall it in later "
        "conversations. Use it when the user tells you something worth remembering; do not "
        "save small talk or what is already remembered. Contradicted facts are updated."),
    "core_memory_replace": (
        "Edit your always-visible core memory: 'profile' (who the user is) or 'instructions' "
        "(how they want you to act). Replaces the first occurrence of old_content with "
        "new_content; with old_content empty, appends new_content as a new line. Each block "
        f"holds at most {CORE_MAX_CHARS} characters, so keep it to the essentials."),
    "conversation_search": (
        "Search the raw messages of past conversations by words and meaning. Use it to find "
        "what exactly was said, and when, if long-term memory has no answer; it searches "
        "every conversation of the user unless given one, optionally within a time range. "
        "Returns the matching messages, each with its date."),
}


def tool_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON schema shaped for a model to read: no titles, optionals plain."""
    raw = model.model_json_schema()
    properties = {}
    for name, prop in raw["properties"].items():
        prop = {k: v for k, v in prop.items() if k != "title"}
        branches = prop.pop("anyOf", None)
        if branches is not None:  # ``X | None = None``: absent is the way to say None
            prop = {**next(b for b in branches if b.get("type") != "null"), **prop}
            if prop.get("default", ...) is None:
                del prop["default"]
        properties[name] = prop
    return {"type": "object", "properties": properties,
            "required": list(raw.get("required", [])), "additionalProperties": False}


TOOLS: list[dict[str, Any]] = [
    {"type": "function",
     "function": {"name": name, "description": _DESCRIPTIONS[name],
                  "parameters": tool_schema(model)}}
    for name, model in ARGUMENTS.items()
]


def describe_arguments(error: ValidationError, limit: int = 5) -> str:
    """The fields at fault and what is wrong with each, never their values."""
    parts = []
    for item in error.errors()[:limit]:
        where = ".".join(str(p) for p in item["loc"]) or "arguments"
        parts.append(f"{where}: {item['msg']}")
    more = error.error_count() - limit
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


def parse_arguments(name: str, arguments: dict[str, Any] | str) -> BaseModel:
    """Validate a tool call's arguments (an object, or the JSON string a model produced).

    Raises :class:`ToolError` ``unknown_tool`` for a name not in :data:`TOOLS`, and
    ``invalid_arguments`` for bad JSON, a non-object, an unknown or missing field, a wrong
    type or a value out of range; the message names the fields, never echoes their values.
    """
    model = ARGUMENTS.get(name)
    if model is None:
        raise ToolError("unknown_tool", f"unknown tool {name[:64]!r}; available: "
                                        f"{', '.join(ARGUMENTS)}")
    if isinstance(arguments, str):
        try:  # some models send "" for "no arguments"
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (json.JSONDecodeError, RecursionError) as exc:
            raise ToolError("invalid_arguments", f"{name}: arguments are not valid JSON "
                                                 f"({type(exc).__name__})") from None
    if not isinstance(arguments, dict):
        raise ToolError("invalid_arguments", f"{name}: arguments must be a JSON object")
    try:
        return model.model_validate(arguments)
    except ValidationError as exc:
        raise ToolError("invalid_arguments", f"{name}: {describe_arguments(exc)}") from None


def replace_core(current: str, old: str, new: str, max_chars: int = CORE_MAX_CHARS) -> str:
    """The core block after ``core_memory_replace``: ``old == ""`` appends ``new`` (on a new
    line when the block is not empty), otherwise the first occurrence of ``old`` becomes
    ``new``. Raises ``invalid_arguments`` when ``old`` is not in the block or the result
    would exceed ``max_chars``, so the model can retry with a shorter or exact text."""
    if old == "":
        if not new.strip():
            raise ToolError("invalid_arguments", "new_content is empty: nothing to append")
        result = f"{current}\n{new}" if current else new
    elif old not in current:
        raise ToolError("invalid_arguments", "old_content was not found in the block; copy "
                        "it exactly from core memory, or pass an empty old_content to append")
    else:
        result = current.replace(old, new, 1)
    if len(result) > max_chars:
        raise ToolError("invalid_arguments", f"the block would hold {len(result)} characters, "
                        f"over its limit of {max_chars}; shorten or replace existing text")
    return result
