"""Every module, attribute or file a docstring or comment names exists: a reader who follows
``streams.apply.publish`` or ``memory/fencing.py`` from the text finds it (renamed or moved
code leaves no dead reference behind)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import io
import os
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = "core|streams|web|memory|topics|jobs|ops|dev|client|consumer"
DOTTED = re.compile(rf"(?<![\w./-])(?:memstream\.)?(?:{PACKAGES})\.[a-z_]\w*(?:\.[A-Za-z_]\w*)*")
FILE = re.compile(rf"(?<![\w./-])(?:memstream/)?(?:{PACKAGES})/[\w/]+\.py")


def sources() -> list[Path]:
    """Every module of the installed namespace (its packages are symlinks at the root)."""
    return sorted(Path(d) / f for d, _, files in os.walk(ROOT / "memstream", followlinks=True)
                  for f in files if f.endswith(".py"))


def prose(path: Path) -> Iterator[str]:
    """The docstrings and comments of one module."""
    text = path.read_text(encoding="utf-8")
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                yield doc
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            yield token.string


def resolves(name: str) -> bool:
    """``pkg.module[.attr...]``: the longest module prefix imports, the rest are its
    attributes."""
    parts = (name if name.startswith("memstream.") else f"memstream.{name}").split(".")
    for end in range(len(parts), 2, -1):
        module = ".".join(parts[:end])
        try:
            if importlib.util.find_spec(module) is None:
                continue
        except ModuleNotFoundError:
            continue
        found: object = importlib.import_module(module)
        for attr in parts[end:]:
            if not hasattr(found, attr):
                return False
            found = getattr(found, attr)
        return True
    return False


def dead_references() -> list[str]:
    out = []
    for path in sources():
        where = path.relative_to(ROOT)
        for text in prose(path):
            for m in DOTTED.finditer(text):
                if not resolves(m.group(0).rstrip(".")):
                    out.append(f"{where}: {m.group(0)}")
            for m in FILE.finditer(text):
                rel = m.group(0)
                if not (ROOT / (rel if rel.startswith("memstream/") else f"memstream/{rel}")
                        ).exists():
                    out.append(f"{where}: {rel}")
    return out


def test_every_module_a_docstring_or_comment_names_exists():
    assert dead_references() == []


def test_the_check_finds_a_dead_reference():
    assert resolves("streams.apply.publish") and resolves("memory/fencing.py".replace(
        "/", ".").removesuffix(".py"))
    assert not resolves("jobs.agents.DueIndex") and not resolves("streams.apply.nothing_here")
    assert DOTTED.findall("see :mod:`streams.http` and jobs.agents") == [
        "streams.http", "jobs.agents"]
