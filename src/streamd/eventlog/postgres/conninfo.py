"""libpq connection strings read the way libpq reads them, secrets kept apart.

A PostgreSQL database is named by a ``postgresql://`` (or ``postgres://``) URL
or by a keyword/value string (``host=/tmp dbname=events``). Describing one for
a message means parsing it exactly as libpq will: a describer that splits a
URL where a browser would (at ``?`` or ``#``) shows part of a password that
libpq reads up to the ``@``. So:

- :func:`parse` asks libpq itself (``PQconninfoParse`` through psycopg) when
  psycopg is installed, and learns from it which keywords are secrets (libpq
  marks them with the display character ``*``);
- without psycopg (the SQLite-only install) it uses :func:`parse_pure`, a
  transcription of libpq's two parsers, which the tests check against libpq
  case by case;
- every error says what is wrong in words of its own and never quotes the
  string: libpq's own messages quote the URL, password and all, so they are
  never passed on.

Before either parser runs, :func:`parse_pure` also refuses what libpq would
accept but read differently from what the writer meant, where the difference
would put part of a password into a host or database name that then shows in
every message: a raw ``@`` after the userinfo, or a ``dbname`` that is itself
a connection string.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = [
    "KEYWORDS",
    "SECRET_KEYWORDS",
    "ConninfoError",
    "Parsed",
    "is_keyword",
    "looks_like_keywords",
    "parse",
    "parse_libpq",
    "parse_pure",
]

URI_PREFIXES = ("postgresql://", "postgres://")

KEYWORDS: tuple[str, ...] = (
    "service", "user", "password", "passfile", "channel_binding", "connect_timeout",
    "dbname", "host", "hostaddr", "port", "client_encoding", "options",
    "application_name", "fallback_application_name", "keepalives", "keepalives_idle",
    "keepalives_interval", "keepalives_count", "tcp_user_timeout", "sslmode",
    "sslnegotiation", "sslcompression", "sslcert", "sslkey", "sslcertmode",
    "sslpassword", "sslrootcert", "sslcrl", "sslcrldir", "sslsni", "requirepeer",
    "require_auth", "min_protocol_version", "max_protocol_version",
    "ssl_min_protocol_version", "ssl_max_protocol_version", "gssencmode", "krbsrvname",
    "gsslib", "gssdelegation", "replication", "target_session_attrs",
    "load_balance_hosts", "scram_client_key", "scram_server_key", "oauth_issuer",
    "oauth_client_id", "oauth_client_secret", "oauth_scope", "sslkeylogfile",
)
"""libpq 18's connection keywords, in its order (``PQconndefaults``): what the
pure parser accepts, and what makes a ``keyword=value`` string a connection
string rather than a file name. libpq also takes ``requiressl`` (an old
spelling of ``sslmode``)."""

SECRET_KEYWORDS: frozenset[str] = frozenset({
    "password", "sslpassword", "oauth_client_secret", "scram_client_key", "scram_server_key",
})
"""Keywords whose value is a credential. libpq marks the first three as
passwords (display character ``*``); the SCRAM keys (``D``, "debug") are
derived from the password and log in just as well, so they are secrets too.
With psycopg, whatever else that libpq marks ``*`` is added."""

_HIDDEN_FLAGS = ("*", "D")
"""libpq's display characters of keywords never shown: passwords, and debug
options (the SCRAM keys among them)."""

_SPACE = " \t\n\r\v\f"  # C isspace() in the C locale: what libpq skips


class ConninfoError(ValueError):
    """A connection string libpq would refuse, or that would mislead; the
    message never repeats any part of the string's values."""


@dataclass(frozen=True)
class Parsed:
    """The keywords a connection string sets (no defaults, no environment),
    as libpq reads them."""

    form: str
    """``"url"`` or ``"keywords"``: how it was written."""
    values: Mapping[str, str] = field(repr=False)
    """Every keyword it sets, secrets included: for connecting, never for showing."""
    hidden: frozenset[str]
    """The keywords among ``values`` that are never shown."""
    secret_keys: tuple[str, ...]
    """The keywords among ``values`` that hold a credential, in libpq's order."""

    @property
    def shown(self) -> dict[str, str]:
        return {k: v for k, v in self.values.items() if k not in self.hidden}

    @property
    def secrets(self) -> tuple[str, ...]:
        """The credential values, for scrubbing driver messages."""
        return tuple(self.values[k] for k in self.secret_keys if self.values[k])


def is_keyword(word: str) -> bool:
    return word in KEYWORDS or word == "requiressl"


# --- the pure parsers ---------------------------------------------------------------


