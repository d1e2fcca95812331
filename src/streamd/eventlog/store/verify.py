"""``streamd log verify``: whether a log's stored facts agree with each other.

Read-only checks, in one snapshot, on either backend (the statements that
differ are in :data:`_DIALECT`); each finding is one line of text:

* **integrity** (SQLite): ``PRAGMA integrity_check``, the file's own structure.
* **seq**: strictly increasing in the order the table stores them, never above
  the newest seq ever given (the counter), and no session's ``last_seq``
  behind its newest event (``expected_seq`` is checked against it). Gaps are
  fine: the log never promised gaplessness, and retention makes them.
* **event ids**: unique, read without the unique index (a damaged index
  would hide its own duplicates).
* **events and sessions**: every event's session exists.
* **state**: each scope's current state (a session's, a user's, an app's)
  equals its recorded deltas folded in order, and each event's own
  ``state_delta`` is among the deltas recorded at its seq.
* **text** (SQLite): every stored text is UTF-8. SQLite keeps the bytes it
  is given and checksums no page, so a byte flipped on the disk, or a row
  another program wrote with ``CAST(x'..' AS TEXT)``, passes the integrity
  check, and the store can only read the row with U+FFFD in place of its bad
  bytes (``sqlite/lossy_text``). Read as bytes here, so the row is named.

At most :data:`PER_CHECK` findings of one kind are listed, then a count of the
rest: a badly damaged file must not print a million lines.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from streamd.errors import SOURCE_UNAVAILABLE, RpcError

__all__ = ["PER_CHECK", "Dialect", "Query", "Report", "unreadable", "verify"]

Dialect = Literal["sqlite", "postgres", "mysql"]
Query = Callable[[str], Iterable[Sequence[Any]]]
"""Run one statement (no parameters) and give its rows."""

PER_CHECK = 50

_DIALECT: dict[Dialect, dict[str, str]] = {
    "sqlite": {
        "begin": "BEGIN DEFERRED",
        "seqs": "SELECT seq FROM events NOT INDEXED",
        "counter": "SELECT seq FROM sqlite_sequence WHERE name = 'events'",
        "duplicates": "SELECT event_id, count(*), group_concat(seq, ',') FROM events NOT INDEXED"
        " GROUP BY event_id HAVING count(*) > 1 ORDER BY min(seq)",
    },
    "postgres": {
        "begin": "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY",
        "seqs": "SELECT seq FROM events ORDER BY seq",
        "counter": "SELECT seq FROM seq_counter",
        "duplicates": "SELECT event_id, count(*), string_agg(seq::text, ',' ORDER BY seq)"
        " FROM events GROUP BY event_id HAVING count(*) > 1 ORDER BY min(seq)",
    },    "mysql": {
        "begin": "START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY",
        "seqs": "SELECT seq FROM events ORDER BY seq",
        "counter": "SELECT seq FROM seq_counter",
        "duplicates": "SELECT event_id, count(*), GROUP_CONCAT(seq ORDER BY seq SEPARATOR ',')"
        " FROM events GROUP BY event_id HAVING count(*) > 1 ORDER BY min(seq)",
    },
}

_ORPHANS = (
    "SELECT e.seq FROM events e WHERE NOT EXISTS (SELECT 1 FROM sessions s"
    " WHERE s.app_name = e.app_name AND s.user_id = e.user_id"
    " AND s.session_id = e.session_id) ORDER BY e.seq"
)
_LAST_SEQ = (
    "SELECT s.app_name, s.user_id, s.session_id, s.last_seq, max(e.seq) FROM sessions s"
    " JOIN events e ON e.app_name = s.app_name AND e.user_id = s.user_id"
    " AND e.session_id = s.session_id"
    " GROUP BY s.app_name, s.user_id, s.session_id, s.last_seq HAVING max(e.seq) > s.last_seq"
)
_DELTAS = (
    "SELECT scope, app_name, user_id, session_id, seq, delta FROM state_deltas"
    " ORDER BY scope, app_name, user_id, session_id, seq, rev"
)
_EVENT_DELTAS = (
    "SELECT seq, app_name, user_id, session_id, state_delta FROM events"
    " WHERE state_delta IS NOT NULL ORDER BY seq"
)
_CURRENT = {
    "app": "SELECT app_name, '', '', state FROM app_states",
    "user": "SELECT app_name, user_id, '', state FROM user_states",
    "session": "SELECT app_name, user_id, session_id, state FROM sessions",
}

Key = tuple[str, str, str, str]  # scope, app, user, session

# Every table's text columns, read as bytes by the text check: (table, what a
# row is called, the columns that name it, its text columns).
_TEXT: tuple[tuple[str, str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("events", "event seq", ("seq",), ("app_name", "user_id", "session_id", "event_id",
                                       "invocation_id", "author", "branch", "content",
                                       "metadata", "state_delta")),
    ("sessions", "session", ("app_name", "user_id", "session_id"),
     ("app_name", "user_id", "session_id", "state")),
    ("app_states", "app", ("app_name",), ("app_name", "state")),
    ("user_states", "user", ("app_name", "user_id"), ("app_name", "user_id", "state")),
    ("state_deltas", "state delta rev", ("rev",),
     ("scope", "app_name", "user_id", "session_id", "delta")),
    ("leases", "lease", ("app_name", "user_id", "session_id"),
     ("app_name", "user_id", "session_id", "holder")),
    ("boots", "boot", ("id",), ("attempted",)),
    ("retention", "retention policy", ("app_name",), ("app_name",)),
)


@dataclass
class Report:
    problems: list[str] = field(default_factory=list)
    events: int = 0
    sessions: int = 0
    newest_seq: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems


class _Findings:
    """The problems of one check, at most PER_CHECK of them listed."""

    def __init__(self, report: Report, kind: str) -> None:
        self.report, self.kind, self.count = report, kind, 0

    def add(self, text: str) -> None:
        self.count += 1
        if self.count <= PER_CHECK:
            self.report.problems.append(text)

    def close(self) -> None:
        if self.count > PER_CHECK:
            self.report.problems.append(
                f"{self.kind}: {self.count - PER_CHECK} more problems of this kind"
            )


def verify(
    query: Query, dialect: Dialect, driver_errors: tuple[type[BaseException], ...]
) -> Report:
    """Every check, inside one read transaction. A check that the driver
    cannot finish (a damaged page under it) is a finding, and the others
    still run; only a log that cannot be read at all raises (the driver's
    error: the caller translates)."""
    sql = _DIALECT[dialect]
    report = Report()
    list(query(sql["begin"]))
    checks: list[tuple[str, Callable[[], None]]] = [
        ("seq", lambda: _seqs(query, sql, report)),
        ("event id", lambda: _ids(query, sql, report)),
        ("session", lambda: _events_have_sessions(query, report)),
        ("state", lambda: _state(query, report)),
    ]
    if dialect == "sqlite":
        checks.insert(0, ("integrity", lambda: _integrity(query, report)))
        checks.append(("text", lambda: _text(query, report)))
    try:
        for kind, check in checks:
            try:
                check()
            except driver_errors as exc:
                report.problems.append(f"{kind}: could not be checked: {exc}")
    finally:
        try:
            list(query("COMMIT"))  # a read transaction: nothing to lose
        except driver_errors:
            if report.ok:
                raise
    return report


def _integrity(query: Query, report: Report) -> None:
    found = _Findings(report, "integrity")
    for (text,) in query("PRAGMA integrity_check"):
        # One row may hold many findings, a line each, under a heading.
        for line in str(text).splitlines():
            if line != "ok" and not line.startswith("*** in database"):
                found.add(f"integrity: {line}")
    found.close()


def _seqs(query: Query, sql: dict[str, str], report: Report) -> None:
    found = _Findings(report, "seq")
    previous: int | None = None
    for (seq,) in query(sql["seqs"]):
        report.events += 1
        if previous is not None and seq <= previous:
            found.add(f"seq: {seq} follows {previous} (seqs must strictly increase)")
        previous = seq if previous is None else max(previous, seq)
    newest = previous or 0
    counter = next(iter(query(sql["counter"])), None)
    given = counter[0] if counter else 0
    report.newest_seq = max(newest, given)
    if given < newest:
        found.add(
            f"seq: the newest seq given is {given}, below the newest event's {newest}"
            " (deleting the newest events would let their seqs be given again)"
        )
    for app, user, session, last, top in query(_LAST_SEQ):
        found.add(
            f"seq: session {app}/{user}/{session} has last_seq {last}, behind its newest"
            f" event {top} (appends with expected_seq would be judged against the wrong seq)"
        )
    found.close()


def _ids(query: Query, sql: dict[str, str], report: Report) -> None:
    found = _Findings(report, "event id")
    for event_id, n, seqs in query(sql["duplicates"]):
        found.add(f"event id: {event_id!r} is stored {n} times (seqs {seqs})")
    found.close()


def _events_have_sessions(query: Query, report: Report) -> None:
    found = _Findings(report, "session")
    for (seq,) in query(_ORPHANS):
        found.add(f"session: event seq {seq} belongs to a session that does not exist")
    found.close()


def _parsed(text: Any) -> Any:
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return _UNREADABLE


_UNREADABLE = object()


def _name(key: Key) -> str:
    scope, app, user, session = key
    return {"app": f"app {app}", "user": f"user {app}/{user}"}.get(
        scope, f"session {app}/{user}/{session}"
    )


def _state(query: Query, report: Report) -> None:
    found = _Findings(report, "state")
    folded: dict[Key, dict[str, Any]] = {}
    at_seq: dict[tuple[Key, int], list[Any]] = defaultdict(list)
    for scope, app, user, session, seq, text in query(_DELTAS):
        key = (scope, app, user, session)
        delta = _parsed(text)
        state = folded.setdefault(key, {})
        if not isinstance(delta, dict):
            found.add(f"state: {_name(key)} has an unreadable delta at seq {seq}")
            continue
        state.update(delta)
        at_seq[(key, seq)].append(delta)
    current: dict[Key, Any] = {}
    for scope, statement in _CURRENT.items():
        for app, user, session, text in query(statement):
            current[(scope, app, user, session)] = _parsed(text)
            if scope == "session":
                report.sessions += 1
    for key in sorted(set(folded) | set(current)):
        now, want = current.get(key), folded.get(key, {})
        if key not in current:
            if want:
                found.add(f"state: {_name(key)} has deltas but no current state")
            continue
        if now is _UNREADABLE or not isinstance(now, dict):
            found.add(f"state: {_name(key)} has an unreadable current state")
        elif now != want:
            found.add(
                f"state: {_name(key)} is {_short(now)}, but its deltas fold to {_short(want)}"
            )
    for seq, app, user, session, text in query(_EVENT_DELTAS):
        carried = _parsed(text)
        if not isinstance(carried, dict):
            found.add(f"state: event seq {seq} carries an unreadable state_delta")
            continue
        for scope, key in _scopes(app, user, session):
            delta = carried.get(scope)
            if delta and delta not in at_seq.get((key, seq), []):
                found.add(
                    f"state: event seq {seq} set {scope} state {_short(delta)},"
                    " which is not among the deltas recorded at its seq"
                )
    found.close()


def _text(query: Query, report: Report) -> None:
    found = _Findings(report, "text")
    for table, what, key, columns in _TEXT:
        named = ", ".join(f"CAST({c} AS BLOB)" for c in key + columns)
        for row in query(f"SELECT {named} FROM {table}"):
            bad = [c for c, v in zip(columns, row[len(key):], strict=True) if not _utf8(v)]
            if bad:
                name = "/".join(_shown(v) for v in row[: len(key)])
                found.add(
                    f"text: {what} {name}: {', '.join(bad)} {'is' if len(bad) == 1 else 'are'}"
                    " not UTF-8 (reads show U+FFFD for its bad bytes until it is restored"
                    " from a backup or rewritten)"
                )
    found.close()


def _utf8(value: Any) -> bool:
    if value is None:
        return True
    try:
        bytes(value).decode()
    except UnicodeDecodeError:
        return False
    return True


def _shown(value: Any) -> str:
    """A name read as bytes, printable whatever it holds."""
    return bytes(value).decode(errors="backslashreplace") if value is not None else ""


def _scopes(app: str, user: str, session: str) -> Iterator[tuple[str, Key]]:
    yield "app", ("app", app, "", "")
    yield "user", ("user", app, user, "")
    yield "session", ("session", app, user, session)


def _short(value: Any, width: int = 120) -> str:
    text = json.dumps(value, sort_keys=True, ensure_ascii=False)
    return text if len(text) <= width else text[: width - 1] + "…"


def unreadable(exc: BaseException) -> RpcError:
    """A log the checks could not read at all (the driver's error, translated
    by the backend that caught it)."""
    return RpcError(SOURCE_UNAVAILABLE, f"the check could not read the log: {exc}")
