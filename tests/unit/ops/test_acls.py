"""``memstream acls``: the ACLs of every principal, decided as plain data and rendered as
kafka-acls.sh commands and Strimzi KafkaUser YAML (ops/acls.py); no broker."""

from __future__ import annotations

import shlex

import pytest
import yaml
from click.testing import CliRunner

from memstream.cli import main
from memstream.core.errors import ConfigError
from memstream.core.settings import Settings
from memstream.ops import acls
from memstream.ops.acls import CLUSTER, GROUP, TOPIC, TRANSACTIONAL_ID, Names, permits
from memstream.topics.registry import all_topic_names, registry

pytestmark = pytest.mark.unit
PER_TENANT = Settings(topic_prefix="ms", app_id="ms-app", input_topics="per-tenant",
                      tenants="acme,globex,acme2")
STAGES = ("ingest", "extract", "apply", "access", "jobs")


def _of(found: list[acls.Principal], role_word: str) -> acls.Principal:
    return next(p for p in found if role_word in p.role)


def test_the_worker_may_do_all_it_does_on_its_own_resources():
    worker = acls.worker_acls(PER_TENANT)
    app = PER_TENANT.app_id
    for topic in all_topic_names(PER_TENANT):  # registry, tenants', changelogs, Faust's
        for op in ("Read", "Write", "Describe", "DescribeConfigs", "Create"):
            assert permits(worker, TOPIC, topic, op), (topic, op)
    for group in (app, *(f"{app}-{s}" for s in STAGES), f"{app}-jobs-apply"):
        assert permits(worker, GROUP, group, "Read") and permits(worker, GROUP, group,
                                                                 "Describe")
    for stage in STAGES:
        assert permits(worker, TRANSACTIONAL_ID, f"{app}-{stage}-3", "Write")
    assert permits(worker, CLUSTER, acls.CLUSTER_NAME, "IdempotentWrite")
    assert not permits(worker, TOPIC, "other.messages", "Read")
    assert not permits(worker, TOPIC, registry(PER_TENANT).messages.name, "Delete")


def test_a_chat_service_writes_its_tenants_topics_and_nothing_else():
    found = acls.principals(PER_TENANT)
    acme = _of(found, "tenant acme")
    assert acme.principal == "User:chat-acme"
    everything = all_topic_names(PER_TENANT)
    own = {"ms.tenant.acme.messages", "ms.tenant.acme.session-events"}
    assert own <= set(everything)
    for topic in everything:
        assert permits(acme.acls, TOPIC, topic, "Write") == (topic in own), topic
        assert not permits(acme.acls, TOPIC, topic, "Read")
    # the separator ends the tenant's part: acme's prefix is not acme2's
    assert not permits(acme.acls, TOPIC, "ms.tenant.acme2.messages", "Write")
    assert acme.acls[0] == acls.Acl(TOPIC, "ms.tenant.acme.", acls.PREFIXED,
                                    ("Write", "Describe"))
    assert not any(permits(acme.acls, GROUP, g, "Read") for g in ("ms-app", "ms-app-ingest"))
    assert not permits(acme.acls, TRANSACTIONAL_ID, "ms-app-ingest-0", "Write")


def test_in_the_shared_layout_every_chat_service_writes_the_shared_topics():
    shared = Settings(topic_prefix="ms", app_id="ms-app", tenants="acme")
    acme = _of(acls.principals(shared), "tenant acme")
    t = registry(shared)
    assert permits(acme.acls, TOPIC, t.messages.name, "Write")
    assert permits(acme.acls, TOPIC, t.session_events.name, "Write")
    assert "shared layout" in acme.role


def test_the_reader_reads_the_public_events_and_the_user_keys_only():
    reader = _of(acls.principals(PER_TENANT, Names(reader_group="crm")), "reader")
    t = registry(PER_TENANT)
    readable = {n for n in all_topic_names(PER_TENANT) if permits(reader.acls, TOPIC, n, "Read")}
    assert readable == {t.memory_events.name, t.user_keys.name}
    assert not any(permits(reader.acls, TOPIC, n, "Write") for n in all_topic_names(PER_TENANT))
    assert permits(reader.acls, GROUP, "crm", "Read") and not permits(
        reader.acls, GROUP, "ms-app-ingest", "Read")


