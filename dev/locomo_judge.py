"""Answering and judging LOCOMO questions with an OpenAI-compatible endpoint (J, F1, BLEU-1).

The answer is written from the retrieved memories only; the judge follows the style of
Mem0's evaluation (generous on wording, strict on facts: a date or a name that differs is
WRONG). The prompt texts are here, versioned by :data:`PROMPT_VERSION`: change a text,
change the version.

Every call can be recorded (``record``: call, then append the answer to a JSONL file) and
replayed (``recorded``: answers from the file only, a request it lacks is an error, never a
call), so a run against a paid endpoint can be repeated offline with the same answers.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from memstream.dev.locomo import QA, Retrieved

PROMPT_VERSION = "locomo-v1"
ANSWER_SYSTEM = """You answer questions about a long conversation between two people, using
only the memories listed below (each a fact one of them stated, with when it was stated).
Answer in a few words: a name, a date, a short phrase. For a question about when something
happened, give the date relative to the memory's date if needed ("the week before 9 June
2023"). If the memories do not contain the answer, say "not mentioned"."""
JUDGE_SYSTEM = """You grade an answer against a gold answer to a question about a
conversation. Be generous with wording: an answer that says the same thing in other words,
is longer, or adds detail is CORRECT as long as it contains the gold answer's facts. Be
strict with facts: a different date, number, name or place is WRONG; for dates, the same
day, month or year written another way is CORRECT. Reply with JSON only:
{"reasoning": "<one sentence>", "label": "CORRECT" or "WRONG"}"""
_LABEL = re.compile(r"\b(CORRECT|WRONG)\b")


class RecordingMiss(LookupError):
    """``recorded`` mode: the file holds no answer for this request."""


@dataclass
class Calls:
    """An OpenAI-compatible chat endpoint behind a record/replay file."""

    base_url: str | None
    api_key: str
    mode: Literal["live", "record", "recorded"] = "live"
    path: Path | None = None
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._saved: dict[str, dict[str, Any]] = {}
        if self.path is not None and self.path.exists():
            for line in self.path.read_text("utf-8").splitlines():
                try:
                    row = json.loads(line)
                except ValueError:
                    continue  # a torn last line
                self._saved[row["key"]] = row
        self._client: Any = None
        if self.mode != "recorded":
            import openai

            self._client = openai.OpenAI(base_url=self.base_url, api_key=self.api_key,
                                         timeout=120.0, max_retries=3)

    def chat(self, model: str, system: str, user: str, max_tokens: int = 200) -> str:
        request = {"model": model, "system": system, "user": user, "max_tokens": max_tokens,
                   "prompt_version": PROMPT_VERSION}
        key = hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest()
        saved = self._saved.get(key)
        if saved is None and self.mode == "recorded":
            raise RecordingMiss(f"no recorded answer for request {key[:16]} (model {model})")
        if saved is None:
            reply = self._client.chat.completions.create(
                model=model, temperature=0, max_tokens=max_tokens,
                messages=[{"role": "system", "content": system},
                          {"role": "user", "content": user}])
            usage = reply.usage
            saved = {"key": key, "answer": reply.choices[0].message.content or "",
                     "prompt_tokens": getattr(usage, "prompt_tokens", 0) or 0,
                     "completion_tokens": getattr(usage, "completion_tokens", 0) or 0}
            if self.mode == "record" and self.path is not None:
                with self._lock, self.path.open("a", encoding="utf-8") as f:
                    f.write(json.dumps(saved) + "\n")
            self._saved[key] = saved
        self.calls += 1
        self.prompt_tokens += int(saved["prompt_tokens"])
        self.completion_tokens += int(saved["completion_tokens"])
        return str(saved["answer"])


def memories_block(retrieved: Sequence[Retrieved]) -> str:
    return "\n".join(f"- {r.content}" for r in retrieved) or "(no memories)"


def label(reply: str) -> bool:
    """CORRECT / WRONG from the judge's reply (JSON, or the word alone)."""
    try:
        data = json.loads(reply[reply.index("{"):reply.rindex("}") + 1])
        return str(data.get("label", "")).upper() == "CORRECT"
    except ValueError:
        found = _LABEL.search(reply.upper())
        return found is not None and found.group(1) == "CORRECT"


@dataclass
class Judge:
    calls: Calls
    answer_model: str
    judge_model: str

    def score(self, qa: QA, retrieved: Sequence[Retrieved]) -> tuple[str, bool]:
        answer = self.calls.chat(self.answer_model, ANSWER_SYSTEM,
                                 f"Memories:\n{memories_block(retrieved)}\n\n"
                                 f"Question: {qa.question}\nAnswer:", max_tokens=60)
        verdict = self.calls.chat(self.judge_model, JUDGE_SYSTEM,
                                  f"Question: {qa.question}\nGold answer: {qa.answer}\n"
                                  f"Answer to grade: {answer}", max_tokens=120)
        return answer.strip(), label(verdict)
