"""What ``--db``/``STREAMD_DB`` say about PostgreSQL, without importing its driver.

The SQLite install has no psycopg; these are needed before any database is
opened (to tell a URL from a file, and to refuse a password on a command line),
so they live apart from :mod:`~streamd.eventlog.store.postgres`.
"""

from __future__ import annotations

import os
from urllib.parse import parse_qs, parse_qsl, urlencode, urlsplit

__all__ = [
    "PASSWORD_REFUSED",
    "db_description",
    "db_flag_error",
    "is_postgres_url",
    "url_has_password",
]

PASSWORD_REFUSED = (
    "the event log's database URL holds a password, which every user of this machine"
    " can read in the process list; give it the libpq way: PGPASSWORD, ~/.pgpass (or"
    " PGPASSFILE), or a service file (PGSERVICEFILE)"
)
"""Why a password given on a command line (``--db``) is refused; it names none."""


def is_postgres_url(value: object) -> bool:
    """Whether ``--db``/``STREAMD_DB`` names a PostgreSQL database, not a file."""
    return isinstance(value, str) and value.startswith(("postgresql://", "postgres://"))


def url_has_password(url: str) -> bool:
    """Whether a ``postgresql://`` URL carries a password (``user:pw@`` or
    ``?password=``). A URL too malformed to split is taken to hold one: it is
    refused rather than shown."""
    try:
        u = urlsplit(url)
        return u.password is not None or "password" in parse_qs(u.query)
    except ValueError:
        return True


def db_flag_error(value: object) -> str | None:
    """What is wrong with a ``--db`` value, checked as the command line is
    parsed (a password in it would show in ``ps`` for the process's whole
    life): the one line to say, which never repeats the value, or None."""
    if is_postgres_url(value) and url_has_password(str(value)):
        return (
            "--db holds a password, which every user of this machine can read in the"
            " process list; give it the libpq way: PGPASSWORD, ~/.pgpass (or PGPASSFILE),"
            " or a service file (PGSERVICEFILE), or put the URL in STREAMD_DB"
        )
    return None


def db_description(target: os.PathLike[str] | str) -> str:
    """Where a log lives, for messages, logs and status: the file's path, or the
    PostgreSQL URL without its password."""
    if not isinstance(target, str) or not is_postgres_url(target):
        return os.fspath(target)
    u = urlsplit(target)
    netloc = u.netloc.rsplit("@", 1)
    user = netloc[0].split(":", 1)[0] + "@" if len(netloc) == 2 else ""
    query = urlencode([(k, v) for k, v in parse_qsl(u.query) if k != "password"], safe="/")
    return f"{u.scheme}://{user}{netloc[-1]}{u.path}" + (f"?{query}" if query else "")
