"""A stand-in extractor that closes the coalescing loop without extracting anything.

The ingest benchmark runs the worker with ``extract_enabled=False`` and uses this to answer
every job with a ``done`` result after ``latency`` seconds, so that it measures the ingest
stage alone, and to count what the ingest stage produced. Never used by the worker.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

from memstream.core.kafka_io import TopicReader, start_producer
from memstream.core.settings import Settings
from memstream.topics.registry import registry
from memstream.topics.schemas import ExtractionJob, JobResult, JobStatus


@dataclass
class AckExtractor:
    settings: Settings
    latency: float = 0.0
    jobs: list[tuple[ExtractionJob, float]] = field(default_factory=list)  # job, broker ts
    trivial: list[JobResult] = field(default_factory=list)
    covered: int = 0  # messages inside completed (done or trivial) jobs
    done_at: float = 0.0

    async def run(self, expected: int, timeout: float) -> None:
        """Answer jobs until ``expected`` messages are covered (or ``timeout``)."""
        topics = registry(self.settings)
        b = self.settings
        jobs = await TopicReader(b, topics.jobs.name).start()
        results = await TopicReader(b, topics.job_results.name).start()
        producer = await start_producer(b)
        deadline = time.monotonic() + timeout
        try:
            while self.covered < expected and time.monotonic() < deadline:
                for r in await jobs.poll(0.05):
                    job = ExtractionJob.model_validate_json(r.value)
                    self.jobs.append((job, r.timestamp / 1000))
                    if self.latency:
                        await asyncio.sleep(self.latency)
                    self.covered += job.to_seq - job.from_seq
                    res = JobResult.for_job(job, JobStatus.DONE, datetime.now(UTC))
                    await producer.send(topics.job_results.name, res.dumps(), key=r.key)
                for r in await results.poll(0.01):
                    res = JobResult.model_validate_json(r.value)
                    if res.status == JobStatus.TRIVIAL:
                        self.trivial.append(res)
                        self.covered += res.to_seq - res.from_seq
                jobs.records.clear()
                results.records.clear()
            self.done_at = time.time()
        finally:
            await producer.stop()
            await jobs.stop()
            await results.stop()
