"""Recorded LLM answers: the same replay runs again offline with identical results (SPEC §9).

A :class:`Recorder` sits around the one place the OpenAI-compatible model asks for a
validated answer (:meth:`memory.llm.openai_model.OpenAIModel._ask`). Every request is keyed by
(model, prompt version, sha256 of the canonical request: system text + user text + reply
schema name); the answer (the validated reply as JSON) and its usage (calls, prompt and
completion tokens, retried attempts included) are appended to a JSONL file.

Modes:
- ``record``: always call the LLM, append the answer;
- ``replay``: offline, answer from the file only; a request the file does not hold raises
  :class:`RecordingMiss` naming its key — never a silent live call;
- ``auto``: answer from the file when it holds the request, else call and record.

The same request asked several times in one run (two_step asks "New fact: Lives in Munich"
against "(none)" for every user who says so) gets the recorded answers in the order they
were recorded (the n-th ask, the n-th answer; past the last, the last one again), so a
replay of a recorded run gives back exactly what that run got, even from a
non-deterministic model.

File format (version 1): UTF-8 JSON lines, append-only. The first line is the header
``{"format": "memstream-llm-record", "version": 1}``; every other line is one answer
``{"model", "prompt_version", "request_sha256", "schema", "answer", "usage": {"calls",
"prompt_tokens", "completion_tokens"}}``. Request texts are not stored (only their hash);
the answers are: they hold the facts extracted from users' messages, so treat the file
like the messages themselves. Each answer is written with one ``write`` call, flushed and
fsynced, under a lock (safe for the threads of one process; one writer process per file).
A torn last line (a crash mid-write) is skipped when the file is read.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from memstream.core.errors import MemstreamError
from memstream.memory.extraction import Usage

FORMAT = "memstream-llm-record"
VERSION = 1
Mode = Literal["record", "replay", "auto"]
log = logging.getLogger(__name__)


class RecordingError(MemstreamError):
    """The recording file cannot be used (missing, another format or version)."""


class RecordingMiss(MemstreamError):
    """Offline replay: the recording holds no answer for this request."""


@dataclass(frozen=True)
class RecordKey:
    model: str
    prompt_version: str
    request_sha256: str

    def __str__(self) -> str:
        return f"model={self.model} prompt={self.prompt_version} request={self.request_sha256}"


def request_digest(system: str, user: str, schema: str) -> str:
    """sha256 of the canonical request (sorted-key compact JSON, UTF-8)."""
    canonical = json.dumps({"schema": schema, "system": system, "user": user},
                           ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def record_key(model: str, prompt_version: str, system: str, user: str,
               schema: str) -> RecordKey:
    return RecordKey(model, prompt_version, request_digest(system, user, schema))


@dataclass(frozen=True)
class Answer:
    text: str
    usage: Usage


@dataclass
class RecorderStats:
    recorded: int = 0  # answers appended (live calls made through the recorder)
    replayed: int = 0  # answers taken from the file
    loaded: int = 0  # answers in the file when it was opened
    skipped_lines: int = 0  # unreadable lines (a torn last write)


def _entry(key: RecordKey, schema: str, answer: Answer) -> str:
    u = answer.usage
    return json.dumps({
        "model": key.model, "prompt_version": key.prompt_version,
        "request_sha256": key.request_sha256, "schema": schema, "answer": answer.text,
        "usage": {"calls": u.calls, "prompt_tokens": u.prompt_tokens,
                  "completion_tokens": u.completion_tokens},
    }, ensure_ascii=False, sort_keys=True)


def _parse(line: str) -> tuple[RecordKey, Answer]:
    row = json.loads(line)
    u = row["usage"]
    key = RecordKey(str(row["model"]), str(row["prompt_version"]), str(row["request_sha256"]))
    usage = Usage(int(u["calls"]), int(u["prompt_tokens"]), int(u["completion_tokens"]))
    return key, Answer(str(row["answer"]), usage)


def _check_header(line: str, path: Path) -> None:
    try:
        head = json.loads(line)
    except ValueError:
        head = None
    if not isinstance(head, dict) or head.get("format") != FORMAT:
        raise RecordingError(f"{path} is not a memstream LLM recording (no header line)")
    if head.get("version") != VERSION:
        raise RecordingError(f"{path}: recording format version {head.get('version')!r}, "
                             f"this memstream reads version {VERSION}")


class Recorder:
    """Answers from / into one recording file (see the module docstring)."""

    def __init__(self, path: Path, mode: Mode) -> None:
        if mode not in ("record", "replay", "auto"):
            raise ValueError(f"unknown recording mode {mode!r}")
        self.path = Path(path)
        self.mode: Mode = mode
        self.stats = RecorderStats()
        self._answers: dict[RecordKey, list[Answer]] = {}
        self._asked: Counter[RecordKey] = Counter()
        self._lock = threading.Lock()
        exists = self.path.exists() and self.path.stat().st_size > 0
        if mode == "replay" and not exists:
            raise RecordingError(f"no recording at {self.path}")
        if exists:
            self._load()
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._append(json.dumps({"format": FORMAT, "version": VERSION}))

    @property
    def offline(self) -> bool:
        """True when no LLM may be called (every answer must come from the file)."""
        return self.mode == "replay"

    def _load(self) -> None:
        lines = self.path.read_text("utf-8").split("\n")
        _check_header(lines[0], self.path)
        for n, line in enumerate(lines[1:], start=2):
            if not line.strip():
                continue
            try:
                key, answer = _parse(line)
            except (ValueError, KeyError, TypeError):
                self.stats.skipped_lines += 1
                log.warning("%s:%d: unreadable recording line skipped", self.path, n)
                continue
            self._answers.setdefault(key, []).append(answer)
            self.stats.loaded += 1
        if self.mode != "replay" and lines[-1] != "":
            self._append("")  # end a torn last line: the next answer gets a line of its own

    def _append(self, line: str) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())

    def answers(self, key: RecordKey) -> int:
        """How many answers the recording holds for ``key``."""
        return len(self._answers.get(key, ()))

    def answer(self, key: RecordKey, schema: str,
               live: Callable[[], tuple[str, Usage]]) -> tuple[str, Usage]:
        """The answer to the request ``key``: from the file or from ``live()`` per mode."""
        with self._lock:
            nth = self._asked[key]
            self._asked[key] += 1
            known = self._answers.get(key, [])
            if self.mode != "record" and known:
                self.stats.replayed += 1
                hit = known[min(nth, len(known) - 1)]
                return hit.text, hit.usage
        if self.mode == "replay":
            raise RecordingMiss(f"the recording {self.path} holds no answer for {key} "
                                f"(schema {schema}): replay with the same model, prompt "
                                "version and input, or record again")
        text, usage = live()  # outside the lock: a slow call does not hold other threads
        answer = Answer(text, usage)
        with self._lock:
            self._answers.setdefault(key, []).append(answer)
            self._append(_entry(key, schema, answer))
            self.stats.recorded += 1
        return text, usage
