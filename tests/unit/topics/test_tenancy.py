"""The per-tenant input layout (topics/registry.py): one messages and one session-events
topic per tenant, prefix-named so that a PREFIXED ACL confines a chat service to its
tenant; an inconsistent layout is refused before anything is created; no broker."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from memstream.core.settings import Settings
from memstream.topics.layout import LayoutError, prepare
from memstream.topics.registry import (
    TENANT_TOPIC_ID,
    registry,
    tenancy_problems,
    tenant_prefix,
)
from memstream.topics.schemas import ID_PATTERN

pytestmark = pytest.mark.unit


def per_tenant(tenants: str, **extra: object) -> Settings:
    base: dict[str, object] = {"topic_prefix": "ms", "input_topics": "per-tenant",
                               "tenants": tenants, "partitions": 6}
    return Settings(**{**base, **extra})  # type: ignore[arg-type]


def test_the_shared_layout_has_no_tenant_topics():
    t = registry(Settings(tenants="acme"))
    assert t.tenant_inputs == () and t.tenant_of(t.messages.name) is None
    assert tenancy_problems(Settings(tenants="acme")) == []


def test_each_tenant_has_its_input_topics_co_partitioned_and_read_by_ingest():
    t = registry(per_tenant(" acme, globex ,acme"))
    names = [spec.name for _, spec in t.tenant_inputs]
    assert names == ["ms.tenant.acme.messages", "ms.tenant.acme.session-events",
                     "ms.tenant.globex.messages", "ms.tenant.globex.session-events"]
    for tenant, spec in t.tenant_inputs:
        shared = t.messages if spec.name.endswith(".messages") else t.session_events
        assert (spec.schema, spec.partitions, spec.config(), spec.co_partitioned) == (
            shared.schema, 6, shared.config(), True)
        assert t.tenant_of(spec.name) == tenant
        assert spec in t.all() and spec in t.ingest_inputs() and spec in t.placed_by_producers()
    assert t.tenant_of(t.messages.name) is None  # the shared topic stays the worker's own


def test_a_tenants_prefix_matches_only_its_own_topics():
    tenants = ["acme", "acme2", "acme_x", "acme-x", "a", "ACME"]
    settings = per_tenant(",".join(tenants))
    for a, (b, spec) in itertools.product(tenants, registry(settings).tenant_inputs):
        assert spec.name.startswith(tenant_prefix(settings, a)) == (a == b), (a, spec.name)


def test_the_topic_grammar_of_a_tenant_is_narrower_than_the_records():
    for ok in ("acme", "a-b_c", "A1"):
        assert TENANT_TOPIC_ID.fullmatch(ok) and ID_PATTERN.fullmatch(ok)
    for record_only in ("acme.x", "a:b", "a@b", "a+b", "a=b"):  # a record may, a topic not
        assert ID_PATTERN.fullmatch(record_only) and not TENANT_TOPIC_ID.fullmatch(record_only)


def test_an_inconsistent_layout_is_one_line_each():
    assert tenancy_problems(per_tenant("")) == [
        "MEMSTREAM_INPUT_TOPICS=per-tenant with no tenant: set MEMSTREAM_TENANTS to the "
        "tenants whose input topics the worker reads (comma-separated)"]
    lines = tenancy_problems(per_tenant("acme,acme.x,a:b"))
    assert len(lines) == 2 and "'acme.x'" in lines[0] and "no '.'" in lines[0]
    long = tenancy_problems(per_tenant("a" * 120, topic_prefix="p" * 120))
    assert len(long) == 1 and "249" in long[0]
    assert tenancy_problems(per_tenant("acme,globex")) == []


def test_the_worker_refuses_an_inconsistent_layout_before_it_connects():
    nowhere = per_tenant("", bootstrap_servers="127.0.0.1:1")
    with pytest.raises(LayoutError) as refused:
        asyncio.run(prepare(nowhere))
    assert len(refused.value.lines) == 1 and "MEMSTREAM_TENANTS" in refused.value.lines[0]
