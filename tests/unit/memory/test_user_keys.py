"""The user-keys view (memory.crypto.user_keys / user_key_view / user_key_records), without a
broker: a fake topic is a list of records, a writer's producer appends to it and a fresh
view takes it from the start, as a restarted follower would."""

from __future__ import annotations

import json

import pytest

from memstream.core.errors import ConfigError
from memstream.core.settings import Settings
from memstream.memory.crypto import change_sealing
from memstream.memory.crypto.user_keys import UserKeys
from memstream.sealing import envelope as crypto
from memstream.sealing import key_records as rec
from memstream.topics.schemas import MemoryChange
from tests.unit.builders import CANARY, change

pytestmark = pytest.mark.unit
V1 = "the first master key long enough"
V2 = "the second master key also long"
TOPIC = "p.user-keys"


class Producer:
    """A producer whose every send lands on the fake topic (dead letters on their own)."""

    def __init__(self, log: list, dead: list) -> None:
        self.log, self.dead = log, dead

    async def send_and_wait(self, topic, key, value):
        (self.log if topic == TOPIC else self.dead).append((key, value))

    async def stop(self):
        pass


def settings(**kw) -> Settings:
    return Settings(**{"master_key": V1, **kw})


def writer(log: list, dead: list | None = None, **kw) -> UserKeys:
    keys = UserKeys(settings(**kw), TOPIC, dead_letters="p.dead")
    keys._producer = Producer(log, dead if dead is not None else [])
    keys.dead_letters = True
    replay(keys, log)
    return keys


def replay(keys: UserKeys, log: list) -> UserKeys:
    """A fresh follower: every record of ``log`` in order, then the end of the first read."""
    for n, (key, value) in enumerate(list(log)):
        keys.take(key, value, type("R", (), {"offset": n, "partition": 0})())
    keys.settle()
    keys._caught_up.set()
    return keys


def reader(log: list, **kw) -> UserKeys:
    return replay(UserKeys(settings(**kw), TOPIC), log)


def sealed(keys: UserKeys, key: tuple[str, bytes], user: str = "u1", tenant: str = "t1"
           ) -> MemoryChange:
    return change_sealing.seal_change(change(user).model_copy(update={"tenant_id": tenant}), *key)


def opens(keys: UserKeys, event: MemoryChange) -> bool:
    opened = keys.opener()(event)
    return opened is not None and CANARY in opened.model_dump_json()


async def test_a_malformed_record_does_not_stop_the_view():
    log: list = []
    w = writer(log)
    k1 = await w.key_for_write("t1", "u1")
    log += [(b"no slashes", b"{}"), (b"t1/u9/kx", b"not json"),
            (b"t1/u9/ky", json.dumps({"wrapped": 3}).encode()),
            (b"t1/u9/kz", json.dumps({"wrapped": "AAAA", "kek": "nope"}).encode()),
            (b"t1/u9/!forgotten", b"[1, 2]")]
    k2 = await w.key_for_write("t1", "u2")  # after the bad ones: still taken
    r = reader(log)
    assert r.rejected == 5 and r.ready
    assert opens(r, sealed(w, k1)) and opens(r, sealed(w, k2, "u2"))


async def test_records_set_aside_are_dead_letters_without_their_value():
    log: list = [(b"t1/u9/kx", b'{"wrapped": "secret-ish"}')]
    dead: list = []
    w = writer(log, dead)
    await w.repair()
    (key, letter), = dead
    got = json.loads(letter)
    assert key == b"t1/u9/kx" and got["value_b64"] == "" and got["kind"] == "undecryptable"
    assert got["value_length"] == len(log[0][1]) and w.rejected == 1


async def test_a_forged_marker_is_ignored():
    log: list = []
    w = writer(log)
    key = await w.key_for_write("t1", "u1")
    forged = [json.dumps({"at": 1e12, "request_id": "x", "actor": "y"}).encode(),
              json.dumps({"at": 1e12, "kek": min(w.keks_of("t1")), "keys": [key[0]],
                          "sig": "00" * 32}).encode()]
    log += [(b"t1/u1/!forgotten", v) for v in forged]
    r = reader(log)
    assert r.forgotten_at("t1", "u1") is None and r.rejected == 2
    assert opens(r, sealed(w, key))
    await w.forget("t1", "u1", 1234.5, "req", "admin")  # a signed one is honoured
    r = reader(log)
    assert r.forgotten_at("t1", "u1") == 1234.5 and not opens(r, sealed(w, key))


