"""Records that carry authority prove they were made by a worker: a MAC in a record header.

A tool request makes the pipeline write or erase a user's memories; a job, a decision and a
job result make it extract, apply or move on. Whoever may write those topics could rewrite
memory, so each such record carries ``memstream-mac`` and a record without a valid one
changes nothing (the stages set it aside without its value: :mod:`streams.record_checks`).
Pure: no I/O (the keys come from :mod:`core.record_keys`).

Layout (for other implementations), with ``key_for``, ``sign`` and the length-prefixed
message of :mod:`core.cluster_auth`::

    key        = key_for(secret, "record")
    key id     = first 8 lowercase hex of SHA-256(b"memstream record key id\\x1f" + key)
    parts      = (role, "1" if the record has a key else "0", key bytes or b"",
                  "1" if the record has a value else "0", value bytes or b"")
    header     = "memstream-mac": "v1." + key id + "." + sign(key, *parts)

``role`` is the topic's logical name in the registry (``tool-requests``,
``extraction-jobs``, ``job-results``, ``decisions``), not its physical name (which carries
the deployment's prefix): a record signed for one topic does not verify on another. The
key id says which key signed (the current secret's or ``cluster_secret_previous``'s, during
a rotation); a header with a key id the reader does not hold is refused like a wrong MAC.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from memstream.core.cluster_auth import key_for, sign

HEADER = "memstream-mac"
PURPOSE = "record"
VERSION = "v1"
KEY_ID_CONTEXT = b"memstream record key id\x1f"
# The topics (by role) whose records make the pipeline write, erase or trust something.
SIGNED_ROLES = frozenset({"tool-requests", "extraction-jobs", "job-results", "decisions"})
REASON = "unauthenticated record"


def key_id(key: bytes) -> str:
    """A short public name of a record key (never the key: a hash of it)."""
    return hashlib.sha256(KEY_ID_CONTEXT + key).hexdigest()[:8]


@dataclass(frozen=True)
class RecordKeys:
    """What records are signed with (``signing``: key id and key; None: nothing is signed)
    and verified by (every key id held: the current secret's and the previous one's)."""

    signing: tuple[str, bytes] | None = None
    verifying: Mapping[str, bytes] = field(default_factory=dict)

    @classmethod
    def of(cls, secret: str | None, previous: str | None = None) -> RecordKeys:
        held: dict[str, bytes] = {}
        signing = None
        for n, one in enumerate((secret, previous)):
            if not one:
                continue
            key = key_for(one, PURPOSE)
            held[key_id(key)] = key
            if n == 0:
                signing = (key_id(key), key)
        return cls(signing, held)

    def __repr__(self) -> str:  # never the keys
        return f"RecordKeys(signs={self.signing is not None}, ids={sorted(self.verifying)})"


def _parts(role: str, key: bytes | None, value: bytes | None) -> tuple[str | bytes, ...]:
    return (role, "1" if key is not None else "0", key or b"",
            "1" if value is not None else "0", value or b"")


def mac(keys: RecordKeys, role: str, key: bytes | None, value: bytes | None) -> str:
    """The header value of a record of ``role`` (``keys`` must sign)."""
    if keys.signing is None:
        raise ValueError("signing a record needs the cluster secret")
    kid, secret_key = keys.signing
    return f"{VERSION}.{kid}.{sign(secret_key, *_parts(role, key, value))}"


def header(keys: RecordKeys, role: str, key: bytes | None,
           value: bytes | None) -> tuple[str, bytes]:
    """The ``memstream-mac`` header of a record of ``role``."""
    return HEADER, mac(keys, role, key, value).encode()


def refusal(keys: RecordKeys, role: str, key: bytes | None, value: bytes | None,
            headers: Iterable[tuple[str, bytes]] | None) -> str | None:
    """Why a record of ``role`` is not authentic (None: it is): no MAC header, more than
    one, a malformed one, a key id not held, or a MAC that does not verify."""
    found = [v for k, v in (headers or ()) if k == HEADER]
    if not found:
        return f"{REASON}: no MAC"
    if len(found) > 1:
        return f"{REASON}: more than one MAC header"
    try:
        text = found[0].decode("ascii") if isinstance(found[0], bytes) else ""
    except UnicodeDecodeError:
        text = ""
    version, _, rest = text.partition(".")
    kid, _, signature = rest.partition(".")
    if version != VERSION or not kid or not signature:
        return f"{REASON}: malformed MAC"
    secret_key = keys.verifying.get(kid)
    if secret_key is None:
        return f"{REASON}: MAC under a key this worker does not hold (key id {kid[:8]!r})"
    expected = sign(secret_key, *_parts(role, key, value))
    if not hmac.compare_digest(signature.encode(), expected.encode()):
        return f"{REASON}: invalid MAC"
    return None


def role_of(topic: str, prefix: str) -> str | None:
    """The signed role of physical ``topic`` in a deployment whose topics are named
    ``{prefix}.{role}``; None: its records carry no MAC."""
    head = f"{prefix}."
    if not topic.startswith(head):
        return None
    role = topic[len(head):]
    return role if role in SIGNED_ROLES else None
