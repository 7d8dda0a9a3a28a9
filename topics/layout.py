"""The topic layout a worker relies on, created where missing and checked where it exists.

Everything memstream assumes of a topic is checked against the broker before a worker (or
``memstream topics create``) goes on: a topic that exists with another partition count
would misroute users (a user's partition is murmur2(key) % partitions, the same for every
co-partitioned topic and every store shard), a source-of-truth topic that is not compacted
or not kept forever would lose memories, a topic with fewer replicas than asked would lose
acknowledged writes with one broker. Each mismatch is one line that names the topic, what
was found, what is needed and the fix: the worker refuses to start (:class:`LayoutError`)
rather than fall back to anything.

What the checks decide is pure (:func:`replication_for`, :func:`problems`), over what the
broker reports (:class:`FoundTopic`); :func:`prepare` asks the broker, creates what is
missing (replicated, ``min.insync.replicas``, no unclean leader election) and checks all.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from memstream.core.errors import BrokerError, ConfigError
from memstream.core.settings import Settings
from memstream.topics.registry import TopicSpec, registry, table_changelogs, tenancy_problems

log = logging.getLogger(__name__)

GROWING = "docs/operations.md#growing-the-partition-count"


class LayoutError(ConfigError):
    """The topics on the broker do not have the layout memstream needs (one line each)."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = lines


@dataclass(frozen=True)
class Replication:
    """How every topic memstream creates is replicated, and on how many brokers."""

    factor: int
    min_insync: int
    brokers: int

    def config(self) -> dict[str, str]:
        return {"min.insync.replicas": str(self.min_insync),
                "unclean.leader.election.enable": "false"}

    def describe(self) -> str:
        return (f"replication factor {self.factor}, min.insync.replicas {self.min_insync} "
                f"({self.brokers} broker{'s' if self.brokers != 1 else ''})")


@dataclass(frozen=True)
class FoundTopic:
    """One topic as the broker reports it."""

    name: str
    partitions: int
    replicas: int  # the fewest replicas any of its partitions has
    config: Mapping[str, str]


@dataclass(frozen=True)
class Layout:
    """The checked layout: the partition count the broker reports for the co-partitioned
    topics (what routing and shards use), the replication, the topics created now."""

    partitions: int
    replication: Replication
    created: tuple[str, ...] = ()

    def applied(self, settings: Settings) -> Settings:
        """``settings`` with the resolved partition count and replication."""
        return settings.model_copy(update={
            "partitions": self.partitions, "replication_factor": self.replication.factor,
            "min_insync_replicas": self.replication.min_insync})


def replication_for(settings: Settings, brokers: int) -> Replication:
    """The settings' replication, or the default: 3 / 2 on a cluster of three or more
    brokers, else the broker count (min.insync.replicas one less, at least 1)."""
    factor = settings.replication_factor or min(3, max(1, brokers))
    min_insync = settings.min_insync_replicas or max(1, factor - 1)
    if min_insync > factor:
        raise LayoutError([f"MEMSTREAM_MIN_INSYNC_REPLICAS={min_insync} is above the "
                           f"replication factor {factor}: no write could ever be "
                           "acknowledged; set it to at most the replication factor"])
    return Replication(factor, min_insync, brokers)


def _int(config: Mapping[str, str], name: str) -> int | None:
    try:
        return int(config[name])
    except (KeyError, ValueError):
        return None


def _alter(setting: str) -> str:
    return ("kafka-configs.sh --bootstrap-server <broker> --alter --entity-type topics "
            f"--entity-name <topic> --add-config {setting}")


def _partition_problem(spec: TopicSpec, found: FoundTopic, counts: Iterable[int]) -> str:
    others = sorted(set(counts))
    if spec.co_partitioned:
        fix = (f"set MEMSTREAM_PARTITIONS={found.partitions} (what the existing topics have)"
               if others == [found.partitions] else
               "the co-partitioned topics disagree "
               f"({', '.join(map(str, others))} partitions): recreate them from the "
               f"memory-change topic ({GROWING})")
        return (f"{found.partitions} partitions, needs {spec.partitions} "
                f"(MEMSTREAM_PARTITIONS; users are placed by murmur2(key) % partitions on "
                f"every co-partitioned topic and store shard, so another count misroutes "
                f"them); fix: {fix}; a count cannot be changed in place ({GROWING})")
    return (f"{found.partitions} partitions, needs {spec.partitions} "
            f"(every worker reads it whole as one ordered log); fix: delete it and let "
            f"the worker create it, after copying its records")


