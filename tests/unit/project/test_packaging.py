"""One import namespace: the wheel installs only ``memstream`` (issue: a user's own
``memory.py`` must not shadow our code, and PyPI has packages named ``memory``/``topics``)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[3]


def test_wheel_has_one_top_level_package(tmp_path: Path) -> None:
    src = tmp_path / "src"  # a copy: building leaves build/ and *.egg-info behind
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for name in ("memstream", "memory", "streams", "topics", "jobs", "web"):
        shutil.copytree(ROOT / name, src / name, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path), str(src)], check=True, capture_output=True)
    wheel = next(tmp_path.glob("memstream-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"memstream"}
    for sub in ("memory/store/protocol.py", "streams/ingest.py", "topics/schemas.py",
                "jobs/__init__.py",
                "memory/prompts/combined-v1.md", "samples/conversations.jsonl",
                "web/inspector/index.html", "web/inspector/app.js", "web/http.py",
                "web/inspector/style.css", "core/settings.py"):
        assert f"memstream/{sub}" in names


def test_a_users_own_memory_module_does_not_shadow_ours(tmp_path: Path) -> None:
    for name in ("memory", "topics", "streams", "jobs", "web"):
        (tmp_path / f"{name}.py").write_text("raise SystemExit('user module imported')\n")
    code = ("import memstream.memory.store, memstream.topics.schemas, memstream.jobs, "
            "memstream.web, memstream.client; "
            "print(memstream.memory.store.__name__)")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "memstream.memory.store"


def test_an_install_declares_its_data_folders() -> None:
    """Every data-only folder shipped in the wheel is a declared package (setuptools warns
    about each undeclared one on every install: issue 16's warning flood)."""
    import tomllib

    root = Path(__file__).resolve().parents[3]
    conf = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages, data = set(conf["packages"]), conf["package-data"]
    assert set(data) <= packages
    for folder, package in (("memstream/samples", "memstream.samples"),
                            ("memory/prompts", "memstream.memory.prompts"),
                            ("web/inspector", "memstream.web.inspector")):
        assert package in packages and any((root / folder).iterdir())
