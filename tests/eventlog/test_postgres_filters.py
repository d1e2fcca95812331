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


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
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
    assert filters.where(Filter(author_suffix="é/x"), filters.POSTGRES) == [
        ("right(author, %s) = %s", (3, "é/x"))
    ]
