"""Pages of event rows the compiled core reads on the SQLite store's connection.

``event_rows`` (APSW's tuples) is the oracle: ``event_page`` gives the same
rows, in a buffer where the compiled core read them, and otherwise (a value
of another type, text that is not UTF-8, the plain path asked for) the very
list or error ``event_rows`` gives.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import apsw
import pytest
from support.native import path_taken
from support.store_contract import T0, ap, ev

from streamd.eventlog.sqlite.connection import SqliteOptions
from streamd.eventlog.sqlite.store import SqliteStore
from streamd.eventlog.store import EventRows
from streamd.recall.eventlog.build import LogIndex
from streamd.recall.eventlog.settings import LogSettings
from streamd.recall.index import index as index_module
from streamd.recall.index import native

pytestmark = pytest.mark.skipif(native._native is None, reason="streamd._native is not built")

_TEXTS = ["plain words", "é and 🙂 and \u2028", "a\x00nul", "quote \" back\\slash\nline", ""]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    s = SqliteStore.open(str(tmp_path / "events.db"), SqliteOptions(synchronous="NORMAL"))
    try:
        yield s
    finally:
        s.close()


def _fill(store: SqliteStore, n: int) -> None:
    for i in range(n):
        text = _TEXTS[i % len(_TEXTS)]
        content: Any = ({"role": "model", "parts": [{"text": f"{text} {i}"}]} if i % 4
                        else {"parts": [{"function_call": {"name": "f", "args": {"q": text}}}]})
        store.append(ap(ev(f"ev-{i}", content, branch="b.c" if i % 3 else "",
                           invocation_id=f"inv-{text}"),
                        app=f"app-{i % 2}", user="Ünï", session=f"s{i % 5}"), T0 + i)
    # A delta on some rows (NULL on the others).
    store.connection.execute(
        "UPDATE events SET state_delta = '{\"session\": {\"k\": \"é\"}}' WHERE seq % 3 = 0")


def _listed(rows: EventRows) -> list[Any]:
    return [rows[i] for i in range(len(rows))]


def test_a_page_is_the_rows_apsw_reads(store: SqliteStore) -> None:
    _fill(store, 40)
    for from_seq, limit in [(0, 100), (0, 7), (12, 5), (39, 10), (40, 10), (1_000, 3)]:
        page = store.event_page(from_seq, limit)
        assert type(page).__name__ == "EventPage"
        assert _listed(page) == store.event_rows(from_seq, limit)
    page = store.event_page(0, 100)
    assert page[-1] == page[39] and page[-40] == page[0]
    for i in (40, -41):
        with pytest.raises(IndexError):
            page[i]


def test_loading_the_core_leaves_sql_extension_loading_off(store: SqliteStore) -> None:
    _fill(store, 3)
    assert type(store.event_page(0, 10)).__name__ == "EventPage"
    assert native._native is not None and native._native.sqlite_extension_loaded()
    with pytest.raises(apsw.Error, match="not authorized"):
        store.connection.execute("SELECT load_extension('x')").fetchall()


@pytest.mark.parametrize("change", [
    # Text columns turn numbers into text; a blob stays a blob.
    "UPDATE events SET author = x'41' WHERE seq = 5",
    "UPDATE events SET invocation_id = x'00ff' WHERE seq = 5",
    "UPDATE events SET state_delta = x'7b7d' WHERE seq = 5",
    "UPDATE events SET event_time = 'x12' WHERE seq = 5",  # text where an integer was
])
def test_a_page_with_unusual_values_is_read_through_apsw(store: SqliteStore, change: str) -> None:
    _fill(store, 10)
    store.connection.execute(change)
    page = store.event_page(0, 100)
    assert isinstance(page, list)
    assert page == store.event_rows(0, 100)
    # The rows before it still come from the compiled core.
    assert type(store.event_page(0, 4)).__name__ == "EventPage"


@pytest.mark.parametrize(("bad", "read"), [("x'c3'", "\ufffd"), ("x'61ff'", "a\ufffd")])
def test_text_that_is_not_utf8_reads_as_apsw_reads_it(
        store: SqliteStore, bad: str, read: str) -> None:
    # The compiled core declines such a page; the store's read of it through
    # APSW then decodes each bad byte as U+FFFD (``lossy_text``), where both
    # raised UnicodeDecodeError alike before.
    _fill(store, 10)
    store.connection.execute(f"UPDATE events SET invocation_id = CAST({bad} AS TEXT) WHERE seq = 5")
    rows = store.event_rows(0, 100)
    assert rows[4][5] == read
    page = store.event_page(0, 100)
    assert isinstance(page, list) and page == rows


def test_fields_cut_inside_a_character_are_not_taken_for_text(store: SqliteStore) -> None:
    # Each field alone is not UTF-8, though the two side by side are "é".
    _fill(store, 3)
    store.connection.execute(
        "UPDATE events SET author = CAST(x'c3' AS TEXT), branch = CAST(x'a9' AS TEXT) "
        "WHERE seq = 2")
    page = store.event_page(0, 100)
    assert isinstance(page, list) and (page[1][6], page[1][7]) == ("\ufffd", "\ufffd")


def test_the_plain_path_reads_through_apsw(store: SqliteStore) -> None:
    _fill(store, 5)
    with path_taken(False):
        assert store.event_page(0, 100) == store.event_rows(0, 100)


def test_a_log_indexed_from_pages_is_the_one_indexed_from_rows(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Segments of 300 and pages of 2,500: pages cross seals, are cut in two
    # halves, and a declined row (a call whose name is a number) is
    # projected by the plain path from the page.
    monkeypatch.setattr(index_module, "SEGMENT_RECORDS", 300)
    _fill(store, 5_000)
    store.connection.execute(
        "UPDATE events SET content = '{\"parts\": [{\"function_call\": {\"name\": 3}}]}' "
        "WHERE seq % 1001 = 0")
    built = []
    for compiled, read in [(False, store.event_rows), (True, store.event_rows),
                           (True, store.event_page)]:
        with path_taken(compiled):
            idx = LogIndex(LogSettings(), lambda: 1_800_000_000_000_000_000)
            seq = 0
            while rows := read(seq, 2_500):
                if compiled and read == store.event_page:
                    assert type(rows).__name__ == "EventPage"
                idx.consume(rows)
                seq = rows[len(rows) - 1][0]
            idx.publish()
        built.append(idx)
    plain = built[0]
    for other in built[1:]:
        assert (other.seq, other.last_id, other.failed, other.latest) == (
            plain.seq, plain.last_id, plain.failed, plain.latest)
        a, b = plain.index, other.index
        assert a.ids == b.ids and a.kinds == b.kinds and len(a.segments) == len(b.segments)
        for sa, sb in zip(a.segments, b.segments, strict=True):
            for name, arr in sa.arrays().items():
                assert arr.tobytes() == sb.arrays()[name].tobytes(), name
