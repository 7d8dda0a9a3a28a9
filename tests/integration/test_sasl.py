"""A cluster that wants a login: a local broker started with ``memstream broker start
--sasl`` (SASL_PLAINTEXT, PLAIN) and every Kafka client memstream has, once with the
credentials and once without them.

With them: the worker (its stages' loops, Faust, the audit log and the keys follower),
``MemoryClient.add``, ``memstream keys``, ``rebuild``, ``replay`` and ``forget verify`` all
work. Without them each one is refused: the commands exit 1 with one clear line, the
client raises, and a worker gives up after the time it waits for a broker that is away
(``broker_wait_s``; it runs meanwhile, in the background). The module starts its own broker on
``MEMSTREAM_TEST_SASL_PORT`` (19292) and stops it at the end.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import pytest_asyncio
from aiokafka.errors import KafkaConnectionError

from memstream.client import AsyncMemoryClient, MemstreamConnectionError
from memstream.core import kafka
from memstream.core.settings import Settings
from memstream.dev import broker as local_broker
from memstream.dev.process import READY_MARKER, WorkerProcess, settings_env
from memstream.topics.layout import create_topics
from tests.integration.conftest import free_port, running, until

pytestmark = pytest.mark.integration
SASL_PORT = int(os.environ.get("MEMSTREAM_TEST_SASL_PORT", "19292"))
USER, PASSWORD = "memstream", "it-sasl-password"
ADMIN = "admin-key-sasl-0123456789abcdef01234"
WEB = free_port()
LOGIN = {"kafka_security_protocol": "SASL_PLAINTEXT", "kafka_sasl_mechanism": "PLAIN",
         "kafka_sasl_username": USER, "kafka_sasl_password": PASSWORD}


@pytest.fixture(scope="module")
def sasl_bootstrap() -> object:
    if shutil.which("java") is None or shutil.which("mvn") is None:
        pytest.skip("the SASL broker is the local one: it needs java and mvn")
    broker = Settings(kafka_port=SASL_PORT, kafka_controller_port=SASL_PORT + 1,
                      kafka_sasl_username=USER, kafka_sasl_password=PASSWORD)
    local_broker.stop(broker)  # a leftover of an interrupted run may hold other passwords
    local_broker.start(broker, sasl=True)
    yield f"127.0.0.1:{SASL_PORT}"
    local_broker.stop(broker)
    local_broker.wipe(broker)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def world(sasl_bootstrap, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sasl")
    # The worker without credentials starts first and runs in the background: it waits
    # broker_wait_s for the broker, as for one that is away, then exits (checked at the end).
    bad = Settings(bootstrap_servers=sasl_bootstrap, topic_prefix=f"bad-{uuid.uuid4().hex[:8]}",
                   app_id="bad", data_dir=tmp / "bad", web_enabled=False, broker_wait_s=10.0)
    refused = WorkerProcess(bad, tmp / "refused-worker.log").spawn()
    async with running(sasl_bootstrap, tmp, extract_enabled=True, web_enabled=True,
                       web_port=WEB, admin_key=ADMIN, **LOGIN) as h:
        probe = AsyncMemoryClient(f"http://127.0.0.1:{WEB}", ADMIN, tenant_id="probe")
        await until(lambda: probe.tools(), "the API to answer", timeout=120)
        await probe.aclose()
        yield h, refused


def without_login(settings: Settings) -> Settings:
    return settings.model_copy(update={"kafka_security_protocol": "PLAINTEXT"})


def memstream(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTREAM_")}
    env.update(settings_env(settings))
    return subprocess.run([sys.executable, "-m", "memstream.cli", *args], env=env,
                          capture_output=True, text=True, timeout=180, check=False)


def client(settings: Settings, tenant: str) -> AsyncMemoryClient:
    return AsyncMemoryClient(f"http://127.0.0.1:{WEB}", ADMIN, tenant_id=tenant,
                             kafka=settings, topic_prefix=settings.topic_prefix)


async def test_the_worker_and_the_client_work_with_a_login(world, tenant):
    h, _ = world
    async with client(h.settings, tenant) as c:
        await c.add([{"role": "user", "content": "Remember this: I live in Porto"}],
                    user_id="ana", session_id="s1")

        async def stored():
            found = {m.content for m in await c.get_all(user_id="ana")}
            return found if "Lives in Porto" in found else None

        await until(stored, "the memory, extracted and applied over SASL")

        async def audited():  # the audit log follows the change topic with the login too
            rows = await c.audit(user_id="ana")
            return rows or None

        rows = await until(audited, "the change in the tenant's audit log")
        assert [(r.op, r.kind) for r in rows] == [("add", "extraction")]


async def test_the_client_is_refused_without_a_login(world, tenant):
    h, _ = world
    async with client(without_login(h.settings), tenant) as c:
        with pytest.raises(MemstreamConnectionError):
            await c.add([{"role": "user", "content": "hello"}], user_id="bo", session_id="s1")


async def test_every_client_kind_is_refused_without_a_login(world):
    h, _ = world
    bad = without_login(h.settings)
    for build in (kafka.producer, kafka.consumer, kafka.admin):
        made = build(bad)
        with pytest.raises(KafkaConnectionError):
            await made.start()
        await (made.close() if build is kafka.admin else made.stop())
    with pytest.raises(KafkaConnectionError):
        await create_topics(bad)


async def test_the_commands_work_with_a_login_and_are_refused_without(world, tmp_path):
    h, _ = world
    s = h.settings
    key = memstream(s, "keys", "create", "--tenant", "t-sasl")
    assert key.returncode == 0, key.stderr
    key_id = key.stdout.split("msk_")[1].split("_")[0]
    assert key_id in memstream(s, "keys", "list").stdout
    rebuilt = memstream(s, "rebuild", "--into", str(tmp_path / "rebuilt"), "--no-verify")
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert "rebuilt" in rebuilt.stdout
    replayed = memstream(s, "replay", "--dry-run")
    assert replayed.returncode == 0, replayed.stderr
    assert '"dry_run": true' in replayed.stdout
    verified = memstream(s, "forget", "verify", "--tenant", "t-sasl", "--user", "nobody")
    assert verified.returncode == 0, verified.stderr
    assert "records scanned" in verified.stdout

    bad = without_login(s)
    for args in (("keys", "list"), ("rebuild", "--into", str(tmp_path / "no"), "--no-verify"),
                 ("replay", "--dry-run"),
                 ("forget", "verify", "--tenant", "t-sasl", "--user", "nobody"),
                 ("topics", "create")):
        refused = memstream(bad, *args)
        assert refused.returncode == 1, (args, refused.stdout, refused.stderr)
        last = refused.stderr.strip().splitlines()[-1]
        assert last.startswith("Error: ") and "Unable to bootstrap" in last, (args, last)
        assert "Traceback" not in refused.stderr and PASSWORD not in refused.stderr
    assert not (tmp_path / "no").exists() or not any((tmp_path / "no").iterdir())


async def test_a_worker_without_a_login_gives_up(world):
    _, refused = world
    assert refused.proc is not None
    try:  # a barrier on its exit: it waits broker_wait_s for the broker, then gives up
        code = await asyncio.to_thread(refused.proc.wait, 150)
    except subprocess.TimeoutExpired:
        refused.kill()
        code = None
    log = refused.log_text()
    assert code not in (None, 0), log[-2000:]
    assert "KafkaConnectionError" in log and PASSWORD not in log
    assert READY_MARKER not in log


def test_the_broker_config_keeps_the_passwords_private(sasl_bootstrap):
    props = Path(local_broker.paths_for(Settings(kafka_port=SASL_PORT)).run,
                 "server.properties")
    assert props.stat().st_mode & 0o077 == 0
