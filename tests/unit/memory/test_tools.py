"""Agent tools (SPEC §5): OpenAI tool shapes, schema/model agreement, argument errors and
the core-memory edit.

``jsonschema`` is not installed, so agreement is checked with a small validator for exactly
the keywords the schemas use; a keyword it does not know fails the test instead of being
silently ignored.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from pydantic import BaseModel

from memstream.core.errors import MemstreamError
from memstream.memory.tools import (
    ARGUMENTS,
    CORE_LABELS,
    CORE_MAX_CHARS,
    TOOLS,
    CoreMemoryReplaceArgs,
    MemoryInsertArgs,
    MemorySearchArgs,
    ToolError,
    parse_arguments,
    replace_core,
)

pytestmark = pytest.mark.unit

NAMES = ["memory_search", "memory_insert", "core_memory_replace", "conversation_search"]
_KNOWN = {"type", "description", "enum", "minimum", "maximum", "minLength", "maxLength",
          "pattern", "default", "format"}


def _type_ok(kind: str, value: Any) -> bool:
    if kind == "string":
        return isinstance(value, str)
    if kind == "integer":  # bool is not an integer in JSON
        return isinstance(value, int) and not isinstance(value, bool)
    raise AssertionError(f"type {kind!r} not covered by this validator")


def schema_accepts(schema: dict[str, Any], args: Any) -> bool:
    """A JSON Schema check for the object-of-scalars subset the tool schemas use."""
    if not isinstance(args, dict):
        return False
    if any(field not in args for field in schema["required"]):
        return False
    for name, value in args.items():
        prop = schema["properties"].get(name)
        if prop is None:
            if schema["additionalProperties"] is False:
                return False
            continue
        if not _type_ok(prop["type"], value):
            return False
        if "enum" in prop and value not in prop["enum"]:
            return False
        if value < prop.get("minimum", value) or value > prop.get("maximum", value):
            return False
        if isinstance(value, str):
            if not prop.get("minLength", 0) <= len(value) <= prop.get("maxLength", len(value)):
                return False
            if "pattern" in prop and not re.search(prop["pattern"], value):
                return False
    return True


def model_accepts(model: type[BaseModel], args: Any) -> bool:
    try:
        parse_arguments(_name_of(model), args)
    except ToolError:
        return False
    return True


def _name_of(model: type[BaseModel]) -> str:
    return next(name for name, m in ARGUMENTS.items() if m is model)


def _params(name: str) -> dict[str, Any]:
    return next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == name)


# --- shape --------------------------------------------------------------------------------


def test_tools_are_openai_function_entries():
    assert [t["function"]["name"] for t in TOOLS] == NAMES
    for tool in TOOLS:
        assert set(tool) == {"type", "function"} and tool["type"] == "function"
        fn = tool["function"]
        assert set(fn) == {"name", "description", "parameters"}
        assert re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", fn["name"])
        assert 40 <= len(fn["description"]) <= 1024
        params = fn["parameters"]
        assert params["type"] == "object" and params["additionalProperties"] is False
        assert set(params["required"]) <= set(params["properties"])
        for prop in params["properties"].values():
            assert set(prop) <= _KNOWN, set(prop) - _KNOWN
            assert prop["description"]
            assert "anyOf" not in prop and "title" not in prop
    json.dumps(TOOLS)  # serialisable as is


@pytest.mark.parametrize(("name", "required"), [
    ("memory_search", ["query"]),
    ("memory_insert", ["content"]),
    ("core_memory_replace", ["label", "old_content", "new_content"]),
    ("conversation_search", ["query"]),
])
def test_required_lists(name, required):
    params = _params(name)
    assert params["required"] == required
    model = ARGUMENTS[name]
    assert set(params["properties"]) == set(model.model_fields)
    assert required == [f for f, info in model.model_fields.items() if info.is_required()]


def test_enums_and_ranges_as_specified():
    insert = _params("memory_insert")["properties"]
    assert insert["type"]["enum"] == ["episodic", "procedural"]
    assert insert["type"]["default"] == "episodic"
    assert (insert["importance"]["minimum"], insert["importance"]["maximum"]) == (1, 10)
    assert (insert["content"]["minLength"], insert["content"]["maxLength"]) == (1, 2000)
    assert _params("core_memory_replace")["properties"]["label"]["enum"] == list(CORE_LABELS)
    k = _params("memory_search")["properties"]["k"]
    assert (k["type"], k["minimum"], k["maximum"]) == ("integer", 1, 20)
    limit = _params("conversation_search")["properties"]["limit"]
    assert (limit["minimum"], limit["maximum"]) == (1, 50)


# --- schema and model agree ----------------------------------------------------------------

SAMPLES: dict[str, list[Any]] = {
    "memory_search": [
        {"query": "where does the user live"}, {"query": "x", "k": 1}, {"query": "x", "k": 20},
        {"query": "x", "k": 0}, {"query": "x", "k": 21}, {"query": "x", "k": "5"},
        {"query": "x", "k": True}, {"query": ""}, {"query": "   "}, {"query": 5}, {},
        {"query": "x", "extra": 1}, {"query": "x" * 4000}, {"query": "x" * 4001}, ["x"],
    ],
    "memory_insert": [
        {"content": "Lives in Berlin."}, {"content": "a", "importance": 10, "type": "procedural"},
        {"content": "a", "type": "episodic"}, {"content": "a", "type": "semantic"},
        {"content": "a", "importance": 0}, {"content": "a", "importance": 11},
        {"content": "a", "importance": 5.5}, {"content": "x" * 2000}, {"content": "x" * 2001},
        {"content": ""}, {"content": "\n\t"}, {"importance": 3}, {"content": "a", "user_id": "u2"},
    ],
    "core_memory_replace": [
        {"label": "profile", "old_content": "", "new_content": "Name: Ada."},
        {"label": "instructions", "old_content": "a", "new_content": ""},
        {"label": "persona", "old_content": "", "new_content": "x"},
        {"label": "profile", "new_content": "x"}, {"label": "profile", "old_content": ""},
        {"label": "profile", "old_content": None, "new_content": "x"},
        {"label": "profile", "old_content": "", "new_content": "x" * (CORE_MAX_CHARS + 1)},
    ],
    "conversation_search": [
        {"query": "flight"}, {"query": "flight", "session_id": "s1", "limit": 50},
        {"query": "flight", "limit": 51}, {"query": "flight", "limit": 0},
        {"query": "flight", "session_id": ""}, {"query": "flight", "session_id": 7},
        {"query": "flight", "session": "s1"},
    ],
}


@pytest.mark.parametrize(("name", "args"),
                         [(n, a) for n, samples in SAMPLES.items() for a in samples])
def test_schema_and_model_agree(name, args):
    assert schema_accepts(_params(name), args) == model_accepts(ARGUMENTS[name], args)


def test_samples_cover_accept_and_reject():
    for name, samples in SAMPLES.items():
        verdicts = {schema_accepts(_params(name), a) for a in samples}
        assert verdicts == {True, False}, name


# --- parse_arguments ---------------------------------------------------------------------


def test_parse_returns_models_with_defaults():
    search = parse_arguments("memory_search", {"query": "berlin"})
    assert isinstance(search, MemorySearchArgs) and search.k is None
    insert = parse_arguments("memory_insert", '{"content": "Lives in Berlin.", "importance": 7}')
    assert insert == MemoryInsertArgs(content="Lives in Berlin.", importance=7, type="episodic")
    replace = parse_arguments("core_memory_replace",
                              {"label": "profile", "old_content": "", "new_content": "Ada"})
    assert isinstance(replace, CoreMemoryReplaceArgs) and replace.label == "profile"


def test_unknown_tool():
    with pytest.raises(ToolError) as err:
        parse_arguments("rm_rf", {})
    assert err.value.code == "unknown_tool"
    assert "memory_search" in str(err.value)
    assert isinstance(err.value, MemstreamError)


@pytest.mark.parametrize(("args", "mentions"), [
    ('{"query": ', "not valid JSON"),
    ("[1, 2]", "JSON object"),
    ('"berlin"', "JSON object"),
    ("", "query"),  # empty string = no arguments: the required field is missing
    ({"query": "x", "k": 99}, "k"),
    ({"query": "x", "k": "5"}, "k"),
    ({"query": "x", "verbose": True}, "verbose"),
    ("[" * 100_000 + "]" * 100_000, "not valid JSON"),
])
def test_invalid_arguments(args, mentions):
    with pytest.raises(ToolError) as err:
        parse_arguments("memory_search", args)
    assert err.value.code == "invalid_arguments"
    assert mentions in str(err.value)


def test_error_message_does_not_echo_values():
    secret = "my password is hunter2"
    with pytest.raises(ToolError) as err:
        parse_arguments("memory_insert", {"content": secret, "importance": secret})
    assert "hunter2" not in str(err.value) and "importance" in str(err.value)


# --- replace_core -------------------------------------------------------------------------


@pytest.mark.parametrize(("current", "old", "new", "result"), [
    ("", "", "Name: Ada.", "Name: Ada."),
    ("Name: Ada.", "", "Lives in Berlin.", "Name: Ada.\nLives in Berlin."),
    ("Lives in Berlin.", "Berlin", "Munich", "Lives in Munich."),
    ("a a a", "a", "b", "b a a"),  # first occurrence only
    ("Name: Ada. Likes tea.", " Likes tea.", "", "Name: Ada."),  # delete
])
def test_replace_core(current, old, new, result):
    assert replace_core(current, old, new) == result


def test_replace_core_old_not_found():
    with pytest.raises(ToolError) as err:
        replace_core("Lives in Berlin.", "Munich", "Hamburg")
    assert err.value.code == "invalid_arguments"
    assert "not found" in str(err.value) and "empty old_content" in str(err.value)


def test_replace_core_limit():
    full = "x" * 10
    assert replace_core(full, "", "y" * 4, max_chars=15) == full + "\n" + "yyyy"
    with pytest.raises(ToolError) as err:
        replace_core(full, "", "y" * 5, max_chars=15)
    assert err.value.code == "invalid_arguments" and "16" in str(err.value)
    with pytest.raises(ToolError):
        replace_core("", "", "z" * (CORE_MAX_CHARS + 1))
    assert len(replace_core("", "", "z" * CORE_MAX_CHARS)) == CORE_MAX_CHARS


def test_replace_core_appending_nothing_is_an_error():
    with pytest.raises(ToolError):
        replace_core("Name: Ada.", "", "  ")
