"""docker-compose.yml and the Dockerfile stay consistent with the repository."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]


def test_compose_has_kafka_qdrant_and_worker():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"kafka", "qdrant", "worker"} <= set(services)
    env = services["kafka"]["environment"]
    assert "broker" in env["KAFKA_PROCESS_ROLES"] and "controller" in env["KAFKA_PROCESS_ROLES"]
    assert env["KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"] == 1
    worker = services["worker"]
    assert worker["build"] == "."
    assert worker["environment"]["MEMSTREAM_BOOTSTRAP_SERVERS"] == "kafka:9092"


def test_dockerfile_copies_existing_packages():
    lines = (ROOT / "Dockerfile").read_text().splitlines()
    sources = [ln.split()[1] for ln in lines if ln.startswith("COPY")]
    for src in sources:
        for part in src.split():
            assert (ROOT / part).exists(), part


def _compose_available() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _compose_available(), reason="no docker compose client here")
def test_docker_compose_config_is_valid():
    proc = subprocess.run(["docker", "compose", "config", "-q"], cwd=ROOT, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr
