"""``memstream topics manifest``: the YAML says what the documents say (strings stay
strings), the kafka-topics.sh commands create the same topics, an inconsistent tenancy is
refused."""

from __future__ import annotations

import shlex

import pytest
import yaml
from click.testing import CliRunner

from memstream.cli import main
from memstream.core.settings import Settings
from memstream.ops import acls
from memstream.ops.topics_manifest import (
    kafka_topics,
    kafka_topics_commands,
    strimzi_manifest,
    to_yaml,
    topic_requests,
)

pytestmark = pytest.mark.unit


def test_the_yaml_reads_back_as_the_documents():
    settings = Settings(input_topics="per-tenant", tenants="acme", topic_prefix="A_b")
    docs = kafka_topics(topic_requests(settings, 3), "prod", "kafka.strimzi.io/v1", "ns")
    assert list(yaml.safe_load_all(to_yaml(docs))) == docs
    forever = next(d for d in docs if d["spec"].get("topicName") == "A_b.memory-changes")
    assert forever["spec"]["config"]["retention.ms"] == "-1"
    assert forever["spec"]["config"]["unclean.leader.election.enable"] == "false"
    assert forever["metadata"]["namespace"] == "ns"
    assert forever["metadata"]["labels"] == {"strimzi.io/cluster": "prod"}
    assert to_yaml([{"a": [], "b": {}, "c": [{"d": 1, "e": [1, 2]}]}]) == \
        '---\na: []\nb: {}\nc:\n  - d: 1\n    e:\n      - 1\n      - 2\n'


def test_the_manifest_has_the_topics_then_the_users():
    settings = Settings(tenants="acme")
    text = strimzi_manifest(settings, acls.principals(settings), brokers=1, cluster="c",
                            namespace="ns")
    docs = [d for d in yaml.safe_load_all(text) if d]
    kinds = [d["kind"] for d in docs]
    assert kinds == ["KafkaTopic"] * len(topic_requests(settings, 1)) + ["KafkaUser"] * 3
    assert {d["metadata"]["namespace"] for d in docs} == {"ns"}
    assert {d["spec"]["replicas"] for d in docs if d["kind"] == "KafkaTopic"} == {1}


def test_the_kafka_topics_commands_create_the_same_topics():
    settings = Settings(partitions=6)
    requests = topic_requests(settings, 3)
    lines = kafka_topics_commands(settings, 3, "b:9092").splitlines()
    assert len(lines) == len(requests)
    for line, r in zip(lines, requests, strict=True):
        args = shlex.split(line)
        assert args[args.index("--topic") + 1] == r.name
        assert args[args.index("--partitions") + 1] == str(r.partitions)
        assert args[args.index("--replication-factor") + 1] == str(r.replicas) == "3"
        configs = dict(a.split("=", 1) for i, a in enumerate(args) if args[i - 1] == "--config")
        assert configs == dict(r.config)


def test_the_command_refuses_an_inconsistent_tenancy_and_renders_both_formats():
    runner = CliRunner()
    out = runner.invoke(main, ["topics", "manifest"],
                        env={"MEMSTREAM_INPUT_TOPICS": "per-tenant", "MEMSTREAM_TENANTS": ""})
    assert out.exit_code == 1 and "with no tenant" in out.output
    out = runner.invoke(main, ["topics", "manifest", "--format", "kafka-topics"])
    assert out.exit_code == 0 and out.output.startswith("kafka-topics.sh ")
    out = runner.invoke(main, ["topics", "manifest", "--api-version", "v1beta2"])
    assert out.exit_code == 0 and "kafka.strimzi.io/v1beta2" in out.output