def _keyword_pairs(text: str) -> list[tuple[str, str]]:
    """libpq's ``conninfo_parse``: pairs separated by white space, ``=`` with
    optional space around it, a value either bare (ending at white space, a
    backslash escaping the next character) or in single quotes (backslash
    escapes, so ``\\'`` and ``\\\\``). Raises :class:`ConninfoError` naming the
    problem only."""
    pairs: list[tuple[str, str]] = []
    i, n = 0, len(text)
    while i < n:
        if text[i] in _SPACE:
            i += 1
            continue
        start = i
        while i < n and text[i] != "=" and text[i] not in _SPACE:
            i += 1
        name = text[start:i]
        while i < n and text[i] in _SPACE:
            i += 1
        if i >= n or text[i] != "=":
            raise ConninfoError("a word is missing its \"=\" (keyword=value)")
        i += 1
        while i < n and text[i] in _SPACE:
            i += 1
        value: list[str] = []
        if i < n and text[i] == "'":
            i += 1
            while True:
                if i >= n:
                    raise ConninfoError("a quoted value is not closed")
                c = text[i]
                if c == "\\":
                    i += 1
                    if i < n:
                        value.append(text[i])
                        i += 1
                    continue
                i += 1
                if c == "'":
                    break
                value.append(c)
        else:
            while i < n and text[i] not in _SPACE:
                if text[i] == "\\":
                    i += 1
                    if i < n:
                        value.append(text[i])
                        i += 1
                else:
                    value.append(text[i])
                    i += 1
            i += 1  # the white space that ended it
        pairs.append((name, "".join(value)))
    return pairs


def looks_like_keywords(text: str) -> list[str]:
    """The keywords of ``text`` read as ``keyword=value`` pairs (only the first
    when it does not read whole as pairs), for telling a connection string
    from a file named ``a=b.db``; empty when it does not start as a pair."""
    try:
        return [k for k, _ in _keyword_pairs(text)]
    except ConninfoError:
        m = re.match(r"[ \t\n\r\v\f]*([^= \t\n\r\v\f]+)[ \t\n\r\v\f]*=", text)
        return [m.group(1)] if m else []


_HEX = "0123456789abcdefABCDEF"


def _uri_decode(part: str) -> str:
    """libpq's ``conninfo_uri_decode``: ``%XX`` to its byte; ``%00`` and a bad
    token are refused; spaces around a part are dropped, a space inside one is
    refused. The bytes must be UTF-8 (as psycopg decodes them)."""
    part = part.lstrip(" ")
    if (space := part.find(" ")) >= 0:
        if part[space:].strip(" "):
            raise ConninfoError("a part of the URL holds a space: write it as %20")
        part = part[:space]
    if "%" not in part:
        return part
    out = bytearray()
    raw = part.encode()
    i = 0
    while i < len(raw):
        if raw[i] != 0x25:  # %
            out.append(raw[i])
            i += 1
            continue
        pair = raw[i + 1:i + 3].decode("ascii", "replace")
        if len(pair) != 2 or any(c not in _HEX for c in pair):
            raise ConninfoError("a %-escape is not two hexadecimal digits")
        byte = int(pair, 16)
        if byte == 0:
            raise ConninfoError("%00 is not allowed")
        out.append(byte)
        i += 3
    try:
        return out.decode()
    except UnicodeDecodeError:
        raise ConninfoError("a %-escaped value is not UTF-8") from None


def _store(values: dict[str, str], key: str, value: str) -> None:
    if key == "requiressl":  # libpq's old spelling
        key, value = "sslmode", "require" if value.startswith("1") else "prefer"
    if not is_keyword(key):
        raise ConninfoError(f"{_name(key)} is not a libpq keyword")
    values[key] = value


def _name(key: str) -> str:
    # A keyword is named in an error only when it looks like one: a password
    # typed where a keyword goes must not be echoed.
    return f'"{key}"' if re.fullmatch(r"[a-z_]{1,40}", key) else "a keyword"


