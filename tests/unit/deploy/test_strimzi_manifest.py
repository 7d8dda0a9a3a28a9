"""What ``memstream topics manifest --format strimzi`` and ``memstream acls --format
strimzi`` write, and the Strimzi resources docs/ show, are valid for Strimzi: every resource
against Strimzi's own schema for its apiVersion and kind (the validators that the npm
package @kubernetes-models/strimzi-kafka-operator compiled from Strimzi's CRDs, run by
scripts/strimzi_schemas.sh), strict as the API server's field validation, and its metadata
as Kubernetes checks it (tests/k8s_validate.py), for several settings, both API versions
and every authentication.

The package is installed once with npm into ~/.cache/memstream (scripts/bootstrap.sh
--test, or this test when it is missing); without Node.js or npm the test is skipped, and
fails where the whole suite is required (MEMSTREAM_REQUIRE_TOOLS=1 or _INTEGRATION=1)."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from memstream.cli import main
from tests.k8s_validate import documents, metadata_problems, required

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "strimzi_schemas.sh"
VALIDATE = ROOT / "scripts" / "strimzi_schemas" / "validate.mjs"
SETTINGS = {
    "shared": {},
    "per-tenant": {"MEMSTREAM_INPUT_TOPICS": "per-tenant", "MEMSTREAM_TENANTS": "acme,beta-2",
                   "MEMSTREAM_TOPIC_PREFIX": "Mem_Stream", "MEMSTREAM_PARTITIONS": "12"},
    "fixed": {"MEMSTREAM_REPLICATION_FACTOR": "2", "MEMSTREAM_MIN_INSYNC_REPLICAS": "2",
              "MEMSTREAM_CONTENT_RETENTION_S": "600", "MEMSTREAM_EVENTS_RETENTION_DAYS": "30"},
}
Check = Callable[[list[dict[str, Any]]], list[str]]




@cache
def _modules() -> str:
    run = subprocess.run(["bash", str(SCRIPT), "--path"], capture_output=True, text=True,
                         timeout=600)
    return run.stdout.strip() if run.returncode == 0 else ""


def _validate(node: str, modules: str, docs: list[dict[str, Any]]) -> tuple[int, list[str]]:
    run = subprocess.run([node, str(VALIDATE), modules], input=json.dumps(docs),
                         capture_output=True, text=True, timeout=120)
    return run.returncode, run.stdout.splitlines() + run.stderr.splitlines()


@pytest.fixture(scope="module")
def schemas() -> tuple[str, str]:
    node = shutil.which("node")
    if node is None:
        required("Node.js is not installed (Debian: apt-get install nodejs npm)")
    modules = _modules()
    if not modules:
        required("Strimzi's schemas could not be installed (scripts/strimzi_schemas.sh, npm)")
    assert node is not None
    return node, modules


@pytest.fixture(scope="module")
def check(schemas) -> Check:
    """One line per problem Strimzi's schemas or Kubernetes' metadata rules find."""
    def run(docs: list[dict[str, Any]]) -> list[str]:
        code, lines = _validate(*schemas, docs)
        assert code in (0, 1), lines  # 2: a resource it could not check
        assert (code == 1) == bool(lines), (code, lines)
        return lines + [p for d in docs for p in metadata_problems(d)]
    return run


def render(env: dict[str, str], *args: str) -> list[dict[str, Any]]:
    out = CliRunner().invoke(main, list(args), env=env)
    assert out.exit_code == 0, out.output
    return documents(out.output)


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("api", ["v1", "v1beta2"])
@pytest.mark.parametrize("auth", ["scram-sha-512", "tls", "tls-external"])
def test_the_manifest_is_valid_for_strimzi(check, setting, api, auth):
    docs = render(SETTINGS[setting], "topics", "manifest", "--api-version", api,
                  "--authentication", auth, "--namespace", "memstream", "--cluster", "prod")
    kinds = [d["kind"] for d in docs]
    assert kinds.count("KafkaUser") >= 2 and kinds.count("KafkaTopic") >= 17
    assert {d["apiVersion"] for d in docs} == {f"kafka.strimzi.io/{api}"}
    assert check(docs) == []


def test_names_kubernetes_refuses_are_valid_through_topic_name(check):
    docs = render(SETTINGS["per-tenant"], "topics", "manifest")
    named = [d for d in docs if d["kind"] == "KafkaTopic" and "topicName" in d["spec"]]
    assert named and all(d["spec"]["topicName"].startswith("Mem_Stream.") for d in named)
    assert check(docs) == []


@pytest.mark.parametrize("api", ["v1", "v1beta2"])
def test_the_acls_command_is_valid_for_strimzi(check, api):
    docs = render({"MEMSTREAM_TENANTS": "acme"}, "acls", "--format", "strimzi",
                  "--strimzi-api-version", api)
    assert {d["apiVersion"] for d in docs} == {f"kafka.strimzi.io/{api}"}
    assert docs and check(docs) == []


def test_the_documented_strimzi_resources_are_valid(check):
    """Every Strimzi resource in docs/*.md's YAML blocks (docs/kubernetes.md's Kafka and
    KafkaNodePool) on the API Strimzi 1.x serves."""
    docs = [d for page in sorted((ROOT / "docs").glob("*.md"))
            for block in re.findall(r"```yaml\n(.*?)```", page.read_text(), re.S)
            for d in yaml.safe_load_all(block)
            if isinstance(d, dict) and ".strimzi.io/" in str(d.get("apiVersion", ""))]
    assert {"Kafka", "KafkaNodePool"} <= {d["kind"] for d in docs}
    assert {d["apiVersion"] for d in docs} == {"kafka.strimzi.io/v1"}
    assert check(docs) == []


def test_the_check_finds_what_strimzi_would_refuse(check):
    docs = render({}, "topics", "manifest")
    topic = next(d for d in docs if d["kind"] == "KafkaTopic")
    user = next(d for d in docs if d["kind"] == "KafkaUser")

    def broken(doc, change):
        doc = copy.deepcopy(doc)
        change(doc)
        return " ".join(check([doc]))

    assert "/spec/partitions: must be >= 1" in broken(
        topic, lambda d: d["spec"].update(partitions=0))
    assert "/spec/replicas: must be integer" in broken(
        topic, lambda d: d["spec"].update(replicas="3"))
    assert "/spec/replica: unknown field" in broken(topic, lambda d: d["spec"].update(replica=3))
    assert "metadata.name" in broken(topic, lambda d: d["metadata"].update(
        name="Mem_Stream.messages"))
    assert '"Frobnicate" is not one of' in broken(
        user, lambda d: d["spec"]["authorization"]["acls"][0].update(operations=["Frobnicate"]))
    assert "/resource/nam: unknown field" in broken(
        user, lambda d: d["spec"]["authorization"]["acls"][0]["resource"].update(nam="x"))
    assert '/: required field "spec" is missing' in broken(user, lambda d: d.pop("spec"))
    # a topic's config is free-form in the schema (Kafka's names): any key is kept
    assert broken(topic, lambda d: d["spec"]["config"].update({"any.config": "x"})) == ""


def test_v1_refuses_what_only_v1beta2_had(check):
    """Strimzi 1.x (v1 only) dropped ZooKeeper and the Kafka resource's own replicas."""
    docs = [{"apiVersion": f"kafka.strimzi.io/{api}", "kind": "Kafka",
             "metadata": {"name": "my-cluster"},
             "spec": {"kafka": {"replicas": 3, "listeners": []}, "zookeeper": {"replicas": 3}}}
            for api in ("v1beta2", "v1")]
    v1beta2, v1 = (check([d]) for d in docs)
    assert "/spec/zookeeper: unknown field" not in " ".join(v1beta2)
    assert "/spec/zookeeper: unknown field" in " ".join(v1)
    assert "/spec/kafka/replicas: unknown field" in " ".join(v1)


def test_a_kind_without_a_schema_is_not_passed(schemas):
    for doc in ({"apiVersion": "kafka.strimzi.io/v1", "kind": "KafkaTopix",
                 "metadata": {"name": "a"}, "spec": {}},
                {"apiVersion": "kafka.strimzi.io/v9", "kind": "KafkaTopic",
                 "metadata": {"name": "a"}, "spec": {}},
                {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}}):
        code, lines = _validate(*schemas, [doc])
        assert code == 2 and "no schema" in " ".join(lines), (doc, lines)
