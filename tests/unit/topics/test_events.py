"""The public memory event (contract.events, topics.publishing): built from real change
events (add, update, delete, erase), slim on the wire, and valid against the JSON Schema
files generated from the models (topics.jsonschema, docs/schemas/)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import jsonschema
import pytest

from memstream.contract.events import MemoryEvent
from memstream.memory.applying import apply_decision, build_decision
from memstream.memory.coalescing import on_tool
from memstream.memory.embedding import HashingEmbedder
from memstream.memory.extraction import Extractor, RulesModel
from memstream.sealing import envelope as crypto
from memstream.topics.jsonschema import SCHEMAS, render, schema_of, stale
from memstream.topics.publishing import public_event
from memstream.topics.schemas import MemoryChange
from tests.unit.builders import P, forget_request, fresh, job, make_store, msg

pytestmark = pytest.mark.unit
SCHEMA_DIR = Path(__file__).resolve().parents[3] / "docs" / "schemas"
SCRIPT = [["I live in Oslo"], ["I moved to Bergen"], ["I no longer live in Bergen"]]


def at(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


@pytest.fixture(scope="module")
def changes(tmp_path_factory) -> dict[str, MemoryChange]:
    """add (job 1), update (job 2), delete (job 3) of one memory, then the user's erase."""
    store = make_store("edge", tmp_path_factory.mktemp("store"), HashingEmbedder().dim)
    ex = Extractor(RulesModel(), HashingEmbedder(), store)
    out: list[MemoryChange] = []
    for seq, texts in enumerate(SCRIPT, 1):
        j = job(texts, job_id=f"job-{seq}").model_copy(update={"seq": seq})
        out += apply_decision(store, build_decision(j, ex.decide(j, 10.0 * seq), ex.model,
                                                    10.0 * seq)).publish
    [forget] = on_tool(fresh(), forget_request(), 40.0, P).jobs
    forget = forget.model_copy(update={"seq": 4})
    out += apply_decision(store, build_decision(forget, ex.decide(forget, 40.0), ex.model,
                                                40.0)).publish
    store.close()
    assert [c.op for c in out] == ["add", "update", "delete", "erase"]
    return {c.op: c for c in out}


def validator(name: str) -> jsonschema.Draft202012Validator:
    schema = json.loads((SCHEMA_DIR / name).read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())


# --- public_event ------------------------------------------------------------------------

def test_an_add_maps_ids_version_content_and_lineage(changes):
    c = changes["add"]
    e = public_event(c)
    assert (e.change_id, e.op, e.tenant_id, e.user_id, e.memory_id, e.version) == (
        c.change_id, "add", "t1", "u1", c.memory_id, 1)
    assert e.before is None and e.after is not None and e.erased_versions is None
    a = e.after
    assert (a.version, a.content, a.type, a.status, a.slot) == (
        1, "Lives in Oslo", "episodic", "active", "residence")
    assert a.importance == c.after["importance"]
    assert (a.created_at, a.updated_at, a.valid_from, a.valid_to) == (at(10), at(10), at(10),
                                                                      None)
    assert a.event_time == at(c.after["source"]["event_ts"])
    lin = e.lineage
    assert (lin.kind, lin.session_id, lin.job_id, lin.job_seq, lin.message_ids) == (
        "extraction", "s1", "job-1", 1, ["job-1-0"])
    assert (lin.from_seq, lin.to_seq, lin.actor) == (0, 1, "")
    assert (e.reason, e.model, e.prompt_version, e.decided_at, e.sealed) == (
        c.reason, c.model, c.prompt_version, c.decided_at, None)


def test_an_update_carries_the_version_it_replaces_and_the_one_it_opens(changes):
    e = public_event(changes["update"])
    assert e.op == "update" and e.version == 2 and e.memory_id == changes["add"].memory_id
    assert e.before is not None and e.after is not None
    assert (e.before.version, e.before.content) == (1, "Lives in Oslo")
    assert (e.after.version, e.after.content, e.after.status) == (2, "Lives in Bergen", "active")
    assert e.after.created_at == e.before.created_at == at(10)  # the memory's, not the version's
    assert e.after.updated_at == at(20) and e.lineage.job_seq == 2


def test_a_delete_closes_its_version(changes):
    e = public_event(changes["delete"])
    assert e.op == "delete" and e.version == 2  # the version it closes
    assert e.before is not None and e.after is not None
    assert (e.before.status, e.after.status) == ("active", "deleted")
    assert e.after.content == "Lives in Bergen" and e.after.valid_to == at(30)


def test_an_erase_carries_how_many_records_and_no_content(changes):
    c = changes["erase"]
    e = public_event(c)
    assert (e.op, e.memory_id, e.version, e.before, e.after) == ("erase", "*", 0, None, None)
    assert e.erased_versions == c.after["version_records"] == 2  # v1 and v2
    assert e.lineage.kind == "forget" and e.lineage.message_ids == ["forget-1"]
    asked = c.model_copy(update={"reason": "forget-me: ticket #4711, Jane Roe"})
    assert e.reason == public_event(asked).reason == "forget-me"  # the words stay in the
    # audit (memory-changes): downstream learns that the user asked, not why


