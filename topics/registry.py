"""Every topic memstream owns: name, partitions, cleanup policy, retention, schema.

The co-partitioned topics (messages, session events, job results, tool requests) share one key
(``tenant/user``) and one partition count, so the ingest loop that owns a partition sees all
of one user's events in order. :mod:`topics.layout` creates and checks them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from pydantic import BaseModel

from memstream.contract.events import MEMORY_EVENTS_TOPIC, USER_KEYS_TOPIC, MemoryEvent
from memstream.core.settings import Settings
from memstream.topics.schemas import (
    AccessEvent,
    ChatMessage,
    DeadLetter,
    ExtractionJob,
    JobDecision,
    JobResult,
    KeyRecord,
    MemoryChange,
    SessionEvent,
    ToolRequest,
    UserKeyRecord,
)

DAY_MS = 86_400_000
KEYS_TOPIC = "api-keys"  # the HTTP API's keys (web.keys_topic)
KAFKA_MAX_MESSAGE_BYTES = 1_048_588  # the broker's default max.message.bytes (1 MiB + 12)
# the stages' own records (a job carries its range's messages, a decision every archived
# turn of it): the loops' producers and decoders take up to this (streams.loop_clients)
INTERNAL_MESSAGE_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class TopicSpec:
    """One topic of the contract."""

    name: str
    schema: type[BaseModel]
    partitions: int
    retention_ms: int
    cleanup_policy: str = "delete"
    co_partitioned: bool = True
    doc: str = ""
    extra_config: dict[str, str] = field(default_factory=dict)

    def config(self) -> dict[str, str]:
        return {
            "cleanup.policy": self.cleanup_policy,
            "retention.ms": str(self.retention_ms),
            **self.extra_config,
        }


@dataclass(frozen=True)
class Topics:
    """The registry, resolved against one settings object."""

    messages: TopicSpec
    session_events: TopicSpec
    jobs: TopicSpec
    job_results: TopicSpec
    dead_letters: TopicSpec
    decisions: TopicSpec
    memory_changes: TopicSpec
    memory_events: TopicSpec
    tool_requests: TopicSpec
    memory_access: TopicSpec
    api_keys: TopicSpec
    user_keys: TopicSpec
    global_changes: TopicSpec
    repartition: TopicSpec
    # the per-tenant layout (MEMSTREAM_INPUT_TOPICS=per-tenant): (tenant, its topic) for
    # each tenant's messages and session-events topic; empty in the shared layout
    tenant_inputs: tuple[tuple[str, TopicSpec], ...] = ()

    def all(self) -> list[TopicSpec]:
        return [
            self.messages, self.session_events, self.jobs, self.job_results,
            self.dead_letters, self.decisions, self.memory_changes, self.memory_events,
            self.tool_requests, self.memory_access, self.api_keys,
            self.user_keys, self.global_changes, self.repartition,
        ] + [spec for _, spec in self.tenant_inputs]

    def ingest_inputs(self) -> list[TopicSpec]:
        """What the ingest stage consumes, in one co-partitioned stream."""
        return [self.messages, self.session_events, self.job_results,
                self.tool_requests, self.repartition] + [s for _, s in self.tenant_inputs]

    def placed_by_producers(self) -> list[TopicSpec]:
        """The inputs other programs write: a record may arrive on a partition that is not
        its key's (another client's partitioner) and is re-routed (streams.ingest)."""
        return [self.messages, self.session_events] + [s for _, s in self.tenant_inputs]

    def tenant_of(self, topic: str) -> str | None:
        """The tenant whose input topic ``topic`` is (the per-tenant layout), else None:
        a record on it must be of that tenant (streams.ingest dead-letters the others)."""
        return next((t for t, spec in self.tenant_inputs if spec.name == topic), None)


def registry(settings: Settings) -> Topics:
    n = settings.partitions
    keep = settings.retention_days * DAY_MS
    dead_keep = settings.dead_letter_retention_days * DAY_MS
    if settings.content_retention_s is not None:
        keep = dead_keep = int(settings.content_retention_s * 1000)
    # Retention deletes whole closed segments: with segments of a tenth of the retention a
    # record is gone within 1.1 x the retention, also on a quiet partition.
    rolled = {"segment.ms": str(max(1000, min(keep // 10, DAY_MS)))}
    topics = Topics(
        messages=TopicSpec(
            settings.topic("messages"), ChatMessage, n, keep,
            doc="Chat services produce every conversation message here, keyed tenant/user.",
            extra_config={"max.message.bytes": str(
                max(settings.max_message_bytes * 2, KAFKA_MAX_MESSAGE_BYTES)), **rolled},
        ),
        session_events=TopicSpec(
            settings.topic("session-events"), SessionEvent, n, keep,
            doc="Session lifecycle (ended), keyed tenant/user.", extra_config=rolled,
        ),
        jobs=TopicSpec(
            settings.topic("extraction-jobs"), ExtractionJob, n, keep,
            doc="Coalesced extraction jobs emitted by the ingest stage.",
            extra_config={"max.message.bytes": str(INTERNAL_MESSAGE_BYTES), **rolled},
        ),
        job_results=TopicSpec(
            settings.topic("job-results"), JobResult, n, keep,
            doc="Completion of a job (done / trivial / failed): closes the coalescing loop.",
            extra_config=rolled,
        ),
        dead_letters=TopicSpec(
            settings.topic("dead-letters"), DeadLetter, 1,
            dead_keep, co_partitioned=False,
            doc="Records that broke the contract: the reason, where the original is, its "
                "length, sha256 and (a bounded prefix of) its bytes.",
            # Stated, not assumed: codec.dead_letter bounds every record far below it.
            extra_config={"max.message.bytes": str(KAFKA_MAX_MESSAGE_BYTES), **rolled},
        ),
        decisions=TopicSpec(
            settings.topic("decisions"), JobDecision, n, keep,
            doc="Internal: a job's decided changes, applied in order by the apply stage.",
            extra_config={"max.message.bytes": str(INTERNAL_MESSAGE_BYTES), **rolled},
        ),
        memory_changes=TopicSpec(
            settings.topic("memory-changes"), MemoryChange, n, -1,
            doc="Every applied ADD/UPDATE/DELETE with before/after, reason and lineage; "
                "the store's source of truth (kept forever, replayable).",
        ),
        memory_events=TopicSpec(
            settings.topic(MEMORY_EVENTS_TOPIC), MemoryEvent, n,
            -1 if settings.events_retention_days is None
            else settings.events_retention_days * DAY_MS,
            doc="For downstream services: every applied change as a slim, versioned public "
                "event (no vector, no store records), written in the same transaction as "
                "its memory-change event (docs/consuming.md).",
        ),
        tool_requests=TopicSpec(
            settings.topic("tool-requests"), ToolRequest, n, keep,
            doc="Agents' memory writes (memory_insert, core_memory_replace), keyed "
                "tenant/user: the ingest stage turns each into a job of kind tool.",
            extra_config=rolled,
        ),
        memory_access=TopicSpec(
            settings.topic("memory-access"), AccessEvent, n, -1,
            doc="Retrieval hits and feedback, batched by the API; folded into "
                "last_accessed_at / access_count (kept: a rebuild folds it again).",
        ),
        api_keys=TopicSpec(
            settings.topic(KEYS_TOPIC), KeyRecord, 1, -1, cleanup_policy="compact",
            co_partitioned=False,
            doc="API keys of the HTTP API, keyed by key id: SHA-256 only, and revocations "
                "(the last record of a key id is its state)."),
        user_keys=TopicSpec(
            settings.topic(USER_KEYS_TOPIC), UserKeyRecord, 1, -1, cleanup_policy="compact",
            co_partitioned=False, extra_config=compaction_within(settings.erasure_bound_s),
            doc="Per-user data keys wrapped by the master key, keyed tenant/user/key-id, and "
                "forget-me markers (tenant/user/!forgotten): forgetting tombstones the keys.",
        ),
        global_changes=TopicSpec(
            settings.topic("global-changes"), MemoryChange, 1, -1, co_partitioned=False,
            doc="The memory changes of every tenant's global scope (user __global__), also "
                "published here in the same transaction: every worker keeps a copy "
                "(store_partitioned), whichever partition the global user's key is on.",
        ),
        repartition=TopicSpec(
            settings.topic("ingest-repartition"), ChatMessage, n, keep,
            doc="Chat messages and session events that arrived on a partition other than "
                "their key's (a producer with another partitioner: librdkafka's CRC-32, "
                "round robin), re-sent by the ingest stage to murmur2(key) % partitions "
                "in its transaction; the header memstream-source names the original topic.",
            extra_config={"max.message.bytes": str(
                max(settings.max_message_bytes * 2, KAFKA_MAX_MESSAGE_BYTES)), **rolled},
        ),
    )
    return replace(topics, tenant_inputs=tenant_inputs(settings, topics.messages,
                                                       topics.session_events))


# --- the per-tenant layout (docs/tenancy.md) ---------------------------------------------

# A tenant of the per-tenant layout names topics: only what a topic name takes, and no '.',
# the separator that ends the tenant's part, so that the PREFIXED ACL on
# "<prefix>.tenant.acme." matches acme's topics and never those of "acme.x" or "acme2"
# (the record grammar, schemas.ID_PATTERN, allows '.', ':', '@', '+', '=' as well).
TENANT_TOPIC_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")
MAX_TOPIC_CHARS = 249  # Kafka's limit on a topic name
TENANT_INPUTS = ("messages", "session-events")


def tenant_prefix(settings: Settings, tenant: str) -> str:
    """What every input topic of ``tenant`` starts with, and nothing of another tenant."""
    return settings.topic(f"tenant.{tenant}.")


def tenancy_problems(settings: Settings) -> list[str]:
    """What makes the settings' input layout inconsistent, one line each (empty: fine)."""
    tenants = settings.tenant_ids
    if settings.input_topics == "shared":
        return []
    if not tenants:
        return ["MEMSTREAM_INPUT_TOPICS=per-tenant with no tenant: set MEMSTREAM_TENANTS to "
                "the tenants whose input topics the worker reads (comma-separated)"]
    lines = [f"tenant {t!r} cannot name a topic of the per-tenant layout: letters, digits, "
             "'_' and '-' only, no '.' (MEMSTREAM_TENANTS)"
             for t in tenants if not TENANT_TOPIC_ID.fullmatch(t)]
    longest = max(len(tenant_prefix(settings, t)) + len("session-events") for t in tenants)
    if not lines and longest > MAX_TOPIC_CHARS:
        lines.append(f"a per-tenant topic name would have {longest} characters, Kafka takes "
                     f"{MAX_TOPIC_CHARS}: shorten MEMSTREAM_TOPIC_PREFIX or the tenant ids")
    return lines


