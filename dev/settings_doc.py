"""The settings reference (docs/settings.md), generated from the ``Settings`` class so it
cannot drift from the code.

``render()`` builds the Markdown from ``Settings.model_fields``: one table per group of
the class (the ``# --- Group ---`` comments in its source), in class order, each field
with its environment variable, type, default and description. ``python -m
memstream.dev.settings_doc`` prints it; ``--check PATH`` exits 1 when PATH differs (CI, the
unit test); ``--write PATH`` rewrites PATH.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import inspect
import io
import re
import sys
import textwrap
import tokenize
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import annotated_types
from pydantic import SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from memstream.core.settings import Settings

DEFAULT_PATH = "docs/settings.md"
_COMMAND = f"python -m memstream.dev.settings_doc --write {DEFAULT_PATH}"
_OTHER = "Other"
# "# --- Triggers and coalescing (SPEC §3) -----" → "Triggers and coalescing"
_HEADING = re.compile(r"#\s*-{3,}\s*(?P<title>.*?)\s*-*\s*$")


def render() -> str:
    """The Markdown of docs/settings.md."""
    prefix = str(Settings.model_config.get("env_prefix") or "")
    out = [
        "# Settings",
        "",
        f"<!-- Generated from the Settings class by `{_COMMAND}`. Do not edit by hand. -->",
        "",
        f"memstream reads its settings once at start-up from environment variables with the "
        f"prefix `{prefix}` (for example `{prefix}MIN_NEW_MESSAGES=6`) into one frozen "
        "settings object that is passed down. Names are case-insensitive. A list is given "
        "as JSON (`[\"reflect\", \"decay\"]`). \"unset\" means no value (the description "
        "says what that does); a secret's value is never shown here.",
        "",
    ]
    for title, names in _groups():
        out += [f"## {title}", "", "| variable | type | default | description |",
                "|---|---|---|---|"]
        for name in names:
            field = Settings.model_fields[name]
            cells = (f"`{prefix}{name.upper()}`", _type_text(field), _default_text(field),
                     _cell(field.description or ""))
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def check(path: Path) -> str | None:
    """None when ``path`` holds exactly ``render()``, else what is wrong (with a diff)."""
    expected = render()
    if not path.is_file():
        return f"{path} does not exist: run `{_COMMAND}`"
    actual = path.read_text(encoding="utf-8")
    if actual == expected:
        return None
    diff = difflib.unified_diff(actual.splitlines(), expected.splitlines(),
                                f"{path} (on disk)", f"{path} (from Settings)", lineterm="", n=1)
    return (f"{path} is out of date with the Settings class: run `{_COMMAND}`\n"
            + "\n".join(diff))


def main(argv: Sequence[str] | None = None) -> int:
    """Print the settings reference, or check / rewrite a file; the exit code."""
    parser = argparse.ArgumentParser(
        prog="python -m memstream.dev.settings_doc",
        description="The settings reference (docs/settings.md), generated from Settings.")
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--check", metavar="PATH", type=Path,
                      help="exit 1 when PATH differs from the generated Markdown")
    what.add_argument("--write", metavar="PATH", type=Path, help="rewrite PATH")
    args = parser.parse_args(argv)
    if args.check is not None:
        problem = check(args.check)
        if problem is not None:
            print(problem, file=sys.stderr)
            return 1
        print(f"{args.check} is up to date")
        return 0
    if args.write is not None:
        args.write.parent.mkdir(parents=True, exist_ok=True)
        args.write.write_text(render(), encoding="utf-8")
        print(f"wrote {args.write}")
        return 0
    sys.stdout.write(render())
    return 0


# --- groups: the section comments of the class's source ---------------------------------

def _groups() -> list[tuple[str, list[str]]]:
    """(title, field names) in class order; fields the source does not show go last."""
    headings, lines = _source_layout()
    groups: list[tuple[str, list[str]]] = []
    rest: list[str] = []
    for name in Settings.model_fields:
        line = lines.get(name)
        if line is None:
            rest.append(name)
            continue
        title = next((t for at, t in reversed(headings) if at < line), _OTHER)
        if not groups or groups[-1][0] != title:
            groups.append((title, []))
        groups[-1][1].append(name)
    if rest:
        groups.append((_OTHER, rest))
    return groups


def _source_layout() -> tuple[list[tuple[int, str]], dict[str, int]]:
    """The class's group headings (line, title) and each field's line."""
    try:
        source = textwrap.dedent(inspect.getsource(Settings))
    except (OSError, TypeError):  # no source (frozen app): one table
        return [], {}
    headings = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        match = _HEADING.fullmatch(tok.string) if tok.type == tokenize.COMMENT else None
        if match and match["title"]:
            headings.append((tok.start[0], _plain_title(match["title"])))
    cls = ast.parse(source).body[0]
    lines = {node.target.id: node.lineno for node in getattr(cls, "body", [])
             if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)}
    return headings, lines


def _plain_title(title: str) -> str:
    """A heading without its asides: "Retrieval (SPEC §5)" → "Retrieval"."""
    return re.sub(r"\s*\([^)]*\)", "", title).strip() or title


# --- cells ------------------------------------------------------------------------------

def _type_text(field: FieldInfo) -> str:
    text = _annotation_text(field.annotation)
    bounds = [_bound_text(m) for m in field.metadata]
    return _cell(" ".join([text, ", ".join(b for b in bounds if b)]).strip())


def _annotation_text(annotation: Any) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        parts = [a for a in args if a is not type(None)]  # unset is shown as the default
        return " or ".join(_annotation_text(a) for a in parts)
    if origin is typing.Literal:
        return " or ".join(f"`{a}`" for a in args)
    if origin in (tuple, list, set, frozenset):
        items = [a for a in args if a is not Ellipsis]
        if len(items) == 1 and typing.get_origin(items[0]) is typing.Literal:
            return "JSON list of " + ", ".join(f"`{a}`" for a in typing.get_args(items[0]))
        inner = " or ".join(_annotation_text(a) for a in items) if items else "values"
        return f"JSON list of {inner}"
    if annotation is SecretStr:
        return "secret"
    if isinstance(annotation, type) and issubclass(annotation, Path):
        return "path"
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def _bound_text(meta: Any) -> str:
    for kind, attr, sign in ((annotated_types.Ge, "ge", "≥"), (annotated_types.Gt, "gt", ">"),
                             (annotated_types.Le, "le", "≤"), (annotated_types.Lt, "lt", "<")):
        if isinstance(meta, kind):
            return f"{sign} {_value_text(getattr(meta, attr))}"
    return ""


def _default_text(field: FieldInfo) -> str:
    if field.default_factory is not None:
        try:
            value = field.default_factory()  # type: ignore[call-arg]
        except Exception:  # a factory that needs the other values: computed at start-up
            return "computed"
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if value is None:
        return "unset"
    if isinstance(value, SecretStr) or _is_secret(field.annotation):
        return "set (secret)"  # never the value
    return _cell(f"`{_value_text(value)}`")


def _is_secret(annotation: Any) -> bool:
    return annotation is SecretStr or SecretStr in typing.get_args(annotation)


def _value_text(value: Any) -> str:
    """How the value is written in the environment."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    if isinstance(value, Path):
        return _home_relative(value)
    if isinstance(value, tuple | list | set | frozenset):
        return "[" + ", ".join(f'"{v}"' if isinstance(v, str) else _value_text(v)
                               for v in value) + "]"
    return str(value)


def _home_relative(path: Path) -> str:
    """``~/.cache/memstream``, not the home of whoever generated the file."""
    try:
        return str(Path("~") / path.relative_to(Path.home()))
    except (ValueError, RuntimeError):
        return str(path)


def _cell(text: str) -> str:
    """One table cell: one line, pipes escaped, ``<`` outside code spans too (a
    description's ``<host>`` is text, not an HTML tag)."""
    spans = " ".join(text.split()).replace("|", "\\|").split("`")
    for i in range(0, len(spans), 2):  # even pieces lie outside backticks
        spans[i] = spans[i].replace("<", "&lt;")
    return "`".join(spans)


if __name__ == "__main__":
    raise SystemExit(main())
