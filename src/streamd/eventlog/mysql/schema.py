"""The event log's MySQL/MariaDB schema: forward-only migrations under a lock.

The same tables as PostgreSQL's (:mod:`~streamd.eventlog.postgres.schema`),
in the database the URL names; the version is the row of ``streamd_meta``, and
a database that has tables but no such row is someone else's and is refused
before anything in it changes. A database written by a newer streamd is refused.

What differs from PostgreSQL, and why
-------------------------------------
* **Migrations are serialized, not transactional.** MySQL commits before and
  after every ``CREATE``/``ALTER``, so a migration cannot be one transaction.
  Concurrent openers take ``GET_LOCK`` (named for the database) around it;
  every statement of a migration may be run again (``IF NOT EXISTS``), and
  the version row moves only after the last, so a migration cut short is
  finished by the next opener. An index is added online
  (:mod:`~streamd.eventlog.mysql.migrate`).
* **Keys are ``VARCHAR`` of a binary collation that pads nothing.** An index
  cannot hold ``TEXT``, so keys have lengths (what is longer is refused with
  -32602 naming the field, never cut). ``utf8mb4_bin`` would ignore trailing
  spaces (``'a' = 'a '``); MariaDB's ``utf8mb4_nopad_bin`` and MySQL 8's
  ``utf8mb4_0900_bin`` compare code points, which is UTF-8 byte order: the
  prefix ranges and sorted lists mean what they mean in SQLite and
  PostgreSQL. Which one the server has is found at creation.
* **seq is the counter row of PostgreSQL**, ``seq_counter``, locked by each
  append, for the same reason (commit order is seq order: a reader that sees
  seq N+1 sees N). InnoDB makes a transaction's rows visible at its commit,
  before its locks are released, so the rule holds here too. Removal marks
  (``removed_events``) commit in mark order the same way, by a row of their
  own, ``removal_order``, that only deleting transactions lock.
* **Content is checked JSON** (``CHECK (JSON_VALID(content))``), stored as the
  text the client sent: MySQL's ``JSON`` type would rewrite it (MariaDB's is
  ``LONGTEXT`` with the same check).
* An InnoDB index key holds at most 3,072 bytes: three 255-character keys are
  3,060 of them, so ``state_deltas_by_key`` ends at ``seq`` and relies on the
  primary key (``rev``) that InnoDB appends to every secondary index.
"""

from __future__ import annotations

from streamd.eventlog.store.online_index import OnlineIndex

__all__ = [
    "APPLICATION",
    "KEY_LENGTHS",
    "MIGRATIONS",
    "NOPAD_COLLATIONS",
    "SCHEMA_VERSION",
    "migration_statements",
]

APPLICATION = "streamd event log"
NOPAD_COLLATIONS = ("utf8mb4_nopad_bin", "utf8mb4_0900_bin")
"""Binary, no-pad utf8mb4 collations: MariaDB's, then MySQL 8's."""

KEY_LENGTHS = {
    "app_name": 255,
    "user_id": 255,
    "session_id": 255,
    "event_id": 255,
    "author": 255,
    "branch": 512,
    "holder": 255,
}
"""The characters each key column holds; what is longer is refused."""

