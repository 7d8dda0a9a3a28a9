"""`memstream changes tail`'s one line per event, and `memstream schemas [--check]`."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner

from memstream.cli import main
from memstream.consumer import Received
from memstream.contract.events import EventLineage, MemoryState
from memstream.ops.changes_cli import line
from memstream.topics.jsonschema import SCHEMAS

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[3]
T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
HEAD = "2026-01-02T03:04:05Z t1/u1"


def state(content: str, version: int = 1, status: str = "active") -> MemoryState:
    return MemoryState(version=version, content=content, type="episodic", importance=5,
                       status=status, created_at=T0, updated_at=T0, valid_from=T0)


def received(op: str = "add", *, content: str = "plain", kind: str = "extraction",
             **fields) -> Received:
    base = dict(change_id="c1", op=op, tenant_id="t1", user_id="u1", memory_id="m1",
                version=1, after=state("Lives in Oslo"), model="rules", prompt_version="v1",
                decided_at=T0, lineage=EventLineage(kind=kind, session_id="s1", from_seq=0,
                                                    to_seq=1, job_id="j1"))
    return Received(**{**base, **fields}, partition=0, offset=7, content=content)


def test_add_update_and_delete_show_the_content_they_are_about():
    assert line(received()) == f"{HEAD} add    m1 v1 'Lives in Oslo' [extraction]"
    update = received("update", version=2, before=state("Lives in Oslo"),
                      after=state("Lives in Bergen", 2))
    assert line(update) == f"{HEAD} update m1 v2 'Lives in Bergen' [extraction]"
    delete = received("delete", version=2, before=state("Lives in Bergen", 2),
                      after=state("Lives in Bergen", 2, "deleted"), kind="deletion")
    assert line(delete) == f"{HEAD} delete m1 v2 'Lives in Bergen' [deletion]"


def test_an_erase_shows_how_many_records_and_why():
    erase = received("erase", memory_id="*", version=0, after=None, erased_versions=4,
                     reason="forget-me: user request", kind="forget")
    assert line(erase) == (f"{HEAD} erase  * v0 erased 4 version records "
                           "(forget-me: user request) [forget]")


def test_sealed_and_shredded_events_say_so_without_content():
    sealed = received(after=None, sealed="v1:k1:AAAA", content="sealed")
    assert line(sealed) == (f"{HEAD} add    m1 v1 [sealed: this process has no "
                            "MEMSTREAM_MASTER_KEY] [extraction]")
    shredded = received(after=None, sealed="v1:k1:AAAA", content="shredded")
    assert line(shredded) == f"{HEAD} add    m1 v1 [erased: the user was forgotten] [extraction]"


def test_long_or_multiline_content_stays_one_short_line():
    text = "Lives in Oslo\n" + "x" * 500
    out = line(received(after=state(text), memory_id="a8bcbb33-d26a-5b23-9223-843bb0937cd6"))
    assert "\n" not in out and len(out) <= 200
    assert "'Lives in Oslo\\n" in out and "…' [extraction]" in out


# --- memstream schemas ------------------------------------------------------------------

def schemas(*args: str):
    return CliRunner().invoke(main, ["schemas", *args])


def test_check_passes_on_the_repositorys_schema_files(monkeypatch):
    monkeypatch.chdir(ROOT)  # the default --dir is docs/schemas
    result = schemas("--check")
    assert result.exit_code == 0, result.output
    assert schemas("--check", "--dir", str(ROOT / "docs" / "schemas")).exit_code == 0


def test_check_fails_on_a_changed_or_missing_file(tmp_path):
    shutil.copytree(ROOT / "docs" / "schemas", tmp_path, dirs_exist_ok=True)
    assert schemas("--check", "--dir", str(tmp_path)).exit_code == 0
    changed = tmp_path / "memory-event.v1.json"
    changed.write_text(changed.read_text().replace('"Unique per change', '"Unique'))
    result = schemas("--check", "--dir", str(tmp_path))
    assert result.exit_code == 1
    assert f"stale: {changed}" in result.stderr
    (tmp_path / "chat-message.v1.json").unlink()
    assert schemas("--check", "--dir", str(tmp_path)).stderr.count("stale:") == 2


def test_writing_the_files_makes_the_check_pass(tmp_path):
    target = tmp_path / "schemas"
    result = schemas("--dir", str(target))
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in target.iterdir()) == sorted(SCHEMAS)
    assert schemas("--check", "--dir", str(target)).exit_code == 0
