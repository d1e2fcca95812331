"""The Filter -> SQL translation, checked against SQLite and a model of the spec.

The model below is written from the contract's words, not from filters.py: a
prefix ``p`` matches ``p``, ``p.*`` and ``p/*``; a session tree is the parent plus
``<parent>:sub:*``; an author suffix is ``endswith``. Every generated case runs the
real SQL on a real table and compares.
"""

from __future__ import annotations

import apsw
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.filters import _filters, _Row, _text

from streamd.eventlog import filters
from streamd.eventlog.model import Filter, SessionTree

pytestmark = pytest.mark.slow


def _table(rows: list[tuple[str, str, str, str, str]]) -> apsw.Connection:
    db = apsw.Connection(":memory:")
    db.execute(
        "CREATE TABLE events (seq INTEGER PRIMARY KEY, app_name TEXT, user_id TEXT,"
        " session_id TEXT, branch TEXT, author TEXT)"
    )
    db.executemany(
        "INSERT INTO events (app_name, user_id, session_id, branch, author) VALUES (?,?,?,?,?)",
        rows,
    )
    return db


def _select(db: apsw.Connection, flt: Filter | None) -> list[int]:
    where, args = filters.render(filters.where(flt))
    return [r[0] for r in db.execute(f"SELECT seq FROM events WHERE {where} ORDER BY seq", args)]


def _model(row: tuple[str, str, str, str, str], flt: Filter) -> bool:
    app, user, session, branch, author = row
    if flt.session_tree is not None:
        t = flt.session_tree
        if (app, user) != (t.app, t.user):
            return False
        if not (session == t.parent or session.startswith(t.parent + ":sub:")):
            return False
    else:
        if flt.app is not None and app != flt.app:
            return False
        if flt.user is not None and user != flt.user:
            return False
        if flt.session is not None and session != flt.session:
            return False
    if flt.branch_prefixes is not None:
        prefixes = [p for p in flt.branch_prefixes if p]
        if not any(
            branch == p or branch.startswith(p + ".") or branch.startswith(p + "/")
            for p in prefixes
        ):
            return False
    if flt.author is not None and author != flt.author:
        return False
    return not (flt.author_suffix and not author.endswith(flt.author_suffix))


_rows = st.lists(st.tuples(_text, _text, _text, _text, _text), max_size=25)




@settings(max_examples=400, deadline=None)
@given(data=st.data(), rows=_rows)
def test_sql_filter_selects_exactly_what_the_contract_describes(
    data: st.DataObject, rows: list[tuple[str, str, str, str, str]]
) -> None:
    flt = data.draw(_filters(rows))
    db = _table(rows)
    expected = [i + 1 for i, row in enumerate(rows) if _model(row, flt)]
    assert _select(db, flt) == expected




@settings(max_examples=400, deadline=None)
@given(data=st.data(), rows=_rows)
def test_the_in_memory_match_agrees_with_the_sql_on_every_row(
    data: st.DataObject, rows: list[tuple[str, str, str, str, str]]
) -> None:
    # The fan-out decides in Python what a watch reading the store decides in
    # SQL; a disagreement would make a live watch differ from its replay.
    flt = data.draw(st.none() | _filters(rows))
    db = _table(rows)
    in_memory = [i + 1 for i, row in enumerate(rows) if filters.matches(flt, _Row(row))]
    assert in_memory == _select(db, flt)


BRANCHES = [
    "",
    "gke_cluster",
    "gke_cluster.child",
    "gkeXcluster.child",
    "gke%",
    "gke%.a",
    "gkeZZ.a",
    "a!b",
    "a!b/x",
    "aXb",
    "a\\b.c",
    "aZb.c",
    "Agent.x",
    "agent.x",
    "agent",
    "agentsmith",
    "agent-x",
    "agent/y",
    "agent0",
]


def _branches_matching(prefixes: list[str]) -> list[str]:
    db = _table([("a", "u", "s", b, "x") for b in BRANCHES])
    where, args = filters.render(filters.where(Filter(branch_prefixes=prefixes)))
    return [r[0] for r in db.execute(f"SELECT branch FROM events WHERE {where} ORDER BY seq", args)]


def test_underscore_in_a_prefix_is_not_a_single_character_wildcard() -> None:
    assert _branches_matching(["gke_cluster"]) == ["gke_cluster", "gke_cluster.child"]


def test_percent_in_a_prefix_is_not_a_wildcard() -> None:
    assert _branches_matching(["gke%"]) == ["gke%", "gke%.a"]


@pytest.mark.parametrize("escape", ["!", "\\"])
def test_escape_characters_in_a_prefix_match_only_themselves(escape: str) -> None:
    branch = f"a{escape}b"
    assert _branches_matching([branch]) == [b for b in BRANCHES if b.startswith(branch)]
    assert "aXb" not in _branches_matching([branch])


def test_prefix_matches_at_segment_boundaries_only_and_case_sensitively() -> None:
    assert _branches_matching(["agent"]) == ["agent.x", "agent", "agent/y"]


def test_prefix_group_is_an_or_of_its_members() -> None:
    assert _branches_matching(["agent", "gke%"]) == [
        "gke%",
        "gke%.a",
        "agent.x",
        "agent",
        "agent/y",
    ]


def test_an_empty_prefix_is_dropped_and_never_widens_the_query() -> None:
    assert _branches_matching(["", "agent"]) == _branches_matching(["agent"])
    # A group of nothing but blanks must not fall back to "every branch".
    assert _branches_matching([""]) == []
    assert _branches_matching([]) == []


def test_omitted_filter_parts_do_not_restrict() -> None:
    db = _table([("a", "u", "s", "b", "x"), ("b", "v", "t", "", "")])
    assert _select(db, None) == [1, 2]
    assert _select(db, Filter()) == [1, 2]


def test_session_tree_takes_precedence_over_app_user_session() -> None:
    db = _table(
        [
            ("a", "u", "p", "", "x"),
            ("a", "u", "p:sub:one", "", "x"),
            ("a", "u", "p:subway", "", "x"),
            ("a", "u", "other", "", "x"),
        ]
    )
    flt = Filter(
        app="zzz", session="other", session_tree=SessionTree(app="a", user="u", parent="p")
    )
    assert _select(db, flt) == [1, 2]


def test_author_suffix_matches_the_end_literally() -> None:
    db = _table(
        [
            ("a", "u", "s", "", "core/autonomous"),
            ("a", "u", "s", "", "scion/autonomous"),
            ("a", "u", "s", "", "autonomous/other"),
            ("a", "u", "s", "", "x_autonomous"),
            ("a", "u", "s", "", "nomous"),
        ]
    )
    assert _select(db, Filter(author_suffix="/autonomous")) == [1, 2]
    assert _select(db, Filter(author_suffix="_autonomous")) == [4]
    assert _select(db, Filter(author_suffix="")) == [1, 2, 3, 4, 5]
