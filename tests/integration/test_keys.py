"""API keys against the real broker: the CLI, the admin helpers and the worker's follower."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime

import pytest
from click.testing import CliRunner

from memstream.cli import main
from memstream.core import kafka
from memstream.core.settings import Settings
from memstream.topics.layout import create_topics
from memstream.topics.registry import delete_topics
from memstream.web.keys import KeyRecord, KeyRing, sign
from memstream.web.keys_topic import (
    KeyFollower,
    UnknownKeyError,
    create_key,
    keys_topic_spec,
    list_keys,
    revoke_key,
)

pytestmark = pytest.mark.integration

ADMIN = "integration-admin-key-0123456789abcdef"


@pytest.fixture
async def settings(kafka_bootstrap: str):
    s = Settings(bootstrap_servers=kafka_bootstrap, topic_prefix=f"t-keys-{uuid.uuid4().hex[:10]}",
                 admin_key=ADMIN)
    yield s
    await delete_topics(s, [keys_topic_spec(s).name])


async def eventually(check, timeout: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.1)


async def test_create_list_revoke(settings: Settings):
    assert await list_keys(settings) == []  # no topic yet
    with pytest.raises(UnknownKeyError):
        await revoke_key(settings, "0123456789abcdef")
    key_a, rec_a = await create_key(settings, "acme", "first")
    key_b, rec_b = await create_key(settings, "globex", "second")
    listed = await list_keys(settings)
    assert {r.key_id for r in listed} == {rec_a.key_id, rec_b.key_id}
    revoked = await revoke_key(settings, rec_a.key_id)
    assert revoked.revoked_at is not None and revoked.sha256 == rec_a.sha256
    again = await revoke_key(settings, rec_a.key_id)
    assert again.revoked_at == revoked.revoked_at  # idempotent: the first time is kept
    by_id = {r.key_id: r for r in await list_keys(settings)}
    assert by_id[rec_a.key_id].revoked_at == revoked.revoked_at
    assert by_id[rec_b.key_id].revoked_at is None
    ring = KeyRing(ADMIN)
    for r in by_id.values():
        ring.apply(r)
    assert ring.authorise(key_a) is None and ring.authorise(key_b) is not None
    assert ring.rejected == 0  # what the helpers wrote is signed


async def test_follower_waits_for_topic_then_follows(settings: Settings, caplog):
    follower = KeyFollower(KeyRing(admin_key=ADMIN), settings,
                           keys_topic_spec(settings).name, retry_s=0.2, poll_s=0.2)
    await follower.start()
    try:
        assert not await follower.wait_ready(1.0)  # no topic: waits quietly
        key_a, rec_a = await create_key(settings, "acme", "")
        assert await follower.wait_ready(20.0)
        await eventually(lambda: follower.ring.authorise(key_a) is not None)
        principal = follower.ring.authorise(key_a)
        assert principal is not None and principal.tenant_id == "acme"

        # A bad record is skipped (and logged without its bytes); following goes on.
        producer = kafka.producer(settings)
        await producer.start()
        try:
            with caplog.at_level(logging.WARNING, logger="memstream.web.keys"):
                secretish = b'{"sha256": "' + b"f" * 64 + b'"}'
                await producer.send_and_wait(follower.topic, key=b"0123456789abcdef",
                                             value=secretish)
                await producer.send_and_wait(follower.topic, key=b"0123456789abcdef",
                                             value=b"\xff not json")
                key_b, _ = await create_key(settings, "globex", "")
                await eventually(lambda: follower.ring.authorise(key_b) is not None)
        finally:
            await producer.stop()
        skipped = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
        assert len(skipped) == 2, skipped
        assert not any("f" * 64 in m or "not json" in m for m in skipped)

        await revoke_key(settings, rec_a.key_id)
        await eventually(lambda: follower.ring.authorise(key_a) is None)
        assert follower.ring.authorise(key_b) is not None
        assert follower.ring.authorise(ADMIN) is not None
    finally:
        await follower.stop()
    assert follower._task is None


class CountingRing(KeyRing):
    """Remembers how many keys each update carried."""

    def __init__(self) -> None:
        super().__init__(ADMIN)
        self.sizes: list[int] = []

    def update(self, changes: Mapping[str, KeyRecord | None]) -> None:
        self.sizes.append(len(changes))
        super().update(changes)


async def test_follower_start_reads_the_revoked_state_at_once(settings: Settings):
    key, rec = await create_key(settings, "acme", "")
    await revoke_key(settings, rec.key_id)
    key_live, _ = await create_key(settings, "acme", "")
    ring = CountingRing()
    follower = KeyFollower.for_settings(settings, ring)
    await follower.start()
    try:
        assert await follower.wait_ready(20.0)
        assert ring.sizes[0] == 2  # the whole topic applied in one go: never briefly live
        assert ring.authorise(key) is None and ring.authorise(key_live) is not None
        assert len(ring) == 2
    finally:
        await follower.stop()


async def test_topic_is_compacted_and_kept(settings: Settings):
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    await create_key(settings, "acme", "")
    admin = kafka.admin(settings)
    await admin.start()
    try:
        name = keys_topic_spec(settings).name
        [resp] = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, name)])
        configs = {c[0]: c[1] for c in resp.resources[0][4]}
    finally:
        await admin.close()
    assert configs["cleanup.policy"] == "compact"
    assert configs["retention.ms"] == "-1"
    await create_topics(settings, [keys_topic_spec(settings)])  # idempotent


def cli_env(settings: Settings, monkeypatch) -> None:
    monkeypatch.setenv("MEMSTREAM_BOOTSTRAP_SERVERS", settings.bootstrap_servers)
    monkeypatch.setenv("MEMSTREAM_TOPIC_PREFIX", settings.topic_prefix)
    monkeypatch.setenv("MEMSTREAM_ADMIN_KEY", ADMIN)


def test_cli_create_list_revoke(settings: Settings, monkeypatch):
    cli_env(settings, monkeypatch)
    runner = CliRunner()

    made = runner.invoke(main, ["keys", "create", "--tenant", "acme", "--label", "bot one"])
    assert made.exit_code == 0, made.output
    [plaintext] = [w for w in made.output.split() if w.startswith("msk_")]
    key_id = plaintext.split("_")[1]
    assert made.output.count(plaintext) == 1
    assert f"key id: {key_id}" in made.output and "cannot be shown again" in made.output
    runner.invoke(main, ["keys", "create", "--tenant", "globex"])

    listed = runner.invoke(main, ["keys", "list"])
    assert listed.exit_code == 0, listed.output
    [row] = [line for line in listed.output.splitlines() if line.startswith(key_id)]
    assert "acme" in row and "bot one" in row and row.split()[3:5] == ["-", "ok"]
    record = next(r for r in asyncio.run(list_keys(settings)) if r.key_id == key_id)
    assert record.sha256 not in listed.output and plaintext not in listed.output
    only = runner.invoke(main, ["keys", "list", "--tenant", "globex"])
    assert key_id not in only.output and "globex" in only.output

    revoked = runner.invoke(main, ["keys", "revoke", key_id])
    assert revoked.exit_code == 0, revoked.output
    assert f"revoked {key_id}" in revoked.output
    row = next(line for line in runner.invoke(main, ["keys", "list"]).output.splitlines()
               if line.startswith(key_id))
    assert row.split()[3] != "-"

    async def follow() -> tuple[bool, object]:
        follower = KeyFollower.for_settings(settings)
        await follower.start()
        try:
            return await follower.wait_ready(20.0), follower.ring.authorise(plaintext)
        finally:
            await follower.stop()

    assert asyncio.run(follow()) == (True, None)

    unknown = runner.invoke(main, ["keys", "revoke", "0123456789abcdef"])
    assert unknown.exit_code != 0 and "no API key" in unknown.output
    bad = runner.invoke(main, ["keys", "create", "--tenant", "no/slash"])
    assert bad.exit_code == 2 and "tenant_id" in bad.output


def forged(key_id: str, tenant_id: str, plaintext: str,
           revoked_at: datetime | None = None) -> KeyRecord:
    """A record as an attacker with produce rights writes it: their own key's hash."""
    return KeyRecord(key_id=key_id, tenant_id=tenant_id,
                     sha256=hashlib.sha256(plaintext.encode()).hexdigest(),
                     created_at=datetime.now(UTC), revoked_at=revoked_at)


