"""Workers prove who they are in their groups (issue 29): the signed bytes of the group
protocol and the checks on them. Pure; :mod:`streams.cluster` is the shell that logs and
ends the worker.

A member's subscription user data (JSON; an old worker's, without ``sig``, reads the same)::

    {"worker": <id>, "url": <API URL>, "single": <bool>, "since": <seconds>, "sig": <hex>}

    sig = cluster_auth.sign(key_for(secret, MEMBER), worker, url, "1"|"0", "%.6f" % since)

The leader's user data in each member's assignment: without a secret the map's JSON
(:meth:`streams.cluster.ClusterMap.to_bytes`, as before); with one an envelope::

    {"v": 1, "map": <the map's JSON text>, "sig": sign(key_for(secret, MAP), map text)}
    {"v": 1, "ignored": true}      to a member the leader did not take (no partitions)

So a map a worker routes with names only members whose metadata verified, and was made by
a leader that holds the secret. Workers without a secret must be alone: a worker that has
none and meets another (or an envelope) ends itself with :func:`secret_refusal`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from memstream.core.cluster_auth import MAP, MEMBER, key_for, sign, verify
from memstream.streams.store_layout import EXIT_SHARED

SECRET_SETTING = "MEMSTREAM_CLUSTER_SECRET"
EXIT_NO_SECRET = EXIT_SHARED  # 78, EX_CONFIG: a setting; a restart alone does not help
ENVELOPE_VERSION = 1


class Untrusted(ValueError):
    """Metadata or a map that does not prove itself: ignored."""


class NeedsSecret(ValueError):
    """A signed envelope reached a worker without the cluster secret."""


def _never(reason: str, code: int) -> None:  # no refusal (callers that check nothing)
    return None


@dataclass(frozen=True)
class Trust:
    """What a worker signs with and checks by (keys derived from the cluster secret; both
    None without one: then it must be alone) and how it ends itself when it is not."""

    member_key: bytes | None = None
    map_key: bytes | None = None
    end: Callable[[str, int], None] = _never

    @classmethod
    def of(cls, secret: str | None, end: Callable[[str, int], None]) -> Trust:
        if not secret:
            return cls(None, None, end)
        return cls(key_for(secret, MEMBER), key_for(secret, MAP), end)

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
            f"{float(raw.get('since', 0.0)):.6f}")


def member_bytes(worker_id: str, url: str, single: bool, since: float,
                 key: bytes | None) -> bytes:
    """A member's subscription user data, signed with ``key`` (MEMBER) when there is one."""
    fields: dict[str, Any] = {"worker": worker_id, "url": url, "single": single,
                              "since": since}
    if key is not None:
        fields["sig"] = sign(key, *_member_parts(fields))
    return json.dumps(fields).encode()


def checked_member(data: bytes, key: bytes | None, *, urls: bool = True) -> dict[str, Any]:
    """The fields of a member's user data: ``ValueError``/``KeyError`` when they are not
    ours; :class:`Untrusted` when ``key`` is given and the signature is missing or wrong,
    or (``urls``) the URL is not ``http(s)``."""
    raw = json.loads(data or b"{}")
    if not isinstance(raw, dict):
        raise ValueError("not an object")
    parts, sig = _member_parts(raw), raw.get("sig")
    if key is not None and not (isinstance(sig, str) and verify(key, sig, *parts)):
        raise Untrusted("its signature does not verify" if sig else "it is not signed")
    if urls and not allowed_url(parts[1]):
        raise Untrusted("its URL is not http(s)")
    return raw


def sealed_map(map_bytes: bytes, key: bytes | None) -> bytes:
    """The user data a taken member gets: the map, in a signed envelope with ``key``."""
    if key is None:
        return map_bytes
    text = map_bytes.decode()
    return json.dumps({"v": ENVELOPE_VERSION, "map": text, "sig": sign(key, text)}).encode()


def ignored_note(key: bytes | None) -> bytes:
    """The user data a member the leader did not take gets (no map: it proved nothing)."""
    return json.dumps({"v": ENVELOPE_VERSION, "ignored": True}).encode() if key else b""


def opened_map(data: bytes, key: bytes | None) -> bytes:
    """The map bytes of an assignment's user data. With ``key``: only those of an envelope
    whose signature verifies (else :class:`Untrusted`); without: the plain map (an
    envelope raises :class:`NeedsSecret`)."""
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
                        f"differs from the leader's, or its URL is not http(s)")
    text, sig = raw["map"], raw.get("sig")
    if not (isinstance(text, str) and isinstance(sig, str) and verify(key, sig, text)):
        raise Untrusted("the map's signature does not verify")
    return text.encode()


def secret_refusal(me: str, seen: str) -> str:
    """The one line a worker without the cluster secret that is not alone ends with."""
    return (f"this worker ({me}) has no {SECRET_SETTING} and {seen}: workers that share "
            f"a group prove who they are with it. Set the same {SECRET_SETTING} (openssl "
            f"rand -hex 32) on every worker, or run one worker")
