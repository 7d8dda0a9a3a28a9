"""``memstream acls``: the Kafka ACLs of every principal of a deployment (docs/tenancy.md).

Three kinds of principal write or read memstream's topics:

- **the worker** (every worker, the jobs-only process and the operators' commands): its
  topics (``<topic_prefix>.*``, the tables' changelogs and Faust's ``<app_id>-*``), its
  consumer groups (Faust's ``<app_id>``, the stages' ``<app_id>-<stage>``), the stages'
  transactional ids (``<app_id>-<stage>-<partition>``), idempotent writes; it creates its
  topics (Create, DescribeConfigs: topics.layout checks them).
- **a chat service per tenant**: Write and Describe on its tenant's input topics only, the
  PREFIXED pattern ``<topic_prefix>.tenant.<tenant>.`` (the per-tenant layout: a tenant id
  of that layout has no '.', so the prefix never matches another tenant's topics). In the
  shared layout it is the shared messages and session-events topics: no tenant boundary.
- **a downstream reader** (``memstream.consumer``): Read on the memory-events and user-keys
  topics and its own consumer group.

What they get is decided here as plain data (:func:`principals`) and rendered as
``kafka-acls.sh`` commands (:func:`kafka_acls_commands`) or Strimzi ``KafkaUser`` resources
(:func:`strimzi_users`); :func:`apply` creates them with the admin client (CreateAcls), as
the integration test does on a broker with an authorizer.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from memstream.core.errors import BrokerError, ConfigError
from memstream.core.settings import Settings
from memstream.topics.registry import registry, tenant_prefix

LITERAL, PREFIXED = "literal", "prefixed"
TOPIC, GROUP, TRANSACTIONAL_ID, CLUSTER = "topic", "group", "transactional-id", "cluster"
# Kafka's wire codes (org.apache.kafka.common.resource / acl): what CreateAcls takes
_RESOURCE_CODES = {TOPIC: 2, GROUP: 3, CLUSTER: 4, TRANSACTIONAL_ID: 5}
_PATTERN_CODES = {LITERAL: 3, PREFIXED: 4}
_OPERATION_CODES = {"Read": 3, "Write": 4, "Create": 5, "Describe": 8,
                    "DescribeConfigs": 10, "IdempotentWrite": 12}
_ALLOW = 3
_STRIMZI_TYPES = {TOPIC: "topic", GROUP: "group", CLUSTER: "cluster",
                  TRANSACTIONAL_ID: "transactionalId"}
CLUSTER_NAME = "kafka-cluster"
K8S_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


@dataclass(frozen=True)
class Acl:
    """Allow ``operations`` on one resource (a name, literal or a prefix)."""

    resource: str  # TOPIC | GROUP | TRANSACTIONAL_ID | CLUSTER
    name: str
    pattern: str  # LITERAL | PREFIXED
    operations: tuple[str, ...]


@dataclass(frozen=True)
class Principal:
    """One principal (``User:<name>``), what it is for, and its ACLs."""

    principal: str
    role: str
    acls: tuple[Acl, ...]


@dataclass(frozen=True)
class Names:
    """The principals' names: ``chat`` is a template with ``{tenant}``."""

    worker: str = "User:memstream"
    chat: str = "User:chat-{tenant}"
    reader: str = "User:memstream-reader"
    reader_group: str = "memory-reader"


def worker_acls(settings: Settings) -> tuple[Acl, ...]:
    """All a worker needs, and the operators' commands run with its credentials."""
    app = settings.app_id
    owned = ("Read", "Write", "Describe", "DescribeConfigs", "Create")
    return (
        Acl(TOPIC, settings.topic(""), PREFIXED, owned),  # the registry, tenants' included
        Acl(TOPIC, f"{app}-", PREFIXED, owned),  # the tables' changelogs, Faust's topics
        Acl(GROUP, app, LITERAL, ("Read", "Describe")),  # Faust's group
        Acl(GROUP, f"{app}-", PREFIXED, ("Read", "Describe")),  # the stages' loops
        Acl(TRANSACTIONAL_ID, f"{app}-", PREFIXED, ("Write", "Describe")),  # {app}-{stage}-{p}
        Acl(CLUSTER, CLUSTER_NAME, LITERAL, ("IdempotentWrite",)),
    )


