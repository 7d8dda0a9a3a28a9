"""The short-term window: chunk arithmetic and search (memory.short_term), the table (streams)."""

from __future__ import annotations

import pytest

from memstream.core.settings import Settings
from memstream.memory import short_term as window
from memstream.memory.short_term import CHUNK
from memstream.streams import window as table_window
from tests.unit.builders import msg

pytestmark = pytest.mark.unit


def row(seq: int, content: str = "x", role: str = "user") -> list:
    return [seq, f"m{seq}", role, content, f"2026-01-01T00:00:{seq % 60:02d}+00:00"]


# --- pure chunk arithmetic ----------------------------------------------------------------

def test_chunk_keys_and_numbers():
    assert window.chunk_key("t1", "u1", "s1", 3) == b"t1/u1/s1#3"
    assert [window.chunk_of(s) for s in (0, CHUNK - 1, CHUNK, 3 * CHUNK + 1)] == [0, 0, 1, 3]


@pytest.mark.parametrize(("count", "last", "chunks"), [
    (0, 10, []), (5, 0, []), (5, 10, [0]), (CHUNK, CHUNK, [0]), (CHUNK + 1, CHUNK, [0, 1]),
    (3 * CHUNK, 2, [2]), (3 * CHUNK + 1, 2, [2, 3]), (25, 100, [0, 1, 2]),
])
def test_chunks_covering(count, last, chunks):
    assert list(window.chunks_covering(count, last)) == chunks


def test_kept_chunks_hold_the_last_keep_messages_whatever_the_alignment():
    for keep in (1, 9, 10, 11, 25, 200):
        kept = window.kept_chunks(keep)
        for count in range(1, 3 * keep + 2 * CHUNK):
            needed = window.chunks_covering(count, keep)
            newest = window.chunk_of(count - 1)
            assert newest - needed.start + 1 <= kept, (keep, count)
    assert window.kept_chunks(0) == 0


def test_a_chunk_expires_only_when_a_message_opens_a_new_one():
    keep = 10  # kept_chunks == 2
    assert window.expired_chunk(2 * CHUNK, keep) == 0
    assert window.expired_chunk(2 * CHUNK + 1, keep) is None
    assert window.expired_chunk(CHUNK, keep) is None  # nothing old enough yet
    assert window.expired_chunk(5 * CHUNK, keep) == 3


def test_append_keeps_order_and_replaces_a_message_seen_twice():
    rows = window.append(None, row(3))
    rows = window.append(rows, row(1))
    rows = window.append(rows, row(3, "again"))
    assert [(r[0], r[3]) for r in rows] == [(1, "x"), (3, "again")]


def test_last_rows_reads_across_chunks():
    table = {window.chunk_key("t", "u", "s", n): [row(s) for s in range(n * CHUNK,
                                                                          (n + 1) * CHUNK)]
             for n in range(3)}
    got = window.last_rows(table.get, "t", "u", "s", 3 * CHUNK, CHUNK + 2)
    assert [r[0] for r in got] == list(range(2 * CHUNK - 2, 3 * CHUNK))
    assert window.last_rows(table.get, "t", "u", "s", 3 * CHUNK, 0) == []
    assert window.last_rows(table.get, "t", "u", "other", 3 * CHUNK, 5) == []


def test_search_ranks_by_shared_terms_newest_first_among_equals():
    rows = [row(0, "I bought a red bike"), row(1, "the bike is red and fast"),
            row(2, "lunch was good"), row(3, "a new bike")]
    assert [r[0] for r in window.search(rows, "red bike", 10)] == [1, 0, 3]
    assert [r[0] for r in window.search(rows, "RED Bike", 1)] == [1]
    assert window.search(rows, "helicopter", 10) == []
    assert window.search(rows, "  ...  ", 10) == []


def test_search_finds_chinese_text_without_spaces():
    rows = [row(0, "我对花生过敏"), row(1, "今天天气很好")]
    assert [r[0] for r in window.search(rows, "花生", 5)] == [0]


# --- the table (streams.window) -----------------------------------------------------------

class Table(dict):
    """A plain dict standing in for the changelog-backed table; logs every write."""

    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []

    def __setitem__(self, key, value) -> None:
        self.written.append(key)
        super().__setitem__(key, value)


def fill(table, settings, n, *, session="s1", user="u1"):
    for seq in range(n):
        table_window.record(table, settings, msg(f"message {seq}", session=session, user=user,
                                                 mid=f"{session}-{seq}"), seq)


@pytest.mark.parametrize("n", [0, 1, 9, 10, 11, 29, 30, 31, 87])
def test_rows_are_the_last_messages_and_the_table_stays_bounded(n):
    settings = Settings(short_term_turns=4, conversation_keep=25)
    table = Table()
    fill(table, settings, n)
    got = table_window.rows(table, "t1", "u1", "s1", 25)
    assert [r[3] for r in got] == [f"message {s}" for s in range(max(0, n - 25), n)]
    last4 = table_window.rows(table, "t1", "u1", "s1", settings.short_term_turns)
    assert [r[0] for r in last4] == list(range(max(0, n - 4), n))
    chunks = [k for k in table if b"#" in k]
    assert len(chunks) <= window.kept_chunks(table_window.keep(settings))


def test_a_message_rewrites_only_its_own_chunk_and_the_head():
    settings = Settings(short_term_turns=4, conversation_keep=25)
    table = Table()
    fill(table, settings, 13)
    table.written.clear()
    table_window.record(table, settings, msg("one more", mid="s1-13"), 13)
    assert sorted(table.written) == [b"t1/u1/s1", b"t1/u1/s1#1"]
    assert table[b"t1/u1/s1"] == 14


def test_a_redelivered_message_is_kept_once():
    settings = Settings(short_term_turns=4, conversation_keep=25)
    table = Table()
    fill(table, settings, 3)
    table_window.record(table, settings, msg("message 1", mid="s1-1"), 1)
    assert [r[0] for r in table_window.rows(table, "t1", "u1", "s1", 10)] == [0, 1, 2]
    assert table[b"t1/u1/s1"] == 3  # the head never goes back


def test_row_shape():
    settings = Settings(short_term_turns=4, conversation_keep=25)
    table = Table()
    table_window.record(table, settings, msg("hello", mid="x1", role="assistant"), 0)
    [got] = table_window.rows(table, "t1", "u1", "s1", 1)
    assert got == [0, "x1", "assistant", "hello", "2026-01-01T00:00:00+00:00"]


def test_forget_drops_the_session_and_nothing_else():
    settings = Settings(short_term_turns=4, conversation_keep=25)
    table = Table()
    fill(table, settings, 57, session="gone")
    fill(table, settings, 12, session="kept")
    fill(table, settings, 5, session="gone", user="u2")
    before = {k: v for k, v in table.items() if not k.startswith(b"t1/u1/gone")}
    table_window.forget(table, settings, "t1", "u1", "gone")
    assert dict(table) == before
    assert table_window.rows(table, "t1", "u1", "gone", 10) == []
    table_window.forget(table, settings, "t1", "u1", "never-seen")  # harmless
    assert dict(table) == before


def test_nothing_is_kept_when_both_windows_are_zero():
    settings = Settings(short_term_turns=0, conversation_keep=0)
    table = Table()
    fill(table, settings, 12)
    assert dict(table) == {}
    assert table_window.rows(table, "t1", "u1", "s1", 10) == []
