"""No class of the project overrides an underscore (private) method or attribute of a
Faust or mode class: a private override silently stops working when the library renames
what it overrides, and pins the project to the library's internals (docs/faust.md). What
memstream uses of Faust is public: tests/unit/streams/test_faust_contract.py."""

from __future__ import annotations

import ast
import contextlib
import importlib
import inspect
import pkgutil
import re
import textwrap
from collections.abc import Iterator
from typing import Any

import faust
import mode
import pytest

import memstream

pytestmark = pytest.mark.unit

THIRD_PARTY = ("faust", "mode")


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _theirs(cls: type) -> bool:
    return cls.__module__.split(".")[0] in THIRD_PARTY


def _assigned(cls: type) -> set[str]:
    """``self.<name>`` assigned in ``cls``'s own methods (its instance attributes)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return set()
    found = set()
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign | ast.AugAssign):
            targets = [node.target]
        for target in targets:
            for t in ast.walk(target):
                if (isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
                        and t.value.id == "self"):
                    found.add(t.attr)
    return found


def _names_of(cls: type) -> set[str]:
    """What ``cls`` itself defines: its class attributes and methods, its annotations and
    the attributes its methods assign on ``self``; not what the bases' machinery writes into
    every subclass (``abc``'s cache, mode's per-class task and timer lists: the names an
    empty subclass of the same bases has too)."""
    empty = type("Empty", cls.__bases__, {"__module__": cls.__module__})
    made = set(vars(empty))
    return (set(vars(cls)) - made) | set(vars(cls).get("__annotations__", {})) | _assigned(cls)


def _their_private_names(cls: type) -> dict[str, str]:
    """Every underscore name a Faust or mode base of ``cls`` defines -> that base."""
    out: dict[str, str] = {}
    for base in cls.__mro__[1:]:
        if not _theirs(base):
            continue
        source = ""
        with contextlib.suppress(OSError, TypeError):
            source = inspect.getsource(inspect.getmodule(base))  # type: ignore[arg-type]
        instance = set(re.findall(r"\bself\.(_\w+)\s*(?::[^=\n]+)?=", source))
        for name in (set(vars(base)) | set(vars(base).get("__annotations__", {})) | instance):
            if _private(name):
                out.setdefault(name, base.__qualname__)
    return out


def _project_classes() -> Iterator[type]:
    roots = [memstream]
    for root in roots:
        for info in pkgutil.walk_packages(root.__path__, root.__name__ + "."):
            try:
                module = importlib.import_module(info.name)
            except Exception:  # an optional extra that is not installed: not ours to run
                continue
            for _, cls in inspect.getmembers(module, inspect.isclass):
                if cls.__module__ == module.__name__:
                    yield cls


def private_overrides(classes: list[type]) -> list[str]:
    """``Class.name`` for every underscore name a class defines that a Faust or mode base
    of it also defines."""
    found = []
    for cls in classes:
        if _theirs(cls) or not any(_theirs(b) for b in cls.__mro__[1:]):
            continue
        theirs = _their_private_names(cls)
        for name in sorted(_names_of(cls)):
            if _private(name) and name in theirs:
                found.append(f"{cls.__module__}.{cls.__qualname__}.{name} "
                             f"(overrides {theirs[name]}.{name})")
    return found


def test_no_class_of_the_project_overrides_a_private_faust_or_mode_name():
    classes = list(_project_classes())
    subclasses = [c for c in classes if not _theirs(c) and any(_theirs(b) for b in c.__mro__[1:])]
    assert {c.__name__ for c in subclasses} >= {"Worker", "Part"}  # the scan sees them
    assert private_overrides(classes) == []


def test_the_scan_finds_a_private_override():
    """The scan itself can fail: a method, a class attribute and an instance attribute."""
    class Web(faust.App):
        def _new_web(self) -> Any:
            return None

    class Flagged(mode.Service):
        _log_mundane = None

    class Assigned(mode.Service):
        def __init__(self) -> None:
            super().__init__()
            self._started = None

    class Fine(mode.Service):
        def __init__(self) -> None:
            super().__init__()
            self._mine = 1

        async def on_start(self) -> None:
            return None

    found = private_overrides([Web, Flagged, Assigned, Fine])
    assert [f.split(" ")[0].rsplit(".", 2)[-2:] for f in found] == [
        ["Web", "_new_web"], ["Flagged", "_log_mundane"], ["Assigned", "_started"]]
