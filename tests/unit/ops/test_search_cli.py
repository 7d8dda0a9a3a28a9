"""`memstream search` against the embedded store (no worker running)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from click.testing import CliRunner

from memstream.cli import main
from memstream.core.settings import Settings
from memstream.memory.applying import apply_change, change_for
from memstream.memory.extraction import Extractor
from memstream.memory.services import build_embedder, build_model, build_store
from memstream.topics.schemas import ExtractionJob, JobMessage, TriggerReason

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("partitioned", [True, False], ids=["shards", "single-store"])
def test_search_reads_only_that_users_memories(tmp_path, monkeypatch, partitioned):
    env = {"MEMSTREAM_DATA_DIR": str(tmp_path), "MEMSTREAM_EMBEDDER": "hashing",
           "MEMSTREAM_STORE_PARTITIONED": str(partitioned).lower()}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    settings = Settings()
    embedder, model = build_embedder(settings), build_model(settings)
    store = build_store(settings, embedder.dim, offline=True)  # a stopped worker's store
    extractor = Extractor(model, embedder, store)
    for user, text in [("ann", "I live in Lisbon"), ("bob", "I live in Porto")]:
        job = ExtractionJob(
            job_id=f"j-{user}", tenant_id="acme", user_id=user, session_id="s", from_seq=0,
            to_seq=1, reason=TriggerReason.EXPLICIT, created_at=datetime(2026, 1, 1, tzinfo=UTC),
            messages=[JobMessage(seq=0, message_id="m", role="user", content=text,
                                 ts=datetime(2026, 1, 1, tzinfo=UTC))])
        out = extractor.decide(job, 1.0)
        for op, vec in out.ops:
            apply_change(store, change_for(op, vec, job, out, model, 1.0))
    store.close()
    result = CliRunner().invoke(main, ["search", "--tenant", "acme", "--user", "ann", "city"])
    assert result.exit_code == 0, result.output
    body = json.loads(result.output)
    assert [m["content"] for m in body["memories"]] == ["Lives in Lisbon"]
    assert body["memories"][0]["score"] is not None and body["memories"][0]["created_at"]
