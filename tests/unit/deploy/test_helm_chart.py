"""The Helm chart (deploy/helm/memstream) lints, renders and validates.

Helm is built from its Go module and the prometheus-operator CRDs come from the Go module
proxy, each once (scripts/helm.sh, run by scripts/bootstrap.sh --test). With each value set
below, ``helm lint --strict`` passes and every resource ``helm template`` renders is valid
against the Kubernetes API's schemas (strict) and the CRDs' schemas (tests/k8s_validate.py);
the rendered workers carry what memstream needs (stable ids, advertised URLs, probes, the
image's user, real setting names)."""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from memstream.core.settings import Settings
from tests.k8s_validate import CrdSchemas, documents, problems, required

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "deploy" / "helm" / "memstream"
SCRIPT = ROOT / "scripts" / "helm.sh"

VALUE_SETS: dict[str, dict[str, Any]] = {
    "default": {},
    # Strimzi: SCRAM over TLS with the KafkaUser's Secret, topics as KafkaTopic resources,
    # the API over HTTPS, Prometheus Operator's resources
    "sasl-tls": {
        "kafka": {"bootstrapServers": "my-cluster-kafka-bootstrap.kafka.svc:9093",
                  "securityProtocol": "SASL_SSL",
                  "sasl": {"mechanism": "SCRAM-SHA-512", "username": "memstream",
                           "passwordSecret": {"name": "memstream", "key": "password"}},
                  "tls": {"caSecret": {"name": "my-cluster-cluster-ca-cert", "key": "ca.crt"}}},
        "topics": {"create": False, "partitions": 24, "replicationFactor": 3,
                   "minInsyncReplicas": 2},
        "web": {"tls": {"secretName": "memstream-web-tls"}},
        "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}},
                    "prometheusRule": {"enabled": True, "labels": {"release": "prom"}}},
    },
    "mtls": {
        "kafka": {"bootstrapServers": "my-cluster-kafka-bootstrap:9093",
                  "securityProtocol": "SSL",
                  "tls": {"caSecret": {"name": "my-cluster-cluster-ca-cert"},
                          "clientSecret": {"name": "memstream"}}},
        "metrics": {"serviceMonitor": {"enabled": True}},
    },
    "per-tenant": {"topics": {"inputTopics": "per-tenant", "tenants": ["acme", "globex"]},
                   "replicaCount": 2},
    "qdrant": {"qdrant": {"enabled": True}, "fullnameOverride": "mem"},
    "existing-secrets": {
        "secrets": {"existingSecret": "memstream-keys"},
        "serviceAccount": {"create": False, "name": "memstream"},
        "llm": {"backend": "openai", "baseUrl": "http://llm:8000/v1",
                "apiKeySecret": {"name": "llm", "key": "api-key"}},
        "extraEnv": [{"name": "MEMSTREAM_RETENTION_DAYS", "value": "14"}],
        "podDisruptionBudget": {"enabled": False},
        "qdrant": {"url": "http://qdrant.vectors.svc:6333"},
    },
    "external-qdrant": {"qdrant": {"url": "https://qdrant.vectors.svc:6333"},
                        "secrets": {"qdrantApiKey": "k" * 40}},
    "tracing": {"tracing": {"mode": "otlp", "otlpEndpoint": "http://otel-collector:4318",
                            "sampleRatio": 0.25}, "logFormat": "json"},
}




@cache
def _tool(flag: str) -> str:
    run = subprocess.run(["bash", str(SCRIPT), flag], capture_output=True, text=True,
                         timeout=1200)
    return run.stdout.strip() if run.returncode == 0 else ""


@pytest.fixture(scope="module")
def helm() -> str:
    found = _tool("--path")
    if not found:
        required("Helm is not built and could not be (scripts/helm.sh needs Go)")
    return found


@pytest.fixture(scope="module")
def crds() -> CrdSchemas:
    folder = _tool("--crds")
    if not folder:
        required("the prometheus-operator CRDs could not be fetched (scripts/helm.sh --crds)")
    return CrdSchemas.from_files(sorted(Path(folder).glob("*.yaml")))


def _values_file(tmp_path: Path, values: dict[str, Any]) -> Path:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def _run(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm, *args], capture_output=True, text=True, timeout=120)


def render(helm: str, tmp_path: Path, values: dict[str, Any]) -> list[dict[str, Any]]:
    run = _run(helm, "template", "mem-test", str(CHART), "--namespace", "memory",
               "-f", str(_values_file(tmp_path, values)))
    assert run.returncode == 0, run.stderr
    return documents(run.stdout)


def _one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["labels"].get(
        "app.kubernetes.io/component") == "worker"]
    assert len(found) == 1, [d["metadata"]["name"] for d in found]
    return found[0]


