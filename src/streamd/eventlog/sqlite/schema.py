"""The event log's SQLite schema: forward-only migrations and who may be opened.

``PRAGMA user_version`` counts the migrations applied: entry ``i`` of
:data:`MIGRATIONS` brings a database from version ``i`` to ``i + 1``, inside one
transaction. A database written by a newer streamd is refused rather than
guessed at, and a database that is neither empty nor ours (another program's
file given as ``--db``) is refused before anything in it changes.
"""

from __future__ import annotations

import apsw

from streamd.errors import SOURCE_UNAVAILABLE, RpcError

__all__ = ["APPLICATION_ID", "MIGRATIONS", "SCHEMA_VERSION", "migrate", "refuse_foreign"]

APPLICATION_ID = 0x53544D44  # "STMD" in PRAGMA application_id
_OUR_TABLES = frozenset({"sessions", "events", "leases", "boots"})
"""The tables of version 1: a file holding them (and no application id) is ours."""

_V1 = """
CREATE TABLE sessions (
    app_name    TEXT NOT NULL,
    user_id     TEXT NOT NULL,
    session_id  TEXT NOT NULL,
    state       TEXT NOT NULL,            -- JSON object
    created_at  INTEGER NOT NULL,         -- microseconds since the epoch, UTC
    updated_at  INTEGER NOT NULL,
    PRIMARY KEY (app_name, user_id, session_id)
) WITHOUT ROWID;

CREATE TABLE events (
    seq           INTEGER PRIMARY KEY AUTOINCREMENT,
    app_name      TEXT NOT NULL,
    user_id       TEXT NOT NULL,
    session_id    TEXT NOT NULL,
    event_id      TEXT NOT NULL UNIQUE,
    invocation_id TEXT NOT NULL,
    author        TEXT NOT NULL,
    branch        TEXT NOT NULL,
    event_time    INTEGER NOT NULL,       -- microseconds since the epoch, UTC
    content       TEXT NOT NULL,          -- JSON, as the client sent it
    metadata      TEXT,                   -- JSON object, NULL when none
    digest        BLOB NOT NULL,          -- identity of the request, for safe retry
    FOREIGN KEY (app_name, user_id, session_id)
        REFERENCES sessions (app_name, user_id, session_id) ON DELETE CASCADE
);
-- since/watch/latest_seq with a session or session-tree filter: equality on the
-- triple then a range on seq, already in seq order. Also the FK's child index.
CREATE INDEX events_by_session ON events (app_name, user_id, session_id, seq);
-- branch prefixes are byte ranges on branch (see filters.py).
CREATE INDEX events_by_branch ON events (branch, seq);

CREATE TABLE leases (
    app_name     TEXT NOT NULL,
    user_id      TEXT NOT NULL,
    session_id   TEXT NOT NULL,
    holder       TEXT NOT NULL,           -- host/pid/8-hex, one per acquisition
    acquired_at  INTEGER NOT NULL,
    heartbeat_at INTEGER NOT NULL,
    PRIMARY KEY (app_name, user_id, session_id)
) WITHOUT ROWID;

CREATE TABLE boots (
    id        INTEGER PRIMARY KEY AUTOINCREMENT,
    boot_at   INTEGER NOT NULL,
    attempted TEXT NOT NULL               -- JSON list of session ids
);
CREATE INDEX boots_by_time ON boots (boot_at, id);
"""

# Version 2: a lease remembers the stale window its holder declared, because
# staleness is the holder's promise ("consider me dead after this long without a
# beat"); judging it by the requester's window let anyone take a healthy lease
# by asking with a tiny one. Leases written by version 1 were acquired with the
# default window far more often than not, so they keep that.
#
# It also stamps the file with streamd's application id (the SQLite header field
# meant for this), so a later open can tell our database from another program's
# without guessing from table names.
#
# And it makes content that is not JSON impossible to store, through this store
# or by hand with SQL: reads copy content to the wire unparsed, so such a row
# would corrupt every reply that carries it. Checked once per write (about a
# microsecond) instead of on every read (a tenth of a since page). Every row
# written before was encoded by msgspec, so it needs no check.
_V2 = f"""
ALTER TABLE leases ADD COLUMN stale_after_ms INTEGER NOT NULL DEFAULT 30000;
CREATE TRIGGER events_content_is_json BEFORE INSERT ON events
    WHEN NOT json_valid(NEW.content)
    BEGIN SELECT RAISE(ABORT, 'event content is not JSON'); END;
CREATE TRIGGER events_content_stays_json BEFORE UPDATE OF content ON events
    WHEN NOT json_valid(NEW.content)
    BEGIN SELECT RAISE(ABORT, 'event content is not JSON'); END;
PRAGMA application_id = {APPLICATION_ID};
"""