async def test_a_forged_tombstone_does_not_drop_the_key_and_a_writer_writes_it_back():
    log: list = []
    w = writer(log)
    key = await w.key_for_write("t1", "u1")
    record = log[-1]
    log.append((record[0], None))  # a tombstone without a forget marker listing it
    w.take(*log[-1])
    assert opens(w, sealed(w, key))
    await w.repair()
    assert log[-1] == record  # written back: compaction keeps the key
    assert opens(reader(log), sealed(w, key))
    assert opens(reader(log[:-1]), sealed(w, key))  # a reader keeps it too


@pytest.mark.parametrize("junk", [b"{}", b"not json", json.dumps({"wrapped": "AAAA"}).encode()])
async def test_a_bad_value_over_a_good_record_is_written_back(junk):
    """Compaction keeps the last record of a key: a value that is set aside over a good
    record (a data key, the tenant's key, a forget marker) must not become the only one."""
    log: list = []
    w = writer(log)
    key = await w.key_for_write("t1", "u1")
    await w.forget("t1", "u2", 50.0, "r", "a")
    good = {k: v for k, v in log if v is not None}
    for k in good:  # every good record overwritten by junk of the same key
        log.append((k, junk))
        assert not w.take(*log[-1])
    await w.repair()
    assert {k: v for k, v in log[-len(good):]} == good  # each written back, as it was
    compacted = list({k: v for k, v in log}.items())  # what compaction keeps
    fresh = reader(compacted)
    assert opens(fresh, sealed(w, key)) and fresh.forgotten_at("t1", "u2") == 50.0


async def test_a_bad_value_over_a_good_record_is_written_back_by_a_fresh_writer_too():
    """The same, found by a writer that reads the topic from the start: a tenant key's
    record that does not open waits for the end of the first read before it is set aside,
    and its key's good record is written back then."""
    log: list = []
    w = writer(log)
    key = await w.key_for_write("t1", "u1")
    good = {k: v for k, v in log if v is not None}
    junk = json.dumps({"wrapped": "AAAA", "master": 1, "kek": "x"}).encode()
    log += [(k, junk) for k in good]
    fresh = writer(log)  # reads it all, then settles
    await fresh.repair()
    assert dict(log[-len(good):]) == good
    assert opens(reader(list(dict(log).items())), sealed(w, key))


async def test_rotation_never_signs_an_unsigned_marker():
    log: list = []
    w = writer(log)
    key = await w.key_for_write("t1", "victim")
    log.append((b"t1/victim/!forgotten", json.dumps({"at": 1e12}).encode()))  # forged
    rot = writer(log, master_key=V2, master_key_version=2, master_key_previous=f"1:{V1}")
    await rot.write(rot.rotation().records)
    after = reader(log, master_key=V2, master_key_version=2)
    assert after.forgotten_at("t1", "victim") is None and opens(after, sealed(w, key, "victim"))


async def test_a_forget_shreds_and_a_key_written_again_is_shredded_anew():
    log: list = []
    w = writer(log)
    key = await w.key_for_write("t1", "u1")
    record = log[-1]
    assert await w.forget("t1", "u1", 99.0, "r1", "a") == 1
    assert [k for k, _ in log[-2:]] == [b"t1/u1/!forgotten", record[0]]  # marker first
    assert log[-1][1] is None and not opens(w, sealed(w, key))
    log.append(record)  # replayed (or a rotation racing the forget)
    w.take(*record)
    assert not opens(w, sealed(w, key))
    await w.repair()
    assert log[-1] == (record[0], None)
    assert not opens(reader(log), sealed(w, key))


async def test_another_users_record_naming_a_key_id_does_not_return_that_key():
    log: list = []
    w = writer(log)
    key_id, data_key = await w.key_for_write("t1", "alice")
    assert w.keys_of("t1", "alice") == {key_id: data_key}
    log.append((f"t1/bob/{key_id}".encode(), log[-1][1]))  # alice's wrapped key, as bob's
    assert not w.take(*log[-1])
    assert w.keys_of("t1", "bob") == {} and reader(log).keys_of("t1", "bob") == {}


