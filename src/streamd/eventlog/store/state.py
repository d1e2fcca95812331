"""State: the app's, the user's and the session's, current and as of a seq.

Each scope keeps its current state in a row (``app_states``, ``user_states``,
``sessions.state``) and its history as deltas in ``state_deltas``, each at the
seq of the write that made it; a read "as of a seq" folds the deltas up to it.
A delta is recorded and merged in the caller's transaction, with the event
that carries it: the state never says what the log does not.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from streamd.errors import invalid_params
from streamd.eventlog.model import MAX_STATE_BYTES, StateDelta, StateSnapshot
from streamd.eventlog.store import rows, rules
from streamd.eventlog.store.sql import Sql

__all__ = ["apply_delta", "fold", "get_state", "session_exists", "shared_state"]

_SESSION = "app_name = ? AND user_id = ? AND session_id = ?"


def session_exists(db: Sql, app: str, user: str, session: str) -> bool:
    if db.dialect.cannot_hold(app, user, session):
        return False
    return db.one(f"SELECT 1 FROM sessions WHERE {_SESSION}", (app, user, session)) is not None


def shared_state(
    db: Sql, app: str, user: str | None
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The app's current state, and the user's when ``user`` is given. A name
    the database cannot hold has no state stored: ``{}``, as for any other
    app or user that never had one."""
    if db.dialect.cannot_hold(app):
        return {}, None if user is None else {}
    if user is None or db.dialect.cannot_hold(user):
        found = db.one("SELECT state FROM app_states WHERE app_name = ?", (app,))
        app_state = rows.state_or_empty(found[0] if found else None, f"app {app!r}")
        return app_state, None if user is None else {}
    # Both in one statement: one round trip to a server, one statement less
    # in every session read that carries the shared state (ADK's).
    both = db.one(
        "SELECT (SELECT state FROM app_states WHERE app_name = ?),"
        " (SELECT state FROM user_states WHERE app_name = ? AND user_id = ?)",
        (app, app, user),
    )
    assert both is not None  # a SELECT without FROM always answers one row
    return (
        rows.state_or_empty(both[0], f"app {app!r}"),
        rows.state_or_empty(both[1], f"user {user!r}"),
    )


def fold(db: Sql, scope: str, app: str, user: str, session: str, as_of_seq: int) -> dict[str, Any]:
    """One scope's state as of a seq: for each key, the value of the newest
    delta up to that seq that set it, in the order the keys were first set.

    The deltas are read newest first, and the read stops once every key of
    the scope's current state has its value: a state only ever gains keys
    (a delta sets, never removes), so no older delta holds a key the current
    state lacks, and the keys' first-set order is the current state's own
    (``log verify`` checks that the current state is the fold of every
    delta). Read oldest first, a state as of the middle of a million events
    folded all 20,000 of its app's deltas before it: 22 ms, where its newest
    delta alone answered. A key first set after the seq is not found before
    it, and then every delta up to the seq is read, as before. A scope with
    no current state, or one that does not parse, is folded whole, oldest
    first."""
    if db.dialect.cannot_hold(app, user, session):
        return {}
    keys = _current_keys(db, scope, app, user, session)
    if keys is None:
        return _fold_forward(db, scope, app, user, session, as_of_seq)
    found: dict[str, Any] = {}
    for text in _deltas_newest_first(db, scope, app, user, session, as_of_seq):
        for key, value in rows.state_or_empty(text, f"{scope} delta").items():
            found.setdefault(key, value)
        if len(found) >= len(keys) and keys.keys() <= found.keys():
            break
    return {key: found[key] for key in keys if key in found} | found


def _current_keys(
    db: Sql, scope: str, app: str, user: str, session: str
) -> dict[str, Any] | None:
    """The scope's current state (its keys in the order they were first
    set), or None when it has none or it does not parse."""
    if scope == "app":
        row = db.one("SELECT state FROM app_states WHERE app_name = ?", (app,))
    elif scope == "user":
        row = db.one(
            "SELECT state FROM user_states WHERE app_name = ? AND user_id = ?", (app, user)
        )
    else:
        row = db.one(f"SELECT state FROM sessions WHERE {_SESSION}", (app, user, session))
    if row is None:
        return None
    try:
        return rows.decode_state(row[0])
    except ValueError:
        return None


_KEY = "scope = ? AND app_name = ? AND user_id = ? AND session_id = ?"
_DELTAS = f"FROM state_deltas WHERE {_KEY}"
_LEAST_SEQ = -(2**63)


def _fold_forward(
    db: Sql, scope: str, app: str, user: str, session: str, as_of_seq: int
) -> dict[str, Any]:
    state: dict[str, Any] = {}
    for (text,) in db.rows(
        f"SELECT delta {_DELTAS} AND seq <= ? ORDER BY seq, rev",
        (scope, app, user, session, as_of_seq),
    ):
        state.update(rows.state_or_empty(text, f"{scope} delta"))
    return state


