"""What ``prepare`` asks the broker for, through a stand-in admin client: the manifest of
``memstream topics manifest`` declares exactly that, and with ``topics_create`` false it
asks for nothing and refuses what is missing."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from memstream.core import kafka
from memstream.core.settings import Settings
from memstream.ops.topics_manifest import kafka_topics, resource_name, topic_requests
from memstream.topics.layout import LayoutError, all_specs, prepare

pytestmark = pytest.mark.unit


class Admin:
    """A broker of ``brokers`` brokers that has ``existing`` topics (name: (partitions,
    replicas, config)) and records what CreateTopics is asked for."""

    def __init__(self, brokers: int, existing: dict[str, tuple[int, int, dict[str, str]]]):
        self.brokers, self.topics, self.asked = brokers, dict(existing), []

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def describe_cluster(self) -> dict[str, Any]:
        return {"brokers": list(range(self.brokers))}

    async def describe_topics(self, names: list[str]) -> list[dict[str, Any]]:
        return [{"topic": n, "error_code": 0, "partitions": [
            {"replicas": list(range(self.topics[n][1]))}] * self.topics[n][0]}
            if n in self.topics else {"topic": n, "error_code": 3, "partitions": []}
            for n in names]

    async def describe_configs(self, resources: list[Any]) -> list[Any]:
        out = [{"error_code": 0, "error_message": None, "resource_name": r.name,
                "config_entries": [{"config_names": k, "config_value": v}
                                   for k, v in self.topics[r.name][2].items()]}
               for r in resources]
        return [SimpleNamespace(to_object=lambda: {"resources": out})]

    async def create_topics(self, new: list[Any]) -> Any:
        for t in new:
            self.asked.append(t)
            self.topics[t.name] = (t.num_partitions, t.replication_factor,
                                   dict(t.topic_configs))
        return SimpleNamespace(topic_errors=[(t.name, 0, None) for t in new])


def run_prepare(monkeypatch: pytest.MonkeyPatch, settings: Settings, admin: Admin) -> Any:
    monkeypatch.setattr(kafka, "admin", lambda _settings: admin)
    return asyncio.run(prepare(settings))


SETTINGS = [
    {},
    {"partitions": 8, "replication_factor": 2, "min_insync_replicas": 2},
    {"input_topics": "per-tenant", "tenants": "acme,Beta_2", "topic_prefix": "Ms",
     "retention_days": 30, "content_retention_s": 3600.0},
    {"erasure_bound_s": 600.0, "events_retention_days": 90, "max_message_bytes": 4_000_000},
]


@pytest.mark.parametrize("brokers", [1, 3])
@pytest.mark.parametrize("changed", SETTINGS)
def test_the_manifest_declares_what_topics_create_asks_for(monkeypatch, changed, brokers):
    settings = Settings(**changed)
    brokers = max(brokers, settings.replication_factor or 1)  # else prepare refuses
    admin = Admin(brokers, {})
    run_prepare(monkeypatch, settings, admin)
    asked = {t.name: (t.num_partitions, t.replication_factor, dict(t.topic_configs))
             for t in admin.asked}
    docs = kafka_topics(topic_requests(settings, brokers), "c", "kafka.strimzi.io/v1")
    declared = {d["spec"].get("topicName", d["metadata"]["name"]):
                (d["spec"]["partitions"], d["spec"]["replicas"], d["spec"]["config"])
                for d in docs}
    assert declared == asked
    assert len(declared) == len(all_specs(settings))
    compacted = [n for n, (_, _, c) in declared.items() if c["cleanup.policy"] == "compact"]
    assert len(compacted) == 5  # api-keys, user-keys and the three tables' changelogs
    if settings.input_topics == "per-tenant":
        assert f"{settings.topic_prefix}.tenant.Beta_2.messages" in declared


def test_names_kubernetes_refuses_go_to_topic_name(monkeypatch):
    settings = Settings(**SETTINGS[2])
    docs = kafka_topics(topic_requests(settings, 3), "c", "kafka.strimzi.io/v1")
    renamed = {d["spec"]["topicName"] for d in docs if "topicName" in d["spec"]}
    # the prefix "Ms" has an upper case letter; the changelogs are named by the app id
    assert renamed == {s.name for s in all_specs(settings) if s.name.startswith("Ms.")}
    assert len(renamed) == len(docs) - 3
    names = [d["metadata"]["name"] for d in docs]
    assert len(set(names)) == len(names)
    assert resource_name("memstream.tenant.Beta_2.messages") != resource_name(
        "memstream.tenant.beta-2.messages")
    assert resource_name("memstream.messages") == "memstream.messages"


def test_without_topics_create_nothing_is_created_and_the_missing_are_named(monkeypatch):
    settings = Settings(topics_create=False)
    admin = Admin(1, {})
    with pytest.raises(LayoutError) as refused:
        run_prepare(monkeypatch, settings, admin)
    assert admin.asked == []
    assert len(refused.value.lines) == 1
    line = refused.value.lines[0]
    assert "memstream.messages" in line and "MEMSTREAM_TOPICS_CREATE=false" in line
    assert "memstream-ingest-state-changelog" in line


def test_without_topics_create_existing_topics_are_checked(monkeypatch):
    made = Admin(1, {})
    run_prepare(monkeypatch, Settings(), made)  # as `topics create` made them
    layout = run_prepare(monkeypatch, Settings(topics_create=False), Admin(1, made.topics))
    assert layout.created == () and layout.partitions == 4
    topics = dict(made.topics)
    p, r, config = topics["memstream.messages"]
    topics["memstream.messages"] = (p + 1, r, config)
    topics["memstream.api-keys"] = (*topics["memstream.api-keys"][:2],
                                    {**topics["memstream.api-keys"][2],
                                     "cleanup.policy": "delete"})
    del topics["memstream.decisions"]
    wrong = Admin(1, topics)
    with pytest.raises(LayoutError) as refused:
        run_prepare(monkeypatch, Settings(topics_create=False), wrong)
    assert wrong.asked == []
    text = "\n".join(refused.value.lines)
    assert "memstream.messages: 5 partitions, needs 4" in text
    assert "memstream.api-keys: cleanup.policy=delete, needs compact" in text
    assert "memstream.decisions: missing" in text


def test_with_topics_create_the_missing_are_created(monkeypatch):
    admin = Admin(1, {})
    layout = run_prepare(monkeypatch, Settings(), admin)
    assert len(layout.created) == len(all_specs(Settings())) == len(admin.asked)