def chat_acls(settings: Settings, tenant: str) -> tuple[Acl, ...]:
    """A chat service of ``tenant``: write its input topics, nothing else."""
    writes = ("Write", "Describe")
    if settings.input_topics == "per-tenant":
        topics: tuple[Acl, ...] = (Acl(TOPIC, tenant_prefix(settings, tenant), PREFIXED,
                                       writes),)
    else:  # the shared layout: every chat service writes the same two topics
        t = registry(settings)
        topics = (Acl(TOPIC, t.messages.name, LITERAL, writes),
                  Acl(TOPIC, t.session_events.name, LITERAL, writes))
    # idempotent producers (the Java client's and librdkafka's default): brokers before
    # Kafka 2.8 ask IdempotentWrite on the cluster, later ones Write on a topic
    return (*topics, Acl(CLUSTER, CLUSTER_NAME, LITERAL, ("IdempotentWrite",)))


def reader_acls(settings: Settings, group: str) -> tuple[Acl, ...]:
    """A downstream reader (memstream.consumer): the public events, the user keys (sealed
    content), its own group."""
    t = registry(settings)
    reads = ("Read", "Describe")
    return (Acl(TOPIC, t.memory_events.name, LITERAL, reads),
            Acl(TOPIC, t.user_keys.name, LITERAL, reads),
            Acl(GROUP, group, LITERAL, reads))


def principals(settings: Settings, names: Names = Names(),
               tenants: Sequence[str] | None = None) -> list[Principal]:
    """Every principal of the deployment with its ACLs: the worker, one chat service per
    tenant (``tenants``, default the settings' ``tenants``), the downstream reader."""
    per_tenant = settings.input_topics == "per-tenant"
    out = [Principal(names.worker, "worker", worker_acls(settings))]
    for tenant in (settings.tenant_ids if tenants is None else tenants):
        role = (f"chat service of tenant {tenant}" if per_tenant else
                f"chat service of tenant {tenant} (shared layout: it can write every "
                "tenant's records; MEMSTREAM_INPUT_TOPICS=per-tenant confines it)")
        out.append(Principal(names.chat.format(tenant=tenant), role,
                             chat_acls(settings, tenant)))
    out.append(Principal(names.reader, "downstream reader (memstream.consumer)",
                         reader_acls(settings, names.reader_group)))
    return out


def permits(acls: Iterable[Acl], resource: str, name: str, operation: str) -> bool:
    """Whether ``acls`` allow ``operation`` on one resource, as Kafka's authorizer decides
    (a literal name or ``*``, a prefix; Read, Write, Delete and Alter imply Describe)."""
    implied = {operation} | ({"Read", "Write", "Delete", "Alter"} if operation == "Describe"
                             else set())
    return any(acl.resource == resource and implied & set(acl.operations) and (
        name.startswith(acl.name) if acl.pattern == PREFIXED else acl.name in (name, "*"))
        for acl in acls)


# --- rendering -----------------------------------------------------------------------------


def _resource_flags(acl: Acl) -> list[str]:
    if acl.resource == CLUSTER:
        return ["--cluster"]
    return [f"--{acl.resource}", acl.name, "--resource-pattern-type", acl.pattern]


def kafka_acls_commands(found: Iterable[Principal], bootstrap: str = "<broker:9092>",
                        command_config: str = "admin.properties") -> str:
    """``kafka-acls.sh`` commands that add every ACL (run as a super user / cluster admin)."""
    lines = []
    for p in found:
        lines.append(f"# {p.role}: {p.principal}")
        for acl in p.acls:
            args = ["kafka-acls.sh", "--bootstrap-server", bootstrap, "--command-config",
                    command_config, "--add", "--allow-principal", p.principal,
                    "--allow-host", "*"]
            for op in acl.operations:
                args += ["--operation", op]
            lines.append(shlex.join(args + _resource_flags(acl)))
        lines.append("")
    return "\n".join(lines)


