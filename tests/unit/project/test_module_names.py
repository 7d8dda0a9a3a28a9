"""No module name in two packages: ``apply`` or ``shards`` means one module, so a reader (or
a traceback, or a log line's logger) never has to ask which one."""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3] / "memstream"


def homes() -> dict[str, list[str]]:
    """Module or package name -> where it is (packages are symlinked at the root)."""
    found: dict[str, list[str]] = defaultdict(list)
    for d, dirs, files in os.walk(ROOT, followlinks=True):
        dirs[:] = [x for x in dirs if x != "__pycache__"]
        here = Path(d).relative_to(ROOT)
        for f in files:
            if f.endswith(".py") and f != "__init__.py":
                found[f[:-3]].append(str(here / f))
        if here != Path(".") and (Path(d) / "__init__.py").exists():
            found[here.name].append(f"{here}/")
    return found


def test_no_module_name_is_in_two_packages():
    twice = {name: where for name, where in homes().items() if len(where) > 1}
    assert twice == {}


def test_the_check_sees_every_package_of_the_namespace():
    names = homes()
    for name in ("ingest", "owned_loop", "protocol", "edge", "openai_model", "envelope",
                 "store", "llm", "crypto", "http_api", "records", "client"):
        assert name in names, name
