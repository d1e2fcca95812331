"""Which database a ``--db``, ``$STREAMD_DB`` or ``EventLog(path)`` names, and
how to say it without its secrets.

This module is the one place that reads such a string; the CLI, the daemon,
the log, the clients and ``status`` all take its :class:`DbTarget`. The rules:

- a ``scheme://`` URL is a database server, never a file: ``postgresql://``
  and ``postgres://`` are PostgreSQL, ``mysql://`` and ``mariadb://`` MySQL
  or MariaDB (:mod:`streamd.eventlog.mysql.url`); any other scheme is refused
  naming what is served (so a typo never becomes a directory ``mysq:``);
- a string of ``keyword=value`` pairs whose keywords are all libpq's is a
  PostgreSQL connection string (``host=/tmp dbname=events``, ``service=x``);
  one whose first keyword is libpq's but that is not all libpq's is refused
  (a typo must not become a file); one with no libpq keyword at all
  (``a=b.db``) is a file;
- anything else is a SQLite file. An explicit one must be in a directory that
  exists (a mistyped directory fails instead of being created); only the
  default, ``$XDG_STATE_HOME/streamd/events.db``, has its directory made;
- the empty string is refused (an empty ``$STREAMD_DB`` counts as unset, as
  an empty variable does in the shell).

A description (:attr:`DbTarget.description`) is rebuilt from what libpq
parsed, never cut out of the string given, so no spelling of a password
(``user:pw@``, ``?password=``, ``sslpassword=``, a quoted value...) can reach
it. Nothing here opens a database or writes a file.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from urllib.parse import quote

from streamd.eventlog.mysql import url as mysql_url
from streamd.eventlog.postgres.conninfo import (
    KEYWORDS,
    URI_PREFIXES,
    ConninfoError,
    looks_like_keywords,
    parse,
)

__all__ = [
    "DIALECTS",
    "MYSQL_PASSWORD_WAYS",
    "PASSWORD_WAYS",
    "DbTarget",
    "DbTargetError",
    "Dialect",
    "argv_error",
    "classify",
    "command_line_error",
    "default_path",
    "describe",
    "password_refused",
    "postgres_target",
    "resolve",
    "resolve_db_path",
    "usage_error",
]

Kind = Literal["sqlite", "postgres", "mysql"]
Origin = Literal["argument", "environment", "default"]
"""Where the string came from: a caller's argument (``--db``: on a command
line, every user can read it in ``ps``), ``$STREAMD_DB``, or the default."""


@dataclass(frozen=True)
class Dialect:
    """A database server the log is, or will be, served from."""

    kind: str
    schemes: tuple[str, ...]
    served: bool
    """False: its URLs are refused as "not served yet", not taken for files."""


DIALECTS: tuple[Dialect, ...] = (
    Dialect("postgres", ("postgresql", "postgres"), served=True),
    Dialect("mysql", mysql_url.SCHEMES, served=True),
)
"""Adding a server is one entry here (and its parser in :func:`_server`)."""

_FILE_SCHEMES = ("file", "sqlite", "sqlite3")
"""SQLite URL spellings: refused pointing at the plain path, so there is one
way to name a file."""

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")

PASSWORD_WAYS = (
    "give it the libpq way: PGPASSWORD, ~/.pgpass (or PGPASSFILE), or a service file"
    " (PGSERVICEFILE)"
)
MYSQL_PASSWORD_WAYS = (
    "give it the MySQL way: MYSQL_PWD, or an option file (~/.my.cnf, or"
    " ?read_default_file=PATH)"
)


class DbTargetError(ValueError):
    """A database string that names nothing the log serves. The message names
    the database by its description (or by its kind, when it cannot be read)
    and the cause; it never repeats a secret."""


@dataclass(frozen=True)
class DbTarget:
    """A database, classified: a SQLite file, a PostgreSQL connection string or
    a MySQL URL."""

    kind: Kind
    description: str
    """For messages, logs and status: the path, or the connection rebuilt
    from its parsed keywords without any secret."""
    origin: Origin
    path: Path | None = None
    """The SQLite file (``kind == "sqlite"``)."""
    conninfo: str = field(default="", repr=False)
    """The string to connect with (``kind`` a server's), as given: it may
    hold a password, so it is never shown."""
    secret_keys: tuple[str, ...] = ()
    """The libpq keywords that carried a credential (names, not values)."""
    secrets: tuple[str, ...] = field(default=(), repr=False)
    """The credential values, only to scrub them from driver messages."""

    def __str__(self) -> str:
        return self.description

    def __repr__(self) -> str:
        return f"DbTarget({self.kind}, {self.description!r}, {self.origin})"

    @property
    def target(self) -> Path | str:
        """What the store opens: the path, or the connection string."""
        return self.path if self.path is not None else self.conninfo

    def file_error(self) -> str | None:
        """Why this file cannot be the log, without creating anything: its
        directory is missing (only the default's is created), or something
        other than a regular file is at the path (a directory, a device, a
        named pipe, a socket: SQLite would fail on it with only "disk I/O
        error" to say). None when it may be opened (or created)."""
        if self.path is None or self.origin == "default":
            return None
        try:
            mode: int | None = self.path.stat().st_mode
        except OSError:
            mode = None  # nothing there (or no way there: the directory check says why)
        if mode is not None and stat.S_ISDIR(mode):
            return f"event log database {self.description}: is a directory; give a file path"
        if mode is not None and not stat.S_ISREG(mode):
            return (f"event log database {self.description}: is a {_special_kind(mode)}, not a"
                    " regular file; give a file path")
        parent = self.path.parent
        if not parent.is_dir():
            what = "is not a directory" if parent.exists() else "does not exist"
            return (f"event log database {self.description}: directory {parent} {what}"
                    " (create it first: only the default location is created)")
        return None


    def holds_no_log(self) -> str | None:
        """Why a command that only reads finds no log at this file (it must not
        make one), or None: nothing at the path (""), or an empty file. SQLite
        takes an empty file for a new database, so a read wrote the schema
        into it and answered as from an empty log: a copy cut to 0 bytes (a
        full disk) was then "ok" to ``ping`` and to ``verify`` after it."""
        if self.path is None:
            return None
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return ""
        except OSError:
            return None  # the open names why
        if size == 0 and not _has_bytes(Path(f"{self.path}-wal")):
            return ": the file is empty"
        return None


def _has_bytes(path: Path) -> bool:
    try:
        return path.stat().st_size > 0
    except OSError:
        return False


def _special_kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "named pipe (FIFO)"
    if stat.S_ISCHR(mode):
        return "character device"
    if stat.S_ISBLK(mode):
        return "block device"
    if stat.S_ISSOCK(mode):
        return "socket"
    return "special file"


def default_path(env: Mapping[str, str] | None = None) -> Path:
    """``$XDG_STATE_HOME/streamd/events.db`` (``~/.local/state`` when unset or
    not absolute, as the XDG spec says)."""
    environ = os.environ if env is None else env
    state = environ.get("XDG_STATE_HOME", "")
    base = Path(state) if state and os.path.isabs(state) else Path.home() / ".local" / "state"
    return base / "streamd" / "events.db"


def resolve(
    explicit: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None
) -> DbTarget:
    """The database: ``explicit``, else ``$STREAMD_DB`` (when not empty), else
    the default. Raises :class:`DbTargetError`."""
    environ = os.environ if env is None else env
    if explicit is not None:
        return classify(explicit, origin="argument")
    if environ.get("STREAMD_DB"):
        return classify(environ["STREAMD_DB"], origin="environment")
    path = default_path(environ)
    _check_utf8(str(path))  # a $XDG_STATE_HOME or $HOME of other bytes
    return DbTarget("sqlite", str(path), "default", path=path)


def classify(value: str | os.PathLike[str], *, origin: Origin = "argument") -> DbTarget:
    """What ``value`` names (see the module docstring). A path object is a
    file; a string is read by the rules above. Raises :class:`DbTargetError`."""
    if not isinstance(value, str):
        path = Path(value).expanduser()
        _check_utf8(str(path))
        return DbTarget("sqlite", str(path), origin, path=path)
    if not value.strip():
        raise _refused(repr(value), f"empty; give {_served()}")
    if "\0" in value:
        raise _refused("(a string)", "it holds a NUL character")
    _check_utf8(value)
    if (m := _SCHEME.match(value)) is not None:
        _check_scheme(m.group(1), value[m.end():].startswith("//"))
        if value.startswith(URI_PREFIXES):
            return _server(value, origin)
        if m.group(1) in mysql_url.SCHEMES:
            return _mysql(value, origin)
    # A pair needs its "=": a plain path (as every in-process open passes)
    # skips the libpq reading, 25 us of each open.
    names = looks_like_keywords(value) if "=" in value else []
    known = [n for n in names if n in KEYWORDS or n == "requiressl"]
    if known:
        if unknown := [n for n in names if n not in known]:
            shown = ", ".join(f'"{n}"' if re.fullmatch(r"[a-z_]{1,40}", n) else "a word"
                              for n in unknown)
            raise _refused(
                f"{known[0]}=…", f"not a valid libpq connection string: {shown} is not a"
                " libpq keyword (a file whose name holds \"=\" is named as ./NAME)"
            )
        # When it does not read whole as pairs, the parser says why.
        return _server(value, origin)
    # Described as written (with ~ expanded): Path would drop a leading "./",
    # which is what keeps ./host=x.db a file.
    shown = os.path.expanduser(value)
    return DbTarget("sqlite", shown, origin, path=Path(shown))


def _check_utf8(value: str) -> None:
    """Refuse bytes that are not UTF-8 (argv and the environment hand them over
    as surrogate escapes). SQLite, libpq and MySQL all take UTF-8 names: such a
    path failed in the driver with a traceback, after an empty file had been
    made at it. A file path is shown with the byte escaped; anything that may
    be a server's string is not shown, since it may hold a password."""
    try:
        value.encode()
    except UnicodeEncodeError as exc:
        byte = value[exc.start:exc.end].encode("utf-8", "surrogateescape")[0]
        server = _SCHEME.match(value) is not None or "=" in value
        shown = "(a string)" if server else value.encode(
            "utf-8", "surrogateescape").decode("ascii", "backslashreplace")
        raise _refused(shown, f"not UTF-8 (byte 0x{byte:02x} at character {exc.start + 1});"
                       " the log's database is named in UTF-8") from None


def _refused(shown: str, cause: str) -> DbTargetError:
    """The one shape of every refusal: the database as it may be shown, then why."""
    return DbTargetError(f"event log database {shown}: {cause}")


def _served() -> str:
    schemes = [f"a {s}:// URL" for d in DIALECTS if d.served for s in d.schemes]
    return ", ".join(schemes) + ", a libpq connection string, or a file path (SQLite)"


def _check_scheme(scheme: str, slashes: bool) -> None:
    """Refuse a string that starts with ``scheme:`` unless it is served, or an
    ordinary file name such as ``notes:2024.db``. Only the scheme is shown:
    the rest of an unserved URL cannot be read for its password."""
    low = scheme.lower()
    shown = f"{scheme}://…" if slashes else f"{scheme}:…"
    for d in DIALECTS:
        if low in d.schemes:
            if not d.served:
                raise _refused(shown, f"{low}:// is not served yet; the event log is served"
                               f" from {_served()}")
            if scheme != low or not slashes:
                raise _refused(shown, f"a {low} URL starts with {low}:// in lower case")
            return
    if low in _FILE_SCHEMES:
        raise _refused(shown, "a SQLite file is given as its plain path, not a URL")
    if slashes:
        raise _refused(shown, f"{low}:// is not served; give {_served()}")


def postgres_target(conninfo: str, origin: Origin = "argument") -> DbTarget:
    """``conninfo`` read as a PostgreSQL connection string, whatever it looks
    like (for the store, which is handed one). Raises :class:`DbTargetError`."""
    return _server(conninfo, origin)


def _server(value: str, origin: Origin) -> DbTarget:
    try:
        parsed = parse(value)
    except ConninfoError as exc:
        if value.startswith(URI_PREFIXES):
            shown = value[:value.index("//") + 2] + "…"
            raise _refused(shown, f"not a valid libpq URL: {exc}") from None
        first = looks_like_keywords(value)[:1]
        shown = f"{first[0]}=…" if first and first[0] in KEYWORDS else "(a libpq string)"
        raise _refused(shown, f"not a valid libpq connection string: {exc}") from None
    return DbTarget(
        "postgres", _postgres_description(parsed.shown), origin, conninfo=value,
        secret_keys=parsed.secret_keys, secrets=parsed.secrets,
    )


def _mysql(value: str, origin: Origin) -> DbTarget:
    try:
        parsed = mysql_url.parse(value)
    except mysql_url.MysqlUrlError as exc:
        raise _refused(value[:value.index("//") + 2] + "…", f"not a usable MySQL URL: {exc}") \
            from None
    secret = parsed.password
    return DbTarget(
        "mysql", parsed.description, origin, conninfo=value,
        secret_keys=("password",) if secret else (), secrets=(secret,) if secret else (),
    )


_PLAIN_HOST = re.compile(r"[A-Za-z0-9._~-]+")
_PLAIN_PORT = re.compile(r"[0-9]+")


def _postgres_description(shown: Mapping[str, str]) -> str:
    """A ``postgresql://`` URL libpq reads as the same connection minus its
    secrets: user, a plain host and port in the authority, the database as
    the path, every other keyword in the query in libpq's order."""
    rest = dict(shown)
    user = rest.pop("user", None)
    dbname = rest.pop("dbname", None)
    netloc = quote(user, safe="") + "@" if user else ""
    host, port = rest.get("host"), rest.get("port")
    if host is not None and _PLAIN_HOST.fullmatch(host) and (
        port is None or _PLAIN_PORT.fullmatch(port)
    ):
        netloc += rest.pop("host") + (f":{rest.pop('port')}" if port is not None else "")
    path = "/" + quote(dbname, safe="") if dbname else ""
    order = {k: i for i, k in enumerate(KEYWORDS)}
    query = "&".join(f"{k}={quote(v, safe='/,:@')}"
                     for k, v in sorted(rest.items(), key=lambda kv: order.get(kv[0], 999)))
    return f"postgresql://{netloc}{path}" + (f"?{query}" if query else "")


def password_refused(target: DbTarget, flag: str = "--db") -> str:
    """Why a credential on a command line is refused: it would show in ``ps``
    for the process's whole life. Names the keyword, never the value."""
    keys = ", ".join(target.secret_keys)
    ways = MYSQL_PASSWORD_WAYS if target.kind == "mysql" else PASSWORD_WAYS
    return (f"{flag} holds a password ({keys}), which every user of this machine can read in"
            f" the process list; {ways}, or put the database in STREAMD_DB")


def command_line_error(value: str | None) -> str | None:
    """What is wrong with a ``--db`` value, said as the command line is read
    (a password in it shows in ``ps`` for as long as the process runs): one
    line that never repeats a secret, or None."""
    if value is None:
        return None
    try:
        target = classify(value, origin="argument")
    except DbTargetError as exc:
        return f"--db: {exc}"
    if target.secret_keys:
        return password_refused(target)
    return _said_of("--db", target.file_error())


_DB_SPELLINGS = ("--d", "--db")


def argv_error(argv: Sequence[str]) -> str | None:
    """:func:`command_line_error` of every ``--db`` in a command line about to
    be run (a daemon's or a server's arguments): checked before the process
    starts, which would show a password in ``ps`` before refusing it."""
    for i, arg in enumerate(argv):
        # argparse takes an unambiguous prefix of an option, so ``--d`` is a
        # spelling of ``--db`` as well.
        name, eq, given = arg.partition("=")
        if name not in _DB_SPELLINGS:
            continue
        if eq:
            value: str | None = given
        elif i + 1 < len(argv):
            value = argv[i + 1]
        else:
            continue
        if (refused := command_line_error(value)) is not None:
            return refused
    return None


def usage_error(flag: str | None, env: Mapping[str, str] | None = None) -> str | None:
    """:func:`command_line_error` for ``--db``, else the same checks of
    ``$STREAMD_DB`` (where a password is allowed): for commands to refuse a
    database they cannot use before they start."""
    if flag is not None:
        return command_line_error(flag)
    try:
        target = resolve(None, env)
    except DbTargetError as exc:
        # The default path (from $XDG_STATE_HOME or $HOME) is named by itself.
        environ = os.environ if env is None else env
        return f"STREAMD_DB: {exc}" if environ.get("STREAMD_DB") else str(exc)
    return _said_of("STREAMD_DB", target.file_error())


def _said_of(setting: str, problem: str | None) -> str | None:
    return None if problem is None else f"{setting}: {problem}"


def describe(value: str | os.PathLike[str] | None, env: Mapping[str, str] | None = None) -> str:
    """The description of what ``value`` (None: ``$STREAMD_DB``, else the
    default) names, or why it names nothing, for status lines that must not
    fail."""
    try:
        return resolve(value, env).description
    except DbTargetError as exc:
        return f"(not usable: {exc})"


_UNNAMED = "event log database error: "


def named_in(message: str, value: str | os.PathLike[str] | None) -> str:
    """A store's message about a fault of its database, with the database named
    (``value`` as :func:`describe` takes it): the store's words leave that to
    the caller, and a person at the command line needs to know which one."""
    if not message.startswith(_UNNAMED):
        return message
    return f"event log database {describe(value)}: {message.removeprefix(_UNNAMED)}"


def resolve_db_path(
    explicit: str | os.PathLike[str] | None = None, env: dict[str, str] | None = None
) -> Path | str:
    """Where the log lives: an explicit path, else ``$STREAMD_DB``, else
    ``$XDG_STATE_HOME/streamd/events.db``; a server's URL or connection
    string is returned as given (a ``str``). :func:`resolve` says the same
    with its kind and a safe description; this raises its :class:`DbTargetError`."""
    return resolve(explicit, env).target
