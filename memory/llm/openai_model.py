"""The OpenAI-compatible memory model: extraction and decision as two validated calls
(and reflection, :mod:`memory.llm.reflect_step`).

Works against OpenAI, vLLM, Ollama or anything that speaks ``/v1/chat/completions``:
- structured output through a JSON-schema response format, falling back to JSON mode
  (and remembering it) when the server rejects ``json_schema``;
- every reply is validated by a pydantic model; callers get the model, never a dict;
- 408/409/429, 5xx, timeouts, connection errors, malformed JSON and schema-invalid replies
  are retried per call with :mod:`memstream.core.retry` (capped backoff, ``llm_retries``); other
  4xx fail at once (:class:`LLMError`). Every retry, and each call's own timeout, fits
  inside the deadline of the job being decided (:func:`memstream.core.retry.current_deadline`,
  set by :meth:`Extractor.decide`), so a job never outlives its deadline and a two-step
  job does not redo the calls that already succeeded;
- prompts are versioned files (``memory/prompts/<name>-v<N>.md``); the version travels
  with every decision; token counts come back in :class:`Usage`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from functools import cache
from importlib import resources
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, Field, ValidationError

from memstream.core import tracing
from memstream.core.errors import MemstreamError, describe
from memstream.core.retry import (
    RetriesExhausted,
    RetryPolicy,
    current_deadline,
    remaining,
    retry_sync,
)
from memstream.core.settings import Settings
from memstream.memory.decisions import Candidate, Decision
from memstream.memory.extraction import Insight, Usage
from memstream.memory.llm import reflect_step as llm_reflect
from memstream.memory.llm.recorded import Recorder, record_key
from memstream.memory.model import Memory, MemoryType, OpKind
from memstream.topics.schemas import JobMessage, Role

T = TypeVar("T", bound=BaseModel)
EXTRACT_PROMPT = "extract-v1"
DECIDE_PROMPT = "decide-v1"
COMBINED_PROMPT = "combined-v1"
MIN_CALL_S = 1.0  # no call is started with less time than this left before the deadline
log = logging.getLogger(__name__)


class LLMError(MemstreamError):
    """The model could not produce a valid answer (after retries, or a permanent error)."""


class InvalidReply(Exception):
    """The reply was not valid JSON for the schema (retried)."""

    def __init__(self, message: str, usage: Usage) -> None:
        super().__init__(message)
        self.usage = usage


class FactOut(BaseModel):
    text: str = Field(min_length=1, max_length=500)
    type: Literal["episodic", "semantic", "procedural"] = "episodic"
    importance: int = Field(ge=1, le=10)
    expires_in_days: float | None = Field(default=None, gt=0)
    slot: str | None = None
    retraction: bool = False


class ExtractReply(BaseModel):
    facts: list[FactOut] = Field(max_length=50)


class DecideReply(BaseModel):
    op: Literal["ADD", "UPDATE", "DELETE", "NOOP"]
    target: int | None = None
    reason: str = Field(default="", max_length=500)


class ChangeOut(BaseModel):
    op: Literal["ADD", "UPDATE", "DELETE", "NOOP"]
    target: int | None = None
    fact: FactOut | None = None
    reason: str = Field(default="", max_length=500)


class CombinedReply(BaseModel):
    changes: list[ChangeOut] = Field(max_length=50)


@cache
def prompt(name: str) -> str:
    return resources.files("memstream.memory").joinpath(f"prompts/{name}.md").read_text("utf-8")


def retry_policy(settings: Settings) -> RetryPolicy:
    """The backoff of one LLM call (transient: :func:`memstream.core.retry.is_transient`)."""
    return RetryPolicy(first_delay_s=settings.llm_backoff_s,
                       max_delay_s=max(settings.llm_backoff_s, settings.llm_backoff_max_s),
                       min_attempt_s=min(MIN_CALL_S, settings.llm_timeout_s))


class OpenAIModel:
    """``two_step``: extract once per job, decide once per candidate (1 + n calls).
    ``combined``: one call per job that extracts and decides together (see docs/benchmarks.md for
    the measured difference).

    ``clock`` is the clock of the deadlines (the pipeline's, ``time.time``); ``sleep`` and
    ``clock`` are injected so tests need not wait."""

    name = "openai"

    def __init__(self, settings: Settings, *, client: Any,
                 sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.time,
                 recorder: Recorder | None = None) -> None:
        self.model = settings.llm_model
        self.name = f"openai:{settings.llm_model}"
        self.combined = settings.llm_mode == "combined"
        self.prompt_version = (COMBINED_PROMPT if self.combined
                               else f"{EXTRACT_PROMPT}+{DECIDE_PROMPT}")
        self.reflect_prompt_version = llm_reflect.REFLECT_PROMPT
        self.attempts = settings.llm_retries + 1
        self.policy = retry_policy(settings)
        self.timeout_s = settings.llm_timeout_s
        self._client = client
        self._sleep = sleep
        self._clock = clock
        self._format = "json_schema"  # the structured output the server accepts
        self.recorder = recorder  # recorded answers (memory.llm.recorded): replays offline

    # --- the protocol -------------------------------------------------------------------
    def extract(self, messages: Sequence[JobMessage],
                context: Sequence[JobMessage]) -> tuple[list[Candidate], Usage]:
        reply, usage = self._ask(EXTRACT_PROMPT, ExtractReply, _excerpt(messages, context))
        return [_candidate(f) for f in reply.facts], usage

    def extract_and_decide(
        self, messages: Sequence[JobMessage], context: Sequence[JobMessage],
        shown: list[tuple[int, Memory, float]], threshold: float,
    ) -> tuple[list[tuple[Candidate, Decision]], Usage]:
        user = f"Stored memories:\n{_listing(shown, threshold)}\n\n" + _excerpt(messages, context)

        def valid(r: CombinedReply) -> None:
            for c in r.changes:
                if c.op in ("UPDATE", "DELETE") and not 1 <= (c.target or 0) <= len(shown):
                    raise ValueError(f"{c.op} target {c.target} is not one of 1..{len(shown)}")
                if c.op in ("ADD", "UPDATE") and c.fact is None:
                    raise ValueError(f"{c.op} without a fact")

        reply, usage = self._ask(COMBINED_PROMPT, CombinedReply, user, valid)
        out = []
        for c in reply.changes:
            if c.op == "NOOP":
                continue
            cand = (_candidate(c.fact) if c.fact is not None
                    else Candidate("", new_fact=False))
            if c.op == "DELETE":
                cand = Candidate(cand.text, cand.type, cand.importance, new_fact=False)
            out.append((cand, Decision(OpKind(c.op.lower()), c.target, c.reason)))
        return out, usage

    def decide(self, candidate: Candidate, shown: list[tuple[int, Memory, float]],
               threshold: float) -> tuple[Decision, Usage]:
        kind = "retraction" if not candidate.new_fact else "new fact"
        user = (f"Stored memories:\n{_listing(shown, threshold)}\n\n"
                f"{kind.capitalize()}: {candidate.text}")

        def names_a_listed_memory(r: DecideReply) -> None:
            if r.op in ("UPDATE", "DELETE") and not 1 <= (r.target or 0) <= len(shown):
                raise ValueError(f"{r.op} target {r.target} is not one of 1..{len(shown)}")

        reply, usage = self._ask(DECIDE_PROMPT, DecideReply, user, names_a_listed_memory)
        return Decision(OpKind(reply.op.lower()), reply.target, reply.reason), usage

    def reflect(self, memories: list[tuple[int, Memory]]) -> tuple[list[Insight], Usage]:
        """Two calls: the salient questions, then insights citing the numbers shown (a reply
        citing any other number is invalid and retried). Nothing to reflect on: no call."""
        if not memories:
            return [], Usage()
        ask_questions, ask_insights = llm_reflect.prompt_names(self.reflect_prompt_version)
        asked, usage = self._ask(ask_questions, llm_reflect.QuestionsReply,
                                 llm_reflect.questions_input(memories))
        reply, more = self._ask(ask_insights, llm_reflect.InsightsReply,
                                llm_reflect.insights_input(asked.questions, memories),
                                llm_reflect.cites_only([n for n, _ in memories]))
        return llm_reflect.insights(reply), usage + more

    # --- one validated call with retries -------------------------------------------------
    def _ask(self, prompt_name: str, schema: type[T], user: str,
             check: Callable[[T], None] | None = None) -> tuple[T, Usage]:
        """One validated answer, retried per :attr:`policy` within the job's deadline;
        the tokens of invalid replies are counted too."""
        system = prompt(prompt_name).replace(
            "{schema}", json.dumps(schema.model_json_schema(), ensure_ascii=False))
        if self.recorder is None:
            return self._ask_live(prompt_name, schema, system, user, check)

        def live() -> tuple[str, Usage]:
            reply, used = self._ask_live(prompt_name, schema, system, user, check)
            return reply.model_dump_json(), used

        key = record_key(self.model, prompt_name, system, user, schema.__name__)
        text, used = self.recorder.answer(key, schema.__name__, live)
        try:  # a recorded answer passed these checks when it was recorded
            reply = schema.model_validate_json(text)
            if check is not None:
                check(reply)
        except (ValidationError, ValueError) as exc:
            raise LLMError(f"{prompt_name}: recorded answer invalid: {describe(exc)}") from exc
        return reply, used

    def _ask_live(self, prompt_name: str, schema: type[T], system: str, user: str,
                  check: Callable[[T], None] | None) -> tuple[T, Usage]:
        deadline = current_deadline()
        wasted = Usage()

        def attempt() -> tuple[T, Usage]:
            nonlocal wasted
            try:
                reply, used = self._call(system, user, schema, deadline)
                if check is not None:
                    try:
                        check(reply)
                    except ValueError as exc:
                        raise InvalidReply(str(exc), used) from exc
                return reply, used
            except InvalidReply as exc:
                wasted += exc.usage
                raise

        def logged(n: int, exc: BaseException, delay: float) -> None:
            log.warning("%s: attempt %d failed (%s: %s); retrying in %.1fs",
                        prompt_name, n, type(exc).__name__, describe(exc)[:200], delay)

        try:
            reply, used = retry_sync(attempt, policy=self.policy, deadline=deadline,
                                     clock=self._clock, sleep=self._sleep, on_retry=logged,
                                     max_attempts=self.attempts)
        except RetriesExhausted as exc:
            raise LLMError(f"{prompt_name}: no valid answer: {describe(exc)}") from exc
        except Exception as exc:  # permanent: translated at the boundary
            raise LLMError(f"{prompt_name}: {describe(exc)}") from exc
        return reply, wasted + used

    def _client_for(self, deadline: float | None) -> Any:
        """The client, with its timeout clipped to the time left before ``deadline``."""
        left = remaining(deadline, self._clock)
        if left is None or left >= self.timeout_s:
            return self._client
        return self._client.with_options(timeout=max(left, 0.01))

    def _call(self, system: str, user: str, schema: type[T],
              deadline: float | None) -> tuple[T, Usage]:
        """One request (its span: GenAI semantic conventions, docs/tracing.md)."""
        with tracing.llm_call(self.model, schema.__name__) as span:
            reply, used, model = self._request(system, user, schema, deadline)
            tracing.llm_usage(span, model, used.prompt_tokens, used.completion_tokens)
            if isinstance(reply, InvalidReply):
                raise reply
            return reply, used

    def _request(self, system: str, user: str, schema: type[T], deadline: float | None
                 ) -> tuple[T | InvalidReply, Usage, str | None]:
        """The reply (or the :class:`InvalidReply` to raise), its usage, the model that
        answered."""
        import openai

        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        resp: Any = None
        while resp is None:
            fmt = _response_format(self._format, schema)
            try:
                resp = self._client_for(deadline).chat.completions.create(
                    model=self.model, messages=messages, response_format=fmt, temperature=0)
            except (openai.BadRequestError, openai.InternalServerError) as exc:
                # A server without this kind of structured output says so (OpenAI: 400;
                # llama.cpp's server: 500 on json_schema): the next kind, remembered.
                # Any other 500 is transient (retried by the caller), as before.
                fallback = _FALLBACK.get(self._format)
                if fallback is None or not _about_format(exc, self._format):
                    raise
                log.info("%s: the server refused response_format %s (%s); using %s",
                         self.model, self._format, type(exc).__name__, fallback)
                self._format = fallback
        used = Usage(1, getattr(resp.usage, "prompt_tokens", 0) or 0,
                     getattr(resp.usage, "completion_tokens", 0) or 0)
        text = resp.choices[0].message.content or ""
        answered = getattr(resp, "model", None)
        try:
            return schema.model_validate_json(_strip_fences(text)), used, answered
        except ValidationError as exc:
            invalid = InvalidReply(f"invalid {schema.__name__}: {describe(exc)}", used)
            invalid.__cause__ = exc
            return invalid, used, answered


# json_schema (OpenAI, vLLM) -> json_object with the schema (llama.cpp's server turns it
# into a grammar) -> plain json_object (the prompt carries the schema; replies validated).
_FALLBACK = {"json_schema": "json_object+schema", "json_object+schema": "json_object"}


def _response_format(kind: str, schema: type[BaseModel]) -> dict[str, Any]:
    if kind == "json_schema":
        return {"type": "json_schema", "json_schema": {
            "name": schema.__name__, "schema": schema.model_json_schema()}}
    if kind == "json_object+schema":
        return {"type": "json_object", "schema": schema.model_json_schema()}
    return {"type": "json_object"}


def _about_format(exc: Exception, kind: str) -> bool:
    """Does the server's error name the structured output it was asked for?"""
    text = str(exc).lower()
    if kind == "json_schema":
        return "json_schema" in text or "response_format" in text
    return "schema" in text or "response_format" in text


def _line(m: JobMessage) -> str:
    return json.dumps({"role": m.role.value, "text": m.content}, ensure_ascii=False)


def _excerpt(messages: Sequence[JobMessage], context: Sequence[JobMessage]) -> str:
    return ("Earlier messages (context only, already processed):\n"
            + "\n".join(_line(m) for m in context)
            + "\n\nNew messages:\n"
            + "\n".join(_line(m) for m in messages if m.role != Role.SYSTEM))


def _listing(shown: list[tuple[int, Memory, float]], threshold: float) -> str:
    return "\n".join(
        f"{i}. {m.content}" + ("  [about the same thing]" if score >= threshold else "")
        for i, m, score in shown) or "(none)"


def _candidate(f: FactOut) -> Candidate:
    return Candidate(f.text, MemoryType(f.type), f.importance, f.expires_in_days, f.slot,
                     new_fact=not f.retraction)


def _strip_fences(text: str) -> str:
    text = text.strip()
    if text.startswith("```"):
        text = text.split("\n", 1)[1] if "\n" in text else ""
        text = text.rsplit("```", 1)[0]
    return text
