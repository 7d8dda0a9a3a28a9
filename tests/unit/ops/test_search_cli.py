"""`memstream search` against the embedded store (no worker running)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from click.testing import CliRunner

from memstream.cli import main
from memstream.core.settings import Settings
from memstream.memory.apply import apply_change, change_for
from memstream.memory.services import build_services
from memstream.topics.schemas import ExtractionJob, JobMessage, TriggerReason

pytestmark = pytest.mark.unit


def test_search_reads_only_that_users_memories(tmp_path, monkeypatch):
    env = {"MEMSTREAM_DATA_DIR": str(tmp_path), "MEMSTREAM_EMBEDDER": "hashing"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    services = build_services(Settings())
    for user, text in [("ann", "I live in Lisbon"), ("bob", "I live in Porto")]:
        job = ExtractionJob(
            job_id=f"j-{user}", tenant_id="acme", user_id=user, session_id="s", from_seq=0,
            to_seq=1, reason=TriggerReason.EXPLICIT, created_at=datetime(2026, 1, 1, tzinfo=UTC),
            messages=[JobMessage(seq=0, message_id="m", role="user", content=text,
                                 ts=datetime(2026, 1, 1, tzinfo=UTC))])
        out = services.extractor.decide(job, 1.0)
        for op, vec in out.ops:
            apply_change(services.store, change_for(op, vec, job, out, services.model, 1.0))
    services.close()
    result = CliRunner().invoke(main, ["search", "--tenant", "acme", "--user", "ann", "city"])
    assert result.exit_code == 0, result.output
    body = json.loads(result.output)
    assert [m["content"] for m in body["memories"]] == ["Lives in Lisbon"]
    assert body["memories"][0]["score"] is not None and body["memories"][0]["created_at"]