# Version 3: state, and reads bounded by time.
#
# * State lives in three places, each for one kind of read. ``state_deltas`` is
#   the history: one row per scope an append (or a session's creation) set, at
#   the position it took effect (the event's seq; for a creation, the newest seq
#   when it committed), which is what a read "as of seq N" folds. The current
#   state is kept folded, for reads that must not grow with history:
#   ``sessions.state`` (already there), ``app_states`` and ``user_states``.
#   Both are written in the transaction of the event that carries the delta.
#   App and user rows have no foreign key: deleting a session leaves the state
#   its user and app share, as a framework expects (ADK's services do).
# * ``events.state_delta`` keeps the delta as the event carried it, so a replay
#   of the log shows what each event changed.
# * ``sessions.last_seq`` is the session's newest seq, kept by a trigger on every
#   insert: it is what ``expected_seq`` is checked against (one primary-key read)
#   and it is history, so compacting events never moves it back.
# * ``events_by_session_time`` serves ``sessions.get`` with ``after_time``.
#
# A session written before version 3 keeps the state it had: the migration
# records it at seq 0, so reads as of any seq see it.
_V3 = """
ALTER TABLE events ADD COLUMN state_delta TEXT;  -- JSON {app?, user?, session?}
ALTER TABLE sessions ADD COLUMN last_seq INTEGER NOT NULL DEFAULT 0;
UPDATE sessions SET last_seq = coalesce((
    SELECT max(seq) FROM events e
    WHERE e.app_name = sessions.app_name AND e.user_id = sessions.user_id
      AND e.session_id = sessions.session_id), 0);
CREATE TRIGGER events_advance_session AFTER INSERT ON events
    BEGIN
        UPDATE sessions SET last_seq = NEW.seq
        WHERE app_name = NEW.app_name AND user_id = NEW.user_id
          AND session_id = NEW.session_id AND last_seq < NEW.seq;
    END;
CREATE INDEX events_by_session_time ON events (app_name, user_id, session_id, event_time);

CREATE TABLE app_states (
    app_name   TEXT PRIMARY KEY,
    state      TEXT NOT NULL,             -- JSON object
    updated_at INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE user_states (
    app_name   TEXT NOT NULL,
    user_id    TEXT NOT NULL,
    state      TEXT NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (app_name, user_id)
) WITHOUT ROWID;
CREATE TABLE state_deltas (
    rev        INTEGER PRIMARY KEY AUTOINCREMENT,  -- commit order within one seq
    scope      TEXT NOT NULL CHECK (scope IN ('app', 'user', 'session')),
    app_name   TEXT NOT NULL,
    user_id    TEXT NOT NULL,                     -- '' for the app scope
    session_id TEXT NOT NULL,                     -- '' for the app and user scopes
    seq        INTEGER NOT NULL,                  -- where it took effect
    delta      TEXT NOT NULL                      -- JSON object: keys set
);
CREATE INDEX state_deltas_by_key ON state_deltas (scope, app_name, user_id, session_id, seq);
CREATE TRIGGER sessions_forget_state AFTER DELETE ON sessions
    BEGIN
        DELETE FROM state_deltas
        WHERE scope = 'session' AND app_name = OLD.app_name AND user_id = OLD.user_id
          AND session_id = OLD.session_id;
    END;
INSERT INTO state_deltas (scope, app_name, user_id, session_id, seq, delta)
    SELECT 'session', app_name, user_id, session_id, 0, state FROM sessions
    WHERE json_valid(state) AND state <> '{}';
"""

# Version 4: retention policies, one row per app (see EventLog.compact). Each
# limit is NULL when the app has none; a row of NULLs is never stored (setting
# every limit to null deletes the policy).
_V4 = """
CREATE TABLE retention (
    app_name   TEXT PRIMARY KEY,
    max_age_s  INTEGER,                   -- drop events older than this (event time)
    max_events INTEGER,                   -- keep only a session's newest N events
    idle_s     INTEGER,                   -- drop sessions not updated for this long
    updated_at INTEGER NOT NULL
) WITHOUT ROWID;
"""

# Version 5: a session's event time (``sessions.last_event_time``), the
# timestamp of its newest event, or its creation time before the first.
# Frameworks order and describe sessions by it (ADK's ``last_update_time`` is
# the last event's timestamp, which a replayed or imported event sets in the
# past), where ``updated_at`` is this daemon's clock at the last write. Kept by
# the trigger that already keeps ``last_seq``, in the same UPDATE, so an append
# pays no statement more; like ``last_seq`` it is history, so compacting events
# never moves it. A session written before keeps the time of its newest event
# still stored, else its last write.
_V5 = """
ALTER TABLE sessions ADD COLUMN last_event_time INTEGER NOT NULL DEFAULT 0;
UPDATE sessions SET last_event_time = coalesce(
    (SELECT event_time FROM events WHERE seq = sessions.last_seq), updated_at);
DROP TRIGGER events_advance_session;
CREATE TRIGGER events_advance_session AFTER INSERT ON events
    BEGIN
        UPDATE sessions SET last_seq = NEW.seq, last_event_time = NEW.event_time
        WHERE app_name = NEW.app_name AND user_id = NEW.user_id
          AND session_id = NEW.session_id AND last_seq < NEW.seq;
    END;
"""

