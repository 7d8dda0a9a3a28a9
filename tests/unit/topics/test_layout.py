"""What a worker refuses to start on (topics/layout.py): pure checks over what the broker
reports, one line per finding, naming the topics, what was found, what is needed, the fix."""

from __future__ import annotations

import pytest

from memstream.core.settings import Settings
from memstream.topics.layout import (
    FoundTopic,
    LayoutError,
    Replication,
    all_specs,
    partitions_found,
    problems,
    replication_for,
)

pytestmark = pytest.mark.unit
S = Settings(partitions=4)
SPECS = all_specs(S)
BY_NAME = {s.name: s for s in SPECS}
WANT = Replication(factor=3, min_insync=2, brokers=3)


def as_created(replicas: int = 3, **changed: dict[str, str]) -> dict[str, FoundTopic]:
    """Every topic as memstream creates it, with ``changed`` configs on the named topics."""
    found = {}
    for spec in SPECS:
        config = {**spec.config(), "min.insync.replicas": "2",
                  "unclean.leader.election.enable": "false", "retention.bytes": "-1"}
        found[spec.name] = FoundTopic(spec.name, spec.partitions, replicas,
                                      {**config, **changed.get(spec.name, {})})
    return found


def only(lines: list[str]) -> str:
    assert len(lines) == 1, lines
    assert "\n" not in lines[0]
    return lines[0]


@pytest.mark.parametrize(("brokers", "rf", "isr", "want"), [
    (1, None, None, (1, 1)), (2, None, None, (2, 1)), (3, None, None, (3, 2)),
    (5, None, None, (3, 2)), (1, 1, None, (1, 1)), (3, 2, None, (2, 1)), (3, 3, 3, (3, 3)),
])
def test_the_default_replication_follows_the_broker_count(brokers, rf, isr, want):
    found = replication_for(Settings(replication_factor=rf, min_insync_replicas=isr), brokers)
    assert (found.factor, found.min_insync) == want


def test_min_insync_above_the_factor_is_refused():
    with pytest.raises(LayoutError, match="MIN_INSYNC_REPLICAS=3 is above"):
        replication_for(Settings(replication_factor=2, min_insync_replicas=3), 3)


def test_topics_as_created_have_no_problem():
    assert problems(SPECS, as_created(), WANT) == []
    assert partitions_found(SPECS, as_created(), 9) == 4
    assert partitions_found(SPECS, {}, 9) == 9  # none exists yet: the setting


def test_another_partition_count_names_every_topic_and_the_count_to_set():
    found = {n: FoundTopic(n, 8 if BY_NAME[n].co_partitioned else t.partitions, t.replicas,
                           t.config) for n, t in as_created().items()}
    line = only(problems(SPECS, found, WANT))
    assert S.topic("messages") in line and S.topic("memory-changes") in line
    assert S.topic("user-keys") not in line  # one partition, as it must be
    assert "8 partitions, needs 4" in line and "MEMSTREAM_PARTITIONS=8" in line
    assert "growing-the-partition-count" in line


def test_co_partitioned_topics_that_disagree_are_named():
    found = as_created()
    messages = found[S.topic("messages")]
    found[messages.name] = FoundTopic(messages.name, 6, 3, messages.config)
    line = only(problems(SPECS, found, WANT))
    assert line.startswith(f"topic {messages.name}: 6 partitions, needs 4")
    assert "disagree (4, 6 partitions)" in line


def test_a_single_partition_topic_with_more_is_refused():
    found = as_created()
    keys = found[S.topic("user-keys")]
    found[keys.name] = FoundTopic(keys.name, 3, 3, keys.config)
    assert "3 partitions, needs 1" in only(problems(SPECS, found, WANT))


def test_replication_below_the_setting_names_the_setting_that_accepts_it():
    lines = problems(SPECS, as_created(replicas=1), WANT)
    assert len(lines) == 2 and "min.insync.replicas=2 above its 1 replicas" in lines[1]
    line = lines[0]
    assert "replication factor 1, needs 3" in line and "MEMSTREAM_REPLICATION_FACTOR=1" in line
    assert S.topic("memory-changes") in line


@pytest.mark.parametrize(("topic", "config", "needle"), [
    ("memory-changes", {"cleanup.policy": "compact"}, "cleanup.policy=compact, needs delete"),
    ("messages", {"cleanup.policy": "compact,delete"}, "cleanup.policy=compact,delete"),
    ("user-keys", {"cleanup.policy": "delete"}, "cleanup.policy=delete, needs compact"),
    ("memory-changes", {"retention.ms": "604800000"}, "retention.ms=604800000, needs -1"),
    ("memory-access", {"retention.bytes": "1073741824"}, "retention.bytes=1073741824, needs -1"),
    ("memory-changes", {"min.insync.replicas": "1"}, "min.insync.replicas=1, needs 2"),
    ("memory-changes", {"min.insync.replicas": "4"}, "above its 3 replicas"),
    ("memory-changes", {"unclean.leader.election.enable": "true"}, "unclean.leader.election"),
    ("messages", {"max.message.bytes": "1000"}, "max.message.bytes=1000, needs at least"),
])
def test_each_config_that_would_lose_data_is_one_line(topic, config, needle):
    name = S.topic(topic)
    line = only(problems(SPECS, as_created(**{name: config}), WANT))
    assert line.startswith(f"topic {name}: ") and needle in line and "fix: " in line


def test_a_changelog_that_is_not_compacted_is_refused():
    name = f"{S.app_id}-ingest-state-changelog"
    line = only(problems(SPECS, as_created(**{name: {"cleanup.policy": "delete"}}), WANT))
    assert name in line and "needs compact" in line


def test_a_retention_bound_topic_may_keep_longer_or_shorter():
    name = S.topic("messages")
    assert problems(SPECS, as_created(**{name: {"retention.ms": "-1"}}), WANT) == []
    assert problems(SPECS, as_created(**{name: {"retention.ms": "3600000"}}), WANT) == []
