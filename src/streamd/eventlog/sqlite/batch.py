"""SQLite's batch write: the appends of one group commit, inside the caller's
transaction (:meth:`~streamd.eventlog.sqlite.store.SqliteStore.append_commit`
opens it and holds the connection).

What is SQLite's own here is how seq is given (``AUTOINCREMENT``, inside the
writing transaction, so commit order is seq order) and the savepoint per item
when a batch has to be written carefully; the rules of an append (digests,
refusals, expected seq) are the shared ones of :mod:`streamd.eventlog.store`.
"""

from __future__ import annotations

from typing import Any

import apsw

from streamd.errors import (
    RpcError,
    invalid_params,
)
from streamd.eventlog.model import AppendResult
from streamd.eventlog.sqlite.sql import SqliteSql
from streamd.eventlog.store import rows, rules
from streamd.eventlog.store.chain import Chain, SessionKey
from streamd.eventlog.store.state import apply_delta

__all__ = ["append_items", "append_one"]


def append_items(
    sql: SqliteSql,
    prepared: list[rows.Prepared | list[rows.Prepared] | RpcError],
    now_us: int,
    capture: bool,
    careful: bool,
) -> tuple[list[AppendResult | list[AppendResult] | RpcError], list[tuple[Any, ...]] | None]:
    """Append ``prepared`` in the caller's transaction: each item (an append,
    or a group) in its own savepoint when ``careful``, so a refused one is
    rolled back alone and answered with its error; otherwise with no savepoint
    of its own, the first refusal raised (the caller rolls the lot back)."""
    db = sql.connection
    out: list[AppendResult | list[AppendResult] | RpcError] = []
    added: list[tuple[Any, ...]] | None = [] if capture else None
    # Sessions an append of this transaction has already upserted (see
    # append_one); like ``added``, a group's join only once it is in.
    upserted: set[tuple[str, str, str]] = set()
    for item in prepared:
        if isinstance(item, RpcError):
            out.append(item)
            continue
        if not careful:
            if isinstance(item, list):
                out.append(_group(sql, item, now_us, added, upserted))
            else:
                out.append(append_one(sql, item, now_us, added, upserted))
            continue
        # Rows join ``added`` only once their savepoint has released: a
        # refused event (or group) was rolled back and nobody may see it.
        pending: list[tuple[Any, ...]] | None = [] if capture else None
        try:
            with db:
                if isinstance(item, list):
                    in_group = set(upserted)
                    out.append(_group(sql, item, now_us, pending, in_group))
                    upserted = in_group
                else:
                    out.append(append_one(sql, item, now_us, pending, upserted))
        except RpcError as exc:
            out.append(exc)
            continue
        except apsw.ConstraintError as exc:
            out.append(invalid_params(f"event rejected by the database: {exc}"))
            continue
        if added is not None and pending:
            added.extend(pending)
    return out, added


