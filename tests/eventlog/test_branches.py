"""``branches``: the walk of ``events_by_branch`` answers what the events say.

The answer is checked against a plain computation over the same events (the
distinct non-empty labels of the events :func:`filters.matches` passes, sorted
by code point, cut at the limit) for random logs, filters, limits and plan
costs: on SQLite many cases, through the store contract's ``fx`` on every
backend a few. The cost tests are SQLite's: they count the pages a call
reads, which no clock or load changes.
"""

from __future__ import annotations

from typing import Any

import apsw
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.filters import Row, _Row, drawn_filter, log_rows, memory_log, store_rows
from support.sqlite_cost import pages_read
from support.store_contract import Fixture

from streamd.eventlog import filters
from streamd.eventlog.model import Filter
from streamd.eventlog.sqlite import SqliteStore
from streamd.eventlog.sqlite.sql import SqliteSql
from streamd.eventlog.store import branches
from streamd.eventlog.store.branches import Costs

_costs = st.builds(
    Costs,
    probe=st.integers(1, 4),
    scan_share=st.integers(1, 4),
    first_steps=st.integers(1, 3),
    steps=st.integers(1, 5),
) | st.just(Costs())
_limits = st.none() | st.integers(1, 6)


def expected(rows: list[Row], flt: Filter | None, limit: int | None) -> list[str]:
    labels = sorted({r[3] for r in rows if r[3] and filters.matches(flt, _Row(r))})
    return labels if limit is None else labels[:limit]


@pytest.mark.slow
@settings(max_examples=600, deadline=None)
@given(data=st.data(), rows=log_rows, costs=_costs, limit=_limits)
def test_branches_are_the_labels_of_the_matching_events_for_any_log_filter_and_costs(
    data: st.DataObject, rows: list[Row], costs: Costs, limit: int | None
) -> None:
    flt = drawn_filter(data, rows)
    db = memory_log(rows)
    assert branches.branches(SqliteSql(db), flt, limit, costs) == expected(rows, flt, limit)


# --- which read answers ---------------------------------------------------------


class _Recording(SqliteSql):
    """The connection, with every statement it ran."""

    __slots__ = ("ran",)

    def __init__(self, db: apsw.Connection) -> None:
        super().__init__(db)
        self.ran: list[str] = []

    def rows(self, sql: str, args: Any = ()) -> list[Any]:
        self.ran.append(sql)
        return super().rows(sql, args)

    def one(self, sql: str, args: Any = ()) -> Any:
        self.ran.append(sql)
        return super().one(sql, args)


def _answered_by(rows: list[Row], flt: Filter, costs: Costs) -> tuple[list[str], str]:
    db = _Recording(memory_log(rows))
    got = branches.branches(db, flt, None, costs)
    last = db.ran[-1]
    if "DISTINCT" not in last:
        return got, "walk"
    return got, "pass" if "NOT INDEXED" in last else "range"


# Twelve events under label "b" by app "big", then one under "a" and one
# under "c" by app "small".
_CROWDED = [("big", "u", "s", "b", "x")] * 12 + [
    ("small", "u", "t", "a", "y"), ("small", "u", "t", "c", "x"),
]
_CHEAP = Costs(probe=2, scan_share=1, first_steps=4, steps=4)


def test_labels_decided_by_their_first_events_are_answered_by_the_walk_alone() -> None:
    assert _answered_by(_CROWDED, Filter(app="big"), _CHEAP) == (["b"], "walk")


def test_a_label_other_apps_fill_is_answered_from_the_small_apps_own_range() -> None:
    # "b" holds more than a probe and none of "small"'s events: undecided.
    assert _answered_by(_CROWDED, Filter(app="small"), _CHEAP) == (["a", "c"], "range")


def test_an_app_as_large_as_the_log_is_answered_by_one_pass_not_by_its_range() -> None:
    costs = Costs(probe=2, scan_share=4, first_steps=1, steps=4)  # a budget of 14 // 4 rows
    assert _answered_by(_CROWDED, Filter(app="big", author="y"), costs) == ([], "pass")


def test_a_filter_without_its_app_is_answered_by_one_pass_once_a_label_is_undecided() -> None:
    assert _answered_by(_CROWDED, Filter(author="y"), _CHEAP) == (["a"], "pass")


def test_probes_never_cost_more_than_the_apps_range_holds() -> None:
    # Forty labels of one event each, all "big"'s: probing each would read
    # forty rows; "small"'s range holds two.
    rows = [("big", "u", "s", f"l{i:02}", "x") for i in range(40)] + _CROWDED[-2:]
    costs = Costs(probe=1, scan_share=1, first_steps=4, steps=8)
    assert _answered_by(rows, Filter(app="small"), costs) == (["a", "c"], "range")


# --- what a call reads ------------------------------------------------------------


def test_the_branches_of_an_app_read_a_few_pages_per_label_not_its_events(
    six_thousand_events: SqliteStore,
) -> None:
    # The scan read each of the 6,000 events through an index: 12,000 pages.
    flt = Filter(app="app")
    got, pages = pages_read(six_thousand_events, lambda: six_thousand_events.branches(flt, None))
    assert got == ["root.a", "root.b", "root.c"]
    assert pages < 200, pages


def test_an_author_no_event_has_costs_one_pass_over_the_table_not_a_seek_per_event(
    six_thousand_events: SqliteStore,
) -> None:
    # The scan read each event by a seek through the app's range of
    # events_by_session, two pages each: 12,000, where the file holds 750.
    whole_file = six_thousand_events.connection.execute("PRAGMA page_count").fetchall()[0][0]
    flt = Filter(app="app", author="nobody")
    got, pages = pages_read(six_thousand_events, lambda: six_thousand_events.branches(flt, None))
    assert got == []
    assert pages < 2 * whole_file, (pages, whole_file)


# --- the contract, on every backend ---------------------------------------------


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data(), rows=log_rows, limit=_limits)
def test_every_backend_answers_branches_as_the_events_say(
    fx: Fixture, monkeypatch: pytest.MonkeyPatch, data: st.DataObject, rows: list[Row],
    limit: int | None,
) -> None:
    monkeypatch.setattr(branches, "COSTS", data.draw(_costs))
    store_rows(fx, rows)
    flt = drawn_filter(data, rows)
    assert fx.store.branches(flt, limit) == expected(rows, flt, limit)


def test_a_walk_longer_than_a_statement_loses_no_label(fx: Fixture) -> None:
    # 250 labels: the walk takes them in stretches of 16, 64 and 100.
    rows: list[Row] = [("app", "u", "s", f"l{i:03}", "me") for i in range(250)]
    rows += [("app", "u", "s", f"l{i:03}.sub", "other") for i in range(0, 250, 7)]
    store_rows(fx, rows)
    assert fx.store.branches(None, None) == expected(rows, None, None)
    assert fx.store.branches(Filter(app="app", author="other"), None) == expected(
        rows, Filter(author="other"), None
    )
    assert fx.store.branches(Filter(branch_prefixes=["l1"]), 20) == []
    assert fx.store.branches(Filter(branch_prefixes=["l100", "l014"]), None) == [
        "l014", "l014.sub", "l100",
    ]
    assert fx.store.branches(Filter(app="app"), 200) == expected(rows, None, 200)
