"""``mysql://`` and ``mariadb://`` URLs, read without the driver.

``mysql://USER[:PASSWORD]@HOST[:PORT]/DATABASE[?KEY=VALUE&...]``, where the
keys are the few a MySQL client takes about *where* and *how to log in*:
``unix_socket`` (a local server's socket; the host is then ignored, as the
MySQL clients ignore it), ``read_default_file`` and ``read_default_group`` (an
option file and its group), ``connect_timeout`` (seconds). Any other key is
refused by name, so a typo cannot be dropped in silence.

The password, when there is one, is a credential in a string: it is never put
in :attr:`MysqlUrl.description`, which is rebuilt from the parsed parts, and
the database target refuses it on a command line (``ps`` shows it) as it does
a PostgreSQL one. The ways a MySQL client expects instead are ``MYSQL_PWD``
and an option file (``~/.my.cnf`` when it exists, or ``read_default_file``);
:func:`connect_kwargs` applies them in that order, after the URL's own.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlsplit

__all__ = ["SCHEMES", "MysqlUrl", "MysqlUrlError", "connect_kwargs", "parse"]

SCHEMES = ("mysql", "mariadb")
_KEYS = ("unix_socket", "read_default_file", "read_default_group", "connect_timeout")


class MysqlUrlError(ValueError):
    """Not a URL the MySQL backend can use; the message never holds a secret."""


@dataclass(frozen=True)
class MysqlUrl:
    scheme: str
    user: str | None
    host: str | None
    port: int | None
    database: str
    options: Mapping[str, str]
    password: str | None = field(default=None, repr=False)

    @property
    def description(self) -> str:
        """The URL without its password: what messages, logs and status show."""
        netloc = quote(self.user, safe="") + "@" if self.user else ""
        netloc += self.host or ""
        if self.port is not None:
            netloc += f":{self.port}"
        query = "&".join(f"{k}={quote(v, safe='/')}" for k, v in self.options.items())
        return f"{self.scheme}://{netloc}/{quote(self.database, safe='')}" + (
            f"?{query}" if query else ""
        )


def parse(value: str) -> MysqlUrl:
    """``value`` read as a MySQL URL; raises :class:`MysqlUrlError`."""
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError:
        # Not the parser's words: they may quote the string, password and all.
        raise MysqlUrlError("not a valid URL (a bad host or port)") from None
    if parts.scheme not in SCHEMES:
        raise MysqlUrlError(f"the scheme must be one of {', '.join(SCHEMES)}")
    if parts.fragment:
        raise MysqlUrlError("a MySQL URL has no #fragment (a # in a password is written %23)")
    database = unquote(parts.path.removeprefix("/"))
    if not database or "/" in database:
        raise MysqlUrlError("name one database as the path (mysql://user@host/DATABASE)")
    options: dict[str, str] = {}
    for key, item in parse_qsl(parts.query, keep_blank_values=True):
        if key not in _KEYS:
            shown = key if key.isidentifier() and len(key) <= 40 else "a key"
            raise MysqlUrlError(
                f"{shown!r} is not a key this URL takes (it takes {', '.join(_KEYS)}; a"
                " password goes in MYSQL_PWD or an option file)"
            )
        options[key] = item
    if "connect_timeout" in options and not options["connect_timeout"].isdigit():
        raise MysqlUrlError("connect_timeout is a whole number of seconds")
    return MysqlUrl(
        scheme=parts.scheme,
        user=unquote(parts.username) if parts.username else None,
        host=parts.hostname,
        port=port,
        database=database,
        options=options,
        password=unquote(parts.password) if parts.password is not None else None,
    )


def connect_kwargs(
    url: MysqlUrl, env: Mapping[str, str] | None = None, home: Path | None = None
) -> dict[str, Any]:
    """The driver's connect keywords for ``url``: the URL's own parts, then
    the password from ``MYSQL_PWD``, then an option file (``read_default_file``,
    else ``~/.my.cnf`` when it exists, read for its ``[client]`` group unless
    ``read_default_group`` names another), whose values fill only what the
    URL and the environment left unset, as with the MySQL clients."""
    environ = os.environ if env is None else env
    kw: dict[str, Any] = {"database": url.database}
    if url.user is not None:
        kw["user"] = url.user
    if url.host is not None:
        kw["host"] = url.host
    if url.port is not None:
        kw["port"] = url.port
    opts = url.options
    if "unix_socket" in opts:
        kw["unix_socket"] = opts["unix_socket"]
        kw.setdefault("host", "localhost")  # the socket is used for localhost only
    if "connect_timeout" in opts:
        kw["connect_timeout"] = int(opts["connect_timeout"])
    if url.password is not None:
        kw["password"] = url.password
    elif environ.get("MYSQL_PWD"):
        kw["password"] = environ["MYSQL_PWD"]
    option_file = opts.get("read_default_file")
    if option_file is None:
        mine = (home or Path(environ.get("HOME") or Path.home())) / ".my.cnf"
        option_file = str(mine) if mine.is_file() else None
    if option_file is not None:
        kw["read_default_file"] = os.path.expanduser(option_file)
        kw["read_default_group"] = opts.get("read_default_group", "client")
    return kw
