"""``memstream redrive`` takes the range from a dead letter's reason or from its options."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

from memstream.cli import main
from memstream.ops import redrive as module
from memstream.topics.batch_refs import Reference

pytestmark = pytest.mark.unit


@pytest.fixture
def calls(monkeypatch) -> list[tuple[Reference, bool]]:
    seen: list[tuple[Reference, bool]] = []

    async def fake(settings: Any, ref: Reference, *, dry_run: bool = False) -> Any:
        seen.append((ref, dry_run))
        return module.Redriven(read=ref.last - ref.first + 1, produced=0 if dry_run else 12)

    monkeypatch.setattr(module, "redrive", fake)
    return seen


def test_the_reference_of_a_dead_letter_is_parsed(calls):
    reason = ("UnsupportedCodecError: record batch not decoded; set aside by reference: "
              "topic=memstream.messages partition=3 offsets=120..131")
    result = CliRunner().invoke(main, ["redrive", "--reference", reason])
    assert result.exit_code == 0, result.output
    assert calls == [(Reference("memstream.messages", 3, 120, 131), False)]
    assert "read 12, produced 12" in result.output


def test_the_range_can_be_given_as_options(calls):
    result = CliRunner().invoke(main, ["redrive", "--topic", "t", "--partition", "0",
                                       "--first", "5", "--last", "9", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert calls == [(Reference("t", 0, 5, 9), True)]


def test_without_a_range_it_asks_for_one(calls):
    result = CliRunner().invoke(main, ["redrive", "--reference", "schema: missing field"])
    assert result.exit_code != 0 and "give --reference" in result.output and not calls