async def test_forged_records_on_the_topic_never_authorise(settings: Settings, monkeypatch):
    # The review's attack: a service that can produce to the keys topic writes a record
    # for another tenant with the hash of a key it made up. Only CLI-made keys may work.
    cli_env(settings, monkeypatch)
    runner = CliRunner()

    async def cli(*args: str) -> str:
        result = await asyncio.to_thread(runner.invoke, main, ["keys", *args])
        assert result.exit_code == 0, result.output
        return result.output

    made = await cli("create", "--tenant", "acme")
    [real] = [w for w in made.split() if w.startswith("msk_")]
    real_id = real.split("_")[1]
    follower = KeyFollower.for_settings(settings)
    await follower.start()
    try:
        assert await follower.wait_ready(20.0)
        assert follower.ring.authorise(real) is not None
        mine = "msk_00000000000000aa_" + "a" * 43
        hijack = "msk_" + real_id + "_" + "h" * 43
        unsigned = forged("00000000000000aa", "victim", mine)
        attacks = [
            unsigned,
            unsigned.model_copy(update={"signature": "0" * 64}),
            sign(unsigned, "some-other-admin-key"),
            forged(real_id, "victim", hijack),  # take over the real key's id
            forged(real_id, "acme", real, revoked_at=datetime.now(UTC)),  # fake "revoked"
        ]
        producer = kafka.producer(settings)
        await producer.start()
        try:
            for record in attacks:
                await producer.send_and_wait(follower.topic, key=record.key_id.encode(),
                                             value=record.dumps())
            for headers in ([], [("memstream-sig", b"0" * 64)]):  # revoking by tombstone
                await producer.send_and_wait(follower.topic, key=real_id.encode(),
                                             value=None, headers=headers)
        finally:
            await producer.stop()
        marker_out = await cli("create", "--tenant", "globex")  # written after the attacks
        [marker] = [w for w in marker_out.split() if w.startswith("msk_")]
        await eventually(lambda: follower.ring.authorise(marker) is not None)

        assert follower.ring.authorise(mine) is None and follower.ring.authorise(hijack) is None
        principal = follower.ring.authorise(real)
        assert principal is not None and principal.tenant_id == "acme"
        assert follower.ring.rejected == len(attacks)
        assert follower.rejected == {"unsigned": len(attacks) + 2}  # dead-lettered too
    finally:
        await follower.stop()

    # A worker that starts now replays the same records and reaches the same answers.
    fresh = KeyFollower.for_settings(settings)
    await fresh.start()
    try:
        assert await fresh.wait_ready(20.0)
        assert fresh.ring.authorise(mine) is None and fresh.ring.authorise(hijack) is None
        assert fresh.ring.authorise(real) is not None and fresh.ring.authorise(marker)
    finally:
        await fresh.stop()

    # The operator sees the forgeries, and the fake "revoked" record does not stop a revoke.
    listed = await cli("list")
    [row] = [line for line in listed.splitlines() if line.startswith(real_id)]
    assert row.split()[4] == "NO"
    assert f"revoked {real_id}" in await cli("revoke", real_id)
    after = KeyFollower.for_settings(settings)
    await after.start()
    try:
        assert await after.wait_ready(20.0)
        assert after.ring.authorise(real) is None and after.ring.authorise(marker) is not None
    finally:
        await after.stop()

    # Deleting a key writes its signed tombstone, which a worker takes.
    assert "deleted" in await cli("revoke", "--delete", real_id)
    deleted = KeyFollower.for_settings(settings)
    await deleted.start()
    try:
        assert await deleted.wait_ready(20.0)
        assert deleted.ring.get(real_id) is None and deleted.ring.authorise(marker)
        assert deleted.rejected == {"unsigned": len(attacks) + 2}
    finally:
        await deleted.stop()
