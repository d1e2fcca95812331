"""Filters and rows as hypothesis generates them, and a log holding the rows."""

from __future__ import annotations

import apsw
import msgspec
from hypothesis import strategies as st

from streamd.eventlog.model import AppendParams, Filter, SessionTree
from streamd.eventlog.sqlite.schema import migrate
from support.store_contract import T0, Fixture, ev

# Characters chosen to hurt: LIKE wildcards, likely escape characters, both segment
# separators, the bytes next to them in ASCII, case pairs, the session-tree marker
# and one multi-byte character.
_ALPHABET = st.sampled_from([*list("aA%_!\\./-0:;sub"), "é"])


_text = st.text(_ALPHABET, max_size=6)


@st.composite
def _filters(draw: st.DrawFn, rows: list[tuple[str, str, str, str, str]]) -> Filter:
    # Draw filter values mostly from the rows' own values so matches happen.
    def value(i: int) -> st.SearchStrategy[str]:
        pool = [r[i] for r in rows]
        pieces = st.sampled_from(pool) if pool else _text
        return st.one_of(pieces, _text)

    def nonempty(i: int) -> st.SearchStrategy[str]:
        return value(i).filter(bool)

    tree = draw(
        st.none() | st.builds(SessionTree, app=nonempty(0), user=nonempty(1), parent=nonempty(2))
    )
    branch_values = value(3)
    prefixes = st.lists(
        st.one_of(branch_values.map(lambda b: b.split(".")[0]), branch_values, st.just("")),
        max_size=3,
    )
    return Filter(
        app=draw(st.none() | nonempty(0)),
        user=draw(st.none() | nonempty(1)),
        session=draw(st.none() | nonempty(2)),
        session_tree=tree,
        branch_prefixes=draw(st.none() | prefixes),
        author=draw(st.none() | value(4)),
        author_suffix=draw(st.one_of(st.just(""), value(4).map(lambda a: a[-2:]))),
    )


class _Row:
    """An entry's filtered fields, as the fan-out's Committed carries them."""

    def __init__(self, row: tuple[str, str, str, str, str]) -> None:
        self.app, self.user, self.session, self.branch, self.author = row



Row = tuple[str, str, str, str, str]
"""An event's app, user, session, branch and author."""

_SEPS = st.sampled_from([".", "/", ".x.", ":sub:", ""])
_nonempty = _text.filter(bool)
# Labels with segment boundaries, empty ones among them; few values, so that
# labels repeat, and a label holds events that pass a filter and others that do not.
_labels = st.one_of(st.just(""), _text, st.builds(lambda a, s, b: a + s + b, _text, _SEPS, _text))
log_rows = st.lists(st.tuples(_nonempty, _nonempty, _nonempty, _labels, _text), max_size=30)
"""Events as an append would store them (app, user and session never empty)."""


def memory_log(rows: list[Row]) -> apsw.Connection:
    """A SQLite log in memory, with the event log's schema, holding ``rows``
    at seqs 1, 2, ... (content ``null``)."""
    db = apsw.Connection(":memory:")
    migrate(db)
    db.executemany(
        "INSERT INTO sessions (app_name, user_id, session_id, state, created_at, updated_at)"
        " VALUES (?, ?, ?, '{}', 0, 0) ON CONFLICT DO NOTHING",
        list(dict.fromkeys(r[:3] for r in rows)),
    )
    db.executemany(
        "INSERT INTO events (app_name, user_id, session_id, event_id, invocation_id, author,"
        " branch, event_time, content, digest) VALUES (?, ?, ?, ?, '', ?, ?, 0, 'null', x'')",
        [(a, u, s, f"e{i}", author, b) for i, (a, u, s, b, author) in enumerate(rows)],
    )
    return db


def drawn_filter(data: st.DataObject, rows: list[Row]) -> Filter | None:
    """None or a filter of ``rows``' values, without a session most of the
    time (the reads of one session are the simple ones)."""
    flt = data.draw(st.none() | _filters(rows))
    if flt is not None and data.draw(st.booleans()):
        flt = msgspec.structs.replace(flt, session=None, session_tree=None)
    return flt


def store_rows(fx: Fixture, rows: list[Row]) -> None:
    """``rows`` as the only events of ``fx``'s log, appended in order (seqs go
    on from the earlier ones: a backend never gives a seq again)."""
    fx.raw("DELETE FROM events", ())
    fx.raw("DELETE FROM sessions", ())
    fx.store.append_batch(
        [
            AppendParams(app=a, user=u, session=s, event=ev(f"e{i}", author=author, branch=b))
            for i, (a, u, s, b, author) in enumerate(rows)
        ],
        T0,
    )
