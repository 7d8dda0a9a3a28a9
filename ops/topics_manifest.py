"""``memstream topics manifest``: the topics and principals of a deployment as resources
for a cluster whose topics are managed elsewhere (docs/operations.md, "Topics managed
elsewhere").

A Strimzi shop declares its topics as ``KafkaTopic`` resources and its users as
``KafkaUser`` ones; the worker then runs with ``MEMSTREAM_TOPICS_CREATE=false`` and only
checks them. What the resources say is what ``memstream topics create`` would create, from
the same function (:func:`memstream.topics.layout.requests`: partitions, replicas, every
config), and the users' ACLs are :mod:`memstream.ops.acls`'s. The replication needs the
cluster's broker count (``--brokers``) where the settings do not fix it, as the worker's
does (:func:`memstream.topics.layout.replication_for`).

Everything here is pure: documents as plain data, rendered as YAML by :func:`to_yaml`.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from collections.abc import Iterable, Mapping
from typing import Any

from memstream.core.settings import Settings
from memstream.ops.acls import K8S_NAME, Principal, strimzi_users
from memstream.topics.layout import TopicRequest, all_specs, replication_for, requests

STRIMZI_API = {"v1": "kafka.strimzi.io/v1", "v1beta2": "kafka.strimzi.io/v1beta2"}
_FORBIDDEN = re.compile(r"[^a-z0-9.-]+")


def topic_requests(settings: Settings, brokers: int) -> list[TopicRequest]:
    """Every topic a worker of ``settings`` needs, as ``memstream topics create`` creates
    it on a cluster of ``brokers`` brokers."""
    return requests(all_specs(settings), replication_for(settings, brokers))


def resource_name(topic: str) -> str:
    """The KafkaTopic's ``metadata.name`` of ``topic``: the name itself where Kubernetes
    takes it (lower case letters, digits, '-', '.'), else a valid name with a hash of the
    topic's own (``spec.topicName`` then carries the topic's name), so that two topics
    never share one."""
    if K8S_NAME.fullmatch(topic):  # a Kubernetes object name (RFC 1123 subdomain)
        return topic
    digest = hashlib.sha256(topic.encode()).hexdigest()[:8]
    base = _FORBIDDEN.sub("-", topic.lower()).strip("-.")[:240].rstrip("-.")
    return f"{base}-{digest}" if base else f"topic-{digest}"


def kafka_topic(request: TopicRequest, cluster: str, api_version: str,
                namespace: str | None = None) -> dict[str, Any]:
    """One Strimzi ``KafkaTopic`` resource."""
    name = resource_name(request.name)
    metadata: dict[str, Any] = {"name": name}
    if namespace:
        metadata["namespace"] = namespace
    metadata["labels"] = {"strimzi.io/cluster": cluster}
    spec: dict[str, Any] = {}
    if name != request.name:
        spec["topicName"] = request.name
    spec.update({"partitions": request.partitions, "replicas": request.replicas,
                 "config": dict(request.config)})
    return {"apiVersion": api_version, "kind": "KafkaTopic", "metadata": metadata,
            "spec": spec}


def kafka_topics(found: Iterable[TopicRequest], cluster: str, api_version: str,
                 namespace: str | None = None) -> list[dict[str, Any]]:
    return [kafka_topic(r, cluster, api_version, namespace) for r in found]


def _yaml(value: Any, indent: int) -> list[str]:
    pad = " " * indent
    if isinstance(value, Mapping):
        lines = []
        for key, item in value.items():
            if isinstance(item, (Mapping, list)) and item:
                lines += [f"{pad}{key}:", *_yaml(item, indent + 2)]
            else:
                lines.append(f"{pad}{key}: {json.dumps(item)}")
        return lines
    if isinstance(value, list):
        lines = []
        for item in value:
            nested = _yaml(item, indent + 2)
            lines += [f"{pad}- {nested[0].lstrip()}", *nested[1:]]
        return lines
    return [f"{pad}{json.dumps(value)}"]


def to_yaml(docs: Iterable[Mapping[str, Any]]) -> str:
    """A multi-document YAML stream (keys plain, every scalar a JSON literal: valid YAML,
    and a string like "-1" or "false" stays a string)."""
    return "".join("---\n" + "\n".join(_yaml(doc, 0)) + "\n" for doc in docs)


def strimzi_manifest(settings: Settings, principals: Iterable[Principal], *, brokers: int,
                     cluster: str, api_version: str = STRIMZI_API["v1"],
                     namespace: str | None = None,
                     authentication: str = "scram-sha-512") -> str:
    """The KafkaTopic of every topic and the KafkaUser of every principal, one stream."""
    topics = to_yaml(kafka_topics(topic_requests(settings, brokers), cluster, api_version,
                                  namespace))
    return topics + strimzi_users(principals, cluster, authentication, api_version, namespace)


def kafka_topics_commands(settings: Settings, brokers: int,
                          bootstrap: str = "<broker:9092>",
                          command_config: str = "admin.properties") -> str:
    """``kafka-topics.sh --create`` commands for the same topics."""
    lines = []
    for r in topic_requests(settings, brokers):
        args = ["kafka-topics.sh", "--bootstrap-server", bootstrap, "--command-config",
                command_config, "--create", "--if-not-exists", "--topic", r.name,
                "--partitions", str(r.partitions), "--replication-factor", str(r.replicas)]
        for key, value in r.config.items():
            args += ["--config", f"{key}={value}"]
        lines.append(shlex.join(args))
    return "\n".join(lines) + "\n"
