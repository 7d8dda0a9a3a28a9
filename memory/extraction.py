"""Turning one extraction job into applied memory ops (SPEC §4).

For each candidate fact: embed it, fetch the user's top-k live memories, let the model
decide, resolve to ops with deterministic ids, and apply them at once (so a later candidate
of the same job sees an earlier one's effect). Applying is idempotent: an op whose id
already left a record is skipped, so a replayed or re-sent job changes nothing twice.

The model is one protocol (:class:`MemoryModel`) with a rules implementation here and an
OpenAI-compatible one in :mod:`memory.llm.openai_model`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Protocol, runtime_checkable

from memstream.core.retry import deadline_scope
from memstream.memory import governance, rules, toolwrite
from memstream.memory.decisions import (
    Candidate,
    Context,
    Decision,
    IdMap,
    PlannedOp,
    opens_version,
    resolve,
    restamped,
)
from memstream.memory.embedding import Embedder, cosine
from memstream.memory.model import Memory, MemoryType, OpKind
from memstream.memory.outcome import Insight, JobOutcome, Usage
from memstream.memory.store import MemoryStore, Scope
from memstream.memory.trigger_rules import is_trivial
from memstream.topics.schemas import ExtractionJob, JobMessage, Role, ToolWrite

__all__ = ["CombinedModel", "Extractor", "Insight", "JobOutcome", "MemoryModel", "RulesModel",
           "Usage", "WindowedJobs"]


class MemoryModel(Protocol):
    name: str
    prompt_version: str

    def extract(self, messages: Sequence[JobMessage],
                context: Sequence[JobMessage]) -> tuple[list[Candidate], Usage]: ...

    def decide(self, candidate: Candidate, shown: list[tuple[int, Memory, float]],
               threshold: float) -> tuple[Decision, Usage]: ...

    def reflect(self, memories: list[tuple[int, Memory]]) -> tuple[list[Insight], Usage]:
        """Insights over the user's recent memories, numbered 1..n by the caller."""
        ...


@runtime_checkable
class CombinedModel(Protocol):
    """A model that extracts and decides a whole job in one call."""

    combined: bool

    def extract_and_decide(
        self, messages: Sequence[JobMessage], context: Sequence[JobMessage],
        shown: list[tuple[int, Memory, float]], threshold: float,
    ) -> tuple[list[tuple[Candidate, Decision]], Usage]: ...


class RulesModel:
    """The offline default: :mod:`memory.rules` over the user's messages; no LLM call."""

    name = "rules"
    prompt_version = "rules-1"

    def extract(self, messages: Sequence[JobMessage],
                context: Sequence[JobMessage]) -> tuple[list[Candidate], Usage]:
        found: list[Candidate] = []
        # the user's earlier words resolve "now I go on Thursdays" to the activity named last
        said = [m.content for m in context if m.role == Role.USER]
        for m in messages:
            if m.role == Role.USER:
                found += [replace(c, said_at=m.ts.timestamp(), said_by=m.message_id)
                          for c in rules.extract_text(m.content, said[-6:])]
                said.append(m.content)
        return found, Usage()

    def decide(self, candidate: Candidate, shown: list[tuple[int, Memory, float]],
               threshold: float) -> tuple[Decision, Usage]:
        return rules.decide(candidate, shown, threshold), Usage()

    def reflect(self, memories: list[tuple[int, Memory]]) -> tuple[list[Insight], Usage]:
        """No inference without a model: the offline reflection is a deterministic profile
        summary built by the reflection job, not an insight made up here."""
        return [], Usage()


def not_core(c: Candidate) -> Candidate:
    """A candidate from the conversation never lands in core memory: a ``core:`` slot is
    written by an agent's ``core_memory_replace`` only (chat text is data: "store this with
    slot core:instructions" must not reach the top of every prompt)."""
    if c.slot and c.slot.startswith(toolwrite.CORE_PREFIX):
        return replace(c, slot=None)
    return c


def all_trivial(job: ExtractionJob) -> bool:
    return all(m.role != Role.USER or is_trivial(m.content) for m in job.messages)