def test_the_kafka_acls_commands_are_one_per_resource_with_every_operation():
    found = acls.principals(PER_TENANT, Names(chat="User:svc-{tenant}"), tenants=["acme"])
    text = acls.kafka_acls_commands(found, "b:9092", "admin.conf")
    commands = [shlex.split(line) for line in text.splitlines() if line.startswith("kafka")]
    assert len(commands) == sum(len(p.acls) for p in found)
    chat = [c for c in commands if "User:svc-acme" in c]
    assert chat[0] == [
        "kafka-acls.sh", "--bootstrap-server", "b:9092", "--command-config", "admin.conf",
        "--add", "--allow-principal", "User:svc-acme", "--allow-host", "*",
        "--operation", "Write", "--operation", "Describe",
        "--topic", "ms.tenant.acme.", "--resource-pattern-type", "prefixed"]
    assert chat[1][-3:] == ["--operation", "IdempotentWrite", "--cluster"]
    assert "# chat service of tenant acme: User:svc-acme" in text


def test_the_strimzi_users_are_kafka_user_resources():
    found = acls.principals(PER_TENANT, Names(worker="User:CN=ms-worker"), tenants=["acme"])
    docs = [d for d in yaml.safe_load_all(acls.strimzi_users(found, "prod", "tls")) if d]
    assert [d["metadata"]["name"] for d in docs] == ["ms-worker", "chat-acme",
                                                     "memstream-reader"]
    for d in docs:
        assert d["apiVersion"] == "kafka.strimzi.io/v1" and d["kind"] == "KafkaUser"
        assert d["metadata"]["labels"] == {"strimzi.io/cluster": "prod"}
        assert d["spec"]["authentication"] == {"type": "tls"}
        assert d["spec"]["authorization"]["type"] == "simple"
    chat = docs[1]["spec"]["authorization"]["acls"]
    assert chat == [
        {"resource": {"type": "topic", "name": "ms.tenant.acme.", "patternType": "prefix"},
         "operations": ["Write", "Describe"], "host": "*"},
        {"resource": {"type": "cluster"}, "operations": ["IdempotentWrite"], "host": "*"}]
    with pytest.raises(ConfigError, match="Kubernetes resource name"):
        acls.strimzi_users(acls.principals(PER_TENANT, Names(chat="User:Chat_{tenant}")))
    worker = docs[0]["spec"]["authorization"]["acls"]
    assert {"type": "transactionalId", "name": "ms-app-", "patternType": "prefix"} in [
        a["resource"] for a in worker]


def test_the_bindings_carry_kafkas_codes():
    found = acls.principals(PER_TENANT, tenants=["acme"])
    chat = [b for b in acls.bindings(found) if b[3] == "User:chat-acme"]
    # (resource type, name, pattern, principal, host, operation, permission): TOPIC 2,
    # PREFIXED 4, WRITE 4 / DESCRIBE 8, CLUSTER 4 LITERAL 3 IDEMPOTENT_WRITE 12, ALLOW 3
    assert chat == [(2, "ms.tenant.acme.", 4, "User:chat-acme", "*", 4, 3),
                    (2, "ms.tenant.acme.", 4, "User:chat-acme", "*", 8, 3),
                    (4, "kafka-cluster", 3, "User:chat-acme", "*", 12, 3)]


def test_the_command_prints_both_formats_and_refuses_an_inconsistent_layout(monkeypatch):
    for name in ("MEMSTREAM_INPUT_TOPICS", "MEMSTREAM_TENANTS", "MEMSTREAM_TOPIC_PREFIX"):
        monkeypatch.delenv(name, raising=False)
    env = {"MEMSTREAM_INPUT_TOPICS": "per-tenant", "MEMSTREAM_TENANTS": "acme"}
    runner = CliRunner()
    out = runner.invoke(main, ["acls", "--bootstrap", "b:1"], env=env)
    assert out.exit_code == 0, out.output
    assert "--topic memstream.tenant.acme. --resource-pattern-type prefixed" in out.output
    out = runner.invoke(main, ["acls", "--format", "strimzi"], env=env)
    assert out.exit_code == 0 and "kind: KafkaUser" in out.output
    out = runner.invoke(main, ["acls", "--format", "strimzi",
                               "--chat-principal", "User:C_{tenant}"], env=env)
    assert out.exit_code == 1 and "Kubernetes resource name" in out.output
    out = runner.invoke(main, ["acls"], env={**env, "MEMSTREAM_TENANTS": ""})
    assert out.exit_code == 1 and "with no tenant" in out.output