# Version 6: the deletion signal. Seqs never move, so an index of the log
# (the Recall event-log source) learns what retention and session deletes
# removed from this table: one row per removed event, ``mark`` in removal
# order, written by the trigger in the deleting transaction itself, so no
# delete path (a cascade included) can forget it.
_V6 = """
CREATE TABLE removed_events (
    mark INTEGER PRIMARY KEY AUTOINCREMENT,
    seq  INTEGER NOT NULL
);
CREATE TRIGGER events_record_removal AFTER DELETE ON events
    BEGIN
        INSERT INTO removed_events (seq) VALUES (OLD.seq);
    END;
"""

# Version 7: an app's events by time, for the ``max_age_s`` rule's step
# (:func:`~streamd.eventlog.store.retention.drop_old_events`). Without it the
# step read every entry of the app in ``events_by_session_time`` (the time is
# not its second column) to find none old: 4,001,516 VM steps, 60-85 ms at a
# million events, on the writer's connection, at the end of every compaction
# under such a policy. With it such a step reads 5 pages. The user and session
# let the step judge leases in the index alone (the seq is the rowid, in every
# index), so a step with many old events reads fewer entries than before, not
# a table row for each. Building it at a million events: about 1 s.
_V7 = """
CREATE INDEX events_by_app_time ON events (app_name, event_time, user_id, session_id);
"""

# Version 8: events by author, for reads filtered by one (``since``,
# ``watch``, ``latest_seq``). Without it such a read walked the primary key
# and tested every event: for an author no event has, the whole log, 150-170
# ms at a million events (and it holds the reader). With it, 0.09 ms. Decided
# by measurement (docs/measurements-eventlog.md): durable appends cost the
# same with it as without, 2,113 against 2,116 a second in ten alternated
# pairs, inside what pairs that differ in nothing spread over. The seq is the
# rowid, in every index: an author's entries are in seq order. An author
# suffix (``substr``) cannot use it. Building it at a million events: 0.5 s.
_V8 = """
CREATE INDEX events_by_author ON events (author);
"""

# Never edit a shipped entry; append a new one.
MIGRATIONS: tuple[str, ...] = (_V1, _V2, _V3, _V4, _V5, _V6, _V7, _V8)
SCHEMA_VERSION = len(MIGRATIONS)


def schema_is_current(db: apsw.Connection) -> bool:
    """Whether the database's schema is this streamd's (nothing to migrate)."""
    return bool(db.pragma("user_version") == SCHEMA_VERSION)


def migrate(db: apsw.Connection) -> None:
    if schema_is_current(db):
        # Current (the common open): no write transaction, so no wait for
        # another process's write lock. One that is behind is checked again
        # inside the transaction below, where no other migration can race.
        return
    with db:
        current = db.pragma("user_version")
        if current > SCHEMA_VERSION:
            raise RpcError(
                SOURCE_UNAVAILABLE,
                f"event log database has schema version {current}, newer than this "
                f"streamd understands ({SCHEMA_VERSION}); refusing to open it",
            )
        for version in range(current, SCHEMA_VERSION):
            db.execute(MIGRATIONS[version])
        if current != SCHEMA_VERSION:
            db.pragma("user_version", SCHEMA_VERSION)


def refuse_foreign(db: apsw.Connection) -> None:
    """Refuse a database that is neither empty nor ours, before anything changes.

    ``--db`` pointed at another program's SQLite file must not gain our tables,
    a new ``user_version`` or WAL mode (which changes how that program must open
    it). Only reads happen here. Ours is the file stamped with our application
    id, or one written by schema version 1 (before the stamp) holding our
    tables.
    """
    app_id = db.pragma("application_id")
    version = db.pragma("user_version")
    objects = db.execute("SELECT type, name FROM sqlite_schema").fetchall()
    names = {
        name
        for kind, name in objects
        if kind == "table" and isinstance(name, str) and not name.startswith("sqlite_")
    }
    empty = app_id == 0 and version == 0 and not objects
    ours = app_id == APPLICATION_ID or (app_id == 0 and version >= 1 and names >= _OUR_TABLES)
    if empty or ours:
        return
    path = db.db_filename("main") or ":memory:"
    held = ", ".join(sorted(names)[:5]) + (", ..." if len(names) > 5 else "")
    what = (
        f"it holds tables {held}"
        if names
        else f"application_id {app_id}, user_version {version}"
    )
    raise RpcError(
        SOURCE_UNAVAILABLE,
        f"{path} is not a streamd event log ({what}); refusing to open it, and it was not"
        " changed. Give --db (or STREAMD_DB) a new or empty file.",
        {"path": path},
    )

