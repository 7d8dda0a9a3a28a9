"""The cluster's signatures: a forward credential binds its request and is taken once."""

from __future__ import annotations

import pytest

from memstream.core.cluster_auth import SeenNonces, check_forward, forward_credential

pytestmark = pytest.mark.unit
SECRET = "cluster-secret-0123456789abcdef-0123"
HEADERS = {"X-Memstream-Forwarded": "A", "X-Memstream-To": "B"}


def credential(now: float = 100.0, **kw: object) -> str:
    args = {"worker": "A", "method": "GET", "target": "/v1/x?y=1", "body": b"",
            "headers": HEADERS, **kw}
    return forward_credential(SECRET, now=now, **args)  # type: ignore[arg-type]


def check(cred: str, now: float = 100.0, seen: SeenNonces | None = None, **kw: object) -> bool:
    args = {"worker": "A", "method": "GET", "target": "/v1/x?y=1", "body": b"",
            "headers": HEADERS, **kw}
    return check_forward(SECRET, cred, now=now, seen=seen, **args)  # type: ignore[arg-type]


def test_a_credential_binds_method_target_body_headers_and_time():
    cred = credential()
    assert check(cred)
    assert not check(cred, method="POST")
    assert not check(cred, target="/v1/x?y=2")
    assert not check(cred, body=b"{}")
    assert not check(cred, headers={**HEADERS, "X-Memstream-To": "C"})
    assert not check(cred, worker="C")
    assert not check(cred, now=100.0 + 61)


def test_a_nonce_is_taken_once_and_a_full_cache_refuses_rather_than_forgets():
    seen = SeenNonces(ttl_s=120.0, most=2)
    first, second, third = credential(), credential(), credential()
    assert check(first, seen=seen) and not check(first, seen=seen)
    assert check(second, seen=seen)
    assert not check(third, seen=seen)  # full of unexpired nonces: refused
    assert not check(first, seen=seen)  # ... and the first is still known
    assert check(credential(now=300.0), now=300.0, seen=seen)  # expired ones leave


def test_one_senders_flood_fills_its_own_nonces_only():
    """Issue 47: one tenant key made worker A forward until the owner's one nonce cache was
    full, and then every forward failed for all tenants; now each sender has its own."""
    seen = SeenNonces(ttl_s=120.0, most=3)
    a = {"worker": "A", "headers": HEADERS}
    c = {"worker": "C", "headers": {**HEADERS, "X-Memstream-Forwarded": "C"}}
    assert all(check(credential(**a), seen=seen, **a) for _ in range(3))
    assert not check(credential(**a), seen=seen, **a)  # A's share is full: refused
    assert check(credential(**c), seen=seen, **c)  # C's forwards go on
    assert (seen.held("A"), seen.held("C")) == (3, 1)
    assert check(credential(now=221.0, **a), now=221.0, seen=seen, **a)  # A's expired


def test_the_senders_are_bounded_and_forgotten_once_all_their_nonces_expired():
    seen = SeenNonces(ttl_s=10.0, most=5, senders=2)
    assert seen.first("n1", 0.0, "A") and seen.first("n1", 0.0, "B")
    assert not seen.first("n1", 5.0, "C")  # two senders held, none expired
    assert seen.first("n1", 11.0, "C")  # A's and B's expired: forgotten
    assert seen.held("A") == 0 and not seen.first("n1", 11.0, "C")


def test_a_signature_that_is_not_ascii_or_parts_that_are_not_utf_8_never_raise():
    cred = credential()
    assert not check(cred[:-4] + "ключ")
    assert not check(cred, worker="A\udcff")
    assert not check("v1 100.000 n \udcff")
