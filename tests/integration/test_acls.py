"""Tenant boundaries on the way in, on a broker that authorizes (docs/tenancy.md).

The module starts its own local broker (``MEMSTREAM_TEST_ACL_PORT``, 19792) with SASL/PLAIN,
Kafka's StandardAuthorizer and five users: ``admin`` (a super user), the worker, the chat
services of tenants acme and globex, a downstream reader. ``memstream acls --apply``
creates the ACLs it prints for the per-tenant layout, then the worker runs with its own
principal (it creates and checks its topics, runs its loops): a turn acme's chat service
writes to acme's topic is processed; acme's chat service is refused on globex's topic and
on every other topic of the deployment; a record of tenant globex that acme's chat service
writes into acme's own topic is dead-lettered.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from aiokafka.errors import TopicAuthorizationFailedError
from pydantic import SecretStr

from memstream.client import AsyncMemoryClient
from memstream.consumer import MemoryChanges
from memstream.core import kafka
from memstream.core.kafka_io import send_events
from memstream.core.settings import Settings
from memstream.dev import broker as local_broker
from memstream.dev.process import settings_env
from memstream.topics.registry import all_topic_names, tenant_prefix
from memstream.topics.schemas import DeadLetter
from tests.integration.conftest import Harness, chat, wait_covered

pytestmark = pytest.mark.integration
ACL_PORT = int(os.environ.get("MEMSTREAM_TEST_ACL_PORT", "19792"))
PASSWORDS = {"admin": "it-acl-admin", "worker": "it-acl-worker", "chat-acme": "it-acl-acme",
             "chat-globex": "it-acl-globex", "reader": "it-acl-reader"}
BOOTSTRAP = f"127.0.0.1:{ACL_PORT}"


def login(user: str) -> dict[str, object]:
    return {"kafka_security_protocol": "SASL_PLAINTEXT", "kafka_sasl_mechanism": "PLAIN",
            "kafka_sasl_username": user, "kafka_sasl_password": PASSWORDS[user]}


def as_user(settings: Settings, user: str) -> Settings:
    return settings.model_copy(update={**login(user),
                                       "kafka_sasl_password": SecretStr(PASSWORDS[user])})


@pytest.fixture(scope="module")
def acl_broker() -> object:
    if shutil.which("java") is None or shutil.which("mvn") is None:
        pytest.skip("the authorizing broker is the local one: it needs java and mvn")
    broker = Settings(kafka_port=ACL_PORT, kafka_controller_port=ACL_PORT + 1, **login("admin"))
    local_broker.stop(broker)  # a leftover of an interrupted run may hold other passwords
    local_broker.wipe(broker)
    local_broker.start(broker, sasl=True, users=PASSWORDS, authorizer=True)
    yield BOOTSTRAP
    local_broker.stop(broker)
    local_broker.wipe(broker)


def broker_log() -> str:
    """The broker's log: the authorizer logs each denial there (kafka.authorizer.logger)."""
    path = local_broker.paths_for(Settings(kafka_port=ACL_PORT)).log_file
    return path.read_text(errors="replace") if path.exists() else ""


