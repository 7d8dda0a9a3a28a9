"""docker-compose.yml and the Dockerfile stay consistent with the repository."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[3]


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


def test_compose_runs_two_workers_each_with_its_own_id_url_port_and_volume():
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    one, two = services["worker"], services["worker-2"]
    assert two["build"] == "." and two["depends_on"] == one["depends_on"]
    for key in ("MEMSTREAM_GROUP_INSTANCE_ID", "MEMSTREAM_ADVERTISED_URL"):
        assert one["environment"][key] != two["environment"][key]
    assert two["environment"]["MEMSTREAM_ADVERTISED_URL"] == "http://worker-2:6066"
    for env in (one["environment"], two["environment"]):
        assert env["MEMSTREAM_STORE_PARTITIONED"] == "true"
        assert env["MEMSTREAM_PARTITIONS"] == "12" and env["MEMSTREAM_ADMIN_KEY"]
    assert one["ports"] != two["ports"] and one["volumes"] != two["volumes"]


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


# --- metrics: Prometheus, alerts, Grafana (deploy/) --------------------------------------
DEPLOY = ROOT / "deploy"
_METRIC = re.compile(r"\bmemstream_[a-z_]+\b")


def exposed_samples() -> set[str]:
    """Every sample name the worker's /metrics can expose (all families populated)."""
    from memstream.streams.counters import Counters
    from memstream.web.prometheus import PipelineCollector, StoreSize

    c = Counters()
    c.changes[("add", "extraction")] = 1
    c.jobs_by_trigger["threshold"] = 1
    c.dead_letters_by_class["schema"] = 1
    store = StoreSize(lambda: 1, 30.0)
    store.value = 1
    names: set[str] = set()
    for family in PipelineCollector(c, lambda: {("t", 0): 1}, store).collect():
        suffixes = {"counter": ["_total"], "gauge": [""],
                    "histogram": ["_bucket", "_sum", "_count"]}[family.type]
        names |= {family.name + s for s in suffixes}
    return names


def _compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def _dashboard() -> dict:
    return json.loads((DEPLOY / "grafana" / "memstream-dashboard.json").read_text())


def _alert_rules() -> list[dict]:
    groups = yaml.safe_load((DEPLOY / "alerts.yml").read_text())["groups"]
    return [rule for g in groups for rule in g["rules"]]


def _balanced(expr: str) -> bool:
    depth = 0
    for ch in expr:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth < 0:
            return False
    return depth == 0


def test_compose_runs_prometheus_and_grafana_on_the_deploy_files():
    compose = _compose()
    services = compose["services"]
    assert {"prometheus", "grafana"} <= set(services)
    assert services["worker"]["environment"]["MEMSTREAM_METRICS_KEY"].startswith(
        "${MEMSTREAM_METRICS_KEY")
    assert compose["secrets"]["memstream_metrics_key"] == {"environment": "MEMSTREAM_METRICS_KEY"}
    assert services["prometheus"]["secrets"] == ["memstream_metrics_key"]
    for name in ("prometheus", "grafana"):
        for volume in services[name]["volumes"]:
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), source
            else:
                assert source in compose["volumes"], source


def test_prometheus_scrapes_the_worker_with_the_metrics_key_file():
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    (job,) = config["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    services = _compose()["services"]
    workers = sorted(name for name, svc in services.items() if svc.get("build") == ".")
    assert workers == ["worker", "worker-2"]
    targets = [f"{name}:{services[name]['ports'][0].split(':')[-1]}" for name in workers]
    assert job["static_configs"][0]["targets"] == targets
    assert job["authorization"]["credentials_file"] == "/run/secrets/memstream_metrics_key"
    mounted = {v.split(":")[1] for v in _compose()["services"]["prometheus"]["volumes"]}
    assert set(config["rule_files"]) <= mounted


def test_every_alert_and_panel_queries_metrics_the_worker_exposes():
    exposed = exposed_samples()
    exprs = [rule["expr"] for rule in _alert_rules()]
    exprs += [t["expr"] for panel in _dashboard()["panels"] for t in panel["targets"]]
    assert exprs
    for expr in exprs:
        assert _balanced(expr), expr
        assert set(_METRIC.findall(expr)) <= exposed, expr


def test_the_alerts_cover_the_spec_and_the_dashboard_every_metric():
    names = {rule["alert"] for rule in _alert_rules()}
    assert all(rule.get("labels", {}).get("severity") for rule in _alert_rules())
    for topic in ("WriteVolume", "HitRate", "ConflictRate", "UserDeletionRate",
                  "ConsolidationRate", "RetrievalLatency", "ConsumerLag", "DeadLetters",
                  "ExtractionLag"):
        assert any(topic in n for n in names), topic
    queried = {name.removesuffix("_bucket") for panel in _dashboard()["panels"]
               for t in panel["targets"] for name in _METRIC.findall(t["expr"])}
    wanted = {"memstream_memory_changes_total", "memstream_retrievals_with_results_total",
              "memstream_conflicts_total", "memstream_user_deletions_total",
              "memstream_consolidation_merges_total", "memstream_retrieval_latency_seconds",
              "memstream_llm_calls_total", "memstream_llm_tokens_total",
              "memstream_messages_total", "memstream_jobs_total",
              "memstream_trivial_jobs_total", "memstream_extraction_lag_seconds",
              "memstream_consumer_lag", "memstream_dead_letters_total",
              "memstream_store_records"}
    assert wanted <= queried, wanted - queried


def test_grafana_provisions_the_datasource_the_dashboard_names():
    ds = yaml.safe_load((DEPLOY / "grafana/provisioning/datasources/prometheus.yml").read_text())
    (source,) = ds["datasources"]
    assert source["url"] == "http://prometheus:9090" and source["type"] == "prometheus"
    dashboard = _dashboard()
    assert dashboard["uid"] and dashboard["panels"]
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == source["uid"]
        assert all(t["datasource"]["uid"] == source["uid"] for t in panel["targets"])
    providers = yaml.safe_load((DEPLOY / "grafana/provisioning/dashboards/memstream.yml")
                               .read_text())["providers"]
    mounted = {v.split(":")[1] for v in _compose()["services"]["grafana"]["volumes"]}
    assert any(m.startswith(providers[0]["options"]["path"] + "/") for m in mounted)
