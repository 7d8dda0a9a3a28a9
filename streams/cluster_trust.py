"""Workers prove who they are in their groups (issue 29): the signed bytes of the group
protocol and the checks on them. Pure; :mod:`streams.cluster` is the shell that logs and
ends the worker.

A member's subscription user data (JSON), made at each join (``at``: then)::

    {"worker": <id>, "url": <API URL>, "single": <bool>, "since": <seconds>,
     "at": <seconds>, "group": <group id>, "sig": <hex>}

    sig = sign(key_for(secret, MEMBER), worker, url, "1"|"0", "%.6f" % since,
               "%.6f" % at, group)

The member id is not known when the metadata is made (the coordinator assigns it during
the join): the broker hands the leader each member id with that member's metadata
(JoinGroup), and the **leader** binds them, in the map it signs. The leader takes a member
only when its metadata verifies, names this group, and was made less than
``member_max_age_s`` ago (at most the rebalance timeout plus a margin: a member makes it
when it joins and waits at most that long for the others), at most
:data:`CLOCK_SKEW_S` ahead; of members claiming one worker id it takes the newest metadata
(ties: the greatest member id). So metadata copied from DescribeGroups and replayed by
another member id either loses to the live worker's newer one, or, once that worker is
gone, is refused past the age bound.

The leader's user data in each member's assignment: without a secret the map's JSON
(:meth:`streams.cluster.ClusterMap.to_bytes`, as before); with one an envelope::

    {"v": 2, "map": <the map's JSON text>, "group": <group id>, "generation": <int>,
     "members": {<member id>: <worker id>, ...}, "made_at": <seconds>, "sig": <hex>}
    sig = sign(key_for(secret, MAP), map text, group, str(generation),
               members as sorted compact JSON, "%.6f" % made_at)
    {"v": 2, "ignored": true}      to a member the leader did not take (no partitions)

A worker routes with a map only when it verifies and was made for this worker's own join:
its group, the generation its consumer joined, its member id bound to its worker id, made
less than :data:`MAP_MAX_AGE_S` ago. A static member that restarts while its group is
stable gets its old assignment under a new member id and no rebalance (KIP-345): that map
does not name it, so it asks its consumer to rejoin (its metadata is new: a rebalance) and
routes with the map of that generation. Workers without a secret must be alone: a worker
that has none and meets another (or an envelope) ends itself with :func:`secret_refusal`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from memstream.core.cluster_auth import MAP, MEMBER, key_for, sign, verify
from memstream.streams.store_layout import EXIT_SHARED

SECRET_SETTING = "MEMSTREAM_CLUSTER_SECRET"
EXIT_NO_SECRET = EXIT_SHARED  # 78, EX_CONFIG: a setting; a restart alone does not help
ENVELOPE_VERSION = 2
CLOCK_SKEW_S = 60.0  # how far a member's clock may be ahead of the leader's
MAP_MAX_AGE_S = 300.0  # a map made for this join is seconds old (the rest: clocks apart)
MEMBER_MAX_AGE_S = 900.0  # default: the workers' rebalance timeout (300 s+) and a margin


class Untrusted(ValueError):
    """Metadata or a map that does not prove itself: ignored."""


class NotForThisJoin(Untrusted):
    """A verified map made for another generation, group or member id (replayed, or the
    old assignment a restarted static member is handed): a rejoin gets this join's."""


class NeedsSecret(ValueError):
    """A signed envelope reached a worker without the cluster secret."""


def _never(reason: str, code: int) -> None:  # no refusal (callers that check nothing)
    return None


@dataclass(frozen=True)
class GroupState:
    """Where a worker's consumer is in its group: the join the maps it takes are for."""

    group: str
    generation: int
    member_id: str


@dataclass(frozen=True)
class Trust:
    """What a worker signs with and checks by (keys derived from the cluster secret; both
    None without one: then it must be alone), how it ends itself when it is not, its clock
    and how old a member's metadata may be."""

    member_key: bytes | None = None
    map_key: bytes | None = None
    end: Callable[[str, int], None] = _never
    clock: Callable[[], float] = field(default=time.time, compare=False)
    member_max_age_s: float = MEMBER_MAX_AGE_S

    @classmethod
    def of(cls, secret: str | None, end: Callable[[str, int], None], *,
           clock: Callable[[], float] = time.time,
           member_max_age_s: float = MEMBER_MAX_AGE_S) -> Trust:
        if not secret:
            return cls(None, None, end, clock, member_max_age_s)
        return cls(key_for(secret, MEMBER), key_for(secret, MAP), end, clock,
                   member_max_age_s)

    @property
    def signs(self) -> bool:
        return self.member_key is not None

    def __repr__(self) -> str:  # never the keys
        return f"Trust(signs={self.signs})"


