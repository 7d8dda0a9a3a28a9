"""``memstream replay``: re-extraction from the messages topic into a new store (SPEC §9).

Reads the messages and session-events topics up to their ends at start (read_committed;
records that do not decode are counted and skipped, as the live stage dead-letters them;
messages of a user written before their forget-me marker are skipped too), forms the jobs
with the live trigger machine (:mod:`memory.reextraction`), and decides each job with the
configured model (``MEMSTREAM_LLM``, ``_LLM_MODEL``, ``_LLM_MODE``; rules by default)
through the live :class:`~memory.extraction.Extractor`, applying it through the live
fenced path (:func:`memory.applying.apply_decision`) into a new store: an Edge path or a
server collection, never the live one. Time comes from the messages, so two runs with the
same answers give identical stores; recorded answers (:mod:`memory.llm.recorded`) make that
hold offline. No change events are published: the new store is for comparison or a
switch-over (``memstream rebuild``'s checksum compares stores).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memstream.core.errors import ConfigError, InvalidRecord, MemstreamError
from memstream.core.settings import Settings
from memstream.core.topic_reader import end_offsets, read_range
from memstream.memory import fencing
from memstream.memory import reextraction as pure
from memstream.memory.applying import apply_decision, build_decision
from memstream.memory.archive import archive_changes
from memstream.memory.decisions import Candidate
from memstream.memory.extraction import Extractor, Insight, MemoryModel, Usage
from memstream.memory.llm.recorded import Mode as RecordMode
from memstream.memory.llm.recorded import Recorder
from memstream.memory.model import Memory
from memstream.memory.services import build_embedder, build_model
from memstream.memory.store import MemoryStore, Scope
from memstream.sealing.key_records import FORGOTTEN, Keyring, parse_key
from memstream.sealing.key_view import KeyView
from memstream.topics.codec import check_message, decode
from memstream.topics.registry import registry
from memstream.topics.schemas import ChatMessage, ExtractionJob, JobMessage, JobStatus, SessionEvent

READ_TIMEOUT_S = 120.0
STOPPED_EXIT = 3  # the CLI's exit code when --max-calls stopped the run


@dataclass
class Options:
    filters: pure.Filters = field(default_factory=pure.Filters)
    into: Path | None = None  # an Edge store path
    collection: str | None = None  # a server collection (store=server)
    dry_run: bool = False
    max_calls: int | None = None
    recording: Path | None = None
    recording_mode: RecordMode = "record"
    resume: bool = False  # the target may hold an earlier run of the same replay


@dataclass
class Report:
    plan: pure.Plan
    estimate: pure.Estimate
    mode: pure.Mode
    model: str
    invalid: int = 0  # records that do not decode (the live stage dead-letters them)
    forgotten: int = 0  # messages written before their user's forget-me
    done: int = 0  # jobs decided and applied now
    resumed: int = 0  # jobs the target store already held (--resume)
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ops: Counter[str] = field(default_factory=Counter)
    stopped: str | None = None  # why the run stopped before its last job
    failed: bool = False  # stopped by an error (not by the budget)
    dry_run: bool = False
    stopped_at: ExtractionJob | None = None
    seconds: float = 0.0
    recorder: dict[str, int] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """One JSON-ready line: what the run did (the last line the CLI prints)."""
        e, p = self.estimate, self.plan
        at = self.stopped_at
        return {
            "dry_run": self.dry_run,
            "model": self.model, "llm_mode": self.mode, "messages": p.messages,
            "session_ends": p.session_ends, "invalid": self.invalid,
            "forgotten": self.forgotten, "users": p.users, "jobs": len(p.jobs),
            "jobs_by_reason": p.by_reason(), "trivial": p.trivial,
            "estimate": {"calls": e.calls, "calls_max": e.calls_max, "exact": e.exact,
                         "prompt_tokens": e.prompt_tokens,
                         "completion_tokens": e.completion_tokens},
            "done": self.done, "resumed": self.resumed, "calls": self.calls,
            "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
            "ops": dict(sorted(self.ops.items())), "stopped": self.stopped,
            "failed": self.failed,
            "stopped_at": None if at is None else {
                "job_id": at.job_id, "tenant_id": at.tenant_id, "user_id": at.user_id,
                "session_id": at.session_id, "from_seq": at.from_seq, "to_seq": at.to_seq,
                "created_at": at.created_at.isoformat()},
            "seconds": round(self.seconds, 3),
            "jobs_per_s": round(self.done / self.seconds, 1) if self.seconds else None,
            "recording": self.recorder,
        }


# --- reading the topics ------------------------------------------------------------------

async def _read(settings: Settings, topic: str) -> list[tuple[bytes | None, bytes | None]]:
    """Every committed record of ``topic`` up to its end at start, per partition in order."""
    out: list[tuple[bytes | None, bytes | None]] = []
    ends = await end_offsets(settings, [topic])
    await read_range(settings, topic, ends[topic],
                     lambda rs: out.extend((r.key, r.value) for r in rs),
                     idle_timeout_s=READ_TIMEOUT_S)
    return out


def _forgotten(settings: Settings, records: Sequence[tuple[bytes | None, bytes | None]],
               topic: str) -> dict[tuple[str, str], float]:
    """Forget-me markers that verify (``tenant/user/!forgotten`` on the user-keys topic,
    read through the same view a worker keeps: a forged or malformed one is set aside).
    Without a master key there are no markers: forget-me writes them with the user keys."""
    ring = Keyring.of(settings)
    if not ring.master:
        return {}
    view = KeyView(ring, topic)
    for key, value in records:
        view.take(key, value)
    view.settle()
    out = {}
    for key, _ in records:
        try:
            tenant, user, name = parse_key(key)
        except InvalidRecord:
            continue
        at = view.forgotten_at(tenant, user) if name == FORGOTTEN else None
        if at is not None:
            out[(tenant, user)] = at
    return out


async def load(settings: Settings, filters: pure.Filters,
               ) -> tuple[list[ChatMessage], list[SessionEvent], int, int]:
    """Messages and session ends that pass the filters; (…, invalid, forgotten)."""
    topics = registry(settings)
    b = settings
    # a task group, not gather: when one read fails (no broker, a refused login) the others
    # are cancelled and waited for, so each stops its consumer (gather left them running
    # into asyncio.run's shutdown, and a consumer could be collected unclosed)
    try:
        async with asyncio.TaskGroup() as reads:
            msgs = reads.create_task(_read(b, topics.messages.name))
            session_ends = reads.create_task(_read(b, topics.session_events.name))
            keys = reads.create_task(_read(b, topics.user_keys.name))
    except BaseExceptionGroup as failed:  # the first failure, as the CLI reports one
        raise failed.exceptions[0] from None
    raw_msgs, raw_ends, raw_keys = msgs.result(), session_ends.result(), keys.result()
    forgotten_at = _forgotten(settings, raw_keys, topics.user_keys.name)
    invalid = forgotten = 0
    messages: list[ChatMessage] = []
    ends: list[SessionEvent] = []
    for key, value in raw_msgs:
        try:
            m = decode(ChatMessage, value, key, max_bytes=settings.max_message_bytes)
            check_message(m, settings.max_content_chars)
        except InvalidRecord:
            invalid += 1
            continue
        if filters.keeps(m):
            at = forgotten_at.get((m.tenant_id, m.user_id))
            if at is not None and m.ts.timestamp() <= at:
                forgotten += 1
            else:
                messages.append(m)
    for key, value in raw_ends:
        try:
            e = decode(SessionEvent, value, key, max_bytes=settings.max_message_bytes)
        except InvalidRecord:
            invalid += 1
            continue
        if filters.keeps(e):
            ends.append(e)
    return messages, ends, invalid, forgotten


# --- the target store and the model -------------------------------------------------------

def open_target(settings: Settings, options: Options, dim: int) -> MemoryStore:
    """The new store; refuses the live store, and a non-empty one without ``--resume``."""
    if (options.into is None) == (options.collection is None):
        raise ConfigError("give exactly one target: --into PATH or --collection NAME")
    if options.into is not None:
        from memstream.memory.store.edge import EdgeStore
        from memstream.memory.store.switch import current_store_path

        path = options.into.resolve()
        for live in {(settings.data_dir / "qdrant").resolve(),
                     current_store_path(settings).resolve()}:  # the worker's, after a switch
            if path == live or live in path.parents or path in live.parents:
                raise ConfigError(f"{options.into} is (or holds) the live store {live}: "
                                  "replay writes into a new store only")
        if path.exists() and any(path.iterdir()) and not options.resume:
            raise ConfigError(f"{options.into} is not empty (use --resume to continue an "
                              "earlier replay with the same options)")
        return EdgeStore(path, dim)
    from memstream.memory.store.server import ServerStore

    if settings.store != "server" or not settings.qdrant_url:
        raise ConfigError("--collection needs MEMSTREAM_STORE=server and MEMSTREAM_QDRANT_URL")
    if options.collection == settings.qdrant_collection:
        raise ConfigError(f"{options.collection} is the live collection: replay writes "
                          "into a new collection only")
    key = settings.qdrant_api_key.get_secret_value() if settings.qdrant_api_key else None
    from qdrant_client import QdrantClient

    client = QdrantClient(url=settings.qdrant_url, api_key=key)
    name = options.collection
    assert name is not None
    if client.collection_exists(name) and not options.resume:
        raise ConfigError(f"collection {name} exists (use --resume to continue an earlier "
                          "replay with the same options)")
    return ServerStore(name, dim, client=client)


def model_mode(settings: Settings) -> pure.Mode:
    return "rules" if settings.llm == "rules" else settings.llm_mode


class _Metered:
    """two_step under a budget: right after the extract call, the decides (one per
    candidate) must fit, or the job stops before any decide (nothing of it applied)."""

    def __init__(self, inner: MemoryModel, budget: pure.Budget) -> None:
        self.inner, self.budget = inner, budget
        self.name, self.prompt_version = inner.name, inner.prompt_version

    def extract(self, messages: Sequence[JobMessage],
                context: Sequence[JobMessage]) -> tuple[list[Candidate], Usage]:
        found, usage = self.inner.extract(messages, context)
        if not self.budget.fits(usage.calls + len(found)):
            self.budget.spend(usage.calls)  # spent on the extract; nothing applied
            raise pure.OverBudget(f"{len(found)} decide call(s) after the extract do not "
                                  f"fit ({self.budget.spent} of {self.budget.max_calls} spent)")
        return found, usage

    def decide(self, candidate: Candidate, shown: list[tuple[int, Memory, float]],
               threshold: float) -> Any:
        return self.inner.decide(candidate, shown, threshold)

    def reflect(self, memories: list[tuple[int, Memory]]) -> tuple[list[Insight], Usage]:
        return self.inner.reflect(memories)


# --- running -----------------------------------------------------------------------------

def run(settings: Settings, options: Options, echo: Callable[[str], None] = print) -> Report:
    """Plan, and unless ``dry_run``, run the replay; the report says what happened."""
    messages, ends, invalid, forgotten = asyncio.run(load(settings, options.filters))
    from memstream.streams.pipeline import policy_from  # the live stage's knobs

    plan = pure.plan(pure.by_user(messages, ends), policy_from(settings))
    mode = model_mode(settings)
    est, costs = pure.estimate(plan.jobs, mode, settings.top_k_similar)
    recorder = (Recorder(options.recording, options.recording_mode)
                if options.recording is not None and mode != "rules" and not options.dry_run
                else None)
    model = build_model(settings, recorder)
    report = Report(plan, est, mode, model.name, invalid, forgotten, dry_run=options.dry_run)
    _print_plan(report, options, costs, echo)
    if options.recording is not None and mode == "rules":
        echo("the rules model calls no LLM: nothing to record or replay")
    if options.dry_run:
        return report
    embedder = build_embedder(settings)
    if settings.similarity_threshold is not None:
        embedder.same_threshold = settings.similarity_threshold
    store = open_target(settings, options, embedder.dim)
    embedder.embed(["warm-up"])  # the model loads now, not inside the measured run
    budget = pure.Budget(options.max_calls)
    decider: MemoryModel = _Metered(model, budget) if mode == "two_step" else model
    extractor = Extractor(decider, embedder, store, top_k=settings.top_k_similar)
    started = time.perf_counter()
    try:
        run_jobs(plan.jobs, extractor, model, store, budget, mode, report, echo,
                 settings.archive)
    finally:
        report.seconds = time.perf_counter() - started
        report.recorder = {} if recorder is None else dict(vars(recorder.stats))
        store.close()
    return report


def run_jobs(jobs: Sequence[ExtractionJob], extractor: Extractor, model: MemoryModel,
              store: MemoryStore, budget: pure.Budget, mode: pure.Mode, report: Report,
              echo: Callable[[str], None], archive: bool = True) -> None:
    """Decide and apply each job (``archive``: with its turns for the episodic archive,
    as the extract stage does)."""
    for n, job in enumerate(jobs):
        cursor = store.cursor(Scope(job.tenant_id, job.user_id))
        if fencing.decide_or_skip(cursor, job.seq, job.job_id) != fencing.Verdict.APPLY:
            report.resumed += 1
            continue
        now = job.created_at.timestamp()  # the messages' time, never the wall clock
        try:
            budget.check(pure.start_calls(job, mode), f"job {n + 1}")
            out = extractor.decide(job, now)
        except pure.OverBudget as exc:
            report.calls = budget.spent
            report.stopped, report.stopped_at = f"budget: {exc}", job
            return
        except MemstreamError as exc:  # an LLM error, a recording miss: nothing applied
            report.stopped, report.stopped_at, report.failed = f"error: {exc}", job, True
            return
        budget.spend(out.usage.calls)
        # a run killed mid-apply left a decision half-applied that no topic hands over again,
        # and a replay publishes nothing: the job's new decision builds on what it left
        turns = archive_changes(job, extractor.embedder.embed, extractor.embedder.name, now) \
            if archive else []
        decision = build_decision(job, out, model, now, turns).model_copy(
            update={"read_pending": []})
        applied = apply_decision(store, decision)
        if applied.status not in (JobStatus.DONE, JobStatus.TRIVIAL):
            raise RuntimeError(f"job {job.job_id} not applied: {applied.error}")
        report.done += 1
        report.calls = budget.spent
        report.prompt_tokens += out.usage.prompt_tokens
        report.completion_tokens += out.usage.completion_tokens
        report.ops.update(c.op for c in applied.publish)
        if (n + 1) % 100 == 0:
            echo(f"  {n + 1}/{len(jobs)} jobs, {budget.spent} calls")


def _print_plan(r: Report, options: Options, costs: Sequence[pure.JobCost],
                echo: Callable[[str], None]) -> None:
    p, e = r.plan, r.estimate
    reasons = ", ".join(f"{k} {v}" for k, v in p.by_reason().items()) or "-"
    echo(f"messages: {p.messages} of {p.users} user(s), {p.session_ends} session end(s); "
         f"skipped: {r.invalid} invalid, {r.forgotten} forgotten, {p.duplicates} duplicate")
    echo(f"jobs: {len(p.jobs)} ({reasons}); resolved without a call (trivial): {p.trivial}")
    echo(f"model: {r.model}, mode {r.mode}")
    echo(e.line())
    echo(f"tokens (estimate: ~4 characters per token, 1 per CJK character): prompt "
         f"~{e.prompt_tokens}, completion ~{e.completion_tokens}")
    if options.max_calls is not None:
        fit = pure.jobs_within([c.calls for c in costs], options.max_calls)
        echo(f"--max-calls {options.max_calls}: about {fit} of {len(p.jobs)} jobs fit")
