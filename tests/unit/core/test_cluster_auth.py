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
