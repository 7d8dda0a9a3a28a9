"""No memory content outside sealed records: a canary sent through every failing path.

One worker with the OpenAI path against a stand-in model that answers with invalid JSON
and with invalid candidates (a fact over the length limit), each quoting the user's text;
an oversized message; tool calls whose arguments fail; an API body that fails validation.
Every such text carries a canary. After the failures are reported (job results FAILED, the
dead letter, the tool errors), the canary must be in no line of the worker's log and in no
record of any topic memstream writes, but for the topics whose job is to carry the input
itself (docs/security.md "What forget-me leaves readable"): the messages, session events,
extraction jobs and tool requests, the repartition topic and the dead letters (a bounded
prefix of a refused input record, kept for its operator), retention-bound; the ingest
stage's state (buffered messages, session windows), compacted.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import aiohttp
import pytest

from memstream.core.kafka_io import TopicReader
from memstream.dev.openai_stub import OpenAITestServer, Reply, chat, chat_json
from memstream.topics.registry import all_topic_names
from memstream.topics.schemas import DeadLetter, JobResult, JobStatus
from tests.integration.conftest import chat as message
from tests.integration.conftest import end, free_port

pytestmark = pytest.mark.integration

CANARY = f"zqcanary{uuid.uuid4().hex[:12]}"
SECRET = f"Alice has HIV {CANARY}"
ADMIN = "canary-admin-key-0123456789abcdef012345"
INPUT_TOPICS = ("messages", "session-events", "extraction-jobs", "tool-requests",
                "ingest-repartition", "dead-letters",
                # the ingest stage's buffered messages and session windows (compacted: a
                # forget-me drops the user's state, compaction within the erasure bound)
                "ingest-state-changelog", "session-window-changelog")


def lying_model(request: dict) -> Reply:
    """Invalid JSON for one session, a fact over the limit for the other: both quote the
    user's text, as a model does."""
    text = json.dumps(request["messages"][-1]["content"], ensure_ascii=False)
    if "broken-json" in text:
        return chat('{"changes": [{"op": "ADD", "fact": {"text": "' + SECRET + '", ')
    fact = {"text": SECRET + " " + "x" * 600, "importance": 99}
    return chat_json({"changes": [{"op": "ADD", "fact": fact}], "facts": [fact]})


async def test_the_canary_is_in_no_log_line_and_no_unsealed_record(harness):
    port = free_port()
    with OpenAITestServer(responder=lying_model) as llm:
        h = await harness(extract_enabled=True, embedder="hashing", llm="openai",
                          llm_base_url=llm.url, llm_api_key="k", llm_retries=1,
                          extract_retries=0, retry_backoff_s=3600.0,
                          master_key=f"master-{uuid.uuid4().hex}", web_enabled=True,
                          web_port=port, admin_key=ADMIN, max_content_chars=2000)
        worker = h.worker()
        await h.send(message(f"Remember this: broken-json {SECRET}", user="ann", session="a1"),
                     end("a1", "ann"),
                     message(f"Remember this: too-long {SECRET}", user="bob", session="b1"),
                     end("b1", "bob"),
                     message(f"{SECRET} " + "y" * 3000, user="cid", session="c1"))
        await h.results.wait_for(lambda rs: _failed(rs) >= {("ann", "a1"), ("bob", "b1")}, 90)
        await h.dlq.wait_for(lambda rs: len(rs) >= 1, 30)
        await _tool_errors(port)
        readers = {name: await TopicReader(h.settings, name).start()
                   for name in all_topic_names(h.settings)}
        try:
            for reader in readers.values():
                await reader.settle(1.0)
            assert llm.requests, "the stand-in model was never asked"
            leaked = {name: sum(CANARY.encode() in (r.value or b"") + (r.key or b"")
                                for r in reader.records)
                      for name, reader in readers.items()
                      if not name.endswith(INPUT_TOPICS)}
            assert leaked and not any(leaked.values()), {k: n for k, n in leaked.items() if n}
            dead = [DeadLetter.model_validate_json(r.value) for r in h.dlq.records]
            assert dead and not [d.reason for d in dead if CANARY in d.reason]
            seen = {name.rsplit(".", 1)[-1]: len(r.records) for name, r in readers.items()}
            assert seen["job-results"] >= 2 and seen["decisions"] >= 2, seen
            assert seen["memory-changes"] == 0, seen  # nothing was decided
        finally:
            for reader in readers.values():
                await reader.stop()
        log = worker.log_text()
        assert "failed" in log  # the failures were logged ...
        assert CANARY not in log  # ... without the user's text


def _failed(records) -> set[tuple[str, str]]:
    out = set()
    for r in records:
        res = JobResult.model_validate_json(r.value)
        if res.status is JobStatus.FAILED:
            assert CANARY not in (res.error or "")
            out.add((res.user_id, res.session_id))
    return out


async def _tool_errors(port: int) -> None:
    """Tool calls that fail: bad arguments, a core block edit whose old text is not there,
    arguments that are not JSON; and an API body that fails validation."""
    base = f"http://127.0.0.1:{port}/v1/tenants/acme/users/dan"
    headers = {"Authorization": f"Bearer {ADMIN}"}
    calls = [
        {"name": "memory_insert", "arguments": {"content": SECRET, "importance": SECRET}},
        {"name": "core_memory_replace", "arguments": {
            "label": "profile", "old_content": SECRET, "new_content": "x"}, "wait_s": 10},
        {"name": "memory_insert", "arguments": '{"content": "' + SECRET},
        {"name": SECRET[:60], "arguments": {}},
    ]
    async with aiohttp.ClientSession(headers=headers) as http:
        deadline = time.monotonic() + 90
        while True:  # barrier: the API answers for this user
            try:
                async with http.get(f"{base}/memories") as resp:
                    if resp.status == 200:
                        break
            except aiohttp.ClientError:
                pass
            assert time.monotonic() < deadline, "the API did not come up"
            await asyncio.sleep(0.2)
        for call in calls:
            async with http.post(f"{base}/tools/execute", json=call) as resp:
                body = await resp.json()
                assert resp.status == 200 and body["status"] == "error", body
        async with http.post(f"{base}/search", json={"query": "q", "k": SECRET}) as resp:
            assert resp.status == 400
            assert CANARY not in await resp.text()
