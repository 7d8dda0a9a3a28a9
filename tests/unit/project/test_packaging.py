"""One import namespace: the wheel installs only ``memstream`` (issue: a user's own
``memory.py`` must not shadow our code, and PyPI has packages named ``memory``/``topics``).
The client and the wire contract are the light distribution's (clients/python)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[3]


def copy_of_the_repository(tmp_path: Path) -> Path:
    """What a wheel is built from, copied: building leaves build/ and *.egg-info behind."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "VERSION", "LICENSE", "NOTICE"):
        shutil.copy(ROOT / name, src / name)
    for name in ("memstream", "core", "memory", "streams", "topics", "jobs", "web", "ops", "dev",
                 "clients"):
        shutil.copytree(ROOT / name, src / name, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
    return src


def built(src: Path, out: Path, prefix: str) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(out), str(src)], check=True, capture_output=True)
    return next(out.glob(f"{prefix}*.whl"))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel of this checkout, built once for the module's tests."""
    tmp_path = tmp_path_factory.mktemp("wheel")
    return built(copy_of_the_repository(tmp_path), tmp_path, "memstream-0")


def test_wheel_has_one_top_level_package(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"memstream"}
    # the client and the wire contract are memstream-client's (clients/python), not twice
    assert not [n for n in names if n.startswith(("memstream/client/", "memstream/contract/"))]
    for sub in ("memory/store/protocol.py", "streams/ingest.py", "topics/schemas.py",
                "jobs/__init__.py",
                "memory/prompts/combined-v1.md", "samples/conversations.jsonl",
                "web/inspector/index.html", "web/inspector/app.js", "web/http.py",
                "web/inspector/style.css", "core/settings.py"):
        assert f"memstream/{sub}" in names


def test_wheel_metadata_has_the_version_and_the_license(wheel: Path, tmp_path: Path) -> None:
    """The version is VERSION's (the one source), the license Apache-2.0 with its texts."""
    version = (ROOT / "VERSION").read_text().strip()
    assert wheel.name.startswith(f"memstream-{version}-")
    archive = zipfile.ZipFile(wheel)
    info = f"memstream-{version}.dist-info"
    headers = archive.read(f"{info}/METADATA").decode().split("\n\n")[0].splitlines()
    assert f"Version: {version}" in headers
    assert "License-Expression: Apache-2.0" in headers
    assert {"License-File: LICENSE", "License-File: NOTICE"} <= set(headers)
    assert archive.read(f"{info}/licenses/LICENSE") == (ROOT / "LICENSE").read_bytes()
    # installed from the wheel (no checkout beside it), __version__ is the metadata's
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target",
                    str(tmp_path / "site"), str(wheel)], check=True, capture_output=True)
    out = subprocess.run([sys.executable, "-I", "-c",
                          f"import sys; sys.path.insert(0, {str(tmp_path / 'site')!r}); "
                          "import memstream; print(memstream.__file__, memstream.__version__)"],
                         capture_output=True, text=True, check=True, cwd=tmp_path)
    where, got = out.stdout.split()
    assert where.startswith(str(tmp_path / "site")) and got == version


def test_the_client_wheel_holds_the_client_distributions_packages_only(tmp_path: Path) -> None:
    """memstream-client: ``memstream`` is a namespace there (no ``__init__.py``), so the
    server's wheel installs its own ``memstream/__init__.py`` beside it."""
    src = copy_of_the_repository(tmp_path) / "clients" / "python"
    version = (ROOT / "VERSION").read_text().strip()
    client_wheel = built(src, tmp_path, f"memstream_client-{version}-")
    names = zipfile.ZipFile(client_wheel).namelist()
    code = {n for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert "memstream/__init__.py" not in code
    assert {n.split("/")[1] for n in code} == {"client", "contract", "consumer", "sealing"}
    for sub in ("client/__init__.py", "client/_http.py", "contract/records.py",
                "contract/http_api/api.py", "contract/http_api/paths.py",
                "contract/events.py", "consumer/changes.py", "sealing/envelope.py"):
        assert f"memstream/{sub}" in code
    [meta] = [n for n in names if n.endswith(".dist-info/METADATA")]
    text = zipfile.ZipFile(client_wheel).read(meta).decode()
    requires = sorted(line.split(": ", 1)[1] for line in text.splitlines()
                      if line.startswith("Requires-Dist: "))
    assert [re.split(r"[\[<>=; ]", r)[0] for r in requires] == ["aiokafka", "cryptography",
                                                                 "pydantic", "urllib3"]
    for extra in ("aiokafka", "cryptography"):  # the consumer's: never the base install's
        assert all("extra == \"kafka\"" in r for r in requires if r.startswith(extra))
    headers = text.split("\n\n")[0].splitlines()
    assert f"Version: {version}" in headers and "License-Expression: Apache-2.0" in headers


def test_a_users_own_memory_module_does_not_shadow_ours(tmp_path: Path) -> None:
    for name in ("memory", "topics", "streams", "jobs", "web", "core", "ops", "dev"):
        (tmp_path / f"{name}.py").write_text("raise SystemExit('user module imported')\n")
    code = ("import memstream.memory.store, memstream.topics.schemas, memstream.jobs, "
            "memstream.web, memstream.client, memstream.core, memstream.ops, memstream.dev; "
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