@pytest.mark.parametrize("op", ["add", "update", "delete", "erase"])
def test_the_wire_form_is_slim_and_parses_back_to_the_same_bytes(changes, op):
    c = changes[op]
    e = public_event(c)
    wire = e.dumps()
    body = json.loads(wire)
    for field in ("records", "vector", "prompt_tokens", "completion_tokens", "source", "extra"):
        assert field not in body and field not in (body["after"] or {}), field
    if op != "erase":
        assert len(wire) * 2 < len(c.dumps()), (len(wire), len(c.dumps()))
    back = MemoryEvent.model_validate_json(wire)
    assert back == e and back.dumps() == wire


def test_a_reader_ignores_fields_it_does_not_know(changes):
    body = json.loads(public_event(changes["update"]).dumps())
    body["priority"] = "high"
    body["after"]["embedding_model"] = "x"
    assert MemoryEvent.model_validate(body) == public_event(changes["update"])


# --- JSON Schema ------------------------------------------------------------------------

def test_the_schema_files_are_what_the_models_generate(tmp_path):
    assert stale(SCHEMA_DIR) == []
    assert sorted(stale(tmp_path)) == sorted(SCHEMAS)  # missing files are stale
    (tmp_path / "memory-event.v1.json").write_text(render("memory-event.v1.json") + " ")
    assert "memory-event.v1.json" in stale(tmp_path)


def test_real_events_plain_sealed_and_erase_validate(changes):
    v = validator("memory-event.v1.json")
    key = crypto.new_data_key()
    for c in changes.values():
        e = public_event(c)
        v.validate(json.loads(e.dumps()))
        v.validate(json.loads(crypto.seal_event(e, "k1", key).dumps()))


def test_a_chat_message_validates_against_its_schema():
    v = validator("chat-message.v1.json")
    body = json.loads(msg("I live in Oslo", mid="m-1").dumps())
    v.validate(body)
    assert not v.is_valid({**body, "role": "robot"})
    assert not v.is_valid({k: val for k, val in body.items() if k != "ts"})


@pytest.mark.parametrize("broken", [
    lambda b: b.pop("change_id"),
    lambda b: b.pop("lineage"),
    lambda b: b.update(version="two"),
    lambda b: b.update(op="upsert"),
    lambda b: b["after"].update(importance="high"),
    lambda b: b["lineage"].pop("job_id"),
], ids=["no-change-id", "no-lineage", "version-str", "unknown-op", "importance-str",
        "lineage-no-job"])
def test_a_broken_event_is_rejected_by_the_schema(changes, broken):
    v = validator("memory-event.v1.json")
    body = json.loads(public_event(changes["update"]).dumps())
    assert v.is_valid(body)
    broken(body)
    assert not v.is_valid(body)


# --- the v1 contract, frozen: a field may be added, none removed, retyped or made optional
V1 = {
    None: {"change_id": "string", "op": "string", "tenant_id": "string",
           "user_id": "string", "memory_id": "string", "version": "integer",
           "before": ["MemoryState", "null"], "after": ["MemoryState", "null"],
           "reason": "string", "lineage": "EventLineage", "model": "string",
           "prompt_version": "string", "decided_at": "string",
           "erased_versions": ["integer", "null"], "sealed": ["null", "string"],
           "schema_version": "integer"},
    "MemoryState": {"version": "integer", "content": "string", "type": "string",
                    "importance": "integer", "status": "string", "slot": ["null", "string"],
                    "created_at": "string", "updated_at": "string", "valid_from": "string",
                    "valid_to": ["null", "string"], "expires_at": ["null", "string"],
                    "event_time": ["null", "string"]},
    "EventLineage": {"kind": "string", "session_id": "string", "from_seq": "integer",
                     "to_seq": "integer", "message_ids": "array", "job_id": "string",
                     "job_seq": "integer", "actor": "string"},
}
V1_OPS = ["add", "update", "delete", "erase"]


def _json_type(prop: dict) -> object:
    if "anyOf" in prop:
        return sorted(str(_json_type(x)) for x in prop["anyOf"])
    if "$ref" in prop:
        return prop["$ref"].rsplit("/", 1)[-1]
    return prop["type"]


@pytest.mark.parametrize("part", list(V1), ids=lambda p: p or "MemoryEvent")
def test_the_v1_contract_only_grows(part):
    """Consumers in other languages validate against these files: within schema_version 1
    a field may be added, never removed, renamed, retyped or made optional (bump the
    version and publish on a new topic instead: docs/consuming.md#evolution)."""
    schema = schema_of("memory-event.v1.json")
    node = schema if part is None else schema["$defs"][part]
    for name, kind in V1[part].items():
        assert name in node["properties"], f"{name} removed from the v1 contract"
        assert _json_type(node["properties"][name]) == kind, f"{name} retyped"
        assert name in node["required"], f"{name} no longer always written"
    if part is None:
        assert node["properties"]["op"]["enum"] == V1_OPS  # a new op is a new version
        assert node["properties"]["schema_version"]["const"] == 1
    assert node.get("additionalProperties") is not False  # readers ignore unknown fields
