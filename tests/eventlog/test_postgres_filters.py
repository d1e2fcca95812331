"""The event log's filters on PostgreSQL: the in-memory match agrees with the
SQL, and each rule is spelled in the dialect asked for.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.filters import _ALPHABET, _filters, _Row, _text

from streamd.eventlog import filters
from streamd.eventlog.model import (
    Filter,
    SessionTree,
    SinceParams,
)
from streamd.eventlog.postgres.store import PostgresStore

# --- the in-memory filter agrees with the SQL on PostgreSQL --------------------------------

_SEPS = st.sampled_from([".", "/", ":sub:", ":sub;", ""])


def _joined_text() -> st.SearchStrategy[str]:
    # Values with the boundaries the rules turn on: a branch segment, a session
    # tree child, and the bytes next to them.
    return st.one_of(_text, st.builds(lambda a, s, b: a + s + b, _text, _SEPS, _text))


_pg_rows = st.lists(st.tuples(_text, _text, _joined_text(), _joined_text(), _text), max_size=25)


@pytest.fixture
def filter_db(postgres_db: str) -> Iterator[tuple[psycopg.Connection[Any], PostgresStore]]:
    admin = psycopg.connect(postgres_db, autocommit=True)
    admin.execute("SET search_path = streamd")
    store = PostgresStore.open(postgres_db)
    yield admin, store
    store.close()
    admin.close()


# Each example is a round trip through the server: fewer than hypothesis's
# default, no deadline; the database fixture is reused across examples.
_ON_POSTGRES = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@_ON_POSTGRES
@given(data=st.data(), rows=_pg_rows)
def test_the_in_memory_match_agrees_with_since_on_postgres(
    filter_db: tuple[psycopg.Connection[Any], PostgresStore],
    data: st.DataObject,
    rows: list[tuple[str, str, str, str, str]],
) -> None:
    admin, store = filter_db
    flt = data.draw(st.none() | _filters(rows))
    if flt is not None and rows and data.draw(st.booleans()):
        # A suffix longer than some author (short authors with a suffix).
        author = data.draw(st.sampled_from([r[4] for r in rows]))
        flt = msgspec.structs.replace(flt, author_suffix=data.draw(_ALPHABET) + author)
    _agree(admin, store, rows, flt)


@_ON_POSTGRES
@given(data=st.data(), rows=_pg_rows)
def test_a_filter_naming_u0000_agrees_with_the_in_memory_match_on_postgres(
    filter_db: tuple[psycopg.Connection[Any], PostgresStore],
    data: st.DataObject,
    rows: list[tuple[str, str, str, str, str]],
) -> None:
    # No stored text holds U+0000 here: a field naming one matches nothing
    # (a branch prefix naming one leaves its group), as the in-memory match
    # says, and the read is answered, not refused by the server.
    admin, store = filter_db
    _agree(admin, store, rows, _naming_nul(data, data.draw(_filters(rows))))


def _naming_nul(data: st.DataObject, flt: Filter) -> Filter:
    """``flt`` with U+0000 put into one of its texts, anywhere in it."""

    def cut(text: str) -> str:
        at = data.draw(st.integers(0, len(text)))
        return text[:at] + "\x00" + text[at:]

    fields = [f for f in ("app", "user", "session", "author", "author_suffix") if getattr(flt, f)]
    if flt.branch_prefixes:
        fields.append("branch_prefixes")
    if flt.session_tree is not None:
        fields.append("session_tree")
    field = data.draw(st.sampled_from(fields or ["author"]))
    if field == "branch_prefixes":
        prefixes = list(flt.branch_prefixes or [])
        i = data.draw(st.integers(0, len(prefixes) - 1))
        return msgspec.structs.replace(
            flt, branch_prefixes=[*prefixes[:i], cut(prefixes[i]), *prefixes[i + 1:]]
        )
    if field == "session_tree":
        assert flt.session_tree is not None
        part = data.draw(st.sampled_from(["app", "user", "parent"]))
        tree = msgspec.structs.replace(
            flt.session_tree, **{part: cut(getattr(flt.session_tree, part))}
        )
        return msgspec.structs.replace(flt, session_tree=tree)
    return msgspec.structs.replace(flt, **{field: cut(getattr(flt, field) or "")})


def _agree(
    admin: psycopg.Connection[Any],
    store: PostgresStore,
    rows: list[tuple[str, str, str, str, str]],
    flt: Filter | None,
) -> None:
    """Store ``rows`` alone, and read them with ``flt`` both ways."""
    with admin.transaction():
        admin.execute("TRUNCATE events, sessions")
        admin.cursor().executemany(
            "INSERT INTO sessions (app_name, user_id, session_id, state, created_at,"
            " updated_at) VALUES (%s, %s, %s, '{}', 0, 0) ON CONFLICT DO NOTHING",
            list(dict.fromkeys(r[:3] for r in rows)),
        )
        admin.cursor().executemany(
            "INSERT INTO events (seq, app_name, user_id, session_id, event_id, invocation_id,"
            " author, branch, event_time, content, digest) VALUES"
            " (%s, %s, %s, %s, %s, '', %s, %s, 0, 'null', '')",
            [
                (i + 1, app, user, session, f"e{i}", author, branch)
                for i, (app, user, session, branch, author) in enumerate(rows)
            ],
        )
    in_memory = [i + 1 for i, row in enumerate(rows) if filters.matches(flt, _Row(row))]
    assert [
        e.seq for e in store.since(SinceParams(from_seq=0, filter=flt, limit=1000)).entries
    ] == in_memory
    assert store.latest_seq(flt) == (in_memory[-1] if in_memory else 0)


def test_filters_spell_each_rule_in_the_dialect_asked_for() -> None:
    # One set of rules, two spellings: a conjunct written in SQLite's spelling
    # only would fail here instead of silently on PostgreSQL.
    flt = Filter(
        session_tree=SessionTree(app="a", user="u", parent="p"),
        branch_prefixes=["x"],
        author="me",
        author_suffix="é/x",
    )
    for dialect, param in ((filters.POSTGRES, "%s"), (filters.SQLITE, "?")):
        clauses = filters.where(flt, dialect)
        other = "?" if param == "%s" else "%s"
        assert all(other not in text for text, _ in clauses)
        assert sum(text.count(param) for text, _ in clauses) == sum(len(a) for _, a in clauses)
    assert filters.where(flt) == filters.where(flt, filters.SQLITE)
    assert filters.where(Filter(branch_prefixes=[""]), filters.POSTGRES) == [("false", ())]
    # PostgreSQL text holds no U+0000, so a value naming one matches nothing
    # and is never sent; SQLite's holds it.
    assert filters.where(Filter(app="a", author="m\x00e"), filters.POSTGRES) == [("false", ())]
    assert filters.where(Filter(author="m\x00e")) == [("author = ?", ("m\x00e",))]
    assert filters.where(Filter(author_suffix="é/x"), filters.POSTGRES) == [
        ("right(author, %s) = %s", (3, "é/x"))
    ]
