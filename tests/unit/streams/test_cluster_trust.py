"""Workers prove who they are in their groups (issue 29; streams/cluster_trust.py, the
assignor of streams/cluster.py): with the cluster secret the leader takes only members whose
metadata verifies (a rogue gets no partitions and is not in the map) and signs the map; a
worker routes only with a map that verifies, else keeps its previous one. Without the secret
a worker must be alone: meeting another ends it (exit 78, one line naming the setting)."""

from __future__ import annotations

import json
import logging
import time

import pytest
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)

from memstream.core.cluster_auth import MAP, MEMBER, key_for, sign
from memstream.streams.cluster import Cluster, ClusterMap, Worker, assignor_for, plan
from memstream.streams.cluster_trust import (
    GroupState,
    Trust,
    allowed_url,
    opened_map,
    sealed_map,
)

pytestmark = pytest.mark.unit

SECRET = "cluster-secret-0123456789abcdef0123456789"
OTHER_SECRET = "another-secret-0123456789abcdef0123456789"
TOPICS = ("memstream.chat", "memstream.memory-changes")
A, B = Worker("w-a", "http://w-a:8000"), Worker("w-b", "https://w-b:8443")
STATE_A = GroupState("g", 5, "m-a")  # A's consumer's join


class FakeCluster:
    def partitions_for_topic(self, topic: str) -> set[int]:
        return set(range(4))


class Ends:
    """The injected end of a worker (halt in a real one): what it was ended with."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def __call__(self, reason: str, code: int) -> None:
        self.calls.append((reason, code))


def trust(secret: str | None, ends: Ends | None = None) -> Trust:
    return Trust.of(secret, ends or Ends())


def wire(raw: bytes, topics=TOPICS) -> ConsumerProtocolMemberMetadata:
    """A member's metadata as the leader gets it (encoded by the member, decoded)."""
    return ConsumerProtocolMemberMetadata.decode(
        ConsumerProtocolMemberMetadata(0, list(topics), raw).encode())


def meta_of(worker: Worker, t: Trust | None) -> ConsumerProtocolMemberMetadata:
    assignor = assignor_for(worker, 1, lambda _: None, t, state=lambda: GroupState("g", 0, "m"))
    return ConsumerProtocolMemberMetadata.decode(assignor.metadata(list(TOPICS)).encode())


def decoded(a: ConsumerProtocolMemberAssignment) -> ConsumerProtocolMemberAssignment:
    return ConsumerProtocolMemberAssignment.decode(a.encode())


def partitions(a: ConsumerProtocolMemberAssignment) -> dict[str, list[int]]:
    return {t: list(ps) for t, ps in decoded(a).assignment}


def envelope_map(data: bytes) -> ClusterMap:
    return ClusterMap.from_bytes(json.loads(data)["map"].encode())


def forged_member(worker_id: str, url: str, sig: str | None) -> bytes:
    fields: dict[str, object] = {"worker": worker_id, "url": url, "single": False,
                                 "since": 0.0}
    if sig is not None:
        fields["sig"] = sign(key_for(OTHER_SECRET, MEMBER), worker_id, url, "0",
                             "0.000000") if sig == "other-secret" else sig
    return json.dumps(fields).encode()


# --- the leader takes only members that prove themselves ------------------------------------

def test_members_with_the_secret_are_taken_and_get_a_signed_map():
    t = trust(SECRET)
    leader = assignor_for(A, 1, lambda _: None, t, state=lambda: STATE_A)
    members = {"m-a": meta_of(A, t), "m-b": meta_of(B, trust(SECRET))}
    assert "sig" in json.loads(members["m-a"].user_data)
    out = leader.assign(FakeCluster(), members)
    assert partitions(out["m-a"]) == {t: [0, 1] for t in TOPICS}
    assert partitions(out["m-b"]) == {t: [2, 3] for t in TOPICS}
    sent = decoded(out["m-b"]).user_data
    assert opened_map(sent, key_for(SECRET, MAP), state=GroupState("g", 5, "m-b"), me="w-b",
                      now=time.time()) == json.loads(sent)["map"].encode()
    assert envelope_map(decoded(out["m-b"]).user_data).workers == {
        "w-a": "http://w-a:8000", "w-b": "https://w-b:8443"}


@pytest.mark.parametrize("rogue", ["bad-signature", "unsigned", "other-secret",
                                   "no-metadata", "not-http"])