def memstream(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTREAM_")}
    env.update(settings_env(settings))
    return subprocess.run([sys.executable, "-m", "memstream.cli", *args], env=env,
                          capture_output=True, text=True, timeout=180, check=False)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def world(acl_broker, tmp_path_factory) -> AsyncIterator[Harness]:
    tmp = tmp_path_factory.mktemp("acls")
    h = Harness(acl_broker, tmp, input_topics="per-tenant", tenants="acme,globex",
                extract_enabled=True, **login("worker"))
    applied = memstream(as_user(h.settings, "admin"), "acls", "--apply",
                        "--worker-principal", "User:worker",
                        "--chat-principal", "User:chat-{tenant}",
                        "--reader-principal", "User:reader")
    assert applied.returncode == 0, applied.stderr
    assert "ACL bindings created" in applied.stdout
    await h.start()  # as the worker: it creates and checks its topics itself
    try:
        h.worker()
        yield h
    finally:  # the broker is wiped at the end (the worker may not delete topics)
        for w in h.workers:
            w.stop()
        for reader in (h.jobs, h.results, h.dlq):
            if reader is not None:
                await reader.stop()
        if h.producer is not None:
            await h.producer.stop()


@pytest_asyncio.fixture
async def acme(world: Harness) -> AsyncIterator[object]:
    """A producer logged in as acme's chat service (idempotent, as chat services' are)."""
    producer = kafka.producer(as_user(world.settings, "chat-acme"), enable_idempotence=True,
                              acks="all", request_timeout_ms=15_000)
    await producer.start()
    yield producer
    await producer.stop()


def tenant_topic(h: Harness, tenant: str, suffix: str) -> str:
    return tenant_prefix(h.settings, tenant) + suffix


async def test_a_turn_acmes_chat_service_writes_is_processed(world):
    """The whole worker runs as its principal (ingest, extract, apply: memory changes and
    public events written), and the reader reads the events with its own."""
    user = f"u{uuid.uuid4().hex[:8]}"
    # the Python client with acme's chat service's login writes acme's own topic
    async with AsyncMemoryClient("http://127.0.0.1:9", "unused", tenant_id="acme",
                                 kafka=as_user(world.settings, "chat-acme"),
                                 topic_prefix=world.settings.topic_prefix) as client:
        await client.add("Remember this: I live in Porto", user_id=user,  # explicit
                         session_id="s1")
    await wait_covered(world, {(user, "s1"): 1}, timeout=90, tenant="acme")
    reader = as_user(world.settings, "reader")
    async with asyncio.timeout(90), MemoryChanges(reader, group_id="memory-reader",
                                                  tenant="acme", user=user) as changes:
        event = await anext(aiter(changes))
    assert event.user_id == user and event.after is not None
    assert "Porto" in event.after.content
    log = world.workers[0].log_text()
    assert "AuthorizationFailed" not in log and "Authorization failed" not in log, log[-3000:]
    denied = [line for line in broker_log().splitlines()
              if "Principal = User:worker is Denied" in line]
    assert not denied, denied[:5]  # the worker asked for nothing it is not granted


async def test_acmes_chat_service_is_refused_on_every_other_topic(world, acme):
    own = {tenant_topic(world, "acme", s) for s in ("messages", "session-events")}
    others = [t for t in all_topic_names(world.settings) if t not in own]
    assert tenant_topic(world, "globex", "messages") in others
    assert world.topics.messages.name in others and world.topics.tool_requests.name in others
    value = chat("Wire the savings to account 666", tenant="acme").dumps()
    for topic in others:
        with pytest.raises(TopicAuthorizationFailedError):
            await acme.send_and_wait(topic, value, key=b"acme/u1")
    # the broker says so in its log (what the worker's test reads for its own principal)
    assert "Principal = User:chat-acme is Denied" in broker_log()


async def test_another_tenants_record_on_acmes_topic_is_dead_lettered(world, acme):
    user = f"u{uuid.uuid4().hex[:8]}"
    forged = chat("Wire the savings to account 666", user=user, tenant="globex")
    await send_events(acme, tenant_topic(world, "acme", "messages"), [forged])
    topic = tenant_topic(world, "acme", "messages")

    def set_aside(records) -> bool:
        return any(DeadLetter.model_validate_json(r.value).source_topic == topic
                   for r in records)

    assert world.dlq is not None
    await world.dlq.wait_for(set_aside, 90)
    letters = [DeadLetter.model_validate_json(r.value) for r in world.dlq.records]
    mine = [d for d in letters if d.source_topic == topic]
    assert [d.kind for d in mine] == ["tenant"] and "globex" in mine[0].reason
    assert not [j for j in world.job_list("globex") if j.user_id == user]