def append_one(
    sql: SqliteSql,
    item: rows.Prepared,
    now_us: int,
    added: list[tuple[Any, ...]] | None = None,
    upserted: set[tuple[str, str, str]] | None = None,
) -> AppendResult:
    """Append one event in the caller's savepoint; with ``added``, put the new
    row there in :data:`~streamd.eventlog.store.rows.ENTRY_COLUMNS` order.

    ``upserted`` holds the sessions already upserted in this transaction, at
    this ``now_us``, by appends that are in (their savepoint released, or
    earlier in this one's group): for those the upsert would change nothing
    (the row exists, its ``updated_at`` is already at least ``now_us``), so it
    is skipped; this append's session joins the set once it has succeeded.
    A batch of 200 appends to 8 sessions runs 8 upserts, not 200: one
    statement in three of the usual append."""
    db = sql.connection
    p = item.params
    ev = p.event
    existing = db.execute("SELECT seq, digest FROM events WHERE event_id = ?", (ev.id,)).fetchone()
    if existing is not None:
        return rules.retried(item, *existing)
    if p.expected_seq is not None:
        _check_expected(db, p.app, p.user, p.session, p.expected_seq)
    # The session row exists from the first append on, so sessions.get can tell a
    # session that was written from one that never was.
    key = (p.app, p.user, p.session)
    if upserted is None or key not in upserted:
        db.execute(
            "INSERT INTO sessions (app_name, user_id, session_id, state, created_at, updated_at)"
            " VALUES (?, ?, ?, '{}', ?, ?)"
            " ON CONFLICT (app_name, user_id, session_id)"
            " DO UPDATE SET updated_at = max(updated_at, excluded.updated_at)",
            (p.app, p.user, p.session, now_us, now_us),
        )
    row = db.execute(
        "INSERT INTO events (app_name, user_id, session_id, event_id, invocation_id, author,"
        " branch, event_time, content, metadata, digest, state_delta)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING seq",
        (
            p.app,
            p.user,
            p.session,
            ev.id,
            ev.invocation_id,
            ev.author,
            ev.branch,
            item.event_time,
            item.content,
            item.metadata,
            item.digest,
            item.state_delta_text,
        ),
    ).fetchone()
    assert row is not None
    seq = row[0]
    if item.state_delta is not None:
        apply_delta(sql, p.app, p.user, p.session, item.state_delta, seq, now_us)
    if added is not None:
        added.append(
            (seq, p.app, p.user, p.session, ev.id, ev.invocation_id, ev.author, ev.branch,
             item.event_time, item.content, item.metadata, item.state_delta_text)
        )
    if upserted is not None:
        upserted.add(key)
    return AppendResult(seq=seq, duplicate=False)


def _check_expected(db: apsw.Connection, app: str, user: str, session: str, expected: int) -> None:
    """Optimistic concurrency: the writer computed this append from the session
    as of ``expected``; if anything was appended since, the append must be
    recomputed, not merged. One primary-key read of ``sessions.last_seq``,
    inside the append's transaction, so no writer can slip in between."""
    found = db.execute(
        "SELECT last_seq FROM sessions WHERE app_name = ? AND user_id = ? AND session_id = ?",
        (app, user, session),
    ).fetchone()
    if found is None:
        raise rules.not_found(app, user, session)
    if found[0] != expected:
        raise rules.stale(session, expected, found[0])


def _group(
    sql: SqliteSql,
    group: list[rows.Prepared],
    now_us: int,
    added: list[tuple[Any, ...]] | None,
    upserted: set[tuple[str, str, str]],
) -> list[AppendResult]:
    """A group's appends in order, each later append of a session expecting
    it where the earlier ones left it (:mod:`~streamd.eventlog.store.chain`)."""
    chain = Chain()
    out = []

    def from_seq(key: SessionKey, seq: int) -> list[int]:
        return _from_seq(sql.connection, key, seq)

    for i, one in enumerate(group):
        one = chain.expecting(one)
        result = _in_group(sql, one, i, now_us, added, upserted)
        chain.took(one, result, from_seq)
        out.append(result)
    return out


def _from_seq(db: apsw.Connection, key: SessionKey, seq: int) -> list[int]:
    return [row[0] for row in db.execute(
        "SELECT seq FROM events WHERE app_name = ? AND user_id = ? AND session_id = ?"
        " AND seq >= ? ORDER BY seq LIMIT 2", (*key, seq))]


def _in_group(
    sql: SqliteSql,
    item: rows.Prepared,
    index: int,
    now_us: int,
    added: list[tuple[Any, ...]] | None,
    upserted: set[tuple[str, str, str]] | None = None,
) -> AppendResult:
    try:
        return append_one(sql, item, now_us, added, upserted)
    except RpcError as exc:
        raise rules.refused_in_group(exc, index) from None
    except apsw.ConstraintError as exc:
        raise rules.refused_in_group(
            invalid_params(f"event rejected by the database: {exc}"), index
        ) from None