class _Overlay:
    """The store as it will be once this job's earlier ops are applied."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store
        self.pending: dict[str, tuple[Memory, list[float]]] = {}  # memory_id -> live version
        self.gone: set[str] = set()  # memory ids this job closed
        self.wrote: dict[str, int] = {}  # memory id -> the op (index) that wrote its live version

    def search(self, scope: Scope, vector: list[float], k: int) -> list[tuple[Memory, float]]:
        touched = self.gone | set(self.pending)
        hits = [(m, s) for m, s in self.store.search(scope, vector, k + len(touched),
                                                     exclude_slots=toolwrite.CORE_SLOTS)
                if m.memory_id not in touched]
        hits += [(m, cosine(v, vector)) for m, v in self.pending.values()]
        return sorted(hits, key=lambda h: -h[1])[:k]

    def add(self, out: JobOutcome, op: PlannedOp, vector: list[float]) -> None:
        """``op`` appended to the job's ops and seen by the candidates after it. A restatement
        of a version this job wrote is folded into the op that wrote it (one record per
        version and job: a later write of the job never overwrites an earlier one)."""
        at = self.wrote.get(op.memory_id)
        if op.kind == OpKind.RESTATE and at is not None:
            earlier, kept = out.ops[at]
            op = restamped(earlier, op.after.extra["restated_ts"])
            out.ops[at] = (op, kept)
            self.record(op, kept or vector)
            return
        if op.kind == OpKind.DELETE:
            self.wrote.pop(op.memory_id, None)
        elif op.after.live:
            self.wrote[op.memory_id] = len(out.ops)
        self.record(op, vector)
        out.ops.append((op, vector if opens_version(op) else None))

    def record(self, op: PlannedOp, vector: list[float]) -> None:
        if not op.after.live and op.kind == OpKind.ADD:
            return  # a late fact kept as history (event time): never a live memory
        if op.kind == OpKind.DELETE:
            self.gone.add(op.memory_id)
            self.pending.pop(op.memory_id, None)
        else:
            self.gone.discard(op.memory_id)
            self.pending[op.memory_id] = (op.after, vector)


def _when(m: JobMessage) -> tuple[datetime, int]:
    return m.ts, m.seq


class WindowedJobs(Protocol):
    """The windowed jobs' work (:class:`memstream.jobs.work.WindowedWork`): a ``reflect`` /
    ``consolidate`` / ``decay`` command decided into ops over the user's live memories."""

    def decide(self, ex: Extractor, job: ExtractionJob, write: ToolWrite, now: float,
               out: JobOutcome) -> JobOutcome: ...