def topic_problems(spec: TopicSpec, found: FoundTopic, wanted: Replication,
                   co_counts: Iterable[int] = ()) -> list[str]:
    """What is wrong with one existing topic, each without the topic's name (empty:
    nothing); :func:`problems` names the topics."""
    config, lines = found.config, []
    if found.partitions != spec.partitions:
        lines.append(_partition_problem(spec, found, co_counts))
    policy = {p.strip() for p in config.get("cleanup.policy", "delete").split(",")}
    if policy != {spec.cleanup_policy}:
        loses = ("compaction keeps only each key's last record: history and messages are "
                 "lost" if "compact" in policy else
                 "retention deletes records this topic must keep (every key's last one)")
        lines.append(f"cleanup.policy={','.join(sorted(policy))}, needs "
                     f"{spec.cleanup_policy} ({loses}); fix: "
                     f"{_alter('cleanup.policy=' + spec.cleanup_policy)}")
    if spec.retention_ms < 0 and spec.cleanup_policy == "delete":
        for setting in ("retention.ms", "retention.bytes"):
            value = _int(config, setting)
            if value is not None and value >= 0:
                lines.append(f"{setting}={value}, needs -1 (it is a source of "
                             f"truth, kept forever: what retention deletes is lost for good); "
                             f"fix: {_alter(setting + '=-1')}")
    if found.replicas < wanted.factor:
        lines.append(f"replication factor {found.replicas}, needs "
                     f"{wanted.factor} (one broker's loss would lose acknowledged writes); "
                     f"fix: add replicas with kafka-reassign-partitions.sh, or set "
                     f"MEMSTREAM_REPLICATION_FACTOR={found.replicas} to accept it")
    min_isr = _int(config, "min.insync.replicas")
    if min_isr is not None and min_isr > found.replicas:
        lines.append(f"min.insync.replicas={min_isr} above its "
                     f"{found.replicas} replicas (no write can be acknowledged); fix: "
                     f"{_alter(f'min.insync.replicas={wanted.min_insync}')}")
    elif min_isr is not None and min_isr < wanted.min_insync:
        lines.append(f"min.insync.replicas={min_isr}, needs "
                     f"{wanted.min_insync} (an acknowledged write must be on that many "
                     f"replicas to survive a broker's loss); fix: "
                     f"{_alter(f'min.insync.replicas={wanted.min_insync}')}, or set "
                     f"MEMSTREAM_MIN_INSYNC_REPLICAS={min_isr} to accept it")
    if config.get("unclean.leader.election.enable", "false").lower() == "true":
        lines.append(f"unclean.leader.election.enable=true, needs false (an "
                     f"out-of-sync replica elected leader drops acknowledged writes); fix: "
                     f"{_alter('unclean.leader.election.enable=false')}")
    needed = _int(spec.extra_config, "max.message.bytes")
    has = _int(config, "max.message.bytes")
    if needed is not None and has is not None and has < needed:
        lines.append(f"max.message.bytes={has}, needs at least {needed} (larger "
                     f"records it must take would stop the worker); fix: "
                     f"{_alter(f'max.message.bytes={needed}')}")
    return lines


def problems(specs: Iterable[TopicSpec], found: Mapping[str, FoundTopic],
             wanted: Replication) -> list[str]:
    """Every mismatch between the specs and the topics found, one line each: the same
    finding on several topics is one line that names them all."""
    specs = list(specs)
    co_counts = [found[s.name].partitions for s in specs
                 if s.co_partitioned and s.name in found]
    where: dict[str, list[str]] = {}
    for spec in specs:
        if spec.name in found:
            for line in topic_problems(spec, found[spec.name], wanted, co_counts):
                where.setdefault(line, []).append(spec.name)
    return [f"topic{'s' if len(names) > 1 else ''} {', '.join(names)}: {line}"
            for line, names in where.items()]


def partitions_found(specs: Iterable[TopicSpec], found: Mapping[str, FoundTopic],
                     default: int) -> int:
    """The partition count of the existing co-partitioned topics (``default`` when none
    exists yet)."""
    counts = {found[s.name].partitions for s in specs if s.co_partitioned and s.name in found}
    return counts.pop() if len(counts) == 1 else default


# --- the broker ----------------------------------------------------------------------------


async def _describe(admin: object, names: list[str]) -> dict[str, FoundTopic]:
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    if not names:
        return {}
    described = await admin.describe_topics(names)  # type: ignore[attr-defined]
    shapes: dict[str, tuple[int, int]] = {}
    for t in described:
        if t["error_code"] not in (0, 3):  # 3: UNKNOWN_TOPIC_OR_PARTITION (missing)
            raise BrokerError(f"topic {t['topic']}: not described (error {t['error_code']})")
        if t["error_code"] == 0 and t["partitions"]:
            shapes[t["topic"]] = (len(t["partitions"]),
                                  min(len(p["replicas"]) for p in t["partitions"]))
    if not shapes:
        return {}
    responses = await admin.describe_configs(  # type: ignore[attr-defined]
        [ConfigResource(ConfigResourceType.TOPIC, n) for n in shapes])
    configs: dict[str, dict[str, str]] = {}
    for response in responses:
        for resource in response.to_object()["resources"]:
            if resource["error_code"] == 3:  # a broker that has not learnt of it yet
                shapes.pop(resource["resource_name"], None)
                continue
            if resource["error_code"]:
                raise BrokerError(f"topic {resource['resource_name']}: configs not readable "
                                  f"({resource['error_message'] or resource['error_code']})")
            configs[resource["resource_name"]] = {
                e["config_names"]: e["config_value"] for e in resource["config_entries"]
                if e["config_value"] is not None}
    return {n: FoundTopic(n, *shapes[n], configs.get(n, {})) for n in shapes}


