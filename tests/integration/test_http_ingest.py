"""The HTTP way in, end to end: a real broker, one worker serving the API, tenant keys from
the keys topic. Turns POSTed with a tenant key are produced (202 with their offsets),
ingested and extracted like records a chat service produces; a retried POST adds nothing;
another tenant's key is refused; the Python client without Kafka settings writes through it.
Waits on barriers (the API, ingest's committed offsets, job results), never on sleeps."""

from __future__ import annotations

import httpx
import pytest
import pytest_asyncio

from memstream.client import AsyncMemoryClient
from memstream.contract.http_api import paths
from memstream.contract.http_api.intake import MessagesAccepted, SessionEndAccepted
from tests.integration.conftest import (
    answering,
    free_port,
    running,
    tenant_key,
    until,
    wait_covered,
)

pytestmark = pytest.mark.integration
ADMIN = "admin-key-47-0123456789abcdef0123456789"
PORT = free_port()
BASE = f"http://127.0.0.1:{PORT}"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def api(kafka_bootstrap, tmp_path_factory):
    async with running(kafka_bootstrap, tmp_path_factory.mktemp("http-ingest"),
                       extract_enabled=True, web_enabled=True, web_port=PORT,
                       admin_key=ADMIN) as h:
        await answering(BASE, ADMIN, paths.TOOLS, "the API to answer", timeout=120)
        yield h


async def key_of(h, tenant: str) -> str:
    """A new key of ``tenant``, once the worker takes it."""
    return await tenant_key(h, BASE, tenant, paths.TOOLS)


async def live_contents(web: httpx.AsyncClient, tenant: str, user: str, key: str) -> list[str]:
    r = await web.get(paths.fill(paths.MEMORIES, tenant=tenant, user=user),
                      headers={"Authorization": f"Bearer {key}"})
    r.raise_for_status()
    return sorted(m["content"] for m in r.json()["memories"])


async def test_posted_turns_become_memories_once_and_other_tenants_are_refused(api, tenant):
    key = await key_of(api, tenant)
    auth = {"Authorization": f"Bearer {key}", "Idempotency-Key": "turns-1"}
    body = {"session_id": "s1", "messages": [
        {"role": "user", "content": "Remember this: I live in Lisbon"},
        {"role": "assistant", "content": "Noted."}]}
    messages = paths.fill(paths.MESSAGES, tenant=tenant, user="ana")
    end = paths.fill(paths.SESSION_END, tenant=tenant, user="ana", session_id="s1")
    async with httpx.AsyncClient(base_url=BASE) as web:
        resp = await web.post(messages, json=body, headers=auth)
        assert resp.status_code == 202, resp.text
        first = MessagesAccepted.model_validate(resp.json())
        assert [m.topic for m in first.messages] == [api.topics.messages.name] * 2
        assert len({m.partition for m in first.messages}) == 1  # the user's partition
        assert first.messages[1].offset > first.messages[0].offset >= 0
        await api.ingest_caught_up()  # the end is another topic: sent after the turns
        done = await web.post(end, headers={"Authorization": f"Bearer {key}"})
        assert done.status_code == 202, done.text
        ended = SessionEndAccepted.model_validate(done.json())
        assert ended.topic == api.topics.session_events.name
        await wait_covered(api, {("ana", "s1"): 2}, tenant=tenant)

        async def remembered() -> list[str] | None:
            found = await live_contents(web, tenant, "ana", key)
            return found or None

        assert await until(remembered, "the memory") == ["Lives in Lisbon"]
        await api.wait_jobs(1, tenant=tenant)  # the jobs reader has the session's job
        await api.jobs.settle(1.0)
        jobs = len(api.job_list(tenant))

        # The same POST again (a client that did not see the answer): the same ids, new
        # offsets, and the ingest stage drops the copies: no job, no memory.
        again = await web.post(messages, json=body, headers=auth)
        assert again.status_code == 202, again.text
        retried = MessagesAccepted.model_validate(again.json())
        assert [m.message_id for m in retried.messages] == \
            [m.message_id for m in first.messages]
        assert retried.messages[0].offset > first.messages[1].offset
        await api.ingest_caught_up()  # the copies are read and committed (with any job)
        await api.jobs.settle(1.0)
        assert len(api.job_list(tenant)) == jobs
        assert await live_contents(web, tenant, "ana", key) == ["Lives in Lisbon"]

        # Another tenant's key opens nothing of this tenant; no key is 401.
        other = await key_of(api, tenant + "x")
        foreign = await web.post(messages, json=body, headers={"X-API-Key": other})
        assert foreign.status_code == 403
        assert (await web.post(messages, json=body)).status_code == 401
        bad = await web.post(messages, headers={"X-API-Key": key},
                             json={"session_id": "s1", "messages": [
                                 {"role": "user", "content": "Remember: PIN 4711",
                                  "user_id": "bob"}]})
        assert bad.status_code == 400 and "4711" not in bad.text


async def test_the_client_without_kafka_settings_adds_through_the_api(api, tenant):
    key = await key_of(api, tenant)
    async with AsyncMemoryClient(BASE, key, tenant_id=tenant) as client:
        assert client.bootstrap_servers is None
        ids = await client.add([{"role": "user", "content": "Remember this: I live in Porto"}],
                               user_id="ben", session_id="b1")
        assert len(ids) == 1
        await api.ingest_caught_up()
        await client.end_session(user_id="ben", session_id="b1")
        await wait_covered(api, {("ben", "b1"): 1}, tenant=tenant)

        async def found() -> list[str] | None:
            got = await client.search("where do I live", user_id="ben")
            return [m.content for m in got.memories] or None

        assert await until(found, "the memory") == ["Lives in Porto"]
