"""The downstream example (examples/profile_projection.py): a SQLite profile table kept
exactly once from the public memory events, whatever Kafka redelivers."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime

import pytest

from examples.profile_projection import Projection
from memstream.consumer import Received
from memstream.contract.events import EventLineage, MemoryState

pytestmark = pytest.mark.unit
T0 = datetime(2026, 1, 1, tzinfo=UTC)
_offsets = itertools.count(100)


def state(content: str, version: int, status: str = "active") -> MemoryState:
    return MemoryState(version=version, content=content, type="episodic", importance=5,
                       status=status, created_at=T0, updated_at=T0, valid_from=T0)


def received(op: str, version: int = 1, text: str = "", *, mid: str = "m1", user: str = "u1",
             tenant: str = "t1", cid: str | None = None, partition: int = 0,
             offset: int | None = None, content: str = "plain") -> Received:
    before = after = None
    if op == "update":
        before, after = state("old", version - 1, "superseded"), state(text, version)
    elif op == "delete":
        before, after = state(text, version), state(text, version, "deleted")
    elif op == "add":
        after = state(text, version)
    if content in ("sealed", "shredded"):
        before = after = None
    return Received(change_id=cid or f"{op}-{mid}-{version}", op=op, tenant_id=tenant,
                    user_id=user, memory_id="*" if op == "erase" else mid,
                    version=0 if op == "erase" else version, before=before, after=after,
                    lineage=EventLineage(kind="extraction", session_id="s", from_seq=0,
                                         to_seq=1, job_id="j"),
                    model="rules", prompt_version="v1", decided_at=T0,
                    erased_versions=3 if op == "erase" else None,
                    sealed="v1:k1:AAAA" if content != "plain" else None,
                    partition=partition, offset=next(_offsets) if offset is None else offset,
                    content=content)


@pytest.fixture
def p(tmp_path):
    projection = Projection(tmp_path / "profiles.sqlite")
    yield projection
    projection.close()


def applied(p: Projection) -> list[tuple[str, str]]:
    return [(r[0], r[1]) for r in p.db.execute("SELECT change_id, op FROM applied ORDER BY rowid")]


def test_add_update_delete_apply_in_order(p):
    assert p.apply(received("add", 1, "Lives in Oslo"))
    assert p.profile("t1", "u1") == [("m1", 1, "Lives in Oslo")]
    assert p.apply(received("update", 2, "Lives in Bergen"))
    assert p.profile("t1", "u1") == [("m1", 2, "Lives in Bergen")]
    assert p.apply(received("delete", 2, "Lives in Bergen"))  # closes the version it updated
    assert p.profile("t1", "u1") == []
    assert applied(p) == [("add-m1-1", "add"), ("update-m1-2", "update"),
                          ("delete-m1-2", "delete")]


def test_a_copy_or_an_older_change_changes_nothing_and_is_not_logged(p):
    add, update = received("add", 1, "Lives in Oslo"), received("update", 2, "Lives in Bergen")
    assert p.apply(add) and p.apply(update)
    late = [update.model_copy(update={"offset": 500}),  # a copy outside the reader's window
            add.model_copy(update={"offset": 501}),  # an older change, redelivered
            received("add", 1, "Lives in Rome", cid="other", offset=502)]
    assert [p.apply(e) for e in late] == [False, False, False]
    assert p.profile("t1", "u1") == [("m1", 2, "Lives in Bergen")]
    assert applied(p) == [("add-m1-1", "add"), ("update-m1-2", "update")]
    assert p.position(0) == 503  # skipped, but passed


def test_a_deleted_version_is_not_brought_back_by_a_late_copy_of_its_update(p):
    update = received("update", 2, "Lives in Bergen")
    assert p.apply(update) and p.apply(received("delete", 2, "Lives in Bergen"))
    assert not p.apply(update.model_copy(update={"offset": 900}))
    assert not p.apply(received("delete", 2, "Lives in Bergen", offset=901))
    assert p.profile("t1", "u1") == []
    assert p.apply(received("update", 3, "Lives in Paris"))  # a later version still applies
    assert p.profile("t1", "u1") == [("m1", 3, "Lives in Paris")]


def test_an_erase_deletes_that_users_rows_only(p):
    for user, tenant, mid in [("u1", "t1", "m1"), ("u1", "t1", "m2"), ("u2", "t1", "m1"),
                              ("u1", "t2", "m1")]:
        assert p.apply(received("add", 1, f"{tenant}/{user}/{mid}", mid=mid, user=user,
                                tenant=tenant))
    assert p.apply(received("erase", cid="forget-1"))
    assert p.profile("t1", "u1") == []
    assert p.profile("t1", "u2") == [("m1", 1, "t1/u2/m1")]
    assert p.profile("t2", "u1") == [("m1", 1, "t2/u1/m1")]
    assert p.db.execute("SELECT tenant, user, change_id FROM erased").fetchall() == [
        ("t1", "u1", "forget-1")]


@pytest.mark.parametrize("content", ["sealed", "shredded"])
def test_content_it_cannot_read_changes_no_row_but_moves_the_position(p, content):
    assert p.apply(received("add", 1, "Lives in Oslo", offset=4))
    for op, version in [("add", 1), ("update", 2), ("delete", 1)]:
        assert not p.apply(received(op, version, "x", mid="m9", offset=5, content=content))
    assert not p.apply(received("update", 2, "x", offset=6, content=content))
    assert p.profile("t1", "u1") == [("m1", 1, "Lives in Oslo")]
    assert p.position(0) == 7 and len(applied(p)) == 1


def test_positions_are_kept_per_partition_and_survive_a_restart(tmp_path):
    p = Projection(tmp_path / "profiles.sqlite")
    assert p.position(0) is None
    p.apply(received("add", 1, "a", mid="m1", partition=0, offset=10))
    p.apply(received("add", 1, "b", mid="m2", partition=3, offset=41))
    p.apply(received("add", 1, "c", mid="m3", partition=0, offset=11))
    assert (p.position(0), p.position(3), p.position(1)) == (12, 42, None)
    p.close()
    again = Projection(tmp_path / "profiles.sqlite")
    assert (again.position(0), again.position(3)) == (12, 42)
    assert [m for m, _, _ in again.profile("t1", "u1")] == ["m1", "m2", "m3"]
    again.close()


def test_a_failed_apply_leaves_neither_the_row_nor_the_position(p, monkeypatch):
    assert p.apply(received("add", 1, "Lives in Oslo", offset=1))

    def half_done(e):
        p.db.execute("DELETE FROM memories")
        raise RuntimeError("disk full")

    monkeypatch.setattr(p, "_apply", half_done)
    with pytest.raises(RuntimeError):
        p.apply(received("update", 2, "Lives in Bergen", offset=2))
    monkeypatch.undo()
    assert p.profile("t1", "u1") == [("m1", 1, "Lives in Oslo")] and p.position(0) == 2
    assert p.apply(received("update", 2, "Lives in Bergen", offset=2))  # usable again
    assert p.position(0) == 3


def test_a_copy_of_an_erase_and_a_late_copy_of_an_erased_change_change_nothing(p):
    assert p.apply(received("add", 1, "Lives in Oslo"))
    late = received("add", 1, "Lives in Oslo")  # its copy, plain, after the erasure
    erase = received("erase", cid="forget-1")
    assert p.apply(erase.model_copy(update={"decided_at": T0.replace(hour=1)}))
    assert not p.apply(erase.model_copy(update={"offset": 99}))  # beyond the reader's window
    assert not p.apply(late) and p.profile("t1", "u1") == []
    assert p.db.execute("SELECT count(*) FROM erased").fetchone() == (1,)
    back = received("add", 1, "Lives in Bergen", mid="m2")  # the user came back later
    assert p.apply(back.model_copy(update={"decided_at": T0.replace(hour=2)}))
    assert p.profile("t1", "u1") == [("m2", 1, "Lives in Bergen")]