def _deltas_newest_first(
    db: Sql, scope: str, app: str, user: str, session: str, as_of_seq: int
) -> Iterator[str]:
    """The scope's deltas up to ``as_of_seq``, newest first (a delta's rev
    orders those of one seq), in pages that grow from a few seqs: a server's
    driver reads a whole result at once, and the first rows usually do.

    A page is the deltas of its seqs: the least of them is found first, in
    the index alone, then the deltas between it and the page's top are read.
    Asked in one statement for the newest deltas by (seq, rev), MariaDB read
    every delta of the key up to ``as_of_seq`` and sorted them (``rev`` is
    not a column of ``state_deltas_by_key`` there, whose key would pass
    InnoDB's 3,072 bytes): 20,000 for an app's state as of the middle of a
    million-event log, 30-39 ms. Now a page reads its own rows."""
    key = (scope, app, user, session)
    by_key = db.dialect.ranged("state_deltas", "state_deltas_by_key")
    top = as_of_seq
    page = 4
    while True:
        least = db.one(
            f"SELECT seq FROM {by_key} WHERE {_KEY} AND seq <= ?"
            " ORDER BY seq DESC LIMIT 1 OFFSET ?",
            (*key, top, page - 1),
        )
        low = least[0] if least is not None else _LEAST_SEQ
        for (text,) in db.rows(
            f"SELECT delta {_DELTAS} AND seq <= ? AND seq >= ? ORDER BY seq DESC, rev DESC",
            (*key, top, low),
        ):
            yield text
        if least is None:
            return
        top, page = low - 1, min(1024, 4 * page)


def get_state(
    db: Sql, app: str, user: str | None, session: str | None, as_of_seq: int | None
) -> StateSnapshot:
    """The state of the app (and of the user, and the session, when named),
    current or as of a seq, in one snapshot. A session never written is
    ``session_not_found``; a session as of a seq before its creation has
    ``{}``."""
    if session is not None and user is None:
        raise invalid_params("state.get of a session needs its user")
    with db.snapshot():
        if session is not None and not session_exists(db, app, user or "", session):
            raise rules.not_found(app, user or "", session)
        newest = db.newest_seq()
        if as_of_seq is None or as_of_seq >= newest:
            app_state, user_state = shared_state(db, app, user)
            session_state = None
            if session is not None:
                found = db.one(f"SELECT state FROM sessions WHERE {_SESSION}", (app, user, session))
                assert found is not None  # the session exists: checked above
                session_state = rows.state_or_empty(found[0], f"session {session!r}")
            # A seq past the newest reads the state now, and says which seq
            # that is: the answer must stay true after the next write.
            return StateSnapshot(
                seq=newest,
                app=app_state,
                user=user_state,
                session=session_state,
            )
        return StateSnapshot(
            seq=as_of_seq,
            app=fold(db, "app", app, "", "", as_of_seq),
            user=None if user is None else fold(db, "user", app, user, "", as_of_seq),
            session=(
                None
                if session is None
                else fold(db, "session", app, user or "", session, as_of_seq)
            ),
        )


def apply_delta(
    db: Sql, app: str, user: str, session: str, delta: StateDelta, at_seq: int, now_us: int
) -> None:
    """Record each scope's delta at ``at_seq`` and fold it into that scope's
    current state; the caller's transaction holds both, and the event (and,
    where writers run side by side, the counter's lock, so no other writer
    merges into the same state meanwhile)."""
    if delta.app:
        _merge(db, "app_states", ("app_name",), (app,), f"app {app!r}", delta.app, now_us)
        _record(db, "app", app, "", "", at_seq, delta.app)
    if delta.user:
        _merge(
            db, "user_states", ("app_name", "user_id"), (app, user), f"user {user!r}",
            delta.user, now_us,
        )
        _record(db, "user", app, user, "", at_seq, delta.user)
    if delta.session:
        found = db.one(f"SELECT state FROM sessions WHERE {_SESSION}", (app, user, session))
        assert found is not None  # the caller wrote the session row
        what = f"session {session!r}"
        state = rules.parsed_for_merge(found[0], what)
        state.update(delta.session)
        db.run(
            f"UPDATE sessions SET state = ? WHERE {_SESSION}",
            (_stored(state, what, found[0]), app, user, session),
        )
        _record(db, "session", app, user, session, at_seq, delta.session)


def _merge(
    db: Sql,
    table: str,
    columns: tuple[str, ...],
    key: tuple[str, ...],
    what: str,
    delta: dict[str, Any],
    now_us: int,
) -> None:
    where = " AND ".join(f"{c} = ?" for c in columns)
    found = db.one(f"SELECT state FROM {table} WHERE {where}", key)
    state = rules.parsed_for_merge(found[0], what) if found else {}
    state.update(delta)
    text = _stored(state, what, found[0] if found else "")
    if found:
        db.run(f"UPDATE {table} SET state = ?, updated_at = ? WHERE {where}", (text, now_us, *key))
    else:
        marks = ", ".join("?" * (len(key) + 2))
        db.run(
            f"INSERT INTO {table} ({', '.join(columns)}, state, updated_at) VALUES ({marks})",
            (*key, text, now_us),
        )


def _stored(state: dict[str, Any], what: str, before: str) -> str:
    """``state`` as its row stores it, refused when it would grow past
    :data:`MAX_STATE_BYTES` (the transaction, and with it the event that
    carried the delta, is then rolled back: the writer hears why). ``before``
    is the stored text it was merged into: a state already past the limit (made
    before there was one) still takes a delta that does not grow it, so that
    its session is never frozen."""
    text = rows.json_text(state)
    # Characters first: the UTF-8 bytes are at most four times as many.
    if (4 * len(text) > MAX_STATE_BYTES and (size := len(text.encode())) > MAX_STATE_BYTES
            and size > len(before.encode())):
        raise invalid_params(
            f"the {what} state would be {size} bytes of JSON, over the {MAX_STATE_BYTES}"
            " a state may take so that a session read carrying it fits one frame"
        )
    return text


def _record(
    db: Sql, scope: str, app: str, user: str, session: str, at_seq: int, delta: dict[str, Any]
) -> None:
    db.run(
        "INSERT INTO state_deltas (scope, app_name, user_id, session_id, seq, delta)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        (scope, app, user, session, at_seq, rows.json_text(delta)),
    )