def allowed_url(url: str) -> bool:
    """An API URL a worker may advertise (and be forwarded to): ``http(s)://host...``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def _member_parts(raw: Mapping[str, Any]) -> tuple[str, ...]:
    return (str(raw["worker"]), str(raw.get("url", "")), "1" if raw.get("single") else "0",
            f"{float(raw.get('since', 0.0)):.6f}", f"{float(raw.get('at', 0.0)):.6f}",
            str(raw.get("group", "")))


def member_bytes(worker_id: str, url: str, single: bool, since: float,
                 key: bytes | None, *, at: float = 0.0, group: str = "") -> bytes:
    """A member's subscription user data, made ``at`` for ``group`` and signed with ``key``
    (MEMBER) when there is one (without: the fields of before, nothing to bind)."""
    fields: dict[str, Any] = {"worker": worker_id, "url": url, "single": single,
                              "since": since}
    if key is not None:
        fields.update(at=at, group=group)
        fields["sig"] = sign(key, *_member_parts(fields))
    return json.dumps(fields).encode()


def checked_member(data: bytes, key: bytes | None, *, urls: bool = True,
                   now: float | None = None, max_age_s: float = MEMBER_MAX_AGE_S,
                   group: str | None = None) -> dict[str, Any]:
    """The fields of a member's user data: ``ValueError``/``KeyError`` when they are not
    ours; :class:`Untrusted` when ``key`` is given and the signature is missing or wrong,
    it was made for another group than ``group`` or (``now``) more than ``max_age_s``
    before ``now`` or :data:`CLOCK_SKEW_S` after, or (``urls``) the URL is not
    ``http(s)``."""
    raw = json.loads(data or b"{}")
    if not isinstance(raw, dict):
        raise ValueError("not an object")
    parts, sig = _member_parts(raw), raw.get("sig")
    if key is not None:
        if not (isinstance(sig, str) and verify(key, sig, *parts)):
            raise Untrusted("its signature does not verify" if sig else "it is not signed")
        if group is not None and parts[5] != group:
            raise Untrusted("its metadata was made for another group")
        at = float(raw.get("at", 0.0))
        if now is not None and not now - max_age_s <= at <= now + CLOCK_SKEW_S:
            raise Untrusted(f"its metadata was made {now - at:.0f} s ago (at most "
                            f"{max_age_s:.0f} s: replayed, or its clock is off)")
    if urls and not allowed_url(parts[1]):
        raise Untrusted("its URL is not http(s)")
    return raw


def _map_parts(text: str, group: str, generation: int, members: Mapping[str, str],
               made_at: float) -> tuple[str, ...]:
    return (text, group, str(generation),
            json.dumps(dict(sorted(members.items())), separators=(",", ":")),
            f"{made_at:.6f}")


def sealed_map(map_bytes: bytes, key: bytes | None, *, state: GroupState | None = None,
               members: Mapping[str, str] | None = None, made_at: float = 0.0) -> bytes:
    """The user data a taken member gets: the map, in an envelope signed with ``key`` that
    binds the leader's join (``state``: group and generation), the member ids it was made
    for (``members``: member id -> worker id) and its time."""
    if key is None:
        return map_bytes
    text, group = map_bytes.decode(), state.group if state is not None else ""
    generation = state.generation if state is not None else -1
    bound = dict(members or {})
    return json.dumps({"v": ENVELOPE_VERSION, "map": text, "group": group,
                       "generation": generation, "members": bound, "made_at": made_at,
                       "sig": sign(key, *_map_parts(text, group, generation, bound,
                                                    made_at))}).encode()


def ignored_note(key: bytes | None) -> bytes:
    """The user data a member the leader did not take gets (no map: it proved nothing)."""
    return json.dumps({"v": ENVELOPE_VERSION, "ignored": True}).encode() if key else b""


def opened_map(data: bytes, key: bytes | None, *, state: GroupState | None = None,
               me: str = "", now: float = 0.0) -> bytes:
    """The map bytes of an assignment's user data. With ``key``: only those of an envelope
    whose signature verifies (else :class:`Untrusted`) and that was made for this join
    (``state``, this worker ``me``, within :data:`MAP_MAX_AGE_S` of ``now``; else
    :class:`NotForThisJoin`); without: the plain map (an envelope raises
    :class:`NeedsSecret`)."""
    raw = json.loads(data)
    envelope = isinstance(raw, dict) and "v" in raw and ("map" in raw or "ignored" in raw)
    if key is None:
        if envelope:
            raise NeedsSecret("the group's leader signs its map")
        return data
    if not envelope:
        raise Untrusted("the map is not signed")
    if "ignored" in raw:
        raise Untrusted(f"the group's leader did not take this worker: its {SECRET_SETTING} "
                        f"differs from the leader's, its URL is not http(s), or its "
                        f"metadata is too old (its clock?)")
    text, sig, members = raw["map"], raw.get("sig"), raw.get("members")
    if not (isinstance(text, str) and isinstance(members, dict)):
        raise Untrusted("the map's envelope is not one of this version")
    group, generation = str(raw.get("group", "")), int(raw.get("generation", -1))
    made_at = float(raw.get("made_at", 0.0))
    bound = {str(k): str(v) for k, v in members.items()}
    if not (isinstance(sig, str) and raw.get("v") == ENVELOPE_VERSION
            and verify(key, sig, *_map_parts(text, group, generation, bound, made_at))):
        raise Untrusted("the map's signature does not verify")
    if state is None or generation < 0:  # not known here, or to the leader: a rejoin
        # would not tell it
        raise Untrusted("the group membership of this worker or of the leader is not known")
    if (group, generation) != (state.group, state.generation):
        raise NotForThisJoin(f"the map is of generation {generation}, this worker joined "
                             f"generation {state.generation}")
    if bound.get(state.member_id) != me:
        raise NotForThisJoin("the map was not made for this member (a static member's "
                             "earlier assignment, or a replay)")
    if not now - MAP_MAX_AGE_S <= made_at <= now + CLOCK_SKEW_S:
        raise Untrusted(f"the map was made {now - made_at:.0f} s ago (clocks apart?)")
    return text.encode()


def secret_refusal(me: str, seen: str) -> str:
    """The one line a worker without the cluster secret that is not alone ends with."""
    return (f"this worker ({me}) has no {SECRET_SETTING} and {seen}: workers that share "
            f"a group prove who they are with it. Set the same {SECRET_SETTING} (openssl "
            f"rand -hex 32) on every worker, or run one worker")