def strimzi_name(principal: str) -> str:
    """The KafkaUser's name of a principal: Strimzi makes ``User:<name>`` (SCRAM) or
    ``User:CN=<name>`` (TLS) of it. A Kubernetes resource name (lower case letters, digits,
    '-' and '.'), or :class:`ConfigError`."""
    name = principal.split(":", 1)[1] if principal.startswith("User:") else principal
    name = name[3:] if name.startswith("CN=") else name
    if not K8S_NAME.fullmatch(name):
        raise ConfigError(f"principal {principal!r}: a KafkaUser is named {name!r}, which is "
                          "no Kubernetes resource name (lower case letters, digits, '-', "
                          "'.'); choose principals that are (--chat-principal ...)")
    return name


def strimzi_users(found: Iterable[Principal], cluster: str = "my-cluster",
                  authentication: str = "scram-sha-512",
                  api_version: str = "kafka.strimzi.io/v1",
                  namespace: str | None = None) -> str:
    """One Strimzi ``KafkaUser`` (``api_version``: v1beta2 up to Strimzi 0.51, v1 from 0.49
    on; simple authorization) per principal, as a multi-document YAML stream (names quoted
    as JSON strings: valid YAML)."""
    docs = []
    for p in found:
        lines = [f"apiVersion: {api_version}", "kind: KafkaUser", "metadata:",
                 f"  name: {json.dumps(strimzi_name(p.principal))}",
                 *([f"  namespace: {json.dumps(namespace)}"] if namespace else []),
                 "  labels:", f"    strimzi.io/cluster: {json.dumps(cluster)}",
                 "  annotations:", f"    memstream/role: {json.dumps(p.role)}",
                 "spec:", "  authentication:", f"    type: {authentication}",
                 "  authorization:", "    type: simple", "    acls:"]
        for acl in p.acls:
            lines += ["      - resource:", f"          type: {_STRIMZI_TYPES[acl.resource]}"]
            if acl.resource != CLUSTER:  # a cluster resource has no name
                pattern = "prefix" if acl.pattern == PREFIXED else "literal"
                lines += [f"          name: {json.dumps(acl.name)}",
                          f"          patternType: {pattern}"]
            lines += ["        operations:", *(f"          - {op}" for op in acl.operations),
                      '        host: "*"']
        docs.append("\n".join(lines))
    return "---\n" + "\n---\n".join(docs) + "\n"


# --- applying ------------------------------------------------------------------------------


def bindings(found: Iterable[Principal]) -> list[tuple[int, str, int, str, str, int, int]]:
    """Every ACL as CreateAcls takes it: one binding per operation (resource type, name,
    pattern type, principal, host, operation, permission)."""
    return [(_RESOURCE_CODES[acl.resource], acl.name, _PATTERN_CODES[acl.pattern],
             p.principal, "*", _OPERATION_CODES[op], _ALLOW)
            for p in found for acl in p.acls for op in acl.operations]


async def apply(settings: Settings, found: Iterable[Principal]) -> int:
    """Create the ACLs on the cluster (the settings' credentials must be a super user's or
    hold Alter on the cluster); returns how many bindings were created (idempotent)."""
    from aiokafka.protocol.admin import CreateAclsRequest

    from memstream.core import kafka

    admin = kafka.admin(settings)
    await admin.start()
    try:
        created = 0
        for binding in bindings(found):
            response = await admin._send_request(CreateAclsRequest(*binding))
            for result in response.to_object()["creation_responses"]:
                if result["error_code"]:
                    raise BrokerError(f"ACL {binding[1]!r} for {binding[3]} not created: "
                                      f"{result['error_message'] or result['error_code']}")
            created += 1
        return created
    finally:
        await admin.close()
