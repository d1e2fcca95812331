"""``since`` by an app's user or by branch prefixes: the page the events say,
read from the index where SQLite's planner would read every row.

The page is checked against a plain computation over the same events (the
seqs after the cursor whose events :func:`filters.matches` passes, cut at the
limit) for random logs, filters, cursors and limits: on SQLite many cases, with
and without the primary-key read of a cursor near the newest seq, and through
the store contract's ``fx`` on every backend a few. The cost tests count the
pages a read takes, which no clock or load changes.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.filters import Row, _Row, drawn_filter, log_rows, memory_log, store_rows
from support.sqlite_cost import pages_read, vm_steps
from support.store_contract import Fixture

from streamd.eventlog import filters
from streamd.eventlog.model import Filter, SinceParams
from streamd.eventlog.sqlite import SqliteStore
from streamd.eventlog.sqlite.sql import SqliteSql, indexed_by
from streamd.eventlog.store import DECODED, reads


class _FarFromTheTip(SqliteSql):
    """The connection, reading every cursor as far from the newest seq (a
    log of thirty events is all tail otherwise)."""

    __slots__ = ()

    def events_source(self, flt: Filter | None, from_seq: int | None) -> str:
        return indexed_by(flt)


def _page(rows: list[Row], flt: Filter | None, from_seq: int, limit: int) -> tuple[list[int], bool]:
    matching = [
        i + 1 for i, row in enumerate(rows) if i + 1 > from_seq and filters.matches(flt, _Row(row))
    ]
    return matching[:limit], len(matching) <= limit


@pytest.mark.slow
@settings(max_examples=600, deadline=None)
@given(data=st.data(), rows=log_rows, limit=st.integers(1, 6), far=st.booleans())
def test_a_since_page_is_the_matching_events_after_the_cursor_whatever_the_read(
    data: st.DataObject, rows: list[Row], limit: int, far: bool
) -> None:
    flt = drawn_filter(data, rows)
    from_seq = data.draw(st.integers(0, len(rows)))
    db = memory_log(rows)
    sql = _FarFromTheTip(db) if far else SqliteSql(db)
    got = reads.since(sql, SinceParams(from_seq=from_seq, filter=flt, limit=limit), DECODED)
    seqs, caught_up = _page(rows, flt, from_seq, limit)
    assert [e.seq for e in got.entries] == seqs
    assert got.caught_up == caught_up
    assert got.next_seq == (seqs[-1] if seqs else from_seq)


# --- what a page reads ---------------------------------------------------------------


def _since(store: SqliteStore, flt: Filter, limit: int = 10) -> Any:
    return store.since(SinceParams(from_seq=0, filter=flt, limit=limit))


def test_a_page_by_branch_prefix_visits_each_labels_first_events_not_all_of_them(
    six_thousand_events: SqliteStore,
) -> None:
    # Before: every index entry under the prefix (2,000), collected and
    # sorted: 28,000 steps. A label's first 11 now, and the walk.
    flt = Filter(branch_prefixes=["root.a"])
    got, steps = vm_steps(six_thousand_events, lambda: _since(six_thousand_events, flt))
    assert [e.seq for e in got.entries] == list(range(1, 31, 3))
    assert steps < 2000, steps


def test_a_page_by_an_apps_user_reads_only_its_own_rows_from_the_table(
    six_thousand_events: SqliteStore,
) -> None:
    # Before: the user's 857 events read from the table as they were
    # sorted (every one that could still be in the page): 112 pages. The
    # index entries now (a few pages), then the page's 11 rows.
    flt = Filter(app="app", user="u3")
    got, pages = pages_read(six_thousand_events, lambda: _since(six_thousand_events, flt))
    assert [e.seq for e in got.entries] == list(range(4, 71, 7))
    assert pages < 60, pages


# --- the contract, on every backend ---------------------------------------------


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data(), rows=log_rows, limit=st.integers(1, 6))
def test_every_backend_pages_since_as_the_events_say(
    fx: Fixture, data: st.DataObject, rows: list[Row], limit: int
) -> None:
    store_rows(fx, rows)
    first = fx.store.latest_seq(None) - len(rows)  # the seqs of an earlier example are gone
    flt = drawn_filter(data, rows)
    from_seq = first + data.draw(st.integers(0, len(rows)))
    got = fx.store.since(SinceParams(from_seq=from_seq, filter=flt, limit=limit))
    seqs, caught_up = _page(rows, flt, from_seq - first, limit)
    assert [e.seq - first for e in got.entries] == seqs
    assert got.caught_up == caught_up