def _env(sts: dict[str, Any]) -> dict[str, dict[str, Any]]:
    container = sts["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e for e in container["env"]}


# --- lint and render ------------------------------------------------------------------

@pytest.mark.parametrize("name", VALUE_SETS)
def test_the_chart_lints_strictly(helm, tmp_path, name):
    run = _run(helm, "lint", "--strict", str(CHART), "--namespace", "memory",
               "-f", str(_values_file(tmp_path, VALUE_SETS[name])))
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.parametrize("name", VALUE_SETS)
def test_every_rendered_resource_is_valid(helm, crds, tmp_path, name):
    docs = render(helm, tmp_path, VALUE_SETS[name])
    assert docs
    assert problems(docs, crds) == []


def test_the_documented_values_render_valid_resources(helm, crds, tmp_path):
    """docs/kubernetes.md's values-strimzi.yaml (and its monitoring block) as written."""
    text = (ROOT / "docs" / "kubernetes.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", text, re.S)
    [values] = [yaml.safe_load(b) for b in blocks if b.startswith("# values-strimzi.yaml")]
    [monitoring] = [yaml.safe_load(b) for b in blocks if b.startswith("metrics:")]
    docs = render(helm, tmp_path, {**values, **monitoring})
    assert problems(docs, crds) == []
    env = _env(_one(docs, "StatefulSet"))
    assert env["MEMSTREAM_TOPICS_CREATE"]["value"] == "false"
    assert env["MEMSTREAM_KAFKA_SECURITY_PROTOCOL"]["value"] == "SASL_SSL"


def test_the_validator_reports_an_invalid_resource(helm, crds, tmp_path):
    """The check can fail: a value set whose worker gets a number as an env value (the API
    wants a string), and a ServiceMonitor with a field its CRD does not have."""
    docs = render(helm, tmp_path, {"extraEnv": [{"name": "MEMSTREAM_RETENTION_DAYS",
                                                 "value": 14}],
                                   "metrics": {"serviceMonitor": {"enabled": True}}})
    found = problems(docs, crds)
    assert found, docs
    assert all(p.startswith("StatefulSet/mem-test-memstream: spec.template.spec.containers.0"
                            ".env.") and "14 is not of type 'string'" in p for p in found), found
    monitor = next(d for d in docs if d["kind"] == "ServiceMonitor")
    monitor["spec"]["endpoints"][0]["bearerTokenFile"] = "/no"  # a real field: accepted
    assert problems([monitor], crds) == []
    monitor["spec"]["endpoints"][0]["bearerToken"] = "plain"  # no such field
    assert [p for p in problems([monitor], crds) if "bearerToken" in p], monitor
    assert problems([{"apiVersion": "example.com/v1", "kind": "Unknown",
                      "metadata": {"name": "x"}}], crds)  # no schema: not passed silently


@pytest.mark.parametrize("values, message", [
    ({"kafka": {"securityProtocol": "SASL_SSL"}}, "needs kafka.sasl.username"),
    ({"topics": {"inputTopics": "per-tenant"}}, "needs topics.tenants"),
    ({"replicaCount": 13}, "replicaCount is above topics.partitions"),
    ({"kafka": {"tls": {"clientSecret": {"name": "x"}}}}, "needs kafka.securityProtocol SSL"),
    ({"topics": {"inputTopics": "tenant"}}, "inputTopics"),   # values.schema.json
    ({"topics": {"tenants": ["a.b"]}}, "tenants"),
    ({"secrets": {"adminKey": "short"}}, "adminKey"),
    ({"kafka": {"bootstrap": "x:9092"}}, "bootstrap"),         # unknown key
])
def test_inconsistent_values_are_refused(helm, tmp_path, values, message):
    run = _run(helm, "template", "mem-test", str(CHART), "-f", str(_values_file(tmp_path, values)))
    assert run.returncode != 0
    assert message in run.stderr, run.stderr


# --- what the workers get -------------------------------------------------------------

def test_workers_have_stable_ids_urls_and_volumes(helm, tmp_path):
    docs = render(helm, tmp_path, {})
    sts = _one(docs, "StatefulSet")
    headless = next(d for d in docs
                    if d["kind"] == "Service" and d["spec"].get("clusterIP") == "None")
    assert sts["spec"]["serviceName"] == headless["metadata"]["name"]
    assert headless["spec"]["publishNotReadyAddresses"] is True
    env = _env(sts)
    assert env["MEMSTREAM_GROUP_INSTANCE_ID"]["value"] == "$(POD_NAME)"
    assert env["MEMSTREAM_ADVERTISED_URL"]["value"] == (
        f"http://$(POD_NAME).{headless['metadata']['name']}.$(POD_NAMESPACE).svc.cluster.local:6066")
    names = list(env)
    assert names.index("POD_NAME") < names.index("MEMSTREAM_ADVERTISED_URL")  # $(...) order
    assert env["MEMSTREAM_DATA_DIR"]["value"] == "/var/lib/memstream"
    assert env["MEMSTREAM_WEB_HOST"]["value"] == "0.0.0.0"
    assert env["MEMSTREAM_TOPICS_CREATE"]["value"] == "true"
    for key in ("MEMSTREAM_ADMIN_KEY", "MEMSTREAM_METRICS_KEY", "MEMSTREAM_CLUSTER_SECRET"):
        assert "secretKeyRef" in env[key]["valueFrom"], key
    [claim] = sts["spec"]["volumeClaimTemplates"]
    mounts = sts["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
    assert {"name": claim["metadata"]["name"], "mountPath": "/var/lib/memstream"} in mounts


def test_pods_run_as_the_images_user():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    dockerfile = (ROOT / "Dockerfile").read_text()
    uid = values["podSecurityContext"]["runAsUser"]
    assert f"USER {uid}:{values['podSecurityContext']['runAsGroup']}" in dockerfile
    assert values["podSecurityContext"]["fsGroup"] == 10001 == uid
    assert "ENV MEMSTREAM_DATA_DIR=/var/lib/memstream" in dockerfile


def test_probes_liveness_on_live_readiness_on_health(helm, tmp_path):
    container = _one(render(helm, tmp_path, {}), "StatefulSet")["spec"]["template"]["spec"][
        "containers"][0]
    assert container["livenessProbe"]["httpGet"]["path"] == "/v1/live"
    assert container["startupProbe"]["httpGet"]["path"] == "/v1/live"
    assert container["readinessProbe"]["httpGet"]["path"] == "/v1/health"
    tls = _one(render(helm, tmp_path, VALUE_SETS["sasl-tls"]), "StatefulSet")
    probe = tls["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]
    assert probe["httpGet"]["scheme"] == "HTTPS"
    assert _env(tls)["MEMSTREAM_ADVERTISED_URL"]["value"].startswith("https://")


@pytest.mark.parametrize("name", VALUE_SETS)
def test_every_setting_the_chart_sets_exists(helm, tmp_path, name):
    """A misspelt MEMSTREAM_ variable is ignored by the worker (extra="ignore"): none here."""
    known = set(Settings.model_fields)
    env = _env(_one(render(helm, tmp_path, VALUE_SETS[name]), "StatefulSet"))
    unknown = [n for n in env if n.startswith("MEMSTREAM_")
               and n.removeprefix("MEMSTREAM_").lower() not in known]
    assert unknown == []


def test_sasl_tls_and_topics_checked_only(helm, tmp_path):
    sts = _one(render(helm, tmp_path, VALUE_SETS["sasl-tls"]), "StatefulSet")
    env = _env(sts)
    assert env["MEMSTREAM_TOPICS_CREATE"]["value"] == "false"
    assert env["MEMSTREAM_KAFKA_SECURITY_PROTOCOL"]["value"] == "SASL_SSL"
    assert env["MEMSTREAM_KAFKA_SASL_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": "memstream", "key": "password"}
    assert env["MEMSTREAM_KAFKA_SSL_CAFILE"]["value"] == "/etc/memstream/kafka-ca/ca.crt"
    assert env["MEMSTREAM_PARTITIONS"]["value"] == "24"
    volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
    assert volumes["kafka-ca"]["secret"]["secretName"] == "my-cluster-cluster-ca-cert"
    mtls = _env(_one(render(helm, tmp_path, VALUE_SETS["mtls"]), "StatefulSet"))
    assert mtls["MEMSTREAM_KAFKA_SSL_CERTFILE"]["value"] == "/etc/memstream/kafka-client/user.crt"
    assert mtls["MEMSTREAM_KAFKA_SSL_KEYFILE"]["value"] == "/etc/memstream/kafka-client/user.key"
    assert "MEMSTREAM_KAFKA_SASL_PASSWORD" not in mtls


def test_per_tenant_layout_and_qdrant(helm, tmp_path):
    env = _env(_one(render(helm, tmp_path, VALUE_SETS["per-tenant"]), "StatefulSet"))
    assert env["MEMSTREAM_INPUT_TOPICS"]["value"] == "per-tenant"
    assert env["MEMSTREAM_TENANTS"]["value"] == "acme,globex"
    docs = render(helm, tmp_path, VALUE_SETS["qdrant"])
    env = _env(_one(docs, "StatefulSet"))
    assert env["MEMSTREAM_STORE"]["value"] == "server"
    assert env["MEMSTREAM_QDRANT_URL"]["value"] == "http://mem-qdrant:6333"
    qdrant = [d["kind"] for d in docs if d["metadata"]["name"] == "mem-qdrant"]
    assert sorted(qdrant) == ["Service", "StatefulSet"]
    secret = next(d for d in docs if d["kind"] == "Secret")
    assert set(secret["data"]) == {"admin-key", "metrics-key", "cluster-secret", "qdrant-api-key"}
    assert "MEMSTREAM_STORE" not in _env(_one(render(helm, tmp_path, {}), "StatefulSet"))
    docs = render(helm, tmp_path, VALUE_SETS["external-qdrant"])
    env = _env(_one(docs, "StatefulSet"))
    assert env["MEMSTREAM_QDRANT_URL"]["value"] == "https://qdrant.vectors.svc:6333"
    assert env["MEMSTREAM_QDRANT_API_KEY"]["valueFrom"]["secretKeyRef"]["key"] == "qdrant-api-key"
    assert "qdrant-api-key" in next(d for d in docs if d["kind"] == "Secret")["data"]
    assert not [d for d in docs if d["metadata"]["name"].endswith("-qdrant")]


def test_the_keys_secret_is_not_the_kafka_users(helm, tmp_path):
    """Strimzi's User Operator writes the worker's KafkaUser (memstream) Secret of that name
    into the namespace: the chart's own Secret must not take it."""
    run = _run(helm, "template", "memstream", str(CHART))
    assert run.returncode == 0, run.stderr
    docs = documents(run.stdout)
    [secret] = [d for d in docs if d["kind"] == "Secret"]
    assert secret["metadata"]["name"] == "memstream-keys"
    env = _env(_one(docs, "StatefulSet"))
    assert env["MEMSTREAM_ADMIN_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "memstream-keys"


def test_existing_secret_makes_no_secret(helm, tmp_path):
    docs = render(helm, tmp_path, VALUE_SETS["existing-secrets"])
    assert not [d for d in docs if d["kind"] in ("Secret", "ServiceAccount")]
    env = _env(_one(docs, "StatefulSet"))
    assert env["MEMSTREAM_ADMIN_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "memstream-keys"
    assert env["MEMSTREAM_LLM_API_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "llm",
                                                                         "key": "api-key"}


def test_monitoring_scrapes_with_the_metrics_key_and_alerts_from_deploy(helm, tmp_path):
    docs = render(helm, tmp_path, VALUE_SETS["sasl-tls"])
    monitor = next(d for d in docs if d["kind"] == "ServiceMonitor")
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics"
    assert endpoint["authorization"]["credentials"]["key"] == "metrics-key"
    assert monitor["metadata"]["labels"]["release"] == "prom"
    rule = next(d for d in docs if d["kind"] == "PrometheusRule")
    alerts = yaml.safe_load((ROOT / "deploy" / "alerts.yml").read_text())
    assert rule["spec"]["groups"] == alerts["groups"]
    assert not [d for d in render(helm, tmp_path, {}) if d["kind"] in ("ServiceMonitor",
                                                                      "PrometheusRule")]


def test_disruption_budget_and_versions():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["podDisruptionBudget"]["maxUnavailable"] == 1
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    version = (ROOT / "VERSION").read_text().strip()
    assert chart["apiVersion"] == "v2"
    assert chart["appVersion"] == version == chart["version"]
    # one source of the alerts: the chart's file is deploy/alerts.yml
    assert (CHART / "files" / "alerts.yml").resolve() == (ROOT / "deploy" / "alerts.yml")


def test_tracing_is_off_by_default_and_exports_where_asked(helm, tmp_path):
    env = _env(_one(render(helm, tmp_path, {}), "StatefulSet"))
    assert env["MEMSTREAM_TRACING"]["value"] == "off"
    assert "MEMSTREAM_OTLP_ENDPOINT" not in env
    env = _env(_one(render(helm, tmp_path, VALUE_SETS["tracing"]), "StatefulSet"))
    assert env["MEMSTREAM_TRACING"]["value"] == "otlp"
    assert env["MEMSTREAM_OTLP_ENDPOINT"]["value"] == "http://otel-collector:4318"
    assert env["MEMSTREAM_TRACING_SAMPLE_RATIO"]["value"] == "0.25"
    assert env["MEMSTREAM_LOG_FORMAT"]["value"] == "json"
    settings = Settings(**{k.removeprefix("MEMSTREAM_").lower(): v["value"] for k, v in env.items()
                           if k.startswith("MEMSTREAM_TRAC") or k == "MEMSTREAM_LOG_FORMAT"})
    assert settings.tracing == "otlp" and settings.tracing_sample_ratio == 0.25