def _url_values(url: str) -> dict[str, str]:
    """libpq's ``conninfo_uri_parse_options``:
    ``postgresql://[user[:password]@][host[:port][,...]][/dbname][?k=v&...]``.
    The userinfo ends at the first ``@`` before any ``/``; ``?`` and ``#`` in it
    are plain characters, as everywhere in a libpq URL."""
    prefix = next(p for p in URI_PREFIXES if url.startswith(p))
    values: dict[str, str] = {}
    p = len(prefix)
    at = p
    while at < len(url) and url[at] not in "@/":
        at += 1
    if at < len(url) and url[at] == "@":
        userinfo = url[p:at]
        user, colon, password = userinfo.partition(":")
        if user:
            values["user"] = _uri_decode(user)
        if colon and password:
            values["password"] = _uri_decode(password)
        p = at + 1
    hosts: list[str] = []
    ports: list[str] = []
    sep = ""
    while True:
        if p < len(url) and url[p] == "[":
            end = url.find("]", p)
            if end < 0:
                raise ConninfoError("an IPv6 host has no closing \"]\"")
            if end == p + 1:
                raise ConninfoError("an IPv6 host is empty")
            host = url[p + 1:end]
            p = end + 1
            if p < len(url) and url[p] not in ":/?,":
                raise ConninfoError("an IPv6 host is followed by something other than"
                                    " \":\", \"/\", \"?\" or \",\"")
        else:
            start = p
            while p < len(url) and url[p] not in ":/?,":
                p += 1
            host = url[start:p]
        port = ""
        sep = url[p] if p < len(url) else ""
        if sep == ":":
            start = p + 1
            p = start
            while p < len(url) and url[p] not in "/?,":
                p += 1
            port = url[start:p]
            sep = url[p] if p < len(url) else ""
        hosts.append(host)
        ports.append(port)
        if sep != ",":
            break
        p += 1
    if any("@" in h for h in hosts):
        raise ConninfoError("an \"@\" follows the user name and password: write an \"@\""
                            " inside either as %40")
    # As libpq: a list that is only commas is still stored.
    if host_list := ",".join(hosts):
        values["host"] = _uri_decode(host_list)
    if port_list := ",".join(ports):
        values["port"] = _uri_decode(port_list)
    if sep == "/":
        start = p + 1
        end = url.find("?", start)
        end = len(url) if end < 0 else end
        dbname = url[start:end]
        if "@" in dbname:
            raise ConninfoError("the database name holds an \"@\": write \"@\" and \"/\""
                                " in a user name, password or database name as %40 and %2F")
        if dbname:
            values["dbname"] = _uri_decode(dbname)
        p, sep = end, "?" if end < len(url) else ""
    if sep == "?":
        query = url[p + 1:]
        for param in query.split("&") if query else ():
            if "=" not in param:
                raise ConninfoError("a query parameter has no \"=\"")
            key, _, value = param.partition("=")
            if "=" in value:
                raise ConninfoError("a query parameter has more than one \"=\"")
            key, value = _uri_decode(key), _uri_decode(value)
            if key == "ssl" and value == "true":  # JDBC's spelling, as libpq takes it
                key, value = "sslmode", "require"
            _store(values, key, value)
    return values


def _checked(values: dict[str, str]) -> None:
    dbname = values.get("dbname", "")
    if "=" in dbname or dbname.startswith(URI_PREFIXES):
        # libpq would look for a database of that name, and the server's
        # "does not exist" would repeat it, password and all.
        raise ConninfoError("its dbname is itself a connection string; give that string"
                            " itself")


def parse_pure(conninfo: str) -> Parsed:
    """``conninfo`` read by the transcription of libpq's parsers."""
    if "\0" in conninfo:
        raise ConninfoError("it holds a NUL character")
    if conninfo.startswith(URI_PREFIXES):
        values, form = _url_values(conninfo), "url"
    else:
        values, form = {}, "keywords"
        for key, value in _keyword_pairs(conninfo):
            _store(values, key, value)
    _checked(values)
    secret = tuple(k for k in KEYWORDS if k in values and k in SECRET_KEYWORDS)
    hidden = frozenset(secret) | {k for k in ("replication", "sslkeylogfile") if k in values}
    return Parsed(form, values, hidden, secret)


# --- libpq itself -------------------------------------------------------------------


def parse_libpq(conninfo: str) -> Parsed | None:
    """``conninfo`` read by libpq itself, or None without psycopg."""
    try:
        from psycopg import pq
    except ImportError:
        return None
    try:
        options = pq.Conninfo.parse(conninfo.encode())
    except Exception:
        # Its message quotes the string, password included.
        raise ConninfoError("libpq cannot read it") from None
    values: dict[str, str] = {}
    hidden: set[str] = set()
    secret: list[str] = []
    try:
        for o in options:
            if o.val is None:
                continue
            key = o.keyword.decode()
            values[key] = o.val.decode()
            flag = o.dispchar.decode()
            if flag in _HIDDEN_FLAGS or key in SECRET_KEYWORDS:
                hidden.add(key)
            if flag == "*" or key in SECRET_KEYWORDS:
                secret.append(key)
    except UnicodeDecodeError:
        raise ConninfoError("a value is not UTF-8") from None
    form = "url" if conninfo.startswith(URI_PREFIXES) else "keywords"
    return Parsed(form, values, frozenset(hidden), tuple(secret))


def parse(conninfo: str) -> Parsed:
    """``conninfo`` as libpq reads it: by libpq when psycopg is installed
    (after the pure parser's checks for what would mislead), else by the pure
    parser. Raises :class:`ConninfoError`."""
    pure = parse_pure(conninfo)
    return parse_libpq(conninfo) or pure
