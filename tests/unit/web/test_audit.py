"""The per-tenant audit log (memstream.web.audit): who did what, when, never content."""

from __future__ import annotations

import pytest

from memstream.core.settings import Settings
from memstream.web.audit import AuditLog, entry
from tests.unit.builders import CANARY, change

pytestmark = pytest.mark.unit


def test_an_entry_has_who_what_when_and_no_content():
    e = entry(change())
    assert (e["op"], e["user_id"], e["memory_id"], e["kind"]) == ("add", "u1", "m1",
                                                                  "extraction")
    assert CANARY not in repr(e) and "reason" not in e


def test_a_forget_me_entry_keeps_why_and_how_many():
    erase = change().model_copy(update={
        "op": "erase", "memory_id": "*", "after": {"version_records": 7}, "records": [],
        "vector": None, "before": None, "reason": "forget-me: ticket 12"})
    e = entry(erase)
    assert (e["reason"], e["version_records"]) == ("forget-me: ticket 12", 7)


def test_the_log_is_per_tenant_newest_first_deduplicated_and_filtered():
    log = AuditLog(Settings(bootstrap_servers="unused:9092"), "t", per_tenant=3)
    for i, user in enumerate(["u1", "u2", "u1", "u1"]):
        c = change(user=user, cid=f"c{i}")
        log.take(c.dumps())
        log.take(c.dumps())  # a republished change counts once
    other = change(cid="c9").model_copy(update={"tenant_id": "t2"})
    log.take(other.dumps())
    rows, more = log.page("t1", offset=0, limit=2)
    assert [r["change_id"] for r in rows] == ["c3", "c2"] and more  # c0 fell off (3 kept)
    rows, _ = log.page("t1", offset=0, limit=10, user="u2")
    assert [r["change_id"] for r in rows] == ["c1"]
    assert log.page("t2", offset=0, limit=10)[0][0]["change_id"] == "c9"
    assert log.page("t3", offset=0, limit=10) == ([], False)