def legacy_record(tenant: str, user: str, key_id: str, data_key: bytes) -> tuple:
    wrapped = crypto.wrap(crypto.kek_from(V1), data_key, tenant, user, key_id)
    return (f"{tenant}/{user}/{key_id}".encode(),
            json.dumps({"wrapped": wrapped, "created_at": 1.0}).encode())


async def test_rotating_the_master_rewraps_everything_under_the_new_version():
    log: list = []
    w = writer(log)
    k1 = await w.key_for_write("t1", "u1")
    k2 = await w.key_for_write("t2", "u2")
    old = ("legacy1", crypto.new_data_key())
    gone = ("legacy2", crypto.new_data_key())
    log += [legacy_record("t3", "u3", *old), legacy_record("t3", "u4", *gone),
            (b"t3/u4/legacy2", None),
            (b"t3/u4/!forgotten", json.dumps({"at": 5.0, "request_id": "r",
                                              "actor": "a"}).encode())]
    both = dict(master_key=V2, master_key_version=2, master_key_previous=f"1:{V1}")
    rot = writer(log, **both)
    plan = rot.rotation()
    assert (plan.keks, plan.data_keys, plan.new_keks) == (2, 1, 1)
    await rot.write(plan.records)
    only_v2 = reader(log, master_key=V2, master_key_version=2)
    events = [sealed(w, k1), sealed(w, k2, "u2", "t2"), sealed(w, old, "u3", "t3")]
    assert all(opens(only_v2, e) for e in events)
    assert only_v2.forgotten_at("t3", "u4") is None  # an unsigned marker: never signed
    assert only_v2.keys_of("t3", "u4") == {}  # its user's legacy key: shredded all the same
    assert not opens(reader(log[:3], master_key=V2, master_key_version=2), events[0])
    assert only_v2.rotation().records == []  # nothing left under version 1


async def test_a_read_key_opens_its_tenants_events_only():
    log: list = []
    w = writer(log)
    ka = await w.key_for_write("ta", "u1")
    kb = await w.key_for_write("tb", "u1")
    read_key = rec.encode_read_key("ta", w.keks_of("ta"))
    r = replay(UserKeys(Settings(read_keys=read_key), TOPIC), log)
    ea, eb = sealed(w, ka, tenant="ta"), sealed(w, kb, tenant="tb")
    assert r.opens("ta") and not r.opens("tb")
    assert opens(r, ea) and r.opener()(eb) is None and r.rejected == 0
    await w.forget("ta", "u1", 7.0, "r", "a")  # the reader verifies the marker too
    assert replay(UserKeys(Settings(read_keys=read_key), TOPIC), log).forgotten_at(
        "ta", "u1") == 7.0


def test_read_keys_and_previous_masters_that_do_not_parse_are_config_errors():
    with pytest.raises(ConfigError, match="entry 1"):
        rec.decode_read_keys("msr1.abc")
    with pytest.raises(ConfigError, match="PREVIOUS"):
        rec.Keyring.of(settings(master_key_previous="nokey"))
    assert rec.decode_read_keys(rec.encode_read_key("t1", {"k": b"x" * 32})) == {
        "t1": {"k": b"x" * 32}}


async def test_the_follower_resumes_from_its_position_after_an_error(monkeypatch):
    import asyncio

    from memstream.memory.crypto import user_keys

    seen: list[dict] = []
    again = asyncio.Event()

    async def fake_follow(settings, topic, handle, *, positions, caught_up, **_):
        seen.append(dict(positions))
        if len(seen) == 1:
            await handle([type("R", (), {"key": b"t1/u1/k", "value": b"bad", "offset": 4,
                                         "partition": 0})()])
            positions["tp"] = 5
            raise ConnectionError("broker away")
        await caught_up()
        again.set()
        await asyncio.Event().wait()

    monkeypatch.setattr(user_keys, "follow", fake_follow)
    keys = UserKeys(settings(), TOPIC)
    await keys.start(write=False)
    try:
        await asyncio.wait_for(again.wait(), 5)
        assert seen == [{}, {"tp": 5}] and keys.ready and keys.rejected == 1
    finally:
        await keys.stop()
