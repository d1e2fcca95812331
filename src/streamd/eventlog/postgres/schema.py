"""The event log's PostgreSQL schema: forward-only migrations and who may be opened.

The same concepts as the SQLite schema (:mod:`~streamd.eventlog.sqlite.schema`):
sessions, events, leases, boots, state (current and its history), retention
policies, one migration per entry of :data:`MIGRATIONS`, each in one
transaction but an index added to a table that may be large, which is built
concurrently (:mod:`~streamd.eventlog.postgres.migrate`). Everything lives in
its own PostgreSQL schema, ``streamd`` by default, so the log can share a
database with other applications; the version is a row of ``streamd_meta``
(PostgreSQL has no ``user_version``), and a schema of that name that has
tables but no such row is someone else's and is refused before anything in it
changes. A database written by a newer streamd is refused.

What differs from SQLite, and why
---------------------------------
* **seq is not a sequence.** A PostgreSQL sequence hands numbers out at insert
  time, so a transaction holding seq 10 can commit after one holding seq 11,
  and a watcher that already read 11 would never see 10. Instead one row,
  ``seq_counter``, holds the newest seq given; an append locks it
  (``SELECT ... FOR UPDATE``) before it numbers its events and writes it back
  before it commits. Appenders therefore commit one after another in seq
  order, and a transaction becomes visible before it releases that lock
  (PostgreSQL ends a transaction in the proc array before it releases its
  locks), so a reader can never see seq N+1 without N. The counter is history
  like ``sqlite_sequence``: deleting the newest events never hands their seqs
  out again.
* **Text is compared as bytes.** Every key and label column is ``COLLATE "C"``,
  so ``=``/``<``/``ORDER BY`` are byte order as in SQLite's BINARY: the prefix
  ranges of :mod:`~streamd.eventlog.filters` and the sorted branch lists mean
  the same on both backends, whatever the database's default locale.
* **Content is ``json``** (stored as the text the client sent, checked on
  every write by the type itself): the guard SQLite needed a trigger for.
  Reads take it as text, never parsed.
* ``sessions.last_seq`` is written by the append itself (it knows the seq
  before inserting), where SQLite uses a trigger.
* **Removal marks commit in mark order** for the same reason, by a row of
  their own (``removal_order``, version 4), which every deleting transaction
  locks before anything else: a reader of ``removed_events`` that has seen
  mark N+1 has seen N.
"""

from __future__ import annotations

from typing import Any

from streamd.eventlog.store.online_index import OnlineIndex

__all__ = [
    "APPLICATION",
    "MIGRATIONS",
    "NOTIFY_CHANNEL",
    "SCHEMA_VERSION",
    "migration_sql",
    "notify_channel",
]

APPLICATION = "streamd event log"
"""What ``streamd_meta.application`` says in a schema that is ours."""
NOTIFY_CHANNEL = "streamd_events"
"""The LISTEN/NOTIFY channel of the log in the default schema (``streamd``); the
payload of each notification is the newest seq of the commit that sent it. A log
in another schema uses :func:`notify_channel` of it."""
_DEFAULT_SCHEMA = "streamd"
_NAMEDATALEN = 64  # PostgreSQL's identifier limit, the terminating NUL included


def notify_channel(schema: str) -> str:
    """The LISTEN/NOTIFY channel of the log in ``schema``: one per schema, so
    logs in two schemas of one database do not wake each other's watchers.

    Channels are database-wide names of at most 63 bytes (``pg_notify`` refuses a
    longer one, ``LISTEN`` would truncate it: the two would then differ), so
    a schema whose name does not fit is named by a digest of it. The result is a
    plain string: ``LISTEN`` takes it as a quoted identifier, ``pg_notify`` as a
    text parameter, so any character of a schema name is safe in it."""
    if schema == _DEFAULT_SCHEMA:
        return NOTIFY_CHANNEL  # what every streamd so far listens on and sends
    channel = f"{NOTIFY_CHANNEL}:{schema}"
    if len(channel.encode()) < _NAMEDATALEN:
        return channel
    import hashlib

    return f"{NOTIFY_CHANNEL}#" + hashlib.blake2b(schema.encode(), digest_size=16).hexdigest()


