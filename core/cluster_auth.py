"""Workers prove who they are: HMAC-SHA256 under keys derived from the cluster secret
(``MEMSTREAM_CLUSTER_SECRET``), one derived key per purpose, so a signature made for one
purpose (a member's metadata, the leader's map, a forwarded request) never verifies as
another's. Pure: no I/O; the time is passed in.

Layout (for other implementations)::

    key(purpose) = HMAC-SHA256(UTF-8(secret), b"memstream cluster v1\\x1f" + UTF-8(purpose))
    message      = b"".join(f"{len(part)}:".encode() + part for part in parts)
    signature    = lowercase hex of HMAC-SHA256(key(purpose), message)

where each part is bytes (text as UTF-8); the length prefixes make the joined message
unambiguous whatever the parts hold.

Purposes: ``member`` and ``map`` (:mod:`streams.cluster_trust`), ``forward`` (below) and
``record``: the ``memstream-mac`` header of the records that carry authority (tool
requests, jobs, decisions, job results), whose parts and header layout are in
:mod:`core.record_auth`.

The signed headers include ``X-Memstream-To``, the worker a forward is for, which checks
it names itself: a captured forward cannot be played at another worker either.

A forwarded request carries :func:`forward_credential`: the sending worker's id, the time
it was made, a random nonce, and a signature over those, the method, the path with its
query, the SHA-256 of the body and every signed header (``X-Memstream-*`` and
``Idempotency-Key``) it is sent with. :func:`check_forward` accepts it for
:data:`CREDENTIAL_TTL_S` seconds either side of the receiver's clock; the receiver keeps the
nonces it has seen for that long, per sending worker (:class:`SeenNonces`), so a captured
request cannot be played twice, and one sender's flood fills only its own share.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections import OrderedDict
from collections.abc import Mapping

CONTEXT = b"memstream cluster v1\x1f"
MEMBER, MAP, FORWARD = "member", "map", "forward"
CREDENTIAL_TTL_S = 60.0
SIGNED_PREFIX = "x-memstream-"
IDEMPOTENCY_KEY = "Idempotency-Key"
CREDENTIAL_HEADER = "X-Memstream-Credential"


def key_for(secret: str, purpose: str) -> bytes:
    """The HMAC key of one purpose (never the secret itself)."""
    if not secret:
        raise ValueError("signing needs the cluster secret")
    return hmac.new(secret.encode(), CONTEXT + purpose.encode(), hashlib.sha256).digest()


def _message(parts: tuple[str | bytes, ...]) -> bytes:
    out = bytearray()
    for part in parts:
        raw = part.encode("utf-8", "surrogatepass") if isinstance(part, str) else part
        out += f"{len(raw)}:".encode() + raw
    return bytes(out)


def sign(key: bytes, *parts: str | bytes) -> str:
    return hmac.new(key, _message(parts), hashlib.sha256).hexdigest()


def verify(key: bytes, signature: str, *parts: str | bytes) -> bool:
    """Never raises: a signature that is not hex text (non-ASCII, not a string) is False."""
    if not isinstance(signature, str) or not signature.isascii():
        return False
    return hmac.compare_digest(signature, sign(key, *parts))


def signed_headers(headers: Mapping[str, str]) -> list[tuple[str, str]]:
    """The headers a forward credential covers: ``X-Memstream-*`` (but the credential) and
    ``Idempotency-Key``, lower-cased names, sorted."""
    out = []
    for name, value in headers.items():
        low = name.lower()
        if low == CREDENTIAL_HEADER.lower():
            continue
        if low.startswith(SIGNED_PREFIX) or low == IDEMPOTENCY_KEY.lower():
            out.append((low, value))
    return sorted(out)


def _forward_parts(worker: str, made_at: str, nonce: str, method: str, target: str,
                   body: bytes, headers: Mapping[str, str]) -> tuple[str, ...]:
    flat = [x for pair in signed_headers(headers) for x in pair]
    return (worker, made_at, nonce, method.upper(), target, hashlib.sha256(body).hexdigest(),
            *flat)


def forward_credential(secret: str, *, worker: str, method: str, target: str, body: bytes,
                       headers: Mapping[str, str], now: float) -> str:
    """The ``X-Memstream-Credential`` value of a forwarded request (``target``: path and
    query as sent; ``headers``: the headers it is sent with)."""
    made_at, nonce = f"{now:.3f}", secrets.token_hex(12)
    signature = sign(key_for(secret, FORWARD),
                     *_forward_parts(worker, made_at, nonce, method, target, body, headers))
    return f"v1 {made_at} {nonce} {signature}"


def check_forward(secret: str, credential: str, *, worker: str, method: str, target: str,
                  body: bytes, headers: Mapping[str, str], now: float,
                  seen: SeenNonces | None = None) -> bool:
    """True when ``credential`` was made with the cluster secret by ``worker`` for exactly
    this request, within :data:`CREDENTIAL_TTL_S` of ``now``, and (with ``seen``) its nonce
    was not used before."""
    parts = credential.split(" ") if isinstance(credential, str) else []
    if len(parts) != 4 or parts[0] != "v1":
        return False
    _, made_at, nonce, signature = parts
    try:
        when = float(made_at)
    except ValueError:
        return False
    if abs(now - when) > CREDENTIAL_TTL_S:
        return False
    if not verify(key_for(secret, FORWARD), signature,
                  *_forward_parts(worker, made_at, nonce, method, target, body, headers)):
        return False
    return seen is None or seen.first(nonce, now, worker)


class SeenNonces:
    """Nonces of credentials accepted in the last :data:`CREDENTIAL_TTL_S`, per sending
    worker, each sender's bounded on its own (``most``): a sender that fills its share (a
    flood of forwards one tenant's key made it send) is refused, never forgotten, and every
    other worker's forwards go on. At most ``senders`` senders are held (a verified
    credential names one: only workers with the cluster secret add one); past that the one
    seen least recently is dropped with its nonces only when all of them have expired."""

    def __init__(self, ttl_s: float = 2 * CREDENTIAL_TTL_S, most: int = 100_000,
                 senders: int = 1024) -> None:
        self._ttl, self._most, self._senders = ttl_s, most, senders
        self._seen: OrderedDict[str, OrderedDict[str, float]] = OrderedDict()

    def first(self, nonce: str, now: float, sender: str = "") -> bool:
        """True the first time ``nonce`` is seen from ``sender``; False again, and False for
        every new one while ``most`` unexpired nonces of that sender are held."""
        mine = self._seen.get(sender)
        if mine is None:
            self._expire(now)
            if len(self._seen) >= self._senders:
                return False
            mine = self._seen[sender] = OrderedDict()
        self._seen.move_to_end(sender)
        while mine and next(iter(mine.values())) < now - self._ttl:
            mine.popitem(last=False)
        if nonce in mine or len(mine) >= self._most:
            return False
        mine[nonce] = now
        return True

    def held(self, sender: str) -> int:
        return len(self._seen.get(sender, ()))

    def _expire(self, now: float) -> None:
        """Senders whose every nonce has expired, forgotten."""
        for sender in [s for s, mine in self._seen.items()
                       if not mine or next(reversed(mine.values())) < now - self._ttl]:
            del self._seen[sender]