def test_a_rogue_member_gets_no_partitions_is_not_in_the_map_and_is_logged_once(
        rogue, caplog):
    data = {"bad-signature": forged_member("w-0", "http://elsewhere/", "00" * 32),
            "unsigned": forged_member("w-0", "http://elsewhere/", None),
            "other-secret": forged_member("w-0", "http://elsewhere/", "other-secret"),
            "no-metadata": b"",
            "not-http": None}[rogue]
    t = trust(SECRET)
    # not-http: signed with the secret, but a URL the API must not forward to
    members_rogue = (meta_of(Worker("w-0", "file:///etc/passwd"), t) if data is None
                     else wire(data))
    leader = assignor_for(A, 1, lambda _: None, t)
    members = {"m-a": meta_of(A, t), "m-b": meta_of(B, t), "rogue-1": members_rogue}
    with caplog.at_level(logging.WARNING, logger="memstream.streams.cluster"):
        out = leader.assign(FakeCluster(), members)
        again = leader.assign(FakeCluster(), members)
    for result in (out, again):
        assert partitions(result["rogue-1"]) == {t: [] for t in TOPICS}
        assert b"map" not in decoded(result["rogue-1"]).user_data  # no map for it
        the_map = envelope_map(decoded(result["m-a"]).user_data)
        assert set(the_map.workers) == {"w-a", "w-b"}
        assert "http://elsewhere/" not in the_map.workers.values()
        assert set(the_map.owners.values()) == {"w-a", "w-b"}
        assert all(set(s) <= {"w-a", "w-b"} for s in the_map.standbys.values())
        assert sorted(p for m in ("m-a", "m-b") for p in partitions(result[m])[TOPICS[0]]) \
            == [0, 1, 2, 3]
    said = [r for r in caplog.records if "rogue-1" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING
    assert SECRET not in caplog.text and OTHER_SECRET not in caplog.text


def test_a_rogue_claiming_a_real_workers_id_does_not_change_its_url():
    t = trust(SECRET)
    members = {"m-a": meta_of(A, t), "m-b": meta_of(B, t),
               "rogue": wire(forged_member("w-b", "http://elsewhere/", "00" * 32))}
    out = assignor_for(A, 1, lambda _: None, t).assign(FakeCluster(), members)
    assert envelope_map(decoded(out["m-a"]).user_data).workers["w-b"] == "https://w-b:8443"
    assert partitions(out["rogue"]) == {t: [] for t in TOPICS}


def test_only_http_and_https_urls_are_allowed():
    assert allowed_url("http://w:8000") and allowed_url("https://w.example/x")
    for url in ("", "file:///etc/passwd", "ftp://w", "http://", "//w:8000", "w:8000",
                "javascript:alert(1)", "http://[::1"):
        assert not allowed_url(url), url


# --- a worker routes only with a map that verifies -----------------------------------------

def _signed(the_map: ClusterMap, secret: str, state: GroupState = STATE_A,
            members: dict[str, str] | None = None, made_at: float | None = None) -> bytes:
    return sealed_map(the_map.to_bytes(), key_for(secret, MAP), state=state,
                      members={"m-a": "w-a", "m-b": "w-b"} if members is None else members,
                      made_at=time.time() if made_at is None else made_at)


def _received_by(cluster: Cluster, user_data: bytes, state: GroupState | None = STATE_A,
                 rejoins: list[int] | None = None) -> None:
    assignor = assignor_for(cluster.me, 1, lambda m: cluster.update("apply", m), cluster.trust,
                            state=lambda: state,
                            rejoin=lambda: (rejoins if rejoins is not None else []).append(1))
    assignor.on_assignment(ConsumerProtocolMemberAssignment(0, [(TOPICS[0], [0])], user_data))


def test_a_forged_map_is_ignored_and_the_previous_one_kept(caplog):
    ends = Ends()
    cluster = Cluster(A, trust(SECRET, ends))
    good = plan([A, B], range(4), 1, now=1.0)
    _received_by(cluster, _signed(good, SECRET))
    assert cluster.routing() == good
    evil = ClusterMap({"w-a": "http://w-a:8000", "w-b": "http://elsewhere/"},
                      {0: "w-a", 1: "w-a", 2: "w-b", 3: "w-b"}, {}, 2.0)
    tampered = json.loads(_signed(good, SECRET))
    tampered["map"] = tampered["map"].replace("https://w-b:8443", "http://elsewhere/")
    forgeries = {
        "other secret": _signed(evil, OTHER_SECRET),
        "unsigned": evil.to_bytes(),
        "tampered": json.dumps(tampered).encode(),
        "no signature": json.dumps({"v": 2, "map": evil.to_bytes().decode(),
                                    "members": {"m-a": "w-a"}}).encode(),
        "of before (v1)": json.dumps({"v": 1, "map": evil.to_bytes().decode(),
                                      "sig": sign(key_for(SECRET, MAP),
                                                  evil.to_bytes().decode())}).encode(),
        "signed, not http": _signed(ClusterMap({"w-a": "http://w-a:8000",
                                                "w-b": "gopher://w-b"}, {0: "w-b"}), SECRET),
        "junk": b"\x00not json",
    }
    with caplog.at_level(logging.WARNING, logger="memstream.streams.cluster"):
        for name, data in forgeries.items():
            _received_by(cluster, data)
            assert cluster.routing() == good, name
            assert cluster.routing().owner_url(2) == "https://w-b:8443", name
    assert len([r for r in caplog.records if "ignored" in r.getMessage()]) == len(forgeries)
    assert ends.calls == []  # a worker with the secret is not ended by a forgery


def test_a_worker_the_leader_did_not_take_is_told_and_keeps_working(caplog):
    ends = Ends()
    cluster = Cluster(A, trust(OTHER_SECRET, ends))
    leader = assignor_for(B, 1, lambda _: None, trust(SECRET))
    out = leader.assign(FakeCluster(), {"m-b": meta_of(B, trust(SECRET)),
                                        "m-a": meta_of(A, cluster.trust)})
    with caplog.at_level(logging.WARNING, logger="memstream.streams.cluster"):
        _received_by(cluster, decoded(out["m-a"]).user_data)
    assert cluster.routing() is None and ends.calls == []
    assert "MEMSTREAM_CLUSTER_SECRET" in caplog.text


# --- without the secret: alone, or ended -----------------------------------------------------

def test_a_single_worker_without_the_secret_works_as_before():
    ends = Ends()
    cluster = Cluster(A, trust(None, ends))
    leader = assignor_for(A, None, lambda m: cluster.update("apply", m), cluster.trust)
    mine = meta_of(A, cluster.trust)
    assert json.loads(mine.user_data) == {"worker": "w-a", "url": "http://w-a:8000",
                                          "single": False, "since": 0.0}
    out = leader.assign(FakeCluster(), {"m-a": mine})
    assert partitions(out["m-a"]) == {t: [0, 1, 2, 3] for t in TOPICS}
    leader.on_assignment(decoded(out["m-a"]))
    assert cluster.routing() == ClusterMap.from_bytes(decoded(out["m-a"]).user_data)
    assert cluster.routing().owned_by("w-a") == {0, 1, 2, 3}
    assert ends.calls == []


def _refused(ends: Ends) -> str:
    assert len(ends.calls) == 1, ends.calls
    line, code = ends.calls[0]
    assert code == 78 and "MEMSTREAM_CLUSTER_SECRET" in line and "\n" not in line
    assert SECRET not in line
    return line


def test_a_leader_without_the_secret_that_sees_another_worker_ends_itself():
    ends = Ends()
    leader = assignor_for(A, None, lambda _: None, trust(None, ends))
    leader.assign(FakeCluster(), {"m-a": meta_of(A, None), "m-b": meta_of(B, None)})
    assert "w-b" in _refused(ends)


def test_a_worker_without_the_secret_handed_a_map_of_two_workers_ends_itself():
    ends = Ends()
    cluster = Cluster(A, trust(None, ends))
    _received_by(cluster, plan([A, B], range(4), 1).to_bytes())
    assert "w-b" in _refused(ends)
    assert cluster.routing() is None


@pytest.mark.parametrize("what", ["signed map", "not taken"])
def test_a_worker_without_the_secret_in_a_group_that_signs_ends_itself(what):
    ends = Ends()
    cluster = Cluster(A, trust(None, ends))
    if what == "signed map":
        data = _signed(plan([A], range(4), 1), SECRET)
    else:  # the leader has the secret; this worker's metadata is not signed
        out = assignor_for(B, 1, lambda _: None, trust(SECRET)).assign(
            FakeCluster(), {"m-b": meta_of(B, trust(SECRET)), "m-a": meta_of(A, cluster.trust)})
        assert partitions(out["m-a"]) == {t: [] for t in TOPICS}
        data = decoded(out["m-a"]).user_data
    _received_by(cluster, data)
    _refused(ends)
    assert cluster.routing() is None


def test_the_trust_never_shows_its_keys():
    t = trust(SECRET)
    assert t.signs and not trust(None).signs
    assert SECRET not in repr(t) and t.member_key is not None
    assert t.member_key.hex() not in repr(t) and t.member_key != t.map_key