# Serializes migrations of concurrent openers (two daemons starting at once):
# an advisory lock, held by the migrating session (see postgres/migrate.py).
MIGRATION_LOCK = 0x53544D44  # "STMD"

_V1 = """
CREATE TABLE seq_counter (
    one  boolean PRIMARY KEY DEFAULT true CHECK (one),
    seq  bigint NOT NULL                  -- the newest seq ever given
);
INSERT INTO seq_counter (seq) VALUES (0);

CREATE TABLE sessions (
    app_name    text COLLATE "C" NOT NULL,
    user_id     text COLLATE "C" NOT NULL,
    session_id  text COLLATE "C" NOT NULL,
    state       text NOT NULL,            -- JSON object
    created_at  bigint NOT NULL,          -- microseconds since the epoch, UTC
    updated_at  bigint NOT NULL,
    last_seq    bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (app_name, user_id, session_id)
);

CREATE TABLE events (
    seq           bigint PRIMARY KEY,
    app_name      text COLLATE "C" NOT NULL,
    user_id       text COLLATE "C" NOT NULL,
    session_id    text COLLATE "C" NOT NULL,
    event_id      text COLLATE "C" NOT NULL UNIQUE,
    invocation_id text NOT NULL,
    author        text COLLATE "C" NOT NULL,
    branch        text COLLATE "C" NOT NULL,
    event_time    bigint NOT NULL,        -- microseconds since the epoch, UTC
    content       json NOT NULL,          -- as the client sent it
    metadata      text,                   -- JSON object, NULL when none
    digest        bytea NOT NULL,         -- identity of the request, for safe retry
    state_delta   text,                   -- JSON {app?, user?, session?}
    FOREIGN KEY (app_name, user_id, session_id)
        REFERENCES sessions (app_name, user_id, session_id) ON DELETE CASCADE
);
CREATE INDEX events_by_session ON events (app_name, user_id, session_id, seq);
CREATE INDEX events_by_branch ON events (branch, seq);
CREATE INDEX events_by_session_time ON events (app_name, user_id, session_id, event_time);

CREATE TABLE leases (
    app_name       text COLLATE "C" NOT NULL,
    user_id        text COLLATE "C" NOT NULL,
    session_id     text COLLATE "C" NOT NULL,
    holder         text NOT NULL,         -- host/pid/8-hex, one per acquisition
    acquired_at    bigint NOT NULL,
    heartbeat_at   bigint NOT NULL,       -- the database's clock (see postgres.py)
    stale_after_ms bigint NOT NULL,       -- the window its holder declared
    PRIMARY KEY (app_name, user_id, session_id)
);

CREATE TABLE boots (
    id        bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    boot_at   bigint NOT NULL,
    attempted text NOT NULL               -- JSON list of session ids
);
CREATE INDEX boots_by_time ON boots (boot_at, id);

CREATE TABLE app_states (
    app_name   text COLLATE "C" PRIMARY KEY,
    state      text NOT NULL,
    updated_at bigint NOT NULL
);
CREATE TABLE user_states (
    app_name   text COLLATE "C" NOT NULL,
    user_id    text COLLATE "C" NOT NULL,
    state      text NOT NULL,
    updated_at bigint NOT NULL,
    PRIMARY KEY (app_name, user_id)
);
CREATE TABLE state_deltas (
    rev        bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,  -- write order
    scope      text NOT NULL CHECK (scope IN ('app', 'user', 'session')),
    app_name   text COLLATE "C" NOT NULL,
    user_id    text COLLATE "C" NOT NULL,
    session_id text COLLATE "C" NOT NULL,
    seq        bigint NOT NULL,
    delta      text NOT NULL
);
CREATE INDEX state_deltas_by_key ON state_deltas (scope, app_name, user_id, session_id, seq, rev);
-- Deleting a session forgets its own state history (SQLite: a trigger too).
CREATE FUNCTION sessions_forget_state() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM state_deltas
    WHERE scope = 'session' AND app_name = OLD.app_name AND user_id = OLD.user_id
      AND session_id = OLD.session_id;
    RETURN OLD;
END $$;
CREATE TRIGGER sessions_forget_state AFTER DELETE ON sessions
    FOR EACH ROW EXECUTE FUNCTION sessions_forget_state();

CREATE TABLE retention (
    app_name   text COLLATE "C" PRIMARY KEY,
    max_age_s  bigint,
    max_events bigint,
    idle_s     bigint,
    updated_at bigint NOT NULL
);
"""

