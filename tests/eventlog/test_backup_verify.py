"""``streamd log backup`` and ``streamd log verify``, run as a user runs them.

The backup is taken while another connection appends without pause (a thread
with its own connection, as a daemon would be): it must complete, and the copy
must verify and hold exactly a prefix of the live log. Each check of verify is
shown to fire on a corruption planted by hand with SQL (or on the bytes of the
file), with exit status 1 and the finding on a line of its own; a healthy log,
gaps in its seqs included, exits 0.
"""

from __future__ import annotations

import errno
import json
import os
import re
import resource
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import apsw
import pytest

from streamd.eventlog.model import AppendParams, Event, SinceParams, StateDelta, checked
from streamd.eventlog.sqlite import SqliteStore

pytestmark = pytest.mark.subprocess

REPO = Path(__file__).resolve().parents[2]
NOW_US = 1_700_000_000_000_000


def streamd_log(db: Path | str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", str(REPO / "src"))}
    return subprocess.run(
        [sys.executable, "-m", "streamd", "log", "--db", str(db), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def ap(event_id: str, session: str = "s", delta: StateDelta | None = None) -> AppendParams:
    return checked(
        AppendParams,
        app="app",
        user="u",
        session=session,
        event=Event(id=event_id, author="agent", content={"text": event_id * 3}),
        state_delta=delta,
    )


def build_log(path: Path, n: int) -> None:
    """``n`` events over 4 sessions, every tenth setting state in all three scopes."""
    store = SqliteStore.open(str(path), synchronous_normal())
    batch = []
    for i in range(n):
        delta = None
        if i % 10 == 0:
            delta = StateDelta(app={"a": i}, user={"u": i}, session={"s": i, f"k{i}": True})
        batch.append(ap(f"e{i}", f"s{i % 4}", delta))
        if len(batch) == 500:
            store.append_batch(batch, NOW_US)
            batch = []
    if batch:
        store.append_batch(batch, NOW_US)
    store.close()


def synchronous_normal() -> Any:
    from streamd.eventlog.sqlite import SqliteOptions

    return SqliteOptions(synchronous="NORMAL")


def ids(path: Path) -> list[str]:
    store = SqliteStore.open(str(path), migrate=False)
    try:
        out, cursor = [], 0
        while True:
            page = store.since(SinceParams(from_seq=cursor, limit=10_000))
            out += [e.event.id for e in page.entries]
            cursor = page.next_seq
            if page.caught_up:
                return out
    finally:
        store.close()


@pytest.fixture
def log_db(tmp_path: Path) -> Path:
    db = tmp_path / "ev.db"
    build_log(db, 2000)
    return db


# --- backup ---------------------------------------------------------------------------


class Appender:
    """Appends one event per commit, without pause, on its own connection."""

    def __init__(self, db: Path) -> None:
        self.store = SqliteStore.open(str(db), synchronous_normal())
        self.committed = 0
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                self.store.append(ap(f"live{self.committed}", "live"), NOW_US)
                self.committed += 1
        except BaseException as exc:  # reported by the test
            self.error = exc

    def __enter__(self) -> Appender:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(60)
        self.store.close()


@pytest.mark.parametrize("method", ["backup", "vacuum"])
def test_a_backup_under_a_steady_writer_completes_and_holds_a_prefix_that_verifies(
    log_db: Path, tmp_path: Path, method: str
) -> None:
    overlapped = 0
    with Appender(log_db) as writer:
        # Each backup is checked; it counts as "under writes" when the writer
        # committed while it ran. Repeat until three have (on a loaded machine
        # a short backup may see no commit).
        for attempt in range(30):
            dest = tmp_path / f"copy{attempt}.db"
            before = writer.committed
            done = streamd_log(log_db, "backup", str(dest), "--json", "--method", method)
            after = writer.committed
            assert done.returncode == 0, done.stderr
            report = json.loads(done.stdout)
            assert report["dest"] == str(dest) and report["events"] >= 2000
            if after > before:
                overlapped += 1
                copied = ids(dest)
                live = ids(log_db)
                assert copied == live[: len(copied)]  # a prefix: nothing missing inside it
                assert len(copied) == report["events"]
                checked_copy = streamd_log(dest, "verify")
                assert checked_copy.returncode == 0, checked_copy.stdout + checked_copy.stderr
                if overlapped == 3:
                    break
        assert writer.error is None
    assert overlapped == 3, "no backup overlapped a commit of the writer"
    assert not [p for p in tmp_path.iterdir() if ".partial-" in p.name]


def test_a_backup_never_overwrites_and_leaves_nothing_behind_a_failure(
    log_db: Path, tmp_path: Path
) -> None:
    dest = tmp_path / "copy.db"
    dest.write_text("precious")
    done = streamd_log(log_db, "backup", str(dest))
    assert done.returncode == 2 and "exists" in done.stderr
    assert dest.read_text() == "precious"
    missing_dir = tmp_path / "nowhere" / "copy.db"
    done = streamd_log(log_db, "backup", str(missing_dir))
    assert done.returncode == 2 and f"{tmp_path / 'nowhere'} does not exist" in done.stderr
    under_file = tmp_path / "copy.db" / "x.db"
    done = streamd_log(log_db, "backup", str(under_file))
    assert done.returncode == 2 and f"{dest} is not a directory" in done.stderr
    done = streamd_log(log_db, "backup", str(tmp_path))
    assert done.returncode == 2 and "is a directory; name the backup file" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy.db", "ev.db"]


class DestAppears(apsw.VFS):
    """The default VFS, which makes ``dest`` as SQLite opens the backup's
    partial file: another backup to the same name (or a person) taking it
    while the copy is written."""

    def __init__(self, dest: Path) -> None:
        self.dest = dest
        super().__init__("streamd-test-dest-appears", "unix", makedefault=True)

    def xOpen(self, name: apsw.URIFilename | str | None, flags: list[int]) -> apsw.VFSFile:
        filename = name.filename() if isinstance(name, apsw.URIFilename) else name or ""
        if ".partial-" in filename and not self.dest.exists():
            self.dest.write_text("precious")
        return super().xOpen(name, flags)


def test_a_file_made_at_dest_during_the_copy_is_not_overwritten(
    log_db: Path, tmp_path: Path
) -> None:
    # DEST is checked before the copy; the copy was then renamed over it, so
    # a file made meanwhile was replaced and each of two racing backups said
    # its copy was complete.
    from streamd.errors import RpcError
    from streamd.eventlog.sqlite import backup

    dest = tmp_path / "copy.db"
    store = SqliteStore.open(str(log_db), migrate=False)
    vfs = DestAppears(dest)
    try:
        with pytest.raises(RpcError, match=r"copy\.db exists"):
            backup.snapshot(store.connection, dest)
    finally:
        vfs.unregister()
        store.close()
    assert dest.read_text() == "precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy.db", "ev.db"]


def test_a_backup_the_disk_refuses_says_why(log_db: Path, tmp_path: Path) -> None:
    # The kernel's error is real: a file-size limit on the command fails the
    # copy's writes past 64 KiB (EFBIG), as a full disk fails them (ENOSPC).
    # The one-step copy's failure is worded from the copy's connection, whose
    # last message is not the step's: this said "failed: not an error".
    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (65536, resource.RLIM_INFINITY))

    env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", str(REPO / "src"))}
    dest = tmp_path / "copy.db"
    done = subprocess.run(
        [sys.executable, "-m", "streamd", "log", "--db", str(log_db), "backup", str(dest)],
        capture_output=True, text=True, timeout=120, env=env, preexec_fn=limited,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"streamd: backup to {dest} failed: {os.strerror(errno.EFBIG)}"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ev.db"]


def test_a_long_backup_name_is_made_and_a_name_too_long_is_one_line(
    log_db: Path, tmp_path: Path
) -> None:
    # The partial name (".NAME.partial-PID") passed the 255-byte limit on a
    # 240-byte DEST, which then failed; and a failed create's cleanup raised
    # from the same unlink (as on a read-only file system): a traceback. A
    # name with no room for SQLite's "-wal" can hold no log that opens.
    longest = tmp_path / ("b" * 251)
    done = streamd_log(log_db, "backup", str(longest))
    assert done.returncode == 0, done.stderr
    assert streamd_log(longest, "verify").returncode == 0
    for n in (252, 256):
        too_long = tmp_path / ("c" * n)
        done = streamd_log(log_db, "backup", str(too_long))
        assert done.returncode == 2, done.stderr
        assert done.stderr.splitlines() == [
            f"streamd: backup to {too_long}: the name is too long for a log (at most 251"
            " bytes, to leave room for SQLite's -wal beside it)"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["ev.db", longest.name])


def test_a_backup_is_never_made_under_a_name_sqlite_uses_beside_the_log(
    log_db: Path, tmp_path: Path
) -> None:
    # A copy at ev.db-journal was reported complete; the next open of the log
    # took it for a rollback journal and deleted it.
    for suffix in ("-journal", "-wal", "-shm"):
        dest = f"{log_db}{suffix}"
        done = streamd_log(log_db, "backup", dest)
        assert done.returncode == 2, (suffix, done.stdout)
        assert done.stderr.splitlines() == [
            f"streamd: {dest} is a name SQLite uses beside the log ({suffix}); name the backup"
            " another way"]
    assert streamd_log(log_db, "ping").returncode == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ev.db"]


def test_a_backup_name_that_is_not_utf8_is_refused_as_the_line_is_read(
    log_db: Path, tmp_path: Path
) -> None:
    # "\udcff" is how Python hands over an argv byte 0xff; SQLite names files
    # in UTF-8, and such a name ended in a traceback.
    done = streamd_log(log_db, "backup", str(tmp_path / "c\udcff.db"))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "DEST is not UTF-8 text (byte 0xff" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ev.db"]


def test_an_empty_backup_name_is_refused_as_empty_not_as_the_current_directory(
    log_db: Path, tmp_path: Path
) -> None:
    done = streamd_log(log_db, "backup", "")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "DEST must not be empty" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ev.db"]


def test_a_backup_path_given_with_a_tilde_is_under_the_home_directory(
    log_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As --db is: a quoted '~/b.db' reaches streamd unexpanded by the shell.
    monkeypatch.setenv("HOME", str(tmp_path))
    done = streamd_log(log_db, "backup", "~/b.db")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "b.db").is_file()
    done = streamd_log(log_db, "backup", "~no-such-user-here/b.db")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "~no-such-user-here/b.db" in done.stderr


def test_backup_and_verify_refuse_a_path_with_no_log_and_create_none(tmp_path: Path) -> None:
    absent = tmp_path / "absent.db"
    assert streamd_log(absent, "backup", str(tmp_path / "c.db")).returncode == 2
    verified = streamd_log(absent, "verify")
    assert verified.returncode == 2 and "no event log at" in verified.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_restored_backup_serves_its_events(log_db: Path, tmp_path: Path) -> None:
    """The documented restore: stop, put the copy in place, start."""
    copy = tmp_path / "copy.db"
    assert streamd_log(log_db, "backup", str(copy)).returncode == 0
    for suffix in ("", "-wal", "-shm"):
        Path(f"{log_db}{suffix}").unlink(missing_ok=True)
    os.rename(copy, log_db)
    done = streamd_log(log_db, "since", "--json", "--from", "1995")
    assert done.returncode == 0, done.stderr
    assert [json.loads(line)["event"]["id"] for line in done.stdout.splitlines()] == [
        f"e{i}" for i in range(1995, 2000)
    ]


# --- verify ---------------------------------------------------------------------------


def test_a_healthy_log_verifies_gaps_and_all(log_db: Path) -> None:
    store = SqliteStore.open(str(log_db))
    store.delete_session("app", "u", "s1")  # a quarter of the seqs are now gaps
    store.close()
    done = streamd_log(log_db, "verify")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("ok: ") and "1500 events, newest seq 2000, 3 sessions" in (
        done.stdout
    )


def test_a_log_of_one_event_is_counted_in_the_singular(tmp_path: Path) -> None:
    # "backed up 1 events", "1 events, newest seq 1, 1 sessions" read as a bug.
    db = tmp_path / "one.db"
    build_log(db, 1)
    copied = streamd_log(db, "backup", str(tmp_path / "copy.db"))
    assert copied.returncode == 0, copied.stderr
    assert copied.stdout.startswith(f"backed up 1 event (newest seq 1) to {tmp_path / 'copy.db'}:")
    checked_ = streamd_log(db, "verify")
    assert checked_.stdout == f"ok: {db}: 1 event, newest seq 1, 1 session\n"


def test_a_log_of_another_schema_version_is_refused_naming_what_to_run(tmp_path: Path) -> None:
    # verify and backup never migrate: an older file was refused with "open
    # it with streamd once first", which named no command, and a newer one as
    # if it were older.
    db = tmp_path / "old.db"
    build_log(db, 3)
    _sql(db, "DROP INDEX events_by_app_time", "DROP INDEX events_by_author",
         "PRAGMA user_version = 6")
    refused = streamd_log(db, "verify")
    assert refused.returncode != 0 and refused.stdout == ""
    assert f"`streamd log --db {db} ping` upgrades it" in refused.stderr
    assert streamd_log(db, "ping").returncode == 0
    assert streamd_log(db, "verify").stdout.startswith(f"ok: {db}: 3 events")
    _sql(db, "PRAGMA user_version = 99")
    newer = streamd_log(db, "backup", str(tmp_path / "copy.db"))
    assert newer.returncode != 0 and "newer than this streamd understands" in newer.stderr
    assert not (tmp_path / "copy.db").exists()


def _sql(db: Path, *statements: str) -> None:
    conn = apsw.Connection(str(db))
    try:
        for statement in statements:
            conn.execute(statement)
    finally:
        conn.close()


def _duplicate_an_id(db: Path) -> None:
    # Only a damaged file can hold one: take the UNIQUE out of the schema by
    # hand (and rebuild without its index), then store a second e7.
    conn = apsw.Connection(str(db))
    try:
        conn.execute("PRAGMA writable_schema = ON")
        conn.execute(
            "UPDATE sqlite_schema SET sql = replace(sql, 'NOT NULL UNIQUE', 'NOT NULL')"
            " WHERE name = 'events'"
        )
        conn.execute("DELETE FROM sqlite_schema WHERE name = 'sqlite_autoindex_events_1'")
        conn.execute("PRAGMA writable_schema = OFF")
    finally:
        conn.close()
    _sql(
        db,
        "VACUUM",
        "INSERT INTO events (app_name, user_id, session_id, event_id, invocation_id, author,"
        " branch, event_time, content, metadata, digest)"
        " SELECT app_name, user_id, session_id, event_id, invocation_id, author, branch,"
        " event_time, content, metadata, digest FROM events WHERE event_id = 'e7'",
    )


def _damage_an_index_page(db: Path) -> None:
    conn = apsw.Connection(str(db))
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        root = conn.execute(
            "SELECT rootpage FROM sqlite_schema WHERE name = 'events_by_branch'"
        ).fetchone()[0]
        size = conn.pragma("page_size")
    finally:
        conn.close()
    with open(db, "r+b") as f:
        f.seek((root - 1) * size + 8)  # past the page header: the cell pointers
        f.write(b"\xff\x7f" * 64)


PLANTED = {
    "duplicate event id": (_duplicate_an_id, "event id: 'e7' is stored 2 times (seqs 8,2001)"),
    "seq counter behind": (
        lambda db: _sql(db, "UPDATE sqlite_sequence SET seq = 10 WHERE name = 'events'"),
        "seq: the newest seq given is 10, below the newest event's 2000",
    ),
    "last_seq behind": (
        lambda db: _sql(db, "UPDATE sessions SET last_seq = 5 WHERE session_id = 's2'"),
        "seq: session app/u/s2 has last_seq 5, behind its newest event 1999",
    ),
    "session state tampered": (
        lambda db: _sql(
            db,
            """UPDATE sessions SET state = '{"s": "forged"}'"""
            " WHERE session_id = 's0'",
        ),
        'state: session app/u/s0 is {"s": "forged"}, but its deltas fold to',
    ),
    "app state tampered": (
        lambda db: _sql(db, """UPDATE app_states SET state = '{"a": -1}'"""),
        'state: app app is {"a": -1}, but its deltas fold to {"a": 1990}',
    ),
    "event delta unrecorded": (
        lambda db: _sql(
            db,
            "DELETE FROM state_deltas WHERE seq = 1991 AND scope = 'user'",
            """UPDATE user_states SET state = '{"u": 1980}'""",
        ),
        'state: event seq 1991 set user state {"u": 1990}, which is not among the deltas',
    ),
    "orphan event": (
        lambda db: _sql(
            db, "PRAGMA foreign_keys = OFF", "DELETE FROM sessions WHERE session_id = 's3'"
        ),
        "session: event seq 4 belongs to a session that does not exist",
    ),
    # Text that is not UTF-8 (a byte flipped on the disk, or written by hand
    # with CAST(x'..' AS TEXT)): every read of the row fails, yet verify said
    # ok of the first and died with a traceback on the second.
    "content not UTF-8": (
        lambda db: _sql(db, "UPDATE events SET content = CAST(x'7b2274223a2287227d' AS TEXT)"
                        " WHERE seq = 9"),
        "text: event seq 9: content is not UTF-8",
    ),
    "session state not UTF-8": (
        lambda db: _sql(db, "UPDATE sessions SET state = CAST(x'7b2274223a2287227d' AS TEXT)"
                        " WHERE session_id = 's1'"),
        "text: session app/u/s1: state is not UTF-8",
    ),
    "damaged page": (_damage_an_index_page, "integrity: "),
    # A copy cut short (a full disk): SQLite will not even open it.
    "file cut short": (
        lambda db: os.truncate(db, os.path.getsize(db) // 2),
        "file: event log database ",
    ),
}


@pytest.mark.parametrize("planted", sorted(PLANTED))
def test_verify_finds_each_planted_corruption(log_db: Path, planted: str) -> None:
    plant, finding = PLANTED[planted]
    plant(log_db)
    done = streamd_log(log_db, "verify")
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert any(line.startswith(finding) for line in lines), lines
    assert re.search(r"\b\d+ problems? found in ", done.stderr), done.stderr


def test_verify_counts_one_problem_in_the_singular(log_db: Path) -> None:
    # "1 problems found" read as a bug, as "1 events" did in backup's line.
    _sql(log_db, "UPDATE sqlite_sequence SET seq = 10 WHERE name = 'events'")
    done = streamd_log(log_db, "verify")
    assert done.returncode == 1, done.stdout + done.stderr
    [finding] = done.stdout.splitlines()
    assert finding.startswith("seq: the newest seq given is 10, below the newest event's 2000")
    assert done.stderr == f"streamd: 1 problem found in {log_db}\n"


def test_verify_lists_at_most_fifty_findings_of_a_kind_then_counts_the_rest(
    log_db: Path,
) -> None:
    _sql(
        log_db,
        "UPDATE sessions SET last_seq = 0",
        """UPDATE user_states SET state = '{}'""",
        """UPDATE app_states SET state = '{}'""",
    )
    _sql(log_db, "DELETE FROM state_deltas")
    done = streamd_log(log_db, "verify", "--json")
    assert done.returncode == 1
    report = json.loads(done.stdout)
    state = [p for p in report["problems"] if p.startswith("state: ")]
    assert len(state) == 51 and state[-1] == "state: 552 more problems of this kind"


# --- PostgreSQL ---------------------------------------------------------------------------


@pytest.fixture
def pg_log(postgres_db: str, postgres_cluster: Any) -> Iterator[tuple[str, str]]:
    """(conninfo, the URL --db takes) of a log of 200 events."""
    from psycopg.conninfo import conninfo_to_dict

    from streamd.eventlog.postgres.store import PostgresStore

    store = PostgresStore.open(postgres_db)
    for start in range(0, 200, 50):
        store.append_batch(
            [
                ap(f"e{i}", f"s{i % 4}", StateDelta(session={"n": i}) if i % 10 == 0 else None)
                for i in range(start, start + 50)
            ],
            NOW_US,
        )
    store.close()
    yield postgres_db, postgres_cluster.url(conninfo_to_dict(postgres_db)["dbname"])


def _pg(url: str, *statements: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET search_path = streamd")
        for statement in statements:
            conn.execute(statement)


def test_verify_on_postgresql_runs_the_logical_checks(pg_log: tuple[str, str]) -> None:
    conninfo, url = pg_log
    done = streamd_log(url, "verify")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "200 events, newest seq 200, 4 sessions" in done.stdout
    _pg(
        conninfo,
        "ALTER TABLE events DROP CONSTRAINT events_pkey",
        "ALTER TABLE events DROP CONSTRAINT events_event_id_key",
        "INSERT INTO events SELECT * FROM events WHERE seq = 7",
        """UPDATE sessions SET state = '{"n": -1}' WHERE session_id = 's0'""",
    )
    done = streamd_log(url, "verify")
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert "seq: 7 follows 7 (seqs must strictly increase)" in lines
    assert "event id: 'e6' is stored 2 times (seqs 7,7)" in lines
    assert any(line.startswith('state: session app/u/s0 is {"n": -1}') for line in lines)


def test_backup_on_postgresql_points_at_pg_dump(pg_log: tuple[str, str], tmp_path: Path) -> None:
    done = streamd_log(pg_log[1], "backup", str(tmp_path / "copy.db"))
    assert done.returncode == 2
    assert "pg_dump --format=custom --schema=streamd" in done.stderr
    assert not (tmp_path / "copy.db").exists()