_V1 = """
CREATE TABLE IF NOT EXISTS seq_counter (
    one TINYINT PRIMARY KEY,
    seq BIGINT NOT NULL
) ENGINE=InnoDB;
INSERT IGNORE INTO seq_counter (one, seq) VALUES (1, 0);
CREATE TABLE IF NOT EXISTS sessions (
    app_name VARCHAR(255) NOT NULL,
    user_id VARCHAR(255) NOT NULL,
    session_id VARCHAR(255) NOT NULL,
    state LONGTEXT NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    last_seq BIGINT NOT NULL DEFAULT 0,
    last_event_time BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (app_name, user_id, session_id)
) ENGINE=InnoDB;
CREATE TABLE IF NOT EXISTS events (
    seq BIGINT PRIMARY KEY,
    app_name VARCHAR(255) NOT NULL,
    user_id VARCHAR(255) NOT NULL,
    session_id VARCHAR(255) NOT NULL,
    event_id VARCHAR(255) NOT NULL UNIQUE,
    invocation_id TEXT NOT NULL,
    author VARCHAR(255) NOT NULL,
    branch VARCHAR(512) NOT NULL,
    event_time BIGINT NOT NULL,
    content LONGTEXT NOT NULL,
    metadata LONGTEXT,
    digest VARBINARY(64) NOT NULL,
    state_delta LONGTEXT,
    KEY events_by_session (app_name, user_id, session_id, seq),
    KEY events_by_branch (branch, seq),
    KEY events_by_session_time (app_name, user_id, session_id, event_time),
    CONSTRAINT events_content_is_json CHECK (JSON_VALID(content)),
    CONSTRAINT events_session FOREIGN KEY (app_name, user_id, session_id)
        REFERENCES sessions (app_name, user_id, session_id) ON DELETE CASCADE
) ENGINE=InnoDB;
CREATE TABLE IF NOT EXISTS leases (
    app_name VARCHAR(255) NOT NULL,
    user_id VARCHAR(255) NOT NULL,
    session_id VARCHAR(255) NOT NULL,
    holder VARCHAR(255) NOT NULL,
    acquired_at BIGINT NOT NULL,
    heartbeat_at BIGINT NOT NULL,
    stale_after_ms BIGINT NOT NULL,
    PRIMARY KEY (app_name, user_id, session_id)
) ENGINE=InnoDB;
CREATE TABLE IF NOT EXISTS boots (
    id BIGINT AUTO_INCREMENT PRIMARY KEY,
    boot_at BIGINT NOT NULL,
    attempted LONGTEXT NOT NULL,
    KEY boots_by_time (boot_at, id)
) ENGINE=InnoDB;
CREATE TABLE IF NOT EXISTS app_states (
    app_name VARCHAR(255) PRIMARY KEY,
    state LONGTEXT NOT NULL,
    updated_at BIGINT NOT NULL
) ENGINE=InnoDB;
CREATE TABLE IF NOT EXISTS user_states (
    app_name VARCHAR(255) NOT NULL,
    user_id VARCHAR(255) NOT NULL,
    state LONGTEXT NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (app_name, user_id)
) ENGINE=InnoDB;
CREATE TABLE IF NOT EXISTS state_deltas (
    rev BIGINT AUTO_INCREMENT PRIMARY KEY,
    scope ENUM('app', 'user', 'session') NOT NULL,
    app_name VARCHAR(255) NOT NULL,
    user_id VARCHAR(255) NOT NULL,
    session_id VARCHAR(255) NOT NULL,
    seq BIGINT NOT NULL,
    delta LONGTEXT NOT NULL,
    KEY state_deltas_by_key (scope, app_name, user_id, session_id, seq)
) ENGINE=InnoDB;
DROP TRIGGER IF EXISTS sessions_forget_state;
CREATE TRIGGER sessions_forget_state AFTER DELETE ON sessions FOR EACH ROW
    DELETE FROM state_deltas WHERE scope = 'session' AND app_name = OLD.app_name
        AND user_id = OLD.user_id AND session_id = OLD.session_id;
CREATE TABLE IF NOT EXISTS retention (
    app_name VARCHAR(255) PRIMARY KEY,
    max_age_s BIGINT,
    max_events BIGINT,
    idle_s BIGINT,
    updated_at BIGINT NOT NULL
) ENGINE=InnoDB
"""

# Version 2: the deletion signal, as in SQLite's version 6 (see there).
# InnoDB fires no trigger for a foreign key's cascade, which is why deleting
# a session deletes its events first, explicitly (``store.sessions``).
_V2 = """
CREATE TABLE IF NOT EXISTS removed_events (
    mark BIGINT AUTO_INCREMENT PRIMARY KEY,
    seq BIGINT NOT NULL
) ENGINE=InnoDB;
DROP TRIGGER IF EXISTS events_record_removal;
CREATE TRIGGER events_record_removal AFTER DELETE ON events FOR EACH ROW
    INSERT INTO removed_events (seq) VALUES (OLD.seq)
"""

# Version 3: removal marks commit in mark order, as in PostgreSQL's version 4
# (see there): an AUTO_INCREMENT hands marks out at delete time, so each
# transaction that deletes events locks this one row first.
_V3 = """
CREATE TABLE IF NOT EXISTS removal_order (
    one TINYINT PRIMARY KEY
) ENGINE=InnoDB;
INSERT IGNORE INTO removal_order (one) VALUES (1)
"""

# Version 4: an app's events by time, as in PostgreSQL's version 5 (see
# there); here the step read every event of the app after its cursor, content
# and all (2.6-2.9 s at a million events, on the writer's connection, so
# appends waited for it). InnoDB appends the primary key (``seq``) to the
# index. Added online (:mod:`~streamd.eventlog.mysql.migrate`).
_V4 = OnlineIndex("events_by_app_time", "events", ("app_name", "event_time"))

# Version 5: events by author, as in SQLite's version 8 (see there): a read by
# an author no event has read the whole table, 0.27-0.34 s at 200,000 events
# (2.4-2.6 s at a million), and now 0.3 ms; appends cost the same with it,
# within the spread of pairs that differ in nothing. InnoDB appends ``seq``.
_V5 = OnlineIndex("events_by_author", "events", ("author",))

# Never change what a shipped entry makes; append a new one.
MIGRATIONS: tuple[str | OnlineIndex, ...] = (_V1, _V2, _V3, _V4, _V5)
SCHEMA_VERSION = len(MIGRATIONS)


def migration_statements(text: str, collation: str) -> list[str]:
    """A migration's SQL as statements, its tables in ``collation`` (one of
    :data:`NOPAD_COLLATIONS`)."""
    table_options = f"ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE={collation}"
    text = text.replace("ENGINE=InnoDB", table_options)
    return [s.strip() for s in text.split(";\n") if s.strip()]