def tenant_inputs(settings: Settings, messages: TopicSpec, session_events: TopicSpec,
                  ) -> tuple[tuple[str, TopicSpec], ...]:
    """Each tenant's messages and session-events topic (the per-tenant layout): the shared
    topics' specs under the tenant's names, co-partitioned with them."""
    if settings.input_topics != "per-tenant":
        return ()
    out = []
    for tenant in settings.tenant_ids:
        for spec, suffix in zip((messages, session_events), TENANT_INPUTS, strict=True):
            out.append((tenant, replace(spec, name=tenant_prefix(settings, tenant) + suffix,
                                        doc=f"{spec.doc} Tenant {tenant}'s only.")))
    return tuple(out)


def compaction_within(bound_s: float) -> dict[str, str]:
    """Topic configs under which a compacted topic drops an overwritten or tombstoned
    record within ``bound_s``: the active segment rolls, the cleaner must run, and the
    tombstone itself goes after the same delay."""
    ms = str(max(1000, int(bound_s * 1000 / 2)))
    return {"max.compaction.lag.ms": ms, "segment.ms": ms, "delete.retention.ms": ms,
            "min.cleanable.dirty.ratio": "0.01"}


TABLES = ("ingest-state", "session-window", "maintenance")  # the worker's changelog-backed tables
# A snapshot carries the user's unscanned messages: while an LLM outage keeps jobs failing
# it grows, so the ingest state's changelog takes large records (docs/limits.md).
SNAPSHOT_MAX_BYTES = 16 * 1024 * 1024


