"""Topics managed elsewhere (MEMSTREAM_TOPICS_CREATE=false, ``memstream topics manifest``)
and the liveness route, against the real broker: a worker that may not create topics
refuses, in one line, to start on missing ones and starts on those the manifest declares;
``/v1/live`` answers while the worker waits for a broker that is not there, ``/v1/health``
only once it is ready."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
import yaml
from aiokafka.admin import NewTopic

from memstream.contract.http_api import paths
from memstream.core import kafka
from memstream.core.settings import Settings
from memstream.dev.process import WorkerProcess, settings_env
from tests.integration.conftest import free_port, until

pytestmark = pytest.mark.integration
REFUSED = 78


def fresh(bootstrap: str, tmp: Path, **overrides: object) -> Settings:
    run = uuid.uuid4().hex[:10]
    return Settings(bootstrap_servers=bootstrap, topic_prefix=f"it-{run}", app_id=f"it-{run}",
                    partitions=2, data_dir=tmp / "data", extract_enabled=False,
                    cluster_secret=f"cluster-{run}-{uuid.uuid4().hex}",
                    **overrides)  # type: ignore[arg-type]


def cli(settings: Settings, *command: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **settings_env(settings), "MEMSTREAM_BROKER_WAIT_S": "20"}
    return subprocess.run([sys.executable, "-m", "memstream.cli", *command], env=env,
                          capture_output=True, text=True, timeout=120, check=False)


async def existing(settings: Settings) -> set[str]:
    admin = kafka.admin(settings)
    await admin.start()
    try:
        return {t for t in await admin.list_topics() if t.startswith(settings.topic_prefix)}
    finally:
        await admin.close()


async def create_as_declared(settings: Settings, manifest: str) -> list[str]:
    """Play Strimzi's topic operator: create every KafkaTopic of the manifest."""
    docs = [d for d in yaml.safe_load_all(manifest) if d and d["kind"] == "KafkaTopic"]
    new = [NewTopic(d["spec"].get("topicName", d["metadata"]["name"]), d["spec"]["partitions"],
                    d["spec"]["replicas"], topic_configs=d["spec"]["config"]) for d in docs]
    admin = kafka.admin(settings)
    await admin.start()
    try:
        await admin.create_topics(new)
    finally:
        await admin.close()
    return [t.name for t in new]


async def test_a_worker_that_may_not_create_topics_checks_them(kafka_bootstrap, tmp_path,
                                                               cleanup):
    settings = fresh(kafka_bootstrap, tmp_path, topics_create=False,
                     input_topics="per-tenant", tenants="acme")
    cleanup(settings)
    done = cli(settings, "worker")
    assert done.returncode == REFUSED, done.stderr[-2000:]
    (line,) = [x for x in done.stderr.splitlines() if "refuses to start" in x]
    assert settings.topic("messages") in line and settings.topic("tenant.acme.messages") \
        in line and "MEMSTREAM_TOPICS_CREATE=false" in line
    assert await existing(settings) == set()  # nothing created

    manifest = cli(settings, "topics", "manifest", "--brokers", "1", "--cluster", "k")
    assert manifest.returncode == 0, manifest.stderr
    created = await create_as_declared(settings, manifest.stdout)
    assert settings.topic("tenant.acme.session-events") in created
    worker = WorkerProcess(settings, tmp_path / "worker.log").spawn()
    try:
        assert await worker.wait_ready_async(90), worker.log_text()[-3000:]
        assert "created" not in worker.log_text().split("topics:", 1)[1].split("\n", 1)[0]
    finally:
        worker.stop()


async def test_topics_create_creates_whatever_the_setting(kafka_bootstrap, tmp_path, cleanup):
    settings = fresh(kafka_bootstrap, tmp_path, topics_create=False)
    cleanup(settings)
    done = cli(settings, "topics", "create")
    assert done.returncode == 0, done.stderr
    assert settings.topic("messages") in await existing(settings)


def get(port: int, path: str) -> tuple[int, dict] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())
    except (urllib.error.URLError, ConnectionError):
        return None  # not listening (yet)


def no_broker_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again: nothing listens there


async def test_live_while_the_broker_is_away_health_only_when_ready(kafka_bootstrap, tmp_path,
                                                                    cleanup):
    port = free_port()
    away = fresh(f"127.0.0.1:{no_broker_port()}", tmp_path / "away", web_enabled=True,
                 web_port=port, broker_wait_s=120.0)
    worker = WorkerProcess(away, tmp_path / "away.log").spawn()
    try:
        live = await until(lambda: _async(get(port, paths.LIVE)), "live while waiting")
        assert live == (200, {"status": "alive"})
        status, health = get(port, paths.HEALTH) or (0, {})
        assert (status, health["status"], health["waiting"]) == (503, "starting", ["broker"])
        assert worker.alive()
    finally:
        worker.stop()

    port = free_port()
    settings = fresh(kafka_bootstrap, tmp_path / "up", web_enabled=True, web_port=port)
    cleanup(settings)
    worker = WorkerProcess(settings, tmp_path / "up.log").spawn()
    try:
        await until(lambda: _async(ready(port)), "health 200", timeout=120)
        assert get(port, paths.LIVE) == (200, {"status": "alive"})
    finally:
        worker.stop()


def ready(port: int) -> bool | None:
    found = get(port, paths.HEALTH)
    return True if found is not None and found[0] == 200 else None


async def _async(value):  # until() awaits its probe
    return value
