"""The work of the windowed jobs (SPEC §6), decided like any job of the user.

A ``reflect`` / ``consolidate`` / ``decay`` command (:mod:`jobs.triggers`) reaches the
extract stage as a job of its own kind; :class:`WindowedWork` (the extractor's
:class:`~memstream.memory.extraction.WindowedJobs`) turns it into a
:class:`~memstream.memory.extraction.JobOutcome` over the user's live memories, with the
versions it read, so the apply stage fences it like an extraction job: a memory that moved
on since refuses the whole decision and the job runs again. The plans are pure
(:mod:`jobs.decay`, :mod:`jobs.consolidation`, :mod:`jobs.reflection`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from memstream.core.settings import Settings
from memstream.jobs.consolidation import plan_consolidation
from memstream.jobs.decay import DecayPolicy, plan_decay
from memstream.jobs.reflection import plan_reflection
from memstream.memory import retrieval, toolwrite
from memstream.memory.decisions import Candidate, Decision
from memstream.memory.extraction import Extractor, JobOutcome
from memstream.memory.model import Memory
from memstream.memory.plan import Plan
from memstream.memory.store import Scope
from memstream.topics.schemas import ExtractionJob, ToolWrite

MAX_LIVE = 10_000


@dataclass(frozen=True)
class JobSettings:
    decay: DecayPolicy = field(default_factory=DecayPolicy)
    reflection_recent: int = 100

    @classmethod
    def from_settings(cls, settings: Settings) -> JobSettings:
        """What the windowed jobs' work needs from the settings (SPEC §6)."""
        return cls(decay=DecayPolicy(downweight_days=settings.decay_downweight_days,
                                     archive_days=settings.decay_archive_days,
                                     slow_factor=settings.decay_slow_factor,
                                     weight=settings.decay_weight),
                   reflection_recent=settings.reflection_recent)


def live_memories(ex: Extractor, job: ExtractionJob) -> list[Memory]:
    found = ex.store.list(Scope(job.tenant_id, job.user_id), limit=MAX_LIVE)
    return [m for m in found if not (m.slot or "").startswith(toolwrite.CORE_PREFIX)]


@dataclass(frozen=True)
class WindowedWork:
    """The extractor's windowed jobs: one plan per command, embedded and fenced."""

    jobs: JobSettings = field(default_factory=JobSettings)

    def decide(self, ex: Extractor, job: ExtractionJob, write: ToolWrite, now: float,
               out: JobOutcome) -> JobOutcome:
        return decide_job(ex, job, write, now, out, self.jobs)


def decide_job(ex: Extractor, job: ExtractionJob, write: ToolWrite, now: float,
               out: JobOutcome, jobs: JobSettings | None = None) -> JobOutcome:
    """The ops of one windowed job, with the versions they read."""
    jobs = jobs or JobSettings()
    live = live_memories(ex, job)
    ctx = toolwrite.tool_context(job, now)
    plan: Plan
    if write.name == "decay":
        joined = retrieval.join_stats(ex.store, job.tenant_id, job.user_id, live)
        plan = plan_decay(joined, now, jobs.decay, ctx)
    elif write.name == "consolidate":
        vectors = ex.embedder.embed([m.content for m in live]) if live else []

        def decide(c: Candidate, shown: list[tuple[int, Memory, float]],
                   threshold: float) -> Decision:
            decision, usage = ex.model.decide(c, shown, threshold)
            out.usage += usage
            return decision

        plan = plan_consolidation(live, vectors, ex.embedder.same_threshold, decide, now, ctx)
    else:
        plan, usage = plan_reflection(live, jobs.reflection_recent,
                                      getattr(ex.model, "reflect", None), now, ctx)
        out.usage += usage
    return plan.into(out, ex.embedder)
