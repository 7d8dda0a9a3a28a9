"""Which worker owns which partition, and where its API is: one map the whole cluster shares.

Every stage loop (ingest, extract, apply, access) is a consumer group of its own. With the
range assignor of the client the groups order their members by member id, which the broker
makes up at each join, so partition *p* of the ingest group and of the apply group could
land on two workers. The embedded store's shard of *p* lives with its apply stage, and the
extract and access stages read and write that shard; the API's window and tool waits live
with the ingest stage. So every group assigns with :class:`WorkerAssignor`: members in the
order of their **worker id** (the same in every group), partitions by range over them. The
same workers give the same map in every group, whatever the broker's member ids.

The group's leader puts the whole map (:class:`ClusterMap`: owner and standbys of every
partition, every worker's API URL) into each member's assignment, so every worker knows
where any user's partition is served (the API forwards to it) and which shards it keeps
warm as a standby. :func:`plan` is pure; the assignor is a thin shell over it.

Workers prove who they are (:mod:`streams.cluster_trust`): with ``MEMSTREAM_CLUSTER_SECRET``
each member signs its metadata (with the time it joined and its group) and the leader takes
only members whose metadata verifies, is recent and whose URL is ``http(s)``, one member per
worker id (the others: no partitions, not in the map); the leader signs the map bound to
its group, generation, time and the member ids it was made for, and a worker routes only
with a map that verifies and was made for its own join (:meth:`bind` gives the assignor its
consumer's group, generation and member id). Without the secret a worker must be alone: one
that meets another ends itself (exit 78).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)

from memstream.core.errors import describe
from memstream.streams.cluster_trust import (
    EXIT_NO_SECRET,
    GroupState,
    NeedsSecret,
    NotForThisJoin,
    Trust,
    Untrusted,
    allowed_url,
    checked_member,
    ignored_note,
    member_bytes,
    opened_map,
    sealed_map,
    secret_refusal,
)

log = logging.getLogger(__name__)
ASSIGNOR_NAME = "memstream-workers"


@dataclass(frozen=True)
class Worker:
    worker_id: str
    url: str
    single: bool = False  # runs the single-store layout (streams.store_layout): alone only
    since: float = 0.0  # when it started (of two single-layout workers, the newer refuses)


@dataclass(frozen=True)
class ClusterMap:
    """One generation of a group's assignment: per partition its owner and standbys."""

    workers: dict[str, str] = field(default_factory=dict)  # worker id -> API URL
    owners: dict[int, str] = field(default_factory=dict)  # partition -> worker id
    standbys: dict[int, tuple[str, ...]] = field(default_factory=dict)
    made_at: float = 0.0
    single: dict[str, float] = field(default_factory=dict)  # single-layout worker -> since

    def owner_url(self, partition: int) -> str | None:
        owner = self.owners.get(partition)
        return self.workers.get(owner) if owner is not None else None

    def owned_by(self, worker_id: str) -> set[int]:
        return {p for p, w in self.owners.items() if w == worker_id}

    def standby_of(self, worker_id: str) -> set[int]:
        return {p for p, ws in self.standbys.items() if worker_id in ws}

    def to_bytes(self) -> bytes:
        return json.dumps({"workers": self.workers,
                           "owners": {str(p): w for p, w in self.owners.items()},
                           "standbys": {str(p): list(w) for p, w in self.standbys.items()},
                           "made_at": self.made_at, "single": self.single},
                          sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> ClusterMap:
        raw = json.loads(data)
        return cls({str(k): str(v) for k, v in raw["workers"].items()},
                   {int(p): str(w) for p, w in raw["owners"].items()},
                   {int(p): tuple(str(x) for x in w) for p, w in raw["standbys"].items()},
                   float(raw.get("made_at", 0.0)),
                   {str(k): float(v) for k, v in raw.get("single", {}).items()})


def plan(workers: Iterable[Worker], partitions: Iterable[int], standby_replicas: int | None,
         now: float = 0.0) -> ClusterMap:
    """Range over the workers in id order; the standbys of a partition are the next workers
    after its owner (``None`` replicas: 1 when there are several workers)."""
    ordered = sorted({w.worker_id: w for w in workers}.values(), key=lambda w: w.worker_id)
    parts = sorted(set(partitions))
    single = {w.worker_id: w.since for w in ordered if w.single}
    if not ordered:
        return ClusterMap(made_at=now)
    n = len(ordered)
    replicas = (1 if n > 1 else 0) if standby_replicas is None else standby_replicas
    replicas = min(replicas, n - 1)
    per, extra = divmod(len(parts), n)
    owners: dict[int, str] = {}
    standbys: dict[int, tuple[str, ...]] = {}
    start = 0
    for i, w in enumerate(ordered):
        length = per + (1 if i < extra else 0)
        for p in parts[start:start + length]:
            owners[p] = w.worker_id
            standbys[p] = tuple(ordered[(i + j) % n].worker_id for j in range(1, replicas + 1))
        start += length
    return ClusterMap({w.worker_id: w.url for w in ordered}, owners, standbys, now, single)


def group_state(consumer: Any) -> GroupState | None:
    """The group, generation and member id of ``consumer``'s current join (aiokafka's
    coordinator sets them before it asks its assignor to assign or hands it an
    assignment); None before its first join."""
    coordinator = getattr(consumer, "_coordinator", None)
    group = getattr(coordinator, "group_id", None)
    generation = getattr(coordinator, "generation", None)
    member = getattr(coordinator, "member_id", None)
    if not (isinstance(group, str) and isinstance(generation, int) and generation >= 0
            and isinstance(member, str) and member):
        return None
    return GroupState(group, generation, member)


def _nobody() -> GroupState | None:
    return None


def _no_rejoin() -> None:
    return None


@dataclass
class _Joined:
    """How an assignor reads its consumer's join and asks for another (``bind``)."""

    state: Callable[[], GroupState | None]
    rejoin: Callable[[], None]
    group: str = ""  # known before the first join (the member id and generation are not)


def assignor_for(worker: Worker, standby_replicas: int | None,
                 on_map: Callable[[ClusterMap], None],
                 trust: Trust | None = None,
                 state: Callable[[], GroupState | None] = _nobody,
                 rejoin: Callable[[], None] = _no_rejoin,
                 ) -> type[AbstractPartitionAssignor]:
    """An assignor class (the client takes classes) that announces ``worker`` and hands
    every map it receives (and, with ``trust``, that proves itself and was made for this
    join: :func:`received`) to ``on_map``. ``trust`` None: nothing signed or checked (as
    before issue 29). ``state``/``rejoin``: its consumer's join and how to ask for another
    (set by ``bind(consumer)``)."""
    warned: set[str] = set()  # the members this leader said it ignores (said once)
    joined = _Joined(state, rejoin)

    class _WorkerAssignor(AbstractPartitionAssignor):
        name = ASSIGNOR_NAME
        version = 0

        @classmethod
        def bind(cls, consumer: Any) -> None:
            """The consumer this assignor assigns for: its joins bind the maps."""
            joined.group = str(getattr(consumer, "_group_id", None) or "")
            joined.state = lambda: group_state(consumer)
            joined.rejoin = lambda: consumer._coordinator.request_rejoin()

        @classmethod
        def metadata(cls, topics: Iterable[str]) -> ConsumerProtocolMemberMetadata:
            key = trust.member_key if trust is not None else None
            now = joined.state()
            me = member_bytes(worker.worker_id, worker.url, worker.single, worker.since,
                              key, at=trust.clock() if trust is not None else 0.0,
                              group=joined.group or (now.group if now is not None else ""))
            return ConsumerProtocolMemberMetadata(cls.version, list(topics), me)

        @classmethod
        def assign(cls, cluster: Any, members: Mapping[str, ConsumerProtocolMemberMetadata],
                   ) -> dict[str, ConsumerProtocolMemberAssignment]:
            return assign(cluster, members, standby_replicas, trust, warned,
                          worker.worker_id, joined.state())

        @classmethod
        def on_assignment(cls, assignment: ConsumerProtocolMemberAssignment) -> None:
            if assignment.user_data:
                the_map = received(assignment.user_data, worker.worker_id, trust,
                                   joined.state(), joined.rejoin)
                if the_map is not None:
                    on_map(the_map)

    return _WorkerAssignor


def admitted(members: Mapping[str, ConsumerProtocolMemberMetadata], trust: Trust | None,
             state: GroupState | None = None,
             ) -> tuple[dict[str, Worker], dict[str, tuple[str, str]]]:
    """Pure: per member id the worker it is; and the members not taken (with ``trust``:
    metadata that does not verify under its key, made for another group or too long ago,
    a URL not ``http(s)``, or a worker id a member with newer metadata claims too), per
    member id (claimed worker id, why). Without ``trust`` a member without our metadata is
    taken as a worker named by its member id, with no URL (as before issue 29)."""
    workers: dict[str, Worker] = {}
    ignored: dict[str, tuple[str, str]] = {}
    made: dict[str, tuple[float, str]] = {}  # member id -> (metadata time, member id)
    signs = trust is not None and trust.signs
    for member_id, meta in members.items():
        try:
            if trust is None:
                raw = checked_member(meta.user_data, None, urls=False)
            else:
                raw = checked_member(
                    meta.user_data, trust.member_key, now=trust.clock() if signs else None,
                    max_age_s=trust.member_max_age_s,
                    group=state.group if signs and state is not None else None)
            workers[member_id] = Worker(str(raw["worker"]), str(raw.get("url", "")),
                                        bool(raw.get("single", False)),
                                        float(raw.get("since", 0.0)))
            made[member_id] = (float(raw.get("at", 0.0)), member_id)
        except Untrusted as exc:
            ignored[member_id] = (_claimed(meta.user_data), str(exc))
        except (ValueError, KeyError, TypeError):  # not our metadata
            if trust is None:
                workers[member_id] = Worker(member_id, "")
            else:
                ignored[member_id] = ("", "no worker metadata")
    if signs:  # one member per worker id: the newest metadata
        newest: dict[str, str] = {}
        for member_id in sorted(workers, key=made.__getitem__):
            newest[workers[member_id].worker_id] = member_id
        for member_id in set(workers) - set(newest.values()):
            ignored[member_id] = (workers.pop(member_id).worker_id, "its worker id is "
                                  "claimed by a member with newer metadata (a replay?)")
    return workers, ignored


def _claimed(data: bytes | None) -> str:
    try:
        return str(json.loads(data or b"{}")["worker"])[:80]
    except (ValueError, KeyError, TypeError):
        return ""


def assign(cluster: Any, members: Mapping[str, ConsumerProtocolMemberMetadata],
           standby_replicas: int | None, trust: Trust | None = None,
           warned: set[str] | None = None, me: str = "", state: GroupState | None = None,
           ) -> dict[str, ConsumerProtocolMemberAssignment]:
    """The leader's work: the members' worker ids, the plan, each taken member its
    partitions of every topic it subscribes to and the whole map (signed with ``trust``'s
    key); a member not taken (:func:`admitted`) no partition and no map, said once per
    member in ``warned``. A leader (``me``) without the secret (``trust`` that does not
    sign) that sees another worker among the members ends itself. The signed map binds
    ``state`` (the leader's join: group, generation) and the member ids it was made for."""
    workers, ignored = admitted(members, trust, state)
    if trust is not None and not trust.signs:
        seen = {w.worker_id for w in workers.values()} | {c or m for m, (c, _) in ignored.items()}
        if len(seen - {me}) > (0 if me else 1):
            trust.end(secret_refusal(me or "the group's leader",
                                     f"its group has other workers ({_names(seen - {me})})"),
                      EXIT_NO_SECRET)
    for member_id, (claimed, why) in ignored.items():
        if warned is None or member_id not in warned:
            log.warning("group member %r (claims worker %r) ignored: %s; it gets no "
                        "partitions and is not in the cluster map", member_id, claimed, why)
            if warned is not None:
                if len(warned) > 10_000:
                    warned.clear()
                warned.add(member_id)
    topics = sorted({t for m in members.values() for t in m.subscription})
    parts: set[int] = set()
    for topic in topics:
        parts |= set(cluster.partitions_for_topic(topic) or ())
    now = trust.clock() if trust is not None else time.time()
    the_map = plan(workers.values(), parts, standby_replicas, now)
    key = trust.map_key if trust is not None else None
    bound = {m: w.worker_id for m, w in workers.items()}
    sealed = sealed_map(the_map.to_bytes(), key, state=state, members=bound, made_at=now)
    note = ignored_note(key)
    out: dict[str, ConsumerProtocolMemberAssignment] = {}
    for member_id, meta in members.items():
        taken = member_id in workers
        mine = the_map.owned_by(workers[member_id].worker_id) if taken else set()
        by_topic = [(t, sorted(p for p in (cluster.partitions_for_topic(t) or ()) if p in mine))
                    for t in sorted(meta.subscription)]
        out[member_id] = ConsumerProtocolMemberAssignment(0, by_topic, sealed if taken else note)
    return out


def _names(ids: Iterable[str]) -> str:
    return ", ".join(repr(i)[1:-1][:80] for i in sorted(ids))


def received(data: bytes, me: str, trust: Trust | None, state: GroupState | None = None,
             rejoin: Callable[[], None] = _no_rejoin) -> ClusterMap | None:
    """The map this worker routes with from its assignment's user data, or None (it keeps
    its previous one; logged). With ``trust``: signed by a leader with the secret (if this
    worker has one), made for this worker's join (``state``; one made for another join
    asks for a rejoin: ``rejoin``) and every URL ``http(s)``; a worker without the secret
    that gets a signed envelope or a map of other workers ends itself."""
    try:
        key = trust.map_key if trust else None
        the_map = ClusterMap.from_bytes(opened_map(
            data, key, state=state, me=me, now=trust.clock() if trust else 0.0))
        if trust is not None:
            bad = sorted(w for w, url in the_map.workers.items() if not allowed_url(url))
            if bad:
                raise Untrusted(f"URL of worker(s) {_names(bad)} not http(s)")
    except NeedsSecret as exc:
        if trust is not None:
            trust.end(secret_refusal(me, str(exc)), EXIT_NO_SECRET)
        else:
            log.warning("cluster map not read (%s)", describe(exc))
        return None
    except NotForThisJoin as exc:  # a static member's restart does this: not a warning
        log.info("cluster map ignored (%s); rejoining for one of this join", describe(exc))
        rejoin()
        return None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        log.warning("cluster map ignored (%s); routing with the previous one", describe(exc))
        return None
    others = set(the_map.workers) - {me}
    if trust is not None and not trust.signs and others:
        trust.end(secret_refusal(me, f"its group has other workers ({_names(others)})"),
                  EXIT_NO_SECRET)
        return None
    return the_map


def worker_of(instance_id: str, url: str, *, single: bool = False,
              since: float = 0.0) -> Worker:
    """This process as a member: its static instance id (a random one without)."""
    return Worker(instance_id or f"anon-{uuid.uuid4().hex[:12]}", url, single, since)


def must_leave(the_map: ClusterMap, me: Worker) -> set[str]:
    """The other workers that make a single-layout worker ``me`` end itself (empty: it may
    go on): every other worker, unless all of them are single-layout workers newer than it
    (they end themselves). Not single: never."""
    if not me.single:
        return set()
    others = set(the_map.workers) - {me.worker_id}
    mine = (me.since, me.worker_id)
    if all(w in the_map.single and (the_map.single[w], w) > mine for w in others):
        return set()
    return others


class Cluster:
    """The latest map each stage's group handed this worker (the API routes with it), and
    what its groups' maps are checked by (``trust``; None: nothing checked)."""

    def __init__(self, me: Worker, trust: Trust | None = None) -> None:
        self.me = me
        self.trust = trust
        self.maps: dict[str, ClusterMap] = {}
        self.listeners: list[Callable[[str, ClusterMap], None]] = []

    def update(self, stage: str, the_map: ClusterMap) -> None:
        self.maps[stage] = the_map
        for listener in self.listeners:
            listener(stage, the_map)

    def routing(self, prefer: tuple[str, ...] = ("apply", "ingest")) -> ClusterMap | None:
        for stage in prefer:
            if stage in self.maps:
                return self.maps[stage]
        return None
