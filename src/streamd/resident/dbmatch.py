"""Whether the event log a client asks for is the one a running daemon serves.

A daemon serves one event log for its whole life. A client told to use
another (``attach -- --db B``, ``STREAMD_DB=B``, ``Client.connect(daemon_args=
["--db", B])``) would otherwise append to the daemon's log while believing
it wrote to B, so the daemon refuses its hello, naming both (described
without secrets, as everywhere else).
"""

from __future__ import annotations

import os

from streamd.eventlog import dbtarget


def _key(target: dbtarget.DbTarget) -> str:
    if target.path is None:
        return target.conninfo
    return os.path.abspath(target.path)


def _same(own: dbtarget.DbTarget, asked: dbtarget.DbTarget) -> bool:
    if own.kind != asked.kind:
        return False
    if _key(own) == _key(asked):
        return True
    if own.path is None or asked.path is None:
        return False
    try:
        return os.path.samefile(own.path, asked.path)  # a symlink, a bind mount
    except OSError:
        return False


def db_mismatch(configured: str | None, asked: str) -> str | None:
    """None when ``asked`` (an absolute path or a connection string) names the
    log a daemon configured with ``configured`` serves; else why not, in one
    sentence."""
    own = dbtarget.resolve(configured)
    try:
        wanted = dbtarget.classify(asked)
    except dbtarget.DbTargetError as exc:
        return f"the event log this client was told to use cannot be read: {exc}"
    if _same(own, wanted):
        return None
    hidden = " (they differ in a part not shown)" if own.description == wanted.description else ""
    return (
        f"it serves the event log {own.description}, not {wanted.description} as this client"
        f" was told (--db or STREAMD_DB){hidden}; stop it (`streamd stop`) to start one on the"
        " other, or give this client another runtime directory (STREAMD_RUNTIME_DIR)"
    )
