"""A worker refuses to start, in one line, on topics that would misroute or lose data
(topics/layout.py), against the real broker: another partition count, fewer replicas than
the setting asks, a changelog that is not compacted, a source of truth with a retention."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from aiokafka.admin import NewTopic

from memstream.core import kafka
from memstream.core.settings import Settings
from memstream.dev.process import settings_env
from memstream.topics.layout import create_topics, prepare
from memstream.topics.registry import changelog_name

pytestmark = pytest.mark.integration
REFUSED = 78


def fresh(bootstrap: str, tmp: Path, **overrides: object) -> Settings:
    run = uuid.uuid4().hex[:10]
    return Settings(bootstrap_servers=bootstrap, topic_prefix=f"it-{run}", app_id=f"it-{run}",
                    partitions=2, data_dir=tmp / "data", **overrides)  # type: ignore[arg-type]


def run(settings: Settings, *command: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **settings_env(settings), "MEMSTREAM_BROKER_WAIT_S": "20"}
    return subprocess.run([sys.executable, "-m", "memstream.cli", *command], env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def refusals(done: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in done.stderr.splitlines() if "refuses to start" in line]


async def test_another_partition_count_is_refused_by_the_worker_and_topics_create(
        kafka_bootstrap, tmp_path, cleanup):
    settings = fresh(kafka_bootstrap, tmp_path)
    cleanup(settings)
    await create_topics(settings)
    grown = settings.model_copy(update={"partitions": 3})
    done = run(grown, "worker")
    assert done.returncode == REFUSED, done.stderr[-2000:]
    (line,) = refusals(done)
    assert settings.topic("messages") in line and "2 partitions, needs 3" in line
    assert "MEMSTREAM_PARTITIONS=2" in line
    checked = run(grown, "topics", "create")
    assert checked.returncode == REFUSED and "MEMSTREAM_PARTITIONS=2" in checked.stderr
    assert (await prepare(settings)).partitions == 2  # the topics are untouched


async def test_fewer_replicas_than_the_setting_is_refused(kafka_bootstrap, tmp_path, cleanup):
    settings = fresh(kafka_bootstrap, tmp_path)
    cleanup(settings)
    await create_topics(settings)  # one broker here: replication factor 1
    done = run(settings.model_copy(update={"replication_factor": 3}), "worker")
    assert done.returncode == REFUSED, done.stderr[-2000:]
    lines = refusals(done)
    assert any("replication factor 1, needs 3" in line
               and settings.topic("memory-changes") in line for line in lines), lines


async def test_a_changelog_that_is_not_compacted_is_refused(kafka_bootstrap, tmp_path, cleanup):
    settings = fresh(kafka_bootstrap, tmp_path)
    cleanup(settings)
    name = changelog_name(settings, "ingest-state")
    admin = kafka.admin(settings)
    await admin.start()
    try:  # made by hand, as a default topic would be: cleanup.policy=delete
        await admin.create_topics([NewTopic(name, 2, 1)])
    finally:
        await admin.close()
    done = run(settings, "worker")
    assert done.returncode == REFUSED, done.stderr[-2000:]
    lines = refusals(done)  # and its max.message.bytes: the broker's default, under ours
    (line,) = [line for line in lines if "cleanup.policy" in line] or [lines]
    assert f"topic {name}: cleanup.policy=delete, needs compact" in line
    assert "fix: " in line


async def test_a_source_of_truth_with_a_retention_is_refused(kafka_bootstrap, tmp_path, cleanup):
    settings = fresh(kafka_bootstrap, tmp_path)
    cleanup(settings)
    name = settings.topic("memory-changes")
    admin = kafka.admin(settings)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, 2, 1,
                                            topic_configs={"retention.ms": "604800000"})])
    finally:
        await admin.close()
    done = run(settings, "worker")
    assert done.returncode == REFUSED, done.stderr[-2000:]
    (line,) = refusals(done)
    assert f"topic {name}: retention.ms=604800000, needs -1" in line


async def test_a_fresh_deployment_is_created_checked_and_said(kafka_bootstrap, tmp_path,
                                                             cleanup):
    settings = fresh(kafka_bootstrap, tmp_path)
    cleanup(settings)
    done = run(settings, "topics", "create")
    assert done.returncode == 0, done.stderr
    assert "every topic checked: 2 partitions, replication factor 1, min.insync.replicas 1 " \
           "(1 broker)" in done.stdout
    again = run(settings, "topics", "create")
    assert again.returncode == 0 and "created 0 topic(s)" in again.stdout