def changelog_name(settings: Settings, table: str) -> str:
    return f"{settings.app_id}-{table}-changelog"


def table_changelogs(settings: Settings) -> list[TopicSpec]:
    """The worker's tables' changelogs (streams.ingest_tables): the ingest loop's two and
    the apply loop's (the windowed jobs' triggers; in a jobs-only worker, its one loop's).
    Compacted, co-partitioned with the inputs, compacted within the erasure bound (a
    forget-me overwrites what they hold). Created with the other topics, before the worker
    joins its groups: the loops create none themselves."""
    erasable = compaction_within(settings.erasure_bound_s)
    n = settings.partitions

    def spec(table: str, doc: str, **extra: str) -> TopicSpec:
        return TopicSpec(changelog_name(settings, table), BaseModel, n, -1, "compact",
                         doc=doc, extra_config={**extra, **erasable})

    return [spec("ingest-state", "per-user ingest state (JSON snapshots)",
                 **{"max.message.bytes": str(SNAPSHOT_MAX_BYTES)}),
            spec("session-window", "the short-term window of each session"),
            spec("maintenance", "the windowed jobs' per-user triggers")]


def all_topic_names(settings: Settings) -> list[str]:
    """Every topic a deployment of ``settings`` owns: the registry and the tables'
    changelogs (what a test or a benchmark deletes when it is done). Faust makes none: it
    starts no Kafka client (streams.faust_setup)."""
    return [t.name for t in registry(settings).all()] + [
        changelog_name(settings, table) for table in TABLES]


async def delete_topics(settings: Settings, names: list[str]) -> None:
    from memstream.core import kafka

    admin = kafka.admin(settings)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        todo = [n for n in names if n in existing]
        if todo:
            await admin.delete_topics(todo)
    finally:
        await admin.close()