async def _created(admin: object, names: list[str], wait_s: float = 30.0,
                   ) -> dict[str, FoundTopic]:
    """The topics just created, once every broker asked knows them: on a cluster the
    metadata of a new topic reaches the other brokers a moment after the controller."""
    deadline = time.monotonic() + wait_s
    while True:
        found = await _describe(admin, names)
        late = sorted(set(names) - set(found))
        if not late:
            return found
        if time.monotonic() > deadline:
            raise BrokerError(f"created but not described after {wait_s:.0f} s: "
                              f"{', '.join(late)}")
        await asyncio.sleep(0.2)


@dataclass(frozen=True)
class TopicRequest:
    """One topic as memstream creates it: what CreateTopics is asked for (and what a
    Strimzi KafkaTopic of ``memstream topics manifest`` declares)."""

    name: str
    partitions: int
    replicas: int
    config: Mapping[str, str]


def requests(specs: Iterable[TopicSpec], wanted: Replication) -> list[TopicRequest]:
    """The topics ``specs`` as they are created under ``wanted``'s replication."""
    return [TopicRequest(s.name, s.partitions, wanted.factor, {**s.config(), **wanted.config()})
            for s in specs]


def missing_problems(missing: Iterable[TopicSpec]) -> list[str]:
    """The refusal of a worker that may not create topics (``topics_create`` false): one
    line naming every missing topic (empty: none missing)."""
    names = [s.name for s in missing]
    if not names:
        return []
    return [f"topic{'s' if len(names) > 1 else ''} {', '.join(names)}: missing, and "
            "MEMSTREAM_TOPICS_CREATE=false (this worker creates no topic); fix: create "
            f"{'them' if len(names) > 1 else 'it'} (memstream topics manifest --format "
            "strimzi, or memstream topics create)"]


async def _create(admin: object, specs: list[TopicSpec], wanted: Replication) -> None:
    from aiokafka.admin import NewTopic

    new = [NewTopic(r.name, r.partitions, r.replicas, topic_configs=dict(r.config))
           for r in requests(specs, wanted)]
    response = await admin.create_topics(new)  # type: ignore[attr-defined]
    errors = [(name, code, *rest) for name, code, *rest in getattr(response, "topic_errors", [])
              if code not in (0, 36)]  # 36: TOPIC_ALREADY_EXISTS (a concurrent creator)
    if errors:
        raise BrokerError(f"topic creation failed: {errors}")


def all_specs(settings: Settings) -> list[TopicSpec]:
    """Every topic a worker of ``settings`` needs: the registry and the tables' changelogs."""
    return registry(settings).all() + table_changelogs(settings)


async def prepare(settings: Settings, specs: list[TopicSpec] | None = None,
                  create: bool | None = None) -> Layout:
    """Create the missing topics and check every one (:class:`LayoutError` on a mismatch):
    the layout a worker of ``settings`` may run on. ``create`` false (default: the
    settings' ``topics_create``): only check, a missing topic is a refusal too."""
    from memstream.core import kafka

    inconsistent = tenancy_problems(settings)  # before anything is created for it
    if inconsistent:
        raise LayoutError(inconsistent)
    specs = specs if specs is not None else all_specs(settings)
    admin = kafka.admin(settings)
    await admin.start()
    try:
        brokers = len((await admin.describe_cluster())["brokers"])
        wanted = replication_for(settings, brokers)
        names = [s.name for s in specs]
        found = await _describe(admin, names)
        missing = [s for s in specs if s.name not in found]
        if not (settings.topics_create if create is None else create):
            lines = problems(specs, found, wanted) + missing_problems(missing)
            if lines:
                raise LayoutError(lines)
        if missing and wanted.factor > brokers:
            raise LayoutError([f"replication factor {wanted.factor} needs {wanted.factor} "
                               f"brokers, the cluster has {brokers} now: start the others, "
                               f"or set MEMSTREAM_REPLICATION_FACTOR={brokers}"])
        lines = problems(specs, found, wanted)
        if lines:
            raise LayoutError(lines)
        if missing:
            await _create(admin, missing, wanted)
            found.update(await _created(admin, [s.name for s in missing]))
            lines = problems(specs, found, wanted)  # a concurrent creator's, checked too
            if lines:
                raise LayoutError(lines)
        n = partitions_found(specs, found, settings.partitions)
        return Layout(n, wanted, tuple(s.name for s in missing))
    finally:
        await admin.close()


async def create_topics(settings: Settings, specs: list[TopicSpec] | None = None) -> list[str]:
    """Create the topics that do not exist yet and check them all (idempotent); returns the
    names created. :class:`LayoutError` when an existing topic does not fit."""
    return list((await prepare(settings, specs, create=True)).created)