# Version 2: a session's event time, as in SQLite's version 5 (see there):
# written by the append's session upsert, like ``last_seq``.
_V2 = """
ALTER TABLE sessions ADD COLUMN last_event_time bigint NOT NULL DEFAULT 0;
UPDATE sessions SET last_event_time = coalesce(
    (SELECT event_time FROM events WHERE seq = sessions.last_seq), updated_at);
"""

# Version 3: the deletion signal, as in SQLite's version 6 (see there): one
# statement-level trigger per delete, its rows from the transition table.
_V3 = """
CREATE TABLE removed_events (
    mark bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    seq  bigint NOT NULL
);
CREATE FUNCTION events_record_removal() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO removed_events (seq) SELECT seq FROM gone ORDER BY seq;
    RETURN NULL;
END $$;
CREATE TRIGGER events_record_removal AFTER DELETE ON events
    REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION events_record_removal();
"""

# Version 4: removal marks commit in mark order. ``mark`` is an identity,
# handed out at delete time, so a transaction holding marks 1-2 could commit
# after one holding 3-4, and an index that had read 3-4 (and moved its mark
# past them) would never see 1-2. Every transaction that deletes events
# locks this one row first (``PgSql.write(removes=True)``): deleters commit
# one after another, in mark order, as appenders do by ``seq_counter``, which
# they leave alone, so retention never holds up an append. A version of its
# own also keeps a streamd that would delete without the lock off the log.
_V4 = """
CREATE TABLE removal_order (one boolean PRIMARY KEY DEFAULT true CHECK (one));
INSERT INTO removal_order DEFAULT VALUES;
"""

# Version 5: an app's events by time, for the ``max_age_s`` rule's step
# (:func:`~streamd.eventlog.store.retention.drop_old_events`). Without it the
# step found the events older than its cutoff by reading every event of the
# app after its cursor (or all of ``events_by_session_time``): at a million
# events a step that found none took 0.1-0.3 s, and every compaction of an
# app under such a policy ends with one. ``seq`` last: the step reads the
# index alone to choose its rows. Built concurrently on a log that exists
# (:mod:`~streamd.eventlog.postgres.migrate`).
_V5 = OnlineIndex("events_by_app_time", "events", ("app_name", "event_time", "seq"))

# Version 6: events by author, as in SQLite's version 8 (see there): a read by
# an author no event has read the whole table, 118-133 ms in process at a
# million events (0.3-0.4 s through the daemon), and now 0.3-0.6 ms; appends
# cost the same with it.
# ``seq`` last: an author's entries come in seq order, ready for ``ORDER BY
# seq LIMIT``.
_V6 = OnlineIndex("events_by_author", "events", ("author", "seq"))

# Never change what a shipped entry makes; append a new one.
MIGRATIONS: tuple[str | OnlineIndex, ...] = (_V1, _V2, _V3, _V4, _V5, _V6)
SCHEMA_VERSION = len(MIGRATIONS)


def migration_sql(version: int) -> str:
    """Migration ``version`` (0-based) as one transaction's SQL, to run with
    ``search_path`` set to our schema; an index step as a plain ``CREATE
    INDEX``, which only a log created in the same transaction may run (see
    :mod:`~streamd.eventlog.postgres.migrate`)."""
    step = MIGRATIONS[version]
    return step.create() if isinstance(step, OnlineIndex) else step


def describe_foreign(tables: list[Any]) -> str:
    names = sorted(str(t) for t in tables)
    return ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