@dataclass(frozen=True)
class Extractor:
    """Decides one job against the store; applying is :func:`memory.applying.apply_change`."""

    model: MemoryModel
    embedder: Embedder
    store: MemoryStore
    top_k: int = 5
    windowed: WindowedJobs | None = None  # None: this process decides no windowed job

    def decide(self, job: ExtractionJob, now: float, deadline: float | None = None) -> JobOutcome:
        """The job's ops. ``deadline`` (an absolute time on the model's clock, None: none)
        bounds every model call and its retries: it reaches the model through
        :func:`memstream.core.retry.deadline_scope`, so the model protocol stays as it is."""
        with deadline_scope(deadline):
            return self._decide(job, now)

    def _decide(self, job: ExtractionJob, now: float) -> JobOutcome:
        out = JobOutcome(seq=job.seq)
        if job.tool is not None:
            return self._decide_tool(job, job.tool, now, out)
        if all_trivial(job):
            out.trivial = True
            return out
        scope = Scope(job.tenant_id, job.user_id)
        # in event-time order (producers can deliver a session out of order): within a job
        # the newer statement comes last and wins; across jobs resolve() compares times
        job = job.model_copy(update={"messages": sorted(job.messages, key=_when)})
        ctx = Context(job.tenant_id, job.user_id, job.session_id, job.from_seq, job.to_seq,
                      job.job_id, now, tuple(m.message_id for m in job.messages), job.seq,
                      event_ts=max((m.ts.timestamp() for m in job.messages), default=None))
        if isinstance(self.model, CombinedModel) and self.model.combined:
            return self._decide_combined(self.model, job, scope, ctx, out)
        candidates, usage = self.model.extract(job.messages, job.context)
        candidates = [not_core(c) for c in candidates]
        out.usage += usage
        return self._decide_each(candidates, scope, ctx, out)

    def _decide_each(self, candidates: Sequence[Candidate], scope: Scope, ctx: Context,
                     out: JobOutcome) -> JobOutcome:
        """Each candidate decided against the user's nearest memories (core blocks are
        written by core_memory_replace only, never decided against), seeing the ops of the
        candidates before it."""
        view = _Overlay(self.store)
        vectors = self.embedder.embed([c.text for c in candidates])
        for index, (cand, vector) in enumerate(zip(candidates, vectors, strict=True)):
            hits = view.search(scope, vector, self.top_k)
            out.saw([(m, s) for m, s in hits if m.memory_id not in view.pending])
            shown, numbered = IdMap.number(hits)
            decision, usage = self.model.decide(cand, numbered, self.embedder.same_threshold)
            if decision.text is not None and decision.text != cand.text:
                vector = self.embedder.embed([decision.text])[0]  # what is written
            out.usage += usage
            out.decisions[decision.op.value] += 1
            for op in resolve(cand, index, shown, decision, ctx):
                view.add(out, op, vector)
        return out

    def _decide_tool(self, job: ExtractionJob, write: ToolWrite, now: float,
                     out: JobOutcome) -> JobOutcome:
        """An agent's tool write (see :mod:`memory.toolwrite`), or a windowed job's command
        (:class:`WindowedJobs`), or a correction (:mod:`memory.governance`): no extraction
        step."""
        if write.name in toolwrite.LINEAGE:
            if self.windowed is None:
                out.error = f"{write.name}: this process decides no windowed job"
                return out
            return self.windowed.decide(self, job, write, now, out)
        if write.name in toolwrite.CORRECTIONS:
            return governance.decide_correction(self.store, self.embedder, job, write, now, out)
        if write.name == "core_memory_replace":
            ops, out.read, out.error = toolwrite.core_ops(self.store, job, write, now)
            vectors = self.embedder.embed([op.after.content for op in ops])
            out.ops = list(zip(ops, vectors, strict=True))
            out.decisions["update" if any(op.before for op in ops) else
                          "add" if ops else "noop"] += 1
            return out
        cand = Candidate(write.content, MemoryType(write.memory_type), write.importance)
        return self._decide_each([cand], Scope(job.tenant_id, job.user_id),
                                 toolwrite.tool_context(job, now), out)

    def _decide_combined(self, model: CombinedModel, job: ExtractionJob, scope: Scope,
                         ctx: Context, out: JobOutcome) -> JobOutcome:
        """One call: the model sees the memories nearest to any user message of the job."""
        texts = [m.content for m in job.messages if m.role == Role.USER]
        nearest: dict[str, tuple[Memory, float]] = {}
        for vector in self.embedder.embed(texts):
            for m, score in self.store.search(scope, vector, self.top_k,
                                              exclude_slots=toolwrite.CORE_SLOTS):
                if m.memory_id not in nearest or nearest[m.memory_id][1] < score:
                    nearest[m.memory_id] = (m, score)
        hits = sorted(nearest.values(), key=lambda h: -h[1])[: 2 * self.top_k]
        out.saw(hits)
        shown, numbered = IdMap.number(hits)
        pairs, usage = model.extract_and_decide(job.messages, job.context, numbered,
                                                self.embedder.same_threshold)
        out.usage += usage
        vectors = iter(self.embedder.embed([c.text for c, _ in pairs if c.text]))
        by_target: dict[str, int] = {}  # a memory changed twice: the last change wins
        for index, (raw, decision) in enumerate(pairs):
            cand = not_core(raw)
            vec = next(vectors) if cand.text else None
            out.decisions[decision.op.value] += 1
            for op in resolve(cand, index, shown, decision, ctx):
                entry = (op, vec if opens_version(op) else None)
                if op.kind == OpKind.RESTATE and op.memory_id in by_target:
                    continue  # never in place of a change of the memory
                if op.before is not None and op.memory_id in by_target:
                    out.ops[by_target[op.memory_id]] = entry
                    continue
                if op.before is not None:
                    by_target[op.memory_id] = len(out.ops)
                out.ops.append(entry)
        return out
