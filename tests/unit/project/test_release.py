"""Release metadata: one version source (VERSION), ``memstream --version``, the license,
the changelog (docs/versioning.md)."""

from __future__ import annotations

import hashlib
import re
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

import memstream
from memstream.cli import main

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[3]
VERSION = (ROOT / "VERSION").read_text()


def test_version_file_is_one_semantic_version() -> None:
    assert re.fullmatch(r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)\n", VERSION)


def test_the_cli_prints_the_version_of_the_file() -> None:
    result = CliRunner().invoke(main, ["--version"], env={"MEMSTREAM_PARTITIONS": "not a number"})
    assert result.exit_code == 0, result.output  # answered before settings are read
    assert result.output == f"memstream {VERSION}"
    assert memstream.__version__ == VERSION.strip()


def test_pyproject_takes_its_version_and_license_from_the_files() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and project["project"]["dynamic"] == ["version"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"file": "VERSION"}
    assert project["project"]["license"] == "Apache-2.0"
    assert set(project["project"]["license-files"]) == {"LICENSE", "NOTICE"}


def test_license_is_the_complete_apache_2_text() -> None:
    text = (ROOT / "LICENSE").read_bytes()
    # the canonical LICENSE-2.0.txt of the Apache Software Foundation, byte for byte
    assert hashlib.md5(text).hexdigest() == "3b83ef96387f14655fc854ddc3c6bd57"
    assert b"APPENDIX: How to apply the Apache License to your work." in text
    assert "Copyright 2026 the memstream authors" in (ROOT / "NOTICE").read_text()


def test_changelog_has_unreleased_and_this_version() -> None:
    """Keep a Changelog 1.1.0: an [Unreleased] section first, then one per version, newest
    first, each with its date."""
    text = (ROOT / "CHANGELOG.md").read_text()
    heads = re.findall(r"^## \[([^\]]+)\](?: - (\d{4}-\d{2}-\d{2}))?$", text, re.M)
    assert heads[0] == ("Unreleased", "")
    assert heads[1][0] == VERSION.strip() and heads[1][1]
    sections = set(re.findall(r"^### (\w+)$", text, re.M))
    assert sections <= {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}


def test_the_readme_is_a_front_door() -> None:
    """At most 300 lines, the two commands exactly, and every secret compose requires
    (``${VAR:?...}``) named where it says how to start it."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    for command in ("./scripts/demo.sh", "./scripts/test.sh"):
        assert re.search(rf"^{re.escape(command)}\s+#", readme, re.M), command
    required = set(re.findall(r"\$\{(\w+):\?", (ROOT / "docker-compose.yml").read_text()))
    assert "MEMSTREAM_CLUSTER_SECRET" in required
    docker = next(p for p in readme.split("\n- ") if p.startswith("**Docker**"))
    assert all(f"`{name}`" in docker for name in required), (required, docker)
