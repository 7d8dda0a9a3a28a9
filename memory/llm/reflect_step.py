"""The reflection step of the OpenAI-compatible model: prompts, reply schemas, validation.

Generative Agents (Park et al., 2023) reflect in two calls: first the few most salient
high-level questions the recent memories can answer, then insights that answer them, each
citing its evidence ("... (because of 1, 5, 3)"). The model sees the memories numbered,
as in the decision prompt, so it never sees a real id and cannot invent one: a cited number
that was not shown makes the whole reply invalid (retried like malformed JSON), because an
insight with made-up evidence would link a reflection to the wrong memories.

Pure functions over plain data; the calls themselves are
:meth:`memory.llm.openai_model.OpenAIModel.reflect`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Annotated

from pydantic import BaseModel, Field, StrictInt, StringConstraints

from memstream.memory.extraction import Insight
from memstream.memory.model import Memory

REFLECT_PROMPT = "reflect-v1"  # the version of the pair of prompts below
MAX_QUESTIONS = 3
MAX_INSIGHTS = 5
INSIGHT_IMPORTANCE = 8  # a reflection outranks the memories it rests on (SPEC §6)

Question = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1,
                                            max_length=300)]
InsightText = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1,
                                               max_length=500)]


class QuestionsReply(BaseModel):
    questions: list[Question] = Field(min_length=1, max_length=MAX_QUESTIONS)


class InsightOut(BaseModel):
    text: InsightText
    # strict: "3" or true are not a memory number
    evidence: list[StrictInt] = Field(min_length=1)


class InsightsReply(BaseModel):
    insights: list[InsightOut] = Field(max_length=MAX_INSIGHTS)


def prompt_names(version: str = REFLECT_PROMPT) -> tuple[str, str]:
    """The two prompt files of a reflection version: ``reflect-v1`` ->
    ``reflect-questions-v1``, ``reflect-insights-v1`` (in ``memory/prompts/``)."""
    base, _, ver = version.rpartition("-")
    return f"{base}-questions-{ver}", f"{base}-insights-{ver}"


def _day(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d")


def listing(memories: Sequence[tuple[int, Memory]]) -> str:
    """``1. (2026-01-05) "Lives in Berlin"``: each text JSON-quoted, so a memory cannot
    break out of its line (a newline and "7. ..." inside a text stays inside its quotes)."""
    return "\n".join(f"{n}. ({_day(m.valid_from)}) {json.dumps(m.content, ensure_ascii=False)}"
                     for n, m in memories)


def questions_input(memories: Sequence[tuple[int, Memory]]) -> str:
    return f"Memories:\n{listing(memories)}"


def insights_input(questions: Sequence[str], memories: Sequence[tuple[int, Memory]]) -> str:
    asked = "\n".join(f"- {json.dumps(q, ensure_ascii=False)}" for q in questions)
    return f"Questions:\n{asked}\n\nMemories:\n{listing(memories)}"


def cites_only(shown: Sequence[int]) -> Callable[[InsightsReply], None]:
    """The check of an insights reply: every evidence number is one of those shown."""
    allowed = set(shown)

    def check(reply: InsightsReply) -> None:
        for i, insight in enumerate(reply.insights, start=1):
            invented = [n for n in insight.evidence if n not in allowed]
            if invented:
                raise ValueError(f"insight {i} cites {invented}, not among the memories shown")

    return check


def insights(reply: InsightsReply) -> list[Insight]:
    """The validated reply as :class:`Insight` values (evidence deduplicated, in order)."""
    return [Insight(o.text, tuple(dict.fromkeys(o.evidence)), INSIGHT_IMPORTANCE)
            for o in reply.insights]
