"""docs/settings.md is generated from the Settings class and cannot drift from it."""

from __future__ import annotations

from pathlib import Path

import pytest

from memstream.core.settings import Settings
from memstream.dev import settings_doc

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[3]
DOC = ROOT / "docs" / "settings.md"
FIX = "python -m memstream.dev.settings_doc --write docs/settings.md"


def test_the_committed_file_is_what_render_builds() -> None:
    assert DOC.read_text(encoding="utf-8") == settings_doc.render(), f"run `{FIX}`"


def test_every_field_is_documented_once() -> None:
    text = settings_doc.render()
    for name in Settings.model_fields:
        assert text.count(f"| `MEMSTREAM_{name.upper()}` |") == 1, name


def test_defaults_read_as_they_are_written_in_the_environment() -> None:
    rows = {line.split(" | ")[0].strip("| `"): line.split(" | ")
            for line in settings_doc.render().splitlines() if line.startswith("| `MEMSTREAM_")}
    assert rows["MEMSTREAM_KAFKA_HOME"][2] == "`~/.cache/memstream`"  # not the writer's home
    if Path.home() != Path("/"):
        assert f"{Path.home()}/" not in settings_doc.render()
    assert rows["MEMSTREAM_ADMIN_KEY"][1:3] == ["secret", "unset"]
    assert rows["MEMSTREAM_IDLE_TIMEOUT_S"][2] == "`1800`"
    assert rows["MEMSTREAM_WEB_ENABLED"][2] == "`false`"
    assert rows["MEMSTREAM_JOBS"][2] == '`["reflect", "consolidate", "decay"]`'
    assert rows["MEMSTREAM_PARTITIONS"][1] == "int ≥ 1"


def test_fields_are_grouped_in_the_order_of_the_class() -> None:
    text = settings_doc.render()
    positions = [text.index(f"`MEMSTREAM_{name.upper()}`") for name in Settings.model_fields]
    assert positions == sorted(positions)
    assert "## Triggers and coalescing\n" in text  # the class's section comment, no aside


def test_check_passes_on_the_rendered_file(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "settings.md"
    assert settings_doc.main(["--write", str(path)]) == 0
    assert settings_doc.main(["--check", str(path)]) == 0
    assert path.read_text(encoding="utf-8") == settings_doc.render()


def test_check_fails_on_a_changed_file(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "settings.md"
    path.write_text(settings_doc.render().replace("`1800`", "`900`"), encoding="utf-8")
    assert settings_doc.main(["--check", str(path)]) == 1
    err = capsys.readouterr().err
    assert "out of date" in err and FIX in err
    assert "-| `MEMSTREAM_IDLE_TIMEOUT_S` | float > 0 | `900` |" in err  # the diff shows it


def test_check_fails_on_a_missing_file(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert settings_doc.main(["--check", str(tmp_path / "nope.md")]) == 1
    assert "does not exist" in capsys.readouterr().err


def test_without_options_it_prints_the_markdown(capsys: pytest.CaptureFixture[str]) -> None:
    assert settings_doc.main([]) == 0
    assert capsys.readouterr().out == settings_doc.render()
